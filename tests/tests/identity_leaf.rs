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
    // Appended to: a gateway started again writes after the first one's lines.
    command.stdout(Stdio::null()).stderr(std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap());
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

/// An enrolled site on its leaf node: the hub and its services, the identity service, the
/// site's leaf node and its real gateway (identity in a software TPM), approved and linked.
struct LeafSite {
    d: Deployment,
    hubs: Vec<landfall_tests::topology::ConfServer>,
    url: String,
    identity: landfall_tests::procs::Service,
    fleet: Fleet,
    _tpm: SoftwareTpm,
    work: tempfile::TempDir,
    leaf: landfall_tests::topology::ConfServer,
    gateway: Child,
    args: Vec<String>,
}

impl LeafSite {
    async fn start(link_ttl: &str) -> LeafSite {
        let d = Deployment::generate_enrolled(&["edge-01"], 1);
        let hubs = d.start_hubs();
        let url = d.hub_urls("nats");
        let identity = d.start_identity(&url, link_ttl, "operator");
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
        let path = |p: &Path| p.to_str().unwrap().to_string();
        let args: Vec<String> = [
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
            &path(&dir),
            "--tpm",
            &tpm.tcti(),
            "--cache-dir",
            &path(&work.path().join("cache")),
            "--sim-state",
            &path(&work.path().join("edge-01.json")),
        ]
        .map(String::from)
        .into();
        let mut first = args.clone();
        first.extend(["--bootstrap-file".to_string(), path(&boot_file)]);
        let gateway = spawn_gateway(&first, work.path());
        let site = LeafSite { d, hubs, url, identity, fleet, _tpm: tpm, work, leaf, gateway, args };
        until("the gateway asks to join", Duration::from_secs(30), async || {
            site.gateway_log().contains("waiting for an operator")
        })
        .await;
        let waiting = site.gateway_log();
        let fingerprint = waiting.split("landfall site approve ").nth(1).unwrap().split_whitespace().next().unwrap();
        let approved = site.d.operator_cli(&site.url, &["site", "approve", fingerprint]);
        assert!(approved.status.success(), "{}", String::from_utf8_lossy(&approved.stderr));
        until("the leaf node links", Duration::from_secs(30), async || site.links().await == 1).await;
        site
    }

    fn gateway_log(&self) -> String {
        std::fs::read_to_string(self.work.path().join("gateway.log")).unwrap_or_default()
    }

    async fn links(&self) -> u64 {
        leaf_links(self.d.hubs[0].http).await
    }

    /// Stops the gateway as a crash would.
    fn kill_gateway(&mut self) {
        let _ = self.gateway.kill();
        let _ = self.gateway.wait();
    }

    /// Starts the gateway again, with the credentials it kept.
    fn start_gateway(&mut self) {
        self.gateway = spawn_gateway(&self.args, self.work.path());
    }

    async fn stop(mut self) {
        self.kill_gateway();
        drop(self.leaf);
        self.fleet.stop().await;
    }
}

fn spawn_gateway(args: &[String], work: &Path) -> Child {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    tied::spawn(gateway(&args, work, &work.join("gateway.log"))).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_gateway_on_a_leaf_node_joins_installs_its_site_and_a_revocation_closes_its_link_for_good() {
    let mut site = LeafSite::start("30d").await;
    let (d, url, dir) = (&site.d, site.url.clone(), site.d.gateway_dir());

    // Approved and linked: the site installs through the hub's services.
    let env = site.fleet.install("edge-01").await;
    let run = site.fleet.wait_install(&env).await;
    assert_eq!(run.terminal().delivery.type_name, pb::SiteInstalled::TYPE, "{:?}\n{}", run.kinds(), site.gateway_log());
    let hub_log = site.hubs[0].log();
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
    site.hubs[0].restart();
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
    assert!(site.hubs[0].log().contains("is revoked") || site.identity.log_text().contains("is revoked"));
    site.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaf_site_rotates_its_link_credentials_and_links_again_after_they_expired_with_its_gateway_down() {
    // Link credentials of 15 s: the gateway renews them every 10 s or so, and the leaf node
    // takes each new key at its next link (the hub closes the old one when it expires).
    let mut site = LeafSite::start("15s").await;
    let creds = site.d.gateway_dir().join("link.creds");
    let first = std::fs::read_to_string(&creds).unwrap();
    until("the gateway renews its link credentials", Duration::from_secs(20), async || {
        std::fs::read_to_string(&creds).unwrap_or_default() != first
    })
    .await;
    // Past the first key's life, the leaf node links with the renewed one.
    tokio::time::sleep(Duration::from_secs(8)).await;
    until("the leaf node links with the renewed key", Duration::from_secs(20), async || site.links().await == 1).await;

    // The gateway down past the credentials' life: the hub closes the leaf's link and keeps it
    // out. The gateway started again goes on at once (its leaf node holds its work) and renews
    // straight at the hub with its identity: the leaf node links again.
    site.kill_gateway();
    until("the expired link closes", Duration::from_secs(40), async || site.links().await == 0).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(site.links().await, 0, "a leaf node linked with expired credentials");
    site.start_gateway();
    until("the leaf node links after the gateway renewed", Duration::from_secs(60), async || site.links().await == 1)
        .await;
    let log = site.gateway_log();
    assert!(log.contains("link credentials renewed"), "{log}");
    site.stop().await;
}
