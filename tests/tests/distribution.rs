//! Artifacts from the store to the sites: uploads, the distribution service and the gateways'
//! caches, over a real nats-server (and a real S3-compatible server), with damaged chunks, a
//! damaged store copy and a cut transfer.

use std::collections::BTreeSet;
use std::time::Duration;

use bus_schema::names;
use bus_schema::pb::{self, BusEvent, BusMessage};
use bus_schema::runtime::Envelope;
use consumers::artifacts::{self, ArtifactStore};
use landfall_tests::fleet::Fleet;
use landfall_tests::nats::NatsServer;
use landfall_tests::s3::S3Server;
use site_gateway::sim::SimConfig;

/// The distinct artifacts of the fleet's catalog that are in the store, and their total size.
fn distributable(fleet: &Fleet) -> (BTreeSet<String>, u64) {
    let mut seen = BTreeSet::new();
    let mut bytes = 0;
    for p in fleet.catalog.iter().filter(|p| !p.object_key.is_empty()) {
        if seen.insert(p.sha256.clone()) {
            bytes += p.size;
        }
    }
    (seen, bytes)
}

fn staged(run: &landfall_tests::fleet::Run) -> pb::ArtifactsStaged {
    let all = run.of_type::<pb::ArtifactsStaged>();
    assert_eq!(all.len(), 1, "one ArtifactsStaged: {:?}", run.kinds());
    all[0].clone()
}

/// Every file in the site's cache is named by its digest and has it.
fn assert_cache_verified(fleet: &Fleet, site: usize, want: &BTreeSet<String>) {
    let cache = fleet.cache(site);
    assert_eq!(&cache.inventory(), want);
    for sha in want {
        let bytes = std::fs::read(cache.path(sha)).unwrap();
        assert_eq!(&artifacts::sha256_hex(&bytes), sha);
    }
}

async fn install_ok(fleet: &Fleet, site: usize) -> landfall_tests::fleet::Run {
    let run = fleet.wait_install(&fleet.install(&fleet.site_id(site)).await).await;
    assert_eq!(run.terminal().delivery.type_name, pb::SiteInstalled::TYPE, "{:?}", run.kinds());
    run
}

async fn second_install_transfers_nothing(fleet: Fleet) {
    let (want, total) = distributable(&fleet);
    assert_eq!(want.len(), 5, "every demo package is in the store");

    let first = staged(&install_ok(&fleet, 0).await);
    assert_eq!((first.artifacts, first.bytes_transferred, first.bytes_present), (5, total, 0));
    assert_cache_verified(&fleet, 0, &want);
    assert_eq!(fleet.distribution.bytes_served(), total, "each byte sent once");
    assert_eq!(fleet.sites[0].1.effects().bytes_handed, total);

    let again = staged(&install_ok(&fleet, 0).await);
    assert_eq!((again.bytes_transferred, again.bytes_present), (0, total));
    assert_eq!(fleet.distribution.bytes_served(), total, "nothing sent the second time");
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_store_install_caches_verified_artifacts_and_a_second_install_moves_nothing() {
    let server = NatsServer::start();
    let fleet =
        Fleet::builder(&server.url()).sites(1).nodes(2).sim(SimConfig::instant()).with_artifacts().start().await;
    second_install_transfers_nothing(fleet).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_store_install_caches_verified_artifacts_and_a_second_install_moves_nothing() {
    let server = NatsServer::start();
    let s3 = S3Server::start("landfall");
    let fleet = Fleet::builder(&server.url())
        .sites(1)
        .nodes(2)
        .sim(SimConfig::instant())
        .store(&s3.location("artifacts"), s3.options())
        .with_artifacts()
        .start()
        .await;
    // The bytes are in the bucket, under their digests.
    for p in &fleet.catalog {
        let file = s3.dir.path().join("landfall").join("artifacts").join(&p.object_key);
        assert_eq!(std::fs::metadata(&file).map(|m| m.len()).ok(), Some(p.size), "{}", file.display());
    }
    second_install_transfers_nothing(fleet).await;
}

/// Uploads to S3 go in parts, so a file over one part exercises the multipart path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_upload_in_parts_is_filed_under_its_digest_once() {
    let s3 = S3Server::start("landfall");
    let store = ArtifactStore::open(&s3.location(""), &s3.options()).unwrap();
    let bytes = producers::up::demo_content("big", "1", artifacts::PART_SIZE * 2 + 12345);
    let first = store.upload(bytes.as_slice()).await.unwrap();
    assert_eq!(
        (first.sha256.as_str(), first.size, first.new),
        (artifacts::sha256_hex(&bytes).as_str(), bytes.len() as u64, true)
    );
    let again = store.upload(bytes.as_slice()).await.unwrap();
    assert!(!again.new);
    // A file goes straight to its key (S3 copies stop at 5 GiB); the same bytes again are found.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    std::fs::write(&file, &bytes[..artifacts::PART_SIZE + 1]).unwrap();
    let from_file = store.upload_file(&file).await.unwrap();
    assert!(from_file.new);
    assert_eq!(from_file.sha256, artifacts::sha256_hex(&bytes[..artifacts::PART_SIZE + 1]));
    assert!(!store.upload_file(&file).await.unwrap().new);
    let end = bytes.len() as u64;
    assert_eq!(store.read(&first.object_key, end - 10..end).await.unwrap().as_ref(), &bytes[bytes.len() - 10..]);
    // Only the two artifacts are in the bucket: the scratch upload is gone.
    let files: Vec<_> = walk(&s3.dir.path().join("landfall"));
    assert_eq!(files.len(), 2, "{files:?}");
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() { out.extend(walk(&path)) } else { out.push(path) }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staging_ahead_fills_the_cache_and_the_install_then_transfers_nothing() {
    let server = NatsServer::start();
    let fleet =
        Fleet::builder(&server.url()).sites(1).nodes(2).sim(SimConfig::instant()).with_artifacts().start().await;
    let (want, total) = distributable(&fleet);
    let env = Envelope::root();
    fleet.bus.publish_command(&pb::StageSite { site_id: fleet.site_id(0), design_revision: 0 }, &env).await.unwrap();
    let done = fleet.wait_for(pb::ArtifactsStaged::filter(), &env.id, Duration::from_secs(30)).await.expect("staged");
    let s: pb::ArtifactsStaged = done.delivery.decode().unwrap();
    assert_eq!(s.bytes_transferred, total);
    assert_cache_verified(&fleet, 0, &want);
    // Staging changed no node.
    assert!(fleet.sites[0].1.effects().provisions.is_empty());

    let install = staged(&install_ok(&fleet, 0).await);
    assert_eq!((install.bytes_transferred, install.bytes_present), (0, total));
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_damaged_on_the_way_is_fetched_again_and_the_install_goes_on() {
    let server = NatsServer::start();
    let fleet =
        Fleet::builder(&server.url()).sites(1).nodes(2).sim(SimConfig::instant()).with_artifacts().start().await;
    let (want, total) = distributable(&fleet);
    fleet.distribution.damage_next_chunks(2);
    let s = staged(&install_ok(&fleet, 0).await);
    assert_eq!(s.chunks_refetched, 2);
    assert_eq!(s.bytes_transferred, total, "damaged chunks are not counted as transferred");
    assert_cache_verified(&fleet, 0, &want);
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_store_copy_is_refused_and_never_installed() {
    let server = NatsServer::start();
    let fleet =
        Fleet::builder(&server.url()).sites(1).nodes(2).sim(SimConfig::instant()).with_artifacts().start().await;
    // The OS image's object is damaged at rest: same size, one byte off.
    let image = fleet.catalog.iter().find(|p| p.kind == pb::PackageKind::OsImage as i32).unwrap().clone();
    let mut bytes = fleet.store.read(&image.object_key, 0..image.size).await.unwrap().to_vec();
    bytes[image.size as usize / 2] ^= 0x01;
    fleet.store.put_raw(&image.object_key, bytes.into()).await.unwrap();

    let run = fleet.wait_install(&fleet.install(&fleet.site_id(0)).await).await;
    assert_eq!(run.terminal().delivery.type_name, pb::SiteInstallFailed::TYPE, "{:?}", run.kinds());
    let failed = run.of_type::<pb::JobFailed>();
    assert_eq!(failed.len(), 1);
    assert!(failed[0].reason.contains(&image.sha256) && failed[0].reason.contains("damaged"), "{}", failed[0].reason);
    let cache = fleet.cache(0);
    assert!(!cache.inventory().contains(&image.sha256), "the damaged image is not in the cache");
    assert_eq!(cache.partial_len(&image.sha256), 0, "nor half of it");
    assert!(fleet.sites[0].1.effects().provisions.is_empty(), "no host was provisioned");
    fleet.stop().await;
}

/// Two jobs of one site that need the same artifact at once (a `site stage` and an install)
/// fetch it once between them, and both see it verified in the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_jobs_needing_one_artifact_at_once_fetch_it_once() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(1).nodes(1).sim(SimConfig::instant()).start().await;
    let size = 16 * 1024 * 1024;
    let pkg = fleet.register_artifact("firmware-bundle", "7.1", size).await;
    let envs = [Envelope::root(), Envelope::root()];
    for env in &envs {
        let job = pb::StageArtifacts { site_id: fleet.site_id(0), artifacts: vec![pkg.clone()] };
        fleet.bus.publish_job(&job, env).await.unwrap();
    }
    let mut transferred = 0;
    for env in &envs {
        let done =
            fleet.wait_for(pb::ArtifactsStaged::filter(), &env.id, Duration::from_secs(30)).await.expect("staged");
        let s: pb::ArtifactsStaged = done.delivery.decode().unwrap();
        assert_eq!(s.bytes_transferred + s.bytes_present, size as u64);
        transferred += s.bytes_transferred;
    }
    assert_eq!(transferred, size as u64, "one of the two moved the bytes");
    assert_eq!(fleet.distribution.bytes_served(), size as u64);
    let cache = fleet.cache(0);
    assert_eq!(artifacts::sha256_hex(&std::fs::read(cache.path(&pkg.sha256)).unwrap()), pkg.sha256);
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_cut_at_sixty_percent_resumes_from_its_offset() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(1).nodes(1).sim(SimConfig::instant()).start().await;
    let size = 64 * 1024 * 1024;
    let pkg = fleet.register_artifact("firmware-bundle", "7.1", size).await;
    let stored = pkg.clone();

    // The link is cut once 60 % has gone through.
    let cut = size as u64 * 6 / 10;
    fleet.distribution.cut_after(cut);
    let job_env = Envelope::root();
    let job = pb::StageArtifacts { site_id: fleet.site_id(0), artifacts: vec![pkg] };
    fleet.bus.publish_job(&job, &job_env).await.unwrap();
    let cache = fleet.cache(0);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let chunk = u64::from(consumers::distribution::DEFAULT_CHUNK_SIZE);
    while fleet.distribution.bytes_served() + chunk <= cut {
        assert!(tokio::time::Instant::now() < deadline, "the transfer did not get to 60 %");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The job fails and is retried while the link is down; what arrived in order stays (the
    // chunks in flight when the link went may have been served out of order).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let kept = cache.partial_len(&stored.sha256);
    let in_flight = site_gateway::cache::WINDOW as u64 * chunk;
    assert!(kept + in_flight >= cut && kept <= cut, "kept {kept} of {size}");
    let served_before = fleet.distribution.bytes_served();
    fleet.distribution.cut_after(0);

    let done =
        fleet.wait_for(pb::ArtifactsStaged::filter(), &job_env.id, Duration::from_secs(60)).await.expect("staged");
    let s: pb::ArtifactsStaged = done.delivery.decode().unwrap();
    assert_eq!(s.bytes_resumed, kept, "resumed from the offset the partial file reached");
    assert_eq!(s.bytes_resumed + s.bytes_transferred, size as u64);
    assert_eq!(fleet.distribution.bytes_served() - served_before, size as u64 - kept, "only the rest was sent");
    assert_eq!(artifacts::sha256_hex(&std::fs::read(cache.path(&stored.sha256)).unwrap()), stored.sha256);
    assert_eq!(cache.partial_len(&stored.sha256), 0);
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_package_not_in_the_store_or_catalog_is_refused_with_the_reason() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(1).nodes(1).sim(SimConfig::instant()).start().await;
    // In the catalog with an object key, but its bytes never reached the store.
    let ghost = pb::Package {
        name: "ghost".into(),
        version: "1".into(),
        kind: pb::PackageKind::Binary as i32,
        sha256: "c".repeat(64),
        size: 10,
        object_key: artifacts::object_key(&"c".repeat(64)),
        chart: None,
        render: None,
    };
    let register = Envelope::root();
    let cmd = pb::RegisterPackage { package: Some(ghost.clone()), auto_rollout: None };
    fleet.bus.publish_command(&cmd, &register).await.unwrap();
    fleet.wait_for(pb::PackageRegistered::filter(), &register.id, Duration::from_secs(20)).await.expect("registered");
    let env = Envelope::root();
    fleet
        .bus
        .publish_job(&pb::StageArtifacts { site_id: fleet.site_id(0), artifacts: vec![ghost.clone()] }, &env)
        .await
        .unwrap();
    let failed = fleet.wait_for(pb::JobFailed::filter(), &env.id, Duration::from_secs(20)).await.expect("job failed");
    let f: pb::JobFailed = failed.delivery.decode().unwrap();
    assert!(f.reason.contains("has no object") && f.reason.contains("package upload"), "{}", f.reason);

    // Not in the catalog at all.
    let mut stranger = ghost;
    stranger.version = "2".into();
    let env = Envelope::root();
    fleet
        .bus
        .publish_job(&pb::StageArtifacts { site_id: fleet.site_id(0), artifacts: vec![stranger] }, &env)
        .await
        .unwrap();
    let failed = fleet.wait_for(pb::JobFailed::filter(), &env.id, Duration::from_secs(20)).await.expect("job failed");
    let f: pb::JobFailed = failed.delivery.decode().unwrap();
    assert!(f.reason.contains("ghost@2 is not in the catalog"), "{}", f.reason);

    // A chunk asked for directly, outside any artifact key, is refused.
    let req = pb::ChunkRequest {
        site_id: fleet.site_id(0),
        sha256: "c".repeat(64),
        object_key: "uploads/../../secret".into(),
        offset: 0,
        length: 10,
    };
    let reply = fleet
        .bus
        .client()
        .request(names::artifact_chunk_svc(&fleet.site_id(0)), prost::Message::encode_to_vec(&req).into())
        .await
        .unwrap();
    let err = reply.headers.as_ref().and_then(|h| h.get(names::headers::REPLY_ERROR)).map(|v| v.to_string());
    assert!(err.as_deref().is_some_and(|e| e.contains("not the object key")), "{err:?}");
    fleet.stop().await;
}

/// The peak resident memory of a running process, read from /proc until it exits.
async fn run_watching_rss(mut cmd: tokio::process::Command) -> (std::process::Output, u64) {
    let child = cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let status = format!("/proc/{}/status", child.id().unwrap());
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let watcher = {
        let peak = peak.clone();
        tokio::spawn(async move {
            while let Ok(text) = std::fs::read_to_string(&status) {
                if let Some(hwm) = producers::bench_transfer::status_bytes(&text, "VmHWM") {
                    peak.fetch_max(hwm, std::sync::atomic::Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let out = child.wait_with_output().await.unwrap();
    watcher.abort();
    (out, peak.load(std::sync::atomic::Ordering::Relaxed))
}

fn upload_cmd(url: &str, file: &std::path::Path, version: &str) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(landfall_tests::cli::binary());
    cmd.args(["package", "upload"]).arg(file).args(["--name", "bundle", "--version", version, "--kind", "binary"]);
    cmd.env("NATS_URL", url).env_remove("RUST_LOG");
    cmd
}

/// `landfall package upload` streams: a 512 MiB upload grows the process by far less than 64 MiB
/// over a 1 KiB one. The same file again is a no-op; other bytes under that version are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_streams_in_bounded_memory_and_versions_are_immutable() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(0).start().await;
    let dir = tempfile::tempdir().unwrap();
    let small = dir.path().join("small");
    std::fs::write(&small, producers::up::demo_content("small", "1", 1024)).unwrap();
    let big = dir.path().join("big");
    {
        use std::io::Write;
        let mut f = std::io::BufWriter::new(std::fs::File::create(&big).unwrap());
        let block = producers::up::demo_content("big", "1", 1 << 20);
        for i in 0..512u32 {
            f.write_all(&i.to_le_bytes()).unwrap();
            f.write_all(&block[4..]).unwrap();
        }
    }

    let (out, small_peak) = run_watching_rss(upload_cmd(&server.url(), &small, "1")).await;
    assert!(out.status.success(), "{}", landfall_tests::cli::text(&out.stderr));
    let (out, big_peak) = run_watching_rss(upload_cmd(&server.url(), &big, "2")).await;
    assert!(out.status.success(), "{}", landfall_tests::cli::text(&out.stderr));
    let growth = big_peak.saturating_sub(small_peak);
    assert!(growth < 64 << 20, "a 512 MiB upload peaked {} MiB above a 1 KiB one", growth >> 20);
    let (sha, size) = artifacts::hash_file(&big).await.unwrap();
    assert_eq!(fleet.store.size(&artifacts::object_key(&sha)).await.unwrap(), Some(size));

    // Again: nothing to do, nothing uploaded.
    let out = landfall_tests::cli::landfall(
        &server.url(),
        &["package", "upload", big.to_str().unwrap(), "--name", "bundle", "--version", "2", "--kind", "binary"],
    )
    .await;
    assert!(out.status.success());
    assert!(
        landfall_tests::cli::text(&out.stdout).contains("uploaded already"),
        "{}",
        landfall_tests::cli::text(&out.stdout)
    );
    // Other bytes under version 2: refused, naming both digests, before anything is sent.
    let out = landfall_tests::cli::landfall(
        &server.url(),
        &["package", "upload", small.to_str().unwrap(), "--name", "bundle", "--version", "2", "--kind", "binary"],
    )
    .await;
    assert_eq!(out.status.code(), Some(2));
    let err = landfall_tests::cli::text(&out.stderr);
    assert!(err.contains("refused") && err.contains(&sha) && err.contains("new version"), "{err}");
    fleet.stop().await;
}

/// `landfall site stage --wait` fills the cache; the install after it moves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn site_stage_cli_downloads_ahead_of_the_install() {
    let server = NatsServer::start();
    let fleet =
        Fleet::builder(&server.url()).sites(1).nodes(2).sim(SimConfig::instant()).with_artifacts().start().await;
    let (want, _) = distributable(&fleet);
    let out = landfall_tests::cli::landfall(&server.url(), &["site", "stage", &fleet.site_id(0), "--wait"]).await;
    assert!(out.status.success(), "{}", landfall_tests::cli::text(&out.stderr));
    assert!(
        landfall_tests::cli::text(&out.stdout).contains("5 artifacts in the cache"),
        "{}",
        landfall_tests::cli::text(&out.stdout)
    );
    assert_cache_verified(&fleet, 0, &want);
    let s = staged(&install_ok(&fleet, 0).await);
    assert_eq!(s.bytes_transferred, 0);
    let out =
        landfall_tests::cli::landfall(&server.url(), &["site", "stage", "no-such-site", "--wait", "--timeout", "20s"])
            .await;
    assert_eq!(out.status.code(), Some(2), "{}", landfall_tests::cli::text(&out.stderr));
    fleet.stop().await;
}
