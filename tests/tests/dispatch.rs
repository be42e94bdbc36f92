//! Jobs handed to sites by the hub's dispatcher (`JobDelivery::Dispatch`), with no durable per
//! site: end to end through the orchestrator and the sites' gateways, a site cut off and back,
//! a gateway set the other way than the hub, a job asked about twice, a dispatcher stopped while
//! its site works, jobs no one takes, and a job that comes again after a newer one.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use bus_schema::names::{self, keys};
use bus_schema::pb::{self, BusEvent, BusJob, BusMessage};
use bus_schema::runtime::{self, Bus, Delivery, Envelope, HandlerError, JobDelivery, Topology, dispatch, dispatched};
use futures::StreamExt;
use landfall_tests::fleet::{Fleet, kubelet};
use landfall_tests::nats::NatsServer;
use tokio_util::sync::CancellationToken;

/// The consumers on every shard of the jobs.
async fn durables_on_jobs(bus: &Bus) -> Vec<String> {
    let mut all = Vec::new();
    for stream in names::jobs_streams() {
        let stream = bus.jetstream().get_stream(stream).await.unwrap();
        let mut names = stream.consumer_names();
        while let Some(name) = names.next().await {
            all.push(name.unwrap());
        }
    }
    all
}

#[tokio::test]
async fn sites_install_and_patch_with_no_durable_of_their_own_each_node_once() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).dispatched().sites(3).nodes(3).start().await;
    fleet.install_all().await;
    let env = Envelope::root();
    let register = pb::RegisterPackage { package: Some(kubelet("1.30.0")), auto_rollout: None };
    fleet.bus.publish_command(&register, &env).await.unwrap();
    assert!(fleet.wait_for(pb::PackageRegistered::filter(), &env.id, Duration::from_secs(20)).await.is_some());
    let cmd =
        fleet.patch(pb::PatchPackage { name: "kubelet".into(), version: "1.30.0".into(), ..Default::default() }).await;
    let run = fleet.wait_rollout(&cmd.id, Duration::from_secs(60)).await;
    let done = run.of_type::<pb::RolloutCompleted>().pop().unwrap_or_else(|| panic!("{:?}", run.kinds()));
    assert_eq!((done.planned_nodes, done.patched, done.failed), (9, 9, 0));
    for (design, site) in &fleet.sites {
        let once: BTreeMap<String, u32> = design.nodes.iter().map(|n| (n.name.to_string(), 1)).collect();
        assert_eq!(site.effects().patches, once, "{}: each node patched once", design.site);
        assert!(site.effects().provisions.values().all(|&n| n == 1), "{}: {:?}", design.site, site.effects());
    }
    // One durable per shard, the dispatcher's, and none per site.
    let durables = durables_on_jobs(&fleet.bus).await;
    assert_eq!(durables.len(), names::JOB_SHARDS, "{durables:?}");
    assert!(durables.iter().all(|d| d == names::DISPATCHER), "{durables:?}");
    fleet.stop().await;
}

#[tokio::test]
async fn a_site_cut_off_gets_its_jobs_once_it_is_back() {
    cut_off_then_back(JobDelivery::Dispatch, JobDelivery::Dispatch).await;
}

#[tokio::test]
async fn a_gateway_set_to_a_durable_follows_a_hub_that_dispatches() {
    cut_off_then_back(JobDelivery::Dispatch, JobDelivery::Durable).await;
}

#[tokio::test]
async fn a_gateway_set_to_the_dispatcher_follows_a_hub_with_a_durable_per_site() {
    cut_off_then_back(JobDelivery::Durable, JobDelivery::Dispatch).await;
}

/// Two sites, the second's gateway stopped while both install: its jobs wait at the hub, which
/// hands jobs out `hub`'s way, and once a gateway set to `gateway` is back each of its hosts is
/// provisioned once.
async fn cut_off_then_back(hub: JobDelivery, gateway: JobDelivery) {
    let server = NatsServer::start();
    let builder = Fleet::builder(&server.url()).sites(2).nodes(2);
    let fleet = match hub {
        JobDelivery::Dispatch => builder.dispatched(),
        JobDelivery::Durable => builder,
    }
    .start()
    .await;
    fleet.stop_gateway(1);
    let (first, second) = (fleet.install(&fleet.site_id(0)).await, fleet.install(&fleet.site_id(1)).await);
    let run = fleet.wait_install(&first).await;
    assert_eq!(run.terminal().delivery.type_name, pb::SiteInstalled::TYPE);
    // The cut-off site's jobs wait at the hub (with the dispatcher, asked about with a growing
    // delay).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(fleet.backend(1).effects().provisions.is_empty());
    let jobs = fleet.bus.jetstream().get_stream(names::site_jobs_stream(&fleet.site_id(1))).await.unwrap();
    assert!(jobs.cached_info().state.messages > 0, "its jobs are still stored");

    // Its gateway is back: every job is carried out, once.
    let back = CancellationToken::new();
    let site_bus = Bus::connect(&server.url(), "gateway-back").await.unwrap().with_job_delivery(gateway);
    let (design, backend) = &fleet.sites[1];
    let gateway = site_gateway::run_gateway(
        design.site.clone(),
        site_bus,
        backend.clone(),
        fleet.cache(1),
        names::ALIVE_EVERY,
        back.clone(),
    );
    let gateway = tokio::spawn(gateway);
    let run = fleet.wait_install(&second).await;
    assert_eq!(run.terminal().delivery.type_name, pb::SiteInstalled::TYPE);
    let effects = backend.effects();
    assert_eq!(effects.provisions.len(), 2, "{effects:?}");
    assert!(effects.provisions.values().all(|&n| n == 1), "{effects:?}");
    back.cancel();
    let _ = gateway.await;
    fleet.stop().await;
}

/// A job's handler that takes `takes` and counts its runs, by job id.
struct Slow {
    takes: Duration,
    runs: AtomicU32,
    started: tokio::sync::Notify,
}

impl runtime::Handler for Slow {
    async fn handle(&self, _: &Delivery) -> Result<(), HandlerError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        self.started.notify_waiters();
        tokio::time::sleep(self.takes).await;
        Ok(())
    }
}

fn slow(takes: Duration) -> Arc<Slow> {
    Arc::new(Slow { takes, runs: AtomicU32::new(0), started: tokio::sync::Notify::new() })
}

async fn bus_with_topology(server: &NatsServer) -> Bus {
    let bus = Bus::connect(&server.url(), "dispatch-test").await.unwrap().with_job_delivery(JobDelivery::Dispatch);
    bus.ensure_topology_within(&Topology::for_server(&bus), Duration::from_secs(30)).await.unwrap();
    bus
}

/// Asks `site` about a job with id `id` as the dispatcher does; the answer's header.
async fn ask(bus: &Bus, site: &str, subject: &str, id: &str) -> Option<String> {
    let mut h = Envelope { id: id.into(), ..Envelope::root() }.headers(pb::PatchNodes::TYPE);
    h.insert(names::headers::JOB_SUBJECT, subject);
    let answer = bus.client().request_with_headers(names::site_deliver(site), h, "job".into()).await.unwrap();
    answer.headers.and_then(|h| h.get(names::headers::JOB_ANSWER).map(|v| v.as_str().to_string()))
}

#[tokio::test]
async fn a_job_asked_about_twice_while_under_way_is_carried_out_once_and_another_sites_is_refused() {
    let server = NatsServer::start();
    let bus = bus_with_topology(&server).await;
    let stop = CancellationToken::new();
    let handler = slow(Duration::from_millis(800));
    tokio::spawn(dispatched::serve_jobs(bus.clone(), "edge-01".into(), handler.clone(), stop.clone()));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let subject = names::job_subject("edge-01", "patch_nodes");
    let (a, b) = tokio::join!(ask(&bus, "edge-01", &subject, "job-1"), ask(&bus, "edge-01", &subject, "job-1"));
    assert_eq!((a.as_deref(), b.as_deref()), (Some("done"), Some("done")));
    assert_eq!(handler.runs.load(Ordering::SeqCst), 1, "asked twice while under way, carried out once");
    // Once done, asked again (its answer was lost): carried out again, as a redelivery is.
    assert_eq!(ask(&bus, "edge-01", &subject, "job-1").await.as_deref(), Some("done"));
    assert_eq!(handler.runs.load(Ordering::SeqCst), 2);
    // A job naming another site is refused and never carried out.
    let other = names::job_subject("edge-02", "patch_nodes");
    assert_eq!(ask(&bus, "edge-01", &other, "job-2").await.as_deref(), Some("refused"));
    assert_eq!(handler.runs.load(Ordering::SeqCst), 2);
    stop.cancel();
}

/// Publishes a job for `site` into its shard, as the orchestrator does.
async fn publish_job(bus: &Bus, site: &str) -> Envelope {
    let env = Envelope::root();
    let job = pb::PatchNodes { site_id: site.into(), rollout_id: "r-1".into(), ..Default::default() };
    bus.publish_job(&job, &env).await.unwrap();
    env
}

async fn stored(bus: &Bus, site: &str) -> u64 {
    let stream = bus.jetstream().get_stream(names::site_jobs_stream(site)).await.unwrap();
    stream.cached_info().state.messages
}

async fn until_stored(bus: &Bus, site: &str, n: u64, within: Duration) {
    let deadline = Instant::now() + within;
    while stored(bus, site).await != n {
        assert!(Instant::now() < deadline, "{site}'s jobs stored never came to {n}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_dispatcher_stopped_while_its_site_works_leaves_the_job_to_the_next_which_settles_it() {
    let server = NatsServer::start();
    let bus = bus_with_topology(&server).await;
    let sites = bus.kv(names::SITES_BUCKET).await.unwrap();
    let handler = slow(Duration::from_secs(3));
    let site_stop = CancellationToken::new();
    tokio::spawn(dispatched::serve_jobs(bus.clone(), "edge-01".into(), handler.clone(), site_stop.clone()));
    // The first dispatcher runs on a runtime of its own, connection and all, to be killed.
    let first = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let url = server.url();
    first.spawn(async move {
        let bus = Bus::connect(&url, "dispatcher-1").await.unwrap().with_job_delivery(JobDelivery::Dispatch);
        let sites = bus.kv(names::SITES_BUCKET).await.unwrap();
        dispatch::run_dispatcher(bus, sites, CancellationToken::new()).await
    });
    let started = handler.started.notified();
    publish_job(&bus, "edge-01").await;
    started.await;
    // The dispatcher dies while the site carries the job out: the job stays at the hub.
    first.shutdown_background();
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(stored(&bus, "edge-01").await, 1, "unanswered, the job is kept");
    // The next dispatcher has it again once its delivery's wait is over, and settles it.
    let second = CancellationToken::new();
    tokio::spawn(dispatch::run_dispatcher(bus.clone(), sites, second.clone()));
    until_stored(&bus, "edge-01", 0, Duration::from_secs(30)).await;
    let runs = handler.runs.load(Ordering::SeqCst);
    assert!((1..=2).contains(&runs), "carried out {runs} times");
    second.cancel();
    site_stop.cancel();
}

#[tokio::test]
async fn a_silent_registered_sites_job_is_kept_and_an_unregistered_sites_is_dropped() {
    let server = NatsServer::start();
    let bus = bus_with_topology(&server).await;
    let sites = bus.kv(names::SITES_BUCKET).await.unwrap();
    let design = pb::SiteDesign::from(&producers::run::demo::demo_site(0, 1));
    let registered = design.site_id.clone();
    sites.put(&keys::site(&registered), &design).await.unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(dispatch::run_dispatcher(bus.clone(), sites, stop.clone()));
    publish_job(&bus, &registered).await;
    publish_job(&bus, "edge-gone").await;
    until_stored(&bus, "edge-gone", 0, Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(stored(&bus, &registered).await, 1, "a registered site's job waits for it");
    // Its gateway comes: the job is handed to it.
    let handler = slow(Duration::ZERO);
    tokio::spawn(dispatched::serve_jobs(bus.clone(), registered.clone(), handler.clone(), stop.clone()));
    until_stored(&bus, &registered, 0, Duration::from_secs(45)).await;
    assert_eq!(handler.runs.load(Ordering::SeqCst), 1);
    stop.cancel();
}

/// A job whose acknowledgement was lost comes again after the hub has sent newer ones (here the
/// first rollout's job, published again past the duplicate window once the second rollout is
/// done): its site answers it without carrying it out again, and its nodes stay at the newer
/// version. Each node is patched once per rollout, never put back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_comes_again_after_a_newer_one_is_not_carried_out_again() {
    let server = NatsServer::start();
    let window = Duration::from_secs(1);
    let fleet = Fleet::builder(&server.url()).sites(1).nodes(2).duplicate_window(window).start().await;
    fleet.install_all().await;
    let site = fleet.site_id(0);
    let mut patch_jobs = fleet.bus.client().subscribe(names::job_subject(&site, pb::PatchNodes::KIND)).await.unwrap();
    for version in ["1.30.0", "1.30.1"] {
        let env = Envelope::root();
        let register = pb::RegisterPackage { package: Some(kubelet(version)), auto_rollout: None };
        fleet.bus.publish_command(&register, &env).await.unwrap();
        assert!(fleet.wait_for(pb::PackageRegistered::filter(), &env.id, Duration::from_secs(20)).await.is_some());
        let cmd = pb::PatchPackage { name: "kubelet".into(), version: version.into(), ..Default::default() };
        let run = fleet.wait_rollout(&fleet.patch(cmd).await.id, Duration::from_secs(60)).await;
        let done = run.of_type::<pb::RolloutCompleted>().pop().unwrap_or_else(|| panic!("{:?}", run.kinds()));
        assert_eq!((done.patched, done.failed), (2, 0), "{version}");
    }
    let first = tokio::time::timeout(Duration::from_secs(5), patch_jobs.next()).await.unwrap().unwrap();
    let twice: BTreeMap<String, u32> = fleet.sites[0].0.nodes.iter().map(|n| (n.name.to_string(), 2)).collect();
    assert_eq!(fleet.backend(0).effects().patches, twice, "each node patched once per rollout");
    until_stored(&fleet.bus, &site, 0, Duration::from_secs(10)).await;

    tokio::time::sleep(window + Duration::from_millis(500)).await;
    let headers = first.headers.clone().expect("a job's headers");
    let again = fleet.bus.jetstream().publish_with_headers(first.subject.clone(), headers, first.payload.clone());
    let stored_again = again.await.unwrap().await.unwrap();
    assert!(!stored_again.duplicate, "stored again, past the duplicate window");
    // Handed out, answered and acknowledged.
    until_stored(&fleet.bus, &site, 0, Duration::from_secs(30)).await;
    assert_eq!(fleet.backend(0).effects().patches, twice, "the first rollout's job was carried out again");
    fleet.stop().await;
}
