//! Nodes and sites leaving landfall at a real site: the kube backend (in this process) against a
//! real Kubernetes API server with the upstream Metal3 and BPA CRDs, with Metal3's operator, the
//! BPA and the kubelets played by the rig. What `landfall node remove` (cordon, drain,
//! `delete_node`, `deprovision_host`, `forget_host`) and `landfall site decommission`
//! (`host_names`, each host deprovisioned and forgotten, `tear_down_cluster`) ask of a site.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bus_schema::domain::{NodeDesign, Package};
use bus_schema::pb;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use landfall_tests::kube_site::{
    CLUSTER_KUBECONFIG, KubeSiteRig, METAL3_FINALIZER, NAMESPACE, SITE, m1_network, mac, node_spec,
};
use serde_json::json;
use site_gateway::SiteBackend;
use site_gateway::backend::{BmcCredentials, ClusterRequest, HostChange, HostRequest, ProvisioningState};
use site_gateway::kube_site::bpa::{self, ClusterNode};
use site_gateway::kube_site::{KubeSite, marks};
use tokio::sync::mpsc;

const WAIT: Duration = Duration::from_secs(30);

/// The catalog's OS image and binaries.
fn catalog() -> (Package, Vec<Package>) {
    let packages = producers::up::demo_packages();
    let os = packages.iter().find(|p| p.kind == pb::PackageKind::OsImage as i32).expect("an OS image").clone();
    let binaries = packages
        .into_iter()
        .filter(|p| p.kind == pb::PackageKind::Binary as i32)
        .map(|p| Package::try_from(p).unwrap())
        .collect();
    (Package::try_from(os).unwrap(), binaries)
}

fn node(name: &str, role: pb::Role, i: u8, network: bool) -> NodeDesign {
    let spec = pb::NodeSpec { network: network.then(m1_network), ..node_spec(name, role, &mac(i)) };
    NodeDesign::try_from(spec).unwrap()
}

/// Provisions `node` through the backend, as a ProvisionOs job does; `inspect` plays Metal3's
/// registration and inspection of a host the backend creates (its boot NIC at `ip`).
async fn provision(rig: &KubeSiteRig, site: &KubeSite, node: NodeDesign, inspect: Option<&str>) {
    let (os, _) = catalog();
    let name = node.name.to_string();
    let mut req = HostRequest::new(node, &os);
    req.bmc = Some(BmcCredentials { username: "admin".into(), password: "s3cret".into() });
    let (tx, _rx) = mpsc::unbounded_channel();
    let provisioning = site.provision_host(&req, tx);
    tokio::pin!(provisioning);
    if let Some(ip) = inspect {
        let deadline = tokio::time::Instant::now() + WAIT;
        let mac = loop {
            tokio::select! {
                done = &mut provisioning => panic!("{name} provisioned before it was inspected: {done:?}"),
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
            if let Some(host) = rig.hosts().get_opt(&name).await.unwrap() {
                break host.spec.boot_mac_address.unwrap();
            }
            assert!(tokio::time::Instant::now() < deadline, "{name} was not created");
        };
        rig.inspect_host(&name, &mac, ip).await;
    }
    provisioning.await.unwrap_or_else(|e| panic!("provisioning {name}: {}", e.reason()));
}

/// Installs the binaries on `nodes` as one cluster; every node joins.
async fn install(site: &KubeSite, nodes: Vec<NodeDesign>) {
    let (_, binaries) = catalog();
    let req = ClusterRequest { nodes, binaries, join_existing: false, capi: None };
    let results = site.install_binaries(&req).await.unwrap_or_else(|e| panic!("install: {}", e.reason()));
    assert!(results.iter().all(|r| r.failure.is_none()), "{results:?}");
}

/// Every host change the backend's watch sends, each acknowledged as announced at once.
fn listen(site: &KubeSite) -> Arc<Mutex<Vec<HostChange>>> {
    let mut changes = site.host_changes();
    let heard = Arc::new(Mutex::new(Vec::new()));
    let keep = heard.clone();
    tokio::spawn(async move {
        while let Some(notice) = changes.recv().await {
            keep.lock().unwrap().push(notice.change);
            if let Some(tell) = notice.announced {
                let _ = tell.send(());
            }
        }
    });
    heard
}

fn departed(heard: &Mutex<Vec<HostChange>>) -> Vec<String> {
    let heard = heard.lock().unwrap();
    heard
        .iter()
        .filter_map(|c| match c {
            HostChange::Departed { node, .. } => Some(node.clone()),
            HostChange::Arrived { .. } => None,
        })
        .collect()
}

fn secrets(rig: &KubeSiteRig) -> Api<Secret> {
    Api::namespaced(rig.client.clone(), NAMESPACE)
}

fn bpa_api(rig: &KubeSiteRig, resource: &kube::api::ApiResource) -> Api<DynamicObject> {
    Api::namespaced_with(rig.client.clone(), NAMESPACE, resource)
}

/// Drains what was sent on `rx` so far.
fn states(rx: &mut mpsc::UnboundedReceiver<ProvisioningState>) -> Vec<ProvisioningState> {
    std::iter::from_fn(|| rx.try_recv().ok()).collect()
}

/// A provisioned worker in a cluster of two leaves it: its Node is deleted (once), its host
/// deprovisioned to `available` with no image, then deleted with its three Secrets and its
/// entries in the BPA's `Provisioning` and hosts.ini, the master's left as they were. The watch
/// announces no departure for it, while a host someone else deletes is still announced.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_removed_node_leaves_nothing_behind_and_no_departure_is_announced() {
    let rig = KubeSiteRig::start().await;
    let site = rig.kube_site();
    let heard = listen(&site);
    assert!(!site.delete_node("w-1").await.unwrap(), "no cluster yet: no Node to delete");

    rig.create_host("m-1", "master", &mac(1), "10.1.0.11").await;
    provision(&rig, &site, node("m-1", pb::Role::Master, 1, false), None).await;
    provision(&rig, &site, node("w-1", pb::Role::Worker, 2, true), Some("10.1.0.21")).await;
    rig.put_cluster_kubeconfig().await;
    install(&site, vec![node("m-1", pb::Role::Master, 1, false), node("w-1", pb::Role::Worker, 2, true)]).await;
    assert_eq!(site.host_names().await.unwrap(), ["m-1", "w-1"]);
    let host_secrets = [marks::bmc_secret("w-1"), marks::user_data_secret("w-1"), marks::network_data_secret("w-1")];
    for name in &host_secrets {
        let secret = secrets(&rig).get(name).await.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(secret.labels().contains_key(marks::PURPOSE_LABEL), "{name}");
    }

    // The Node goes, and stays gone: its kubelet does not register it again.
    let nodes: Api<Node> = Api::all(rig.client.clone());
    assert!(nodes.get_opt("w-1").await.unwrap().is_some());
    assert!(site.delete_node("w-1").await.unwrap());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(nodes.get_opt("w-1").await.unwrap().is_none());
    assert!(!site.delete_node("w-1").await.unwrap(), "deleted before");
    assert!(nodes.get_opt("m-1").await.unwrap().is_some(), "the master's Node stays");

    // Deprovisioned: Metal3 takes the image off, through its states.
    let (tx, mut rx) = mpsc::unbounded_channel();
    assert!(site.deprovision_host("w-1", Default::default(), tx.clone()).await.unwrap());
    let seen = states(&mut rx);
    assert_eq!(seen.last(), Some(&ProvisioningState::Available), "{seen:?}");
    assert!(
        seen.iter().all(|s| matches!(s, ProvisioningState::Deprovisioning | ProvisioningState::Available)),
        "{seen:?}"
    );
    let host = rig.hosts().get("w-1").await.unwrap();
    assert_eq!(host.status.as_ref().unwrap().provisioning.state, "available");
    assert!(host.spec.image.is_none(), "{:?}", host.spec.image);
    // Metal3 holds the host's deletion until it has powered it off: forget_host waits for it.
    assert!(host.finalizers().iter().any(|f| f == METAL3_FINALIZER), "{:?}", host.finalizers());
    // Again: it is available with no image already, and says so at once.
    assert!(site.deprovision_host("w-1", Default::default(), tx.clone()).await.unwrap());
    assert_eq!(states(&mut rx), [ProvisioningState::Available]);
    assert!(!site.deprovision_host("w-9", Default::default(), tx).await.unwrap(), "no such host");

    // Forgotten: the host (once Metal3 let it go), its Secrets, its BPA entries.
    let hosts_ini_before = rig.hosts_ini();
    assert!(hosts_ini_before.contains("w-1 ansible_ssh_host=10.1.0.21"), "{hosts_ini_before}");
    assert!(site.forget_host("w-1").await.unwrap());
    let forgotten_at = tokio::time::Instant::now();
    assert!(rig.hosts().get_opt("w-1").await.unwrap().is_none(), "the host is gone when forget_host returns");
    for name in &host_secrets {
        assert!(secrets(&rig).get_opt(name).await.unwrap().is_none(), "{name} is still there");
    }
    let p = bpa_api(&rig, &bpa::provisioning_resource()).get(SITE).await.unwrap();
    assert_eq!(p.data["spec"]["masters"], json!([{"m-1": {"mac-address": mac(1)}}]));
    assert_eq!(p.data["spec"]["workers"], json!([]));
    assert_eq!(
        (p.data["spec"]["KUDPlugins"].clone(), p.data["spec"]["PodSubnet"].clone()),
        (json!(["emco"]), json!("10.244.64.0/18"))
    );
    let master =
        ClusterNode { name: "m-1".into(), role: bus_schema::domain::Role::Master, mac: mac(1), ip: "10.1.0.11".into() };
    assert_eq!(rig.hosts_ini(), bpa::hosts_ini(&[master]));
    assert!(!site.forget_host("w-1").await.unwrap(), "nothing left of it");
    assert_eq!(site.host_names().await.unwrap(), ["m-1"]);

    // A host someone else deletes is announced as departed; the forgotten one never is.
    rig.hosts().delete("m-1", &DeleteParams::default()).await.unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    while !departed(&heard).contains(&"m-1".to_string()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "m-1's deletion was not announced: {:?}",
            heard.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep_until(forgotten_at + Duration::from_secs(4)).await;
    assert_eq!(departed(&heard), ["m-1"], "{:?}", heard.lock().unwrap());
    // Metal3 let m-1 go too once the watch had announced it (its finalizer released).
    let deadline = tokio::time::Instant::now() + WAIT;
    while let Some(host) = rig.hosts().get_opt("m-1").await.unwrap() {
        assert!(tokio::time::Instant::now() < deadline, "m-1 held: {:?}", host.finalizers());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A site decommissioned as the gateway does it: each host deprovisioned and forgotten, then
/// the cluster torn down: no `Provisioning`, no `Software`, no kubeconfig Secret, no Secret
/// landfall wrote (one left from a host deleted by hand included), no hosts.ini; the site's own
/// Secrets stay. Tearing down again finds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_torn_down_cluster_leaves_no_bpa_resource_nor_landfall_secret() {
    let rig = KubeSiteRig::start().await;
    let site = rig.kube_site();
    rig.create_host("m-1", "master", &mac(1), "10.1.0.11").await;
    provision(&rig, &site, node("m-1", pb::Role::Master, 1, true), None).await;
    rig.put_cluster_kubeconfig().await;
    install(&site, vec![node("m-1", pb::Role::Master, 1, true)]).await;
    // The operator's own Secret (m-1's BMC credentials) and one landfall wrote for a host that
    // was deleted by hand since.
    let own: Secret = serde_json::from_value(json!({"metadata": {"name": "m-1-bmc-secret"},
                                                    "stringData": {"username": "admin"}}))
    .unwrap();
    secrets(&rig).create(&PostParams::default(), &own).await.unwrap();
    let leftover: Secret = serde_json::from_value(json!({"metadata": {"name": "w-7-user-data",
                                                         "labels": {marks::PURPOSE_LABEL: "user-data"}}}))
    .unwrap();
    secrets(&rig).create(&PostParams::default(), &leftover).await.unwrap();

    assert_eq!(site.host_names().await.unwrap(), ["m-1"]);
    for host in site.host_names().await.unwrap() {
        let (tx, _rx) = mpsc::unbounded_channel();
        assert!(site.deprovision_host(&host, Default::default(), tx).await.unwrap(), "{host}");
        assert!(site.forget_host(&host).await.unwrap(), "{host}");
    }
    assert!(site.host_names().await.unwrap().is_empty());
    assert!(rig.hosts().list(&ListParams::default()).await.unwrap().items.is_empty());

    let hosts_ini = rig.state_dir().join(SITE).join("hosts.ini");
    assert!(hosts_ini.exists());
    let gone = site.tear_down_cluster().await.unwrap();
    let mut expected = vec![
        format!("File/{}", hosts_ini.display()),
        format!("Provisioning/{SITE}"),
        format!("Secret/{CLUSTER_KUBECONFIG}"),
        "Secret/w-7-user-data".to_string(),
        format!("Software/{SITE}-software"),
    ];
    expected.sort();
    assert_eq!(gone, expected);

    assert!(bpa_api(&rig, &bpa::provisioning_resource()).list(&ListParams::default()).await.unwrap().items.is_empty());
    assert!(bpa_api(&rig, &bpa::software_resource()).list(&ListParams::default()).await.unwrap().items.is_empty());
    assert!(secrets(&rig).get_opt(CLUSTER_KUBECONFIG).await.unwrap().is_none());
    let ours = ListParams::default().labels(marks::PURPOSE_LABEL);
    let left: Vec<String> = secrets(&rig).list(&ours).await.unwrap().items.iter().map(ResourceExt::name_any).collect();
    assert!(left.is_empty(), "{left:?}");
    let all: Vec<String> =
        secrets(&rig).list(&ListParams::default()).await.unwrap().items.iter().map(ResourceExt::name_any).collect();
    assert_eq!(all, ["m-1-bmc-secret"], "the site's own Secret stays");
    assert!(!hosts_ini.exists());

    assert!(site.tear_down_cluster().await.unwrap().is_empty(), "nothing left to tear down");
    assert!(!site.delete_node("m-1").await.unwrap(), "no cluster any more");
}
