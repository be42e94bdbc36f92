//! The envelope every landfall message carries: its id (the dedup key), the root command it
//! belongs to, the message that caused it, and its W3C trace context. Plain data: how it rides
//! in NATS headers is the runtime's business (`runtime::headers`).

use uuid::Uuid;

/// The metadata that rides in the headers of every landfall message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// `Nats-Msg-Id`: the dedup key.
    pub id: String,
    /// The root command's id.
    pub correlation: String,
    /// The id of the message that caused this one (the root's own id for a root).
    pub causation: String,
    /// The W3C trace context (`00-<trace id>-<parent id>-<flags>`).
    pub traceparent: String,
    /// Who asked for the root command (`names::headers::ACTOR`); empty when it was not said.
    /// Every message derived from it carries it on.
    pub actor: String,
}

impl Envelope {
    /// A new root message (a command published by a person or a program).
    pub fn root() -> Self {
        Self::root_with_id(crate::ids::new_id())
    }

    /// A root message with a chosen id: publishing it twice does it once.
    pub fn root_with_id(id: Uuid) -> Self {
        let s = id.to_string();
        Self {
            traceparent: crate::ids::traceparent(None, &s, &id),
            correlation: s.clone(),
            causation: s.clone(),
            id: s,
            actor: String::new(),
        }
    }

    /// The same envelope, said to be asked for by `actor` (when it names no one yet).
    pub fn by(mut self, actor: impl Into<String>) -> Self {
        if self.actor.is_empty() {
            self.actor = actor.into();
        }
        self
    }

    /// The deterministic envelope of the message `self` causes at `step` (for `node`).
    pub fn derive(&self, step: &str, node: Option<&str>) -> Self {
        let id = crate::ids::derived_id(&self.id, step, node);
        Self {
            id: id.to_string(),
            correlation: self.correlation.clone(),
            causation: self.id.clone(),
            traceparent: crate::ids::traceparent(Some(&self.traceparent), &self.correlation, &id),
            actor: self.actor.clone(),
        }
    }

    /// The trace id of this envelope's `traceparent`, when it has one (see [`trace_id`]).
    pub fn trace_id(&self) -> Option<&str> {
        trace_id(&self.traceparent)
    }
}

/// The trace id (32 hex digits) of a W3C `traceparent` (`00-<trace id>-<parent id>-<flags>`),
/// or `None` when it is not one. A trace id accepted here is one [`crate::ids::traceparent`]
/// carries on to the messages derived from it; the all-zero id is invalid.
pub fn trace_id(traceparent: &str) -> Option<&str> {
    let mut parts = traceparent.trim().split('-');
    let (version, trace, parent, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
    // Version ff is forbidden; version 00 has exactly four fields, later versions may add more.
    let valid = hex(version, 2)
        && !version.eq_ignore_ascii_case("ff")
        && (version != "00" || parts.next().is_none())
        && hex(trace, 32)
        && trace.bytes().any(|b| b != b'0')
        && hex(parent, 16)
        && hex(flags, 2);
    valid.then_some(trace)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_envelopes_chain() {
        let root = Envelope::root();
        let child = root.derive("stage", None);
        assert_eq!(child.correlation, root.id);
        assert_eq!(child.causation, root.id);
        assert_eq!(child, root.derive("stage", None));
        let grandchild = child.derive("provision_os", Some("n1"));
        assert_eq!(grandchild.correlation, root.id);
        assert_eq!(grandchild.causation, child.id);
    }

    #[test]
    fn the_actor_is_carried_on_and_never_replaced() {
        let root = Envelope::root().by("user:alice");
        assert_eq!(root.derive("stage", None).derive("provision_os", Some("n1")).actor, "user:alice");
        assert_eq!(root.clone().by("user:mallory").actor, "user:alice", "an actor once said stays");
        assert_eq!(Envelope::root().actor, "", "a root names no one until told");
    }

    #[test]
    fn derived_envelopes_continue_the_trace_with_a_span_of_their_own() {
        let root = Envelope::root();
        let trace = root.trace_id().expect("a root starts a trace").to_string();
        assert_eq!(trace, Uuid::parse_str(&root.id).unwrap().simple().to_string(), "the root's id is the trace id");
        let child = root.derive("stage", None);
        let grandchild = child.derive("provision_os", Some("n1"));
        assert_eq!(child.trace_id(), Some(trace.as_str()));
        assert_eq!(grandchild.trace_id(), Some(trace.as_str()));
        let parent = |e: &Envelope| e.traceparent.split('-').nth(2).unwrap().to_string();
        assert_ne!(parent(&child), parent(&root));
        assert_ne!(parent(&grandchild), parent(&child));
        // Derived again (a redelivery, another replica): the same traceparent.
        assert_eq!(root.derive("stage", None).traceparent, child.traceparent);
    }

    #[test]
    fn trace_ids_parse_from_w3c_traceparents_only() {
        let id = "4bf92f3577b34da6a3ce929d0e0e4736";
        assert_eq!(trace_id(&format!("00-{id}-00f067aa0ba902b7-01")), Some(id));
        assert_eq!(trace_id(&format!(" 00-{id}-00f067aa0ba902b7-00 ")), Some(id), "surrounding blanks");
        let later = format!("01-{id}-00f067aa0ba902b7-01-future");
        assert_eq!(trace_id(&later), Some(id), "a later version may add fields");
        for bad in [
            String::new(),
            "garbage".to_string(),
            format!("00-{id}-00f067aa0ba902b7-01-extra"),
            format!("ff-{id}-00f067aa0ba902b7-01"),
            format!("0-{id}-00f067aa0ba902b7-01"),
            format!("00-{}-00f067aa0ba902b7-01", &id[..31]),
            format!("00-{id}x-00f067aa0ba902b7-01"),
            format!("00-{}-00f067aa0ba902b7-01", "0".repeat(32)),
            format!("00-{}-00f067aa0ba902b7-01", "g".repeat(32)),
            format!("00-{id}-00f067aa0ba902b-01"),
            format!("00-{id}-00f067aa0ba902b7-1"),
            format!("00-{id}-00f067aa0ba902b7"),
        ] {
            assert_eq!(trace_id(&bad), None, "{bad:?}");
        }
    }
}
