//! `landfall command show <id>`: how a command was settled, as the command ledger recorded it
//! (carried out, or refused with its code and reason), for as long as the ledger keeps it.

use std::process::ExitCode;

use bus_schema::names::{self, keys};
use bus_schema::pb;
use clap::Subcommand;

use super::connect::{EXIT_REJECTED, connect};
use super::output::{Format, emit};
use crate::views::command::{command_json, command_lines};

#[derive(Debug, Subcommand)]
pub enum CommandCommand {
    /// How a command was settled: carried out, or refused and why. Exit 0 when carried out, 2
    /// when refused, 1 when it is not settled (still queued or waiting, never published, or
    /// given up as a dead letter: `landfall dead list`).
    Show {
        /// The command id (its `Nats-Msg-Id`, as `site install --id` or the API's
        /// `Idempotency-Key` gave it).
        id: uuid::Uuid,
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
}

pub async fn run(url: &str, cmd: CommandCommand) -> anyhow::Result<ExitCode> {
    let CommandCommand::Show { id, output } = cmd;
    let bus = connect(url).await?;
    let ledger = bus.kv(names::LEDGER_BUCKET).await?;
    let Some((record, _)) = ledger.get::<pb::CommandRecord>(&keys::command(&id.to_string())).await? else {
        eprintln!("command {id} is not settled: it is still queued or waiting, or was never published");
        return Ok(ExitCode::FAILURE);
    };
    match output {
        Format::Table => print!("{}", command_lines(&record)),
        format => emit(format, &command_json(&record))?,
    }
    Ok(match (record.dead_lettered, record.rejected) {
        (true, _) => ExitCode::FAILURE,
        (false, true) => ExitCode::from(EXIT_REJECTED),
        (false, false) => ExitCode::SUCCESS,
    })
}
