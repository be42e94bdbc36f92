//! `RemoveSite`: a site taken out of landfall, refused while a saga or rollout works on it. Its
//! design and revisions, install saga (a summary stays), gateway durable and undelivered jobs
//! go here; the observer and the kubeconfig collector forget what they keep of it when they
//! see `SiteRemoved`.

use bus_schema::names::keys;
use bus_schema::pb;
use bus_schema::runtime::{Delivery, HandlerError};
use tracing::info;

use super::service::{Orchestrator, invalid};
use crate::clock::now_ms;
use crate::lease::{self, Acquired, Holder};
use crate::{active, compaction, saga};

impl Orchestrator {
    pub(super) async fn remove_site(&self, d: &Delivery) -> Result<(), HandlerError> {
        let cmd: pb::RemoveSite = d.decode()?;
        let site = bus_schema::domain::SiteId::try_from(cmd.site_id.clone()).map_err(invalid)?.to_string();
        let known = self.sites.get::<pb::SiteDesign>(&keys::site(&site)).await?.is_some();
        // A redelivery after a crash midway finishes the removal it started.
        if !known && d.delivered <= 1 {
            return Err(HandlerError::reject(pb::RejectCode::UnknownSite, format!("site {site} is not registered")));
        }
        let holder = Holder::Saga(&d.envelope.id);
        if let Acquired::Busy(why) = lease::acquire(&self.sagas, &site, holder).await? {
            return Err(HandlerError::reject(
                pb::RejectCode::Conflict,
                format!("{why}: cancel it or let it end, then remove the site"),
            ));
        }
        let revisions = self.forget_design(&site).await?;
        self.summarise_install(&site).await?;
        // Its gateway gets nothing more, and what it was sent and never took is dropped.
        self.bus.delete_gateway_consumer(&site).await?;
        let jobs_dropped = self.bus.drop_site_jobs(&site).await?;
        lease::release(&self.sagas, &site, holder).await?;
        info!(%site, jobs_dropped, revisions, reason = %cmd.reason, "site removed");
        let evt = pb::SiteRemoved { site_id: site, reason: cmd.reason, jobs_dropped, design_revisions: revisions };
        self.bus.publish_event(&evt, &d.envelope.derive("site_removed", None)).await?;
        Ok(())
    }

    /// Purges the site's design and every revision of it; how many revisions there were.
    pub(super) async fn forget_design(&self, site: &str) -> Result<u32, HandlerError> {
        let revisions = self.sites.scan_few::<pb::DesignRevision>(&keys::design_revisions_prefix(site)).await?;
        let mut n = 0;
        for (key, _, _) in &revisions {
            self.sites.purge(key).await?;
            n += u32::from(key != &keys::design_latest(site));
        }
        self.sites.purge(&keys::site(site)).await?;
        // Its charts' renders were made of its values: they go with it (their bytes stay in the
        // artifact store, content-addressed, as every artifact's do).
        for (key, _, _) in self.packages.scan_few::<pb::Package>(&keys::site_renders_prefix(site)).await? {
            self.packages.purge(&key).await?;
        }
        Ok(n)
    }

    /// Leaves the summary of the site's latest install (its record goes), and forgets which one
    /// it was.
    pub(super) async fn summarise_install(&self, site: &str) -> Result<(), HandlerError> {
        let pointer = keys::latest_install(site);
        let Some((latest, _)) = self.sagas.get::<pb::SiteLease>(&pointer).await? else { return Ok(()) };
        let key = keys::saga(&latest.saga_id);
        if let Some((s, _)) = self.sagas.get::<pb::InstallSaga>(&key).await? {
            // The lease is this command's, so the saga has ended; its summary is what stays.
            if saga::is_terminal(&s) {
                self.sagas.create(&keys::saga_summary(&s.saga_id), &compaction::saga_summary(&s, now_ms())).await?;
                self.sagas.purge(&key).await?;
            }
        }
        active::clear(&self.sagas, &keys::active_saga(&latest.saga_id)).await?;
        // Which join each node had last goes too (the joins' records are compacted as any saga).
        for (key, _, _) in self.sagas.scan_few::<pb::SiteLease>(&keys::site_joins_prefix(site)).await? {
            self.sagas.purge(&key).await?;
        }
        self.sagas.purge(&pointer).await?;
        Ok(())
    }
}
