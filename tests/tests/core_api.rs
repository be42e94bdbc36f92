//! The test API server's core resources behave as the kube backend relies on: a Node's status
//! is written apart from its spec, pods are listed by node, an eviction honours the pod's
//! disruption budget (429 with the budget named), a Secret is applied server-side, and the
//! apps and batch workloads are served. What a controller would write (Node conditions, the
//! budget's status) the test writes, as the kubelet and the disruption controller would.

use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams, PostParams};
use landfall_tests::kube::KubeApiServer;
use serde_json::json;

fn pod(name: &str, node: &str, app: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "registry.example/c:1"}]},
    }))
    .unwrap()
}

async fn set_running(pods: &Api<Pod>, name: &str) {
    let status = json!({"status": {"phase": "Running"}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
}

#[tokio::test]
async fn a_node_keeps_its_status_apart_and_its_pods_are_found_by_node() {
    let server = KubeApiServer::start().await;
    let client = server.client().await;
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "edge-01-m0"}})).unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();

    // The kubelet reports Ready at its version.
    let status = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}],
                                   "nodeInfo": {"kubeletVersion": "v1.31.2"}}});
    nodes.patch_status("edge-01-m0", &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
    // A cordon is a spec change: it leaves the status alone; a status write leaves the spec.
    let cordon = json!({"spec": {"unschedulable": true}, "status": {"conditions": []}});
    nodes.patch("edge-01-m0", &PatchParams::default(), &Patch::Merge(&cordon)).await.unwrap();
    let got = nodes.get("edge-01-m0").await.unwrap();
    assert_eq!(got.spec.as_ref().unwrap().unschedulable, Some(true));
    let st = got.status.unwrap();
    assert_eq!(st.conditions.unwrap()[0].status, "True");
    assert_eq!(st.node_info.unwrap().kubelet_version, "v1.31.2");
    let sneaky = json!({"spec": {"unschedulable": false}});
    nodes.patch_status("edge-01-m0", &PatchParams::default(), &Patch::Merge(&sneaky)).await.unwrap();
    assert_eq!(nodes.get("edge-01-m0").await.unwrap().spec.unwrap().unschedulable, Some(true));

    let pods: Api<Pod> = Api::namespaced(client, "default");
    for (name, node) in [("a", "edge-01-m0"), ("b", "edge-01-w0"), ("c", "edge-01-m0")] {
        pods.create(&PostParams::default(), &pod(name, node, "web")).await.unwrap();
    }
    let on_m0 = pods.list(&ListParams::default().fields("spec.nodeName=edge-01-m0")).await.unwrap();
    let mut names: Vec<_> = on_m0.items.iter().map(|p| p.metadata.name.clone().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["a", "c"]);
    let bad = pods.list(&ListParams::default().fields("spec.nope=x")).await.unwrap_err();
    assert!(bad.to_string().contains("field label not supported"), "{bad}");
}

#[tokio::test]
async fn an_eviction_honours_the_pods_disruption_budget() {
    let server = KubeApiServer::start().await;
    let client = server.client_without_retries().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), "default");
    for name in ["db-0", "db-1", "free"] {
        let app = if name == "free" { "other" } else { "db" };
        pods.create(&PostParams::default(), &pod(name, "edge-01-w0", app)).await.unwrap();
        set_running(&pods, name).await;
    }
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "db"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "db"}}},
    }))
    .unwrap();
    budgets.create(&PostParams::default(), &pdb).await.unwrap();

    // A pod no budget covers goes at once.
    pods.evict("free", &EvictParams::default()).await.unwrap();
    assert!(pods.get_opt("free").await.unwrap().is_none());

    // The disruption controller has not seen the budget yet: refused.
    let refused = pods.evict("db-0", &EvictParams::default()).await.unwrap_err();
    assert!(matches!(&refused, kube::Error::Api(s) if s.code == 429), "{refused}");

    // The budget allows none: refused, naming it.
    let status = json!({"status": {"observedGeneration": 1, "disruptionsAllowed": 0, "currentHealthy": 2,
                                   "desiredHealthy": 2, "expectedPods": 2}});
    budgets.patch_status("db", &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
    let refused = pods.evict("db-0", &EvictParams::default()).await.unwrap_err();
    match &refused {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 429);
            assert!(s.message.contains("disruption budget"), "{s:?}");
        }
        other => panic!("{other}"),
    }
    assert!(pods.get_opt("db-0").await.unwrap().is_some());

    // It allows one: the pod goes, and the budget records it.
    let status = json!({"status": {"disruptionsAllowed": 1}});
    budgets.patch_status("db", &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
    pods.evict("db-0", &EvictParams::default()).await.unwrap();
    assert!(pods.get_opt("db-0").await.unwrap().is_none());
    let after = budgets.get("db").await.unwrap().status.unwrap();
    assert_eq!(after.disruptions_allowed, Some(0));
    assert!(after.disrupted_pods.unwrap().contains_key("db-0"));
    let refused = pods.evict("db-1", &EvictParams::default()).await.unwrap_err();
    assert!(matches!(&refused, kube::Error::Api(s) if s.code == 429), "{refused}");

    // An eviction of a pod that is not there is 404; one naming another pod is refused.
    let missing = pods.evict("ghost", &EvictParams::default()).await.unwrap_err();
    assert!(matches!(&missing, kube::Error::Api(s) if s.code == 404), "{missing}");
    pods.delete("db-1", &DeleteParams::default()).await.unwrap();
}

#[tokio::test]
async fn a_secret_is_applied_server_side_and_workloads_are_served() {
    let server = KubeApiServer::start().await;
    let client = server.client().await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "metal3");
    let body = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "h-network-data"},
                      "type": "Opaque", "stringData": {"networkData": "{}"}});
    let params = PatchParams::apply("landfall");
    secrets.patch("h-network-data", &params, &Patch::Apply(&body)).await.unwrap();
    let got = secrets.get("h-network-data").await.unwrap();
    let managers: Vec<_> = got.metadata.managed_fields.unwrap().into_iter().filter_map(|m| m.manager).collect();
    assert_eq!(managers, ["landfall"]);
    // Another manager taking the same field conflicts, as server-side apply does.
    let other = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "h-network-data"},
                       "stringData": {"networkData": "[]"}});
    let conflict = secrets.patch("h-network-data", &PatchParams::apply("someone"), &Patch::Apply(&other)).await;
    assert!(matches!(&conflict, Err(kube::Error::Api(s)) if s.code == 409), "{conflict:?}");

    for (api_version, kind, plural) in [
        ("apps/v1", "Deployment", "deployments"),
        ("apps/v1", "DaemonSet", "daemonsets"),
        ("apps/v1", "StatefulSet", "statefulsets"),
        ("batch/v1", "Job", "jobs"),
    ] {
        let (group, version) = api_version.split_once('/').unwrap();
        let resource = kube::api::ApiResource {
            group: group.into(),
            version: version.into(),
            api_version: api_version.into(),
            kind: kind.into(),
            plural: plural.into(),
        };
        let api: Api<kube::api::DynamicObject> = Api::namespaced_with(client.clone(), "default", &resource);
        let body = json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": "w"},
                          "spec": {"template": {"spec": {"containers": []}}}});
        api.patch("w", &params, &Patch::Apply(&body)).await.unwrap_or_else(|e| panic!("{kind}: {e}"));
        let got = api.get("w").await.unwrap();
        assert_eq!(got.metadata.generation, Some(1), "{kind}");
    }
}
