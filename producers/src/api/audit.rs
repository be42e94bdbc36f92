//! `GET /v1/audit`: who did what, when, to which sites, with what outcome (the command ledger,
//! [`crate::views::audit`]), as much of it as the reader may see.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use bus_schema::{names, pb};
use serde::Deserialize;
use serde_json::Value;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::auth::{Principal, Role};
use super::state::{ApiError, ApiState};
use crate::views::audit::{self, DEFAULT_LIMIT, Filter};

/// What an audit request asks for.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    /// `user:alice`, or `alice` for any kind of actor of that name.
    pub actor: Option<String>,
    /// The site the commands were about (`fleet`: fleet-wide ones).
    pub site: Option<String>,
    /// The command kind (`install_site`, `InstallSite`).
    pub kind: Option<String>,
    /// `carried_out`, `rejected` or `dead_lettered`.
    pub outcome: Option<String>,
    /// From this time (RFC 3339); default: the 7 days up to `until`, or to now.
    pub since: Option<String>,
    /// Up to this time (RFC 3339).
    pub until: Option<String>,
    /// The newest this many (1–1000, default 100).
    pub limit: Option<u32>,
}

/// How far back a listing without `since` goes.
pub const DEFAULT_WINDOW: time::Duration = time::Duration::days(7);

fn time_of(field: &str, value: &Option<String>) -> Result<Option<OffsetDateTime>, String> {
    value
        .as_deref()
        .map(|v| OffsetDateTime::parse(v, &Rfc3339).map_err(|e| format!("{field}: {v:?} is not an RFC 3339 time: {e}")))
        .transpose()
}

/// The filter a query asks for.
pub fn filter(q: &AuditQuery) -> Result<Filter, String> {
    let until = time_of("until", &q.until)?;
    // Without `since`, the 7 days up to `until` (or now).
    let since =
        time_of("since", &q.since)?.unwrap_or_else(|| until.unwrap_or_else(OffsetDateTime::now_utc) - DEFAULT_WINDOW);
    let filter = Filter {
        actor: q.actor.clone().filter(|s| !s.is_empty()),
        site: q.site.clone().filter(|s| !s.is_empty()),
        kind: q.kind.clone().filter(|s| !s.is_empty()),
        outcome: q.outcome.clone().filter(|s| !s.is_empty()),
        since: Some(since),
        until,
        limit: q.limit.map_or(DEFAULT_LIMIT, |l| l as usize),
    };
    filter.check()?;
    Ok(filter)
}

/// Whether `who` may read the record of a command: a reader of the whole fleet reads every one;
/// another, those about a site they may read, and the ones they sent themselves.
pub fn may_read(api: &ApiState, who: &Principal, r: &pb::CommandRecord) -> bool {
    if who.over_fleet(Role::Viewer) || (!r.actor.is_empty() && r.actor == who.actor) {
        return true;
    }
    r.scope != names::FLEET && api.model.read().designs.get(&r.scope).is_some_and(|d| who.may(Role::Viewer, &d.labels))
}

pub(super) async fn list(
    State(api): State<ApiState>,
    axum::Extension(who): axum::Extension<Principal>,
    query: Result<Query<AuditQuery>, QueryRejection>,
) -> Result<axum::Json<Value>, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let filter = filter(&q).map_err(ApiError::bad_request)?;
    let (entries, stopped) = audit::list(&api.bus, &filter, |r| may_read(&api, &who, r)).await.map_err(|e| {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "bus_unavailable", format!("the command ledger: {e:#}"))
    })?;
    Ok(axum::Json(audit::listing_json(&entries, stopped)))
}

/// `/v1/audit` and `/v1/auth`, for the OpenAPI document.
pub(super) fn paths(error: fn(&str) -> Value) -> Vec<(&'static str, Value)> {
    let text = |d: &str| serde_json::json!({ "type": "string", "description": d });
    let param = |name: &str, d: &str| serde_json::json!({ "name": name, "in": "query", "schema": text(d) });
    let sign_in = serde_json::json!({ "get": {
        "summary": "How to sign in",
        "description": "The identity provider whose access tokens the API accepts, with the clients the dashboard and `landfall login` use (authorization code with PKCE, device code), or `null` when the API takes static tokens only. Needs no token.",
        "operationId": "auth",
        "tags": ["auth"],
        "security": [],
        "responses": { "200": { "description": "How to sign in.", "content": { "application/json": { "schema": {
            "type": "object", "required": ["oidc"],
            "properties": { "oidc": { "type": "object", "nullable": true, "additionalProperties": true } } } } } } },
    }});
    vec![
        ("/v1/auth", sign_in),
        (
            "/v1/audit",
            serde_json::json!({ "get": {
                "summary": "Who did what",
                "description": "The commands the orchestrator settled, newest first: who asked (`actor`), what, about which site, when, with what outcome, from the command ledger. A reader of part of the fleet sees the commands about its sites and the ones it sent.",
                "operationId": "audit",
                "tags": ["audit"],
                "parameters": [
                    param("actor", "`user:alice`, or `alice` for any kind of actor of that name."),
                    param("site", "The site the commands were about (`fleet`: fleet-wide ones)."),
                    param("kind", "The command kind: install_site, InstallSite or landfall.v1.InstallSite."),
                    { "name": "outcome", "in": "query", "schema": { "type": "string", "enum": ["carried_out", "rejected", "dead_lettered"] } },
                    { "name": "since", "in": "query", "description": "From this time (default: the 7 days up to `until`, or to now).", "schema": { "type": "string", "format": "date-time" } },
                    { "name": "until", "in": "query", "description": "Up to this time.", "schema": { "type": "string", "format": "date-time" } },
                    { "name": "limit", "in": "query", "description": "The newest this many.", "schema": { "type": "integer", "minimum": 1, "maximum": crate::views::audit::MAX_LIMIT } },
                ],
                "responses": {
                    "200": { "description": "The commands.", "content": { "application/json": { "schema": {
                        "type": "object", "required": ["items", "truncated"],
                        "properties": {
                            "items": { "type": "array", "items": { "$ref": "#/components/schemas/Command" } },
                            "truncated": { "type": "boolean", "description": "The window was too long to read whole: narrow it with `since`." },
                        } } } } },
                    "400": error("A query parameter is wrong."),
                    "401": error("No token, or an unknown one."),
                    "403": error("The policy grants the caller nothing."),
                    "503": error("The command ledger could not be read."),
                },
            }}),
        ),
    ]
}
