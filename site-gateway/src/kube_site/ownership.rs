//! What the gateway owns of an object, so its next server-side apply says all of it again.
//!
//! An apply is a manager's whole intent: a field it applied before and leaves out now is
//! removed. The gateway writes one host for several reasons (a job's spec, the marks of an
//! announcement) under one field manager, so each write starts from the fields that manager
//! owns, with their live values (read from `metadata.managedFields`), and changes only what it
//! means to change. Fields other managers own are never in it, so they are never fought over.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use kube::ResourceExt;
use serde::Serialize;
use serde_json::{Map, Value};

/// What `manager` owns of `object` now: the start of its next apply.
pub fn intent_of<K: ResourceExt + Serialize>(object: &K, manager: &str) -> Value {
    let value = serde_json::to_value(object).unwrap_or(Value::Null);
    owned_by(&value, object.managed_fields(), manager)
}

/// The fields `manager` owns by apply in `object` (a whole object as JSON), with their live
/// values, plus what every apply needs: apiVersion, kind, metadata.name and namespace.
pub fn owned_by(object: &Value, managed: &[ManagedFieldsEntry], manager: &str) -> Value {
    let mut out = Map::new();
    for entry in managed {
        let ours = entry.manager.as_deref() == Some(manager) && entry.operation.as_deref() == Some("Apply");
        if let (true, Some(fields)) = (ours, entry.fields_v1.as_ref())
            && let Some(Value::Object(part)) = extract(&fields.0, object)
        {
            merge(&mut out, part);
        }
    }
    let mut out = Value::Object(out);
    for key in ["apiVersion", "kind"] {
        out[key] = object[key].clone();
    }
    for key in ["name", "namespace"] {
        if let Some(v) = object["metadata"].get(key) {
            out["metadata"][key] = v.clone();
        }
    }
    out
}

/// The part of `value` that the field set `fields` (fieldsV1) names.
fn extract(fields: &Value, value: &Value) -> Option<Value> {
    let fields = fields.as_object()?;
    let named = fields.keys().any(|k| k.starts_with("f:"));
    let listed = fields.keys().any(|k| k.starts_with("v:") || k.starts_with("k:"));
    if !named && !listed {
        // `{}` or `{".": {}}`: the whole value (a leaf, or an atomic map or list).
        return Some(value.clone());
    }
    if listed {
        let items = value.as_array()?;
        let mut out = Vec::new();
        for (key, sub) in fields {
            if let Some(v) = key.strip_prefix("v:") {
                let v: Value = serde_json::from_str(v).ok()?;
                if items.contains(&v) {
                    out.push(v);
                }
            } else if let Some(k) = key.strip_prefix("k:") {
                let k: Map<String, Value> = serde_json::from_str(k).ok()?;
                let item = items.iter().find(|i| k.iter().all(|(f, v)| i.get(f) == Some(v)))?;
                let mut part = extract(sub, item).unwrap_or_else(|| Value::Object(Map::new()));
                if let Value::Object(m) = &mut part {
                    m.extend(k);
                }
                out.push(part);
            }
        }
        return Some(Value::Array(out));
    }
    let object = value.as_object()?;
    let mut out = Map::new();
    for (key, sub) in fields {
        let Some(name) = key.strip_prefix("f:") else { continue };
        if let Some(part) = object.get(name).and_then(|child| extract(sub, child)) {
            out.insert(name.to_string(), part);
        }
    }
    Some(Value::Object(out))
}

/// Lays `part` over `into`, objects merged key by key, anything else replaced.
pub fn merge(into: &mut Map<String, Value>, part: Map<String, Value>) {
    for (key, value) in part {
        match (into.get_mut(&key), value) {
            (Some(Value::Object(existing)), Value::Object(more)) => merge(existing, more),
            (_, value) => {
                into.insert(key, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1;
    use serde_json::json;

    use super::*;

    fn entry(manager: &str, operation: &str, fields: Value) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some(operation.into()),
            fields_v1: Some(FieldsV1(fields)),
            ..Default::default()
        }
    }

    #[test]
    fn only_what_the_manager_applied_is_kept_with_live_values() {
        let host = json!({
            "apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost",
            "metadata": {"name": "n1", "namespace": "s", "uid": "u",
                         "annotations": {"landfall.io/announced": "id", "other": "x"},
                         "finalizers": ["baremetalhost.metal3.io", "landfall.io/node-removal"]},
            "spec": {"online": true, "bootMACAddress": "aa", "bmc": {"address": "ipmi://x", "credentialsName": "c"},
                     "image": {"url": "u", "checksum": "c"}, "userData": {"name": "ud", "namespace": "s"}}
        });
        let managed = [
            entry(
                "landfall-gateway",
                "Apply",
                json!({"f:metadata": {"f:annotations": {"f:landfall.io/announced": {}},
                                      "f:finalizers": {"v:\"landfall.io/node-removal\"": {}}},
                       "f:spec": {"f:online": {}, "f:image": {"f:url": {}, "f:checksum": {}}, "f:userData": {}}}),
            ),
            entry("kubectl", "Apply", json!({"f:spec": {"f:bmc": {"f:address": {}}, "f:bootMACAddress": {}}})),
            entry("landfall-gateway", "Update", json!({"f:spec": {"f:bootMACAddress": {}}})),
        ];
        assert_eq!(
            owned_by(&host, &managed, "landfall-gateway"),
            json!({
                "apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost",
                "metadata": {"name": "n1", "namespace": "s",
                             "annotations": {"landfall.io/announced": "id"},
                             "finalizers": ["landfall.io/node-removal"]},
                "spec": {"online": true, "image": {"url": "u", "checksum": "c"}, "userData": {"name": "ud", "namespace": "s"}}
            })
        );
    }

    #[test]
    fn keyed_list_items_keep_their_keys() {
        let obj = json!({"apiVersion": "v", "kind": "K", "metadata": {"name": "n"},
                         "spec": {"ports": [{"port": 80, "name": "http", "extra": 1}, {"port": 443, "name": "https"}]}});
        let managed = [entry("m", "Apply", json!({"f:spec": {"f:ports": {"k:{\"port\":80}": {"f:name": {}}}}}))];
        assert_eq!(owned_by(&obj, &managed, "m")["spec"], json!({"ports": [{"port": 80, "name": "http"}]}));
    }

    #[test]
    fn an_object_the_manager_never_applied_gives_only_its_identity() {
        let obj =
            json!({"apiVersion": "v", "kind": "K", "metadata": {"name": "n", "namespace": "s"}, "spec": {"a": 1}});
        assert_eq!(
            owned_by(&obj, &[], "m"),
            json!({"apiVersion": "v", "kind": "K", "metadata": {"name": "n", "namespace": "s"}})
        );
    }
}
