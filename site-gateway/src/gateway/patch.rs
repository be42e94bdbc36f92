//! A site's part of a rollout (`PatchNodes`): its nodes patched batch after batch, masters first
//! and one at a time, each node that a patch takes down cordoned, drained, patched, seen Ready at
//! its new version and uncordoned, each step and a reimage's Metal3 states reported as they
//! happen. Nodes whose host the site does not have as the hub believes (none, or not
//! provisioned) are left alone, skipped, and said (`SiteDisagrees`).

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use bus_schema::domain::{NodeDesign, Package, Role};
use bus_schema::pb::{self, BusJob};
use bus_schema::runtime::{Delivery, HandlerError};
use futures::future::join_all;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::{Gateway, invalid, nodes, packages};
use crate::backend::{BackendError, Cordon, PatchRequest, ProvisioningState, ProvisioningState as S, SiteBackend};

/// How long a master waits for the site's other masters to be Ready before it is failed rather
/// than started: an etcd member is never taken down while another is down.
const MASTERS_READY_WAIT: Duration = Duration::from_secs(15 * 60);
const MASTERS_READY_POLL: Duration = Duration::from_secs(2);

/// Whether a patch of this kind takes the node down (a reimage, a binary's service restarting),
/// so its pods are moved off it first.
fn disruptive(kind: pb::PackageKind) -> bool {
    matches!(kind, pb::PackageKind::OsImage | pb::PackageKind::Binary)
}

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
        let (nodes, found) = self.as_the_hub_believes(nodes(job.nodes)?, package.kind).await?;
        let mut site_patched = site_patched;
        if !found.is_empty() {
            site_patched.skipped = found.iter().map(|f| f.node.clone()).collect();
            let reason = disagreement_reason(&found);
            warn!(site = %self.site, rollout = %job.rollout_id, %reason, "the site is not as the hub believes");
            let evt = pb::SiteDisagrees {
                site_id: self.site.to_string(),
                job_id: d.envelope.id.clone(),
                rollout_id: job.rollout_id.clone(),
                found,
                reason,
            };
            self.publish(&evt, &d.envelope.derive("site_disagrees", None)).await?;
        }
        let masters: Vec<String> =
            nodes.iter().filter(|n| n.role == Role::Master).map(|n| n.name.to_string()).collect();
        // The package (a chart: its render for this site; and an os-image's reinstalled
        // binaries) must be in the site's cache first; a site that cannot get them fails every
        // node with the reason.
        let (package, rendering) = match self.rendered(vec![package.clone()]).await {
            Ok(mut rendered) => (rendered.remove(0), Ok(())),
            Err(e) => (package, Err(e)),
        };
        let mut needed = vec![package.clone()];
        needed.extend(reinstall.values().flatten().cloned());
        let staged = match rendering {
            Ok(()) => self.stage_into_cache(&needed).await.map(|_| ()),
            Err(e) => Err(e),
        };
        let unstaged = match staged {
            Ok(()) => None,
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
                let req = PatchRequest {
                    node: node.clone(),
                    package: package.clone(),
                    reinstall,
                    progress: None,
                    max_unavailable: job.max_unavailable,
                };
                self.patch_node(d, &job.rollout_id, req, &masters, unstaged.clone())
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

    /// The job's nodes the site has as the hub believes, and how it found the others. Only a
    /// patch that takes a node down asks: it is sent for nodes the hub saw provisioned.
    async fn as_the_hub_believes(
        &self,
        nodes: Vec<NodeDesign>,
        kind: pb::PackageKind,
    ) -> Result<(Vec<NodeDesign>, Vec<pb::HostFound>), HandlerError> {
        if !disruptive(kind) {
            return Ok((nodes, Vec::new()));
        }
        let (mut keep, mut found) = (Vec::with_capacity(nodes.len()), Vec::new());
        for node in nodes {
            let state = match self.backend.host_state(node.name.as_str()).await {
                Ok(state) => state,
                Err(e) => return Err(HandlerError::transient(format!("looking at host {}", node.name), e)),
            };
            match unlike_the_hub(kind, state) {
                None => keep.push(node),
                Some(state) => found.push(pb::HostFound { node: node.name.to_string(), state }),
            }
        }
        Ok((keep, found))
    }

    /// Patches one node and publishes what became of it: `Some(reason)` when the patch failed.
    /// A transient backend error is returned, to NAK the job: patches are idempotent and
    /// event ids derived, so the redelivery does nothing twice.
    ///
    /// A patch that takes the node down is done on a node out of service: cordoned, drained,
    /// patched, then seen `Ready` at the new version and uncordoned, each step reported. A drain
    /// that fails leaves the node as it was (schedulable, old version) and fails it; a node not
    /// seen Ready stays cordoned and fails. A node already at the version has nothing moved off
    /// it; an earlier attempt's cordon on it is lifted once it is seen Ready.
    async fn patch_node(
        &self,
        d: &Delivery,
        rollout_id: &str,
        req: PatchRequest,
        masters: &[String],
        unstaged: Option<BackendError>,
    ) -> Result<Option<String>, HandlerError> {
        let node = req.node.name.as_str();
        let step = |what: &str, e: BackendError| match e {
            e @ BackendError::Transient { .. } => Err(HandlerError::transient(format!("{what} {node}"), e)),
            e => Ok(e.reason()),
        };
        let mut registered = false;
        if disruptive(req.package.kind) && unstaged.is_none() {
            let already = match self.backend.runs(node, &req.package).await {
                Ok(already) => already,
                Err(e) => return self.node_patch_failed(d, rollout_id, &req, step("looking at", e)?).await,
            };
            // At the version already: a job come again after its gateway died. Its node was
            // taken out of service by the first attempt if landfall's cordon is on it; then it
            // is watched and given back. Otherwise it was done, or never in the cluster.
            if already {
                registered = match self.backend.cordoned(node).await {
                    Ok(ours) => ours,
                    Err(e) => return self.node_patch_failed(d, rollout_id, &req, step("looking at", e)?).await,
                };
            } else {
                if req.node.role == Role::Master
                    && let Some(reason) = self.wait_for_masters(node, masters).await?
                {
                    return self.node_patch_failed(d, rollout_id, &req, reason).await;
                }
                match self.backend.cordon(node).await {
                    Ok(Cordon::NotInCluster) => {}
                    Ok(held) => {
                        registered = true;
                        if held == Cordon::Done {
                            self.node_step(d, "node_cordoned", node, |site, node| pb::NodeCordoned {
                                site_id: site,
                                node,
                                rollout_id: rollout_id.to_string(),
                            })
                            .await?;
                        }
                        match self.backend.drain(node).await {
                            Ok(evicted) => {
                                let evt = pb::NodeDrained {
                                    site_id: self.site.to_string(),
                                    node: node.to_string(),
                                    rollout_id: rollout_id.to_string(),
                                    evicted,
                                };
                                self.publish(&evt, &d.envelope.derive("node_drained", Some(node))).await?;
                            }
                            Err(e) => {
                                let reason = step("draining", e)?;
                                self.lift_cordon(d, rollout_id, node).await?;
                                return self.node_patch_failed(d, rollout_id, &req, reason).await;
                            }
                        }
                    }
                    Err(e) => return self.node_patch_failed(d, rollout_id, &req, step("cordoning", e)?).await,
                }
            }
        }
        let observed = async {
            if !disruptive(req.package.kind) {
                return Ok(None);
            }
            if registered && let Err(e) = self.backend.observe_patched(node, &req.package).await {
                return Ok(Some(step("watching", e)?));
            }
            self.lift_cordon(d, rollout_id, node).await?;
            Ok::<_, HandlerError>(None)
        };
        self.patch_and_report(d, rollout_id, req.clone(), unstaged, observed).await
    }

    /// Waits until every other master of the job is Ready: `Some(reason)` when the wait ends
    /// without.
    async fn wait_for_masters(&self, node: &str, masters: &[String]) -> Result<Option<String>, HandlerError> {
        let others: Vec<String> = masters.iter().filter(|m| m.as_str() != node).cloned().collect();
        let deadline = tokio::time::Instant::now() + MASTERS_READY_WAIT;
        loop {
            let down = match self.backend.not_ready(&others).await {
                Ok(down) => down,
                Err(e @ BackendError::Transient { .. }) => {
                    return Err(HandlerError::transient("asking which masters are Ready", e));
                }
                Err(e) => return Ok(Some(e.reason())),
            };
            if down.is_empty() {
                return Ok(None);
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(Some(format!(
                    "not started: master {} is not Ready, and a master is patched only while every other one is",
                    down.join(", ")
                )));
            }
            info!(site = %self.site, node, waiting_for = ?down, "a master waits for the others to be Ready");
            tokio::time::sleep(MASTERS_READY_POLL).await;
        }
    }

    /// Makes the node schedulable again when landfall had cordoned it, and says so (`rollout_id`
    /// empty for a node's removal or reprovision).
    pub(super) async fn lift_cordon(&self, d: &Delivery, rollout_id: &str, node: &str) -> Result<(), HandlerError> {
        match self.backend.uncordon(node).await {
            Ok(true) => {
                self.node_step(d, "node_uncordoned", node, |site, node| pb::NodeUncordoned {
                    site_id: site,
                    node,
                    rollout_id: rollout_id.to_string(),
                })
                .await
            }
            Ok(false) => Ok(()),
            Err(e @ BackendError::Transient { .. }) => Err(HandlerError::transient(format!("uncordoning {node}"), e)),
            Err(e) => {
                warn!(site = %self.site, node, reason = %e.reason(), "cannot uncordon");
                Ok(())
            }
        }
    }

    pub(super) async fn node_step<E: bus_schema::BusEvent>(
        &self,
        d: &Delivery,
        name: &str,
        node: &str,
        make: impl FnOnce(String, String) -> E,
    ) -> Result<(), HandlerError> {
        let evt = make(self.site.to_string(), node.to_string());
        self.publish(&evt, &d.envelope.derive(name, Some(node))).await
    }

    /// Publishes the node's failure.
    async fn node_patch_failed(
        &self,
        d: &Delivery,
        rollout_id: &str,
        req: &PatchRequest,
        reason: String,
    ) -> Result<Option<String>, HandlerError> {
        let node = req.node.name.as_str();
        warn!(site = %self.site, node, %reason, "node patch failed");
        let evt = pb::NodePatchFailed {
            site_id: self.site.to_string(),
            node: node.to_string(),
            rollout_id: rollout_id.to_string(),
            package: Some(pb::PackageRef::from(&req.package.reference())),
            reason: reason.clone(),
        };
        self.publish(&evt, &d.envelope.derive("node_patch_failed", Some(node))).await?;
        Ok(Some(reason))
    }

    /// Runs the patch itself, relaying a reimage's Metal3 states, then `observed` (which says
    /// why the node was not seen at its new version, if it was not), and reports the node
    /// patched or failed.
    async fn patch_and_report(
        &self,
        d: &Delivery,
        rollout_id: &str,
        req: PatchRequest,
        unstaged: Option<BackendError>,
        observed: impl Future<Output = Result<Option<String>, HandlerError>>,
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
        let result = match result {
            Ok(outcome) => match observed.await? {
                None => Ok(outcome),
                Some(reason) => Err(BackendError::permanent_reason(reason)),
            },
            Err(e) => Err(e),
        };
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
            Err(e) => self.node_patch_failed(d, rollout_id, &req, e.reason()).await,
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

/// How a host found in `state` (`None`: no such host) differs from what the hub believes of a
/// node it sends a patch of `kind` for, as the site would say it; `None` when it does not. A
/// binary goes on a provisioned host; an image may also find its host taking the old image
/// off or the new one on (a reimage taken up after its gateway stopped).
fn unlike_the_hub(kind: pb::PackageKind, state: Option<S>) -> Option<String> {
    match (kind, state) {
        (_, None) => Some(String::new()),
        (_, Some(S::Provisioned | S::ExternallyProvisioned)) => None,
        (pb::PackageKind::OsImage, Some(S::Deprovisioning | S::Available | S::Provisioning)) => None,
        (_, Some(state)) => Some(state.as_str().to_string()),
    }
}

/// What the site found, in a sentence.
fn disagreement_reason(found: &[pb::HostFound]) -> String {
    let each: Vec<String> = found
        .iter()
        .map(|f| match f.state.as_str() {
            "" => format!("{} has no host", f.node),
            state => format!("{} is {state}", f.node),
        })
        .collect();
    format!(
        "the site does not have these nodes as the hub believes: {}; they were left alone (the site's \
         state lost, or hosts changed by hand?): reinstall or reprovision them",
        each.join(", ")
    )
}

/// One site's part of a rollout, batch after batch: which nodes start next, and what became of
/// each. Masters go first, each alone (one etcd member down at a time); workers follow in
/// batches of `max_unavailable`. Kept apart from the I/O so its rules have plain tests.
#[derive(Debug)]
struct PatchRun {
    pending: VecDeque<NodeDesign>,
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
        let (mut pending, workers): (VecDeque<_>, VecDeque<_>) =
            nodes.into_iter().partition(|n| n.role == Role::Master);
        pending.extend(workers);
        Self { pending, width, max_failures, done }
    }

    /// The nodes to patch next, at once; empty when every node is done or skipped. Once more
    /// nodes have failed than the budget allows, every node not started is skipped.
    fn next_batch(&mut self) -> Vec<NodeDesign> {
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
            batch.iter().for_each(|n| run.record(n, None));
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
        run.record(&first[0], Some("not Ready".into()));
        assert!(run.next_batch().is_empty());
        assert_eq!(run.finish().skipped, ["m2", "w1"]);
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
