//! Waves that run past their timeout, as pure decisions: which sites are silent, and what the
//! strategy makes of them (abort the rollout, or count them failed and go on).

use std::collections::HashMap;

use bus_schema::envelope::Envelope;
use bus_schema::pb::{self, BusJob};

use super::{advance, bit, check_halt, envelope, phase, progress, push, set_bit, wave_range};

/// Whether the running rollout's current wave has run past its timeout at `now`.
pub fn wave_timed_out(r: &pb::Rollout, now: i64) -> bool {
    let Some(timeout) = r.strategy.as_ref().map(|s| s.wave_timeout_seconds).filter(|t| *t > 0) else {
        return false;
    };
    phase(r) == pb::RolloutPhase::Running && now.saturating_sub(r.wave_started_unix_ms) > i64::from(timeout) * 1000
}

/// Plan indexes of the current wave's sites that have not reported.
pub fn silent_sites(r: &pb::Rollout) -> Vec<usize> {
    wave_range(r, r.wave).filter(|&i| !bit(&r.done, i)).collect()
}

/// A wave past its timeout, and what the strategy says to do: abort the rollout (halt it), or
/// count each silent site's planned nodes as failed and go on.
#[derive(Debug, Clone)]
pub struct WaveTimeout {
    rollout_id: String,
    wave: u32,
    timeout: u32,
    /// The silent sites, by plan index, as planned.
    late: Vec<(usize, pb::RolloutPlanSite)>,
    abort: bool,
    /// What happened, for the halt reason and the log.
    pub why: String,
    cause: Envelope,
}

/// The current wave of `r` timed out with the sites `late` silent (see [`silent_sites`]).
pub fn wave_timeout(r: &pb::Rollout, late: Vec<(usize, pb::RolloutPlanSite)>) -> WaveTimeout {
    let timeout = r.strategy.as_ref().map_or(0, |s| s.wave_timeout_seconds);
    let names: Vec<&str> = late.iter().map(|(_, s)| s.site_id.as_str()).take(10).collect();
    let abort = r.strategy.as_ref().is_some_and(|s| s.on_wave_timeout == pb::WaveTimeoutAction::Abort as i32);
    let wave = r.wave;
    let why = format!(
        "wave {wave} timed out after {timeout}s: {} site(s) did not report ({}{})",
        late.len(),
        names.join(", "),
        if late.len() > names.len() { ", …" } else { "" }
    );
    let cause = envelope(r).derive(&format!("wave_timeout/{wave}"), None);
    WaveTimeout { rollout_id: r.rollout_id.clone(), wave, timeout, late, abort, why, cause }
}

impl WaveTimeout {
    /// Whether the rollout goes on past the wave (rather than halting).
    pub fn goes_on(&self) -> bool {
        !self.abort
    }

    /// When the rollout goes on, each silent site's record, saying why its nodes count as failed
    /// (each of those sites lets go of its lease too); none when it halts.
    /// `cut_off` gives, for each late site the hub has counted cut off, since when.
    pub fn site_records(&self, now: i64, cut_off: &HashMap<String, i64>) -> Vec<pb::RolloutSite> {
        if self.abort {
            return vec![];
        }
        let timeout = self.timeout;
        self.late
            .iter()
            .map(|(i, s)| (i, s, match cut_off.get(&s.site_id) {
                Some(since) => format!(
                    "no report within the wave timeout of {timeout}s: the site is cut off (nothing heard since {}), counted as failed; its report is recorded when it arrives",
                    time_text(*since)
                ),
                None => format!("no report within the wave timeout of {timeout}s (site offline?): counted as failed"),
            }))
            .map(|(i, s, reason)| pb::RolloutSite {
                rollout_id: self.rollout_id.clone(),
                site_id: s.site_id.clone(),
                plan_index: *i as u32,
                state: pb::RolloutSiteState::TimedOut as i32,
                failed: s
                    .nodes
                    .iter()
                    .map(|n| pb::NodeResult {
                        node: n.name.clone(),
                        role: n.role,
                        outcome: pb::NodeOutcome::Failed as i32,
                        failed_step: pb::PatchNodes::KIND.to_string(),
                        reason: reason.clone(),
                        ..Default::default()
                    })
                    .collect(),
                updated_unix_ms: now,
                ..Default::default()
            })
            .collect()
    }

    /// The rollout after the timeout: halted, or with the silent sites counted as failed and
    /// moved on. `None` when it has left that wave or stopped running meanwhile.
    pub fn apply(&self, current: &pb::Rollout, now: i64) -> Option<pb::Rollout> {
        let wave = self.wave;
        if current.wave != wave || phase(current) != pb::RolloutPhase::Running {
            return None;
        }
        let mut next = current.clone();
        if self.abort {
            next.phase = pb::RolloutPhase::Halted as i32;
            next.reason = format!("{}; the strategy says abort", self.why);
            let evt = pb::RolloutHalted {
                rollout_id: next.rollout_id.clone(),
                reason: next.reason.clone(),
                patched: next.patched,
                failed: next.failed,
                wave,
            };
            push(&mut next, &evt, &self.cause.derive("rollout_halted", None));
            return Some(next);
        }
        for (i, s) in &self.late {
            if !bit(&next.done, *i) {
                set_bit(&mut next.done, *i);
                next.sites_done += 1;
                next.timed_out_sites += 1;
                next.failed += s.nodes.len() as u32;
            }
        }
        check_halt(&mut next, &self.cause);
        progress(&mut next);
        advance(&mut next, now);
        Some(next)
    }
}

/// A time as people read it (RFC 3339, UTC, whole seconds).
fn time_text(unix_ms: i64) -> String {
    let t =
        time::OffsetDateTime::from_unix_timestamp(unix_ms.div_euclid(1000)).unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    t.format(&time::format_description::well_known::Rfc3339).unwrap_or_else(|_| unix_ms.to_string())
}
