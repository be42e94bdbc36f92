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
use bus_schema::domain::SiteDesign;
use bus_schema::names;
use bus_schema::pb::{self, BusEvent, BusMessage};
use bus_schema::runtime::{Bus, Envelope, ReadEvent, Topology};
use consumers::secrets::{KeyProvider, StaticKey};
use producers::up::{demo_packages, demo_site};
use site_gateway::sim::{SimConfig, SimSite};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// The data key tests seal kubeconfigs with.
pub const TEST_KEY_HEX: &str = "6c616e6466616c6c2d746573742d6b65792d3030303030303030303030303031";

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

pub struct FleetBuilder {
    url: String,
    sites: usize,
    nodes: usize,
    sim: SimConfig,
    orchestrators: usize,
    failing_hosts: Vec<(usize, String)>,
    failing_binaries: Vec<(usize, String)>,
}

impl FleetBuilder {
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

    /// Run no orchestrator in this process (the test runs one as a separate process).
    pub fn without_orchestrator(mut self) -> Self {
        self.orchestrators = 0;
        self
    }

    /// Run `n` orchestrator replicas, each with its own connection, sharing the durable consumers.
    pub fn orchestrators(mut self, n: usize) -> Self {
        self.orchestrators = n;
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
        let bus = Bus::connect(&self.url, "landfall-test").await.expect("connect to the test nats-server");
        bus.ensure_topology(&Topology::default()).await.expect("create streams and buckets");
        let keys: Arc<dyn KeyProvider> = Arc::new(StaticKey::from_hex(TEST_KEY_HEX, "test").expect("test key"));
        let shutdown = CancellationToken::new();
        let mut tasks = JoinSet::new();
        for i in 0..self.orchestrators {
            let replica = Bus::connect(&self.url, &format!("landfall-test-orchestrator-{i}")).await.expect("connect");
            tasks.spawn(consumers::run_orchestrator(replica, shutdown.clone()));
        }
        tasks.spawn(consumers::run_kubeconfig(bus.clone(), keys.clone(), shutdown.clone()));
        tasks.spawn(consumers::run_observer(bus.clone(), shutdown.clone()));

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
            tasks.spawn(site_gateway::run_gateway(design.site.clone(), bus.clone(), backend.clone(), gateway.clone()));
            let control =
                site_gateway::serve_sim_control(design.site.clone(), bus.clone(), (*backend).clone(), gateway.clone());
            tasks.spawn(control);
            gateways.push(gateway);
            sites.push((design, backend));
        }
        let fleet = Fleet { bus, scopes: Default::default(), keys, sites, gateways, shutdown, tasks };
        fleet.register(self.orchestrators > 0).await;
        fleet
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
    shutdown: CancellationToken,
    tasks: JoinSet<anyhow::Result<()>>,
}

/// Everything one command caused (an install, a rollout), in stream order, up to its end.
pub struct Run {
    pub events: Vec<ReadEvent>,
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
            failing_hosts: Vec::new(),
            failing_binaries: Vec::new(),
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
        for p in demo_packages() {
            last_package = Envelope::root();
            self.bus
                .publish_command(&pb::RegisterPackage { package: Some(p), auto_rollout: None }, &last_package)
                .await
                .unwrap();
        }
        if wait {
            // Fleet-wide commands are handled in order: the last one registered means all are.
            let registered =
                self.wait_for(pb::PackageRegistered::filter(), &last_package.id, Duration::from_secs(20)).await;
            assert!(registered.is_some(), "the catalog was not registered within 20 s");
        }
        let mut last = Envelope::root();
        for (design, _) in &self.sites {
            last = Envelope::root();
            let cmd = pb::RegisterSite { design: Some(pb::SiteDesign::from(design)) };
            self.bus.publish_command(&cmd, &last).await.unwrap();
        }
        if wait && !self.sites.is_empty() {
            let _ = self.wait_for(pb::SiteRegistered::filter(), &last.id, Duration::from_secs(20)).await;
        }
    }

    /// Waits for an event of `filter` correlated with `correlation`.
    pub async fn wait_for(&self, filter: String, correlation: &str, timeout: Duration) -> Option<ReadEvent> {
        let mut reader = self.bus.read_events(vec![filter], DeliverPolicy::All).await.unwrap();
        tokio::time::timeout(timeout, async {
            while let Some(e) = reader.next().await {
                let e = e.unwrap();
                if e.delivery.envelope.correlation == correlation {
                    return Some(e);
                }
            }
            None
        })
        .await
        .ok()
        .flatten()
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

    /// Every event of `filter` correlated with `correlation`, from the start of the stream,
    /// until the first of one of the `ends` types; panics, naming what it saw, after `timeout`.
    async fn collect(&self, filter: String, what: &str, correlation: &str, ends: &[&str], timeout: Duration) -> Run {
        let mut reader = self.bus.read_events(vec![filter], DeliverPolicy::All).await.unwrap();
        let mut events = Vec::new();
        let result = tokio::time::timeout(timeout, async {
            while let Some(e) = reader.next().await {
                let e = e.unwrap();
                if e.delivery.envelope.correlation != correlation {
                    continue;
                }
                let done = ends.contains(&e.delivery.type_name.as_str());
                events.push(e);
                if done {
                    return;
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

    /// Stops every service and waits for them to drain.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        while let Some(r) = self.tasks.join_next().await {
            r.expect("service task panicked").expect("service failed");
        }
    }
}
