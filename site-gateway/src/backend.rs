//! What a gateway needs from its site, in Metal3's and BPA's terms.
//!
//! The simulated site ([`crate::sim`]) and the Kubernetes-backed one are both implementations
//! of [`SiteBackend`]; the gateway logic does not know which one it drives.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use bus_schema::domain::{NodeDesign, Package, PackageRef, Role};
use bus_schema::pb;
use tokio::sync::{mpsc, oneshot};

use crate::cache::CachedArtifact;

/// `status.provisioning.state` of a Metal3 BareMetalHost (upstream state machine).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProvisioningState {
    Unmanaged,
    Registering,
    Inspecting,
    Preparing,
    Available,
    Provisioning,
    Provisioned,
    Deprovisioning,
    ExternallyProvisioned,
    PoweringOffBeforeDelete,
    Deleting,
}

impl ProvisioningState {
    const ALL: [Self; 11] = [
        Self::Unmanaged,
        Self::Registering,
        Self::Inspecting,
        Self::Preparing,
        Self::Available,
        Self::Provisioning,
        Self::Provisioned,
        Self::Deprovisioning,
        Self::ExternallyProvisioned,
        Self::PoweringOffBeforeDelete,
        Self::Deleting,
    ];

    /// The state Metal3 wrote as `s`; `None` for an empty or unknown one.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|state| state.as_str() == s)
    }

    /// The string Metal3 writes in `status.provisioning.state`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unmanaged => "unmanaged",
            Self::Registering => "registering",
            Self::Inspecting => "inspecting",
            Self::Preparing => "preparing",
            Self::Available => "available",
            Self::Provisioning => "provisioning",
            Self::Provisioned => "provisioned",
            Self::Deprovisioning => "deprovisioning",
            Self::ExternallyProvisioned => "externally provisioned",
            Self::PoweringOffBeforeDelete => "powering off before delete",
            Self::Deleting => "deleting",
        }
    }
}

impl fmt::Display for ProvisioningState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The OS image a host is provisioned with (BareMetalHost `spec.image`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageSpec {
    pub url: String,
    pub checksum: String,
    /// `sha256`
    pub checksum_type: String,
    /// `raw`, `qcow2`, ...
    pub format: String,
}

impl ImageSpec {
    pub fn from_package(p: &Package) -> Self {
        Self {
            url: format!("artifacts://{}", p.object_key),
            checksum: p.sha256.to_string(),
            checksum_type: "sha256".into(),
            format: "raw".into(),
        }
    }
}

/// A host's BMC credentials, from the hub's secrets service for the job that drives the BMC.
/// Its `Debug` never shows the password.
#[derive(Clone, PartialEq, Eq)]
pub struct BmcCredentials {
    pub username: String,
    pub password: String,
}

impl fmt::Debug for BmcCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BmcCredentials").field("username", &self.username).field("password", &"<redacted>").finish()
    }
}

/// Provision one host's OS.
#[derive(Debug, Clone)]
pub struct HostRequest {
    pub node: NodeDesign,
    pub image: ImageSpec,
    /// The image's catalog identity, so the backend can say which version a host runs.
    pub package: PackageRef,
    /// The credentials of the host's BMC, when the hub holds some for it.
    pub bmc: Option<BmcCredentials>,
    /// The hub could not be asked for the credentials (the link is cut): a host the site has
    /// already is driven without them, and one it would have to create waits for the link.
    pub bmc_out_of_reach: bool,
    /// Cluster API builds the site: the host is enrolled for CAPM3 to claim (no image from the
    /// gateway), and provisioned once a machine has claimed it and written `image` to it.
    pub enroll_only: bool,
}

impl HostRequest {
    /// Provision `node` with the os-image `image`.
    pub fn new(node: NodeDesign, image: &Package) -> Self {
        Self {
            node,
            image: ImageSpec::from_package(image),
            package: image.reference(),
            bmc: None,
            bmc_out_of_reach: false,
            enroll_only: false,
        }
    }
}

/// Install the cluster binaries (BPA `Provisioning`: masters and workers by MAC), or build the
/// cluster through Cluster API (`capi`).
#[derive(Debug, Clone)]
pub struct ClusterRequest {
    pub nodes: Vec<NodeDesign>,
    pub binaries: Vec<Package>,
    /// The nodes join the site's existing cluster instead of forming one.
    pub join_existing: bool,
    /// Cluster API builds the site: what its objects are rendered from.
    pub capi: Option<CapiBuild>,
}

/// What a Cluster API site's objects are rendered from: the site's whole design (a join is the
/// design with the node in it) and the packages it names.
#[derive(Debug, Clone)]
pub struct CapiBuild {
    pub design: bus_schema::domain::SiteDesign,
    /// The design's os-images and binaries, resolved against the catalog.
    pub packages: Vec<Package>,
}

impl ClusterRequest {
    pub fn with_role(&self, role: Role) -> impl Iterator<Item = &NodeDesign> {
        self.nodes.iter().filter(move |n| n.role == role)
    }
}

/// One node's outcome of a binaries install.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInstall {
    pub node: String,
    pub role: Role,
    /// `None` when installed, the reason otherwise.
    pub failure: Option<String>,
}

/// Bring one provisioned node to a package version: reimage it (os-image), replace one of its
/// binaries (binary), or apply the package to its cluster (container).
#[derive(Debug, Clone)]
pub struct PatchRequest {
    pub node: NodeDesign,
    pub package: Package,
    /// The binaries of the node's role, installed again once an os-image reimage wiped its disks.
    pub reinstall: Vec<Package>,
    /// Where a reimage (os-image) tells each state the host passes through, as a provisioning
    /// does; `None`: nobody listens.
    pub progress: Option<mpsc::UnboundedSender<ProvisioningState>>,
    /// How many of the site's nodes the rollout takes down at once (a Cluster API site's worker
    /// groups roll with this as their `maxUnavailable`).
    pub max_unavailable: u32,
}

/// What a patch found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatchOutcome {
    /// The version the node ran before, when it ran the package at all. When nothing changed,
    /// that is the version asked for.
    pub from_version: Option<String>,
    /// `false` when the node already ran the version: nothing was done.
    pub changed: bool,
}

/// What [`SiteBackend::cordon`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cordon {
    /// The node is unschedulable for landfall (made so now, or by an earlier attempt).
    Done,
    /// Someone else had made it unschedulable: it is left as they left it, and not made
    /// schedulable again afterwards.
    HeldByOther,
    /// The application cluster has no such node (not joined yet): nothing runs on it.
    NotInCluster,
}

/// The cause under a [`BackendError`], shared so that the error can be cloned.
pub type Cause = Arc<dyn std::error::Error + Send + Sync>;

/// Why a site could not do what the gateway asked. `Permanent` and `Transient` say what was
/// being done and keep the error that says why as their source; [`BackendError::reason`] gives
/// the whole chain, for an event or a log line.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BackendError {
    /// Metal3 reported an error for the host (`status.errorType`, `status.errorMessage`).
    #[error("host {host}: {error_type}: {message}")]
    HostFailed { host: String, error_type: String, message: String },
    /// Doing it again will not help.
    #[error("{context}")]
    Permanent {
        context: String,
        #[source]
        source: Option<Cause>,
    },
    /// The site is unreachable or busy; try again.
    #[error("{context}")]
    Transient {
        context: String,
        #[source]
        source: Option<Cause>,
    },
}

impl BackendError {
    /// Doing it again will not help: `context` failed because of `source`.
    pub fn permanent(context: impl Into<String>, source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        BackendError::Permanent { context: context.into(), source: Some(Arc::from(source.into())) }
    }

    /// Doing it again will not help, for a reason no other error gives.
    pub fn permanent_reason(reason: impl Into<String>) -> Self {
        BackendError::Permanent { context: reason.into(), source: None }
    }

    /// Try again: `context` failed because of `source`.
    pub fn transient(context: impl Into<String>, source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        BackendError::Transient { context: context.into(), source: Some(Arc::from(source.into())) }
    }

    /// Try again, for a reason no other error gives (a cluster not there yet).
    pub fn transient_reason(reason: impl Into<String>) -> Self {
        BackendError::Transient { context: reason.into(), source: None }
    }

    /// The message with every cause under it, joined by `: `.
    pub fn reason(&self) -> String {
        bus_schema::runtime::error_chain(self)
    }
}

/// What a site's cluster is, as a render of a chart needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterFacts {
    /// `v1.29.2`.
    pub kube_version: String,
    /// `group/version` and `group/version/Kind` of everything it serves.
    pub api_versions: Vec<String>,
}

/// A site's bare-metal and binary provisioning, as the gateway drives it.
///
/// Every method is idempotent: asking for what is already so changes nothing and
/// returns at once with the same result.
pub trait SiteBackend: Send + Sync + 'static {
    /// Hands the artifacts the gateway's cache holds, verified, to the site's provisioning
    /// (the BPA's upload API at a real site), which keeps what it has already.
    fn stage_artifacts(&self, artifacts: &[CachedArtifact]) -> impl Future<Output = Result<(), BackendError>> + Send;

    /// Provisions a host's OS and returns when it is `provisioned`, or with the host's error.
    /// Each state the host passes through is sent on `progress`.
    fn provision_host(
        &self,
        req: &HostRequest,
        progress: mpsc::UnboundedSender<ProvisioningState>,
    ) -> impl Future<Output = Result<(), BackendError>> + Send;

    /// Installs the cluster binaries on the nodes; the result has one entry per node.
    ///
    /// # Errors
    /// `Transient` when the nodes are to join the site's cluster and it does not exist yet.
    fn install_binaries(
        &self,
        req: &ClusterRequest,
    ) -> impl Future<Output = Result<Vec<NodeInstall>, BackendError>> + Send;

    /// The application cluster's kubeconfig, once binaries are installed.
    fn kubeconfig(&self) -> impl Future<Output = Result<Vec<u8>, BackendError>> + Send;

    /// Applies container packages (bundles of manifests) to the application cluster.
    fn apply_container_packages(&self, packages: &[Package]) -> impl Future<Output = Result<(), BackendError>> + Send;

    /// Brings one node to the package's version and says what it ran before. A node already
    /// there is left alone (`changed: false`), so a redelivered patch job does nothing twice.
    ///
    /// # Errors
    /// `Permanent` when the node is not provisioned or the patch failed on it (it keeps its old
    /// version); `HostFailed` when Metal3 failed the reimage; `Transient` when the site cannot
    /// take it now (e.g. no cluster for a container).
    fn patch_node(&self, req: &PatchRequest) -> impl Future<Output = Result<PatchOutcome, BackendError>> + Send;

    /// Whether the node runs the package's version already (then a patch has nothing to do, and
    /// nothing needs moving off the node first).
    fn runs(&self, node: &str, package: &Package) -> impl Future<Output = Result<bool, BackendError>> + Send;

    /// Makes the node unschedulable in the application cluster, marked as landfall's doing.
    fn cordon(&self, node: &str) -> impl Future<Output = Result<Cordon, BackendError>> + Send;

    /// Evicts the node's pods through the Eviction API, which honours their disruption budgets,
    /// and returns once they are gone, naming them (`namespace/name`). DaemonSet and static
    /// pods stay.
    ///
    /// # Errors
    /// `Permanent` when the drain time-out passes with pods still there (a budget that allows
    /// no disruption, named with its message), or when pods no controller would bring back are
    /// on the node and the site's policy refuses to evict them.
    fn drain(&self, node: &str) -> impl Future<Output = Result<Vec<String>, BackendError>> + Send;

    /// Whether landfall's cordon is on the node (an earlier attempt's, when a job comes again).
    fn cordoned(&self, node: &str) -> impl Future<Output = Result<bool, BackendError>> + Send;

    /// Makes the node schedulable again if landfall cordoned it; `false` when it did not (or
    /// the node is not in the cluster).
    fn uncordon(&self, node: &str) -> impl Future<Output = Result<bool, BackendError>> + Send;

    /// Those of `nodes` the application cluster does not have `Ready` now.
    fn not_ready(&self, nodes: &[String]) -> impl Future<Output = Result<Vec<String>, BackendError>> + Send;

    /// Waits until the cluster shows the node `Ready`, and, for a kubelet, reporting the
    /// package's version.
    ///
    /// # Errors
    /// `Permanent` when the ready time-out passes first, saying what the node showed.
    fn observe_patched(&self, node: &str, package: &Package) -> impl Future<Output = Result<(), BackendError>> + Send;

    /// The Metal3 provisioning state of the node's host now (`registering` for one Metal3 has
    /// not written a state for yet); `None` when the site has no host of that name.
    fn host_state(&self, node: &str) -> impl Future<Output = Result<Option<ProvisioningState>, BackendError>> + Send;

    /// The names of the hosts the site has (every BareMetalHost landfall manages there).
    fn host_names(&self) -> impl Future<Output = Result<Vec<String>, BackendError>> + Send;

    /// Deletes the node's `Node` from the application cluster; `false` when the cluster has none
    /// (never joined, deleted before, or no cluster).
    fn delete_node(&self, node: &str) -> impl Future<Output = Result<bool, BackendError>> + Send;

    /// Takes the OS off the node's host: Metal3 deprovisions it (its disks cleaned as `cleaning`
    /// says, the host's own `automatedCleaningMode` when unspecified) and this returns once the
    /// host is `available`, each state it passes sent on `progress`. `false` when the site has no
    /// host of that name.
    ///
    /// # Errors
    /// `HostFailed` when Metal3 reports an error for the host; `Permanent` on a time-out.
    fn deprovision_host(
        &self,
        node: &str,
        cleaning: pb::CleaningMode,
        progress: mpsc::UnboundedSender<ProvisioningState>,
    ) -> impl Future<Output = Result<bool, BackendError>> + Send;

    /// When a cluster builder holds the node's host (Cluster API: a machine claimed it), takes
    /// the node away through it and returns once the host is free (`available`, claimed by
    /// nobody), each state it passes sent on `progress`: the node's machine deleted, and, when
    /// the node is `leaving` the site, its node set one smaller and the host no longer offered
    /// to it; otherwise the set makes a new machine, which claims the host again. `false` when no
    /// builder holds the host (it is deprovisioned as any other).
    fn release_host(
        &self,
        node: &str,
        leaving: bool,
        progress: mpsc::UnboundedSender<ProvisioningState>,
    ) -> impl Future<Output = Result<bool, BackendError>> + Send {
        let _ = (node, leaving, progress);
        async { Ok(false) }
    }

    /// What the site's cluster is, for the hub to render its helm charts for: its Kubernetes
    /// version and the API versions it serves. Empty when there is no cluster yet (the hub then
    /// renders for the design's Kubernetes version).
    fn cluster_facts(&self) -> impl Future<Output = Result<ClusterFacts, BackendError>> + Send {
        async { Ok(ClusterFacts::default()) }
    }

    /// Checks each helm chart's release at the site against the render applied last: what is
    /// missing or changed, one [`pb::ChartDrifted`] per chart (its `drifted` empty when none),
    /// put back first where the package says so. None at a site that runs no charts.
    fn check_drift(&self) -> impl Future<Output = Result<Vec<bus_schema::pb::ChartDrifted>, BackendError>> + Send {
        async { Ok(Vec::new()) }
    }

    /// How often the gateway checks for drift by itself (`None`: only when asked).
    fn drift_every(&self) -> Option<std::time::Duration> {
        None
    }

    /// Takes down a cluster a builder made (Cluster API: the `Cluster` deleted, waited for until
    /// Cluster API has deleted its machines and freed their hosts, then the rest landfall wrote
    /// for it). Returns what it deleted, as `kind/name`, sorted (empty when there was none).
    fn take_cluster_down(&self) -> impl Future<Output = Result<Vec<String>, BackendError>> + Send {
        async { Ok(Vec::new()) }
    }

    /// Deletes the node's host and what the site keeps for it alone: its BareMetalHost, the
    /// Secrets landfall made for it (BMC credentials, user data, network data), its entry in the
    /// BPA's `Provisioning`. The deletion is landfall's own doing: it is not announced as a host
    /// that departed. `false` when nothing of it was there.
    fn forget_host(&self, node: &str) -> impl Future<Output = Result<bool, BackendError>> + Send;

    /// Deletes what the site keeps for its cluster as a whole: the BPA's `Provisioning` and
    /// `Software`, the cluster's kubeconfig Secret, and any other Secret landfall wrote there.
    /// Returns what it deleted, as `kind/name`, sorted (empty when nothing was left).
    fn tear_down_cluster(&self) -> impl Future<Output = Result<Vec<String>, BackendError>> + Send;

    /// Hosts the site gained (a new BareMetalHost) or lost (one deleted), for the gateway to
    /// announce: every change not yet announced, then each new one as it happens. A change
    /// whose [`HostNotice::announced`] is told is not heard again, not even after a restart
    /// where the backend can remember that (a real site marks the host itself); the simulation
    /// forgets, so whoever announces must do so idempotently.
    fn host_changes(&self) -> mpsc::UnboundedReceiver<HostNotice>;
}

/// A host the site gained or lost.
#[derive(Debug, Clone, PartialEq)]
pub enum HostChange {
    /// A host appeared that the site's design may not have: announced as `NodeAdded`.
    /// `incarnation` tells this host apart from an earlier one of the same name and MAC (a
    /// BareMetalHost's uid; empty where hosts have none).
    Arrived { node: Box<NodeDesign>, hardware: Option<pb::HostHardware>, incarnation: String },
    /// A host was deleted: announced as `NodeRemoved`.
    Departed { node: String, boot_mac: String, reason: String, incarnation: String },
}

/// A [`HostChange`] to announce, and who to tell once the bus holds the announcement.
#[derive(Debug)]
pub struct HostNotice {
    pub change: HostChange,
    /// Told once the announcement is on the bus (never when it could not be made).
    pub announced: Option<oneshot::Sender<()>>,
}

impl HostNotice {
    /// A host arrival nobody needs to hear back about.
    pub fn arrived(node: NodeDesign) -> Self {
        Self {
            change: HostChange::Arrived { node: Box::new(node), hardware: None, incarnation: String::new() },
            announced: None,
        }
    }

    /// The node that arrived, when this is an arrival.
    pub fn into_arrival(self) -> Option<NodeDesign> {
        match self.change {
            HostChange::Arrived { node, .. } => Some(*node),
            HostChange::Departed { .. } => None,
        }
    }
}
