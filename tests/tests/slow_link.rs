//! A site behind a slow link: its leaf node reaches the hub over TLS through a proxy that holds
//! each direction to 20 Mbit/s and adds 50 ms each way. A 256 MiB artifact is staged to the
//! site over it while the link is cut twice; the transfer resumes each time, takes at most 1.15
//! times the link's own time for its bytes while the link is up, and the leaf connection comes
//! back once per cut, never in a loop.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bus_schema::access::{HUB_DOMAIN, Role};
use bus_schema::pb::{self, BusEvent};
use bus_schema::runtime::{Access, Envelope};
use landfall_tests::fleet::Fleet;
use landfall_tests::procs::Service;
use landfall_tests::s3::S3Server;
use landfall_tests::topology::{ConfServer, Deployment, TcpProxy, Throttle, TlsFiles, connect_when_ready};

const SITE: &str = "edge-01";
/// The artifact staged: 256 MiB.
const SIZE: u64 = 256 * 1024 * 1024;
/// How long each cut lasts.
const CUT_FOR: Duration = Duration::from_secs(3);
/// How far the transfer has come when the link is cut, in percent.
const CUT_AT: [u64; 2] = [30, 65];
/// The most the staging may take while the link is up, over the link's own time for the bytes.
const MAX_RATIO: f64 = 1.15;

/// The link between the site's leaf node and the hub: 20 Mbit/s each way, and 50 ms added to
/// each direction (100 ms more on every round trip).
fn link() -> Throttle {
    Throttle::mbit(20, Duration::from_millis(50))
}

/// The site's leaf node behind the slow link, the hub's services under their users with the
/// artifact store in S3, and the site's gateway, a process of its own on the leaf node.
/// (Dropped in order: the processes before the directories their logs are in.)
struct SlowSite {
    gateway: Service,
    leaf: ConfServer,
    fleet: Fleet,
    proxy: TcpProxy,
    hubs: Vec<ConfServer>,
    d: Deployment,
    /// The gateway's artifact cache.
    cache: PathBuf,
    ca: PathBuf,
    _s3: S3Server,
    _dirs: (tempfile::TempDir, tempfile::TempDir),
}

impl SlowSite {
    async fn start() -> SlowSite {
        let tls_dir = tempfile::tempdir().unwrap();
        let tls = TlsFiles::make(tls_dir.path());
        let via = landfall_tests::nats::free_port();
        let d = Deployment::generate_with(&[SITE], 1, Some(&tls), &[via]);
        let proxy = TcpProxy::throttled(via, d.hubs[0].leaf, link()).await;
        let hubs = d.start_hubs();
        let s3 = S3Server::start("landfall");
        let ca = tls.ca.clone();
        let roles = d.users(Some(&ca));
        let fleet = Fleet::builder(&d.hub_urls("tls"))
            .sites(1)
            .nodes(1)
            .access(Arc::new(move |role: &Role| roles(role)))
            .without_gateways()
            .store(&s3.location("artifacts"), s3.options())
            .start()
            .await;
        let leaf = d.start_leaf(SITE);
        let work = tempfile::tempdir().unwrap();
        let cache = work.path().join("cache");
        let state = work.path().join("sim.json");
        let seed = d.seed_file(&Role::Site(SITE.into()));
        let args = [
            "serve",
            "gateway",
            "--site",
            SITE,
            "--backend",
            "sim",
            "--cache-dir",
            cache.to_str().unwrap(),
            "--sim-state",
            state.to_str().unwrap(),
            "--nats-nkey-file",
            seed.to_str().unwrap(),
            "--js-domain",
            HUB_DOMAIN,
        ];
        let site_url = format!("nats://127.0.0.1:{}", leaf.port);
        let gateway = Service::start("gateway-edge-01", &site_url, work.path(), &args);
        SlowSite { gateway, leaf, fleet, proxy, hubs, d, cache, ca, _s3: s3, _dirs: (tls_dir, work) }
    }

    /// How `role` connects to the hub.
    fn access(&self, role: &Role) -> Access {
        Access { ca_file: Some(self.ca.clone()), ..self.d.access(role) }
    }

    /// The hub's leaf node connections, from its monitoring endpoint.
    async fn leaf_links(&self) -> u64 {
        let url = format!("http://127.0.0.1:{}/leafz", self.d.hubs[0].http);
        let text = reqwest::get(&url).await.unwrap().text().await.unwrap();
        let body: serde_json::Value = serde_json::from_str(&text).unwrap();
        body["leafnodes"].as_u64().unwrap_or_else(|| panic!("no leafnodes count in {body}"))
    }

    /// Waits until the leaf node is connected to the hub.
    async fn until_linked(&self, within: Duration) {
        let deadline = Instant::now() + within;
        while self.leaf_links().await == 0 {
            assert!(Instant::now() < deadline, "the leaf node did not connect to the hub within {within:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Cuts the link for [`CUT_FOR`], checking all along that the hub has no leaf connection,
    /// then heals it. How long it was down, and what the site's partial file held meanwhile.
    async fn cut(&self, partial: &Path) -> (Duration, u64) {
        self.proxy.cut();
        let cut_at = Instant::now();
        // The hub sees a dropped link at once; give it a moment, then the link must stay down.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let kept = len(partial);
        while cut_at.elapsed() < CUT_FOR {
            assert_eq!(self.leaf_links().await, 0, "the site reached the hub while its link was cut");
            assert_eq!(len(partial), kept, "bytes arrived while the link was cut");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.proxy.heal();
        (cut_at.elapsed(), kept)
    }
}

fn len(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Lines of `log` that tell of a connection in trouble.
fn trouble(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| {
            ["Slow Consumer", "Stale Connection", "WriteDeadline", "Write Deadline", "write deadline"]
                .iter()
                .any(|t| l.contains(t))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_256_mib_artifact_staged_over_a_slow_link_cut_twice_resumes_within_115_percent_of_the_links_time() {
    let site = SlowSite::start().await;
    let link = link();
    let pkg = site.fleet.register_artifact("firmware-bundle", "slow", SIZE as usize).await;
    site.until_linked(Duration::from_secs(30)).await;
    let partial = site.cache.join("partial").join(&pkg.sha256);
    let theoretical = link.time_for(SIZE);
    println!(
        "slow link: {} bit/s each way ({} Mbit/s), {:?} added each way ({:?} more per round trip), bursts of {} KiB",
        link.bytes_per_sec * 8,
        link.bytes_per_sec * 8 / 1_000_000,
        link.delay,
        link.delay * 2,
        link.burst / 1024
    );
    println!("slow link: {} bytes ({} MiB) take {theoretical:.1?} at the link's rate", SIZE, SIZE >> 20);

    // The hub's orchestrator sends the site the job, as it does for `landfall site stage`.
    let orchestrator =
        connect_when_ready(&site.d.hub_urls("tls"), "slow-link-test", &site.access(&Role::Orchestrator)).await;
    let env = Envelope::root();
    let job = pb::StageArtifacts { site_id: SITE.into(), artifacts: vec![pkg.clone()] };
    let started = Instant::now();
    orchestrator.publish_job(&job, &env).await.unwrap();

    let mut down = Duration::ZERO;
    let mut kept = Vec::new();
    for (i, percent) in CUT_AT.into_iter().enumerate() {
        let deadline = Instant::now() + Duration::from_secs(120);
        while len(&partial) < SIZE * percent / 100 {
            assert!(
                Instant::now() < deadline,
                "the transfer did not reach {percent} %:\n{}",
                site.gateway.log_tail(30)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let at = started.elapsed();
        let (was_down, held) = site.cut(&partial).await;
        down += was_down;
        kept.push(held);
        let back = Instant::now();
        site.until_linked(Duration::from_secs(30)).await;
        println!(
            "slow link: cut {} at {at:.1?} with {:.1} MiB ({:.1} %) in the site's cache; down {was_down:.2?}, the leaf \
             node linked again {:.2?} after the heal",
            i + 1,
            mib(held),
            held as f64 * 100.0 / SIZE as f64,
            back.elapsed()
        );
    }

    let done = site.fleet.wait_for(pb::ArtifactsStaged::filter(), &env.id, Duration::from_secs(300)).await;
    let total = started.elapsed();
    let done = done.unwrap_or_else(|| panic!("not staged:\n{}", site.gateway.log_tail(40)));
    let staged: pb::ArtifactsStaged = done.delivery.decode().unwrap();
    let up = total - down;
    let ratio = up.as_secs_f64() / theoretical.as_secs_f64();
    println!(
        "slow link: staged in {total:.1?} in all, {up:.1?} with the link up (the {down:.1?} of the two cuts taken off): \
         {ratio:.3} × the link's {theoretical:.1?} (at most {MAX_RATIO})"
    );
    println!(
        "slow link: ArtifactsStaged: {} bytes transferred, {} bytes resumed from (the partial file at the last cut), \
         {} chunks fetched again",
        staged.bytes_transferred, staged.bytes_resumed, staged.chunks_refetched
    );

    // Complete and verified: the file is in the cache under its digest, and has it.
    let file = site.cache.join("sha256").join(&pkg.sha256);
    let (sha, size) = consumers::artifacts::hash_file(&file).await.unwrap();
    assert_eq!((sha.as_str(), size), (pkg.sha256.as_str(), SIZE), "the cached file is the artifact");
    assert!(!partial.exists(), "no partial file is left");
    // Each byte crossed once, and each cut resumed from what the site had kept.
    assert_eq!(staged.bytes_transferred, SIZE, "{staged:?}");
    assert_eq!(staged.bytes_resumed, kept[1], "resumed from the partial file as the second cut left it: {staged:?}");
    let log = site.gateway.log_text();
    let resumed_at: Vec<u64> = log
        .lines()
        .filter(|l| l.contains("resuming a cut transfer"))
        .filter_map(|l| l.split(" offset=").nth(1)?.split_whitespace().next()?.parse().ok())
        .collect();
    println!("slow link: the gateway resumed the transfer at {resumed_at:?} (bytes)");
    assert_eq!(resumed_at, kept, "the transfer resumed once per cut, where it was cut:\n{}", site.gateway.log_tail(40));
    assert!(ratio <= MAX_RATIO, "{up:?} with the link up is {ratio:.3} × the link's {theoretical:?}");

    // The leaf connection came back once per cut and never dropped by itself.
    let hub_log = site.hubs[0].log();
    let leaf_log = site.leaf.log();
    let links = hub_log.lines().filter(|l| l.contains("Leafnode connection created")).count();
    println!("slow link: the hub took {links} leaf node connections (the first and one after each cut)");
    assert_eq!(links, 1 + CUT_AT.len(), "{hub_log}");
    assert!(trouble(&hub_log).is_empty(), "the hub: {:#?}", trouble(&hub_log));
    assert!(trouble(&leaf_log).is_empty(), "the leaf node: {:#?}", trouble(&leaf_log));
    assert!(!log.contains("Permissions Violation"), "{}", site.gateway.log_tail(30));
    drop(site.gateway);
    drop(site.leaf);
    site.fleet.stop().await;
}
