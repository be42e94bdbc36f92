//! The consume loop: a durable consumer whose messages a [`Handler`] carries out, each
//! delivery taken through its life by `settle.rs` (acked once the effect is durable, parked and
//! retried in place on a transient failure or a wait, given up to `LANDFALL_DEAD` after too many
//! failures, terminated with a rejection event on a permanent one).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, ErrorCode, consumer};
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::connect::Bus;
use super::delivery::{Delivery, HandlerError, RejectAs};
use super::error::{BoxError, BusError, boxed};
use super::keyed_order::KeyedOrder;
use super::settle::{Loop, settle};
use crate::names;

/// What a consume loop does with each message.
pub trait Handler: Send + Sync + 'static {
    /// Carries out the message. Return only once its effect is durable: the loop acks
    /// right after.
    fn handle(&self, delivery: &Delivery) -> impl Future<Output = Result<(), HandlerError>> + Send;

    /// The message was given up and filed as a dead letter (`reason` says why); called before
    /// it is terminated, so a handler can record it as settled. A failure keeps the message
    /// (it is given up again on its next delivery).
    fn on_dead_lettered(
        &self,
        delivery: &Delivery,
        reason: &str,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send {
        let _ = (delivery, reason);
        async { Ok(()) }
    }
}

/// How many times a message may fail transiently (deliveries by the server plus attempts in
/// place) before it is given up as a dead letter.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 10;

/// Room, beyond the messages being worked on, for deliveries parked or queued behind their key:
/// they stay unacknowledged and count against the consumer's `max_ack_pending`, and must not
/// stop new work from arriving.
const PARKED_ALLOWANCE: i64 = 1024;

/// How often the server tells an idle push consumer's subscriber it is still there; two missed
/// and the subscriber opens its delivery again.
const PUSH_HEARTBEAT: Duration = Duration::from_secs(30);

/// A durable consumer and how to run it.
#[derive(Debug, Clone)]
pub struct ConsumerSpec {
    pub stream: &'static str,
    pub durable: String,
    pub filter_subjects: Vec<String>,
    /// `Some`: a push consumer, which the server delivers to this subject as soon as there is
    /// a subscriber (a site's gateway: see [`ConsumerSpec::gateway`]). `None`: a pull consumer,
    /// whose subscriber asks for messages.
    pub deliver_subject: Option<String>,
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
    /// How many transient failures (the server's deliveries plus attempts in place) a message
    /// may have before it is given up to `LANDFALL_DEAD`; a delivery that arrives with more
    /// deliveries than this (its process was lost each time) is given up before it is handled.
    /// A failure because the store is full never counts, and a wait has no bound. `None`: never
    /// give up (a site's gateway, which may not file dead letters).
    pub max_attempts: Option<u32>,
    /// The stream is in the JetStream domain of the server the bus is connected to (a site's
    /// leaf node), not the hub's. What the handlers publish still goes to the hub.
    pub local: bool,
    /// A site's gateway: where a job handed out by the hub's dispatcher goes when one comes on
    /// the delivery subject (the hub runs no durable per site); the loop then ends, and the
    /// gateway takes its jobs from the dispatcher ([`super::dispatched::take_jobs`]). `None`:
    /// such a message is a stranger, ignored.
    pub dispatched_instead: Option<tokio::sync::mpsc::UnboundedSender<async_nats::Message>>,
}

impl ConsumerSpec {
    pub fn new(stream: &'static str, durable: impl Into<String>, filters: Vec<String>, reject_as: RejectAs) -> Self {
        Self {
            stream,
            durable: durable.into(),
            filter_subjects: filters,
            deliver_subject: None,
            ack_wait: Duration::from_secs(10),
            concurrency: 64,
            reject_as,
            ordered_by_token: None,
            barrier_token: None,
            max_attempts: Some(DEFAULT_MAX_ATTEMPTS),
            local: false,
            dispatched_instead: None,
        }
    }

    /// Consume a stream of the connected server's own domain; see [`ConsumerSpec::local`].
    pub fn in_local_domain(mut self) -> Self {
        self.local = true;
        self
    }

    /// Where the stream is.
    fn jetstream(&self, bus: &Bus) -> jetstream::Context {
        if self.local { bus.local_jetstream() } else { bus.jetstream().clone() }
    }

    /// Give a message up after `n` transient failures; see [`ConsumerSpec::max_attempts`].
    pub fn max_attempts(mut self, n: Option<u32>) -> Self {
        self.max_attempts = n.map(|n| n.max(1));
        self
    }

    pub fn ack_wait(mut self, ack_wait: Duration) -> Self {
        self.ack_wait = ack_wait;
        self
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
    /// so a site's user needs no right to create a consumer of any kind. A site may not file
    /// dead letters (its key may be stolen): its jobs are retried until they are settled.
    ///
    /// It is a push consumer delivering to [`names::site_deliver`], which only the site's user
    /// may subscribe. A waiting pull request costs the hub at every new job of any site, and a
    /// pull request lost with a leaf node's link is renewed only after missed heartbeats; a push
    /// consumer costs nothing while idle and delivers as soon as the subscriber's interest
    /// crosses the link again (ARCHITECTURE.md, "Jobs at 10,000 sites").
    pub fn gateway(site: &str) -> Self {
        let durable = names::gateway_consumer(site);
        let mut spec = Self::new(
            names::site_jobs_stream(site),
            durable.clone(),
            vec![names::site_jobs(site)],
            RejectAs::Message { consumer: durable },
        )
        .concurrency(256)
        .max_attempts(None);
        spec.deliver_subject = Some(names::site_deliver(site));
        spec
    }

    /// Deliveries parked or queued behind their key are unacknowledged too: room for them on
    /// top of the work in hand, so a thousand waiting installs do not stop the rest.
    fn max_ack_pending(&self) -> i64 {
        (self.concurrency as i64 * 4).max(256) + PARKED_ALLOWANCE
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
            max_ack_pending: self.max_ack_pending(),
            ..Default::default()
        }
    }

    /// Flow control paces deliveries to what the subscriber takes in (a slow link); it needs
    /// the idle heartbeat, which also tells the subscriber its delivery is still live.
    ///
    /// The durable's state is kept in the server's memory: on disk, every job delivered and
    /// every job acknowledged rewrote a file of the durable's (a fifth of the hub's CPU in a
    /// rollout over 2,500 sites). Nothing is lost by it: the jobs stream is a work queue, so
    /// what a durable has not had acknowledged is still stored, and a durable made again
    /// delivers it (a gateway carries out a job delivered again without effect). A server
    /// started again has no such durable; the orchestrator makes them again
    /// (`consumers::orchestrator::durables`). A durable made on disk by an earlier version stays
    /// so until it is made anew.
    fn push_config(&self, deliver_subject: &str) -> consumer::push::Config {
        let (filter_subject, filter_subjects) = filters(&self.filter_subjects);
        consumer::push::Config {
            durable_name: Some(self.durable.clone()),
            deliver_subject: deliver_subject.to_owned(),
            filter_subject,
            filter_subjects,
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: self.ack_wait,
            max_deliver: -1,
            max_ack_pending: self.max_ack_pending(),
            flow_control: true,
            idle_heartbeat: PUSH_HEARTBEAT,
            memory_storage: true,
            ..Default::default()
        }
    }

    /// The start of the acknowledgement subject of every message this consumer delivers
    /// (`$JS.ACK.<stream>.<durable>.`).
    fn ack_prefix(&self) -> String {
        format!("$JS.ACK.{}.{}.", self.stream, self.durable)
    }
}

/// Makes the durable consumer `spec` names when it does not exist yet, and leaves one that does
/// alone.
///
/// # Errors
/// [`BusError::Consume`] when the stream or the JetStream API cannot be reached.
///
/// A push consumer that exists as a pull consumer, or pushes elsewhere (made by an earlier
/// version), is made anew: the server cannot turn one into the other. On the work-queue jobs
/// stream nothing is lost by it: the jobs the old one had not had acknowledged are still there,
/// and the new one delivers them (a gateway carries out a job delivered again without effect).
pub async fn ensure_consumer(bus: &Bus, spec: &ConsumerSpec) -> Result<(), BusError> {
    let consume_err = |e: BoxError| BusError::Consume { consumer: spec.durable.clone(), source: e };
    let js = spec.jetstream(bus);
    let Some(deliver) = &spec.deliver_subject else {
        let stream = js.get_stream(spec.stream).await.map_err(|e| consume_err(boxed(e)))?;
        stream.get_or_create_consumer(&spec.durable, spec.pull_config()).await.map_err(|e| consume_err(boxed(e)))?;
        return Ok(());
    };
    // One request: a site's registration makes its gateway's durable, and ten thousand
    // registrations asking three times each (the stream, the durable, then the creation) kept
    // the hub's JetStream API busy. Only a durable of that name made otherwise is looked at,
    // below, and made anew unless it delivers where the gateway listens.
    match js.create_consumer_strict_on_stream(spec.push_config(deliver), spec.stream).await {
        Ok(_) => return Ok(()),
        Err(e) if e.kind() == jetstream::stream::ConsumerCreateStrictErrorKind::AlreadyExists => {}
        Err(e) => return Err(consume_err(boxed(e))),
    }
    let stream = js.get_stream_no_info(spec.stream).await.map_err(|e| consume_err(boxed(e)))?;
    match stream.consumer_info(&spec.durable).await {
        Ok(info) if info.config.deliver_subject.as_deref() == Some(deliver.as_str()) => return Ok(()),
        Ok(info) => {
            info!(consumer = %spec.durable, was = ?info.config.deliver_subject, to = %deliver, "made anew as a push consumer");
            match stream.delete_consumer(&spec.durable).await {
                Ok(_) => {}
                Err(e) if consumer_missing(&e) => {}
                Err(e) => return Err(consume_err(boxed(e))),
            }
        }
        Err(e) if matches!(e.kind(), jetstream::context::ConsumerInfoErrorKind::NotFound) => {}
        Err(e) => return Err(consume_err(boxed(e))),
    }
    stream.create_consumer(spec.push_config(deliver)).await.map_err(|e| consume_err(boxed(e)))?;
    Ok(())
}

/// Whether a consumer request failed because there is no such consumer.
pub(super) fn consumer_missing(e: &jetstream::stream::ConsumerError) -> bool {
    matches!(e.kind(), jetstream::stream::ConsumerErrorKind::JetStream(j) if j.error_code() == ErrorCode::CONSUMER_NOT_FOUND)
}

/// Where a consume loop's messages come from.
enum Source {
    Pull(consumer::PullConsumer),
    /// With the acknowledgement prefix every delivery of the consumer carries.
    Push(consumer::PushConsumer, String),
}

/// What went wrong while reading a consumer's deliveries.
enum Hitch {
    /// The deliveries must be opened again (the consumer was deleted, or heartbeats stopped).
    Reopen(String),
    /// Logged, and reading goes on.
    Passing(String),
    /// A message on a push consumer's delivery subject that the consumer did not deliver.
    Stranger(Box<async_nats::Message>),
}

type Deliveries = BoxStream<'static, Result<jetstream::Message, Hitch>>;

impl Source {
    async fn messages(&self) -> Result<Deliveries, BoxError> {
        Ok(match self {
            Source::Pull(c) => c
                .messages()
                .await
                .map_err(boxed)?
                .map(|r| {
                    r.map_err(|e| match e.kind() {
                        consumer::pull::MessagesErrorKind::ConsumerDeleted => Hitch::Reopen(e.to_string()),
                        _ => Hitch::Passing(e.to_string()),
                    })
                })
                .boxed(),
            Source::Push(c, acks) => {
                let acks = acks.clone();
                c.messages()
                    .await
                    .map_err(boxed)?
                    .map(move |r| match r {
                        // Only the consumer's own deliveries carry its acknowledgement subject;
                        // anything else on the subject is no job of this consumer's.
                        Ok(m) if m.reply.as_deref().is_some_and(|r| r.starts_with(&acks)) => Ok(m),
                        Ok(m) => Err(Hitch::Stranger(Box::new(m.message))),
                        Err(e) => Err(match e.kind() {
                            consumer::push::MessagesErrorKind::MissingHeartbeat
                            | consumer::push::MessagesErrorKind::ConsumerDeleted => Hitch::Reopen(e.to_string()),
                            _ => Hitch::Passing(e.to_string()),
                        }),
                    })
                    .boxed()
            }
        })
    }
}

/// The consumer `spec` names, once it exists: a hub service makes its own (and brings its
/// filters up to date). A site's gateway takes the one the hub makes as the hub makes it
/// ([`ConsumerSpec::gateway`]), without asking for its info: it subscribes to its deliveries,
/// and until the hub has made it, the missing heartbeats open them again.
async fn open(
    js: &jetstream::Context,
    stream: &jetstream::stream::Stream<()>,
    spec: &ConsumerSpec,
    shutdown: &CancellationToken,
) -> Option<Source> {
    loop {
        let got = match &spec.deliver_subject {
            None => {
                stream.get_or_create_consumer(&spec.durable, spec.pull_config()).await.map(Source::Pull).map_err(boxed)
            }
            Some(deliver) => made_by_the_hub(js, spec, deliver).map(|c| Source::Push(c, spec.ack_prefix())),
        };
        match got {
            Ok(source) => return Some(source),
            Err(e) => {
                warn!(consumer = %spec.durable, error = %e, "cannot open the consumer; asking again");
                // 1 to 3 s: many gateways started together do not ask together.
                let pause = Duration::from_millis(1_000 + super::connect::jitter(2_000));
                tokio::select! {
                    _ = shutdown.cancelled() => return None,
                    _ = tokio::time::sleep(pause) => {}
                }
            }
        }
    }
}

/// A site's durable push consumer as the hub makes it, for reading its deliveries.
fn made_by_the_hub(
    js: &jetstream::Context,
    spec: &ConsumerSpec,
    deliver: &str,
) -> Result<consumer::Consumer<consumer::push::Config>, BoxError> {
    use consumer::IntoConsumerConfig;
    let config = spec.push_config(deliver);
    let none = serde_json::json!({ "consumer_seq": 0, "stream_seq": 0 });
    let info: consumer::Info = serde_json::from_value(serde_json::json!({
        "stream_name": spec.stream,
        "name": spec.durable,
        "created": "1970-01-01T00:00:00Z",
        "config": config.clone().into_consumer_config(),
        "delivered": none,
        "ack_floor": none,
        "num_ack_pending": 0,
        "num_redelivered": 0,
        "num_waiting": 0,
        "num_pending": 0,
    }))?;
    Ok(consumer::Consumer::new(config, info, js.clone()))
}

/// Runs a consume loop until `shutdown`; on shutdown, deliveries parked or waiting for their
/// turn are NAKed at once (another replica takes them) and those being handled finish.
///
/// Per message: `Ok` → ack (confirmed by the server); `Transient` → parked here and retried
/// with backoff, given up to `LANDFALL_DEAD` after [`ConsumerSpec::max_attempts`]; `Wait` →
/// parked for its delay, without bound; `Reject` → publish the rejection event, then terminate.
/// A rejection or dead letter that cannot be published is NAKed instead, so nothing is dropped
/// silently. Parked and queued deliveries are kept alive with progress acks and hold none of
/// the `concurrency` permits.
pub async fn consume<H: Handler>(
    bus: Bus,
    spec: ConsumerSpec,
    handler: Arc<H>,
    shutdown: CancellationToken,
) -> Result<(), BusError> {
    let consume_err = |e: BoxError| BusError::Consume { consumer: spec.durable.clone(), source: e };
    // Without the stream's info, which a site may not ask for.
    let js = spec.jetstream(&bus);
    let stream = js.get_stream_no_info(spec.stream).await.map_err(|e| consume_err(boxed(e)))?;
    // A site's gateway may not create its consumer, nor ask about it: the hub made it when the
    // site was registered. Until then (or while the hub is out of reach) it waits.
    let Some(mut source) = open(&js, &stream, &spec, &shutdown).await else { return Ok(()) };
    // A durable made by an earlier version with other filters takes this version's: a hub
    // service may change its own (a site may not, and keeps the filter the hub gave it).
    if let Source::Pull(consumer) = &mut source {
        let (filter_subject, filter_subjects) = filters(&spec.filter_subjects);
        let made = &consumer.cached_info().config;
        if (&made.filter_subject, &made.filter_subjects) != (&filter_subject, &filter_subjects) {
            match stream.update_consumer(spec.pull_config()).await {
                Ok(updated) => {
                    info!(consumer = %spec.durable, filters = ?spec.filter_subjects, "consumer's filters brought up to date");
                    *consumer = updated;
                }
                Err(e) => {
                    warn!(consumer = %spec.durable, error = %e, "consumer's filters differ from this version's and cannot be changed; consuming as they are")
                }
            }
        }
    }
    let context = Arc::new(Loop {
        bus,
        permits: Arc::new(tokio::sync::Semaphore::new(spec.concurrency)),
        order: Arc::new(KeyedOrder::default()),
        shutdown: shutdown.clone(),
        in_hand: Default::default(),
        spec,
    });
    let spec = &context.spec;
    let mut in_flight = JoinSet::new();
    info!(consumer = %spec.durable, filters = ?spec.filter_subjects, "consuming");
    // At 0 from the start, so an alert on their increase sees the first.
    for counter in [
        "landfall_messages_dead_lettered_total",
        "landfall_messages_rejected_total",
        "landfall_messages_retried_total",
        "landfall_redeliveries_total",
        "landfall_deliveries_in_hand_total",
    ] {
        metrics::counter!(counter, "consumer" => spec.durable.clone()).increment(0);
    }

    'outer: while !shutdown.is_cancelled() {
        let mut messages = match source.messages().await {
            Ok(m) => m,
            Err(e) => {
                warn!(consumer = %spec.durable, error = %e, "cannot read the consumer, retrying");
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                }
            }
        };
        loop {
            let next = tokio::select! {
                _ = shutdown.cancelled() => break 'outer,
                n = messages.next() => n,
            };
            match next {
                Some(Ok(msg)) => {
                    in_flight.spawn(settle(context.clone(), handler.clone(), msg));
                }
                Some(Err(Hitch::Passing(e))) => debug!(consumer = %spec.durable, error = %e, "delivery stream error"),
                Some(Err(Hitch::Stranger(m))) => match &spec.dispatched_instead {
                    // The hub hands this site's jobs out by its dispatcher: no durable will come.
                    Some(to) if super::dispatched::is_handed_out(&m) => {
                        info!(consumer = %spec.durable, "the hub's dispatcher hands this site its jobs: taking them from it");
                        let _ = to.send(*m);
                        break 'outer;
                    }
                    _ => {
                        warn!(consumer = %spec.durable, subject = %m.subject, "a message on the delivery subject that the consumer did not deliver: ignored")
                    }
                },
                Some(Err(Hitch::Reopen(e))) => {
                    debug!(consumer = %spec.durable, error = %e, "opening the deliveries again");
                    if matches!(source, Source::Push(..)) {
                        drop(messages);
                        match open(&js, &stream, spec, &shutdown).await {
                            Some(s) => source = s,
                            None => break 'outer,
                        }
                    }
                    break;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_filter_is_the_filter_subject_so_the_create_subject_carries_it() {
        let one = vec!["landfall.job.edge-01.40.>".to_string()];
        assert_eq!(filters(&one), ("landfall.job.edge-01.40.>".to_string(), Vec::new()));
        let two = vec!["a.>".to_string(), "b.>".to_string()];
        assert_eq!(filters(&two), (String::new(), two.clone()));
        assert_eq!(filters(&[]), (String::new(), Vec::new()));
    }
}
