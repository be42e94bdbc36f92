//! An operator's commands to a running rollout, as pure decisions: pause, resume (which also
//! approves a rollout waiting at its approval gate), cancel.

use bus_schema::envelope::Envelope;
use bus_schema::pb;

use super::{advance, phase, push};
use crate::decision::Refusal;

fn not_now(r: &pb::Rollout, phase: pb::RolloutPhase, what: &str) -> Refusal {
    Refusal {
        code: pb::RejectCode::Conflict,
        reason: format!(
            "rollout {} is {} and cannot be {what}",
            r.rollout_id,
            phase.as_str_name().trim_start_matches("ROLLOUT_PHASE_").to_lowercase()
        ),
    }
}

/// `PauseRollout`: a running rollout starts no more sites (those started finish). `None` when
/// it is paused already.
///
/// # Errors
/// A `Conflict` refusal when the rollout is neither running nor paused.
pub fn pause(r: &pb::Rollout, reason: &str, cause: &Envelope) -> Result<Option<pb::Rollout>, Refusal> {
    match phase(r) {
        pb::RolloutPhase::Paused => Ok(None),
        pb::RolloutPhase::Running => {
            let mut next = r.clone();
            next.phase = pb::RolloutPhase::Paused as i32;
            next.reason = if reason.is_empty() { "paused by an operator".into() } else { reason.to_string() };
            let evt = pb::RolloutPaused { rollout_id: r.rollout_id.clone(), reason: next.reason.clone() };
            push(&mut next, &evt, &cause.derive("rollout_paused", None));
            Ok(Some(next))
        }
        other => Err(not_now(r, other, "paused")),
    }
}

/// `ResumeRollout`: a paused or halted rollout runs again (a halted one with a new failure
/// budget) and moves on if its wave finished meanwhile. `None` when it is running already.
///
/// # Errors
/// A `Conflict` refusal when the rollout has ended.
pub fn resume(r: &pb::Rollout, cause: &Envelope, now: i64) -> Result<Option<pb::Rollout>, Refusal> {
    match phase(r) {
        pb::RolloutPhase::Running => Ok(None),
        pb::RolloutPhase::Paused | pb::RolloutPhase::Halted => {
            let mut next = r.clone();
            if phase(r) == pb::RolloutPhase::Halted {
                // Its failure budget starts again from here.
                next.failure_base = r.failed;
            }
            // Resuming a rollout at an approval gate approves the wave that ended.
            if r.awaiting_approval {
                next.approved_waves = r.wave + 1;
                next.awaiting_approval = false;
            }
            next.phase = pb::RolloutPhase::Running as i32;
            next.reason.clear();
            let evt = pb::RolloutResumed { rollout_id: r.rollout_id.clone() };
            push(&mut next, &evt, &cause.derive("rollout_resumed", None));
            advance(&mut next, now);
            Ok(Some(next))
        }
        other => Err(not_now(r, other, "resumed")),
    }
}

/// `CancelRollout`: the rollout ends; sites that never reported let go of their leases.
/// `None` when it is cancelled already.
///
/// # Errors
/// A `Conflict` refusal when the rollout has completed.
pub fn cancel(r: &pb::Rollout, reason: &str, cause: &Envelope, now: i64) -> Result<Option<pb::Rollout>, Refusal> {
    match phase(r) {
        pb::RolloutPhase::Cancelled => Ok(None),
        pb::RolloutPhase::Completed => Err(not_now(r, pb::RolloutPhase::Completed, "cancelled")),
        _ => {
            let mut next = r.clone();
            next.phase = pb::RolloutPhase::Cancelled as i32;
            next.finished_unix_ms = now;
            next.reason = if reason.is_empty() { "cancelled by an operator".into() } else { reason.to_string() };
            let evt = pb::RolloutCancelled {
                rollout_id: r.rollout_id.clone(),
                reason: next.reason.clone(),
                patched: r.patched,
                failed: r.failed,
            };
            push(&mut next, &evt, &cause.derive("rollout_cancelled", None));
            Ok(Some(next))
        }
    }
}
