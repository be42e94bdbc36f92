//! Whether the JetStream store has room: each landfall stream's and bucket's use against its own
//! limits and the account's ([`store_use`]), the writes refused for lack of room that this
//! process saw ([`note_refused`]; the server's own disk limit is visible no other way), and
//! which of them are full now ([`assess`], pure). The orchestrator's store watch turns this into
//! a metric and events; every service's health answer reads [`alarm`].

use std::collections::BTreeMap;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::context::GetStreamErrorKind;
use futures::StreamExt;

use super::connect::Bus;
use super::error::{BoxError, BusError, boxed};
use crate::names;

/// A stream's (or bucket's) use and its limits (`-1`: none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamUse {
    pub stream: String,
    pub bytes: u64,
    pub messages: u64,
    pub max_bytes: i64,
    pub max_messages: i64,
}

/// Every landfall stream's use, and the account's storage against its limit (`-1`: none visible;
/// a server's `max_file_store` or disk is not).
#[derive(Debug, Clone, Default)]
pub struct StoreUse {
    pub streams: Vec<StreamUse>,
    pub account_bytes: u64,
    pub account_limit: i64,
}

/// A stream with no room, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Full {
    /// The stream, `KV_<bucket>` for a bucket, or [`STORE`] when only the whole store is known.
    pub stream: String,
    pub bytes: u64,
    /// Its limit in bytes, `-1` when none is visible.
    pub limit_bytes: i64,
    pub reason: String,
}

/// What a refused write names when it cannot say which stream it went to.
pub const STORE: &str = "store";

/// A stream counts as full from this share of its byte or message limit.
const FULL_AT: f64 = 0.95;

/// How long a refused write keeps its stream full when no limit says otherwise: long enough for
/// the retries that follow it to refresh it, short enough that room found again clears it.
pub const REFUSED_FOR: Duration = Duration::from_secs(30);

/// The streams whose writes were refused for lack of room, and when last.
static REFUSED: LazyLock<Mutex<BTreeMap<String, Instant>>> = LazyLock::new(Default::default);

/// The streams full now, as the last [`assess`] by this process's store watch found them.
static ALARM: LazyLock<Mutex<Vec<Full>>> = LazyLock::new(Default::default);

/// Notes that a write to `stream` (or [`STORE`]) was refused because the store was full.
pub fn note_refused(stream: &str) {
    metrics::counter!("landfall_store_refused_writes_total", "stream" => stream.to_string()).increment(1);
    REFUSED.lock().expect("refused lock").insert(stream.to_string(), Instant::now());
}

/// The stream a failed write named, for [`note_refused`]: a bucket's `KV_` stream, a subject's
/// stream, else [`STORE`].
pub fn stream_of(error: &BusError) -> String {
    match error {
        BusError::Kv { bucket, .. } | BusError::KeptChanging { bucket, .. } => names::kv_stream(bucket),
        BusError::Publish { subject, .. } => names::stream_of_subject(subject).unwrap_or(STORE).to_string(),
        _ => STORE.to_string(),
    }
}

/// The stream a write refused for lack of room went to, from the first bus error in `error`'s
/// chain of causes ([`stream_of`]); [`STORE`] when none says.
pub fn refused_stream(error: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if let Some(bus) = e.downcast_ref::<BusError>() {
            return stream_of(bus);
        }
        cause = e.source();
    }
    STORE.to_string()
}

/// The streams whose writes were refused within `within`.
pub fn refused_within(within: Duration) -> Vec<String> {
    let now = Instant::now();
    let mut refused = REFUSED.lock().expect("refused lock");
    refused.retain(|_, at| now.duration_since(*at) < within);
    refused.keys().cloned().collect()
}

/// The streams full now in this process's view (empty: there is room).
pub fn alarm() -> Vec<Full> {
    ALARM.lock().expect("alarm lock").clone()
}

/// Sets what [`alarm`] answers.
pub fn set_alarm(full: Vec<Full>) {
    *ALARM.lock().expect("alarm lock") = full;
}

/// Reads every landfall stream's and bucket's use, and the account's.
///
/// # Errors
/// [`BusError::Topology`] when the JetStream API cannot be read.
pub async fn store_use(bus: &Bus) -> Result<StoreUse, BusError> {
    let js = bus.jetstream();
    let mut out = StoreUse { account_limit: -1, ..StoreUse::default() };
    let streams: Vec<String> = names::streams()
        .into_iter()
        .map(String::from)
        .chain(names::ALL_BUCKETS.iter().map(|b| names::kv_stream(b)))
        .collect();
    // Sixteen at a time: there are seventy-odd, the jobs' shards among them.
    let infos: Vec<_> = futures::stream::iter(streams)
        .map(|name| {
            let js = js.clone();
            async move {
                let stream = js.get_stream(&name).await;
                (name, stream)
            }
        })
        .buffered(16)
        .collect()
        .await;
    for (name, stream) in infos {
        let stream = match stream {
            Ok(stream) => stream,
            // A stream not made yet (the dead letters before anything died) has nothing in it.
            Err(e) if matches!(e.kind(), GetStreamErrorKind::JetStream(j) if j.error_code() == ErrorCode::STREAM_NOT_FOUND) =>
            {
                continue;
            }
            Err(e) => return Err(BusError::Topology { what: "stream", name: name.clone(), source: boxed(e) }),
        };
        let info = stream.cached_info();
        out.streams.push(StreamUse {
            stream: name.clone(),
            bytes: info.state.bytes,
            messages: info.state.messages,
            max_bytes: info.config.max_bytes,
            max_messages: info.config.max_messages,
        });
    }
    if let Ok(account) = js.query_account().await {
        out.account_bytes = account.storage;
        out.account_limit = account.limits.max_storage.unwrap_or(-1);
    }
    Ok(out)
}

/// The last `StoreFull` event, when no `StoreRoomAgain` came after it: what the hub's store watch
/// reported full, including what no limit shows (the server's store or disk).
///
/// # Errors
/// [`BusError::Topology`] when the events stream cannot be read.
pub async fn reported_full(bus: &Bus) -> Result<Option<crate::pb::StoreFull>, BusError> {
    use crate::pb::{self, BusEvent};
    let err = |e: BoxError| BusError::Topology { what: "stream", name: names::EVENTS_STREAM.into(), source: e };
    let stream = bus.jetstream().get_stream(names::EVENTS_STREAM).await.map_err(|e| err(boxed(e)))?;
    let last = async |subject: String| stream.get_last_raw_message_by_subject(&subject).await.ok();
    let Some(full) = last(pb::StoreFull::filter()).await else { return Ok(None) };
    if last(pb::StoreRoomAgain::filter()).await.is_some_and(|room| room.sequence > full.sequence) {
        return Ok(None);
    }
    let event = <pb::StoreFull as prost::Message>::decode(full.payload).map_err(|e| err(boxed(e)))?;
    Ok(Some(event))
}

/// Which streams have no room: at [`FULL_AT`] of their own byte or message limit, every stream
/// when the account is at its storage limit, and those whose writes were `refused` lately.
pub fn assess(usage: &StoreUse, refused: &[String]) -> Vec<Full> {
    let near = |used: u64, limit: i64| limit > 0 && used as f64 >= limit as f64 * FULL_AT;
    let mut full: BTreeMap<String, Full> = BTreeMap::new();
    for s in &usage.streams {
        let reason = if near(s.bytes, s.max_bytes) {
            Some(format!("{} of its {} bytes are used", s.bytes, s.max_bytes))
        } else if near(s.messages, s.max_messages) {
            Some(format!("{} of its {} messages are stored", s.messages, s.max_messages))
        } else {
            None
        };
        if let Some(reason) = reason {
            full.insert(
                s.stream.clone(),
                Full { stream: s.stream.clone(), bytes: s.bytes, limit_bytes: s.max_bytes, reason },
            );
        }
    }
    if near(usage.account_bytes, usage.account_limit) {
        let reason =
            format!("the account's storage is at {} of its {} bytes", usage.account_bytes, usage.account_limit);
        full.insert(
            STORE.to_string(),
            Full { stream: STORE.to_string(), bytes: usage.account_bytes, limit_bytes: usage.account_limit, reason },
        );
    }
    for stream in refused {
        let bytes = usage.streams.iter().find(|s| &s.stream == stream).map_or(usage.account_bytes, |s| s.bytes);
        full.entry(stream.clone()).or_insert_with(|| Full {
            stream: stream.clone(),
            bytes,
            limit_bytes: -1,
            reason: "writes are refused for lack of room (the server's store or disk is full)".into(),
        });
    }
    full.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(name: &str, bytes: u64, max_bytes: i64) -> StreamUse {
        StreamUse { stream: name.into(), bytes, messages: 1, max_bytes, max_messages: -1 }
    }

    #[test]
    fn a_stream_near_its_limit_the_account_at_its_own_and_refused_writes_are_full() {
        let usage = StoreUse {
            streams: vec![
                stream("LANDFALL_COMMANDS", 990, 1000),
                stream("LANDFALL_EVENTS", 10, 1000),
                stream("KV_x", 5, -1),
            ],
            account_bytes: 100,
            account_limit: -1,
        };
        let full = assess(&usage, &[]);
        assert_eq!(full.iter().map(|f| f.stream.as_str()).collect::<Vec<_>>(), ["LANDFALL_COMMANDS"]);
        assert!(full[0].reason.contains("990 of its 1000 bytes"), "{}", full[0].reason);

        let full = assess(&usage, &["KV_x".to_string()]);
        assert_eq!(full.len(), 2);
        let kv = full.iter().find(|f| f.stream == "KV_x").unwrap();
        assert_eq!((kv.bytes, kv.limit_bytes), (5, -1));

        let at_limit = StoreUse { account_bytes: 999, account_limit: 1000, ..usage.clone() };
        assert!(assess(&at_limit, &[]).iter().any(|f| f.stream == STORE));
        let room =
            StoreUse { streams: vec![stream("LANDFALL_COMMANDS", 10, 1000)], account_bytes: 10, account_limit: 1000 };
        assert!(assess(&room, &[]).is_empty());
    }
}
