//! Observability end to end, every service a process of its own as deployed: the real
//! `landfall serve …` binaries with `--log-format json --metrics-listen`, one install, then what
//! their `/metrics` scrapes show and whether one trace id finds the install's log lines in
//! every service.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use bus_schema::names;
use bus_schema::pb::{self, BusEvent, BusJob, BusMessage};
use bus_schema::runtime::{Bus, Envelope, Topology};
use landfall_tests::fleet::{Fleet, INSTALL_TIMEOUT, TEST_KEY_HEX, collect, kubelet, wait_for};
use landfall_tests::nats::NatsServer;
use landfall_tests::procs::Service;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long a service may take to start serving its metrics.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A service as a process of its own, logging JSON lines and serving metrics on a free port.
fn start(name: &str, url: &str, dir: &Path, args: &[&str]) -> Service {
    let mut all = vec!["--log-format", "json", "--metrics-listen", "127.0.0.1:0"];
    all.extend_from_slice(args);
    Service::start(name, url, dir, &all)
}

/// A service's JSON log lines, and what they say.
trait JsonLogs {
    /// Every line the service has logged, each parsed as JSON (a line that is not is a failure).
    fn lines(&self) -> Vec<Value>;
    /// The address its metrics server logged that it bound.
    async fn metrics_addr(&mut self) -> SocketAddr;
}

impl JsonLogs for Service {
    fn lines(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(self.log_path()).expect("read the service's log");
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                serde_json::from_str(l)
                    .unwrap_or_else(|e| panic!("{}: a log line that is not JSON ({e}): {l}", self.name))
            })
            .collect()
    }

    async fn metrics_addr(&mut self) -> SocketAddr {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let bound = self.lines().iter().find(|l| l["message"] == "serving metrics on /metrics").map(|l| {
                let addr = l["addr"].as_str().expect("the bound address is a field of the line");
                addr.parse::<SocketAddr>().expect("a socket address")
            });
            if let Some(addr) = bound {
                return addr;
            }
            if let Some(status) = self.exit_status() {
                panic!("{} exited ({status}) before serving metrics:\n{}", self.name, self.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "{} did not serve metrics within {START_TIMEOUT:?}:\n{}",
                self.name,
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// `GET path` over plain HTTP/1.1: the status line, the headers (lowercase names) and the body.
async fn get(addr: SocketAddr, path: &str) -> (String, BTreeMap<String, String>, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect to the metrics server");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send the request");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read the response");
    let (head, body) = response.split_once("\r\n\r\n").expect("headers, then the body");
    let mut lines = head.lines();
    let status = lines.next().unwrap_or_default().to_string();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers, body.to_string())
}

/// One sample of a scrape: the metric's name, its labels, its value.
#[derive(Debug, Clone, PartialEq)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parses the Prometheus text format, panicking at any line that is not a comment or a sample.
fn parse_scrape(text: &str) -> Vec<Sample> {
    let mut samples = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Some(comment) = line.strip_prefix('#') {
            let mut words = comment.split_whitespace();
            let (kind, name) = (words.next(), words.next());
            if kind == Some("TYPE") {
                let t = words.next().unwrap_or_default();
                assert!(
                    name.is_some() && ["counter", "gauge", "histogram", "summary", "untyped"].contains(&t),
                    "{line}"
                );
            }
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("a sample has a value: {line}"));
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("a sample's value is a number: {line}"));
        let (name, labels) = match series.split_once('{') {
            None => (series, BTreeMap::new()),
            Some((name, rest)) => {
                let rest = rest.strip_suffix('}').unwrap_or_else(|| panic!("labels end with }}: {line}"));
                (name, parse_labels(rest, line))
            }
        };
        assert!(
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "a metric name: {line}"
        );
        samples.push(Sample { name: name.to_string(), labels, value });
    }
    samples
}

/// `a="x",b="y \"quoted\""` as a map.
fn parse_labels(mut rest: &str, line: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"").unwrap_or_else(|| panic!("label=\"value\": {line}"));
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => value.push(chars.next().map(|(_, c)| c).unwrap_or_default()),
                Some((i, '"')) => break i,
                Some((_, c)) => value.push(c),
                None => panic!("an unterminated label value: {line}"),
            }
        };
        labels.insert(key.to_string(), value);
        rest = after[end + 1..].trim_start_matches(',');
    }
    labels
}

/// The sum of the samples of `name` whose labels hold every pair of `with`.
fn total(samples: &[Sample], name: &str, with: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name && with.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v)))
        .map(|s| s.value)
        .sum()
}

/// Scrapes `addr` until `ready` holds for what it shows (metrics are recorded just after the
/// effects a test waits for), and returns that scrape; panics with the last one otherwise.
async fn scrape_until(name: &str, addr: SocketAddr, ready: impl Fn(&[Sample]) -> bool) -> Vec<Sample> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, headers, body) = get(addr, "/metrics").await;
        assert!(status.contains(" 200 "), "{name}: {status}");
        assert_eq!(headers.get("content-type").map(String::as_str), Some("text/plain; version=0.0.4; charset=utf-8"));
        let samples = parse_scrape(&body);
        if ready(&samples) {
            return samples;
        }
        assert!(Instant::now() < deadline, "{name}'s metrics never showed what was expected:\n{body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The lines logged inside a `handle` span of the trace `trace_id`: the span's fields, not the
/// message text, carry it.
fn lines_of_trace<'a>(lines: &'a [Value], trace_id: &str) -> Vec<&'a Value> {
    lines
        .iter()
        .filter(|l| {
            let in_span = |s: &Value| s["name"] == "handle" && s["trace_id"] == trace_id;
            in_span(&l["span"]) || l["spans"].as_array().is_some_and(|spans| spans.iter().any(in_span))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_install_shows_in_every_services_metrics_and_one_trace_id_finds_its_logs() {
    let server = NatsServer::start();
    let url = server.url();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let bus = Bus::connect(&url, "landfall-observability-test").await.expect("connect");
    bus.ensure_topology(&Topology::default()).await.expect("streams and buckets");

    let mut orchestrator = start("orchestrator", &url, dir.path(), &["serve", "orchestrator"]);
    let mut observer = start("observer", &url, dir.path(), &["serve", "observer"]);
    let key = dir.path().join("secret.key");
    landfall_tests::secrets::write_key_file(&key, TEST_KEY_HEX);
    let key_arg = ["serve", "kubeconfig", "--secret-key-file", key.to_str().unwrap()];
    let mut kubeconfig = start("kubeconfig", &url, dir.path(), &key_arg);

    // The simulated site is built from the registered design: register it before its gateway starts.
    let design = producers::up::demo_site(0, 2);
    let site = design.site.to_string();
    for p in producers::up::demo_packages() {
        let cmd = pb::RegisterPackage { package: Some(p), auto_rollout: None };
        bus.publish_command(&cmd, &Envelope::root()).await.unwrap();
    }
    let register = Envelope::root();
    bus.publish_command(&pb::RegisterSite { design: Some(pb::SiteDesign::from(&design)), expected: None }, &register)
        .await
        .unwrap();
    let registered = wait_for(&bus, pb::SiteRegistered::filter(), &register.id, Duration::from_secs(30)).await;
    assert!(registered.is_some(), "the orchestrator registers the site:\n{}", orchestrator.log_text());
    let cache = dir.path().join("cache");
    let gateway_args =
        ["serve", "gateway", "--site", &site, "--cache-dir", cache.to_str().unwrap(), "--time-scale", "3000"];
    let mut gateway = start("gateway", &url, dir.path(), &gateway_args);

    let install = Envelope::root();
    let trace_id = install.trace_id().expect("a root envelope starts a trace").to_string();
    bus.publish_command(&pb::InstallSite { site_id: site.clone(), ..Default::default() }, &install).await.unwrap();
    let unknown = Envelope::root();
    bus.publish_command(&pb::InstallSite { site_id: "edge-99".into(), ..Default::default() }, &unknown).await.unwrap();

    let ends = [pb::SiteInstalled::TYPE, pb::SiteInstallFailed::TYPE, pb::CommandRejected::TYPE];
    let run = collect(&bus, names::scope_events(&site), "install", &install.id, &ends, INSTALL_TIMEOUT).await;
    assert_eq!(run.terminal().delivery.type_name, pb::SiteInstalled::TYPE, "{}", gateway.log_text());
    let rejections = names::events_of_kind(pb::rejection::COMMAND_AGGREGATE, pb::rejection::KIND);
    let rejected = wait_for(&bus, rejections, &unknown.id, Duration::from_secs(30)).await;
    let rejected =
        rejected.expect("InstallSite of an unknown site is rejected").delivery.decode::<pb::CommandRejected>();
    assert_eq!(rejected.unwrap().code, pb::RejectCode::UnknownSite as i32);

    // Every event of the install, whichever service published it, continues the command's trace.
    let mut publishers = std::collections::BTreeSet::new();
    for e in &run.events {
        assert_eq!(e.delivery.envelope.trace_id(), Some(trace_id.as_str()), "{}", e.delivery.type_name);
        publishers.insert(e.delivery.type_name.as_str());
    }
    for t in [pb::ArtifactsStaged::TYPE, pb::KubeconfigStored::TYPE, pb::SiteInstalled::TYPE] {
        assert!(publishers.contains(t), "{t} among {publishers:?}");
    }

    // (a) What each service's scrape shows.
    let addr = orchestrator.metrics_addr().await;
    let install_site = pb::InstallSite::TYPE;
    let samples = scrape_until("orchestrator", addr, |s| {
        total(
            s,
            "landfall_commands_total",
            &[("type", install_site), ("outcome", "rejected"), ("code", "unknown_site")],
        ) >= 1.0
    })
    .await;
    let accepted = [("type", install_site), ("outcome", "accepted")];
    assert!(total(&samples, "landfall_commands_total", &accepted) >= 1.0, "{samples:#?}");
    let packages = [("type", pb::RegisterPackage::TYPE), ("outcome", "accepted")];
    assert!(total(&samples, "landfall_commands_total", &packages) >= 5.0, "one per demo package: {samples:#?}");
    for step in ["staging", "provisioning_os", "installing_binaries", "collecting_kubeconfig", "applying_containers"] {
        let count = total(&samples, "landfall_saga_step_seconds_count", &[("step", step)]);
        assert!(count >= 1.0, "{step} timed: {samples:#?}");
        let inf = total(&samples, "landfall_saga_step_seconds_bucket", &[("step", step), ("le", "+Inf")]);
        assert_eq!(inf, count, "{step}: every observation is in the +Inf bucket");
    }
    assert_eq!(total(&samples, "landfall_saga_seconds_count", &[("kind", "install"), ("outcome", "success")]), 1.0);
    assert!(total(&samples, "landfall_events_published_total", &[("type", pb::SiteInstalled::TYPE)]) >= 1.0);
    let handled = [("consumer", names::ORCHESTRATOR_EVENTS)];
    assert!(total(&samples, "landfall_messages_handled_total", &handled) > 0.0);
    assert!(total(&samples, "landfall_messages_rejected_total", &[("consumer", names::ORCHESTRATOR_COMMANDS)]) >= 1.0);

    let addr = gateway.metrics_addr().await;
    let in_flight = [("site", site.as_str())];
    let samples = scrape_until("gateway", addr, |s| {
        s.iter().any(|x| x.name == "landfall_gateway_jobs_in_flight")
            && total(s, "landfall_gateway_jobs_in_flight", &in_flight) == 0.0
    })
    .await;
    let done =
        |kind: &str| total(&samples, "landfall_gateway_job_seconds_count", &[("kind", kind), ("outcome", "done")]);
    assert!(done(pb::StageArtifacts::KIND) >= 1.0, "{samples:#?}");
    assert!(done(pb::ProvisionOs::KIND) >= 2.0, "one job per node: {samples:#?}");
    assert!(done(pb::InstallBinaries::KIND) >= 1.0);
    assert!(done(pb::ApplyContainerPackages::KIND) >= 1.0);
    assert!(total(&samples, "landfall_events_published_total", &[("type", pb::NodeOsProvisioned::TYPE)]) >= 2.0);

    for (service, consumer) in [(&mut observer, names::OBSERVER_EVENTS), (&mut kubeconfig, names::KUBECONFIG_EVENTS)] {
        let addr = service.metrics_addr().await;
        let handled = [("consumer", consumer)];
        scrape_until(&service.name, addr, |s| total(s, "landfall_messages_handled_total", &handled) > 0.0).await;
        let (status, _, body) = get(addr, "/healthz").await;
        assert!(status.contains(" 200 ") && body.trim() == "ok", "{}: {status} {body}", service.name);
    }

    // (b) One trace id finds the install's work in the logs of every service that did some, as
    // a field of the span the work ran in.
    for service in [&orchestrator, &gateway, &kubeconfig] {
        let lines = service.lines();
        let traced = lines_of_trace(&lines, &trace_id);
        assert!(
            !traced.is_empty(),
            "{}: no line in a span with trace_id {trace_id}:\n{}",
            service.name,
            service.log_text()
        );
        for l in &traced {
            let span = &l["span"];
            assert!(span["consumer"].is_string() && span["subject"].is_string() && span["msg_id"].is_string(), "{l}");
        }
    }
    let orchestrator_lines = orchestrator.lines();
    let started = lines_of_trace(&orchestrator_lines, &trace_id)
        .into_iter()
        .find(|l| l["message"] == "install started")
        .unwrap_or_else(|| panic!("the install's start is logged in its trace:\n{}", orchestrator.log_text()));
    assert_eq!(started["span"]["msg_id"], install.id.as_str());
    assert_eq!(started["span"]["consumer"], names::ORCHESTRATOR_COMMANDS);
    let gateway_lines = gateway.lines();
    let provisioned =
        lines_of_trace(&gateway_lines, &trace_id).iter().filter(|l| l["message"] == "os provisioned").count();
    assert!(provisioned >= 2, "each node's provisioning is logged in the trace: {provisioned} lines");

    // The data key given on the command line is in no log.
    for service in [&orchestrator, &observer, &kubeconfig, &gateway] {
        assert!(!service.log_text().contains(TEST_KEY_HEX), "{} logged the data key", service.name);
    }
}

/// The orchestrator lets go of a rollout's plan once the rollout has ended: its gauge of the plan
/// chunks it holds reads zero after a rollout completes (it kept every rollout's plan for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_orchestrator_lets_go_of_a_rollouts_plan_once_it_has_ended() {
    let server = NatsServer::start();
    let url = server.url();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let fleet = Fleet::builder(&url).sites(2).nodes(2).without_orchestrator().start().await;
    let mut orchestrator = start("orchestrator", &url, dir.path(), &["serve", "orchestrator"]);
    fleet.install_all().await;
    let env = Envelope::root();
    let register = pb::RegisterPackage { package: Some(kubelet("1.30.0")), auto_rollout: None };
    fleet.bus.publish_command(&register, &env).await.unwrap();
    let registered = fleet.wait_for(pb::PackageRegistered::filter(), &env.id, Duration::from_secs(30)).await;
    assert!(registered.is_some(), "package registered:\n{}", orchestrator.log_text());

    let patch = pb::PatchPackage { name: "kubelet".into(), version: "1.30.0".into(), ..Default::default() };
    let cmd = fleet.patch(patch).await;
    let run = fleet.wait_rollout(&cmd.id, Duration::from_secs(60)).await;
    let done = run.of_type::<pb::RolloutCompleted>();
    assert_eq!(done.len(), 1, "{:?}\n{}", run.kinds(), orchestrator.log_text());
    assert_eq!((done[0].patched, done[0].failed), (4, 0));

    let addr = orchestrator.metrics_addr().await;
    let chunks = "landfall_rollout_plan_chunks";
    let samples =
        scrape_until("orchestrator", addr, |s| s.iter().any(|x| x.name == chunks) && total(s, chunks, &[]) == 0.0)
            .await;
    assert_eq!(total(&samples, chunks, &[]), 0.0);
}
