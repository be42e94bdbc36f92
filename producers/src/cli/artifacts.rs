//! `landfall package upload` and `landfall site stage`: artifacts into the store, and into a
//! site's cache ahead of its install.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use async_nats::jetstream::consumer::DeliverPolicy;
use bus_schema::domain::{Package, SiteId};
use bus_schema::names::{self, keys};
use bus_schema::pb::{self, BusMessage};
use bus_schema::runtime::{Bus, Envelope};
use clap::Args;
use consumers::artifacts::{ArtifactStore, hash_file};

use super::connect::{EXIT_REJECTED, EXIT_TIMEOUT, connect, follow, rejected};
use super::package_args::PackageIdArgs;
use crate::flags::StoreArgs;
use crate::flags::parse_duration;

#[derive(Debug, Args)]
pub struct UploadArgs {
    /// The artifact: an OS image, a binary, or a container package's manifests bundle.
    pub file: PathBuf,
    #[command(flatten)]
    pub package: PackageIdArgs,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Args)]
pub struct StageArgs {
    pub site: String,
    /// Stage the artifacts of this design revision instead of the latest.
    #[arg(long)]
    pub revision: Option<u64>,
    /// Wait until the site's cache holds every artifact; exit 0 then, 1 when staging failed.
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits.
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// The store clients write to: the one named, else the one the distribution service serves.
pub async fn client_store(bus: &Bus, args: &StoreArgs) -> anyhow::Result<ArtifactStore> {
    let packages = bus.kv(names::PACKAGES_BUCKET).await?;
    let announced = packages.get::<pb::ArtifactStoreInfo>(keys::ARTIFACT_STORE).await?.map(|(i, _)| i.url);
    if args.store.is_none() && announced.is_none() {
        bail!(
            "no artifact store: no distribution service has announced one (is `landfall up` or `landfall serve \
             distribution` running?); name one with --store"
        );
    }
    args.open_or_default(announced.as_deref())
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

pub async fn upload(url: &str, args: UploadArgs) -> anyhow::Result<ExitCode> {
    let PackageIdArgs { name, version, kind, chart, policy } = args.package;
    let kind: pb::PackageKind = kind.parse()?;
    let policy = policy.policy()?;
    let chart = match chart.release(kind, &name)? {
        Some(release) => match super::chart::checked(&args.file, release).await {
            Ok(checked) => Some(checked),
            Err(e) => match super::chart::refusal(&e) {
                Some(said) => {
                    eprintln!("refused: helm cannot render {}: {said}", args.file.display());
                    return Ok(ExitCode::from(EXIT_REJECTED));
                }
                None => return Err(e),
            },
        },
        None => None,
    };
    let file = tokio::fs::File::open(&args.file).await.with_context(|| format!("open {}", args.file.display()))?;
    let bus = connect(url).await?;
    let store = client_store(&bus, &args.store).await?;
    let packages = bus.kv(names::PACKAGES_BUCKET).await?;
    let what = format!("{name}@{version}");
    let existing = packages.get::<pb::Package>(&keys::package(&name, &version)).await?.map(|(p, _)| p);

    // A version is immutable: the same bytes again change nothing, other bytes are refused,
    // and neither needs the upload to find out.
    if let Some(e) = &existing {
        let (sha256, size) = hash_file(&args.file).await.with_context(|| format!("read {}", args.file.display()))?;
        if e.sha256 != sha256 || e.size != size {
            eprintln!(
                "refused: {what} is registered with sha256:{} ({} bytes); {} is sha256:{sha256} ({size} bytes). A \
                 version's content never changes: upload it as a new version.",
                e.sha256,
                e.size,
                args.file.display()
            );
            return Ok(ExitCode::from(EXIT_REJECTED));
        }
        if !e.object_key.is_empty() && store.size(&e.object_key).await? == Some(size) {
            println!("{what} is uploaded already (sha256:{sha256}, {size} bytes): nothing to do");
            return Ok(ExitCode::SUCCESS);
        }
    }

    let started = Instant::now();
    drop(file);
    let stored = store.upload_file(&args.file).await?;
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "{} {:.1} MiB into {} in {secs:.1} s ({:.0} MiB/s), sha256:{}",
        if stored.new { "uploaded" } else { "found" },
        mib(stored.size),
        store.url(),
        mib(stored.size) / secs.max(1e-9),
        stored.sha256
    );
    let pkg = pb::Package {
        name,
        version,
        kind: kind as i32,
        sha256: stored.sha256,
        size: stored.size,
        object_key: stored.object_key,
        chart,
        render: None,
    };
    Package::try_from(pkg.clone()).context("invalid package")?;
    let mut reader = bus.read_events(vec![names::scope_events(names::FLEET)], DeliverPolicy::New).await?;
    let env = Envelope::root();
    bus.publish_command(&pb::RegisterPackage { package: Some(pkg), auto_rollout: policy }, &env).await?;
    let verdict = follow(&mut reader, &env.id, Duration::from_secs(60), |e| {
        let d = &e.delivery;
        Ok(match d.type_name.as_str() {
            pb::PackageRegistered::TYPE => {
                println!("{what} registered (command {})", env.id);
                Some(ExitCode::SUCCESS)
            }
            pb::CommandRejected::TYPE => Some(rejected(d)?),
            _ => None,
        })
    })
    .await?;
    Ok(verdict.unwrap_or_else(|| {
        eprintln!("registered {what} is not confirmed after 60 s; is the orchestrator running?");
        ExitCode::from(EXIT_TIMEOUT)
    }))
}

pub async fn stage(url: &str, args: &StageArgs) -> anyhow::Result<ExitCode> {
    let site = SiteId::try_from(args.site.as_str())?;
    let bus = connect(url).await?;
    let mut reader = match args.wait {
        true => Some(bus.read_events(vec![names::scope_events(site.as_str())], DeliverPolicy::New).await?),
        false => None,
    };
    let env = Envelope::root();
    let cmd = pb::StageSite { site_id: site.to_string(), design_revision: args.revision.unwrap_or(0) };
    bus.publish_command(&cmd, &env).await?;
    eprintln!("StageSite {site} published as {}", env.id);
    let Some(reader) = reader.as_mut() else { return Ok(ExitCode::SUCCESS) };
    let verdict = follow(reader, &env.id, args.timeout, |e| {
        let d = &e.delivery;
        let decode_err = |e| anyhow::anyhow!("{e}");
        Ok(match d.type_name.as_str() {
            pb::ArtifactsStaged::TYPE => {
                let s: pb::ArtifactsStaged = d.decode().map_err(decode_err)?;
                println!(
                    "{site}: {} artifacts in the cache, {:.1} MiB transferred, {:.1} MiB there already, {:.1} MiB \
                     kept from a cut transfer{}",
                    s.artifacts,
                    mib(s.bytes_transferred),
                    mib(s.bytes_present),
                    mib(s.bytes_resumed),
                    match s.external {
                        0 => String::new(),
                        n => format!("; {n} not in the artifact store (the site fetches them)"),
                    }
                );
                Some(ExitCode::SUCCESS)
            }
            pb::JobFailed::TYPE => {
                let f: pb::JobFailed = d.decode().map_err(decode_err)?;
                eprintln!("staging failed: {}", f.reason);
                Some(ExitCode::FAILURE)
            }
            pb::CommandRejected::TYPE => Some(rejected(d)?),
            _ => None,
        })
    })
    .await?;
    Ok(verdict.unwrap_or_else(|| {
        eprintln!("gave up waiting after {:?}; staging goes on (landfall events --site {site})", args.timeout);
        ExitCode::from(EXIT_TIMEOUT)
    }))
}
