//! Whether the hub hears a site, as people and dashboards read it.

use bus_schema::pb;
use serde_json::{Value, json};

use super::human::rfc3339_ms;

/// Whether the hub hears a site: `up` or `cut_off` since when, and what the site last said of
/// itself (how many reports it still holds, its latest report). Sites never heard have none.
pub fn link_json(l: &pb::SiteLink) -> Value {
    let cut_off = l.state == pb::LinkState::CutOff as i32;
    let alive = l.last_alive.clone().unwrap_or_default();
    json!({
        "state": if cut_off { "cut_off" } else { "up" },
        "since": rfc3339_ms(l.since_unix_ms),
        "outbox_waiting": alive.outbox_waiting,
        "last_report": (!alive.last_report_type.is_empty()).then(|| json!({
            "type": alive.last_report_type.rsplit('.').next().unwrap_or(&alive.last_report_type),
            "time": rfc3339_ms(alive.last_report_unix_ms),
        })),
        "cut_off_since": (!cut_off && l.cut_off_since_unix_ms > 0).then(|| rfc3339_ms(l.cut_off_since_unix_ms)),
    })
}

/// One line for people: `up`, or `cut off since <time> (...)`.
pub fn link_text(link: &Value) -> String {
    match link["state"].as_str() {
        None => "never heard".to_string(),
        Some("up") => format!("up since {}", link["since"].as_str().unwrap_or("")),
        Some(_) => {
            let mut text = format!("cut off since {}", link["since"].as_str().unwrap_or(""));
            if let Some(t) = link["last_report"]["type"].as_str() {
                text.push_str(&format!("; last report {t} at {}", link["last_report"]["time"].as_str().unwrap_or("")));
            }
            if let Some(n) = link["outbox_waiting"].as_u64().filter(|n| *n > 0) {
                text.push_str(&format!("; {n} report(s) waiting at the site"));
            }
            text
        }
    }
}
