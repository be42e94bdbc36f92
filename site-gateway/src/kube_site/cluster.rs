//! The site's application cluster through the BPA: the `Provisioning` and `Software` resources
//! and hosts.ini that install its binaries, its kubeconfig (the sign that the BPA built it), and
//! container packages applied to it.

use std::collections::BTreeMap;
use std::time::Duration;

use bus_schema::domain::{Package, Role};
use k8s_openapi::ByteString;
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::Value;
use tracing::info;

use super::apply::ManifestApplier;
use super::bpa::{self, ClusterNode};
use super::error::kube_error;
use super::marks::FIELD_MANAGER;
use super::{KubeSite, KubeconfigSource};
use crate::backend::{BackendError, ClusterRequest, NodeInstall};

impl KubeSite {
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
    pub(super) async fn set_software(&self, roles: &[Role], packages: &[Package]) -> Result<(), BackendError> {
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
        match self.cluster_kubeconfig().await {
            Ok(_) => Ok(true),
            Err(BackendError::Transient { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The application cluster's client, from its kubeconfig.
    pub(super) async fn application_cluster(&self) -> Result<Client, BackendError> {
        self.application_cluster_with(true).await
    }

    /// The application cluster's client; `retries: false` hands a 429 or 503 straight back
    /// instead of trying again for minutes.
    pub(super) async fn application_cluster_with(&self, retries: bool) -> Result<Client, BackendError> {
        let bytes = self.cluster_kubeconfig().await?;
        let text = String::from_utf8(bytes)
            .map_err(|_| BackendError::permanent_reason("the cluster's kubeconfig is not UTF-8"))?;
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&text)
            .map_err(|e| BackendError::permanent("the cluster's kubeconfig", e))?;
        let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| BackendError::permanent("the cluster's kubeconfig", e))?;
        config.default_retry = retries;
        Client::try_from(config).map_err(|e| BackendError::permanent("the cluster's kubeconfig", e))
    }

    pub(super) fn applier(&self, client: Client) -> ManifestApplier {
        ManifestApplier::new(client, self.cfg.state_dir.join("container-packages"))
    }

    /// Applies one container package's manifests, read from the cache.
    pub(super) async fn apply_container(
        &self,
        applier: &ManifestApplier,
        package: &Package,
    ) -> Result<(), BackendError> {
        let path = self.cache.path(&package.sha256.to_string());
        let manifests = tokio::fs::read(&path).await.map_err(|e| {
            BackendError::permanent(
                format!(
                    "container package {}: no manifests in the site's cache at {} (was it uploaded?)",
                    package.reference().key(),
                    path.display()
                ),
                e,
            )
        })?;
        if package.kind == bus_schema::pb::PackageKind::HelmChart {
            return self.apply_chart(applier, package, &manifests).await;
        }
        let summary = applier.apply(package.name.as_str(), package.version.as_str(), &manifests).await?;
        // Applied is not done: its workloads must come up.
        super::workloads::wait_available(applier.client(), &summary.objects, self.cfg.workload_timeout, self.cfg.poll)
            .await
            .map_err(|e| match e {
                BackendError::Permanent { context, .. } => BackendError::permanent_reason(format!(
                    "container package {}: {context}",
                    package.reference().key()
                )),
                e => e,
            })?;
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

    /// Installs the binaries on the request's nodes: a fresh cluster of exactly them, or them
    /// joining the cluster there is; returns once the BPA has built it.
    pub(super) async fn install(&self, req: &ClusterRequest) -> Result<Vec<NodeInstall>, BackendError> {
        if let Some(build) = &req.capi {
            return self.build_capi(req, build).await;
        }
        let id = self.identity();
        let existing = self.provisionings.get_opt(&id.cluster).await.map_err(|e| kube_error(&id.cluster, e))?;
        if req.join_existing && (existing.is_none() || !self.cluster_exists().await?) {
            return Err(BackendError::transient_reason("no application cluster yet"));
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
                return Err(BackendError::permanent_reason(format!(
                    "the BPA did not build cluster {} within {:?} (no kubeconfig)",
                    id.cluster, self.cfg.install_timeout
                )));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        // Built is not joined: each node must show Ready in the cluster, at the kubelet version
        // installed.
        let requested: std::collections::BTreeSet<&str> = req.nodes.iter().map(|n| n.name.as_str()).collect();
        let joining: Vec<&ClusterNode> = nodes.iter().filter(|n| requested.contains(n.name.as_str())).collect();
        let seen = futures::future::join_all(joining.iter().map(|n| self.observe_node(&n.name, &req.binaries))).await;
        for (n, seen) in joining.into_iter().zip(seen) {
            let failure = match seen {
                Ok(()) => None,
                Err(e @ BackendError::Transient { .. }) => return Err(e),
                Err(e) => Some(e.reason()),
            };
            if failure.is_none() {
                self.record_versions(&n.name, versions(&req.binaries)).await?;
            }
            results.push(NodeInstall { node: n.name.clone(), role: n.role, failure });
        }
        results.retain(|r| requested.contains(r.node.as_str()));
        Ok(results)
    }

    /// The application cluster's kubeconfig, from where the BPA leaves it.
    pub(super) async fn cluster_kubeconfig(&self) -> Result<Vec<u8>, BackendError> {
        match &self.cfg.cluster_kubeconfig {
            KubeconfigSource::File(path) => match tokio::fs::read(path).await {
                Ok(bytes) if !bytes.is_empty() => Ok(bytes),
                Ok(_) => Err(BackendError::transient_reason(format!("{} is empty", path.display()))),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    Err(BackendError::transient_reason(format!("no kubeconfig at {} yet", path.display())))
                }
                Err(e) => Err(BackendError::permanent(path.display().to_string(), e)),
            },
            KubeconfigSource::Secret(name) => {
                let secret = self.secrets.get_opt(name).await.map_err(|e| kube_error(&format!("Secret {name}"), e))?;
                let value = secret.and_then(|s| s.data).and_then(|mut d| d.remove("value"));
                match value {
                    Some(ByteString(bytes)) if !bytes.is_empty() => Ok(bytes),
                    _ => Err(BackendError::transient_reason(format!("no kubeconfig in Secret {name} (key value) yet"))),
                }
            }
        }
    }

    /// Applies container packages to the application cluster.
    pub(super) async fn apply_containers(&self, packages: &[Package]) -> Result<(), BackendError> {
        let applier = self.applier(self.application_cluster().await?);
        for p in packages {
            self.apply_container(&applier, p).await?;
        }
        Ok(())
    }
}

pub(super) fn versions(packages: &[Package]) -> impl Iterator<Item = (&str, &str)> {
    packages.iter().map(|p| (p.name.as_str(), p.version.as_str()))
}

/// Writes `bytes` to `path` through a temporary file renamed over it: a reader never sees half.
pub(super) async fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> Result<(), BackendError> {
    let io = |e: std::io::Error| BackendError::permanent(path.display().to_string(), e);
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
    use http::{Method, StatusCode};
    use serde_json::json;

    use super::*;
    use crate::SiteBackend;
    use crate::kube_site::UserData;
    use crate::kube_site::testing::{b64, mocked, next, not_found};

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
        assert!(
            matches!(&missing, BackendError::Transient { .. } if missing.reason().contains("edge-01-kubeconfig")),
            "{missing}"
        );
        let ((m1, u1, _), (m2, u2, _)) = server.await.unwrap();
        for (m, u) in [(m1, u1), (m2, u2)] {
            assert_eq!((m, u.as_str()), (Method::GET, "/api/v1/namespaces/metal3/secrets/edge-01-kubeconfig"));
        }
    }
}
