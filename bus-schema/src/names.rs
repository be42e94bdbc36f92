//! Subjects, streams, consumers, KV buckets and headers.
//!
//! Subject layout. Every subject a site uses names the site as its third token
//! ([`SCOPE_TOKEN`]), so a site's permissions are a few wildcards (see `access`):
//! - commands: `landfall.cmd.<scope>.<origin>.<kind>` (scope = site id, or [`FLEET`]; origin
//!   [`Origin`]: `hub` or `gateway`)
//! - jobs: `landfall.job.<site>.<shard>.<kind>`, stored in the site's shard of the jobs
//!   ([`JOB_SHARDS`] work queues, [`jobs_stream`]) and pushed to each site's gateway on
//!   `landfall.to.<site>.jobs`
//! - events: `landfall.evt.<scope>.<origin>.<aggregate>.<kind>`
//! - to a site, never stored: its jobs, the hub's requests of it
//!   (`landfall.to.<site>.rpc.<kind>`) and the answers to its own requests
//!   (`landfall.to.<site>.inbox.…`)
//! - from a site to the hub's services, never stored: its requests
//!   (`landfall.svc.<site>.<kind>`) and its answers to the hub's requests
//!   (`landfall.svc.<site>.reply.<requester's inbox>.…`)
//! - request/reply from an operator to a hub service (never stored): `landfall.admin.<kind>`
//! - dead letters (messages a consumer gave up on): `landfall.dead.<consumer>`

use std::time::Duration;

/// The scope of commands and events that belong to no single site.
pub const FLEET: &str = "fleet";

pub const COMMANDS_STREAM: &str = "LANDFALL_COMMANDS";
/// The one jobs stream of landfall before its jobs were spread over [`JOB_SHARDS`] streams: the
/// orchestrator moves what it holds into them when it starts (`runtime::job_shards`).
pub const LEGACY_JOBS_STREAM: &str = "LANDFALL_JOBS";
/// Where the orchestrator keeps the jobs it moves out of [`LEGACY_JOBS_STREAM`] until each is in
/// its shard, so that a move cut short goes on where it stopped.
pub const MOVING_JOBS_STREAM: &str = "LANDFALL_JOBS_MOVING";
pub const MOVING_JOBS_ALL: &str = "landfall.moving.>";
/// The name a message of [`LEGACY_JOBS_STREAM`] that is no job is filed under as a dead letter
/// when the jobs move (`landfall.dead.orchestrator-jobs-move`).
pub const JOBS_MOVE: &str = "orchestrator-jobs-move";
pub const EVENTS_STREAM: &str = "LANDFALL_EVENTS";
/// Messages a consumer gave up on (too many transient failures, or a process lost every time it
/// handled them), each with what it takes to look at it and replay it (`pb::DeadLetter`).
pub const DEAD_STREAM: &str = "LANDFALL_DEAD";
/// How many work-queue streams the fleet's jobs are spread over, by site ([`job_shard`]).
///
/// nats-server checks a new consumer against every other consumer of its stream, and from 2.14
/// on a work queue checks every consumer at each acknowledgement; with a durable per site, one
/// stream made both grow with the fleet (ARCHITECTURE.md, "Jobs at 10,000 sites"). Spread over
/// 64 streams, 10,000 sites are about 156 durables each. Changing it moves every site's jobs, so
/// it is fixed.
pub const JOB_SHARDS: usize = 64;

/// The shard of the jobs a site's jobs are kept in: FNV-1a (32 bits) of its id, modulo
/// [`JOB_SHARDS`]. Any client can compute it; only the hub publishes jobs.
pub fn job_shard(site: &str) -> usize {
    let hash = site.bytes().fold(0x811c_9dc5_u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193));
    hash as usize % JOB_SHARDS
}

/// The jobs stream of shard `shard` (modulo [`JOB_SHARDS`]): `LANDFALL_JOBS_00` …
/// `LANDFALL_JOBS_63`.
pub fn jobs_stream(shard: usize) -> &'static str {
    static NAMES: std::sync::LazyLock<Vec<String>> =
        std::sync::LazyLock::new(|| (0..JOB_SHARDS).map(|shard| format!("LANDFALL_JOBS_{shard:02}")).collect());
    &NAMES[shard % JOB_SHARDS]
}

/// The jobs stream that keeps one site's jobs.
pub fn site_jobs_stream(site: &str) -> &'static str {
    jobs_stream(job_shard(site))
}

/// Every job of one shard: the subjects of its stream.
pub fn shard_jobs(shard: usize) -> String {
    format!("landfall.job.*.{shard:02}.>")
}

/// Every jobs stream, shard by shard.
pub fn jobs_streams() -> impl Iterator<Item = &'static str> {
    (0..JOB_SHARDS).map(jobs_stream)
}

/// Every stream landfall keeps (its buckets' streams are [`kv_stream`] of [`ALL_BUCKETS`]).
pub fn streams() -> Vec<&'static str> {
    let mut all = vec![COMMANDS_STREAM];
    all.extend(jobs_streams());
    all.extend([EVENTS_STREAM, DEAD_STREAM]);
    all
}

/// Whether `subject` matches `pattern` as NATS matches them: in the pattern, `*` is one token
/// and `>` the rest; a subject's own `*` or `>` tokens (a consumer's filter in a create subject)
/// are literal.
pub fn subject_matches(pattern: &str, subject: &str) -> bool {
    let (mut p, mut s) = (pattern.split('.'), subject.split('.'));
    loop {
        match (p.next(), s.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// The stream a message published on `subject` is stored in, when it is one of landfall's.
pub fn stream_of_subject(subject: &str) -> Option<&'static str> {
    match subject.split('.').take(3).collect::<Vec<_>>()[..] {
        ["landfall", "cmd", ..] => Some(COMMANDS_STREAM),
        ["landfall", "job", site] => Some(site_jobs_stream(site)),
        ["landfall", "evt", ..] => Some(EVENTS_STREAM),
        ["landfall", "dead", ..] => Some(DEAD_STREAM),
        _ => None,
    }
}

/// A site's own record of what its gateway reported, in the site's own JetStream domain (its
/// leaf node): each report is stored there first, at `outbox.<hub subject>`, and forwarded to
/// the hub's stream from there, in order and once.
pub const OUTBOX_STREAM: &str = "LANDFALL_OUTBOX";
pub const OUTBOX_ALL: &str = "outbox.>";
/// The site's own bucket (in its domain): how far its outbox has reached the hub.
pub const SITE_STATE_BUCKET: &str = "landfall-site";

/// Where a site keeps a report bound for `subject` on the hub.
pub fn outbox_subject(subject: &str) -> String {
    format!("outbox.{subject}")
}

/// The hub subject a report kept in a site's outbox is bound for, as its gateway sends it now: one
/// an earlier version kept (`landfall.evt.<site>.<aggregate>.<kind>`, `landfall.cmd.<kind>.<site>`,
/// with no origin) goes under the site's gateway subjects, where its user may publish.
pub fn outbox_destination(local: &str) -> Option<String> {
    let subject = local.strip_prefix("outbox.")?;
    let tokens: Vec<&str> = subject.split('.').collect();
    Some(match tokens.as_slice() {
        ["landfall", "evt", site, aggregate, kind] => event_subject_from(Origin::Gateway, site, aggregate, kind),
        ["landfall", "cmd", kind, site] => command_subject_from(Origin::Gateway, kind, site),
        _ => subject.to_string(),
    })
}

/// The jobs that reached a site, kept in the site's own domain at `inbox.<hub subject>` until
/// its gateway has carried them out: a gateway killed while the link is down takes them up
/// again from there.
pub const INBOX_STREAM: &str = "LANDFALL_INBOX";
pub const INBOX_ALL: &str = "inbox.>";
/// The durable consumer a site's gateway carries its kept jobs out with.
pub const INBOX_CONSUMER: &str = "gateway";

/// Where a site keeps a job that came on `subject`.
pub fn inbox_subject(subject: &str) -> String {
    format!("inbox.{subject}")
}

/// The hub subject a job kept in a site's inbox came on.
pub fn inbox_origin(local: &str) -> Option<&str> {
    local.strip_prefix("inbox.")
}

pub const COMMANDS_ALL: &str = "landfall.cmd.>";
pub const JOBS_ALL: &str = "landfall.job.>";
pub const EVENTS_ALL: &str = "landfall.evt.>";
pub const DEAD_ALL: &str = "landfall.dead.>";

/// At the core, above regional hubs: the stream that keeps the commands published there for
/// `region` until that region's commands stream, which sources it, has taken them (under their
/// own subjects, `landfall.cmd.…`).
pub fn core_commands_stream(region: &str) -> String {
    format!("LANDFALL_CORE_COMMANDS_{region}")
}

/// At the core: a mirror of `region`'s events stream (its events under their own subjects),
/// which dashboards and clients at the core read.
pub fn core_events_stream(region: &str) -> String {
    format!("LANDFALL_CORE_EVENTS_{region}")
}

/// The core's subjects for `region`'s commands.
pub fn region_commands(region: &str) -> String {
    format!("landfall.region.{region}.cmd.>")
}

/// `subject` (a command's, `landfall.cmd.…`) as published at the core for `region`
/// (`landfall.region.<region>.cmd.…`); the region's commands stream takes it back to `subject`.
/// `None` for a subject that is no command's.
pub fn to_region(subject: &str, region: &str) -> Option<String> {
    subject.strip_prefix("landfall.cmd.").map(|rest| format!("landfall.region.{region}.cmd.{rest}"))
}

/// Where consumer `consumer` files the messages it gives up on.
pub fn dead_letter_subject(consumer: &str) -> String {
    format!("landfall.dead.{consumer}")
}

/// A scratch stream `landfall bench` measures raw JetStream publishing on, then deletes.
pub const BENCH_STREAM: &str = "LANDFALL_BENCH_RAW";
pub const BENCH_SUBJECT: &str = "landfall.bench.raw";

/// A scratch subject `landfall bench transfer` measures raw request/reply on.
pub fn bench_echo(id: &str) -> String {
    format!("landfall.bench.echo.{id}")
}

/// How long a command or event is kept.
pub const RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);
/// The window in which a repeated `Nats-Msg-Id` is recognised and dropped.
pub const DEDUP_WINDOW: Duration = Duration::from_secs(15 * 60);
/// The largest payload any landfall message may carry.
pub const MAX_PAYLOAD: usize = 1024 * 1024;

pub const SITES_BUCKET: &str = "landfall-sites";
pub const PACKAGES_BUCKET: &str = "landfall-packages";
pub const OBSERVED_BUCKET: &str = "landfall-observed";
pub const SAGAS_BUCKET: &str = "landfall-sagas";
pub const KUBECONFIGS_BUCKET: &str = "landfall-kubeconfigs";
/// Every command carried out or refused, by id, kept as long as the commands stream keeps it.
pub const LEDGER_BUCKET: &str = "landfall-ledger";
/// The stream that holds a KV bucket (JetStream's naming).
pub fn kv_stream(bucket: &str) -> String {
    format!("KV_{bucket}")
}
/// Commands the API holds until a second person approves or refuses them (the API's).
pub const APPROVALS_BUCKET: &str = "landfall-approvals";
/// Sites' identities, enrollments and the keys they connect with (the identity service's).
pub const IDENTITY_BUCKET: &str = "landfall-identity";
pub const ALL_BUCKETS: [&str; 8] = [
    SITES_BUCKET,
    PACKAGES_BUCKET,
    OBSERVED_BUCKET,
    SAGAS_BUCKET,
    KUBECONFIGS_BUCKET,
    LEDGER_BUCKET,
    IDENTITY_BUCKET,
    APPROVALS_BUCKET,
];

/// Where the NATS server asks who a connecting client is (its auth callout): the identity
/// service answers. Only the server publishes here.
pub const AUTH_CALLOUT: &str = "$SYS.REQ.USER.AUTH";

/// Where a NATS server takes a request to close one of its connections (system account).
pub fn server_kick(server_id: &str) -> String {
    format!("$SYS.REQ.SERVER.{server_id}.KICK")
}

/// Every identity subject.
pub const IDENTITY_ALL: &str = "landfall.identity.>";

/// A gateway's request to join, connected with a bootstrap credential and the identity key
/// `key` (which the server checked the gateway holds).
pub fn identity_enroll(key: &str) -> String {
    format!("landfall.identity.enroll.{key}")
}

/// The kind of a site's request for new link credentials.
pub const IDENTITY_RENEW: &str = "renew_identity";

/// A site's request for new link credentials (one of its own service subjects).
pub fn identity_renew(site: &str) -> String {
    format!("landfall.svc.{site}.{IDENTITY_RENEW}")
}

/// Operators' requests to the identity service (`IdentityAdmin`).
pub const IDENTITY_ADMIN: &str = "landfall.identity.admin";

/// The identity service's queue group.
pub const IDENTITY_GROUP: &str = "landfall-identity";

/// Durable consumer names.
pub const ORCHESTRATOR_COMMANDS: &str = "orchestrator-commands";
pub const ORCHESTRATOR_EVENTS: &str = "orchestrator-events";
pub const KUBECONFIG_EVENTS: &str = "kubeconfig-events";
/// The orchestrator's consumer of the events that move rollouts (one rollout's in turn).
pub const ORCHESTRATOR_ROLLOUTS: &str = "orchestrator-rollouts";
/// The consumer that keeps `landfall-observed` up to date from what gateways report.
pub const OBSERVER_EVENTS: &str = "observer-events";
/// The identity service's: sites decommissioned or removed, whose identities it revokes.
pub const IDENTITY_EVENTS: &str = "identity-events";

pub fn gateway_consumer(site: &str) -> String {
    format!("gateway-{site}")
}

pub mod headers {
    /// The message's id; JetStream drops a second message with the same id.
    pub const MSG_ID: &str = "Nats-Msg-Id";
    /// The protobuf full name of the payload, e.g. `landfall.v1.InstallSite`.
    pub const TYPE: &str = "Landfall-Type";
    /// The id of the command at the root of this chain of messages.
    pub const CORRELATION_ID: &str = "Landfall-Correlation-Id";
    /// The id of the message that caused this one.
    pub const CAUSATION_ID: &str = "Landfall-Causation-Id";
    /// W3C trace context.
    pub const TRACEPARENT: &str = "traceparent";
    /// Who asked for the command at the root of this chain: `user:<name>` (signed in through
    /// the identity provider), `token:<name>` (a static API token), `nats:<user>` (a client
    /// publishing on the bus itself), `service:<name>`, or `site:<id>` (a site's gateway; the
    /// hub puts it there from the subject, whatever the site wrote).
    pub const ACTOR: &str = "Landfall-Actor";
    /// On an artifact chunk: the sha256 of the chunk's bytes, taken where they were read.
    pub const CHUNK_SHA256: &str = "Landfall-Chunk-Sha256";
    /// On a request/reply answer: the request failed, and this says why (the body is empty).
    pub const REPLY_ERROR: &str = "Landfall-Error";
    /// Set by JetStream KV on a delete or purge marker (`DEL`, `PURGE`).
    pub const KV_OPERATION: &str = "KV-Operation";
    /// On a job the dispatcher hands a site: the job's own subject, its place in its stream,
    /// and how many times it has been handed out.
    pub const JOB_SUBJECT: &str = "Landfall-Job-Subject";
    pub const JOB_SEQUENCE: &str = "Landfall-Job-Sequence";
    pub const JOB_DELIVERED: &str = "Landfall-Job-Delivered";
    /// On a site's answer to a job handed to it: `done` (carried out, or refused with its
    /// rejection published) or `refused` (not its job; the body says why).
    pub const JOB_ANSWER: &str = "Landfall-Job-Answer";
}

/// The durable of the dispatcher on each shard of the jobs (`runtime::dispatch`).
pub const DISPATCHER: &str = "landfall-dispatch";

/// Who sent a command or an event, as the fourth token of its subject says: the hub (its
/// services and people, whose users publish only what they send) or a site's gateway, which
/// may publish anything under its own site's `gateway` subjects and so is believed only for
/// the kinds a site sends, about its own site (`trust::check`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Origin {
    #[default]
    Hub,
    Gateway,
}

impl Origin {
    pub const fn token(self) -> &'static str {
        match self {
            Origin::Hub => "hub",
            Origin::Gateway => "gateway",
        }
    }

    pub fn from_token(token: &str) -> Option<Self> {
        match token {
            "hub" => Some(Origin::Hub),
            "gateway" => Some(Origin::Gateway),
            _ => None,
        }
    }
}

/// The position of the scope in command and event subjects (`landfall.<cmd|evt>.<scope>.…`),
/// and of the site in every subject a site uses.
pub const SCOPE_TOKEN: usize = 2;

/// A command the hub sends (a person, the API, the orchestrator).
pub fn command_subject(kind: &str, scope: &str) -> String {
    command_subject_from(Origin::Hub, kind, scope)
}

pub fn command_subject_from(origin: Origin, kind: &str, scope: &str) -> String {
    format!("landfall.cmd.{scope}.{}.{kind}", origin.token())
}

pub fn job_subject(site: &str, kind: &str) -> String {
    format!("landfall.job.{site}.{:02}.{kind}", job_shard(site))
}

/// Jobs of one kind, at every site: what the hub may publish of them.
pub fn jobs_of_kind(kind: &str) -> String {
    format!("landfall.job.*.*.{kind}")
}

/// An event the hub sends.
pub fn event_subject(scope: &str, aggregate: &str, kind: &str) -> String {
    event_subject_from(Origin::Hub, scope, aggregate, kind)
}

pub fn event_subject_from(origin: Origin, scope: &str, aggregate: &str, kind: &str) -> String {
    format!("landfall.evt.{scope}.{}.{aggregate}.{kind}", origin.token())
}

/// Every job of one site, in its shard: what that site's gateway's durable consumes.
pub fn site_jobs(site: &str) -> String {
    format!("landfall.job.{site}.{:02}.>", job_shard(site))
}

/// Every job of one site, whatever the layout it came in: a site's inbox keeps jobs an earlier
/// version sent (`landfall.job.<site>.<kind>`) beside the sharded ones.
pub fn site_every_job(site: &str) -> String {
    format!("landfall.job.{site}.>")
}

/// Every event of one scope (a site, or the fleet).
pub fn scope_events(scope: &str) -> String {
    format!("landfall.evt.{scope}.>")
}

/// Every command or event of `channel` (`cmd`, `evt`) a site's gateway sent: what the site
/// may publish of them.
pub fn sent_by_gateway(channel: &str, site: &str) -> String {
    format!("landfall.{channel}.{site}.{}.>", Origin::Gateway.token())
}

/// Events of one aggregate and kind in one scope (`*`: every one), whoever sent them.
pub fn events_at(scope: &str, aggregate: &str, kind: &str) -> String {
    format!("landfall.evt.{scope}.*.{aggregate}.{kind}")
}

/// Events of one aggregate and kind at every site, whoever sent them, e.g. every
/// `cluster.ready`.
pub fn events_of_kind(aggregate: &str, kind: &str) -> String {
    events_at("*", aggregate, kind)
}

/// Every command of one scope, whoever sent it.
pub fn scope_commands(scope: &str) -> String {
    format!("landfall.cmd.{scope}.>")
}

/// The kind of the kubeconfig collector's request to a site.
pub const KUBECONFIG_RPC: &str = "kubeconfig";
/// The kind of an operator's request that a site check its charts for drift now.
pub const DRIFT_CHECK_RPC: &str = "drift_check";

/// Everything sent to one site: its jobs, the hub's requests of it and the answers to its own
/// requests. Only the site's user may subscribe.
pub fn to_site(site: &str) -> String {
    format!("landfall.to.{site}.>")
}

/// Where the hub's jobs stream pushes one site's jobs: its gateway's durable push consumer
/// delivers here.
pub fn site_deliver(site: &str) -> String {
    format!("landfall.to.{site}.jobs")
}

/// The inbox prefix of a site's gateway: the answers to its requests.
pub fn site_inbox(site: &str) -> String {
    format!("landfall.to.{site}.inbox")
}

/// The hub's request of kind `kind` to one site.
pub fn site_rpc(site: &str, kind: &str) -> String {
    format!("landfall.to.{site}.rpc.{kind}")
}

/// Every request the hub makes of one site (kubeconfigs, drift checks, simulated arrivals).
pub fn site_rpcs(site: &str) -> String {
    site_rpc(site, "*")
}

/// Request/reply to a site: check its charts' releases against their renders now.
pub fn drift_check_rpc(site: &str) -> String {
    site_rpc(site, DRIFT_CHECK_RPC)
}

/// The kind of an operator's request that makes a host appear at a simulated site.
pub const SIM_HOST_ARRIVAL_RPC: &str = "sim_host_arrival";

pub fn kubeconfig_rpc(site: &str) -> String {
    site_rpc(site, KUBECONFIG_RPC)
}

/// Every request one site makes of the hub's services.
pub fn site_services(site: &str) -> String {
    format!("landfall.svc.{site}.>")
}

/// Where one site answers the requests of the hub's user whose inbox prefix is `inbox_prefix`
/// (each request adding a token of its own): under the site's own subjects, so the answer
/// may cross the site's leaf node's link, and no other site's can land there.
pub fn site_replies(site: &str, inbox_prefix: &str) -> String {
    format!("landfall.svc.{site}.reply.{inbox_prefix}")
}

/// Every site's answers to the user whose inbox prefix is `inbox_prefix`: what that user
/// subscribes to for its requests of sites.
pub fn replies_from_sites(inbox_prefix: &str) -> String {
    format!("landfall.svc.*.reply.{inbox_prefix}.>")
}

/// Request/reply to a simulated site: a new host appears there (`landfall node add`).
pub fn sim_host_arrival_rpc(site: &str) -> String {
    site_rpc(site, SIM_HOST_ARRIVAL_RPC)
}

/// The queue group distribution service replicas share requests in.
pub const DISTRIBUTION_GROUP: &str = "landfall-distribution";
/// The queue group secrets service replicas share requests in.
pub const SECRETS_GROUP: &str = "landfall-secrets";

/// A gateway's artifact plan request to the distribution service.
pub fn artifact_plan_svc(site: &str) -> String {
    format!("landfall.svc.{site}.artifact_plan")
}

/// A gateway's request for one chunk of an artifact.
pub fn artifact_chunk_svc(site: &str) -> String {
    format!("landfall.svc.{site}.artifact_chunk")
}

/// A gateway's request for a host's BMC credentials, for the job that drives its BMC.
pub fn bmc_credentials_svc(site: &str) -> String {
    format!("landfall.svc.{site}.bmc_credentials")
}

/// A gateway's request for its site's render of a helm-chart package.
pub fn chart_render_svc(site: &str) -> String {
    format!("landfall.svc.{site}.{CHART_RENDER}")
}

/// One gateway service kind at every site, as the hub service subscribes to it.
pub fn svc_every_site(kind: &str) -> String {
    format!("landfall.svc.*.{kind}")
}
/// A gateway's heartbeat (`landfall.svc.<site>.alive`, published, not a request): the hub
/// hears its site through it.
pub fn site_alive(site: &str) -> String {
    format!("landfall.svc.{site}.{SITE_ALIVE}")
}
pub const SITE_ALIVE: &str = "alive";
/// How often a gateway says it is there, by default.
pub const ALIVE_EVERY: Duration = Duration::from_secs(15);
/// How long the hub hears nothing of a site before it counts it cut off, by default: four
/// heartbeats missed.
pub const CUT_OFF_AFTER: Duration = Duration::from_secs(60);
pub const ARTIFACT_PLAN: &str = "artifact_plan";
pub const ARTIFACT_CHUNK: &str = "artifact_chunk";
pub const BMC_CREDENTIALS: &str = "bmc_credentials";
pub const CHART_RENDER: &str = "chart_render";

/// The kinds of the operators' requests (`landfall.admin.<kind>`).
pub const KUBECONFIG_GET: &str = "kubeconfig_get";
pub const BMC_CREDENTIALS_PUT: &str = "bmc_credentials_put";
pub const ROTATE_KEY: &str = "rotate_key";
/// Operators: a site's kubeconfig, opened.
pub const KUBECONFIG_GET_ADMIN: &str = "landfall.admin.kubeconfig_get";
/// Operators: seal and store a host's BMC credentials.
pub const BMC_CREDENTIALS_PUT_ADMIN: &str = "landfall.admin.bmc_credentials_put";
/// Operators: seal every secret again under a new key.
pub const ROTATE_KEY_ADMIN: &str = "landfall.admin.rotate_key";

/// The operators' requests, which only the secrets service answers.
pub const ADMIN_SUBJECTS: [&str; 3] = [KUBECONFIG_GET_ADMIN, BMC_CREDENTIALS_PUT_ADMIN, ROTATE_KEY_ADMIN];

/// The parts of a landfall subject, parsed back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParsedSubject<'a> {
    Command {
        kind: &'a str,
        scope: &'a str,
        origin: Origin,
    },
    Job {
        site: &'a str,
        kind: &'a str,
    },
    Event {
        scope: &'a str,
        origin: Origin,
        aggregate: &'a str,
        kind: &'a str,
    },
    /// A gateway's request to a hub service: `landfall.svc.<site>.<kind>`.
    Service {
        site: &'a str,
        kind: &'a str,
    },
    /// The hub's request to a site: `landfall.to.<site>.rpc.<kind>`.
    Rpc {
        site: &'a str,
        kind: &'a str,
    },
    /// An operator's request to the secrets service: `landfall.admin.<kind>`.
    Admin {
        kind: &'a str,
    },
}

pub fn parse_subject(subject: &str) -> Option<ParsedSubject<'_>> {
    let parts: Vec<&str> = subject.split('.').collect();
    match parts.as_slice() {
        ["landfall", "cmd", scope, origin, kind] => {
            Some(ParsedSubject::Command { kind, scope, origin: Origin::from_token(origin)? })
        }
        // A job's shard follows from its site: a subject whose shard does not is no job.
        ["landfall", "job", site, shard, kind] => {
            (*shard == format!("{:02}", job_shard(site))).then_some(ParsedSubject::Job { site, kind })
        }
        // As an earlier version sent it, before the shards; still kept in a site's inbox.
        ["landfall", "job", site, kind] => Some(ParsedSubject::Job { site, kind }),
        ["landfall", "evt", scope, origin, aggregate, kind] => {
            Some(ParsedSubject::Event { scope, origin: Origin::from_token(origin)?, aggregate, kind })
        }
        ["landfall", "svc", site, kind] => Some(ParsedSubject::Service { site, kind }),
        ["landfall", "to", site, "rpc", kind] => Some(ParsedSubject::Rpc { site, kind }),
        ["landfall", "admin", kind] => Some(ParsedSubject::Admin { kind }),
        _ => None,
    }
}

/// KV keys.
pub mod keys;

#[cfg(test)]
mod tests;
