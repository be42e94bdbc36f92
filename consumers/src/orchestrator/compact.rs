//! The compaction pass: finished sagas and rollouts older than the retention replaced by their
//! summaries (their records, plan chunks and site records purged), the index of what is under
//! way kept true, and the markers deletions leave swept once old. Every replica runs it; each
//! write is a create or a compare-and-set purge, so replicas that race change nothing twice.

use std::time::Duration;

use bus_schema::names::keys;
use bus_schema::pb;
use bus_schema::runtime::{self, BusError, Cas, HandlerError};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::service::Orchestrator;
use crate::clock::now_ms;
use crate::compaction;
use crate::lease::LEASE_GRACE;
use crate::saga;

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Compacted {
    pub sagas: usize,
    pub rollouts: usize,
    /// Plan chunks and site records of the rollouts compacted.
    pub rollout_parts: usize,
    /// Index entries added (a record under way that had none) or dropped (nothing under way).
    pub index_fixed: usize,
    pub markers: usize,
    /// Summaries past their own retention, removed.
    pub summaries: usize,
}

/// What a compaction pass does with one install saga.
enum SagaPass {
    /// Ended and past its retention: summarized, then purged.
    Due(pb::SagaSummary),
    /// Under way: its entry in the index of what is under way is made if missing.
    UnderWay { id: String, site: String, started: i64 },
}

impl Orchestrator {
    /// One compaction pass over `landfall-sagas` and `landfall-sites`.
    ///
    /// # Errors
    /// When KV fails; the next pass goes on from where this one stopped.
    pub async fn compact(&self) -> Result<Compacted, HandlerError> {
        let now = now_ms();
        let mut done = Compacted::default();
        // Of each saga only what the pass acts on is kept as it is read: ten thousand sagas
        // installing at once, held whole, raised the orchestrator's memory by 145 MB at each pass.
        let policy = &self.policy;
        let sagas = self
            .sagas
            .scan_matching_map(&format!("{}>", keys::saga("")), |_, s: pb::InstallSaga| {
                if compaction::saga_due(policy, &s, now) {
                    Some(SagaPass::Due(compaction::saga_summary(&s, now)))
                } else if !saga::is_terminal(&s) {
                    Some(SagaPass::UnderWay { id: s.saga_id, site: s.site_id, started: s.started_unix_ms })
                } else {
                    None
                }
            })
            .await?;
        for (key, pass, rev) in sagas {
            match pass {
                SagaPass::Due(summary) => {
                    let id = summary.saga_id.clone();
                    self.sagas.create(&keys::saga_summary(&id), &summary).await?;
                    if self.sagas.purge_if(&key, rev).await? == Cas::Written(rev) {
                        self.sagas.purge(&keys::active_saga(&id)).await?;
                        done.sagas += 1;
                    }
                }
                SagaPass::UnderWay { id, site, started } => {
                    if self.index(&keys::active_saga(&id), &site, started).await? {
                        done.index_fixed += 1;
                    }
                }
            }
        }
        for (key, r, rev) in self.sagas.scan_matching::<pb::Rollout>(&keys::every_rollout()).await? {
            if compaction::rollout_due(&self.policy, &r, now) {
                let parts = self.compact_rollout(&r, now).await?;
                if self.sagas.purge_if(&key, rev).await? == Cas::Written(rev) {
                    self.sagas.purge(&keys::active_rollout(&r.rollout_id)).await?;
                    done.rollouts += 1;
                    done.rollout_parts += parts;
                }
            } else if !crate::rollout::is_terminal(&r)
                && self.index(&keys::active_rollout(&r.rollout_id), "", r.started_unix_ms).await?
            {
                done.index_fixed += 1;
            }
        }
        done.index_fixed += self.drop_stale_index(now).await?;
        done.summaries += self.drop_old_summaries(now).await?;
        let age = self.policy.marker_retention;
        done.markers += self.sagas.sweep_markers(">", age, now).await?;
        done.markers += self.sites.sweep_markers(">", age, now).await?;
        Ok(done)
    }

    /// Writes the rollout's summary and purges its plan chunks and site records (the record
    /// itself goes last, so a pass cut short finds it again); how many parts went.
    async fn compact_rollout(&self, r: &pb::Rollout, now: i64) -> Result<usize, BusError> {
        let id = &r.rollout_id;
        let sites = self.sagas.scan::<pb::RolloutSite>(&keys::rollout_sites_prefix(id)).await?;
        let records: Vec<pb::RolloutSite> = sites.iter().map(|(_, s, _)| s.clone()).collect();
        self.sagas.create(&keys::rollout_summary(id), &compaction::rollout_summary(r, &records, now)).await?;
        let mut parts = 0;
        for (key, _, _) in &sites {
            self.sagas.purge(key).await?;
            parts += 1;
        }
        for n in 0..r.plan_chunks {
            self.sagas.purge(&keys::rollout_plan(id, n)).await?;
            parts += 1;
        }
        Ok(parts)
    }

    /// Removes the summaries kept past [`bus_schema::retention::StorePolicy::summary_retention`]
    /// (by when what they summarise ended), the ended node and site operations' records and the
    /// decommissioned sites' archives as old; how many went. The summary of a site's latest
    /// install stays as long as the site: it is how the hub knows the site is installed.
    async fn drop_old_summaries(&self, now: i64) -> Result<usize, BusError> {
        let ended = |finished: i64, compacted: i64| if finished > 0 { finished } else { compacted };
        let mut due = Vec::new();
        for (key, s, rev) in self.sagas.scan::<pb::SagaSummary>(keys::SAGA_SUMMARY_PREFIX).await? {
            if self.policy.summary_due(ended(s.finished_unix_ms, s.compacted_unix_ms), now)
                && !self.latest_install_of_its_site(&s).await?
            {
                due.push((key, rev));
            }
        }
        for (key, r, rev) in self.sagas.scan::<pb::RolloutSummary>(keys::ROLLOUT_SUMMARY_PREFIX).await? {
            if self.policy.summary_due(ended(r.finished_unix_ms, r.compacted_unix_ms), now) {
                due.push((key, rev));
            }
        }
        // A node or site operation's record is its own summary: kept as long as summaries are.
        for (key, op, rev) in self.sagas.scan::<pb::Lifecycle>(keys::LIFECYCLE_PREFIX).await? {
            if op.phase != pb::LifecyclePhase::TearingDown as i32 && self.policy.summary_due(op.finished_unix_ms, now) {
                due.push((key, rev));
            }
        }
        let mut dropped = 0;
        for (key, rev) in due {
            if self.sagas.purge_if(&key, rev).await? != Cas::Conflict {
                dropped += 1;
            }
        }
        // A decommissioned site's archive, as long as summaries are.
        for (key, a, rev) in self.sites.scan::<pb::SiteArchive>(keys::ARCHIVE_PREFIX).await? {
            if self.policy.summary_due(a.decommissioned_unix_ms, now)
                && self.sites.purge_if(&key, rev).await? != Cas::Conflict
            {
                dropped += 1;
            }
        }
        Ok(dropped)
    }

    /// Whether `s` is its site's latest install (the site's `latest_install` names it).
    async fn latest_install_of_its_site(&self, s: &pb::SagaSummary) -> Result<bool, BusError> {
        if s.join {
            return Ok(false);
        }
        let latest = self.sagas.get::<pb::SiteLease>(&keys::latest_install(&s.site_id)).await?;
        Ok(latest.is_some_and(|(l, _)| l.saga_id == s.saga_id))
    }

    /// Puts `key` into the index of what is under way if it is not there; whether it was added.
    async fn index(&self, key: &str, site: &str, started: i64) -> Result<bool, BusError> {
        let id = key.rsplit('.').next().unwrap_or_default().to_string();
        let entry = pb::ActiveEntry { id, site_id: site.to_string(), started_unix_ms: started };
        Ok(self.sagas.create(key, &entry).await? != Cas::Conflict)
    }

    /// Drops index entries whose record has ended or does not exist (a taker that died between
    /// writing the entry and the record, once that is older than a lease's grace).
    async fn drop_stale_index(&self, now: i64) -> Result<usize, BusError> {
        let grace = i64::try_from(LEASE_GRACE.as_millis()).unwrap_or(i64::MAX);
        let mut dropped = 0;
        for (key, e, rev) in self.sagas.scan::<pb::ActiveEntry>(keys::ACTIVE_SAGA_PREFIX).await? {
            let ended = match self.sagas.get::<pb::InstallSaga>(&keys::saga(&e.id)).await? {
                Some((s, _)) => saga::is_terminal(&s) && s.outbox.is_empty(),
                None => now.saturating_sub(e.started_unix_ms) > grace,
            };
            if ended && self.sagas.purge_if(&key, rev).await? != Cas::Conflict {
                dropped += 1;
            }
        }
        for (key, e, rev) in self.sagas.scan::<pb::ActiveEntry>(keys::ACTIVE_ROLLOUT_PREFIX).await? {
            let ended = match self.sagas.get::<pb::Rollout>(&keys::rollout(&e.id)).await? {
                Some((r, _)) => crate::rollout::is_terminal(&r) && r.outbox.is_empty(),
                None => now.saturating_sub(e.started_unix_ms) > grace,
            };
            if ended && self.sagas.purge_if(&key, rev).await? != Cas::Conflict {
                dropped += 1;
            }
        }
        Ok(dropped)
    }
}

/// Compacts every [`bus_schema::retention::StorePolicy::compaction_interval`] until `shutdown`.
pub(super) async fn compact_periodically(orchestrator: std::sync::Arc<Orchestrator>, shutdown: CancellationToken) {
    let mut every = tokio::time::interval(orchestrator.policy.compaction_interval.max(Duration::from_millis(100)));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = every.tick() => {}
        }
        match orchestrator.compact().await {
            Ok(c) if c == Compacted::default() => debug!("compaction: nothing to do"),
            Ok(c) => info!(
                sagas = c.sagas,
                rollouts = c.rollouts,
                parts = c.rollout_parts,
                index = c.index_fixed,
                markers = c.markers,
                summaries = c.summaries,
                "compacted"
            ),
            Err(e) => warn!(error = %runtime::error_chain(&e), "compaction failed; trying again next time"),
        }
    }
}
