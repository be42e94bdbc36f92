//! The simulated cluster's side of a patch that takes a node down: a cordon remembered per
//! node, a drain that evicts the node's share of the applied container packages (one pod of each
//! per node), and readiness as the hosts show it.

use bus_schema::domain::Package;
use bus_schema::pb::PackageKind;

use super::SimSite;
use super::faults::drain_blocked;
use crate::backend::{BackendError, Cordon};

impl SimSite {
    /// Whether the node runs the package's version already.
    pub(super) fn runs_version(&self, node: &str, package: &Package) -> bool {
        let st = self.inner.lock();
        let Some(host) = st.hosts.get(node) else { return false };
        let (name, version) = (package.name.as_str(), package.version.as_str());
        match package.kind {
            PackageKind::OsImage => host
                .image
                .as_ref()
                .is_some_and(|i| i.package.name.as_str() == name && i.package.version.as_str() == version),
            PackageKind::Binary => {
                host.binaries.as_ref().and_then(|b| b.get(name)).is_some_and(|b| b.version == version)
            }
            PackageKind::Container | PackageKind::HelmChart => st.containers.get(name).is_some_and(|v| v == version),
            PackageKind::Unspecified => false,
        }
    }

    /// A node is in the cluster once its binaries are installed.
    pub(super) fn cordon_node(&self, node: &str) -> Cordon {
        let mut st = self.inner.lock();
        if st.hosts.get(node).is_none_or(|h| h.binaries.is_none()) {
            return Cordon::NotInCluster;
        }
        st.cordoned.insert(node.to_string());
        Cordon::Done
    }

    /// Evicts one pod of each applied container package from the node; none from a node drained
    /// already since its cordon (its pods are gone until it is given back).
    pub(super) async fn drain_node(&self, node: &str) -> Result<Vec<String>, BackendError> {
        let pods: Vec<String> = {
            let mut st = self.inner.lock();
            if !st.cordoned.contains(node) {
                return Err(BackendError::permanent_reason(format!("draining {node}: it is not cordoned")));
            }
            if st.drained.contains(node) {
                return Ok(Vec::new());
            }
            let pods: Vec<String> = st.containers.keys().map(|name| format!("{name}/{name}-{node}")).collect();
            if st.faults.drain.contains(node) {
                let held = pods.first().cloned().unwrap_or_else(|| format!("default/db-{node}"));
                return Err(drain_blocked(node, &held));
            }
            st.drained.insert(node.to_string());
            pods
        };
        Ok(pods)
    }

    /// Those of `nodes` not provisioned with their binaries.
    pub(super) fn not_ready_nodes(&self, nodes: &[String]) -> Vec<String> {
        let st = self.inner.lock();
        nodes.iter().filter(|n| !st.provisioned(n).is_ok_and(|h| h.binaries.is_some())).cloned().collect()
    }
}
