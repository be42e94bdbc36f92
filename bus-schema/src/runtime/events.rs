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
        self.read_events_of(names::EVENTS_STREAM, filters, deliver).await
    }

    /// The same reader of another stream of events: a region's mirror at the core
    /// ([`names::core_events_stream`]).
    pub async fn read_events_of(
        &self,
        stream: &str,
        filters: Vec<String>,
        deliver: consumer::DeliverPolicy,
    ) -> Result<EventReader, BusError> {
        let consume_err = |e: BoxError| BusError::Consume { consumer: "event reader".into(), source: e };
        let stream = self.jetstream().get_stream(stream).await.map_err(|e| consume_err(boxed(e)))?;
        // One filter as the filter subject: nats-server 2.10 finds the next message of a
        // consumer with a filter list by walking every subject of the stream block, which for
        // a reader far behind (a dashboard or a report reading a day of events) is most of the
        // hub's CPU at thousands of sites.
        // Several kinds of one aggregate are read through one filter for all its kinds, the
        // others dropped here: a filter list costs that walk too (the benchmark's reader of
        // 1,000 sites' install ends, two kinds, fell minutes behind the installs).
        let only = (filters.len() > 1).then(|| filters.clone());
        let (filter_subject, filter_subjects, only) =
            match (<[String; 1]>::try_from(filters), only.as_deref().and_then(covering)) {
                (Ok([one]), _) => (one, Vec::new(), None),
                (Err(_), Some(one)) => (one, Vec::new(), only),
                (Err(many), None) => (String::new(), many, None),
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
        Ok(EventReader { messages, pending_at_start: pending, only })
    }
}

/// One subject for `filters` when they differ only in their last token (kinds of one
/// aggregate, say): that token as `*`.
fn covering(filters: &[String]) -> Option<String> {
    let (first, rest) = filters.split_first()?;
    let (head, last) = first.rsplit_once('.')?;
    let literal = |t: &str| !t.is_empty() && t != "*" && t != ">";
    let same_aggregate = rest.iter().all(|f| f.rsplit_once('.').is_some_and(|(h, l)| h == head && literal(l)));
    (literal(last) && same_aggregate && !head.split('.').any(|t| t == ">")).then(|| format!("{head}.*"))
}

/// Whether `subject` is one of `filters`.
fn matches_any(filters: &[String], subject: &str) -> bool {
    filters.iter().any(|f| names::subject_matches(f, subject))
}

/// Whether `m` is a report a site may not make ([`crate::trust::check`]): a kind only the hub
/// sends, or one naming another site, under a site's own subjects, where its user may publish
/// anything. People and dashboards never see it; the hub's consumers reject it. (The hub's own
/// subjects carry only what each hub user may send.)
fn forged(m: &async_nats::jetstream::Message) -> bool {
    let type_name = m.headers.as_ref().and_then(|h| h.get(names::headers::TYPE)).map(|v| v.as_str());
    let refused = crate::trust::forged_by_a_gateway(&m.subject, type_name.unwrap_or_default(), &m.payload);
    if let Some(e) = &refused {
        tracing::debug!(subject = %m.subject, reason = %e, "a forged event is not shown");
    }
    refused.is_some()
}

/// A new event reader's consumer name: unique, and never a durable's (`events-<uuid>`).
fn reader_name() -> String {
    format!("events-{}", uuid::Uuid::new_v4().simple())
}

/// Events in stream order; see [`Bus::read_events`].
pub struct EventReader {
    messages: consumer::pull::Ordered,
    /// How many matching events were stored when the reader was made (for several filters read
    /// through one, matching that one).
    pub pending_at_start: u64,
    /// The filters asked for, when they are read through one that covers more.
    only: Option<Vec<String>>,
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
        let msg = loop {
            match self.messages.next().await? {
                Ok(m) if self.only.as_ref().is_some_and(|only| !matches_any(only, &m.subject)) => continue,
                Ok(m) if forged(&m) => continue,
                other => break other,
            }
        };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_of_one_aggregate_are_read_through_one_filter_and_nothing_else_is() {
        let of = |f: &[&str]| covering(&f.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let ends = ["landfall.evt.*.*.site.installed", "landfall.evt.*.*.site.install_failed"];
        assert_eq!(of(&ends).as_deref(), Some("landfall.evt.*.*.site.*"));
        assert_eq!(
            of(&["landfall.evt.fleet.hub.rollout.completed", "landfall.evt.fleet.hub.rollout.halted"]).as_deref(),
            Some("landfall.evt.fleet.hub.rollout.*")
        );
        // Other aggregates, scopes or lengths, or a wildcard last: kept as a list.
        assert_eq!(of(&["landfall.evt.*.*.site.installed", "landfall.evt.*.*.command.rejected"]), None);
        assert_eq!(of(&["landfall.evt.edge-01.>", "landfall.evt.edge-02.>"]), None);
        assert_eq!(of(&["landfall.evt.*.*.site.installed", "landfall.evt.*.*.site.*"]), None);
        assert_eq!(of(&["landfall.evt.*.*.site.installed", "landfall.evt.*.*.site.x.y"]), None);

        let only = ends.map(String::from);
        assert!(matches_any(&only, "landfall.evt.edge-01.hub.site.installed"));
        assert!(matches_any(&only, "landfall.evt.edge-01.hub.site.install_failed"));
        assert!(!matches_any(&only, "landfall.evt.edge-01.hub.site.registered"));
        assert!(!matches_any(&only, "landfall.evt.edge-01.hub.site.installed.more"));
        assert!(matches_any(&["landfall.evt.>".to_string()], "landfall.evt.a.b.c"));
        assert!(!matches_any(&["landfall.evt.>".to_string()], "landfall.evt"));
    }
}
