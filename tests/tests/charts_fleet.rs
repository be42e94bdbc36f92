//! One helm chart, registered once, installed on three sites with each site's own values and
//! upgraded by a rollout with a canary: through the real bus, the real hub (its distribution
//! service rendering each site's chart with the real helm) and a gateway per site (simulated
//! sites: what a real site does with a render is `kube_helm.rs`).

use std::time::Duration;

use bus_schema::names::{self, keys};
use bus_schema::pb::{self, BusEvent, BusMessage};
use bus_schema::runtime::Envelope;
use landfall_tests::api::{Api, VIEWER};
use landfall_tests::cli::{landfall, text};
use landfall_tests::fleet::{self, Fleet};
use landfall_tests::helm::Chart;
use landfall_tests::nats::NatsServer;

const CONFIG: &str = r#"apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .Release.Name }}-config
data:
  site: {{ .Values.site | quote }}
  region: {{ .Values.region | quote }}
  chart: {{ .Chart.Version | quote }}
"#;

fn chart(version: &str) -> Chart {
    Chart::new("addons", version)
        .file("values.yaml", "site: none\nregion: none\n")
        .file("templates/config.yaml", CONFIG)
        .package()
}

async fn upload(url: &str, chart: &Chart, version: &str) {
    let archive = chart.archive().to_str().unwrap();
    let args = ["package", "upload", archive, "--name", "addons", "--version", version, "--kind", "helm-chart"];
    let out = landfall(url, &[&args[..], &["--namespace", "addons"]].concat()).await;
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
}

/// Site `i`'s design with `addons@1.0.0` on every node and its own values.
async fn with_chart(fleet: &Fleet, i: usize) {
    let sites = fleet.bus.kv(names::SITES_BUCKET).await.unwrap();
    let site = fleet.site_id(i);
    let (mut design, revision) = sites.get::<pb::SiteDesign>(&keys::site(&site)).await.unwrap().unwrap();
    for role in &mut design.packages {
        role.packages.push(pb::PackageRef { name: "addons".into(), version: "1.0.0".into() });
    }
    let values = serde_json::json!({"site": "${site.id}", "region": format!("region-{i}")});
    design.chart_values = [("addons".to_string(), values.to_string())].into();
    let env = Envelope::root();
    let cmd = pb::RegisterSite { design: Some(design), expected: Some(pb::ExpectedRevision { revision }) };
    fleet.bus.publish_command(&cmd, &env).await.unwrap();
    fleet
        .wait_for(pb::SiteRegistered::filter(), &env.id, Duration::from_secs(20))
        .await
        .expect("design with the chart");
}

/// The site's renders of `version`, as the hub keeps them: their manifests.
async fn renders(fleet: &Fleet, site: &str, version: &str) -> Vec<String> {
    let packages = fleet.bus.kv(names::PACKAGES_BUCKET).await.unwrap();
    let mut out = Vec::new();
    for (_, p, _) in packages.scan::<pb::Package>(&keys::site_renders_prefix(site)).await.unwrap() {
        if p.version == version {
            let bytes = fleet.store.read(&p.object_key, 0..p.size).await.unwrap();
            out.push(String::from_utf8(bytes.to_vec()).unwrap());
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_chart_registered_once_is_installed_with_each_sites_values_and_rolled_out_with_a_canary() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(3).nodes(1).start().await;
    upload(&server.url(), &chart("1.0.0"), "1.0.0").await;
    for i in 0..3 {
        with_chart(&fleet, i).await;
    }
    fleet.install_all().await;
    for i in 0..3 {
        let site = fleet.site_id(i);
        let made = renders(&fleet, &site, "1.0.0").await;
        assert!(!made.is_empty(), "{site} has a render");
        for render in &made {
            assert!(render.contains(&format!("site: {site}")), "{render}");
            assert!(render.contains(&format!("region: region-{i}")), "{render}");
        }
        let applied = fleet.bus.kv(names::OBSERVED_BUCKET).await.unwrap();
        let seen = applied.scan::<pb::ObservedVersion>(&keys::observed_site_prefix(&site)).await.unwrap();
        assert!(
            seen.iter().any(|(k, v, _)| k.ends_with(".addons") && v.version == "1.0.0"),
            "{site} runs addons@1.0.0 as observed: {:?}",
            seen.iter().map(|(k, _, _)| k).collect::<Vec<_>>()
        );
    }

    // What was rendered for a site is in its status, and in the API.
    let out = landfall(&server.url(), &["status", &fleet.site_id(1)]).await;
    let said = text(&out.stdout);
    assert!(said.contains("RENDERED FOR THE SITE") && said.contains("addons"), "{said}{}", text(&out.stderr));
    let api = Api::start(&fleet.bus).await;
    let (status, charts) = api.get(VIEWER, &format!("/v1/sites/{}/charts", fleet.site_id(1))).await;
    assert_eq!(status, 200, "{charts}");
    let catalog = fleet.bus.kv(names::PACKAGES_BUCKET).await.unwrap();
    let (entry, _) = catalog.get::<pb::Package>(&keys::package("addons", "1.0.0")).await.unwrap().unwrap();
    assert_eq!(charts[0]["name"], "addons");
    assert_eq!(charts[0]["chart_sha256"], entry.sha256.as_str());
    assert!(charts[0]["helm_version"].as_str().is_some_and(|v| v.starts_with("v4.")), "{charts}");

    // Version 2 to every site, the first as a canary of its own.
    upload(&server.url(), &chart("2.0.0"), "2.0.0").await;
    let env = Envelope::root();
    let strategy = pb::RolloutStrategy { canary_sites: 1, ..Default::default() };
    let cmd = pb::PatchPackage {
        name: "addons".into(),
        version: "2.0.0".into(),
        strategy: Some(strategy),
        ..Default::default()
    };
    fleet.bus.publish_command(&cmd, &env).await.unwrap();
    let ends = [pb::RolloutCompleted::TYPE, pb::RolloutHalted::TYPE, pb::CommandRejected::TYPE];
    let run =
        fleet::collect(&fleet.bus, names::EVENTS_ALL.into(), "rollout", &env.id, &ends, Duration::from_secs(90)).await;
    assert_eq!(run.terminal().delivery.type_name, pb::RolloutCompleted::TYPE, "{:?}", run.kinds());
    assert_eq!(run.node_reports().len(), 3);
    for i in 0..3 {
        let site = fleet.site_id(i);
        let made = renders(&fleet, &site, "2.0.0").await;
        assert!(made.iter().all(|r| r.contains("2.0.0") && r.contains(&format!("region: region-{i}"))), "{made:?}");
        assert!(!made.is_empty(), "{site} has its render of 2.0.0");
    }
}
