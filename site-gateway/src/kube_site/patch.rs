//! Patching one node of a real site to a package version (of a site Cluster API built, its
//! Kubernetes version and os-image go through Cluster API: `capi_patch.rs`): an os-image reimages it through Metal3
//! (deprovisioned, then provisioned again, its binaries reinstalled), a binary is installed on
//! that node alone (`upgrade.rs`; the BPA's per-role `Software` follows once the whole role runs
//! it), a container is applied to the application cluster. A node that runs the
//! version already (its `landfall.io/pkg.<name>` annotation says so) is left alone.

use bus_schema::pb;
use tokio::sync::mpsc;

use super::KubeSite;
use super::cluster::versions;
use crate::backend::{BackendError, HostRequest, PatchOutcome, PatchRequest, ProvisioningState};

impl KubeSite {
    /// Brings the node to the request's package version and says what it ran before.
    pub(super) async fn patch(&self, req: &PatchRequest) -> Result<PatchOutcome, BackendError> {
        let name = req.node.name.as_str();
        let Some(host) = self.host(name).await? else {
            return Err(BackendError::permanent_reason(format!("node {name} has no BareMetalHost")));
        };
        let package = &req.package;
        if package.kind == pb::PackageKind::HelmChart {
            return self.patch_chart(name, package, Self::version_on(&host, package.name.as_str())).await;
        }
        if self.patched_by_cluster_api(&host, package).await? {
            return self.patch_capi(req, &host).await;
        }
        // A reimage to this image its gateway started and did not see to the end (the job came
        // again after the gateway died): the host is provisioning the new image already.
        let wanted = self.image_url(&crate::backend::ImageSpec::from_package(package).checksum);
        let on = host.spec.image.as_ref().map(|i| i.url.as_str()).filter(|u| !u.is_empty());
        // Either the new image is going on, or the old one is coming off (or came off).
        let rejoin = package.kind == pb::PackageKind::OsImage
            && host.state() != Some(ProvisioningState::Provisioned)
            && match on {
                Some(url) => url == wanted,
                None => matches!(host.state(), Some(ProvisioningState::Deprovisioning | ProvisioningState::Available)),
            };
        if host.state() != Some(ProvisioningState::Provisioned) && !rejoin {
            let state = host.state().map_or("unknown".to_string(), |s| s.to_string());
            return Err(BackendError::permanent_reason(format!("node {name} is not provisioned (state {state})")));
        }
        let from = Self::version_on(&host, package.name.as_str());
        if from.as_deref() == Some(package.version.as_str()) {
            return Ok(PatchOutcome { from_version: from, changed: false });
        }
        match package.kind {
            pb::PackageKind::OsImage => {
                // Metal3 reimages only through deprovisioning: the image comes off, then the new one
                // goes on (already, when the reimage is taken up again).
                let tx = req.progress.clone().unwrap_or_else(|| mpsc::unbounded_channel().0);
                if on != Some(wanted.as_str()) {
                    self.deprovision(name, req.node.cleaning, &tx).await?;
                }
                self.provision(&HostRequest::new(req.node.clone(), package), &tx).await?;
                if !req.reinstall.is_empty() {
                    self.set_software(&[req.node.role], &req.reinstall).await?;
                    self.record_versions(name, versions(&req.reinstall)).await?;
                }
            }
            pb::PackageKind::Binary => {
                // On this node alone; the role's Software follows once all of it runs the version.
                self.upgrade_node(name, package).await?;
                self.record_versions(name, versions(std::slice::from_ref(package))).await?;
                self.software_follows_role(req.node.role, package).await?;
            }
            _ => {
                let applier = self.applier(self.application_cluster().await?);
                self.apply_container(&applier, package).await?;
                self.record_versions(name, versions(std::slice::from_ref(package))).await?;
            }
        }
        Ok(PatchOutcome { from_version: from, changed: true })
    }
}
