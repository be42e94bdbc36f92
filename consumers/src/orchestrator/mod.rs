//! The provisioning orchestrator: commands in, sagas advanced in KV, jobs and events out.
//!
//! Two durable consumers share one [`Orchestrator`]: one on commands, one on the events that
//! move sagas forward. Any number of replicas may run; KV compare-and-set decides who wins.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bus_schema::design;
use bus_schema::domain::{InvalidField, Package, SiteDesign};
use bus_schema::names::{self, keys};
use bus_schema::pb::{self, BusEvent};
use bus_schema::runtime::{self, Bus, Cas, ConsumerSpec, Delivery, HandlerError, Kv, RejectAs};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::clock::now_ms;
use crate::lease::{self, Holder};
use crate::rollout::{self, Rollouts};
use crate::saga::{self, Decision, Input};

/// How long a command for a site that is busy with another saga waits before it is tried again.
const LEASE_RETRY: Duration = Duration::from_secs(1);
/// How many times a compare-and-set race is retried inside one delivery.
const CAS_ATTEMPTS: usize = 64;

fn invalid(e: InvalidField) -> HandlerError {
    HandlerError::reject(pb::RejectCode::Invalid, e.to_string())
}

/// Shared state of the orchestrator's consumers.
pub struct Orchestrator {
    bus: Bus,
    sites: Kv,
    packages: Kv,
    sagas: Kv,
    observed: Kv,
    pub rollouts: Rollouts,
}

impl Orchestrator {
    pub async fn new(bus: Bus) -> Result<Self, runtime::BusError> {
        Ok(Self {
            sites: bus.kv(names::SITES_BUCKET).await?,
            packages: bus.kv(names::PACKAGES_BUCKET).await?,
            sagas: bus.kv(names::SAGAS_BUCKET).await?,
            observed: bus.kv(names::OBSERVED_BUCKET).await?,
            rollouts: Rollouts::new(bus.clone()).await?,
            bus,
        })
    }

    async fn register_site(&self, d: &Delivery) -> Result<(), HandlerError> {
        let cmd: pb::RegisterSite = d.decode()?;
        let design = SiteDesign::try_from(cmd.design.unwrap_or_default()).map_err(invalid)?;
        let site = design.site.to_string();
        let revision = self.sites.put(&keys::site(&site), &pb::SiteDesign::from(&design)).await?;
        info!(%site, nodes = design.nodes.len(), revision, "site registered");
        let evt = pb::SiteRegistered { site_id: site, nodes: design.nodes.len() as u32, revision };
        self.bus.publish_event(&evt, &d.envelope.derive("site_registered", None)).await?;
        Ok(())
    }

    async fn register_package(&self, d: &Delivery) -> Result<(), HandlerError> {
        let cmd: pb::RegisterPackage = d.decode()?;
        let pkg = Package::try_from(cmd.package.unwrap_or_default()).map_err(invalid)?;
        let key = keys::package(pkg.name.as_str(), pkg.version.as_str());
        let entry = pb::Package::from(&pkg);
        match self.packages.create(&key, &entry).await? {
            Cas::Written(_) => info!(package = %pkg.name, version = %pkg.version, "package registered"),
            Cas::Conflict => {
                // The same name and version twice: the same content is a no-op, other content a
                // conflict. A version registered by its metadata alone takes the object key its
                // upload brings.
                let existing = self.packages.get::<pb::Package>(&key).await?;
                if let Some((e, revision)) = existing {
                    if e.sha256 != entry.sha256 || e.kind != entry.kind || e.size != entry.size {
                        return Err(HandlerError::reject(
                            pb::RejectCode::Conflict,
                            format!(
                                "{}@{} is already registered with other content (sha256:{}, {} bytes); publish a new \
                                 version",
                                pkg.name, pkg.version, e.sha256, e.size
                            ),
                        ));
                    }
                    if e.object_key.is_empty() && !entry.object_key.is_empty() {
                        // A lost race with another replica leaves the same key: retried by NAK.
                        if let Cas::Conflict = self.packages.update(&key, &entry, revision).await? {
                            return Err(HandlerError::Transient(format!("{key} changed while registering")));
                        }
                        info!(package = %pkg.name, version = %pkg.version, "package bytes uploaded");
                    }
                }
            }
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
            trigger: format!("auto-rollout of {}@{}", entry.name, entry.version),
        };
        let env = d.envelope.derive("auto_rollout", None);
        info!(package = %entry.name, version = %entry.version, rollout = %env.id, "auto-rollout starts");
        self.bus.publish_command(&cmd, &env).await?;
        Ok(())
    }

    /// Validates a site's design documents as a whole and stores them as its next revision;
    /// identical documents change nothing and publish nothing.
    async fn apply_design(&self, d: &Delivery) -> Result<(), HandlerError> {
        let cmd: pb::ApplyDesign = d.decode()?;
        let site = bus_schema::domain::SiteId::try_from(cmd.site_id.clone()).map_err(invalid)?;
        let latest = self.sites.get::<pb::DesignRevision>(&keys::design_latest(site.as_str())).await?.map(|(r, _)| r);
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
        match self.sites.create(&keys::design_revision(site.as_str(), revision), &record).await? {
            Cas::Written(_) => {}
            // This command got there first (a redelivery) or another apply did: look again.
            Cas::Conflict => {
                let (existing, _) = self
                    .sites
                    .get::<pb::DesignRevision>(&keys::design_revision(site.as_str(), revision))
                    .await?
                    .ok_or_else(|| HandlerError::Transient(format!("design revision {revision} of {site} vanished")))?;
                if existing.command_id != d.envelope.id {
                    return Err(HandlerError::Transient(format!(
                        "design revision {revision} of {site} was taken; retrying"
                    )));
                }
            }
        }
        self.sites.put(&keys::design_latest(site.as_str()), &record).await?;
        self.sites.put(&keys::site(site.as_str()), &planned.effective).await?;
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

    async fn catalog_for(&self, design: &SiteDesign) -> Result<BTreeMap<String, Package>, HandlerError> {
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

    async fn install_site(&self, d: &Delivery) -> Result<(), HandlerError> {
        let cmd: pb::InstallSite = d.decode()?;
        let site = bus_schema::domain::SiteId::try_from(cmd.site_id).map_err(invalid)?.to_string();
        let saga_key = keys::saga(&d.envelope.id);

        // A redelivery of an accepted command: finish what it started, nothing more.
        if let Some((existing, rev)) = self.sagas.get::<pb::InstallSaga>(&saga_key).await? {
            self.settle(&saga_key, existing, rev).await?;
            return Ok(());
        }

        let design = self.design_at(&site, cmd.design_revision).await?;
        let resolved = saga::resolve(&design, &self.catalog_for(&design).await?)
            .map_err(|r| HandlerError::reject(r.code, r.reason))?;

        lease::acquire_or_wait(&self.sagas, &site, Holder::Saga(&d.envelope.id), LEASE_RETRY).await?;
        let new = saga::start(&d.envelope, &design, resolved, now_ms());
        match self.sagas.create(&saga_key, &new).await? {
            Cas::Written(rev) => {
                info!(%site, saga = %d.envelope.id, nodes = design.nodes.len(), "install started");
                let pointer = pb::SiteLease {
                    site_id: site.clone(),
                    saga_id: d.envelope.id.clone(),
                    acquired_unix_ms: now_ms(),
                    ..Default::default()
                };
                self.sagas.put(&keys::latest_install(&site), &pointer).await?;
                self.settle(&saga_key, new, rev).await?;
            }
            Cas::Conflict => {
                // Another replica created it first: make sure its outbox goes out.
                if let Some((existing, rev)) = self.sagas.get::<pb::InstallSaga>(&saga_key).await? {
                    self.settle(&saga_key, existing, rev).await?;
                }
            }
        }
        Ok(())
    }

    /// A site's design at `revision`, or its current one for 0.
    async fn design_at(&self, site: &str, revision: u64) -> Result<SiteDesign, HandlerError> {
        let design = if revision > 0 {
            let key = keys::design_revision(site, revision);
            let Some((rev, _)) = self.sites.get::<pb::DesignRevision>(&key).await? else {
                return Err(HandlerError::reject(
                    pb::RejectCode::Invalid,
                    format!("site {site} has no design revision {revision}"),
                ));
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

    /// Stages a site's artifacts into its gateway's cache, ahead of an install. It changes no
    /// node, so it takes no site lease; the job's id comes from the command's, so a redelivered
    /// command sends no second job.
    async fn stage_site(&self, d: &Delivery) -> Result<(), HandlerError> {
        let cmd: pb::StageSite = d.decode()?;
        let site = bus_schema::domain::SiteId::try_from(cmd.site_id).map_err(invalid)?.to_string();
        let design = self.design_at(&site, cmd.design_revision).await?;
        let resolved = saga::resolve(&design, &self.catalog_for(&design).await?)
            .map_err(|r| HandlerError::reject(r.code, r.reason))?;
        let job = saga::stage_job(site.clone(), &resolved);
        info!(%site, artifacts = job.artifacts.len(), "staging ahead of an install");
        self.bus.publish_job(&job, &d.envelope.derive("stage_artifacts", None)).await?;
        Ok(())
    }

    /// A node appeared at a site (its gateway saw a new host, or an operator said so). It goes
    /// into the site's design; at an installed site it then joins the cluster: OS, its role's
    /// packages at the site's current versions, binaries joining the running cluster, NodeReady.
    /// A node the design has, and that runs something already, changes nothing.
    async fn node_added(&self, d: &Delivery) -> Result<(), HandlerError> {
        let cmd: pb::NodeAdded = d.decode()?;
        let site = bus_schema::domain::SiteId::try_from(cmd.site_id).map_err(invalid)?.to_string();
        let node = bus_schema::domain::NodeDesign::try_from(cmd.node.unwrap_or_default()).map_err(invalid)?;
        let name = node.name.to_string();
        let saga_key = keys::saga(&d.envelope.id);
        if let Some((existing, rev)) = self.sagas.get::<pb::InstallSaga>(&saga_key).await? {
            self.settle(&saga_key, existing, rev).await?;
            return Ok(());
        }
        let Some((current, _)) = self.sites.get::<pb::SiteDesign>(&keys::site(&site)).await? else {
            return Err(HandlerError::reject(
                pb::RejectCode::UnknownSite,
                format!("site {site} is not registered; a node cannot be added to it"),
            ));
        };
        let current = SiteDesign::try_from(current).map_err(invalid)?;
        if let Some(other) = current.nodes.iter().find(|n| n.boot_mac == node.boot_mac && n.name != node.name) {
            return Err(HandlerError::reject(
                pb::RejectCode::Conflict,
                format!("boot MAC {} of {name} is already node {} of {site}", node.boot_mac, other.name),
            ));
        }
        match current.node(&name) {
            Some(known) if known.boot_mac != node.boot_mac => {
                return Err(HandlerError::reject(
                    pb::RejectCode::Conflict,
                    format!("{site} already has a node {name}, with boot MAC {}", known.boot_mac),
                ));
            }
            Some(_) if self.runs_something(&site, &name).await? => {
                debug!(%site, node = %name, "node already known and running");
                return Ok(());
            }
            _ => {}
        }

        lease::acquire_or_wait(&self.sagas, &site, Holder::Saga(&d.envelope.id), LEASE_RETRY).await?;
        let design = self.add_node(&site, &node).await?;
        if !self.site_installed(&site).await? {
            // Not installed yet: the node is in the design, and the install brings it up.
            lease::release(&self.sagas, &site, Holder::Saga(&d.envelope.id)).await?;
            let evt = pb::NodeAccepted {
                site_id: site.clone(),
                node: Some(pb::NodeSpec::from(&node)),
                joining: false,
                hardware: cmd.hardware.clone(),
            };
            self.bus.publish_event(&evt, &d.envelope.derive("node_accepted", None)).await?;
            info!(%site, node = %name, "node added to the design; the site's install will bring it up");
            return Ok(());
        }
        let resolved = match saga::resolve(&design, &self.catalog_for(&design).await?) {
            Ok(r) => r,
            Err(r) => {
                lease::release(&self.sagas, &site, Holder::Saga(&d.envelope.id)).await?;
                return Err(HandlerError::reject(r.code, r.reason));
            }
        };
        let new = saga::start_join(&d.envelope, &design, &name, cmd.hardware, resolved, now_ms());
        match self.sagas.create(&saga_key, &new).await? {
            Cas::Written(rev) => {
                info!(%site, node = %name, saga = %d.envelope.id, "node joining");
                self.settle(&saga_key, new, rev).await?;
            }
            Cas::Conflict => {
                if let Some((existing, rev)) = self.sagas.get::<pb::InstallSaga>(&saga_key).await? {
                    self.settle(&saga_key, existing, rev).await?;
                }
            }
        }
        Ok(())
    }

    /// Whether the node has reported running anything (`landfall-observed`).
    async fn runs_something(&self, site: &str, node: &str) -> Result<bool, HandlerError> {
        Ok(!self.observed.scan::<pb::ObservedVersion>(&keys::observed_node_prefix(site, node)).await?.is_empty())
    }

    /// Whether the site's latest install ended with a cluster (success or partial success).
    async fn site_installed(&self, site: &str) -> Result<bool, HandlerError> {
        let Some((latest, _)) = self.sagas.get::<pb::SiteLease>(&keys::latest_install(site)).await? else {
            return Ok(false);
        };
        let saga = self.sagas.get::<pb::InstallSaga>(&keys::saga(&latest.saga_id)).await?;
        Ok(saga.is_some_and(|(s, _)| {
            matches!(
                pb::InstallOutcome::try_from(s.outcome),
                Ok(pb::InstallOutcome::Success | pb::InstallOutcome::PartialSuccess)
            )
        }))
    }

    /// Takes a node out of its site's design, under the site's lease (a saga or rollout working
    /// on the site finishes first), and says so with `NodeLeft`.
    ///
    /// The event goes out before the design is written, with an id derived from the command: a
    /// redelivery after a crash between the two publishes it again (dropped as a copy) and
    /// writes the design. A node the design does not have is refused with the reason, unless
    /// this is a redelivery: then it is the removal that finished before the crash.
    async fn node_removed(&self, d: &Delivery) -> Result<(), HandlerError> {
        let cmd: pb::NodeRemoved = d.decode()?;
        let site = bus_schema::domain::SiteId::try_from(cmd.site_id.clone()).map_err(invalid)?.to_string();
        let key = keys::site(&site);
        if self.sites.get::<pb::SiteDesign>(&key).await?.is_none() {
            return Err(HandlerError::reject(
                pb::RejectCode::UnknownSite,
                format!("site {site} is not registered; no node can leave it"),
            ));
        }
        lease::acquire_or_wait(&self.sagas, &site, Holder::Saga(&d.envelope.id), LEASE_RETRY).await?;
        let removed = self.remove_node(&key, &cmd, d).await;
        lease::release(&self.sagas, &site, Holder::Saga(&d.envelope.id)).await?;
        removed
    }

    async fn remove_node(&self, key: &str, cmd: &pb::NodeRemoved, d: &Delivery) -> Result<(), HandlerError> {
        let (site, name) = (cmd.site_id.as_str(), cmd.node.as_str());
        for _ in 0..CAS_ATTEMPTS {
            let Some((current, rev)) = self.sites.get::<pb::SiteDesign>(key).await? else {
                return Err(HandlerError::Transient(format!("site {site} vanished")));
            };
            let mut design = SiteDesign::try_from(current).map_err(invalid)?;
            let Some(known) = design.node(name) else {
                if d.delivered > 1 {
                    info!(%site, node = %name, "node removal redelivered: the node has left already");
                    return Ok(());
                }
                return Err(HandlerError::reject(
                    pb::RejectCode::Invalid,
                    format!("{site} has no node {name} in its design"),
                ));
            };
            if !cmd.boot_mac.is_empty() && !known.boot_mac.as_str().eq_ignore_ascii_case(&cmd.boot_mac) {
                return Err(HandlerError::reject(
                    pb::RejectCode::Conflict,
                    format!(
                        "node {name} of {site} has boot MAC {}, not {}: the host removed is another one",
                        known.boot_mac, cmd.boot_mac
                    ),
                ));
            }
            let boot_mac = known.boot_mac.to_string();
            design.nodes.retain(|n| n.name.as_str() != name);
            let design = design.validate().map_err(|e| {
                HandlerError::reject(pb::RejectCode::Conflict, format!("{site} without node {name}: {e}"))
            })?;
            let evt = pb::NodeLeft {
                site_id: site.to_string(),
                node: name.to_string(),
                boot_mac,
                reason: cmd.reason.clone(),
            };
            self.bus.publish_event(&evt, &d.envelope.derive("node_left", None)).await?;
            if let Cas::Written(_) = self.sites.update(key, &pb::SiteDesign::from(&design), rev).await? {
                info!(%site, node = %name, reason = %cmd.reason, "node left the site");
                return Ok(());
            }
        }
        Err(HandlerError::Transient(format!("site {site} design kept changing")))
    }

    /// Puts the node into the site's design (compare-and-set); returns the design with it.
    async fn add_node(&self, site: &str, node: &bus_schema::domain::NodeDesign) -> Result<SiteDesign, HandlerError> {
        let key = keys::site(site);
        for _ in 0..CAS_ATTEMPTS {
            let Some((current, rev)) = self.sites.get::<pb::SiteDesign>(&key).await? else {
                return Err(HandlerError::Transient(format!("site {site} vanished")));
            };
            let mut design = SiteDesign::try_from(current).map_err(invalid)?;
            if design.node(node.name.as_str()).is_some() {
                return Ok(design);
            }
            design.nodes.push(node.clone());
            let design = design.validate().map_err(invalid)?;
            if let Cas::Written(_) = self.sites.update(&key, &pb::SiteDesign::from(&design), rev).await? {
                return Ok(design);
            }
        }
        Err(HandlerError::Transient(format!("site {site} design kept changing")))
    }

    /// Publishes the saga's outbox, clears it, and releases the lease once the saga has ended.
    /// Safe to repeat: the messages carry fixed ids, so a second publish is dropped as a duplicate.
    async fn settle(&self, key: &str, mut saga: pb::InstallSaga, rev: u64) -> Result<(), HandlerError> {
        if !saga.outbox.is_empty() {
            crate::failpoint::hit("saga-written-outbox-unpublished");
            self.bus.publish_all(crate::decision::outgoing(&saga.outbox, &saga.saga_id)).await?;
            crate::failpoint::hit("outbox-published-not-cleared");
            saga.outbox.clear();
            if self.sagas.update(key, &saga, rev).await? == Cas::Conflict {
                // Someone else changed it meanwhile; they (or the next delivery) settle it.
                return Ok(());
            }
        }
        if saga::is_terminal(&saga) {
            lease::release(&self.sagas, &saga.site_id, Holder::Saga(&saga.saga_id)).await?;
        }
        Ok(())
    }

    /// Publishes what sagas decided before a crash and did not get to publish. Redelivery
    /// would get there too, but only after the ack wait; this resumes at once from KV state.
    pub async fn recover(&self) -> Result<usize, HandlerError> {
        let mut settled = 0;
        for key in self.sagas.keys_with_prefix(&keys::saga("")).await? {
            if let Some((saga, rev)) = self.sagas.get::<pb::InstallSaga>(&key).await?
                && (!saga.outbox.is_empty() || saga::is_terminal(&saga))
            {
                settled += usize::from(!saga.outbox.is_empty());
                self.settle(&key, saga, rev).await?;
            }
        }
        Ok(settled)
    }

    async fn on_event(&self, d: &Delivery) -> Result<(), HandlerError> {
        let Some(input) = input_of(d)? else { return Ok(()) };
        let key = keys::saga(&d.envelope.correlation);
        for _ in 0..CAS_ATTEMPTS {
            let Some((current, rev)) = self.sagas.get::<pb::InstallSaga>(&key).await? else {
                debug!(subject = %d.subject, correlation = %d.envelope.correlation, "event belongs to no install saga");
                return Ok(());
            };
            if !current.outbox.is_empty() {
                // A previous step decided but did not finish publishing: finish it first.
                self.settle(&key, current, rev).await?;
                continue;
            }
            match saga::decide(&current, &input, &d.envelope, now_ms()) {
                Decision::Ignore => return Ok(()),
                Decision::Wait => {
                    return Err(HandlerError::Wait {
                        reason: format!("{} arrived before the saga reached its phase", d.type_name),
                        delay: Duration::from_millis(200),
                    });
                }
                Decision::Apply(next) => match self.sagas.update(&key, next.as_ref(), rev).await? {
                    Cas::Written(new_rev) => {
                        observe_saga(&current, &next);
                        if saga::is_terminal(&next) {
                            info!(site = %next.site_id, saga = %next.saga_id, outcome = next.outcome, "install finished");
                        }
                        return self.settle(&key, *next, new_rev).await;
                    }
                    Cas::Conflict => continue,
                },
            }
        }
        Err(HandlerError::Transient(format!("saga {key} kept changing under {}", d.type_name)))
    }
}

/// Records how long the saga spent in the phase it has just left and, once it has ended, in all.
/// Only the write that moved it counts, so each is observed once whatever the replicas.
fn observe_saga(before: &pb::InstallSaga, after: &pb::InstallSaga) {
    if let Some((step, seconds)) = saga::phase_left(before, after) {
        metrics::histogram!("landfall_saga_step_seconds", "step" => step).record(seconds);
    }
    if saga::is_terminal(after) && !saga::is_terminal(before) {
        let kind = if after.join { "join" } else { "install" };
        let outcome = match pb::InstallOutcome::try_from(after.outcome) {
            Ok(pb::InstallOutcome::Success) => "success",
            Ok(pb::InstallOutcome::PartialSuccess) => "partial_success",
            _ => "failure",
        };
        let seconds = (after.finished_unix_ms - after.started_unix_ms).max(0) as f64 / 1000.0;
        metrics::histogram!("landfall_saga_seconds", "kind" => kind, "outcome" => outcome).record(seconds);
    }
}

/// The saga input an event carries; `None` for events the orchestrator does not act on.
fn input_of(d: &Delivery) -> Result<Option<Input>, HandlerError> {
    let kind = match names::parse_subject(&d.subject) {
        Some(names::ParsedSubject::Event { aggregate, kind, .. }) => (aggregate, kind),
        _ => return Ok(None),
    };
    let is = |a: &str, k: &str| kind == (a, k);
    Ok(Some(if is(pb::ArtifactsStaged::AGGREGATE, pb::ArtifactsStaged::KIND) {
        d.decode::<pb::ArtifactsStaged>()?;
        Input::Staged
    } else if is(pb::NodeOsProvisioning::AGGREGATE, pb::NodeOsProvisioning::KIND) {
        let e: pb::NodeOsProvisioning = d.decode()?;
        Input::OsState { node: e.node, state: e.state }
    } else if is(pb::NodeOsProvisioned::AGGREGATE, pb::NodeOsProvisioned::KIND) {
        Input::OsProvisioned { node: d.decode::<pb::NodeOsProvisioned>()?.node }
    } else if is(pb::NodeFailed::AGGREGATE, pb::NodeFailed::KIND) {
        let e: pb::NodeFailed = d.decode()?;
        Input::NodeFailed { node: e.node, step: e.step, reason: e.reason }
    } else if is(pb::NodeBinariesInstalled::AGGREGATE, pb::NodeBinariesInstalled::KIND) {
        Input::BinariesInstalled { node: d.decode::<pb::NodeBinariesInstalled>()?.node }
    } else if is(pb::ClusterReady::AGGREGATE, pb::ClusterReady::KIND) {
        Input::ClusterReady(d.decode()?)
    } else if is(pb::KubeconfigStored::AGGREGATE, pb::KubeconfigStored::KIND) {
        d.decode::<pb::KubeconfigStored>()?;
        Input::KubeconfigStored
    } else if is(pb::ContainerPackagesApplied::AGGREGATE, pb::ContainerPackagesApplied::KIND) {
        d.decode::<pb::ContainerPackagesApplied>()?;
        Input::ContainersApplied
    } else if is(pb::JobFailed::AGGREGATE, pb::JobFailed::KIND) {
        let e: pb::JobFailed = d.decode()?;
        Input::JobFailed { job: e.job, reason: e.reason }
    } else {
        return Ok(None);
    }))
}

/// The events that move an install saga.
pub fn saga_event_filters() -> Vec<String> {
    vec![
        pb::ArtifactsStaged::filter(),
        pb::NodeOsProvisioning::filter(),
        pb::NodeOsProvisioned::filter(),
        pb::NodeFailed::filter(),
        pb::NodeBinariesInstalled::filter(),
        pb::ClusterReady::filter(),
        pb::KubeconfigStored::filter(),
        pb::ContainerPackagesApplied::filter(),
        pb::JobFailed::filter(),
    ]
}

struct Commands(Arc<Orchestrator>);
struct Events(Arc<Orchestrator>);

impl runtime::Handler for Commands {
    async fn handle(&self, d: &Delivery) -> Result<(), HandlerError> {
        let result = self.dispatch(d).await;
        count_command(d, &result);
        result
    }
}

/// Counts a command the orchestrator accepted or rejected, by type (`unknown` for a subject
/// naming no command, so a stray publisher cannot grow the label set). A command that will be
/// tried again (transient, or waiting for its site) is counted when it is settled.
fn count_command(d: &Delivery, result: &Result<(), HandlerError>) {
    let kind = d.kind().unwrap_or_default();
    let type_name = pb::COMMAND_TYPES.iter().find(|(k, _)| *k == kind).map_or("unknown", |(_, t)| t);
    match result {
        Ok(()) => {
            metrics::counter!("landfall_commands_total", "type" => type_name, "outcome" => "accepted").increment(1);
        }
        Err(HandlerError::Reject(r)) => {
            let code = runtime::reject_code_label(r.code);
            metrics::counter!("landfall_commands_total", "type" => type_name, "outcome" => "rejected", "code" => code)
                .increment(1);
        }
        Err(HandlerError::Transient(_) | HandlerError::Wait { .. }) => {}
    }
}

impl Commands {
    async fn dispatch(&self, d: &Delivery) -> Result<(), HandlerError> {
        use pb::BusCommand;
        match d.kind()? {
            pb::RegisterSite::KIND => self.0.register_site(d).await,
            pb::RegisterPackage::KIND => self.0.register_package(d).await,
            pb::InstallSite::KIND => self.0.install_site(d).await,
            pb::StageSite::KIND => self.0.stage_site(d).await,
            pb::ApplyDesign::KIND => self.0.apply_design(d).await,
            pb::PatchPackage::KIND => self.0.rollouts.patch_package(d).await,
            pb::PauseRollout::KIND => self.0.rollouts.pause(d).await,
            pb::ResumeRollout::KIND => self.0.rollouts.resume(d).await,
            pb::CancelRollout::KIND => self.0.rollouts.cancel(d).await,
            pb::NodeAdded::KIND => self.0.node_added(d).await,
            pb::NodeRemoved::KIND => self.0.node_removed(d).await,
            other => Err(HandlerError::reject(pb::RejectCode::Unsupported, format!("no such command {other:?}"))),
        }
    }
}

impl runtime::Handler for Events {
    async fn handle(&self, d: &Delivery) -> Result<(), HandlerError> {
        self.0.on_event(d).await
    }
}

struct RolloutEvents(Arc<Orchestrator>);

impl runtime::Handler for RolloutEvents {
    async fn handle(&self, d: &Delivery) -> Result<(), HandlerError> {
        self.0.rollouts.on_site_patched(d).await
    }
}

/// Looks at the rollouts under way every [`rollout::TICK`] until `shutdown`.
async fn tick_rollouts(orchestrator: Arc<Orchestrator>, shutdown: CancellationToken) {
    let mut every = tokio::time::interval(rollout::TICK);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = every.tick() => {}
        }
        if let Err(e) = orchestrator.rollouts.tick().await {
            warn!(error = %e, "rollout tick failed; trying again");
        }
    }
}

/// Runs the orchestrator's consumers until `shutdown`.
pub async fn run_orchestrator(bus: Bus, shutdown: CancellationToken) -> anyhow::Result<()> {
    let orchestrator = Arc::new(Orchestrator::new(bus.clone()).await?);
    match orchestrator.recover().await {
        Ok(0) => {}
        Ok(n) => info!(sagas = n, "resumed sagas interrupted before publishing"),
        Err(e) => warn!(error = %e, "could not resume interrupted sagas now; redelivery will"),
    }
    let commands = ConsumerSpec::new(
        names::COMMANDS_STREAM,
        names::ORCHESTRATOR_COMMANDS,
        vec![names::COMMANDS_ALL.to_string()],
        RejectAs::Command,
    )
    .ordered_by_token(names::COMMAND_SCOPE_TOKEN, Some(names::FLEET));
    let events = ConsumerSpec::new(
        names::EVENTS_STREAM,
        names::ORCHESTRATOR_EVENTS,
        saga_event_filters(),
        RejectAs::Message { consumer: names::ORCHESTRATOR_EVENTS.to_string() },
    )
    // One site's events, one at a time: they all land on that site's saga record, and taking
    // turns beats losing compare-and-set races. Sites still run in parallel.
    .ordered_by_token(names::EVENT_SCOPE_TOKEN, None);
    let rollouts = ConsumerSpec::new(
        names::EVENTS_STREAM,
        names::ORCHESTRATOR_ROLLOUTS,
        vec![pb::SitePatched::filter()],
        RejectAs::Message { consumer: names::ORCHESTRATOR_ROLLOUTS.to_string() },
    )
    // Reports are handled side by side; those of one rollout are counted together in one
    // write (see `Rollouts::count`).
    .concurrency(512);
    let ticks = tokio::spawn(tick_rollouts(orchestrator.clone(), shutdown.clone()));
    let c = runtime::consume(bus.clone(), commands, Arc::new(Commands(orchestrator.clone())), shutdown.clone());
    let e = runtime::consume(bus.clone(), events, Arc::new(Events(orchestrator.clone())), shutdown.clone());
    let r = runtime::consume(bus, rollouts, Arc::new(RolloutEvents(orchestrator)), shutdown);
    let (c, e, r) = tokio::join!(c, e, r);
    if let Err(err) = &c {
        warn!(error = %err, "command consumer stopped");
    }
    let _ = ticks.await;
    c?;
    e?;
    r?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bus_schema::pb::BusMessage;

    #[test]
    fn every_filter_is_an_event_subject() {
        for f in saga_event_filters() {
            assert!(f.starts_with("landfall.evt.*."), "{f}");
        }
        assert_eq!(pb::ClusterReady::TYPE, "landfall.v1.ClusterReady");
    }
}
