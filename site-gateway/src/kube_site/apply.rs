//! Container packages: bundles of Kubernetes manifests (multi-document YAML), server-side
//! applied to the site's application cluster, and pruned of the objects a newer version dropped.
//!
//! Every object a package applies carries the label [`PACKAGE_LABEL`] (the package's name) and
//! the annotation [`VERSION_ANNOTATION`]. The applier keeps one inventory per package,
//! `<state_dir>/<name>.json`: the objects the last successful apply made, in apply order. The next
//! version deletes what that inventory has and the new version does not, but only objects that
//! still carry the package's label: one somebody else took over (removed or changed the label)
//! is left alone.
//!
//! An apply that fails half-way has changed some objects already. Before it touches the cluster,
//! the objects it is about to create are added to the inventory's `pending` list (its `version`
//! and `objects` stay those of the last success), so a later version that drops them still
//! prunes them.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use bus_schema::yaml;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, Preconditions};
use kube::core::{GroupVersion, GroupVersionKind};
use kube::discovery::{self, ApiResource, Scope};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;
use tracing::{debug, info};

use super::error::kube_error;
use super::marks::FIELD_MANAGER;
use crate::backend::BackendError;

mod unlisted;

/// The label that says which package an object belongs to; its value is the package's name.
pub const PACKAGE_LABEL: &str = "landfall.io/package";
/// The annotation that says which version of its package last applied an object.
pub const VERSION_ANNOTATION: &str = "landfall.io/package-version";

/// Applies container packages to one application cluster, and prunes what they dropped.
#[derive(Clone)]
pub struct ManifestApplier {
    client: kube::Client,
    state_dir: PathBuf,
    /// Where namespaced objects without a namespace go: a chart's release namespace, else the
    /// client's default.
    namespace: Option<String>,
    /// One apply per package at a time: each reads and writes the package's inventory.
    locks: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
}

/// What an apply did, as `Kind/namespace/name` ids (`Kind/name` for cluster-scoped objects).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApplySummary {
    /// Created or changed, in apply order.
    pub applied: Vec<String>,
    /// Applied, and the server found nothing to change (same `resourceVersion` as before).
    pub unchanged: Vec<String>,
    /// Deleted: the previous version had them, this one does not.
    pub pruned: Vec<String>,
    /// Every object of the package as applied (changed or not), for whoever waits on them.
    pub objects: Vec<super::workloads::Applied>,
}

impl fmt::Debug for ManifestApplier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManifestApplier").field("state_dir", &self.state_dir).finish_non_exhaustive()
    }
}

impl ManifestApplier {
    /// `client`: the application cluster. `state_dir`: where the applier keeps each package's
    /// inventory (what it applied last), one JSON file per package name.
    pub fn new(client: kube::Client, state_dir: PathBuf) -> Self {
        Self { client, state_dir, namespace: None, locks: Arc::default() }
    }

    /// The same applier, putting namespaced objects without a namespace in `namespace`.
    pub fn in_namespace(&self, namespace: &str) -> Self {
        Self { namespace: Some(namespace.to_string()), ..self.clone() }
    }

    /// The cluster it applies to.
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// Server-side applies every object of `manifests` (multi-document YAML) as package
    /// `name`@`version` with the field manager [`FIELD_MANAGER`], never forcing a field another
    /// manager owns; then deletes the objects the previous version applied and this one does
    /// not, unless somebody took them over. Records the new inventory only once all of it
    /// succeeded. Applying the same version again changes nothing.
    ///
    /// Namespaced objects without a namespace go to the client's default namespace.
    ///
    /// # Errors
    /// `Permanent` when the manifests do not parse, name a kind the cluster does not serve, or
    /// the server rejects an object (schema, a field another manager owns: the message says
    /// which); `Transient` when the cluster is unreachable or busy, or the state directory
    /// cannot be written. Objects applied before the failure stay applied.
    pub async fn apply(&self, name: &str, version: &str, manifests: &[u8]) -> Result<ApplySummary, BackendError> {
        let summary = self
            .apply_package(name, version, manifests)
            .await
            .map_err(|e| prefixed(&format!("container package {name}@{version}"), e))?;
        info!(
            package = name,
            version,
            applied = summary.applied.len(),
            unchanged = summary.unchanged.len(),
            pruned = summary.pruned.len(),
            "container package applied"
        );
        Ok(summary)
    }

    async fn apply_package(&self, name: &str, version: &str, manifests: &[u8]) -> Result<ApplySummary, BackendError> {
        check_package_name(name)?;
        let manifests = parse_manifests(manifests)?;

        let lock = self.lock(name);
        let _one_at_a_time = lock.lock().await;

        let mut kinds = Kinds::new(&self.client);
        let plan = self.plan(&mut kinds, name, version, manifests).await?;
        let targets: Vec<ObjectRef> = plan.iter().map(|p| p.target.clone()).collect();

        let previous = self.read_inventory(name).await?;
        let fresh = not_in_inventory(&previous, &targets);
        if !fresh.is_empty() {
            let mut pending = previous.clone();
            pending.pending.extend(fresh);
            self.write_inventory(name, &pending).await?;
        }

        let mut summary = ApplySummary::default();
        for p in plan {
            let id = p.target.id();
            let api = p.api(&self.client);
            let before = api.get_opt(&p.target.name).await.map_err(|e| kube_error(&format!("read {id}"), e))?;
            let after = api
                .patch(&p.target.name, &PatchParams::apply(FIELD_MANAGER), &Patch::Apply(&p.object))
                .await
                .map_err(|e| kube_error(&format!("apply {id} ({})", p.doc), e))?;
            let rv = |o: &DynamicObject| o.metadata.resource_version.clone();
            if before.is_some_and(|b| rv(&b).is_some() && rv(&b) == rv(&after)) {
                summary.unchanged.push(id);
            } else {
                summary.applied.push(id);
            }
        }

        for gone in prune_candidates(&previous, &targets) {
            if let Some(id) = self.prune(&mut kinds, name, &gone).await? {
                summary.pruned.push(id);
            }
        }

        summary.objects = targets.iter().map(ObjectRef::applied).collect();
        let applied = Inventory { version: version.to_owned(), objects: targets, pending: Vec::new() };
        self.write_inventory(name, &applied).await?;
        Ok(summary)
    }

    /// Resolves every manifest's resource and target before anything is applied, so an unknown
    /// kind or a duplicate fails the package without touching the cluster.
    async fn plan(
        &self,
        kinds: &mut Kinds<'_>,
        name: &str,
        version: &str,
        manifests: Vec<Manifest>,
    ) -> Result<Vec<Planned>, BackendError> {
        let mut plan: Vec<Planned> = Vec::with_capacity(manifests.len());
        for Manifest { doc, gvk, mut object } in manifests {
            let Some((resource, scope)) = kinds.resolve(&gvk).await? else {
                return Err(BackendError::permanent_reason(format!(
                    "{doc}: the cluster serves no kind {} in {}",
                    gvk.kind,
                    gvk.api_version()
                )));
            };
            object.metadata.namespace = match scope {
                Scope::Namespaced => Some(
                    object
                        .metadata
                        .namespace
                        .take()
                        .filter(|ns| !ns.is_empty())
                        .or_else(|| self.namespace.clone())
                        .unwrap_or_else(|| self.client.default_namespace().to_owned()),
                ),
                Scope::Cluster => None,
            };
            object.metadata.labels.get_or_insert_with(BTreeMap::new).insert(PACKAGE_LABEL.into(), name.into());
            object
                .metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(VERSION_ANNOTATION.into(), version.into());
            let target = ObjectRef {
                api_version: gvk.api_version(),
                kind: gvk.kind.clone(),
                namespace: object.metadata.namespace.clone(),
                name: object.metadata.name.clone().unwrap_or_default(),
            };
            if let Some(first) = plan.iter().find(|p| p.target.same_object(&target)) {
                return Err(BackendError::permanent_reason(format!(
                    "{doc} and {} are the same object {}",
                    first.doc,
                    target.id()
                )));
            }
            plan.push(Planned { doc, resource, target, object });
        }
        Ok(plan)
    }

    /// Deletes `object` unless it is gone or no longer carries the package's label. Returns its
    /// id when it deleted it.
    async fn prune(
        &self,
        kinds: &mut Kinds<'_>,
        name: &str,
        object: &ObjectRef,
    ) -> Result<Option<String>, BackendError> {
        let id = object.id();
        let Some((resource, _)) = kinds.resolve(&object.gvk()).await? else {
            debug!(object = %id, "kind no longer served: nothing to prune");
            return Ok(None);
        };
        let api = api_for(&self.client, &resource, object.namespace.as_deref());
        let Some(current) = api.get_opt(&object.name).await.map_err(|e| kube_error(&format!("read {id}"), e))? else {
            return Ok(None);
        };
        let owner = current.metadata.labels.as_ref().and_then(|l| l.get(PACKAGE_LABEL));
        if owner.map(String::as_str) != Some(name) {
            info!(package = name, object = %id, owner = ?owner, "left alone: no longer labelled as the package's");
            return Ok(None);
        }
        // The preconditions make sure what is deleted is what was just found labelled as ours.
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: current.metadata.uid.clone(),
                resource_version: current.metadata.resource_version.clone(),
            }),
            ..DeleteParams::default()
        };
        match api.delete(&object.name, &params).await {
            Ok(_) => {
                debug!(package = name, object = %id, "pruned");
                Ok(Some(id))
            }
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
            Err(kube::Error::Api(status)) if status.code == 409 => Err(BackendError::transient_reason(format!(
                "prune {id}: it changed while being pruned: {}",
                status.message
            ))),
            Err(e) => Err(kube_error(&format!("prune {id}"), e)),
        }
    }

    fn lock(&self, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        locks.entry(name.to_owned()).or_default().clone()
    }

    fn inventory_path(&self, name: &str) -> PathBuf {
        self.state_dir.join(format!("{name}.json"))
    }

    async fn read_inventory(&self, name: &str) -> Result<Inventory, BackendError> {
        let path = self.inventory_path(name);
        match tokio::fs::read(&path).await {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                BackendError::permanent(format!("read inventory {}: not an inventory", path.display()), e)
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Inventory::default()),
            Err(e) => Err(BackendError::transient(format!("read inventory {}", path.display()), e)),
        }
    }

    /// Writes the inventory atomically: a temporary file, synced, renamed over the old one.
    async fn write_inventory(&self, name: &str, inventory: &Inventory) -> Result<(), BackendError> {
        let path = self.inventory_path(name);
        let tmp = self.state_dir.join(format!(".{name}.json.tmp"));
        let bytes = serde_json::to_vec_pretty(inventory).expect("an inventory serializes");
        write_atomically(&self.state_dir, &tmp, &path, &bytes)
            .await
            .map_err(|e| BackendError::transient(format!("write inventory {}", path.display()), e))
    }
}

async fn write_atomically(dir: &Path, tmp: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    tokio::fs::create_dir_all(dir).await?;
    let mut file = tokio::fs::File::create(tmp).await?;
    file.write_all(bytes).await?;
    file.sync_all().await?;
    drop(file);
    tokio::fs::rename(tmp, path).await?;
    tokio::fs::File::open(dir).await?.sync_all().await
}

/// The package's name is its label's value and its inventory's file name: it must be a valid
/// label value, which also keeps it a plain file name.
fn check_package_name(name: &str) -> Result<(), BackendError> {
    let valid = !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && name.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && name.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric());
    if valid {
        Ok(())
    } else {
        Err(BackendError::permanent_reason(format!("the name {name:?} is not a valid label value")))
    }
}

fn prefixed(context: &str, e: BackendError) -> BackendError {
    match e {
        BackendError::Permanent { context: own, source } => {
            BackendError::Permanent { context: format!("{context}: {own}"), source }
        }
        BackendError::Transient { context: own, source } => {
            BackendError::Transient { context: format!("{context}: {own}"), source }
        }
        other => other,
    }
}

fn api_for(client: &kube::Client, resource: &ApiResource, namespace: Option<&str>) -> Api<DynamicObject> {
    match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
        None => Api::all_with(client.clone(), resource),
    }
}

/// The resources of the kinds one apply meets, each looked up once (pinned to its group
/// version: no full discovery).
struct Kinds<'a> {
    client: &'a kube::Client,
    resolved: HashMap<GroupVersionKind, Option<(ApiResource, Scope)>>,
}

impl<'a> Kinds<'a> {
    fn new(client: &'a kube::Client) -> Self {
        Self { client, resolved: HashMap::new() }
    }

    /// `None` when the cluster does not serve the kind (or its group version).
    async fn resolve(&mut self, gvk: &GroupVersionKind) -> Result<Option<(ApiResource, Scope)>, BackendError> {
        if let Some(known) = self.resolved.get(gvk) {
            return Ok(known.clone());
        }
        let found = match discovery::pinned_kind(self.client, gvk).await {
            Ok((resource, caps)) => Some((resource, caps.scope)),
            Err(kube::Error::Discovery(_)) => None,
            Err(kube::Error::Api(status)) if status.code == 404 => None,
            Err(e) => return Err(kube_error(&format!("look up kind {} in {}", gvk.kind, gvk.api_version()), e)),
        };
        self.resolved.insert(gvk.clone(), found.clone());
        Ok(found)
    }
}

/// One object of the package, as its manifest gives it.
#[derive(Debug, Clone)]
struct Manifest {
    /// Where it is in the package: `document 2`, or `document 2, item 1` in a `List`.
    doc: String,
    gvk: GroupVersionKind,
    object: DynamicObject,
}

/// A manifest resolved: its resource, where it goes, and the object to apply there.
struct Planned {
    doc: String,
    resource: ApiResource,
    target: ObjectRef,
    object: DynamicObject,
}

impl Planned {
    fn api(&self, client: &kube::Client) -> Api<DynamicObject> {
        api_for(client, &self.resource, self.target.namespace.as_deref())
    }
}

/// Parses multi-document YAML into the objects it holds, in order. Empty documents are skipped;
/// `kind: List` documents stand for their items. Documents are numbered from 1, counting the
/// empty ones, as they stand in the file.
fn parse_manifests(bytes: &[u8]) -> Result<Vec<Manifest>, BackendError> {
    let text =
        std::str::from_utf8(bytes).map_err(|e| BackendError::permanent("the manifests are not UTF-8 text", e))?;
    let mut manifests = Vec::new();
    for (i, document) in yaml::documents(text).into_iter().enumerate() {
        let at = format!("document {}", i + 1);
        let value = document
            .and_then(|d| d.parse::<serde_json::Value>())
            .map_err(|e| BackendError::permanent(at.clone(), e))?;
        manifest(value, at, &mut manifests)?;
    }
    Ok(manifests)
}

fn text(v: Option<&serde_json::Value>) -> Option<&str> {
    v.and_then(serde_json::Value::as_str).filter(|s| !s.is_empty())
}

fn manifest(value: serde_json::Value, at: String, out: &mut Vec<Manifest>) -> Result<(), BackendError> {
    let map = match &value {
        serde_json::Value::Null => return Ok(()),
        serde_json::Value::Object(map) => map,
        _ => return Err(BackendError::permanent_reason(format!("{at}: not a Kubernetes object (a mapping)"))),
    };
    let api_version = text(map.get("apiVersion"));
    let kind = text(map.get("kind"));
    if kind == Some("List") {
        let Some(items) = map.get("items").and_then(serde_json::Value::as_array) else {
            return Err(BackendError::permanent_reason(format!("{at}: a List without items")));
        };
        for (j, item) in items.iter().enumerate() {
            manifest(item.clone(), format!("{at}, item {}", j + 1), out)?;
        }
        return Ok(());
    }
    let name = text(map.get("metadata").and_then(|m| m.get("name")));
    let missing: Vec<&str> = [("apiVersion", api_version), ("kind", kind), ("metadata.name", name)]
        .into_iter()
        .filter_map(|(field, v)| v.is_none().then_some(field))
        .collect();
    let (Some(api_version), Some(kind), Some(_)) = (api_version, kind, name) else {
        return Err(BackendError::permanent_reason(format!("{at}: no {}", missing.join(", "))));
    };
    let gvk = GroupVersion::from_str(api_version).map_err(|e| BackendError::permanent(at.clone(), e))?.with_kind(kind);
    let object: DynamicObject = serde_json::from_value(value).map_err(|e| BackendError::permanent(at.clone(), e))?;
    out.push(Manifest { doc: at, gvk, object });
    Ok(())
}

fn gvk_of(api_version: &str, kind: &str) -> GroupVersionKind {
    GroupVersion::from_str(api_version).unwrap_or_else(|_| GroupVersion::gv("", api_version)).with_kind(kind)
}

/// An object a package applied, as the inventory records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ObjectRef {
    api_version: String,
    kind: String,
    /// `None` for cluster-scoped objects.
    #[serde(default)]
    namespace: Option<String>,
    name: String,
}

impl ObjectRef {
    /// `Kind/namespace/name`, or `Kind/name` when cluster-scoped.
    fn id(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{}/{ns}/{}", self.kind, self.name),
            None => format!("{}/{}", self.kind, self.name),
        }
    }

    fn group(&self) -> &str {
        self.api_version.rsplit_once('/').map_or("", |(group, _)| group)
    }

    fn gvk(&self) -> GroupVersionKind {
        gvk_of(&self.api_version, &self.kind)
    }

    fn applied(&self) -> super::workloads::Applied {
        super::workloads::Applied {
            api_version: self.api_version.clone(),
            kind: self.kind.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }

    /// The same object, whatever version of its kind's API names it: a manifest moving to a
    /// newer `apiVersion` does not make its object prunable.
    fn same_object(&self, other: &ObjectRef) -> bool {
        self.group() == other.group()
            && self.kind == other.kind
            && self.namespace == other.namespace
            && self.name == other.name
    }
}

/// `<state_dir>/<name>.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Inventory {
    /// The version the last successful apply applied; empty before the first.
    version: String,
    /// What it applied, in order.
    objects: Vec<ObjectRef>,
    /// Objects a later apply created (or meant to) before it failed: they may exist, with the
    /// package's label, and are pruned like `objects` once a version without them succeeds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pending: Vec<ObjectRef>,
}

/// The targets the inventory knows nothing of, neither applied nor pending.
fn not_in_inventory(inventory: &Inventory, targets: &[ObjectRef]) -> Vec<ObjectRef> {
    targets
        .iter()
        .filter(|t| !inventory.objects.iter().chain(&inventory.pending).any(|o| o.same_object(t)))
        .cloned()
        .collect()
}

/// What the inventory has and `targets` do not, in the order to delete them: the reverse of the
/// order they were applied in.
fn prune_candidates(inventory: &Inventory, targets: &[ObjectRef]) -> Vec<ObjectRef> {
    let mut candidates: Vec<ObjectRef> = Vec::new();
    for o in inventory.objects.iter().chain(&inventory.pending) {
        if !targets.iter().chain(&candidates).any(|t| t.same_object(o)) {
            candidates.push(o.clone());
        }
    }
    candidates.reverse();
    candidates
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(api_version: &str, kind: &str, namespace: Option<&str>, name: &str) -> ObjectRef {
        ObjectRef {
            api_version: api_version.into(),
            kind: kind.into(),
            namespace: namespace.map(Into::into),
            name: name.into(),
        }
    }

    fn parse_err(yaml: &str) -> String {
        parse_manifests(yaml.as_bytes()).expect_err("must not parse").reason()
    }

    #[test]
    fn parses_documents_in_order_and_skips_empty_ones() {
        let yaml = "---\n\
            apiVersion: apps.landfall.test/v1\nkind: Widget\nmetadata: {name: a, namespace: x}\nspec: {replicas: 1}\n\
            ---\n---\n# only a comment\n---\n\
            apiVersion: apps.landfall.test/v1\nkind: Gadget\nmetadata: {name: b}\n";
        let m = parse_manifests(yaml.as_bytes()).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].gvk, GroupVersionKind::gvk("apps.landfall.test", "v1", "Widget"));
        assert_eq!(m[0].object.metadata.namespace.as_deref(), Some("x"));
        assert_eq!(m[0].object.data["spec"]["replicas"], 1);
        assert_eq!(m[1].gvk.kind, "Gadget");
        assert_eq!(m[1].doc, "document 4");
    }

    #[test]
    fn core_group_kinds_have_an_empty_group() {
        let m = parse_manifests(b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n").unwrap();
        assert_eq!(m[0].gvk, GroupVersionKind::gvk("", "v1", "ConfigMap"));
    }

    #[test]
    fn flattens_lists() {
        let yaml = "apiVersion: v1\nkind: List\nitems:\n\
            - {apiVersion: a.test/v1, kind: A, metadata: {name: one}}\n\
            - {apiVersion: a.test/v1, kind: B, metadata: {name: two}}\n";
        let m = parse_manifests(yaml.as_bytes()).unwrap();
        assert_eq!(m.iter().map(|m| m.gvk.kind.as_str()).collect::<Vec<_>>(), ["A", "B"]);
        assert_eq!(m[1].doc, "document 1, item 2");
        let e = parse_err("apiVersion: v1\nkind: List\nitems:\n- {apiVersion: a.test/v1, metadata: {name: x}}\n");
        assert_eq!(e, "document 1, item 1: no kind");
    }

    #[test]
    fn a_document_missing_identity_is_named() {
        let ok = "apiVersion: a.test/v1\nkind: A\nmetadata: {name: ok}\n";
        assert_eq!(
            parse_err(&format!("{ok}---\napiVersion: a.test/v1\nmetadata: {{name: x}}\n")),
            "document 2: no kind"
        );
        assert_eq!(parse_err("kind: A\nmetadata: {name: x}\n"), "document 1: no apiVersion");
        assert_eq!(
            parse_err("apiVersion: a.test/v1\nkind: A\nmetadata: {generateName: x-}\n"),
            "document 1: no metadata.name"
        );
        assert_eq!(parse_err("spec: {}\n"), "document 1: no apiVersion, kind, metadata.name");
        assert_eq!(parse_err("- just\n- a list\n"), "document 1: not a Kubernetes object (a mapping)");
        assert!(parse_err(&format!("{ok}---\nkind: [unclosed\n")).starts_with("document 2: "));
        assert!(
            parse_err("apiVersion: a.test/v1\nkind: A\nmetadata: {name: x, labels: [no]}\n")
                .starts_with("document 1: ")
        );
    }

    #[test]
    fn ids_name_kind_namespace_and_name() {
        assert_eq!(obj("a.test/v1", "Widget", Some("ns"), "w").id(), "Widget/ns/w");
        assert_eq!(obj("a.test/v1", "Gadget", None, "g").id(), "Gadget/g");
    }

    #[test]
    fn the_same_object_under_another_api_version_is_not_pruned() {
        let previous = Inventory {
            version: "1".into(),
            objects: vec![obj("a.test/v1alpha1", "A", Some("ns"), "x"), obj("v1", "ConfigMap", Some("ns"), "x")],
            pending: vec![],
        };
        let targets = [obj("a.test/v1", "A", Some("ns"), "x")];
        assert_eq!(prune_candidates(&previous, &targets), [obj("v1", "ConfigMap", Some("ns"), "x")]);
        assert!(not_in_inventory(&previous, &targets).is_empty());
    }

    #[test]
    fn prunes_in_reverse_apply_order_pending_ones_included_once() {
        let (a, b, c, d) = (
            obj("a.test/v1", "A", Some("ns"), "a"),
            obj("a.test/v1", "B", None, "b"),
            obj("a.test/v1", "A", Some("other"), "a"),
            obj("a.test/v1", "A", Some("ns"), "d"),
        );
        let previous = Inventory {
            version: "1".into(),
            objects: vec![a.clone(), b.clone(), c.clone()],
            pending: vec![d.clone(), b.clone()],
        };
        assert_eq!(prune_candidates(&previous, std::slice::from_ref(&c)), [d.clone(), b.clone(), a.clone()]);
        assert_eq!(prune_candidates(&previous, &[a.clone(), b.clone(), c.clone(), d.clone()]), []);
        assert_eq!(not_in_inventory(&Inventory::default(), std::slice::from_ref(&a)), std::slice::from_ref(&a));
        assert_eq!(not_in_inventory(&previous, &[a, d]), []);
    }

    #[test]
    fn inventory_file_format() {
        let inventory = Inventory {
            version: "1.2.0".into(),
            objects: vec![obj("a.test/v1", "A", Some("ns"), "a"), obj("a.test/v1", "B", None, "b")],
            pending: vec![],
        };
        let json = serde_json::to_value(&inventory).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"version": "1.2.0", "objects": [
                {"apiVersion": "a.test/v1", "kind": "A", "namespace": "ns", "name": "a"},
                {"apiVersion": "a.test/v1", "kind": "B", "namespace": null, "name": "b"},
            ]})
        );
        assert_eq!(serde_json::from_value::<Inventory>(json).unwrap(), inventory);
    }

    #[tokio::test]
    async fn inventory_is_replaced_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let (tmp, path) = (state.join(".p.json.tmp"), state.join("p.json"));
        write_atomically(&state, &tmp, &path, b"one").await.unwrap();
        write_atomically(&state, &tmp, &path, b"two").await.unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert!(!tmp.exists());
    }

    #[test]
    fn package_names_are_label_values() {
        for good in ["web", "a", "web-app_1.2", "A9"] {
            assert!(check_package_name(good).is_ok(), "{good}");
        }
        for bad in ["", "..", "../etc", "a/b", "-web", "web.", &"x".repeat(64), "wéb"] {
            assert!(matches!(check_package_name(bad), Err(BackendError::Permanent { .. })), "{bad}");
        }
    }

    fn api_error(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(kube::core::Status::failure(message, "Whatever").with_code(code).boxed())
    }

    #[test]
    fn rejections_are_permanent_and_outages_transient() {
        for code in [400, 403, 404, 409, 422] {
            let e = kube_error("apply A/ns/a", api_error(code, "nope"));
            assert!(matches!(e, BackendError::Permanent { .. }), "{code}: {e:?}");
            assert_eq!(e.reason(), "apply A/ns/a: nope", "{code}");
        }
        for code in [408, 429, 500, 503] {
            assert!(matches!(kube_error("x", api_error(code, "busy")), BackendError::Transient { .. }), "{code}");
        }
        let typed = "failed to create typed patch object (default/a; a.test/v1, Kind=A): .spec.replicas: \
                     expected numeric (int or float), got string";
        let e = kube_error("x", api_error(500, typed));
        assert!(matches!(&e, BackendError::Permanent { .. } if e.reason().ends_with("got string")), "{e:?}");
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e = kube_error("x", kube::Error::Service(Box::new(io)));
        assert!(matches!(&e, BackendError::Transient { .. } if e.reason().ends_with("refused")), "{e:?}");
    }
}
