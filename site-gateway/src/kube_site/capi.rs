//! A Cluster API site's objects in its bootstrap cluster: whether the cluster serves the Cluster
//! API and CAPM3 kinds landfall writes, at the version it writes them (discovery, before
//! anything is written), and the objects rendered from the design ([`crate::capi::render`])
//! server-side applied with the gateway's field manager, so landfall owns only the fields it
//! writes and Cluster API's controllers keep theirs.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use serde_json::Value;

use super::KubeSite;
use super::error::kube_error;
use super::marks::FIELD_MANAGER;
use bus_schema::domain::{NodeDesign, PackageRef, Role};
use tracing::{debug, info};

use crate::backend::{BackendError, CapiBuild, ClusterRequest, NodeInstall};
use crate::capi::{
    BOOTSTRAP_GROUP, CLUSTER_GROUP, CONTROL_PLANE_GROUP, INFRASTRUCTURE_GROUP, Observed, RenderSettings, VERSION,
    control_plane_name, kubernetes_version, observe, render,
};

/// The label Cluster API puts on every object of a cluster.
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";

/// Every kind a Cluster API site's gateway writes or reads, by API group.
pub const KINDS: [(&str, &[&str]); 4] = [
    (CLUSTER_GROUP, &["Cluster", "MachineDeployment", "MachineSet", "Machine"]),
    (CONTROL_PLANE_GROUP, &["KubeadmControlPlane"]),
    (BOOTSTRAP_GROUP, &["KubeadmConfig", "KubeadmConfigTemplate"]),
    (INFRASTRUCTURE_GROUP, &["Metal3Cluster", "Metal3Machine", "Metal3MachineTemplate", "Metal3DataTemplate"]),
];

/// How long a complete answer of discovery is kept.
const SERVED_FOR: std::time::Duration = std::time::Duration::from_secs(60);

/// What the bootstrap cluster serves of [`KINDS`] at [`VERSION`]: each kind's resource, and
/// what it lacks (`group/version Kind`).
#[derive(Debug, Clone, Default)]
pub struct Served {
    pub resources: BTreeMap<(String, String), ApiResource>,
    pub missing: Vec<String>,
}

impl Served {
    /// Why a site cannot be built here, when it cannot: what is missing, said as a person
    /// installing Cluster API needs it.
    pub fn refusal(&self) -> Option<String> {
        (!self.missing.is_empty()).then(|| {
            format!(
                "the site's bootstrap cluster does not serve {} (landfall writes Cluster API {} and CAPM3 {} objects at {VERSION}): \
                 install those providers there, or build the site with the BPA",
                self.missing.join(", "),
                crate::capi::CLUSTER_API_RELEASE,
                crate::capi::CAPM3_RELEASE,
            )
        })
    }
}

impl KubeSite {
    /// Asks the bootstrap cluster which of [`KINDS`] it serves at [`VERSION`] (one discovery
    /// request per API group). An answer with nothing missing is kept for [`SERVED_FOR`]: jobs
    /// ask for every host and every poll. One with something missing is never kept, so providers
    /// installed meanwhile are seen at once.
    ///
    /// # Errors
    /// When the cluster cannot be asked (a group it does not serve is not an error: it is
    /// missing).
    pub async fn capi_served(&self) -> Result<Served, BackendError> {
        if let Some((at, served)) = self.served.lock().unwrap_or_else(|e| e.into_inner()).as_ref()
            && at.elapsed() < SERVED_FOR
        {
            return Ok(served.clone());
        }
        let served = self.ask_served().await?;
        if served.missing.is_empty() {
            *self.served.lock().unwrap_or_else(|e| e.into_inner()) = Some((std::time::Instant::now(), served.clone()));
        }
        Ok(served)
    }

    async fn ask_served(&self) -> Result<Served, BackendError> {
        let mut served = Served::default();
        for (group, kinds) in KINDS {
            let group_version = format!("{group}/{VERSION}");
            let list = match self.client().list_api_group_resources(&group_version).await {
                Ok(list) => Some(list),
                Err(kube::Error::Api(status)) if status.code == 404 => None,
                Err(e) => return Err(kube_error(&format!("discovering {group_version}"), e)),
            };
            for kind in kinds {
                let found =
                    list.as_ref().and_then(|l| l.resources.iter().find(|r| r.kind == *kind && !r.name.contains('/')));
                match found {
                    Some(r) => {
                        let gvk = GroupVersionKind::gvk(group, VERSION, kind);
                        served.resources.insert(
                            (group.to_string(), kind.to_string()),
                            ApiResource::from_gvk_with_plural(&gvk, &r.name),
                        );
                    }
                    None => served.missing.push(format!("{group_version} {kind}")),
                }
            }
        }
        Ok(served)
    }

    /// What [`Self::capi_served`] found, when the bootstrap cluster serves every kind.
    ///
    /// # Errors
    /// `Permanent` with [`Served::refusal`] when it lacks some.
    pub(super) async fn served(&self) -> Result<Served, BackendError> {
        let served = self.capi_served().await?;
        match served.refusal() {
            Some(refusal) => Err(BackendError::permanent_reason(refusal)),
            None => Ok(served),
        }
    }

    /// Server-side applies `objects` (as [`crate::capi::render`] makes them) in their order,
    /// each in its own namespace with the gateway's field manager; the objects as the cluster
    /// stored them.
    ///
    /// # Errors
    /// `Permanent` with the kinds missing when the cluster does not serve them (nothing is
    /// written then), or with the API server's reason when it refuses an object.
    pub async fn apply_capi(&self, objects: &[Value]) -> Result<Vec<DynamicObject>, BackendError> {
        let served = self.served().await?;
        self.capi_write(&served, objects).await
    }

    pub(super) async fn capi_write(
        &self,
        served: &Served,
        objects: &[Value],
    ) -> Result<Vec<DynamicObject>, BackendError> {
        let mut applied = Vec::with_capacity(objects.len());
        for object in objects {
            let text = |field: &str| object.pointer(field).and_then(Value::as_str).unwrap_or_default().to_string();
            let (api_version, kind, name) = (text("/apiVersion"), text("/kind"), text("/metadata/name"));
            let group = api_version.split('/').next().unwrap_or_default().to_string();
            let Some(resource) = served.resources.get(&(group, kind.clone())) else {
                return Err(BackendError::permanent_reason(format!(
                    "{api_version} {kind} is not a kind landfall writes"
                )));
            };
            let namespace = text("/metadata/namespace");
            let api: Api<DynamicObject> = Api::namespaced_with(self.client(), &namespace, resource);
            let params = PatchParams::apply(FIELD_MANAGER).force();
            let stored = api
                .patch(&name, &params, &Patch::Apply(object))
                .await
                .map_err(|e| kube_error(&format!("applying {kind} {namespace}/{name}"), e))?;
            applied.push(stored);
        }
        Ok(applied)
    }

    /// The objects of cluster `cluster`'s build as the bootstrap cluster shows them (its
    /// `Cluster`, control plane, deployments, machines and the hosts), with the Nodes of the
    /// workload cluster once its kubeconfig can be read (none before).
    ///
    /// # Errors
    /// When the bootstrap cluster does not serve the Cluster API kinds, or cannot be read.
    pub async fn capi_observed(&self, cluster: &str) -> Result<Observed, BackendError> {
        let served = self.served().await?;
        self.capi_read(&served, cluster).await
    }

    /// [`Self::capi_observed`] with what discovery found already (a poll asks it once).
    async fn capi_read(&self, served: &Served, cluster: &str) -> Result<Observed, BackendError> {
        let api = |group: &str, kind: &str| self.capi_api(served, group, kind);
        let one = async |group: &str, kind: &str, name: &str| {
            let found =
                api(group, kind).get_opt(name).await.map_err(|e| kube_error(&format!("reading {kind} {name}"), e))?;
            Ok::<_, BackendError>(found.map(to_value))
        };
        let of_cluster = ListParams::default().labels(&format!("{CLUSTER_NAME_LABEL}={cluster}"));
        let all = async |group: &str, kind: &str| {
            let list =
                api(group, kind).list(&of_cluster).await.map_err(|e| kube_error(&format!("listing {kind}s"), e))?;
            Ok::<_, BackendError>(list.items.into_iter().map(to_value).collect::<Vec<_>>())
        };
        let hosts =
            self.hosts.list(&ListParams::default()).await.map_err(|e| kube_error("listing BareMetalHosts", e))?;
        // The workload cluster exists once Cluster API wrote its kubeconfig.
        let nodes = match self.application_cluster().await {
            Ok(client) => match Api::<Node>::all(client).list(&ListParams::default()).await {
                Ok(list) => list.items.into_iter().map(to_value).collect(),
                Err(e) => return Err(kube_error("listing the workload cluster's Nodes", e)),
            },
            Err(_) => Vec::new(),
        };
        Ok(Observed {
            cluster: one(CLUSTER_GROUP, "Cluster", cluster).await?,
            control_plane: one(CONTROL_PLANE_GROUP, "KubeadmControlPlane", &control_plane_name(cluster)).await?,
            deployments: all(CLUSTER_GROUP, "MachineDeployment").await?,
            machines: all(CLUSTER_GROUP, "Machine").await?,
            metal3_machines: all(INFRASTRUCTURE_GROUP, "Metal3Machine").await?,
            hosts: hosts.items.into_iter().map(to_value).collect(),
            nodes,
        })
    }
}

impl KubeSite {
    /// How this gateway's flags say the site's objects are written.
    pub fn render_settings(&self) -> RenderSettings {
        RenderSettings {
            namespace: self.cfg.namespace.clone(),
            cluster: self.cfg.cluster.clone(),
            image_base_url: self.cfg.image_base_url.clone(),
            pod_subnet: self.cfg.pod_subnet.clone(),
            ..RenderSettings::new(&self.cfg.site)
        }
    }

    /// Builds the cluster of `build`'s design through Cluster API: applies its objects and
    /// follows what Cluster API and Metal3 show until the build stands at its target (see
    /// [`crate::capi::observe`]), a host the request names fails, or the install time-out
    /// passes. One result per node of `req`: installed when its Node is Ready at the target
    /// version, failed with what Metal3 said, or (at the time-out) with what is still waiting.
    ///
    /// # Errors
    /// `Permanent` when the design does not render, the bootstrap cluster does not serve the
    /// kinds (before anything is written), or it refuses an object.
    pub(super) async fn build_capi(
        &self,
        req: &ClusterRequest,
        build: &CapiBuild,
    ) -> Result<Vec<NodeInstall>, BackendError> {
        let settings = self.render_settings();
        let catalog = |r: &PackageRef| build.packages.iter().find(|p| p.reference() == *r).cloned();
        let objects = render(&build.design, catalog, &settings)
            .map_err(|e| BackendError::permanent("rendering the site's Cluster API objects", e))?;
        let version = kubernetes_version(&build.design, Role::Master)
            .map_err(|e| BackendError::permanent("rendering the site's Cluster API objects", e))?;
        let served = self.served().await?;
        self.capi_write(&served, &objects).await?;
        info!(site = %self.cfg.site, cluster = %settings.cluster, objects = objects.len(), %version, "Cluster API objects applied");

        let deadline = tokio::time::Instant::now() + self.cfg.install_timeout;
        let mut said = Vec::new();
        loop {
            let progress = observe(&self.capi_read(&served, &settings.cluster).await?, &version);
            let settled = |n: &NodeDesign| {
                let name = n.name.as_str();
                progress.failed.contains_key(name) || progress.hosts.get(name).is_some_and(|h| h.ready)
            };
            let timed_out = tokio::time::Instant::now() >= deadline;
            if progress.done() || req.nodes.iter().all(settled) || timed_out {
                // The Kubernetes version each node came up at, as a BPA site's nodes record
                // their binaries.
                let kubelet = version.trim_start_matches('v');
                for n in req.nodes.iter().filter(|n| progress.hosts.get(n.name.as_str()).is_some_and(|h| h.ready)) {
                    self.record_versions(n.name.as_str(), [("kubelet", kubelet)]).await?;
                }
                let waiting = progress.waiting.join("; ");
                return Ok(req
                    .nodes
                    .iter()
                    .map(|n| {
                        let name = n.name.as_str();
                        let failure = match (progress.failed.get(name), progress.hosts.get(name)) {
                            (Some(said), _) => Some(format!("Metal3: {said}")),
                            (None, Some(h)) if h.ready => None,
                            _ if !timed_out => Some(format!(
                                "Cluster API's build of {} stands without {name}: no machine claimed its host",
                                settings.cluster
                            )),
                            _ => Some(format!(
                                "Cluster API did not bring {name} up within {:?}: {waiting}",
                                self.cfg.install_timeout
                            )),
                        };
                        NodeInstall { node: name.to_string(), role: n.role, failure }
                    })
                    .collect());
            }
            if progress.waiting != said {
                debug!(site = %self.cfg.site, waiting = ?progress.waiting, "Cluster API build under way");
                said = progress.waiting;
            }
            tokio::time::sleep(self.cfg.poll).await;
        }
    }
}

fn to_value<T: serde::Serialize>(o: T) -> Value {
    serde_json::to_value(o).unwrap_or_default()
}
