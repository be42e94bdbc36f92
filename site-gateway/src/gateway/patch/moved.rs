//! Which nodes a rollout's job set out to move, kept on the gateway's disk before anything
//! changes on them. A node at the version when a job comes could have been moved by that same
//! job before its gateway died, or by someone else before the job came: the node cannot tell,
//! this record can. A node the job moved is reported patched, however often the job is
//! delivered; one it found at the version, unchanged. The record goes once the site's report is
//! out (a later delivery's report is the same message, dropped as a copy).

use std::collections::BTreeSet;
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// One job's record: `<cache>/jobs/<job id>`, a node name a line.
#[derive(Debug)]
pub(super) struct Moved {
    file: PathBuf,
    nodes: BTreeSet<String>,
}

impl Moved {
    /// The record of job `job_id` under the cache directory `cache_dir`, as an earlier delivery
    /// left it (empty for a job seen first).
    pub(super) fn open(cache_dir: &Path, job_id: &str) -> std::io::Result<Self> {
        let name: String = job_id.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-').collect();
        let file = cache_dir.join("jobs").join(if name.is_empty() { "unnamed".into() } else { name });
        let nodes = match std::fs::read_to_string(&file) {
            Ok(text) => text.lines().map(str::trim).filter(|l| !l.is_empty()).map(String::from).collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeSet::new(),
            Err(e) => return Err(e),
        };
        Ok(Self { file, nodes })
    }

    /// Whether an earlier delivery of the job set out to move `node`.
    pub(super) fn has(&self, node: &str) -> bool {
        self.nodes.contains(node)
    }

    /// Notes that the job sets out to move `nodes`, on disk (synced) before it returns.
    pub(super) fn record(&mut self, nodes: &[String]) -> std::io::Result<()> {
        let new: Vec<&String> = nodes.iter().filter(|n| !self.nodes.contains(*n)).collect();
        if new.is_empty() {
            return Ok(());
        }
        if let Some(dir) = self.file.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&self.file)?;
        for n in &new {
            writeln!(f, "{n}")?;
        }
        f.sync_all()?;
        self.nodes.extend(new.into_iter().cloned());
        Ok(())
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
        let mut first = Moved::open(dir.path(), "01a2-job").unwrap();
        assert!(!first.has("node-1"));
        first.record(&["node-1".into(), "node-2".into()]).unwrap();
        first.record(&["node-2".into()]).unwrap();
        let again = Moved::open(dir.path(), "01a2-job").unwrap();
        assert!(again.has("node-1") && again.has("node-2") && !again.has("node-3"));
        assert!(!Moved::open(dir.path(), "another").unwrap().has("node-1"), "a job's record is its own");
        again.forget().unwrap();
        assert!(!Moved::open(dir.path(), "01a2-job").unwrap().has("node-1"));
        assert!(Moved::open(dir.path(), "../../etc/passwd").unwrap().file.starts_with(dir.path()));
    }
}
