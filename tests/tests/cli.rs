//! The `landfall` CLI as people use it, as a separate process against a running system.

use landfall_tests::cli::{landfall, text};
use landfall_tests::fleet::Fleet;
use landfall_tests::nats::NatsServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_wait_exits_zero_and_events_show_every_node() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).nodes(3).start().await;
    let site = fleet.site_id(0);

    let out = landfall(&server.url(), &["site", "install", &site, "--wait", "--timeout", "60s"]).await;
    assert!(out.status.success(), "stdout: {}\nstderr: {}", text(&out.stdout), text(&out.stderr));
    assert!(text(&out.stderr).contains("installed: 3 nodes"), "{}", text(&out.stderr));

    let out = landfall(&server.url(), &["events", "--site", &site, "-o", "json"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let events: Vec<serde_json::Value> =
        text(&out.stdout).lines().map(|l| serde_json::from_str(l).expect("one JSON object per line")).collect();
    for node in ["node-1", "node-2", "node-3"] {
        let of_node: Vec<&str> =
            events.iter().filter(|e| e["event"]["node"] == node).map(|e| e["type"].as_str().unwrap()).collect();
        for t in
            ["landfall.v1.NodeOsProvisioning", "landfall.v1.NodeOsProvisioned", "landfall.v1.NodeBinariesInstalled"]
        {
            assert!(of_node.contains(&t), "{node} lacks {t}: {of_node:?}");
        }
    }
    assert!(events.iter().any(|e| e["type"] == "landfall.v1.SiteInstalled"));

    // The same command id again: nothing new runs, and --wait reports how that command ended.
    let id = "01890a5d-ac96-774b-bcce-b302099a8057";
    for _ in 0..2 {
        let out = landfall(&server.url(), &["site", "install", &site, "--wait", "--id", id, "--timeout", "60s"]).await;
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    assert!(fleet.backend(0).effects().provisions.values().all(|n| *n == 1));

    let out = landfall(&server.url(), &["status", &site, "-o", "json"]).await;
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    assert_eq!(status[0]["install"]["phase"], "INSTALL_PHASE_SUCCEEDED");
    let out = landfall(&server.url(), &["status"]).await;
    assert!(text(&out.stdout).contains(&site), "{}", text(&out.stdout));
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_joined_after_the_install_is_in_the_sites_node_table_with_its_step() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).nodes(2).start().await;
    let site = fleet.site_id(0);
    let api = landfall_tests::api::Api::start(&fleet.bus).await;
    let out = landfall(&server.url(), &["site", "install", &site, "--wait", "--timeout", "60s"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let add = ["node", "add", &site, "--name", "node-9", "--role", "worker", "--mac", "52:54:00:00:09:09"];
    let out = landfall(&server.url(), &[&add[..], &["--wait", "--timeout", "60s"]].concat()).await;
    assert!(out.status.success(), "{}", text(&out.stderr));

    // `status -o json`: every node of the design, node-9 with its join's step.
    let out = landfall(&server.url(), &["status", &site, "-o", "json"]).await;
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    let nodes = status[0]["node_list"].as_array().expect("a node list");
    let names: Vec<&str> = nodes.iter().filter_map(|n| n["name"].as_str()).collect();
    assert_eq!(names, ["node-1", "node-2", "node-9"], "{status}");
    let node_9 = &nodes[2];
    assert_eq!(
        (&node_9["step"], &node_9["by"], &node_9["metal3_state"]),
        (&"ready".into(), &"join".into(), &"provisioned".into()),
        "{node_9}"
    );
    assert_eq!(nodes[0]["by"], "install", "{status}");
    // The table a person reads: node-9 has its row.
    let out = landfall(&server.url(), &["status", &site]).await;
    let table = text(&out.stdout);
    let row = table.lines().find(|l| l.trim_start().starts_with("node-9") && l.contains("ready")).unwrap_or_default();
    assert!(row.contains("join") && row.contains("worker"), "no step row for node-9:\n{table}");

    // The API's site view lists it with its step too.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (code, detail) = api.get(landfall_tests::api::VIEWER, &format!("/v1/sites/{site}")).await;
        assert_eq!(code, 200, "{detail}");
        let node_9 = detail["node_list"].as_array().and_then(|n| n.iter().find(|n| n["name"] == "node-9")).cloned();
        if node_9.as_ref().is_some_and(|n| n["step"] == "ready") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the API never showed node-9 ready: {detail}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_wait_names_a_gateway_never_heard_from_within_seconds() {
    use tokio::io::AsyncBufReadExt;
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).nodes(2).without_gateways().start().await;
    let site = fleet.site_id(0);
    let api = landfall_tests::api::Api::start(&fleet.bus).await;
    let started = std::time::Instant::now();
    let mut install = tokio::process::Command::new(landfall_tests::cli::binary())
        .args(["site", "install", &site, "--wait", "--timeout", "60s"])
        .env("NATS_URL", server.url())
        .env_remove("RUST_LOG")
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(install.stderr.take().unwrap()).lines();
    let said = tokio::time::timeout(std::time::Duration::from_secs(15), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains("no gateway has ever been heard from") {
                return line;
            }
        }
        String::new()
    })
    .await
    .expect("--wait said nothing of the missing gateway within 15 s");
    assert!(started.elapsed() < std::time::Duration::from_secs(10), "said after {:?}", started.elapsed());
    let how = format!("landfall serve gateway --site {site} --backend sim");
    assert!(said.contains(&site) && said.contains(&how), "{said}");
    install.kill().await.unwrap();

    // The API's site view says it too, as something needing attention.
    let (code, detail) = api.get(landfall_tests::api::VIEWER, &format!("/v1/sites/{site}")).await;
    assert_eq!(code, 200, "{detail}");
    assert_eq!(detail["attention"][0]["kind"], "no_gateway", "{detail}");
    assert!(detail["attention"][0]["reason"].as_str().unwrap().contains(&how), "{detail}");
    fleet.stop().await;
}

#[test]
fn up_simulates_sites_registered_after_it_started_when_asked() {
    let up = landfall_tests::up::Up::start_with(1, &["--simulate-new-sites", "--time-scale", "600"]);
    let dir = tempfile::tempdir().unwrap();
    let design = dir.path().join("lab-1.yaml");
    std::fs::write(
        &design,
        r#"
site: lab-1
nodes:
  - { name: m1, role: master, bootMac: "52:54:00:ab:00:01", bmcAddress: "ipmi://192.0.2.20" }
  - { name: w1, role: worker, bootMac: "52:54:00:ab:00:02", bmcAddress: "ipmi://192.0.2.21" }
packages:
  master: [{ name: ubuntu, version: "22.04.4" }, { name: kubelet, version: "1.29.2" }]
  worker: [{ name: ubuntu, version: "22.04.4" }, { name: kubelet, version: "1.29.2" }]
"#,
    )
    .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let out = rt.block_on(landfall(&up.nats_url(), &["site", "register", "-f", design.to_str().unwrap()]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = rt.block_on(async {
        for _ in 0..100 {
            if landfall(&up.nats_url(), &["status", "lab-1"]).await.status.success() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        landfall(&up.nats_url(), &["site", "install", "lab-1", "--wait", "--timeout", "120s"]).await
    });
    assert!(out.status.success(), "{}\n{}", text(&out.stderr), up.output());
    assert!(!text(&out.stderr).contains("no gateway"), "{}", text(&out.stderr));
    let kept = site_gateway::sim::saved_effects(&up.site_state("lab-1")).expect("lab-1 kept like up's own sites");
    assert_eq!(kept.provisions.len(), 2, "{kept:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_wait_exits_non_zero_naming_the_failed_node() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).nodes(3).failing_host(0, "node-2").start().await;
    let out = landfall(&server.url(), &["site", "install", &fleet.site_id(0), "--wait", "--timeout", "60s"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(err.contains("failed node node-2: provision_os"), "{err}");
    assert!(err.contains("2 of 3 nodes installed"), "{err}");

    let out = landfall(&server.url(), &["site", "install", "nowhere", "--wait"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("not registered"), "{}", text(&out.stderr));
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn site_register_reads_yaml_and_refuses_bad_files_clearly() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(0).start().await;
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("site.yaml");
    std::fs::write(
        &good,
        r#"
site: lab-1
labels: { region: lab }
nodes:
  - { name: m1, role: master, bootMac: "52:54:00:aa:00:01", bmcAddress: "ipmi://192.0.2.10" }
  - { name: w1, role: worker, bootMac: "52:54:00:aa:00:02", bmcAddress: "redfish://192.0.2.11" }
packages:
  master: [{ name: ubuntu, version: "22.04.4" }, { name: kubelet, version: "1.29.2" }]
  worker: [{ name: ubuntu, version: "22.04.4" }, { name: kubelet, version: "1.29.2" }]
"#,
    )
    .unwrap();
    let out = landfall(&server.url(), &["site", "register", "-f", good.to_str().unwrap()]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut registered = false;
    for _ in 0..50 {
        let out = landfall(&server.url(), &["status", "lab-1", "-o", "json"]).await;
        if out.status.success() {
            registered = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(registered, "lab-1 shows up in status");

    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, std::fs::read_to_string(&good).unwrap().replace("ipmi://", "telnet://")).unwrap();
    let out = landfall(&server.url(), &["site", "register", "-f", bad.to_str().unwrap()]).await;
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("bmc_address") && err.contains("telnet"), "{err}");
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_formats_agree_and_completions_cover_every_command() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(1).nodes(1).start().await;
    let json_out = landfall(&server.url(), &["package", "list", "-o", "json"]).await;
    let yaml_out = landfall(&server.url(), &["package", "list", "-o", "yaml"]).await;
    assert!(json_out.status.success() && yaml_out.status.success(), "{}", text(&yaml_out.stderr));
    let from_json: serde_json::Value = serde_json::from_slice(&json_out.stdout).unwrap();
    let from_yaml: serde_json::Value = bus_schema::yaml::from_str(&text(&yaml_out.stdout)).unwrap();
    assert_eq!(from_json, from_yaml);
    assert_eq!(from_json.as_array().unwrap().len(), fleet.catalog.len());
    // `text` is still understood, as `table`.
    let table = landfall(&server.url(), &["package", "list", "-o", "text"]).await;
    assert!(table.status.success() && text(&table.stdout).contains("kubelet"), "{}", text(&table.stderr));

    let bash = landfall(&server.url(), &["completions", "bash"]).await;
    let script = text(&bash.stdout);
    assert!(bash.status.success() && script.contains("complete -F"), "{script}");
    for sub in ["site", "package", "rollout", "node", "events", "status", "kubeconfig", "serve", "up"] {
        assert!(script.contains(sub), "completions lack {sub}");
    }
    let help = landfall(&server.url(), &["--help"]).await;
    assert!(text(&help.stdout).contains("landfall up"), "{}", text(&help.stdout));
}
