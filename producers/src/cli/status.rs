//! `landfall status`: sites, their latest install and what their nodes run, read from KV.

use std::collections::HashMap;
use std::process::ExitCode;

use anyhow::bail;
use bus_schema::domain::SiteId;
use bus_schema::names::{self, keys};
use bus_schema::pb;
use bus_schema::runtime::{Bus, observed_nodes};
use clap::Args;
use serde_json::json;

use super::connect::connect;
use super::output::{Format, emit};
use crate::api::facts::{latest_work, progress_of, step_label};
use crate::views::attention::{attention_json, clears_disagreement, disagreement_of};
use crate::views::event::summary;
use crate::views::link::{link_json, link_text};
use crate::views::observed::{observed_json, package_text};

#[derive(Debug, Args)]
pub struct StatusArgs {
    pub site: Option<String>,
    /// What the site itself keeps, read at its leaf node (give --nats-url the leaf node's and
    /// the site's key): its latest reports, and how many have not reached the hub yet. Works
    /// while the hub is out of reach.
    #[arg(long, requires = "site")]
    pub local: bool,
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
    pub output: Format,
}

/// One site's state: its design, its latest install, what its nodes run, and what needs a
/// person, as JSON; each node's latest step, and what the site found unlike the hub, only when
/// `one` site is asked for.
async fn site_status(
    bus: &Bus,
    site: &str,
    observed: &[pb::NodeObserved],
    links: &HashMap<String, pb::SiteLink>,
    one: bool,
) -> anyhow::Result<Option<serde_json::Value>> {
    let sites = bus.kv(names::SITES_BUCKET).await?;
    let sagas = bus.kv(names::SAGAS_BUCKET).await?;
    let Some((design, revision)) = sites.get::<pb::SiteDesign>(&keys::site(site)).await? else { return Ok(None) };
    let latest = sagas.get::<pb::SiteLease>(&keys::latest_install(site)).await?.map(|(l, _)| l.saga_id);
    let saga = match &latest {
        Some(id) => sagas.get::<pb::InstallSaga>(&keys::saga(id)).await?.map(|(s, _)| s),
        None => None,
    };
    // A key per node: read for one site, not for the whole fleet's listing.
    let node_list = if one { Some(node_list(&sagas, &design, saga.as_ref()).await?) } else { None };
    let install = match (saga, &latest) {
        (Some(s), _) => {
            let mut v = serde_json::to_value(&s).unwrap_or_default();
            if let Some(o) = v.as_object_mut() {
                for noisy in ["design", "outbox", "packages"] {
                    o.remove(noisy);
                }
            }
            Some(v)
        }
        // Compacted after the retention: its summary.
        (None, Some(id)) => sagas.get::<pb::SagaSummary>(&keys::saga_summary(id)).await?.map(|(s, _)| {
            let mut v = serde_json::to_value(&s).unwrap_or_default();
            if let Some(o) = v.as_object_mut() {
                o.insert("compacted".into(), json!(true));
            }
            v
        }),
        (None, None) => None,
    };
    let observed: Vec<&pb::NodeObserved> = observed.iter().filter(|o| o.site_id == site).collect();
    // One site's events are read for one site only: the fleet's listing stays a pass over KV.
    let disagreement = if one { disagrees(bus, site).await? } else { None };
    let charts = if one { Some(crate::views::charts::site_charts(bus, site).await?) } else { None };
    Ok(Some(json!({
        "site": site,
        "design_revision": revision,
        "labels": design.labels,
        "nodes": design.nodes.len(),
        "install": install,
        "node_list": node_list,
        "link": links.get(site).map(link_json),
        "attention": attention_json(site, links.contains_key(site), disagreement.as_deref()),
        "observed": observed_json(&design, &observed),
        "charts": charts,
    })))
}

/// Every node of the design with what last worked on it: the site's install, or the node's own
/// join when it came later (a node added or reprovisioned after the install). A join compacted
/// after the retention leaves no steps; the install's are shown then.
async fn node_list(
    sagas: &bus_schema::runtime::Kv,
    design: &pb::SiteDesign,
    install: Option<&pb::InstallSaga>,
) -> anyhow::Result<Vec<serde_json::Value>> {
    let mut out = Vec::with_capacity(design.nodes.len());
    for n in &design.nodes {
        let join = match sagas.get::<pb::SiteLease>(&keys::latest_join(&design.site_id, &n.name)).await? {
            Some((pointer, _)) => sagas.get::<pb::InstallSaga>(&keys::saga(&pointer.saga_id)).await?.map(|(s, _)| s),
            None => None,
        };
        let saga = latest_work(install, join.as_ref());
        let progress = progress_of(saga, &n.name);
        out.push(json!({
            "name": n.name,
            "role": crate::views::human::role_label(n.role),
            "step": step_label(progress.map(|p| p.step)),
            "metal3_state": progress.map(|p| p.metal3_state.as_str()).unwrap_or(""),
            "failed_step": progress.map(|p| p.failed_step.as_str()).unwrap_or(""),
            "reason": progress.map(|p| p.reason.as_str()).unwrap_or(""),
            "by": saga.filter(|_| progress.is_some()).map(|s| if s.join { "join" } else { "install" }),
            "saga": saga.filter(|_| progress.is_some()).map(|s| s.saga_id.as_str()),
        }));
    }
    Ok(out)
}

/// What the site last found unlike the hub (`SiteDisagrees`), unless an event of the site
/// after it ended that: the same rule the API's read model follows, from the last event of each
/// kind (three reads of the events stream, none of them a scan).
async fn disagrees(bus: &Bus, site: &str) -> anyhow::Result<Option<String>> {
    use bus_schema::pb::{BusEvent, BusMessage};
    let stream = bus.jetstream().get_stream(names::EVENTS_STREAM).await?;
    // Each kind on the subjects of whoever sends it (a site may not speak for the hub).
    let last = async |aggregate: &str, kind: &str, type_name: &str| {
        let origin = bus_schema::trust::usual_origin(type_name);
        let subject = names::event_subject_from(origin, site, aggregate, kind);
        stream.get_last_raw_message_by_subject(&subject).await.ok()
    };
    let disagrees = (pb::SiteDisagrees::AGGREGATE, pb::SiteDisagrees::KIND, pb::SiteDisagrees::TYPE);
    let Some(found) = last(disagrees.0, disagrees.1, disagrees.2).await else { return Ok(None) };
    let later = [
        (pb::SiteInstallStarted::AGGREGATE, pb::SiteInstallStarted::KIND, pb::SiteInstallStarted::TYPE),
        (pb::SitePatched::AGGREGATE, pb::SitePatched::KIND, pb::SitePatched::TYPE),
    ];
    for (aggregate, kind, type_name) in later {
        if let Some(m) = last(aggregate, kind, type_name).await
            && m.sequence > found.sequence
            && clears_disagreement(type_name, &m.payload)
        {
            return Ok(None);
        }
    }
    Ok(disagreement_of(pb::SiteDisagrees::TYPE, &found.payload))
}

/// Prints the status of one site, or of every site.
pub async fn run(url: &str, args: &StatusArgs) -> anyhow::Result<ExitCode> {
    let bus = connect(url).await?;
    if let (true, Some(site)) = (args.local, &args.site) {
        return local_status(&bus, SiteId::try_from(site.as_str())?.as_str(), args.output).await;
    }
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
    // One pass over what nodes run: one site's keys, or every key when showing every site.
    let observed_kv = bus.kv(names::OBSERVED_BUCKET).await?;
    let prefix = match &args.site {
        Some(_) => keys::observed_site_prefix(&sites[0]),
        None => keys::OBSERVED_PREFIX.to_string(),
    };
    let observed = observed_nodes(&observed_kv, &prefix).await?;
    // Whether the hub hears each site: one key for one site, every site's otherwise.
    let links: Vec<pb::SiteLink> = match &args.site {
        Some(_) => observed_kv.get::<pb::SiteLink>(&keys::link(&sites[0])).await?.map(|(l, _)| l).into_iter().collect(),
        None => observed_kv.scan::<pb::SiteLink>(keys::LINK_PREFIX).await?.into_iter().map(|(_, l, _)| l).collect(),
    };
    let links: HashMap<String, pb::SiteLink> = links.into_iter().map(|l| (l.site_id.clone(), l)).collect();
    let mut all = Vec::new();
    for site in &sites {
        match site_status(&bus, site, &observed, &links, args.site.is_some()).await? {
            Some(s) => all.push(s),
            None if args.site.is_some() => bail!("site {site} is not registered"),
            None => {}
        }
    }
    match args.output {
        Format::Json | Format::Yaml => emit(args.output, &serde_json::to_value(&all)?)?,
        Format::Table => print_status(&all, args.site.is_some()),
    }
    for warning in store_warnings(&bus).await {
        eprintln!("warning: {warning}");
    }
    Ok(ExitCode::SUCCESS)
}

/// How many of the site's latest reports `--local` reads.
const LOCAL_REPORTS: u64 = 1000;

/// `status SITE --local`: the site's own record, read at its leaf node.
async fn local_status(bus: &Bus, site: &str, output: Format) -> anyhow::Result<ExitCode> {
    let Some(kept) = site_gateway::outbox::read_kept(bus, LOCAL_REPORTS).await? else {
        bail!("{} keeps no record of site {site}: --local reads a site's leaf node", bus.url());
    };
    let reports: Vec<serde_json::Value> = kept
        .latest
        .iter()
        .filter(|m| names::outbox_destination(m.subject.as_str()).is_some())
        .map(|m| {
            let header = |h: &str| m.headers.get(h).map(|v| v.to_string()).unwrap_or_default();
            let type_name = header(names::headers::TYPE);
            let report = match pb::decode_to_json(&type_name, &m.payload) {
                Some(Ok(v)) => v,
                Some(Err(e)) => json!({ "undecodable": e.to_string() }),
                None => json!({ "unknown_type": type_name }),
            };
            json!({
                "seq": m.sequence,
                "time": crate::views::human::rfc3339(m.time),
                "subject": names::outbox_destination(m.subject.as_str()).unwrap_or_default(),
                "type": type_name,
                "id": header(names::headers::MSG_ID),
                "at_hub": m.sequence <= kept.forwarded,
                "report": report,
            })
        })
        .collect();
    // Each node's latest report, as far as the reports read go: its own, or the one its site's
    // report carries.
    let mut nodes = serde_json::Map::new();
    for r in &reports {
        if let Some(node) = r["report"]["node"].as_str().filter(|n| !n.is_empty()) {
            nodes.insert(node.to_string(), r.clone());
        }
        if r["type"] == <pb::SitePatched as pb::BusMessage>::TYPE {
            for carried in r["report"]["nodes"].as_array().map(Vec::as_slice).unwrap_or_default() {
                let Some(node) = carried["node"].as_str().filter(|n| !n.is_empty()) else { continue };
                let mut one = r.clone();
                one["type"] = json!(<pb::NodePatched as pb::BusMessage>::TYPE);
                one["report"] = carried.clone();
                one["in_site_report"] = json!(true);
                nodes.insert(node.to_string(), one);
            }
        }
    }
    let status = json!({
        "site": site,
        "stored": kept.stored,
        "at_hub_through": kept.forwarded,
        "waiting": kept.stored.saturating_sub(kept.forwarded),
        "nodes": nodes,
        "latest": reports,
    });
    match output {
        Format::Json | Format::Yaml => emit(output, &status)?,
        Format::Table => print_local(&status),
    }
    Ok(ExitCode::SUCCESS)
}

fn print_local(status: &serde_json::Value) {
    let kind =
        |r: &serde_json::Value| r["subject"].as_str().unwrap_or("").splitn(5, '.').nth(4).unwrap_or("").to_string();
    println!(
        "site {}, as its leaf node keeps it: {} reports, {} not at the hub yet",
        status["site"].as_str().unwrap_or(""),
        status["stored"],
        status["waiting"]
    );
    let nodes = status["nodes"].as_object().cloned().unwrap_or_default();
    if !nodes.is_empty() {
        println!("  {:<16} {:<28} {:<32} DETAIL", "NODE", "LAST REPORT", "AT");
        for (node, r) in &nodes {
            let waiting = if r["at_hub"] == false { "  (not at the hub yet)" } else { "" };
            println!(
                "  {node:<16} {:<28} {:<32} {}{waiting}",
                kind(r),
                r["time"].as_str().unwrap_or(""),
                summary(&r["report"])
            );
        }
    }
    let latest = status["latest"].as_array().map(Vec::as_slice).unwrap_or_default();
    let shown = &latest[latest.len().saturating_sub(20)..];
    if !shown.is_empty() {
        println!("  the latest {}:", shown.len());
        for r in shown {
            let waiting = if r["at_hub"] == false { "  (not at the hub yet)" } else { "" };
            println!("  {}  {:<28} {}{waiting}", r["time"].as_str().unwrap_or(""), kind(r), summary(&r["report"]));
        }
    }
}

/// What has no room in the store: streams at their limits now, and what the hub's store watch
/// last reported full (a full disk shows no limit). Commands wait; nothing is lost.
async fn store_warnings(bus: &bus_schema::runtime::Bus) -> Vec<String> {
    use bus_schema::runtime::store_health;
    let mut out = Vec::new();
    if let Ok(usage) = store_health::store_use(bus).await {
        for f in store_health::assess(&usage, &[]) {
            out.push(format!("no room in {}: {} (commands wait until there is room)", f.stream, f.reason));
        }
    }
    if let Ok(Some(f)) = store_health::reported_full(bus).await
        && out.iter().all(|w| !w.contains(&f.stream))
    {
        let since = crate::views::human::rfc3339_ms(f.since_unix_ms);
        out.push(format!("no room in {} since {since}: {} (commands wait until there is room)", f.stream, f.reason));
    }
    out
}

fn print_status(all: &[serde_json::Value], detail: bool) {
    if all.is_empty() {
        println!("no sites registered (landfall site register -f FILE)");
        return;
    }
    println!("{:<20} {:>5}  {:<28} {:<16} LINK", "SITE", "NODES", "LATEST INSTALL", "OUTCOME");
    for s in all {
        let install = &s["install"];
        let phase = install["phase"].as_str().unwrap_or("never installed").trim_start_matches("INSTALL_PHASE_");
        let outcome = install["outcome"].as_str().unwrap_or("").trim_start_matches("INSTALL_OUTCOME_");
        let link = match s["link"]["state"].as_str() {
            Some("cut_off") => format!("cut off since {}", s["link"]["since"].as_str().unwrap_or("")),
            Some(state) => state.to_string(),
            None => "-".to_string(),
        };
        println!(
            "{:<20} {:>5}  {:<28} {:<16} {link}",
            s["site"].as_str().unwrap_or(""),
            s["nodes"].as_u64().unwrap_or(0),
            phase.to_lowercase(),
            outcome.to_lowercase()
        );
        for a in s["attention"].as_array().into_iter().flatten() {
            println!("  needs attention: {}", a["reason"].as_str().unwrap_or(""));
        }
        if detail {
            println!("  link: {}", link_text(&s["link"]));
            if let Some(reason) = install["reason"].as_str().filter(|r| !r.is_empty()) {
                println!("  reason: {reason}");
            }
            println!("  {:<16} {:<8} {:<16} {:<16} {:<8} DETAIL", "NODE", "ROLE", "STEP", "METAL3", "BY");
            for n in s["node_list"].as_array().into_iter().flatten() {
                println!(
                    "  {:<16} {:<8} {:<16} {:<16} {:<8} {}",
                    n["name"].as_str().unwrap_or(""),
                    n["role"].as_str().unwrap_or(""),
                    n["step"].as_str().unwrap_or(""),
                    n["metal3_state"].as_str().unwrap_or(""),
                    n["by"].as_str().unwrap_or("-"),
                    summary(&json!({"failed_step": n["failed_step"], "reason": n["reason"]})),
                );
            }
            print_observed(&s["observed"]);
            print_charts(&s["charts"]);
        }
    }
}

fn print_charts(charts: &serde_json::Value) {
    let charts = charts.as_array().map(Vec::as_slice).unwrap_or_default();
    if charts.is_empty() {
        return;
    }
    println!("  {:<16} {:<10} RENDERED FOR THE SITE (the latest)", "CHART", "VERSION");
    for c in charts {
        let short = |k: &str| c[k].as_str().unwrap_or("").chars().take(12).collect::<String>();
        println!(
            "  {:<16} {:<10} chart sha256:{}… values sha256:{}… helm {} Kubernetes {} render sha256:{}…",
            c["name"].as_str().unwrap_or(""),
            c["version"].as_str().unwrap_or(""),
            short("chart_sha256"),
            short("values_digest"),
            c["helm_version"].as_str().unwrap_or(""),
            c["kube_version"].as_str().filter(|v| !v.is_empty()).unwrap_or("(helm's default)"),
            short("render_sha256"),
        );
    }
}

fn print_observed(observed: &serde_json::Value) {
    let nodes = observed.as_array().map(Vec::as_slice).unwrap_or_default();
    if nodes.is_empty() {
        return;
    }
    println!("  {:<16} {:<8} RUNS (as observed)", "NODE", "ROLE");
    for n in nodes {
        let runs = match n["packages"].as_array() {
            _ if n["observed"] != true => "nothing reported yet".to_string(),
            Some(p) if p.is_empty() => "no packages reported".to_string(),
            Some(p) => p
                .iter()
                .map(|p| {
                    package_text(
                        p["name"].as_str().unwrap_or(""),
                        p["version"].as_str().unwrap_or(""),
                        p["desired"].as_str(),
                    )
                })
                .collect::<Vec<_>>()
                .join(", "),
            None => String::new(),
        };
        let extra = if n["in_design"] == false { "  (not in the design)" } else { "" };
        println!("  {:<16} {:<8} {runs}{extra}", n["node"].as_str().unwrap_or(""), n["role"].as_str().unwrap_or(""));
    }
}
