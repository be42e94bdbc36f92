//! The Kubernetes manifests in `deploy/k8s`, checked offline: each overlay is rendered by a real
//! kustomize, every rendered object is validated against Kubernetes' API schemas by
//! kubernetes-validate (PyPI), and the properties the deployment relies on are asserted on the
//! rendered objects: replicas, probes, resources, disruption budgets, the gateway's RBAC, non-root
//! containers.
//!
//! Needs `LANDFALL_KUSTOMIZE` (`scripts/ensure-kustomize`: a `kubectl` or a `kustomize` binary)
//! and `LANDFALL_PYTHON` (`scripts/ensure-python-env`: a python with kubernetes-validate);
//! `scripts/test` sets both.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use serde_json::{Value, json};

const DEPLOY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/k8s");
/// The oldest and the newest Kubernetes the pinned kubernetes-validate has schemas for.
const KUBERNETES_VERSIONS: [&str; 2] = ["1.30", "1.37"];
const HUB_SERVICES: [&str; 5] = ["orchestrator", "observer", "kubeconfig", "distribution", "api"];
const HUB_NAMESPACE: &str = "landfall";
const SITE_NAMESPACE: &str = "metal3";

fn kustomize() -> PathBuf {
    match std::env::var_os("LANDFALL_KUSTOMIZE") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => panic!(
            "LANDFALL_KUSTOMIZE is not set: export LANDFALL_KUSTOMIZE=\"$(scripts/ensure-kustomize)\" \
             (a kubectl or a kustomize binary), or run the tests with scripts/test"
        ),
    }
}

/// `kubectl kustomize DIR` or `kustomize build DIR`, parsed into one value per object.
fn render(dir: &Path) -> Vec<Value> {
    let bin = kustomize();
    let mut cmd = Command::new(&bin);
    if bin.file_name().is_some_and(|n| n == "kubectl") {
        cmd.arg("kustomize");
    } else {
        cmd.arg("build");
    }
    let out = cmd.arg(dir).output().unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
    assert!(
        out.status.success(),
        "{} could not render {}:\n{}",
        bin.display(),
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("kustomize printed UTF-8");
    let objects: Vec<Value> = bus_schema::yaml::documents(&text)
        .into_iter()
        .map(|doc| doc.and_then(|d| d.parse::<Value>()).expect("kustomize printed YAML"))
        .filter(|v| !v.is_null())
        .collect();
    assert!(!objects.is_empty(), "{} rendered no objects", dir.display());
    objects
}

/// The rendered overlay, rendered once per test binary.
fn overlay(name: &str) -> &'static [Value] {
    static HUB: OnceLock<Vec<Value>> = OnceLock::new();
    static SITE: OnceLock<Vec<Value>> = OnceLock::new();
    let cell = match name {
        "hub" => &HUB,
        "site-edge-01" => &SITE,
        other => panic!("no overlay {other} in this test"),
    };
    cell.get_or_init(|| render(&Path::new(DEPLOY).join("overlays").join(name)))
}

fn every_overlay() -> impl Iterator<Item = (&'static str, &'static Value)> {
    ["hub", "site-edge-01"].into_iter().flat_map(|o| overlay(o).iter().map(move |v| (o, v)))
}

fn kind(v: &Value) -> &str {
    v["kind"].as_str().unwrap_or_default()
}

fn name(v: &Value) -> &str {
    v["metadata"]["name"].as_str().unwrap_or_default()
}

fn of_kind<'a>(objects: &'a [Value], k: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    objects.iter().filter(move |v| kind(v) == k)
}

fn labels(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string())).collect())
        .unwrap_or_default()
}

/// Whether `selector` (a map of labels to match) selects a pod with `pod_labels`.
fn selects(selector: &Value, pod_labels: &Value) -> bool {
    let want = labels(selector);
    let have = labels(pod_labels);
    !want.is_empty() && want.iter().all(|(k, v)| have.get(k) == Some(v))
}

fn containers(deployment: &Value) -> &[Value] {
    deployment["spec"]["template"]["spec"]["containers"].as_array().map(Vec::as_slice).unwrap_or_default()
}

/// One object's verdict from kubernetes-validate at one Kubernetes version.
#[derive(Debug, serde::Deserialize)]
struct Verdict {
    kind: String,
    name: String,
    version: String,
    /// None: valid. A missing schema counts as an error, not as a pass.
    error: Option<String>,
}

/// Strict validation: properties the schema does not know are errors too.
const VALIDATE: &str = r#"
import json, sys
import kubernetes_validate as kv

verdicts = []
for obj in json.load(sys.stdin):
    for version in sys.argv[1:]:
        try:
            kv.validate(obj, version, strict=True)
            error = None
        except kv.ValidationError as e:
            error = "%s: %s" % ("/".join(str(p) for p in e.path), e.message)
        except kv.SchemaNotFoundError as e:
            error = e.message
        verdicts.append({"kind": obj.get("kind", ""), "name": obj.get("metadata", {}).get("name", ""),
                         "version": version, "error": error})
json.dump(verdicts, sys.stdout)
"#;

fn validate(objects: &[Value]) -> Vec<Verdict> {
    let mut child = Command::new(landfall_tests::python())
        .args(["-c", VALIDATE])
        .args(KUBERNETES_VERSIONS)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start python");
    let input = serde_json::to_vec(objects).unwrap();
    child.stdin.take().unwrap().write_all(&input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "kubernetes-validate did not run (is it installed? scripts/ensure-python-env):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let verdicts: Vec<Verdict> = serde_json::from_slice(&out.stdout).expect("the validator printed JSON");
    assert_eq!(verdicts.len(), objects.len() * KUBERNETES_VERSIONS.len(), "one verdict per object and version");
    verdicts
}

#[test]
fn every_rendered_object_passes_the_kubernetes_schemas() {
    for name in ["hub", "site-edge-01"] {
        let objects = overlay(name);
        let failed: Vec<String> = validate(objects)
            .into_iter()
            .filter_map(|v| v.error.map(|e| format!("{}/{} (Kubernetes {}): {e}", v.kind, v.name, v.version)))
            .collect();
        assert!(failed.is_empty(), "overlays/{name} has objects Kubernetes would refuse:\n{}", failed.join("\n"));
        let kinds: BTreeSet<&str> = objects.iter().map(kind).collect();
        println!("overlays/{name}: {} objects valid for Kubernetes {KUBERNETES_VERSIONS:?}: {kinds:?}", objects.len());
    }
}

/// The schema check can fail: broken copies of a rendered Deployment are refused, and for the
/// reason that was broken, while the original passes.
#[test]
fn the_schema_check_refuses_a_broken_deployment() {
    let original = of_kind(overlay("hub"), "Deployment").next().expect("a hub Deployment").clone();

    let mut bad_replicas = original.clone();
    bad_replicas["spec"]["replicas"] = json!("two");
    let mut unknown_field = original.clone();
    unknown_field["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = json!("Always");
    let mut bad_probe_port = original.clone();
    bad_probe_port["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["port"] = json!([9090]);

    let verdicts = validate(&[original, bad_replicas, unknown_field, bad_probe_port]);
    let per_object: Vec<&[Verdict]> = verdicts.chunks(KUBERNETES_VERSIONS.len()).collect();
    for v in per_object[0] {
        assert_eq!(v.error, None, "the unchanged Deployment passes at {}", v.version);
    }
    let container = "spec/template/spec/containers/0";
    let expected = [
        ("spec/replicas".to_string(), "'two'"),
        (container.to_string(), "'imagePullPolicyy' was unexpected"),
        (format!("{container}/livenessProbe/httpGet/port"), "[9090]"),
    ];
    for (verdicts, (path, reason)) in per_object[1..].iter().zip(&expected) {
        for v in *verdicts {
            let error = v.error.as_deref().unwrap_or_else(|| panic!("{path}: accepted at Kubernetes {}", v.version));
            assert!(
                error.starts_with(&format!("{path}: ")) && error.contains(reason),
                "{path}: refused for another reason: {error}"
            );
        }
    }
}

#[test]
fn hub_deployments_are_replicated_probed_and_sized() {
    let objects = overlay("hub");
    let deployments: Vec<&Value> = of_kind(objects, "Deployment").collect();
    let names: BTreeSet<&str> = deployments.iter().map(|d| name(d)).collect();
    let expected: BTreeSet<String> = HUB_SERVICES.iter().map(|s| format!("landfall-{s}")).collect();
    assert_eq!(names, expected.iter().map(String::as_str).collect(), "one Deployment per hub service");

    for d in &deployments {
        let n = name(d);
        assert_eq!(d["metadata"]["namespace"], HUB_NAMESPACE, "{n}");
        let replicas = d["spec"]["replicas"].as_u64().unwrap_or_else(|| panic!("{n} sets no replicas"));
        assert!(replicas >= 2, "{n} runs {replicas} replica(s): the services are meant to run at least 2");
        let [c] = containers(d) else { panic!("{n} has one container") };
        let service = n.trim_start_matches("landfall-");
        assert_eq!(c["args"], json!(["serve", service]), "{n} runs its own service");
        assert_eq!(c["image"], "registry.example.com/landfall:0.1.0", "{n}: the overlay's image");
        for probe in ["livenessProbe", "readinessProbe"] {
            assert!(c[probe]["httpGet"]["path"].is_string(), "{n} has no HTTP {probe}");
        }
        for resource in ["cpu", "memory"] {
            assert!(c["resources"]["requests"][resource].is_string(), "{n} requests no {resource}");
            assert!(c["resources"]["limits"][resource].is_string(), "{n} has no {resource} limit");
        }
        let ports = c["ports"].as_array().cloned().unwrap_or_default();
        assert!(
            ports.iter().any(|p| p["name"] == "metrics" && p["containerPort"] == 9090),
            "{n} has no container port named metrics on 9090"
        );
        let env: BTreeMap<&str, &Value> =
            c["env"].as_array().into_iter().flatten().map(|e| (e["name"].as_str().unwrap_or_default(), e)).collect();
        assert_eq!(env["LANDFALL_METRICS_LISTEN"]["value"], "0.0.0.0:9090", "{n}");
        assert_eq!(env["LANDFALL_LOG_FORMAT"]["value"], "json", "{n}");
        for var in ["NATS_URL", "LANDFALL_NATS_NKEY_FILE", "LANDFALL_NATS_CA"] {
            assert!(env.contains_key(var), "{n} does not set {var}");
        }
        let nats_secret = d["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .find_map(|v| v["secret"]["secretName"].as_str().filter(|s| s.starts_with("landfall-nats-")));
        assert_eq!(nats_secret, Some(format!("landfall-nats-{service}").as_str()), "{n}: its own NATS user");
    }

    // The API's probes are its own: /healthz for liveness, /readyz (503 until caught up) for
    // readiness; and its Service reaches its pods on 8080.
    let api = deployments.iter().find(|d| name(d) == "landfall-api").unwrap();
    assert_eq!(containers(api)[0]["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(containers(api)[0]["livenessProbe"]["httpGet"]["path"], "/healthz");
    let service = of_kind(objects, "Service").find(|s| name(s) == "landfall-api").expect("a Service for the API");
    assert_eq!(service["spec"]["ports"][0]["port"], 8080);
    assert!(selects(&service["spec"]["selector"], &api["spec"]["template"]["metadata"]["labels"]));
    // Every hub pod's metrics port is behind the metrics Service.
    let metrics = of_kind(objects, "Service").find(|s| name(s) == "landfall-metrics").expect("a metrics Service");
    assert_eq!(metrics["spec"]["ports"][0]["targetPort"], "metrics");
    for d in &deployments {
        assert!(selects(&metrics["spec"]["selector"], &d["spec"]["template"]["metadata"]["labels"]), "{}", name(d));
    }
}

#[test]
fn every_hub_deployment_has_a_disruption_budget_selecting_its_pods() {
    let objects = overlay("hub");
    let deployments: Vec<&Value> = of_kind(objects, "Deployment").collect();
    for d in &deployments {
        let pods = &d["spec"]["template"]["metadata"]["labels"];
        assert!(selects(&d["spec"]["selector"]["matchLabels"], pods), "{}'s selector matches its own pods", name(d));
        let budgets: Vec<&Value> = of_kind(objects, "PodDisruptionBudget")
            .filter(|p| selects(&p["spec"]["selector"]["matchLabels"], pods))
            .collect();
        let [budget] = budgets.as_slice() else {
            panic!("{} is covered by {} PodDisruptionBudgets, not one", name(d), budgets.len())
        };
        assert_eq!(budget["spec"]["minAvailable"], 1, "{}", name(budget));
        // It selects this Deployment's pods and no other's.
        let covered: Vec<&str> = deployments
            .iter()
            .filter(|other| {
                selects(&budget["spec"]["selector"]["matchLabels"], &other["spec"]["template"]["metadata"]["labels"])
            })
            .map(|other| name(other))
            .collect();
        assert_eq!(covered, [name(d)], "{}", name(budget));
    }
}

#[test]
fn the_gateway_role_grants_exactly_what_the_kube_backend_does() {
    let objects = overlay("site-edge-01");
    for (overlay, v) in every_overlay() {
        assert!(
            !matches!(kind(v), "ClusterRole" | "ClusterRoleBinding"),
            "overlays/{overlay} has a {} {}: nothing may be cluster-wide",
            kind(v),
            name(v)
        );
    }

    let roles: Vec<&Value> = of_kind(objects, "Role").collect();
    let [role] = roles.as_slice() else { panic!("one Role, not {}", roles.len()) };
    assert_eq!(role["metadata"]["namespace"], SITE_NAMESPACE);
    let mut granted = BTreeSet::new();
    for rule in role["rules"].as_array().expect("rules") {
        assert!(rule.get("resourceNames").is_none() && rule.get("nonResourceURLs").is_none(), "{rule}");
        let list = |field: &str| -> Vec<String> {
            rule[field]
                .as_array()
                .unwrap_or_else(|| panic!("{field} in {rule}"))
                .iter()
                .map(|s| s.as_str().unwrap().to_string())
                .collect()
        };
        for group in list("apiGroups") {
            for resource in list("resources") {
                for verb in list("verbs") {
                    assert!(![&group, &resource, &verb].iter().any(|s| s.contains('*')), "a wildcard in {rule}");
                    granted.insert((group.clone(), resource.clone(), verb));
                }
            }
        }
    }
    let all = ["get", "list", "watch", "create", "patch", "update", "delete"];
    let mut expected = BTreeSet::new();
    for (group, resources, verbs) in [
        ("metal3.io", &["baremetalhosts", "baremetalhosts/status"][..], &all[..]),
        ("bpa.akraino.org", &["provisionings", "provisionings/status", "softwares", "softwares/status"], &all),
        ("", &["secrets"], &["get", "create", "patch"]),
    ] {
        for resource in resources {
            for verb in verbs {
                expected.insert((group.to_string(), resource.to_string(), verb.to_string()));
            }
        }
    }
    let extra: Vec<_> = granted.difference(&expected).collect();
    let missing: Vec<_> = expected.difference(&granted).collect();
    assert!(
        extra.is_empty() && missing.is_empty(),
        "the gateway's Role grants (group, resource, verb) {extra:?} beyond what it needs, and lacks {missing:?}"
    );

    // The groups and plurals are the ones the CRDs in deploy/crds define.
    let crds = Path::new(DEPLOY).join("../crds");
    for (file, group, plural) in [
        ("metal3/metal3.io_baremetalhosts.yaml", "metal3.io", "baremetalhosts"),
        ("icn-bpa/bpa_v1alpha1_provisioning_crd.yaml", "bpa.akraino.org", "provisionings"),
        ("icn-bpa/bpa_v1alpha1_software_crd.yaml", "bpa.akraino.org", "softwares"),
    ] {
        let crd: Value = bus_schema::yaml::from_str(&std::fs::read_to_string(crds.join(file)).unwrap()).unwrap();
        assert_eq!(crd["spec"]["group"].as_str(), Some(group), "{file}");
        assert_eq!(crd["spec"]["names"]["plural"].as_str(), Some(plural), "{file}");
        assert_eq!(crd["spec"]["scope"].as_str(), Some("Namespaced"), "{file}");
    }

    // Bound to the gateway's ServiceAccount, in the same namespace, which the gateway runs as.
    let [binding] = of_kind(objects, "RoleBinding").collect::<Vec<_>>()[..] else { panic!("one RoleBinding") };
    assert_eq!(binding["metadata"]["namespace"], SITE_NAMESPACE);
    assert_eq!(
        binding["roleRef"],
        json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name(role)})
    );
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": "landfall-gateway", "namespace": SITE_NAMESPACE}])
    );
    let [gateway] = of_kind(objects, "Deployment").collect::<Vec<_>>()[..] else { panic!("one gateway Deployment") };
    assert_eq!(gateway["metadata"]["namespace"], SITE_NAMESPACE);
    assert_eq!(gateway["spec"]["template"]["spec"]["serviceAccountName"], "landfall-gateway");
    assert_eq!(gateway["spec"]["replicas"], 1, "one gateway per site");
}

#[test]
fn the_site_overlay_configures_its_gateway() {
    let objects = overlay("site-edge-01");
    let [gateway] = of_kind(objects, "Deployment").collect::<Vec<_>>()[..] else { panic!("one gateway Deployment") };
    let [c] = containers(gateway) else { panic!("one container") };
    assert_eq!(c["command"], json!(["landfall-gateway"]));
    assert_eq!(c["args"].as_array().unwrap()[..2], [json!("--backend"), json!("kube")]);
    assert_eq!(c["image"], "registry.example.com/landfall:0.1.0");
    let env = resolved_env(objects, c);
    assert_eq!(env["LANDFALL_SITE"], "edge-01");
    assert_eq!(env["LANDFALL_NAMESPACE"], format!("field metadata.namespace = {SITE_NAMESPACE}"));
    assert_eq!(env["NATS_URL"], "nats://landfall-leaf:4222");
    assert_eq!(env["LANDFALL_JS_DOMAIN"], "hub");
    assert!(!env.contains_key("LANDFALL_KUBECONFIG"), "in a pod the gateway uses its ServiceAccount");
    assert_eq!(env["LANDFALL_NATS_NKEY_FILE"], "/etc/landfall/nats/user.nk");
    let seed = gateway["spec"]["template"]["spec"]["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "nats");
    assert_eq!(seed.map(|v| &v["secret"]["secretName"]), Some(&json!("landfall-nats-gateway")));
    let cache_dir = &env["LANDFALL_CACHE_DIR"];
    let mount = c["volumeMounts"].as_array().unwrap().iter().find(|m| m["mountPath"] == cache_dir.as_str());
    assert!(mount.is_some(), "the cache directory {cache_dir} is a volume");
    assert!(c["ports"].as_array().unwrap().iter().any(|p| p["name"] == "metrics" && p["containerPort"] == 9090));
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(c[probe]["httpGet"], json!({"path": "/healthz", "port": "metrics"}), "{probe}");
    }
}

/// A container's environment with ConfigMap references resolved against the rendered objects;
/// a reference that does not resolve (and is not optional) fails the test.
fn resolved_env(objects: &[Value], container: &Value) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for e in container["env"].as_array().into_iter().flatten() {
        let var = e["name"].as_str().unwrap().to_string();
        let value = if let Some(v) = e["value"].as_str() {
            v.to_string()
        } else if let Some(field) = e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            format!("field {field} = {}", container_namespace(objects))
        } else if e["valueFrom"]["configMapKeyRef"].is_object() {
            let r = &e["valueFrom"]["configMapKeyRef"];
            let map = of_kind(objects, "ConfigMap")
                .find(|m| m["metadata"]["name"] == r["name"])
                .unwrap_or_else(|| panic!("{var}: no ConfigMap {}", r["name"]));
            match map["data"][r["key"].as_str().unwrap()].as_str() {
                Some(v) => v.to_string(),
                None if r["optional"] == true => continue,
                None => panic!("{var}: ConfigMap {} has no key {}", r["name"], r["key"]),
            }
        } else if e["valueFrom"]["secretKeyRef"].is_object() {
            format!("secret {}", e["valueFrom"]["secretKeyRef"]["name"].as_str().unwrap())
        } else {
            panic!("{var}: a source this test does not know: {e}")
        };
        env.insert(var, value);
    }
    env
}

fn container_namespace(objects: &[Value]) -> &str {
    of_kind(objects, "Deployment").next().and_then(|d| d["metadata"]["namespace"].as_str()).unwrap_or_default()
}

#[test]
fn every_configmap_reference_resolves() {
    for overlay_name in ["hub", "site-edge-01"] {
        let objects = overlay(overlay_name);
        for d in of_kind(objects, "Deployment") {
            for c in containers(d) {
                // Panics on a reference to a ConfigMap or key the overlay does not render.
                let env = resolved_env(objects, c);
                assert!(env.contains_key("NATS_URL"), "{}", name(d));
            }
        }
    }
    // The hub overlay sets the artifact store the distribution service needs.
    let hub = overlay("hub");
    let distribution = of_kind(hub, "Deployment").find(|d| name(d) == "landfall-distribution").unwrap();
    let env = resolved_env(hub, &containers(distribution)[0]);
    assert!(env["LANDFALL_STORE"].starts_with("s3://"), "{env:?}");
    assert_eq!(env["AWS_ACCESS_KEY_ID"], "secret landfall-artifact-store");
}

#[test]
fn every_container_runs_as_non_root_on_a_read_only_root() {
    let mut seen = 0;
    for (overlay, d) in every_overlay().filter(|(_, v)| kind(v) == "Deployment") {
        let n = format!("overlays/{overlay} {}", name(d));
        let pod = &d["spec"]["template"]["spec"];
        for c in containers(d) {
            let sc = &c["securityContext"];
            let non_root = sc["runAsNonRoot"].as_bool().or(pod["securityContext"]["runAsNonRoot"].as_bool());
            assert_eq!(non_root, Some(true), "{n}: runAsNonRoot");
            let uid = sc["runAsUser"].as_u64().or(pod["securityContext"]["runAsUser"].as_u64());
            assert!(uid.is_some_and(|u| u != 0), "{n}: a non-zero runAsUser");
            assert_eq!(sc["readOnlyRootFilesystem"], true, "{n}");
            assert_eq!(sc["allowPrivilegeEscalation"], false, "{n}");
            assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]), "{n}");
            assert!(sc["capabilities"]["add"].is_null(), "{n} adds capabilities");
            seen += 1;
        }
        assert!(pod["hostNetwork"].is_null() && pod["hostPID"].is_null(), "{n}");
        // Only the gateway talks to the Kubernetes API.
        let token = pod["automountServiceAccountToken"].as_bool();
        if overlay == "hub" {
            assert_eq!(token, Some(false), "{n}: a hub service needs no API token");
        }
    }
    assert_eq!(seen, HUB_SERVICES.len() + 1);
    for sa in of_kind(overlay("hub"), "ServiceAccount") {
        assert_eq!(sa["automountServiceAccountToken"], false, "{}", name(sa));
    }
}
