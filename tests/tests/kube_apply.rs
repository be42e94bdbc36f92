//! Container packages applied to a real Kubernetes API server (etcd + apiextensions-apiserver):
//! server-side apply as the gateway's field manager, no-op re-applies, pruning what a newer
//! version dropped (but not what somebody took over), and the server's rejections.
//!
//! The server has no core API group, so the packages are made of custom resources: a test CRD's
//! `Widget` (namespaced) and `Gadget` (cluster-scoped), and the BPA's `Software`.

use std::path::Path;

use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use landfall_tests::kube::KubeApiServer;
use landfall_tests::kube_site::WIDGET_CRD;
use serde_json::json;
use site_gateway::backend::BackendError;
use site_gateway::kube_site::FIELD_MANAGER;
use site_gateway::kube_site::apply::{ApplySummary, ManifestApplier};
use tempfile::TempDir;

const PACKAGE: &str = "web";
const LABEL: &str = "landfall.io/package";
const ANNOTATION: &str = "landfall.io/package-version";

const GADGET_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: gadgets.apps.landfall.test}
spec:
  group: apps.landfall.test
  scope: Cluster
  names: {plural: gadgets, singular: gadget, kind: Gadget, listKind: GadgetList}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: string, enum: [small, large]}
"#;

fn widget(name: &str, replicas: u32) -> String {
    format!(
        "apiVersion: apps.landfall.test/v1\nkind: Widget\nmetadata:\n  name: {name}\n\
         spec:\n  replicas: {replicas}\n  image: nginx:1.27\n"
    )
}

fn gadget(name: &str) -> String {
    format!("apiVersion: apps.landfall.test/v1\nkind: Gadget\nmetadata:\n  name: {name}\nspec:\n  size: small\n")
}

fn software(name: &str) -> String {
    format!(
        "apiVersion: bpa.akraino.org/v1alpha1\nkind: Software\nmetadata:\n  name: {name}\n  namespace: tools\n\
         spec:\n  masterSoftware: [curl, htop]\n  workerSoftware: [curl]\n"
    )
}

fn package(documents: &[String]) -> Vec<u8> {
    documents.iter().map(|d| format!("---\n{d}")).collect::<String>().into_bytes()
}

/// v1: a namespaced Widget in the client's default namespace, a cluster-scoped Gadget, and a
/// Software in its own namespace.
fn v1() -> Vec<u8> {
    package(&[widget("frontend", 2), gadget("router"), software("toolbox")])
}

fn ids(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|s| (*s).to_owned()).collect()
}

struct Site {
    _server: KubeApiServer,
    client: kube::Client,
    state: TempDir,
    applier: ManifestApplier,
}

impl Site {
    async fn start() -> Site {
        let server = KubeApiServer::start().await;
        server.install_crd(WIDGET_CRD).await;
        server.install_crd(GADGET_CRD).await;
        let client = server.client().await;
        let state = tempfile::tempdir().unwrap();
        let applier = ManifestApplier::new(client.clone(), state.path().join("packages"));
        Site { _server: server, client, state, applier }
    }

    fn default_ns(&self) -> String {
        self.client.default_namespace().to_owned()
    }

    fn widgets(&self, ns: &str) -> Api<DynamicObject> {
        let gvk = GroupVersionKind::gvk("apps.landfall.test", "v1", "Widget");
        Api::namespaced_with(self.client.clone(), ns, &ApiResource::from_gvk_with_plural(&gvk, "widgets"))
    }

    fn gadgets(&self) -> Api<DynamicObject> {
        let gvk = GroupVersionKind::gvk("apps.landfall.test", "v1", "Gadget");
        Api::all_with(self.client.clone(), &ApiResource::from_gvk_with_plural(&gvk, "gadgets"))
    }

    fn softwares(&self) -> Api<DynamicObject> {
        let gvk = GroupVersionKind::gvk("bpa.akraino.org", "v1alpha1", "Software");
        Api::namespaced_with(self.client.clone(), "tools", &ApiResource::from_gvk_with_plural(&gvk, "softwares"))
    }

    /// The three objects of [`v1`], as the server has them now.
    async fn v1_objects(&self) -> Vec<DynamicObject> {
        vec![
            self.widgets(&self.default_ns()).get("frontend").await.unwrap(),
            self.gadgets().get("router").await.unwrap(),
            self.softwares().get("toolbox").await.unwrap(),
        ]
    }

    async fn apply(&self, version: &str, manifests: &[u8]) -> Result<ApplySummary, BackendError> {
        self.applier.apply(PACKAGE, version, manifests).await
    }

    /// The package's inventory file, `None` when there is none.
    fn inventory(&self) -> Option<serde_json::Value> {
        inventory_at(&self.state.path().join("packages").join(format!("{PACKAGE}.json")))
    }

    /// The version the inventory records as applied, and its objects as ids.
    fn recorded(&self) -> (String, Vec<String>) {
        let Some(inventory) = self.inventory() else { return (String::new(), Vec::new()) };
        let objects = inventory["objects"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| match o["namespace"].as_str() {
                Some(ns) => format!("{}/{ns}/{}", o["kind"].as_str().unwrap(), o["name"].as_str().unwrap()),
                None => format!("{}/{}", o["kind"].as_str().unwrap(), o["name"].as_str().unwrap()),
            })
            .collect();
        (inventory["version"].as_str().unwrap().to_owned(), objects)
    }
}

fn inventory_at(path: &Path) -> Option<serde_json::Value> {
    std::fs::read(path).ok().map(|b| serde_json::from_slice(&b).unwrap())
}

fn permanent(result: Result<ApplySummary, BackendError>) -> String {
    match result {
        Err(e @ BackendError::Permanent { .. }) => e.reason(),
        other => panic!("want a permanent error, got {other:?}"),
    }
}

fn resource_versions(objects: &[DynamicObject]) -> Vec<String> {
    objects.iter().map(|o| o.metadata.resource_version.clone().unwrap()).collect()
}

fn label(o: &DynamicObject) -> Option<&str> {
    o.metadata.labels.as_ref()?.get(LABEL).map(String::as_str)
}

fn annotation(o: &DynamicObject) -> Option<&str> {
    o.metadata.annotations.as_ref()?.get(ANNOTATION).map(String::as_str)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_version_applies_every_object_labelled_and_owned_by_the_gateway() {
    let site = Site::start().await;
    let ns = site.default_ns();

    let summary = site.apply("1.0.0", &v1()).await.unwrap();

    let all = ids(&[&format!("Widget/{ns}/frontend"), "Gadget/router", "Software/tools/toolbox"]);
    assert_eq!(
        summary,
        ApplySummary { applied: all.clone(), objects: summary.objects.clone(), ..ApplySummary::default() }
    );
    let objects = site.v1_objects().await;
    for o in &objects {
        assert_eq!(label(o), Some(PACKAGE), "{:?}", o.metadata);
        assert_eq!(annotation(o), Some("1.0.0"), "{:?}", o.metadata);
        let managers = o.metadata.managed_fields.as_deref().unwrap_or_default();
        assert!(
            managers
                .iter()
                .any(|m| m.manager.as_deref() == Some(FIELD_MANAGER) && m.operation.as_deref() == Some("Apply")),
            "{FIELD_MANAGER} applied it: {managers:?}"
        );
        assert_eq!(managers.len(), 1, "nobody else manages it: {managers:?}");
    }
    assert_eq!(objects[0].metadata.namespace.as_deref(), Some(ns.as_str()), "the client's default namespace");
    assert_eq!(objects[0].data["spec"]["replicas"], 2);
    assert_eq!(objects[1].metadata.namespace, None, "Gadgets are cluster-scoped");
    assert_eq!(objects[2].data["spec"]["masterSoftware"], json!(["curl", "htop"]));
    assert_eq!(site.recorded(), ("1.0.0".to_owned(), all));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applying_the_same_version_again_changes_nothing() {
    let site = Site::start().await;
    site.apply("1.0.0", &v1()).await.unwrap();
    let before = site.v1_objects().await;

    let again = site.apply("1.0.0", &v1()).await.unwrap();

    let all = ids(&[&format!("Widget/{}/frontend", site.default_ns()), "Gadget/router", "Software/tools/toolbox"]);
    assert_eq!(
        again,
        ApplySummary { unchanged: all.clone(), objects: again.objects.clone(), ..ApplySummary::default() }
    );
    let after = site.v1_objects().await;
    assert_eq!(resource_versions(&after), resource_versions(&before), "no new resourceVersion");
    assert_eq!(site.recorded(), ("1.0.0".to_owned(), all));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_version_updates_changed_objects_and_prunes_dropped_ones() {
    let site = Site::start().await;
    let ns = site.default_ns();
    site.apply("1.0.0", &v1()).await.unwrap();
    let before = site.v1_objects().await;

    // v2 drops the Gadget, changes the Widget's replicas, keeps the Software as it was.
    let v2 = package(&[widget("frontend", 3), software("toolbox")]);
    let summary = site.apply("2.0.0", &v2).await.unwrap();

    let kept = ids(&[&format!("Widget/{ns}/frontend"), "Software/tools/toolbox"]);
    // Every kept object is re-annotated with the new version, so none is unchanged.
    assert_eq!(
        summary,
        ApplySummary {
            applied: kept.clone(),
            unchanged: vec![],
            pruned: ids(&["Gadget/router"]),
            objects: summary.objects.clone()
        }
    );
    assert_eq!(site.gadgets().get_opt("router").await.unwrap().map(|o| o.metadata), None, "pruned");
    let frontend = site.widgets(&ns).get("frontend").await.unwrap();
    assert_eq!(frontend.data["spec"]["replicas"], 3);
    assert_eq!(annotation(&frontend), Some("2.0.0"));
    assert_ne!(frontend.metadata.resource_version, before[0].metadata.resource_version);
    let toolbox = site.softwares().get("toolbox").await.unwrap();
    assert_eq!(annotation(&toolbox), Some("2.0.0"));
    assert_eq!(site.recorded(), ("2.0.0".to_owned(), kept));

    // Dropping what is already gone is fine: v3 drops the Widget, which someone deleted.
    site.widgets(&ns).delete("frontend", &Default::default()).await.unwrap();
    let summary = site.apply("3.0.0", &package(&[software("toolbox")])).await.unwrap();
    assert_eq!(summary.pruned, Vec::<String>::new(), "nothing left to delete");
    assert_eq!(site.recorded(), ("3.0.0".to_owned(), ids(&["Software/tools/toolbox"])));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_somebody_took_over_are_not_pruned() {
    let site = Site::start().await;
    let ns = site.default_ns();
    site.apply("1.0.0", &v1()).await.unwrap();

    // Somebody takes the Gadget over by removing the package's label, and the Software by
    // relabelling it as another package's.
    let update = PatchParams { field_manager: Some("operator".into()), ..PatchParams::default() };
    let unlabel = json!({"metadata": {"labels": {LABEL: null}}});
    site.gadgets().patch("router", &update, &Patch::Merge(&unlabel)).await.unwrap();
    let relabel = json!({"metadata": {"labels": {LABEL: "other"}}});
    site.softwares().patch("toolbox", &update, &Patch::Merge(&relabel)).await.unwrap();

    let summary = site.apply("2.0.0", &package(&[widget("frontend", 2)])).await.unwrap();

    assert_eq!(summary.applied, ids(&[&format!("Widget/{ns}/frontend")]));
    assert_eq!(summary.pruned, Vec::<String>::new(), "neither is the package's any more");
    let router = site.gadgets().get("router").await.unwrap();
    assert_eq!(label(&router), None);
    let toolbox = site.softwares().get("toolbox").await.unwrap();
    assert_eq!(label(&toolbox), Some("other"));
    assert_eq!(site.recorded(), ("2.0.0".to_owned(), ids(&[&format!("Widget/{ns}/frontend")])));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_field_another_manager_owns_is_a_permanent_conflict_and_nothing_is_recorded() {
    let site = Site::start().await;
    let ns = site.default_ns();
    let theirs = json!({
        "apiVersion": "apps.landfall.test/v1", "kind": "Widget",
        "metadata": {"name": "frontend", "namespace": ns},
        "spec": {"replicas": 5},
    });
    site.widgets(&ns).patch("frontend", &PatchParams::apply("autoscaler"), &Patch::Apply(&theirs)).await.unwrap();

    let message = permanent(site.apply("1.0.0", &v1()).await);

    assert!(message.contains("conflict") && message.contains("autoscaler"), "{message}");
    assert!(message.contains("replicas"), "{message}");
    assert!(message.contains(&format!("Widget/{ns}/frontend")), "{message}");
    let frontend = site.widgets(&ns).get("frontend").await.unwrap();
    assert_eq!(frontend.data["spec"]["replicas"], 5, "their value stands");
    assert_eq!(label(&frontend), None, "the failed apply changed nothing");
    assert_eq!(site.recorded(), (String::new(), vec![]), "no inventory recorded");

    // After a success, a conflict leaves the recorded inventory as it was.
    let ours = package(&[widget("backend", 1)]);
    site.apply("1.0.0", &ours).await.unwrap();
    let theirs = json!({
        "apiVersion": "apps.landfall.test/v1", "kind": "Widget",
        "metadata": {"name": "backend", "namespace": ns},
        "spec": {"replicas": 7},
    });
    let force = PatchParams::apply("autoscaler").force();
    site.widgets(&ns).patch("backend", &force, &Patch::Apply(&theirs)).await.unwrap();
    let message = permanent(site.apply("2.0.0", &package(&[widget("backend", 2), gadget("router")])).await);
    assert!(message.contains("autoscaler"), "{message}");
    assert_eq!(site.recorded(), ("1.0.0".to_owned(), ids(&[&format!("Widget/{ns}/backend")])));
    assert_eq!(site.gadgets().get_opt("router").await.unwrap().map(|o| o.metadata), None, "stopped at the conflict");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifests_the_server_or_the_parser_rejects_are_permanent() {
    let site = Site::start().await;
    let ns = site.default_ns();

    let many = "apiVersion: apps.landfall.test/v1\nkind: Widget\nmetadata: {name: frontend}\nspec: {replicas: many}\n";
    let message = permanent(site.apply("1.0.0", many.as_bytes()).await);
    assert!(message.contains("replicas"), "the schema's complaint: {message}");
    assert_eq!(site.widgets(&ns).get_opt("frontend").await.unwrap().map(|o| o.metadata), None);
    // The apiextensions-apiserver answers both of these with a 500 (kubernetes/kubernetes#139253),
    // a value the schema's validation rejects with a 422.
    let undeclared =
        "apiVersion: apps.landfall.test/v1\nkind: Widget\nmetadata: {name: frontend}\nspec: {colour: red}\n";
    let message = permanent(site.apply("1.0.0", undeclared.as_bytes()).await);
    assert!(message.contains("colour"), "the schema's complaint: {message}");
    let negative =
        "apiVersion: apps.landfall.test/v1\nkind: Widget\nmetadata: {name: frontend}\nspec: {replicas: -1}\n";
    let message = permanent(site.apply("1.0.0", negative.as_bytes()).await);
    assert!(message.contains("spec.replicas") && message.contains("greater than or equal to 0"), "{message}");
    assert_eq!(site.widgets(&ns).get_opt("frontend").await.unwrap().map(|o| o.metadata), None);

    let no_kind = format!("{}---\napiVersion: apps.landfall.test/v1\nmetadata: {{name: nameless}}\n", gadget("router"));
    let message = permanent(site.apply("1.0.0", no_kind.as_bytes()).await);
    assert!(message.contains("document 2") && message.contains("kind"), "{message}");
    assert_eq!(site.gadgets().get_opt("router").await.unwrap().map(|o| o.metadata), None, "nothing applied");

    let unknown =
        package(&[gadget("router"), "apiVersion: apps.landfall.test/v1\nkind: Sprocket\nmetadata: {name: s}\n".into()]);
    let message = permanent(site.apply("1.0.0", &unknown).await);
    assert!(message.contains("Sprocket"), "{message}");
    let unknown_group = "apiVersion: nowhere.landfall.test/v1\nkind: Gizmo\nmetadata: {name: g}\n";
    let message = permanent(site.apply("1.0.0", unknown_group.as_bytes()).await);
    assert!(message.contains("Gizmo") && message.contains("nowhere.landfall.test/v1"), "{message}");
    assert_eq!(site.gadgets().get_opt("router").await.unwrap().map(|o| o.metadata), None, "nothing applied");

    assert_eq!(site.recorded(), (String::new(), vec![]), "no inventory recorded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_a_failed_apply_created_are_pruned_by_the_next_version_without_them() {
    let site = Site::start().await;
    let ns = site.default_ns();
    site.apply("1.0.0", &package(&[widget("frontend", 1)])).await.unwrap();

    // v2 creates the Gadget, then the server rejects its last object.
    let bad = "apiVersion: apps.landfall.test/v1\nkind: Widget\nmetadata: {name: broken}\nspec: {replicas: -1}\n";
    let v2 = package(&[widget("frontend", 2), gadget("router"), bad.into()]);
    permanent(site.apply("2.0.0", &v2).await);
    assert!(site.gadgets().get_opt("router").await.unwrap().is_some(), "applied before the failure");
    assert_eq!(site.recorded(), ("1.0.0".to_owned(), ids(&[&format!("Widget/{ns}/frontend")])));

    let summary = site.apply("3.0.0", &package(&[widget("frontend", 3)])).await.unwrap();

    assert_eq!(summary.pruned, ids(&["Gadget/router"]));
    assert_eq!(site.gadgets().get_opt("router").await.unwrap().map(|o| o.metadata), None);
    assert_eq!(site.recorded(), ("3.0.0".to_owned(), ids(&[&format!("Widget/{ns}/frontend")])));
    assert_eq!(site.inventory().unwrap().get("pending"), None, "nothing pending after a success");
}

/// A package's Deployments, DaemonSets, StatefulSets and Jobs must come up before it is done:
/// the wait ends when their controllers (played here) report them available, fails naming what
/// is not when the time-out passes, and fails at once for a Job that failed.
#[tokio::test]
async fn a_packages_workloads_are_waited_for_until_available() {
    use site_gateway::kube_site::workloads::wait_available;
    use std::time::Duration;
    let server = KubeApiServer::start().await;
    let client = server.client().await;
    let dir = TempDir::new().unwrap();
    let applier = ManifestApplier::new(client.clone(), dir.path().to_path_buf());
    let manifests = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: apps}\nspec:\n  replicas: 2\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec: {containers: [{name: web, image: registry.local/web:1}]}\n---\napiVersion: batch/v1\nkind: Job\nmetadata: {name: migrate, namespace: apps}\nspec:\n  template:\n    spec: {restartPolicy: Never, containers: [{name: m, image: registry.local/m:1}]}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings, namespace: apps}\ndata: {a: b}\n";
    let summary = applier.apply(PACKAGE, "1.0.0", manifests.as_bytes()).await.unwrap();
    assert_eq!(summary.objects.len(), 3);
    let resource = |api_version: &str, kind: &str, plural: &str| {
        let (group, version) = api_version.split_once('/').unwrap();
        ApiResource {
            group: group.into(),
            version: version.into(),
            api_version: api_version.into(),
            kind: kind.into(),
            plural: plural.into(),
        }
    };
    let deployments: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), "apps", &resource("apps/v1", "Deployment", "deployments"));
    let jobs: Api<DynamicObject> = Api::namespaced_with(client.clone(), "apps", &resource("batch/v1", "Job", "jobs"));

    // Nothing reported yet: the wait ends at its time-out, naming both.
    let poll = Duration::from_millis(100);
    let err = wait_available(&client, &summary.objects, Duration::from_millis(300), poll).await.unwrap_err();
    let reason = err.reason();
    assert!(reason.contains("Deployment apps/web: its controller has not seen it yet"), "{reason}");
    assert!(reason.contains("Job apps/migrate: 0 of 1 completed"), "{reason}");

    // The controllers report one replica, then both, and the Job complete.
    let status = |d: serde_json::Value| Patch::Merge(json!({ "status": d }));
    let one = status(json!({"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 1}));
    deployments.patch_status("web", &PatchParams::default(), &one).await.unwrap();
    let err = wait_available(&client, &summary.objects, Duration::from_millis(300), poll).await.unwrap_err();
    assert!(err.reason().contains("Deployment apps/web: 1 of 2 available, 2 updated"), "{}", err.reason());
    let (deployments2, jobs2) = (deployments.clone(), jobs.clone());
    let controllers = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let all = status(json!({"availableReplicas": 2}));
        deployments2.patch_status("web", &PatchParams::default(), &all).await.unwrap();
        let done = status(json!({"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}));
        jobs2.patch_status("migrate", &PatchParams::default(), &done).await.unwrap();
    });
    wait_available(&client, &summary.objects, Duration::from_secs(20), poll).await.unwrap();
    controllers.await.unwrap();

    // A Job that failed fails the wait at once, with its reason.
    let failed = status(json!({"conditions": [{"type": "Complete", "status": "False"},
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit"}]}));
    jobs.patch_status("migrate", &PatchParams::default(), &failed).await.unwrap();
    let started = std::time::Instant::now();
    let err = wait_available(&client, &summary.objects, Duration::from_secs(60), poll).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(matches!(err, BackendError::Permanent { .. }));
    assert!(err.reason().contains("Job apps/migrate: failed: BackoffLimitExceeded"), "{}", err.reason());
}
