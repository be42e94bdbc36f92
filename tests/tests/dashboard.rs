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

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bus_schema::pb;
use futures::StreamExt;
use landfall_tests::up::{Up, http};
use serde_json::json;

/// How long one browser case may run (its own steps time out well before).
const CASE_TIMEOUT: Duration = Duration::from_secs(540);
const CHROMIUM: &str = "/usr/bin/chromium";
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/browser/dashboard.mjs");

/// One browser case at a time: each starts a whole landfall and a Chromium, and the scale
/// case's timings mean more on a machine that is not also running the other.
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

/// A browser case under way.
struct Case {
    name: String,
    child: Child,
    log_path: PathBuf,
    out_dir: PathBuf,
    deadline: Instant,
}

/// Starts one case of the browser script against `up`.
fn start_case(up: &Up, case: &str, extra: &[&str]) -> Case {
    let modules = browser_modules();
    let out_dir = screenshots(case);
    let log_path = up.dir.path().join(format!("browser-{case}.log"));
    let log = std::fs::File::create(&log_path).expect("create the browser log");
    let child = Command::new("node")
        .arg(SCRIPT)
        .args(["--case", case, "--url", &up.url(), "--token", &up.operator, "--viewer-token", &up.viewer])
        .args(["--out", &out_dir.display().to_string()])
        .args(extra)
        .env("LANDFALL_BROWSER_MODULES", &modules)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("share the log file"))
        .stderr(log)
        .spawn()
        .expect("start node");
    Case { name: case.to_string(), child, log_path, out_dir, deadline: Instant::now() + CASE_TIMEOUT }
}

impl Case {
    fn printed(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Waits until the script has printed `line`; panics if it ends or times out first.
    fn until_printed(&mut self, line: &str) {
        while !self.printed().contains(line) {
            if let Some(status) = self.child.try_wait().expect("poll node") {
                panic!(
                    "the browser case {} ended ({status}) before it printed {line:?}:\n{}",
                    self.name,
                    self.printed()
                );
            }
            assert!(Instant::now() < self.deadline, "the browser case {} never printed {line:?}", self.name);
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits for the case to end; returns what it printed, panics with it when it failed.
    fn wait(mut self) -> String {
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("poll node") {
                break Some(status);
            }
            if Instant::now() > self.deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        let (case, printed) = (&self.name, self.printed());
        println!("--- browser case {case} ---\n{printed}");
        match status {
            Some(s) if s.success() => printed,
            Some(s) => {
                panic!("the browser case {case} failed ({s}); screenshots in {}:\n{printed}", self.out_dir.display())
            }
            None => panic!("the browser case {case} did not finish within {CASE_TIMEOUT:?}:\n{printed}"),
        }
    }
}

/// Runs one case of the browser script against `up`; returns what it printed, panics with it
/// when it fails.
fn run_case(up: &Up, case: &str, extra: &[&str]) -> String {
    start_case(up, case, extra).wait()
}

#[test]
fn an_operator_installs_a_site_from_the_dashboard_and_watches_it_live() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let modules = browser_modules();
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
    browser_modules();
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
    browser_modules();
    let up = Up::start_with(1, &["--nodes", "2", "--time-scale", "120"]);
    up.command("install_site", json!({ "site_id": "edge-01" }));
    up.until_site("edge-01", "installed", Duration::from_secs(120), |s| s["state"] == "installed");
    let printed = run_case(&up, "reimage", &["--site", "edge-01"]);
    assert!(printed.contains("reimage: passed"), "the script did not say it passed:\n{printed}");
}

#[test]
fn a_thousand_sites_show_one_page_at_a_time_and_search_finds_one() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    browser_modules();
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
    browser_modules();
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
