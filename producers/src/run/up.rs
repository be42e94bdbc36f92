//! `landfall up`: the whole system on one machine.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::consumer::DeliverPolicy;
use bus_schema::domain::{NodeDesign, SiteDesign, SiteId};
use bus_schema::names::{self, keys};
use bus_schema::pb::{self, BusEvent};
use bus_schema::runtime::{Bus, Envelope};
use clap::Args;
use consumers::secrets_service::{self, KeySource};
use sha2::{Digest, Sha256};
use site_gateway::ArtifactCache;
use site_gateway::sim::{SimConfig, SimSite};
use tokio::task::JoinSet;
use tracing::{error, info};

use super::demo::{UP_SHRINK, demo_strategy};
use super::embedded::{NatsChild, find_nats_server};
use super::gateway::DEFAULT_TIME_SCALE;
use super::service::{connect_service, shutdown_on_signal};
use super::telemetry;
use crate::flags::{KeepingArgs, RetentionArgs, StoreArgs, parse_duration};
use crate::nats_access::DEFAULT_NATS_URL;

mod progress;

/// The demo fleet `up` runs, also under this module's path.
pub use super::demo::{demo_content, demo_packages, demo_site, upload_demo_packages};

#[derive(Debug, Args)]
pub struct UpArgs {
    /// How many simulated sites.
    #[arg(long, default_value_t = 3)]
    pub sites: usize,
    /// Nodes per site (the first is a master; 3 masters from 5 nodes up).
    #[arg(long, default_value_t = 4)]
    pub nodes: usize,
    /// Where nats-server keeps its store, the simulated sites keep their hosts, and the data
    /// key lives: what `up` started again in the same directory carries on with.
    #[arg(long, env = "LANDFALL_DATA_DIR", default_value = "./landfall-data")]
    pub data_dir: PathBuf,
    /// Start over: forget the fleet kept in the data directory (the hub's store and the
    /// simulated sites' hosts) before starting. The data key and the API tokens stay.
    #[arg(long)]
    pub fresh: bool,
    /// The port of the embedded nats-server.
    #[arg(long, default_value_t = 4222)]
    pub nats_port: u16,
    /// Run simulated sites this many times faster than real ones.
    #[arg(long, default_value_t = DEFAULT_TIME_SCALE)]
    pub time_scale: f64,
    /// Which sites to install at startup (through the bus, as any client would): `one-by-one`
    /// installs each site that was never installed, the next once the one before has ended,
    /// so there is an install to watch on the dashboard; `all` installs them at once; `first`
    /// only the first; `none` waits for you. A site installed before is left alone.
    #[arg(long, value_enum, default_value = "one-by-one", num_args = 0..=1, default_missing_value = "all")]
    pub install: InstallAtStart,
    /// Also run a simulated site and its gateway for every site registered that is not one of
    /// up's own (`site register`, `design apply`), from its design, kept like up's own: so a
    /// design can be tried, installed and rolled out on the embedded default.
    #[arg(long)]
    pub simulate_new_sites: bool,
    #[command(flatten)]
    pub api: crate::api::ApiArgs,
    /// A new host appears at one of the sites (in turn) this often; its gateway announces it
    /// and the orchestrator joins it to the cluster. E.g. 30s, 5m.
    #[arg(long, value_parser = parse_duration)]
    pub node_arrival_every: Option<Duration>,
    /// SITE/HOST: every provisioning of this simulated host fails, as a host with a broken disk
    /// would, to see a failed install (and the alert on it). May be given again.
    #[arg(long, value_name = "SITE/HOST", value_parser = parse_site_host)]
    pub fail_host: Vec<(String, String)>,
    /// SITE/NODE: a disruption budget allows none of this node's pods to go, so a rollout that
    /// takes it down sees its drain fail (the node is failed, left schedulable at its old
    /// version). May be given again.
    #[arg(long, value_name = "SITE/NODE", value_parser = parse_site_host)]
    pub block_drain: Vec<(String, String)>,
    /// SITE/NAME@VERSION: a bad release at this site: it installs, but no node comes up
    /// healthy at it (a kubelet never Ready, a container's workloads never available), to see a
    /// rollout's failed nodes rolled back (--on-failure roll-back). May be given again.
    #[arg(long, value_name = "SITE/NAME@VERSION", value_parser = parse_site_host)]
    pub bad_version: Vec<(String, String)>,
    /// Where artifacts are kept (default: the data directory's `artifacts`).
    #[command(flatten)]
    pub store: StoreArgs,
    #[command(flatten)]
    pub keeping: KeepingArgs,
    #[command(flatten)]
    pub retention: RetentionArgs,
    /// When the hub counts a site cut off; the sites' gateways say they are there every
    /// quarter of it (at most every 15 s).
    #[command(flatten)]
    pub observer: super::serve::ObserverArgs,
    /// Show the services' logs here, as well as what happens; without it they go to
    /// `landfall.log` in the data directory (and `--log-format json` sends them here as JSON).
    #[arg(short, long)]
    pub verbose: bool,
    /// Where the services' logs went, as the process set them up (`None`: the terminal).
    #[arg(skip)]
    pub logs_to: Option<PathBuf>,
}

impl UpArgs {
    /// Where the services' logs should go instead of the terminal: `None` when they go to the
    /// terminal (`-v`, or `--log-format json`).
    pub fn log_file(&self, format: telemetry::LogFormat) -> Option<PathBuf> {
        (!self.verbose && format == telemetry::LogFormat::Text).then(|| self.data_dir.join(LOG_FILE))
    }
}

/// The services' log in the data directory.
pub const LOG_FILE: &str = "landfall.log";

/// `SITE/HOST`.
fn parse_site_host(s: &str) -> Result<(String, String), String> {
    match s.split_once('/') {
        Some((site, host)) if !site.is_empty() && !host.is_empty() => Ok((site.to_string(), host.to_string())),
        _ => Err(format!("{s:?} is not SITE/HOST (e.g. edge-02/node-1)")),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum InstallAtStart {
    None,
    First,
    OneByOne,
    All,
}

/// Registers the demo packages, and the demo sites that are not registered yet, through the bus
/// as any client would, and waits until the orchestrator has applied them.
async fn register_demo(bus: &Bus, catalog: Vec<pb::Package>, designs: &[SiteDesign]) -> anyhow::Result<()> {
    let rejected = names::events_of_kind(pb::rejection::COMMAND_AGGREGATE, pb::rejection::KIND);
    let filters = vec![pb::SiteRegistered::filter(), rejected];
    let mut reader = bus.read_events(filters, DeliverPolicy::New).await?;
    for p in catalog {
        // Fixed ids: running `up` again does not register twice.
        let id =
            bus_schema::ids::derived_id("landfall-up", "register_package", Some(&format!("{}@{}", p.name, p.version)));
        // Binaries roll out by themselves when a newer version is registered.
        let auto_rollout = (p.kind == pb::PackageKind::Binary as i32).then(|| pb::AutoRollout {
            enabled: true,
            selector: None,
            strategy: Some(demo_strategy()),
        });
        bus.publish_command(&pb::RegisterPackage { package: Some(p), auto_rollout }, &Envelope::root_with_id(id))
            .await?;
    }
    // A demo site registered by an earlier run keeps what became of it (nodes that joined,
    // designs applied): only the missing ones are registered.
    let sites = bus.kv(names::SITES_BUCKET).await?;
    let mut missing = std::collections::HashSet::new();
    for d in designs {
        if sites.get::<pb::SiteDesign>(&keys::site(d.site.as_str())).await?.is_some() {
            continue;
        }
        // Only if it is still not registered when the command is carried out: a site registered
        // meanwhile (by another `up`, or a person) keeps its design.
        let cmd = pb::RegisterSite {
            design: Some(pb::SiteDesign::from(d)),
            expected: Some(pb::ExpectedRevision { revision: 0 }),
        };
        let env = Envelope::root();
        bus.publish_command(&cmd, &env).await?;
        missing.insert(env.id);
    }
    // Registered, or refused because the site was registered meanwhile: either way it is there.
    while !missing.is_empty() {
        let next = tokio::time::timeout(Duration::from_secs(30), reader.next())
            .await
            .context("the orchestrator did not register the sites within 30 s")?;
        if let Some(Ok(e)) = next {
            missing.remove(&e.delivery.envelope.correlation);
        }
    }
    Ok(())
}

pub async fn run(args: UpArgs, nats_url: Option<String>) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(args.sites >= 1 && args.nodes >= 1, "--sites and --nodes must be at least 1");
    anyhow::ensure!(args.time_scale > 0.0, "--time-scale must be positive");
    anyhow::ensure!(!args.observer.cut_off_after.is_zero(), "--cut-off-after must be more than nothing");
    let designs: Vec<SiteDesign> = (0..args.sites).map(|i| demo_site(i, args.nodes)).collect();
    for (flag, list) in [("--fail-host", &args.fail_host), ("--block-drain", &args.block_drain)] {
        for (site, host) in list {
            anyhow::ensure!(
                designs.iter().any(|d| d.site.as_str() == site && d.nodes.iter().any(|n| n.name.as_str() == host)),
                "{flag} {site}/{host}: landfall up has no such site and host (edge-01/node-1 is the first)"
            );
        }
    }
    for (site, release) in &args.bad_version {
        anyhow::ensure!(
            designs.iter().any(|d| d.site.as_str() == site),
            "--bad-version {site}/{release}: landfall up has no such site (edge-01 is the first)"
        );
        let (name, version) = release.split_once('@').unwrap_or_default();
        anyhow::ensure!(
            !name.is_empty() && !version.is_empty(),
            "--bad-version {site}/{release}: give the release as NAME@VERSION, e.g. edge-01/kubelet@1.29.3"
        );
    }
    let shutdown = shutdown_on_signal();
    // Before any service starts, so what they count from the start (counters at 0) is kept.
    let metrics = telemetry::prometheus()?;
    if args.fresh {
        start_over(&args.data_dir, nats_url.is_some())?;
    }
    std::fs::create_dir_all(&args.data_dir).with_context(|| format!("create {}", args.data_dir.display()))?;

    let (nats, url) = match nats_url {
        Some(url) => (None, url),
        None => {
            let binary = find_nats_server().await?;
            let child = NatsChild::start(
                &binary,
                args.nats_port,
                &args.data_dir.join("nats"),
                &args.data_dir.join("nats-server.log"),
            )
            .await?;
            let url = child.url.clone();
            (Some(child), url)
        }
    };

    let bus = connect_service(&url, "landfall-up", &args.keeping, true).await?;
    let key = secrets_service::open_key_ring(&bus, KeySource::CreateFile(args.data_dir.join("secret.key"))).await?;
    let sim = SimConfig::realistic().time_scale(args.time_scale);

    let mut services = JoinSet::new();
    services.spawn(consumers::run_orchestrator(bus.clone(), args.retention.policy(), shutdown.clone()));
    services.spawn(secrets_service::run_secrets(bus.clone(), key.clone(), shutdown.clone()));
    let cut_off_after = args.observer.cut_off_after;
    let policy = bus_schema::retention::StorePolicy::default();
    services.spawn(consumers::run_observer_with(bus.clone(), policy, cut_off_after, shutdown.clone()));
    let alive_every = names::ALIVE_EVERY.min(cut_off_after / 4);
    let default_store = args.data_dir.join("artifacts").display().to_string();
    let store = args.store.open_or_default(Some(&default_store))?;
    let catalog = upload_demo_packages(&store, UP_SHRINK).await.context("upload the demo packages")?;
    services.spawn(consumers::run_distribution(bus.clone(), store.clone(), Default::default(), shutdown.clone()));
    // The identity service answers the API's and the CLI's identity requests; `up`'s own
    // simulated sites connect without credentials (its nats-server asks none).
    let settings = consumers::identity::IdentitySettings {
        issuer: std::sync::Arc::new(super::identity::issuer_or_new(&args.data_dir.join("identity-issuer.nk"))?),
        link_ttl: consumers::identity::LINK_TTL,
        approval: consumers::identity::Approval::Operator,
    };
    services.spawn(consumers::identity::run_identity_service(bus.clone(), None, settings, shutdown.clone()));
    let gateways = SimGateways { bus: bus.clone(), data_dir: args.data_dir.clone(), sim: sim.clone(), alive_every };
    let mut sims = Vec::new();
    let registered = bus.kv(names::SITES_BUCKET).await?;
    for d in &designs {
        // A site the hub has registered is built from the hub's design (nodes added or removed
        // since count); a new one from the demo design.
        let hub = registered.get::<pb::SiteDesign>(&keys::site(d.site.as_str())).await?;
        let nodes = match hub {
            Some((design, _)) => {
                SiteDesign::try_from(design).with_context(|| format!("the hub's design of {}", d.site))?.nodes
            }
            None => d.nodes.clone(),
        };
        let backend = gateways.kept_site(d.site.as_str(), &nodes)?;
        for (_, host) in args.fail_host.iter().filter(|(site, _)| site == d.site.as_str()) {
            backend.fail_provisioning(host);
        }
        for (_, node) in args.block_drain.iter().filter(|(site, _)| site == d.site.as_str()) {
            backend.block_drain(node);
        }
        for (_, release) in args.bad_version.iter().filter(|(site, _)| site == d.site.as_str()) {
            backend.bad_version(release);
        }
        gateways.start(&d.site, &backend, &mut services, &shutdown);
        sims.push(backend);
    }
    if args.simulate_new_sites {
        let demo = designs.iter().map(|d| d.site.to_string()).collect();
        services.spawn(gateways.clone().simulate_new_sites(demo, shutdown.clone()));
    }
    register_demo(&bus, catalog, &designs).await?;
    let never_installed = never_installed(&bus, &designs).await?;
    let to_install: Vec<SiteId> = match args.install {
        InstallAtStart::None => Vec::new(),
        InstallAtStart::First => never_installed.into_iter().take(1).collect(),
        InstallAtStart::OneByOne | InstallAtStart::All => never_installed,
    };
    if !to_install.is_empty() {
        info!(sites = to_install.len(), one_by_one = args.install == InstallAtStart::OneByOne, "installing");
        services.spawn(install_at_start(
            bus.clone(),
            to_install,
            args.install == InstallAtStart::OneByOne,
            shutdown.clone(),
        ));
    }

    let (tokens, operator_token, viewer_token) = match &args.api.tokens {
        Some(path) => (crate::api::auth::Tokens::from_file(path)?, String::new(), String::new()),
        None => crate::api::auth::local_tokens(&args.data_dir)?,
    };
    let render: crate::api::MetricsRender = Arc::new(move || telemetry::render(&metrics));
    let (api_addr, api_task) =
        crate::api::serve(bus.clone(), tokens, args.api.policy()?, args.api.listen, Some(render), shutdown.clone())
            .await?;
    services.spawn(async move { api_task.await? });
    if let Some(every) = args.node_arrival_every {
        services.spawn(node_arrivals(sims, args.nodes, every, shutdown.clone()));
    }

    let banner = Banner {
        url: &url,
        nats: nats.as_ref(),
        designs: &designs,
        key_id: &key.current_id(),
        store_url: store.url(),
        api: api_addr,
        operator_token: &operator_token,
        viewer_token: &viewer_token,
    };
    print_banner(&args, banner);
    services.spawn(progress::show(bus.clone(), say, shutdown.clone()));

    tokio::select! {
        _ = shutdown.cancelled() => {}
        Some(done) = services.join_next() => {
            // A service that stops on its own is a failure: say which, then stop the rest.
            match done {
                Ok(Err(e)) => error!(error = %format!("{e:#}"), "a service stopped"),
                Err(e) => error!(error = %e, "a service panicked"),
                // Stopping on a signal: services end as asked, and one may be seen first.
                Ok(Ok(())) if shutdown.is_cancelled() => {}
                Ok(Ok(())) => error!("a service stopped unexpectedly"),
            }
            shutdown.cancel();
        }
    }
    info!("stopping services");
    while services.join_next().await.is_some() {}
    if let Some(nats) = nats {
        nats.stop().await;
    }
    say(format_args!("landfall stopped"));
    Ok(ExitCode::SUCCESS)
}

/// Forgets the fleet `up` kept in `data_dir`: the embedded nats-server's store and the simulated
/// sites. With a NATS server of someone else's (`nats_url`), its store is theirs to clear.
fn start_over(data_dir: &std::path::Path, external_nats: bool) -> anyhow::Result<()> {
    let mut gone = vec![data_dir.join(GATEWAYS_DIR)];
    if !external_nats {
        gone.push(data_dir.join("nats"));
    }
    for dir in gone {
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => info!(dir = %dir.display(), "--fresh: removed"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("--fresh: remove {}", dir.display())),
        }
    }
    Ok(())
}

/// Where `up` keeps each simulated site's gateway: its artifact cache and its hosts.
const GATEWAYS_DIR: &str = "gateways";

/// How `up` runs a simulated site and its gateway.
#[derive(Clone)]
struct SimGateways {
    bus: Bus,
    data_dir: PathBuf,
    sim: SimConfig,
    alive_every: Duration,
}

impl SimGateways {
    /// A simulated site's hosts, kept in a file under the data directory as a real site keeps
    /// its BareMetalHosts whatever becomes of its gateway: started again, the site has the
    /// hosts it had (their Metal3 states, images, binaries, cordons), and a provisioning cut
    /// short by the stop goes on. `nodes` (the site's design) register as new hosts where the
    /// site lacks them.
    fn kept_site(&self, site: &str, nodes: &[NodeDesign]) -> anyhow::Result<SimSite> {
        let dir = self.data_dir.join(GATEWAYS_DIR).join(site);
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        SimSite::with_state_file(site, nodes, self.sim.clone(), &dir.join("site.json")).with_context(|| {
            format!("the simulated site {site} cannot start from what it kept (landfall up --fresh starts over)")
        })
    }

    /// Runs the gateway of `backend` (and the control that lets `node add` make a host appear
    /// there) among `services`, until `shutdown`.
    fn start(
        &self,
        site: &SiteId,
        backend: &SimSite,
        services: &mut JoinSet<anyhow::Result<()>>,
        shutdown: &tokio_util::sync::CancellationToken,
    ) {
        let cache = ArtifactCache::new(self.data_dir.join(GATEWAYS_DIR).join(site.as_str()).join("cache"));
        services.spawn(site_gateway::run_gateway(
            site.clone(),
            self.bus.clone(),
            Arc::new(backend.clone()),
            cache,
            self.alive_every,
            shutdown.clone(),
        ));
        services.spawn(site_gateway::serve_sim_control(
            site.clone(),
            self.bus.clone(),
            backend.clone(),
            shutdown.clone(),
        ));
    }

    /// Runs a simulated site and its gateway for every site registered that is not one of
    /// `demo` (whose gateways run already), as the sites are registered (and those registered
    /// before this start), each built from its design; a site removed has its gateway stopped.
    /// A site that cannot be simulated is said in the log, and the others go on.
    async fn simulate_new_sites(
        self,
        demo: std::collections::HashSet<String>,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> anyhow::Result<()> {
        use futures::StreamExt;
        let sites = self.bus.kv(names::SITES_BUCKET).await?;
        let changes = sites.watch_latest(vec![format!("{}>", keys::SITE_PREFIX)]).await?;
        tokio::pin!(changes);
        let mut running: std::collections::HashMap<String, tokio_util::sync::CancellationToken> = Default::default();
        let mut gateways = JoinSet::new();
        loop {
            let change = tokio::select! {
                _ = shutdown.cancelled() => break,
                Some(done) = gateways.join_next() => {
                    if let Ok(Err(e)) = done {
                        error!(error = %format!("{e:#}"), "a simulated site's gateway stopped");
                    }
                    continue;
                }
                c = changes.next() => c,
            };
            let Some(change) = change else { anyhow::bail!("the watch of the registered sites ended") };
            let change = change?;
            let Some(site) = keys::site_of(&change.key).filter(|s| !demo.contains(*s)).map(str::to_string) else {
                continue;
            };
            let Some(value) = change.value else {
                if let Some(stop) = running.remove(&site) {
                    info!(%site, "site removed: its simulated gateway stops");
                    stop.cancel();
                }
                continue;
            };
            if running.contains_key(&site) {
                continue;
            }
            let started = <pb::SiteDesign as prost::Message>::decode(value)
                .map_err(anyhow::Error::from)
                .and_then(|d| SiteDesign::try_from(d).map_err(anyhow::Error::from))
                .and_then(|d| Ok((self.kept_site(d.site.as_str(), &d.nodes)?, d.site)));
            match started {
                Ok((backend, id)) => {
                    let stop = shutdown.child_token();
                    self.start(&id, &backend, &mut gateways, &stop);
                    info!(%site, "a simulated gateway runs for the site registered");
                    running.insert(site, stop);
                }
                Err(e) => error!(%site, error = %format!("{e:#}"), "cannot simulate the site registered"),
            }
        }
        while gateways.join_next().await.is_some() {}
        Ok(())
    }
}

/// The demo sites that no install has ever started on.
async fn never_installed(bus: &Bus, designs: &[SiteDesign]) -> anyhow::Result<Vec<SiteId>> {
    let sagas = bus.kv(names::SAGAS_BUCKET).await?;
    let mut out = Vec::new();
    for d in designs {
        if sagas.get::<pb::SiteLease>(&names::keys::latest_install(d.site.as_str())).await?.is_none() {
            out.push(d.site.clone());
        }
    }
    Ok(out)
}

/// Installs `sites` through the bus: all at once, or one after the other (the next once the
/// one before has ended, however it ended). A failure to publish or follow is logged, not fatal:
/// the rest of `up` goes on, and the sites can be installed by hand.
async fn install_at_start(
    bus: Bus,
    sites: Vec<SiteId>,
    one_by_one: bool,
    shutdown: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    if let Err(e) = install_in_turn(&bus, sites, one_by_one, &shutdown).await {
        error!(error = %format!("{e:#}"), "the installs at startup stopped; install the remaining sites by hand");
    }
    // Done: wait for the others, as every service does.
    shutdown.cancelled().await;
    Ok(())
}

async fn install_in_turn(
    bus: &Bus,
    sites: Vec<SiteId>,
    one_by_one: bool,
    shutdown: &tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    let ends = vec![
        pb::SiteInstalled::filter(),
        pb::SiteInstallFailed::filter(),
        names::events_of_kind("command", "rejected"),
    ];
    for site in sites {
        let env = Envelope::root();
        let mut reader = bus.read_events(ends.clone(), DeliverPolicy::New).await?;
        let cmd = pb::InstallSite { site_id: site.to_string(), design_revision: 0 };
        bus.publish_command(&cmd, &env).await?;
        if !one_by_one {
            continue;
        }
        loop {
            let next = tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                n = reader.next() => n,
            };
            match next {
                Some(Ok(e)) if e.delivery.envelope.correlation == env.id => break,
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e.into()),
                None => break,
            }
        }
    }
    Ok(())
}

/// Every `every`, a new worker host appears at the next site in turn.
async fn node_arrivals(
    sims: Vec<SimSite>,
    nodes: usize,
    every: Duration,
    shutdown: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    for n in 0usize.. {
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = tick.tick() => {}
        }
        let Some(sim) = sims.get(n % sims.len().max(1)) else { return Ok(()) };
        let index = n % sims.len();
        let number = nodes + 1 + n / sims.len();
        let node = pb::NodeSpec {
            name: format!("node-{number}"),
            role: pb::Role::Worker as i32,
            boot_mac: format!("52:54:01:{:02x}:{:02x}:{:02x}", index >> 8, index & 0xff, number & 0xff),
            bmc_address: format!("ipmi://10.{}.{}.{}", 128 + (index >> 8), index & 0xff, (number + 10) & 0xff),
            labels: Default::default(),
            ..Default::default()
        };
        let node = bus_schema::domain::NodeDesign::try_from(node)?;
        if sim.arrive(&node) {
            info!(site = sim.site_id(), node = %node.name, "a new host appeared");
        }
    }
    Ok(())
}

/// What the banner reports of a running `up`.
struct Banner<'a> {
    url: &'a str,
    nats: Option<&'a NatsChild>,
    designs: &'a [SiteDesign],
    key_id: &'a str,
    store_url: &'a str,
    api: std::net::SocketAddr,
    operator_token: &'a str,
    viewer_token: &'a str,
}

fn print_banner(args: &UpArgs, banner: Banner<'_>) {
    let Banner { url, nats, designs, key_id, store_url, api, operator_token, viewer_token } = banner;
    let web = format!("http://{api}");
    let (dashboard, tokens) = if operator_token.is_empty() {
        (
            format!("{web}/"),
            format!("from {}", args.api.tokens.as_ref().map(|p| p.display().to_string()).unwrap_or_default()),
        )
    } else {
        (
            format!("{web}/#token={operator_token}"),
            format!(
                "operator {operator_token}\n             viewer   {viewer_token}   ({})",
                args.data_dir.join("api-tokens.yaml").display()
            ),
        )
    };
    let first = designs.first().map(|d| d.site.to_string()).unwrap_or_default();
    let last = designs.last().map(|d| d.site.to_string()).unwrap_or_default();
    let nats_line = match nats {
        Some(n) => format!("{url} ({}, store {})", n.version, args.data_dir.join("nats").display()),
        None => format!("{url} (from NATS_URL)"),
    };
    let url_hint = if url == DEFAULT_NATS_URL { String::new() } else { format!(" --nats-url {url}") };
    say(format_args!(
        "\nlandfall is up
  nats       {nats_line}
  services   orchestrator, kubeconfig collector + secrets, observer, distribution, {n} site gateways{more}
  artifacts  {store}
  sites      {first} .. {last}: {nodes} nodes each, simulated Metal3 + BPA ({scale}x real time)
  data key   {key} ({keyfile})
  kept in    {data}: the hub's store and the sites' hosts; up started again here carries on
             with the same fleet, up --fresh starts over
  logs       {logs}
  dashboard  {dashboard}
  HTTP API   {web}/v1 (OpenAPI: {web}/openapi.json)
  tokens     {tokens}

Try, in another shell:
  curl -H \"Authorization: Bearer {viewer}\" {web}/v1/sites
  landfall{url_hint} site install {first} --wait       (up --install none leaves installs to you)
  landfall{url_hint} events --site {first}
  landfall{url_hint} status {first}
  landfall{url_hint} package register --name kubelet --version 1.29.3 --kind binary --sha256 {sha} --size 111955968
      a newer kubelet rolls out by itself to installed sites: landfall rollout list, landfall rollout show ID
  landfall{url_hint} node add {first} --name node-{new} --role worker --mac 52:54:00:ff:00:01 --wait
  landfall{url_hint} package upload FILE --name ubuntu --version 22.04.5 --kind os-image
  landfall{url_hint} site stage {first} --wait          (artifacts into the site's cache ahead of an install)
  landfall{url_hint} kubeconfig get {first}             (once the site is installed)

Ctrl-C stops everything. What happens to the sites and rollouts:
",
        n = designs.len(),
        more = if args.simulate_new_sites { " (and one for each site registered: --simulate-new-sites)" } else { "" },
        nodes = args.nodes,
        scale = args.time_scale,
        key = key_id,
        sha = bus_schema::domain::Sha256::hex(&Sha256::digest(b"kubelet@1.29.3")),
        new = args.nodes + 100,
        keyfile = args.data_dir.join("secret.key").display(),
        data = args.data_dir.display(),
        store = store_url,
        logs = match &args.logs_to {
            Some(file) => format!("{} (up -v shows them here)", file.display()),
            None => "here".to_string(),
        },
        viewer = if viewer_token.is_empty() { "TOKEN" } else { viewer_token },
    ));
}

/// Prints a line for the person who ran `up`. A terminal or pipe that went away (`landfall up |
/// head`, a closed log reader) costs the line, not the running system: `println!` would panic.
fn say(text: std::fmt::Arguments<'_>) {
    use std::io::Write;
    if let Err(e) = writeln!(std::io::stdout().lock(), "{text}") {
        tracing::warn!(error = %e, "standard output is gone; landfall goes on without it");
    }
}
