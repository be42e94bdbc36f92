//! Exactly once beyond the duplicate window: the commands stream here forgets ids after one
//! second, so a copy published later reaches the orchestrator, which finds the command in its
//! ledger and does nothing again.

use std::time::Duration;

use async_nats::jetstream::consumer::DeliverPolicy;
use bus_schema::names::{self, keys};
use bus_schema::pb::{self, BusEvent, BusMessage};
use bus_schema::runtime::Envelope;
use landfall_tests::cli::{landfall, text};
use landfall_tests::fleet::{Fleet, kubelet};
use landfall_tests::nats::NatsServer;
use site_gateway::sim::SimConfig;

const WAIT: Duration = Duration::from_secs(20);
/// The commands stream's duplicate window in this test.
const WINDOW: Duration = Duration::from_secs(1);

/// Publishes `cmd` with `env` and waits until the orchestrator has settled everything stored so far.
async fn publish_and_settle<C: pb::BusCommand>(fleet: &Fleet, cmd: &C, env: &Envelope) -> u64 {
    let ack = fleet.bus.publish_command(cmd, env).await.unwrap();
    assert!(!ack.duplicate, "past the window, the stream takes the copy");
    let js = fleet.bus.jetstream();
    let mut consumer = js.get_stream(names::COMMANDS_STREAM).await.unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let info =
            consumer.get_consumer::<async_nats::jetstream::consumer::pull::Config>(names::ORCHESTRATOR_COMMANDS).await;
        let mut info = info.unwrap();
        if info.info().await.unwrap().ack_floor.stream_sequence >= ack.sequence {
            return ack.sequence;
        }
        assert!(tokio::time::Instant::now() < deadline, "command {} not settled", ack.sequence);
        tokio::time::sleep(Duration::from_millis(50)).await;
        consumer = js.get_stream(names::COMMANDS_STREAM).await.unwrap();
    }
}

async fn design_nodes(fleet: &Fleet, site: &str) -> Vec<String> {
    let sites = fleet.bus.kv(names::SITES_BUCKET).await.unwrap();
    let (design, _) = sites.get::<pb::SiteDesign>(&keys::site(site)).await.unwrap().unwrap();
    design.nodes.into_iter().map(|n| n.name).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_published_again_after_the_duplicate_window_changes_nothing() {
    let server = NatsServer::start();
    let fleet =
        Fleet::builder(&server.url()).sites(1).nodes(2).without_gateways().duplicate_window(WINDOW).start().await;

    // A site registered, then a node added to it.
    let design = producers::up::demo_site(4, 2);
    let site = design.site.to_string();
    let register = pb::RegisterSite { design: Some(pb::SiteDesign::from(&design)), expected: None };
    let first = Envelope::root();
    publish_and_settle(&fleet, &register, &first).await;
    assert_eq!(design_nodes(&fleet, &site).await, ["node-1", "node-2"]);
    let third = producers::up::demo_site(4, 3).nodes.pop().unwrap();
    let added = pb::NodeSpec { name: "node-9".into(), ..pb::NodeSpec::from(&third) };
    let node_added = pb::NodeAdded { site_id: site.clone(), node: Some(added), hardware: None };
    publish_and_settle(&fleet, &node_added, &Envelope::root()).await;
    assert_eq!(design_nodes(&fleet, &site).await, ["node-1", "node-2", "node-9"]);

    // The registration again, with its id, once the stream has forgotten it: stored, handled,
    // and nothing changes (before the ledger, it put the two-node design back).
    tokio::time::sleep(WINDOW * 2).await;
    publish_and_settle(&fleet, &register, &first).await;
    assert_eq!(design_nodes(&fleet, &site).await, ["node-1", "node-2", "node-9"]);
    let mut reader = fleet.bus.read_events(vec![pb::SiteRegistered::filter()], DeliverPolicy::All).await.unwrap();
    let mut registered = 0;
    while let Ok(Some(e)) = tokio::time::timeout(Duration::from_millis(500), reader.next()).await {
        registered += usize::from(e.unwrap().delivery.envelope.correlation == first.id);
    }
    assert_eq!(registered, 1, "one SiteRegistered for the registration");

    // A refused command, again after the window: refused again, the same way, and recorded once.
    let bogus = pb::InstallSite { site_id: "edge-77".into(), design_revision: 0 };
    let refused = Envelope::root();
    publish_and_settle(&fleet, &bogus, &refused).await;
    tokio::time::sleep(WINDOW * 2).await;
    publish_and_settle(&fleet, &bogus, &refused).await;
    let ledger = fleet.bus.kv(names::LEDGER_BUCKET).await.unwrap();
    let (record, revision) = ledger.get::<pb::CommandRecord>(&keys::command(&refused.id)).await.unwrap().unwrap();
    assert!(record.rejected && record.code == pb::RejectCode::UnknownSite as i32, "{record:?}");
    assert_eq!(revision, ledger.get::<pb::CommandRecord>(&keys::command(&refused.id)).await.unwrap().unwrap().1);
    let (first_record, _) = ledger.get::<pb::CommandRecord>(&keys::command(&first.id)).await.unwrap().unwrap();
    assert!(!first_record.rejected, "{first_record:?}");

    // Either outcome, read by id: exit 0 carried out, 2 refused (with the code and reason).
    let url = server.url();
    let out = landfall(&url, &["command", "show", &first.id]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("outcome   carried out"), "{}", text(&out.stdout));
    let out = landfall(&url, &["command", "show", &refused.id, "-o", "json"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((shown["outcome"].as_str(), shown["code"].as_str()), (Some("rejected"), Some("unknown_site")));
    fleet.stop().await;
}

/// How many events `id` caused: directly, or through the work it started (its correlation).
async fn caused_by(fleet: &Fleet, id: &str) -> usize {
    let mut reader = fleet.bus.read_events(vec![names::EVENTS_ALL.to_string()], DeliverPolicy::All).await.unwrap();
    let mut n = 0;
    while let Ok(Some(e)) = tokio::time::timeout(Duration::from_millis(300), reader.next()).await {
        let envelope = e.unwrap().delivery.envelope;
        n += usize::from(envelope.causation == id || envelope.correlation == id);
    }
    n
}

/// Publishes `cmd` again with `env`'s id once the duplicate window has passed, and checks the
/// copy was settled, caused no event, and left its ledger record as it was.
async fn again_after_the_window<C: pb::BusCommand>(fleet: &Fleet, cmd: &C, env: &Envelope) {
    let kind = C::KIND;
    let ledger = fleet.bus.kv(names::LEDGER_BUCKET).await.unwrap();
    let record = |ledger: bus_schema::runtime::Kv| async move {
        ledger.get::<pb::CommandRecord>(&keys::command(&env.id)).await.unwrap()
    };
    // Recorded once settled, just after its answer went out.
    let deadline = tokio::time::Instant::now() + WAIT;
    let first = loop {
        match record(ledger.clone()).await {
            Some(r) => break r,
            None if tokio::time::Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(50)).await,
            None => panic!("{kind}: no ledger record"),
        }
    };
    let before = caused_by(fleet, &env.id).await;
    assert!(before > 0 || first.0.rejected, "{kind}: the first one did something");
    tokio::time::sleep(WINDOW * 2).await;
    publish_and_settle(fleet, cmd, env).await;
    assert_eq!(caused_by(fleet, &env.id).await, before, "{kind}: the copy caused nothing");
    assert_eq!(record(ledger).await.map(|(_, rev)| rev), Some(first.1), "{kind}: recorded once");
}

/// A small design (a site, a hardware and a host profile, `nodes` nodes), for `ApplyDesign`.
fn small_design(site: &str, nodes: u8) -> pb::DesignSource {
    let mut docs = vec![
        format!(
            "kind: Site\nname: {site}\nnetworks: [{{ name: provisioning, cidr: 10.4.0.0/24 }}]\n\
             cluster:\n  apiNetwork: provisioning\n  masters: {{ count: 1, standby: 0, selector: {{}}, topologyKey: \"\" }}\n\
             \x20 workers: {{ count: {}, standby: 0, selector: {{}}, topologyKey: \"\" }}\n",
            nodes - 1
        ),
        "kind: HardwareProfile\nname: small\ninterfaces: [{ name: eno1, network: provisioning }]\n".to_string(),
        "kind: HostProfile\nname: base\nhardwareProfile: small\nrole: worker\n".to_string(),
        "kind: HostProfile\nname: control\nparent: base\nrole: master\n".to_string(),
    ];
    for n in 1..=nodes {
        docs.push(format!(
            "kind: Node\nname: node-{n}\nhostProfile: {}\nbootMac: 52:54:00:40:00:{n:02x}\n\
             bmc: {{ address: ipmi://10.4.1.{n}, credentialsRef: bmc-node-{n} }}\n\
             addressing: [{{ network: provisioning, ip: 10.4.0.{} }}]\n",
            if n == 1 { "control" } else { "base" },
            10 + u16::from(n)
        ));
    }
    pb::DesignSource { name: "site.yaml".into(), text: docs.join("---\n") }
}

async fn rollout_phase(fleet: &Fleet, id: &str) -> pb::RolloutPhase {
    let sagas = fleet.bus.kv(names::SAGAS_BUCKET).await.unwrap();
    let (rollout, _) = sagas.get::<pb::Rollout>(&keys::rollout(id)).await.unwrap().expect("rollout record");
    rollout.phase()
}

/// Every kind of command, published again with its id after the duplicate window: one effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_kind_published_again_after_the_window_has_one_effect() {
    let server = NatsServer::start();
    // Patches take a second a node, so a rollout is still under way while it is paused and resumed.
    let sim = SimConfig { install_binaries: Duration::from_secs(4), ..SimConfig::fast() };
    let fleet = Fleet::builder(&server.url())
        .sites(3)
        .nodes(2)
        .sim(sim)
        .with_artifacts()
        .duplicate_window(WINDOW)
        .start()
        .await;
    let wait = |filter: String, id: String| {
        let fleet = &fleet;
        async move { fleet.wait_for(filter, &id, WAIT).await.unwrap_or_else(|| panic!("no answer to {id}")) }
    };

    // A package, a site and its design, a node added and one removed.
    let package = pb::RegisterPackage { package: Some(kubelet("1.30.0")), auto_rollout: None };
    let env = Envelope::root();
    fleet.bus.publish_command(&package, &env).await.unwrap();
    wait(pb::PackageRegistered::filter(), env.id.clone()).await;
    again_after_the_window(&fleet, &package, &env).await;

    let design = producers::up::demo_site(8, 2);
    let register = pb::RegisterSite { design: Some(pb::SiteDesign::from(&design)), expected: None };
    let env = Envelope::root();
    fleet.bus.publish_command(&register, &env).await.unwrap();
    wait(pb::SiteRegistered::filter(), env.id.clone()).await;
    again_after_the_window(&fleet, &register, &env).await;

    let apply =
        pb::ApplyDesign { site_id: "edge-09".into(), sources: vec![small_design("edge-09", 3)], expected: None };
    let env = Envelope::root();
    fleet.bus.publish_command(&apply, &env).await.unwrap();
    wait(pb::DesignApplied::filter(), env.id.clone()).await;
    again_after_the_window(&fleet, &apply, &env).await;
    assert_eq!(design_nodes(&fleet, "edge-09").await, ["node-1", "node-2", "node-3"]);

    let spare = producers::up::demo_site(9, 4).nodes.pop().unwrap();
    let node = pb::NodeSpec { name: "node-8".into(), ..pb::NodeSpec::from(&spare) };
    let added = pb::NodeAdded { site_id: "edge-09".into(), node: Some(node), hardware: None };
    let env = Envelope::root();
    publish_and_settle(&fleet, &added, &env).await;
    again_after_the_window(&fleet, &added, &env).await;
    let removed = pb::NodeRemoved { site_id: "edge-09".into(), node: "node-8".into(), ..Default::default() };
    let env = Envelope::root();
    publish_and_settle(&fleet, &removed, &env).await;
    again_after_the_window(&fleet, &removed, &env).await;
    assert_eq!(design_nodes(&fleet, "edge-09").await, ["node-1", "node-2", "node-3"], "node-8 stays removed");

    // A site staged, then installed.
    let stage = pb::StageSite { site_id: fleet.site_id(0), design_revision: 0 };
    let env = Envelope::root();
    fleet.bus.publish_command(&stage, &env).await.unwrap();
    wait(pb::ArtifactsStaged::filter(), env.id.clone()).await;
    again_after_the_window(&fleet, &stage, &env).await;
    let mut installs = Vec::new();
    for i in 0..3 {
        installs.push(fleet.install(&fleet.site_id(i)).await);
    }
    for env in &installs {
        assert_eq!(fleet.wait_install(env).await.terminal().delivery.type_name, pb::SiteInstalled::TYPE);
    }
    let install = pb::InstallSite { site_id: fleet.site_id(0), design_revision: 0 };
    again_after_the_window(&fleet, &install, &installs[0]).await;

    // A rollout paused, resumed and paused again: the resume's copy must not resume it.
    let strategy = pb::RolloutStrategy { max_concurrent_sites: 1, max_unavailable: "1".into(), ..Default::default() };
    let patch = pb::PatchPackage {
        name: "kubelet".into(),
        version: "1.30.0".into(),
        strategy: Some(strategy),
        ..Default::default()
    };
    let rollout = Envelope::root();
    fleet.bus.publish_command(&patch, &rollout).await.unwrap();
    let pause = pb::PauseRollout { rollout_id: rollout.id.clone(), reason: "first look".into() };
    let paused = Envelope::root();
    publish_and_settle(&fleet, &pause, &paused).await;
    assert_eq!(rollout_phase(&fleet, &rollout.id).await, pb::RolloutPhase::Paused);
    let resume = pb::ResumeRollout { rollout_id: rollout.id.clone() };
    let resumed = Envelope::root();
    publish_and_settle(&fleet, &resume, &resumed).await;
    let pause_again = pb::PauseRollout { rollout_id: rollout.id.clone(), reason: "second look".into() };
    publish_and_settle(&fleet, &pause_again, &Envelope::root()).await;
    assert_eq!(rollout_phase(&fleet, &rollout.id).await, pb::RolloutPhase::Paused);
    again_after_the_window(&fleet, &resume, &resumed).await;
    assert_eq!(rollout_phase(&fleet, &rollout.id).await, pb::RolloutPhase::Paused, "the resume's copy did nothing");
    again_after_the_window(&fleet, &pause, &paused).await;
    again_after_the_window(&fleet, &patch, &rollout).await;
    let cancel = pb::CancelRollout { rollout_id: rollout.id.clone(), reason: "enough".into() };
    let cancelled = Envelope::root();
    publish_and_settle(&fleet, &cancel, &cancelled).await;
    assert_eq!(rollout_phase(&fleet, &rollout.id).await, pb::RolloutPhase::Cancelled);
    again_after_the_window(&fleet, &cancel, &cancelled).await;

    // A site removed: its copy does not remove it again once it is registered anew.
    let remove = pb::RemoveSite { site_id: "edge-09".into(), reason: "decommissioned".into() };
    let env = Envelope::root();
    fleet.bus.publish_command(&remove, &env).await.unwrap();
    wait(pb::SiteRemoved::filter(), env.id.clone()).await;
    publish_and_settle(&fleet, &register, &Envelope::root()).await;
    again_after_the_window(&fleet, &remove, &env).await;
    assert_eq!(design_nodes(&fleet, "edge-09").await, ["node-1", "node-2"], "registered anew, and still there");
    fleet.stop().await;
}

/// Publishes `cmd` and returns its answer: the event that says it was carried out (`done`), or
/// its rejection.
async fn answer<C: pb::BusCommand>(fleet: &Fleet, cmd: &C, done: String) -> Result<Vec<u8>, pb::CommandRejected> {
    let env = Envelope::root();
    let rejected = names::events_of_kind(pb::rejection::COMMAND_AGGREGATE, pb::rejection::KIND);
    let mut reader = fleet.bus.read_events(vec![done, rejected], DeliverPolicy::New).await.unwrap();
    fleet.bus.publish_command(cmd, &env).await.unwrap();
    loop {
        let e = tokio::time::timeout(WAIT, reader.next()).await.expect("an answer").unwrap().unwrap();
        if e.delivery.envelope.correlation != env.id {
            continue;
        }
        return match e.delivery.type_name.as_str() {
            t if t == pb::CommandRejected::TYPE => Err(e.delivery.decode().unwrap()),
            _ => Ok(e.delivery.payload.to_vec()),
        };
    }
}

/// Commands that replace state, given the revision they expect to replace: a stale writer is
/// refused as a conflict that names the current revision, and nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_writer_is_refused_naming_the_current_revision() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(0).start().await;
    let registered = |bytes: Vec<u8>| <pb::SiteRegistered as prost::Message>::decode(bytes.as_slice()).unwrap();
    let register = |nodes: usize, expected: u64| pb::RegisterSite {
        design: Some(pb::SiteDesign::from(&producers::up::demo_site(8, nodes))),
        expected: Some(pb::ExpectedRevision { revision: expected }),
    };

    // Only if not registered yet: the first goes in, the second is refused.
    let first = registered(answer(&fleet, &register(2, 0), pb::SiteRegistered::filter()).await.unwrap());
    let refused = answer(&fleet, &register(3, 0), pb::SiteRegistered::filter()).await.unwrap_err();
    assert_eq!(refused.code, pb::RejectCode::Conflict as i32, "{refused:?}");
    assert!(refused.reason.contains(&format!("at revision {}, not 0", first.revision)), "{}", refused.reason);
    // Over the revision read: in; over the one before it: refused, naming the new one.
    let second = registered(answer(&fleet, &register(3, first.revision), pb::SiteRegistered::filter()).await.unwrap());
    assert!(second.revision > first.revision);
    let stale = answer(&fleet, &register(4, first.revision), pb::SiteRegistered::filter()).await.unwrap_err();
    assert!(stale.reason.contains(&format!("at revision {}, not {}", second.revision, first.revision)), "{stale:?}");
    assert_eq!(
        design_nodes(&fleet, "edge-09").await,
        ["node-1", "node-2", "node-3"],
        "the stale write changed nothing"
    );

    // Designs: applied over revision 0, then a second writer that also read 0 is refused.
    let apply = |nodes: u8, expected: u64| pb::ApplyDesign {
        site_id: "edge-09".into(),
        sources: vec![small_design("edge-09", nodes)],
        expected: Some(pb::ExpectedRevision { revision: expected }),
    };
    answer(&fleet, &apply(3, 0), pb::DesignApplied::filter()).await.unwrap();
    let stale = answer(&fleet, &apply(4, 0), pb::DesignApplied::filter()).await.unwrap_err();
    assert_eq!(stale.code, pb::RejectCode::Conflict as i32, "{stale:?}");
    assert!(stale.reason.contains("at revision 1, not 0"), "{}", stale.reason);
    answer(&fleet, &apply(4, 1), pb::DesignApplied::filter()).await.unwrap();
    assert_eq!(design_nodes(&fleet, "edge-09").await.len(), 4);
    fleet.stop().await;
}

/// The keeping times are settings: a service that aligns (the orchestrator, `landfall up`)
/// brings existing streams and the ledger to them; the others leave what exists alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn existing_streams_follow_the_keeping_times_of_the_orchestrator_only() {
    use bus_schema::runtime::{Bus, Topology};
    let server = NatsServer::start();
    let bus = Bus::connect(&server.url(), "keeping-test").await.unwrap();
    bus.ensure_topology(&Topology::default()).await.unwrap();
    let kept = async |stream: &str| {
        let mut s = bus.jetstream().get_stream(stream).await.unwrap();
        let c = s.info().await.unwrap().config.clone();
        (c.duplicate_window, c.max_age, c.max_messages_per_subject)
    };
    let (window, day) = (Duration::from_secs(2), Duration::from_secs(86_400));
    bus.ensure_topology(&Topology::default().keeping(Some(window), Some(day))).await.unwrap();
    assert_eq!(kept(names::COMMANDS_STREAM).await.0, names::DEDUP_WINDOW, "a service that does not align");
    bus.ensure_topology(&Topology::default().keeping(Some(window), Some(day)).aligning()).await.unwrap();
    assert_eq!(kept(names::COMMANDS_STREAM).await, (window, day, -1));
    assert_eq!(kept(names::EVENTS_STREAM).await.1, day);
    assert_eq!(kept(&names::kv_stream(names::LEDGER_BUCKET)).await.1, day, "the ledger as long as the commands");
    assert_eq!(kept(&names::kv_stream(names::SITES_BUCKET)).await.2, 1, "a key's latest value only");
    let refused = Topology::default().keeping(Some(day * 2), Some(day));
    assert!(bus.ensure_topology(&refused).await.is_err(), "a window longer than the retention");
}
