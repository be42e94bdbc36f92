//! Publishing: one message or many pipelined ([`Outgoing`]), each with its envelope's headers and a
//! `Nats-Msg-Id` the stream deduplicates on, returning once the stream has stored it; and the
//! rejection event for a delivery that could not be carried out.

use async_nats::jetstream;
use bytes::Bytes;
use tracing::debug;

use super::connect::Bus;
use super::delivery::{Delivery, RejectAs, Rejection};
use super::error::{BusError, boxed};
use crate::envelope::Envelope;
use crate::names;
use crate::outgoing::Outgoing;
use crate::pb::{self, BusCommand, BusEvent, BusJob, BusMessage};

/// Counts an event stored by the stream (a copy dropped by dedup is not a new event).
fn count_published(subject: &str, type_name: &str, ack: &jetstream::publish::PublishAck) {
    if !ack.duplicate && matches!(names::parse_subject(subject), Some(names::ParsedSubject::Event { .. })) {
        metrics::counter!("landfall_events_published_total", "type" => type_name.to_string()).increment(1);
    }
}

/// How many of [`Bus::publish_all`]'s messages may wait for their acknowledgement at once.
pub const PUBLISH_WINDOW: usize = 1024;

impl Bus {
    /// The headers of a message with `envelope`: its own, naming this connection's actor when
    /// the envelope names none.
    fn headers_for(&self, envelope: &Envelope, type_name: &str) -> async_nats::HeaderMap {
        let mut headers = envelope.headers(type_name);
        if envelope.actor.is_empty() {
            headers.insert(names::headers::ACTOR, self.actor());
        }
        headers
    }

    /// Publishes a payload with the envelope's headers and waits for the stream's PubAck.
    /// A repeated envelope id within the dedup window is acknowledged as a duplicate and
    /// stored once.
    pub async fn publish_raw(
        &self,
        subject: String,
        type_name: &str,
        payload: Bytes,
        envelope: &Envelope,
    ) -> Result<jetstream::publish::PublishAck, BusError> {
        if payload.len() > names::MAX_PAYLOAD {
            return Err(BusError::TooLarge { subject, size: payload.len(), max: names::MAX_PAYLOAD });
        }
        let subject = self.published_on(subject);
        let start = std::time::SystemTime::now();
        let ack = self
            .jetstream()
            .publish_with_headers(subject.clone(), self.headers_for(envelope, type_name), payload)
            .await
            .map_err(|e| BusError::Publish { subject: subject.clone(), source: boxed(e) })?;
        let ack = ack.await.map_err(|e| BusError::Publish { subject: subject.clone(), source: boxed(e) })?;
        count_published(&subject, type_name, &ack);
        if !ack.duplicate {
            super::trace::published(&subject, type_name, envelope, start);
        }
        if ack.duplicate {
            debug!(%subject, id = %envelope.id, "duplicate publish dropped by the stream");
        }
        Ok(ack)
    }

    /// Publishes every message, pipelined: up to [`PUBLISH_WINDOW`] are in flight, the oldest
    /// acknowledgement awaited before the next is sent. Order on the wire is the order given.
    /// Returns once all are stored (or the first error).
    ///
    /// The client lets only so many acknowledgements wait (5,000), and holds the next publish
    /// until one is taken: sending everything before awaiting any hung for good past that.
    pub async fn publish_all(&self, messages: Vec<Outgoing>) -> Result<(), BusError> {
        let mut acks = futures::stream::FuturesOrdered::new();
        for m in messages {
            while acks.len() >= PUBLISH_WINDOW {
                if let Some(ack) = futures::StreamExt::next(&mut acks).await {
                    ack?;
                }
            }
            if m.payload.len() > names::MAX_PAYLOAD {
                return Err(BusError::TooLarge { subject: m.subject, size: m.payload.len(), max: names::MAX_PAYLOAD });
            }
            let m = Outgoing { subject: self.published_on(m.subject), ..m };
            let start = std::time::SystemTime::now();
            let ack = self
                .jetstream()
                .publish_with_headers(m.subject.clone(), self.headers_for(&m.envelope, &m.type_name), m.payload)
                .await
                .map_err(|e| BusError::Publish { subject: m.subject.clone(), source: boxed(e) })?;
            acks.push_back(async move {
                let ack = ack.await.map_err(|e| BusError::Publish { subject: m.subject.clone(), source: boxed(e) })?;
                count_published(&m.subject, &m.type_name, &ack);
                if !ack.duplicate {
                    super::trace::published(&m.subject, &m.type_name, &m.envelope, start);
                }
                Ok::<_, BusError>(ack)
            });
        }
        while let Some(ack) = futures::StreamExt::next(&mut acks).await {
            ack?;
        }
        Ok(())
    }

    pub async fn publish<M: BusMessage>(
        &self,
        subject: String,
        msg: &M,
        envelope: &Envelope,
    ) -> Result<jetstream::publish::PublishAck, BusError> {
        self.publish_raw(subject, M::TYPE, Bytes::from(msg.encode_to_vec()), envelope).await
    }

    pub async fn publish_command<C: BusCommand>(
        &self,
        cmd: &C,
        envelope: &Envelope,
    ) -> Result<jetstream::publish::PublishAck, BusError> {
        self.publish(cmd.subject_from(self.origin()), cmd, envelope).await
    }

    pub async fn publish_event<E: BusEvent>(
        &self,
        evt: &E,
        envelope: &Envelope,
    ) -> Result<jetstream::publish::PublishAck, BusError> {
        self.publish(evt.subject_from(self.origin()), evt, envelope).await
    }

    pub async fn publish_job<J: BusJob>(
        &self,
        job: &J,
        envelope: &Envelope,
    ) -> Result<jetstream::publish::PublishAck, BusError> {
        self.publish(job.subject(), job, envelope).await
    }

    /// Publishes the rejection event for a delivery that could not be carried out.
    pub async fn publish_rejection(&self, d: &Delivery, as_: &RejectAs, r: &Rejection) -> Result<(), BusError> {
        let scope = super::dead_letter::answered_scope(&d.subject);
        let envelope = d.envelope.derive("rejected", None);
        match as_ {
            RejectAs::Command => {
                let evt = pb::CommandRejected {
                    command_id: d.envelope.id.clone(),
                    command_type: d.type_name.clone(),
                    subject: d.subject.clone(),
                    code: r.code as i32,
                    reason: r.reason.clone(),
                };
                let subject = names::event_subject_from(
                    self.origin(),
                    scope,
                    pb::rejection::COMMAND_AGGREGATE,
                    pb::rejection::KIND,
                );
                self.publish(subject, &evt, &envelope).await?;
            }
            RejectAs::Message { consumer } => {
                let evt = pb::MessageRejected {
                    message_id: d.envelope.id.clone(),
                    message_type: d.type_name.clone(),
                    subject: d.subject.clone(),
                    code: r.code as i32,
                    reason: r.reason.clone(),
                    consumer: consumer.clone(),
                };
                let subject = names::event_subject_from(
                    self.origin(),
                    scope,
                    pb::rejection::MESSAGE_AGGREGATE,
                    pb::rejection::KIND,
                );
                self.publish(subject, &evt, &envelope).await?;
            }
        }
        Ok(())
    }
}
