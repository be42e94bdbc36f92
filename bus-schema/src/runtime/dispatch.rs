//! Jobs handed to sites by a dispatcher, with no durable per site (`JobDelivery::Dispatch`).
//!
//! A durable per site is the largest thing the hub holds for a site (ARCHITECTURE.md, "Jobs
//! without a durable per site"). Here each shard of the jobs has one durable, the
//! dispatcher's ([`names::DISPATCHER`]), shared by every orchestrator replica. The dispatcher
//! hands each job to its site as a request on the site's own delivery subject
//! ([`names::site_deliver`], which only hub services may publish on and only the site may
//! subscribe to), and the answer comes back among the site's own subjects
//! ([`names::site_replies`]), so no other site can answer for it.
//!
//! - **Acknowledged on the site's answer only.** The site answers once the job is settled
//!   there (carried out, or its rejection published; a site on its own leaf node once the job is
//!   in its inbox). Until then the job stays in the stream, unacknowledged, kept alive by the
//!   dispatcher; a dispatcher that dies leaves it to be delivered again.
//! - **Once.** A job asked about again while the site is still carrying it out (the dispatcher
//!   waited its time and asked again, or a replica took it over) waits for that same run
//!   ([`super::dispatched`]); one asked about after it is done is answered by its gateway,
//!   which marked it done, without being carried out again.
//! - **A site that does not listen** (cut off, its gateway stopped) is asked again with a
//!   growing delay, up to [`ABSENT_AT_MOST`]; a job of a site no longer registered is dropped.
//! - **The same order as a durable per site gave**: jobs are handed out in stream order, many
//!   at once; a site carries out up to [`super::dispatched::AT_ONCE`] together.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::HeaderMap;
use futures::StreamExt;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::connect::Bus;
use super::consume::{ConsumerSpec, Handler, consume};
use super::delivery::{Delivery, HandlerError, RejectAs};
use super::error::{BusError, boxed};
use super::kv::Kv;
use crate::names::{self, headers, keys};
use crate::pb;

/// How the hub's jobs reach sites.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum JobDelivery {
    /// A durable push consumer per site, made by the hub when the site is registered: about
    /// twice the hub's memory per site (ARCHITECTURE.md, "Jobs without a durable per site").
    Durable,
    /// One durable per shard, the dispatcher's, which hands each job to its site.
    #[default]
    Dispatch,
}

impl JobDelivery {
    /// The environment variable that chooses: `dispatch` (the default) or `durable`. It is the
    /// hub's services' setting; a site's gateway starts the way its own says and follows the
    /// hub when that is the other ([`super::dispatched::take_jobs`]).
    pub const ENV: &'static str = "LANDFALL_JOB_DELIVERY";

    /// What [`JobDelivery::ENV`] says.
    ///
    /// # Errors
    /// Another value than `durable` or `dispatch`.
    pub fn from_env() -> Result<Self, String> {
        match std::env::var(Self::ENV).ok().as_deref().map(str::trim) {
            None | Some("") | Some("dispatch") => Ok(Self::Dispatch),
            Some("durable") => Ok(Self::Durable),
            Some(other) => Err(format!("{}={other:?}: it is `dispatch` or `durable`", Self::ENV)),
        }
    }
}

/// How long the dispatcher waits for a site's answer before asking again (the site is still
/// carrying the job out: asked again, it answers when that run ends).
pub const ASK_FOR: Duration = Duration::from_secs(20);
/// The longest a job waits before its silent site is asked again.
pub const ABSENT_AT_MOST: Duration = Duration::from_secs(30);
/// Jobs handed out at once per shard.
const CONCURRENCY: usize = 1024;

/// The dispatcher's durable on one shard of the jobs.
pub fn spec(shard: usize) -> ConsumerSpec {
    ConsumerSpec::new(
        names::jobs_stream(shard),
        names::DISPATCHER,
        vec![names::shard_jobs(shard)],
        RejectAs::Message { consumer: names::DISPATCHER.into() },
    )
    .concurrency(CONCURRENCY)
    .max_attempts(None)
}

/// Runs the dispatcher on every shard until `shutdown`. A shard's sites' durables, which
/// would take the same jobs, are deleted first: the jobs they held unacknowledged are handed
/// out again by the dispatcher. Starting is tried again until it succeeds (the hub may not
/// answer yet): a dispatcher that gave up would leave every job unhanded.
///
/// # Errors
/// When a shard's consume loop fails.
pub async fn run_dispatcher(bus: Bus, sites: Kv, shutdown: CancellationToken) -> Result<(), BusError> {
    let hear = || Answers::start(&bus, shutdown.clone());
    let Some(answers) = until_done(&shutdown, "hearing the sites' answers", hear).await else { return Ok(()) };
    let dispatch = Arc::new(Dispatch { bus: bus.clone(), answers, sites, absent: Mutex::default() });
    let mut shards = tokio::task::JoinSet::new();
    for shard in 0..names::JOB_SHARDS {
        let drop_them = || drop_site_durables(&bus, shard);
        if until_done(&shutdown, "deleting the sites' own durables", drop_them).await.is_none() {
            return Ok(());
        }
        shards.spawn(consume(bus.clone(), spec(shard), dispatch.clone(), shutdown.clone()));
    }
    info!(shards = names::JOB_SHARDS, "dispatching jobs to sites");
    while let Some(done) = shards.join_next().await {
        done.map_err(|e| BusError::Consume { consumer: names::DISPATCHER.into(), source: boxed(e) })??;
    }
    Ok(())
}

/// Runs `step` until it succeeds, saying what failed and waiting a second between tries;
/// `None` once `shutdown`.
async fn until_done<T, F, Fut>(shutdown: &CancellationToken, doing: &str, mut step: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, BusError>>,
{
    loop {
        match step().await {
            Ok(done) => return Some(done),
            Err(e) => warn!(error = %super::error_chain(&e), "the dispatcher could not start {doing}; trying again"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// Deletes the sites' durables on `shard` (all but the dispatcher's).
async fn drop_site_durables(bus: &Bus, shard: usize) -> Result<(), BusError> {
    let name = names::jobs_stream(shard);
    let stream = bus
        .jetstream()
        .get_stream_no_info(name)
        .await
        .map_err(|e| BusError::Consume { consumer: names::DISPATCHER.into(), source: boxed(e) })?;
    let mut listed = stream.consumer_names();
    let mut sites = Vec::new();
    while let Some(durable) = listed.next().await {
        let durable =
            durable.map_err(|e| BusError::Consume { consumer: names::DISPATCHER.into(), source: boxed(e) })?;
        if durable != names::DISPATCHER {
            sites.push(durable);
        }
    }
    for durable in &sites {
        stream
            .delete_consumer(durable)
            .await
            .map_err(|e| BusError::Consume { consumer: durable.clone(), source: boxed(e) })?;
    }
    if !sites.is_empty() {
        info!(
            stream = name,
            durables = sites.len(),
            "the sites' own durables deleted: the dispatcher hands their jobs out"
        );
    }
    Ok(())
}

/// Hands each job to its site and settles it on the site's answer.
struct Dispatch {
    bus: Bus,
    answers: Answers,
    sites: Kv,
    /// Site → how many times in a row it did not listen.
    absent: Mutex<HashMap<String, u32>>,
}

impl Handler for Dispatch {
    async fn handle(&self, d: &Delivery) -> Result<(), HandlerError> {
        let Some(names::ParsedSubject::Job { site, .. }) = names::parse_subject(&d.subject) else {
            return Err(HandlerError::reject(pb::RejectCode::Malformed, format!("{} is not a job subject", d.subject)));
        };
        let mut h = d.envelope.headers(&d.type_name);
        h.insert(headers::JOB_SUBJECT, d.subject.as_str());
        h.insert(headers::JOB_SEQUENCE, d.stream_sequence.to_string().as_str());
        h.insert(headers::JOB_DELIVERED, d.delivered.to_string().as_str());
        match self.answers.ask(&self.bus, site, h, d.payload.clone()).await {
            Asked::Answered(answer) => {
                self.absent.lock().unwrap_or_else(|e| e.into_inner()).remove(site);
                let said =
                    answer.headers.as_ref().and_then(|h| h.get(headers::JOB_ANSWER)).map(|v| v.as_str().to_string());
                match said.as_deref() {
                    Some("done") => Ok(()),
                    Some("refused") => Err(HandlerError::reject(
                        pb::RejectCode::Forbidden,
                        format!("site {site} refused it: {}", String::from_utf8_lossy(&answer.payload)),
                    )),
                    other => Err(HandlerError::Transient {
                        context: format!("site {site} answered {other:?}, not `done`"),
                        source: None,
                    }),
                }
            }
            // Still at work on it: asking again waits for that same run.
            Asked::TimedOut => Err(HandlerError::Wait {
                reason: format!("site {site} is still carrying it out"),
                delay: Duration::ZERO,
            }),
            Asked::NotListening => {
                if !self.registered(site).await? {
                    info!(%site, subject = %d.subject, "a job of a site no longer registered: dropped");
                    return Ok(());
                }
                let times = {
                    let mut absent = self.absent.lock().unwrap_or_else(|e| e.into_inner());
                    let n = absent.entry(site.to_string()).or_default();
                    *n = n.saturating_add(1);
                    *n
                };
                let delay = Duration::from_millis(250u64.saturating_mul(1 << times.min(8))).min(ABSENT_AT_MOST);
                debug!(%site, ?delay, "site not listening: its job waits");
                Err(HandlerError::Wait { reason: format!("site {site} is not listening"), delay })
            }
            Asked::Failed(e) => Err(HandlerError::transient(format!("handing a job to site {site}"), e)),
        }
    }
}

impl Dispatch {
    async fn registered(&self, site: &str) -> Result<bool, HandlerError> {
        let design = self.sites.get::<pb::SiteDesign>(&keys::site(site)).await?;
        Ok(design.is_some())
    }
}

/// What came of asking a site.
enum Asked {
    Answered(async_nats::Message),
    TimedOut,
    NotListening,
    Failed(async_nats::Error),
}

/// The sites' answers to this process's jobs: one subscription to every site's replies to this
/// connection, each answer routed to its asker by the last token of its subject.
#[derive(Clone)]
struct Answers {
    waiting: Arc<Mutex<HashMap<String, Asker>>>,
}

/// Who waits for an answer: the site asked, and where its answer goes.
type Asker = (String, oneshot::Sender<async_nats::Message>);

impl Answers {
    async fn start(bus: &Bus, shutdown: CancellationToken) -> Result<Self, BusError> {
        let subject = names::replies_from_sites(bus.inbox_prefix());
        let mut replies = bus
            .client()
            .subscribe(subject.clone())
            .await
            .map_err(|e| BusError::Consume { consumer: subject.clone(), source: boxed(e) })?;
        let answers = Self { waiting: Arc::default() };
        let routed = answers.clone();
        tokio::spawn(async move {
            loop {
                let m = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    m = replies.next() => match m { Some(m) => m, None => return },
                };
                let mut tokens = m.subject.split('.');
                let from = tokens.nth(2).unwrap_or_default().to_string();
                let Some(unique) = m.subject.rsplit('.').next() else { continue };
                let asker = routed.waiting.lock().unwrap_or_else(|e| e.into_inner()).remove(unique);
                match asker {
                    // Only the site asked may answer (its subjects are its own).
                    Some((site, tx)) if site == from => _ = tx.send(m),
                    Some((site, tx)) => {
                        warn!(asked = %site, answered = %from, "a job's answer came from another site: ignored");
                        routed.waiting.lock().unwrap_or_else(|e| e.into_inner()).insert(unique.to_string(), (site, tx));
                    }
                    None => {}
                }
            }
        });
        Ok(answers)
    }

    async fn ask(&self, bus: &Bus, site: &str, h: HeaderMap, payload: bytes::Bytes) -> Asked {
        let fresh = bus.client().new_inbox();
        let unique = fresh.rsplit('.').next().unwrap_or(&fresh).to_string();
        let reply = format!("{}.{unique}", names::site_replies(site, bus.inbox_prefix()));
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().unwrap_or_else(|e| e.into_inner()).insert(unique.clone(), (site.to_string(), tx));
        let _forget = Forget { answers: self, unique: &unique };
        if let Err(e) = bus.client().publish_with_reply_and_headers(names::site_deliver(site), reply, h, payload).await
        {
            return Asked::Failed(e.into());
        }
        match tokio::time::timeout(ASK_FOR, rx).await {
            Ok(Ok(m)) if m.status == Some(async_nats::StatusCode::NO_RESPONDERS) => Asked::NotListening,
            Ok(Ok(m)) => Asked::Answered(m),
            Ok(Err(_)) | Err(_) => Asked::TimedOut,
        }
    }
}

/// Forgets a question when its asker is done with it, answered or not.
struct Forget<'a> {
    answers: &'a Answers,
    unique: &'a str,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.answers.waiting.lock().unwrap_or_else(|e| e.into_inner()).remove(self.unique);
    }
}
