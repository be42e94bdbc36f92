//! What the simulated site did, counted ([`SimEffects`]), so tests can prove that no step ran
//! twice.

use std::collections::BTreeMap;

/// What the site actually did, so tests can prove that no step ran twice. The per-node
/// counters are counted with [`State::count`](super::state::State::count), which the site's
/// file follows.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SimEffects {
    /// Per host, the provisionings started (a retry after a failure is a new one).
    pub provisions: BTreeMap<String, u32>,
    /// Per node, the binaries installs started (an injected failure counts, "os not provisioned" does not).
    pub binary_installs: BTreeMap<String, u32>,
    /// Kubeconfigs generated: at most one per site.
    pub kubeconfigs_generated: u32,
    /// Container package sets applied that changed the cluster.
    pub container_applies: u32,
    /// Bytes the gateway's cache handed to the site's provisioning (each artifact once).
    pub bytes_handed: u64,
    /// Per node, the patches that changed it (a patch to the version it runs already does not count).
    pub patches: BTreeMap<String, u32>,
    /// Per node, the patches that failed (it kept its old version).
    pub patch_failures: BTreeMap<String, u32>,
    /// Provisionings asked for with the host's BMC credentials (the BMC logged into).
    pub bmc_logins: u32,
}

impl SimEffects {
    /// Every node some per-node counter names.
    pub(super) fn nodes(&self) -> impl Iterator<Item = &String> {
        let counters = [&self.provisions, &self.binary_installs, &self.patches, &self.patch_failures];
        counters.into_iter().flat_map(BTreeMap::keys)
    }
}
