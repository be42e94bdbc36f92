//! `landfall dead list|show|replay`: the messages consumers gave up on (`LANDFALL_DEAD`), looked
//! at and published again.

use std::process::ExitCode;

use anyhow::bail;
use bus_schema::pb;
use bus_schema::runtime::{Replayed, StoredDeadLetter, dead_letter_type};
use clap::Subcommand;
use serde_json::{Value, json};

use super::connect::connect;
use super::output::{Format, emit};

#[derive(Debug, Subcommand)]
pub enum DeadCommand {
    /// Every dead letter, oldest first: its sequence, when, which consumer gave it up, the
    /// subject it was published on, how often it was delivered, and why.
    List {
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
    /// One dead letter in full: headers, the last error, and the payload decoded.
    Show {
        /// Its sequence, as `dead list` shows it.
        seq: u64,
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
    /// Publish a dead letter again to its original subject, with its original headers and a
    /// new message id (replaying twice publishes once), then remove it.
    Replay {
        seq: u64,
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
}

pub async fn run(url: &str, cmd: DeadCommand) -> anyhow::Result<ExitCode> {
    let bus = connect(url).await?;
    match cmd {
        DeadCommand::List { output } => {
            let letters = bus.read_dead_letters().await?;
            match output {
                Format::Table => print!("{}", list_text(&letters)),
                _ => emit(output, &Value::Array(letters.iter().map(summary_json).collect()))?,
            }
        }
        DeadCommand::Show { seq, output } => {
            let Some(letter) = bus.dead_letter(seq).await? else { bail!("no dead letter #{seq} (never, or replayed)") };
            match output {
                Format::Table => print!("{}", show_text(&letter)),
                _ => emit(output, &detail_json(&letter))?,
            }
        }
        DeadCommand::Replay { seq, output } => {
            let Some(done) = bus.replay_dead_letter(seq).await? else {
                bail!("no dead letter #{seq} (never, or replayed)")
            };
            match output {
                Format::Table => println!("{}", replayed_text(seq, &done)),
                _ => emit(output, &replayed_json(seq, &done))?,
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn when(letter: &StoredDeadLetter) -> String {
    letter.stored.format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}

/// The first line of an error, cut to `max` characters.
fn short(reason: &str, max: usize) -> String {
    let line = reason.lines().next().unwrap_or_default();
    if line.chars().count() <= max {
        line.to_string()
    } else {
        format!("{}…", line.chars().take(max).collect::<String>())
    }
}

pub(crate) fn list_text(letters: &[StoredDeadLetter]) -> String {
    if letters.is_empty() {
        return "no dead letters\n".to_string();
    }
    let mut out =
        format!("{:<6} {:<25} {:<24} {:<44} {:>5}  {}\n", "SEQ", "WHEN", "CONSUMER", "SUBJECT", "DELIV", "REASON");
    for l in letters {
        let d = &l.letter;
        out.push_str(&format!(
            "{:<6} {:<25} {:<24} {:<44} {:>5}  {}\n",
            l.sequence,
            when(l),
            d.consumer,
            d.subject,
            d.deliveries,
            short(&d.error, 80)
        ));
    }
    out
}

pub(crate) fn summary_json(l: &StoredDeadLetter) -> Value {
    let d = &l.letter;
    json!({
        "seq": l.sequence,
        "when": when(l),
        "consumer": d.consumer,
        "subject": d.subject,
        "deliveries": d.deliveries,
        "attempts": d.attempts,
        "message_id": d.message_id,
        "message_type": d.message_type,
        "reason": d.error,
    })
}

/// The payload decoded when its type is one of landfall's, else its bytes in hex.
fn payload_json(d: &pb::DeadLetter) -> Value {
    if d.payload_omitted {
        return json!({ "omitted": true, "stream": d.stream, "stream_sequence": d.stream_sequence });
    }
    match pb::decode_to_json(dead_letter_type(d), &d.payload) {
        Some(Ok(v)) => v,
        Some(Err(e)) => json!({ "undecodable": e.to_string(), "hex": hex(&d.payload) }),
        None => json!({ "hex": hex(&d.payload) }),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn detail_json(l: &StoredDeadLetter) -> Value {
    let d = &l.letter;
    let mut v = summary_json(l);
    let headers: serde_json::Map<String, Value> =
        d.headers.iter().map(|h| (h.name.clone(), Value::String(h.value.clone()))).collect();
    v["stream"] = json!(d.stream);
    v["stream_sequence"] = json!(d.stream_sequence);
    v["headers"] = Value::Object(headers);
    v["payload"] = payload_json(d);
    v
}

pub(crate) fn show_text(l: &StoredDeadLetter) -> String {
    let d = &l.letter;
    let mut out = format!(
        "dead letter #{}  {}\n  consumer:   {}\n  subject:    {}\n  message:    {} ({})\n  stored at:  {} #{}\n  deliveries: {} (attempts {})\n  error:      {}\n  headers:\n",
        l.sequence,
        when(l),
        d.consumer,
        d.subject,
        d.message_id,
        if d.message_type.is_empty() { "no type" } else { &d.message_type },
        d.stream,
        d.stream_sequence,
        d.deliveries,
        d.attempts,
        d.error,
    );
    for h in &d.headers {
        out.push_str(&format!("    {}: {}\n", h.name, h.value));
    }
    let payload = serde_json::to_string_pretty(&payload_json(d)).unwrap_or_default();
    out.push_str("  payload:\n");
    for line in payload.lines() {
        out.push_str(&format!("    {line}\n"));
    }
    out
}

fn replayed_text(seq: u64, r: &Replayed) -> String {
    let copy = if r.duplicate { " (already replayed: the stream kept the first copy)" } else { "" };
    format!(
        "replayed dead letter #{seq}: published to {} as {} (stream sequence {}){copy}; dead letter removed",
        r.subject, r.message_id, r.stream_sequence
    )
}

fn replayed_json(seq: u64, r: &Replayed) -> Value {
    json!({
        "seq": seq,
        "subject": r.subject,
        "message_id": r.message_id,
        "stream_sequence": r.stream_sequence,
        "duplicate": r.duplicate,
        "removed": true,
    })
}

#[cfg(test)]
mod tests {
    use bus_schema::pb::BusMessage;
    use prost::Message;

    use super::*;

    fn letter() -> StoredDeadLetter {
        let cmd = pb::InstallSite { site_id: "edge-01".into(), ..Default::default() };
        StoredDeadLetter {
            sequence: 4,
            stored: time::OffsetDateTime::UNIX_EPOCH,
            letter: pb::DeadLetter {
                subject: "landfall.cmd.edge-01.hub.install_site".into(),
                headers: vec![pb::Header { name: "Nats-Msg-Id".into(), value: "abc".into() }],
                payload: cmd.encode_to_vec(),
                stream: "LANDFALL_COMMANDS".into(),
                stream_sequence: 9,
                consumer: "orchestrator-commands".into(),
                message_id: "abc".into(),
                message_type: pb::InstallSite::TYPE.into(),
                deliveries: 3,
                attempts: 10,
                error: "transient: bus: kv put landfall-sagas/saga.abc: message size exceeds maximum allowed".into(),
                dead_unix_ms: 0,
                payload_omitted: false,
            },
        }
    }

    #[test]
    fn a_dead_letter_is_listed_and_shown_with_its_payload_decoded() {
        let l = letter();
        let text = list_text(std::slice::from_ref(&l));
        assert!(
            text.contains("orchestrator-commands") && text.contains("landfall.cmd.edge-01.hub.install_site"),
            "{text}"
        );
        let v = detail_json(&l);
        assert_eq!(v["payload"]["site_id"], "edge-01");
        assert_eq!(v["headers"]["Nats-Msg-Id"], "abc");
        assert!(show_text(&l).contains("\"site_id\": \"edge-01\""));
        assert_eq!(short("a\nb", 10), "a");
        assert_eq!(short("abcdef", 3), "abc…");
    }
}
