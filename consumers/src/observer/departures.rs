//! The nodes that left their sites, as the observer's process knows them: the departure markers
//! of `landfall-observed` (`left.<site>.<node>`), listed once and then followed by a watch. A
//! node's report then needs no read to learn that its node never left, which is what nearly
//! every report finds: departures are few, reports many.
//!
//! Until the listing is in (and again after the watch broke, until it is listed again), nothing
//! is known and each report reads its node's marker as before. A marker this process writes or
//! removes is known at once; one another replica writes is known once the watch brings it, a
//! moment later, as a read made a moment earlier would have missed it too.

use std::collections::HashMap;
use std::sync::Mutex;

use bus_schema::names::keys;
use bus_schema::pb;
use bus_schema::runtime::{self, BusError, Kv};
use futures::StreamExt;
use prost::Message as _;
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// What is known of the markers: by key, when the node left and the marker's revision; `None`
/// while nothing is known.
#[derive(Default)]
pub(super) struct Departures(Mutex<Option<HashMap<String, (i64, u64)>>>);

/// What is known of one node's marker.
pub(super) enum Known {
    /// Nothing: read it.
    Unknown,
    /// No marker: the node never left (or is back, its marker gone).
    Never,
    /// It left at this time; the marker's revision.
    Left(i64, u64),
}

impl Departures {
    pub(super) fn of(&self, key: &str) -> Known {
        match &*self.lock() {
            None => Known::Unknown,
            Some(known) => known.get(key).map_or(Known::Never, |(left, rev)| Known::Left(*left, *rev)),
        }
    }

    /// A marker this process wrote.
    pub(super) fn wrote(&self, key: &str, left_unix_ms: i64, revision: u64) {
        if let Some(known) = self.lock().as_mut() {
            known.insert(key.to_string(), (left_unix_ms, revision));
        }
    }

    /// A marker this process removed (at `revision`).
    pub(super) fn removed(&self, key: &str, revision: u64) {
        if let Some(known) = self.lock().as_mut()
            && known.get(key).is_some_and(|(_, rev)| *rev <= revision)
        {
            known.remove(key);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<HashMap<String, (i64, u64)>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Follows the markers of `observed` until `shutdown`: a watch, then a listing, then the
    /// watch's changes; watched again when it breaks.
    pub(super) async fn follow(&self, observed: &Kv, shutdown: CancellationToken) {
        loop {
            *self.lock() = None;
            if let Err(e) = self.follow_once(observed, &shutdown).await {
                warn!(error = %runtime::error_chain(&e), "following the nodes' departures broke; reports read them meanwhile");
            }
            *self.lock() = None;
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
            }
        }
    }

    async fn follow_once(&self, observed: &Kv, shutdown: &CancellationToken) -> Result<(), BusError> {
        let changes = observed.watch_latest(vec![format!("{}>", keys::DEPARTED_PREFIX)]).await?;
        tokio::pin!(changes);
        // Listed after the watch began: a marker written since is in the listing or in the watch.
        // What the watch brings up to the bucket's last revision before the listing, the listing
        // has as it was when listed.
        let as_of = observed.last_revision().await?;
        let listed = observed.scan_few::<pb::NodeDeparted>(keys::DEPARTED_PREFIX).await?;
        *self.lock() = Some(listed.into_iter().map(|(key, d, rev)| (key, (d.left_unix_ms, rev))).collect());
        loop {
            let change = tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                change = changes.next() => change,
            };
            let Some(change) = change else { return Ok(()) };
            let change = change?;
            if change.revision <= as_of {
                continue;
            }
            let mut known = self.lock();
            let Some(known) = known.as_mut() else { return Ok(()) };
            let newer = known.get(&change.key).is_none_or(|(_, rev)| *rev < change.revision);
            match change.value {
                Some(value) if newer => match pb::NodeDeparted::decode(value) {
                    Ok(d) => {
                        known.insert(change.key, (d.left_unix_ms, change.revision));
                    }
                    // Not a marker as this version writes them: nothing is known until the
                    // next listing, and reports read their markers.
                    Err(e) => {
                        warn!(key = %change.key, error = %e, "a departure marker that does not decode");
                        return Ok(());
                    }
                },
                None if newer => {
                    known.remove(&change.key);
                }
                _ => {}
            }
        }
    }
}
