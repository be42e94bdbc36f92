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
use std::sync::Mutex;
use std::time::{Duration, Instant};

use landfall_tests::browser;
use landfall_tests::nats::free_port;
use landfall_tests::oidc::{self, AUDIENCE, DASHBOARD_CLIENT, Options, Provider, User};
use landfall_tests::up::{Up, http};

/// How long the browser case may run (its own steps time out well before).
const CASE_TIMEOUT: Duration = Duration::from_secs(300);
/// Short, so the case sees the dashboard renew the access token before it expires.
const ACCESS_TOKEN_TTL: Duration = Duration::from_secs(30);

/// One browser case at a time: each starts a whole landfall, a provider and a Chromium.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// alice (group eu-ops) operates the eu-west sites and bob (group us-ops) views the us-east
/// ones; each sees no other site. carol's group has no grant. `landfall up`'s demo sites
/// alternate between the two regions.
#[test]
fn people_sign_in_at_the_identity_provider_and_see_and_act_on_their_own_sites_only() {
    const EU_WEST: [&str; 2] = ["edge-01", "edge-03"];
    const US_EAST: [&str; 2] = ["edge-02", "edge-04"];
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    browser::modules();
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

    let printed = browser::run(
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
        CASE_TIMEOUT,
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
