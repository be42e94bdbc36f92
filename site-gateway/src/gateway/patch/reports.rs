//! The nodes' reports of one site's part of a rollout (`NodePatched`): held for the site's report
//! (`SitePatched.nodes`) while the job has run less than the gateway's `steps_shown_after`, sent on
//! their own from then on, the held ones first. A site whose nodes are all done within moments
//! costs the hub one message instead of one per node, and nobody watching could have seen the
//! difference; a node that takes longer is shown as it ends. The reports held are never more than
//! [`MOST_HELD`], so a site's report stays small however many nodes it has.
//!
//! A job tried again sends its reports on their own from the first: the attempt before may have
//! sent some (shown, or sent as its job went back), and a report alone has the id it had then,
//! so the hub drops it as a copy, where carried in a site's report it would be said twice. A
//! node whose report an attempt held when its gateway was killed is reported by the next, its
//! version before the patch taken from the job's record, where it is written down as the report
//! is held (the node is at its version by then, and the patch no longer says where it came
//! from).
//!
//! A failure (`NodePatchFailed`) is always sent on its own, at once, the reports held before it
//! first: from then on the job's reports are all sent on their own, in the order their nodes
//! ended.

use bus_schema::envelope::Envelope;
use bus_schema::pb;
use bus_schema::runtime::HandlerError;
use tokio::sync::Mutex;
use tokio::time::Instant;
use tracing::warn;

use super::super::Gateway;
use super::record::JobRecord;
use crate::backend::SiteBackend;

/// Node reports held at most: past it, they are all sent on their own.
pub(super) const MOST_HELD: usize = 256;

/// The node reports of one attempt of a job.
pub(super) struct Reports<'a> {
    record: &'a JobRecord,
    /// When the job's nodes started (its artifacts staged): its reports are shown
    /// `steps_shown_after` later.
    started: Instant,
    state: Mutex<State>,
}

struct State {
    shown: bool,
    held: Vec<(pb::NodePatched, Envelope)>,
}

impl<'a> Reports<'a> {
    /// The reports of a job whose nodes start now, held from the first unless they are sent on
    /// their own from the first (`shown`: the gateway's `steps_shown_after` is zero, or the job
    /// is tried again).
    pub(super) fn new(record: &'a JobRecord, shown: bool) -> Self {
        let state = Mutex::new(State { shown, held: Vec::new() });
        Self { record, started: Instant::now(), state }
    }

    /// The job's record, which the reports and the nodes' steps write to.
    pub(super) fn record(&self) -> &'a JobRecord {
        self.record
    }

    /// A node's report, `env` its own envelope: sent when the reports are shown, held otherwise.
    /// The version it came from, if the report does not say it, is the one an earlier attempt
    /// of the job wrote down.
    pub(super) async fn report<B: SiteBackend>(
        &self,
        gw: &Gateway<B>,
        mut evt: pb::NodePatched,
        env: Envelope,
    ) -> Result<(), HandlerError> {
        if evt.from_version.is_empty()
            && let Some(from) = self.record.came_from(&evt.node)
        {
            evt.from_version = from.to_string();
        }
        let mut state = self.state.lock().await;
        if !state.shown && state.held.len() < MOST_HELD {
            if !evt.from_version.is_empty()
                && let Err(e) = self.record.note_from(&evt.node, &evt.from_version)
            {
                warn!(site = %gw.site, node = evt.node, error = %e, "cannot write down the version a node came from");
            }
            state.held.push((evt, env));
            return Ok(());
        }
        Self::send_held(gw, &mut state).await?;
        gw.publish(&evt, &env).await
    }

    /// From now on every report is sent on its own, the held ones first. One that cannot be sent
    /// stays held, with those after it, for the site's report.
    pub(super) async fn show<B: SiteBackend>(&self, gw: &Gateway<B>) -> Result<(), HandlerError> {
        let mut state = self.state.lock().await;
        Self::send_held(gw, &mut state).await
    }

    async fn send_held<B: SiteBackend>(gw: &Gateway<B>, state: &mut State) -> Result<(), HandlerError> {
        while let Some((evt, env)) = state.held.first() {
            gw.publish(evt, env).await?;
            state.held.remove(0);
        }
        state.shown = true;
        Ok(())
    }

    /// Shows the reports once the job has run for the gateway's `steps_shown_after`; never ends,
    /// to be raced against the job's nodes (which it must not cut short: reports it cannot send
    /// stay held for the site's report).
    pub(super) async fn show_when_long<B: SiteBackend>(&self, gw: &Gateway<B>) -> std::convert::Infallible {
        tokio::time::sleep_until(self.started + gw.steps_shown_after).await;
        if let Err(e) = self.show(gw).await {
            warn!(site = %gw.site, error = %e, "cannot send the nodes' reports yet; the site's report will carry them");
        }
        std::future::pending().await
    }

    /// The reports held, for the site's report.
    pub(super) async fn for_site_report(&self) -> Vec<pb::NodePatched> {
        let mut state = self.state.lock().await;
        state.shown = true;
        std::mem::take(&mut state.held).into_iter().map(|(evt, _)| evt).collect()
    }
}
