//! Removing what a KV bucket no longer needs: a key purged (its history with it), with or
//! without compare-and-set, and the sweep of the markers deletions and purges leave behind.
//!
//! A deleted or purged key keeps one marker message in the bucket's stream, so watchers and
//! scans learn it is gone. Left alone, markers pile up and every scan of their prefix walks
//! them: [`Kv::sweep_markers`] removes markers older than a given age with a stream purge of
//! that one subject up to the marker's sequence, so a value written after the marker stays.
//! (nats-server 2.11 can expire markers itself, `SubjectDeleteMarkerTTL`; landfall supports
//! 2.10, so it sweeps.)

use std::time::Duration;

use async_nats::jetstream::{consumer, kv};
use futures::StreamExt;

use super::error::{BoxError, BusError, boxed};
use super::kv::{Cas, Kv};
use crate::names::headers;

impl Kv {
    /// Purges `key` and its history, leaving one marker; nothing to do when it is absent.
    pub async fn purge(&self, key: &str) -> Result<(), BusError> {
        self.store.purge(key).await.map_err(|e| self.err("purge", key, boxed(e)))
    }

    /// Purges `key` and its history only if the entry is still at `revision`.
    pub async fn purge_if(&self, key: &str, revision: u64) -> Result<Cas, BusError> {
        match self.store.purge_expect_revision(key, Some(revision)).await {
            Ok(()) => Ok(Cas::Written(revision)),
            Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => Ok(Cas::Conflict),
            Err(e) => Err(self.err("purge", key, boxed(e))),
        }
    }

    /// Removes the deletion and purge markers of keys matching `pattern` (a KV key pattern)
    /// written at least `older_than` before `now_unix_ms`; returns how many went. A key written
    /// again after its marker keeps its new value: each purge stops at the marker's sequence.
    ///
    /// # Errors
    /// When the bucket cannot be read or a purge is refused (the user needs
    /// `$JS.API.STREAM.PURGE.KV_<bucket>`).
    pub async fn sweep_markers(
        &self,
        pattern: &str,
        older_than: Duration,
        now_unix_ms: i64,
    ) -> Result<usize, BusError> {
        let err = |e: BoxError| self.err("sweep markers", pattern, e);
        let subject_prefix = self.store.prefix.as_str();
        let filter = format!("{subject_prefix}{pattern}");
        let Some(end) = self.last_raw(&filter).await.map_err(err)? else { return Ok(0) };
        let config = consumer::pull::OrderedConfig {
            filter_subject: filter.clone(),
            deliver_policy: consumer::DeliverPolicy::LastPerSubject,
            headers_only: true,
            ..Default::default()
        };
        let consumer = self.store.stream.create_consumer(config).await.map_err(|e| err(boxed(e)))?;
        let mut messages = consumer.messages().await.map_err(|e| err(boxed(e)))?;
        let cutoff_ms = now_unix_ms.saturating_sub(i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX));
        let mut due = Vec::new();
        let mut seen = 0;
        while seen < end {
            let Ok(Some(msg)) = tokio::time::timeout(SWEEP_STALL, messages.next()).await else { break };
            let msg = msg.map_err(|e| err(boxed(e)))?;
            let info = msg.info().map_err(err)?;
            seen = seen.max(info.stream_sequence);
            let marker = msg
                .headers
                .as_ref()
                .and_then(|h| h.get(headers::KV_OPERATION))
                .is_some_and(|op| op.as_str() == "DEL" || op.as_str() == "PURGE");
            let written_ms = i64::try_from(info.published.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX);
            if marker && written_ms <= cutoff_ms {
                due.push((msg.subject.to_string(), info.stream_sequence));
            }
        }
        drop(messages);
        for (subject, sequence) in &due {
            self.store
                .stream
                .purge()
                .filter(subject.as_str())
                .sequence(sequence + 1)
                .await
                .map_err(|e| err(boxed(e)))?;
        }
        Ok(due.len())
    }
}

/// How long a sweep waits for the next message before it stops where it is (the next sweep
/// goes on).
const SWEEP_STALL: Duration = Duration::from_secs(2);
