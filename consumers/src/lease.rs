//! The site lease: one mutating saga per site at a time (`lease.<site>` in `landfall-sagas`).
//!
//! A lease names its holder: an install or node-join saga, a rollout patching the site, or a
//! node removal, node reprovision or site decommission.
//! It is never renewed by a running process: the holder's record in KV says whether the
//! holder is still at work, so a dead orchestrator blocks nothing (another replica, or the
//! restarted one, carries the same saga on), and a lease whose holder has ended is taken over.

use std::time::Duration;

use bus_schema::names::keys;
use bus_schema::pb;
use bus_schema::runtime::{BusError, HandlerError, Kv, Update};

use crate::clock::now_ms;
use crate::saga;

/// How long a lease whose holder record does not exist yet is presumed to belong to a replica
/// that is between taking the lease and writing its record (longer than any ack wait).
pub const LEASE_GRACE: Duration = Duration::from_secs(60);

/// Who wants a site's lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder<'a> {
    /// An install or node-join saga, by its id.
    Saga(&'a str),
    /// A rollout, by its id.
    Rollout(&'a str),
    /// A node removal or reprovision, or a site decommission, by its command's id.
    Lifecycle(&'a str),
}

impl Holder<'_> {
    fn record(&self, site: &str) -> pb::SiteLease {
        let (saga_id, holder) = match self {
            Holder::Saga(id) => (id, pb::LeaseHolder::Unspecified),
            Holder::Rollout(id) => (id, pb::LeaseHolder::Rollout),
            Holder::Lifecycle(id) => (id, pb::LeaseHolder::Lifecycle),
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
            // Compacted: it ended long ago.
            None if sagas.get::<pb::RolloutSummary>(&keys::rollout_summary(&lease.saga_id)).await?.is_some() => false,
            None => young(),
        });
    }
    if lease.holder == pb::LeaseHolder::Lifecycle as i32 {
        return Ok(match sagas.get::<pb::Lifecycle>(&keys::lifecycle(&lease.saga_id)).await? {
            Some((op, _)) => op.phase == pb::LifecyclePhase::TearingDown as i32,
            None => young(),
        });
    }
    Ok(match sagas.get::<pb::InstallSaga>(&keys::saga(&lease.saga_id)).await? {
        Some((s, _)) => !saga::is_terminal(&s),
        // Compacted: it ended long ago.
        None if sagas.get::<pb::SagaSummary>(&keys::saga_summary(&lease.saga_id)).await?.is_some() => false,
        // Taken, but no saga yet: its taker may still be about to write it.
        None => young(),
    })
}

/// Takes the site's lease for `holder`, or says who is busy with it. Taking it again for the
/// same holder succeeds; a lease whose holder has ended is taken over.
pub async fn acquire(sagas: &Kv, site: &str, holder: Holder<'_>) -> Result<Acquired, BusError> {
    let key = keys::site_lease(site);
    let lease = holder.record(site);
    let held = match sagas.update_with(&key, |held: Option<&pb::SiteLease>| take(held, &lease, holder, None)).await? {
        Taken::Yes => return Ok(Acquired::Yes),
        Taken::HeldBy(held) => held,
    };
    // Whether its holder has ended takes reads of its own, which a compare-and-set change must
    // not make: look now, then take the lease over only if it is still the one looked at.
    if holder_busy(sagas, &held).await? {
        return Ok(busy(site, &held));
    }
    let taken = sagas.update_with(&key, |current: Option<&pb::SiteLease>| take(current, &lease, holder, Some(&held)));
    Ok(match taken.await? {
        Taken::Yes => Acquired::Yes,
        // Another holder took it meanwhile.
        Taken::HeldBy(other) => busy(site, &other),
    })
}

fn busy(site: &str, held: &pb::SiteLease) -> Acquired {
    let what = match pb::LeaseHolder::try_from(held.holder) {
        Ok(pb::LeaseHolder::Rollout) => "rollout",
        Ok(pb::LeaseHolder::Lifecycle) => "node or site operation",
        _ => "saga",
    };
    Acquired::Busy(format!("site {site} is busy with {what} {}", held.saga_id))
}

/// Whether a compare-and-set on the lease took it.
#[derive(Debug, Clone, PartialEq)]
enum Taken {
    Yes,
    /// Someone else holds it: this lease.
    HeldBy(pb::SiteLease),
}

/// What taking the lease does to `held` (the lease as it is now): write `lease` when the site
/// is free or its holder has `ended` (a lease looked at before), nothing when `holder` has it
/// already, and nothing but saying who has it otherwise.
fn take(
    held: Option<&pb::SiteLease>,
    lease: &pb::SiteLease,
    holder: Holder<'_>,
    ended: Option<&pb::SiteLease>,
) -> Update<pb::SiteLease, Taken> {
    match held {
        None => Update::Put(lease.clone(), Taken::Yes),
        Some(held) if holder.is(held) => Update::Keep(Taken::Yes),
        Some(held) if ended == Some(held) => Update::Put(lease.clone(), Taken::Yes),
        Some(held) => Update::Abort(Taken::HeldBy(held.clone())),
    }
}

/// [`acquire`] for a command handler: a busy site asks for a redelivery after `retry`.
pub async fn acquire_or_wait(sagas: &Kv, site: &str, holder: Holder<'_>, retry: Duration) -> Result<(), HandlerError> {
    match acquire(sagas, site, holder).await? {
        Acquired::Yes => Ok(()),
        Acquired::Busy(reason) => Err(HandlerError::Wait { reason, delay: retry }),
    }
}

/// Whether `holder` has the site's lease now.
pub async fn holds(sagas: &Kv, site: &str, holder: Holder<'_>) -> Result<bool, BusError> {
    Ok(sagas.get::<pb::SiteLease>(&keys::site_lease(site)).await?.is_some_and(|(held, _)| holder.is(&held)))
}

/// Gives the site's lease from `from` to `to` in one compare-and-set write (a reprovision's
/// teardown to the join saga that follows it), so nobody else takes the site in between.
/// Whether `to` holds it now.
pub async fn hand_over(sagas: &Kv, site: &str, from: Holder<'_>, to: Holder<'_>) -> Result<bool, BusError> {
    let lease = to.record(site);
    sagas
        .update_with(&keys::site_lease(site), |held: Option<&pb::SiteLease>| match held {
            Some(held) if to.is(held) => Update::Keep(true),
            Some(held) if from.is(held) => Update::Put(lease.clone(), true),
            _ => Update::Keep(false),
        })
        .await
}

/// Lets go of the site's lease if `holder` has it.
pub async fn release(sagas: &Kv, site: &str, holder: Holder<'_>) -> Result<(), BusError> {
    sagas
        .update_with(&keys::site_lease(site), |held: Option<&pb::SiteLease>| match held {
            Some(held) if holder.is(held) => Update::Delete(()),
            _ => Update::Keep(()),
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: Holder<'_>, acquired_unix_ms: i64) -> pb::SiteLease {
        pb::SiteLease { acquired_unix_ms, ..holder.record("edge-01") }
    }

    #[test]
    fn a_free_site_or_one_whose_holder_ended_is_taken() {
        let mine = lease(Holder::Saga("s2"), 2);
        assert_eq!(take(None, &mine, Holder::Saga("s2"), None), Update::Put(mine.clone(), Taken::Yes));
        let ended = lease(Holder::Saga("s1"), 1);
        assert_eq!(take(Some(&ended), &mine, Holder::Saga("s2"), Some(&ended)), Update::Put(mine.clone(), Taken::Yes));
    }

    #[test]
    fn the_holder_keeps_its_lease_without_a_write() {
        let mine = lease(Holder::Rollout("r1"), 2);
        let held = lease(Holder::Rollout("r1"), 1);
        assert_eq!(take(Some(&held), &mine, Holder::Rollout("r1"), None), Update::Keep(Taken::Yes));
    }

    #[test]
    fn a_lease_held_by_another_is_not_taken_unless_it_is_the_one_found_ended() {
        let mine = lease(Holder::Saga("s2"), 2);
        let held = lease(Holder::Saga("s1"), 1);
        assert_eq!(take(Some(&held), &mine, Holder::Saga("s2"), None), Update::Abort(Taken::HeldBy(held.clone())));
        let other = lease(Holder::Rollout("r9"), 3);
        assert_eq!(
            take(Some(&other), &mine, Holder::Saga("s2"), Some(&held)),
            Update::Abort(Taken::HeldBy(other.clone()))
        );
        assert_eq!(busy("edge-01", &other), Acquired::Busy("site edge-01 is busy with rollout r9".into()));
        assert_eq!(busy("edge-01", &held), Acquired::Busy("site edge-01 is busy with saga s1".into()));
    }
}
