//! What can go wrong on the bus ([`BusError`]), whether it is worth retrying ([`ErrorKind`]),
//! and how long to wait before retrying a transient failure ([`retry_delay`]).

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
    fn an_error_chain_names_every_cause() {
        let e = BusError::Kv { op: "get", bucket: "b".into(), key: "k".into(), source: "gone".into() };
        assert_eq!(error_chain(&e), "kv get b/k: gone");
    }
}
