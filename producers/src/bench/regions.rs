//! `bench regions`: the fleet split into regions below a core, as `deploy core-config` and
//! `deploy nats-config --region` write them, measured small on one machine.
//!
//! - The core is a nats-server in the JetStream domain `core`; each region is a hub of its own
//!   (`hub-<region>`) with its own services, each a process, linked to the core as a leaf node
//!   that carries no landfall subject either way.
//! - `deploy region-link` makes each region's streams at the core. Every command (the
//!   catalog, the sites, their installs, the patch) is published at the core only, for its
//!   region; every answer is read at the core only, from the region's mirrored events.
//! - Each site's gateway connects to its region's hub as its site's user, in its region's
//!   domain. What one region's events stream holds of another region's sites is counted, and must
//!   be nothing.

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use async_nats::jetstream::consumer::DeliverPolicy;
use bus_schema::access::region_domain;
use bus_schema::domain::SiteDesign;
use bus_schema::names;
use bus_schema::pb::{self, BusCommand, BusEvent, BusMessage};
use bus_schema::runtime::{Access, Bus, Envelope, EventReader, Outgoing};
use consumers::artifacts::{ArtifactStore, S3Options};
use serde_json::json;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::gateway_procs::patch_effects;
use super::hub_costs::{self, HubSample};
use super::production::{Scratch, start_gateways, upload_catalog};
use super::servers::{Hub, Process, RegionOf, Services, cpu_seconds_of, free_port, start_configured};
use super::{raw_publish_rate, representative_payload, round};
use crate::deploy::regions::{CoreConfigArgs, link_region, write_core};
use crate::run::demo::demo_site;
use crate::run::embedded::find_nats_server;

/// What a regions run is asked for.
pub struct RegionsRun {
    pub regions: usize,
    /// Sites in each region.
    pub sites: usize,
    pub nodes: usize,
    pub artifact_bytes: usize,
    pub raw_messages: usize,
}

/// One region: its sites, its hub and services, the operator's connection to its hub (for
/// nothing but the raw measurement and the counts at the end).
struct Region {
    name: String,
    designs: Vec<SiteDesign>,
    hub: Hub,
    services: Services,
    bus: Bus,
}

impl Region {
    fn cpu_seconds(&self) -> (f64, f64) {
        (self.hub.cpu_seconds(), self.services.processes.iter().map(|(_, p)| p.cpu_seconds()).sum())
    }

    fn sites(&self) -> HashSet<String> {
        self.designs.iter().map(|d| d.site.to_string()).collect()
    }
}

pub async fn regions(run: RegionsRun) -> anyhow::Result<serde_json::Value> {
    anyhow::ensure!(
        run.regions >= 1 && run.sites >= 1 && run.nodes >= 1,
        "--regions, --sites and --nodes must be at least 1"
    );
    let scratch = Scratch::new()?;
    measure(&scratch.0, run).await
}

async fn measure(root: &Path, run: RegionsRun) -> anyhow::Result<serde_json::Value> {
    let RegionsRun { regions: count, sites, nodes, artifact_bytes, raw_messages } = run;
    let binary = find_nats_server().await?;
    let region_names: Vec<String> = (1..=count).map(|i| format!("r{i}")).collect();

    let t = Instant::now();
    let (client, leaf, http) = (free_port()?, free_port()?, free_port()?);
    let core_dir = root.join("core-config");
    let core_args = CoreConfigArgs {
        regions: region_names.clone(),
        core: format!("127.0.0.1:{client}:{leaf}:{http}"),
        out: core_dir.clone(),
        store_dir: root.join("store"),
        tls_cert: None,
        tls_key: None,
    };
    write_core(&core_args)?;
    let core = start_configured(&binary, &core_dir.join("core/core.conf"), client, &root.join("core.log")).await?;
    let operator = Access::seed_from_file(&core_dir.join("core/users/operator.nk")).map_err(anyhow::Error::msg)?;
    let operator = Access { nkey_seed: Some(operator), ..Access::default() };
    let core_bus = Bus::connect_with(&format!("nats://127.0.0.1:{client}"), "landfall-bench-core", &operator).await?;

    let store_dir = root.join("artifacts");
    let store = ArtifactStore::open(&store_dir.display().to_string(), &S3Options::default())?;
    let catalog = upload_catalog(&store, artifact_bytes).await?;
    let (target, rest) = catalog.split_last().context("the catalog is empty")?;

    let mut regions = Vec::new();
    for (k, name) in region_names.iter().enumerate() {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir)?;
        let designs: Vec<SiteDesign> = (k * sites..(k + 1) * sites).map(|i| demo_site(i, nodes)).collect();
        let place = RegionOf {
            name,
            core_leaf: format!("127.0.0.1:{leaf}"),
            key: core_dir.join(format!("core/regions/{name}.nk")),
        };
        let hub = Hub::start_in(&binary, &dir, &designs, 0, Some(&place)).await?;
        let services = Services::start(&hub, &dir, &store_dir)?;
        let bus = hub.operator_when_ready().await.with_context(|| format!("region {name}"))?;
        regions.push(Region { name: name.clone(), designs, hub, services, bus });
    }
    let start_s = t.elapsed().as_secs_f64();
    eprintln!("core and {count} regional hubs (with their services) started in {start_s:.1} s");

    let t = Instant::now();
    for r in &regions {
        link_when_up(&core_bus, &r.name).await?;
    }
    let link_s = t.elapsed().as_secs_f64();
    let again = link_region(&core_bus, &regions[0].name).await?;
    anyhow::ensure!(!again.source_added, "linking region {} again added a second source", regions[0].name);
    eprintln!("{count} regions linked at the core in {link_s:.2} s");

    // A command published at the core under the hubs' own subject, not its region's: no region
    // may take it (each region's commands stream holds what the core kept for it, and nothing
    // more, which the report's stream counts show).
    let stray = pb::InstallSite { site_id: regions[0].designs[0].site.to_string(), design_revision: 0 };
    core_bus.client().publish(BusCommand::subject(&stray), prost::Message::encode_to_vec(&stray).into()).await?;
    core_bus.client().flush().await?;

    let hub_empty: Vec<HubSample> = sample_all(&regions).await?;
    let payload = representative_payload();
    let raw = raw_publish_rate(&regions[0].bus, payload, raw_messages).await?;
    eprintln!("raw JetStream at region {}'s hub: {raw:.0} msgs/s", regions[0].name);
    let cpu_at_start = Cpu::take(&core, &regions);

    // The catalog and the sites, registered through the core.
    let t = Instant::now();
    let kinds = vec![pb::PackageRegistered::filter(), pb::SiteRegistered::filter()];
    let waits = await_at_core(&core_bus, &regions, &kinds, |_| rest.len() + sites).await?;
    for r in &regions {
        let mut out: Vec<Outgoing> = rest
            .iter()
            .map(|p| {
                let cmd = pb::RegisterPackage { package: Some(p.clone()), auto_rollout: None };
                Outgoing::new(BusCommand::subject(&cmd), &cmd, Envelope::root())
            })
            .collect();
        out.extend(r.designs.iter().map(|d| {
            let cmd = pb::RegisterSite { design: Some(pb::SiteDesign::from(d)), expected: None };
            Outgoing::new(BusCommand::subject(&cmd), &cmd, Envelope::root())
        }));
        publish_at_core(&core_bus, &r.name, out).await?;
    }
    let registered = finish(waits).await?;
    let register_s = t.elapsed().as_secs_f64();
    eprintln!("registered {sites} sites in each of {count} regions through the core in {register_s:.1} s");

    // Each site's gateway, connected to its region's hub in its region's domain.
    let t = Instant::now();
    let shutdown = CancellationToken::new();
    let mut gateways = JoinSet::new();
    let mut sims = Vec::new();
    for r in &regions {
        let urls = vec![r.hub.url.clone(); r.designs.len()];
        let caches = root.join(&r.name).join("caches");
        sims.extend(
            start_gateways(
                &r.hub.config,
                &region_domain(&r.name),
                &urls,
                &r.designs,
                &caches,
                Duration::from_secs(15),
                &shutdown,
                &mut gateways,
            )
            .await?,
        );
    }
    let connect_s = t.elapsed().as_secs_f64();
    eprintln!("{} gateways connected to their regions' hubs in {connect_s:.1} s", sims.len());

    // Every site installed, through the core.
    let t = Instant::now();
    let kinds = vec![pb::SiteInstalled::filter(), pb::SiteInstallFailed::filter()];
    let waits = await_at_core(&core_bus, &regions, &kinds, |_| sites).await?;
    for r in &regions {
        let out = r
            .designs
            .iter()
            .map(|d| {
                let cmd = pb::InstallSite { site_id: d.site.to_string(), design_revision: 0 };
                Outgoing::new(BusCommand::subject(&cmd), &cmd, Envelope::root())
            })
            .collect();
        publish_at_core(&core_bus, &r.name, out).await?;
    }
    let installed = finish(waits).await?;
    let install_s = t.elapsed().as_secs_f64();
    let failed: usize = installed.iter().map(|c| c.of(pb::SiteInstallFailed::TYPE)).sum();
    eprintln!("installed {} sites ({failed} failed) through the core in {install_s:.1} s", count * sites - failed);
    anyhow::ensure!(failed == 0, "{failed} installs failed");
    let cpu_after_install = Cpu::take(&core, &regions);
    let hub_installed = sample_all(&regions).await?;

    // The patch: its version registered in every region, then one PatchPackage for each region.
    let kinds = vec![pb::PackageRegistered::filter()];
    let waits = await_at_core(&core_bus, &regions, &kinds, |_| 1).await?;
    for r in &regions {
        let cmd = pb::RegisterPackage { package: Some(target.clone()), auto_rollout: None };
        publish_at_core(&core_bus, &r.name, vec![Outgoing::new(BusCommand::subject(&cmd), &cmd, Envelope::root())])
            .await?;
    }
    finish(waits).await?;
    let cpu_before_patch = Cpu::take(&core, &regions);
    let strategy = pb::RolloutStrategy { max_unavailable: "1".into(), ..Default::default() };
    let kinds = vec![pb::RolloutCompleted::filter(), pb::RolloutHalted::filter()];
    let waits = await_at_core(&core_bus, &regions, &kinds, |_| 1).await?;
    let t = Instant::now();
    for r in &regions {
        let cmd = pb::PatchPackage {
            name: target.name.clone(),
            version: target.version.clone(),
            strategy: Some(strategy.clone()),
            ..Default::default()
        };
        publish_at_core(&core_bus, &r.name, vec![Outgoing::new(BusCommand::subject(&cmd), &cmd, Envelope::root())])
            .await?;
    }
    let ended = finish(waits).await?;
    let patch_s = t.elapsed().as_secs_f64();
    let cpu_after_patch = Cpu::take(&core, &regions);
    let hub_patched = sample_all(&regions).await?;
    let mut updates = Vec::new();
    for (r, counted) in regions.iter().zip(&ended) {
        let last = counted.last.as_ref().context("no rollout ended")?;
        anyhow::ensure!(last.type_name == pb::RolloutCompleted::TYPE, "region {}'s rollout halted", r.name);
        let done: pb::RolloutCompleted = last.decode()?;
        updates.push(done.patched);
    }
    let node_updates: u32 = updates.iter().sum();
    eprintln!(
        "patched {node_updates} nodes in {count} regions through the core in {patch_s:.2} s ({:.0} node updates/s against {raw:.0} raw JetStream msgs/s)",
        f64::from(node_updates) / patch_s
    );

    let mut per_region = Vec::new();
    for (k, r) in regions.iter().enumerate() {
        let (setup, patch) =
            (cpu_after_install.0[k].since(&cpu_at_start.0[k]), cpu_after_patch.0[k].since(&cpu_before_patch.0[k]));
        let counts = stream_counts(&core_bus, &r.bus, &r.name).await?;
        per_region.push(json!({
            "region": r.name,
            "domain": region_domain(&r.name),
            "sites": r.designs.len(),
            "node_updates": updates[k],
            "hub_costs": {
                "empty": hub_empty[k].to_json(),
                "installed": hub_installed[k].to_json(),
                "patched": hub_patched[k].to_json(),
                "per_site": hub_costs::per_site(hub_empty[k], hub_installed[k], r.designs.len()),
                "per_node_update": { "hub_cpu_us": round(patch.hub * 1e6 / f64::from(updates[k].max(1)), 1) },
            },
            "cpu_seconds": {
                "setup": { "hub": round(setup.hub, 2), "services": round(setup.services, 2) },
                "patch": { "hub": round(patch.hub, 2), "services": round(patch.services, 2) },
            },
            "services_rss_mib": r.services.memory(),
            "streams": counts,
            // Events of another region's sites this region's events held (must be none).
            "foreign_events": registered[k].foreign + installed[k].foreign + ended[k].foreign,
        }));
    }
    let foreign: usize = registered.iter().chain(&installed).chain(&ended).map(|c| c.foreign).sum();
    shutdown.cancel();
    while gateways.join_next().await.is_some() {}
    let effects = patch_effects(&sims);
    let core_cpu = (cpu_after_install.1 - cpu_at_start.1, cpu_after_patch.1 - cpu_before_patch.1);
    let report = json!({
        "bench": "regions",
        "regions": count,
        "sites_per_region": sites,
        "nodes_per_site": nodes,
        "sites": count * sites,
        "setup_seconds": {
            "core_and_hubs_start": round(start_s, 2),
            "link": round(link_s, 2),
            "register": round(register_s, 2),
            "gateways_connect": round(connect_s, 2),
            "install": round(install_s, 2),
            "total": round(register_s + connect_s + install_s, 2),
        },
        "patch": {
            "wall_seconds": round(patch_s, 3),
            "node_updates": node_updates,
            "backend_patch_effects": effects,
            "node_updates_per_second": round(f64::from(node_updates) / patch_s, 1),
            "raw_jetstream_msgs_per_second": round(raw, 0),
            "node_updates_per_raw_jetstream_msg": round(f64::from(node_updates) / patch_s / raw, 4),
        },
        "core": {
            "rss_mib": round(core.rss_mib(), 1),
            "peak_rss_mib": round(core.peak_mib(), 1),
            "rss_kib_per_site": round(core.rss_mib() * 1024.0 / (count * sites) as f64, 1),
            "cpu_seconds_setup": round(core_cpu.0, 2),
            "cpu_seconds_patch": round(core_cpu.1, 2),
        },
        "bench_process_cpu_seconds": round(cpu_seconds_of("self"), 2),
        "foreign_events": foreign,
        "per_region": per_region,
    });
    for r in regions {
        r.services.stop();
        drop(r.hub);
    }
    core.stop();
    anyhow::ensure!(foreign == 0, "{foreign} events of another region's sites were read from a region's events");
    Ok(report)
}

/// Links `region` at the core, asking again while its hub's link to the core or its
/// orchestrator's streams are not there yet.
async fn link_when_up(core: &Bus, region: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match link_region(core, region).await {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() < deadline => {
                tracing::debug!(region, error = %format!("{e:#}"), "not linked yet");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => return Err(e.context(format!("region {region} not linked within 60 s"))),
        }
    }
}

/// Publishes `out` (commands) at the core for `region`, each under its region's subject
/// ([`Bus::in_region`]).
async fn publish_at_core(core: &Bus, region: &str, out: Vec<Outgoing>) -> anyhow::Result<()> {
    if let Some(o) = out.iter().find(|o| names::to_region(&o.subject, region).is_none()) {
        bail!("{} is no command", o.subject);
    }
    let for_region = core.in_region(region);
    for chunk in out.chunks(2048) {
        for_region.publish_all(chunk.to_vec()).await?;
    }
    Ok(())
}

/// What a wait at the core read of one region's events.
#[derive(Default)]
struct Counted {
    kinds: Vec<String>,
    /// Events of a site of another region.
    foreign: usize,
    last: Option<bus_schema::runtime::Delivery>,
}

impl Counted {
    fn of(&self, kind: &str) -> usize {
        self.kinds.iter().filter(|k| *k == kind).count()
    }
}

/// For each region, a reader of its events mirrored at the core (made before anything is
/// published), read on its own until `expected(region)` events of `kinds` have come.
async fn await_at_core(
    core: &Bus,
    regions: &[Region],
    kinds: &[String],
    expected: impl Fn(&Region) -> usize,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<anyhow::Result<Counted>>>> {
    let mut waits = Vec::new();
    for r in regions {
        let reader =
            core.read_events_of(&names::core_events_stream(&r.name), kinds.to_vec(), DeliverPolicy::New).await?;
        waits.push(tokio::spawn(count_events(reader, expected(r), r.sites(), r.name.clone())));
    }
    Ok(waits)
}

async fn count_events(
    mut reader: EventReader,
    expected: usize,
    own: HashSet<String>,
    region: String,
) -> anyhow::Result<Counted> {
    let mut counted = Counted::default();
    let mut last_heard = Instant::now();
    while counted.kinds.len() < expected {
        let Ok(next) = tokio::time::timeout(Duration::from_secs(10), reader.next()).await else {
            if last_heard.elapsed() > Duration::from_secs(300) {
                bail!(
                    "region {region}: nothing for 300 s, {} of {expected} events read at the core",
                    counted.kinds.len()
                );
            }
            continue;
        };
        let e = next.context("the event stream ended")??;
        last_heard = Instant::now();
        let site = e.delivery.subject.split('.').nth(2).unwrap_or_default();
        if site != names::FLEET && !own.contains(site) {
            counted.foreign += 1;
            continue;
        }
        counted.kinds.push(e.delivery.type_name.clone());
        counted.last = Some(e.delivery);
    }
    Ok(counted)
}

async fn finish(waits: Vec<tokio::task::JoinHandle<anyhow::Result<Counted>>>) -> anyhow::Result<Vec<Counted>> {
    let mut out = Vec::new();
    for w in waits {
        out.push(w.await??);
    }
    Ok(out)
}

async fn sample_all(regions: &[Region]) -> anyhow::Result<Vec<HubSample>> {
    let mut out = Vec::new();
    for r in regions {
        out.push(r.hub.sample().await?);
    }
    Ok(out)
}

/// The commands the core kept for `region` and what the region's commands stream holds; the
/// region's events and the core's mirror of them.
async fn stream_counts(core: &Bus, hub: &Bus, region: &str) -> anyhow::Result<serde_json::Value> {
    let messages = |bus: &Bus, stream: String| {
        let js = bus.jetstream().clone();
        async move {
            let mut s = js.get_stream(&stream).await.with_context(|| format!("no stream {stream}"))?;
            anyhow::Ok(s.info().await?.state.messages)
        }
    };
    Ok(json!({
        "core_commands": messages(core, names::core_commands_stream(region)).await?,
        "region_commands": messages(hub, names::COMMANDS_STREAM.to_string()).await?,
        "region_events": messages(hub, names::EVENTS_STREAM.to_string()).await?,
        "core_events_mirror": messages(core, names::core_events_stream(region)).await?,
    }))
}

/// CPU seconds of each region's hub and services, and of the core.
struct Cpu(Vec<RegionCpu>, f64);

#[derive(Clone, Copy)]
struct RegionCpu {
    hub: f64,
    services: f64,
}

impl RegionCpu {
    fn since(&self, before: &Self) -> Self {
        Self { hub: self.hub - before.hub, services: self.services - before.services }
    }
}

impl Cpu {
    fn take(core: &Process, regions: &[Region]) -> Self {
        let each = regions
            .iter()
            .map(|r| {
                let (hub, services) = r.cpu_seconds();
                RegionCpu { hub, services }
            })
            .collect();
        Self(each, core.cpu_seconds())
    }
}
