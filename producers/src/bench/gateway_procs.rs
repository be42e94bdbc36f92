//! Simulated gateways spread over processes of their own (`bench fanout --shape production
//! --gateway-processes P`): one process holds one connection per gateway, and a process may
//! hold only so many (its file limit), so a fleet past that runs its gateways as `landfall bench
//! gateways` children, each serving a share of the sites exactly as the benchmark's own process
//! would.
//!
//! A child is told its sites by an assignment file (a site's index in the demo fleet and the
//! URL its gateway connects to, one per line), prints `connected N` once every gateway is
//! connected, runs until SIGTERM, and then prints `patches N`: the patches its simulated sites
//! were asked for, which the benchmark adds up as it does for its own.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bus_schema::access::HUB_DOMAIN;
use site_gateway::sim::SimSite;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::production::start_gateways;
use super::servers::Process;
use crate::run::demo::demo_site;
use crate::run::embedded::tied;

/// `landfall bench gateways`: what a child is given.
#[derive(Debug, clap::Args)]
pub struct GatewaysArgs {
    /// The directory `deploy nats-config` wrote (each site's key is there).
    #[arg(long)]
    pub config: PathBuf,
    /// One line per site: its index in the demo fleet, a tab, the URL its gateway connects to.
    #[arg(long)]
    pub assign: PathBuf,
    /// Nodes of each simulated site.
    #[arg(long)]
    pub nodes: usize,
    /// How often each gateway says it is there.
    #[arg(long, value_parser = crate::flags::parse_duration)]
    pub alive_every: Duration,
    /// Where the gateways keep their artifact caches (one directory per site).
    #[arg(long)]
    pub caches: PathBuf,
}

/// Runs a child's gateways until `shutdown`.
pub async fn serve(args: GatewaysArgs, shutdown: CancellationToken) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.assign).with_context(|| format!("read {}", args.assign.display()))?;
    let mut designs = Vec::new();
    let mut urls = Vec::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let (index, url) = line.split_once('\t').with_context(|| format!("line {} is not INDEX<TAB>URL", n + 1))?;
        let index: usize = index.parse().with_context(|| format!("line {}: {index:?} is not an index", n + 1))?;
        designs.push(demo_site(index, args.nodes));
        urls.push(url.to_string());
    }
    let stop = CancellationToken::new();
    let mut gateways = JoinSet::new();
    let sims = tokio::select! {
        sims = start_gateways(&args.config, HUB_DOMAIN, &urls, &designs, &args.caches, args.alive_every, &stop, &mut gateways) => sims?,
        _ = shutdown.cancelled() => bail!("stopped before every gateway was connected"),
    };
    println!("connected {}", sims.len());
    shutdown.cancelled().await;
    stop.cancel();
    while gateways.join_next().await.is_some() {}
    println!("patches {}", patch_effects(&sims));
    Ok(())
}

/// The patches the simulated sites were asked for.
pub(super) fn patch_effects(sims: &[SimSite]) -> u64 {
    sims.iter().map(|s| s.effects().patches.values().map(|&n| u64::from(n)).sum::<u64>()).sum()
}

/// The children, each with its log (its standard output and errors).
pub(super) struct GatewayProcesses {
    children: Vec<(Process, PathBuf)>,
}

impl GatewayProcesses {
    /// Splits the demo fleet's first `urls.len()` sites (site `i` connecting to `urls[i]`) over
    /// `count` children and starts them.
    pub(super) fn spawn(
        count: usize,
        config: &Path,
        urls: &[String],
        nodes: usize,
        alive_every: Duration,
        root: &Path,
    ) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("find the landfall executable")?;
        let share = urls.len().div_ceil(count.max(1)).max(1);
        let mut children = Vec::new();
        for (p, chunk) in urls.iter().enumerate().collect::<Vec<_>>().chunks(share).enumerate() {
            let assign = root.join(format!("gateways-{p}.tsv"));
            let lines: String = chunk.iter().map(|(i, url)| format!("{i}\t{url}\n")).collect();
            std::fs::write(&assign, lines)?;
            let mut cmd = tied::command(&exe);
            cmd.args(["bench", "gateways", "--nodes", &nodes.to_string()])
                .arg("--alive-every")
                .arg(format!("{}ms", alive_every.as_millis()))
                .arg("--config")
                .arg(config)
                .arg("--assign")
                .arg(&assign)
                .arg("--caches")
                .arg(root.join("caches"))
                .env_remove("NATS_URL")
                .env("RUST_LOG", "warn");
            let log = root.join(format!("gateways-{p}.log"));
            children.push((Process::spawn(cmd, &log)?, log));
        }
        Ok(Self { children })
    }

    /// Waits until every child says all its gateways are connected.
    pub(super) async fn connected(&mut self, within: Duration) -> anyhow::Result<usize> {
        let t = Instant::now();
        loop {
            let mut total = 0;
            let mut all = true;
            for (process, log) in &mut self.children {
                if let Some(status) = process.exited()? {
                    let text = std::fs::read_to_string(&*log).unwrap_or_default();
                    let tail: Vec<&str> = text.lines().rev().take(5).collect();
                    bail!(
                        "a gateway process exited ({status}): {}",
                        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                    );
                }
                match last_count(log, "connected ") {
                    Some(n) => total += n,
                    None => all = false,
                }
            }
            if all {
                return Ok(total as usize);
            }
            anyhow::ensure!(t.elapsed() < within, "the gateway processes were not connected within {within:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub(super) fn cpu_seconds(&self) -> f64 {
        self.children.iter().map(|(p, _)| p.cpu_seconds()).sum()
    }

    pub(super) fn rss_mib(&self) -> f64 {
        self.children.iter().map(|(p, _)| p.rss_mib()).sum()
    }

    /// Stops every child (SIGTERM) and adds up the patches their sites were asked for.
    pub(super) async fn finish(self) -> anyhow::Result<u64> {
        let mut total = 0;
        for (process, log) in self.children {
            tokio::task::spawn_blocking(move || process.stop_within(Duration::from_secs(120))).await?;
            total += last_count(&log, "patches ").with_context(|| {
                format!("a gateway process did not say what its sites patched; see {}", log.display())
            })?;
        }
        Ok(total)
    }
}

/// The number after the last line of `log` that starts with `prefix`.
fn last_count(log: &Path, prefix: &str) -> Option<u64> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines().rev().find_map(|l| l.strip_prefix(prefix)).and_then(|n| n.trim().parse().ok())
}
