//! The `landfall` command line: publish commands, read events and state, run services, and
//! run the whole system on one machine (`landfall up`).
//!
//! The client commands ([`client`]) use only `bus-schema`; `up` and `serve` wire in the
//! consumers and site gateways, which is why this crate depends on them.

pub mod bench;
pub mod client;
pub mod design;
pub mod embedded;
pub mod output;
pub mod serve;
pub mod up;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Brings up and patches fleets of bare-metal edge sites, event-driven on NATS JetStream.
///
/// Start here: `landfall up` runs everything on this machine (a nats-server, the consumers,
/// and simulated sites); then, from another shell, `landfall site install edge-01 --wait`.
#[derive(Debug, Parser)]
#[command(name = "landfall", version)]
pub struct Cli {
    /// NATS server to talk to [default: nats://127.0.0.1:4222]. For `up`: use this server
    /// instead of starting one.
    #[arg(long, global = true, env = "NATS_URL")]
    pub nats_url: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the whole system on this machine: nats-server (unless NATS_URL is set), every
    /// consumer, and simulated sites. Ctrl-C stops it.
    Up(up::UpArgs),
    /// Register and install sites.
    #[command(subcommand)]
    Site(SiteCommand),
    /// Site design documents: profiles, nodes, cluster selection (validate, diff, apply, show).
    #[command(subcommand)]
    Design(design::DesignCommand),
    /// Register packages in the catalog.
    #[command(subcommand)]
    Package(PackageCommand),
    /// Print events, oldest first.
    Events(EventsArgs),
    /// Show sites, their nodes, and the latest install.
    Status(StatusArgs),
    /// Run one service in this process (for deployments that run services apart).
    #[command(subcommand)]
    Serve(serve::ServeCommand),
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
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Text)]
    pub output: Format,
}

#[derive(Debug, Subcommand)]
pub enum PackageCommand {
    /// Add a package version to the catalog.
    Register {
        #[arg(long)]
        name: String,
        #[arg(long)]
        version: String,
        /// os-image, binary or container.
        #[arg(long)]
        kind: String,
        /// Lowercase hex sha256 of the artifact.
        #[arg(long)]
        sha256: String,
        #[arg(long)]
        size: u64,
        /// Where the artifact lives in the artifact store.
        #[arg(long, default_value = "")]
        object_key: String,
    },
}

#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Only this site's events.
    #[arg(long)]
    pub site: Option<String>,
    /// Keep printing new events as they happen.
    #[arg(long, short = 'f')]
    pub follow: bool,
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Text)]
    pub output: Format,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    pub site: Option<String>,
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Text)]
    pub output: Format,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Text,
    Json,
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

fn init_tracing(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

/// The `landfall` binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let service = matches!(cli.command, Command::Up(_) | Command::Serve(_));
    init_tracing(if service { "info,async_nats=warn" } else { "warn" });
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
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
    match cli.command {
        Command::Up(args) => up::run(args, cli.nats_url).await,
        Command::Serve(cmd) => serve::run(cmd, &url).await,
        Command::Site(SiteCommand::Register { file }) => client::register_site(&url, &file).await,
        Command::Site(SiteCommand::Install(args)) => client::install_site(&url, &args).await,
        Command::Package(PackageCommand::Register { name, version, kind, sha256, size, object_key }) => {
            client::register_package(&url, name, version, &kind, sha256, size, object_key).await
        }
        Command::Design(cmd) => design::run(&url, cmd).await,
        Command::Events(args) => client::events(&url, &args).await,
        Command::Status(args) => client::status(&url, &args).await,
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
    }
}
