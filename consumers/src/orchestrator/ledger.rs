//! The command ledger (`landfall-ledger`): every command the orchestrator carried out, refused or
//! gave up on, by id, kept as long as the commands stream keeps commands. JetStream drops a copy
//! only within its duplicate window; a copy published later (a client retrying after an outage, a
//! script run again) is recognised here by its id, changes nothing, and is answered as the first
//! was. A command given up (filed as a dead letter) is settled for its scope's order but not
//! answered: a copy of it is carried out.

use bus_schema::names::{self, keys};
use bus_schema::pb;
use bus_schema::runtime::{Delivery, HandlerError, Kv, Update};

use crate::clock::now_ms;

pub(super) struct Ledger {
    pub(super) kv: Kv,
    /// This replica, as its records name it (`CommandRecord.handled_by`).
    pub(super) replica: String,
}

/// How a settled command was answered: `None` when it was given up, not answered.
fn answer(record: pb::CommandRecord) -> Option<Result<(), HandlerError>> {
    match (record.dead_lettered, record.rejected) {
        (true, _) => None,
        (false, false) => Some(Ok(())),
        (false, true) => Some(Err(HandlerError::reject(
            pb::RejectCode::try_from(record.code).unwrap_or(pb::RejectCode::Unspecified),
            record.reason,
        ))),
    }
}

/// Whether `new` is written over what the ledger holds: the first answer stays, and an answer
/// goes over a record of the command given up (its replay was carried out).
fn replaces(held: Option<&pb::CommandRecord>, new: &pb::CommandRecord) -> bool {
    match held {
        None => true,
        Some(held) => held.dead_lettered && !new.dead_lettered,
    }
}

impl Ledger {
    /// How the command was answered the first time, when it has been carried out or refused.
    pub(super) async fn first_answer(&self, d: &Delivery) -> Result<Option<Result<(), HandlerError>>, HandlerError> {
        let Some((record, _)) = self.kv.get::<pb::CommandRecord>(&keys::command(&d.envelope.id)).await? else {
            return Ok(None);
        };
        Ok(answer(record))
    }

    /// Whether the command with this id is settled: carried out, refused or given up.
    pub(super) async fn settled(&self, command_id: &str) -> Result<bool, HandlerError> {
        Ok(self.kv.get::<pb::CommandRecord>(&keys::command(command_id)).await?.is_some())
    }

    /// Records how the command was answered, once it is settled: carried out or refused. A
    /// command to be tried again records nothing.
    pub(super) async fn record(&self, d: &Delivery, answer: &Result<(), HandlerError>) -> Result<(), HandlerError> {
        let (rejected, code, reason) = match answer {
            Ok(()) => (false, pb::RejectCode::Unspecified, String::new()),
            Err(HandlerError::Reject(r)) => (true, r.code, r.reason.clone()),
            Err(_) => return Ok(()),
        };
        self.write(d, rejected, code, reason, false).await
    }

    /// Records that the command was given up and filed as a dead letter, for `reason`.
    pub(super) async fn record_dead_lettered(&self, d: &Delivery, reason: &str) -> Result<(), HandlerError> {
        self.write(d, false, pb::RejectCode::Unspecified, reason.to_string(), true).await
    }

    async fn write(
        &self,
        d: &Delivery,
        rejected: bool,
        code: pb::RejectCode,
        reason: String,
        dead_lettered: bool,
    ) -> Result<(), HandlerError> {
        let record = pb::CommandRecord {
            command_id: d.envelope.id.clone(),
            command_type: d.type_name.clone(),
            subject: d.subject.clone(),
            rejected,
            code: code as i32,
            reason,
            handled_unix_ms: now_ms(),
            dead_lettered,
            handled_by: self.replica.clone(),
            actor: d.envelope.actor.clone(),
            scope: names::parse_subject(&d.subject)
                .and_then(|p| match p {
                    names::ParsedSubject::Command { scope, .. } => Some(scope.to_string()),
                    _ => None,
                })
                .unwrap_or_default(),
        };
        // Another replica (or this one, before a crash) may have recorded it: the first stays.
        self.kv
            .update_with(&keys::command(&d.envelope.id), |held: Option<&pb::CommandRecord>| {
                if replaces(held, &record) { Update::Put(record.clone(), ()) } else { Update::Keep(()) }
            })
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_given_up_is_settled_but_not_answered() {
        let dead = pb::CommandRecord { dead_lettered: true, reason: "transient: bus".into(), ..Default::default() };
        assert!(answer(dead.clone()).is_none(), "a copy of it is carried out");
        let done = pb::CommandRecord::default();
        assert!(matches!(answer(done.clone()), Some(Ok(()))));
        assert!(replaces(None, &dead));
        assert!(replaces(Some(&dead), &done), "its replay's answer goes over it");
        assert!(!replaces(Some(&done), &dead), "an answer stays");
        assert!(!replaces(Some(&done), &done), "the first answer stays");
    }
}
