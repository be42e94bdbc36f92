//! The consume loop: a durable pull consumer whose messages a [`Handler`] carries out, acked
//! only once the handler's effect is durable, NAKed with a backoff on a transient failure, and
//! terminated with a rejection event on a permanent one.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer};
use futures::StreamExt;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, warn};

use super::connect::Bus;
use super::delivery::{Delivery, HandlerError, RejectAs};
use super::error::{BoxError, BusError, boxed, error_chain, retry_delay};
use super::keyed_order::KeyedOrder;
use crate::names;

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

    /// The durable consumer of one site's gateway: its own jobs, 256 at once (a site's hosts all
    /// provision together). The hub makes it when the site is registered ([`ensure_consumer`]),
    /// so a site's user needs no right to create a consumer of any kind.
    pub fn gateway(site: &str) -> Self {
        let durable = names::gateway_consumer(site);
        Self::new(
            names::JOBS_STREAM,
            durable.clone(),
            vec![names::site_jobs(site)],
            RejectAs::Message { consumer: durable },
        )
        .concurrency(256)
    }

    fn pull_config(&self) -> consumer::pull::Config {
        let (filter_subject, filter_subjects) = filters(&self.filter_subjects);
        consumer::pull::Config {
            durable_name: Some(self.durable.clone()),
            filter_subject,
            filter_subjects,
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: self.ack_wait,
            max_deliver: -1,
            max_ack_pending: (self.concurrency as i64 * 4).max(256),
            ..Default::default()
        }
    }
}

/// Makes the durable consumer `spec` names when it does not exist yet, and leaves one that does
/// alone.
///
/// # Errors
/// [`BusError::Consume`] when the stream or the JetStream API cannot be reached.
pub async fn ensure_consumer(bus: &Bus, spec: &ConsumerSpec) -> Result<(), BusError> {
    let consume_err = |e: BoxError| BusError::Consume { consumer: spec.durable.clone(), source: e };
    let stream = bus.jetstream().get_stream(spec.stream).await.map_err(|e| consume_err(boxed(e)))?;
    stream.get_or_create_consumer(&spec.durable, spec.pull_config()).await.map_err(|e| consume_err(boxed(e)))?;
    Ok(())
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
    let stream = bus.jetstream().get_stream(spec.stream).await.map_err(|e| consume_err(boxed(e)))?;
    // A site's gateway may not create its consumer: the hub made it when the site was
    // registered. Until then (or while the hub is out of reach) it waits, asking again.
    let consumer = loop {
        match stream.get_or_create_consumer(&spec.durable, spec.pull_config()).await {
            Ok(c) => break c,
            Err(e) => {
                warn!(consumer = %spec.durable, error = %e, "no consumer yet (the hub makes a site's when it is registered); asking again");
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                }
            }
        }
    };
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
/// A consumer's filters as its config holds them. One filter goes in `filter_subject`, so that
/// the create request names it in its subject (`CONSUMER.CREATE.<stream>.<name>.<filter>`),
/// which the server checks against the config and a user's permissions can pin: a site may
/// create its durable only with its own jobs as the filter. Several go in `filter_subjects`,
/// which no create subject can carry.
fn filters(filters: &[String]) -> (String, Vec<String>) {
    match filters {
        [one] => (one.clone(), Vec::new()),
        many => (String::new(), many.to_vec()),
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
        Err(e @ HandlerError::Transient { .. }) => {
            metrics::counter!("landfall_messages_retried_total", "consumer" => consumer.to_string()).increment(1);
            let delay = retry_delay(delivered);
            log_retry(consumer, &delivery.subject, delivered, delay, &e);
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

/// Logs a transient failure with every cause under it: what the handler was doing, and why.
fn log_retry(consumer: &str, subject: &str, delivered: i64, delay: Duration, error: &HandlerError) {
    warn!(consumer, subject, delivered, ?delay, error = %error_chain(error), "transient failure, will retry");
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// Log output, kept in memory.
    #[derive(Clone, Default)]
    struct Logs(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Logs {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("logs lock").extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_transient_failure_is_logged_with_every_cause() {
        let logs = Logs::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt().with_writer(move || writer.clone()).with_ansi(false).finish();
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection reset by the hub");
        let bus = BusError::Kv {
            op: "get",
            bucket: "landfall-sagas".into(),
            key: "lease.edge-01".into(),
            source: boxed(reset),
        };
        let failures = [
            HandlerError::transient("reading the lease of edge-01", bus),
            HandlerError::from(BusError::Publish { subject: "landfall.evt.x".into(), source: "no responders".into() }),
        ];
        tracing::subscriber::with_default(subscriber, || {
            for e in &failures {
                log_retry("orchestrator", "landfall.cmd.install_site.edge-01", 2, Duration::from_secs(1), e);
            }
        });
        let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
        assert!(
            text.contains(
                "error=transient: reading the lease of edge-01: kv get landfall-sagas/lease.edge-01: connection reset by the hub"
            ),
            "{text}"
        );
        assert!(text.contains("error=transient: bus: publish to landfall.evt.x: no responders"), "{text}");
    }

    #[test]
    fn one_filter_is_the_filter_subject_so_the_create_subject_carries_it() {
        let one = vec!["landfall.job.edge-01.>".to_string()];
        assert_eq!(filters(&one), ("landfall.job.edge-01.>".to_string(), Vec::new()));
        let two = vec!["a.>".to_string(), "b.>".to_string()];
        assert_eq!(filters(&two), (String::new(), two.clone()));
        assert_eq!(filters(&[]), (String::new(), Vec::new()));
    }
}
