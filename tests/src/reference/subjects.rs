//! The NATS reference: every subject, stream, bucket, durable consumer, queue group and header,
//! each made by the function or constant of `bus_schema::names` that the services use (never
//! written out here), with that item's doc comment, and every command, job and event with its
//! subject as `bus_schema::pb` declares it.
//!
//! [`unlisted`] names what `names.rs` declares at its top level that this page does not show,
//! so the test sees a new subject the page misses.

use std::collections::BTreeSet;
use std::fmt::Write;
use std::path::Path;

use bus_schema::names;
use bus_schema::pb;
use bus_schema::trust;

use super::{Page, escape_cell, one_line};

/// Placeholders for the variable tokens.
const SITE: &str = "<site>";
const SCOPE: &str = "<scope>";
const KIND: &str = "<kind>";

/// A name of a shard of the jobs with its shard as `<shard>`: `LANDFALL_JOBS_<shard>`,
/// `landfall.job.<site>.<shard>.<kind>`.
fn shard_placeholder(name: &str) -> String {
    let tokens: Vec<&str> = name.split('.').collect();
    match tokens.as_slice() {
        ["landfall", "job", site, _, rest @ ..] => {
            ["landfall", "job", site, "<shard>"].into_iter().chain(rest.iter().copied()).collect::<Vec<_>>().join(".")
        }
        _ => name.replace("_00", "_<shard>"),
    }
}

/// Items of `names.rs` that name no subject, stream, bucket, consumer, group or header: helpers
/// that parse or match subjects, limits and durations, and the KV keys (a module of their own).
const NOT_NAMES: &[&str] = &[
    "subject_matches",
    "stream_of_subject",
    "job_shard",
    "site_jobs_stream",
    "jobs_streams",
    "JOB_SHARDS",
    "outbox_destination",
    "inbox_origin",
    "parse_subject",
    "ParsedSubject",
    "RETENTION",
    "DEDUP_WINDOW",
    "MAX_PAYLOAD",
    "ALIVE_EVERY",
    "CUT_OFF_AFTER",
    "SCOPE_TOKEN",
    "keys",
    "headers",
];

/// A top-level item of `names.rs`: its name, its doc comment, and a string constant's value.
#[derive(Debug, Clone)]
pub struct Item {
    pub name: String,
    pub doc: String,
}

/// The items `names.rs` declares (`pub const`, `pub fn`, `pub mod`, `pub enum`), the module's
/// own (`headers::MSG_ID`) prefixed with it, each with the doc comment above it.
pub fn items(root: &Path) -> Vec<Item> {
    let source = std::fs::read_to_string(root.join("bus-schema/src/names.rs")).expect("read bus-schema/src/names.rs");
    let mut items = Vec::new();
    let mut doc: Vec<String> = Vec::new();
    let mut module: Option<String> = None;
    for line in source.lines() {
        let indented = line.starts_with("    ");
        let trimmed = line.trim();
        if module.is_some() && line == "}" {
            module = None;
            continue;
        }
        if indented && module.is_none() {
            continue;
        }
        if let Some(d) = trimmed.strip_prefix("///") {
            doc.push(d.trim().to_string());
            continue;
        }
        if let Some(rest) = trimmed.strip_prefix("pub ") {
            let (keyword, rest) = rest.split_once(' ').unwrap_or((rest, ""));
            let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if matches!(keyword, "const" | "fn" | "mod" | "enum" | "static") && !name.is_empty() {
                let full = match &module {
                    Some(m) => format!("{m}::{name}"),
                    None => name.clone(),
                };
                items.push(Item { name: full, doc: one_line(&doc.join(" ")) });
                if keyword == "mod" && !indented && rest.trim_end().ends_with('{') {
                    module = Some(name);
                }
            }
        }
        doc.clear();
    }
    items
}

/// What `names.rs` declares at its top level that the page neither shows nor sets aside as not a
/// name; and what the page shows under a name `names.rs` does not declare.
pub fn unlisted(root: &Path) -> (Vec<String>, Vec<String>) {
    let declared: BTreeSet<String> = items(root).into_iter().map(|i| i.name).collect();
    let shown = Rows::default().fill().shown;
    let missing = declared
        .iter()
        .filter(|n| !n.contains("::") && !shown.contains(n.as_str()) && !NOT_NAMES.contains(&n.as_str()))
        .cloned()
        .collect();
    let unknown = shown.iter().filter(|n| !declared.contains(**n)).map(|n| n.to_string()).collect();
    (missing, unknown)
}

/// The rows of each table, and which items of `names.rs` they come from.
#[derive(Default)]
struct Rows {
    streams: Vec<(&'static str, String, String)>,
    subjects: Vec<(&'static str, String)>,
    buckets: Vec<(&'static str, String)>,
    consumers: Vec<(&'static str, String)>,
    groups: Vec<(&'static str, String)>,
    headers: Vec<(&'static str, String)>,
    shown: BTreeSet<&'static str>,
}

impl Rows {
    fn fill(mut self) -> Self {
        use names::*;
        let streams = [
            ("COMMANDS_STREAM", COMMANDS_STREAM, "COMMANDS_ALL", COMMANDS_ALL),
            ("EVENTS_STREAM", EVENTS_STREAM, "EVENTS_ALL", EVENTS_ALL),
            ("DEAD_STREAM", DEAD_STREAM, "DEAD_ALL", DEAD_ALL),
            ("OUTBOX_STREAM", OUTBOX_STREAM, "OUTBOX_ALL", OUTBOX_ALL),
            ("INBOX_STREAM", INBOX_STREAM, "INBOX_ALL", INBOX_ALL),
            ("BENCH_STREAM", BENCH_STREAM, "BENCH_SUBJECT", BENCH_SUBJECT),
            ("LEGACY_JOBS_STREAM", LEGACY_JOBS_STREAM, "JOBS_ALL", JOBS_ALL),
            ("MOVING_JOBS_STREAM", MOVING_JOBS_STREAM, "MOVING_JOBS_ALL", MOVING_JOBS_ALL),
        ];
        for (name, stream, subjects_name, subjects) in streams {
            self.shown.extend([name, subjects_name]);
            self.streams.push((name, stream.to_string(), subjects.to_string()));
            // The jobs, in JOB_SHARDS streams of their own, one per shard, after the commands.
            if name == "COMMANDS_STREAM" {
                self.shown.extend(["jobs_stream", "shard_jobs"]);
                let jobs = (shard_placeholder(jobs_stream(0)), shard_placeholder(&shard_jobs(0)));
                self.streams.push(("jobs_stream", jobs.0, jobs.1));
            }
        }
        // At the core above regional hubs, per region (a mirror holds its origin's subjects).
        self.shown.extend(["core_commands_stream", "region_commands", "core_events_stream", "to_region"]);
        self.streams.push(("core_commands_stream", core_commands_stream("<region>"), region_commands("<region>")));
        self.streams.push(("core_events_stream", core_events_stream("<region>"), EVENTS_ALL.to_string()));
        self.shown.insert("streams");
        let subjects: Vec<(&'static str, String)> = vec![
            ("to_site", to_site(SITE)),
            ("site_deliver", site_deliver(SITE)),
            ("site_inbox", site_inbox(SITE)),
            ("site_jobs", shard_placeholder(&site_jobs(SITE))),
            ("site_every_job", site_every_job(SITE)),
            ("jobs_of_kind", jobs_of_kind(KIND)),
            ("scope_commands", scope_commands(SCOPE)),
            ("scope_events", scope_events(SCOPE)),
            ("sent_by_gateway", sent_by_gateway("<cmd|evt>", SITE)),
            ("events_at", events_at(SCOPE, "<aggregate>", KIND)),
            ("events_of_kind", events_of_kind("<aggregate>", KIND)),
            ("site_rpc", site_rpc(SITE, KIND)),
            ("site_rpcs", site_rpcs(SITE)),
            ("kubeconfig_rpc", kubeconfig_rpc(SITE)),
            ("drift_check_rpc", drift_check_rpc(SITE)),
            ("sim_host_arrival_rpc", sim_host_arrival_rpc(SITE)),
            ("site_services", site_services(SITE)),
            ("site_replies", site_replies(SITE, "<requester's inbox>")),
            ("replies_from_sites", replies_from_sites("<requester's inbox>")),
            ("artifact_plan_svc", artifact_plan_svc(SITE)),
            ("artifact_chunk_svc", artifact_chunk_svc(SITE)),
            ("bmc_credentials_svc", bmc_credentials_svc(SITE)),
            ("chart_render_svc", chart_render_svc(SITE)),
            ("svc_every_site", svc_every_site(KIND)),
            ("site_alive", site_alive(SITE)),
            ("KUBECONFIG_GET_ADMIN", KUBECONFIG_GET_ADMIN.to_string()),
            ("BMC_CREDENTIALS_PUT_ADMIN", BMC_CREDENTIALS_PUT_ADMIN.to_string()),
            ("ROTATE_KEY_ADMIN", ROTATE_KEY_ADMIN.to_string()),
            ("IDENTITY_ALL", IDENTITY_ALL.to_string()),
            ("identity_enroll", identity_enroll("<key>")),
            ("identity_renew", identity_renew(SITE)),
            ("IDENTITY_ADMIN", IDENTITY_ADMIN.to_string()),
            ("AUTH_CALLOUT", AUTH_CALLOUT.to_string()),
            ("server_kick", server_kick("<server-id>")),
            ("dead_letter_subject", dead_letter_subject("<consumer>")),
            ("outbox_subject", outbox_subject("<hub-subject>")),
            ("inbox_subject", inbox_subject("<hub-subject>")),
            ("bench_echo", bench_echo("<id>")),
        ];
        // The kinds these subjects end with, and the lists and builders of the tables above.
        self.shown.extend([
            "ADMIN_SUBJECTS",
            "KUBECONFIG_RPC",
            "DRIFT_CHECK_RPC",
            "SIM_HOST_ARRIVAL_RPC",
            "SITE_ALIVE",
            "ARTIFACT_PLAN",
            "ARTIFACT_CHUNK",
            "BMC_CREDENTIALS",
            "CHART_RENDER",
            "KUBECONFIG_GET",
            "BMC_CREDENTIALS_PUT",
            "ROTATE_KEY",
            "IDENTITY_RENEW",
            "FLEET",
            "Origin",
            "command_subject",
            "command_subject_from",
            "job_subject",
            "event_subject",
            "event_subject_from",
        ]);
        for (name, subject) in subjects {
            self.shown.insert(name);
            self.subjects.push((name, subject));
        }
        let buckets = [
            ("SITES_BUCKET", SITES_BUCKET),
            ("PACKAGES_BUCKET", PACKAGES_BUCKET),
            ("OBSERVED_BUCKET", OBSERVED_BUCKET),
            ("SAGAS_BUCKET", SAGAS_BUCKET),
            ("KUBECONFIGS_BUCKET", KUBECONFIGS_BUCKET),
            ("LEDGER_BUCKET", LEDGER_BUCKET),
            ("IDENTITY_BUCKET", IDENTITY_BUCKET),
            ("APPROVALS_BUCKET", APPROVALS_BUCKET),
            ("SITE_STATE_BUCKET", SITE_STATE_BUCKET),
        ];
        for (name, bucket) in buckets {
            self.shown.insert(name);
            self.buckets.push((name, bucket.to_string()));
        }
        self.shown.extend(["ALL_BUCKETS", "kv_stream"]);
        let consumers = [
            ("ORCHESTRATOR_COMMANDS", ORCHESTRATOR_COMMANDS.to_string()),
            ("ORCHESTRATOR_EVENTS", ORCHESTRATOR_EVENTS.to_string()),
            ("ORCHESTRATOR_ROLLOUTS", ORCHESTRATOR_ROLLOUTS.to_string()),
            ("OBSERVER_EVENTS", OBSERVER_EVENTS.to_string()),
            ("KUBECONFIG_EVENTS", KUBECONFIG_EVENTS.to_string()),
            ("IDENTITY_EVENTS", IDENTITY_EVENTS.to_string()),
            ("gateway_consumer", gateway_consumer(SITE)),
            ("DISPATCHER", DISPATCHER.to_string()),
            ("JOBS_MOVE", JOBS_MOVE.to_string()),
            ("INBOX_CONSUMER", INBOX_CONSUMER.to_string()),
        ];
        for (name, consumer) in consumers {
            self.shown.insert(name);
            self.consumers.push((name, consumer));
        }
        for (name, group) in [
            ("DISTRIBUTION_GROUP", DISTRIBUTION_GROUP),
            ("SECRETS_GROUP", SECRETS_GROUP),
            ("IDENTITY_GROUP", IDENTITY_GROUP),
        ] {
            self.shown.insert(name);
            self.groups.push((name, group.to_string()));
        }
        let header_names = [
            ("headers::MSG_ID", headers::MSG_ID),
            ("headers::TYPE", headers::TYPE),
            ("headers::CORRELATION_ID", headers::CORRELATION_ID),
            ("headers::CAUSATION_ID", headers::CAUSATION_ID),
            ("headers::TRACEPARENT", headers::TRACEPARENT),
            ("headers::ACTOR", headers::ACTOR),
            ("headers::CHUNK_SHA256", headers::CHUNK_SHA256),
            ("headers::REPLY_ERROR", headers::REPLY_ERROR),
            ("headers::KV_OPERATION", headers::KV_OPERATION),
        ];
        for (name, header) in header_names {
            self.shown.insert(name);
            self.headers.push((name, header.to_string()));
        }
        self
    }
}

/// `subject` with its origin token as every party that sends the kind may write it: `hub`,
/// `gateway`, or `<hub|gateway>` for a kind both send.
fn origins(type_name: &str, subject: &str) -> String {
    let both = trust::rule(type_name).is_some_and(|r| r.allows(trust::Party::Site) && r.senders.len() > 1);
    match both {
        true => subject.replacen(".hub.", ".<hub|gateway>.", 1),
        false => subject.to_string(),
    }
}

pub fn page(root: &Path) -> Page {
    let docs = items(root);
    let doc = |name: &str| docs.iter().find(|i| i.name == name).map(|i| i.doc.clone()).unwrap_or_default();
    let rows = Rows::default().fill();
    let mut out = String::new();
    writeln!(
        out,
        "Every name landfall uses on NATS, made by `bus-schema/src/names.rs` (the item each row comes \
         from is named, with its doc comment) and `bus-schema/src/pb.rs` (which message is a command, \
         a job or an event). `{SITE}` is a site id; `{SCOPE}` a site id or `{}` for what belongs to no one site. \
         [Talk to landfall from any language](../clients.md) says how to use them.\n",
        names::FLEET
    )
    .unwrap();

    writeln!(out, "## Commands\n").unwrap();
    writeln!(out, "Published by operators and programs, stored in `{}`.\n", names::COMMANDS_STREAM).unwrap();
    writeln!(out, "| message | subject |").unwrap();
    writeln!(out, "| --- | --- |").unwrap();
    for (kind, type_name) in pb::COMMAND_TYPES {
        // The HTTP API knows each command's scope; one it does not publish is said as any scope.
        let scope = match producers::api::commands::COMMANDS.iter().find(|c| c.kind == *kind) {
            Some(c) if c.site_scoped => SITE,
            Some(_) => names::FLEET,
            None => SCOPE,
        };
        let subject = names::command_subject_from(trust::usual_origin(type_name), kind, scope);
        writeln!(out, "| {} | {} |", message_link(type_name), code_cell(&origins(type_name, &subject))).unwrap();
    }
    writeln!(out, "\n## Jobs\n").unwrap();
    writeln!(
        out,
        "Published by the hub for one site's gateway, stored in the site's shard of the jobs, `{}` \
         (`<shard>`: FNV-1a of the site's id modulo {}, two digits).\n",
        shard_placeholder(names::jobs_stream(0)),
        names::JOB_SHARDS
    )
    .unwrap();
    writeln!(out, "| message | subject |").unwrap();
    writeln!(out, "| --- | --- |").unwrap();
    for (kind, type_name) in pb::JOB_TYPES {
        writeln!(
            out,
            "| {} | {} |",
            message_link(type_name),
            code_cell(&shard_placeholder(&names::job_subject(SITE, kind)))
        )
        .unwrap();
    }
    writeln!(out, "\n## Events\n").unwrap();
    writeln!(
        out,
        "Stored in `{}`. A rejection or a dead letter's notice is published in the scope of what it answers.\n",
        names::EVENTS_STREAM
    )
    .unwrap();
    writeln!(out, "| message | subject |").unwrap();
    writeln!(out, "| --- | --- |").unwrap();
    for t in pb::EVENT_TYPES.iter() {
        let answered = [pb::rejection::COMMAND_AGGREGATE, pb::rejection::MESSAGE_AGGREGATE].contains(&t.aggregate);
        let scope = if t.fleet {
            names::FLEET
        } else if answered {
            SCOPE
        } else {
            SITE
        };
        let subject = names::event_subject_from(trust::usual_origin(t.type_name), scope, t.aggregate, t.kind);
        writeln!(out, "| {} | {} |", message_link(t.type_name), code_cell(&origins(t.type_name, &subject))).unwrap();
    }

    writeln!(out, "\n## Other subjects\n").unwrap();
    writeln!(out, "Requests, replies, deliveries and wildcards; none of these is stored unless its stream says so.\n")
        .unwrap();
    table(&mut out, "subject", &rows.subjects, &doc);

    writeln!(out, "## Streams\n").unwrap();
    writeln!(out, "| stream | subjects | from | what it keeps |").unwrap();
    writeln!(out, "| --- | --- | --- | --- |").unwrap();
    for (name, stream, subjects) in &rows.streams {
        writeln!(out, "| {} | {} | `{name}` | {} |", code_cell(stream), code_cell(subjects), escape_cell(&doc(name)))
            .unwrap();
    }
    writeln!(out).unwrap();

    writeln!(out, "## KV buckets\n").unwrap();
    writeln!(out, "Each bucket is kept in the stream JetStream names `{}`.\n", names::kv_stream("<bucket>")).unwrap();
    table(&mut out, "bucket", &rows.buckets, &doc);
    writeln!(out, "## Durable consumers\n").unwrap();
    table(&mut out, "consumer", &rows.consumers, &doc);
    writeln!(out, "## Queue groups\n").unwrap();
    table(&mut out, "group", &rows.groups, &doc);
    writeln!(out, "## Headers\n").unwrap();
    table(&mut out, "header", &rows.headers, &doc);
    Page { file: "subjects.md".to_string(), title: "NATS subjects, streams and buckets".to_string(), body: out }
}

/// `text` as a code span in a table cell: a `|` in it (`<hub|gateway>`) would end the cell.
fn code_cell(text: &str) -> String {
    escape_cell(&format!("`{text}`"))
}

fn table(out: &mut String, what: &str, rows: &[(&'static str, String)], doc: &dyn Fn(&str) -> String) {
    writeln!(out, "| {what} | from | what it is |").unwrap();
    writeln!(out, "| --- | --- | --- |").unwrap();
    for (name, value) in rows {
        writeln!(out, "| {} | `{name}` | {} |", code_cell(value), escape_cell(&doc(name))).unwrap();
    }
    writeln!(out).unwrap();
}

fn message_link(type_name: &str) -> String {
    super::proto::link(type_name.rsplit('.').next().unwrap_or(type_name))
}
