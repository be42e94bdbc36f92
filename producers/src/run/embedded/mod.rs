//! The nats-server that `landfall up` and `landfall bench` run as a child process when no
//! `NATS_URL` is given: found or fetched ([`fetch`]), and tied to this process's life
//! ([`tied`]), so it never outlives a killed parent.

pub mod fetch;
pub mod tied;

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};

pub use fetch::find_or_fetch as find_nats_server;

/// A nats-server child process; killed and reaped when dropped, and killed by the kernel if
/// this process dies first.
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
        let version = tokio::process::Command::new(binary).arg("--version").output().await?;
        let version = String::from_utf8_lossy(&version.stdout).trim().to_string();
        let log_file = std::fs::File::create(log).with_context(|| format!("create {}", log.display()))?;
        let mut cmd = tied::command(binary);
        cmd.args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(store)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file);
        let child = tied::spawn(cmd).with_context(|| format!("start {}", binary.display()))?;
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
        let pid = self.child.id().to_string();
        let _ = tokio::process::Command::new("kill").args(["-TERM", &pid]).status().await;
        for _ in 0..50 {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Drop kills what is left.
    }
}

impl Drop for NatsChild {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}
