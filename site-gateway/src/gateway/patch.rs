//! A site's part of a rollout (`PatchNodes`): its nodes patched batch after batch, each node's
//! outcome and a reimage's Metal3 states reported as they happen.

use std::collections::BTreeMap;

use bus_schema::domain::{NodeDesign, Package, Role};
use bus_schema::pb::{self, BusJob};
use bus_schema::runtime::{Delivery, HandlerError};
use futures::future::join_all;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::{Gateway, invalid, nodes, packages};
use crate::backend::{BackendError, PatchRequest, ProvisioningState, SiteBackend};

impl<B: SiteBackend> Gateway<B> {
    /// Patches the job's nodes batch after batch, each batch's nodes at once; once more nodes
    /// have failed than the job allows, the nodes not started yet are skipped.
    pub(super) async fn patch(&self, d: &Delivery) -> Result<(), HandlerError> {
        let job: pb::PatchNodes = d.decode()?;
        self.check_site(&job)?;
        let package = Package::try_from(job.package.unwrap_or_default()).map_err(invalid)?;
        let reinstall = reinstall_by_role(job.reinstall)?;
        let site_patched = pb::SitePatched {
            site_id: self.site.to_string(),
            rollout_id: job.rollout_id.clone(),
            plan_index: job.plan_index,
            package: Some(pb::PackageRef::from(&package.reference())),
            ..Default::default()
        };
        let nodes = nodes(job.nodes)?;
        // The package (and an os-image's reinstalled binaries) must be in the site's cache
        // first; a site that cannot get them fails every node with the reason.
        let mut needed = vec![package.clone()];
        needed.extend(reinstall.values().flatten().cloned());
        let unstaged = match self.stage_into_cache(&needed).await {
            Ok(_) => None,
            Err(e @ BackendError::Transient { .. }) => {
                return Err(HandlerError::transient("staging the patch's artifacts", e));
            }
            Err(e) => Some(e),
        };
        let mut run = PatchRun::new(nodes, job.max_unavailable, job.max_failures, site_patched);
        loop {
            let batch = run.next_batch();
            if batch.is_empty() {
                break;
            }
            // Every node of the batch runs to its end even when another's error will NAK the
            // job: a reimage abandoned halfway would only be redone on the redelivery.
            let patches = batch.iter().map(|node| {
                let reinstall = reinstall.get(&node.role).cloned().unwrap_or_default();
                let req = PatchRequest { node: node.clone(), package: package.clone(), reinstall, progress: None };
                self.patch_node(d, &job.rollout_id, req, unstaged.clone())
            });
            for (node, failure) in batch.iter().zip(join_all(patches).await) {
                run.record(node, failure?);
            }
        }
        let done = run.finish();
        info!(
            site = %self.site,
            rollout = %done.rollout_id,
            package = %package.reference().key(),
            patched = done.patched.len(),
            failed = done.failed.len(),
            skipped = done.skipped.len(),
            "site patched"
        );
        self.publish(&done, &d.envelope.derive("site_patched", None)).await
    }

    /// Patches one node and publishes what became of it: `Some(reason)` when the patch failed.
    /// A transient backend error is returned, to NAK the job: patches are idempotent and
    /// event ids derived, so the redelivery does nothing twice.
    async fn patch_node(
        &self,
        d: &Delivery,
        rollout_id: &str,
        req: PatchRequest,
        unstaged: Option<BackendError>,
    ) -> Result<Option<String>, HandlerError> {
        let node = req.node.name.as_str();
        let package = Some(pb::PackageRef::from(&req.package.reference()));
        // A reimage reports each state the host passes through, as a provisioning does.
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut req = req.clone();
        if req.package.kind == bus_schema::pb::PackageKind::OsImage {
            req.progress = Some(tx);
        } else {
            drop(tx);
        }
        let image_name = req.package.reference().key();
        let work = async {
            let result = match unstaged {
                Some(e) => Err(BackendError::permanent("artifact not staged", e)),
                None => self.backend.patch_node(&req).await,
            };
            req.progress = None;
            result
        };
        let report = |state: ProvisioningState| {
            let evt = pb::NodeOsProvisioning {
                site_id: self.site.to_string(),
                node: node.to_string(),
                state: state.as_str().to_string(),
                image: image_name.clone(),
            };
            let env = d.envelope.derive(&format!("reimage_state/{}", state.as_str()), Some(node));
            async move { self.publish(&evt, &env).await }
        };
        let relay = async {
            // From the first state of the reimage on: a host still provisioned when it starts is
            // on its old image (its "provisioned" is the reimage's end, reported once), unless
            // the reimage was done already (taken up again at its end): held back until the
            // patch says which.
            let mut begun = false;
            while let Some(state) = rx.recv().await {
                begun |= state != ProvisioningState::Provisioned;
                if begun {
                    report(state).await?;
                }
            }
            Ok::<bool, HandlerError>(begun)
        };
        let (result, relayed) = tokio::join!(work, relay);
        if !relayed? && result.as_ref().is_ok_and(|o| o.changed) && req.package.kind == pb::PackageKind::OsImage {
            report(ProvisioningState::Provisioned).await?;
        }
        match result {
            Ok(outcome) => {
                let (changed, from) = (outcome.changed, outcome.from_version.as_deref());
                debug!(site = %self.site, node, changed, from, "node patched");
                let evt = pb::NodePatched {
                    site_id: self.site.to_string(),
                    node: node.to_string(),
                    rollout_id: rollout_id.to_string(),
                    package,
                    from_version: outcome.from_version.unwrap_or_default(),
                };
                self.publish(&evt, &d.envelope.derive("node_patched", Some(node))).await?;
                Ok(None)
            }
            Err(e @ BackendError::Transient { .. }) => Err(HandlerError::transient(format!("patching {node}"), e)),
            Err(e) => {
                let reason = e.reason();
                warn!(site = %self.site, node, %reason, "node patch failed");
                let evt = pb::NodePatchFailed {
                    site_id: self.site.to_string(),
                    node: node.to_string(),
                    rollout_id: rollout_id.to_string(),
                    package,
                    reason: reason.clone(),
                };
                self.publish(&evt, &d.envelope.derive("node_patch_failed", Some(node))).await?;
                Ok(Some(reason))
            }
        }
    }
}

/// What each role installs again after a reimage.
fn reinstall_by_role(list: Vec<pb::RoleArtifacts>) -> Result<BTreeMap<Role, Vec<Package>>, HandlerError> {
    let mut by_role = BTreeMap::<Role, Vec<Package>>::new();
    for r in list {
        let role = Role::try_from(r.role).map_err(invalid)?;
        by_role.entry(role).or_default().extend(packages(r.packages)?);
    }
    Ok(by_role)
}

/// One site's part of a rollout, batch after batch: which nodes start next, and what became of
/// each. Kept apart from the I/O so its rules have plain tests.
#[derive(Debug)]
struct PatchRun {
    pending: std::vec::IntoIter<NodeDesign>,
    /// Nodes patched at once: the job's `max_unavailable`, at least 1.
    width: usize,
    /// Failures the site may have and still start nodes.
    max_failures: usize,
    done: pb::SitePatched,
}

impl PatchRun {
    fn new(nodes: Vec<NodeDesign>, max_unavailable: u32, max_failures: u32, done: pb::SitePatched) -> Self {
        let width = usize::try_from(max_unavailable.max(1)).unwrap_or(usize::MAX);
        let max_failures = usize::try_from(max_failures).unwrap_or(usize::MAX);
        Self { pending: nodes.into_iter(), width, max_failures, done }
    }

    /// The nodes to patch next, at once; empty when every node is done or skipped. Once more
    /// nodes have failed than the budget allows, every node not started is skipped.
    fn next_batch(&mut self) -> Vec<NodeDesign> {
        if self.done.failed.len() > self.max_failures {
            self.done.skipped.extend(self.pending.by_ref().map(|n| n.name.to_string()));
        }
        self.pending.by_ref().take(self.width).collect()
    }

    /// Records a node's patch: `failure` is its reason when it failed.
    fn record(&mut self, node: &NodeDesign, failure: Option<String>) {
        match failure {
            None => self.done.patched.push(node.name.to_string()),
            Some(reason) => self.done.failed.push(pb::NodeResult {
                node: node.name.to_string(),
                role: pb::Role::from(node.role) as i32,
                outcome: pb::NodeOutcome::Failed as i32,
                failed_step: pb::PatchNodes::KIND.to_string(),
                reason,
            }),
        }
    }

    fn finish(self) -> pb::SitePatched {
        self.done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(name: &str) -> NodeDesign {
        NodeDesign {
            name: name.try_into().unwrap(),
            role: Role::Worker,
            boot_mac: "52:54:00:00:01:01".to_string().try_into().unwrap(),
            bmc_address: "ipmi://10.0.1.1".to_string().try_into().unwrap(),
            labels: BTreeMap::new(),
            network: None,
            root_device: None,
            kernel_parameters: Default::default(),
        }
    }

    fn node_names(batch: &[NodeDesign]) -> Vec<&str> {
        batch.iter().map(|n| n.name.as_str()).collect()
    }

    fn run(nodes: &[&str], max_unavailable: u32, max_failures: u32) -> PatchRun {
        let nodes = nodes.iter().map(|n| worker(n)).collect();
        PatchRun::new(nodes, max_unavailable, max_failures, pb::SitePatched::default())
    }

    #[test]
    fn nodes_patch_in_batches_of_max_unavailable_and_at_least_one() {
        let mut run = run(&["a", "b", "c", "d", "e"], 2, 0);
        let mut batches = Vec::new();
        loop {
            let batch = run.next_batch();
            if batch.is_empty() {
                break;
            }
            batches.push(node_names(&batch).join(","));
            batch.iter().for_each(|n| run.record(n, None));
        }
        assert_eq!(batches, ["a,b", "c,d", "e"]);
        assert_eq!(run.finish().patched, ["a", "b", "c", "d", "e"]);

        let mut one_at_a_time = self::run(&["a", "b"], 0, 0);
        assert_eq!(node_names(&one_at_a_time.next_batch()), ["a"]);
    }

    #[test]
    fn once_failures_pass_the_budget_the_nodes_not_started_are_skipped() {
        let mut run = run(&["a", "b", "c", "d", "e"], 2, 1);
        let first = run.next_batch();
        run.record(&first[0], Some("boom".into()));
        run.record(&first[1], None);
        let second = run.next_batch();
        assert_eq!(node_names(&second), ["c", "d"], "one failure is within a budget of one");
        run.record(&second[0], Some("boom".into()));
        run.record(&second[1], None);
        assert!(run.next_batch().is_empty());
        let done = run.finish();
        assert_eq!((done.patched, done.skipped), (vec!["b".to_string(), "d".into()], vec!["e".to_string()]));
        let failed: Vec<_> = done.failed.iter().map(|f| (f.node.as_str(), f.failed_step.as_str())).collect();
        assert_eq!(failed, [("a", pb::PatchNodes::KIND), ("c", pb::PatchNodes::KIND)]);
    }
}
