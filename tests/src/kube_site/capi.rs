//! Cluster API's part at a site, played for the tests (the API server runs no controllers): what
//! the Cluster API core, kubeadm control plane and CAPM3 controllers do with the objects landfall
//! writes, as their documentation says, and the kubelets of the workload cluster, which is a
//! second API server.
//!
//! - **Machines.** A `KubeadmControlPlane` or `MachineDeployment` makes a `Machine` and its
//!   `Metal3Machine` (cloned from the set's `Metal3MachineTemplate`, the clone naming its
//!   template) until it counts its replicas: the control plane one machine at a time, each once
//!   the one before has its Node, a deployment all at once. A machine is up to date when it runs
//!   the set's version from the set's template. A set with machines out of date rolls one machine
//!   at a time: with `maxSurge` 1 the new machine first and one out of date deleted once the new
//!   one's Node is Ready; with `maxSurge` 0 one out of date deleted first, then its replacement
//!   made. The machine deleted is one marked `cluster.x-k8s.io/delete-machine` if any, else the
//!   oldest. A set larger than its replicas deletes the machine marked
//!   `cluster.x-k8s.io/delete-machine` first, else its oldest.
//! - **Hosts (CAPM3).** A `Metal3Machine` claims an `available` host whose labels match its
//!   `hostSelector` and that no one has claimed (name order): the host's `consumerRef`, `image`,
//!   `userData` and `online` written, the claim noted in the `metal3.io/BareMetalHost`
//!   annotation. Without one its `AssociateBMH` condition says so. A worker's machine claims a
//!   host only once the control plane is initialized (its bootstrap data waits for that).
//! - **Nodes.** Once Metal3 (the rig's stand-in) has provisioned the host with the machine's
//!   image, the Node named after the host registers in the workload cluster, `Ready` (unless the
//!   test says otherwise) at the machine's version, and the Machine's `nodeRef` names it.
//! - **Deletion.** A deleted Machine's Node is deleted, its host's image and user data taken off
//!   (Metal3 deprovisions it), its claim released once the host is `available`, then its
//!   `Metal3Machine` and its finalizer go.
//! - **Status.** The sets count `replicas`, `upToDateReplicas`, `readyReplicas` and
//!   `availableReplicas` (deleting machines included) for their generation, the control plane
//!   its lowest version; the `Cluster` is `Available` once the control plane is initialized and
//!   every deployment has no more machines unavailable than its `maxUnavailable`; the
//!   `<cluster>-kubeconfig` Secret holds the workload cluster's kubeconfig from the first
//!   control-plane Node on.
//!
//! - **A deleted Cluster**: its control plane and deployments deleted, then every machine, then
//!   its kubeconfig; its finalizer comes off once no machine is left.
//!
//! Not played: the `MachineSet`s between a deployment and its machines, the `KubeadmConfig`s
//! (machines carry a `dataSecretName`), remediation, and the bootstrap data's content.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Secret};
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::NAMESPACE;
use crate::kube::KubeApiServer;

/// Cluster API's and CAPM3's CRDs, as their releases publish them.
pub const CLUSTER_API_CRDS: [&str; 7] = [
    include_str!("../../../deploy/crds/cluster-api/cluster.x-k8s.io_clusters.yaml"),
    include_str!("../../../deploy/crds/cluster-api/cluster.x-k8s.io_machinedeployments.yaml"),
    include_str!("../../../deploy/crds/cluster-api/cluster.x-k8s.io_machinesets.yaml"),
    include_str!("../../../deploy/crds/cluster-api/cluster.x-k8s.io_machines.yaml"),
    include_str!("../../../deploy/crds/cluster-api/controlplane.cluster.x-k8s.io_kubeadmcontrolplanes.yaml"),
    include_str!("../../../deploy/crds/cluster-api/bootstrap.cluster.x-k8s.io_kubeadmconfigs.yaml"),
    include_str!("../../../deploy/crds/cluster-api/bootstrap.cluster.x-k8s.io_kubeadmconfigtemplates.yaml"),
];
pub const CAPM3_CRDS: [&str; 6] = [
    include_str!("../../../deploy/crds/capm3/infrastructure.cluster.x-k8s.io_metal3clusters.yaml"),
    include_str!("../../../deploy/crds/capm3/infrastructure.cluster.x-k8s.io_metal3machines.yaml"),
    include_str!("../../../deploy/crds/capm3/infrastructure.cluster.x-k8s.io_metal3machinetemplates.yaml"),
    include_str!("../../../deploy/crds/capm3/infrastructure.cluster.x-k8s.io_metal3datatemplates.yaml"),
    include_str!("../../../deploy/crds/capm3/infrastructure.cluster.x-k8s.io_metal3datas.yaml"),
    include_str!("../../../deploy/crds/capm3/infrastructure.cluster.x-k8s.io_metal3dataclaims.yaml"),
];

/// Installs every Cluster API and CAPM3 CRD into `kube`.
pub async fn install_crds(kube: &KubeApiServer) {
    futures::future::join_all(CLUSTER_API_CRDS.iter().chain(&CAPM3_CRDS).map(|crd| kube.install_crd(crd))).await;
}

const MACHINE_FINALIZER: &str = "machine.cluster.x-k8s.io";
const CLUSTER_FINALIZER: &str = "cluster.cluster.x-k8s.io";
const CLUSTER_NAME: &str = "cluster.x-k8s.io/cluster-name";
const CONTROL_PLANE_NAME: &str = "cluster.x-k8s.io/control-plane-name";
const DEPLOYMENT_NAME: &str = "cluster.x-k8s.io/deployment-name";
const DELETE_MACHINE: &str = "cluster.x-k8s.io/delete-machine";
const CLONED_FROM: &str = "cluster.x-k8s.io/cloned-from-name";
const HOST_ANNOTATION: &str = "metal3.io/BareMetalHost";
/// The field manager of the stand-in's writes.
const MANAGER: &str = "capi-controllers";

/// What the Cluster API stand-in did, shared with the test. (Which kubelets report `Ready:
/// False` it takes from the rig's [`super::KubeletKnobs`].)
#[derive(Debug, Clone, Default)]
pub struct CapiKnobs {
    /// Each machine made and deleted, each claim and each Node, in order: `+cp-1 v1.29.2
    /// <template>`, `cp-1 claimed m-1`, `cp-1 node m-1`, `-cp-1 m-1`.
    pub log: Arc<Mutex<Vec<String>>>,
}

impl CapiKnobs {
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    fn note(&self, line: String) {
        tracing::info!(%line, "Cluster API stand-in");
        self.log.lock().unwrap().push(line);
    }
}

fn resource(group: &str, kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, "v1beta2", kind))
}

struct Apis {
    clusters: Api<DynamicObject>,
    control_planes: Api<DynamicObject>,
    deployments: Api<DynamicObject>,
    machines: Api<DynamicObject>,
    metal3_machines: Api<DynamicObject>,
    templates: Api<DynamicObject>,
    hosts: Api<DynamicObject>,
    secrets: Api<Secret>,
    /// The workload cluster's.
    nodes: Api<Node>,
    knobs: CapiKnobs,
    kubelets: super::KubeletKnobs,
}

/// A node set: a control plane or a deployment, as its controller sees it.
struct NodeSet {
    kind: &'static str,
    name: String,
    cluster: String,
    replicas: usize,
    max_surge: usize,
    version: String,
    template: String,
    /// Labels its machines carry (and are found by).
    labels: Value,
    one_at_a_time: bool,
}

/// Runs the controllers until `shutdown`: `bootstrap` is the site's bootstrap cluster,
/// `workload` the cluster Cluster API builds, reached by `workload_kubeconfig`.
pub async fn controllers(
    bootstrap: kube::Client,
    workload: kube::Client,
    workload_kubeconfig: Vec<u8>,
    knobs: CapiKnobs,
    kubelets: super::KubeletKnobs,
    shutdown: CancellationToken,
) {
    let ns = |r: ApiResource| Api::<DynamicObject>::namespaced_with(bootstrap.clone(), NAMESPACE, &r);
    let apis = Apis {
        clusters: ns(resource("cluster.x-k8s.io", "Cluster")),
        control_planes: ns(resource("controlplane.cluster.x-k8s.io", "KubeadmControlPlane")),
        deployments: ns(resource("cluster.x-k8s.io", "MachineDeployment")),
        machines: ns(resource("cluster.x-k8s.io", "Machine")),
        metal3_machines: ns(resource("infrastructure.cluster.x-k8s.io", "Metal3Machine")),
        templates: ns(resource("infrastructure.cluster.x-k8s.io", "Metal3MachineTemplate")),
        hosts: ns(ApiResource::from_gvk(&GroupVersionKind::gvk("metal3.io", "v1alpha1", "BareMetalHost"))),
        secrets: Api::namespaced(bootstrap.clone(), NAMESPACE),
        nodes: Api::all(workload),
        knobs,
        kubelets,
    };
    let made = AtomicU32::new(0);
    loop {
        if let Err(e) = reconcile(&apis, &workload_kubeconfig, &made).await {
            tracing::debug!(error = %e, "the Cluster API stand-in will look again");
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(150)) => {}
        }
    }
}

async fn reconcile(apis: &Apis, kubeconfig: &[u8], made: &AtomicU32) -> Result<(), kube::Error> {
    let all = ListParams::default();
    for cluster in apis.clusters.list(&all).await?.items {
        let cluster_name = name(&cluster);
        if cluster.metadata.deletion_timestamp.is_none() && !cluster.finalizers().iter().any(|f| f == CLUSTER_FINALIZER)
        {
            let body = json!({"metadata": {"finalizers": [CLUSTER_FINALIZER]}});
            apis.clusters.patch(&cluster_name, &manager(), &Patch::Merge(&body)).await?;
        }
        let mut sets = Vec::new();
        if let Some(cp) = apis.control_planes.get_opt(&format!("{cluster_name}-control-plane")).await? {
            sets.push((cp.clone(), control_plane_set(&cp, &cluster_name)));
        }
        for md in apis.deployments.list(&all).await?.items {
            if text(&md.data, "/spec/clusterName") == cluster_name {
                let set = deployment_set(&md, &cluster_name);
                sets.push((md, set));
            }
        }
        let machines =
            apis.machines.list(&ListParams::default().labels(&format!("{CLUSTER_NAME}={cluster_name}"))).await?;
        let metal3 = apis.metal3_machines.list(&all).await?.items;
        let mut hosts = apis.hosts.list(&all).await?.items;
        let nodes: BTreeMap<String, Node> = apis
            .nodes
            .list(&all)
            .await?
            .items
            .into_iter()
            .map(|n| (n.metadata.name.clone().unwrap_or_default(), n))
            .collect();

        // Each machine: its host claimed, its Node registered, or, deleted, taken down.
        let initialized = machines.items.iter().any(|m| {
            m.labels().contains_key(CONTROL_PLANE_NAME) && node_ready(&nodes, text(&m.data, "/status/nodeRef/name"))
        });
        for machine in &machines.items {
            let m3 = metal3.iter().find(|o| name(o) == name(machine));
            if machine.metadata.deletion_timestamp.is_some() {
                take_down(apis, machine, m3, &hosts).await?;
                continue;
            }
            let Some(m3) = m3 else { continue };
            let worker = !machine.labels().contains_key(CONTROL_PLANE_NAME);
            match m3.annotations().get(HOST_ANNOTATION) {
                None if worker && !initialized => {}
                None => {
                    claim(apis, machine, m3, &hosts).await?;
                    hosts = apis.hosts.list(&all).await?.items;
                }
                Some(claimed) => {
                    let host = claimed.rsplit('/').next().unwrap_or_default();
                    bring_up(apis, machine, m3, host, &hosts, &nodes).await?;
                }
            }
        }

        if cluster.metadata.deletion_timestamp.is_some() {
            take_cluster_down(apis, &cluster, &sets, &machines.items).await?;
            continue;
        }

        // Each set: machines made or deleted, then counted.
        for (object, set) in &sets {
            let own: Vec<&DynamicObject> = machines.items.iter().filter(|m| owned_by(m, set)).collect();
            scale(apis, set, &own, &metal3, &nodes, made).await?;
            let own: Vec<&DynamicObject> = machines.items.iter().filter(|m| owned_by(m, set)).collect();
            count(apis, object, set, &own, &metal3, &nodes).await?;
        }

        if initialized {
            let secret = format!("{cluster_name}-kubeconfig");
            if apis.secrets.get_opt(&secret).await?.is_none() {
                let body = Secret {
                    metadata: kube::api::ObjectMeta {
                        name: Some(secret),
                        namespace: Some(NAMESPACE.into()),
                        labels: Some([(CLUSTER_NAME.to_string(), cluster_name.clone())].into()),
                        ..Default::default()
                    },
                    type_: Some("cluster.x-k8s.io/secret".into()),
                    data: Some([("value".to_string(), k8s_openapi::ByteString(kubeconfig.to_vec()))].into()),
                    ..Default::default()
                };
                apis.secrets.create(&PostParams::default(), &body).await?;
                apis.knobs.note(format!("kubeconfig {cluster_name}"));
            }
        }
        available(apis, &cluster, initialized, &sets, &machines.items, &nodes).await?;
    }
    Ok(())
}

fn control_plane_set(cp: &DynamicObject, cluster: &str) -> NodeSet {
    let labels = json!({CLUSTER_NAME: cluster, CONTROL_PLANE_NAME: name(cp), "cluster.x-k8s.io/control-plane": ""});
    node_set(cp, "KubeadmControlPlane", cluster, "/spec/machineTemplate/spec", "/spec/version", labels)
}

fn deployment_set(md: &DynamicObject, cluster: &str) -> NodeSet {
    let labels = json!({CLUSTER_NAME: cluster, DEPLOYMENT_NAME: name(md)});
    node_set(md, "MachineDeployment", cluster, "/spec/template/spec", "/spec/template/spec/version", labels)
}

/// A set whose machine template is at `template` and version at `version` (JSON pointers).
fn node_set(
    o: &DynamicObject,
    kind: &'static str,
    cluster: &str,
    template: &str,
    version: &str,
    labels: Value,
) -> NodeSet {
    let d = &o.data;
    let number = |pointer: &str, default: u64| d.pointer(pointer).and_then(Value::as_u64).unwrap_or(default) as usize;
    NodeSet {
        kind,
        name: name(o),
        cluster: cluster.to_string(),
        replicas: number("/spec/replicas", 1),
        max_surge: number("/spec/rollout/strategy/rollingUpdate/maxSurge", 1),
        version: text(d, version).to_string(),
        template: text(d, &format!("{template}/infrastructureRef/name")).to_string(),
        labels,
        one_at_a_time: kind == "KubeadmControlPlane",
    }
}

fn owned_by(machine: &DynamicObject, set: &NodeSet) -> bool {
    let key = if set.kind == "KubeadmControlPlane" { CONTROL_PLANE_NAME } else { DEPLOYMENT_NAME };
    machine.labels().get(key) == Some(&set.name)
}

fn up_to_date(machine: &DynamicObject, metal3: &[DynamicObject], set: &NodeSet) -> bool {
    let template =
        metal3.iter().find(|m| name(m) == name(machine)).and_then(|m| m.annotations().get(CLONED_FROM).cloned());
    text(&machine.data, "/spec/version") == set.version && template.as_deref() == Some(set.template.as_str())
}

fn machine_ready(machine: &DynamicObject, nodes: &BTreeMap<String, Node>) -> bool {
    node_ready(nodes, text(&machine.data, "/status/nodeRef/name"))
}

fn node_ready(nodes: &BTreeMap<String, Node>, node: &str) -> bool {
    nodes
        .get(node)
        .and_then(|n| n.status.as_ref()?.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// One step of the set towards its replicas, all up to date.
async fn scale(
    apis: &Apis,
    set: &NodeSet,
    own: &[&DynamicObject],
    metal3: &[DynamicObject],
    nodes: &BTreeMap<String, Node>,
    made: &AtomicU32,
) -> Result<(), kube::Error> {
    if own.iter().any(|m| m.metadata.deletion_timestamp.is_some()) {
        return Ok(());
    }
    let settled = own.iter().all(|m| machine_ready(m, nodes));
    if own.len() < set.replicas {
        if set.one_at_a_time && !settled {
            return Ok(());
        }
        let missing = if set.one_at_a_time { 1 } else { set.replicas - own.len() };
        for _ in 0..missing {
            make_machine(apis, set, made).await?;
        }
        return Ok(());
    }
    if !settled {
        return Ok(());
    }
    let mut outdated: Vec<&DynamicObject> = own.iter().copied().filter(|m| !up_to_date(m, metal3, set)).collect();
    // Those marked for deletion first, then the oldest.
    outdated.sort_by_key(|m| {
        (!m.annotations().contains_key(DELETE_MACHINE), m.metadata.creation_timestamp.clone().map(|t| t.0))
    });
    if let Some(oldest) = outdated.first() {
        if own.len() < set.replicas + set.max_surge {
            return make_machine(apis, set, made).await;
        }
        return delete_machine(apis, oldest).await;
    }
    if own.len() > set.replicas {
        let mut candidates: Vec<&DynamicObject> = own.to_vec();
        candidates.sort_by_key(|m| {
            (!m.annotations().contains_key(DELETE_MACHINE), m.metadata.creation_timestamp.clone().map(|t| t.0))
        });
        return delete_machine(apis, candidates[0]).await;
    }
    Ok(())
}

/// A new machine of `set`: its `Metal3Machine` cloned from the set's template, then the Machine.
async fn make_machine(apis: &Apis, set: &NodeSet, made: &AtomicU32) -> Result<(), kube::Error> {
    let Some(template) = apis.templates.get_opt(&set.template).await? else { return Ok(()) };
    let machine = format!("{}-{}", set.name, made.fetch_add(1, Ordering::SeqCst) + 1);
    let m3 = json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "Metal3Machine",
        "metadata": {"name": machine, "namespace": NAMESPACE, "labels": set.labels,
                     "annotations": {CLONED_FROM: set.template,
                                     "cluster.x-k8s.io/cloned-from-groupkind": "Metal3MachineTemplate.infrastructure.cluster.x-k8s.io"}},
        "spec": template.data["spec"]["template"]["spec"],
    });
    apis.metal3_machines.create(&PostParams::default(), &serde_json::from_value(m3).unwrap()).await?;
    let body = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": machine, "namespace": NAMESPACE, "labels": set.labels, "finalizers": [MACHINE_FINALIZER]},
        "spec": {"clusterName": set.cluster, "version": set.version,
                 "bootstrap": {"dataSecretName": format!("{machine}-bootstrap")},
                 "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "Metal3Machine", "name": machine}},
    });
    apis.machines.create(&PostParams::default(), &serde_json::from_value(body).unwrap()).await?;
    apis.knobs.note(format!("+{machine} {} {}", set.version, set.template));
    Ok(())
}

async fn delete_machine(apis: &Apis, machine: &DynamicObject) -> Result<(), kube::Error> {
    apis.machines.delete(&name(machine), &DeleteParams::default()).await?;
    apis.knobs.note(format!("-{} {}", name(machine), text(&machine.data, "/status/nodeRef/name")));
    Ok(())
}

/// CAPM3's association: the first `available` host the selector matches that nobody claimed.
async fn claim(
    apis: &Apis,
    machine: &DynamicObject,
    m3: &DynamicObject,
    hosts: &[DynamicObject],
) -> Result<(), kube::Error> {
    let selector =
        m3.data.pointer("/spec/hostSelector/matchLabels").and_then(Value::as_object).cloned().unwrap_or_default();
    let mut free: Vec<&DynamicObject> = hosts
        .iter()
        .filter(|h| h.metadata.deletion_timestamp.is_none())
        .filter(|h| text(&h.data, "/status/provisioning/state") == "available")
        .filter(|h| text(&h.data, "/status/errorType").is_empty())
        .filter(|h| h.data.pointer("/spec/consumerRef").is_none_or(Value::is_null))
        .filter(|h| selector.iter().all(|(k, v)| h.labels().get(k).map(String::as_str) == v.as_str()))
        .collect();
    free.sort_by_key(|h| name(h));
    let Some(host) = free.first() else {
        let condition = json!({"status": {"conditions": [{
            "type": "AssociateBMH", "status": "False", "reason": "AssociateBMHFailed",
            "message": "no available host matches the host selector", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
        apis.metal3_machines.patch_status(&name(m3), &PatchParams::default(), &Patch::Merge(&condition)).await?;
        return Ok(());
    };
    let image = &m3.data["spec"]["image"];
    // Claimed as CAPM3 does, against the version read: a host another machine took meanwhile
    // is a conflict, and this machine looks again.
    let claim = json!({"metadata": {"resourceVersion": host.metadata.resource_version}, "spec": {
        "consumerRef": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "Metal3Machine",
                        "name": name(m3), "namespace": NAMESPACE},
        "image": {"url": image["url"], "checksum": image["checksum"], "checksumType": image["checksumType"],
                  "format": image["diskFormat"]},
        "userData": {"name": format!("{}-bootstrap", name(machine)), "namespace": NAMESPACE},
        "online": true,
        "automatedCleaningMode": m3.data["spec"]["automatedCleaningMode"],
    }});
    let params = PatchParams { field_manager: Some(MANAGER.into()), ..Default::default() };
    match apis.hosts.patch(&name(host), &params, &Patch::Merge(&claim)).await {
        Err(kube::Error::Api(e)) if e.code == 409 => return Ok(()),
        other => other?,
    };
    let note = json!({"metadata": {"annotations": {HOST_ANNOTATION: format!("{NAMESPACE}/{}", name(host))}}});
    apis.metal3_machines.patch(&name(m3), &params, &Patch::Merge(&note)).await?;
    apis.knobs.note(format!("{} claimed {}", name(machine), name(host)));
    Ok(())
}

/// Once the machine's host is provisioned with its image: the Node registers, Ready at the
/// machine's version, and the Machine names it.
async fn bring_up(
    apis: &Apis,
    machine: &DynamicObject,
    m3: &DynamicObject,
    host_name: &str,
    hosts: &[DynamicObject],
    nodes: &BTreeMap<String, Node>,
) -> Result<(), kube::Error> {
    let Some(host) = hosts.iter().find(|h| name(h) == host_name) else { return Ok(()) };
    let provisioned = text(&host.data, "/status/provisioning/state") == "provisioned"
        && text(&host.data, "/status/provisioning/image/url") == text(&m3.data, "/spec/image/url");
    if !provisioned {
        return Ok(());
    }
    let version = text(&machine.data, "/spec/version");
    let ready = !apis.kubelets.not_ready.lock().unwrap().contains(host_name);
    if !nodes.contains_key(host_name) {
        let role = host.labels().get("landfall.io/role").cloned().unwrap_or_default();
        let body: Node =
            serde_json::from_value(json!({"metadata": {"name": host_name, "labels": {"landfall.io/role": role}}}))
                .unwrap();
        apis.nodes.create(&PostParams::default(), &body).await?;
    }
    let seen = nodes.get(host_name).and_then(|n| n.status.clone());
    let said_ready = seen
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == if ready { "True" } else { "False" }));
    let said_version = seen.as_ref().and_then(|s| s.node_info.as_ref()).is_some_and(|i| i.kubelet_version == version);
    if !said_ready || !said_version {
        let status = json!({"status": {
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
            "nodeInfo": {"kubeletVersion": version},
        }});
        apis.nodes.patch_status(host_name, &PatchParams::default(), &Patch::Merge(&status)).await?;
    }
    if text(&machine.data, "/status/nodeRef/name") != host_name {
        let status = json!({"status": {"nodeRef": {"name": host_name}, "phase": "Running"}});
        apis.machines.patch_status(&name(machine), &PatchParams::default(), &Patch::Merge(&status)).await?;
        apis.knobs.note(format!("{} node {host_name}", name(machine)));
    }
    Ok(())
}

/// A deleted machine taken down: its Node, its host's OS (Metal3 deprovisions), its claim once
/// the host is available, its Metal3Machine, and last its finalizer.
async fn take_down(
    apis: &Apis,
    machine: &DynamicObject,
    m3: Option<&DynamicObject>,
    hosts: &[DynamicObject],
) -> Result<(), kube::Error> {
    let node = text(&machine.data, "/status/nodeRef/name");
    if !node.is_empty() && apis.nodes.get_opt(node).await?.is_some() {
        apis.nodes.delete(node, &DeleteParams::default()).await?;
    }
    let params = PatchParams { field_manager: Some(MANAGER.into()), ..Default::default() };
    if let Some(m3) = m3 {
        let claimed =
            m3.annotations().get(HOST_ANNOTATION).map(|a| a.rsplit('/').next().unwrap_or_default().to_string());
        if let Some(host) = claimed.and_then(|c| hosts.iter().find(|h| name(h) == c)) {
            let state = text(&host.data, "/status/provisioning/state");
            if host.data.pointer("/spec/image").is_some_and(|i| !i.is_null()) {
                let release = json!({"spec": {"image": null, "userData": null}});
                apis.hosts.patch(&name(host), &params, &Patch::Merge(&release)).await?;
                return Ok(());
            }
            if state != "available" {
                return Ok(());
            }
            let release = json!({"spec": {"consumerRef": null, "online": false}});
            apis.hosts.patch(&name(host), &params, &Patch::Merge(&release)).await?;
            apis.knobs.note(format!("{} released {}", name(machine), name(host)));
        }
        apis.metal3_machines.delete(&name(m3), &DeleteParams::default()).await?;
    }
    let finalizers = json!({"metadata": {"finalizers": null}});
    apis.machines.patch(&name(machine), &params, &Patch::Merge(&finalizers)).await?;
    Ok(())
}

/// A deleted Cluster taken down: its control plane and deployments, then its machines (each
/// taken down as any deleted machine is), then its kubeconfig, and last its finalizer.
async fn take_cluster_down(
    apis: &Apis,
    cluster: &DynamicObject,
    sets: &[(DynamicObject, NodeSet)],
    machines: &[DynamicObject],
) -> Result<(), kube::Error> {
    for (object, set) in sets {
        let api = if set.kind == "KubeadmControlPlane" { &apis.control_planes } else { &apis.deployments };
        if object.metadata.deletion_timestamp.is_none() {
            api.delete(&set.name, &DeleteParams::default()).await?;
        }
    }
    for machine in machines.iter().filter(|m| m.metadata.deletion_timestamp.is_none()) {
        delete_machine(apis, machine).await?;
    }
    if !machines.is_empty() {
        return Ok(());
    }
    let secret = format!("{}-kubeconfig", name(cluster));
    if apis.secrets.get_opt(&secret).await?.is_some() {
        apis.secrets.delete(&secret, &DeleteParams::default()).await?;
    }
    let body = json!({"metadata": {"finalizers": null}});
    apis.clusters.patch(&name(cluster), &manager(), &Patch::Merge(&body)).await?;
    apis.knobs.note(format!("cluster {} down", name(cluster)));
    Ok(())
}

fn manager() -> PatchParams {
    PatchParams { field_manager: Some(MANAGER.into()), ..Default::default() }
}

/// The set's status: its machines counted for its generation.
async fn count(
    apis: &Apis,
    object: &DynamicObject,
    set: &NodeSet,
    own: &[&DynamicObject],
    metal3: &[DynamicObject],
    nodes: &BTreeMap<String, Node>,
) -> Result<(), kube::Error> {
    let ready = own.iter().filter(|m| machine_ready(m, nodes)).count();
    let current = own.iter().filter(|m| up_to_date(m, metal3, set)).count();
    let mut status = json!({
        "observedGeneration": object.metadata.generation.unwrap_or(1),
        "replicas": own.len(), "upToDateReplicas": current, "readyReplicas": ready, "availableReplicas": ready,
    });
    let api = if set.kind == "KubeadmControlPlane" {
        let lowest = own.iter().map(|m| text(&m.data, "/spec/version")).min_by_key(|v| version_key(v));
        if let Some(v) = lowest {
            status["version"] = json!(v);
        }
        &apis.control_planes
    } else {
        &apis.deployments
    };
    let before = &object.data["status"];
    let unchanged = status.as_object().unwrap().iter().all(|(k, v)| before.get(k) == Some(v));
    if !unchanged {
        api.patch_status(&set.name, &PatchParams::default(), &Patch::Merge(&json!({"status": status}))).await?;
    }
    Ok(())
}

/// The Cluster's `Available` condition and initialization.
async fn available(
    apis: &Apis,
    cluster: &DynamicObject,
    initialized: bool,
    sets: &[(DynamicObject, NodeSet)],
    machines: &[DynamicObject],
    nodes: &BTreeMap<String, Node>,
) -> Result<(), kube::Error> {
    let mut short = Vec::new();
    if !initialized {
        short.push("the control plane is not initialized".to_string());
    }
    for (object, set) in sets.iter().filter(|(_, s)| s.kind == "MachineDeployment") {
        let allowed = object
            .data
            .pointer("/spec/rollout/strategy/rollingUpdate/maxUnavailable")
            .and_then(Value::as_u64)
            .unwrap_or(0) as usize;
        let up = machines.iter().filter(|m| owned_by(m, set) && machine_ready(m, nodes)).count();
        if up + allowed < set.replicas {
            short.push(format!("MachineDeployment {} has {up} of {} machines available", set.name, set.replicas));
        }
    }
    let (status, reason, message) = match short.is_empty() {
        true => ("True", "Available", String::new()),
        false => ("False", "NotAvailable", short.join("; ")),
    };
    let before = cluster
        .data
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Available"));
    if before.is_some_and(|c| c["status"] == status && c["message"] == message.as_str()) {
        return Ok(());
    }
    let patch = json!({"status": {
        "conditions": [{"type": "Available", "status": status, "reason": reason, "message": message,
                        "lastTransitionTime": "2026-01-01T00:00:00Z"}],
        "initialization": {"infrastructureProvisioned": true, "controlPlaneInitialized": initialized},
    }});
    apis.clusters.patch_status(&name(cluster), &PatchParams::default(), &Patch::Merge(&patch)).await?;
    Ok(())
}

fn version_key(v: &str) -> Vec<u64> {
    v.trim_start_matches('v').split('.').map(|p| p.parse().unwrap_or(0)).collect()
}

fn name(o: &DynamicObject) -> String {
    o.metadata.name.clone().unwrap_or_default()
}

fn text<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or_default()
}
