//! The API at a core (`deploy core-config`): every region below it read and commanded from one
//! place, each through its own hub's JetStream domain.
//!
//! - `/regions/<region>/v1/…` is the whole API of one region: its read model follows the
//!   region's buckets and events stream across the region's link ([`Bus::in_region`]), the
//!   command ledger it answers from is the region's, and a command posted there is kept at the
//!   core for the region (`landfall.region.<region>.cmd.…`), which the region's commands stream
//!   takes (`deploy region-link`). The CLI reads and commands a region with
//!   `--api <core>/regions/<region>`.
//! - `/v1/regions` lists the regions, each with its overview as the caller may see it.
//! - The tokens, the policy and the identity provider are the core's, the same for every
//!   region. The dashboard is served by each region's own API, not here.
//!
//! A region whose hub is out of reach keeps the last of it the model read (its `caught_up`
//! says so until its watches are back); the others are not held up by it.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use bus_schema::access::{check_region, region_domain};
use bus_schema::runtime::Bus;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::auth::Role;
use super::{ApiError, ApiState, Gate, MetricsRender, api_routes, at_least, bearer, model, principal, views};

/// The regions the core's API serves, in the order named.
#[derive(Clone)]
struct Regions(Arc<Vec<(String, ApiState)>>);

impl Regions {
    /// Whom a request to the core's own routes is from: the tokens and policy are every
    /// region's alike, so the first region's state checks them.
    async fn who(&self, token: Option<String>) -> Result<super::auth::Principal, ApiError> {
        let (_, first) = &self.0[0];
        principal(first, token).await
    }
}

/// The core's API: each region of `regions` under `/regions/<region>/`, and the list of them at
/// `/v1/regions`. `bus` is a connection to the core; each region's ledger is opened through
/// its domain, so every region named must answer once when the API starts.
///
/// # Errors
/// A region named twice or not a region's name, a region whose ledger cannot be opened, or an
/// address that cannot be bound.
pub async fn serve_regions(
    bus: Bus,
    regions: &[String],
    gate: Gate,
    listen: SocketAddr,
    metrics: Option<MetricsRender>,
    shutdown: CancellationToken,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<anyhow::Result<()>>)> {
    anyhow::ensure!(!regions.is_empty(), "the core's API needs at least one --region");
    let Gate { tokens, policy, oidc } = gate;
    let (tokens, policy) = (Arc::new(tokens), Arc::new(policy));
    let mut states = Vec::new();
    for region in regions {
        check_region(region).map_err(|e| anyhow::anyhow!("--region: {e}"))?;
        anyhow::ensure!(states.iter().all(|(r, _)| r != region), "--region: {region} is named twice");
        let at = bus.in_region(region);
        let ledger = at.kv(bus_schema::names::LEDGER_BUCKET).await.with_context(|| {
            format!("region {region}: its command ledger cannot be read through domain {}", region_domain(region))
        })?;
        let state = ApiState {
            model: model::Model::start(&at, &shutdown),
            bus: at,
            ledger,
            tokens: tokens.clone(),
            policy: policy.clone(),
            oidc: oidc.clone(),
            metrics: metrics.clone(),
            shutdown: shutdown.clone(),
        };
        states.push((region.clone(), state));
    }
    let document = Arc::new(document(regions).to_string());
    let app = router(Regions(Arc::new(states)), metrics, document);
    let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("cannot listen on {listen}"))?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned()).await.context("the HTTP API")
    });
    tracing::info!(%addr, regions = ?regions, "the core's HTTP API listening");
    Ok((addr, task))
}

fn router(regions: Regions, metrics: Option<MetricsRender>, document: Arc<String>) -> Router {
    let mut app = Router::new()
        .route("/v1/regions", get(list))
        .route_layer(middleware::from_fn_with_state(regions.clone(), require_viewer))
        .route("/readyz", get(readyz))
        .with_state(regions.clone());
    for (name, state) in regions.0.iter() {
        app = app.nest(&format!("/regions/{name}"), api_routes(state.clone()));
    }
    app.route("/healthz", get(|| async { axum::Json(json!({ "status": "ok" })) }))
        .route("/metrics", get(move || async move { super::metrics_of(metrics.as_ref()) }))
        .route(
            "/openapi.json",
            get(move || async move { ([(header::CONTENT_TYPE, "application/json")], document.as_str().to_owned()) }),
        )
        .fallback(|| async {
            ApiError::not_found(
                "no such path: the core serves /v1/regions, and each region's API under /regions/<region>/v1/",
            )
        })
}

async fn require_viewer(State(regions): State<Regions>, mut req: Request, next: Next) -> Result<Response, ApiError> {
    let who = regions.who(bearer(&req).map(str::to_string)).await?;
    at_least(&who, Role::Viewer, "reading")?;
    req.extensions_mut().insert(who);
    Ok(next.run(req).await)
}

/// `GET /v1/regions`: each region, whether its read model has caught up, and its overview as
/// the caller may see it.
async fn list(State(regions): State<Regions>, axum::Extension(who): super::Who) -> axum::Json<Value> {
    let listed: Vec<Value> = regions
        .0
        .iter()
        .map(|(name, state)| {
            let st = state.model.read();
            json!({
                "region": name,
                "domain": region_domain(name),
                "api": format!("/regions/{name}/v1"),
                "read_model_caught_up": st.ready(),
                "overview": views::overview(&st, views::Sees::of(&who)),
            })
        })
        .collect();
    axum::Json(Value::Array(listed))
}

/// Ready once connected to the core and every region's read model has caught up.
async fn readyz(State(regions): State<Regions>) -> (StatusCode, axum::Json<Value>) {
    let (_, first) = &regions.0[0];
    let connected = first.bus.client().connection_state() == async_nats::connection::State::Connected;
    let behind: Vec<&str> =
        regions.0.iter().filter(|(_, s)| !s.model.read().ready()).map(|(name, _)| name.as_str()).collect();
    let status = if connected && behind.is_empty() { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, axum::Json(json!({ "bus_connected": connected, "regions_behind": behind })))
}

/// The core's OpenAPI document: a hub's, each path under `/regions/{region}` (one of
/// `regions`), and `/v1/regions`.
pub fn document(regions: &[String]) -> Value {
    let mut doc = super::openapi::document();
    let region = json!({
        "name": "region", "in": "path", "required": true,
        "description": "A region below this core, read and commanded through its hub's JetStream domain.",
        "schema": { "type": "string", "enum": regions },
    });
    let hub_paths = std::mem::take(&mut doc["paths"]);
    let mut paths = serde_json::Map::new();
    for (path, mut item) in hub_paths.as_object().cloned().unwrap_or_default() {
        // Beside any parameters the path already has at its own level.
        if let Some(item) = item.as_object_mut() {
            match item.get_mut("parameters").and_then(Value::as_array_mut) {
                Some(given) => given.push(region.clone()),
                None => _ = item.insert("parameters".into(), json!([region.clone()])),
            }
        }
        paths.insert(format!("/regions/{{region}}{path}"), item);
    }
    paths.insert(
        "/v1/regions".into(),
        json!({ "get": {
            "summary": "The regions",
            "description": "Each region below this core: its domain, where its API is, whether the core's read model of it has caught up, and its overview as the caller may see it.",
            "operationId": "regions",
            "tags": ["regions"],
            "responses": {
                "200": { "description": "The regions, in the order the core was given them.",
                         "content": { "application/json": { "schema": { "type": "array", "items": { "type": "object" } } } } },
                "401": { "description": "No token, or an unknown one." },
            },
        } }),
    );
    doc["paths"] = Value::Object(paths);
    doc["info"]["description"] = json!(
        "The API of a core: each region's API under /regions/{region}, as a hub serves it, and the list of regions."
    );
    doc
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_cores_document_has_every_hub_path_under_each_region_and_the_list() {
        let hub = super::super::openapi::document();
        let core = super::document(&["eu".into(), "us".into()]);
        let hub_paths = hub["paths"].as_object().unwrap();
        let core_paths = core["paths"].as_object().unwrap();
        assert_eq!(core_paths.len(), hub_paths.len() + 1);
        for path in hub_paths.keys() {
            let under = &core_paths[&format!("/regions/{{region}}{path}")];
            let region = under["parameters"].as_array().unwrap().iter().find(|p| p["name"] == "region").unwrap();
            assert_eq!(region["schema"]["enum"], serde_json::json!(["eu", "us"]), "{path}");
        }
        assert!(core_paths["/v1/regions"]["get"].is_object());
    }
}
