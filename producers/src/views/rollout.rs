//! The rollout read model the CLI (`rollout list`, `rollout show`) and the HTTP API share: a
//! rollout's headline numbers, and every site and node of its plan with what happened to it,
//! read from the rollout's records and what nodes run.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use anyhow::anyhow;
use bus_schema::names::{self, keys};
use bus_schema::pb;
use bus_schema::runtime::Bus;
use serde_json::{Value, json};

use super::human::{human_duration_ms, plural, rfc3339_ms, role_label};

/// A rollout id as given on the command line: a UUID.
pub fn rollout_id(id: &str) -> anyhow::Result<String> {
    let id = uuid::Uuid::parse_str(id.trim())
        .map_err(|_| anyhow!("{id:?} is not a rollout id (a UUID, as `landfall rollout list` shows)"))?;
    Ok(id.to_string())
}

/// The rollout's phase; `Unspecified` for one this build does not know.
pub fn phase_of(r: &pb::Rollout) -> pb::RolloutPhase {
    pb::RolloutPhase::try_from(r.phase).unwrap_or(pb::RolloutPhase::Unspecified)
}

fn phase_label(r: &pb::Rollout) -> String {
    phase_of(r).as_str_name().trim_start_matches("ROLLOUT_PHASE_").to_lowercase()
}

/// What undoing has to do with the rollout, for people: a rollback `rolling back` or `rolled
/// back`, a rollout `undone` by one; `None` for neither.
fn undo_label(r: &pb::Rollout) -> Option<&'static str> {
    match (r.rollback_of.is_empty(), phase_of(r)) {
        (false, pb::RolloutPhase::Completed) => Some("rolled back"),
        (false, _) => Some("rolling back"),
        (true, _) if !r.rolled_back_by.is_empty() => Some("undone"),
        _ => None,
    }
}

/// The phase as `rollout show` and `rollout list` print it: with [`undo_label`].
fn phase_text(r: &pb::Rollout) -> String {
    let plain = matches!(phase_of(r), pb::RolloutPhase::Running | pb::RolloutPhase::Completed);
    match undo_label(r) {
        // A rollback running or done says so for its phase.
        Some(u) if plain && !r.rollback_of.is_empty() => u.to_string(),
        Some(u) => format!("{}, {u}", phase_label(r)),
        None => phase_label(r),
    }
}

/// `k/n` for the current wave (1-based), or `-` when the plan has no wave.
fn wave_text(r: &pb::Rollout) -> String {
    let waves = r.wave_ends.len();
    match waves {
        0 => "-".to_string(),
        _ => format!("{}/{waves}", (r.wave as usize + 1).min(waves)),
    }
}

fn package_of(r: &pb::Rollout) -> (String, String) {
    let p = r.package.clone().unwrap_or_default();
    (p.name, p.version)
}

/// One rollout's headline numbers, as `rollout list -o json` gives them.
pub fn rollout_summary_json(r: &pb::Rollout) -> Value {
    let (name, version) = package_of(r);
    json!({
        "id": r.rollout_id,
        "package": name,
        "version": version,
        "phase": phase_label(r),
        "reason": r.reason,
        "planned_nodes": r.planned_nodes,
        "patched": r.patched,
        "failed": r.failed,
        "sites": r.sites,
        "sites_done": r.sites_done,
        "wave": (r.wave as usize + 1).min(r.wave_ends.len()),
        "waves": r.wave_ends.len(),
        "trigger": r.trigger,
        "actor": r.actor,
        "unchanged": r.unchanged,
        "rolled_back": r.rolled_back,
        "rollback_of": r.rollback_of,
        "rolled_back_by": r.rolled_back_by,
        "undo": undo_label(r),
        "ignore_windows": r.ignore_windows,
        "started": rfc3339_ms(r.started_unix_ms),
        "finished": rfc3339_ms(r.finished_unix_ms),
        "started_unix_ms": r.started_unix_ms,
        "finished_unix_ms": r.finished_unix_ms,
    })
}

/// Newest first: by start time, then by id (UUIDv7 ids sort by time too).
pub fn sort_newest_first(rollouts: &mut [pb::Rollout]) {
    rollouts.sort_by(|a, b| b.started_unix_ms.cmp(&a.started_unix_ms).then_with(|| b.rollout_id.cmp(&a.rollout_id)));
}

/// Rollouts as a table, one row each.
pub fn rollouts_text(rollouts: &[pb::Rollout]) -> String {
    if rollouts.is_empty() {
        return "no rollouts (landfall package patch NAME VERSION starts one)\n".to_string();
    }
    let pkgs: Vec<String> = rollouts
        .iter()
        .map(|r| {
            let (n, v) = package_of(r);
            format!("{n}@{v}")
        })
        .collect();
    let pw = pkgs.iter().map(String::len).max().unwrap_or(0).max(7);
    let tw = rollouts.iter().map(|r| r.trigger.len()).max().unwrap_or(0).max(7);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<36}  {:<pw$}  {:<16}  {:>11}  {:>6}  {:>11}  {:>5}  {:<tw$}  STARTED",
        "ID", "PACKAGE", "PHASE", "PATCHED", "FAILED", "SITES DONE", "WAVE", "TRIGGER"
    );
    for (r, pkg) in rollouts.iter().zip(&pkgs) {
        let _ = writeln!(
            out,
            "{:<36}  {:<pw$}  {:<16}  {:>11}  {:>6}  {:>11}  {:>5}  {:<tw$}  {}",
            r.rollout_id,
            pkg,
            phase_text(r),
            format!("{}/{}", r.patched, r.planned_nodes),
            r.failed,
            format!("{}/{}", r.sites_done, r.sites),
            wave_text(r),
            if r.trigger.is_empty() { "-" } else { r.trigger.as_str() },
            rfc3339_ms(r.started_unix_ms),
        );
    }
    out
}

/// What happened to one planned node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeStatus {
    /// Its site has not started.
    Pending,
    /// Its site never started: the rollout was cancelled first.
    NotStarted,
    /// Its site is patching and has not reported this node yet.
    Patching,
    /// Its site's maintenance windows are closed: not before `opens` (ms; 0: none ever opens).
    WaitingForWindow(i64),
    /// Patched, as many times as its site record lists it (once, unless something is wrong).
    Patched(usize),
    /// Found at the version already: nothing was done to it.
    Unchanged,
    Failed {
        step: String,
        reason: String,
        /// What its rollback (the rollout's `on_failure`) came to; empty when not tried.
        rollback: String,
    },
    /// Not started: its site's failures passed its budget.
    Skipped,
    /// Its site ran out of time before reporting this node.
    TimedOut,
    /// Its site is done but does not mention this node.
    Unreported,
}

impl NodeStatus {
    pub fn label(&self) -> String {
        match self {
            Self::Pending => "pending".into(),
            Self::NotStarted => "not started".into(),
            Self::Patching => "patching".into(),
            Self::WaitingForWindow(0) => "waiting: no maintenance window of the site ever opens".into(),
            Self::WaitingForWindow(ms) => {
                format!("waiting for the site's maintenance window (opens {})", rfc3339_ms(*ms))
            }
            Self::Patched(1) => "patched".into(),
            Self::Patched(n) => format!("patched {n} times"),
            Self::Unchanged => "at the version already, left as it was".into(),
            Self::Failed { step, reason, rollback } => {
                let step = if step.is_empty() { String::new() } else { format!("{step}: ") };
                let rollback = if rollback.is_empty() { String::new() } else { format!("; {rollback}") };
                format!("failed: {step}{reason}{rollback}")
            }
            Self::Skipped => "skipped".into(),
            Self::TimedOut => "timed out".into(),
            Self::Unreported => "not reported".into(),
        }
    }

    fn key(&self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::NotStarted => "not_started",
            Self::Patching => "patching",
            Self::WaitingForWindow(_) => "waiting_window",
            Self::Patched(_) => "patched",
            Self::Unchanged => "unchanged",
            Self::Failed { .. } => "failed",
            Self::Skipped => "skipped",
            Self::TimedOut => "timed_out",
            Self::Unreported => "unreported",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct NodeView {
    pub node: String,
    pub role: i32,
    pub from_version: String,
    /// Where it goes: the rollout's version, or for a rollback what the node ran before.
    pub to_version: String,
    pub status: NodeStatus,
    /// What the rollback of this rollout did to the node, once one was asked for: `rolled
    /// back`, `rollback failed`, `left as it was` (not changed), or `rolling back`.
    pub undone: Option<&'static str>,
    /// What the node runs of the package now, as observed.
    pub observed: Option<String>,
    /// False for a node a site record mentions that the plan does not.
    pub planned: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SiteView {
    pub index: u32,
    pub site: String,
    /// 0-based.
    pub wave: usize,
    pub canary: bool,
    /// `pending` (no site record yet; `not_started` once the rollout is cancelled), `patching`,
    /// `done` or `timed_out`.
    pub state: String,
    pub nodes: Vec<NodeView>,
}

/// What the rollback of a rollout did to its node `node` at `site`, from the rollback's site
/// records (`undo`); `None` when the rollout was not rolled back.
fn undone_status(undo: Option<&BTreeMap<String, pb::RolloutSite>>, site: &str, node: &str) -> Option<&'static str> {
    let Some(record) = undo?.get(site) else { return Some("rolling back") };
    let has = |l: &[String]| l.iter().any(|n| n == node);
    Some(if has(&record.patched) {
        "rolled back"
    } else if record.failed.iter().any(|f| f.node == node) {
        "rollback failed"
    } else if has(&record.unchanged) || has(&record.skipped) {
        "left as it was"
    } else {
        "rolling back"
    })
}

/// Every site of a rollout's plan, in plan order, and every node with what happened to it;
/// `undo` holds the site records of the rollback that undoes it, if any.
pub fn rollout_sites(
    rollout: &pb::Rollout,
    plan: &[(u32, pb::RolloutPlanSite)],
    records: &BTreeMap<String, pb::RolloutSite>,
    observed: &BTreeMap<(String, String), String>,
    undo: Option<&BTreeMap<String, pb::RolloutSite>>,
) -> Vec<SiteView> {
    let cancelled = phase_of(rollout) == pb::RolloutPhase::Cancelled;
    let never = if cancelled { NodeStatus::NotStarted } else { NodeStatus::Pending };
    let mut out = Vec::with_capacity(plan.len());
    for (index, ps) in plan {
        let wave = rollout.wave_ends.iter().position(|&end| *index < end).unwrap_or(rollout.wave_ends.len());
        // A site that waited for its window keeps that record until it reports.
        let started = consumers::rollout::decide::dispatched(rollout, *index as usize);
        let record =
            records.get(&ps.site_id).filter(|r| !(started && r.state == pb::RolloutSiteState::WaitingWindow as i32));
        let patching = pb::RolloutSite { state: pb::RolloutSiteState::Patching as i32, ..Default::default() };
        let record = record.or(started.then_some(&patching));
        let state = match record.map(|r| pb::RolloutSiteState::try_from(r.state)) {
            None => never.key().to_string(),
            Some(Ok(s)) => s.as_str_name().trim_start_matches("ROLLOUT_SITE_STATE_").to_lowercase(),
            Some(Err(_)) => "unknown".to_string(),
        };
        let status_of = |node: &str| -> NodeStatus {
            let Some(r) = record else { return never.clone() };
            let times = r.patched.iter().filter(|n| *n == node).count();
            if times > 0 {
                return NodeStatus::Patched(times);
            }
            if let Some(f) = r.failed.iter().find(|f| f.node == node) {
                let (step, reason, rollback) = (f.failed_step.clone(), f.reason.clone(), f.rollback.clone());
                return NodeStatus::Failed { step, reason, rollback };
            }
            if r.unchanged.iter().any(|n| n == node) {
                return NodeStatus::Unchanged;
            }
            if r.skipped.iter().any(|n| n == node) {
                return NodeStatus::Skipped;
            }
            match pb::RolloutSiteState::try_from(r.state) {
                Ok(pb::RolloutSiteState::Done) => NodeStatus::Unreported,
                Ok(pb::RolloutSiteState::TimedOut) => NodeStatus::TimedOut,
                Ok(pb::RolloutSiteState::WaitingWindow) => NodeStatus::WaitingForWindow(r.window_opens_unix_ms),
                _ => NodeStatus::Patching,
            }
        };
        let observed_of = |node: &str| observed.get(&(ps.site_id.clone(), node.to_string())).cloned();
        let mut nodes: Vec<NodeView> = ps
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| NodeView {
                node: n.name.clone(),
                role: n.role,
                from_version: ps.from_versions.get(i).cloned().unwrap_or_default(),
                to_version: ps.to_versions.get(i).cloned().unwrap_or_else(|| package_of(rollout).1),
                undone: match status_of(&n.name) {
                    // Only what the rollout changed (or may have) is undone; a failed node its
                    // own on_failure put back is back already.
                    NodeStatus::Failed { .. }
                        if record.is_some_and(|r| r.failed.iter().any(|f| f.node == n.name && f.rolled_back)) =>
                    {
                        None
                    }
                    NodeStatus::Patched(_)
                    | NodeStatus::Failed { .. }
                    | NodeStatus::Patching
                    | NodeStatus::TimedOut => undone_status(undo, &ps.site_id, &n.name),
                    _ => None,
                },
                status: status_of(&n.name),
                observed: observed_of(&n.name),
                planned: true,
            })
            .collect();
        if let Some(r) = record {
            let planned: BTreeSet<&str> = ps.nodes.iter().map(|n| n.name.as_str()).collect();
            let mentioned: BTreeSet<&str> = r
                .patched
                .iter()
                .chain(&r.skipped)
                .chain(&r.unchanged)
                .map(String::as_str)
                .chain(r.failed.iter().map(|f| f.node.as_str()))
                .collect();
            for extra in mentioned.difference(&planned) {
                nodes.push(NodeView {
                    node: extra.to_string(),
                    role: 0,
                    from_version: String::new(),
                    to_version: String::new(),
                    undone: None,
                    status: status_of(extra),
                    observed: observed_of(extra),
                    planned: false,
                });
            }
        }
        out.push(SiteView { index: *index, site: ps.site_id.clone(), wave, canary: ps.canary, state, nodes });
    }
    out
}

/// Node counts by status over every site: `patched`, `failed`, … and `patched_more_than_once`.
pub fn node_counts(sites: &[SiteView]) -> BTreeMap<&'static str, usize> {
    let mut counts: BTreeMap<&'static str, usize> = BTreeMap::new();
    for n in sites.iter().flat_map(|s| &s.nodes) {
        *counts.entry(n.status.key()).or_default() += 1;
        if matches!(n.status, NodeStatus::Patched(t) if t > 1) {
            *counts.entry("patched_more_than_once").or_default() += 1;
        }
    }
    counts
}

fn strategy_text(s: &pb::ResolvedStrategy) -> String {
    let mut parts = Vec::new();
    if s.canary_sites > 0 {
        parts.push(format!("{} first", plural(s.canary_sites, "canary site", "canary sites")));
    }
    parts.push(match s.max_concurrent_sites {
        0 => "every site at once".to_string(),
        n => format!("{} at once", plural(n, "site", "sites")),
    });
    parts.push(match s.max_unavailable.trim() {
        "" => "1 node of a site at once".to_string(),
        p if p.ends_with('%') => format!("{p} of a site's nodes at once"),
        n => format!("{n} node{} of a site at once", if n == "1" { "" } else { "s" }),
    });
    parts.push(format!("halts when more than {} fail", plural(s.failure_threshold, "node", "nodes")));
    if s.roll_back_on_halt {
        parts.push("then rolls itself back".into());
    }
    if s.on_failure == pb::OnNodeFailure::RollBack as i32 {
        parts.push("a failed node is rolled back".into());
    }
    if s.wave_timeout_seconds > 0 {
        let action = match pb::WaveTimeoutAction::try_from(s.on_wave_timeout) {
            Ok(pb::WaveTimeoutAction::Continue) => "continue",
            _ => "abort",
        };
        parts.push(format!("wave timeout {} ({action})", human_duration_ms(i64::from(s.wave_timeout_seconds) * 1000)));
    }
    parts.join(", ")
}

/// One rollout and its plan's sites and nodes as JSON (`rollout show -o json`, `GET /v1/rollouts/{id}`).
pub fn rollout_show_json(r: &pb::Rollout, sites: &[SiteView]) -> Value {
    let mut head = rollout_summary_json(r);
    if let Some(o) = head.as_object_mut() {
        o.insert("strategy".into(), serde_json::to_value(&r.strategy).unwrap_or_default());
        o.insert("selector".into(), serde_json::to_value(&r.selector).unwrap_or_default());
        o.insert("timed_out_sites".into(), json!(r.timed_out_sites));
        o.insert("nodes".into(), json!(node_counts(sites)));
    }
    let sites: Vec<Value> = sites
        .iter()
        .map(|s| {
            let nodes: Vec<Value> = s
                .nodes
                .iter()
                .map(|n| {
                    let mut v = json!({
                        "node": n.node,
                        "role": role_label(n.role),
                        "from_version": n.from_version,
                        "to_version": n.to_version,
                        "status": n.status.key(),
                        "undone": n.undone,
                        "observed_version": n.observed,
                        "planned": n.planned,
                    });
                    match &n.status {
                        NodeStatus::Patched(times) => v["times_patched"] = json!(times),
                        NodeStatus::Failed { step, reason, rollback } => {
                            v["failed_step"] = json!(step);
                            v["reason"] = json!(reason);
                            v["rollback"] = json!(rollback);
                        }
                        _ => {}
                    }
                    v
                })
                .collect();
            json!({
                "index": s.index,
                "site": s.site,
                "wave": s.wave + 1,
                "canary": s.canary,
                "state": s.state,
                "nodes": nodes,
            })
        })
        .collect();
    json!({ "rollout": head, "sites": sites })
}

/// One rollout and its plan's sites and nodes for people (`rollout show`).
pub fn rollout_show_text(r: &pb::Rollout, sites: &[SiteView]) -> String {
    let (name, version) = package_of(r);
    let mut out = String::new();
    let _ = writeln!(out, "rollout   {}", r.rollout_id);
    match r.rollback_of.as_str() {
        "" => {
            let _ = writeln!(out, "package   {name} → {version}");
        }
        _ => {
            let back: Vec<&str> = r.targets.iter().map(|t| t.version.as_str()).collect();
            let _ = writeln!(out, "package   {name} {version} → back to {}", back.join(", "));
        }
    }
    let _ = writeln!(out, "phase     {}", phase_text(r));
    if !r.reason.is_empty() {
        let _ = writeln!(out, "reason    {}", r.reason);
    }
    let _ = writeln!(out, "trigger   {}", if r.trigger.is_empty() { "-" } else { r.trigger.as_str() });
    if !r.rollback_of.is_empty() {
        let _ = writeln!(out, "undoes    rollout {}: each node back to what it ran", r.rollback_of);
    }
    if !r.rolled_back_by.is_empty() {
        let _ = writeln!(out, "undone by rollout {} (landfall rollout show {})", r.rolled_back_by, r.rolled_back_by);
    }
    if r.ignore_windows && r.rollback_of.is_empty() {
        let _ = writeln!(out, "windows   ignored: sites started outside their maintenance windows");
    }
    let finished = match r.finished_unix_ms {
        0 => String::new(),
        ms => format!(", finished {} (took {})", rfc3339_ms(ms), human_duration_ms(ms - r.started_unix_ms)),
    };
    let _ = writeln!(out, "started   {}{finished}", rfc3339_ms(r.started_unix_ms));
    let _ = writeln!(
        out,
        "progress  {}/{} nodes {}, {} failed{}{}; {}/{} sites done; wave {}",
        r.patched,
        r.planned_nodes,
        if r.rollback_of.is_empty() { "patched" } else { "rolled back" },
        r.failed,
        match r.rolled_back {
            0 => String::new(),
            n => format!(" ({n} of them rolled back, healthy again)"),
        },
        match r.unchanged {
            0 => String::new(),
            n => format!(", {n} at the version already"),
        },
        r.sites_done,
        r.sites,
        wave_text(r)
    );
    if let Some(s) = &r.strategy {
        let _ = writeln!(out, "strategy  {}", strategy_text(s));
    }
    let mut wave = None;
    for s in sites {
        if wave != Some(s.wave) {
            wave = Some(s.wave);
            let canary = if s.canary { " (canary)" } else { "" };
            let _ = writeln!(out, "\nwave {}{canary}", s.wave + 1);
        }
        let mark = if s.canary { " (canary)" } else { "" };
        let state = s.state.replace('_', " ");
        let _ = writeln!(out, "  {}{mark}: {state}, {}", s.site, plural(s.nodes.len() as u64, "node", "nodes"));
        let width = s.nodes.iter().map(|n| n.node.len()).max().unwrap_or(0);
        for n in &s.nodes {
            let from = if n.from_version.is_empty() { "(none)" } else { n.from_version.as_str() };
            let runs = match &n.observed {
                Some(v) => format!("  (runs {v})"),
                None => String::new(),
            };
            let unplanned = if n.planned { "" } else { "  (not in the plan)" };
            let undone = n.undone.map(|u| format!("  [{u}]")).unwrap_or_default();
            let status = match (&n.status, r.rollback_of.is_empty()) {
                (NodeStatus::Patched(1), false) => "rolled back".to_string(),
                (status, _) => status.label(),
            };
            let _ = writeln!(
                out,
                "    {:<width$}  {:<6}  {from} → {}  {status}{runs}{unplanned}{undone}",
                n.node,
                role_label(n.role),
                n.to_version,
            );
        }
    }
    let counts = node_counts(sites);
    let total: usize = sites.iter().map(|s| s.nodes.len()).sum();
    let mut parts = vec![format!("{total} in the plan")];
    for key in
        ["patched", "unchanged", "failed", "skipped", "timed_out", "unreported", "patching", "pending", "not_started"]
    {
        if let Some(n) = counts.get(key) {
            parts.push(format!("{n} {}", key.replace('_', " ")));
        }
    }
    let _ = writeln!(out, "\nnodes     {}", parts.join(", "));
    match counts.get("patched_more_than_once") {
        Some(n) => {
            let _ = writeln!(out, "          {n} patched more than once!");
        }
        None if counts.contains_key("patched") => {
            let _ = writeln!(out, "          every patched node was patched once");
        }
        None => {}
    }
    out
}

/// A rollout and every site and node of its plan with what happened to it; `None` when there
/// is no such rollout. `id` must be a rollout id (see [`rollout_id`]).
///
/// A rollout compacted after the retention comes back from its summary, with no site: see
/// [`compacted_rollout`] for what the summary keeps.
pub async fn rollout_detail(bus: &Bus, id: &str) -> anyhow::Result<Option<(pb::Rollout, Vec<SiteView>)>> {
    let sagas = bus.kv(names::SAGAS_BUCKET).await?;
    let Some((r, _)) = sagas.get::<pb::Rollout>(&keys::rollout(id)).await? else {
        return Ok(compacted_rollout(bus, id)
            .await?
            .map(|s| (consumers::compaction::rollout_from_summary(&s), vec![])));
    };
    let mut plan = Vec::new();
    for chunk in 0..r.plan_chunks {
        let Some((c, _)) = sagas.get::<pb::RolloutPlanChunk>(&keys::rollout_plan(id, chunk)).await? else {
            tracing::warn!(rollout = id, chunk, "a plan chunk of the rollout is missing");
            continue;
        };
        plan.extend(c.sites.into_iter().enumerate().map(|(i, s)| (c.first_index + i as u32, s)));
    }
    let records: BTreeMap<String, pb::RolloutSite> = sagas
        .scan::<pb::RolloutSite>(&keys::rollout_sites_prefix(id))
        .await?
        .into_iter()
        .map(|(_, s, _)| (s.site_id.clone(), s))
        .collect();
    let (name, _) = package_of(&r);
    let observed = observed_package(bus, &name).await?;
    let undo = match r.rolled_back_by.as_str() {
        "" => None,
        by => Some(
            sagas
                .scan::<pb::RolloutSite>(&keys::rollout_sites_prefix(by))
                .await?
                .into_iter()
                .map(|(_, s, _)| (s.site_id.clone(), s))
                .collect::<BTreeMap<_, _>>(),
        ),
    };
    let sites = rollout_sites(&r, &plan, &records, &observed, undo.as_ref());
    Ok(Some((r, sites)))
}

/// The summary of a rollout compacted after the retention; `None` when it was not compacted
/// (or never was).
pub async fn compacted_rollout(bus: &Bus, id: &str) -> anyhow::Result<Option<pb::RolloutSummary>> {
    let sagas = bus.kv(names::SAGAS_BUCKET).await?;
    Ok(sagas.get::<pb::RolloutSummary>(&keys::rollout_summary(id)).await?.map(|(s, _)| s))
}

/// Every compacted rollout, as the records they stand for (no plan, no site detail).
pub async fn compacted_rollouts(bus: &Bus) -> anyhow::Result<Vec<pb::Rollout>> {
    let sagas = bus.kv(names::SAGAS_BUCKET).await?;
    Ok(sagas
        .scan::<pb::RolloutSummary>(keys::ROLLOUT_SUMMARY_PREFIX)
        .await?
        .iter()
        .map(|(_, s, _)| consumers::compaction::rollout_from_summary(s))
        .collect())
}

/// What a compacted rollout's summary adds for people: when, and which sites failed.
pub fn compacted_text(s: &pb::RolloutSummary) -> String {
    let mut out = format!(
        "compacted {} after the retention: per-site detail is gone\n",
        crate::views::human::rfc3339_ms(s.compacted_unix_ms)
    );
    if !s.failed_sites.is_empty() {
        let more = if s.failed_sites_more > 0 { format!(" and {} more", s.failed_sites_more) } else { String::new() };
        out.push_str(&format!("failed    {}{more}\n", s.failed_sites.join(", ")));
    }
    out
}

/// What every node runs of one package, by (site, node), as observed.
pub async fn observed_package(bus: &Bus, name: &str) -> anyhow::Result<BTreeMap<(String, String), String>> {
    let observed = bus.kv(names::OBSERVED_BUCKET).await?;
    Ok(observed
        .scan_matching::<pb::ObservedVersion>(&keys::observed_package_everywhere(name))
        .await?
        .into_iter()
        .map(|(_, v, _)| ((v.site_id, v.node), v.version))
        .collect())
}

#[cfg(test)]
mod tests;
