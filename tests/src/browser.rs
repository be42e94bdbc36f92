//! The dashboard's browser script (`tests/browser/dashboard.mjs`, playwright-core driving
//! Debian's Chromium) run against a `landfall up`, one case at a time: where its parts are, and a
//! case started, followed and waited for.
//!
//! Needs Node.js, Debian's Chromium at /usr/bin/chromium and playwright-core in the directory
//! `LANDFALL_BROWSER_MODULES` names: `scripts/ensure-browser` installs both and prints it, and
//! `scripts/test` exports it. Without them a test fails and says so; it never skips.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::up::Up;

pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/browser/dashboard.mjs");

/// Where playwright-core is; a clear failure, never a skip, when the browser side is missing.
pub fn modules() -> PathBuf {
    const HOW: &str = "run `export LANDFALL_BROWSER_MODULES=\"$(scripts/ensure-browser)\"` (it installs Debian's chromium \
                       and playwright-core), or run the suite with scripts/test";
    let node = Command::new("node").arg("--version").output();
    assert!(
        node.is_ok_and(|o| o.status.success()),
        "node is not installed: the dashboard test drives Chromium from Node.js; {HOW}"
    );
    assert!(Path::new(CHROMIUM).exists(), "{CHROMIUM} is missing; {HOW}");
    crate::node::modules("LANDFALL_BROWSER_MODULES", "playwright-core", HOW)
}

/// `target/dashboard/<case>`, which outlives the test (the temp dirs do not).
pub fn screenshots(case: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("target"));
    let dir = target.join("dashboard").join(case);
    std::fs::create_dir_all(&dir).expect("create the screenshot directory");
    dir.canonicalize().expect("the screenshot directory")
}

/// A browser case under way.
pub struct Case {
    name: String,
    child: Child,
    log_path: PathBuf,
    out_dir: PathBuf,
    deadline: Instant,
    timeout: Duration,
}

/// Starts one case of the browser script against `up`, with `up`'s operator and viewer tokens;
/// it may run `timeout` (its own steps time out well before).
pub fn start(up: &Up, case: &str, extra: &[&str], timeout: Duration) -> Case {
    let modules = modules();
    let out_dir = screenshots(case);
    let log_path = up.dir.path().join(format!("browser-{case}.log"));
    let log = std::fs::File::create(&log_path).expect("create the browser log");
    let child = Command::new("node")
        .arg(SCRIPT)
        .args(["--case", case, "--url", &up.url(), "--token", &up.operator, "--viewer-token", &up.viewer])
        .args(["--out", &out_dir.display().to_string()])
        .args(extra)
        .env("LANDFALL_BROWSER_MODULES", &modules)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("share the log file"))
        .stderr(log)
        .spawn()
        .expect("start node");
    Case { name: case.to_string(), child, log_path, out_dir, deadline: Instant::now() + timeout, timeout }
}

/// Runs one case to its end; returns what it printed, panics with it when it fails.
pub fn run(up: &Up, case: &str, extra: &[&str], timeout: Duration) -> String {
    start(up, case, extra, timeout).wait()
}

impl Case {
    pub fn printed(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Waits until the script has printed `line`; panics if it ends or times out first.
    pub fn until_printed(&mut self, line: &str) {
        while !self.printed().contains(line) {
            if let Some(status) = self.child.try_wait().expect("poll node") {
                panic!(
                    "the browser case {} ended ({status}) before it printed {line:?}:\n{}",
                    self.name,
                    self.printed()
                );
            }
            assert!(Instant::now() < self.deadline, "the browser case {} never printed {line:?}", self.name);
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits for the case to end; returns what it printed, panics with it when it failed.
    pub fn wait(mut self) -> String {
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("poll node") {
                break Some(status);
            }
            if Instant::now() > self.deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        let (case, printed) = (&self.name, self.printed());
        println!("--- browser case {case} ---\n{printed}");
        match status {
            Some(s) if s.success() => printed,
            Some(s) => {
                panic!("the browser case {case} failed ({s}); screenshots in {}:\n{printed}", self.out_dir.display())
            }
            None => panic!("the browser case {case} did not finish within {:?}:\n{printed}", self.timeout),
        }
    }
}
