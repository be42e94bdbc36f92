//! Fleet commands: the package catalog (`package list`), rollouts (`package patch`,
//! `rollout list/show/pause/resume/cancel`), and hosts arriving at simulated sites
//! (`node add`). Like [`crate::client`], they use `bus-schema` alone.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, bail};
use async_nats::jetstream::consumer::DeliverPolicy;
use bus_schema::domain::{self, InvalidField, MacAddress, NodeDesign, PackageName, SiteId, Version};
use bus_schema::ids;
use bus_schema::names::{self, keys};
use bus_schema::pb::{self, BusCommand, BusMessage};
use bus_schema::rollout::{self, Direction, Plan, Strategy};
use bus_schema::runtime::{Bus, Delivery, Envelope, EventReader, Kv, RequestError};
use serde_json::{Value, json};

use crate::client::{EXIT_REJECTED, EXIT_TIMEOUT, connect};
use crate::output::{event_json, event_line, human_duration_ms, human_size, rfc3339_ms};
use crate::{Format, NodeAddArgs, NodeRole, OnWaveTimeout, PatchArgs, RolloutArgs, RolloutCommand};

// --- arguments ----------------------------------------------------------------------------

/// Parses one `KEY=VALUE` of `--labels`.
pub fn parse_label(s: &str) -> Result<(String, String), String> {
    let (k, v) = s.split_once('=').ok_or_else(|| format!("{s:?} is not KEY=VALUE"))?;
    let (k, v) = (k.trim(), v.trim());
    if k.is_empty() {
        return Err(format!("{s:?} has no key (KEY=VALUE)"));
    }
    Ok((k.to_string(), v.to_string()))
}

/// Site ids given on the command line, checked, each once.
fn site_ids(ids: &[String], flag: &str) -> anyhow::Result<Vec<String>> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::with_capacity(ids.len());
    for id in ids.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        let id = SiteId::try_from(id).map_err(|e| anyhow!("{flag}: {}", e.reason))?;
        if !seen.insert(id.to_string()) {
            bail!("{flag}: {id} is given twice");
        }
        out.push(id.to_string());
    }
    Ok(out)
}

/// The flag a strategy field comes from, for error messages.
fn flag_of(field: &str) -> &str {
    match field.strip_prefix("strategy.").unwrap_or(field) {
        "canary" => "--canary/--canary-sites",
        "canary_site_ids" => "--canary-sites",
        "max_unavailable" => "--max-unavailable",
        "failure_threshold" => "--failure-threshold",
        "on_wave_timeout" => "--on-wave-timeout",
        "site_ids" | "selector.site_ids" => "--sites",
        other => other,
    }
}

fn invalid(e: InvalidField) -> anyhow::Error {
    anyhow!("{}: {}", flag_of(&e.field), e.reason)
}

impl RolloutArgs {
    /// Whether any selector or strategy flag was given.
    pub fn is_empty(&self) -> bool {
        self.sites.is_empty()
            && self.labels.is_empty()
            && self.canary.is_none()
            && self.canary_sites.is_empty()
            && self.max_concurrent_sites.is_none()
            && self.max_unavailable.is_none()
            && self.failure_threshold.is_none()
            && self.wave_timeout.is_none()
            && self.on_wave_timeout.is_none()
    }

    /// The sites the flags select (every site when none is given).
    ///
    /// # Errors
    /// An invalid or repeated site id, or a label key given twice with different values.
    pub fn selector(&self) -> anyhow::Result<pb::SiteSelector> {
        let site_ids = site_ids(&self.sites, "--sites")?;
        let mut labels = HashMap::new();
        for (k, v) in &self.labels {
            if let Some(old) = labels.insert(k.clone(), v.clone())
                && old != *v
            {
                bail!("--labels: {k} is given twice ({k}={old}, {k}={v})");
            }
        }
        Ok(pb::SiteSelector { site_ids, labels })
    }

    /// The strategy the flags say, checked as the orchestrator will check it.
    ///
    /// # Errors
    /// Whatever [`Strategy::try_from`] refuses, named by its flag.
    pub fn strategy(&self) -> anyhow::Result<(pb::RolloutStrategy, Strategy)> {
        let wave_timeout_seconds = match self.wave_timeout {
            None => 0,
            Some(d) if d < Duration::from_secs(1) => {
                bail!("--wave-timeout must be at least 1s (leave it out for no limit)")
            }
            Some(d) => u32::try_from(d.as_secs()).map_err(|_| anyhow!("--wave-timeout {d:?} is too long"))?,
        };
        let on_wave_timeout = match self.on_wave_timeout {
            None => pb::WaveTimeoutAction::Unspecified,
            Some(OnWaveTimeout::Continue) => pb::WaveTimeoutAction::Continue,
            Some(OnWaveTimeout::Abort) => pb::WaveTimeoutAction::Abort,
        };
        let s = pb::RolloutStrategy {
            canary_site_ids: site_ids(&self.canary_sites, "--canary-sites")?,
            canary_sites: self.canary.unwrap_or(0),
            max_concurrent_sites: self.max_concurrent_sites.unwrap_or(0),
            max_unavailable: self.max_unavailable.clone().unwrap_or_default(),
            failure_threshold: self.failure_threshold.clone().unwrap_or_default(),
            wave_timeout_seconds,
            on_wave_timeout: on_wave_timeout as i32,
        };
        let checked = Strategy::try_from(&s).map_err(invalid)?;
        Ok((s, checked))
    }

    /// An enabled auto-rollout policy with this selector and strategy.
    ///
    /// # Errors
    /// See [`RolloutArgs::selector`] and [`RolloutArgs::strategy`].
    pub fn auto_rollout(&self) -> anyhow::Result<pb::AutoRollout> {
        Ok(pb::AutoRollout { enabled: true, selector: Some(self.selector()?), strategy: Some(self.strategy()?.0) })
    }
}

// --- package list -------------------------------------------------------------------------

/// One catalog entry as `package list` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct CatalogRow {
    pub package: pb::Package,
    pub auto_rollout: bool,
}

/// Catalog entries sorted by name then version, each with whether its name rolls out on its own.
pub fn catalog_rows(mut packages: Vec<pb::Package>, policies: &[pb::PackagePolicy]) -> Vec<CatalogRow> {
    let auto: BTreeSet<&str> = policies
        .iter()
        .filter(|p| p.auto_rollout.as_ref().is_some_and(|a| a.enabled))
        .map(|p| p.name.as_str())
        .collect();
    packages.sort_by(|a, b| {
        a.name
            .cmp(&b.name)
            .then_with(|| rollout::version_cmp(&a.version, &b.version))
            .then_with(|| a.version.cmp(&b.version))
    });
    packages.into_iter().map(|p| CatalogRow { auto_rollout: auto.contains(p.name.as_str()), package: p }).collect()
}

/// A package kind as people say it (`os-image`), for tables and JSON views.
pub(crate) fn kind_label(kind: i32) -> &'static str {
    pb::PackageKind::try_from(kind).map(pb::PackageKind::label).unwrap_or("unspecified")
}

/// A role as people say it (`master`), for tables and JSON views.
pub(crate) fn role_label(role: i32) -> &'static str {
    pb::Role::try_from(role).map(pb::Role::label).unwrap_or("unspecified")
}

pub fn catalog_json(rows: &[CatalogRow]) -> Value {
    Value::Array(
        rows.iter()
            .map(|r| {
                let p = &r.package;
                json!({
                    "name": p.name,
                    "version": p.version,
                    "kind": kind_label(p.kind),
                    "size": p.size,
                    "sha256": p.sha256,
                    "object_key": p.object_key,
                    "auto_rollout": r.auto_rollout,
                })
            })
            .collect(),
    )
}

pub fn catalog_text(rows: &[CatalogRow]) -> String {
    if rows.is_empty() {
        return "the catalog is empty (landfall package register …)\n".to_string();
    }
    let mut out = String::new();
    let w = rows.iter().map(|r| r.package.name.len()).max().unwrap_or(0).max(4);
    let v = rows.iter().map(|r| r.package.version.len()).max().unwrap_or(0).max(7);
    let _ = writeln!(
        out,
        "{:<w$}  {:<v$}  {:<9}  {:>10}  {:<12}  AUTO-ROLLOUT",
        "NAME", "VERSION", "KIND", "SIZE", "SHA256"
    );
    for r in rows {
        let p = &r.package;
        let sha: String = p.sha256.chars().take(12).collect();
        let auto = if r.auto_rollout { "yes" } else { "-" };
        let _ = writeln!(
            out,
            "{:<w$}  {:<v$}  {:<9}  {:>10}  {:<12}  {auto}",
            p.name,
            p.version,
            kind_label(p.kind),
            human_size(p.size),
            sha
        );
    }
    out
}

pub async fn package_list(url: &str, output: Format) -> anyhow::Result<ExitCode> {
    let bus = connect(url).await?;
    let kv = bus.kv(names::PACKAGES_BUCKET).await?;
    let packages = kv.scan::<pb::Package>(keys::PACKAGE_PREFIX).await?.into_iter().map(|(_, p, _)| p).collect();
    let policies: Vec<pb::PackagePolicy> =
        kv.scan::<pb::PackagePolicy>(keys::POLICY_PREFIX).await?.into_iter().map(|(_, p, _)| p).collect();
    let rows = catalog_rows(packages, &policies);
    match output {
        Format::Json | Format::Yaml => crate::output::emit(output, &catalog_json(&rows))?,
        Format::Table => print!("{}", catalog_text(&rows)),
    }
    Ok(ExitCode::SUCCESS)
}

// --- package patch ------------------------------------------------------------------------

/// The plan as JSON: totals, then per wave its sites and their nodes, from → to.
pub fn plan_json(name: &str, version: &str, plan: &Plan) -> Value {
    let waves: Vec<Value> = (0..plan.wave_ends.len())
        .map(|w| {
            let sites = &plan.sites[plan.wave(w)];
            let sites: Vec<Value> = sites
                .iter()
                .map(|s| {
                    let nodes: Vec<Value> = s
                        .nodes
                        .iter()
                        .map(|n| {
                            json!({
                                "node": n.spec.name,
                                "role": role_label(n.spec.role),
                                "from_version": n.from_version,
                                "to_version": version,
                            })
                        })
                        .collect();
                    json!({ "site": s.site, "canary": s.canary, "nodes": nodes })
                })
                .collect();
            json!({ "wave": w + 1, "canary": plan.sites[plan.wave(w)].iter().all(|s| s.canary), "sites": sites })
        })
        .collect();
    json!({
        "package": { "name": name, "version": version },
        "sites": plan.sites.len(),
        "planned_nodes": plan.planned_nodes,
        "nodes_at_target": plan.nodes_at_target,
        "nodes_not_installed": plan.nodes_not_installed,
        "failure_threshold": plan.failure_threshold,
        "waves": waves,
    })
}

fn plural(n: impl Into<u64>, one: &str, many: &str) -> String {
    let n = n.into();
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The plan for people: per wave its sites (canaries marked), their nodes from → to, totals.
pub fn plan_text(name: &str, version: &str, plan: &Plan) -> String {
    let mut out = String::new();
    let waves = plan.wave_ends.len();
    if plan.sites.is_empty() {
        let _ = writeln!(out, "{name} → {version}: nothing to patch (no selected node runs {name} at another version)");
    } else {
        let _ = writeln!(
            out,
            "{name} → {version}: {} on {}, in {}",
            plural(plan.planned_nodes, "node", "nodes"),
            plural(plan.sites.len() as u64, "site", "sites"),
            plural(waves as u64, "wave", "waves"),
        );
    }
    for w in 0..waves {
        let sites = &plan.sites[plan.wave(w)];
        let canary = if sites.iter().all(|s| s.canary) { " (canary)" } else { "" };
        let _ = writeln!(out, "\nwave {} of {waves}{canary}: {}", w + 1, plural(sites.len() as u64, "site", "sites"));
        for s in sites {
            let mark = if s.canary { " (canary)" } else { "" };
            let _ = writeln!(out, "  {}{mark}: {}", s.site, plural(s.nodes.len() as u64, "node", "nodes"));
            let width = s.nodes.iter().map(|n| n.spec.name.len()).max().unwrap_or(0);
            for n in &s.nodes {
                let from = if n.from_version.is_empty() { "(none)" } else { n.from_version.as_str() };
                let _ =
                    writeln!(out, "    {:<width$}  {:<6}  {from} → {version}", n.spec.name, role_label(n.spec.role));
            }
        }
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "planned nodes      {}", plan.planned_nodes);
    let _ = writeln!(out, "at {version:<15} {}  (left alone)", plan.nodes_at_target);
    let _ =
        writeln!(out, "not installed      {}  (nothing observed yet: left to their install)", plan.nodes_not_installed);
    let _ = writeln!(
        out,
        "failure threshold  {}  (the rollout halts when more than {} fail)",
        plan.failure_threshold,
        plural(plan.failure_threshold, "node", "nodes")
    );
    out
}

/// Every registered site design that validates (others are reported and left out).
async fn registered_sites(bus: &Bus) -> anyhow::Result<Vec<domain::SiteDesign>> {
    let kv = bus.kv(names::SITES_BUCKET).await?;
    let mut sites = Vec::new();
    for (key, design, _) in kv.scan::<pb::SiteDesign>(keys::SITE_PREFIX).await? {
        match domain::SiteDesign::try_from(design) {
            Ok(d) => sites.push(d),
            Err(e) => eprintln!("warning: leaving out {key}, which is not a valid site design: {e}"),
        }
    }
    Ok(sites)
}

/// What every node runs of one package, by (site, node), as observed.
async fn observed_package(bus: &Bus, name: &str) -> anyhow::Result<BTreeMap<(String, String), String>> {
    let observed = bus.kv(names::OBSERVED_BUCKET).await?;
    Ok(observed
        .scan_matching::<pb::ObservedVersion>(&keys::observed_package_everywhere(name))
        .await?
        .into_iter()
        .map(|(_, v, _)| ((v.site_id, v.node), v.version))
        .collect())
}

async fn dry_run(
    bus: &Bus,
    name: &PackageName,
    version: &Version,
    direction: Direction,
    selector: &pb::SiteSelector,
    strategy: &Strategy,
    output: Format,
) -> anyhow::Result<ExitCode> {
    let packages = bus.kv(names::PACKAGES_BUCKET).await?;
    if packages.get::<pb::Package>(&keys::package(name.as_str(), version.as_str())).await?.is_none() {
        bail!("{name}@{version} is not in the catalog");
    }
    let sites = registered_sites(bus).await?;
    // Read as the orchestrator reads it, so the dry run plans what the rollout would.
    let versions: rollout::ObservedVersions = observed_package(bus, name.as_str())
        .await?
        .into_iter()
        .map(|(site_node, version)| (site_node, Some(version)))
        .collect();
    let plan = rollout::plan_with(name, version, direction, selector, strategy, &sites, &versions)
        .map_err(|e| invalid(e).context("cannot plan"))?;
    if rollout::select(selector, &sites).is_ok_and(|s| s.is_empty()) {
        eprintln!("note: no registered site matches the selector");
    }
    match output {
        Format::Json | Format::Yaml => crate::output::emit(output, &plan_json(name.as_str(), version.as_str(), &plan))?,
        Format::Table => print!("{}", plan_text(name.as_str(), version.as_str(), &plan)),
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn patch(url: &str, args: &PatchArgs) -> anyhow::Result<ExitCode> {
    let name = PackageName::try_from(args.name.as_str()).map_err(|e| anyhow!("invalid package {e}"))?;
    let version = Version::try_from(args.version.as_str()).map_err(|e| anyhow!("invalid package {e}"))?;
    let selector = args.rollout.selector()?;
    let (strategy, checked) = args.rollout.strategy()?;
    let bus = connect(url).await?;
    if args.dry_run {
        let direction = if args.only_older { Direction::OnlyOlder } else { Direction::Any };
        return dry_run(&bus, &name, &version, direction, &selector, &checked, args.output).await;
    }
    // No catalog check here: a RegisterPackage published just before may not be handled yet,
    // and the orchestrator handles the two in order (and rejects an unknown version).
    let env = args.id.map(Envelope::root_with_id).unwrap_or_else(Envelope::root);
    let filters = vec![names::scope_events(names::FLEET)];
    // Subscribe before publishing, so no event of this rollout can slip by.
    let mut reader = match args.wait {
        true => Some(bus.read_events(filters.clone(), DeliverPolicy::New).await?),
        false => None,
    };
    let cmd = pb::PatchPackage {
        name: name.to_string(),
        version: version.to_string(),
        selector: Some(selector),
        strategy: Some(strategy),
        only_older: args.only_older,
        trigger: String::new(),
    };
    let ack = bus.publish_command(&cmd, &env).await?;
    let dup = if ack.duplicate { " (duplicate id: already published)" } else { "" };
    eprintln!("PatchPackage {name}@{version} published on {}{dup}; the rollout id is its id", cmd.subject());
    match args.output {
        Format::Json | Format::Yaml => crate::output::emit_line(
            args.output,
            &json!({ "rollout_id": env.id, "subject": cmd.subject(), "duplicate": ack.duplicate, "seq": ack.sequence }),
        )?,
        Format::Table => println!("{}", env.id),
    }
    if ack.duplicate && reader.is_some() {
        // The rollout started with the first publish: follow it from the start.
        reader = Some(bus.read_events(filters, DeliverPolicy::All).await?);
    }
    let Some(reader) = reader.as_mut() else { return Ok(ExitCode::SUCCESS) };
    follow_rollout(reader, &env.id, args.timeout, args.output).await
}

async fn follow_rollout(
    reader: &mut EventReader,
    id: &str,
    timeout: Duration,
    output: Format,
) -> anyhow::Result<ExitCode> {
    let deadline = tokio::time::Instant::now() + timeout;
    // The plan says which sites each wave has (RolloutWaveStarted does not list them).
    let mut planned: Option<pb::RolloutPlanned> = None;
    let mut bars = crate::progress::wanted(output).then(|| crate::progress::RolloutBars::new(id));
    loop {
        let next = match tokio::time::timeout_at(deadline, reader.next()).await {
            Err(_) => {
                eprintln!("gave up waiting after {timeout:?}; the rollout goes on (landfall rollout show {id})");
                return Ok(ExitCode::from(EXIT_TIMEOUT));
            }
            Ok(None) => bail!("the event stream ended"),
            Ok(Some(e)) => e?,
        };
        let Some(event) = RolloutEvent::of(&next.delivery, id) else { continue };
        match (output, bars.as_mut()) {
            (Format::Table, Some(bars)) => bars.on_event(&event),
            (Format::Table, None) => eprintln!("{}", event.line(planned.as_ref())),
            (format, _) => crate::output::emit_line(format, &event_json(&next))?,
        }
        if let RolloutEvent::Planned(p) = &event {
            planned = Some(p.clone());
        }
        if let Some(code) = event.exit_code() {
            return Ok(ExitCode::from(code));
        }
    }
}

/// A fleet event that tells how a rollout goes, or the rejection of the command that started it.
#[derive(Debug, Clone, PartialEq)]
pub enum RolloutEvent {
    Planned(pb::RolloutPlanned),
    WaveStarted(pb::RolloutWaveStarted),
    Progress(pb::RolloutProgress),
    Halted(pb::RolloutHalted),
    Paused(pb::RolloutPaused),
    Resumed(pb::RolloutResumed),
    Cancelled(pb::RolloutCancelled),
    Completed(pb::RolloutCompleted),
    Rejected(pb::CommandRejected),
}

impl RolloutEvent {
    /// The event, when it is about rollout `id` (by its rollout id or its correlation id), or
    /// rejects the command with id `id`.
    pub fn of(d: &Delivery, id: &str) -> Option<Self> {
        let event = match d.type_name.as_str() {
            pb::RolloutPlanned::TYPE => Self::Planned(d.decode().ok()?),
            pb::RolloutWaveStarted::TYPE => Self::WaveStarted(d.decode().ok()?),
            pb::RolloutProgress::TYPE => Self::Progress(d.decode().ok()?),
            pb::RolloutHalted::TYPE => Self::Halted(d.decode().ok()?),
            pb::RolloutPaused::TYPE => Self::Paused(d.decode().ok()?),
            pb::RolloutResumed::TYPE => Self::Resumed(d.decode().ok()?),
            pb::RolloutCancelled::TYPE => Self::Cancelled(d.decode().ok()?),
            pb::RolloutCompleted::TYPE => Self::Completed(d.decode().ok()?),
            pb::CommandRejected::TYPE => Self::Rejected(d.decode().ok()?),
            _ => return None,
        };
        let ours = match &event {
            Self::Rejected(r) => r.command_id == id,
            other => other.rollout_id() == id || d.envelope.correlation == id,
        };
        ours.then_some(event)
    }

    fn rollout_id(&self) -> &str {
        match self {
            Self::Planned(e) => &e.rollout_id,
            Self::WaveStarted(e) => &e.rollout_id,
            Self::Progress(e) => &e.rollout_id,
            Self::Halted(e) => &e.rollout_id,
            Self::Paused(e) => &e.rollout_id,
            Self::Resumed(e) => &e.rollout_id,
            Self::Cancelled(e) => &e.rollout_id,
            Self::Completed(e) => &e.rollout_id,
            Self::Rejected(e) => &e.command_id,
        }
    }

    /// Whether `--wait` ends here, and with which exit code: 0 completed with every planned
    /// node patched, 1 completed with failures, halted or cancelled, 2 rejected.
    pub fn exit_code(&self) -> Option<u8> {
        match self {
            Self::Completed(c) if c.failed == 0 => Some(0),
            Self::Completed(_) | Self::Halted(_) | Self::Cancelled(_) => Some(1),
            Self::Rejected(_) => Some(EXIT_REJECTED),
            _ => None,
        }
    }

    /// One progress line for people; `plan` (the rollout's RolloutPlanned) names each wave's
    /// sites and counts its waves.
    pub fn line(&self, plan: Option<&pb::RolloutPlanned>) -> String {
        match self {
            Self::Planned(p) => {
                let pkg = p.package.clone().unwrap_or_default();
                format!(
                    "planned: {} → {}: {} on {} in {} ({} at {} already, {} not installed; halts when more than {} fail){}",
                    pkg.name,
                    pkg.version,
                    plural(p.planned_nodes, "node", "nodes"),
                    plural(p.sites.len() as u64, "site", "sites"),
                    plural(p.waves, "wave", "waves"),
                    p.nodes_at_target,
                    pkg.version,
                    p.nodes_not_installed,
                    plural(p.failure_threshold, "node", "nodes"),
                    if p.trigger.is_empty() { String::new() } else { format!(" [{}]", p.trigger) },
                )
            }
            Self::WaveStarted(w) => {
                const SHOWN: usize = 8;
                let sites: Vec<&str> = match plan {
                    Some(p) if w.site_ids.is_empty() => {
                        p.sites.iter().filter(|s| s.wave == w.wave).map(|s| s.site_id.as_str()).collect()
                    }
                    _ => w.site_ids.iter().map(String::as_str).collect(),
                };
                let mut names = sites.iter().take(SHOWN).copied().collect::<Vec<_>>().join(",");
                if sites.len() > SHOWN {
                    let _ = write!(names, " and {} more", sites.len() - SHOWN);
                }
                let of = plan.map(|p| format!(" of {}", p.waves)).unwrap_or_default();
                let canary = if w.canary { " (canary)" } else { "" };
                match sites.len() {
                    0 => format!("wave {}{of} started{canary}", w.wave + 1),
                    n => format!(
                        "wave {}{of} started{canary}: {}: {names}",
                        w.wave + 1,
                        plural(n as u64, "site", "sites")
                    ),
                }
            }
            Self::Progress(p) => format!(
                "progress: wave {}: {}/{} nodes patched, {} failed; {}/{} sites done",
                p.wave + 1,
                p.patched,
                p.planned_nodes,
                p.failed,
                p.sites_done,
                p.sites_total
            ),
            Self::Halted(h) => format!(
                "halted in wave {}: {} ({} patched, {} failed; landfall rollout resume {} goes on)",
                h.wave + 1,
                h.reason,
                h.patched,
                h.failed,
                h.rollout_id
            ),
            Self::Paused(p) if p.reason.is_empty() => "paused".to_string(),
            Self::Paused(p) => format!("paused: {}", p.reason),
            Self::Resumed(_) => "resumed".to_string(),
            Self::Cancelled(c) => {
                let reason = if c.reason.is_empty() { String::new() } else { format!(": {}", c.reason) };
                format!("cancelled{reason} ({} patched, {} failed)", c.patched, c.failed)
            }
            Self::Completed(c) => format!(
                "completed: {}/{} nodes patched, {} failed, on {} in {}",
                c.patched,
                c.planned_nodes,
                c.failed,
                plural(c.sites, "site", "sites"),
                human_duration_ms(c.duration_ms)
            ),
            Self::Rejected(r) => format!("rejected: {}", r.reason),
        }
    }
}

// --- rollout list / show / pause / resume / cancel ----------------------------------------

pub async fn rollout(url: &str, cmd: RolloutCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        RolloutCommand::List { output } => rollout_list(url, output).await,
        RolloutCommand::Show { id, output } => rollout_show(url, &id, output).await,
        RolloutCommand::Pause { id, reason } => control(url, &id, Control::Pause(reason)).await,
        RolloutCommand::Resume { id } => control(url, &id, Control::Resume).await,
        RolloutCommand::Cancel { id, reason } => control(url, &id, Control::Cancel(reason)).await,
    }
}

/// A rollout id as given on the command line: a UUID.
pub(crate) fn rollout_id(id: &str) -> anyhow::Result<String> {
    let id = uuid::Uuid::parse_str(id.trim())
        .map_err(|_| anyhow!("{id:?} is not a rollout id (a UUID, as `landfall rollout list` shows)"))?;
    Ok(id.to_string())
}

async fn get_rollout(sagas: &Kv, id: &str) -> anyhow::Result<pb::Rollout> {
    match sagas.get::<pb::Rollout>(&keys::rollout(id)).await? {
        Some((r, _)) => Ok(r),
        None => bail!("there is no rollout {id} (landfall rollout list shows them all)"),
    }
}

fn phase_of(r: &pb::Rollout) -> pb::RolloutPhase {
    pb::RolloutPhase::try_from(r.phase).unwrap_or(pb::RolloutPhase::Unspecified)
}

fn phase_label(r: &pb::Rollout) -> String {
    phase_of(r).as_str_name().trim_start_matches("ROLLOUT_PHASE_").to_lowercase()
}

/// `k/n` for the current wave (1-based), or `-` when the plan has no wave.
fn wave_text(r: &pb::Rollout) -> String {
    let waves = r.wave_ends.len();
    match waves {
        0 => "-".to_string(),
        _ => format!("{}/{waves}", (r.wave as usize + 1).min(waves)),
    }
}

fn package_of(r: &pb::Rollout) -> (String, String) {
    let p = r.package.clone().unwrap_or_default();
    (p.name, p.version)
}

/// One rollout's headline numbers, as `rollout list -o json` gives them.
pub fn rollout_summary_json(r: &pb::Rollout) -> Value {
    let (name, version) = package_of(r);
    json!({
        "id": r.rollout_id,
        "package": name,
        "version": version,
        "phase": phase_label(r),
        "reason": r.reason,
        "planned_nodes": r.planned_nodes,
        "patched": r.patched,
        "failed": r.failed,
        "sites": r.sites,
        "sites_done": r.sites_done,
        "wave": (r.wave as usize + 1).min(r.wave_ends.len()),
        "waves": r.wave_ends.len(),
        "trigger": r.trigger,
        "started": rfc3339_ms(r.started_unix_ms),
        "finished": rfc3339_ms(r.finished_unix_ms),
        "started_unix_ms": r.started_unix_ms,
        "finished_unix_ms": r.finished_unix_ms,
    })
}

/// Newest first: by start time, then by id (UUIDv7 ids sort by time too).
pub fn sort_newest_first(rollouts: &mut [pb::Rollout]) {
    rollouts.sort_by(|a, b| b.started_unix_ms.cmp(&a.started_unix_ms).then_with(|| b.rollout_id.cmp(&a.rollout_id)));
}

pub fn rollouts_text(rollouts: &[pb::Rollout]) -> String {
    if rollouts.is_empty() {
        return "no rollouts (landfall package patch NAME VERSION starts one)\n".to_string();
    }
    let pkgs: Vec<String> = rollouts
        .iter()
        .map(|r| {
            let (n, v) = package_of(r);
            format!("{n}@{v}")
        })
        .collect();
    let pw = pkgs.iter().map(String::len).max().unwrap_or(0).max(7);
    let tw = rollouts.iter().map(|r| r.trigger.len()).max().unwrap_or(0).max(7);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<36}  {:<pw$}  {:<9}  {:>11}  {:>6}  {:>11}  {:>5}  {:<tw$}  STARTED",
        "ID", "PACKAGE", "PHASE", "PATCHED", "FAILED", "SITES DONE", "WAVE", "TRIGGER"
    );
    for (r, pkg) in rollouts.iter().zip(&pkgs) {
        let _ = writeln!(
            out,
            "{:<36}  {:<pw$}  {:<9}  {:>11}  {:>6}  {:>11}  {:>5}  {:<tw$}  {}",
            r.rollout_id,
            pkg,
            phase_label(r),
            format!("{}/{}", r.patched, r.planned_nodes),
            r.failed,
            format!("{}/{}", r.sites_done, r.sites),
            wave_text(r),
            if r.trigger.is_empty() { "-" } else { r.trigger.as_str() },
            rfc3339_ms(r.started_unix_ms),
        );
    }
    out
}

async fn rollout_list(url: &str, output: Format) -> anyhow::Result<ExitCode> {
    let bus = connect(url).await?;
    let sagas = bus.kv(names::SAGAS_BUCKET).await?;
    let mut rollouts: Vec<pb::Rollout> = sagas
        .scan_matching::<pb::Rollout>(&keys::every_rollout())
        .await?
        .into_iter()
        .filter(|(k, _, _)| keys::rollout_of(k).is_some())
        .map(|(_, r, _)| r)
        .collect();
    sort_newest_first(&mut rollouts);
    match output {
        Format::Json | Format::Yaml => {
            crate::output::emit(output, &Value::Array(rollouts.iter().map(rollout_summary_json).collect()))?
        }
        Format::Table => print!("{}", rollouts_text(&rollouts)),
    }
    Ok(ExitCode::SUCCESS)
}

/// What happened to one planned node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeStatus {
    /// Its site has not started.
    Pending,
    /// Its site never started: the rollout was cancelled first.
    NotStarted,
    /// Its site is patching and has not reported this node yet.
    Patching,
    /// Patched, as many times as its site record lists it (once, unless something is wrong).
    Patched(usize),
    Failed {
        step: String,
        reason: String,
    },
    /// Not started: its site's failures passed its budget.
    Skipped,
    /// Its site ran out of time before reporting this node.
    TimedOut,
    /// Its site is done but does not mention this node.
    Unreported,
}

impl NodeStatus {
    pub fn label(&self) -> String {
        match self {
            Self::Pending => "pending".into(),
            Self::NotStarted => "not started".into(),
            Self::Patching => "patching".into(),
            Self::Patched(1) => "patched".into(),
            Self::Patched(n) => format!("patched {n} times"),
            Self::Failed { step, reason } if step.is_empty() => format!("failed: {reason}"),
            Self::Failed { step, reason } => format!("failed: {step}: {reason}"),
            Self::Skipped => "skipped".into(),
            Self::TimedOut => "timed out".into(),
            Self::Unreported => "not reported".into(),
        }
    }

    fn key(&self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::NotStarted => "not_started",
            Self::Patching => "patching",
            Self::Patched(_) => "patched",
            Self::Failed { .. } => "failed",
            Self::Skipped => "skipped",
            Self::TimedOut => "timed_out",
            Self::Unreported => "unreported",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct NodeView {
    pub node: String,
    pub role: i32,
    pub from_version: String,
    pub status: NodeStatus,
    /// What the node runs of the package now, as observed.
    pub observed: Option<String>,
    /// False for a node a site record mentions that the plan does not.
    pub planned: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SiteView {
    pub index: u32,
    pub site: String,
    /// 0-based.
    pub wave: usize,
    pub canary: bool,
    /// `pending` (no site record yet; `not_started` once the rollout is cancelled), `patching`,
    /// `done` or `timed_out`.
    pub state: String,
    pub nodes: Vec<NodeView>,
}

/// Every site of a rollout's plan, in plan order, and every node with what happened to it.
pub fn rollout_sites(
    rollout: &pb::Rollout,
    plan: &[(u32, pb::RolloutPlanSite)],
    records: &BTreeMap<String, pb::RolloutSite>,
    observed: &BTreeMap<(String, String), String>,
) -> Vec<SiteView> {
    let cancelled = phase_of(rollout) == pb::RolloutPhase::Cancelled;
    let never = if cancelled { NodeStatus::NotStarted } else { NodeStatus::Pending };
    let mut out = Vec::with_capacity(plan.len());
    for (index, ps) in plan {
        let wave = rollout.wave_ends.iter().position(|&end| *index < end).unwrap_or(rollout.wave_ends.len());
        let record = records.get(&ps.site_id);
        let state = match record.map(|r| pb::RolloutSiteState::try_from(r.state)) {
            None => never.key().to_string(),
            Some(Ok(s)) => s.as_str_name().trim_start_matches("ROLLOUT_SITE_STATE_").to_lowercase(),
            Some(Err(_)) => "unknown".to_string(),
        };
        let status_of = |node: &str| -> NodeStatus {
            let Some(r) = record else { return never.clone() };
            let times = r.patched.iter().filter(|n| *n == node).count();
            if times > 0 {
                return NodeStatus::Patched(times);
            }
            if let Some(f) = r.failed.iter().find(|f| f.node == node) {
                return NodeStatus::Failed { step: f.failed_step.clone(), reason: f.reason.clone() };
            }
            if r.skipped.iter().any(|n| n == node) {
                return NodeStatus::Skipped;
            }
            match pb::RolloutSiteState::try_from(r.state) {
                Ok(pb::RolloutSiteState::Done) => NodeStatus::Unreported,
                Ok(pb::RolloutSiteState::TimedOut) => NodeStatus::TimedOut,
                _ => NodeStatus::Patching,
            }
        };
        let observed_of = |node: &str| observed.get(&(ps.site_id.clone(), node.to_string())).cloned();
        let mut nodes: Vec<NodeView> = ps
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| NodeView {
                node: n.name.clone(),
                role: n.role,
                from_version: ps.from_versions.get(i).cloned().unwrap_or_default(),
                status: status_of(&n.name),
                observed: observed_of(&n.name),
                planned: true,
            })
            .collect();
        if let Some(r) = record {
            let planned: BTreeSet<&str> = ps.nodes.iter().map(|n| n.name.as_str()).collect();
            let mentioned: BTreeSet<&str> = r
                .patched
                .iter()
                .chain(&r.skipped)
                .map(String::as_str)
                .chain(r.failed.iter().map(|f| f.node.as_str()))
                .collect();
            for extra in mentioned.difference(&planned) {
                nodes.push(NodeView {
                    node: extra.to_string(),
                    role: 0,
                    from_version: String::new(),
                    status: status_of(extra),
                    observed: observed_of(extra),
                    planned: false,
                });
            }
        }
        out.push(SiteView { index: *index, site: ps.site_id.clone(), wave, canary: ps.canary, state, nodes });
    }
    out
}

/// Node counts by status over every site: `patched`, `failed`, … and `patched_more_than_once`.
pub fn node_counts(sites: &[SiteView]) -> BTreeMap<&'static str, usize> {
    let mut counts: BTreeMap<&'static str, usize> = BTreeMap::new();
    for n in sites.iter().flat_map(|s| &s.nodes) {
        *counts.entry(n.status.key()).or_default() += 1;
        if matches!(n.status, NodeStatus::Patched(t) if t > 1) {
            *counts.entry("patched_more_than_once").or_default() += 1;
        }
    }
    counts
}

fn strategy_text(s: &pb::ResolvedStrategy) -> String {
    let mut parts = Vec::new();
    if s.canary_sites > 0 {
        parts.push(format!("{} first", plural(s.canary_sites, "canary site", "canary sites")));
    }
    parts.push(match s.max_concurrent_sites {
        0 => "every site at once".to_string(),
        n => format!("{} at once", plural(n, "site", "sites")),
    });
    parts.push(match s.max_unavailable.trim() {
        "" => "1 node of a site at once".to_string(),
        p if p.ends_with('%') => format!("{p} of a site's nodes at once"),
        n => format!("{n} node{} of a site at once", if n == "1" { "" } else { "s" }),
    });
    parts.push(format!("halts when more than {} fail", plural(s.failure_threshold, "node", "nodes")));
    if s.wave_timeout_seconds > 0 {
        let action = match pb::WaveTimeoutAction::try_from(s.on_wave_timeout) {
            Ok(pb::WaveTimeoutAction::Continue) => "continue",
            _ => "abort",
        };
        parts.push(format!("wave timeout {} ({action})", human_duration_ms(i64::from(s.wave_timeout_seconds) * 1000)));
    }
    parts.join(", ")
}

pub fn rollout_show_json(r: &pb::Rollout, sites: &[SiteView]) -> Value {
    let mut head = rollout_summary_json(r);
    if let Some(o) = head.as_object_mut() {
        o.insert("strategy".into(), serde_json::to_value(&r.strategy).unwrap_or_default());
        o.insert("selector".into(), serde_json::to_value(&r.selector).unwrap_or_default());
        o.insert("timed_out_sites".into(), json!(r.timed_out_sites));
        o.insert("nodes".into(), json!(node_counts(sites)));
    }
    let (_, version) = package_of(r);
    let sites: Vec<Value> = sites
        .iter()
        .map(|s| {
            let nodes: Vec<Value> = s
                .nodes
                .iter()
                .map(|n| {
                    let mut v = json!({
                        "node": n.node,
                        "role": role_label(n.role),
                        "from_version": n.from_version,
                        "to_version": version,
                        "status": n.status.key(),
                        "observed_version": n.observed,
                        "planned": n.planned,
                    });
                    match &n.status {
                        NodeStatus::Patched(times) => v["times_patched"] = json!(times),
                        NodeStatus::Failed { step, reason } => {
                            v["failed_step"] = json!(step);
                            v["reason"] = json!(reason);
                        }
                        _ => {}
                    }
                    v
                })
                .collect();
            json!({
                "index": s.index,
                "site": s.site,
                "wave": s.wave + 1,
                "canary": s.canary,
                "state": s.state,
                "nodes": nodes,
            })
        })
        .collect();
    json!({ "rollout": head, "sites": sites })
}

pub fn rollout_show_text(r: &pb::Rollout, sites: &[SiteView]) -> String {
    let (name, version) = package_of(r);
    let mut out = String::new();
    let _ = writeln!(out, "rollout   {}", r.rollout_id);
    let _ = writeln!(out, "package   {name} → {version}");
    let _ = writeln!(out, "phase     {}", phase_label(r));
    if !r.reason.is_empty() {
        let _ = writeln!(out, "reason    {}", r.reason);
    }
    let _ = writeln!(out, "trigger   {}", if r.trigger.is_empty() { "-" } else { r.trigger.as_str() });
    let finished = match r.finished_unix_ms {
        0 => String::new(),
        ms => format!(", finished {} (took {})", rfc3339_ms(ms), human_duration_ms(ms - r.started_unix_ms)),
    };
    let _ = writeln!(out, "started   {}{finished}", rfc3339_ms(r.started_unix_ms));
    let _ = writeln!(
        out,
        "progress  {}/{} nodes patched, {} failed; {}/{} sites done; wave {}",
        r.patched,
        r.planned_nodes,
        r.failed,
        r.sites_done,
        r.sites,
        wave_text(r)
    );
    if let Some(s) = &r.strategy {
        let _ = writeln!(out, "strategy  {}", strategy_text(s));
    }
    let mut wave = None;
    for s in sites {
        if wave != Some(s.wave) {
            wave = Some(s.wave);
            let canary = if s.canary { " (canary)" } else { "" };
            let _ = writeln!(out, "\nwave {}{canary}", s.wave + 1);
        }
        let mark = if s.canary { " (canary)" } else { "" };
        let state = s.state.replace('_', " ");
        let _ = writeln!(out, "  {}{mark}: {state}, {}", s.site, plural(s.nodes.len() as u64, "node", "nodes"));
        let width = s.nodes.iter().map(|n| n.node.len()).max().unwrap_or(0);
        for n in &s.nodes {
            let from = if n.from_version.is_empty() { "(none)" } else { n.from_version.as_str() };
            let runs = match &n.observed {
                Some(v) => format!("  (runs {v})"),
                None => String::new(),
            };
            let unplanned = if n.planned { "" } else { "  (not in the plan)" };
            let _ = writeln!(
                out,
                "    {:<width$}  {:<6}  {from} → {version}  {}{runs}{unplanned}",
                n.node,
                role_label(n.role),
                n.status.label()
            );
        }
    }
    let counts = node_counts(sites);
    let total: usize = sites.iter().map(|s| s.nodes.len()).sum();
    let mut parts = vec![format!("{total} in the plan")];
    for key in ["patched", "failed", "skipped", "timed_out", "unreported", "patching", "pending", "not_started"] {
        if let Some(n) = counts.get(key) {
            parts.push(format!("{n} {}", key.replace('_', " ")));
        }
    }
    let _ = writeln!(out, "\nnodes     {}", parts.join(", "));
    match counts.get("patched_more_than_once") {
        Some(n) => {
            let _ = writeln!(out, "          {n} patched more than once!");
        }
        None if counts.contains_key("patched") => {
            let _ = writeln!(out, "          every patched node was patched once");
        }
        None => {}
    }
    out
}

/// A rollout and every site and node of its plan with what happened to it; `None` when there
/// is no such rollout. `id` must be a rollout id (see [`rollout_id`]).
pub async fn rollout_detail(bus: &Bus, id: &str) -> anyhow::Result<Option<(pb::Rollout, Vec<SiteView>)>> {
    let sagas = bus.kv(names::SAGAS_BUCKET).await?;
    let Some((r, _)) = sagas.get::<pb::Rollout>(&keys::rollout(id)).await? else { return Ok(None) };
    let mut plan = Vec::new();
    for chunk in 0..r.plan_chunks {
        let Some((c, _)) = sagas.get::<pb::RolloutPlanChunk>(&keys::rollout_plan(id, chunk)).await? else {
            tracing::warn!(rollout = id, chunk, "a plan chunk of the rollout is missing");
            continue;
        };
        plan.extend(c.sites.into_iter().enumerate().map(|(i, s)| (c.first_index + i as u32, s)));
    }
    let records: BTreeMap<String, pb::RolloutSite> = sagas
        .scan::<pb::RolloutSite>(&keys::rollout_sites_prefix(id))
        .await?
        .into_iter()
        .map(|(_, s, _)| (s.site_id.clone(), s))
        .collect();
    let (name, _) = package_of(&r);
    let observed = observed_package(bus, &name).await?;
    let sites = rollout_sites(&r, &plan, &records, &observed);
    Ok(Some((r, sites)))
}

async fn rollout_show(url: &str, id: &str, output: Format) -> anyhow::Result<ExitCode> {
    let id = rollout_id(id)?;
    let bus = connect(url).await?;
    let Some((r, sites)) = rollout_detail(&bus, &id).await? else {
        bail!("there is no rollout {id} (landfall rollout list shows them all)")
    };
    match output {
        Format::Json | Format::Yaml => crate::output::emit(output, &rollout_show_json(&r, &sites))?,
        Format::Table => print!("{}", rollout_show_text(&r, &sites)),
    }
    Ok(ExitCode::SUCCESS)
}

enum Control {
    Pause(String),
    Resume,
    Cancel(String),
}

async fn control(url: &str, id: &str, what: Control) -> anyhow::Result<ExitCode> {
    let id = rollout_id(id)?;
    let bus = connect(url).await?;
    let r = get_rollout(&bus.kv(names::SAGAS_BUCKET).await?, &id).await?;
    let verb = match what {
        Control::Pause(_) => "pause",
        Control::Resume => "resume",
        Control::Cancel(_) => "cancel",
    };
    match phase_of(&r) {
        pb::RolloutPhase::Completed => bail!("rollout {id} has completed: there is nothing to {verb}"),
        pb::RolloutPhase::Cancelled => bail!("rollout {id} was cancelled: there is nothing to {verb}"),
        _ => {}
    }
    let env = Envelope::root();
    let (type_name, subject) = match what {
        Control::Pause(reason) => publish(&bus, &pb::PauseRollout { rollout_id: id.clone(), reason }, &env).await?,
        Control::Resume => publish(&bus, &pb::ResumeRollout { rollout_id: id.clone() }, &env).await?,
        Control::Cancel(reason) => publish(&bus, &pb::CancelRollout { rollout_id: id.clone(), reason }, &env).await?,
    };
    let short = type_name.rsplit('.').next().unwrap_or(type_name);
    println!("{short} {id} published on {subject} (id {})", env.id);
    Ok(ExitCode::SUCCESS)
}

async fn publish<C: BusCommand>(bus: &Bus, cmd: &C, env: &Envelope) -> anyhow::Result<(&'static str, String)> {
    bus.publish_command(cmd, env).await?;
    Ok((C::TYPE, cmd.subject()))
}

// --- node add -----------------------------------------------------------------------------

/// The BMC address of a simulated host that was given none: `ipmi://10.X.Y.Z` from the last
/// three bytes of its MAC.
pub fn default_bmc(mac: &MacAddress) -> String {
    let bytes: Vec<u8> = mac.as_str().split(':').filter_map(|b| u8::from_str_radix(b, 16).ok()).collect();
    let tail = &bytes[bytes.len().saturating_sub(3)..];
    let octets: Vec<String> = tail.iter().map(u8::to_string).collect();
    format!("ipmi://10.{}", octets.join("."))
}

/// The node `node add` asks for, validated as a design node.
pub fn node_spec(args: &NodeAddArgs) -> anyhow::Result<NodeDesign> {
    let mac = MacAddress::try_from(args.mac.clone()).map_err(|e| anyhow!("--mac: {}", e.reason))?;
    let bmc = args.bmc.clone().unwrap_or_else(|| default_bmc(&mac));
    let role = match args.role {
        NodeRole::Master => pb::Role::Master,
        NodeRole::Worker => pb::Role::Worker,
    };
    let spec = pb::NodeSpec {
        name: args.name.clone(),
        role: role as i32,
        boot_mac: mac.to_string(),
        bmc_address: bmc,
        labels: Default::default(),
    };
    NodeDesign::try_from(spec).map_err(|e| {
        let flag = match e.field.as_str() {
            "name" => "--name",
            "bmc_address" => "--bmc",
            "boot_mac" => "--mac",
            other => other,
        };
        anyhow!("{flag}: {}", e.reason)
    })
}

/// The id of the `NodeAdded` with which the site's gateway announces this host
/// ([`ids::node_added_id`]), so the join it starts (its correlation id) and its rejection can
/// be told from any other.
pub fn node_added_id(site: &SiteId, node: &NodeDesign) -> String {
    ids::node_added_id(site.as_str(), node.name.as_str(), node.boot_mac.as_str()).to_string()
}

fn encode<M: BusMessage>(m: &M) -> Vec<u8> {
    m.encode_to_vec()
}

pub async fn node_add(url: &str, args: &NodeAddArgs) -> anyhow::Result<ExitCode> {
    let site = SiteId::try_from(args.site.as_str())?;
    let node = node_spec(args)?;
    let bus = connect(url).await?;
    // Subscribe before the host appears, so no event of its join can slip by.
    let mut reader = match args.wait {
        true => Some(bus.read_events(vec![names::scope_events(site.as_str())], DeliverPolicy::New).await?),
        false => None,
    };
    let request = pb::SimulateHostArrival { site_id: site.to_string(), node: Some(pb::NodeSpec::from(&node)) };
    let subject = names::sim_host_arrival_rpc(site.as_str());
    match bus.request(subject, encode(&request).into(), Duration::from_secs(5)).await {
        Ok(_) => {}
        Err(RequestError::TimedOut { .. }) => bail!("simulated site {site} did not answer within 5 s"),
        Err(RequestError::NoResponders { .. }) => {
            bail!("no simulated site {site} answers (is `landfall up` running with that site?)")
        }
        Err(RequestError::Refused { reason, .. }) => bail!("simulated site {site} refused the host: {reason}"),
        Err(e) => return Err(anyhow!(e).context(format!("ask simulated site {site} for a new host"))),
    }
    match args.output {
        Format::Json | Format::Yaml => crate::output::emit_line(
            args.output,
            &json!({
                "site": site.as_str(),
                "node": node.name.as_str(),
                "role": node.role.as_str(),
                "boot_mac": node.boot_mac.as_str(),
                "bmc_address": node.bmc_address.as_str(),
                "appeared": true,
            }),
        )?,
        Format::Table => println!(
            "host {} ({}, {}) appeared at {site}; its gateway announces it (NodeAdded), then the orchestrator \
             provisions it and joins it to the cluster",
            node.name,
            node.role.as_str(),
            node.boot_mac.as_str()
        ),
    }
    let Some(reader) = reader.as_mut() else { return Ok(ExitCode::SUCCESS) };
    let host = Host { name: node.name.as_str(), mac: node.boot_mac.as_str(), added_id: &node_added_id(&site, &node) };
    let deadline = tokio::time::Instant::now() + args.timeout;
    loop {
        let next = match tokio::time::timeout_at(deadline, reader.next()).await {
            Err(_) => {
                eprintln!("gave up waiting after {:?}; the join goes on (landfall status {site})", args.timeout);
                return Ok(ExitCode::from(EXIT_TIMEOUT));
            }
            Ok(None) => bail!("the event stream ended"),
            Ok(Some(e)) => e?,
        };
        if !host.concerned_by(&next.delivery) {
            continue;
        }
        match args.output {
            Format::Json | Format::Yaml => crate::output::emit_line(args.output, &event_json(&next))?,
            Format::Table => eprintln!("{}", event_line(&next)),
        }
        if let Some((code, message)) = host.join_verdict(&next.delivery) {
            eprintln!("{message}");
            return Ok(ExitCode::from(code));
        }
    }
}

/// The host `node add` waits for.
pub struct Host<'a> {
    pub name: &'a str,
    pub mac: &'a str,
    /// See [`node_added_id`].
    pub added_id: &'a str,
}

impl Host<'_> {
    /// Whether a site event belongs to this host's join (by correlation, or by the node it
    /// names), or rejects its `NodeAdded`.
    fn concerned_by(&self, d: &Delivery) -> bool {
        if d.envelope.correlation == self.added_id {
            return true;
        }
        if d.type_name == pb::CommandRejected::TYPE {
            return self.join_verdict(d).is_some();
        }
        let Some(Ok(v)) = pb::decode_to_json(&d.type_name, &d.payload) else { return false };
        v["node"] == self.name || v["node"]["name"] == self.name
    }

    /// Whether `--wait` of `node add` ends with this event, with its exit code and what to say:
    /// 0 ready (or accepted at a site never installed, which it joins at the install), 1 could
    /// not join, 2 its NodeAdded was rejected.
    pub fn join_verdict(&self, d: &Delivery) -> Option<(u8, String)> {
        let name = self.name;
        match d.type_name.as_str() {
            pb::NodeReady::TYPE => {
                let r: pb::NodeReady = d.decode().ok()?;
                (r.node == name).then(|| (0, format!("node {name} is ready in the cluster of {}", r.site_id)))
            }
            pb::NodeJoinFailed::TYPE => {
                let f: pb::NodeJoinFailed = d.decode().ok()?;
                let step = if f.step.is_empty() { String::new() } else { format!("{}: ", f.step) };
                (f.node == name).then(|| (1, format!("node {name} could not join: {step}{}", f.reason)))
            }
            pb::NodeAccepted::TYPE => {
                let a: pb::NodeAccepted = d.decode().ok()?;
                let ours = a.node.as_ref().is_some_and(|n| n.name == name);
                (ours && !a.joining).then(|| {
                    let msg = format!(
                        "node {name} is in the design of {} now; the site was never installed, so it comes up \
                         with the install (landfall site install {})",
                        a.site_id, a.site_id
                    );
                    (0, msg)
                })
            }
            pb::CommandRejected::TYPE => {
                let r: pb::CommandRejected = d.decode().ok()?;
                let named = r.reason.contains(name) || r.reason.contains(self.mac);
                let ours = r.command_id == self.added_id || (r.command_type == pb::NodeAdded::TYPE && named);
                ours.then(|| (EXIT_REJECTED, format!("the site refused node {name}: {}", r.reason)))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    use crate::{Cli, Command, PackageCommand};

    fn patch_args(args: &[&str]) -> PatchArgs {
        let cli = Cli::try_parse_from([&["landfall", "package", "patch"], args].concat()).unwrap();
        match cli.command {
            Command::Package(PackageCommand::Patch(a)) => a,
            other => panic!("not a patch: {other:?}"),
        }
    }

    fn patch_error(args: &[&str]) -> String {
        let a = patch_args(args);
        a.rollout.selector().and_then(|_| a.rollout.strategy().map(|_| ())).unwrap_err().to_string()
    }

    #[test]
    fn labels_and_sites_parse() {
        let a = patch_args(&["kubelet", "1.30.0", "--sites", "edge-01,edge-02", "--labels", "region=eu, tier = edge"]);
        let sel = a.rollout.selector().unwrap();
        assert_eq!(sel.site_ids, ["edge-01", "edge-02"]);
        assert_eq!(sel.labels.get("region").map(String::as_str), Some("eu"));
        assert_eq!(sel.labels.get("tier").map(String::as_str), Some("edge"));
        let a = patch_args(&["kubelet", "1.30.0", "--labels", "a=1", "--labels", "b=2"]);
        assert_eq!(a.rollout.selector().unwrap().labels.len(), 2);
        assert!(patch_args(&["kubelet", "1.30.0"]).rollout.selector().unwrap().site_ids.is_empty());
        assert!(parse_label("region").unwrap_err().contains("KEY=VALUE"));
        assert!(parse_label("=eu").unwrap_err().contains("no key"));
        assert_eq!(parse_label("k=").unwrap(), ("k".into(), "".into()));
        assert_eq!(parse_label("k=a=b").unwrap(), ("k".into(), "a=b".into()), "the first = splits");
        assert!(Cli::try_parse_from(["landfall", "package", "patch", "k", "1", "--labels", "nope"]).is_err());
    }

    #[test]
    fn bad_selectors_and_strategies_are_named_by_flag() {
        for (args, expect) in [
            (&["--sites", "Edge_01"][..], "--sites"),
            (&["--sites", "edge-01,edge-01"], "given twice"),
            (&["--labels", "a=1,a=2"], "--labels: a is given twice"),
            (&["--max-unavailable", "x"], "--max-unavailable"),
            (&["--failure-threshold", "150%"], "--failure-threshold"),
            (&["--canary-sites", "fleet"], "--canary-sites"),
            (&["--wave-timeout", "500ms"], "--wave-timeout"),
        ] {
            let err = patch_error(&[&["kubelet", "1.30.0"], args].concat());
            assert!(err.contains(expect), "{args:?}: {err:?} should mention {expect}");
        }
        // clap refuses these before anything runs.
        for args in [
            &["--canary", "1", "--canary-sites", "edge-01"][..],
            &["--on-wave-timeout", "continue"],
            &["--on-wave-timeout", "maybe", "--wave-timeout", "5m"],
            &["--dry-run", "--wait"],
        ] {
            let all = [&["landfall", "package", "patch", "kubelet", "1.30.0"][..], args].concat();
            assert!(Cli::try_parse_from(all).is_err(), "{args:?}");
        }
    }

    #[test]
    fn strategy_flags_become_the_strategy() {
        let a = patch_args(&[
            "kubelet",
            "1.30.0",
            "--canary-sites",
            "edge-03,edge-01",
            "--max-concurrent-sites",
            "10",
            "--max-unavailable",
            "25%",
            "--failure-threshold",
            "2",
            "--wave-timeout",
            "10m",
            "--on-wave-timeout",
            "continue",
        ]);
        let (s, checked) = a.rollout.strategy().unwrap();
        assert_eq!(s.canary_site_ids, ["edge-03", "edge-01"], "in the order given");
        assert_eq!((s.canary_sites, s.max_concurrent_sites, s.wave_timeout_seconds), (0, 10, 600));
        assert_eq!(s.on_wave_timeout, pb::WaveTimeoutAction::Continue as i32);
        assert_eq!(checked.max_unavailable, rollout::Amount::Percent(25));
        let (s, checked) = patch_args(&["kubelet", "1.30.0", "--canary", "2"]).rollout.strategy().unwrap();
        assert_eq!((s.canary_sites, s.on_wave_timeout), (2, 0));
        assert_eq!(checked.on_wave_timeout, pb::WaveTimeoutAction::Abort, "the default");
        assert!(patch_args(&["kubelet", "1.30.0"]).rollout.is_empty());
        assert!(!patch_args(&["kubelet", "1.30.0", "--canary", "1"]).rollout.is_empty());
    }

    #[test]
    fn register_takes_the_same_flags() {
        let cli = Cli::try_parse_from([
            "landfall",
            "package",
            "register",
            "--name",
            "kubelet",
            "--version",
            "1.30.0",
            "--kind",
            "binary",
            "--sha256",
            "ab",
            "--size",
            "1",
            "--auto-rollout",
            "--labels",
            "region=eu",
            "--canary",
            "1",
        ])
        .unwrap();
        let Command::Package(PackageCommand::Register(r)) = cli.command else { panic!("not register") };
        assert!(r.package.policy.auto_rollout);
        let policy = r.package.policy.rollout.auto_rollout().unwrap();
        assert!(policy.enabled);
        assert_eq!(policy.selector.unwrap().labels.len(), 1);
        assert_eq!(policy.strategy.unwrap().canary_sites, 1);
        let both = ["landfall", "package", "register", "--name", "k", "--version", "1", "--kind", "binary"];
        let both = [&both[..], &["--sha256", "ab", "--size", "1", "--auto-rollout", "--no-auto-rollout"]].concat();
        assert!(Cli::try_parse_from(both).is_err());
    }

    fn pkg(name: &str, version: &str, size: u64) -> pb::Package {
        pb::Package {
            name: name.into(),
            version: version.into(),
            kind: pb::PackageKind::Binary as i32,
            sha256: "0123456789abcdef".repeat(4),
            size,
            object_key: format!("{name}/{version}"),
        }
    }

    #[test]
    fn catalog_rows_are_sorted_and_flag_auto_rollout() {
        let policies = vec![
            pb::PackagePolicy {
                name: "kubelet".into(),
                auto_rollout: Some(pb::AutoRollout { enabled: true, ..Default::default() }),
                ..Default::default()
            },
            pb::PackagePolicy {
                name: "ubuntu".into(),
                auto_rollout: Some(pb::AutoRollout { enabled: false, ..Default::default() }),
                ..Default::default()
            },
        ];
        let rows = catalog_rows(
            vec![pkg("kubelet", "1.10.0", 1536), pkg("ubuntu", "22.04", 10), pkg("kubelet", "1.9.0", 1)],
            &policies,
        );
        let order: Vec<_> = rows.iter().map(|r| (r.package.name.as_str(), r.package.version.as_str())).collect();
        assert_eq!(order, [("kubelet", "1.9.0"), ("kubelet", "1.10.0"), ("ubuntu", "22.04")]);
        assert_eq!(rows.iter().map(|r| r.auto_rollout).collect::<Vec<_>>(), [true, true, false]);
        let text = catalog_text(&rows);
        let line = text.lines().nth(2).unwrap();
        assert!(line.contains("1.5 KiB") && line.contains("0123456789ab ") && line.ends_with("yes"), "{line}");
        assert!(!text.contains("0123456789abc"), "sha256 cut at 12: {text}");
        let json = catalog_json(&rows);
        assert_eq!(json[2]["auto_rollout"], false);
        assert_eq!(json[0]["kind"], "binary");
        assert_eq!(json[0]["sha256"].as_str().unwrap().len(), 64, "JSON keeps the whole digest");
        assert!(catalog_text(&[]).contains("empty"));
    }

    fn planned(site: &str, canary: bool, nodes: &[(&str, &str)]) -> rollout::PlannedSite {
        rollout::PlannedSite {
            site: site.into(),
            canary,
            nodes: nodes
                .iter()
                .map(|(n, from)| rollout::PlannedNode {
                    spec: pb::NodeSpec { name: n.to_string(), role: pb::Role::Worker as i32, ..Default::default() },
                    from_version: from.to_string(),
                })
                .collect(),
        }
    }

    fn a_plan() -> Plan {
        Plan {
            sites: vec![
                planned("edge-05", true, &[("node-1", "1.29.2")]),
                planned("edge-01", false, &[("node-1", "1.29.2"), ("node-2", "")]),
                planned("edge-02", false, &[("node-1", "1.28.0")]),
            ],
            wave_ends: vec![1, 3],
            planned_nodes: 4,
            nodes_at_target: 2,
            nodes_not_installed: 1,
            failure_threshold: 1,
        }
    }

    #[test]
    fn plans_print_per_wave_with_canaries_and_totals() {
        let text = plan_text("kubelet", "1.30.0", &a_plan());
        let expected = "\
kubelet → 1.30.0: 4 nodes on 3 sites, in 2 waves

wave 1 of 2 (canary): 1 site
  edge-05 (canary): 1 node
    node-1  worker  1.29.2 → 1.30.0

wave 2 of 2: 2 sites
  edge-01: 2 nodes
    node-1  worker  1.29.2 → 1.30.0
    node-2  worker  (none) → 1.30.0
  edge-02: 1 node
    node-1  worker  1.28.0 → 1.30.0

planned nodes      4
at 1.30.0          2  (left alone)
not installed      1  (nothing observed yet: left to their install)
failure threshold  1  (the rollout halts when more than 1 node fail)
";
        assert_eq!(text, expected);
        let json = plan_json("kubelet", "1.30.0", &a_plan());
        assert_eq!(json["waves"][0]["canary"], true);
        assert_eq!(json["waves"][1]["canary"], false);
        assert_eq!(json["waves"][1]["sites"][0]["nodes"][1]["from_version"], "");
        assert_eq!(json["waves"][1]["sites"][1]["nodes"][0]["to_version"], "1.30.0");
        assert_eq!(json["planned_nodes"], 4);
        let empty = Plan { sites: vec![], wave_ends: vec![], planned_nodes: 0, ..a_plan() };
        assert!(plan_text("kubelet", "1.30.0", &empty).starts_with("kubelet → 1.30.0: nothing to patch"));
    }

    fn delivery<M: BusMessage>(m: &M, correlation: &str) -> Delivery {
        Delivery {
            subject: String::new(),
            type_name: M::TYPE.to_string(),
            envelope: Envelope {
                id: "e".into(),
                correlation: correlation.into(),
                causation: correlation.into(),
                traceparent: String::new(),
            },
            payload: encode(m).into(),
            delivered: 1,
            stream_sequence: 1,
        }
    }

    #[test]
    fn rollout_events_map_to_exit_codes() {
        let id = "r1";
        let code = |d: Delivery| RolloutEvent::of(&d, id).and_then(|e| e.exit_code());
        let done = |failed| pb::RolloutCompleted { rollout_id: id.into(), failed, ..Default::default() };
        assert_eq!(code(delivery(&done(0), id)), Some(0));
        assert_eq!(code(delivery(&done(2), id)), Some(1));
        assert_eq!(code(delivery(&pb::RolloutHalted { rollout_id: id.into(), ..Default::default() }, id)), Some(1));
        let cancelled = pb::RolloutCancelled { rollout_id: id.into(), ..Default::default() };
        assert_eq!(code(delivery(&cancelled, "other-command")), Some(1), "found by rollout id");
        let rejected = pb::CommandRejected { command_id: id.into(), reason: "no".into(), ..Default::default() };
        assert_eq!(code(delivery(&rejected, id)), Some(EXIT_REJECTED));
        let progress = pb::RolloutProgress { rollout_id: id.into(), ..Default::default() };
        assert_eq!(code(delivery(&progress, id)), None);
        assert!(RolloutEvent::of(&delivery(&progress, id), id).is_some());
        let paused = pb::RolloutPaused { rollout_id: id.into(), ..Default::default() };
        assert_eq!(code(delivery(&paused, id)), None, "paused is not the end");
        // Someone else's rollout, or someone else's rejected command.
        assert!(RolloutEvent::of(&delivery(&done(0), "r2"), "r3").is_none());
        let theirs = pb::CommandRejected { command_id: "r2".into(), ..Default::default() };
        assert!(RolloutEvent::of(&delivery(&theirs, "r2"), id).is_none());
        let other = pb::RolloutCompleted { rollout_id: "r2".into(), ..Default::default() };
        assert!(RolloutEvent::of(&delivery(&other, id), id).is_some(), "correlated to our command");
        assert!(RolloutEvent::of(&delivery(&pb::SiteRegistered::default(), id), id).is_none());
    }

    #[test]
    fn rollout_event_lines() {
        let planned = RolloutEvent::Planned(pb::RolloutPlanned {
            rollout_id: "r".into(),
            package: Some(pb::PackageRef { name: "kubelet".into(), version: "1.30.0".into() }),
            sites: vec![Default::default(); 3],
            planned_nodes: 9,
            waves: 2,
            nodes_at_target: 1,
            failure_threshold: 0,
            ..Default::default()
        });
        assert_eq!(
            planned.line(None),
            "planned: kubelet → 1.30.0: 9 nodes on 3 sites in 2 waves (1 at 1.30.0 already, 0 not installed; \
             halts when more than 0 nodes fail)"
        );
        let wave = RolloutEvent::WaveStarted(pb::RolloutWaveStarted {
            wave: 0,
            canary: true,
            site_ids: (1..=10).map(|i| format!("edge-{i:02}")).collect(),
            ..Default::default()
        });
        assert!(wave.line(None).starts_with("wave 1 started (canary): 10 sites: edge-01,"), "{}", wave.line(None));
        assert!(wave.line(None).ends_with("edge-08 and 2 more"), "{}", wave.line(None));
        // The orchestrator leaves the sites out of RolloutWaveStarted: they come from the plan.
        let RolloutEvent::Planned(mut plan) = planned else { unreachable!() };
        plan.sites = ["edge-05", "edge-01", "edge-02"]
            .iter()
            .enumerate()
            .map(|(i, s)| pb::RolloutSitePlan { site_id: s.to_string(), wave: (i > 0) as u32, ..Default::default() })
            .collect();
        let second = RolloutEvent::WaveStarted(pb::RolloutWaveStarted { wave: 1, ..Default::default() });
        assert_eq!(second.line(Some(&plan)), "wave 2 of 2 started: 2 sites: edge-01,edge-02");
        assert_eq!(second.line(None), "wave 2 started");
        let done = RolloutEvent::Completed(pb::RolloutCompleted {
            planned_nodes: 9,
            patched: 9,
            sites: 3,
            duration_ms: 12_345,
            ..Default::default()
        });
        assert_eq!(done.line(None), "completed: 9/9 nodes patched, 0 failed, on 3 sites in 12.3s");
    }

    fn a_rollout() -> pb::Rollout {
        pb::Rollout {
            rollout_id: "0190".into(),
            package: Some(pb::PackageRef { name: "kubelet".into(), version: "1.30.0".into() }),
            phase: pb::RolloutPhase::Running as i32,
            sites: 3,
            planned_nodes: 4,
            wave_ends: vec![1, 3],
            wave: 1,
            patched: 2,
            failed: 1,
            sites_done: 1,
            trigger: "operator".into(),
            started_unix_ms: 1_700_000_000_000,
            ..Default::default()
        }
    }

    fn plan_sites() -> Vec<(u32, pb::RolloutPlanSite)> {
        a_plan()
            .sites
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let site = pb::RolloutPlanSite {
                    site_id: s.site.clone(),
                    nodes: s.nodes.iter().map(|n| n.spec.clone()).collect(),
                    from_versions: s.nodes.iter().map(|n| n.from_version.clone()).collect(),
                    canary: s.canary,
                };
                (i as u32, site)
            })
            .collect()
    }

    #[test]
    fn show_tells_every_node_once_with_what_happened() {
        let records: BTreeMap<String, pb::RolloutSite> = [
            pb::RolloutSite {
                site_id: "edge-05".into(),
                state: pb::RolloutSiteState::Done as i32,
                patched: vec!["node-1".into()],
                ..Default::default()
            },
            pb::RolloutSite {
                site_id: "edge-01".into(),
                state: pb::RolloutSiteState::Patching as i32,
                failed: vec![pb::NodeResult {
                    node: "node-2".into(),
                    failed_step: "patch".into(),
                    reason: "disk full".into(),
                    ..Default::default()
                }],
                ..Default::default()
            },
        ]
        .into_iter()
        .map(|r| (r.site_id.clone(), r))
        .collect();
        let observed = [(("edge-05".to_string(), "node-1".to_string()), "1.30.0".to_string())].into();
        let sites = rollout_sites(&a_rollout(), &plan_sites(), &records, &observed);
        let statuses: Vec<(&str, usize, &str, NodeStatus)> = sites
            .iter()
            .flat_map(|s| s.nodes.iter().map(move |n| (s.site.as_str(), s.wave, n.node.as_str(), n.status.clone())))
            .collect();
        assert_eq!(
            statuses,
            [
                ("edge-05", 0, "node-1", NodeStatus::Patched(1)),
                ("edge-01", 1, "node-1", NodeStatus::Patching),
                ("edge-01", 1, "node-2", NodeStatus::Failed { step: "patch".into(), reason: "disk full".into() }),
                ("edge-02", 1, "node-1", NodeStatus::Pending),
            ]
        );
        assert_eq!(sites[2].state, "pending");
        assert_eq!(sites[0].nodes[0].observed.as_deref(), Some("1.30.0"));
        let text = rollout_show_text(&a_rollout(), &sites);
        assert!(text.contains("phase     running"), "{text}");
        assert!(text.contains("wave 2/2"), "{text}");
        assert!(text.contains("\nwave 1 (canary)\n  edge-05 (canary): done, 1 node\n"), "{text}");
        assert!(text.contains("node-1  worker  1.29.2 → 1.30.0  patched  (runs 1.30.0)"), "{text}");
        assert!(text.contains("node-2  worker  (none) → 1.30.0  failed: patch: disk full"), "{text}");
        assert!(text.contains("  edge-02: pending, 1 node\n    node-1  worker  1.28.0 → 1.30.0  pending"), "{text}");
        assert!(text.contains("nodes     4 in the plan, 1 patched, 1 failed, 1 patching, 1 pending"), "{text}");
        assert!(text.contains("every patched node was patched once"), "{text}");
        let json = rollout_show_json(&a_rollout(), &sites);
        assert_eq!(json["rollout"]["phase"], "running");
        assert_eq!(json["rollout"]["nodes"]["pending"], 1);
        assert_eq!(json["sites"][0]["nodes"][0]["times_patched"], 1);
        assert_eq!(json["sites"][1]["nodes"][1]["reason"], "disk full");
        assert_eq!(json["sites"][2]["state"], "pending");
    }

    #[test]
    fn show_flags_a_node_patched_twice_or_not_planned() {
        let records: BTreeMap<String, pb::RolloutSite> = [pb::RolloutSite {
            site_id: "edge-05".into(),
            state: pb::RolloutSiteState::Done as i32,
            patched: vec!["node-1".into(), "node-1".into(), "node-9".into()],
            ..Default::default()
        }]
        .into_iter()
        .map(|r| (r.site_id.clone(), r))
        .collect();
        let sites = rollout_sites(&a_rollout(), &plan_sites(), &records, &BTreeMap::new());
        assert_eq!(sites[0].nodes[0].status, NodeStatus::Patched(2));
        assert!(!sites[0].nodes[1].planned);
        let text = rollout_show_text(&a_rollout(), &sites);
        assert!(text.contains("patched 2 times"), "{text}");
        assert!(text.contains("(not in the plan)"), "{text}");
        assert!(text.contains("1 patched more than once!"), "{text}");
    }

    #[test]
    fn sites_of_a_cancelled_rollout_never_start() {
        let cancelled = pb::Rollout { phase: pb::RolloutPhase::Cancelled as i32, ..a_rollout() };
        let sites = rollout_sites(&cancelled, &plan_sites(), &BTreeMap::new(), &BTreeMap::new());
        assert!(sites.iter().all(|s| s.state == "not_started"));
        assert!(sites.iter().flat_map(|s| &s.nodes).all(|n| n.status == NodeStatus::NotStarted));
        let text = rollout_show_text(&cancelled, &sites);
        assert!(text.contains("edge-02: not started, 1 node"), "{text}");
        assert!(text.contains("nodes     4 in the plan, 4 not started\n"), "{text}");
        let s = pb::ResolvedStrategy { max_unavailable: "25%".into(), failure_threshold: 1, ..Default::default() };
        assert_eq!(
            strategy_text(&s),
            "every site at once, 25% of a site's nodes at once, halts when more than 1 node fail"
        );
        let s = pb::ResolvedStrategy { canary_sites: 2, max_concurrent_sites: 5, wave_timeout_seconds: 600, ..s };
        assert!(strategy_text(&s).starts_with("2 canary sites first, 5 sites at once"), "{}", strategy_text(&s));
        assert!(strategy_text(&s).ends_with("wave timeout 10m00s (abort)"), "{}", strategy_text(&s));
    }

    #[test]
    fn rollouts_list_newest_first() {
        let mut all = vec![
            pb::Rollout { rollout_id: "a".into(), started_unix_ms: 1, ..a_rollout() },
            pb::Rollout { rollout_id: "b".into(), started_unix_ms: 3, ..a_rollout() },
            pb::Rollout { rollout_id: "c".into(), started_unix_ms: 2, wave_ends: vec![], ..a_rollout() },
        ];
        sort_newest_first(&mut all);
        assert_eq!(all.iter().map(|r| r.rollout_id.as_str()).collect::<Vec<_>>(), ["b", "c", "a"]);
        let text = rollouts_text(&all);
        let row = text.lines().nth(1).unwrap();
        assert!(row.starts_with("b ") && row.contains("kubelet@1.30.0") && row.contains("2/4"), "{row}");
        assert!(text.lines().nth(2).unwrap().contains("  -  "), "no waves: {text}");
        let json = rollout_summary_json(&all[0]);
        assert_eq!((json["wave"].as_u64(), json["waves"].as_u64()), (Some(2), Some(2)));
        assert!(rollouts_text(&[]).starts_with("no rollouts"));
    }

    #[test]
    fn rollout_ids_must_be_uuids() {
        assert!(rollout_id("nope").unwrap_err().to_string().contains("not a rollout id"));
        let id = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b";
        assert_eq!(rollout_id(&format!(" {id} ")).unwrap(), id);
    }

    fn node_args(args: &[&str]) -> NodeAddArgs {
        let cli = Cli::try_parse_from([&["landfall", "node", "add"], args].concat()).unwrap();
        match cli.command {
            Command::Node(crate::NodeCommand::Add(a)) => a,
            other => panic!("not node add: {other:?}"),
        }
    }

    #[test]
    fn node_add_validates_and_derives_a_bmc() {
        let n =
            node_spec(&node_args(&["edge-01", "--name", "node-4", "--role", "worker", "--mac", "52-54-00-0A-01-FF"]))
                .unwrap();
        assert_eq!(n.boot_mac.as_str(), "52:54:00:0a:01:ff");
        assert_eq!(n.bmc_address.as_str(), "ipmi://10.10.1.255");
        let err = |args: &[&str]| node_spec(&node_args(args)).unwrap_err().to_string();
        assert!(
            err(&["e", "--name", "Node_4", "--role", "worker", "--mac", "52:54:00:00:00:01"]).starts_with("--name")
        );
        assert!(err(&["e", "--name", "n", "--role", "master", "--mac", "52:54:00"]).starts_with("--mac"));
        let bad_bmc = ["e", "--name", "n", "--role", "master", "--mac", "52:54:00:00:00:01", "--bmc", "telnet://x"];
        assert!(err(&bad_bmc).starts_with("--bmc"));
        assert!(
            Cli::try_parse_from(["landfall", "node", "add", "e", "--name", "n", "--role", "boss", "--mac", "x"])
                .is_err()
        );
    }

    #[test]
    fn join_waits_end_on_ready_failed_or_rejected() {
        let host = Host { name: "node-4", mac: "52:54:00:00:00:04", added_id: "added" };
        let verdict = |d: Delivery| host.join_verdict(&d);
        let ready = pb::NodeReady { site_id: "edge-01".into(), node: "node-4".into(), ..Default::default() };
        assert_eq!(verdict(delivery(&ready, "x")).map(|v| v.0), Some(0));
        let other = pb::NodeReady { node: "node-5".into(), ..ready.clone() };
        assert_eq!(verdict(delivery(&other, "x")), None);
        let failed = pb::NodeJoinFailed {
            node: "node-4".into(),
            step: "provision_os".into(),
            reason: "bmc".into(),
            ..Default::default()
        };
        let (code, msg) = verdict(delivery(&failed, "x")).unwrap();
        assert_eq!((code, msg.as_str()), (1, "node node-4 could not join: provision_os: bmc"));
        let rejected = pb::CommandRejected {
            command_type: pb::NodeAdded::TYPE.into(),
            reason: "boot MAC 52:54:00:00:00:04 is node-1's".into(),
            ..Default::default()
        };
        assert_eq!(verdict(delivery(&rejected, "x")).map(|v| v.0), Some(2), "named by its MAC");
        let by_id =
            pb::CommandRejected { command_id: "added".into(), reason: "site unknown".into(), ..rejected.clone() };
        assert_eq!(verdict(delivery(&by_id, "x")).map(|v| v.0), Some(2), "by the announcement's id");
        let elsewhere = pb::CommandRejected { reason: "node-7 is there".into(), ..rejected };
        assert_eq!(verdict(delivery(&elsewhere, "x")), None);
        let accepted = |joining| pb::NodeAccepted {
            site_id: "edge-01".into(),
            node: Some(pb::NodeSpec { name: "node-4".into(), ..Default::default() }),
            joining,
            hardware: None,
        };
        assert_eq!(verdict(delivery(&accepted(true), "x")), None, "joining: wait for ready");
        assert_eq!(verdict(delivery(&accepted(false), "x")).map(|v| v.0), Some(0));
        // What gets printed while waiting: the join's events, by correlation or by node.
        let provisioning = pb::NodeOsProvisioning { node: "node-4".into(), ..Default::default() };
        assert!(host.concerned_by(&delivery(&provisioning, "x")));
        assert!(host.concerned_by(&delivery(&pb::ClusterReady::default(), "added")));
        assert!(!host.concerned_by(&delivery(&pb::ClusterReady::default(), "x")));
        assert!(host.concerned_by(&delivery(&accepted(true), "x")));
    }

    #[test]
    fn the_announcement_id_depends_on_the_host_alone() {
        let site = SiteId::try_from("edge-01").unwrap();
        let node =
            node_spec(&node_args(&["edge-01", "--name", "node-4", "--role", "worker", "--mac", "52:54:00:00:00:04"]))
                .unwrap();
        assert_eq!(node_added_id(&site, &node), node_added_id(&site, &node.clone()));
        let other =
            node_spec(&node_args(&["edge-01", "--name", "node-5", "--role", "worker", "--mac", "52:54:00:00:00:04"]))
                .unwrap();
        assert_ne!(node_added_id(&site, &node), node_added_id(&site, &other));
    }
}
