//! A simulated site: Metal3's BareMetalHost state machine, Ironic and BPA, in memory.
//!
//! [`SimSite`] implements [`SiteBackend`] with the timings of a [`SimConfig`], failures
//! injected by node name, and [`SimEffects`] counters that let tests prove no step ran twice.
//! Each host remembers what it runs (its os-image, its binaries by name; container packages
//! are the cluster's), so a patch can say which version it replaced, and hosts can arrive
//! after the start ([`SimSite::arrive`]) as new BareMetalHosts do.
//! A site kept in a file ([`SimSite::with_state_file`]) outlives its process, as a real one
//! outlives its gateway.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bus_schema::domain::{NodeDesign, Package, PackageRef, Role, SiteDesign};
use bus_schema::pb::PackageKind;
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use crate::backend::{
    BackendError, ClusterRequest, HostNotice, HostRequest, ImageSpec, NodeInstall, PatchOutcome, PatchRequest,
    ProvisioningState as S, SiteBackend,
};
use crate::cache::CachedArtifact;

pub(crate) mod control;
mod persist;

pub use persist::{SimStateError, saved_effects};

/// How long each step of the simulated site takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimConfig {
    /// BareMetalHost `registering`: the BMC credentials are checked.
    pub registering: Duration,
    /// `inspecting`: Ironic boots the inspection ramdisk and reports the hardware.
    pub inspecting: Duration,
    /// `preparing`: RAID and firmware settings are applied.
    pub preparing: Duration,
    /// `provisioning`: the OS image is written and the host rebooted into it.
    pub provisioning: Duration,
    /// `deprovisioning`: the disks are cleaned.
    pub deprovisioning: Duration,
    /// BPA's binaries install, for the whole cluster (nodes install in parallel).
    pub install_binaries: Duration,
    /// Producing the application cluster's kubeconfig the first time.
    pub kubeconfig: Duration,
    /// Applying a set of container packages to the application cluster.
    pub apply_containers: Duration,
    /// Copying one missing artifact into the site's cache.
    pub stage_per_artifact: Duration,
}

impl SimConfig {
    /// Durations like those of a real site, in minutes.
    pub fn realistic() -> Self {
        let min = |m: f64| Duration::from_secs_f64(m * 60.0);
        Self {
            registering: min(1.0),
            inspecting: min(3.0),
            preparing: min(2.0),
            provisioning: min(8.0),
            deprovisioning: min(4.0),
            install_binaries: min(6.0),
            kubeconfig: min(0.5),
            apply_containers: min(1.5),
            stage_per_artifact: min(0.75),
        }
    }

    /// Tens to hundreds of milliseconds per step, for tests.
    pub fn fast() -> Self {
        let ms = Duration::from_millis;
        Self {
            registering: ms(20),
            inspecting: ms(50),
            preparing: ms(30),
            provisioning: ms(100),
            deprovisioning: ms(40),
            install_binaries: ms(80),
            kubeconfig: ms(10),
            apply_containers: ms(40),
            stage_per_artifact: ms(10),
        }
    }

    /// Every step takes no time.
    pub fn instant() -> Self {
        Self::fast().map(|_| Duration::ZERO)
    }

    /// Divides every duration by `factor`: `realistic().time_scale(60.0)` turns minutes into seconds.
    ///
    /// # Panics
    /// If `factor` is not a positive finite number.
    pub fn time_scale(self, factor: f64) -> Self {
        assert!(factor.is_finite() && factor > 0.0, "time scale must be positive and finite, got {factor}");
        self.map(|d| d.div_f64(factor))
    }

    /// Replacing one binary on one node: a quarter of [`SimConfig::install_binaries`], which
    /// installs every binary and bootstraps the cluster.
    pub fn patch_binary(&self) -> Duration {
        self.install_binaries / 4
    }

    fn map(self, f: impl Fn(Duration) -> Duration) -> Self {
        Self {
            registering: f(self.registering),
            inspecting: f(self.inspecting),
            preparing: f(self.preparing),
            provisioning: f(self.provisioning),
            deprovisioning: f(self.deprovisioning),
            install_binaries: f(self.install_binaries),
            kubeconfig: f(self.kubeconfig),
            apply_containers: f(self.apply_containers),
            stage_per_artifact: f(self.stage_per_artifact),
        }
    }
}

impl Default for SimConfig {
    fn default() -> Self {
        Self::fast()
    }
}

/// What the site actually did, so tests can prove that no step ran twice.
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
    file: Option<persist::StateFile>,
}

#[derive(Debug, Default)]
struct State {
    hosts: BTreeMap<String, Host>,
    fail_provisioning: BTreeSet<String>,
    fail_binaries: BTreeSet<String>,
    fail_patch: BTreeSet<String>,
    /// The hosts that arrived after the start, in order: what a new arrivals subscriber hears first.
    arrived: Vec<NodeDesign>,
    /// The arrivals subscribers, told of each new host.
    arrival_watchers: Vec<mpsc::UnboundedSender<HostNotice>>,
    /// The first master whose binaries installed: the cluster exists once it is set.
    cluster_master: Option<String>,
    kubeconfig: Option<Vec<u8>>,
    /// Applied container packages, name to version.
    containers: BTreeMap<String, String>,
    /// The artifacts handed to provisioning, by sha256.
    cache: BTreeSet<String>,
    effects: SimEffects,
}

/// A binary as a node runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Binary {
    version: String,
    sha256: String,
}

/// The binaries a node runs, by name.
type BinarySet = BTreeMap<String, Binary>;

fn binary_set(packages: &[Package]) -> BinarySet {
    let binary = |p: &Package| Binary { version: p.version.to_string(), sha256: p.sha256.to_string() };
    packages.iter().map(|p| (p.name.to_string(), binary(p))).collect()
}

/// A provisioning attempt's result, once it has one.
type Outcome = Option<Result<(), BackendError>>;

/// An OS image as a host runs it: what Metal3 writes, and its name in the catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Image {
    spec: ImageSpec,
    package: PackageRef,
}

impl Image {
    fn of(req: &HostRequest) -> Self {
        Self { spec: req.image.clone(), package: req.package.clone() }
    }
}

#[derive(Debug)]
struct Host {
    state: watch::Sender<S>,
    /// The image the host runs, when provisioned.
    image: Option<Image>,
    /// The provisioning under way, which identical requests join.
    attempt: Option<Attempt>,
    binaries: Option<BinarySet>,
    /// The progress channels of the `provision_host` calls waiting on this host.
    watchers: Vec<mpsc::UnboundedSender<S>>,
}

#[derive(Debug)]
struct Attempt {
    image: Image,
    done: watch::Receiver<Outcome>,
}

impl Host {
    fn new() -> Self {
        let state = watch::Sender::new(S::Registering);
        Self { state, image: None, attempt: None, binaries: None, watchers: Vec::new() }
    }

    fn state(&self) -> S {
        *self.state.borrow()
    }

    fn set_state(&mut self, site: &str, host: &str, state: S) {
        debug!(site, host, state = %state, "host state");
        self.state.send_replace(state);
        self.watchers.retain(|w| w.send(state).is_ok());
    }
}

impl Inner {
    fn lock(&self) -> persist::StateGuard<'_> {
        persist::StateGuard::new(self)
    }

    fn set_state(&self, host: &str, state: S) {
        if let Some(h) = self.lock().hosts.get_mut(host) {
            h.set_state(&self.site, host, state);
        }
    }

    /// Ends a provisioning attempt: the host is provisioned, or back to available.
    fn finish(&self, host: &str, image: Image, outcome: Result<(), BackendError>, done: &watch::Sender<Outcome>) {
        let mut st = self.lock();
        if let Some(h) = st.hosts.get_mut(host) {
            h.attempt = None;
            h.image = outcome.is_ok().then_some(image);
            h.set_state(&self.site, host, if outcome.is_ok() { S::Provisioned } else { S::Available });
        }
        if let Err(error) = &outcome {
            warn!(site = %self.site, host, %error, "provisioning failed");
        }
        done.send_replace(Some(outcome));
    }
}

/// What a `provision_host` call does next.
enum Next {
    /// The host already runs the image.
    Done,
    /// The host is busy; look again when its state changes.
    Wait(watch::Receiver<S>),
    /// Wait for this provisioning attempt's result.
    Join(watch::Receiver<Outcome>),
}

/// A `provision_host` caller's subscription to its host's states, dropped with the call.
struct Watcher<'a> {
    inner: &'a Inner,
    host: &'a str,
    progress: mpsc::UnboundedSender<S>,
}

impl Drop for Watcher<'_> {
    fn drop(&mut self) {
        if let Ok(mut st) = self.inner.state.lock()
            && let Some(h) = st.hosts.get_mut(self.host)
        {
            h.watchers.retain(|w| !w.same_channel(&self.progress));
        }
    }
}

impl SimSite {
    /// A site whose hosts start registering at once and walk to `available` in the background.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn new(site_id: &str, nodes: &[NodeDesign], config: SimConfig) -> Self {
        let inner = Inner { site: site_id.to_string(), config, state: Mutex::default(), file: None };
        let site = Self { inner: Arc::new(inner) };
        for node in nodes {
            site.add_host(node);
        }
        site
    }

    /// A site that was installed already: every host of the design provisioned with its role's
    /// os-image and binaries, the cluster formed, the container packages applied. Packages the
    /// design names that `catalog` lacks are left out. For benchmarks and demos that start
    /// from a running fleet; no effect is counted.
    pub fn installed(design: &SiteDesign, catalog: &[Package], config: SimConfig) -> Self {
        let inner = Inner { site: design.site.to_string(), config, state: Mutex::default(), file: None };
        let site = Self { inner: Arc::new(inner) };
        let find = |r: &PackageRef| catalog.iter().find(|p| p.name == r.name && p.version == r.version);
        {
            let mut st = site.inner.lock();
            for node in &design.nodes {
                let set: Vec<&Package> = design.packages_for(node.role).iter().filter_map(find).collect();
                let mut host = Host::new();
                host.state.send_replace(S::Provisioned);
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

    /// Registers a host the site starts with: it walks registering → inspecting → preparing →
    /// available. A host the site already has is left as it is. Unlike [`SimSite::arrive`], the
    /// host is not announced: it is in the site's design already.
    pub fn add_host(&self, node: &NodeDesign) {
        self.ensure_host(&mut self.inner.lock(), node.name.as_str());
    }

    /// A new host appears at the site (racked and cabled after the install): it registers as
    /// [`SimSite::add_host`] does, and is announced to every [`SiteBackend::host_changes`]
    /// subscriber. Returns `false`, and announces nothing, when the site has a host of that name.
    pub fn arrive(&self, node: &NodeDesign) -> bool {
        let mut st = self.inner.lock();
        if st.hosts.contains_key(node.name.as_str()) {
            return false;
        }
        self.ensure_host(&mut st, node.name.as_str());
        info!(site = %self.inner.site, host = %node.name, mac = %node.boot_mac, "host arrived");
        st.arrived.push(node.clone());
        st.arrival_watchers.retain(|w| w.send(HostNotice::arrived(node.clone())).is_ok());
        true
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
        self.inner.lock().fail_provisioning.insert(host.to_string());
    }

    /// Makes every binaries install on `node` fail, until [`SimSite::heal`].
    pub fn fail_binaries(&self, node: &str) {
        self.inner.lock().fail_binaries.insert(node.to_string());
    }

    /// Makes every patch of `node` fail, leaving it at its old version, until [`SimSite::heal`].
    pub fn fail_patch(&self, node: &str) {
        self.inner.lock().fail_patch.insert(node.to_string());
    }

    /// Removes the failures injected for `node`.
    pub fn heal(&self, node: &str) {
        let mut st = self.inner.lock();
        st.fail_provisioning.remove(node);
        st.fail_binaries.remove(node);
        st.fail_patch.remove(node);
    }

    /// The host, registered first if the site does not have it yet.
    fn ensure_host<'s>(&self, st: &'s mut State, host: &str) -> &'s mut Host {
        if !st.hosts.contains_key(host) {
            debug!(site = %self.inner.site, host, state = %S::Registering, "host state");
            tokio::spawn(walk_to_available(Arc::clone(&self.inner), host.to_string()));
        }
        st.hosts.entry(host.to_string()).or_insert_with(Host::new)
    }

    /// Sends the host's current state on `progress`, then every state it passes through.
    fn watch_host<'a>(&'a self, host: &'a str, progress: mpsc::UnboundedSender<S>) -> Watcher<'a> {
        let mut st = self.inner.lock();
        let h = self.ensure_host(&mut st, host);
        if progress.send(h.state()).is_ok() {
            h.watchers.push(progress.clone());
        }
        Watcher { inner: &self.inner, host, progress }
    }

    /// Decides, under the lock, whether to return, wait, join an attempt, or start one.
    fn next_step(&self, host: &str, image: &Image) -> Next {
        let mut st = self.inner.lock();
        let h = self.ensure_host(&mut st, host);
        if let Some(attempt) = &h.attempt {
            return if attempt.image == *image {
                Next::Join(attempt.done.clone())
            } else {
                Next::Wait(h.state.subscribe())
            };
        }
        let redeploy = match h.state() {
            S::Provisioned if h.image.as_ref() == Some(image) => return Next::Done,
            S::Provisioned => true,
            S::Available => false,
            _ => return Next::Wait(h.state.subscribe()),
        };
        let (done_tx, done) = watch::channel(None);
        h.attempt = Some(Attempt { image: image.clone(), done: done.clone() });
        h.image = None;
        h.binaries = None;
        h.set_state(&self.inner.site, host, if redeploy { S::Deprovisioning } else { S::Provisioning });
        *st.effects.provisions.entry(host.to_string()).or_default() += 1;
        tokio::spawn(provision(Arc::clone(&self.inner), host.to_string(), image.clone(), redeploy, done_tx));
        Next::Join(done)
    }
}

/// A new host's walk: registering → inspecting → preparing → available.
async fn walk_to_available(inner: Arc<Inner>, host: String) {
    let c = &inner.config;
    for (wait, next) in [(c.registering, S::Inspecting), (c.inspecting, S::Preparing), (c.preparing, S::Available)] {
        pause(wait).await;
        inner.set_state(&host, next);
    }
}

/// One provisioning attempt, from the state `next_step` left the host in to its outcome.
async fn provision(inner: Arc<Inner>, host: String, image: Image, redeploy: bool, done: watch::Sender<Outcome>) {
    let c = &inner.config;
    if redeploy {
        pause(c.deprovisioning).await;
        inner.set_state(&host, S::Provisioning);
    }
    pause(c.provisioning).await;
    let failed = inner.lock().fail_provisioning.contains(&host);
    if failed {
        inner.set_state(&host, S::Deprovisioning);
        pause(c.deprovisioning).await;
    }
    let outcome = if failed { Err(provisioning_error(&host, &image.spec)) } else { Ok(()) };
    inner.finish(&host, image, outcome, &done);
}

async fn wait_outcome(mut done: watch::Receiver<Outcome>) -> Result<(), BackendError> {
    let outcome = done.wait_for(Option::is_some).await.map(|o| (*o).clone()).map_err(|_| site_stopped())?;
    outcome.unwrap_or_else(|| Err(site_stopped()))
}

fn provisioning_error(host: &str, image: &ImageSpec) -> BackendError {
    BackendError::HostFailed {
        host: host.to_string(),
        error_type: "provisioning error".into(),
        message: format!(
            "Image provisioning failed: deploy step write_image failed on host {host}: image {} ({}:{}) could not be written",
            image.url, image.checksum_type, image.checksum
        ),
    }
}

fn site_stopped() -> BackendError {
    BackendError::Transient("simulated site stopped".into())
}

fn no_cluster() -> BackendError {
    BackendError::Transient("no application cluster yet".into())
}

async fn pause(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}

impl State {
    /// The host, when it is provisioned; a patch needs that.
    fn provisioned(&self, node: &str) -> Result<&Host, BackendError> {
        match self.hosts.get(node) {
            Some(h) if h.state() == S::Provisioned => Ok(h),
            Some(h) => Err(BackendError::Permanent(format!("{node} is not provisioned (it is {})", h.state()))),
            None => Err(BackendError::Permanent(format!("{node} is not provisioned (the site has no such host)"))),
        }
    }

    fn needs_install(&self, node: &str, wanted: &BinarySet) -> bool {
        self.hosts.get(node).is_some_and(|h| h.state() == S::Provisioned && h.binaries.as_ref() != Some(wanted))
    }

    /// Installs the binaries on one node; `Some(reason)` when it failed.
    fn install_on(&mut self, site: &str, node: &str, wanted: &BinarySet) -> Option<String> {
        let Some(h) = self.hosts.get_mut(node).filter(|h| h.state() == S::Provisioned) else {
            return Some("os not provisioned".into());
        };
        if h.binaries.as_ref() == Some(wanted) {
            return None;
        }
        *self.effects.binary_installs.entry(node.to_string()).or_default() += 1;
        if self.fail_binaries.contains(node) {
            h.binaries = None;
            let reason = format!("binaries install failed on {node}: install script exited with status 1");
            warn!(site, node, %reason, "binaries install failed");
            return Some(reason);
        }
        h.binaries = Some(wanted.clone());
        debug!(site, node, binaries = wanted.len(), "binaries installed");
        None
    }

    /// Whether every package is applied already; `Transient` while there is no cluster.
    fn containers_applied(&self, wanted: &[(String, String)]) -> Result<bool, BackendError> {
        if self.cluster_master.is_none() {
            return Err(no_cluster());
        }
        Ok(wanted.iter().all(|(name, version)| self.containers.get(name) == Some(version)))
    }
}

impl SiteBackend for SimSite {
    async fn stage_artifacts(&self, artifacts: &[CachedArtifact]) -> Result<(), BackendError> {
        let distinct: BTreeMap<&str, &CachedArtifact> =
            artifacts.iter().map(|a| (a.package.sha256.as_str(), a)).collect();
        for a in distinct.values() {
            if let Some(path) = &a.path
                && !path.exists()
            {
                return Err(BackendError::Transient(format!("{} is gone from the artifact cache", path.display())));
            }
        }
        let missing = {
            let st = self.inner.lock();
            distinct.keys().filter(|sha| !st.cache.contains(**sha)).count()
        };
        pause(self.inner.config.stage_per_artifact.saturating_mul(count(missing))).await;
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

    async fn provision_host(&self, req: &HostRequest, progress: mpsc::UnboundedSender<S>) -> Result<(), BackendError> {
        let host = req.node.name.as_str();
        if req.bmc.is_some() {
            self.inner.lock().effects.bmc_logins += 1;
        }
        let _watcher = self.watch_host(host, progress);
        let image = Image::of(req);
        loop {
            match self.next_step(host, &image) {
                Next::Done => return Ok(()),
                Next::Join(done) => return wait_outcome(done).await,
                Next::Wait(mut state) => state.changed().await.map_err(|_| site_stopped())?,
            }
        }
    }

    async fn install_binaries(&self, req: &ClusterRequest) -> Result<Vec<NodeInstall>, BackendError> {
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

    async fn kubeconfig(&self) -> Result<Vec<u8>, BackendError> {
        let master = {
            let st = self.inner.lock();
            if let Some(kubeconfig) = &st.kubeconfig {
                return Ok(kubeconfig.clone());
            }
            st.cluster_master.clone().ok_or_else(no_cluster)?
        };
        pause(self.inner.config.kubeconfig).await;
        let mut guard = self.inner.lock();
        let st = &mut *guard;
        let kubeconfig = st.kubeconfig.get_or_insert_with(|| {
            st.effects.kubeconfigs_generated += 1;
            debug!(site = %self.inner.site, master, "kubeconfig generated");
            render_kubeconfig(&self.inner.site, &master)
        });
        Ok(kubeconfig.clone())
    }

    async fn apply_container_packages(&self, packages: &[Package]) -> Result<(), BackendError> {
        self.apply_containers(packages).await.map(|_| ())
    }

    async fn patch_node(&self, req: &PatchRequest) -> Result<PatchOutcome, BackendError> {
        let node = req.node.name.as_str();
        self.inner.lock().provisioned(node)?;
        let result = match req.package.kind {
            PackageKind::OsImage => self.patch_os(req).await,
            PackageKind::Binary => self.patch_binary(node, &req.package).await,
            PackageKind::Container => self.patch_container(node, &req.package).await,
            PackageKind::Unspecified => {
                Err(BackendError::Permanent(format!("{} has no kind", req.package.reference().key())))
            }
        };
        let mut st = self.inner.lock();
        match &result {
            Ok(outcome) if outcome.changed => {
                *st.effects.patches.entry(node.to_string()).or_default() += 1;
                debug!(site = %self.inner.site, node, package = %req.package.reference().key(), "patched");
            }
            Ok(_) | Err(BackendError::Transient(_)) => {}
            Err(error) => {
                *st.effects.patch_failures.entry(node.to_string()).or_default() += 1;
                warn!(site = %self.inner.site, node, package = %req.package.reference().key(), %error, "patch failed");
            }
        }
        result
    }

    fn host_changes(&self) -> mpsc::UnboundedReceiver<HostNotice> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut st = self.inner.lock();
        // Under the lock, so no arrival is missed between the backlog and the subscription.
        if st.arrived.iter().all(|n| tx.send(HostNotice::arrived(n.clone())).is_ok()) {
            st.arrival_watchers.push(tx);
        }
        rx
    }
}

/// The patch kinds. Each looks first whether the node runs the version already (then it does
/// nothing) and finds an injected failure where a real one would show: an os-image's checksum
/// before the disks are wiped, a container at the API server's admission, a binary once its
/// service fails to come back.
impl SimSite {
    /// Reimages the host (deprovisioning → provisioning → provisioned, as any provisioning with
    /// another image), then installs its role's binaries again: the reimage wiped them.
    async fn patch_os(&self, req: &PatchRequest) -> Result<PatchOutcome, BackendError> {
        let node = req.node.name.as_str();
        let host = HostRequest::new(req.node.clone(), &req.package);
        let image = Image::of(&host);
        let reinstall = binary_set(&req.reinstall);
        let (from_version, reimage) = {
            let st = self.inner.lock();
            let h = st.provisioned(node)?;
            let from_version = h.image.as_ref().map(|i| from_version(&i.package, &req.package));
            let reimage = h.image.as_ref() != Some(&image);
            // A reimage that ended before its reinstall (the call was dropped) is finished here.
            if !reimage && (reinstall.is_empty() || h.binaries.is_some()) {
                return Ok(PatchOutcome { from_version, changed: false });
            }
            if reimage && st.fail_patch.contains(node) {
                let reason = format!(
                    "reimage of {node} with {} refused: image checksum mismatch in the site cache \
                     (expected sha256:{}); the host keeps its current image",
                    host.package.key(),
                    req.package.sha256
                );
                return Err(BackendError::Permanent(reason));
            }
            (from_version, reimage)
        };
        if reimage {
            // Nobody relays this reimage's states: the patch events say what happened.
            let (progress, _) = mpsc::unbounded_channel();
            self.provision_host(&host, progress).await?;
        }
        if !reinstall.is_empty() {
            // One node's install takes as long as the whole cluster's: nodes install in parallel.
            pause(self.inner.config.install_binaries).await;
            if let Some(reason) = self.inner.lock().install_on(&self.inner.site, node, &reinstall) {
                return Err(BackendError::Permanent(format!("{node} reimaged, but its binaries were not: {reason}")));
            }
        }
        Ok(PatchOutcome { from_version, changed: true })
    }

    /// Replaces one binary on the node, in [`SimConfig::patch_binary`].
    async fn patch_binary(&self, node: &str, package: &Package) -> Result<PatchOutcome, BackendError> {
        let name = package.name.as_str();
        let wanted = Binary { version: package.version.to_string(), sha256: package.sha256.to_string() };
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
        if st.fail_patch.contains(node) {
            let was = from_version.as_deref().map_or("removed again".into(), |v| format!("rolled back to {v}"));
            let reason = format!(
                "patch of {name} to {} failed on {node}: {name}.service did not become active after the swap \
                 (exit status 1); {was}",
                package.version
            );
            return Err(BackendError::Permanent(reason));
        }
        if let Some(h) = st.hosts.get_mut(node) {
            h.binaries.get_or_insert_with(BinarySet::new).insert(name.to_string(), wanted);
        }
        Ok(PatchOutcome { from_version, changed: true })
    }

    /// Applies the package to the node's cluster, as [`SiteBackend::apply_container_packages`]
    /// does: the first node of a site to patch a container changes the cluster, the others find
    /// it done.
    async fn patch_container(&self, node: &str, package: &Package) -> Result<PatchOutcome, BackendError> {
        let from_version = {
            let st = self.inner.lock();
            let from_version = st.containers.get(package.name.as_str()).cloned();
            if st.containers_applied(&[container(package)])? {
                return Ok(PatchOutcome { from_version, changed: false });
            }
            if st.fail_patch.contains(node) {
                let reason = format!(
                    "apply of {} for {node} failed: admission webhook \"validate.{}\" denied the request; \
                     the cluster keeps {}",
                    package.reference().key(),
                    package.name,
                    from_version.as_deref().unwrap_or("no version of it")
                );
                return Err(BackendError::Permanent(reason));
            }
            from_version
        };
        let changed = self.apply_containers(std::slice::from_ref(package)).await?;
        Ok(PatchOutcome { from_version, changed })
    }

    /// Applies what the cluster lacks of `packages`; whether that changed it.
    async fn apply_containers(&self, packages: &[Package]) -> Result<bool, BackendError> {
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

/// A container package as the cluster records it: name and version.
fn container(p: &Package) -> (String, String) {
    (p.name.to_string(), p.version.to_string())
}

/// What a node ran before `wanted`: the version, or `name@version` when it was another package
/// (a host moving from `ubuntu-22.04` to `ubuntu-24.04`).
fn from_version(running: &PackageRef, wanted: &Package) -> String {
    if running.name == wanted.name { running.version.to_string() } else { running.key() }
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

const KUBECONFIG: &str = "\
apiVersion: v1
kind: Config
clusters:
- cluster:
    certificate-authority-data: {ca}
    server: https://{master}.{site}.landfall.local:6443
  name: {site}
contexts:
- context:
    cluster: {site}
    user: landfall-admin@{site}
  name: landfall-admin@{site}
current-context: landfall-admin@{site}
preferences: {}
users:
- name: landfall-admin@{site}
  user:
    token: {token}
";

/// A kubeconfig with a fake CA certificate and a bootstrap-token-like client token.
fn render_kubeconfig(site: &str, master: &str) -> Vec<u8> {
    const ALNUM: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut bytes = entropy(site);
    let der: Vec<u8> = [0x30, 0x82, 0x03, 0x0c].into_iter().chain(bytes.by_ref().take(780)).collect();
    let b64 = base64(&der);
    let lines: Vec<_> = b64.as_bytes().chunks(64).map(String::from_utf8_lossy).collect();
    let pem = format!("-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n", lines.join("\n"));
    let token: String = bytes.take(22).map(|b| char::from(ALNUM[usize::from(b) % ALNUM.len()])).collect();
    let (id, secret) = token.split_at(6);
    KUBECONFIG
        .replace("{master}", master)
        .replace("{site}", site)
        .replace("{token}", &format!("{id}.{secret}"))
        .replace("{ca}", &base64(pem.as_bytes()))
        .into_bytes()
}

/// Random-looking bytes, different for every site and every run.
fn entropy(seed: &str) -> impl Iterator<Item = u8> + use<> {
    let (keys, seed) = (RandomState::new(), seed.to_string());
    (0u64..).flat_map(move |i| keys.hash_one((&seed, i)).to_le_bytes())
}

/// Standard base64, with padding.
fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            let c = if i <= chunk.len() { ALPHABET[(n >> (18 - 6 * i)) as usize & 63] } else { b'=' };
            out.push(char::from(c));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use bus_schema::pb::PackageKind;

    use super::*;

    fn node(name: &str, role: Role) -> NodeDesign {
        NodeDesign {
            name: name.try_into().unwrap(),
            role,
            boot_mac: "52:54:00:00:01:01".to_string().try_into().unwrap(),
            bmc_address: "ipmi://10.0.1.1".to_string().try_into().unwrap(),
            labels: BTreeMap::new(),
        }
    }

    fn package(name: &str, digit: char, size: u64) -> Package {
        Package { size, ..versioned(name, "1.29.1", PackageKind::Binary, digit) }
    }

    /// A package whose sha256 is `digit` 64 times (the state file's tests use it too).
    pub(super) fn versioned(name: &str, version: &str, kind: PackageKind, digit: char) -> Package {
        Package {
            name: name.try_into().unwrap(),
            version: version.try_into().unwrap(),
            kind,
            sha256: digit.to_string().repeat(64).try_into().unwrap(),
            size: 1,
            object_key: format!("artifacts/{name}/{version}"),
        }
    }

    fn host(node: &NodeDesign, os: char) -> HostRequest {
        HostRequest::new(node.clone(), &versioned("ubuntu", "1.29.1", PackageKind::OsImage, os))
    }

    async fn provision(site: &SimSite, req: &HostRequest) -> (Result<(), BackendError>, Vec<S>) {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let result = site.provision_host(req, tx).await;
        let mut states = Vec::new();
        while let Some(s) = rx.recv().await {
            states.push(s);
        }
        (result, states)
    }

    fn one_host() -> (SimSite, NodeDesign) {
        let n1 = node("node-1", Role::Master);
        (SimSite::new("edge-01", std::slice::from_ref(&n1), SimConfig::fast()), n1)
    }

    fn provisions(site: &SimSite, host: &str) -> u32 {
        site.effects().provisions.get(host).copied().unwrap_or(0)
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_host_walks_to_available() {
        let site = SimSite::new("edge-01", &[node("node-1", Role::Master)], SimConfig::fast());
        assert_eq!(site.hosts(), [("node-1".to_string(), S::Registering)]);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(site.hosts(), [("node-1".to_string(), S::Available)]);
        assert_eq!(site.effects(), SimEffects::default());
    }

    #[tokio::test(start_paused = true)]
    async fn provisioning_reports_every_state_in_order_and_is_idempotent() {
        let (site, n1) = one_host();
        let (result, states) = provision(&site, &host(&n1, 'a')).await;
        result.unwrap();
        let walk = [S::Registering, S::Inspecting, S::Preparing, S::Available, S::Provisioning, S::Provisioned];
        assert_eq!(states, walk);
        let (again, states) = provision(&site, &host(&n1, 'a')).await;
        again.unwrap();
        assert_eq!(states, [S::Provisioned]);
        assert_eq!(provisions(&site, "node-1"), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_unknown_host_is_registered_first() {
        let site = SimSite::new("edge-01", &[], SimConfig::instant());
        let (result, states) = provision(&site, &host(&node("node-9", Role::Worker), 'a')).await;
        result.unwrap();
        assert_eq!(states.first(), Some(&S::Registering));
        assert_eq!(site.hosts(), [("node-9".to_string(), S::Provisioned)]);
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_identical_provisions_share_one_effect() {
        let (site, n1) = one_host();
        let req = host(&n1, 'a');
        let ((a, a_states), (b, b_states)) = tokio::join!(provision(&site, &req), provision(&site, &req));
        a.unwrap();
        b.unwrap();
        assert_eq!(a_states.last(), Some(&S::Provisioned));
        assert_eq!(b_states.last(), Some(&S::Provisioned));
        assert_eq!(provisions(&site, "node-1"), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn another_image_deprovisions_then_provisions() {
        let (site, n1) = one_host();
        provision(&site, &host(&n1, 'a')).await.0.unwrap();
        let (result, states) = provision(&site, &host(&n1, 'b')).await;
        result.unwrap();
        assert_eq!(states, [S::Provisioned, S::Deprovisioning, S::Provisioning, S::Provisioned]);
        assert_eq!(provisions(&site, "node-1"), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_provisioning_leaves_the_host_available_for_a_retry() {
        let (site, n1) = one_host();
        site.fail_provisioning("node-1");
        let req = host(&n1, 'a');
        let (result, states) = provision(&site, &req).await;
        let Err(BackendError::HostFailed { host, error_type, message }) = result else {
            panic!("expected HostFailed, got {result:?}");
        };
        assert_eq!((host.as_str(), error_type.as_str()), ("node-1", "provisioning error"));
        assert!(message.contains("node-1") && message.contains(&req.image.url), "{message}");
        assert_eq!(states[states.len() - 3..], [S::Provisioning, S::Deprovisioning, S::Available]);
        assert_eq!(site.hosts(), [("node-1".to_string(), S::Available)]);
        site.heal("node-1");
        provision(&site, &req).await.0.unwrap();
        assert_eq!(provisions(&site, "node-1"), 2);
    }

    /// A site with a provisioned master and worker, and a third node never provisioned.
    async fn provisioned_site() -> (SimSite, ClusterRequest) {
        let nodes = [node("m-1", Role::Master), node("w-1", Role::Worker), node("w-2", Role::Worker)];
        let site = SimSite::new("edge-01", &nodes, SimConfig::fast());
        let (master, worker) = (host(&nodes[0], 'a'), host(&nodes[1], 'a'));
        let (m, w) = tokio::join!(provision(&site, &master), provision(&site, &worker));
        m.0.unwrap();
        w.0.unwrap();
        let binaries = vec![package("kubelet", 'c', 10)];
        (site, ClusterRequest { nodes: nodes.to_vec(), binaries, join_existing: false })
    }

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
    async fn the_cluster_kubeconfig_is_generated_once_and_containers_apply_once() {
        let (site, req) = provisioned_site().await;
        let containers = [package("cni", 'd', 5)];
        assert!(matches!(site.kubeconfig().await, Err(BackendError::Transient(_))));
        assert!(matches!(site.apply_container_packages(&containers).await, Err(BackendError::Transient(_))));
        site.install_binaries(&req).await.unwrap();
        let first = String::from_utf8(site.kubeconfig().await.unwrap()).unwrap();
        assert!(first.contains("server: https://m-1.edge-01.landfall.local:6443"), "{first}");
        assert!(first.contains("kind: Config") && first.contains("current-context: landfall-admin@edge-01"));
        assert_eq!(site.kubeconfig().await.unwrap(), first.as_bytes());
        site.apply_container_packages(&containers).await.unwrap();
        site.apply_container_packages(&containers).await.unwrap();
        let effects = site.effects();
        assert_eq!((effects.kubeconfigs_generated, effects.container_applies), (1, 1));
    }

    /// [`provisioned_site`] with its cluster formed: kubelet 1.29.1 on m-1 and w-1.
    async fn installed_site() -> (SimSite, ClusterRequest) {
        let (site, req) = provisioned_site().await;
        site.install_binaries(&req).await.unwrap();
        (site, req)
    }

    fn patch(req: &ClusterRequest, node: usize, package: Package) -> PatchRequest {
        PatchRequest { node: req.nodes[node].clone(), package, reinstall: req.binaries.clone() }
    }

    fn outcome(from_version: &str, changed: bool) -> PatchOutcome {
        PatchOutcome { from_version: Some(from_version.to_string()), changed }
    }

    fn per_node(counts: &[(&str, u32)]) -> BTreeMap<String, u32> {
        counts.iter().map(|(node, n)| (node.to_string(), *n)).collect()
    }

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

        let Err(BackendError::Permanent(reason)) = site.patch_node(&patch(&req, 2, kubelet)).await else {
            panic!("w-2 has no OS");
        };
        assert!(reason.contains("w-2 is not provisioned"), "{reason}");
        assert!(site.effects().patch_failures.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn an_os_image_patch_reimages_the_host_and_reinstalls_its_binaries() {
        let (site, req) = installed_site().await;
        let ubuntu = versioned("ubuntu", "24.04", PackageKind::OsImage, 'f');
        let state = |site: &SimSite| site.hosts()[0].1;
        let task = tokio::spawn({
            let (site, req) = (site.clone(), patch(&req, 0, ubuntu.clone()));
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

        assert_eq!(site.patch_node(&patch(&req, 0, ubuntu)).await.unwrap(), outcome("24.04", false));
        // The reimage wiped kubelet 1.29.1, and the reinstall put it back.
        let kubelet = package("kubelet", 'c', 10);
        assert_eq!(site.patch_node(&patch(&req, 0, kubelet)).await.unwrap(), outcome("1.29.1", false));
        let effects = site.effects();
        assert_eq!(effects.provisions, per_node(&[("m-1", 2), ("w-1", 1)]));
        assert_eq!(effects.binary_installs, per_node(&[("m-1", 2), ("w-1", 1)]));
        assert_eq!(effects.patches, per_node(&[("m-1", 1)]));
        assert_eq!(site.kubeconfig().await.map(|_| ()), Ok(()), "m-1 is still the cluster's master");
    }

    #[tokio::test(start_paused = true)]
    async fn an_injected_patch_failure_keeps_the_old_version_until_healed() {
        let (site, req) = installed_site().await;
        let kubelet = versioned("kubelet", "1.29.2", PackageKind::Binary, 'e');
        site.fail_patch("w-1");
        let Err(BackendError::Permanent(reason)) = site.patch_node(&patch(&req, 1, kubelet.clone())).await else {
            panic!("the patch of w-1 should fail");
        };
        assert!(reason.contains("kubelet") && reason.contains("w-1") && reason.contains("rolled back to 1.29.1"));
        let current = package("kubelet", 'c', 10);
        assert_eq!(site.patch_node(&patch(&req, 1, current)).await.unwrap(), outcome("1.29.1", false));

        site.fail_patch("m-1");
        let ubuntu = versioned("ubuntu", "24.04", PackageKind::OsImage, 'f');
        let Err(BackendError::Permanent(reason)) = site.patch_node(&patch(&req, 0, ubuntu)).await else {
            panic!("the reimage of m-1 should be refused");
        };
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
        assert!(matches!(early, Err(BackendError::Transient(_))), "{early:?}");
        site.install_binaries(&req).await.unwrap();
        let first = site.patch_node(&patch(&req, 0, cni.clone())).await.unwrap();
        assert_eq!(first, PatchOutcome { from_version: None, changed: true });
        assert_eq!(site.patch_node(&patch(&req, 1, cni)).await.unwrap(), outcome("1.4.0", false));
        let effects = site.effects();
        assert_eq!((effects.container_applies, effects.patches), (1, per_node(&[("m-1", 1)])));
        assert!(effects.patch_failures.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_joins_only_an_existing_cluster() {
        let (site, req) = provisioned_site().await;
        let join = |nodes: &[NodeDesign]| ClusterRequest { nodes: nodes.to_vec(), join_existing: true, ..req.clone() };
        let early = site.install_binaries(&join(&req.nodes[1..2])).await;
        assert_eq!(early, Err(BackendError::Transient("no application cluster yet".into())));
        site.install_binaries(&ClusterRequest { nodes: req.nodes[..1].to_vec(), ..req.clone() }).await.unwrap();
        let joined = site.install_binaries(&join(&req.nodes[1..2])).await.unwrap();
        assert_eq!(joined, [NodeInstall { node: "w-1".into(), role: Role::Worker, failure: None }]);
        assert_eq!(site.effects().binary_installs, per_node(&[("m-1", 1), ("w-1", 1)]));
    }

    #[tokio::test(start_paused = true)]
    async fn an_arrival_is_announced_once_to_every_subscriber() {
        let (site, n1) = one_host();
        let mut early = site.host_changes();
        let w9 = node("w-9", Role::Worker);
        assert!(site.arrive(&w9));
        assert!(!site.arrive(&w9), "a host the site has is not announced again");
        assert!(!site.arrive(&n1), "nor is a host it started with");
        let mut late = site.host_changes();
        for arrivals in [&mut early, &mut late] {
            assert_eq!(arrivals.recv().await.and_then(HostNotice::into_arrival), Some(w9.clone()));
            assert!(arrivals.try_recv().is_err());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(site.hosts(), [("node-1".to_string(), S::Available), ("w-9".to_string(), S::Available)]);
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
        assert!(matches!(site.stage_artifacts(&[gone]).await, Err(BackendError::Transient(_))));
    }

    #[test]
    fn base64_and_time_scale() {
        assert_eq!([base64(b"Man"), base64(b"Ma"), base64(b"M")], ["TWFu", "TWE=", "TQ=="]);
        assert_eq!(SimConfig::realistic().time_scale(60.0).provisioning, Duration::from_secs(8));
        assert_eq!(SimConfig::instant().provisioning, Duration::ZERO);
    }
}
