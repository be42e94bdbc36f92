//! A client holding a stolen key, for attack tests. Everything it tries ends in an [`Outcome`]
//! that tells apart a permission violation (the server refused the subject), a refusal by
//! landfall (a consumer's rejection event, a service's refusal, a JetStream API error) and what
//! went through.
//!
//! ```text
//! let thief = Intruder::connect(&url, &d.access(&Role::Site("edge-01".into())), fleet.bus.clone()).await;
//! let outcome = thief.forge(subject, &message, &Envelope::root()).await;   // Rejected { .. }?
//! ```

use std::fmt;
use std::future::Future;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::DeliverPolicy};
use bus_schema::names;
use bus_schema::pb::{self, BusMessage};
use bus_schema::runtime::{Access, Bus, Envelope, ReadEvent};
use bytes::Bytes;
use prost::Message;

use crate::topology::{ServerErrors, raw_client};

/// How long the hub's consumers may take to refuse a forged message.
pub const REJECTION_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a request (to a service, to the JetStream API) may go unanswered.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The server reports a violation asynchronously: it may arrive just after the operation ended.
const VIOLATION_GRACE: Duration = Duration::from_millis(150);

/// How one attempt ended.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// The server refused it: the permission violation, as the server worded it.
    Denied(String),
    /// A landfall consumer terminated it and published a rejection saying why.
    Rejected { code: pb::RejectCode, consumer: String, reason: String },
    /// A service refused or declined the request (its reason), or the JetStream API answered
    /// with an error.
    Refused(String),
    /// The server let it through, and nothing took it (a reply no request waited for).
    Ignored(String),
    /// Stored, where no durable consumer reads it, and people's and dashboards' readers do not
    /// show it.
    Unheard(String),
    /// Nothing refused it: what happened.
    Through(String),
    /// No answer and no violation: neither refused nor seen to go through.
    Unclear(String),
}

impl Outcome {
    pub fn is_denied(&self) -> bool {
        matches!(self, Outcome::Denied(_))
    }

    /// A rejection event with code `FORBIDDEN`.
    pub fn is_forbidden(&self) -> bool {
        matches!(self, Outcome::Rejected { code: pb::RejectCode::Forbidden, .. })
    }

    /// A service's refusal whose reason contains `words`.
    pub fn is_refused_with(&self, words: &str) -> bool {
        matches!(self, Outcome::Refused(reason) if reason.contains(words))
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Denied(e) => write!(f, "denied by the server: {e}"),
            Outcome::Rejected { code, consumer, reason } => {
                write!(f, "rejected by {consumer} ({}): {reason}", code.as_str_name())
            }
            Outcome::Refused(reason) => write!(f, "refused: {reason}"),
            Outcome::Ignored(what) => write!(f, "ignored: {what}"),
            Outcome::Unheard(what) => write!(f, "unheard: {what}"),
            Outcome::Through(what) => write!(f, "went through: {what}"),
            Outcome::Unclear(what) => write!(f, "unclear: {what}"),
        }
    }
}

/// A raw NATS client holding another party's key.
pub struct Intruder {
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    errors: ServerErrors,
    /// An operator's connection, to read the rejections the hub's consumers publish.
    watcher: Bus,
}

impl Intruder {
    /// Connects to `url` as `access` (the stolen key), reading rejections through `watcher`.
    pub async fn connect(url: &str, access: &Access, watcher: Bus) -> Intruder {
        let (client, errors) = raw_client(url, access).await;
        let js = jetstream::new(client.clone());
        Intruder { client, js, errors, watcher }
    }

    /// The operator's connection the intruder reads the hub's answers through.
    pub fn watcher(&self) -> &Bus {
        &self.watcher
    }

    /// The first permission violation naming `subject` the server sent since error number `from`.
    fn violation_since(&self, from: usize, subject: &str) -> Option<String> {
        // The hub maps its own domain's API (`$JS.hub.API.…`) to `$JS.API.…` before it checks a
        // permission, and its violation names the subject it checked.
        let local = subject.replacen("$JS.hub.API.", "$JS.API.", 1);
        let errors = self.errors.lock().unwrap();
        errors
            .iter()
            .skip(from)
            .find(|e| e.contains("Permissions Violation") && (e.contains(subject) || e.contains(&local)))
            .cloned()
    }

    /// Runs `op`, and answers the permission violation naming `subject` instead of its result
    /// when the server sent one meanwhile (or just after).
    pub async fn guarded<T>(&self, subject: &str, op: impl Future<Output = T>) -> Result<T, String> {
        let from = self.errors.lock().unwrap().len();
        tokio::pin!(op);
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        let result = loop {
            tokio::select! {
                r = &mut op => break r,
                _ = tick.tick() => if let Some(e) = self.violation_since(from, subject) { return Err(e) },
            }
        };
        tokio::time::sleep(VIOLATION_GRACE).await;
        match self.violation_since(from, subject) {
            Some(e) => Err(e),
            None => Ok(result),
        }
    }

    /// Publishes to a stream with `envelope`'s headers; the stream sequence it was stored at.
    async fn publish_stored(
        &self,
        subject: &str,
        type_name: &str,
        payload: Vec<u8>,
        envelope: &Envelope,
    ) -> Result<u64, Outcome> {
        let publish = async {
            let ack = self
                .js
                .publish_with_headers(subject.to_string(), envelope.headers(type_name), Bytes::from(payload))
                .await
                .map_err(|e| e.to_string())?;
            ack.await.map_err(|e| e.to_string())
        };
        match self.guarded(subject, publish).await {
            Err(violation) => Err(Outcome::Denied(violation)),
            Ok(Err(e)) => Err(Outcome::Unclear(format!("no PubAck and no violation: {e}"))),
            Ok(Ok(ack)) => Ok(ack.sequence),
        }
    }

    /// Publishes a forged message and waits for a consumer to refuse it: [`Outcome::Rejected`]
    /// with the first rejection of its id, [`Outcome::Through`] when it was stored and none
    /// came within [`REJECTION_TIMEOUT`].
    pub async fn forge<M: BusMessage>(&self, subject: &str, message: &M, envelope: &Envelope) -> Outcome {
        let seq = match self.publish_stored(subject, M::TYPE, message.encode_to_vec(), envelope).await {
            Ok(seq) => seq,
            Err(outcome) => return outcome,
        };
        match self.rejection(&envelope.id, seq).await {
            Some(rejected) => rejected,
            None => Outcome::Through(format!(
                "stored at sequence {seq}, and no consumer refused it within {REJECTION_TIMEOUT:?}"
            )),
        }
    }

    /// [`Intruder::forge`] of an event that may have no durable consumer to refuse it: when no
    /// durable of the events stream reads its subject, [`Outcome::Unheard`] if an event reader
    /// (what the API, the dashboard and the CLI read with) does not show it, and
    /// [`Outcome::Through`] if it does.
    pub async fn forge_unseen<M: BusMessage>(&self, subject: &str, message: &M, envelope: &Envelope) -> Outcome {
        if self.durables_reading(subject).await {
            return self.forge(subject, message, envelope).await;
        }
        let seq = match self.publish_stored(subject, M::TYPE, message.encode_to_vec(), envelope).await {
            Ok(seq) => seq,
            Err(outcome) => return outcome,
        };
        let start = DeliverPolicy::ByStartSequence { start_sequence: seq };
        let mut reader = self.watcher.read_events(vec![subject.to_string()], start).await.expect("an event reader");
        match tokio::time::timeout(Duration::from_secs(2), reader.next()).await {
            Ok(Some(Ok(e))) if e.delivery.envelope.id == envelope.id => {
                Outcome::Through(format!("stored at sequence {seq}, and an event reader showed it"))
            }
            _ => Outcome::Unheard(format!("stored at sequence {seq}: no durable reads it, no reader shows it")),
        }
    }

    /// Whether a durable consumer of the events stream reads `subject`.
    async fn durables_reading(&self, subject: &str) -> bool {
        let stream = self.watcher.jetstream().get_stream(names::EVENTS_STREAM).await.expect("the events stream");
        let mut consumers = stream.consumers();
        while let Some(Ok(info)) = futures::StreamExt::next(&mut consumers).await {
            let c = &info.config;
            let filters = std::iter::once(&c.filter_subject).chain(&c.filter_subjects).filter(|f| !f.is_empty());
            let reads = filters.clone().any(|f| names::subject_matches(f, subject)) || filters.count() == 0;
            if c.durable_name.is_some() && reads {
                return true;
            }
        }
        false
    }

    /// Publishes a message that no one may store from this user: [`Outcome::Through`] as soon
    /// as a stream has it.
    pub async fn store<M: BusMessage>(&self, subject: &str, message: &M, envelope: &Envelope) -> Outcome {
        self.store_raw(subject, M::TYPE, message.encode_to_vec(), envelope).await
    }

    /// [`Intruder::store`] of any bytes.
    pub async fn store_raw(&self, subject: &str, type_name: &str, payload: Vec<u8>, envelope: &Envelope) -> Outcome {
        match self.publish_stored(subject, type_name, payload, envelope).await {
            Ok(seq) => Outcome::Through(format!("stored at stream sequence {seq}")),
            Err(outcome) => outcome,
        }
    }

    /// The rejection of message `id`, published after stream sequence `after`.
    async fn rejection(&self, id: &str, after: u64) -> Option<Outcome> {
        let filters = vec![
            names::events_of_kind(pb::rejection::COMMAND_AGGREGATE, pb::rejection::KIND),
            names::events_of_kind(pb::rejection::MESSAGE_AGGREGATE, pb::rejection::KIND),
        ];
        let start = DeliverPolicy::ByStartSequence { start_sequence: after + 1 };
        let wait = async {
            loop {
                let Ok(mut reader) = self.watcher.read_events(filters.clone(), start).await else {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    continue;
                };
                while let Some(Ok(e)) = reader.next().await {
                    if let Some(rejected) = rejection_of(&e, id) {
                        return rejected;
                    }
                }
            }
        };
        tokio::time::timeout(REJECTION_TIMEOUT, wait).await.ok()
    }

    /// A core request: the service's refusal, or what it answered.
    pub async fn request(&self, subject: &str, payload: Vec<u8>) -> Outcome {
        let request = async_nats::Request::new().payload(payload.into()).timeout(Some(REQUEST_TIMEOUT));
        match self.guarded(subject, self.client.send_request(subject.to_string(), request)).await {
            Err(violation) => Outcome::Denied(violation),
            Ok(Err(e)) => Outcome::Unclear(format!("no answer and no violation: {e}")),
            Ok(Ok(reply)) => match reply.headers.as_ref().and_then(|h| h.get(names::headers::REPLY_ERROR)) {
                Some(reason) => Outcome::Refused(reason.as_str().to_string()),
                None => Outcome::Through(format!("answered with {} bytes", reply.payload.len())),
            },
        }
    }

    /// A request to the JetStream API (`$JS.API.…`, or through a domain): its error, or what it
    /// answered.
    pub async fn js_api(&self, subject: &str, body: serde_json::Value) -> Outcome {
        let payload = serde_json::to_vec(&body).expect("JSON");
        let request = async_nats::Request::new().payload(payload.into()).timeout(Some(REQUEST_TIMEOUT));
        match self.guarded(subject, self.client.send_request(subject.to_string(), request)).await {
            Err(violation) => Outcome::Denied(violation),
            Ok(Err(e)) => Outcome::Unclear(format!("no answer and no violation: {e}")),
            Ok(Ok(reply)) => {
                let answer: serde_json::Value = serde_json::from_slice(&reply.payload).unwrap_or_default();
                match answer.get("error") {
                    Some(error) => Outcome::Refused(format!("JetStream API error {error}")),
                    None => {
                        let text = String::from_utf8_lossy(&reply.payload);
                        Outcome::Through(format!(
                            "the JetStream API answered {}",
                            text.chars().take(240).collect::<String>()
                        ))
                    }
                }
            }
        }
    }

    /// A subscription: [`Outcome::Through`] when the server took it (it is dropped again).
    pub async fn subscribe(&self, subject: &str) -> Outcome {
        let subscribe = async {
            let sub = self.client.subscribe(subject.to_string()).await;
            let _ = self.client.flush().await;
            sub
        };
        match self.guarded(subject, subscribe).await {
            Err(violation) => Outcome::Denied(violation),
            Ok(Err(e)) => Outcome::Unclear(format!("the client refused to subscribe: {e}")),
            Ok(Ok(_sub)) => Outcome::Through("the server took the subscription".into()),
        }
    }

    /// A core publish (no stream, no reply): [`Outcome::Through`] when the server took it.
    pub async fn publish(&self, subject: &str, payload: Vec<u8>) -> Outcome {
        let publish = async {
            let sent = self.client.publish(subject.to_string(), payload.into()).await;
            let _ = self.client.flush().await;
            sent
        };
        match self.guarded(subject, publish).await {
            Err(violation) => Outcome::Denied(violation),
            Ok(Err(e)) => Outcome::Unclear(format!("the client did not send it: {e}")),
            Ok(Ok(())) => Outcome::Through("the server took the message".into()),
        }
    }
}

/// The rejection `e` is, when it rejects message `id`.
fn rejection_of(e: &ReadEvent, id: &str) -> Option<Outcome> {
    let d = &e.delivery;
    let code = |c: i32| pb::RejectCode::try_from(c).unwrap_or(pb::RejectCode::Unspecified);
    if d.type_name == pb::CommandRejected::TYPE {
        let r = pb::CommandRejected::decode(d.payload.clone()).ok()?;
        (r.command_id == id).then(|| Outcome::Rejected {
            code: code(r.code),
            consumer: names::ORCHESTRATOR_COMMANDS.into(),
            reason: r.reason,
        })
    } else if d.type_name == pb::MessageRejected::TYPE {
        let r = pb::MessageRejected::decode(d.payload.clone()).ok()?;
        (r.message_id == id).then(|| Outcome::Rejected { code: code(r.code), consumer: r.consumer, reason: r.reason })
    } else {
        None
    }
}
