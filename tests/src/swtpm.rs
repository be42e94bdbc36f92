//! A software TPM 2.0 (swtpm) per test, for the sealed identity.
//!
//! ```text
//! let tpm = SoftwareTpm::start();
//! Identity::init(dir, &tpm.choice())   // --tpm swtpm:host=127.0.0.1,port=P
//! ```
//!
//! Each one listens on 127.0.0.1 on free ports and keeps its state (its own secret seeds: a
//! TPM of its own) in a fresh temporary directory, so tests run in parallel and never share a
//! TPM. Dropping it kills the process and removes the directory.
//!
//! The binary is `$LANDFALL_SWTPM`, which `scripts/ensure-tpm` prints (and `scripts/test` sets);
//! the tools the gateway runs against it are Debian's tpm2-tools, which that script installs.

use std::net::{Ipv4Addr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use producers::embedded::tied;
use site_gateway::identity::TpmChoice;
use tempfile::TempDir;

/// How long a swtpm may take to listen.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// A running swtpm owned by a test; killed and reaped on drop, its state dir removed.
pub struct SoftwareTpm {
    port: u16,
    /// Its state: the TPM's secret seeds, NVRAM (removed on drop).
    _state: TempDir,
    child: Option<Child>,
}

impl SoftwareTpm {
    /// Starts a swtpm with a fresh state (a TPM no other test has). Panics if it cannot.
    pub fn start() -> SoftwareTpm {
        let binary = binary();
        let dir = tempfile::Builder::new().prefix("landfall-swtpm-").tempdir().expect("a directory for swtpm");
        let mut failures = Vec::new();
        for _ in 0..5 {
            // The swtpm TCTI finds the control channel on the port after the TPM's.
            let port = crate::nats::free_port();
            let ctrl = port + 1;
            if std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, ctrl)).is_err() {
                failures.push(format!("port {ctrl} is taken"));
                continue;
            }
            let log = std::fs::File::create(dir.path().join("swtpm.log")).expect("swtpm's log");
            let mut command = tied::command(&binary);
            command
                .args(["socket", "--tpm2"])
                .arg(format!("--server=type=tcp,port={port},bindaddr=127.0.0.1"))
                .arg(format!("--ctrl=type=tcp,port={ctrl},bindaddr=127.0.0.1"))
                .arg(format!("--tpmstate=dir={}", dir.path().display()))
                .args(["--flags", "not-need-init,startup-clear"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log);
            let mut child = tied::spawn(command)
                .unwrap_or_else(|e| panic!("cannot run {} ({e}): run the tests with scripts/test", binary.display()));
            let deadline = Instant::now() + READY_TIMEOUT;
            loop {
                if let Ok(Some(status)) = child.try_wait() {
                    let log = std::fs::read_to_string(dir.path().join("swtpm.log")).unwrap_or_default();
                    failures.push(format!("exited with {status}: {log}"));
                    break;
                }
                let listens =
                    |p: u16| TcpStream::connect_timeout(&(Ipv4Addr::LOCALHOST, p).into(), Duration::from_millis(200));
                if listens(ctrl).is_ok() && listens(port).is_ok() {
                    return SoftwareTpm { port, _state: dir, child: Some(child) };
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    failures.push(format!("not listening on {port} and {ctrl} within {READY_TIMEOUT:?}"));
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        panic!("swtpm {} did not start: {}", binary.display(), failures.join("; "))
    }

    /// The TCTI that reaches it: `swtpm:host=127.0.0.1,port=P`.
    pub fn tcti(&self) -> String {
        format!("swtpm:host=127.0.0.1,port={}", self.port)
    }

    /// `--tpm` for it.
    pub fn choice(&self) -> TpmChoice {
        TpmChoice::Tcti(self.tcti())
    }
}

impl Drop for SoftwareTpm {
    fn drop(&mut self) {
        crate::procs::kill_and_reap(&mut self.child);
        // `self._state` (TempDir) is removed when the fields drop.
    }
}

/// `$LANDFALL_SWTPM`, which must be set: the test fails, saying how, when it is not.
pub fn binary() -> PathBuf {
    match std::env::var_os("LANDFALL_SWTPM") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => panic!(
            "LANDFALL_SWTPM is not set: export LANDFALL_SWTPM=\"$(scripts/ensure-tpm)\" (it installs swtpm and \
             tpm2-tools), or run the tests with scripts/test"
        ),
    }
}
