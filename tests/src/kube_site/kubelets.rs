//! The kubelets' stand-in: every node of the BPA's `Provisioning` whose host runs an OS is a
//! `Node` of the application cluster (the same API server), `Ready` unless the test says
//! otherwise, reporting the kubelet version it runs. A kubelet runs the version its role's
//! `Software` lists when it registers, and again whenever that entry moves (the BPA installs a
//! role's software on all its nodes); an upgrade Job pinned to a node (landfall's per-node
//! binary patch) installs its version on that node alone, and the stand-in marks it succeeded.
//! Records each change of a node's schedulability and of its kubelet version.
//!
//! As a kubelet does, each registers its `Node` once: one deleted stays deleted until the
//! kubelet starts again, which it does once its host has an OS again after losing it (a host
//! `available` or on its way there runs none) or its node joins the cluster again.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bus_schema::domain::Role;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::json;
use site_gateway::kube_site::bpa;
use site_gateway::kube_site::marks;
use site_gateway::kube_site::metal3::BareMetalHost;
use tokio_util::sync::CancellationToken;

use super::{NAMESPACE, SITE};

/// What the kubelets' stand-in is told, shared with the test.
#[derive(Debug, Clone, Default)]
pub struct KubeletKnobs {
    /// Nodes whose kubelet reports `Ready: False`.
    pub not_ready: Arc<Mutex<BTreeSet<String>>>,
    /// Kubelet versions that never come up `Ready` (a bad release), on any node.
    pub bad_versions: Arc<Mutex<BTreeSet<String>>>,
    /// Each node's `spec.unschedulable`, every time it changed: (node, unschedulable), in order.
    pub cordons: Arc<Mutex<Vec<(String, bool)>>>,
    /// Each node's kubelet version, every time it changed: (node, version), in order.
    pub versions: Arc<Mutex<Vec<(String, String)>>>,
    /// Both in one order: `w-1 cordoned`, `w-1 kubelet 1.29.3`, `w-1 uncordoned`.
    pub log: Arc<Mutex<Vec<String>>>,
}

impl KubeletKnobs {
    pub fn set_ready(&self, node: &str, ready: bool) {
        let mut set = self.not_ready.lock().unwrap();
        if ready {
            set.remove(node);
        } else {
            set.insert(node.to_string());
        }
    }

    /// Makes kubelet `version` a bad release: a node that runs it is not `Ready`.
    pub fn bad_version(&self, version: &str) {
        self.bad_versions.lock().unwrap().insert(version.to_string());
    }

    pub fn cordons(&self) -> Vec<(String, bool)> {
        self.cordons.lock().unwrap().clone()
    }

    pub fn versions(&self) -> Vec<(String, String)> {
        self.versions.lock().unwrap().clone()
    }

    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

/// The states of a host that runs no OS, so no kubelet.
const WITHOUT_OS: [&str; 4] = ["available", "deprovisioning", "powering off before delete", "deleting"];

/// The kubelets, as they run.
#[derive(Default)]
struct Kubelets {
    schedulable: BTreeMap<String, bool>,
    registered: BTreeSet<String>,
    /// Each registered node's kubelet version.
    running: BTreeMap<String, String>,
    /// Each role's kubelet in `Software`, as last seen.
    software: BTreeMap<Role, String>,
}

impl Kubelets {
    fn run(&mut self, knobs: &KubeletKnobs, node: &str, version: &str) {
        // A node registered before its role's Software was written runs nothing yet: what it
        // runs is recorded once the Software is there (a busy machine writes it later).
        if self.running.insert(node.to_string(), version.to_string()).as_deref() != Some(version) && !version.is_empty()
        {
            knobs.versions.lock().unwrap().push((node.to_string(), version.to_string()));
            knobs.log.lock().unwrap().push(format!("{node} kubelet {version}"));
        }
    }

    /// Records a node's cordon or uncordon the first time it is seen.
    fn schedule(&mut self, knobs: &KubeletKnobs, node: &Node) {
        let name = node.metadata.name.clone().unwrap_or_default();
        let cordoned = node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false);
        if self.schedulable.insert(name.clone(), cordoned) != Some(cordoned) {
            let what = if cordoned { "cordoned" } else { "uncordoned" };
            knobs.log.lock().unwrap().push(format!("{name} {what}"));
            knobs.cordons.lock().unwrap().push((name, cordoned));
        }
    }
}

pub(super) async fn kubelets(client: kube::Client, knobs: KubeletKnobs, shutdown: CancellationToken) {
    let provisionings: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), NAMESPACE, &bpa::provisioning_resource());
    let softwares: Api<DynamicObject> = Api::namespaced_with(client.clone(), NAMESPACE, &bpa::software_resource());
    let hosts: Api<BareMetalHost> = Api::namespaced(client.clone(), NAMESPACE);
    let jobs: Api<Job> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client);
    let mut k = Kubelets::default();
    loop {
        match provisionings.get_opt(SITE).await {
            Ok(Some(p)) => {
                let software = softwares.get_opt(&format!("{SITE}-software")).await.ok().flatten();
                let versions = software.map(|s| bpa::software_versions(&s.data)).unwrap_or_default();
                let kubelet_of = |role: Role| versions.get(&role).and_then(|v| v.get("kubelet")).cloned();
                let states: BTreeMap<String, String> = hosts
                    .list(&Default::default())
                    .await
                    .map(|l| {
                        let state = |h: BareMetalHost| h.status.map(|s| s.provisioning.state).unwrap_or_default();
                        l.items.into_iter().map(|h| (h.metadata.name.clone().unwrap_or_default(), state(h))).collect()
                    })
                    .unwrap_or_default();
                let listed = bpa::provisioned_nodes(&p.data);
                k.registered.retain(|n| listed.contains_key(n));
                // The BPA installs a role's Software on every node of the role when it moves.
                for role in [Role::Master, Role::Worker] {
                    let Some(now) = kubelet_of(role) else { continue };
                    // (First seen counts: a kubelet registered before the Software was written runs
                    // what it lists once it is there.)
                    if k.software.insert(role, now.clone()).as_ref() != Some(&now) {
                        let of_role: Vec<String> = listed
                            .iter()
                            .filter(|(n, (r, _))| *r == role && k.registered.contains(*n))
                            .map(|(n, _)| n.clone())
                            .collect();
                        for name in of_role {
                            k.run(&knobs, &name, &now);
                        }
                    }
                }
                for (name, (role, _)) in listed {
                    // No host (deleted, its entry not yet out of the Provisioning), or a host with no
                    // OS: no kubelet runs there.
                    if states.get(&name).is_none_or(|s| WITHOUT_OS.contains(&s.as_str())) {
                        k.registered.remove(&name);
                        k.running.remove(&name);
                        continue;
                    }
                    let bad = k.running.get(&name).is_some_and(|v| knobs.bad_versions.lock().unwrap().contains(v));
                    let ready = !knobs.not_ready.lock().unwrap().contains(&name) && !bad;
                    let node = match nodes.get_opt(&name).await {
                        Ok(Some(node)) => node,
                        Ok(None) if k.registered.contains(&name) => continue,
                        Ok(None) => {
                            let body: Node = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
                            match nodes.create(&kube::api::PostParams::default(), &body).await {
                                Ok(node) => node,
                                Err(_) => continue,
                            }
                        }
                        Err(_) => continue,
                    };
                    if k.registered.insert(name.clone()) || !k.running.contains_key(&name) {
                        k.run(&knobs, &name, &kubelet_of(role).unwrap_or_default());
                    }
                    let kubelet = k.running.get(&name).cloned().unwrap_or_default();
                    let status = json!({"status": {
                        "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
                        "nodeInfo": {"kubeletVersion": format!("v{kubelet}")},
                    }});
                    let _ = nodes.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await;
                    k.schedule(&knobs, &node);
                }
                // An upgrade Job installs its version on its node alone (after the cordons are
                // seen: the node is cordoned before its Job is made).
                let upgrades = jobs.list(&ListParams::default().labels(marks::UPGRADE_LABEL)).await;
                for job in upgrades.map(|l| l.items).unwrap_or_default() {
                    if job.status.as_ref().and_then(|s| s.succeeded).unwrap_or(0) > 0 {
                        continue;
                    }
                    let labels = job.metadata.labels.clone().unwrap_or_default();
                    let annotations = job.metadata.annotations.clone().unwrap_or_default();
                    let (Some(node), Some(version)) =
                        (labels.get(marks::UPGRADE_LABEL), annotations.get(marks::UPGRADE_VERSION))
                    else {
                        continue;
                    };
                    if annotations.get(marks::UPGRADE_PACKAGE).map(String::as_str) == Some("kubelet") {
                        // Its node was cordoned before the Job was made, perhaps after the node
                        // was read above: read again, so that the cordon is recorded first.
                        if let Ok(Some(now)) = nodes.get_opt(node).await {
                            k.schedule(&knobs, &now);
                        }
                        k.run(&knobs, node, version);
                    }
                    let (name, ns) = (
                        job.metadata.name.clone().unwrap_or_default(),
                        job.metadata.namespace.clone().unwrap_or_default(),
                    );
                    let done = json!({"status": {"succeeded": 1}});
                    let _ = Api::<Job>::namespaced(jobs.clone().into_client(), &ns)
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&done))
                        .await;
                }
            }
            Ok(None) => {
                k.registered.clear();
                k.running.clear();
            }
            Err(_) => {}
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}
