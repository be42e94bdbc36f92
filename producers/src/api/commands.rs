//! `POST /v1/commands/<kind>`: a command as JSON (the protobuf message's fields by their
//! .proto names), checked, encoded and published on the bus like any other client's.
//!
//! The answer is 202 once JetStream has stored the command; what it leads to is told by the
//! events correlated with its id (`GET /v1/events?correlation=<id>`). A command the API can
//! tell is wrong is refused with 422 before it reaches the bus; one only the orchestrator can
//! judge (an unknown site, a conflict) is refused there, with a `CommandRejected` event.

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::routing::post;
use bus_schema::domain::{self, MacAddress, SiteId};
use bus_schema::names;
use bus_schema::pb::{self, BusCommand, BusMessage};
use bus_schema::runtime::Envelope;
use serde::de::DeserializeOwned;
use serde_json::json;
use uuid::Uuid;

use super::auth::Principal;
use super::reach::{self, Reach};
use super::state::{ApiError, ApiState, MAX_BODY};

/// The header whose UUID becomes the command id: sending the same request again with the same
/// key publishes the command once (JetStream's dedup window).
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// What the API checks of a command before publishing it.
trait Check {
    fn check(&self) -> Result<(), String>;

    /// What it reaches, for the sender's grants (see [`reach::authorize`]).
    fn reach(&self) -> Reach<'_>;

    /// A new rollout's selector, which a sender of part of the fleet is held to.
    fn selector_mut(&mut self) -> Option<&mut pb::SiteSelector> {
        None
    }
}

fn site(id: &str) -> Result<(), String> {
    SiteId::try_from(id).map(|_| ()).map_err(|e| e.to_string())
}

fn rollout_id(id: &str) -> Result<(), String> {
    Uuid::parse_str(id).map(|_| ()).map_err(|_| format!("rollout_id {id:?} is not a rollout id (a UUID)"))
}

fn required<T>(field: &str, value: &Option<T>) -> Result<(), String> {
    value.as_ref().map(|_| ()).ok_or_else(|| format!("{field} is required"))
}

impl Check for pb::RegisterSite {
    fn reach(&self) -> Reach<'_> {
        let design = self.design.as_ref();
        Reach::Site { site: design.map_or("", |d| d.site_id.as_str()), labels: design.map(|d| &d.labels) }
    }

    fn check(&self) -> Result<(), String> {
        required("design", &self.design)?;
        domain::SiteDesign::try_from(self.design.clone().unwrap_or_default()).map(|_| ()).map_err(|e| e.to_string())
    }
}

impl Check for pb::InstallSite {
    fn reach(&self) -> Reach<'_> {
        Reach::Site { site: &self.site_id, labels: None }
    }

    fn check(&self) -> Result<(), String> {
        site(&self.site_id)
    }
}

impl Check for pb::StageSite {
    fn reach(&self) -> Reach<'_> {
        Reach::Site { site: &self.site_id, labels: None }
    }

    fn check(&self) -> Result<(), String> {
        site(&self.site_id)
    }
}

impl Check for pb::ApplyDesign {
    fn reach(&self) -> Reach<'_> {
        Reach::Site { site: &self.site_id, labels: None }
    }

    fn check(&self) -> Result<(), String> {
        site(&self.site_id)?;
        if self.sources.is_empty() {
            return Err("sources: at least one design document is required".into());
        }
        Ok(())
    }
}

impl Check for pb::NodeAdded {
    fn reach(&self) -> Reach<'_> {
        Reach::Site { site: &self.site_id, labels: None }
    }

    fn check(&self) -> Result<(), String> {
        site(&self.site_id)?;
        required("node", &self.node)?;
        domain::NodeDesign::try_from(self.node.clone().unwrap_or_default()).map(|_| ()).map_err(|e| e.to_string())
    }
}

impl Check for pb::NodeRemoved {
    fn reach(&self) -> Reach<'_> {
        Reach::Site { site: &self.site_id, labels: None }
    }

    fn check(&self) -> Result<(), String> {
        site(&self.site_id)?;
        domain::NodeName::try_from(self.node.as_str()).map_err(|e| e.to_string())?;
        if !self.boot_mac.is_empty() {
            MacAddress::try_from(self.boot_mac.clone()).map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

impl Check for pb::RemoveSite {
    fn reach(&self) -> Reach<'_> {
        Reach::Site { site: &self.site_id, labels: None }
    }

    fn check(&self) -> Result<(), String> {
        site(&self.site_id)
    }
}

impl Check for pb::RemoveNode {
    fn reach(&self) -> Reach<'_> {
        Reach::Site { site: &self.site_id, labels: None }
    }

    fn check(&self) -> Result<(), String> {
        site(&self.site_id)?;
        domain::NodeName::try_from(self.node.as_str()).map(|_| ()).map_err(|e| e.to_string())
    }
}

impl Check for pb::ReprovisionNode {
    fn reach(&self) -> Reach<'_> {
        Reach::Site { site: &self.site_id, labels: None }
    }

    fn check(&self) -> Result<(), String> {
        site(&self.site_id)?;
        domain::NodeName::try_from(self.node.as_str()).map(|_| ()).map_err(|e| e.to_string())
    }
}

impl Check for pb::DecommissionSite {
    fn reach(&self) -> Reach<'_> {
        Reach::Site { site: &self.site_id, labels: None }
    }

    fn check(&self) -> Result<(), String> {
        site(&self.site_id)
    }
}

impl Check for pb::RegisterPackage {
    fn reach(&self) -> Reach<'_> {
        Reach::Fleet
    }

    fn check(&self) -> Result<(), String> {
        required("package", &self.package)?;
        domain::Package::try_from(self.package.clone().unwrap_or_default()).map(|_| ()).map_err(|e| e.to_string())
    }
}

impl Check for pb::PatchPackage {
    fn reach(&self) -> Reach<'_> {
        Reach::Selector
    }

    fn selector_mut(&mut self) -> Option<&mut pb::SiteSelector> {
        Some(self.selector.get_or_insert_with(Default::default))
    }

    fn check(&self) -> Result<(), String> {
        domain::PackageName::try_from(self.name.as_str()).map_err(|e| e.to_string())?;
        domain::Version::try_from(self.version.as_str()).map(|_| ()).map_err(|e| e.to_string())
    }
}

impl Check for pb::PauseRollout {
    fn reach(&self) -> Reach<'_> {
        Reach::Rollout(&self.rollout_id)
    }

    fn check(&self) -> Result<(), String> {
        rollout_id(&self.rollout_id)
    }
}

impl Check for pb::ResumeRollout {
    fn reach(&self) -> Reach<'_> {
        Reach::Rollout(&self.rollout_id)
    }

    fn check(&self) -> Result<(), String> {
        rollout_id(&self.rollout_id)
    }
}

impl Check for pb::CancelRollout {
    fn reach(&self) -> Reach<'_> {
        Reach::Rollout(&self.rollout_id)
    }

    fn check(&self) -> Result<(), String> {
        rollout_id(&self.rollout_id)
    }
}

impl Check for pb::RollbackRollout {
    fn reach(&self) -> Reach<'_> {
        Reach::Rollout(&self.rollout_id)
    }

    fn check(&self) -> Result<(), String> {
        rollout_id(&self.rollout_id)
    }
}

/// A command the API publishes: its kind (the path), protobuf type and scope.
pub struct Documented {
    pub kind: &'static str,
    pub type_name: &'static str,
    /// Whether the subject's scope is a site (else the fleet).
    pub site_scoped: bool,
}

macro_rules! commands {
    ($($ty:ident: $site:literal),* $(,)?) => {
        /// Every command route.
        pub(super) fn routes() -> Router<ApiState> {
            Router::new()$(.route(&format!("/v1/commands/{}", <pb::$ty as BusCommand>::KIND), post(publish::<pb::$ty>)))*
        }

        /// Every command the API publishes, for the OpenAPI document.
        pub const COMMANDS: &[Documented] = &[$(Documented {
            kind: <pb::$ty as BusCommand>::KIND,
            type_name: <pb::$ty as BusMessage>::TYPE,
            site_scoped: $site,
        }),*];
    };
}

commands!(
    RegisterSite: true,
    ApplyDesign: true,
    InstallSite: true,
    StageSite: true,
    NodeAdded: true,
    NodeRemoved: true,
    RemoveSite: true,
    RemoveNode: true,
    ReprovisionNode: true,
    DecommissionSite: true,
    RegisterPackage: false,
    PatchPackage: false,
    PauseRollout: false,
    ResumeRollout: false,
    CancelRollout: false,
    RollbackRollout: false,
);

/// The command's envelope: its id from `Idempotency-Key` (else a new one), continuing the
/// caller's trace when it sent a `traceparent`.
fn envelope(headers: &HeaderMap) -> Result<Envelope, ApiError> {
    let id = match headers.get(IDEMPOTENCY_KEY) {
        None => bus_schema::ids::new_id(),
        Some(v) => v.to_str().ok().and_then(|s| Uuid::parse_str(s.trim()).ok()).ok_or_else(|| {
            ApiError::bad_request("Idempotency-Key must be a UUID (it becomes the command id)".to_string())
        })?,
    };
    let mut env = Envelope::root_with_id(id);
    if let Some(parent) = headers.get(names::headers::TRACEPARENT).and_then(|v| v.to_str().ok()) {
        env.traceparent = bus_schema::ids::traceparent(Some(parent), &env.correlation, &id);
    }
    Ok(env)
}

/// The command ledger's record of command `id`, when it has been settled.
pub(super) async fn settled(ledger: &bus_schema::runtime::Kv, id: &str) -> Result<Option<pb::CommandRecord>, ApiError> {
    let record = ledger.get::<pb::CommandRecord>(&names::keys::command(id)).await.map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "bus_unavailable",
            format!("the command ledger could not be read: {e}"),
        )
    })?;
    Ok(record.map(|(r, _)| r))
}

fn json_content(headers: &HeaderMap) -> Result<(), ApiError> {
    match headers.get(header::CONTENT_TYPE).map(|v| v.to_str().unwrap_or("")) {
        None => Ok(()),
        Some(ct) if ct.split(';').next().is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json")) => Ok(()),
        Some(ct) => Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!("commands are JSON: send Content-Type: application/json (this request said {ct:?})"),
        )),
    }
}

/// How much of a too-large body is read and thrown away before the 413 is sent.
///
/// A server that answers while the client is still sending and then closes the connection makes
/// the client's kernel see a reset, and many clients then lose the answer and report only
/// "connection closed". Reading on (within this bound and [`DRAIN_FOR`]) lets the client finish
/// sending and read why it was refused; a body announced larger than this is refused at once.
const DRAIN_MAX: usize = 64 << 20;
const DRAIN_FOR: std::time::Duration = std::time::Duration::from_secs(10);

/// The request body, at most [`MAX_BODY`] bytes.
async fn read_body(headers: &HeaderMap, body: Body) -> Result<Bytes, ApiError> {
    use futures::StreamExt;
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!("the body is larger than the {} MiB a command may take", MAX_BODY >> 20),
        )
    };
    let announced =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<usize>().ok());
    if announced.is_some_and(|n| n > DRAIN_MAX) {
        return Err(too_large());
    }
    let mut stream = body.into_data_stream();
    let mut buf = Vec::with_capacity(announced.unwrap_or(0).min(MAX_BODY));
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| ApiError::bad_request(format!("the body could not be read: {e}")))?;
        if buf.len() + chunk.len() > MAX_BODY {
            let mut seen = buf.len() + chunk.len();
            drop(buf);
            let drain = async {
                while let Some(Ok(chunk)) = stream.next().await {
                    seen += chunk.len();
                    if seen > DRAIN_MAX {
                        break;
                    }
                }
            };
            let _ = tokio::time::timeout(DRAIN_FOR, drain).await;
            return Err(too_large());
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf.into())
}

async fn publish<C>(
    State(api): State<ApiState>,
    axum::Extension(who): axum::Extension<Principal>,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, axum::Json<serde_json::Value>), ApiError>
where
    C: BusCommand + DeserializeOwned + Check,
{
    json_content(&headers)?;
    let body = read_body(&headers, body).await?;
    let mut cmd: C = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("the body is not a valid {} as JSON: {e}", C::TYPE)))?;
    let env = envelope(&headers)?.by(who.actor.clone());
    let size = prost::Message::encoded_len(&cmd);
    if size > names::MAX_PAYLOAD {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!("the command is {size} bytes as protobuf; the bus takes at most {}", names::MAX_PAYLOAD),
        ));
    }
    cmd.check().map_err(|reason| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid", reason))?;
    // The sender's grants: a site they may not change, a rollout over sites not theirs, is refused.
    let (narrowed, share) = {
        let st = api.model.read();
        reach::authorize(&st, &who, C::KIND, &cmd.reach())?;
        match cmd.selector_mut() {
            Some(selector) => {
                let narrowed = reach::narrow(&st, &who, selector)?;
                let picked = st.designs.values().filter(|d| super::views::picks(selector, d)).count();
                (narrowed, Some(picked as f64 / st.designs.len().max(1) as f64))
            }
            None => (None, None),
        }
    };
    // A key already used for a settled command, however long ago: its answer, nothing published.
    // A command given up (dead-lettered) was not answered: publishing it again retries it.
    if let Some(record) = settled(&api.ledger, &env.id.to_string()).await?.filter(|r| !r.dead_lettered) {
        if record.command_type != C::TYPE {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "conflict",
                format!("Idempotency-Key {} was used for a {} already", env.id, record.command_type),
            ));
        }
        let mut body = crate::views::command::command_json(&record);
        body["duplicate"] = json!(true);
        return Ok((StatusCode::OK, axum::Json(body)));
    }
    // What the policy has wait for a second person is held, not published.
    if let Some(why) = api.policy.waits(C::KIND, share) {
        let payload = prost::Message::encode_to_vec(&cmd);
        return super::approvals::hold(&api, C::KIND, C::TYPE, cmd.subject(), payload, &env, why).await;
    }
    let ack = api.bus.publish_command(&cmd, &env).await.map_err(|e| {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "bus_unavailable", format!("the command was not stored: {e}"))
    })?;
    tracing::info!(command = C::TYPE, id = %env.id, actor = %env.actor, duplicate = ack.duplicate, "command published");
    let mut body = json!({
        "id": env.id,
        "correlation_id": env.correlation,
        "type": C::TYPE,
        "subject": cmd.subject(),
        "stream_sequence": ack.sequence,
        "duplicate": ack.duplicate,
        "events": format!("/v1/events?correlation={}", env.id),
        "actor": env.actor,
    });
    if let Some(part) = narrowed {
        body["narrowed_to"] = json!(part);
    }
    Ok((StatusCode::ACCEPTED, axum::Json(body)))
}
