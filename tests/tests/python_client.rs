//! The Python example client (`examples/python/install_site.py`), a program that shares nothing
//! with landfall but the .proto files and the bus contract of `docs/src/clients.md`, run as a child
//! process against a running landfall (real nats-server, orchestrator and gateways over
//! simulated sites).
//!
//! Needs `LANDFALL_PYTHON`: a python with the example's packages (`scripts/ensure-python-env`
//! prints one; `scripts/test` sets it).

use std::fmt;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use async_nats::jetstream::consumer::DeliverPolicy;
use bus_schema::names::{self, headers};
use bus_schema::pb::{self, BusCommand, BusEvent, BusMessage};
use futures::StreamExt;
use landfall_tests::fleet::{self, Fleet, INSTALL_TIMEOUT};
use landfall_tests::nats::NatsServer;
use serde_json::Value;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/python/install_site.py");
/// How long the script is given before the test kills it: its own `--timeout`, and time to
/// start python and generate the classes.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(INSTALL_TIMEOUT.as_secs() + 30);

/// One run of the script: its exit status and what it printed.
struct ScriptRun {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl fmt::Display for ScriptRun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "exit {:?}\n--- stdout\n{}--- stderr\n{}", self.code, self.stdout, self.stderr)
    }
}

impl ScriptRun {
    /// The stdout lines `<Word> <json>`, parsed.
    fn lines(&self) -> Vec<(String, Value)> {
        self.stdout
            .lines()
            .map(|line| {
                let (word, json) = line.split_once(' ').unwrap_or_else(|| panic!("not `word json`: {line:?}\n{self}"));
                let value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json:?}\n{self}"));
                (word.to_string(), value)
            })
            .collect()
    }

    /// The `published {...}` line: id, subject, stream, seq, duplicate.
    fn published(&self) -> Value {
        let lines = self.lines();
        let (word, value) = lines.first().unwrap_or_else(|| panic!("no output\n{self}"));
        assert_eq!(word, "published", "{self}");
        value.clone()
    }

    fn id(&self) -> String {
        self.published()["id"].as_str().expect("an id").to_string()
    }

    /// The events' type short names and fields, in the order printed.
    fn events(&self) -> Vec<(String, Value)> {
        self.lines().into_iter().skip(1).collect()
    }

    fn kinds(&self) -> Vec<String> {
        self.events().into_iter().map(|(kind, _)| kind).collect()
    }
}

/// Runs `install_site.py` against `url` with `args`, generating its classes into `gen_dir`.
async fn run_script(url: &str, gen_dir: &Path, args: &[&str]) -> ScriptRun {
    let timeout = INSTALL_TIMEOUT.as_secs().to_string();
    let child = tokio::process::Command::new(landfall_tests::python())
        .arg(SCRIPT)
        .args(["--nats-url", url, "--timeout", &timeout, "--gen-dir"])
        .arg(gen_dir)
        .args(args)
        .env_remove("NATS_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("start {} {SCRIPT}: {e}", landfall_tests::python().display()));
    let out = tokio::time::timeout(SCRIPT_TIMEOUT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("install_site.py {args:?} did not exit within {SCRIPT_TIMEOUT:?}"))
        .expect("wait for install_site.py");
    ScriptRun {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Every event on the bus correlated with `id` in `site`'s scope, up to the install's end.
async fn install_on_the_bus(fleet: &Fleet, site: &str, id: &str) -> fleet::Run {
    let ends = [pb::SiteInstalled::TYPE, pb::SiteInstallFailed::TYPE, pb::CommandRejected::TYPE];
    fleet::collect(&fleet.bus, names::scope_events(site), "install", id, &ends, INSTALL_TIMEOUT).await
}

/// The types of every event stored in `site`'s scope so far that is correlated with `id`.
async fn correlated_on_the_bus(fleet: &Fleet, site: &str, id: &str) -> Vec<String> {
    let mut reader =
        fleet.bus.read_events(vec![names::scope_events(site)], DeliverPolicy::All).await.expect("a reader");
    let mut kinds = Vec::new();
    let mut left = reader.pending_at_start;
    while left > 0 {
        let e = reader.next().await.expect("the events go on").expect("an event");
        if e.delivery.envelope.correlation == id {
            kinds.push(short(&e.delivery.type_name));
        }
        left = e.pending;
    }
    kinds
}

fn short(type_name: &str) -> String {
    type_name.trim_start_matches("landfall.v1.").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_installs_a_site_and_prints_every_event_of_it_in_order() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(1).nodes(2).start().await;
    let site = fleet.site_id(0);
    let gen_dir = tempfile::tempdir().expect("a temporary directory");

    let run = run_script(&server.url(), gen_dir.path(), &[&site]).await;
    assert_eq!(run.code, Some(0), "{run}");
    let id = run.id();
    let subject = pb::InstallSite { site_id: site.clone(), ..Default::default() }.subject();
    assert_eq!(run.published()["subject"], subject.as_str(), "{run}");
    assert_eq!(run.published()["duplicate"], false, "{run}");

    // SiteInstallStarted first, SiteInstalled last, the phases in order, each node's events between.
    let kinds = run.kinds();
    assert_eq!(kinds.first().map(String::as_str), Some("SiteInstallStarted"), "{run}");
    assert_eq!(kinds.last().map(String::as_str), Some("SiteInstalled"), "{run}");
    let pos = |kind: &str| kinds.iter().position(|k| k == kind).unwrap_or_else(|| panic!("no {kind}\n{run}"));
    let flow =
        ["SiteInstallStarted", "ArtifactsStaged", "ClusterReady", "KubeconfigStored", "ContainerPackagesApplied"];
    for pair in flow.windows(2) {
        assert!(pos(pair[0]) < pos(pair[1]), "{} before {}\n{run}", pair[0], pair[1]);
    }
    let events = run.events();
    for node in &fleet.sites[0].0.nodes {
        let of_node = |kind: &str| {
            events
                .iter()
                .position(|(k, v)| k == kind && v["node"] == node.name.as_str())
                .unwrap_or_else(|| panic!("no {kind} of {}\n{run}", node.name.as_str()))
        };
        let (provisioned, binaries) = (of_node("NodeOsProvisioned"), of_node("NodeBinariesInstalled"));
        assert!(0 < provisioned && provisioned < binaries && binaries < pos("ClusterReady"), "{run}");
    }
    // Decoded by the generated classes: proto field names, enums by name.
    let (_, installed) = events.last().expect("events");
    assert_eq!(installed["site_id"], site.as_str(), "{run}");
    assert_eq!(installed["outcome"], "INSTALL_OUTCOME_SUCCESS", "{run}");
    assert_eq!(installed["results"].as_array().map(Vec::len), Some(2), "{run}");

    // The bus agrees: the install ran for the script's command id, and the script printed
    // exactly the events correlated with it, in stream order.
    let on_bus = install_on_the_bus(&fleet, &site, &id).await;
    assert_eq!(on_bus.terminal().delivery.type_name, pb::SiteInstalled::TYPE);
    let done: pb::SiteInstalled = on_bus.terminal().delivery.decode().expect("SiteInstalled decodes");
    assert_eq!(done.outcome, pb::InstallOutcome::Success as i32);
    assert_eq!(kinds, on_bus.kinds(), "{run}");
    let installed_event = fleet.wait_for(pb::SiteInstalled::filter(), &id, Duration::from_secs(5)).await;
    assert!(installed_event.is_some(), "no SiteInstalled correlated with {id}");

    // The command the script stored carries the contract's headers.
    let commands = fleet.bus.jetstream().get_stream(names::COMMANDS_STREAM).await.expect("commands stream");
    let seq = run.published()["seq"].as_u64().expect("a sequence");
    let stored = commands.get_raw_message(seq).await.expect("the stored command");
    assert_eq!(stored.subject.as_str(), subject);
    let header = |name: &str| {
        let value = stored.headers.get(name).map(|v| v.as_str().to_string());
        value.unwrap_or_else(|| panic!("no {name} header on the stored command"))
    };
    assert_eq!(header(headers::MSG_ID), id);
    assert_eq!(header(headers::TYPE), pb::InstallSite::TYPE);
    assert_eq!(header(headers::CORRELATION_ID), id);
    assert_eq!(header(headers::CAUSATION_ID), id);
    let trace = header(headers::TRACEPARENT);
    let parts: Vec<&str> = trace.split('-').collect();
    assert!(
        parts.len() == 4 && parts[0] == "00" && parts[1].len() == 32 && parts[2].len() == 16 && parts[3] == "01",
        "not a W3C traceparent: {trace}"
    );
    assert!(uuid::Uuid::parse_str(&id).is_ok_and(|u| u.get_version_num() == 7), "a fresh id is a UUIDv7: {id}");

    // Each host was provisioned once.
    let provisions = fleet.backend(0).effects().provisions;
    assert!(provisions.len() == 2 && provisions.values().all(|n| *n == 1), "{provisions:?}");
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_says_why_an_install_of_an_unknown_site_is_rejected() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(1).nodes(2).start().await;
    let gen_dir = tempfile::tempdir().expect("a temporary directory");

    let run = run_script(&server.url(), gen_dir.path(), &["no-such-site"]).await;
    assert_eq!(run.code, Some(2), "{run}");
    assert_eq!(run.kinds(), vec!["CommandRejected"], "{run}");
    let (_, rejected) = &run.events()[0];
    assert_eq!(rejected["code"], "REJECT_CODE_UNKNOWN_SITE", "{run}");
    assert_eq!(rejected["command_id"], run.id().as_str(), "{run}");
    assert!(run.stderr.contains("rejected (REJECT_CODE_UNKNOWN_SITE): site no-such-site is not registered"), "{run}");

    // The rejection is on the bus in the site's scope, correlated with the command.
    let filter = names::event_subject("no-such-site", pb::rejection::COMMAND_AGGREGATE, pb::rejection::KIND);
    let on_bus = fleet.wait_for(filter, &run.id(), Duration::from_secs(5)).await.expect("the rejection");
    let on_bus: pb::CommandRejected = on_bus.delivery.decode().expect("CommandRejected decodes");
    assert_eq!(rejected["reason"], on_bus.reason.as_str());
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_id_published_twice_by_the_python_client_installs_once() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(1).nodes(2).start().await;
    let site = fleet.site_id(0);
    let gen_dir = tempfile::tempdir().expect("a temporary directory");
    let id = uuid::Uuid::now_v7().to_string();

    let first = run_script(&server.url(), gen_dir.path(), &["--id", &id, &site]).await;
    assert_eq!(first.code, Some(0), "{first}");
    assert_eq!(first.published()["duplicate"], false, "{first}");
    // The retry: the stream knows the id, so nothing is stored, and the script follows the
    // install its first publish started, from the start.
    let again = run_script(&server.url(), gen_dir.path(), &["--id", &id, &site]).await;
    assert_eq!(again.code, Some(0), "{again}");
    assert_eq!(again.published()["id"], id.as_str(), "{again}");
    assert_eq!(again.published()["duplicate"], true, "{again}");
    assert_eq!(again.published()["seq"], first.published()["seq"], "the PubAck names the stored copy\n{again}");
    assert!(again.stderr.contains("duplicate"), "{again}");
    assert_eq!(again.kinds(), first.kinds(), "the same install, seen twice\n{again}");

    // The bus holds the command once and one install of it; each host was provisioned once.
    let subject = pb::InstallSite { site_id: site.clone(), ..Default::default() }.subject();
    let commands = fleet.bus.jetstream().get_stream(names::COMMANDS_STREAM).await.expect("commands stream");
    let counts: Vec<(String, usize)> =
        commands.info_with_subjects(&subject).await.expect("subjects").map(|r| r.expect("a subject")).collect().await;
    assert_eq!(counts, vec![(subject, 1)]);
    let on_bus = correlated_on_the_bus(&fleet, &site, &id).await;
    let started = on_bus.iter().filter(|k| **k == short(pb::SiteInstallStarted::TYPE)).count();
    assert_eq!(started, 1, "{on_bus:?}");
    let provisions = fleet.backend(0).effects().provisions;
    assert!(provisions.len() == 2 && provisions.values().all(|n| *n == 1), "{provisions:?}");
    fleet.stop().await;
}
