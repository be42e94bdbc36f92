//! One event for people (a line) and for programs (a JSON object), as the CLI prints it
//! and the HTTP API streams it.

use bus_schema::pb;
use bus_schema::runtime::ReadEvent;
use serde_json::{Value, json};

use super::human::rfc3339;

/// One event as a JSON object: where it sits in the stream, its headers, and its payload.
pub fn event_json(e: &ReadEvent) -> Value {
    let d = &e.delivery;
    let payload = match pb::decode_to_json(&d.type_name, &d.payload) {
        Some(Ok(v)) => v,
        Some(Err(err)) => json!({ "undecodable": err.to_string() }),
        None => json!({ "unknown_type": d.type_name, "bytes": d.payload.len() }),
    };
    json!({
        "seq": d.stream_sequence,
        "time": rfc3339(e.published),
        "subject": d.subject,
        "type": d.type_name,
        "id": d.envelope.id,
        "correlation_id": d.envelope.correlation,
        "causation_id": d.envelope.causation,
        "traceparent": d.envelope.traceparent,
        "event": payload,
    })
}

/// One line per event: time, scope, kind, then the interesting fields.
pub fn event_line(e: &ReadEvent) -> String {
    let j = event_json(e);
    let kind = e.delivery.subject.splitn(5, '.').nth(4).unwrap_or(&e.delivery.subject).to_string();
    let time = e.published.format(&time::format_description::well_known::Rfc3339).unwrap_or_default();
    format!("{time}  {kind:<40} {}", summary(&j["event"]))
}

/// `key=value` for the scalar fields of a payload; lists of names are joined, longer lists counted;
/// of a nested message, the names of its fields that are true (a node's `steps`: what was done).
pub fn summary(v: &Value) -> String {
    let Some(obj) = v.as_object() else { return v.to_string() };
    let mut parts = Vec::new();
    for (k, v) in obj {
        let text = match v {
            Value::String(s) if s.is_empty() => continue,
            Value::String(s) => s.clone(),
            Value::Number(n) if n.as_u64() == Some(0) => continue,
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            Value::Array(a) if a.is_empty() => continue,
            Value::Array(a) if a.iter().all(Value::is_string) => {
                a.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(",")
            }
            Value::Array(a) => format!("[{}]", a.len()),
            Value::Object(o) => {
                let set: Vec<&str> =
                    o.iter().filter(|(_, v)| v.as_bool() == Some(true)).map(|(k, _)| k.as_str()).collect();
                if set.is_empty() {
                    continue;
                }
                set.join(",")
            }
            Value::Null => continue,
        };
        let text = if text.contains(' ') { format!("{text:?}") } else { text };
        parts.push(format!("{k}={text}"));
    }
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_keeps_what_matters() {
        let v = json!({"site_id": "edge-1", "node": "n1", "reason": "disk on fire", "nodes": [{"name": "x"}], "failed_nodes": ["n1", "n2"], "revision": 0});
        assert_eq!(summary(&v), "failed_nodes=n1,n2 node=n1 nodes=[1] reason=\"disk on fire\" site_id=edge-1");
        let patched = json!({"node": "n1", "package": {"name": "kubelet", "version": "1.30.0"}, "steps": {"cordoned": true, "drained": true, "evicted": [], "uncordoned": true}});
        assert_eq!(summary(&patched), "node=n1 steps=cordoned,drained,uncordoned");
    }
}
