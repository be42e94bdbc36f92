//! What the simulated site holds under its lock: its hosts (each with its Metal3 state, the
//! image and binaries it runs, the provisioning under way), its cluster, the artifacts handed
//! over, the failures injected and the effects counted.

use std::collections::{BTreeMap, BTreeSet};

use bus_schema::domain::{NodeDesign, Package, PackageRef};
use tokio::sync::{mpsc, watch};
use tracing::debug;

use super::effects::SimEffects;
use super::faults::Faults;
use crate::backend::{BackendError, HostNotice, HostRequest, ImageSpec, ProvisioningState as S};

#[derive(Debug, Default)]
pub(super) struct State {
    pub(super) hosts: Hosts,
    pub(super) faults: Faults,
    /// The hosts that arrived after the start, in order: what a new arrivals subscriber hears first.
    pub(super) arrived: Vec<NodeDesign>,
    /// The arrivals subscribers, told of each new host.
    pub(super) arrival_watchers: Vec<mpsc::UnboundedSender<HostNotice>>,
    /// The first master whose binaries installed: the cluster exists once it is set.
    pub(super) cluster_master: Option<String>,
    pub(super) kubeconfig: Option<Vec<u8>>,
    /// Applied container packages, name to version.
    pub(super) containers: BTreeMap<String, String>,
    /// The artifacts handed to provisioning, by sha256.
    pub(super) cache: BTreeSet<String>,
    pub(super) effects: SimEffects,
    /// Nodes the gateway made unschedulable for a patch.
    pub(super) cordoned: BTreeSet<String>,
    /// Cordoned nodes drained since: their pods are gone until the cordon is lifted, and a drain
    /// again evicts none.
    pub(super) drained: BTreeSet<String>,
}

impl State {
    /// Counts one more in a per-node counter of the effects (`provisions`, `patches`, ...),
    /// marking the node changed so its counts are written with it.
    pub(super) fn count(&mut self, counter: fn(&mut SimEffects) -> &mut BTreeMap<String, u32>, node: &str) {
        *counter(&mut self.effects).entry(node.to_string()).or_default() += 1;
        self.hosts.touched.insert(node.to_string());
    }

    /// Whether `node` is on its way to `image`: a reimage its gateway started and did not see to
    /// the end (it was killed, and the job came again). Either the host is being provisioned
    /// with the image, or the old image is coming off (or came off) and the attempt went with
    /// the gateway.
    pub(super) fn reimaging_to(&self, node: &str, image: &Image) -> bool {
        self.hosts.get(node).is_some_and(|h| match &h.attempt {
            Some(a) => a.image == *image,
            None => matches!(h.state(), S::Deprovisioning | S::Available) && h.image.is_none(),
        })
    }

    /// The host, when it is provisioned; a patch needs that.
    pub(super) fn provisioned(&self, node: &str) -> Result<&Host, BackendError> {
        match self.hosts.get(node) {
            Some(h) if h.state() == S::Provisioned => Ok(h),
            Some(h) => Err(BackendError::permanent_reason(format!("{node} is not provisioned (it is {})", h.state()))),
            None => {
                Err(BackendError::permanent_reason(format!("{node} is not provisioned (the site has no such host)")))
            }
        }
    }
}

/// The site's hosts by name, and the names of those changed since the site was last written:
/// every way to change a host goes through here, so none is missed by the site's file.
#[derive(Debug, Default)]
pub(super) struct Hosts {
    map: BTreeMap<String, Host>,
    touched: BTreeSet<String>,
}

impl Hosts {
    pub(super) fn get(&self, name: &str) -> Option<&Host> {
        self.map.get(name)
    }

    pub(super) fn get_mut(&mut self, name: &str) -> Option<&mut Host> {
        let host = self.map.get_mut(name)?;
        self.touched.insert(name.to_string());
        Some(host)
    }

    /// The host `name`, made by `new` when the site does not have it.
    pub(super) fn get_or_insert(&mut self, name: &str, new: impl FnOnce() -> Host) -> &mut Host {
        self.touched.insert(name.to_string());
        self.map.entry(name.to_string()).or_insert_with(new)
    }

    pub(super) fn insert(&mut self, name: String, host: Host) {
        self.touched.insert(name.clone());
        self.map.insert(name, host);
    }

    /// Deletes the host; whether there was one.
    pub(super) fn remove(&mut self, name: &str) -> bool {
        self.touched.insert(name.to_string());
        self.map.remove(name).is_some()
    }

    pub(super) fn contains_key(&self, name: &str) -> bool {
        self.map.contains_key(name)
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&String, &Host)> {
        self.map.iter()
    }

    /// The names of the hosts (and nodes counted) changed since the last call.
    pub(super) fn take_touched(&mut self) -> BTreeSet<String> {
        std::mem::take(&mut self.touched)
    }
}

/// What a site without its application cluster says to what needs one.
pub(super) fn no_cluster() -> BackendError {
    BackendError::transient_reason("no application cluster yet")
}

/// A binary as a node runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Binary {
    pub(super) version: String,
    pub(super) sha256: String,
}

impl Binary {
    pub(super) fn of(package: &Package) -> Self {
        Self { version: package.version.to_string(), sha256: package.sha256.to_string() }
    }
}

/// The binaries a node runs, by name.
pub(super) type BinarySet = BTreeMap<String, Binary>;

pub(super) fn binary_set(packages: &[Package]) -> BinarySet {
    packages.iter().map(|p| (p.name.to_string(), Binary::of(p))).collect()
}

/// A provisioning attempt's result, once it has one.
pub(super) type Outcome = Option<Result<(), BackendError>>;

/// An OS image as a host runs it: what Metal3 writes, and its name in the catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Image {
    pub(super) spec: ImageSpec,
    pub(super) package: PackageRef,
}

impl Image {
    pub(super) fn of(req: &HostRequest) -> Self {
        Self { spec: req.image.clone(), package: req.package.clone() }
    }
}

#[derive(Debug)]
pub(super) struct Host {
    pub(super) state: watch::Sender<S>,
    /// The image the host runs, when provisioned.
    pub(super) image: Option<Image>,
    /// The provisioning under way, which identical requests join.
    pub(super) attempt: Option<Attempt>,
    pub(super) binaries: Option<BinarySet>,
    /// The progress channels of the `provision_host` calls waiting on this host.
    pub(super) watchers: Vec<mpsc::UnboundedSender<S>>,
}

#[derive(Debug)]
pub(super) struct Attempt {
    pub(super) image: Image,
    pub(super) done: watch::Receiver<Outcome>,
}

impl Host {
    /// A host that has just appeared: `registering`.
    pub(super) fn new() -> Self {
        Self::in_state(S::Registering)
    }

    pub(super) fn in_state(state: S) -> Self {
        let state = watch::Sender::new(state);
        Self { state, image: None, attempt: None, binaries: None, watchers: Vec::new() }
    }

    pub(super) fn state(&self) -> S {
        *self.state.borrow()
    }

    /// Moves the host to `state` and tells whoever watches it.
    pub(super) fn set_state(&mut self, site: &str, host: &str, state: S) {
        debug!(site, host, state = %state, "host state");
        self.state.send_replace(state);
        self.watchers.retain(|w| w.send(state).is_ok());
    }
}
