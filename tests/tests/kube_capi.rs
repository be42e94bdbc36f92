//! A Cluster API site's objects in a real API server serving the upstream Cluster API (1.13.5)
//! and CAPM3 (1.13.2) CRDs from `deploy/crds`: what landfall renders from a design is what their
//! schemas accept, applied server-side with the gateway's field manager; applied again it
//! changes nothing, and a new version changes only what it must. A bootstrap cluster that does
//! not serve those kinds is refused with what it lacks, before anything is written.

use std::time::Duration;

use bus_schema::domain::{ApiEndpoint, Builder, ClusterBuild, NodeSetRollout, Package, PackageRef, SiteDesign};
use bus_schema::names;
use bus_schema::pb::{self, BusEvent, BusMessage};
use bus_schema::runtime::{Envelope, ReadEvent};
use kube::ResourceExt;
use landfall_tests::fleet;
use landfall_tests::kube::KubeApiServer;
use landfall_tests::kube_site::capi::{CAPM3_CRDS, CLUSTER_API_CRDS};
use landfall_tests::kube_site::{APPS, KubeSiteRig, mac};
use serde_json::Value;
use site_gateway::capi::{RenderSettings, render};
use site_gateway::kube_site::marks;
use site_gateway::kube_site::{KubeSite, KubeSiteConfig};

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
        chart_values: Default::default(),
        maintenance_windows: Vec::new(),
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
        chart: None,
        render: None,
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

/// What Cluster API, CAPM3 and Metal3 write as they build the site (their controllers do not run
/// here): each host provisioned, a Machine and Metal3Machine per host with the claim between
/// them, each Node registered Ready at `kubelet`, the counts of the control plane and the
/// deployment, and the Cluster Available.
async fn built_by_cluster_api(kube: &KubeApiServer, applied: &[kube::api::DynamicObject], kubelet: &str) {
    use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
    use kube::core::GroupVersionKind;
    use serde_json::json;
    let client = kube.client().await;
    let resource = |group: &str, kind: &str| ApiResource::from_gvk(&GroupVersionKind::gvk(group, "v1beta2", kind));
    let machines: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), NAMESPACE, &resource("cluster.x-k8s.io", "Machine"));
    let metal3_machines: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), NAMESPACE, &resource("infrastructure.cluster.x-k8s.io", "Metal3Machine"));
    let hosts: Api<site_gateway::kube_site::metal3::BareMetalHost> = Api::namespaced(client.clone(), NAMESPACE);
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    for i in 1..=5 {
        let host = format!("node-{i}");
        let (role, owner) = if i <= 3 { ("master", "cp") } else { ("worker", "w") };
        let body = json!({ "apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost",
            "metadata": { "name": host, "namespace": NAMESPACE, "labels": { "landfall.io/role": role } },
            "spec": { "online": true, "bootMACAddress": format!("52:54:00:c1:00:{i:02x}"),
                      "bmc": { "address": format!("ipmi://10.0.1.{i}"), "credentialsName": format!("{host}-bmc") } } });
        hosts.create(&PostParams::default(), &serde_json::from_value(body).unwrap()).await.expect("a host");
        landfall_tests::kube_site::set_status(
            &hosts,
            &host,
            landfall_tests::kube_site::status("provisioned", None, None),
        )
        .await;
        let m3 = format!("{owner}-m3-{i}");
        let labels = json!({ "cluster.x-k8s.io/cluster-name": SITE });
        let body = json!({ "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "Metal3Machine",
            "metadata": { "name": m3, "namespace": NAMESPACE, "labels": labels,
                          "annotations": { "metal3.io/BareMetalHost": format!("{NAMESPACE}/{host}") } },
            "spec": { "image": { "url": "http://localhost:8080/sha256/x", "checksum": "x" } } });
        metal3_machines
            .create(&PostParams::default(), &serde_json::from_value(body).unwrap())
            .await
            .expect("a Metal3Machine");
        let machine = format!("{owner}-{i}");
        let body = json!({ "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": { "name": machine, "namespace": NAMESPACE, "labels": labels },
            "spec": { "clusterName": SITE, "version": kubelet,
                      "bootstrap": { "dataSecretName": format!("{machine}-bootstrap") },
                      "infrastructureRef": { "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "Metal3Machine", "name": m3 } } });
        machines.create(&PostParams::default(), &serde_json::from_value(body).unwrap()).await.expect("a Machine");
        let node_ref = json!({ "status": { "nodeRef": { "name": host } } });
        machines
            .patch_status(&machine, &PatchParams::default(), &Patch::Merge(&node_ref))
            .await
            .expect("the machine's node");
        let node = json!({ "apiVersion": "v1", "kind": "Node", "metadata": { "name": host },
            "status": { "conditions": [{ "type": "Ready", "status": "True" }], "nodeInfo": { "kubeletVersion": kubelet } } });
        nodes.create(&PostParams::default(), &serde_json::from_value(node).unwrap()).await.expect("a Node");
    }
    for object in applied {
        let kind = object.types.as_ref().unwrap().kind.clone();
        let replicas = object.data["spec"]["replicas"].as_i64().unwrap_or(0);
        let generation = object.metadata.generation.unwrap_or(1);
        let counts = json!({ "observedGeneration": generation, "replicas": replicas, "upToDateReplicas": replicas,
                             "readyReplicas": replicas, "availableReplicas": replicas });
        let patch = match kind.as_str() {
            "KubeadmControlPlane" => {
                json!({ "status": { "version": kubelet, "observedGeneration": generation, "replicas": replicas,
                "upToDateReplicas": replicas, "readyReplicas": replicas, "availableReplicas": replicas } })
            }
            "MachineDeployment" => json!({ "status": counts }),
            "Cluster" => {
                json!({ "status": { "conditions": [{ "type": "Available", "status": "True", "reason": "Available",
                "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z" }] } })
            }
            _ => continue,
        };
        let group = object.types.as_ref().unwrap().api_version.split('/').next().unwrap().to_string();
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), NAMESPACE, &resource(&group, &kind));
        api.patch_status(&object.metadata.name.clone().unwrap(), &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap_or_else(|e| panic!("the status of {kind}: {e}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_build_is_done_when_cluster_api_and_every_node_say_so_and_each_host_is_followed_to_its_node() {
    let kube = KubeApiServer::start().await;
    futures::future::join_all(CLUSTER_API_CRDS.iter().chain(&CAPM3_CRDS).map(|crd| kube.install_crd(crd))).await;
    let dir = tempfile::tempdir().unwrap();
    let site = backend(&kube, kube.client().await, dir.path());
    let applied = site.apply_capi(&objects("1.29.2")).await.unwrap();
    // Nothing built yet: waited for, never taken for done.
    let before = site_gateway::capi::observe(&site.capi_observed(SITE).await.unwrap(), "v1.29.2");
    assert!(!before.done());
    assert!(before.waiting.iter().any(|w| w.starts_with("Cluster edge-c1 is not Available")), "{:?}", before.waiting);

    // The workload cluster is this API server: its kubeconfig where Cluster API writes it.
    let kubeconfig = k8s_openapi::api::core::v1::Secret {
        metadata: kube::api::ObjectMeta { name: Some(format!("{SITE}-kubeconfig")), ..Default::default() },
        data: Some(
            [("value".to_string(), k8s_openapi::ByteString(std::fs::read(kube.kubeconfig_path()).unwrap()))].into(),
        ),
        ..Default::default()
    };
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> = kube::Api::namespaced(kube.client().await, NAMESPACE);
    secrets.create(&Default::default(), &kubeconfig).await.expect("the workload cluster's kubeconfig");
    built_by_cluster_api(&kube, &applied, "v1.29.2").await;
    let observed = site.capi_observed(SITE).await.unwrap();
    let progress = site_gateway::capi::observe(&observed, "v1.29.2");
    assert!(progress.done(), "{:?}", progress.waiting);
    let hosts: Vec<(&str, &str, bool)> =
        progress.hosts.iter().map(|(h, p)| (h.as_str(), p.machine.as_str(), p.ready)).collect();
    assert_eq!(
        hosts,
        [
            ("node-1", "cp-1", true),
            ("node-2", "cp-2", true),
            ("node-3", "cp-3", true),
            ("node-4", "w-4", true),
            ("node-5", "w-5", true)
        ]
    );
    // Against the next version, the same objects are short of it, and say where.
    let next = site_gateway::capi::observe(&observed, "v1.29.3");
    assert!(
        next.waiting.contains(&"node-4: Node node-4 runs kubelet v1.29.2, not v1.29.3".to_string()),
        "{:?}",
        next.waiting
    );
    assert!(
        next.waiting
            .iter()
            .any(|w| w.contains("KubeadmControlPlane edge-c1-control-plane wants 3 (at v1.29.2, not yet v1.29.3)")),
        "{:?}",
        next.waiting
    );
}

/// Waits until the bus holds `n` events of type `M`.
async fn wait_events<M: pb::BusMessage + prost::Message + Default>(rig: &KubeSiteRig, n: usize) -> Vec<M> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let found = rig.events::<M>().await;
        if found.len() >= n || tokio::time::Instant::now() > deadline {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Installs the rig's site; every event of the install, in order, up to its end.
async fn install(rig: &KubeSiteRig) -> Vec<ReadEvent> {
    rig.install(Duration::from_secs(120)).await
}

fn of_type<M: pb::BusMessage>(events: &[ReadEvent]) -> Vec<M> {
    events.iter().filter(|e| e.delivery.type_name == M::TYPE).map(|e| e.delivery.decode().unwrap()).collect()
}

const CAPI_HOSTS: [(&str, &str, u8, &str); 5] = [
    ("m-1", "master", 1, "10.1.0.11"),
    ("m-2", "master", 2, "10.1.0.12"),
    ("m-3", "master", 3, "10.1.0.13"),
    ("w-1", "worker", 4, "10.1.0.21"),
    ("w-2", "worker", 5, "10.1.0.22"),
];

/// Through the real hub and the real `landfall-gateway --backend kube`: a site of three masters
/// and two workers built by Cluster API. The gateway enrolls each host and applies the objects
/// rendered from the design; Cluster API (played) makes the machines, the control plane one at a
/// time, and CAPM3 claims the hosts; each host's Metal3 states reach the hub; the install is done
/// once Cluster API shows the cluster standing and every Node Ready at its version; the
/// kubeconfig Cluster API wrote is collected and the container package goes to the workload
/// cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_api_site_is_installed_through_the_bus_and_done_when_cluster_api_shows_it_standing() {
    let mut rig = KubeSiteRig::start_capi().await;
    create_hosts(&rig).await;
    // The gateway announces the hosts, which the design has already.
    start_gateway(&mut rig).await;

    let events = install(&rig).await;
    let kinds: Vec<&str> = events.iter().map(|e| e.delivery.type_name.as_str()).collect();
    assert_eq!(
        kinds.last(),
        Some(&pb::SiteInstalled::TYPE),
        "{kinds:?}\n{:?}\n{:?}\n{}",
        of_type::<pb::NodeFailed>(&events),
        rig.capi.log(),
        rig.gateway_log()
    );
    let done: Vec<pb::SiteInstalled> = of_type(&events);
    assert!(done[0].results.iter().all(|r| r.outcome == pb::NodeOutcome::Succeeded as i32), "{done:?}");
    assert_eq!(done[0].results.len(), 5);

    // Each host's Metal3 states, as CAPM3 had it provisioned, reached the hub.
    for (name, ..) in CAPI_HOSTS {
        let states: Vec<String> = of_type::<pb::NodeOsProvisioning>(&events)
            .into_iter()
            .filter(|e| e.node == name)
            .map(|e| e.state)
            .collect();
        assert!(states.ends_with(&["provisioning".to_string(), "provisioned".to_string()]), "{name}: {states:?}");
    }
    assert_eq!(of_type::<pb::ClusterReady>(&events).len(), 1);

    // Cluster API made the machines: the control plane one at a time, each claiming a host of
    // its role.
    let log = rig.capi.log();
    let claims: Vec<&String> = log.iter().filter(|l| l.contains(" claimed ")).collect();
    assert_eq!(claims.len(), 5, "{log:?}");
    for claim in &claims {
        let (machine, host) = claim.split_once(" claimed ").unwrap();
        assert_eq!(machine.contains("control-plane"), host.starts_with("m-"), "{claim}");
    }
    let made_cp: Vec<usize> =
        log.iter().enumerate().filter(|(_, l)| l.starts_with("+edge-k1-control-plane")).map(|(i, _)| i).collect();
    let nodes_cp: Vec<usize> = log
        .iter()
        .enumerate()
        .filter(|(_, l)| l.starts_with("edge-k1-control-plane") && l.contains(" node "))
        .map(|(i, _)| i)
        .collect();
    assert_eq!((made_cp.len(), nodes_cp.len()), (3, 3), "{log:?}");
    assert!(nodes_cp[0] < made_cp[1] && nodes_cp[1] < made_cp[2], "one master at a time: {log:?}");

    // Every host was enrolled by landfall with its role, and provisioned with the image of the
    // design's os-image that CAPM3 wrote.
    let ubuntu = producers::up::demo_packages().into_iter().find(|p| p.name == "ubuntu").unwrap();
    for (name, role, ..) in CAPI_HOSTS {
        let host = rig.hosts().get(name).await.unwrap();
        assert_eq!(host.labels().get("landfall.io/role").map(String::as_str), Some(role));
        let image = host.spec.image.as_ref().expect("the image CAPM3 wrote");
        assert_eq!(image.url, format!("http://10.0.0.2:8080/sha256/{}", ubuntu.sha256));
        assert_eq!(host.annotations().get(&marks::package("ubuntu")).map(String::as_str), Some("22.04.4"));
    }

    // The kubeconfig Cluster API wrote reached the hub: the container package is in the
    // workload cluster, not the bootstrap one.
    let workload = rig.workload.as_ref().unwrap().client().await;
    let res =
        kube::api::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk("apps.landfall.test", "v1", "Widget"));
    let in_workload: kube::Api<kube::api::DynamicObject> = kube::Api::namespaced_with(workload, APPS, &res);
    let names: Vec<String> =
        in_workload.list(&Default::default()).await.unwrap().iter().map(|w| w.name_any()).collect();
    assert_eq!(names, ["alpha", "beta"]);
    let in_bootstrap: kube::Api<kube::api::DynamicObject> = kube::Api::namespaced_with(rig.client.clone(), APPS, &res);
    assert!(in_bootstrap.list(&Default::default()).await.unwrap().items.is_empty());
}

/// The site's five hosts, as an operator registers them with Metal3.
async fn create_hosts(rig: &KubeSiteRig) {
    for (name, role, i, ip) in CAPI_HOSTS {
        rig.create_host(name, role, &mac(i), ip).await;
    }
}

/// Starts the gateway and waits until the hub has heard of the five hosts from it.
async fn start_gateway(rig: &mut KubeSiteRig) {
    rig.start_gateway();
    let accepted = wait_events::<pb::NodeAccepted>(rig, 5).await;
    assert_eq!(accepted.len(), 5, "{accepted:?}\n{}", rig.gateway_log());
}

/// The rig's Cluster API site with its five hosts, installed.
async fn installed_site() -> KubeSiteRig {
    let mut rig = KubeSiteRig::start_capi().await;
    create_hosts(&rig).await;
    start_gateway(&mut rig).await;
    let installed = install(&rig).await;
    let kinds: Vec<&str> = installed.iter().map(|e| e.delivery.type_name.as_str()).collect();
    assert_eq!(kinds.last(), Some(&pb::SiteInstalled::TYPE), "{kinds:?}\n{}", rig.gateway_log());
    rig
}

/// Registers `package` and rolls every node of the rig's site to it, `max_unavailable` at once;
/// the rollout's events.
async fn patch(rig: &KubeSiteRig, package: pb::Package, max_unavailable: u32) -> Vec<ReadEvent> {
    let registered = Envelope::root();
    let cmd = pb::RegisterPackage { package: Some(package.clone()), auto_rollout: None };
    rig.bus.publish_command(&cmd, &registered).await.unwrap();
    rig.wait_for(pb::PackageRegistered::filter(), &registered.id).await.expect("registered");
    let env = Envelope::root();
    let strategy = pb::RolloutStrategy { max_unavailable: max_unavailable.to_string(), ..Default::default() };
    let cmd = pb::PatchPackage {
        name: package.name,
        version: package.version,
        strategy: Some(strategy),
        ..Default::default()
    };
    rig.bus.publish_command(&cmd, &env).await.unwrap();
    let ends = [pb::RolloutCompleted::TYPE, pb::RolloutHalted::TYPE, pb::CommandRejected::TYPE];
    fleet::collect(&rig.bus, names::EVENTS_ALL.into(), "rollout", &env.id, &ends, Duration::from_secs(180)).await.events
}

/// The Cluster API objects of `kind` in the rig's bootstrap cluster.
async fn capi_objects(rig: &KubeSiteRig, group: &str, kind: &str) -> Vec<kube::api::DynamicObject> {
    let res = kube::api::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(group, "v1beta2", kind));
    let api: kube::Api<kube::api::DynamicObject> =
        kube::Api::namespaced_with(rig.client.clone(), landfall_tests::kube_site::NAMESPACE, &res);
    api.list(&Default::default()).await.unwrap().items
}

/// A Cluster API site rolls a new Kubernetes version, then a new image, through Cluster API: one
/// write of each node set's version, then a new machine template and one write of each set's
/// reference to it. Cluster API replaces the machines (the masters one at a time, each deleted
/// before its replacement: three masters roll without a spare host); each node is reported
/// patched once a machine up to date stands on its host with its Node Ready at the version.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_api_site_rolls_a_kubernetes_version_and_an_image_through_its_node_sets() {
    let rig = installed_site().await;
    let templates_before: Vec<String> = capi_objects(&rig, "infrastructure.cluster.x-k8s.io", "Metal3MachineTemplate")
        .await
        .iter()
        .map(|t| t.name_any())
        .collect();
    let installed_log = rig.capi.log().len();

    // A Kubernetes version.
    let demo = producers::up::demo_packages();
    let kubelet =
        pb::Package { version: "1.29.3".into(), ..demo.iter().find(|p| p.name == "kubelet").unwrap().clone() };
    let rollout = patch(&rig, kubelet, 1).await;
    let kinds: Vec<&str> = rollout.iter().map(|e| e.delivery.type_name.as_str()).collect();
    assert_eq!(
        kinds.last(),
        Some(&pb::RolloutCompleted::TYPE),
        "{kinds:?}\n{:?}\n{:?}\n{}",
        of_type::<pb::NodePatchFailed>(&rollout),
        rig.capi.log(),
        rig.gateway_log()
    );
    let patched: Vec<pb::NodePatched> = landfall_tests::fleet::node_reports(&rollout);
    let mut nodes: Vec<(&str, &str)> = patched.iter().map(|p| (p.node.as_str(), p.from_version.as_str())).collect();
    nodes.sort();
    assert_eq!(nodes, [("m-1", "1.29.2"), ("m-2", "1.29.2"), ("m-3", "1.29.2"), ("w-1", "1.29.2"), ("w-2", "1.29.2")]);
    let cp = capi_objects(&rig, "controlplane.cluster.x-k8s.io", "KubeadmControlPlane").await;
    assert_eq!(cp[0].data["spec"]["version"], "v1.29.3");
    assert_eq!(cp[0].data["status"]["version"], "v1.29.3");
    let md = capi_objects(&rig, "cluster.x-k8s.io", "MachineDeployment").await;
    assert_eq!(md[0].data["spec"]["template"]["spec"]["version"], "v1.29.3");
    // Every machine replaced once, each master deleted before its replacement was made.
    let log: Vec<String> = rig.capi.log()[installed_log..].to_vec();
    let made: Vec<&String> = log.iter().filter(|l| l.starts_with('+')).collect();
    let deleted: Vec<&String> = log.iter().filter(|l| l.starts_with('-')).collect();
    assert_eq!((made.len(), deleted.len()), (5, 5), "{log:?}");
    let masters: Vec<&String> = log
        .iter()
        .filter(|l| l.starts_with("+edge-k1-control-plane") || l.starts_with("-edge-k1-control-plane"))
        .collect();
    assert!(masters.iter().step_by(2).all(|l| l.starts_with('-')), "delete first: {masters:?}");
    let workload = rig.workload.as_ref().unwrap().client().await;
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(workload);
    for n in nodes.list(&Default::default()).await.unwrap() {
        let name = n.name_any();
        assert_eq!(n.status.unwrap().node_info.unwrap().kubelet_version, "v1.29.3", "{name}");
    }

    // An image: a new template for each set, the hosts provisioned with it.
    let ubuntu = pb::Package {
        version: "22.04.5".into(),
        sha256: "5".repeat(64),
        ..demo.iter().find(|p| p.name == "ubuntu").unwrap().clone()
    };
    let rollout = patch(&rig, ubuntu, 2).await;
    let kinds: Vec<&str> = rollout.iter().map(|e| e.delivery.type_name.as_str()).collect();
    assert_eq!(kinds.last(), Some(&pb::RolloutCompleted::TYPE), "{kinds:?}\n{}", rig.gateway_log());
    assert_eq!(landfall_tests::fleet::node_reports(&rollout).len(), 5);
    let templates: Vec<String> = capi_objects(&rig, "infrastructure.cluster.x-k8s.io", "Metal3MachineTemplate")
        .await
        .iter()
        .map(|t| t.name_any())
        .collect();
    assert_eq!(templates.len(), templates_before.len() + 2, "{templates:?}");
    let cp = capi_objects(&rig, "controlplane.cluster.x-k8s.io", "KubeadmControlPlane").await;
    let used = cp[0].data["spec"]["machineTemplate"]["spec"]["infrastructureRef"]["name"].as_str().unwrap().to_string();
    assert!(!templates_before.contains(&used), "{used}");
    let md = capi_objects(&rig, "cluster.x-k8s.io", "MachineDeployment").await;
    assert_eq!(
        md[0].data["spec"]["rollout"]["strategy"]["rollingUpdate"]["maxUnavailable"], 2,
        "the rollout's max_unavailable"
    );
    for (name, ..) in CAPI_HOSTS {
        let host = rig.hosts().get(name).await.unwrap();
        assert_eq!(host.provisioned_image().unwrap().url, format!("http://10.0.0.2:8080/sha256/{}", "5".repeat(64)));
        assert_eq!(host.annotations().get(&marks::package("ubuntu")).map(String::as_str), Some("22.04.5"));
    }
    // Metal3's states of each reimage reached the hub.
    let states: Vec<String> =
        of_type::<pb::NodeOsProvisioning>(&rollout).into_iter().filter(|e| e.node == "w-1").map(|e| e.state).collect();
    assert!(states.ends_with(&["provisioning".to_string(), "provisioned".to_string()]), "{states:?}");
}

/// Runs a lifecycle command at the rig's site: its events, up to one of `ends`.
async fn run<C: pb::BusCommand>(rig: &KubeSiteRig, cmd: &C, ends: &[&str]) -> (Envelope, Vec<ReadEvent>) {
    let env = Envelope::root();
    rig.bus.publish_command(cmd, &env).await.unwrap();
    let scope = names::scope_events(landfall_tests::kube_site::SITE);
    let events = fleet::collect(&rig.bus, scope, "operation", &env.id, ends, Duration::from_secs(120)).await.events;
    (env, events)
}

fn last_is<M: pb::BusMessage>(rig: &KubeSiteRig, events: &[ReadEvent]) -> M {
    let kinds: Vec<&str> = events.iter().map(|e| e.delivery.type_name.as_str()).collect();
    let e = events.last().unwrap_or_else(|| panic!("no event\n{:?}\n{}", rig.capi.log(), rig.gateway_log()));
    assert_eq!(e.delivery.type_name, M::TYPE, "{kinds:?}\n{:?}\n{}", rig.capi.log(), rig.gateway_log());
    e.delivery.decode().unwrap()
}

/// A Cluster API site changed node by node through Cluster API, then decommissioned: a host
/// added joins by its worker group growing by one; a node removed is its machine marked and the
/// group one smaller, the host freed and deleted; a reprovisioned node is its machine replaced,
/// on the same host; a master whose removal would leave an even control plane is refused before
/// anything is touched; a decommission deletes the Cluster, waits until Cluster API has taken it
/// down, then the hosts and what landfall wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_api_site_changes_node_by_node_and_is_decommissioned_through_cluster_api() {
    use landfall_tests::kube_site::SITE;
    let rig = installed_site().await;
    let replicas = |objects: Vec<kube::api::DynamicObject>| objects[0].data["spec"]["replicas"].as_i64().unwrap();

    // A new host: announced, enrolled, and claimed by the worker group one larger.
    rig.create_host("w-3", "worker", &mac(6), "10.1.0.23").await;
    let joined = wait_events::<pb::NodeReady>(&rig, 1).await;
    assert_eq!(joined.iter().map(|r| r.node.as_str()).collect::<Vec<_>>(), ["w-3"], "{}", rig.gateway_log());
    assert_eq!(replicas(capi_objects(&rig, "cluster.x-k8s.io", "MachineDeployment").await), 3);
    assert!(rig.capi.log().iter().any(|l| l.ends_with(" claimed w-3")), "{:?}", rig.capi.log());

    // w-1 removed: its machine goes first, the group shrinks, the host is freed and deleted.
    let remove = |node: &str| pb::RemoveNode { site_id: SITE.into(), node: node.into(), reason: "retired".into() };
    let remove_ends = [pb::NodeLeft::TYPE, pb::LifecycleFailed::TYPE, pb::CommandRejected::TYPE];
    let (_, removed) = run(&rig, &remove("w-1"), &remove_ends).await;
    last_is::<pb::NodeLeft>(&rig, &removed);
    assert_eq!(replicas(capi_objects(&rig, "cluster.x-k8s.io", "MachineDeployment").await), 2);
    assert!(rig.hosts().get_opt("w-1").await.unwrap().is_none(), "w-1's host is deleted");
    let log = rig.capi.log();
    let deleted: Vec<&String> = log.iter().filter(|l| l.starts_with('-')).collect();
    assert_eq!(deleted.len(), 1, "one machine deleted, none made for it: {log:?}");
    assert!(deleted[0].ends_with(" w-1"), "{log:?}");

    // w-2 reprovisioned: its machine replaced, on the same host, and the node joins again.
    let made_before = rig.capi.log().iter().filter(|l| l.starts_with('+')).count();
    let cmd = pb::ReprovisionNode { site_id: SITE.into(), node: "w-2".into(), reason: "suspect disk".into() };
    let (env, wiped) = run(&rig, &cmd, &[pb::NodeRetired::TYPE, pb::LifecycleFailed::TYPE]).await;
    let retired: pb::NodeRetired = last_is(&rig, &wiped);
    assert!(retired.host_deprovisioned && !retired.host_deleted, "{retired:?}");
    let rejoin = bus_schema::ids::derived_id(&env.id, "rejoin", Some("w-2")).to_string();
    let ends = [pb::NodeReady::TYPE, pb::NodeJoinFailed::TYPE];
    let scope = names::scope_events(SITE);
    let again = fleet::collect(&rig.bus, scope, "rejoin", &rejoin, &ends, Duration::from_secs(120)).await;
    last_is::<pb::NodeReady>(&rig, &again.events);
    let log = rig.capi.log();
    assert_eq!(log.iter().filter(|l| l.starts_with('+')).count(), made_before + 1, "{log:?}");
    assert!(log.last_chunk::<3>().is_some_and(|l| l.iter().any(|l| l.ends_with("node w-2"))), "{log:?}");
    assert_eq!(replicas(capi_objects(&rig, "cluster.x-k8s.io", "MachineDeployment").await), 2);

    // A master's removal would leave two: refused, nothing touched.
    let (_, refused) = run(&rig, &remove("m-3"), &remove_ends).await;
    let failed: pb::LifecycleFailed = last_is(&rig, &refused);
    assert!(failed.reason.contains("odd"), "{}", failed.reason);
    assert_eq!(replicas(capi_objects(&rig, "controlplane.cluster.x-k8s.io", "KubeadmControlPlane").await), 3);
    assert_eq!(
        rig.hosts().get("m-3").await.unwrap().labels().get("landfall.io/role").map(String::as_str),
        Some("master")
    );

    // Decommissioned: the Cluster taken down by Cluster API first, then the hosts.
    let cmd = pb::DecommissionSite { site_id: SITE.into(), reason: "site closed".into() };
    let (_, gone) = run(&rig, &cmd, &[pb::SiteDecommissioned::TYPE, pb::LifecycleFailed::TYPE]).await;
    let done: pb::SiteDecommissioned = last_is(&rig, &gone);
    assert!(done.resources.contains(&format!("Cluster/{SITE}")), "{:?}", done.resources);
    assert!(done.resources.iter().any(|r| r.starts_with("Metal3MachineTemplate/")), "{:?}", done.resources);
    assert!(rig.capi.log().contains(&format!("cluster {SITE} down")));
    for (group, kind) in [
        ("cluster.x-k8s.io", "Cluster"),
        ("cluster.x-k8s.io", "Machine"),
        ("cluster.x-k8s.io", "MachineDeployment"),
        ("controlplane.cluster.x-k8s.io", "KubeadmControlPlane"),
        ("infrastructure.cluster.x-k8s.io", "Metal3Machine"),
        ("infrastructure.cluster.x-k8s.io", "Metal3MachineTemplate"),
    ] {
        assert!(capi_objects(&rig, group, kind).await.is_empty(), "{kind}s are left");
    }
    assert!(rig.hosts().list(&Default::default()).await.unwrap().items.is_empty(), "every host is gone");
}

/// What Cluster API and Metal3 say when a node cannot come up reaches the hub as the node's
/// failure, within the install's time-out: a host Metal3 fails (its error message), and a machine
/// no free host is left for (CAPM3's `AssociateBMH` condition). The other nodes stand: a partial
/// success.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_api_node_that_cannot_come_up_fails_with_what_cluster_api_and_metal3_said() {
    let mut rig = KubeSiteRig::start_capi().await;
    (rig.provision_timeout, rig.install_timeout) = ("30s".into(), "30s".into());
    create_hosts(&rig).await;
    rig.metal3.failing.lock().unwrap().insert("w-1".into(), "no disk matches the root device hints".into());
    // w-2's host is held by a machine of another cluster.
    let held = serde_json::json!({"spec": {"consumerRef": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2",
        "kind": "Metal3Machine", "name": "other-cluster-7", "namespace": landfall_tests::kube_site::NAMESPACE}}});
    rig.hosts().patch("w-2", &Default::default(), &kube::api::Patch::Merge(&held)).await.unwrap();
    start_gateway(&mut rig).await;

    let events = install(&rig).await;
    let kinds: Vec<&str> = events.iter().map(|e| e.delivery.type_name.as_str()).collect();
    assert_eq!(kinds.last(), Some(&pb::SiteInstallFailed::TYPE), "{kinds:?}\n{}", rig.gateway_log());
    let failed: pb::SiteInstallFailed = events.last().unwrap().delivery.decode().unwrap();
    assert_eq!(failed.outcome, pb::InstallOutcome::PartialSuccess as i32, "{failed:?}");
    assert_eq!(failed.failed_nodes, ["w-1", "w-2"], "{failed:?}");
    let reason = |node: &str| failed.results.iter().find(|r| r.node == node).unwrap().reason.clone();
    assert!(reason("w-1").contains("no disk matches the root device hints"), "{}", reason("w-1"));
    assert!(reason("w-2").contains("no available host matches the host selector"), "{}", reason("w-2"));
    assert!(reason("w-2").contains("30s"), "{}", reason("w-2"));
}

/// A bootstrap cluster that does not serve the Cluster API and CAPM3 kinds landfall writes: the
/// install is refused with what it lacks, and no host is touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_api_site_whose_bootstrap_cluster_lacks_the_providers_is_refused_before_anything_is_written() {
    let mut rig = KubeSiteRig::start_capi_without_providers().await;
    create_hosts(&rig).await;
    start_gateway(&mut rig).await;
    let events = install(&rig).await;
    let kinds: Vec<&str> = events.iter().map(|e| e.delivery.type_name.as_str()).collect();
    assert_eq!(kinds.last(), Some(&pb::SiteInstallFailed::TYPE), "{kinds:?}\n{}", rig.gateway_log());
    // Where it is said depends on which failure the hub heard first: the build's (the install's
    // reason), or every host's enrollment (each node's).
    let failed: pb::SiteInstallFailed = events.last().unwrap().delivery.decode().unwrap();
    let refusal = "does not serve cluster.x-k8s.io/v1beta2 Cluster";
    assert!(failed.reason.contains(refusal) || failed.results.iter().all(|r| r.reason.contains(refusal)), "{failed:?}");
    assert_eq!(failed.failed_nodes.len(), 5);
    for (name, ..) in CAPI_HOSTS {
        let host = rig.hosts().get(name).await.unwrap();
        assert!(!host.annotations().contains_key(marks::NODE), "{name} was written to");
        assert!(host.spec.image.is_none(), "{name} was given an image");
    }
}

/// A node set that rolls with a surge needs a free host for its extra machine; without one at
/// the site, its nodes fail at once with the reason, and nothing is changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_set_that_surges_without_a_free_host_is_refused_at_once() {
    let rig = installed_site().await;
    let res = kube::api::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
        "cluster.x-k8s.io",
        "v1beta2",
        "MachineDeployment",
    ));
    let deployments: kube::Api<kube::api::DynamicObject> =
        kube::Api::namespaced_with(rig.client.clone(), landfall_tests::kube_site::NAMESPACE, &res);
    let surge = serde_json::json!({"spec": {"rollout": {"strategy": {"rollingUpdate": {"maxSurge": 1}}}}});
    deployments.patch("edge-k1-workers", &Default::default(), &kube::api::Patch::Merge(&surge)).await.unwrap();
    let demo = producers::up::demo_packages();
    let kubelet =
        pb::Package { version: "1.29.3".into(), ..demo.iter().find(|p| p.name == "kubelet").unwrap().clone() };
    let rollout = patch(&rig, kubelet, 1).await;
    let failed: Vec<pb::NodePatchFailed> = of_type(&rollout);
    assert!(!failed.is_empty(), "{}", rig.gateway_log());
    assert!(failed[0].node.starts_with("w-") && failed[0].reason.contains("maxSurge 1"), "{failed:?}");
    let md = capi_objects(&rig, "cluster.x-k8s.io", "MachineDeployment").await;
    assert_eq!(md[0].data["spec"]["template"]["spec"]["version"], "v1.29.2", "the workers were not changed");
}

/// A node's removal whose gateway is killed while Cluster API takes its machine down is taken up
/// by the next gateway and finished once: the worker group one smaller, not two, one machine
/// deleted and none made, the host deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_removal_cut_by_a_gateway_kill_is_taken_up_and_shrinks_its_set_once() {
    use landfall_tests::kube_site::SITE;
    let mut rig = installed_site().await;
    let made_before = rig.capi.log().iter().filter(|l| l.starts_with('+')).count();
    // w-1's host stays deprovisioning: its machine cannot be gone before the gateway is killed.
    rig.metal3.hold("w-1", "deprovisioning");
    let env = Envelope::root();
    let cmd = pb::RemoveNode { site_id: SITE.into(), node: "w-1".into(), reason: "retired".into() };
    rig.bus.publish_command(&cmd, &env).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !rig.capi.log().iter().any(|l| l.starts_with('-') && l.ends_with(" w-1")) {
        assert!(tokio::time::Instant::now() < deadline, "{:?}\n{}", rig.capi.log(), rig.gateway_log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    rig.kill_gateway();
    rig.start_gateway();
    rig.metal3.release("w-1", "deprovisioning");

    let ends = [pb::NodeLeft::TYPE, pb::LifecycleFailed::TYPE, pb::CommandRejected::TYPE];
    let scope = names::scope_events(SITE);
    let removed = fleet::collect(&rig.bus, scope, "removal", &env.id, &ends, Duration::from_secs(120)).await.events;
    last_is::<pb::NodeLeft>(&rig, &removed);
    let md = capi_objects(&rig, "cluster.x-k8s.io", "MachineDeployment").await;
    assert_eq!(md[0].data["spec"]["replicas"], 1, "one smaller, once");
    let log = rig.capi.log();
    assert_eq!(log.iter().filter(|l| l.starts_with('-')).count(), 1, "{log:?}");
    assert_eq!(log.iter().filter(|l| l.starts_with('+')).count(), made_before, "no machine made: {log:?}");
    assert!(rig.hosts().get_opt("w-1").await.unwrap().is_none(), "w-1's host is deleted");
    assert!(rig.hosts().get_opt("w-2").await.unwrap().is_some());
}
