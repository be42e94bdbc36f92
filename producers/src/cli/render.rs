//! `landfall site render SITE` and `landfall design render -f FILE…`: the objects a Cluster API
//! site's design becomes at the site, exactly as its gateway applies them, to review or diff
//! before anything is applied (as `helm template` or `kustomize build` print theirs).

use std::collections::HashMap;
use std::process::ExitCode;

use anyhow::{Context, bail};
use bus_schema::domain::{Package, PackageRef, SiteDesign, SiteId};
use bus_schema::names::{self, keys};
use bus_schema::pb;
use bus_schema::runtime::Bus;
use clap::{Args, ValueEnum};
use site_gateway::capi::{RenderSettings, render};

use super::connect::connect;

/// What the site's gateway is started with (the same flags as `landfall-gateway --backend
/// kube`), which the objects depend on.
#[derive(Debug, Args)]
pub struct RenderArgs {
    /// The bootstrap cluster's namespace the hosts and objects are in.
    #[arg(long, default_value = "metal3")]
    pub namespace: String,
    /// The cluster's name (default: the site id).
    #[arg(long)]
    pub cluster: Option<String>,
    /// Where Ironic downloads os-images from (the site's cache served over HTTP).
    #[arg(long, default_value = "http://localhost:8080/")]
    pub image_base_url: String,
    #[arg(long, default_value = "10.244.64.0/18")]
    pub pod_subnet: String,
    #[arg(long, default_value = "10.96.0.0/12")]
    pub service_subnet: String,
    #[arg(short = 'o', long, value_enum, default_value_t = RenderFormat::Yaml)]
    pub output: RenderFormat,
}

/// How the objects are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RenderFormat {
    /// One YAML document per object, as `kubectl apply -f` reads them.
    Yaml,
    /// A JSON array of the objects.
    Json,
}

impl RenderArgs {
    fn settings(&self, site: &SiteId) -> RenderSettings {
        RenderSettings {
            namespace: self.namespace.clone(),
            cluster: self.cluster.clone().unwrap_or_else(|| site.to_string()),
            image_base_url: self.image_base_url.clone(),
            pod_subnet: self.pod_subnet.clone(),
            service_subnet: self.service_subnet.clone(),
        }
    }
}

/// `site render SITE`: from the site's design as the hub holds it.
pub async fn site(url: &str, site: &str, args: &RenderArgs) -> anyhow::Result<ExitCode> {
    let site = SiteId::try_from(site)?;
    let bus = connect(url).await?;
    let sites = bus.kv(names::SITES_BUCKET).await?;
    let Some((design, _)) = sites.get::<pb::SiteDesign>(&keys::site(site.as_str())).await? else {
        bail!("site {site} is not registered");
    };
    let design = SiteDesign::try_from(design).with_context(|| format!("the design of {site}"))?;
    print(&bus, &design, args).await
}

/// `design render -f FILE…`: from design documents, as `design apply` would store them (their
/// `effective` site).
pub async fn effective(bus: &Bus, effective: pb::SiteDesign, args: &RenderArgs) -> anyhow::Result<ExitCode> {
    let design = SiteDesign::try_from(effective).context("the design's effective site")?;
    print(bus, &design, args).await
}

/// Renders `design` with the catalog's entries of its packages, and prints the objects.
async fn print(bus: &Bus, design: &SiteDesign, args: &RenderArgs) -> anyhow::Result<ExitCode> {
    let packages = bus.kv(names::PACKAGES_BUCKET).await?;
    let mut catalog: HashMap<PackageRef, Package> = HashMap::new();
    for r in design.all_packages() {
        if let Some((p, _)) = packages.get::<pb::Package>(&keys::package(r.name.as_str(), r.version.as_str())).await?
            && let Ok(p) = Package::try_from(p)
        {
            catalog.insert(r.clone(), p);
        }
    }
    let objects = render(design, |r| catalog.get(r).cloned(), &args.settings(&design.site))?;
    match args.output {
        RenderFormat::Json => println!("{}", serde_json::to_string_pretty(&objects)?),
        RenderFormat::Yaml => {
            for o in &objects {
                print!("---\n{}", serde_saphyr::to_string(o)?);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
