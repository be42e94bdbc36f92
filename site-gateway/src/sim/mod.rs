//! A simulated site: Metal3's BareMetalHost state machine, Ironic and BPA, in memory.
//!
//! [`SimSite`] implements [`SiteBackend`] with the timings of a [`SimConfig`], failures
//! injected by node name, and [`SimEffects`] counters that let tests prove no step ran twice.
//! Each host remembers what it runs (its os-image, its binaries by name; container packages
//! are the cluster's), so a patch can say which version it replaced, and hosts can arrive
//! after the start ([`SimSite::arrive`]) as new BareMetalHosts do.
//! A site kept in a file ([`SimSite::with_state_file`]) outlives its process, as a real one
//! outlives its gateway.
//!
//! This file holds the site itself (its constructors, its lock, what it tells tests) and its
//! [`SiteBackend`] implementation, which hands each job to the part that does it:
//! `provision.rs` (hosts walking Metal3's states, decided in `metal3.rs`), `bpa.rs` (artifacts,
//! binaries, container packages), `patch.rs`, `kubeconfig.rs`, `arrivals.rs`, `lifecycle.rs`
//! (nodes and hosts taken away, the cluster torn down); `state.rs` is what
//! they share under the lock, `persist.rs` how it is kept in a file, `faults.rs` the failures
//! injected, `effects.rs` what was done, `timing.rs` how long it takes. `control.rs` lets a host
//! arrive by request over the bus.

mod arrivals;
mod bpa;
pub(crate) mod control;
mod drain;
mod effects;
mod faults;
mod kubeconfig;
mod lifecycle;
mod metal3;
mod patch;
mod persist;
mod provision;
#[cfg(test)]
mod restart_tests;
mod state;
#[cfg(test)]
mod testing;
mod timing;

use std::ops::{Deref, DerefMut};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use bus_schema::domain::{NodeDesign, Package, PackageRef, Role, SiteDesign};
use bus_schema::pb::PackageKind;
use tokio::sync::mpsc;

pub use effects::SimEffects;
pub use persist::{SimStateError, saved_effects};
pub use timing::SimConfig;

use crate::backend::{
    BackendError, ClusterRequest, Cordon, HostNotice, HostRequest, ImageSpec, NodeInstall, PatchOutcome, PatchRequest,
    ProvisioningState as S, SiteBackend,
};
use crate::cache::CachedArtifact;
use persist::StateFile;
use state::{Host, Image, State, binary_set};

/// A simulated site (Metal3 + Ironic + BPA). Cloning gives another handle on the same site.
#[derive(Debug, Clone)]
pub struct SimSite {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    site: String,
    config: SimConfig,
    state: Mutex<State>,
    /// Where the site is kept, when it outlives its process ([`SimSite::with_state_file`]).
    file: Option<StateFile>,
}

impl Inner {
    fn new(site: &str, config: SimConfig, file: Option<StateFile>) -> Self {
        Self { site: site.to_string(), config, state: Mutex::default(), file }
    }

    fn lock(&self) -> StateGuard<'_> {
        StateGuard { state: self.state.lock().expect("sim state lock"), inner: self, changed: false }
    }
}

/// The site's state under its lock; written to the site's file (when it has one) as the lock
/// is let go, so no change is seen by anyone before it is kept. Only a lock taken to change it
/// writes: a site of hundreds of hosts is read far more often than it changes.
struct StateGuard<'a> {
    state: MutexGuard<'a, State>,
    inner: &'a Inner,
    changed: bool,
}

impl Deref for StateGuard<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.state
    }
}

impl DerefMut for StateGuard<'_> {
    fn deref_mut(&mut self) -> &mut State {
        self.changed = true;
        &mut self.state
    }
}

impl Drop for StateGuard<'_> {
    fn drop(&mut self) {
        if !self.changed {
            return;
        }
        match &self.inner.file {
            Some(file) => file.save(&self.inner.site, &mut self.state),
            None => drop(self.state.hosts.take_touched()),
        }
    }
}

impl SimSite {
    /// A site whose hosts start registering at once and walk to `available` in the background.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn new(site_id: &str, nodes: &[NodeDesign], config: SimConfig) -> Self {
        let site = Self { inner: Arc::new(Inner::new(site_id, config, None)) };
        for node in nodes {
            site.add_host(node);
        }
        site
    }

    /// Like [`SimSite::new`], with the site kept in the file `path`: what it holds is taken up
    /// again (hosts, their images and binaries, the cluster, the effects counted so far), the
    /// design's nodes it lacks register as new hosts, and every change is written to it.
    ///
    /// # Errors
    /// When the file cannot be read, does not parse, or is another site's.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn with_state_file(
        site_id: &str,
        nodes: &[NodeDesign],
        config: SimConfig,
        path: &Path,
    ) -> Result<Self, SimStateError> {
        let saved = persist::load(path, site_id)?;
        let site = Self { inner: Arc::new(Inner::new(site_id, config, Some(StateFile::new(path)))) };
        if let Some(saved) = saved {
            let invalid = |reason| SimStateError::Invalid { path: path.to_path_buf(), reason };
            let (state, resume) = saved.restore().map_err(invalid)?;
            *site.inner.lock() = state;
            // Hosts that were on their way somewhere carry on.
            for (host, resume) in resume {
                site.resume(host, resume);
            }
        }
        // Under one lock: the file is written once, not once per host.
        let mut st = site.inner.lock();
        for node in nodes {
            site.ensure_host(&mut st, node.name.as_str());
        }
        drop(st);
        Ok(site)
    }

    /// A site that was installed already: every host of the design provisioned with its role's
    /// os-image and binaries, the cluster formed, the container packages applied. Packages the
    /// design names that `catalog` lacks are left out. For benchmarks and demos that start
    /// from a running fleet; no effect is counted.
    pub fn installed(design: &SiteDesign, catalog: &[Package], config: SimConfig) -> Self {
        let site = Self { inner: Arc::new(Inner::new(design.site.as_str(), config, None)) };
        let find = |r: &PackageRef| catalog.iter().find(|p| p.name == r.name && p.version == r.version);
        {
            let mut st = site.inner.lock();
            for node in &design.nodes {
                let set: Vec<&Package> = design.packages_for(node.role).iter().filter_map(find).collect();
                let mut host = Host::in_state(S::Provisioned);
                host.image = set
                    .iter()
                    .find(|p| p.kind == PackageKind::OsImage)
                    .map(|p| Image { spec: ImageSpec::from_package(p), package: p.reference() });
                let binaries: Vec<Package> =
                    set.iter().filter(|p| p.kind == PackageKind::Binary).map(|p| (*p).clone()).collect();
                host.binaries = Some(binary_set(&binaries));
                for p in set.iter().filter(|p| p.kind == PackageKind::Container) {
                    st.containers.insert(p.name.to_string(), p.version.to_string());
                }
                if node.role == Role::Master && st.cluster_master.is_none() {
                    st.cluster_master = Some(node.name.to_string());
                }
                st.hosts.insert(node.name.to_string(), host);
            }
        }
        site
    }

    /// The site's id.
    pub fn site_id(&self) -> &str {
        &self.inner.site
    }

    /// Every host and its provisioning state, by name.
    pub fn hosts(&self) -> Vec<(String, S)> {
        self.inner.lock().hosts.iter().map(|(name, h)| (name.clone(), h.state())).collect()
    }

    /// What the site has done so far.
    pub fn effects(&self) -> SimEffects {
        self.inner.lock().effects.clone()
    }

    /// Makes every provisioning of `host` fail, until [`SimSite::heal`].
    pub fn fail_provisioning(&self, host: &str) {
        self.inner.lock().faults.provisioning.insert(host.to_string());
    }

    /// Makes every binaries install on `node` fail, until [`SimSite::heal`].
    pub fn fail_binaries(&self, node: &str) {
        self.inner.lock().faults.binaries.insert(node.to_string());
    }

    /// Makes every patch of `node` fail, leaving it at its old version, until [`SimSite::heal`].
    /// Every drain of `node` fails: a disruption budget allows none of its pods to go.
    pub fn block_drain(&self, node: &str) {
        self.inner.lock().faults.drain.insert(node.to_string());
    }

    /// Cuts off the next `times` watches of `node` for its new version after a patch (a
    /// transient failure: the job is tried again).
    pub fn lose_watch(&self, node: &str, times: u32) {
        self.inner.lock().faults.watch_lost.insert(node.to_string(), times);
    }

    pub fn fail_patch(&self, node: &str) {
        self.inner.lock().faults.patch.insert(node.to_string());
    }

    /// Whether `node` runs `package` at its version now (an image, a binary, or a container of
    /// its cluster).
    pub fn runs(&self, node: &str, package: &Package) -> bool {
        self.runs_version(node, package)
    }

    /// Whether `node` is unschedulable now.
    pub fn is_cordoned(&self, node: &str) -> bool {
        self.inner.lock().cordoned.contains(node)
    }

    /// Makes `name@version` a bad release at this site: it installs, but no node is healthy at it
    /// (see [`SimSite::observe_patched`](crate::SiteBackend::observe_patched)).
    pub fn bad_version(&self, key: &str) {
        self.inner.lock().faults.bad_versions.insert(key.to_string());
    }

    /// Removes the failures injected for `node`.
    pub fn heal(&self, node: &str) {
        self.inner.lock().faults.heal(node);
    }
}

impl SiteBackend for SimSite {
    async fn stage_artifacts(&self, artifacts: &[CachedArtifact]) -> Result<(), BackendError> {
        self.stage(artifacts).await
    }

    async fn provision_host(&self, req: &HostRequest, progress: mpsc::UnboundedSender<S>) -> Result<(), BackendError> {
        self.provision(req, progress).await
    }

    async fn install_binaries(&self, req: &ClusterRequest) -> Result<Vec<NodeInstall>, BackendError> {
        self.install(req).await
    }

    async fn kubeconfig(&self) -> Result<Vec<u8>, BackendError> {
        self.cluster_kubeconfig().await
    }

    async fn apply_container_packages(&self, packages: &[Package]) -> Result<(), BackendError> {
        self.apply_containers(packages).await.map(|_| ())
    }

    async fn patch_node(&self, req: &PatchRequest) -> Result<PatchOutcome, BackendError> {
        self.patch(req).await
    }

    async fn runs(&self, node: &str, package: &Package) -> Result<bool, BackendError> {
        Ok(self.runs_version(node, package))
    }

    async fn cordon(&self, node: &str) -> Result<Cordon, BackendError> {
        Ok(self.cordon_node(node))
    }

    async fn drain(&self, node: &str) -> Result<Vec<String>, BackendError> {
        self.drain_node(node).await
    }

    async fn cordoned(&self, node: &str) -> Result<bool, BackendError> {
        Ok(self.inner.lock().cordoned.contains(node))
    }

    async fn uncordon(&self, node: &str) -> Result<bool, BackendError> {
        let mut st = self.inner.lock();
        st.drained.remove(node);
        Ok(st.cordoned.remove(node))
    }

    async fn not_ready(&self, nodes: &[String]) -> Result<Vec<String>, BackendError> {
        Ok(self.not_ready_nodes(nodes))
    }

    async fn observe_patched(&self, node: &str, package: &Package) -> Result<(), BackendError> {
        // The simulated node runs what its patch installed as soon as the patch returns, and is
        // Ready there unless the version is a bad one.
        let mut st = self.inner.lock();
        if let Some(left) = st.faults.watch_lost.get_mut(node).filter(|left| **left > 0) {
            *left -= 1;
            return Err(BackendError::transient_reason(format!("the watch of node {node} was cut off")));
        }
        st.provisioned(node)?;
        match st.faults.bad_versions.contains(&package.reference().key()) {
            true => Err(faults::unhealthy_at(node, package)),
            false => Ok(()),
        }
    }

    async fn host_state(&self, node: &str) -> Result<Option<S>, BackendError> {
        Ok(self.inner.lock().hosts.get(node).map(Host::state))
    }

    async fn host_names(&self) -> Result<Vec<String>, BackendError> {
        Ok(self.host_names_now())
    }

    async fn delete_node(&self, node: &str) -> Result<bool, BackendError> {
        Ok(self.delete_cluster_node(node))
    }

    async fn deprovision_host(
        &self,
        node: &str,
        _cleaning: bus_schema::pb::CleaningMode,
        progress: mpsc::UnboundedSender<S>,
    ) -> Result<bool, BackendError> {
        self.deprovision(node, progress).await
    }

    async fn forget_host(&self, node: &str) -> Result<bool, BackendError> {
        Ok(self.forget(node))
    }

    async fn tear_down_cluster(&self) -> Result<Vec<String>, BackendError> {
        Ok(self.tear_down())
    }

    fn host_changes(&self) -> mpsc::UnboundedReceiver<HostNotice> {
        self.arrivals()
    }
}
