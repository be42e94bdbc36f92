//! New and deleted BareMetalHosts, as host changes for the gateway to announce.
//!
//! - A host that is not the gateway's own (no `landfall.io/node`) and not announced yet
//!   (no `landfall.io/announced`) is announced as an arrival once Metal3 has inspected it, so
//!   its `NodeAdded` carries the hardware. Once the bus holds the command, the host gets the
//!   `announced` mark and the gateway's finalizer: a restarted gateway does not announce it again.
//! - A known host being deleted (`deletionTimestamp` set, the finalizer holding it) is announced
//!   as a departure; once the bus holds the `NodeRemoved`, the finalizer comes off and the
//!   deletion goes on. A gateway that was down when a host was deleted finds it at its start.
//! - A host the gateway deletes itself (`landfall.io/retired`, written by `lifecycle.rs` before
//!   the delete) is let go without a word: the finalizer comes off, and no departure is
//!   announced, since the command that removed the node says so already.
//!
//! Every mark is written with the `resourceVersion` read: a host deleted in between is not
//! created again by the apply, and one changed in between is read again.

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
    let (marked_tx, mut marked) = mpsc::unbounded_channel::<(String, String, Mark)>();
    // Hosts whose announcement is on its way: later events of theirs wait for the mark.
    let mut pending = HashSet::new();
    // Hosts (by uid) whose mark is written. An event that was on its way while the mark was being
    // written shows the host as it was before it (not marked, the finalizer still on): it is
    // stale, and announces nothing again.
    let mut marked_arrivals = HashSet::new();
    let mut released = HashSet::new();
    // Hosts that cannot be announced, reported once each.
    let mut refused = HashSet::new();
    // Hosts (by uid) whose departure is announced.
    let mut departed = HashSet::new();
    loop {
        tokio::select! {
            _ = tx.closed() => return,
            Some((name, uid, mark)) = marked.recv() => {
                match write_mark(&hosts, &name, &mark).await {
                    Ok(()) if matches!(mark, Mark::Released) => { released.insert(uid); }
                    Ok(()) => { marked_arrivals.insert(uid); }
                    Err(e) => warn!(%site, host = %name, error = %e.reason(), ?mark, "cannot mark host; it is announced again"),
                }
                pending.remove(&name);
            }
            event = events.next() => match event {
                Some(Ok(Event::Apply(host) | Event::InitApply(host))) => {
                    let name = host.name_any();
                    let uid = uid(&host);
                    if pending.contains(&name) {
                        continue;
                    }
                    if retired(&host) {
                        if held(&host) && !released.contains(&uid) {
                            pending.insert(name.clone());
                            let _ = marked_tx.send((name, uid, Mark::Released));
                        }
                        continue;
                    }
                    let Some((change, mark)) = consider(&site, &host, &mut refused) else { continue };
                    let stale = match &change {
                        HostChange::Arrived { .. } => marked_arrivals.contains(&uid),
                        HostChange::Departed { .. } => released.contains(&uid),
                    };
                    if stale {
                        continue;
                    }
                    if matches!(change, HostChange::Departed { .. }) {
                        departed.insert(uid.clone());
                    }
                    pending.insert(name.clone());
                    send(&tx, change, (name, uid), mark, &marked_tx);
                }
                Some(Ok(Event::Delete(host))) => {
                    // Gone without the finalizer (deleted before it was set, or it was removed by
                    // hand): a known host is still announced as departed, once.
                    let name = host.name_any();
                    let uid = uid(&host);
                    pending.remove(&name);
                    marked_arrivals.remove(&uid);
                    released.remove(&uid);
                    let announced = departed.remove(&uid);
                    if is_known(&host) && !retired(&host) && !announced {
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
    (name, uid): (String, String),
    mark: Mark,
    marked: &mpsc::UnboundedSender<(String, String, Mark)>,
) {
    let (tell, heard) = oneshot::channel();
    if tx.send(HostNotice { change, announced: Some(tell) }).is_err() {
        return;
    }
    let marked = marked.clone();
    tokio::spawn(async move {
        if heard.await.is_ok() {
            let _ = marked.send((name, uid, mark));
        }
    });
}

/// The host's uid: what tells it apart from an earlier host of the same name.
fn uid(host: &BareMetalHost) -> String {
    host.metadata.uid.clone().unwrap_or_default()
}

fn is_known(host: &BareMetalHost) -> bool {
    let a = host.annotations();
    a.contains_key(marks::NODE) || a.contains_key(marks::ANNOUNCED)
}

/// Whether the gateway is deleting the host itself: its departure is not announced.
fn retired(host: &BareMetalHost) -> bool {
    host.annotations().contains_key(marks::RETIRED)
}

/// Whether the host is being deleted and the gateway's finalizer holds it.
fn held(host: &BareMetalHost) -> bool {
    host.metadata.deletion_timestamp.is_some() && host.finalizers().iter().any(|f| f == marks::FINALIZER)
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
        return held(host).then(|| (departure(host), Mark::Released));
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
        cleaning: Default::default(),
    })
}

/// How many times a mark is written again when the host changed since it was read.
const MARK_ATTEMPTS: usize = 5;

/// Writes `mark` on the host as it is now (a host already gone needs none). The apply carries
/// the `resourceVersion` read: were the host deleted meanwhile, an apply without it would create
/// it again.
async fn write_mark(hosts: &Api<BareMetalHost>, name: &str, mark: &Mark) -> Result<(), BackendError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
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
        intent["metadata"]["resourceVersion"] = json!(host.resource_version());
        let params = kube::api::PatchParams::apply(FIELD_MANAGER);
        match hosts.patch(name, &params, &kube::api::Patch::Apply(&intent)).await {
            Ok(_) => return Ok(()),
            // Changed since it was read (409), or gone (404): read again.
            Err(kube::Error::Api(s)) if (s.code == 409 || s.code == 404) && attempt < MARK_ATTEMPTS => {}
            Err(e) => return Err(kube_error(name, e)),
        }
    }
}
