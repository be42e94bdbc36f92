//! `bench fanout --shape production`: the fleet as it is deployed, measured.
//!
//! - The hub is the nats-server `deploy nats-config` writes: every hub service and every site
//!   a user of its own, with its own permissions.
//! - Each hub service (orchestrator, observer, kubeconfig, distribution) is a process of its
//!   own, run as `landfall serve …` with its user's key, so its RSS and CPU are its own.
//! - Every site's gateway has its own connection as its site's user, and the orchestrator's
//!   dispatcher hands it its jobs; with `LANDFALL_JOB_DELIVERY=durable` (inherited by the
//!   services and gateways it starts), each site has a durable consumer of its own instead,
//!   made by the orchestrator when the site is registered. Gateways share the
//!   benchmark's process, or `--gateway-processes` children of it (a process holds only so many
//!   connections); `--leaf-sites` of them reach the hub through leaf nodes of their own, and
//!   with `--relays` every site connects to its relay, which carries it to the hub.
//! - Packages carry bytes, staged from the artifact store at install and patch; the fleet is
//!   registered and installed through the bus (timed as setup), so what each node runs comes
//!   from its install's reports.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use async_nats::jetstream::consumer::DeliverPolicy;
use bus_schema::access::{HUB_DOMAIN, Role};
use bus_schema::domain::SiteDesign;
use bus_schema::pb::{self, BusCommand, BusEvent, BusMessage};
use bus_schema::runtime::{Access, Bus, Envelope, Outgoing};
use consumers::artifacts::{ArtifactStore, S3Options};
use futures::StreamExt;
use serde_json::json;
use site_gateway::ArtifactCache;
use site_gateway::sim::{SimConfig, SimSite};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::gateway_procs::{GatewayProcesses, patch_effects};
use super::hub_costs;
use super::servers::{Hub, Leaves, Relays, Services, cpu_seconds_of};
use super::{
    extend, patch_fleet, raw_publish_rate, register_fleet, representative_payload, rollout_phases, round,
    stored_messages, target_package,
};
use crate::run::demo::{demo_content, demo_packages, demo_site};
use crate::run::embedded::find_nats_server;

/// What a production-shape run is asked for.
pub struct Production {
    pub sites: usize,
    pub nodes: usize,
    /// Sites whose gateway reaches the hub through a leaf node of its own (the first ones).
    pub leaf_sites: usize,
    /// Bytes of each package's artifact.
    pub artifact_bytes: usize,
    pub raw_messages: usize,
    /// Restart the hub after the install, with every gateway connected, and time how the fleet
    /// comes back.
    pub restart_hub: bool,
    /// How long the installed fleet is left idle, its processes' CPU measured meanwhile and the
    /// hub sampled again at its end.
    pub idle: Duration,
    /// How often each gateway says it is there.
    pub alive_every: Duration,
    /// Relays in front of the hub, as `deploy nats-config --relay` writes them (0: none).
    pub relays: usize,
    /// Processes the gateways are spread over (0 or 1: the benchmark's own).
    pub gateway_processes: usize,
}

pub async fn fanout(run: Production, strategy: pb::RolloutStrategy) -> anyhow::Result<serde_json::Value> {
    let scratch = Scratch::new()?;
    measure(&scratch.0, run, strategy).await
}

/// The run's files (configuration, keys, stores, caches, logs): removed when the run ends, or
/// when it is stopped by a signal (after the processes that wrote there are gone).
pub(super) struct Scratch(pub(super) PathBuf);

impl Scratch {
    pub(super) fn new() -> anyhow::Result<Self> {
        let root = std::env::temp_dir().join(format!("landfall-bench-production-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&root).with_context(|| format!("create {}", root.display()))?;
        Ok(Self(root))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn measure(root: &Path, run: Production, strategy: pb::RolloutStrategy) -> anyhow::Result<serde_json::Value> {
    let Production {
        sites,
        nodes,
        leaf_sites,
        artifact_bytes,
        raw_messages,
        restart_hub,
        idle,
        alive_every,
        relays,
        gateway_processes,
    } = run;
    anyhow::ensure!(leaf_sites <= sites, "--leaf-sites ({leaf_sites}) is more than --sites ({sites})");
    let designs: Vec<SiteDesign> = (0..sites).map(|i| demo_site(i, nodes)).collect();
    let binary = find_nats_server().await?;

    let t = Instant::now();
    let mut hub = Hub::start(&binary, root, &designs, relays).await?;
    let relays = Relays::start(&binary, &hub).await?;
    let config_s = t.elapsed().as_secs_f64();
    eprintln!(
        "hub: {} users configured and started in {config_s:.1} s ({} relays)",
        designs.len() + Role::services().len(),
        relays.count()
    );

    let store_dir = root.join("artifacts");
    let store = ArtifactStore::open(&store_dir.display().to_string(), &S3Options::default())?;
    let catalog = upload_catalog(&store, artifact_bytes).await?;
    let services = Services::start(&hub, root, &store_dir)?;
    let bus = hub.operator_when_ready().await?;
    // Before the raw measurement, whose messages the hub holds for a while.
    let hub_empty = hub.sample().await?;
    let payload = representative_payload();
    eprintln!("raw JetStream: {raw_messages} async publishes of {payload} bytes ...");
    let raw = raw_publish_rate(&bus, payload, raw_messages).await?;
    eprintln!("raw JetStream: {raw:.0} msgs/s");

    let mut gateways = Gateways::None;
    let sample_at_start = CpuSample::take(&hub, &services, &relays, &gateways);
    let t = Instant::now();
    let (target, rest) = catalog.split_last().context("the catalog is empty")?;
    register_fleet(&bus, &designs, rest).await?;
    let register_s = t.elapsed().as_secs_f64();
    eprintln!("registered {sites} sites in {register_s:.1} s");

    let shutdown = CancellationToken::new();
    let t = Instant::now();
    let leaves = Leaves::start(&binary, &hub, &designs[..leaf_sites]).await?;
    // Each site's gateway connects to its own leaf node, or its relay, or the hub.
    let urls: Vec<String> = designs
        .iter()
        .enumerate()
        .map(|(i, d)| leaves.url(i).or_else(|| relays.url(d.site.as_str())).unwrap_or(&hub.url).to_string())
        .collect();
    gateways = match gateway_processes {
        0 | 1 => {
            let mut set = JoinSet::new();
            let caches = root.join("caches");
            let sims =
                start_gateways(&hub.config, HUB_DOMAIN, &urls, &designs, &caches, alive_every, &shutdown, &mut set)
                    .await?;
            Gateways::InProcess { sims, set }
        }
        count => {
            let mut children = GatewayProcesses::spawn(count, &hub.config, &urls, nodes, alive_every, root)?;
            let connected = children.connected(Duration::from_secs(1800)).await?;
            anyhow::ensure!(connected == sites, "{connected} of {sites} gateways connected");
            Gateways::Children(children)
        }
    };
    let connect_s = t.elapsed().as_secs_f64();
    eprintln!(
        "{sites} gateways connected in {connect_s:.1} s ({leaf_sites} through leaf nodes, {} through relays, in {} process(es))",
        if relays.count() > 0 { sites - leaf_sites } else { 0 },
        gateway_processes.max(1)
    );

    let t = Instant::now();
    let (installed, install_failed) = install_fleet(&bus, &designs).await?;
    let install_s = t.elapsed().as_secs_f64();
    eprintln!("installed {installed} sites ({install_failed} failed) in {install_s:.1} s");
    anyhow::ensure!(install_failed == 0, "{install_failed} installs failed");
    let sample_after_install = CpuSample::take(&hub, &services, &relays, &gateways);
    let hub_installed = hub.sample().await?;
    let hub_rss_setup = hub.process.rss_mib();
    // Idle: what the fleet costs while nothing happens (each gateway's heartbeat, heard by the
    // observer, is most of it).
    let (idle_cpu, hub_settled) = if idle.is_zero() {
        (serde_json::Value::Null, None)
    } else {
        eprintln!("idle for {idle:?} ...");
        tokio::time::sleep(idle).await;
        let spent = CpuSample::take(&hub, &services, &relays, &gateways).since(&sample_after_install);
        eprintln!("idle: {spent}");
        // The hub once the install's traces have gone: its block caches expire and the
        // runtime hands freed memory back, which the sample right after the install still holds.
        let settled = hub.sample().await?;
        let idle = json!({
            "seconds": idle.as_secs_f64(),
            "alive_every_seconds": alive_every.as_secs_f64(),
            "heartbeats_expected": round(sites as f64 * idle.as_secs_f64() / alive_every.as_secs_f64(), 0),
            "cpu_seconds": spent,
            "cpu_percent_of_one_core": percent_of(&spent, idle),
        });
        (idle, Some(settled))
    };

    let register = pb::RegisterPackage { package: Some(target.clone()), auto_rollout: None };
    let restart = match restart_hub {
        true => restart_under_fleet(&mut hub, &binary, sites, &register).await?,
        false => {
            let env = Envelope::root();
            bus.publish_command(&register, &env).await?;
            wait_for_event(&bus, pb::PackageRegistered::filter(), &env.id).await?;
            serde_json::Value::Null
        }
    };
    // After a restart the hub is a new process: its CPU counts from there.
    let sample_after_setup = CpuSample::take(&hub, &services, &relays, &gateways);

    let patched = patch_fleet(&bus, target, &strategy).await?;
    let sample_after_patch = CpuSample::take(&hub, &services, &relays, &gateways);
    let hub_patched = hub.sample().await?;
    let messages_after = stored_messages(&bus).await?;
    let phases = rollout_phases(&bus, &patched.rollout_id).await?;

    let hub_rss = hub.process.rss_mib();
    let hub_peak = hub.process.peak_mib();
    let service_memory = services.memory();
    let leaf_memory = leaves.rss_mib();
    let relay_memory = relays.memory(sites);
    let gateway_rss_mib = gateways.rss_mib();
    shutdown.cancel();
    let patch_effects = gateways.finish().await?;
    let figures = patched.figures(messages_after, raw, patch_effects);
    services.stop();
    leaves.stop();
    relays.stop();
    drop(hub);

    let cpu_setup = sample_after_install.since(&sample_at_start);
    let cpu_patch = sample_after_patch.since(&sample_after_setup);
    let per_site_kib = |mib: f64| round(mib * 1024.0 / sites as f64, 1);
    let per_site = hub_costs::per_site(hub_empty, hub_installed, sites);
    let per_site_settled = hub_settled.map(|settled| (settled, hub_costs::per_site(hub_empty, settled, sites)));
    let planned = figures["planned_nodes"].as_u64().unwrap_or(0);
    if planned < (sites * nodes) as u64 {
        eprintln!(
            "the rollout planned {planned} of {} nodes: the observer had not recorded the others yet",
            sites * nodes
        );
    }
    let updates = figures["node_updates"].as_f64().unwrap_or(0.0).max(1.0);
    let hub_cpu_us = round(cpu_patch["hub_nats"].as_f64().unwrap_or(0.0) * 1e6 / updates, 1);
    eprintln!(
        "hub per site: {} KiB RSS, {} KiB heap, {} goroutines; per node update: {hub_cpu_us} µs of hub CPU; \
         {} node updates/s against {raw:.0} raw JetStream msgs/s",
        per_site["rss_kib"], per_site["heap_kib"], per_site["goroutines"], figures["node_updates_per_second"]
    );
    if let Some((_, settled)) = &per_site_settled {
        eprintln!("hub per site after {idle:?} idle: {} KiB RSS, {} KiB heap", settled["rss_kib"], settled["heap_kib"]);
    }
    let mut report = json!({
        "bench": "fanout",
        "shape": "production",
        "sites": sites,
        "nodes_per_site": nodes,
        "leaf_sites": leaf_sites,
        "artifact_bytes": artifact_bytes,
        "strategy": {
            "canary_sites": strategy.canary_sites,
            "max_concurrent_sites": strategy.max_concurrent_sites,
            "max_unavailable": strategy.max_unavailable,
        },
        // How the jobs reach the sites (`LANDFALL_JOB_DELIVERY`, which the services and
        // gateways it starts inherit): a durable per site, or the dispatcher's per shard.
        "job_delivery": format!("{:?}", bus.job_delivery()).to_lowercase(),
        "job_consumers": match bus.job_delivery() {
            bus_schema::runtime::JobDelivery::Durable => sites,
            bus_schema::runtime::JobDelivery::Dispatch => bus_schema::names::JOB_SHARDS,
        },
        "setup_seconds": {
            "hub_config_and_start": round(config_s, 2),
            "register": round(register_s, 2),
            "gateways_connect": round(connect_s, 2),
            "install": round(install_s, 2),
            "total": round(register_s + connect_s + install_s, 2),
        },
        "raw_payload_bytes": payload,
        "phases_seconds": phases,
        "hub_nats": {
            "rss_mib_after_setup": round(hub_rss_setup, 1),
            "rss_mib_after_patch": round(hub_rss, 1),
            "peak_rss_mib": round(hub_peak, 1),
            "rss_kib_per_site": per_site_kib(hub_rss),
            "cpu_seconds_setup": cpu_setup["hub_nats"],
            "cpu_seconds_patch": cpu_patch["hub_nats"],
        },
        // The hub by its own monitoring: empty (services connected), installed, settled after
        // the idle period, patched; its growth per site from empty to installed and to settled,
        // and its CPU per node update of the patch.
        "hub_costs": {
            "empty": hub_empty.to_json(),
            "installed": hub_installed.to_json(),
            "patched": hub_patched.to_json(),
            "per_site": per_site,
            "settled": per_site_settled.as_ref().map(|(sample, _)| sample.to_json()),
            "per_site_settled": per_site_settled.map(|(_, per_site)| per_site),
            "per_node_update": { "hub_cpu_us": hub_cpu_us },
        },
        "services_rss_mib": service_memory,
        // Where the machine's CPU went: register, connect and install; then the patch.
        "cpu_seconds": { "setup": cpu_setup, "patch": cpu_patch },
        "leaf_nodes": leaf_memory,
        // Relays in front of the hub: what they hold of the sites' connections.
        "relays": relay_memory,
        "gateway_processes": gateway_processes.max(1),
        "gateways_rss_mib": round(gateway_rss_mib, 1),
        "hub_restart": restart,
        "idle": idle_cpu,
    });
    extend(&mut report, figures);
    Ok(report)
}

/// CPU seconds of every process of the run at one moment: the hub, each service, and this
/// process (the gateways and their simulated sites, with the benchmark's own driving).
struct CpuSample(Vec<(&'static str, f64)>);

impl CpuSample {
    fn take(hub: &Hub, services: &Services, relays: &Relays, gateways: &Gateways) -> Self {
        let mut each = vec![("hub_nats", hub.cpu_seconds())];
        each.extend(services.processes.iter().map(|(name, p)| (*name, p.cpu_seconds())));
        each.push(("relays", relays.cpu_seconds()));
        each.push(("gateways_and_bench", cpu_seconds_of("self")));
        each.push(("gateway_processes", gateways.cpu_seconds()));
        Self(each)
    }

    /// What each process spent since `before`, and the sum.
    fn since(&self, before: &Self) -> serde_json::Value {
        let mut out = serde_json::Map::new();
        let mut total = 0.0;
        for ((name, now), (_, then)) in self.0.iter().zip(&before.0) {
            total += now - then;
            out.insert(name.to_string(), json!(round(now - then, 2)));
        }
        out.insert("total".into(), json!(round(total, 2)));
        out.into()
    }
}

/// CPU seconds spent over `over`, as a percentage of one core, per process.
fn percent_of(spent: &serde_json::Value, over: Duration) -> serde_json::Value {
    let Some(each) = spent.as_object() else { return serde_json::Value::Null };
    let percent = |s: &serde_json::Value| json!(round(100.0 * s.as_f64().unwrap_or(0.0) / over.as_secs_f64(), 2));
    each.iter().map(|(name, s)| (name.clone(), percent(s))).collect::<serde_json::Map<_, _>>().into()
}

/// Restarts the hub under the whole fleet (every gateway and service connected), publishes
/// `command` on a fresh connection as soon as the hub listens again, and times: the hub's
/// downtime, the command's answer, and the fleet's return (every connection back).
async fn restart_under_fleet(
    hub: &mut Hub,
    binary: &Path,
    sites: usize,
    command: &pb::RegisterPackage,
) -> anyhow::Result<serde_json::Value> {
    let connected = hub.connections().await?;
    eprintln!("restarting the hub under {connected} connections ...");
    let t = Instant::now();
    hub.restart(binary).await?;
    let down_s = t.elapsed().as_secs_f64();
    let listening = Instant::now();
    let fresh = Bus::connect_with(&hub.url, "landfall-bench-restart", &hub.access(&Role::Operator)?).await?;
    let env = Envelope::root();
    let mut answered = fresh.read_events(vec![pb::PackageRegistered::filter()], DeliverPolicy::New).await?;
    let published = Instant::now();
    fresh.publish_command(command, &env).await?;
    let answer = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(e) = answered.next().await {
            if e?.delivery.envelope.correlation == env.id {
                return anyhow::Ok(published.elapsed());
            }
        }
        bail!("the event stream ended")
    })
    .await
    .context("the command published after the restart had no answer within 120 s")??;
    eprintln!(
        "a command published {:.1} s after the hub was back was answered in {:.2} s",
        published.duration_since(listening).as_secs_f64(),
        answer.as_secs_f64()
    );
    let mut timeline = Vec::new();
    let all_back = loop {
        let now = hub.connections().await.unwrap_or(0);
        timeline.push((listening.elapsed().as_secs_f64(), now));
        if now >= connected {
            break listening.elapsed();
        }
        anyhow::ensure!(
            listening.elapsed() < Duration::from_secs(600),
            "only {now} of {connected} connections back after 600 s"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let at = |share: f64| {
        let want = (connected as f64 * share).ceil() as usize;
        timeline.iter().find(|(_, n)| *n >= want).map_or(-1.0, |(t, _)| round(*t, 2))
    };
    eprintln!("{sites} gateways back in {:.1} s", all_back.as_secs_f64());
    Ok(json!({
        "connections": connected,
        "hub_down_seconds": round(down_s, 2),
        "command_published_after_seconds": round(published.duration_since(listening).as_secs_f64(), 2),
        "command_answered_seconds": round(answer.as_secs_f64(), 3),
        "half_back_seconds": at(0.5),
        "ninety_percent_back_seconds": at(0.9),
        "all_back_seconds": round(all_back.as_secs_f64(), 2),
        // The restarted hub is a new process: its CPU from its start.
        "hub_cpu_seconds_from_restart": round(hub.cpu_seconds(), 2),
    }))
}

/// Stand-in bytes for every demo package and for the patch's target (the last entry), each
/// `bytes` long, uploaded into `store`: their catalog entries.
pub(super) async fn upload_catalog(store: &ArtifactStore, bytes: usize) -> anyhow::Result<Vec<pb::Package>> {
    let mut out = Vec::new();
    for mut p in demo_packages().into_iter().chain([target_package()]) {
        let stored = store.upload(demo_content(&p.name, &p.version, bytes).as_slice()).await?;
        (p.sha256, p.size, p.object_key) = (stored.sha256, stored.size, stored.object_key);
        out.push(p);
    }
    Ok(out)
}

async fn wait_for_event(bus: &Bus, filter: String, correlation: &str) -> anyhow::Result<()> {
    let mut events = bus.read_events(vec![filter], DeliverPolicy::All).await?;
    tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(e) = events.next().await {
            if e?.delivery.envelope.correlation == correlation {
                return Ok(());
            }
        }
        bail!("the event stream ended")
    })
    .await
    .context("no answer within 120 s")?
}

/// Publishes InstallSite for every site (pipelined) and waits until each has ended: how many
/// were installed and how many failed.
async fn install_fleet(bus: &Bus, designs: &[SiteDesign]) -> anyhow::Result<(usize, usize)> {
    let mut events =
        bus.read_events(vec![pb::SiteInstalled::filter(), pb::SiteInstallFailed::filter()], DeliverPolicy::New).await?;
    let out: Vec<Outgoing> = designs
        .iter()
        .map(|d| {
            let cmd = pb::InstallSite { site_id: d.site.to_string(), design_revision: 0 };
            Outgoing::new(BusCommand::subject(&cmd), &cmd, Envelope::root())
        })
        .collect();
    for chunk in out.chunks(2048) {
        bus.publish_all(chunk.to_vec()).await?;
    }
    let (mut installed, mut failed) = (0, 0);
    let mut last_progress = Instant::now();
    // Every site's install runs at once, so the first ends later the more there are (at 30,000
    // sites, past five minutes): the installs are moving while the hub stores messages.
    let started = Instant::now();
    let (mut stored, mut stored_changed) = (0, Instant::now());
    while installed + failed < designs.len() {
        let Ok(e) = tokio::time::timeout(Duration::from_secs(30), events.next()).await else {
            let now = stored_messages(bus).await?;
            if now != stored {
                (stored, stored_changed) = (now, Instant::now());
            }
            anyhow::ensure!(
                stored_changed.elapsed() < Duration::from_secs(300),
                "nothing was stored for 300 s ({installed} installed, {failed} failed)"
            );
            eprintln!("  {installed} installed after {:.0} s ...", started.elapsed().as_secs_f64());
            continue;
        };
        let e = e.context("event stream ended")??;
        if installed + failed == 0 {
            eprintln!("  the first install ended after {:.1} s", started.elapsed().as_secs_f64());
        }
        match e.delivery.type_name.as_str() {
            t if t == pb::SiteInstalled::TYPE => installed += 1,
            _ => failed += 1,
        }
        if last_progress.elapsed() > Duration::from_secs(10) {
            eprintln!("  {installed} installed, {failed} failed ...");
            last_progress = Instant::now();
        }
    }
    Ok((installed, failed))
}

/// Starts every site's gateway over a simulated site with instant backends, each on a
/// connection of its own to `urls[i]` as its site's user (its key in `config`, where `deploy
/// nats-config` wrote it), a few dozen connecting at a time.
#[allow(clippy::too_many_arguments)]
pub(super) async fn start_gateways(
    config: &Path,
    domain: &str,
    urls: &[String],
    designs: &[SiteDesign],
    caches: &Path,
    alive_every: Duration,
    shutdown: &CancellationToken,
    gateways: &mut JoinSet<anyhow::Result<()>>,
) -> anyhow::Result<Vec<SimSite>> {
    const AT_ONCE: usize = 64;
    let connects = designs.iter().zip(urls).map(|(d, url)| {
        let url = url.clone();
        let access = site_access(config, domain, d.site.as_str());
        async move {
            let access = access?;
            let bus = Bus::connect_with(&url, &format!("landfall-gateway-{}", d.site), &access).await?;
            anyhow::Ok((d, bus))
        }
    });
    let mut connected = futures::stream::iter(connects).buffer_unordered(AT_ONCE);
    let mut sims = Vec::with_capacity(designs.len());
    while let Some(c) = connected.next().await {
        let (d, bus) = c?;
        let sim = SimSite::new(d.site.as_str(), &d.nodes, SimConfig::instant());
        let cache = ArtifactCache::new(caches.join(d.site.as_str()));
        let backend = Arc::new(sim.clone());
        gateways.spawn(site_gateway::run_gateway(d.site.clone(), bus, backend, cache, alive_every, shutdown.clone()));
        sims.push(sim);
    }
    Ok(sims)
}

/// The read buffer of each simulated gateway's connection.
const GATEWAY_READ_BUFFER: u16 = 8 * 1024;

/// How site `site`'s gateway connects (its key in `config`, where `deploy nats-config` wrote
/// it): through the hub's JetStream domain `domain` (at its leaf node, its relay, or the hub),
/// its replies on its site's inbox.
fn site_access(config: &Path, domain: &str, site: &str) -> anyhow::Result<Access> {
    let seed = Access::seed_from_file(&config.join(format!("sites/{site}/gateway.nk"))).map_err(anyhow::Error::msg)?;
    Ok(Access {
        nkey_seed: Some(seed),
        site: Some(site.to_string()),
        js_domain: Some(domain.to_string()),
        // Thousands of gateways share this process: a 64 KiB read buffer each would be most of
        // its memory (a deployed gateway, alone in its process, keeps the client's default).
        read_buffer: Some(GATEWAY_READ_BUFFER),
        ..Access::default()
    })
}

/// The gateways: none yet, in the benchmark's process, or in children of it.
enum Gateways {
    None,
    InProcess { sims: Vec<SimSite>, set: JoinSet<anyhow::Result<()>> },
    Children(GatewayProcesses),
}

impl Gateways {
    fn cpu_seconds(&self) -> f64 {
        match self {
            Gateways::Children(c) => c.cpu_seconds(),
            _ => 0.0,
        }
    }

    /// The children's RSS (in the benchmark's process, the gateways' is not told apart).
    fn rss_mib(&self) -> f64 {
        match self {
            Gateways::Children(c) => c.rss_mib(),
            _ => 0.0,
        }
    }

    /// Stops them (`shutdown` has been cancelled for those in this process) and adds up the
    /// patches their simulated sites were asked for.
    async fn finish(self) -> anyhow::Result<u64> {
        match self {
            Gateways::None => Ok(0),
            Gateways::InProcess { sims, mut set } => {
                while set.join_next().await.is_some() {}
                Ok(patch_effects(&sims))
            }
            Gateways::Children(c) => c.finish().await,
        }
    }
}
