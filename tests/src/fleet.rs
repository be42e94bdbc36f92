//! A running landfall for tests: the real orchestrator, kubeconfig collector and site
//! gateways, in this process, over simulated sites, on a real nats-server.
//!
//! ```text
//! let server = NatsServer::start();
//! let fleet = Fleet::builder(&server.url()).sites(2).nodes(3).start().await;
//! let cmd = fleet.install("edge-01").await;
//! let run = fleet.wait_install(&cmd).await;
//! ```

use std::sync::{Arc, Once};
use std::time::Duration;

use async_nats::jetstream::consumer::DeliverPolicy;
use bus_schema::access::Role;
use bus_schema::domain::SiteDesign;
use bus_schema::names;
use bus_schema::pb::{self, BusEvent, BusMessage};
use bus_schema::runtime::{Access, Bus, Envelope, ReadEvent, Topology};
use consumers::artifacts::{ArtifactStore, S3Options};
use consumers::distribution::DistributionConfig;
use consumers::secrets::KeyProvider;
use producers::up::{demo_packages, demo_site};
use site_gateway::ArtifactCache;
use site_gateway::sim::{SimConfig, SimSite};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// The data key tests seal kubeconfigs with.
pub const TEST_KEY_HEX: &str = "6c616e6466616c6c2d746573742d6b65792d3030303030303030303030303031";

/// Test fleets' stand-in artifacts are this many times smaller than the real packages.
pub const TEST_SHRINK: u64 = 4096;

/// How long a test waits for an install to end before it fails.
pub const INSTALL_TIMEOUT: Duration = Duration::from_secs(60);

/// Logs for failing tests: `RUST_LOG=debug cargo test …`.
pub fn init_tracing() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
    });
}

/// How many commands the commands stream holds (what a refused command must not change).
pub async fn commands_stored(bus: &Bus) -> u64 {
    let mut stream = bus.jetstream().get_stream(names::COMMANDS_STREAM).await.unwrap();
    stream.info().await.unwrap().state.messages
}

/// The kubelet at `version`, as a catalog entry (its digest made from the version).
pub fn kubelet(version: &str) -> pb::Package {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("kubelet@{version}").as_bytes());
    pb::Package {
        name: "kubelet".into(),
        version: version.into(),
        kind: pb::PackageKind::Binary as i32,
        sha256: digest.iter().map(|b| format!("{b:02x}")).collect(),
        size: 111_955_968,
        object_key: String::new(),
        chart: None,
        render: None,
    }
}

/// Waits for an event of `filter` correlated with `correlation`, reading the stream from its start.
pub async fn wait_for(bus: &Bus, filter: String, correlation: &str, timeout: Duration) -> Option<ReadEvent> {
    tokio::time::timeout(timeout, async {
        loop {
            // Read again from the start when the reader fails (see `collect`).
            let Ok(mut reader) = bus.read_events(vec![filter.clone()], DeliverPolicy::All).await else {
                tokio::time::sleep(Duration::from_millis(250)).await;
                continue;
            };
            while let Some(Ok(e)) = reader.next().await {
                if e.delivery.envelope.correlation == correlation {
                    return e;
                }
            }
        }
    })
    .await
    .ok()
}

/// Every event of `filter` correlated with `correlation`, from the start of the stream, until
/// the first of one of the `ends` types; panics, naming what it saw, after `timeout`.
pub async fn collect(
    bus: &Bus,
    filter: String,
    what: &str,
    correlation: &str,
    ends: &[&str],
    timeout: Duration,
) -> Run {
    let mut events = Vec::new();
    // Read from the start again whenever the reader fails (a cluster electing a new leader
    // times requests out for a moment): the stream is the same, so is what is read.
    let result = tokio::time::timeout(timeout, async {
        loop {
            events.clear();
            let mut reader = match bus.read_events(vec![filter.clone()], DeliverPolicy::All).await {
                Ok(reader) => reader,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the events yet");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    continue;
                }
            };
            while let Some(e) = reader.next().await {
                let e = match e {
                    Ok(e) => e,
                    Err(e) => {
                        tracing::warn!(error = %e, "the event reader failed; reading again");
                        break;
                    }
                };
                if e.delivery.envelope.correlation != correlation {
                    continue;
                }
                let done = ends.contains(&e.delivery.type_name.as_str());
                events.push(e);
                if done {
                    return;
                }
            }
        }
    })
    .await;
    if result.is_err() {
        let seen: Vec<_> = events.iter().map(|e| short(&e.delivery.type_name)).collect();
        panic!("{what} {correlation} did not end within {timeout:?}; saw {seen:#?}");
    }
    Run { events }
}

pub struct FleetBuilder {
    url: String,
    sites: usize,
    nodes: usize,
    sim: SimConfig,
    orchestrators: usize,
    policy: bus_schema::retention::StorePolicy,
    failing_hosts: Vec<(usize, String)>,
    failing_binaries: Vec<(usize, String)>,
    store: Option<(String, S3Options)>,
    artifacts: bool,
    access: Option<AccessFor>,
    gateways: bool,
    observer: bool,
    secrets: bool,
    duplicate_window: Option<Duration>,
    alive_every: Duration,
    cut_off_after: Duration,
    window_clock: consumers::WindowClock,
    job_delivery: bus_schema::runtime::JobDelivery,
}

/// How each role connects, when the fleet runs under a deployment's users.
pub type AccessFor = Arc<dyn Fn(&Role) -> Access + Send + Sync>;

impl FleetBuilder {
    /// Connect each service as its own user (`access(role)`), as deployed, instead of one
    /// anonymous connection for all; the fleet's own `bus` is the operator's.
    pub fn access(mut self, access: AccessFor) -> Self {
        self.access = Some(access);
        self
    }

    /// Run no site gateway in this process (the test runs them elsewhere, e.g. behind a leaf
    /// node); the simulated sites are still made, for the test to hand to its gateways.
    pub fn without_gateways(mut self) -> Self {
        self.gateways = false;
        self
    }

    /// The hub's dispatcher hands each job to its site, and no site has a durable of its own
    /// (`JobDelivery::Dispatch`, the default), for the fleet's services and gateways alike.
    pub fn dispatched(mut self) -> Self {
        self.job_delivery = bus_schema::runtime::JobDelivery::Dispatch;
        self
    }

    /// Each site takes its jobs through a durable of its own, made by the hub when the site is
    /// registered (`JobDelivery::Durable`), for the fleet's services and gateways alike.
    pub fn durable_per_site(mut self) -> Self {
        self.job_delivery = bus_schema::runtime::JobDelivery::Durable;
        self
    }

    pub fn sites(mut self, n: usize) -> Self {
        self.sites = n;
        self
    }

    pub fn nodes(mut self, n: usize) -> Self {
        self.nodes = n;
        self
    }

    pub fn sim(mut self, config: SimConfig) -> Self {
        self.sim = config;
        self
    }

    /// Register the demo packages with stand-in bytes in the artifact store (1/4096 of their
    /// real sizes), so installs move them to the sites' caches; by default they are registered
    /// by their metadata alone.
    pub fn with_artifacts(mut self) -> Self {
        self.artifacts = true;
        self
    }

    /// Keep artifacts in this store (e.g. `s3://bucket` on an [`crate::s3::S3Server`]) instead of
    /// a directory in the fleet's temporary directory.
    pub fn store(mut self, location: &str, s3: S3Options) -> Self {
        self.store = Some((location.to_string(), s3));
        self
    }

    /// The commands stream (and the others) forget message ids after `window`, so a test can
    /// publish a copy past the duplicate window in seconds.
    pub fn duplicate_window(mut self, window: Duration) -> Self {
        self.duplicate_window = Some(window);
        self
    }

    /// Run no orchestrator in this process (the test runs one as a separate process).
    pub fn without_orchestrator(mut self) -> Self {
        self.orchestrators = 0;
        self
    }

    /// Gateways say they are there every `alive_every`; the observer counts a site cut off
    /// after `cut_off_after` without word of it.
    pub fn link_timing(mut self, alive_every: Duration, cut_off_after: Duration) -> Self {
        self.alive_every = alive_every;
        self.cut_off_after = cut_off_after;
        self
    }

    /// Run no observer in this process (the test runs its own, to stop and start it).
    pub fn without_observer(mut self) -> Self {
        self.observer = false;
        self
    }

    /// Run no kubeconfig collector and secrets service in this process (the test runs its own,
    /// e.g. `landfall serve kubeconfig` over another key ring); the fleet's `keys` then seal
    /// nothing the bus holds.
    pub fn without_secrets(mut self) -> Self {
        self.secrets = false;
        self
    }

    /// Run `n` orchestrator replicas, each with its own connection, sharing the durable consumers.
    pub fn orchestrators(mut self, n: usize) -> Self {
        self.orchestrators = n;
        self
    }

    /// What the orchestrators keep, and for how long (default: [`StorePolicy::default`]).
    ///
    /// [`StorePolicy::default`]: bus_schema::retention::StorePolicy
    pub fn store_policy(mut self, policy: bus_schema::retention::StorePolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The clock the orchestrators read sites' maintenance windows at (default: the wall's).
    pub fn window_clock(mut self, clock: consumers::WindowClock) -> Self {
        self.window_clock = clock;
        self
    }

    /// Site `site` (0-based) fails to provision the OS of `host`.
    pub fn failing_host(mut self, site: usize, host: &str) -> Self {
        self.failing_hosts.push((site, host.to_string()));
        self
    }

    /// Site `site`'s BPA fails to install binaries on `host`.
    pub fn failing_binaries(mut self, site: usize, host: &str) -> Self {
        self.failing_binaries.push((site, host.to_string()));
        self
    }

    pub async fn start(self) -> Fleet {
        init_tracing();
        let access = |role: &Role| self.access.as_ref().map(|a| a(role)).unwrap_or_default();
        let bus = Bus::connect_with(&self.url, "landfall-test", &access(&Role::Operator))
            .await
            .expect("connect to the test nats-server")
            .with_job_delivery(self.job_delivery);
        let topology = Topology::for_server(&bus).keeping(self.duplicate_window, None);
        bus.ensure_topology_within(&topology, Duration::from_secs(30)).await.expect("create streams and buckets");
        // One connection per role under a deployment's users; one shared connection otherwise.
        let connect = async |role: Role, name: &str| match self.access {
            Some(_) => Bus::connect_with(&self.url, name, &access(&role))
                .await
                .expect("connect")
                .with_job_delivery(self.job_delivery),
            None => bus.clone(),
        };
        let shutdown = CancellationToken::new();
        let mut tasks = JoinSet::new();
        for i in 0..self.orchestrators {
            let name = format!("landfall-test-orchestrator-{i}");
            let replica = Bus::connect_with(&self.url, &name, &access(&Role::Orchestrator))
                .await
                .expect("connect")
                .with_job_delivery(self.job_delivery);
            let options = consumers::OrchestratorOptions {
                policy: self.policy,
                window_clock: self.window_clock.clone(),
                ..Default::default()
            };
            tasks.spawn(consumers::run_orchestrator_with(replica, options, shutdown.clone()));
        }
        if self.observer {
            let observer = connect(Role::Observer, "landfall-test-observer").await;
            tasks.spawn(consumers::run_observer_with(observer, self.policy, self.cut_off_after, shutdown.clone()));
        }
        let dir = tempfile::tempdir().expect("a temporary directory");
        // The kubeconfig collector and the secrets service, under a key file in `dir`.
        let key_ring = crate::secrets::test_key_ring(dir.path());
        if self.secrets {
            let secrets = connect(Role::Kubeconfig, "landfall-test-kubeconfig").await;
            tasks.spawn(consumers::secrets_service::run_secrets(secrets, key_ring.clone(), shutdown.clone()));
        }
        let keys: Arc<dyn KeyProvider> = key_ring;
        let store = match &self.store {
            Some((location, s3)) => ArtifactStore::open(location, s3),
            None => ArtifactStore::local(&dir.path().join("artifacts")),
        }
        .expect("open the artifact store");
        let distribution =
            Distribution::start(&connect(Role::Distribution, "landfall-test-distribution").await, &store, &shutdown);
        let catalog = match self.artifacts {
            true => producers::up::upload_demo_packages(&store, TEST_SHRINK).await.expect("upload the demo packages"),
            false => demo_packages(),
        };

        let mut sites = Vec::new();
        let mut gateways = Vec::new();
        for i in 0..self.sites {
            let design = demo_site(i, self.nodes);
            let backend = Arc::new(SimSite::new(design.site.as_str(), &design.nodes, self.sim.clone()));
            for (_, host) in self.failing_hosts.iter().filter(|(s, _)| *s == i) {
                backend.fail_provisioning(host);
            }
            for (_, host) in self.failing_binaries.iter().filter(|(s, _)| *s == i) {
                backend.fail_binaries(host);
            }
            let gateway = shutdown.child_token();
            if self.gateways {
                let site_bus = connect(Role::Site(design.site.to_string()), "landfall-test-gateway").await;
                let cache = ArtifactCache::new(dir.path().join("caches").join(design.site.as_str()));
                tasks.spawn(site_gateway::run_gateway(
                    design.site.clone(),
                    site_bus.clone(),
                    backend.clone(),
                    cache,
                    self.alive_every,
                    gateway.clone(),
                ));
                let control =
                    site_gateway::serve_sim_control(design.site.clone(), site_bus, (*backend).clone(), gateway.clone());
                tasks.spawn(control);
            }
            gateways.push(gateway);
            sites.push((design, backend));
        }
        let fleet = Fleet {
            bus,
            scopes: Default::default(),
            keys,
            sites,
            gateways,
            dir,
            store,
            distribution,
            catalog,
            shutdown,
            tasks,
        };
        fleet.register(self.orchestrators > 0).await;
        fleet
    }
}

/// The fleet's distribution service, which a test can stop and start again, and damage.
pub struct Distribution {
    pub config: DistributionConfig,
    bus: Bus,
    store: ArtifactStore,
    running: std::sync::Mutex<CancellationToken>,
    shutdown: CancellationToken,
}

impl Distribution {
    fn start(bus: &Bus, store: &ArtifactStore, shutdown: &CancellationToken) -> Self {
        let d = Distribution {
            config: DistributionConfig::default(),
            bus: bus.clone(),
            store: store.clone(),
            running: std::sync::Mutex::new(shutdown.child_token()),
            shutdown: shutdown.clone(),
        };
        d.spawn();
        d
    }

    fn spawn(&self) {
        let token = self.running.lock().unwrap().clone();
        let run = consumers::run_distribution(self.bus.clone(), self.store.clone(), self.config.clone(), token);
        tokio::spawn(async move {
            if let Err(e) = run.await {
                panic!("the distribution service failed: {e:#}");
            }
        });
    }

    /// Stops the service: requests go unanswered ("no responders") until [`Self::restart`].
    pub fn stop(&self) {
        self.running.lock().unwrap().cancel();
    }

    pub fn restart(&self) {
        *self.running.lock().unwrap() = self.shutdown.child_token();
        self.spawn();
    }

    /// The next `n` chunks leave the service with a byte flipped after their digest was taken.
    pub fn damage_next_chunks(&self, n: u32) {
        self.config.corrupt_chunks.store(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// Chunk requests fail, as over a cut link, once `bytes` have been served; 0 mends it.
    pub fn cut_after(&self, bytes: u64) {
        self.config.cut_after_bytes.store(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn bytes_served(&self) -> u64 {
        self.config.stats.bytes_served.load(std::sync::atomic::Ordering::Relaxed)
    }
}

pub struct Fleet {
    pub bus: Bus,
    /// The site each install this fleet published is for, so waiting reads only that site's events.
    scopes: std::sync::Mutex<std::collections::HashMap<String, String>>,
    pub keys: Arc<dyn KeyProvider>,
    pub sites: Vec<(SiteDesign, Arc<SimSite>)>,
    /// Each site's gateway runs until its token is cancelled ([`Fleet::stop_gateway`]).
    gateways: Vec<CancellationToken>,
    /// The artifact store (unless another was given), the sites' caches (`caches/<site>`).
    pub dir: tempfile::TempDir,
    pub store: ArtifactStore,
    pub distribution: Distribution,
    /// The packages the fleet registered.
    pub catalog: Vec<pb::Package>,
    shutdown: CancellationToken,
    tasks: JoinSet<anyhow::Result<()>>,
}

/// Everything one command caused (an install, a rollout), in stream order, up to its end.
pub struct Run {
    pub events: Vec<ReadEvent>,
}

/// Each node's steps of a patch, in the order they were taken: `m-1 cordoned`,
/// `m-1 drained [ns/pod …]`, `m-1 uncordoned`, `m-1 patched` or `m-1 failed`; the steps a
/// node's report carries (held while it was out of service only a moment) come just before it,
/// and the node reports a site's report carries where it is.
pub fn node_steps(events: &[ReadEvent]) -> Vec<String> {
    let held = |node: &str, steps: Option<pb::NodeSteps>| {
        let steps = steps.unwrap_or_default();
        let mut out = Vec::new();
        if steps.cordoned {
            out.push(format!("{node} cordoned"));
        }
        if steps.drained {
            out.push(format!("{node} drained [{}]", steps.evicted.join(" ")));
        }
        if steps.uncordoned {
            out.push(format!("{node} uncordoned"));
        }
        out
    };
    events
        .iter()
        .filter_map(|e| {
            let d = &e.delivery;
            let (node, step) = match d.type_name.as_str() {
                t if t == pb::NodeCordoned::TYPE => (d.decode::<pb::NodeCordoned>().ok()?.node, "cordoned"),
                t if t == pb::NodeDrained::TYPE => {
                    let e = d.decode::<pb::NodeDrained>().ok()?;
                    return Some(vec![format!("{} drained [{}]", e.node, e.evicted.join(" "))]);
                }
                t if t == pb::NodeUncordoned::TYPE => (d.decode::<pb::NodeUncordoned>().ok()?.node, "uncordoned"),
                t if t == pb::NodePatched::TYPE => {
                    let e = d.decode::<pb::NodePatched>().ok()?;
                    let mut steps = held(&e.node, e.steps);
                    steps.push(format!("{} patched", e.node));
                    return Some(steps);
                }
                // The node reports its site's report carries, in their order.
                t if t == pb::SitePatched::TYPE => {
                    let e = d.decode::<pb::SitePatched>().ok()?;
                    let mut steps = Vec::new();
                    for n in e.nodes {
                        steps.extend(held(&n.node, n.steps));
                        steps.push(format!("{} patched", n.node));
                    }
                    return Some(steps);
                }
                t if t == pb::NodePatchFailed::TYPE => {
                    let e = d.decode::<pb::NodePatchFailed>().ok()?;
                    let mut steps = held(&e.node, e.steps);
                    steps.push(format!("{} failed", e.node));
                    return Some(steps);
                }
                t if t == pb::NodeRolledBack::TYPE => (d.decode::<pb::NodeRolledBack>().ok()?.node, "rolled back"),
                t if t == pb::NodeRollbackFailed::TYPE => {
                    (d.decode::<pb::NodeRollbackFailed>().ok()?.node, "rollback failed")
                }
                _ => return None,
            };
            Some(vec![format!("{node} {step}")])
        })
        .flatten()
        .collect()
}

/// [`Run::node_reports`] of any events.
pub fn node_reports(events: &[ReadEvent]) -> Vec<pb::NodePatched> {
    let mut out = Vec::new();
    for e in events {
        let d = &e.delivery;
        if d.type_name == pb::NodePatched::TYPE {
            out.push(d.decode::<pb::NodePatched>().expect("events decode"));
        } else if d.type_name == pb::SitePatched::TYPE {
            out.extend(d.decode::<pb::SitePatched>().expect("events decode").nodes);
        }
    }
    out
}

/// An install's events, ending with `SiteInstalled`, `SiteInstallFailed` or `CommandRejected`.
pub type InstallRun = Run;
/// A rollout's events, fleet and site, ending with the first of the types waited for.
pub type RolloutRun = Run;

impl Run {
    /// The last event: the one the wait stopped at.
    pub fn terminal(&self) -> &ReadEvent {
        self.events.last().expect("a run has a terminal event")
    }

    pub fn of_type<M: BusMessage>(&self) -> Vec<M> {
        self.events
            .iter()
            .filter(|e| e.delivery.type_name == M::TYPE)
            .map(|e| e.delivery.decode::<M>().expect("events decode"))
            .collect()
    }

    /// The nodes' reports, in stream order, each where it came: alone (`NodePatched`), or in
    /// its site's report (`SitePatched.nodes`).
    pub fn node_reports(&self) -> Vec<pb::NodePatched> {
        node_reports(&self.events)
    }

    /// The type names, without the package, in stream order.
    pub fn kinds(&self) -> Vec<String> {
        self.events.iter().map(|e| short(&e.delivery.type_name)).collect()
    }

    /// The types of the events about `node`, in stream order.
    pub fn node_timeline(&self, node: &str) -> Vec<String> {
        self.events
            .iter()
            .filter(|e| {
                pb::decode_to_json(&e.delivery.type_name, &e.delivery.payload)
                    .and_then(Result::ok)
                    .is_some_and(|v| v["node"] == node)
            })
            .map(|e| short(&e.delivery.type_name))
            .collect()
    }
}

fn short(type_name: &str) -> String {
    type_name.trim_start_matches("landfall.v1.").to_string()
}

impl Fleet {
    pub fn builder(url: &str) -> FleetBuilder {
        FleetBuilder {
            url: url.to_string(),
            sites: 1,
            nodes: 3,
            sim: SimConfig::fast(),
            orchestrators: 1,
            policy: Default::default(),
            failing_hosts: Vec::new(),
            failing_binaries: Vec::new(),
            store: None,
            artifacts: false,
            access: None,
            gateways: true,
            observer: true,
            secrets: true,
            duplicate_window: None,
            alive_every: bus_schema::names::ALIVE_EVERY,
            cut_off_after: bus_schema::names::CUT_OFF_AFTER,
            window_clock: consumers::WindowClock::wall(),
            job_delivery: Default::default(),
        }
    }

    pub fn site_id(&self, i: usize) -> String {
        self.sites[i].0.site.to_string()
    }

    pub fn backend(&self, i: usize) -> &Arc<SimSite> {
        &self.sites[i].1
    }

    /// Registers the demo packages and every site's design through the bus, and waits until
    /// they are applied when an orchestrator runs here.
    async fn register(&self, wait: bool) {
        let mut last_package = Envelope::root();
        for p in self.catalog.clone() {
            last_package = Envelope::root();
            self.bus
                .publish_command(&pb::RegisterPackage { package: Some(p), auto_rollout: None }, &last_package)
                .await
                .unwrap();
        }
        if wait {
            // Fleet-wide commands are handled in order: the last one registered means all are.
            // A cluster that has just formed may take a while to elect its streams' leaders.
            let registered =
                self.wait_for(pb::PackageRegistered::filter(), &last_package.id, Duration::from_secs(60)).await;
            assert!(registered.is_some(), "the catalog was not registered within 60 s");
        }
        let mut last = Envelope::root();
        for (design, _) in &self.sites {
            last = Envelope::root();
            let cmd = pb::RegisterSite { design: Some(pb::SiteDesign::from(design)), expected: None };
            self.bus.publish_command(&cmd, &last).await.unwrap();
        }
        if wait && !self.sites.is_empty() {
            let _ = self.wait_for(pb::SiteRegistered::filter(), &last.id, Duration::from_secs(20)).await;
        }
    }

    /// Waits for an event of `filter` correlated with `correlation`.
    pub async fn wait_for(&self, filter: String, correlation: &str, timeout: Duration) -> Option<ReadEvent> {
        wait_for(&self.bus, filter, correlation, timeout).await
    }

    /// Publishes InstallSite for a site and returns its envelope.
    pub async fn install(&self, site: &str) -> Envelope {
        let env = Envelope::root();
        self.install_with(site, &env).await;
        env
    }

    pub async fn install_with(&self, site: &str, env: &Envelope) {
        self.scopes.lock().expect("scopes lock").insert(env.id.clone(), site.to_string());
        self.bus
            .publish_command(&pb::InstallSite { site_id: site.to_string(), ..Default::default() }, env)
            .await
            .unwrap();
    }

    /// Collects every event the command caused until its terminal event.
    pub async fn wait_install(&self, cmd: &Envelope) -> InstallRun {
        let scope = self.scopes.lock().expect("scopes lock").get(&cmd.id).cloned();
        let filter = scope.map_or_else(|| names::EVENTS_ALL.to_string(), |site| names::scope_events(&site));
        let ends = [pb::SiteInstalled::TYPE, pb::SiteInstallFailed::TYPE, pb::CommandRejected::TYPE];
        self.collect(filter, "install", &cmd.id, &ends, INSTALL_TIMEOUT).await
    }

    /// Takes site `i`'s gateway off the bus (the site goes offline); its jobs wait in the stream.
    pub fn stop_gateway(&self, i: usize) {
        self.gateways[i].cancel();
    }

    /// The artifact cache of a gateway a test runs itself for `site`.
    pub fn cache_for(&self, site: &str) -> ArtifactCache {
        ArtifactCache::new(self.dir.path().join("caches").join(site))
    }

    /// Site `i`'s artifact cache.
    pub fn cache(&self, i: usize) -> ArtifactCache {
        ArtifactCache::new(self.dir.path().join("caches").join(self.site_id(i)))
    }

    /// Installs every site and waits until each is installed.
    pub async fn install_all(&self) {
        let mut cmds = Vec::new();
        for i in 0..self.sites.len() {
            cmds.push(self.install(&self.site_id(i)).await);
        }
        for cmd in &cmds {
            let run = self.wait_install(cmd).await;
            assert_eq!(run.terminal().delivery.type_name, pb::SiteInstalled::TYPE, "install {}", cmd.id);
        }
    }

    /// Publishes a PatchPackage; its envelope id is the rollout id.
    /// Uploads `size` bytes (incompressible, the same for the same name and version) into the
    /// fleet's artifact store and registers them as the binary `name@version`.
    pub async fn register_artifact(&self, name: &str, version: &str, size: usize) -> pb::Package {
        let bytes = producers::up::demo_content(name, version, size);
        let stored = self.store.upload(bytes.as_slice()).await.unwrap();
        let pkg = pb::Package {
            name: name.into(),
            version: version.into(),
            kind: pb::PackageKind::Binary as i32,
            sha256: stored.sha256,
            size: stored.size,
            object_key: stored.object_key,
            chart: None,
            render: None,
        };
        let register = Envelope::root();
        let cmd = pb::RegisterPackage { package: Some(pkg.clone()), auto_rollout: None };
        self.bus.publish_command(&cmd, &register).await.unwrap();
        let registered = self.wait_for(pb::PackageRegistered::filter(), &register.id, Duration::from_secs(20)).await;
        registered.expect("registered");
        pkg
    }

    pub async fn patch(&self, cmd: pb::PatchPackage) -> Envelope {
        let env = Envelope::root();
        self.bus.publish_command(&cmd, &env).await.unwrap();
        env
    }

    /// Every event of the rollout (fleet and site events) until it completes, halts, is
    /// cancelled or rejected.
    pub async fn wait_rollout(&self, rollout_id: &str, timeout: Duration) -> RolloutRun {
        let ends = [
            pb::RolloutCompleted::TYPE,
            pb::RolloutHalted::TYPE,
            pb::RolloutCancelled::TYPE,
            pb::CommandRejected::TYPE,
        ];
        self.wait_rollout_until(rollout_id, &ends, timeout).await
    }

    /// Every event of the rollout until the first of one of the `ends` types.
    pub async fn wait_rollout_until(&self, rollout_id: &str, ends: &[&str], timeout: Duration) -> RolloutRun {
        self.collect(names::EVENTS_ALL.to_string(), "rollout", rollout_id, ends, timeout).await
    }

    async fn collect(&self, filter: String, what: &str, correlation: &str, ends: &[&str], timeout: Duration) -> Run {
        collect(&self.bus, filter, what, correlation, ends, timeout).await
    }

    /// Stops every service and waits for them to drain.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        while let Some(r) = self.tasks.join_next().await {
            r.expect("service task panicked").expect("service failed");
        }
    }
}
