//! Taking a node of the application cluster out of service around a patch, and seeing it back:
//! cordon (marked as landfall's, so an operator's cordon is never lifted by landfall), drain
//! through the Eviction API (which honours disruption budgets), readiness and the kubelet
//! version the `Node` reports, and uncordon.

use std::collections::BTreeMap;

use bus_schema::domain::Package;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, EvictParams, ListParams, Patch, PatchParams};
use serde_json::json;
use tokio::time::Instant;
use tracing::{debug, info};

use super::KubeSite;
use super::config::UnmanagedPods;
use super::error::kube_error;
use super::marks;
use crate::backend::{BackendError, Cordon};

/// Why a pod stays on a node being drained, if it does.
fn stays(pod: &Pod) -> bool {
    let owned_by_daemon_set =
        pod.metadata.owner_references.iter().flatten().any(|o| o.kind == "DaemonSet" && o.controller == Some(true));
    let mirror = pod.metadata.annotations.as_ref().is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"));
    owned_by_daemon_set || mirror
}

fn unmanaged(pod: &Pod) -> bool {
    !pod.metadata.owner_references.iter().flatten().any(|o| o.controller == Some(true))
}

fn key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// `Ready` and the kubelet's version, as the node reports them.
pub(super) fn readiness(node: &Node) -> (bool, String) {
    let status = node.status.as_ref();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True");
    let kubelet = status.and_then(|s| s.node_info.as_ref()).map(|i| i.kubelet_version.clone()).unwrap_or_default();
    (ready, kubelet)
}

/// A version as a kubelet reports it: `v1.29.2` for the catalog's `1.29.2`.
pub(super) fn kubelet_version(version: &str) -> String {
    if version.starts_with('v') { version.to_string() } else { format!("v{version}") }
}

impl KubeSite {
    async fn nodes(&self) -> Result<Api<Node>, BackendError> {
        Ok(Api::all(self.application_cluster().await?))
    }

    pub(super) async fn cordon_node(&self, name: &str) -> Result<Cordon, BackendError> {
        let nodes = self.nodes().await?;
        let Some(node) = nodes.get_opt(name).await.map_err(|e| kube_error(&format!("Node {name}"), e))? else {
            return Ok(Cordon::NotInCluster);
        };
        let ours = node.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(marks::CORDONED));
        let unschedulable = node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false);
        if unschedulable && !ours {
            info!(site = %self.cfg.site, node = name, "cordoned by someone else: left as it is");
            return Ok(Cordon::HeldByOther);
        }
        if !(unschedulable && ours) {
            let patch =
                json!({"metadata": {"annotations": {marks::CORDONED: "true"}}, "spec": {"unschedulable": true}});
            match nodes.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                // Gone since it was read: Cluster API replacing its machine deletes it.
                Err(kube::Error::Api(e)) if e.code == 404 => return Ok(Cordon::NotInCluster),
                done => _ = done.map_err(|e| kube_error(&format!("cordoning Node {name}"), e))?,
            }
            info!(site = %self.cfg.site, node = name, "cordoned");
        }
        Ok(Cordon::Done)
    }

    pub(super) async fn cordoned_by_landfall(&self, name: &str) -> Result<bool, BackendError> {
        let node = self.nodes().await?.get_opt(name).await.map_err(|e| kube_error(&format!("Node {name}"), e))?;
        Ok(node.is_some_and(|n| n.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(marks::CORDONED))))
    }

    pub(super) async fn uncordon_node(&self, name: &str) -> Result<bool, BackendError> {
        let nodes = self.nodes().await?;
        let Some(node) = nodes.get_opt(name).await.map_err(|e| kube_error(&format!("Node {name}"), e))? else {
            return Ok(false);
        };
        if !node.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(marks::CORDONED)) {
            return Ok(false);
        }
        let patch = json!({"metadata": {"annotations": {marks::CORDONED: null}}, "spec": {"unschedulable": null}});
        match nodes.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            // Gone since it was read: nothing is left to give back.
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(false),
            done => _ = done.map_err(|e| kube_error(&format!("uncordoning Node {name}"), e))?,
        }
        info!(site = %self.cfg.site, node = name, "uncordoned");
        Ok(true)
    }

    /// Evicts the node's pods until none is left but those that stay, or the time-out passes.
    /// A refused eviction (429: a disruption budget) is tried again at every look.
    pub(super) async fn drain_node(&self, name: &str) -> Result<Vec<String>, BackendError> {
        // The client's own retries would hold a refused eviction for minutes: each refusal is
        // handled here.
        let client = self.application_cluster_with(false).await?;
        let pods: Api<Pod> = Api::all(client.clone());
        let on_node = ListParams::default().fields(&format!("spec.nodeName={name}"));
        let deadline = Instant::now() + self.cfg.drain_timeout;
        let mut evicted = Vec::new();
        loop {
            let listed = pods.list(&on_node).await.map_err(|e| kube_error(&format!("pods on {name}"), e))?;
            let leaving: Vec<&Pod> = listed.items.iter().filter(|p| !stays(p)).collect();
            if leaving.is_empty() {
                info!(site = %self.cfg.site, node = name, evicted = evicted.len(), "drained");
                return Ok(evicted);
            }
            let bare: Vec<String> = leaving.iter().filter(|p| unmanaged(p)).map(|p| key(p)).collect();
            if !bare.is_empty() && self.cfg.unmanaged_pods == UnmanagedPods::Refuse {
                return Err(BackendError::permanent_reason(format!(
                    "draining {name}: pods no controller would bring back would be lost: {} (the gateway's \
                     --drain-unmanaged-pods evict allows it)",
                    bare.join(", ")
                )));
            }
            let mut refused = BTreeMap::new();
            for pod in leaving.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
                let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
                let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
                match Api::<Pod>::namespaced(client.clone(), ns).evict(pod_name, &EvictParams::default()).await {
                    Ok(_) => {
                        debug!(site = %self.cfg.site, node = name, pod = %key(pod), "evicted");
                        evicted.push(key(pod));
                    }
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(kube::Error::Api(s)) if s.code == 429 => {
                        let causes: Vec<String> =
                            s.details.iter().flat_map(|d| d.causes.iter()).map(|c| c.message.clone()).collect();
                        refused.insert(key(pod), format!("{} {}", s.message, causes.join("; ")).trim().to_string());
                    }
                    Err(e) => return Err(kube_error(&format!("evicting {} from {name}", key(pod)), e)),
                }
            }
            if Instant::now() >= deadline {
                let waiting: Vec<String> = leaving
                    .iter()
                    .map(|p| match refused.get(&key(p)) {
                        Some(why) => format!("{}: {why}", key(p)),
                        None => format!("{}: still terminating", key(p)),
                    })
                    .collect();
                return Err(BackendError::permanent_reason(format!(
                    "draining {name}: not done within {:?}: {}",
                    self.cfg.drain_timeout,
                    waiting.join("; ")
                )));
            }
            tokio::time::sleep(self.cfg.poll).await;
        }
    }

    pub(super) async fn not_ready_nodes(&self, names: &[String]) -> Result<Vec<String>, BackendError> {
        let nodes = self.nodes().await?;
        let mut out = Vec::new();
        for name in names {
            let node = nodes.get_opt(name).await.map_err(|e| kube_error(&format!("Node {name}"), e))?;
            if !node.as_ref().is_some_and(|n| readiness(n).0) {
                out.push(name.clone());
            }
        }
        Ok(out)
    }

    /// Waits for the node to be `Ready`, reporting the kubelet version among `installed` if
    /// there is one.
    pub(super) async fn observe_node(&self, name: &str, installed: &[Package]) -> Result<(), BackendError> {
        let nodes = self.nodes().await?;
        let want = installed.iter().find(|p| p.name.as_str() == "kubelet").map(|p| kubelet_version(p.version.as_str()));
        let deadline = Instant::now() + self.cfg.ready_timeout;
        loop {
            let node = nodes.get_opt(name).await.map_err(|e| kube_error(&format!("Node {name}"), e))?;
            let seen = node.as_ref().map(readiness);
            if let Some((true, kubelet)) = &seen
                && want.as_ref().is_none_or(|w| w == kubelet)
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let shown = match seen {
                    None => "not registered".to_string(),
                    Some((ready, kubelet)) => {
                        format!("Ready {}, kubelet {}", if ready { "True" } else { "not True" }, kubelet)
                    }
                };
                let wanted = want.map(|w| format!(" at kubelet {w}")).unwrap_or_default();
                return Err(BackendError::permanent_reason(format!(
                    "{name} was not seen Ready{wanted} within {:?}: {shown}",
                    self.cfg.ready_timeout
                )));
            }
            tokio::time::sleep(self.cfg.poll).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(owner: Option<(&str, bool)>, mirror: bool) -> Pod {
        let mut p = json!({"metadata": {"name": "p", "namespace": "ns"}});
        if let Some((kind, controller)) = owner {
            p["metadata"]["ownerReferences"] =
                json!([{"apiVersion": "apps/v1", "kind": kind, "name": "o", "uid": "u", "controller": controller}]);
        }
        if mirror {
            p["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "x"});
        }
        serde_json::from_value(p).unwrap()
    }

    #[test]
    fn daemon_set_and_static_pods_stay_and_bare_ones_are_unmanaged() {
        assert!(stays(&pod(Some(("DaemonSet", true)), false)));
        assert!(stays(&pod(None, true)));
        assert!(!stays(&pod(Some(("ReplicaSet", true)), false)));
        assert!(unmanaged(&pod(None, false)));
        assert!(unmanaged(&pod(Some(("ReplicaSet", false)), false)), "an owner that is not its controller");
        assert!(!unmanaged(&pod(Some(("ReplicaSet", true)), false)));
        assert_eq!(key(&pod(None, false)), "ns/p");
    }

    #[test]
    fn a_catalog_version_is_compared_as_the_kubelet_reports_it() {
        assert_eq!(kubelet_version("1.29.2"), "v1.29.2");
        assert_eq!(kubelet_version("v1.29.2"), "v1.29.2");
    }
}
