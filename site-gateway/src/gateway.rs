//! Jobs in, events out.

use std::sync::Arc;

use bus_schema::domain::{NodeDesign, Package, Role, SiteId};
use bus_schema::names;
use bus_schema::pb::{self, BusJob, BusMessage};
use bus_schema::runtime::{self, Bus, ConsumerSpec, Delivery, Envelope, HandlerError, RejectAs};
use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::backend::{BackendError, ClusterRequest, HostRequest, ImageSpec, SiteBackend};

/// The gateway of one site.
pub struct Gateway<B> {
    site: SiteId,
    bus: Bus,
    backend: Arc<B>,
}

impl<B: SiteBackend> Gateway<B> {
    pub fn new(site: SiteId, bus: Bus, backend: Arc<B>) -> Self {
        Self { site, bus, backend }
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
        self.bus.publish_event(evt, env).await?;
        Ok(())
    }

    /// A transient backend error is retried (NAK); any other fails the job for good.
    async fn backend_failed(&self, d: &Delivery, job: &str, e: BackendError) -> Result<(), HandlerError> {
        match e {
            BackendError::Transient(e) => Err(HandlerError::Transient(e)),
            other => self.job_failed(d, job, other.to_string()).await,
        }
    }

    async fn job_failed(&self, d: &Delivery, job: &str, reason: String) -> Result<(), HandlerError> {
        warn!(site = %self.site, job, %reason, "job failed");
        let evt = pb::JobFailed { site_id: self.site.to_string(), job: job.to_string(), reason };
        self.publish(&evt, &d.envelope.derive("job_failed", None)).await
    }

    async fn stage(&self, d: &Delivery) -> Result<(), HandlerError> {
        let job: pb::StageArtifacts = d.decode()?;
        self.check_site(&job)?;
        let artifacts = packages(job.artifacts)?;
        match self.backend.stage_artifacts(&artifacts).await {
            Ok(report) => {
                info!(site = %self.site, artifacts = report.artifacts, bytes = report.bytes_transferred, "artifacts staged");
                let evt = pb::ArtifactsStaged {
                    site_id: self.site.to_string(),
                    artifacts: report.artifacts,
                    bytes_transferred: report.bytes_transferred,
                    bytes_present: report.bytes_present,
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
        let image_name = format!("{}@{}", image.name, image.version);
        let req = HostRequest { node: node.clone(), image: ImageSpec::from_package(&image) };

        // Every state the host passes through becomes an event, in order, while it provisions.
        let (tx, mut rx) = mpsc::unbounded_channel();
        let work = self.backend.provision_host(&req, tx);
        let relay = async {
            while let Some(state) = rx.recv().await {
                let evt = pb::NodeOsProvisioning {
                    site_id: self.site.to_string(),
                    node: node.name.to_string(),
                    state: state.as_str().to_string(),
                    image: image_name.clone(),
                };
                let env = d.envelope.derive(&format!("os_state/{}", state.as_str()), Some(node.name.as_str()));
                self.publish(&evt, &env).await?;
            }
            Ok::<(), HandlerError>(())
        };
        let (result, relayed) = tokio::join!(work, relay);
        relayed?;

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
            Err(BackendError::Transient(e)) => Err(HandlerError::Transient(e)),
            Err(e) => {
                let (error_type, reason) = match e {
                    BackendError::HostFailed { error_type, message, .. } => (error_type, message),
                    other => (String::new(), other.to_string()),
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

    async fn install_binaries(&self, d: &Delivery) -> Result<(), HandlerError> {
        let job: pb::InstallBinaries = d.decode()?;
        self.check_site(&job)?;
        let nodes = job.nodes.into_iter().map(NodeDesign::try_from).collect::<Result<Vec<_>, _>>().map_err(invalid)?;
        let binaries = packages(job.binaries)?;
        let refs: Vec<pb::PackageRef> = binaries.iter().map(|p| pb::PackageRef::from(&p.reference())).collect();
        let req = ClusterRequest { nodes, binaries };
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
                    });
                }
            }
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
        match self.backend.apply_container_packages(&pkgs).await {
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
        match kind {
            pb::StageArtifacts::KIND => self.stage(d).await,
            pb::ProvisionOs::KIND => self.provision(d).await,
            pb::InstallBinaries::KIND => self.install_binaries(d).await,
            pb::ApplyContainerPackages::KIND => self.apply_containers(d).await,
            other => Err(HandlerError::reject(pb::RejectCode::Unsupported, format!("no such job kind {other:?}"))),
        }
    }
}

fn invalid(e: bus_schema::domain::InvalidField) -> HandlerError {
    HandlerError::reject(pb::RejectCode::Invalid, e.to_string())
}

fn packages(list: Vec<pb::Package>) -> Result<Vec<Package>, HandlerError> {
    list.into_iter().map(Package::try_from).collect::<Result<Vec<_>, _>>().map_err(invalid)
}

/// Answers `landfall.rpc.<site>.kubeconfig` until `shutdown`.
async fn serve_kubeconfig<B: SiteBackend>(
    site: SiteId,
    bus: Bus,
    backend: Arc<B>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let subject = names::kubeconfig_rpc(site.as_str());
    let queue = names::gateway_consumer(site.as_str());
    let mut sub = bus.client().queue_subscribe(subject, queue).await?;
    loop {
        let msg = tokio::select! {
            _ = shutdown.cancelled() => break,
            m = sub.next() => match m { Some(m) => m, None => break },
        };
        let Some(reply) = msg.reply else { continue };
        let (headers, body) = match prost::Message::decode(msg.payload.clone()) {
            Ok(pb::KubeconfigRequest { site_id }) if site_id == site.as_str() => match backend.kubeconfig().await {
                Ok(kc) => (async_nats::HeaderMap::new(), kc),
                Err(e) => error_reply(&e.to_string()),
            },
            Ok(other) => error_reply(&format!("request for site {:?} reached {site}", other.site_id)),
            Err(e) => error_reply(&format!("not a {}: {e}", pb::KubeconfigRequest::TYPE)),
        };
        // The kubeconfig itself is never logged.
        if let Err(e) = bus.client().publish_with_headers(reply, headers, body.into()).await {
            warn!(%site, error = %e, "cannot answer kubeconfig request");
        }
    }
    Ok(())
}

fn error_reply(reason: &str) -> (async_nats::HeaderMap, Vec<u8>) {
    let mut h = async_nats::HeaderMap::new();
    h.insert(names::headers::REPLY_ERROR, reason);
    (h, Vec::new())
}

/// Runs a site's gateway until `shutdown`: its jobs consumer and its kubeconfig responder.
pub async fn run_gateway<B: SiteBackend>(
    site: SiteId,
    bus: Bus,
    backend: Arc<B>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let consumer = names::gateway_consumer(site.as_str());
    // Provisioning takes minutes; all of a site's hosts provision at once.
    let spec = ConsumerSpec::new(
        names::JOBS_STREAM,
        consumer.clone(),
        vec![names::site_jobs(site.as_str())],
        RejectAs::Message { consumer },
    )
    .concurrency(256);
    let gateway = Arc::new(Gateway::new(site.clone(), bus.clone(), backend.clone()));
    info!(%site, "gateway running");
    let rpc = tokio::spawn(serve_kubeconfig(site, bus.clone(), backend, shutdown.clone()));
    runtime::consume(bus, spec, gateway, shutdown).await?;
    rpc.await??;
    Ok(())
}
