//! Jobs in, events out (the hosts the site gains or loses are announced by `announce.rs`; a
//! node patch, batch after batch, is `gateway/patch.rs`; a node or the whole site taken away,
//! `gateway/lifecycle.rs`; a helm chart turned into its site's render, `gateway/charts.rs`; its
//! release checked for drift, `gateway/drift.rs`).

mod charts;
mod done;
mod drift;
mod lifecycle;
mod patch;

use std::sync::Arc;

use bus_schema::domain::{NodeDesign, Package, Role, SiteId};
use bus_schema::names;
use bus_schema::pb::{self, BusJob};
use bus_schema::runtime::{self, Bus, ConsumerSpec, Delivery, Envelope, HandlerError, RejectAs, error_reply};
use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::alive::{LastReport, keep_alive};
use crate::announce::announce_host_changes;
use crate::backend::{BackendError, CapiBuild, Cause, ClusterRequest, HostRequest, SiteBackend};
use crate::cache::{ArtifactCache, CacheError, Staged};
use crate::credentials::Asked;
use crate::inbox::{self, FromInbox, Keep};
use crate::outbox::{self, Outbox};

/// How long a node of a patch is out of service before its steps (cordoned, drained,
/// uncordoned) are sent on their own rather than in its report: long enough that a node back
/// within moments costs the hub one event, short enough that a person watching a drain or a
/// reimage sees the node out of service.
pub const STEPS_SHOWN_AFTER: std::time::Duration = std::time::Duration::from_secs(2);

/// The gateway of one site.
pub struct Gateway<B> {
    site: SiteId,
    bus: Bus,
    backend: Arc<B>,
    cache: ArtifactCache,
    /// The site's own record, when the gateway runs on its site's leaf node: its reports are
    /// stored there first and reach the hub from there.
    outbox: Option<Arc<Outbox>>,
    /// Its latest report, which its heartbeat tells the hub.
    last_report: Arc<LastReport>,
    /// How long a node of a patch is out of service before its steps are sent on their own
    /// (see [`patch`]'s `steps`).
    steps_shown_after: std::time::Duration,
}

impl<B: SiteBackend> Gateway<B> {
    pub fn new(site: SiteId, bus: Bus, backend: Arc<B>, cache: ArtifactCache) -> Self {
        let bus = bus.as_gateway();
        let steps_shown_after = STEPS_SHOWN_AFTER;
        done::DoneJobs::under(cache.dir()).prune(done::KEPT_FOR);
        Self { site, bus, backend, cache, outbox: None, last_report: Arc::default(), steps_shown_after }
    }

    /// The jobs this site carried out ([`done`]).
    fn done_jobs(&self) -> done::DoneJobs {
        done::DoneJobs::under(self.cache.dir())
    }

    /// Sends a patched node's steps on their own once it has been out of service for `after`
    /// ([`STEPS_SHOWN_AFTER`] otherwise).
    pub fn with_steps_shown_after(mut self, after: std::time::Duration) -> Self {
        self.steps_shown_after = after;
        self
    }

    /// Notes each report in `last` (see [`crate::alive`]).
    pub fn with_last_report(mut self, last: Arc<LastReport>) -> Self {
        self.last_report = last;
        self
    }

    /// Stores the reports in `outbox` first (see [`crate::outbox`]).
    pub fn with_outbox(mut self, outbox: Arc<Outbox>) -> Self {
        self.outbox = Some(outbox);
        self
    }

    fn check_site<J: BusJob>(&self, job: &J) -> Result<(), HandlerError> {
        if job.site() != self.site.as_str() {
            return Err(HandlerError::reject(
                pb::RejectCode::Invalid,
                format!("job for site {:?} reached the gateway of {}", job.site(), self.site),
            ));
        }
        Ok(())
    }

    async fn publish<E: bus_schema::BusEvent>(&self, evt: &E, env: &Envelope) -> Result<(), HandlerError> {
        let subject = evt.subject_from(self.bus.origin());
        self.last_report.note(E::TYPE);
        match &self.outbox {
            Some(outbox) if outbox::kept_at_site(&subject) => {
                outbox.store(&subject, E::TYPE, evt.encode_to_vec().into(), env).await?;
            }
            _ => {
                self.bus.publish_event(evt, env).await?;
            }
        }
        Ok(())
    }

    /// A transient backend error is retried (NAK); any other fails the job for good.
    async fn backend_failed(&self, d: &Delivery, job: &str, e: BackendError) -> Result<(), HandlerError> {
        match e {
            e @ BackendError::Transient { .. } => Err(HandlerError::transient(job, e)),
            other => self.job_failed(d, job, other.reason()).await,
        }
    }

    async fn job_failed(&self, d: &Delivery, job: &str, reason: String) -> Result<(), HandlerError> {
        warn!(site = %self.site, job, %reason, "job failed");
        let evt = pb::JobFailed { site_id: self.site.to_string(), job: job.to_string(), reason };
        self.publish(&evt, &d.envelope.derive("job_failed", None)).await
    }

    /// Brings what the site lacks of `artifacts` into its cache, verified, and hands them to
    /// the site's provisioning.
    async fn stage_into_cache(&self, artifacts: &[Package]) -> Result<Staged, BackendError> {
        // What this job uses stays until the site's provisioning has it.
        let _in_use = self.cache.pin(artifacts);
        let (staged, cached) =
            self.cache.stage(&self.bus, self.site.as_str(), artifacts).await.map_err(|e| match e {
                CacheError::Transient { context, source } => {
                    BackendError::Transient { context, source: source.map(Cause::from) }
                }
                CacheError::Permanent { context, source } => {
                    BackendError::Permanent { context, source: source.map(Cause::from) }
                }
            })?;
        self.backend.stage_artifacts(&cached).await?;
        self.cache.evict();
        Ok(staged)
    }

    async fn stage(&self, d: &Delivery) -> Result<(), HandlerError> {
        let job: pb::StageArtifacts = d.decode()?;
        self.check_site(&job)?;
        let artifacts = packages(job.artifacts)?;
        let staged = match self.rendered(artifacts).await {
            Ok(artifacts) => self.stage_into_cache(&artifacts).await,
            Err(e) => Err(e),
        };
        match staged {
            Ok(s) => {
                info!(
                    site = %self.site,
                    artifacts = s.artifacts,
                    transferred = s.bytes_transferred,
                    present = s.bytes_present,
                    resumed = s.bytes_resumed,
                    refetched = s.chunks_refetched,
                    "artifacts staged"
                );
                let evt = pb::ArtifactsStaged {
                    site_id: self.site.to_string(),
                    artifacts: s.artifacts,
                    bytes_transferred: s.bytes_transferred,
                    bytes_present: s.bytes_present,
                    bytes_resumed: s.bytes_resumed,
                    chunks_refetched: s.chunks_refetched,
                    external: s.external,
                };
                self.publish(&evt, &d.envelope.derive("artifacts_staged", None)).await
            }
            Err(e) => self.backend_failed(d, pb::StageArtifacts::KIND, e).await,
        }
    }

    async fn provision(&self, d: &Delivery) -> Result<(), HandlerError> {
        let job: pb::ProvisionOs = d.decode()?;
        self.check_site(&job)?;
        let node = NodeDesign::try_from(job.node.unwrap_or_default()).map_err(invalid)?;
        let image = Package::try_from(job.image.unwrap_or_default()).map_err(invalid)?;
        let mut req = HostRequest::new(node.clone(), &image);
        req.enroll_only = job.builder == pb::ClusterBuilder::Capi as i32;
        // Driving the host's BMC needs its credentials, which the hub hands out only for this job
        // (the site never keeps them). While the hub is out of reach, a host the site has
        // already goes on without them (a job taken up again by a gateway restarted during a
        // cut), and one it would have to create waits for the link.
        match crate::credentials::ask(&self.bus, self.site.as_str(), node.name.as_str(), &d.envelope).await {
            Ok(creds) => req.bmc = creds,
            Err(Asked::OutOfReach(e)) => {
                debug!(site = %self.site, node = %node.name, error = %e, "the hub is out of reach: provisioning without BMC credentials");
                req.bmc_out_of_reach = true;
            }
            Err(Asked::Failed(e)) => return Err(e),
        }
        let image_name = req.package.key();

        // Every state the host passes through becomes an event, in order, while it provisions.
        let result =
            self.with_states(d, node.name.as_str(), &image_name, |tx| self.backend.provision_host(&req, tx)).await?;

        let node_name = node.name.to_string();
        match result {
            Ok(()) => {
                info!(site = %self.site, node = %node_name, image = %image_name, "os provisioned");
                let evt = pb::NodeOsProvisioned {
                    site_id: self.site.to_string(),
                    node: node_name.clone(),
                    image: image_name,
                };
                self.publish(&evt, &d.envelope.derive("os_provisioned", Some(&node_name))).await
            }
            Err(e @ BackendError::Transient { .. }) => {
                Err(HandlerError::transient(format!("provisioning the os of {node_name}"), e))
            }
            Err(e) => {
                let (error_type, reason) = match e {
                    BackendError::HostFailed { error_type, message, .. } => (error_type, message),
                    other => (String::new(), other.reason()),
                };
                warn!(site = %self.site, node = %node_name, %error_type, %reason, "os provisioning failed");
                let evt = pb::NodeFailed {
                    site_id: self.site.to_string(),
                    node: node_name.clone(),
                    step: pb::ProvisionOs::KIND.to_string(),
                    reason,
                    error_type,
                };
                self.publish(&evt, &d.envelope.derive("node_failed", Some(&node_name))).await
            }
        }
    }

    /// Runs `work`, which sends each Metal3 state host `node` passes, and publishes those states
    /// meanwhile ([`Self::relay_states`]); what `work` returned.
    async fn with_states<T, Fut>(
        &self,
        d: &Delivery,
        node: &str,
        image: &str,
        work: impl FnOnce(mpsc::UnboundedSender<crate::backend::ProvisioningState>) -> Fut,
    ) -> Result<T, HandlerError>
    where
        Fut: std::future::Future<Output = T>,
    {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (result, relayed) = tokio::join!(work(tx), self.relay_states(d, node, image, &mut rx));
        relayed?;
        Ok(result)
    }

    /// Publishes each Metal3 state a host passes (from `states`, until the work sending them
    /// ends) as `NodeOsProvisioning`, in order, each with the id derived from the state.
    async fn relay_states(
        &self,
        d: &Delivery,
        node: &str,
        image: &str,
        states: &mut mpsc::UnboundedReceiver<crate::backend::ProvisioningState>,
    ) -> Result<(), HandlerError> {
        while let Some(state) = states.recv().await {
            let evt = pb::NodeOsProvisioning {
                site_id: self.site.to_string(),
                node: node.to_string(),
                state: state.as_str().to_string(),
                image: image.to_string(),
            };
            self.publish(&evt, &d.envelope.derive(&format!("os_state/{}", state.as_str()), Some(node))).await?;
        }
        Ok(())
    }

    async fn install_binaries(&self, d: &Delivery) -> Result<(), HandlerError> {
        let job: pb::InstallBinaries = d.decode()?;
        self.check_site(&job)?;
        let nodes = nodes(job.nodes)?;
        let binaries = packages(job.binaries)?;
        let refs: Vec<pb::PackageRef> = binaries.iter().map(|p| pb::PackageRef::from(&p.reference())).collect();
        let capi = match job.design {
            Some(design) => {
                let design = bus_schema::domain::SiteDesign::try_from(design).map_err(invalid)?;
                let mut all = packages(job.images)?;
                all.extend(binaries.iter().cloned());
                Some(CapiBuild { design, packages: all })
            }
            None => None,
        };
        let req = ClusterRequest { nodes, binaries, join_existing: job.join_existing, capi };
        let results = match self.backend.install_binaries(&req).await {
            Ok(r) => r,
            Err(e) => return self.backend_failed(d, pb::InstallBinaries::KIND, e).await,
        };

        let site = self.site.to_string();
        let mut ready = pb::ClusterReady { site_id: site.clone(), ..Default::default() };
        for r in &results {
            match &r.failure {
                None => {
                    let evt = pb::NodeBinariesInstalled {
                        site_id: site.clone(),
                        node: r.node.clone(),
                        binaries: refs.clone(),
                    };
                    self.publish(&evt, &d.envelope.derive("binaries_installed", Some(&r.node))).await?;
                    match r.role {
                        Role::Master => ready.masters.push(r.node.clone()),
                        Role::Worker => ready.workers.push(r.node.clone()),
                    }
                }
                Some(reason) => {
                    let evt = pb::NodeFailed {
                        site_id: site.clone(),
                        node: r.node.clone(),
                        step: pb::InstallBinaries::KIND.to_string(),
                        reason: reason.clone(),
                        error_type: String::new(),
                    };
                    self.publish(&evt, &d.envelope.derive("node_failed", Some(&r.node))).await?;
                    ready.failed.push(pb::NodeResult {
                        node: r.node.clone(),
                        role: pb::Role::from(r.role) as i32,
                        outcome: pb::NodeOutcome::Failed as i32,
                        failed_step: pb::InstallBinaries::KIND.to_string(),
                        reason: reason.clone(),
                        ..Default::default()
                    });
                }
            }
        }
        if req.join_existing {
            // The cluster exists: its masters need not be among the nodes that join it.
            let joined = ready.masters.len() + ready.workers.len();
            info!(site = %self.site, joined, failed = ready.failed.len(), "nodes joined the cluster");
            return Ok(());
        }
        if ready.masters.is_empty() {
            let reason = "no master has its binaries: the cluster cannot form".to_string();
            return self.job_failed(d, pb::InstallBinaries::KIND, reason).await;
        }
        info!(site = %self.site, masters = ready.masters.len(), workers = ready.workers.len(), "cluster ready");
        self.publish(&ready, &d.envelope.derive("cluster_ready", None)).await
    }

    async fn apply_containers(&self, d: &Delivery) -> Result<(), HandlerError> {
        let job: pb::ApplyContainerPackages = d.decode()?;
        self.check_site(&job)?;
        let pkgs = packages(job.packages)?;
        // A chart's render is made now, for the cluster as it stands, and brought to the cache.
        let applied = match self.rendered(pkgs.clone()).await {
            Ok(rendered) if rendered != pkgs => match self.stage_into_cache(&rendered).await {
                Ok(_) => self.backend.apply_container_packages(&rendered).await,
                Err(e) => Err(e),
            },
            Ok(rendered) => self.backend.apply_container_packages(&rendered).await,
            Err(e) => Err(e),
        };
        match applied {
            Ok(()) => {
                let evt = pb::ContainerPackagesApplied {
                    site_id: self.site.to_string(),
                    packages: pkgs.iter().map(|p| pb::PackageRef::from(&p.reference())).collect(),
                };
                self.publish(&evt, &d.envelope.derive("containers_applied", None)).await
            }
            Err(e) => self.backend_failed(d, pb::ApplyContainerPackages::KIND, e).await,
        }
    }
}

impl<B: SiteBackend> runtime::Handler for Gateway<B> {
    async fn handle(&self, d: &Delivery) -> Result<(), HandlerError> {
        let kind = d.kind()?;
        debug!(site = %self.site, kind, id = %d.envelope.id, delivered = d.delivered, "job");
        let Some(kind) = JOB_KINDS.iter().copied().find(|k| *k == kind) else {
            return Err(HandlerError::reject(pb::RejectCode::Unsupported, format!("no such job kind {kind:?}")));
        };
        // Its acknowledgement was lost: the hub may have sent newer jobs since.
        if self.done_jobs().has(&d.envelope.id) {
            info!(site = %self.site, kind, id = %d.envelope.id, "carried out before: not again");
            return Ok(());
        }
        let timer = JobTimer::start(&self.site, kind);
        let result = match kind {
            pb::StageArtifacts::KIND => self.stage(d).await,
            pb::ProvisionOs::KIND => self.provision(d).await,
            pb::InstallBinaries::KIND => self.install_binaries(d).await,
            pb::ApplyContainerPackages::KIND => self.apply_containers(d).await,
            pb::PatchNodes::KIND => self.patch(d).await,
            pb::RetireNode::KIND => self.retire(d).await,
            pb::TearDownSite::KIND => self.tear_down(d).await,
            other => Err(HandlerError::reject(pb::RejectCode::Unsupported, format!("no handler for {other:?} jobs"))),
        };
        timer.finish(&result);
        if result.is_ok() {
            self.done_jobs().note(&d.envelope.id);
        }
        result
    }
}

/// The job kinds a gateway carries out.
const JOB_KINDS: [&str; 7] = [
    pb::StageArtifacts::KIND,
    pb::ProvisionOs::KIND,
    pb::InstallBinaries::KIND,
    pb::ApplyContainerPackages::KIND,
    pb::PatchNodes::KIND,
    pb::RetireNode::KIND,
    pb::TearDownSite::KIND,
];

/// A job in hand: counted in its site's jobs in flight until it is finished or dropped, and
/// timed by kind and outcome.
struct JobTimer {
    site: String,
    kind: &'static str,
    started: std::time::Instant,
}

impl JobTimer {
    fn start(site: &SiteId, kind: &'static str) -> Self {
        let site = site.to_string();
        metrics::gauge!("landfall_gateway_jobs_in_flight", "site" => site.clone()).increment(1.0);
        Self { site, kind, started: std::time::Instant::now() }
    }

    /// Records the job's time: `done` when the handler settled it (its events, a `JobFailed`
    /// included, are out), `retried` when it goes back for redelivery, `rejected` when refused.
    fn finish(self, result: &Result<(), HandlerError>) {
        let outcome = match result {
            Ok(()) => "done",
            Err(HandlerError::Transient { .. } | HandlerError::Wait { .. }) => "retried",
            Err(HandlerError::Reject(_)) => "rejected",
        };
        let seconds = self.started.elapsed().as_secs_f64();
        metrics::histogram!("landfall_gateway_job_seconds", "kind" => self.kind, "outcome" => outcome).record(seconds);
    }
}

impl Drop for JobTimer {
    fn drop(&mut self) {
        metrics::gauge!("landfall_gateway_jobs_in_flight", "site" => std::mem::take(&mut self.site)).decrement(1.0);
    }
}

fn invalid(e: bus_schema::domain::InvalidField) -> HandlerError {
    HandlerError::reject(pb::RejectCode::Invalid, e.to_string())
}

fn packages(list: Vec<pb::Package>) -> Result<Vec<Package>, HandlerError> {
    list.into_iter().map(Package::try_from).collect::<Result<Vec<_>, _>>().map_err(invalid)
}

fn nodes(list: Vec<pb::NodeSpec>) -> Result<Vec<NodeDesign>, HandlerError> {
    list.into_iter().map(NodeDesign::try_from).collect::<Result<Vec<_>, _>>().map_err(invalid)
}

/// Answers `landfall.to.<site>.rpc.kubeconfig` until `shutdown`, one request at a time; the
/// site's gateways share them as one queue group, as they share the site's jobs. The
/// kubeconfig itself is never logged.
async fn serve_kubeconfig<B: SiteBackend>(
    site: SiteId,
    bus: Bus,
    backend: Arc<B>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let subject = names::kubeconfig_rpc(site.as_str());
    let group = names::gateway_consumer(site.as_str());
    runtime::serve_requests(&bus, subject, &group, 1, shutdown, move |subject, payload| {
        let backend = backend.clone();
        async move {
            match bus_schema::trust::decode_request::<pb::KubeconfigRequest>(&subject, &payload) {
                Ok(_) => match backend.kubeconfig().await {
                    Ok(kc) => (async_nats::HeaderMap::new(), Bytes::from(kc)),
                    Err(e) => error_reply(&e.reason()),
                },
                Err(reason) => error_reply(&reason),
            }
        }
    })
    .await?;
    Ok(())
}

/// Runs a site's gateway until `shutdown`: its jobs consumer, its kubeconfig responder, the
/// announcer of the hosts that arrive at the site, and on a leaf node its outbox's forwarder.
/// Its heartbeat goes out every `alive_every` (see [`crate::alive`]).
pub async fn run_gateway<B: SiteBackend>(
    site: SiteId,
    bus: Bus,
    backend: Arc<B>,
    cache: ArtifactCache,
    alive_every: std::time::Duration,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    run_gateway_showing_steps(site, bus, backend, cache, alive_every, STEPS_SHOWN_AFTER, shutdown).await
}

/// [`run_gateway`], a patched node's steps sent on their own once it has been out of service
/// for `steps_shown_after`.
pub async fn run_gateway_showing_steps<B: SiteBackend>(
    site: SiteId,
    bus: Bus,
    backend: Arc<B>,
    cache: ArtifactCache,
    alive_every: std::time::Duration,
    steps_shown_after: std::time::Duration,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let bus = bus.as_gateway();
    // On its site's leaf node (the hub's JetStream named by its domain), the site keeps its
    // own record of what it reports and announces, and the jobs that reached it: kept, carried
    // out and forwarded from the start, even while the hub cannot be reached. A relay in front
    // of the hub names the hub's domain too, but keeps nothing: there, as at the hub, the hub's
    // durable keeps the jobs and a report is sent straight.
    let at_leaf = bus.js_domain().is_some() && bus.has_local_jetstream();
    let outbox = match at_leaf {
        true => {
            let open = async {
                inbox::open(&bus).await?;
                Outbox::open(site.as_str(), &bus).await
            };
            Some(Arc::new(open.await.map_err(|e| {
                anyhow::anyhow!(
                    "the site's leaf node keeps no inbox or outbox (is JetStream on in its own domain?): {e}"
                )
            })?))
        }
        false => None,
    };
    let mut side = tokio::task::JoinSet::new();
    if let Some(outbox) = outbox.clone() {
        side.spawn(outbox.forward(shutdown.clone()));
    }
    let last_report = Arc::new(LastReport::default());
    side.spawn(keep_alive(
        site.to_string(),
        bus.clone(),
        alive_every,
        outbox.clone(),
        last_report.clone(),
        shutdown.clone(),
    ));
    side.spawn(announce_host_changes(site.clone(), bus.clone(), outbox.clone(), backend.clone(), shutdown.clone()));
    let mut gateway = Gateway::new(site.clone(), bus.clone(), backend.clone(), cache)
        .with_last_report(last_report)
        .with_steps_shown_after(steps_shown_after);
    match outbox {
        Some(outbox) => gateway = gateway.with_outbox(outbox),
        // Its reports go straight to the hub: none ever waits at the site.
        None => metrics::gauge!("landfall_site_outbox_waiting", "site" => site.to_string()).set(0.0),
    }
    let gateway = Arc::new(gateway);
    let kept = at_leaf.then(|| {
        let jobs = runtime::consume(
            bus.clone(),
            inbox::spec(site.as_str()),
            Arc::new(FromInbox(gateway.clone())),
            shutdown.clone(),
        );
        tokio::spawn(jobs)
    });
    // A site may start while its link to the hub is down, or before the hub made its durable:
    // its deliveries start when they can.
    info!(%site, kept_at_site = at_leaf, "gateway running");
    let drift_every = backend.drift_every();
    let rpc = tokio::spawn(serve_kubeconfig(site.clone(), bus.clone(), backend, shutdown.clone()));
    let drift_rpc = tokio::spawn(drift::serve_drift_check(gateway.clone(), shutdown.clone()));
    if let Some(every) = drift_every {
        side.spawn(drift::watch_drift(gateway.clone(), every, shutdown.clone()));
    }
    // Provisioning takes minutes; all of a site's hosts provision at once. From the site's
    // durable, or handed out by the hub's dispatcher: whichever the hub does.
    use runtime::dispatched::take_jobs;
    match at_leaf {
        true => take_jobs(bus, site.as_str(), Arc::new(Keep::new(&gateway.bus)), shutdown).await?,
        false => take_jobs(bus, site.as_str(), gateway, shutdown).await?,
    }
    rpc.await??;
    drift_rpc.await??;
    if let Some(kept) = kept {
        kept.await??;
    }
    while side.join_next().await.is_some() {}
    Ok(())
}

/// Which jobs a gateway host takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostScope {
    /// The job subjects of its sites, one filter each (fine for tens to hundreds of sites).
    ItsSites,
    /// Every job: the host serves every site of the fleet (a simulated fleet, a benchmark).
    /// A job for a site it does not have is rejected, so use it only when that cannot happen.
    EverySite,
}

/// The gateways of many sites run by one process on one durable consumer, `durable`, in each
/// shard of the jobs its sites' jobs are kept in; each job goes to its site's gateway.
///
/// With one durable pull consumer per site, at 10,000 sites nats-server logged read loops of
/// seconds on the gateways' connections; a host of sites costs the server one consumer,
/// however many sites it serves. With [`HostScope::ItsSites`] the consumer carries one filter
/// per site, which nats-server 2.10 also handles slowly by the thousand (a stream info took
/// 5 s with 4 consumers of 2,500 filters each).
///
/// Each site's artifact cache is the directory named after it in `cache_root`.
pub async fn run_gateway_host<B: SiteBackend>(
    durable: String,
    sites: Vec<(SiteId, Arc<B>)>,
    scope: HostScope,
    cache_root: std::path::PathBuf,
    bus: Bus,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let bus = bus.as_gateway();
    let mut gateways = std::collections::HashMap::new();
    let mut side = tokio::task::JoinSet::new();
    for (site, backend) in &sites {
        let cache = ArtifactCache::new(cache_root.join(site.as_str()));
        let last_report = Arc::new(LastReport::default());
        let gateway =
            Gateway::new(site.clone(), bus.clone(), backend.clone(), cache).with_last_report(last_report.clone());
        gateways.insert(site.to_string(), gateway);
        side.spawn(keep_alive(site.to_string(), bus.clone(), names::ALIVE_EVERY, None, last_report, shutdown.clone()));
        side.spawn(announce_host_changes(site.clone(), bus.clone(), None, backend.clone(), shutdown.clone()));
        let rpc = serve_kubeconfig(site.clone(), bus.clone(), backend.clone(), shutdown.clone());
        side.spawn(async move {
            if let Err(e) = rpc.await {
                warn!(error = %e, "kubeconfig responder stopped");
            }
        });
    }
    // One durable of the same name in each shard that holds jobs of its sites.
    let mut shards: std::collections::BTreeMap<usize, Vec<String>> = std::collections::BTreeMap::new();
    match scope {
        HostScope::ItsSites => {
            for (site, _) in &sites {
                shards.entry(names::job_shard(site.as_str())).or_default().push(names::site_jobs(site.as_str()));
            }
        }
        HostScope::EverySite => {
            for shard in 0..names::JOB_SHARDS {
                shards.insert(shard, vec![names::shard_jobs(shard)]);
            }
        }
    }
    info!(sites = sites.len(), shards = shards.len(), "gateway host running");
    let host = Arc::new(Host { gateways });
    let mut consumers = tokio::task::JoinSet::new();
    for (shard, filters) in shards {
        // A gateway files no dead letters (a site may not): its jobs are retried until settled.
        let spec = ConsumerSpec::new(
            names::jobs_stream(shard),
            durable.clone(),
            filters,
            RejectAs::Message { consumer: durable.clone() },
        )
        .concurrency(4096)
        .max_attempts(None);
        consumers.spawn(runtime::consume(bus.clone(), spec, host.clone(), shutdown.clone()));
    }
    while let Some(done) = consumers.join_next().await {
        if let Err(e) = done? {
            shutdown.cancel();
            return Err(e.into());
        }
    }
    while side.join_next().await.is_some() {}
    Ok(())
}

/// Routes a job to its site's gateway.
struct Host<B> {
    gateways: std::collections::HashMap<String, Gateway<B>>,
}

impl<B: SiteBackend> runtime::Handler for Host<B> {
    async fn handle(&self, d: &Delivery) -> Result<(), HandlerError> {
        let site = match names::parse_subject(&d.subject) {
            Some(names::ParsedSubject::Job { site, .. }) => site,
            _ => {
                return Err(HandlerError::reject(
                    pb::RejectCode::Malformed,
                    format!("{} is not a job subject", d.subject),
                ));
            }
        };
        match self.gateways.get(site) {
            Some(g) => runtime::Handler::handle(g, d).await,
            None => Err(HandlerError::reject(
                pb::RejectCode::UnknownSite,
                format!("this gateway host does not serve {site}"),
            )),
        }
    }
}
