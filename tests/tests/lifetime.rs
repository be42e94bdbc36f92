//! What `landfall` starts dies with it: a `landfall up` or `landfall bench` killed hard (SIGKILL,
//! or SIGTERM where it has no handler) takes its nats-server along, so the port and the store
//! are free for the next run.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use landfall_tests::nats::free_port;
use producers::embedded::tied;

/// The pids of the processes whose parent is `parent`.
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().nth(1).map(str::to_string)))
                .flatten()
                .is_some_and(|ppid| ppid == parent.to_string())
        })
        .collect()
}

/// Whether `pid` runs (a zombie waiting to be reaped does not).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')))
}

fn exe_name(pid: u32) -> String {
    std::fs::read_link(format!("/proc/{pid}/exe"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_default()
}

/// Starts `landfall ARGS` (with a supported nats-server given), and waits until its own
/// nats-server child runs; returns both.
fn start_with_server(args: &[&str], dir: &std::path::Path, env: &[(&str, &std::path::Path)]) -> (Child, u32) {
    let mut cmd = tied::command(landfall_tests::cli::binary());
    cmd.args(args)
        .envs(env.iter().copied())
        .env("LANDFALL_NATS_SERVER", landfall_tests::nats::binary())
        .env_remove("NATS_URL")
        .env_remove("RUST_LOG")
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = tied::spawn(cmd).expect("start landfall");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(server) = children_of(child.id()).into_iter().find(|pid| exe_name(*pid) == "nats-server") {
            return (child, server);
        }
        assert!(child.try_wait().unwrap().is_none(), "landfall {args:?} exited before starting its nats-server");
        assert!(Instant::now() < deadline, "landfall {args:?} started no nats-server within 60 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn assert_gone(server: u32, after: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while running(server) {
        assert!(Instant::now() < deadline, "the nats-server ({server}) outlived {after}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_killed_up_takes_its_nats_server_along_and_the_next_up_starts() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port().to_string();
    let args = ["up", "--nats-port", &port, "--api-listen", "127.0.0.1:0", "--install", "none", "--sites", "1"];
    let (mut up, server) = start_with_server(&args, dir.path(), &[]);
    // Up to the banner, so the kill lands on a running system, not on a start.
    let stdout = BufReader::new(up.stdout.take().unwrap());
    assert!(stdout.lines().map_while(Result::ok).any(|l| l.starts_with("landfall is up")), "no banner");
    up.kill().unwrap();
    up.wait().unwrap();
    assert_gone(server, "landfall up killed with SIGKILL");

    // The port and the store are free: the same command starts again.
    let (mut again, server) = start_with_server(&args, dir.path(), &[]);
    let stdout = BufReader::new(again.stdout.take().unwrap());
    assert!(stdout.lines().map_while(Result::ok).any(|l| l.starts_with("landfall is up")), "no banner the second time");

    // What became of a demo site outlives the next start: a host that arrived joins its design,
    // and `up` does not register the site over it again.
    let url = format!("nats://127.0.0.1:{port}");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let node_add = ["node", "add", "edge-01", "--name", "node-9", "--role", "worker", "--mac", "52:54:00:00:00:99"];
    let out = rt.block_on(landfall_tests::cli::landfall(&url, &node_add));
    assert!(out.status.success(), "{}", landfall_tests::cli::text(&out.stderr));
    let has_node_9 = || {
        rt.block_on(async {
            let bus = bus_schema::runtime::Bus::connect(&url, "lifetime-test").await.unwrap();
            let sites = bus.kv(bus_schema::names::SITES_BUCKET).await.unwrap();
            let key = bus_schema::names::keys::site("edge-01");
            let (design, _) = sites.get::<bus_schema::pb::SiteDesign>(&key).await.unwrap().unwrap();
            design.nodes.iter().any(|n| n.name == "node-9")
        })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !has_node_9() {
        assert!(Instant::now() < deadline, "node-9 never joined edge-01's design");
        std::thread::sleep(Duration::from_millis(200));
    }
    again.kill().unwrap();
    again.wait().unwrap();
    assert_gone(server, "the second landfall up");
    // The third time nobody reads what `up` prints: its standard output is closed before the
    // banner (as under `landfall up | head -1`), which costs the banner, not the system.
    let api_port = free_port();
    let api = format!("127.0.0.1:{api_port}");
    let mut third_args = args;
    third_args[4] = &api;
    let (mut third, server) = start_with_server(&third_args, dir.path(), &[]);
    drop(third.stdout.take());
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", api_port)).is_err() {
        assert!(third.try_wait().unwrap().is_none(), "the third landfall up exited before serving its API");
        assert!(Instant::now() < deadline, "the third landfall up served no API within 60 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The banner comes right after the API listens.
    std::thread::sleep(Duration::from_secs(1));
    assert!(third.try_wait().unwrap().is_none(), "landfall up died when its standard output was gone");
    assert!(has_node_9(), "the third start registered edge-01 over what it had become");
    drop(rt);
    let again = &mut third;
    again.kill().unwrap();
    again.wait().unwrap();
    assert_gone(server, "the third landfall up");
}

/// The files a benchmark left in `dir`.
fn bench_files(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("landfall-bench-"))
        .collect()
}

#[test]
fn a_terminated_bench_takes_its_nats_server_and_its_store_along() {
    let dir = tempfile::tempdir().unwrap();
    // Long enough to be running when the signal comes; its temporary store under our TMPDIR.
    let args = ["bench", "fanout", "--sites", "200", "--nodes", "10"];
    let (mut bench, server) = start_with_server(&args, dir.path(), &[("TMPDIR", dir.path())]);
    let status = std::process::Command::new("kill").args(["-TERM", &bench.id().to_string()]).status().unwrap();
    assert!(status.success());
    let exit = bench.wait().unwrap();
    assert!(!exit.success(), "a benchmark stopped before its end does not exit 0");
    assert_gone(server, "landfall bench stopped with SIGTERM");
    let left = bench_files(dir.path());
    assert!(left.is_empty(), "the benchmark left its files behind: {left:?}");
}

#[test]
fn a_bench_stopped_while_it_makes_its_sites_keys_stops_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = tied::command(landfall_tests::cli::binary());
    cmd.args(["bench", "fanout", "--sites", "2000", "--nodes", "10"])
        .env("LANDFALL_NATS_SERVER", landfall_tests::nats::binary())
        .env("TMPDIR", dir.path())
        .env_remove("NATS_URL")
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut bench = tied::spawn(cmd).expect("start landfall bench");
    // Its run directory is made right before the hub's configuration, whose 2,000 site keys
    // take tens of seconds in a debug build.
    let deadline = Instant::now() + Duration::from_secs(60);
    while bench_files(dir.path()).is_empty() {
        assert!(bench.try_wait().unwrap().is_none(), "the benchmark ended before it made its run directory");
        assert!(Instant::now() < deadline, "the benchmark made no run directory within 60 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !bench_files(dir.path()).iter().any(|run| dir.path().join(run).join("nats").exists()),
        "the keys were made already: the signal would not come while they are"
    );
    let status = std::process::Command::new("kill").args(["-TERM", &bench.id().to_string()]).status().unwrap();
    assert!(status.success());
    let stopping = Instant::now();
    let exit = bench.wait().unwrap();
    let took = stopping.elapsed();
    assert!(!exit.success(), "a benchmark stopped before its end does not exit 0");
    // Stopped when told, not once the step it was in is over (tens of seconds in a debug build).
    assert!(took < Duration::from_secs(10), "the benchmark took {took:?} to stop after SIGTERM");
    let left = bench_files(dir.path());
    assert!(left.is_empty(), "the benchmark left its files behind: {left:?}");
}

/// `landfall up`, stopped and started again in the same directory, carries on with the same
/// fleet: each test installs, stops `up` (Ctrl-C or kill -9, at the moment it names), starts it
/// again, and rolls out a newer kubelet, which must patch every node exactly once, as the
/// simulated sites' own files count it.
mod second_day {
    use std::collections::BTreeMap;
    use std::time::{Duration, Instant};

    use landfall_tests::up::{Up, http};
    use serde_json::Value;

    const SITES: [&str; 2] = ["edge-01", "edge-02"];
    const NODES: [&str; 3] = ["node-1", "node-2", "node-3"];

    fn start() -> Up {
        Up::start_with(2, &["--nodes", "3", "--install", "all", "--time-scale", "200"])
    }

    fn installed(up: &Up) {
        for site in SITES {
            up.until_site(site, "installed", Duration::from_secs(180), |s| {
                assert_ne!(s["state"], "failed", "{site}'s install failed: {s}");
                s["state"] == "installed"
            });
        }
    }

    /// Registers a newer kubelet (metadata only, as the banner's line does); its auto-rollout
    /// starts by itself.
    fn register_kubelet(up: &Up, version: &str) {
        let sha = format!("{:0>64}", version.replace('.', ""));
        let args = ["package", "register", "--name", "kubelet", "--version", version, "--kind", "binary"];
        let args: Vec<&str> = args.into_iter().chain(["--sha256", &sha, "--size", "111955968"]).collect();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let out = rt.block_on(landfall_tests::cli::landfall(&up.nats_url(), &args));
        assert!(out.status.success(), "package register: {}", landfall_tests::cli::text(&out.stderr));
    }

    /// The rollout of kubelet `version`, as the API shows it, once there is one.
    fn rollout(up: &Up, version: &str) -> Option<Value> {
        let (status, body) = http(up.api, "GET", "/v1/rollouts", Some(&up.viewer), None);
        if status != 200 {
            return None;
        }
        let all: Value = serde_json::from_str(&body).ok()?;
        all.as_array()?.iter().find(|r| r["package"] == "kubelet" && r["version"] == version).cloned()
    }

    fn until_rollout(up: &Up, version: &str, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            if let Some(r) = rollout(up, version) {
                assert!(
                    r["phase"] != "halted" && r["phase"] != "cancelled",
                    "the rollout stopped: {r}\n{}",
                    up.output()
                );
                if ok(&r) {
                    return r;
                }
            }
            assert!(
                Instant::now() < deadline,
                "the kubelet {version} rollout was not {what} within 180 s\n{}",
                up.output()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// What each node of both sites had done to it, across every process that ran the site.
    fn counted(
        up: &Up,
        counter: fn(&site_gateway::sim::SimEffects) -> &BTreeMap<String, u32>,
    ) -> BTreeMap<String, u32> {
        let mut all = BTreeMap::new();
        for site in SITES {
            let effects = site_gateway::sim::saved_effects(&up.site_state(site)).expect("the site's kept state");
            for (node, n) in counter(&effects) {
                all.insert(format!("{site}/{node}"), *n);
            }
        }
        all
    }

    fn once_each() -> BTreeMap<String, u32> {
        SITES.iter().flat_map(|s| NODES.iter().map(move |n| (format!("{s}/{n}"), 1))).collect()
    }

    /// Rolls kubelet `version` out to the end and checks each node was patched once, and each
    /// host provisioned once.
    fn rolls_out_once(up: &Up, version: &str) {
        let done = until_rollout(up, version, "completed", |r| r["phase"] == "completed");
        assert_eq!((done["patched"].as_u64(), done["failed"].as_u64()), (Some(6), Some(0)), "{done}");
        assert_eq!(counted(up, |e| &e.patches), once_each(), "every node patched once");
        assert_eq!(counted(up, |e| &e.provisions), once_each(), "every host provisioned once");
        // The versions the nodes run are the observer's, a consumer of its own: it may write a
        // node's a moment after the orchestrator counted it.
        for site in SITES {
            up.until_site(site, &format!("running kubelet {version} on every node"), Duration::from_secs(30), |s| {
                s["node_list"].as_array().unwrap().iter().all(|node| {
                    node["packages"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|p| p["name"] == "kubelet" && p["version"] == version)
                })
            });
        }
    }

    #[test]
    fn up_stopped_with_ctrl_c_and_started_again_rolls_out_to_the_same_fleet() {
        let mut up = start();
        installed(&up);
        up.stop("INT");
        up.start_again();
        let again = up.site("edge-01");
        assert_eq!(again["state"], "installed", "{again}");
        register_kubelet(&up, "1.29.9");
        rolls_out_once(&up, "1.29.9");
    }

    #[test]
    fn a_site_that_lost_its_hosts_says_so_and_the_rollout_leaves_it_aside() {
        let mut up = start();
        installed(&up);
        up.stop("INT");
        // The data directory without edge-01's part: its hosts start again from nothing.
        std::fs::remove_file(up.site_state("edge-01")).unwrap();
        up.start_again();
        register_kubelet(&up, "1.29.9");
        let done = until_rollout(&up, "1.29.9", "completed", |r| r["phase"] == "completed");
        assert_eq!((done["patched"].as_u64(), done["failed"].as_u64()), (Some(3), Some(0)), "{done}");
        let edge_02: BTreeMap<String, u32> = NODES.iter().map(|n| (format!("edge-02/{n}"), 1)).collect();
        assert_eq!(counted(&up, |e| &e.patches), edge_02, "edge-01's nodes left alone, edge-02's patched once");

        // The hub shows edge-01 as needing attention, with what the site found.
        let site = up.site("edge-01");
        let attention = site["attention"].as_array().unwrap();
        let found = attention.iter().find(|a| a["kind"] == "site_disagrees").unwrap_or_else(|| panic!("{site}"));
        let reason = found["reason"].as_str().unwrap();
        assert!(reason.contains("node-1 is ") && reason.contains("node-3 is "), "{reason}");
        assert!(up.site("edge-02")["attention"].as_array().unwrap().is_empty(), "edge-02 needs nothing");
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let out = rt.block_on(landfall_tests::cli::landfall(&up.nats_url(), &["status", "edge-01"]));
        let table = landfall_tests::cli::text(&out.stdout);
        assert!(table.contains("needs attention: the site does not have these nodes as the hub believes"), "{table}");
    }

    #[test]
    fn up_killed_twice_in_the_middle_of_a_rollout_finishes_it_patching_each_node_once() {
        let mut up = start();
        installed(&up);
        register_kubelet(&up, "1.29.9");
        for at_least in [1, 3] {
            until_rollout(&up, "1.29.9", "under way", |r| r["patched"].as_u64() >= Some(at_least));
            up.stop("KILL");
            up.start_again();
        }
        rolls_out_once(&up, "1.29.9");
    }

    #[test]
    fn up_killed_in_the_middle_of_an_install_finishes_it_and_rolls_out_after() {
        let mut up = start();
        // Some host on its way to its image: the install is halfway.
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let provisioning = SITES.iter().any(|site| {
                up.site(site)["node_list"]
                    .as_array()
                    .is_some_and(|nodes| nodes.iter().any(|n| n["metal3_state"] == "provisioning"))
            });
            if provisioning {
                break;
            }
            assert!(Instant::now() < deadline, "no host was provisioning within 120 s\n{}", up.output());
            std::thread::sleep(Duration::from_millis(50));
        }
        up.stop("KILL");
        up.start_again();
        installed(&up);
        register_kubelet(&up, "1.29.9");
        rolls_out_once(&up, "1.29.9");
    }
}

/// The production-shape benchmark through relays, its gateways in two processes of their own:
/// every node patched once, counted from the children's own reports, and nothing left behind.
#[test]
fn a_bench_through_relays_with_its_gateways_in_processes_of_their_own_patches_every_node_once() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = ["fanout", "--sites", "12", "--nodes", "2", "--idle", "1s", "--raw-messages", "1000"];
    let spread = ["--relays", "2", "--gateway-processes", "2"];
    let (report, stderr) = run_bench(&[&fleet[..], &spread[..]].concat(), dir.path());
    assert_eq!(report["node_updates"], 24, "{report}");
    assert_eq!(report["backend_patch_effects"], 24, "each node patched once, by the children's count: {report}");
    assert_eq!(report["relays"]["count"], 2, "{report}");
    assert_eq!(report["gateway_processes"], 2, "{report}");
    assert!(report["cpu_seconds"]["setup"]["gateway_processes"].as_f64().unwrap() > 0.0, "{report}");
    assert!(stderr.contains("12 through relays, in 2 process(es)"), "{stderr}");
    // The hub sampled again after the idle period, by its own monitoring.
    assert!(report["hub_costs"]["settled"]["rss_mib"].as_f64().unwrap() > 0.0, "{report}");
    assert!(report["hub_costs"]["per_site_settled"]["rss_kib"].is_number(), "{report}");
    let left = bench_files(dir.path());
    assert!(left.is_empty(), "the benchmark left its files behind: {left:?}");
}

/// Regions below a core (`bench regions`): every command published at the core only, every
/// answer read there only, each region's sites installed and patched through their own hub,
/// nothing of one region in another's, and a command published at the core under the hubs'
/// own subjects taken by no region.
#[test]
fn a_fleet_in_regions_below_a_core_is_installed_and_patched_through_the_core_each_region_apart() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["regions", "--regions", "2", "--sites", "3", "--nodes", "2", "--raw-messages", "1000"];
    let (report, _) = run_bench(&args, dir.path());
    assert_eq!(report["patch"]["node_updates"], 12, "{report}");
    assert_eq!(report["patch"]["backend_patch_effects"], 12, "each node patched once: {report}");
    assert_eq!(report["foreign_events"], 0, "{report}");
    let regions = report["per_region"].as_array().unwrap();
    assert_eq!(regions.len(), 2, "{report}");
    for (region, name) in regions.iter().zip(["r1", "r2"]) {
        assert_eq!(region["region"], name, "{region}");
        assert_eq!(region["domain"], format!("hub-{name}"), "{region}");
        assert_eq!(region["node_updates"], 6, "{region}");
        let streams = &region["streams"];
        // The demo catalog's five packages, three sites, three installs, the patch's package
        // and the patch: kept at the core, and exactly those in the region's commands stream
        // (the stray command in neither).
        assert_eq!(streams["core_commands"], 13, "{region}");
        assert_eq!(streams["region_commands"], streams["core_commands"], "{region}");
        assert_eq!(streams["core_events_mirror"], streams["region_events"], "{region}");
        assert!(region["hub_costs"]["per_site"]["rss_kib"].is_number(), "{region}");
    }
    let left = bench_files(dir.path());
    assert!(left.is_empty(), "the benchmark left its files behind: {left:?}");
}

/// The job layouts with no consumer per site and with one per site (as landfall's): each brings
/// one job to every site, and the benchmark fails when a site never takes its job.
#[test]
fn a_job_to_every_site_is_taken_with_a_consumer_per_site_and_without_one() {
    let dir = tempfile::tempdir().unwrap();
    for layout in ["dispatch", "direct", "push-sharded"] {
        let args = ["job-layout", "--sites", "70", "--layout", layout, "--idle", "1s"];
        let (report, _) = run_bench(&args, dir.path());
        assert_eq!(report["layout"], layout, "{report}");
        assert_eq!(report["sites"], 70, "{report}");
        assert!(report["one_job_to_every_site_seconds"].as_f64().unwrap() > 0.0, "{report}");
    }
    let left = bench_files(dir.path());
    assert!(left.is_empty(), "the benchmark left its files behind: {left:?}");
}

/// `landfall bench <args>` run to its end in `dir` (its temporary files there too), on the
/// tests' nats-server: its JSON report and what it printed on stderr.
fn run_bench(args: &[&str], dir: &std::path::Path) -> (serde_json::Value, String) {
    let out = std::process::Command::new(landfall_tests::cli::binary())
        .arg("bench")
        .args(args)
        .env("LANDFALL_NATS_SERVER", landfall_tests::nats::binary())
        .env("TMPDIR", dir)
        .env_remove("NATS_URL")
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("run landfall bench");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    (serde_json::from_slice(&out.stdout).expect("the report is JSON"), stderr)
}
