//! `landfall package patch` (a rollout started, planned locally with `--dry-run`, followed
//! with `--wait`) and `landfall rollout list|show|pause|resume|cancel`.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, bail};
use async_nats::jetstream::consumer::DeliverPolicy;
use bus_schema::domain::{self, PackageName, Version};
use bus_schema::names::{self, keys};
use bus_schema::pb::{self, BusCommand};
use bus_schema::rollout::{self, Direction, Strategy};
use bus_schema::runtime::{Bus, Envelope, EventReader, Kv};
use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::connect::{EXIT_REJECTED, EXIT_TIMEOUT, connect};
use super::output::{Format, emit, emit_line};
use super::package_args::{RolloutArgs, invalid};
use super::progress::{RolloutBars, wanted};
use crate::flags::parse_duration;
use crate::views::event::event_json;
use crate::views::plan::{plan_json, plan_text};
use crate::views::rollout::{
    observed_package, phase_of, rollout_detail, rollout_id, rollout_show_json, rollout_show_text, rollout_summary_json,
    rollouts_text, sort_newest_first,
};
use crate::views::rollout_event::RolloutEvent;

#[derive(Debug, Args)]
pub struct PatchArgs {
    /// The package name, e.g. kubelet.
    pub name: String,
    /// The version to move to; it must be in the catalog.
    pub version: String,
    #[command(flatten)]
    pub rollout: RolloutArgs,
    /// Only nodes that run an older version: never downgrade a node that is ahead.
    #[arg(long, conflicts_with = "again")]
    pub only_older: bool,
    /// The nodes that run VERSION already too: a helm chart is rendered again with each site's
    /// values as they are now and applied where the render changed (values changed in designs,
    /// rolled out in waves like a new version).
    #[arg(long)]
    pub again: bool,
    /// Start sites' jobs outside their maintenance windows: an emergency (kept on the
    /// rollout's record).
    #[arg(long)]
    pub ignore_windows: bool,
    /// Print the plan (waves, sites, nodes, from → to) and publish nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Wait for the rollout to end; exit 0 when every planned node is patched, 1 when it
    /// completes with failures, halts or is cancelled, 2 when rejected, 3 when out of time.
    #[arg(long, conflicts_with = "dry_run")]
    pub wait: bool,
    /// How long --wait waits.
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    pub timeout: Duration,
    /// The command id (a UUID), which is also the rollout id. Publishing the same id again
    /// starts the rollout once.
    #[arg(long)]
    pub id: Option<uuid::Uuid>,
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
    pub output: Format,
}

#[derive(Debug, Subcommand)]
pub enum RolloutCommand {
    /// Every rollout, newest first.
    List {
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
    /// One rollout: its state, and every site and node of its plan with what happened to it.
    Show {
        id: String,
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
    /// Start no more sites; sites already patching finish.
    Pause {
        id: String,
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Go on with a paused or halted rollout (a halted one gets its failure budget again).
    Resume { id: String },
    /// Let a rollout waiting at its approval gate (`--approval`) start its next wave.
    Approve { id: String },
    /// End a rollout: no more sites start; sites already patching finish.
    Cancel {
        id: String,
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Undo a rollout: every node it changed goes back to the version it ran, sites in the
    /// reverse order of their waves, with the rollout's strategy. Prints the rollback's id (a
    /// rollout of its own). A rollout is rolled back once.
    Rollback {
        id: String,
        /// Cancel the rollout first when it is still running or paused.
        #[arg(long)]
        cancel: bool,
        #[arg(long, default_value = "")]
        reason: String,
    },
}

/// Runs one `landfall rollout …` command.
pub async fn run(url: &str, cmd: RolloutCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        RolloutCommand::List { output } => rollout_list(url, output).await,
        RolloutCommand::Show { id, output } => rollout_show(url, &id, output).await,
        RolloutCommand::Pause { id, reason } => control(url, &id, Control::Pause(reason)).await,
        RolloutCommand::Resume { id } => control(url, &id, Control::Resume).await,
        RolloutCommand::Approve { id } => control(url, &id, Control::Approve).await,
        RolloutCommand::Cancel { id, reason } => control(url, &id, Control::Cancel(reason)).await,
        RolloutCommand::Rollback { id, cancel, reason } => rollback(url, &id, cancel, reason).await,
    }
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
        Format::Json | Format::Yaml => emit(output, &plan_json(name.as_str(), version.as_str(), &plan))?,
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
        let direction = match (args.again, args.only_older) {
            (true, _) => Direction::Again,
            (false, true) => Direction::OnlyOlder,
            (false, false) => Direction::Any,
        };
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
        again: args.again,
        ignore_windows: args.ignore_windows,
    };
    let ack = bus.publish_command(&cmd, &env).await?;
    let dup = if ack.duplicate { " (duplicate id: already published)" } else { "" };
    eprintln!("PatchPackage {name}@{version} published on {}{dup}; the rollout id is its id", cmd.subject());
    match args.output {
        Format::Json | Format::Yaml => emit_line(
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
    let mut bars = wanted(output).then(|| RolloutBars::new(id));
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
            (format, _) => emit_line(format, &event_json(&next))?,
        }
        if let RolloutEvent::Planned(p) = &event {
            planned = Some(p.clone());
        }
        if let Some(code) = exit_code(&event) {
            return Ok(ExitCode::from(code));
        }
    }
}

/// Whether `--wait` ends here, and with which exit code: 0 completed with every planned
/// node patched, 1 completed with failures, halted or cancelled, 2 rejected.
pub fn exit_code(event: &RolloutEvent) -> Option<u8> {
    match event {
        RolloutEvent::Completed(c) if c.failed == 0 => Some(0),
        RolloutEvent::Completed(_) | RolloutEvent::Halted(_) | RolloutEvent::Cancelled(_) => Some(1),
        RolloutEvent::Rejected(_) => Some(EXIT_REJECTED),
        _ => None,
    }
}

async fn get_rollout(sagas: &Kv, id: &str) -> anyhow::Result<pb::Rollout> {
    if let Some((r, _)) = sagas.get::<pb::Rollout>(&keys::rollout(id)).await? {
        return Ok(r);
    }
    match sagas.get::<pb::RolloutSummary>(&keys::rollout_summary(id)).await? {
        Some((s, _)) => Ok(consumers::compaction::rollout_from_summary(&s)),
        None => bail!("there is no rollout {id} (landfall rollout list shows them all)"),
    }
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
    // Compacted after the retention: their summaries.
    rollouts.extend(crate::views::rollout::compacted_rollouts(&bus).await?);
    sort_newest_first(&mut rollouts);
    match output {
        Format::Json | Format::Yaml => {
            emit(output, &Value::Array(rollouts.iter().map(rollout_summary_json).collect()))?
        }
        Format::Table => print!("{}", rollouts_text(&rollouts)),
    }
    Ok(ExitCode::SUCCESS)
}

async fn rollout_show(url: &str, id: &str, output: Format) -> anyhow::Result<ExitCode> {
    let id = rollout_id(id)?;
    let bus = connect(url).await?;
    let Some((r, sites)) = rollout_detail(&bus, &id).await? else {
        bail!("there is no rollout {id} (landfall rollout list shows them all)")
    };
    let compacted = match r.plan_chunks {
        0 => crate::views::rollout::compacted_rollout(&bus, &id).await?,
        _ => None,
    };
    match output {
        Format::Json | Format::Yaml => {
            let mut v = rollout_show_json(&r, &sites);
            if let (Some(o), Some(c)) = (v.as_object_mut(), &compacted) {
                o.insert("compacted".into(), serde_json::to_value(c).unwrap_or_default());
            }
            emit(output, &v)?
        }
        Format::Table => {
            print!("{}", rollout_show_text(&r, &sites));
            if let Some(c) = &compacted {
                print!("{}", crate::views::rollout::compacted_text(c));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

enum Control {
    Pause(String),
    Resume,
    /// A resume of a rollout at its approval gate, refused for any other.
    Approve,
    Cancel(String),
}

async fn control(url: &str, id: &str, what: Control) -> anyhow::Result<ExitCode> {
    let id = rollout_id(id)?;
    let bus = connect(url).await?;
    let r = get_rollout(&bus.kv(names::SAGAS_BUCKET).await?, &id).await?;
    let verb = match what {
        Control::Pause(_) => "pause",
        Control::Resume => "resume",
        Control::Approve => "approve",
        Control::Cancel(_) => "cancel",
    };
    if matches!(what, Control::Approve) && !r.awaiting_approval {
        bail!(
            "rollout {id} is not waiting for approval ({})",
            if r.reason.is_empty() { "it has no gate waiting" } else { &r.reason }
        );
    }
    match phase_of(&r) {
        pb::RolloutPhase::Completed => bail!("rollout {id} has completed: there is nothing to {verb}"),
        pb::RolloutPhase::Cancelled => bail!("rollout {id} was cancelled: there is nothing to {verb}"),
        _ => {}
    }
    let env = Envelope::root();
    let (type_name, subject) = match what {
        Control::Pause(reason) => publish(&bus, &pb::PauseRollout { rollout_id: id.clone(), reason }, &env).await?,
        Control::Resume | Control::Approve => {
            publish(&bus, &pb::ResumeRollout { rollout_id: id.clone() }, &env).await?
        }
        Control::Cancel(reason) => publish(&bus, &pb::CancelRollout { rollout_id: id.clone(), reason }, &env).await?,
    };
    let short = type_name.rsplit('.').next().unwrap_or(type_name);
    println!("{short} {id} published on {subject} (id {})", env.id);
    Ok(ExitCode::SUCCESS)
}

/// Publishes a `RollbackRollout`, after the checks the orchestrator makes that can be made
/// here, and prints the rollback's id.
async fn rollback(url: &str, id: &str, cancel: bool, reason: String) -> anyhow::Result<ExitCode> {
    let id = rollout_id(id)?;
    let bus = connect(url).await?;
    let sagas = bus.kv(names::SAGAS_BUCKET).await?;
    let r = get_rollout(&sagas, &id).await?;
    if !r.rollback_of.is_empty() {
        bail!("rollout {id} is the rollback of rollout {}: a rollback is not rolled back", r.rollback_of);
    }
    if !r.rolled_back_by.is_empty() {
        bail!(
            "rollout {id} was rolled back already by rollout {} (landfall rollout show {})",
            r.rolled_back_by,
            r.rolled_back_by
        );
    }
    if matches!(phase_of(&r), pb::RolloutPhase::Running | pb::RolloutPhase::Paused) && !cancel {
        bail!("rollout {id} is still under way: cancel it first (landfall rollout cancel {id}), or give --cancel");
    }
    let env = Envelope::root();
    let (_, subject) = publish(&bus, &pb::RollbackRollout { rollout_id: id.clone(), cancel, reason }, &env).await?;
    eprintln!("RollbackRollout {id} published on {subject} (id {}); the rollback's rollout id:", env.id);
    println!("{}", bus_schema::rollout::rollback_id(&id));
    Ok(ExitCode::SUCCESS)
}

async fn publish<C: BusCommand>(bus: &Bus, cmd: &C, env: &Envelope) -> anyhow::Result<(&'static str, String)> {
    bus.publish_command(cmd, env).await?;
    Ok((C::TYPE, cmd.subject()))
}

#[cfg(test)]
mod tests {
    use bus_schema::runtime::Delivery;

    use super::*;
    use crate::Command;
    use crate::cli::package::PackageCommand;
    use crate::cli::package_args::parse_label;
    use crate::testing::{delivery, parse};

    fn patch_args(args: &[&str]) -> PatchArgs {
        let command = parse(&[&["landfall", "package", "patch"], args].concat()).unwrap();
        let Command::Package(PackageCommand::Patch(a)) = command else { panic!("not package patch") };
        a
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
        assert!(parse(&["landfall", "package", "patch", "k", "1", "--labels", "nope"]).is_err());
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
            assert!(parse(&all).is_err(), "{args:?}");
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
    fn rollout_events_map_to_exit_codes() {
        let id = "r1";
        let code = |d: Delivery| RolloutEvent::of(&d, id).and_then(|e| exit_code(&e));
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
}
