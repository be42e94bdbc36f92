//! Undoing a rollout as a whole, as pure decisions: whether a rollback may start, and the
//! rollout it is. A rollback is a rollout of its own (id derived from the undone one's, so there
//! is one per rollout) that moves every node the undone rollout changed back to the version it
//! found on it: sites in the reverse order of the undone plan, with its strategy.

use std::collections::{BTreeMap, BTreeSet};

use bus_schema::envelope::Envelope;
use bus_schema::pb;

use super::{CHUNK_SIZE, Planned, advance, envelope, phase, push, wave_started};
use crate::decision::Refusal;

pub use bus_schema::rollout::rollback_id;

/// What must happen to the undone rollout before its rollback is planned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Before {
    /// Nothing: it has ended.
    Nothing,
    /// It is cancelled first: a halted rollout (resuming it later would undo the undoing), or a
    /// running or paused one whose rollback said `cancel`.
    Cancel,
}

/// Whether rollout `id` (`undone`, as read) may be rolled back now, and what comes first.
/// `rollback` is the rollback record already there, if any: a rollout is undone once.
///
/// # Errors
/// `Invalid` for an unknown rollout or a rollback (a rollback is not undone: patch forward),
/// `Conflict` for one already rolled back (saying how far that went) or one still running or
/// paused without `cancel`.
pub fn may_roll_back(
    id: &str,
    undone: Option<&pb::Rollout>,
    rollback: Option<&pb::Rollout>,
    cancel: bool,
) -> Result<Before, Refusal> {
    let Some(r) = undone else {
        return Err(Refusal { code: pb::RejectCode::Invalid, reason: format!("there is no rollout {id}") });
    };
    if !r.rollback_of.is_empty() {
        return Err(Refusal {
            code: pb::RejectCode::Invalid,
            reason: format!(
                "rollout {id} is the rollback of rollout {}: a rollback is not rolled back; patch the package \
                 forward again (landfall package patch)",
                r.rollback_of
            ),
        });
    }
    if let Some(rb) = rollback {
        return Err(Refusal { code: pb::RejectCode::Conflict, reason: already_rolled_back(id, rb) });
    }
    match phase(r) {
        pb::RolloutPhase::Completed | pb::RolloutPhase::Cancelled => Ok(Before::Nothing),
        pb::RolloutPhase::Halted => Ok(Before::Cancel),
        pb::RolloutPhase::Running | pb::RolloutPhase::Paused if cancel => Ok(Before::Cancel),
        other => Err(Refusal {
            code: pb::RejectCode::Conflict,
            reason: format!(
                "rollout {id} is {} ({} of {} nodes patched): cancel it first (landfall rollout cancel {id}), \
                 or roll it back with --cancel",
                other.as_str_name().trim_start_matches("ROLLOUT_PHASE_").to_lowercase(),
                r.patched,
                r.planned_nodes
            ),
        }),
    }
}

/// What a second rollback of a rollout is answered: what the first did, nothing twice.
fn already_rolled_back(id: &str, rb: &pb::Rollout) -> String {
    let state = phase(rb).as_str_name().trim_start_matches("ROLLOUT_PHASE_").to_lowercase();
    format!(
        "rollout {id} was rolled back already by rollout {} ({state}: {} of {} nodes back, {} failed); nothing was \
         done twice (landfall rollout show {})",
        rb.rollout_id, rb.patched, rb.planned_nodes, rb.failed, rb.rollout_id
    )
}

/// One site the undone rollout sent a job: where it was in the plan, what was planned there, and
/// its record when its report (or its wave's time-out) wrote one.
#[derive(Debug, Clone)]
pub struct UndoneSite {
    pub planned: pb::RolloutPlanSite,
    pub record: Option<pb::RolloutSite>,
}

/// The nodes of a site the undone rollout may have changed, each with the version it goes back
/// to, and how many it left as they were. Without a record (its job is out, no report yet) every
/// planned node may have changed: a node the gateway finds at its old version is reported
/// unchanged. Nodes skipped, found at the version, or rolled back already by the rollout's own
/// `on_failure` are not touched.
fn changed_nodes(site: &UndoneSite) -> (Vec<(pb::NodeSpec, String)>, u32) {
    let planned = &site.planned;
    // A record that says only that the site waited for its window says nothing of its job.
    let reported = site.record.as_ref().filter(|rec| rec.state != pb::RolloutSiteState::WaitingWindow as i32);
    let changed: Option<BTreeSet<&str>> = reported.map(|rec| {
        rec.patched
            .iter()
            .map(String::as_str)
            .chain(rec.failed.iter().filter(|f| !f.rolled_back).map(|f| f.node.as_str()))
            .collect()
    });
    let (mut nodes, mut left) = (Vec::new(), 0);
    for (i, node) in planned.nodes.iter().enumerate() {
        let from = planned.from_versions.get(i).cloned().unwrap_or_default();
        let touched = changed.as_ref().is_none_or(|c| c.contains(node.name.as_str()));
        if touched && !from.is_empty() {
            nodes.push((node.clone(), from));
        } else {
            left += 1;
        }
    }
    (nodes, left)
}

/// The versions a rollback of `sites` goes back to: every node's `from_version`.
pub fn versions_to_go_back_to(sites: &[UndoneSite]) -> BTreeSet<String> {
    sites.iter().flat_map(|s| changed_nodes(s).0.into_iter().map(|(_, v)| v)).collect()
}

/// Plans the rollback of `undone` (it has ended, or was just cancelled) over the sites it sent
/// jobs (`sites`, in its plan order). `catalog` holds the catalog entry of each version to go back
/// to; `command` is the envelope of the `RollbackRollout` (or of the halt that asked for it).
///
/// # Errors
/// `UnknownPackage` when a version a node goes back to is no longer in the catalog.
pub fn rollback_plan(
    undone: &pb::Rollout,
    sites: &[UndoneSite],
    catalog: &BTreeMap<String, pb::Package>,
    reason: &str,
    command: &Envelope,
    now: i64,
) -> Result<Planned, Refusal> {
    let id = rollback_id(&undone.rollout_id);
    let name = undone.package.as_ref().map(|p| p.name.clone()).unwrap_or_default();
    let mut plan_sites = Vec::new();
    let mut unchanged = 0;
    let mut targets: BTreeMap<String, pb::Package> = BTreeMap::new();
    // The sites last changed go back first.
    for site in sites.iter().rev() {
        let (nodes, left) = changed_nodes(site);
        unchanged += left;
        if nodes.is_empty() {
            continue;
        }
        for (node, version) in &nodes {
            let Some(entry) = catalog.get(version) else {
                return Err(Refusal {
                    code: pb::RejectCode::UnknownPackage,
                    reason: format!(
                        "{name}@{version}, which node {} of site {} ran before rollout {}, is no longer in the catalog: \
                         register it again to roll back",
                        node.name, site.planned.site_id, undone.rollout_id
                    ),
                });
            };
            targets.entry(version.clone()).or_insert_with(|| entry.clone());
        }
        plan_sites.push(pb::RolloutPlanSite {
            site_id: site.planned.site_id.clone(),
            from_versions: vec![undone.package.as_ref().map(|p| p.version.clone()).unwrap_or_default(); nodes.len()],
            to_versions: nodes.iter().map(|(_, v)| v.clone()).collect(),
            nodes: nodes.into_iter().map(|(n, _)| n).collect(),
            canary: false,
        });
    }
    let strategy = undone.strategy.clone().unwrap_or_default();
    let canaries = (strategy.canary_sites as usize).min(plan_sites.len());
    for s in plan_sites.iter_mut().take(canaries) {
        s.canary = true;
    }
    let mut wave_ends = Vec::new();
    if canaries > 0 {
        wave_ends.push(canaries as u32);
    }
    let per_wave = match strategy.max_concurrent_sites {
        0 => plan_sites.len(),
        n => n as usize,
    };
    let mut end = canaries;
    while end < plan_sites.len() {
        end = (end + per_wave.max(1)).min(plan_sites.len());
        wave_ends.push(end as u32);
    }
    let planned_nodes: u32 = plan_sites.iter().map(|s| s.nodes.len() as u32).sum();
    let chunks: Vec<pb::RolloutPlanChunk> = plan_sites
        .chunks(CHUNK_SIZE as usize)
        .enumerate()
        .map(|(n, sites)| pb::RolloutPlanChunk { first_index: n as u32 * CHUNK_SIZE, sites: sites.to_vec() })
        .collect();
    let trigger = match reason {
        "" => format!("rollback of rollout {}", undone.rollout_id),
        reason => format!("rollback of rollout {}: {reason}", undone.rollout_id),
    };
    let mut r = pb::Rollout {
        rollout_id: id.clone(),
        package: undone.package.clone(),
        entry: undone.entry.clone(),
        strategy: Some(pb::ResolvedStrategy {
            canary_sites: canaries as u32,
            // Undoing waits for nobody, and a rollback is not rolled back.
            approval: pb::ApprovalGate::Unspecified as i32,
            on_failure: pb::OnNodeFailure::Leave as i32,
            roll_back_on_halt: false,
            ..strategy
        }),
        phase: pb::RolloutPhase::Running as i32,
        sites: plan_sites.len() as u32,
        planned_nodes,
        wave_ends,
        wave_started_unix_ms: now,
        plan_chunks: chunks.len() as u32,
        chunk_size: CHUNK_SIZE,
        started_unix_ms: now,
        trigger,
        traceparent: command.traceparent.clone(),
        selector: undone.selector.clone(),
        rollback_of: undone.rollout_id.clone(),
        targets: targets.into_values().collect(),
        command_id: command.id.clone(),
        // A rollback is the emergency: it starts where it must, windows or not.
        ignore_windows: true,
        ..Default::default()
    };
    let evt = pb::RolloutPlanned {
        rollout_id: id.clone(),
        package: r.package.clone(),
        sites: site_plans(&plan_sites, &r.wave_ends),
        planned_nodes,
        waves: r.wave_ends.len() as u32,
        trigger: r.trigger.clone(),
        failure_threshold: strategy.failure_threshold,
        rollback_of: undone.rollout_id.clone(),
        nodes_unchanged: unchanged,
        ..Default::default()
    };
    let env = envelope(&r).derive("rollout_planned", None);
    push(&mut r, &evt, &env);
    if r.sites > 0 {
        wave_started(&mut r);
    }
    advance(&mut r, now);
    Ok(Planned { chunks, rollout: r })
}

/// Each site's wave, in plan order.
fn site_plans(sites: &[pb::RolloutPlanSite], wave_ends: &[u32]) -> Vec<pb::RolloutSitePlan> {
    sites
        .iter()
        .enumerate()
        .map(|(i, s)| pb::RolloutSitePlan {
            site_id: s.site_id.clone(),
            nodes: s.nodes.len() as u32,
            wave: wave_ends.iter().position(|&end| (i as u32) < end).unwrap_or_default() as u32,
            canary: s.canary,
        })
        .collect()
}

/// The undone rollout, marked as rolled back by its rollback; `None` when it is already.
pub fn mark_rolled_back(r: &pb::Rollout) -> Option<pb::Rollout> {
    let id = rollback_id(&r.rollout_id);
    (r.rolled_back_by != id).then(|| pb::Rollout { rolled_back_by: id, ..r.clone() })
}

/// The command a rollout that rolls itself back publishes when it halts past its threshold.
pub(super) fn auto_rollback(r: &pb::Rollout) -> pb::RollbackRollout {
    pb::RollbackRollout {
        rollout_id: r.rollout_id.clone(),
        cancel: true,
        reason: format!("it rolls itself back past its failure threshold ({})", r.reason),
    }
}

/// The versions each node of a rollback's site goes to, as the job's `targets`: empty for a
/// rollout that is not a rollback.
pub(super) fn targets(r: &pb::Rollout, site: &pb::RolloutPlanSite) -> Vec<pb::Package> {
    if r.rollback_of.is_empty() {
        return Vec::new();
    }
    site.to_versions.iter().map(|v| r.targets.iter().find(|t| &t.version == v).cloned().unwrap_or_default()).collect()
}

#[cfg(test)]
mod tests;
