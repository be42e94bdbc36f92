//! A failed node put back by itself on a real site: the real `landfall-gateway --backend kube`
//! against a real Kubernetes API server, the real hub on a real nats-server. A kubelet that never
//! comes up Ready at its new version is reinstalled at the one it ran; a container package whose
//! Job fails has its previous version's manifests applied again.

use std::time::Duration;

use bus_schema::names;
use bus_schema::pb::{self, BusEvent, BusMessage};
use bus_schema::runtime::{Envelope, ReadEvent};
use kube::api::Api;
use landfall_tests::fleet::{self, node_steps};
use landfall_tests::kube_site::{APPS, KubeSiteRig, mac, widget_manifests};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(90);

async fn install(rig: &KubeSiteRig) -> Vec<ReadEvent> {
    rig.install(TIMEOUT).await
}

/// Registers `package` and rolls it out with failed nodes rolled back; the rollout's events.
async fn roll_out_rolling_back(rig: &KubeSiteRig, package: pb::Package) -> Vec<ReadEvent> {
    let registered = Envelope::root();
    let cmd = pb::RegisterPackage { package: Some(package.clone()), auto_rollout: None };
    rig.bus.publish_command(&cmd, &registered).await.unwrap();
    rig.wait_for(pb::PackageRegistered::filter(), &registered.id).await.expect("registered");
    let strategy = pb::RolloutStrategy {
        failure_threshold: "100%".into(),
        on_failure: pb::OnNodeFailure::RollBack as i32,
        ..Default::default()
    };
    let cmd = pb::PatchPackage {
        name: package.name,
        version: package.version,
        strategy: Some(strategy),
        ..Default::default()
    };
    let env = Envelope::root();
    rig.bus.publish_command(&cmd, &env).await.unwrap();
    let ends = [pb::RolloutCompleted::TYPE, pb::RolloutHalted::TYPE, pb::CommandRejected::TYPE];
    fleet::collect(&rig.bus, names::EVENTS_ALL.into(), "rollout", &env.id, &ends, TIMEOUT).await.events
}

fn of_type<M: BusMessage>(events: &[ReadEvent]) -> Vec<M> {
    events.iter().filter(|e| e.delivery.type_name == M::TYPE).map(|e| e.delivery.decode().unwrap()).collect()
}

const MIGRATE: &str = "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: migrate\n  namespace: apps\nspec:\n  template:\n    spec:\n      restartPolicy: Never\n      containers: [{name: migrate, image: registry.local/migrate:2}]\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bad_kubelet_and_a_bad_container_package_are_rolled_back_on_the_node() {
    let mut rig = KubeSiteRig::start().await;
    rig.start_gateway();
    rig.create_host("m-1", "master", &mac(1), "10.1.0.11").await;
    rig.wait_design(|n| n.len() == 1).await;
    let installed = install(&rig).await;
    let last = installed.last().map(|e| e.delivery.type_name.clone());
    assert_eq!(last.as_deref(), Some(pb::SiteInstalled::TYPE), "{}", rig.gateway_log());

    // kubelet 1.29.3 installs, but the node never comes up Ready at it.
    rig.kubelets.bad_version("1.29.3");
    let demo = producers::up::demo_packages();
    let kubelet =
        pb::Package { version: "1.29.3".into(), ..demo.iter().find(|p| p.name == "kubelet").unwrap().clone() };
    let rolled = roll_out_rolling_back(&rig, kubelet).await;
    let steps = node_steps(&rolled);
    assert_eq!(
        steps,
        // The way back is a patch of its own: out of service (still), back to 1.29.2, seen
        // Ready, in service again.
        [
            "m-1 cordoned",
            "m-1 drained []",
            "m-1 failed",
            "m-1 cordoned",
            "m-1 drained []",
            "m-1 uncordoned",
            "m-1 rolled back"
        ],
        "{}",
        rig.gateway_log()
    );
    let failed = &of_type::<pb::NodePatchFailed>(&rolled)[0];
    assert!(failed.reason.contains("not seen Ready at kubelet v1.29.3"), "{}", failed.reason);
    let back = &of_type::<pb::NodeRolledBack>(&rolled)[0];
    assert_eq!((back.package.clone().unwrap().version.as_str(), back.failed_version.as_str()), ("1.29.2", "1.29.3"));
    let versions: Vec<String> =
        rig.kubelets.versions().into_iter().filter(|(n, _)| n == "m-1").map(|(_, v)| v).collect();
    assert_eq!(versions, ["1.29.2", "1.29.3", "1.29.2"], "installed, patched, and back");
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(rig.client.clone());
    assert_eq!(nodes.get("m-1").await.unwrap().spec.unwrap().unschedulable, None, "in service again");

    // edge-apps 2.0.0 adds a Job that fails: version 1.0.0's manifests are applied again.
    let v2 = format!("{}---\n{MIGRATE}", widget_manifests(&["alpha", "beta", "gamma"], 2));
    let edge_apps = rig.upload_container("edge-apps", "2.0.0", &v2).await;
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(rig.client.clone(), APPS);
    let failing = tokio::spawn(async move {
        loop {
            if let Ok(Some(job)) = jobs.get_opt("migrate").await
                && job.status.as_ref().and_then(|s| s.conditions.as_ref()).is_none()
            {
                let status = json!({"status": {"conditions": [{"type": "Failed", "status": "True",
                    "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit"}]}});
                let _ = jobs.patch_status("migrate", &Default::default(), &kube::api::Patch::Merge(&status)).await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let rolled = roll_out_rolling_back(&rig, edge_apps).await;
    failing.abort();
    let types: Vec<&str> = rolled.iter().map(|e| e.delivery.type_name.as_str()).collect();
    assert_eq!(types.last(), Some(&pb::RolloutCompleted::TYPE), "{}", rig.gateway_log());
    let failed = &of_type::<pb::NodePatchFailed>(&rolled)[0];
    assert!(failed.reason.contains("BackoffLimitExceeded"), "{}", failed.reason);
    let back = &of_type::<pb::NodeRolledBack>(&rolled)[0];
    assert_eq!(back.package.clone().unwrap().version, "1.0.0");
    let res = kube::api::ApiResource {
        group: "apps.landfall.test".into(),
        version: "v1".into(),
        api_version: "apps.landfall.test/v1".into(),
        kind: "Widget".into(),
        plural: "widgets".into(),
    };
    let widgets: Api<kube::api::DynamicObject> = Api::namespaced_with(rig.client.clone(), APPS, &res);
    let names: Vec<String> =
        widgets.list(&Default::default()).await.unwrap().items.into_iter().filter_map(|w| w.metadata.name).collect();
    assert_eq!(names, ["alpha", "beta"], "version 1.0.0's objects, gamma pruned");
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(rig.client.clone(), APPS);
    assert!(jobs.get_opt("migrate").await.unwrap().is_none(), "the Job version 2.0.0 added is pruned");
    let report = &of_type::<pb::SitePatched>(&rolled)[0];
    assert!(report.failed[0].rolled_back, "{report:?}");
}
