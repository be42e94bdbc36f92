//! The orchestrator dies mid-install (kill -9 from outside, or an abort at the worst moment
//! inside a step) and is restarted: the install completes, and no step runs twice.

use producers::embedded::tied;
use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use bus_schema::pb::{self, BusEvent, BusMessage};
use bus_schema::runtime::{Envelope, JobDelivery};
use landfall_tests::fleet::{Fleet, InstallRun, RolloutRun};
use landfall_tests::nats::NatsServer;
use site_gateway::sim::SimConfig;
use tokio::process::{Child, Command};

/// The real `landfall` CLI running `serve orchestrator` as its own process.
fn orchestrator(url: &str, failpoint: Option<&str>) -> Child {
    orchestrator_taking(url, failpoint, None)
}

/// An orchestrator process whose jobs reach sites as `jobs` says (as the environment says, when
/// `None`).
fn orchestrator_taking(url: &str, failpoint: Option<&str>, jobs: Option<&str>) -> Child {
    let mut cmd = Command::from(tied::command(landfall_tests::cli::binary()));
    if let Some(jobs) = jobs {
        cmd.env(JobDelivery::ENV, jobs);
    }
    cmd.args(["serve", "orchestrator", "--nats-url", url])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true);
    match failpoint {
        Some(f) => cmd.env("LANDFALL_FAILPOINT", f),
        None => cmd.env_remove("LANDFALL_FAILPOINT"),
    };
    cmd.spawn().expect("start the landfall orchestrator process")
}

/// Slow enough that a kill lands in the middle of the install.
fn slow_site() -> SimConfig {
    SimConfig {
        provisioning: Duration::from_millis(1500),
        install_binaries: Duration::from_millis(800),
        apply_containers: Duration::from_millis(300),
        ..SimConfig::fast()
    }
}

/// Every effect once, every event of the flow once (a republished message carries the same
/// id and is dropped by the stream).
fn assert_exactly_once(fleet: &Fleet, run: &InstallRun) {
    assert_eq!(run.terminal().delivery.type_name, pb::SiteInstalled::TYPE);
    let nodes = &fleet.sites[0].0.nodes;
    let once: BTreeMap<String, u32> = nodes.iter().map(|n| (n.name.to_string(), 1)).collect();
    let effects = fleet.backend(0).effects();
    assert_eq!(effects.provisions, once, "each host provisioned once");
    assert_eq!(effects.binary_installs, once, "binaries installed once per node");
    assert_eq!(effects.kubeconfigs_generated, 1);
    assert_eq!(effects.container_applies, 1);

    let count = |t: &str| run.events.iter().filter(|e| e.delivery.type_name == t).count();
    assert_eq!(count(pb::SiteInstallStarted::TYPE), 1);
    assert_eq!(count(pb::ArtifactsStaged::TYPE), 1);
    assert_eq!(count(pb::NodeOsProvisioned::TYPE), nodes.len());
    assert_eq!(count(pb::NodeBinariesInstalled::TYPE), nodes.len());
    assert_eq!(count(pb::ClusterReady::TYPE), 1);
    assert_eq!(count(pb::KubeconfigStored::TYPE), 1);
    assert_eq!(count(pb::ContainerPackagesApplied::TYPE), 1);
    assert_eq!(count(pb::SiteInstalled::TYPE), 1);
}

/// SIGKILLs the orchestrator process, waits a moment, and starts a fresh one.
async fn kill_and_restart(orch: Child, url: &str, down_for: Duration) -> Child {
    kill_and_restart_with(orch, url, down_for, None).await
}

async fn kill_and_restart_with(mut orch: Child, url: &str, down_for: Duration, failpoint: Option<&str>) -> Child {
    orch.kill().await.unwrap();
    tokio::time::sleep(down_for).await;
    orchestrator(url, failpoint)
}

async fn registered_fleet(server: &NatsServer) -> (Fleet, Child) {
    let fleet = Fleet::builder(&server.url()).nodes(3).sim(slow_site()).without_orchestrator().start().await;
    let orch = orchestrator(&server.url(), None);
    // The orchestrator process applies the registrations the fleet published.
    let mut reader = fleet
        .bus
        .read_events(vec![pb::SiteRegistered::filter()], async_nats::jetstream::consumer::DeliverPolicy::All)
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(30), reader.next()).await.expect("site registered").unwrap().unwrap();
    (fleet, orch)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_orchestrator_killed_twice_mid_install_resumes_and_repeats_no_step() {
    let server = NatsServer::start();
    let (fleet, orch) = registered_fleet(&server).await;
    let cmd = fleet.install(&fleet.site_id(0)).await;

    // First kill: while hosts are provisioning.
    let provisioning = pb::NodeOsProvisioning::filter();
    fleet.wait_for(provisioning, &cmd.id, Duration::from_secs(30)).await.expect("provisioning started");
    let orch = kill_and_restart(orch, &server.url(), Duration::from_millis(500)).await;

    // Second kill: right as the cluster is ready.
    fleet.wait_for(pb::ClusterReady::filter(), &cmd.id, Duration::from_secs(30)).await.expect("cluster ready");
    let mut orch = kill_and_restart(orch, &server.url(), Duration::from_millis(300)).await;

    let run = fleet.wait_install(&cmd).await;
    assert_exactly_once(&fleet, &run);
    orch.kill().await.unwrap();
    fleet.stop().await;
}

/// The worst moments: the saga's next state (with the messages it decided to send) is
/// written, but the messages are not yet published — or published, but not yet marked so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_orchestrator_dying_between_deciding_and_publishing_loses_nothing() {
    for failpoint in ["saga-written-outbox-unpublished:3", "outbox-published-not-cleared:4"] {
        let server = NatsServer::start();
        let fleet = Fleet::builder(&server.url()).nodes(3).sim(slow_site()).without_orchestrator().start().await;
        let mut doomed = orchestrator(&server.url(), Some(failpoint));
        let cmd = fleet.install(&fleet.site_id(0)).await;

        let status =
            tokio::time::timeout(Duration::from_secs(60), doomed.wait()).await.expect("failpoint reached").unwrap();
        assert!(!status.success(), "{failpoint}: the process aborted ({status})");

        let mut orch = orchestrator(&server.url(), None);
        let run = fleet.wait_install(&cmd).await;
        assert_exactly_once(&fleet, &run);
        orch.kill().await.unwrap();
        fleet.stop().await;
    }
}

/// A job delivered again (a gateway restart, an ack lost on the way) does not repeat its effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivered_job_does_not_repeat_its_effect() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).nodes(2).start().await;
    let cmd = fleet.install(&fleet.site_id(0)).await;
    let run = fleet.wait_install(&cmd).await;
    assert_eq!(run.terminal().delivery.type_name, pb::SiteInstalled::TYPE);
    let before = fleet.backend(0).effects();

    // The same ProvisionOs job again, under a new message id so the stream cannot drop it.
    let design = &fleet.sites[0].0;
    let node = pb::NodeSpec::from(&design.nodes[0]);
    let image = producers::up::demo_packages().into_iter().find(|p| p.kind == pb::PackageKind::OsImage as i32);
    let job =
        pb::ProvisionOs { site_id: design.site.to_string(), node: Some(node.clone()), image, ..Default::default() };
    let again = bus_schema::runtime::Envelope::root();
    fleet.bus.publish_job(&job, &again).await.unwrap();
    let done = fleet.wait_for(pb::NodeOsProvisioned::filter(), &again.id, Duration::from_secs(20)).await;
    assert!(done.is_some(), "the gateway answered the repeated job");
    assert_eq!(fleet.backend(0).effects(), before, "no new effect");
    fleet.stop().await;
}

/// A fleet of installed sites whose binaries patch slowly enough for a kill to land mid-rollout,
/// with the orchestrator in its own process; and kubelet 1.30.0 in the catalog.
async fn installed_fleet_for_rollout(server: &NatsServer, failpoint: Option<&str>) -> (Fleet, Child) {
    let sim = SimConfig { install_binaries: Duration::from_millis(1200), ..SimConfig::fast() };
    let fleet = Fleet::builder(&server.url()).sites(4).nodes(2).sim(sim).without_orchestrator().start().await;
    let orch = orchestrator(&server.url(), None);
    fleet.install_all().await;
    register_kubelet_1_30(&fleet).await;
    let orch = match failpoint {
        Some(_) => kill_and_restart_with(orch, &server.url(), Duration::ZERO, failpoint).await,
        None => orch,
    };
    (fleet, orch)
}

/// Puts kubelet 1.30.0 in the catalog, and waits until it is there.
async fn register_kubelet_1_30(fleet: &Fleet) {
    let mut newer = producers::up::demo_packages().into_iter().find(|p| p.name == "kubelet").unwrap();
    newer.version = "1.30.0".into();
    let register = Envelope::root();
    let cmd = pb::RegisterPackage { package: Some(newer), auto_rollout: None };
    fleet.bus.publish_command(&cmd, &register).await.unwrap();
    let registered = fleet.wait_for(pb::PackageRegistered::filter(), &register.id, Duration::from_secs(30)).await;
    registered.expect("kubelet 1.30.0 registered");
}

fn slow_patch() -> pb::PatchPackage {
    pb::PatchPackage {
        name: "kubelet".into(),
        version: "1.30.0".into(),
        strategy: Some(pb::RolloutStrategy { canary_sites: 1, max_concurrent_sites: 1, ..Default::default() }),
        ..Default::default()
    }
}

fn assert_rolled_out_once(fleet: &Fleet, run: &RolloutRun) {
    let done = run.of_type::<pb::RolloutCompleted>().pop().unwrap_or_else(|| panic!("completed: {:?}", run.kinds()));
    assert_eq!((done.planned_nodes, done.patched, done.failed), (8, 8, 0));
    assert_eq!(run.of_type::<pb::RolloutCompleted>().len(), 1);
    assert_eq!(run.of_type::<pb::SitePatched>().len(), 4, "each site reported once");
    assert_eq!(run.node_reports().len(), 8, "each node's patch published once");
    for i in 0..4 {
        let once: BTreeMap<String, u32> = fleet.sites[i].0.nodes.iter().map(|n| (n.name.to_string(), 1)).collect();
        assert_eq!(fleet.backend(i).effects().patches, once, "site {i}: each node patched once");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_orchestrator_killed_mid_rollout_resumes_and_patches_each_node_once() {
    let server = NatsServer::start();
    let (fleet, orch) = installed_fleet_for_rollout(&server, None).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cmd = fleet.patch(slow_patch()).await;
    // Killed after the canary site, while the next wave's site is patching.
    fleet.wait_for(pb::SitePatched::filter(), &cmd.id, Duration::from_secs(30)).await.expect("canary done");
    // The next site has patched a node (the sites' own counts: its report waits for its site's).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while (0..4).map(|i| fleet.backend(i).effects().patches.len()).sum::<usize>() <= 2 {
        assert!(tokio::time::Instant::now() < deadline, "no node patched past the canary's");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    let mut orch = kill_and_restart(orch, &server.url(), Duration::from_millis(500)).await;
    let run = fleet.wait_rollout(&cmd.id, Duration::from_secs(60)).await;
    assert_rolled_out_once(&fleet, &run);
    orch.kill().await.unwrap();
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_decided_but_not_published_is_published_after_a_restart() {
    let server = NatsServer::start();
    let (fleet, mut doomed) = installed_fleet_for_rollout(&server, Some("rollout-written-outbox-unpublished:2")).await;
    let cmd = fleet.patch(slow_patch()).await;
    let status =
        tokio::time::timeout(Duration::from_secs(60), doomed.wait()).await.expect("failpoint reached").unwrap();
    assert!(!status.success(), "the process aborted ({status})");
    let mut orch = orchestrator(&server.url(), None);
    let run = fleet.wait_rollout(&cmd.id, Duration::from_secs(60)).await;
    assert_rolled_out_once(&fleet, &run);
    orch.kill().await.unwrap();
    fleet.stop().await;
}

/// A site's job is published before the rollout marks it sent. The orchestrator dies in
/// between, and the site (quick, instant patches) reports before any orchestrator has marked
/// it: the report waits for the mark rather than being refused as answering no job, and the
/// rollout completes with each node patched once.
///
/// With a durable per site, whose jobs reach the sites while no orchestrator runs. (With the
/// dispatcher, in the orchestrator, they wait for the next; the same race needs a second
/// replica, which hands them out while the first has not marked them yet.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_that_outruns_the_record_of_its_job_is_counted() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(4).nodes(2).durable_per_site().without_orchestrator().start().await;
    let mut orch = orchestrator_taking(&server.url(), None, Some("durable"));
    fleet.install_all().await;
    register_kubelet_1_30(&fleet).await;
    orch.kill().await.unwrap();
    let mut doomed = orchestrator_taking(&server.url(), Some("rollout-jobs-sent-unmarked:1"), Some("durable"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let patch = pb::PatchPackage { name: "kubelet".into(), version: "1.30.0".into(), ..Default::default() };
    let cmd = fleet.patch(patch).await;
    let status =
        tokio::time::timeout(Duration::from_secs(60), doomed.wait()).await.expect("failpoint reached").unwrap();
    assert!(!status.success(), "the process aborted ({status})");
    // Every site reports while no orchestrator runs: each report is there before any mark.
    let patched = || (0..4).map(|i| fleet.backend(i).effects().patches.len()).sum::<usize>();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while patched() < 8 {
        assert!(std::time::Instant::now() < deadline, "the sites patched {} of 8 nodes", patched());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    fleet.wait_for(pb::SitePatched::filter(), &cmd.id, Duration::from_secs(30)).await.expect("a site reported");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut orch = orchestrator_taking(&server.url(), None, Some("durable"));
    let run = fleet.wait_rollout(&cmd.id, Duration::from_secs(60)).await;
    let done = run.of_type::<pb::RolloutCompleted>().pop().unwrap_or_else(|| panic!("completed: {:?}", run.kinds()));
    assert_eq!((done.planned_nodes, done.patched, done.failed), (8, 8, 0));
    assert!(run.of_type::<pb::MessageRejected>().is_empty(), "no report refused: {:?}", run.kinds());
    for i in 0..4 {
        let once: BTreeMap<String, u32> = fleet.sites[i].0.nodes.iter().map(|n| (n.name.to_string(), 1)).collect();
        assert_eq!(fleet.backend(i).effects().patches, once, "site {i}: each node patched once");
    }
    orch.kill().await.unwrap();
    fleet.stop().await;
}
