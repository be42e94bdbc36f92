//! The index of what is under way (`active.saga.<id>`, `active.rollout.<id>` in
//! `landfall-sagas`): startup recovery and the rollout tick read these few keys, not every
//! saga or rollout ever written. An entry is written before its record and purged once the
//! record has ended and published everything.

use bus_schema::pb;
use bus_schema::runtime::{BusError, Kv};

use crate::clock::now_ms;

/// Puts `key` (an [`bus_schema::names::keys::active_saga`] or [`bus_schema::names::keys::active_rollout`]) into the index. Written
/// before the record, so a crash between the two leaves an entry the compaction drops, never a
/// record nobody looks at.
pub(crate) async fn mark(sagas: &Kv, key: &str, id: &str, site: &str) -> Result<(), BusError> {
    let entry = pb::ActiveEntry { id: id.to_string(), site_id: site.to_string(), started_unix_ms: now_ms() };
    sagas.create(key, &entry).await?;
    Ok(())
}

/// Takes `key` out of the index (its history with it); an entry already gone costs one read,
/// and leaves no second marker.
pub(crate) async fn clear(sagas: &Kv, key: &str) -> Result<(), BusError> {
    if let Some((_, rev)) = sagas.get::<pb::ActiveEntry>(key).await? {
        sagas.purge_if(key, rev).await?;
    }
    Ok(())
}

/// The ids in the index under `prefix` ([`bus_schema::names::keys::ACTIVE_SAGA_PREFIX`] or
/// [`bus_schema::names::keys::ACTIVE_ROLLOUT_PREFIX`]): one pass over those keys alone.
pub(crate) async fn ids(sagas: &Kv, prefix: &str) -> Result<Vec<String>, BusError> {
    Ok(sagas.scan::<pb::ActiveEntry>(prefix).await?.into_iter().map(|(_, e, _)| e.id).collect())
}
