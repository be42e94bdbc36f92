//! Client commands: they publish commands and read events and KV state, through `bus-schema`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, bail};
use async_nats::jetstream::consumer::DeliverPolicy;
use bus_schema::domain::{Package, SiteDesign, SiteId};
use bus_schema::names::{self, keys};
use bus_schema::pb::{self, BusCommand, BusMessage};
use bus_schema::runtime::{Bus, Envelope, EventReader, ReadEvent, observed_nodes};
use serde_json::json;

use crate::fleet::{kind_label, role_label};
use crate::output::{event_json, event_line, rfc3339_ms, summary};
use crate::{EventsArgs, Format, InstallArgs, PackageIdArgs, RegisterPackageArgs, StatusArgs};

/// Exit code when the command was rejected.
pub(crate) const EXIT_REJECTED: u8 = 2;
/// Exit code when --wait ran out of time.
pub(crate) const EXIT_TIMEOUT: u8 = 3;

pub async fn connect(url: &str) -> anyhow::Result<Bus> {
    Bus::connect_client(url, "landfall-cli", crate::nats_access::get())
        .await
        .with_context(|| format!("is landfall running? (`landfall up`, or set NATS_URL / --nats-url; tried {url})"))
}

/// Reads the flat site design of `file` (`site register -f`).
pub fn read_site_design(file: &Path) -> anyhow::Result<SiteDesign> {
    let text = std::fs::read_to_string(file).with_context(|| format!("read {}", file.display()))?;
    parse_site_design(&text, &file.display().to_string())
}

/// Parses a flat site design read from `source`: its YAML, then the checks of the design as a
/// whole (the first problem found).
pub fn parse_site_design(text: &str, source: &str) -> anyhow::Result<SiteDesign> {
    let design: SiteDesign = serde_yaml::from_str(text).with_context(|| format!("{source} is not a site design"))?;
    design.validate().with_context(|| format!("{source} is not a valid site design"))
}

pub async fn register_site(url: &str, file: &Path) -> anyhow::Result<ExitCode> {
    let design = read_site_design(file)?;
    let bus = connect(url).await?;
    let cmd = pb::RegisterSite { design: Some(pb::SiteDesign::from(&design)) };
    let env = Envelope::root();
    let ack = bus.publish_command(&cmd, &env).await?;
    println!("RegisterSite {} published (id {}, seq {})", design.site, env.id, ack.sequence);
    Ok(ExitCode::SUCCESS)
}

pub async fn register_package(url: &str, args: RegisterPackageArgs) -> anyhow::Result<ExitCode> {
    let RegisterPackageArgs { package: PackageIdArgs { name, version, kind, policy }, sha256, size, object_key } = args;
    let kind: pb::PackageKind = kind.parse()?;
    let pkg = pb::Package { name, version, kind: kind as i32, sha256, size, object_key };
    let checked = Package::try_from(pkg.clone()).context("invalid package")?;
    let policy = policy.policy()?;
    let bus = connect(url).await?;
    let env = Envelope::root();
    let policy_text = match &policy {
        Some(p) if p.enabled => "; auto-rollout on (landfall rollout list shows what it starts)",
        Some(_) => "; auto-rollout off",
        None => "",
    };
    bus.publish_command(&pb::RegisterPackage { package: Some(pkg), auto_rollout: policy }, &env).await?;
    println!("RegisterPackage {}@{} published (id {}){policy_text}", checked.name, checked.version, env.id);
    Ok(ExitCode::SUCCESS)
}

/// The auto-rollout policy the flags of `package register` / `package upload` set, if any.
impl crate::PolicyArgs {
    pub fn policy(&self) -> anyhow::Result<Option<pb::AutoRollout>> {
        let (auto_rollout, no_auto_rollout, rollout) = (self.auto_rollout, self.no_auto_rollout, &self.rollout);
        Ok(match (auto_rollout, no_auto_rollout) {
            (true, _) => Some(rollout.auto_rollout()?),
            (false, true) if !rollout.is_empty() => {
                bail!("--no-auto-rollout turns the policy off: it takes no selector or strategy flags")
            }
            (false, true) => Some(pb::AutoRollout { enabled: false, selector: None, strategy: None }),
            (false, false) if !rollout.is_empty() => {
                bail!("the selector and strategy flags set an auto-rollout policy: add --auto-rollout")
            }
            (false, false) => None,
        })
    }
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

    let mut bars = crate::progress::wanted(args.output).then(|| crate::progress::InstallBars::new(site.as_str()));
    let verdict = follow(reader, &env.id, args.timeout, |next| {
        match (args.output, bars.as_mut()) {
            (Format::Table, Some(bars)) => bars.on_event(next),
            (Format::Table, None) => eprintln!("{}", event_line(next)),
            (format, _) => crate::output::emit_line(format, &event_json(next))?,
        }
        install_verdict(next)
    })
    .await?;
    Ok(verdict.unwrap_or_else(|| {
        eprintln!("gave up waiting after {:?}; the install goes on (landfall status {site})", args.timeout);
        ExitCode::from(EXIT_TIMEOUT)
    }))
}

/// Reads events until `verdict` ends the wait (with an exit code, say) on one correlated with
/// `correlation`; `None` when `timeout` runs out first.
pub(crate) async fn follow<T>(
    reader: &mut EventReader,
    correlation: &str,
    timeout: std::time::Duration,
    mut verdict: impl FnMut(&ReadEvent) -> anyhow::Result<Option<T>>,
) -> anyhow::Result<Option<T>> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let next = match tokio::time::timeout_at(deadline, reader.next()).await {
            Err(_) => return Ok(None),
            Ok(None) => bail!("the event stream ended"),
            Ok(Some(e)) => e?,
        };
        if next.delivery.envelope.correlation != correlation {
            continue;
        }
        if let Some(code) = verdict(&next)? {
            return Ok(Some(code));
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
        pb::CommandRejected::TYPE => Some(rejected(d)?),
        _ => None,
    })
}

/// Says why a command was rejected; the exit code for it.
pub(crate) fn rejected(d: &bus_schema::runtime::Delivery) -> anyhow::Result<ExitCode> {
    let r: pb::CommandRejected = d.decode().map_err(|e| anyhow::anyhow!("{e}"))?;
    eprintln!("rejected: {}", r.reason);
    Ok(ExitCode::from(EXIT_REJECTED))
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
            Format::Json | Format::Yaml => crate::output::emit_line(args.output, &event_json(&e))?,
            Format::Table => println!("{}", event_line(&e)),
        }
        if !args.follow && e.pending == 0 {
            break;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// One site's state: its design, its latest install, and what its nodes run, as JSON.
async fn site_status(
    bus: &Bus,
    site: &str,
    observed: &[pb::NodeObserved],
) -> anyhow::Result<Option<serde_json::Value>> {
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
    let observed: Vec<&pb::NodeObserved> = observed.iter().filter(|o| o.site_id == site).collect();
    Ok(Some(json!({
        "site": site,
        "design_revision": revision,
        "labels": design.labels,
        "nodes": design.nodes.len(),
        "install": install,
        "observed": observed_json(&design, &observed),
    })))
}

/// What the design wants each node of `role` to run: package name → version.
pub fn desired_versions(design: &pb::SiteDesign, role: i32) -> BTreeMap<&str, &str> {
    design
        .packages
        .iter()
        .filter(|rp| rp.role == role)
        .flat_map(|rp| rp.packages.iter().map(|p| (p.name.as_str(), p.version.as_str())))
        .collect()
}

/// One package a node runs, as observed, with the version the design wants and whether they differ.
pub fn observed_package_json(name: &str, version: &str, kind: i32, wants: &BTreeMap<&str, &str>) -> serde_json::Value {
    let desired = wants.get(name).copied();
    json!({
        "name": name,
        "version": version,
        "kind": kind_label(kind),
        "desired": desired,
        "differs": desired.is_some_and(|d| d != version),
    })
}

/// Per node of the design (then any other node observed at the site): the packages it runs
/// as its gateway last reported, each with the version the design wants when it differs.
pub fn observed_json(design: &pb::SiteDesign, observed: &[&pb::NodeObserved]) -> serde_json::Value {
    let by_node: BTreeMap<&str, &pb::NodeObserved> = observed.iter().map(|o| (o.node.as_str(), *o)).collect();
    let mut nodes: Vec<(&str, i32)> = design.nodes.iter().map(|n| (n.name.as_str(), n.role)).collect();
    let in_design: BTreeSet<&str> = nodes.iter().map(|(n, _)| *n).collect();
    nodes.extend(observed.iter().filter(|o| !in_design.contains(o.node.as_str())).map(|o| (o.node.as_str(), o.role)));
    let out: Vec<serde_json::Value> = nodes
        .into_iter()
        .map(|(node, role)| {
            let wants = desired_versions(design, role);
            let Some(o) = by_node.get(node) else {
                return json!({ "node": node, "role": role_label(role), "observed": false, "packages": [] });
            };
            let packages: Vec<serde_json::Value> =
                o.packages.iter().map(|p| observed_package_json(&p.name, &p.version, p.kind, &wants)).collect();
            json!({
                "node": node,
                "role": role_label(role),
                "observed": true,
                "in_design": in_design.contains(node),
                "updated": rfc3339_ms(o.updated_unix_ms),
                "packages": packages,
            })
        })
        .collect();
    serde_json::Value::Array(out)
}

/// One observed package for people: `kubelet 1.29.2`, or `kubelet 1.29.2 (wants 1.30.0)`.
pub fn package_text(name: &str, version: &str, desired: Option<&str>) -> String {
    match desired {
        Some(d) if d != version => format!("{name} {version} (wants {d})"),
        _ => format!("{name} {version}"),
    }
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
    // One pass over what nodes run: one site's keys, or every key when showing every site.
    let observed_kv = bus.kv(names::OBSERVED_BUCKET).await?;
    let prefix = match &args.site {
        Some(_) => keys::observed_site_prefix(&sites[0]),
        None => keys::OBSERVED_PREFIX.to_string(),
    };
    let observed = observed_nodes(&observed_kv, &prefix).await?;
    let mut all = Vec::new();
    for site in &sites {
        match site_status(&bus, site, &observed).await? {
            Some(s) => all.push(s),
            None if args.site.is_some() => bail!("site {site} is not registered"),
            None => {}
        }
    }
    match args.output {
        Format::Json | Format::Yaml => crate::output::emit(args.output, &serde_json::to_value(&all)?)?,
        Format::Table => print_status(&all, args.site.is_some()),
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
            print_observed(&s["observed"]);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn design() -> pb::SiteDesign {
        let node =
            |name: &str, role: pb::Role| pb::NodeSpec { name: name.into(), role: role as i32, ..Default::default() };
        let kubelet = |v: &str| vec![pb::PackageRef { name: "kubelet".into(), version: v.into() }];
        pb::SiteDesign {
            site_id: "edge-01".into(),
            nodes: vec![
                node("node-1", pb::Role::Master),
                node("node-2", pb::Role::Worker),
                node("node-3", pb::Role::Worker),
            ],
            packages: vec![
                pb::RolePackages { role: pb::Role::Master as i32, packages: kubelet("1.30.0") },
                pb::RolePackages { role: pb::Role::Worker as i32, packages: kubelet("1.29.2") },
            ],
            ..Default::default()
        }
    }

    fn observed(node: &str, packages: &[(&str, &str)]) -> pb::NodeObserved {
        pb::NodeObserved {
            site_id: "edge-01".into(),
            node: node.into(),
            packages: packages
                .iter()
                .map(|(n, v)| pb::ObservedPackage {
                    name: n.to_string(),
                    version: v.to_string(),
                    kind: pb::PackageKind::Binary as i32,
                })
                .collect(),
            updated_unix_ms: 1_700_000_000_000,
            ..Default::default()
        }
    }

    #[test]
    fn observed_versions_are_marked_where_they_differ_from_the_design() {
        let (n1, n2, stray) = (
            observed("node-1", &[("kubelet", "1.29.2"), ("ubuntu", "22.04")]),
            observed("node-2", &[("kubelet", "1.29.2")]),
            observed("node-9", &[]),
        );
        let v = observed_json(&design(), &[&n1, &n2, &stray]);
        assert_eq!(v[0]["packages"][0]["desired"], "1.30.0");
        assert_eq!(v[0]["packages"][0]["differs"], true);
        assert_eq!(v[0]["packages"][1]["desired"], serde_json::Value::Null, "not in the design");
        assert_eq!(v[0]["packages"][1]["differs"], false);
        assert_eq!(v[1]["packages"][0]["differs"], false);
        assert_eq!(v[1]["role"], "worker");
        assert_eq!(v[2]["observed"], false, "node-3 never reported");
        assert_eq!((v[3]["node"].as_str(), v[3]["in_design"].as_bool()), (Some("node-9"), Some(false)));
        assert_eq!(v[0]["updated"], "2023-11-14T22:13:20Z");
    }

    #[test]
    fn packages_read_as_people_say_them() {
        assert_eq!(package_text("kubelet", "1.29.2", Some("1.30.0")), "kubelet 1.29.2 (wants 1.30.0)");
        assert_eq!(package_text("kubelet", "1.30.0", Some("1.30.0")), "kubelet 1.30.0");
        assert_eq!(package_text("ubuntu", "22.04", None), "ubuntu 22.04");
    }
}
