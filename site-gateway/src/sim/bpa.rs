//! The simulated BPA: artifacts handed to its upload API, the cluster binaries installed per
//! node (the first master's install forms the cluster), and container packages applied to the
//! application cluster.

use std::collections::BTreeMap;

use bus_schema::domain::{Package, Role};
use tracing::{debug, warn};

use super::SimSite;
use super::faults::binaries_failure;
use super::state::{BinarySet, State, binary_set, no_cluster};
use super::timing::pause;
use crate::backend::{BackendError, ClusterRequest, NodeInstall, ProvisioningState as S};
use crate::cache::CachedArtifact;

impl State {
    fn needs_install(&self, node: &str, wanted: &BinarySet) -> bool {
        self.hosts.get(node).is_some_and(|h| h.state() == S::Provisioned && h.binaries.as_ref() != Some(wanted))
    }

    /// Installs the binaries on one node; `Some(reason)` when it failed.
    pub(super) fn install_on(&mut self, site: &str, node: &str, wanted: &BinarySet) -> Option<String> {
        match self.hosts.get(node).filter(|h| h.state() == S::Provisioned) {
            None => return Some("os not provisioned".into()),
            Some(h) if h.binaries.as_ref() == Some(wanted) => return None,
            Some(_) => self.count(|e| &mut e.binary_installs, node),
        }
        let failed = self.faults.binaries.contains(node);
        let Some(h) = self.hosts.get_mut(node) else { return Some("os not provisioned".into()) };
        if failed {
            h.binaries = None;
            let reason = binaries_failure(node);
            warn!(site, node, %reason, "binaries install failed");
            return Some(reason);
        }
        h.binaries = Some(wanted.clone());
        debug!(site, node, binaries = wanted.len(), "binaries installed");
        None
    }

    /// Whether every package is applied already; `Transient` while there is no cluster.
    pub(super) fn containers_applied(&self, wanted: &[(String, String)]) -> Result<bool, BackendError> {
        if self.cluster_master.is_none() {
            return Err(no_cluster());
        }
        Ok(wanted.iter().all(|(name, version)| self.containers.get(name) == Some(version)))
    }
}

/// A container package as the cluster records it: name and version.
pub(super) fn container(p: &Package) -> (String, String) {
    (p.name.to_string(), p.version.to_string())
}

impl SimSite {
    /// Hands the artifacts the site lacks to its provisioning, each once.
    pub(super) async fn stage(&self, artifacts: &[CachedArtifact]) -> Result<(), BackendError> {
        let distinct: BTreeMap<&str, &CachedArtifact> =
            artifacts.iter().map(|a| (a.package.sha256.as_str(), a)).collect();
        for a in distinct.values() {
            if let Some(path) = &a.path
                && !path.exists()
            {
                return Err(BackendError::transient_reason(format!(
                    "{} is gone from the artifact cache",
                    path.display()
                )));
            }
        }
        let missing = {
            let st = self.inner.lock();
            distinct.keys().filter(|sha| !st.cache.contains(**sha)).count()
        };
        pause(self.inner.config.staging(missing)).await;
        let mut st = self.inner.lock();
        let mut handed = 0;
        for (sha, a) in distinct {
            if st.cache.insert(sha.to_string()) {
                handed += a.package.size;
            }
        }
        st.effects.bytes_handed += handed;
        debug!(site = %self.inner.site, artifacts = artifacts.len(), bytes = handed, "artifacts handed to provisioning");
        Ok(())
    }

    /// Installs the binaries on the request's nodes, all at once; the first master installed
    /// forms the cluster.
    pub(super) async fn install(&self, req: &ClusterRequest) -> Result<Vec<NodeInstall>, BackendError> {
        let wanted = binary_set(&req.binaries);
        let busy = {
            let st = self.inner.lock();
            if req.join_existing && st.cluster_master.is_none() {
                return Err(no_cluster());
            }
            req.nodes.iter().any(|n| st.needs_install(n.name.as_str(), &wanted))
        };
        if busy {
            pause(self.inner.config.install_binaries).await;
        }
        let mut st = self.inner.lock();
        let installs: Vec<NodeInstall> = req
            .nodes
            .iter()
            .map(|n| NodeInstall {
                node: n.name.to_string(),
                role: n.role,
                failure: st.install_on(&self.inner.site, n.name.as_str(), &wanted),
            })
            .collect();
        if let Some(master) = installs.iter().find(|i| i.role == Role::Master && i.failure.is_none()) {
            st.cluster_master.get_or_insert_with(|| master.node.clone());
        }
        Ok(installs)
    }

    /// Applies what the cluster lacks of `packages`; whether that changed it.
    pub(super) async fn apply_containers(&self, packages: &[Package]) -> Result<bool, BackendError> {
        let wanted: Vec<(String, String)> = packages.iter().map(container).collect();
        let applied = self.inner.lock().containers_applied(&wanted)?;
        if applied {
            return Ok(false);
        }
        pause(self.inner.config.apply_containers).await;
        let mut st = self.inner.lock();
        if st.containers_applied(&wanted)? {
            return Ok(false);
        }
        st.containers.extend(wanted);
        st.effects.container_applies += 1;
        debug!(site = %self.inner.site, packages = packages.len(), "container packages applied");
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use bus_schema::domain::NodeDesign;

    use super::*;
    use crate::SiteBackend;
    use crate::sim::testing::{package, per_node, provisioned_site};
    use crate::sim::{SimConfig, SimSite};

    #[tokio::test(start_paused = true)]
    async fn binaries_install_per_node_with_failures_and_no_second_effect() {
        let (site, req) = provisioned_site().await;
        site.fail_binaries("w-1");
        let installs = site.install_binaries(&req).await.unwrap();
        let failures: Vec<_> = installs.iter().map(|i| (i.node.as_str(), i.failure.as_deref())).collect();
        assert_eq!(failures[0], ("m-1", None));
        assert!(failures[1].1.is_some_and(|f| f.contains("w-1")), "{failures:?}");
        assert_eq!(failures[2], ("w-2", Some("os not provisioned")));
        site.heal("w-1");
        let installs = site.install_binaries(&req).await.unwrap();
        assert!(installs[..2].iter().all(|i| i.failure.is_none()), "{installs:?}");
        let counts = site.effects().binary_installs;
        assert_eq!(counts, BTreeMap::from([("m-1".to_string(), 1), ("w-1".to_string(), 2)]));
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_joins_only_an_existing_cluster() {
        let (site, req) = provisioned_site().await;
        let join = |nodes: &[NodeDesign]| ClusterRequest { nodes: nodes.to_vec(), join_existing: true, ..req.clone() };
        let early = site.install_binaries(&join(&req.nodes[1..2])).await;
        assert!(
            matches!(&early, Err(e @ BackendError::Transient { .. }) if e.reason() == "no application cluster yet"),
            "{early:?}"
        );
        site.install_binaries(&ClusterRequest { nodes: req.nodes[..1].to_vec(), ..req.clone() }).await.unwrap();
        let joined = site.install_binaries(&join(&req.nodes[1..2])).await.unwrap();
        assert_eq!(joined, [NodeInstall { node: "w-1".into(), role: Role::Worker, failure: None }]);
        assert_eq!(site.effects().binary_installs, per_node(&[("m-1", 1), ("w-1", 1)]));
    }

    #[tokio::test(start_paused = true)]
    async fn artifacts_are_handed_over_once() {
        let site = SimSite::new("edge-01", &[], SimConfig::fast());
        let artifacts = [package("kubelet", '1', 100), package("kubeadm", '2', 50), package("kubelet", '1', 100)]
            .map(|package| CachedArtifact { package, path: None });
        site.stage_artifacts(&artifacts).await.unwrap();
        site.stage_artifacts(&artifacts).await.unwrap();
        assert_eq!(site.effects().bytes_handed, 150);
        let gone = CachedArtifact { package: package("kubelet", '3', 1), path: Some("/nonexistent/x".into()) };
        assert!(matches!(site.stage_artifacts(&[gone]).await, Err(BackendError::Transient { .. })));
    }
}
