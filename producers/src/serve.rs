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
    /// A site gateway over a simulated site built from the site's registered design.
    Gateway {
        #[arg(long, env = "LANDFALL_SITE")]
        site: String,
        /// The site's artifact cache (content-addressed, verified).
        #[arg(long, env = "LANDFALL_CACHE_DIR", default_value = "./landfall-cache")]
        cache_dir: PathBuf,
        /// Run the simulated site this many times faster than a real one.
        #[arg(long, default_value_t = crate::up::DEFAULT_TIME_SCALE)]
        time_scale: f64,
    },
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

/// Connects and makes sure the streams and buckets exist.
pub async fn connect_service(url: &str, name: &str) -> anyhow::Result<Bus> {
    let bus = Bus::connect(url, name).await?;
    bus.ensure_topology(&Topology::default()).await?;
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
        ServeCommand::Gateway { site, cache_dir, time_scale } => {
            let site = SiteId::try_from(site)?;
            let bus = connect_service(url, &format!("landfall-gateway-{site}")).await?;
            let sites = bus.kv(names::SITES_BUCKET).await?;
            let (design, _) = sites.get::<pb::SiteDesign>(&keys::site(site.as_str())).await?.with_context(|| {
                format!("site {site} is not registered: the simulated site is built from its design")
            })?;
            let design = SiteDesign::try_from(design)?;
            let backend =
                Arc::new(SimSite::new(site.as_str(), &design.nodes, SimConfig::realistic().time_scale(time_scale)));
            let cache = site_gateway::ArtifactCache::new(cache_dir);
            site_gateway::run_gateway(site, bus, backend, cache, shutdown).await?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
