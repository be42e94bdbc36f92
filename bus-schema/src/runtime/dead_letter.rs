//! Dead letters: a message a consumer gives up on, filed in `LANDFALL_DEAD` with all it takes to
//! look at it and publish it again, and announced with a `MessageDeadLettered` event
//! ([`Bus::file_dead_letter`]); and, for operators, reading, replaying and removing them
//! ([`Bus::read_dead_letters`], [`Bus::dead_letter`], [`Bus::replay_dead_letter`]).

use async_nats::HeaderMap;
use async_nats::jetstream::consumer;
use bytes::Bytes;
use futures::StreamExt;

use super::connect::Bus;
use super::delivery::Delivery;
use super::error::{BoxError, BusError, boxed};
use crate::names;
use crate::pb::{self, BusMessage};

/// A dead letter as stored.
#[derive(Debug, Clone)]
pub struct StoredDeadLetter {
    /// Its sequence in `LANDFALL_DEAD`: what `landfall dead show|replay` name it by.
    pub sequence: u64,
    pub stored: time::OffsetDateTime,
    pub letter: pb::DeadLetter,
}

/// What [`Bus::replay_dead_letter`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replayed {
    pub subject: String,
    /// The id the copy was published with (derived from the original's and the dead letter's
    /// sequence, so replaying twice publishes once).
    pub message_id: String,
    /// Where the copy was stored, and whether the stream already had it (a second replay).
    pub stream_sequence: u64,
    pub duplicate: bool,
}

/// A message's headers as a dead letter keeps them.
pub(super) fn header_list(headers: Option<&HeaderMap>) -> Vec<pb::Header> {
    let mut out: Vec<pb::Header> = headers
        .into_iter()
        .flat_map(|h| h.iter())
        .flat_map(|(name, values)| {
            values.iter().map(move |v| pb::Header { name: name.to_string(), value: v.as_str().to_string() })
        })
        .collect();
    out.sort_by(|a, b| (&a.name, &a.value).cmp(&(&b.name, &b.value)));
    out
}

/// Where a message was stored and who gave up on it.
pub(super) struct GaveUp<'a> {
    pub stream: &'a str,
    pub consumer: &'a str,
}

/// The dead letter of `d` (stored in `at.stream`), which `at.consumer` gave up on after
/// `attempts` tries, for `error`. A payload that does not fit beside the rest is left out (the
/// message stays in its stream).
pub(super) fn dead_letter(
    d: &Delivery,
    headers: Option<&HeaderMap>,
    at: GaveUp<'_>,
    attempts: u32,
    error: &str,
    now_ms: i64,
) -> pb::DeadLetter {
    let mut letter = pb::DeadLetter {
        subject: d.subject.clone(),
        headers: header_list(headers),
        payload: d.payload.to_vec(),
        stream: at.stream.to_string(),
        stream_sequence: d.stream_sequence,
        consumer: at.consumer.to_string(),
        message_id: d.envelope.id.clone(),
        message_type: d.type_name.clone(),
        deliveries: d.delivered,
        attempts,
        error: error.to_string(),
        dead_unix_ms: now_ms,
        payload_omitted: false,
    };
    leave_out_a_payload_too_big(&mut letter);
    letter
}

/// Leaves `letter`'s payload out (and says so) when it does not fit beside the rest, with room
/// for the dead letter's own headers on top of its body.
pub(super) fn leave_out_a_payload_too_big(letter: &mut pb::DeadLetter) {
    if prost::Message::encoded_len(letter) + 1024 > names::MAX_PAYLOAD {
        letter.payload.clear();
        letter.payload_omitted = true;
    }
}

/// The scope a notice about a message on `subject` is published in: the site it names, else the
/// fleet.
pub(super) fn answered_scope(subject: &str) -> &str {
    // A job a site keeps in its inbox is answered as the hub delivered it.
    let subject = names::inbox_origin(subject).unwrap_or(subject);
    let scope = match names::parse_subject(subject) {
        Some(names::ParsedSubject::Command { scope, .. }) => scope,
        Some(names::ParsedSubject::Job { site, .. }) => site,
        Some(names::ParsedSubject::Event { scope, .. }) => scope,
        Some(names::ParsedSubject::Service { site, .. } | names::ParsedSubject::Rpc { site, .. }) => site,
        Some(names::ParsedSubject::Admin { .. }) | None => names::FLEET,
    };
    // A scope that is not a valid token (garbage on a wildcard) is answered in the fleet scope.
    if crate::domain::SiteId::try_from(scope).is_ok() { scope } else { names::FLEET }
}

impl Bus {
    /// Files `letter` in `LANDFALL_DEAD` and announces it (`MessageDeadLettered`), returning its
    /// sequence there once both are stored. Both carry ids derived from the message's and the
    /// consumer's, so filing the same message again (after a crash before it was terminated)
    /// stores each once.
    ///
    /// # Errors
    /// [`BusError::Publish`] when either is not stored: the caller keeps the message.
    pub async fn file_dead_letter(&self, d: &Delivery, letter: &pb::DeadLetter) -> Result<u64, BusError> {
        let envelope = d.envelope.derive("dead_lettered", Some(&letter.consumer));
        let subject = names::dead_letter_subject(&letter.consumer);
        let ack = self.publish(subject, letter, &envelope).await?;
        let notice = pb::MessageDeadLettered {
            message_id: letter.message_id.clone(),
            message_type: letter.message_type.clone(),
            subject: letter.subject.clone(),
            consumer: letter.consumer.clone(),
            stream: letter.stream.clone(),
            stream_sequence: letter.stream_sequence,
            deliveries: letter.deliveries,
            error: letter.error.clone(),
            dead_sequence: ack.sequence,
        };
        let subject = names::event_subject(
            answered_scope(&d.subject),
            pb::rejection::MESSAGE_AGGREGATE,
            pb::rejection::DEAD_LETTERED_KIND,
        );
        self.publish(subject, &notice, &envelope.derive("notice", None)).await?;
        Ok(ack.sequence)
    }

    /// Every dead letter stored, oldest first.
    ///
    /// # Errors
    /// [`BusError::Consume`] when the stream cannot be read; a letter that does not decode is
    /// one too.
    pub async fn read_dead_letters(&self) -> Result<Vec<StoredDeadLetter>, BusError> {
        let err = |e: BoxError| BusError::Consume { consumer: "dead letter reader".into(), source: e };
        let stream = self.jetstream().get_stream(names::DEAD_STREAM).await.map_err(|e| err(boxed(e)))?;
        let mut consumer = stream
            .create_consumer(consumer::pull::OrderedConfig {
                name: Some(format!("dead-{}", uuid::Uuid::new_v4().simple())),
                ..Default::default()
            })
            .await
            .map_err(|e| err(boxed(e)))?;
        let mut pending = consumer.info().await.map_err(|e| err(boxed(e)))?.num_pending;
        let mut out = Vec::new();
        if pending == 0 {
            return Ok(out);
        }
        let mut messages = consumer.messages().await.map_err(|e| err(boxed(e)))?;
        while let Some(m) = messages.next().await {
            let m = m.map_err(|e| err(boxed(e)))?;
            let info = m.info().map_err(&err)?;
            let (sequence, stored) = (info.stream_sequence, info.published);
            pending = info.pending;
            let letter = <pb::DeadLetter as prost::Message>::decode(m.payload.clone()).map_err(|e| err(boxed(e)))?;
            out.push(StoredDeadLetter { sequence, stored, letter });
            if pending == 0 {
                break;
            }
        }
        Ok(out)
    }

    /// The dead letter at `sequence`, or `None` when there is none (never, or replayed).
    ///
    /// # Errors
    /// [`BusError::Consume`] when the stream cannot be read or the letter does not decode.
    pub async fn dead_letter(&self, sequence: u64) -> Result<Option<StoredDeadLetter>, BusError> {
        use async_nats::jetstream::stream::RawMessageErrorKind;
        let err = |e: BoxError| BusError::Consume { consumer: "dead letter reader".into(), source: e };
        let stream = self.jetstream().get_stream_no_info(names::DEAD_STREAM).await.map_err(|e| err(boxed(e)))?;
        let m = match stream.get_raw_message(sequence).await {
            Ok(m) => m,
            Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => return Ok(None),
            Err(e) => return Err(err(boxed(e))),
        };
        let letter = <pb::DeadLetter as prost::Message>::decode(m.payload).map_err(|e| err(boxed(e)))?;
        Ok(Some(StoredDeadLetter { sequence, stored: m.time, letter }))
    }

    /// Publishes the dead letter at `sequence` again to its original subject, with its original
    /// headers but a new `Nats-Msg-Id` (derived from the original's and `sequence`: the stream
    /// would drop the original id within its duplicate window, and replaying twice publishes
    /// once), then removes the dead letter. `None` when there is no such dead letter.
    ///
    /// # Errors
    /// [`BusError::Publish`] when the copy is not stored (the dead letter stays), or
    /// [`BusError::Consume`] when the letter or its omitted payload cannot be read.
    pub async fn replay_dead_letter(&self, sequence: u64) -> Result<Option<Replayed>, BusError> {
        let Some(stored) = self.dead_letter(sequence).await? else { return Ok(None) };
        let letter = stored.letter;
        let payload = if letter.payload_omitted {
            let err = |e: BoxError| BusError::Consume { consumer: "dead letter replay".into(), source: e };
            let stream = self.jetstream().get_stream_no_info(&letter.stream).await.map_err(|e| err(boxed(e)))?;
            stream.get_raw_message(letter.stream_sequence).await.map_err(|e| err(boxed(e)))?.payload
        } else {
            Bytes::from(letter.payload.clone())
        };
        let message_id = crate::ids::derived_id(&letter.message_id, "replay", Some(&sequence.to_string())).to_string();
        let mut headers = HeaderMap::new();
        for h in letter.headers.iter().filter(|h| h.name != names::headers::MSG_ID) {
            headers.append(h.name.as_str(), h.value.as_str());
        }
        headers.insert(names::headers::MSG_ID, message_id.as_str());
        let publish_err = |e: BoxError| BusError::Publish { subject: letter.subject.clone(), source: e };
        let ack = self
            .jetstream()
            .publish_with_headers(letter.subject.clone(), headers, payload)
            .await
            .map_err(|e| publish_err(boxed(e)))?
            .await
            .map_err(|e| publish_err(boxed(e)))?;
        let err = |e: BoxError| BusError::Consume { consumer: "dead letter replay".into(), source: e };
        let dead = self.jetstream().get_stream_no_info(names::DEAD_STREAM).await.map_err(|e| err(boxed(e)))?;
        dead.delete_message(sequence).await.map_err(|e| err(boxed(e)))?;
        Ok(Some(Replayed {
            subject: letter.subject,
            message_id,
            stream_sequence: ack.sequence,
            duplicate: ack.duplicate,
        }))
    }
}

/// The type name of a dead letter's message, for decoding it (`pb::decode_to_json`).
pub fn dead_letter_type(letter: &pb::DeadLetter) -> &str {
    if letter.message_type.is_empty() { <pb::DeadLetter as BusMessage>::TYPE } else { &letter.message_type }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_letter_keeps_the_message_whole_or_says_its_payload_is_left_out() {
        let mut headers = HeaderMap::new();
        headers.insert(names::headers::MSG_ID, "01890a5d-ac96-774b-bcce-b302099a8058");
        headers.insert(names::headers::TYPE, "landfall.v1.InstallSite");
        let msg = async_nats::Message {
            subject: "landfall.cmd.edge-01.hub.install_site".into(),
            reply: None,
            payload: Bytes::from_static(b"payload"),
            headers: Some(headers.clone()),
            status: None,
            description: None,
            length: 0,
        };
        let d = Delivery::from_parts(&msg, names::COMMANDS_STREAM, 42, 3);
        let at = || GaveUp { stream: names::COMMANDS_STREAM, consumer: "orchestrator-commands" };
        let letter = dead_letter(&d, Some(&headers), at(), 10, "transient: bus: gone", 7);
        assert_eq!(letter.payload, b"payload");
        assert_eq!((letter.stream.as_str(), letter.stream_sequence, letter.deliveries), ("LANDFALL_COMMANDS", 42, 3));
        assert_eq!(letter.message_type, "landfall.v1.InstallSite");
        assert!(letter.headers.iter().any(|h| h.name == names::headers::MSG_ID && h.value == d.envelope.id));
        assert!(!letter.payload_omitted);

        let big = Delivery { payload: Bytes::from(vec![0u8; names::MAX_PAYLOAD]), ..d };
        let letter = dead_letter(&big, Some(&headers), at(), 10, "x", 7);
        assert!(letter.payload.is_empty() && letter.payload_omitted);
    }

    #[test]
    fn a_notice_is_published_in_the_scope_of_the_subject_it_answers() {
        assert_eq!(answered_scope("landfall.cmd.edge-01.hub.install_site"), "edge-01");
        assert_eq!(answered_scope("landfall.evt.fleet.hub.rollout.planned"), "fleet");
        assert_eq!(answered_scope("something.else"), "fleet");
        // A job kept in a site's inbox is answered in its site's scope, where the site may publish.
        assert_eq!(answered_scope("inbox.landfall.job.edge-01.provision_os"), "edge-01");
        assert_eq!(answered_scope("inbox.landfall.job.edge-01.40.provision_os"), "edge-01");
    }
}
