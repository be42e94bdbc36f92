//! Two people for what cannot be undone, through the real API over a real fleet: a decommission
//! and a rollout over most of the fleet wait for a second person; their author cannot approve
//! them; a refusal means the command is never published; an approval publishes it under its own
//! id, on record as its author's; waiting, approved and refused are events.

use std::time::Duration;

use landfall_tests::api::{Api, VIEWER};
use landfall_tests::fleet::{Fleet, commands_stored};
use landfall_tests::nats::NatsServer;
use producers::api::auth::Role;
use serde_json::{Value, json};

const ALICE: &str = "alice-operator-token-000001";
const BOB: &str = "bob-operator-token-00000001";

const POLICY: &str = "approval:\n  commands: [decommission_site]\n  rollout_share: 0.5\n";

async fn settled(api: &Api, id: &str) -> Value {
    for _ in 0..300 {
        let (status, record) = api.get(ALICE, &format!("/v1/commands/{id}")).await;
        if status == 200 {
            return record;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("command {id} was never settled");
}

/// The event kinds correlated with command `id`, read from the start of the stream.
async fn events_of(api: &Api, id: &str, until: &str) -> Vec<String> {
    let events = api
        .events(&format!("correlation={id}&from_seq=1"), None, Duration::from_secs(20), |got| {
            got.iter().any(|e| e.event == until)
        })
        .await;
    events.into_iter().map(|e| e.event).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_cannot_be_undone_waits_for_a_second_person() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(2).nodes(1).start().await;
    let more = [("alice", Role::Operator, ALICE), ("bob", Role::Operator, BOB)];
    let api = Api::start_with(&fleet.bus, POLICY, &more).await;
    let (one, two) = (fleet.site_id(0), fleet.site_id(1));
    let decommission = |site: &str| json!({ "site_id": site, "reason": "closing" }).to_string();

    // A rollout over the whole fleet (more than half) waits; one over a single site (half) does not.
    let everywhere = json!({ "name": "kubelet", "version": "1.29.2" }).to_string();
    let (status, held) = api.post(ALICE, "/v1/commands/patch_package", &everywhere, &[]).await;
    assert_eq!((status, held["approval"].as_str()), (202, Some("waiting")), "{held}");
    assert!(held["why"].as_str().unwrap().contains("100%"), "{held}");
    let one_site = json!({ "name": "kubelet", "version": "1.29.2", "selector": { "site_ids": [one] } }).to_string();
    let (status, sent) = api.post(ALICE, "/v1/commands/patch_package", &one_site, &[]).await;
    assert_eq!(status, 202, "{sent}");
    assert!(sent["stream_sequence"].is_u64() && sent.get("approval").is_none(), "published at once: {sent}");

    // Held, not published.
    let before = commands_stored(&fleet.bus).await;
    let (status, held) = api.post(ALICE, "/v1/commands/decommission_site", &decommission(&one), &[]).await;
    assert_eq!((status, held["approval"].as_str()), (202, Some("waiting")), "{held}");
    assert_eq!(held["requested_by"], "token:alice");
    let refused_id = held["id"].as_str().unwrap().to_string();
    assert_eq!(commands_stored(&fleet.bus).await, before, "nothing is published while it waits");
    assert!(events_of(&api, &refused_id, "ApprovalRequested").await.contains(&"ApprovalRequested".to_string()));
    let (_, waiting) = api.get(VIEWER, "/v1/approvals").await;
    assert!(waiting["items"].as_array().unwrap().iter().any(|h| h["id"] == refused_id.as_str()), "{waiting}");

    // Its author cannot approve it; a viewer cannot decide at all; bob refuses it.
    let approve = |id: &str| format!("/v1/approvals/{id}/approve");
    let refuse = |id: &str| format!("/v1/approvals/{id}/refuse");
    let (status, err) = api.post(ALICE, &approve(&refused_id), "", &[]).await;
    assert_eq!(status, 403, "{err}");
    assert!(err["message"].as_str().unwrap().contains("second person"), "{err}");
    assert_eq!(api.post(VIEWER, &approve(&refused_id), "", &[]).await.0, 403);
    let (status, decided) = api.post(BOB, &refuse(&refused_id), "{\"reason\": \"not this week\"}", &[]).await;
    assert_eq!((status, decided["state"].as_str()), (200, Some("refused")), "{decided}");
    assert_eq!(decided["decided_by"], "token:bob");
    let (status, err) = api.post(BOB, &approve(&refused_id), "", &[]).await;
    assert_eq!(status, 409, "a refusal stands: {err}");
    assert!(events_of(&api, &refused_id, "ApprovalRefused").await.contains(&"ApprovalRefused".to_string()));
    assert_eq!(commands_stored(&fleet.bus).await, before, "a refused command is never published");

    // Approved by bob: published under its own id, on record as alice's.
    let (_, held) = api.post(ALICE, "/v1/commands/decommission_site", &decommission(&two), &[]).await;
    let id = held["id"].as_str().unwrap().to_string();
    let (status, decided) = api.post(BOB, &approve(&id), "", &[]).await;
    assert_eq!((status, decided["state"].as_str()), (200, Some("approved")), "{decided}");
    let record = settled(&api, &id).await;
    assert_eq!(
        (record["actor"].as_str(), record["type"].as_str()),
        (Some("token:alice"), Some("landfall.v1.DecommissionSite"))
    );
    let kinds = events_of(&api, &id, "CommandApproved").await;
    assert!(
        kinds.contains(&"ApprovalRequested".to_string()) && kinds.contains(&"CommandApproved".to_string()),
        "{kinds:?}"
    );
    // Approving again publishes nothing new.
    let stored = commands_stored(&fleet.bus).await;
    assert_eq!(api.post(BOB, &approve(&id), "", &[]).await.0, 200);
    assert_eq!(commands_stored(&fleet.bus).await, stored);
}
