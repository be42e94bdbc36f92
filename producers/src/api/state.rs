//! What every handler of the API shares: the state it is given (the bus, the read model, the
//! command ledger, the tokens), errors as the API answers them, and the largest body it reads.

use std::sync::Arc;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bus_schema::runtime::{Bus, Kv};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::auth::Tokens;
use super::model;

/// Renders the process's metrics in the Prometheus text format.
pub type MetricsRender = Arc<dyn Fn() -> String + Send + Sync>;

#[derive(Clone)]
pub struct ApiState {
    pub(super) bus: Bus,
    pub(super) model: model::Model,
    /// The command ledger, opened once: a command's outcome by id, for GETs and repeated keys.
    pub(super) ledger: Kv,
    pub(super) tokens: Arc<Tokens>,
    /// Who may do what on which sites.
    pub(super) policy: Arc<super::policy::Policy>,
    pub(super) metrics: Option<MetricsRender>,
    /// Ends the event streams when the process stops, so shutdown does not wait on open dashboards.
    pub(super) shutdown: CancellationToken,
}

/// An error as the API answers it: a status and `{"error": code, "message": ...}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self { status, code, message: message.into() }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub(super) fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response =
            (self.status, axum::Json(json!({ "error": self.code, "message": self.message }))).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"landfall\""));
        }
        response
    }
}

/// The largest request body: a command's JSON (the bus takes 1 MiB of protobuf; JSON is larger).
pub(super) const MAX_BODY: usize = 4 * 1024 * 1024;
