//! Landfall services as processes of their own, as they are deployed: the real `landfall`
//! binary (`landfall serve …`), which a test can kill with SIGKILL and start again with the
//! same arguments.
//!
//! ```text
//! let mut orchestrator = Service::start("orchestrator", &url, dir, &["serve", "orchestrator"]);
//! orchestrator.kill();    // kill -9, reaped
//! orchestrator.restart(); // the same command line again
//! ```
//!
//! Each service's stderr (its logs) is appended to `<dir>/<name>.log`, across restarts. A
//! service is killed and reaped when dropped, so it never outlives its test.

use producers::embedded::tied;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};

/// Environment variables that would change how a service runs behind the test's back: each
/// service gets only what its arguments and [`Service::start_with_env`] say.
const CLEARED_ENV: &[&str] = &[
    "RUST_LOG",
    "LANDFALL_LOG_FORMAT",
    "LANDFALL_METRICS_LISTEN",
    "LANDFALL_FAILPOINT",
    "LANDFALL_SIM_STATE",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_SDK_DISABLED",
    "LANDFALL_PKCS11_MODULE",
    "LANDFALL_PKCS11_TOKEN",
    "LANDFALL_PKCS11_PIN_FILE",
    "LANDFALL_PKCS11_PIN",
    "LANDFALL_PKCS11_KEY_LABEL",
    "SOFTHSM2_CONF",
];

/// A `landfall` process with its command line, so it can be started again after a kill.
pub struct Service {
    pub name: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    url: String,
    dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    starts: u32,
}

impl Service {
    /// Starts `landfall ARGS` with `NATS_URL=url`, in `dir`.
    ///
    /// # Panics
    /// When the process cannot be started.
    pub fn start(name: &str, url: &str, dir: &Path, args: &[&str]) -> Service {
        Service::start_with_env(name, url, dir, args, &[])
    }

    /// [`Service::start`] with these environment variables set as well.
    ///
    /// # Panics
    /// When the process cannot be started.
    pub fn start_with_env(name: &str, url: &str, dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Service {
        let mut service = Service {
            name: name.to_string(),
            args: args.iter().map(|a| a.to_string()).collect(),
            env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            url: url.to_string(),
            dir: dir.to_path_buf(),
            log: dir.join(format!("{name}.log")),
            child: None,
            starts: 0,
        };
        service.spawn();
        service
    }

    fn spawn(&mut self) {
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap_or_else(|e| panic!("open {}: {e}", self.log.display()));
        if self.starts > 0 {
            let _ = writeln!(log, "---- {}: started again ({}) ----", self.name, self.starts + 1);
        }
        let mut cmd = tied::command(crate::cli::binary());
        cmd.args(&self.args).env("NATS_URL", &self.url).current_dir(&self.dir);
        for var in CLEARED_ENV {
            cmd.env_remove(var);
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log);
        let child = tied::spawn(cmd).unwrap_or_else(|e| panic!("start landfall {:?}: {e}", self.args));
        self.child = Some(child);
        self.starts += 1;
    }

    /// Kills the process with SIGKILL, as a crash would, and reaps it. Does nothing when it is
    /// not running.
    pub fn kill(&mut self) {
        kill_and_reap(&mut self.child);
    }

    /// Starts the process again with the same command line (killing it first if it runs).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Whether the process is running: false after [`Service::kill`], or once it has exited.
    pub fn is_running(&mut self) -> bool {
        self.exit_status().is_none() && self.child.is_some()
    }

    /// How the process ended, when it ended by itself (not by [`Service::kill`]).
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    /// How many times the process was started.
    pub fn starts(&self) -> u32 {
        self.starts
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The file its logs go to.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Everything it has logged, across restarts.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last `n` lines it logged.
    pub fn log_tail(&self, n: usize) -> String {
        let text = self.log_text();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

/// Kills `child` with SIGKILL, if there is one, and waits for it to exit, leaving `None`.
pub fn kill_and_reap(child: &mut Option<Child>) {
    if let Some(mut child) = child.take() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What `script` (one of `scripts/ensure-*`, run with `args`) prints on its last line: the path
/// of what it made sure is there. `hint` says what to do when it fails, after its output.
///
/// # Errors
/// When the script cannot run, fails, or prints nothing.
pub fn ensured(script: &str, args: &[&str], hint: &str) -> Result<PathBuf, String> {
    let output = std::process::Command::new("bash")
        .arg(script)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run {script}: {e}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().rev().map(str::trim).find(|l| !l.is_empty()).unwrap_or("");
    if !output.status.success() || last.is_empty() {
        return Err(format!("{script} failed ({}); {hint}\n{stdout}", output.status));
    }
    Ok(PathBuf::from(last))
}
