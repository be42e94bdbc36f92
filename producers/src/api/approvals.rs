//! Two people for what cannot be undone: a command the policy names (a decommission, a removal)
//! or a rollout over more than a set share of the fleet is held by the API instead of published,
//! until a second person approves it (it is published then, under its own id) or refuses it
//! (never published). Held commands live in `landfall-approvals`, so every API replica sees
//! them and a restart loses none; waiting, approved and refused are events.
//!
//! The hold is the API's: a client with a NATS user that may publish commands publishes them
//! itself, as its permissions allow.

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use bus_schema::envelope::Envelope;
use bus_schema::names::{self, keys};
use bus_schema::pb::{self, BusMessage};
use bus_schema::runtime::{Cas, Kv};
use serde::Deserialize;
use serde_json::{Value, json};

use super::auth::{Principal, Role};
use super::state::{ApiError, ApiState};
use super::views::picks;
use crate::views::human::rfc3339_ms;

fn unavailable(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "bus_unavailable", format!("the held commands: {e}"))
}

async fn bucket(api: &ApiState) -> Result<Kv, ApiError> {
    api.bus.kv(names::APPROVALS_BUCKET).await.map_err(unavailable)
}

fn state_label(state: i32) -> &'static str {
    match pb::ApprovalState::try_from(state) {
        Ok(pb::ApprovalState::Waiting) => "waiting",
        Ok(pb::ApprovalState::Approved) => "approved",
        Ok(pb::ApprovalState::Refused) => "refused",
        _ => "unknown",
    }
}

/// A held command as JSON.
pub fn held_json(h: &pb::HeldCommand) -> Value {
    let command = pb::decode_to_json(&h.command_type, &h.payload).and_then(Result::ok).unwrap_or(Value::Null);
    json!({
        "id": h.command_id,
        "type": h.command_type,
        "kind": h.kind,
        "scope": h.scope,
        "subject": h.subject,
        "requested_by": h.requested_by,
        "requested_at": rfc3339_ms(h.requested_unix_ms),
        "why": h.why,
        "state": state_label(h.state),
        "decided_by": h.decided_by,
        "decided_at": if h.decided_unix_ms > 0 { rfc3339_ms(h.decided_unix_ms) } else { String::new() },
        "reason": h.reason,
        "command": command,
    })
}

fn now_ms() -> i64 {
    (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64
}

/// What a held command's events say of it.
fn requested(h: &pb::HeldCommand) -> pb::ApprovalRequested {
    pb::ApprovalRequested {
        site_id: h.scope.clone(),
        command_id: h.command_id.clone(),
        command_type: h.command_type.clone(),
        requested_by: h.requested_by.clone(),
        why: h.why.clone(),
    }
}

/// Holds a command instead of publishing it (the same id again: the one held already).
pub(super) async fn hold(
    api: &ApiState,
    kind: &str,
    type_name: &str,
    subject: String,
    payload: Vec<u8>,
    env: &Envelope,
    why: String,
) -> Result<(StatusCode, axum::Json<Value>), ApiError> {
    let kv = bucket(api).await?;
    let scope = match names::parse_subject(&subject) {
        Some(names::ParsedSubject::Command { scope, .. }) => scope.to_string(),
        _ => names::FLEET.to_string(),
    };
    let held = pb::HeldCommand {
        command_id: env.id.clone(),
        command_type: type_name.to_string(),
        kind: kind.to_string(),
        scope,
        subject,
        payload,
        traceparent: env.traceparent.clone(),
        requested_by: env.actor.clone(),
        requested_unix_ms: now_ms(),
        why,
        state: pb::ApprovalState::Waiting as i32,
        ..Default::default()
    };
    let key = keys::held(&env.id);
    let held = match kv.create(&key, &held).await.map_err(unavailable)? {
        Cas::Written(_) => held,
        Cas::Conflict => kv.get::<pb::HeldCommand>(&key).await.map_err(unavailable)?.map(|(h, _)| h).unwrap_or(held),
    };
    if held.command_type != type_name {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "conflict",
            format!("Idempotency-Key {} was used for a {} already", env.id, held.command_type),
        ));
    }
    // Said again on a repeated request: the event's id is derived, so it is stored once.
    let said = env.derive("approval_requested", None);
    api.bus.publish_event(&requested(&held), &said).await.map_err(unavailable)?;
    tracing::info!(command = type_name, id = %env.id, actor = %env.actor, "command held for a second person");
    let mut body = held_json(&held);
    body["approval"] = json!("waiting");
    body["approve"] = json!(format!("/v1/approvals/{}/approve", held.command_id));
    body["events"] = json!(format!("/v1/events?correlation={}", held.command_id));
    Ok((StatusCode::ACCEPTED, axum::Json(body)))
}

/// Whether `who` holds `role` over everything a held command reaches.
fn covers(api: &ApiState, who: &Principal, role: Role, h: &pb::HeldCommand) -> bool {
    if who.over_fleet(role) {
        return true;
    }
    let st = api.model.read();
    if h.scope != names::FLEET {
        return st.designs.get(&h.scope).is_some_and(|d| who.may(role, &d.labels));
    }
    if h.command_type == <pb::PatchPackage as BusMessage>::TYPE
        && let Ok(patch) = <pb::PatchPackage as prost::Message>::decode(h.payload.as_slice())
    {
        let selector = patch.selector.unwrap_or_default();
        let mut picked = st.designs.values().filter(|d| picks(&selector, d)).peekable();
        return picked.peek().is_some() && picked.all(|d| who.may(role, &d.labels));
    }
    false
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Decided ones too.
    #[serde(default)]
    pub all: bool,
}

async fn list(
    State(api): State<ApiState>,
    axum::Extension(who): axum::Extension<Principal>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<axum::Json<Value>, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let kv = bucket(&api).await?;
    let mut held: Vec<pb::HeldCommand> = kv
        .scan::<pb::HeldCommand>("approval.")
        .await
        .map_err(unavailable)?
        .into_iter()
        .map(|(_, h, _)| h)
        .filter(|h| q.all || h.state == pb::ApprovalState::Waiting as i32)
        .filter(|h| h.requested_by == who.actor || covers(&api, &who, Role::Viewer, h))
        .collect();
    held.sort_by_key(|h| std::cmp::Reverse(h.requested_unix_ms));
    Ok(axum::Json(json!({ "items": held.iter().map(held_json).collect::<Vec<_>>() })))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Decision {
    #[serde(default)]
    reason: String,
}

fn decision(body: &[u8]) -> Result<Decision, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Decision::default());
    }
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("the body is not {{\"reason\": …}}: {e}")))
}

async fn approve(
    State(api): State<ApiState>,
    who: axum::Extension<Principal>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<axum::Json<Value>, ApiError> {
    decide(api, who.0, id, decision(&body)?, true).await
}

async fn refuse(
    State(api): State<ApiState>,
    who: axum::Extension<Principal>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<axum::Json<Value>, ApiError> {
    decide(api, who.0, id, decision(&body)?, false).await
}

/// A second person's decision: recorded once (compare-and-set, whichever replica takes it),
/// then the command published (approved) and the decision said as an event. Approving again
/// publishes again under the same id, which the bus and the ledger take once.
async fn decide(
    api: ApiState,
    who: Principal,
    id: String,
    d: Decision,
    approved: bool,
) -> Result<axum::Json<Value>, ApiError> {
    let id = uuid::Uuid::parse_str(id.trim())
        .map_err(|_| ApiError::not_found(format!("{id:?} is not a command id (a UUID)")))?
        .to_string();
    let kv = bucket(&api).await?;
    let key = keys::held(&id);
    let role = api.policy.approval.approver();
    loop {
        let Some((mut h, revision)) = kv.get::<pb::HeldCommand>(&key).await.map_err(unavailable)? else {
            return Err(ApiError::not_found(format!("no command {id} waits for approval")));
        };
        if !covers(&api, &who, Role::Viewer, &h) && h.requested_by != who.actor {
            return Err(ApiError::not_found(format!("no command {id} waits for approval")));
        }
        if h.requested_by == who.actor {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!("{} asked for command {id}: a second person decides it", who.actor),
            ));
        }
        if !covers(&api, &who, role, &h) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!(
                    "deciding command {id} takes {} over all it reaches, which {:?} does not hold",
                    role.as_str(),
                    who.name
                ),
            ));
        }
        let wanted = if approved { pb::ApprovalState::Approved } else { pb::ApprovalState::Refused };
        if h.state != pb::ApprovalState::Waiting as i32 {
            if h.state == wanted as i32 && approved {
                publish(&api, &h).await?;
                return Ok(axum::Json(held_json(&h)));
            }
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "conflict",
                format!("command {id} was {} by {} already", state_label(h.state), h.decided_by),
            ));
        }
        h.state = wanted as i32;
        h.decided_by = who.actor.clone();
        h.decided_unix_ms = now_ms();
        h.reason = d.reason.clone();
        if matches!(kv.update(&key, &h, revision).await.map_err(unavailable)?, Cas::Conflict) {
            continue;
        }
        if approved {
            publish(&api, &h).await?;
        } else {
            let refused = pb::ApprovalRefused {
                site_id: h.scope.clone(),
                command_id: h.command_id.clone(),
                command_type: h.command_type.clone(),
                requested_by: h.requested_by.clone(),
                refused_by: h.decided_by.clone(),
                reason: h.reason.clone(),
            };
            let env = envelope(&h).derive("approval_refused", None);
            api.bus.publish_event(&refused, &env).await.map_err(unavailable)?;
        }
        tracing::info!(id = %id, by = %who.actor, approved, "held command decided");
        return Ok(axum::Json(held_json(&h)));
    }
}

/// The envelope the command was sent with (its id, its trace, its author).
fn envelope(h: &pb::HeldCommand) -> Envelope {
    let mut env = Envelope::root_with_id(uuid::Uuid::parse_str(&h.command_id).unwrap_or_default());
    if !h.traceparent.is_empty() {
        env.traceparent = h.traceparent.clone();
    }
    env.by(h.requested_by.clone())
}

/// Publishes an approved command under its own id, then says so.
async fn publish(api: &ApiState, h: &pb::HeldCommand) -> Result<(), ApiError> {
    let env = envelope(h);
    api.bus
        .publish_raw(h.subject.clone(), &h.command_type, h.payload.clone().into(), &env)
        .await
        .map_err(|e| unavailable(format!("the approved command was not stored (approve it again): {e}")))?;
    let approved = pb::CommandApproved {
        site_id: h.scope.clone(),
        command_id: h.command_id.clone(),
        command_type: h.command_type.clone(),
        requested_by: h.requested_by.clone(),
        approved_by: h.decided_by.clone(),
    };
    api.bus.publish_event(&approved, &env.derive("command_approved", None)).await.map_err(unavailable)?;
    Ok(())
}

pub(super) fn read_routes() -> Router<ApiState> {
    Router::new().route("/v1/approvals", get(list))
}

pub(super) fn write_routes() -> Router<ApiState> {
    Router::new().route("/v1/approvals/{id}/approve", post(approve)).route("/v1/approvals/{id}/refuse", post(refuse))
}

/// The paths above, for the OpenAPI document.
pub(super) fn paths(error: fn(&str) -> Value) -> Vec<(&'static str, Value)> {
    let held =
        json!({ "type": "object", "additionalProperties": true, "required": ["id", "type", "state", "requested_by"] });
    let id = json!([{ "name": "id", "in": "path", "required": true, "schema": { "type": "string" } }]);
    let body = json!({ "required": false, "content": { "application/json": { "schema": {
        "type": "object", "additionalProperties": false, "properties": { "reason": { "type": "string" } } } } } });
    let decide = |approve: bool| {
        json!({ "post": {
            "summary": if approve { "Approve a held command" } else { "Refuse a held command" },
            "description": if approve {
                "A second person (not its author, holding the policy's approver role over all it reaches) approves: the command is published under its own id."
            } else {
                "A second person refuses: the command is never published."
            },
            "operationId": if approve { "approval_approve" } else { "approval_refuse" },
            "tags": ["approvals"],
            "parameters": id,
            "requestBody": body,
            "responses": {
                "200": { "description": "The held command as decided.", "content": { "application/json": { "schema": held } } },
                "400": error("The body is not {\"reason\": …}."),
                "401": error("No token, or an unknown one."),
                "403": error("Its own author, or not holding the approver's role over it."),
                "404": error("No such held command (or not one the caller may see)."),
                "409": error("Decided already, the other way."),
                "503": error("The bus could not be reached."),
            },
        }})
    };
    vec![
        (
            "/v1/approvals",
            json!({ "get": {
                "summary": "Commands waiting for a second person",
                "description": "Commands the policy holds until a second person decides (`all=true`: decided ones too), newest first.",
                "operationId": "approvals",
                "tags": ["approvals"],
                "parameters": [{ "name": "all", "in": "query", "schema": { "type": "boolean" } }],
                "responses": {
                    "200": { "description": "The held commands.", "content": { "application/json": { "schema": {
                        "type": "object", "required": ["items"], "properties": { "items": { "type": "array", "items": held } } } } } },
                    "400": error("A query parameter is wrong."),
                    "401": error("No token, or an unknown one."),
                    "503": error("The bus could not be reached."),
                },
            }}),
        ),
        ("/v1/approvals/{id}/approve", decide(true)),
        ("/v1/approvals/{id}/refuse", decide(false)),
    ]
}
