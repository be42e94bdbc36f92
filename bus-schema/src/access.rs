//! Who may do what on the bus: the NATS permissions of each service's user and of each site.
//!
//! A site is the least trusted party: its gateway (and its leaf node's link to the hub, which
//! carries the same user) may consume its own jobs, publish its own events, announce hosts
//! arriving or leaving at its own site, and ask the hub's services about its own site. Nothing
//! else: not another site's jobs, not another command, not the key-value buckets beyond its own
//! design. Hub services get what their role needs, on landfall's streams and buckets only.
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

/// A NATS user's permissions, as a server's configuration lists them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Permissions {
    pub publish: Vec<String>,
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
            Role::Site(site) => format!("site-{site}"),
        }
    }

    /// The hub services, each a user of its own.
    pub fn services() -> [Role; 6] {
        [Role::Orchestrator, Role::Observer, Role::Kubeconfig, Role::Distribution, Role::Api, Role::Operator]
    }

    /// What the user with `public_key` may do. A site may answer the requests of the users
    /// with the keys `site_requesters` (the kubeconfig collector, operators): a reply across a
    /// leaf node's link needs a permission of its own, as the link is not a client that
    /// received the request.
    pub fn permissions(&self, public_key: &str, site_requesters: &[String]) -> Permissions {
        let mut p = Permissions { subscribe: vec![format!("{}.>", inbox(public_key))], ..Default::default() };
        let all_streams = [names::COMMANDS_STREAM, names::JOBS_STREAM, names::EVENTS_STREAM];
        match self {
            Role::Site(site) => return site_permissions(site, p, site_requesters),
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
                return p;
            }
            _ => {}
        }
        // Every hub service makes sure the streams and buckets exist when it starts.
        p.publish.push(js_api("INFO"));
        for stream in all_streams.iter().map(|s| s.to_string()).chain(names::ALL_BUCKETS.iter().map(|b| kv_stream(b))) {
            p.publish.push(js_api(&format!("STREAM.INFO.{stream}")));
            p.publish.push(js_api(&format!("STREAM.CREATE.{stream}")));
        }
        // What the table of kinds (`trust::RULES`) says the role sends, and nothing else.
        p.publish.extend(self.party().map(|party| sends(party, "*")).unwrap_or_default());
        let (streams, buckets): (&[&str], &[&str]) = match self {
            Role::Orchestrator => (
                &[names::COMMANDS_STREAM, names::EVENTS_STREAM],
                &[names::SITES_BUCKET, names::PACKAGES_BUCKET, names::OBSERVED_BUCKET, names::SAGAS_BUCKET],
            ),
            // The sagas and rollouts: a site's report counts only as the answer to their jobs.
            Role::Observer => {
                (&[names::EVENTS_STREAM], &[names::OBSERVED_BUCKET, names::PACKAGES_BUCKET, names::SAGAS_BUCKET])
            }
            Role::Kubeconfig => {
                (&[names::EVENTS_STREAM], &[names::KUBECONFIGS_BUCKET, names::SAGAS_BUCKET, names::SITES_BUCKET])
            }
            Role::Distribution => (&[], &[names::PACKAGES_BUCKET]),
            Role::Api => (
                &[names::EVENTS_STREAM, names::COMMANDS_STREAM],
                &[names::SITES_BUCKET, names::PACKAGES_BUCKET, names::OBSERVED_BUCKET, names::SAGAS_BUCKET],
            ),
            Role::Operator | Role::Site(_) => unreachable!("handled above"),
        };
        for stream in streams.iter().map(|s| s.to_string()).chain(buckets.iter().map(|b| kv_stream(b))) {
            p.publish.extend(reader(&stream));
        }
        for bucket in buckets {
            p.publish.push(format!("$KV.{bucket}.>"));
        }
        match self {
            Role::Kubeconfig => {
                p.publish.push(names::kubeconfig_rpc("*"));
                p.subscribe.extend(
                    [names::svc_every_site(names::BMC_CREDENTIALS)]
                        .into_iter()
                        .chain(names::ADMIN_SUBJECTS.iter().map(|s| s.to_string())),
                );
                p.allow_responses = true;
            }
            Role::Distribution => {
                p.subscribe.extend([names::ARTIFACT_PLAN, names::ARTIFACT_CHUNK].map(names::svc_every_site));
                p.allow_responses = true;
            }
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
        })
    }
}

/// The subjects `party` may publish on, from the table of kinds: each command, job, event and
/// request kind it sends, at `site` (`*` for a hub service, which speaks for every site).
/// Requests to sites and operators' requests are answered, not published into the streams, and
/// travel as core requests: a party that sends them gets their subjects too.
fn sends(party: Party, site: &str) -> Vec<String> {
    let mut out: Vec<String> = trust::sent_by(party)
        .map(|r| match r.channel {
            Channel::Command if r.site_fields.is_empty() => names::command_subject(r.kind, names::FLEET),
            Channel::Command => names::command_subject(r.kind, site),
            Channel::Job => names::job_subject(site, r.kind),
            Channel::Event if r.site_fields.is_empty() && r.kind != pb::rejection::KIND => {
                names::event_subject(names::FLEET, r.aggregate, r.kind)
            }
            Channel::Event => names::event_subject(site, r.aggregate, r.kind),
            Channel::Service => format!("landfall.svc.{site}.{}", r.kind),
            Channel::SiteRpc => format!("landfall.rpc.{site}.{}", r.kind),
            Channel::Admin => format!("landfall.admin.{}", r.kind),
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// A JetStream API subject, e.g. `$JS.API.STREAM.INFO.LANDFALL_JOBS`.
fn js_api(rest: &str) -> String {
    format!("$JS.API.{rest}")
}

/// The same request through a JetStream domain (`$JS.<domain>.API.…`).
fn in_domain(subject: &str, domain: &str) -> String {
    subject.replacen("$JS.API.", &format!("$JS.{domain}.API."), 1)
}

/// What reading a stream takes: its consumers (durable or not), fetching, acknowledging,
/// flow control, and getting messages by sequence or subject.
fn reader(stream: &str) -> Vec<String> {
    vec![
        js_api(&format!("CONSUMER.*.{stream}")),
        js_api(&format!("CONSUMER.*.{stream}.>")),
        js_api(&format!("CONSUMER.MSG.NEXT.{stream}.*")),
        js_api(&format!("CONSUMER.DURABLE.CREATE.{stream}.*")),
        js_api(&format!("STREAM.MSG.GET.{stream}")),
        js_api(&format!("DIRECT.GET.{stream}")),
        js_api(&format!("DIRECT.GET.{stream}.>")),
        format!("$JS.ACK.{stream}.>"),
        format!("$JS.FC.{stream}.>"),
    ]
}

fn site_permissions(site: &str, mut p: Permissions, requesters: &[String]) -> Permissions {
    let durable = names::gateway_consumer(site);
    let jobs = names::JOBS_STREAM;
    let sites = kv_stream(names::SITES_BUCKET);
    let api = [
        js_api("INFO"),
        js_api(&format!("STREAM.INFO.{jobs}")),
        js_api(&format!("CONSUMER.INFO.{jobs}.{durable}")),
        js_api(&format!("CONSUMER.CREATE.{jobs}.{durable}")),
        js_api(&format!("CONSUMER.CREATE.{jobs}.{durable}.>")),
        js_api(&format!("CONSUMER.DURABLE.CREATE.{jobs}.{durable}")),
        js_api(&format!("CONSUMER.MSG.NEXT.{jobs}.{durable}")),
        // A simulated site is built from the site's design, and only its own.
        js_api(&format!("STREAM.INFO.{sites}")),
        js_api(&format!("DIRECT.GET.{sites}.$KV.{}.{}", names::SITES_BUCKET, keys::site(site))),
    ];
    p.publish.extend(api.iter().cloned());
    p.publish.extend(api.iter().map(|s| in_domain(s, HUB_DOMAIN)));
    p.publish.push(format!("$JS.ACK.{jobs}.{durable}.>"));
    // Only the kinds a gateway sends (host changes, its reports, its requests), on its own site.
    p.publish.extend(sends(Party::Site, site));
    p.publish.extend(requesters.iter().map(|key| format!("{}.>", inbox(key))));
    p.subscribe.push(names::site_rpcs(site));
    p.allow_responses = true;
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NATS subject matching, enough to check the lists: `*` one token, `>` the rest.
    fn matches(pattern: &str, subject: &str) -> bool {
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

    fn allows(list: &[String], subject: &str) -> bool {
        list.iter().any(|p| matches(p, subject))
    }

    #[test]
    fn a_site_reaches_its_own_work_and_nothing_of_another_site() {
        let p = Role::Site("edge-01".into()).permissions("UKEY", &["UKC".into()]);
        for ok in [
            "landfall.evt.edge-01.node.os_provisioned",
            "landfall.cmd.node_added.edge-01",
            "landfall.svc.edge-01.artifact_chunk",
            "$JS.API.CONSUMER.MSG.NEXT.LANDFALL_JOBS.gateway-edge-01",
            "$JS.hub.API.CONSUMER.MSG.NEXT.LANDFALL_JOBS.gateway-edge-01",
            "$JS.ACK.LANDFALL_JOBS.gateway-edge-01.1.2.3.4.5",
            "_INBOX_UKC.reply.1",
        ] {
            assert!(allows(&p.publish, ok), "{ok}");
        }
        for denied in [
            "landfall.evt.edge-02.node.os_provisioned",
            "landfall.evt.fleet.rollout.completed",
            "landfall.cmd.install_site.edge-01",
            "landfall.cmd.node_added.edge-02",
            "landfall.cmd.patch_package.fleet",
            "landfall.job.edge-01.provision_os",
            "landfall.svc.edge-02.bmc_credentials",
            "$JS.API.CONSUMER.MSG.NEXT.LANDFALL_JOBS.gateway-edge-02",
            "$JS.API.CONSUMER.CREATE.LANDFALL_JOBS.gateway-edge-02.landfall.job.edge-02.>",
            "$JS.API.STREAM.DELETE.LANDFALL_JOBS",
            "$JS.API.DIRECT.GET.KV_landfall-sites.$KV.landfall-sites.site.edge-02",
            "$JS.API.DIRECT.GET.KV_landfall-kubeconfigs.$KV.landfall-kubeconfigs.kubeconfig.edge-01",
            "$KV.landfall-sites.site.edge-01",
            "$JS.ACK.LANDFALL_JOBS.gateway-edge-02.1.2.3.4.5",
            "_INBOX_UAPI.reply.1",
        ] {
            assert!(!allows(&p.publish, denied), "{denied}");
        }
        assert!(allows(&p.subscribe, "_INBOX_UKEY.abc.1"));
        assert!(allows(&p.subscribe, "landfall.rpc.edge-01.kubeconfig"));
        for denied in [
            "_INBOX.abc",
            "_INBOX_UOTHER.abc",
            "landfall.job.edge-02.provision_os",
            "landfall.rpc.edge-02.kubeconfig",
            ">",
        ] {
            assert!(!allows(&p.subscribe, denied), "{denied}");
        }
    }

    #[test]
    fn hub_services_keep_to_their_role() {
        let api = Role::Api.permissions("UAPI", &[]);
        assert!(allows(&api.publish, "landfall.cmd.install_site.edge-01"));
        assert!(!allows(&api.publish, "landfall.job.edge-01.provision_os"));
        assert!(!allows(&api.publish, "$JS.API.DIRECT.GET.KV_landfall-kubeconfigs.$KV.landfall-kubeconfigs.x"));
        let observer = Role::Observer.permissions("UOBS", &[]);
        assert!(!allows(&observer.publish, "landfall.cmd.install_site.edge-01"));
        assert!(allows(&observer.publish, "$KV.landfall-observed.node.edge-01.m-1.kubelet"));
        assert!(!allows(&observer.publish, "$KV.landfall-sites.site.edge-01"));
        let orchestrator = Role::Orchestrator.permissions("UORC", &[]);
        assert!(allows(&orchestrator.publish, "landfall.job.edge-01.provision_os"));
        assert!(!allows(&orchestrator.publish, "$JS.API.STREAM.DELETE.LANDFALL_JOBS"));
        let kubeconfig = Role::Kubeconfig.permissions("UKC", &[]);
        assert!(allows(&kubeconfig.subscribe, names::KUBECONFIG_GET_ADMIN));
        assert!(allows(&kubeconfig.publish, "$KV.landfall-kubeconfigs.kubeconfig.edge-01"));
        for role in Role::services() {
            assert!(!allows(&role.permissions("U", &[]).subscribe, "_INBOX.x"), "{role:?}");
        }
    }
}
