//! The dashboard in a real browser: the real `landfall up` (nats-server, every service,
//! simulated sites, the HTTP API) as a child process, and headless Chromium driven by
//! playwright-core (`tests/browser/dashboard.mjs`) as an operator would use it.
//!
//! The first paint over 10,000 sites runs `landfall bench api`'s measurement (the API as its
//! own process, and the script's `firstpaint` case) against a hub that holds them.
//!
//! Needs Node.js, Debian's Chromium at /usr/bin/chromium and playwright-core in the directory
//! `LANDFALL_BROWSER_MODULES` names: `scripts/ensure-browser` installs both and prints it, and
//! `scripts/test` exports it. Without them the tests fail and say so; they never skip.
//! Screenshots go to `target/dashboard/<case>/`.

use std::sync::Mutex;
use std::time::Duration;

use bus_schema::pb;
use futures::StreamExt;
use landfall_tests::browser;
use landfall_tests::up::{Up, http};
use serde_json::json;

/// How long one browser case may run (its own steps time out well before).
const CASE_TIMEOUT: Duration = Duration::from_secs(540);
/// One browser case at a time: each starts a whole landfall and a Chromium, and the scale
/// case's timings mean more on a machine that is not also running the other.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Starts one case of the browser script against `up`.
fn start_case(up: &Up, case: &str, extra: &[&str]) -> browser::Case {
    browser::start(up, case, extra, CASE_TIMEOUT)
}

/// Runs one case of the browser script against `up`; returns what it printed, panics with it
/// when it fails.
fn run_case(up: &Up, case: &str, extra: &[&str]) -> String {
    browser::run(up, case, extra, CASE_TIMEOUT)
}

#[test]
fn an_operator_installs_a_site_from_the_dashboard_and_watches_it_live() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let modules = browser::modules();
    println!("playwright-core from {}", modules.display());
    let up = Up::start(3);
    let printed = run_case(&up, "install", &[]);
    assert!(printed.contains("install: passed"), "the script did not say it passed:\n{printed}");

    // What the browser saw is what the API says.
    let (status, body) = http(up.api, "GET", "/v1/sites/edge-01", Some(&up.operator), None);
    assert_eq!(status, 200, "{body}");
    let site: serde_json::Value = serde_json::from_str(&body).expect("a site as JSON");
    assert_eq!(site["state"], "installed");
    assert_eq!(site["nodes_ready"], 4);
}

/// A site whose gateway goes quiet mid-install shows as cut off, since when, and still
/// installing (not failed) on the fleet and on its page; once its gateway is heard again, it
/// shows as up, live, and its install goes on to the end. The site has a gateway process of its
/// own (the others run inside `landfall up`), killed and started again, with its simulated
/// hosts kept in a state file as real ones outlive their gateway.
#[test]
fn a_site_whose_gateway_goes_quiet_mid_install_shows_cut_off_not_failed_and_up_again_when_heard() {
    const SITE: &str = "edge-04";
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    browser::modules();
    let up = Up::start_with(3, &["--cut-off-after", "2s"]);
    up.command("register_site", json!({ "design": pb::SiteDesign::from(&producers::up::demo_site(3, 1)) }));
    let dir = up.dir.path().join(SITE);
    std::fs::create_dir_all(&dir).expect("the gateway's directory");
    let args = [
        "serve",
        "gateway",
        "--site",
        SITE,
        "--backend",
        "sim",
        "--time-scale",
        "120",
        "--cache-dir",
        "cache",
        "--sim-state",
        "sim-state.json",
        "--alive-every",
        "250ms",
    ];
    let url = format!("nats://127.0.0.1:{}", up.nats_port);
    let mut gateway = landfall_tests::procs::Service::start("gateway-edge-04", &url, &dir, &args);
    up.until_site(SITE, "heard", Duration::from_secs(60), |s| s["link"]["state"] == "up");

    up.command("install_site", json!({ "site_id": SITE }));
    up.until_site(SITE, "installing", Duration::from_secs(60), |s| s["state"] == "installing");
    gateway.kill();
    up.until_site(SITE, "cut off", Duration::from_secs(30), |s| s["link"]["state"] == "cut_off");

    let mut case = start_case(&up, "cutoff", &["--site", SITE]);
    case.until_printed("ok   the site shows as cut off");
    gateway.restart();
    let printed = case.wait();
    assert!(printed.contains("cutoff: passed"), "the script did not say it passed:\n{printed}");
    let site = up.site(SITE);
    assert_eq!((&site["state"], &site["link"]["state"]), (&json!("installed"), &json!("up")), "{site}");
    assert!(site["link"]["cut_off_since"].is_string(), "the link does not say when the cut began: {site}");
}

/// An os-image rollout on `landfall up`, watched on the site's page: each node's Metal3 state
/// goes deprovisioning → provisioning → provisioned, live, and the node ends on the new image.
#[test]
fn an_os_image_rollout_shows_each_node_deprovisioned_and_provisioned_again_live() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    browser::modules();
    let up = Up::start_with(1, &["--nodes", "2", "--time-scale", "120"]);
    up.command("install_site", json!({ "site_id": "edge-01" }));
    up.until_site("edge-01", "installed", Duration::from_secs(120), |s| s["state"] == "installed");
    let printed = run_case(&up, "reimage", &["--site", "edge-01"]);
    assert!(printed.contains("reimage: passed"), "the script did not say it passed:\n{printed}");
}

#[test]
fn a_thousand_sites_show_one_page_at_a_time_and_search_finds_one() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    browser::modules();
    let up = Up::start(3);
    // 997 more sites like the demo's (one node each), registered by the browser script through
    // the API while the dashboard is open.
    let bodies: Vec<serde_json::Value> =
        (3..1000).map(|i| json!({ "design": pb::SiteDesign::from(&producers::up::demo_site(i, 1)) })).collect();
    let designs = up.dir.path().join("designs.json");
    std::fs::write(&designs, serde_json::to_vec(&bodies).expect("designs as JSON")).expect("write the designs");
    let printed = run_case(&up, "scale", &["--designs", &designs.display().to_string()]);
    assert!(printed.contains("scale: passed"), "the script did not say it passed:\n{printed}");
    let render =
        printed.lines().find(|l| l.starts_with("first render:")).expect("the script printed the first render's time");
    println!("{render}");

    let (status, body) = http(up.api, "GET", "/v1/overview", Some(&up.operator), None);
    assert_eq!(status, 200, "{body}");
    let overview: serde_json::Value = serde_json::from_str(&body).expect("the overview as JSON");
    assert_eq!(overview["sites"]["total"], 1000);
}

#[test]
fn the_first_page_of_ten_thousand_sites_paints_and_the_feed_replays_only_its_own() {
    const SITES: usize = 10_000;
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    browser::modules();
    let nats = landfall_tests::nats::NatsServer::start();
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let measured = runtime.block_on(async {
        // The sites as the orchestrator leaves them registered: each design, and its
        // SiteRegistered (ten thousand events in the last minutes).
        let bus = bus_schema::runtime::Bus::connect(&nats.url(), "dashboard-test").await.expect("connect");
        bus.ensure_topology(&bus_schema::runtime::Topology::default()).await.expect("streams and buckets");
        let sites = bus.kv(bus_schema::names::SITES_BUCKET).await.expect("the sites bucket");
        let designs: Vec<pb::SiteDesign> =
            (0..SITES).map(|i| pb::SiteDesign::from(&producers::up::demo_site(i, 3))).collect();
        let writes = designs.iter().map(|d| {
            let sites = sites.clone();
            async move { sites.put(&bus_schema::names::keys::site(&d.site_id), d).await }
        });
        let written: Vec<_> = futures::stream::iter(writes).buffer_unordered(512).collect().await;
        for w in written {
            w.expect("a design written");
        }
        let events: Vec<_> = designs
            .iter()
            .map(|d| {
                let evt = pb::SiteRegistered { site_id: d.site_id.clone(), nodes: 3, revision: 1 };
                bus_schema::outgoing::Outgoing::event(&evt, bus_schema::envelope::Envelope::root())
            })
            .collect();
        for part in events.chunks(2048) {
            bus.publish_all(part.to_vec()).await.expect("events published");
        }
        producers::bench::api::measure_api_with(&landfall_tests::cli::binary(), &nats.url(), &[], SITES)
            .await
            .expect("the API measured")
    });
    println!("{}", serde_json::to_string_pretty(&measured).expect("JSON"));
    let paint = &measured["dashboard"];
    assert_eq!(paint["measured"], true, "the browser part did not run: {}", paint["why"]);
    assert_eq!(paint["rows"], 50, "one page of rows: {paint}");
    // The feed replays its own 200 events, not every event of the last minutes.
    assert_eq!(paint["first_load_settling"]["feed"], "200 events", "{paint}");
    assert_eq!(measured["sites_by_state"]["registered"], SITES);
}
