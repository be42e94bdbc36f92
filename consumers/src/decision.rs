//! What pure decisions hand their executors: the messages to publish, as outbox entries
//! written together with the state that decided them, and the refusal of a command.
//!
//! An executor writes the entries with the state in one compare-and-set, publishes them with
//! the ids recorded in them, then clears them: a crash in between loses nothing, and a second
//! publish is dropped by the stream as a copy.

use bus_schema::pb::{self, BusMessage};
use bus_schema::runtime::{Envelope, Outgoing};

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
    }
}

/// The messages of an outbox, ready to publish, with their recorded ids: publishing them
/// again after a crash gives the same ids, and the stream drops the copies.
pub(crate) fn outgoing(outbox: &[pb::OutboxEntry], correlation: &str) -> Vec<Outgoing> {
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
            },
        })
        .collect()
}
