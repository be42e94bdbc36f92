//! The gateway's backend for a real site: Metal3 `BareMetalHost`s and the ICN BPA's custom
//! resources through the site's Kubernetes API (kube-rs), the BPA's REST upload API for
//! staged artifacts, and the site's application cluster for container packages.
//!
//! Every write is a server-side apply under one field manager ([`FIELD_MANAGER`]) of exactly
//! the fields the gateway owns ([`ownership`]), never forced: a field another manager set to
//! another value is a conflict the job reports, not a field the gateway takes over.
//!
//! This file holds [`KubeSite`] and its [`SiteBackend`] implementation, which hands each job to
//! the file that does it: `provision.rs` (hosts through Metal3), `cluster.rs` (binaries, the
//! kubeconfig and container packages through the BPA and the application cluster),
//! `patch.rs`, `hosts.rs` (the watch of arrivals and removals), `lifecycle.rs` (a node removed or
//! reprovisioned, a site decommissioned).

pub mod apply;
pub mod bpa;
pub mod bpa_upload;
pub mod capi;
mod capi_lifecycle;
mod capi_patch;
mod chart;
mod cluster;
mod config;
mod drain;
mod drift;
mod error;
mod host_setup;
mod hosts;
mod lifecycle;
pub mod marks;
pub mod metal3;
pub mod ownership;
mod patch;
mod provision;
#[cfg(test)]
mod testing;
mod upgrade;
pub mod workloads;

use std::path::PathBuf;

use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, DynamicObject};
use tokio::sync::mpsc;
use tracing::debug;

pub use config::{KubeSiteConfig, KubeconfigSource, UnmanagedPods, UserData};
pub use marks::FIELD_MANAGER;

use crate::backend::{
    BackendError, ClusterRequest, Cordon, HostNotice, HostRequest, NodeInstall, PatchOutcome, PatchRequest,
    ProvisioningState, SiteBackend,
};
use crate::cache::{ArtifactCache, CachedArtifact};
use bpa::ClusterIdentity;
use bpa_upload::BpaUploader;
use metal3::BareMetalHost;

/// A real site, driven through its Kubernetes API.
pub struct KubeSite {
    cfg: KubeSiteConfig,
    hosts: Api<BareMetalHost>,
    secrets: Api<Secret>,
    provisionings: Api<DynamicObject>,
    softwares: Api<DynamicObject>,
    cache: ArtifactCache,
    uploader: Option<BpaUploader>,
    /// What discovery last found the bootstrap cluster serving of Cluster API, when it served
    /// all of it, and when ([`capi::Served`]).
    served: std::sync::Mutex<Option<(std::time::Instant, capi::Served)>>,
}

impl KubeSite {
    /// `client` reaches the site's bootstrap cluster (Metal3 and the BPA); `cache` is the
    /// gateway's artifact cache, where container packages' manifests are read from.
    pub fn new(client: Client, cfg: KubeSiteConfig, cache: ArtifactCache) -> Result<Self, BackendError> {
        let ns = cfg.namespace.as_str();
        let uploader = match &cfg.bpa_url {
            Some(url) => Some(BpaUploader::new(url, &cfg.owner, &cfg.cluster)?),
            None => None,
        };
        Ok(Self {
            hosts: Api::namespaced(client.clone(), ns),
            secrets: Api::namespaced(client.clone(), ns),
            provisionings: Api::namespaced_with(client.clone(), ns, &bpa::provisioning_resource()),
            softwares: Api::namespaced_with(client, ns, &bpa::software_resource()),
            cfg,
            cache,
            uploader,
            served: std::sync::Mutex::new(None),
        })
    }

    /// A client of the site's bootstrap cluster.
    pub(super) fn client(&self) -> Client {
        self.hosts.clone().into_client()
    }

    fn identity(&self) -> ClusterIdentity {
        ClusterIdentity { owner: self.cfg.owner.clone(), cluster: self.cfg.cluster.clone() }
    }

    /// Where hosts.ini is written.
    pub fn hosts_ini_path(&self) -> PathBuf {
        self.cfg.state_dir.join(&self.cfg.cluster).join("hosts.ini")
    }
}

impl SiteBackend for KubeSite {
    async fn stage_artifacts(&self, artifacts: &[CachedArtifact]) -> Result<(), BackendError> {
        let Some(uploader) = &self.uploader else { return Ok(()) };
        for a in artifacts {
            let Some(path) = &a.path else { continue };
            let outcome = uploader.upload(&a.package, path).await?;
            debug!(site = %self.cfg.site, package = %a.package.reference().key(), ?outcome, "handed to the BPA");
        }
        Ok(())
    }

    async fn provision_host(
        &self,
        req: &HostRequest,
        progress: mpsc::UnboundedSender<ProvisioningState>,
    ) -> Result<(), BackendError> {
        self.provision(req, &progress).await
    }

    async fn install_binaries(&self, req: &ClusterRequest) -> Result<Vec<NodeInstall>, BackendError> {
        self.install(req).await
    }

    async fn kubeconfig(&self) -> Result<Vec<u8>, BackendError> {
        self.cluster_kubeconfig().await
    }

    async fn apply_container_packages(&self, packages: &[bus_schema::domain::Package]) -> Result<(), BackendError> {
        self.apply_containers(packages).await
    }

    async fn cluster_facts(&self) -> Result<crate::backend::ClusterFacts, BackendError> {
        self.application_facts().await
    }

    async fn check_drift(&self) -> Result<Vec<bus_schema::pb::ChartDrifted>, BackendError> {
        self.charts_drift().await
    }

    fn drift_every(&self) -> Option<std::time::Duration> {
        self.cfg.drift_every
    }

    async fn patch_node(&self, req: &PatchRequest) -> Result<PatchOutcome, BackendError> {
        self.patch(req).await
    }

    async fn runs(&self, node: &str, package: &bus_schema::domain::Package) -> Result<bool, BackendError> {
        let Some(host) = self.host(node).await? else { return Ok(false) };
        if self.patched_by_cluster_api(&host, package).await? {
            return self.capi_runs(&host, package).await;
        }
        Ok(Self::version_on(&host, package.name.as_str()).as_deref() == Some(package.version.as_str()))
    }

    async fn cordon(&self, node: &str) -> Result<Cordon, BackendError> {
        self.cordon_node(node).await
    }

    async fn drain(&self, node: &str) -> Result<Vec<String>, BackendError> {
        self.drain_node(node).await
    }

    async fn cordoned(&self, node: &str) -> Result<bool, BackendError> {
        self.cordoned_by_landfall(node).await
    }

    async fn uncordon(&self, node: &str) -> Result<bool, BackendError> {
        self.uncordon_node(node).await
    }

    async fn not_ready(&self, nodes: &[String]) -> Result<Vec<String>, BackendError> {
        self.not_ready_nodes(nodes).await
    }

    async fn observe_patched(&self, node: &str, package: &bus_schema::domain::Package) -> Result<(), BackendError> {
        self.observe_node(node, std::slice::from_ref(package)).await
    }

    async fn host_state(&self, node: &str) -> Result<Option<ProvisioningState>, BackendError> {
        Ok(self.host(node).await?.map(|h| h.state().unwrap_or(ProvisioningState::Registering)))
    }

    async fn host_names(&self) -> Result<Vec<String>, BackendError> {
        self.managed_hosts().await
    }

    async fn delete_node(&self, node: &str) -> Result<bool, BackendError> {
        self.delete_cluster_node(node).await
    }

    async fn deprovision_host(
        &self,
        node: &str,
        cleaning: bus_schema::pb::CleaningMode,
        progress: mpsc::UnboundedSender<ProvisioningState>,
    ) -> Result<bool, BackendError> {
        self.take_os_off(node, cleaning, &progress).await
    }

    async fn release_host(
        &self,
        node: &str,
        leaving: bool,
        progress: mpsc::UnboundedSender<ProvisioningState>,
    ) -> Result<bool, BackendError> {
        self.release_from_capi(node, leaving, &progress).await
    }

    async fn take_cluster_down(&self) -> Result<Vec<String>, BackendError> {
        self.capi_take_down().await
    }

    async fn forget_host(&self, node: &str) -> Result<bool, BackendError> {
        self.forget(node).await
    }

    async fn tear_down_cluster(&self) -> Result<Vec<String>, BackendError> {
        self.tear_down().await
    }

    fn host_changes(&self) -> mpsc::UnboundedReceiver<HostNotice> {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(hosts::watch(self.cfg.site.clone(), self.hosts.clone(), tx));
        rx
    }
}
