//! How the gateway reaches and names a real site's parts ([`KubeSiteConfig`]): its namespace,
//! the BPA's cluster, where images are served from, the hosts' user data, where the cluster's
//! kubeconfig appears, and how long to wait.

use std::path::PathBuf;
use std::time::Duration;

/// Where the application cluster's kubeconfig appears once the BPA has built the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeconfigSource {
    /// A Secret in the site's namespace, key `value` (Cluster API's convention).
    Secret(String),
    /// A file on the bootstrap machine (the BPA's kubespray writes `admin.conf`).
    File(PathBuf),
}

/// The cloud-init user data a provisioned host gets (`spec.userData`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UserData {
    /// The gateway writes a Secret `<host>-user-data` per host: its hostname and these SSH keys
    /// (the BPA's kubespray logs in with them).
    Generated { ssh_authorized_keys: Vec<String> },
    /// Every host references this Secret, which the site's operator provides.
    Existing(String),
}

/// What a drain does with a pod no controller would bring back (no owner: a bare pod).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UnmanagedPods {
    /// The drain fails, naming them: the node is not patched, and is schedulable again.
    #[default]
    Refuse,
    /// They are evicted with the rest, and gone for good.
    Evict,
}

/// How the gateway reaches and names the site's parts.
#[derive(Debug, Clone)]
pub struct KubeSiteConfig {
    pub site: String,
    /// Where the BareMetalHosts and BPA resources live.
    pub namespace: String,
    /// The BPA's owner and cluster labels; the cluster is also the `Provisioning`'s name.
    pub owner: String,
    pub cluster: String,
    pub kud_plugins: Vec<String>,
    pub pod_subnet: String,
    /// Where Ironic downloads os-images from: the site's cache served over HTTP, so the image
    /// URL is this followed by `sha256/<hex>`.
    pub image_base_url: String,
    pub user_data: UserData,
    pub cluster_kubeconfig: KubeconfigSource,
    /// The BPA's REST API, which staged artifacts are handed to; none: nothing is uploaded.
    pub bpa_url: Option<String>,
    /// hosts.ini and the container packages' inventories.
    pub state_dir: PathBuf,
    pub provision_timeout: Duration,
    pub install_timeout: Duration,
    /// How long a node's pods may take to leave it before its patch fails.
    pub drain_timeout: Duration,
    /// How long a patched node may take to show `Ready` at its new version.
    pub ready_timeout: Duration,
    pub unmanaged_pods: UnmanagedPods,
    /// How long a container package's Deployments, DaemonSets and StatefulSets may take to be
    /// available, and its Jobs to complete.
    pub workload_timeout: Duration,
    /// How often the site's helm chart releases are checked against their renders (`None`:
    /// only when an operator asks).
    pub drift_every: Option<Duration>,
    /// How often a drain or a readiness wait looks again.
    pub poll: Duration,
    /// The image of the Job that installs a binary on one node (`sh`, `wget`, `sha256sum`,
    /// `install` and `chroot` in it).
    pub upgrade_image: String,
    /// Where in the application cluster that Job runs.
    pub upgrade_namespace: String,
    /// How long that Job may take before the node's patch fails.
    pub upgrade_timeout: Duration,
}

impl KubeSiteConfig {
    /// A site's settings with the defaults: the BPA cluster named after the site, owned by
    /// `landfall`, images under `http://localhost:8080/`, a kubeconfig Secret `<site>-kubeconfig`.
    pub fn new(site: &str, namespace: &str, state_dir: PathBuf) -> Self {
        Self {
            site: site.to_string(),
            namespace: namespace.to_string(),
            owner: "landfall".into(),
            cluster: site.to_string(),
            kud_plugins: Vec::new(),
            pod_subnet: "10.244.64.0/18".into(),
            image_base_url: "http://localhost:8080/".into(),
            user_data: UserData::Generated { ssh_authorized_keys: Vec::new() },
            cluster_kubeconfig: KubeconfigSource::Secret(format!("{site}-kubeconfig")),
            bpa_url: None,
            state_dir,
            provision_timeout: Duration::from_secs(2 * 3600),
            install_timeout: Duration::from_secs(3 * 3600),
            drain_timeout: Duration::from_secs(15 * 60),
            ready_timeout: Duration::from_secs(15 * 60),
            unmanaged_pods: UnmanagedPods::Refuse,
            workload_timeout: Duration::from_secs(15 * 60),
            drift_every: Some(Duration::from_secs(15 * 60)),
            poll: Duration::from_secs(2),
            upgrade_image: "docker.io/library/busybox:1.36".into(),
            upgrade_namespace: "kube-system".into(),
            upgrade_timeout: Duration::from_secs(15 * 60),
        }
    }
}
