//! `RemoveNode`, `ReprovisionNode` and `DecommissionSite`, executed: each takes its site's lease,
//! writes its record (`lifecycle.<id>`) and sends its site one job; the site's answer finishes it
//! (the node out of the design, the node's join, the site archived and forgotten), or its
//! `JobFailed` fails it with the site's reason. Every step is idempotent, so a command or a
//! report delivered again after a crash finishes what the first delivery began.

use bus_schema::domain::{SiteDesign, SiteId};
use bus_schema::names::keys;
use bus_schema::pb::{self, BusJob};
use bus_schema::runtime::{Delivery, HandlerError, Update};
use tracing::{debug, info, warn};

use super::service::{Orchestrator, invalid};
use crate::clock::now_ms;
use crate::lease::{self, Acquired, Holder};
use crate::{active, compaction, lifecycle, saga};

/// What an operation's site answered.
enum Answer {
    Retired(pb::NodeRetired),
    TornDown(pb::SiteTornDown),
    Failed(String),
}

/// Whether the event `d` carries answers an operation's job (its kind says so; a `JobFailed`
/// names the job kind it answers).
pub(super) fn is_lifecycle_answer(d: &Delivery) -> Result<bool, HandlerError> {
    use pb::BusMessage;
    Ok(match d.type_name.as_str() {
        pb::NodeRetired::TYPE | pb::SiteTornDown::TYPE => true,
        pb::JobFailed::TYPE => lifecycle::is_lifecycle_job(&d.decode::<pb::JobFailed>()?.job),
        _ => false,
    })
}

impl Orchestrator {
    /// The site's design, or the command's refusal when the site is not registered.
    async fn design_of(&self, site: &str) -> Result<SiteDesign, HandlerError> {
        let Some((design, _)) = self.sites.get::<pb::SiteDesign>(&keys::site(site)).await? else {
            return Err(HandlerError::reject(pb::RejectCode::UnknownSite, format!("site {site} is not registered")));
        };
        SiteDesign::try_from(design).map_err(invalid)
    }

    pub(super) async fn remove_node_cmd(&self, d: &Delivery) -> Result<(), HandlerError> {
        let cmd: pb::RemoveNode = d.decode()?;
        let site = SiteId::try_from(cmd.site_id.clone()).map_err(invalid)?.to_string();
        if self.resume(d).await? {
            return Ok(());
        }
        let design = self.design_of(&site).await?;
        let job =
            lifecycle::remove_job(&site, &design, &cmd.node).map_err(|r| HandlerError::reject(r.code, r.reason))?;
        // The design must hold without the node before anything is taken away.
        if design.node(&cmd.node).is_some() {
            let mut without = design.clone();
            without.nodes.retain(|n| n.name.as_str() != cmd.node);
            without.validate().map_err(|e| {
                HandlerError::reject(pb::RejectCode::Conflict, format!("{site} without node {}: {e}", cmd.node))
            })?;
        }
        self.begin(d, &site, pb::LifecycleKind::RemoveNode, &cmd.node, &cmd.reason, &job).await
    }

    pub(super) async fn reprovision_node(&self, d: &Delivery) -> Result<(), HandlerError> {
        let cmd: pb::ReprovisionNode = d.decode()?;
        let site = SiteId::try_from(cmd.site_id.clone()).map_err(invalid)?.to_string();
        if self.resume(d).await? {
            return Ok(());
        }
        let design = self.design_of(&site).await?;
        let job = lifecycle::reprovision_job(&site, &design, &cmd.node)
            .map_err(|r| HandlerError::reject(r.code, r.reason))?;
        if !self.site_installed(&site).await? {
            return Err(HandlerError::reject(
                pb::RejectCode::Conflict,
                format!("{site} is not installed: its install brings {} up", cmd.node),
            ));
        }
        self.begin(d, &site, pb::LifecycleKind::ReprovisionNode, &cmd.node, &cmd.reason, &job).await
    }

    pub(super) async fn decommission_site(&self, d: &Delivery) -> Result<(), HandlerError> {
        let cmd: pb::DecommissionSite = d.decode()?;
        let site = SiteId::try_from(cmd.site_id.clone()).map_err(invalid)?.to_string();
        if self.resume(d).await? {
            return Ok(());
        }
        self.design_of(&site).await?;
        let job = pb::TearDownSite { site_id: site.clone() };
        self.begin(d, &site, pb::LifecycleKind::DecommissionSite, "", &cmd.reason, &job).await
    }

    /// A command delivered again after its operation began: its job goes out again (a copy the
    /// bus drops, unless the first never got out). Whether there was one.
    async fn resume(&self, d: &Delivery) -> Result<bool, HandlerError> {
        let Some((op, _)) = self.sagas.get::<pb::Lifecycle>(&keys::lifecycle(&d.envelope.id)).await? else {
            return Ok(false);
        };
        if op.phase == pb::LifecyclePhase::TearingDown as i32 {
            self.send_job(&op).await?;
        }
        Ok(true)
    }

    /// Takes the site's lease, writes the operation's record and sends its job.
    async fn begin<J: BusJob>(
        &self,
        d: &Delivery,
        site: &str,
        kind: pb::LifecycleKind,
        node: &str,
        reason: &str,
        job: &J,
    ) -> Result<(), HandlerError> {
        let holder = Holder::Lifecycle(&d.envelope.id);
        if let Acquired::Busy(why) = lease::acquire(&self.sagas, site, holder).await? {
            return Err(HandlerError::reject(pb::RejectCode::Conflict, format!("{why}: let it end, then ask again")));
        }
        let job_env = d.envelope.derive(J::KIND, (!node.is_empty()).then_some(node));
        let op = lifecycle::start(&d.envelope, &job_env, site, kind, node, reason, now_ms());
        let key = keys::lifecycle(&op.id);
        // The record keeps the job's id: a command delivered again sends the same job again
        // (`send_job`), which the stream drops as a copy.
        self.sagas.create_or_get(&key, &op).await?;
        self.bus.publish_job(job, &job_env).await?;
        info!(site, node, operation = lifecycle::operation(op.kind), id = %op.id, "operation started");
        Ok(())
    }

    /// Sends `op`'s job again, rebuilt from its record and the site's design.
    async fn send_job(&self, op: &pb::Lifecycle) -> Result<(), HandlerError> {
        let env = lifecycle::envelope(op);
        let node = (!op.node.is_empty()).then_some(op.node.as_str());
        match pb::LifecycleKind::try_from(op.kind) {
            Ok(pb::LifecycleKind::DecommissionSite) => {
                let job = pb::TearDownSite { site_id: op.site_id.clone() };
                self.bus.publish_job(&job, &env.derive(pb::TearDownSite::KIND, node)).await?;
            }
            Ok(kind) => {
                let design = self.design_of(&op.site_id).await?;
                let job = match kind {
                    pb::LifecycleKind::ReprovisionNode => lifecycle::reprovision_job(&op.site_id, &design, &op.node),
                    _ => lifecycle::remove_job(&op.site_id, &design, &op.node),
                };
                match job {
                    Ok(job) => {
                        self.bus.publish_job(&job, &env.derive(pb::RetireNode::KIND, node)).await?;
                    }
                    // Refused now (the design changed since it began): it ends with the reason
                    // rather than holding the site.
                    Err(refused) => return self.finish(op.clone(), Err(refused.reason)).await,
                }
            }
            Err(_) => {}
        }
        Ok(())
    }

    /// A site's answer to an operation's job.
    pub(super) async fn on_lifecycle_event(&self, d: &Delivery) -> Result<(), HandlerError> {
        let key = keys::lifecycle(&d.envelope.correlation);
        let Some((op, _)) = self.sagas.get::<pb::Lifecycle>(&key).await? else {
            debug!(subject = %d.subject, "an operation's report for no operation under way");
            return Ok(());
        };
        let site = bus_schema::trust::subject_site(&d.subject).unwrap_or_default();
        let (answer, node) = match d.type_name.as_str() {
            t if t == <pb::NodeRetired as pb::BusMessage>::TYPE => {
                let e: pb::NodeRetired = d.decode()?;
                let node = e.node.clone();
                (Answer::Retired(e), Some(node))
            }
            t if t == <pb::SiteTornDown as pb::BusMessage>::TYPE => (Answer::TornDown(d.decode()?), None),
            _ => (Answer::Failed(d.decode::<pb::JobFailed>()?.reason), None),
        };
        lifecycle::check_answer(&op, site, node.as_deref(), &d.envelope.causation)
            .map_err(|reason| HandlerError::reject(pb::RejectCode::Forbidden, reason))?;
        if op.phase != pb::LifecyclePhase::TearingDown as i32 {
            // Finished before; a crash may have come between its end and the lease's release.
            self.let_go(&op).await?;
            return Ok(());
        }
        let finished = match answer {
            Answer::Failed(reason) => Err(reason),
            Answer::Retired(e) => self.node_retired(&op, &e).await?,
            Answer::TornDown(e) => self.site_torn_down(&op, &e).await.map(|()| Ok(()))?,
        };
        self.finish(op, finished).await
    }

    /// A removed node leaves the design; a reprovisioned one joins again, under the lease handed
    /// to its join. `Err(reason)` when that cannot be done.
    async fn node_retired(&self, op: &pb::Lifecycle, e: &pb::NodeRetired) -> Result<Result<(), String>, HandlerError> {
        let env = lifecycle::envelope(op);
        if op.kind == pb::LifecycleKind::RemoveNode as i32 {
            let reason = if op.reason.is_empty() { "removed".to_string() } else { op.reason.clone() };
            let cmd =
                pb::NodeRemoved { site_id: op.site_id.clone(), node: op.node.clone(), boot_mac: String::new(), reason };
            info!(site = %op.site_id, node = %op.node, host_deleted = e.host_deleted, "node removed from its site");
            // Out of the design before (a removal repeated): it is said to have left all the
            // same, so whoever follows this removal hears its end.
            if self.design_of(&op.site_id).await?.node(&op.node).is_none() {
                let left = pb::NodeLeft {
                    site_id: op.site_id.clone(),
                    node: op.node.clone(),
                    boot_mac: String::new(),
                    reason: format!("{} (it was out of the design already)", cmd.reason),
                };
                self.bus.publish_event(&left, &env.derive("node_left", None)).await?;
                return Ok(Ok(()));
            }
            return match self.remove_node(&keys::site(&op.site_id), &cmd, true, &env).await {
                Ok(()) => Ok(Ok(())),
                Err(HandlerError::Reject(r)) => Ok(Err(r.reason)),
                Err(other) => Err(other),
            };
        }
        // Reprovision: the node joins at the site's current versions, as a node added would.
        let design = self.design_of(&op.site_id).await?;
        let catalog = self.catalog_for(&design).await?;
        let resolved = match saga::resolve(&design, &catalog) {
            Ok(r) => r,
            Err(r) => return Ok(Err(r.reason)),
        };
        let rejoin = lifecycle::rejoin_envelope(op);
        let saga_key = keys::saga(&rejoin.id);
        let new = saga::start_join(&rejoin, &design, &op.node, None, resolved, now_ms());
        active::mark(&self.sagas, &keys::active_saga(&rejoin.id), &rejoin.id, &op.site_id).await?;
        let (_, (saga, rev)) = self.sagas.create_or_get(&saga_key, &new).await?;
        super::nodes::point_to_join(&self.sagas, &saga).await?;
        lease::hand_over(&self.sagas, &op.site_id, Holder::Lifecycle(&op.id), Holder::Saga(&rejoin.id)).await?;
        self.sagas
            .update_with(&keys::lifecycle(&op.id), |cur: Option<&pb::Lifecycle>| match cur {
                Some(cur) if cur.rejoin_id.is_empty() => {
                    Update::Put(pb::Lifecycle { rejoin_id: rejoin.id.clone(), ..cur.clone() }, ())
                }
                _ => Update::Keep(()),
            })
            .await?;
        info!(site = %op.site_id, node = %op.node, saga = %rejoin.id, "node wiped; it joins again");
        self.settle(&saga_key, saga, rev).await?;
        Ok(Ok(()))
    }

    /// The site is torn down: its records archived, then forgotten as `RemoveSite` forgets them.
    async fn site_torn_down(&self, op: &pb::Lifecycle, e: &pb::SiteTornDown) -> Result<(), HandlerError> {
        let site = op.site_id.as_str();
        let archive_key = keys::site_archive(site);
        if let Some((design, _)) = self.sites.get::<pb::SiteDesign>(&keys::site(site)).await? {
            let archive = self.archive(site, design, op, e).await?;
            self.sites.put(&archive_key, &archive).await?;
        }
        let revisions = self.forget_design(site).await?;
        self.summarise_install(site).await?;
        self.bus.delete_gateway_consumer(site).await?;
        let jobs_dropped = self.bus.drop_site_jobs(site).await?;
        let env = lifecycle::envelope(op);
        let removed = pb::SiteRemoved {
            site_id: site.to_string(),
            reason: op.reason.clone(),
            jobs_dropped,
            design_revisions: revisions,
        };
        self.bus.publish_event(&removed, &env.derive("site_removed", None)).await?;
        let done = pb::SiteDecommissioned {
            site_id: site.to_string(),
            reason: op.reason.clone(),
            hosts: e.hosts.clone(),
            resources: e.resources.clone(),
            archive_key,
            nats_user: bus_schema::access::Role::Site(site.to_string()).user(),
            revoke: lifecycle::revocation(site),
        };
        self.bus.publish_event(&done, &env.derive("site_decommissioned", None)).await?;
        info!(site, hosts = e.hosts.len(), resources = e.resources.len(), "site decommissioned");
        Ok(())
    }

    async fn archive(
        &self,
        site: &str,
        design: pb::SiteDesign,
        op: &pb::Lifecycle,
        e: &pb::SiteTornDown,
    ) -> Result<pb::SiteArchive, HandlerError> {
        let revisions = self.sites.scan_few::<pb::DesignRevision>(&keys::design_revisions_prefix(site)).await?;
        let observed = self.observed.scan_few::<pb::ObservedVersion>(&keys::observed_site_prefix(site)).await?;
        let mut install = None;
        if let Some((latest, _)) = self.sagas.get::<pb::SiteLease>(&keys::latest_install(site)).await? {
            install = match self.sagas.get::<pb::InstallSaga>(&keys::saga(&latest.saga_id)).await? {
                Some((s, _)) => Some(compaction::saga_summary(&s, now_ms())),
                None => self.sagas.get::<pb::SagaSummary>(&keys::saga_summary(&latest.saga_id)).await?.map(|(s, _)| s),
            };
        }
        Ok(pb::SiteArchive {
            site_id: site.to_string(),
            design: Some(design),
            revisions: revisions
                .into_iter()
                .filter(|(k, _, _)| *k != keys::design_latest(site))
                .map(|(_, r, _)| r)
                .collect(),
            install,
            observed: observed.into_iter().map(|(_, o, _)| o).collect(),
            hosts: e.hosts.clone(),
            resources: e.resources.clone(),
            reason: op.reason.clone(),
            command_id: op.id.clone(),
            decommissioned_unix_ms: now_ms(),
        })
    }

    /// Writes the operation's end, says so when it failed, and lets go of its site.
    async fn finish(&self, op: pb::Lifecycle, finished: Result<(), String>) -> Result<(), HandlerError> {
        let phase = if finished.is_ok() { pb::LifecyclePhase::Done } else { pb::LifecyclePhase::Failed };
        if let Err(reason) = &finished {
            warn!(site = %op.site_id, node = %op.node, operation = lifecycle::operation(op.kind), %reason, "operation failed");
            let evt = pb::LifecycleFailed {
                site_id: op.site_id.clone(),
                node: op.node.clone(),
                operation: lifecycle::operation(op.kind).to_string(),
                reason: reason.clone(),
            };
            self.bus.publish_event(&evt, &lifecycle::envelope(&op).derive("lifecycle_failed", None)).await?;
        }
        let ended = pb::Lifecycle {
            phase: phase as i32,
            failure: finished.err().unwrap_or_default(),
            finished_unix_ms: now_ms(),
            ..op
        };
        self.sagas
            .update_with(&keys::lifecycle(&ended.id), |cur: Option<&pb::Lifecycle>| match cur {
                Some(cur) if cur.phase == pb::LifecyclePhase::TearingDown as i32 => {
                    Update::Put(pb::Lifecycle { rejoin_id: cur.rejoin_id.clone(), ..ended.clone() }, ())
                }
                _ => Update::Keep(()),
            })
            .await?;
        self.let_go(&ended).await
    }

    async fn let_go(&self, op: &pb::Lifecycle) -> Result<(), HandlerError> {
        lease::release(&self.sagas, &op.site_id, Holder::Lifecycle(&op.id)).await?;
        Ok(())
    }
}
