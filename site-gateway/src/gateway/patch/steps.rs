//! A node's steps out of service and back during its patch (cordoned, drained, uncordoned): sent
//! on their own once the node has been out of service for the gateway's `steps_shown_after`
//! ([`STEPS_SHOWN_AFTER`] unless set), so that someone watching sees it; held until then, and
//! given to the node's end report when it is back sooner, or sent before its job goes back to be
//! tried again. Each step reaches the hub once, one way or the other.
//!
//! Held steps are also written down (`<cache>/jobs/<job>.<node>.steps`, a step a line) as they
//! are held, so that a gateway killed while it holds them leaves them to the job's next attempt,
//! which starts from them: it sends them with its own (a node found cordoned at the version) or
//! puts them in its report. The file is written, not synced: it outlives the gateway's process,
//! not the machine. It goes with the job's record of moved nodes once the site's report is out,
//! or as soon as the steps it holds are sent.
//!
//! A node patched in a few seconds is cordoned, drained and given back before anyone could look:
//! three events more for each node of a fleet, each stored and read by every consumer of the
//! events, would cost the hub more than its report itself.

use std::io::Write as _;
use std::path::{Path, PathBuf};

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
    /// Where the held steps are written down, if anywhere.
    kept: Option<PathBuf>,
}

struct State {
    shown: bool,
    held: Vec<Step>,
}

impl<'a> Steps<'a> {
    /// The steps of `node`, sent on their own from the first (`shown`) or held; with `cache_dir`,
    /// written down there as they are held, starting from those an earlier attempt of the same
    /// job left (its gateway killed while it held them).
    pub(super) fn new(
        env: &'a Envelope,
        rollout_id: &'a str,
        node: &'a str,
        shown: bool,
        cache_dir: Option<&Path>,
    ) -> Self {
        let kept = cache_dir.map(|dir| kept_file(dir, &env.id, node));
        let held = kept.as_deref().map(|f| read_kept(f, node)).unwrap_or_default();
        // A node an earlier attempt cordoned has been out of service since: its clock runs.
        let cordoned = Notify::new();
        if held.contains(&Step::Cordoned) {
            cordoned.notify_one();
        }
        let state = Mutex::new(State { shown, held });
        Self { env, rollout_id, node, state, cordoned, kept }
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
        if hold(&mut state.held, step) {
            self.write_down(&state.held);
        }
        Ok(())
    }

    /// Writes the held steps down in place of what was (see the module's doc); a step that cannot
    /// be written is still held, and said.
    fn write_down(&self, held: &[Step]) {
        let Some(file) = &self.kept else { return };
        let written = file.parent().map_or(Ok(()), std::fs::create_dir_all).and_then(|()| {
            let mut f = std::fs::File::create(file)?;
            for step in held {
                writeln!(f, "{}", step.line())?;
            }
            Ok(())
        });
        if let Err(e) = written {
            warn!(node = self.node, file = %file.display(), error = %e, "cannot write a node's held steps down; a gateway killed now loses them");
        }
    }

    /// Forgets the steps written down: they are sent.
    fn forget_kept(&self) {
        if let Some(file) = &self.kept
            && let Err(e) = std::fs::remove_file(file)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            warn!(node = self.node, file = %file.display(), error = %e, "cannot remove a node's sent steps");
        }
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
        self.forget_kept();
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
    /// The step as a line of the file it is written down in.
    fn line(&self) -> String {
        match self {
            Step::Cordoned => "cordoned".into(),
            Step::Drained { evicted } => {
                std::iter::once("drained").chain(evicted.iter().map(String::as_str)).collect::<Vec<_>>().join(" ")
            }
            Step::Uncordoned => "uncordoned".into(),
        }
    }

    fn from_line(line: &str) -> Option<Self> {
        let mut words = line.split_whitespace();
        match words.next()? {
            "cordoned" => Some(Step::Cordoned),
            "drained" => Some(Step::Drained { evicted: words.map(String::from).collect() }),
            "uncordoned" => Some(Step::Uncordoned),
            _ => None,
        }
    }
}

/// Adds `step` to `held` unless it says nothing new: a step an earlier attempt took is taken once
/// (a drain taken again adds the pods it evicted); whether `held` changed.
fn hold(held: &mut Vec<Step>, step: Step) -> bool {
    match step {
        Step::Drained { evicted } => match held.iter_mut().find_map(|s| match s {
            Step::Drained { evicted } => Some(evicted),
            _ => None,
        }) {
            Some(before) => {
                let new: Vec<String> = evicted.into_iter().filter(|p| !before.contains(p)).collect();
                before.extend(new.iter().cloned());
                !new.is_empty()
            }
            None => {
                held.push(Step::Drained { evicted });
                true
            }
        },
        step if held.contains(&step) => false,
        step => {
            held.push(step);
            true
        }
    }
}

/// The file an attempt of job `job_id` writes `node`'s held steps down in.
pub(super) fn kept_file(cache_dir: &Path, job_id: &str, node: &str) -> PathBuf {
    let safe = |s: &str| s.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-').collect::<String>();
    cache_dir.join("jobs").join(format!("{}.{}.steps", safe(job_id), safe(node)))
}

/// The steps an earlier attempt wrote down in `file` (none when there is no file); a file that
/// cannot be read is said, and taken as none.
fn read_kept(file: &Path, node: &str) -> Vec<Step> {
    match std::fs::read_to_string(file) {
        Ok(text) => text.lines().filter_map(Step::from_line).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => {
            warn!(node, file = %file.display(), error = %e, "cannot read the steps an earlier attempt held");
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_steps_written_down_come_back_each_once_with_every_pod_evicted() {
        let dir = tempfile::tempdir().unwrap();
        let file = kept_file(dir.path(), "01a2-job", "w-1");
        assert!(file.starts_with(dir.path().join("jobs")));
        assert_eq!(kept_file(dir.path(), "../x", "../../y").parent(), Some(dir.path().join("jobs").as_path()));
        assert!(read_kept(&file, "w-1").is_empty(), "no file: none");

        let mut held = Vec::new();
        assert!(hold(&mut held, Step::Cordoned));
        assert!(hold(&mut held, Step::Drained { evicted: vec!["ns/a".into(), "ns/b".into()] }));
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, held.iter().map(|s| s.line() + "\n").collect::<String>()).unwrap();
        let mut again = read_kept(&file, "w-1");
        assert_eq!(again, held);
        // The next attempt finds the node cordoned (no new cordon) and drains it again.
        assert!(!hold(&mut again, Step::Cordoned));
        assert!(!hold(&mut again, Step::Drained { evicted: vec!["ns/b".into()] }));
        assert!(hold(&mut again, Step::Drained { evicted: vec!["ns/c".into()] }));
        assert!(hold(&mut again, Step::Uncordoned));
        assert!(!hold(&mut again, Step::Uncordoned));
        assert_eq!(
            again,
            [
                Step::Cordoned,
                Step::Drained { evicted: vec!["ns/a".into(), "ns/b".into(), "ns/c".into()] },
                Step::Uncordoned
            ]
        );
        assert_eq!(Step::from_line("drained"), Some(Step::Drained { evicted: vec![] }));
        assert_eq!(Step::from_line("something else"), None);
    }
}
