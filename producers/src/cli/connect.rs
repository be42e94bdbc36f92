//! What every client command shares to reach landfall: the connection, following what a
//! published command caused until `--wait` has a verdict, and the exit codes it ends with.

use std::process::ExitCode;

use anyhow::{Context, bail};
use bus_schema::pb;
use bus_schema::runtime::{Bus, EventReader, ReadEvent};

/// Exit code when the command was rejected.
pub(crate) const EXIT_REJECTED: u8 = 2;

/// Exit code when --wait ran out of time.
pub(crate) const EXIT_TIMEOUT: u8 = 3;

/// Connects to landfall's NATS as a client (streams and buckets are the services' to create).
/// What it publishes names its NATS user as the actor (`nats:<public key>`); without a key, the
/// person at this terminal as the machine knows them (`cli:<login>@<host>`).
pub async fn connect(url: &str) -> anyhow::Result<Bus> {
    let access = crate::nats_access::get();
    let bus = Bus::connect_client(url, "landfall-cli", access)
        .await
        .with_context(|| format!("is landfall running? (`landfall up`, or set NATS_URL / --nats-url; tried {url})"))?;
    Ok(match access.public_key() {
        Ok(Some(_)) => bus,
        _ => bus.with_actor(&local_actor()),
    })
}

/// `cli:<login>@<host>`: the login name from the environment, the host from the kernel.
fn local_actor() -> String {
    let login = ["USER", "LOGNAME"].iter().find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty()));
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
    let login = login.unwrap_or_else(|| "unknown".into());
    if host.is_empty() { format!("cli:{login}") } else { format!("cli:{login}@{host}") }
}

/// Reads events until `verdict` ends the wait (with an exit code, say) on one correlated with
/// `correlation`; `None` when `timeout` runs out first.
pub(crate) async fn follow<T>(
    reader: &mut EventReader,
    correlation: &str,
    timeout: std::time::Duration,
    mut verdict: impl FnMut(&ReadEvent) -> anyhow::Result<Option<T>>,
) -> anyhow::Result<Option<T>> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let next = match tokio::time::timeout_at(deadline, reader.next()).await {
            Err(_) => return Ok(None),
            Ok(None) => bail!("the event stream ended"),
            Ok(Some(e)) => e?,
        };
        if next.delivery.envelope.correlation != correlation {
            continue;
        }
        if let Some(code) = verdict(&next)? {
            return Ok(Some(code));
        }
    }
}

/// Says why a command was rejected; the exit code for it.
pub(crate) fn rejected(d: &bus_schema::runtime::Delivery) -> anyhow::Result<ExitCode> {
    let r: pb::CommandRejected = d.decode().map_err(|e| anyhow::anyhow!("{e}"))?;
    eprintln!("rejected: {}", r.reason);
    Ok(ExitCode::from(EXIT_REJECTED))
}
