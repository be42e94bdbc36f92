//! The sites' durables as the hub keeps them: in the server's memory, not on its disk
//! ([`ConsumerSpec::gateway`]), so a hub server that restarts comes back without them. The
//! orchestrator makes them again: when it starts, and whenever the server it is connected to is
//! another than before (a server started again has a new id). Until then a gateway's deliveries
//! miss their heartbeats and it opens them again; its site's jobs wait in their stream.
//!
//! A shard whose stream counts as many durables as it has registered sites is left alone, so a
//! look that finds nothing missing costs one request per shard and one listing of the sites.
//!
//! With the dispatcher (`JobDelivery::Dispatch`) a site has no durable: nothing here is made,
//! and the dispatcher's own durables are kept on disk.

use std::collections::BTreeMap;
use std::time::Duration;

use bus_schema::names::{self, keys};
use bus_schema::runtime::{self, Bus, BusError, ConsumerSpec, JobDelivery, Kv};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// How often the orchestrator looks at which server it is connected to (a look in its own
/// memory: the server's id came with the connection).
const EVERY: Duration = Duration::from_secs(1);

/// Makes `site`'s durable, which its gateway consumes its jobs through; nothing when the
/// dispatcher hands the jobs out.
///
/// # Errors
/// When the durable cannot be made.
pub(super) async fn make_site_durable(bus: &Bus, site: &str) -> Result<(), BusError> {
    match bus.job_delivery() {
        JobDelivery::Dispatch => Ok(()),
        JobDelivery::Durable => runtime::ensure_consumer(bus, &ConsumerSpec::gateway(site)).await,
    }
}

/// Makes the durable of every registered site (`sites`, the sites bucket) whose shard has fewer
/// durables than sites; the number of sites whose durable was looked at.
///
/// # Errors
/// When the sites or a shard's stream cannot be read, or a durable cannot be made.
pub async fn make_missing_durables(bus: &Bus, sites: &Kv) -> Result<usize, BusError> {
    let mut by_shard: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    for key in sites.keys_with_prefix(keys::SITE_PREFIX).await? {
        if let Some(site) = keys::site_of(&key) {
            by_shard.entry(names::site_jobs_stream(site)).or_default().push(site.to_string());
        }
    }
    let mut looked_at = 0;
    for (stream, sites) in by_shard {
        let durables = match bus.jetstream().get_stream(stream).await {
            Ok(s) => s.cached_info().state.consumer_count,
            Err(e) => return Err(BusError::Consume { consumer: format!("durables of {stream}"), source: Box::new(e) }),
        };
        if durables >= sites.len() {
            continue;
        }
        for site in &sites {
            runtime::ensure_consumer(bus, &ConsumerSpec::gateway(site)).await?;
        }
        looked_at += sites.len();
    }
    Ok(looked_at)
}

/// Makes the missing durables now, and again each time the server connected to is another,
/// until `shutdown`. A look that fails is tried again a moment later.
pub(super) async fn keep_made(bus: Bus, sites: Kv, shutdown: CancellationToken) {
    if bus.job_delivery() == JobDelivery::Dispatch {
        return;
    }
    let mut looked_at_server: Option<String> = None;
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        if bus.client().connection_state() != async_nats::connection::State::Connected {
            continue;
        }
        let server = bus.client().server_info().server_id;
        if looked_at_server.as_deref() == Some(server.as_str()) {
            continue;
        }
        match make_missing_durables(&bus, &sites).await {
            Ok(0) => {}
            Ok(n) => info!(sites = n, %server, "the sites' durables were missing on this server: made again"),
            Err(e) => {
                warn!(error = %runtime::error_chain(&e), "could not make the sites' missing durables now; trying again");
                continue;
            }
        }
        looked_at_server = Some(server);
    }
}
