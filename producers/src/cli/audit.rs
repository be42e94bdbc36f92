//! `landfall audit`: who did what, when, to which sites, with what outcome — the command ledger
//! read on the bus (the same listing as `GET /v1/audit`), newest first.

use std::process::ExitCode;

use clap::Args;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::connect::connect;
use super::output::{Format, emit};
use crate::views::audit::{self, DEFAULT_LIMIT, Filter};

#[derive(Debug, Args)]
pub struct AuditArgs {
    /// Only commands of this actor: `user:alice`, or `alice` for any kind of actor of that name.
    #[arg(long)]
    pub actor: Option<String>,
    /// Only commands about this site (`fleet`: fleet-wide ones).
    #[arg(long)]
    pub site: Option<String>,
    /// Only commands of this kind (`install_site`, `InstallSite`).
    #[arg(long)]
    pub kind: Option<String>,
    /// Only commands with this outcome: carried_out, rejected, dead_lettered.
    #[arg(long)]
    pub outcome: Option<String>,
    /// From this long ago (`30m`, `24h`, `7d`) or this time (RFC 3339).
    #[arg(long, default_value = "7d")]
    pub since: String,
    /// Up to this time (RFC 3339).
    #[arg(long)]
    pub until: Option<String>,
    /// The newest this many.
    #[arg(long, default_value_t = DEFAULT_LIMIT)]
    pub limit: usize,
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
    pub output: Format,
}

/// A time given as an age (`24h`) or an RFC 3339 time.
fn when(value: &str) -> anyhow::Result<OffsetDateTime> {
    if let Ok(t) = OffsetDateTime::parse(value, &Rfc3339) {
        return Ok(t);
    }
    let age = crate::flags::parse_duration(value)
        .map_err(|e| anyhow::anyhow!("{value:?} is neither an age (24h, 7d) nor an RFC 3339 time: {e}"))?;
    Ok(OffsetDateTime::now_utc() - age)
}

pub async fn run(url: &str, args: AuditArgs) -> anyhow::Result<ExitCode> {
    let filter = Filter {
        actor: args.actor,
        site: args.site,
        kind: args.kind,
        outcome: args.outcome,
        since: Some(when(&args.since)?),
        until: args.until.as_deref().map(when).transpose()?,
        limit: args.limit,
    };
    filter.check().map_err(anyhow::Error::msg)?;
    let bus = connect(url).await?;
    let (entries, stopped) = audit::list(&bus, &filter, |_| true).await?;
    match args.output {
        Format::Table => {
            print!("{}", audit::listing_lines(&entries));
            if stopped {
                eprintln!("(the window was too long to read whole: narrow it with --since)");
            }
        }
        format => emit(format, &audit::listing_json(&entries, stopped))?,
    }
    Ok(ExitCode::SUCCESS)
}
