//! The gateway's backend for a real site: Metal3 `BareMetalHost`s and the ICN BPA's custom
//! resources through the site's Kubernetes API (kube-rs), the BPA's REST upload API for
//! staged artifacts, and the site's application cluster for container packages.
//!
//! Every write is a server-side apply under one field manager ([`FIELD_MANAGER`]) of exactly
//! the fields the gateway owns ([`ownership`]), never forced: a field another manager set to
//! another value is a conflict the job reports, not a field the gateway takes over.

pub mod apply;
pub mod bpa;
pub mod bpa_upload;
mod hosts;
pub mod metal3;
pub mod ownership;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use bus_schema::domain::{Package, Role};
use bus_schema::pb;
use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tracing::{debug, info};

use crate::backend::{
    BackendError, ClusterRequest, HostNotice, HostRequest, NodeInstall, PatchOutcome, PatchRequest, ProvisioningState,
    SiteBackend,
};
use crate::cache::{ArtifactCache, CachedArtifact};
use apply::ManifestApplier;
use bpa::{ClusterIdentity, ClusterNode};
use bpa_upload::BpaUploader;
use metal3::BareMetalHost;

/// The one field manager every server-side apply of the gateway uses: the fields it sets are
/// its own, and it never forces fields another manager owns.
pub const FIELD_MANAGER: &str = "landfall-gateway";

/// Annotations and the finalizer the gateway puts on hosts.
pub mod marks {
    /// On a host the gateway created for a node of the site's design: the node's name.
    pub const NODE: &str = "landfall.io/node";
    /// On a host the gateway announced (`NodeAdded`): the command's id.
    pub const ANNOUNCED: &str = "landfall.io/announced";
    /// Keeps a known host until the gateway has announced its removal (`NodeRemoved`).
    pub const FINALIZER: &str = "landfall.io/node-removal";
    /// The node's role for a host that arrives: `master` or `worker` (the default).
    pub const ROLE_LABEL: &str = "landfall.io/role";
    /// What a node runs, one annotation per package: `landfall.io/pkg.<name>: <version>`.
    pub fn package(name: &str) -> String {
        format!("landfall.io/pkg.{name}")
    }
}

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
        }
    }
}

/// A real site, driven through its Kubernetes API.
pub struct KubeSite {
    cfg: KubeSiteConfig,
    hosts: Api<BareMetalHost>,
    secrets: Api<Secret>,
    provisionings: Api<DynamicObject>,
    softwares: Api<DynamicObject>,
    cache: ArtifactCache,
    uploader: Option<BpaUploader>,
}

impl KubeSite {
    /// `client` reaches the site's bootstrap cluster (Metal3 and the BPA); `cache` is the
    /// gateway's artifact cache, where container packages' manifests are read from.
    pub fn new(client: Client, cfg: KubeSiteConfig, cache: ArtifactCache) -> Result<Self, BackendError> {
        let ns = cfg.namespace.as_str();
        let uploader = match &cfg.bpa_url {
            Some(url) => Some(BpaUploader::new(url, &cfg.owner, &cfg.cluster)?),
            None => None,
        };
        Ok(Self {
            hosts: Api::namespaced(client.clone(), ns),
            secrets: Api::namespaced(client.clone(), ns),
            provisionings: Api::namespaced_with(client.clone(), ns, &bpa::provisioning_resource()),
            softwares: Api::namespaced_with(client, ns, &bpa::software_resource()),
            cfg,
            cache,
            uploader,
        })
    }

    fn identity(&self) -> ClusterIdentity {
        ClusterIdentity { owner: self.cfg.owner.clone(), cluster: self.cfg.cluster.clone() }
    }

    /// Where hosts.ini is written.
    pub fn hosts_ini_path(&self) -> PathBuf {
        self.cfg.state_dir.join(&self.cfg.cluster).join("hosts.ini")
    }

    async fn host(&self, name: &str) -> Result<Option<BareMetalHost>, BackendError> {
        self.hosts.get_opt(name).await.map_err(|e| kube_error(&format!("BareMetalHost {name}"), e))
    }

    /// Applies `intent` (the whole of what the gateway owns of the host) to host `name`.
    async fn apply_host(&self, name: &str, intent: &Value) -> Result<BareMetalHost, BackendError> {
        let params = PatchParams::apply(FIELD_MANAGER);
        self.hosts
            .patch(name, &params, &Patch::Apply(intent))
            .await
            .map_err(|e| kube_error(&format!("BareMetalHost {name}"), e))
    }

    /// What the gateway owns of `host` now: the start of its next apply.
    fn intent_of(host: &BareMetalHost) -> Value {
        let object = serde_json::to_value(host).unwrap_or(Value::Null);
        ownership::owned_by(&object, host.managed_fields(), FIELD_MANAGER)
    }

    async fn apply_secret(
        &self,
        name: &str,
        data: BTreeMap<String, ByteString>,
        purpose: &str,
    ) -> Result<(), BackendError> {
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(self.cfg.namespace.clone()),
                labels: Some(BTreeMap::from([("landfall.io/purpose".to_string(), purpose.to_string())])),
                ..Default::default()
            },
            type_: Some("Opaque".into()),
            data: Some(data),
            ..Default::default()
        };
        let mut body = serde_json::to_value(&secret).unwrap_or(Value::Null);
        body["apiVersion"] = json!("v1");
        body["kind"] = json!("Secret");
        let params = PatchParams::apply(FIELD_MANAGER);
        self.secrets
            .patch(name, &params, &Patch::Apply(&body))
            .await
            .map_err(|e| kube_error(&format!("Secret {name}"), e))?;
        Ok(())
    }

    /// The user data Secret `node` references, written first when the gateway generates it.
    async fn user_data_for(&self, node: &str) -> Result<String, BackendError> {
        match &self.cfg.user_data {
            UserData::Existing(name) => Ok(name.clone()),
            UserData::Generated { ssh_authorized_keys } => {
                let name = format!("{node}-user-data");
                let mut cloud_config = format!("#cloud-config\nhostname: {node}\n");
                if !ssh_authorized_keys.is_empty() {
                    cloud_config.push_str("ssh_authorized_keys:\n");
                    for key in ssh_authorized_keys {
                        cloud_config.push_str(&format!("  - {key}\n"));
                    }
                }
                let data = BTreeMap::from([("userData".to_string(), ByteString(cloud_config.into_bytes()))]);
                self.apply_secret(&name, data, "user-data").await?;
                Ok(name)
            }
        }
    }

    /// The intent of a host the site does not have yet: the gateway creates it from the design,
    /// with its BMC credentials in a Secret of its own.
    async fn new_host_intent(&self, req: &HostRequest) -> Result<Value, BackendError> {
        let name = req.node.name.as_str();
        let Some(bmc) = &req.bmc else {
            return Err(BackendError::Permanent(format!(
                "host {name} has no BareMetalHost and the hub holds no BMC credentials to create one (landfall bmc set)"
            )));
        };
        let credentials = format!("{name}-bmc-secret");
        let data = BTreeMap::from([
            ("username".to_string(), ByteString(bmc.username.clone().into_bytes())),
            ("password".to_string(), ByteString(bmc.password.clone().into_bytes())),
        ]);
        self.apply_secret(&credentials, data, "bmc-credentials").await?;
        Ok(json!({
            "apiVersion": "metal3.io/v1alpha1",
            "kind": "BareMetalHost",
            "metadata": {"name": name, "namespace": self.cfg.namespace,
                         "labels": {marks::ROLE_LABEL: role_label(req.node.role)}},
            "spec": {"bootMACAddress": req.node.boot_mac.as_str(),
                     "bmc": {"address": req.node.bmc_address.as_str(), "credentialsName": credentials}},
        }))
    }

    fn image_url(&self, sha256: &str) -> String {
        let base = self.cfg.image_base_url.trim_end_matches('/');
        format!("{base}/sha256/{sha256}")
    }

    /// Sets the host's image (with its user data, online) and follows it to `provisioned`.
    async fn provision(
        &self,
        req: &HostRequest,
        progress: &mpsc::UnboundedSender<ProvisioningState>,
    ) -> Result<(), BackendError> {
        let name = req.node.name.as_str();
        let mut intent = match self.host(name).await? {
            Some(host) => Self::intent_of(&host),
            None => self.new_host_intent(req).await?,
        };
        let user_data = self.user_data_for(name).await?;
        let url = self.image_url(&req.image.checksum);
        intent["metadata"]["annotations"][marks::NODE] = json!(name);
        add_finalizer(&mut intent);
        let spec = &mut intent["spec"];
        spec["online"] = json!(true);
        spec["image"] = json!({"url": url, "checksum": req.image.checksum, "checksumType": req.image.checksum_type,
                               "format": req.image.format});
        spec["userData"] = json!({"name": user_data, "namespace": self.cfg.namespace});
        self.apply_host(name, &intent).await?;
        info!(site = %self.cfg.site, host = name, %url, "image set");
        self.follow(name, progress, |host| {
            host.state() == Some(ProvisioningState::Provisioned)
                && host.provisioned_image().is_some_and(|i| i.url == url)
        })
        .await?;
        let p = &req.package;
        self.record_versions(name, [(p.name.as_str(), p.version.as_str())]).await
    }

    /// Takes the image off the host (Metal3 deprovisions it) and waits until it is available.
    async fn deprovision(&self, name: &str) -> Result<(), BackendError> {
        let Some(host) = self.host(name).await? else {
            return Err(BackendError::Permanent(format!("host {name} has no BareMetalHost")));
        };
        let mut intent = Self::intent_of(&host);
        if let Some(spec) = intent.get_mut("spec").and_then(Value::as_object_mut) {
            spec.remove("image");
        }
        self.apply_host(name, &intent).await?;
        let (tx, _rx) = mpsc::unbounded_channel();
        self.follow(name, &tx, |h| {
            h.state() == Some(ProvisioningState::Available) && h.spec.image.as_ref().is_none_or(|i| i.url.is_empty())
        })
        .await
    }

    /// Watches host `name`, sending each new state on `progress`, until `done` holds, Metal3
    /// reports an error for it, or the provisioning timeout passes.
    async fn follow(
        &self,
        name: &str,
        progress: &mpsc::UnboundedSender<ProvisioningState>,
        done: impl Fn(&BareMetalHost) -> bool,
    ) -> Result<(), BackendError> {
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let mut updates = watcher(self.hosts.clone(), config).default_backoff().applied_objects().boxed();
        let deadline = tokio::time::sleep(self.cfg.provision_timeout);
        tokio::pin!(deadline);
        let mut last = None;
        loop {
            let host = tokio::select! {
                _ = &mut deadline => {
                    let state = last.map_or("unknown".to_string(), |s: ProvisioningState| s.to_string());
                    return Err(BackendError::Permanent(format!(
                        "host {name} did not get there within {:?} (last state: {state})", self.cfg.provision_timeout
                    )));
                }
                next = updates.next() => match next {
                    Some(Ok(host)) => host,
                    Some(Err(e)) => { debug!(host = name, error = %e, "watch interrupted; resuming"); continue }
                    None => return Err(BackendError::Transient(format!("watch of host {name} ended"))),
                },
            };
            let state = host.state();
            if state.is_some() && state != last {
                last = state;
                if let Some(s) = state {
                    let _ = progress.send(s);
                }
            }
            if let Some((error_type, message)) = host.error() {
                return Err(BackendError::HostFailed {
                    host: name.to_string(),
                    error_type: error_type.to_string(),
                    message: message.to_string(),
                });
            }
            if done(&host) {
                return Ok(());
            }
        }
    }

    /// Notes on the host which version of each package it runs (`landfall.io/pkg.<name>`).
    async fn record_versions<'a>(
        &self,
        name: &str,
        packages: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<(), BackendError> {
        let Some(host) = self.host(name).await? else { return Ok(()) };
        let mut intent = Self::intent_of(&host);
        let before = intent.clone();
        for (package, version) in packages {
            intent["metadata"]["annotations"][marks::package(package)] = json!(version);
        }
        if intent != before {
            self.apply_host(name, &intent).await?;
        }
        Ok(())
    }

    fn version_on(host: &BareMetalHost, package: &str) -> Option<String> {
        host.annotations().get(&marks::package(package)).cloned()
    }

    /// The cluster's nodes for the BPA: each with the address inspection saw on its boot NIC.
    async fn cluster_nodes(
        &self,
        wanted: impl Iterator<Item = (String, Role, String)>,
    ) -> Result<(Vec<ClusterNode>, Vec<NodeInstall>), BackendError> {
        let (mut nodes, mut failed) = (Vec::new(), Vec::new());
        for (name, role, mac) in wanted {
            let ip = self.host(&name).await?.and_then(|h| h.ip_of(&mac).map(str::to_string));
            match ip {
                Some(ip) => nodes.push(ClusterNode { name, role, mac, ip }),
                None => failed.push(NodeInstall {
                    failure: Some(format!(
                        "no address for boot MAC {mac} in BareMetalHost {name}'s status.hardware.nics: the inventory needs one"
                    )),
                    node: name,
                    role,
                }),
            }
        }
        Ok((nodes, failed))
    }

    async fn apply_bpa(&self, api: &Api<DynamicObject>, body: &Value) -> Result<(), BackendError> {
        let name = body["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let params = PatchParams::apply(FIELD_MANAGER);
        api.patch(&name, &params, &Patch::Apply(body)).await.map_err(|e| kube_error(&format!("BPA {name}"), e))?;
        Ok(())
    }

    /// Sets `packages` for `roles` in the cluster's `Software`, keeping every other entry.
    async fn set_software(&self, roles: &[Role], packages: &[Package]) -> Result<(), BackendError> {
        let name = format!("{}-software", self.cfg.cluster);
        let current = self.softwares.get_opt(&name).await.map_err(|e| kube_error(&name, e))?;
        let mut by_role = current.map(|s| bpa::software_versions(&s.data)).unwrap_or_default();
        for role in roles {
            let entry = by_role.entry(*role).or_default();
            for p in packages {
                entry.insert(p.name.to_string(), p.version.to_string());
            }
        }
        self.apply_bpa(&self.softwares, &bpa::software(&self.identity(), &self.cfg.namespace, &by_role)).await
    }

    async fn cluster_exists(&self) -> Result<bool, BackendError> {
        match self.kubeconfig().await {
            Ok(_) => Ok(true),
            Err(BackendError::Transient(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The application cluster's client, from its kubeconfig.
    async fn application_cluster(&self) -> Result<Client, BackendError> {
        let bytes = self.kubeconfig().await?;
        let text = String::from_utf8(bytes)
            .map_err(|_| BackendError::Permanent("the cluster's kubeconfig is not UTF-8".into()))?;
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&text)
            .map_err(|e| BackendError::Permanent(format!("the cluster's kubeconfig: {e}")))?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| BackendError::Permanent(format!("the cluster's kubeconfig: {e}")))?;
        Client::try_from(config).map_err(|e| BackendError::Permanent(format!("the cluster's kubeconfig: {e}")))
    }

    fn applier(&self, client: Client) -> ManifestApplier {
        ManifestApplier::new(client, self.cfg.state_dir.join("container-packages"))
    }

    /// Applies one container package's manifests, read from the cache.
    async fn apply_container(&self, applier: &ManifestApplier, package: &Package) -> Result<(), BackendError> {
        let path = self.cache.path(&package.sha256.to_string());
        let manifests = tokio::fs::read(&path).await.map_err(|e| {
            BackendError::Permanent(format!(
                "container package {}: no manifests in the site's cache ({}: {e}); was it uploaded?",
                package.reference().key(),
                path.display()
            ))
        })?;
        let summary = applier.apply(package.name.as_str(), package.version.as_str(), &manifests).await?;
        info!(
            site = %self.cfg.site,
            package = %package.reference().key(),
            applied = summary.applied.len(),
            unchanged = summary.unchanged.len(),
            pruned = summary.pruned.len(),
            "container package applied"
        );
        Ok(())
    }
}

impl SiteBackend for KubeSite {
    async fn stage_artifacts(&self, artifacts: &[CachedArtifact]) -> Result<(), BackendError> {
        let Some(uploader) = &self.uploader else { return Ok(()) };
        for a in artifacts {
            let Some(path) = &a.path else { continue };
            let outcome = uploader.upload(&a.package, path).await?;
            debug!(site = %self.cfg.site, package = %a.package.reference().key(), ?outcome, "handed to the BPA");
        }
        Ok(())
    }

    async fn provision_host(
        &self,
        req: &HostRequest,
        progress: mpsc::UnboundedSender<ProvisioningState>,
    ) -> Result<(), BackendError> {
        self.provision(req, &progress).await
    }

    async fn install_binaries(&self, req: &ClusterRequest) -> Result<Vec<NodeInstall>, BackendError> {
        let id = self.identity();
        let existing = self.provisionings.get_opt(&id.cluster).await.map_err(|e| kube_error(&id.cluster, e))?;
        if req.join_existing && (existing.is_none() || !self.cluster_exists().await?) {
            return Err(BackendError::Transient("no application cluster yet".into()));
        }
        // A join keeps the nodes the cluster has; a fresh install lists exactly the request's.
        let mut wanted: BTreeMap<String, (Role, String)> = match (&existing, req.join_existing) {
            (Some(p), true) => bpa::provisioned_nodes(&p.data),
            _ => BTreeMap::new(),
        };
        for n in &req.nodes {
            wanted.insert(n.name.to_string(), (n.role, n.boot_mac.to_string()));
        }
        let (nodes, mut results) = self.cluster_nodes(wanted.into_iter().map(|(n, (r, m))| (n, r, m))).await?;
        let body = bpa::provisioning(&id, &self.cfg.namespace, &nodes, &self.cfg.kud_plugins, &self.cfg.pod_subnet);
        self.apply_bpa(&self.provisionings, &body).await?;
        self.set_software(&[Role::Master, Role::Worker], &req.binaries).await?;
        write_atomically(&self.hosts_ini_path(), bpa::hosts_ini(&nodes).as_bytes()).await?;
        info!(site = %self.cfg.site, cluster = %id.cluster, nodes = nodes.len(), "BPA provisioning written");

        // The BPA builds the cluster; its kubeconfig appearing says it is done.
        let deadline = tokio::time::Instant::now() + self.cfg.install_timeout;
        while !self.cluster_exists().await? {
            if tokio::time::Instant::now() >= deadline {
                return Err(BackendError::Permanent(format!(
                    "the BPA did not build cluster {} within {:?} (no kubeconfig)",
                    id.cluster, self.cfg.install_timeout
                )));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let requested: std::collections::BTreeSet<&str> = req.nodes.iter().map(|n| n.name.as_str()).collect();
        for n in nodes.iter().filter(|n| requested.contains(n.name.as_str())) {
            self.record_versions(&n.name, versions(&req.binaries)).await?;
            results.push(NodeInstall { node: n.name.clone(), role: n.role, failure: None });
        }
        results.retain(|r| requested.contains(r.node.as_str()));
        Ok(results)
    }

    async fn kubeconfig(&self) -> Result<Vec<u8>, BackendError> {
        match &self.cfg.cluster_kubeconfig {
            KubeconfigSource::File(path) => match tokio::fs::read(path).await {
                Ok(bytes) if !bytes.is_empty() => Ok(bytes),
                Ok(_) => Err(BackendError::Transient(format!("{} is empty", path.display()))),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    Err(BackendError::Transient(format!("no kubeconfig at {} yet", path.display())))
                }
                Err(e) => Err(BackendError::Permanent(format!("{}: {e}", path.display()))),
            },
            KubeconfigSource::Secret(name) => {
                let secret = self.secrets.get_opt(name).await.map_err(|e| kube_error(&format!("Secret {name}"), e))?;
                let value = secret.and_then(|s| s.data).and_then(|mut d| d.remove("value"));
                match value {
                    Some(ByteString(bytes)) if !bytes.is_empty() => Ok(bytes),
                    _ => Err(BackendError::Transient(format!("no kubeconfig in Secret {name} (key value) yet"))),
                }
            }
        }
    }

    async fn apply_container_packages(&self, packages: &[Package]) -> Result<(), BackendError> {
        let applier = self.applier(self.application_cluster().await?);
        for p in packages {
            self.apply_container(&applier, p).await?;
        }
        Ok(())
    }

    async fn patch_node(&self, req: &PatchRequest) -> Result<PatchOutcome, BackendError> {
        let name = req.node.name.as_str();
        let Some(host) = self.host(name).await? else {
            return Err(BackendError::Permanent(format!("node {name} has no BareMetalHost")));
        };
        if host.state() != Some(ProvisioningState::Provisioned) {
            let state = host.state().map_or("unknown".to_string(), |s| s.to_string());
            return Err(BackendError::Permanent(format!("node {name} is not provisioned (state {state})")));
        }
        let package = &req.package;
        let from = Self::version_on(&host, package.name.as_str());
        if from.as_deref() == Some(package.version.as_str()) {
            return Ok(PatchOutcome { from_version: from, changed: false });
        }
        match package.kind {
            pb::PackageKind::OsImage => {
                // Metal3 reimages only through deprovisioning: the image comes off, then the new one goes on.
                self.deprovision(name).await?;
                let (tx, _rx) = mpsc::unbounded_channel();
                self.provision(&HostRequest::new(req.node.clone(), package), &tx).await?;
                if !req.reinstall.is_empty() {
                    self.set_software(&[req.node.role], &req.reinstall).await?;
                    self.record_versions(name, versions(&req.reinstall)).await?;
                }
            }
            pb::PackageKind::Binary => {
                self.set_software(&[req.node.role], std::slice::from_ref(package)).await?;
                self.record_versions(name, versions(std::slice::from_ref(package))).await?;
            }
            _ => {
                let applier = self.applier(self.application_cluster().await?);
                self.apply_container(&applier, package).await?;
                self.record_versions(name, versions(std::slice::from_ref(package))).await?;
            }
        }
        Ok(PatchOutcome { from_version: from, changed: true })
    }

    fn host_changes(&self) -> mpsc::UnboundedReceiver<HostNotice> {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(hosts::watch(self.cfg.site.clone(), self.hosts.clone(), tx));
        rx
    }
}

fn versions(packages: &[Package]) -> impl Iterator<Item = (&str, &str)> {
    packages.iter().map(|p| (p.name.as_str(), p.version.as_str()))
}

fn role_label(role: Role) -> &'static str {
    match role {
        Role::Master => "master",
        Role::Worker => "worker",
    }
}

/// Adds the gateway's finalizer to an intent's `metadata.finalizers` (a set).
fn add_finalizer(intent: &mut Value) {
    let list = &mut intent["metadata"]["finalizers"];
    if !list.is_array() {
        *list = json!([]);
    }
    if let Some(items) = list.as_array_mut()
        && !items.iter().any(|f| f == marks::FINALIZER)
    {
        items.push(json!(marks::FINALIZER));
    }
}

/// How the API server's server-side apply begins the message of an applied object that does not
/// fit the kind's schema.
const TYPED_PATCH_FAILED: &str = "failed to create typed patch object";

/// Whether trying again may help: the server rejecting an object (schema, conflict with another
/// field manager, forbidden, not found) will not; an unreachable, overloaded or failing one may.
pub(crate) fn kube_error(context: &str, e: kube::Error) -> BackendError {
    match e {
        kube::Error::Api(status) => {
            let message = if status.message.is_empty() { status.reason.clone() } else { status.message.clone() };
            let message = format!("{context}: {message}");
            match status.code {
                // The server cannot make the applied object fit its schema (a string where an
                // integer belongs, a field the schema does not declare), but says so with a 500:
                // kubernetes/kubernetes#139253.
                500 if status.message.contains(TYPED_PATCH_FAILED) => BackendError::Permanent(message),
                408 | 429 | 500..=599 => BackendError::Transient(message),
                _ => BackendError::Permanent(message),
            }
        }
        e @ (kube::Error::BuildRequest(_) | kube::Error::HttpError(_)) => {
            BackendError::Permanent(format!("{context}: {e}"))
        }
        e => BackendError::Transient(format!("{context}: {e}")),
    }
}

async fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> Result<(), BackendError> {
    let io = |e: std::io::Error| BackendError::Permanent(format!("{}: {e}", path.display()));
    if let Some(dir) = path.parent() {
        tokio::fs::create_dir_all(dir).await.map_err(io)?;
    }
    let tmp = path.with_extension("tmp");
    tokio::fs::write(&tmp, bytes).await.map_err(io)?;
    tokio::fs::rename(&tmp, path).await.map_err(io)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use bus_schema::domain::NodeDesign;
    use http::{Method, Request, Response, StatusCode};
    use kube::client::Body;
    use tower_test::mock;

    use super::*;
    use crate::backend::BmcCredentials;

    type Handle = mock::Handle<Request<Body>, Response<Body>>;

    /// A backend whose API server is a mock that the test answers request by request.
    fn mocked(user_data: UserData) -> (KubeSite, Handle, tempfile::TempDir) {
        let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = KubeSiteConfig::new("edge-01", "metal3", dir.path().join("state"));
        cfg.user_data = user_data;
        let site =
            KubeSite::new(Client::new(service, "metal3"), cfg, ArtifactCache::new(dir.path().join("cache"))).unwrap();
        (site, handle, dir)
    }

    /// The next request: method, path and query, and its JSON body (Null when empty).
    async fn next(handle: &mut Handle, reply: (StatusCode, Value)) -> (Method, String, Value) {
        let (req, send) = handle.next_request().await.expect("a request");
        let (method, uri) = (req.method().clone(), req.uri().to_string());
        let bytes = req.into_body().collect_bytes().await.unwrap();
        let body = if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).unwrap() };
        let response = Response::builder().status(reply.0).body(Body::from(serde_json::to_vec(&reply.1).unwrap()));
        send.send_response(response.unwrap());
        (method, uri, body)
    }

    fn b64(s: &str) -> String {
        serde_json::to_value(ByteString(s.as_bytes().to_vec())).unwrap().as_str().unwrap().to_string()
    }

    fn request(bmc: Option<BmcCredentials>) -> HostRequest {
        let node = NodeDesign {
            name: "n1".try_into().unwrap(),
            role: Role::Worker,
            boot_mac: "52:54:00:00:00:01".to_string().try_into().unwrap(),
            bmc_address: "redfish://10.0.0.1/redfish/v1/Systems/1".to_string().try_into().unwrap(),
            labels: BTreeMap::new(),
        };
        let package = Package {
            name: "ubuntu".try_into().unwrap(),
            version: "22.04".try_into().unwrap(),
            kind: pb::PackageKind::OsImage,
            sha256: "ab".repeat(32).try_into().unwrap(),
            size: 1,
            object_key: String::new(),
        };
        let mut req = HostRequest::new(node, &package);
        req.bmc = bmc;
        req
    }

    fn not_found() -> (StatusCode, Value) {
        (
            StatusCode::NOT_FOUND,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"}),
        )
    }

    /// A server-side apply, never forced: the query kube-rs sends for it.
    const APPLY_QUERY: &str = "?&fieldManager=landfall-gateway";

    #[tokio::test]
    async fn a_host_the_site_lacks_gets_its_bmc_credentials_in_a_secret_of_its_own() {
        let (site, mut handle, _dir) = mocked(UserData::Existing("ud".into()));
        let creds = BmcCredentials { username: "admin".into(), password: "s3cret!".into() };
        let server = tokio::spawn(async move { next(&mut handle, (StatusCode::OK, json!({}))).await });
        let intent = site.new_host_intent(&request(Some(creds))).await.unwrap();
        let (method, uri, body) = server.await.unwrap();
        assert_eq!(
            (method, uri.as_str()),
            (Method::PATCH, format!("/api/v1/namespaces/metal3/secrets/n1-bmc-secret{APPLY_QUERY}").as_str())
        );
        assert_eq!(
            body,
            json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                   "metadata": {"name": "n1-bmc-secret", "namespace": "metal3", "labels": {"landfall.io/purpose": "bmc-credentials"}},
                   "data": {"username": b64("admin"), "password": b64("s3cret!")}})
        );
        assert_eq!(
            intent["spec"]["bmc"],
            json!({"address": "redfish://10.0.0.1/redfish/v1/Systems/1", "credentialsName": "n1-bmc-secret"})
        );
        assert_eq!(intent["spec"]["bootMACAddress"], json!("52:54:00:00:00:01"));
        assert_eq!(intent["metadata"]["labels"], json!({marks::ROLE_LABEL: "worker"}));
    }

    #[tokio::test]
    async fn without_credentials_no_host_is_created_and_nothing_is_written() {
        let (site, mut handle, _dir) = mocked(UserData::Existing("ud".into()));
        let err = site.new_host_intent(&request(None)).await.unwrap_err();
        assert!(matches!(&err, BackendError::Permanent(m) if m.contains("landfall bmc set")), "{err}");
        let quiet = tokio::time::timeout(std::time::Duration::from_millis(100), handle.next_request()).await;
        assert!(quiet.is_err(), "a request was made");
    }

    #[tokio::test]
    async fn generated_user_data_is_a_secret_per_host_with_its_hostname_and_keys() {
        let keys = vec!["ssh-ed25519 AAAAC3Nza landfall@hub".to_string()];
        let (site, mut handle, _dir) = mocked(UserData::Generated { ssh_authorized_keys: keys });
        let server = tokio::spawn(async move { next(&mut handle, (StatusCode::OK, json!({}))).await });
        assert_eq!(site.user_data_for("n1").await.unwrap(), "n1-user-data");
        let (method, uri, body) = server.await.unwrap();
        assert_eq!(
            (method, uri.as_str()),
            (Method::PATCH, format!("/api/v1/namespaces/metal3/secrets/n1-user-data{APPLY_QUERY}").as_str())
        );
        let cloud_config =
            "#cloud-config\nhostname: n1\nssh_authorized_keys:\n  - ssh-ed25519 AAAAC3Nza landfall@hub\n";
        assert_eq!(body["data"], json!({"userData": b64(cloud_config)}));
        assert_eq!(body["metadata"]["labels"], json!({"landfall.io/purpose": "user-data"}));

        let (existing, mut quiet, _dir) = mocked(UserData::Existing("site-user-data".into()));
        assert_eq!(existing.user_data_for("n1").await.unwrap(), "site-user-data");
        assert!(tokio::time::timeout(std::time::Duration::from_millis(100), quiet.next_request()).await.is_err());
    }

    #[tokio::test]
    async fn the_cluster_kubeconfig_is_read_from_its_secret_and_its_absence_is_transient() {
        let (site, mut handle, _dir) = mocked(UserData::Existing("ud".into()));
        let server = tokio::spawn(async move {
            let found = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "edge-01-kubeconfig"},
                               "data": {"value": b64("apiVersion: v1\nkind: Config\n")}});
            let first = next(&mut handle, (StatusCode::OK, found)).await;
            let second = next(&mut handle, not_found()).await;
            (first, second)
        });
        assert_eq!(site.kubeconfig().await.unwrap(), b"apiVersion: v1\nkind: Config\n");
        let missing = site.kubeconfig().await.unwrap_err();
        assert!(matches!(&missing, BackendError::Transient(m) if m.contains("edge-01-kubeconfig")), "{missing}");
        let ((m1, u1, _), (m2, u2, _)) = server.await.unwrap();
        for (m, u) in [(m1, u1), (m2, u2)] {
            assert_eq!((m, u.as_str()), (Method::GET, "/api/v1/namespaces/metal3/secrets/edge-01-kubeconfig"));
        }
    }

    #[test]
    fn the_finalizer_is_added_once_beside_others() {
        let mut intent = json!({"metadata": {"finalizers": ["x"]}});
        add_finalizer(&mut intent);
        add_finalizer(&mut intent);
        assert_eq!(intent["metadata"]["finalizers"], json!(["x", marks::FINALIZER]));
        let mut bare = json!({"metadata": {}});
        add_finalizer(&mut bare);
        assert_eq!(bare["metadata"]["finalizers"], json!([marks::FINALIZER]));
    }
}
