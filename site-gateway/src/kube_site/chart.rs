//! A helm chart's render for this site (made at the hub, `bus_schema::chart`), applied to the
//! application cluster in the order Helm installs a chart:
//!
//! 1. the release's namespace, made when it is missing;
//! 2. the CRDs, applied and waited for until Established (never pruned, as Helm never deletes
//!    them);
//! 3. the `pre-install`/`pre-upgrade` hooks, lightest first, each applied and waited for (a Job
//!    until it completes), then deleted as its `helm.sh/hook-delete-policy` says
//!    (`before-hook-creation`, Helm's default, deletes the previous run's object before it is
//!    made again);
//! 4. the chart's objects, through the package's inventory as any container package's (what the
//!    previous version had and this one has not is pruned), and waited for until available;
//! 5. the `post-install`/`post-upgrade` hooks, as the pre ones.
//!
//! A hook that fails fails the package there: nothing after it is applied. Objects that do not
//! come up (a workload not available, a Job failed), or a post hook that fails, send the release
//! back to the render applied before (kept beside the package's inventory): its objects applied
//! again and what the failed version added pruned, and the failure says so.

use bus_schema::chart::{self, Hook};
use bus_schema::domain::Package;
use serde_json::Value;
use tracing::info;

use super::KubeSite;
use super::apply::ManifestApplier;
use super::error::kube_error;
use super::workloads::{Applied, wait_available};
use crate::backend::{BackendError, ClusterFacts, PatchOutcome};

/// The extension of a kept render's file.
pub(super) const KEPT_EXTENSION: &str = "render";

/// The render applied last of a chart, kept at the site: what it goes back to when the next
/// version fails, and what its drift is checked against.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct KeptRender {
    pub version: String,
    /// The release's namespace: where its namespaced objects without one are.
    pub namespace: String,
    /// Whether the package asked for what drifted to be put back.
    pub correct_drift: bool,
    pub manifests: String,
}

pub(super) async fn read_kept(path: &std::path::Path) -> Option<KeptRender> {
    serde_json::from_slice(&tokio::fs::read(path).await.ok()?).ok()
}

/// Objects as manifests the applier reads (JSON is YAML).
pub(super) fn manifests<'a>(objects: impl IntoIterator<Item = &'a Value>) -> Vec<u8> {
    let mut out = String::new();
    for o in objects {
        out.push_str("---\n");
        out.push_str(&o.to_string());
        out.push('\n');
    }
    out.into_bytes()
}

impl KubeSite {
    /// Applies a chart's render (`rendered`: the manifests the cache holds) as Helm would
    /// install or upgrade it (see the module's comment).
    pub(super) async fn apply_chart(
        &self,
        applier: &ManifestApplier,
        package: &Package,
        rendered: &[u8],
    ) -> Result<(), BackendError> {
        let what = package.reference().key();
        let failed = |e: BackendError| match e {
            BackendError::Permanent { context, .. } => {
                BackendError::permanent_reason(format!("helm chart {what}: {context}"))
            }
            e => e,
        };
        let Some(release) = &package.chart else {
            return Err(BackendError::permanent_reason(format!("helm chart {what} has no release")));
        };
        let text = std::str::from_utf8(rendered)
            .map_err(|e| BackendError::permanent(format!("helm chart {what}: the render is not text"), e))?;
        let parts =
            chart::split(text).map_err(|e| BackendError::permanent_reason(format!("helm chart {what}: {e}")))?;
        let applier = applier.in_namespace(&release.namespace);
        let (name, version) = (package.name.as_str(), package.version.as_str());

        let namespace =
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": release.namespace}});
        applier.apply_unlisted(name, version, &manifests([&namespace])).await.map_err(failed)?;
        if !parts.crds.is_empty() {
            let crds = applier.apply_unlisted(name, version, &manifests(&parts.crds)).await.map_err(failed)?;
            self.wait(&applier, &crds).await.map_err(failed)?;
        }
        self.run_hooks(&applier, package, &parts.pre, "pre").await.map_err(failed)?;
        let before = self.kept_render(name).await;
        let summary = applier.apply(name, version, &manifests(&parts.objects)).await.map_err(failed)?;
        let up = match self.wait(&applier, &summary.objects).await {
            Ok(()) => self.run_hooks(&applier, package, &parts.post, "post").await,
            Err(e) => Err(e),
        };
        if let Err(e) = up {
            return Err(match (e, before) {
                (e @ BackendError::Transient { .. }, _) => e,
                (e, Some((was, text))) if was != version => {
                    let back = self.go_back(&applier, name, &was, &text).await;
                    let said = match back {
                        Ok(()) => format!("went back to {name}@{was}, as applied before"),
                        Err(b) => format!("going back to {name}@{was} failed too: {}", b.reason()),
                    };
                    BackendError::permanent_reason(format!("helm chart {what}: {}; {said}", e.reason()))
                }
                (e, _) => failed(e),
            });
        }
        self.keep_render(package, text).await?;
        info!(
            site = %self.cfg.site,
            package = %what,
            crds = parts.crds.len(),
            hooks = parts.pre.len() + parts.post.len(),
            applied = summary.applied.len(),
            unchanged = summary.unchanged.len(),
            pruned = summary.pruned.len(),
            "helm chart applied"
        );
        Ok(())
    }

    /// The application cluster's Kubernetes version and every API version and kind it serves
    /// (discovery); nothing when there is no cluster yet.
    pub(super) async fn application_facts(&self) -> Result<ClusterFacts, BackendError> {
        let client = match self.application_cluster().await {
            Ok(client) => client,
            Err(BackendError::Transient { .. }) => return Ok(ClusterFacts::default()),
            Err(e) => return Err(e),
        };
        // What a server does not serve (a 404: no `/version`, no legacy `/api`) is left out.
        fn served<T>(found: Result<T, kube::Error>, what: &str) -> Result<Option<T>, BackendError> {
            match found {
                Ok(t) => Ok(Some(t)),
                Err(kube::Error::Api(status)) if status.code == 404 || status.code == 503 => Ok(None),
                Err(e) => Err(kube_error(what, e)),
            }
        }
        let version = served(client.apiserver_version().await, "the cluster's version")?;
        let what = "the cluster's API discovery";
        let mut group_versions: Vec<String> =
            served(client.list_core_api_versions().await, what)?.map(|v| v.versions).unwrap_or_default();
        for group in served(client.list_api_groups().await, what)?.map(|g| g.groups).unwrap_or_default() {
            group_versions.extend(group.versions.into_iter().map(|v| v.group_version));
        }
        let mut api_versions = Vec::new();
        for gv in group_versions {
            let listed = match gv.contains('/') {
                true => client.list_api_group_resources(&gv).await,
                false => client.list_core_api_resources(&gv).await,
            };
            // A group version listed and not served (an aggregated API that is down): left out.
            let Some(list) = served(listed, what)? else { continue };
            let resources = list.resources;
            for r in resources.iter().filter(|r| !r.name.contains('/')) {
                api_versions.push(format!("{gv}/{}", r.kind));
            }
            api_versions.push(gv);
        }
        api_versions.sort();
        api_versions.dedup();
        // A server built without a release version (`v0.0.0-master…`) says nothing of it.
        let kube_version = version.map(|v| v.git_version).filter(|v| !v.starts_with("v0.")).unwrap_or_default();
        Ok(ClusterFacts { kube_version, api_versions })
    }

    /// A node's part of a chart's rollout: the release goes to this render unless it stands
    /// there already (same version, same manifests: another node of the site applied it, or
    /// the values did not change). Rendered again at the same version, a changed render is
    /// applied and counts as a change.
    /// `from`: what the node was recorded running.
    pub(super) async fn patch_chart(
        &self,
        node: &str,
        package: &Package,
        from: Option<String>,
    ) -> Result<PatchOutcome, BackendError> {
        let name = package.name.as_str();
        let path = self.cache.path(&package.sha256.to_string());
        let rendered = tokio::fs::read_to_string(&path).await.map_err(|e| {
            BackendError::permanent(format!("helm chart {}: no render in the cache", package.reference().key()), e)
        })?;
        let before = self.kept_render(name).await;
        let standing = before.is_some_and(|(v, text)| v == package.version.as_str() && text == rendered);
        if !standing {
            let applier = self.applier(self.application_cluster().await?);
            self.apply_container(&applier, package).await?;
        }
        // The node runs the release as it stands, whoever applied it.
        self.record_versions(node, super::cluster::versions(std::slice::from_ref(package))).await?;
        Ok(PatchOutcome { from_version: from, changed: !standing })
    }

    /// Where the renders applied last are kept, one `<name>.render` per chart.
    pub(super) fn kept_renders_dir(&self) -> std::path::PathBuf {
        self.cfg.state_dir.join("container-packages")
    }

    fn kept_render_path(&self, name: &str) -> std::path::PathBuf {
        self.kept_renders_dir().join(format!("{name}.{KEPT_EXTENSION}"))
    }

    /// The render applied last of chart `name`: its version and manifests.
    async fn kept_render(&self, name: &str) -> Option<(String, String)> {
        let kept = read_kept(&self.kept_render_path(name)).await?;
        Some((kept.version, kept.manifests))
    }

    async fn keep_render(&self, package: &Package, text: &str) -> Result<(), BackendError> {
        let kept = KeptRender {
            version: package.version.to_string(),
            namespace: package.chart.as_ref().map(|c| c.namespace.clone()).unwrap_or_default(),
            correct_drift: package.chart.as_ref().is_some_and(|c| c.correct_drift),
            manifests: text.to_string(),
        };
        let bytes = serde_json::to_vec(&kept).map_err(|e| BackendError::permanent("keeping the render", e))?;
        super::cluster::write_atomically(&self.kept_render_path(package.name.as_str()), &bytes).await
    }

    /// The render applied before, applied again (no hooks): the objects the failed version
    /// added are pruned by the package's inventory.
    async fn go_back(
        &self,
        applier: &ManifestApplier,
        name: &str,
        version: &str,
        text: &str,
    ) -> Result<(), BackendError> {
        let parts = chart::split(text).map_err(BackendError::permanent_reason)?;
        let summary = applier.apply(name, version, &manifests(&parts.objects)).await?;
        info!(site = %self.cfg.site, package = name, version, pruned = summary.pruned.len(), "helm chart gone back");
        self.wait(applier, &summary.objects).await
    }

    async fn wait(&self, applier: &ManifestApplier, objects: &[Applied]) -> Result<(), BackendError> {
        wait_available(applier.client(), objects, self.cfg.workload_timeout, self.cfg.poll).await
    }

    /// Runs hooks one after the other, lightest first; `when` (`pre`, `post`) for messages.
    async fn run_hooks(
        &self,
        applier: &ManifestApplier,
        package: &Package,
        hooks: &[Hook],
        when: &str,
    ) -> Result<(), BackendError> {
        let (name, version) = (package.name.as_str(), package.version.as_str());
        for hook in hooks {
            let id = chart::kind_name(&hook.object);
            if hook.deleted_on("before-hook-creation") {
                // The previous run's object goes first; there is none the first time.
                let text = |p: &str| hook.object.pointer(p).and_then(Value::as_str).map(str::to_string);
                let earlier = Applied {
                    api_version: text("/apiVersion").unwrap_or_default(),
                    kind: text("/kind").unwrap_or_default(),
                    namespace: text("/metadata/namespace"),
                    name: text("/metadata/name").unwrap_or_default(),
                };
                applier.delete_and_wait(&earlier, self.cfg.workload_timeout).await?;
            }
            let applied = applier.apply_unlisted(name, version, &manifests([&hook.object])).await?;
            match self.wait(applier, &applied).await {
                Ok(()) => {
                    if hook.deleted_on("hook-succeeded") {
                        for o in &applied {
                            applier.delete_and_wait(o, self.cfg.workload_timeout).await?;
                        }
                    }
                }
                Err(e) => {
                    if hook.deleted_on("hook-failed") {
                        for o in &applied {
                            applier.delete_and_wait(o, self.cfg.workload_timeout).await?;
                        }
                    }
                    return Err(BackendError::permanent_reason(format!("{when} hook {id}: {}", e.reason())));
                }
            }
        }
        Ok(())
    }
}
