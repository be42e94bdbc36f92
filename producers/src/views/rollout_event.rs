//! The events that tell how one rollout goes, as `package patch --wait` follows them: which
//! belong to it, and one line each for people.

use std::fmt::Write as _;

use bus_schema::pb::{self, BusMessage};
use bus_schema::runtime::Delivery;

use super::human::{human_duration_ms, plural};

/// A fleet event that tells how a rollout goes, or the rejection of the command that started it.
#[derive(Debug, Clone, PartialEq)]
pub enum RolloutEvent {
    Planned(pb::RolloutPlanned),
    WaveStarted(pb::RolloutWaveStarted),
    Progress(pb::RolloutProgress),
    Halted(pb::RolloutHalted),
    Paused(pb::RolloutPaused),
    Resumed(pb::RolloutResumed),
    Cancelled(pb::RolloutCancelled),
    Completed(pb::RolloutCompleted),
    Rejected(pb::CommandRejected),
}

impl RolloutEvent {
    /// The event, when it is about rollout `id` (by its rollout id or its correlation id), or
    /// rejects the command with id `id`.
    pub fn of(d: &Delivery, id: &str) -> Option<Self> {
        let event = match d.type_name.as_str() {
            pb::RolloutPlanned::TYPE => Self::Planned(d.decode().ok()?),
            pb::RolloutWaveStarted::TYPE => Self::WaveStarted(d.decode().ok()?),
            pb::RolloutProgress::TYPE => Self::Progress(d.decode().ok()?),
            pb::RolloutHalted::TYPE => Self::Halted(d.decode().ok()?),
            pb::RolloutPaused::TYPE => Self::Paused(d.decode().ok()?),
            pb::RolloutResumed::TYPE => Self::Resumed(d.decode().ok()?),
            pb::RolloutCancelled::TYPE => Self::Cancelled(d.decode().ok()?),
            pb::RolloutCompleted::TYPE => Self::Completed(d.decode().ok()?),
            pb::CommandRejected::TYPE => Self::Rejected(d.decode().ok()?),
            _ => return None,
        };
        let ours = match &event {
            Self::Rejected(r) => r.command_id == id,
            other => other.rollout_id() == id || d.envelope.correlation == id,
        };
        ours.then_some(event)
    }

    fn rollout_id(&self) -> &str {
        match self {
            Self::Planned(e) => &e.rollout_id,
            Self::WaveStarted(e) => &e.rollout_id,
            Self::Progress(e) => &e.rollout_id,
            Self::Halted(e) => &e.rollout_id,
            Self::Paused(e) => &e.rollout_id,
            Self::Resumed(e) => &e.rollout_id,
            Self::Cancelled(e) => &e.rollout_id,
            Self::Completed(e) => &e.rollout_id,
            Self::Rejected(e) => &e.command_id,
        }
    }

    /// One progress line for people; `plan` (the rollout's RolloutPlanned) names each wave's
    /// sites and counts its waves.
    pub fn line(&self, plan: Option<&pb::RolloutPlanned>) -> String {
        match self {
            Self::Planned(p) => {
                let pkg = p.package.clone().unwrap_or_default();
                format!(
                    "planned: {} → {}: {} on {} in {} ({} at {} already, {} not installed; halts when more than {} fail){}",
                    pkg.name,
                    pkg.version,
                    plural(p.planned_nodes, "node", "nodes"),
                    plural(p.sites.len() as u64, "site", "sites"),
                    plural(p.waves, "wave", "waves"),
                    p.nodes_at_target,
                    pkg.version,
                    p.nodes_not_installed,
                    plural(p.failure_threshold, "node", "nodes"),
                    if p.trigger.is_empty() { String::new() } else { format!(" [{}]", p.trigger) },
                )
            }
            Self::WaveStarted(w) => {
                const SHOWN: usize = 8;
                let sites: Vec<&str> = match plan {
                    Some(p) if w.site_ids.is_empty() => {
                        p.sites.iter().filter(|s| s.wave == w.wave).map(|s| s.site_id.as_str()).collect()
                    }
                    _ => w.site_ids.iter().map(String::as_str).collect(),
                };
                let mut names = sites.iter().take(SHOWN).copied().collect::<Vec<_>>().join(",");
                if sites.len() > SHOWN {
                    let _ = write!(names, " and {} more", sites.len() - SHOWN);
                }
                let of = plan.map(|p| format!(" of {}", p.waves)).unwrap_or_default();
                let canary = if w.canary { " (canary)" } else { "" };
                match sites.len() {
                    0 => format!("wave {}{of} started{canary}", w.wave + 1),
                    n => format!(
                        "wave {}{of} started{canary}: {}: {names}",
                        w.wave + 1,
                        plural(n as u64, "site", "sites")
                    ),
                }
            }
            Self::Progress(p) => format!(
                "progress: wave {}: {}/{} nodes patched, {} failed; {}/{} sites done",
                p.wave + 1,
                p.patched,
                p.planned_nodes,
                p.failed,
                p.sites_done,
                p.sites_total
            ),
            Self::Halted(h) => format!(
                "halted in wave {}: {} ({} patched, {} failed; landfall rollout resume {} goes on)",
                h.wave + 1,
                h.reason,
                h.patched,
                h.failed,
                h.rollout_id
            ),
            Self::Paused(p) if p.reason.is_empty() => "paused".to_string(),
            Self::Paused(p) => format!("paused: {}", p.reason),
            Self::Resumed(_) => "resumed".to_string(),
            Self::Cancelled(c) => {
                let reason = if c.reason.is_empty() { String::new() } else { format!(": {}", c.reason) };
                format!("cancelled{reason} ({} patched, {} failed)", c.patched, c.failed)
            }
            Self::Completed(c) => format!(
                "completed: {}/{} nodes patched, {} failed, on {} in {}",
                c.patched,
                c.planned_nodes,
                c.failed,
                plural(c.sites, "site", "sites"),
                human_duration_ms(c.duration_ms)
            ),
            Self::Rejected(r) => format!("rejected: {}", r.reason),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rollout_event_lines() {
        let planned = RolloutEvent::Planned(pb::RolloutPlanned {
            rollout_id: "r".into(),
            package: Some(pb::PackageRef { name: "kubelet".into(), version: "1.30.0".into() }),
            sites: vec![Default::default(); 3],
            planned_nodes: 9,
            waves: 2,
            nodes_at_target: 1,
            failure_threshold: 0,
            ..Default::default()
        });
        assert_eq!(
            planned.line(None),
            "planned: kubelet → 1.30.0: 9 nodes on 3 sites in 2 waves (1 at 1.30.0 already, 0 not installed; \
             halts when more than 0 nodes fail)"
        );
        let wave = RolloutEvent::WaveStarted(pb::RolloutWaveStarted {
            wave: 0,
            canary: true,
            site_ids: (1..=10).map(|i| format!("edge-{i:02}")).collect(),
            ..Default::default()
        });
        assert!(wave.line(None).starts_with("wave 1 started (canary): 10 sites: edge-01,"), "{}", wave.line(None));
        assert!(wave.line(None).ends_with("edge-08 and 2 more"), "{}", wave.line(None));
        // The orchestrator leaves the sites out of RolloutWaveStarted: they come from the plan.
        let RolloutEvent::Planned(mut plan) = planned else { unreachable!() };
        plan.sites = ["edge-05", "edge-01", "edge-02"]
            .iter()
            .enumerate()
            .map(|(i, s)| pb::RolloutSitePlan { site_id: s.to_string(), wave: (i > 0) as u32, ..Default::default() })
            .collect();
        let second = RolloutEvent::WaveStarted(pb::RolloutWaveStarted { wave: 1, ..Default::default() });
        assert_eq!(second.line(Some(&plan)), "wave 2 of 2 started: 2 sites: edge-01,edge-02");
        assert_eq!(second.line(None), "wave 2 started");
        let done = RolloutEvent::Completed(pb::RolloutCompleted {
            planned_nodes: 9,
            patched: 9,
            sites: 3,
            duration_ms: 12_345,
            ..Default::default()
        });
        assert_eq!(done.line(None), "completed: 9/9 nodes patched, 0 failed, on 3 sites in 12.3s");
    }
}
