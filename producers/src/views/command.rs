//! A settled command as people and programs read it: what the command ledger recorded when the
//! orchestrator carried it out, refused it, or gave it up (`landfall command show`, `GET /v1/commands/{id}`).

use bus_schema::pb;
use serde_json::{Value, json};

use super::human::rfc3339_ms;

/// The outcome a ledger record tells: `carried_out`, `rejected`, or `dead_lettered` (given up
/// after failing again and again: `landfall dead replay` or a copy of it carries it out).
pub fn outcome(record: &pb::CommandRecord) -> &'static str {
    match (record.dead_lettered, record.rejected) {
        (true, _) => "dead_lettered",
        (false, true) => "rejected",
        (false, false) => "carried_out",
    }
}

/// The record as JSON: id, type, subject, outcome and, when refused, the code and reason.
pub fn command_json(record: &pb::CommandRecord) -> Value {
    let code = pb::RejectCode::try_from(record.code).unwrap_or(pb::RejectCode::Unspecified);
    json!({
        "id": record.command_id,
        "type": record.command_type,
        "subject": record.subject,
        "actor": record.actor,
        "scope": record.scope,
        "outcome": outcome(record),
        "code": if record.rejected { bus_schema::runtime::reject_code_label(code) } else { "" },
        "reason": record.reason,
        "handled_at": rfc3339_ms(record.handled_unix_ms),
        "handled_by": record.handled_by,
    })
}

/// The record in a few lines for people.
pub fn command_lines(record: &pb::CommandRecord) -> String {
    let mut out = format!(
        "command   {}\ntype      {}\nsubject   {}\nasked by  {}\nhandled   {} by {}\noutcome   {}\n",
        record.command_id,
        record.command_type,
        record.subject,
        if record.actor.is_empty() { "(not recorded)" } else { &record.actor },
        rfc3339_ms(record.handled_unix_ms),
        record.handled_by,
        outcome(record).replace('_', " "),
    );
    if record.rejected {
        let code = pb::RejectCode::try_from(record.code).unwrap_or(pb::RejectCode::Unspecified);
        out += &format!("code      {}\nreason    {}\n", bus_schema::runtime::reject_code_label(code), record.reason);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_command_reads_with_its_code_and_reason() {
        let record = pb::CommandRecord {
            command_id: "01890a5d-ac96-774b-bcce-b302099a8057".into(),
            command_type: "landfall.v1.InstallSite".into(),
            subject: "landfall.cmd.edge-77.hub.install_site".into(),
            rejected: true,
            code: pb::RejectCode::UnknownSite as i32,
            reason: "site edge-77 is not registered".into(),
            handled_unix_ms: 0,
            dead_lettered: false,
            handled_by: "orch-0/17/0".into(),
            actor: "user:alice".into(),
            scope: "edge-77".into(),
        };
        let v = command_json(&record);
        assert_eq!((v["outcome"].as_str(), v["code"].as_str()), (Some("rejected"), Some("unknown_site")));
        let text = command_lines(&record);
        assert!(text.contains("asked by  user:alice\n"), "{text}");
        assert!(text.contains("outcome   rejected\ncode      unknown_site\nreason    site edge-77"), "{text}");
    }
}
