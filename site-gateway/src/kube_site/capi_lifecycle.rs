//! A node leaving a site Cluster API built, and the site taken down, through Cluster API: the
//! machines hold the hosts, so they go first.
//!
//! - A node removed: its machine marked `cluster.x-k8s.io/delete-machine`, its host no longer
//!   labelled for its role (so no machine claims it again), and its node set sized to the hosts
//!   still labelled for it: Cluster API deletes that machine, and CAPM3 deprovisions and frees
//!   the host. Sizing the set from the labels makes the step idempotent: done again, it writes
//!   the same count.
//! - A node reprovisioned: its machine deleted; its set makes a new one, which claims the host
//!   again once it is free.
//! - A site decommissioned: its `Cluster` deleted and waited for until Cluster API has taken it
//!   down (machines, control plane, deployments), then the objects landfall rendered for it.

use std::time::Duration;

use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::json;
use tokio::sync::mpsc;
use tracing::info;

use super::KubeSite;
use super::capi::Served;
use super::capi_patch::NodeSet;
use super::error::kube_error;
use super::marks::{self, FIELD_MANAGER};
use super::ownership::intent_of;
use crate::backend::{BackendError, ProvisioningState};
use crate::capi::{BOOTSTRAP_GROUP, CLUSTER_GROUP, CONTROL_PLANE_GROUP, INFRASTRUCTURE_GROUP, SITE_LABEL};

/// What landfall renders for a cluster besides the `Cluster`, deleted after it.
const RENDERED: [(&str, &str); 6] = [
    (CONTROL_PLANE_GROUP, "KubeadmControlPlane"),
    (CLUSTER_GROUP, "MachineDeployment"),
    (BOOTSTRAP_GROUP, "KubeadmConfigTemplate"),
    (INFRASTRUCTURE_GROUP, "Metal3MachineTemplate"),
    (INFRASTRUCTURE_GROUP, "Metal3DataTemplate"),
    (INFRASTRUCTURE_GROUP, "Metal3Cluster"),
];

impl KubeSite {
    /// Takes node `name` away through Cluster API when a machine holds its host (see the
    /// module's comment); `false` when none does.
    pub(super) async fn release_from_capi(
        &self,
        name: &str,
        leaving: bool,
        progress: &mpsc::UnboundedSender<ProvisioningState>,
    ) -> Result<bool, BackendError> {
        let Some(host) = self.host(name).await? else { return Ok(false) };
        if !host.claimed_by_machine() {
            return Ok(false);
        }
        let served = self.served().await?;
        let Some(machine) = self.machine_of(&served, &host).await? else { return Ok(false) };
        let machines = self.capi_api(&served, CLUSTER_GROUP, "Machine");
        let machine_name = machine.name_any();
        if leaving {
            let Some(set) = NodeSet::of(&machine) else {
                return Err(BackendError::permanent_reason(format!(
                    "the machine on host {name} ({machine_name}) belongs to no control plane or MachineDeployment"
                )));
            };
            let role = host.labels().get(marks::ROLE_LABEL).cloned().unwrap_or_default();
            let size = self.hosts_for(&role, name).await?;
            if matches!(set, NodeSet::ControlPlane(_)) && size % 2 == 0 {
                return Err(BackendError::permanent_reason(format!(
                    "removing master {name} would leave {size} masters, and a Cluster API control plane keeps an odd \
                     number (etcd's quorum): add a master first, or remove two"
                )));
            }
            self.mark_machine(&served, &machine).await?;
            let unlabel = json!({"metadata": {"labels": {marks::ROLE_LABEL: null}}});
            let params = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
            self.hosts
                .patch(name, &params, &Patch::Merge(&unlabel))
                .await
                .map_err(|e| kube_error(&format!("BareMetalHost {name}"), e))?;
            self.resize(&served, &set, size).await?;
            info!(site = %self.cfg.site, host = name, machine = %machine_name, set = set.name(), replicas = size, "node leaving through Cluster API");
        } else if machine.metadata.deletion_timestamp.is_none() {
            machines
                .delete(&machine_name, &DeleteParams::default())
                .await
                .map_err(|e| kube_error(&format!("deleting Machine {machine_name}"), e))?;
            info!(site = %self.cfg.site, host = name, machine = %machine_name, "machine deleted: its set makes a new one");
        }
        self.until_machine_gone(name, &machines, &machine_name, progress).await?;
        Ok(true)
    }

    /// How many hosts are labelled for `role`, leaving `leaving` aside: the size of its set.
    async fn hosts_for(&self, role: &str, leaving: &str) -> Result<usize, BackendError> {
        let labelled = ListParams::default().labels(&format!("{}={role}", marks::ROLE_LABEL));
        let hosts = self.hosts.list(&labelled).await.map_err(|e| kube_error("listing BareMetalHosts", e))?;
        Ok(hosts.items.iter().filter(|h| h.name_any() != leaving && h.metadata.deletion_timestamp.is_none()).count())
    }

    /// Sets the node set's `replicas` to `size`.
    async fn resize(&self, served: &Served, set: &NodeSet, size: usize) -> Result<(), BackendError> {
        let (group, kind) = set.kind();
        let api = self.capi_api(served, group, kind);
        let live = api.get(set.name()).await.map_err(|e| kube_error(&format!("{kind} {}", set.name()), e))?;
        let mut intent = intent_of(&live, FIELD_MANAGER);
        if intent["spec"]["replicas"] == json!(size) {
            return Ok(());
        }
        intent["spec"]["replicas"] = json!(size);
        api.patch(set.name(), &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&intent))
            .await
            .map_err(|e| kube_error(&format!("resizing {kind} {}", set.name()), e))?;
        Ok(())
    }

    /// Waits until Machine `machine` is gone (Cluster API deletes it once CAPM3 has deprovisioned
    /// its host), sending each state host `name` passes on `progress`.
    async fn until_machine_gone(
        &self,
        name: &str,
        machines: &Api<DynamicObject>,
        machine: &str,
        progress: &mpsc::UnboundedSender<ProvisioningState>,
    ) -> Result<(), BackendError> {
        let gone = async |_| {
            let found = machines.get_opt(machine).await.map_err(|e| kube_error(&format!("Machine {machine}"), e))?;
            Ok(found.is_none())
        };
        let late = |_: Option<&_>| format!("Cluster API did not delete Machine {machine} (host {name})");
        self.until_host(name, progress, gone, late).await
    }

    /// Deletes the site's `Cluster` and waits until Cluster API has taken it down, then deletes
    /// what else landfall rendered for it; what it deleted, as `kind/name`. Nothing at a site
    /// whose bootstrap cluster does not serve Cluster API.
    pub(super) async fn capi_take_down(&self) -> Result<Vec<String>, BackendError> {
        let served = self.capi_served().await?;
        if served.refusal().is_some() {
            return Ok(Vec::new());
        }
        let cluster = self.cfg.cluster.as_str();
        let clusters = self.capi_api(&served, CLUSTER_GROUP, "Cluster");
        let mut gone = Vec::new();
        if let Some(c) = clusters.get_opt(cluster).await.map_err(|e| kube_error("reading the Cluster", e))? {
            if c.metadata.deletion_timestamp.is_none() {
                clusters
                    .delete(cluster, &DeleteParams::default())
                    .await
                    .map_err(|e| kube_error(&format!("deleting Cluster {cluster}"), e))?;
                info!(site = %self.cfg.site, cluster, "Cluster deleted: Cluster API takes it down");
            }
            gone.push(format!("Cluster/{cluster}"));
            let deadline = tokio::time::Instant::now() + self.cfg.install_timeout;
            while clusters.get_opt(cluster).await.map_err(|e| kube_error("reading the Cluster", e))?.is_some() {
                if tokio::time::Instant::now() >= deadline {
                    return Err(BackendError::permanent_reason(format!(
                        "Cluster API did not take Cluster {cluster} down within {:?}",
                        self.cfg.install_timeout
                    )));
                }
                tokio::time::sleep(self.cfg.poll.min(Duration::from_secs(2))).await;
            }
        }
        let ours = ListParams::default().labels(&format!("{SITE_LABEL}={}", self.cfg.site));
        for (group, kind) in RENDERED {
            let api = self.capi_api(&served, group, kind);
            let listed = api.list(&ours).await.map_err(|e| kube_error(&format!("listing {kind}s"), e))?;
            for object in listed.items {
                let name = object.name_any();
                match api.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => gone.push(format!("{kind}/{name}")),
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => return Err(kube_error(&format!("deleting {kind} {name}"), e)),
                }
            }
        }
        gone.sort();
        Ok(gone)
    }
}
