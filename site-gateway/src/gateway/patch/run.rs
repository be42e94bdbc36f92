//! One site's part of a rollout as a plan of batches, and what became of each node: kept apart
//! from the I/O so its rules have plain tests.

use std::collections::VecDeque;

use bus_schema::domain::{NodeDesign, Role};
use bus_schema::pb::{self, BusJob};

/// What became of one node of the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum End {
    /// Moved to the version, and seen healthy there.
    Patched,
    /// Found at the version already: nothing was done to it.
    Unchanged,
    /// Not at the version healthy: why, and what its rollback came to when it was rolled back.
    Failed { reason: String, rollback: Option<RolledBack> },
}

/// A failed node's rollback (the rollout's `on_failure`): what it came to, in words, and whether
/// the node is healthy again at what it ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RolledBack {
    pub(crate) text: String,
    pub(crate) healthy: bool,
}

impl End {
    pub(crate) fn failed(reason: impl Into<String>) -> Self {
        End::Failed { reason: reason.into(), rollback: None }
    }
}

/// One site's part of a rollout, batch after batch: which nodes start next, and what became of
/// each. Masters go first, each alone (one etcd member down at a time); workers follow in
/// batches of `max_unavailable`. Kept apart from the I/O so its rules have plain tests.
#[derive(Debug)]
pub(super) struct PatchRun {
    pending: VecDeque<NodeDesign>,
    /// Nodes patched at once: the job's `max_unavailable`, at least 1.
    width: usize,
    /// Failures the site may have and still start nodes.
    max_failures: usize,
    done: pb::SitePatched,
}

impl PatchRun {
    pub(super) fn new(nodes: Vec<NodeDesign>, max_unavailable: u32, max_failures: u32, done: pb::SitePatched) -> Self {
        let width = usize::try_from(max_unavailable.max(1)).unwrap_or(usize::MAX);
        let max_failures = usize::try_from(max_failures).unwrap_or(usize::MAX);
        let (mut pending, workers): (VecDeque<_>, VecDeque<_>) =
            nodes.into_iter().partition(|n| n.role == Role::Master);
        pending.extend(workers);
        Self { pending, width, max_failures, done }
    }

    /// The nodes to patch next, at once; empty when every node is done or skipped. Once more
    /// nodes have failed than the budget allows, every node not started is skipped.
    pub(super) fn next_batch(&mut self) -> Vec<NodeDesign> {
        if self.done.failed.len() > self.max_failures {
            self.done.skipped.extend(self.pending.drain(..).map(|n| n.name.to_string()));
        }
        let width = match self.pending.front() {
            Some(n) if n.role == Role::Master => 1,
            _ => self.width,
        };
        let take = width.min(self.pending.len());
        self.pending.drain(..take).collect()
    }

    /// Records what became of a node.
    pub(super) fn record(&mut self, node: &NodeDesign, end: End) {
        match end {
            End::Patched => self.done.patched.push(node.name.to_string()),
            End::Unchanged => self.done.unchanged.push(node.name.to_string()),
            End::Failed { reason, rollback } => self.done.failed.push(pb::NodeResult {
                node: node.name.to_string(),
                role: pb::Role::from(node.role) as i32,
                outcome: pb::NodeOutcome::Failed as i32,
                failed_step: pb::PatchNodes::KIND.to_string(),
                reason,
                rolled_back: rollback.as_ref().is_some_and(|r| r.healthy),
                rollback: rollback.map(|r| r.text).unwrap_or_default(),
            }),
        }
    }

    pub(super) fn finish(self) -> pb::SitePatched {
        self.done
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::{disagreement_reason, unlike_the_hub};
    use super::*;
    use crate::backend::ProvisioningState as S;

    fn worker(name: &str) -> NodeDesign {
        node(name, Role::Worker)
    }

    fn node(name: &str, role: Role) -> NodeDesign {
        NodeDesign {
            name: name.try_into().unwrap(),
            role,
            boot_mac: "52:54:00:00:01:01".to_string().try_into().unwrap(),
            bmc_address: "ipmi://10.0.1.1".to_string().try_into().unwrap(),
            labels: BTreeMap::new(),
            network: None,
            root_device: None,
            kernel_parameters: Default::default(),
            cleaning: Default::default(),
        }
    }

    fn node_names(batch: &[NodeDesign]) -> Vec<&str> {
        batch.iter().map(|n| n.name.as_str()).collect()
    }

    /// Every batch the run starts, each node of it patched, as `a,b`.
    fn all_batches(run: &mut PatchRun) -> Vec<String> {
        let mut batches = Vec::new();
        loop {
            let batch = run.next_batch();
            if batch.is_empty() {
                return batches;
            }
            batches.push(node_names(&batch).join(","));
            batch.iter().for_each(|n| run.record(n, End::Patched));
        }
    }

    fn run(nodes: &[&str], max_unavailable: u32, max_failures: u32) -> PatchRun {
        let nodes = nodes.iter().map(|n| worker(n)).collect();
        PatchRun::new(nodes, max_unavailable, max_failures, pb::SitePatched::default())
    }

    #[test]
    fn a_host_missing_or_never_provisioned_is_unlike_what_the_hub_believes() {
        use pb::PackageKind::{Binary, OsImage};
        assert_eq!(unlike_the_hub(Binary, Some(S::Provisioned)), None);
        assert_eq!(unlike_the_hub(Binary, None).as_deref(), Some(""));
        assert_eq!(unlike_the_hub(Binary, Some(S::Preparing)).as_deref(), Some("preparing"));
        assert_eq!(unlike_the_hub(Binary, Some(S::Available)).as_deref(), Some("available"));
        // A reimage taken up: the old image coming off, none on, the new one going on.
        for state in [S::Deprovisioning, S::Available, S::Provisioning, S::Provisioned] {
            assert_eq!(unlike_the_hub(OsImage, Some(state)), None, "{state}");
        }
        assert_eq!(unlike_the_hub(OsImage, Some(S::Inspecting)).as_deref(), Some("inspecting"));
        let found = [
            pb::HostFound { node: "node-1".into(), state: "preparing".into() },
            pb::HostFound { node: "node-2".into(), state: String::new() },
        ];
        let reason = disagreement_reason(&found);
        assert!(reason.contains("node-1 is preparing, node-2 has no host"), "{reason}");
    }

    #[test]
    fn nodes_patch_in_batches_of_max_unavailable_and_at_least_one() {
        let mut run = run(&["a", "b", "c", "d", "e"], 2, 0);
        assert_eq!(all_batches(&mut run), ["a,b", "c,d", "e"]);
        assert_eq!(run.finish().patched, ["a", "b", "c", "d", "e"]);

        let mut one_at_a_time = self::run(&["a", "b"], 0, 0);
        assert_eq!(node_names(&one_at_a_time.next_batch()), ["a"]);
    }

    #[test]
    fn masters_go_first_and_one_at_a_time_whatever_the_width() {
        let nodes = vec![
            worker("w1"),
            node("m1", Role::Master),
            worker("w2"),
            node("m2", Role::Master),
            worker("w3"),
            node("m3", Role::Master),
        ];
        let mut run = PatchRun::new(nodes, 2, 0, pb::SitePatched::default());
        assert_eq!(all_batches(&mut run), ["m1", "m2", "m3", "w1,w2", "w3"]);
    }

    #[test]
    fn a_failed_master_past_the_budget_stops_the_rest() {
        let nodes = vec![worker("w1"), node("m1", Role::Master), node("m2", Role::Master)];
        let mut run = PatchRun::new(nodes, 3, 0, pb::SitePatched::default());
        let first = run.next_batch();
        run.record(&first[0], End::failed("not Ready"));
        assert!(run.next_batch().is_empty());
        assert_eq!(run.finish().skipped, ["m2", "w1"]);
    }

    #[test]
    fn once_failures_pass_the_budget_the_nodes_not_started_are_skipped() {
        let mut run = run(&["a", "b", "c", "d", "e"], 2, 1);
        let first = run.next_batch();
        run.record(&first[0], End::failed("boom"));
        run.record(&first[1], End::Patched);
        let second = run.next_batch();
        assert_eq!(node_names(&second), ["c", "d"], "one failure is within a budget of one");
        run.record(&second[0], End::failed("boom"));
        run.record(&second[1], End::Patched);
        assert!(run.next_batch().is_empty());
        let done = run.finish();
        assert_eq!((done.patched, done.skipped), (vec!["b".to_string(), "d".into()], vec!["e".to_string()]));
        let failed: Vec<_> = done.failed.iter().map(|f| (f.node.as_str(), f.failed_step.as_str())).collect();
        assert_eq!(failed, [("a", pb::PatchNodes::KIND), ("c", pb::PatchNodes::KIND)]);
    }
}
