//! `landfall package …`: the package catalog (register, list), artifacts into it (`upload`,
//! in [`super::artifacts`]), and the fleet patched to a version (`patch`, in
//! [`super::rollout`]).

use std::process::ExitCode;

use anyhow::Context;
use bus_schema::domain::Package;
use bus_schema::names::{self, keys};
use bus_schema::pb;
use bus_schema::runtime::Envelope;
use clap::{Args, Subcommand};

use super::artifacts::{self, UploadArgs};
use super::connect::connect;
use super::output::{Format, emit};
use super::package_args::PackageIdArgs;
use super::rollout::{self, PatchArgs};
use crate::views::catalog::{catalog_json, catalog_rows, catalog_text};

#[derive(Debug, Subcommand)]
pub enum PackageCommand {
    /// Upload an artifact into the artifact store (streamed, hashed on the way) and register it:
    /// sites get its bytes from the distribution service, verified by sha256.
    Upload(UploadArgs),
    /// Add a package version to the catalog (with --auto-rollout, also set this name's policy:
    /// each version registered that is the newest rolls out to the selected sites).
    Register(RegisterPackageArgs),
    /// Every catalog entry, and whether its name has an auto-rollout policy.
    List {
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
    /// Move every selected node that runs NAME to VERSION, site by site in waves.
    Patch(PatchArgs),
    /// A helm-chart package rendered for one site, as its gateway gets it: the manifests in the
    /// order they are applied (what they were made of on stderr).
    Render(super::chart::RenderArgs),
    /// What a helm-chart package's next version (or the sites' values as they are now) would
    /// change at each site, object by object, before a rollout starts.
    Diff(super::chart::DiffArgs),
    /// Whether a site's helm chart releases are as their renders say, checked by its gateway
    /// now (and put back where a package says so).
    Drift {
        #[arg(long)]
        site: String,
    },
}

#[derive(Debug, Args)]
pub struct RegisterPackageArgs {
    #[command(flatten)]
    pub package: PackageIdArgs,
    /// Lowercase hex sha256 of the artifact.
    #[arg(long)]
    pub sha256: String,
    #[arg(long)]
    pub size: u64,
    /// The artifact's object in the artifact store (`package upload` sets it); without one the
    /// package is registered by its metadata alone and sites get its bytes some other way.
    #[arg(long, default_value = "")]
    pub object_key: String,
}

/// Runs one `landfall package …` command.
pub async fn run(url: &str, cmd: PackageCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        PackageCommand::Upload(args) => artifacts::upload(url, args).await,
        PackageCommand::Register(args) => register_package(url, args).await,
        PackageCommand::List { output } => package_list(url, output).await,
        PackageCommand::Patch(args) => rollout::patch(url, &args).await,
        PackageCommand::Render(args) => super::chart::render(url, &args).await,
        PackageCommand::Diff(args) => super::chart::diff(url, &args).await,
        PackageCommand::Drift { site } => super::chart::drift(url, &site).await,
    }
}

pub async fn register_package(url: &str, args: RegisterPackageArgs) -> anyhow::Result<ExitCode> {
    let RegisterPackageArgs { package: PackageIdArgs { name, version, kind, chart, policy }, sha256, size, object_key } =
        args;
    let kind: pb::PackageKind = kind.parse()?;
    if kind == pb::PackageKind::HelmChart {
        anyhow::bail!(
            "a helm-chart package is checked with helm from its archive: register it with `landfall package upload`"
        );
    }
    let chart = chart.release(kind, &name)?;
    let pkg = pb::Package { name, version, kind: kind as i32, sha256, size, object_key, chart, render: None };
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

pub async fn package_list(url: &str, output: Format) -> anyhow::Result<ExitCode> {
    let bus = connect(url).await?;
    let kv = bus.kv(names::PACKAGES_BUCKET).await?;
    let packages = kv.scan::<pb::Package>(keys::PACKAGE_PREFIX).await?.into_iter().map(|(_, p, _)| p).collect();
    let policies: Vec<pb::PackagePolicy> =
        kv.scan::<pb::PackagePolicy>(keys::POLICY_PREFIX).await?.into_iter().map(|(_, p, _)| p).collect();
    let rows = catalog_rows(packages, &policies);
    match output {
        Format::Json | Format::Yaml => emit(output, &catalog_json(&rows))?,
        Format::Table => print!("{}", catalog_text(&rows)),
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Command;
    use crate::testing::parse;

    #[test]
    fn register_takes_the_same_flags() {
        let command = parse(&[
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
        let Command::Package(PackageCommand::Register(r)) = command else { panic!("not register") };
        assert!(r.package.policy.auto_rollout);
        let policy = r.package.policy.rollout.auto_rollout().unwrap();
        assert!(policy.enabled);
        assert_eq!(policy.selector.unwrap().labels.len(), 1);
        assert_eq!(policy.strategy.unwrap().canary_sites, 1);
        let both = ["landfall", "package", "register", "--name", "k", "--version", "1", "--kind", "binary"];
        let both = [&both[..], &["--sha256", "ab", "--size", "1", "--auto-rollout", "--no-auto-rollout"]].concat();
        assert!(parse(&both).is_err());
    }
}
