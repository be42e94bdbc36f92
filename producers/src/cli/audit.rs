//! `landfall audit`: who did what, when, to which sites, with what outcome — the command ledger
//! read on the bus (the same listing as `GET /v1/audit`), newest first; with `--api`, read
//! through the API as the person logged in to it, so they see what their grants allow.

use std::process::ExitCode;

use clap::Args;
use serde_json::Value;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::api_client::{Client, cell, exit};
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
    /// Read through this landfall API (`GET /v1/audit`) instead of the bus, as the person logged
    /// in to it (`landfall login`, or LANDFALL_API_TOKEN): the commands their grants let them see.
    #[arg(long, env = "LANDFALL_API")]
    pub api: Option<String>,
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
    if let Some(api) = &args.api {
        return exit(through_api(api, &filter, args.output).await);
    }
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

/// The listing read from `GET /v1/audit`.
async fn through_api(api: &str, filter: &Filter, output: Format) -> anyhow::Result<ExitCode> {
    let client = Client::new(api).await?;
    let time = |t: Option<OffsetDateTime>| t.map(|t| t.format(&Rfc3339)).transpose();
    let query = [
        ("actor", filter.actor.clone()),
        ("site", filter.site.clone()),
        ("kind", filter.kind.clone()),
        ("outcome", filter.outcome.clone()),
        ("since", time(filter.since)?),
        ("until", time(filter.until)?),
        ("limit", Some(filter.limit.to_string())),
    ];
    let answer = client.get("/v1/audit", &query).await?;
    match output {
        Format::Table => {
            print!("{}", table(&answer));
            if answer["truncated"].as_bool() == Some(true) {
                eprintln!("(the window was too long to read whole: narrow it with --since)");
            }
        }
        format => emit(format, &answer)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// The API's listing as the table the bus's is printed as: when, who, what, where, outcome.
fn table(answer: &Value) -> String {
    let mut out = format!("{:<24} {:<28} {:<20} {:<16} {}\n", "HANDLED", "ACTOR", "KIND", "SITE", "OUTCOME");
    for r in answer["items"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let kind = r["subject"].as_str().unwrap_or_default().rsplit('.').next().unwrap_or_default();
        let actor = r["actor"].as_str().filter(|a| !a.is_empty()).unwrap_or("(not recorded)");
        let mut outcome = cell(&r["outcome"]).replace('_', " ");
        if r["outcome"] == "rejected" {
            outcome = format!("{outcome}: {}", r["reason"].as_str().unwrap_or_default());
        }
        out += &format!(
            "{:<24} {:<28} {:<20} {:<16} {}\n",
            cell(&r["handled_at"]),
            actor,
            kind,
            cell(&r["scope"]),
            outcome
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_listing_prints_as_the_bus_listing() {
        let answer = serde_json::json!({ "items": [{
            "id": "x", "type": "landfall.v1.DecommissionSite", "subject": "landfall.cmd.edge-01.hub.decommission_site",
            "actor": "token:alice", "scope": "edge-01", "outcome": "rejected", "code": "precondition",
            "reason": "not installed", "handled_at": "2025-01-01T00:00:00.000Z", "handled_by": "orchestrator",
        }], "truncated": false });
        let t = table(&answer);
        let line = t.lines().nth(1).unwrap();
        assert!(line.starts_with("2025-01-01T00:00:00.000Z"), "{t}");
        assert!(line.contains("token:alice") && line.contains("decommission_site") && line.contains("edge-01"));
        assert!(line.ends_with("rejected: not installed"), "{t}");
    }
}
