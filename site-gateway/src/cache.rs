//! The site's artifact cache, content-addressed, and the transfers that fill it from the hub's
//! distribution service.
//!
//! Layout under the cache directory:
//! - `sha256/<hex>`: complete artifacts, each verified against its digest before it was moved
//!   here; nothing else is ever handed to the site's provisioning.
//! - `partial/<hex>`: a transfer in progress. Every chunk in it matched the digest the hub sent
//!   with it; a transfer that was cut resumes at the file's length.
//!
//! A site's link may be slow and may drop. A transfer keeps only a few seconds of the link's
//! time in flight ([`TARGET_LATENCY`]), so what the hub queues for the site stays short. When
//! no chunk has come for a moment it asks whether the hub is still there; the site's own server
//! answers "no responders" at once while its link is down. The transfer then drops what it had
//! asked for, waits for the link, and goes on from the length of its partial file, without
//! waiting out its requests.
//!
//! Past its limit ([`ArtifactCache::with_max_bytes`]) the cache evicts what the site no longer
//! needs, least recently used first ([`crate::eviction`] decides which).

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bus_schema::domain::{Package, Sha256 as Sha256Digest};
use bus_schema::names;
use bus_schema::pb::{self, BusMessage};
use bus_schema::runtime::{Bus, Reply, RequestError};
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::FuturesOrdered;
use prost::Message;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::{debug, info, warn};

use crate::eviction::{self, Entry, Usage};

/// Chunk requests in flight per transfer, at most.
pub const WINDOW: usize = 16;
/// Chunk requests in flight per transfer, at least: one crossing the link while the next is
/// asked for.
const MIN_WINDOW: usize = 2;
/// The window a transfer starts with, before it knows how fast the link is.
const START_WINDOW: usize = 4;
/// How long a chunk should take from its request to its last byte. Past this the window shrinks,
/// under half of it the window grows: on a slow link the hub's queue for the site holds a few
/// seconds of the link's time, so the site's other traffic is not stuck behind a transfer, and
/// the hub's writes to the site's leaf node end well within their deadline.
const TARGET_LATENCY: Duration = Duration::from_secs(3);
/// How long a transfer may go without a chunk arriving while the hub seems reachable.
const CHUNK_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a request waits for its answer. Chunks queue behind one another on a slow link, so
/// [`CHUNK_TIMEOUT`], counted from the chunk before, is what limits a transfer; this only bounds
/// a request whose answer never comes.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(600);
/// How long without a chunk before the transfer asks whether the hub is still there.
const PROBE_AFTER: Duration = Duration::from_secs(1);
/// How long a probe waits for "no responders". An answer, or none yet (it queues behind the
/// chunks on a busy link), means the hub is there.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// How often a transfer whose link is down asks whether it is back.
const LINK_POLL: Duration = Duration::from_millis(250);
/// How long a transfer waits for its link before the job fails (and is tried again).
const LINK_WAIT: Duration = Duration::from_secs(60);
/// How often a chunk that fails its digest is fetched again before the transfer gives up.
const REFETCHES: u32 = 3;

/// Why staging did not complete: what was being done, and the error that says why when
/// there is one.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// The hub is unreachable or busy, or the cache's disk failed: try again later; what
    /// arrived so far is kept.
    #[error("{context}")]
    Transient {
        context: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// Trying again will not help (the hub refused, or its copy is damaged).
    #[error("{context}")]
    Permanent {
        context: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

impl CacheError {
    fn transient(context: impl Into<String>, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        CacheError::Transient { context: context.into(), source: Some(Box::new(source)) }
    }

    fn transient_reason(reason: impl Into<String>) -> Self {
        CacheError::Transient { context: reason.into(), source: None }
    }

    fn permanent(context: impl Into<String>, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        CacheError::Permanent { context: context.into(), source: Some(Box::new(source)) }
    }

    fn permanent_reason(reason: impl Into<String>) -> Self {
        CacheError::Permanent { context: reason.into(), source: None }
    }
}

/// What staging found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Staged {
    pub artifacts: u32,
    pub bytes_transferred: u64,
    pub bytes_present: u64,
    pub bytes_resumed: u64,
    pub chunks_refetched: u32,
    pub external: u32,
}

/// An artifact the site can use: its verified file in the cache, or `None` for a package not
/// in the artifact store (the site's provisioning fetches it itself).
#[derive(Debug, Clone)]
pub struct CachedArtifact {
    pub package: Package,
    pub path: Option<PathBuf>,
}

/// One site's artifact cache. Clones share it: two jobs that need the same artifact at once
/// (a `site stage` and an install) fetch it once, the second waiting for the first.
#[derive(Debug, Clone)]
pub struct ArtifactCache {
    dir: PathBuf,
    fetching: Arc<std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
    /// The most bytes of complete artifacts kept before eviction.
    max_bytes: u64,
    usage: Arc<std::sync::Mutex<Usage>>,
}

/// Artifacts a job uses, kept from eviction until this is dropped ([`ArtifactCache::pin`]).
#[derive(Debug)]
pub struct Pinned {
    usage: Arc<std::sync::Mutex<Usage>>,
    shas: Vec<String>,
}

impl Drop for Pinned {
    fn drop(&mut self) {
        self.usage.lock().unwrap_or_else(|e| e.into_inner()).unpin(&self.shas);
    }
}

/// What an eviction removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Evicted {
    pub artifacts: usize,
    pub bytes: u64,
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> CacheError {
    CacheError::transient(format!("artifact cache: {what} {}", path.display()), e)
}

fn hex(digest: &[u8]) -> String {
    Sha256Digest::hex(digest)
}

fn is_digest(s: &str) -> bool {
    Sha256Digest::try_from(s).is_ok()
}

impl ArtifactCache {
    /// The cache in `dir`; its directories are made when the first artifact arrives.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            fetching: Default::default(),
            max_bytes: bus_schema::retention::SITE_CACHE_BYTES,
            usage: Default::default(),
        }
    }

    /// The cache, evicting what no job needs once it holds more than `max_bytes`.
    pub fn with_max_bytes(mut self, max_bytes: u64) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// Keeps `artifacts` from eviction until the guard is dropped: a job holds it while it uses them.
    pub fn pin(&self, artifacts: &[Package]) -> Pinned {
        let shas: Vec<String> = artifacts.iter().map(|p| p.sha256.to_string()).collect();
        self.usage.lock().unwrap_or_else(|e| e.into_inner()).pin(&shas);
        Pinned { usage: self.usage.clone(), shas }
    }

    /// Deletes complete artifacts, least recently used first, until the cache is within its
    /// limit, never one a job uses or the latest version staged of a package.
    pub fn evict(&self) -> Evicted {
        let Ok(dir) = std::fs::read_dir(self.dir.join("sha256")) else { return Evicted::default() };
        let entries: Vec<Entry> = dir
            .filter_map(|e| {
                let e = e.ok()?;
                let sha256 = e.file_name().into_string().ok().filter(|n| is_digest(n))?;
                let meta = e.metadata().ok()?;
                Some(Entry { sha256, size: meta.len(), used: meta.modified().ok()? })
            })
            .collect();
        // Decided and done under the lock, so no job pins an artifact in between.
        let usage = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        let mut evicted = Evicted::default();
        for sha in eviction::plan(&entries, &usage.keep(), self.max_bytes) {
            let size = entries.iter().find(|e| e.sha256 == sha).map_or(0, |e| e.size);
            match std::fs::remove_file(self.path(&sha)) {
                Ok(()) => {
                    evicted.artifacts += 1;
                    evicted.bytes += size;
                }
                Err(e) => warn!(%sha, error = %e, "artifact cache: cannot evict"),
            }
        }
        drop(usage);
        if evicted.artifacts > 0 {
            info!(
                artifacts = evicted.artifacts,
                bytes = evicted.bytes,
                max = self.max_bytes,
                "artifact cache: evicted"
            );
        }
        evicted
    }

    /// Marks an artifact used now (its file's time: the order eviction goes in).
    fn touch(&self, sha256: &str) {
        let touched = std::fs::File::options()
            .write(true)
            .open(self.path(sha256))
            .and_then(|f| f.set_modified(std::time::SystemTime::now()));
        if let Err(e) = touched {
            debug!(sha256, error = %e, "artifact cache: cannot mark an artifact used");
        }
    }

    /// The lock one artifact's transfer holds, so only one writes its partial file.
    fn transfer_lock(&self, sha256: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut fetching = self.fetching.lock().unwrap_or_else(|e| e.into_inner());
        fetching.retain(|_, lock| Arc::strong_count(lock) > 1);
        fetching.entry(sha256.to_string()).or_default().clone()
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file of a complete artifact.
    pub fn path(&self, sha256: &str) -> PathBuf {
        self.dir.join("sha256").join(sha256)
    }

    fn partial(&self, sha256: &str) -> PathBuf {
        self.dir.join("partial").join(sha256)
    }

    /// The digests of every complete artifact: what the site reports to the hub.
    pub fn inventory(&self) -> BTreeSet<String> {
        let Ok(entries) = std::fs::read_dir(self.dir.join("sha256")) else { return BTreeSet::new() };
        entries.filter_map(|e| e.ok()?.file_name().into_string().ok()).filter(|n| is_digest(n)).collect()
    }

    /// Bytes a cut transfer of this artifact has kept.
    pub fn partial_len(&self, sha256: &str) -> u64 {
        std::fs::metadata(self.partial(sha256)).map_or(0, |m| m.len())
    }

    /// Makes every artifact the cache lacks arrive from the distribution service, verified.
    /// What each artifact is, and where its file is, comes back in order.
    pub async fn stage(
        &self,
        bus: &Bus,
        site: &str,
        artifacts: &[Package],
    ) -> Result<(Staged, Vec<CachedArtifact>), CacheError> {
        let inventory = self.inventory();
        let lacking = artifacts.iter().any(|p| !p.object_key.is_empty() && !inventory.contains(p.sha256.as_str()));
        let mut staged = Staged::default();
        // With nothing to fetch there is nothing to ask the hub.
        let present: BTreeSet<String> = if lacking {
            let req = pb::ArtifactPlanRequest {
                site_id: site.to_string(),
                inventory: inventory.iter().cloned().collect(),
                wanted: artifacts.iter().map(pb::Package::from).collect(),
            };
            // The catalog or the store saying no will say it again: permanent.
            let subject = names::artifact_plan_svc(site);
            let reply = request(bus, subject, req.encode_to_vec(), CHUNK_TIMEOUT, CacheError::permanent).await?;
            let plan: pb::ArtifactPlan = decode(reply)?;
            for t in &plan.transfers {
                self.fetch(bus, site, t, &mut staged).await?;
            }
            plan.present.into_iter().collect()
        } else {
            inventory
        };
        let mut seen = BTreeSet::new();
        let mut cached = Vec::with_capacity(artifacts.len());
        for p in artifacts {
            let sha = p.sha256.as_str();
            let first = seen.insert(sha);
            if p.object_key.is_empty() {
                staged.external += u32::from(first);
                cached.push(CachedArtifact { package: p.clone(), path: None });
                continue;
            }
            let path = self.path(sha);
            if !path.exists() {
                return Err(CacheError::transient_reason(format!(
                    "artifact {}@{} is not in the cache after staging",
                    p.name, p.version
                )));
            }
            if first && present.contains(sha) {
                staged.bytes_present += p.size;
            }
            staged.artifacts += u32::from(first);
            if first {
                self.touch(sha);
            }
            cached.push(CachedArtifact { package: p.clone(), path: Some(path) });
        }
        let current = artifacts.iter().filter(|p| !p.object_key.is_empty());
        self.usage
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .staged(current.map(|p| (p.name.as_str(), p.sha256.as_str())));
        Ok((staged, cached))
    }

    /// Fetches one artifact into `partial/`, from where an earlier transfer stopped, then moves
    /// it into place once its digest is right.
    async fn fetch(
        &self,
        bus: &Bus,
        site: &str,
        t: &pb::ArtifactTransfer,
        staged: &mut Staged,
    ) -> Result<(), CacheError> {
        if !is_digest(&t.sha256) || t.chunk_size == 0 {
            return Err(CacheError::permanent_reason(format!(
                "the hub's transfer plan is invalid for sha256:{}",
                t.sha256
            )));
        }
        let lock = self.transfer_lock(&t.sha256);
        let _transfer = lock.lock().await;
        if self.path(&t.sha256).exists() {
            // Another job of this site fetched it meanwhile.
            staged.bytes_present += t.size;
            return Ok(());
        }
        for sub in ["sha256", "partial"] {
            let dir = self.dir.join(sub);
            tokio::fs::create_dir_all(&dir).await.map_err(|e| io_err("create", &dir, e))?;
        }
        let partial = self.partial(&t.sha256);
        let mut hasher = Sha256::new();
        let mut offset = resume(&partial, t.size, &mut hasher).await?;
        // Where the transfer last went on from: what was kept, not fetched again.
        let mut resumed_from = offset;
        staged.bytes_resumed += offset;
        if offset > 0 {
            info!(site, sha256 = %t.sha256, offset, size = t.size, "resuming a cut transfer");
        }
        let mut file = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&partial)
            .await
            .map_err(|e| io_err("open", &partial, e))?;

        let subject = names::artifact_chunk_svc(site);
        let chunk = |offset: u64| {
            let length = u64::from(t.chunk_size).min(t.size - offset) as u32;
            let req = pb::ChunkRequest {
                site_id: site.to_string(),
                sha256: t.sha256.clone(),
                object_key: t.object_key.clone(),
                offset,
                length,
            };
            let subject = subject.clone();
            async move {
                let asked = Instant::now();
                (offset, length, asked, request_chunk(bus, subject, req.encode_to_vec()).await)
            }
        };
        let mut window = START_WINDOW;
        let mut next = offset;
        let mut inflight = FuturesOrdered::new();
        let mut last_arrival = Instant::now();
        loop {
            while inflight.len() < window && next < t.size {
                inflight.push_back(chunk(next));
                next += u64::from(t.chunk_size);
            }
            // A chunk, or `None` when the link is down.
            let arrived = tokio::select! {
                arrived = inflight.next() => match arrived {
                    Some(arrived) => Some(arrived),
                    None => break,
                },
                () = tokio::time::sleep(PROBE_AFTER) => {
                    if !out_of_reach(bus, site).await {
                        if last_arrival.elapsed() >= CHUNK_TIMEOUT {
                            return Err(CacheError::transient_reason(format!(
                                "no chunk of sha256:{} arrived for {CHUNK_TIMEOUT:?} (at {offset} of {} bytes)",
                                t.sha256, t.size
                            )));
                        }
                        continue;
                    }
                    None
                }
            };
            let received = match arrived {
                None => None,
                Some((at, length, asked, mut got)) => {
                    let mut attempts = 0;
                    loop {
                        match got {
                            Ok(bytes) if bytes.len() == length as usize => break Some((at, bytes, asked, attempts)),
                            Ok(bytes) => {
                                let got_len = bytes.len();
                                return Err(CacheError::permanent_reason(format!(
                                    "chunk at {at} of sha256:{} has {got_len} bytes, not {length}",
                                    t.sha256
                                )));
                            }
                            Err(ChunkError::Damaged { expected, actual }) if attempts < REFETCHES => {
                                attempts += 1;
                                staged.chunks_refetched += 1;
                                warn!(site, sha256 = %t.sha256, offset = at, %expected, %actual, attempts, "chunk failed its digest: fetching it again");
                                got = match tokio::time::timeout(CHUNK_TIMEOUT, chunk(at)).await {
                                    Ok((.., got)) => got,
                                    Err(_) => {
                                        return Err(CacheError::transient_reason(format!(
                                            "chunk at {at} of sha256:{}, fetched again, did not arrive within \
                                             {CHUNK_TIMEOUT:?}",
                                            t.sha256
                                        )));
                                    }
                                };
                            }
                            Err(ChunkError::Damaged { expected, actual }) => {
                                return Err(CacheError::transient_reason(format!(
                                    "chunk at {at} of sha256:{} failed its digest {} times (sent {expected}, got {actual})",
                                    t.sha256,
                                    attempts + 1
                                )));
                            }
                            // Asked for while the link was down, or as it went.
                            Err(ChunkError::OutOfReach) => break None,
                            Err(ChunkError::Failed(e)) => return Err(e),
                        }
                    }
                }
            };
            let Some((at, bytes, asked, attempts)) = received else {
                // What was asked for will not come: wait for the link, and go on from the
                // partial file's length.
                inflight = FuturesOrdered::new();
                next = self.after_cut(bus, site, t, offset, &mut resumed_from, staged).await?;
                last_arrival = Instant::now();
                continue;
            };
            file.write_all(&bytes).await.map_err(|e| io_err("write", &partial, e))?;
            hasher.update(&bytes);
            staged.bytes_transferred += bytes.len() as u64;
            offset = at + bytes.len() as u64;
            last_arrival = Instant::now();
            if attempts == 0 {
                window = next_window(window, asked.elapsed());
            }
        }
        file.sync_all().await.map_err(|e| io_err("sync", &partial, e))?;
        drop(file);
        let actual = hex(&hasher.finalize());
        if offset != t.size || actual != t.sha256 {
            // Every chunk matched what the hub read, so the hub's copy is what is damaged.
            let _ = tokio::fs::remove_file(&partial).await;
            return Err(CacheError::permanent_reason(format!(
                "artifact sha256:{} arrived as {offset} bytes with sha256:{actual}: the artifact store's copy ({}) is \
                 damaged; it was not put in the cache",
                t.sha256, t.object_key
            )));
        }
        let target = self.path(&t.sha256);
        tokio::fs::rename(&partial, &target).await.map_err(|e| io_err("move into place", &target, e))?;
        debug!(site, sha256 = %t.sha256, size = t.size, "artifact cached");
        Ok(())
    }

    /// Waits for the link after a cut and says where the transfer goes on: at `offset`, the
    /// length of its partial file. The bytes kept count as resumed from, once.
    async fn after_cut(
        &self,
        bus: &Bus,
        site: &str,
        t: &pb::ArtifactTransfer,
        offset: u64,
        resumed_from: &mut u64,
        staged: &mut Staged,
    ) -> Result<u64, CacheError> {
        warn!(site, sha256 = %t.sha256, offset, size = t.size, "the hub is out of reach: waiting for the link");
        until_reachable(bus, site).await?;
        info!(site, sha256 = %t.sha256, offset, size = t.size, "resuming a cut transfer");
        staged.bytes_resumed += offset - *resumed_from;
        *resumed_from = offset;
        Ok(offset)
    }
}

/// The window after a chunk took `latency` from its request: one smaller when chunks wait
/// too long behind one another, one larger while they come quickly.
fn next_window(window: usize, latency: Duration) -> usize {
    if latency > TARGET_LATENCY {
        (window - 1).max(MIN_WINDOW)
    } else if latency < TARGET_LATENCY / 2 {
        (window + 1).min(WINDOW)
    } else {
        window
    }
}

/// Whether the distribution service is out of reach: nobody takes a request, which the site's
/// own server says at once while its link to the hub is down (it then knows of no one). The
/// probe is an empty plan request: the service answers it without reading anything.
async fn out_of_reach(bus: &Bus, site: &str) -> bool {
    let probe = pb::ArtifactPlanRequest { site_id: site.to_string(), ..Default::default() };
    let asked = bus.request(names::artifact_plan_svc(site), probe.encode_to_vec().into(), PROBE_TIMEOUT).await;
    matches!(asked, Err(RequestError::NoResponders { .. }))
}

/// Waits until the distribution service can be reached again, asking every [`LINK_POLL`];
/// transient after [`LINK_WAIT`].
async fn until_reachable(bus: &Bus, site: &str) -> Result<(), CacheError> {
    let since = Instant::now();
    loop {
        tokio::time::sleep(LINK_POLL).await;
        if !out_of_reach(bus, site).await {
            return Ok(());
        }
        if since.elapsed() >= LINK_WAIT {
            return Err(CacheError::transient_reason(format!(
                "the hub's distribution service has been out of reach for {LINK_WAIT:?}"
            )));
        }
    }
}

/// Reads back a partial file into the digest and says where to go on; a file longer than the
/// artifact starts over.
async fn resume(partial: &Path, size: u64, hasher: &mut Sha256) -> Result<u64, CacheError> {
    let mut file = match tokio::fs::File::open(partial).await {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io_err("open", partial, e)),
    };
    let len = file.metadata().await.map_err(|e| io_err("stat", partial, e))?.len();
    if len > size {
        drop(file);
        tokio::fs::remove_file(partial).await.map_err(|e| io_err("remove", partial, e))?;
        return Ok(0);
    }
    let mut buf = vec![0u8; 1024 * 1024];
    loop {
        let n = file.read(&mut buf).await.map_err(|e| io_err("read", partial, e))?;
        if n == 0 {
            return Ok(len);
        }
        hasher.update(&buf[..n]);
    }
}

enum ChunkError {
    Damaged {
        expected: String,
        actual: String,
    },
    /// Nobody took the request: the link to the hub is down (or the service is).
    OutOfReach,
    Failed(CacheError),
}

/// Asks the distribution service; its refusal becomes the error `refused` makes of it.
async fn request(
    bus: &Bus,
    subject: String,
    payload: Vec<u8>,
    timeout: Duration,
    refused: fn(String, RequestError) -> CacheError,
) -> Result<Reply, CacheError> {
    bus.request(subject, payload.into(), timeout).await.map_err(|e| request_failed(e, refused))
}

fn request_failed(e: RequestError, refused: fn(String, RequestError) -> CacheError) -> CacheError {
    match e {
        RequestError::TimedOut { .. } => CacheError::transient("asking the distribution service", e),
        RequestError::Refused { .. } => refused("distribution service".into(), e),
        e => CacheError::transient("asking the distribution service (is it running? `landfall serve distribution`)", e),
    }
}

async fn request_chunk(bus: &Bus, subject: String, payload: Vec<u8>) -> Result<Bytes, ChunkError> {
    let (headers, body) = match bus.request(subject, payload.into(), REQUEST_TIMEOUT).await {
        Ok(reply) => reply,
        Err(RequestError::NoResponders { .. }) => return Err(ChunkError::OutOfReach),
        // The plan found the object, so a chunk refused is a read that failed this time: transient.
        Err(e) => return Err(ChunkError::Failed(request_failed(e, CacheError::transient))),
    };
    let expected = headers.get(names::headers::CHUNK_SHA256).map(|v| v.as_str().to_string()).unwrap_or_default();
    let actual = hex(&Sha256::digest(&body));
    if actual != expected {
        return Err(ChunkError::Damaged { expected, actual });
    }
    Ok(body)
}

fn decode<M: Message + Default + BusMessage>((_, body): Reply) -> Result<M, CacheError> {
    M::decode(body).map_err(|e| CacheError::permanent(format!("the hub's answer is not a {}", M::TYPE), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn inventory_lists_complete_artifacts_only() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ArtifactCache::new(dir.path());
        std::fs::create_dir_all(dir.path().join("sha256")).unwrap();
        std::fs::create_dir_all(dir.path().join("partial")).unwrap();
        let a = "a".repeat(64);
        std::fs::write(cache.path(&a), b"x").unwrap();
        std::fs::write(cache.partial(&"b".repeat(64)), b"half").unwrap();
        std::fs::write(cache.dir().join("sha256").join("junk"), b"").unwrap();
        assert_eq!(cache.inventory().into_iter().collect::<Vec<_>>(), [a]);
        assert_eq!(cache.partial_len(&"b".repeat(64)), 4);
    }

    #[tokio::test]
    async fn past_its_limit_the_cache_evicts_old_unpinned_artifacts_first() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ArtifactCache::new(dir.path()).with_max_bytes(25);
        std::fs::create_dir_all(dir.path().join("sha256")).unwrap();
        let [old, older, busy, current] = ["a", "b", "c", "d"].map(|c| c.repeat(64));
        for (i, sha) in [&older, &old, &busy, &current].into_iter().enumerate() {
            std::fs::write(cache.path(sha), [0u8; 10]).unwrap();
            let at = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000 + i as u64);
            std::fs::File::options().write(true).open(cache.path(sha)).unwrap().set_modified(at).unwrap();
        }
        cache.usage.lock().unwrap().staged([("kubelet", current.as_str())]);
        let package = |sha: &str| {
            Package::try_from(pb::Package {
                name: "containerd".into(),
                version: "1.7.13".into(),
                kind: pb::PackageKind::Binary as i32,
                sha256: sha.into(),
                ..Default::default()
            })
            .unwrap()
        };
        let pinned = cache.pin(&[package(&busy)]);
        // 40 bytes, 25 allowed: the oldest two that nothing needs go, oldest first.
        assert_eq!(cache.evict(), Evicted { artifacts: 2, bytes: 20 });
        assert_eq!(cache.inventory(), BTreeSet::from([busy.clone(), current.clone()]));
        assert_eq!(cache.evict(), Evicted::default(), "what is left is needed, even past the limit");
        drop(pinned);
        // Once its job is done, an artifact no current package is goes when room is needed.
        assert_eq!(cache.clone().with_max_bytes(15).evict(), Evicted { artifacts: 1, bytes: 10 });
        assert_eq!(cache.inventory(), BTreeSet::from([current]));
    }

    #[test]
    fn the_window_grows_while_chunks_come_quickly_and_shrinks_when_they_queue() {
        assert_eq!(next_window(START_WINDOW, Duration::from_millis(10)), START_WINDOW + 1);
        assert_eq!(next_window(WINDOW, Duration::from_millis(10)), WINDOW);
        assert_eq!(next_window(6, TARGET_LATENCY * 3 / 4), 6);
        assert_eq!(next_window(6, TARGET_LATENCY * 2), 5);
        assert_eq!(next_window(MIN_WINDOW, TARGET_LATENCY * 2), MIN_WINDOW);
    }

    #[tokio::test]
    async fn resume_rehashes_the_partial_and_drops_an_overlong_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p");
        std::fs::write(&path, b"hello").unwrap();
        let mut h = Sha256::new();
        assert_eq!(resume(&path, 10, &mut h).await.unwrap(), 5);
        h.update(b" world");
        assert_eq!(hex(&h.finalize()), hex(&Sha256::digest(b"hello world")));
        let mut h = Sha256::new();
        assert_eq!(resume(&path, 3, &mut h).await.unwrap(), 0);
        assert!(!path.exists());
    }
}
