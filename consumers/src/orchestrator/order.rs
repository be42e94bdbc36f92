//! Per-scope command order across replicas ([`Orchestrator::check_order`]): a command of scope
//! S is carried out only once every earlier command of S in `LANDFALL_COMMANDS` is settled in
//! the ledger (carried out, refused or given up). Within one process the consume loop keeps a
//! scope's commands in turn already; this holds it when replicas share the durable, and one has
//! parked a site's command while another receives the next.
//!
//! Cheap and bounded: a cursor per scope (`order.<scope>` in `landfall-ledger`, the last
//! sequence up to which the scope's commands are all settled, moved forward by compare-and-set
//! and never back) means a check reads only the commands after it, one JetStream get-next-by-
//! subject each, one kind's subject at a time ([`ScopeCommands`]). The `fleet` scope is ordered
//! the same way, per scope: across replicas it orders fleet commands among themselves, not
//! against every site's (in one process it is still a barrier).

use std::time::Duration;

use async_nats::jetstream::{self, message::StreamMessage, stream::RawMessageErrorKind};
use bus_schema::names::{self, keys};
use bus_schema::pb;
use bus_schema::runtime::{Delivery, Envelope, HandlerError, Update};
use futures::StreamExt;
use tracing::debug;

use super::service::Orchestrator;

/// How long a command behind an unsettled one of its scope waits before it looks again.
pub(super) const ORDER_RETRY: Duration = Duration::from_secs(1);

/// An earlier command of the scope, as the stream holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Earlier {
    pub sequence: u64,
    pub subject: String,
    pub id: String,
}

/// Where the cursor goes after a scan from `cursor` that found the commands `settled` (in
/// stream order, each settled) up to the first unsettled one: the last of them, never back.
pub(super) fn advanced(cursor: u64, settled: &[u64]) -> u64 {
    settled.last().copied().unwrap_or(cursor).max(cursor)
}

/// Why a command waits, naming the one before it.
pub(super) fn behind(scope: &str, earlier: &Earlier) -> HandlerError {
    HandlerError::Wait {
        reason: format!(
            "command {} ({}, #{}) of {scope} came first and is not settled yet",
            earlier.id, earlier.subject, earlier.sequence
        ),
        delay: ORDER_RETRY,
    }
}

/// The commands of one scope stored in a range of the commands stream, in stream order.
///
/// Read one subject (one kind) at a time and merged: nats-server 2.10 finds the next message of
/// a literal subject block by block through each block's subject index, while a wildcard
/// (`landfall.cmd.<scope>.>`) over blocks of many subjects makes it decode every message in
/// between. With thousands of sites' commands between two of one site's, that made each check
/// cost in proportion to the fleet, and registering or installing a fleet in proportion to its
/// square. Which kinds the scope has is one stream info, answered from the stream's subject
/// index.
struct ScopeCommands<'a> {
    stream: &'a jetstream::stream::Stream<()>,
    /// Each subject's next message in the range, once read (`None`: none left).
    heads: Vec<(String, Option<StreamMessage>)>,
    before: u64,
}

impl<'a> ScopeCommands<'a> {
    /// The scope's commands from sequence `from` up to (not including) `before`.
    async fn open(
        stream: &'a jetstream::stream::Stream<()>,
        scope: &str,
        from: u64,
        before: u64,
    ) -> Result<Self, HandlerError> {
        let mut heads = Vec::new();
        if from < before {
            let mut subjects = stream.info_with_subjects(names::scope_commands(scope)).await.map_err(read_err)?;
            while let Some(subject) = subjects.next().await {
                let (subject, _) = subject.map_err(read_err)?;
                let head = next_of(stream, &subject, from, before).await?;
                heads.push((subject, head));
            }
        }
        Ok(Self { stream, heads, before })
    }

    /// The next command of the scope in stream order.
    async fn next(&mut self) -> Result<Option<StreamMessage>, HandlerError> {
        let Some((subject, head)) = self
            .heads
            .iter_mut()
            .filter(|(_, head)| head.is_some())
            .min_by_key(|(_, head)| head.as_ref().map(|m| m.sequence))
        else {
            return Ok(None);
        };
        let m = head.take().expect("a head that is there");
        *head = next_of(self.stream, subject, m.sequence + 1, self.before).await?;
        Ok(Some(m))
    }
}

/// The first message on `subject` at or after `from` and before `before`.
async fn next_of(
    stream: &jetstream::stream::Stream<()>,
    subject: &str,
    from: u64,
    before: u64,
) -> Result<Option<StreamMessage>, HandlerError> {
    if from >= before {
        return Ok(None);
    }
    match stream.raw_message_builder().sequence(from).next_by_subject(subject.to_string()).send().await {
        Ok(m) if m.sequence < before => Ok(Some(m)),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => Ok(None),
        Err(e) => Err(read_err(e)),
    }
}

fn read_err(e: impl std::error::Error + Send + Sync + 'static) -> HandlerError {
    HandlerError::transient("reading the earlier commands of the scope", e)
}

impl Orchestrator {
    /// `Ok` when every command of `d`'s scope stored before it is settled; a `Wait` naming the
    /// first that is not otherwise.
    pub(super) async fn check_order(&self, d: &Delivery) -> Result<(), HandlerError> {
        let Some(names::ParsedSubject::Command { scope, .. }) = names::parse_subject(&d.subject) else {
            return Ok(());
        };
        if scope.is_empty() || scope.contains(['*', '>']) {
            return Ok(());
        }
        let ledger = &self.ledger.kv;
        let cursor_key = keys::scope_order(scope);
        let cursor = ledger.get::<pb::ScopeOrder>(&cursor_key).await?.map_or(0, |(o, _)| o.settled_through);
        let stream = self.bus.jetstream().get_stream_no_info(names::COMMANDS_STREAM).await.map_err(read_err)?;
        let mut earlier = ScopeCommands::open(&stream, scope, cursor + 1, d.stream_sequence).await?;
        let mut settled = Vec::new();
        let mut blocking = None;
        // Read lazily: the consumer's ack floor settles what was acked without a ledger record.
        let mut ack_floor: Option<u64> = None;
        while let Some(m) = earlier.next().await? {
            let id = Envelope::from_headers(Some(&m.headers), || {
                bus_schema::ids::derived_id(names::COMMANDS_STREAM, "seq", Some(&m.sequence.to_string())).to_string()
            })
            .id;
            let mut done = self.ledger.settled(&id).await?;
            if !done {
                let floor = match ack_floor {
                    Some(f) => f,
                    None => *ack_floor.insert(self.commands_ack_floor().await?),
                };
                done = m.sequence <= floor;
            }
            if !done {
                blocking = Some(Earlier { sequence: m.sequence, subject: m.subject.to_string(), id });
                break;
            }
            settled.push(m.sequence);
        }
        let next = advanced(cursor, &settled);
        if next > cursor {
            ledger
                .update_with(&cursor_key, |held: Option<&pb::ScopeOrder>| match held {
                    Some(h) if h.settled_through >= next => Update::Keep(()),
                    _ => Update::Put(pb::ScopeOrder { settled_through: next }, ()),
                })
                .await?;
        }
        match blocking {
            Some(earlier) => {
                debug!(%scope, sequence = d.stream_sequence, before = earlier.sequence, "behind an unsettled command of its scope");
                Err(behind(scope, &earlier))
            }
            None => Ok(()),
        }
    }

    /// The stream sequence up to which the command consumer has acknowledged everything.
    async fn commands_ack_floor(&self) -> Result<u64, HandlerError> {
        let stream = self.bus.jetstream().get_stream_no_info(names::COMMANDS_STREAM).await.map_err(read_err)?;
        let info = stream.consumer_info(names::ORCHESTRATOR_COMMANDS).await.map_err(read_err)?;
        Ok(info.ack_floor.stream_sequence)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cursor_moves_to_the_last_settled_and_never_back() {
        assert_eq!(advanced(5, &[]), 5);
        assert_eq!(advanced(5, &[7, 9]), 9);
        assert_eq!(advanced(10, &[7]), 10);
    }

    #[test]
    fn a_command_behind_another_waits_naming_it() {
        let earlier =
            Earlier { sequence: 7, subject: "landfall.cmd.edge-01.hub.install_site".into(), id: "abc".into() };
        match behind("edge-01", &earlier) {
            HandlerError::Wait { reason, delay } => {
                assert!(reason.contains("abc") && reason.contains("#7") && reason.contains("edge-01"), "{reason}");
                assert_eq!(delay, ORDER_RETRY);
            }
            other => panic!("{other:?}"),
        }
    }
}
