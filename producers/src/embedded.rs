//! The nats-server that `landfall up` runs as a child process when no `NATS_URL` is given.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::process::{Child, Command};

/// The same script the test suite uses: finds a nats-server >= 2.10.8, or fetches one from
/// Debian into `~/.cache/landfall`. Embedded so the binary works outside the checkout too.
const ENSURE_NATS_SERVER: &str = include_str!("../../scripts/ensure-nats-server");

/// Finds (or fetches) a nats-server binary that landfall supports.
pub async fn find_nats_server() -> anyhow::Result<PathBuf> {
    let out = Command::new("bash")
        .arg("-c")
        .arg(ENSURE_NATS_SERVER)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .await
        .context("run bash to find a nats-server")?;
    if !out.status.success() {
        bail!(
            "no nats-server >= 2.10.8 found or fetched; install one and set LANDFALL_NATS_SERVER, or point NATS_URL at a running server"
        );
    }
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    Ok(PathBuf::from(path))
}

/// A nats-server child process; killed when dropped.
pub struct NatsChild {
    child: Child,
    pub url: String,
    pub version: String,
}

impl NatsChild {
    /// Starts nats-server with JetStream on 127.0.0.1:`port`, its store under `store`.
    pub async fn start(binary: &Path, port: u16, store: &Path, log: &Path) -> anyhow::Result<Self> {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            bail!(
                "port {port} is taken: is landfall already up? Stop it, pass --nats-port, or set NATS_URL to use that server"
            );
        }
        std::fs::create_dir_all(store).with_context(|| format!("create {}", store.display()))?;
        let version = Command::new(binary).arg("--version").output().await?;
        let version = String::from_utf8_lossy(&version.stdout).trim().to_string();
        let log_file = std::fs::File::create(log).with_context(|| format!("create {}", log.display()))?;
        let child = Command::new(binary)
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(store)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("start {}", binary.display()))?;
        let mut me = Self { child, url: format!("nats://127.0.0.1:{port}"), version };
        for _ in 0..100 {
            if let Some(status) = me.child.try_wait()? {
                bail!("nats-server exited at start ({status}); see {}", log.display());
            }
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(me);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("nats-server did not listen on {port} within 10 s; see {}", log.display())
    }

    /// Stops the server (SIGTERM lets it flush its store), waiting a few seconds at most.
    pub async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            let _ = Command::new("kill").arg("-TERM").arg(pid.to_string()).status().await;
            if tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await.is_ok() {
                return;
            }
        }
        let _ = self.child.kill().await;
    }
}
