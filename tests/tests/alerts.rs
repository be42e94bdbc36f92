//! The alert and recording rules of `deploy/observability/`: checked and unit-tested with
//! promtool, then loaded into a real Prometheus that scrapes a running `landfall up` while one
//! of its sites' install fails; the Grafana dashboard's every query run against it.
//!
//! Needs Debian's `prometheus` and `promtool` in the directory `LANDFALL_PROMETHEUS` names:
//! `scripts/ensure-prometheus` fetches them and prints it, and `scripts/test` exports it.
//! Without them the tests fail and say so; they never skip.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use landfall_tests::nats::free_port;
use landfall_tests::up::{Up, http};
use producers::embedded::tied;
use serde_json::{Value, json};

const RULES_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/observability");

/// The directory of `prometheus` and `promtool`; a clear failure, never a skip, without them.
fn prometheus_dir() -> PathBuf {
    const HOW: &str =
        "run `export LANDFALL_PROMETHEUS=\"$(scripts/ensure-prometheus)\"`, or run the suite with scripts/test";
    let dir = std::env::var_os("LANDFALL_PROMETHEUS")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("LANDFALL_PROMETHEUS is not set; {HOW}"));
    for bin in ["prometheus", "promtool"] {
        assert!(dir.join(bin).exists(), "LANDFALL_PROMETHEUS={} holds no {bin}; {HOW}", dir.display());
    }
    dir
}

fn promtool(args: &[&str]) -> String {
    let out = Command::new(prometheus_dir().join("promtool"))
        .args(args)
        .current_dir(RULES_DIR)
        .output()
        .expect("run promtool");
    let printed = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool {args:?} failed:\n{printed}");
    printed
}

#[test]
fn the_rules_and_the_scrape_configuration_are_valid_and_each_alert_fires_and_stays_quiet_as_its_unit_tests_say() {
    let checked = promtool(&["check", "rules", "rules.yml"]);
    assert!(checked.contains("SUCCESS"), "{checked}");
    // The scrape configuration for deploy/k8s, with the rules it loads.
    let config = promtool(&["check", "config", "prometheus.yml"]);
    assert!(config.contains("is valid prometheus config file"), "{config}");
    let tested = promtool(&["test", "rules", "rules.test.yml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
    // Every alert has a unit test that makes it fire.
    let tests = std::fs::read_to_string(Path::new(RULES_DIR).join("rules.test.yml")).expect("rules.test.yml");
    for alert in alerts() {
        let fired = tests.split("alertname: ").skip(1).any(|t| {
            t.starts_with(&format!("{alert}\n")) && t.lines().nth(1).is_some_and(|l| l.trim() == "exp_alerts:")
        });
        assert!(fired, "no unit test makes {alert} fire");
    }
}

/// The alerts `rules.yml` defines.
fn alerts() -> Vec<String> {
    let rules = std::fs::read_to_string(Path::new(RULES_DIR).join("rules.yml")).expect("rules.yml");
    rules.lines().filter_map(|l| l.trim().strip_prefix("- alert: ")).map(str::to_string).collect()
}

/// The landfall metrics the rules and the Grafana dashboard use.
fn metrics_used() -> BTreeSet<String> {
    let rules = std::fs::read_to_string(Path::new(RULES_DIR).join("rules.yml")).expect("rules.yml");
    let exprs = rules.lines().filter_map(|l| l.trim().strip_prefix("expr:")).map(str::to_string);
    let mut names = BTreeSet::new();
    for expr in exprs.chain(dashboard_queries()) {
        let mut rest = expr.as_str();
        while let Some(at) = rest.find("landfall_") {
            let name: String = rest[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            rest = &rest[at + name.len()..];
            names.insert(name);
        }
    }
    names
}

/// Every query of the Grafana dashboard's panels.
fn dashboard_queries() -> Vec<String> {
    let text = std::fs::read_to_string(Path::new(RULES_DIR).join("grafana-dashboard.json")).expect("the dashboard");
    let dashboard: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    let queries: Vec<String> = panels
        .iter()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .map(|t| t["expr"].as_str().expect("a query").to_string())
        .collect();
    assert!(queries.len() >= 20, "the dashboard has {} queries", queries.len());
    queries
}

/// A Prometheus of its own: scrapes `landfall up`'s `/metrics` every second and evaluates the
/// rules every second. Killed on drop.
struct Prometheus {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(target: SocketAddr) -> Prometheus {
        let dir = tempfile::tempdir().expect("a directory for Prometheus");
        let rules = Path::new(RULES_DIR).join("rules.yml").canonicalize().expect("rules.yml");
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: landfall-api\n    static_configs:\n      - targets: ['{target}']\n",
            rules.display()
        );
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).expect("write prometheus.yml");
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("prometheus.log");
        let mut cmd = tied::command(prometheus_dir().join("prometheus"));
        cmd.arg(format!("--config.file={}", config_path.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("share the log"))
            .stderr(log);
        let child = tied::spawn(cmd).expect("start prometheus");
        let prometheus = Prometheus { child, addr, _dir: dir };
        prometheus.until("ready", Duration::from_secs(60), || http(addr, "GET", "/-/ready", None, None).0 == 200);
        prometheus
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// `GET /api/v1/...`: the answer's `data`.
    fn api(&self, path: &str) -> Value {
        let (status, body) = http(self.addr, "GET", &format!("/api/v1/{path}"), None, None);
        assert_eq!(status, 200, "{path}: {body}");
        let answer: Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(answer["status"], "success", "{path}: {answer}");
        answer["data"].clone()
    }

    /// The alert `name` as Prometheus has it now (pending or firing), if it has it.
    fn alert(&self, name: &str) -> Option<Value> {
        let alerts = self.api("alerts");
        alerts["alerts"].as_array()?.iter().find(|a| a["labels"]["alertname"] == name).cloned()
    }

    /// Whether `selector` (a metric, with or without labels) has a series in what was scraped.
    fn has(&self, selector: &str) -> bool {
        let series = self.api(&format!("series?match[]={}", url_encoded(selector)));
        series.as_array().is_some_and(|s| !s.is_empty())
    }

    fn until(&self, what: &str, within: Duration, ok: impl Fn() -> bool) {
        let deadline = Instant::now() + within;
        while !ok() {
            assert!(Instant::now() < deadline, "Prometheus: not {what} within {within:?}");
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

/// `s` as a URL's query value.
fn url_encoded(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'-' | b'.' | b':' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            eprintln!("prometheus log (last lines):\n{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
        }
    }
}

/// A real Prometheus scrapes `landfall up` with the shipped rules: quiet while sites install
/// and a rollout runs, `LandfallInstallFailed` firing once a site's install fails (its only
/// host's provisioning fails, `--fail-host`), every landfall metric the rules and the Grafana
/// dashboard use is in the scrape, and every query of the dashboard runs.
#[test]
fn a_real_prometheus_scraping_landfall_up_fires_the_install_failed_alert() {
    let up = Up::start_with(2, &["--nodes", "1", "--fail-host", "edge-02/node-1", "--time-scale", "600"]);
    let prometheus = Prometheus::start(up.api);
    prometheus.until("scraping landfall up", Duration::from_secs(30), || {
        let targets = prometheus.api("targets");
        targets["activeTargets"].as_array().is_some_and(|t| t.iter().any(|t| t["health"] == "up"))
    });
    // The failure counter is scraped at 0 before anything fails, so its first increase shows.
    prometheus.until("holding the sagas' counters", Duration::from_secs(30), || {
        prometheus.has(r#"landfall_sagas_ended_total{kind="install",outcome="failure"}"#)
    });

    // edge-01 installs, and a newer kubelet rolls out to it: no alert.
    up.command("install_site", json!({ "site_id": "edge-01" }));
    up.until_site("edge-01", "installed", Duration::from_secs(120), |s| s["state"] == "installed");
    up.command(
        "register_package",
        json!({ "package": { "name": "kubelet", "version": "1.29.3", "kind": "binary", "sha256": "ab".repeat(32), "size": 1024 } }),
    );
    prometheus.until("seeing the rollout", Duration::from_secs(60), || prometheus.has("landfall_rollout_nodes"));
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(prometheus.alert("LandfallInstallFailed"), None, "the alert fired with no install failed");

    // edge-02's only host fails to provision: its install fails, and the alert fires.
    up.command("install_site", json!({ "site_id": "edge-02" }));
    up.until_site("edge-02", "failed", Duration::from_secs(120), |s| s["state"] == "failed");
    let failed_at = Instant::now();
    prometheus.until("firing LandfallInstallFailed", Duration::from_secs(30), || {
        prometheus.alert("LandfallInstallFailed").is_some_and(|a| a["state"] == "firing")
    });
    let alert = prometheus.alert("LandfallInstallFailed").expect("the alert");
    println!("LandfallInstallFailed firing {:?} after the site failed: {alert}", failed_at.elapsed());
    assert_eq!((&alert["labels"]["kind"], &alert["labels"]["severity"]), (&json!("install"), &json!("page")));
    assert!(alert["annotations"]["runbook"].as_str().is_some_and(|r| r.contains("landfall status")), "{alert}");

    let missing: Vec<String> = metrics_used().into_iter().filter(|m| !prometheus.has(m)).collect();
    assert!(missing.is_empty(), "the rules or the dashboard use metrics landfall up does not export: {missing:?}");
    // Every query of the Grafana dashboard runs.
    for query in dashboard_queries() {
        let answer = prometheus.api(&format!("query?query={}", url_encoded(&query)));
        assert!(answer["result"].is_array(), "{query}: {answer}");
    }
    // Every rule evaluates without error, and the recording rules record what there is.
    let groups = prometheus.api("rules");
    let rules: Vec<&Value> = groups["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .collect();
    assert_eq!(rules.len(), 16, "{groups}");
    for rule in rules {
        assert_eq!(rule["health"], "ok", "{rule}");
    }
    for rule in ["landfall:consumer_pending:max", "landfall:sagas_failed:increase15m"] {
        prometheus.until(&format!("recording {rule}"), Duration::from_secs(10), || prometheus.has(rule));
    }
}
