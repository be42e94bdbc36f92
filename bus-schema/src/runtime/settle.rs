//! One delivery's life in the consume loop ([`settle`]): it waits for its turn among the
//! messages of its key, runs its handler holding one of the loop's permits, and is then acked,
//! rejected, parked here and tried again (a wait, a transient failure), or given up to
//! `LANDFALL_DEAD`. It is kept alive with progress acks all the while, and NAKed at once when
//! the loop shuts down while it waits.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, warn};

use super::connect::Bus;
use super::consume::{ConsumerSpec, Handler};
use super::dead_letter::{GaveUp, dead_letter};
use super::delivery::{Delivery, HandlerError};
use super::error::{error_chain, retry_delay};
use super::keyed_order::KeyedOrder;
use super::store_health;

/// What every delivery of one consume loop shares.
pub(super) struct Loop {
    pub bus: Bus,
    pub spec: ConsumerSpec,
    /// One per message being handled (`spec.concurrency`); a parked or queued one holds none.
    pub permits: Arc<Semaphore>,
    pub order: Arc<KeyedOrder>,
    pub shutdown: CancellationToken,
    /// The stream sequences of the messages this loop has in hand (waiting, running or parked).
    pub in_hand: std::sync::Mutex<std::collections::HashSet<u64>>,
}

/// A message's place in [`Loop::in_hand`], given up when dropped.
struct InHand<'a> {
    cx: &'a Loop,
    seq: u64,
}

impl<'a> InHand<'a> {
    /// Takes the message stored at `seq` in hand; `None` when this loop has it already: the
    /// server delivered it again because the progress of the attempt under way did not reach it
    /// in time (a busy hub). That attempt's acks, progress and NAK name the message by its
    /// sequence, whichever delivery they came with, so it alone settles the message: a second
    /// attempt beside it would run the handler twice at once (two patches of the same nodes).
    fn take(cx: &'a Loop, seq: u64) -> Option<Self> {
        // A delivery without its reply subject's sequence (never seen from a server) is not held.
        // The guard is made only for a sequence taken: dropped, it gives the sequence up.
        (seq == 0 || cx.in_hand.lock().expect("in-hand lock").insert(seq)).then(|| Self { cx, seq })
    }
}

impl Drop for InHand<'_> {
    fn drop(&mut self) {
        self.cx.in_hand.lock().expect("in-hand lock").remove(&self.seq);
    }
}

/// Takes one delivery through its life; see the module's comment.
pub(super) async fn settle<H: Handler>(cx: Arc<Loop>, handler: Arc<H>, msg: jetstream::Message) {
    let info = msg.info().ok();
    let (seq, delivered) = info.as_ref().map_or((0, 1), |i| (i.stream_sequence, i.delivered));
    let stored = info.map(|i| std::time::SystemTime::from(i.published));
    let delivery = Delivery::from_parts(&msg.message, cx.spec.stream, seq, delivered);
    if delivered > 1 {
        metrics::counter!("landfall_redeliveries_total", "consumer" => cx.spec.durable.clone()).increment(1);
    }
    let Some(_in_hand) = InHand::take(&cx, seq) else {
        debug!(consumer = %cx.spec.durable, subject = %delivery.subject, seq, delivered, "delivered again while in hand here: the attempt under way settles it");
        metrics::counter!("landfall_deliveries_in_hand_total", "consumer" => cx.spec.durable.clone()).increment(1);
        return;
    };
    let span = handling_span(&cx.spec.durable, &delivery);
    live(&cx, handler.as_ref(), &msg, &delivery, stored).instrument(span).await;
}

/// The span `consumer`'s handling of `d` runs in. Every log line of a message's work, in every
/// service, carries its trace id. The span is at ERROR level so that it is there whenever any of
/// those lines is logged at all.
pub(super) fn handling_span(consumer: &str, d: &Delivery) -> tracing::Span {
    tracing::error_span!(
        "handle",
        consumer = %consumer,
        subject = %d.subject,
        msg_id = %d.envelope.id,
        trace_id = d.envelope.trace_id().unwrap_or_default(),
    )
}

/// Awaits `work`, sending progress on `msg` every `every` so the server keeps the delivery
/// ours; `None` when `stop` is cancelled first.
async fn alive<F: Future>(
    msg: &jetstream::Message,
    every: Duration,
    stop: Option<&CancellationToken>,
    work: F,
) -> Option<F::Output> {
    tokio::pin!(work);
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    let stopped = async {
        match stop {
            Some(s) => s.cancelled().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(stopped);
    loop {
        tokio::select! {
            r = &mut work => return Some(r),
            _ = tick.tick() => { let _ = msg.ack_with(AckKind::Progress).await; }
            _ = &mut stopped => return None,
        }
    }
}

/// Counts a parked delivery in `landfall_messages_parked{consumer}` while it lives.
struct Parked(String);

impl Parked {
    fn new(consumer: &str) -> Self {
        metrics::gauge!("landfall_messages_parked", "consumer" => consumer.to_string()).increment(1.0);
        Self(consumer.to_string())
    }
}

impl Drop for Parked {
    fn drop(&mut self) {
        metrics::gauge!("landfall_messages_parked", "consumer" => self.0.clone()).decrement(1.0);
    }
}

/// Hands the delivery back to the server at once (shutdown): another replica takes it.
async fn hand_back(msg: &jetstream::Message) {
    let _ = msg.ack_with(AckKind::Nak(None)).await;
}

/// Whether a delivery the server has handed out `delivered` times is to be given up before it
/// is handled: more deliveries than attempts allowed means its process was lost each time.
pub(super) fn lost_too_often(delivered: i64, max_attempts: Option<u32>) -> bool {
    max_attempts.is_some_and(|max| delivered > i64::from(max))
}

/// What is done after an attempt that did not settle the delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Next {
    /// Park it for this long, then try again.
    Retry(Duration),
    /// Give it up as a dead letter.
    GiveUp,
}

/// How transient failures are counted: those of earlier deliveries (each a failure, as far as
/// this process can tell) and those here. A failure because the store is full is not counted.
#[derive(Debug, Clone, Copy)]
pub(super) struct Failures {
    pub counted: u32,
    pub store_full: u32,
}

impl Failures {
    pub(super) fn after_deliveries(delivered: i64) -> Self {
        Self { counted: u32::try_from(delivered.saturating_sub(1).max(0)).unwrap_or(u32::MAX), store_full: 0 }
    }

    /// One more transient failure (`store_full` when the store is full): what to do next.
    pub(super) fn failed(&mut self, store_full: bool, max_attempts: Option<u32>) -> Next {
        if store_full {
            self.store_full = self.store_full.saturating_add(1);
            return Next::Retry(retry_delay(i64::from(self.store_full)));
        }
        self.counted = self.counted.saturating_add(1);
        match max_attempts {
            Some(max) if self.counted >= max => Next::GiveUp,
            _ => Next::Retry(retry_delay(i64::from(self.counted))),
        }
    }
}

async fn live<H: Handler>(
    cx: &Loop,
    handler: &H,
    msg: &jetstream::Message,
    d: &Delivery,
    stored: Option<std::time::SystemTime>,
) {
    let spec = &cx.spec;
    let consumer = spec.durable.as_str();
    let every = (spec.ack_wait / 3).max(Duration::from_millis(50));
    if lost_too_often(d.delivered, spec.max_attempts) {
        let reason =
            format!("delivered {} times and never settled: the process handling it was lost each time", d.delivered);
        Box::pin(give_up(cx, handler, msg, d, u32::try_from(d.delivered).unwrap_or(u32::MAX), reason)).await;
        return;
    }
    // A site's gateway may publish anything under its own subjects: what it may not send is
    // refused before any handler sees it, whatever kinds the handler reads.
    if let Some(forbidden) = crate::trust::forged_by_a_gateway(&d.subject, &d.type_name, &d.payload) {
        let rejection = super::delivery::Rejection { code: crate::pb::RejectCode::Forbidden, reason: forbidden.0 };
        return reject(cx, msg, d, rejection).await;
    }
    let key = spec.ordered_by_token.and_then(|i| d.subject.split('.').nth(i)).map(str::to_owned);
    // Its place among the messages of its key, kept until it is settled (dropped on return).
    let ticket = cx.order.enter(key, spec.barrier_token.as_deref(), d.stream_sequence);
    let mut failures = Failures::after_deliveries(d.delivered);
    loop {
        // Its turn, then a permit: waiting for either is not work, and holds no permit.
        if let Some(t) = &ticket
            && alive(msg, every, Some(&cx.shutdown), t.turn()).await.is_none()
        {
            return hand_back(msg).await;
        }
        let Some(permit) = alive(msg, every, Some(&cx.shutdown), cx.permits.clone().acquire_owned()).await else {
            return hand_back(msg).await;
        };
        // A handler that has started finishes, shutdown or not. Its future is boxed, made only
        // now: a handler's future is kilobytes (the orchestrator's, about 19 KiB), and held inline
        // it would make every delivery waiting for its turn or a permit as large, thousands at
        // once at 10,000 sites.
        let work = super::trace::handled(consumer, d, stored, Box::pin(handler.handle(d)));
        let (outcome, span) = alive(msg, every, None, work).await.expect("no stop was given");
        drop(permit);
        if let Some(t) = &ticket {
            t.attempt_done();
        }
        let delay = match outcome {
            Ok(()) => return acked(consumer, msg, d).await,
            // The rejection event, and a dead letter, hang under the handling that led to them.
            Err(HandlerError::Reject(rejection)) => {
                return super::trace::within(span, reject(cx, msg, d, rejection)).await;
            }
            Err(HandlerError::Wait { reason, delay }) => {
                debug!(consumer, subject = %d.subject, %reason, ?delay, "not yet: parked, trying again later");
                delay
            }
            Err(e @ HandlerError::Transient { .. }) => {
                let store_full = e.is_store_full();
                if store_full {
                    store_health::note_refused(&store_health::refused_stream(&e));
                } else {
                    metrics::counter!("landfall_messages_retried_total", "consumer" => consumer.to_string())
                        .increment(1);
                }
                match failures.failed(store_full, spec.max_attempts) {
                    Next::GiveUp => {
                        let gave_up = Box::pin(give_up(cx, handler, msg, d, failures.counted, error_chain(&e)));
                        return super::trace::within(span, gave_up).await;
                    }
                    Next::Retry(delay) => {
                        log_retry(consumer, &d.subject, failures, delay, &e);
                        delay
                    }
                }
            }
        };
        if cx.shutdown.is_cancelled() {
            return hand_back(msg).await;
        }
        let parked = Parked::new(consumer);
        let slept = alive(msg, every, Some(&cx.shutdown), tokio::time::sleep(delay)).await;
        drop(parked);
        if slept.is_none() {
            return hand_back(msg).await;
        }
    }
}

async fn acked(consumer: &str, msg: &jetstream::Message, d: &Delivery) {
    metrics::counter!("landfall_messages_handled_total", "consumer" => consumer.to_string()).increment(1);
    if let Err(e) = msg.double_ack().await {
        // The effect is durable and idempotent: a redelivery finds it done.
        warn!(consumer, subject = %d.subject, error = %e, "ack not confirmed; the message may be redelivered");
    }
}

async fn reject(cx: &Loop, msg: &jetstream::Message, d: &Delivery, rejection: super::delivery::Rejection) {
    let consumer = cx.spec.durable.as_str();
    metrics::counter!("landfall_messages_rejected_total", "consumer" => consumer.to_string()).increment(1);
    warn!(consumer, subject = %d.subject, id = %d.envelope.id, reason = %rejection.reason, "rejected");
    match cx.bus.publish_rejection(d, &cx.spec.reject_as, &rejection).await {
        Ok(()) => {
            let _ = msg.double_ack_with(AckKind::Term).await;
        }
        Err(e) => {
            warn!(consumer, error = %e, "cannot publish the rejection; will retry");
            let _ = msg.ack_with(AckKind::Nak(Some(retry_delay(d.delivered)))).await;
        }
    }
}

/// Files the delivery as a dead letter, lets the handler record it, then terminates it. Until
/// all of that is done the delivery is kept (NAKed): nothing is lost.
async fn give_up<H: Handler>(
    cx: &Loop,
    handler: &H,
    msg: &jetstream::Message,
    d: &Delivery,
    attempts: u32,
    error: String,
) {
    let consumer = cx.spec.durable.as_str();
    let now_ms = time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000;
    let at = GaveUp { stream: cx.spec.stream, consumer };
    let letter = dead_letter(d, msg.message.headers.as_ref(), at, attempts, &error, now_ms as i64);
    let dead_sequence = match cx.bus.file_dead_letter(d, &letter).await {
        Ok(seq) => seq,
        Err(e) => {
            warn!(consumer, subject = %d.subject, error = %error_chain(&e), "cannot file the dead letter; keeping the message");
            let _ = msg.ack_with(AckKind::Nak(Some(retry_delay(d.delivered)))).await;
            return;
        }
    };
    if let Err(e) = handler.on_dead_lettered(d, &error).await {
        warn!(consumer, subject = %d.subject, error = %error_chain(&e), "cannot record the dead letter; keeping the message");
        let _ = msg.ack_with(AckKind::Nak(Some(retry_delay(d.delivered)))).await;
        return;
    }
    metrics::counter!("landfall_messages_dead_lettered_total", "consumer" => consumer.to_string()).increment(1);
    warn!(consumer, subject = %d.subject, id = %d.envelope.id, dead_sequence, attempts, %error, "given up: filed as a dead letter");
    let _ = msg.double_ack_with(AckKind::Term).await;
}

/// Logs a transient failure with every cause under it: what the handler was doing, and why.
fn log_retry(consumer: &str, subject: &str, failures: Failures, delay: Duration, error: &HandlerError) {
    warn!(
        consumer,
        subject,
        failures = failures.counted,
        store_full = failures.store_full,
        ?delay,
        error = %error_chain(error),
        "transient failure, parked to try again"
    );
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::runtime::{BusError, error::boxed};

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
        let counted = Failures { counted: 2, store_full: 0 };
        tracing::subscriber::with_default(subscriber, || {
            for e in &failures {
                log_retry("orchestrator", "landfall.cmd.install_site.edge-01", counted, Duration::from_secs(1), e);
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
    fn transient_failures_are_counted_across_deliveries_and_store_full_never() {
        let mut f = Failures::after_deliveries(1);
        for _ in 0..100 {
            assert!(matches!(f.failed(true, Some(3)), Next::Retry(_)), "a full store never gives up");
        }
        assert_eq!(f.failed(false, Some(3)), Next::Retry(retry_delay(1)));
        assert_eq!(f.failed(false, Some(3)), Next::Retry(retry_delay(2)));
        assert_eq!(f.failed(false, Some(3)), Next::GiveUp);
        let mut f = Failures::after_deliveries(3);
        assert_eq!(f.failed(false, Some(3)), Next::GiveUp, "two deliveries before this one count");
        let mut f = Failures::after_deliveries(50);
        assert!(matches!(f.failed(false, None), Next::Retry(_)), "no bound: never");
    }

    #[test]
    fn a_delivery_handed_out_more_times_than_attempts_is_given_up_unhandled() {
        assert!(!lost_too_often(10, Some(10)));
        assert!(lost_too_often(11, Some(10)));
        assert!(!lost_too_often(1000, None));
    }
}
