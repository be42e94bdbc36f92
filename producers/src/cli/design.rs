//! `landfall design …`: site design documents from files, checked here first and applied
//! through the bus; `design init` writes a starting design.

pub mod init;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use async_nats::jetstream::consumer::DeliverPolicy;
use bus_schema::design::{self, Body, Kind, Parsed, Planned};
use bus_schema::domain::{NodeName, PackageRef, SiteId};
use bus_schema::names::{self, keys};
use bus_schema::pb::{self, BusMessage};
use bus_schema::runtime::{Bus, Envelope};
use clap::{Args, Subcommand};

use crate::cli::connect::connect;

#[derive(Debug, Subcommand)]
pub enum DesignCommand {
    /// Write a starting design to edit: a site, its hardware and host profiles, and nodes
    /// spread over racks (see docs/src/designs.md).
    Init(init::InitArgs),
    /// Validate and apply design documents as the site's next revision (nothing is applied if
    /// anything is wrong; identical documents change nothing). Applied only over the revision
    /// it was checked against: if another apply came in between, it is refused (conflict).
    Apply(ApplyArgs),
    /// Check design documents, against the package catalog when landfall is reachable.
    Validate(Files),
    /// What `apply` would change, against the site's latest revision.
    Diff(Files),
    /// The cluster the design selects: masters and workers (active, standby), the API load
    /// balancer's backends, and the jump host's inventory (hosts.ini).
    Cluster(Files),
    /// The objects a Cluster API site's design becomes at the site (Cluster, KubeadmControlPlane,
    /// MachineDeployment, CAPM3's templates), exactly as its gateway applies them, checked and
    /// chosen as `apply` would, with the catalog's images.
    Render {
        #[command(flatten)]
        files: Files,
        #[command(flatten)]
        render: super::render::RenderArgs,
    },
    /// A node as resolved through its profiles, with where each value came from, and the next
    /// opening of each maintenance window.
    Show {
        node: String,
        /// Show the resolved values (the only view there is, for now).
        #[arg(long, default_value_t = true)]
        effective: bool,
        /// The time the maintenance windows are read at, e.g. 2025-03-29T12:00:00Z [default: now].
        #[arg(long, value_name = "TIME", value_parser = parse_instant)]
        at: Option<i64>,
        #[command(flatten)]
        files: Files,
    },
}

#[derive(Debug, Args)]
pub struct Files {
    /// Design files, or directories of *.yaml / *.yml files.
    #[arg(short = 'f', long = "file", required = true)]
    pub paths: Vec<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ApplyArgs {
    #[command(flatten)]
    pub files: Files,
    /// Apply only over this revision (0: the site has none yet) instead of the latest read now.
    #[arg(long, value_name = "REVISION")]
    pub expect_revision: Option<u64>,
}

/// An instant in RFC 3339, in milliseconds (`--at`).
fn parse_instant(text: &str) -> Result<i64, String> {
    bus_schema::window::parse_instant(text).map_err(|e| e.reason)
}

/// Reads the files (directories: their YAML files, sorted) as design sources.
pub fn read_sources(paths: &[PathBuf]) -> anyhow::Result<Vec<pb::DesignSource>> {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            let mut in_dir: Vec<PathBuf> = std::fs::read_dir(path)
                .with_context(|| format!("read {}", path.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
                .collect();
            in_dir.sort();
            files.extend(in_dir);
        } else {
            files.push(path.clone());
        }
    }
    files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(f).with_context(|| format!("read {}", f.display()))?;
            Ok(pb::DesignSource { name: f.display().to_string(), text })
        })
        .collect()
}

/// The documents of `sources`, as far as they can be read.
fn parse(sources: &[pb::DesignSource]) -> Parsed {
    let mut parsed = Parsed::default();
    for s in sources {
        parsed.read(&s.text, &s.name);
    }
    parsed
}

/// The site the documents describe: the name of their Site document, even one that does not
/// parse. Without one, or when its name is no site id: every error the documents have.
fn site_of(sources: &[pb::DesignSource]) -> Result<SiteId, Vec<String>> {
    let parsed = parse(sources);
    let name = parsed
        .documents()
        .iter()
        .find(|d| d.kind() == Kind::Site)
        .map(|d| d.name().to_string())
        .or_else(|| parsed.unreadable().find(|o| o.kind == Kind::Site).map(|o| o.name.clone()));
    if let Some(Ok(site)) = name.map(SiteId::try_from) {
        return Ok(site);
    }
    match design::validate_parsed(&parsed, &all_packages(&parsed)) {
        Err(errors) => Err(errors.iter().map(ToString::to_string).collect()),
        Ok(_) => Err(vec!["no Site document found (a design needs one `kind: Site`)".to_string()]),
    }
}

/// [`site_of`], its errors printed.
fn site_or_report(sources: &[pb::DesignSource]) -> Option<SiteId> {
    site_of(sources).map_err(|errors| print_errors(&errors)).ok()
}

async fn catalog(bus: &Bus) -> anyhow::Result<BTreeSet<PackageRef>> {
    Ok(bus_schema::runtime::package_refs(&bus.kv(names::PACKAGES_BUCKET).await?).await?)
}

async fn latest(bus: &Bus, site: &SiteId) -> anyhow::Result<Option<pb::DesignRevision>> {
    let kv = bus.kv(names::SITES_BUCKET).await?;
    Ok(kv.get::<pb::DesignRevision>(&keys::design_latest(site.as_str())).await?.map(|(r, _)| r))
}

/// How the cluster is built, in a line: the BPA, or Cluster API with its endpoint and how each
/// node set rolls.
fn built_by(effective: &pb::SiteDesign) -> String {
    let build = bus_schema::domain::SiteDesign::try_from(effective.clone()).map(|d| d.cluster).unwrap_or_default();
    let Some(endpoint) = build.endpoint.filter(|_| build.is_capi()) else {
        return "bpa (ICN's Binary Provisioning Agent)".to_string();
    };
    let n = |v: Option<u32>| v.unwrap_or_default();
    format!(
        "capi (Cluster API {} + CAPM3 {}): endpoint {}:{}; masters maxSurge {}, {} spare; workers maxSurge {}, \
         maxUnavailable {}, {} spare",
        site_gateway::capi::CLUSTER_API_RELEASE,
        site_gateway::capi::CAPM3_RELEASE,
        endpoint.host,
        endpoint.port,
        n(build.masters.max_surge),
        build.masters.spare,
        n(build.workers.max_surge),
        n(build.workers.max_unavailable),
        build.workers.spare
    )
}

/// Node names, comma-separated.
fn names(nodes: &[NodeName]) -> String {
    nodes.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
}

/// How the design commands report an invalid design: a count, then one error a line.
pub fn error_report(errors: &[String]) -> String {
    let mut out =
        format!("the design is invalid ({} error{}):\n", errors.len(), if errors.len() == 1 { "" } else { "s" });
    for e in errors {
        out.push_str("  ");
        out.push_str(e);
        out.push('\n');
    }
    out
}

fn print_errors(errors: &[String]) {
    eprint!("{}", error_report(errors));
}

pub async fn run(url: &str, cmd: DesignCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        DesignCommand::Init(args) => init::run(&args),
        DesignCommand::Show { node, files, at, .. } => show(&files, &node, at),
        DesignCommand::Validate(files) => validate(url, &files).await,
        DesignCommand::Diff(files) => diff(url, &files).await,
        DesignCommand::Apply(args) => apply(url, &args).await,
        DesignCommand::Cluster(files) => cluster(url, &files).await,
        DesignCommand::Render { files, render } => render_design(url, &files, &render).await,
    }
}

async fn cluster(url: &str, files: &Files) -> anyhow::Result<ExitCode> {
    let sources = read_sources(&files.paths)?;
    let Some(site) = site_or_report(&sources) else { return Ok(ExitCode::FAILURE) };
    // Against the latest revision when landfall is reachable, so chosen nodes stay chosen.
    let (catalog, previous) = match connect(url).await {
        Ok(bus) => (catalog(&bus).await?, latest(&bus, &site).await?),
        Err(_) => (all_packages(&parse(&sources)), None),
    };
    let planned = match design::plan(&site, &sources, &catalog, previous.as_ref()) {
        Ok(p) => p,
        Err(errors) => {
            print_errors(&errors);
            return Ok(ExitCode::FAILURE);
        }
    };
    let sel = &planned.selection;
    println!("built by {}", built_by(&planned.effective));
    println!("masters  {} (standby {})", names(&sel.masters.active), names(&sel.masters.standby));
    println!("workers  {} (standby {})", names(&sel.workers.active), names(&sel.workers.standby));
    println!("api load balancer backends:");
    for b in sel.load_balancer_backends(&planned.resolved) {
        println!("  {} {}", b.node, b.address);
    }
    println!("inventory (hosts.ini):");
    print!("{}", sel.inventory(&planned.resolved).to_ini());
    Ok(ExitCode::SUCCESS)
}

/// The design files checked and chosen as `apply` would, against the hub's catalog and the
/// site's latest revision: `None` (the errors printed) when they are invalid.
struct AgainstHub {
    bus: Bus,
    site: SiteId,
    previous: Option<pb::DesignRevision>,
    planned: Planned,
}

async fn plan_against_hub(url: &str, files: &Files) -> anyhow::Result<Option<AgainstHub>> {
    let sources = read_sources(&files.paths)?;
    let Some(site) = site_or_report(&sources) else { return Ok(None) };
    let bus = connect(url).await?;
    let previous = latest(&bus, &site).await?;
    match design::plan(&site, &sources, &catalog(&bus).await?, previous.as_ref()) {
        Ok(planned) => Ok(Some(AgainstHub { bus, site, previous, planned })),
        Err(errors) => {
            print_errors(&errors);
            Ok(None)
        }
    }
}

async fn render_design(url: &str, files: &Files, args: &super::render::RenderArgs) -> anyhow::Result<ExitCode> {
    // The images' sha256 and the nodes chosen before are the hub's.
    let Some(AgainstHub { bus, planned, .. }) = plan_against_hub(url, files).await? else {
        return Ok(ExitCode::FAILURE);
    };
    super::render::effective(&bus, planned.effective, args).await
}

fn show(files: &Files, node: &str, at: Option<i64>) -> anyhow::Result<ExitCode> {
    let sources = read_sources(&files.paths)?;
    let resolved = match design::resolve_parsed(&parse(&sources)) {
        Ok(resolved) => resolved,
        Err(errors) => {
            print_errors(&errors.iter().map(ToString::to_string).collect::<Vec<_>>());
            return Ok(ExitCode::FAILURE);
        }
    };
    let Some(n) = resolved.node(node) else { bail!("no node {node} in the design") };
    let now = at.unwrap_or_else(|| {
        let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX)
    });
    print!("{}", design::render_effective_at(n, now));
    Ok(ExitCode::SUCCESS)
}

async fn validate(url: &str, files: &Files) -> anyhow::Result<ExitCode> {
    let sources = read_sources(&files.paths)?;
    let Some(site) = site_or_report(&sources) else { return Ok(ExitCode::FAILURE) };
    let (catalog, previous) = match connect(url).await {
        Ok(bus) => (Some(catalog(&bus).await?), latest(&bus, &site).await?),
        Err(e) => {
            eprintln!("note: not checking packages against the catalog ({e:#})");
            (None, None)
        }
    };
    // Without the catalog, every package the documents name counts as known.
    let catalog = match catalog {
        Some(c) => c,
        None => all_packages(&parse(&sources)),
    };
    match design::plan(&site, &sources, &catalog, previous.as_ref()) {
        Ok(p) => {
            let names =
                |v: &[bus_schema::domain::NodeName]| v.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
            println!(
                "valid: site {site}, {} nodes; masters {}; workers {}; built by {}",
                p.effective.nodes.len(),
                names(&p.selection.masters.active),
                names(&p.selection.workers.active),
                built_by(&p.effective)
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(errors) => {
            print_errors(&errors);
            Ok(ExitCode::FAILURE)
        }
    }
}

/// Every package the host profiles that parse name: the catalog when the real one is not at hand.
fn all_packages(parsed: &Parsed) -> BTreeSet<PackageRef> {
    let mut refs = BTreeSet::new();
    for d in parsed.documents() {
        if let Body::HostProfile(h) = &d.body {
            refs.extend(h.packages.set.iter().map(bus_schema::design::PackageEntry::package_ref));
        }
    }
    refs
}

async fn diff(url: &str, files: &Files) -> anyhow::Result<ExitCode> {
    let Some(AgainstHub { site, previous, planned, .. }) = plan_against_hub(url, files).await? else {
        return Ok(ExitCode::FAILURE);
    };
    if previous.as_ref().is_some_and(|p| planned.same_as(p)) {
        println!("no changes: {site} is at revision {}", previous.map_or(0, |p| p.revision));
        return Ok(ExitCode::SUCCESS);
    }
    let changes = design::changes(previous.as_ref().and_then(|p| p.effective.as_ref()), &planned.effective);
    let next = previous.as_ref().map_or(1, |p| p.revision + 1);
    println!("{site}: revision {} -> {next}", previous.as_ref().map_or(0, |p| p.revision));
    for n in &changes.added {
        println!("+ node {n}");
    }
    for n in &changes.removed {
        println!("- node {n}");
    }
    for (n, fields) in &changes.changed {
        println!("~ node {n}: {}", fields.join(", "));
    }
    for f in &changes.site_fields {
        println!("~ site {f}");
    }
    let old = previous.as_ref().map(design::selection_of).unwrap_or_default();
    if old != planned.selection {
        let names =
            |v: &[bus_schema::domain::NodeName]| v.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
        println!(
            "~ selection: masters {} -> {}; workers {} -> {}",
            names(&old.masters.active),
            names(&planned.selection.masters.active),
            names(&old.workers.active),
            names(&planned.selection.workers.active)
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn apply(url: &str, args: &ApplyArgs) -> anyhow::Result<ExitCode> {
    let sources = read_sources(&args.files.paths)?;
    let Some(site) = site_or_report(&sources) else { return Ok(ExitCode::FAILURE) };
    let bus = connect(url).await?;
    let previous = latest(&bus, &site).await?;
    // Checked here first, so mistakes are reported at once and an unchanged design sends nothing.
    match design::plan(&site, &sources, &catalog(&bus).await?, previous.as_ref()) {
        Err(errors) => {
            print_errors(&errors);
            return Ok(ExitCode::FAILURE);
        }
        Ok(p) if previous.as_ref().is_some_and(|prev| p.same_as(prev)) => {
            println!("unchanged: {site} stays at revision {}", previous.map_or(0, |p| p.revision));
            return Ok(ExitCode::SUCCESS);
        }
        Ok(_) => {}
    }
    let mut reader = bus.read_events(vec![names::scope_events(site.as_str())], DeliverPolicy::New).await?;
    let env = Envelope::root();
    // Over the revision checked against: a change made in between is not silently undone.
    let expected = args.expect_revision.unwrap_or(previous.as_ref().map_or(0, |p| p.revision));
    let cmd = pb::ApplyDesign {
        site_id: site.to_string(),
        sources,
        expected: Some(pb::ExpectedRevision { revision: expected }),
    };
    bus.publish_command(&cmd, &env).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let e = tokio::time::timeout_at(deadline, reader.next())
            .await
            .context("no answer from the orchestrator within 30 s (is landfall running?)")?
            .context("event stream ended")??;
        if e.delivery.envelope.correlation != env.id {
            continue;
        }
        match e.delivery.type_name.as_str() {
            pb::DesignApplied::TYPE => {
                let a: pb::DesignApplied = e.delivery.decode().map_err(|e| anyhow::anyhow!("{e}"))?;
                println!(
                    "applied: {site} revision {} (+{} -{} ~{} nodes); masters {}; workers {}",
                    a.revision,
                    a.nodes_added.len(),
                    a.nodes_removed.len(),
                    a.nodes_changed.len(),
                    a.masters.join(","),
                    a.workers.join(",")
                );
                return Ok(ExitCode::SUCCESS);
            }
            pb::CommandRejected::TYPE => {
                let r: pb::CommandRejected = e.delivery.decode().map_err(|e| anyhow::anyhow!("{e}"))?;
                eprintln!("rejected: {}", r.reason);
                return Ok(ExitCode::from(2));
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn directories_are_read_as_their_yaml_files_in_order() {
        let dir = std::env::temp_dir().join(format!("landfall-design-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("b.yaml"), "kind: Site\nname: edge-01\n").unwrap();
        std::fs::write(dir.join("a.yml"), "kind: Node\n").unwrap();
        std::fs::write(dir.join("notes.txt"), "not yaml").unwrap();
        let sources = read_sources(std::slice::from_ref(&dir)).unwrap();
        let names: Vec<&str> =
            sources.iter().map(|s| Path::new(&s.name).file_name().unwrap().to_str().unwrap()).collect();
        assert_eq!(names, ["a.yml", "b.yaml"]);
        assert_eq!(site_of(&sources).unwrap().as_str(), "edge-01");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
