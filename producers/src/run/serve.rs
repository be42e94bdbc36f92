//! `landfall serve …`: one service per process.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use bus_schema::domain::{SiteDesign, SiteId};
use bus_schema::names::{self, keys};
use bus_schema::pb;
use bus_schema::runtime::{Bus, Topology};
use clap::Subcommand;
use consumers::artifacts::{ArtifactStore, S3Options};
use consumers::secrets_service::{self, KeySource};
use site_gateway::kube_site::{KubeSite, KubeSiteConfig, KubeconfigSource, UserData};
use site_gateway::sim::{SimConfig, SimSite};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Subcommand)]
pub enum ServeCommand {
    /// The provisioning orchestrator (install and node-join sagas, rollouts).
    Orchestrator,
    /// The observer: keeps landfall-observed (what each node runs) from gateway reports.
    Observer,
    /// The kubeconfig collector and the secrets service (kubeconfig get, BMC credentials, key
    /// rotation), under one data key ring.
    Kubeconfig(KeyArgs),
    /// The distribution service: sends artifacts from the artifact store to site gateways.
    Distribution(StoreArgs),
    /// The HTTP API and dashboard: commands as JSON, read models, events as Server-Sent Events.
    Api(crate::api::ApiArgs),
    /// A site gateway: over a simulated site built from the site's registered design
    /// (`--backend sim`), or over the site's Metal3 and BPA (`--backend kube`).
    Gateway(Box<GatewayArgs>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// A simulated site with Metal3's state machine and timings.
    Sim,
    /// The site's Kubernetes API: BareMetalHosts, the BPA's resources and REST API.
    Kube,
}

#[derive(Debug, clap::Args)]
pub struct GatewayArgs {
    #[arg(long, env = "LANDFALL_SITE")]
    pub site: String,
    #[arg(long, value_enum, env = "LANDFALL_BACKEND", default_value = "sim")]
    pub backend: BackendKind,
    /// The site's artifact cache (content-addressed, verified).
    #[arg(long, env = "LANDFALL_CACHE_DIR", default_value = "./landfall-cache")]
    pub cache_dir: PathBuf,
    /// sim: run the simulated site this many times faster than a real one.
    #[arg(long, default_value_t = crate::run::up::DEFAULT_TIME_SCALE)]
    pub time_scale: f64,
    /// sim: keep the simulated site in this file, so that a restarted gateway finds its hosts
    /// as it left them (a real site's hosts outlive its gateway).
    #[arg(long, env = "LANDFALL_SIM_STATE")]
    pub sim_state: Option<PathBuf>,
    #[command(flatten)]
    pub kube: KubeArgs,
}

/// How `--backend kube` reaches the site.
#[derive(Debug, clap::Args)]
pub struct KubeArgs {
    /// The site's bootstrap cluster (Metal3, BPA); in a pod, the in-cluster config is used
    /// when this is not given.
    #[arg(long, env = "LANDFALL_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// The namespace of the site's BareMetalHosts and BPA resources.
    #[arg(long, env = "LANDFALL_NAMESPACE", default_value = "metal3")]
    pub namespace: String,
    /// The BPA cluster's name (the Provisioning resource's name and `cluster` label) [default: the site id].
    #[arg(long)]
    pub cluster: Option<String>,
    /// The BPA cluster's `owner` label.
    #[arg(long, default_value = "landfall")]
    pub owner: String,
    /// KUD plugins the BPA installs (repeat the flag).
    #[arg(long = "kud-plugin")]
    pub kud_plugins: Vec<String>,
    #[arg(long, default_value = "10.244.64.0/18")]
    pub pod_subnet: String,
    /// Where Ironic fetches os-images: the site cache served over HTTP (`<url>/sha256/<hex>`).
    #[arg(long, default_value = "http://localhost:8080/")]
    pub image_base_url: String,
    /// Every host's user data is this existing Secret, instead of one the gateway writes per host.
    #[arg(long)]
    pub user_data_secret: Option<String>,
    /// SSH public keys for the user data the gateway writes (files, repeat the flag).
    #[arg(long = "ssh-authorized-key")]
    pub ssh_authorized_keys: Vec<PathBuf>,
    /// The application cluster's kubeconfig is this file (the BPA's admin.conf) instead of the
    /// Secret `<cluster>-kubeconfig`.
    #[arg(long)]
    pub cluster_kubeconfig_file: Option<PathBuf>,
    /// The BPA's REST API (e.g. http://bpa:9015), which staged artifacts are uploaded to.
    #[arg(long, env = "LANDFALL_BPA_URL")]
    pub bpa_url: Option<String>,
    /// Where hosts.ini and container-package inventories are kept [default: <cache-dir>/state].
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// How long a host may take to provision before its job fails.
    #[arg(long, value_parser = crate::flags::parse_duration, default_value = "2h")]
    pub provision_timeout: std::time::Duration,
    /// How long the BPA may take to build the cluster.
    #[arg(long, value_parser = crate::flags::parse_duration, default_value = "3h")]
    pub install_timeout: std::time::Duration,
}

impl KubeArgs {
    /// The backend's settings for `site`.
    pub fn config(&self, site: &str, cache_dir: &std::path::Path) -> anyhow::Result<KubeSiteConfig> {
        let mut cfg =
            KubeSiteConfig::new(site, &self.namespace, self.state_dir.clone().unwrap_or(cache_dir.join("state")));
        if let Some(cluster) = &self.cluster {
            cfg.cluster = cluster.clone();
            cfg.cluster_kubeconfig = KubeconfigSource::Secret(format!("{cluster}-kubeconfig"));
        }
        cfg.owner = self.owner.clone();
        cfg.kud_plugins = self.kud_plugins.clone();
        cfg.pod_subnet = self.pod_subnet.clone();
        cfg.image_base_url = self.image_base_url.clone();
        cfg.user_data = match &self.user_data_secret {
            Some(name) => UserData::Existing(name.clone()),
            None => {
                let mut keys = Vec::new();
                for path in &self.ssh_authorized_keys {
                    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
                    keys.extend(
                        text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(String::from),
                    );
                }
                UserData::Generated { ssh_authorized_keys: keys }
            }
        };
        if let Some(path) = &self.cluster_kubeconfig_file {
            cfg.cluster_kubeconfig = KubeconfigSource::File(path.clone());
        }
        cfg.bpa_url = self.bpa_url.clone();
        cfg.provision_timeout = self.provision_timeout;
        cfg.install_timeout = self.install_timeout;
        Ok(cfg)
    }

    /// A client of the site's bootstrap cluster: the kubeconfig given, else in-cluster or the
    /// usual kubeconfig lookup.
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        let config = match &self.kubeconfig {
            Some(path) => {
                let kubeconfig = kube::config::Kubeconfig::read_from(path)
                    .with_context(|| format!("reading the kubeconfig {}", path.display()))?;
                kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?
            }
            None => kube::Config::infer().await.context("no --kubeconfig, and no in-cluster or default config")?,
        };
        Ok(kube::Client::try_from(config)?)
    }
}

/// Runs one site's gateway until `shutdown`.
pub async fn gateway(args: GatewayArgs, url: &str, shutdown: CancellationToken) -> anyhow::Result<()> {
    let site = SiteId::try_from(args.site.clone())?;
    // A site's user may not create streams: the hub's services do.
    let bus = Bus::connect_with(url, &format!("landfall-gateway-{site}"), crate::nats_access::get()).await?;
    let cache = site_gateway::ArtifactCache::new(&args.cache_dir);
    match args.backend {
        BackendKind::Sim => {
            bus.wait_for_stream(&names::kv_stream(names::SITES_BUCKET), &shutdown).await?;
            let sites = bus.kv(names::SITES_BUCKET).await?;
            let (design, _) = sites.get::<pb::SiteDesign>(&keys::site(site.as_str())).await?.with_context(|| {
                format!("site {site} is not registered: the simulated site is built from its design")
            })?;
            let design = SiteDesign::try_from(design)?;
            let config = SimConfig::realistic().time_scale(args.time_scale);
            let backend = Arc::new(match &args.sim_state {
                Some(path) => SimSite::with_state_file(site.as_str(), &design.nodes, config, path)?,
                None => SimSite::new(site.as_str(), &design.nodes, config),
            });
            // `landfall node add` makes a host appear at the simulated site.
            let control =
                site_gateway::serve_sim_control(site.clone(), bus.clone(), (*backend).clone(), shutdown.clone());
            let control = tokio::spawn(control);
            let result = site_gateway::run_gateway(site, bus, backend, cache, shutdown).await;
            control.abort();
            result
        }
        BackendKind::Kube => {
            consumers::artifacts::install_tls_provider();
            let cfg = args.kube.config(site.as_str(), &args.cache_dir)?;
            let client = args.kube.client().await?;
            tracing::info!(%site, namespace = %cfg.namespace, cluster = %cfg.cluster, "kube backend");
            let backend = Arc::new(KubeSite::new(client, cfg, cache.clone())?);
            site_gateway::run_gateway(site, bus, backend, cache, shutdown).await
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct KeyArgs {
    /// A file of data keys, one per line as 64 hex digits (the first seals, the others only
    /// open); `landfall kubeconfig rotate-key` rewrites it.
    #[arg(long, env = "LANDFALL_SECRET_KEY_FILE", conflicts_with = "secret_key")]
    pub secret_key_file: Option<PathBuf>,
    /// The data key itself, 64 hex digits (prefer the file: a key given here cannot rotate).
    #[arg(long, env = "LANDFALL_SECRET_KEY", hide_env_values = true)]
    pub secret_key: Option<String>,
}

impl KeyArgs {
    pub fn source(&self) -> anyhow::Result<KeySource> {
        Ok(match (&self.secret_key_file, &self.secret_key) {
            (Some(path), _) => KeySource::File(path.clone()),
            (None, Some(hex)) => KeySource::Hex { hex: hex.clone(), from: "LANDFALL_SECRET_KEY".into() },
            (None, None) => anyhow::bail!("no data key: pass --secret-key-file or set LANDFALL_SECRET_KEY"),
        })
    }
}

/// Where artifacts are kept.
#[derive(Debug, Clone, clap::Args)]
pub struct StoreArgs {
    /// The artifact store: a directory, file:///path, or s3://bucket[/prefix] (credentials from
    /// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY). Clients that do not name one use the store
    /// the distribution service announces.
    #[arg(long, env = "LANDFALL_STORE")]
    pub store: Option<String>,
    /// The S3 endpoint, e.g. http://127.0.0.1:9000 (default: AWS_ENDPOINT, else AWS itself).
    #[arg(long, env = "LANDFALL_S3_ENDPOINT")]
    pub s3_endpoint: Option<String>,
    /// The S3 region (default: AWS_REGION, else us-east-1).
    #[arg(long, env = "LANDFALL_S3_REGION")]
    pub s3_region: Option<String>,
    /// Allow plain http to the S3 endpoint.
    #[arg(long, env = "LANDFALL_S3_ALLOW_HTTP")]
    pub s3_allow_http: bool,
}

/// The artifact store of a data directory when none is named.
pub const DEFAULT_STORE: &str = "./landfall-data/artifacts";

impl StoreArgs {
    pub fn s3(&self) -> S3Options {
        S3Options {
            endpoint: self.s3_endpoint.clone(),
            region: self.s3_region.clone(),
            allow_http: self.s3_allow_http,
            credentials: None,
        }
    }

    /// The named store, else `announced` (what the distribution service serves), else
    /// [`DEFAULT_STORE`].
    pub fn open_or_default(&self, announced: Option<&str>) -> anyhow::Result<ArtifactStore> {
        let location = self.store.as_deref().or(announced).unwrap_or(DEFAULT_STORE);
        ArtifactStore::open(location, &self.s3()).with_context(|| format!("open the artifact store {location}"))
    }
}

/// A token cancelled on SIGINT or SIGTERM.
pub fn shutdown_on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        let term = async {
            match term.as_mut() {
                Some(t) => {
                    t.recv().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term => {}
        }
        tracing::info!("shutting down");
        t.cancel();
    });
    token
}

/// Connects (as this process's NATS user) and makes sure the streams and buckets exist: three
/// replicas of each on a JetStream cluster, one on a single server.
pub async fn connect_service(url: &str, name: &str) -> anyhow::Result<Bus> {
    let bus = Bus::connect_with(url, name, crate::nats_access::get()).await?;
    bus.ensure_topology_within(&Topology::for_server(&bus), std::time::Duration::from_secs(60)).await?;
    Ok(bus)
}

pub async fn run(cmd: ServeCommand, url: &str) -> anyhow::Result<ExitCode> {
    let shutdown = shutdown_on_signal();
    match cmd {
        ServeCommand::Orchestrator => {
            let bus = connect_service(url, "landfall-orchestrator").await?;
            consumers::run_orchestrator(bus, shutdown).await?;
        }
        ServeCommand::Observer => {
            let bus = connect_service(url, "landfall-observer").await?;
            consumers::run_observer(bus, shutdown).await?;
        }
        ServeCommand::Kubeconfig(keys) => {
            let source = keys.source()?;
            let bus = connect_service(url, "landfall-kubeconfig").await?;
            let ring = secrets_service::open_key_ring(&bus, source).await?;
            secrets_service::run_secrets(bus, ring, shutdown).await?;
        }
        ServeCommand::Distribution(store) => {
            let store = store.open_or_default(None)?;
            let bus = connect_service(url, "landfall-distribution").await?;
            consumers::run_distribution(bus, store, Default::default(), shutdown).await?;
        }
        ServeCommand::Gateway(args) => gateway(*args, url, shutdown).await?,
        ServeCommand::Api(args) => {
            let tokens = match &args.tokens {
                Some(path) => crate::api::auth::Tokens::from_file(path)?,
                None => anyhow::bail!("no tokens: pass --api-tokens FILE (or set LANDFALL_API_TOKENS_FILE)"),
            };
            let bus = connect_service(url, "landfall-api").await?;
            let metrics = crate::run::telemetry::prometheus()?;
            let render: crate::api::MetricsRender = Arc::new(move || crate::run::telemetry::render(&metrics));
            let (_, task) = crate::api::serve(bus, tokens, args.listen, Some(render), shutdown).await?;
            task.await??;
        }
    }
    Ok(ExitCode::SUCCESS)
}
