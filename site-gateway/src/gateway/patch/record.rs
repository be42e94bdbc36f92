//! A rollout's job as the gateway keeps it on its disk while it runs (`<cache>/jobs/<job id>`):
//! which nodes it set out to move, and the steps its nodes' patches hold for their reports.
//!
//! A node at the version when a job comes could have been moved by that same job before its
//! gateway died, or by someone else before the job came: the node cannot tell, this record can.
//! A node the job moved is reported patched, however often the job is delivered; one it found at
//! the version, unchanged. Those lines are synced before anything changes on the nodes.
//!
//! A node's steps held for its report ([`super::steps`]) are written down as they are held, so a
//! gateway killed while it holds them leaves them to the job's next attempt, which starts from
//! them. They are appended to the same file, one write each, not synced: they outlive the
//! gateway's process, not its machine. The record goes once the site's report is out (a later
//! delivery's report is the same message, dropped as a copy).
//!
//! One line each, in the order written: `<node>` (set out to move), `held <node> <step>` (a step
//! held, see [`Step::line`]), `sent <node>` (its held steps sent on their own), `from <node>
//! <version>` (the version a node whose report is held came from, see [`super::reports`]).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use super::steps::{Step, hold};

/// One job's record.
#[derive(Debug)]
pub(super) struct JobRecord {
    file: PathBuf,
    nodes: BTreeSet<String>,
    /// The steps each node's patch held when an earlier attempt ended, by node.
    held: BTreeMap<String, Vec<Step>>,
    /// The version each node the job moved came from, as an earlier attempt wrote it down.
    came_from: BTreeMap<String, String>,
    /// Whether an earlier attempt of the job left the record.
    earlier: bool,
}

impl JobRecord {
    /// The record of job `job_id` under the cache directory `cache_dir`, as an earlier delivery
    /// left it (empty for a job seen first).
    pub(super) fn open(cache_dir: &Path, job_id: &str) -> std::io::Result<Self> {
        let file = cache_dir.join("jobs").join(super::super::done::file_name(job_id));
        let text = match std::fs::read_to_string(&file) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e),
        };
        let (mut nodes, mut held) = (BTreeSet::new(), BTreeMap::<String, Vec<Step>>::new());
        let mut came_from = BTreeMap::new();
        for line in text.lines() {
            let mut words = line.split_whitespace();
            match (words.next(), words.next()) {
                (Some(node), None) => {
                    nodes.insert(node.to_string());
                }
                (Some("held"), Some(node)) => {
                    // A line cut short by the kill is no step.
                    if let Some(step) = Step::from_words(words) {
                        hold(held.entry(node.to_string()).or_default(), step);
                    }
                }
                (Some("sent"), Some(node)) => {
                    held.remove(node);
                }
                (Some("from"), Some(node)) => {
                    if let Some(version) = words.next() {
                        came_from.insert(node.to_string(), version.to_string());
                    }
                }
                _ => {}
            }
        }
        let record = Self { file, nodes, held, came_from, earlier: !text.is_empty() };
        // A line the kill cut short is ended, so that the next line starts on its own.
        if !text.is_empty() && !text.ends_with('\n') {
            record.note("\n")?;
        }
        Ok(record)
    }

    /// Whether an earlier attempt of the job left this record: it may have sent some of the
    /// nodes' reports on their own already.
    pub(super) fn left_by_an_earlier_attempt(&self) -> bool {
        self.earlier
    }

    /// Whether an earlier delivery of the job set out to move `node`.
    pub(super) fn has(&self, node: &str) -> bool {
        self.nodes.contains(node)
    }

    /// The steps `node`'s patch held when the job's earlier attempt ended (none, mostly).
    pub(super) fn held(&self, node: &str) -> Vec<Step> {
        self.held.get(node).cloned().unwrap_or_default()
    }

    /// The version `node` came from, as an earlier attempt of the job wrote it down.
    pub(super) fn came_from(&self, node: &str) -> Option<&str> {
        self.came_from.get(node).map(String::as_str)
    }

    /// Notes the version `node` came from (its report held, see [`super::reports`]).
    pub(super) fn note_from(&self, node: &str, version: &str) -> std::io::Result<()> {
        self.note(&format!("from {node} {version}\n"))
    }

    /// Notes that the job sets out to move `nodes`, on disk (synced) before it returns.
    pub(super) fn record(&mut self, nodes: &[String]) -> std::io::Result<()> {
        let new: Vec<&String> = nodes.iter().filter(|n| !self.nodes.contains(*n)).collect();
        if new.is_empty() {
            return Ok(());
        }
        let mut f = self.append()?;
        let lines: String = new.iter().map(|n| format!("{n}\n")).collect();
        f.write_all(lines.as_bytes())?;
        f.sync_all()?;
        self.nodes.extend(new.into_iter().cloned());
        Ok(())
    }

    /// Notes that `node`'s patch holds `step` (what it adds to the steps held before).
    pub(super) fn note_held(&self, node: &str, step: &Step) -> std::io::Result<()> {
        self.note(&format!("held {node} {}\n", step.line()))
    }

    /// Notes that `node`'s held steps were sent on their own.
    pub(super) fn note_sent(&self, node: &str) -> std::io::Result<()> {
        self.note(&format!("sent {node}\n"))
    }

    /// Appends `line` in one write: nodes of a batch note theirs at once, and an append of one
    /// write lands whole. Not synced (see the module's doc).
    fn note(&self, line: &str) -> std::io::Result<()> {
        self.append()?.write_all(line.as_bytes())
    }

    fn append(&self) -> std::io::Result<std::fs::File> {
        let open = || std::fs::OpenOptions::new().create(true).append(true).open(&self.file);
        match open() {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if let Some(dir) = self.file.parent() {
                    std::fs::create_dir_all(dir)?;
                }
                open()
            }
            opened => opened,
        }
    }

    /// Drops the record: the site's report is out.
    pub(super) fn forget(self) -> std::io::Result<()> {
        match std::fs::remove_file(&self.file) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_delivered_again_knows_the_nodes_it_set_out_to_move() {
        let dir = tempfile::tempdir().unwrap();
        let mut first = JobRecord::open(dir.path(), "01a2-job").unwrap();
        assert!(!first.has("node-1"));
        first.record(&["node-1".into(), "node-2".into()]).unwrap();
        first.record(&["node-2".into()]).unwrap();
        assert!(!first.left_by_an_earlier_attempt());
        let again = JobRecord::open(dir.path(), "01a2-job").unwrap();
        assert!(again.has("node-1") && again.has("node-2") && !again.has("node-3"));
        assert!(again.left_by_an_earlier_attempt());
        assert!(!JobRecord::open(dir.path(), "another").unwrap().has("node-1"), "a job's record is its own");
        again.forget().unwrap();
        assert!(!JobRecord::open(dir.path(), "01a2-job").unwrap().has("node-1"));
        assert!(JobRecord::open(dir.path(), "../../etc/passwd").unwrap().file.starts_with(dir.path()));
    }

    #[test]
    fn the_steps_a_killed_attempt_held_come_back_each_once_and_sent_ones_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let mut first = JobRecord::open(dir.path(), "job").unwrap();
        first.record(&["w-1".into(), "w-2".into(), "held".into()]).unwrap();
        let drained = |pods: &[&str]| Step::Drained { evicted: pods.iter().map(|p| p.to_string()).collect() };
        first.note_held("w-1", &Step::Cordoned).unwrap();
        first.note_held("w-1", &drained(&["ns/a", "ns/b"])).unwrap();
        first.note_held("w-2", &Step::Cordoned).unwrap();
        first.note_sent("w-2").unwrap();
        first.note_held("w-2", &Step::Uncordoned).unwrap();
        first.note_from("w-1", "1.30.0").unwrap();
        // The kill cut the last write short.
        std::fs::OpenOptions::new().append(true).open(&first.file).unwrap().write_all(b"held w-3").unwrap();
        let again = JobRecord::open(dir.path(), "job").unwrap();
        assert_eq!(again.held("w-1"), [Step::Cordoned, drained(&["ns/a", "ns/b"])]);
        assert_eq!(again.held("w-2"), [Step::Uncordoned], "the steps sent before are not held again");
        assert!(again.held("w-3").is_empty() && again.held("w-9").is_empty());
        assert!(again.has("held") && again.has("w-1") && !again.has("w-3"), "a node may be called held");
        assert_eq!((again.came_from("w-1"), again.came_from("w-2")), (Some("1.30.0"), None));
        // A second attempt drains again (evicting nothing more) and goes on from there.
        again.note_held("w-1", &drained(&["ns/c"])).unwrap();
        again.note_held("w-1", &Step::Uncordoned).unwrap();
        let third = JobRecord::open(dir.path(), "job").unwrap();
        assert_eq!(third.held("w-1"), [Step::Cordoned, drained(&["ns/a", "ns/b", "ns/c"]), Step::Uncordoned]);
        third.forget().unwrap();
        assert!(JobRecord::open(dir.path(), "job").unwrap().held("w-1").is_empty());
    }
}
