//! `landfall whoami`: whom an API takes the caller for — the name, the actor their commands are
//! recorded under, and the roles they hold over which sites.

use std::process::ExitCode;

use clap::Args;
use serde_json::Value;

use super::api_client::{ApiArgs, Client, cell, exit};
use super::output::{Format, emit};

#[derive(Debug, Args)]
pub struct WhoamiArgs {
    #[command(flatten)]
    pub api: ApiArgs,
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
    pub output: Format,
}

pub async fn run(args: &WhoamiArgs) -> anyhow::Result<ExitCode> {
    exit(whoami(args).await)
}

async fn whoami(args: &WhoamiArgs) -> anyhow::Result<ExitCode> {
    let client = Client::new(&args.api.api).await?;
    let who = client.get("/v1/whoami", &[]).await?;
    match args.output {
        Format::Table => print!("{}", lines(&who)),
        format => emit(format, &who)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// Where a grant reaches: the whole fleet, or the sites with these labels.
fn reach(sites: &Value) -> String {
    match sites {
        Value::Null => "the whole fleet".into(),
        Value::Object(labels) if labels.is_empty() => "the whole fleet".into(),
        Value::Object(labels) => {
            let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={}", cell(v))).collect();
            format!("sites labelled {}", labels.join(", "))
        }
        other => format!("sites {other}"),
    }
}

fn lines(who: &Value) -> String {
    let mut out = format!(
        "name    {}\nactor   {}\nrole    {}\n",
        cell(&who["name"]),
        cell(&who["actor"]),
        match &who["role"] {
            Value::Null => "(none)".to_string(),
            role => cell(role),
        }
    );
    let grants = who["grants"].as_array().map(Vec::as_slice).unwrap_or_default();
    if grants.is_empty() {
        out += "grants  (none)\n";
    }
    for (i, g) in grants.iter().enumerate() {
        let label = if i == 0 { "grants" } else { "" };
        out += &format!("{label:<7} {} over {}\n", cell(&g["role"]), reach(&g["sites"]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn grants_say_their_role_and_reach() {
        let who = json!({ "name": "alice", "actor": "user:alice", "role": "operator", "grants": [
            { "role": "operator", "sites": { "region": "eu" } },
            { "role": "viewer", "sites": null },
        ]});
        assert_eq!(
            lines(&who),
            "name    alice\nactor   user:alice\nrole    operator\n\
             grants  operator over sites labelled region=eu\n        viewer over the whole fleet\n"
        );
        let nobody = json!({ "name": "x", "actor": "user:x", "role": null, "grants": [] });
        assert!(lines(&nobody).ends_with("role    (none)\ngrants  (none)\n"), "{}", lines(&nobody));
    }
}
