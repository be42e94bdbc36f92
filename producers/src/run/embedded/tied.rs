//! Child processes that die with this process: a server started by `landfall up`, `landfall
//! bench` or a test must not outlive its parent, however the parent ends (SIGKILL, a crash, a
//! panic that aborts). A normal stop kills and reaps the child; this covers the rest.
//!
//! Linux's parent-death signal does it: the child is started through util-linux's `setpriv
//! --pdeathsig KILL`, which sets the signal and then executes the real program (the setting
//! survives `exec`). The kernel sends it when the *thread* that started the child ends, not the
//! process, so every tied child is started from one thread that lives as long as the process.
//! Where `setpriv` is missing (not Linux, or a very old util-linux) children are started plainly
//! and a warning says they may outlive a killed parent.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Mutex, OnceLock};

/// A command for `program` that [`spawn`] starts tied to this process: `setpriv --pdeathsig
/// KILL -- program` where setpriv can do that, else `program` itself. Add arguments,
/// environment and stdio as usual.
pub fn command(program: impl AsRef<OsStr>) -> Command {
    match setpriv() {
        Some(setpriv) => {
            let mut cmd = Command::new(setpriv);
            cmd.args(["--pdeathsig", "KILL", "--"]).arg(program);
            cmd
        }
        None => Command::new(program),
    }
}

/// Whether children started by [`command`] + [`spawn`] die with this process.
pub fn available() -> bool {
    setpriv().is_some()
}

/// Starts `cmd` (made by [`command`]) from the one long-lived spawning thread, so its
/// parent-death signal fires only when this whole process ends.
///
/// # Errors
/// As [`Command::spawn`].
pub fn spawn(cmd: Command) -> std::io::Result<Child> {
    type Request = (Command, Sender<std::io::Result<Child>>);
    static SPAWNER: OnceLock<Mutex<Sender<Request>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = channel::<Request>();
        std::thread::Builder::new()
            .name("landfall-spawner".into())
            .spawn(move || {
                // Lives until the process ends: the channel's sender is in a static.
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("start the process-spawning thread");
        Mutex::new(tx)
    });
    let (reply, answer) = channel();
    let sent = spawner.lock().unwrap_or_else(|e| e.into_inner()).send((cmd, reply));
    if sent.is_err() {
        return Err(std::io::Error::other("the process-spawning thread is gone"));
    }
    answer.recv().map_err(|_| std::io::Error::other("the process-spawning thread is gone"))?
}

/// `setpriv` with `--pdeathsig`, looked up once on `PATH` and in `/usr/bin`.
fn setpriv() -> Option<&'static Path> {
    static SETPRIV: OnceLock<Option<PathBuf>> = OnceLock::new();
    SETPRIV
        .get_or_init(|| {
            let found = super::fetch::on_path("setpriv").or_else(|| {
                let usr = PathBuf::from("/usr/bin/setpriv");
                usr.is_file().then_some(usr)
            })?;
            let help = Command::new(&found).arg("--help").output().ok()?;
            if String::from_utf8_lossy(&help.stdout).contains("--pdeathsig") {
                Some(found)
            } else {
                tracing::warn!(setpriv = %found.display(), "setpriv has no --pdeathsig: child processes may outlive a killed landfall");
                None
            }
        })
        .as_deref()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// A child started through `spawn` by a process that is then killed dies too.
    #[test]
    fn a_tied_child_dies_with_a_killed_parent() {
        if !available() {
            eprintln!("no setpriv --pdeathsig here: nothing to test");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("child.pid");
        // The parent: a shell that starts a tied `sleep` the same way (setpriv in front) and
        // waits. Killing the shell must take the sleep with it.
        let script = format!("setpriv --pdeathsig KILL -- sleep 300 & echo $! > {}; wait", pidfile.display());
        let mut parent = spawn({
            let mut c = command("bash");
            c.args(["-c", &script]);
            c
        })
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let child_pid = loop {
            if let Ok(text) = std::fs::read_to_string(&pidfile)
                && let Ok(pid) = text.trim().parse::<u32>()
            {
                break pid;
            }
            assert!(Instant::now() < deadline, "the parent never started its child");
            std::thread::sleep(Duration::from_millis(20));
        };
        let alive = |pid: u32| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| !s.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'))
        };
        // setpriv sets the signal and then executes `sleep`: killing the parent before that
        // would test nothing (the signal is not set yet), so wait until the child is `sleep`.
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::read_to_string(format!("/proc/{child_pid}/comm")).map_or(true, |c| c.trim() != "sleep") {
            assert!(Instant::now() < deadline, "the child never became `sleep`");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(alive(child_pid));
        parent.kill().unwrap();
        parent.wait().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while alive(child_pid) {
            assert!(Instant::now() < deadline, "the child {child_pid} outlived its killed parent");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
