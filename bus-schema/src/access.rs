//! Who may do what on the bus: the NATS permissions of each service's user and of each site.
//!
//! A site is the least trusted party: its key may be stolen. Its gateway (and its leaf node's link
//! to the hub, which carries the same user) may receive what is sent to its own site (its jobs,
//! from the durable consumer the hub made for it, the hub's requests, its answers), publish
//! commands and events under its own site's `gateway` subjects, ask the hub's services about its
//! own site and answer the hub's requests there, acknowledge its own jobs, and read its own
//! design and its own last reports. Nothing else: not another site's subjects, not the hub's, not
//! the key-value buckets. That is eight wildcards, each naming the site ([`site_permissions`]);
//! which kinds a site may send under them is for `trust::check`, which every consumer applies.
//!
//! Hub services get what their role needs, on landfall's streams and buckets only: their own
//! durable consumers (no other's), consumers of their own making on what they read, and writes
//! to the buckets (or keys) they own. None may delete or purge a stream.
//!
//! Every reply subject is the user's own ([`inbox`]): a user may receive its replies and no one
//! else's, which a shared `_INBOX.>` would allow.

use crate::names::{self, keys, kv_stream};
use crate::pb;
use crate::trust::{self, Channel, Party};

/// The reply-subject prefix of every user without a key of its own.
pub const INBOX_PREFIX: &str = "_INBOX";

/// The reply-subject prefix of the user with this public key.
pub fn inbox(public_key: &str) -> String {
    format!("{INBOX_PREFIX}_{public_key}")
}

/// The hub's JetStream domain: a site's leaf node has a domain of its own, so its gateway
/// reaches the hub's streams as `$JS.hub.API.…`.
pub const HUB_DOMAIN: &str = "hub";

/// The core's JetStream domain, above regional hubs ([`region_domain`]): each region's
/// commands are kept there until the region's hub takes them, and each region's events are
/// mirrored there for reading across the regions.
pub const CORE_DOMAIN: &str = "core";

/// The JetStream domain of the hub of `region` (`hub-<region>`): every regional hub must have a
/// domain of its own, so the core reaches each one's streams by its name.
pub fn region_domain(region: &str) -> String {
    format!("{HUB_DOMAIN}-{region}")
}

/// Whether `name` may name a region: 1 to 32 lowercase letters, digits and inner dashes, since
/// it becomes a JetStream domain, a token of subjects and part of stream names.
pub fn check_region(name: &str) -> Result<(), String> {
    let valid = (1..=32).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    match valid {
        true => Ok(()),
        false => Err(format!(
            "{name:?} is not a region name: 1 to 32 lowercase letters, digits and dashes, not starting or ending with one"
        )),
    }
}

/// A NATS user's permissions, as a server's configuration lists them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Permissions {
    pub publish: Vec<String>,
    /// Refused even where `publish` allows it: other services' durable consumers on a stream
    /// this user makes consumers of its own on.
    pub publish_deny: Vec<String>,
    pub subscribe: Vec<String>,
    /// May answer requests it received (publish once to their reply subjects).
    pub allow_responses: bool,
}

/// The parties that connect to the hub.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    Orchestrator,
    Observer,
    /// The kubeconfig collector and the secrets service.
    Kubeconfig,
    Distribution,
    Api,
    /// People and their tools: the CLI and `landfall up`; every landfall subject.
    Operator,
    /// The identity service: sites' enrollment and credentials, and the NATS server's auth
    /// callout, which lets sites in.
    Identity,
    /// One site: its gateway, and its leaf node's link to the hub.
    Site(String),
}

impl Role {
    /// The user's name in configuration and logs.
    pub fn user(&self) -> String {
        match self {
            Role::Orchestrator => "orchestrator".into(),
            Role::Observer => "observer".into(),
            Role::Kubeconfig => "kubeconfig".into(),
            Role::Distribution => "distribution".into(),
            Role::Api => "api".into(),
            Role::Operator => "operator".into(),
            Role::Identity => "identity".into(),
            Role::Site(site) => format!("site-{site}"),
        }
    }

    /// The hub services, each a user of its own.
    pub fn services() -> [Role; 7] {
        [
            Role::Orchestrator,
            Role::Observer,
            Role::Kubeconfig,
            Role::Distribution,
            Role::Api,
            Role::Operator,
            Role::Identity,
        ]
    }

    /// The durable consumers a hub service owns, as (stream, name).
    fn durables(&self) -> &'static [(&'static str, &'static str)] {
        match self {
            Role::Orchestrator => &[
                (names::COMMANDS_STREAM, names::ORCHESTRATOR_COMMANDS),
                (names::EVENTS_STREAM, names::ORCHESTRATOR_EVENTS),
                (names::EVENTS_STREAM, names::ORCHESTRATOR_ROLLOUTS),
            ],
            Role::Observer => &[(names::EVENTS_STREAM, names::OBSERVER_EVENTS)],
            Role::Kubeconfig => &[(names::EVENTS_STREAM, names::KUBECONFIG_EVENTS)],
            Role::Identity => &[(names::EVENTS_STREAM, names::IDENTITY_EVENTS)],
            Role::Distribution | Role::Api | Role::Operator | Role::Site(_) => &[],
        }
    }

    /// The buckets a hub service reads (gets, scans, watches).
    fn buckets_read(&self) -> &'static [&'static str] {
        match self {
            Role::Orchestrator => &[
                names::SITES_BUCKET,
                names::PACKAGES_BUCKET,
                names::OBSERVED_BUCKET,
                names::SAGAS_BUCKET,
                names::LEDGER_BUCKET,
            ],
            // The commands it holds for a second person, too.
            Role::Api => &[
                names::SITES_BUCKET,
                names::PACKAGES_BUCKET,
                names::OBSERVED_BUCKET,
                names::SAGAS_BUCKET,
                names::LEDGER_BUCKET,
                names::APPROVALS_BUCKET,
            ],
            // The sagas and rollouts too: a site's report counts only as the answer to their jobs;
            // the sites, to hear only registered ones.
            Role::Observer => {
                &[names::OBSERVED_BUCKET, names::PACKAGES_BUCKET, names::SAGAS_BUCKET, names::SITES_BUCKET]
            }
            Role::Kubeconfig => &[names::KUBECONFIGS_BUCKET, names::SAGAS_BUCKET, names::SITES_BUCKET],
            // The sites' designs: the values a chart is rendered with for each.
            Role::Distribution => &[names::PACKAGES_BUCKET, names::SITES_BUCKET],
            // Whether a site asking to join is registered.
            Role::Identity => &[names::IDENTITY_BUCKET, names::SITES_BUCKET],
            Role::Operator | Role::Site(_) => &[],
        }
    }

    /// The keys a hub service writes, as (bucket, key pattern): only what it owns.
    fn kv_writes(&self) -> &'static [(&'static str, &'static str)] {
        match self {
            Role::Orchestrator => &[
                (names::SITES_BUCKET, ">"),
                (names::SAGAS_BUCKET, ">"),
                (names::LEDGER_BUCKET, ">"),
                (names::PACKAGES_BUCKET, "pkg.>"),
                (names::PACKAGES_BUCKET, "policy.>"),
                // A removed site's chart renders (the distribution service makes them).
                (names::PACKAGES_BUCKET, "render.>"),
            ],
            Role::Observer => &[(names::OBSERVED_BUCKET, ">")],
            Role::Kubeconfig => &[(names::KUBECONFIGS_BUCKET, ">")],
            // It announces where the artifact store is, and keeps the charts it rendered for sites.
            Role::Distribution => {
                &[(names::PACKAGES_BUCKET, keys::ARTIFACT_STORE), (names::PACKAGES_BUCKET, "render.>")]
            }
            Role::Identity => &[(names::IDENTITY_BUCKET, ">")],
            // The commands it holds until a second person decides.
            Role::Api => &[(names::APPROVALS_BUCKET, ">")],
            Role::Operator | Role::Site(_) => &[],
        }
    }

    /// The streams (not buckets) a hub service reads with consumers of its own making: the
    /// API's read model and event feeds.
    fn streams_read(&self) -> &'static [&'static str] {
        match self {
            Role::Api => &[names::EVENTS_STREAM],
            _ => &[],
        }
    }

    /// What the user with `public_key` may do.
    pub fn permissions(&self, public_key: &str) -> Permissions {
        let mut p = Permissions { subscribe: vec![format!("{}.>", inbox(public_key))], ..Default::default() };
        match self {
            Role::Site(site) => return site_permissions(site, HUB_DOMAIN),
            Role::Operator => {
                p.publish = vec![
                    "landfall.>".into(),
                    "$JS.API.>".into(),
                    "$JS.ACK.>".into(),
                    "$JS.FC.>".into(),
                    "$KV.>".into(),
                    "$O.>".into(),
                ];
                p.subscribe.push("landfall.evt.>".into());
                // Sites' answers to its requests (`landfall site kubeconfig`, `node add`).
                p.subscribe.push(names::replies_from_sites(&inbox(public_key)));
                // A job reaches a site only from its durable on the jobs stream, never by hand,
                // and a site's answers only from whom it asked.
                p.publish_deny.push(names::site_deliver("*"));
                p.publish_deny.push(format!("{}.>", names::site_inbox("*")));
                return p;
            }
            _ => {}
        }
        // Every hub service makes sure the streams and buckets exist when it starts.
        p.publish.push(js_api("INFO"));
        for stream in
            names::streams().into_iter().map(String::from).chain(names::ALL_BUCKETS.iter().map(|b| kv_stream(b)))
        {
            p.publish.push(js_api(&format!("STREAM.INFO.{stream}")));
            p.publish.push(js_api(&format!("STREAM.CREATE.{stream}")));
            // The orchestrator brings existing streams' keeping times (`--retention`,
            // `--duplicate-window`) and buckets' history to its settings; no one else changes a
            // stream.
            if *self == Role::Orchestrator {
                p.publish.push(js_api(&format!("STREAM.UPDATE.{stream}")));
            }
        }
        // Whether an earlier version's one jobs stream is still there: only the orchestrator
        // moves its jobs into the shards (`runtime::job_shards`).
        p.publish.push(js_api(&format!("STREAM.INFO.{}", names::LEGACY_JOBS_STREAM)));
        // What the table of kinds (`trust::RULES`) says the role sends, and nothing else.
        p.publish.extend(self.party().map(sends).unwrap_or_default());
        for (stream, durable) in self.durables() {
            p.publish.extend(durable_consumer(stream, durable));
            // What its consumer gives up on, filed under the consumer's own name.
            p.publish.push(names::dead_letter_subject(durable));
        }
        for stream in
            self.streams_read().iter().map(|s| s.to_string()).chain(self.buckets_read().iter().map(|b| kv_stream(b)))
        {
            p.publish.extend(own_consumers(&stream));
            p.publish_deny.extend(others_durables(self, &stream));
        }
        for bucket in self.buckets_read() {
            p.publish.extend(getter(&kv_stream(bucket)));
        }
        for (bucket, key) in self.kv_writes() {
            p.publish.push(format!("$KV.{bucket}.{key}"));
        }
        match self {
            // It makes each site's gateway durable when the site is registered, filtered on that
            // site's jobs (the server holds the body's filter to the subject's).
            Role::Orchestrator => {
                // The order check reads the commands of a scope that came before one.
                p.publish.extend(getter(names::COMMANDS_STREAM));
                // The dispatcher hands each job to its site, and hears the site's answer among
                // the site's own subjects (`runtime::dispatch`).
                p.publish.push(names::site_deliver("*"));
                p.subscribe.push(names::replies_from_sites(&inbox(public_key)));
                for shard in 0..names::JOB_SHARDS {
                    let jobs = names::jobs_stream(shard);
                    p.publish.push(js_api(&format!("CONSUMER.INFO.{jobs}.*")));
                    // A job its site's durable holds nothing of is looked at, by the time it was
                    // stored.
                    p.publish.push(js_api(&format!("STREAM.MSG.GET.{jobs}")));
                    // A durable of a shard takes only that shard's jobs.
                    p.publish.push(js_api(&format!("CONSUMER.CREATE.{jobs}.*.{}", names::shard_jobs(shard))));
                    // Removing a site deletes its gateway's durable and drops its jobs.
                    // (Only gateways and the dispatcher have durables on the jobs streams.)
                    p.publish.push(js_api(&format!("CONSUMER.DELETE.{jobs}.*")));
                    // The dispatcher: its own durable, and the sites' it replaces, listed.
                    p.publish.extend(durable_consumer(jobs, names::DISPATCHER));
                    p.publish.push(js_api(&format!("CONSUMER.NAMES.{jobs}")));
                    p.publish.push(js_api(&format!("STREAM.PURGE.{jobs}")));
                }
                // The store watch reads how far behind each durable of the commands and events is
                // (`landfall_consumer_pending`).
                for stream in [names::COMMANDS_STREAM, names::EVENTS_STREAM] {
                    p.publish.push(js_api(&format!("CONSUMER.LIST.{stream}")));
                }
                // Moving an earlier version's jobs into the shards: its stream's jobs and
                // durables are read, kept aside until each is in its shard, and both streams
                // deleted.
                let (legacy, moving) = (names::LEGACY_JOBS_STREAM, names::MOVING_JOBS_STREAM);
                p.publish.extend([
                    js_api(&format!("CONSUMER.LIST.{legacy}")),
                    js_api(&format!("STREAM.MSG.GET.{legacy}")),
                    js_api(&format!("STREAM.DELETE.{legacy}")),
                    js_api(&format!("STREAM.INFO.{moving}")),
                    js_api(&format!("STREAM.CREATE.{moving}")),
                    js_api(&format!("STREAM.MSG.GET.{moving}")),
                    js_api(&format!("STREAM.DELETE.{moving}")),
                    names::MOVING_JOBS_ALL.to_string(),
                    // What it held that is no job, filed where operators look.
                    names::dead_letter_subject(names::JOBS_MOVE),
                ]);
                // Compaction sweeps the markers deletions leave in the buckets it owns.
                for bucket in [names::SAGAS_BUCKET, names::SITES_BUCKET] {
                    p.publish.push(js_api(&format!("STREAM.PURGE.{}", kv_stream(bucket))));
                }
            }
            Role::Observer => {
                p.publish.push(js_api(&format!("STREAM.PURGE.{}", kv_stream(names::OBSERVED_BUCKET))));
                // Every site's heartbeat (see `consumers::links`).
                p.subscribe.push(names::site_alive("*"));
            }
            Role::Kubeconfig => {
                p.publish.push(names::kubeconfig_rpc("*"));
                p.subscribe.push(names::replies_from_sites(&inbox(public_key)));
                p.subscribe.extend(
                    [names::svc_every_site(names::BMC_CREDENTIALS)]
                        .into_iter()
                        .chain(names::ADMIN_SUBJECTS.iter().map(|s| s.to_string())),
                );
                p.allow_responses = true;
            }
            Role::Distribution => {
                p.subscribe.extend(
                    [names::ARTIFACT_PLAN, names::ARTIFACT_CHUNK, names::CHART_RENDER].map(names::svc_every_site),
                );
                p.allow_responses = true;
            }
            Role::Identity => {
                p.subscribe.extend([
                    names::AUTH_CALLOUT.to_string(),
                    names::IDENTITY_ALL.to_string(),
                    names::svc_every_site(names::IDENTITY_RENEW),
                ]);
                p.allow_responses = true;
            }
            // Requests to join and identities, decided by the API's operators.
            Role::Api => p.publish.push(names::IDENTITY_ADMIN.to_string()),
            _ => {}
        }
        p
    }
}

impl Role {
    /// The party of the table of kinds (`trust::RULES`) this user sends as.
    fn party(&self) -> Option<Party> {
        Some(match self {
            Role::Orchestrator => Party::Orchestrator,
            Role::Observer => Party::Observer,
            Role::Kubeconfig => Party::Kubeconfig,
            Role::Distribution => Party::Distribution,
            Role::Api => Party::Api,
            Role::Operator => Party::Operator,
            Role::Site(_) => Party::Site,
            Role::Identity => return None,
        })
    }
}

/// The subjects a hub service sending as `party` may publish on, from the table of kinds: each
/// command, job, event and request kind it sends, at every site. Requests to sites and
/// operators' requests are answered, not published into the streams, and travel as core
/// requests: a party that sends them gets their subjects too.
fn sends(party: Party) -> Vec<String> {
    let mut out: Vec<String> = trust::sent_by(party)
        .map(|r| match r.channel {
            Channel::Command if r.site_fields.is_empty() => names::command_subject(r.kind, names::FLEET),
            Channel::Command => names::command_subject(r.kind, "*"),
            Channel::Job => names::jobs_of_kind(r.kind),
            Channel::Event if r.site_fields.is_empty() && !pb::rejection::in_answered_scope(r.kind) => {
                names::event_subject(names::FLEET, r.aggregate, r.kind)
            }
            Channel::Event => names::event_subject("*", r.aggregate, r.kind),
            Channel::Service => format!("landfall.svc.*.{}", r.kind),
            Channel::SiteRpc => names::site_rpc("*", r.kind),
            Channel::Admin => format!("landfall.admin.{}", r.kind),
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// A JetStream API subject, e.g. `$JS.API.STREAM.INFO.LANDFALL_JOBS_07`.
fn js_api(rest: &str) -> String {
    format!("$JS.API.{rest}")
}

/// The same request through a JetStream domain (`$JS.<domain>.API.…`).
fn in_domain(subject: &str, domain: &str) -> String {
    subject.replacen("$JS.API.", &format!("$JS.{domain}.API."), 1)
}

/// What running one durable consumer of its own takes: creating it (the create subject names
/// it; with one filter, the filter follows the name), its info, fetching and acknowledging.
/// Not the legacy `CONSUMER.DURABLE.CREATE`, and not deleting it.
fn durable_consumer(stream: &str, durable: &str) -> Vec<String> {
    vec![
        js_api(&format!("CONSUMER.CREATE.{stream}.{durable}")),
        js_api(&format!("CONSUMER.CREATE.{stream}.{durable}.>")),
        js_api(&format!("CONSUMER.INFO.{stream}.{durable}")),
        js_api(&format!("CONSUMER.MSG.NEXT.{stream}.{durable}")),
        format!("$JS.ACK.{stream}.{durable}.>"),
    ]
}

/// What reading a stream with consumers of one's own making takes (ordered readers, KV watches
/// and scans, whose names the client or the server makes up): creating them, their info,
/// fetching, flow control, and deleting the one an ordered reader replaces. Consumer names
/// cannot be held to a pattern, so the names of other services' durables are refused apart
/// ([`others_durables`]). The unnamed create (`CONSUMER.CREATE.<stream>`) carries the name in
/// its body, where no permission can see it, so it is allowed only on streams that hold no
/// durable consumer: the buckets' (a KV watch makes its consumer that way).
fn own_consumers(stream: &str) -> Vec<String> {
    let mut out = vec![
        js_api(&format!("CONSUMER.CREATE.{stream}.*")),
        js_api(&format!("CONSUMER.CREATE.{stream}.*.>")),
        js_api(&format!("CONSUMER.INFO.{stream}.*")),
        js_api(&format!("CONSUMER.MSG.NEXT.{stream}.*")),
        js_api(&format!("CONSUMER.DELETE.{stream}.*")),
        format!("$JS.FC.{stream}.>"),
    ];
    if durables_on(stream).next().is_none() {
        out.push(js_api(&format!("CONSUMER.CREATE.{stream}")));
    }
    out
}

/// Every hub service's durable consumer on `stream`.
fn durables_on(stream: &str) -> impl Iterator<Item = (Role, &'static str)> + '_ {
    Role::services().into_iter().flat_map(move |role| {
        role.durables().iter().filter(|(s, _)| *s == stream).map(move |(_, d)| (role.clone(), *d)).collect::<Vec<_>>()
    })
}

/// The other services' durables on `stream`, which `role` may not create, change, fetch from
/// or delete, though it makes consumers of its own there.
fn others_durables(role: &Role, stream: &str) -> Vec<String> {
    durables_on(stream)
        .filter(|(owner, _)| owner != role)
        .flat_map(|(_, durable)| {
            [
                js_api(&format!("CONSUMER.CREATE.{stream}.{durable}")),
                js_api(&format!("CONSUMER.CREATE.{stream}.{durable}.>")),
                js_api(&format!("CONSUMER.MSG.NEXT.{stream}.{durable}")),
                js_api(&format!("CONSUMER.DELETE.{stream}.{durable}")),
            ]
        })
        .collect()
}

/// Getting messages by sequence or subject (a KV get).
fn getter(stream: &str) -> Vec<String> {
    vec![
        js_api(&format!("STREAM.MSG.GET.{stream}")),
        js_api(&format!("DIRECT.GET.{stream}")),
        js_api(&format!("DIRECT.GET.{stream}.>")),
    ]
}

/// What a site's link key may do once the identity service let it in: the site's permissions
/// ([`Role::Site`]), asking for new link credentials among them.
pub fn site_link(site: &str) -> Permissions {
    site_permissions(site, HUB_DOMAIN)
}

/// A site's permissions at a hub whose JetStream domain is `domain` (a regional hub's,
/// [`region_domain`]): the same eight grants, its leaf node's requests to the hub named in that
/// domain.
pub fn site_in_domain(site: &str, domain: &str) -> Permissions {
    site_permissions(site, domain)
}

/// What a relay's link to the hub may carry: what any site may do (a site's grants with every
/// site's id a wildcard), and nothing else. A relay lets each of its sites in as the site's own
/// user, held to that site's grants where it connects; the hub holds the link to the shape of
/// those grants. Not to its own sites' grants, one by one: nats-server (2.15) checks every
/// message a leaf link sends against its allow list one entry at a time, so a list that grows
/// with the sites costs the hub in proportion on every message (three quarters of its CPU with
/// 10,000 sites' grants on each of three links). A relay's key therefore speaks for any site:
/// it is the hub's, kept where the hub's servers are, never at a site.
///
/// A site's commands and events are granted as the whole channel less the hub's origin: the
/// hub tells a leaf link of a stream's interest (`landfall.evt.>`) only when that subject
/// covers one of the link's grants, and nats-server (2.15) finds no grant with a wildcard for
/// the site in the middle (`landfall.evt.*.gateway.>`), so such a link would never forward a
/// report.
pub fn relay_link(domain: &str) -> Permissions {
    let mut p = site_permissions("*", domain);
    for (channel, all) in [("cmd", names::COMMANDS_ALL), ("evt", names::EVENTS_ALL)] {
        let own = names::sent_by_gateway(channel, "*");
        p.publish.retain(|s| *s != own);
        p.publish.push(all.to_string());
        p.publish_deny.push(format!("landfall.{channel}.*.{}.>", names::Origin::Hub.token()));
    }
    // A site acknowledges its jobs on its own durable in its own shard; the link, on any
    // consumer of the jobs streams (every site's durable), and on no other stream's.
    let own = format!("$JS.*.{}.{}.>", names::site_jobs_stream("*"), names::gateway_consumer("*"));
    p.publish.retain(|s| *s != own);
    p.publish.extend(names::jobs_streams().map(|stream| format!("$JS.*.{stream}.*.>")));
    p
}

/// What a site's identity key may do on its own connection: ask for new link credentials (a
/// site cut off past its link credentials' expiry), nothing else.
pub fn site_renewal(site: &str) -> Permissions {
    Permissions {
        publish: vec![names::identity_renew(site)],
        subscribe: vec![format!("{}.>", names::site_inbox(site))],
        ..Default::default()
    }
}

/// What a bootstrap credential lets a gateway holding `key` do: ask to join, nothing else.
pub fn enrollment(key: &str) -> Permissions {
    Permissions {
        publish: vec![names::identity_enroll(key)],
        subscribe: vec![format!("{}.>", inbox(key))],
        ..Default::default()
    }
}

/// A site's permissions: eight wildcards, each naming the site. The server holds a site to its
/// own subjects; `trust::check` holds what it sends there to the kinds a site sends, about its
/// own site, and the consumers that keep the jobs' records hold its reports to the jobs the hub
/// sent it.
fn site_permissions(site: &str, domain: &str) -> Permissions {
    let durable = names::gateway_consumer(site);
    let jobs = names::site_jobs_stream(site);
    let design =
        format!("DIRECT.GET.{}.$KV.{}.{}", kv_stream(names::SITES_BUCKET), names::SITES_BUCKET, keys::site(site));
    // The hub's JetStream API: the hub checks a client's request to its own domain
    // (`$JS.<domain>.API.…`) as `$JS.API.…`, and one crossing a leaf node's link as it came.
    let hub_api = |rest: String| js_api(&rest);
    Permissions {
        publish: vec![
            // Its commands (hosts arriving and leaving) and its reports.
            names::sent_by_gateway("cmd", site),
            names::sent_by_gateway("evt", site),
            // Its requests of the hub's services, and its answers to the hub's requests.
            names::site_services(site),
            // Acknowledging its own jobs, and answering its durable's flow control, which
            // paces deliveries over a slow link (`$JS.ACK.…` and `$JS.FC.…`).
            format!("$JS.*.{jobs}.{durable}.>"),
            // The last report stored of a subject of its own: what its outbox at its leaf node
            // had forwarded before the forwarder stopped.
            in_domain(
                &hub_api(format!("DIRECT.GET.{}.{}", names::EVENTS_STREAM, names::sent_by_gateway("evt", site))),
                domain,
            ),
            // A simulated site is built from the site's design, and only its own, directly or
            // through its leaf node.
            hub_api(design.clone()),
            in_domain(&hub_api(design), domain),
        ],
        // Its jobs, the hub's requests and the answers to its own.
        subscribe: vec![names::to_site(site)],
        // Its answers to the hub's requests go to its own subjects, directly or across its
        // leaf node's link alike.
        publish_deny: Vec::new(),
        allow_responses: false,
    }
}

#[cfg(test)]
mod tests;
