//! What can go wrong on the bus ([`BusError`]), whether it is worth retrying ([`ErrorKind`]),
//! whether it is the JetStream store being full ([`is_store_full`]), and how long to wait before
//! retrying a transient failure ([`retry_delay`]).

use std::time::Duration;

use super::version::MIN_SERVER_VERSION;

/// Whether a failure is worth retrying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The same call may succeed later (network, timeouts, a busy server).
    Transient,
    /// The input is wrong; retrying it changes nothing.
    Reject,
    /// The system is misconfigured (server too old, no JetStream); stop and say so.
    Fatal,
    /// The JetStream store is full (a stream's or the account's limits, or the server's disk):
    /// worth retrying once space is made, and never a reason to give a message up.
    StoreFull,
}

/// The cause of a [`BusError`], whatever library raised it.
pub(super) type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("connect to nats at {url}")]
    Connect {
        url: String,
        #[source]
        source: BoxError,
    },
    #[error("nats-server {found} at {url} is too old: landfall needs nats-server {}.{}.{} or newer", MIN_SERVER_VERSION.0, MIN_SERVER_VERSION.1, MIN_SERVER_VERSION.2)]
    ServerTooOld { url: String, found: String },
    #[error("nats-server at {url} has JetStream disabled: start it with -js (or `jetstream {{}}` in its config)")]
    NoJetStream { url: String },
    #[error("ensure {what} {name}")]
    Topology {
        what: &'static str,
        name: String,
        #[source]
        source: BoxError,
    },
    #[error("publish to {subject}")]
    Publish {
        subject: String,
        #[source]
        source: BoxError,
    },
    #[error("message for {subject} is {size} bytes, over the {max} byte limit")]
    TooLarge { subject: String, size: usize, max: usize },
    #[error("kv {op} {bucket}/{key}")]
    Kv {
        op: &'static str,
        bucket: String,
        key: String,
        #[source]
        source: BoxError,
    },
    /// A compare-and-set update lost to another writer on every attempt.
    #[error("kv update {bucket}/{key}: it kept changing for {attempts} attempts")]
    KeptChanging { bucket: String, key: String, attempts: u32 },
    #[error("decode {what} from kv {bucket}/{key}")]
    KvDecode {
        what: &'static str,
        bucket: String,
        key: String,
        #[source]
        source: prost::DecodeError,
    },
    #[error("request {subject}")]
    Request {
        subject: String,
        #[source]
        source: BoxError,
    },
    #[error("consume from {consumer}")]
    Consume {
        consumer: String,
        #[source]
        source: BoxError,
    },
}

impl BusError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            BusError::ServerTooOld { .. } | BusError::NoJetStream { .. } => ErrorKind::Fatal,
            BusError::TooLarge { .. } | BusError::KvDecode { .. } => ErrorKind::Reject,
            _ if is_store_full(self) => ErrorKind::StoreFull,
            _ => ErrorKind::Transient,
        }
    }
}

pub(super) fn boxed(e: impl std::error::Error + Send + Sync + 'static) -> BoxError {
    Box::new(e)
}

/// `error` and every cause under it, joined by `: `: the text a retry reason or a message
/// for people carries, where only a string fits.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// The JetStream API error codes that say the store is full: 10047 insufficient storage
/// resources, 10028 insufficient memory resources, 10023 insufficient resources, 10002 the
/// account's resource limits exceeded.
pub const STORE_FULL_CODES: [u64; 4] = [10047, 10028, 10023, 10002];

/// What nats-server (2.10, 2.11) answers, in words, when a write does not fit: a stream's limits
/// with the `new` discard policy (`maximum bytes exceeded`, `maximum messages exceeded`, `maximum
/// messages per subject exceeded`, which come as error code 10077 with the store's text), or the
/// server or account out of room.
const STORE_FULL_TEXTS: [&str; 7] = [
    "maximum bytes exceeded",
    "maximum messages exceeded",
    "maximum messages per subject exceeded",
    "insufficient storage",
    "insufficient memory",
    "insufficient resources",
    "resource limits exceeded",
];

/// Whether `error`, or any cause under it, is the JetStream store being full: an API error with
/// one of [`STORE_FULL_CODES`], or the server's words for a write that does not fit. A failure
/// of this kind is not the message's fault: the consume loop retries it without counting it
/// toward dead-lettering, and an alarm can be raised on it.
pub fn is_store_full(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = cause {
        if let Some(js) = e.downcast_ref::<async_nats::jetstream::Error>()
            && STORE_FULL_CODES.contains(&js.error_code().0)
        {
            return true;
        }
        let text = e.to_string().to_ascii_lowercase();
        if STORE_FULL_TEXTS.iter().any(|t| text.contains(t)) {
            return true;
        }
        cause = e.source();
    }
    false
}

/// Backoff for transient failures: 0.5 s doubling to 30 s.
pub fn retry_delay(delivered: i64) -> Duration {
    let exp = delivered.clamp(1, 8) as u32 - 1;
    Duration::from_millis(500u64.saturating_mul(1 << exp)).min(Duration::from_secs(30))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_caps() {
        assert_eq!(retry_delay(1), Duration::from_millis(500));
        assert_eq!(retry_delay(2), Duration::from_secs(1));
        assert_eq!(retry_delay(100), Duration::from_secs(30));
    }

    #[test]
    fn the_servers_answers_for_a_full_store_are_store_full() {
        // The texts nats-server 2.10 puts in a PubAck's error (code, error code, description).
        for text in [
            "maximum bytes exceeded",
            "maximum messages exceeded",
            "insufficient storage resources available (code 503, error code 10047)",
            "JetStream resource limits exceeded for account: \"$G\"",
        ] {
            let e = BusError::Publish { subject: "landfall.evt.x".into(), source: text.into() };
            assert_eq!(e.kind(), ErrorKind::StoreFull, "{text}");
        }
        let e = BusError::Kv { op: "put", bucket: "b".into(), key: "k".into(), source: "timed out".into() };
        assert_eq!(e.kind(), ErrorKind::Transient);
        let coded: async_nats::jetstream::Error =
            serde_json::from_str(r#"{"code":503,"err_code":10047,"description":"out of room"}"#).unwrap();
        let e = BusError::Publish { subject: "landfall.evt.x".into(), source: boxed(coded) };
        assert!(is_store_full(&e), "by the error code, whatever its words");
    }

    #[test]
    fn an_error_chain_names_every_cause() {
        let e = BusError::Kv { op: "get", bucket: "b".into(), key: "k".into(), source: "gone".into() };
        assert_eq!(error_chain(&e), "kv get b/k: gone");
    }
}
