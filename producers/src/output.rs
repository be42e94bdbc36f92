//! How events and state are printed for people (text) and programs (JSON).

use bus_schema::pb;
use bus_schema::runtime::ReadEvent;
use serde_json::{Value, json};

/// Prints a document as `-o json` (pretty) or `-o yaml` asks.
///
/// # Errors
/// When the value cannot be written as YAML (it always can be as JSON).
pub fn emit(format: crate::Format, v: &Value) -> anyhow::Result<()> {
    match format {
        crate::Format::Yaml => print!("{}", serde_yaml::to_string(v)?),
        _ => println!("{}", serde_json::to_string_pretty(v)?),
    }
    Ok(())
}

/// Prints one item of a stream: a JSON line, or a YAML document of its own.
///
/// # Errors
/// As [`emit`].
pub fn emit_line(format: crate::Format, v: &Value) -> anyhow::Result<()> {
    match format {
        crate::Format::Yaml => print!("---\n{}", serde_yaml::to_string(v)?),
        _ => println!("{v}"),
    }
    Ok(())
}

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

pub fn rfc3339(t: time::OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}

/// A Unix time in milliseconds as RFC 3339, to the second; "" for 0 (never).
pub fn rfc3339_ms(unix_ms: i64) -> String {
    if unix_ms <= 0 {
        return String::new();
    }
    time::OffsetDateTime::from_unix_timestamp(unix_ms / 1000).map(rfc3339).unwrap_or_default()
}

/// A byte count for people: `512 B`, `1.5 KiB`, `20.0 MiB`.
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// A duration in milliseconds for people: `850ms`, `12.3s`, `4m05s`, `1h02m`.
pub fn human_duration_ms(ms: i64) -> String {
    let ms = ms.max(0);
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..60_000 => format!("{:.1}s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{}m{:02}s", ms / 60_000, ms % 60_000 / 1000),
        _ => format!("{}h{:02}m", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

/// One line per event: time, scope, kind, then the interesting fields.
pub fn event_line(e: &ReadEvent) -> String {
    let j = event_json(e);
    let kind = e.delivery.subject.splitn(4, '.').nth(3).unwrap_or(&e.delivery.subject).to_string();
    let time = e.published.format(&time::format_description::well_known::Rfc3339).unwrap_or_default();
    format!("{time}  {kind:<40} {}", summary(&j["event"]))
}

/// `key=value` for the scalar fields of a payload; lists of names are joined, longer lists counted.
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
            Value::Object(_) => continue,
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
    }

    #[test]
    fn sizes_and_durations_for_people() {
        assert_eq!(human_size(0), "0 B");
        assert_eq!(human_size(1023), "1023 B");
        assert_eq!(human_size(1536), "1.5 KiB");
        assert_eq!(human_size(20 * 1024 * 1024), "20.0 MiB");
        assert_eq!(human_size(3 * 1024 * 1024 * 1024), "3.0 GiB");
        assert_eq!(human_duration_ms(850), "850ms");
        assert_eq!(human_duration_ms(12_345), "12.3s");
        assert_eq!(human_duration_ms(245_000), "4m05s");
        assert_eq!(human_duration_ms(3_720_000), "1h02m");
        assert_eq!(rfc3339_ms(0), "");
        assert_eq!(rfc3339_ms(1_700_000_000_999), "2023-11-14T22:13:20Z");
    }
}
