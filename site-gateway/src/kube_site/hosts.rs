//! New and deleted BareMetalHosts, as host changes for the gateway to announce.
//!
//! - A host that is not the gateway's own (no `landfall.io/node`) and not announced yet
//!   (no `landfall.io/announced`) is announced as an arrival once Metal3 has inspected it, so
//!   its `NodeAdded` carries the hardware. Once the bus holds the command, the host gets the
//!   `announced` mark and the gateway's finalizer: a restarted gateway does not announce it again.
//! - A known host being deleted (`deletionTimestamp` set, the finalizer holding it) is announced
//!   as a departure; once the bus holds the `NodeRemoved`, the finalizer comes off and the
//!   deletion goes on. A gateway that was down when a host was deleted finds it at its start.

use std::collections::{BTreeMap, HashSet};

use bus_schema::domain::{NodeDesign, Role};
use bus_schema::ids;
use futures::StreamExt;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde_json::json;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info, warn};

use super::error::kube_error;
use super::marks::{self, FIELD_MANAGER, add_finalizer};
use super::metal3::BareMetalHost;
use super::ownership::intent_of;
use crate::backend::{BackendError, HostChange, HostNotice};

/// What to write on a host once the bus holds its announcement.
#[derive(Debug, Clone)]
enum Mark {
    Announced(String),
    Released,
}

/// Watches the hosts of `hosts`'s namespace and sends each change to announce on `tx`, until
/// the receiver is gone.
pub(super) async fn watch(site: String, hosts: Api<BareMetalHost>, tx: mpsc::UnboundedSender<HostNotice>) {
    let mut events = watcher::watcher(hosts.clone(), watcher::Config::default()).default_backoff().boxed();
    let (marked_tx, mut marked) = mpsc::unbounded_channel::<(String, Mark)>();
    // Hosts whose announcement is on its way: later events of theirs wait for the mark.
    let mut pending = HashSet::new();
    // Hosts that cannot be announced, reported once each.
    let mut refused = HashSet::new();
    let mut departed = HashSet::new();
    loop {
        tokio::select! {
            _ = tx.closed() => return,
            Some((name, mark)) = marked.recv() => {
                if let Err(e) = write_mark(&hosts, &name, &mark).await {
                    warn!(%site, host = %name, error = %e.reason(), ?mark, "cannot mark host; it is announced again");
                }
                pending.remove(&name);
            }
            event = events.next() => match event {
                Some(Ok(Event::Apply(host) | Event::InitApply(host))) => {
                    let name = host.name_any();
                    if pending.contains(&name) {
                        continue;
                    }
                    let Some((change, mark)) = consider(&site, &host, &mut refused) else { continue };
                    if matches!(change, HostChange::Departed { .. }) {
                        departed.insert(name.clone());
                    }
                    pending.insert(name.clone());
                    send(&tx, change, name, mark, &marked_tx);
                }
                Some(Ok(Event::Delete(host))) => {
                    // Gone without the finalizer (deleted before it was set, or it was removed by
                    // hand): a known host is still announced as departed, once.
                    let name = host.name_any();
                    let known = is_known(&host);
                    pending.remove(&name);
                    if known && departed.insert(name.clone()) {
                        let _ = tx.send(HostNotice { change: departure(&host), announced: None });
                    }
                }
                Some(Ok(Event::Init | Event::InitDone)) => {}
                Some(Err(e)) => debug!(%site, error = %e, "host watch interrupted; resuming"),
                None => return,
            },
        }
    }
}

fn send(
    tx: &mpsc::UnboundedSender<HostNotice>,
    change: HostChange,
    name: String,
    mark: Mark,
    marked: &mpsc::UnboundedSender<(String, Mark)>,
) {
    let (tell, heard) = oneshot::channel();
    if tx.send(HostNotice { change, announced: Some(tell) }).is_err() {
        return;
    }
    let marked = marked.clone();
    tokio::spawn(async move {
        if heard.await.is_ok() {
            let _ = marked.send((name, mark));
        }
    });
}

fn is_known(host: &BareMetalHost) -> bool {
    let a = host.annotations();
    a.contains_key(marks::NODE) || a.contains_key(marks::ANNOUNCED)
}

fn departure(host: &BareMetalHost) -> HostChange {
    HostChange::Departed {
        node: host.name_any(),
        boot_mac: host.spec.boot_mac_address.clone().unwrap_or_default(),
        reason: "BareMetalHost deleted".into(),
        incarnation: host.metadata.uid.clone().unwrap_or_default(),
    }
}

/// What to announce about `host` now, if anything, and what to mark it with once announced.
fn consider(site: &str, host: &BareMetalHost, refused: &mut HashSet<String>) -> Option<(HostChange, Mark)> {
    let name = host.name_any();
    if host.metadata.deletion_timestamp.is_some() {
        let held = host.finalizers().iter().any(|f| f == marks::FINALIZER);
        return held.then(|| (departure(host), Mark::Released));
    }
    if is_known(host) || !host.inspected() {
        return None;
    }
    match node_of(host) {
        Ok(node) => {
            let incarnation = host.metadata.uid.clone().unwrap_or_default();
            let id = ids::node_added_id(site, node.name.as_str(), node.boot_mac.as_str(), &incarnation).to_string();
            info!(%site, host = %name, mac = %node.boot_mac, uid = %incarnation, "new host");
            Some((
                HostChange::Arrived { node: Box::new(node), hardware: host.hardware(), incarnation },
                Mark::Announced(id),
            ))
        }
        Err(reason) => {
            if refused.insert(name.clone()) {
                warn!(%site, host = %name, %reason, "host cannot be announced");
            }
            None
        }
    }
}

/// The node a host is: its name, its role (label `landfall.io/role`, worker by default), its
/// boot MAC and BMC address.
fn node_of(host: &BareMetalHost) -> Result<NodeDesign, String> {
    let role = match host.labels().get(marks::ROLE_LABEL).map(String::as_str) {
        Some("master") => Role::Master,
        None | Some("worker") => Role::Worker,
        Some(other) => return Err(format!("label {} is {other:?}, not master or worker", marks::ROLE_LABEL)),
    };
    let mac = host.spec.boot_mac_address.clone().ok_or("no spec.bootMACAddress")?;
    let bmc =
        host.spec.bmc.as_ref().map(|b| b.address.clone()).filter(|a| !a.is_empty()).ok_or("no spec.bmc.address")?;
    Ok(NodeDesign {
        name: host.name_any().try_into().map_err(|e| format!("{e}"))?,
        role,
        boot_mac: mac.try_into().map_err(|e| format!("{e}"))?,
        bmc_address: bmc.try_into().map_err(|e| format!("{e}"))?,
        labels: BTreeMap::new(),
        network: None,
        root_device: None,
        kernel_parameters: Default::default(),
    })
}

/// Writes `mark` on the host as it is now (a host already gone needs none).
async fn write_mark(hosts: &Api<BareMetalHost>, name: &str, mark: &Mark) -> Result<(), BackendError> {
    let Some(host) = hosts.get_opt(name).await.map_err(|e| kube_error(name, e))? else {
        return Ok(());
    };
    let mut intent = intent_of(&host, FIELD_MANAGER);
    match mark {
        Mark::Announced(id) => {
            intent["metadata"]["annotations"][marks::ANNOUNCED] = json!(id);
            add_finalizer(&mut intent);
        }
        Mark::Released => {
            if let Some(list) = intent["metadata"]["finalizers"].as_array_mut() {
                list.retain(|f| f != marks::FINALIZER);
            }
        }
    }
    let params = kube::api::PatchParams::apply(FIELD_MANAGER);
    hosts.patch(name, &params, &kube::api::Patch::Apply(&intent)).await.map_err(|e| kube_error(name, e))?;
    Ok(())
}
