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
use consumers::secrets::{KeyProvider, StaticKey};
use site_gateway::sim::{SimConfig, SimSite};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Subcommand)]
pub enum ServeCommand {
    /// The provisioning orchestrator (install and node-join sagas, rollouts).
    Orchestrator,
    /// The observer: keeps landfall-observed (what each node runs) from gateway reports.
    Observer,
    /// The kubeconfig collector.
    Kubeconfig(KeyArgs),
    /// A site gateway over a simulated site built from the site's registered design.
    Gateway {
        #[arg(long, env = "LANDFALL_SITE")]
        site: String,
        /// Run the simulated site this many times faster than a real one.
        #[arg(long, default_value_t = crate::up::DEFAULT_TIME_SCALE)]
        time_scale: f64,
    },
}

#[derive(Debug, clap::Args)]
pub struct KeyArgs {
    /// A file holding the 32-byte data key as 64 hex digits.
    #[arg(long, env = "LANDFALL_SECRET_KEY_FILE", conflicts_with = "secret_key")]
    pub secret_key_file: Option<PathBuf>,
    /// The data key itself, 64 hex digits (prefer the file).
    #[arg(long, env = "LANDFALL_SECRET_KEY", hide_env_values = true)]
    pub secret_key: Option<String>,
}

impl KeyArgs {
    pub fn provider(&self) -> anyhow::Result<Arc<dyn KeyProvider>> {
        let key = match (&self.secret_key_file, &self.secret_key) {
            (Some(path), _) => StaticKey::from_file(path)?,
            (None, Some(hex)) => StaticKey::from_hex(hex, "LANDFALL_SECRET_KEY")?,
            (None, None) => anyhow::bail!("no data key: pass --secret-key-file or set LANDFALL_SECRET_KEY"),
        };
        Ok(Arc::new(key))
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
            let provider = keys.provider()?;
            let bus = connect_service(url, "landfall-kubeconfig").await?;
            consumers::run_kubeconfig(bus, provider, shutdown).await?;
        }
        ServeCommand::Gateway { site, time_scale } => {
            let site = SiteId::try_from(site)?;
            let bus = connect_service(url, &format!("landfall-gateway-{site}")).await?;
            let sites = bus.kv(names::SITES_BUCKET).await?;
            let (design, _) = sites.get::<pb::SiteDesign>(&keys::site(site.as_str())).await?.with_context(|| {
                format!("site {site} is not registered: the simulated site is built from its design")
            })?;
            let design = SiteDesign::try_from(design)?;
            let backend =
                Arc::new(SimSite::new(site.as_str(), &design.nodes, SimConfig::realistic().time_scale(time_scale)));
            site_gateway::run_gateway(site, bus, backend, shutdown).await?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
