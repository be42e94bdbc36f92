//! Helm charts as packages, through the real bus, the real hub (whose distribution service
//! renders with the real helm) and the real `landfall-gateway --backend kube` applying to a real
//! API server: a chart registered with `landfall package upload`, installed with the site's own
//! values in Helm's order (its CRD established before its custom resource, its hooks run and
//! deleted as their policy says), upgraded by a rollout that prunes what the new version
//! dropped, and refused with helm's reason where it cannot render.

use std::time::Duration;

use bus_schema::names::{self, keys};
use bus_schema::pb::{self, BusEvent, BusMessage};
use bus_schema::runtime::{Envelope, ReadEvent};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ApiResource, DynamicObject};
use landfall_tests::cli::{landfall, text};
use landfall_tests::fleet;
use landfall_tests::helm::Chart;
use landfall_tests::kube_site::{KubeSiteRig, SITE, mac};
use prost::Message;
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(90);
/// Where the chart's release goes.
const RELEASE_NS: &str = "gizmos";

const CRD: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: gizmos.charts.landfall.test
spec:
  group: charts.landfall.test
  scope: Namespaced
  names: { plural: gizmos, singular: gizmo, kind: Gizmo }
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          x-kubernetes-preserve-unknown-fields: true
"#;

const CONFIG: &str = r#"apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .Release.Name }}-config
data:
  site: {{ required "site.name is required" .Values.site.name | quote }}
  greeting: {{ .Values.greeting | quote }}
  chart: {{ .Chart.Version | quote }}
"#;

const GIZMO: &str = r#"apiVersion: charts.landfall.test/v1
kind: Gizmo
metadata:
  name: {{ .Release.Name }}-gizmo
spec:
  size: {{ .Values.size }}
"#;

const PRE_HOOK: &str = r#"apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .Release.Name }}-prepare
  annotations:
    helm.sh/hook: pre-install,pre-upgrade
    helm.sh/hook-delete-policy: hook-succeeded
data: {}
"#;

const POST_HOOK: &str = r#"apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .Release.Name }}-done
  annotations:
    helm.sh/hook: post-install,post-upgrade
data:
  chart: {{ .Chart.Version | quote }}
"#;

/// Twelve ConfigMaps of 100 kB: a render larger than the bus's 1 MiB message.
const BIG: &str = r#"{{- range $i := until 12 }}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ $.Release.Name }}-bulk-{{ $i }}
data:
  filler: {{ repeat 100000 "x" | quote }}
{{- end }}
"#;

/// A Job that version 3 brings, which the test fails.
const MIGRATE: &str = r#"apiVersion: batch/v1
kind: Job
metadata:
  name: {{ .Release.Name }}-migrate
spec:
  template:
    spec:
      restartPolicy: Never
      containers: [{name: migrate, image: registry.local/migrate:3}]
"#;

const SCHEMA: &str = r#"{"type": "object", "properties": {"size": {"type": "integer", "minimum": 1}}}"#;

/// The chart at `version`; `with_gizmo`: its CRD's custom resource is a template of it (else
/// its render is over 1 MiB).
fn chart(version: &str, with_gizmo: bool) -> Chart {
    let chart = Chart::new("gizmo", version)
        .file("values.yaml", "greeting: hello\nsize: 1\nsite: {}\n")
        .file("values.schema.json", SCHEMA)
        .file("crds/gizmos.yaml", CRD)
        .file("templates/config.yaml", CONFIG)
        .file("templates/pre.yaml", PRE_HOOK)
        .file("templates/post.yaml", POST_HOOK);
    let chart =
        if with_gizmo { chart.file("templates/gizmo.yaml", GIZMO) } else { chart.file("templates/big.yaml", BIG) };
    chart.package()
}

/// `landfall package upload` of a chart archive as package `gizmo`, with the package's values
/// (`greeting: from-the-package` unless `values` is given).
async fn upload(rig: &KubeSiteRig, archive: &std::path::Path, version: &str) -> std::process::Output {
    upload_with(rig, archive, version, "greeting: from-the-package\n", &[]).await
}

async fn upload_with(
    rig: &KubeSiteRig,
    archive: &std::path::Path,
    version: &str,
    values: &str,
    more: &[&str],
) -> std::process::Output {
    let file = rig.dir.path().join(format!("package-values-{version}.yaml"));
    std::fs::write(&file, values).unwrap();
    let archive = archive.to_str().unwrap();
    let file = file.to_str().unwrap();
    let args = ["package", "upload", archive, "--name", "gizmo", "--version", version, "--kind", "helm-chart"];
    let args = [&args[..], &["--namespace", RELEASE_NS, "--values", file], more].concat();
    landfall(&rig.nats.url(), &args).await
}

/// The site's design, as the hub has it now, with `gizmo@version` for every node and `values`.
async fn design_with_chart(rig: &KubeSiteRig, version: &str, values: serde_json::Value) {
    let sites = rig.bus.kv(names::SITES_BUCKET).await.unwrap();
    let (mut design, revision) = sites.get::<pb::SiteDesign>(&keys::site(SITE)).await.unwrap().unwrap();
    for role in &mut design.packages {
        role.packages.retain(|p| p.name != "gizmo");
        role.packages.push(pb::PackageRef { name: "gizmo".into(), version: version.into() });
    }
    design.chart_values = [("gizmo".to_string(), values.to_string())].into();
    let env = Envelope::root();
    let cmd = pb::RegisterSite { design: Some(design), expected: Some(pb::ExpectedRevision { revision }) };
    rig.bus.publish_command(&cmd, &env).await.unwrap();
    rig.wait_for(pb::SiteRegistered::filter(), &env.id).await.expect("the design with the chart");
}

async fn install(rig: &KubeSiteRig) -> Vec<ReadEvent> {
    rig.install(TIMEOUT).await
}

async fn roll_out(rig: &KubeSiteRig, version: &str) -> Vec<ReadEvent> {
    roll_out_with(rig, version, false).await
}

/// A rollout of `gizmo@version`; `again`: the nodes at the version too (new values).
async fn roll_out_with(rig: &KubeSiteRig, version: &str, again: bool) -> Vec<ReadEvent> {
    let env = Envelope::root();
    let cmd = pb::PatchPackage { name: "gizmo".into(), version: version.into(), again, ..Default::default() };
    rig.bus.publish_command(&cmd, &env).await.unwrap();
    let ends = [pb::RolloutCompleted::TYPE, pb::RolloutHalted::TYPE, pb::CommandRejected::TYPE];
    fleet::collect(&rig.bus, names::EVENTS_ALL.into(), "rollout", &env.id, &ends, TIMEOUT).await.events
}

fn types(events: &[ReadEvent]) -> Vec<String> {
    events.iter().map(|e| e.delivery.type_name.clone()).collect()
}

fn gizmos(rig: &KubeSiteRig) -> Api<DynamicObject> {
    let res = ApiResource {
        group: "charts.landfall.test".into(),
        version: "v1".into(),
        api_version: "charts.landfall.test/v1".into(),
        kind: "Gizmo".into(),
        plural: "gizmos".into(),
    };
    Api::namespaced_with(rig.client.clone(), RELEASE_NS, &res)
}

async fn config(rig: &KubeSiteRig, name: &str) -> Option<ConfigMap> {
    let api: Api<ConfigMap> = Api::namespaced(rig.client.clone(), RELEASE_NS);
    api.get_opt(name).await.unwrap()
}

fn data(cm: &ConfigMap, key: &str) -> String {
    cm.data.as_ref().and_then(|d| d.get(key)).cloned().unwrap_or_default()
}

/// A chart is registered with the real helm checking it, installed on the site with the values
/// its design gives (a fact of the site among them) in Helm's order, then upgraded by a rollout
/// that prunes the custom resource the new version dropped; what was applied is on record.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_chart_is_installed_with_the_sites_values_and_upgraded_by_a_rollout() {
    let mut rig = KubeSiteRig::start().await;
    rig.start_gateway();
    rig.create_host("m-1", "master", &mac(1), "10.1.0.11").await;
    rig.wait_design(|n| n.len() == 1).await;

    let v1 = chart("1.0.0", true);
    let out = upload_with(&rig, v1.archive(), "1.0.0", "greeting: from-the-package\n", &["--correct-drift"]).await;
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
    let packages = rig.bus.kv(names::PACKAGES_BUCKET).await.unwrap();
    let (entry, _) = packages.get::<pb::Package>(&keys::package("gizmo", "1.0.0")).await.unwrap().unwrap();
    let release = entry.chart.clone().expect("the chart's release");
    assert_eq!((release.release.as_str(), release.namespace.as_str()), ("gizmo", RELEASE_NS));
    assert_eq!((release.chart_name.as_str(), release.chart_version.as_str()), ("gizmo", "1.0.0"));
    assert!(!release.uses_lookup && !release.makes_random);

    design_with_chart(&rig, "1.0.0", json!({"site": {"name": "${site.id}"}, "size": 3})).await;
    let installed = install(&rig).await;
    assert_eq!(types(&installed).last().map(String::as_str), Some(pb::SiteInstalled::TYPE), "{}", rig.gateway_log());

    // The site's values over the package's over the chart's, the site's id filled in.
    let cm = config(&rig, "gizmo-config").await.expect("the chart's ConfigMap");
    assert_eq!(data(&cm, "site"), SITE);
    assert_eq!(data(&cm, "greeting"), "from-the-package");
    assert_eq!(data(&cm, "chart"), "1.0.0");
    let labels = cm.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("landfall.io/package").map(String::as_str), Some("gizmo"));
    // The CRD came first: its custom resource could be applied.
    let gizmo = gizmos(&rig).get("gizmo-gizmo").await.expect("the chart's Gizmo");
    assert_eq!(gizmo.data["spec"]["size"], 3);
    // The pre hook ran and was deleted once it succeeded; the post hook stays (Helm's default
    // deletes it only before it is made again).
    assert!(config(&rig, "gizmo-prepare").await.is_none(), "the pre hook is deleted once it succeeded");
    assert_eq!(data(&config(&rig, "gizmo-done").await.expect("the post hook"), "chart"), "1.0.0");

    // What was applied is on record at the hub: the site's render, made of this chart for the
    // cluster as the gateway found it when it applied it (a render made at staging, before the
    // cluster stood, is kept too).
    let renders = packages.scan::<pb::Package>(&keys::site_renders_prefix(SITE)).await.unwrap();
    let render = renders.iter().filter_map(|(_, p, _)| p.render.clone()).max_by_key(|r| r.rendered_at_ms).unwrap();
    assert!(render.api_versions.iter().any(|v| v == "apps/v1/Deployment"), "{render:?}");
    // The test API server reports no release version (v0.0.0): the design's kubelet stands in.
    assert_eq!(render.kube_version, "1.29.2");
    assert_eq!(render.chart_sha256, entry.sha256);
    assert!(render.helm_version.starts_with("v4."), "{render:?}");
    assert_eq!(serde_json::from_str::<serde_json::Value>(&render.values).unwrap()["site"]["name"], SITE);

    // Somebody edits the release's ConfigMap by hand and deletes its Gizmo: the drift check
    // finds both and, as version 1 asks, puts them back.
    let edit = json!({"data": {"greeting": "edited by hand"}});
    let cms: Api<ConfigMap> = Api::namespaced(rig.client.clone(), RELEASE_NS);
    let by_hand = kube::api::PatchParams { field_manager: Some("kubectl-edit".into()), ..Default::default() };
    cms.patch("gizmo-config", &by_hand, &kube::api::Patch::Merge(&edit)).await.unwrap();
    gizmos(&rig).delete("gizmo-gizmo", &Default::default()).await.unwrap();
    let out = landfall(&rig.nats.url(), &["package", "drift", "--site", SITE]).await;
    let said = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{said}{}", text(&out.stderr));
    assert!(said.contains("gizmo@1.0.0: drifted, put back"), "{said}");
    assert!(said.contains("ConfigMap/gizmos/gizmo-config: data.greeting"), "{said}");
    assert!(said.contains("Gizmo/gizmos/gizmo-gizmo: missing"), "{said}");
    assert_eq!(data(&config(&rig, "gizmo-config").await.unwrap(), "greeting"), "from-the-package");
    assert!(gizmos(&rig).get_opt("gizmo-gizmo").await.unwrap().is_some(), "the Gizmo is back");
    let reported = rig.events::<pb::ChartDrifted>().await;
    assert!(reported.iter().any(|r| r.corrected && r.drifted.len() == 2), "{reported:?}");
    let out = landfall(&rig.nats.url(), &["package", "drift", "--site", SITE]).await;
    assert!(out.status.success() && text(&out.stdout).contains("gizmo@1.0.0: as rendered"), "{}", text(&out.stdout));

    // The operator prints what the site gets.
    let out = landfall(&rig.nats.url(), &["package", "render", "gizmo", "--site", SITE]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("name: gizmo-config") && text(&out.stdout).contains(SITE),
        "{}",
        text(&out.stdout)
    );
    assert!(text(&out.stderr).contains(&entry.sha256), "{}", text(&out.stderr));

    // Version 2 drops the Gizmo and brings twelve big ConfigMaps (a render over 1 MiB); the diff
    // says so before the rollout, the rollout prunes the Gizmo and the hooks run again.
    let v2 = chart("2.0.0", false);
    let out = upload(&rig, v2.archive(), "2.0.0").await;
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
    let out = landfall(&rig.nats.url(), &["package", "diff", "gizmo", "--version", "2.0.0"]).await;
    let said = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{said}{}", text(&out.stderr));
    assert!(said.contains("- Gizmo/gizmo-gizmo"), "{said}");
    assert!(said.contains("+ ConfigMap/gizmo-bulk-11"), "{said}");
    assert!(said.contains("~ ConfigMap/gizmo-config: data.chart"), "{said}");
    let rolled = roll_out(&rig, "2.0.0").await;
    assert_eq!(types(&rolled).last().map(String::as_str), Some(pb::RolloutCompleted::TYPE), "{}", rig.gateway_log());
    assert_eq!(data(&config(&rig, "gizmo-config").await.unwrap(), "chart"), "2.0.0");
    assert!(gizmos(&rig).get_opt("gizmo-gizmo").await.unwrap().is_none(), "v2 dropped the Gizmo: pruned");
    assert_eq!(data(&config(&rig, "gizmo-done").await.expect("the post hook"), "chart"), "2.0.0");
    assert!(config(&rig, "gizmo-prepare").await.is_none());
    assert_eq!(
        data(&config(&rig, "gizmo-bulk-11").await.expect("the render over 1 MiB applied"), "filler").len(),
        100_000
    );
    let renders = packages.scan::<pb::Package>(&keys::site_renders_prefix(SITE)).await.unwrap();
    let big = renders.iter().map(|(_, p, _)| p).find(|p| p.version == "2.0.0").expect("v2's render");
    assert!(big.size > 1024 * 1024, "{} bytes", big.size);

    // Version 2 does not ask for drift to be put back: an edit is reported and left.
    cms.patch("gizmo-config", &by_hand, &kube::api::Patch::Merge(&edit)).await.unwrap();
    let out = landfall(&rig.nats.url(), &["package", "drift", "--site", SITE]).await;
    let said = text(&out.stdout);
    assert!(said.contains("gizmo@2.0.0: drifted, reported"), "{said}");
    assert_eq!(data(&config(&rig, "gizmo-config").await.unwrap(), "greeting"), "edited by hand");
    // The hand's edit owns the field now: a forced apply only takes it back where a package asks
    // (drift correction). It is deleted; the next rollout makes it again.
    cms.delete("gizmo-config", &Default::default()).await.unwrap();

    // New values in the site's design, rolled out at the same version: rendered again and applied.
    design_with_chart(&rig, "2.0.0", json!({"site": {"name": "${site.id}"}, "greeting": "from-the-design"})).await;
    let rolled = roll_out_with(&rig, "2.0.0", true).await;
    assert_eq!(types(&rolled).last().map(String::as_str), Some(pb::RolloutCompleted::TYPE), "{}", rig.gateway_log());
    assert_eq!(data(&config(&rig, "gizmo-config").await.unwrap(), "greeting"), "from-the-design");
    let patched: Vec<pb::NodePatched> = landfall_tests::fleet::node_reports(&rolled);
    assert_eq!(patched.len(), 1, "{patched:?}");
    // Nothing changed since: again, nothing is applied (the node counts as patched, unchanged).
    let quiet = rig.client.clone();
    let before =
        Api::<ConfigMap>::namespaced(quiet, RELEASE_NS).get("gizmo-config").await.unwrap().metadata.resource_version;
    let rolled = roll_out_with(&rig, "2.0.0", true).await;
    assert_eq!(types(&rolled).last().map(String::as_str), Some(pb::RolloutCompleted::TYPE));
    let after = config(&rig, "gizmo-config").await.unwrap().metadata.resource_version;
    assert_eq!(before, after, "an unchanged render is not applied again");

    // Version 3's Job fails (as its controller would say): the site goes back to version 2's
    // manifests, the Job pruned, and the failure says so.
    let v3 = chart("3.0.0", false).file("templates/migrate.yaml", MIGRATE).package();
    let out = upload(&rig, v3.archive(), "3.0.0").await;
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(rig.client.clone(), RELEASE_NS);
    let failing = tokio::spawn(async move {
        loop {
            if jobs.get_opt("gizmo-migrate").await.unwrap().is_some() {
                let status = json!({"status": {"conditions": [{"type": "Failed", "status": "True",
                    "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit"}]}});
                jobs.patch_status("gizmo-migrate", &Default::default(), &kube::api::Patch::Merge(&status))
                    .await
                    .unwrap();
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let rolled = roll_out(&rig, "3.0.0").await;
    failing.await.unwrap();
    assert_eq!(types(&rolled).last().map(String::as_str), Some(pb::RolloutHalted::TYPE), "{}", rig.gateway_log());
    let failed: Vec<pb::NodePatchFailed> = rolled
        .iter()
        .filter(|e| e.delivery.type_name == pb::NodePatchFailed::TYPE)
        .map(|e| e.delivery.decode().unwrap())
        .collect();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(failed[0].reason.contains("BackoffLimitExceeded"), "{}", failed[0].reason);
    assert!(failed[0].reason.contains("went back to gizmo@2.0.0"), "{}", failed[0].reason);
    assert_eq!(data(&config(&rig, "gizmo-config").await.unwrap(), "chart"), "2.0.0");
    let api: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(rig.client.clone(), RELEASE_NS);
    assert!(api.get_opt("gizmo-migrate").await.unwrap().is_none(), "the Job version 3 added is pruned");
}

/// What helm refuses is refused with its reason: a schema violation in the package's values at
/// registration (nothing registered), a required value the site's design does not give at the
/// site's render (the install fails saying so, nothing of the chart applied).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn what_helm_refuses_is_refused_with_its_reason_and_nothing_is_applied() {
    let mut rig = KubeSiteRig::start().await;
    rig.start_gateway();
    rig.create_host("m-1", "master", &mac(1), "10.1.0.11").await;
    rig.wait_design(|n| n.len() == 1).await;
    let v1 = chart("1.0.0", true);

    // A broken template: refused at registration.
    let broken = Chart::new("broken", "1.0.0").file("templates/x.yaml", "x: {{ .Values.y \n").package();
    let out = upload(&rig, broken.archive(), "1.0.0").await;
    assert_eq!(out.status.code(), Some(2), "{}{}", text(&out.stdout), text(&out.stderr));
    assert!(text(&out.stderr).contains("parse error"), "{}", text(&out.stderr));

    // A schema violation in the package's own values: refused at registration, with helm's words.
    let out = upload_with(&rig, v1.archive(), "1.0.0", "size: 0\n", &[]).await;
    assert_eq!(out.status.code(), Some(2), "{}{}", text(&out.stdout), text(&out.stderr));
    assert!(text(&out.stderr).contains("minimum"), "{}", text(&out.stderr));
    let packages = rig.bus.kv(names::PACKAGES_BUCKET).await.unwrap();
    assert!(packages.get::<pb::Package>(&keys::package("gizmo", "1.0.0")).await.unwrap().is_none());

    // Registered (the site's design may give what it lacks), but this site's design does not.
    let out = upload(&rig, v1.archive(), "1.0.0").await;
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
    assert!(text(&out.stderr).contains("site.name is required"), "{}", text(&out.stderr));
    design_with_chart(&rig, "1.0.0", json!({"size": 2})).await;
    let installed = install(&rig).await;
    assert_eq!(types(&installed).last().map(String::as_str), Some(pb::SiteInstallFailed::TYPE));
    let failed: Vec<pb::SiteInstallFailed> = installed
        .iter()
        .filter(|e| e.delivery.type_name == pb::SiteInstallFailed::TYPE)
        .map(|e| e.delivery.decode().unwrap())
        .collect();
    assert!(failed[0].reason.contains("site.name is required"), "{failed:?}");
    assert!(config(&rig, "gizmo-config").await.is_none(), "nothing of the chart applied");

    // The site asks for the bytes of an object that is no render made for it, named as the
    // chart: refused (a site gets its own renders only).
    let (entry, _) = packages.get::<pb::Package>(&keys::package("edge-apps", "1.0.0")).await.unwrap().unwrap();
    let forged = pb::Package {
        name: "gizmo".into(),
        version: "1.0.0".into(),
        kind: pb::PackageKind::HelmChart as i32,
        render: Some(pb::ChartRender { site_id: SITE.into(), inputs_digest: "0".repeat(64), ..Default::default() }),
        ..entry
    };
    let plan = pb::ArtifactPlanRequest { site_id: SITE.into(), inventory: vec![], wanted: vec![forged] };
    let asked = rig.bus.request(names::artifact_plan_svc(SITE), plan.encode_to_vec().into(), TIMEOUT).await;
    let refused = asked.expect_err("a forged render is not sent");
    assert!(refused.to_string().contains("is not a render made for site"), "{refused}");

    // The archive in the store no longer has the sha256 it was registered with: no render.
    let (chart, _) = packages.get::<pb::Package>(&keys::package("gizmo", "1.0.0")).await.unwrap().unwrap();
    rig.store.put_raw(&chart.object_key, bytes::Bytes::from_static(b"not the chart")).await.unwrap();
    design_with_chart(&rig, "1.0.0", json!({"site": {"name": "x"}})).await;
    let out = landfall(&rig.nats.url(), &["package", "render", "gizmo", "--site", SITE]).await;
    assert!(!out.status.success(), "{}", text(&out.stdout));
    assert!(text(&out.stderr).contains("does not have the catalog's sha256"), "{}", text(&out.stderr));
}

/// A chart that makes random values is named so at registration, and a site's render is made
/// once per inputs and kept: rendered again, the site gets the same password; with other
/// values, a new render (made once as well).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn random_values_are_rendered_once_per_site_and_values_and_kept() {
    let mut rig = KubeSiteRig::start().await;
    rig.start_gateway();
    rig.create_host("m-1", "master", &mac(1), "10.1.0.11").await;
    rig.wait_design(|n| n.len() == 1).await;
    let secret = "apiVersion: v1\nkind: Secret\nmetadata:\n  name: pw\nstringData:\n  pw: {{ randAlphaNum 24 | quote }}\n  tier: {{ .Values.tier | quote }}\n";
    let random =
        Chart::new("gizmo", "1.0.0").file("values.yaml", "tier: bronze\n").file("templates/pw.yaml", secret).package();
    let out = upload(&rig, random.archive(), "1.0.0").await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("makes random values"), "{}", text(&out.stderr));
    design_with_chart(&rig, "1.0.0", json!({})).await;
    let render = || async {
        let out = landfall(&rig.nats.url(), &["package", "render", "gizmo", "--site", SITE]).await;
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    let first = render().await;
    assert!(first.contains("pw:"), "{first}");
    assert_eq!(render().await, first, "the same inputs give the render kept");
    design_with_chart(&rig, "1.0.0", json!({"tier": "gold"})).await;
    let gold = render().await;
    assert!(gold.contains("gold") && gold != first, "{gold}");
    assert_eq!(render().await, gold);

    // A site asking again and again with other cluster facts (a stolen key, say) churns its own
    // records: the newest 16 of the chart are kept, a bad request is refused.
    for i in 0..20 {
        let req = pb::ChartRenderRequest {
            site_id: SITE.into(),
            name: "gizmo".into(),
            version: "1.0.0".into(),
            kube_version: "v1.30.0".into(),
            api_versions: vec![format!("example.com/v{i}")],
        };
        let subject = names::chart_render_svc(SITE);
        rig.bus.request(subject, req.encode_to_vec().into(), TIMEOUT).await.expect("rendered");
    }
    let packages = rig.bus.kv(names::PACKAGES_BUCKET).await.unwrap();
    let kept = packages.scan::<pb::Package>(&keys::site_renders_prefix(SITE)).await.unwrap();
    assert_eq!(
        kept.len(),
        consumers::distribution::render::KEPT_RENDERS,
        "{:?}",
        kept.iter().map(|k| &k.0).collect::<Vec<_>>()
    );
    let huge = pb::ChartRenderRequest {
        site_id: SITE.into(),
        name: "gizmo".into(),
        version: "1.0.0".into(),
        api_versions: vec!["x".repeat(400)],
        ..Default::default()
    };
    let refused = rig.bus.request(names::chart_render_svc(SITE), huge.encode_to_vec().into(), TIMEOUT).await;
    assert!(refused.is_err_and(|e| e.to_string().contains("API versions")));
}
