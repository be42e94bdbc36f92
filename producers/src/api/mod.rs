//! The HTTP API and dashboard: commands in as JSON, the fleet's read models out, events as
//! Server-Sent Events, an OpenAPI document at `/openapi.json`, and the dashboard at `/`.
//!
//! It is one more client of the bus: commands are published like the CLI's, reads come from
//! an in-memory [`model::Model`] kept up to date from KV watches and the events stream. Any
//! number of replicas can run side by side.

pub mod auth;
pub mod commands;
pub(crate) mod facts;
mod identity;
pub mod model;
pub mod oidc;
pub mod openapi;
pub mod sse;
mod state;
pub mod views;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use axum::Router;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bus_schema::runtime::{Bus, store_health};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::views::rollout;
use auth::{Principal, Role, Tokens};
use state::MAX_BODY;
pub use state::{ApiError, ApiState, MetricsRender};

/// Where the API listens and whom it lets in.
#[derive(Debug, Clone, clap::Args)]
pub struct ApiArgs {
    /// Where the HTTP API and dashboard listen.
    #[arg(long = "api-listen", env = "LANDFALL_API_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// The bearer tokens the API accepts, with their roles (YAML: `tokens: [{name, role:
    /// viewer|operator, token | sha256}]`). `landfall up` makes one in its data directory.
    #[arg(long = "api-tokens", env = "LANDFALL_API_TOKENS_FILE")]
    pub tokens: Option<PathBuf>,
}

/// The whole API.
pub fn router(state: ApiState) -> Router {
    let read = Router::new()
        .route("/v1/overview", get(overview))
        .route("/v1/sites", get(sites))
        .route("/v1/sites/{site}", get(site))
        .route("/v1/sites/{site}/nodes", get(site_nodes))
        .route("/v1/sites/{site}/charts", get(site_charts))
        .route("/v1/packages", get(packages))
        .route("/v1/rollouts", get(rollouts))
        .route("/v1/rollouts/{id}", get(rollout))
        .route("/v1/commands/{id}", get(command))
        .route("/v1/events", get(sse::events))
        .route("/v1/whoami", get(whoami))
        .merge(identity::read_routes())
        .route_layer(middleware::from_fn_with_state(state.clone(), require_viewer));
    let write = commands::routes()
        .merge(identity::write_routes())
        .route_layer(middleware::from_fn_with_state(state.clone(), require_operator));
    Router::new()
        .merge(read)
        .merge(write)
        .route("/openapi.json", get(openapi_document))
        .route("/healthz", get(|| async { axum::Json(json!({ "status": "ok" })) }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .merge(dashboard::routes())
        .fallback(|| async { ApiError::not_found("no such path (the API is described at /openapi.json)") })
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
        .with_state(state)
}

/// Serves the API on `listen` until `shutdown`; returns the address it is bound to.
///
/// # Errors
/// When the address cannot be bound.
pub async fn serve(
    bus: Bus,
    tokens: Tokens,
    listen: SocketAddr,
    metrics: Option<MetricsRender>,
    shutdown: CancellationToken,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<anyhow::Result<()>>)> {
    if tokens.is_empty() {
        tracing::warn!("the API has no tokens: every request to /v1 will be refused (see --api-tokens)");
    }
    let model = model::Model::start(&bus, &shutdown);
    let ledger = bus.kv(bus_schema::names::LEDGER_BUCKET).await?;
    let state = ApiState { bus, model, ledger, tokens: Arc::new(tokens), metrics, shutdown: shutdown.clone() };
    let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("cannot listen on {listen}"))?;
    let addr = listener.local_addr()?;
    let app = router(state);
    let task = tokio::spawn(async move {
        axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned()).await.context("the HTTP API")
    });
    tracing::info!(%addr, "HTTP API and dashboard listening");
    Ok((addr, task))
}

fn bearer(req: &Request) -> Option<&str> {
    let value = req.headers().get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then_some(token.trim())
}

fn principal(state: &ApiState, req: &Request) -> Result<Principal, ApiError> {
    let token = bearer(req).ok_or_else(|| {
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", "send a token: Authorization: Bearer <token>")
    })?;
    state
        .tokens
        .check(token)
        .cloned()
        .ok_or_else(|| ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", "the token is not known"))
}

async fn require_viewer(State(state): State<ApiState>, mut req: Request, next: Next) -> Result<Response, ApiError> {
    let who = principal(&state, &req)?;
    req.extensions_mut().insert(who);
    Ok(next.run(req).await)
}

async fn require_operator(State(state): State<ApiState>, mut req: Request, next: Next) -> Result<Response, ApiError> {
    let who = principal(&state, &req)?;
    if who.role < Role::Operator {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("{:?} is a {}: publishing commands takes an operator token", who.name, who.role.as_str()),
        ));
    }
    tracing::debug!(principal = %who.name, path = %req.uri().path(), "command request");
    req.extensions_mut().insert(who);
    Ok(next.run(req).await)
}

async fn whoami(axum::Extension(who): axum::Extension<Principal>) -> axum::Json<Value> {
    axum::Json(json!({ "name": who.name, "role": who.role.as_str() }))
}

async fn overview(State(s): State<ApiState>) -> axum::Json<Value> {
    axum::Json(views::overview(&s.model.read()))
}

async fn sites(
    State(s): State<ApiState>,
    query: Result<Query<views::SiteQuery>, QueryRejection>,
) -> Result<axum::Json<Value>, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    views::sites_page(&s.model.read(), &q).map(axum::Json).map_err(ApiError::bad_request)
}

async fn site(State(s): State<ApiState>, Path(site): Path<String>) -> Result<axum::Json<Value>, ApiError> {
    views::site_detail(&s.model.read(), &site)
        .map(axum::Json)
        .ok_or_else(|| ApiError::not_found(format!("site {site:?} is not registered")))
}

async fn site_nodes(State(s): State<ApiState>, Path(site): Path<String>) -> Result<axum::Json<Value>, ApiError> {
    let st = s.model.read();
    let design =
        st.designs.get(&site).ok_or_else(|| ApiError::not_found(format!("site {site:?} is not registered")))?;
    Ok(axum::Json(Value::Array(views::site_nodes(&st, &site, design))))
}

/// The helm charts rendered for a site, from KV (the read model holds no renders).
async fn site_charts(State(s): State<ApiState>, Path(site): Path<String>) -> Result<axum::Json<Value>, ApiError> {
    if !s.model.read().designs.contains_key(&site) {
        return Err(ApiError::not_found(format!("site {site:?} is not registered")));
    }
    match crate::views::charts::site_charts(&s.bus, &site).await {
        Ok(charts) => Ok(axum::Json(charts)),
        Err(e) => Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "bus_unavailable", format!("{e:#}"))),
    }
}

async fn packages(State(s): State<ApiState>) -> axum::Json<Value> {
    axum::Json(views::catalog(&s.model.read()))
}

async fn rollouts(State(s): State<ApiState>) -> axum::Json<Value> {
    axum::Json(views::rollouts(&s.model.read()))
}

async fn rollout(State(s): State<ApiState>, Path(id): Path<String>) -> Result<axum::Json<Value>, ApiError> {
    let id = rollout::rollout_id(&id).map_err(|e| ApiError::not_found(e.to_string()))?;
    match rollout::rollout_detail(&s.bus, &id).await {
        Ok(Some((r, sites))) => Ok(axum::Json(rollout::rollout_show_json(&r, &sites))),
        Ok(None) => Err(ApiError::not_found(format!("there is no rollout {id}"))),
        Err(e) => Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "bus_unavailable", format!("{e:#}"))),
    }
}

/// How a command was settled, from the command ledger.
async fn command(State(s): State<ApiState>, Path(id): Path<String>) -> Result<axum::Json<Value>, ApiError> {
    let id = uuid::Uuid::parse_str(id.trim())
        .map_err(|_| ApiError::not_found(format!("{id:?} is not a command id (a UUID)")))?;
    match commands::settled(&s.ledger, &id.to_string()).await? {
        Some(record) => Ok(axum::Json(crate::views::command::command_json(&record))),
        None => Err(ApiError::not_found(format!(
            "command {id} is not settled: it is still queued or waiting, or was never published"
        ))),
    }
}

async fn readyz(State(s): State<ApiState>) -> (StatusCode, axum::Json<Value>) {
    let connected = s.bus.client().connection_state() == async_nats::connection::State::Connected;
    let caught_up = s.model.read().ready();
    let status = if connected && caught_up { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    // A full store does not stop the API serving what it has read: said, not failed on.
    let full = match store_health::store_use(&s.bus).await {
        Ok(usage) => store_health::assess(&usage, &store_health::refused_within(store_health::REFUSED_FOR)),
        Err(_) => Vec::new(),
    };
    let full: Vec<Value> = full
        .iter()
        .map(|f| json!({ "stream": f.stream, "bytes": f.bytes, "limit_bytes": f.limit_bytes, "reason": f.reason }))
        .collect();
    (status, axum::Json(json!({ "bus_connected": connected, "read_model_caught_up": caught_up, "store_full": full })))
}

async fn metrics(State(s): State<ApiState>) -> Response {
    match &s.metrics {
        Some(render) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], render()).into_response(),
        None => ApiError::not_found("metrics are not enabled in this process").into_response(),
    }
}

async fn openapi_document() -> Response {
    static DOC: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| openapi::document().to_string());
    ([(header::CONTENT_TYPE, "application/json")], DOC.as_str()).into_response()
}

mod dashboard {
    //! The dashboard: one page and its script and styles, compiled into the binary.
    use axum::Router;
    use axum::http::header;
    use axum::routing::get;

    const INDEX: &str = include_str!("dashboard/index.html");
    const SCRIPT: &str = include_str!("dashboard/app.js");
    const SIGN_IN: &str = include_str!("dashboard/signin.js");
    const STYLE: &str = include_str!("dashboard/app.css");

    pub(super) fn routes() -> Router<super::ApiState> {
        Router::new()
            .route("/", get(|| async { ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], INDEX) }))
            .route("/app.js", get(|| async { ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], SCRIPT) }))
            .route(
                "/signin.js",
                get(|| async { ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], SIGN_IN) }),
            )
            .route("/app.css", get(|| async { ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE) }))
    }
}
