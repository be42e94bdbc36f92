//! `landfall events`: the events stream printed oldest first, optionally followed.

use std::process::ExitCode;

use async_nats::jetstream::consumer::DeliverPolicy;
use bus_schema::domain::SiteId;
use bus_schema::names;
use clap::Args;

use super::connect::connect;
use super::output::{Format, emit_line};
use crate::views::event::{event_json, event_line};

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

/// Prints the events `args` asks for; with `--follow`, until interrupted.
pub async fn run(url: &str, args: &EventsArgs) -> anyhow::Result<ExitCode> {
    let filter = match &args.site {
        Some(site) => names::scope_events(SiteId::try_from(site.as_str())?.as_str()),
        None => names::EVENTS_ALL.to_string(),
    };
    let bus = connect(url).await?;
    let mut reader = bus.read_events(vec![filter], DeliverPolicy::All).await?;
    if reader.pending_at_start == 0 && !args.follow {
        return Ok(ExitCode::SUCCESS);
    }
    while let Some(e) = reader.next().await {
        let e = e?;
        match args.output {
            Format::Json | Format::Yaml => emit_line(args.output, &event_json(&e))?,
            Format::Table => println!("{}", event_line(&e)),
        }
        if !args.follow && e.pending == 0 {
            break;
        }
    }
    Ok(ExitCode::SUCCESS)
}
