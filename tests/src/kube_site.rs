//! A site on a real Kubernetes API server, for the gateway's kube backend: the hub's services
//! in this process on a real nats-server, the real `landfall-gateway` program with
//! `--backend kube` (or the backend itself, [`KubeSiteRig::kube_site`]), and stand-ins for what
//! the API server alone does not run (Metal3's operator moving hosts along the upstream state
//! machine and deleting them, the BPA writing the cluster's admin.conf once it has a
//! `Provisioning`, and the kubelets).
//!
//! ```text
//! let mut site = KubeSiteRig::start().await;
//! site.start_gateway();
//! site.create_host("m-1", "master", MAC, "10.0.0.11").await;
//! ```

use producers::embedded::tied;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bus_schema::domain::SiteDesign;
use bus_schema::pb::{self, BusEvent, BusMessage};
use bus_schema::runtime::{Bus, Envelope, ReadEvent, Topology};
use consumers::artifacts::ArtifactStore;
use futures::StreamExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use serde_json::{Value, json};
use site_gateway::kube_site::metal3::BareMetalHost;
use site_gateway::kube_site::{KubeSite, KubeSiteConfig};
use tempfile::TempDir;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::kube::KubeApiServer;
use crate::nats::NatsServer;

pub mod capi;
mod kubelets;
pub use capi::CapiKnobs;
pub use kubelets::KubeletKnobs;
use kubelets::kubelets;

pub const SITE: &str = "edge-k1";
pub const NAMESPACE: &str = "metal3";
/// The application cluster's namespace for container packages.
pub const APPS: &str = "apps";
/// The Secret [`KubeSiteRig::kube_site`] reads the application cluster's kubeconfig from.
pub const CLUSTER_KUBECONFIG: &str = "edge-k1-kubeconfig";
/// The finalizer Metal3's operator puts on every host it manages, and takes off once it has
/// powered a deleted host off and forgotten it.
pub const METAL3_FINALIZER: &str = "baremetalhost.metal3.io";
/// The field manager of the Metal3 stand-in's writes to hosts' metadata.
const METAL3_MANAGER: &str = "metal3-baremetal-controller";

/// A kind for container packages' manifests (the API server serves custom resources only):
/// namespaced, with a typed `spec` the schema checks.
pub const WIDGET_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.apps.landfall.test
spec:
  group: apps.landfall.test
  scope: Namespaced
  names: {kind: Widget, plural: widgets, singular: widget, listKind: WidgetList}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              replicas: {type: integer, minimum: 0}
              image: {type: string}
"#;

/// The manifests of the rig's container package `edge-apps`.
pub fn widget_manifests(names: &[&str], replicas: u32) -> String {
    names
        .iter()
        .map(|n| {
            format!(
                "apiVersion: apps.landfall.test/v1\nkind: Widget\nmetadata:\n  name: {n}\n  namespace: {APPS}\nspec:\n  replicas: {replicas}\n  image: registry.local/{n}:1\n"
            )
        })
        .collect::<Vec<_>>()
        .join("---\n")
}

pub struct KubeSiteRig {
    pub nats: NatsServer,
    pub kube: KubeApiServer,
    pub bus: Bus,
    pub client: kube::Client,
    pub dir: TempDir,
    pub store: ArtifactStore,
    /// What the Metal3 stand-in does besides its state machine: the hosts it fails, and those
    /// it holds in a state.
    pub metal3: Metal3Knobs,
    pub kubelets: KubeletKnobs,
    /// The BPA REST API the gateway hands staged artifacts to, when set before it starts.
    pub bpa_url: Option<String>,
    /// A site Cluster API builds ([`KubeSiteRig::start_capi`]): the workload cluster it builds,
    /// and what the Cluster API stand-in is told.
    pub workload: Option<KubeApiServer>,
    pub capi: CapiKnobs,
    /// The gateway's `--provision-timeout` and `--install-timeout` (60s each unless set before
    /// it starts).
    pub provision_timeout: String,
    pub install_timeout: String,
    gateway: Option<Child>,
    shutdown: CancellationToken,
    tasks: JoinSet<()>,
}

impl KubeSiteRig {
    /// The hub (orchestrator, observer, secrets, distribution), the catalog (demo OS and
    /// binaries by metadata, the container package `edge-apps` with real manifests) and site
    /// [`SITE`] registered with one master, `m-1`; the Metal3 and BPA stand-ins running.
    pub async fn start() -> Self {
        Self::start_site(false).await
    }

    /// The hub and catalog as [`Self::start`] has them, and site [`SITE`] built by Cluster API
    /// ([`capi_design`]: three masters and two workers, whose hosts the test creates), in a
    /// bootstrap cluster serving the upstream Cluster API and CAPM3 CRDs, with the Cluster API
    /// stand-in ([`capi`]) building the workload cluster in a second API server.
    pub async fn start_capi() -> Self {
        Self::start_site(true).await
    }

    /// [`Self::start_capi`] with a bootstrap cluster that does not serve Cluster API: its CRDs
    /// are not installed.
    pub async fn start_capi_without_providers() -> Self {
        Self::start_with(true, false).await
    }

    async fn start_site(capi: bool) -> Self {
        Self::start_with(capi, capi).await
    }

    /// The rig, its site built by Cluster API (`capi`) or the BPA, its bootstrap cluster serving
    /// Cluster API and CAPM3 when `providers`.
    async fn start_with(capi: bool, providers: bool) -> Self {
        crate::fleet::init_tracing();
        consumers::artifacts::install_tls_provider();
        let nats = NatsServer::start();
        let (kube, workload) = match capi {
            false => (KubeApiServer::start().await, None),
            true => {
                let (kube, workload) = tokio::join!(KubeApiServer::start(), KubeApiServer::start());
                if providers {
                    capi::install_crds(&kube).await;
                }
                workload.install_crd(WIDGET_CRD).await;
                (kube, Some(workload))
            }
        };
        kube.install_crd(WIDGET_CRD).await;
        let client = kube.client().await;
        let bus = Bus::connect(&nats.url(), "landfall-test").await.expect("connect");
        bus.ensure_topology(&Topology::default()).await.expect("topology");
        let dir = tempfile::tempdir().expect("a temporary directory");
        let shutdown = CancellationToken::new();
        let mut tasks = JoinSet::new();
        let mut spawn = |f: std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<()>> + Send>>| {
            tasks.spawn(async move {
                if let Err(e) = f.await {
                    tracing::warn!(error = %e, "a hub service stopped");
                }
            });
        };
        spawn(Box::pin(consumers::run_orchestrator(bus.clone(), Default::default(), shutdown.clone())));
        spawn(Box::pin(consumers::run_observer(bus.clone(), shutdown.clone())));
        let ring = crate::secrets::test_key_ring(dir.path());
        spawn(Box::pin(consumers::secrets_service::run_secrets(bus.clone(), ring, shutdown.clone())));
        let store = ArtifactStore::local(&dir.path().join("artifacts")).expect("store");
        let dist = consumers::run_distribution(bus.clone(), store.clone(), Default::default(), shutdown.clone());
        spawn(Box::pin(dist));

        let mut rig = Self {
            nats,
            kube,
            bus,
            client,
            dir,
            store,
            metal3: Metal3Knobs::default(),
            kubelets: KubeletKnobs::default(),
            bpa_url: None,
            workload,
            capi: CapiKnobs::default(),
            provision_timeout: "60s".into(),
            install_timeout: "60s".into(),
            gateway: None,
            shutdown,
            tasks,
        };
        rig.register(capi).await;
        if let Some(workload) = &rig.workload {
            let kubeconfig = std::fs::read(workload.kubeconfig_path()).expect("the workload cluster's kubeconfig");
            rig.tasks.spawn(capi::controllers(
                rig.client.clone(),
                workload.client().await,
                kubeconfig,
                rig.capi.clone(),
                rig.kubelets.clone(),
                rig.shutdown.clone(),
            ));
        }
        rig.tasks.spawn(metal3_operator(rig.client.clone(), rig.metal3.clone(), rig.shutdown.clone()));
        rig.tasks.spawn(bpa_stand_in(
            rig.client.clone(),
            rig.kube.kubeconfig_path().to_path_buf(),
            rig.admin_conf(),
            rig.shutdown.clone(),
        ));
        rig.tasks.spawn(kubelets(rig.client.clone(), rig.kubelets.clone(), rig.shutdown.clone()));
        rig
    }

    /// Where the BPA stand-in writes the application cluster's kubeconfig.
    pub fn admin_conf(&self) -> PathBuf {
        self.dir.path().join("bpa").join("admin.conf")
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("gateway-state")
    }

    pub fn hosts_ini(&self) -> String {
        std::fs::read_to_string(self.state_dir().join(SITE).join("hosts.ini")).unwrap_or_default()
    }

    async fn register(&self, capi: bool) {
        let mut catalog: Vec<pb::Package> = producers::up::demo_packages()
            .into_iter()
            .filter(|p| p.kind != pb::PackageKind::Container as i32)
            .collect();
        catalog.push(self.upload_container("edge-apps", "1.0.0", &widget_manifests(&["alpha", "beta"], 2)).await);
        let mut last = Envelope::root();
        for p in &catalog {
            last = Envelope::root();
            let cmd = pb::RegisterPackage { package: Some(p.clone()), auto_rollout: None };
            self.bus.publish_command(&cmd, &last).await.unwrap();
        }
        self.wait_for(pb::PackageRegistered::filter(), &last.id).await.expect("catalog registered");
        let set: Vec<pb::PackageRef> =
            catalog.iter().map(|p| pb::PackageRef { name: p.name.clone(), version: p.version.clone() }).collect();
        let design = pb::SiteDesign {
            site_id: SITE.into(),
            labels: Default::default(),
            nodes: vec![pb::NodeSpec { network: Some(m1_network()), ..node_spec("m-1", pb::Role::Master, &mac(1)) }],
            packages: [pb::Role::Master, pb::Role::Worker]
                .into_iter()
                .map(|role| pb::RolePackages { role: role as i32, packages: set.clone() })
                .collect(),
            cluster: None,
            chart_values: Default::default(),
            maintenance_windows: Vec::new(),
        };
        let design = if capi { capi_design(design) } else { design };
        SiteDesign::try_from(design.clone()).expect("a valid design");
        let env = Envelope::root();
        self.bus.publish_command(&pb::RegisterSite { design: Some(design), expected: None }, &env).await.unwrap();
        self.wait_for(pb::SiteRegistered::filter(), &env.id).await.expect("site registered");
    }

    /// Uploads a container package's manifests to the artifact store: its catalog entry.
    pub async fn upload_container(&self, name: &str, version: &str, manifests: &str) -> pb::Package {
        let stored = self.store.upload(manifests.as_bytes()).await.expect("upload manifests");
        pb::Package {
            name: name.into(),
            version: version.into(),
            kind: pb::PackageKind::Container as i32,
            sha256: stored.sha256,
            size: stored.size,
            object_key: stored.object_key,
            chart: None,
            render: None,
        }
    }

    /// Starts the real `landfall-gateway --backend kube` for [`SITE`]: for a site Cluster API
    /// builds, the application cluster's kubeconfig is the Secret Cluster API writes.
    pub fn start_gateway(&mut self) {
        assert!(self.gateway.is_none(), "a gateway is running already");
        let binary = crate::cli::binary().with_file_name("landfall-gateway-cli");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("gateway.log"))
            .expect("gateway log");
        let mut command = tied::command(binary);
        if let Some(url) = &self.bpa_url {
            command.args(["--bpa-url", url]);
        }
        if self.workload.is_none() {
            command.arg("--cluster-kubeconfig-file").arg(self.admin_conf());
        }
        command
            .args(["--site", SITE, "--backend", "kube", "--namespace", NAMESPACE])
            .arg("--kubeconfig")
            .arg(self.kube.kubeconfig_path())
            .arg("--cache-dir")
            .arg(self.dir.path().join("cache"))
            .arg("--state-dir")
            .arg(self.state_dir())
            .args(["--user-data-secret", "edge-user-data", "--image-base-url", "http://10.0.0.2:8080/"])
            .args(["--kud-plugin", "emco"])
            .args(["--provision-timeout", &self.provision_timeout, "--install-timeout", &self.install_timeout])
            .args(["--drain-timeout", "4s", "--ready-timeout", "20s"])
            .env("NATS_URL", self.nats.url())
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()))
            .stdout(Stdio::null())
            .stderr(log);
        let child = tied::spawn(command).expect("start landfall-gateway");
        self.gateway = Some(child);
    }

    /// Kills the gateway (SIGKILL) and waits for it.
    pub fn kill_gateway(&mut self) {
        if let Some(mut child) = self.gateway.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn gateway_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("gateway.log")).unwrap_or_default()
    }

    /// The kube backend itself in this process, on the rig's API server: what the gateway runs,
    /// as `start_gateway` configures it, but for the application cluster's kubeconfig, read from
    /// the Secret [`CLUSTER_KUBECONFIG`] ([`Self::put_cluster_kubeconfig`]), and the hosts' user
    /// data, which it generates.
    pub fn kube_site(&self) -> KubeSite {
        let mut cfg = KubeSiteConfig::new(SITE, NAMESPACE, self.state_dir());
        cfg.image_base_url = "http://10.0.0.2:8080/".into();
        cfg.kud_plugins = vec!["emco".into()];
        cfg.provision_timeout = Duration::from_secs(60);
        cfg.install_timeout = Duration::from_secs(60);
        cfg.drain_timeout = Duration::from_secs(4);
        cfg.ready_timeout = Duration::from_secs(20);
        cfg.poll = Duration::from_millis(100);
        let cache = site_gateway::ArtifactCache::new(self.dir.path().join("cache"));
        KubeSite::new(self.client.clone(), cfg, cache).expect("a kube backend")
    }

    /// Writes the application cluster's kubeconfig (this same API server) to the Secret
    /// [`CLUSTER_KUBECONFIG`], key `value`, as Cluster API leaves it.
    pub async fn put_cluster_kubeconfig(&self) {
        use k8s_openapi::api::core::v1::Secret;
        let bytes = std::fs::read(self.kube.kubeconfig_path()).expect("the rig's kubeconfig");
        let secret = Secret {
            metadata: kube::api::ObjectMeta { name: Some(CLUSTER_KUBECONFIG.into()), ..Default::default() },
            data: Some([("value".to_string(), k8s_openapi::ByteString(bytes))].into()),
            ..Default::default()
        };
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), NAMESPACE);
        secrets.create(&PostParams::default(), &secret).await.expect("create the kubeconfig Secret");
    }

    pub fn hosts(&self) -> Api<BareMetalHost> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    /// A running pod on `node` in `default`, owned by a controller of `owner_kind` (none: a
    /// bare pod).
    pub async fn run_pod(&self, name: &str, node: &str, owner_kind: Option<&str>, labels: Value) {
        use k8s_openapi::api::core::v1::Pod;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), "default");
        let mut body = json!({"metadata": {"name": name, "labels": labels},
                              "spec": {"nodeName": node, "containers": [{"name": "c", "image": "registry.example/c:1"}]}});
        if let Some(kind) = owner_kind {
            body["metadata"]["ownerReferences"] =
                json!([{"apiVersion": "apps/v1", "kind": kind, "name": "owner", "uid": "0000", "controller": true}]);
        }
        pods.create(&Default::default(), &serde_json::from_value(body).expect("a pod")).await.expect("create the pod");
        let running = json!({"status": {"phase": "Running"}});
        pods.patch_status(name, &Default::default(), &Patch::Merge(&running)).await.expect("the pod runs");
    }

    /// The pods in `default`, by name.
    pub async fn pod_names(&self) -> Vec<String> {
        use k8s_openapi::api::core::v1::Pod;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), "default");
        let list = pods.list(&Default::default()).await.expect("list pods");
        list.items.into_iter().filter_map(|p| p.metadata.name).collect()
    }

    /// Creates a BareMetalHost as an operator would (BMC, boot MAC, role label) and walks it,
    /// as Metal3 does, through registering and inspecting to available, with hardware details
    /// whose boot NIC has `ip`.
    pub async fn create_host(&self, name: &str, role: &str, mac: &str, ip: &str) {
        let host: BareMetalHost = serde_json::from_value(json!({
            "apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"landfall.io/role": role}},
            "spec": {"online": true, "bootMACAddress": mac,
                     "bmc": {"address": format!("redfish://10.9.0.{}/redfish/v1/Systems/1", ip.rsplit('.').next().unwrap_or("1")),
                             "credentialsName": format!("{name}-bmc-secret")}}
        }))
        .unwrap();
        self.hosts().create(&PostParams::default(), &host).await.expect("create the BareMetalHost");
        self.inspect_host(name, mac, ip).await;
    }

    /// Walks host `name` (created by anyone), as Metal3 does, through registering and
    /// inspecting to available, with hardware details whose boot NIC (`eno1`) has `mac` and
    /// `ip`, beside a second NIC `eno2`.
    pub async fn inspect_host(&self, name: &str, mac: &str, ip: &str) {
        for state in ["registering", "inspecting"] {
            set_status(&self.hosts(), name, status(state, None, None)).await;
        }
        let hardware = json!({
            "cpu": {"arch": "x86_64", "model": "Intel Xeon Gold 6230", "clockMegahertz": 2100.0, "count": 40, "flags": []},
            "ramMebibytes": 196608,
            "systemVendor": {"manufacturer": "Dell Inc.", "productName": "PowerEdge R640", "serialNumber": format!("SN-{name}")},
            "nics": [{"name": "eno1", "mac": mac, "ip": ip, "speedGbps": 25, "model": "0x8086 0x1572", "pxe": true},
                     {"name": "eno2", "mac": "52:54:00:ff:ff:01", "ip": "", "speedGbps": 25, "model": "0x8086 0x1572", "pxe": false}],
            "storage": [], "hostname": name,
            "firmware": {"bios": {"date": "01/01/2024", "vendor": "Dell Inc.", "version": "2.19.1"}}
        });
        set_status(&self.hosts(), name, status("available", Some(hardware), None)).await;
    }

    /// Installs [`SITE`] through the bus (an `InstallSite`) and returns every event of the
    /// install, in order, up to its end (installed, failed or refused), waiting up to `timeout`.
    pub async fn install(&self, timeout: Duration) -> Vec<ReadEvent> {
        let env = Envelope::root();
        self.bus.publish_command(&pb::InstallSite { site_id: SITE.into(), design_revision: 0 }, &env).await.unwrap();
        let ends = [pb::SiteInstalled::TYPE, pb::SiteInstallFailed::TYPE, pb::CommandRejected::TYPE];
        let scope = bus_schema::names::scope_events(SITE);
        crate::fleet::collect(&self.bus, scope, "install", &env.id, &ends, timeout).await.events
    }

    /// Waits for an event of `filter` correlated with `correlation`.
    pub async fn wait_for(&self, filter: String, correlation: &str) -> Option<ReadEvent> {
        crate::fleet::wait_for(&self.bus, filter, correlation, Duration::from_secs(30)).await
    }

    /// Every command on the bus of type `M` so far.
    pub async fn commands<M: BusMessage + prost::Message + Default>(&self) -> Vec<M> {
        self.messages(bus_schema::names::COMMANDS_STREAM).await
    }

    /// Every event on the bus of type `M` so far.
    pub async fn events<M: BusMessage + prost::Message + Default>(&self) -> Vec<M> {
        self.messages(bus_schema::names::EVENTS_STREAM).await
    }

    async fn messages<M: BusMessage + prost::Message + Default>(&self, stream: &str) -> Vec<M> {
        let stream = self.bus.jetstream().get_stream(stream).await.unwrap();
        let info = stream.get_info().await.unwrap();
        let mut out = Vec::new();
        for seq in 1..=info.state.last_sequence {
            let Ok(msg) = stream.get_raw_message(seq).await else { continue };
            let ty = msg.headers.get(bus_schema::names::headers::TYPE).map(|v| v.as_str().to_string());
            if ty.as_deref() == Some(M::TYPE) {
                out.push(M::decode(msg.payload).unwrap());
            }
        }
        out
    }

    /// The site's design as the orchestrator holds it: its node names.
    pub async fn design_nodes(&self) -> BTreeSet<String> {
        let sites = self.bus.kv(bus_schema::names::SITES_BUCKET).await.unwrap();
        let (design, _) = sites.get::<pb::SiteDesign>(&bus_schema::names::keys::site(SITE)).await.unwrap().unwrap();
        design.nodes.into_iter().map(|n| n.name).collect()
    }

    /// Waits until `check` holds of the design's nodes.
    pub async fn wait_design(&self, check: impl Fn(&BTreeSet<String>) -> bool) -> BTreeSet<String> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let nodes = self.design_nodes().await;
            if check(&nodes) || tokio::time::Instant::now() > deadline {
                return nodes;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for KubeSiteRig {
    fn drop(&mut self) {
        self.kill_gateway();
        self.shutdown.cancel();
        if std::thread::panicking() {
            let log = self.gateway_log();
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            eprintln!("--- landfall-gateway log (last lines) ---");
            for line in tail.into_iter().rev() {
                eprintln!("{line}");
            }
        }
    }
}

/// The rig's site built by Cluster API: `design`'s packages, three masters `m-1`..`m-3` and two
/// workers `w-1`, `w-2` (boot MACs `mac(1)`..`mac(5)`), the control plane at 10.1.0.100:6443.
pub fn capi_design(design: pb::SiteDesign) -> pb::SiteDesign {
    use bus_schema::domain::{ApiEndpoint, Builder, ClusterBuild};
    let nodes = [("m-1", pb::Role::Master), ("m-2", pb::Role::Master), ("m-3", pb::Role::Master)]
        .into_iter()
        .chain([("w-1", pb::Role::Worker), ("w-2", pb::Role::Worker)])
        .zip(1..)
        .map(|((name, role), i)| node_spec(name, role, &mac(i)))
        .collect();
    let build = ClusterBuild {
        builder: Builder::Capi,
        endpoint: Some(ApiEndpoint { host: "10.1.0.100".parse().unwrap(), port: 6443 }),
        ..Default::default()
    };
    pb::SiteDesign { nodes, cluster: Some(pb::ClusterBuild::from(&build.with_defaults(3))), ..design }
}

/// `52:54:00:10:00:NN`
pub fn mac(i: u8) -> String {
    format!("52:54:00:10:00:{i:02x}")
}

pub fn node_spec(name: &str, role: pb::Role, mac: &str) -> pb::NodeSpec {
    pb::NodeSpec {
        name: name.into(),
        role: role as i32,
        boot_mac: mac.into(),
        bmc_address: "redfish://10.9.0.1/redfish/v1/Systems/1".into(),
        labels: Default::default(),
        root_device: Some(pb::RootDeviceHints { device_name: "/dev/sda".into(), min_size_gigabytes: 100 }),
        ..Default::default()
    }
}

/// m-1's networks in the rig's design: its boot port on the provisioning network at a static
/// address (with the default route and a name server), and a VLAN on its second port, on DHCP.
pub fn m1_network() -> pb::NodeNetwork {
    let iface = |name: &str, network: &str, address: &str| pb::NodeInterface {
        name: name.into(),
        network: network.into(),
        address: address.into(),
        ..Default::default()
    };
    pb::NodeNetwork {
        interfaces: vec![
            iface("eno1", "provisioning", "10.1.0.11"),
            iface("eno2", "", ""),
            pb::NodeInterface { vlan_id: 200, vlan_parent: "eno2".into(), ..iface("eno2.200", "tenant", "") },
        ],
        networks: vec![
            pb::SiteNetwork {
                name: "provisioning".into(),
                cidr: "10.1.0.0/24".into(),
                gateway: "10.1.0.1".into(),
                nameservers: vec!["10.1.0.2".into()],
                ..Default::default()
            },
            pb::SiteNetwork { name: "tenant".into(), cidr: "10.20.0.0/24".into(), ..Default::default() },
        ],
    }
}

/// A whole BareMetalHost status as Metal3 writes it (the CRD requires these fields).
pub fn status(state: &str, hardware: Option<Value>, image: Option<Value>) -> Value {
    let mut s = json!({
        "operationalStatus": "OK", "errorCount": 0, "errorMessage": "", "poweredOn": state == "provisioned",
        "provisioningFailCount": 0, "goodCredentials": {}, "triedCredentials": {},
        "provisioning": {"ID": "ironic-node-id", "state": state, "bootMode": "UEFI"},
        "lastUpdated": "2026-01-01T00:00:00Z"
    });
    if let Some(hw) = hardware {
        s["hardware"] = hw;
    }
    if let Some(image) = image {
        s["provisioning"]["image"] = image;
    }
    s
}

/// Replaces the host's status (keeping its hardware when `status` has none).
pub async fn set_status(hosts: &Api<BareMetalHost>, name: &str, mut status: Value) {
    if status.get("hardware").is_none()
        && let Ok(h) = hosts.get(name).await
        && let Some(hw) = h.status.as_ref().and_then(|s| s.hardware.as_ref())
    {
        status["hardware"] = serde_json::to_value(hw).unwrap();
    }
    let patch = json!({"status": status});
    hosts.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("write the host's status");
}

/// What the Metal3 stand-in is told, shared with the test.
#[derive(Debug, Clone, Default)]
pub struct Metal3Knobs {
    /// Hosts it fails while provisioning: name → errorMessage.
    pub failing: Arc<Mutex<std::collections::BTreeMap<String, String>>>,
    /// (host, state): the host stays in that state (`provisioning`, `deprovisioning`) until the
    /// pair is taken out.
    pub holding: Arc<Mutex<BTreeSet<(String, String)>>>,
    /// Per host, the provisionings started (an image given to an available host), by image URL.
    pub provisions: Arc<Mutex<std::collections::BTreeMap<(String, String), u32>>>,
    pub cleanings: Arc<Mutex<Vec<(String, String)>>>,
}

impl Metal3Knobs {
    pub fn hold(&self, host: &str, state: &str) {
        self.holding.lock().unwrap().insert((host.to_string(), state.to_string()));
    }

    pub fn release(&self, host: &str, state: &str) {
        self.holding.lock().unwrap().remove(&(host.to_string(), state.to_string()));
    }

    /// How many provisionings of `host` with the image at `url` started.
    /// The hosts deprovisioned so far and the cleaning each got (`metadata` unless the host said
    /// otherwise, as Metal3's default), in order.
    pub fn cleanings(&self) -> Vec<(String, String)> {
        self.cleanings.lock().unwrap().clone()
    }

    pub fn provisions_of(&self, host: &str, url: &str) -> u32 {
        self.provisions.lock().unwrap().get(&(host.to_string(), url.to_string())).copied().unwrap_or(0)
    }

    /// After writing `state`: waits while the test holds the host there.
    async fn dwell(&self, host: &str, state: &str) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let key = (host.to_string(), state.to_string());
        while self.holding.lock().unwrap().contains(&key) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Metal3's part, as its state machine has it: a host given an image while `available` goes
/// `provisioning` → `provisioned` (or, for a failing host, `provisioning` → error, then
/// `deprovisioning`); a provisioned host whose image is taken away goes `deprovisioning` →
/// `available`. Every host gets Metal3's finalizer; a deleted one is deprovisioned first if it
/// has its OS, then goes `powering off before delete` → `deleting`, and the finalizer comes off.
async fn metal3_operator(client: kube::Client, knobs: Metal3Knobs, shutdown: CancellationToken) {
    let hosts: Api<BareMetalHost> = Api::namespaced(client, NAMESPACE);
    let mut events =
        watcher::watcher(hosts.clone(), watcher::Config::default()).default_backoff().applied_objects().boxed();
    loop {
        let host = tokio::select! {
            _ = shutdown.cancelled() => return,
            h = events.next() => match h { Some(Ok(h)) => h, Some(Err(_)) => continue, None => return },
        };
        let name = host.metadata.name.clone().unwrap_or_default();
        // Reconciled from the host as it is now, as Metal3 does: an event queued behind the
        // stand-in's own writes shows a state it has left already.
        let Ok(Some(host)) = hosts.get_opt(&name).await else { continue };
        if host.metadata.deletion_timestamp.is_some() {
            delete_host(&hosts, &name, &knobs).await;
            continue;
        }
        if !host.metadata.finalizers.iter().flatten().any(|f| f == METAL3_FINALIZER) {
            metal3_finalizer(&hosts, &name, true).await;
        }
        let state = host.status.as_ref().map(|s| s.provisioning.state.clone()).unwrap_or_default();
        let image = host.spec.image.clone().filter(|i| !i.url.is_empty());
        let has_error = host.status.as_ref().is_some_and(|s| !s.error_type.is_empty());
        match (state.as_str(), image) {
            ("available", Some(image)) if !has_error => {
                *knobs.provisions.lock().unwrap().entry((name.clone(), image.url.clone())).or_default() += 1;
                set_status(&hosts, &name, status("provisioning", None, None)).await;
                knobs.dwell(&name, "provisioning").await;
                let failure = knobs.failing.lock().unwrap().get(&name).cloned();
                match failure {
                    Some(message) => {
                        let mut s = status("deprovisioning", None, None);
                        s["operationalStatus"] = json!("error");
                        s["errorType"] = json!("provisioning error");
                        s["errorMessage"] = json!(message);
                        s["errorCount"] = json!(1);
                        set_status(&hosts, &name, s).await;
                    }
                    None => {
                        let image = serde_json::to_value(&image).unwrap();
                        set_status(&hosts, &name, status("provisioned", None, Some(image))).await;
                    }
                }
            }
            ("provisioned", None) => {
                // How it cleans the disks, as the host says when its image comes off.
                let mode = host.spec.automated_cleaning_mode.clone().unwrap_or_else(|| "metadata".into());
                knobs.cleanings.lock().unwrap().push((name.clone(), mode));
                set_status(&hosts, &name, status("deprovisioning", None, None)).await;
                knobs.dwell(&name, "deprovisioning").await;
                set_status(&hosts, &name, status("available", None, None)).await;
            }
            _ => {}
        }
    }
}

/// Metal3's deletion of host `name`, once it is asked for: a host with its OS is deprovisioned
/// first, then powered off and forgotten; its finalizer comes off last.
async fn delete_host(hosts: &Api<BareMetalHost>, name: &str, knobs: &Metal3Knobs) {
    let Ok(Some(host)) = hosts.get_opt(name).await else { return };
    let ours = host.metadata.finalizers.iter().flatten().any(|f| f == METAL3_FINALIZER);
    if host.metadata.deletion_timestamp.is_none() || !ours {
        return;
    }
    let state = host.status.as_ref().map(|s| s.provisioning.state.clone()).unwrap_or_default();
    if matches!(state.as_str(), "provisioning" | "provisioned") {
        set_status(hosts, name, status("deprovisioning", None, None)).await;
        knobs.dwell(name, "deprovisioning").await;
    }
    for state in ["powering off before delete", "deleting"] {
        set_status(hosts, name, status(state, None, None)).await;
        knobs.dwell(name, state).await;
    }
    metal3_finalizer(hosts, name, false).await;
}

/// Puts Metal3's finalizer on host `name`, or takes it off, as Metal3's own field manager (the
/// finalizers are a set: the others' stay as they are).
async fn metal3_finalizer(hosts: &Api<BareMetalHost>, name: &str, on: bool) {
    let finalizers = if on { json!([METAL3_FINALIZER]) } else { json!([]) };
    let intent = json!({"apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost",
                        "metadata": {"name": name, "namespace": NAMESPACE, "finalizers": finalizers}});
    // The version read goes with the apply: a host gone meanwhile must not be created again.
    // One changed meanwhile is read again.
    for _ in 0..5 {
        let Ok(Some(host)) = hosts.get_opt(name).await else { return };
        let mut intent = intent.clone();
        intent["metadata"]["resourceVersion"] = json!(host.metadata.resource_version);
        match hosts.patch(name, &PatchParams::apply(METAL3_MANAGER), &Patch::Apply(&intent)).await {
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => {
                tracing::warn!(host = name, error = %e, on, "the Metal3 stand-in cannot write its finalizer");
                return;
            }
            Ok(h) => {
                tracing::debug!(host = name, on, finalizers = ?h.metadata.finalizers, "the Metal3 stand-in's finalizer written");
                return;
            }
        }
    }
}

/// The BPA's part: once the cluster has a `Provisioning`, its kubespray run "builds" the
/// cluster, whose admin.conf appears (here: a kubeconfig of the same API server).
async fn bpa_stand_in(client: kube::Client, kubeconfig: PathBuf, admin_conf: PathBuf, shutdown: CancellationToken) {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client, NAMESPACE, &site_gateway::kube_site::bpa::provisioning_resource());
    loop {
        if api.get_opt(SITE).await.ok().flatten().is_some() {
            tokio::time::sleep(Duration::from_millis(200)).await;
            std::fs::create_dir_all(admin_conf.parent().unwrap()).unwrap();
            std::fs::copy(&kubeconfig, &admin_conf).unwrap();
            return;
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}
