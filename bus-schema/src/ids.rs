//! Message ids.
//!
//! A command's id is a UUIDv7 chosen by its publisher (a retry reuses it, so JetStream's
//! dedup window drops the copy). A message derived from another one gets a deterministic
//! id, a UUIDv5 of (cause, step, node): whoever derives it again, after a crash or a
//! redelivery, derives the same id, and the copy is dropped.

use uuid::Uuid;

/// A fresh id for a new root message.
pub fn new_id() -> Uuid {
    Uuid::now_v7()
}

/// The deterministic id of the message that `cause` produces at `step` (for `node`, if any).
pub fn derived_id(cause: &str, step: &str, node: Option<&str>) -> Uuid {
    let namespace = Uuid::parse_str(cause).unwrap_or_else(|_| Uuid::new_v5(&Uuid::NAMESPACE_OID, cause.as_bytes()));
    let name = match node {
        Some(node) => format!("{step}/{node}"),
        None => step.to_string(),
    };
    Uuid::new_v5(&namespace, name.as_bytes())
}

/// A W3C `traceparent` that continues the trace of `parent` (when it parses) or starts one
/// whose trace id is the correlation id, so every message of one command shares a trace.
pub fn traceparent(parent: Option<&str>, correlation: &str, span_from: &Uuid) -> String {
    let trace_id = parent
        .and_then(|p| p.split('-').nth(1))
        .filter(|t| t.len() == 32 && t.chars().all(|c| c.is_ascii_hexdigit()))
        .map(str::to_owned)
        .unwrap_or_else(|| match Uuid::parse_str(correlation) {
            Ok(u) => u.simple().to_string(),
            Err(_) => Uuid::new_v5(&Uuid::NAMESPACE_OID, correlation.as_bytes()).simple().to_string(),
        });
    let span = &span_from.simple().to_string()[16..32];
    format!("00-{trace_id}-{span}-01")
}

/// The id of the `NodeAdded` a gateway publishes for a host that appeared: the same host
/// announced again (a gateway restart) gets the same id, so the command is carried out once.
/// `incarnation` tells apart hosts of the same name and MAC deleted and created again (a
/// BareMetalHost's uid): each is a new host, announced anew. Empty when the site has none.
pub fn node_added_id(site: &str, node: &str, boot_mac: &str, incarnation: &str) -> Uuid {
    derived_id(&host_key(site, node, boot_mac, incarnation), "node_added", None)
}

/// The id of the `NodeRemoved` a gateway publishes for a host that was deleted, the same
/// for every announcement of that host's removal (and another for a host of the same name
/// and MAC created again and deleted: its `incarnation` differs).
pub fn node_removed_id(site: &str, node: &str, boot_mac: &str, incarnation: &str) -> Uuid {
    derived_id(&host_key(site, node, boot_mac, incarnation), "node_removed", None)
}

fn host_key(site: &str, node: &str, boot_mac: &str, incarnation: &str) -> String {
    match incarnation {
        "" => format!("{site}/{node}/{boot_mac}"),
        i => format!("{site}/{node}/{boot_mac}/{i}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_ids_are_stable_and_distinct() {
        let c = new_id().to_string();
        assert_eq!(derived_id(&c, "provision_os", Some("n1")), derived_id(&c, "provision_os", Some("n1")));
        assert_ne!(derived_id(&c, "provision_os", Some("n1")), derived_id(&c, "provision_os", Some("n2")));
        assert_ne!(derived_id(&c, "stage", None), derived_id(&new_id().to_string(), "stage", None));
    }

    #[test]
    fn traceparent_keeps_the_trace() {
        let root = new_id();
        let t1 = traceparent(None, &root.to_string(), &root);
        let child = new_id();
        let t2 = traceparent(Some(&t1), &root.to_string(), &child);
        assert_eq!(t1.split('-').nth(1), t2.split('-').nth(1));
        assert_ne!(t1, t2);
        assert_eq!(t2.len(), 55);
    }
}
