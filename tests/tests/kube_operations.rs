//! Nodes removed and reprovisioned and the site decommissioned at a site on the real Kubernetes
//! API server (the upstream Metal3 and BPA CRDs, core resources, the Eviction API), through the
//! real hub and the real `landfall-gateway --backend kube`: each leaves nothing behind, and what
//! would break the cluster is refused.

use std::collections::BTreeSet;
use std::time::Duration;

use bus_schema::names;
use bus_schema::pb::{self, BusEvent, BusMessage};
use bus_schema::runtime::{Envelope, ReadEvent};
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::ResourceExt;
use kube::api::{Api, DynamicObject};
use landfall_tests::fleet;
use landfall_tests::kube_site::{KubeSiteRig, NAMESPACE, SITE, mac};
use serde_json::json;
use site_gateway::kube_site::{bpa, marks};

const TIMEOUT: Duration = Duration::from_secs(120);

/// Publishes `cmd`; the events correlated with `id` (the command's, or its join's) until one of `ends`.
async fn run<C: pb::BusCommand>(rig: &KubeSiteRig, cmd: &C, ends: &[&str]) -> (Envelope, Vec<ReadEvent>) {
    let env = Envelope::root();
    rig.bus.publish_command(cmd, &env).await.unwrap();
    let events = fleet::collect(&rig.bus, names::scope_events(SITE), "operation", &env.id, ends, TIMEOUT).await.events;
    (env, events)
}

fn types(events: &[ReadEvent]) -> Vec<&str> {
    events.iter().map(|e| e.delivery.type_name.trim_start_matches("landfall.v1.")).collect()
}

fn last<M: BusMessage>(events: &[ReadEvent]) -> M {
    let e = events.last().expect("an event");
    assert_eq!(e.delivery.type_name, M::TYPE, "{:?}", types(events));
    e.delivery.decode().unwrap()
}

async fn node_names(rig: &KubeSiteRig) -> BTreeSet<String> {
    let nodes: Api<Node> = Api::all(rig.client.clone());
    nodes.list(&Default::default()).await.unwrap().items.iter().map(|n| n.name_any()).collect()
}

async fn host_names(rig: &KubeSiteRig) -> BTreeSet<String> {
    rig.hosts().list(&Default::default()).await.unwrap().items.iter().map(|h| h.name_any()).collect()
}

/// The Secrets of the site's namespace landfall wrote (labelled with their purpose).
async fn landfall_secrets(rig: &KubeSiteRig) -> BTreeSet<String> {
    let secrets: Api<Secret> = Api::namespaced(rig.client.clone(), NAMESPACE);
    let params = kube::api::ListParams::default().labels(marks::PURPOSE_LABEL);
    secrets.list(&params).await.unwrap().items.iter().map(|s| s.name_any()).collect()
}

fn bpa_api(rig: &KubeSiteRig, resource: &kube::api::ApiResource) -> Api<DynamicObject> {
    Api::namespaced_with(rig.client.clone(), NAMESPACE, resource)
}

async fn until_not_ready(rig: &KubeSiteRig, node: &str) {
    let nodes: Api<Node> = Api::all(rig.client.clone());
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let n = nodes.get(node).await.unwrap();
        let conditions = n.status.and_then(|s| s.conditions).unwrap_or_default();
        if conditions.iter().any(|c| c.type_ == "Ready" && c.status != "True") {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{node} never showed not Ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nodes_are_removed_and_reprovisioned_and_the_site_decommissioned_leaving_nothing_behind() {
    let mut rig = KubeSiteRig::start().await;
    rig.start_gateway();
    let hosts = [("m-1", "master", 1), ("m-2", "master", 2), ("w-1", "worker", 3), ("w-2", "worker", 4)];
    for (name, role, i) in hosts {
        rig.create_host(name, role, &mac(i), &format!("10.1.0.{}", 10 + i)).await;
    }
    rig.wait_design(|n| n.len() == 4).await;
    let env = Envelope::root();
    rig.bus.publish_command(&pb::InstallSite { site_id: SITE.into(), design_revision: 0 }, &env).await.unwrap();
    let ends = [pb::SiteInstalled::TYPE, pb::SiteInstallFailed::TYPE];
    let install = fleet::collect(&rig.bus, names::scope_events(SITE), "install", &env.id, &ends, TIMEOUT).await;
    last::<pb::SiteInstalled>(&install.events);
    let remove = |node: &str| pb::RemoveNode { site_id: SITE.into(), node: node.into(), reason: "retired".into() };
    let remove_ends = [pb::NodeLeft::TYPE, pb::LifecycleFailed::TYPE, pb::CommandRejected::TYPE];

    // A master goes only while the other is Ready: with m-2 down, etcd would lose its quorum.
    rig.kubelets.set_ready("m-2", false);
    until_not_ready(&rig, "m-2").await;
    let (_, refused) = run(&rig, &remove("m-1"), &remove_ends).await;
    let failed: pb::LifecycleFailed = last(&refused);
    assert!(failed.reason.contains("quorum") && failed.reason.contains("m-2"), "{}", failed.reason);
    assert_eq!(types(&refused), ["JobFailed", "LifecycleFailed"], "nothing was touched");
    assert!(host_names(&rig).await.contains("m-1"));
    rig.kubelets.set_ready("m-2", true);

    // The design says w-2's disks are left as they are when its OS comes off.
    let sites = rig.bus.kv(names::SITES_BUCKET).await.unwrap();
    let (mut design, _) = sites.get::<pb::SiteDesign>(&names::keys::site(SITE)).await.unwrap().unwrap();
    for node in design.nodes.iter_mut().filter(|n| n.name == "w-2") {
        node.cleaning = pb::CleaningMode::Disabled as i32;
    }
    let registered = Envelope::root();
    rig.bus.publish_command(&pb::RegisterSite { design: Some(design), expected: None }, &registered).await.unwrap();
    rig.wait_for(pb::SiteRegistered::filter(), &registered.id).await.expect("registered");

    // w-2, with a pod a ReplicaSet would bring back elsewhere: drained, deleted, deprovisioned.
    rig.run_pod("web-0", "w-2", Some("ReplicaSet"), json!({"app": "web"})).await;
    let (_, removed) = run(&rig, &remove("w-2"), &remove_ends).await;
    if removed.last().is_some_and(|e| e.delivery.type_name == pb::LifecycleFailed::TYPE) {
        let failed: pb::LifecycleFailed = last(&removed);
        panic!("{}\n{}", failed.reason, rig.gateway_log());
    }
    last::<pb::NodeLeft>(&removed);
    let drained = removed.iter().find(|e| e.delivery.type_name == pb::NodeDrained::TYPE).expect("drained");
    assert_eq!(drained.delivery.decode::<pb::NodeDrained>().unwrap().evicted, ["default/web-0"]);
    let states: Vec<String> = removed
        .iter()
        .filter(|e| e.delivery.type_name == pb::NodeOsProvisioning::TYPE)
        .map(|e| e.delivery.decode::<pb::NodeOsProvisioning>().unwrap().state)
        .collect();
    assert_eq!(states.last().map(String::as_str), Some("available"), "{states:?}");
    assert!(rig.pod_names().await.is_empty(), "web-0 was evicted");
    assert_eq!(rig.metal3.cleanings(), [("w-2".to_string(), "disabled".to_string())], "cleaned as the design says");
    assert!(!node_names(&rig).await.contains("w-2"), "its Node is gone");
    assert_eq!(host_names(&rig).await, ["m-1", "m-2", "w-1"].map(String::from).into());
    assert!(!landfall_secrets(&rig).await.iter().any(|s| s.starts_with("w-2")), "{:?}", landfall_secrets(&rig).await);
    let provisioning = bpa_api(&rig, &bpa::provisioning_resource()).get(SITE).await.unwrap();
    assert_eq!(provisioning.data["spec"]["workers"], json!([{"w-1": {"mac-address": mac(3)}}]));
    assert_eq!(rig.wait_design(|n| n.len() == 3).await, ["m-1", "m-2", "w-1"].map(String::from).into());
    assert!(rig.commands::<pb::NodeRemoved>().await.is_empty(), "the deletion was not announced as a departure");

    // w-1 re-imaged: the image comes off and goes on again, and it joins at the site's versions.
    let ubuntu = producers::up::demo_packages().into_iter().find(|p| p.name == "ubuntu").unwrap();
    let image = format!("http://10.0.0.2:8080/sha256/{}", ubuntu.sha256);
    let before = rig.metal3.provisions_of("w-1", &image);
    assert_eq!(before, 1, "provisioned once by the install");
    let cmd = pb::ReprovisionNode { site_id: SITE.into(), node: "w-1".into(), reason: "suspect disk".into() };
    let (env, wiped) = run(&rig, &cmd, &[pb::NodeRetired::TYPE, pb::LifecycleFailed::TYPE]).await;
    let retired: pb::NodeRetired = last(&wiped);
    assert!(retired.node_deleted && retired.host_deprovisioned && !retired.host_deleted, "{retired:?}");
    let rejoin = bus_schema::ids::derived_id(&env.id, "rejoin", Some("w-1")).to_string();
    let ends = [pb::NodeReady::TYPE, pb::NodeJoinFailed::TYPE];
    let joined = fleet::collect(&rig.bus, names::scope_events(SITE), "rejoin", &rejoin, &ends, TIMEOUT).await;
    last::<pb::NodeReady>(&joined.events);
    assert_eq!(rig.metal3.provisions_of("w-1", &image), before + 1, "re-imaged once");
    assert_eq!(rig.metal3.cleanings().last(), Some(&("w-1".to_string(), "metadata".to_string())), "Metal3's default");
    assert!(node_names(&rig).await.contains("w-1"), "registered again");
    let host = rig.hosts().get("w-1").await.unwrap();
    assert_eq!(host.status.map(|s| s.provisioning.state).as_deref(), Some("provisioned"));

    // The site decommissioned: no host, no BPA resource, no kubeconfig, no landfall Secret.
    let cmd = pb::DecommissionSite { site_id: SITE.into(), reason: "site closed".into() };
    let ends = [pb::SiteDecommissioned::TYPE, pb::LifecycleFailed::TYPE];
    let (_, gone) = run(&rig, &cmd, &ends).await;
    let done: pb::SiteDecommissioned = last(&gone);
    assert_eq!(done.hosts, ["m-1", "m-2", "w-1"]);
    assert!(host_names(&rig).await.is_empty(), "every BareMetalHost is gone");
    assert!(bpa_api(&rig, &bpa::provisioning_resource()).get_opt(SITE).await.unwrap().is_none());
    let software = bpa_api(&rig, &bpa::software_resource()).get_opt(&format!("{SITE}-software")).await.unwrap();
    assert!(software.is_none());
    assert!(landfall_secrets(&rig).await.is_empty(), "{:?}", landfall_secrets(&rig).await);
    // This site's gateway reads the cluster's kubeconfig from the file the BPA wrote.
    let kubeconfig = format!("File/{}", rig.admin_conf().display());
    assert!(done.resources.contains(&kubeconfig), "{:?}", done.resources);
    assert!(!rig.admin_conf().exists(), "the kubeconfig is gone");
    let sites = rig.bus.kv(names::SITES_BUCKET).await.unwrap();
    assert!(sites.get::<pb::SiteDesign>(&names::keys::site(SITE)).await.unwrap().is_none());
    assert!(sites.get::<pb::SiteArchive>(&done.archive_key).await.unwrap().is_some());
    assert!(rig.commands::<pb::NodeRemoved>().await.is_empty(), "no host's deletion was announced");
}
