//! A Cluster API site's objects in a real API server serving the upstream Cluster API (1.13.5)
//! and CAPM3 (1.13.2) CRDs from `deploy/crds`: what landfall renders from a design is what their
//! schemas accept, applied server-side with the gateway's field manager; applied again it
//! changes nothing, and a new version changes only what it must. A bootstrap cluster that does
//! not serve those kinds is refused with what it lacks, before anything is written.

use std::time::Duration;

use bus_schema::domain::{ApiEndpoint, Builder, ClusterBuild, NodeSetRollout, Package, PackageRef, SiteDesign};
use bus_schema::pb;
use kube::ResourceExt;
use landfall_tests::kube::KubeApiServer;
use serde_json::Value;
use site_gateway::capi::{RenderSettings, render};
use site_gateway::kube_site::{KubeSite, KubeSiteConfig};

/// Cluster API's and CAPM3's CRDs, as their releases publish them.
const CLUSTER_API_CRDS: [&str; 7] = [
    include_str!("../../deploy/crds/cluster-api/cluster.x-k8s.io_clusters.yaml"),
    include_str!("../../deploy/crds/cluster-api/cluster.x-k8s.io_machinedeployments.yaml"),
    include_str!("../../deploy/crds/cluster-api/cluster.x-k8s.io_machinesets.yaml"),
    include_str!("../../deploy/crds/cluster-api/cluster.x-k8s.io_machines.yaml"),
    include_str!("../../deploy/crds/cluster-api/controlplane.cluster.x-k8s.io_kubeadmcontrolplanes.yaml"),
    include_str!("../../deploy/crds/cluster-api/bootstrap.cluster.x-k8s.io_kubeadmconfigs.yaml"),
    include_str!("../../deploy/crds/cluster-api/bootstrap.cluster.x-k8s.io_kubeadmconfigtemplates.yaml"),
];
const CAPM3_CRDS: [&str; 6] = [
    include_str!("../../deploy/crds/capm3/infrastructure.cluster.x-k8s.io_metal3clusters.yaml"),
    include_str!("../../deploy/crds/capm3/infrastructure.cluster.x-k8s.io_metal3machines.yaml"),
    include_str!("../../deploy/crds/capm3/infrastructure.cluster.x-k8s.io_metal3machinetemplates.yaml"),
    include_str!("../../deploy/crds/capm3/infrastructure.cluster.x-k8s.io_metal3datatemplates.yaml"),
    include_str!("../../deploy/crds/capm3/infrastructure.cluster.x-k8s.io_metal3datas.yaml"),
    include_str!("../../deploy/crds/capm3/infrastructure.cluster.x-k8s.io_metal3dataclaims.yaml"),
];

const SITE: &str = "edge-c1";
const NAMESPACE: &str = "metal3";

fn backend(kube: &KubeApiServer, client: kube::Client, dir: &std::path::Path) -> KubeSite {
    let _ = kube;
    let cfg = KubeSiteConfig::new(SITE, NAMESPACE, dir.join("state"));
    KubeSite::new(client, cfg, site_gateway::ArtifactCache::new(dir.join("cache"))).expect("a kube backend")
}

/// Three masters and two workers, built by Cluster API, running `kubelet`.
fn design(kubelet: &str) -> SiteDesign {
    let node = |i: usize, role: pb::Role| pb::NodeSpec {
        name: format!("node-{i}"),
        role: role as i32,
        boot_mac: format!("52:54:00:c1:00:{i:02x}"),
        bmc_address: format!("ipmi://10.0.1.{i}"),
        ..Default::default()
    };
    let nodes = (1..=3).map(|i| node(i, pb::Role::Master)).chain((4..=5).map(|i| node(i, pb::Role::Worker))).collect();
    let refs = vec![
        pb::PackageRef { name: "ubuntu".into(), version: "22.04.4".into() },
        pb::PackageRef { name: "kubelet".into(), version: kubelet.into() },
    ];
    let build = ClusterBuild {
        builder: Builder::Capi,
        endpoint: Some(ApiEndpoint { host: "10.0.1.100".parse().unwrap(), port: 6443 }),
        masters: NodeSetRollout::default(),
        workers: NodeSetRollout { spare: 1, ..Default::default() },
    };
    let design = pb::SiteDesign {
        site_id: SITE.into(),
        labels: Default::default(),
        nodes,
        packages: [pb::Role::Master, pb::Role::Worker]
            .map(|role| pb::RolePackages { role: role as i32, packages: refs.clone() })
            .to_vec(),
        cluster: Some(pb::ClusterBuild::from(&build.with_defaults(3))),
    };
    let design = SiteDesign::try_from(design).expect("a valid design");
    assert!(design.cluster_problems().is_empty(), "{:?}", design.cluster_problems());
    design
}

fn catalog(r: &PackageRef) -> Option<Package> {
    let kind = if r.name.as_str() == "ubuntu" { pb::PackageKind::OsImage } else { pb::PackageKind::Binary };
    Package::try_from(pb::Package {
        name: r.name.to_string(),
        version: r.version.to_string(),
        kind: kind as i32,
        sha256: format!("{:0>64}", r.version.as_str().replace('.', "")),
        size: 1,
        object_key: String::new(),
    })
    .ok()
}

fn objects(kubelet: &str) -> Vec<Value> {
    render(&design(kubelet), catalog, &RenderSettings { namespace: NAMESPACE.into(), ..RenderSettings::new(SITE) })
        .expect("a Cluster API site renders")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bootstrap_cluster_without_cluster_api_is_refused_with_what_it_lacks_before_anything_is_written() {
    let kube = KubeApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let site = backend(&kube, kube.client().await, dir.path());
    let served = site.capi_served().await.unwrap();
    assert_eq!(served.missing.len(), 11, "{:?}", served.missing);

    // Cluster API alone, without its Metal3 provider: CAPM3's kinds are named.
    for crd in CLUSTER_API_CRDS {
        kube.install_crd(crd).await;
    }
    let err = site.apply_capi(&objects("1.29.2")).await.unwrap_err().reason();
    assert!(
        err.starts_with(
            "the site's bootstrap cluster does not serve infrastructure.cluster.x-k8s.io/v1beta2 Metal3Cluster, \
             infrastructure.cluster.x-k8s.io/v1beta2 Metal3Machine"
        ),
        "{err}"
    );
    assert!(err.contains("Cluster API 1.13 and CAPM3 1.13"), "{err}");
    let clusters: kube::Api<kube::api::DynamicObject> = kube::Api::namespaced_with(
        kube.client().await,
        NAMESPACE,
        &kube::api::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Cluster")),
    );
    assert!(clusters.list(&Default::default()).await.unwrap().items.is_empty(), "nothing was written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_landfall_renders_is_what_the_upstream_crds_accept_and_applying_again_changes_nothing() {
    let kube = KubeApiServer::start().await;
    futures::future::join_all(CLUSTER_API_CRDS.iter().chain(&CAPM3_CRDS).map(|crd| kube.install_crd(crd))).await;
    let dir = tempfile::tempdir().unwrap();
    let site = backend(&kube, kube.client().await, dir.path());
    assert!(site.capi_served().await.unwrap().missing.is_empty());

    let first = site.apply_capi(&objects("1.29.2")).await.expect("the upstream schemas accept every object");
    let names: Vec<String> =
        first.iter().map(|o| format!("{} {}", o.types.as_ref().unwrap().kind, o.name_any())).collect();
    assert_eq!(names.len(), 8, "{names:?}");
    let kcp = first.iter().find(|o| o.types.as_ref().unwrap().kind == "KubeadmControlPlane").unwrap();
    assert_eq!(kcp.data["spec"]["replicas"], 3);
    assert_eq!(kcp.data["spec"]["version"], "v1.29.2");
    assert_eq!(
        kcp.data["spec"]["rollout"]["strategy"]["rollingUpdate"]["maxSurge"], 0,
        "an IntOrString the schema keeps"
    );
    let md = first.iter().find(|o| o.types.as_ref().unwrap().kind == "MachineDeployment").unwrap();
    assert_eq!(md.data["spec"]["rollout"]["strategy"]["rollingUpdate"]["maxUnavailable"], 1);
    // The gateway owns what it wrote, and nothing else.
    assert!(first.iter().all(|o| o.managed_fields().iter().any(|m| m.manager.as_deref() == Some("landfall-gateway"))));

    // Applied again: every object as it was.
    let again = site.apply_capi(&objects("1.29.2")).await.unwrap();
    let versions = |objects: &[kube::api::DynamicObject]| -> Vec<String> {
        objects.iter().map(|o| o.resource_version().unwrap_or_default()).collect()
    };
    assert_eq!(versions(&first), versions(&again), "applying the same objects changes nothing");

    // A new Kubernetes version: one write to the control plane and to the deployment; the
    // templates (immutable to Cluster API) keep their names.
    tokio::time::sleep(Duration::from_millis(10)).await;
    let next = site.apply_capi(&objects("1.29.3")).await.unwrap();
    let changed: Vec<String> = first
        .iter()
        .zip(&next)
        .filter(|(a, b)| a.resource_version() != b.resource_version())
        .map(|(_, b)| b.types.as_ref().unwrap().kind.clone())
        .collect();
    assert_eq!(changed, ["KubeadmControlPlane", "MachineDeployment"]);
    assert_eq!(
        first.iter().map(|o| o.name_any()).collect::<Vec<_>>(),
        next.iter().map(|o| o.name_any()).collect::<Vec<_>>()
    );
}
