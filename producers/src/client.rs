//! Client commands: they publish commands and read events and KV state, through `bus-schema`.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, bail};
use async_nats::jetstream::consumer::DeliverPolicy;
use bus_schema::domain::{Package, SiteDesign, SiteId};
use bus_schema::names::{self, keys};
use bus_schema::pb::{self, BusCommand, BusMessage};
use bus_schema::runtime::{Bus, Envelope, ReadEvent};
use serde_json::json;

use crate::output::{event_json, event_line, summary};
use crate::{EventsArgs, Format, InstallArgs, StatusArgs};

/// Exit code when the command was rejected.
const EXIT_REJECTED: u8 = 2;
/// Exit code when --wait ran out of time.
const EXIT_TIMEOUT: u8 = 3;

pub async fn connect(url: &str) -> anyhow::Result<Bus> {
    Bus::connect_client(url, "landfall-cli")
        .await
        .with_context(|| format!("is landfall running? (`landfall up`, or set NATS_URL / --nats-url; tried {url})"))
}

pub async fn register_site(url: &str, file: &Path) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(file).with_context(|| format!("read {}", file.display()))?;
    let design: SiteDesign =
        serde_yaml::from_str(&text).with_context(|| format!("{} is not a site design", file.display()))?;
    let design = design.validate().with_context(|| format!("{} is not a valid site design", file.display()))?;
    let bus = connect(url).await?;
    let cmd = pb::RegisterSite { design: Some(pb::SiteDesign::from(&design)) };
    let env = Envelope::root();
    let ack = bus.publish_command(&cmd, &env).await?;
    println!("RegisterSite {} published (id {}, seq {})", design.site, env.id, ack.sequence);
    Ok(ExitCode::SUCCESS)
}

pub async fn register_package(
    url: &str,
    name: String,
    version: String,
    kind: &str,
    sha256: String,
    size: u64,
    object_key: String,
) -> anyhow::Result<ExitCode> {
    let kind: pb::PackageKind = kind.parse()?;
    let object_key = if object_key.is_empty() { format!("{name}/{version}") } else { object_key };
    let pkg = pb::Package { name, version, kind: kind as i32, sha256, size, object_key };
    let checked = Package::try_from(pkg.clone()).context("invalid package")?;
    let bus = connect(url).await?;
    let env = Envelope::root();
    bus.publish_command(&pb::RegisterPackage { package: Some(pkg), auto_rollout: None }, &env).await?;
    println!("RegisterPackage {}@{} published (id {})", checked.name, checked.version, env.id);
    Ok(ExitCode::SUCCESS)
}

pub async fn install_site(url: &str, args: &InstallArgs) -> anyhow::Result<ExitCode> {
    let site = SiteId::try_from(args.site.as_str())?;
    let bus = connect(url).await?;
    let env = args.id.map(Envelope::root_with_id).unwrap_or_else(Envelope::root);
    // Subscribe before publishing, so no event of this install can slip by.
    let mut reader = match args.wait {
        true => Some(bus.read_events(vec![names::scope_events(site.as_str())], DeliverPolicy::New).await?),
        false => None,
    };
    let cmd = pb::InstallSite { site_id: site.to_string(), design_revision: args.revision.unwrap_or(0) };
    let ack = bus.publish_command(&cmd, &env).await?;
    let dup = if ack.duplicate { " (duplicate id: already published)" } else { "" };
    eprintln!("InstallSite {site} published as {} on {}{dup}", env.id, cmd.subject());
    if ack.duplicate && reader.is_some() {
        // The command ran (or runs) from its first publish: follow it from the start.
        reader = Some(bus.read_events(vec![names::scope_events(site.as_str())], DeliverPolicy::All).await?);
    }
    let Some(reader) = reader.as_mut() else { return Ok(ExitCode::SUCCESS) };

    let deadline = tokio::time::Instant::now() + args.timeout;
    loop {
        let next = match tokio::time::timeout_at(deadline, reader.next()).await {
            Err(_) => {
                eprintln!("gave up waiting after {:?}; the install goes on (landfall status {site})", args.timeout);
                return Ok(ExitCode::from(EXIT_TIMEOUT));
            }
            Ok(None) => bail!("the event stream ended"),
            Ok(Some(e)) => e?,
        };
        let d = &next.delivery;
        if d.envelope.correlation != env.id {
            continue;
        }
        match args.output {
            Format::Json => println!("{}", event_json(&next)),
            Format::Text => eprintln!("{}", event_line(&next)),
        }
        if let Some(code) = install_verdict(&next)? {
            return Ok(code);
        }
    }
}

/// Whether this event ends an install, and with which exit code.
fn install_verdict(e: &ReadEvent) -> anyhow::Result<Option<ExitCode>> {
    let d = &e.delivery;
    Ok(match d.type_name.as_str() {
        pb::SiteInstalled::TYPE => {
            let done: pb::SiteInstalled = d.decode().map_err(|e| anyhow::anyhow!("{e}"))?;
            eprintln!("installed: {} nodes", done.results.len());
            Some(ExitCode::SUCCESS)
        }
        pb::SiteInstallFailed::TYPE => {
            let failed: pb::SiteInstallFailed = d.decode().map_err(|e| anyhow::anyhow!("{e}"))?;
            eprintln!("install failed: {}", failed.reason);
            for r in failed.results.iter().filter(|r| r.outcome == pb::NodeOutcome::Failed as i32) {
                eprintln!("  failed node {}: {}: {}", r.node, r.failed_step, r.reason);
            }
            let ok = failed.results.len() - failed.failed_nodes.len();
            eprintln!("  {ok} of {} nodes installed", failed.results.len());
            Some(ExitCode::FAILURE)
        }
        pb::CommandRejected::TYPE => {
            let r: pb::CommandRejected = d.decode().map_err(|e| anyhow::anyhow!("{e}"))?;
            eprintln!("rejected: {}", r.reason);
            Some(ExitCode::from(EXIT_REJECTED))
        }
        _ => None,
    })
}

pub async fn events(url: &str, args: &EventsArgs) -> anyhow::Result<ExitCode> {
    let filter = match &args.site {
        Some(site) => names::scope_events(SiteId::try_from(site.as_str())?.as_str()),
        None => names::EVENTS_ALL.to_string(),
    };
    let bus = connect(url).await?;
    let mut reader = bus.read_events(vec![filter], DeliverPolicy::All).await?;
    if reader.pending_at_start == 0 && !args.follow {
        return Ok(ExitCode::SUCCESS);
    }
    while let Some(e) = reader.next().await {
        let e = e?;
        match args.output {
            Format::Json => println!("{}", event_json(&e)),
            Format::Text => println!("{}", event_line(&e)),
        }
        if !args.follow && e.pending == 0 {
            break;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// One site's state: its design and its latest install, as JSON.
async fn site_status(bus: &Bus, site: &str) -> anyhow::Result<Option<serde_json::Value>> {
    let sites = bus.kv(names::SITES_BUCKET).await?;
    let sagas = bus.kv(names::SAGAS_BUCKET).await?;
    let Some((design, revision)) = sites.get::<pb::SiteDesign>(&keys::site(site)).await? else { return Ok(None) };
    let saga = match sagas.get::<pb::SiteLease>(&keys::latest_install(site)).await? {
        Some((latest, _)) => sagas.get::<pb::InstallSaga>(&keys::saga(&latest.saga_id)).await?.map(|(s, _)| s),
        None => None,
    };
    let install = saga.map(|s| {
        let mut v = serde_json::to_value(&s).unwrap_or_default();
        if let Some(o) = v.as_object_mut() {
            for noisy in ["design", "outbox", "packages"] {
                o.remove(noisy);
            }
        }
        v
    });
    Ok(Some(json!({
        "site": site,
        "design_revision": revision,
        "labels": design.labels,
        "nodes": design.nodes.len(),
        "install": install,
    })))
}

pub async fn status(url: &str, args: &StatusArgs) -> anyhow::Result<ExitCode> {
    let bus = connect(url).await?;
    let sites = match &args.site {
        Some(s) => vec![SiteId::try_from(s.as_str())?.to_string()],
        None => {
            let kv = bus.kv(names::SITES_BUCKET).await?;
            kv.keys_with_prefix(keys::SITE_PREFIX)
                .await?
                .iter()
                .filter_map(|k| keys::site_of(k))
                .map(str::to_owned)
                .collect()
        }
    };
    let mut all = Vec::new();
    for site in &sites {
        match site_status(&bus, site).await? {
            Some(s) => all.push(s),
            None if args.site.is_some() => bail!("site {site} is not registered"),
            None => {}
        }
    }
    match args.output {
        Format::Json => println!("{}", serde_json::to_string_pretty(&all)?),
        Format::Text => print_status(&all, args.site.is_some()),
    }
    Ok(ExitCode::SUCCESS)
}

fn print_status(all: &[serde_json::Value], detail: bool) {
    if all.is_empty() {
        println!("no sites registered (landfall site register -f FILE)");
        return;
    }
    println!("{:<20} {:>5}  {:<28} OUTCOME", "SITE", "NODES", "LATEST INSTALL");
    for s in all {
        let install = &s["install"];
        let phase = install["phase"].as_str().unwrap_or("never installed").trim_start_matches("INSTALL_PHASE_");
        let outcome = install["outcome"].as_str().unwrap_or("").trim_start_matches("INSTALL_OUTCOME_");
        println!(
            "{:<20} {:>5}  {:<28} {}",
            s["site"].as_str().unwrap_or(""),
            s["nodes"].as_u64().unwrap_or(0),
            phase.to_lowercase(),
            outcome.to_lowercase()
        );
        if detail {
            if let Some(reason) = install["reason"].as_str().filter(|r| !r.is_empty()) {
                println!("  reason: {reason}");
            }
            println!("  {:<16} {:<8} {:<20} {:<16} DETAIL", "NODE", "ROLE", "STEP", "METAL3");
            for n in install["nodes"].as_array().into_iter().flatten() {
                let step = n["step"].as_str().unwrap_or("").trim_start_matches("NODE_STEP_").to_lowercase();
                println!(
                    "  {:<16} {:<8} {:<20} {:<16} {}",
                    n["node"]["name"].as_str().unwrap_or(""),
                    n["node"]["role"].as_str().unwrap_or(""),
                    step,
                    n["metal3_state"].as_str().unwrap_or(""),
                    summary(&json!({"failed_step": n["failed_step"], "reason": n["reason"]})),
                );
            }
        }
    }
}
