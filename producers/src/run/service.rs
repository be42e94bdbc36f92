//! What the programs and the services they run share: the async runtime, a shutdown on
//! SIGINT or SIGTERM, and a service's connection with the streams and buckets made sure of.

use std::process::ExitCode;

use bus_schema::runtime::{Bus, Topology};
use tokio_util::sync::CancellationToken;

use crate::flags::KeepingArgs;

/// Runs `work` on a multi-threaded runtime; an error is printed and exits non-zero.
pub fn block_on(work: impl std::future::Future<Output = anyhow::Result<ExitCode>>) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = match runtime.block_on(work) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    };
    // Work left on a blocking thread (a stopped benchmark's key generation, say) does not hold
    // the exit back: the process ends, and the thread with it.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    code
}

/// A token cancelled on SIGINT or SIGTERM.
pub fn shutdown_on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        let term = async {
            match term.as_mut() {
                Some(t) => {
                    t.recv().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term => {}
        }
        tracing::info!("shutting down");
        t.cancel();
    });
    token
}

/// Connects (as this process's NATS user) and makes sure the streams and buckets exist: three
/// replicas of each on a JetStream cluster, one on a single server, keeping things as long as
/// `keeping` says. With `align` (the orchestrator, `landfall up`), existing streams and buckets
/// are brought to those keeping times too.
pub async fn connect_service(url: &str, name: &str, keeping: &KeepingArgs, align: bool) -> anyhow::Result<Bus> {
    let bus = Bus::connect_with(url, name, crate::nats_access::get()).await?;
    let topology = keeping.apply(Topology::for_server(&bus));
    let topology = if align { topology.aligning() } else { topology };
    topology.check().map_err(anyhow::Error::msg)?;
    bus.ensure_topology_within(&topology, std::time::Duration::from_secs(60)).await?;
    Ok(bus)
}
