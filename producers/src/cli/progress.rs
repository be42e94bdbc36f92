//! Progress bars for `--wait`, on a terminal: one bar per node of an install (its Metal3
//! state as it goes), one per wave of a rollout. Elsewhere (a pipe, a log, CI) the commands
//! print one line per event instead, as before.

use std::collections::BTreeMap;
use std::io::IsTerminal;

use bus_schema::pb::{self, BusMessage};
use bus_schema::runtime::ReadEvent;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::output::Format;
use crate::views::rollout_event::RolloutEvent;

/// Whether bars can be drawn: stderr is a terminal, and `-o table` was asked.
pub fn wanted(format: Format) -> bool {
    format == Format::Table && std::io::stderr().is_terminal()
}

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()).progress_chars("█▉▊▋▌▍▎▏ ")
}

/// The steps of a node's install, in order.
const NODE_STEPS: u64 = 3;
/// The phases of a site's install, in order.
const SITE_PHASES: [&str; 6] = [
    "staging artifacts",
    "provisioning OS",
    "installing binaries",
    "collecting kubeconfig",
    "applying containers",
    "installed",
];

/// An install (or a node's join) as bars: the site's phase, then each node.
pub struct InstallBars {
    multi: MultiProgress,
    site: ProgressBar,
    nodes: BTreeMap<String, ProgressBar>,
    node_style: ProgressStyle,
}

impl InstallBars {
    pub fn new(site: &str) -> Self {
        let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr());
        let bar = multi.add(ProgressBar::new(SITE_PHASES.len() as u64));
        bar.set_style(style("{prefix:>16} [{bar:30}] {pos}/{len} {msg} ({elapsed})"));
        bar.set_prefix(site.to_string());
        bar.set_message("waiting for the orchestrator");
        Self { multi, site: bar, nodes: BTreeMap::new(), node_style: style("{prefix:>16} [{bar:30}] {msg}") }
    }

    fn node(&mut self, name: &str) -> &ProgressBar {
        let (multi, style) = (&self.multi, &self.node_style);
        self.nodes.entry(name.to_string()).or_insert_with(|| {
            let bar = multi.add(ProgressBar::new(NODE_STEPS));
            bar.set_style(style.clone());
            bar.set_prefix(name.to_string());
            bar.set_message("pending");
            bar
        })
    }

    fn phase(&self, index: usize) {
        self.site.set_position(index as u64);
        self.site.set_message(SITE_PHASES.get(index).copied().unwrap_or("").to_string());
    }

    /// Moves the bars on with one event of the install.
    pub fn on_event(&mut self, e: &ReadEvent) {
        let d = &e.delivery;
        match d.type_name.as_str() {
            pb::SiteInstallStarted::TYPE => {
                if let Ok(s) = d.decode::<pb::SiteInstallStarted>() {
                    for n in &s.nodes {
                        self.node(&n.name);
                    }
                }
                self.phase(0);
            }
            pb::ArtifactsStaged::TYPE => self.phase(1),
            pb::NodeOsProvisioning::TYPE => {
                if let Ok(p) = d.decode::<pb::NodeOsProvisioning>() {
                    let bar = self.node(&p.node);
                    bar.set_message(format!("Metal3: {}", p.state));
                }
            }
            pb::NodeOsProvisioned::TYPE => {
                if let Ok(p) = d.decode::<pb::NodeOsProvisioned>() {
                    let bar = self.node(&p.node);
                    bar.set_position(1);
                    bar.set_message("OS provisioned");
                }
            }
            pb::NodeBinariesInstalled::TYPE => {
                if let Ok(p) = d.decode::<pb::NodeBinariesInstalled>() {
                    let bar = self.node(&p.node);
                    bar.set_position(2);
                    bar.set_message("binaries installed");
                }
                self.phase(2);
            }
            pb::NodeFailed::TYPE => {
                if let Ok(f) = d.decode::<pb::NodeFailed>() {
                    let bar = self.node(&f.node).clone();
                    bar.abandon_with_message(format!("failed at {}: {}", f.step, f.reason));
                }
            }
            pb::ClusterReady::TYPE => {
                self.phase(3);
                for bar in self.nodes.values().filter(|b| !b.is_finished()) {
                    bar.set_position(NODE_STEPS);
                    bar.finish_with_message("ready");
                }
            }
            pb::NodeReady::TYPE => {
                if let Ok(r) = d.decode::<pb::NodeReady>() {
                    let bar = self.node(&r.node);
                    bar.set_position(NODE_STEPS);
                    bar.finish_with_message("ready in the cluster");
                }
            }
            pb::KubeconfigStored::TYPE => self.phase(4),
            pb::ContainerPackagesApplied::TYPE => self.phase(5),
            pb::SiteInstalled::TYPE => {
                self.site.set_position(SITE_PHASES.len() as u64);
                self.site.finish_with_message("installed");
            }
            pb::SiteInstallFailed::TYPE | pb::CommandRejected::TYPE | pb::NodeJoinFailed::TYPE => {
                self.site.abandon_with_message("failed");
            }
            _ => {}
        }
    }

    /// Prints a line above the bars.
    pub fn println(&self, line: &str) {
        let _ = self.multi.println(line);
    }
}

/// A rollout as bars: one per wave (its sites done), and the planned nodes patched.
pub struct RolloutBars {
    multi: MultiProgress,
    nodes: ProgressBar,
    waves: Vec<ProgressBar>,
}

impl RolloutBars {
    pub fn new(rollout_id: &str) -> Self {
        let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr());
        let nodes = multi.add(ProgressBar::new(0));
        nodes.set_style(style("{prefix:>16} [{bar:30}] {pos}/{len} nodes {msg} ({elapsed})"));
        nodes.set_prefix("rollout");
        nodes.set_message(format!("{rollout_id}: planning"));
        Self { multi, nodes, waves: Vec::new() }
    }

    pub fn on_event(&mut self, event: &RolloutEvent) {
        use RolloutEvent as E;
        match event {
            E::Planned(p) => {
                self.nodes.set_length(u64::from(p.planned_nodes));
                self.nodes.set_message("patched".to_string());
                let waves = p.sites.iter().map(|s| s.wave as usize + 1).max().unwrap_or(0);
                for w in 0..waves {
                    let sites = p.sites.iter().filter(|s| s.wave as usize == w).count() as u64;
                    let bar = self.multi.add(ProgressBar::new(sites));
                    bar.set_style(style("{prefix:>16} [{bar:30}] {pos}/{len} sites {msg}"));
                    let canary = p.sites.iter().any(|s| s.wave as usize == w && s.canary);
                    bar.set_prefix(if canary { format!("wave {} canary", w + 1) } else { format!("wave {}", w + 1) });
                    bar.set_message("waiting");
                    self.waves.push(bar);
                }
            }
            E::WaveStarted(w) => {
                if let Some(bar) = self.waves.get(w.wave as usize) {
                    bar.set_message("patching");
                }
            }
            E::Progress(p) => {
                self.nodes.set_position(u64::from(p.patched + p.failed));
                if p.failed > 0 {
                    self.nodes.set_message(format!("patched, {} failed", p.failed));
                }
                // Sites done are counted over the whole plan; each wave's bar fills in order.
                let mut left = u64::from(p.sites_done);
                for bar in &self.waves {
                    let done = left.min(bar.length().unwrap_or(0));
                    bar.set_position(done);
                    if done == bar.length().unwrap_or(0) && done > 0 {
                        bar.set_message("done");
                    }
                    left -= done;
                }
            }
            E::Halted(h) => self.nodes.abandon_with_message(format!("halted: {}", h.reason)),
            E::Paused(p) => self.nodes.set_message(format!("paused: {}", p.reason)),
            E::Resumed(_) => self.nodes.set_message("patched".to_string()),
            E::Cancelled(c) => self.nodes.abandon_with_message(format!("cancelled: {}", c.reason)),
            E::Completed(c) => {
                self.nodes.set_position(u64::from(c.patched + c.failed));
                for bar in &self.waves {
                    bar.finish_with_message("done");
                }
                self.nodes.finish_with_message(format!("patched, {} failed", c.failed));
            }
            E::Rejected(r) => self.nodes.abandon_with_message(format!("rejected: {}", r.reason)),
        }
    }
}
