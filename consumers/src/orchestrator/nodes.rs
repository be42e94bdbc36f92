//! Nodes that come and go after the install: `NodeAdded` puts a node into its site's design
//! and, at an installed site, starts its join saga; `NodeRemoved` takes it out under the lease.

use bus_schema::domain::SiteDesign;
use bus_schema::names::keys;
use bus_schema::pb;
use bus_schema::runtime::{Delivery, HandlerError, Update};
use tracing::{debug, info};

use super::service::{LEASE_RETRY, Orchestrator, invalid};
use crate::active;
use crate::clock::now_ms;
use crate::lease::{self, Holder};
use crate::saga;

impl Orchestrator {
    /// A node appeared at a site (its gateway saw a new host, or an operator said so). It goes
    /// into the site's design; at an installed site it then joins the cluster: OS, its role's
    /// packages at the site's current versions, binaries joining the running cluster, NodeReady.
    /// A node the design has, and that runs something already, changes nothing.
    pub(super) async fn node_added(&self, d: &Delivery) -> Result<(), HandlerError> {
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
        active::mark(&self.sagas, &keys::active_saga(&d.envelope.id), &d.envelope.id, &site).await?;
        let new = saga::start_join(&d.envelope, &design, &name, cmd.hardware, resolved, now_ms());
        // Created here, or by another replica first: either way its outbox goes out.
        let (created, (saga, rev)) = self.sagas.create_or_get(&saga_key, &new).await?;
        if created {
            info!(%site, node = %name, saga = %d.envelope.id, "node joining");
        }
        point_to_join(&self.sagas, &saga).await?;
        self.settle(&saga_key, saga, rev).await
    }

    /// Whether the node has reported running anything (`landfall-observed`).
    async fn runs_something(&self, site: &str, node: &str) -> Result<bool, HandlerError> {
        Ok(!self.observed.scan_few::<pb::ObservedVersion>(&keys::observed_node_prefix(site, node)).await?.is_empty())
    }

    /// Whether the site's latest install ended with a cluster (success or partial success).
    pub(super) async fn site_installed(&self, site: &str) -> Result<bool, HandlerError> {
        let Some((latest, _)) = self.sagas.get::<pb::SiteLease>(&keys::latest_install(site)).await? else {
            return Ok(false);
        };
        // A saga compacted after the retention left its outcome in its summary.
        let outcome = match self.sagas.get::<pb::InstallSaga>(&keys::saga(&latest.saga_id)).await? {
            Some((s, _)) => s.outcome,
            None => match self.sagas.get::<pb::SagaSummary>(&keys::saga_summary(&latest.saga_id)).await? {
                Some((s, _)) => s.outcome,
                None => return Ok(false),
            },
        };
        Ok(matches!(
            pb::InstallOutcome::try_from(outcome),
            Ok(pb::InstallOutcome::Success | pb::InstallOutcome::PartialSuccess)
        ))
    }

    /// Takes a node out of its site's design, under the site's lease (a saga or rollout working
    /// on the site finishes first), and says so with `NodeLeft`.
    ///
    /// The event goes out before the design is written, with an id derived from the command: a
    /// redelivery after a crash between the two publishes it again (dropped as a copy) and
    /// writes the design. A node the design does not have is refused with the reason, unless
    /// this is a redelivery: then it is the removal that finished before the crash.
    pub(super) async fn node_removed(&self, d: &Delivery) -> Result<(), HandlerError> {
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
        let removed = self.remove_node(&key, &cmd, d.delivered > 1, &d.envelope).await;
        lease::release(&self.sagas, &site, Holder::Saga(&d.envelope.id)).await?;
        removed
    }

    /// Takes `cmd`'s node out of the design at `key`, `NodeLeft` derived from `env` first. A
    /// node the design does not have is refused unless `redelivered`.
    pub(super) async fn remove_node(
        &self,
        key: &str,
        cmd: &pb::NodeRemoved,
        redelivered: bool,
        env: &bus_schema::envelope::Envelope,
    ) -> Result<(), HandlerError> {
        let (site, name) = (cmd.site_id.as_str(), cmd.node.as_str());
        let current = self.sites.get::<pb::SiteDesign>(key).await?.map(|(design, _)| design);
        let Removal::Remove { left, .. } = removal(current.as_ref(), cmd, redelivered)? else {
            info!(%site, node = %name, "node removal redelivered: the node has left already");
            return Ok(());
        };
        self.bus.publish_event(&left, &env.derive("node_left", None)).await?;
        let removed = self
            .sites
            .update_with(key, |current: Option<&pb::SiteDesign>| match removal(current, cmd, redelivered) {
                Ok(Removal::Remove { design, .. }) => Update::Put(*design, Ok(true)),
                Ok(Removal::Gone) => Update::Keep(Ok(false)),
                Err(refused) => Update::Abort(Err(refused)),
            })
            .await??;
        if removed {
            info!(%site, node = %name, reason = %cmd.reason, "node left the site");
        } else {
            info!(%site, node = %name, "node removal redelivered: the node has left already");
        }
        Ok(())
    }

    /// Puts the node into the site's design (compare-and-set); returns the design with it.
    async fn add_node(&self, site: &str, node: &bus_schema::domain::NodeDesign) -> Result<SiteDesign, HandlerError> {
        self.sites
            .update_with(&keys::site(site), |current: Option<&pb::SiteDesign>| match with_node(site, current, node) {
                Ok((design, false)) => Update::Keep(Ok(design)),
                Ok((design, true)) => Update::Put(pb::SiteDesign::from(&design), Ok(design)),
                Err(refused) => Update::Abort(Err(refused)),
            })
            .await?
    }
}

/// What removing a node does to its site's design.
enum Removal {
    /// The design without the node, and the event that says it left.
    Remove { design: Box<pb::SiteDesign>, left: pb::NodeLeft },
    /// The node is not in the design, and this is a redelivery: the removal finished before.
    Gone,
}

/// Takes `cmd`'s node out of `current`, the site's design: refused when the site is gone, the
/// node is another host, or the design is not valid without it; a node the design does not
/// have is refused unless `redelivered`.
fn removal(
    current: Option<&pb::SiteDesign>,
    cmd: &pb::NodeRemoved,
    redelivered: bool,
) -> Result<Removal, HandlerError> {
    let (site, name) = (cmd.site_id.as_str(), cmd.node.as_str());
    let Some(current) = current else {
        return Err(HandlerError::transient_reason(format!("site {site} vanished")));
    };
    let mut design = SiteDesign::try_from(current.clone()).map_err(invalid)?;
    let Some(known) = design.node(name) else {
        if redelivered {
            return Ok(Removal::Gone);
        }
        return Err(HandlerError::reject(pb::RejectCode::Invalid, format!("{site} has no node {name} in its design")));
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
    let design = design
        .validate()
        .map_err(|e| HandlerError::reject(pb::RejectCode::Conflict, format!("{site} without node {name}: {e}")))?;
    let left = pb::NodeLeft { site_id: site.to_string(), node: name.to_string(), boot_mac, reason: cmd.reason.clone() };
    Ok(Removal::Remove { design: Box::new(pb::SiteDesign::from(&design)), left })
}

/// `current`, the site's design, with `node` in it, and whether it had to be added.
fn with_node(
    site: &str,
    current: Option<&pb::SiteDesign>,
    node: &bus_schema::domain::NodeDesign,
) -> Result<(SiteDesign, bool), HandlerError> {
    let Some(current) = current else {
        return Err(HandlerError::transient_reason(format!("site {site} vanished")));
    };
    let mut design = SiteDesign::try_from(current.clone()).map_err(invalid)?;
    if design.node(node.name.as_str()).is_some() {
        return Ok((design, false));
    }
    design.nodes.push(node.clone());
    Ok((design.validate().map_err(invalid)?, true))
}

/// Points each node of join saga `saga` at it ([`keys::latest_join`]), unless a later join
/// holds the pointer already: a redelivered older join does not take it back.
pub(super) async fn point_to_join(sagas: &bus_schema::runtime::Kv, saga: &pb::InstallSaga) -> Result<(), HandlerError> {
    for node in saga.nodes.iter().filter_map(|n| n.node.as_ref()) {
        let pointer = pb::SiteLease {
            site_id: saga.site_id.clone(),
            saga_id: saga.saga_id.clone(),
            acquired_unix_ms: saga.started_unix_ms,
            ..Default::default()
        };
        sagas
            .update_with(&keys::latest_join(&saga.site_id, &node.name), |current: Option<&pb::SiteLease>| match current
            {
                Some(held) if held.saga_id == pointer.saga_id || held.acquired_unix_ms > pointer.acquired_unix_ms => {
                    Update::Keep(())
                }
                _ => Update::Put(pointer.clone(), ()),
            })
            .await?;
    }
    Ok(())
}
