//! The InstallSite saga, as pure functions: given the saga's state and one input, decide the
//! next state and the messages to publish. No I/O here; [`crate::orchestrator`] executes.
//!
//! Messages to publish go into the saga's outbox together with the state change, in one
//! compare-and-set write, so a crash between deciding and publishing loses nothing: whoever
//! touches the saga next publishes the outbox (with the same message ids) first.

use std::collections::BTreeMap;

use bus_schema::domain::{Package, Role, SiteDesign};
use bus_schema::envelope::Envelope;
use bus_schema::pb::{self, BusEvent, BusJob, InstallPhase, NodeStep};

use crate::decision::outbox_entry;

/// Why an InstallSite cannot start.
pub use crate::decision::Refusal;

/// A fact that moves an install forward.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    Staged,
    OsState { node: String, state: String },
    OsProvisioned { node: String },
    NodeFailed { node: String, step: String, reason: String },
    BinariesInstalled { node: String },
    ClusterReady(pb::ClusterReady),
    KubeconfigStored,
    ContainersApplied,
    JobFailed { job: String, reason: String },
}

impl Input {
    /// The node the input is about, when it is about one.
    pub fn node(&self) -> Option<&str> {
        match self {
            Input::OsState { node, .. }
            | Input::OsProvisioned { node }
            | Input::NodeFailed { node, .. }
            | Input::BinariesInstalled { node } => Some(node),
            _ => None,
        }
    }

    /// The phase in which this input is expected.
    fn phase(&self) -> InstallPhase {
        match self {
            Input::Staged => InstallPhase::Staging,
            Input::OsState { .. } | Input::OsProvisioned { .. } => InstallPhase::ProvisioningOs,
            Input::NodeFailed { step, .. } if step == pb::ProvisionOs::KIND => InstallPhase::ProvisioningOs,
            Input::NodeFailed { .. } | Input::BinariesInstalled { .. } | Input::ClusterReady(_) => {
                InstallPhase::InstallingBinaries
            }
            Input::KubeconfigStored => InstallPhase::CollectingKubeconfig,
            Input::ContainersApplied => InstallPhase::ApplyingContainers,
            Input::JobFailed { .. } => InstallPhase::Unspecified,
        }
    }
}

/// What to do with an input.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Write this state (its outbox holds what to publish).
    Apply(Box<pb::InstallSaga>),
    /// Nothing to do: already applied, or stale.
    Ignore,
    /// It belongs to a later phase than the saga is in (e.g. the kubeconfig arrived before
    /// `ClusterReady` was processed): try again shortly.
    Wait,
}

/// The packages a site install needs, resolved against the catalog, by role.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub packages: BTreeMap<String, pb::Package>,
}

/// Resolves a design's packages against the catalog: every package must exist, and every
/// role that has nodes must have exactly one os-image.
pub fn resolve(design: &SiteDesign, catalog: &BTreeMap<String, Package>) -> Result<Resolved, Refusal> {
    let mut packages = BTreeMap::new();
    for p in design.all_packages() {
        let Some(entry) = catalog.get(&p.key()) else {
            return Err(Refusal {
                code: pb::RejectCode::UnknownPackage,
                reason: format!("package {} is not in the catalog (register it first)", p.key()),
            });
        };
        packages.insert(p.key(), pb::Package::from(entry));
    }
    for role in [Role::Master, Role::Worker] {
        if !design.nodes.iter().any(|n| n.role == role) {
            continue;
        }
        let images = design
            .packages_for(role)
            .iter()
            .filter(|p| catalog.get(&p.key()).is_some_and(|e| e.kind == pb::PackageKind::OsImage))
            .count();
        if images != 1 {
            return Err(Refusal {
                code: pb::RejectCode::Invalid,
                reason: format!("the {} package set must hold exactly one os-image, it holds {images}", role.as_str()),
            });
        }
    }
    Ok(Resolved { packages })
}

fn push_event<E: BusEvent>(saga: &mut pb::InstallSaga, evt: &E, env: &Envelope) {
    saga.outbox.push(outbox_entry(evt.subject(), evt, env));
}

fn push_job<J: BusJob>(saga: &mut pb::InstallSaga, job: &J, env: &Envelope, nodes: Vec<String>) {
    saga.outbox.push(outbox_entry(job.subject(), job, env));
    saga.jobs.push(pb::SentJob { id: env.id.clone(), kind: J::KIND.into(), nodes });
}

/// Whether `site` may have the BMC credentials of `node` for job `job_id` of this saga: the
/// saga is the site's and still running, it sent that job to provision that node's OS, and the
/// node is being provisioned now. A site holds only its own jobs, and a job's grant ends with
/// its step.
///
/// # Errors
/// Why not, for the declined request.
pub fn bmc_grant(saga: &pb::InstallSaga, site: &str, node: &str, job_id: &str) -> Result<(), String> {
    if saga.site_id != site {
        return Err(format!("saga {} is not site {site}'s", saga.saga_id));
    }
    if is_terminal(saga) {
        return Err(format!("saga {} has ended", saga.saga_id));
    }
    let provisions =
        |j: &pb::SentJob| j.id == job_id && j.kind == pb::ProvisionOs::KIND && j.nodes.iter().any(|n| n == node);
    if !saga.jobs.iter().any(provisions) {
        return Err(format!("saga {} sent no job {job_id} provisioning node {node}", saga.saga_id));
    }
    let step = saga.nodes.iter().find(|n| n.node.as_ref().is_some_and(|s| s.name == node)).map_or(0, |n| n.step);
    if step != NodeStep::OsProvisioning as i32 {
        return Err(format!("node {node} is not being provisioned"));
    }
    Ok(())
}

/// Whether a site's report, on a subject naming `site` and caused by `cause`, answers a job this
/// saga sent that site: a job of a kind in `answers` (from the report's row in
/// `bus_schema::trust`), for a node of the saga when it names one. A site holds only the jobs sent
/// to it, so anything else is a forgery: another site's saga, a node it was not asked about, a
/// job it never got.
///
/// # Errors
/// The reason, for the report's `FORBIDDEN` rejection.
pub fn check_answer(
    saga: &pb::InstallSaga,
    site: &str,
    answers: &[&str],
    node: Option<&str>,
    cause: &Envelope,
) -> Result<(), String> {
    if saga.site_id != site {
        return Err(format!("saga {} is site {}'s, not site {site}'s", saga.saga_id, saga.site_id));
    }
    if let Some(node) = node
        && !saga.nodes.iter().any(|n| n.node.as_ref().is_some_and(|s| s.name == node))
    {
        return Err(format!("saga {} has no node {node}", saga.saga_id));
    }
    if answers.is_empty() {
        return Ok(());
    }
    match saga.jobs.iter().find(|j| j.id == cause.causation) {
        Some(job)
            if let Some(node) = node
                && !job.nodes.is_empty()
                && !job.nodes.iter().any(|n| n == node) =>
        {
            Err(format!("the {} job {} is not about node {node}", job.kind, job.id))
        }
        Some(job) if answers.contains(&job.kind.as_str()) => Ok(()),
        Some(job) => Err(format!("a {} job is not answered by this report", job.kind)),
        None => Err(format!("saga {} sent site {site} no job {}", saga.saga_id, cause.causation)),
    }
}

fn packages_of(saga: &pb::InstallSaga, kind: pb::PackageKind) -> Vec<pb::Package> {
    let mut seen = std::collections::BTreeSet::new();
    saga.packages.values().filter(|p| p.kind == kind as i32 && seen.insert(p.sha256.clone())).cloned().collect()
}

fn role_of(n: &pb::NodeProgress) -> i32 {
    n.node.as_ref().map_or(0, |s| s.role)
}

fn name_of(n: &pb::NodeProgress) -> &str {
    n.node.as_ref().map_or("", |s| s.name.as_str())
}

/// The new saga for an accepted InstallSite, with `SiteInstallStarted` and the
/// `StageArtifacts` job in its outbox.
pub fn start(cmd: &Envelope, design: &SiteDesign, resolved: Resolved, now_ms: i64) -> pb::InstallSaga {
    let design_pb = pb::SiteDesign::from(design);
    let site = design.site.to_string();
    let stage = stage_job(site.clone(), &resolved);
    let mut saga = pb::InstallSaga {
        saga_id: cmd.id.clone(),
        site_id: site.clone(),
        phase: InstallPhase::Staging as i32,
        nodes: design_pb
            .nodes
            .iter()
            .map(|n| pb::NodeProgress { node: Some(n.clone()), step: NodeStep::Pending as i32, ..Default::default() })
            .collect(),
        packages: resolved.packages.into_iter().collect(),
        started_unix_ms: now_ms,
        phase_started_unix_ms: now_ms,
        traceparent: cmd.traceparent.clone(),
        design: Some(design_pb.clone()),
        ..Default::default()
    };
    let started = pb::SiteInstallStarted { site_id: site.clone(), nodes: design_pb.nodes };
    push_event(&mut saga, &started, &cmd.derive("install_started", None));
    push_job(&mut saga, &stage, &cmd.derive("stage_artifacts", None), vec![]);
    saga
}

/// The job that stages every artifact of a resolved design, each once.
pub fn stage_job(site: String, resolved: &Resolved) -> pb::StageArtifacts {
    let mut artifacts: Vec<pb::Package> = resolved.packages.values().cloned().collect();
    artifacts.sort_by(|a, b| a.sha256.cmp(&b.sha256));
    artifacts.dedup_by(|a, b| a.sha256 == b.sha256);
    pb::StageArtifacts { site_id: site, artifacts }
}

/// The saga of a node joining an installed site's cluster (NodeAdded): `design` is the site's
/// design with the node in it. Its outbox holds `NodeAccepted` and the `StageArtifacts` job;
/// then the node's OS, its binaries joining the running cluster, and `NodeReady`.
/// `hardware` is what the host's inspection found, passed on in `NodeAccepted`.
pub fn start_join(
    cmd: &Envelope,
    design: &SiteDesign,
    node: &str,
    hardware: Option<pb::HostHardware>,
    resolved: Resolved,
    now_ms: i64,
) -> pb::InstallSaga {
    let mut saga = start(cmd, design, resolved, now_ms);
    saga.join = true;
    saga.nodes.retain(|n| name_of(n) == node);
    let spec = saga.nodes.first().and_then(|n| n.node.clone());
    let accepted = pb::NodeAccepted { site_id: saga.site_id.clone(), node: spec, joining: true, hardware };
    saga.outbox[0] = outbox_entry(accepted.subject(), &accepted, &cmd.derive("node_accepted", None));
    saga
}

/// Whether the saga has ended.
pub fn is_terminal(saga: &pb::InstallSaga) -> bool {
    matches!(InstallPhase::try_from(saga.phase), Ok(InstallPhase::Succeeded | InstallPhase::Failed))
}

/// Decides what `input` (carried by the message with envelope `cause`) does to `saga`.
pub fn decide(saga: &pb::InstallSaga, input: &Input, cause: &Envelope, now_ms: i64) -> Decision {
    if is_terminal(saga) {
        return Decision::Ignore;
    }
    let phase = InstallPhase::try_from(saga.phase).unwrap_or(InstallPhase::Unspecified);
    let expected = input.phase();
    if expected != InstallPhase::Unspecified {
        if (phase as i32) < (expected as i32) {
            return Decision::Wait;
        }
        if (phase as i32) > (expected as i32) {
            return Decision::Ignore;
        }
    }
    let mut next = saga.clone();
    let site = saga.site_id.clone();
    let changed = match input {
        Input::Staged => {
            next.phase = InstallPhase::ProvisioningOs as i32;
            let builder = builder_of(&next);
            for i in 0..next.nodes.len() {
                let node = next.nodes[i].node.clone().unwrap_or_default();
                next.nodes[i].step = NodeStep::OsProvisioning as i32;
                let image = os_image_for(&next, node.role);
                let job =
                    pb::ProvisionOs { site_id: site.clone(), node: Some(node.clone()), image, builder: builder as i32 };
                push_job(&mut next, &job, &cause.derive("provision_os", Some(&node.name)), vec![node.name.clone()]);
            }
            // Cluster API claims the hosts as they are enrolled: the cluster's objects (for a
            // join, with the node's set one larger) go to the site at once, and its machines
            // take the hosts as they become available.
            if builder == pb::ClusterBuilder::Capi {
                let nodes: Vec<pb::NodeSpec> = next.nodes.iter().filter_map(|n| n.node.clone()).collect();
                push_build(&mut next, nodes, cause);
            }
            true
        }
        Input::OsState { node, state } => match find(&mut next, node) {
            Some(n) if n.step == NodeStep::OsProvisioning as i32 && n.metal3_state != *state => {
                n.metal3_state = state.clone();
                true
            }
            _ => false,
        },
        Input::OsProvisioned { node } => match find(&mut next, node) {
            Some(n) if n.step == NodeStep::OsProvisioning as i32 => {
                n.step = NodeStep::OsProvisioned as i32;
                n.metal3_state = "provisioned".into();
                after_os(&mut next, cause, now_ms);
                true
            }
            _ => false,
        },
        Input::NodeFailed { node, step, reason } => match find(&mut next, node) {
            Some(n) if n.step != NodeStep::Failed as i32 => {
                n.step = NodeStep::Failed as i32;
                n.failed_step = step.clone();
                n.reason = reason.clone();
                if phase == InstallPhase::ProvisioningOs {
                    after_os(&mut next, cause, now_ms);
                } else if next.join {
                    after_join(&mut next, cause, now_ms);
                }
                true
            }
            _ => false,
        },
        Input::BinariesInstalled { node } => match find(&mut next, node) {
            Some(n) if n.step == NodeStep::OsProvisioned as i32 => {
                n.step = NodeStep::BinariesInstalled as i32;
                if next.join {
                    after_join(&mut next, cause, now_ms);
                }
                true
            }
            _ => false,
        },
        Input::ClusterReady(ready) => {
            for name in ready.masters.iter().chain(&ready.workers) {
                if let Some(n) = find(&mut next, name) {
                    n.step = NodeStep::BinariesInstalled as i32;
                }
            }
            for f in &ready.failed {
                if let Some(n) = find(&mut next, &f.node) {
                    n.step = NodeStep::Failed as i32;
                    n.failed_step = f.failed_step.clone();
                    n.reason = f.reason.clone();
                }
            }
            next.phase = InstallPhase::CollectingKubeconfig as i32;
            true
        }
        Input::KubeconfigStored => {
            // Container packages and helm charts (each rendered for the site by its gateway's
            // request), in one job.
            let mut containers = packages_of(&next, pb::PackageKind::Container);
            containers.extend(packages_of(&next, pb::PackageKind::HelmChart));
            if containers.is_empty() {
                finish(&mut next, cause, now_ms, None);
            } else {
                next.phase = InstallPhase::ApplyingContainers as i32;
                let job = pb::ApplyContainerPackages { site_id: site, packages: containers };
                push_job(&mut next, &job, &cause.derive("apply_container_packages", None), vec![]);
            }
            true
        }
        Input::ContainersApplied => {
            finish(&mut next, cause, now_ms, None);
            true
        }
        Input::JobFailed { job, reason } if next.join => {
            for n in next.nodes.iter_mut().filter(|n| n.step != NodeStep::Failed as i32) {
                n.step = NodeStep::Failed as i32;
                n.failed_step = job.clone();
                n.reason = reason.clone();
            }
            finish_join(&mut next, cause, now_ms);
            true
        }
        Input::JobFailed { job, reason } => {
            finish(&mut next, cause, now_ms, Some(format!("{job} failed: {reason}")));
            true
        }
    };
    if !changed {
        return Decision::Ignore;
    }
    if next.phase != saga.phase {
        next.phase_started_unix_ms = now_ms;
    }
    Decision::Apply(Box::new(next))
}

/// A phase's name as metrics and logs give it: `provisioning_os`.
pub fn phase_name(phase: i32) -> &'static str {
    match InstallPhase::try_from(phase).unwrap_or(InstallPhase::Unspecified) {
        InstallPhase::Unspecified => "unspecified",
        InstallPhase::Staging => "staging",
        InstallPhase::ProvisioningOs => "provisioning_os",
        InstallPhase::InstallingBinaries => "installing_binaries",
        InstallPhase::CollectingKubeconfig => "collecting_kubeconfig",
        InstallPhase::ApplyingContainers => "applying_containers",
        InstallPhase::Succeeded => "succeeded",
        InstallPhase::Failed => "failed",
    }
}

/// The phase `before` left to become `after`, and the seconds it spent there; `None` when the
/// phase did not change, or when its start is not recorded (a saga written before phases were
/// timed).
pub fn phase_left(before: &pb::InstallSaga, after: &pb::InstallSaga) -> Option<(&'static str, f64)> {
    if before.phase == after.phase {
        return None;
    }
    let began = match before.phase_started_unix_ms {
        0 if before.phase == InstallPhase::Staging as i32 => before.started_unix_ms,
        t => t,
    };
    let ended = after.phase_started_unix_ms;
    (began > 0 && ended >= began).then(|| (phase_name(before.phase), (ended - began) as f64 / 1000.0))
}

fn find<'a>(saga: &'a mut pb::InstallSaga, node: &str) -> Option<&'a mut pb::NodeProgress> {
    saga.nodes.iter_mut().find(|n| name_of(n) == node)
}

fn os_image_for(saga: &pb::InstallSaga, role: i32) -> Option<pb::Package> {
    let design = saga.design.as_ref()?;
    let set = design.packages.iter().find(|rp| rp.role == role)?;
    set.packages.iter().find_map(|r| {
        saga.packages
            .get(&format!("{}@{}", r.name, r.version))
            .filter(|p| p.kind == pb::PackageKind::OsImage as i32)
            .cloned()
    })
}

/// Once every node's OS is provisioned or failed: on to the binaries, or stop when no
/// master is left to form a cluster.
fn after_os(saga: &mut pb::InstallSaga, cause: &Envelope, now_ms: i64) {
    let step = |n: &pb::NodeProgress| NodeStep::try_from(n.step).unwrap_or(NodeStep::Unspecified);
    if saga.nodes.iter().any(|n| step(n) == NodeStep::OsProvisioning) {
        return;
    }
    let ready: Vec<pb::NodeSpec> =
        saga.nodes.iter().filter(|n| step(n) == NodeStep::OsProvisioned).filter_map(|n| n.node.clone()).collect();
    if saga.join && ready.is_empty() {
        finish_join(saga, cause, now_ms);
        return;
    }
    if !saga.join && !ready.iter().any(|n| n.role == pb::Role::Master as i32) {
        finish(saga, cause, now_ms, Some("no master node has an operating system: the cluster cannot form".into()));
        return;
    }
    saga.phase = InstallPhase::InstallingBinaries as i32;
    if builder_of(saga) == pb::ClusterBuilder::Capi {
        // The build went to the site with the hosts (see `Input::Staged`).
        return;
    }
    push_build(saga, ready, cause);
}

/// How the saga's site builds its cluster.
fn builder_of(saga: &pb::InstallSaga) -> pb::ClusterBuilder {
    let builder = saga.design.as_ref().and_then(|d| d.cluster.as_ref()).map_or(0, |c| c.builder);
    pb::ClusterBuilder::try_from(builder).unwrap_or(pb::ClusterBuilder::Unspecified)
}

/// Sends the job that builds the cluster of `nodes`: their binaries through the BPA, or, for
/// a site Cluster API builds, its objects rendered from the design (with the os-images its
/// machine templates name).
fn push_build(saga: &mut pb::InstallSaga, nodes: Vec<pb::NodeSpec>, cause: &Envelope) {
    let capi = builder_of(saga) == pb::ClusterBuilder::Capi;
    let job = pb::InstallBinaries {
        site_id: saga.site_id.clone(),
        nodes,
        binaries: packages_of(saga, pb::PackageKind::Binary),
        join_existing: saga.join,
        design: saga.design.clone().filter(|_| capi),
        images: if capi { packages_of(saga, pb::PackageKind::OsImage) } else { Vec::new() },
    };
    let nodes = job.nodes.iter().map(|n| n.name.clone()).collect();
    push_job(saga, &job, &cause.derive("install_binaries", None), nodes);
}

/// Once a joining node's binaries are installed or failed: the join is over.
fn after_join(saga: &mut pb::InstallSaga, cause: &Envelope, now_ms: i64) {
    let pending = |n: &pb::NodeProgress| n.step == NodeStep::OsProvisioned as i32;
    if !saga.nodes.iter().any(pending) {
        finish_join(saga, cause, now_ms);
    }
}

/// Ends a join: `NodeReady` for a node in the cluster, `NodeJoinFailed` (with the step and
/// reason) otherwise.
fn finish_join(saga: &mut pb::InstallSaga, cause: &Envelope, now_ms: i64) {
    saga.finished_unix_ms = now_ms;
    let site = saga.site_id.clone();
    let packages: Vec<pb::PackageRef> = saga
        .design
        .as_ref()
        .and_then(|d| d.packages.iter().find(|rp| saga.nodes.first().is_some_and(|n| role_of(n) == rp.role)))
        .map(|rp| rp.packages.clone())
        .unwrap_or_default();
    let mut failed = Vec::new();
    let mut ready = Vec::new();
    for n in &saga.nodes {
        let name = name_of(n).to_string();
        if n.step == NodeStep::BinariesInstalled as i32 {
            let evt = pb::NodeReady {
                site_id: site.clone(),
                node: name.clone(),
                role: role_of(n),
                packages: packages.clone(),
            };
            ready.push(outbox_entry(evt.subject(), &evt, &cause.derive("node_ready", Some(&name))));
        } else {
            let evt = pb::NodeJoinFailed {
                site_id: site.clone(),
                node: name.clone(),
                step: n.failed_step.clone(),
                reason: if n.reason.is_empty() { "the join did not complete".into() } else { n.reason.clone() },
            };
            failed.push(format!("{name}: {}", evt.reason));
            ready.push(outbox_entry(evt.subject(), &evt, &cause.derive("node_join_failed", Some(&name))));
        }
    }
    saga.outbox.extend(ready);
    if failed.is_empty() {
        saga.phase = InstallPhase::Succeeded as i32;
        saga.outcome = pb::InstallOutcome::Success as i32;
    } else {
        saga.phase = InstallPhase::Failed as i32;
        saga.outcome = pb::InstallOutcome::Failure as i32;
        saga.reason = failed.join("; ");
    }
}

/// Ends the saga: `SiteInstalled` when every node made it, `SiteInstallFailed` (with every
/// node's result, so a partial success is reported as such) otherwise.
fn finish(saga: &mut pb::InstallSaga, cause: &Envelope, now_ms: i64, failure: Option<String>) {
    let results: Vec<pb::NodeResult> = saga
        .nodes
        .iter()
        .map(|n| {
            let ok = failure.is_none() && n.step == NodeStep::BinariesInstalled as i32;
            let (failed_step, reason) = match (ok, n.step == NodeStep::Failed as i32) {
                (true, _) => (String::new(), String::new()),
                (false, true) => (n.failed_step.clone(), n.reason.clone()),
                (false, false) => ("install".to_string(), "the site install did not complete".to_string()),
            };
            pb::NodeResult {
                node: name_of(n).to_string(),
                role: role_of(n),
                outcome: if ok { pb::NodeOutcome::Succeeded } else { pb::NodeOutcome::Failed } as i32,
                failed_step,
                reason,
                ..Default::default()
            }
        })
        .collect();
    let failed: Vec<&pb::NodeResult> = results.iter().filter(|r| r.outcome == pb::NodeOutcome::Failed as i32).collect();
    let succeeded = results.len() - failed.len();
    saga.finished_unix_ms = now_ms;
    let env = cause.derive("install_finished", None);
    if failure.is_none() && failed.is_empty() {
        saga.phase = InstallPhase::Succeeded as i32;
        saga.outcome = pb::InstallOutcome::Success as i32;
        let evt = pb::SiteInstalled { site_id: saga.site_id.clone(), results, outcome: saga.outcome };
        push_event(saga, &evt, &env);
        return;
    }
    let outcome = if succeeded > 0 { pb::InstallOutcome::PartialSuccess } else { pb::InstallOutcome::Failure };
    let named: Vec<String> =
        failed
            .iter()
            .map(|r| {
                if r.reason.is_empty() {
                    r.node.clone()
                } else {
                    format!("{} ({}: {})", r.node, r.failed_step, r.reason)
                }
            })
            .collect();
    let reason = match failure {
        Some(why) => why,
        None => format!("{} of {} nodes failed: {}", failed.len(), results.len(), named.join("; ")),
    };
    let failed_nodes = failed.iter().map(|r| r.node.clone()).collect();
    saga.phase = InstallPhase::Failed as i32;
    saga.outcome = outcome as i32;
    saga.reason = reason.clone();
    let evt =
        pb::SiteInstallFailed { site_id: saga.site_id.clone(), reason, results, outcome: outcome as i32, failed_nodes };
    push_event(saga, &evt, &env);
}

#[cfg(test)]
pub(crate) mod tests;
