//! Site designs: `ApplyDesign` validated as a whole and stored as the next revision, and a
//! design read back, at a revision or the current one, with the catalog entries it names.

use std::collections::BTreeMap;

use bus_schema::design;
use bus_schema::domain::{Package, SiteDesign};
use bus_schema::names::keys;
use bus_schema::pb;
use bus_schema::runtime::{self, Delivery, HandlerError, Update};
use tracing::{debug, info};

use super::service::{Orchestrator, invalid};
use crate::clock::now_ms;

impl Orchestrator {
    /// Validates a site's design documents as a whole and stores them as its next revision;
    /// identical documents change nothing and publish nothing.
    pub(super) async fn apply_design(&self, d: &Delivery) -> Result<(), HandlerError> {
        let cmd: pb::ApplyDesign = d.decode()?;
        let site = bus_schema::domain::SiteId::try_from(cmd.site_id.clone()).map_err(invalid)?;
        let latest = self.sites.get::<pb::DesignRevision>(&keys::design_latest(site.as_str())).await?.map(|(r, _)| r);
        if let Some(expected) = &cmd.expected {
            let current = latest.as_ref().map_or(0, |l| l.revision);
            // A redelivery finds the revision it wrote itself as the latest.
            let own = latest.as_ref().is_some_and(|l| l.command_id == d.envelope.id);
            if current != expected.revision && !own {
                return Err(HandlerError::reject(
                    pb::RejectCode::Conflict,
                    format!(
                        "the design of {site} is at revision {current}, not {}: read it again and retry",
                        expected.revision
                    ),
                ));
            }
        }
        let catalog = runtime::package_refs(&self.packages).await?;
        let planned = design::plan(&site, &cmd.sources, &catalog, latest.as_ref()).map_err(|errors| {
            let n = errors.len();
            HandlerError::reject(
                pb::RejectCode::Invalid,
                format!(
                    "the design of {site} is invalid ({n} error{}):\n{}",
                    if n == 1 { "" } else { "s" },
                    errors.join("\n")
                ),
            )
        })?;
        if latest.as_ref().is_some_and(|l| planned.same_as(l)) {
            debug!(%site, "design unchanged");
            return Ok(());
        }
        let revision = latest.as_ref().map_or(1, |l| l.revision + 1);
        let record = planned.revision(revision, cmd.sources, &d.envelope.id, now_ms());
        // This command got there first (a redelivery), or another apply did: then look again.
        self.sites
            .update_with(&keys::design_revision(site.as_str(), revision), |existing: Option<&pb::DesignRevision>| {
                match existing {
                    None => Update::Put(record.clone(), Ok(())),
                    Some(e) if e.command_id == d.envelope.id => Update::Keep(Ok(())),
                    Some(_) => Update::Abort(Err(HandlerError::transient_reason(format!(
                        "design revision {revision} of {site} was taken; retrying"
                    )))),
                }
            })
            .await??;
        self.sites.put(&keys::design_latest(site.as_str()), &record).await?;
        self.sites.put(&keys::site(site.as_str()), &planned.effective).await?;
        self.prune_revisions(site.as_str(), revision).await?;
        // A design may be what registers the site: its gateway's durable is the hub's to make.
        super::durables::make_site_durable(&self.bus, site.as_str()).await?;
        let changes = design::changes(latest.as_ref().and_then(|l| l.effective.as_ref()), &planned.effective);
        info!(%site, revision, added = changes.added.len(), removed = changes.removed.len(), changed = changes.changed.len(), "design applied");
        let evt = pb::DesignApplied {
            site_id: site.to_string(),
            revision,
            nodes_added: changes.added,
            nodes_removed: changes.removed,
            nodes_changed: changes.changed.into_iter().map(|(n, _)| n).collect(),
            masters: record.masters.clone(),
            workers: record.workers.clone(),
            standby: record.standby_masters.iter().chain(&record.standby_workers).cloned().collect(),
        };
        self.bus.publish_event(&evt, &d.envelope.derive("design_applied", None)).await?;
        Ok(())
    }

    /// Purges the revisions beyond the policy's count, once `latest` is written: the one that
    /// just fell out, and any older one still there (after the count was lowered).
    async fn prune_revisions(&self, site: &str, latest: u64) -> Result<(), HandlerError> {
        let Some(through) = self.policy.prune_design_through(latest) else { return Ok(()) };
        for revision in (1..=through).rev() {
            let key = keys::design_revision(site, revision);
            if self.sites.get::<pb::DesignRevision>(&key).await?.is_none() {
                break;
            }
            self.sites.purge(&key).await?;
            debug!(%site, revision, "design revision pruned");
        }
        Ok(())
    }

    pub(super) async fn catalog_for(&self, design: &SiteDesign) -> Result<BTreeMap<String, Package>, HandlerError> {
        let mut catalog = BTreeMap::new();
        for p in design.all_packages() {
            let key = keys::package(p.name.as_str(), p.version.as_str());
            if let Some((entry, _)) = self.packages.get::<pb::Package>(&key).await? {
                let pkg = Package::try_from(entry).map_err(invalid)?;
                catalog.insert(p.key(), pkg);
            }
        }
        Ok(catalog)
    }

    /// A site's design at `revision`, or its current one for 0.
    pub(super) async fn design_at(&self, site: &str, revision: u64) -> Result<SiteDesign, HandlerError> {
        let design = if revision > 0 {
            let key = keys::design_revision(site, revision);
            let Some((rev, _)) = self.sites.get::<pb::DesignRevision>(&key).await? else {
                let latest = self.sites.get::<pb::DesignRevision>(&keys::design_latest(site)).await?;
                let reason = match latest {
                    Some((l, _)) if self.policy.design_pruned(revision, l.revision) => format!(
                        "design revision {revision} of site {site} was pruned (the last {} are kept)",
                        self.policy.design_revisions
                    ),
                    _ => format!("site {site} has no design revision {revision}"),
                };
                return Err(HandlerError::reject(pb::RejectCode::Invalid, reason));
            };
            rev.effective.unwrap_or_default()
        } else {
            let Some((design, _)) = self.sites.get::<pb::SiteDesign>(&keys::site(site)).await? else {
                return Err(HandlerError::reject(
                    pb::RejectCode::UnknownSite,
                    format!(
                        "site {site} is not registered (landfall site register -f FILE, or landfall design apply -f FILE)"
                    ),
                ));
            };
            design
        };
        SiteDesign::try_from(design).map_err(invalid)
    }
}
