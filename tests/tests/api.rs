//! The HTTP API against a running fleet: a real nats-server, the real consumers and gateways,
//! and the API served on a real port.

use std::time::Duration;

use landfall_tests::api::{Api, OPERATOR, Sse, VIEWER};
use landfall_tests::fleet::{Fleet, commands_stored};
use landfall_tests::nats::NatsServer;
use serde_json::{Value, json};

const INSTALL: &str = "/v1/commands/install_site";

fn kinds(events: &[Sse]) -> Vec<&str> {
    events.iter().map(|e| e.event.as_str()).collect()
}

async fn wait_site(api: &Api, site: &str, state: &str) -> Value {
    for _ in 0..200 {
        let (status, body) = api.get(VIEWER, &format!("/v1/sites/{site}")).await;
        assert_eq!(status, 200, "{body}");
        if body["state"] == state {
            return body;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{site} never became {state}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewer_reads_an_operator_installs_and_the_read_model_follows_the_install() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(2).nodes(2).start().await;
    let api = Api::start(&fleet.bus).await;
    let site = fleet.site_id(0);

    // No token, an unknown one: 401 with the scheme to use.
    let r = api.http.get(api.url("/v1/sites")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers()["www-authenticate"], "Bearer realm=\"landfall\"");
    assert_eq!(api.get("not-a-token", "/v1/sites").await.0, 401);
    let (status, who) = api.get(VIEWER, "/v1/whoami").await;
    assert_eq!((status, who["role"].as_str()), (200, Some("viewer")));

    let (_, page) = api.get(VIEWER, "/v1/sites").await;
    assert_eq!(page["total"], 2);
    assert_eq!(page["items"][0]["state"], "registered");

    // A viewer cannot publish: 403, and the commands stream is untouched.
    let before = commands_stored(&fleet.bus).await;
    let body = json!({ "site_id": site }).to_string();
    let (status, err) = api.post(VIEWER, INSTALL, &body, &[]).await;
    assert_eq!(status, 403, "{err}");
    assert_eq!(err["error"], "forbidden");
    assert_eq!(commands_stored(&fleet.bus).await, before);

    // An operator can; the same Idempotency-Key again changes nothing.
    let key = uuid::Uuid::now_v7().to_string();
    let (status, accepted) = api.post(OPERATOR, INSTALL, &body, &[("idempotency-key", &key)]).await;
    assert_eq!(status, 202, "{accepted}");
    assert_eq!((accepted["id"].as_str(), accepted["duplicate"].as_bool()), (Some(key.as_str()), Some(false)));
    assert_eq!(accepted["subject"], format!("landfall.cmd.{site}.hub.install_site"));
    // Stored once: the bus drops the copy, or (once the command is settled) the API answers
    // with its outcome without publishing.
    let (status, again) = api.post(OPERATOR, INSTALL, &body, &[("idempotency-key", &key)]).await;
    assert_eq!(again["duplicate"].as_bool(), Some(true), "{again}");
    match status {
        202 => assert_eq!(again["stream_sequence"], accepted["stream_sequence"]),
        200 => assert_eq!(again["outcome"], "carried_out", "{again}"),
        other => panic!("{other}: {again}"),
    }
    assert_eq!(commands_stored(&fleet.bus).await, before + 1);

    // The install's events, over SSE, from the start: in stream order, each once, ending installed.
    let events = api
        .events(&format!("correlation={key}&from_seq=1"), None, Duration::from_secs(60), |got| {
            got.iter().any(|e| e.event == "SiteInstalled" || e.event == "SiteInstallFailed")
        })
        .await;
    let k = kinds(&events);
    assert_eq!(k.first(), Some(&"SiteInstallStarted"), "{k:?}");
    assert_eq!(k.last(), Some(&"SiteInstalled"), "{k:?}");
    assert_eq!(k.iter().filter(|e| **e == "SiteInstalled").count(), 1);
    let seqs: Vec<u64> = events.iter().map(|e| e.id.unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "stream order: {seqs:?}");
    assert!(events.iter().all(|e| e.data["correlation_id"] == key.as_str() && e.data["site"] == site.as_str()));
    assert_eq!(events[0].data["event"]["site_id"], site.as_str());

    // Settled: its outcome by id, and the same key again is answered with it, publishing nothing
    // (for as long as the ledger keeps it, not only the bus's duplicate window).
    let (status, settled) = api.get(VIEWER, &format!("/v1/commands/{key}")).await;
    assert_eq!((status, settled["outcome"].as_str()), (200, Some("carried_out")), "{settled}");
    assert_eq!(settled["type"], "landfall.v1.InstallSite");
    let (status, again) = api.post(OPERATOR, INSTALL, &body, &[("idempotency-key", &key)]).await;
    assert_eq!(
        (status, again["duplicate"].as_bool(), again["outcome"].as_str()),
        (200, Some(true), Some("carried_out"))
    );
    assert_eq!(commands_stored(&fleet.bus).await, before + 1);
    let other = json!({ "site_id": site, "design_revision": 0 }).to_string();
    let (status, err) = api.post(OPERATOR, "/v1/commands/stage_site", &other, &[("idempotency-key", &key)]).await;
    assert_eq!((status, err["error"].as_str()), (409, Some("conflict")), "{err}");
    let unknown = uuid::Uuid::now_v7();
    assert_eq!(api.get(VIEWER, &format!("/v1/commands/{unknown}")).await.0, 404);

    // The read model: the site, its nodes (Metal3 state, role, versions), the overview.
    let detail = wait_site(&api, &site, "installed").await;
    assert_eq!(detail["nodes_ready"], 2, "{detail}");
    assert_eq!(detail["install"]["id"], key.as_str());
    assert_eq!(detail["install"]["outcome"], "success");
    let nodes = detail["node_list"].as_array().unwrap();
    assert_eq!(nodes.len(), 2);
    for n in nodes {
        assert_eq!((n["step"].as_str(), n["metal3_state"].as_str()), (Some("ready"), Some("provisioned")), "{n}");
    }
    assert_eq!(nodes[0]["role"], "master");
    // What nodes run arrives from the observer a moment after the install ends.
    for _ in 0..100 {
        let (_, d) = api.get(VIEWER, &format!("/v1/sites/{site}")).await;
        if d["versions"]["kubelet"] == json!(["1.29.2"]) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, nodes) = api.get(VIEWER, &format!("/v1/sites/{site}/nodes")).await;
    let kubelet = nodes[1]["packages"].as_array().unwrap().iter().find(|p| p["name"] == "kubelet").cloned();
    assert_eq!(
        kubelet,
        Some(json!({"name": "kubelet", "version": "1.29.2", "kind": "binary", "desired": "1.29.2", "differs": false}))
    );
    let (_, overview) = api.get(VIEWER, "/v1/overview").await;
    assert_eq!(overview["sites"]["by_state"]["installed"], 1, "{overview}");
    assert_eq!(overview["sites"]["by_state"]["registered"], 1);
    assert_eq!(overview["nodes"]["by_step"]["ready"], 2);
    let (_, installed) = api.get(VIEWER, "/v1/sites?state=installed").await;
    assert_eq!(installed["items"].as_array().unwrap().len(), 1);
    let (_, packages) = api.get(VIEWER, "/v1/packages").await;
    assert_eq!(packages.as_array().unwrap().len(), fleet.catalog.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_refused_with_the_reason_and_publish_nothing() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(1).nodes(1).start().await;
    let api = Api::start(&fleet.bus).await;
    let before = commands_stored(&fleet.bus).await;

    let refused = [
        ("{\"site_id\": ", 400, "bad_request", "EOF"),
        ("{\"site\": \"edge-01\"}", 400, "bad_request", "unknown field `site`"),
        ("{\"site_id\": 7}", 400, "bad_request", "invalid type"),
        ("{\"site_id\": \"Edge 01\"}", 422, "invalid", "lowercase letters"),
        ("{}", 422, "invalid", "site_id"),
    ];
    for (body, status, code, says) in refused {
        let (got, err) = api.post(OPERATOR, INSTALL, body, &[]).await;
        assert_eq!((got, err["error"].as_str()), (status, Some(code)), "{body}: {err}");
        assert!(err["message"].as_str().unwrap().contains(says), "{body}: {err}");
    }
    let node = r#"{"site_id": "edge-01", "node": {"name": "n9", "role": "boss", "boot_mac": "52:54:00:00:00:09"}}"#;
    let (got, err) = api.post(OPERATOR, "/v1/commands/node_added", node, &[]).await;
    assert_eq!(got, 400, "{err}");
    assert!(err["message"].as_str().unwrap().contains("expected one of unspecified, master, worker"), "{err}");
    let (got, err) = api.post(OPERATOR, "/v1/commands/pause_rollout", r#"{"rollout_id": "r1"}"#, &[]).await;
    assert_eq!((got, err["error"].as_str()), (422, Some("invalid")), "{err}");
    let (got, _) = api.post(OPERATOR, INSTALL, r#"{"site_id": "edge-01"}"#, &[("idempotency-key", "twelve")]).await;
    assert_eq!(got, 400);

    // Not JSON.
    let r = api
        .http
        .post(api.url(INSTALL))
        .bearer_auth(OPERATOR)
        .header("content-type", "application/x-www-form-urlencoded")
        .body("site_id=edge-01")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 415);

    // Too large for the bus (1 MiB of protobuf), and too large for the API (4 MiB of JSON).
    let huge = "x".repeat(1_200_000);
    let design = json!({ "design": { "site_id": "edge-09", "labels": { "note": huge } } }).to_string();
    let (got, err) = api.post(OPERATOR, "/v1/commands/register_site", &design, &[]).await;
    assert_eq!((got, err["error"].as_str()), (413, Some("too_large")), "{}", err["message"]);
    // The client is still sending when the API knows the answer: it must get the answer anyway,
    // every time, not a reset connection.
    let body = json!({ "site_id": "x".repeat(5 << 20) }).to_string();
    for _ in 0..5 {
        let (got, err) = api.post(OPERATOR, INSTALL, &body, &[]).await;
        assert_eq!((got, err["error"].as_str()), (413, Some("too_large")));
    }

    assert_eq!(commands_stored(&fleet.bus).await, before, "a refused request published nothing");

    // What only the orchestrator can judge is published, and its refusal comes back as an event.
    let (got, accepted) = api.post(OPERATOR, INSTALL, r#"{"site_id": "nowhere"}"#, &[]).await;
    assert_eq!(got, 202);
    let id = accepted["id"].as_str().unwrap();
    let events =
        api.events(&format!("correlation={id}&from_seq=1"), None, Duration::from_secs(20), |got| !got.is_empty()).await;
    assert_eq!(kinds(&events), ["CommandRejected"]);
    assert_eq!(events[0].data["event"]["code"], "REJECT_CODE_UNKNOWN_SITE");

    // Bad queries and paths.
    for path in ["/v1/sites?state=burning", "/v1/sites?limit=0", "/v1/sites?colour=red", "/v1/events?type=Exploded"] {
        let (got, err) = api.get(VIEWER, path).await;
        assert_eq!((got, err["error"].as_str()), (400, Some("bad_request")), "{path}: {err}");
    }
    assert_eq!(api.get(VIEWER, "/v1/sites/nowhere").await.0, 404);
    assert_eq!(api.get(VIEWER, "/v1/rollouts/not-a-uuid").await.0, 404);
    assert_eq!(api.get(VIEWER, "/v2/anything").await.0, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_reconnects_with_last_event_id_misses_nothing_and_sees_nothing_twice() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(1).nodes(3).start().await;
    let api = Api::start(&fleet.bus).await;
    let site = fleet.site_id(0);
    let cmd = fleet.install(&site).await;
    fleet.wait_install(&cmd).await;

    let query = format!("site={site}&from_seq=1");
    let done = |got: &[Sse]| got.iter().any(|e| e.event == "SiteInstalled");
    let whole = api.events(&query, None, Duration::from_secs(20), done).await;
    assert!(whole.len() > 10, "{:?}", kinds(&whole));

    // Cut after five events, then reconnect as a browser does.
    let first = api.events(&query, None, Duration::from_secs(20), |got| got.len() >= 5).await;
    let last = first.last().unwrap().id.unwrap();
    let rest = api.events(&query, Some(last), Duration::from_secs(20), done).await;
    let joined: Vec<Option<u64>> = first.iter().chain(&rest).map(|e| e.id).collect();
    let expected: Vec<Option<u64>> = whole.iter().map(|e| e.id).collect();
    assert_eq!(joined, expected);

    // Filters by type, and live events after the reader started.
    let only =
        api.events(&format!("{query}&type=NodeOsProvisioned"), None, Duration::from_secs(20), |g| g.len() >= 3).await;
    assert_eq!(kinds(&only), ["NodeOsProvisioned"; 3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_api_ends_its_event_streams_instead_of_waiting_for_the_clients() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(1).nodes(1).start().await;
    let api = std::sync::Arc::new(Api::start(&fleet.bus).await);
    let stopper = api.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        stopper.stop();
    });
    let started = std::time::Instant::now();
    // A live stream with nothing to say: only the stop can end it before the 20 s are up.
    let got = api.events("site=edge-01", None, Duration::from_secs(20), |_| false).await;
    assert!(got.is_empty());
    assert!(started.elapsed() < Duration::from_secs(5), "the stream outlived the API: {:?}", started.elapsed());
}
