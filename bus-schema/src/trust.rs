//! Who may send each message, and what it may say: the one table every check is derived from.
//!
//! A site's NATS user may publish only on its own site's subjects, commands and events among them
//! only those whose origin token says a gateway sent them, and that is all the server checks. So
//! a message a gateway sent must be of a kind a site sends ([`check`]), the site its subject names
//! is the only site it may speak for: every field that names a site must name that one, and a
//! state-changing report from a site counts only as the answer to a job the hub sent that site
//! ([`Rule::answers`]; the consumer that keeps the job's record checks the job's id, nodes and
//! rollout). The same table says which parties may publish each kind (`access` gives each hub
//! service's NATS user exactly those subjects).
//!
//! A message kind missing from [`RULES`] is refused by [`check`]; the tests below fail for a
//! kind of the contract that has no row, and run every row's site fields against a forgery.

use crate::names::{self, Origin, ParsedSubject};
use crate::pb::{self, BusCommand, BusEvent, BusJob, BusMessage};

/// The parties that publish on the bus (each a NATS user of its own in production).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Party {
    /// People and their tools: the CLI, `landfall up`.
    Operator,
    /// The HTTP API, publishing commands for its users.
    Api,
    Orchestrator,
    Observer,
    /// The kubeconfig collector and the secrets service.
    Kubeconfig,
    Distribution,
    /// A site's gateway: the least trusted party.
    Site,
}

/// How a message travels, and so what its subject looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    /// `landfall.cmd.<scope>.<origin>.<kind>`, stored in `LANDFALL_COMMANDS`.
    Command,
    /// `landfall.job.<site>.<shard>.<kind>`, stored in the site's shard of the jobs
    /// (`LANDFALL_JOBS_00` … `LANDFALL_JOBS_63`).
    Job,
    /// `landfall.evt.<scope>.<origin>.<aggregate>.<kind>`, stored in `LANDFALL_EVENTS`.
    Event,
    /// A site's core request to a hub service: `landfall.svc.<site>.<kind>`.
    Service,
    /// The hub's core request to a site: `landfall.to.<site>.rpc.<kind>`.
    SiteRpc,
    /// An operator's core request to the secrets service: `landfall.admin.<kind>`.
    Admin,
}

/// One message kind: who may send it and which of its fields must agree with its subject.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    /// The protobuf full name (the `Landfall-Type` header).
    pub type_name: &'static str,
    pub channel: Channel,
    /// An event's aggregate (`node` in `landfall.evt.<site>.gateway.node.os_provisioned`); empty for
    /// other channels.
    pub aggregate: &'static str,
    /// The kind as the subject spells it: `node_added`, `os_provisioned`, `artifact_plan`.
    pub kind: &'static str,
    pub senders: &'static [Party],
    /// Fields (dotted paths into the message) that must name the subject's site.
    pub site_fields: &'static [&'static str],
    /// For a site's state-changing report: the kinds of job it may answer. Such a report is
    /// accepted only with the id of a job of one of these kinds that the hub sent that site
    /// (its causation), and only for that job's nodes and rollout.
    pub answers: &'static [&'static str],
}

impl Rule {
    pub fn allows(&self, party: Party) -> bool {
        self.senders.contains(&party)
    }
}

/// Why a message was refused, for its `REJECT_CODE_FORBIDDEN` rejection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Forbidden(pub String);

use Party::{Api, Kubeconfig, Observer, Operator, Orchestrator, Site};

const PEOPLE: &[Party] = &[Operator, Api];
const PEOPLE_AND_SITES: &[Party] = &[Site, Operator, Api];
const HUB: &[Party] = &[Orchestrator];
/// What only the HTTP API says: a second person's decision on a command it holds.
const API: &[Party] = &[Api];
const SITE: &[Party] = &[Site];
/// Any consumer of events or jobs may reject what it was given; a gateway rejects jobs it cannot
/// read. Only the orchestrator consumes commands.
const CONSUMERS: &[Party] = &[Orchestrator, Observer, Kubeconfig, Site];
/// The hub's consumers: they file what they give up on as dead letters (a site files none).
const HUB_CONSUMERS: &[Party] = &[Orchestrator, Observer, Kubeconfig];

/// A row's subject kind, `(aggregate, kind)`: what the message type says for commands, jobs and
/// events, or as the row gives it.
macro_rules! subject_kind {
    (Command $ty:ident) => {
        ("", <pb::$ty as BusCommand>::KIND)
    };
    (Job $ty:ident) => {
        ("", <pb::$ty as BusJob>::KIND)
    };
    (Event $ty:ident) => {
        (<pb::$ty as BusEvent>::AGGREGATE, <pb::$ty as BusEvent>::KIND)
    };
    ($channel:ident $ty:ident [$agg:expr, $kind:expr]) => {
        ($agg, $kind)
    };
}

macro_rules! rules {
    ($($channel:ident $ty:ident $([$agg:expr, $kind:expr])? from $senders:expr, sites [$($field:literal),*] $(, answers [$($job:expr),*])?;)*) => {
        /// Every message kind that travels as a command, job, event or request.
        pub const RULES: &[Rule] = &[$(Rule {
            type_name: <pb::$ty as BusMessage>::TYPE,
            channel: Channel::$channel,
            aggregate: subject_kind!($channel $ty $([$agg, $kind])?).0,
            kind: subject_kind!($channel $ty $([$agg, $kind])?).1,
            senders: $senders,
            site_fields: &[$($field),*],
            answers: &[$($($job),*)?],
        }),*];

        /// The message of type `type_name` read from JSON and encoded (for the table's tests and
        /// for tools that build a message by its name).
        pub fn encode_json(type_name: &str, json: serde_json::Value) -> Option<Result<Vec<u8>, serde_json::Error>> {
            match type_name {
                $(<pb::$ty as BusMessage>::TYPE => Some(
                    serde_json::from_value::<pb::$ty>(json).map(|m| prost::Message::encode_to_vec(&m)),
                ),)*
                _ => None,
            }
        }

        /// [`check`] for a payload of the type `type_name` (`None`: not a type of [`RULES`]).
        pub fn check_payload(subject: &str, type_name: &str, payload: &[u8]) -> Option<Result<(), Forbidden>> {
            match type_name {
                $(<pb::$ty as BusMessage>::TYPE => Some(
                    <pb::$ty as prost::Message>::decode(payload)
                        .map_err(|e| Forbidden(format!("payload is not a valid {type_name}: {e}")))
                        .and_then(|m| check(subject, &m)),
                ),)*
                _ => None,
            }
        }
    };
}

rules! {
    Command RegisterSite from PEOPLE, sites ["design.site_id"];
    Command InstallSite from PEOPLE, sites ["site_id"];
    Command ApplyDesign from PEOPLE, sites ["site_id"];
    Command StageSite from PEOPLE, sites ["site_id"];
    Command NodeAdded from PEOPLE_AND_SITES, sites ["site_id"];
    Command NodeRemoved from PEOPLE_AND_SITES, sites ["site_id"];
    Command RemoveSite from PEOPLE, sites ["site_id"];
    Command RemoveNode from PEOPLE, sites ["site_id"];
    Command ReprovisionNode from PEOPLE, sites ["site_id"];
    Command DecommissionSite from PEOPLE, sites ["site_id"];
    Command RegisterPackage from PEOPLE, sites [];
    Command PatchPackage from &[Operator, Api, Orchestrator], sites [];
    Command PauseRollout from PEOPLE, sites [];
    Command ResumeRollout from PEOPLE, sites [];
    Command CancelRollout from PEOPLE, sites [];
    // From people, and from the orchestrator when a rollout that says so crosses its threshold.
    Command RollbackRollout from &[Operator, Api, Orchestrator], sites [];

    Job StageArtifacts from HUB, sites ["site_id"];
    Job ProvisionOs from HUB, sites ["site_id"];
    Job InstallBinaries from HUB, sites ["site_id"];
    Job ApplyContainerPackages from HUB, sites ["site_id"];
    Job PatchNodes from HUB, sites ["site_id"];
    Job RetireNode from HUB, sites ["site_id"];
    Job TearDownSite from HUB, sites ["site_id"];

    Event SiteRegistered from HUB, sites ["site_id"];
    Event ApprovalRequested from API, sites ["site_id"];
    Event CommandApproved from API, sites ["site_id"];
    Event ApprovalRefused from API, sites ["site_id"];
    Event DesignApplied from HUB, sites ["site_id"];
    Event SiteInstallStarted from HUB, sites ["site_id"];
    Event SiteInstalled from HUB, sites ["site_id"];
    Event SiteInstallFailed from HUB, sites ["site_id"];
    Event NodeAccepted from HUB, sites ["site_id"];
    Event NodeLeft from HUB, sites ["site_id"];
    Event SiteRemoved from HUB, sites ["site_id"];
    Event NodeReady from HUB, sites ["site_id"];
    Event NodeJoinFailed from HUB, sites ["site_id"];
    Event SiteDecommissioned from HUB, sites ["site_id"];
    Event LifecycleFailed from HUB, sites ["site_id"];
    Event KubeconfigStored from &[Kubeconfig], sites ["site_id"];
    Event BmcCredentialsStored from &[Kubeconfig], sites ["site_id"];
    Event SiteCutOff from &[Observer], sites ["site_id"];
    Event SiteLinkRestored from &[Observer], sites ["site_id"];

    Event ArtifactsStaged from SITE, sites ["site_id"],
        answers [pb::StageArtifacts::KIND];
    Event NodeOsProvisioning from SITE, sites ["site_id"],
        answers [pb::ProvisionOs::KIND, pb::PatchNodes::KIND, pb::RetireNode::KIND, pb::TearDownSite::KIND];
    Event NodeOsProvisioned from SITE, sites ["site_id"],
        answers [pb::ProvisionOs::KIND];
    Event NodeFailed from SITE, sites ["site_id"],
        answers [pb::ProvisionOs::KIND, pb::InstallBinaries::KIND];
    Event NodeBinariesInstalled from SITE, sites ["site_id"],
        answers [pb::InstallBinaries::KIND];
    Event ClusterReady from SITE, sites ["site_id"],
        answers [pb::InstallBinaries::KIND];
    Event ContainerPackagesApplied from SITE, sites ["site_id"],
        answers [pb::ApplyContainerPackages::KIND];
    Event JobFailed from SITE, sites ["site_id"],
        answers [pb::StageArtifacts::KIND, pb::ProvisionOs::KIND, pb::InstallBinaries::KIND,
                 pb::ApplyContainerPackages::KIND, pb::PatchNodes::KIND, pb::RetireNode::KIND,
                 pb::TearDownSite::KIND];
    Event NodeCordoned from SITE, sites ["site_id"], answers [pb::PatchNodes::KIND, pb::RetireNode::KIND];
    Event NodeDrained from SITE, sites ["site_id"], answers [pb::PatchNodes::KIND, pb::RetireNode::KIND];
    Event NodeUncordoned from SITE, sites ["site_id"], answers [pb::PatchNodes::KIND, pb::RetireNode::KIND];
    Event NodeRetired from SITE, sites ["site_id"], answers [pb::RetireNode::KIND];
    Event SiteTornDown from SITE, sites ["site_id"], answers [pb::TearDownSite::KIND];
    Event NodePatched from SITE, sites ["site_id"], answers [pb::PatchNodes::KIND];
    Event NodePatchFailed from SITE, sites ["site_id"], answers [pb::PatchNodes::KIND];
    Event NodeRolledBack from SITE, sites ["site_id"], answers [pb::PatchNodes::KIND];
    Event NodeRollbackFailed from SITE, sites ["site_id"], answers [pb::PatchNodes::KIND];
    Event SitePatched from SITE, sites ["site_id", "nodes[].site_id"], answers [pb::PatchNodes::KIND];
    Event SiteDisagrees from SITE, sites ["site_id"], answers [pb::PatchNodes::KIND];
    // Unasked (the gateway's periodic check) or asked by an operator's DriftCheck: it answers
    // no job and moves nothing at the hub.
    Event ChartDrifted from SITE, sites ["site_id"];

    Event PackageRegistered from HUB, sites [];
    Event RolloutPlanned from HUB, sites [];
    Event RolloutWaveStarted from HUB, sites [];
    Event RolloutProgress from HUB, sites [];
    Event RolloutHalted from HUB, sites [];
    Event RolloutPaused from HUB, sites [];
    Event RolloutResumed from HUB, sites [];
    Event RolloutCancelled from HUB, sites [];
    Event RolloutCompleted from HUB, sites [];
    Event SecretKeyRotated from &[Kubeconfig], sites [];
    Event StoreFull from &[Orchestrator], sites [];
    Event StoreRoomAgain from &[Orchestrator], sites [];
    Event CommandRejected [pb::rejection::COMMAND_AGGREGATE, pb::rejection::KIND] from HUB, sites [];
    Event MessageRejected [pb::rejection::MESSAGE_AGGREGATE, pb::rejection::KIND] from CONSUMERS, sites [];
    Event MessageDeadLettered [pb::rejection::MESSAGE_AGGREGATE, pb::rejection::DEAD_LETTERED_KIND]
        from HUB_CONSUMERS, sites [];

    Service ArtifactPlanRequest ["", names::ARTIFACT_PLAN] from SITE, sites ["site_id"];
    Service ChunkRequest ["", names::ARTIFACT_CHUNK] from SITE, sites ["site_id"];
    Service BmcCredentialsRequest ["", names::BMC_CREDENTIALS] from SITE, sites ["site_id"];
    // An operator asks for a site's render as its gateway would (`landfall package render`).
    Service ChartRenderRequest ["", names::CHART_RENDER] from &[Site, Operator], sites ["site_id"];
    Service SiteAlive ["", names::SITE_ALIVE] from SITE, sites ["site_id"];

    SiteRpc KubeconfigRequest ["", names::KUBECONFIG_RPC] from &[Kubeconfig, Operator], sites ["site_id"];
    SiteRpc SimulateHostArrival ["", names::SIM_HOST_ARRIVAL_RPC] from &[Operator], sites ["site_id"];
    SiteRpc DriftCheck ["", names::DRIFT_CHECK_RPC] from &[Operator], sites ["site_id"];

    Admin KubeconfigGet ["", names::KUBECONFIG_GET] from &[Operator], sites [];
    Admin PutBmcCredentials ["", names::BMC_CREDENTIALS_PUT] from &[Operator], sites [];
    Admin RotateKey ["", names::ROTATE_KEY] from &[Operator], sites [];
}

/// The row of the message type `type_name`.
pub fn rule(type_name: &str) -> Option<&'static Rule> {
    RULES.iter().find(|r| r.type_name == type_name)
}

/// The rows that `party` may send.
pub fn sent_by(party: Party) -> impl Iterator<Item = &'static Rule> {
    RULES.iter().filter(move |r| r.allows(party))
}

impl Rule {
    /// The kind as the subject spells it: `node_added`, or `node.os_provisioned` for an event.
    pub fn subject_kind(&self) -> String {
        if self.aggregate.is_empty() { self.kind.to_string() } else { format!("{}.{}", self.aggregate, self.kind) }
    }
}

/// What a subject says of a message on it.
struct Parsed<'a> {
    channel: Channel,
    /// The site it speaks for (`None`: the fleet, or an operator's request).
    site: Option<&'a str>,
    /// Its kind as [`Rule::subject_kind`] spells it.
    kind: String,
    /// A site's gateway sent it: only a site's kinds may travel so. A site's requests of the
    /// hub's services are a site's by their channel.
    from_gateway: bool,
}

fn parse(subject: &str) -> Option<Parsed<'_>> {
    fn site(s: &str) -> Option<&str> {
        (s != names::FLEET).then_some(s)
    }
    let parsed = |channel, site, kind: String, from_gateway| Parsed { channel, site, kind, from_gateway };
    let gateway = |origin| origin == Origin::Gateway;
    Some(match names::parse_subject(subject)? {
        ParsedSubject::Command { kind, scope, origin } => {
            parsed(Channel::Command, site(scope), kind.to_string(), gateway(origin))
        }
        ParsedSubject::Job { site: s, kind } => parsed(Channel::Job, Some(s), kind.to_string(), false),
        ParsedSubject::Event { scope, origin, aggregate, kind } => {
            parsed(Channel::Event, site(scope), format!("{aggregate}.{kind}"), gateway(origin))
        }
        ParsedSubject::Service { site: s, kind } => parsed(Channel::Service, Some(s), kind.to_string(), false),
        ParsedSubject::Rpc { site: s, kind } => parsed(Channel::SiteRpc, Some(s), kind.to_string(), false),
        ParsedSubject::Admin { kind } => parsed(Channel::Admin, None, kind.to_string(), false),
    })
}

/// The row of the kind a subject names (`landfall.evt.edge-01.node.failed`: `NodeFailed`).
pub fn rule_for_subject(subject: &str) -> Option<&'static Rule> {
    let p = parse(subject)?;
    RULES.iter().find(|r| r.channel == p.channel && r.subject_kind() == p.kind)
}

/// Where messages of `type_name` travel when their usual sender sends them: a gateway's subjects
/// for a kind only sites send, the hub's for the others.
pub fn usual_origin(type_name: &str) -> Origin {
    match rule(type_name) {
        Some(r) if r.senders == [Party::Site] => Origin::Gateway,
        _ => Origin::Hub,
    }
}

/// The site the subject names, when it names one.
pub fn subject_site(subject: &str) -> Option<&str> {
    parse(subject).and_then(|p| p.site)
}

/// Checks a decoded message against the subject it came on: its kind is the subject's, a site
/// sends it when the subject says a gateway sent it, and every field [`Rule::site_fields`] names
/// holds the subject's site.
///
/// # Errors
/// [`Forbidden`], saying which field named which site.
pub fn check<M: BusMessage>(subject: &str, message: &M) -> Result<(), Forbidden> {
    let rule = rule(M::TYPE).ok_or_else(|| Forbidden(format!("{} is not a message anyone may send", M::TYPE)))?;
    let Parsed { channel, site, kind, from_gateway } =
        parse(subject).ok_or_else(|| Forbidden(format!("{subject} is not a subject a {} travels on", M::TYPE)))?;
    if channel != rule.channel || kind != rule.subject_kind() {
        return Err(Forbidden(format!("{subject} is not a subject a {} travels on", M::TYPE)));
    }
    if from_gateway && !rule.allows(Party::Site) {
        return Err(Forbidden(format!("a site's gateway sent {subject}, and only the hub sends a {}", M::TYPE)));
    }
    if rule.site_fields.is_empty() {
        // Fleet-wide commands and events travel in the fleet's scope; rejections and dead
        // letters' notices in the scope of what they answer.
        let rejection = pb::rejection::in_answered_scope(rule.kind);
        if matches!(channel, Channel::Command | Channel::Event) && !rejection && site.is_some() {
            return Err(Forbidden(format!("{} is fleet-wide, and {subject} names a site", M::TYPE)));
        }
        return Ok(());
    }
    let Some(site) = site else {
        return Err(Forbidden(format!("{} names a site, and {subject} names none", M::TYPE)));
    };
    let json = serde_json::to_value(message).map_err(|e| Forbidden(format!("{} cannot be read: {e}", M::TYPE)))?;
    for field in rule.site_fields {
        let parts: Vec<&str> = field.split('.').collect();
        for named in named_at(&json, &parts) {
            if named != site {
                return Err(Forbidden(format!(
                    "{} on {subject} speaks for site {site} only, and its {field} names {named:?}",
                    M::TYPE
                )));
            }
        }
    }
    Ok(())
}

/// What the field at `path` of `value` names: one string (empty when it is missing), or one per
/// element of a list, for a part written `name[]` (none for an empty list).
fn named_at<'v>(value: &'v serde_json::Value, path: &[&str]) -> Vec<&'v str> {
    let Some((part, rest)) = path.split_first() else {
        return vec![value.as_str().unwrap_or_default()];
    };
    match part.strip_suffix("[]") {
        Some(list) => {
            let items = value.get(list).and_then(|v| v.as_array()).map(Vec::as_slice).unwrap_or_default();
            items.iter().flat_map(|item| named_at(item, rest)).collect()
        }
        None => match value.get(part) {
            Some(v) => named_at(v, rest),
            None => vec![""],
        },
    }
}

/// Why a message stored under a site's gateway subjects cannot be what it says, when it cannot
/// ([`check`] of its payload, by its `Landfall-Type`): a kind only the hub sends, or one that
/// names another site. The hub's own subjects carry only what each hub user may send, and are
/// not looked at. Every consumer of the streams and every reader of events applies it before
/// anything else, whatever kinds it handles.
pub fn forged_by_a_gateway(subject: &str, type_name: &str, payload: &[u8]) -> Option<Forbidden> {
    let from_gateway = match names::parse_subject(subject) {
        Some(ParsedSubject::Event { origin, .. } | ParsedSubject::Command { origin, .. }) => origin == Origin::Gateway,
        _ => false,
    };
    if !from_gateway {
        return None;
    }
    match check_payload(subject, type_name, payload) {
        Some(Err(e)) => Some(e),
        None => Some(Forbidden(format!("{type_name:?} is not a message a site's gateway may send"))),
        Some(Ok(())) => None,
    }
}

/// Decodes a core request's payload as `M` and [`check`]s it against the subject it came on.
///
/// # Errors
/// The reason, for the refusal's `Landfall-Error` header: not an `M`, or forbidden.
pub fn decode_request<M: BusMessage>(subject: &str, payload: &[u8]) -> Result<M, String> {
    let message = M::decode(payload).map_err(|e| format!("not a {}: {e}", M::TYPE))?;
    check(subject, &message).map_err(|e| e.0)?;
    Ok(message)
}

#[cfg(test)]
mod tests;
