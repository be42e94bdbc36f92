//! The command ledger (`landfall-ledger`): every command the orchestrator carried out or refused,
//! by id, kept as long as the commands stream keeps commands. JetStream drops a copy only within
//! its duplicate window; a copy published later (a client retrying after an outage, a script run
//! again) is recognised here by its id, changes nothing, and is answered as the first was.

use bus_schema::names::keys;
use bus_schema::pb;
use bus_schema::runtime::{Cas, Delivery, HandlerError, Kv};

use crate::clock::now_ms;

pub(super) struct Ledger(pub(super) Kv);

impl Ledger {
    /// How the command was answered the first time, when it has been carried out or refused.
    pub(super) async fn first_answer(&self, d: &Delivery) -> Result<Option<Result<(), HandlerError>>, HandlerError> {
        let Some((record, _)) = self.0.get::<pb::CommandRecord>(&keys::command(&d.envelope.id)).await? else {
            return Ok(None);
        };
        Ok(Some(match record.rejected {
            false => Ok(()),
            true => Err(HandlerError::reject(
                pb::RejectCode::try_from(record.code).unwrap_or(pb::RejectCode::Unspecified),
                record.reason,
            )),
        }))
    }

    /// Records how the command was answered, once it is settled: carried out or refused. A
    /// command to be tried again records nothing.
    pub(super) async fn record(&self, d: &Delivery, answer: &Result<(), HandlerError>) -> Result<(), HandlerError> {
        let (rejected, code, reason) = match answer {
            Ok(()) => (false, pb::RejectCode::Unspecified, String::new()),
            Err(HandlerError::Reject(r)) => (true, r.code, r.reason.clone()),
            Err(_) => return Ok(()),
        };
        let record = pb::CommandRecord {
            command_id: d.envelope.id.clone(),
            command_type: d.type_name.clone(),
            subject: d.subject.clone(),
            rejected,
            code: code as i32,
            reason,
            handled_unix_ms: now_ms(),
        };
        // Another replica (or this one, before a crash) may have recorded it: the first stays.
        match self.0.create(&keys::command(&d.envelope.id), &record).await? {
            Cas::Written(_) | Cas::Conflict => Ok(()),
        }
    }
}
