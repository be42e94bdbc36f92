//! Hosts the site gains or loses, announced to the hub as `NodeAdded` / `NodeRemoved` (kept
//! in the site's outbox first when the gateway runs on its leaf node).

use std::sync::Arc;

use bus_schema::domain::SiteId;
use bus_schema::ids;
use bus_schema::pb;
use bus_schema::runtime::{self, Bus, Envelope, ErrorKind};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::backend::{HostChange, SiteBackend};
use crate::outbox::{self, Outbox};

/// Announces each host the site gains as a `NodeAdded` command and each it loses as a
/// `NodeRemoved`, until `shutdown`; the backend hears back once the bus holds each.
///
/// A command's id depends only on the host (site, name, boot MAC, and its incarnation): a change a
/// restarted gateway hears again is published with the id it had, and the stream drops the copy;
/// a host deleted and created again is a new host.
pub(crate) async fn announce_host_changes<B: SiteBackend>(
    site: SiteId,
    bus: Bus,
    outbox: Option<Arc<Outbox>>,
    backend: Arc<B>,
    shutdown: CancellationToken,
) {
    let mut changes = backend.host_changes();
    loop {
        let notice = tokio::select! {
            _ = shutdown.cancelled() => return,
            n = changes.recv() => match n { Some(n) => n, None => return },
        };
        let published = match &notice.change {
            HostChange::Arrived { node, hardware, incarnation } => {
                let id = ids::node_added_id(site.as_str(), node.name.as_str(), node.boot_mac.as_str(), incarnation);
                let cmd = pb::NodeAdded {
                    site_id: site.to_string(),
                    node: Some(pb::NodeSpec::from(node.as_ref())),
                    hardware: hardware.clone(),
                };
                let envelope = Envelope::root_with_id(id);
                announce(&bus, outbox.as_deref(), &site, node.name.as_str(), &cmd, envelope, &shutdown).await
            }
            HostChange::Departed { node, boot_mac, reason, incarnation } => {
                let id = ids::node_removed_id(site.as_str(), node, boot_mac, incarnation);
                let cmd = pb::NodeRemoved {
                    site_id: site.to_string(),
                    node: node.clone(),
                    boot_mac: boot_mac.clone(),
                    reason: reason.clone(),
                };
                announce(&bus, outbox.as_deref(), &site, node, &cmd, Envelope::root_with_id(id), &shutdown).await
            }
        };
        if published && let Some(tell) = notice.announced {
            let _ = tell.send(());
        }
    }
}

/// Publishes one host change, retrying until the bus takes it (a host nobody announces never
/// joins the cluster, nor leaves the design): `false` when it was refused or the gateway stops.
async fn announce<C: pb::BusCommand>(
    bus: &Bus,
    outbox: Option<&Outbox>,
    site: &SiteId,
    node: &str,
    cmd: &C,
    envelope: Envelope,
    shutdown: &CancellationToken,
) -> bool {
    let subject = cmd.subject_from(bus.origin());
    for attempt in 1.. {
        // At a leaf node, the site's outbox keeps it until the hub has it.
        let published = match outbox {
            Some(outbox) if outbox::kept_at_site(&subject) => {
                outbox.store(&subject, C::TYPE, cmd.encode_to_vec().into(), &envelope).await
            }
            _ => bus.publish_command(cmd, &envelope).await.map(drop),
        };
        match published {
            Ok(()) => {
                info!(%site, node, kind = C::KIND, id = %envelope.id, "host change announced");
                return true;
            }
            Err(e) if e.kind() == ErrorKind::Reject => {
                let error = format!("{:#}", anyhow::Error::from(e));
                error!(%site, node, kind = C::KIND, %error, "cannot announce host change");
                return false;
            }
            Err(e) => {
                let error = format!("{:#}", anyhow::Error::from(e));
                warn!(%site, node, kind = C::KIND, attempt, %error, "cannot announce host change yet");
                tokio::select! {
                    _ = shutdown.cancelled() => return false,
                    _ = tokio::time::sleep(runtime::retry_delay(attempt)) => {}
                }
            }
        }
    }
    false
}
