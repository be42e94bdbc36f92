//! The `landfall` command line: publish commands, read events and state, run services, and
//! run the whole system on one machine (`landfall up`).
//!
//! The client commands ([`client`]) use only `bus-schema`; `up` and `serve` wire in the
//! consumers and site gateways, which is why this crate depends on them.

pub mod api;
pub mod artifacts_cli;
pub mod bench;
pub mod client;
pub mod deploy;
pub mod design;
pub mod fleet;
pub mod nats_access;
pub mod output;
pub mod progress;
pub mod run;
pub mod secrets_cli;

pub use bench::transfer as bench_transfer;
pub use run::{embedded, up};
use run::{serve, telemetry};

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Brings up and patches fleets of bare-metal edge sites, event-driven on NATS JetStream.
///
/// Start here: `landfall up` runs everything on this machine (a nats-server, every service,
/// simulated sites, and the HTTP API with its live dashboard; it prints the URL and tokens) and
/// installs the sites one by one so there is something to watch. Then, from another shell:
/// `landfall status`, `landfall events -f`, `landfall site install edge-01 --wait`.
///
/// Every command takes `--help`; `-o json|yaml` prints what a command reads for programs.
#[derive(Debug, Parser)]
#[command(name = "landfall", version)]
pub struct Cli {
    /// NATS server to talk to [default: nats://127.0.0.1:4222]. For `up`: use this server
    /// instead of starting one.
    #[arg(long, global = true, env = "NATS_URL")]
    pub nats_url: Option<String>,
    #[command(flatten)]
    pub nats: nats_access::NatsAccessArgs,
    #[command(flatten)]
    pub telemetry: telemetry::TelemetryArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the whole system on this machine: nats-server (unless NATS_URL is set), every
    /// service, simulated sites, and the HTTP API and dashboard. Ctrl-C stops it.
    Up(up::UpArgs),
    /// Register and install sites.
    #[command(subcommand)]
    Site(SiteCommand),
    /// Site design documents: profiles, nodes, cluster selection (validate, diff, apply, show).
    #[command(subcommand)]
    Design(design::DesignCommand),
    /// The package catalog: register, list, and patch the fleet to a version.
    #[command(subcommand)]
    Package(PackageCommand),
    /// Rollouts started by `package patch` or by an auto-rollout policy: list, show, pause,
    /// resume, cancel.
    #[command(subcommand)]
    Rollout(RolloutCommand),
    /// Nodes of a site: add a host to a simulated site (it then joins the cluster).
    #[command(subcommand)]
    Node(NodeCommand),
    /// Print events, oldest first.
    Events(EventsArgs),
    /// Show sites, their nodes, and the latest install.
    Status(StatusArgs),
    /// Site kubeconfigs (opened by the secrets service), and rotation of the data key that
    /// seals every stored secret.
    #[command(subcommand)]
    Kubeconfig(secrets_cli::KubeconfigCommand),
    /// BMC credentials of hosts: stored sealed, handed to a gateway only for a job that
    /// drives the BMC.
    #[command(subcommand)]
    Bmc(secrets_cli::BmcCommand),
    /// Run one service in this process (for deployments that run services apart).
    #[command(subcommand)]
    Serve(serve::ServeCommand),
    /// Deployment files: `deploy nats-config` writes the hub's and every site's NATS
    /// configuration and keys.
    #[command(subcommand)]
    Deploy(deploy::DeployCommand),
    /// Measure landfall against raw JetStream on a real nats-server.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Print a shell completion script, e.g. `landfall completions bash > /etc/bash_completion.d/landfall`
    /// (bash, zsh, fish, elvish, powershell).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, Subcommand)]
pub enum SiteCommand {
    /// Register (or replace) a site's design from a YAML file.
    Register {
        /// The site design (see `bus-schema` docs: site, labels, nodes, packages).
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
    },
    /// Install a registered site: OS on every node, binaries, cluster, container packages.
    Install(InstallArgs),
    /// Download a site's artifacts into its gateway's cache now (e.g. in a maintenance
    /// window); the later install finds them there and transfers nothing.
    Stage(artifacts_cli::StageArgs),
}

#[derive(Debug, Args)]
pub struct InstallArgs {
    pub site: String,
    /// Wait for the install to end; exit 0 when installed, non-zero with the reason otherwise.
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits.
    #[arg(long, default_value = "30m", value_parser = parse_duration)]
    pub timeout: Duration,
    /// The command id (a UUID). Publishing the same id again does the install once.
    #[arg(long)]
    pub id: Option<uuid::Uuid>,
    /// Install this design revision (see `landfall design apply`) instead of the latest.
    #[arg(long)]
    pub revision: Option<u64>,
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
    pub output: Format,
}

#[derive(Debug, Subcommand)]
pub enum PackageCommand {
    /// Upload an artifact into the artifact store (streamed, hashed on the way) and register it:
    /// sites get its bytes from the distribution service, verified by sha256.
    Upload(artifacts_cli::UploadArgs),
    /// Add a package version to the catalog (with --auto-rollout, also set this name's policy:
    /// each version registered that is the newest rolls out to the selected sites).
    Register(RegisterPackageArgs),
    /// Every catalog entry, and whether its name has an auto-rollout policy.
    List {
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
    /// Move every selected node that runs NAME to VERSION, site by site in waves.
    Patch(PatchArgs),
}

/// A package version: what `package register` and `package upload` both name.
#[derive(Debug, Args)]
pub struct PackageIdArgs {
    #[arg(long)]
    pub name: String,
    #[arg(long)]
    pub version: String,
    /// os-image, binary or container.
    #[arg(long)]
    pub kind: String,
    #[command(flatten)]
    pub policy: PolicyArgs,
}

/// A package name's auto-rollout policy, as `package register` and `package upload` set it.
#[derive(Debug, Args)]
pub struct PolicyArgs {
    /// Set this name's auto-rollout policy: from this version on, a version registered that is
    /// the newest of its name patches the selected sites' nodes that run an older one, with
    /// the strategy given here (the selector and strategy flags below).
    #[arg(long, conflicts_with = "no_auto_rollout")]
    pub auto_rollout: bool,
    /// Turn this name's auto-rollout policy off.
    #[arg(long)]
    pub no_auto_rollout: bool,
    #[command(flatten)]
    pub rollout: RolloutArgs,
}

#[derive(Debug, Args)]
pub struct RegisterPackageArgs {
    #[command(flatten)]
    pub package: PackageIdArgs,
    /// Lowercase hex sha256 of the artifact.
    #[arg(long)]
    pub sha256: String,
    #[arg(long)]
    pub size: u64,
    /// The artifact's object in the artifact store (`package upload` sets it); without one the
    /// package is registered by its metadata alone and sites get its bytes some other way.
    #[arg(long, default_value = "")]
    pub object_key: String,
}

/// Which sites a rollout covers and how it moves through them: shared by `package patch` and
/// `package register --auto-rollout`.
#[derive(Debug, Clone, Default, Args)]
pub struct RolloutArgs {
    /// Only these sites (comma-separated site ids).
    #[arg(long, value_delimiter = ',', value_name = "SITE,...")]
    pub sites: Vec<String>,
    /// Only sites whose labels hold every pair given.
    #[arg(long, value_delimiter = ',', value_parser = fleet::parse_label, value_name = "KEY=VALUE,...")]
    pub labels: Vec<(String, String)>,
    /// Patch the first N sites of the plan first, as a wave of their own.
    #[arg(long, value_name = "N", conflicts_with = "canary_sites")]
    pub canary: Option<u32>,
    /// Patch these sites first, as a wave of their own.
    #[arg(long, value_delimiter = ',', value_name = "SITE,...")]
    pub canary_sites: Vec<String>,
    /// Sites patched at once, per wave [default: every site in one wave].
    #[arg(long, value_name = "N")]
    pub max_concurrent_sites: Option<u32>,
    /// Nodes of one site patched at once: a count or a percentage of the site's nodes
    /// [default: 1].
    #[arg(long, value_name = "N|P%")]
    pub max_unavailable: Option<String>,
    /// Node failures tolerated, over the whole rollout, before it halts [default: 0].
    #[arg(long, value_name = "N|P%")]
    pub failure_threshold: Option<String>,
    /// How long one wave may take [default: no limit].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub wave_timeout: Option<Duration>,
    /// What a wave that runs out of time does [default: abort].
    #[arg(long, value_enum, requires = "wave_timeout")]
    pub on_wave_timeout: Option<OnWaveTimeout>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnWaveTimeout {
    /// Count the wave's unfinished sites as timed out and start the next wave.
    Continue,
    /// Halt the rollout.
    Abort,
}

#[derive(Debug, Args)]
pub struct PatchArgs {
    /// The package name, e.g. kubelet.
    pub name: String,
    /// The version to move to; it must be in the catalog.
    pub version: String,
    #[command(flatten)]
    pub rollout: RolloutArgs,
    /// Only nodes that run an older version: never downgrade a node that is ahead.
    #[arg(long)]
    pub only_older: bool,
    /// Print the plan (waves, sites, nodes, from → to) and publish nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Wait for the rollout to end; exit 0 when every planned node is patched, 1 when it
    /// completes with failures, halts or is cancelled, 2 when rejected, 3 when out of time.
    #[arg(long, conflicts_with = "dry_run")]
    pub wait: bool,
    /// How long --wait waits.
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    pub timeout: Duration,
    /// The command id (a UUID), which is also the rollout id. Publishing the same id again
    /// starts the rollout once.
    #[arg(long)]
    pub id: Option<uuid::Uuid>,
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
    pub output: Format,
}

#[derive(Debug, Subcommand)]
pub enum RolloutCommand {
    /// Every rollout, newest first.
    List {
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
    /// One rollout: its state, and every site and node of its plan with what happened to it.
    Show {
        id: String,
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
    /// Start no more sites; sites already patching finish.
    Pause {
        id: String,
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Go on with a paused or halted rollout (a halted one gets its failure budget again).
    Resume { id: String },
    /// End a rollout: no more sites start; sites already patching finish.
    Cancel {
        id: String,
        #[arg(long, default_value = "")]
        reason: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// A new host appears at a simulated site (`landfall up`); its gateway announces it and
    /// the orchestrator provisions it and joins it to the site's cluster.
    Add(NodeAddArgs),
}

#[derive(Debug, Args)]
pub struct NodeAddArgs {
    pub site: String,
    #[arg(long)]
    pub name: String,
    #[arg(long, value_enum)]
    pub role: NodeRole,
    /// The boot MAC address (aa:bb:cc:dd:ee:ff).
    #[arg(long)]
    pub mac: String,
    /// The BMC address [default: ipmi://10.X.Y.Z from the MAC's last three bytes].
    #[arg(long)]
    pub bmc: Option<String>,
    /// Wait until the node is ready in the cluster (exit 0), could not join (1), or the site
    /// refused it (2); 3 when out of time.
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits.
    #[arg(long, default_value = "30m", value_parser = parse_duration)]
    pub timeout: Duration,
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
    pub output: Format,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum NodeRole {
    Master,
    Worker,
}

#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Only this site's events.
    #[arg(long)]
    pub site: Option<String>,
    /// Keep printing new events as they happen.
    #[arg(long, short = 'f')]
    pub follow: bool,
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
    pub output: Format,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    pub site: Option<String>,
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
    pub output: Format,
}

/// How a command prints what it reads: `-o table|json|yaml`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// For people: tables and lines (`text` is accepted too).
    #[value(alias = "text")]
    Table,
    /// For programs: JSON (one object per line when following events).
    Json,
    /// For people and programs: YAML (one document per event when following events).
    Yaml,
}

/// Parses `90s`, `5m`, `2h`, `1500ms` or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(s.len()));
    let n: f64 = num.parse().map_err(|_| format!("{s:?} is not a duration (e.g. 90s, 5m, 2h)"))?;
    let secs = match unit {
        "" | "s" => n,
        "ms" => n / 1000.0,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (ms, s, m, h)")),
    };
    Ok(Duration::from_secs_f64(secs))
}

/// The `landfall` binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let service = matches!(cli.command, Command::Up(_) | Command::Serve(_));
    telemetry::init_logs(cli.telemetry.log_format, if service { "info,async_nats=warn" } else { "warn" });
    block_on(run(cli))
}

/// `landfall-gateway`: one site's gateway as a program of its own (what `landfall serve
/// gateway` runs), for a site's bootstrap machine or a pod there.
#[derive(Debug, Parser)]
#[command(name = "landfall-gateway", version, about = "One site's gateway: the site's jobs in, its events out.")]
pub struct GatewayCli {
    /// NATS server (the hub, or the site's leaf node).
    #[arg(long, env = "NATS_URL", default_value = DEFAULT_NATS_URL)]
    pub nats_url: String,
    #[command(flatten)]
    pub nats: nats_access::NatsAccessArgs,
    #[command(flatten)]
    pub gateway: serve::GatewayArgs,
    #[command(flatten)]
    pub telemetry: telemetry::TelemetryArgs,
}

pub fn gateway_main() -> ExitCode {
    let cli = GatewayCli::parse();
    telemetry::init_logs(cli.telemetry.log_format, "info,async_nats=warn");
    block_on(async move {
        nats_access::init(&cli.nats)?;
        let _metrics = telemetry::start(&cli.telemetry).await?;
        serve::gateway(cli.gateway, &cli.nats_url, serve::shutdown_on_signal()).await?;
        Ok(ExitCode::SUCCESS)
    })
}

fn block_on(work: impl std::future::Future<Output = anyhow::Result<ExitCode>>) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(work) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Where clients and services look for NATS when neither `--nats-url` nor `NATS_URL` says.
pub const DEFAULT_NATS_URL: &str = "nats://127.0.0.1:4222";

pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let url = cli.nats_url.clone().unwrap_or_else(|| DEFAULT_NATS_URL.to_string());
    nats_access::init(&cli.nats)?;
    // Services serve their metrics while they run; the client commands have none to serve.
    let _metrics = match cli.command {
        Command::Up(_) | Command::Serve(_) => telemetry::start(&cli.telemetry).await?,
        _ => None,
    };
    match cli.command {
        Command::Up(args) => up::run(args, cli.nats_url).await,
        Command::Serve(cmd) => serve::run(cmd, &url).await,
        Command::Site(SiteCommand::Register { file }) => client::register_site(&url, &file).await,
        Command::Site(SiteCommand::Install(args)) => client::install_site(&url, &args).await,
        Command::Package(PackageCommand::Register(args)) => client::register_package(&url, args).await,
        Command::Package(PackageCommand::Upload(args)) => artifacts_cli::upload(&url, args).await,
        Command::Site(SiteCommand::Stage(args)) => artifacts_cli::stage(&url, &args).await,
        Command::Package(PackageCommand::List { output }) => fleet::package_list(&url, output).await,
        Command::Package(PackageCommand::Patch(args)) => fleet::patch(&url, &args).await,
        Command::Rollout(cmd) => fleet::rollout(&url, cmd).await,
        Command::Node(NodeCommand::Add(args)) => fleet::node_add(&url, &args).await,
        Command::Bench(cmd) => bench::run(cmd, cli.nats_url.clone()).await,
        Command::Deploy(cmd) => deploy::run(cmd),
        Command::Design(cmd) => design::run(&url, cmd).await,
        Command::Events(args) => client::events(&url, &args).await,
        Command::Status(args) => client::status(&url, &args).await,
        Command::Kubeconfig(cmd) => secrets_cli::kubeconfig(&url, cmd).await,
        Command::Bmc(cmd) => secrets_cli::bmc(&url, cmd).await,
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "landfall", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("1500ms").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert!(parse_duration("5 parsecs").is_err());
    }

    #[test]
    fn cli_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
        GatewayCli::command().debug_assert();
    }
}
