//! A node's steps out of service and back during its patch (cordoned, drained, uncordoned): sent
//! on their own once the node has been out of service for the gateway's `steps_shown_after`
//! ([`STEPS_SHOWN_AFTER`] unless set), so that someone watching sees it; held until then, and
//! given to the node's end report when it is back sooner, or sent before its job goes back to be
//! tried again. Each step reaches the hub once, one way or the other: held steps are written down
//! in the job's record ([`super::record`]) as they are held, so a gateway killed while it holds
//! them leaves them to the job's next attempt, which starts from them (a drain again evicts
//! nothing more, and adds nothing).
//!
//! A node patched in a few seconds is cordoned, drained and given back before anyone could look:
//! three events more for each node of a fleet, each stored and read by every consumer of the
//! events, would cost the hub more than its report itself.

use bus_schema::envelope::Envelope;
use bus_schema::pb;
use bus_schema::runtime::HandlerError;
use tokio::sync::{Mutex, Notify};
use tracing::warn;

use super::super::Gateway;
#[cfg(doc)]
use super::super::STEPS_SHOWN_AFTER;
use super::reports::Reports;
use crate::backend::SiteBackend;

/// A step of a node out of service and back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Step {
    Cordoned,
    Drained { evicted: Vec<String> },
    Uncordoned,
}

/// One node's steps in one attempt of its patch.
pub(super) struct Steps<'a> {
    env: &'a Envelope,
    rollout_id: &'a str,
    node: &'a str,
    /// Held while not shown; the lock also keeps the steps in order when the moment to show them
    /// comes while a step is being taken.
    state: Mutex<State>,
    /// Told when the node is cordoned: the clock of [`Self::show_when_long`] starts then.
    cordoned: Notify,
    /// The job's node reports, the node's among them ([`Self::report`]), and through them the
    /// job's record, where held steps are written down.
    reports: Option<&'a Reports<'a>>,
}

struct State {
    shown: bool,
    held: Vec<Step>,
}

impl<'a> Steps<'a> {
    /// The steps of `node`, sent on their own from the first.
    pub(super) fn shown(env: &'a Envelope, rollout_id: &'a str, node: &'a str) -> Self {
        let state = Mutex::new(State { shown: true, held: Vec::new() });
        Self { env, rollout_id, node, state, cordoned: Notify::new(), reports: None }
    }

    /// The steps of `node`, held and written down in the job's record, starting from those an
    /// earlier attempt of the job held when it ended; its report one of the job's `reports`.
    pub(super) fn held(env: &'a Envelope, rollout_id: &'a str, node: &'a str, reports: &'a Reports<'a>) -> Self {
        let held = reports.record().held(node);
        // A node an earlier attempt cordoned has been out of service since: its clock runs.
        let cordoned = Notify::new();
        if held.contains(&Step::Cordoned) {
            cordoned.notify_one();
        }
        let state = Mutex::new(State { shown: false, held });
        Self { env, rollout_id, node, state, cordoned, reports: Some(reports) }
    }

    /// Sends the job's node reports held so far, and every later one on its own: a failure goes
    /// alone and at once, and the reports of nodes done before it go first.
    pub(super) async fn show_reports<B: SiteBackend>(&self, gw: &Gateway<B>) -> Result<(), HandlerError> {
        match self.reports {
            Some(reports) => reports.show(gw).await,
            None => Ok(()),
        }
    }

    /// The node's report (`env` its own envelope): one of the job's reports, held with them or
    /// sent (see [`super::reports`]); sent at once when the steps are not a job's.
    pub(super) async fn report<B: SiteBackend>(
        &self,
        gw: &Gateway<B>,
        evt: pb::NodePatched,
        env: Envelope,
    ) -> Result<(), HandlerError> {
        match self.reports {
            Some(reports) => reports.report(gw, evt, env).await,
            None => gw.publish(&evt, &env).await,
        }
    }

    /// A step taken: sent when the steps are shown, held otherwise.
    pub(super) async fn took<B: SiteBackend>(&self, gw: &Gateway<B>, step: Step) -> Result<(), HandlerError> {
        if step == Step::Cordoned {
            self.cordoned.notify_one();
        }
        let mut state = self.state.lock().await;
        if state.shown {
            return self.send(gw, step).await;
        }
        if let Some(new) = hold(&mut state.held, step)
            && let Some(reports) = self.reports
            && let Err(e) = reports.record().note_held(self.node, &new)
        {
            warn!(site = %gw.site, node = self.node, error = %e, "cannot write a held step down; a gateway killed now loses it");
        }
        Ok(())
    }

    /// From now on every step is sent on its own, the held ones first. A step that cannot be
    /// sent stays held, with those after it, for the report.
    pub(super) async fn show<B: SiteBackend>(&self, gw: &Gateway<B>) -> Result<(), HandlerError> {
        let mut state = self.state.lock().await;
        if state.shown {
            return Ok(());
        }
        let had = !state.held.is_empty();
        while let Some(step) = state.held.first().cloned() {
            self.send(gw, step).await?;
            state.held.remove(0);
        }
        state.shown = true;
        if had
            && let Some(reports) = self.reports
            && let Err(e) = reports.record().note_sent(self.node)
        {
            // The next attempt sends them again: copies, dropped by their ids.
            warn!(site = %gw.site, node = self.node, error = %e, "cannot note a node's held steps sent");
        }
        Ok(())
    }

    /// Shows the steps once the node has been cordoned for the gateway's `steps_shown_after`;
    /// never ends, to be raced against the patch (which it must not cut short: steps it cannot
    /// send stay held for the report).
    pub(super) async fn show_when_long<B: SiteBackend>(&self, gw: &Gateway<B>) -> std::convert::Infallible {
        self.cordoned.notified().await;
        tokio::time::sleep(gw.steps_shown_after).await;
        if let Err(e) = self.show(gw).await {
            warn!(site = %gw.site, node = self.node, error = %e, "cannot send a node's steps yet; its report will carry them");
        }
        std::future::pending().await
    }

    /// The steps held so far, for the node's end report: from then on nothing more is held back
    /// (a later step is sent on its own).
    pub(super) async fn for_report(&self) -> Option<pb::NodeSteps> {
        let mut state = self.state.lock().await;
        state.shown = true;
        let held = std::mem::take(&mut state.held);
        if held.is_empty() {
            return None;
        }
        let mut steps = pb::NodeSteps::default();
        for step in held {
            match step {
                Step::Cordoned => steps.cordoned = true,
                Step::Drained { evicted } => {
                    steps.drained = true;
                    steps.evicted = evicted;
                }
                Step::Uncordoned => steps.uncordoned = true,
            }
        }
        Some(steps)
    }

    async fn send<B: SiteBackend>(&self, gw: &Gateway<B>, step: Step) -> Result<(), HandlerError> {
        let (site_id, node, rollout_id) = (gw.site.to_string(), self.node.to_string(), self.rollout_id.to_string());
        let env = |name: &str| self.env.derive(name, Some(self.node));
        match step {
            Step::Cordoned => gw.publish(&pb::NodeCordoned { site_id, node, rollout_id }, &env("node_cordoned")).await,
            Step::Drained { evicted } => {
                gw.publish(&pb::NodeDrained { site_id, node, rollout_id, evicted }, &env("node_drained")).await
            }
            Step::Uncordoned => {
                gw.publish(&pb::NodeUncordoned { site_id, node, rollout_id }, &env("node_uncordoned")).await
            }
        }
    }
}

impl Step {
    /// The step as written down: `cordoned`, `drained <pod>…`, `uncordoned`.
    pub(super) fn line(&self) -> String {
        match self {
            Step::Cordoned => "cordoned".into(),
            Step::Drained { evicted } => {
                std::iter::once("drained").chain(evicted.iter().map(String::as_str)).collect::<Vec<_>>().join(" ")
            }
            Step::Uncordoned => "uncordoned".into(),
        }
    }

    /// The step [`Self::line`] wrote as `words`.
    pub(super) fn from_words<'w>(mut words: impl Iterator<Item = &'w str>) -> Option<Self> {
        match words.next()? {
            "cordoned" => Some(Step::Cordoned),
            "drained" => Some(Step::Drained { evicted: words.map(String::from).collect() }),
            "uncordoned" => Some(Step::Uncordoned),
            _ => None,
        }
    }
}

/// Adds `step` to `held` unless it says nothing new (a step an earlier attempt took is taken
/// once; a drain again adds only the pods it evicted that the first did not): what it adds.
pub(super) fn hold(held: &mut Vec<Step>, step: Step) -> Option<Step> {
    if let Step::Drained { evicted } = &step
        && let Some(before) = held.iter_mut().find_map(|s| match s {
            Step::Drained { evicted } => Some(evicted),
            _ => None,
        })
    {
        let new: Vec<String> = evicted.iter().filter(|p| !before.contains(p)).cloned().collect();
        before.extend(new.iter().cloned());
        return (!new.is_empty()).then_some(Step::Drained { evicted: new });
    }
    if held.contains(&step) {
        return None;
    }
    held.push(step.clone());
    Some(step)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_is_held_once_and_a_drain_again_adds_only_its_new_pods() {
        let drained = |pods: &[&str]| Step::Drained { evicted: pods.iter().map(|p| p.to_string()).collect() };
        let mut held = Vec::new();
        assert_eq!(hold(&mut held, Step::Cordoned), Some(Step::Cordoned));
        assert_eq!(hold(&mut held, drained(&["ns/a", "ns/b"])), Some(drained(&["ns/a", "ns/b"])));
        assert_eq!(hold(&mut held, Step::Cordoned), None);
        assert_eq!(hold(&mut held, drained(&["ns/b"])), None);
        assert_eq!(hold(&mut held, drained(&["ns/b", "ns/c"])), Some(drained(&["ns/c"])));
        assert_eq!(hold(&mut held, Step::Uncordoned), Some(Step::Uncordoned));
        assert_eq!(held, [Step::Cordoned, drained(&["ns/a", "ns/b", "ns/c"]), Step::Uncordoned]);
        for step in &held {
            assert_eq!(Step::from_words(step.line().split_whitespace()).as_ref(), Some(step));
        }
        assert_eq!(Step::from_words("drained".split_whitespace()), Some(drained(&[])));
        assert_eq!(Step::from_words("something else".split_whitespace()), None);
    }
}
