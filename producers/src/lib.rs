//! The `landfall` command line: publish commands, read events and state, run services, and
//! run the whole system on one machine (`landfall up`).
//!
//! - [`cli`]: the client commands, one module per command group, each owning its arguments;
//!   they use only `bus-schema` (and the artifact store, for uploads).
//! - [`views`]: the read models the CLI and the HTTP API share.
//! - [`api`]: the HTTP API and the dashboard.
//! - [`run`](mod@run): `up` and `serve`, which wire in the consumers and site gateways (which
//!   is why this crate depends on them), and the `landfall-gateway` program.
//! - [`bench`](mod@bench), [`deploy`]: `landfall bench …` and `landfall deploy nats-config`.
//! - [`nats_access`], [`flags`]: the flags every command shares, and flags several share.

pub mod api;
pub mod bench;
pub mod cli;
pub mod deploy;
pub mod flags;
pub mod nats_access;
pub mod run;
#[cfg(test)]
mod testing;
pub mod views;

// The paths these modules had before they moved, which the integration tests use.
pub use bench::transfer as bench_transfer;
pub use run::gateway::main as gateway_main;
pub use run::{embedded, up};

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use nats_access::DEFAULT_NATS_URL;
use run::{serve, service, telemetry};

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
    Site(cli::site::SiteCommand),
    /// Site design documents: profiles, nodes, cluster selection (validate, diff, apply, show).
    #[command(subcommand)]
    Design(cli::design::DesignCommand),
    /// The package catalog: register, list, and patch the fleet to a version.
    #[command(subcommand)]
    Package(cli::package::PackageCommand),
    /// Rollouts started by `package patch` or by an auto-rollout policy: list, show, pause,
    /// resume, cancel.
    #[command(subcommand)]
    Rollout(cli::rollout::RolloutCommand),
    /// Nodes of a site: add a host to a simulated site (it then joins the cluster).
    #[command(subcommand)]
    Node(cli::node::NodeCommand),
    /// Messages a consumer gave up on (too many failures, or its process lost each time):
    /// list, show, replay.
    #[command(subcommand)]
    Dead(cli::dead::DeadCommand),
    /// Print events, oldest first.
    Events(cli::events::EventsArgs),
    /// Commands by id: how one was settled (carried out, or refused and why), however long ago.
    #[command(subcommand)]
    Command(cli::command::CommandCommand),
    /// Who did what: the commands settled, newest first, with their authors, sites and outcomes.
    Audit(cli::audit::AuditArgs),
    /// Commands held by the API for a second person (decommissions, rollouts over much of the
    /// fleet): list, approve, refuse, through the API.
    #[command(subcommand)]
    Approval(cli::approval::ApprovalCommand),
    /// Whom an API takes you for: your name, actor, role and grants.
    Whoami(cli::whoami::WhoamiArgs),
    /// Show sites, their nodes, and the latest install.
    Status(cli::status::StatusArgs),
    /// Log in to an API with single sign-on (its identity provider); the tokens are saved for
    /// later commands.
    Login(cli::login::LoginArgs),
    /// Forget a saved login.
    Logout(cli::login::LogoutArgs),
    /// Site kubeconfigs (opened by the secrets service), and rotation of the data key that
    /// seals every stored secret.
    #[command(subcommand)]
    Kubeconfig(cli::secrets::KubeconfigCommand),
    /// BMC credentials of hosts: stored sealed, handed to a gateway only for a job that
    /// drives the BMC.
    #[command(subcommand)]
    Bmc(cli::secrets::BmcCommand),
    /// The data key ring of the secrets service: `secrets hsm-init` makes its key-encryption key
    /// in a PKCS#11 token (an HSM) and a ring of data keys wrapped under it.
    #[command(subcommand)]
    Secrets(cli::hsm::SecretsCommand),
    /// Run one service in this process (for deployments that run services apart).
    Serve(serve::ServeArgs),
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

/// The `landfall` binary.
pub fn main() -> ExitCode {
    let mut cli = Cli::parse();
    let service = matches!(cli.command, Command::Up(_) | Command::Serve(_));
    let filter = if service { "info,async_nats=warn" } else { "warn" };
    // `up` is for a person: its terminal shows what happens, its services' logs go to a file.
    let format = cli.telemetry.log_format;
    let to_file = match &mut cli.command {
        Command::Up(args) => args.log_file(format).map(|file| (args, file)),
        _ => None,
    };
    match to_file {
        Some((args, file)) => match telemetry::init_logs_to_file(&file, filter) {
            Ok(()) => args.logs_to = Some(file),
            Err(e) => {
                telemetry::init_logs(format, filter);
                tracing::warn!(file = %file.display(), error = %e, "cannot write the log file; logging here");
            }
        },
        None => telemetry::init_logs(format, filter),
    }
    service::block_on(run(cli))
}

pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let url = cli.nats_url.clone().unwrap_or_else(|| DEFAULT_NATS_URL.to_string());
    nats_access::init(&cli.nats)?;
    // Services serve their metrics and send their spans while they run; the client commands
    // have none.
    let telemetry = match cli.command {
        Command::Up(_) | Command::Serve(_) => Some(telemetry::start(&cli.telemetry).await?),
        _ => None,
    };
    let result = command(cli, url).await;
    if let Some(t) = telemetry {
        t.finish().await;
    }
    result
}

async fn command(cli: Cli, url: String) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Up(args) => up::run(args, cli.nats_url).await,
        Command::Serve(args) => serve::run(args, &url).await,
        Command::Site(cmd) => cli::site::run(&url, cmd).await,
        Command::Design(cmd) => cli::design::run(&url, cmd).await,
        Command::Package(cmd) => cli::package::run(&url, cmd).await,
        Command::Rollout(cmd) => cli::rollout::run(&url, cmd).await,
        Command::Node(cmd) => cli::node::run(&url, cmd).await,
        Command::Dead(cmd) => cli::dead::run(&url, cmd).await,
        Command::Events(args) => cli::events::run(&url, &args).await,
        Command::Command(cmd) => cli::command::run(&url, cmd).await,
        Command::Audit(args) => cli::audit::run(&url, args).await,
        Command::Approval(cmd) => cli::approval::run(cmd).await,
        Command::Whoami(args) => cli::whoami::run(&args).await,
        Command::Status(args) => cli::status::run(&url, &args).await,
        Command::Login(args) => cli::login::login(&args).await,
        Command::Logout(args) => cli::login::logout(&args),
        Command::Kubeconfig(cmd) => cli::secrets::kubeconfig(&url, cmd).await,
        Command::Bmc(cmd) => cli::secrets::bmc(&url, cmd).await,
        Command::Secrets(cmd) => cli::hsm::run(cmd),
        Command::Bench(cmd) => bench::run(cmd, cli.nats_url.clone()).await,
        Command::Deploy(cmd) => deploy::run(cmd, &url).await,
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
    fn cli_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
