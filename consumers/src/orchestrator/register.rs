//! Registrations: a site's design (`RegisterSite`) and a package version into the catalog
//! (`RegisterPackage`), with the auto-rollout a newer version starts under an enabled policy.

use bus_schema::domain::{Package, SiteDesign};
use bus_schema::names::keys;
use bus_schema::pb;
use bus_schema::runtime::{self, Delivery, HandlerError, Update};
use tracing::{debug, info};

use super::service::{Orchestrator, invalid};

impl Orchestrator {
    pub(super) async fn register_site(&self, d: &Delivery) -> Result<(), HandlerError> {
        let cmd: pb::RegisterSite = d.decode()?;
        let design = SiteDesign::try_from(cmd.design.unwrap_or_default()).map_err(invalid)?;
        if let Some(problem) = design.cluster_problems().into_iter().next() {
            return Err(invalid(problem));
        }
        let site = design.site.to_string();
        let record = pb::SiteDesign::from(&design);
        let revision = match cmd.expected {
            None => self.sites.put(&keys::site(&site), &record).await?,
            Some(expected) => self.replace_site_at(&site, &record, expected.revision).await?,
        };
        // The site's gateway consumes its jobs through a durable the hub makes: a site's user
        // may not create consumers (it could make one that hands its jobs elsewhere).
        super::durables::make_site_durable(&self.bus, &site).await?;
        info!(%site, nodes = design.nodes.len(), revision, "site registered");
        let evt = pb::SiteRegistered { site_id: site, nodes: design.nodes.len() as u32, revision };
        self.bus.publish_event(&evt, &d.envelope.derive("site_registered", None)).await?;
        Ok(())
    }

    /// Writes `record` as `site`'s design if its record is at revision `expected` (0: none),
    /// and answers the new revision; otherwise refuses naming the current one. A redelivery
    /// that finds its own design written is done.
    async fn replace_site_at(&self, site: &str, record: &pb::SiteDesign, expected: u64) -> Result<u64, HandlerError> {
        let key = keys::site(site);
        let current = self.sites.get::<pb::SiteDesign>(&key).await?;
        let stale = |current: u64| {
            HandlerError::reject(
                pb::RejectCode::Conflict,
                format!("site {site}'s design is at revision {current}, not {expected}: read it again and retry"),
            )
        };
        let written = match current {
            Some((ref existing, rev)) if existing == record && rev != expected => return Ok(rev),
            Some((_, rev)) if rev != expected => return Err(stale(rev)),
            None if expected != 0 => return Err(stale(0)),
            Some((_, rev)) => self.sites.update(&key, record, rev).await?,
            None => self.sites.create(&key, record).await?,
        };
        match written {
            runtime::Cas::Written(rev) => Ok(rev),
            // Written by someone else since the read: the expected revision is stale now.
            runtime::Cas::Conflict => {
                let now = self.sites.get::<pb::SiteDesign>(&key).await?.map_or(0, |(_, rev)| rev);
                Err(stale(now))
            }
        }
    }

    pub(super) async fn register_package(&self, d: &Delivery) -> Result<(), HandlerError> {
        let cmd: pb::RegisterPackage = d.decode()?;
        let pkg = Package::try_from(cmd.package.unwrap_or_default()).map_err(invalid)?;
        let key = keys::package(pkg.name.as_str(), pkg.version.as_str());
        let entry = pb::Package::from(&pkg);
        // The same name and version twice: the same content is a no-op, other content a
        // conflict. A version registered by its metadata alone takes the object key its upload
        // brings.
        let registered = self
            .packages
            .update_with(&key, |existing: Option<&pb::Package>| match existing {
                None => Update::Put(entry.clone(), Ok(Registered::New)),
                Some(e) if e.sha256 != entry.sha256 || e.kind != entry.kind || e.size != entry.size => {
                    Update::Abort(Err(HandlerError::reject(
                        pb::RejectCode::Conflict,
                        format!(
                            "{}@{} is already registered with other content (sha256:{}, {} bytes); publish a new \
                             version",
                            pkg.name, pkg.version, e.sha256, e.size
                        ),
                    )))
                }
                Some(e) if e.object_key.is_empty() && !entry.object_key.is_empty() => {
                    Update::Put(entry.clone(), Ok(Registered::Uploaded))
                }
                Some(_) => Update::Keep(Ok(Registered::Already)),
            })
            .await??;
        match registered {
            Registered::New => info!(package = %pkg.name, version = %pkg.version, "package registered"),
            Registered::Uploaded => info!(package = %pkg.name, version = %pkg.version, "package bytes uploaded"),
            Registered::Already => {}
        }
        if let Some(auto) = cmd.auto_rollout {
            let policy = pb::PackagePolicy {
                name: pkg.name.to_string(),
                auto_rollout: Some(auto),
                command_id: d.envelope.id.clone(),
            };
            self.packages.put(&keys::policy(pkg.name.as_str()), &policy).await?;
        }
        let evt = pb::PackageRegistered { package: Some(entry.clone()) };
        self.bus.publish_event(&evt, &d.envelope.derive("package_registered", None)).await?;
        self.auto_rollout(d, &entry).await
    }

    /// A newly registered version of a package with an enabled auto-rollout policy starts a
    /// rollout to it, for the nodes that run an older one, when it is the newest registered.
    async fn auto_rollout(&self, d: &Delivery, entry: &pb::Package) -> Result<(), HandlerError> {
        let Some((policy, _)) = self.packages.get::<pb::PackagePolicy>(&keys::policy(&entry.name)).await? else {
            return Ok(());
        };
        let Some(auto) = policy.auto_rollout.filter(|a| a.enabled) else { return Ok(()) };
        let others: Vec<_> = runtime::package_refs(&self.packages)
            .await?
            .into_iter()
            .filter(|r| r.name.as_str() == entry.name && r.version.as_str() != entry.version)
            .collect();
        let cmp =
            |r: &bus_schema::domain::PackageRef| bus_schema::rollout::version_cmp(r.version.as_str(), &entry.version);
        // Newer than every other version, and not the first: there are nodes it may replace.
        if others.is_empty() || !others.iter().all(|r| cmp(r).is_lt()) {
            debug!(package = %entry.name, version = %entry.version, "not a newer version: no auto-rollout");
            return Ok(());
        }
        let cmd = pb::PatchPackage {
            name: entry.name.clone(),
            version: entry.version.clone(),
            selector: auto.selector,
            strategy: auto.strategy,
            only_older: true,
            again: false,
            ignore_windows: false,
            trigger: format!("auto-rollout of {}@{}", entry.name, entry.version),
        };
        let env = d.envelope.derive("auto_rollout", None);
        info!(package = %entry.name, version = %entry.version, rollout = %env.id, "auto-rollout starts");
        self.bus.publish_command(&cmd, &env).await?;
        Ok(())
    }
}

/// What registering a package version did to the catalog.
enum Registered {
    New,
    /// Its metadata was there; now its bytes' object key is too.
    Uploaded,
    /// The same entry was there already.
    Already,
}
