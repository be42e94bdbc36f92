//! An [`Envelope`] in NATS headers, and read back from them: the one place that knows which
//! header carries which field.

use async_nats::HeaderMap;
use uuid::Uuid;

use crate::envelope::Envelope;
use crate::names::headers;

impl Envelope {
    /// The headers every landfall message carries, for this envelope and payload type.
    pub fn headers(&self, type_name: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(headers::MSG_ID, self.id.as_str());
        h.insert(headers::TYPE, type_name);
        h.insert(headers::CORRELATION_ID, self.correlation.as_str());
        h.insert(headers::CAUSATION_ID, self.causation.as_str());
        h.insert(headers::TRACEPARENT, self.traceparent.as_str());
        if !self.actor.is_empty() {
            h.insert(headers::ACTOR, self.actor.as_str());
        }
        h
    }

    /// The envelope a message's headers carry. A message without a `Nats-Msg-Id` gets
    /// `fallback_id()`; one without a correlation or causation id is its own root; one without
    /// a `traceparent` starts a trace from its correlation id.
    pub fn from_headers(h: Option<&HeaderMap>, fallback_id: impl FnOnce() -> String) -> Self {
        let get = |name: &str| h.and_then(|h| h.get(name)).map(|v| v.as_str().to_string());
        let id = get(headers::MSG_ID).filter(|s| !s.is_empty()).unwrap_or_else(fallback_id);
        let correlation = get(headers::CORRELATION_ID).filter(|s| !s.is_empty()).unwrap_or_else(|| id.clone());
        let causation = get(headers::CAUSATION_ID).filter(|s| !s.is_empty()).unwrap_or_else(|| id.clone());
        let traceparent = get(headers::TRACEPARENT)
            .unwrap_or_else(|| crate::ids::traceparent(None, &correlation, &Uuid::parse_str(&id).unwrap_or_default()));
        let actor = get(headers::ACTOR).map(|a| a.trim().to_string()).unwrap_or_default();
        Self { id, correlation, causation, traceparent, actor }
    }

    /// The envelope of a message stored under `subject`: as its headers say, except the actor
    /// of a site's gateway, which is the site its subject names (`site:<id>`, the one thing
    /// its permissions checked), whatever it wrote.
    pub fn from_message(h: Option<&HeaderMap>, subject: &str, fallback_id: impl FnOnce() -> String) -> Self {
        let mut envelope = Self::from_headers(h, fallback_id);
        if let Some(site) = gateway_site(subject) {
            envelope.actor = format!("site:{site}");
        }
        envelope
    }
}

/// The site whose gateway sent a command or event under `subject`, if a gateway did.
fn gateway_site(subject: &str) -> Option<&str> {
    use crate::names::{Origin, ParsedSubject, parse_subject};
    match parse_subject(subject)? {
        ParsedSubject::Command { scope, origin: Origin::Gateway, .. }
        | ParsedSubject::Event { scope, origin: Origin::Gateway, .. } => Some(scope),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_envelope_reads_back_from_its_headers() {
        let envelope = Envelope::root().derive("stage", Some("n1"));
        let h = envelope.headers("landfall.v1.StageArtifacts");
        assert_eq!(h.get(headers::TYPE).map(|v| v.as_str()), Some("landfall.v1.StageArtifacts"));
        assert_eq!(Envelope::from_headers(Some(&h), || unreachable!("the id is there")), envelope);
    }

    #[test]
    fn a_message_without_headers_is_its_own_root() {
        let id = "01890a5d-ac96-774b-bcce-b302099a8058".to_string();
        let envelope = Envelope::from_headers(None, || id.clone());
        assert_eq!((envelope.correlation.as_str(), envelope.causation.as_str()), (id.as_str(), id.as_str()));
        assert_eq!(envelope.trace_id(), Some("01890a5dac96774bbcceb302099a8058"));
    }

    #[test]
    fn a_site_speaks_as_itself_whatever_it_writes() {
        let said = Envelope::root().by("user:admin").headers("landfall.v1.NodeAdded");
        let hub = Envelope::from_message(Some(&said), "landfall.cmd.edge-01.hub.node_added", String::new);
        assert_eq!(hub.actor, "user:admin");
        let site = Envelope::from_message(Some(&said), "landfall.cmd.edge-01.gateway.node_added", String::new);
        assert_eq!(site.actor, "site:edge-01");
        let event = Envelope::from_message(None, "landfall.evt.edge-01.gateway.node.ready", || "x".into());
        assert_eq!(event.actor, "site:edge-01");
    }
}
