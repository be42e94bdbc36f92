//! `landfall approval`: the commands the API holds for a second person (a decommission, a
//! rollout over much of the fleet), listed, approved or refused through the API — the hold is
//! the API's, so these commands go through it (`--api`), as the person logged in to it.

use std::process::ExitCode;

use clap::Subcommand;
use serde_json::{Value, json};

use super::api_client::{ApiArgs, Client, cell, exit};
use super::output::{Format, emit};

#[derive(Debug, Subcommand)]
pub enum ApprovalCommand {
    /// The commands waiting for a second person (with `--all`, the decided ones too), newest
    /// first: those over sites you may read, and your own.
    List {
        #[command(flatten)]
        api: ApiArgs,
        /// The approved and refused ones too.
        #[arg(long)]
        all: bool,
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
    /// Approve a held command: it is published then, under its own id and as its author's.
    /// Whoever asked for it cannot approve it.
    Approve {
        #[command(flatten)]
        api: ApiArgs,
        /// The held command's id.
        id: String,
        /// Why (kept with the decision).
        #[arg(long)]
        reason: Option<String>,
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
    /// Refuse a held command: it is never published.
    Refuse {
        #[command(flatten)]
        api: ApiArgs,
        /// The held command's id.
        id: String,
        /// Why (kept with the decision, and said to its author).
        #[arg(long)]
        reason: String,
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
}

pub async fn run(cmd: ApprovalCommand) -> anyhow::Result<ExitCode> {
    exit(match cmd {
        ApprovalCommand::List { api, all, output } => list(&api.api, all, output).await,
        ApprovalCommand::Approve { api, id, reason, output } => decide(&api.api, &id, reason, true, output).await,
        ApprovalCommand::Refuse { api, id, reason, output } => decide(&api.api, &id, Some(reason), false, output).await,
    })
}

async fn list(api: &str, all: bool, output: Format) -> anyhow::Result<ExitCode> {
    let client = Client::new(api).await?;
    let answer = client.get("/v1/approvals", &[("all", all.then(|| "true".to_string()))]).await?;
    match output {
        Format::Table => print!("{}", table(&answer)),
        format => emit(format, &answer)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// The held commands as a table: ID, KIND, SCOPE, REQUESTED BY, STATE, WHY.
fn table(answer: &Value) -> String {
    let items = answer["items"].as_array().map(Vec::as_slice).unwrap_or_default();
    if items.is_empty() {
        return "No commands wait for a second person.\n".into();
    }
    let mut out =
        format!("{:<36}  {:<20} {:<16} {:<24} {:<9} {}\n", "ID", "KIND", "SCOPE", "REQUESTED BY", "STATE", "WHY");
    for h in items {
        out += &format!(
            "{:<36}  {:<20} {:<16} {:<24} {:<9} {}\n",
            cell(&h["id"]),
            cell(&h["kind"]),
            cell(&h["scope"]),
            cell(&h["requested_by"]),
            cell(&h["state"]),
            cell(&h["why"]),
        );
    }
    out
}

async fn decide(
    api: &str,
    id: &str,
    reason: Option<String>,
    approve: bool,
    output: Format,
) -> anyhow::Result<ExitCode> {
    let client = Client::new(api).await?;
    let verb = if approve { "approve" } else { "refuse" };
    let path = decision_path(id.trim(), verb);
    let body = match reason {
        Some(reason) => json!({ "reason": reason }),
        None => json!({}),
    };
    let decided = client.post(&path, &body).await?;
    match output {
        Format::Table => {
            let (what, scope) = (cell(&decided["kind"]), cell(&decided["scope"]));
            let asked = cell(&decided["requested_by"]);
            match decided["state"].as_str() {
                Some("approved") => println!("Approved {what} of {scope} (asked by {asked}): it is published as {id}."),
                Some("refused") => println!("Refused {what} of {scope} (asked by {asked}): it is not published."),
                _ => println!("{what} of {scope} (asked by {asked}): {}.", cell(&decided["state"])),
            }
        }
        format => emit(format, &decided)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `/v1/approvals/<id>/<verb>`, the id one path segment whatever it holds (ids are UUIDs;
/// anything else is escaped by the URL's own path encoding).
fn decision_path(id: &str, verb: &str) -> String {
    let mut url = reqwest::Url::parse("http://api/v1/approvals").expect("a fixed URL parses");
    url.path_segments_mut().expect("an http URL has a path").extend([id, verb]);
    url.path().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_one_line_per_held_command() {
        let answer = json!({ "items": [{
            "id": "0b9c8a4e-0000-4000-8000-000000000001", "kind": "decommission_site", "scope": "edge-01",
            "requested_by": "token:alice", "state": "waiting", "why": "decommission_site is held for a second person",
        }]});
        let t = table(&answer);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 2, "{t}");
        assert!(lines[0].starts_with("ID") && lines[0].contains("REQUESTED BY") && lines[0].ends_with("WHY"), "{t}");
        assert!(lines[1].contains("token:alice") && lines[1].contains("edge-01") && lines[1].contains("waiting"));
        assert_eq!(table(&json!({ "items": [] })), "No commands wait for a second person.\n");
    }

    #[test]
    fn ids_stay_one_path_segment() {
        assert_eq!(decision_path("0b9c8a4e-0000", "approve"), "/v1/approvals/0b9c8a4e-0000/approve");
        assert_eq!(decision_path("a/b c", "refuse"), "/v1/approvals/a%2Fb%20c/refuse");
    }
}
