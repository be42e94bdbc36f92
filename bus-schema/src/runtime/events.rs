//! Reading the events stream in order, for people and dashboards ([`Bus::read_events`]).

use async_nats::jetstream::consumer;
use futures::StreamExt;

use super::connect::Bus;
use super::delivery::Delivery;
use super::error::{BoxError, BusError, boxed};
use crate::names;

impl Bus {
    /// An ordered, ephemeral reader of the events stream, for people and dashboards.
    ///
    /// The reader is named here ([`reader_name`]), so its create request names it in the
    /// subject: a user's permissions can then refuse the names of other services' durables,
    /// which an unnamed create (naming its consumer in the body) would hide.
    pub async fn read_events(
        &self,
        filters: Vec<String>,
        deliver: consumer::DeliverPolicy,
    ) -> Result<EventReader, BusError> {
        let consume_err = |e: BoxError| BusError::Consume { consumer: "event reader".into(), source: e };
        let stream = self.jetstream().get_stream(names::EVENTS_STREAM).await.map_err(|e| consume_err(boxed(e)))?;
        // One filter as the filter subject: nats-server 2.10 finds the next message of a
        // consumer with a filter list by walking every subject of the stream block, which for
        // a reader far behind (a dashboard or a report reading a day of events) is most of the
        // hub's CPU at thousands of sites.
        let (filter_subject, filter_subjects) = match <[String; 1]>::try_from(filters) {
            Ok([one]) => (one, Vec::new()),
            Err(many) => (String::new(), many),
        };
        let consumer = stream
            .create_consumer(consumer::pull::OrderedConfig {
                name: Some(reader_name()),
                filter_subject,
                filter_subjects,
                deliver_policy: deliver,
                ..Default::default()
            })
            .await
            .map_err(|e| consume_err(boxed(e)))?;
        let mut consumer = consumer;
        let pending = consumer.info().await.map_err(|e| consume_err(boxed(e)))?.num_pending;
        let messages = consumer.messages().await.map_err(|e| consume_err(boxed(e)))?;
        Ok(EventReader { messages, pending_at_start: pending })
    }
}

/// A new event reader's consumer name: unique, and never a durable's (`events-<uuid>`).
fn reader_name() -> String {
    format!("events-{}", uuid::Uuid::new_v4().simple())
}

/// Events in stream order; see [`Bus::read_events`].
pub struct EventReader {
    messages: consumer::pull::Ordered,
    /// How many matching events were stored when the reader was made.
    pub pending_at_start: u64,
}

/// One event as read from the stream.
#[derive(Debug, Clone)]
pub struct ReadEvent {
    pub delivery: Delivery,
    /// Events still stored after this one.
    pub pending: u64,
    pub published: time::OffsetDateTime,
}

impl EventReader {
    pub async fn next(&mut self) -> Option<Result<ReadEvent, BusError>> {
        let msg = self.messages.next().await?;
        Some(msg.map_err(|e| BusError::Consume { consumer: "event reader".into(), source: boxed(e) }).map(|m| {
            let (pending, published, seq) = m.info().map(|i| (i.pending, i.published, i.stream_sequence)).unwrap_or((
                0,
                time::OffsetDateTime::UNIX_EPOCH,
                0,
            ));
            let delivery = Delivery::from_parts(&m.message, names::EVENTS_STREAM, seq, 1);
            ReadEvent { delivery, pending, published }
        }))
    }
}
