//! The jobs this site has carried out, kept on its disk (`<cache>/jobs-done/<job id>`, an empty
//! file each), so that a job that comes again after it was done is answered without being
//! carried out again.
//!
//! A job comes again when its acknowledgement was lost: the gateway killed after its reports
//! were out and before it acknowledged, or, with the hub's dispatcher, the dispatcher stopped
//! before it acknowledged the site's answer. Meanwhile the hub has read the reports and may have
//! sent the site newer jobs: a rollout's job carried out again after the next rollout's would
//! put its nodes back. A job's own record (`patch::record`) keeps it from moving a node twice
//! only while it runs.
//!
//! A mark is written once the job's handler is done (a patch's, before the job's own record
//! goes), not synced: it outlives the gateway's process, not its machine. It is kept for
//! [`KEPT_FOR`], twice the longest a hub with the default keeping times keeps a job
//! ([`names::RETENTION`]). Marks older than that are removed when a gateway starts.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use bus_schema::names;
use tracing::{info, warn};

/// How long a done job's mark is kept.
pub const KEPT_FOR: Duration = Duration::from_secs(2 * names::RETENTION.as_secs());

/// A job's id as a file's name, kept inside its directory: its letters, digits and dashes.
pub(super) fn file_name(job_id: &str) -> String {
    let name: String = job_id.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-').collect();
    if name.is_empty() { "unnamed".into() } else { name }
}

/// The marks of the jobs one site carried out.
#[derive(Debug, Clone)]
pub(super) struct DoneJobs {
    dir: PathBuf,
}

impl DoneJobs {
    /// The marks under the site's cache directory `cache_dir`.
    pub(super) fn under(cache_dir: &Path) -> Self {
        Self { dir: cache_dir.join("jobs-done") }
    }

    fn mark(&self, job_id: &str) -> PathBuf {
        self.dir.join(file_name(job_id))
    }

    /// Whether job `job_id` was carried out here.
    pub(super) fn has(&self, job_id: &str) -> bool {
        self.mark(job_id).exists()
    }

    /// Notes job `job_id` carried out. A mark that cannot be written is logged: the job is done
    /// all the same, and would only be carried out again if it came again.
    pub(super) fn note(&self, job_id: &str) {
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(&self.dir)?;
            std::fs::write(self.mark(job_id), b"")
        };
        if let Err(e) = write() {
            warn!(dir = %self.dir.display(), job = job_id, error = %e, "cannot note a job done");
        }
    }

    /// Removes the marks older than `kept_for`; how many.
    pub(super) fn prune(&self, kept_for: Duration) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return 0 };
        let now = SystemTime::now();
        let mut removed = 0;
        for entry in entries.flatten() {
            let written = entry.metadata().and_then(|m| m.modified());
            let old = written.is_ok_and(|at| now.duration_since(at).unwrap_or_default() > kept_for);
            if old && std::fs::remove_file(entry.path()).is_ok() {
                removed += 1;
            }
        }
        if removed > 0 {
            info!(dir = %self.dir.display(), removed, "marks of jobs done long ago removed");
        }
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_noted_done_is_known_after_a_restart_until_its_mark_is_old() {
        let dir = tempfile::tempdir().unwrap();
        let done = DoneJobs::under(dir.path());
        assert!(!done.has("01a2-job"), "nothing is done before");
        done.note("01a2-job");
        let again = DoneJobs::under(dir.path());
        assert!(again.has("01a2-job"), "a gateway started again knows it");
        assert!(!again.has("01a2-other"));
        assert_eq!(again.prune(KEPT_FOR), 0, "a fresh mark is kept");
        assert!(again.has("01a2-job"));
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(again.prune(Duration::from_millis(10)), 1, "an old mark goes");
        assert!(!again.has("01a2-job"));
    }

    #[test]
    fn a_job_id_is_kept_inside_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let done = DoneJobs::under(dir.path());
        done.note("../../escape/../x");
        assert!(done.has("../../escape/../x"));
        assert!(dir.path().join("jobs-done").join("escapex").exists());
    }
}
