//! A site that joins by enrollment, in the production topology: the hub made by `deploy
//! nats-config --site-auth enroll` (its auth callout is `landfall serve identity`), the site's
//! leaf node linked to it with the link credentials its gateway keeps, and the real
//! `landfall-gateway` on the leaf node with its identity sealed in a software TPM. The site is
//! approved, installed through the hub's services, then revoked: its leaf node's link is
//! closed and stays closed.
//!
//! Needs `$LANDFALL_SWTPM` and tpm2-tools (`scripts/ensure-tpm`; `scripts/test` sets it).

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use bus_schema::access::HUB_DOMAIN;
use bus_schema::pb::{self, BusMessage};
use landfall_tests::fleet::Fleet;
use landfall_tests::swtpm::SoftwareTpm;
use landfall_tests::topology::{Deployment, leaf_links};
use producers::embedded::tied;

const GATEWAY: &str = env!("CARGO_BIN_EXE_landfall-gateway-cli");

fn gateway(args: &[&str], dir: &Path, log: &Path) -> std::process::Command {
    let mut command = tied::command(GATEWAY);
    command.args(args).env("TMPDIR", dir).env("RUST_LOG", "info").stdin(Stdio::null());
    for var in ["LANDFALL_IDENTITY_DIR", "LANDFALL_TPM", "LANDFALL_NATS_NKEY_FILE", "NATS_URL", "LANDFALL_LOG_FORMAT"] {
        command.env_remove(var);
    }
    command.stdout(Stdio::null()).stderr(std::fs::File::create(log).unwrap());
    command
}

async fn until(what: &str, within: Duration, mut done: impl AsyncFnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !done().await {
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_gateway_on_a_leaf_node_joins_installs_its_site_and_a_revocation_closes_its_link_for_good() {
    let d = Deployment::generate_enrolled(&["edge-01"], 1);
    let mut hubs = d.start_hubs();
    let url = d.hub_urls("nats");
    let identity = d.start_identity(&url, "30d", "operator");
    d.wait_for_identity(&url, &identity);
    let fleet = Fleet::builder(&url).sites(1).nodes(3).access(d.users(None)).without_gateways().start().await;

    // The gateway's identity, sealed in the site machine's TPM.
    let tpm = SoftwareTpm::start();
    let dir = d.gateway_dir();
    let work = tempfile::tempdir().unwrap();
    let init = gateway(
        &["identity", "init", "--identity-dir", dir.to_str().unwrap(), "--tpm", &tpm.tcti()],
        work.path(),
        &work.path().join("init.log"),
    )
    .output()
    .unwrap();
    assert!(init.status.success(), "{}", std::fs::read_to_string(work.path().join("init.log")).unwrap());

    let boot = d.operator_cli(&url, &["site", "bootstrap", "--site", "edge-01"]);
    assert!(boot.status.success(), "{}", String::from_utf8_lossy(&boot.stderr));
    let boot_file = work.path().join("bootstrap");
    std::fs::write(&boot_file, &boot.stdout).unwrap();

    // The leaf node starts before its credentials exist, and links once the gateway has them.
    let leaf = d.start_leaf("edge-01");
    let log = work.path().join("gateway.log");
    let cache = work.path().join("cache");
    let state = work.path().join("edge-01.json");
    let mut gateway: Child = tied::spawn(gateway(
        &[
            "--site",
            "edge-01",
            "--backend",
            "sim",
            "--time-scale",
            "200",
            "--nats-url",
            &format!("nats://127.0.0.1:{}", leaf.port),
            "--hub-url",
            &url,
            "--js-domain",
            HUB_DOMAIN,
            "--identity-dir",
            dir.to_str().unwrap(),
            "--tpm",
            &tpm.tcti(),
            "--bootstrap-file",
            boot_file.to_str().unwrap(),
            "--cache-dir",
            cache.to_str().unwrap(),
            "--sim-state",
            state.to_str().unwrap(),
        ],
        work.path(),
        &log,
    ))
    .unwrap();
    let gateway_log = || std::fs::read_to_string(&log).unwrap_or_default();
    until("the gateway asks to join", Duration::from_secs(30), async || {
        gateway_log().contains("waiting for an operator")
    })
    .await;
    let waiting = gateway_log();
    let fingerprint = waiting.split("landfall site approve ").nth(1).unwrap().split_whitespace().next().unwrap();
    let approved = d.operator_cli(&url, &["site", "approve", fingerprint]);
    assert!(approved.status.success(), "{}", String::from_utf8_lossy(&approved.stderr));

    // Approved: the leaf node links with the link credentials, and the site installs.
    until("the leaf node links", Duration::from_secs(30), async || leaf_links(d.hubs[0].http).await == 1).await;
    let env = fleet.install("edge-01").await;
    let run = fleet.wait_install(&env).await;
    assert_eq!(run.terminal().delivery.type_name, pb::SiteInstalled::TYPE, "{:?}\n{}", run.kinds(), gateway_log());
    let hub_log = hubs[0].log();
    assert!(!hub_log.contains("Permissions Violation"), "the site was refused something it needs:\n{hub_log}");
    let creds = std::fs::read_to_string(dir.join("link.creds")).unwrap();
    for file in std::fs::read_dir(&dir).unwrap() {
        let text = std::fs::read(file.unwrap().path()).unwrap_or_default();
        let text = String::from_utf8_lossy(&text);
        assert!(
            !text.lines().any(|l| l.trim().starts_with("SU") && !creds.contains(l.trim())),
            "a seed other than the short-lived link key's is on the gateway's disk"
        );
    }

    // The hub restarted (its server id is new): the leaf node links again through the callout,
    // and the revocation below finds that connection.
    hubs[0].restart();
    until("the leaf node links again after the hub's restart", Duration::from_secs(60), async || {
        leaf_links(d.hubs[0].http).await == 1
    })
    .await;

    // Revoked: the leaf node's link is closed within seconds, and does not come back.
    let started = Instant::now();
    let revoked = d.operator_cli(&url, &["site", "revoke", "edge-01", "--reason", "cabinet broken into"]);
    assert!(revoked.status.success(), "{}", String::from_utf8_lossy(&revoked.stderr));
    until("the leaf link closes", Duration::from_secs(10), async || leaf_links(d.hubs[0].http).await == 0).await;
    let took = started.elapsed();
    eprintln!("revocation: the site's leaf link closed {took:?} after `site revoke` was started");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(leaf_links(d.hubs[0].http).await, 0, "the revoked site's leaf node linked again");
    assert!(hubs[0].log().contains("is revoked") || identity.log_text().contains("is revoked"));
    let _ = gateway.kill();
    let _ = gateway.wait();
    drop(leaf);
    fleet.stop().await;
}
