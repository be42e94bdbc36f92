//! Jobs stranded in a shard of the jobs: a job still stored (the work queue drops a job once it is
//! acknowledged) whose site's durable has nothing outstanding, neither waiting to be delivered
//! nor delivered and unacknowledged. Its durable will never deliver it again on its own.
//!
//! A job whose registered site has no durable at all is stranded too: the hub keeps the sites'
//! durables in its memory ([`super::durables`]), and one not made again after a restart is made
//! here.
//!
//! Seen once at 10,000 sites, right after the hub restarted under every gateway: two sites'
//! durables had their acknowledgement floor past their patch job, which no gateway had seen,
//! and the rollout waited for them. Making such a durable anew delivers again every job of its
//! site still in the stream; a gateway carries out a job delivered again without effect.

use std::time::Duration;

use bus_schema::names::{self, keys};
use bus_schema::pb;
use bus_schema::runtime::{self, Bus, ConsumerSpec};
use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// How often the orchestrator looks for stranded jobs.
pub(super) const EVERY: Duration = Duration::from_secs(30);

/// How long a job must have been stored before it counts as stranded: a job just published
/// may not show in its durable's counts yet.
pub const STRANDED_AFTER: Duration = Duration::from_secs(60);

/// Makes anew the durable of every site with a job stored for longer than `older_than` that
/// its durable holds nothing of; the sites, in the order found.
///
/// # Errors
/// When the jobs stream cannot be read.
pub async fn redeliver_stranded_jobs(bus: &Bus, older_than: Duration) -> anyhow::Result<Vec<String>> {
    let mut stranded = Vec::new();
    for stream in names::jobs_streams() {
        stranded.extend(redeliver_stranded_in(bus, stream, older_than).await?);
    }
    Ok(stranded)
}

/// [`redeliver_stranded_jobs`] in one shard's stream.
async fn redeliver_stranded_in(bus: &Bus, stream: &str, older_than: Duration) -> anyhow::Result<Vec<String>> {
    let stream = bus.jetstream().get_stream(stream).await?;
    // Nothing stored for that long (the usual case): nothing to look at.
    let state = &stream.cached_info().state;
    if state.messages == 0 || !stored_for(state.first_timestamp.unix_timestamp_nanos(), older_than) {
        return Ok(Vec::new());
    }
    let mut sites: Vec<String> = Vec::new();
    let mut subjects = stream.info_with_subjects(names::JOBS_ALL).await?;
    while let Some(subject) = subjects.next().await {
        let (subject, _) = subject?;
        if let Some(names::ParsedSubject::Job { site, .. }) = names::parse_subject(&subject)
            && !sites.iter().any(|s| s == site)
        {
            sites.push(site.to_string());
        }
    }
    let mut stranded = Vec::new();
    for site in sites {
        let first = stream.raw_message_builder().sequence(1).next_by_subject(names::site_jobs(&site)).send().await;
        let Ok(first) = first else { continue };
        if !stored_for(first.time.unix_timestamp_nanos(), older_than) {
            continue;
        }
        // Read after the job: a durable that has it pending or unacknowledged will deliver it.
        match stream.consumer_info(names::gateway_consumer(&site)).await {
            Ok(info) if info.num_pending == 0 && info.num_ack_pending == 0 => {}
            // No durable at all: the hub restarted without it (its durables are in its memory)
            // and it was not made again yet. A site no longer registered is left without one.
            Err(e) if matches!(e.kind(), async_nats::jetstream::context::ConsumerInfoErrorKind::NotFound) => {
                let registered = bus.kv(names::SITES_BUCKET).await?.get::<pb::SiteDesign>(&keys::site(&site)).await?;
                if registered.is_none() {
                    continue;
                }
                warn!(%site, job = %first.subject, "a job whose site has no durable: making the durable");
                runtime::ensure_consumer(bus, &ConsumerSpec::gateway(&site)).await?;
                stranded.push(site);
                continue;
            }
            _ => continue,
        }
        warn!(%site, job = %first.subject, sequence = first.sequence, "a job its durable holds nothing of: making the durable anew to deliver it again");
        bus.delete_gateway_consumer(&site).await?;
        runtime::ensure_consumer(bus, &ConsumerSpec::gateway(&site)).await?;
        stranded.push(site);
    }
    Ok(stranded)
}

/// Whether a message stored at `stored_unix_nanos` has been stored for `at_least`.
fn stored_for(stored_unix_nanos: i128, at_least: Duration) -> bool {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
    now.saturating_sub(u128::try_from(stored_unix_nanos).unwrap_or(0)) >= at_least.as_nanos()
}

/// Looks for stranded jobs every [`EVERY`] until `shutdown`.
pub(super) async fn sweep_periodically(bus: Bus, shutdown: CancellationToken) {
    // No site has a durable to make anew when the dispatcher hands the jobs out.
    if bus.job_delivery() == runtime::JobDelivery::Dispatch {
        return;
    }
    let mut tick = tokio::time::interval(EVERY);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        match redeliver_stranded_jobs(&bus, STRANDED_AFTER).await {
            Ok(sites) if sites.is_empty() => {}
            Ok(sites) => info!(sites = sites.len(), "stranded jobs delivered again"),
            Err(e) => warn!(error = %e, "could not look for stranded jobs now"),
        }
    }
}
