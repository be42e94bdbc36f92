//! A Helm chart's render, as the hub stores it for a site and the site's gateway applies it:
//! one multi-document YAML whose objects keep Helm's annotations, written in the order Helm
//! installs them (CRDs, `pre-install`/`pre-upgrade` hooks by weight, the chart's objects,
//! `post-install`/`post-upgrade` hooks by weight). [`split`] reads it back into those parts,
//! on either side. And the values: layers merged as Helm merges `--values` files, with `'!key'`
//! removing a key a lower layer set.

use serde_json::{Map, Value};

/// The annotation that makes an object a hook, and the events it runs at.
pub const HOOK: &str = "helm.sh/hook";
/// A hook's weight: lightest first.
pub const HOOK_WEIGHT: &str = "helm.sh/hook-weight";
/// When a hook is deleted: `before-hook-creation` (Helm's default), `hook-succeeded`,
/// `hook-failed`.
pub const HOOK_DELETE_POLICY: &str = "helm.sh/hook-delete-policy";

/// A hook, and when Helm runs it.
#[derive(Debug, Clone, PartialEq)]
pub struct Hook {
    pub object: Value,
    /// `helm.sh/hook-weight`: hooks run lightest first.
    pub weight: i64,
    /// `helm.sh/hook-delete-policy`, Helm's default (`before-hook-creation`) when unset.
    pub delete_policies: Vec<String>,
}

impl Hook {
    /// Whether the hook is deleted when `policy` happens.
    pub fn deleted_on(&self, policy: &str) -> bool {
        self.delete_policies.iter().any(|p| p == policy)
    }
}

/// A chart rendered, in the order Helm installs it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rendered {
    /// CustomResourceDefinitions: applied first, and waited for until Established.
    pub crds: Vec<Value>,
    /// `pre-install` / `pre-upgrade` hooks, lightest first (equal weights in `Kind/name` order).
    pub pre: Vec<Hook>,
    /// The chart's objects.
    pub objects: Vec<Value>,
    /// `post-install` / `post-upgrade` hooks, lightest first.
    pub post: Vec<Hook>,
    /// Hooks for events landfall does not run (delete, rollback), named `Kind/name`.
    pub unused_hooks: Vec<String>,
}

impl Rendered {
    /// The render as the artifact a site gets: every object Helm installs, in its order, each
    /// a YAML document. Hooks landfall does not run are left out.
    pub fn manifests(&self) -> String {
        let hooks = |h: &[Hook]| h.iter().map(|h| h.object.clone()).collect::<Vec<_>>();
        let all = self
            .crds
            .iter()
            .cloned()
            .chain(hooks(&self.pre))
            .chain(self.objects.iter().cloned())
            .chain(hooks(&self.post));
        let mut out = String::new();
        for object in all {
            out.push_str("---\n");
            // A map of JSON values always writes as YAML; JSON (which is YAML) if it ever did not.
            out.push_str(&serde_saphyr::to_string(&object).unwrap_or_else(|_| format!("{object}\n")));
        }
        out
    }
}

/// `Kind/name` of an object.
pub fn kind_name(object: &Value) -> String {
    format!(
        "{}/{}",
        object["kind"].as_str().unwrap_or_default(),
        object.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default()
    )
}

/// Splits rendered manifests (helm's output, or [`Rendered::manifests`]) as Helm installs them.
///
/// # Errors
/// A document that is not YAML, or not an object.
pub fn split(text: &str) -> Result<Rendered, String> {
    let mut out = Rendered::default();
    for document in crate::yaml::documents(text) {
        let object: Value = document.and_then(|d| d.parse()).map_err(|e| e.to_string())?;
        if object.is_null() {
            continue;
        }
        if !object.is_object() {
            return Err(format!("not an object: {object}"));
        }
        let annotation = |key: &str| object.pointer(&format!("/metadata/annotations/{}", key.replace('/', "~1")));
        let text = |key: &str| annotation(key).and_then(Value::as_str).unwrap_or_default().to_string();
        let events: Vec<String> =
            text(HOOK).split(',').map(|e| e.trim().to_string()).filter(|e| !e.is_empty()).collect();
        if events.is_empty() {
            if object["kind"] == "CustomResourceDefinition" {
                out.crds.push(object);
            } else {
                out.objects.push(object);
            }
            continue;
        }
        let hook = Hook {
            weight: text(HOOK_WEIGHT).trim().parse().unwrap_or(0),
            delete_policies: match text(HOOK_DELETE_POLICY) {
                p if p.is_empty() => vec!["before-hook-creation".to_string()],
                p => p.split(',').map(|p| p.trim().to_string()).collect(),
            },
            object,
        };
        let has = |names: &[&str]| events.iter().any(|e| names.contains(&e.as_str()));
        match (has(&["pre-install", "pre-upgrade"]), has(&["post-install", "post-upgrade"])) {
            (true, _) => out.pre.push(hook),
            (false, true) => out.post.push(hook),
            (false, false) => out.unused_hooks.push(kind_name(&hook.object)),
        }
    }
    // Lightest first; equal weights in `Kind/name` order.
    let order = |h: &Hook| (h.weight, kind_name(&h.object));
    out.pre.sort_by_key(order);
    out.post.sort_by_key(order);
    Ok(out)
}

/// `upper` merged over `lower` as Helm merges values files: maps key by key, all the way down;
/// anything else replaced whole. A key `'!key'` in `upper` removes `key` (its value is ignored),
/// and so does a `null`, as in Helm.
pub fn merge_values(lower: &Value, upper: &Value) -> Value {
    match (lower, upper) {
        (Value::Object(low), Value::Object(up)) => {
            let mut merged: Map<String, Value> = low.clone();
            for (key, value) in up {
                if let Some(removed) = key.strip_prefix('!') {
                    merged.remove(removed);
                } else if value.is_null() {
                    merged.remove(key);
                } else {
                    let next = match merged.get(key) {
                        Some(below) => merge_values(below, value),
                        None => without_markers(value),
                    };
                    merged.insert(key.clone(), next);
                }
            }
            Value::Object(merged)
        }
        (_, up) => without_markers(up),
    }
}

/// `value` with its `'!key'` entries (which remove nothing below them) left out.
fn without_markers(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, v)| !k.starts_with('!') && !v.is_null())
                .map(|(k, v)| (k.clone(), without_markers(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn values_merge_key_by_key_and_bang_removes() {
        let package = json!({"image": {"tag": "1", "pull": "always"}, "replicas": 2, "debug": true, "list": [1, 2]});
        let site = json!({"image": {"tag": "2"}, "!debug": null, "list": [3], "new": {"!x": 1, "y": 1}});
        assert_eq!(
            merge_values(&package, &site),
            json!({"image": {"tag": "2", "pull": "always"}, "replicas": 2, "list": [3], "new": {"y": 1}})
        );
        assert_eq!(merge_values(&json!({"a": 1}), &json!({"a": null})), json!({}));
    }

    #[test]
    fn a_render_written_and_split_again_keeps_helms_order() {
        let text = r#"
apiVersion: v1
kind: ConfigMap
metadata: { name: late, annotations: { helm.sh/hook: post-install } }
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: { name: widgets.x.io }
---
apiVersion: v1
kind: ConfigMap
metadata: { name: main }
---
apiVersion: batch/v1
kind: Job
metadata: { name: heavy, annotations: { helm.sh/hook: pre-install, helm.sh/hook-weight: "5", helm.sh/hook-delete-policy: "hook-succeeded, hook-failed" } }
---
apiVersion: v1
kind: ConfigMap
metadata: { name: light, annotations: { helm.sh/hook: pre-upgrade, helm.sh/hook-weight: "-5" } }
---
apiVersion: v1
kind: Pod
metadata: { name: gone, annotations: { helm.sh/hook: pre-delete } }
"#;
        let rendered = split(text).unwrap();
        let again = split(&rendered.manifests()).unwrap();
        let names = |r: &Rendered| {
            let hooks = |h: &[Hook]| h.iter().map(|h| kind_name(&h.object)).collect::<Vec<_>>();
            (
                r.crds.iter().map(kind_name).collect::<Vec<_>>(),
                hooks(&r.pre),
                r.objects.iter().map(kind_name).collect::<Vec<_>>(),
                hooks(&r.post),
            )
        };
        assert_eq!(
            names(&again),
            (
                vec!["CustomResourceDefinition/widgets.x.io".to_string()],
                vec!["ConfigMap/light".to_string(), "Job/heavy".to_string()],
                vec!["ConfigMap/main".to_string()],
                vec!["ConfigMap/late".to_string()],
            )
        );
        assert_eq!(names(&again), names(&rendered));
        assert_eq!(rendered.unused_hooks, ["Pod/gone"]);
        assert!(again.unused_hooks.is_empty(), "a hook landfall does not run is not in the artifact");
        assert!(again.pre[1].deleted_on("hook-failed") && again.pre[1].deleted_on("hook-succeeded"));
        assert!(again.pre[0].deleted_on("before-hook-creation"));
    }
}
