//! Undoing changes through the real bus, orchestrator and simulated gateways: a node that fails
//! its health check at a bad version put back by itself, a rollout undone as a whole node by node
//! and once, a halted rollout that rolls itself back, and a rollback through a kill -9 of the
//! orchestrator.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use bus_schema::names::{self, keys};
use bus_schema::pb::{self, BusEvent, BusMessage};
use bus_schema::runtime::Envelope;
use landfall_tests::fleet::{Fleet, RolloutRun, kubelet, node_steps};
use landfall_tests::nats::NatsServer;
use producers::embedded::tied;
use site_gateway::sim::SimConfig;
use tokio::process::{Child, Command};

const TIMEOUT: Duration = Duration::from_secs(60);

async fn register(fleet: &Fleet, package: pb::Package) {
    let env = Envelope::root();
    fleet.bus.publish_command(&pb::RegisterPackage { package: Some(package), auto_rollout: None }, &env).await.unwrap();
    fleet.wait_for(pb::PackageRegistered::filter(), &env.id, Duration::from_secs(20)).await.expect("registered");
}

fn patch(strategy: pb::RolloutStrategy) -> pb::PatchPackage {
    pb::PatchPackage {
        name: "kubelet".into(),
        version: "1.30.0".into(),
        strategy: Some(strategy),
        ..Default::default()
    }
}

async fn rollout(fleet: &Fleet, id: &str) -> pb::Rollout {
    let sagas = fleet.bus.kv(names::SAGAS_BUCKET).await.unwrap();
    sagas.get::<pb::Rollout>(&keys::rollout(id)).await.unwrap().expect("the rollout's record").0
}

async fn site_record(fleet: &Fleet, id: &str, site: &str) -> pb::RolloutSite {
    let sagas = fleet.bus.kv(names::SAGAS_BUCKET).await.unwrap();
    sagas.get::<pb::RolloutSite>(&keys::rollout_site(id, site)).await.unwrap().expect("the site's record").0
}

/// The kubelet version each node of site `i` runs, by the site itself.
fn kubelets(fleet: &Fleet, i: usize) -> BTreeMap<String, String> {
    let site = fleet.backend(i);
    fleet.sites[i]
        .0
        .nodes
        .iter()
        .map(|n| {
            let name = n.name.to_string();
            let v = ["1.29.2", "1.30.0"]
                .into_iter()
                .find(|v| site.runs(&name, &kubelet(v).try_into().unwrap()))
                .unwrap_or("?");
            (name, v.to_string())
        })
        .collect()
}

fn every_node_at(fleet: &Fleet, version: &str) -> bool {
    (0..fleet.sites.len()).all(|i| kubelets(fleet, i).values().all(|v| v == version))
}

fn patches(fleet: &Fleet, i: usize) -> BTreeMap<String, u32> {
    fleet.backend(i).effects().patches
}

fn count(run: &RolloutRun, type_name: &str) -> usize {
    run.events.iter().filter(|e| e.delivery.type_name == type_name).count()
}

async fn rejection(fleet: &Fleet, cmd: pb::RollbackRollout) -> pb::CommandRejected {
    let env = Envelope::root();
    fleet.bus.publish_command(&cmd, &env).await.unwrap();
    let filter = names::events_of_kind(pb::rejection::COMMAND_AGGREGATE, pb::rejection::KIND);
    fleet.wait_for(filter, &env.id, Duration::from_secs(20)).await.expect("refused").delivery.decode().unwrap()
}

/// A bad kubelet (it installs, but no node comes up Ready at it) reaches one site of two; each
/// node there fails its health check and is put back to 1.29.2 by itself, healthy again, each
/// step an event; the other site keeps 1.30.0.
#[tokio::test]
async fn a_node_that_fails_its_health_check_is_rolled_back_by_itself() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(2).nodes(2).start().await;
    fleet.install_all().await;
    register(&fleet, kubelet("1.30.0")).await;
    fleet.backend(1).bad_version("kubelet@1.30.0");
    let strategy = pb::RolloutStrategy {
        failure_threshold: "100%".into(),
        on_failure: pb::OnNodeFailure::RollBack as i32,
        ..Default::default()
    };
    let cmd = fleet.patch(patch(strategy)).await;
    let run = fleet.wait_rollout(&cmd.id, TIMEOUT).await;
    let done = run.of_type::<pb::RolloutCompleted>().pop().unwrap_or_else(|| panic!("completed: {:?}", run.kinds()));
    assert_eq!((done.patched, done.failed), (2, 2));
    let bad = fleet.site_id(1);
    let rolled: Vec<(String, String, String)> = run
        .of_type::<pb::NodeRolledBack>()
        .into_iter()
        .map(|e| (e.site_id, e.package.unwrap_or_default().version, e.failed_version))
        .collect();
    assert_eq!(rolled.len(), 2, "{rolled:?}");
    assert!(rolled.iter().all(|r| r == &(bad.clone(), "1.29.2".into(), "1.30.0".into())), "{rolled:?}");
    let failed = run.of_type::<pb::NodeRolledBack>()[0].reason.clone();
    assert!(failed.contains("did not become Ready at kubelet@1.30.0"), "{failed}");
    assert_eq!(run.of_type::<pb::NodePatchFailed>().len(), 2);
    assert_eq!(count(&run, pb::NodeRollbackFailed::TYPE), 0);
    // Out of service for the patch, and for the way back, then schedulable again (each step said
    // once: on its own, or in the node's report).
    let steps = node_steps(&run.events);
    assert_eq!(steps.iter().filter(|s| s.ends_with(" uncordoned")).count(), 4, "{steps:?}");
    assert_eq!(kubelets(&fleet, 1).values().collect::<Vec<_>>(), ["1.29.2", "1.29.2"]);
    assert_eq!(kubelets(&fleet, 0).values().collect::<Vec<_>>(), ["1.30.0", "1.30.0"]);
    assert!(fleet.backend(1).hosts().iter().all(|(n, _)| !fleet.backend(1).is_cordoned(n)));

    let r = rollout(&fleet, &cmd.id).await;
    assert_eq!((r.patched, r.failed, r.rolled_back), (2, 2, 2));
    let record = site_record(&fleet, &cmd.id, &bad).await;
    assert!(record.failed.iter().all(|f| f.rolled_back && f.rollback == "rolled back to 1.29.2, healthy again"));
    fleet.stop().await;
}

/// A completed rollout undone with `landfall rollout rollback`: every node back at the version it
/// ran, sites in reverse order, each node moved back once; the sites' designs follow; asking
/// again is answered with what was done; a rollback is not rolled back; an unknown rollout is
/// refused.
#[tokio::test]
async fn a_completed_rollout_is_undone_node_by_node_once() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(3).nodes(2).start().await;
    fleet.install_all().await;
    register(&fleet, kubelet("1.30.0")).await;
    let cmd = fleet.patch(patch(pb::RolloutStrategy { max_concurrent_sites: 1, ..Default::default() })).await;
    let run = fleet.wait_rollout(&cmd.id, TIMEOUT).await;
    assert!(run.of_type::<pb::RolloutCompleted>().pop().is_some(), "{:?}", run.kinds());
    assert!(every_node_at(&fleet, "1.30.0"));
    let order: Vec<String> = run.of_type::<pb::RolloutPlanned>()[0].sites.iter().map(|s| s.site_id.clone()).collect();

    let out = landfall_tests::cli::landfall(&server.url(), &["rollout", "rollback", &cmd.id]).await;
    assert!(out.status.success(), "{}", landfall_tests::cli::text(&out.stderr));
    let rollback_id = landfall_tests::cli::text(&out.stdout).trim().to_string();
    assert_eq!(rollback_id, bus_schema::rollout::rollback_id(&cmd.id));
    let run = fleet.wait_rollout(&rollback_id, TIMEOUT).await;
    let done = run.of_type::<pb::RolloutCompleted>().pop().unwrap_or_else(|| panic!("undone: {:?}", run.kinds()));
    assert_eq!((done.planned_nodes, done.patched, done.failed), (6, 6, 0));
    let planned = &run.of_type::<pb::RolloutPlanned>()[0];
    assert_eq!(planned.rollback_of, cmd.id);
    let back: Vec<String> = planned.sites.iter().map(|s| s.site_id.clone()).collect();
    assert_eq!(back, order.iter().rev().cloned().collect::<Vec<_>>(), "the last site changed goes back first");
    assert!(every_node_at(&fleet, "1.29.2"));
    for i in 0..3 {
        assert!(patches(&fleet, i).values().all(|n| *n == 2), "site {i}: forward once, back once");
    }
    let sites = fleet.bus.kv(names::SITES_BUCKET).await.unwrap();
    let (design, _) = sites.get::<pb::SiteDesign>(&keys::site(&fleet.site_id(0))).await.unwrap().unwrap();
    assert!(design.packages.iter().flat_map(|r| &r.packages).any(|p| p.name == "kubelet" && p.version == "1.29.2"));
    assert_eq!(rollout(&fleet, &cmd.id).await.rolled_back_by, rollback_id);

    // Once: asked again, it is answered with what was done, and nothing moves.
    let again = rejection(&fleet, pb::RollbackRollout { rollout_id: cmd.id.clone(), ..Default::default() }).await;
    assert_eq!(again.code, pb::RejectCode::Conflict as i32);
    assert!(
        again.reason.contains("was rolled back already") && again.reason.contains("6 of 6 nodes back"),
        "{}",
        again.reason
    );
    let of_rollback =
        rejection(&fleet, pb::RollbackRollout { rollout_id: rollback_id.clone(), ..Default::default() }).await;
    assert!(of_rollback.reason.contains("a rollback is not rolled back"), "{}", of_rollback.reason);
    let unknown =
        rejection(&fleet, pb::RollbackRollout { rollout_id: "no-such-rollout".into(), ..Default::default() }).await;
    assert_eq!(unknown.reason, "there is no rollout no-such-rollout");
    let out = landfall_tests::cli::landfall(&server.url(), &["rollout", "rollback", &cmd.id]).await;
    assert!(!out.status.success() && landfall_tests::cli::text(&out.stderr).contains("rolled back already"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!((0..3).all(|i| patches(&fleet, i).values().all(|n| *n == 2)), "nothing was done twice");
    fleet.stop().await;
}

/// A rollout that rolls itself back halts at its threshold and undoes what it did: the canary's
/// nodes go back, the failed node (a disruption budget held its drain, so nothing changed on
/// it) is found at its version and reported unchanged, and the sites never started are not
/// touched.
#[tokio::test]
async fn a_rollout_past_its_threshold_rolls_itself_back() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(3).nodes(2).start().await;
    fleet.install_all().await;
    register(&fleet, kubelet("1.30.0")).await;
    fleet.backend(1).block_drain("node-2");
    let strategy = pb::RolloutStrategy {
        canary_site_ids: vec![fleet.site_id(0)],
        max_concurrent_sites: 1,
        roll_back_on_halt: true,
        ..Default::default()
    };
    let cmd = fleet.patch(patch(strategy)).await;
    let run = fleet.wait_rollout(&cmd.id, TIMEOUT).await;
    assert!(run.of_type::<pb::RolloutHalted>().pop().is_some(), "{:?}", run.kinds());
    let rollback_id = bus_schema::rollout::rollback_id(&cmd.id);
    let undo = fleet.wait_rollout(&rollback_id, TIMEOUT).await;
    let done = undo.of_type::<pb::RolloutCompleted>().pop().unwrap_or_else(|| panic!("undone: {:?}", undo.kinds()));
    assert_eq!((done.planned_nodes, done.patched, done.failed), (4, 3, 0), "node-2 of site 1 was never changed");
    let planned = &undo.of_type::<pb::RolloutPlanned>()[0];
    assert!(planned.trigger.contains("rolls itself back past its failure threshold"), "{}", planned.trigger);
    assert!(every_node_at(&fleet, "1.29.2"));
    assert!(patches(&fleet, 2).is_empty(), "the site never started is never touched");
    let r = rollout(&fleet, &rollback_id).await;
    assert_eq!(r.unchanged, 1);
    let record = site_record(&fleet, &rollback_id, &fleet.site_id(1)).await;
    assert_eq!(record.unchanged, ["node-2"]);
    assert_eq!(rollout(&fleet, &cmd.id).await.phase, pb::RolloutPhase::Cancelled as i32, "ended, not resumable");
    fleet.stop().await;
}

/// The real `landfall serve orchestrator` as its own process.
fn orchestrator(url: &str) -> Child {
    let mut cmd = Command::from(tied::command(landfall_tests::cli::binary()));
    cmd.args(["serve", "orchestrator", "--nats-url", url])
        .env("RUST_LOG", "warn")
        .env_remove("LANDFALL_FAILPOINT")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true);
    cmd.spawn().expect("start the landfall orchestrator process")
}

/// A rollout still running is rolled back with `cancel`; the orchestrator is killed (-9) while
/// the rollback moves sites back and started again: the rollback finishes once, each node moved
/// back once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_survives_a_killed_orchestrator_and_finishes_once() {
    let server = NatsServer::start();
    let sim = SimConfig { install_binaries: Duration::from_millis(900), ..SimConfig::fast() };
    let fleet = Fleet::builder(&server.url()).sites(4).nodes(2).sim(sim).without_orchestrator().start().await;
    let mut orch = orchestrator(&server.url());
    fleet.install_all().await;
    register(&fleet, kubelet("1.30.0")).await;
    let cmd = fleet.patch(patch(pb::RolloutStrategy { max_concurrent_sites: 1, ..Default::default() })).await;
    // Two sites in, roll it back while the third patches: it finishes, then everything goes back.
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let sagas = fleet.bus.kv(names::SAGAS_BUCKET).await.unwrap();
    while sagas.get::<pb::Rollout>(&keys::rollout(&cmd.id)).await.unwrap().is_none_or(|(r, _)| r.sites_done < 2) {
        assert!(tokio::time::Instant::now() < deadline, "two sites patched");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let undo = Envelope::root();
    let rb = pb::RollbackRollout { rollout_id: cmd.id.clone(), cancel: true, reason: "bad canary".into() };
    fleet.bus.publish_command(&rb, &undo).await.unwrap();
    let rollback_id = bus_schema::rollout::rollback_id(&cmd.id);
    // A site moved back; the others are still to go.
    fleet.wait_for(pb::SitePatched::filter(), &rollback_id, TIMEOUT).await.expect("rolling back");
    orch.kill().await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut orch = orchestrator(&server.url());
    let run = fleet.wait_rollout(&rollback_id, TIMEOUT).await;
    let done = run.of_type::<pb::RolloutCompleted>().pop().unwrap_or_else(|| panic!("undone: {:?}", run.kinds()));
    assert_eq!(done.failed, 0);
    assert_eq!(run.of_type::<pb::RolloutCompleted>().len(), 1);
    assert!(every_node_at(&fleet, "1.29.2"), "{:?}", (0..4).map(|i| kubelets(&fleet, i)).collect::<Vec<_>>());
    let undone = rollout(&fleet, &cmd.id).await;
    assert_eq!(undone.phase, pb::RolloutPhase::Cancelled as i32);
    // Every node the rollout changed went back once; no node it never reached was touched.
    assert_eq!(done.patched, undone.patched, "each changed node back once");
    for i in 0..4 {
        assert!(patches(&fleet, i).values().all(|n| *n == 2), "site {i}: {:?}", patches(&fleet, i));
    }
    orch.kill().await.unwrap();
    fleet.stop().await;
}

/// An OS image that boots but whose node never comes up Ready is taken off again: the node is
/// reimaged back to the image it ran (its binaries installed again), each Metal3 state of both
/// reimages reported, and it is healthy again.
#[tokio::test]
async fn a_bad_os_image_is_reimaged_back_on_its_node() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(1).nodes(2).start().await;
    fleet.install_all().await;
    let old = producers::up::demo_packages().into_iter().find(|p| p.kind == pb::PackageKind::OsImage as i32).unwrap();
    let new = pb::Package { version: "24.04".into(), sha256: "cd".repeat(32), ..old.clone() };
    register(&fleet, new.clone()).await;
    fleet.backend(0).bad_version(&format!("{}@24.04", new.name));
    let strategy = pb::RolloutStrategy {
        failure_threshold: "100%".into(),
        on_failure: pb::OnNodeFailure::RollBack as i32,
        ..Default::default()
    };
    let cmd = pb::PatchPackage {
        name: new.name.clone(),
        version: "24.04".into(),
        strategy: Some(strategy),
        ..Default::default()
    };
    let cmd = fleet.patch(cmd).await;
    let run = fleet.wait_rollout(&cmd.id, TIMEOUT).await;
    let done = run.of_type::<pb::RolloutCompleted>().pop().unwrap_or_else(|| panic!("completed: {:?}", run.kinds()));
    assert_eq!((done.patched, done.failed), (0, 2));
    let back = run.of_type::<pb::NodeRolledBack>();
    assert_eq!(back.len(), 2, "{:?}", run.kinds());
    assert!(back.iter().all(|b| b.package.as_ref().is_some_and(|p| p.version == old.version)), "{back:?}");
    // Each node reimaged twice: onto the bad image, and back.
    let provisioned: Vec<String> = run
        .of_type::<pb::NodeOsProvisioning>()
        .into_iter()
        .filter(|e| e.state == "provisioned")
        .map(|e| format!("{} {}", e.node, e.image))
        .collect();
    assert_eq!(provisioned.len(), 4, "{provisioned:?}");
    let old_image: bus_schema::domain::Package = old.clone().try_into().unwrap();
    for node in ["node-1", "node-2"] {
        assert!(fleet.backend(0).runs(node, &old_image), "{node} runs {} again", old.version);
        assert!(!fleet.backend(0).is_cordoned(node), "{node} is in service again");
    }
    fleet.stop().await;
}
