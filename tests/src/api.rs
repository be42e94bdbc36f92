//! The HTTP API over a test fleet: served in this process on a free port, with one operator
//! and one viewer token, and a small client that speaks to it (JSON and Server-Sent Events).

use std::time::Duration;

use bus_schema::runtime::Bus;
use producers::api::auth::{Role, Tokens};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

pub const OPERATOR: &str = "operator-token-for-tests-0001";
pub const VIEWER: &str = "viewer-token-for-tests-00001";

/// A running API; stops when dropped.
pub struct Api {
    pub base: String,
    pub http: reqwest::Client,
    shutdown: CancellationToken,
}

impl Drop for Api {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// The operator's and the viewer's tokens, `more`, `policy` (YAML; empty: none), `oidc`.
fn gate(
    policy: &str,
    more: &[(&str, Role, &str)],
    oidc: Option<producers::api::oidc::Verifier>,
) -> producers::api::Gate {
    consumers::artifacts::install_tls_provider();
    let mut tokens = Tokens::default();
    tokens.add("test-operator", Role::Operator, OPERATOR);
    tokens.add("test-viewer", Role::Viewer, VIEWER);
    for (name, role, token) in more {
        tokens.add(name, *role, token);
    }
    let policy = if policy.is_empty() {
        producers::api::policy::Policy::default()
    } else {
        producers::api::policy::Policy::from_yaml(policy).expect("the test's policy")
    };
    producers::api::Gate { tokens, policy, oidc }
}

/// One Server-Sent Event.
#[derive(Debug, Clone, PartialEq)]
pub struct Sse {
    pub id: Option<u64>,
    pub event: String,
    pub data: Value,
}

impl Api {
    pub async fn start(bus: &Bus) -> Self {
        Self::start_with(bus, "", &[]).await
    }

    /// An API enforcing `policy` (YAML; empty: none), with these tokens besides the operator's
    /// and the viewer's, as (name, role, token).
    pub async fn start_with(bus: &Bus, policy: &str, more: &[(&str, Role, &str)]) -> Self {
        Self::start_full(bus, policy, more, None).await
    }

    /// [`Api::start_with`], accepting the access tokens of an identity provider too.
    pub async fn start_full(
        bus: &Bus,
        policy: &str,
        more: &[(&str, Role, &str)],
        oidc: Option<producers::api::oidc::Verifier>,
    ) -> Self {
        let shutdown = CancellationToken::new();
        let listen = "127.0.0.1:0".parse().unwrap();
        let gate = gate(policy, more, oidc);
        let (addr, _) = producers::api::serve(bus.clone(), gate, listen, None, shutdown.clone()).await.unwrap();
        Self::ready(Self { base: format!("http://{addr}"), http: reqwest::Client::new(), shutdown }).await
    }

    /// The API of a core (`serve api --region`), over a connection to the core: each region's
    /// under `/regions/<region>/`.
    pub async fn start_at_core(core: &Bus, regions: &[&str]) -> Self {
        let shutdown = CancellationToken::new();
        let listen = "127.0.0.1:0".parse().unwrap();
        let regions: Vec<String> = regions.iter().map(|r| r.to_string()).collect();
        let gate = gate("", &[], None);
        let (addr, _) =
            producers::api::regions::serve_regions(core.clone(), &regions, gate, listen, None, shutdown.clone())
                .await
                .unwrap();
        Self::ready(Self { base: format!("http://{addr}"), http: reqwest::Client::new(), shutdown }).await
    }

    async fn ready(api: Self) -> Self {
        // The read model has caught up once /readyz says so.
        for _ in 0..100 {
            if api.http.get(format!("{}/readyz", api.base)).send().await.is_ok_and(|r| r.status() == 200) {
                return api;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the API never became ready");
    }

    /// Gives site `i` of `fleet` the label `region` (re-registering it as the whole fleet's
    /// operator) and waits until the API's read model has it.
    pub async fn put_in_region(&self, fleet: &crate::fleet::Fleet, i: usize, region: &str) {
        let mut design = bus_schema::pb::SiteDesign::from(&fleet.sites[i].0);
        design.labels.insert("region".into(), region.into());
        let body =
            serde_json::to_string(&bus_schema::pb::RegisterSite { design: Some(design), expected: None }).unwrap();
        let (status, r) = self.post(OPERATOR, "/v1/commands/register_site", &body, &[]).await;
        assert_eq!(status, 202, "{r}");
        let path = format!("/v1/sites/{}", fleet.site_id(i));
        for _ in 0..300 {
            if self.get(OPERATOR, &path).await.1["labels"]["region"] == region {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{path} never showed region {region}");
    }

    /// Stops the API as a stopping process would.
    pub fn stop(&self) {
        self.shutdown.cancel();
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// GET with a token: the status and the body as JSON (`Null` when it is not JSON).
    pub async fn get(&self, token: &str, path: &str) -> (u16, Value) {
        let r = self.http.get(self.url(path)).bearer_auth(token).send().await.unwrap();
        let status = r.status().as_u16();
        (status, serde_json::from_slice(&r.bytes().await.unwrap()).unwrap_or(Value::Null))
    }

    /// POST a JSON body with a token (and extra headers).
    pub async fn post(&self, token: &str, path: &str, body: &str, headers: &[(&str, &str)]) -> (u16, Value) {
        let mut req = self
            .http
            .post(self.url(path))
            .bearer_auth(token)
            .header("content-type", "application/json")
            .body(body.to_string());
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        (status, serde_json::from_slice(&r.bytes().await.unwrap()).unwrap_or(Value::Null))
    }

    /// Reads `/v1/events?<query>` until `until` says stop (or `timeout`), returning what came.
    pub async fn events(
        &self,
        query: &str,
        last_event_id: Option<u64>,
        timeout: Duration,
        until: impl Fn(&[Sse]) -> bool,
    ) -> Vec<Sse> {
        self.events_as(VIEWER, query, last_event_id, timeout, until).await
    }

    /// [`Api::events`] with `token`.
    pub async fn events_as(
        &self,
        token: &str,
        query: &str,
        last_event_id: Option<u64>,
        timeout: Duration,
        until: impl Fn(&[Sse]) -> bool,
    ) -> Vec<Sse> {
        let mut req = self.http.get(self.url(&format!("/v1/events?{query}"))).bearer_auth(token);
        if let Some(id) = last_event_id {
            req = req.header("last-event-id", id.to_string());
        }
        let mut response = req.send().await.unwrap();
        assert_eq!(response.status(), 200, "GET /v1/events?{query}");
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        let mut got = Vec::new();
        let mut buffer = String::new();
        let read = async {
            while let Some(chunk) = response.chunk().await.unwrap() {
                buffer.push_str(&String::from_utf8_lossy(&chunk));
                while let Some(end) = buffer.find("\n\n") {
                    let frame: String = buffer.drain(..end + 2).collect();
                    if let Some(e) = parse_frame(&frame) {
                        got.push(e);
                    }
                }
                if until(&got) {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(timeout, read).await;
        got
    }
}

fn parse_frame(frame: &str) -> Option<Sse> {
    let (mut id, mut event, mut data) = (None, String::new(), String::new());
    for line in frame.lines() {
        if let Some(v) = line.strip_prefix("id:") {
            id = v.trim().parse().ok();
        } else if let Some(v) = line.strip_prefix("event:") {
            event = v.trim().to_string();
        } else if let Some(v) = line.strip_prefix("data:") {
            data.push_str(v.trim_start());
        }
    }
    (!event.is_empty()).then(|| Sse { id, event, data: serde_json::from_str(&data).unwrap_or(Value::String(data)) })
}
