//! `landfall serve …`: one service per process.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Subcommand;
use consumers::secrets_service::{self, KeySource};

use super::gateway::{GatewayArgs, gateway};
use super::service::{connect_service, shutdown_on_signal};
use super::telemetry;
use crate::flags::{KeepingArgs, RetentionArgs, StoreArgs};

/// `landfall serve [how long the bus keeps things] <service>`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub keeping: KeepingArgs,
    #[command(subcommand)]
    pub service: ServeCommand,
}

#[derive(Debug, Subcommand)]
pub enum ServeCommand {
    /// The provisioning orchestrator (install and node-join sagas, rollouts).
    Orchestrator(RetentionArgs),
    /// The observer: keeps landfall-observed (what each node runs) from gateway reports, and
    /// which sites it hears.
    Observer(ObserverArgs),
    /// The kubeconfig collector and the secrets service (kubeconfig get, BMC credentials, key
    /// rotation), under one data key ring.
    Kubeconfig(KeyArgs),
    /// The distribution service: sends artifacts from the artifact store to site gateways.
    Distribution(StoreArgs),
    /// The HTTP API and dashboard: commands as JSON, read models, events as Server-Sent Events.
    Api(ApiServeArgs),
    /// The identity service: lets sites in (the hub's auth callout, with `deploy nats-config
    /// --site-auth enroll`), takes their requests to join, renews and revokes their credentials.
    Identity(super::identity::IdentityArgs),
    /// A site gateway: over a simulated site built from the site's registered design
    /// (`--backend sim`), or over the site's Metal3 and BPA (`--backend kube`).
    Gateway(Box<GatewayArgs>),
}

#[derive(Debug, clap::Args)]
pub struct ApiServeArgs {
    #[command(flatten)]
    pub api: crate::api::ApiArgs,
    /// At a core (`deploy core-config`): serve this region's API under `/regions/<region>/`,
    /// read and commanded through the region's hub's JetStream domain, and list the regions at
    /// `/v1/regions` (repeated for each region; `deploy region-link` first). Without it, the API
    /// of the hub the service is connected to.
    #[arg(long = "region")]
    pub regions: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub struct ObserverArgs {
    /// A site whose gateway is not heard for this long is counted cut off (gateways say they
    /// are there every `--alive-every`, 15 s by default).
    #[arg(long, env = "LANDFALL_CUT_OFF_AFTER", value_parser = crate::flags::parse_duration, default_value = "60s")]
    pub cut_off_after: std::time::Duration,
}

#[derive(Debug, clap::Args)]
pub struct KeyArgs {
    /// A file of data keys, one per line as 64 hex digits (the first seals, the others only
    /// open), readable by its owner only; `landfall kubeconfig rotate-key` rewrites it. Keys
    /// are never taken from the command line or the environment, where other processes of the
    /// machine can read them. With --pkcs11-module, the file holds the keys wrapped under a
    /// key-encryption key in that PKCS#11 token (see `landfall secrets hsm-init`).
    #[arg(long, env = "LANDFALL_SECRET_KEY_FILE")]
    pub secret_key_file: Option<PathBuf>,
    #[command(flatten)]
    pub pkcs11: crate::cli::hsm::Pkcs11Args,
}

impl KeyArgs {
    pub fn source(&self) -> anyhow::Result<KeySource> {
        match (&self.secret_key_file, self.pkcs11.token()?) {
            (Some(path), None) => Ok(KeySource::File(path.clone())),
            (Some(path), Some(token)) => Ok(KeySource::Pkcs11 { token, ring_file: path.clone() }),
            (None, Some(_)) => anyhow::bail!(
                "no key ring: pass --secret-key-file (the ring of wrapped data keys `landfall secrets hsm-init` made)"
            ),
            (None, None) => {
                anyhow::bail!("no data key: pass --secret-key-file (a file of 64-hex-digit keys, mode 0600)")
            }
        }
    }
}

pub async fn run(args: ServeArgs, url: &str) -> anyhow::Result<ExitCode> {
    let shutdown = shutdown_on_signal();
    let keeping = &args.keeping;
    match args.service {
        ServeCommand::Orchestrator(retention) => {
            let bus = connect_service(url, "landfall-orchestrator", keeping, true).await?;
            consumers::run_orchestrator(bus, retention.policy(), shutdown).await?;
        }
        ServeCommand::Observer(observer) => {
            let bus = connect_service(url, "landfall-observer", keeping, false).await?;
            let policy = bus_schema::retention::StorePolicy::default();
            consumers::run_observer_with(bus, policy, observer.cut_off_after, shutdown).await?;
        }
        ServeCommand::Kubeconfig(keys) => {
            let source = keys.source()?;
            let bus = connect_service(url, "landfall-kubeconfig", keeping, false).await?;
            let ring = secrets_service::open_key_ring(&bus, source).await?;
            secrets_service::run_secrets(bus, ring, shutdown).await?;
        }
        ServeCommand::Distribution(store) => {
            let store = store.open_or_default(None)?;
            let bus = connect_service(url, "landfall-distribution", keeping, false).await?;
            consumers::run_distribution(bus, store, Default::default(), shutdown).await?;
        }
        ServeCommand::Gateway(args) => gateway(*args, url, shutdown).await?,
        ServeCommand::Identity(args) => {
            let bus = connect_service(url, "landfall-identity", keeping, false).await?;
            super::identity::serve(&args, bus, url, shutdown).await?;
        }
        ServeCommand::Api(ApiServeArgs { api: args, regions }) => {
            let tokens = match &args.tokens {
                Some(path) => crate::api::auth::Tokens::from_file(path)?,
                None => anyhow::bail!("no tokens: pass --api-tokens FILE (or set LANDFALL_API_TOKENS_FILE)"),
            };
            // At a core, the streams and buckets are the regions', made by their own services.
            let bus = match regions.is_empty() {
                true => connect_service(url, "landfall-api", keeping, false).await?,
                false => bus_schema::runtime::Bus::connect_with(url, "landfall-api", crate::nats_access::get()).await?,
            };
            let metrics = telemetry::prometheus()?;
            let render: crate::api::MetricsRender = Arc::new(move || telemetry::render(&metrics));
            let gate = args.gate(tokens).await?;
            let (_, task) = match regions.is_empty() {
                true => crate::api::serve(bus, gate, args.listen, Some(render), shutdown).await?,
                false => {
                    crate::api::regions::serve_regions(bus, &regions, gate, args.listen, Some(render), shutdown).await?
                }
            };
            task.await??;
        }
    }
    Ok(ExitCode::SUCCESS)
}
