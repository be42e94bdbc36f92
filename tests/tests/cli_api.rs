//! The `landfall` commands that go through the HTTP API (`whoami`, `approval`, `audit --api`),
//! as a separate process against the API over a real fleet: a second person approves what the
//! first asked for, the first cannot, and the audit read through the API shows it as theirs.

use std::time::Duration;

use landfall_tests::api::Api;
use landfall_tests::cli::{landfall_with, text};
use landfall_tests::fleet::Fleet;
use landfall_tests::nats::NatsServer;
use producers::api::auth::Role;
use serde_json::{Value, json};

const ALICE: &str = "alice-operator-token-000001";
const BOB: &str = "bob-operator-token-00000001";

const POLICY: &str = "approval:\n  commands: [decommission_site]\n";

/// `landfall ARGS` through the API at `api`, with `token` (none: no LANDFALL_API_TOKEN) and a
/// configuration directory `config` holding no saved login.
async fn as_who(
    nats: &str,
    api: &str,
    token: Option<&str>,
    config: &std::path::Path,
    args: &[&str],
) -> std::process::Output {
    let config = config.to_str().unwrap();
    let env = [("LANDFALL_API", Some(api)), ("LANDFALL_API_TOKEN", token), ("XDG_CONFIG_HOME", Some(config))];
    landfall_with(nats, &env, args).await
}

fn json_of(out: &std::process::Output) -> Value {
    assert!(out.status.success(), "stdout: {}\nstderr: {}", text(&out.stdout), text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_whoami_and_audit_through_the_api() {
    let server = NatsServer::start();
    let nats = server.url();
    let fleet = Fleet::builder(&nats).sites(1).nodes(1).start().await;
    let more = [("alice", Role::Operator, ALICE), ("bob", Role::Operator, BOB)];
    let api = Api::start_with(&fleet.bus, POLICY, &more).await;
    let config = tempfile::tempdir().unwrap();
    let site = fleet.site_id(0);

    // whoami: the name, the actor, the role and the grants.
    let out = as_who(&nats, &api.base, Some(ALICE), config.path(), &["whoami", "--api", &api.base, "-o", "json"]).await;
    let who = json_of(&out);
    assert_eq!((who["name"].as_str(), who["actor"].as_str()), (Some("alice"), Some("token:alice")), "{who}");
    assert_eq!(who["role"], "operator");
    let out = as_who(&nats, &api.base, Some(ALICE), config.path(), &["whoami"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    assert!(table.contains("token:alice") && table.contains("operator over the whole fleet"), "{table}");

    // Alice asks for a decommission: the API holds it.
    let body = json!({ "site_id": site, "reason": "closing" }).to_string();
    let (status, held) = api.post(ALICE, "/v1/commands/decommission_site", &body, &[]).await;
    assert_eq!((status, held["approval"].as_str()), (202, Some("waiting")), "{held}");
    let id = held["id"].as_str().unwrap().to_string();

    // Bob sees it waiting, in JSON and in the table.
    let out = as_who(&nats, &api.base, Some(BOB), config.path(), &["approval", "list", "-o", "json"]).await;
    let listed = json_of(&out);
    let item = listed["items"].as_array().unwrap().iter().find(|h| h["id"] == id.as_str()).cloned();
    let item = item.unwrap_or_else(|| panic!("{id} is not listed: {listed}"));
    assert_eq!((item["state"].as_str(), item["requested_by"].as_str()), (Some("waiting"), Some("token:alice")));
    let out = as_who(&nats, &api.base, Some(BOB), config.path(), &["approval", "list"]).await;
    let table = text(&out.stdout);
    assert!(table.starts_with("ID") && table.contains(&id) && table.contains("decommission_site"), "{table}");

    // Alice cannot approve her own: refused, exit 2, and the message says why.
    let out = as_who(&nats, &api.base, Some(ALICE), config.path(), &["approval", "approve", &id]).await;
    assert_eq!(out.status.code(), Some(2), "stdout: {}\nstderr: {}", text(&out.stdout), text(&out.stderr));
    assert!(text(&out.stderr).contains("second person"), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("403"), "{}", text(&out.stderr));

    // An id no command has: not found, exit 1.
    let unknown = "00000000-0000-4000-8000-000000000000";
    let out =
        as_who(&nats, &api.base, Some(BOB), config.path(), &["approval", "refuse", unknown, "--reason", "x"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("no command"), "{}", text(&out.stderr));

    // Bob approves it.
    let args = ["approval", "approve", &id, "--reason", "the site is closed", "-o", "json"];
    let out = as_who(&nats, &api.base, Some(BOB), config.path(), &args).await;
    let decided = json_of(&out);
    assert_eq!((decided["state"].as_str(), decided["decided_by"].as_str()), (Some("approved"), Some("token:bob")));
    // Decided: listed only with --all.
    let out = as_who(&nats, &api.base, Some(BOB), config.path(), &["approval", "list", "--all", "-o", "json"]).await;
    assert!(json_of(&out)["items"].as_array().unwrap().iter().any(|h| h["id"] == id.as_str()));

    // The audit read through the API lists it as alice's, once the orchestrator settled it.
    let args = ["audit", "--api", &api.base, "--kind", "decommission_site", "-o", "json"];
    let mut last = Value::Null;
    for _ in 0..100 {
        let out = as_who(&nats, &api.base, Some(BOB), config.path(), &args).await;
        last = json_of(&out);
        if let Some(r) = last["items"].as_array().unwrap().iter().find(|r| r["id"] == id.as_str()) {
            assert_eq!(r["actor"], "token:alice", "{r}");
            assert_eq!(r["type"], "landfall.v1.DecommissionSite", "{r}");
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(last["items"].as_array().unwrap().iter().any(|r| r["id"] == id.as_str()), "never audited: {last}");

    // Without a token or a saved login: the message says to log in.
    let out = as_who(&nats, &api.base, None, config.path(), &["approval", "list"]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("not logged in") && err.contains("landfall login --api"), "{err}");
    // A token the API does not know: its refusal, exit 1.
    let out = as_who(&nats, &api.base, Some("no-such-token-000000000000"), config.path(), &["whoami"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("401"), "{}", text(&out.stderr));
    fleet.stop().await;
}
