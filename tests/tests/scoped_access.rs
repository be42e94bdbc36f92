//! Roles over parts of the fleet, and the author of every command, through the real API over a
//! real fleet (nats-server, the consumers, the gateways): an operator of one region changes and
//! sees only that region's sites, a rollout they start covers only them, a viewer of another
//! region sees none of it (lists, pages, events, the audit list), and each command on record
//! names who sent it — in the ledger, the rollout, `GET /v1/audit` and `landfall audit`.

use std::time::Duration;

use landfall_tests::api::{Api, OPERATOR};
use landfall_tests::cli::{landfall, text};
use landfall_tests::fleet::Fleet;
use landfall_tests::nats::NatsServer;
use producers::api::auth::Role;
use serde_json::{Value, json};

const EU_OPERATOR: &str = "eu-operator-token-000000001";
const US_VIEWER: &str = "us-viewer-token-0000000001";
const NOBODY: &str = "granted-nothing-token-00001";
const ADMIN: &str = "fleet-admin-token-000000001";

const POLICY: &str = "grants:\n  - {token: eu-op, role: operator, sites: {region: eu-west}}\n  \
                      - {token: us-view, role: viewer, sites: {region: us-east}}\n  \
                      - {token: nobody, role: viewer, sites: {region: nowhere}}\n";

/// Waits until `check` holds of GET `path` as `token`.
async fn until(api: &Api, token: &str, path: &str, check: impl Fn(u16, &Value) -> bool) -> Value {
    for _ in 0..300 {
        let (status, body) = api.get(token, path).await;
        if check(status, &body) {
            return body;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, body) = api.get(token, path).await;
    panic!("GET {path} never satisfied the test: {status} {body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_of_one_region_changes_and_sees_only_its_sites_and_every_command_names_its_author() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(2).nodes(1).start().await;
    let more = [
        ("eu-op", Role::Operator, EU_OPERATOR),
        ("us-view", Role::Viewer, US_VIEWER),
        ("nobody", Role::Viewer, NOBODY),
        ("root", Role::Admin, ADMIN),
    ];
    let api = Api::start_with(&fleet.bus, POLICY, &more).await;
    let (eu, us) = (fleet.site_id(0), fleet.site_id(1));

    // The whole fleet's operator puts the two sites in two regions.
    api.put_in_region(&fleet, 0, "eu-west").await;
    api.put_in_region(&fleet, 1, "us-east").await;
    // Those two commands are on record as the operator's; the fleet's own first registrations as
    // the service that sent them.
    until(&api, OPERATOR, "/v1/audit?kind=register_site&actor=token:test-operator", |_, b| {
        b["items"].as_array().is_some_and(|a| a.len() == 2)
    })
    .await;
    let (_, first) = api.get(OPERATOR, "/v1/audit?kind=register_site&actor=service:landfall-test").await;
    assert_eq!(first["items"].as_array().map(Vec::len), Some(2), "{first}");

    // Who they are.
    let (_, who) = api.get(EU_OPERATOR, "/v1/whoami").await;
    assert_eq!(who["actor"], "token:eu-op");
    assert_eq!(who["grants"], json!([{ "role": "operator", "sites": { "region": "eu-west" } }]));

    // The policy is shown to admins only.
    assert_eq!(api.get(EU_OPERATOR, "/v1/policy").await.0, 403);
    assert_eq!(api.get(OPERATOR, "/v1/policy").await.0, 403);
    let (status, policy) = api.get(ADMIN, "/v1/policy").await;
    assert_eq!(status, 200, "{policy}");
    assert_eq!(policy["grants"][0], json!({ "token": "eu-op", "role": "operator", "sites": { "region": "eu-west" } }));

    // Reads: each sees its region only, and the other's site does not exist for them.
    let (_, page) = api.get(EU_OPERATOR, "/v1/sites").await;
    assert_eq!(page["total"], 1, "{page}");
    assert_eq!(page["items"][0]["site"].as_str(), Some(eu.as_str()), "{page}");
    assert_eq!(api.get(EU_OPERATOR, &format!("/v1/sites/{us}")).await.0, 404);
    assert_eq!(api.get(EU_OPERATOR, &format!("/v1/sites/{us}/nodes")).await.0, 404);
    assert_eq!(api.get(US_VIEWER, &format!("/v1/sites/{eu}")).await.0, 404);
    let (_, overview) = api.get(US_VIEWER, "/v1/overview").await;
    assert_eq!(overview["sites"]["total"], 1, "{overview}");
    let (_, overview) = api.get(OPERATOR, "/v1/overview").await;
    assert_eq!(overview["sites"]["total"], 2, "{overview}");
    let (_, page) = api.get(NOBODY, "/v1/sites").await;
    assert_eq!(page["total"], 0, "{page}");

    // Commands: their own site yes, the other region's no, the catalog no.
    let install = |site: &str| json!({ "site_id": site }).to_string();
    let (status, refused) = api.post(EU_OPERATOR, "/v1/commands/install_site", &install(&us), &[]).await;
    assert_eq!(status, 404, "a site they may not read is not told of: {refused}");
    let (status, refused) = api.post(US_VIEWER, "/v1/commands/install_site", &install(&us), &[]).await;
    assert_eq!(status, 403, "{refused}");
    let (status, refused) = api.post(EU_OPERATOR, "/v1/commands/register_package", "{\"package\": {}}", &[]).await;
    assert!(status == 403 || status == 422, "{status} {refused}");
    let (status, ok) = api.post(EU_OPERATOR, "/v1/commands/install_site", &install(&eu), &[]).await;
    assert_eq!(status, 202, "{ok}");
    assert_eq!(ok["actor"], "token:eu-op");
    let install_id = ok["id"].as_str().unwrap().to_string();

    // A rollout over "every site" by the regional operator covers its region only.
    let patch = json!({ "name": "kubelet", "version": "1.29.2", "selector": {} }).to_string();
    let (status, rollout) = api.post(EU_OPERATOR, "/v1/commands/patch_package", &patch, &[]).await;
    assert_eq!(status, 202, "{rollout}");
    assert_eq!(rollout["narrowed_to"], "region=eu-west", "{rollout}");
    let named = json!({ "name": "kubelet", "version": "1.29.2", "selector": { "site_ids": [us] } }).to_string();
    let (status, refused) = api.post(EU_OPERATOR, "/v1/commands/patch_package", &named, &[]).await;
    assert_eq!(status, 403, "{refused}");
    assert!(refused["message"].as_str().unwrap().contains(&us), "it says which site: {refused}");
    let rollout_id = rollout["id"].as_str().unwrap().to_string();
    let rollouts = until(&api, EU_OPERATOR, "/v1/rollouts", |_, b| {
        b.as_array().is_some_and(|a| a.iter().any(|r| r["id"] == rollout_id.as_str()))
    })
    .await;
    let mine = rollouts.as_array().unwrap().iter().find(|r| r["id"] == rollout_id.as_str()).unwrap();
    assert_eq!(mine["actor"], "token:eu-op", "{mine}");
    let (_, theirs) = api.get(US_VIEWER, "/v1/rollouts").await;
    assert_eq!(theirs, json!([]), "a rollout over another region is not shown");
    assert_eq!(api.get(US_VIEWER, &format!("/v1/rollouts/{rollout_id}")).await.0, 404);

    // The ledger names the author; the audit list shows it to whom may see the site.
    let record = until(&api, EU_OPERATOR, &format!("/v1/commands/{install_id}"), |s, _| s == 200).await;
    assert_eq!((record["actor"].as_str(), record["scope"].as_str()), (Some("token:eu-op"), Some(eu.as_str())));
    assert_eq!(api.get(US_VIEWER, &format!("/v1/commands/{install_id}")).await.0, 404);
    let audit = until(&api, OPERATOR, "/v1/audit?actor=eu-op", |_, b| {
        b["items"].as_array().is_some_and(|a| a.iter().any(|r| r["id"] == install_id.as_str()))
    })
    .await;
    assert!(audit["items"].as_array().unwrap().iter().all(|r| r["actor"] == "token:eu-op"), "{audit}");
    let (_, theirs) = api.get(US_VIEWER, "/v1/audit").await;
    let items = theirs["items"].as_array().unwrap();
    assert!(items.iter().all(|r| r["scope"] == us.as_str()), "only its region's commands: {theirs}");
    assert!(items.iter().any(|r| r["type"] == "landfall.v1.RegisterSite"), "{theirs}");
    let (status, err) = api.get(OPERATOR, "/v1/audit?outcome=won").await;
    assert_eq!(status, 400, "{err}");

    // Events: the other region's never reach them.
    let events = api.events_as(US_VIEWER, "from_seq=1", None, Duration::from_secs(3), |_| false).await;
    assert!(!events.is_empty(), "its own site's events are there");
    for e in &events {
        assert_ne!(e.data["site"], eu.as_str(), "an event of another region reached the viewer: {:?}", e.data);
    }

    // The CLI on the bus reads the same list (its own NATS connection is the actor it reports).
    let out = landfall(&server.url(), &["audit", "--actor", "eu-op", "-o", "json"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(listed["items"].as_array().unwrap().iter().any(|r| r["id"] == install_id.as_str()), "{listed}");
    let out = landfall(&server.url(), &["command", "show", &install_id]).await;
    assert!(text(&out.stdout).contains("asked by  token:eu-op"), "{}", text(&out.stdout));
}
