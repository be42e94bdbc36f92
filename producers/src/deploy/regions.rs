//! Regions below a core: past what one hub holds, the fleet is split into regions, each a hub
//! of its own (`deploy nats-config --region`), under a core (`deploy core-config`).
//!
//! - A regional hub is its own JetStream domain (`hub-<region>`) with its own streams, buckets
//!   and services; everything that grows with sites stays in it.
//! - It links to the core as a leaf node that carries none of landfall's own subjects either
//!   way (`landfall.>` denied on the link): the regions never hear each other's commands,
//!   events or sites. Only JetStream crosses, each side naming the other's domain.
//! - At the core, `deploy region-link` makes a region's two streams: one keeping the commands
//!   published there for the region (`landfall.region.<region>.cmd.>`), which the region's
//!   commands stream sources under their own subjects, and one mirroring the region's events,
//!   which dashboards at the core read.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use async_nats::jetstream::{self, stream};
use bus_schema::access::{CORE_DOMAIN, check_region, region_domain};
use bus_schema::names;
use bus_schema::runtime::Bus;

use super::{
    ACCOUNT, CALLOUT_TIMEOUT_S, File, Key, TLS_TIMEOUT_S, key_pair, parse_address, quoted, read_seed,
    slow_link_settings, write_files,
};

#[derive(Debug, clap::Args)]
pub struct CoreConfigArgs {
    /// The regions below the core, each a hub of its own (comma-separated or repeated).
    #[arg(long, value_delimiter = ',', required = true)]
    pub regions: Vec<String>,
    /// The core server: HOST[:CLIENT[:LEAF[:HTTP]]] (ports default 4222, 7422, 8222).
    #[arg(long, default_value = "127.0.0.1")]
    pub core: String,
    /// Where to write (created if missing; keys already there are kept).
    #[arg(long, default_value = "./landfall-nats")]
    pub out: PathBuf,
    /// Where the core keeps its JetStream store (`<dir>/core`).
    #[arg(long, default_value = "/var/lib/nats")]
    pub store_dir: PathBuf,
    /// The core's TLS certificate (PEM), valid for its host: clients and the regions' links then
    /// speak TLS, and each region's hub verifies it (`deploy nats-config --core-ca`).
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct RegionLinkArgs {
    /// The region to link: its hub's streams are reached at the core through its domain.
    #[arg(long)]
    pub region: String,
}

/// A regional hub's link to the core: `deploy nats-config --region … --core … --core-key …`.
#[derive(Debug, Clone)]
pub struct CoreLink {
    /// The core's leaf listeners, `nats-leaf://HOST:PORT`.
    pub urls: Vec<String>,
    /// The region's seed at the core.
    pub seed: String,
    /// The CA the core's certificate is verified with, when the core speaks TLS.
    pub ca: Option<PathBuf>,
}

/// The region's link from the flags, checked: none without `--core`.
pub fn core_link(
    region: Option<&str>,
    core: &[String],
    key: Option<&Path>,
    ca: Option<&Path>,
) -> anyhow::Result<Option<CoreLink>> {
    if let Some(region) = region {
        check_region(region).map_err(|e| anyhow::anyhow!("--region: {e}"))?;
    }
    if core.is_empty() {
        return Ok(None);
    }
    let key = key.context("--core needs --core-key: the region's key, as `deploy core-config` wrote it")?;
    let seed = read_seed(key).with_context(|| format!("--core-key {}: no seed there", key.display()))?;
    let mut urls = Vec::new();
    for address in core {
        let (host, [port]) = parse_address(address, "core", [("leaf", 7422)]).map_err(anyhow::Error::msg)?;
        urls.push(format!("nats-leaf://{host}:{port}"));
    }
    let ca = match ca {
        Some(ca) => Some(std::fs::canonicalize(ca).with_context(|| format!("--core-ca {}", ca.display()))?),
        None => None,
    };
    Ok(Some(CoreLink { urls, seed, ca }))
}

/// The `remotes` entry of a regional hub's `leafnodes` block: its link to the core, in the
/// landfall account, carrying no landfall subject either way.
pub fn core_remote(link: &CoreLink) -> String {
    let tls = match &link.ca {
        Some(ca) => format!("      tls {{ ca_file: {:?}, timeout: {TLS_TIMEOUT_S} }}\n", ca.display().to_string()),
        None => String::new(),
    };
    format!(
        "  remotes: [\n    {{\n      # The core above the regions: only JetStream crosses (each side reaching the other's\n      \
         # streams through its domain), never landfall's own subjects.\n      \
         urls: [{}]\n      nkey: {:?}\n      account: {ACCOUNT}\n      compression: off\n{tls}      \
         deny_imports: [\"landfall.>\"]\n      deny_exports: [\"landfall.>\"]\n    }}\n  ]\n",
        quoted(&link.urls),
        link.seed
    )
}

/// The files of the core: its server, and a key for the operator, the system account and each
/// region's link, kept from an earlier run.
pub fn write_core(args: &CoreConfigArgs) -> anyhow::Result<Vec<File>> {
    let mut regions: Vec<&str> = Vec::new();
    for region in &args.regions {
        check_region(region).map_err(|e| anyhow::anyhow!("--regions: {e}"))?;
        if regions.contains(&region.as_str()) {
            bail!("--regions: {region} is named twice");
        }
        regions.push(region);
    }
    let (host, [client, leaf, http]) =
        parse_address(&args.core, "core", [("client", 4222), ("leaf", 7422), ("monitoring", 8222)])
            .map_err(anyhow::Error::msg)?;
    let out = &args.out;
    let key_at = |path: &str| key_pair(read_seed(&out.join(path)));
    let operator = key_at("core/users/operator.nk")?;
    let system = key_at("core/users/sys.nk")?;
    let links = regions
        .iter()
        .map(|r| Ok((*r, key_at(&format!("core/regions/{r}.nk"))?)))
        .collect::<anyhow::Result<Vec<(&str, Key)>>>()?;
    // Clients and the regions' links alike, when the core has a certificate.
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            let abs = |f: &PathBuf| std::fs::canonicalize(f).with_context(|| f.display().to_string());
            let (cert, key) = (abs(cert)?, abs(key)?);
            let block = |indent: &str| {
                format!(
                    "{indent}tls {{\n{indent}  cert_file: {:?}\n{indent}  key_file: {:?}\n{indent}  timeout: {TLS_TIMEOUT_S}\n{indent}}}\n",
                    cert.display().to_string(),
                    key.display().to_string()
                )
            };
            (format!("{}\n", block("")), block("  "))
        }
        _ => (String::new(), String::new()),
    };
    let mut conf = format!(
        "# Generated by `landfall deploy core-config`: the core above {} region(s). Each region's hub links\n\
         # here as a leaf node; `landfall deploy region-link` makes its streams here.\n\
         server_name: core\nlisten: \"{host}:{client}\"\nhttp: \"{host}:{http}\"\nmax_payload: {}\n{}\n\
         jetstream {{\n  domain: {CORE_DOMAIN}\n  store_dir: {:?}\n}}\n\n{}\
         leafnodes {{\n  listen: \"{host}:{leaf}\"\n  compression: off\n  authorization {{ timeout: {CALLOUT_TIMEOUT_S} }}\n{}}}\n\n\
         accounts {{\n  {ACCOUNT} {{\n    jetstream: enabled\n    users: [\n      # the operator\n      {{ nkey: {:?} }}\n",
        regions.len(),
        names::MAX_PAYLOAD + 64 * 1024,
        slow_link_settings(),
        args.store_dir.join("core").display().to_string(),
        tls.0,
        tls.1,
        operator.public_key,
    );
    for (region, key) in &links {
        let _ = writeln!(conf, "      # region {region}: its hub's link\n      {{ nkey: {:?} }}", key.public_key);
    }
    let _ = writeln!(
        conf,
        "    ]\n  }}\n  SYS {{\n    users: [ {{ nkey: {:?} }} ]\n  }}\n}}\nsystem_account: SYS",
        system.public_key
    );
    let seed =
        |what: &str, key: &Key| format!("# The NATS user of {what} ({}) at the core.\n{}\n", key.public_key, key.seed);
    let mut files = vec![
        File { path: "core/core.conf".into(), text: conf, secret: false },
        File { path: "core/users/operator.nk".into(), text: seed("the operator", &operator), secret: true },
        File { path: "core/users/sys.nk".into(), text: seed("the system account", &system), secret: true },
    ];
    for (region, key) in &links {
        files.push(File {
            path: format!("core/regions/{region}.nk").into(),
            text: seed(&format!("region {region}'s hub link (`deploy nats-config --core-key`)"), key),
            secret: true,
        });
    }
    write_files(out, &files)?;
    Ok(files)
}

/// What linking a region made or found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Linked {
    pub commands: String,
    pub events: String,
    /// Whether the region's commands stream had to be told to source the core's (false: it
    /// already did).
    pub source_added: bool,
}

/// Links `region` at the core `core` is connected to: the core's stream of the region's
/// commands, the core's mirror of its events, and the region's commands stream sourcing the
/// first. Each step leaves what exists alone, so linking again changes nothing.
pub async fn link_region(core: &Bus, region: &str) -> anyhow::Result<Linked> {
    check_region(region).map_err(anyhow::Error::msg)?;
    let commands = names::core_commands_stream(region);
    let events = names::core_events_stream(region);
    let keep = |name: &str| stream::Config {
        name: name.to_string(),
        storage: stream::StorageType::File,
        max_age: names::RETENTION,
        duplicate_window: names::DEDUP_WINDOW,
        max_message_size: names::MAX_PAYLOAD as i32,
        ..Default::default()
    };
    // The region's hub first: nothing is made at the core for a region it cannot reach.
    let domain = region_domain(region);
    let theirs = jetstream::with_domain(core.client().clone(), &domain);
    let mut stream = theirs.get_stream(names::COMMANDS_STREAM).await.with_context(|| {
        format!(
            "region {region}'s hub has no {} in domain {domain}: is its hub linked to this core, and its orchestrator started?",
            names::COMMANDS_STREAM
        )
    })?;
    let js = core.jetstream();
    js.get_or_create_stream(stream::Config { subjects: vec![names::region_commands(region)], ..keep(&commands) })
        .await
        .with_context(|| format!("make {commands} at the core"))?;
    let mirror =
        stream::Source { name: names::EVENTS_STREAM.into(), external: Some(api_of(&domain)), ..Default::default() };
    js.get_or_create_stream(stream::Config {
        mirror: Some(mirror),
        duplicate_window: Default::default(),
        ..keep(&events)
    })
    .await
    .with_context(|| format!("make {events} at the core, mirroring the events of region {region}"))?;
    let mut config = stream.info().await?.config.clone();
    let source_added = !config.sources.iter().flatten().any(|s| s.name == commands);
    if source_added {
        let from = names::region_commands(region);
        config.sources.get_or_insert_with(Vec::new).push(stream::Source {
            name: commands.clone(),
            external: Some(api_of(CORE_DOMAIN)),
            subject_transforms: vec![stream::SubjectTransform {
                source: from,
                destination: names::COMMANDS_ALL.into(),
            }],
            ..Default::default()
        });
        theirs
            .update_stream(config)
            .await
            .with_context(|| format!("tell region {region}'s {} to source {commands}", names::COMMANDS_STREAM))?;
    }
    Ok(Linked { commands, events, source_added })
}

/// Where another JetStream domain's API is reached from here.
fn api_of(domain: &str) -> stream::External {
    stream::External { api_prefix: format!("$JS.{domain}.API"), delivery_prefix: None }
}
