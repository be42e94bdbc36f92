//! The site lease: one mutating saga per site at a time (`lease.<site>` in `landfall-sagas`).
//!
//! A lease names its holder: an install or node-join saga, or a rollout patching the site.
//! It is never renewed by a running process: the holder's record in KV says whether the
//! holder is still at work, so a dead orchestrator blocks nothing (another replica, or the
//! restarted one, carries the same saga on), and a lease whose holder has ended is taken over.

use std::time::Duration;

use bus_schema::names::keys;
use bus_schema::pb;
use bus_schema::runtime::{BusError, Cas, HandlerError, Kv};

use crate::clock::now_ms;
use crate::saga;

/// How long a lease whose holder record does not exist yet is presumed to belong to a replica
/// that is between taking the lease and writing its record (longer than any ack wait).
pub const LEASE_GRACE: Duration = Duration::from_secs(60);
/// How many times a compare-and-set race on a lease is retried.
const CAS_ATTEMPTS: usize = 64;

/// Who wants a site's lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder<'a> {
    /// An install or node-join saga, by its id.
    Saga(&'a str),
    /// A rollout, by its id.
    Rollout(&'a str),
}

impl Holder<'_> {
    fn record(&self, site: &str) -> pb::SiteLease {
        let (saga_id, holder) = match self {
            Holder::Saga(id) => (id, pb::LeaseHolder::Unspecified),
            Holder::Rollout(id) => (id, pb::LeaseHolder::Rollout),
        };
        pb::SiteLease {
            site_id: site.to_string(),
            saga_id: saga_id.to_string(),
            acquired_unix_ms: now_ms(),
            holder: holder as i32,
        }
    }

    fn is(&self, lease: &pb::SiteLease) -> bool {
        let rec = self.record(&lease.site_id);
        rec.saga_id == lease.saga_id && rec.holder == lease.holder
    }
}

/// Whether the site is free, or who has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired {
    Yes,
    /// Busy: says with what.
    Busy(String),
}

/// Whether the holder named by `lease` is still at work on its site.
pub(crate) async fn holder_busy(sagas: &Kv, lease: &pb::SiteLease) -> Result<bool, BusError> {
    let young = || now_ms().saturating_sub(lease.acquired_unix_ms) < LEASE_GRACE.as_millis() as i64;
    if lease.holder == pb::LeaseHolder::Rollout as i32 {
        let site = sagas.get::<pb::RolloutSite>(&keys::rollout_site(&lease.saga_id, &lease.site_id)).await?;
        if site.is_some_and(|(s, _)| s.state != pb::RolloutSiteState::Patching as i32) {
            return Ok(false);
        }
        return Ok(match sagas.get::<pb::Rollout>(&keys::rollout(&lease.saga_id)).await? {
            // A cancelled rollout lets go of sites that never reported.
            Some((r, _)) => r.phase != pb::RolloutPhase::Cancelled as i32,
            None => young(),
        });
    }
    Ok(match sagas.get::<pb::InstallSaga>(&keys::saga(&lease.saga_id)).await? {
        Some((s, _)) => !saga::is_terminal(&s),
        // Taken, but no saga yet: its taker may still be about to write it.
        None => young(),
    })
}

/// Takes the site's lease for `holder`, or says who is busy with it. Taking it again for the
/// same holder succeeds; a lease whose holder has ended is taken over.
pub async fn acquire(sagas: &Kv, site: &str, holder: Holder<'_>) -> Result<Acquired, BusError> {
    let key = keys::site_lease(site);
    let lease = holder.record(site);
    for _ in 0..CAS_ATTEMPTS {
        let Some((held, rev)) = sagas.get::<pb::SiteLease>(&key).await? else {
            match sagas.create(&key, &lease).await? {
                Cas::Written(_) => return Ok(Acquired::Yes),
                Cas::Conflict => continue,
            }
        };
        if holder.is(&held) {
            return Ok(Acquired::Yes);
        }
        if holder_busy(sagas, &held).await? {
            let what = if held.holder == pb::LeaseHolder::Rollout as i32 { "rollout" } else { "saga" };
            return Ok(Acquired::Busy(format!("site {site} is busy with {what} {}", held.saga_id)));
        }
        if let Cas::Written(_) = sagas.update(&key, &lease, rev).await? {
            return Ok(Acquired::Yes);
        }
    }
    Err(BusError::Kv { op: "lease", bucket: sagas.bucket().to_string(), key, source: "lease kept changing".into() })
}

/// [`acquire`] for a command handler: a busy site asks for a redelivery after `retry`.
pub async fn acquire_or_wait(sagas: &Kv, site: &str, holder: Holder<'_>, retry: Duration) -> Result<(), HandlerError> {
    match acquire(sagas, site, holder).await? {
        Acquired::Yes => Ok(()),
        Acquired::Busy(reason) => Err(HandlerError::Wait { reason, delay: retry }),
    }
}

/// Lets go of the site's lease if `holder` has it.
pub async fn release(sagas: &Kv, site: &str, holder: Holder<'_>) -> Result<(), BusError> {
    let key = keys::site_lease(site);
    if let Some((held, rev)) = sagas.get::<pb::SiteLease>(&key).await?
        && holder.is(&held)
    {
        sagas.delete_if(&key, rev).await?;
    }
    Ok(())
}
