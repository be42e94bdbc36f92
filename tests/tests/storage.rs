//! What landfall keeps, and for how long: finished installs and rollouts compacted to summaries
//! after the retention (and still shown), recovery that reads only what is under way, a node
//! that left forgotten for good, and a site removed whole.

use std::time::{Duration, Instant};

use bus_schema::names::{self, keys};
use bus_schema::pb::{self, BusEvent, BusMessage};
use bus_schema::retention::StorePolicy;
use bus_schema::runtime::{Bus, Envelope, JobDelivery, Kv, Topology};
use consumers::orchestrator::Orchestrator;
use landfall_tests::cli::{landfall, text};
use landfall_tests::fleet::{Fleet, kubelet};
use landfall_tests::nats::NatsServer;

const WAIT: Duration = Duration::from_secs(30);

fn short_retention() -> StorePolicy {
    StorePolicy {
        finished_retention: Duration::from_secs(1),
        compaction_interval: Duration::from_millis(300),
        marker_retention: Duration::from_secs(1),
        ..Default::default()
    }
}

async fn until<F: AsyncFn() -> bool>(what: &str, f: F) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !f().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether the bucket's stream still holds any message (a marker included) for `key`.
async fn any_message(bus: &Bus, bucket: &str, key: &str) -> bool {
    let stream = bus.jetstream().get_stream(names::kv_stream(bucket)).await.unwrap();
    stream.get_last_raw_message_by_subject(&format!("$KV.{bucket}.{key}")).await.is_ok()
}

async fn register_kubelet(fleet: &Fleet) {
    let env = Envelope::root();
    let cmd = pb::RegisterPackage { package: Some(kubelet("1.30.0")), auto_rollout: None };
    fleet.bus.publish_command(&cmd, &env).await.unwrap();
    fleet.wait_for(pb::PackageRegistered::filter(), &env.id, WAIT).await.expect("registered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_installs_and_rollouts_leave_summaries_and_are_still_shown() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(1).nodes(2).store_policy(short_retention()).start().await;
    let install = fleet.install(&fleet.site_id(0)).await;
    fleet.wait_install(&install).await;
    register_kubelet(&fleet).await;
    let cmd =
        fleet.patch(pb::PatchPackage { name: "kubelet".into(), version: "1.30.0".into(), ..Default::default() }).await;
    fleet.wait_rollout(&cmd.id, WAIT).await;
    let sagas = fleet.bus.kv(names::SAGAS_BUCKET).await.unwrap();

    until("the rollout and the install compacted", async || {
        let r = sagas.get::<pb::Rollout>(&keys::rollout(&cmd.id)).await.unwrap();
        let s = sagas.get::<pb::InstallSaga>(&keys::saga(&install.id)).await.unwrap();
        r.is_none() && s.is_none()
    })
    .await;
    let (summary, _) = sagas.get::<pb::RolloutSummary>(&keys::rollout_summary(&cmd.id)).await.unwrap().unwrap();
    assert_eq!((summary.phase, summary.sites, summary.patched), (pb::RolloutPhase::Completed as i32, 1, 2));
    let (saga, _) = sagas.get::<pb::SagaSummary>(&keys::saga_summary(&install.id)).await.unwrap().unwrap();
    assert_eq!((saga.outcome, saga.nodes), (pb::InstallOutcome::Success as i32, 2));
    // The plan and the site's record went with it, and so do the index entries.
    assert!(sagas.get::<pb::RolloutPlanChunk>(&keys::rollout_plan(&cmd.id, 0)).await.unwrap().is_none());
    let site = fleet.site_id(0);
    assert!(sagas.get::<pb::RolloutSite>(&keys::rollout_site(&cmd.id, &site)).await.unwrap().is_none());
    assert!(sagas.scan::<pb::ActiveEntry>("active.").await.unwrap().is_empty());
    // Once older than the marker retention, not even the deletion markers stay.
    until("the markers swept", async || {
        !any_message(&fleet.bus, names::SAGAS_BUCKET, &keys::rollout_plan(&cmd.id, 0)).await
            && !any_message(&fleet.bus, names::SAGAS_BUCKET, &keys::saga(&install.id)).await
    })
    .await;

    // People still see both.
    let url = server.url();
    let show = landfall(&url, &["rollout", "show", &cmd.id]).await;
    let out = text(&show.stdout);
    assert!(show.status.success(), "{out}{}", text(&show.stderr));
    assert!(out.contains("completed") && out.contains("compacted"), "{out}");
    let list = landfall(&url, &["rollout", "list"]).await;
    assert!(text(&list.stdout).contains(&cmd.id), "{}", text(&list.stdout));
    let status = landfall(&url, &["status", &site, "-o", "json"]).await;
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let installed = &status[0]["install"];
    assert_eq!(installed["compacted"], true, "{status}");
    assert_eq!(installed["outcome"], "INSTALL_OUTCOME_SUCCESS", "{status}");
    fleet.stop().await;
}

/// What is kept of something ended goes too, after its own retention: a compacted install's
/// summary, and the record that a node left its site.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn summaries_and_departures_go_after_their_retention() {
    let server = NatsServer::start();
    let policy = StorePolicy { summary_retention: Duration::from_secs(3), ..short_retention() };
    let fleet = Fleet::builder(&server.url()).sites(1).nodes(3).store_policy(policy).start().await;
    let site = fleet.site_id(0);
    let install = fleet.install(&site).await;
    fleet.wait_install(&install).await;
    let env = Envelope::root();
    let cmd = pb::NodeRemoved { site_id: site.clone(), node: "node-3".into(), ..Default::default() };
    fleet.bus.publish_command(&cmd, &env).await.unwrap();
    fleet.wait_for(pb::NodeLeft::filter(), &env.id, WAIT).await.expect("NodeLeft");

    let sagas = fleet.bus.kv(names::SAGAS_BUCKET).await.unwrap();
    let observed = fleet.bus.kv(names::OBSERVED_BUCKET).await.unwrap();
    let summary = async || sagas.get::<pb::SagaSummary>(&keys::saga_summary(&install.id)).await.unwrap().is_some();
    let departed =
        async || observed.get::<pb::NodeDeparted>(&keys::node_departed(&site, "node-3")).await.unwrap().is_some();
    until("the install compacted into its summary", summary).await;
    assert!(departed().await, "node-3's departure is remembered");
    // A second install: the first's summary goes after its retention, the latest's stays (it is
    // how the hub knows the site is installed: a node added now joins the cluster).
    let second = fleet.install(&site).await;
    fleet.wait_install(&second).await;
    until("the summary gone after its retention", async || !summary().await).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(sagas.get::<pb::SagaSummary>(&keys::saga_summary(&second.id)).await.unwrap().is_some(), "the latest stays");
    until("the departure forgotten after its retention", async || !departed().await).await;
    fleet.stop().await;
}

/// A saga as a crash left it: its outbox written, not published.
fn saga_with_outbox(id: &str, phase: pb::InstallPhase) -> pb::InstallSaga {
    let entry = pb::OutboxEntry {
        subject: names::event_subject("edge-01", pb::SiteInstallStarted::AGGREGATE, pb::SiteInstallStarted::KIND),
        message_type: pb::SiteInstallStarted::TYPE.into(),
        message_id: bus_schema::ids::new_id().to_string(),
        payload: prost::Message::encode_to_vec(&pb::SiteInstallStarted {
            site_id: "edge-01".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    pb::InstallSaga {
        saga_id: id.into(),
        site_id: "edge-01".into(),
        phase: phase as i32,
        started_unix_ms: 1,
        finished_unix_ms: 2,
        outbox: vec![entry],
        ..Default::default()
    }
}

async fn write_many(sagas: &Kv, n: usize) {
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        let writes = chunk.iter().map(|i| {
            let id = format!("finished-{i}");
            let saga = saga_with_outbox(&id, pb::InstallPhase::Succeeded);
            async move { sagas.put(&keys::saga(&id), &saga).await.unwrap() }
        });
        futures::future::join_all(writes).await;
    }
}

/// Startup recovery reads the index of what is under way: 5,000 ended sagas (here even with
/// outboxes a reader of every saga would settle) are not read; the 5 under way are settled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_reads_the_sagas_under_way_not_history() {
    let server = NatsServer::start();
    let bus = Bus::connect(&server.url(), "storage-test").await.unwrap();
    bus.ensure_topology(&Topology::default()).await.unwrap();
    let sagas = bus.kv(names::SAGAS_BUCKET).await.unwrap();
    write_many(&sagas, 5_000).await;
    for i in 0..5 {
        let id = format!("active-{i}");
        let entry = pb::ActiveEntry { id: id.clone(), site_id: "edge-01".into(), started_unix_ms: 1 };
        sagas.put(&keys::active_saga(&id), &entry).await.unwrap();
        sagas.put(&keys::saga(&id), &saga_with_outbox(&id, pb::InstallPhase::ProvisioningOs)).await.unwrap();
    }
    let orchestrator = Orchestrator::new(bus.clone(), StorePolicy::default()).await.unwrap();
    let started = Instant::now();
    let settled = orchestrator.recover().await.unwrap();
    let took = started.elapsed();
    eprintln!("recovery with 5000 ended and 5 active sagas: {settled} settled in {took:?}");
    assert_eq!(settled, 5, "only the sagas under way are read");
    for i in 0..5 {
        let (s, _) = sagas.get::<pb::InstallSaga>(&keys::saga(&format!("active-{i}"))).await.unwrap().unwrap();
        assert!(s.outbox.is_empty(), "its outbox was published");
    }
    let (s, _) = sagas.get::<pb::InstallSaga>(&keys::saga("finished-7")).await.unwrap().unwrap();
    assert_eq!(s.outbox.len(), 1, "an ended saga is not read");
}

async fn observed_keys(fleet: &Fleet, site: &str, node: &str) -> usize {
    let observed = fleet.bus.kv(names::OBSERVED_BUCKET).await.unwrap();
    observed.scan::<pb::ObservedVersion>(&keys::observed_node_prefix(site, node)).await.unwrap().len()
}

/// Publishes a late report of node-3 from `install` (which started before it left), then one of
/// `other`, handled after it (a site's events are handled in order); once `other`'s is written,
/// node-3 still has no observed version.
async fn late_reports_leave_node_3_out(fleet: &Fleet, site: &str, install: &Envelope, other: &str, version: &str) {
    let packages = vec![pb::PackageRef { name: "kubelet".into(), version: version.into() }];
    for node in ["node-3", other] {
        let late =
            pb::NodeReady { site_id: site.into(), node: node.into(), packages: packages.clone(), ..Default::default() };
        fleet.bus.publish_event(&late, &install.derive("late", Some(node))).await.unwrap();
    }
    let observed = fleet.bus.kv(names::OBSERVED_BUCKET).await.unwrap();
    until(&format!("{other}'s report written"), async || {
        let got = observed.get::<pb::ObservedVersion>(&keys::observed(site, other, "kubelet")).await.unwrap();
        got.is_some_and(|(v, _)| v.version == version)
    })
    .await;
    assert_eq!(observed_keys(fleet, site, "node-3").await, 0, "the late report of node-3 was not written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_left_is_forgotten_and_a_late_report_does_not_bring_it_back() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(1).nodes(3).start().await;
    let site = fleet.site_id(0);
    let install = fleet.install(&site).await;
    fleet.wait_install(&install).await;
    assert!(observed_keys(&fleet, &site, "node-3").await > 0);

    let env = Envelope::root();
    let cmd = pb::NodeRemoved { site_id: site.clone(), node: "node-3".into(), ..Default::default() };
    fleet.bus.publish_command(&cmd, &env).await.unwrap();
    fleet.wait_for(pb::NodeLeft::filter(), &env.id, WAIT).await.expect("NodeLeft");
    until("node-3's observed keys gone", async || observed_keys(&fleet, &site, "node-3").await == 0).await;

    // A report of node-3 from the install (which started before it left) arrives late; then
    // one of node-2, handled after it (a site's events are handled in order).
    late_reports_leave_node_3_out(&fleet, &site, &install, "node-2", "9.9.9").await;
    fleet.stop().await;
}

/// A departure another observer wrote (here: the test, writing the marker as a replica does) is
/// known to the running observer through its watch of the markers, without a read per report:
/// a late report of that node is not written, while the next report of another node is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_departure_written_by_another_observer_keeps_a_late_report_out() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(1).nodes(3).start().await;
    let site = fleet.site_id(0);
    let install = fleet.install(&site).await;
    fleet.wait_install(&install).await;
    let observed = fleet.bus.kv(names::OBSERVED_BUCKET).await.unwrap();
    let departed = pb::NodeDeparted {
        site_id: site.clone(),
        node: "node-3".into(),
        left_unix_ms: i64::try_from(
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis(),
        )
        .unwrap(),
        ..Default::default()
    };
    observed.put(&keys::node_departed(&site, "node-3"), &departed).await.unwrap();
    for (key, _, _) in observed.scan::<pb::ObservedVersion>(&keys::observed_node_prefix(&site, "node-3")).await.unwrap()
    {
        observed.purge(&key).await.unwrap();
    }
    // The watch brings the marker a moment after it is written (milliseconds; 2 s is room).
    tokio::time::sleep(Duration::from_secs(2)).await;

    late_reports_leave_node_3_out(&fleet, &site, &install, "node-1", "9.9.8").await;
    fleet.stop().await;
}

/// The observer writes a node's report and dies before acknowledging it; the next observer
/// writes the node's newer report; then the server delivers the first again (its ack wait is
/// over). The node keeps the newer version: a report late in coming never undoes a later one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_delivered_again_after_a_newer_one_does_not_undo_it() {
    use async_nats::jetstream::consumer::PullConsumer;
    use futures::StreamExt;
    use tokio_util::sync::CancellationToken;

    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).without_observer().start().await;
    let site = fleet.site_id(0);
    let install = fleet.install(&site).await;
    fleet.wait_install(&install).await;
    let events = fleet.bus.jetstream().get_stream(names::EVENTS_STREAM).await.unwrap();
    let consumer = async || -> PullConsumer { events.get_consumer(names::OBSERVER_EVENTS).await.unwrap() };
    let settled = async || {
        let info = consumer().await.info().await.unwrap().clone();
        info.num_pending == 0 && info.num_ack_pending == 0
    };
    let observer = |token: &CancellationToken| tokio::spawn(consumers::run_observer(fleet.bus.clone(), token.clone()));

    // An observer reads the install's reports and stops.
    let first_observer = CancellationToken::new();
    let running = observer(&first_observer);
    until("the install's reports read", async || {
        tokio::time::sleep(Duration::from_millis(200)).await;
        settled().await
    })
    .await;
    first_observer.cancel();
    running.await.unwrap().unwrap();

    // node-2 reports 1.30.6; the observer that takes it dies before its ack (the test takes it
    // and acknowledges nothing), so the server holds it until the ack wait ends.
    let report = |version: &str| pb::NodeReady {
        site_id: site.clone(),
        node: "node-2".into(),
        packages: vec![pb::PackageRef { name: "kubelet".into(), version: version.into() }],
        ..Default::default()
    };
    let first = install.derive("first report", Some("node-2"));
    fleet.bus.publish_event(&report("1.30.6"), &first).await.unwrap();
    let mut taken = consumer().await.fetch().max_messages(1).expires(WAIT).messages().await.unwrap();
    let held = taken.next().await.expect("the report delivered").unwrap();
    let held_id = held.headers.as_ref().and_then(|h| h.get(names::headers::MSG_ID)).map(|v| v.to_string());
    assert_eq!(held_id.as_deref(), Some(first.id.as_str()), "the first report is the next to read");
    drop(taken);

    // node-2 reports 1.30.7; the next observer writes it, then gets the first again.
    fleet.bus.publish_event(&report("1.30.7"), &install.derive("second report", Some("node-2"))).await.unwrap();
    let second_observer = CancellationToken::new();
    let running = observer(&second_observer);
    let observed = fleet.bus.kv(names::OBSERVED_BUCKET).await.unwrap();
    let kubelet_of_node_2 = async || {
        observed.get::<pb::ObservedVersion>(&keys::observed(&site, "node-2", "kubelet")).await.unwrap().map(|(v, _)| v)
    };
    until("the newer report written", async || kubelet_of_node_2().await.is_some_and(|v| v.version == "1.30.7")).await;
    until("the first report delivered again and handled", async || {
        tokio::time::sleep(Duration::from_millis(200)).await;
        settled().await
    })
    .await;
    let kept = kubelet_of_node_2().await.expect("node-2's kubelet");
    assert_eq!(kept.version, "1.30.7", "the late report did not undo the newer one ({kept:?})");
    second_observer.cancel();
    running.await.unwrap().unwrap();
    fleet.stop().await;
}

async fn remove(fleet: &Fleet, site: &str) -> pb::SiteRemoved {
    let env = Envelope::root();
    fleet.bus.publish_command(&pb::RemoveSite { site_id: site.into(), reason: "closed".into() }, &env).await.unwrap();
    let e = fleet.wait_for(names::EVENTS_ALL.to_string(), &env.id, WAIT).await.expect("an answer");
    match e.delivery.type_name.as_str() {
        pb::SiteRemoved::TYPE => e.delivery.decode().unwrap(),
        other => panic!("{other}: {:?}", e.delivery.decode::<pb::CommandRejected>()),
    }
}

async fn refusal(fleet: &Fleet, site: &str) -> pb::CommandRejected {
    let env = Envelope::root();
    fleet.bus.publish_command(&pb::RemoveSite { site_id: site.into(), reason: String::new() }, &env).await.unwrap();
    let e = fleet.wait_for(names::EVENTS_ALL.to_string(), &env.id, WAIT).await.expect("an answer");
    assert_eq!(e.delivery.type_name, pb::CommandRejected::TYPE);
    e.delivery.decode().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_site_leaves_nothing_behind_but_its_install_summary() {
    removed_leaves_nothing(JobDelivery::Dispatch).await;
}

/// The same with a durable per site: the removed site's durable is deleted, the other's kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_sites_durable_goes_and_the_other_sites_stays() {
    removed_leaves_nothing(JobDelivery::Durable).await;
}

async fn removed_leaves_nothing(jobs_by: JobDelivery) {
    let server = NatsServer::start();
    let builder = Fleet::builder(&server.url()).sites(2).nodes(2);
    let fleet = match jobs_by {
        JobDelivery::Dispatch => builder.dispatched(),
        JobDelivery::Durable => builder.durable_per_site(),
    }
    .start()
    .await;
    let (site, other) = (fleet.site_id(0), fleet.site_id(1));
    let install = fleet.install(&site).await;
    fleet.wait_install(&install).await;
    let sagas = fleet.bus.kv(names::SAGAS_BUCKET).await.unwrap();

    // Unknown sites are refused; so is a site a rollout holds.
    assert_eq!(refusal(&fleet, "edge-99").await.code, pb::RejectCode::UnknownSite as i32);
    let lease = pb::SiteLease {
        site_id: site.clone(),
        saga_id: "0190a1b2-0000-7000-8000-000000000001".into(),
        acquired_unix_ms: i64::try_from(
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis(),
        )
        .unwrap(),
        holder: pb::LeaseHolder::Rollout as i32,
    };
    sagas.put(&keys::site_lease(&site), &lease).await.unwrap();
    let busy = refusal(&fleet, &site).await;
    assert_eq!(busy.code, pb::RejectCode::Conflict as i32);
    assert!(busy.reason.contains("rollout"), "{}", busy.reason);
    sagas.purge(&keys::site_lease(&site)).await.unwrap();

    // Its gateway stops, and a job waits for it in the stream.
    fleet.stop_gateway(0);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stage = Envelope::root();
    fleet.bus.publish_command(&pb::StageSite { site_id: site.clone(), design_revision: 0 }, &stage).await.unwrap();
    let jobs = fleet.bus.jetstream().get_stream(names::site_jobs_stream(&site)).await.unwrap();
    until("the stage job in the stream", async || {
        let mut info = jobs.clone();
        info.info().await.unwrap().state.messages >= 1
    })
    .await;

    let removed = remove(&fleet, &site).await;
    assert_eq!((removed.jobs_dropped, removed.reason.as_str()), (1, "closed"));
    let mut info = jobs.clone();
    assert_eq!(info.info().await.unwrap().state.messages, 0, "its jobs are gone");
    assert!(jobs.consumer_info(names::gateway_consumer(&site)).await.is_err(), "its consumer is gone");
    let others = fleet.bus.jetstream().get_stream(names::site_jobs_stream(&other)).await.unwrap();
    let kept = others.consumer_info(names::gateway_consumer(&other)).await.is_ok();
    assert_eq!(kept, jobs_by == JobDelivery::Durable, "the other site's durable stays (when sites have one)");
    let sites = fleet.bus.kv(names::SITES_BUCKET).await.unwrap();
    assert!(sites.get::<pb::SiteDesign>(&keys::site(&site)).await.unwrap().is_none());
    assert!(sites.get::<pb::SiteDesign>(&keys::site(&other)).await.unwrap().is_some());
    assert!(sagas.get::<pb::InstallSaga>(&keys::saga(&install.id)).await.unwrap().is_none());
    assert!(sagas.get::<pb::SagaSummary>(&keys::saga_summary(&install.id)).await.unwrap().is_some());
    until("observed keys and kubeconfig gone", async || {
        let observed = fleet.bus.kv(names::OBSERVED_BUCKET).await.unwrap();
        let kubeconfigs = fleet.bus.kv(names::KUBECONFIGS_BUCKET).await.unwrap();
        observed.scan::<pb::ObservedVersion>(&keys::observed_site_prefix(&site)).await.unwrap().is_empty()
            && kubeconfigs.get::<pb::SealedSecret>(&keys::kubeconfig(&site)).await.unwrap().is_none()
    })
    .await;
    // Removed once: a second removal names an unknown site.
    assert_eq!(refusal(&fleet, &site).await.code, pb::RejectCode::UnknownSite as i32);
    fleet.stop().await;
}

/// A site removed while a rollout waits to reach it gets no job when its turn comes: its nodes
/// are skipped and the rollout completes without waiting for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_skips_a_site_removed_after_it_was_planned() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(2).nodes(2).start().await;
    fleet.install_all().await;
    register_kubelet(&fleet).await;
    let (first, second) = (fleet.site_id(0), fleet.site_id(1));
    let strategy =
        pb::RolloutStrategy { canary_site_ids: vec![first.clone()], max_concurrent_sites: 1, ..Default::default() };
    let patch = pb::PatchPackage {
        name: "kubelet".into(),
        version: "1.30.0".into(),
        strategy: Some(strategy),
        ..Default::default()
    };
    let rollout = fleet.patch(patch).await;
    // Paused once planned (fleet commands are taken in order): the second site has not started.
    let pause = pb::PauseRollout { rollout_id: rollout.id.clone(), reason: "look first".into() };
    fleet.bus.publish_command(&pause, &Envelope::root()).await.unwrap();
    fleet.wait_for(pb::RolloutPaused::filter(), &rollout.id, WAIT).await.expect("paused");
    let removed = remove(&fleet, &second).await;
    assert_eq!(removed.site_id, second);

    let resume = pb::ResumeRollout { rollout_id: rollout.id.clone() };
    fleet.bus.publish_command(&resume, &Envelope::root()).await.unwrap();
    let run = fleet.wait_rollout(&rollout.id, WAIT).await;
    let done = run.of_type::<pb::RolloutCompleted>().pop().unwrap_or_else(|| panic!("{:?}", run.kinds()));
    assert_eq!((done.patched, done.failed), (2, 0), "{done:?}");
    let sagas = fleet.bus.kv(names::SAGAS_BUCKET).await.unwrap();
    let (record, _) = sagas.get::<pb::RolloutSite>(&keys::rollout_site(&rollout.id, &second)).await.unwrap().unwrap();
    assert_eq!(record.skipped, ["node-1", "node-2"], "{record:?}");
    assert!(record.patched.is_empty() && record.failed.is_empty());
    // No job went to the removed site: the jobs streams (work queues) hold none at all.
    for stream in names::jobs_streams() {
        let mut jobs = fleet.bus.jetstream().get_stream(stream).await.unwrap();
        assert_eq!(jobs.info().await.unwrap().state.messages, 0, "a job waits in {stream}");
    }
    fleet.stop().await;
}
