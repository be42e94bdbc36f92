//! The one bus runtime every landfall service uses: connect (with a server version check),
//! ensure the streams, consumers and KV buckets exist, publish with a `Nats-Msg-Id` and wait
//! for the PubAck, and the consume loop that acks only after the handler's effect is durable.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, AckKind, consumer, kv, stream};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, warn};
use uuid::Uuid;

use crate::names::{self, headers};
use crate::pb::{self, BusCommand, BusEvent, BusJob, BusMessage};

/// The oldest nats-server landfall works with. Older servers lack the account-info fields
/// KV creation needs and ignore multi-subject consumer filters.
pub const MIN_SERVER_VERSION: (u64, u64, u64) = (2, 10, 8);

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

type BoxError = Box<dyn std::error::Error + Send + Sync>;

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

fn boxed(e: impl std::error::Error + Send + Sync + 'static) -> BoxError {
    Box::new(e)
}

/// Parses `2.10.27`, `v2.11.0-RC.1` and the like.
pub fn parse_server_version(v: &str) -> Option<(u64, u64, u64)> {
    let core = v.trim().trim_start_matches('v').split(['-', '+']).next()?;
    let mut parts = core.split('.').map(|p| p.parse::<u64>());
    Some((parts.next()?.ok()?, parts.next()?.ok()?, parts.next().unwrap_or(Ok(0)).ok()?))
}

/// Whether a server of this version is supported.
pub fn server_supported(version: &str) -> bool {
    parse_server_version(version).is_some_and(|v| v >= MIN_SERVER_VERSION)
}

/// How the streams and buckets are laid out on the server.
#[derive(Debug, Clone)]
pub struct Topology {
    /// Replicas of every stream and bucket: 1 on a single server, 3 on a JetStream cluster.
    pub replicas: usize,
}

impl Default for Topology {
    fn default() -> Self {
        Self { replicas: 1 }
    }
}

impl Topology {
    /// What suits the server connected to: three replicas on a JetStream cluster, one on a
    /// single server.
    pub fn for_server(bus: &Bus) -> Self {
        let clustered = bus.client.server_info().cluster.is_some_and(|c| !c.is_empty());
        Self { replicas: if clustered { 3 } else { 1 } }
    }
}

/// The metadata that rides in the headers of every landfall message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// `Nats-Msg-Id`: the dedup key.
    pub id: String,
    /// The root command's id.
    pub correlation: String,
    /// The id of the message that caused this one (the root's own id for a root).
    pub causation: String,
    pub traceparent: String,
}

impl Envelope {
    /// A new root message (a command published by a person or a program).
    pub fn root() -> Self {
        Self::root_with_id(crate::ids::new_id())
    }

    /// A root message with a chosen id: publishing it twice does it once.
    pub fn root_with_id(id: Uuid) -> Self {
        let s = id.to_string();
        Self {
            traceparent: crate::ids::traceparent(None, &s, &id),
            correlation: s.clone(),
            causation: s.clone(),
            id: s,
        }
    }

    /// The deterministic envelope of the message `self` causes at `step` (for `node`).
    pub fn derive(&self, step: &str, node: Option<&str>) -> Self {
        let id = crate::ids::derived_id(&self.id, step, node);
        Self {
            id: id.to_string(),
            correlation: self.correlation.clone(),
            causation: self.id.clone(),
            traceparent: crate::ids::traceparent(Some(&self.traceparent), &self.correlation, &id),
        }
    }

    /// The trace id of this envelope's `traceparent`, when it has one (see [`trace_id`]).
    pub fn trace_id(&self) -> Option<&str> {
        trace_id(&self.traceparent)
    }

    /// The headers every landfall message carries, for this envelope and payload type.
    pub fn headers(&self, type_name: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(headers::MSG_ID, self.id.as_str());
        h.insert(headers::TYPE, type_name);
        h.insert(headers::CORRELATION_ID, self.correlation.as_str());
        h.insert(headers::CAUSATION_ID, self.causation.as_str());
        h.insert(headers::TRACEPARENT, self.traceparent.as_str());
        h
    }
}

/// The trace id (32 hex digits) of a W3C `traceparent` (`00-<trace id>-<parent id>-<flags>`),
/// or `None` when it is not one. A trace id accepted here is one [`crate::ids::traceparent`]
/// carries on to the messages derived from it; the all-zero id is invalid.
pub fn trace_id(traceparent: &str) -> Option<&str> {
    let mut parts = traceparent.trim().split('-');
    let (version, trace, parent, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
    // Version ff is forbidden; version 00 has exactly four fields, later versions may add more.
    let valid = hex(version, 2)
        && !version.eq_ignore_ascii_case("ff")
        && (version != "00" || parts.next().is_none())
        && hex(trace, 32)
        && trace.bytes().any(|b| b != b'0')
        && hex(parent, 16)
        && hex(flags, 2);
    valid.then_some(trace)
}

/// Counts an event stored by the stream (a copy dropped by dedup is not a new event).
fn count_published(subject: &str, type_name: &str, ack: &jetstream::publish::PublishAck) {
    if !ack.duplicate && matches!(names::parse_subject(subject), Some(names::ParsedSubject::Event { .. })) {
        metrics::counter!("landfall_events_published_total", "type" => type_name.to_string()).increment(1);
    }
}

/// A message ready to publish with [`Bus::publish_all`].
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub subject: String,
    pub type_name: String,
    pub payload: Bytes,
    pub envelope: Envelope,
}

impl Outgoing {
    pub fn event<E: BusEvent>(evt: &E, envelope: Envelope) -> Self {
        Self::new(evt.subject(), evt, envelope)
    }

    pub fn job<J: BusJob>(job: &J, envelope: Envelope) -> Self {
        Self::new(job.subject(), job, envelope)
    }

    pub fn new<M: BusMessage>(subject: String, msg: &M, envelope: Envelope) -> Self {
        Self { subject, type_name: M::TYPE.to_string(), payload: Bytes::from(msg.encode_to_vec()), envelope }
    }
}

/// How a process proves who it is to NATS and what it trusts, and where its JetStream is.
///
/// The default is an anonymous plain-text connection to the JetStream of the server connected
/// to, which is what a single local server and the tests use.
#[derive(Clone, Default)]
pub struct Access {
    /// The user's nkey seed (`SU…`): the server knows only its public key.
    pub nkey_seed: Option<String>,
    /// Verify the server's certificate with this CA (PEM), and require TLS.
    pub ca_file: Option<std::path::PathBuf>,
    /// A client certificate and its key (PEM), for servers that verify clients.
    pub client_cert: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// The JetStream domain to use: a site gateway connected to its site's leaf node names the
    /// hub's domain, so its consumer and its events are the hub's.
    pub js_domain: Option<String>,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access")
            .field("nkey", &self.public_key().ok().flatten())
            .field("ca_file", &self.ca_file)
            .field("client_cert", &self.client_cert)
            .field("js_domain", &self.js_domain)
            .finish()
    }
}

impl Access {
    /// The public key of the nkey seed, if there is one.
    ///
    /// # Errors
    /// When the seed is not a user nkey seed.
    pub fn public_key(&self) -> Result<Option<String>, String> {
        let Some(seed) = &self.nkey_seed else { return Ok(None) };
        let pair = nkeys::KeyPair::from_seed(seed.trim()).map_err(|e| format!("not an nkey seed: {e}"))?;
        if !pair.public_key().starts_with('U') {
            return Err("the nkey seed is not a user's (a user seed starts with SU)".into());
        }
        Ok(Some(pair.public_key()))
    }

    /// Reads the seed from a file (one line, `SU…`; other lines, such as comments, are skipped).
    ///
    /// # Errors
    /// When the file cannot be read or holds no seed.
    pub fn seed_from_file(path: &std::path::Path) -> Result<String, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        text.lines()
            .map(str::trim)
            .find(|l| l.starts_with("SU"))
            .map(String::from)
            .ok_or_else(|| format!("{} holds no user nkey seed (a line starting with SU)", path.display()))
    }
}

/// A connection to the bus.
#[derive(Clone)]
pub struct Bus {
    client: async_nats::Client,
    js: jetstream::Context,
    url: String,
}

impl Bus {
    /// Connects and checks that the server is new enough and has JetStream.
    ///
    /// # Errors
    /// [`BusError::Connect`] when the server cannot be reached, [`BusError::ServerTooOld`] for a
    /// server older than [`MIN_SERVER_VERSION`], [`BusError::NoJetStream`] without JetStream.
    pub async fn connect(url: &str, name: &str) -> Result<Self, BusError> {
        Self::connect_inner(url, name, true, &Access::default()).await
    }

    /// [`Bus::connect`] as a user, over TLS, or to another JetStream domain.
    pub async fn connect_with(url: &str, name: &str, access: &Access) -> Result<Self, BusError> {
        Self::connect_inner(url, name, true, access).await
    }

    /// Like [`Bus::connect_with`], but fails at once when the server does not answer, instead
    /// of waiting for it to come up: for command-line clients, not services.
    pub async fn connect_client(url: &str, name: &str, access: &Access) -> Result<Self, BusError> {
        Self::connect_inner(url, name, false, access).await
    }

    async fn connect_inner(url: &str, name: &str, patient: bool, access: &Access) -> Result<Self, BusError> {
        let bad = |reason: String| BusError::Connect { url: url.to_string(), source: reason.into() };
        let mut options = async_nats::ConnectOptions::new().name(name);
        if patient {
            options = options.retry_on_initial_connect();
        }
        if let Some(key) = access.public_key().map_err(bad)? {
            options = options
                .nkey(access.nkey_seed.clone().unwrap_or_default())
                .custom_inbox_prefix(crate::access::inbox(&key));
        }
        if let Some(ca) = &access.ca_file {
            if !ca.is_file() {
                return Err(bad(format!("the CA file {} does not exist", ca.display())));
            }
            options = options.add_root_certificates(ca.clone()).require_tls(true);
        }
        if let Some((cert, key)) = &access.client_cert {
            options = options.add_client_certificate(cert.clone(), key.clone());
        }
        let client = options
            .max_reconnects(None)
            .connection_timeout(Duration::from_secs(5))
            .request_timeout(Some(Duration::from_secs(10)))
            .event_callback(|event| async move {
                match event {
                    async_nats::Event::Disconnected => warn!("nats disconnected"),
                    async_nats::Event::Connected => info!("nats connected"),
                    // A permission violation, say: the server refused what this user may not do.
                    async_nats::Event::ServerError(e) => warn!(error = %e, "the nats server refused a request"),
                    other => debug!(%other, "nats event"),
                }
            });
        // A cluster is given as its servers' URLs, comma-separated (as `NATS_URL` usually is).
        let servers: Vec<&str> = url.split(',').map(str::trim).filter(|u| !u.is_empty()).collect();
        let client = tokio::time::timeout(Duration::from_secs(20), client.connect(servers))
            .await
            .map_err(|e| BusError::Connect { url: url.to_string(), source: boxed(e) })?
            .map_err(|e| BusError::Connect { url: url.to_string(), source: boxed(e) })?;
        // With retry_on_initial_connect the server info arrives with the first connection.
        let mut info = client.server_info();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while info.version.is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
            info = client.server_info();
        }
        if info.version.is_empty() {
            return Err(BusError::Connect {
                url: url.to_string(),
                source: "no answer from the server within 20 s".into(),
            });
        }
        if !server_supported(&info.version) {
            return Err(BusError::ServerTooOld { url: url.to_string(), found: info.version });
        }
        if !info.jetstream {
            return Err(BusError::NoJetStream { url: url.to_string() });
        }
        let js = match &access.js_domain {
            Some(domain) => jetstream::with_domain(client.clone(), domain),
            None => jetstream::new(client.clone()),
        };
        Ok(Self { client, js, url: url.to_string() })
    }

    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    pub fn jetstream(&self) -> &jetstream::Context {
        &self.js
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Creates the streams and KV buckets if they do not exist; leaves existing ones alone.
    pub async fn ensure_topology(&self, topology: &Topology) -> Result<(), BusError> {
        let base = |name: &str, subjects: &str, retention| stream::Config {
            name: name.to_string(),
            subjects: vec![subjects.to_string()],
            retention,
            storage: stream::StorageType::File,
            num_replicas: topology.replicas,
            duplicate_window: names::DEDUP_WINDOW,
            max_message_size: names::MAX_PAYLOAD as i32,
            ..Default::default()
        };
        let streams = [
            stream::Config {
                max_age: names::RETENTION,
                ..base(names::COMMANDS_STREAM, names::COMMANDS_ALL, stream::RetentionPolicy::Limits)
            },
            base(names::JOBS_STREAM, names::JOBS_ALL, stream::RetentionPolicy::WorkQueue),
            stream::Config {
                max_age: names::RETENTION,
                ..base(names::EVENTS_STREAM, names::EVENTS_ALL, stream::RetentionPolicy::Limits)
            },
        ];
        for config in streams {
            let name = config.name.clone();
            self.js.get_or_create_stream(config).await.map_err(|e| BusError::Topology {
                what: "stream",
                name,
                source: boxed(e),
            })?;
        }
        for bucket in names::ALL_BUCKETS {
            self.ensure_bucket(bucket, topology).await?;
        }
        Ok(())
    }

    async fn ensure_bucket(&self, bucket: &str, topology: &Topology) -> Result<kv::Store, BusError> {
        if let Ok(store) = self.js.get_key_value(bucket).await {
            return Ok(store);
        }
        let history = if bucket == names::SITES_BUCKET { 16 } else { 1 };
        let config = kv::Config {
            bucket: bucket.to_string(),
            history,
            num_replicas: topology.replicas,
            max_value_size: names::MAX_PAYLOAD as i32,
            storage: stream::StorageType::File,
            ..Default::default()
        };
        match self.js.create_key_value(config).await {
            Ok(store) => Ok(store),
            // Another service may have created it in the meantime.
            Err(e) => self.js.get_key_value(bucket).await.map_err(|_| BusError::Topology {
                what: "kv bucket",
                name: bucket.to_string(),
                source: boxed(e),
            }),
        }
    }

    /// [`Bus::ensure_topology`], tried again for up to `within` while it fails: a JetStream
    /// cluster that is still forming (or electing) refuses replicated streams for a moment.
    ///
    /// # Errors
    /// The last failure once `within` has passed.
    pub async fn ensure_topology_within(&self, topology: &Topology, within: Duration) -> Result<(), BusError> {
        let deadline = tokio::time::Instant::now() + within;
        for attempt in 1.. {
            match self.ensure_topology(topology).await {
                Ok(()) => return Ok(()),
                Err(e) if tokio::time::Instant::now() < deadline => {
                    warn!(attempt, error = %e, "cannot make the streams and buckets yet");
                    tokio::time::sleep(retry_delay(attempt)).await;
                }
                Err(e) => return Err(e),
            }
        }
        unreachable!("the loop returns")
    }

    /// Waits until `stream` exists (another service creates it), or `shutdown`.
    ///
    /// # Errors
    /// [`BusError::Topology`] when `shutdown` came first.
    pub async fn wait_for_stream(&self, stream: &str, shutdown: &CancellationToken) -> Result<(), BusError> {
        for attempt in 1.. {
            match self.js.get_stream(stream).await {
                Ok(_) => return Ok(()),
                Err(e) => {
                    if attempt == 1 || attempt % 10 == 0 {
                        warn!(stream, error = %e, "waiting for the stream (the hub's services create it)");
                    }
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => {
                    return Err(BusError::Topology { what: "stream", name: stream.to_string(), source: "stopped while waiting for it".into() });
                }
                _ = tokio::time::sleep(retry_delay(attempt)) => {}
            }
        }
        unreachable!("the loop returns")
    }

    /// A KV bucket (which [`Bus::ensure_topology`] created).
    pub async fn kv(&self, bucket: &str) -> Result<Kv, BusError> {
        let store = self.js.get_key_value(bucket).await.map_err(|e| BusError::Topology {
            what: "kv bucket",
            name: bucket.to_string(),
            source: boxed(e),
        })?;
        Ok(Kv { store, bucket: bucket.to_string() })
    }

    /// Publishes a payload with the envelope's headers and waits for the stream's PubAck.
    /// A repeated envelope id within the dedup window is acknowledged as a duplicate and
    /// stored once.
    pub async fn publish_raw(
        &self,
        subject: String,
        type_name: &str,
        payload: Bytes,
        envelope: &Envelope,
    ) -> Result<jetstream::publish::PublishAck, BusError> {
        if payload.len() > names::MAX_PAYLOAD {
            return Err(BusError::TooLarge { subject, size: payload.len(), max: names::MAX_PAYLOAD });
        }
        let ack = self
            .js
            .publish_with_headers(subject.clone(), envelope.headers(type_name), payload)
            .await
            .map_err(|e| BusError::Publish { subject: subject.clone(), source: boxed(e) })?;
        let ack = ack.await.map_err(|e| BusError::Publish { subject: subject.clone(), source: boxed(e) })?;
        count_published(&subject, type_name, &ack);
        if ack.duplicate {
            debug!(%subject, id = %envelope.id, "duplicate publish dropped by the stream");
        }
        Ok(ack)
    }

    /// Publishes every message, pipelined: all are sent, then every PubAck is awaited. Order
    /// on the wire is the order given. Returns once all are stored (or the first error).
    pub async fn publish_all(&self, messages: Vec<Outgoing>) -> Result<(), BusError> {
        let mut acks = Vec::with_capacity(messages.len());
        for m in messages {
            if m.payload.len() > names::MAX_PAYLOAD {
                return Err(BusError::TooLarge { subject: m.subject, size: m.payload.len(), max: names::MAX_PAYLOAD });
            }
            let ack = self
                .js
                .publish_with_headers(m.subject.clone(), m.envelope.headers(&m.type_name), m.payload)
                .await
                .map_err(|e| BusError::Publish { subject: m.subject.clone(), source: boxed(e) })?;
            acks.push(async move {
                let ack = ack.await.map_err(|e| BusError::Publish { subject: m.subject.clone(), source: boxed(e) })?;
                count_published(&m.subject, &m.type_name, &ack);
                Ok::<_, BusError>(ack)
            });
        }
        futures::future::try_join_all(acks).await?;
        Ok(())
    }

    pub async fn publish<M: BusMessage>(
        &self,
        subject: String,
        msg: &M,
        envelope: &Envelope,
    ) -> Result<jetstream::publish::PublishAck, BusError> {
        self.publish_raw(subject, M::TYPE, Bytes::from(msg.encode_to_vec()), envelope).await
    }

    pub async fn publish_command<C: BusCommand>(
        &self,
        cmd: &C,
        envelope: &Envelope,
    ) -> Result<jetstream::publish::PublishAck, BusError> {
        self.publish(cmd.subject(), cmd, envelope).await
    }

    pub async fn publish_event<E: BusEvent>(
        &self,
        evt: &E,
        envelope: &Envelope,
    ) -> Result<jetstream::publish::PublishAck, BusError> {
        self.publish(evt.subject(), evt, envelope).await
    }

    pub async fn publish_job<J: BusJob>(
        &self,
        job: &J,
        envelope: &Envelope,
    ) -> Result<jetstream::publish::PublishAck, BusError> {
        self.publish(job.subject(), job, envelope).await
    }

    /// Publishes the rejection event for a delivery that could not be carried out.
    pub async fn publish_rejection(&self, d: &Delivery, as_: &RejectAs, r: &Rejection) -> Result<(), BusError> {
        let scope = match names::parse_subject(&d.subject) {
            Some(names::ParsedSubject::Command { scope, .. }) => scope,
            Some(names::ParsedSubject::Job { site, .. }) => site,
            Some(names::ParsedSubject::Event { scope, .. }) => scope,
            Some(names::ParsedSubject::Service { site, .. }) => site,
            None => names::FLEET,
        };
        // A scope that is not a valid token (garbage on a wildcard) is answered in the fleet scope.
        let scope = if crate::domain::SiteId::try_from(scope).is_ok() { scope } else { names::FLEET };
        let envelope = d.envelope.derive("rejected", None);
        match as_ {
            RejectAs::Command => {
                let evt = pb::CommandRejected {
                    command_id: d.envelope.id.clone(),
                    command_type: d.type_name.clone(),
                    subject: d.subject.clone(),
                    code: r.code as i32,
                    reason: r.reason.clone(),
                };
                let subject = names::event_subject(scope, pb::rejection::COMMAND_AGGREGATE, pb::rejection::KIND);
                self.publish(subject, &evt, &envelope).await?;
            }
            RejectAs::Message { consumer } => {
                let evt = pb::MessageRejected {
                    message_id: d.envelope.id.clone(),
                    message_type: d.type_name.clone(),
                    subject: d.subject.clone(),
                    code: r.code as i32,
                    reason: r.reason.clone(),
                    consumer: consumer.clone(),
                };
                let subject = names::event_subject(scope, pb::rejection::MESSAGE_AGGREGATE, pb::rejection::KIND);
                self.publish(subject, &evt, &envelope).await?;
            }
        }
        Ok(())
    }

    /// An ordered, ephemeral reader of the events stream, for people and dashboards.
    pub async fn read_events(
        &self,
        filters: Vec<String>,
        deliver: consumer::DeliverPolicy,
    ) -> Result<EventReader, BusError> {
        let consume_err = |e: BoxError| BusError::Consume { consumer: "event reader".into(), source: e };
        let stream = self.js.get_stream(names::EVENTS_STREAM).await.map_err(|e| consume_err(boxed(e)))?;
        let consumer = stream
            .create_consumer(consumer::pull::OrderedConfig {
                filter_subjects: filters,
                deliver_policy: deliver,
                ..Default::default()
            })
            .await
            .map_err(|e| consume_err(boxed(e)))?;
        let mut consumer = consumer;
        let pending = consumer.info().await.map_err(|e| consume_err(boxed(e)))?.num_pending;
        let messages = consumer.messages().await.map_err(|e| consume_err(boxed(e)))?;
        Ok(EventReader { messages, pending_at_start: pending })
    }
}

/// Events in stream order; see [`Bus::read_events`].
pub struct EventReader {
    messages: consumer::pull::Ordered,
    /// How many matching events were stored when the reader was made.
    pub pending_at_start: u64,
}

/// One event as read from the stream.
#[derive(Debug, Clone)]
pub struct ReadEvent {
    pub delivery: Delivery,
    /// Events still stored after this one.
    pub pending: u64,
    pub published: time::OffsetDateTime,
}

impl EventReader {
    pub async fn next(&mut self) -> Option<Result<ReadEvent, BusError>> {
        let msg = self.messages.next().await?;
        Some(msg.map_err(|e| BusError::Consume { consumer: "event reader".into(), source: boxed(e) }).map(|m| {
            let (pending, published, seq) = m.info().map(|i| (i.pending, i.published, i.stream_sequence)).unwrap_or((
                0,
                time::OffsetDateTime::UNIX_EPOCH,
                0,
            ));
            let delivery = Delivery::from_parts(&m.message, names::EVENTS_STREAM, seq, 1);
            ReadEvent { delivery, pending, published }
        }))
    }
}

/// A KV bucket holding protobuf values, written with compare-and-set.
#[derive(Clone)]
pub struct Kv {
    store: kv::Store,
    bucket: String,
}

/// One key's new value as a watch sees it ([`Kv::watch_latest`]).
#[derive(Debug, Clone)]
pub struct KvChange {
    pub key: String,
    /// The encoded value; `None` when the key was deleted or purged.
    pub value: Option<Bytes>,
    pub revision: u64,
    pub caught_up: bool,
}

/// The result of a compare-and-set write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cas {
    /// Written; the entry's new revision.
    Written(u64),
    /// Someone else wrote first (or the key already exists, for a create).
    Conflict,
}

impl Kv {
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    fn err(&self, op: &'static str, key: &str, source: BoxError) -> BusError {
        BusError::Kv { op, bucket: self.bucket.clone(), key: key.to_string(), source }
    }

    /// The value and its revision; `None` when absent or deleted.
    pub async fn get<M: prost::Message + Default>(&self, key: &str) -> Result<Option<(M, u64)>, BusError> {
        let entry = self.store.entry(key).await.map_err(|e| self.err("get", key, boxed(e)))?;
        match entry {
            Some(e) if e.operation == kv::Operation::Put => {
                let value = M::decode(e.value).map_err(|source| BusError::KvDecode {
                    what: std::any::type_name::<M>(),
                    bucket: self.bucket.clone(),
                    key: key.to_string(),
                    source,
                })?;
                Ok(Some((value, e.revision)))
            }
            _ => Ok(None),
        }
    }

    /// Writes only if the key does not exist (or was deleted).
    pub async fn create<M: prost::Message>(&self, key: &str, value: &M) -> Result<Cas, BusError> {
        match self.store.create(key, Bytes::from(value.encode_to_vec())).await {
            Ok(rev) => Ok(Cas::Written(rev)),
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => Ok(Cas::Conflict),
            Err(e) => Err(self.err("create", key, boxed(e))),
        }
    }

    /// Writes only if the entry is still at `revision`.
    pub async fn update<M: prost::Message>(&self, key: &str, value: &M, revision: u64) -> Result<Cas, BusError> {
        match self.store.update(key, Bytes::from(value.encode_to_vec()), revision).await {
            Ok(rev) => Ok(Cas::Written(rev)),
            Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => Ok(Cas::Conflict),
            Err(e) => Err(self.err("update", key, boxed(e))),
        }
    }

    /// Writes unconditionally.
    pub async fn put<M: prost::Message>(&self, key: &str, value: &M) -> Result<u64, BusError> {
        self.store.put(key, Bytes::from(value.encode_to_vec())).await.map_err(|e| self.err("put", key, boxed(e)))
    }

    /// Deletes only if the entry is still at `revision`.
    pub async fn delete_if(&self, key: &str, revision: u64) -> Result<Cas, BusError> {
        match self.store.delete_expect_revision(key, Some(revision)).await {
            Ok(()) => Ok(Cas::Written(revision)),
            Err(e) if e.kind() == kv::DeleteErrorKind::WrongLastRevision => Ok(Cas::Conflict),
            Err(e) => Err(self.err("delete", key, boxed(e))),
        }
    }

    /// Every live entry whose key starts with `prefix` (which ends with `.` or is empty), with
    /// its revision, in one pass over the bucket's stream: an ordered consumer delivering the
    /// last message per key. Thousands of entries cost one round trip per batch, not one per key.
    /// Entries that do not decode as `M` are skipped with a warning.
    pub async fn scan<M: prost::Message + Default>(&self, prefix: &str) -> Result<Vec<(String, M, u64)>, BusError> {
        self.scan_matching(&format!("{prefix}>")).await
    }

    /// Like [`Kv::scan`], for every key matching a NATS wildcard pattern (`node.*.*.kubelet`).
    ///
    /// Every key that exists when the scan ends comes back once, with a value it had during the
    /// scan. A bucket keeps one message per key, so a key rewritten while the scan runs loses its
    /// old message, perhaps before the consumer reaches it, and its new one lies past wherever
    /// the consumer is; the consumer's pending count does not say so reliably. So the scan reads
    /// at least up to the last matching message as of its start, and if matching messages were
    /// written meanwhile it lists the bucket's keys and fetches any it has not seen.
    pub async fn scan_matching<M: prost::Message + Default>(
        &self,
        pattern: &str,
    ) -> Result<Vec<(String, M, u64)>, BusError> {
        let err = |e: BoxError| self.err("scan", pattern, e);
        let subject_prefix = self.store.prefix.as_str(); // "$KV.<bucket>."
        let filter = format!("{subject_prefix}{pattern}");
        let Some(end) = self.last_raw(&filter).await.map_err(err)? else { return Ok(Vec::new()) };
        let config = consumer::pull::OrderedConfig {
            filter_subject: filter.clone(),
            deliver_policy: consumer::DeliverPolicy::LastPerSubject,
            ..Default::default()
        };
        let consumer = self.store.stream.create_consumer(config).await.map_err(|e| err(boxed(e)))?;
        let mut messages = consumer.messages().await.map_err(|e| err(boxed(e)))?;
        let mut latest = ScanEntries::<M>::default();
        let mut seen = 0;
        let mut stalled = false;
        while seen < end {
            // The message at `end`, or the one that replaced it, is always there to come; one
            // that aged out of the bucket never does, and the listing below covers for it.
            let Ok(next) = tokio::time::timeout(SCAN_STALL, messages.next()).await else {
                stalled = true;
                break;
            };
            let Some(msg) = next else {
                stalled = true;
                break;
            };
            let msg = msg.map_err(|e| err(boxed(e)))?;
            let info = msg.info().map_err(err)?;
            seen = seen.max(info.stream_sequence);
            latest.add(self, subject_prefix, &msg.subject, msg.headers.as_ref(), &msg.payload, info.stream_sequence);
        }
        drop(messages);
        let written_since = self.last_raw(&filter).await.map_err(err)?.is_some_and(|last| last > seen);
        if stalled || written_since {
            let keys = self.store.stream.info_with_subjects(&filter).await.map_err(|e| err(boxed(e)))?;
            let keys: Vec<String> =
                keys.map_ok(|(subject, _)| subject).try_collect().await.map_err(|e| err(boxed(e)))?;
            for subject in keys {
                let Some(key) = subject.strip_prefix(subject_prefix) else { continue };
                if latest.0.contains_key(key) {
                    continue;
                }
                match self.store.stream.get_last_raw_message_by_subject(&subject).await {
                    Ok(msg) => {
                        latest.add(self, subject_prefix, &msg.subject, Some(&msg.headers), &msg.payload, msg.sequence)
                    }
                    Err(e) if e.kind() == async_nats::jetstream::stream::LastRawMessageErrorKind::NoMessageFound => {}
                    Err(e) => return Err(err(boxed(e))),
                }
            }
        }
        Ok(latest
            .0
            .into_iter()
            .filter_map(|(key, entry)| entry.map(|(value, revision)| (key, value, revision)))
            .collect())
    }

    /// The stream sequence of the last message on `subject` (a wildcard filter), if any.
    async fn last_raw(&self, subject: &str) -> Result<Option<u64>, BoxError> {
        match self.store.stream.get_last_raw_message_by_subject(subject).await {
            Ok(last) => Ok(Some(last.sequence)),
            Err(e) if e.kind() == async_nats::jetstream::stream::LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(boxed(e)),
        }
    }

    /// The latest value of every key matching one of `patterns` (KV key patterns, `*` and `>`
    /// as in subjects), then every change as it happens. `caught_up` is set on the change that
    /// brings the reader up to date with the bucket, and on every change after it.
    ///
    /// # Errors
    /// When the watch cannot be created; a broken watch ends its stream (watch again).
    pub async fn watch_latest(
        &self,
        patterns: Vec<String>,
    ) -> Result<impl futures::Stream<Item = Result<KvChange, BusError>> + use<>, BusError> {
        let label = patterns.join(",");
        let watch =
            self.store.watch_many_with_history(patterns).await.map_err(|e| self.err("watch", &label, boxed(e)))?;
        let bucket = self.bucket.clone();
        Ok(watch.map(move |entry| {
            let entry = entry.map_err(|e| BusError::Kv {
                op: "watch",
                bucket: bucket.clone(),
                key: label.clone(),
                source: boxed(e),
            })?;
            Ok(KvChange {
                value: (entry.operation == kv::Operation::Put).then_some(entry.value),
                key: entry.key,
                revision: entry.revision,
                caught_up: entry.seen_current || entry.delta == 0,
            })
        }))
    }

    /// Every live key starting with `prefix`.
    pub async fn keys_with_prefix(&self, prefix: &str) -> Result<Vec<String>, BusError> {
        let mut keys = self.store.keys().await.map_err(|e| self.err("keys", prefix, boxed(e)))?;
        let mut out = Vec::new();
        while let Some(k) = keys.next().await {
            let k = k.map_err(|e| self.err("keys", prefix, boxed(e)))?;
            if k.starts_with(prefix) {
                out.push(k);
            }
        }
        out.sort();
        Ok(out)
    }
}

/// Every package reference in the catalog (`landfall-packages`); entries that no longer
/// validate are skipped.
pub async fn package_refs(packages: &Kv) -> Result<std::collections::BTreeSet<crate::domain::PackageRef>, BusError> {
    Ok(packages
        .scan::<pb::Package>(names::keys::PACKAGE_PREFIX)
        .await?
        .into_iter()
        .filter_map(|(_, p, _)| crate::domain::Package::try_from(p).ok())
        .map(|p| p.reference())
        .collect())
}

/// What nodes run, as observed (`landfall-observed`), one record per node with every package
/// reported for it, for keys starting with `prefix` (e.g. [`names::keys::observed_site_prefix`]).
pub async fn observed_nodes(observed: &Kv, prefix: &str) -> Result<Vec<pb::NodeObserved>, BusError> {
    let mut nodes: std::collections::BTreeMap<(String, String), pb::NodeObserved> = Default::default();
    for (_, v, _) in observed.scan::<pb::ObservedVersion>(prefix).await? {
        let n = nodes.entry((v.site_id.clone(), v.node.clone())).or_insert_with(|| pb::NodeObserved {
            site_id: v.site_id.clone(),
            node: v.node.clone(),
            ..Default::default()
        });
        if v.updated_unix_ms > n.updated_unix_ms {
            n.updated_unix_ms = v.updated_unix_ms;
            n.last_event_id = v.event_id.clone();
        }
        n.packages.push(pb::ObservedPackage { name: v.name, version: v.version, kind: v.kind });
    }
    Ok(nodes.into_values().collect())
}

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
    fn from_parts(m: &async_nats::Message, stream: &str, seq: u64, delivered: i64) -> Self {
        let h = |name: &str| m.headers.as_ref().and_then(|h| h.get(name)).map(|v| v.as_str().to_string());
        let id = h(headers::MSG_ID)
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| crate::ids::derived_id(stream, "seq", Some(&seq.to_string())).to_string());
        let correlation = h(headers::CORRELATION_ID).filter(|s| !s.is_empty()).unwrap_or_else(|| id.clone());
        let causation = h(headers::CAUSATION_ID).filter(|s| !s.is_empty()).unwrap_or_else(|| id.clone());
        let traceparent = h(headers::TRACEPARENT)
            .unwrap_or_else(|| crate::ids::traceparent(None, &correlation, &Uuid::parse_str(&id).unwrap_or_default()));
        Self {
            subject: m.subject.to_string(),
            type_name: h(headers::TYPE).unwrap_or_default(),
            envelope: Envelope { id, correlation, causation, traceparent },
            payload: m.payload.clone(),
            delivered,
            stream_sequence: seq,
        }
    }

    /// The `<kind>` of a command (`landfall.cmd.<kind>.<scope>`) or job
    /// (`landfall.job.<site>.<kind>`) subject.
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

    /// Decodes the payload as `M`, checking the type header when there is one.
    ///
    /// # Errors
    /// A [`HandlerError::Reject`] with code `MALFORMED` that says what was wrong.
    pub fn decode<M: BusMessage>(&self) -> Result<M, HandlerError> {
        if !self.type_name.is_empty() && self.type_name != M::TYPE {
            return Err(HandlerError::reject(
                pb::RejectCode::Malformed,
                format!("{} carries {}, expected {}", self.subject, self.type_name, M::TYPE),
            ));
        }
        M::decode(self.payload.clone()).map_err(|e| {
            HandlerError::reject(pb::RejectCode::Malformed, format!("payload is not a valid {}: {e}", M::TYPE))
        })
    }
}

/// A permanent refusal, with the reason people will read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub code: pb::RejectCode,
    pub reason: String,
}

#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    /// Try again later (NAK with backoff).
    #[error("transient: {0}")]
    Transient(String),
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
    }
}

impl From<BusError> for HandlerError {
    fn from(e: BusError) -> Self {
        let mut text = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            text.push_str(": ");
            text.push_str(&s.to_string());
            src = s.source();
        }
        match e.kind() {
            ErrorKind::Reject => HandlerError::reject(pb::RejectCode::Invalid, text),
            _ => HandlerError::Transient(text),
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

/// What a consume loop does with each message.
pub trait Handler: Send + Sync + 'static {
    /// Carries out the message. Return only once its effect is durable: the loop acks
    /// right after.
    fn handle(&self, delivery: &Delivery) -> impl Future<Output = Result<(), HandlerError>> + Send;
}

/// A durable pull consumer and how to run it.
#[derive(Debug, Clone)]
pub struct ConsumerSpec {
    pub stream: &'static str,
    pub durable: String,
    pub filter_subjects: Vec<String>,
    /// How long a delivery may go unacknowledged; the loop sends progress while a handler runs.
    pub ack_wait: Duration,
    /// How many messages may be handled at once by this process.
    pub concurrency: usize,
    pub reject_as: RejectAs,
    /// When set, messages whose subjects share this token (0-based) are handled one after
    /// another in stream order; others still run concurrently. For commands, the scope token
    /// keeps a site's `RegisterSite` ahead of its `InstallSite`.
    pub ordered_by_token: Option<usize>,
    /// With `ordered_by_token`: the token value that orders against everything (for commands,
    /// `fleet`: a package registration stays ahead of the installs that need it).
    pub barrier_token: Option<String>,
}

impl ConsumerSpec {
    pub fn new(stream: &'static str, durable: impl Into<String>, filters: Vec<String>, reject_as: RejectAs) -> Self {
        Self {
            stream,
            durable: durable.into(),
            filter_subjects: filters,
            ack_wait: Duration::from_secs(10),
            concurrency: 64,
            reject_as,
            ordered_by_token: None,
            barrier_token: None,
        }
    }

    /// Handle messages that share subject token `index` in order; see [`ConsumerSpec::ordered_by_token`].
    pub fn ordered_by_token(mut self, index: usize, barrier: Option<&str>) -> Self {
        self.ordered_by_token = Some(index);
        self.barrier_token = barrier.map(str::to_owned);
        self
    }

    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }
}

/// Backoff for transient failures: 0.5 s doubling to 30 s.
pub fn retry_delay(delivered: i64) -> Duration {
    let exp = delivered.clamp(1, 8) as u32 - 1;
    Duration::from_millis(500u64.saturating_mul(1 << exp)).min(Duration::from_secs(30))
}

/// Runs a consume loop until `shutdown`, then lets in-flight messages finish.
///
/// Per message: `Ok` → ack (confirmed by the server); `Transient` → NAK with backoff;
/// `Wait` → NAK with its delay; `Reject` → publish the rejection event, then terminate.
/// A rejection that cannot be published is NAKed instead, so nothing is dropped silently.
pub async fn consume<H: Handler>(
    bus: Bus,
    spec: ConsumerSpec,
    handler: Arc<H>,
    shutdown: CancellationToken,
) -> Result<(), BusError> {
    let consume_err = |e: BoxError| BusError::Consume { consumer: spec.durable.clone(), source: e };
    let stream = bus.js.get_stream(spec.stream).await.map_err(|e| consume_err(boxed(e)))?;
    let config = consumer::pull::Config {
        durable_name: Some(spec.durable.clone()),
        filter_subjects: spec.filter_subjects.clone(),
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait: spec.ack_wait,
        max_deliver: -1,
        max_ack_pending: (spec.concurrency as i64 * 4).max(256),
        ..Default::default()
    };
    let consumer = stream.get_or_create_consumer(&spec.durable, config).await.map_err(|e| consume_err(boxed(e)))?;
    let spec = Arc::new(spec);
    let permits = Arc::new(tokio::sync::Semaphore::new(spec.concurrency));
    let mut in_flight = JoinSet::new();
    let mut order = KeyedOrder::default();
    info!(consumer = %spec.durable, filters = ?spec.filter_subjects, "consuming");

    'outer: while !shutdown.is_cancelled() {
        let mut messages = match consumer.messages().await {
            Ok(m) => m,
            Err(e) => {
                warn!(consumer = %spec.durable, error = %e, "cannot pull, retrying");
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                }
            }
        };
        loop {
            let permit = tokio::select! {
                _ = shutdown.cancelled() => break 'outer,
                p = permits.clone().acquire_owned() => p.expect("semaphore is never closed"),
            };
            let next = tokio::select! {
                _ = shutdown.cancelled() => break 'outer,
                n = messages.next() => n,
            };
            match next {
                Some(Ok(msg)) => {
                    let (bus, spec, handler) = (bus.clone(), spec.clone(), handler.clone());
                    let key = spec.ordered_by_token.and_then(|i| msg.subject.split('.').nth(i)).map(str::to_owned);
                    let (before, done) = order.enqueue(key, spec.barrier_token.as_deref());
                    in_flight.spawn(async move {
                        // Messages ahead of this one are handled first (their senders drop then).
                        for b in before {
                            let _ = b.await;
                        }
                        handle_one(&bus, &spec, handler.as_ref(), msg).await;
                        drop(done);
                        drop(permit);
                    });
                }
                Some(Err(e)) => {
                    debug!(consumer = %spec.durable, error = %e, "pull stream error");
                    if matches!(e.kind(), consumer::pull::MessagesErrorKind::ConsumerDeleted) {
                        break;
                    }
                }
                None => break,
            }
            while in_flight.try_join_next().is_some() {}
        }
    }
    info!(consumer = %spec.durable, in_flight = in_flight.len(), "stopping: draining in-flight messages");
    while in_flight.join_next().await.is_some() {}
    Ok(())
}

type Done = futures::future::Shared<tokio::sync::oneshot::Receiver<()>>;

/// Chains messages by key: each waits for the one before it with the same key. A message
/// whose key is the barrier waits for every message before it, and every later one waits for it.
#[derive(Default)]
struct KeyedOrder {
    last: std::collections::HashMap<String, Done>,
    barrier: Option<Done>,
}

impl KeyedOrder {
    /// What a message with `key` waits for before it is handled, and what it drops once handled.
    fn enqueue(
        &mut self,
        key: Option<String>,
        barrier: Option<&str>,
    ) -> (Vec<Done>, Option<tokio::sync::oneshot::Sender<()>>) {
        use futures::FutureExt;
        let Some(key) = key else { return (Vec::new(), None) };
        // Forget keys whose last message is done, so the map stays as small as the work in flight.
        if self.last.len() > 1024 {
            self.last.retain(|_, done| done.peek().is_none());
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let done = rx.shared();
        let mut wait: Vec<Done> = self.barrier.iter().cloned().collect();
        if barrier == Some(key.as_str()) {
            wait.extend(self.last.drain().map(|(_, d)| d));
            self.barrier = Some(done);
        } else if let Some(previous) = self.last.insert(key, done) {
            wait.push(previous);
        }
        (wait, Some(tx))
    }
}

async fn handle_one<H: Handler>(bus: &Bus, spec: &ConsumerSpec, handler: &H, msg: jetstream::Message) {
    let (seq, delivered) = msg.info().map(|i| (i.stream_sequence, i.delivered)).unwrap_or((0, 1));
    let delivery = Delivery::from_parts(&msg.message, spec.stream, seq, delivered);
    if delivered > 1 {
        metrics::counter!("landfall_redeliveries_total", "consumer" => spec.durable.clone()).increment(1);
    }
    // Every log line of this message's work, in every service, carries its trace id. The span
    // is at ERROR level so that it is there whenever any of those lines is logged at all.
    let span = tracing::error_span!(
        "handle",
        consumer = %spec.durable,
        subject = %delivery.subject,
        msg_id = %delivery.envelope.id,
        trace_id = delivery.envelope.trace_id().unwrap_or_default(),
    );
    settle_one(bus, spec, handler, msg, delivery).instrument(span).await;
}

/// Runs the handler on one delivery, then acks, NAKs or rejects it by what the handler returned.
async fn settle_one<H: Handler>(
    bus: &Bus,
    spec: &ConsumerSpec,
    handler: &H,
    msg: jetstream::Message,
    delivery: Delivery,
) {
    let delivered = delivery.delivered;

    // Keep the delivery ours while the handler works, however long that takes.
    let outcome = {
        let work = handler.handle(&delivery);
        tokio::pin!(work);
        let mut tick = tokio::time::interval(spec.ack_wait / 3);
        tick.tick().await;
        loop {
            tokio::select! {
                r = &mut work => break r,
                _ = tick.tick() => { let _ = msg.ack_with(AckKind::Progress).await; }
            }
        }
    };

    let consumer = spec.durable.as_str();
    match outcome {
        Ok(()) => {
            metrics::counter!("landfall_messages_handled_total", "consumer" => consumer.to_string()).increment(1);
            if let Err(e) = msg.double_ack().await {
                // The effect is durable and idempotent: a redelivery finds it done.
                warn!(consumer, subject = %delivery.subject, error = %e, "ack not confirmed; the message may be redelivered");
            }
        }
        Err(HandlerError::Wait { reason, delay }) => {
            debug!(consumer, subject = %delivery.subject, %reason, "not yet, redelivering later");
            let _ = msg.ack_with(AckKind::Nak(Some(delay))).await;
        }
        Err(HandlerError::Transient(reason)) => {
            metrics::counter!("landfall_messages_retried_total", "consumer" => consumer.to_string()).increment(1);
            let delay = retry_delay(delivered);
            warn!(consumer, subject = %delivery.subject, delivered, ?delay, %reason, "transient failure, will retry");
            let _ = msg.ack_with(AckKind::Nak(Some(delay))).await;
        }
        Err(HandlerError::Reject(rejection)) => {
            metrics::counter!("landfall_messages_rejected_total", "consumer" => consumer.to_string()).increment(1);
            warn!(consumer, subject = %delivery.subject, id = %delivery.envelope.id, reason = %rejection.reason, "rejected");
            match bus.publish_rejection(&delivery, &spec.reject_as, &rejection).await {
                Ok(()) => {
                    let _ = msg.double_ack_with(AckKind::Term).await;
                }
                Err(e) => {
                    warn!(consumer, error = %e, "cannot publish the rejection; will retry");
                    let _ = msg.ack_with(AckKind::Nak(Some(retry_delay(delivered)))).await;
                }
            }
        }
    }
}

/// The answer to a core request: headers and body.
pub type Reply = (HeaderMap, Bytes);

/// A failed request's answer: an empty body, and the reason in the `Landfall-Error` header.
pub fn error_reply(reason: &str) -> Reply {
    let mut h = HeaderMap::new();
    h.insert(headers::REPLY_ERROR, reason);
    (h, Bytes::new())
}

/// Answers the core requests on `subject` (a queue group `group` shared by the service's
/// replicas), at most `concurrency` at once, until `shutdown`. `answer` gets the subject the
/// request came on and its payload. Requests in hand when `shutdown` comes are answered first.
pub async fn serve_requests<F, Fut>(
    bus: &Bus,
    subject: String,
    group: &str,
    concurrency: usize,
    shutdown: CancellationToken,
    answer: F,
) -> Result<(), BusError>
where
    F: Fn(async_nats::Subject, Bytes) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Reply> + Send + 'static,
{
    let mut sub = bus
        .client()
        .queue_subscribe(subject.clone(), group.to_string())
        .await
        .map_err(|e| BusError::Request { subject: subject.clone(), source: Box::new(e) })?;
    let answer = Arc::new(answer);
    let permits = Arc::new(tokio::sync::Semaphore::new(concurrency.max(1)));
    let mut tasks = JoinSet::new();
    loop {
        let msg = tokio::select! {
            _ = shutdown.cancelled() => break,
            m = sub.next() => match m { Some(m) => m, None => break },
        };
        let Some(reply) = msg.reply else { continue };
        let Ok(permit) = permits.clone().acquire_owned().await else { break };
        let (answer, client, subject) = (answer.clone(), bus.client().clone(), subject.clone());
        // A request's span has the fields of a consumed message's, those its headers give.
        let header = |name: &str| msg.headers.as_ref().and_then(|h| h.get(name)).map(|v| v.as_str().to_string());
        let (msg_id, traceparent) = (header(headers::MSG_ID), header(headers::TRACEPARENT));
        let span = tracing::error_span!(
            "handle",
            consumer = group,
            subject = %msg.subject,
            msg_id = msg_id.as_deref(),
            trace_id = traceparent.as_deref().and_then(trace_id),
        );
        tasks.spawn(
            async move {
                let (headers, body) = answer(msg.subject, msg.payload).await;
                if let Err(e) = client.publish_with_headers(reply, headers, body).await {
                    warn!(%subject, error = %e, "cannot answer request");
                }
                drop(permit);
            }
            .instrument(span),
        );
        while tasks.try_join_next().is_some() {}
    }
    let _ = sub.unsubscribe().await;
    while tasks.join_next().await.is_some() {}
    Ok(())
}

/// How long a scan waits for the next message before it lists the keys instead.
const SCAN_STALL: Duration = Duration::from_secs(2);

/// A scan's latest entry per key (`None`: deleted), by key.
struct ScanEntries<M>(std::collections::BTreeMap<String, Option<(M, u64)>>);

impl<M> Default for ScanEntries<M> {
    fn default() -> Self {
        Self(Default::default())
    }
}

impl<M: prost::Message + Default> ScanEntries<M> {
    /// Takes one message of the bucket's stream, if it is newer than what the key has.
    fn add(
        &mut self,
        kv: &Kv,
        subject_prefix: &str,
        subject: &str,
        headers: Option<&HeaderMap>,
        payload: &Bytes,
        revision: u64,
    ) {
        let Some(key) = subject.strip_prefix(subject_prefix) else { return };
        if self.0.get(key).is_some_and(|e| e.as_ref().is_some_and(|(_, r)| *r >= revision)) {
            return;
        }
        let deleted = headers
            .and_then(|h| h.get(headers::KV_OPERATION))
            .is_some_and(|op| op.as_str() == "DEL" || op.as_str() == "PURGE");
        if deleted {
            self.0.insert(key.to_string(), None);
            return;
        }
        match M::decode(payload.clone()) {
            Ok(value) => {
                self.0.insert(key.to_string(), Some((value, revision)));
            }
            Err(e) => warn!(bucket = %kv.bucket, key, error = %e, "skipping an entry that does not decode"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_versions() {
        assert!(!server_supported("2.9.10"));
        assert!(!server_supported("2.10.7"));
        assert!(server_supported("2.10.8"));
        assert!(server_supported("v2.11.0-RC.1"));
        assert!(server_supported("2.15.1"));
        assert!(!server_supported("garbage"));
    }

    #[test]
    fn backoff_grows_and_caps() {
        assert_eq!(retry_delay(1), Duration::from_millis(500));
        assert_eq!(retry_delay(2), Duration::from_secs(1));
        assert_eq!(retry_delay(100), Duration::from_secs(30));
    }

    #[tokio::test]
    async fn keyed_order_chains_keys_and_barriers() {
        let mut order = KeyedOrder::default();
        let (w, a1) = order.enqueue(Some("a".into()), Some("fleet"));
        assert!(w.is_empty());
        let (w, b1) = order.enqueue(Some("b".into()), Some("fleet"));
        assert!(w.is_empty(), "other keys run concurrently");
        let (w, _a2) = order.enqueue(Some("a".into()), Some("fleet"));
        assert_eq!(w.len(), 1, "same key waits");
        let (w, f) = order.enqueue(Some("fleet".into()), Some("fleet"));
        assert_eq!(w.len(), 2, "a barrier waits for the last of every key");
        let (w, _c) = order.enqueue(Some("c".into()), Some("fleet"));
        assert_eq!(w.len(), 1, "everything after a barrier waits for it");
        drop((a1, b1));
        let (w, _) = order.enqueue(None, Some("fleet"));
        assert!(w.is_empty(), "unkeyed messages are not ordered");
        drop(f);
    }

    #[test]
    fn derived_envelopes_chain() {
        let root = Envelope::root();
        let child = root.derive("stage", None);
        assert_eq!(child.correlation, root.id);
        assert_eq!(child.causation, root.id);
        assert_eq!(child, root.derive("stage", None));
        let grandchild = child.derive("provision_os", Some("n1"));
        assert_eq!(grandchild.correlation, root.id);
        assert_eq!(grandchild.causation, child.id);
    }

    #[test]
    fn derived_envelopes_continue_the_trace_with_a_span_of_their_own() {
        let root = Envelope::root();
        let trace = root.trace_id().expect("a root starts a trace").to_string();
        assert_eq!(trace, Uuid::parse_str(&root.id).unwrap().simple().to_string(), "the root's id is the trace id");
        let child = root.derive("stage", None);
        let grandchild = child.derive("provision_os", Some("n1"));
        assert_eq!(child.trace_id(), Some(trace.as_str()));
        assert_eq!(grandchild.trace_id(), Some(trace.as_str()));
        let parent = |e: &Envelope| e.traceparent.split('-').nth(2).unwrap().to_string();
        assert_ne!(parent(&child), parent(&root));
        assert_ne!(parent(&grandchild), parent(&child));
        // Derived again (a redelivery, another replica): the same traceparent.
        assert_eq!(root.derive("stage", None).traceparent, child.traceparent);
    }

    #[test]
    fn trace_ids_parse_from_w3c_traceparents_only() {
        let id = "4bf92f3577b34da6a3ce929d0e0e4736";
        assert_eq!(trace_id(&format!("00-{id}-00f067aa0ba902b7-01")), Some(id));
        assert_eq!(trace_id(&format!(" 00-{id}-00f067aa0ba902b7-00 ")), Some(id), "surrounding blanks");
        let later = format!("01-{id}-00f067aa0ba902b7-01-future");
        assert_eq!(trace_id(&later), Some(id), "a later version may add fields");
        for bad in [
            String::new(),
            "garbage".to_string(),
            format!("00-{id}-00f067aa0ba902b7-01-extra"),
            format!("ff-{id}-00f067aa0ba902b7-01"),
            format!("0-{id}-00f067aa0ba902b7-01"),
            format!("00-{}-00f067aa0ba902b7-01", &id[..31]),
            format!("00-{id}x-00f067aa0ba902b7-01"),
            format!("00-{}-00f067aa0ba902b7-01", "0".repeat(32)),
            format!("00-{}-00f067aa0ba902b7-01", "g".repeat(32)),
            format!("00-{id}-00f067aa0ba902b-01"),
            format!("00-{id}-00f067aa0ba902b7-1"),
            format!("00-{id}-00f067aa0ba902b7"),
        ] {
            assert_eq!(trace_id(&bad), None, "{bad:?}");
        }
    }

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
