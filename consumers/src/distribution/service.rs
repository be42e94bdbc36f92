//! The distribution service: sends artifacts from the artifact store to site gateways over
//! NATS, chunk by chunk, as the gateways ask.
//!
//! Why pulled chunks over core request/reply, not a JetStream object store: the artifact store
//! is where the bytes live already; copying every artifact into JetStream would keep a second
//! copy (three in an R3 cluster) on the hub's NATS disks. A gateway asks for byte ranges, so a
//! transfer cut anywhere resumes at the offset the gateway's partial file has reached (the
//! object store's reader starts at the first chunk), the gateway's window of outstanding
//! requests is the flow control, and replicas share the requests as one queue group with no
//! state between them. Each chunk's reply carries the digest of the bytes as read, so the
//! gateway tells a chunk damaged on the way from a store whose copy is damaged.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use bus_schema::names::{self, keys};
use bus_schema::pb;
use bus_schema::runtime::{self, Bus, Kv, Reply, error_reply};
use bus_schema::trust;
use bytes::Bytes;
use prost::Message;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::artifacts::{self, ArtifactStore};
use super::render::Renderer;
use crate::helm::Helm;

/// The chunk size gateways are told to ask for.
pub const DEFAULT_CHUNK_SIZE: u32 = 960 * 1024;
/// The largest chunk served: under the bus's payload limit, with room for headers.
pub const MAX_CHUNK_SIZE: u32 = 960 * 1024;
/// Requests answered at once by one replica.
const CONCURRENCY: usize = 64;
/// Renders made at once by one replica: each runs helm.
const RENDER_CONCURRENCY: usize = 4;

/// What the distribution service has done, for tests, benchmarks and metrics.
#[derive(Debug, Default)]
pub struct DistributionStats {
    pub plans: AtomicU64,
    pub chunks_served: AtomicU64,
    pub bytes_served: AtomicU64,
}

#[derive(Debug, Clone)]
pub struct DistributionConfig {
    pub chunk_size: u32,
    /// Fault injection: this many chunks leave with one byte flipped after their digest was
    /// taken, as a damaged link would deliver them.
    pub corrupt_chunks: Arc<AtomicU32>,
    /// Fault injection: once this many bytes have been served (0: never), chunk requests fail
    /// as over a cut link, until it is set back to 0.
    pub cut_after_bytes: Arc<AtomicU64>,
    pub stats: Arc<DistributionStats>,
    /// The helm binary charts are rendered with; `None`: [`Helm::locate`]'s.
    pub helm: Option<std::path::PathBuf>,
}

impl Default for DistributionConfig {
    fn default() -> Self {
        Self {
            chunk_size: DEFAULT_CHUNK_SIZE,
            corrupt_chunks: Arc::new(AtomicU32::new(0)),
            cut_after_bytes: Arc::new(AtomicU64::new(0)),
            stats: Arc::new(DistributionStats::default()),
            helm: None,
        }
    }
}

struct Distribution {
    store: ArtifactStore,
    packages: Kv,
    config: DistributionConfig,
    renderer: Renderer,
}

/// Runs the distribution service until `shutdown`, and announces `store`'s location in the
/// catalog bucket so `landfall package upload` finds it.
pub async fn run_distribution(
    bus: Bus,
    store: ArtifactStore,
    config: DistributionConfig,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let packages = bus.kv(names::PACKAGES_BUCKET).await?;
    packages.put(keys::ARTIFACT_STORE, &pb::ArtifactStoreInfo { url: store.url().to_string() }).await?;
    let helm = match &config.helm {
        Some(path) => Ok(Helm::new(path)),
        None => Helm::locate(),
    };
    match &helm {
        Ok(h) => info!(store = %store.url(), helm = %h.binary().display(), "distribution service serving artifacts"),
        Err(why) => {
            warn!(store = %store.url(), "distribution service serving artifacts; helm charts cannot be rendered: {why}")
        }
    }
    let sites = bus.kv(names::SITES_BUCKET).await?;
    let renderer = Renderer { helm, store: store.clone(), packages: packages.clone(), sites };
    let service = Arc::new(Distribution { store, packages, config, renderer });
    let plans = {
        let service = service.clone();
        runtime::serve_requests(
            &bus,
            names::svc_every_site(names::ARTIFACT_PLAN),
            names::DISTRIBUTION_GROUP,
            CONCURRENCY,
            shutdown.clone(),
            move |subject, payload| {
                let service = service.clone();
                async move { service.plan(&subject, &payload).await.unwrap_or_else(|e| error_reply(&e)) }
            },
        )
    };
    let renders = {
        let service = service.clone();
        runtime::serve_requests(
            &bus,
            names::svc_every_site(names::CHART_RENDER),
            names::DISTRIBUTION_GROUP,
            RENDER_CONCURRENCY,
            shutdown.clone(),
            move |subject, payload| {
                let service = service.clone();
                async move { service.renderer.answer(&subject, &payload).await.unwrap_or_else(|e| error_reply(&e)) }
            },
        )
    };
    let chunks = runtime::serve_requests(
        &bus,
        names::svc_every_site(names::ARTIFACT_CHUNK),
        names::DISTRIBUTION_GROUP,
        CONCURRENCY,
        shutdown,
        move |subject, payload| {
            let service = service.clone();
            async move { service.chunk(&subject, &payload).await.unwrap_or_else(|e| error_reply(&e)) }
        },
    );
    let (plans, renders, chunks) = tokio::join!(plans, renders, chunks);
    plans?;
    renders?;
    chunks?;
    Ok(())
}

impl Distribution {
    /// What the site's cache lacks of what it wants: each wanted package must be in the
    /// catalog as sent, and the store must hold its bytes.
    async fn plan(&self, subject: &str, payload: &[u8]) -> Result<Reply, String> {
        let req: pb::ArtifactPlanRequest = trust::decode_request(subject, payload)?;
        self.config.stats.plans.fetch_add(1, Ordering::Relaxed);
        let inventory: BTreeSet<&str> = req.inventory.iter().map(String::as_str).collect();
        let mut plan = pb::ArtifactPlan::default();
        let mut seen = BTreeSet::new();
        for wanted in &req.wanted {
            if !seen.insert(wanted.sha256.as_str()) {
                continue;
            }
            let key = keys::package(&wanted.name, &wanted.version);
            let cataloged = self.packages.get::<pb::Package>(&key).await.map_err(|e| e.to_string())?;
            let what = format!("{}@{}", wanted.name, wanted.version);
            let site = trust::subject_site(subject).unwrap_or_default();
            match cataloged {
                Some((p, _)) if p.sha256 == wanted.sha256 && p.object_key == wanted.object_key => {}
                // A chart's render is sent to the site it was made for, and to no other.
                Some((p, _)) if p.kind == pb::PackageKind::HelmChart as i32 => {
                    if !self.renderer.is_render_of(site, wanted).await? {
                        return Err(format!("{what} sha256:{} is not a render made for site {site}", wanted.sha256));
                    }
                }
                Some(_) => return Err(format!("{what} is in the catalog with another digest or object key")),
                None => return Err(format!("{what} is not in the catalog")),
            }
            if wanted.object_key.is_empty() {
                plan.external.push(wanted.sha256.clone());
            } else if inventory.contains(wanted.sha256.as_str()) {
                plan.present.push(wanted.sha256.clone());
            } else {
                let stored = self.store.size(&wanted.object_key).await.map_err(|e| e.to_string())?;
                match stored {
                    Some(size) if size == wanted.size => {}
                    Some(size) => {
                        return Err(format!(
                            "{what}: the artifact store's object {} has {size} bytes, the catalog says {}",
                            wanted.object_key, wanted.size
                        ));
                    }
                    None => {
                        return Err(format!(
                            "{what}: the artifact store {} has no object {}; upload it with `landfall package upload`",
                            self.store.url(),
                            wanted.object_key
                        ));
                    }
                }
                plan.transfers.push(pb::ArtifactTransfer {
                    sha256: wanted.sha256.clone(),
                    size: wanted.size,
                    object_key: wanted.object_key.clone(),
                    chunk_size: self.config.chunk_size,
                });
            }
        }
        debug!(site = %req.site_id, fetch = plan.transfers.len(), present = plan.present.len(), "artifact plan");
        Ok((Default::default(), plan.encode_to_vec().into()))
    }

    /// One range of an artifact, with the digest of the bytes as read.
    async fn chunk(&self, subject: &str, payload: &[u8]) -> Result<Reply, String> {
        let req: pb::ChunkRequest = trust::decode_request(subject, payload)?;
        if req.object_key != artifacts::object_key(&req.sha256) {
            return Err(format!("{:?} is not the object key of sha256:{}", req.object_key, req.sha256));
        }
        if req.length == 0 || req.length > MAX_CHUNK_SIZE {
            return Err(format!("chunk length {} is not within 1..={MAX_CHUNK_SIZE}", req.length));
        }
        let end = req.offset.checked_add(u64::from(req.length)).ok_or("chunk range overflows")?;
        // Counted before the read, so a cut link lets exactly its bytes through.
        let cut = self.config.cut_after_bytes.load(Ordering::Relaxed);
        let stats = &self.config.stats;
        let len = u64::from(req.length);
        stats
            .bytes_served
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |served| {
                (cut == 0 || served + len <= cut).then_some(served + len)
            })
            .map_err(|_| "fault injection: the link to the site is cut".to_string())?;
        let bytes = self.store.read(&req.object_key, req.offset..end).await.map_err(|e| format!("{e:#}"))?;
        let digest = artifacts::sha256_hex(&bytes);
        stats.chunks_served.fetch_add(1, Ordering::Relaxed);
        let bytes = self.maybe_corrupt(bytes, &req);
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(names::headers::CHUNK_SHA256, digest.as_str());
        Ok((headers, bytes))
    }

    fn maybe_corrupt(&self, bytes: Bytes, req: &pb::ChunkRequest) -> Bytes {
        let armed = self.config.corrupt_chunks.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        if armed.is_err() || bytes.is_empty() {
            return bytes;
        }
        warn!(site = %req.site_id, sha256 = %req.sha256, offset = req.offset, "fault injection: chunk damaged on its way");
        let mut damaged = bytes.to_vec();
        damaged[0] ^= 0xff;
        damaged.into()
    }
}
