//! `landfall bench soak`: whether storage, memory and recovery stay flat over simulated days.
//!
//! A fleet of simulated sites is installed, then each simulated day (`--day-length` of wall
//! time) runs a day's operations through the bus ([`day`]) and ends with measurements
//! ([`measure`]). Keeping times are scaled to the day, so what the bus keeps for days is
//! forgotten within the run; the summary says how much each measure grew from the first day
//! the retention is full to the last.

mod day;
mod measure;

use std::process::{Child, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bus_schema::domain::SiteDesign;
use bus_schema::names;
use bus_schema::retention::StorePolicy;
use bus_schema::runtime::{Bus, Topology};
use consumers::artifacts::ArtifactStore;
use serde_json::json;
use site_gateway::ArtifactCache;
use site_gateway::sim::{SimConfig, SimSite};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::{
    jobs_streams, raw_publish_rate, register_fleet, representative_payload, round, scratch_dir, wait_for_consumers,
};
use crate::flags::parse_duration;
use crate::run::demo::{demo_site, upload_demo_packages};
use crate::run::embedded::tied;
use day::SoakFleet;
use measure::{Day, FLAT_PERCENT};

/// The demo packages' stand-in bytes are this many times smaller than the real packages, so
/// installs and rollouts move real bytes into the sites' caches without filling the disk.
const SHRINK: u64 = 4096;

#[derive(Debug, clap::Args)]
pub struct SoakArgs {
    #[arg(long, default_value_t = 50)]
    sites: usize,
    /// Nodes per site at the start (the first is a master; 3 masters from 5 nodes up).
    #[arg(long, default_value_t = 4)]
    nodes: usize,
    #[arg(long, default_value_t = 10)]
    days: usize,
    /// Wall time of one simulated day, e.g. 20s, 1m.
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    day_length: Duration,
    /// How many simulated days commands, events and the command ledger are kept. Growth is
    /// measured from the first day after they are full.
    #[arg(long, default_value_t = 1)]
    retention_days: u32,
    /// Run the orchestrator in this process, instead of as a `landfall serve orchestrator` child
    /// whose memory is measured apart.
    #[arg(long)]
    in_process: bool,
    /// Messages published for the raw JetStream measurement.
    #[arg(long, default_value_t = 20_000)]
    raw_messages: usize,
    /// Design revisions each site keeps.
    #[arg(long, default_value_t = 3)]
    design_revisions: u32,
    /// Bytes each site's artifact cache may hold before it evicts what no design needs (the demo
    /// packages here are 1/4096 of their real sizes: about 650 KiB a site, so a little more
    /// than one set of what the sites run).
    #[arg(long, default_value_t = 660 << 10)]
    cache_max_bytes: u64,
}

/// How long things are kept during a soak, scaled to its simulated day: the one place a soak's
/// keeping times are set. The bus keeps commands, events and ledger records for
/// `retention_days` days and drops a repeated command id for a quarter of a day; the
/// orchestrator keeps finished sagas and rollouts whole as long, and their summaries (and the
/// observer nodes' departures) as long again, compacting ten times a day,
/// keeps deletion markers a quarter of a day, and `design_revisions` revisions of each site (a
/// count, not a time: a soak's few applies a day reach the default only after weeks).
#[derive(Debug, Clone)]
struct Keeping {
    duplicate_window: Duration,
    retention: Duration,
    policy: StorePolicy,
}

fn retention_for(day_length: Duration, retention_days: u32, design_revisions: u32) -> Keeping {
    let retention = day_length * retention_days;
    let policy = StorePolicy {
        finished_retention: retention,
        design_revisions,
        compaction_interval: day_length / 10,
        marker_retention: day_length / 4,
        summary_retention: retention,
        ..StorePolicy::default()
    };
    Keeping { duplicate_window: (day_length / 4).min(retention), retention, policy }
}

impl Keeping {
    fn topology(&self, bus: &Bus) -> Topology {
        Topology::for_server(bus).keeping(Some(self.duplicate_window), Some(self.retention))
    }

    /// The same keeping times as `landfall serve` flags: a service started without them would
    /// bring the streams back to the defaults.
    fn serve_args(&self) -> Vec<String> {
        vec!["--duplicate-window".into(), ms(self.duplicate_window), "--retention".into(), ms(self.retention)]
    }

    /// The orchestrator's own keeping, as `landfall serve orchestrator` flags.
    fn orchestrator_args(&self) -> Vec<String> {
        vec![
            "--finished-retention".into(),
            ms(self.policy.finished_retention),
            "--design-revisions".into(),
            self.policy.design_revisions.to_string(),
            "--compaction-every".into(),
            ms(self.policy.compaction_interval),
            "--marker-retention".into(),
            ms(self.policy.marker_retention),
            "--summary-retention".into(),
            ms(self.policy.summary_retention),
        ]
    }
}

/// A duration as a flag's value.
fn ms(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

/// The orchestrator under test: a child process (its memory is its own), or a task here.
enum Orchestrator {
    Child(Child),
    InProcess,
}

impl Orchestrator {
    fn pid(&self) -> Option<u32> {
        match self {
            Self::Child(c) => Some(c.id()),
            Self::InProcess => None,
        }
    }

    fn stop(self) {
        if let Self::Child(mut c) = self {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

async fn start_orchestrator(
    url: &str,
    keeping: &Keeping,
    in_process: bool,
    services: &mut JoinSet<anyhow::Result<()>>,
    shutdown: &CancellationToken,
) -> anyhow::Result<Orchestrator> {
    if in_process {
        let bus = Bus::connect(url, "landfall-bench-orchestrator").await?;
        services.spawn(consumers::run_orchestrator(bus, keeping.policy, shutdown.clone()));
        return Ok(Orchestrator::InProcess);
    }
    let exe = std::env::current_exe().context("find this program, to run the orchestrator")?;
    let log = std::fs::File::create(scratch_dir().join("orchestrator.log")).context("create the orchestrator's log")?;
    let mut cmd = tied::command(exe);
    cmd.arg("--nats-url")
        .arg(url)
        .arg("serve")
        .args(keeping.serve_args())
        .arg("orchestrator")
        .args(keeping.orchestrator_args())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    let child = tied::spawn(cmd).context("start `landfall serve orchestrator`")?;
    Ok(Orchestrator::Child(child))
}

pub async fn soak(url: &str, args: SoakArgs) -> anyhow::Result<serde_json::Value> {
    anyhow::ensure!(args.sites >= 1 && args.nodes >= 1, "--sites and --nodes must be at least 1");
    anyhow::ensure!(args.days >= 1 && args.retention_days >= 1, "--days and --retention-days must be at least 1");
    anyhow::ensure!(args.day_length >= Duration::from_secs(1), "--day-length must be at least 1s");
    let keeping = retention_for(args.day_length, args.retention_days, args.design_revisions);
    let bus = Bus::connect(url, "landfall-bench").await?;
    bus.ensure_topology(&keeping.topology(&bus)).await?;
    let payload = representative_payload();
    eprintln!("raw JetStream: {} async publishes of {payload} bytes ...", args.raw_messages);
    let raw = raw_publish_rate(&bus, payload, args.raw_messages).await?;
    eprintln!("raw JetStream: {raw:.0} msgs/s");

    let scratch = scratch_dir();
    std::fs::create_dir_all(&scratch).with_context(|| format!("create {}", scratch.display()))?;
    let store = ArtifactStore::local(&scratch.join("artifacts"))?;
    let catalog = upload_demo_packages(&store, SHRINK).await.context("upload the demo packages")?;
    let shutdown = CancellationToken::new();
    let mut services = JoinSet::new();
    let orchestrator = start_orchestrator(url, &keeping, args.in_process, &mut services, &shutdown).await?;
    let result = async {
        services.spawn(consumers::run_observer_with(
            bus.clone(),
            keeping.policy,
            names::CUT_OFF_AFTER,
            shutdown.clone(),
        ));
        let key = Arc::new(consumers::secrets::KeyRing::from_hex(&"5a".repeat(32), "bench")?);
        services.spawn(consumers::secrets_service::run_secrets(bus.clone(), key, shutdown.clone()));
        services.spawn(consumers::run_distribution(bus.clone(), store.clone(), Default::default(), shutdown.clone()));
        let caches = scratch.join("caches");
        let mut sites = Vec::new();
        for i in 0..args.sites {
            let design = demo_site(i, args.nodes);
            let sim = SimSite::new(design.site.as_str(), &design.nodes, SimConfig::instant());
            let cache = ArtifactCache::new(caches.join(design.site.as_str())).with_max_bytes(args.cache_max_bytes);
            let gateway = site_gateway::run_gateway(
                design.site.clone(),
                bus.clone(),
                Arc::new(sim.clone()),
                cache,
                names::ALIVE_EVERY,
                shutdown.clone(),
            );
            services.spawn(gateway);
            sites.push((design, sim));
        }
        // The orchestrator's consumers, then every gateway's, before anything is asked of them.
        wait_for_consumers(&bus, &[names::COMMANDS_STREAM], 1).await?;
        let designs: Vec<SiteDesign> = sites.iter().map(|(d, _)| d.clone()).collect();
        register_fleet(&bus, &designs, &catalog).await?;
        wait_for_consumers(&bus, &jobs_streams(), args.sites).await?;
        let mut fleet = SoakFleet::new(bus.clone(), sites, store.clone());
        eprintln!("installing {} sites x {} nodes ...", args.sites, args.nodes);
        let installed = fleet.install_all().await?;
        anyhow::ensure!(installed.all_ok(), "the first installs did not all succeed: {installed:?}");

        let start = Instant::now();
        let mut days = Vec::new();
        for n in 1..=args.days {
            let began = Instant::now();
            let ops = fleet.day(n).await?;
            let busy = began.elapsed();
            tokio::time::sleep_until((start + args.day_length * n as u32).into()).await;
            let streams = measure::streams(&bus).await?;
            let day = Day {
                day: n,
                busy_seconds: round(busy.as_secs_f64(), 2),
                ops,
                stream_bytes_total: streams.values().map(|s| s.bytes).sum(),
                streams,
                site_cache_bytes: measure::dir_bytes(&caches),
                process_rss_bytes: measure::rss(None).unwrap_or(0),
                orchestrator_rss_bytes: orchestrator.pid().and_then(|p| measure::rss(Some(p))),
                recovery_ms: round(measure::recovery(&bus).await?.as_secs_f64() * 1000.0, 2),
            };
            eprintln!("{}", day.line());
            println!("{}", serde_json::to_string(&day)?);
            days.push(day);
        }
        Ok::<_, anyhow::Error>(days)
    }
    .await;
    shutdown.cancel();
    while services.join_next().await.is_some() {}
    orchestrator.stop();
    let days = result?;
    Ok(summary(&args, &keeping, raw, payload, days))
}

/// The growth of every measure from the first day every policy is at its steady state (the
/// retention full, the daily design changes at the revisions kept; day 2 at the least) to the
/// last, the verdict, and every day.
fn summary(args: &SoakArgs, keeping: &Keeping, raw: f64, payload: usize, days: Vec<Day>) -> serde_json::Value {
    // Every policy at its steady state: the retention full, and the sites that apply a design
    // every day at the revisions kept.
    let baseline_day = (args.retention_days as usize + 1).max(args.design_revisions as usize).max(2);
    let baseline = days.iter().find(|d| d.day == baseline_day);
    let last = days.last();
    let (growth, flat) = match (baseline, last) {
        (Some(b), Some(l)) if l.day > b.day => {
            let growth = measure::growth(b, l);
            let flat = growth.iter().filter(|g| g.judged()).all(measure::Growth::flat);
            eprintln!("growth from day {} to day {}:", b.day, l.day);
            for g in &growth {
                let percent = g.percent.map_or("from zero".to_string(), |p| format!("{p:+.1} %"));
                let note = if g.judged() { "" } else { "  (the catalog: what operators register, not judged)" };
                eprintln!("  {:<40} {:>14.0} -> {:>14.0}  {percent}{note}", g.measure, g.baseline, g.last);
            }
            (growth, Some(flat))
        }
        _ => {
            eprintln!("too few days to measure growth: it is measured from day {baseline_day} to a later one");
            (Vec::new(), None)
        }
    };
    let verdict = match flat {
        Some(true) => "yes",
        Some(false) => "no",
        None => "unknown",
    };
    let failed_ops: u32 = days
        .iter()
        .map(|d| {
            let t = d.ops.total();
            t.refused + t.failed + t.timed_out
        })
        .sum();
    eprintln!(
        "flat: {verdict} (every measure but the catalog grew under {FLAT_PERCENT} %, or a store under {} KiB, or recovery \
         under {} ms); operations not ended well: {failed_ops}",
        measure::FLAT_BYTES / 1024.0,
        measure::FLAT_MS
    );
    json!({
        "bench": "soak",
        "sites": args.sites,
        "nodes_per_site": args.nodes,
        "days": args.days,
        "day_length_seconds": args.day_length.as_secs_f64(),
        "retention_seconds": keeping.retention.as_secs_f64(),
        "duplicate_window_seconds": keeping.duplicate_window.as_secs_f64(),
        "orchestrator": if args.in_process { "in-process" } else { "child process" },
        "raw_jetstream_msgs_per_second": round(raw, 0),
        "raw_payload_bytes": payload,
        "baseline_day": baseline_day,
        "growth": growth,
        "flat": flat,
        "flat_threshold_percent": FLAT_PERCENT,
        "flat_threshold_bytes": measure::FLAT_BYTES,
        "flat_threshold_ms": measure::FLAT_MS,
        "not_judged": [measure::NOT_HISTORY],
        "operations_not_ended_well": failed_ops,
        "per_day": days,
    })
}
