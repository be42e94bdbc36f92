//! Patching one node of the simulated site to a package version: an os-image reimages it, a
//! binary is replaced on it, a container is applied to its cluster. Each looks first whether the
//! node runs the version already (then it does nothing) and finds an injected failure where a
//! real one would show: an os-image's checksum before the disks are wiped, a container at the
//! API server's admission, a binary once its service fails to come back.

use bus_schema::domain::{Package, PackageRef};
use bus_schema::pb::PackageKind;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::SimSite;
use super::bpa::container;
use super::faults::{binary_patch_failed, container_patch_denied, reimage_refused, unhealthy_at};
use super::state::{Binary, BinarySet, Image, State, binary_set};
use super::timing::pause;
use crate::backend::{BackendError, HostRequest, PatchOutcome, PatchRequest};

impl SimSite {
    /// Brings the node to the request's package version, counting what changed it and what failed.
    pub(super) async fn patch(&self, req: &PatchRequest) -> Result<PatchOutcome, BackendError> {
        let node = req.node.name.as_str();
        // A reimage under way to this image (the job came again after its gateway died) is
        // joined, not refused for a host that is not provisioned.
        let image = Image::of(&HostRequest::new(req.node.clone(), &req.package));
        let rejoin = req.package.kind == PackageKind::OsImage && self.inner.lock().reimaging_to(node, &image);
        if !rejoin {
            self.inner.lock().provisioned(node)?;
        }
        let result = match req.package.kind {
            PackageKind::OsImage => self.patch_os(req).await,
            PackageKind::Binary => self.patch_binary(node, &req.package).await,
            PackageKind::Container | PackageKind::HelmChart => self.patch_container(node, &req.package).await,
            PackageKind::Unspecified => {
                Err(BackendError::permanent_reason(format!("{} has no kind", req.package.reference().key())))
            }
        };
        let mut st = self.inner.lock();
        match &result {
            // A binary's and an os-image's patch are counted with the change itself (see
            // `patch_binary`).
            Ok(outcome) if outcome.changed && req.package.is_manifests() => {
                st.count(|e| &mut e.patches, node);
                debug!(site = %self.inner.site, node, package = %req.package.reference().key(), "patched");
            }
            Ok(_) | Err(BackendError::Transient { .. }) => {}
            Err(error) => {
                st.count(|e| &mut e.patch_failures, node);
                warn!(site = %self.inner.site, node, package = %req.package.reference().key(), error = %error.reason(), "patch failed");
            }
        }
        result
    }

    /// Reimages the host (deprovisioning → provisioning → provisioned, as any provisioning with
    /// another image), then installs its role's binaries again: the reimage wiped them.
    async fn patch_os(&self, req: &PatchRequest) -> Result<PatchOutcome, BackendError> {
        let node = req.node.name.as_str();
        let host = HostRequest::new(req.node.clone(), &req.package);
        let image = Image::of(&host);
        let reinstall = binary_set(&req.reinstall);
        let from_version = {
            let st = self.inner.lock();
            if st.reimaging_to(node, &image) {
                // Taken up again (the job came again after its gateway died): what the node ran
                // before went with the first attempt.
                None
            } else {
                let h = st.provisioned(node)?;
                let from_version = h.image.as_ref().map(|i| from_version(&i.package, &req.package));
                let reimage = h.image.as_ref() != Some(&image);
                // A reimage that ended before its reinstall (the call was dropped) is finished here.
                if !reimage && (reinstall.is_empty() || h.binaries.is_some()) {
                    return Ok(PatchOutcome { from_version, changed: false });
                }
                if reimage && st.faults.patch.contains(node) {
                    return Err(reimage_refused(node, &req.package));
                }
                from_version
            }
        };
        // Provisions the host with the image: joins the attempt under way, starts one, or finds
        // it done. Each state the host passes through goes to whoever relays it (the gateway,
        // as `NodeOsProvisioning`); nobody, when no one asked.
        let progress = req.progress.clone().unwrap_or_else(|| mpsc::unbounded_channel().0);
        self.provision(&host, progress).await?;
        if !reinstall.is_empty() {
            // One node's install takes as long as the whole cluster's: nodes install in parallel.
            pause(self.inner.config.install_binaries).await;
        }
        // Counted in the same write as the patch's last change (see `patch_binary`).
        let mut st = self.inner.lock();
        if !reinstall.is_empty()
            && let Some(reason) = st.install_on(&self.inner.site, node, &reinstall)
        {
            return Err(BackendError::permanent_reason(format!(
                "{node} reimaged, but its binaries were not: {reason}"
            )));
        }
        st.count(|e| &mut e.patches, node);
        Ok(PatchOutcome { from_version, changed: true })
    }

    /// Replaces one binary on the node, in [`SimConfig::patch_binary`](super::SimConfig::patch_binary).
    async fn patch_binary(&self, node: &str, package: &Package) -> Result<PatchOutcome, BackendError> {
        let name = package.name.as_str();
        let wanted = Binary::of(package);
        let running = |st: &State| st.provisioned(node).map(|h| h.binaries.as_ref().and_then(|b| b.get(name)).cloned());
        let from_version = match running(&self.inner.lock())? {
            Some(b) if b == wanted => return Ok(PatchOutcome { from_version: Some(b.version), changed: false }),
            other => other.map(|b| b.version),
        };
        pause(self.inner.config.patch_binary()).await;
        let mut st = self.inner.lock();
        if running(&st)?.is_some_and(|b| b == wanted) {
            // An identical patch running at the same time did it.
            return Ok(PatchOutcome { from_version: Some(wanted.version), changed: false });
        }
        if st.faults.patch.contains(node) {
            return Err(binary_patch_failed(node, package, from_version.as_deref()));
        }
        if let Some(h) = st.hosts.get_mut(node) {
            h.binaries.get_or_insert_with(BinarySet::new).insert(name.to_string(), wanted);
        }
        // Counted in the same write as the change: a gateway killed between two writes would
        // leave the node patched and the patch uncounted (its redelivery finds nothing to do).
        st.count(|e| &mut e.patches, node);
        debug!(site = %self.inner.site, node, package = %package.reference().key(), "patched");
        Ok(PatchOutcome { from_version, changed: true })
    }

    /// Applies the package to the node's cluster, as
    /// [`SiteBackend::apply_container_packages`](crate::SiteBackend::apply_container_packages)
    /// does: the first node of a site to patch a container changes the cluster, the others find
    /// it done.
    async fn patch_container(&self, node: &str, package: &Package) -> Result<PatchOutcome, BackendError> {
        let from_version = {
            let st = self.inner.lock();
            let from_version = st.containers.get(package.name.as_str()).cloned();
            if st.containers_applied(&[container(package)])? {
                drop(st);
                self.workloads_available(node, package)?;
                return Ok(PatchOutcome { from_version, changed: false });
            }
            if st.faults.patch.contains(node) {
                return Err(container_patch_denied(node, package, from_version.as_deref()));
            }
            from_version
        };
        let changed = self.apply_containers(std::slice::from_ref(package)).await?;
        self.workloads_available(node, package)?;
        Ok(PatchOutcome { from_version, changed })
    }

    /// Whether the package's workloads come up at its version: not at a bad one.
    fn workloads_available(&self, node: &str, package: &Package) -> Result<(), BackendError> {
        match self.inner.lock().faults.bad_versions.contains(&package.reference().key()) {
            true => Err(unhealthy_at(node, package)),
            false => Ok(()),
        }
    }
}

/// What a node ran before `wanted`: the version, or `name@version` when it was another package
/// (a host moving from `ubuntu-22.04` to `ubuntu-24.04`).
fn from_version(running: &PackageRef, wanted: &Package) -> String {
    if running.name == wanted.name { running.version.to_string() } else { running.key() }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bus_schema::pb::PackageKind;

    use super::*;
    use crate::SiteBackend;
    use crate::backend::ProvisioningState as S;
    use crate::sim::SimConfig;
    use crate::sim::testing::{installed_site, outcome, package, patch, per_node, provisioned_site, versioned};

    #[tokio::test(start_paused = true)]
    async fn a_binary_patch_replaces_one_binary_once_and_says_what_it_replaced() {
        let (site, req) = installed_site().await;
        let kubelet = versioned("kubelet", "1.29.2", PackageKind::Binary, 'e');
        let before = (tokio::time::Instant::now(), site.effects());
        assert_eq!(site.patch_node(&patch(&req, 0, kubelet.clone())).await.unwrap(), outcome("1.29.1", true));
        assert_eq!(before.0.elapsed(), SimConfig::fast().patch_binary());

        let again = tokio::time::Instant::now();
        assert_eq!(site.patch_node(&patch(&req, 0, kubelet.clone())).await.unwrap(), outcome("1.29.2", false));
        assert_eq!(again.elapsed(), Duration::ZERO);
        let effects = site.effects();
        assert_eq!(effects.patches, per_node(&[("m-1", 1)]));
        assert_eq!((effects.binary_installs, effects.provisions), (before.1.binary_installs, before.1.provisions));

        let Err(e @ BackendError::Permanent { .. }) = site.patch_node(&patch(&req, 2, kubelet)).await else {
            panic!("w-2 has no OS");
        };
        let reason = e.reason();
        assert!(reason.contains("w-2 is not provisioned"), "{reason}");
        assert!(site.effects().patch_failures.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn an_os_image_patch_reimages_the_host_and_reinstalls_its_binaries() {
        let (site, req) = installed_site().await;
        let ubuntu = versioned("ubuntu", "24.04", PackageKind::OsImage, 'f');
        let state = |site: &SimSite| site.hosts()[0].1;
        let (progress, mut states) = tokio::sync::mpsc::unbounded_channel();
        let task = tokio::spawn({
            let mut req = patch(&req, 0, ubuntu.clone());
            req.progress = Some(progress);
            let site = site.clone();
            async move { site.patch_node(&req).await }
        });
        let c = SimConfig::fast();
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(state(&site), S::Deprovisioning);
        tokio::time::sleep(c.deprovisioning).await;
        assert_eq!(state(&site), S::Provisioning);
        tokio::time::sleep(c.provisioning).await;
        assert_eq!(state(&site), S::Provisioned);
        assert_eq!(task.await.unwrap().unwrap(), outcome("1.29.1", true));
        // Every state it passed, to whoever relays them: from where it stood to provisioned.
        let mut passed = Vec::new();
        while let Some(s) = states.recv().await {
            passed.push(s);
        }
        assert_eq!(passed, [S::Provisioned, S::Deprovisioning, S::Provisioning, S::Provisioned]);

        assert_eq!(site.patch_node(&patch(&req, 0, ubuntu)).await.unwrap(), outcome("24.04", false));
        // The reimage wiped kubelet 1.29.1, and the reinstall put it back.
        let kubelet = package("kubelet", 'c', 10);
        assert_eq!(site.patch_node(&patch(&req, 0, kubelet)).await.unwrap(), outcome("1.29.1", false));
        let effects = site.effects();
        assert_eq!(effects.provisions, per_node(&[("m-1", 2), ("w-1", 1)]));
        assert_eq!(effects.binary_installs, per_node(&[("m-1", 2), ("w-1", 1)]));
        assert_eq!(effects.patches, per_node(&[("m-1", 1)]));
        site.kubeconfig().await.expect("m-1 is still the cluster's master");
    }

    #[tokio::test(start_paused = true)]
    async fn an_injected_patch_failure_keeps_the_old_version_until_healed() {
        let (site, req) = installed_site().await;
        let kubelet = versioned("kubelet", "1.29.2", PackageKind::Binary, 'e');
        site.fail_patch("w-1");
        let Err(e @ BackendError::Permanent { .. }) = site.patch_node(&patch(&req, 1, kubelet.clone())).await else {
            panic!("the patch of w-1 should fail");
        };
        let reason = e.reason();
        assert!(reason.contains("kubelet") && reason.contains("w-1") && reason.contains("rolled back to 1.29.1"));
        let current = package("kubelet", 'c', 10);
        assert_eq!(site.patch_node(&patch(&req, 1, current)).await.unwrap(), outcome("1.29.1", false));

        site.fail_patch("m-1");
        let ubuntu = versioned("ubuntu", "24.04", PackageKind::OsImage, 'f');
        let Err(e @ BackendError::Permanent { .. }) = site.patch_node(&patch(&req, 0, ubuntu)).await else {
            panic!("the reimage of m-1 should be refused");
        };
        let reason = e.reason();
        assert!(reason.contains("checksum") && reason.contains("m-1"), "{reason}");
        assert_eq!(site.hosts()[0], ("m-1".to_string(), S::Provisioned));

        site.heal("w-1");
        assert_eq!(site.patch_node(&patch(&req, 1, kubelet)).await.unwrap(), outcome("1.29.1", true));
        let effects = site.effects();
        assert_eq!(effects.patch_failures, per_node(&[("m-1", 1), ("w-1", 1)]));
        assert_eq!(effects.patches, per_node(&[("w-1", 1)]));
        assert_eq!(effects.provisions, per_node(&[("m-1", 1), ("w-1", 1)]));
    }

    #[tokio::test(start_paused = true)]
    async fn a_container_patch_changes_the_cluster_once_for_all_its_nodes() {
        let (site, req) = provisioned_site().await;
        let cni = versioned("cni", "1.4.0", PackageKind::Container, 'd');
        let early = site.patch_node(&patch(&req, 0, cni.clone())).await;
        assert!(matches!(early, Err(BackendError::Transient { .. })), "{early:?}");
        site.install_binaries(&req).await.unwrap();
        let first = site.patch_node(&patch(&req, 0, cni.clone())).await.unwrap();
        assert_eq!(first, PatchOutcome { from_version: None, changed: true });
        assert_eq!(site.patch_node(&patch(&req, 1, cni)).await.unwrap(), outcome("1.4.0", false));
        let effects = site.effects();
        assert_eq!((effects.container_applies, effects.patches), (1, per_node(&[("m-1", 1)])));
        assert!(effects.patch_failures.is_empty());
    }

    #[test]
    fn a_node_ran_a_version_of_the_same_package_or_another_package() {
        let running = versioned("ubuntu", "22.04", PackageKind::OsImage, 'a').reference();
        assert_eq!(from_version(&running, &versioned("ubuntu", "24.04", PackageKind::OsImage, 'b')), "22.04");
        assert_eq!(from_version(&running, &versioned("rocky", "9.4", PackageKind::OsImage, 'c')), "ubuntu@22.04");
    }
}
