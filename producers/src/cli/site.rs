//! `landfall site register|install|stage`: a site's design in, its install started (and
//! followed with `--wait`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::consumer::DeliverPolicy;
use bus_schema::domain::{SiteDesign, SiteId};
use bus_schema::names;
use bus_schema::pb::{self, BusCommand, BusMessage};
use bus_schema::runtime::{Envelope, ReadEvent};
use clap::{Args, Subcommand};

use super::artifacts::{self, StageArgs};
use super::connect::{EXIT_TIMEOUT, connect, follow, rejected};
use super::output::{Format, emit_line};
use super::progress::{InstallBars, wanted};
use crate::flags::parse_duration;
use crate::views::event::{event_json, event_line};

#[derive(Debug, Subcommand)]
pub enum SiteCommand {
    /// Register (or replace) a site's design from a YAML file.
    Register {
        /// The site design (see docs/src/designs.md: site, labels, nodes, packages, maintenanceWindows).
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        /// Replace the design only if its record is at this revision (`SiteRegistered`'s
        /// revision; 0: only if the site is not registered yet); otherwise the command is
        /// refused as a conflict naming the current revision.
        #[arg(long, value_name = "REVISION")]
        expect_revision: Option<u64>,
    },
    /// Install a registered site: OS on every node, binaries, cluster, container packages.
    Install(InstallArgs),
    /// Download a site's artifacts into its gateway's cache now (e.g. in a maintenance
    /// window); the later install finds them there and transfers nothing.
    Stage(StageArgs),
    /// Take a site out of landfall: its design and revisions, what was observed of it, its
    /// kubeconfig and BMC credentials, its gateway's consumer and its undelivered jobs go; its
    /// install's summary stays. Refused while an install or rollout works on the site.
    Remove(RemoveArgs),
    /// Take a site away for good: every host deprovisioned and deleted, the BPA's resources
    /// and the site's kubeconfig and landfall Secrets deleted at the site; its records archived
    /// at the hub, then removed as `site remove` does. Prints how to revoke its NATS user.
    Decommission(super::lifecycle::DecommissionArgs),
    /// The objects a Cluster API site's design becomes at the site (Cluster, KubeadmControlPlane,
    /// MachineDeployment, CAPM3's templates), exactly as its gateway applies them: to review or
    /// diff before an install or a rollout. `design render -f` does the same from design files.
    Render {
        site: String,
        #[command(flatten)]
        render: super::render::RenderArgs,
    },
    /// A bootstrap credential: lets a new gateway ask to join (and nothing else) until it
    /// expires. Needs `landfall serve identity` and a hub made with `--site-auth enroll`.
    Bootstrap(super::identity::BootstrapArgs),
    /// The gateways' requests to join, with what each reported about its machine.
    Enrollments {
        /// Decided ones too.
        #[arg(long)]
        all: bool,
    },
    /// Approve a gateway's request to join: it becomes the site's identity and gets credentials.
    Approve(super::identity::DecideArgs),
    /// Deny a gateway's request to join.
    Deny(super::identity::DecideArgs),
    /// Revoke a site's identity: its open connections (gateway and leaf node) are closed on
    /// every hub server within seconds, and none of its keys connects again.
    Revoke(super::identity::RevokeArgs),
    /// Every site's identity: its key, its link credentials' expiry, whether it is revoked.
    Identities,
}

#[derive(Debug, Args)]
pub struct RemoveArgs {
    pub site: String,
    /// Why (kept in the commands stream and in the SiteRemoved event).
    #[arg(long, default_value = "")]
    pub reason: String,
    /// How long to wait for the orchestrator's answer.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub timeout: Duration,
}

#[derive(Debug, Args)]
pub struct InstallArgs {
    pub site: String,
    /// Wait for the install to end; exit 0 when installed, non-zero with the reason otherwise.
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits.
    #[arg(long, default_value = "30m", value_parser = parse_duration)]
    pub timeout: Duration,
    /// The command id (a UUID). Publishing the same id again does the install once.
    #[arg(long)]
    pub id: Option<uuid::Uuid>,
    /// Install this design revision (see `landfall design apply`) instead of the latest.
    #[arg(long)]
    pub revision: Option<u64>,
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
    pub output: Format,
}

/// Runs one `landfall site …` command.
pub async fn run(url: &str, cmd: SiteCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        SiteCommand::Register { file, expect_revision } => register_site(url, &file, expect_revision).await,
        SiteCommand::Install(args) => install_site(url, &args).await,
        SiteCommand::Stage(args) => artifacts::stage(url, &args).await,
        SiteCommand::Remove(args) => remove_site(url, &args).await,
        SiteCommand::Decommission(args) => super::lifecycle::decommission_site(url, &args).await,
        SiteCommand::Render { site, render } => super::render::site(url, &site, &render).await,
        SiteCommand::Bootstrap(args) => super::identity::bootstrap(url, &args).await,
        SiteCommand::Enrollments { all } => super::identity::enrollments(url, all).await,
        SiteCommand::Approve(args) => super::identity::decide(url, &args, true).await,
        SiteCommand::Deny(args) => super::identity::decide(url, &args, false).await,
        SiteCommand::Revoke(args) => super::identity::revoke(url, &args).await,
        SiteCommand::Identities => super::identity::identities(url).await,
    }
}

/// Reads the flat site design of `file` (`site register -f`).
pub fn read_site_design(file: &Path) -> anyhow::Result<SiteDesign> {
    let text = std::fs::read_to_string(file).with_context(|| format!("read {}", file.display()))?;
    parse_site_design(&text, &file.display().to_string())
}

/// Parses a flat site design read from `source`: its YAML, then the checks of the design as a
/// whole (the first problem found).
pub fn parse_site_design(text: &str, source: &str) -> anyhow::Result<SiteDesign> {
    let design: SiteDesign =
        bus_schema::yaml::from_str(text).with_context(|| format!("{source} is not a site design"))?;
    let design = design.validate().with_context(|| format!("{source} is not a valid site design"))?;
    if let Some(problem) = design.cluster_problems().into_iter().next() {
        return Err(anyhow::Error::new(problem).context(format!("{source} is not a valid site design")));
    }
    Ok(design)
}

pub async fn register_site(url: &str, file: &Path, expect_revision: Option<u64>) -> anyhow::Result<ExitCode> {
    let design = read_site_design(file)?;
    let bus = connect(url).await?;
    let cmd = pb::RegisterSite {
        design: Some(pb::SiteDesign::from(&design)),
        expected: expect_revision.map(|revision| pb::ExpectedRevision { revision }),
    };
    let env = Envelope::root();
    let ack = bus.publish_command(&cmd, &env).await?;
    println!("RegisterSite {} published (id {}, seq {})", design.site, env.id, ack.sequence);
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
    if let Some(why) = gateway_missing(&bus, site.as_str()).await? {
        eprintln!("waiting: {why}");
    }

    let mut bars = wanted(args.output).then(|| InstallBars::new(site.as_str()));
    let verdict = follow(reader, &env.id, args.timeout, |next| {
        match (args.output, bars.as_mut()) {
            (Format::Table, Some(bars)) => bars.on_event(next),
            (Format::Table, None) => eprintln!("{}", event_line(next)),
            (format, _) => emit_line(format, &event_json(next))?,
        }
        install_verdict(next)
    })
    .await?;
    Ok(verdict.unwrap_or_else(|| {
        eprintln!("gave up waiting after {:?}; the install goes on (landfall status {site})", args.timeout);
        ExitCode::from(EXIT_TIMEOUT)
    }))
}

/// How long a gateway that runs has to be heard before `--wait` says none is: a site
/// registered after its gateway started is recorded heard at the observer's next check (every 5
/// s at most).
const HEARD_WITHIN: Duration = Duration::from_secs(6);

/// Why the site's install cannot move now, when its gateway is not there to do it: never heard
/// from (after a few seconds' grace, for one just started), or cut off. `None` when the hub
/// hears it.
pub(crate) async fn gateway_missing(bus: &bus_schema::runtime::Bus, site: &str) -> anyhow::Result<Option<String>> {
    // A site not registered is refused with that reason; its gateway is beside the point.
    let sites = bus.kv(names::SITES_BUCKET).await?;
    if sites.get::<pb::SiteDesign>(&names::keys::site(site)).await?.is_none() {
        return Ok(None);
    }
    let observed = bus.kv(names::OBSERVED_BUCKET).await?;
    let deadline = tokio::time::Instant::now() + HEARD_WITHIN;
    loop {
        match observed.get::<pb::SiteLink>(&names::keys::link(site)).await? {
            Some((link, _)) if link.state == pb::LinkState::CutOff as i32 => {
                let link = crate::views::link::link_json(&link);
                return Ok(Some(format!(
                    "the gateway of {site} is {}: the install goes on once it is heard again",
                    crate::views::link::link_text(&link)
                )));
            }
            Some(_) => return Ok(None),
            None if tokio::time::Instant::now() >= deadline => {
                return Ok(Some(crate::views::attention::no_gateway_reason(site)));
            }
            None => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Publishes `RemoveSite` and waits for `SiteRemoved` (or the refusal).
pub async fn remove_site(url: &str, args: &RemoveArgs) -> anyhow::Result<ExitCode> {
    let site = SiteId::try_from(args.site.as_str())?;
    let bus = connect(url).await?;
    let env = Envelope::root();
    let mut reader = bus.read_events(vec![names::scope_events(site.as_str())], DeliverPolicy::New).await?;
    let cmd = pb::RemoveSite { site_id: site.to_string(), reason: args.reason.clone() };
    bus.publish_command(&cmd, &env).await?;
    eprintln!("RemoveSite {site} published as {}", env.id);
    let verdict = follow(&mut reader, &env.id, args.timeout, |e| {
        let d = &e.delivery;
        Ok(match d.type_name.as_str() {
            pb::SiteRemoved::TYPE => {
                let done: pb::SiteRemoved = d.decode().map_err(|e| anyhow::anyhow!("{e}"))?;
                println!(
                    "removed: {site} ({} design revision(s) deleted, {} undelivered job(s) dropped)",
                    done.design_revisions, done.jobs_dropped
                );
                Some(ExitCode::SUCCESS)
            }
            pb::CommandRejected::TYPE => Some(rejected(d)?),
            _ => None,
        })
    })
    .await?;
    Ok(verdict.unwrap_or_else(|| {
        eprintln!("no answer after {:?}; the removal may still be carried out", args.timeout);
        ExitCode::from(EXIT_TIMEOUT)
    }))
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
