//! Rollouts through the real bus, orchestrator and gateways: canaries first, waves, nodes
//! patched once, the failure budget, pause/cancel, auto-rollout, offline sites, node joins.

use std::collections::BTreeMap;
use std::time::Duration;

use bus_schema::domain::{NodeDesign, Role};
use bus_schema::names;
use bus_schema::names::keys;
use bus_schema::pb::{self, BusEvent, BusJob, BusMessage};
use bus_schema::runtime::{self, Envelope};
use landfall_tests::fleet::{Fleet, RolloutRun, kubelet, node_steps};
use landfall_tests::nats::NatsServer;
use site_gateway::STEPS_SHOWN_AFTER;
use site_gateway::sim::SimConfig;

const ROLLOUT_TIMEOUT: Duration = Duration::from_secs(60);

async fn register(fleet: &Fleet, package: pb::Package, auto: Option<pb::AutoRollout>) -> Envelope {
    let env = Envelope::root();
    fleet.bus.publish_command(&pb::RegisterPackage { package: Some(package), auto_rollout: auto }, &env).await.unwrap();
    let done = fleet.wait_for(pb::PackageRegistered::filter(), &env.id, Duration::from_secs(20)).await;
    assert!(done.is_some(), "package registered");
    env
}

fn patch(version: &str, strategy: pb::RolloutStrategy) -> pb::PatchPackage {
    pb::PatchPackage { name: "kubelet".into(), version: version.into(), strategy: Some(strategy), ..Default::default() }
}

/// Every node of every site patched exactly once, by the sites' own effect counters.
fn assert_patched_once(fleet: &Fleet) {
    for (design, site) in &fleet.sites {
        let once: BTreeMap<String, u32> = design.nodes.iter().map(|n| (n.name.to_string(), 1)).collect();
        assert_eq!(site.effects().patches, once, "{}: each node patched once", design.site);
    }
}

fn completed(run: &RolloutRun) -> pb::RolloutCompleted {
    let kinds = run.kinds();
    run.of_type::<pb::RolloutCompleted>().pop().unwrap_or_else(|| panic!("no RolloutCompleted: {kinds:?}"))
}

/// The site of each NodePatched, in stream order.
fn patched_sites(run: &RolloutRun) -> Vec<String> {
    run.node_reports().into_iter().map(|e| e.site_id).collect()
}

#[tokio::test]
async fn canaries_first_then_waves_every_node_patched_once() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(4).nodes(3).start().await;
    fleet.install_all().await;
    register(&fleet, kubelet("1.30.0"), None).await;

    let strategy = pb::RolloutStrategy {
        canary_site_ids: vec!["edge-03".into()],
        max_concurrent_sites: 2,
        max_unavailable: "1".into(),
        ..Default::default()
    };
    let cmd = fleet.patch(patch("1.30.0", strategy)).await;
    let run = fleet.wait_rollout(&cmd.id, ROLLOUT_TIMEOUT).await;
    let done = completed(&run);
    assert_eq!((done.planned_nodes, done.patched, done.failed, done.sites), (12, 12, 0, 4));

    let planned = &run.of_type::<pb::RolloutPlanned>()[0];
    assert_eq!(planned.waves, 3, "a canary wave, then waves of two sites");
    assert_eq!(planned.sites[0].site_id, "edge-03");
    assert!(planned.sites[0].canary);
    let waves: Vec<u32> = run.of_type::<pb::RolloutWaveStarted>().iter().map(|w| w.wave).collect();
    assert_eq!(waves, [0, 1, 2]);
    // The canary's nodes are all patched before any other site's.
    let order = patched_sites(&run);
    assert!(order[..3].iter().all(|s| s == "edge-03"), "{order:?}");
    assert_patched_once(&fleet);

    // What the nodes run now is observed, and the sites' designs want the new version.
    let observed = fleet.bus.kv(names::OBSERVED_BUCKET).await.unwrap();
    let versions =
        observed.scan_matching::<pb::ObservedVersion>(&keys::observed_package_everywhere("kubelet")).await.unwrap();
    assert_eq!(versions.len(), 12);
    assert!(versions.iter().all(|(_, v, _)| v.version == "1.30.0"), "{versions:?}");
    let sites = fleet.bus.kv(names::SITES_BUCKET).await.unwrap();
    let (design, _) = sites.get::<pb::SiteDesign>(&keys::site("edge-01")).await.unwrap().unwrap();
    assert!(design.packages.iter().flat_map(|r| &r.packages).any(|p| p.name == "kubelet" && p.version == "1.30.0"));

    // The same patch again: every node is at the version already, nothing is touched.
    let again = fleet.patch(patch("1.30.0", Default::default())).await;
    let run = fleet.wait_rollout(&again.id, ROLLOUT_TIMEOUT).await;
    let done = completed(&run);
    assert_eq!((done.planned_nodes, done.patched), (0, 0));
    assert_eq!(run.of_type::<pb::RolloutPlanned>()[0].nodes_at_target, 12);
    assert_patched_once(&fleet);
    fleet.stop().await;
}

#[tokio::test]
async fn failures_past_the_threshold_halt_the_rollout_until_resumed() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(3).nodes(2).start().await;
    fleet.install_all().await;
    register(&fleet, kubelet("1.30.0"), None).await;
    fleet.backend(0).fail_patch("node-2");

    let strategy = pb::RolloutStrategy { max_concurrent_sites: 1, failure_threshold: "0".into(), ..Default::default() };
    let cmd = fleet.patch(patch("1.30.0", strategy)).await;
    let run = fleet.wait_rollout(&cmd.id, ROLLOUT_TIMEOUT).await;
    let halted = run.of_type::<pb::RolloutHalted>().pop().expect("halted");
    assert!(halted.reason.contains("1 node(s) failed"), "{}", halted.reason);
    assert_eq!(run.of_type::<pb::NodePatchFailed>().len(), 1);
    // Halted after the first site: the others were never started.
    assert!(fleet.backend(1).effects().patches.is_empty() && fleet.backend(2).effects().patches.is_empty());

    fleet.backend(0).heal("node-2");
    let resume = Envelope::root();
    let cmd_resume = pb::ResumeRollout { rollout_id: cmd.id.clone() };
    fleet.bus.publish_command(&cmd_resume, &resume).await.unwrap();
    let run = fleet.wait_rollout_until(&cmd.id, &[pb::RolloutCompleted::TYPE], ROLLOUT_TIMEOUT).await;
    let done = completed(&run);
    assert_eq!((done.patched, done.failed), (5, 1), "the failed node stays failed in this rollout");
    fleet.stop().await;
}

/// A rollout with an approval gate stops after its canary, says what the canary showed, patches
/// no other site until a person approves, then goes on to the end.
#[tokio::test]
async fn an_approval_gate_waits_after_the_canary_until_approved() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(3).nodes(2).start().await;
    fleet.install_all().await;
    register(&fleet, kubelet("1.30.0"), None).await;
    let strategy =
        pb::RolloutStrategy { canary_sites: 1, approval: pb::ApprovalGate::AfterCanary as i32, ..Default::default() };
    let cmd = fleet.patch(patch("1.30.0", strategy)).await;
    let run = fleet.wait_rollout_until(&cmd.id, &[pb::RolloutPaused::TYPE], ROLLOUT_TIMEOUT).await;
    let paused = run.of_type::<pb::RolloutPaused>().pop().expect("paused at the gate");
    assert!(
        paused.reason.contains("after the canary") && paused.reason.contains("2 of 6 nodes patched"),
        "{}",
        paused.reason
    );
    let canary = run.of_type::<pb::RolloutPlanned>()[0].sites[0].site_id.clone();
    let others: Vec<usize> = (0..3).filter(|i| fleet.site_id(*i) != canary).collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(others.iter().all(|i| fleet.backend(*i).effects().patches.is_empty()), "no site past the gate");

    let out = landfall_tests::cli::landfall(&server.url(), &["rollout", "approve", &cmd.id]).await;
    assert!(out.status.success(), "{}", landfall_tests::cli::text(&out.stderr));
    let run = fleet.wait_rollout_until(&cmd.id, &[pb::RolloutCompleted::TYPE], ROLLOUT_TIMEOUT).await;
    let done = completed(&run);
    assert_eq!((done.patched, done.failed), (6, 0));
    assert_patched_once(&fleet);
    // Approving what waits for nothing is refused, with why.
    let out = landfall_tests::cli::landfall(&server.url(), &["rollout", "approve", &cmd.id]).await;
    assert!(!out.status.success());
    fleet.stop().await;
}

#[tokio::test]
async fn pause_stops_new_sites_and_cancel_ends_the_rollout() {
    let server = NatsServer::start();
    let slow = site_gateway::sim::SimConfig {
        install_binaries: Duration::from_millis(2000),
        ..site_gateway::sim::SimConfig::fast()
    };
    let fleet = Fleet::builder(&server.url()).sites(3).nodes(1).sim(slow).start().await;
    fleet.install_all().await;
    register(&fleet, kubelet("1.30.0"), None).await;
    let cmd = fleet.patch(patch("1.30.0", pb::RolloutStrategy { max_concurrent_sites: 1, ..Default::default() })).await;
    fleet.wait_for(pb::RolloutWaveStarted::filter(), &cmd.id, Duration::from_secs(20)).await.expect("wave 0");
    // One rollout moves a package's nodes at a time: a second one is refused, naming the first.
    let second = refused(&fleet, patch("1.30.0", Default::default())).await;
    assert_eq!(second.code, pb::RejectCode::Conflict as i32, "{}", second.reason);
    assert!(
        second.reason.starts_with(&format!("rollout {} is moving kubelet (to 1.30.0", cmd.id)),
        "{}",
        second.reason
    );
    let pause = pb::PauseRollout { rollout_id: cmd.id.clone(), reason: "maintenance window closed".into() };
    fleet.bus.publish_command(&pause, &Envelope::root()).await.unwrap();
    fleet.wait_for(pb::RolloutPaused::filter(), &cmd.id, Duration::from_secs(20)).await.expect("paused");
    // The site under way finishes; no other starts while paused.
    tokio::time::sleep(Duration::from_millis(3000)).await;
    let patched: usize = (0..3).map(|i| fleet.backend(i).effects().patches.len()).sum();
    assert_eq!(patched, 1, "only the site already under way was patched");
    let second = refused(&fleet, patch("1.30.0", Default::default())).await;
    assert!(second.reason.contains("is paused over kubelet"), "a paused rollout goes on later: {}", second.reason);

    let cancel = pb::CancelRollout { rollout_id: cmd.id.clone(), reason: String::new() };
    fleet.bus.publish_command(&cancel, &Envelope::root()).await.unwrap();
    let run = fleet.wait_rollout(&cmd.id, ROLLOUT_TIMEOUT).await;
    assert_eq!(run.terminal().delivery.type_name, pb::RolloutCancelled::TYPE);
    let sagas = fleet.bus.kv(names::SAGAS_BUCKET).await.unwrap();
    let (r, _) = sagas.get::<pb::Rollout>(&keys::rollout(&cmd.id)).await.unwrap().unwrap();
    assert_eq!(r.phase, pb::RolloutPhase::Cancelled as i32);

    // Pausing a cancelled rollout is refused, saying why.
    let late = Envelope::root();
    fleet
        .bus
        .publish_command(&pb::PauseRollout { rollout_id: cmd.id.clone(), reason: String::new() }, &late)
        .await
        .unwrap();
    let rejected = fleet
        .wait_for(
            names::events_of_kind(pb::rejection::COMMAND_AGGREGATE, pb::rejection::KIND),
            &late.id,
            Duration::from_secs(20),
        )
        .await
        .unwrap();
    let rejected: pb::CommandRejected = rejected.delivery.decode().unwrap();
    assert!(rejected.reason.contains("cancelled"), "{}", rejected.reason);

    // Once it has ended, the package can be rolled out again.
    let again = fleet.patch(patch("1.30.0", Default::default())).await;
    fleet.wait_for(pb::RolloutPlanned::filter(), &again.id, Duration::from_secs(20)).await.expect("planned once free");
    fleet.stop().await;
}

/// Publishes a `PatchPackage` and returns its refusal.
async fn refused(fleet: &Fleet, cmd: pb::PatchPackage) -> pb::CommandRejected {
    let env = fleet.patch(cmd).await;
    let filter = names::events_of_kind(pb::rejection::COMMAND_AGGREGATE, pb::rejection::KIND);
    let e = fleet.wait_for(filter, &env.id, Duration::from_secs(20)).await.expect("refused");
    e.delivery.decode().unwrap()
}

#[tokio::test]
async fn a_newer_version_with_an_auto_rollout_policy_rolls_out_by_itself() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(2).nodes(2).start().await;
    fleet.install_all().await;
    let policy = pb::AutoRollout {
        enabled: true,
        selector: None,
        strategy: Some(pb::RolloutStrategy { canary_sites: 1, ..Default::default() }),
    };
    // Registering the policy with a version the nodes already run patches nothing.
    register(&fleet, kubelet("1.29.2"), Some(policy)).await;
    let register_newer = register(&fleet, kubelet("1.30.1"), None).await;
    let planned = fleet
        .wait_for(pb::RolloutPlanned::filter(), &Envelope::root_with_id(derived(&register_newer)).id, ROLLOUT_TIMEOUT)
        .await
        .expect("the newer version started a rollout by itself");
    let planned: pb::RolloutPlanned = planned.delivery.decode().unwrap();
    assert_eq!(planned.planned_nodes, 4);
    assert!(planned.trigger.contains("auto-rollout"), "{}", planned.trigger);
    let run = fleet.wait_rollout(&planned.rollout_id, ROLLOUT_TIMEOUT).await;
    assert_eq!(completed(&run).patched, 4);
    assert_patched_once(&fleet);

    // An older version registered later is not the newest: nothing rolls back.
    register(&fleet, kubelet("1.30.0"), None).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_patched_once(&fleet);
    fleet.stop().await;
}

/// The id of the PatchPackage an auto-rollout derives from the RegisterPackage.
fn derived(register: &Envelope) -> uuid::Uuid {
    uuid::Uuid::parse_str(&register.derive("auto_rollout", None).id).unwrap()
}

#[tokio::test]
async fn three_replicas_share_a_rollout_and_patch_each_node_once() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(6).nodes(3).orchestrators(3).start().await;
    fleet.install_all().await;
    register(&fleet, kubelet("1.30.0"), None).await;
    let strategy = pb::RolloutStrategy {
        canary_sites: 1,
        max_concurrent_sites: 3,
        max_unavailable: "50%".into(),
        ..Default::default()
    };
    let cmd = fleet.patch(patch("1.30.0", strategy)).await;
    let run = fleet.wait_rollout(&cmd.id, ROLLOUT_TIMEOUT).await;
    assert_eq!(completed(&run).patched, 18);
    assert_eq!(run.of_type::<pb::SitePatched>().len(), 6, "each site reported once");
    assert_eq!(run.of_type::<pb::RolloutCompleted>().len(), 1);
    assert_patched_once(&fleet);
    fleet.stop().await;
}

#[tokio::test]
async fn an_offline_site_counts_as_failed_only_after_its_wave_timeout() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(2).nodes(2).start().await;
    fleet.install_all().await;
    register(&fleet, kubelet("1.30.0"), None).await;
    fleet.stop_gateway(1);
    let strategy = pb::RolloutStrategy {
        wave_timeout_seconds: 2,
        on_wave_timeout: pb::WaveTimeoutAction::Continue as i32,
        failure_threshold: "50%".into(),
        ..Default::default()
    };
    let cmd = fleet.patch(patch("1.30.0", strategy)).await;
    let run = fleet.wait_rollout(&cmd.id, ROLLOUT_TIMEOUT).await;
    let done = completed(&run);
    assert_eq!((done.patched, done.failed), (2, 2), "edge-02's two nodes count as failed");
    let sagas = fleet.bus.kv(names::SAGAS_BUCKET).await.unwrap();
    let (site, _) = sagas.get::<pb::RolloutSite>(&keys::rollout_site(&cmd.id, "edge-02")).await.unwrap().unwrap();
    assert_eq!(site.state, pb::RolloutSiteState::TimedOut as i32);
    assert!(site.failed[0].reason.contains("wave timeout of 2s"), "{}", site.failed[0].reason);
    let lease = sagas.get::<pb::SiteLease>(&keys::site_lease("edge-02")).await.unwrap();
    assert!(lease.is_none(), "the offline site's lease was let go");
    fleet.stop().await;
}

#[tokio::test]
async fn a_host_that_appears_joins_the_cluster_with_the_sites_current_versions() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(1).nodes(2).start().await;
    fleet.install_all().await;
    register(&fleet, kubelet("1.30.0"), None).await;
    let cmd = fleet.patch(patch("1.30.0", Default::default())).await;
    completed(&fleet.wait_rollout(&cmd.id, ROLLOUT_TIMEOUT).await);

    // A host appears at the site; nobody says anything else.
    let node = NodeDesign {
        name: "node-9".try_into().unwrap(),
        role: Role::Worker,
        boot_mac: "52:54:00:aa:00:09".to_string().try_into().unwrap(),
        bmc_address: "ipmi://10.1.0.9".to_string().try_into().unwrap(),
        labels: Default::default(),
        network: None,
        root_device: None,
        kernel_parameters: Default::default(),
        cleaning: Default::default(),
    };
    let request = pb::SimulateHostArrival { site_id: "edge-01".into(), node: Some(pb::NodeSpec::from(&node)) };
    let reply = fleet
        .bus
        .client()
        .request(names::sim_host_arrival_rpc("edge-01"), prost::Message::encode_to_vec(&request).into())
        .await
        .unwrap();
    assert!(reply.headers.as_ref().and_then(|h| h.get(names::headers::REPLY_ERROR)).is_none());

    let mut reader = fleet
        .bus
        .read_events(vec![names::scope_events("edge-01")], async_nats::jetstream::consumer::DeliverPolicy::All)
        .await
        .unwrap();
    let ready = tokio::time::timeout(ROLLOUT_TIMEOUT, async {
        while let Some(e) = reader.next().await {
            let e = e.unwrap();
            if e.delivery.type_name == pb::NodeReady::TYPE {
                return e.delivery.decode::<pb::NodeReady>().unwrap();
            }
            assert_ne!(e.delivery.type_name, pb::NodeJoinFailed::TYPE, "the join failed");
        }
        panic!("event stream ended")
    })
    .await
    .expect("NodeReady within the timeout");
    assert_eq!(ready.node, "node-9");
    assert!(ready.packages.iter().any(|p| p.name == "kubelet" && p.version == "1.30.0"), "{:?}", ready.packages);
    let effects = fleet.backend(0).effects();
    assert_eq!(effects.provisions.get("node-9"), Some(&1));
    assert_eq!(effects.binary_installs.get("node-9"), Some(&1));

    // The observer writes what NodeReady reports a moment after it is published, one key per
    // package, so the node may be seen with some of its packages first.
    let observed = fleet.bus.kv(names::OBSERVED_BUCKET).await.unwrap();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let nodes = runtime::observed_nodes(&observed, &keys::observed_site_prefix("edge-01")).await.unwrap();
        let new = nodes.into_iter().find(|n| n.node == "node-9");
        if new.as_ref().is_some_and(|n| n.packages.iter().any(|p| p.name == "kubelet" && p.version == "1.30.0")) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "node-9 not observed with kubelet 1.30.0 within 10 s: {new:?}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let sites = fleet.bus.kv(names::SITES_BUCKET).await.unwrap();
    let (design, _) = sites.get::<pb::SiteDesign>(&keys::site("edge-01")).await.unwrap().unwrap();
    assert!(design.nodes.iter().any(|n| n.name == "node-9"), "the node is in the site's design");
    fleet.stop().await;
}

#[tokio::test]
async fn bad_patches_are_rejected_with_the_reason() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(1).nodes(1).start().await;
    for (cmd, code, words) in [
        (patch("9.9.9", Default::default()), pb::RejectCode::UnknownPackage, "not in the catalog"),
        (
            patch("1.29.2", pb::RolloutStrategy { max_unavailable: "150%".into(), ..Default::default() }),
            pb::RejectCode::Invalid,
            "max_unavailable",
        ),
        (
            pb::PatchPackage {
                selector: Some(pb::SiteSelector { site_ids: vec!["edge-77".into()], ..Default::default() }),
                ..patch("1.29.2", Default::default())
            },
            pb::RejectCode::UnknownSite,
            "edge-77",
        ),
    ] {
        let env = fleet.patch(cmd).await;
        let e = fleet
            .wait_for(
                names::events_of_kind(pb::rejection::COMMAND_AGGREGATE, pb::rejection::KIND),
                &env.id,
                Duration::from_secs(20),
            )
            .await
            .expect("rejected");
        let r: pb::CommandRejected = e.delivery.decode().unwrap();
        assert_eq!(r.code, code as i32, "{}", r.reason);
        assert!(r.reason.contains(words), "{}", r.reason);
    }
    fleet.stop().await;
}

/// On the simulated site too, each node a kubelet patch takes down goes out of service and back
/// in turn (masters first): cordoned, drained, uncordoned, patched; a node whose drain a
/// disruption budget blocks fails with the budget's message, is given back schedulable, and keeps
/// its version.
#[tokio::test]
async fn each_node_is_cordoned_drained_and_uncordoned_and_a_blocked_drain_fails_it() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(1).nodes(3).start().await;
    fleet.install_all().await;
    register(&fleet, kubelet("1.30.0"), None).await;
    fleet.backend(0).block_drain("node-3");

    let strategy = pb::RolloutStrategy { failure_threshold: "1".into(), ..Default::default() };
    let cmd = fleet.patch(patch("1.30.0", strategy)).await;
    let run = fleet.wait_rollout(&cmd.id, ROLLOUT_TIMEOUT).await;
    for failed in run.of_type::<pb::NodePatchFailed>() {
        assert!(failed.reason.contains("disruption budget"), "{}", failed.reason);
    }
    // `node step`, without the pods a drain names.
    let steps: Vec<String> =
        node_steps(&run.events).iter().map(|s| s.split(' ').take(2).collect::<Vec<_>>().join(" ")).collect();
    let master = fleet.sites[0].0.nodes.iter().find(|n| n.role == Role::Master).unwrap().name.to_string();
    assert_eq!(
        steps[..4],
        [
            format!("{master} cordoned"),
            format!("{master} drained"),
            format!("{master} uncordoned"),
            format!("{master} patched")
        ]
    );
    for node in ["node-1", "node-2", "node-3"].into_iter().filter(|n| *n != master) {
        let mine: Vec<&str> =
            steps.iter().filter(|s| s.split(' ').next() == Some(node)).map(|s| s.split(' ').nth(1).unwrap()).collect();
        let want: &[&str] = if node == "node-3" {
            &["cordoned", "uncordoned", "failed"]
        } else {
            &["cordoned", "drained", "uncordoned", "patched"]
        };
        assert_eq!(mine, want, "{node}: {steps:?}");
    }
    let done = completed(&run);
    assert_eq!((done.patched, done.failed), (2, 1));
    assert!(!fleet.backend(0).effects().patches.contains_key("node-3"), "node-3 was not patched");
    fleet.stop().await;
}

/// A node back in service within moments has its steps (cordoned, drained, uncordoned) in its
/// report, one stored event in place of four, and its report in its site's; a node out of service
/// for longer than the gateway's `STEPS_SHOWN_AFTER` has them sent on their own as they happen,
/// so that whoever watches sees it out of service, its report carries none of them, and it comes
/// alone. Either way each step and report is said once.
#[tokio::test]
async fn a_nodes_steps_come_in_its_report_when_it_is_back_at_once_and_on_their_own_when_it_is_out_long() {
    for slow in [false, true] {
        let server = NatsServer::start();
        // A kubelet patch takes a quarter of the binaries' install.
        let patch_takes = if slow { STEPS_SHOWN_AFTER + Duration::from_millis(500) } else { Duration::ZERO };
        let sim = SimConfig { install_binaries: patch_takes * 4, ..SimConfig::instant() };
        let fleet = Fleet::builder(&server.url()).sites(1).nodes(2).sim(sim).start().await;
        fleet.install_all().await;
        register(&fleet, kubelet("1.30.0"), None).await;
        let cmd = fleet.patch(patch("1.30.0", Default::default())).await;
        let run = fleet.wait_rollout(&cmd.id, ROLLOUT_TIMEOUT).await;
        assert_eq!(completed(&run).patched, 2, "{:?}", run.kinds());
        let live = [pb::NodeCordoned::TYPE, pb::NodeDrained::TYPE, pb::NodeUncordoned::TYPE];
        let on_their_own = run.events.iter().filter(|e| live.contains(&e.delivery.type_name.as_str())).count();
        let in_reports = run.node_reports().into_iter().filter(|p| p.steps.is_some()).count();
        match slow {
            false => assert_eq!((on_their_own, in_reports), (0, 2), "fast: {:?}", run.kinds()),
            true => assert_eq!((on_their_own, in_reports), (6, 0), "slow: {:?}", run.kinds()),
        }
        // The nodes' reports too: in the site's report when the site is done at once, on their
        // own when its job runs long.
        let alone = run.of_type::<pb::NodePatched>().len();
        let carried: usize = run.of_type::<pb::SitePatched>().iter().map(|s| s.nodes.len()).sum();
        match slow {
            false => assert_eq!((alone, carried), (0, 2), "fast: {:?}", run.kinds()),
            true => assert_eq!((alone, carried), (2, 0), "slow: {:?}", run.kinds()),
        }
        // Each node: cordoned, drained, uncordoned, patched, once each and in that order.
        let steps: Vec<String> =
            node_steps(&run.events).iter().map(|s| s.split(' ').take(2).collect::<Vec<_>>().join(" ")).collect();
        for node in ["node-1", "node-2"] {
            let mine: Vec<&str> = steps
                .iter()
                .filter(|s| s.split(' ').next() == Some(node))
                .map(|s| s.split(' ').nth(1).unwrap())
                .collect();
            assert_eq!(mine, ["cordoned", "drained", "uncordoned", "patched"], "slow {slow}, {node}: {steps:?}");
        }
        fleet.stop().await;
    }
}

/// A patch whose job goes back to be tried again (the watch for the node's new version cut off)
/// sends the steps it held before it goes: the next attempt finds the node patched and cordoned,
/// gives it back and reports it, and each step is said once.
#[tokio::test]
async fn a_patch_tried_again_sends_the_steps_it_held_before_the_job_goes_back() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(1).nodes(2).start().await;
    fleet.install_all().await;
    register(&fleet, kubelet("1.30.0"), None).await;
    fleet.backend(0).lose_watch("node-2", 1);
    let cmd = fleet.patch(patch("1.30.0", Default::default())).await;
    let run = fleet.wait_rollout(&cmd.id, ROLLOUT_TIMEOUT).await;
    assert_eq!(completed(&run).patched, 2, "{:?}", run.kinds());
    let steps: Vec<String> =
        node_steps(&run.events).iter().map(|s| s.split(' ').take(2).collect::<Vec<_>>().join(" ")).collect();
    let of_node_2: Vec<&String> = steps.iter().filter(|s| s.starts_with("node-2 ")).collect();
    assert_eq!(of_node_2, ["node-2 cordoned", "node-2 drained", "node-2 uncordoned", "node-2 patched"], "{steps:?}");
    // Its cordon and drain on their own (sent as the job went back), its uncordon too (the
    // attempt that gave it back could not know whether the first had sent its cordon).
    let on_their_own = |t: &str| run.events.iter().filter(|e| e.delivery.type_name == t).count();
    assert_eq!(on_their_own(pb::NodeCordoned::TYPE), 1);
    assert_eq!(on_their_own(pb::NodeUncordoned::TYPE), 1);
    assert_eq!(fleet.backend(0).effects().patches.get("node-2"), Some(&1), "patched once");
    fleet.stop().await;
}

/// A node an earlier attempt patched but did not give back (its gateway died between the patch
/// and the uncordon) is, when the job comes again, not drained again: it is watched, given back
/// (`NodeUncordoned`) and reported patched.
#[tokio::test]
async fn a_node_patched_but_left_cordoned_by_an_earlier_attempt_is_given_back_not_drained_again() {
    use site_gateway::backend::{Cordon, PatchRequest, SiteBackend};
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(1).nodes(2).start().await;
    fleet.install_all().await;
    register(&fleet, kubelet("1.30.0"), None).await;
    // The earlier attempt's end state on node-2: cordoned by landfall, patched, not given back.
    let site = fleet.backend(0);
    let node = fleet.sites[0].0.nodes.iter().find(|n| n.name.as_str() == "node-2").unwrap().clone();
    assert_eq!(site.cordon("node-2").await.unwrap(), Cordon::Done);
    let package = bus_schema::domain::Package::try_from(kubelet("1.30.0")).unwrap();
    let req = PatchRequest { node, package, reinstall: Vec::new(), progress: None, max_unavailable: 1 };
    assert!(site.patch_node(&req).await.unwrap().changed);
    // ... having noted, as a gateway does before it changes anything, that its job moves node-2.
    let cmd = Envelope::root();
    let job = bus_schema::ids::derived_id(&cmd.id, pb::PatchNodes::KIND, Some(&fleet.site_id(0)));
    let record = fleet.cache(0).dir().join("jobs").join(job.to_string());
    std::fs::create_dir_all(record.parent().unwrap()).unwrap();
    std::fs::write(&record, "node-2\n").unwrap();

    fleet.bus.publish_command(&patch("1.30.0", pb::RolloutStrategy::default()), &cmd).await.unwrap();
    let run = fleet.wait_rollout(&cmd.id, ROLLOUT_TIMEOUT).await;
    let of_node_2 = |kind: &str| {
        run.events
            .iter()
            .filter(|e| e.delivery.type_name == kind)
            .filter(|e| {
                let json = pb::decode_to_json(&e.delivery.type_name, &e.delivery.payload).unwrap().unwrap();
                json["node"] == "node-2"
            })
            .count()
    };
    assert_eq!(
        [pb::NodeCordoned::TYPE, pb::NodeDrained::TYPE, pb::NodeUncordoned::TYPE, pb::NodePatched::TYPE].map(of_node_2),
        [0, 0, 1, 1],
        "{:?}",
        run.kinds()
    );
    assert!(!site.cordoned("node-2").await.unwrap());
    assert_eq!(completed(&run).patched, 2);
    assert_eq!(site.effects().patches.get("node-2"), Some(&1), "patched once, by the earlier attempt");
    assert!(!record.exists(), "the job's record goes with its report");
    fleet.stop().await;
}

/// A site's report may carry its nodes' reports rather than send each alone: the hub takes each
/// as that node's `NodePatched`. Site edge-01's gateway is stopped once the rollout's job is
/// out; its report is written here as a gateway writes it, answering the job it was sent, with
/// its three nodes' reports inside. The rollout counts it, and the observer records each node at
/// the new version from it.
#[tokio::test]
async fn a_sites_report_carrying_its_nodes_reports_is_taken_as_each_of_them() {
    const TO: &str = "1.31.9";
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(1).nodes(3).start().await;
    fleet.install_all().await;
    register(&fleet, kubelet(TO), None).await;
    fleet.stop_gateway(0);
    let site = fleet.site_id(0);
    let cmd = fleet.patch(patch(TO, Default::default())).await;

    // The job the hub sent the site, as the site has it.
    let jobs = fleet.bus.jetstream().get_stream(names::jobs_stream(names::job_shard(&site))).await.unwrap();
    let subject = names::job_subject(&site, pb::PatchNodes::KIND);
    let deadline = tokio::time::Instant::now() + ROLLOUT_TIMEOUT;
    let stored = loop {
        if let Ok(m) = jobs.get_last_raw_message_by_subject(&subject).await {
            break m;
        }
        assert!(tokio::time::Instant::now() < deadline, "no job sent to {site}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let job_env = Envelope::from_headers(Some(&stored.headers), || unreachable!("the job carries its id"));
    let job = <pb::PatchNodes as prost::Message>::decode(stored.payload.clone()).unwrap();
    let package = Some(pb::PackageRef { name: "kubelet".into(), version: TO.into() });
    let nodes: Vec<String> = job.nodes.iter().map(|n| n.name.clone()).collect();
    assert_eq!(nodes.len(), 3);
    let report = pb::SitePatched {
        site_id: site.clone(),
        rollout_id: job.rollout_id.clone(),
        plan_index: job.plan_index,
        package: package.clone(),
        patched: nodes.clone(),
        nodes: nodes
            .iter()
            .map(|n| pb::NodePatched {
                site_id: site.clone(),
                node: n.clone(),
                rollout_id: job.rollout_id.clone(),
                package: package.clone(),
                from_version: "1.30.0".into(),
                steps: Some(pb::NodeSteps { cordoned: true, drained: true, uncordoned: true, evicted: vec![] }),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let subject = report.subject_from(names::Origin::Gateway);
    fleet.bus.publish(subject, &report, &job_env.derive("site_patched", None)).await.unwrap();

    let run = fleet.wait_rollout(&cmd.id, ROLLOUT_TIMEOUT).await;
    assert_eq!(completed(&run).patched, 3, "{:?}", run.kinds());
    assert!(run.of_type::<pb::NodePatched>().is_empty(), "no node report came alone");
    let observed = fleet.bus.kv(names::OBSERVED_BUCKET).await.unwrap();
    for node in &nodes {
        let deadline = tokio::time::Instant::now() + ROLLOUT_TIMEOUT;
        loop {
            let seen = observed.get::<pb::ObservedVersion>(&keys::observed(&site, node, "kubelet")).await.unwrap();
            if seen.as_ref().is_some_and(|(v, _)| v.version == TO) {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "{node} not observed at {TO}: {seen:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    fleet.stop().await;
}
