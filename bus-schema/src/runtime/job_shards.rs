//! Moving the jobs of an earlier version's one jobs stream ([`names::LEGACY_JOBS_STREAM`]) into
//! the shards ([`names::JOB_SHARDS`]), when the orchestrator starts.
//!
//! The shards' subjects overlap the old stream's, so the shards can only be made once it is
//! gone. What it holds (the jobs no gateway has acknowledged, and which sites' gateways had a
//! durable) is first copied into [`names::MOVING_JOBS_STREAM`], then the old stream is deleted,
//! the shards made, each job published again in its site's shard with its own `Nats-Msg-Id`, each
//! site's durable made in its shard, and only then the holding stream deleted. A move cut short at
//! any point goes on from what the streams hold at the next start: a copy repeated is dropped as a
//! duplicate by its id, and a job delivered twice is carried out once by its gateway. Two
//! orchestrator replicas starting together may both move: a stream the other deleted first counts
//! as moved.

use async_nats::HeaderMap;
use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::context::GetStreamErrorKind;
use async_nats::jetstream::stream::{self, RawMessageErrorKind};
use futures::StreamExt;
use tracing::{info, warn};

use super::connect::Bus;
use super::consume::{ConsumerSpec, ensure_consumer};
use super::error::{BoxError, BusError, boxed};
use super::topology::Topology;
use crate::names::{self, headers};
use crate::pb;

/// Where a site's durable is recorded while the jobs move: its site's id follows.
const DURABLE_PREFIX: &str = "landfall.moving.durable.";
/// Where a job is kept while it moves: its old subject follows.
const JOB_PREFIX: &str = "landfall.moving.job.";

impl Bus {
    /// Whether stream `name` exists.
    pub(super) async fn has_stream(&self, name: &str) -> bool {
        self.jetstream().get_stream(name).await.is_ok()
    }

    /// Copies what the old jobs stream holds into the holding stream and deletes the old stream;
    /// whether the holding stream has anything to put into the shards (also when an earlier
    /// start was cut short after the copy).
    pub(super) async fn take_legacy_jobs(&self, topology: &Topology) -> Result<bool, BusError> {
        let Ok(legacy) = self.jetstream().get_stream(names::LEGACY_JOBS_STREAM).await else {
            return Ok(self.has_stream(names::MOVING_JOBS_STREAM).await);
        };
        let (jobs, durables) = match self.copy_aside(&legacy, topology).await {
            Ok(copied) => copied,
            // Another replica copied it whole and deleted it meanwhile.
            Err(_) if !self.has_stream(names::LEGACY_JOBS_STREAM).await => return Ok(true),
            Err(e) => return Err(e),
        };
        match self.jetstream().delete_stream(names::LEGACY_JOBS_STREAM).await {
            Ok(_) => {}
            Err(e) if stream_gone(e.kind()) => {}
            Err(e) => {
                let name = names::LEGACY_JOBS_STREAM.into();
                return Err(BusError::Topology { what: "stream delete", name, source: boxed(e) });
            }
        }
        info!(
            jobs,
            durables, "the earlier version's jobs stream copied aside and deleted: its jobs go to their shards"
        );
        Ok(true)
    }

    /// Copies the names of `legacy`'s gateway durables and its jobs into the holding stream; how
    /// many jobs and durables.
    async fn copy_aside(&self, legacy: &stream::Stream, topology: &Topology) -> Result<(usize, usize), BusError> {
        let js = self.jetstream();
        let err =
            |what: &'static str, name: &str, e: BoxError| BusError::Topology { what, name: name.into(), source: e };
        let holding = stream::Config {
            name: names::MOVING_JOBS_STREAM.to_string(),
            subjects: vec![names::MOVING_JOBS_ALL.to_string()],
            storage: stream::StorageType::File,
            num_replicas: topology.replicas,
            max_message_size: names::MAX_PAYLOAD as i32,
            ..Default::default()
        };
        js.get_or_create_stream(holding).await.map_err(|e| err("stream", names::MOVING_JOBS_STREAM, boxed(e)))?;
        // Which sites' gateways had a durable: each is made again in its shard.
        let mut sites = Vec::new();
        let mut list = legacy.consumers();
        while let Some(info) = list.next().await {
            let info = info.map_err(|e| err("consumer list", names::LEGACY_JOBS_STREAM, boxed(e)))?;
            // Only a site's gateway's: named for the site and filtered on its jobs.
            if let Some(site) = info.name.strip_prefix("gateway-")
                && info.config.filter_subject == names::site_every_job(site)
            {
                sites.push(site.to_string());
            }
        }
        for site in &sites {
            let mut id = HeaderMap::new();
            id.insert(headers::MSG_ID, format!("durable-{site}").as_str());
            self.store(&format!("{DURABLE_PREFIX}{site}"), id, Default::default()).await?;
        }
        let mut jobs = 0;
        let mut sequence = 1;
        loop {
            let job = match legacy.get_first_raw_message_by_subject(names::JOBS_ALL, sequence).await {
                Ok(job) => job,
                Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => break,
                Err(e) => return Err(err("stream read", names::LEGACY_JOBS_STREAM, boxed(e))),
            };
            sequence = job.sequence + 1;
            let mut kept = job.headers.clone();
            if kept.get(headers::MSG_ID).is_none() {
                kept.insert(headers::MSG_ID, format!("legacy-job-{}", job.sequence).as_str());
            }
            self.store(&format!("{JOB_PREFIX}{}", job.subject), kept, job.payload).await?;
            jobs += 1;
        }
        Ok((jobs, sites.len()))
    }

    /// Puts every job of the holding stream into its site's shard, makes each recorded site's
    /// durable there, and deletes the holding stream.
    pub(super) async fn put_moved_jobs(&self) -> Result<(), BusError> {
        let js = self.jetstream();
        let err = |what: &'static str, e: BoxError| BusError::Topology {
            what,
            name: names::MOVING_JOBS_STREAM.into(),
            source: e,
        };
        let holding = js.get_stream_no_info(names::MOVING_JOBS_STREAM).await.map_err(|e| err("stream", boxed(e)))?;
        let (mut jobs, mut durables) = (0, 0);
        let mut sequence = 1;
        loop {
            let kept = match holding.get_first_raw_message_by_subject(names::MOVING_JOBS_ALL, sequence).await {
                Ok(kept) => kept,
                Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => break,
                // Another replica put every job and deleted it.
                Err(e) if read_stream_gone(e.kind()) => {
                    info!("the earlier version's jobs were put into their shards by another replica");
                    return Ok(());
                }
                Err(e) => return Err(err("stream read", boxed(e))),
            };
            sequence = kept.sequence + 1;
            if let Some(site) = kept.subject.strip_prefix(DURABLE_PREFIX) {
                // With the dispatcher, no site has a durable of its own.
                if self.job_delivery() == super::JobDelivery::Durable {
                    ensure_consumer(self, &ConsumerSpec::gateway(site)).await?;
                }
                durables += 1;
                continue;
            }
            let old = kept.subject.strip_prefix(JOB_PREFIX).unwrap_or_default();
            let Some(names::ParsedSubject::Job { site, kind }) = names::parse_subject(old) else {
                warn!(subject = %old, "not a job: filed as a dead letter, not put into a shard");
                self.file_left_out(old, kept.headers, kept.payload).await?;
                continue;
            };
            self.store(&names::job_subject(site, kind), kept.headers, kept.payload).await?;
            jobs += 1;
        }
        match js.delete_stream(names::MOVING_JOBS_STREAM).await {
            Ok(_) => {}
            // Another replica deleted it as it finished too.
            Err(e) if stream_gone(e.kind()) => {}
            Err(e) => return Err(err("stream delete", boxed(e))),
        }
        info!(jobs, durables, "the earlier version's jobs are in their shards");
        Ok(())
    }

    /// Files a message of the old stream whose subject is no job's as a dead letter of
    /// [`names::JOBS_MOVE`], where an operator sees it (`landfall dead-letters`) and may replay
    /// it, rather than losing it with the holding stream. Filed again by a move repeated, it is
    /// stored once (its id is its own message's).
    async fn file_left_out(&self, subject: &str, headers: HeaderMap, payload: bytes::Bytes) -> Result<(), BusError> {
        let header = |name: &str| headers.get(name).map(|v| v.as_str().to_string()).unwrap_or_default();
        let message_id = header(headers::MSG_ID);
        let mut letter = pb::DeadLetter {
            subject: subject.to_string(),
            headers: super::dead_letter::header_list(Some(&headers)),
            payload: payload.to_vec(),
            stream: names::LEGACY_JOBS_STREAM.to_string(),
            consumer: names::JOBS_MOVE.to_string(),
            message_id: message_id.clone(),
            message_type: header(headers::TYPE),
            error: "not a job's subject (landfall.job.<site>.<kind>): not put into a shard of the jobs".into(),
            dead_unix_ms: (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64,
            ..Default::default()
        };
        super::dead_letter::leave_out_a_payload_too_big(&mut letter);
        let mut out = HeaderMap::new();
        out.insert(headers::TYPE, <pb::DeadLetter as pb::BusMessage>::TYPE);
        out.insert(headers::MSG_ID, format!("moved-{message_id}").as_str());
        let body = prost::Message::encode_to_vec(&letter).into();
        self.store(&names::dead_letter_subject(names::JOBS_MOVE), out, body).await
    }

    /// Publishes into a stream and waits for the stream to have it.
    async fn store(&self, subject: &str, headers: HeaderMap, payload: bytes::Bytes) -> Result<(), BusError> {
        let err = |e: BoxError| BusError::Publish { subject: subject.to_string(), source: e };
        let ack = self
            .jetstream()
            .publish_with_headers(subject.to_string(), headers, payload)
            .await
            .map_err(|e| err(boxed(e)))?;
        ack.await.map_err(|e| err(boxed(e)))?;
        Ok(())
    }
}

/// Whether the stream asked for is not there (any more).
fn stream_gone(kind: GetStreamErrorKind) -> bool {
    matches!(kind, GetStreamErrorKind::JetStream(e) if e.error_code() == ErrorCode::STREAM_NOT_FOUND)
}

/// Whether the stream a message was asked of is not there (any more).
fn read_stream_gone(kind: RawMessageErrorKind) -> bool {
    matches!(kind, RawMessageErrorKind::JetStream(e) if e.error_code() == ErrorCode::STREAM_NOT_FOUND)
}
