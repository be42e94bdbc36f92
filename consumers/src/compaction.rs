//! What is kept of a finished saga or rollout once the retention has passed, decided purely:
//! whether a record is due ([`saga_due`], [`rollout_due`]) and the summary that replaces it
//! ([`saga_summary`], [`rollout_summary`]). The orchestrator's compaction pass executes them.

use bus_schema::pb;
use bus_schema::retention::StorePolicy;

use crate::rollout::decide;
use crate::saga;

/// How many failed or timed-out sites a rollout's summary names.
pub const SUMMARY_FAILED_SITES: usize = 100;

/// Whether a saga has ended, published everything, and finished longer ago than the retention.
pub fn saga_due(policy: &StorePolicy, s: &pb::InstallSaga, now_ms: i64) -> bool {
    saga::is_terminal(s) && s.outbox.is_empty() && policy.compaction_due(s.finished_unix_ms, now_ms)
}

/// Whether a rollout has ended (completed or cancelled; a halted one may be resumed), published
/// everything, and finished longer ago than the retention.
pub fn rollout_due(policy: &StorePolicy, r: &pb::Rollout, now_ms: i64) -> bool {
    decide::is_terminal(r) && r.outbox.is_empty() && policy.compaction_due(r.finished_unix_ms, now_ms)
}

/// What is kept of a saga.
pub fn saga_summary(s: &pb::InstallSaga, now_ms: i64) -> pb::SagaSummary {
    let failed = s.nodes.iter().filter(|n| n.step == pb::NodeStep::Failed as i32).count();
    pb::SagaSummary {
        saga_id: s.saga_id.clone(),
        site_id: s.site_id.clone(),
        join: s.join,
        outcome: s.outcome,
        phase: s.phase,
        reason: s.reason.clone(),
        started_unix_ms: s.started_unix_ms,
        finished_unix_ms: s.finished_unix_ms,
        nodes: u32::try_from(s.nodes.len()).unwrap_or(u32::MAX),
        nodes_failed: u32::try_from(failed).unwrap_or(u32::MAX),
        design_revision: 0,
        compacted_unix_ms: now_ms,
    }
}

/// What is kept of a rollout, with its site records (any order).
pub fn rollout_summary(r: &pb::Rollout, sites: &[pb::RolloutSite], now_ms: i64) -> pb::RolloutSummary {
    let mut failed: Vec<&str> = sites
        .iter()
        .filter(|s| !s.failed.is_empty() || s.state == pb::RolloutSiteState::TimedOut as i32)
        .map(|s| s.site_id.as_str())
        .collect();
    failed.sort_unstable();
    let more = failed.len().saturating_sub(SUMMARY_FAILED_SITES);
    failed.truncate(SUMMARY_FAILED_SITES);
    pb::RolloutSummary {
        rollout_id: r.rollout_id.clone(),
        package: r.package.clone(),
        phase: r.phase,
        reason: r.reason.clone(),
        trigger: r.trigger.clone(),
        sites: r.sites,
        sites_done: r.sites_done,
        planned_nodes: r.planned_nodes,
        patched: r.patched,
        failed: r.failed,
        timed_out_sites: r.timed_out_sites,
        started_unix_ms: r.started_unix_ms,
        finished_unix_ms: r.finished_unix_ms,
        compacted_unix_ms: now_ms,
        failed_sites: failed.into_iter().map(str::to_string).collect(),
        failed_sites_more: u32::try_from(more).unwrap_or(u32::MAX),
    }
}

/// A summary read back as the record it stands for, for readers that know only records (the
/// rollout views): phase, counters and times as they ended; no plan, no per-site detail.
pub fn rollout_from_summary(s: &pb::RolloutSummary) -> pb::Rollout {
    pb::Rollout {
        rollout_id: s.rollout_id.clone(),
        package: s.package.clone(),
        phase: s.phase,
        reason: s.reason.clone(),
        trigger: s.trigger.clone(),
        sites: s.sites,
        sites_done: s.sites_done,
        planned_nodes: s.planned_nodes,
        patched: s.patched,
        failed: s.failed,
        timed_out_sites: s.timed_out_sites,
        started_unix_ms: s.started_unix_ms,
        finished_unix_ms: s.finished_unix_ms,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn policy() -> StorePolicy {
        StorePolicy { finished_retention: Duration::from_secs(1), ..Default::default() }
    }

    fn finished_saga(finished: i64) -> pb::InstallSaga {
        pb::InstallSaga {
            saga_id: "s1".into(),
            site_id: "edge-01".into(),
            phase: pb::InstallPhase::Succeeded as i32,
            outcome: pb::InstallOutcome::Success as i32,
            started_unix_ms: 1,
            finished_unix_ms: finished,
            nodes: vec![
                pb::NodeProgress { step: pb::NodeStep::BinariesInstalled as i32, ..Default::default() },
                pb::NodeProgress { step: pb::NodeStep::Failed as i32, ..Default::default() },
            ],
            ..Default::default()
        }
    }

    #[test]
    fn a_saga_is_compacted_only_once_ended_published_and_old() {
        let s = finished_saga(1_000);
        assert!(!saga_due(&policy(), &s, 1_500));
        assert!(saga_due(&policy(), &s, 2_000));
        let running = pb::InstallSaga { phase: pb::InstallPhase::ProvisioningOs as i32, ..s.clone() };
        assert!(!saga_due(&policy(), &running, 10_000));
        let unpublished = pb::InstallSaga { outbox: vec![pb::OutboxEntry::default()], ..s.clone() };
        assert!(!saga_due(&policy(), &unpublished, 10_000));
        let summary = saga_summary(&s, 2_000);
        assert_eq!((summary.nodes, summary.nodes_failed, summary.finished_unix_ms), (2, 1, 1_000));
    }

    #[test]
    fn a_halted_rollout_is_kept_whole_a_completed_one_summarised() {
        let r = pb::Rollout {
            rollout_id: "r1".into(),
            phase: pb::RolloutPhase::Completed as i32,
            finished_unix_ms: 1_000,
            sites: 3,
            patched: 4,
            ..Default::default()
        };
        assert!(rollout_due(&policy(), &r, 2_000));
        let halted = pb::Rollout { phase: pb::RolloutPhase::Halted as i32, ..r.clone() };
        assert!(!rollout_due(&policy(), &halted, 10_000));
        let sites = [
            pb::RolloutSite { site_id: "b".into(), state: pb::RolloutSiteState::TimedOut as i32, ..Default::default() },
            pb::RolloutSite { site_id: "a".into(), failed: vec![pb::NodeResult::default()], ..Default::default() },
            pb::RolloutSite { site_id: "c".into(), state: pb::RolloutSiteState::Done as i32, ..Default::default() },
        ];
        let summary = rollout_summary(&r, &sites, 2_000);
        assert_eq!(summary.failed_sites, ["a", "b"]);
        let back = rollout_from_summary(&summary);
        assert_eq!((back.sites, back.patched, back.phase), (3, 4, r.phase));
    }
}
