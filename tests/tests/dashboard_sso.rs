//! Single sign-on in the dashboard, in a real browser: a real OpenID Connect provider
//! ([`landfall_tests::oidc`], oidc-provider under Node.js), the real `landfall up` taking its
//! access tokens and granting its people's groups parts of the fleet by a policy file, and
//! headless Chromium driven by playwright-core (`tests/browser/dashboard.mjs`, case `sso`)
//! signing people in on the provider's own page, as they would.
//!
//! Needs Node.js, Debian's Chromium and playwright-core as `tests/tests/dashboard.rs` does
//! (`LANDFALL_BROWSER_MODULES`, from `scripts/ensure-browser`), and oidc-provider
//! (`LANDFALL_OIDC_MODULES`, from `scripts/ensure-oidc-provider`); `scripts/test` exports both.
//! Without them the test fails and says so; it never skips. Screenshots go to
//! `target/dashboard/sso/`.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use landfall_tests::nats::free_port;
use landfall_tests::oidc::{self, AUDIENCE, DASHBOARD_CLIENT, Options, Provider, User};
use landfall_tests::up::{Up, http};

/// How long the browser case may run (its own steps time out well before).
const CASE_TIMEOUT: Duration = Duration::from_secs(300);
const CHROMIUM: &str = "/usr/bin/chromium";
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/browser/dashboard.mjs");
/// Short, so the case sees the dashboard renew the access token before it expires.
const ACCESS_TOKEN_TTL: Duration = Duration::from_secs(30);

/// One browser case at a time: each starts a whole landfall, a provider and a Chromium.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Where playwright-core is; a clear failure, never a skip, when the browser side is missing.
fn browser_modules() -> PathBuf {
    const HOW: &str = "run `export LANDFALL_BROWSER_MODULES=\"$(scripts/ensure-browser)\"` (it installs Debian's chromium \
                       and playwright-core), or run the suite with scripts/test";
    let node = Command::new("node").arg("--version").output();
    assert!(
        node.is_ok_and(|o| o.status.success()),
        "node is not installed: the dashboard test drives Chromium from Node.js; {HOW}"
    );
    assert!(Path::new(CHROMIUM).exists(), "{CHROMIUM} is missing; {HOW}");
    let modules = std::env::var_os("LANDFALL_BROWSER_MODULES")
        .filter(|m| !m.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("LANDFALL_BROWSER_MODULES is not set; {HOW}"));
    assert!(
        modules.join("playwright-core").join("package.json").exists(),
        "LANDFALL_BROWSER_MODULES={} holds no playwright-core; {HOW}",
        modules.display()
    );
    modules
}

/// `target/dashboard/<case>`, which outlives the test (the temp dirs do not).
fn screenshots(case: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("target"));
    let dir = target.join("dashboard").join(case);
    std::fs::create_dir_all(&dir).expect("create the screenshot directory");
    dir.canonicalize().expect("the screenshot directory")
}

/// Runs one case of the browser script against `up`; returns what it printed, panics with it
/// when it fails or overruns.
fn run_case(up: &Up, case: &str, extra: &[&str]) -> String {
    let modules = browser_modules();
    let out_dir = screenshots(case);
    let log_path = up.dir.path().join(format!("browser-{case}.log"));
    let log = std::fs::File::create(&log_path).expect("create the browser log");
    let mut child = Command::new("node")
        .arg(SCRIPT)
        .args(["--case", case, "--url", &up.url(), "--token", &up.operator])
        .args(["--out", &out_dir.display().to_string()])
        .args(extra)
        .env("LANDFALL_BROWSER_MODULES", &modules)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("share the log file"))
        .stderr(log)
        .spawn()
        .expect("start node");
    let deadline = Instant::now() + CASE_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("poll node") {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let printed = std::fs::read_to_string(&log_path).unwrap_or_default();
    println!("--- browser case {case} ---\n{printed}");
    match status {
        Some(s) if s.success() => printed,
        Some(s) => panic!("the browser case {case} failed ({s}); screenshots in {}:\n{printed}", out_dir.display()),
        None => panic!("the browser case {case} did not finish within {CASE_TIMEOUT:?}:\n{printed}"),
    }
}

/// alice (group eu-ops) operates the eu-west sites and bob (group us-ops) views the us-east
/// ones; each sees no other site. carol's group has no grant. `landfall up`'s demo sites
/// alternate between the two regions.
#[test]
fn people_sign_in_at_the_identity_provider_and_see_and_act_on_their_own_sites_only() {
    const EU_WEST: [&str; 2] = ["edge-01", "edge-03"];
    const US_EAST: [&str; 2] = ["edge-02", "edge-04"];
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    browser_modules();
    oidc::modules();

    // The provider must know the dashboard's origin (its redirect URI) before `up` starts, and
    // `up` the provider's issuer: the API's address is chosen first.
    let api = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
    let users = [
        User::new("alice", "alice-password", &["eu-ops"]),
        User::new("bob", "bob-password", &["us-ops"]),
        User::new("carol", "carol-password", &["visitors"]),
    ];
    let options = Options {
        access_token_ttl: ACCESS_TOKEN_TTL,
        dashboard_redirect_uris: vec![format!("http://{api}/")],
        ..Options::default()
    };
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let idp = runtime.block_on(Provider::start(&users, options));

    let dir = tempfile::tempdir().expect("a temp dir");
    let policy = dir.path().join("api-policy.yaml");
    std::fs::write(
        &policy,
        "grants:\n  \
         - { group: eu-ops, role: operator, sites: { region: eu-west } }\n  \
         - { group: us-ops, role: viewer, sites: { region: us-east } }\n",
    )
    .expect("write the policy");
    let policy = policy.display().to_string();
    let up =
        Up::start_on(api, 4, &["--oidc-issuer", idp.issuer(), "--oidc-audience", AUDIENCE, "--api-policy", &policy]);

    // What the case relies on: the sites' regions, and the API naming the provider to the page.
    for (sites, region) in [(EU_WEST, "eu-west"), (US_EAST, "us-east")] {
        for site in sites {
            assert_eq!(up.site(site)["labels"]["region"], region, "{site} is not labelled region={region}");
        }
    }
    let (status, body) = http(up.api, "GET", "/v1/auth", None, None);
    assert_eq!(status, 200, "GET /v1/auth: {body}");
    let auth: serde_json::Value = serde_json::from_str(&body).expect("GET /v1/auth as JSON");
    assert_eq!(auth["oidc"]["issuer"], idp.issuer(), "{auth}");
    assert_eq!(auth["oidc"]["dashboard_client"], DASHBOARD_CLIENT, "{auth}");

    let printed = run_case(
        &up,
        "sso",
        &[
            "--user",
            "alice:alice-password",
            "--viewer",
            "bob:bob-password",
            "--nobody",
            "carol:carol-password",
            "--scope",
            "region=eu-west",
            "--visible",
            &EU_WEST.join(","),
            "--hidden",
            &US_EAST.join(","),
        ],
    );
    assert!(printed.contains("sso: passed"), "the script did not say it passed:\n{printed}");

    // The install alice started from the dashboard is on record as hers.
    let path = format!("/v1/audit?kind=install_site&actor=user:alice&site={}", EU_WEST[0]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = http(up.api, "GET", &path, Some(&up.operator), None);
        assert_eq!(status, 200, "GET {path}: {body}");
        let audit: serde_json::Value = serde_json::from_str(&body).expect("the audit list as JSON");
        let items = audit["items"].as_array().expect("audit items");
        if items.iter().any(|r| r["actor"] == "user:alice" && r["outcome"] == "carried_out") {
            break;
        }
        assert!(Instant::now() < deadline, "the audit list has no install of {} by user:alice: {audit}", EU_WEST[0]);
        std::thread::sleep(Duration::from_millis(250));
    }
}
