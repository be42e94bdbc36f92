//! `landfall bench api`: the HTTP API and dashboard over a large fleet, measured as operators
//! meet them: `landfall serve api` as a process of its own against a hub that already holds the
//! fleet, its memory once its read model has caught up, how long catching up took, the latency
//! of the requests the dashboard makes, and the dashboard's first paint in headless Chromium.
//!
//! [`measure_api`] needs only a hub and the number of sites it holds, so any benchmark that
//! made a fleet, however it made it, can end with it; `bench api` makes its own ([`fleet`]).

mod browser;
mod fleet;

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use bus_schema::runtime::{Bus, Topology};
use serde_json::{Value, json};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::{register_fleet, round};
use crate::bench::transfer::status_bytes;
use crate::run::demo::{demo_packages, demo_site};
use crate::run::embedded::tied;

/// How long the API may take to catch up with the hub before the measurement gives up.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(600);
/// Requests timed per kind, after a few untimed ones.
const SAMPLES: usize = 50;
const WARM_UP: usize = 5;
/// The page the dashboard asks for.
const PAGE: usize = 50;

/// Starts `landfall serve api` (this program) as a child process against the hub at `nats_url`
/// (`nats_args`: further global flags, such as `--nats-nkey-file F`), waits until its read
/// model serves `expected_sites` sites and `/readyz` says it has caught up, and measures it:
/// catch-up time, memory (VmRSS, VmHWM), latency of `/v1/sites` pages, a search, a state
/// filter and `/v1/overview`, and the dashboard's first paint in headless Chromium when
/// Chromium and playwright-core are there (else the JSON says why it was not measured).
///
/// # Errors
/// When the API does not start or does not catch up within ten minutes, or a request fails.
pub async fn measure_api(nats_url: &str, nats_args: &[String], expected_sites: usize) -> anyhow::Result<Value> {
    let program = std::env::current_exe().context("this program's path")?;
    measure_api_with(&program, nats_url, nats_args, expected_sites).await
}

/// [`measure_api`], running `program` as `landfall` (a test runs the CLI it built).
///
/// # Errors
/// As [`measure_api`].
pub async fn measure_api_with(
    program: &Path,
    nats_url: &str,
    nats_args: &[String],
    expected_sites: usize,
) -> anyhow::Result<Value> {
    let dir = fresh_dir()?;
    let result = measure_in(program, &dir, nats_url, nats_args, expected_sites).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// A fresh directory for the API's tokens and log, removed by [`measure_api`].
fn fresh_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("landfall-bench-api-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    Ok(dir)
}

/// The API child process: killed and reaped on drop.
struct ApiChild {
    child: Child,
    log: std::path::PathBuf,
}

impl ApiChild {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The last lines of its log, for an error.
    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for ApiChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?.local_addr()?.port())
}

/// `program serve api` on `listen`, with one viewer token, its log in `dir`.
fn start_api(
    program: &Path,
    dir: &Path,
    nats_url: &str,
    nats_args: &[String],
    listen: SocketAddr,
    token: &str,
) -> anyhow::Result<ApiChild> {
    let tokens = dir.join("api-tokens.yaml");
    std::fs::write(&tokens, format!("tokens:\n  - name: bench\n    role: viewer\n    token: {token}\n"))
        .with_context(|| format!("write {}", tokens.display()))?;
    let log = dir.join("api.log");
    let stderr = std::fs::File::create(&log).with_context(|| format!("create {}", log.display()))?;
    let mut cmd = tied::command(program);
    cmd.args(["--nats-url", nats_url])
        .args(nats_args)
        .args(["serve", "api", "--api-listen", &listen.to_string()])
        .arg("--api-tokens")
        .arg(&tokens)
        .env_remove("RUST_LOG")
        .env_remove("LANDFALL_METRICS_LISTEN")
        .env_remove("LANDFALL_API_LISTEN")
        .env_remove("LANDFALL_API_TOKENS_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);
    let child = tied::spawn(cmd).context("start landfall serve api")?;
    Ok(ApiChild { child, log })
}

/// What `/proc/<pid>` says of a process: memory in bytes, CPU time in seconds.
fn memory(pid: u32) -> Value {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let mib = |field| status_bytes(&status, field).map(|b| round(b as f64 / (1024.0 * 1024.0), 1));
    json!({ "vm_rss_mib": mib("VmRSS"), "vm_hwm_mib": mib("VmHWM"), "cpu_seconds": cpu_seconds(pid) })
}

/// User plus system CPU time of a process, from `/proc/<pid>/stat` (in clock ticks of 1/100 s,
/// which is what Linux reports there on every architecture it exports USER_HZ for).
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces; the fields after it start past its closing parenthesis.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(round(ticks as f64 / 100.0, 2))
}

/// A GET with the token; the body as JSON.
async fn get(http: &reqwest::Client, base: &str, token: &str, path: &str) -> anyhow::Result<(u16, Value)> {
    let res = http.get(format!("{base}{path}")).bearer_auth(token).send().await?;
    let status = res.status().as_u16();
    let body = res.bytes().await?;
    Ok((status, serde_json::from_slice(&body).unwrap_or(Value::Null)))
}

/// Polls until the API serves `expected` sites and says it has caught up; how long that took
/// from `started`, and when `/readyz` first said so.
async fn wait_caught_up(
    api: &mut ApiChild,
    http: &reqwest::Client,
    base: &str,
    token: &str,
    expected: usize,
    started: Instant,
) -> anyhow::Result<(f64, Option<f64>)> {
    let mut ready_at = None;
    loop {
        if let Some(status) = api.child.try_wait()? {
            anyhow::bail!("landfall serve api exited ({status}) before it caught up:\n{}", api.log_tail());
        }
        anyhow::ensure!(
            started.elapsed() < CATCH_UP_TIMEOUT,
            "the API did not catch up with {expected} sites within {CATCH_UP_TIMEOUT:?}:\n{}",
            api.log_tail()
        );
        if let Ok((200, _)) = get(http, base, token, "/readyz").await {
            ready_at.get_or_insert(started.elapsed().as_secs_f64());
            if let Ok((200, o)) = get(http, base, token, "/v1/overview").await
                && o["sites"]["total"].as_u64().is_some_and(|n| n as usize >= expected)
            {
                return Ok((started.elapsed().as_secs_f64(), ready_at));
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `SAMPLES` timed GETs of `path` (after `WARM_UP` untimed ones): median, p95 and max in ms,
/// and the size of the answer.
async fn latency(http: &reqwest::Client, base: &str, token: &str, path: &str) -> anyhow::Result<Value> {
    let mut times = Vec::with_capacity(SAMPLES);
    let mut bytes = 0;
    for i in 0..WARM_UP + SAMPLES {
        let start = Instant::now();
        let res = http.get(format!("{base}{path}")).bearer_auth(token).send().await?;
        let status = res.status();
        let body = res.bytes().await?;
        let took = start.elapsed().as_secs_f64() * 1000.0;
        anyhow::ensure!(status.is_success(), "GET {path}: {status}: {}", String::from_utf8_lossy(&body));
        bytes = body.len();
        if i >= WARM_UP {
            times.push(took);
        }
    }
    times.sort_by(f64::total_cmp);
    let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    Ok(json!({
        "path": path,
        "median_ms": round(at(0.5), 2),
        "p95_ms": round(at(0.95), 2),
        "max_ms": round(at(1.0), 2),
        "response_bytes": bytes,
    }))
}

async fn measure_in(
    program: &Path,
    dir: &Path,
    nats_url: &str,
    nats_args: &[String],
    expected: usize,
) -> anyhow::Result<Value> {
    let listen = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()?));
    let token = format!("bench-{}", uuid::Uuid::new_v4().simple());
    let base = format!("http://{listen}");
    consumers::artifacts::install_tls_provider();
    let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build()?;
    eprintln!("api: starting landfall serve api on {listen}, waiting for {expected} sites ...");
    let started = Instant::now();
    let mut api = start_api(program, dir, nats_url, nats_args, listen, &token)?;
    let (caught_up_s, ready_s) = wait_caught_up(&mut api, &http, &base, &token, expected, started).await?;
    let after_catch_up = memory(api.pid());
    eprintln!("api: caught up in {caught_up_s:.1} s; {after_catch_up}");

    // The pages the dashboard asks for: the first, one in the middle, a search for one site's
    // id, the sites in one state; and the overview it shows above them.
    let middle = (expected / 2) / PAGE * PAGE;
    let (_, page) = get(&http, &base, &token, &format!("/v1/sites?limit={PAGE}&offset={middle}")).await?;
    let needle = page["items"][0]["site"].as_str().unwrap_or("edge").to_string();
    let (_, overview) = get(&http, &base, &token, "/v1/overview").await?;
    let state = crate::api::views::SITE_STATES
        .iter()
        .max_by_key(|s| overview["sites"]["by_state"][**s].as_u64().unwrap_or(0))
        .copied()
        .unwrap_or("installed");
    let mut requests = serde_json::Map::new();
    for (name, path) in [
        ("sites_first_page", format!("/v1/sites?limit={PAGE}&offset=0")),
        ("sites_middle_page", format!("/v1/sites?limit={PAGE}&offset={middle}")),
        ("sites_search", format!("/v1/sites?limit={PAGE}&offset=0&q={needle}")),
        ("sites_by_state", format!("/v1/sites?limit={PAGE}&offset=0&state={state}")),
        ("overview", "/v1/overview".to_string()),
    ] {
        let l = latency(&http, &base, &token, &path).await?;
        eprintln!("api: {name}: {l}");
        requests.insert(name.to_string(), l);
    }
    let after_requests = memory(api.pid());

    let first_paint = browser::first_paint(&base, &token, expected).await;
    eprintln!("api: dashboard: {first_paint}");
    let at_end = memory(api.pid());
    if let Some(status) = api.child.try_wait()? {
        anyhow::bail!("landfall serve api exited ({status}) during the measurement:\n{}", api.log_tail());
    }
    Ok(json!({
        "sites": expected,
        "site_nodes": overview["nodes"]["total"],
        "sites_by_state": overview["sites"]["by_state"],
        "catch_up_seconds": round(caught_up_s, 2),
        "readyz_seconds": ready_s.map(|s| round(s, 2)),
        "memory_after_catch_up": after_catch_up,
        "memory_after_requests": after_requests,
        "memory_at_end": at_end,
        "requests": requests,
        "dashboard": first_paint,
    }))
}

/// `bench api`: a fleet of `sites` × `nodes` made on the hub at `url` (registered by the
/// orchestrator, then given what installs would leave, [`fleet`]), then [`measure_api`].
pub(super) async fn api(url: &str, sites: usize, nodes: usize) -> anyhow::Result<Value> {
    let bus = Bus::connect(url, "landfall-bench").await?;
    bus.ensure_topology(&Topology::default()).await?;
    let catalog = demo_packages();
    let designs: Vec<_> = (0..sites).map(|i| demo_site(i, nodes)).collect();
    let shutdown = CancellationToken::new();
    let mut services = JoinSet::new();
    services.spawn(consumers::run_orchestrator(bus.clone(), Default::default(), shutdown.clone()));
    eprintln!("api: registering {sites} sites x {nodes} nodes ...");
    let setup = Instant::now();
    register_fleet(&bus, &designs, &catalog).await?;
    let registered_s = setup.elapsed().as_secs_f64();
    // Nothing else runs while the API is measured: the records below are written directly.
    shutdown.cancel();
    while services.join_next().await.is_some() {}
    eprintln!("api: registered in {registered_s:.1} s; writing what installs leave ...");
    let installed = fleet::install(&bus, &designs, &catalog).await?;
    let setup_s = setup.elapsed().as_secs_f64();
    eprintln!("api: fleet ready in {setup_s:.1} s");
    let measured = measure_api(url, &[], sites).await?;
    Ok(json!({
        "bench": "api",
        "sites": sites,
        "nodes_per_site": nodes,
        "fleet": {
            "registered_by": "RegisterSite commands, through the orchestrator",
            "installed_by": "the records a finished install leaves, written directly (see `bench api` in docs/src/benchmarks.md)",
            "install_sagas": installed.sagas,
            "observed_versions": installed.observed,
            "events": installed.events,
            "setup_seconds": round(setup_s, 1),
        },
        "api": measured,
    }))
}
