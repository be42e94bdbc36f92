//! A node's steps out of service and back during its patch (cordoned, drained, uncordoned): sent
//! on their own once the node has been out of service for the gateway's `steps_shown_after`
//! ([`STEPS_SHOWN_AFTER`] unless set), so that someone watching sees it; held until then, and
//! given to the node's end report when it is back sooner, or sent before its job goes back to be
//! tried again. Each step reaches the hub once, one way or the other, unless the gateway dies
//! while it holds them: the next attempt then cordons and drains a node cut short again (its
//! drain evicting nothing more), and of a node found at its version and cordoned sends only the
//! uncordon and the report.
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
}

struct State {
    shown: bool,
    held: Vec<Step>,
}

impl<'a> Steps<'a> {
    /// The steps of `node`, sent on their own from the first (`shown`) or held.
    pub(super) fn new(env: &'a Envelope, rollout_id: &'a str, node: &'a str, shown: bool) -> Self {
        let state = Mutex::new(State { shown, held: Vec::new() });
        Self { env, rollout_id, node, state, cordoned: Notify::new() }
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
        state.held.push(step);
        Ok(())
    }

    /// From now on every step is sent on its own, the held ones first. A step that cannot be
    /// sent stays held, with those after it, for the report.
    pub(super) async fn show<B: SiteBackend>(&self, gw: &Gateway<B>) -> Result<(), HandlerError> {
        let mut state = self.state.lock().await;
        if state.shown {
            return Ok(());
        }
        while let Some(step) = state.held.first().cloned() {
            self.send(gw, step).await?;
            state.held.remove(0);
        }
        state.shown = true;
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
