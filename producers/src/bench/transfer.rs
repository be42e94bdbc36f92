//! `landfall bench transfer`: an artifact of a given size uploaded into the artifact store, read
//! back raw from the store, and staged into a site gateway's cache over the bus, each with its
//! MB/s and the process's peak RSS, all in one run on one machine.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bus_schema::domain::SiteId;
use bus_schema::names;
use bus_schema::pb::{self, BusMessage};
use bus_schema::runtime::{Bus, Envelope, Topology};
use consumers::artifacts::hash_file;
use serde_json::json;
use site_gateway::ArtifactCache;
use site_gateway::sim::{SimConfig, SimSite};
use tokio::io::AsyncWriteExt;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::flags::StoreArgs;

/// Parses `1GiB`, `512MiB`, `64KiB`, `100MB`, or a plain number of bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits.parse().map_err(|_| format!("{s:?} is not a size (e.g. 1GiB, 512MiB)"))?;
    let factor: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => return Err(format!("unknown size unit {other:?} (B, KiB, MiB, GiB, KB, MB, GB)")),
    };
    n.checked_mul(factor).ok_or_else(|| format!("{s} is too large"))
}

/// A memory figure (`VmHWM`, `VmRSS`) of a /proc/<pid>/status text, in bytes.
pub fn status_bytes(status: &str, field: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

/// A memory figure of this process, in bytes.
fn proc_status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status_bytes(&status, field).unwrap_or(0)
}

/// The process's peak resident set since the last [`reset_peak_rss`].
fn peak_rss() -> u64 {
    proc_status_bytes("VmHWM")
}

fn current_rss() -> u64 {
    proc_status_bytes("VmRSS")
}

/// Starts a new peak: Linux resets VmHWM to the current RSS when 5 is written to clear_refs.
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn rate(bytes: u64, took: Duration) -> f64 {
    (mib(bytes) / took.as_secs_f64().max(1e-9) * 10.0).round() / 10.0
}

/// Writes `size` bytes of stand-in content to `path`, a MiB at a time.
async fn write_file(path: &Path, size: u64) -> anyhow::Result<()> {
    let mut file = tokio::fs::File::create(path).await.with_context(|| format!("create {}", path.display()))?;
    let block = crate::run::demo::demo_content("bench-transfer", "1", 1 << 20);
    let mut left = size;
    let mut i = 0u8;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        let mut piece = block[..n].to_vec();
        piece[0] = i; // no two blocks alike
        i = i.wrapping_add(1);
        file.write_all(&piece).await?;
        left -= n as u64;
    }
    file.sync_all().await?;
    Ok(())
}

pub async fn transfer(url: &str, size: u64, store_args: &StoreArgs) -> anyhow::Result<serde_json::Value> {
    anyhow::ensure!(size > 0, "--size must be more than 0 bytes");
    let scratch = std::env::temp_dir().join(format!("landfall-bench-transfer-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&scratch)?;
    let result = run(url, size, store_args, &scratch).await;
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

async fn run(url: &str, size: u64, store_args: &StoreArgs, scratch: &Path) -> anyhow::Result<serde_json::Value> {
    let file = scratch.join("artifact");
    eprintln!("writing a {:.0} MiB artifact ...", mib(size));
    write_file(&file, size).await?;
    let default_store = scratch.join("store").display().to_string();
    let store = store_args.open_or_default(Some(&default_store))?;

    // 1. Upload: streamed from the file, hashed on the way.
    reset_peak_rss();
    let rss_before = current_rss();
    let started = Instant::now();
    let stored =
        store.upload(tokio::io::BufReader::with_capacity(1 << 20, tokio::fs::File::open(&file).await?)).await?;
    let upload_took = started.elapsed();
    let upload_peak = peak_rss();
    let (sha256, _) = hash_file(&file).await?;
    anyhow::ensure!(stored.sha256 == sha256, "the store filed the upload under another digest");
    let _ = std::fs::remove_file(&file);
    eprintln!("upload: {:.1} MiB/s", rate(size, upload_took));

    // 2. Raw reads from the store, in the distribution service's chunk size, one at a time.
    let started = Instant::now();
    let chunk = u64::from(consumers::distribution::DEFAULT_CHUNK_SIZE);
    let mut at = 0;
    while at < size {
        let end = (at + chunk).min(size);
        store.read(&stored.object_key, at..end).await?;
        at = end;
    }
    let raw_took = started.elapsed();
    eprintln!("raw store read: {:.1} MiB/s", rate(size, raw_took));

    // 3. The bus alone: the same number of chunk-sized replies, with the gateway's window of
    //    requests in flight, from a responder that only hands back a buffer.
    let bus = Bus::connect(url, "landfall-bench").await?;
    bus.ensure_topology(&Topology::default()).await?;
    let bus_took = raw_request_reply(&bus, size, chunk).await?;
    eprintln!("raw NATS request/reply: {:.1} MiB/s", rate(size, bus_took));

    // 4. Staging: a site gateway fetches it over the bus from the distribution service.
    let shutdown = CancellationToken::new();
    let mut services = JoinSet::new();
    services.spawn(consumers::run_orchestrator(bus.clone(), Default::default(), shutdown.clone()));
    services.spawn(consumers::run_distribution(bus.clone(), store.clone(), Default::default(), shutdown.clone()));
    let pkg = pb::Package {
        name: "bench-artifact".into(),
        version: format!("{size}"),
        kind: pb::PackageKind::Binary as i32,
        sha256: stored.sha256.clone(),
        size,
        object_key: stored.object_key.clone(),
        chart: None,
        render: None,
    };
    let mut events = bus.read_events(vec![names::EVENTS_ALL.to_string()], Default::default()).await?;
    let register = Envelope::root();
    bus.publish_command(&pb::RegisterPackage { package: Some(pkg.clone()), auto_rollout: None }, &register).await?;
    wait_for::<pb::PackageRegistered>(&mut events, &register.id).await?;

    let site = SiteId::try_from("bench-site")?;
    let cache = ArtifactCache::new(scratch.join("cache"));
    let sim = SimSite::new(site.as_str(), &[], SimConfig::instant());
    services.spawn(site_gateway::run_gateway(
        site.clone(),
        bus.clone(),
        Arc::new(sim),
        cache.clone(),
        names::ALIVE_EVERY,
        shutdown.clone(),
    ));
    let job_env = Envelope::root();
    reset_peak_rss();
    let started = Instant::now();
    bus.publish_job(&pb::StageArtifacts { site_id: site.to_string(), artifacts: vec![pkg] }, &job_env).await?;
    let staged = wait_for::<pb::ArtifactsStaged>(&mut events, &job_env.id).await?;
    let stage_took = started.elapsed();
    let stage_peak = peak_rss();
    shutdown.cancel();
    while services.join_next().await.is_some() {}
    let staged: pb::ArtifactsStaged = staged.decode().map_err(|e| anyhow::anyhow!("{e}"))?;
    anyhow::ensure!(staged.bytes_transferred == size, "staged {} of {size} bytes", staged.bytes_transferred);
    let (cached_sha, _) = hash_file(&cache.path(&stored.sha256)).await?;
    anyhow::ensure!(cached_sha == stored.sha256, "the cached artifact does not match its digest");
    eprintln!("site staging: {:.1} MiB/s", rate(size, stage_took));

    let raw = rate(size, raw_took);
    Ok(json!({
        "bench": "transfer",
        "size_bytes": size,
        "store": store.url(),
        "upload_mib_s": rate(size, upload_took),
        "raw_store_read_mib_s": raw,
        "raw_nats_request_reply_mib_s": rate(size, bus_took),
        "staging_vs_raw_request_reply": (rate(size, stage_took) / rate(size, bus_took) * 1000.0).round() / 1000.0,
        "site_staging_mib_s": rate(size, stage_took),
        "staging_vs_raw_read": (rate(size, stage_took) / raw * 1000.0).round() / 1000.0,
        "upload_peak_rss_growth_mib": (mib(upload_peak.saturating_sub(rss_before)) * 10.0).round() / 10.0,
        "upload_peak_rss_mib": (mib(upload_peak) * 10.0).round() / 10.0,
        "staging_peak_rss_mib": (mib(stage_peak) * 10.0).round() / 10.0,
        "cached_artifact_verified": true,
    }))
}

/// `size` bytes of replies of `chunk` bytes, [`site_gateway::cache::WINDOW`] requests in flight.
async fn raw_request_reply(bus: &Bus, size: u64, chunk: u64) -> anyhow::Result<Duration> {
    use futures::StreamExt;
    let subject = names::bench_echo(&uuid::Uuid::now_v7().simple().to_string());
    let mut sub = bus.client().subscribe(subject.clone()).await?;
    let client = bus.client().clone();
    let body = bytes::Bytes::from(vec![7u8; chunk as usize]);
    let responder = tokio::spawn(async move {
        while let Some(m) = sub.next().await {
            if let Some(reply) = m.reply {
                let _ = client.publish(reply, body.clone()).await;
            }
        }
    });
    let started = Instant::now();
    let requests = size.div_ceil(chunk);
    let mut inflight = futures::stream::FuturesOrdered::new();
    for _ in 0..requests {
        inflight.push_back(bus.client().request(subject.clone(), bytes::Bytes::new()));
        while inflight.len() >= site_gateway::cache::WINDOW {
            inflight.next().await.context("reply")??;
        }
    }
    while let Some(r) = inflight.next().await {
        r?;
    }
    let took = started.elapsed();
    responder.abort();
    Ok(took)
}

/// The event of type `M` correlated with `correlation`; an error on a rejection or failed job.
async fn wait_for<M: BusMessage>(
    events: &mut bus_schema::runtime::EventReader,
    correlation: &str,
) -> anyhow::Result<bus_schema::runtime::Delivery> {
    let found = crate::cli::connect::follow(events, correlation, Duration::from_secs(3600), |e| {
        let d = &e.delivery;
        if d.type_name == pb::JobFailed::TYPE || d.type_name == pb::CommandRejected::TYPE {
            let v = pb::decode_to_json(&d.type_name, &d.payload);
            anyhow::bail!("{}: {v:?}", d.type_name);
        }
        Ok((d.type_name == M::TYPE).then(|| d.clone()))
    })
    .await?;
    found.context("no such event within an hour")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("100MB"), Ok(100_000_000));
        assert_eq!(parse_size("42"), Ok(42));
        assert!(parse_size("1 furlong").is_err());
        assert!(parse_size("GiB").is_err());
    }
}
