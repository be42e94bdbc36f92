//! Taking things away at a site: a node removed or wiped for its reprovision (`RetireNode`), and
//! the whole site torn down (`TearDownSite`). Each step is idempotent, so a job that comes again
//! after its gateway died finds what the first attempt left and goes on from there.

use bus_schema::domain::Role;
use bus_schema::pb::{self, BusJob};
use bus_schema::runtime::{Delivery, HandlerError};
use futures::StreamExt;
use tracing::{info, warn};

use super::Gateway;
use crate::backend::{BackendError, Cordon, SiteBackend};

/// Hosts of a site deprovisioned at once by its tear-down.
const TEAR_DOWN_WIDTH: usize = 16;

impl<B: SiteBackend> Gateway<B> {
    pub(super) async fn retire(&self, d: &Delivery) -> Result<(), HandlerError> {
        let job: pb::RetireNode = d.decode()?;
        self.check_site(&job)?;
        let node = job.node.as_str();
        let kind = pb::RetireNode::KIND;
        let failed = |what: &str, e: BackendError| match e {
            e @ BackendError::Transient { .. } => Err(HandlerError::transient(format!("{what} {node}"), e)),
            e => Ok(format!("{what} {node}: {}", e.reason())),
        };
        // A master goes only while every other one is Ready: with one of them down as well, the
        // cluster's etcd would be left without a quorum.
        if job.role == pb::Role::from(Role::Master) as i32 {
            let others: Vec<String> = job.masters.iter().filter(|m| m.as_str() != node).cloned().collect();
            match self.backend.not_ready(&others).await {
                Ok(down) if !down.is_empty() => {
                    let reason = format!(
                        "{node} is a master and master {} is not Ready: taking {node} away now would leave etcd \
                         without a quorum",
                        down.join(", ")
                    );
                    return self.job_failed(d, kind, reason).await;
                }
                Ok(_) => {}
                Err(e) => {
                    return self.job_failed(d, kind, failed("asking which masters are Ready before taking", e)?).await;
                }
            }
        }
        let mut evicted = Vec::new();
        match self.backend.cordon(node).await {
            Ok(Cordon::NotInCluster) => {}
            Ok(held) => {
                if held == Cordon::Done {
                    let cordoned = |site_id, node| pb::NodeCordoned { site_id, node, ..Default::default() };
                    self.node_step(&d.envelope, "node_cordoned", node, cordoned).await?;
                }
                match self.backend.drain(node).await {
                    Ok(pods) => evicted = pods,
                    Err(e) => {
                        let reason = failed("draining", e)?;
                        // The node stays as it was: schedulable again, in the cluster.
                        self.lift_cordon(&d.envelope, "", node).await?;
                        return self.job_failed(d, kind, reason).await;
                    }
                }
                let evt = pb::NodeDrained {
                    site_id: self.site.to_string(),
                    node: node.to_string(),
                    evicted: evicted.clone(),
                    ..Default::default()
                };
                self.publish(&evt, &d.envelope.derive("node_drained", Some(node))).await?;
            }
            Err(e) => return self.job_failed(d, kind, failed("cordoning", e)?).await,
        }
        let node_deleted = match self.backend.delete_node(node).await {
            Ok(deleted) => deleted,
            Err(e) => return self.job_failed(d, kind, failed("deleting the Node of", e)?).await,
        };
        // A host Cluster API holds is freed through it first: its machine goes (and, for a node
        // leaving, its set shrinks); what is left to deprovision then is nothing.
        let released = self.with_states(d, node, "", |tx| self.backend.release_host(node, !job.keep_host, tx)).await?;
        if let Err(e) = released {
            return self.job_failed(d, kind, failed("releasing the machine of", e)?).await;
        }
        let cleaning = pb::CleaningMode::try_from(job.cleaning).unwrap_or_default();
        let host_deprovisioned = match self.deprovision(d, node, cleaning).await? {
            Ok(had) => had,
            Err(reason) => return self.job_failed(d, kind, reason).await,
        };
        let host_deleted = match job.keep_host {
            true => false,
            false => match self.backend.forget_host(node).await {
                Ok(deleted) => deleted,
                Err(e) => return self.job_failed(d, kind, failed("deleting the host of", e)?).await,
            },
        };
        info!(site = %self.site, node, node_deleted, host_deprovisioned, host_deleted, "node retired");
        let evt = pb::NodeRetired {
            site_id: self.site.to_string(),
            node: node.to_string(),
            evicted,
            node_deleted,
            host_deprovisioned,
            host_deleted,
        };
        self.publish(&evt, &d.envelope.derive("node_retired", Some(node))).await
    }

    /// Deprovisions the node's host, its disks cleaned as `cleaning` says, each state it passes
    /// an event: `Ok(Ok(had a host))`, or `Ok(Err(why not))`.
    async fn deprovision(
        &self,
        d: &Delivery,
        node: &str,
        cleaning: pb::CleaningMode,
    ) -> Result<Result<bool, String>, HandlerError> {
        match self.with_states(d, node, "", |tx| self.backend.deprovision_host(node, cleaning, tx)).await? {
            Ok(had) => Ok(Ok(had)),
            Err(e @ BackendError::Transient { .. }) => {
                Err(HandlerError::transient(format!("deprovisioning {node}"), e))
            }
            Err(e) => Ok(Err(format!("deprovisioning {node}: {}", e.reason()))),
        }
    }

    /// Deprovisions a host and deletes it: `Ok(Err(why not))` when that cannot be done.
    async fn take_host_away(&self, d: &Delivery, host: String) -> Result<Result<bool, String>, HandlerError> {
        // Each host as its own setting says: the one its last provisioning wrote from the design.
        if let Err(reason) = self.deprovision(d, &host, pb::CleaningMode::Unspecified).await? {
            return Ok(Err(reason));
        }
        Ok(self.backend.forget_host(&host).await.map_err(|e| format!("deleting host {host}: {}", e.reason())))
    }

    pub(super) async fn tear_down(&self, d: &Delivery) -> Result<(), HandlerError> {
        let job: pb::TearDownSite = d.decode()?;
        self.check_site(&job)?;
        let kind = pb::TearDownSite::KIND;
        // A cluster Cluster API built goes first, through it: its machines hold the hosts.
        let built = match self.backend.take_cluster_down().await {
            Ok(built) => built,
            Err(e) => return self.backend_failed(d, kind, e).await,
        };
        let hosts = match self.backend.host_names().await {
            Ok(hosts) => hosts,
            Err(e) => return self.backend_failed(d, kind, e).await,
        };
        // Every host at once (a few at a time): a site's hosts clean their disks in parallel.
        let results: Vec<Result<Result<bool, String>, HandlerError>> = futures::stream::iter(hosts.clone())
            .map(|host| self.take_host_away(d, host))
            .buffer_unordered(TEAR_DOWN_WIDTH)
            .collect()
            .await;
        let mut failures = Vec::new();
        for r in results {
            if let Err(reason) = r? {
                failures.push(reason);
            }
        }
        if !failures.is_empty() {
            warn!(site = %self.site, failures = failures.len(), "site tear-down left hosts behind");
            return self.job_failed(d, kind, failures.join("; ")).await;
        }
        let mut resources = match self.backend.tear_down_cluster().await {
            Ok(r) => r,
            Err(e) => return self.backend_failed(d, kind, e).await,
        };
        resources.extend(built);
        resources.sort();
        resources.dedup();
        info!(site = %self.site, hosts = hosts.len(), resources = resources.len(), "site torn down");
        let evt = pb::SiteTornDown { site_id: self.site.to_string(), hosts, resources };
        self.publish(&evt, &d.envelope.derive("site_torn_down", None)).await
    }
}
