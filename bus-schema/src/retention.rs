//! What landfall keeps, and for how long ([`StorePolicy`]): one policy the orchestrator, the
//! gateway and the CLI share, with the pure rules that apply it (when a finished record is due
//! for compaction, which design revisions go).

use std::time::Duration;

/// How much history landfall keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StorePolicy {
    /// How long a finished saga or rollout is kept whole; after it, only its summary.
    pub finished_retention: Duration,
    /// How many design revisions of a site are kept (the latest ones); at least 1.
    pub design_revisions: u32,
    /// The most bytes a site's artifact cache holds before it evicts what no design needs.
    pub site_cache_bytes: u64,
    /// How often the orchestrator compacts (every replica tries; compare-and-set keeps them apart).
    pub compaction_interval: Duration,
    /// How long the marker a deletion leaves in a KV bucket is kept (so watchers see the
    /// deletion) before the compaction removes it.
    pub marker_retention: Duration,
    /// How long what is kept of something ended is kept: a compacted saga's or rollout's
    /// summary, and the record that a node left its site (a late report of it is not written
    /// meanwhile). Like the commands and events it summarises, 30 days by default.
    pub summary_retention: Duration,
}

/// Seven days.
pub const FINISHED_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// Ten revisions.
pub const DESIGN_REVISIONS: u32 = 10;
/// 20 GiB.
pub const SITE_CACHE_BYTES: u64 = 20 << 30;
/// One minute.
pub const COMPACTION_INTERVAL: Duration = Duration::from_secs(60);
/// One hour.
pub const MARKER_RETENTION: Duration = Duration::from_secs(3600);
/// Thirty days, as long as commands and events are kept.
pub const SUMMARY_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);

impl Default for StorePolicy {
    fn default() -> Self {
        Self {
            finished_retention: FINISHED_RETENTION,
            design_revisions: DESIGN_REVISIONS,
            site_cache_bytes: SITE_CACHE_BYTES,
            compaction_interval: COMPACTION_INTERVAL,
            marker_retention: MARKER_RETENTION,
            summary_retention: SUMMARY_RETENTION,
        }
    }
}

/// A policy that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("design revisions: at least 1 must be kept (the current one)")]
    NoDesignRevisions,
    #[error("compaction interval: must be longer than zero")]
    NoCompactionInterval,
}

impl StorePolicy {
    /// The policy, checked.
    ///
    /// # Errors
    /// A [`PolicyError`] naming the setting that cannot work.
    pub fn validate(self) -> Result<Self, PolicyError> {
        if self.design_revisions == 0 {
            return Err(PolicyError::NoDesignRevisions);
        }
        if self.compaction_interval.is_zero() {
            return Err(PolicyError::NoCompactionInterval);
        }
        Ok(self)
    }

    /// Whether a record that finished at `finished_unix_ms` (0: not finished) is due for
    /// compaction at `now_ms`.
    pub fn compaction_due(&self, finished_unix_ms: i64, now_ms: i64) -> bool {
        finished_unix_ms > 0
            && now_ms.saturating_sub(finished_unix_ms)
                >= i64::try_from(self.finished_retention.as_millis()).unwrap_or(i64::MAX)
    }

    /// Whether a deletion marker written at `written_unix_ms` has been kept long enough.
    pub fn marker_due(&self, written_unix_ms: i64, now_ms: i64) -> bool {
        now_ms.saturating_sub(written_unix_ms) >= i64::try_from(self.marker_retention.as_millis()).unwrap_or(i64::MAX)
    }

    /// Whether a summary of something that ended at `ended_unix_ms` (or a node's departure
    /// then) has been kept long enough at `now_ms`.
    pub fn summary_due(&self, ended_unix_ms: i64, now_ms: i64) -> bool {
        now_ms.saturating_sub(ended_unix_ms) >= i64::try_from(self.summary_retention.as_millis()).unwrap_or(i64::MAX)
    }

    /// The newest design revision to prune once `latest` is written (older ones went before, or
    /// go with it): `None` while `latest` is within the revisions kept.
    pub fn prune_design_through(&self, latest: u64) -> Option<u64> {
        latest.checked_sub(u64::from(self.design_revisions)).filter(|r| *r > 0)
    }

    /// Whether design revision `revision` of a site whose latest is `latest` has been pruned
    /// under this policy (as opposed to never having existed).
    pub fn design_pruned(&self, revision: u64, latest: u64) -> bool {
        revision > 0 && self.prune_design_through(latest).is_some_and(|through| revision <= through)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_finished_record_is_due_once_the_retention_has_passed() {
        let p = StorePolicy { finished_retention: Duration::from_secs(2), ..Default::default() };
        assert!(!p.compaction_due(0, 10_000), "not finished");
        assert!(!p.compaction_due(9_000, 10_000));
        assert!(p.compaction_due(8_000, 10_000));
        assert!(StorePolicy::default().compaction_due(1, i64::MAX));
    }

    #[test]
    fn a_summary_goes_once_its_own_retention_has_passed() {
        let p = StorePolicy { summary_retention: Duration::from_secs(5), ..Default::default() };
        assert!(!p.summary_due(6_000, 10_000));
        assert!(p.summary_due(5_000, 10_000));
    }

    #[test]
    fn the_last_n_design_revisions_are_kept() {
        let p = StorePolicy { design_revisions: 3, ..Default::default() };
        assert_eq!(p.prune_design_through(3), None);
        assert_eq!(p.prune_design_through(4), Some(1));
        assert_eq!(p.prune_design_through(10), Some(7));
        assert!(p.design_pruned(7, 10));
        assert!(!p.design_pruned(8, 10));
        assert!(!p.design_pruned(11, 10), "never existed");
    }

    #[test]
    fn a_policy_keeping_no_revision_is_refused() {
        let p = StorePolicy { design_revisions: 0, ..Default::default() };
        assert_eq!(p.validate(), Err(PolicyError::NoDesignRevisions));
        assert!(StorePolicy::default().validate().is_ok());
    }
}
