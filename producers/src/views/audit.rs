//! Who did what, when, to which sites, with what outcome: the command ledger read in the order
//! its records were written, filtered by actor, site, kind, outcome and time (`landfall audit`,
//! `GET /v1/audit`).
//!
//! The ledger keeps a record of every command the orchestrator settled, for good (exactly once
//! means forever), each naming its author; its bucket's stream is read from the first record
//! written at `since`, so a window of a day reads a day's records, not the fleet's history.

use std::collections::HashMap;
use std::time::Duration;

use async_nats::jetstream::consumer::{DeliverPolicy, pull};
use bus_schema::names;
use bus_schema::pb;
use bus_schema::runtime::Bus;
use futures::StreamExt;
use prost::Message;
use serde_json::{Value, json};
use time::OffsetDateTime;

use super::command::{command_json, outcome};

/// What to list; every field narrows.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// `user:alice`, or `alice` for any kind of actor of that name.
    pub actor: Option<String>,
    /// The site the command was about (`fleet` for fleet-wide ones).
    pub site: Option<String>,
    /// `install_site`, `InstallSite` or `landfall.v1.InstallSite`.
    pub kind: Option<String>,
    /// `carried_out`, `rejected` or `dead_lettered`.
    pub outcome: Option<String>,
    pub since: Option<OffsetDateTime>,
    pub until: Option<OffsetDateTime>,
    /// The newest this many (of those matching).
    pub limit: usize,
}

/// The longest a listing reads, and the most records it reads: past either it says it stopped.
const READ_FOR: Duration = Duration::from_secs(8);
const READ_MAX: usize = 2_000_000;

pub const DEFAULT_LIMIT: usize = 100;
pub const MAX_LIMIT: usize = 1000;

/// One record as listed.
#[derive(Debug, Clone)]
pub struct Entry {
    pub record: pb::CommandRecord,
}

impl Filter {
    /// Checks the filter's words.
    ///
    /// # Errors
    /// An unknown outcome, a limit out of range.
    pub fn check(&self) -> Result<(), String> {
        if let Some(o) = &self.outcome
            && !["carried_out", "rejected", "dead_lettered"].contains(&o.as_str())
        {
            return Err(format!("outcome {o:?}: one of carried_out, rejected, dead_lettered"));
        }
        if self.limit == 0 || self.limit > MAX_LIMIT {
            return Err(format!("limit must be between 1 and {MAX_LIMIT}"));
        }
        // `until` before `since` is an empty window, not a mistake to refuse.
        Ok(())
    }

    /// Whether `r` is one this filter lists.
    pub fn keeps(&self, r: &pb::CommandRecord) -> bool {
        let actor_ok = self
            .actor
            .as_deref()
            .is_none_or(|want| r.actor == want || r.actor.split_once(':').is_some_and(|(_, name)| name == want));
        let kind_ok = self.kind.as_deref().is_none_or(|want| {
            let kind = r.subject.rsplit('.').next().unwrap_or_default();
            let short = r.command_type.rsplit('.').next().unwrap_or_default();
            kind == want || short == want || r.command_type == want
        });
        actor_ok
            && kind_ok
            && self.site.as_deref().is_none_or(|s| r.scope == s)
            && self.outcome.as_deref().is_none_or(|o| outcome(r) == o)
            && self.until.is_none_or(|u| r.handled_unix_ms <= (u.unix_timestamp_nanos() / 1_000_000) as i64)
    }
}

/// The newest records that `filter` keeps and `may_read` allows, newest first; and whether the
/// read stopped early (too long a window: narrow it with `since`).
///
/// # Errors
/// When the ledger's stream cannot be read.
pub async fn list(
    bus: &Bus,
    filter: &Filter,
    may_read: impl Fn(&pb::CommandRecord) -> bool,
) -> anyhow::Result<(Vec<Entry>, bool)> {
    let stream = bus.jetstream().get_stream(format!("KV_{}", names::LEDGER_BUCKET)).await?;
    let deliver_policy = match filter.since {
        Some(start_time) => DeliverPolicy::ByStartTime { start_time },
        None => DeliverPolicy::All,
    };
    let consumer = stream
        .create_consumer(pull::OrderedConfig {
            filter_subject: format!("$KV.{}.{}>", names::LEDGER_BUCKET, names::keys::command("")),
            deliver_policy,
            ..Default::default()
        })
        .await?;
    let mut out = (Vec::new(), false);
    // Nothing written in the window: nothing to wait for.
    if consumer.cached_info().num_pending == 0 {
        return Ok(out);
    }
    let mut messages = consumer.messages().await?;
    // A record is written again when a command given up is carried out later: the last stands.
    let mut order: Vec<String> = Vec::new();
    let mut latest: HashMap<String, pb::CommandRecord> = HashMap::new();
    let deadline = tokio::time::Instant::now() + READ_FOR;
    let mut read = 0usize;
    let mut stopped = false;
    loop {
        let next = match tokio::time::timeout_at(deadline, messages.next()).await {
            Err(_) => {
                stopped = true;
                break;
            }
            Ok(None) => break,
            Ok(Some(m)) => m?,
        };
        let pending = next.info().map(|i| i.pending).unwrap_or(0);
        let deleted = next.headers.as_ref().and_then(|h| h.get(names::headers::KV_OPERATION)).is_some();
        if !deleted
            && let Ok(r) = pb::CommandRecord::decode(next.payload.clone())
            && filter.keeps(&r)
            && may_read(&r)
            && latest.insert(r.command_id.clone(), r.clone()).is_none()
        {
            order.push(r.command_id);
        }
        read += 1;
        if read >= READ_MAX {
            stopped = pending > 0;
            break;
        }
        if pending == 0 {
            break;
        }
    }
    out.0 = order
        .iter()
        .rev()
        .filter_map(|id| latest.remove(id))
        .take(filter.limit)
        .map(|record| Entry { record })
        .collect();
    out.1 = stopped;
    Ok(out)
}

/// An entry as JSON: the ledger record's fields (`command_json`).
pub fn entry_json(e: &Entry) -> Value {
    command_json(&e.record)
}

/// The listing as JSON.
pub fn listing_json(entries: &[Entry], stopped: bool) -> Value {
    json!({ "items": entries.iter().map(entry_json).collect::<Vec<_>>(), "truncated": stopped })
}

/// The listing as a table for people: when, who, what, where, outcome.
pub fn listing_lines(entries: &[Entry]) -> String {
    let mut out = format!("{:<24} {:<28} {:<20} {:<16} {}\n", "HANDLED", "ACTOR", "KIND", "SITE", "OUTCOME");
    for e in entries {
        let r = &e.record;
        let kind = r.subject.rsplit('.').next().unwrap_or_default();
        let actor = if r.actor.is_empty() { "(not recorded)" } else { r.actor.as_str() };
        let mut outcome = outcome(r).replace('_', " ");
        if r.rejected {
            outcome = format!("{outcome}: {}", r.reason);
        }
        out += &format!(
            "{:<24} {:<28} {:<20} {:<16} {}\n",
            super::human::rfc3339_ms(r.handled_unix_ms),
            actor,
            kind,
            r.scope,
            outcome
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(actor: &str, scope: &str, kind: &str, rejected: bool) -> pb::CommandRecord {
        pb::CommandRecord {
            command_id: format!("{actor}-{kind}"),
            command_type: "landfall.v1.InstallSite".into(),
            subject: format!("landfall.cmd.{scope}.hub.{kind}"),
            actor: actor.into(),
            scope: scope.into(),
            rejected,
            handled_unix_ms: 1_800_000_000_000,
            ..Default::default()
        }
    }

    #[test]
    fn filters_narrow_by_actor_site_kind_and_outcome() {
        let f = |actor: Option<&str>, site: Option<&str>, kind: Option<&str>, outcome: Option<&str>| Filter {
            actor: actor.map(String::from),
            site: site.map(String::from),
            kind: kind.map(String::from),
            outcome: outcome.map(String::from),
            limit: 10,
            ..Default::default()
        };
        let r = record("user:alice", "edge-01", "install_site", false);
        assert!(f(Some("alice"), None, None, None).keeps(&r), "a name alone matches any kind of actor");
        assert!(f(Some("user:alice"), Some("edge-01"), Some("install_site"), Some("carried_out")).keeps(&r));
        assert!(f(None, None, Some("InstallSite"), None).keeps(&r));
        assert!(!f(Some("bob"), None, None, None).keeps(&r));
        assert!(!f(Some("ali"), None, None, None).keeps(&r), "no partial names");
        assert!(!f(None, Some("edge-02"), None, None).keeps(&r));
        assert!(!f(None, None, None, Some("rejected")).keeps(&r));
        let until = Filter { until: Some(OffsetDateTime::UNIX_EPOCH), limit: 10, ..Default::default() };
        assert!(!until.keeps(&r));
    }

    #[test]
    fn a_wrong_filter_says_so() {
        let bad = Filter { outcome: Some("won".into()), limit: 10, ..Default::default() };
        assert!(bad.check().unwrap_err().contains("carried_out"));
        assert!(Filter { limit: 0, ..Default::default() }.check().is_err());
        let text = listing_lines(&[Entry { record: record("token:ci", "edge-01", "install_site", true) }]);
        assert!(text.contains("token:ci") && text.contains("rejected"), "{text}");
    }
}
