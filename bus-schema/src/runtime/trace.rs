//! Spans a tracing backend can draw, made where the bus is used: each message handled, each
//! message published, each request answered. They go to the sink a process installs
//! ([`set_sink`]: the OTLP exporter of `landfall --otlp-endpoint`); without one, nothing is made.
//!
//! The tree follows the messages. The `traceparent` of a message names its trace (the root
//! command's) and its own span id (from its message id), so:
//! - a message's span ([`published`]) is the child of the handling that published it, or, when
//!   it was not published while handling anything, of the message that caused it; a root
//!   command's span is made by the service that accepts it ([`handled`]), from the time it was
//!   stored until it was accepted, since whoever published it may export nothing;
//! - handling a message ([`handled`]) is a child of that message's span; a request made while
//!   handling carries the handling's span in its `traceparent` ([`traceparent_now`]), and the
//!   answer ([`answered`]) is its child.
//!
//! A message stored once is one span: a copy the stream drops as a duplicate makes none, so a
//! job carried out again after a crash does not draw its events twice. Each attempt at handling
//! is a span of its own (a retry is real work).

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use super::delivery::{Delivery, HandlerError};
use crate::envelope::Envelope;

/// What a span stands for, as OTLP's `SpanKind` says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    /// Answering a request.
    Server,
    /// A message published.
    Producer,
    /// A message handled.
    Consumer,
}

/// One finished span.
#[derive(Debug, Clone)]
pub struct SpanRecord {
    /// The service it belongs to (`orchestrator`, `gateway`, `kubeconfig`, `distribution`, …).
    pub service: String,
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    /// `None` for a trace's root.
    pub parent: Option<[u8; 8]>,
    pub name: String,
    pub kind: SpanKind,
    pub start: SystemTime,
    pub end: SystemTime,
    pub attributes: Vec<(&'static str, String)>,
    /// Why it failed, when it did.
    pub error: Option<String>,
}

type Sink = Box<dyn Fn(SpanRecord) + Send + Sync>;

static SINK: OnceLock<Sink> = OnceLock::new();

/// Sends every span this process makes to `sink` from now on. Only the first call takes.
pub fn set_sink(sink: impl Fn(SpanRecord) + Send + Sync + 'static) -> bool {
    SINK.set(Box::new(sink)).is_ok()
}

/// Whether spans are made at all.
pub fn enabled() -> bool {
    SINK.get().is_some()
}

fn emit(span: SpanRecord) {
    if let Some(sink) = SINK.get() {
        sink(span);
    }
}

/// The handling a task is in: what the messages it publishes and the requests it makes hang under.
#[derive(Debug, Clone)]
struct Current {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    service: Arc<str>,
}

tokio::task_local! {
    static CURRENT: Current;
}

fn current() -> Option<Current> {
    CURRENT.try_with(Clone::clone).ok()
}

/// The service a consumer or queue group belongs to: its name without `landfall-`, up to the
/// first `-` (`orchestrator-commands` → `orchestrator`, `gateway-edge-01` → `gateway`,
/// `landfall-distribution` → `distribution`).
pub fn service_of(consumer: &str) -> &str {
    let name = consumer.strip_prefix("landfall-").unwrap_or(consumer);
    name.split('-').next().unwrap_or(name)
}

/// The trace id and span id of a W3C `traceparent`, when it is one.
pub fn parse_traceparent(traceparent: &str) -> Option<([u8; 16], [u8; 8])> {
    let mut parts = traceparent.trim().split('-');
    let (_version, trace, span) = (parts.next()?, parts.next()?, parts.next()?);
    let trace: [u8; 16] = hex_bytes(trace)?;
    let span: [u8; 8] = hex_bytes(span)?;
    (trace != [0; 16] && span != [0; 8]).then_some((trace, span))
}

fn hex_bytes<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != N * 2 {
        return None;
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(s.get(i * 2..i * 2 + 2)?, 16).ok()?;
    }
    Some(out)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A span id of its own (a handling or an answer: each attempt is another).
fn fresh_span_id() -> [u8; 8] {
    let id = uuid::Uuid::new_v4();
    let mut out = [0u8; 8];
    out.copy_from_slice(&id.as_bytes()[8..16]);
    if out == [0; 8] { [1; 8] } else { out }
}

/// The span id a message's `traceparent` gives it: see [`crate::ids::traceparent`].
fn message_span_id(message_id: &str) -> Option<[u8; 8]> {
    let id = uuid::Uuid::parse_str(message_id).ok()?;
    let mut out = [0u8; 8];
    out.copy_from_slice(&id.as_bytes()[8..16]);
    Some(out)
}

/// The `traceparent` for a request made now: the handling this task is in as its parent.
/// `None` outside a handling, or when no spans are made.
pub fn traceparent_now() -> Option<String> {
    if !enabled() {
        return None;
    }
    current().map(|c| format!("00-{}-{}-01", hex(&c.trace_id), hex(&c.span_id)))
}

/// A finished handling, for what is done after it on its behalf ([`within`]).
#[derive(Debug, Clone)]
pub struct Handling(Current);

/// Runs `work` as a child of `handling` (what it publishes hangs under it); without one, only
/// runs it.
pub async fn within<F: Future>(handling: Option<Handling>, work: F) -> F::Output {
    match handling {
        Some(Handling(current)) => CURRENT.scope(current, work).await,
        None => work.await,
    }
}

/// Runs `work`, the handling of `d` by `consumer`, as a span; messages it publishes and
/// requests it makes are its children. For a root command (its own cause), its span is made
/// too, from `stored` (when the stream stored it) to the end of a handling that settles it.
/// Returns the outcome, and the handling for what follows from it ([`within`]).
pub async fn handled<F>(
    consumer: &str,
    d: &Delivery,
    stored: Option<SystemTime>,
    work: F,
) -> (F::Output, Option<Handling>)
where
    F: Future<Output = Result<(), HandlerError>>,
{
    let Some((trace_id, message_span)) = enabled().then(|| parse_traceparent(&d.envelope.traceparent)).flatten() else {
        return (work.await, None);
    };
    let service: Arc<str> = service_of(consumer).into();
    let span_id = fresh_span_id();
    let start = SystemTime::now();
    let current = Current { trace_id, span_id, service: service.clone() };
    let outcome = CURRENT.scope(current.clone(), work).await;
    let end = SystemTime::now();
    let (error, result) = match &outcome {
        Ok(()) => (None, "handled"),
        Err(HandlerError::Reject(r)) => (Some(r.reason.clone()), "rejected"),
        Err(HandlerError::Wait { reason, .. }) => (None, if reason.is_empty() { "waiting" } else { reason.as_str() }),
        Err(e @ HandlerError::Transient { .. }) => (Some(super::error_chain(e)), "retried"),
    };
    let type_name = short_type(&d.type_name);
    // A root command whose publisher gave it a trace context of its own is a child of the
    // publisher's span, which is the publisher's to export. Only commands: one consumer
    // accepts each, where a root event's several consumers would each draw it.
    let command = matches!(crate::names::parse_subject(&d.subject), Some(crate::names::ParsedSubject::Command { .. }));
    let root =
        command && d.envelope.causation == d.envelope.id && message_span_id(&d.envelope.id) == Some(message_span);
    if root && matches!(outcome, Ok(()) | Err(HandlerError::Reject(_))) {
        emit(SpanRecord {
            service: service.to_string(),
            trace_id,
            span_id: message_span,
            parent: None,
            name: format!("{type_name} accepted"),
            kind: SpanKind::Producer,
            start: stored.unwrap_or(start).min(start),
            end,
            attributes: message_attributes(&d.subject, &d.envelope),
            error: error.clone(),
        });
    }
    let mut attributes = message_attributes(&d.subject, &d.envelope);
    attributes.extend([
        ("messaging.consumer.group.name", consumer.to_string()),
        ("messaging.message.delivery_count", d.delivered.to_string()),
        ("landfall.outcome", result.to_string()),
    ]);
    emit(SpanRecord {
        service: service.to_string(),
        trace_id,
        span_id,
        parent: Some(message_span),
        name: format!("{consumer} {type_name}"),
        kind: SpanKind::Consumer,
        start,
        end,
        attributes,
        error,
    });
    (outcome, Some(Handling(current)))
}

/// A message stored by its stream (not a duplicate it dropped): its span, from `start` (when
/// publishing began) to now. A root message's span is its acceptor's (see [`handled`]).
pub fn published(subject: &str, type_name: &str, envelope: &Envelope, start: SystemTime) {
    if !enabled() || envelope.causation == envelope.id {
        return;
    }
    let Some((trace_id, span_id)) = parse_traceparent(&envelope.traceparent) else { return };
    let here = current().filter(|c| c.trace_id == trace_id);
    let parent = here.as_ref().map(|c| c.span_id).or_else(|| message_span_id(&envelope.causation));
    let service = here.map_or_else(|| "landfall".to_string(), |c| c.service.to_string());
    emit(SpanRecord {
        service,
        trace_id,
        span_id,
        parent,
        name: format!("publish {}", short_type(type_name)),
        kind: SpanKind::Producer,
        start,
        end: SystemTime::now(),
        attributes: message_attributes(subject, envelope),
        error: None,
    });
}

/// Runs `work`, the answer of `group` to a request on `subject` that carried `traceparent`, as
/// a span (its child); without one, or without a sink, it is only run.
pub async fn answered<F: Future>(group: &str, subject: &str, traceparent: Option<&str>, work: F) -> F::Output {
    let Some((trace_id, parent)) = traceparent.filter(|_| enabled()).and_then(parse_traceparent) else {
        return work.await;
    };
    let service: Arc<str> = service_of(group).into();
    let span_id = fresh_span_id();
    let start = SystemTime::now();
    let out = CURRENT.scope(Current { trace_id, span_id, service: service.clone() }, work).await;
    emit(SpanRecord {
        service: service.to_string(),
        trace_id,
        span_id,
        parent: Some(parent),
        name: format!("answer {}", request_kind(subject)),
        kind: SpanKind::Server,
        start,
        end: SystemTime::now(),
        attributes: vec![("messaging.destination.name", subject.to_string()), ("rpc.service", group.to_string())],
        error: None,
    });
    out
}

fn message_attributes(subject: &str, envelope: &Envelope) -> Vec<(&'static str, String)> {
    vec![
        ("messaging.system", "nats".to_string()),
        ("messaging.destination.name", subject.to_string()),
        ("messaging.message.id", envelope.id.clone()),
        ("landfall.correlation_id", envelope.correlation.clone()),
        ("landfall.causation_id", envelope.causation.clone()),
    ]
}

/// `landfall.v1.InstallSite` → `InstallSite`.
fn short_type(type_name: &str) -> &str {
    type_name.rsplit('.').next().unwrap_or(type_name)
}

/// What a request asks: its subject's last token (`landfall.svc.edge-01.artifact_plan` →
/// `artifact_plan`).
fn request_kind(subject: &str) -> &str {
    subject.rsplit('.').next().unwrap_or(subject)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn services_are_named_from_their_consumers_and_groups() {
        assert_eq!(service_of("orchestrator-commands"), "orchestrator");
        assert_eq!(service_of("gateway-edge-01"), "gateway");
        assert_eq!(service_of("gateway"), "gateway");
        assert_eq!(service_of("landfall-distribution"), "distribution");
        assert_eq!(service_of("kubeconfig-events"), "kubeconfig");
    }

    #[test]
    fn a_traceparent_gives_its_trace_and_span_and_the_message_span_matches_its_id() {
        let root = Envelope::root();
        let child = root.derive("provision_os", Some("n1"));
        let (trace, span) = parse_traceparent(&child.traceparent).unwrap();
        assert_eq!(hex(&trace), child.trace_id().unwrap());
        assert_eq!(Some(span), message_span_id(&child.id), "a message's span id is its id's");
        let (_, root_span) = parse_traceparent(&root.traceparent).unwrap();
        assert_eq!(Some(root_span), message_span_id(&child.causation), "the cause's span is found from its id");
        assert!(parse_traceparent("00-00000000000000000000000000000000-00f067aa0ba902b7-01").is_none());
        assert!(parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-xyz-01").is_none());
        assert!(parse_traceparent("garbage").is_none());
    }

    #[test]
    fn request_kinds_read_from_subjects() {
        assert_eq!(request_kind("landfall.svc.edge-01.artifact_plan"), "artifact_plan");
        assert_eq!(request_kind("plan"), "plan");
    }
}
