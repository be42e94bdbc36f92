//! The site's own record of what its gateway reported. A gateway on its site's leaf node stores
//! each report (and each host it announces) first in [`names::OUTBOX_STREAM`], in the site's own
//! JetStream domain, and a forwarder carries them to the hub from there: in the order they were
//! stored, each once, whenever the link allows. A cut link, a gateway killed, a leaf node restarted:
//! what was stored is on the leaf node's disk, and goes when the link is back.
//!
//! Once, for good (not only within the hub's duplicate window): how far the outbox has reached
//! the hub is kept in the site's own bucket ([`names::SITE_STATE_BUCKET`]), written after the
//! hub acknowledged. What the hub stored after that mark and before the forwarder stopped is
//! found again on the next start by asking the hub for the last event of each kind the site
//! sent (a direct get by subject: only the site sends those kinds, and in order), so nothing is
//! sent twice.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer, kv, stream};
use bus_schema::names;
use bus_schema::runtime::{Bus, BusError, Envelope};
use bus_schema::trust::{self, Party};
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::FuturesOrdered;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// How many forwarded reports may wait for the hub's acknowledgement at once.
pub const FORWARD_WINDOW: usize = 256;
/// How long the outbox keeps a report (forwarded or not): a site's history, readable at the site.
pub const OUTBOX_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);
/// The most the outbox holds; past it a new report is refused (its job is tried again later)
/// rather than an unforwarded one dropped.
pub const OUTBOX_MAX_BYTES: i64 = 1024 * 1024 * 1024;
/// A report repeated while the outbox keeps the first (a job done again once a cut is over,
/// however long the cut) is stored once: its copy would otherwise reach the hub long after the
/// hub's own duplicate window.
pub const OUTBOX_DUPLICATE_WINDOW: Duration = OUTBOX_RETENTION;
const MARK_KEY: &str = "outbox.forwarded";
/// The mark is written after this many acknowledged reports, and whenever the outbox is idle.
const MARK_EVERY: u64 = 64;
/// The most reports the hub may hold past the mark when the forwarder stops: those
/// acknowledged since the last mark, and those awaiting their acknowledgement. The next start
/// asks the hub about that many.
const UNMARKED_AT_MOST: u64 = MARK_EVERY - 1 + FORWARD_WINDOW as u64;

/// Whether a message on `subject` goes through the outbox: the reports only a site sends, and
/// the commands a site may send (its hosts arriving and leaving).
pub fn kept_at_site(subject: &str) -> bool {
    match trust::rule_for_subject(subject) {
        Some(r) if subject.starts_with("landfall.evt.") => r.senders == [Party::Site],
        Some(r) if subject.starts_with("landfall.cmd.") => r.senders.contains(&Party::Site),
        _ => false,
    }
}

/// Whether the hub's last event on `subject` can only be the outbox's: a report no one but a
/// site sends. A command an operator may send too is not asked about: one sent again is
/// recognised by the hub's command ledger, however late.
fn only_the_site_sends(subject: &str) -> bool {
    subject.starts_with("landfall.evt.") && kept_at_site(subject)
}

pub struct Outbox {
    site: String,
    local: jetstream::Context,
    stream: stream::Stream,
    state: kv::Store,
    hub: Bus,
}

/// Makes `config`'s stream in the site's own domain, or brings one an earlier version made to
/// this version's keeping times (how long, how much, its duplicate window).
pub(crate) async fn ensure_local_stream(
    local: &jetstream::Context,
    config: stream::Config,
) -> Result<stream::Stream, async_nats::Error> {
    let mut stream = local.get_or_create_stream(config.clone()).await?;
    let made = stream.info().await?.config.clone();
    if (made.duplicate_window, made.max_age, made.max_bytes)
        != (config.duplicate_window, config.max_age, config.max_bytes)
    {
        let keeping = stream::Config {
            duplicate_window: config.duplicate_window,
            max_age: config.max_age,
            max_bytes: config.max_bytes,
            ..made
        };
        local.update_stream(keeping).await?;
    }
    Ok(stream)
}

fn local_err(what: &'static str) -> impl Fn(async_nats::Error) -> BusError {
    move |e| BusError::Topology { what, name: names::OUTBOX_STREAM.to_string(), source: e }
}

impl Outbox {
    /// Opens (or makes) the outbox in the domain of the server `hub` is connected to: the
    /// site's leaf node.
    pub async fn open(site: &str, hub: &Bus) -> Result<Self, BusError> {
        let local = hub.local_jetstream();
        let config = stream::Config {
            name: names::OUTBOX_STREAM.to_string(),
            subjects: vec![names::OUTBOX_ALL.to_string()],
            storage: stream::StorageType::File,
            retention: stream::RetentionPolicy::Limits,
            max_age: OUTBOX_RETENTION,
            max_bytes: OUTBOX_MAX_BYTES,
            discard: stream::DiscardPolicy::New,
            duplicate_window: OUTBOX_DUPLICATE_WINDOW,
            max_message_size: names::MAX_PAYLOAD as i32,
            allow_direct: true,
            ..Default::default()
        };
        let stream = ensure_local_stream(&local, config).await.map_err(local_err("stream"))?;
        let bucket = kv::Config {
            bucket: names::SITE_STATE_BUCKET.to_string(),
            history: 1,
            storage: stream::StorageType::File,
            ..Default::default()
        };
        let state = match local.get_key_value(names::SITE_STATE_BUCKET).await {
            Ok(store) => store,
            Err(_) => local.create_key_value(bucket).await.map_err(|e| local_err("kv bucket")(e.into()))?,
        };
        Ok(Self { site: site.to_string(), local, stream, state, hub: hub.clone() })
    }

    /// Stores a report bound for `subject` at the site; [`Outbox::forward`] takes it to the hub.
    pub async fn store(
        &self,
        subject: &str,
        type_name: &str,
        payload: Bytes,
        envelope: &Envelope,
    ) -> Result<(), BusError> {
        if payload.len() > names::MAX_PAYLOAD {
            return Err(BusError::TooLarge {
                subject: subject.to_string(),
                size: payload.len(),
                max: names::MAX_PAYLOAD,
            });
        }
        let publish_err = |e: async_nats::Error| BusError::Publish { subject: subject.to_string(), source: e };
        let start = std::time::SystemTime::now();
        let ack = self
            .local
            .publish_with_headers(names::outbox_subject(subject), envelope.headers(type_name), payload)
            .await
            .map_err(|e| publish_err(e.into()))?;
        let ack = ack.await.map_err(|e| publish_err(e.into()))?;
        // Its span is drawn where it was made, at the site, not when the hub got it.
        if !ack.duplicate {
            bus_schema::runtime::trace::published(subject, type_name, envelope, start);
        }
        Ok(())
    }

    /// How many stored reports the hub has not acknowledged yet, by the last mark.
    pub async fn waiting(&self) -> Result<u64, BusError> {
        let last = self.last_stored().await?;
        Ok(last.saturating_sub(self.mark().await?))
    }

    /// Sets the `landfall_site_outbox_waiting` gauge.
    async fn count_waiting(&self) {
        if let Ok(waiting) = self.waiting().await {
            metrics::gauge!("landfall_site_outbox_waiting", "site" => self.site.clone()).set(waiting as f64);
        }
    }

    async fn last_stored(&self) -> Result<u64, BusError> {
        let mut stream = self.stream.clone();
        let info = stream.info().await.map_err(|e| local_err("stream")(e.into()))?;
        Ok(info.state.last_sequence)
    }

    async fn mark(&self) -> Result<u64, BusError> {
        read_mark(&self.state).await
    }

    async fn set_mark(&self, seq: u64) -> Result<(), BusError> {
        let value = Bytes::copy_from_slice(&seq.to_be_bytes());
        self.state.put(MARK_KEY, value).await.map_err(|e| local_err("kv bucket")(e.into()))?;
        Ok(())
    }

    /// Forwards what the outbox holds to the hub until `shutdown`, starting again (after a
    /// pause that grows with each failure) whenever the hub cannot be reached.
    pub async fn forward(self: Arc<Self>, shutdown: CancellationToken) {
        let mut failures: i64 = 0;
        loop {
            let result = tokio::select! {
                r = self.forward_until_error(&mut failures) => r,
                _ = shutdown.cancelled() => return,
            };
            if let Err(e) = result {
                self.count_waiting().await;
                failures += 1;
                let pause = bus_schema::runtime::retry_delay(failures).min(Duration::from_secs(10));
                match failures {
                    1 => info!(site = %self.site, error = %e, "the hub cannot be reached: reports wait at the site"),
                    _ => debug!(site = %self.site, error = %e, ?pause, "forwarding reports: trying again"),
                }
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = shutdown.cancelled() => return,
                }
            }
        }
    }

    /// Finds how far the hub has the outbox, then forwards from there as reports are stored,
    /// until a publish fails. The hub answering clears `failures`.
    async fn forward_until_error(&self, failures: &mut i64) -> Result<(), BusError> {
        let mut forwarded = self.landed().await?;
        if *failures > 0 {
            info!(site = %self.site, "the hub is reached again: forwarding the reports kept at the site");
        }
        *failures = 0;
        let mut marked = forwarded;
        let reader = self
            .stream
            .create_consumer(consumer::push::OrderedConfig {
                deliver_subject: self.local.client().new_inbox(),
                deliver_policy: consumer::DeliverPolicy::ByStartSequence { start_sequence: forwarded + 1 },
                ..Default::default()
            })
            .await
            .map_err(|e| local_err("consumer")(e.into()))?;
        let mut reports = reader.messages().await.map_err(|e| local_err("consumer")(e.into()))?;
        let mut acks = FuturesOrdered::new();
        loop {
            tokio::select! {
                // The oldest acknowledgement first: the mark only moves over what the hub has.
                Some(acked) = acks.next(), if !acks.is_empty() => {
                    forwarded = acked?;
                    if forwarded - marked >= MARK_EVERY || acks.is_empty() {
                        self.set_mark(forwarded).await?;
                        marked = forwarded;
                        self.count_waiting().await;
                    }
                }
                report = reports.next(), if acks.len() < FORWARD_WINDOW => {
                    let Some(report) = report else {
                        return Err(local_err("consumer")("the outbox reader ended".into()));
                    };
                    let report = report.map_err(|e| local_err("consumer")(e.into()))?;
                    let seq = report.info().map_err(|e| local_err("consumer")(e))?.stream_sequence;
                    let Some(subject) = names::outbox_destination(&report.subject) else {
                        warn!(site = %self.site, subject = %report.subject, "not a report bound for the hub: skipped");
                        continue;
                    };
                    let headers = report.headers.clone().unwrap_or_default();
                    let ack = self
                        .hub
                        .jetstream()
                        .publish_with_headers(subject.clone(), headers, report.payload.clone())
                        .await
                        .map_err(|e| BusError::Publish { subject: subject.clone(), source: e.into() })?;
                    acks.push_back(async move {
                        ack.await.map_err(|e| BusError::Publish { subject, source: e.into() })?;
                        Ok::<_, BusError>(seq)
                    });
                }
            }
        }
    }

    /// How far the hub has the outbox: the mark, or past it as far as the hub stored reports
    /// the mark does not count (acknowledged, or in flight, when the forwarder stopped). Only
    /// the site sends the kinds in the outbox, and the hub stores them in the order they were
    /// sent, so the last candidate whose kind's last event at the hub is itself is the last
    /// one the hub has. The mark is written before returning.
    async fn landed(&self) -> Result<u64, BusError> {
        let mark = self.mark().await?;
        let last = self.last_stored().await?;
        let candidates = (mark + 1)..=last.min(mark + UNMARKED_AT_MOST);
        if candidates.is_empty() {
            return Ok(mark);
        }
        let events = self
            .hub
            .jetstream()
            .get_stream_no_info(names::EVENTS_STREAM)
            .await
            .map_err(|e| BusError::Topology { what: "stream", name: names::EVENTS_STREAM.into(), source: e.into() })?;
        let checks = candidates.clone().rev().map(|seq| {
            let (stream, events) = (&self.stream, &events);
            async move {
                let kept = match stream.direct_get(seq).await {
                    Ok(m) => m,
                    Err(e) if e.kind() == stream::DirectGetErrorKind::NotFound => return Ok(None),
                    Err(e) => return Err(local_err("stream")(e.into())),
                };
                let Some(subject) = names::outbox_destination(&kept.subject).filter(|s| only_the_site_sends(s)) else {
                    return Ok(None);
                };
                let id = kept.headers.get(names::headers::MSG_ID).map(|v| v.to_string());
                match events.direct_get_last_for_subject(subject).await {
                    Ok(at_hub) => {
                        let hub_id = at_hub.headers.get(names::headers::MSG_ID).map(|v| v.to_string());
                        Ok((id.is_some() && hub_id == id).then_some(seq))
                    }
                    Err(e) if e.kind() == stream::DirectGetErrorKind::NotFound => Ok(None),
                    Err(e) => {
                        Err(BusError::Topology { what: "stream", name: names::EVENTS_STREAM.into(), source: e.into() })
                    }
                }
            }
        });
        let found = futures::future::try_join_all(checks).await?;
        let landed = found.into_iter().flatten().max().unwrap_or(mark);
        if landed > mark {
            info!(site = %self.site, mark, landed, "the hub had reports past the mark: not sent again");
            self.set_mark(landed).await?;
        }
        Ok(landed)
    }
}

/// What a site's outbox holds, read at its leaf node (`landfall status SITE --local`): what the
/// site itself knows while the hub is out of reach.
pub struct Kept {
    /// The reports stored so far (the outbox's last sequence).
    pub stored: u64,
    /// How far the hub has them, by the mark: the later ones wait at the site.
    pub forwarded: u64,
    /// The latest reports, oldest first, each with its place in the outbox.
    pub latest: Vec<jetstream::message::StreamMessage>,
}

/// Reads the outbox of the site whose leaf node `bus` is connected to: its counts and its
/// latest `n` reports. `None` when that server keeps no outbox.
pub async fn read_kept(bus: &Bus, n: u64) -> Result<Option<Kept>, BusError> {
    let local = bus.local_jetstream();
    let Ok(mut stream) = local.get_stream(names::OUTBOX_STREAM).await else { return Ok(None) };
    let state = stream.info().await.map_err(|e| local_err("stream")(e.into()))?.state.clone();
    let forwarded = match local.get_key_value(names::SITE_STATE_BUCKET).await {
        Ok(kv) => read_mark(&kv).await?,
        Err(_) => 0,
    };
    let from = state.first_sequence.max(state.last_sequence.saturating_sub(n.saturating_sub(1))).max(1);
    let reads = (from..=state.last_sequence).map(|seq| {
        let stream = &stream;
        async move {
            match stream.direct_get(seq).await {
                Ok(m) => Ok(Some(m)),
                Err(e) if e.kind() == stream::DirectGetErrorKind::NotFound => Ok(None),
                Err(e) => Err(local_err("stream")(e.into())),
            }
        }
    });
    let latest: Vec<_> = futures::stream::iter(reads).buffered(64).collect::<Vec<_>>().await;
    let latest = latest.into_iter().collect::<Result<Vec<_>, _>>()?.into_iter().flatten().collect();
    Ok(Some(Kept { stored: state.last_sequence, forwarded, latest }))
}

/// How far the hub has the outbox, as the site's bucket marks it (0 before the first mark).
async fn read_mark(state: &kv::Store) -> Result<u64, BusError> {
    let entry = state.get(MARK_KEY).await.map_err(|e| local_err("kv bucket")(e.into()))?;
    Ok(entry.and_then(|v| <[u8; 8]>::try_from(v.as_ref()).ok()).map_or(0, u64::from_be_bytes))
}
