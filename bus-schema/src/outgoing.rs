//! A message ready to publish: its subject, its type name, its encoded payload and its
//! envelope. Plain data that decisions build without the bus runtime; the runtime publishes it
//! (`Bus::publish_all`).

use bytes::Bytes;

use crate::envelope::Envelope;
use crate::pb::{BusEvent, BusJob, BusMessage};

/// A message ready to publish with `Bus::publish_all`.
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub subject: String,
    pub type_name: String,
    pub payload: Bytes,
    pub envelope: Envelope,
}

impl Outgoing {
    pub fn event<E: BusEvent>(evt: &E, envelope: Envelope) -> Self {
        Self::new(evt.subject(), evt, envelope)
    }

    pub fn job<J: BusJob>(job: &J, envelope: Envelope) -> Self {
        Self::new(job.subject(), job, envelope)
    }

    pub fn new<M: BusMessage>(subject: String, msg: &M, envelope: Envelope) -> Self {
        Self { subject, type_name: M::TYPE.to_string(), payload: Bytes::from(msg.encode_to_vec()), envelope }
    }
}
