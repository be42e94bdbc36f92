//! Failure injection: the nodes whose provisionings, binaries installs and patches are made to
//! fail ([`Faults`]), and the error each failure shows, worded as the real component's would be.

use std::collections::{BTreeMap, BTreeSet};

use bus_schema::domain::Package;

use crate::backend::{BackendError, ImageSpec};

/// The failures injected, by host or node name; none is kept in the site's state file.
#[derive(Debug, Default)]
pub(super) struct Faults {
    /// Every provisioning of the host fails once the image is written.
    pub(super) provisioning: BTreeSet<String>,
    /// Every binaries install on the node fails.
    pub(super) binaries: BTreeSet<String>,
    /// Every patch of the node fails, leaving it at its old version.
    pub(super) patch: BTreeSet<String>,
    /// A disruption budget allows none of the node's pods to go: every drain of it fails.
    pub(super) drain: BTreeSet<String>,
    /// Package versions (`name@version`) that install but never come up healthy, on any node of
    /// the site: a binary's or an image's node is never Ready at it, a container's workloads
    /// never become available. A bad release, not a bad node: healing a node keeps them.
    pub(super) bad_versions: BTreeSet<String>,
    /// The node's next watches for its new version are cut off, this many more times, as a
    /// watch whose connection to the API server drops is: a transient failure.
    pub(super) watch_lost: BTreeMap<String, u32>,
}

impl Faults {
    /// Removes every failure injected for `node`.
    pub(super) fn heal(&mut self, node: &str) {
        self.provisioning.remove(node);
        self.binaries.remove(node);
        self.patch.remove(node);
        self.drain.remove(node);
        self.watch_lost.remove(node);
    }
}

/// Why a node at a bad version (see [`Faults::bad_versions`]) fails its health check, worded as
/// the check that sees it.
pub(super) fn unhealthy_at(node: &str, package: &Package) -> BackendError {
    let key = package.reference().key();
    BackendError::permanent_reason(match package.kind {
        bus_schema::pb::PackageKind::Container | bus_schema::pb::PackageKind::HelmChart => format!(
            "{key} applied, but its workloads did not become available on {node}: deployment has minimum \
             availability false (pods in CrashLoopBackOff)"
        ),
        _ => format!("{node} did not become Ready at {key}: the kubelet reports NotReady (PLEG is not healthy)"),
    })
}

/// A drain a disruption budget holds up until its time-out, worded as the Eviction API's refusal.
pub(super) fn drain_blocked(node: &str, pod: &str) -> BackendError {
    BackendError::permanent_reason(format!(
        "draining {node}: not done within 15m: {pod}: Cannot evict pod as it would violate the pod's disruption \
         budget. The disruption budget {} needs 1 healthy pods and has 1 currently",
        pod.split('/').next().unwrap_or(pod)
    ))
}

/// Metal3's error for a host whose image could not be written.
pub(super) fn provisioning_error(host: &str, image: &ImageSpec) -> BackendError {
    BackendError::HostFailed {
        host: host.to_string(),
        error_type: "provisioning error".into(),
        message: format!(
            "Image provisioning failed: deploy step write_image failed on host {host}: image {} ({}:{}) could not be written",
            image.url, image.checksum_type, image.checksum
        ),
    }
}

/// Why the BPA's binaries install failed on `node`.
pub(super) fn binaries_failure(node: &str) -> String {
    format!("binaries install failed on {node}: install script exited with status 1")
}

/// The site's cache refusing an os-image before the disks are wiped.
pub(super) fn reimage_refused(node: &str, image: &Package) -> BackendError {
    BackendError::permanent_reason(format!(
        "reimage of {node} with {} refused: image checksum mismatch in the site cache \
         (expected sha256:{}); the host keeps its current image",
        image.reference().key(),
        image.sha256
    ))
}

/// A binary whose service did not come back after the swap; `running` is the version the node
/// ran before, which it is rolled back to.
pub(super) fn binary_patch_failed(node: &str, binary: &Package, running: Option<&str>) -> BackendError {
    let name = binary.name.as_str();
    let was = running.map_or("removed again".into(), |v| format!("rolled back to {v}"));
    BackendError::permanent_reason(format!(
        "patch of {name} to {} failed on {node}: {name}.service did not become active after the swap \
         (exit status 1); {was}",
        binary.version
    ))
}

/// The application cluster's API server refusing a container package at admission; `running`
/// is the version the cluster keeps.
pub(super) fn container_patch_denied(node: &str, container: &Package, running: Option<&str>) -> BackendError {
    BackendError::permanent_reason(format!(
        "apply of {} for {node} failed: admission webhook \"validate.{}\" denied the request; \
         the cluster keeps {}",
        container.reference().key(),
        container.name,
        running.unwrap_or("no version of it")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healing_a_node_removes_its_failures_only() {
        let mut faults = Faults::default();
        for node in ["w-1", "w-2"] {
            faults.provisioning.insert(node.into());
            faults.binaries.insert(node.into());
            faults.patch.insert(node.into());
        }
        faults.heal("w-1");
        let w2 = BTreeSet::from(["w-2".to_string()]);
        assert_eq!((faults.provisioning, faults.binaries, faults.patch), (w2.clone(), w2.clone(), w2));
    }
}
