//! What a handler is given and what it answers: a [`Delivery`] (a message with its envelope
//! read from its headers), and a [`HandlerError`] saying retry, wait, or reject (and as which
//! rejection event, [`RejectAs`]).

use std::time::Duration;

use bytes::Bytes;

use super::error::{BusError, ErrorKind, error_chain, is_store_full};
use crate::envelope::Envelope;
use crate::names;
use crate::pb::{self, BusMessage};

/// A message as a handler sees it.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub subject: String,
    /// The `Landfall-Type` header, or empty.
    pub type_name: String,
    /// The message's own envelope. A message published without landfall headers gets an id
    /// derived from its stream position, so its rejection is still deduplicated.
    pub envelope: Envelope,
    pub payload: Bytes,
    /// How many times it has been delivered (1 on the first).
    pub delivered: i64,
    pub stream_sequence: u64,
}

impl Delivery {
    /// The delivery of message `m`, stored at `seq` in `stream`.
    pub(super) fn from_parts(m: &async_nats::Message, stream: &str, seq: u64, delivered: i64) -> Self {
        let fallback_id = || crate::ids::derived_id(stream, "seq", Some(&seq.to_string())).to_string();
        let type_name = m.headers.as_ref().and_then(|h| h.get(names::headers::TYPE)).map(|v| v.as_str().to_string());
        Self {
            subject: m.subject.to_string(),
            type_name: type_name.unwrap_or_default(),
            envelope: Envelope::from_message(m.headers.as_ref(), &m.subject, fallback_id),
            payload: m.payload.clone(),
            delivered,
            stream_sequence: seq,
        }
    }

    /// The `<kind>` of a command (`landfall.cmd.<kind>.<scope>`) or job
    /// (`landfall.job.<site>.<shard>.<kind>`) subject.
    ///
    /// # Errors
    /// A `MALFORMED` rejection for any other subject.
    pub fn kind(&self) -> Result<&str, HandlerError> {
        match names::parse_subject(&self.subject) {
            Some(names::ParsedSubject::Command { kind, .. } | names::ParsedSubject::Job { kind, .. }) => Ok(kind),
            _ => Err(HandlerError::reject(
                pb::RejectCode::Malformed,
                format!("{} is not a command or job subject", self.subject),
            )),
        }
    }

    /// Decodes the payload as `M`, checking the type header when there is one, and checks it
    /// against its subject ([`crate::trust::check`]: it speaks for the subject's site only).
    ///
    /// # Errors
    /// A [`HandlerError::Reject`] with code `MALFORMED` (undecodable, wrong type) or `FORBIDDEN`
    /// (a field names another site than the subject's), saying what was wrong.
    pub fn decode<M: BusMessage>(&self) -> Result<M, HandlerError> {
        if !self.type_name.is_empty() && self.type_name != M::TYPE {
            return Err(HandlerError::reject(
                pb::RejectCode::Malformed,
                format!("{} carries {}, expected {}", self.subject, self.type_name, M::TYPE),
            ));
        }
        let message = M::decode(self.payload.clone()).map_err(|e| {
            HandlerError::reject(pb::RejectCode::Malformed, format!("payload is not a valid {}: {e}", M::TYPE))
        })?;
        crate::trust::check(&self.subject, &message)
            .map_err(|e| HandlerError::reject(pb::RejectCode::Forbidden, e.to_string()))?;
        Ok(message)
    }
}

/// A permanent refusal, with the reason people will read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub code: pb::RejectCode,
    pub reason: String,
}

/// What a handler answers when it did not carry a message out. The consume loop logs a
/// transient failure with every cause under it ([`error_chain`]).
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    /// Try again later (NAK with backoff): what failed and, when another error says why, that
    /// error. Built with [`HandlerError::transient`] or [`HandlerError::transient_reason`].
    #[error("transient: {context}")]
    Transient {
        context: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// Not now, by design (e.g. waiting for a site lease): redeliver after this delay.
    #[error("not yet: {reason}")]
    Wait { reason: String, delay: Duration },
    /// Never: terminate the message and publish a rejection event.
    #[error("rejected: {}", .0.reason)]
    Reject(Rejection),
}

impl HandlerError {
    pub fn reject(code: pb::RejectCode, reason: impl Into<String>) -> Self {
        HandlerError::Reject(Rejection { code, reason: reason.into() })
    }

    /// Try again later: `context` (what was being done) failed because of `source`.
    ///
    /// ```ignore
    /// kv.get::<pb::SiteLease>(&key).await.map_err(|e| HandlerError::transient("reading the lease", e))?;
    /// ```
    pub fn transient(context: impl Into<String>, source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        HandlerError::Transient { context: context.into(), source: Some(source.into()) }
    }

    /// Try again later, for a reason no other error gives (a record not there yet, an empty
    /// answer).
    pub fn transient_reason(reason: impl Into<String>) -> Self {
        HandlerError::Transient { context: reason.into(), source: None }
    }

    /// Whether this is a transient failure because the JetStream store is full (anywhere in its
    /// chain of causes; see [`is_store_full`]). The consume loop retries such a failure without
    /// counting it toward dead-lettering: a full disk must not throw messages away.
    pub fn is_store_full(&self) -> bool {
        match self {
            HandlerError::Transient { source: Some(source), .. } => is_store_full(source.as_ref()),
            HandlerError::Transient { source: None, .. } | HandlerError::Wait { .. } | HandlerError::Reject(_) => false,
        }
    }
}

/// A reject code as a metric label gives it: `unknown_site`.
pub fn reject_code_label(code: pb::RejectCode) -> &'static str {
    match code {
        pb::RejectCode::Unspecified => "unspecified",
        pb::RejectCode::Malformed => "malformed",
        pb::RejectCode::Invalid => "invalid",
        pb::RejectCode::UnknownSite => "unknown_site",
        pb::RejectCode::UnknownPackage => "unknown_package",
        pb::RejectCode::Conflict => "conflict",
        pb::RejectCode::TooLarge => "too_large",
        pb::RejectCode::Unsupported => "unsupported",
        pb::RejectCode::Forbidden => "forbidden",
    }
}

/// A bus failure worth retrying is transient, and keeps the failure as its source; one that
/// retrying cannot fix (a value that does not decode, a message too large) is rejected, with
/// every cause in the reason people read.
impl From<BusError> for HandlerError {
    fn from(e: BusError) -> Self {
        match e.kind() {
            ErrorKind::Reject => HandlerError::reject(pb::RejectCode::Invalid, error_chain(&e)),
            _ => HandlerError::transient("bus", e),
        }
    }
}

/// Which rejection event a consumer publishes for a message it refuses.
#[derive(Debug, Clone)]
pub enum RejectAs {
    /// `CommandRejected`, for command consumers.
    Command,
    /// `MessageRejected`, naming the consumer.
    Message { consumer: String },
}

#[cfg(test)]
mod tests {
    use async_nats::HeaderMap;

    use super::*;
    use crate::names::headers;

    #[test]
    fn a_delivery_without_a_traceparent_gets_one_from_its_correlation() {
        let mut headers = HeaderMap::new();
        let correlation = "01890a5d-ac96-774b-bcce-b302099a8057";
        headers.insert(headers::MSG_ID, "01890a5d-ac96-774b-bcce-b302099a8058");
        headers.insert(headers::CORRELATION_ID, correlation);
        let msg = async_nats::Message {
            subject: "landfall.evt.edge-01.site.installed".into(),
            reply: None,
            payload: Bytes::new(),
            headers: Some(headers),
            status: None,
            description: None,
            length: 0,
        };
        let d = Delivery::from_parts(&msg, names::EVENTS_STREAM, 7, 1);
        assert_eq!(d.envelope.trace_id(), Some("01890a5dac96774bbcceb302099a8057"));
    }
}
