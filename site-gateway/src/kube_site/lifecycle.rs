//! A node leaving its site and a site leaving landfall: the hosts the site has, a node's `Node`
//! deleted from the application cluster, its host deprovisioned through Metal3, the host and
//! what the site keeps for it deleted (`landfall node remove`, `landfall node reprovision`),
//! and the cluster's BPA resources and Secrets deleted (`landfall site decommission`).
//!
//! A host the gateway deletes itself is marked [`marks::RETIRED`] before the delete, so the host
//! watch (`hosts.rs`) lets it go without announcing a departure: the command that removes the
//! node says so already. The gateway's finalizer is taken off here too, so the deletion ends
//! even when no watch runs.
//!
//! Every step looks first and does only what is left: a second call finds nothing and says so.
//! Writes to a host or the `Provisioning` carry the `resourceVersion` read, so that a server-side
//! apply never creates again an object deleted meanwhile, nor undoes a change made meanwhile.

use std::fmt::Debug;
use std::path::Path;

use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tracing::info;

use super::bpa;
use super::cluster::write_atomically;
use super::error::kube_error;
use super::marks::{self, FIELD_MANAGER};
use super::metal3::BareMetalHost;
use super::ownership::intent_of;
use super::{KubeSite, KubeconfigSource};
use crate::backend::{BackendError, ProvisioningState};

/// How many times a write is tried when the object changed since it was read.
const WRITE_ATTEMPTS: usize = 5;

impl KubeSite {
    /// The hosts landfall manages in the site's namespace, sorted: those it provisioned
    /// ([`marks::NODE`]) and those it announced as arrived ([`marks::ANNOUNCED`]), which are
    /// nodes of the site's design too and carry its finalizer (left on a host of a site that is
    /// gone, the finalizer would hold the host's deletion for ever).
    pub(super) async fn managed_hosts(&self) -> Result<Vec<String>, BackendError> {
        let listed = self.hosts.list(&ListParams::default()).await.map_err(|e| kube_error("BareMetalHosts", e))?;
        let mut names: Vec<String> = listed.items.iter().filter(|h| managed(h)).map(ResourceExt::name_any).collect();
        names.sort();
        Ok(names)
    }

    /// Deletes the node's `Node` from the application cluster; `false` when there is none to
    /// delete (never joined, deleted before or being deleted, or no cluster at all).
    pub(super) async fn delete_cluster_node(&self, name: &str) -> Result<bool, BackendError> {
        if !self.has_cluster_kubeconfig().await? {
            return Ok(false);
        }
        // The client's own retries would hold a 429 for minutes: the job decides when to try
        // again.
        let nodes: Api<Node> = Api::all(self.application_cluster_with(false).await?);
        let deleted = delete_if(&nodes, "Node", name, |_| true).await?;
        if deleted {
            info!(site = %self.cfg.site, node = name, "Node deleted from the cluster");
        }
        Ok(deleted)
    }

    /// Takes the OS off host `name` and waits until it is `available` (`false`: no such host).
    ///
    /// The host's `automatedCleaningMode` becomes `cleaning` when the design names one;
    /// otherwise the host's own (Metal3 cleans the disks' metadata by default) decides how much
    /// is wiped.
    pub(super) async fn take_os_off(
        &self,
        name: &str,
        cleaning: bus_schema::pb::CleaningMode,
        progress: &mpsc::UnboundedSender<ProvisioningState>,
    ) -> Result<bool, BackendError> {
        let Some(host) = self.host(name).await? else { return Ok(false) };
        let state = host.state();
        if host.claimed_by_machine() {
            // A machine holds it (a reprovisioned node's new one): CAPM3 provisions it, and
            // landfall does not take the OS off under it.
            if let Some(s) = state {
                let _ = progress.send(s);
            }
            return Ok(true);
        }
        if host.metadata.deletion_timestamp.is_some() {
            // Metal3 deprovisions a host it deletes before it lets it go: nothing to ask of it.
            if let Some(s) = state {
                let _ = progress.send(s);
            }
            info!(site = %self.cfg.site, host = name, "being deleted: its deletion takes the OS off");
            return Ok(true);
        }
        match state {
            Some(ProvisioningState::Available) if !has_image(&host) => {
                let _ = progress.send(ProvisioningState::Available);
                return Ok(true);
            }
            Some(s @ (ProvisioningState::Unmanaged | ProvisioningState::ExternallyProvisioned)) => {
                return Err(BackendError::permanent_reason(format!(
                    "host {name} is {s}: Metal3 does not deprovision such a host"
                )));
            }
            _ => {}
        }
        self.deprovision(name, cleaning, progress).await?;
        info!(site = %self.cfg.site, host = name, "deprovisioned");
        Ok(true)
    }

    /// Deletes host `name`, the Secrets landfall wrote for it and its entry in the cluster's
    /// `Provisioning` and hosts.ini; `false` when none of them was there.
    ///
    /// The host goes first: Metal3 needs its BMC credentials to power it off before it lets it
    /// go, and an error on the way leaves the rest for the next attempt.
    pub(super) async fn forget(&self, name: &str) -> Result<bool, BackendError> {
        let host = self.retire(name).await?;
        let mut secrets = false;
        for secret in [marks::bmc_secret(name), marks::user_data_secret(name), marks::network_data_secret(name)] {
            // A Secret of that name that landfall did not write (the site's own) is not ours.
            secrets |= delete_if(&self.secrets, "Secret", &secret, landfalls).await?;
        }
        let listed = self.leave_provisioning(name).await?;
        let inventory = self.leave_hosts_ini(name).await?;
        let forgotten = host || secrets || listed || inventory;
        if forgotten {
            info!(site = %self.cfg.site, host = name, host_deleted = host, secrets, listed, inventory, "host forgotten");
        }
        Ok(forgotten)
    }

    /// Deletes the cluster's `Provisioning` and `Software`, its kubeconfig, every Secret landfall
    /// wrote in the namespace and hosts.ini; what it deleted, as `kind/name` (`File/<path>` for a
    /// file), sorted.
    ///
    /// The kubeconfig goes even when it is a file the BPA wrote: left there, it would make a
    /// later install of the site take a cluster that is gone for built. The container packages'
    /// inventories (`container-packages/` in the state directory) stay: what they name is gone
    /// with the cluster, and a later apply's pruning passes over what is not there.
    pub(super) async fn tear_down(&self) -> Result<Vec<String>, BackendError> {
        let cluster = &self.cfg.cluster;
        let software = format!("{cluster}-software");
        let mut gone = Vec::new();
        if delete_if(&self.provisionings, "Provisioning", cluster, |_| true).await? {
            gone.push(format!("Provisioning/{cluster}"));
        }
        if delete_if(&self.softwares, "Software", &software, |_| true).await? {
            gone.push(format!("Software/{software}"));
        }
        match &self.cfg.cluster_kubeconfig {
            KubeconfigSource::Secret(name) => {
                if delete_if(&self.secrets, "Secret", name, |_| true).await? {
                    gone.push(format!("Secret/{name}"));
                }
            }
            KubeconfigSource::File(path) => {
                if remove_file(path).await? {
                    gone.push(format!("File/{}", path.display()));
                }
            }
        }
        let ours = ListParams::default().labels(marks::PURPOSE_LABEL);
        let listed = self.secrets.list(&ours).await.map_err(|e| kube_error("Secrets", e))?;
        for secret in &listed.items {
            let name = secret.name_any();
            if delete_if(&self.secrets, "Secret", &name, landfalls).await? {
                gone.push(format!("Secret/{name}"));
            }
        }
        let hosts_ini = self.hosts_ini_path();
        if remove_file(&hosts_ini).await? {
            gone.push(format!("File/{}", hosts_ini.display()));
        }
        gone.sort();
        gone.dedup();
        info!(site = %self.cfg.site, %cluster, deleted = ?gone, "cluster torn down");
        Ok(gone)
    }

    /// Whether the application cluster's kubeconfig is there: a cluster to ask at all.
    async fn has_cluster_kubeconfig(&self) -> Result<bool, BackendError> {
        match &self.cfg.cluster_kubeconfig {
            KubeconfigSource::Secret(name) => {
                let secret = self.secrets.get_opt(name).await.map_err(|e| kube_error(&format!("Secret {name}"), e))?;
                Ok(secret.and_then(|s| s.data).is_some_and(|d| d.get("value").is_some_and(|v| !v.0.is_empty())))
            }
            KubeconfigSource::File(path) => match tokio::fs::metadata(path).await {
                Ok(meta) => Ok(meta.len() > 0),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
                Err(e) => Err(BackendError::permanent(path.display().to_string(), e)),
            },
        }
    }

    /// Marks host `name` retired, deletes it, takes the gateway's finalizer off and waits until
    /// it is gone; `false` when there was no host.
    async fn retire(&self, name: &str) -> Result<bool, BackendError> {
        let Some(host) = self.host(name).await? else { return Ok(false) };
        let Some(uid) = host.uid() else {
            return Err(BackendError::permanent_reason(format!("BareMetalHost {name} has no uid")));
        };
        // Marked before the delete: every event of the deletion carries the mark. A host someone
        // else is deleting already is marked too: the removal is landfall's to announce now.
        self.change_host(name, &uid, |intent| {
            if intent["metadata"]["annotations"].get(marks::RETIRED).is_some() {
                return false;
            }
            intent["metadata"]["annotations"][marks::RETIRED] = json!("true");
            true
        })
        .await?;
        if host.metadata.deletion_timestamp.is_none() {
            let params = DeleteParams { preconditions: Some(uid_is(&uid)), ..DeleteParams::default() };
            match self.hosts.delete(name, &params).await {
                // 409: the uid differs, another host of that name: the one marked is gone.
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => return Err(kube_error(&format!("deleting BareMetalHost {name}"), e)),
            }
            info!(site = %self.cfg.site, host = name, "BareMetalHost deleted");
        }
        self.change_host(name, &uid, |intent| {
            let Some(list) = intent["metadata"].get_mut("finalizers").and_then(Value::as_array_mut) else {
                return false;
            };
            let before = list.len();
            list.retain(|f| f != marks::FINALIZER);
            list.len() != before
        })
        .await?;
        self.await_host_gone(name, &uid).await?;
        Ok(true)
    }

    /// Applies `change` to what the gateway owns of host `name` (the one of `uid`), unless it
    /// changes nothing. A host gone, or another host of that name, is left alone.
    async fn change_host(
        &self,
        name: &str,
        uid: &str,
        change: impl Fn(&mut Value) -> bool,
    ) -> Result<(), BackendError> {
        let context = format!("BareMetalHost {name}");
        let mut attempt = 0;
        loop {
            attempt += 1;
            let Some(host) = self.host(name).await? else { return Ok(()) };
            if host.uid().as_deref() != Some(uid) {
                return Ok(());
            }
            let mut intent = intent_of(&host, FIELD_MANAGER);
            if !change(&mut intent) {
                return Ok(());
            }
            intent["metadata"]["resourceVersion"] = json!(host.resource_version());
            match self.hosts.patch(name, &PatchParams::apply(FIELD_MANAGER), &Patch::Apply(&intent)).await {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(s)) if (s.code == 409 || s.code == 404) && attempt < WRITE_ATTEMPTS => {}
                Err(e) => return Err(kube_error(&context, e)),
            }
        }
    }

    /// Waits until the host of `uid` is gone: Metal3 powers it off (and deprovisions it, if it
    /// still has its OS) before it takes its own finalizer off.
    async fn await_host_gone(&self, name: &str, uid: &str) -> Result<(), BackendError> {
        let gone = await_condition(self.hosts.clone(), name, conditions::is_deleted(uid));
        match tokio::time::timeout(self.cfg.provision_timeout, gone).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(BackendError::transient(format!("watching BareMetalHost {name} go"), e)),
            Err(_) => {
                let host = self.host(name).await?.filter(|h| h.uid().as_deref() == Some(uid));
                let Some(host) = host else { return Ok(()) };
                let state = host.state().map_or("unknown".to_string(), |s| s.to_string());
                Err(BackendError::permanent_reason(format!(
                    "BareMetalHost {name} was still there {:?} after its deletion (state {state}, finalizers {})",
                    self.cfg.provision_timeout,
                    host.finalizers().join(", ")
                )))
            }
        }
    }

    /// Takes node `name` out of the cluster's `Provisioning`; `false` when it was not listed.
    async fn leave_provisioning(&self, name: &str) -> Result<bool, BackendError> {
        let cluster = &self.cfg.cluster;
        let context = format!("Provisioning {cluster}");
        let mut attempt = 0;
        loop {
            attempt += 1;
            let found = self.provisionings.get_opt(cluster).await.map_err(|e| kube_error(&context, e))?;
            let Some(provisioning) = found else { return Ok(false) };
            if !bpa::provisioned_nodes(&provisioning.data).contains_key(name) {
                return Ok(false);
            }
            let mut intent = intent_of(&provisioning, FIELD_MANAGER);
            without_node(&mut intent, name);
            intent["metadata"]["resourceVersion"] = json!(provisioning.resource_version());
            match self.provisionings.patch(cluster, &PatchParams::apply(FIELD_MANAGER), &Patch::Apply(&intent)).await {
                Ok(written) if bpa::provisioned_nodes(&written.data).contains_key(name) => {
                    return Err(BackendError::permanent_reason(format!(
                        "{context} still lists {name}: its masters and workers are not landfall's to write"
                    )));
                }
                Ok(_) => {
                    info!(site = %self.cfg.site, %cluster, node = name, "taken out of the BPA provisioning");
                    return Ok(true);
                }
                Err(kube::Error::Api(s)) if s.code == 409 && attempt < WRITE_ATTEMPTS => {}
                Err(e) => return Err(kube_error(&context, e)),
            }
        }
    }

    /// Takes node `name` out of hosts.ini, as the `Provisioning` it is written with; `false`
    /// when it was not there.
    async fn leave_hosts_ini(&self, name: &str) -> Result<bool, BackendError> {
        let path = self.hosts_ini_path();
        let text = match tokio::fs::read_to_string(&path).await {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(BackendError::permanent(path.display().to_string(), e)),
        };
        let kept = hosts_ini_without(&text, name);
        if kept == text {
            return Ok(false);
        }
        write_atomically(&path, kept.as_bytes()).await?;
        Ok(true)
    }
}

/// Whether landfall manages the host: it provisioned it or announced it.
fn managed(host: &BareMetalHost) -> bool {
    let a = host.annotations();
    a.contains_key(marks::NODE) || a.contains_key(marks::ANNOUNCED)
}

fn has_image(host: &BareMetalHost) -> bool {
    host.spec.image.as_ref().is_some_and(|i| !i.url.is_empty())
}

/// Whether landfall wrote the Secret: it carries [`marks::PURPOSE_LABEL`].
fn landfalls(secret: &Secret) -> bool {
    secret.labels().contains_key(marks::PURPOSE_LABEL)
}

fn uid_is(uid: &str) -> Preconditions {
    Preconditions { uid: Some(uid.to_string()), resource_version: None }
}

/// Deletes `name` from `api` when it is there, not being deleted already, and `ours` holds of
/// it; whether it did. The delete names the uid read, so that an object created again under the
/// name meanwhile is not taken for it.
async fn delete_if<K>(api: &Api<K>, kind: &str, name: &str, ours: impl Fn(&K) -> bool) -> Result<bool, BackendError>
where
    K: Resource + Clone + Debug + DeserializeOwned,
{
    let context = format!("{kind} {name}");
    let Some(object) = api.get_opt(name).await.map_err(|e| kube_error(&context, e))? else { return Ok(false) };
    if object.meta().deletion_timestamp.is_some() || !ours(&object) {
        return Ok(false);
    }
    let params = DeleteParams { preconditions: object.meta().uid.as_deref().map(uid_is), ..DeleteParams::default() };
    match api.delete(name, &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(kube_error(&format!("deleting {context}"), e)),
    }
}

/// Removes the file at `path`; `false` when there was none.
async fn remove_file(path: &Path) -> Result<bool, BackendError> {
    match tokio::fs::remove_file(path).await {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(BackendError::permanent(format!("removing {}", path.display()), e)),
    }
}

/// Takes node `name` out of a `Provisioning`'s masters and workers (each entry a one-key map
/// from the node's name).
fn without_node(provisioning: &mut Value, name: &str) {
    for key in ["masters", "workers"] {
        let list = provisioning.get_mut("spec").and_then(|s| s.get_mut(key)).and_then(Value::as_array_mut);
        if let Some(list) = list {
            list.retain(|entry| !entry.as_object().is_some_and(|m| m.contains_key(name)))
        }
    }
}

/// `text`, a hosts.ini as [`bpa::hosts_ini`] writes it, without node `name`: its line in
/// `[all]` and in each group of nodes. Groups of groups (`[…:children]`) are left alone, so a
/// node named like a group does not take the group with it.
fn hosts_ini_without(text: &str, name: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut of_groups = false;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim();
        if trimmed.starts_with('[') {
            of_groups = trimmed.ends_with(":children]");
        } else if !of_groups && trimmed.split_whitespace().next() == Some(name) {
            continue;
        }
        out.push_str(line);
    }
    out
}

#[cfg(test)]
mod tests {
    use bus_schema::domain::Role;

    use super::*;
    use crate::kube_site::bpa::{ClusterIdentity, ClusterNode, hosts_ini, provisioned_nodes, provisioning};

    fn node(name: &str, role: Role, mac: &str, ip: &str) -> ClusterNode {
        ClusterNode { name: name.into(), role, mac: mac.into(), ip: ip.into() }
    }

    fn nodes() -> Vec<ClusterNode> {
        vec![
            node("m-1", Role::Master, "aa", "10.0.0.11"),
            node("w-1", Role::Worker, "bb", "10.0.0.21"),
            node("w-11", Role::Worker, "cc", "10.0.0.22"),
        ]
    }

    fn without(name: &str) -> Vec<ClusterNode> {
        nodes().into_iter().filter(|n| n.name != name).collect()
    }

    #[test]
    fn a_node_leaves_hosts_ini_as_if_it_had_never_been_written_with_it() {
        let text = hosts_ini(&nodes());
        for name in ["m-1", "w-1", "w-11"] {
            assert_eq!(hosts_ini_without(&text, name), hosts_ini(&without(name)), "{name}");
        }
        assert_eq!(hosts_ini_without(&text, "w-9"), text);
        let lone = hosts_ini(&[node("m-1", Role::Master, "aa", "10.0.0.11")]);
        assert_eq!(hosts_ini_without(&lone, "m-1"), hosts_ini(&[]));
    }

    #[test]
    fn a_node_named_like_a_group_leaves_the_groups_of_groups_alone() {
        let text = hosts_ini(&[node("kube-node", Role::Worker, "aa", "10.0.0.21")]);
        let left = hosts_ini_without(&text, "kube-node");
        assert_eq!(left, hosts_ini(&[]));
        assert!(left.ends_with("[k8s-cluster:children]\nkube-node\nkube-master\n"), "{left}");
    }

    #[test]
    fn a_node_leaves_the_provisioning_and_the_rest_stays_as_it_was() {
        let id = ClusterIdentity { owner: "landfall".into(), cluster: "edge-01".into() };
        let mut p = provisioning(&id, "site", &nodes(), &["emco".into()], "10.244.64.0/18");
        without_node(&mut p, "w-1");
        assert_eq!(p, provisioning(&id, "site", &without("w-1"), &["emco".into()], "10.244.64.0/18"));
        without_node(&mut p, "m-1");
        assert_eq!(provisioned_nodes(&p).keys().collect::<Vec<_>>(), ["w-11"]);
        assert_eq!(p["spec"]["masters"], json!([]));
    }

    #[test]
    fn odd_provisionings_are_left_as_they_are() {
        for odd in [json!(null), json!({"spec": "x"}), json!({"spec": {"masters": "m-1", "workers": [1, "w-1"]}})] {
            let mut p = odd.clone();
            without_node(&mut p, "w-1");
            assert_eq!(p, odd);
        }
    }

    #[test]
    fn hosts_it_provisioned_or_announced_are_landfalls() {
        let host = |annotations: Value| -> BareMetalHost {
            serde_json::from_value(json!({"apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost",
                                          "metadata": {"name": "h", "annotations": annotations}, "spec": {}}))
            .unwrap()
        };
        assert!(managed(&host(json!({marks::NODE: "h"}))));
        assert!(managed(&host(json!({marks::ANNOUNCED: "id"}))));
        assert!(!managed(&host(json!({"other": "x"}))));
    }
}
