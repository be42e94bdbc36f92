//! One site's gateway in this process: over a simulated site built from the site's registered
//! design, or over the site's Metal3 and BPA; `landfall serve gateway` and the
//! `landfall-gateway` program both run it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use bus_schema::domain::{SiteDesign, SiteId};
use bus_schema::names::{self, keys};
use bus_schema::pb;
use bus_schema::runtime::{Access, Bus};
use clap::{CommandFactory, FromArgMatches, Parser};
use site_gateway::kube_site::{KubeSite, KubeSiteConfig, KubeconfigSource, UserData};
use site_gateway::sim::{SimConfig, SimSite};
use tokio_util::sync::CancellationToken;

use super::gateway_identity::{self, IdentityArgs, IdentityCommand};
use super::service::{block_on, shutdown_on_signal};
use super::telemetry;
use crate::flags::parse_duration;
use crate::nats_access::{self, DEFAULT_NATS_URL};

/// Simulated sites run this many times faster than real ones: an 8-minute OS provisioning
/// takes 8 seconds.
pub const DEFAULT_TIME_SCALE: f64 = 60.0;

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
    /// The most bytes the artifact cache keeps: past it, what no current package or job needs
    /// goes, least recently used first (the current versions are kept even past it).
    #[arg(long, env = "LANDFALL_CACHE_MAX_BYTES", default_value_t = bus_schema::retention::SITE_CACHE_BYTES)]
    pub cache_max_bytes: u64,
    /// sim: run the simulated site this many times faster than a real one.
    #[arg(long, default_value_t = DEFAULT_TIME_SCALE)]
    pub time_scale: f64,
    /// sim: keep the simulated site in this file, so that a restarted gateway finds its hosts
    /// as it left them (a real site's hosts outlive its gateway).
    #[arg(long, env = "LANDFALL_SIM_STATE")]
    pub sim_state: Option<PathBuf>,
    /// How often the gateway tells the hub it is there (the hub's observer counts a site cut
    /// off after its `--cut-off-after` without word of it).
    #[arg(long, env = "LANDFALL_ALIVE_EVERY", value_parser = parse_duration, default_value = "15s")]
    pub alive_every: std::time::Duration,
    /// How long a node of a patch is out of service before its steps (cordoned, drained,
    /// uncordoned) are sent as events of their own; a node back sooner carries them in its
    /// report, one event instead of four. Likewise, how long a site's part of a rollout runs
    /// before its nodes' reports are sent on their own; a site done sooner carries them in its
    /// report. `0s`: every step and report on its own, as it happens.
    #[arg(long, env = "LANDFALL_SHOW_STEPS_AFTER", value_parser = parse_duration, default_value = "2s")]
    pub show_steps_after: std::time::Duration,
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
    /// The namespace of the site's BareMetalHosts, and of its BPA or Cluster API resources.
    #[arg(long, env = "LANDFALL_NAMESPACE", default_value = "metal3")]
    pub namespace: String,
    /// The cluster's name: the BPA's (its Provisioning resource's name and `cluster` label), or
    /// the Cluster API `Cluster`'s (its kubeconfig the Secret `<cluster>-kubeconfig`) [default:
    /// the site id].
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
    #[arg(long, value_parser = parse_duration, default_value = "2h")]
    pub provision_timeout: std::time::Duration,
    /// How long the BPA or Cluster API may take to build the cluster (or take it down).
    #[arg(long, value_parser = parse_duration, default_value = "3h")]
    pub install_timeout: std::time::Duration,
    /// How long a node's pods may take to leave it (evictions a disruption budget refuses are
    /// tried again meanwhile) before its patch fails and it is made schedulable again.
    #[arg(long, value_parser = parse_duration, default_value = "15m")]
    pub drain_timeout: std::time::Duration,
    /// How long a patched node may take to show Ready at its new version before it fails
    /// (it stays cordoned).
    #[arg(long, value_parser = parse_duration, default_value = "15m")]
    pub ready_timeout: std::time::Duration,
    /// How long a container package's Deployments, DaemonSets and StatefulSets may take to be
    /// available, and its Jobs to complete, before the package fails naming what was not.
    #[arg(long, value_parser = parse_duration, default_value = "15m")]
    pub workload_timeout: std::time::Duration,
    /// How often the site's helm chart releases are checked against their renders (what drifted
    /// is reported, and put back where the package says so); 0: only when asked (`landfall
    /// package drift`).
    #[arg(long, value_parser = parse_duration, default_value = "15m")]
    pub drift_every: std::time::Duration,
    /// What a drain does with pods no controller would bring back: refuse (fail the node, naming
    /// them) or evict (they are gone for good).
    #[arg(long, value_enum, default_value = "refuse")]
    pub drain_unmanaged_pods: DrainUnmanaged,
    /// The image of the Job that installs a binary on the one node a patch is for (it needs
    /// sh, wget, sha256sum, install and chroot); the BPA's per-role Software moves only once
    /// the whole role runs the version.
    #[arg(long, default_value = "docker.io/library/busybox:1.36")]
    pub upgrade_image: String,
    /// The application cluster's namespace that Job runs in.
    #[arg(long, default_value = "kube-system")]
    pub upgrade_namespace: String,
    /// How long that Job may take before the node's patch fails.
    #[arg(long, value_parser = parse_duration, default_value = "15m")]
    pub upgrade_timeout: std::time::Duration,
}

/// `--drain-unmanaged-pods`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DrainUnmanaged {
    Refuse,
    Evict,
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
        cfg.drain_timeout = self.drain_timeout;
        cfg.ready_timeout = self.ready_timeout;
        cfg.workload_timeout = self.workload_timeout;
        cfg.drift_every = (!self.drift_every.is_zero()).then_some(self.drift_every);
        cfg.upgrade_image = self.upgrade_image.clone();
        cfg.upgrade_namespace = self.upgrade_namespace.clone();
        cfg.upgrade_timeout = self.upgrade_timeout;
        cfg.unmanaged_pods = match self.drain_unmanaged_pods {
            DrainUnmanaged::Refuse => site_gateway::kube_site::UnmanagedPods::Refuse,
            DrainUnmanaged::Evict => site_gateway::kube_site::UnmanagedPods::Evict,
        };
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
    let access = Access { site: Some(site.to_string()), ..nats_access::get().clone() };
    let bus = Bus::connect_with(url, &format!("landfall-gateway-{site}"), &access).await?;
    let cache = site_gateway::ArtifactCache::new(&args.cache_dir).with_max_bytes(args.cache_max_bytes);
    let (alive_every, steps_after) = (args.alive_every, args.show_steps_after);
    match args.backend {
        BackendKind::Sim => {
            let design = sim_design(&bus, &site, args.sim_state.as_deref(), &shutdown).await?;
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
            let result =
                site_gateway::run_gateway_showing_steps(site, bus, backend, cache, alive_every, steps_after, shutdown)
                    .await;
            control.abort();
            result
        }
        BackendKind::Kube => {
            consumers::artifacts::install_tls_provider();
            let cfg = args.kube.config(site.as_str(), &args.cache_dir)?;
            let client = args.kube.client().await?;
            tracing::info!(%site, namespace = %cfg.namespace, cluster = %cfg.cluster, "kube backend");
            let backend = Arc::new(KubeSite::new(client, cfg, cache.clone())?);
            site_gateway::run_gateway_showing_steps(site, bus, backend, cache, alive_every, steps_after, shutdown).await
        }
    }
}

/// `landfall-gateway`: one site's gateway as a program of its own (what `landfall serve
/// gateway` runs), for a site's bootstrap machine or a pod there.
#[derive(Debug, Parser)]
#[command(name = "landfall-gateway", version, about = "One site's gateway: the site's jobs in, its events out.")]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct GatewayCli {
    #[command(subcommand)]
    pub command: Option<GatewayCommand>,
    /// NATS server (the hub, or the site's leaf node).
    #[arg(long, env = "NATS_URL", default_value = DEFAULT_NATS_URL)]
    pub nats_url: String,
    #[command(flatten)]
    pub nats: nats_access::NatsAccessArgs,
    #[command(flatten)]
    pub identity: IdentityArgs,
    #[command(flatten)]
    pub gateway: GatewayArgs,
    #[command(flatten)]
    pub telemetry: telemetry::TelemetryArgs,
}

/// What `landfall-gateway` does besides running the gateway.
#[derive(Debug, clap::Subcommand)]
pub enum GatewayCommand {
    /// The gateway's identity: the key pair it connects to NATS with, sealed to the machine's TPM.
    #[command(subcommand)]
    Identity(IdentityCommand),
}

/// The `landfall-gateway` program.
pub fn main() -> ExitCode {
    // A subcommand is parsed on its own: the gateway's required flags are not its.
    let matches = GatewayCli::command().get_matches();
    if let Some(("identity", identity)) = matches.subcommand() {
        return gateway_identity::run(IdentityCommand::from_arg_matches(identity).unwrap_or_else(|e| e.exit()));
    }
    let cli = GatewayCli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    telemetry::init_logs(cli.telemetry.log_format, "info,async_nats=warn");
    block_on(async move {
        let shutdown = shutdown_on_signal();
        let hub_url = cli.identity.hub_url.clone().unwrap_or_else(|| cli.nats_url.clone());
        let site = cli.gateway.site.clone();
        match gateway_identity::enrolled(&cli.nats, &cli.identity, &site, &hub_url, shutdown.clone()).await? {
            Some((access, keys)) => {
                nats_access::set(access);
                // Renewed through the connection's own server (the hub, or the leaf node whose
                // link these credentials hold up), else at the hub.
                let renewing = site_gateway::enrollment::keep_renewed(
                    cli.nats_url.clone(),
                    hub_url.clone(),
                    keys,
                    shutdown.clone(),
                );
                tokio::spawn(renewing);
            }
            None => nats_access::set(gateway_identity::access(&cli.nats, &cli.identity)?),
        }
        let telemetry = telemetry::start(&cli.telemetry).await?;
        let result = gateway(cli.gateway, &cli.nats_url, shutdown).await;
        telemetry.finish().await;
        result.map(|()| ExitCode::SUCCESS)
    })
}

/// The design a simulated site is built from: the hub's. A site kept in a file keeps the design
/// it was last built from beside it, and a gateway that starts while the hub is out of reach (its
/// link cut) builds the site from that, as a real site has its hosts whether the hub answers or not.
async fn sim_design(
    bus: &Bus,
    site: &SiteId,
    state: Option<&std::path::Path>,
    shutdown: &CancellationToken,
) -> anyhow::Result<pb::SiteDesign> {
    use prost::Message;
    let kept = state.map(|p| p.with_extension("design.pb"));
    // Read the way a site may: its own key, by a direct get (no stream info).
    let from_hub = async {
        let stream = bus.jetstream().get_stream_no_info(names::kv_stream(names::SITES_BUCKET)).await?;
        let subject = format!("$KV.{}.{}", names::SITES_BUCKET, keys::site(site.as_str()));
        let not_registered =
            || anyhow::anyhow!("site {site} is not registered: the simulated site is built from its design");
        loop {
            match stream.direct_get_last_for_subject(&subject).await {
                Ok(m) if m.headers.get(names::headers::KV_OPERATION).is_some() => return Err(not_registered()),
                Ok(m) => return Ok(pb::SiteDesign::decode(m.payload)?),
                Err(e) if e.kind() == async_nats::jetstream::stream::DirectGetErrorKind::NotFound => {
                    return Err(not_registered());
                }
                // The hub's stores are not there yet, or not reachable.
                Err(e) => {
                    tracing::debug!(%site, error = %e, "the site's design cannot be read yet; asking again");
                    tokio::select! {
                        _ = shutdown.cancelled() => anyhow::bail!("stopped before the site's design could be read"),
                        _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                    }
                }
            }
        }
    };
    let kept_design =
        kept.as_ref().and_then(|p| std::fs::read(p).ok()).and_then(|b| pb::SiteDesign::decode(b.as_slice()).ok());
    let design = match kept_design {
        None => from_hub.await?,
        Some(kept_design) => match tokio::time::timeout(std::time::Duration::from_secs(2), from_hub).await {
            Ok(design) => design?,
            Err(_) => {
                tracing::warn!(%site, "the hub is out of reach: the simulated site is built from the design it was last built from");
                return Ok(kept_design);
            }
        },
    };
    if let Some(path) = &kept
        && let Err(e) = std::fs::write(path, design.encode_to_vec())
    {
        tracing::warn!(%site, path = %path.display(), error = %e, "cannot keep the site's design beside its state");
    }
    Ok(design)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_is_well_formed() {
        GatewayCli::command().debug_assert();
    }

    #[test]
    fn the_identity_commands_need_no_site_and_the_gateway_does() {
        let matches = GatewayCli::command()
            .try_get_matches_from(["landfall-gateway", "identity", "show", "--identity-dir", "/id", "--tpm", "none"])
            .unwrap();
        let (name, sub) = matches.subcommand().unwrap();
        assert_eq!(name, "identity");
        match IdentityCommand::from_arg_matches(sub).unwrap() {
            IdentityCommand::Show(args) => {
                assert_eq!(args.identity_dir, std::path::Path::new("/id"));
                assert_eq!(args.tpm, site_gateway::identity::TpmChoice::None);
            }
            other => panic!("{other:?}"),
        }
        assert!(GatewayCli::try_parse_from(["landfall-gateway"]).is_err());
        assert!(GatewayCli::try_parse_from(["landfall-gateway", "--site", "s", "identity", "show"]).is_err());
        let cli = GatewayCli::try_parse_from(["landfall-gateway", "--site", "s", "--identity-dir", "/id"]).unwrap();
        assert_eq!(cli.gateway.site, "s");
        assert_eq!(cli.identity.identity_dir.as_deref(), Some(std::path::Path::new("/id")));
        assert_eq!(cli.identity.tpm, site_gateway::identity::TpmChoice::Auto);
        // One key or the other, not both.
        let both = ["landfall-gateway", "--site", "s", "--identity-dir", "/id", "--nats-nkey-file", "/k"];
        assert!(GatewayCli::try_parse_from(both).is_err());
    }
}
