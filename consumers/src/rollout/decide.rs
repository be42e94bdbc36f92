//! Rollout decisions, as pure functions: what a `PatchPackage` plans, and what a site's report,
//! a pause, a resume, a cancel or a wave past its timeout does to the rollout; which sites to
//! start and the job that starts one. Each takes what the executor read and the time it is
//! (`now`, milliseconds since the epoch) and returns the records to write, with the events to
//! publish in the rollout's outbox, and the jobs to send. No I/O, no clock: the executor reads,
//! calls these, writes with compare-and-set, and publishes.

use std::ops::Range;

use bus_schema::domain::{PackageName, SiteDesign, Version};
use bus_schema::envelope::Envelope;
use bus_schema::pb::{self, BusEvent, BusJob};
use bus_schema::rollout::{self as plan, Direction, ObservedVersions, Strategy};

use crate::decision::{Refusal, outbox_entry};

mod control;
mod rollback;
mod timeout;
mod window;
pub use control::{cancel, pause, resume};
pub use rollback::{
    Before, UndoneSite, mark_rolled_back, may_roll_back, rollback_id, rollback_plan, versions_to_go_back_to,
};
pub use timeout::{WaveTimeout, silent_sites, wave_timed_out, wave_timeout};
pub use window::{Gate, gate, stage_ahead, waiting_record};

/// Sites per plan chunk: a chunk of 500 sites of 10 nodes is about 60 KB.
pub const CHUNK_SIZE: u32 = 500;
/// Progress events per rollout, at most (plus one per wave).
const PROGRESS_STEPS: u32 = 10;

fn bit(bits: &[u8], i: usize) -> bool {
    bits.get(i / 8).is_some_and(|b| b & (1 << (i % 8)) != 0)
}

fn set_bit(bits: &mut Vec<u8>, i: usize) {
    if bits.len() <= i / 8 {
        bits.resize(i / 8 + 1, 0);
    }
    bits[i / 8] |= 1 << (i % 8);
}

fn count_bits(bits: &[u8], range: Range<usize>) -> usize {
    range.filter(|&i| bit(bits, i)).count()
}

/// The envelope of the rollout itself (its id is the PatchPackage command's).
fn envelope(r: &pb::Rollout) -> Envelope {
    Envelope {
        id: r.rollout_id.clone(),
        correlation: r.rollout_id.clone(),
        causation: r.rollout_id.clone(),
        traceparent: r.traceparent.clone(),
        actor: r.actor.clone(),
    }
}

fn push<E: BusEvent>(r: &mut pb::Rollout, evt: &E, env: &Envelope) {
    r.outbox.push(outbox_entry(evt.subject(), evt, env));
}

/// The rollout's phase.
pub fn phase(r: &pb::Rollout) -> pb::RolloutPhase {
    pb::RolloutPhase::try_from(r.phase).unwrap_or(pb::RolloutPhase::Unspecified)
}

/// Whether the rollout has ended for good.
pub fn is_terminal(r: &pb::Rollout) -> bool {
    matches!(phase(r), pb::RolloutPhase::Completed | pb::RolloutPhase::Cancelled)
}

/// Plan indexes of wave `w`.
pub fn wave_range(r: &pb::Rollout, w: u32) -> Range<usize> {
    let w = w as usize;
    let start = if w == 0 { 0 } else { r.wave_ends.get(w - 1).copied().unwrap_or(r.sites) as usize };
    start..r.wave_ends.get(w).copied().unwrap_or(r.sites) as usize
}

fn failures_counted(r: &pb::Rollout) -> u32 {
    r.failed.saturating_sub(r.failure_base)
}

fn threshold(r: &pb::Rollout) -> u32 {
    r.strategy.as_ref().map_or(0, |s| s.failure_threshold)
}

/// Halts a running or paused rollout whose failures passed its threshold.
fn check_halt(r: &mut pb::Rollout, cause: &Envelope) {
    if !matches!(phase(r), pb::RolloutPhase::Running | pb::RolloutPhase::Paused) {
        return;
    }
    if failures_counted(r) > threshold(r) {
        r.phase = pb::RolloutPhase::Halted as i32;
        r.reason = format!(
            "{} node(s) failed, more than the failure threshold of {}{}",
            failures_counted(r),
            threshold(r),
            if r.timed_out_sites > 0 {
                format!(" ({} site(s) counted as failed after their wave timed out)", r.timed_out_sites)
            } else {
                String::new()
            }
        );
        let evt = pb::RolloutHalted {
            rollout_id: r.rollout_id.clone(),
            reason: r.reason.clone(),
            patched: r.patched,
            failed: r.failed,
            wave: r.wave,
        };
        push(r, &evt, &cause.derive("rollout_halted", None));
        if r.strategy.as_ref().is_some_and(|s| s.roll_back_on_halt) {
            // Published with the halt, from the same outbox: a crash cannot keep one without the other.
            let cmd = rollback::auto_rollback(r);
            r.outbox.push(outbox_entry(pb::BusCommand::subject(&cmd), &cmd, &cause.derive("auto_rollback", None)));
        }
    }
}

fn progress(r: &mut pb::Rollout) {
    let evt = pb::RolloutProgress {
        rollout_id: r.rollout_id.clone(),
        wave: r.wave,
        planned_nodes: r.planned_nodes,
        patched: r.patched,
        failed: r.failed,
        sites_done: r.sites_done,
        sites_total: r.sites,
    };
    let env = envelope(r).derive(&format!("rollout_progress/{}", r.sites_done), None);
    push(r, &evt, &env);
}

/// Moves a running rollout on while its current wave is complete: the next wave, or the end.
pub fn advance(r: &mut pb::Rollout, now_ms: i64) {
    while phase(r) == pb::RolloutPhase::Running {
        let range = wave_range(r, r.wave);
        if count_bits(&r.done, range.clone()) < range.len() {
            return;
        }
        if r.wave as usize + 1 >= r.wave_ends.len() {
            r.phase = pb::RolloutPhase::Completed as i32;
            r.finished_unix_ms = now_ms;
            let evt = pb::RolloutCompleted {
                rollout_id: r.rollout_id.clone(),
                package: r.package.clone(),
                planned_nodes: r.planned_nodes,
                patched: r.patched,
                failed: r.failed,
                sites: r.sites,
                duration_ms: now_ms.saturating_sub(r.started_unix_ms),
            };
            let env = envelope(r).derive("rollout_completed", None);
            push(r, &evt, &env);
            return;
        }
        if awaits_approval(r) {
            r.phase = pb::RolloutPhase::Paused as i32;
            r.awaiting_approval = true;
            let wave =
                if r.wave == 0 && canary_first(r) { "the canary".to_string() } else { format!("wave {}", r.wave + 1) };
            r.reason = format!(
                "waiting for approval after {wave} (landfall rollout approve {}): {} of {} nodes patched, {} failed so far",
                r.rollout_id, r.patched, r.planned_nodes, r.failed
            );
            let evt = pb::RolloutPaused { rollout_id: r.rollout_id.clone(), reason: r.reason.clone() };
            let env = envelope(r).derive(&format!("awaiting_approval/{}", r.wave), None);
            push(r, &evt, &env);
            return;
        }
        r.wave += 1;
        r.wave_started_unix_ms = now_ms;
        wave_started(r);
    }
}

/// Whether the rollout's first wave is its canary.
fn canary_first(r: &pb::Rollout) -> bool {
    r.strategy.as_ref().is_some_and(|s| s.canary_sites > 0)
}

/// Whether the wave that just ended (not the last) must be approved before the next starts.
fn awaits_approval(r: &pb::Rollout) -> bool {
    let gate = r.strategy.as_ref().map_or(pb::ApprovalGate::Unspecified, |s| s.approval());
    let gated = match gate {
        pb::ApprovalGate::Unspecified => false,
        pb::ApprovalGate::AfterCanary => r.wave == 0 && canary_first(r),
        pb::ApprovalGate::AfterEachWave => true,
    };
    gated && r.approved_waves <= r.wave
}

fn wave_started(r: &mut pb::Rollout) {
    let canary = r.wave == 0 && r.strategy.as_ref().is_some_and(|s| s.canary_sites > 0);
    let evt = pb::RolloutWaveStarted { rollout_id: r.rollout_id.clone(), wave: r.wave, site_ids: vec![], canary };
    let env = envelope(r).derive(&format!("wave_started/{}", r.wave), None);
    push(r, &evt, &env);
}

// Planning.

/// A `PatchPackage` whose fields are valid: the version to patch to, and how.
#[derive(Debug, Clone)]
pub struct Request {
    pub name: PackageName,
    pub version: Version,
    strategy: Strategy,
}

/// Checks a `PatchPackage`'s package, version and strategy.
///
/// # Errors
/// An `Invalid` refusal naming the field.
pub fn request(cmd: &pb::PatchPackage) -> Result<Request, Refusal> {
    let invalid =
        |e: bus_schema::domain::InvalidField| Refusal { code: pb::RejectCode::Invalid, reason: e.to_string() };
    Ok(Request {
        name: PackageName::try_from(cmd.name.as_str()).map_err(invalid)?,
        version: Version::try_from(cmd.version.as_str()).map_err(invalid)?,
        strategy: Strategy::try_from(&cmd.strategy.clone().unwrap_or_default()).map_err(invalid)?,
    })
}

/// The catalog entry of the version asked for, as read.
///
/// # Errors
/// An `UnknownPackage` refusal when the catalog does not hold it.
pub fn in_catalog(req: &Request, entry: Option<pb::Package>) -> Result<pb::Package, Refusal> {
    entry.ok_or_else(|| Refusal {
        code: pb::RejectCode::UnknownPackage,
        reason: format!("{}@{} is not in the catalog (landfall package register)", req.name, req.version),
    })
}

/// Refuses a rollout of a package that another rollout is moving (running, or paused and to go
/// on): the two would patch the same nodes side by side, and each would report the other's
/// work as its own. `others` are the rollouts under way.
///
/// # Errors
/// `Conflict`, naming the rollout that moves the package and how to end it.
pub fn not_moved_by_another(req: &Request, others: &[pb::Rollout]) -> Result<(), Refusal> {
    let moving = others.iter().find(|r| {
        matches!(phase(r), pb::RolloutPhase::Running | pb::RolloutPhase::Paused)
            && r.package.as_ref().is_some_and(|p| p.name == req.name.as_str())
    });
    match moving {
        None => Ok(()),
        Some(r) => {
            let to = r.package.as_ref().map(|p| p.version.as_str()).unwrap_or_default();
            let what = if phase(r) == pb::RolloutPhase::Paused { "paused over" } else { "moving" };
            Err(Refusal {
                code: pb::RejectCode::Conflict,
                reason: format!(
                    "rollout {} is {what} {} (to {to}, {} of {} nodes patched): one rollout moves a package's \
                     nodes at a time; wait for it to end, or cancel it (landfall rollout cancel {})",
                    r.rollout_id, req.name, r.patched, r.planned_nodes, r.rollout_id
                ),
            })
        }
    }
}

/// A planned rollout: its plan, in chunks written once, and its first record.
#[derive(Debug, Clone)]
pub struct Planned {
    pub chunks: Vec<pb::RolloutPlanChunk>,
    /// Running, with its first wave started (or completed at once with nothing to patch), and
    /// `RolloutPlanned` in its outbox.
    pub rollout: pb::Rollout,
}

/// Plans the rollout `cmd` (envelope `cause`, whose id is the rollout's) asks for, over the
/// sites' designs and what their nodes were seen to run.
///
/// # Errors
/// `UnknownSite` when the selector names a site that is not registered; `Invalid` for any other
/// selector or strategy that cannot be planned.
pub fn plan(
    cmd: &pb::PatchPackage,
    req: &Request,
    entry: pb::Package,
    designs: &[SiteDesign],
    observed: &ObservedVersions,
    cause: &Envelope,
    now: i64,
) -> Result<Planned, Refusal> {
    let id = &cause.id;
    let selector = cmd.selector.clone().unwrap_or_default();
    let direction = match (cmd.again, cmd.only_older) {
        (true, true) => {
            return Err(Refusal {
                code: pb::RejectCode::Invalid,
                reason: "again and only_older contradict each other: again patches the nodes at the version too".into(),
            });
        }
        (true, false) => Direction::Again,
        (false, true) => Direction::OnlyOlder,
        (false, false) => Direction::Any,
    };
    let planned = plan::plan_with(&req.name, &req.version, direction, &selector, &req.strategy, designs, observed)
        .map_err(|e| {
            let code =
                if e.field == "selector.site_ids" { pb::RejectCode::UnknownSite } else { pb::RejectCode::Invalid };
            Refusal { code, reason: e.to_string() }
        })?;

    let chunks: Vec<pb::RolloutPlanChunk> = planned
        .sites
        .chunks(CHUNK_SIZE as usize)
        .enumerate()
        .map(|(n, sites)| pb::RolloutPlanChunk {
            first_index: n as u32 * CHUNK_SIZE,
            sites: sites
                .iter()
                .map(|s| pb::RolloutPlanSite {
                    site_id: s.site.clone(),
                    nodes: s.nodes.iter().map(|n| n.spec.clone()).collect(),
                    from_versions: s.nodes.iter().map(|n| n.from_version.clone()).collect(),
                    canary: s.canary,
                    to_versions: vec![],
                })
                .collect(),
        })
        .collect();

    let canary_sites = planned.sites.iter().filter(|s| s.canary).count() as u32;
    let strategy = &req.strategy;
    let mut r = pb::Rollout {
        rollout_id: id.clone(),
        package: Some(pb::PackageRef { name: req.name.to_string(), version: req.version.to_string() }),
        entry: Some(entry),
        strategy: Some(pb::ResolvedStrategy {
            canary_sites,
            max_concurrent_sites: strategy.max_concurrent_sites,
            max_unavailable: strategy.max_unavailable.to_string(),
            failure_threshold: planned.failure_threshold,
            wave_timeout_seconds: strategy.wave_timeout.map_or(0, |t| t.as_secs() as u32),
            on_wave_timeout: strategy.on_wave_timeout as i32,
            approval: strategy.approval as i32,
            on_failure: strategy.on_failure as i32,
            roll_back_on_halt: strategy.roll_back_on_halt,
        }),
        phase: pb::RolloutPhase::Running as i32,
        sites: planned.sites.len() as u32,
        planned_nodes: planned.planned_nodes,
        wave_ends: planned.wave_ends.clone(),
        wave_started_unix_ms: now,
        plan_chunks: chunks.len() as u32,
        chunk_size: CHUNK_SIZE,
        started_unix_ms: now,
        trigger: if cmd.trigger.is_empty() { "operator".into() } else { cmd.trigger.clone() },
        traceparent: cause.traceparent.clone(),
        actor: cause.actor.clone(),
        selector: Some(selector),
        command_id: cause.id.clone(),
        ignore_windows: cmd.ignore_windows,
        previous_versions: planned
            .sites
            .iter()
            .flat_map(|s| s.nodes.iter().map(|n| n.from_version.clone()))
            .filter(|v| !v.is_empty())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect(),
        ..Default::default()
    };
    let evt = pb::RolloutPlanned {
        rollout_id: id.clone(),
        package: r.package.clone(),
        sites: planned.site_plans(),
        planned_nodes: planned.planned_nodes,
        waves: planned.wave_ends.len() as u32,
        nodes_at_target: planned.nodes_at_target,
        nodes_not_installed: planned.nodes_not_installed,
        trigger: r.trigger.clone(),
        failure_threshold: planned.failure_threshold,
        ..Default::default()
    };
    push(&mut r, &evt, &cause.derive("rollout_planned", None));
    if r.sites > 0 {
        wave_started(&mut r);
    }
    advance(&mut r, now);
    Ok(Planned { chunks, rollout: r })
}

// Site reports.

/// One site's report, as counted.
#[derive(Debug, Clone)]
pub struct Report {
    pub index: usize,
    pub patched: u32,
    pub failed: u32,
    /// Nodes found at the version already.
    pub unchanged: u32,
    /// Failed nodes put back to what they ran, healthy again.
    pub rolled_back: u32,
    pub cause: Envelope,
}

/// What a site's `SitePatched` comes to.
#[derive(Debug, Clone)]
pub struct SiteReport {
    /// The site's record (`rollout.<id>.site.<site>`).
    pub record: pb::RolloutSite,
    /// The version the site's design moves to: set when any node was patched.
    pub design_to: Option<pb::PackageRef>,
    /// What the rollout counts.
    pub count: Report,
}

/// The site's record, its design's move and its count, from its gateway's `SitePatched`
/// (delivered with envelope `cause`) for the site `planned` of rollout `r`. A rollback's site
/// design moves to the version its nodes went back to.
pub fn site_report(
    r: &pb::Rollout,
    planned: &pb::RolloutPlanSite,
    e: &pb::SitePatched,
    cause: &Envelope,
    now: i64,
) -> SiteReport {
    let design_to = match e.patched.first() {
        None => None,
        Some(_) if r.rollback_of.is_empty() => Some(e.package.clone().unwrap_or_default()),
        Some(node) => planned
            .nodes
            .iter()
            .position(|n| &n.name == node)
            .and_then(|i| planned.to_versions.get(i))
            .map(|v| pb::PackageRef { name: e.package.clone().unwrap_or_default().name, version: v.clone() }),
    };
    SiteReport {
        record: pb::RolloutSite {
            rollout_id: e.rollout_id.clone(),
            site_id: e.site_id.clone(),
            plan_index: e.plan_index,
            state: pb::RolloutSiteState::Done as i32,
            patched: e.patched.clone(),
            failed: e.failed.clone(),
            skipped: e.skipped.clone(),
            unchanged: e.unchanged.clone(),
            updated_unix_ms: now,
            ..Default::default()
        },
        design_to,
        count: Report {
            index: e.plan_index as usize,
            patched: e.patched.len() as u32,
            failed: e.failed.len() as u32,
            unchanged: e.unchanged.len() as u32,
            rolled_back: e.failed.iter().filter(|f| f.rolled_back).count() as u32,
            cause: cause.clone(),
        },
    }
}

/// The record of a site counted failed at its wave's time-out, once its report arrives after
/// all (it was cut off, and worked on): what its nodes really did, marked late, with the reason
/// it was counted failed kept. The rollout's counts stay as they were. `None` when `held` is
/// not such a record, or already has its late report.
pub fn late_record(held: &pb::RolloutSite, report: &SiteReport) -> Option<pb::RolloutSite> {
    if held.state != pb::RolloutSiteState::TimedOut as i32 || held.reported_late {
        return None;
    }
    let reason = held.failed.first().map(|f| f.reason.clone()).unwrap_or_default();
    Some(pb::RolloutSite {
        state: pb::RolloutSiteState::TimedOut as i32,
        reported_late: true,
        timed_out_reason: reason,
        ..report.record.clone()
    })
}

/// What a site removed since the rollout was planned comes to, when its turn comes: no job, its
/// nodes skipped (neither patched nor failed), done, so the rollout goes on without it. `cause`
/// is the rollout's own envelope, derived for the site.
pub fn removed_site_report(r: &pb::Rollout, index: usize, site: &pb::RolloutPlanSite, now: i64) -> SiteReport {
    let e = pb::SitePatched {
        site_id: site.site_id.clone(),
        rollout_id: r.rollout_id.clone(),
        plan_index: index as u32,
        skipped: site.nodes.iter().map(|n| n.name.clone()).collect(),
        ..Default::default()
    };
    site_report(r, site, &e, &envelope(r).derive("site_removed", Some(&site.site_id)), now)
}

/// The id of the `PatchNodes` job rollout `r` sends `site` (derived: the same every time).
pub fn patch_job_id(r: &pb::Rollout, site: &str) -> String {
    envelope(r).derive(pb::PatchNodes::KIND, Some(site)).id
}

/// Whether a site's report answers the job rollout `r` sent it: the site is the one planned at
/// the report's index (`planned`, read from the plan), its job was sent, the report was caused by
/// that job, and names only that job's nodes and the rollout's package. A site can hold only its
/// own job, so a report that does not answer one is a forgery.
///
/// # Errors
/// The reason, for the report's `FORBIDDEN` rejection.
pub fn check_report(
    r: &pb::Rollout,
    planned: &pb::RolloutPlanSite,
    e: &pb::SitePatched,
    cause: &Envelope,
) -> Result<(), String> {
    let index = e.plan_index as usize;
    if index >= r.sites as usize || planned.site_id != e.site_id {
        return Err(format!("rollout {} planned no site {} at index {index}", r.rollout_id, e.site_id));
    }
    if !bit(&r.dispatched, index) {
        return Err(format!("rollout {} has sent site {} no job", r.rollout_id, e.site_id));
    }
    if cause.causation != patch_job_id(r, &e.site_id) {
        return Err(format!(
            "the report answers message {}, not the job rollout {} sent site {}",
            cause.causation, r.rollout_id, e.site_id
        ));
    }
    let job_nodes: std::collections::BTreeSet<&str> = planned.nodes.iter().map(|n| n.name.as_str()).collect();
    let named = e
        .patched
        .iter()
        .chain(&e.skipped)
        .chain(&e.unchanged)
        .map(String::as_str)
        .chain(e.failed.iter().map(|f| f.node.as_str()));
    for node in named {
        if !job_nodes.contains(node) {
            return Err(format!("node {node} was not in the job rollout {} sent site {}", r.rollout_id, e.site_id));
        }
    }
    let entry = r.entry.clone().unwrap_or_default();
    let package = e.package.clone().unwrap_or_default();
    if (package.name.as_str(), package.version.as_str()) != (entry.name.as_str(), entry.version.as_str()) {
        return Err(format!(
            "the report is of {}@{}, rollout {} patches {}@{}",
            package.name, package.version, r.rollout_id, entry.name, entry.version
        ));
    }
    Ok(())
}

/// Whether the job of the site at plan `index` is recorded as sent.
pub fn dispatched(r: &pb::Rollout, index: usize) -> bool {
    bit(&r.dispatched, index)
}

/// Whether the report of the site at plan `index` has been counted (its record is written).
pub fn counted(r: &pb::Rollout, index: usize) -> bool {
    bit(&r.done, index)
}

/// Counts one site's report of `patched` and `failed` nodes; `None` when it was counted already.
pub fn count_site(
    r: &pb::Rollout,
    index: usize,
    patched: u32,
    failed: u32,
    cause: &Envelope,
    now_ms: i64,
) -> Option<pb::Rollout> {
    let rep = Report { index, patched, failed, unchanged: 0, rolled_back: 0, cause: cause.clone() };
    count(r, &rep, now_ms)
}

/// Counts one site's report; `None` when it was counted already.
fn count(r: &pb::Rollout, rep: &Report, now_ms: i64) -> Option<pb::Rollout> {
    let index = rep.index;
    if index >= r.sites as usize || bit(&r.done, index) {
        return None;
    }
    let mut next = r.clone();
    set_bit(&mut next.done, index);
    next.sites_done += 1;
    next.patched += rep.patched;
    next.failed += rep.failed;
    next.unchanged += rep.unchanged;
    next.rolled_back += rep.rolled_back;
    check_halt(&mut next, &rep.cause);
    let step = (next.sites / PROGRESS_STEPS).max(1);
    let range = wave_range(&next, next.wave);
    let wave_over = count_bits(&next.done, range.clone()) == range.len();
    if next.sites_done.is_multiple_of(step) || wave_over {
        progress(&mut next);
    }
    advance(&mut next, now_ms);
    Some(next)
}

/// Counts the reports that arrived together, in one change; `None` when all were counted.
pub fn count_reports(r: &pb::Rollout, reports: &[&Report], now: i64) -> Option<pb::Rollout> {
    let mut next: Option<pb::Rollout> = None;
    for rep in reports {
        let current = next.as_ref().unwrap_or(r);
        if let Some(n) = count(current, rep, now) {
            next = Some(n);
        }
    }
    next
}

/// Moves a site's design to `package` wherever it wanted another version of it, so an install
/// or a node added later runs what the rest of the site runs; `false` when nothing changed.
pub fn move_design(design: &mut pb::SiteDesign, package: &pb::PackageRef) -> bool {
    let mut changed = false;
    for p in design.packages.iter_mut().flat_map(|rp| rp.packages.iter_mut()) {
        if p.name == package.name && p.version != package.version {
            p.version = package.version.clone();
            changed = true;
        }
    }
    changed
}

// Starting sites.

/// Plan indexes of the current wave's sites neither started nor counted.
pub fn pending_sites(r: &pb::Rollout) -> Vec<usize> {
    wave_range(r, r.wave).filter(|&i| !bit(&r.dispatched, i) && !bit(&r.done, i)).collect()
}

/// Marks the sites at `started` as started; `false` when they all were.
pub fn mark_dispatched(r: &mut pb::Rollout, started: &[usize]) -> bool {
    if started.iter().all(|&i| bit(&r.dispatched, i)) {
        return false;
    }
    for &i in started {
        set_bit(&mut r.dispatched, i);
    }
    true
}

/// Whether a site's job reinstalls its binaries: an os-image patch reimages its nodes.
pub fn reinstalls(r: &pb::Rollout) -> bool {
    r.entry.as_ref().is_some_and(|e| e.kind == pb::PackageKind::OsImage as i32)
}

/// Whether `package` is one a site's report of rollout `r` may name: the rollout's, a version a
/// rollback sends nodes back to, or one its plan found on its nodes (where a failed node is put
/// back).
pub fn names_package(r: &pb::Rollout, package: &pb::PackageRef) -> bool {
    let entry = r.entry.as_ref();
    entry.is_some_and(|e| e.name == package.name)
        && (entry.is_some_and(|e| e.version == package.version)
            || r.targets.iter().any(|t| t.version == package.version)
            || r.previous_versions.contains(&package.version))
}

/// Whether a failed node of the rollout is put back to what it ran: then its job carries each
/// node's previous catalog entry (see [`patch_job`]).
pub fn rolls_nodes_back(r: &pb::Rollout) -> bool {
    r.strategy.as_ref().is_some_and(|s| s.on_failure == pb::OnNodeFailure::RollBack as i32)
}

/// The job that patches the site at plan `index`, with its envelope. `installed` holds the
/// catalog entries each role of the site's design names, read when [`reinstalls`] says so: its
/// binaries are reinstalled after the reimage. `previous` holds the catalog entries of the
/// versions the site's nodes ran (by version), read when [`rolls_nodes_back`] says so: a node
/// that fails goes back to its own.
pub fn patch_job(
    r: &pb::Rollout,
    index: usize,
    site: pb::RolloutPlanSite,
    installed: &[pb::RoleArtifacts],
    previous: &std::collections::BTreeMap<String, pb::Package>,
) -> (pb::PatchNodes, Envelope) {
    let nodes = site.nodes.len() as u32;
    let max_unavailable = plan::Amount::parse(
        r.strategy.as_ref().map_or("", |st| st.max_unavailable.as_str()),
        "max_unavailable",
        plan::Amount::Count(1),
    )
    .unwrap_or(plan::Amount::Count(1))
    .of(nodes)
    .max(1);
    let reinstall = installed
        .iter()
        .map(|ra| pb::RoleArtifacts {
            role: ra.role,
            packages: ra.packages.iter().filter(|e| e.kind == pb::PackageKind::Binary as i32).cloned().collect(),
        })
        .collect();
    let env = envelope(r).derive(pb::PatchNodes::KIND, Some(&site.site_id));
    let on_failure = if rolls_nodes_back(r) { pb::OnNodeFailure::RollBack } else { pb::OnNodeFailure::Leave };
    let previous = match on_failure {
        pb::OnNodeFailure::RollBack => {
            site.from_versions.iter().map(|v| previous.get(v).cloned().unwrap_or_default()).collect()
        }
        _ => Vec::new(),
    };
    let targets = rollback::targets(r, &site);
    let job = pb::PatchNodes {
        site_id: site.site_id,
        rollout_id: r.rollout_id.clone(),
        plan_index: index as u32,
        package: Some(r.entry.clone().unwrap_or_default()),
        nodes: site.nodes,
        max_unavailable,
        max_failures: threshold(r).saturating_sub(failures_counted(r)),
        reinstall,
        on_failure: on_failure as i32,
        previous,
        targets,
    };
    (job, env)
}

#[cfg(test)]
mod tests;
