//! A site's side of the dispatcher ([`super::dispatch`]): the jobs handed to it on its own
//! delivery subject, each carried out by its gateway's handler and answered once settled.
//!
//! - A job is carried out as a durable's delivery would be: retried after a transient failure
//!   (a site files no dead letters), parked for a handler's wait, its rejection published as
//!   its gateway's durable's, and only then answered `done`.
//! - A job asked about again while it is still being carried out (its dispatcher waited its
//!   time, or another replica took it over) is not started twice: the second asker is answered
//!   when the first run ends.
//! - A job whose subject names another site is answered `refused` and never carried out.
//! - A gateway follows the hub ([`take_jobs`]): set to take its jobs from a durable while the hub
//!   dispatches them, or the other way round, it takes them the hub's way from its first job on.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_nats::HeaderMap;
use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, warn};

use super::connect::Bus;
use super::consume::{ConsumerSpec, Handler, consume};
use super::delivery::{Delivery, HandlerError, RejectAs};
use super::dispatch::JobDelivery;
use super::error::{BusError, boxed, error_chain, retry_delay};
use crate::envelope::Envelope;
use crate::names::{self, headers};

/// Jobs a site carries out at once (a site's hosts all provision together).
pub const AT_ONCE: usize = 256;

/// How a job ended at the site: the answer's header and body.
#[derive(Debug, Clone)]
struct Answer {
    said: &'static str,
    why: String,
}

/// The jobs under way at the site, by id: a second asker waits for the first run's answer.
type UnderWay = Arc<Mutex<HashMap<String, watch::Receiver<Option<Answer>>>>>;

/// Takes `site`'s jobs the way the hub hands them out until `shutdown`, carrying each out with
/// `handler`: from the site's durable, or from the hub's dispatcher. It starts the way the bus
/// says ([`Bus::job_delivery`]), and follows the hub when that is wrong: a job handed out by the
/// dispatcher on the delivery subject ends the durable's loop and is carried out here; a
/// durable's delivery, heartbeat or flow control ends the dispatcher's loop (the delivery
/// refused at once, so that the durable hands it out again) and the durable is consumed.
/// The hub's services and the gateways need not agree, and nothing is lost when they do not.
///
/// # Errors
/// When the delivery subject cannot be subscribed to, or the durable's loop fails.
pub async fn take_jobs<H: Handler>(
    bus: Bus,
    site: &str,
    handler: Arc<H>,
    shutdown: CancellationToken,
) -> Result<(), BusError> {
    let (mut how, mut first) = (bus.job_delivery(), None);
    loop {
        how = match how {
            JobDelivery::Durable => {
                let (to, mut handed) = mpsc::unbounded_channel();
                let mut spec = ConsumerSpec::gateway(site);
                spec.dispatched_instead = Some(to);
                consume(bus.clone(), spec, handler.clone(), shutdown.clone()).await?;
                match handed.try_recv() {
                    Ok(m) if !shutdown.is_cancelled() => first = Some(m),
                    _ => return Ok(()),
                }
                warn!(%site, "the hub hands jobs out by its dispatcher, not this gateway's setting ({}): following it", JobDelivery::ENV);
                JobDelivery::Dispatch
            }
            JobDelivery::Dispatch => match serve(&bus, site, &handler, &shutdown, first.take(), true).await? {
                Served::Stopped => return Ok(()),
                Served::DurableInstead => {
                    warn!(%site, "the hub hands jobs out by a durable per site, not this gateway's setting ({}): following it", JobDelivery::ENV);
                    JobDelivery::Durable
                }
            },
        };
    }
}

/// Takes the jobs the dispatcher hands `site` until `shutdown`, carrying each out with
/// `handler`. A job under way when it stops is asked about again by the dispatcher later.
/// A durable's deliveries on the same subject are not answered (see [`take_jobs`]).
///
/// # Errors
/// When the site's delivery subject cannot be subscribed to.
pub async fn serve_jobs<H: Handler>(
    bus: Bus,
    site: String,
    handler: Arc<H>,
    shutdown: CancellationToken,
) -> Result<(), BusError> {
    serve(&bus, &site, &handler, &shutdown, None, false).await.map(|_| ())
}

/// Why [`serve`] ended.
enum Served {
    Stopped,
    /// A durable of the site's delivers to it: the hub runs no dispatcher for it.
    DurableInstead,
}

/// Whether `m`, on a site's delivery subject, is a job the hub's dispatcher handed out.
pub fn is_handed_out(m: &async_nats::Message) -> bool {
    m.reply.is_some() && !from_a_durable(m) && m.headers.as_ref().is_some_and(|h| h.get(headers::JOB_SUBJECT).is_some())
}

/// Whether `m`, on a site's delivery subject, came from a JetStream consumer: a delivery to be
/// acknowledged, a flow control or a heartbeat.
fn from_a_durable(m: &async_nats::Message) -> bool {
    m.status.is_some() || m.reply.as_deref().is_some_and(|r| r.starts_with("$JS."))
}

/// The dispatcher's jobs for `site`, `first` among them; with `follow`, a durable's message ends
/// it (see [`take_jobs`]).
async fn serve<H: Handler>(
    bus: &Bus,
    site: &str,
    handler: &Arc<H>,
    shutdown: &CancellationToken,
    mut first: Option<async_nats::Message>,
    follow: bool,
) -> Result<Served, BusError> {
    let subject = names::site_deliver(site);
    let mut jobs = bus
        .client()
        .subscribe(subject.clone())
        .await
        .map_err(|e| BusError::Consume { consumer: subject.clone(), source: boxed(e) })?;
    let under_way: UnderWay = Arc::default();
    let permits = Arc::new(Semaphore::new(AT_ONCE));
    info!(%site, "taking the jobs the dispatcher hands this site");
    loop {
        let m = match first.take() {
            Some(m) => m,
            None => tokio::select! {
                _ = shutdown.cancelled() => return Ok(Served::Stopped),
                m = jobs.next() => match m { Some(m) => m, None => return Ok(Served::Stopped) },
            },
        };
        if from_a_durable(&m) {
            if !follow {
                warn!(%site, "a durable's message on the jobs subject: not answered");
                continue;
            }
            // Handed out again at once, to the durable's loop that takes over.
            if let Some(ack) = m.reply.as_deref().filter(|r| r.starts_with("$JS.ACK.")) {
                let _ = bus.client().publish(ack.to_string(), Bytes::from_static(b"-NAK")).await;
            }
            return Ok(Served::DurableInstead);
        }
        // A job comes as a request: without a reply subject, it is nothing of the dispatcher's.
        let Some(reply) = m.reply.clone() else {
            warn!(%site, "a message without a reply on the jobs subject: ignored");
            continue;
        };
        let job = Job { bus: bus.clone(), site: site.to_string(), reply: reply.to_string() };
        tokio::spawn(job.take(
            m.headers.unwrap_or_default(),
            m.payload,
            handler.clone(),
            under_way.clone(),
            permits.clone(),
        ));
    }
}

struct Job {
    bus: Bus,
    site: String,
    reply: String,
}

impl Job {
    async fn take<H: Handler>(
        self,
        h: HeaderMap,
        payload: Bytes,
        handler: Arc<H>,
        under_way: UnderWay,
        permits: Arc<Semaphore>,
    ) {
        let d = match delivery(&self.site, &h, payload) {
            Ok(d) => d,
            Err(why) => return self.answer(&Answer { said: "refused", why }).await,
        };
        let id = d.envelope.id.clone();
        // Under way already: wait for that run. Else start one, which others may wait for.
        let (mut rx, run) = {
            let mut map = under_way.lock().unwrap_or_else(|e| e.into_inner());
            match map.get(&id) {
                Some(rx) => (rx.clone(), None),
                None => {
                    let (tx, rx) = watch::channel(None);
                    map.insert(id.clone(), rx.clone());
                    (rx, Some(tx))
                }
            }
        };
        if let Some(tx) = run {
            let (bus, site) = (self.bus.clone(), self.site.clone());
            tokio::spawn(async move {
                let answer = match permits.acquire_owned().await {
                    Ok(_permit) => carry_out(&bus, &site, &d, handler.as_ref()).await,
                    Err(_) => return,
                };
                under_way.lock().unwrap_or_else(|e| e.into_inner()).remove(&d.envelope.id);
                let _ = tx.send(Some(answer));
            });
        }
        let answer = loop {
            if let Some(answer) = rx.borrow_and_update().clone() {
                break answer;
            }
            if rx.changed().await.is_err() {
                return;
            }
        };
        self.answer(&answer).await;
    }

    async fn answer(&self, answer: &Answer) {
        let mut h = HeaderMap::new();
        h.insert(headers::JOB_ANSWER, answer.said);
        let sent = self.bus.client().publish_with_headers(self.reply.clone(), h, Bytes::from(answer.why.clone())).await;
        if let Err(e) = sent {
            warn!(site = %self.site, error = %e, "a job's answer could not be sent: the dispatcher will ask again");
        }
    }
}

/// The job as its handler sees it, from the dispatcher's headers: refused when it names another
/// site than this one.
fn delivery(site: &str, h: &HeaderMap, payload: Bytes) -> Result<Delivery, String> {
    let get = |name: &str| h.get(name).map(|v| v.as_str().to_string());
    let subject = get(headers::JOB_SUBJECT).ok_or("no job subject")?;
    match names::parse_subject(&subject) {
        Some(names::ParsedSubject::Job { site: of, .. }) if of == site => {}
        _ => return Err(format!("{subject} is not a job of site {site}")),
    }
    let seq: u64 = get(headers::JOB_SEQUENCE).and_then(|s| s.parse().ok()).unwrap_or_default();
    let fallback = || crate::ids::derived_id(names::site_jobs_stream(site), "seq", Some(&seq.to_string())).to_string();
    Ok(Delivery {
        type_name: get(headers::TYPE).unwrap_or_default(),
        envelope: Envelope::from_message(Some(h), &subject, fallback),
        subject,
        payload,
        delivered: get(headers::JOB_DELIVERED).and_then(|s| s.parse().ok()).unwrap_or(1),
        stream_sequence: seq,
    })
}

/// Runs `handler` until the job is settled: done, or refused with its rejection published. As a
/// durable's delivery is handled: in a span carrying the job's trace id, each attempt traced
/// and counted under the site's durable's name.
async fn carry_out<H: Handler>(bus: &Bus, site: &str, d: &Delivery, handler: &H) -> Answer {
    let consumer = names::gateway_consumer(site);
    let span = super::settle::handling_span(&consumer, d);
    attempts(bus, &consumer, d, handler).instrument(span).await
}

async fn attempts<H: Handler>(bus: &Bus, consumer: &str, d: &Delivery, handler: &H) -> Answer {
    let mut failures = d.delivered.max(1) - 1;
    let done = Answer { said: "done", why: String::new() };
    let counted = |what: &'static str| metrics::counter!(what, "consumer" => consumer.to_string()).increment(1);
    loop {
        let (outcome, traced) = super::trace::handled(consumer, d, None, Box::pin(handler.handle(d))).await;
        let delay = match outcome {
            Ok(()) => {
                counted("landfall_messages_handled_total");
                return done;
            }
            Err(HandlerError::Reject(rejection)) => {
                counted("landfall_messages_rejected_total");
                warn!(consumer, subject = %d.subject, reason = %rejection.reason, "rejected");
                let as_ = RejectAs::Message { consumer: consumer.to_string() };
                match super::trace::within(traced, bus.publish_rejection(d, &as_, &rejection)).await {
                    Ok(()) => return done,
                    Err(e) => {
                        warn!(consumer, error = %e, "cannot publish the rejection; will retry");
                        failures += 1;
                        retry_delay(failures)
                    }
                }
            }
            Err(HandlerError::Wait { delay, .. }) => delay,
            Err(e @ HandlerError::Transient { .. }) => {
                counted("landfall_messages_retried_total");
                failures += 1;
                let delay = retry_delay(failures);
                warn!(consumer, subject = %d.subject, error = %error_chain(&e), ?delay, "failed; retrying");
                delay
            }
        };
        tokio::time::sleep(delay).await;
    }
}
