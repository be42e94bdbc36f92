//! Helm charts on the command line: a chart archive checked with the real helm before it is
//! registered (`package upload --kind helm-chart`), and a site's render printed (`package
//! render`).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use bus_schema::domain::{SiteDesign, SiteId};
use bus_schema::names::{self, keys};
use bus_schema::pb;
use bus_schema::runtime::Bus;
use clap::Args;
use consumers::artifacts::ArtifactStore;
use consumers::helm::{Helm, HelmError, Template, traits};
use prost::Message;
use serde_json::Value;

use super::artifacts::client_store;
use super::connect::connect;
use crate::flags::StoreArgs;

/// Why a chart was refused at registration: helm's own words.
#[derive(Debug)]
pub struct ChartRefused(pub String);

impl std::fmt::Display for ChartRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ChartRefused {}

/// Whether helm's refusal may be the values each site's design will give: a value the chart
/// requires (`required`, a template that needs it) or a property its schema requires.
fn wants_site_values(said: &str) -> bool {
    let schema = "values don't meet the specifications of the schema";
    if said.contains(schema) {
        let problems: Vec<&str> = said.lines().filter(|l| l.trim_start().starts_with("- at ")).collect();
        return !problems.is_empty() && problems.iter().all(|l| l.contains("missing property"));
    }
    said.contains("execution error at")
}

/// `chart` completed from the archive at `file`: its name and version, and whether it uses
/// `lookup` or makes random values. The archive is rendered once with the package's values:
/// a chart helm cannot render is refused with helm's message, unless what it lacks is a value
/// the sites' designs may give (that is said, and the chart is registered).
///
/// # Errors
/// [`ChartRefused`] (inside the error) when helm refuses the chart; others when helm cannot run.
pub async fn checked(file: &Path, mut chart: pb::HelmChart) -> anyhow::Result<pb::HelmChart> {
    let helm = Helm::locate().map_err(anyhow::Error::msg)?;
    let refused = |e: HelmError| match e {
        HelmError::Refused(said) => anyhow::Error::new(ChartRefused(said)),
        e => anyhow::Error::new(e),
    };
    let meta = helm.chart(file).await.map_err(refused)?;
    let found = traits(file).await.map_err(refused)?;
    let values: Value = match chart.values.trim() {
        "" => Value::Object(Default::default()),
        text => bus_schema::yaml::from_str(text).context("--values")?,
    };
    let trial = Template {
        chart: file,
        release: &chart.release,
        namespace: &chart.namespace,
        values: std::slice::from_ref(&values),
        kube_version: None,
        api_versions: &[],
    };
    match helm.template(&trial).await {
        Ok(_) => {}
        Err(HelmError::Refused(said)) if wants_site_values(&said) => {
            eprintln!(
                "note: {} {} renders only with values the sites' designs give (a site whose design lacks them is \
                 refused at its render, nothing applied): {said}",
                meta.name, meta.version
            );
        }
        Err(e) => return Err(refused(e)),
    }
    if !found.lookup.is_empty() {
        eprintln!(
            "note: {} calls lookup ({}): rendered at the hub, without the cluster, it finds nothing",
            meta.name,
            found.lookup.join(", ")
        );
    }
    if !found.random.is_empty() {
        eprintln!(
            "note: {} makes random values ({}): each site's render is made once and kept until its chart or \
             values change",
            meta.name,
            found.random.join(", ")
        );
    }
    chart.chart_name = meta.name;
    chart.chart_version = meta.version;
    chart.uses_lookup = !found.lookup.is_empty();
    chart.makes_random = !found.random.is_empty();
    Ok(chart)
}

/// Refuses a chart with helm's reason, for the caller's exit code.
pub fn refusal(e: &anyhow::Error) -> Option<String> {
    e.downcast_ref::<ChartRefused>().map(|r| r.0.clone())
}

/// `landfall package render`.
#[derive(Debug, Args)]
pub struct RenderArgs {
    /// The helm-chart package.
    pub name: String,
    /// The site it is rendered for.
    #[arg(long)]
    pub site: String,
    /// The version [default: the one the site's design runs].
    #[arg(long)]
    pub version: Option<String>,
    #[command(flatten)]
    pub store: StoreArgs,
}

/// `landfall package diff`.
#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The helm-chart package.
    pub name: String,
    /// The version to compare with what each site runs [default: the version each site runs,
    /// with the values its design gives now].
    #[arg(long)]
    pub version: Option<String>,
    /// Only these sites (comma-separated) [default: every site whose design runs the package].
    #[arg(long, value_delimiter = ',', value_name = "SITE,...")]
    pub sites: Vec<String>,
    #[command(flatten)]
    pub store: StoreArgs,
}

/// The version of `name` the site's design runs.
fn design_version(design: &SiteDesign, name: &str) -> Option<String> {
    design.all_packages().into_iter().find(|p| p.name.as_str() == name).map(|p| p.version.to_string())
}

/// The site's render of `name`@`version`, made (or found made) by the hub as the site's gateway
/// would get it, and its manifests.
async fn site_render(
    bus: &Bus,
    store: &ArtifactStore,
    site: &str,
    name: &str,
    version: &str,
) -> anyhow::Result<(pb::Package, String)> {
    let req = pb::ChartRenderRequest {
        site_id: site.into(),
        name: name.into(),
        version: version.into(),
        ..Default::default()
    };
    let (_, body) = bus
        .request(names::chart_render_svc(site), req.encode_to_vec().into(), Duration::from_secs(90))
        .await
        .map_err(|e| anyhow!("{name}@{version} for site {site}: {e}"))?;
    let reply = pb::ChartRenderReply::decode(body).context("the hub's answer")?;
    let package = reply.package.context("the hub answered without a package")?;
    let bytes = store.read(&package.object_key, 0..package.size).await?;
    let text = String::from_utf8(bytes.to_vec()).context("the render is not text")?;
    Ok((package, text))
}

/// Prints a site's render of a chart.
pub async fn render(url: &str, args: &RenderArgs) -> anyhow::Result<ExitCode> {
    let bus = connect(url).await?;
    let store = client_store(&bus, &args.store).await?;
    let site = SiteId::try_from(args.site.as_str())?;
    let version = match &args.version {
        Some(v) => v.clone(),
        None => {
            let design = site_design(&bus, &site).await?;
            design_version(&design, &args.name)
                .ok_or_else(|| anyhow!("site {site}'s design does not run {}: name one with --version", args.name))?
        }
    };
    let (package, text) = site_render(&bus, &store, site.as_str(), &args.name, &version).await?;
    if let Some(r) = &package.render {
        eprintln!(
            "# {}@{version} for {site}: chart sha256:{}, values sha256:{}, helm {}, Kubernetes {}, render sha256:{} ({} bytes)",
            args.name,
            r.chart_sha256,
            r.values_digest,
            r.helm_version,
            if r.kube_version.is_empty() { "(helm's default)" } else { &r.kube_version },
            package.sha256,
            package.size
        );
    }
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}

async fn site_design(bus: &Bus, site: &SiteId) -> anyhow::Result<SiteDesign> {
    let sites = bus.kv(names::SITES_BUCKET).await?;
    let (design, _) =
        sites.get::<pb::SiteDesign>(&keys::site(site.as_str())).await?.ok_or_else(|| anyhow!("no site {site}"))?;
    Ok(SiteDesign::try_from(design)?)
}

/// Prints, per site, what the next render would change: objects added, removed, changed.
pub async fn diff(url: &str, args: &DiffArgs) -> anyhow::Result<ExitCode> {
    let bus = connect(url).await?;
    let store = client_store(&bus, &args.store).await?;
    let sites = bus.kv(names::SITES_BUCKET).await?;
    let mut designs = Vec::new();
    for (_, design, _) in sites.scan::<pb::SiteDesign>(keys::SITE_PREFIX).await? {
        let Ok(design) = SiteDesign::try_from(design) else { continue };
        if !args.sites.is_empty() && !args.sites.iter().any(|s| s == design.site.as_str()) {
            continue;
        }
        if design_version(&design, &args.name).is_some() {
            designs.push(design);
        }
    }
    if designs.is_empty() {
        bail!("no site{} runs {}", if args.sites.is_empty() { "" } else { " of those named" }, args.name);
    }
    let mut changed_sites = 0;
    for design in designs {
        let site = design.site.as_str();
        let now = design_version(&design, &args.name).unwrap_or_default();
        let next = args.version.clone().unwrap_or_else(|| now.clone());
        let before = kept_render(&bus, &store, site, &args.name, &now).await?;
        let after = site_render(&bus, &store, site, &args.name, &next).await;
        let after = match after {
            Ok((_, text)) => text,
            Err(e) => {
                println!("{site}: {}@{next} does not render: {e:#}", args.name);
                changed_sites += 1;
                continue;
            }
        };
        let changes = object_changes(&before, &after)?;
        if changes.is_empty() {
            println!("{site}: {}@{now} -> {next}: no change", args.name);
        } else {
            changed_sites += 1;
            println!("{site}: {}@{now} -> {next}: {} object(s)", args.name, changes.len());
            for c in changes {
                println!("  {c}");
            }
        }
    }
    Ok(if changed_sites == 0 { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// Asks the site's gateway to check its charts for drift now, and prints what it found. Exit 1
/// when something drifted (put back or not).
pub async fn drift(url: &str, site: &str) -> anyhow::Result<ExitCode> {
    let site = SiteId::try_from(site)?;
    let bus = connect(url).await?;
    let req = pb::DriftCheck { site_id: site.to_string() };
    let (_, body) = bus
        .request_site(
            site.as_str(),
            names::drift_check_rpc(site.as_str()),
            req.encode_to_vec().into(),
            Duration::from_secs(120),
        )
        .await
        .map_err(|e| anyhow!("site {site}'s gateway: {e}"))?;
    let report = pb::DriftReport::decode(body).context("the gateway's answer")?;
    if report.charts.is_empty() {
        println!("{site} runs no helm chart");
    }
    let mut drifted = false;
    for chart in &report.charts {
        let what = chart.package.as_ref().map(|p| format!("{}@{}", p.name, p.version)).unwrap_or_default();
        if chart.drifted.is_empty() {
            println!("{site}: {what}: as rendered");
            continue;
        }
        drifted = true;
        let outcome = match (chart.corrected, chart.reason.as_str()) {
            (true, _) => "put back".to_string(),
            (false, "") => "reported (the package does not ask for it to be put back)".to_string(),
            (false, why) => format!("not put back: {why}"),
        };
        println!("{site}: {what}: drifted, {outcome}");
        for d in &chart.drifted {
            println!("  {d}");
        }
    }
    Ok(if drifted { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// The render the site was last given of `name`@`version` (empty when it was given none).
async fn kept_render(
    bus: &Bus,
    store: &ArtifactStore,
    site: &str,
    name: &str,
    version: &str,
) -> anyhow::Result<String> {
    let packages = bus.kv(names::PACKAGES_BUCKET).await?;
    let renders = packages.scan_few::<pb::Package>(&keys::site_renders_prefix(site)).await?;
    let latest = renders
        .into_iter()
        .map(|(_, p, _)| p)
        .filter(|p| p.name == name && p.version == version)
        .max_by_key(|p| p.render.as_ref().map_or(0, |r| r.rendered_at_ms));
    match latest {
        Some(p) => Ok(String::from_utf8_lossy(&store.read(&p.object_key, 0..p.size).await?).into_owned()),
        None => Ok(String::new()),
    }
}

/// Object by object, what `after` changes of `before`: `+ Kind/name` added, `- Kind/name`
/// removed, `~ Kind/name: a.b, c` changed at those fields.
fn object_changes(before: &str, after: &str) -> anyhow::Result<Vec<String>> {
    let objects = |text: &str| -> anyhow::Result<BTreeMap<String, Value>> {
        let r = bus_schema::chart::split(text).map_err(anyhow::Error::msg)?;
        let hooks = r.pre.into_iter().chain(r.post).map(|h| h.object);
        Ok(r.crds.into_iter().chain(hooks).chain(r.objects).map(|o| (object_id(&o), o)).collect())
    };
    let (before, after) = (objects(before)?, objects(after)?);
    let mut out = Vec::new();
    for (id, new) in &after {
        match before.get(id) {
            None => out.push(format!("+ {id}")),
            Some(old) if old != new => {
                let mut fields = Vec::new();
                changed_fields(old, new, "", &mut fields);
                out.push(format!("~ {id}: {}", fields.join(", ")));
            }
            Some(_) => {}
        }
    }
    out.extend(before.keys().filter(|id| !after.contains_key(*id)).map(|id| format!("- {id}")));
    Ok(out)
}

fn object_id(o: &Value) -> String {
    match o.pointer("/metadata/namespace").and_then(Value::as_str) {
        Some(ns) => format!(
            "{}/{ns}/{}",
            o["kind"].as_str().unwrap_or_default(),
            o.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default()
        ),
        None => bus_schema::chart::kind_name(o),
    }
}

/// The paths where `old` and `new` differ (a whole subtree once: where it starts).
fn changed_fields(old: &Value, new: &Value, at: &str, out: &mut Vec<String>) {
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                let path = if at.is_empty() { k.clone() } else { format!("{at}.{k}") };
                match (a.get(k), b.get(k)) {
                    (Some(x), Some(y)) => changed_fields(x, y, &path, out),
                    _ => out.push(path),
                }
            }
        }
        (a, b) if a != b => out.push(if at.is_empty() { "(all)".into() } else { at.to_string() }),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_site_may_still_give_is_told_from_what_is_wrong() {
        let missing = "values don't meet the specifications of the schema(s) in the following chart(s):\nc:\n- at '': missing property 'site'\n";
        let wrong = "values don't meet the specifications of the schema(s) in the following chart(s):\nc:\n- at '/replicas': minimum: got 0, want 1\n";
        assert!(wants_site_values(missing));
        assert!(!wants_site_values(wrong));
        assert!(wants_site_values("execution error at (c/templates/cm.yaml:4:20): site.name is required"));
        assert!(!wants_site_values("parse error at (c/templates/bad.yaml:2): unclosed action"));
    }

    #[test]
    fn a_diff_names_objects_added_removed_and_the_fields_changed() {
        let before = "---\n{apiVersion: v1, kind: ConfigMap, metadata: {name: a, namespace: n}, data: {x: '1', y: '2'}}\n---\n{apiVersion: v1, kind: ConfigMap, metadata: {name: gone, namespace: n}}\n";
        let after = "---\n{apiVersion: v1, kind: ConfigMap, metadata: {name: a, namespace: n}, data: {x: '3', y: '2'}}\n---\n{apiVersion: v1, kind: Secret, metadata: {name: new, namespace: n}}\n";
        assert_eq!(
            object_changes(before, after).unwrap(),
            ["~ ConfigMap/n/a: data.x", "+ Secret/n/new", "- ConfigMap/n/gone"]
        );
        assert!(object_changes(after, after).unwrap().is_empty());
    }
}
