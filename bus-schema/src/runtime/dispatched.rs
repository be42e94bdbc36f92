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

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_nats::HeaderMap;
use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::connect::Bus;
use super::consume::Handler;
use super::delivery::{Delivery, HandlerError, RejectAs};
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

/// Takes the jobs the dispatcher hands `site` until `shutdown`, carrying each out with
/// `handler`. A job under way when it stops is asked about again by the dispatcher later.
///
/// # Errors
/// When the site's delivery subject cannot be subscribed to.
pub async fn serve_jobs<H: Handler>(
    bus: Bus,
    site: String,
    handler: Arc<H>,
    shutdown: CancellationToken,
) -> Result<(), BusError> {
    let subject = names::site_deliver(&site);
    let mut jobs = bus
        .client()
        .subscribe(subject.clone())
        .await
        .map_err(|e| BusError::Consume { consumer: subject.clone(), source: boxed(e) })?;
    let under_way: UnderWay = Arc::default();
    let permits = Arc::new(Semaphore::new(AT_ONCE));
    info!(%site, "taking the jobs the dispatcher hands this site");
    loop {
        let m = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            m = jobs.next() => match m { Some(m) => m, None => return Ok(()) },
        };
        // A job comes as a request: without a reply subject, it is nothing of the dispatcher's.
        let Some(reply) = m.reply.clone() else {
            warn!(%site, "a message without a reply on the jobs subject: ignored");
            continue;
        };
        let job = Job { bus: bus.clone(), site: site.clone(), reply: reply.to_string() };
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

/// Runs `handler` until the job is settled: done, or refused with its rejection published.
async fn carry_out<H: Handler>(bus: &Bus, site: &str, d: &Delivery, handler: &H) -> Answer {
    let mut failures = d.delivered.max(1) - 1;
    let done = Answer { said: "done", why: String::new() };
    loop {
        let delay = match handler.handle(d).await {
            Ok(()) => return done,
            Err(HandlerError::Reject(rejection)) => {
                warn!(%site, subject = %d.subject, reason = %rejection.reason, "rejected");
                let as_ = RejectAs::Message { consumer: names::gateway_consumer(site) };
                match bus.publish_rejection(d, &as_, &rejection).await {
                    Ok(()) => return done,
                    Err(e) => {
                        warn!(%site, error = %e, "cannot publish the rejection; will retry");
                        failures += 1;
                        retry_delay(failures)
                    }
                }
            }
            Err(HandlerError::Wait { delay, .. }) => delay,
            Err(e @ HandlerError::Transient { .. }) => {
                failures += 1;
                let delay = retry_delay(failures);
                warn!(%site, subject = %d.subject, error = %error_chain(&e), ?delay, "failed; retrying");
                delay
            }
        };
        tokio::time::sleep(delay).await;
    }
}
