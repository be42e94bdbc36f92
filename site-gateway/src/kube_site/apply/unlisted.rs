//! Objects a package applies outside its inventory (a chart's CRDs and hooks), put back with
//! force (drift a package asked to have corrected), read back as the cluster has them (a drift
//! check), and deleted one by one (hooks).

use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams};
use kube::discovery::Scope;
use tracing::debug;

use super::{Kinds, ManifestApplier, api_for, check_package_name, gvk_of, parse_manifests};
use crate::backend::BackendError;
use crate::kube_site::error::kube_error;
use crate::kube_site::marks::FIELD_MANAGER;
use crate::kube_site::workloads::Applied;

impl ManifestApplier {
    /// Server-side applies `manifests` as package `name`@`version` outside its inventory: a
    /// chart's CRDs (which Helm never deletes) and hooks (which their delete policy deletes).
    /// Labelled and annotated as the package's like the rest; never pruned. What was applied,
    /// in order.
    ///
    /// # Errors
    /// As [`ManifestApplier::apply`].
    pub async fn apply_unlisted(
        &self,
        name: &str,
        version: &str,
        manifests: &[u8],
    ) -> Result<Vec<Applied>, BackendError> {
        self.apply_each(name, version, manifests, false).await
    }

    /// Puts `manifests` back as package `name`@`version` says them, taking back the fields
    /// somebody else changed since (a forced server-side apply): drift a package asked to have
    /// corrected. Outside the inventory, as [`ManifestApplier::apply_unlisted`].
    ///
    /// # Errors
    /// As [`ManifestApplier::apply`].
    pub async fn put_back(&self, name: &str, version: &str, manifests: &[u8]) -> Result<Vec<Applied>, BackendError> {
        self.apply_each(name, version, manifests, true).await
    }

    /// Each object of `manifests` as applied (labelled and annotated as the package's, its
    /// namespace filled in), and the object the cluster has there now, if any: what a drift
    /// check compares.
    ///
    /// # Errors
    /// When the manifests do not parse or the cluster cannot be read.
    pub async fn live(
        &self,
        name: &str,
        version: &str,
        manifests: &[u8],
    ) -> Result<Vec<(String, serde_json::Value, Option<serde_json::Value>)>, BackendError> {
        check_package_name(name)?;
        let manifests = parse_manifests(manifests)?;
        let mut kinds = Kinds::new(&self.client);
        let plan = self.plan(&mut kinds, name, version, manifests).await?;
        let mut out = Vec::with_capacity(plan.len());
        for p in plan {
            let id = p.target.id();
            let found =
                p.api(&self.client).get_opt(&p.target.name).await.map_err(|e| kube_error(&format!("read {id}"), e))?;
            let value = |o: &DynamicObject| serde_json::to_value(o).unwrap_or_default();
            out.push((id, value(&p.object), found.as_ref().map(value)));
        }
        Ok(out)
    }

    async fn apply_each(
        &self,
        name: &str,
        version: &str,
        manifests: &[u8],
        force: bool,
    ) -> Result<Vec<Applied>, BackendError> {
        check_package_name(name)?;
        let manifests = parse_manifests(manifests)?;
        let mut kinds = Kinds::new(&self.client);
        let plan = self.plan(&mut kinds, name, version, manifests).await?;
        let mut applied = Vec::with_capacity(plan.len());
        let params = if force { PatchParams::apply(FIELD_MANAGER).force() } else { PatchParams::apply(FIELD_MANAGER) };
        for p in plan {
            let id = p.target.id();
            p.api(&self.client)
                .patch(&p.target.name, &params, &Patch::Apply(&p.object))
                .await
                .map_err(|e| kube_error(&format!("apply {id} ({})", p.doc), e))?;
            applied.push(p.target.applied());
        }
        Ok(applied)
    }

    /// Deletes one object (a hook) and waits until it is gone: a hook made again must not find
    /// its old self terminating.
    ///
    /// # Errors
    /// When the cluster refuses the deletion, or the object is still there after `timeout`.
    pub async fn delete_and_wait(&self, object: &Applied, timeout: std::time::Duration) -> Result<(), BackendError> {
        let id = object.id();
        let mut kinds = Kinds::new(&self.client);
        let Some((resource, scope)) = kinds.resolve(&gvk_of(&object.api_version, &object.kind)).await? else {
            return Ok(());
        };
        let namespace = match scope {
            Scope::Namespaced => Some(
                object
                    .namespace
                    .clone()
                    .or_else(|| self.namespace.clone())
                    .unwrap_or_else(|| self.client.default_namespace().to_owned()),
            ),
            Scope::Cluster => None,
        };
        let api = api_for(&self.client, &resource, namespace.as_deref());
        // Its pods go with a Job (foreground: the Job stays until they are gone).
        let params = DeleteParams {
            propagation_policy: Some(kube::api::PropagationPolicy::Background),
            ..DeleteParams::default()
        };
        match api.delete(&object.name, &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
            Err(e) => return Err(kube_error(&format!("delete {id}"), e)),
        }
        let deadline = tokio::time::Instant::now() + timeout;
        while api.get_opt(&object.name).await.map_err(|e| kube_error(&format!("read {id}"), e))?.is_some() {
            if tokio::time::Instant::now() >= deadline {
                return Err(BackendError::transient_reason(format!(
                    "{id} is still there {timeout:?} after its deletion"
                )));
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        debug!(object = %id, "deleted");
        Ok(())
    }
}
