//! The HTTP API and dashboard: commands in as JSON, the fleet's read models out, events as
//! Server-Sent Events, an OpenAPI document at `/openapi.json`, and the dashboard at `/`.
//!
//! It is one more client of the bus: commands are published like the CLI's, reads come from
//! an in-memory [`model::Model`] kept up to date from KV watches and the events stream. Any
//! number of replicas can run side by side.

mod approvals;
pub mod audit;
pub mod auth;
pub mod commands;
pub(crate) mod facts;
mod identity;
pub mod model;
pub mod oidc;
pub mod openapi;
pub mod policy;
mod reach;
pub mod regions;
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
use policy::Policy;
use state::MAX_BODY;
pub use state::{ApiError, ApiState, MetricsRender};

/// Where the API listens and whom it lets in.
#[derive(Debug, Clone, clap::Args)]
pub struct ApiArgs {
    /// Where the HTTP API and dashboard listen.
    #[arg(long = "api-listen", env = "LANDFALL_API_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// The bearer tokens the API accepts, with their roles (YAML: `tokens: [{name, role:
    /// viewer|operator|admin, token | sha256}]`). `landfall up` makes one in its data directory.
    #[arg(long = "api-tokens", env = "LANDFALL_API_TOKENS_FILE")]
    pub tokens: Option<PathBuf>,
    /// Who may do what on which sites (YAML: `grants: [{group | user | token, role, sites:
    /// {label: value}}]`, `approval: {commands, rollout_share}`). Without one, tokens keep their
    /// roles over the whole fleet and people signed in through the identity provider have none.
    #[arg(long = "api-policy", env = "LANDFALL_API_POLICY")]
    pub policy: Option<PathBuf>,
    #[command(flatten)]
    pub oidc: oidc::OidcArgs,
}

impl ApiArgs {
    /// The policy the flags name (the empty one without `--api-policy`).
    ///
    /// # Errors
    /// When the file cannot be read or is wrong.
    pub fn policy(&self) -> anyhow::Result<Policy> {
        self.policy.as_deref().map_or_else(|| Ok(Policy::default()), Policy::from_file)
    }

    /// Whom the API lets in: `tokens`, the policy, and the identity provider's people.
    ///
    /// # Errors
    /// A wrong policy, or identity provider flags that do not go together.
    pub async fn gate(&self, tokens: Tokens) -> anyhow::Result<Gate> {
        Ok(Gate { tokens, policy: self.policy()?, oidc: oidc::Verifier::start(&self.oidc).await? })
    }
}

/// Whom the API lets in, and what each may do.
pub struct Gate {
    pub tokens: Tokens,
    pub policy: Policy,
    /// The identity provider whose access tokens it accepts, if any.
    pub oidc: Option<oidc::Verifier>,
}

/// The whole API, and the dashboard.
pub fn router(state: ApiState) -> Router {
    api_routes(state)
        .merge(dashboard::routes())
        .fallback(|| async { ApiError::not_found("no such path (the API is described at /openapi.json)") })
}

/// The API without the dashboard: what a core serves of each region (`regions`).
fn api_routes(state: ApiState) -> Router {
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
        .route("/v1/audit", get(audit::list))
        .route("/v1/policy", get(policy::show))
        .merge(approvals::read_routes())
        .merge(identity::read_routes().route_layer(middleware::from_fn(whole_fleet)))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_viewer));
    let write = commands::routes()
        .merge(approvals::write_routes())
        .merge(identity::write_routes().route_layer(middleware::from_fn(whole_fleet)))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_operator));
    Router::new()
        .merge(read)
        .merge(write)
        .route("/openapi.json", get(openapi_document))
        .route("/v1/auth", get(sign_in))
        .route("/healthz", get(|| async { axum::Json(json!({ "status": "ok" })) }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
        .with_state(state)
}

/// Serves the API on `listen` until `shutdown`; returns the address it is bound to.
///
/// # Errors
/// When the address cannot be bound.
pub async fn serve(
    bus: Bus,
    gate: Gate,
    listen: SocketAddr,
    metrics: Option<MetricsRender>,
    shutdown: CancellationToken,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<anyhow::Result<()>>)> {
    let Gate { tokens, policy, oidc } = gate;
    if tokens.is_empty() && oidc.is_none() {
        tracing::warn!("the API has no tokens: every request to /v1 will be refused (see --api-tokens)");
    }
    if oidc.is_some() && !policy.given {
        tracing::warn!("no --api-policy: people signed in through the identity provider may do nothing");
    }
    let model = model::Model::start(&bus, &shutdown);
    let ledger = bus.kv(bus_schema::names::LEDGER_BUCKET).await?;
    let state = ApiState {
        bus,
        model,
        ledger,
        tokens: Arc::new(tokens),
        policy: Arc::new(policy),
        oidc,
        metrics,
        shutdown: shutdown.clone(),
    };
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

async fn principal(state: &ApiState, token: Option<String>) -> Result<Principal, ApiError> {
    let token = token.ok_or_else(|| {
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", "send a token: Authorization: Bearer <token>")
    })?;
    if let Some(holder) = state.tokens.check(&token) {
        return Ok(Principal {
            name: holder.name.clone(),
            actor: format!("token:{}", holder.name),
            grants: state.policy.token(&holder.name, holder.role),
        });
    }
    let Some(verifier) = &state.oidc else {
        return Err(ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", "the token is not known"));
    };
    // Not a static token: an access token of the identity provider, or nothing.
    let person = verifier.verify(&token).await.map_err(|refused| {
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", format!("the token is refused: {}", refused.0))
    })?;
    let grants = state.policy.person(&[person.subject.as_str(), person.name.as_str()], &person.groups);
    Ok(Principal { actor: format!("user:{}", person.name), name: person.name, grants })
}

/// `GET /v1/auth`: how to sign in (no token needed): the identity provider's endpoints and
/// clients, or `null` when the API takes static tokens only.
async fn sign_in(State(s): State<ApiState>) -> axum::Json<Value> {
    axum::Json(json!({ "oidc": s.oidc.as_ref().map(oidc::Verifier::public_config) }))
}

/// Refuses a principal whose grants do not reach `role` anywhere.
fn at_least(who: &Principal, role: Role, doing: &str) -> Result<(), ApiError> {
    match who.role() {
        Some(held) if held >= role => Ok(()),
        held => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "{:?} is {}: {doing} takes {} somewhere in the fleet",
                who.name,
                held.map_or("granted nothing by the policy".to_string(), |r| format!("a {}", r.as_str())),
                role.as_str()
            ),
        )),
    }
}

async fn require_viewer(State(state): State<ApiState>, mut req: Request, next: Next) -> Result<Response, ApiError> {
    let who = principal(&state, bearer(&req).map(str::to_string)).await?;
    at_least(&who, Role::Viewer, "reading")?;
    req.extensions_mut().insert(who);
    Ok(next.run(req).await)
}

async fn require_operator(State(state): State<ApiState>, mut req: Request, next: Next) -> Result<Response, ApiError> {
    let who = principal(&state, bearer(&req).map(str::to_string)).await?;
    at_least(&who, Role::Operator, "publishing commands")?;
    tracing::debug!(principal = %who.name, path = %req.uri().path(), "command request");
    req.extensions_mut().insert(who);
    Ok(next.run(req).await)
}

/// Sites' identities (joining, revoking) are the whole fleet's business: a reader or operator of
/// part of it is refused them.
async fn whole_fleet(req: Request, next: Next) -> Result<Response, ApiError> {
    let Some(who) = req.extensions().get::<Principal>() else {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "send a token: Authorization: Bearer <token>",
        ));
    };
    let role = if req.method() == axum::http::Method::GET { Role::Viewer } else { Role::Operator };
    if !who.over_fleet(role) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "sites' identities take a {} of the whole fleet; {:?}'s grants cover part of it",
                role.as_str(),
                who.name
            ),
        ));
    }
    Ok(next.run(req).await)
}

async fn whoami(axum::Extension(who): axum::Extension<Principal>) -> axum::Json<Value> {
    let grants: Vec<Value> = who.grants.iter().map(|g| json!({ "role": g.role.as_str(), "sites": g.sites })).collect();
    axum::Json(json!({
        "name": who.name,
        "actor": who.actor,
        "role": who.role().map(Role::as_str),
        "grants": grants,
    }))
}

/// Whom a request is from (the guards put it there).
type Who = axum::Extension<Principal>;

/// A site that is not registered, or not one the reader may see: the same answer for both.
fn no_site(site: &str) -> ApiError {
    ApiError::not_found(format!("site {site:?} is not registered"))
}

async fn overview(State(s): State<ApiState>, axum::Extension(who): Who) -> axum::Json<Value> {
    axum::Json(views::overview(&s.model.read(), views::Sees::of(&who)))
}

async fn sites(
    State(s): State<ApiState>,
    axum::Extension(who): Who,
    query: Result<Query<views::SiteQuery>, QueryRejection>,
) -> Result<axum::Json<Value>, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    views::sites_page(&s.model.read(), &q, views::Sees::of(&who)).map(axum::Json).map_err(ApiError::bad_request)
}

async fn site(
    State(s): State<ApiState>,
    axum::Extension(who): Who,
    Path(site): Path<String>,
) -> Result<axum::Json<Value>, ApiError> {
    views::site_detail(&s.model.read(), &site, views::Sees::of(&who)).map(axum::Json).ok_or_else(|| no_site(&site))
}

async fn site_nodes(
    State(s): State<ApiState>,
    axum::Extension(who): Who,
    Path(site): Path<String>,
) -> Result<axum::Json<Value>, ApiError> {
    let st = s.model.read();
    let design = st.designs.get(&site).filter(|d| who.may(Role::Viewer, &d.labels)).ok_or_else(|| no_site(&site))?;
    Ok(axum::Json(Value::Array(views::site_nodes(&st, &site, design))))
}

/// The helm charts rendered for a site, from KV (the read model holds no renders).
async fn site_charts(
    State(s): State<ApiState>,
    axum::Extension(who): Who,
    Path(site): Path<String>,
) -> Result<axum::Json<Value>, ApiError> {
    if !s.model.read().designs.get(&site).is_some_and(|d| who.may(Role::Viewer, &d.labels)) {
        return Err(no_site(&site));
    }
    match crate::views::charts::site_charts(&s.bus, &site).await {
        Ok(charts) => Ok(axum::Json(charts)),
        Err(e) => Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "bus_unavailable", format!("{e:#}"))),
    }
}

async fn packages(State(s): State<ApiState>) -> axum::Json<Value> {
    axum::Json(views::catalog(&s.model.read()))
}

async fn rollouts(State(s): State<ApiState>, axum::Extension(who): Who) -> axum::Json<Value> {
    axum::Json(views::rollouts(&s.model.read(), views::Sees::of(&who)))
}

async fn rollout(
    State(s): State<ApiState>,
    axum::Extension(who): Who,
    Path(id): Path<String>,
) -> Result<axum::Json<Value>, ApiError> {
    let id = rollout::rollout_id(&id).map_err(|e| ApiError::not_found(e.to_string()))?;
    if !who.over_fleet(Role::Viewer) {
        let st = s.model.read();
        if !st.rollouts.get(&id).is_some_and(|r| views::Sees::of(&who).rollout(&st, r)) {
            return Err(ApiError::not_found(format!("there is no rollout {id}")));
        }
    }
    match rollout::rollout_detail(&s.bus, &id).await {
        Ok(Some((r, sites))) => Ok(axum::Json(rollout::rollout_show_json(&r, &sites))),
        Ok(None) => Err(ApiError::not_found(format!("there is no rollout {id}"))),
        Err(e) => Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "bus_unavailable", format!("{e:#}"))),
    }
}

/// How a command was settled, from the command ledger.
async fn command(
    State(s): State<ApiState>,
    axum::Extension(who): Who,
    Path(id): Path<String>,
) -> Result<axum::Json<Value>, ApiError> {
    let id = uuid::Uuid::parse_str(id.trim())
        .map_err(|_| ApiError::not_found(format!("{id:?} is not a command id (a UUID)")))?;
    match commands::settled(&s.ledger, &id.to_string()).await? {
        Some(record) if audit::may_read(&s, &who, &record) => {
            Ok(axum::Json(crate::views::command::command_json(&record)))
        }
        _ => Err(ApiError::not_found(format!(
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
    metrics_of(s.metrics.as_ref())
}

fn metrics_of(render: Option<&MetricsRender>) -> Response {
    match render {
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

    pub(super) fn routes() -> Router {
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
