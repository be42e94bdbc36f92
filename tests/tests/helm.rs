//! Helm charts rendered at the hub with the real helm binary (`scripts/ensure-helm`): charts
//! written here (a CRD, hooks, a test hook, a subchart, a values schema, a required value, a
//! Kubernetes version and API-version capability), rendered for two sites with their own values
//! and split in the order Helm installs them; bad charts and values refused with helm's reason.

use consumers::helm::{ChartTraits, Helm, HelmError, Rendered, Template, traits};
use landfall_tests::helm::{Chart, helm_bin};
use serde_json::{Value, json};

const CONFIG: &str = r#"apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .Release.Name }}-config
data:
  site: {{ required "site.name is required" .Values.site.name | quote }}
  greeting: {{ .Values.greeting | quote }}
  kubernetes: {{ .Capabilities.KubeVersion.Version | quote }}
"#;

const WIDGET: &str = r#"apiVersion: apps.landfall.test/v1
kind: Widget
metadata:
  name: {{ .Release.Name }}-widget
spec:
  replicas: {{ .Values.replicas }}
  image: registry.local/widget:1
"#;

const MONITOR: &str = r#"{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" }}
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata:
  name: {{ .Release.Name }}-monitor
spec: {}
{{- end }}
"#;

const PRE_HOOK: &str = r#"apiVersion: batch/v1
kind: Job
metadata:
  name: {{ .Release.Name }}-migrate
  annotations:
    helm.sh/hook: pre-install,pre-upgrade
    helm.sh/hook-weight: "-5"
    helm.sh/hook-delete-policy: hook-succeeded
spec:
  template:
    spec:
      restartPolicy: Never
      containers: [{name: migrate, image: registry.local/migrate:1}]
"#;

const EARLY_HOOK: &str = r#"apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .Release.Name }}-early
  annotations:
    helm.sh/hook: pre-install
    helm.sh/hook-weight: "-10"
data: {}
"#;

const POST_HOOK: &str = r#"apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .Release.Name }}-done
  annotations:
    helm.sh/hook: post-install,post-upgrade
data: {}
"#;

const TEST_HOOK: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: {{ .Release.Name }}-test
  annotations:
    helm.sh/hook: test
spec:
  containers: [{name: t, image: registry.local/t:1}]
"#;

const SCHEMA: &str = r#"{
  "$schema": "https://json-schema.org/draft-07/schema#",
  "type": "object",
  "properties": {
    "replicas": {"type": "integer", "minimum": 0},
    "greeting": {"type": "string"}
  }
}"#;

const SUB_CONFIG: &str = r#"apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .Release.Name }}-sub
data:
  colour: {{ .Values.colour | quote }}
"#;

/// The add-ons chart every test starts from.
fn addons(version: &str) -> Chart {
    Chart::new("edge-addons", version)
        .file("values.yaml", "greeting: hello\nreplicas: 1\nsite: {}\nsub:\n  colour: blue\n")
        .file("values.schema.json", SCHEMA)
        .file("crds/widgets.yaml", landfall_tests::kube_site::WIDGET_CRD)
        .file("templates/config.yaml", CONFIG)
        .file("templates/widget.yaml", WIDGET)
        .file("templates/monitor.yaml", MONITOR)
        .file("templates/migrate.yaml", PRE_HOOK)
        .file("templates/early.yaml", EARLY_HOOK)
        .file("templates/done.yaml", POST_HOOK)
        .file("templates/tests/test.yaml", TEST_HOOK)
        .file("charts/sub/Chart.yaml", "apiVersion: v2\nname: sub\nversion: 0.1.0\n")
        .file("charts/sub/values.yaml", "colour: red\n")
        .file("charts/sub/templates/config.yaml", SUB_CONFIG)
}

async fn render(chart: &Chart, values: Value, kube: &str, apis: &[&str]) -> Result<Rendered, HelmError> {
    let apis: Vec<String> = apis.iter().map(|a| a.to_string()).collect();
    let values = [json!({"greeting": "hello from the package"}), values];
    let t = Template {
        chart: chart.archive(),
        release: "addons",
        namespace: "apps",
        values: &values,
        kube_version: Some(kube),
        api_versions: &apis,
    };
    Helm::new(helm_bin()).template(&t).await
}

fn names(objects: &[Value]) -> Vec<String> {
    objects
        .iter()
        .map(|o| format!("{}/{}", o["kind"].as_str().unwrap(), o["metadata"]["name"].as_str().unwrap()))
        .collect()
}

fn config(r: &Rendered) -> &Value {
    &r.objects.iter().find(|o| o["metadata"]["name"] == "addons-config").expect("the config")["data"]
}

#[tokio::test]
async fn a_chart_renders_per_site_with_its_values_in_the_order_helm_installs_it() {
    let helm = Helm::new(helm_bin());
    assert!(helm.version().await.unwrap().starts_with("v4."));
    let chart = addons("1.0.0").package();

    let a =
        render(&chart, json!({"site": {"name": "edge-a"}, "replicas": 2}), "v1.29.2", &["monitoring.coreos.com/v1"])
            .await
            .unwrap();
    assert_eq!(names(&a.crds), ["CustomResourceDefinition/widgets.apps.landfall.test"]);
    let hooks = |hooks: &[consumers::helm::Hook]| {
        hooks.iter().map(|h| (h.object["metadata"]["name"].as_str().unwrap().to_string(), h.weight)).collect::<Vec<_>>()
    };
    assert_eq!(
        hooks(&a.pre),
        [("addons-early".to_string(), -10), ("addons-migrate".to_string(), -5)],
        "lightest first"
    );
    assert_eq!(a.pre[1].delete_policies, ["hook-succeeded"]);
    assert_eq!(a.pre[0].delete_policies, ["before-hook-creation"], "Helm's default");
    assert_eq!(hooks(&a.post), [("addons-done".to_string(), 0)]);
    assert!(a.unused_hooks.is_empty(), "{:?}", a.unused_hooks);
    let mut objects = names(&a.objects);
    objects.sort();
    assert_eq!(
        objects,
        ["ConfigMap/addons-config", "ConfigMap/addons-sub", "ServiceMonitor/addons-monitor", "Widget/addons-widget"],
        "the subchart's object in, the test hook out"
    );
    assert_eq!(config(&a)["site"], "edge-a");
    assert_eq!(config(&a)["greeting"], "hello from the package", "the package's layer over the chart's defaults");
    assert_eq!(config(&a)["kubernetes"], "v1.29.2");
    let sub = a.objects.iter().find(|o| o["metadata"]["name"] == "addons-sub").unwrap();
    assert_eq!(sub["data"]["colour"], "blue", "the parent's values reach the subchart");

    // Another site: its own values, its own Kubernetes version, a cluster without the
    // monitoring API.
    let b = render(&chart, json!({"site": {"name": "edge-b"}, "replicas": 3}), "v1.30.1", &[]).await.unwrap();
    assert_eq!(config(&b)["site"], "edge-b");
    assert_eq!(config(&b)["kubernetes"], "v1.30.1");
    assert!(!names(&b.objects).contains(&"ServiceMonitor/addons-monitor".to_string()));
    let widget = b.objects.iter().find(|o| o["kind"] == "Widget").unwrap();
    assert_eq!(widget["spec"]["replicas"], 3);

    // The same inputs render the same.
    let again = render(&chart, json!({"site": {"name": "edge-b"}, "replicas": 3}), "v1.30.1", &[]).await.unwrap();
    assert_eq!(again, b);
}

#[tokio::test]
async fn a_chart_helm_cannot_render_is_refused_with_helms_reason() {
    let chart = addons("1.0.0").package();
    let refused = |r: Result<Rendered, HelmError>| match r {
        Err(HelmError::Refused(reason)) => reason,
        other => panic!("not refused: {other:?}"),
    };

    // A required value missing.
    let reason = refused(render(&chart, json!({}), "v1.29.2", &[]).await);
    assert!(reason.contains("site.name is required"), "{reason}");

    // Values the chart's schema refuses.
    let reason = refused(render(&chart, json!({"site": {"name": "e"}, "replicas": -1}), "v1.29.2", &[]).await);
    assert!(reason.contains("replicas") && reason.contains("schema"), "{reason}");

    // A broken template.
    let broken = addons("1.0.1").file("templates/broken.yaml", "kind: {{ .Values.greeting\n").package();
    let reason = refused(render(&broken, json!({"site": {"name": "e"}}), "v1.29.2", &[]).await);
    assert!(reason.contains("broken.yaml"), "{reason}");

    // A Kubernetes version the chart does not run on.
    let newer = Chart::new("needs-new", "1.0.0")
        .file("Chart.yaml", "apiVersion: v2\nname: needs-new\nversion: 1.0.0\nkubeVersion: \">=1.30.0-0\"\n")
        .file("templates/cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n")
        .package();
    let reason = refused(render(&newer, json!({}), "v1.29.2", &[]).await);
    assert!(reason.contains("kubeVersion") || reason.contains("incompatible"), "{reason}");
    assert!(render(&newer, json!({}), "v1.30.1", &[]).await.is_ok());
}

/// A chart that calls `lookup` (which finds nothing without a cluster) or makes random values is
/// named as such, template by template; one that does neither has no traits.
#[tokio::test]
async fn a_chart_that_looks_up_or_makes_random_values_is_named_as_such() {
    assert_eq!(traits(addons("1.0.0").package().archive()).await.unwrap(), ChartTraits::default());
    let chart = addons("1.1.0")
        .file(
            "templates/password.yaml",
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: pw\nstringData:\n  pw: {{ randAlphaNum 16 }}\n",
        )
        .file(
            "charts/sub/templates/existing.yaml",
            "{{- $cm := (lookup \"v1\" \"ConfigMap\" \"apps\" \"x\") }}\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: seen\n",
        )
        // A value that only reads like one (`.Values.lookup`) is not a call.
        .file("templates/named.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Values.lookup | default \"n\" }}\n")
        .package();
    let found = traits(chart.archive()).await.unwrap();
    assert_eq!(found.lookup, ["edge-addons/charts/sub/templates/existing.yaml"]);
    assert_eq!(found.random, ["edge-addons/templates/password.yaml"]);

    let not_a_chart = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(not_a_chart.path(), b"not gzip").unwrap();
    assert!(matches!(traits(not_a_chart.path()).await, Err(HelmError::Refused(_))));
}
