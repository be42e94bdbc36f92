//! `landfall bench`: measurements on a real nats-server, with ratios to raw JetStream measured
//! in the same run (these machines are shared and noisy; only same-run ratios mean much).
//!
//! - `fanout`: one PatchPackage over S simulated sites of N nodes (instant backends), timed
//!   from the publish to `RolloutCompleted`. Setup (sites, gateways, an installed fleet) is
//!   not timed.
//! - `install`: one site installed with realistic durations scaled down, against the slowest
//!   node's chain of steps.
//! - `transfer`: an artifact through the artifact store and over the bus ([`transfer`]).
//! - `soak`: simulated days of a fleet's operations, and whether storage, memory and recovery
//!   stay flat over them ([`soak`]).

pub mod api;
mod gateway_procs;
mod hub_costs;
mod layout;
mod patch_run;
mod production;
mod regions;
mod servers;
mod site_auth;
mod slopes;
pub mod soak;
pub mod transfer;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use async_nats::jetstream::{consumer::DeliverPolicy, stream};
use bus_schema::domain::{Package, SiteDesign};
use bus_schema::names::{self, keys};
use bus_schema::pb::{self, BusEvent, BusMessage};
use bus_schema::runtime::{Bus, Envelope, Topology};
use clap::Subcommand;
use futures::StreamExt;
use serde_json::json;
use site_gateway::sim::{SimConfig, SimSite};
use site_gateway::{ArtifactCache, HostScope};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::run::demo::{demo_packages, demo_site};
use crate::run::embedded::{NatsChild, find_nats_server};
use patch_run::{patch_fleet, rollout_phases};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FanoutShape {
    Production,
    Shared,
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// One PatchPackage over S simulated sites of N nodes each (instant backends): wall time
    /// from the publish to RolloutCompleted, node updates per second, bus messages per node
    /// update, and node updates per second against raw JetStream messages per second measured
    /// in the same run; in the production shape, the hub's memory per site and CPU per update.
    Fanout {
        #[arg(long, default_value_t = 1000)]
        sites: usize,
        #[arg(long, default_value_t = 10)]
        nodes: usize,
        /// Canary sites done first.
        #[arg(long, default_value_t = 0)]
        canary: u32,
        /// Sites per wave (0: all at once).
        #[arg(long, default_value_t = 0)]
        max_concurrent_sites: u32,
        /// Nodes of a site patched at once: N or P%.
        #[arg(long, default_value = "1")]
        max_unavailable: String,
        /// Orchestrator replicas sharing the work.
        #[arg(long, default_value_t = 1)]
        orchestrators: usize,
        /// Messages published for the raw JetStream measurement.
        #[arg(long, default_value_t = 100_000)]
        raw_messages: usize,
        /// `production`: the fleet as deployed (the hub as `deploy nats-config` writes it,
        /// each service a process of its own, every site's gateway its own connection and user,
        /// its jobs handed out as `LANDFALL_JOB_DELIVERY` says, packages with bytes, the fleet
        /// installed through the bus). `shared`: gateway hosts serving many sites on one
        /// consumer each (a durable per shard, whatever `LANDFALL_JOB_DELIVERY` says), the
        /// fleet's installed state written straight into the store.
        #[arg(long, value_enum, default_value_t = FanoutShape::Production)]
        shape: FanoutShape,
        /// Shared shape: gateway processes, each serving a share of the sites on one durable
        /// consumer (one host takes every job subject; several filter by their sites); 0 runs
        /// one gateway, and one durable consumer, per site.
        #[arg(long, default_value_t = 1)]
        gateway_hosts: usize,
        /// Production shape: sites whose gateway reaches the hub through a leaf node of its own.
        #[arg(long, default_value_t = 0)]
        leaf_sites: usize,
        /// Production shape: bytes of each package's artifact, staged at install and patch.
        #[arg(long, default_value_t = 4096)]
        artifact_bytes: usize,
        /// Production shape: restart the hub once the fleet is installed, with every gateway
        /// connected, and time the fleet's return and a command's answer meanwhile.
        #[arg(long)]
        restart_hub: bool,
        /// Production shape: once the fleet is installed, leave it idle this long (every
        /// gateway connected and saying it is there every 15 s), measure what each process
        /// spends meanwhile, and sample the hub again at its end (settled). E.g. 30s; 0s leaves
        /// it out.
        #[arg(long, default_value = "30s", value_parser = crate::flags::parse_duration)]
        idle: std::time::Duration,
        /// Production shape: how often each gateway says it is there (as `--alive-every`).
        #[arg(long, default_value = "15s", value_parser = crate::flags::parse_duration)]
        alive_every: std::time::Duration,
        /// Production shape: relays in front of the hub (`deploy nats-config --relay`), every
        /// site's gateway connecting to its relay; 0 connects them to the hub.
        #[arg(long, default_value_t = 0)]
        relays: usize,
        /// Production shape: processes the gateways are spread over (a process holds one
        /// connection per gateway, and only as many as its file limit); 1 runs them in the
        /// benchmark's own.
        #[arg(long, default_value_t = 1)]
        gateway_processes: usize,
    },
    /// A share of a production-shape run's gateways, in a process of its own (started by
    /// `fanout --gateway-processes`).
    #[command(hide = true)]
    Gateways(gateway_procs::GatewaysArgs),
    /// An artifact of --size bytes uploaded to the artifact store, read back raw from it, and
    /// staged into a site gateway's cache over the bus: MB/s of each, and peak RSS.
    Transfer {
        #[arg(long, default_value = "1GiB", value_parser = crate::bench::transfer::parse_size)]
        size: u64,
        #[command(flatten)]
        store: crate::flags::StoreArgs,
    },
    /// One site of N nodes installed with realistic durations divided by F, against the
    /// slowest node's chain (staging, OS, binaries, kubeconfig, container packages).
    Install {
        #[arg(long, default_value_t = 10)]
        nodes: usize,
        #[arg(long, default_value_t = 60.0)]
        time_scale: f64,
    },
    /// What each way of bringing jobs to sites costs the hub per site, nothing else running: a
    /// durable pull consumer per site on one stream (as deployed), a durable push consumer per
    /// site, or a stream per site. Hub RSS and CPU with every site waiting idle, and the time to
    /// deliver one job to every site.
    JobLayout {
        #[arg(long, default_value_t = 1000)]
        sites: usize,
        #[arg(long, value_enum, default_value_t = layout::Layout::Pull)]
        layout: layout::Layout,
        /// How long every site waits idle while the hub's CPU is measured.
        #[arg(long, default_value = "30s", value_parser = crate::flags::parse_duration)]
        idle: Duration,
    },
    /// What letting sites in costs the hub, static users in its configuration against the
    /// identity service's auth callout (link credentials), in one run: time to connect every
    /// site, hub RSS per connected site, and how long a revocation takes to close a site's
    /// connection.
    SiteAuth {
        #[arg(long, default_value_t = 1000)]
        sites: usize,
    },
    /// The fleet in regions below a core (`deploy core-config`, `deploy nats-config --region`,
    /// `deploy region-link`): a core and a hub per region, each region with its own services
    /// and its sites' gateways; every command published at the core, every answer read there
    /// from the regions' mirrored events. Setup and patch times, each regional hub's memory per
    /// site and CPU per node update, the core's memory and CPU, and what crossed between regions
    /// (nothing).
    Regions {
        #[arg(long, default_value_t = 3)]
        regions: usize,
        /// Sites in each region.
        #[arg(long, default_value_t = 300)]
        sites: usize,
        #[arg(long, default_value_t = 10)]
        nodes: usize,
        /// Bytes of each package's artifact, staged at install and patch.
        #[arg(long, default_value_t = 4096)]
        artifact_bytes: usize,
        /// Messages published for the raw JetStream measurement (at the first region's hub).
        #[arg(long, default_value_t = 100_000)]
        raw_messages: usize,
    },
    /// Simulated days of a fleet's operations (hosts arriving and leaving, design changes, a
    /// rollout, re-installs), each --day-length of wall time with keeping times scaled to it:
    /// every stream's and bucket's bytes, the sites' caches, RSS and a fresh orchestrator's
    /// recovery time at the end of each day, and their growth over the run.
    Soak(soak::SoakArgs),
    /// The HTTP API over S registered and installed sites of N nodes: `landfall serve api` as
    /// its own process, its memory and catch-up time, the latency of the dashboard's requests,
    /// and the dashboard's first paint in headless Chromium.
    Api {
        #[arg(long, default_value_t = 10_000)]
        sites: usize,
        #[arg(long, default_value_t = 10)]
        nodes: usize,
    },
    /// The hub's costs across `fanout --shape production` runs of different sizes (each run's
    /// JSON in a file): per site and per node update at each size, the slopes between sizes,
    /// the targets checked at the largest, and with --svg the slopes drawn.
    Slopes {
        /// The runs' JSON reports.
        #[arg(required = true)]
        runs: Vec<std::path::PathBuf>,
        /// Draw hub memory per site and hub CPU per node update against the fleet's size here.
        #[arg(long)]
        svg: Option<std::path::PathBuf>,
    },
}

pub async fn run(cmd: BenchCommand, nats_url: Option<String>) -> anyhow::Result<ExitCode> {
    let shutdown = crate::run::service::shutdown_on_signal();
    // A child of a production-shape run: its gateways run until it is told to stop.
    if let BenchCommand::Gateways(args) = cmd {
        gateway_procs::serve(args, shutdown).await?;
        return Ok(ExitCode::SUCCESS);
    }
    // The production shape runs a hub of its own, configured as deployed.
    let own_hub = matches!(
        cmd,
        BenchCommand::Fanout { shape: FanoutShape::Production, .. }
            | BenchCommand::JobLayout { .. }
            | BenchCommand::SiteAuth { .. }
            | BenchCommand::Regions { .. }
    );
    // Slopes reads earlier runs' reports: no server.
    let no_server = own_hub || matches!(cmd, BenchCommand::Slopes { .. });
    anyhow::ensure!(
        !(own_hub && nats_url.is_some()),
        "the production shape starts a hub of its own, configured for its sites: unset NATS_URL, or use --shape shared"
    );
    let server = if no_server { Server { url: String::new(), child: None } } else { Server::start(nats_url).await? };
    let url = server.url.clone();
    let work = async move {
        match cmd {
            BenchCommand::Fanout {
                sites,
                nodes,
                canary,
                max_concurrent_sites,
                max_unavailable,
                orchestrators,
                raw_messages,
                shape,
                gateway_hosts,
                leaf_sites,
                artifact_bytes,
                restart_hub,
                idle,
                alive_every,
                relays,
                gateway_processes,
            } => {
                anyhow::ensure!(sites >= 1 && nodes >= 1, "--sites and --nodes must be at least 1");
                let strategy = pb::RolloutStrategy {
                    canary_sites: canary,
                    max_concurrent_sites,
                    max_unavailable,
                    failure_threshold: "0".into(),
                    ..Default::default()
                };
                if shape == FanoutShape::Production {
                    let run = production::Production {
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
                    };
                    return production::fanout(run, strategy).await;
                }
                let shape = Shape { orchestrators: orchestrators.max(1), gateway_hosts, raw_messages };
                fanout(&url, sites, nodes, strategy, shape).await
            }
            BenchCommand::Transfer { size, store } => crate::bench::transfer::transfer(&url, size, &store).await,
            BenchCommand::Install { nodes, time_scale } => {
                anyhow::ensure!(nodes >= 1 && time_scale > 0.0, "--nodes must be at least 1 and --time-scale positive");
                install(&url, nodes, time_scale).await
            }
            BenchCommand::Soak(args) => soak::soak(&url, args).await,
            BenchCommand::JobLayout { sites, layout, idle } => layout::job_layout(sites, layout, idle).await,
            BenchCommand::SiteAuth { sites } => site_auth::site_auth(sites).await,
            BenchCommand::Regions { regions, sites, nodes, artifact_bytes, raw_messages } => {
                regions::regions(regions::RegionsRun { regions, sites, nodes, artifact_bytes, raw_messages }).await
            }
            BenchCommand::Gateways(_) => unreachable!("a gateway process runs above"),
            BenchCommand::Slopes { runs, svg } => slopes::slopes(&runs, svg.as_deref()).await,
            BenchCommand::Api { sites, nodes } => {
                anyhow::ensure!(sites >= 1 && nodes >= 1, "--sites and --nodes must be at least 1");
                api::api(&url, sites, nodes).await
            }
        }
    };
    // Ctrl-C or SIGTERM: the server is stopped and its temporary store removed all the same.
    let result = tokio::select! {
        result = work => result,
        _ = shutdown.cancelled() => Err(anyhow::anyhow!("stopped by a signal before the benchmark finished")),
    };
    server.stop().await;
    let report = result?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(ExitCode::SUCCESS)
}

/// Where a benchmark's gateways keep their artifact caches (the benchmarks' packages are
/// registered by metadata alone, so nothing is written there).
fn scratch_dir() -> PathBuf {
    std::env::temp_dir().join(format!("landfall-bench-caches-{}", std::process::id()))
}

/// The server a benchmark runs on: the one NATS_URL names, or a fresh one with its own store.
struct Server {
    url: String,
    child: Option<(NatsChild, PathBuf)>,
}

impl Server {
    async fn start(nats_url: Option<String>) -> anyhow::Result<Self> {
        if let Some(url) = nats_url {
            return Ok(Self { url, child: None });
        }
        let binary = find_nats_server().await?;
        let dir = std::env::temp_dir().join(format!("landfall-bench-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        let port = std::net::TcpListener::bind(("127.0.0.1", 0))?.local_addr()?.port();
        let child = NatsChild::start(&binary, port, &dir.join("store"), &dir.join("nats-server.log")).await?;
        Ok(Self { url: child.url.clone(), child: Some((child, dir)) })
    }

    async fn stop(self) {
        let _ = std::fs::remove_dir_all(scratch_dir());
        if let Some((child, dir)) = self.child {
            child.stop().await;
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Raw JetStream: `count` async publishes of `payload` bytes with landfall's headers to a file
/// stream, a window of acks in flight. Messages per second.
pub(super) async fn raw_publish_rate(bus: &Bus, payload: usize, count: usize) -> anyhow::Result<f64> {
    let js = bus.jetstream();
    let _ = js.delete_stream(names::BENCH_STREAM).await;
    js.create_stream(stream::Config {
        name: names::BENCH_STREAM.to_string(),
        subjects: vec![names::BENCH_SUBJECT.to_string()],
        storage: stream::StorageType::File,
        duplicate_window: names::DEDUP_WINDOW,
        ..Default::default()
    })
    .await
    .context("create the raw benchmark stream")?;
    let body = bytes::Bytes::from(vec![b'x'; payload]);
    const WINDOW: usize = 1024;
    let start = Instant::now();
    let mut acks = futures::stream::FuturesUnordered::new();
    for _ in 0..count {
        let env = Envelope::root();
        let ack =
            js.publish_with_headers(names::BENCH_SUBJECT, env.headers(pb::NodePatched::TYPE), body.clone()).await?;
        acks.push(std::future::IntoFuture::into_future(ack));
        while acks.len() >= WINDOW {
            acks.next().await.context("ack")??;
        }
    }
    while let Some(ack) = acks.next().await {
        ack?;
    }
    let rate = count as f64 / start.elapsed().as_secs_f64();
    js.delete_stream(names::BENCH_STREAM).await.context("delete the raw benchmark stream")?;
    Ok(rate)
}

/// Messages stored so far in every stream (KV buckets included): the sum of last sequences.
pub(super) async fn stored_messages(bus: &Bus) -> anyhow::Result<u64> {
    let mut names = bus.jetstream().stream_names();
    let mut total = 0;
    while let Some(name) = names.next().await {
        let name = name?;
        if name == names::BENCH_STREAM {
            continue;
        }
        let mut s = bus.jetstream().get_stream(&name).await?;
        total += s.info().await?.state.last_sequence;
    }
    Ok(total)
}

/// A representative landfall message: a NodePatched as a gateway sends it, with the steps of a
/// node back in service within moments.
pub(super) fn representative_payload() -> usize {
    let evt = pb::NodePatched {
        site_id: "edge-0001".into(),
        node: "node-10".into(),
        rollout_id: uuid::Uuid::now_v7().to_string(),
        package: Some(pb::PackageRef { name: "kubelet".into(), version: "1.30.0".into() }),
        from_version: "1.29.2".into(),
        unchanged: false,
        steps: Some(pb::NodeSteps { cordoned: true, drained: true, evicted: Vec::new(), uncordoned: true }),
    };
    prost::Message::encoded_len(&evt)
}

pub(super) fn target_package() -> pb::Package {
    let mut p = demo_packages().into_iter().find(|p| p.name == "kubelet").expect("kubelet is a demo package");
    p.version = "1.30.0".into();
    p.sha256 = "ab".repeat(32);
    p
}

/// Registers the catalog and the sites, commands pipelined, and waits until the orchestrator
/// applied every one of them.
pub(super) async fn register_fleet(bus: &Bus, designs: &[SiteDesign], catalog: &[pb::Package]) -> anyhow::Result<()> {
    // The catalog first (fleet scope: in order), then the sites.
    let mut events = bus
        .read_events(vec![pb::PackageRegistered::filter(), pb::SiteRegistered::filter()], DeliverPolicy::New)
        .await?;
    let mut out = Vec::new();
    for p in catalog {
        let cmd = pb::RegisterPackage { package: Some(p.clone()), auto_rollout: None };
        out.push(bus_schema::runtime::Outgoing::new(pb::BusCommand::subject(&cmd), &cmd, Envelope::root()));
    }
    for d in designs {
        let cmd = pb::RegisterSite { design: Some(pb::SiteDesign::from(d)), expected: None };
        out.push(bus_schema::runtime::Outgoing::new(pb::BusCommand::subject(&cmd), &cmd, Envelope::root()));
    }
    let expected = out.len();
    for chunk in out.chunks(2048) {
        bus.publish_all(chunk.to_vec()).await?;
    }
    for _ in 0..expected {
        tokio::time::timeout(Duration::from_secs(120), events.next())
            .await
            .context("the orchestrator did not register the fleet within 120 s")?
            .context("event stream ended")??;
    }
    Ok(())
}

/// Writes what an install would have reported: every node runs its role's packages.
async fn seed_observed(bus: &Bus, designs: &[SiteDesign], catalog: &[pb::Package]) -> anyhow::Result<()> {
    let observed = bus.kv(names::OBSERVED_BUCKET).await?;
    let now = time::OffsetDateTime::now_utc().unix_timestamp() * 1000;
    let writes = designs.iter().flat_map(|d| {
        d.nodes.iter().flat_map(move |n| {
            d.packages_for(n.role).iter().map(move |p| {
                let kind = catalog.iter().find(|c| c.name == p.name.as_str() && c.version == p.version.as_str());
                pb::ObservedVersion {
                    site_id: d.site.to_string(),
                    node: n.name.to_string(),
                    name: p.name.to_string(),
                    version: p.version.to_string(),
                    kind: kind.map_or(0, |c| c.kind),
                    updated_unix_ms: now,
                    event_id: String::new(),
                    // Before any event: the first report of the node is written over it.
                    event_seq: 0,
                }
            })
        })
    });
    let results: Vec<_> = futures::stream::iter(writes)
        .map(|v| {
            let observed = observed.clone();
            async move { observed.put(&keys::observed(&v.site_id, &v.node, &v.name), &v).await }
        })
        .buffer_unordered(512)
        .collect()
        .await;
    for r in results {
        r?;
    }
    Ok(())
}

/// Deletes the durable consumer the orchestrator made for each site at registration: in the
/// shared shape gateway hosts take the sites' jobs, and a work-queue stream lets no two
/// consumers' filters overlap.
async fn drop_site_durables(bus: &Bus, designs: &[SiteDesign]) -> anyhow::Result<()> {
    let deleted: Vec<_> = futures::stream::iter(designs)
        .map(|d| async move {
            let jobs = bus.jetstream().get_stream_no_info(names::site_jobs_stream(d.site.as_str())).await?;
            jobs.delete_consumer(&names::gateway_consumer(d.site.as_str())).await.map_err(anyhow::Error::from)
        })
        .buffer_unordered(64)
        .collect()
        .await;
    for d in deleted {
        d.context("delete a site's durable consumer")?;
    }
    Ok(())
}

async fn wait_for_consumers(bus: &Bus, streams: &[&str], count: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let mut have = 0;
        for stream in streams {
            have += bus.jetstream().get_stream(stream).await?.cached_info().state.consumer_count;
        }
        if have >= count {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "only {have} of {count} consumers on {streams:?} after 600 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Every shard of the jobs, for [`wait_for_consumers`].
fn jobs_streams() -> Vec<&'static str> {
    names::jobs_streams().collect()
}

/// How the services of a fanout run are laid out.
struct Shape {
    orchestrators: usize,
    gateway_hosts: usize,
    raw_messages: usize,
}

async fn fanout(
    url: &str,
    sites: usize,
    nodes: usize,
    strategy: pb::RolloutStrategy,
    shape: Shape,
) -> anyhow::Result<serde_json::Value> {
    let Shape { orchestrators, gateway_hosts, raw_messages } = shape;
    // The shared shape takes jobs through durables of its own (a host's per shard, or a site's),
    // which the dispatcher would delete.
    let connect = async |name: &str| {
        Bus::connect(url, name).await.map(|b| b.with_job_delivery(bus_schema::runtime::JobDelivery::Durable))
    };
    let bus = connect("landfall-bench").await?;
    bus.ensure_topology(&Topology::default()).await?;
    let payload = representative_payload();
    eprintln!("raw JetStream: {raw_messages} async publishes of {payload} bytes ...");
    let raw = raw_publish_rate(&bus, payload, raw_messages).await?;
    eprintln!("raw JetStream: {raw:.0} msgs/s");

    let mut catalog = demo_packages();
    catalog.push(target_package());
    let domain_catalog: Vec<Package> = catalog.iter().cloned().map(Package::try_from).collect::<Result<_, _>>()?;
    let designs: Vec<SiteDesign> = (0..sites).map(|i| demo_site(i, nodes)).collect();
    let shutdown = CancellationToken::new();
    let mut services = JoinSet::new();
    for i in 0..orchestrators {
        let replica = connect(&format!("landfall-bench-orchestrator-{i}")).await?;
        services.spawn(consumers::run_orchestrator(replica, Default::default(), shutdown.clone()));
    }
    services.spawn(consumers::run_observer(bus.clone(), shutdown.clone()));
    eprintln!("setting up {sites} installed sites x {nodes} nodes ...");
    let setup = Instant::now();
    register_fleet(&bus, &designs, &catalog).await?;
    drop_site_durables(&bus, &designs).await?;
    seed_observed(&bus, &designs, &catalog).await?;
    let sims: Vec<SimSite> =
        designs.iter().map(|d| SimSite::installed(d, &domain_catalog, SimConfig::instant())).collect();
    let connections = if gateway_hosts == 0 { 4 } else { gateway_hosts };
    let mut gateway_buses = Vec::new();
    for i in 0..connections {
        gateway_buses.push(connect(&format!("landfall-bench-gateways-{i}")).await?);
    }
    let scratch = scratch_dir();
    let consumers_expected = if gateway_hosts == 0 {
        for (i, (d, sim)) in designs.iter().zip(&sims).enumerate() {
            let gw_bus = gateway_buses[i % connections].clone();
            let cache = ArtifactCache::new(scratch.join(d.site.as_str()));
            services.spawn(site_gateway::run_gateway(
                d.site.clone(),
                gw_bus,
                Arc::new(sim.clone()),
                cache,
                names::ALIVE_EVERY,
                shutdown.clone(),
            ));
        }
        sites
    } else {
        let mut shares: Vec<Vec<_>> = vec![Vec::new(); gateway_hosts];
        for (i, (d, sim)) in designs.iter().zip(&sims).enumerate() {
            shares[i % gateway_hosts].push((d.site.clone(), Arc::new(sim.clone())));
        }
        // A host has a durable in each shard of the jobs it takes.
        let mut durables = 0;
        let scope = if gateway_hosts == 1 { HostScope::EverySite } else { HostScope::ItsSites };
        for (i, share) in shares.into_iter().enumerate().filter(|(_, s)| !s.is_empty()) {
            durables += match scope {
                HostScope::EverySite => names::JOB_SHARDS,
                HostScope::ItsSites => share
                    .iter()
                    .map(|(s, _)| names::job_shard(s.as_str()))
                    .collect::<std::collections::BTreeSet<_>>()
                    .len(),
            };
            let durable = format!("gateway-host-{i}");
            let bus = gateway_buses[i].clone();
            let host = site_gateway::run_gateway_host(durable, share, scope, scratch.clone(), bus, shutdown.clone());
            services.spawn(host);
        }
        durables
    };
    wait_for_consumers(&bus, &jobs_streams(), consumers_expected).await?;
    let setup_s = setup.elapsed().as_secs_f64();
    eprintln!("setup took {setup_s:.1} s; patching ...");

    let patched = patch_fleet(&bus, &target_package(), &strategy).await?;
    let figures = patched.figures(stored_messages(&bus).await?, raw, gateway_procs::patch_effects(&sims));
    let phases = rollout_phases(&bus, &patched.rollout_id).await?;
    shutdown.cancel();
    while services.join_next().await.is_some() {}

    let mut report = json!({
        "bench": "fanout",
        "shape": "shared",
        "sites": sites,
        "nodes_per_site": nodes,
        "strategy": {
            "canary_sites": strategy.canary_sites,
            "max_concurrent_sites": strategy.max_concurrent_sites,
            "max_unavailable": strategy.max_unavailable,
        },
        "orchestrators": orchestrators,
        "gateway_hosts": gateway_hosts,
        "job_consumers": consumers_expected,
        "setup_seconds": round(setup_s, 2),
        "raw_payload_bytes": payload,
        "phases_seconds": phases,
    });
    extend(&mut report, figures);
    Ok(report)
}

/// Adds the fields of `more` (an object) to `report` (an object).
pub(super) fn extend(report: &mut serde_json::Value, more: serde_json::Value) {
    if let (Some(report), serde_json::Value::Object(more)) = (report.as_object_mut(), more) {
        report.extend(more);
    }
}

pub(super) fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

/// The chain of the slowest node, with no time lost between steps: staging and the host's
/// walk to `available` (registering, inspecting, preparing) side by side, then provisioning,
/// the cluster's binaries, the kubeconfig, the container packages. Every node of the demo
/// site has the same durations, so every node's chain is this one.
fn slowest_chain(c: &SimConfig, artifacts: u32) -> Duration {
    let walk = c.registering + c.inspecting + c.preparing;
    (c.stage_per_artifact * artifacts).max(walk)
        + c.provisioning
        + c.install_binaries
        + c.kubeconfig
        + c.apply_containers
}

async fn install(url: &str, nodes: usize, time_scale: f64) -> anyhow::Result<serde_json::Value> {
    let bus = Bus::connect(url, "landfall-bench").await?;
    bus.ensure_topology(&Topology::default()).await?;
    let catalog = demo_packages();
    let design = demo_site(0, nodes);
    let config = SimConfig::realistic().time_scale(time_scale);
    let shutdown = CancellationToken::new();
    let mut services = JoinSet::new();
    services.spawn(consumers::run_orchestrator(bus.clone(), Default::default(), shutdown.clone()));
    services.spawn(consumers::run_observer(bus.clone(), shutdown.clone()));
    let key = Arc::new(consumers::secrets::KeyRing::from_hex(&"5a".repeat(32), "bench")?);
    services.spawn(consumers::secrets_service::run_secrets(bus.clone(), key, shutdown.clone()));
    register_fleet(&bus, std::slice::from_ref(&design), &catalog).await?;
    // The site's hosts are racked when the install is asked for: they register, inspect and
    // prepare as part of the install's critical path. The clock starts when they appear (a
    // little before the command is published), so the gateway's start-up counts against us.
    let start = Instant::now();
    let sim = SimSite::new(design.site.as_str(), &design.nodes, config.clone());
    services.spawn(site_gateway::run_gateway(
        design.site.clone(),
        bus.clone(),
        Arc::new(sim.clone()),
        ArtifactCache::new(scratch_dir().join(design.site.as_str())),
        names::ALIVE_EVERY,
        shutdown.clone(),
    ));
    wait_for_consumers(&bus, &jobs_streams(), 1).await?;

    let mut events = bus.read_events(vec![names::scope_events(design.site.as_str())], DeliverPolicy::New).await?;
    let env = Envelope::root();
    bus.publish_command(&pb::InstallSite { site_id: design.site.to_string(), design_revision: 0 }, &env).await?;
    let end = loop {
        let e = tokio::time::timeout(Duration::from_secs(3600), events.next())
            .await
            .context("the install did not end within an hour")?
            .context("event stream ended")??;
        let t = e.delivery.type_name.as_str();
        if e.delivery.envelope.correlation == env.id
            && (t == pb::SiteInstalled::TYPE || t == pb::SiteInstallFailed::TYPE)
        {
            break e;
        }
    };
    let total = start.elapsed();
    shutdown.cancel();
    while services.join_next().await.is_some() {}
    anyhow::ensure!(end.delivery.type_name == pb::SiteInstalled::TYPE, "the install failed");
    let artifacts = {
        let mut shas: Vec<&str> = catalog.iter().map(|p| p.sha256.as_str()).collect();
        shas.sort_unstable();
        shas.dedup();
        shas.len() as u32
    };
    let chain = slowest_chain(&config, artifacts);
    Ok(json!({
        "bench": "install",
        "nodes": nodes,
        "time_scale": time_scale,
        "total_seconds": round(total.as_secs_f64(), 3),
        "slowest_node_chain_seconds": round(chain.as_secs_f64(), 3),
        "ratio": round(total.as_secs_f64() / chain.as_secs_f64(), 4),
        "effects": {
            "provisions": sim.effects().provisions.values().sum::<u32>(),
            "binary_installs": sim.effects().binary_installs.values().sum::<u32>(),
            "kubeconfigs_generated": sim.effects().kubeconfigs_generated,
            "container_applies": sim.effects().container_applies,
        },
    }))
}
