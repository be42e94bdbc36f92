//! The gateway's kube backend against a real Kubernetes API server with the upstream Metal3 and
//! BPA CRDs: the real `landfall-gateway --backend kube`, the real hub on a real nats-server,
//! and stand-ins only for Metal3's operator and the BPA's cluster build.

use std::collections::BTreeMap;
use std::time::Duration;

use async_nats::jetstream::consumer::DeliverPolicy;
use bus_schema::names;
use bus_schema::pb::{self, BusEvent, BusMessage};
use bus_schema::runtime::{Envelope, ReadEvent};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject};
use landfall_tests::bpa_rest::BpaRest;
use landfall_tests::fleet::{self, node_steps};
use landfall_tests::kube_site::{APPS, KubeSiteRig, NAMESPACE, SITE, mac};
use serde_json::json;
use site_gateway::kube_site::{FIELD_MANAGER, bpa, marks};

const INSTALL_TIMEOUT: Duration = Duration::from_secs(90);

/// Installs the site and returns every event of the install, in order, up to its end.
async fn install(rig: &KubeSiteRig) -> Vec<ReadEvent> {
    rig.install(INSTALL_TIMEOUT).await
}

/// Registers `package` and rolls every node of the site to it; the rollout's events.
async fn patch(rig: &KubeSiteRig, package: pb::Package) -> Vec<ReadEvent> {
    patch_with(rig, package, 0).await
}

/// [`patch`], one node at a time, with `failures` nodes allowed to fail before the rest are
/// skipped (0: the default).
async fn patch_with(rig: &KubeSiteRig, package: pb::Package, failures: u32) -> Vec<ReadEvent> {
    let registered = Envelope::root();
    let cmd = pb::RegisterPackage { package: Some(package.clone()), auto_rollout: None };
    rig.bus.publish_command(&cmd, &registered).await.unwrap();
    rig.wait_for(pb::PackageRegistered::filter(), &registered.id).await.expect("registered");
    let env = Envelope::root();
    let strategy = (failures > 0).then(|| pb::RolloutStrategy {
        max_unavailable: "1".into(),
        failure_threshold: failures.to_string(),
        ..Default::default()
    });
    let cmd = pb::PatchPackage { name: package.name, version: package.version, strategy, ..Default::default() };
    rig.bus.publish_command(&cmd, &env).await.unwrap();
    let ends = [pb::RolloutCompleted::TYPE, pb::RolloutHalted::TYPE, pb::CommandRejected::TYPE];
    fleet::collect(&rig.bus, names::EVENTS_ALL.into(), "rollout", &env.id, &ends, INSTALL_TIMEOUT).await.events
}

fn of_type<M: BusMessage>(events: &[ReadEvent]) -> Vec<M> {
    events.iter().filter(|e| e.delivery.type_name == M::TYPE).map(|e| e.delivery.decode().unwrap()).collect()
}

fn types(events: &[ReadEvent]) -> Vec<String> {
    events.iter().map(|e| e.delivery.type_name.clone()).collect()
}

/// Waits until the commands stream holds `n` commands of type `M`.
async fn wait_commands<M: pb::BusMessage + prost::Message + Default>(rig: &KubeSiteRig, n: usize) -> Vec<M> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let found = rig.commands::<M>().await;
        if found.len() >= n || tokio::time::Instant::now() > deadline {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn resource_versions(rig: &KubeSiteRig) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for h in rig.hosts().list(&Default::default()).await.unwrap() {
        out.insert(format!("BareMetalHost/{}", h.name_any()), h.resource_version().unwrap());
    }
    for (kind, res) in [("Provisioning", bpa::provisioning_resource()), ("Software", bpa::software_resource())] {
        let api: Api<DynamicObject> = Api::namespaced_with(rig.client.clone(), NAMESPACE, &res);
        for o in api.list(&Default::default()).await.unwrap() {
            out.insert(format!("{kind}/{}", o.name_any()), o.resource_version().unwrap());
        }
    }
    for w in widgets(rig).list(&Default::default()).await.unwrap() {
        out.insert(format!("Widget/{}", w.name_any()), w.resource_version().unwrap());
    }
    out
}

fn widgets(rig: &KubeSiteRig) -> Api<DynamicObject> {
    let res = kube::api::ApiResource {
        group: "apps.landfall.test".into(),
        version: "v1".into(),
        api_version: "apps.landfall.test/v1".into(),
        kind: "Widget".into(),
        plural: "widgets".into(),
    };
    Api::namespaced_with(rig.client.clone(), APPS, &res)
}

/// Three hosts appear and are announced with their hardware, the site installs through Metal3
/// and the BPA, every host's spec and the BPA's resources and inventory say what the design
/// says, and installing again changes no object.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_new_hosts_are_announced_and_the_site_installs_through_metal3_and_the_bpa() {
    let mut rig = KubeSiteRig::start().await;
    let bpa_rest = BpaRest::start().await;
    rig.bpa_url = Some(bpa_rest.url());
    rig.start_gateway();
    let hosts =
        [("m-1", "master", 1, "10.1.0.11"), ("w-1", "worker", 2, "10.1.0.21"), ("w-2", "worker", 3, "10.1.0.22")];
    for (name, role, i, ip) in hosts {
        rig.create_host(name, role, &mac(i), ip).await;
    }

    // Every host becomes a NodeAdded carrying its boot MAC, BMC and inspected hardware.
    let added = wait_commands::<pb::NodeAdded>(&rig, 3).await;
    assert_eq!(added.len(), 3, "NodeAdded commands: {added:?}\n{}", rig.gateway_log());
    for (name, role, i, ip) in hosts {
        let cmd = added.iter().find(|c| c.node.as_ref().unwrap().name == name).expect("announced");
        let node = cmd.node.as_ref().unwrap();
        assert_eq!(node.boot_mac, mac(i));
        let want_role = if role == "master" { pb::Role::Master } else { pb::Role::Worker };
        assert_eq!(node.role, want_role as i32);
        assert!(node.bmc_address.starts_with("redfish://10.9.0."), "{}", node.bmc_address);
        let hw = cmd.hardware.as_ref().expect("hardware");
        assert_eq!((hw.cpu_count, hw.ram_mib, hw.manufacturer.as_str()), (40, 196608, "Dell Inc."));
        assert_eq!(hw.nics.iter().find(|n| n.mac == mac(i)).map(|n| n.ip.as_str()), Some(ip));
    }
    let design = rig.wait_design(|n| n.len() == 3).await;
    assert_eq!(design.into_iter().collect::<Vec<_>>(), ["m-1", "w-1", "w-2"]);

    let events = install(&rig).await;
    let kinds = types(&events);
    assert_eq!(kinds.last().map(String::as_str), Some(pb::SiteInstalled::TYPE), "{kinds:?}\n{}", rig.gateway_log());
    // Metal3's states reached the bus, in order, for every host.
    for (name, ..) in hosts {
        let states: Vec<String> = events
            .iter()
            .filter(|e| e.delivery.type_name == pb::NodeOsProvisioning::TYPE)
            .map(|e| e.delivery.decode::<pb::NodeOsProvisioning>().unwrap())
            .filter(|e| e.node == name)
            .map(|e| e.state)
            .collect();
        assert_eq!(states.first().map(String::as_str), Some("available"), "{name}: {states:?}");
        assert!(states.ends_with(&["provisioning".to_string(), "provisioned".to_string()]), "{name}: {states:?}");
    }

    // Every host's spec as the gateway set it, beside what the operator set.
    let ubuntu = producers::up::demo_packages().into_iter().find(|p| p.name == "ubuntu").unwrap();
    for (name, ..) in hosts {
        let host = rig.hosts().get(name).await.unwrap();
        assert!(host.spec.online, "{name} online");
        let image = host.spec.image.as_ref().expect("image");
        assert_eq!(image.url, format!("http://10.0.0.2:8080/sha256/{}", ubuntu.sha256));
        assert_eq!(image.checksum.as_deref(), Some(ubuntu.sha256.as_str()));
        assert_eq!((image.checksum_type.as_deref(), image.format.as_deref()), (Some("sha256"), Some("raw")));
        let user_data = host.spec.user_data.as_ref().expect("userData");
        assert_eq!((user_data.name.as_str(), user_data.namespace.as_deref()), ("edge-user-data", Some(NAMESPACE)));
        assert_eq!(
            host.spec.bmc.as_ref().unwrap().credentials_name,
            format!("{name}-bmc-secret"),
            "not ours to change"
        );
        assert_eq!(host.annotations().get(&marks::package("ubuntu")).map(String::as_str), Some("22.04.4"));
        assert!(host.finalizers().iter().any(|f| f == marks::FINALIZER));
        let ours: Vec<_> = host.managed_fields().iter().filter_map(|m| m.manager.clone()).collect();
        assert!(ours.iter().any(|m| m == FIELD_MANAGER), "{ours:?}");
    }

    // The BPA's Provisioning: masters and workers by MAC, the plugins and pod subnet.
    let provisionings: Api<DynamicObject> =
        Api::namespaced_with(rig.client.clone(), NAMESPACE, &bpa::provisioning_resource());
    let p = provisionings.get(SITE).await.unwrap();
    assert_eq!(p.data["spec"]["masters"], json!([{"m-1": {"mac-address": mac(1)}}]));
    assert_eq!(p.data["spec"]["workers"], json!([{"w-1": {"mac-address": mac(2)}}, {"w-2": {"mac-address": mac(3)}}]));
    assert_eq!(p.data["spec"]["KUDPlugins"], json!(["emco"]));
    assert_eq!(p.data["spec"]["PodSubnet"], json!("10.244.64.0/18"));
    assert_eq!(p.labels().get("cluster").map(String::as_str), Some(SITE));
    let softwares: Api<DynamicObject> = Api::namespaced_with(rig.client.clone(), NAMESPACE, &bpa::software_resource());
    let software = softwares.get(&format!("{SITE}-software")).await.unwrap();
    let versions = bpa::software_versions(&software.data);
    assert_eq!(versions[&bus_schema::domain::Role::Worker]["kubelet"], "1.29.2");

    // hosts.ini from the roles and the addresses inspection saw on each boot MAC.
    assert_eq!(
        rig.hosts_ini(),
        "[all]\nm-1 ansible_ssh_host=10.1.0.11 ip=10.1.0.11\nw-1 ansible_ssh_host=10.1.0.21 ip=10.1.0.21\n\
         w-2 ansible_ssh_host=10.1.0.22 ip=10.1.0.22\n\n[kube-master]\nm-1\n\n[kube-node]\nm-1\nw-1\nw-2\n\n\
         [etcd]\nm-1\n\n[k8s-cluster:children]\nkube-node\nkube-master\n"
    );
    // The container package's manifests are in the application cluster.
    let names: Vec<String> =
        widgets(&rig).list(&Default::default()).await.unwrap().iter().map(|w| w.name_any()).collect();
    assert_eq!(names, ["alpha", "beta"]);
    // The staged container package went to the BPA's upload API, whole.
    let (record, bytes) = bpa_rest.image("container_images", "edge-apps-1.0.0").expect("uploaded to the BPA");
    assert_eq!(record["upload_complete"], json!(true));
    assert_eq!(bytes, landfall_tests::kube_site::widget_manifests(&["alpha", "beta"], 2).into_bytes());

    // Installing again writes nothing: no object gets a new resourceVersion.
    let before = resource_versions(&rig).await;
    let received = bpa_rest.bytes_received();
    let again = install(&rig).await;
    assert_eq!(types(&again).last().map(String::as_str), Some(pb::SiteInstalled::TYPE));
    assert_eq!(resource_versions(&rig).await, before, "a second install changed objects");
    assert_eq!(bpa_rest.bytes_received(), received, "the BPA was sent an image it has");
}

/// A binary patch moves the role's entry in the BPA's Software and each node's record; an
/// os-image patch reimages each host through Metal3 (deprovisioned, then provisioned with the
/// new image). Each node reports the version it ran before.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn patches_go_through_the_bpa_software_and_metal3_reimages() {
    let mut rig = KubeSiteRig::start().await;
    rig.start_gateway();
    rig.create_host("m-1", "master", &mac(1), "10.1.0.11").await;
    rig.create_host("w-1", "worker", &mac(2), "10.1.0.21").await;
    rig.wait_design(|n| n.len() == 2).await;
    let installed = install(&rig).await;
    assert_eq!(types(&installed).last().map(String::as_str), Some(pb::SiteInstalled::TYPE), "{}", rig.gateway_log());
    // The design's root disk reaches the host, as the upstream CRD takes it.
    let hints = rig.hosts().get("m-1").await.unwrap().spec.root_device_hints;
    let want = site_gateway::kube_site::metal3::RootDeviceHints {
        device_name: Some("/dev/sda".into()),
        min_size_gigabytes: Some(100),
    };
    assert_eq!(hints, Some(want));
    // And its networks, as the host's networkData: a Secret on the real API server, the ports
    // found by the MACs inspection saw.
    let host = rig.hosts().get("m-1").await.unwrap();
    let reference = host.spec.network_data.as_ref().expect("networkData");
    assert_eq!((reference.name.as_str(), reference.namespace.as_deref()), ("m-1-network-data", Some(NAMESPACE)));
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(rig.client.clone(), NAMESPACE);
    let secret = secrets.get("m-1-network-data").await.unwrap();
    let bytes = &secret.data.unwrap()["networkData"].0;
    let data: serde_json::Value = serde_json::from_slice(bytes).unwrap();
    assert_eq!(
        data["links"],
        json!([
            {"id": "eno1", "type": "phy", "ethernet_mac_address": mac(1)},
            {"id": "eno2", "type": "phy", "ethernet_mac_address": "52:54:00:ff:ff:01"},
            {"id": "eno2.200", "type": "vlan", "vlan_link": "eno2", "vlan_id": 200, "vlan_mac_address": "52:54:00:ff:ff:01"}
        ]),
        "{data}"
    );
    let networks = data["networks"].as_array().unwrap();
    assert_eq!(networks.len(), 2, "{data}");
    assert_eq!((networks[0]["link"].as_str(), networks[0]["ip_address"].as_str()), (Some("eno1"), Some("10.1.0.11")));
    assert_eq!(networks[0]["netmask"], "255.255.255.0");
    assert_eq!(networks[0]["routes"][0]["gateway"], "10.1.0.1");
    assert_eq!((networks[1]["link"].as_str(), networks[1]["type"].as_str()), (Some("eno2.200"), Some("ipv4_dhcp")));
    assert_eq!(data["services"], json!([{"type": "dns", "address": "10.1.0.2"}]));
    let demo = producers::up::demo_packages();
    // The worker runs a replica of a Deployment and a DaemonSet's pod.
    rig.run_pod("web-1", "w-1", Some("ReplicaSet"), json!({"app": "web"})).await;
    rig.run_pod("agent-w-1", "w-1", Some("DaemonSet"), json!({"app": "agent"})).await;

    let kubelet =
        pb::Package { version: "1.29.3".into(), ..demo.iter().find(|p| p.name == "kubelet").unwrap().clone() };
    let rollout = patch(&rig, kubelet).await;
    assert_eq!(types(&rollout).last().map(String::as_str), Some(pb::RolloutCompleted::TYPE), "{:?}", types(&rollout));
    let patched: Vec<pb::NodePatched> = landfall_tests::fleet::node_reports(&rollout);
    assert_eq!(patched.len(), 2, "{patched:?}");
    assert!(patched.iter().all(|p| p.from_version == "1.29.2"), "{patched:?}");
    // The master first, then the worker, each out of service while it was patched and patched
    // only once the Node reported Ready at kubelet v1.29.3. The DaemonSet's pod stayed.
    assert_eq!(
        node_steps(&rollout),
        [
            "m-1 cordoned",
            "m-1 drained []",
            "m-1 uncordoned",
            "m-1 patched",
            "w-1 cordoned",
            "w-1 drained [default/web-1]",
            "w-1 uncordoned",
            "w-1 patched"
        ],
        "{}",
        rig.gateway_log()
    );
    assert_eq!(rig.pod_names().await, ["agent-w-1"]);
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(rig.client.clone());
    for name in ["m-1", "w-1"] {
        let node = nodes.get(name).await.unwrap();
        assert_eq!(node.spec.unwrap().unschedulable, None, "{name} schedulable again");
        assert!(!node.metadata.annotations.unwrap_or_default().contains_key(marks::CORDONED), "{name}");
    }
    let softwares: Api<DynamicObject> = Api::namespaced_with(rig.client.clone(), NAMESPACE, &bpa::software_resource());
    let software = bpa::software_versions(&softwares.get(&format!("{SITE}-software")).await.unwrap().data);
    for role in [bus_schema::domain::Role::Master, bus_schema::domain::Role::Worker] {
        assert_eq!(software[&role]["kubelet"], "1.29.3");
        assert_eq!(software[&role]["containerd"], "1.7.13", "other entries are kept");
    }
    for name in ["m-1", "w-1"] {
        let host = rig.hosts().get(name).await.unwrap();
        assert_eq!(host.annotations().get(&marks::package("kubelet")).map(String::as_str), Some("1.29.3"));
    }

    let ubuntu = pb::Package {
        version: "22.04.5".into(),
        sha256: "5".repeat(64),
        ..demo.iter().find(|p| p.name == "ubuntu").unwrap().clone()
    };
    let rollout = patch(&rig, ubuntu).await;
    assert_eq!(types(&rollout).last().map(String::as_str), Some(pb::RolloutCompleted::TYPE), "{}", rig.gateway_log());
    let patched: Vec<pb::NodePatched> = landfall_tests::fleet::node_reports(&rollout);
    assert_eq!(patched.len(), 2, "{patched:?}");
    assert!(patched.iter().all(|p| p.from_version == "22.04.4"), "{patched:?}");
    for name in ["m-1", "w-1"] {
        let host = rig.hosts().get(name).await.unwrap();
        assert_eq!(host.state(), Some(site_gateway::backend::ProvisioningState::Provisioned));
        assert_eq!(host.provisioned_image().unwrap().url, format!("http://10.0.0.2:8080/sha256/{}", "5".repeat(64)));
        assert_eq!(host.annotations().get(&marks::package("ubuntu")).map(String::as_str), Some("22.04.5"));
    }
}

/// The BPA's `Software` names a version per role and installs it on every node of the role at
/// once; a kubelet rollout with `max_unavailable 1` still changes one node at a time: each is
/// cordoned, gets the version from a Job pinned to it, is seen Ready at it and is uncordoned
/// before the next is touched, and the role's `Software` moves once the whole role runs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kubelet_rollout_changes_one_node_at_a_time_whatever_the_bpas_per_role_software() {
    let mut rig = KubeSiteRig::start().await;
    rig.start_gateway();
    for (name, role, i) in [("m-1", "master", 1), ("m-2", "master", 2), ("w-1", "worker", 3), ("w-2", "worker", 4)] {
        rig.create_host(name, role, &mac(i), &format!("10.1.0.{}", 10 + i)).await;
    }
    rig.wait_design(|n| n.len() == 4).await;
    let installed = install(&rig).await;
    assert_eq!(types(&installed).last().map(String::as_str), Some(pb::SiteInstalled::TYPE), "{}", rig.gateway_log());
    let from = rig.kubelets.log().len();
    let demo = producers::up::demo_packages();
    let kubelet =
        pb::Package { version: "1.29.3".into(), ..demo.iter().find(|p| p.name == "kubelet").unwrap().clone() };
    let rollout = patch_with(&rig, kubelet, 1).await;
    assert_eq!(types(&rollout).last().map(String::as_str), Some(pb::RolloutCompleted::TYPE), "{}", rig.gateway_log());
    let expected: Vec<String> = ["m-1", "m-2", "w-1", "w-2"]
        .iter()
        .flat_map(|n| [format!("{n} cordoned"), format!("{n} kubelet 1.29.3"), format!("{n} uncordoned")])
        .collect();
    // The kubelets' stand-in looks every 100 ms: it may see the last uncordon a moment after.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while rig.kubelets.log().len() < from + expected.len() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log: Vec<String> = rig.kubelets.log()[from..].to_vec();
    assert_eq!(log, expected, "{}", rig.gateway_log());
    let softwares: Api<DynamicObject> = Api::namespaced_with(rig.client.clone(), NAMESPACE, &bpa::software_resource());
    let software = bpa::software_versions(&softwares.get(&format!("{SITE}-software")).await.unwrap().data);
    for role in [bus_schema::domain::Role::Master, bus_schema::domain::Role::Worker] {
        assert_eq!(software[&role]["kubelet"], "1.29.3", "the whole role runs it: the BPA follows");
    }
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::all(rig.client.clone());
    assert!(jobs.list(&Default::default()).await.unwrap().items.is_empty(), "each upgrade Job went once done");
}

/// A drain a disruption budget blocks waits, then fails the node with the budget's reason: the
/// node keeps its version and is schedulable again. A worker that is not Ready after its patch
/// fails and stays cordoned. A master is not started while another master is not Ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_blocked_drain_or_a_node_not_ready_fails_the_node_with_the_reason() {
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    let mut rig = KubeSiteRig::start().await;
    rig.start_gateway();
    rig.create_host("m-1", "master", &mac(1), "10.1.0.11").await;
    rig.create_host("m-2", "master", &mac(2), "10.1.0.12").await;
    rig.create_host("w-1", "worker", &mac(3), "10.1.0.21").await;
    rig.create_host("w-2", "worker", &mac(4), "10.1.0.22").await;
    rig.wait_design(|n| n.len() == 4).await;
    let installed = install(&rig).await;
    assert_eq!(types(&installed).last().map(String::as_str), Some(pb::SiteInstalled::TYPE), "{}", rig.gateway_log());

    // The database's budget allows no disruption now; its pod is on w-1.
    rig.run_pod("db-0", "w-1", Some("StatefulSet"), json!({"app": "db"})).await;
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(rig.client.clone(), "default");
    let pdb =
        json!({"metadata": {"name": "db"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}}});
    budgets.create(&Default::default(), &serde_json::from_value(pdb).unwrap()).await.unwrap();
    let status = json!({"status": {"observedGeneration": 1, "disruptionsAllowed": 0, "currentHealthy": 1,
                                   "desiredHealthy": 1, "expectedPods": 1}});
    budgets.patch_status("db", &Default::default(), &kube::api::Patch::Merge(&status)).await.unwrap();
    // m-2 is down: m-1 waits for it, and starts once it is back (after the gateway said it
    // waits).
    rig.kubelets.set_ready("m-2", false);
    let knobs = rig.kubelets.clone();
    let log = rig.dir.path().join("gateway.log");
    tokio::spawn(async move {
        while !std::fs::read_to_string(&log).unwrap_or_default().contains("a master waits for the others to be Ready") {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        knobs.set_ready("m-2", true);
    });
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(rig.client.clone());
    let not_ready = |n: &k8s_openapi::api::core::v1::Node| {
        let conditions = n.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
        conditions.iter().any(|c| c.type_ == "Ready" && c.status != "True")
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !not_ready(&nodes.get("m-2").await.unwrap()) {
        assert!(std::time::Instant::now() < deadline, "m-2 never showed not Ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // w-2's kubelet will not come back Ready.
    let demo = producers::up::demo_packages();
    let kubelet =
        pb::Package { version: "1.29.3".into(), ..demo.iter().find(|p| p.name == "kubelet").unwrap().clone() };
    let watcher = {
        let knobs = rig.kubelets.clone();
        tokio::spawn(async move {
            loop {
                if knobs.cordons().iter().any(|(n, c)| n == "w-2" && *c) {
                    knobs.set_ready("w-2", false);
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let rollout = patch_with(&rig, kubelet, 2).await;
    watcher.abort();
    let steps = node_steps(&rollout);
    let failed: BTreeMap<String, String> =
        of_type::<pb::NodePatchFailed>(&rollout).into_iter().map(|f| (f.node, f.reason)).collect();
    assert_eq!(failed.keys().collect::<Vec<_>>(), ["w-1", "w-2"], "{steps:?}\n{failed:?}\n{}", rig.gateway_log());
    assert!(failed["w-1"].contains("disruption budget") && failed["w-1"].contains("default/db-0"), "{}", failed["w-1"]);
    assert!(failed["w-2"].contains("not seen Ready at kubelet v1.29.3"), "{}", failed["w-2"]);
    // Masters one at a time, before any worker; w-1 given back as it was; w-2 kept out.
    assert!(rig.gateway_log().contains("a master waits for the others to be Ready"), "m-1 did not wait for m-2");
    let position = |s: &str| steps.iter().position(|x| x == s).unwrap_or_else(|| panic!("{s} in {steps:?}"));
    assert!(position("m-1 patched") < position("m-2 cordoned"), "{steps:?}");
    assert!(position("m-2 patched") < position("w-1 cordoned").min(position("w-2 cordoned")), "{steps:?}");
    assert!(position("w-1 uncordoned") < position("w-1 failed"), "{steps:?}");
    assert!(!steps.contains(&"w-2 uncordoned".to_string()), "{steps:?}");
    assert_eq!(nodes.get("w-1").await.unwrap().spec.unwrap().unschedulable, None);
    assert_eq!(nodes.get("w-2").await.unwrap().spec.unwrap().unschedulable, Some(true));
    assert_eq!(rig.pod_names().await, ["db-0"]);
    let host = rig.hosts().get("w-1").await.unwrap();
    assert_eq!(host.annotations().get(&marks::package("kubelet")).map(String::as_str), Some("1.29.2"));
}

/// A field another manager owns with another value is not taken over: the job fails, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_field_another_manager_owns_is_never_taken_over() {
    let mut rig = KubeSiteRig::start().await;
    rig.start_gateway();
    rig.create_host("m-1", "master", &mac(1), "10.1.0.11").await;
    rig.wait_design(|n| n.contains("m-1")).await;
    // An operator holds the host offline.
    let offline = json!({"apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost", "spec": {"online": false}});
    let params = kube::api::PatchParams::apply("site-operator").force();
    rig.hosts().patch("m-1", &params, &kube::api::Patch::Apply(&offline)).await.unwrap();
    let events = install(&rig).await;
    let failed: Vec<pb::NodeFailed> = of_type(&events);
    assert_eq!(failed.len(), 1, "{:?}", types(&events));
    assert!(
        failed[0].reason.contains("site-operator") && failed[0].reason.contains(".spec.online"),
        "{}",
        failed[0].reason
    );
    let host = rig.hosts().get("m-1").await.unwrap();
    assert!(!host.spec.online, "the operator's value stands");
    assert!(host.spec.image.is_none(), "nothing of the job was applied");
}

/// A host announced once stays announced across a gateway restart; deleting it gives
/// NodeRemoved, the node leaves the design, and the host goes once the gateway lets it. Created
/// again with the same name and MAC, it is a new host.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restart_announces_nothing_again_and_a_deleted_host_leaves_the_design() {
    let mut rig = KubeSiteRig::start().await;
    rig.start_gateway();
    rig.create_host("w-9", "worker", &mac(9), "10.1.0.99").await;
    assert_eq!(wait_commands::<pb::NodeAdded>(&rig, 1).await.len(), 1);
    rig.wait_design(|n| n.contains("w-9")).await;
    // Wait for the mark, then restart.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !rig.hosts().get("w-9").await.unwrap().annotations().contains_key(marks::ANNOUNCED) {
        assert!(tokio::time::Instant::now() < deadline, "the host was not marked announced");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    rig.kill_gateway();
    rig.start_gateway();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let announced = rig.gateway_log().matches("host change announced").count();
    assert_eq!(announced, 1, "announced again after the restart:\n{}", rig.gateway_log());

    rig.hosts().delete("w-9", &DeleteParams::default()).await.unwrap();
    let removed = wait_commands::<pb::NodeRemoved>(&rig, 1).await;
    assert_eq!(removed.len(), 1, "{}", rig.gateway_log());
    assert_eq!((removed[0].node.as_str(), removed[0].boot_mac.as_str()), ("w-9", mac(9).as_str()));
    let design = rig.wait_design(|n| !n.contains("w-9")).await;
    assert!(!design.contains("w-9"), "{design:?}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while rig.hosts().get_opt("w-9").await.unwrap().is_some() {
        assert!(tokio::time::Instant::now() < deadline, "the gateway's finalizer held the host");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The same name and MAC created again is another host (another uid): it joins again, and
    // leaves again when it is deleted; neither announcement is dropped as a copy of the first.
    rig.create_host("w-9", "worker", &mac(9), "10.1.0.99").await;
    assert_eq!(wait_commands::<pb::NodeAdded>(&rig, 2).await.len(), 2, "{}", rig.gateway_log());
    rig.wait_design(|n| n.contains("w-9")).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !rig.hosts().get("w-9").await.unwrap().annotations().contains_key(marks::ANNOUNCED) {
        assert!(tokio::time::Instant::now() < deadline, "the new host was not marked announced");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    rig.hosts().delete("w-9", &DeleteParams::default()).await.unwrap();
    assert_eq!(wait_commands::<pb::NodeRemoved>(&rig, 2).await.len(), 2, "{}", rig.gateway_log());
    rig.wait_design(|n| !n.contains("w-9")).await;
}

/// Metal3's error for a host reaches the bus as NodeFailed with its errorType and errorMessage.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_host_metal3_fails_gives_node_failed_with_its_error_message() {
    let mut rig = KubeSiteRig::start().await;
    rig.metal3.failing.lock().unwrap().insert("m-1".into(), "Image checksum mismatch: deploy failed".into());
    rig.start_gateway();
    rig.create_host("m-1", "master", &mac(1), "10.1.0.11").await;
    let events = install(&rig).await;
    let kinds = types(&events);
    assert_eq!(kinds.last().map(String::as_str), Some(pb::SiteInstallFailed::TYPE), "{kinds:?}");
    let failed: Vec<pb::NodeFailed> = of_type(&events);
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0].node, "m-1");
    assert_eq!(failed[0].error_type, "provisioning error");
    assert_eq!(failed[0].reason, "Image checksum mismatch: deploy failed");
}

/// Binaries installed are not a node joined: a node whose kubelet never reports Ready fails
/// with what it showed, and the others are installed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_not_seen_ready_after_its_install_fails_with_what_it_showed() {
    let mut rig = KubeSiteRig::start().await;
    rig.kubelets.set_ready("w-1", false);
    rig.start_gateway();
    rig.create_host("m-1", "master", &mac(1), "10.1.0.11").await;
    rig.create_host("w-1", "worker", &mac(2), "10.1.0.21").await;
    rig.wait_design(|n| n.len() == 2).await;
    let events = install(&rig).await;
    let failed: Vec<pb::NodeFailed> = of_type(&events);
    assert_eq!(failed.len(), 1, "{:?}\n{}", types(&events), rig.gateway_log());
    assert_eq!(failed[0].node, "w-1");
    assert!(
        failed[0].reason.contains("w-1 was not seen Ready at kubelet v1.29.2")
            && failed[0].reason.contains("Ready not True"),
        "{}",
        failed[0].reason
    );
    let installed: Vec<pb::NodeBinariesInstalled> = of_type(&events);
    assert_eq!(installed.iter().map(|n| n.node.as_str()).collect::<Vec<_>>(), ["m-1"]);
}

/// An os-image patch whose gateway is killed while the old image comes off, and again while the
/// new one goes on, is taken up by the gateway started again each time (the job delivered
/// again), not failed as "not provisioned": the host is provisioned with the new image once,
/// every Metal3 state is reported, and the node is patched once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reimage_whose_gateway_dies_halfway_is_taken_up_and_done_once() {
    let mut rig = KubeSiteRig::start().await;
    rig.start_gateway();
    rig.create_host("m-1", "master", &mac(1), "10.1.0.11").await;
    rig.wait_design(|n| n.contains("m-1")).await;
    let installed = install(&rig).await;
    assert_eq!(types(&installed).last().map(String::as_str), Some(pb::SiteInstalled::TYPE), "{}", rig.gateway_log());

    let demo = producers::up::demo_packages();
    let ubuntu = pb::Package {
        version: "22.04.5".into(),
        sha256: "5".repeat(64),
        ..demo.iter().find(|p| p.name == "ubuntu").unwrap().clone()
    };
    let url = format!("http://10.0.0.2:8080/sha256/{}", "5".repeat(64));
    rig.metal3.hold("m-1", "deprovisioning");
    rig.metal3.hold("m-1", "provisioning");
    let registered = Envelope::root();
    let cmd = pb::RegisterPackage { package: Some(ubuntu.clone()), auto_rollout: None };
    rig.bus.publish_command(&cmd, &registered).await.unwrap();
    rig.wait_for(pb::PackageRegistered::filter(), &registered.id).await.expect("registered");
    let env = Envelope::root();
    let cmd = pb::PatchPackage { name: ubuntu.name.clone(), version: ubuntu.version.clone(), ..Default::default() };
    rig.bus.publish_command(&cmd, &env).await.unwrap();
    let rollout_id = env.id.clone();
    let rollout = tokio::spawn({
        let bus = rig.bus.clone();
        let ends = [pb::RolloutCompleted::TYPE, pb::RolloutHalted::TYPE, pb::CommandRejected::TYPE];
        async move { fleet::collect(&bus, names::EVENTS_ALL.into(), "rollout", &env.id, &ends, INSTALL_TIMEOUT).await }
    });

    // Killed while the old image comes off; the new gateway takes the job up while the host is
    // still deprovisioning (the hub hands the job out again once it has waited its time for the
    // killed gateway's answer).
    let m1 = |state: &'static str, image: Option<&str>| {
        let image = image.map(str::to_string);
        move |h: &site_gateway::kube_site::metal3::BareMetalHost| {
            h.status.as_ref().is_some_and(|s| s.provisioning.state == state)
                && h.spec.image.as_ref().map(|i| i.url.clone()).filter(|u| !u.is_empty()) == image
        }
    };
    until_host(&rig, "m-1", m1("deprovisioning", None)).await;
    let jobs_handed_out = handed_out(&rig).await;
    rig.kill_gateway();
    rig.start_gateway();
    until_handed_out_again(jobs_handed_out).await;
    until_reported(&rig, &rollout_id, "deprovisioning").await;
    rig.metal3.release("m-1", "deprovisioning");

    // Killed again while the new image goes on.
    until_host(&rig, "m-1", m1("provisioning", Some(&url))).await;
    let jobs_handed_out = handed_out(&rig).await;
    rig.kill_gateway();
    rig.start_gateway();
    until_handed_out_again(jobs_handed_out).await;
    until_reported(&rig, &rollout_id, "provisioning").await;
    rig.metal3.release("m-1", "provisioning");

    let run = rollout.await.unwrap().events;
    assert_eq!(types(&run).last().map(String::as_str), Some(pb::RolloutCompleted::TYPE), "{}", rig.gateway_log());
    let patched: Vec<pb::NodePatched> = landfall_tests::fleet::node_reports(&run);
    assert_eq!(patched.len(), 1, "{patched:?}");
    assert_eq!((patched[0].node.as_str(), patched[0].from_version.as_str()), ("m-1", "22.04.4"));
    assert!(of_type::<pb::NodePatchFailed>(&run).is_empty(), "{:?}", types(&run));
    assert_eq!(rig.metal3.provisions_of("m-1", &url), 1, "the new image went on more than once");
    let states: Vec<String> = of_type::<pb::NodeOsProvisioning>(&run).into_iter().map(|e| e.state).collect();
    for state in ["deprovisioning", "provisioning", "provisioned"] {
        assert_eq!(states.iter().filter(|s| *s == state).count(), 1, "{state} reported once: {states:?}");
    }
    let host = rig.hosts().get("m-1").await.unwrap();
    assert_eq!(host.provisioned_image().unwrap().url, url);
    assert_eq!(host.annotations().get(&marks::package("ubuntu")).map(String::as_str), Some("22.04.5"));
}

/// Waits until the host `name` is as `ok` says.
async fn until_host(
    rig: &KubeSiteRig,
    name: &str,
    ok: impl Fn(&site_gateway::kube_site::metal3::BareMetalHost) -> bool,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let host = rig.hosts().get(name).await.unwrap();
        if ok(&host) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{name} never got there: {:?}", host.status);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What the hub hands the site's gateway from now on, on the site's delivery subject: its
/// durable's deliveries, or the dispatcher's requests.
async fn handed_out(rig: &KubeSiteRig) -> async_nats::Subscriber {
    rig.bus.client().subscribe(names::site_deliver(SITE)).await.unwrap()
}

/// Waits until the hub hands the site's job out again (to the gateway started again): its
/// durable after its ack wait, or the dispatcher once it has waited its time for an answer.
async fn until_handed_out_again(mut handed_out: async_nats::Subscriber) {
    let within = Duration::from_secs(45);
    let job = async {
        // A durable's flow control and heartbeats carry a status and no job.
        while let Some(m) = futures::StreamExt::next(&mut handed_out).await {
            if m.status.is_none() && !m.payload.is_empty() {
                return;
            }
        }
    };
    tokio::time::timeout(within, job).await.expect("the job was handed out again");
}

/// Waits until the hub holds the reimage's `state` (from the gateway killed or the one that took
/// the job up): released before that, the host could pass the state unseen by either.
async fn until_reported(rig: &KubeSiteRig, rollout: &str, state: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let filter = pb::NodeOsProvisioning::filter();
        let mut reader = rig.bus.read_events(vec![filter], DeliverPolicy::All).await.unwrap();
        while let Ok(Some(Ok(e))) = tokio::time::timeout(Duration::from_millis(200), reader.next()).await {
            let reported: pb::NodeOsProvisioning = e.delivery.decode().unwrap();
            if e.delivery.envelope.correlation == rollout && reported.state == state {
                return;
            }
        }
        assert!(tokio::time::Instant::now() < deadline, "{state} was not reported: {}", rig.gateway_log());
    }
}
