//! A KV bucket of protobuf values ([`Kv`]): read, compare-and-set writes, scans over many
//! keys in one pass, and watches.

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{consumer, kv};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use tracing::warn;

use super::connect::Bus;
use super::error::{BoxError, BusError, boxed};
use crate::names::headers;

impl Bus {
    /// A KV bucket (which [`Bus::ensure_topology`] created).
    pub async fn kv(&self, bucket: &str) -> Result<Kv, BusError> {
        let store = self.jetstream().get_key_value(bucket).await.map_err(|e| BusError::Topology {
            what: "kv bucket",
            name: bucket.to_string(),
            source: boxed(e),
        })?;
        Ok(Kv { store, bucket: bucket.to_string() })
    }
}

/// A KV bucket holding protobuf values, written with compare-and-set.
#[derive(Clone)]
pub struct Kv {
    pub(super) store: kv::Store,
    pub(super) bucket: String,
}

/// One key's new value as a watch sees it ([`Kv::watch_latest`]).
#[derive(Debug, Clone)]
pub struct KvChange {
    pub key: String,
    /// The encoded value; `None` when the key was deleted or purged.
    pub value: Option<Bytes>,
    pub revision: u64,
    pub caught_up: bool,
}

/// The result of a compare-and-set write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cas {
    /// Written; the entry's new revision.
    Written(u64),
    /// Someone else wrote first (or the key already exists, for a create).
    Conflict,
}

impl Kv {
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    pub(super) fn err(&self, op: &'static str, key: &str, source: BoxError) -> BusError {
        BusError::Kv { op, bucket: self.bucket.clone(), key: key.to_string(), source }
    }

    /// The value and its revision; `None` when absent or deleted.
    pub async fn get<M: prost::Message + Default>(&self, key: &str) -> Result<Option<(M, u64)>, BusError> {
        let entry = self.store.entry(key).await.map_err(|e| self.err("get", key, boxed(e)))?;
        match entry {
            Some(e) if e.operation == kv::Operation::Put => {
                let value = M::decode(e.value).map_err(|source| BusError::KvDecode {
                    what: std::any::type_name::<M>(),
                    bucket: self.bucket.clone(),
                    key: key.to_string(),
                    source,
                })?;
                Ok(Some((value, e.revision)))
            }
            _ => Ok(None),
        }
    }

    /// Writes only if the key does not exist (or was deleted).
    pub async fn create<M: prost::Message>(&self, key: &str, value: &M) -> Result<Cas, BusError> {
        match self.store.create(key, Bytes::from(value.encode_to_vec())).await {
            Ok(rev) => Ok(Cas::Written(rev)),
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => Ok(Cas::Conflict),
            Err(e) => Err(self.err("create", key, boxed(e))),
        }
    }

    /// Writes only if the entry is still at `revision`.
    pub async fn update<M: prost::Message>(&self, key: &str, value: &M, revision: u64) -> Result<Cas, BusError> {
        match self.store.update(key, Bytes::from(value.encode_to_vec()), revision).await {
            Ok(rev) => Ok(Cas::Written(rev)),
            Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => Ok(Cas::Conflict),
            Err(e) => Err(self.err("update", key, boxed(e))),
        }
    }

    /// Writes unconditionally.
    pub async fn put<M: prost::Message>(&self, key: &str, value: &M) -> Result<u64, BusError> {
        self.store.put(key, Bytes::from(value.encode_to_vec())).await.map_err(|e| self.err("put", key, boxed(e)))
    }

    /// Deletes only if the entry is still at `revision`.
    pub async fn delete_if(&self, key: &str, revision: u64) -> Result<Cas, BusError> {
        match self.store.delete_expect_revision(key, Some(revision)).await {
            Ok(()) => Ok(Cas::Written(revision)),
            Err(e) if e.kind() == kv::DeleteErrorKind::WrongLastRevision => Ok(Cas::Conflict),
            Err(e) => Err(self.err("delete", key, boxed(e))),
        }
    }

    /// Every live entry whose key starts with `prefix` (which ends with `.` or is empty), with
    /// its revision, in one pass over the bucket's stream: an ordered consumer delivering the
    /// last message per key. Thousands of entries cost one round trip per batch, not one per key.
    /// Entries that do not decode as `M` are skipped with a warning.
    pub async fn scan<M: prost::Message + Default>(&self, prefix: &str) -> Result<Vec<(String, M, u64)>, BusError> {
        self.scan_matching(&format!("{prefix}>")).await
    }

    /// Like [`Kv::scan`], for a prefix that matches a few keys of a bucket that may hold many
    /// (one site's, one node's): the keys are listed from the stream's subject index and each is
    /// read by itself, so the scan costs the keys it finds. A consumer filtered on a wildcard,
    /// as [`Kv::scan`] makes, has nats-server 2.10 decode every message of the blocks between
    /// the keys it delivers: scanning one site's ten keys cost in proportion to the whole fleet's.
    ///
    /// The same promise as [`Kv::scan`]: every key that exists when the scan ends comes back
    /// once, with a value it had during the scan (the keys are listed again until a listing
    /// brings none unread).
    pub async fn scan_few<M: prost::Message + Default>(&self, prefix: &str) -> Result<Vec<(String, M, u64)>, BusError> {
        let pattern = format!("{prefix}>");
        let err = |e: BoxError| self.err("scan", &pattern, e);
        let subject_prefix = self.store.prefix.as_str(); // "$KV.<bucket>."
        let filter = format!("{subject_prefix}{pattern}");
        let mut latest = ScanEntries::<M>::default();
        let mut read = std::collections::BTreeSet::new();
        loop {
            let listed = self.store.stream.info_with_subjects(&filter).await.map_err(|e| err(boxed(e)))?;
            let unread: Vec<String> = listed
                .map_ok(|(subject, _)| subject)
                .try_filter(|subject| futures::future::ready(!read.contains(subject)))
                .try_collect()
                .await
                .map_err(|e| err(boxed(e)))?;
            if unread.is_empty() {
                break;
            }
            let mut got = futures::stream::iter(unread.clone().into_iter().map(|subject| {
                let stream = self.store.stream.clone();
                async move {
                    match stream.get_last_raw_message_by_subject(&subject).await {
                        Ok(msg) => Ok(Some(msg)),
                        Err(e)
                            if e.kind() == async_nats::jetstream::stream::LastRawMessageErrorKind::NoMessageFound =>
                        {
                            Ok(None)
                        }
                        Err(e) => Err(boxed(e)),
                    }
                }
            }))
            .buffer_unordered(16);
            while let Some(msg) = got.next().await {
                if let Some(msg) = msg.map_err(err)? {
                    latest.add_raw(self, &msg, &|_: &str, value: M| Some(value));
                }
            }
            read.extend(unread);
        }
        Ok(latest
            .0
            .into_iter()
            .filter_map(|(key, entry)| entry.and_then(|(kept, revision)| kept.map(|kept| (key, kept, revision))))
            .collect())
    }

    /// Like [`Kv::scan`], for every key matching a NATS wildcard pattern (`node.*.*.kubelet`).
    ///
    /// Every key that exists when the scan ends comes back once, with a value it had during the
    /// scan. A bucket keeps one message per key, so a key rewritten while the scan runs loses its
    /// old message, perhaps before the consumer reaches it, and its new one lies past wherever
    /// the consumer is; the consumer's pending count does not say so reliably. So the scan reads
    /// at least up to the last matching message as of its start, and if matching messages were
    /// written meanwhile it lists the bucket's keys and fetches any it has not seen.
    pub async fn scan_matching<M: prost::Message + Default>(
        &self,
        pattern: &str,
    ) -> Result<Vec<(String, M, u64)>, BusError> {
        self.scan_matching_map(pattern, |_, value: M| Some(value)).await
    }

    /// Like [`Kv::scan_matching`], keeping of each entry only what `keep` makes of its key and
    /// value (nothing, for `None`), as the entry is read: a scan of thousands of large records
    /// holds what is kept of them, never all of them at once.
    pub async fn scan_matching_map<M: prost::Message + Default, T>(
        &self,
        pattern: &str,
        keep: impl Fn(&str, M) -> Option<T>,
    ) -> Result<Vec<(String, T, u64)>, BusError> {
        let err = |e: BoxError| self.err("scan", pattern, e);
        let subject_prefix = self.store.prefix.as_str(); // "$KV.<bucket>."
        let filter = format!("{subject_prefix}{pattern}");
        let Some(end) = self.last_raw(&filter).await.map_err(err)? else { return Ok(Vec::new()) };
        let config = consumer::pull::OrderedConfig {
            filter_subject: filter.clone(),
            deliver_policy: consumer::DeliverPolicy::LastPerSubject,
            ..Default::default()
        };
        let consumer = self.store.stream.create_consumer(config).await.map_err(|e| err(boxed(e)))?;
        let mut messages = consumer.messages().await.map_err(|e| err(boxed(e)))?;
        let mut latest = ScanEntries::<T>::default();
        let mut seen = 0;
        let mut stalled = false;
        while seen < end {
            // The message at `end`, or the one that replaced it, is always there to come; one
            // that aged out of the bucket never does, and the listing below covers for it.
            let Ok(next) = tokio::time::timeout(SCAN_STALL, messages.next()).await else {
                stalled = true;
                break;
            };
            let Some(msg) = next else {
                stalled = true;
                break;
            };
            let msg = msg.map_err(|e| err(boxed(e)))?;
            let info = msg.info().map_err(err)?;
            seen = seen.max(info.stream_sequence);
            latest.add(self, &msg.subject, msg.headers.as_ref(), &msg.payload, info.stream_sequence, &keep);
        }
        drop(messages);
        let written_since = self.last_raw(&filter).await.map_err(err)?.is_some_and(|last| last > seen);
        if stalled || written_since {
            let keys = self.store.stream.info_with_subjects(&filter).await.map_err(|e| err(boxed(e)))?;
            let keys: Vec<String> =
                keys.map_ok(|(subject, _)| subject).try_collect().await.map_err(|e| err(boxed(e)))?;
            for subject in keys {
                let Some(key) = subject.strip_prefix(subject_prefix) else { continue };
                if latest.0.contains_key(key) {
                    continue;
                }
                match self.store.stream.get_last_raw_message_by_subject(&subject).await {
                    Ok(msg) => latest.add_raw(self, &msg, &keep),
                    Err(e) if e.kind() == async_nats::jetstream::stream::LastRawMessageErrorKind::NoMessageFound => {}
                    Err(e) => return Err(err(boxed(e))),
                }
            }
        }
        Ok(latest
            .0
            .into_iter()
            .filter_map(|(key, entry)| entry.and_then(|(kept, revision)| kept.map(|kept| (key, kept, revision))))
            .collect())
    }

    /// The stream sequence of the last message on `subject` (a wildcard filter), if any.
    pub(super) async fn last_raw(&self, subject: &str) -> Result<Option<u64>, BoxError> {
        match self.store.stream.get_last_raw_message_by_subject(subject).await {
            Ok(last) => Ok(Some(last.sequence)),
            Err(e) if e.kind() == async_nats::jetstream::stream::LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(boxed(e)),
        }
    }

    /// The latest value of every key matching one of `patterns` (KV key patterns, `*` and `>`
    /// as in subjects), then every change as it happens. `caught_up` is set on the change that
    /// brings the reader up to date with the bucket, and on every change after it.
    ///
    /// # Errors
    /// When the watch cannot be created; a broken watch ends its stream (watch again).
    pub async fn watch_latest(
        &self,
        patterns: Vec<String>,
    ) -> Result<impl futures::Stream<Item = Result<KvChange, BusError>> + use<>, BusError> {
        let label = patterns.join(",");
        let watch =
            self.store.watch_many_with_history(patterns).await.map_err(|e| self.err("watch", &label, boxed(e)))?;
        let bucket = self.bucket.clone();
        Ok(watch.map(move |entry| {
            let entry = entry.map_err(|e| BusError::Kv {
                op: "watch",
                bucket: bucket.clone(),
                key: label.clone(),
                source: boxed(e),
            })?;
            Ok(KvChange {
                value: (entry.operation == kv::Operation::Put).then_some(entry.value),
                key: entry.key,
                revision: entry.revision,
                caught_up: entry.seen_current || entry.delta == 0,
            })
        }))
    }

    /// The bucket's last revision (its stream's last sequence): every change at or below it was
    /// made before this call.
    pub async fn last_revision(&self) -> Result<u64, BusError> {
        let mut stream = self.store.stream.clone();
        let info = stream.info().await.map_err(|e| self.err("info", "", boxed(e)))?;
        Ok(info.state.last_sequence)
    }

    /// Every live key starting with `prefix`.
    pub async fn keys_with_prefix(&self, prefix: &str) -> Result<Vec<String>, BusError> {
        let mut keys = self.store.keys().await.map_err(|e| self.err("keys", prefix, boxed(e)))?;
        let mut out = Vec::new();
        while let Some(k) = keys.next().await {
            let k = k.map_err(|e| self.err("keys", prefix, boxed(e)))?;
            if k.starts_with(prefix) {
                out.push(k);
            }
        }
        out.sort();
        Ok(out)
    }
}

/// How long a scan waits for the next message before it lists the keys instead.
const SCAN_STALL: Duration = Duration::from_secs(2);

/// What a scan found of each key: `None` deleted, else what was kept of its value (nothing, if
/// nothing was) and its revision.
struct ScanEntries<T>(std::collections::BTreeMap<String, Option<(Option<T>, u64)>>);

impl<T> Default for ScanEntries<T> {
    fn default() -> Self {
        Self(Default::default())
    }
}

impl<T> ScanEntries<T> {
    /// Takes one message of `kv`'s stream, if it is newer than what the key has, keeping what
    /// `keep` makes of its value.
    fn add<M: prost::Message + Default>(
        &mut self,
        kv: &Kv,
        subject: &str,
        headers: Option<&HeaderMap>,
        payload: &Bytes,
        revision: u64,
        keep: &impl Fn(&str, M) -> Option<T>,
    ) {
        let Some(key) = subject.strip_prefix(kv.store.prefix.as_str()) else { return };
        if self.0.get(key).is_some_and(|e| e.as_ref().is_some_and(|(_, r)| *r >= revision)) {
            return;
        }
        let deleted = headers
            .and_then(|h| h.get(headers::KV_OPERATION))
            .is_some_and(|op| op.as_str() == "DEL" || op.as_str() == "PURGE");
        if deleted {
            self.0.insert(key.to_string(), None);
            return;
        }
        match M::decode(payload.clone()) {
            Ok(value) => {
                let kept = keep(key, value);
                self.0.insert(key.to_string(), Some((kept, revision)));
            }
            Err(e) => warn!(bucket = %kv.bucket, key, error = %e, "skipping an entry that does not decode"),
        }
    }

    /// [`ScanEntries::add`] of a message read by itself (by its subject).
    fn add_raw<M: prost::Message + Default>(
        &mut self,
        kv: &Kv,
        msg: &async_nats::jetstream::message::StreamMessage,
        keep: &impl Fn(&str, M) -> Option<T>,
    ) {
        self.add(kv, &msg.subject, Some(&msg.headers), &msg.payload, msg.sequence, keep);
    }
}
