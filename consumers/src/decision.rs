//! What pure decisions hand their executors: the messages to publish, as outbox entries
//! written together with the state that decided them, and the refusal of a command.
//!
//! An executor writes the entries with the state in one compare-and-set, publishes them with
//! the ids recorded in them, then clears them: a crash in between loses nothing, and a second
//! publish is dropped by the stream as a copy.

use bus_schema::envelope::Envelope;
use bus_schema::outgoing::Outgoing;
use bus_schema::pb::{self, BusMessage};

/// Why a command is refused: the reject code and the reason, as `CommandRejected` says them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: pb::RejectCode,
    pub reason: String,
}

/// The outbox entry of `msg`, to be published on `subject` with the ids of `env`.
pub(crate) fn outbox_entry<M: BusMessage>(subject: String, msg: &M, env: &Envelope) -> pb::OutboxEntry {
    pb::OutboxEntry {
        subject,
        message_type: M::TYPE.to_string(),
        message_id: env.id.clone(),
        payload: msg.encode_to_vec(),
        causation_id: env.causation.clone(),
        traceparent: env.traceparent.clone(),
        actor: env.actor.clone(),
    }
}

/// The messages of an outbox, ready to publish, with their recorded ids: publishing them
/// again after a crash gives the same ids, and the stream drops the copies.
pub fn outgoing(outbox: &[pb::OutboxEntry], correlation: &str) -> Vec<Outgoing> {
    outbox
        .iter()
        .map(|e| Outgoing {
            subject: e.subject.clone(),
            type_name: e.message_type.clone(),
            payload: e.payload.clone().into(),
            envelope: Envelope {
                id: e.message_id.clone(),
                correlation: correlation.to_string(),
                causation: e.causation_id.clone(),
                traceparent: e.traceparent.clone(),
                actor: e.actor.clone(),
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    /// The decision modules (and the clock they are handed `now` from), with their source text.
    const DECISION_MODULES: &[(&str, &str)] = &[
        ("decision.rs", include_str!("decision.rs")),
        ("saga.rs", include_str!("saga.rs")),
        ("rollout/decide.rs", include_str!("rollout/decide.rs")),
        ("rollout/decide/tests.rs", include_str!("rollout/decide/tests.rs")),
        ("rollout/decide/control.rs", include_str!("rollout/decide/control.rs")),
        ("rollout/decide/rollback.rs", include_str!("rollout/decide/rollback.rs")),
        ("rollout/decide/timeout.rs", include_str!("rollout/decide/timeout.rs")),
        ("rollout/decide/window.rs", include_str!("rollout/decide/window.rs")),
        ("clock.rs", include_str!("clock.rs")),
    ];

    /// What a decision module may not import: the bus runtime, its client and executor.
    const FORBIDDEN: &[&str] = &["runtime", "async_nats", "tokio", "Bus"];

    /// Whether a line (comments cut) starts a `use` declaration, with or without visibility.
    fn starts_use(code: &str) -> bool {
        let rest = match code.strip_prefix("pub") {
            Some(r) => {
                let r = if r.starts_with('(') { r.split_once(')').map_or("", |(_, r)| r) } else { r };
                if !r.starts_with(char::is_whitespace) {
                    return false;
                }
                r.trim_start()
            }
            None => code,
        };
        rest.starts_with("use ")
    }

    /// The `use` declarations of `source`, each as one string (one may span several lines).
    fn use_declarations(source: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut current: Option<String> = None;
        for line in source.lines() {
            let code = line.split("//").next().unwrap_or("").trim();
            if current.is_none() && starts_use(code) {
                current = Some(String::new());
            }
            if let Some(decl) = current.as_mut() {
                decl.push_str(code);
                decl.push(' ');
                if code.contains(';') {
                    out.extend(current.take());
                }
            }
        }
        out
    }

    /// The forbidden names a `use` declaration mentions, as whole path segments.
    fn forbidden_in(decl: &str) -> Vec<&'static str> {
        let words: Vec<&str> = decl.split(|c: char| !(c.is_alphanumeric() || c == '_')).collect();
        FORBIDDEN.iter().copied().filter(|f| words.contains(f)).collect()
    }

    #[test]
    fn decision_code_imports_nothing_from_the_bus_runtime() {
        for (path, source) in DECISION_MODULES {
            // The code, not its tests (this module's own test holds forbidden lines as data).
            let code = source.split("\n#[cfg(test)]").next().unwrap_or(source);
            for decl in use_declarations(code) {
                let found = forbidden_in(&decl);
                assert!(
                    found.is_empty(),
                    "rule \"decision code imports nothing from the bus runtime\" broken: consumers/src/{path} \
                     imports {found:?} in `{}`; a decision takes its inputs and `now` as arguments and \
                     returns its effects, the executor does the I/O",
                    decl.trim()
                );
            }
        }
    }

    #[test]
    fn the_import_rule_sees_runtime_imports_of_every_shape() {
        let source = "use std::ops::Range;\n\
                      use bus_schema::pb::{self, BusEvent, BusJob};\n\
                      pub(crate) use bus_schema::runtime::Envelope;\n\
                      use bus_schema::{\n    envelope::Envelope,\n    runtime::Bus, // the bus\n};\n\
                      use tokio::time;\n\
                      // use async_nats::Client;\n";
        let found: Vec<_> = use_declarations(source).iter().flat_map(|d| forbidden_in(d)).collect();
        assert_eq!(found, ["runtime", "runtime", "Bus", "tokio"]);
    }
}
