//! Patching a node of a site Cluster API built: its Kubernetes version or os-image is its node
//! set's (the control plane's, or its worker group's), so the set is changed, once, and Cluster
//! API replaces the set's machines; the node is patched when a machine up to date stands on its
//! host with the Node Ready at the version.
//!
//! - a kubelet version: one write of the set's `version`;
//! - an os-image: a new `Metal3MachineTemplate` (the current one with the new image, named by the
//!   hash of its content as [`crate::capi::render`] names it) and one write of the set's
//!   reference to it.
//!
//! A worker group rolls with the rollout's `max_unavailable` as its `maxUnavailable`. The node's
//! machine is marked `cluster.x-k8s.io/delete-machine`, so Cluster API replaces it before the
//! set's others, in the order the rollout patches its nodes.

use std::time::Duration;

use bus_schema::domain::{Package, Role};
use bus_schema::pb;
use futures::StreamExt;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tracing::info;

use super::KubeSite;
use super::capi::Served;
use super::drain::{kubelet_version, readiness};
use super::error::kube_error;
use super::marks::FIELD_MANAGER;
use super::metal3::BareMetalHost;
use super::ownership::intent_of;
use crate::backend::{BackendError, ImageSpec, PatchOutcome, PatchRequest, ProvisioningState};
use crate::capi::{
    CLUSTER_GROUP, CONTROL_PLANE_GROUP, INFRASTRUCTURE_GROUP, control_plane_name, template_base, template_name,
};

/// The annotation Cluster API deletes a set's machines by first.
pub const DELETE_MACHINE: &str = "cluster.x-k8s.io/delete-machine";
const CONTROL_PLANE_NAME: &str = "cluster.x-k8s.io/control-plane-name";
const DEPLOYMENT_NAME: &str = "cluster.x-k8s.io/deployment-name";

/// The node set a machine belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum NodeSet {
    ControlPlane(String),
    Workers(String),
}

impl NodeSet {
    pub(super) fn of(machine: &DynamicObject) -> Option<Self> {
        let labels = machine.labels();
        match (labels.get(CONTROL_PLANE_NAME), labels.get(DEPLOYMENT_NAME)) {
            (Some(cp), _) => Some(NodeSet::ControlPlane(cp.clone())),
            (None, Some(md)) => Some(NodeSet::Workers(md.clone())),
            (None, None) => None,
        }
    }

    pub(super) fn name(&self) -> &str {
        match self {
            NodeSet::ControlPlane(n) | NodeSet::Workers(n) => n,
        }
    }

    /// (group, kind) of the set's object.
    pub(super) fn kind(&self) -> (&'static str, &'static str) {
        match self {
            NodeSet::ControlPlane(_) => (CONTROL_PLANE_GROUP, "KubeadmControlPlane"),
            NodeSet::Workers(_) => (CLUSTER_GROUP, "MachineDeployment"),
        }
    }

    /// Where the set's machines' spec is: their version and infrastructure template.
    fn machine_spec(&self) -> &'static str {
        match self {
            NodeSet::ControlPlane(_) => "/spec/machineTemplate/spec",
            NodeSet::Workers(_) => "/spec/template/spec",
        }
    }

    fn version_pointer(&self) -> &'static str {
        match self {
            NodeSet::ControlPlane(_) => "/spec/version",
            NodeSet::Workers(_) => "/spec/template/spec/version",
        }
    }
}

/// Whether Cluster API handles this package's patch: the Kubernetes version or the os-image.
pub(super) fn through_cluster_api(package: &Package) -> bool {
    package.kind == pb::PackageKind::OsImage
        || (package.kind == pb::PackageKind::Binary && package.name.as_str() == "kubelet")
}

impl KubeSite {
    pub(super) fn capi_api(&self, served: &Served, group: &str, kind: &str) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.client(),
            &self.cfg.namespace,
            &served.resources[&(group.to_string(), kind.to_string())],
        )
    }

    /// The Machine CAPM3 provisioned `host` for, when the host was claimed through Cluster API.
    pub(super) async fn machine_of(
        &self,
        served: &Served,
        host: &BareMetalHost,
    ) -> Result<Option<DynamicObject>, BackendError> {
        let Some(claim) = host.spec.consumer_ref.as_ref().filter(|c| c.kind == "Metal3Machine") else {
            return Ok(None);
        };
        let machines = self
            .capi_api(served, CLUSTER_GROUP, "Machine")
            .list(&ListParams::default())
            .await
            .map_err(|e| kube_error("listing Machines", e))?;
        Ok(machines
            .items
            .into_iter()
            .find(|m| m.data.pointer("/spec/infrastructureRef/name").and_then(Value::as_str) == Some(&claim.name)))
    }

    /// Whether Cluster API patches `package` on `host`: the package is the Kubernetes version
    /// or the os-image, and the host was claimed through Cluster API (a `Metal3Machine` is its
    /// consumer), or is between two machines at a site Cluster API built (its `Cluster` is
    /// there).
    pub(super) async fn patched_by_cluster_api(
        &self,
        host: &BareMetalHost,
        package: &Package,
    ) -> Result<bool, BackendError> {
        if !through_cluster_api(package) {
            return Ok(false);
        }
        if host.claimed_by_machine() {
            return Ok(true);
        }
        // A host of a Cluster API site is claimed whenever it runs an OS: one provisioned and
        // unclaimed is a BPA site's (asked without a discovery request).
        if host.state() == Some(ProvisioningState::Provisioned) {
            return Ok(false);
        }
        let served = self.capi_served().await?;
        if served.refusal().is_some() {
            return Ok(false);
        }
        let clusters = self.capi_api(&served, CLUSTER_GROUP, "Cluster");
        let cluster = clusters.get_opt(&self.cfg.cluster).await.map_err(|e| kube_error("reading the Cluster", e))?;
        Ok(cluster.is_some())
    }

    /// Whether a machine up to date for `package` stands on `host`, its Node Ready at the
    /// version: the os-image provisioned on the host, or the machine at the Kubernetes version.
    pub(super) async fn capi_runs(&self, host: &BareMetalHost, package: &Package) -> Result<bool, BackendError> {
        let served = self.served().await?;
        let name = host.name_any();
        let Some(machine) = self.machine_of(&served, host).await? else { return Ok(false) };
        let at = match package.kind {
            pb::PackageKind::OsImage => {
                let wanted = self.image_url(&ImageSpec::from_package(package).checksum);
                host.state() == Some(ProvisioningState::Provisioned)
                    && host.provisioned_image().is_some_and(|i| i.url == wanted)
            }
            _ => {
                machine.data.pointer("/spec/version").and_then(Value::as_str)
                    == Some(&kubelet_version(package.version.as_str()))
            }
        };
        if !at || machine.data.pointer("/status/nodeRef/name").and_then(Value::as_str) != Some(name.as_str()) {
            return Ok(false);
        }
        let want = (package.name.as_str() == "kubelet").then(|| kubelet_version(package.version.as_str()));
        Ok(self.not_ready_at(&name, want.as_deref()).await?.is_none())
    }

    /// Why Node `name` is not Ready (at kubelet `version`, when given), if it is not.
    async fn not_ready_at(&self, name: &str, version: Option<&str>) -> Result<Option<String>, BackendError> {
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.application_cluster().await?);
        let node = nodes.get_opt(name).await.map_err(|e| kube_error(&format!("Node {name}"), e))?;
        let Some(node) = node else { return Ok(Some("not registered".into())) };
        Ok(match (readiness(&node), version) {
            ((false, _), _) => Some("not Ready".into()),
            ((true, kubelet), Some(v)) if kubelet != v => Some(format!("Ready at kubelet {kubelet}, not {v}")),
            _ => None,
        })
    }

    /// Patches a node whose host Cluster API claimed (see the module's comment).
    pub(super) async fn patch_capi(
        &self,
        req: &PatchRequest,
        host: &BareMetalHost,
    ) -> Result<PatchOutcome, BackendError> {
        let name = req.node.name.as_str();
        let package = &req.package;
        let served = self.served().await?;
        // A host between two machines (Cluster API replacing its machine already) belongs to the
        // set of its role, as landfall named the sets.
        let machine = self.machine_of(&served, host).await?;
        let set = match &machine {
            Some(m) => NodeSet::of(m),
            None => Some(match req.node.role {
                Role::Master => NodeSet::ControlPlane(control_plane_name(&self.cfg.cluster)),
                Role::Worker => NodeSet::Workers(format!("{}-workers", self.cfg.cluster)),
            }),
        };
        let Some(set) = set else {
            return Err(BackendError::permanent_reason(format!(
                "the machine on host {name} belongs to no control plane or MachineDeployment"
            )));
        };
        // What the node ran, as landfall recorded it when it came up or was last patched (Cluster
        // API may have replaced its machine already); a Kubernetes version not recorded is the
        // machine's.
        let from = Self::version_on(host, package.name.as_str()).or_else(|| match (package.kind, &machine) {
            (pb::PackageKind::Binary, Some(m)) => {
                m.data.pointer("/spec/version").and_then(Value::as_str).map(|s| s.trim_start_matches('v').to_string())
            }
            _ => None,
        });
        if !self.capi_runs(host, package).await? {
            self.change_set(&served, &set, req).await?;
            if let Some(machine) = &machine {
                self.mark_machine(&served, machine).await?;
            }
            let progress = req.progress.clone().unwrap_or_else(|| mpsc::unbounded_channel().0);
            self.until_replaced(name, package, &progress).await?;
        }
        self.record_versions(name, [(package.name.as_str(), package.version.as_str())]).await?;
        Ok(PatchOutcome { from_version: from, changed: true })
    }

    /// Writes `req`'s package into the node set, once: its version, or a new template with the
    /// image. A worker group rolls with the rollout's `max_unavailable`.
    async fn change_set(&self, served: &Served, set: &NodeSet, req: &PatchRequest) -> Result<(), BackendError> {
        let (group, kind) = set.kind();
        let api = self.capi_api(served, group, kind);
        let live = api.get(set.name()).await.map_err(|e| kube_error(&format!("{kind} {}", set.name()), e))?;
        let mut intent = intent_of(&live, FIELD_MANAGER);
        let before = intent.clone();
        let package = &req.package;
        // A surge claims a free host before a machine goes; landfall enrolls no spare host yet,
        // so a set that surges would wait for one until the time-out: refused now, saying so.
        let surge = live.data.pointer("/spec/rollout/strategy/rollingUpdate/maxSurge").and_then(Value::as_i64);
        if surge.unwrap_or(0) > 0 && !self.free_host_for(req.node.role).await? {
            return Err(BackendError::permanent_reason(format!(
                "{kind} {} rolls with maxSurge {}: its new machine needs a free host labelled for its role, and the \
                 site has none (landfall does not enroll spare hosts yet): roll with maxSurge 0",
                set.name(),
                surge.unwrap_or(0)
            )));
        }
        match package.kind {
            pb::PackageKind::OsImage => {
                let reference = format!("{}/infrastructureRef/name", set.machine_spec());
                let current = live.data.pointer(&reference).and_then(Value::as_str).unwrap_or_default().to_string();
                let template = self.template_with_image(served, &current, package).await?;
                if let Some(r) = intent.pointer_mut(&reference) {
                    *r = json!(template);
                }
            }
            _ => {
                if let Some(version) = intent.pointer_mut(set.version_pointer()) {
                    *version = json!(kubelet_version(package.version.as_str()));
                }
            }
        }
        if let NodeSet::Workers(_) = set {
            intent["spec"]["rollout"]["strategy"]["rollingUpdate"]["maxUnavailable"] =
                json!(req.max_unavailable.max(1));
        }
        if intent != before {
            let params = PatchParams::apply(FIELD_MANAGER).force();
            api.patch(set.name(), &params, &Patch::Apply(&intent))
                .await
                .map_err(|e| kube_error(&format!("applying {kind} {}", set.name()), e))?;
            info!(site = %self.cfg.site, set = set.name(), package = %package.reference().key(), "node set changed: Cluster API rolls its machines");
        }
        Ok(())
    }

    /// Whether an `available` host labelled for `role` is claimed by no machine.
    async fn free_host_for(&self, role: Role) -> Result<bool, BackendError> {
        let labelled = ListParams::default().labels(&format!("{}={}", super::marks::ROLE_LABEL, role.as_str()));
        let hosts = self.hosts.list(&labelled).await.map_err(|e| kube_error("listing BareMetalHosts", e))?;
        Ok(hosts.items.iter().any(|h| !h.claimed_by_machine() && h.state() == Some(ProvisioningState::Available)))
    }

    /// The template `current` with `package`'s image, applied under the name its content gives;
    /// its name.
    async fn template_with_image(
        &self,
        served: &Served,
        current: &str,
        package: &Package,
    ) -> Result<String, BackendError> {
        let api = self.capi_api(served, INFRASTRUCTURE_GROUP, "Metal3MachineTemplate");
        let live = api.get(current).await.map_err(|e| kube_error(&format!("Metal3MachineTemplate {current}"), e))?;
        let mut intent = intent_of(&live, FIELD_MANAGER);
        let image = &mut intent["spec"]["template"]["spec"]["image"];
        image["url"] = json!(self.image_url(package.sha256.as_str()));
        image["checksum"] = json!(package.sha256.to_string());
        let name = template_name(template_base(current), &intent["spec"]);
        if name != current {
            intent["metadata"]["name"] = json!(name);
            let params = PatchParams::apply(FIELD_MANAGER).force();
            api.patch(&name, &params, &Patch::Apply(&intent))
                .await
                .map_err(|e| kube_error(&format!("applying Metal3MachineTemplate {name}"), e))?;
        }
        Ok(name)
    }

    /// Marks `machine` `cluster.x-k8s.io/delete-machine`: Cluster API deletes it before its
    /// set's others (a machine marked or being deleted already is left as it is).
    pub(super) async fn mark_machine(&self, served: &Served, machine: &DynamicObject) -> Result<(), BackendError> {
        if machine.annotations().contains_key(DELETE_MACHINE) || machine.metadata.deletion_timestamp.is_some() {
            return Ok(());
        }
        let api = self.capi_api(served, CLUSTER_GROUP, "Machine");
        let body = json!({"metadata": {"annotations": {DELETE_MACHINE: "landfall"}}});
        let params = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
        api.patch(&machine.name_any(), &params, &Patch::Merge(&body))
            .await
            .map_err(|e| kube_error(&format!("marking Machine {}", machine.name_any()), e))?;
        Ok(())
    }

    /// Polls host `name` until `done` says so (given the host, `None` once it is gone), relaying
    /// each state the host passes on `progress` from a watch (Cluster API's machines pass them
    /// quickly).
    ///
    /// # Errors
    /// `HostFailed` when Metal3 fails the host; `Permanent` with `late`'s words (given the host
    /// as last seen) when the provisioning time-out passes; what `done` returns.
    pub(super) async fn until_host<F, Fut>(
        &self,
        name: &str,
        progress: &mpsc::UnboundedSender<ProvisioningState>,
        done: F,
        late: impl Fn(Option<&BareMetalHost>) -> String,
    ) -> Result<(), BackendError>
    where
        F: Fn(Option<BareMetalHost>) -> Fut,
        Fut: Future<Output = Result<bool, BackendError>>,
    {
        let relay = async {
            let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
            let mut updates = watcher(self.hosts.clone(), config).default_backoff().applied_objects().boxed();
            let mut last = None;
            while let Some(next) = updates.next().await {
                let Ok(host) = next else { continue };
                if let Some(s) = host.state().filter(|s| Some(*s) != last) {
                    last = Some(s);
                    let _ = progress.send(s);
                }
            }
            std::future::pending::<()>().await
        };
        let polled = async {
            let deadline = tokio::time::Instant::now() + self.cfg.provision_timeout;
            loop {
                let host = self.host(name).await?;
                if let Some((error_type, message)) = host.as_ref().and_then(BareMetalHost::error) {
                    return Err(BackendError::HostFailed {
                        host: name.to_string(),
                        error_type: error_type.to_string(),
                        message: message.to_string(),
                    });
                }
                let said_late = late(host.as_ref());
                if done(host).await? {
                    return Ok(());
                }
                if tokio::time::Instant::now() >= deadline {
                    return Err(BackendError::permanent_reason(format!(
                        "{said_late} within {:?}",
                        self.cfg.provision_timeout
                    )));
                }
                tokio::time::sleep(self.cfg.poll.min(Duration::from_secs(2))).await;
            }
        };
        tokio::select! {
            result = polled => result,
            () = relay => Ok(()),
        }
    }

    /// Waits until a machine up to date for `package` stands on host `name` with its Node Ready,
    /// sending each state the host passes on `progress`.
    ///
    /// # Errors
    /// `HostFailed` when Metal3 fails the host; `Permanent` when the host is gone, or when the
    /// provisioning time-out passes, with what the host showed.
    async fn until_replaced(
        &self,
        name: &str,
        package: &Package,
        progress: &mpsc::UnboundedSender<ProvisioningState>,
    ) -> Result<(), BackendError> {
        let done = async |host: Option<BareMetalHost>| match host {
            None => Err(BackendError::permanent_reason(format!("host {name} is gone"))),
            Some(host) => self.capi_runs(&host, package).await,
        };
        let late = |host: Option<&BareMetalHost>| {
            let state = host.and_then(BareMetalHost::state).map_or("unknown".to_string(), |s| s.to_string());
            let claimed = match host.and_then(|h| h.spec.consumer_ref.as_ref()) {
                Some(c) => format!("claimed by {} {}", c.kind, c.name),
                None => "claimed by no machine".to_string(),
            };
            format!(
                "Cluster API did not bring a machine at {} onto host {name} (host {state}, {claimed})",
                package.reference().key()
            )
        };
        self.until_host(name, progress, done, late).await
    }
}
