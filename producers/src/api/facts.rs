//! What a site's records say of it, read the same way by the views and by the overview's
//! counts: the site's state from its latest install, each node's step from the saga that last
//! worked on it, and the per-site facts the overview adds up, which the read model keeps per
//! site as its records change so that the overview never walks the whole fleet. Pure.

use bus_schema::pb;

/// What state a site can be in, from its latest install (see [`site_state`]).
pub const SITE_STATES: [&str; 5] = ["registered", "installing", "installed", "degraded", "failed"];

/// A node's step as people say it (see [`step_label`]).
pub const NODE_STEPS: [&str; 6] = ["not_installed", "pending", "os_provisioning", "os_provisioned", "ready", "failed"];

/// What state a site is in, from its latest install: `registered` (never installed),
/// `installing`, `installed`, `degraded` (installed with failed workers) or `failed`.
pub fn site_state(saga: Option<&pb::InstallSaga>) -> &'static str {
    let Some(s) = saga else { return "registered" };
    match pb::InstallPhase::try_from(s.phase) {
        Ok(pb::InstallPhase::Succeeded) => match pb::InstallOutcome::try_from(s.outcome) {
            Ok(pb::InstallOutcome::PartialSuccess) => "degraded",
            Ok(pb::InstallOutcome::Failure) => "failed",
            _ => "installed",
        },
        Ok(pb::InstallPhase::Failed) => "failed",
        _ => "installing",
    }
}

/// A node's step as people say it: `pending`, `os_provisioning`, `os_provisioned`, `ready`,
/// `failed`, or `not_installed` when no install or join has worked on it.
pub fn step_label(step: Option<i32>) -> &'static str {
    match step.map(pb::NodeStep::try_from) {
        None => "not_installed",
        Some(Ok(pb::NodeStep::OsProvisioning)) => "os_provisioning",
        Some(Ok(pb::NodeStep::OsProvisioned)) => "os_provisioned",
        Some(Ok(pb::NodeStep::BinariesInstalled)) => "ready",
        Some(Ok(pb::NodeStep::Failed)) => "failed",
        Some(_) => "pending",
    }
}

/// Of a site's latest install and a node's latest join, the one that last worked on the node:
/// the join, when it started after the install.
pub fn latest_work<'a>(
    install: Option<&'a pb::InstallSaga>,
    join: Option<&'a pb::InstallSaga>,
) -> Option<&'a pb::InstallSaga> {
    match (install, join) {
        (Some(i), Some(j)) if j.started_unix_ms >= i.started_unix_ms => Some(j),
        (Some(i), _) => Some(i),
        (None, j) => j,
    }
}

/// What `saga` says of `node`, when it worked on it.
pub fn progress_of<'a>(saga: Option<&'a pb::InstallSaga>, node: &str) -> Option<&'a pb::NodeProgress> {
    saga?.nodes.iter().find(|n| n.node.as_ref().is_some_and(|s| s.name == node))
}

/// What the overview counts of one site.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SiteFacts {
    /// Its state, as an index into [`SITE_STATES`].
    pub state: usize,
    /// Whether something holds its lease.
    pub busy: bool,
    /// How many of its design's nodes are at each of [`NODE_STEPS`].
    pub steps: [usize; NODE_STEPS.len()],
    /// Whether the hub counts it cut off (nothing heard of its gateway for a while).
    pub cut_off: bool,
}

impl SiteFacts {
    /// The facts of a site with `design`, whose latest install is `install`, whose lease is
    /// held when `busy`, and whose nodes were last worked on by `node_saga(node)`.
    pub fn of<'a>(
        design: &pb::SiteDesign,
        install: Option<&pb::InstallSaga>,
        busy: bool,
        node_saga: impl Fn(&str) -> Option<&'a pb::InstallSaga>,
    ) -> Self {
        let mut steps = [0; NODE_STEPS.len()];
        for n in &design.nodes {
            let step = step_label(progress_of(node_saga(&n.name), &n.name).map(|p| p.step));
            steps[index(&NODE_STEPS, step)] += 1;
        }
        Self { state: index(&SITE_STATES, site_state(install)), busy, steps, cut_off: false }
    }

    pub fn state(&self) -> &'static str {
        SITE_STATES[self.state]
    }
}

fn index(labels: &[&str], label: &str) -> usize {
    labels.iter().position(|l| *l == label).unwrap_or(0)
}

/// The overview's counts: the sum of every registered site's [`SiteFacts`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    pub sites: usize,
    pub busy: usize,
    pub cut_off: usize,
    pub by_state: [usize; SITE_STATES.len()],
    pub by_step: [usize; NODE_STEPS.len()],
}

impl Counts {
    pub fn add(&mut self, f: &SiteFacts) {
        self.sites += 1;
        self.busy += usize::from(f.busy);
        self.cut_off += usize::from(f.cut_off);
        self.by_state[f.state] += 1;
        for (total, n) in self.by_step.iter_mut().zip(f.steps) {
            *total += n;
        }
    }

    pub fn remove(&mut self, f: &SiteFacts) {
        self.sites -= 1;
        self.busy -= usize::from(f.busy);
        self.cut_off -= usize::from(f.cut_off);
        self.by_state[f.state] -= 1;
        for (total, n) in self.by_step.iter_mut().zip(f.steps) {
            *total -= n;
        }
    }

    pub fn nodes(&self) -> usize {
        self.by_step.iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facts_add_up_and_come_off_again() {
        let design = pb::SiteDesign {
            nodes: ["m1", "w1"].map(|n| pb::NodeSpec { name: n.into(), ..Default::default() }).to_vec(),
            ..Default::default()
        };
        let saga = pb::InstallSaga {
            phase: pb::InstallPhase::Succeeded as i32,
            outcome: pb::InstallOutcome::PartialSuccess as i32,
            nodes: vec![pb::NodeProgress {
                node: Some(pb::NodeSpec { name: "m1".into(), ..Default::default() }),
                step: pb::NodeStep::BinariesInstalled as i32,
                ..Default::default()
            }],
            ..Default::default()
        };
        let f = SiteFacts::of(&design, Some(&saga), true, |_| Some(&saga));
        assert_eq!(f.state(), "degraded");
        assert_eq!(f.steps, [1, 0, 0, 0, 1, 0]);
        let registered = SiteFacts::of(&design, None, false, |_| None);
        assert_eq!((registered.state(), registered.steps[0]), ("registered", 2));

        let mut counts = Counts::default();
        counts.add(&f);
        counts.add(&registered);
        assert_eq!((counts.sites, counts.busy, counts.nodes()), (2, 1, 4));
        assert_eq!(counts.by_state, [1, 0, 0, 1, 0]);
        counts.remove(&f);
        assert_eq!(counts.by_step, [2, 0, 0, 0, 0, 0]);
        counts.remove(&registered);
        assert_eq!(counts, Counts::default());
    }
}
