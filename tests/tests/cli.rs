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
