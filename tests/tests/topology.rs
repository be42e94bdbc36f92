//! The production topology under faults, from configuration the real `landfall deploy
//! nats-config` generated: each service and each site as its own least-privileged user, a
//! three-server JetStream cluster that loses a server mid-rollout and is then restarted as a
//! whole, and a site behind a leaf node (over TLS) whose link to the hub is cut during an install,
//! then cut again during a rollout while its gateway, a process of its own, is killed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bus_schema::access::{HUB_DOMAIN, Role};
use bus_schema::names;
use bus_schema::pb::{self, BusCommand, BusEvent, BusJob, BusMessage};
use bus_schema::runtime::{Access, Envelope, ReadEvent};
use landfall_tests::fleet::{Fleet, RolloutRun, commands_stored, kubelet};
use landfall_tests::procs::Service;
use landfall_tests::topology::{Deployment, TcpProxy, TlsFiles, connect_when_ready, leaf_links, raw_client, refused};
use prost::Message;

fn sites(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("edge-{i:02}")).collect()
}

fn deployment(n_sites: usize, hubs: usize, tls: Option<&TlsFiles>) -> Deployment {
    let names = sites(n_sites);
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    Deployment::generate(&refs, hubs, tls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_service_and_site_works_as_its_own_user_and_a_site_is_refused_another_sites_work() {
    let d = deployment(2, 1, None);
    let hubs = d.start_hubs();
    let url = d.hub_urls("nats");
    // The whole system under the generated users: if any role lacked a permission it needs, the
    // install would not finish and the hub would log the violation.
    let fleet = Fleet::builder(&url).sites(2).nodes(3).access(d.users(None)).start().await;
    let env = fleet.install("edge-01").await;
    let run = fleet.wait_install(&env).await;
    assert_eq!(run.terminal().delivery.type_name, pb::SiteInstalled::TYPE, "{:?}", run.kinds());
    let log = hubs[0].log();
    assert!(!log.contains("Permissions Violation"), "a service was refused something it needs:\n{log}");

    // Site edge-01's user, straight at the hub.
    let site_a = d.access(&Role::Site("edge-01".into()));
    let (client, errors) = raw_client(&url, &site_a).await;
    let mut tried = 0;

    // Another site's jobs: neither as a plain subscription nor through its durable consumer.
    let _sub = client.subscribe(names::site_jobs("edge-02")).await.unwrap();
    let e = refused(&errors, &names::site_jobs("edge-02")).await;
    assert!(e.contains("Permissions Violation for Subscription"), "{e}");
    tried += 1;
    let js = async_nats::jetstream::with_domain(client.clone(), bus_schema::access::HUB_DOMAIN);
    let stream = js.get_stream_no_info(names::site_jobs_stream("edge-02")).await.expect("no request is made");
    let durable = names::gateway_consumer("edge-02");
    let other = stream.get_consumer::<async_nats::jetstream::consumer::pull::Config>(&durable);
    assert!(tokio::time::timeout(Duration::from_secs(3), other).await.map_or(true, |r| r.is_err()));
    let info = format!("CONSUMER.INFO.{}.{}", names::site_jobs_stream("edge-02"), names::gateway_consumer("edge-02"));
    refused(&errors, &info).await;
    tried += 1;
    // Everyone's replies.
    let _inbox = client.subscribe("_INBOX.>").await.unwrap();
    refused(&errors, "_INBOX.>").await;
    tried += 1;

    // Any command but its own sites' host changes, and another site's events.
    let commands_before = commands_stored(&fleet.bus).await;
    let install = pb::InstallSite { site_id: "edge-01".into(), ..Default::default() };
    let patch = pb::PatchPackage { name: "kubelet".into(), version: "1.30.0".into(), ..Default::default() };
    let foreign = pb::NodeAdded { site_id: "edge-02".into(), ..Default::default() };
    let gateway = names::Origin::Gateway;
    for (subject, body) in [
        (install.subject(), install.encode_to_vec()),
        (patch.subject(), patch.encode_to_vec()),
        (patch.subject_from(gateway), patch.encode_to_vec()),
        (foreign.subject_from(gateway), foreign.encode_to_vec()),
        (names::event_subject_from(gateway, "edge-02", "site", "installed"), Vec::new()),
        (names::event_subject("edge-01", "site", "installed"), Vec::new()),
        (names::event_subject_from(gateway, "fleet", "rollout", "completed"), Vec::new()),
        (pb::ProvisionOs { site_id: "edge-01".into(), ..Default::default() }.subject(), Vec::new()),
    ] {
        client.publish(subject.clone(), body.into()).await.unwrap();
        let e = refused(&errors, &subject).await;
        assert!(e.contains("Permissions Violation for Publish"), "{e}");
        tried += 1;
    }
    client.flush().await.unwrap();
    let commands_after = commands_stored(&fleet.bus).await;
    assert_eq!(commands_after, commands_before, "no refused command reached the stream");
    // What it may do: announce a host at its own site.
    let own = pb::NodeAdded { site_id: "edge-01".into(), ..Default::default() };
    client.publish(own.subject_from(gateway), own.encode_to_vec().into()).await.unwrap();
    client.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let refused_own = errors.lock().unwrap().iter().any(|e| e.contains(&own.subject_from(gateway)));
    assert!(!refused_own, "{:?}", errors.lock().unwrap());
    println!("permissions: {tried} denials tried as site edge-01, {tried} refused");
    fleet.stop().await;
}

/// Sites behind a relay (`deploy nats-config --relay`): one site's gateway, a process of its own,
/// connects to the relay as its site's user, another site's to its own leaf node linked to the
/// relay, and both are installed through it; the hub holds one leaf link, not the sites'
/// connections. At the relay a site is held to its own subjects; the relay's own key, taken to
/// the hub, may do what a site may, and nothing of the hub's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sites_behind_a_relay_are_installed_through_it_and_each_is_held_to_its_own_subjects_there() {
    let d = Deployment::generate_relayed(&["edge-01", "edge-02"], 1);
    let hubs = d.start_hubs();
    let relay = d.start_relay(0);
    let url = d.hub_urls("nats");
    let relay_url = format!("nats://127.0.0.1:{}", relay.port);
    let fleet = Fleet::builder(&url).sites(2).nodes(3).access(d.users(None)).without_gateways().start().await;
    let work = tempfile::tempdir().unwrap();
    let cache = work.path().join("cache");
    let seed = d.seed_file(&Role::Site("edge-01".into()));
    let args = [
        "serve",
        "gateway",
        "--site",
        "edge-01",
        "--backend",
        "sim",
        "--time-scale",
        "300",
        "--cache-dir",
        cache.to_str().unwrap(),
        "--nats-nkey-file",
        seed.to_str().unwrap(),
        "--js-domain",
        HUB_DOMAIN,
    ];
    let gateway = Service::start_with_env("gateway-edge-01", &relay_url, work.path(), &args, &[("RUST_LOG", "info")]);

    // Site edge-02 keeps a leaf node of its own (its outbox and inbox there), linked to the relay.
    let leaf = d.start_leaf("edge-02");
    let leaf_url = format!("nats://127.0.0.1:{}", leaf.port);
    let work_02 = tempfile::tempdir().unwrap();
    let cache_02 = work_02.path().join("cache");
    let seed_02 = d.seed_file(&Role::Site("edge-02".into()));
    let mut args_02 = args;
    (args_02[3], args_02[9], args_02[11]) = ("edge-02", cache_02.to_str().unwrap(), seed_02.to_str().unwrap());
    let gateway_02 =
        Service::start_with_env("gateway-edge-02", &leaf_url, work_02.path(), &args_02, &[("RUST_LOG", "info")]);

    for site in ["edge-01", "edge-02"] {
        let env = fleet.install(site).await;
        let run = fleet.wait_install(&env).await;
        assert_eq!(run.terminal().delivery.type_name, pb::SiteInstalled::TYPE, "{site}: {:?}", run.kinds());
    }
    assert_eq!(leaf_links(d.hubs[0].http).await, 1, "the relay's one link carries both sites");
    let outbox = gateway_02.log_text();
    for (name, log) in
        [("hub", hubs[0].log()), ("relay", relay.log()), ("gateway", gateway.log_text()), ("leaf gateway", outbox)]
    {
        assert!(!log.contains("Permissions Violation"), "the {name} refused something a site needs:\n{log}");
    }
    drop(gateway_02);
    drop(leaf);

    // Site edge-01 at the relay: not edge-02's jobs, not edge-02's host changes.
    let (client, errors) = raw_client(&relay_url, &d.access(&Role::Site("edge-01".into()))).await;
    let _sub = client.subscribe(names::site_jobs("edge-02")).await.unwrap();
    let e = refused(&errors, &names::site_jobs("edge-02")).await;
    assert!(e.contains("Permissions Violation for Subscription"), "{e}");
    let gateway_origin = names::Origin::Gateway;
    let foreign = pb::NodeAdded { site_id: "edge-02".into(), ..Default::default() };
    let commands_before = commands_stored(&fleet.bus).await;
    client.publish(foreign.subject_from(gateway_origin), foreign.encode_to_vec().into()).await.unwrap();
    let e = refused(&errors, &foreign.subject_from(gateway_origin)).await;
    assert!(e.contains("Permissions Violation for Publish"), "{e}");

    // The relay's key straight at the hub: what any site may send, nothing of the hub's. Not a
    // command of the hub's, not an event as the hub, not a stream's removal, not the events of
    // the whole fleet.
    let relay_seed = Access::seed_from_file(&d.nats_dir().join("relays/relay-1.nk")).expect("the relay's seed");
    let as_relay = Access { nkey_seed: Some(relay_seed), ..Access::default() };
    let (stolen, errors) = raw_client(&url, &as_relay).await;
    let install = pb::InstallSite { site_id: "edge-01".into(), ..Default::default() };
    let delete = format!("$JS.API.STREAM.DELETE.{}", names::EVENTS_STREAM);
    for subject in [install.subject(), names::event_subject("edge-01", "site", "installed"), delete] {
        stolen.publish(subject.clone(), Vec::new().into()).await.unwrap();
        let e = refused(&errors, &subject).await;
        assert!(e.contains("Permissions Violation for Publish"), "{e}");
    }
    let _sub = stolen.subscribe(names::EVENTS_ALL).await.unwrap();
    refused(&errors, names::EVENTS_ALL).await;
    client.flush().await.unwrap();
    stolen.flush().await.unwrap();
    assert_eq!(commands_stored(&fleet.bus).await, commands_before, "no refused command reached the stream");
    drop(gateway);
    drop(relay);
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_server_cluster_loses_a_server_mid_rollout_then_restarts_whole_and_each_node_is_patched_once_per_rollout()
 {
    let d = deployment(3, 3, None);
    let mut hubs = d.start_hubs();
    let url = d.hub_urls("nats");
    let operator = d.access(&Role::Operator);
    let _ready = connect_when_ready(&url, "landfall-test-ready", &operator).await;
    let fleet = Fleet::builder(&url).sites(3).nodes(3).access(d.users(None)).start().await;
    let first_site = fleet.sites[0].0.site.to_string();
    let jobs = names::site_jobs_stream(&first_site);
    for name in [names::COMMANDS_STREAM, jobs, names::EVENTS_STREAM] {
        let info = fleet.bus.jetstream().get_stream(name).await.unwrap().info().await.unwrap().clone();
        assert_eq!(info.config.num_replicas, 3, "{name} is replicated on the cluster");
    }
    fleet.install_all().await;
    let before = commands_stored(&fleet.bus).await;

    let cmd = roll_out_kubelet_one_node_at_a_time(&fleet, "1.30.0").await;
    // Mid-rollout: the server that leads the first site's shard of the jobs dies. (A three-server cluster on a
    // loaded two-core machine can take a while to hand out the first jobs: as long as the whole rollout may
    // take, and then the rollout's events so far say where it stands.)
    let deadline = Instant::now() + Duration::from_secs(120);
    while fleet.sites.iter().map(|(_, s)| s.effects().patches.len()).sum::<usize>() < 2 {
        if Instant::now() >= deadline {
            let patches: Vec<_> = fleet.sites.iter().map(|(_, s)| s.effects().patches).collect();
            println!("the rollout did not start: patches per site {patches:?}");
            fleet.wait_rollout_until(&cmd.id, &[], Duration::from_secs(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let info = fleet.bus.jetstream().get_stream(jobs).await.unwrap().info().await.unwrap().clone();
    let leader = info.cluster.and_then(|c| c.leader).expect("the jobs stream has a leader");
    let victim = hubs.iter().position(|h| h.name == leader).expect("the leader is one of the hubs");
    hubs[victim].kill();
    println!("cluster: killed {leader} (the jobs stream's leader) mid-rollout");

    let run = fleet.wait_rollout(&cmd.id, Duration::from_secs(120)).await;
    let done = completed(&run, "");
    assert_eq!((done.planned_nodes, done.patched, done.failed), (9, 9, 0));
    for (design, site) in &fleet.sites {
        let once: BTreeMap<String, u32> = design.nodes.iter().map(|n| (n.name.to_string(), 1)).collect();
        assert_eq!(site.effects().patches, once, "{}: each node patched once", design.site);
    }
    // The two commands published since, each stored once.
    assert_eq!(commands_stored(&fleet.bus).await, before + 2, "the package and the patch, none lost or doubled");

    // Then the whole hub goes down at once and comes back: every service reconnects by itself
    // and the next rollout runs through all of them.
    hubs[victim].restart();
    for hub in hubs.iter_mut() {
        hub.kill();
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    for hub in hubs.iter_mut() {
        hub.restart();
    }
    println!("cluster: all three servers killed and started again");
    let env = Envelope::root();
    let package = kubelet("1.30.1");
    let deadline = Instant::now() + Duration::from_secs(60);
    // The first publish may find the cluster still electing; the same id makes a retry safe.
    while let Err(e) = fleet
        .bus
        .publish_command(&pb::RegisterPackage { package: Some(package.clone()), auto_rollout: None }, &env)
        .await
    {
        assert!(Instant::now() < deadline, "the restarted hub took no command: {e}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(fleet.wait_for(pb::PackageRegistered::filter(), &env.id, Duration::from_secs(60)).await.is_some());
    let env = Envelope::root();
    let patch = pb::PatchPackage { name: "kubelet".into(), version: "1.30.1".into(), ..Default::default() };
    while let Err(e) = fleet.bus.publish_command(&patch, &env).await {
        assert!(Instant::now() < deadline, "the restarted hub took no command: {e}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let run = fleet.wait_rollout(&env.id, Duration::from_secs(120)).await;
    let done = completed(&run, "");
    assert_eq!((done.planned_nodes, done.patched, done.failed), (9, 9, 0));
    for (design, site) in &fleet.sites {
        let twice: BTreeMap<String, u32> = design.nodes.iter().map(|n| (n.name.to_string(), 2)).collect();
        assert_eq!(site.effects().patches, twice, "{}: each node patched once per rollout", design.site);
    }
    assert_eq!(commands_stored(&fleet.bus).await, before + 4, "four commands in all, each stored once");
    fleet.stop().await;
}

/// How many leaf nodes the hub has connected, from its monitoring endpoint.
/// Holds the link cut for `cut_for`, checking all along that the site has no other way to the
/// hub (it must not reconnect around the cut), then heals it and waits until it is back.
/// What the hub says of the leaf site, read while the site's processes are borrowed elsewhere.
struct HubView<'a> {
    fleet: &'a Fleet,
    d: &'a Deployment,
    ca: &'a std::path::Path,
}

impl HubView<'_> {
    /// `landfall status edge-01 -o json`, run by an operator at the hub: the site's entry.
    async fn hub_status(&self) -> serde_json::Value {
        let seed = self.d.seed_file(&Role::Operator);
        let args = [
            "status",
            "edge-01",
            "-o",
            "json",
            "--nats-nkey-file",
            seed.to_str().unwrap(),
            "--nats-ca",
            self.ca.to_str().unwrap(),
        ];
        let out = landfall_tests::cli::landfall(&self.d.hub_urls("tls"), &args).await;
        let stdout = landfall_tests::cli::text(&out.stdout);
        assert!(out.status.success(), "{stdout}{}", landfall_tests::cli::text(&out.stderr));
        let all: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        all[0].clone()
    }

    /// Waits until the hub counts the site's link `state` (`up` or `cut_off`), by `deadline`;
    /// the record.
    async fn until_link(&self, state: pb::LinkState, deadline: Instant) -> pb::SiteLink {
        let observed = self.fleet.bus.kv(names::OBSERVED_BUCKET).await.unwrap();
        loop {
            let link = observed.get::<pb::SiteLink>(&names::keys::link("edge-01")).await.unwrap();
            if let Some((l, _)) = link.as_ref().filter(|(l, _)| l.state == state as i32) {
                return l.clone();
            }
            assert!(Instant::now() < deadline, "the hub did not count the site {state:?}: {link:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Now, as Unix milliseconds.
fn unix_ms_now() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    i64::try_from(since.as_millis()).unwrap()
}

/// How often the leaf site's gateway says it is there, and how long the hub waits without word
/// of it before it counts the site cut off.
const ALIVE_EVERY: Duration = Duration::from_millis(250);
const CUT_OFF_AFTER: Duration = Duration::from_secs(2);

async fn partition(proxy: &TcpProxy, http_port: u16, cut_for: Duration) {
    proxy.cut();
    let healed_at = Instant::now() + cut_for;
    // The hub sees a dropped link at once; give it a moment, then the link must stay down.
    tokio::time::sleep(Duration::from_millis(500)).await;
    while Instant::now() < healed_at {
        assert_eq!(leaf_links(http_port).await, 0, "the site reached the hub while its link was cut");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    proxy.heal();
    let deadline = Instant::now() + Duration::from_secs(30);
    while leaf_links(http_port).await == 0 {
        assert!(Instant::now() < deadline, "the leaf node did not come back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Registers kubelet `version` and rolls it out one site, and one node, at a time; the rollout's
/// command.
async fn roll_out_kubelet_one_node_at_a_time(fleet: &Fleet, version: &str) -> Envelope {
    roll_out_kubelet(fleet, version, pb::RolloutStrategy::default()).await
}

/// Registers kubelet `version` and rolls it out one site at a time, and one node at a time
/// unless `strategy` says how many, with the rest of `strategy`; the rollout's command.
async fn roll_out_kubelet(fleet: &Fleet, version: &str, strategy: pb::RolloutStrategy) -> Envelope {
    roll_out(fleet, kubelet(version), strategy).await
}

/// Registers `package` and rolls it out one site at a time, and one node at a time unless
/// `strategy` says how many, with the rest of `strategy`; the rollout's command.
async fn roll_out(fleet: &Fleet, package: pb::Package, strategy: pb::RolloutStrategy) -> Envelope {
    let (name, version) = (package.name.clone(), package.version.clone());
    let env = Envelope::root();
    let register = pb::RegisterPackage { package: Some(package), auto_rollout: None };
    fleet.bus.publish_command(&register, &env).await.unwrap();
    assert!(fleet.wait_for(pb::PackageRegistered::filter(), &env.id, Duration::from_secs(30)).await.is_some());
    let max_unavailable =
        if strategy.max_unavailable.is_empty() { "1".into() } else { strategy.max_unavailable.clone() };
    let strategy = pb::RolloutStrategy { max_concurrent_sites: 1, max_unavailable, ..strategy };
    fleet.patch(pb::PatchPackage { name, version, strategy: Some(strategy), ..Default::default() }).await
}

/// The rollout's `RolloutCompleted`; panics with its events (and `context`) when it has none.
fn completed(run: &RolloutRun, context: &str) -> pb::RolloutCompleted {
    run.of_type::<pb::RolloutCompleted>()
        .pop()
        .unwrap_or_else(|| panic!("no RolloutCompleted: {:?}\n{context}", run.kinds()))
}

/// What the site kept in its state file has done so far (nothing before the file is written).
fn site_effects(state: &std::path::Path) -> site_gateway::sim::SimEffects {
    site_gateway::sim::saved_effects(state).unwrap_or_default()
}

/// Waits until `done` holds of the site's effects.
async fn until_site(state: &std::path::Path, what: &str, done: impl Fn(&site_gateway::sim::SimEffects) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done(&site_effects(state)) {
        let e = site_effects(state);
        let counts = (e.provisions.len(), e.binary_installs.len(), e.patches.len());
        assert!(Instant::now() < deadline, "{what}: (hosts provisioned, binaries installed, nodes patched) {counts:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Each event of `events` in the stream once.
fn each_once(events: &[ReadEvent]) {
    let mut seen = BTreeMap::new();
    for e in events {
        *seen.entry(e.delivery.envelope.id.clone()).or_insert(0) += 1;
    }
    assert!(seen.values().all(|n| *n == 1), "an event arrived twice: {seen:?}");
}

/// One site behind a leaf node over TLS, as deployed: the hub's services under their users,
/// the site's gateway a process of its own on the leaf node as the site's user (reaching the
/// hub's JetStream through its domain), and a proxy standing in for the network between the
/// leaf node and the hub, to cut.
struct LeafSite {
    d: Deployment,
    proxy: TcpProxy,
    hubs: Vec<landfall_tests::topology::ConfServer>,
    fleet: Fleet,
    leaf: landfall_tests::topology::ConfServer,
    gateway: Service,
    /// The simulated site's state file: what it has done, across gateway restarts.
    state: std::path::PathBuf,
    /// The CA that signed the hub's certificate.
    ca: std::path::PathBuf,
    _dirs: (tempfile::TempDir, tempfile::TempDir),
}

impl LeafSite {
    async fn start(nodes: usize) -> LeafSite {
        LeafSite::start_with(nodes, 300.0, None).await
    }

    /// A leaf site of `nodes` nodes whose simulated site runs `time_scale` times faster than a
    /// real one, with the hub's duplicate window `window` when given.
    async fn start_with(nodes: usize, time_scale: f64, window: Option<Duration>) -> LeafSite {
        let tls_dir = tempfile::tempdir().unwrap();
        let tls = TlsFiles::make(tls_dir.path());
        let via = landfall_tests::nats::free_port();
        let d = Deployment::generate_with(&["edge-01"], 1, Some(&tls), &[via]);
        let proxy = TcpProxy::start(via, d.hubs[0].leaf).await;
        let hubs = d.start_hubs();
        let url = d.hub_urls("tls");
        let ca = tls.ca.clone();
        let with_ca = move |mut a: Access| {
            a.ca_file = Some(ca.clone());
            a
        };
        let roles = d.users(None);
        let mut fleet = Fleet::builder(&url)
            .sites(1)
            .nodes(nodes)
            .access(Arc::new(move |role: &Role| with_ca(roles(role))))
            .without_gateways()
            .link_timing(ALIVE_EVERY, CUT_OFF_AFTER);
        if let Some(window) = window {
            fleet = fleet.duplicate_window(window);
        }
        let fleet = fleet.start().await;
        let time_scale = time_scale.to_string();
        let leaf = d.start_leaf("edge-01");
        let work = tempfile::tempdir().unwrap();
        let state = work.path().join("edge-01.json");
        let cache = work.path().join("cache");
        let seed = d.seed_file(&Role::Site("edge-01".into()));
        let args = [
            "serve",
            "gateway",
            "--site",
            "edge-01",
            "--backend",
            "sim",
            "--time-scale",
            &time_scale,
            "--cache-dir",
            cache.to_str().unwrap(),
            "--sim-state",
            state.to_str().unwrap(),
            "--nats-nkey-file",
            seed.to_str().unwrap(),
            "--js-domain",
            HUB_DOMAIN,
            "--alive-every",
            "250ms",
        ];
        let site_url = format!("nats://127.0.0.1:{}", leaf.port);
        // `LANDFALL_TEST_GATEWAY_LOG` sets the gateway's RUST_LOG, to look into a run.
        let log = std::env::var("LANDFALL_TEST_GATEWAY_LOG").unwrap_or_else(|_| "info".into());
        let gateway = Service::start_with_env("gateway-edge-01", &site_url, work.path(), &args, &[("RUST_LOG", &log)]);
        let ca = tls.ca.clone();
        LeafSite { d, proxy, hubs, fleet, leaf, gateway, state, ca, _dirs: (tls_dir, work) }
    }

    /// What the hub says of the site.
    fn view(&self) -> HubView<'_> {
        HubView { fleet: &self.fleet, d: &self.d, ca: &self.ca }
    }

    /// Cuts the link for `cut_for` (see [`partition`]).
    async fn partition(&self, cut_for: Duration) {
        partition(&self.proxy, self.d.hubs[0].http, cut_for).await;
    }

    /// Checks that nothing the site needs was refused, and stops everything.
    async fn stop(self) {
        let log = self.hubs[0].log();
        assert!(!log.contains("Permissions Violation"), "the site was refused something it needs:\n{log}");
        assert!(!self.gateway.log_text().contains("Permissions Violation"), "{}", self.gateway.log_tail(30));
        drop(self.gateway);
        drop(self.leaf);
        self.fleet.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_behind_a_leaf_node_cut_off_mid_install_and_mid_rollout_with_its_gateway_killed_loses_and_repeats_nothing()
 {
    let mut site = LeafSite::start(4).await;
    let state = site.state.clone();
    let design = site.fleet.sites[0].0.clone();

    // 1. The link is cut while the site provisions its hosts; the gateway stays up and keeps
    // what it has to say at the site until the link is back.
    let env = site.fleet.install("edge-01").await;
    until_site(&state, "the install did not reach the site", |e| e.provisions.len() >= 2).await;
    let cut_at = Instant::now();
    println!("leaf: link cut with {} host(s) provisioning", site_effects(&state).provisions.len());
    site.partition(Duration::from_secs(5)).await;
    let during = site_effects(&state).provisions.len();
    println!("leaf: link back after {:?}; the site had {during} host(s) provisioned meanwhile", cut_at.elapsed());

    let run = site.fleet.wait_install(&env).await;
    assert_eq!(
        run.terminal().delivery.type_name,
        pb::SiteInstalled::TYPE,
        "{:?}\n{}",
        run.kinds(),
        site.gateway.log_tail(30)
    );
    let installed = run.of_type::<pb::SiteInstalled>().pop().unwrap();
    assert_eq!(installed.outcome, pb::InstallOutcome::Success as i32);
    let once: BTreeMap<String, u32> = design.nodes.iter().map(|n| (n.name.to_string(), 1)).collect();
    assert_eq!(site_effects(&state).provisions, once, "each host provisioned once");
    each_once(&run.events);
    assert_eq!(run.of_type::<pb::NodeOsProvisioned>().len(), 4, "every host's NodeOsProvisioned arrived");

    // 2. The link is cut again mid-rollout, and the gateway is killed while it is cut and
    // started again: the hub redelivers its jobs once the link is back, and no node is patched
    // twice.
    let cmd = roll_out_kubelet_one_node_at_a_time(&site.fleet, "1.30.0").await;
    until_site(&state, "the rollout did not reach the site", |e| !e.patches.is_empty()).await;
    println!("leaf: link cut again with {} node(s) patched", site_effects(&state).patches.len());
    // The gateway dies while it cannot reach the hub, and starts again while it still cannot.
    let LeafSite { gateway, proxy, d, .. } = &mut site;
    let kill = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        gateway.restart();
        println!("leaf: gateway killed (kill -9) and started again while the link is cut");
    };
    tokio::join!(partition(proxy, d.hubs[0].http, Duration::from_secs(5)), kill);
    println!("leaf: link back; {} node(s) patched by then", site_effects(&state).patches.len());

    let run = site.fleet.wait_rollout(&cmd.id, Duration::from_secs(120)).await;
    let done = completed(&run, &site.gateway.log_tail(30));
    assert_eq!((done.planned_nodes, done.patched, done.failed), (4, 4, 0));
    assert_eq!(site_effects(&state).patches, once, "each node patched once");
    assert_eq!(site_effects(&state).provisions, once, "no host provisioned again");
    each_once(&run.events);
    assert_eq!(site.gateway.starts(), 2);
    assert!(site.gateway.is_running(), "the gateway exited:\n{}", site.gateway.log_tail(30));
    site.stop().await;
}

/// The ids of the reports of type `type_name` kept in the site's outbox, read through a
/// connection to its leaf node, in the order they were stored.
async fn outbox_ids(at_site: &bus_schema::runtime::Bus, type_name: &str) -> Vec<String> {
    try_outbox_ids(at_site, type_name).await.expect("the site's outbox")
}

async fn try_outbox_ids(at_site: &bus_schema::runtime::Bus, type_name: &str) -> Result<Vec<String>, String> {
    let mut outbox = at_site.local_jetstream().get_stream(names::OUTBOX_STREAM).await.map_err(|e| e.to_string())?;
    let last = outbox.info().await.map_err(|e| e.to_string())?.state.last_sequence;
    let mut ids = Vec::new();
    for seq in 1..=last {
        let m = outbox.direct_get(seq).await.map_err(|e| e.to_string())?;
        if m.headers.get(names::headers::TYPE).is_some_and(|t| t.as_str() == type_name) {
            ids.push(m.headers.get(names::headers::MSG_ID).map(|v| v.to_string()).unwrap_or_default());
        }
    }
    Ok(ids)
}

/// The reports of nodes the site's outbox keeps, in the order they were stored: each message
/// that carries any (a `NodePatched`, or a `SitePatched` with node reports inside) as its id and
/// the nodes it reports.
async fn outbox_node_reports(at_site: &bus_schema::runtime::Bus) -> Result<Vec<(String, Vec<String>)>, String> {
    use prost::Message as _;
    let mut outbox = at_site.local_jetstream().get_stream(names::OUTBOX_STREAM).await.map_err(|e| e.to_string())?;
    let last = outbox.info().await.map_err(|e| e.to_string())?.state.last_sequence;
    let mut out = Vec::new();
    for seq in 1..=last {
        let m = outbox.direct_get(seq).await.map_err(|e| e.to_string())?;
        let id = m.headers.get(names::headers::MSG_ID).map(|v| v.to_string()).unwrap_or_default();
        let nodes = match m.headers.get(names::headers::TYPE).map(|t| t.as_str().to_string()) {
            Some(t) if t == pb::NodePatched::TYPE => vec![pb::NodePatched::decode(m.payload).unwrap().node],
            Some(t) if t == pb::SitePatched::TYPE => {
                pb::SitePatched::decode(m.payload).unwrap().nodes.into_iter().map(|n| n.node).collect()
            }
            _ => continue,
        };
        if !nodes.is_empty() {
            out.push((id, nodes));
        }
    }
    Ok(out)
}

/// How many nodes the reports [`outbox_node_reports`] read report.
fn nodes_reported(reports: &[(String, Vec<String>)]) -> usize {
    reports.iter().map(|(_, nodes)| nodes.len()).sum()
}

/// The site keeps working through a cut, and keeps its own record of it: a rollout's job that
/// reached the site runs to its end while the link is down (every node patched), the gateway is
/// killed after it, and when the link is back the hub gets each node's report once, in the order
/// the nodes were patched, as it was made at the time (the version each node had before), not
/// as a job done again after the cut would tell it; the leaf node's server restarts during the
/// cut too. Then a host arrives during another cut and the gateway dies again: the host is
/// announced when the link is back, and joins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_cut_off_mid_rollout_patches_on_and_its_reports_reach_the_hub_once_in_order_after_its_gateway_dies() {
    let mut site = LeafSite::start(4).await;
    let state = site.state.clone();
    let install = site.fleet.install("edge-01").await;
    site.fleet.wait_install(&install).await;
    // What each node ran before the rollout, as the hub observed it.
    let observed = site.fleet.bus.kv(names::OBSERVED_BUCKET).await.unwrap();
    let mut before = BTreeMap::new();
    for n in &site.fleet.sites[0].0.nodes {
        let key = bus_schema::names::keys::observed("edge-01", n.name.as_str(), "kubelet");
        let deadline = Instant::now() + Duration::from_secs(30);
        let version = loop {
            if let Some((v, _)) = observed.get::<pb::ObservedVersion>(&key).await.unwrap() {
                break v.version;
            }
            assert!(Instant::now() < deadline, "{}'s kubelet not observed", n.name);
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        before.insert(n.name.to_string(), version);
    }

    let cmd = roll_out_kubelet_one_node_at_a_time(&site.fleet, "1.30.0").await;
    until_site(&state, "the rollout did not reach the site", |e| !e.patches.is_empty()).await;
    let cut_for = Duration::from_secs(15);
    let heals_at = Instant::now() + cut_for;
    let patched_before_cut: Vec<String> = site_effects(&state).patches.into_keys().collect();
    let leaf_url = format!("nats://127.0.0.1:{}", site.leaf.port);
    let seed = site.d.seed_file(&Role::Site("edge-01".into()));
    let at_site = connect_when_ready(&leaf_url, "at-site", &site.d.access(&Role::Site("edge-01".into()))).await;
    // Borrowed apart: the proxy and the processes, and the rest of the site to read the hub with.
    let LeafSite { gateway, proxy, d, leaf, fleet, ca, .. } = &mut site;
    let d: &Deployment = d;
    let site_view = HubView { fleet, d, ca };
    let work_on = async {
        until_site(&state, "the site did not patch its nodes while cut off", |e| e.patches.len() == 4).await;
        // The gateway dies once the site has recorded every node's report (on its own, or in
        // the site's report).
        while nodes_reported(&outbox_node_reports(&at_site).await.expect("the site's outbox")) < 4 {
            assert!(Instant::now() < heals_at, "the site did not record every node's report during the cut");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(Instant::now() < heals_at, "every node was patched only after the link was back");
        println!("leaf: every node patched while the link is cut");
        gateway.restart();
        println!("leaf: gateway killed (kill -9) and started again while the link is cut");
        // What the site knows, asked at the site while the hub is out of reach.
        let args = ["status", "edge-01", "--local", "-o", "json", "--nats-nkey-file", seed.to_str().unwrap()];
        let out = landfall_tests::cli::landfall(&leaf_url, &args).await;
        let stdout = landfall_tests::cli::text(&out.stdout);
        assert!(out.status.success(), "{stdout}{}", landfall_tests::cli::text(&out.stderr));
        assert!(Instant::now() < heals_at, "the local status was read only after the link was back");
        let local: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        for node in before.keys() {
            let last = &local["nodes"][node.as_str()];
            assert_eq!(last["type"], pb::NodePatched::TYPE, "{node}: {last:#}");
            if !patched_before_cut.contains(node) {
                assert_eq!(last["at_hub"], false, "{node}, patched during the cut: {last:#}");
            }
        }
        // A report a message: those of the nodes patched during the cut are waiting, each on
        // its own or several in their site's report.
        let during: std::collections::BTreeSet<&str> = before
            .keys()
            .filter(|n| !patched_before_cut.contains(n))
            .filter_map(|n| local["nodes"][n.as_str()]["id"].as_str())
            .collect();
        assert!(local["waiting"].as_u64() >= Some(during.len() as u64), "{local:#}");
        println!("leaf: `status --local` at the site shows {} reports waiting for the hub", local["waiting"]);
        // The leaf node's own server dies and starts again, still cut off: what the site kept is
        // on its disk.
        leaf.restart();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let kept = tokio::time::timeout(Duration::from_secs(2), outbox_node_reports(&at_site)).await;
            if kept.as_ref().is_ok_and(|k| k.as_ref().is_ok_and(|k| nodes_reported(k) == 4)) {
                break;
            }
            assert!(Instant::now() < deadline, "the site's reports after its leaf node restarted: {kept:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(Instant::now() < heals_at, "the leaf node came back only after the link");
        println!("leaf: the leaf node's server restarted while the link is cut; the site's reports are still there");
    };
    let cut_at = unix_ms_now();
    let ((), (), cut_off) = tokio::join!(partition(proxy, d.hubs[0].http, cut_for), work_on, async {
        // The hub's view while the link is down: the site is cut off since it was last heard,
        // with what it said last, not failed.
        let link = site_view.until_link(pb::LinkState::CutOff, heals_at).await;
        let status = site_view.hub_status().await;
        assert!(Instant::now() < heals_at, "the hub counted the site cut off only after the link was back");
        (link, status)
    });
    let (link, status) = cut_off;
    assert!(
        (cut_at - 2_000..=cut_at + 1_000).contains(&link.since_unix_ms),
        "cut off since {} for a link cut at {cut_at}",
        link.since_unix_ms
    );
    assert_eq!(status["link"]["state"], "cut_off", "{status:#}");
    assert_ne!(status["install"]["phase"], "INSTALL_PHASE_FAILED", "{status:#}");
    println!("leaf: the hub counts the site cut off since it was last heard: {}", status["link"]);
    let back = site.view().until_link(pb::LinkState::Up, Instant::now() + Duration::from_secs(10)).await;
    assert_eq!(back.cut_off_since_unix_ms, link.since_unix_ms);

    let run = site.fleet.wait_rollout(&cmd.id, Duration::from_secs(120)).await;
    let done = completed(&run, &site.gateway.log_tail(30));
    assert_eq!((done.planned_nodes, done.patched, done.failed), (4, 4, 0));
    each_once(&run.events);
    // The site's own record, on its leaf node, and the hub's: the same reports in the same order.
    let at_hub: Vec<(String, Vec<String>)> = run
        .events
        .iter()
        .filter_map(|e| {
            let d = &e.delivery;
            let nodes = match d.type_name.as_str() {
                t if t == pb::NodePatched::TYPE => vec![d.decode::<pb::NodePatched>().unwrap().node],
                t if t == pb::SitePatched::TYPE => {
                    d.decode::<pb::SitePatched>().unwrap().nodes.into_iter().map(|n| n.node).collect()
                }
                _ => return None,
            };
            (!nodes.is_empty()).then(|| (d.envelope.id.clone(), nodes))
        })
        .collect();
    let kept = outbox_node_reports(&at_site).await.expect("the site's outbox");
    assert_eq!(nodes_reported(&at_hub), 4, "{:?}", run.kinds());
    assert_eq!(at_hub, kept, "the hub got the site's reports in the order the site made them");
    for r in &run.node_reports() {
        assert_eq!(r.from_version, before[&r.node], "{}: the report made at the time, not a redone job's", r.node);
    }

    // A host appears at the site while it is cut off (asked at the leaf node, where the hub
    // cannot be reached): the site records it, the gateway dies, and the host is announced and
    // joins once the link is back.
    let node = pb::NodeSpec {
        name: "node-9".into(),
        role: pb::Role::Worker as i32,
        boot_mac: "52:54:00:aa:00:09".into(),
        bmc_address: "ipmi://10.1.0.9".into(),
        ..Default::default()
    };
    let LeafSite { gateway, proxy, d, .. } = &mut site;
    let arrive = async {
        let request = pb::SimulateHostArrival { site_id: "edge-01".into(), node: Some(node) };
        let reply = at_site
            .client()
            .request(names::sim_host_arrival_rpc("edge-01"), request.encode_to_vec().into())
            .await
            .expect("the gateway answers at its site");
        assert!(reply.headers.as_ref().and_then(|h| h.get(names::headers::REPLY_ERROR)).is_none());
        let deadline = Instant::now() + Duration::from_secs(10);
        let added = loop {
            if let [id] = &outbox_ids(&at_site, pb::NodeAdded::TYPE).await[..] {
                break id.clone();
            }
            assert!(Instant::now() < deadline, "the host's arrival was not kept at the site");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        gateway.restart();
        println!("leaf: a host arrived while the link is cut; gateway killed and started again");
        added
    };
    let ((), added) = tokio::join!(partition(proxy, d.hubs[0].http, Duration::from_secs(8)), arrive);
    let ready = site.fleet.wait_for(pb::NodeReady::filter(), &added, Duration::from_secs(60)).await;
    let ready = ready.unwrap_or_else(|| panic!("node-9 did not join:\n{}", site.gateway.log_tail(30)));
    assert_eq!(ready.delivery.decode::<pb::NodeReady>().unwrap().node, "node-9");
    assert_eq!(site_effects(&state).provisions.get("node-9"), Some(&1), "node-9 provisioned once");
    site.stop().await;
}

/// A rollout's wave runs out of time while its one site is cut off: the hub counts the site cut
/// off (not failed) and the strategy decides (here: go on, its nodes counted failed, the record
/// saying the site is cut off). The site patches on, and its report, arriving after the link is
/// back, lands in the site's record; the counts stay as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_cut_off_past_its_waves_timeout_counts_as_the_strategy_says_and_its_late_report_is_recorded() {
    let site = LeafSite::start(2).await;
    let install = site.fleet.install("edge-01").await;
    site.fleet.wait_install(&install).await;
    site.view().until_link(pb::LinkState::Up, Instant::now() + Duration::from_secs(10)).await;

    let strategy = pb::RolloutStrategy {
        wave_timeout_seconds: 6,
        on_wave_timeout: pb::WaveTimeoutAction::Continue as i32,
        failure_threshold: "100%".into(),
        ..Default::default()
    };
    let cmd = roll_out_kubelet(&site.fleet, "1.30.0", strategy).await;
    until_site(&site.state, "the rollout did not reach the site", |e| !e.patches.is_empty()).await;
    let cut_for = Duration::from_secs(12);
    let heals_at = Instant::now() + cut_for;
    let hub = site.view();
    let (run, ()) = tokio::join!(
        async {
            let run = site.fleet.wait_rollout(&cmd.id, Duration::from_secs(60)).await;
            assert!(Instant::now() < heals_at, "the wave timed out only after the link was back");
            run
        },
        site.partition(cut_for)
    );
    let done = completed(&run, &site.gateway.log_tail(30));
    assert_eq!((done.planned_nodes, done.patched, done.failed), (2, 0, 2), "counted failed at the time-out");
    let sagas = site.fleet.bus.kv(names::SAGAS_BUCKET).await.unwrap();
    let key = names::keys::rollout_site(&cmd.id, "edge-01");
    let (timed_out, _) = sagas.get::<pb::RolloutSite>(&key).await.unwrap().expect("the site's record");
    assert_eq!(timed_out.state, pb::RolloutSiteState::TimedOut as i32, "{timed_out:?}");
    let reason = &timed_out.failed[0].reason;
    assert!(reason.contains("the site is cut off (nothing heard since"), "{reason}");
    println!("leaf: the wave timed out with the site cut off: {reason}");

    // The link is back: the site's report arrives and lands in its record.
    let deadline = Instant::now() + Duration::from_secs(30);
    let late = loop {
        let (record, _) = sagas.get::<pb::RolloutSite>(&key).await.unwrap().unwrap();
        if record.reported_late {
            break record;
        }
        assert!(Instant::now() < deadline, "the site's late report was not recorded: {record:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(late.patched.len(), 2, "{late:?}");
    assert!(late.failed.is_empty(), "{late:?}");
    assert_eq!(&late.timed_out_reason, reason);
    let (rollout, _) = sagas.get::<pb::Rollout>(&names::keys::rollout(&cmd.id)).await.unwrap().unwrap();
    assert_eq!((rollout.patched, rollout.failed), (0, 2), "the counts stay as they were");
    let sites = site.fleet.bus.kv(names::SITES_BUCKET).await.unwrap();
    let (design, _) = sites.get::<pb::SiteDesign>(&names::keys::site("edge-01")).await.unwrap().unwrap();
    let kubelet: Vec<&str> = design
        .packages
        .iter()
        .flat_map(|r| &r.packages)
        .filter(|p| p.name == "kubelet")
        .map(|p| p.version.as_str())
        .collect();
    assert!(
        !kubelet.is_empty() && kubelet.iter().all(|v| *v == "1.30.0"),
        "the site's design follows its nodes: {kubelet:?}"
    );
    hub.until_link(pb::LinkState::Up, Instant::now() + Duration::from_secs(10)).await;
    site.stop().await;
}

/// A day cut off, time-scaled: the cut lasts 45 s for 24 hours (1,920 times faster), and every
/// hub timer a day outlasts is shorter than the cut alike (the hub's duplicate window of 15
/// minutes is 1 s here: what arrives after the cut is long past it). The site's hosts run 60
/// times faster than real ones. A site of 800 nodes is cut off first once its install's jobs
/// (staging, and a provisioning job per host) are kept at the site, then once the job of a
/// rollout of a new os-image is (every node reimaged, each Metal3 state it passes reported).
/// During each cut the gateway is killed twice and the leaf node's nats-server restarted once;
/// the site goes on with the jobs it keeps (a reimage the killed gateway left half done is taken
/// up, not failed) and makes over 5,000 reports during the cuts (some 6,000), all stored at the
/// site before the link is back. After each cut: the hub holds every report the site made once,
/// in the order the site made them (the site's own record and the hub's, side by side); each
/// host was provisioned and each node patched once; the install's and the rollout's records
/// are whole.
///
/// At full size: `LANDFALL_DAY_NODES=1000 LANDFALL_DAY_CUT_SECS=120
/// LANDFALL_DAY_MAX_UNAVAILABLE=10%` (the day 720 times faster); `LANDFALL_DAY_LOG=1` prints
/// the site's progress, and `LANDFALL_TEST_GATEWAY_LOG` sets the gateway's `RUST_LOG`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_cut_off_for_a_day_during_its_install_and_a_rollout_loses_nothing_and_repeats_nothing() {
    let setting = |name: &str, default: f64| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let nodes = setting("LANDFALL_DAY_NODES", 800.0) as usize;
    let day = Duration::from_secs_f64(setting("LANDFALL_DAY_CUT_SECS", 45.0));
    let site_scale = setting("LANDFALL_DAY_SITE_SCALE", 60.0);
    let min_reports = setting("LANDFALL_DAY_MIN_REPORTS", 5_000.0) as u64;
    let max_unavailable = std::env::var("LANDFALL_DAY_MAX_UNAVAILABLE").unwrap_or_else(|_| "50%".into());
    println!("leaf: {nodes} nodes, a day cut off in {day:?} ({:.0} times faster)", 86_400.0 / day.as_secs_f64());
    let mut site = LeafSite::start_with(nodes, site_scale, Some(Duration::from_secs(1))).await;
    let state = site.state.clone();
    let leaf_url = format!("nats://127.0.0.1:{}", site.leaf.port);
    let at_site = connect_when_ready(&leaf_url, "at-site", &site.d.access(&Role::Site("edge-01".into()))).await;
    let mut made = 0;

    // 1. The install: cut once its provisioning job is at the site.
    let install = site.fleet.install("edge-01").await;
    // Every host's provisioning job is kept at the site (one staging job and one per host).
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let kept = inbox_jobs(&at_site).await;
        if kept > nodes as u64 {
            break;
        }
        assert!(Instant::now() < deadline, "{kept} of the install's {} jobs reached the site", 1 + nodes);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    made += site.cut_for_a_day(day, &at_site).await;
    let run = site.fleet.wait_install(&install).await;
    assert!(run.of_type::<pb::SiteInstalled>().len() == 1, "{:?}\n{}", run.kinds(), site.gateway.log_tail(30));
    each_once(&run.events);
    let effects = site_effects(&state);
    assert_eq!(effects.provisions.len(), nodes);
    assert!(effects.provisions.values().all(|n| *n == 1), "a host provisioned twice: {:?}", effects.provisions);
    let sagas = site.fleet.bus.kv(names::SAGAS_BUCKET).await.unwrap();
    let (saga, _) = sagas.get::<pb::InstallSaga>(&names::keys::saga(&install.id)).await.unwrap().unwrap();
    let ready = saga.nodes.iter().filter(|n| n.step == pb::NodeStep::BinariesInstalled as i32).count();
    assert_eq!((saga.phase, ready), (pb::InstallPhase::Succeeded as i32, nodes), "the install's record is whole");

    // 2. A rollout of every node (once the hub has seen what each runs): cut once its job is at
    // the site.
    let observed = site.fleet.bus.kv(names::OBSERVED_BUCKET).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let seen = bus_schema::runtime::observed_nodes(&observed, &names::keys::observed_site_prefix("edge-01"))
            .await
            .unwrap();
        let with_image = seen.iter().filter(|n| n.packages.iter().any(|p| p.name == "ubuntu")).count();
        if with_image == nodes {
            break;
        }
        assert!(Instant::now() < deadline, "the hub observed the os-image of {with_image} of {nodes} nodes");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // A new os-image: every node reimaged (deprovisioned, provisioned again, its binaries
    // installed again), each state it passes reported.
    let image = producers::up::demo_packages().into_iter().find(|p| p.kind == pb::PackageKind::OsImage as i32).unwrap();
    let newer = pb::Package { version: "22.04.9".into(), sha256: "9".repeat(64), object_key: String::new(), ..image };
    let strategy = pb::RolloutStrategy { max_unavailable, ..Default::default() };
    let jobs_before = inbox_jobs(&at_site).await;
    let cmd = roll_out(&site.fleet, newer, strategy).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while inbox_jobs(&at_site).await == jobs_before {
        assert!(Instant::now() < deadline, "the rollout's job did not reach the site");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Masters are reimaged first and one at a time; the cut comes once they are done, while
    // the workers' batches run.
    let masters: Vec<String> = site.fleet.sites[0]
        .0
        .nodes
        .iter()
        .filter(|n| n.role == bus_schema::domain::Role::Master)
        .map(|n| n.name.to_string())
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !masters.iter().all(|m| site_effects(&state).patches.contains_key(m)) {
        assert!(Instant::now() < deadline, "the masters {masters:?} were not reimaged");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    made += site.cut_for_a_day(day, &at_site).await;
    let waited = site.fleet.wait_rollout(&cmd.id, Duration::from_secs(300));
    let run = match futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(waited)).await {
        Ok(run) => run,
        Err(panic) => {
            println!("{}", site.gateway.log_tail(200));
            std::panic::resume_unwind(panic);
        }
    };
    let done = completed(&run, &site.gateway.log_tail(200));
    assert_eq!((done.planned_nodes, done.patched, done.failed), (nodes as u32, nodes as u32, 0));
    each_once(&run.events);
    let effects = site_effects(&state);
    assert_eq!(effects.patches.len(), nodes);
    assert!(effects.patches.values().all(|n| *n == 1), "a node patched twice: {:?}", effects.patches);
    let (record, _) =
        sagas.get::<pb::RolloutSite>(&names::keys::rollout_site(&cmd.id, "edge-01")).await.unwrap().unwrap();
    assert_eq!((record.state, record.patched.len()), (pb::RolloutSiteState::Done as i32, nodes));

    // 3. Everything the site reported, at the hub once and in the site's order.
    let kept = outbox_event_ids(&at_site).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let at_hub = hub_site_event_ids(&site.fleet.bus, "edge-01").await;
        if at_hub.len() >= kept.len() || Instant::now() > deadline {
            assert_eq!(at_hub.len(), kept.len(), "the hub holds {} of the site's {} reports", at_hub.len(), kept.len());
            let first_apart = at_hub.iter().zip(&kept).position(|(a, b)| a != b);
            assert_eq!(first_apart, None, "the hub's order differs from the site's");
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    println!("leaf: the hub holds the site's {} reports once each, in the site's order", kept.len());
    println!("leaf: {made} reports made during the two cuts");
    assert!(made >= min_reports, "only {made} reports made during the cuts");
    site.stop().await;
}

impl LeafSite {
    /// Cuts the link for `day`; meanwhile the gateway is killed (and started again) twice and
    /// the leaf node's server restarted once, each while the link is down. The reports the site
    /// made during the cut (counted in its outbox).
    async fn cut_for_a_day(&mut self, day: Duration, at_site: &bus_schema::runtime::Bus) -> u64 {
        let before = outbox_last(at_site).await;
        let heals_at = Instant::now() + day;
        let LeafSite { gateway, proxy, d, leaf, .. } = self;
        let blows = async {
            tokio::time::sleep(day / 5).await;
            gateway.restart();
            println!("leaf: gateway killed and started again ({:?} into the cut)", day / 5);
            tokio::time::sleep(day / 5).await;
            leaf.restart();
            println!("leaf: the leaf node's server restarted ({:?} into the cut)", 2 * day / 5);
            tokio::time::sleep(day / 5).await;
            gateway.restart();
            println!("leaf: gateway killed and started again ({:?} into the cut)", 3 * day / 5);
            assert!(Instant::now() < heals_at, "the restarts came after the cut");
        };
        let sample = async {
            if std::env::var("LANDFALL_DAY_LOG").is_err() {
                return;
            }
            while Instant::now() < heals_at {
                tokio::time::sleep(Duration::from_secs(3)).await;
                println!("leaf: {} reports stored during the cut so far", outbox_last(at_site).await - before);
            }
        };
        tokio::join!(partition(proxy, d.hubs[0].http, day), blows, sample);
        // The reports made while the link was down: all stored before it was back.
        let during = outbox_last(at_site).await - before;
        println!("leaf: the link is back after {day:?}; the site made {during} reports meanwhile");
        if std::env::var("LANDFALL_DAY_LOG").is_ok() {
            println!("{}", gateway.log_tail(80));
        }
        during
    }
}

/// How many jobs the site's inbox holds.
async fn inbox_jobs(at_site: &bus_schema::runtime::Bus) -> u64 {
    match at_site.local_jetstream().get_stream(names::INBOX_STREAM).await {
        Ok(mut inbox) => inbox.info().await.map(|i| i.state.messages).unwrap_or(0),
        Err(_) => 0,
    }
}

/// The last sequence of the site's outbox (the leaf node may be starting again).
async fn outbox_last(at_site: &bus_schema::runtime::Bus) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let last = async {
            let mut outbox = at_site.local_jetstream().get_stream(names::OUTBOX_STREAM).await.ok()?;
            outbox.info().await.ok().map(|i| i.state.last_sequence)
        };
        if let Ok(Some(last)) = tokio::time::timeout(Duration::from_secs(2), last).await {
            return last;
        }
        assert!(Instant::now() < deadline, "the site's outbox cannot be read");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The ids of the events the site's outbox holds, in the order it stored them.
async fn outbox_event_ids(at_site: &bus_schema::runtime::Bus) -> Vec<String> {
    let last = outbox_last(at_site).await;
    let outbox = at_site.local_jetstream().get_stream(names::OUTBOX_STREAM).await.unwrap();
    let mut ids = Vec::new();
    for seq in 1..=last {
        let m = outbox.direct_get(seq).await.unwrap();
        if names::outbox_destination(m.subject.as_str()).is_some_and(|s| s.starts_with("landfall.evt.")) {
            ids.push(m.headers.get(names::headers::MSG_ID).map(|v| v.to_string()).unwrap_or_default());
        }
    }
    ids
}

/// The ids of the events of kinds only a site sends that the hub holds of `site`, in stream order.
async fn hub_site_event_ids(hub: &bus_schema::runtime::Bus, site: &str) -> Vec<String> {
    use async_nats::jetstream::consumer::DeliverPolicy;
    let mut reader = hub.read_events(vec![names::scope_events(site)], DeliverPolicy::All).await.unwrap();
    let mut ids = Vec::new();
    if reader.pending_at_start == 0 {
        return ids;
    }
    while let Some(e) = reader.next().await {
        let e = e.unwrap();
        if site_gateway::outbox::kept_at_site(&e.delivery.subject) {
            ids.push(e.delivery.envelope.id.clone());
        }
        if e.pending == 0 {
            break;
        }
    }
    ids
}

/// Once means for good, not only within the hub's duplicate window: the forwarder of a site's
/// outbox died after the hub stored some of its reports and before it marked them forwarded,
/// and starts again long after the hub forgot their ids. It finds what the hub has, sends only
/// the rest, and the hub holds each report once, in the order the site stored them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_forwarder_that_died_before_its_mark_sends_nothing_twice_after_the_duplicate_window() {
    use site_gateway::outbox::Outbox;
    use tokio_util::sync::CancellationToken;

    // One server in the hub's domain stands for both the hub and the site's leaf node: the
    // outbox is made in the connected server's domain, the reports go to the hub's.
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("domain.conf");
    std::fs::write(&conf, format!("jetstream {{ domain: {HUB_DOMAIN} }}\n")).unwrap();
    let server = landfall_tests::nats::NatsServer::start_with(&["-c", conf.to_str().unwrap()]);
    let access = Access { js_domain: Some(HUB_DOMAIN.into()), ..Default::default() };
    let bus = bus_schema::runtime::Bus::connect_with(&server.url(), "site", &access).await.unwrap();
    let window = Duration::from_secs(1);
    let topology = bus_schema::runtime::Topology::for_server(&bus).keeping(Some(window), None);
    bus.ensure_topology(&topology).await.unwrap();
    let outbox = Arc::new(Outbox::open("edge-01", &bus).await.unwrap());

    let reports: Vec<(pb::NodePatched, Envelope)> = (0..10)
        .map(|i| {
            let node = format!("node-{i}");
            let report = pb::NodePatched { site_id: "edge-01".into(), node: node.clone(), ..Default::default() };
            (report, Envelope::root().derive("node_patched", Some(&node)))
        })
        .collect();
    for (report, env) in &reports {
        outbox.store(&report.subject(), pb::NodePatched::TYPE, report.encode_to_vec().into(), env).await.unwrap();
    }
    // What the dead forwarder got to the hub: the first six, none marked.
    for (report, env) in &reports[..6] {
        bus.publish_event(report, env).await.unwrap();
    }
    assert_eq!(outbox.waiting().await.unwrap(), 10);
    tokio::time::sleep(window * 3).await;

    let shutdown = CancellationToken::new();
    let forwarder = tokio::spawn(outbox.clone().forward(shutdown.clone()));
    let deadline = Instant::now() + Duration::from_secs(20);
    while outbox.waiting().await.unwrap() > 0 {
        assert!(Instant::now() < deadline, "{} reports not forwarded", outbox.waiting().await.unwrap());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.cancel();
    forwarder.await.unwrap();

    let mut reader = bus.read_events(vec![pb::NodePatched::filter()], Default::default()).await.unwrap();
    let mut at_hub = Vec::new();
    while at_hub.len() < 10 {
        let e =
            tokio::time::timeout(Duration::from_secs(5), reader.next()).await.expect("ten reports").unwrap().unwrap();
        at_hub.push(e.delivery.envelope.id);
    }
    let stored: Vec<String> = reports.iter().map(|(_, env)| env.id.clone()).collect();
    assert_eq!(at_hub, stored, "each report once, in the order the site stored them");
    let more = tokio::time::timeout(Duration::from_secs(1), reader.next()).await;
    assert!(
        more.is_err(),
        "a report reached the hub twice: {:?}",
        more.unwrap().unwrap().unwrap().delivery.envelope.id
    );
}

/// A job the site keeps that cannot be carried out (its payload does not decode) is refused in
/// its site's scope, as the hub delivered it, and leaves the site's inbox: it is not tried again
/// forever for want of a subject the site may answer on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_job_the_site_cannot_read_is_refused_in_its_sites_scope() {
    let site = LeafSite::start(1).await;
    site.view().until_link(pb::LinkState::Up, Instant::now() + Duration::from_secs(30)).await;
    let env = Envelope::root();
    let subject = names::job_subject("edge-01", pb::ProvisionOs::KIND);
    let headers = env.headers(pb::ProvisionOs::TYPE);
    let published =
        site.fleet.bus.jetstream().publish_with_headers(subject, headers, b"\xff not a job".to_vec().into()).await;
    published.unwrap().await.expect("the jobs stream took it");
    let ends = [pb::MessageRejected::TYPE];
    let run = landfall_tests::fleet::collect(
        &site.fleet.bus,
        names::scope_events("edge-01"),
        "the refusal",
        &env.id,
        &ends,
        Duration::from_secs(30),
    )
    .await;
    let refused: Vec<pb::MessageRejected> = run.of_type();
    assert_eq!(refused.len(), 1, "{:?}\n{}", run.kinds(), site.gateway.log_tail(30));
    assert_eq!(refused[0].message_id, env.id);
    println!("leaf: the kept job was refused: {}", refused[0].reason);
    assert!(!site.gateway.log_text().contains("cannot publish the rejection"), "{}", site.gateway.log_tail(30));
    site.stop().await;
}
