//! `landfall bench`: measurements against a real nats-server, with ratios to raw JetStream
//! measured in the same run.

use std::process::ExitCode;

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// One PatchPackage over S simulated sites of N nodes each (instant backends).
    Fanout {
        #[arg(long, default_value_t = 1000)]
        sites: usize,
        #[arg(long, default_value_t = 10)]
        nodes: usize,
    },
}

pub async fn run(cmd: BenchCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        BenchCommand::Fanout { sites, nodes } => anyhow::bail!("bench fanout {sites}x{nodes}: not built yet"),
    }
}
