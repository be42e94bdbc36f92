//! Sites' identities in the HTTP API: the requests to join and the identities (viewers), and
//! approving, denying and revoking (operators), each one request to the identity service
//! (`landfall serve identity`), as the CLI's `site enrollments|approve|deny|revoke|identities`.

use axum::Router;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use bus_schema::pb::{self, identity_admin::Op};
use serde_json::{Value, json};

use super::{ApiError, ApiState};
use crate::cli::identity::{Unanswered, request};

/// What a viewer may read.
pub(super) fn read_routes() -> Router<ApiState> {
    Router::new().route("/v1/enrollments", get(enrollments)).route("/v1/identities", get(identities))
}

/// What an operator may do.
pub(super) fn write_routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/enrollments/{key}/approve", post(approve))
        .route("/v1/enrollments/{key}/deny", post(deny))
        .route("/v1/sites/{site}/revoke", post(revoke))
}

impl From<Unanswered> for ApiError {
    fn from(e: Unanswered) -> Self {
        match e {
            Unanswered::NoService | Unanswered::Bus(_) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", e.to_string())
            }
            Unanswered::Refused(why) if why.starts_with("no request") || why.contains("no identity to revoke") => {
                ApiError::not_found(why)
            }
            Unanswered::Refused(why) => ApiError::new(StatusCode::CONFLICT, "refused", why),
        }
    }
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct EnrollmentQuery {
    /// Decided requests too.
    #[serde(default)]
    all: bool,
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Reason {
    reason: String,
}

fn json_of<M: serde::Serialize>(m: &M) -> Value {
    serde_json::to_value(m).unwrap_or(Value::Null)
}

async fn enrollments(
    State(s): State<ApiState>,
    query: Result<Query<EnrollmentQuery>, QueryRejection>,
) -> Result<axum::Json<Value>, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let reply = request(&s.bus, Op::ListEnrollments(pb::ListEnrollments { pending_only: !q.all })).await?;
    Ok(axum::Json(json!({ "enrollments": reply.enrollments.iter().map(json_of).collect::<Vec<_>>() })))
}

async fn identities(State(s): State<ApiState>) -> Result<axum::Json<Value>, ApiError> {
    let reply = request(&s.bus, Op::ListSites(pb::ListSiteIdentities {})).await?;
    Ok(axum::Json(json!({ "sites": reply.sites.iter().map(json_of).collect::<Vec<_>>() })))
}

/// The reason a body gives (`{"reason": …}`), or none for an empty body.
fn reason(body: &[u8]) -> Result<String, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(String::new());
    }
    serde_json::from_slice::<Reason>(body)
        .map(|r| r.reason)
        .map_err(|e| ApiError::bad_request(format!("the body is not {{\"reason\": …}}: {e}")))
}

async fn decide(s: ApiState, key: String, approve: bool, reason: String) -> Result<axum::Json<Value>, ApiError> {
    let reply = request(&s.bus, Op::Decide(pb::DecideEnrollment { identity_key: key, approve, reason })).await?;
    let decided = reply.enrollments.first().map(json_of).unwrap_or(Value::Null);
    Ok(axum::Json(decided))
}

async fn approve(
    State(s): State<ApiState>,
    Path(key): Path<String>,
    body: axum::body::Bytes,
) -> Result<axum::Json<Value>, ApiError> {
    decide(s, key, true, reason(&body)?).await
}

async fn deny(
    State(s): State<ApiState>,
    Path(key): Path<String>,
    body: axum::body::Bytes,
) -> Result<axum::Json<Value>, ApiError> {
    decide(s, key, false, reason(&body)?).await
}

async fn revoke(
    State(s): State<ApiState>,
    Path(site): Path<String>,
    body: axum::body::Bytes,
) -> Result<axum::Json<Value>, ApiError> {
    let op = Op::Revoke(pb::RevokeSite { site_id: site, reason: reason(&body)? });
    let reply = request(&s.bus, op).await?;
    Ok(axum::Json(json!({
        "site": reply.sites.first().map(json_of).unwrap_or(Value::Null),
        "disconnected": reply.disconnected,
        "revoke_millis": reply.revoke_millis,
    })))
}

/// The paths above, for the OpenAPI document.
pub(super) fn paths(error: fn(&str) -> Value) -> Vec<(&'static str, Value)> {
    let schema = |name: &str| json!({ "$ref": format!("#/components/schemas/landfall.v1.{name}") });
    let list = |name: &str, items: &str| json!({ "type": "object", "required": [name], "properties": { name: { "type": "array", "items": schema(items) } } });
    let reason_body = json!({ "required": false, "content": { "application/json": { "schema": {
        "type": "object", "additionalProperties": false, "properties": { "reason": { "type": "string" } } } } } });
    let unavailable = error("No identity service answered (`landfall serve identity`).");
    let key = json!([{ "name": "key", "in": "path", "required": true, "description": "The gateway's identity key, or its fingerprint.", "schema": { "type": "string" } }]);
    let decide = |summary: &str, approve: bool| {
        json!({ "post": {
            "summary": summary,
            "description": if approve {
                "Approve a gateway's request to join: its key becomes the site's identity, and the gateway gets its credentials the next time it asks. Requires an operator token."
            } else {
                "Deny a gateway's request to join. Requires an operator token."
            },
            "operationId": if approve { "enrollment_approve" } else { "enrollment_deny" },
            "tags": ["identity"],
            "parameters": key,
            "requestBody": reason_body,
            "responses": {
                "200": { "description": "The request as decided.", "content": { "application/json": { "schema": schema("Enrollment") } } },
                "400": error("The body is not {\"reason\": …}."),
                "401": error("No token, or an unknown one."),
                "403": error("The token is a viewer's."),
                "404": error("No request to join from that key or fingerprint."),
                "409": error("Refused: decided already, the site has an identity already, or several requests have that fingerprint."),
                "503": unavailable,
            },
        }})
    };
    vec![
        (
            "/v1/enrollments",
            json!({ "get": {
                "summary": "Requests to join",
                "description": "Gateways' requests to join, with what each reported about its machine and its key's fingerprint: pending ones, or all with `all=true`.",
                "operationId": "enrollments",
                "tags": ["identity"],
                "parameters": [{ "name": "all", "in": "query", "schema": { "type": "boolean" } }],
                "responses": {
                    "200": { "description": "The requests.", "content": { "application/json": { "schema": list("enrollments", "Enrollment") } } },
                    "400": error("A query parameter is wrong."),
                    "401": error("No token, or an unknown one."),
                    "503": unavailable,
                },
            }}),
        ),
        (
            "/v1/identities",
            json!({ "get": {
                "summary": "Sites' identities",
                "description": "Every enrolled site: its identity key, its link keys and their expiry, whether it is revoked.",
                "operationId": "identities",
                "tags": ["identity"],
                "responses": {
                    "200": { "description": "The identities.", "content": { "application/json": { "schema": list("sites", "SiteIdentity") } } },
                    "401": error("No token, or an unknown one."),
                    "503": unavailable,
                },
            }}),
        ),
        ("/v1/enrollments/{key}/approve", decide("Approve a request to join", true)),
        ("/v1/enrollments/{key}/deny", decide("Deny a request to join", false)),
        (
            "/v1/sites/{site}/revoke",
            json!({ "post": {
                "summary": "Revoke a site",
                "description": "None of the site's keys connects any more, and its open connections (gateway and leaf node) are closed on every hub server. Requires an operator token.",
                "operationId": "site_revoke",
                "tags": ["identity"],
                "parameters": [{ "name": "site", "in": "path", "required": true, "schema": { "type": "string" } }],
                "requestBody": reason_body,
                "responses": {
                    "200": { "description": "Revoked: the site's record, the connections closed, how long it took.", "content": { "application/json": { "schema": {
                        "type": "object", "required": ["site", "disconnected", "revoke_millis"],
                        "properties": { "site": schema("SiteIdentity"), "disconnected": { "type": "integer", "minimum": 0 }, "revoke_millis": { "type": "integer", "minimum": 0 } } } } } },
                    "400": error("The body is not {\"reason\": …}."),
                    "401": error("No token, or an unknown one."),
                    "403": error("The token is a viewer's."),
                    "404": error("The site has no identity (it never joined by enrollment)."),
                    "503": unavailable,
                },
            }}),
        ),
    ]
}
