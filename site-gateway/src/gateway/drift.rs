//! Drift of the site's helm chart releases from their renders: checked by the backend every
//! `drift_every` and when an operator asks (`landfall.to.<site>.rpc.drift_check`); each chart found
//! drifted is reported as `ChartDrifted` (through the site's outbox when it has one, as every
//! report).

use std::sync::Arc;
use std::time::Duration;

use bus_schema::names;
use bus_schema::pb;
use bus_schema::runtime::{self, Envelope, HandlerError, error_reply};
use prost::Message;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::Gateway;
use crate::backend::SiteBackend;

impl<B: SiteBackend> Gateway<B> {
    /// Checks every chart now and reports those that drifted; every chart's report.
    async fn check_drift(&self) -> Result<Vec<pb::ChartDrifted>, String> {
        let reports = self.backend.check_drift().await.map_err(|e| e.reason())?;
        for report in reports.iter().filter(|r| !r.drifted.is_empty()) {
            self.publish(report, &Envelope::root()).await.map_err(|e: HandlerError| e.to_string())?;
        }
        Ok(reports)
    }
}

/// Checks for drift every `every` until `shutdown` (the first check one period after the start).
pub(super) async fn watch_drift<B: SiteBackend>(
    gateway: Arc<Gateway<B>>,
    every: Duration,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        if let Err(reason) = gateway.check_drift().await {
            warn!(site = %gateway.site, %reason, "drift check failed");
        }
    }
}

/// Answers an operator's `DriftCheck` until `shutdown`, one at a time; the site's gateways share
/// them as they share its jobs.
pub(super) async fn serve_drift_check<B: SiteBackend>(
    gateway: Arc<Gateway<B>>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let subject = names::drift_check_rpc(gateway.site.as_str());
    let group = names::gateway_consumer(gateway.site.as_str());
    let bus = gateway.bus.clone();
    runtime::serve_requests(&bus, subject, &group, 1, shutdown, move |subject, payload| {
        let gateway = gateway.clone();
        async move {
            match bus_schema::trust::decode_request::<pb::DriftCheck>(&subject, &payload) {
                Ok(_) => match gateway.check_drift().await {
                    Ok(charts) => (Default::default(), pb::DriftReport { charts }.encode_to_vec().into()),
                    Err(reason) => error_reply(&reason),
                },
                Err(reason) => error_reply(&reason),
            }
        }
    })
    .await?;
    Ok(())
}
