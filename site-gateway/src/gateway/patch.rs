//! A site's part of a rollout (`PatchNodes`): its nodes patched batch after batch, masters first
//! and one at a time, each node that a patch takes down cordoned, drained, patched, seen Ready at
//! its new version and uncordoned, each step reported (as it happens once the node has been out
//! of service for a while, in the node's report otherwise: see [`steps`]), each node's report
//! (on its own once the job has run for a while, in the site's report otherwise: see
//! [`reports`]) and a reimage's Metal3 states as they happen. Nodes whose host the site does not
//! have as the hub believes (none, or not provisioned) are left alone, skipped, and said
//! (`SiteDisagrees`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bus_schema::domain::{NodeDesign, Package, Role};
use bus_schema::pb;
use bus_schema::runtime::{Delivery, HandlerError};
use futures::future::join_all;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::{Gateway, invalid, nodes, packages};
use bus_schema::envelope::Envelope;
use record::JobRecord;
use reports::Reports;
use run::{End, PatchRun, RolledBack};
use steps::{Step, Steps};

mod record;
mod reports;
mod run;
mod steps;
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

/// Who a node's patch is for: the rollout's move, or putting a failed node back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    /// `found_at`: the node ran the version before the job came (see `found_at_version`).
    Patch { found_at: bool },
    /// Back to what it ran, after the patch to `failed` failed on it.
    RollBack,
}

/// The job's packages per node: where each goes, and what it goes back to when it fails.
struct PerNode {
    targets: BTreeMap<String, Package>,
    previous: BTreeMap<String, Package>,
}

impl PerNode {
    /// Reads the job's `targets` and, with `on_failure` ROLL_BACK, `previous` (each in the order
    /// of `nodes`; an entry with no name: nothing).
    fn of(job: &pb::PatchNodes, nodes: &[NodeDesign]) -> Result<Self, HandlerError> {
        let by_node = |list: &[pb::Package]| -> Result<BTreeMap<String, Package>, HandlerError> {
            let mut out = BTreeMap::new();
            for (node, p) in nodes.iter().zip(list) {
                if !p.name.is_empty() {
                    out.insert(node.name.to_string(), Package::try_from(p.clone()).map_err(invalid)?);
                }
            }
            Ok(out)
        };
        let rolls_back = job.on_failure == pb::OnNodeFailure::RollBack as i32;
        Ok(Self {
            targets: by_node(&job.targets)?,
            previous: if rolls_back { by_node(&job.previous)? } else { BTreeMap::new() },
        })
    }

    /// Every package the job may put on a node, once each, `package` first.
    fn all(&self, package: &Package) -> Vec<Package> {
        let mut out = vec![package.clone()];
        for p in self.targets.values().chain(self.previous.values()) {
            if !out.iter().any(|o| o.reference() == p.reference()) {
                out.push(p.clone());
            }
        }
        out
    }
}

impl<B: SiteBackend> Gateway<B> {
    /// Patches the job's nodes batch after batch, each batch's nodes at once; once more nodes
    /// have failed than the job allows, the nodes not started yet are skipped. A node that fails
    /// is put back to what it ran when the job says so (`on_failure`).
    pub(super) async fn patch(&self, d: &Delivery) -> Result<(), HandlerError> {
        let job: pb::PatchNodes = d.decode()?;
        self.check_site(&job)?;
        let package = Package::try_from(job.package.clone().unwrap_or_default()).map_err(invalid)?;
        let all_nodes = nodes(job.nodes.clone())?;
        let per_node = PerNode::of(&job, &all_nodes)?;
        let reinstall = reinstall_by_role(job.reinstall)?;
        let site_patched = pb::SitePatched {
            site_id: self.site.to_string(),
            rollout_id: job.rollout_id.clone(),
            plan_index: job.plan_index,
            package: Some(pb::PackageRef::from(&package.reference())),
            ..Default::default()
        };
        let (nodes, found) = self.as_the_hub_believes(all_nodes, package.kind).await?;
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
        // The packages (a chart: its render for this site; and an os-image's reinstalled
        // binaries) must be in the site's cache first; a site that cannot get them fails every
        // node with the reason.
        let wanted = per_node.all(&package);
        let (rendered, rendering) = match self.rendered(wanted.clone()).await {
            Ok(rendered) => (rendered, Ok(())),
            Err(e) => (wanted, Err(e)),
        };
        let mut needed = rendered.clone();
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
        let as_rendered = |p: &Package| rendered.iter().find(|r| r.reference() == p.reference()).cloned();
        let request = |node: &NodeDesign, package: Package| PatchRequest {
            node: node.clone(),
            package,
            reinstall: reinstall.get(&node.role).cloned().unwrap_or_default(),
            progress: None,
            max_unavailable: job.max_unavailable,
        };
        let (moved, found_at) = self.found_at_version(&d.envelope.id, &nodes, &package, &per_node).await?;
        let mut run = PatchRun::new(nodes, job.max_unavailable, job.max_failures, site_patched);
        // A job tried again sends its nodes' reports on their own: the attempt before may have sent
        // some already, and alone they are copies of those, dropped by their ids.
        let shown = self.steps_shown_after.is_zero() || moved.left_by_an_earlier_attempt();
        let reports = Reports::new(&moved, shown);
        let batches = async {
            loop {
                let batch = run.next_batch();
                if batch.is_empty() {
                    return Ok::<_, HandlerError>(());
                }
                // Every node of the batch runs to its end even when another's error will NAK the
                // job: a reimage abandoned halfway would only be redone on the redelivery.
                let patches = batch.iter().map(|node| {
                    let name = node.name.as_str();
                    let to = per_node.targets.get(name).unwrap_or(&package);
                    let req = request(node, as_rendered(to).unwrap_or_else(|| to.clone()));
                    let back =
                        per_node.previous.get(name).map(|p| request(node, as_rendered(p).unwrap_or_else(|| p.clone())));
                    let (env, rollout, masters, unstaged) = (&d.envelope, &job.rollout_id, &masters, unstaged.clone());
                    let steps = Steps::held(env, rollout, name, &reports);
                    let purpose = Purpose::Patch { found_at: found_at.contains(name) };
                    async move {
                        let end = self.patch_node(env, rollout, req.clone(), masters, unstaged, purpose, steps).await?;
                        match (end, back) {
                            (NodeEnd::Failed { reason, tried: true }, Some(back)) => {
                                self.roll_back(env, rollout, &req, back, masters, reason).await
                            }
                            (end, _) => Ok(end.into()),
                        }
                    }
                });
                for (node, end) in batch.iter().zip(join_all(patches).await) {
                    run.record(node, end?);
                }
            }
        };
        let ended = tokio::select! {
            ended = batches => ended,
            never = reports.show_when_long(self) => match never {},
        };
        if let Err(e) = ended {
            // The job goes back to be tried again: the reports of the nodes done are said now.
            if let Err(e) = reports.show(self).await {
                warn!(site = %self.site, error = %e, "cannot send the nodes' reports before the job is tried again");
            }
            return Err(e);
        }
        let mut done = run.finish();
        done.nodes = reports.for_site_report().await;
        info!(
            site = %self.site,
            rollout = %done.rollout_id,
            package = %package.reference().key(),
            patched = done.patched.len(),
            unchanged = done.unchanged.len(),
            failed = done.failed.len(),
            skipped = done.skipped.len(),
            "site patched"
        );
        self.publish(&done, &d.envelope.derive("site_patched", None)).await?;
        // Noted done before its record goes: a kill between them leaves one or the other.
        self.done_jobs().note(&d.envelope.id);
        if let Err(e) = moved.forget() {
            warn!(site = %self.site, error = %e, "cannot remove the job's record of moved nodes");
        }
        Ok(())
    }

    /// The job's record ([`record`]) of the nodes it sets out to move, with every node not at its
    /// version (or moved by an earlier delivery) in it, on disk before anything changes; and the nodes
    /// at their version before the job came, which are left and reported unchanged. A chart is
    /// never found so: its render, not its version, says whether it changes.
    async fn found_at_version(
        &self,
        job_id: &str,
        nodes: &[NodeDesign],
        package: &Package,
        per_node: &PerNode,
    ) -> Result<(JobRecord, BTreeSet<String>), HandlerError> {
        let record = |e: std::io::Error| HandlerError::transient("keeping the job's record of moved nodes", e);
        let mut moved = JobRecord::open(self.cache.dir(), job_id).map_err(record)?;
        let (mut found_at, mut to_move) = (BTreeSet::new(), Vec::new());
        for node in nodes {
            let name = node.name.as_str();
            let target = per_node.targets.get(name).unwrap_or(package);
            let at = match target.kind {
                pb::PackageKind::HelmChart => false,
                _ => match self.backend.runs(name, target).await {
                    Ok(at) => at,
                    Err(e @ BackendError::Transient { .. }) => {
                        return Err(HandlerError::transient(format!("looking at {name}"), e));
                    }
                    // Its patch finds the same, and says so.
                    Err(_) => false,
                },
            };
            if at && !moved.has(name) {
                found_at.insert(name.to_string());
            } else {
                to_move.push(name.to_string());
            }
        }
        moved.record(&to_move).map_err(record)?;
        Ok((moved, found_at))
    }

    /// Puts a node whose patch (`failed`, for `reason`) failed back to what it ran (`back`), as
    /// any patch is done (out of service, then seen healthy), each step an event of its own
    /// (ids derived from the job's for the node's rollback), and says what became of it.
    async fn roll_back(
        &self,
        env: &Envelope,
        rollout_id: &str,
        failed: &PatchRequest,
        back: PatchRequest,
        masters: &[String],
        reason: String,
    ) -> Result<End, HandlerError> {
        let node = back.node.name.as_str();
        let to = back.package.version.to_string();
        info!(site = %self.site, node, rollout = rollout_id, to = %to, %reason, "rolling the node back");
        let base = env.derive("rollback", Some(node));
        let steps = Steps::shown(&base, rollout_id, node);
        let end = self.patch_node(&base, rollout_id, back.clone(), masters, None, Purpose::RollBack, steps).await?;
        let rollback = match end {
            NodeEnd::Patched | NodeEnd::Unchanged => {
                let evt = pb::NodeRolledBack {
                    site_id: self.site.to_string(),
                    node: node.to_string(),
                    rollout_id: rollout_id.to_string(),
                    package: Some(pb::PackageRef::from(&back.package.reference())),
                    failed_version: failed.package.version.to_string(),
                    reason: reason.clone(),
                };
                self.publish(&evt, &base.derive("node_rolled_back", Some(node))).await?;
                RolledBack { text: format!("rolled back to {to}, healthy again"), healthy: true }
            }
            NodeEnd::Failed { reason: why, .. } => {
                warn!(site = %self.site, node, %why, "the node's rollback failed");
                let evt = pb::NodeRollbackFailed {
                    site_id: self.site.to_string(),
                    node: node.to_string(),
                    rollout_id: rollout_id.to_string(),
                    package: Some(pb::PackageRef::from(&back.package.reference())),
                    reason: why.clone(),
                };
                self.publish(&evt, &base.derive("node_rollback_failed", Some(node))).await?;
                RolledBack { text: format!("rollback to {to} failed: {why}"), healthy: false }
            }
        };
        Ok(End::Failed { reason, rollback: Some(rollback) })
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
    /// patched, then seen `Ready` at the new version and uncordoned, each step reported (see
    /// [`steps`]: a rollback's on their own from the first). A drain that fails leaves the node
    /// as it was (schedulable, old version) and fails it; a node not seen Ready stays cordoned and
    /// fails. A node already at the version has nothing moved off it; an earlier attempt's cordon
    /// on it is lifted once it is seen Ready.
    #[allow(clippy::too_many_arguments)]
    async fn patch_node(
        &self,
        env: &Envelope,
        rollout_id: &str,
        req: PatchRequest,
        masters: &[String],
        unstaged: Option<BackendError>,
        purpose: Purpose,
        steps: Steps<'_>,
    ) -> Result<NodeEnd, HandlerError> {
        let end = tokio::select! {
            end = self.patch_node_with(env, rollout_id, &req, masters, unstaged, purpose, &steps) => end,
            never = steps.show_when_long(self) => match never {},
        };
        // The job goes back to be tried again, from the node as the next attempt finds it: what
        // was done to it so far is said now, not held for a report that will not come.
        if end.is_err()
            && let Err(e) = steps.show(self).await
        {
            warn!(site = %self.site, node = %req.node.name, error = %e, "cannot send a node's steps before the job is tried again");
        }
        end
    }

    /// [`Self::patch_node`], its steps taken through `steps`.
    #[allow(clippy::too_many_arguments)]
    async fn patch_node_with(
        &self,
        env: &Envelope,
        rollout_id: &str,
        req: &PatchRequest,
        masters: &[String],
        unstaged: Option<BackendError>,
        purpose: Purpose,
        steps: &Steps<'_>,
    ) -> Result<NodeEnd, HandlerError> {
        let node = req.node.name.as_str();
        let step = |what: &str, e: BackendError| match e {
            e @ BackendError::Transient { .. } => Err(HandlerError::transient(format!("{what} {node}"), e)),
            e => Ok(e.reason()),
        };
        let mut registered = false;
        if disruptive(req.package.kind) && unstaged.is_none() {
            let already = match self.backend.runs(node, &req.package).await {
                Ok(already) => already,
                Err(e) => return self.not_started(env, rollout_id, req, purpose, steps, step("looking at", e)?).await,
            };
            // At the version already: a job come again after its gateway died. Its node was
            // taken out of service by the first attempt if landfall's cordon is on it; then it
            // is watched and given back. Otherwise it was done, or never in the cluster.
            if already {
                registered = match self.backend.cordoned(node).await {
                    Ok(ours) => ours,
                    Err(e) => {
                        return self.not_started(env, rollout_id, req, purpose, steps, step("looking at", e)?).await;
                    }
                };
                // The earlier attempt may have sent the cordon on its own: so is the uncordon.
                if registered {
                    steps.show(self).await?;
                }
            } else {
                if req.node.role == Role::Master
                    && let Some(reason) = self.wait_for_masters(node, masters).await?
                {
                    return self.not_started(env, rollout_id, req, purpose, steps, reason).await;
                }
                match self.backend.cordon(node).await {
                    Ok(Cordon::NotInCluster) => {}
                    Ok(held) => {
                        registered = true;
                        if held == Cordon::Done {
                            steps.took(self, Step::Cordoned).await?;
                        }
                        match self.backend.drain(node).await {
                            Ok(evicted) => steps.took(self, Step::Drained { evicted }).await?,
                            Err(e) => {
                                let reason = step("draining", e)?;
                                self.give_back(node, steps).await?;
                                return self.not_started(env, rollout_id, req, purpose, steps, reason).await;
                            }
                        }
                    }
                    Err(e) => {
                        return self.not_started(env, rollout_id, req, purpose, steps, step("cordoning", e)?).await;
                    }
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
            self.give_back(node, steps).await?;
            Ok::<_, HandlerError>(None)
        };
        self.patch_and_report(env, rollout_id, req.clone(), unstaged, observed, purpose, steps).await
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

    /// Makes a node of a patch schedulable again when landfall had cordoned it: a step of
    /// `steps`. An uncordon that fails transiently is tried again with the job; otherwise it is
    /// said and left.
    async fn give_back(&self, node: &str, steps: &Steps<'_>) -> Result<(), HandlerError> {
        match self.backend.uncordon(node).await {
            Ok(true) => steps.took(self, Step::Uncordoned).await,
            Ok(false) => Ok(()),
            Err(e @ BackendError::Transient { .. }) => Err(HandlerError::transient(format!("uncordoning {node}"), e)),
            Err(e) => {
                warn!(site = %self.site, node, reason = %e.reason(), "cannot uncordon");
                Ok(())
            }
        }
    }

    /// Makes the node schedulable again when landfall had cordoned it, and says so (`rollout_id`
    /// empty for a node's removal or reprovision).
    pub(super) async fn lift_cordon(&self, env: &Envelope, rollout_id: &str, node: &str) -> Result<(), HandlerError> {
        self.give_back(node, &Steps::shown(env, rollout_id, node)).await
    }

    pub(super) async fn node_step<E: bus_schema::BusEvent>(
        &self,
        env: &Envelope,
        name: &str,
        node: &str,
        make: impl FnOnce(String, String) -> E,
    ) -> Result<(), HandlerError> {
        let evt = make(self.site.to_string(), node.to_string());
        self.publish(&evt, &env.derive(name, Some(node))).await
    }

    /// A node failed before its patch started: nothing changed on it.
    async fn not_started(
        &self,
        env: &Envelope,
        rollout_id: &str,
        req: &PatchRequest,
        purpose: Purpose,
        steps: &Steps<'_>,
        reason: String,
    ) -> Result<NodeEnd, HandlerError> {
        self.node_patch_failed(env, rollout_id, req, purpose, steps, reason.clone()).await?;
        Ok(NodeEnd::Failed { reason, tried: false })
    }

    /// Publishes the node's failure, with its steps held so far (a rollback's is said by
    /// [`Self::roll_back`]).
    async fn node_patch_failed(
        &self,
        env: &Envelope,
        rollout_id: &str,
        req: &PatchRequest,
        purpose: Purpose,
        steps: &Steps<'_>,
        reason: String,
    ) -> Result<(), HandlerError> {
        let node = req.node.name.as_str();
        warn!(site = %self.site, node, %reason, ?purpose, "node patch failed");
        if purpose == Purpose::RollBack {
            return Ok(());
        }
        steps.show_reports(self).await?;
        let evt = pb::NodePatchFailed {
            site_id: self.site.to_string(),
            node: node.to_string(),
            rollout_id: rollout_id.to_string(),
            package: Some(pb::PackageRef::from(&req.package.reference())),
            reason,
            steps: steps.for_report().await,
        };
        self.publish(&evt, &env.derive("node_patch_failed", Some(node))).await
    }

    /// Runs the patch itself, relaying a reimage's Metal3 states, then `observed` (which says
    /// why the node was not seen at its new version, if it was not), and reports the node
    /// patched or failed, with its steps held so far.
    #[allow(clippy::too_many_arguments)]
    async fn patch_and_report(
        &self,
        env: &Envelope,
        rollout_id: &str,
        req: PatchRequest,
        unstaged: Option<BackendError>,
        observed: impl Future<Output = Result<Option<String>, HandlerError>>,
        purpose: Purpose,
        steps: &Steps<'_>,
    ) -> Result<NodeEnd, HandlerError> {
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
        // A patch whose artifacts never reached the site changed nothing there.
        let tried = unstaged.is_none();
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
            let env = env.derive(&format!("reimage_state/{}", state.as_str()), Some(node));
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
                // At the version before the job came, and nothing done now either.
                let unchanged = !changed && matches!(purpose, Purpose::Patch { found_at: true });
                debug!(site = %self.site, node, changed, unchanged, from, ?purpose, "node patched");
                if purpose != Purpose::RollBack {
                    let evt = pb::NodePatched {
                        site_id: self.site.to_string(),
                        node: node.to_string(),
                        rollout_id: rollout_id.to_string(),
                        package,
                        from_version: outcome.from_version.unwrap_or_default(),
                        unchanged,
                        steps: steps.for_report().await,
                    };
                    steps.report(self, evt, env.derive("node_patched", Some(node))).await?;
                }
                Ok(if unchanged { NodeEnd::Unchanged } else { NodeEnd::Patched })
            }
            Err(e @ BackendError::Transient { .. }) => Err(HandlerError::transient(format!("patching {node}"), e)),
            Err(e) => {
                let reason = e.reason();
                self.node_patch_failed(env, rollout_id, &req, purpose, steps, reason.clone()).await?;
                Ok(NodeEnd::Failed { reason, tried })
            }
        }
    }
}

/// What one patch of a node came to.
#[derive(Debug)]
enum NodeEnd {
    Patched,
    Unchanged,
    /// `tried`: the patch itself ran (it may have changed the node), rather than a step before it.
    Failed {
        reason: String,
        tried: bool,
    },
}

impl From<NodeEnd> for End {
    fn from(end: NodeEnd) -> End {
        match end {
            NodeEnd::Patched => End::Patched,
            NodeEnd::Unchanged => End::Unchanged,
            NodeEnd::Failed { reason, .. } => End::failed(reason),
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
