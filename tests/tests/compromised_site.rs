//! A site's key stolen: on the production topology (a hub from `landfall deploy nats-config`,
//! TLS, each service and each site as its own NATS user), a thief holding site edge-01's nkey
//! seed tries to reach site edge-02 through every door the bus has: commands, events, the hub's
//! services, the JetStream and KV APIs, and other users' inboxes. Each attack is a named function
//! and must be refused (by the server's permissions, or by landfall with `FORBIDDEN`, a refusal
//! or a decline); afterwards everything the hub holds about edge-02 (every KV entry that names
//! it, its events, its jobs) must be byte for byte what it was, and no rollout's counters moved.
//!
//! edge-02 is caught mid-work, so that a forgery that got through would change something: its
//! gateway is offline while a second install waits at staging (its lease held, its StageArtifacts
//! job unfetched), and a rollout waits to patch it; an earlier rollout patched it already.
//! docs/src/security.md maps each attack to the defence that stops it.

use std::fmt;
use std::time::Duration;

use bus_schema::access::Role;
use bus_schema::names::{self, Origin, keys};
use bus_schema::pb::{self, BusCommand, BusEvent, BusJob, BusMessage};
use bus_schema::runtime::{Bus, Envelope};
use consumers::rollout::decide::patch_job_id;
use consumers::secrets_service::NO_BMC_JOB;
use landfall_tests::fleet::{Fleet, kubelet};
use landfall_tests::intruder::{Intruder, Outcome};
use landfall_tests::secrets::put_bmc;
use landfall_tests::site_state::SiteState;
use landfall_tests::topology::{Deployment, TlsFiles};
use prost::Message;
use serde_json::json;

const A: &str = "edge-01";
const B: &str = "edge-02";

/// What stops an attack, as docs/src/security.md names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Defence {
    /// The site's NATS permissions (`bus_schema::access`): the server refuses the subject.
    Permission,
    /// `bus_schema::trust::RULES`: a message speaks only for the site its subject names
    /// (`Delivery::decode`, the request servers).
    TrustTable,
    /// The install saga takes a site's report only as the answer to a job it sent that site
    /// (`saga::check_answer`).
    SagaJob,
    /// A rollout counts a `SitePatched` only as the answer to the job it sent the site planned at
    /// that index (`rollout::decide::check_report`).
    RolloutJob,
    /// The secrets service hands out a host's BMC credentials only for the job the site's saga
    /// sent to provision that host, while it does (`saga::bmc_grant`).
    SecretsLease,
    /// The observer writes a site's report only as the answer to a job the hub sent that site.
    ObserverJob,
    /// A reply reaches a requester only through the inbox of a request it is waiting on.
    ReplyInbox,
}

impl Defence {
    /// Whether the outcome is this defence holding.
    fn holds(self, o: &Outcome) -> bool {
        match self {
            Defence::Permission => o.is_denied(),
            Defence::TrustTable => {
                o.is_denied()
                    || o.is_forbidden()
                    || o.is_refused_with("speaks for site")
                    || matches!(o, Outcome::Unheard(_))
            }
            Defence::SagaJob | Defence::RolloutJob => o.is_denied() || o.is_forbidden(),
            Defence::SecretsLease => o.is_denied() || o.is_refused_with(NO_BMC_JOB),
            Defence::ObserverJob => o.is_denied() || o.is_forbidden(),
            Defence::ReplyInbox => matches!(o, Outcome::Denied(_) | Outcome::Ignored(_)),
        }
    }
}

impl fmt::Display for Defence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// What the thief knows, or could learn: ids seen on its own subjects or guessed, and the
/// hub's state it aims at (the test reads it as an operator, the thief could not).
struct Scene {
    b_nodes: Vec<pb::NodeSpec>,
    /// A's install, ended.
    a_install: String,
    /// B's second install, waiting at staging while B's gateway is offline; its StageArtifacts job.
    b_saga: String,
    b_stage_job: String,
    /// Where that job is in B's shard of the jobs.
    b_job_seq: u64,
    /// A rollout that patched B, and one waiting for B's lease.
    r1: pb::Rollout,
    r2: pb::Rollout,
    /// The catalog entry of kubelet at its demo version, with its bytes in the artifact store.
    kubelet: pb::Package,
    kubeconfig_key: String,
    orchestrator_key: String,
    b_gateway_key: String,
}

/// An envelope continuing `correlation` as the answer to `causation`.
fn answering(correlation: &str, causation: &str) -> Envelope {
    Envelope { correlation: correlation.into(), causation: causation.into(), ..Envelope::root() }
}

/// What the thief sends as: a gateway (its user may publish nothing the hub's subjects carry).
const GW: Origin = Origin::Gateway;

/// The subject an event of type `E` has in `scope`, sent as a gateway.
fn event_on<E: BusEvent>(scope: &str) -> String {
    names::event_subject_from(GW, scope, E::AGGREGATE, E::KIND)
}

fn command_on<C: BusCommand>(scope: &str) -> String {
    names::command_subject_from(GW, C::KIND, scope)
}

fn package_ref(r: &pb::Rollout) -> Option<pb::PackageRef> {
    r.package.clone()
}

fn b_node_names(s: &Scene) -> Vec<String> {
    s.b_nodes.iter().map(|n| n.name.clone()).collect()
}

// ---- Commands ----

/// A host announced on A's own subject for B's design: the subject is A's, the payload names B.
async fn node_added_naming_b_on_own_subject(t: &Intruder, _: &Scene) -> Outcome {
    let node = pb::NodeSpec {
        name: "intruder".into(),
        role: pb::Role::Worker as i32,
        boot_mac: "52:54:00:ee:ee:01".into(),
        bmc_address: "redfish-virtualmedia://10.9.9.9/redfish/v1/Systems/1".into(),
        labels: Default::default(),
        ..Default::default()
    };
    let cmd = pb::NodeAdded { site_id: B.into(), node: Some(node), hardware: None };
    t.forge(&command_on::<pb::NodeAdded>(A), &cmd, &Envelope::root()).await
}

async fn node_removed_of_b_node_on_own_subject(t: &Intruder, s: &Scene) -> Outcome {
    let victim = &s.b_nodes[2];
    let cmd = pb::NodeRemoved {
        site_id: B.into(),
        node: victim.name.clone(),
        boot_mac: victim.boot_mac.clone(),
        reason: "gone".into(),
    };
    t.forge(&command_on::<pb::NodeRemoved>(A), &cmd, &Envelope::root()).await
}

async fn node_added_on_b_subject(t: &Intruder, s: &Scene) -> Outcome {
    let node = pb::NodeSpec { name: "intruder".into(), ..s.b_nodes[0].clone() };
    let cmd = pb::NodeAdded { site_id: B.into(), node: Some(node), hardware: None };
    t.store(&cmd.subject_from(GW), &cmd, &Envelope::root()).await
}

async fn node_removed_on_b_subject(t: &Intruder, s: &Scene) -> Outcome {
    let cmd = pb::NodeRemoved { site_id: B.into(), node: s.b_nodes[2].name.clone(), ..Default::default() };
    t.store(&cmd.subject_from(GW), &cmd, &Envelope::root()).await
}

async fn install_site_b(t: &Intruder, _: &Scene) -> Outcome {
    let cmd = pb::InstallSite { site_id: B.into(), ..Default::default() };
    t.store(&cmd.subject_from(GW), &cmd, &Envelope::root()).await
}

/// Under its own site's gateway subjects, where the server lets it through.
async fn install_site_own(t: &Intruder, _: &Scene) -> Outcome {
    let cmd = pb::InstallSite { site_id: A.into(), ..Default::default() };
    t.forge(&cmd.subject_from(GW), &cmd, &Envelope::root()).await
}

/// As the hub would send it.
async fn install_site_own_as_the_hub(t: &Intruder, _: &Scene) -> Outcome {
    let cmd = pb::InstallSite { site_id: A.into(), ..Default::default() };
    t.store(&cmd.subject(), &cmd, &Envelope::root()).await
}

async fn decommission_own_site(t: &Intruder, _: &Scene) -> Outcome {
    let cmd = pb::DecommissionSite { site_id: A.into(), ..Default::default() };
    t.forge(&cmd.subject_from(GW), &cmd, &Envelope::root()).await
}

async fn stage_site_b(t: &Intruder, _: &Scene) -> Outcome {
    let cmd = pb::StageSite { site_id: B.into(), design_revision: 0 };
    t.store(&cmd.subject_from(GW), &cmd, &Envelope::root()).await
}

async fn apply_design_b(t: &Intruder, _: &Scene) -> Outcome {
    let source = pb::DesignSource { name: "site.yaml".into(), text: format!("site: {B}\nnodes: []\n") };
    let cmd = pb::ApplyDesign { site_id: B.into(), sources: vec![source], expected: None };
    t.store(&cmd.subject_from(GW), &cmd, &Envelope::root()).await
}

async fn register_site_b_with_an_extra_node(t: &Intruder, s: &Scene) -> Outcome {
    let mut nodes = s.b_nodes.clone();
    nodes.push(pb::NodeSpec { name: "intruder".into(), boot_mac: "52:54:00:ee:ee:02".into(), ..nodes[1].clone() });
    let design = pb::SiteDesign { site_id: B.into(), nodes, ..Default::default() };
    let cmd = pb::RegisterSite { design: Some(design), expected: None };
    t.store(&cmd.subject_from(GW), &cmd, &Envelope::root()).await
}

async fn register_package_for_the_fleet(t: &Intruder, _: &Scene) -> Outcome {
    let cmd = pb::RegisterPackage { package: Some(kubelet("9.9.9")), auto_rollout: None };
    t.store(&cmd.subject_from(GW), &cmd, &Envelope::root()).await
}

async fn patch_package_b(t: &Intruder, _: &Scene) -> Outcome {
    let selector = pb::SiteSelector { site_ids: vec![B.into()], ..Default::default() };
    let cmd = pb::PatchPackage {
        name: "kubelet".into(),
        version: "1.29.2".into(),
        selector: Some(selector),
        ..Default::default()
    };
    t.store(&cmd.subject_from(GW), &cmd, &Envelope::root()).await
}

async fn cancel_rollout_waiting_for_b(t: &Intruder, s: &Scene) -> Outcome {
    let cmd = pb::CancelRollout { rollout_id: s.r2.rollout_id.clone(), reason: "stolen".into() };
    t.store(&cmd.subject_from(GW), &cmd, &Envelope::root()).await
}

// ---- Events: rollout reports ----

/// A's report in the place of B's: the rollout waiting for B, at B's plan index, as the
/// answer to the job the rollout will send B.
async fn site_patched_with_b_plan_index(t: &Intruder, s: &Scene) -> Outcome {
    let r = &s.r2;
    let e = pb::SitePatched {
        site_id: A.into(),
        rollout_id: r.rollout_id.clone(),
        plan_index: 0,
        patched: b_node_names(s),
        package: package_ref(r),
        ..Default::default()
    };
    t.forge(&e.subject_from(GW), &e, &answering(&r.rollout_id, &patch_job_id(r, B))).await
}

/// B's report, naming B, on A's subject.
async fn site_patched_naming_b(t: &Intruder, s: &Scene) -> Outcome {
    let r = &s.r2;
    let e = pb::SitePatched {
        site_id: B.into(),
        rollout_id: r.rollout_id.clone(),
        plan_index: 0,
        patched: b_node_names(s),
        package: package_ref(r),
        ..Default::default()
    };
    t.forge(&event_on::<pb::SitePatched>(A), &e, &answering(&r.rollout_id, &patch_job_id(r, B))).await
}

/// A report from A for a rollout that sent A nothing (it planned B alone), citing the job it
/// sent B.
async fn site_patched_with_no_job_sent_to_a(t: &Intruder, s: &Scene) -> Outcome {
    let r = &s.r1;
    let e = pb::SitePatched {
        site_id: A.into(),
        rollout_id: r.rollout_id.clone(),
        plan_index: 0,
        failed: s
            .b_nodes
            .iter()
            .map(|n| pb::NodeResult { node: n.name.clone(), reason: "forged".into(), ..Default::default() })
            .collect(),
        package: package_ref(r),
        ..Default::default()
    };
    t.forge(&e.subject_from(GW), &e, &answering(&r.rollout_id, &patch_job_id(r, B))).await
}

/// A report beyond the rollout's plan.
async fn site_patched_past_the_plan(t: &Intruder, s: &Scene) -> Outcome {
    let r = &s.r2;
    let e = pb::SitePatched {
        site_id: A.into(),
        rollout_id: r.rollout_id.clone(),
        plan_index: r.sites + 3,
        patched: vec!["node-1".into()],
        package: package_ref(r),
        ..Default::default()
    };
    t.forge(&e.subject_from(GW), &e, &answering(&r.rollout_id, &Envelope::root().id)).await
}

async fn node_patched_for_b_node(t: &Intruder, s: &Scene) -> Outcome {
    let e = pb::NodePatched {
        site_id: B.into(),
        node: s.b_nodes[0].name.clone(),
        rollout_id: s.r2.rollout_id.clone(),
        package: package_ref(&s.r2),
        from_version: "1.30.0".into(),
        ..Default::default()
    };
    t.forge(&event_on::<pb::NodePatched>(A), &e, &answering(&s.r2.rollout_id, &patch_job_id(&s.r2, B))).await
}

/// A report of A's own, carrying a node report of B's node.
async fn site_patched_carrying_a_report_of_b_node(t: &Intruder, s: &Scene) -> Outcome {
    let r = &s.r2;
    let node = pb::NodePatched {
        site_id: B.into(),
        node: s.b_nodes[0].name.clone(),
        rollout_id: r.rollout_id.clone(),
        package: package_ref(r),
        from_version: "1.30.0".into(),
        ..Default::default()
    };
    let e = pb::SitePatched {
        site_id: A.into(),
        rollout_id: r.rollout_id.clone(),
        patched: vec![node.node.clone()],
        package: package_ref(r),
        nodes: vec![node],
        ..Default::default()
    };
    t.forge(&e.subject_from(GW), &e, &answering(&r.rollout_id, &patch_job_id(r, B))).await
}

// ---- Events: install saga reports, as answers in B's saga ----

fn in_b_saga(s: &Scene) -> Envelope {
    answering(&s.b_saga, &s.b_stage_job)
}

/// What B's saga waits for, from A.
async fn artifacts_staged_in_b_saga(t: &Intruder, s: &Scene) -> Outcome {
    let e = pb::ArtifactsStaged { site_id: A.into(), artifacts: 5, ..Default::default() };
    t.forge(&e.subject_from(GW), &e, &in_b_saga(s)).await
}

async fn node_os_provisioned_in_b_saga(t: &Intruder, s: &Scene) -> Outcome {
    let e = pb::NodeOsProvisioned { site_id: A.into(), node: s.b_nodes[0].name.clone(), image: "ubuntu".into() };
    t.forge(&e.subject_from(GW), &e, &in_b_saga(s)).await
}

async fn cluster_ready_in_b_saga(t: &Intruder, s: &Scene) -> Outcome {
    let e = pb::ClusterReady {
        site_id: A.into(),
        masters: vec![s.b_nodes[0].name.clone()],
        workers: s.b_nodes[1..].iter().map(|n| n.name.clone()).collect(),
        failed: vec![],
    };
    t.forge(&e.subject_from(GW), &e, &in_b_saga(s)).await
}

async fn job_failed_in_b_saga(t: &Intruder, s: &Scene) -> Outcome {
    let e = pb::JobFailed { site_id: A.into(), job: pb::StageArtifacts::KIND.into(), reason: "forged".into() };
    t.forge(&e.subject_from(GW), &e, &in_b_saga(s)).await
}

async fn node_failed_in_b_saga(t: &Intruder, s: &Scene) -> Outcome {
    let e = pb::NodeFailed {
        site_id: A.into(),
        node: s.b_nodes[0].name.clone(),
        step: pb::ProvisionOs::KIND.into(),
        reason: "forged".into(),
        error_type: String::new(),
    };
    t.forge(&e.subject_from(GW), &e, &in_b_saga(s)).await
}

/// A's own saga, with an answer to no job it was sent.
/// A version claimed for its own node, answering no job any rollout sent it: the observer
/// (whose versions the planner reads) refuses it.
async fn node_patched_own_node_with_no_job(t: &Intruder, s: &Scene) -> Outcome {
    let e = pb::NodePatched {
        site_id: A.into(),
        node: "node-1".into(),
        rollout_id: s.r2.rollout_id.clone(),
        package: package_ref(&s.r2),
        from_version: "1.30.0".into(),
        ..Default::default()
    };
    t.forge(&e.subject_from(GW), &e, &answering(&s.r2.rollout_id, &Envelope::root().id)).await
}

/// A node of its own claimed put back to a version, answering a job no rollout sent A: the
/// observer refuses to record it.
async fn node_rolled_back_own_node_with_no_job(t: &Intruder, s: &Scene) -> Outcome {
    let r = &s.r1;
    let e = pb::NodeRolledBack {
        site_id: A.into(),
        node: "node-1".into(),
        rollout_id: r.rollout_id.clone(),
        package: Some(pb::PackageRef { name: "kubelet".into(), version: "0.0.1-forged".into() }),
        failed_version: "1.30.0".into(),
        reason: "forged".into(),
    };
    t.forge(&e.subject_from(GW), &e, &answering(&r.rollout_id, &patch_job_id(r, A))).await
}

async fn node_os_provisioned_with_no_job_sent(t: &Intruder, s: &Scene) -> Outcome {
    let e = pb::NodeOsProvisioned { site_id: A.into(), node: "node-1".into(), image: "ubuntu".into() };
    t.forge(&e.subject_from(GW), &e, &answering(&s.a_install, &Envelope::root().id)).await
}

// ---- Events: another site's subject, and kinds only the hub sends ----

async fn artifacts_staged_on_b_subject(t: &Intruder, s: &Scene) -> Outcome {
    let e = pb::ArtifactsStaged { site_id: B.into(), artifacts: 5, ..Default::default() };
    t.store(&e.subject_from(GW), &e, &in_b_saga(s)).await
}

async fn node_patched_on_b_subject(t: &Intruder, s: &Scene) -> Outcome {
    let e = pb::NodePatched {
        site_id: B.into(),
        node: s.b_nodes[0].name.clone(),
        rollout_id: s.r2.rollout_id.clone(),
        package: package_ref(&s.r2),
        from_version: "1.30.0".into(),
        ..Default::default()
    };
    t.store(&e.subject_from(GW), &e, &Envelope::root()).await
}

async fn site_installed_on_own_scope(t: &Intruder, s: &Scene) -> Outcome {
    let e = pb::SiteInstalled { site_id: A.into(), results: vec![], outcome: pb::InstallOutcome::Success as i32 };
    t.forge_unseen(&e.subject_from(GW), &e, &answering(&s.a_install, &s.a_install)).await
}

async fn kubeconfig_stored_on_own_scope(t: &Intruder, s: &Scene) -> Outcome {
    let e = pb::KubeconfigStored { site_id: A.into(), key_id: "forged".into(), revision: 1 };
    t.forge_unseen(&e.subject_from(GW), &e, &in_b_saga(s)).await
}

async fn design_applied_on_own_scope(t: &Intruder, _: &Scene) -> Outcome {
    let e = pb::DesignApplied {
        site_id: A.into(),
        revision: 99,
        nodes_added: vec!["intruder".into()],
        ..Default::default()
    };
    t.forge_unseen(&e.subject_from(GW), &e, &Envelope::root()).await
}

async fn node_accepted_on_own_scope(t: &Intruder, s: &Scene) -> Outcome {
    let node = pb::NodeSpec { name: "intruder".into(), ..s.b_nodes[1].clone() };
    let e = pb::NodeAccepted { site_id: A.into(), node: Some(node), joining: true, hardware: None };
    t.forge_unseen(&e.subject_from(GW), &e, &Envelope::root()).await
}

async fn rollout_completed_on_own_scope(t: &Intruder, s: &Scene) -> Outcome {
    let r = &s.r2;
    let e = pb::RolloutCompleted {
        rollout_id: r.rollout_id.clone(),
        package: package_ref(r),
        planned_nodes: r.planned_nodes,
        patched: r.planned_nodes,
        sites: r.sites,
        ..Default::default()
    };
    t.forge_unseen(&event_on::<pb::RolloutCompleted>(A), &e, &answering(&r.rollout_id, &r.rollout_id)).await
}

/// As the hub would send it.
async fn site_installed_on_own_scope_as_the_hub(t: &Intruder, s: &Scene) -> Outcome {
    let e = pb::SiteInstalled { site_id: A.into(), results: vec![], outcome: pb::InstallOutcome::Success as i32 };
    t.store(&e.subject(), &e, &answering(&s.a_install, &s.a_install)).await
}

// ---- The hub's services ----

/// A BMC credentials request for `node` of `site`, for job `job` (any other field left empty).
fn bmc_request(site: &str, node: &str, job: &str) -> Vec<u8> {
    bmc_request_in(site, node, job, "")
}

/// A request naming the job `job` of the saga `saga`.
fn bmc_request_in(site: &str, node: &str, job: &str, saga: &str) -> Vec<u8> {
    let for_job = pb::BmcCredentialsRequest { job_id: job.into(), correlation_id: saga.into(), ..Default::default() };
    pb::BmcCredentialsRequest { site_id: site.into(), node: node.into(), ..for_job }.encode_to_vec()
}

/// Its own host, naming B's running install and its job: the grant is for the saga's own site.
async fn bmc_credentials_own_node_with_b_saga_job(t: &Intruder, s: &Scene) -> Outcome {
    t.request(&names::bmc_credentials_svc(A), bmc_request_in(A, "node-1", &s.b_stage_job, &s.b_saga)).await
}

/// Its own host, naming its own install, which has ended: a job's grant ends with its step.
async fn bmc_credentials_own_node_after_its_install_ended(t: &Intruder, s: &Scene) -> Outcome {
    let job = bus_schema::ids::derived_id(&s.a_install, "provision_os", Some("node-1")).to_string();
    t.request(&names::bmc_credentials_svc(A), bmc_request_in(A, "node-1", &job, &s.a_install)).await
}

/// B's lease is held (its install is under way): only the subject stands between the thief and
/// B's credentials.
async fn bmc_credentials_for_b_node_on_own_subject(t: &Intruder, s: &Scene) -> Outcome {
    t.request(&names::bmc_credentials_svc(A), bmc_request(B, &s.b_nodes[0].name, &s.b_stage_job)).await
}

async fn bmc_credentials_on_b_subject(t: &Intruder, s: &Scene) -> Outcome {
    t.request(&names::bmc_credentials_svc(B), bmc_request(B, &s.b_nodes[0].name, &s.b_stage_job)).await
}

async fn bmc_credentials_own_node_with_no_job(t: &Intruder, _: &Scene) -> Outcome {
    t.request(&names::bmc_credentials_svc(A), bmc_request(A, "node-1", &Envelope::root().id)).await
}

fn plan_request(site: &str, s: &Scene) -> Vec<u8> {
    pb::ArtifactPlanRequest { site_id: site.into(), inventory: vec![], wanted: vec![s.kubelet.clone()] }.encode_to_vec()
}

fn chunk_request(site: &str, s: &Scene) -> Vec<u8> {
    let p = &s.kubelet;
    let chunk = pb::ChunkRequest {
        site_id: site.into(),
        sha256: p.sha256.clone(),
        object_key: p.object_key.clone(),
        offset: 0,
        length: 4096,
    };
    chunk.encode_to_vec()
}

async fn artifact_plan_naming_b(t: &Intruder, s: &Scene) -> Outcome {
    t.request(&names::artifact_plan_svc(A), plan_request(B, s)).await
}

async fn artifact_chunk_naming_b(t: &Intruder, s: &Scene) -> Outcome {
    t.request(&names::artifact_chunk_svc(A), chunk_request(B, s)).await
}

/// B's render of a chart (made of B's values) asked on A's own subject.
async fn chart_render_naming_b(t: &Intruder, _: &Scene) -> Outcome {
    t.request(&names::chart_render_svc(A), render_request(B)).await
}

async fn chart_render_on_b_subject(t: &Intruder, _: &Scene) -> Outcome {
    t.request(&names::chart_render_svc(B), render_request(B)).await
}

fn render_request(site: &str) -> Vec<u8> {
    pb::ChartRenderRequest { site_id: site.into(), name: "cni".into(), version: "1".into(), ..Default::default() }
        .encode_to_vec()
}

async fn artifact_plan_on_b_subject(t: &Intruder, s: &Scene) -> Outcome {
    t.request(&names::artifact_plan_svc(B), plan_request(B, s)).await
}

async fn artifact_chunk_on_b_subject(t: &Intruder, s: &Scene) -> Outcome {
    t.request(&names::artifact_chunk_svc(B), chunk_request(B, s)).await
}

// ---- The JetStream API: consumers and streams ----

/// The hub's JetStream API, through the hub's domain: the only way a site's user reaches it.
fn js(rest: &str) -> String {
    format!("$JS.hub.API.{rest}")
}

/// A's own durable consumer's info, as the hub has it (the thief may not ask for it, and could
/// know it all the same: it is what every gateway's durable is).
async fn own_consumer_info(t: &Intruder) -> serde_json::Value {
    let subject = format!("$JS.API.CONSUMER.INFO.{}.{}", names::site_jobs_stream(A), names::gateway_consumer(A));
    let reply = t.watcher().client().request(subject, "".into()).await.expect("the hub's answer");
    serde_json::from_slice(&reply.payload).expect("JSON")
}

/// A's own durable consumer's configuration with `filters`.
async fn own_consumer_with(t: &Intruder, filters: &[String]) -> serde_json::Value {
    let info = own_consumer_info(t).await;
    let mut config = info["config"].clone();
    let object = config.as_object_mut().unwrap_or_else(|| panic!("no consumer config in {info}"));
    object.remove("filter_subject");
    object.remove("filter_subjects");
    match filters {
        [] => {}
        [one] => {
            object.insert("filter_subject".into(), json!(one));
        }
        many => {
            object.insert("filter_subjects".into(), json!(many));
        }
    }
    json!({ "stream_name": names::site_jobs_stream(A), "config": config })
}

/// The last stream sequence A's own consumer delivered.
async fn own_consumer_delivered(t: &Intruder) -> u64 {
    let info = own_consumer_info(t).await;
    info["delivered"]["stream_seq"].as_u64().unwrap_or_default()
}

/// Creates (or updates) A's own durable consumer on `subject` with `filters`. When the server
/// takes it, the thief looks (as it may) at what the consumer delivered since: B's waiting job,
/// when the new filter covers it. Then A's consumer is put back as it was (by the hub).
async fn create_own_consumer(t: &Intruder, s: &Scene, subject: &str, filters: &[String]) -> Outcome {
    let before = own_consumer_delivered(t).await;
    let body = own_consumer_with(t, filters).await;
    let outcome = t.js_api(subject, body).await;
    let Outcome::Through(answer) = outcome else { return outcome };
    // The thief asks for a job; the server hands the first waiting request (the thief's, or
    // A's gateway's) whatever the filter now covers.
    let next = js(&format!("CONSUMER.MSG.NEXT.{}.{}", names::site_jobs_stream(A), names::gateway_consumer(A)));
    let pull = serde_json::to_vec(&json!({ "batch": 1, "expires": 2_000_000_000u64 })).unwrap();
    let pulled = match t.client.request(next, pull.into()).await {
        Ok(m) if m.status.is_none() => Some(m.subject.to_string()),
        _ => None,
    };
    let delivered = own_consumer_delivered(t).await;
    let seen = match pulled {
        Some(job) => format!("the thief then pulled the job on {job}"),
        None if before < s.b_job_seq && delivered >= s.b_job_seq => format!(
            "B's waiting job (stream sequence {}) was then delivered through A's durable, to A's gateway",
            s.b_job_seq
        ),
        None => "nothing of B's was seen delivered through it".to_string(),
    };
    let restore = own_create().replacen("$JS.hub.API.", "$JS.API.", 1);
    let body = serde_json::to_vec(&own_consumer_with(t, &[names::site_jobs(A)]).await).unwrap();
    let restored = t.watcher().client().request(restore, body.into()).await.expect("the hub's answer");
    assert!(!String::from_utf8_lossy(&restored.payload).contains("\"error\""), "A's consumer was not put back");
    let answer: String = answer.chars().take(120).collect();
    Outcome::Through(format!("A's consumer now filtered on {filters:?}; {seen} ({answer}…)"))
}

fn own_create() -> String {
    js(&format!("CONSUMER.CREATE.{}.{}", names::site_jobs_stream(A), names::gateway_consumer(A)))
}

/// The create subject of its own durable with its own jobs, and B's in the body (the server
/// would refuse the mismatch too).
async fn js_own_consumer_pinned_subject_with_b_filter_in_body(t: &Intruder, s: &Scene) -> Outcome {
    let subject = format!("{}.{}", own_create(), names::site_jobs(A));
    create_own_consumer(t, s, &subject, &[names::site_jobs(B)]).await
}

/// Its own durable as a push consumer delivering its jobs to a subject of the thief's choosing
/// (the server checks no one's permissions on a delivery subject): the hub makes a site's
/// durable, and a site may create none.
async fn js_own_consumer_as_push_consumer(t: &Intruder, _: &Scene) -> Outcome {
    let subject = format!("{}.{}", own_create(), names::site_jobs(A));
    let config = json!({
        "durable_name": names::gateway_consumer(A),
        "filter_subject": names::site_jobs(A),
        "deliver_subject": names::command_subject(pb::NodeAdded::KIND, B),
        "ack_policy": "explicit",
    });
    t.js_api(&subject, json!({ "stream_name": names::site_jobs_stream(A), "config": config })).await
}

async fn js_own_consumer_filtered_on_b_jobs(t: &Intruder, s: &Scene) -> Outcome {
    create_own_consumer(t, s, &own_create(), &[names::site_jobs(B)]).await
}

async fn js_own_consumer_with_b_filter_in_subject(t: &Intruder, s: &Scene) -> Outcome {
    let filter = names::job_subject(B, pb::StageArtifacts::KIND);
    create_own_consumer(t, s, &format!("{}.{filter}", own_create()), std::slice::from_ref(&filter)).await
}

/// No filter at all: every site's jobs.
async fn js_own_consumer_unfiltered(t: &Intruder, s: &Scene) -> Outcome {
    create_own_consumer(t, s, &own_create(), &[]).await
}

async fn js_own_consumer_filtered_on_b_through_hub_domain(t: &Intruder, s: &Scene) -> Outcome {
    let subject = own_create().replacen("$JS.API.", "$JS.hub.API.", 1);
    create_own_consumer(t, s, &subject, &[names::site_jobs(B)]).await
}

async fn js_own_consumer_by_the_legacy_durable_api(t: &Intruder, s: &Scene) -> Outcome {
    let subject = js(&format!("CONSUMER.DURABLE.CREATE.{}.{}", names::site_jobs_stream(A), names::gateway_consumer(A)));
    create_own_consumer(t, s, &subject, &[names::site_jobs(B)]).await
}

/// The jobs of a site whose gateway has no consumer yet (registered, not yet online): nothing
/// else filters on them, so the work queue's rule against overlapping consumers does not stand
/// in the way. A's own jobs stay in the filter, so its gateway would notice nothing.
async fn js_own_consumer_claims_jobs_of_a_site_not_yet_online(t: &Intruder, s: &Scene) -> Outcome {
    create_own_consumer(t, s, &own_create(), &[names::site_jobs(A), names::site_jobs("edge-03")]).await
}

async fn js_fetch_from_b_durable(t: &Intruder, _: &Scene) -> Outcome {
    let subject = js(&format!("CONSUMER.MSG.NEXT.{}.{}", names::site_jobs_stream(B), names::gateway_consumer(B)));
    t.js_api(&subject, json!({ "batch": 1, "expires": 1_000_000_000u64 })).await
}

async fn js_ack_b_job(t: &Intruder, s: &Scene) -> Outcome {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let subject =
        format!("$JS.ACK.{}.{}.1.{}.1.{now}.0", names::site_jobs_stream(B), names::gateway_consumer(B), s.b_job_seq);
    t.publish(&subject, b"+ACK".to_vec()).await
}

async fn js_delete_b_consumer(t: &Intruder, _: &Scene) -> Outcome {
    t.js_api(&js(&format!("CONSUMER.DELETE.{}.{}", names::site_jobs_stream(B), names::gateway_consumer(B))), json!({}))
        .await
}

async fn js_delete_jobs_stream(t: &Intruder, _: &Scene) -> Outcome {
    t.js_api(&js(&format!("STREAM.DELETE.{}", names::site_jobs_stream(B))), json!({})).await
}

async fn js_purge_b_events(t: &Intruder, _: &Scene) -> Outcome {
    t.js_api(&js(&format!("STREAM.PURGE.{}", names::EVENTS_STREAM)), json!({ "filter": names::scope_events(B) })).await
}

async fn js_stream_sourcing_b_jobs(t: &Intruder, _: &Scene) -> Outcome {
    let config = json!({
        "name": "STOLEN",
        "subjects": [],
        "retention": "limits",
        "storage": "file",
        "sources": [{ "name": names::site_jobs_stream(B), "filter_subject": names::site_jobs(B) }],
    });
    t.js_api(&js("STREAM.CREATE.STOLEN"), config).await
}

// ---- The KV API ----

fn kv_subject(bucket: &str, key: &str) -> String {
    format!("$KV.{bucket}.{key}")
}

/// A key read with the direct get API.
async fn direct_get(t: &Intruder, bucket: &str, key: &str) -> Outcome {
    let subject = js(&format!("DIRECT.GET.{}.{}", names::kv_stream(bucket), kv_subject(bucket, key)));
    t.js_api(&subject, json!({})).await
}

/// A key read as its stream's last message on the key's subject.
async fn message_get(t: &Intruder, bucket: &str, key: &str) -> Outcome {
    let body = json!({ "last_by_subj": kv_subject(bucket, key) });
    t.js_api(&js(&format!("STREAM.MSG.GET.{}", names::kv_stream(bucket))), body).await
}

async fn kv_read_b_design(t: &Intruder, _: &Scene) -> Outcome {
    direct_get(t, names::SITES_BUCKET, &keys::site(B)).await
}

async fn kv_read_b_design_by_message_get(t: &Intruder, _: &Scene) -> Outcome {
    message_get(t, names::SITES_BUCKET, &keys::site(B)).await
}

async fn kv_read_b_kubeconfig(t: &Intruder, _: &Scene) -> Outcome {
    direct_get(t, names::KUBECONFIGS_BUCKET, &keys::kubeconfig(B)).await
}

async fn kv_read_own_kubeconfig(t: &Intruder, _: &Scene) -> Outcome {
    message_get(t, names::KUBECONFIGS_BUCKET, &keys::kubeconfig(A)).await
}

async fn kv_read_b_bmc_record(t: &Intruder, s: &Scene) -> Outcome {
    direct_get(t, names::KUBECONFIGS_BUCKET, &keys::bmc_credentials(B, &s.b_nodes[0].name)).await
}

async fn kv_write_b_design(t: &Intruder, s: &Scene) -> Outcome {
    let mut nodes = s.b_nodes.clone();
    nodes.push(pb::NodeSpec { name: "intruder".into(), boot_mac: "52:54:00:ee:ee:03".into(), ..nodes[1].clone() });
    let design = pb::SiteDesign { site_id: B.into(), nodes, ..Default::default() };
    let subject = kv_subject(names::SITES_BUCKET, &keys::site(B));
    t.store_raw(&subject, "", design.encode_to_vec(), &Envelope::root()).await
}

async fn kv_overwrite_b_lease(t: &Intruder, _: &Scene) -> Outcome {
    let subject = kv_subject(names::SAGAS_BUCKET, &keys::site_lease(B));
    t.store_raw(&subject, "", Vec::new(), &Envelope::root()).await
}

async fn kv_write_b_observed_version(t: &Intruder, s: &Scene) -> Outcome {
    let observed = pb::ObservedVersion {
        site_id: B.into(),
        node: s.b_nodes[0].name.clone(),
        version: "9.9.9".into(),
        ..Default::default()
    };
    let subject = kv_subject(names::OBSERVED_BUCKET, &keys::observed(B, &s.b_nodes[0].name, "kubelet"));
    t.store_raw(&subject, "", observed.encode_to_vec(), &Envelope::root()).await
}

// ---- Inboxes and other parties' subjects ----

async fn subscribe_shared_inbox(t: &Intruder, _: &Scene) -> Outcome {
    t.subscribe("_INBOX.>").await
}

async fn subscribe_kubeconfig_collector_inbox(t: &Intruder, s: &Scene) -> Outcome {
    t.subscribe(&format!("{}.>", bus_schema::access::inbox(&s.kubeconfig_key))).await
}

async fn subscribe_b_gateway_inbox(t: &Intruder, s: &Scene) -> Outcome {
    t.subscribe(&format!("{}.>", bus_schema::access::inbox(&s.b_gateway_key))).await
}

/// The answers to edge-02's own requests (its artifact plans, its BMC credentials).
async fn subscribe_b_site_inbox(t: &Intruder, _: &Scene) -> Outcome {
    t.subscribe(&format!("{}.>", names::site_inbox(B))).await
}

/// An answer "from edge-02" to the collector's request of edge-02.
async fn reply_as_b_to_the_kubeconfig_collector(t: &Intruder, s: &Scene) -> Outcome {
    let subject = format!("{}.forged", names::site_replies(B, &bus_schema::access::inbox(&s.kubeconfig_key)));
    t.publish(&subject, b"apiVersion: v1\nkind: Config\n# forged\n".to_vec()).await
}

/// Its own answer to the collector, where no request of the collector's waits: it lands nowhere.
async fn reply_as_own_site_to_the_kubeconfig_collector_unasked(t: &Intruder, s: &Scene) -> Outcome {
    let subject = format!("{}.forged", names::site_replies(A, &bus_schema::access::inbox(&s.kubeconfig_key)));
    match t.publish(&subject, b"apiVersion: v1\nkind: Config\n# forged\n".to_vec()).await {
        Outcome::Through(_) => Outcome::Ignored(format!("{subject} is no request's inbox: nobody took the reply")),
        other => other,
    }
}

async fn reply_into_orchestrator_inbox(t: &Intruder, s: &Scene) -> Outcome {
    let subject = format!("{}.forged.1", bus_schema::access::inbox(&s.orchestrator_key));
    t.publish(&subject, format!("{{\"stream\":\"{}\",\"seq\":1}}", names::site_jobs_stream(B)).into_bytes()).await
}

/// The collector's own inbox, where its requests of hub services are answered: a site answers
/// it only under its own site's subjects. The snapshot of B's sealed kubeconfig checks that no
/// forged kubeconfig lands anywhere.
async fn reply_into_kubeconfig_collector_inbox(t: &Intruder, s: &Scene) -> Outcome {
    let subject = format!("{}.forged.1", bus_schema::access::inbox(&s.kubeconfig_key));
    match t.publish(&subject, b"apiVersion: v1\nkind: Config\n# forged\n".to_vec()).await {
        Outcome::Through(_) => Outcome::Ignored(format!("{subject} is no request's inbox: nobody took the reply")),
        other => other,
    }
}

async fn subscribe_b_rpc(t: &Intruder, _: &Scene) -> Outcome {
    t.subscribe(&names::site_rpcs(B)).await
}

async fn subscribe_b_jobs(t: &Intruder, _: &Scene) -> Outcome {
    t.subscribe(&names::site_jobs(B)).await
}

/// B's jobs as its durable pushes them.
async fn subscribe_b_deliveries(t: &Intruder, _: &Scene) -> Outcome {
    t.subscribe(&names::site_deliver(B)).await
}

/// A job of the thief's making pushed at B's gateway, as if its durable had delivered it.
async fn job_into_b_deliveries(t: &Intruder, _: &Scene) -> Outcome {
    let job = pb::StageArtifacts { site_id: B.into(), ..Default::default() };
    t.publish(&names::site_deliver(B), job.encode_to_vec()).await
}

/// Flow control of B's durable answered, so its deliveries run on (or stall).
async fn js_flow_control_of_b_durable(t: &Intruder, _: &Scene) -> Outcome {
    t.publish(&format!("$JS.FC.{}.{}.1", names::site_jobs_stream(B), names::gateway_consumer(B)), Vec::new()).await
}

async fn subscribe_every_site_bmc_request(t: &Intruder, _: &Scene) -> Outcome {
    t.subscribe(&names::svc_every_site(names::BMC_CREDENTIALS)).await
}

async fn subscribe_every_event(t: &Intruder, _: &Scene) -> Outcome {
    t.subscribe(names::EVENTS_ALL).await
}

/// One attack tried: its name, the defence meant to stop it, and what happened.
struct Tried {
    name: &'static str,
    defence: Defence,
    outcome: Outcome,
}

macro_rules! attacks {
    ($t:expr, $s:expr; $($defence:ident: $name:ident),* $(,)?) => {{
        let mut tried = Vec::new();
        $(
            let outcome = $name($t, $s).await;
            let defence = Defence::$defence;
            let verdict = if defence.holds(&outcome) { "stopped" } else { "GOT THROUGH" };
            println!("attack {:<52} {verdict:<11} [{defence}] {outcome}", stringify!($name));
            tried.push(Tried { name: stringify!($name), defence, outcome });
        )*
        tried
    }};
}

async fn every_attack(t: &Intruder, s: &Scene) -> Vec<Tried> {
    attacks!(t, s;
        TrustTable: node_added_naming_b_on_own_subject,
        TrustTable: node_removed_of_b_node_on_own_subject,
        Permission: node_added_on_b_subject,
        Permission: node_removed_on_b_subject,
        Permission: install_site_b,
        TrustTable: install_site_own,
        Permission: install_site_own_as_the_hub,
        TrustTable: decommission_own_site,
        Permission: stage_site_b,
        Permission: apply_design_b,
        Permission: register_site_b_with_an_extra_node,
        Permission: register_package_for_the_fleet,
        Permission: patch_package_b,
        Permission: cancel_rollout_waiting_for_b,

        RolloutJob: site_patched_with_b_plan_index,
        TrustTable: site_patched_naming_b,
        RolloutJob: site_patched_with_no_job_sent_to_a,
        RolloutJob: site_patched_past_the_plan,
        TrustTable: node_patched_for_b_node,
        TrustTable: site_patched_carrying_a_report_of_b_node,
        SagaJob: artifacts_staged_in_b_saga,
        SagaJob: node_os_provisioned_in_b_saga,
        SagaJob: cluster_ready_in_b_saga,
        SagaJob: job_failed_in_b_saga,
        SagaJob: node_failed_in_b_saga,
        SagaJob: node_os_provisioned_with_no_job_sent,
        ObserverJob: node_patched_own_node_with_no_job,
        ObserverJob: node_rolled_back_own_node_with_no_job,
        Permission: artifacts_staged_on_b_subject,
        Permission: node_patched_on_b_subject,
        TrustTable: site_installed_on_own_scope,
        Permission: site_installed_on_own_scope_as_the_hub,
        TrustTable: kubeconfig_stored_on_own_scope,
        TrustTable: design_applied_on_own_scope,
        TrustTable: node_accepted_on_own_scope,
        TrustTable: rollout_completed_on_own_scope,

        TrustTable: bmc_credentials_for_b_node_on_own_subject,
        Permission: bmc_credentials_on_b_subject,
        SecretsLease: bmc_credentials_own_node_with_no_job,
        SecretsLease: bmc_credentials_own_node_with_b_saga_job,
        SecretsLease: bmc_credentials_own_node_after_its_install_ended,
        TrustTable: artifact_plan_naming_b,
        TrustTable: artifact_chunk_naming_b,
        Permission: artifact_plan_on_b_subject,
        Permission: artifact_chunk_on_b_subject,
        TrustTable: chart_render_naming_b,
        Permission: chart_render_on_b_subject,

        Permission: js_own_consumer_filtered_on_b_jobs,
        Permission: js_own_consumer_with_b_filter_in_subject,
        Permission: js_own_consumer_unfiltered,
        Permission: js_own_consumer_filtered_on_b_through_hub_domain,
        Permission: js_own_consumer_pinned_subject_with_b_filter_in_body,
        Permission: js_own_consumer_as_push_consumer,
        Permission: js_own_consumer_by_the_legacy_durable_api,
        Permission: js_own_consumer_claims_jobs_of_a_site_not_yet_online,
        Permission: js_fetch_from_b_durable,
        Permission: js_flow_control_of_b_durable,
        Permission: js_ack_b_job,
        Permission: js_delete_b_consumer,
        Permission: js_delete_jobs_stream,
        Permission: js_purge_b_events,
        Permission: js_stream_sourcing_b_jobs,

        Permission: kv_read_b_design,
        Permission: kv_read_b_design_by_message_get,
        Permission: kv_read_b_kubeconfig,
        Permission: kv_read_own_kubeconfig,
        Permission: kv_read_b_bmc_record,
        Permission: kv_write_b_design,
        Permission: kv_overwrite_b_lease,
        Permission: kv_write_b_observed_version,

        Permission: subscribe_shared_inbox,
        Permission: subscribe_kubeconfig_collector_inbox,
        Permission: subscribe_b_gateway_inbox,
        Permission: subscribe_b_site_inbox,
        Permission: reply_as_b_to_the_kubeconfig_collector,
        ReplyInbox: reply_as_own_site_to_the_kubeconfig_collector_unasked,
        Permission: reply_into_orchestrator_inbox,
        Permission: reply_into_kubeconfig_collector_inbox,
        Permission: subscribe_b_rpc,
        Permission: subscribe_b_jobs,
        Permission: subscribe_b_deliveries,
        Permission: job_into_b_deliveries,
        Permission: subscribe_every_site_bmc_request,
        Permission: subscribe_every_event,
    )
}

/// A rollout's record.
async fn rollout(bus: &Bus, id: &str) -> pb::Rollout {
    let sagas = bus.kv(names::SAGAS_BUCKET).await.unwrap();
    sagas.get::<pb::Rollout>(&keys::rollout(id)).await.unwrap().expect("the rollout's record").0
}

/// What a rollout has counted: phase, sites done, nodes patched and failed, and its bits.
fn counters(r: &pb::Rollout) -> (i32, u32, u32, u32, Vec<u8>, Vec<u8>) {
    (r.phase, r.sites_done, r.patched, r.failed, r.done.clone(), r.dispatched.clone())
}

/// Registers kubelet `version` and waits until it is in the catalog.
async fn register_kubelet(fleet: &Fleet, version: &str) {
    let env = Envelope::root();
    let cmd = pb::RegisterPackage { package: Some(kubelet(version)), auto_rollout: None };
    fleet.bus.publish_command(&cmd, &env).await.unwrap();
    let registered = fleet.wait_for(pb::PackageRegistered::filter(), &env.id, Duration::from_secs(30)).await;
    assert!(registered.is_some(), "kubelet {version} was not registered");
}

/// Starts a rollout of kubelet `version` to B alone.
async fn roll_out_to_b(fleet: &Fleet, version: &str) -> Envelope {
    let selector = pb::SiteSelector { site_ids: vec![B.into()], ..Default::default() };
    fleet
        .patch(pb::PatchPackage {
            name: "kubelet".into(),
            version: version.into(),
            selector: Some(selector),
            ..Default::default()
        })
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stolen_site_key_reaches_nothing_of_another_site() {
    let tls_dir = tempfile::tempdir().unwrap();
    let tls = TlsFiles::make(tls_dir.path());
    let d = Deployment::generate(&[A, B], 1, Some(&tls));
    let _hub = d.start_hubs();
    let url = d.hub_urls("tls");
    // With a durable per site, so that the thief also tries the other site's durable (the
    // dispatcher's requests to a site are tried in dispatch.rs).
    let fleet = Fleet::builder(&url)
        .sites(2)
        .nodes(3)
        .with_artifacts()
        .access(d.users(Some(&tls.ca)))
        .durable_per_site()
        .start()
        .await;
    let bus = fleet.bus.clone();
    let b_design = pb::SiteDesign::from(&fleet.sites[1].0);
    // BMC credentials for every host of B, and for one of A's.
    let hosts = b_design.nodes.iter().map(|n| (B, n.name.as_str())).chain([(A, "node-1")]);
    for (site, node) in hosts {
        put_bmc(&bus, site, node, "admin", &format!("pw-{site}-{node}")).await.expect("store BMC credentials");
    }

    // Both sites installed; a rollout patches B.
    let (a_install, b_install) = (fleet.install(A).await, fleet.install(B).await);
    for cmd in [&a_install, &b_install] {
        let run = fleet.wait_install(cmd).await;
        assert_eq!(run.terminal().delivery.type_name, pb::SiteInstalled::TYPE, "{:?}", run.kinds());
    }
    register_kubelet(&fleet, "1.30.0").await;
    register_kubelet(&fleet, "1.30.1").await;
    let r1 = roll_out_to_b(&fleet, "1.30.0").await;
    let run = fleet.wait_rollout(&r1.id, Duration::from_secs(60)).await;
    let done = run.of_type::<pb::RolloutCompleted>().pop().unwrap_or_else(|| panic!("{:?}", run.kinds()));
    assert_eq!((done.patched, done.failed), (3, 0));

    // The hub has recorded B heard (the observer records a site heard before its registration at
    // its next check), so nothing of B is left for the observer to write while A attacks.
    let observed = bus.kv(names::OBSERVED_BUCKET).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while observed.get::<pb::SiteLink>(&keys::link(B)).await.unwrap().is_none() {
        assert!(std::time::Instant::now() < deadline, "B's gateway was never recorded heard");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // B's gateway goes offline; B is installed again (the install waits at staging, holding B's
    // lease), and a second rollout waits for that lease.
    fleet.stop_gateway(1);
    let b_again = fleet.install(B).await;
    let started = fleet.wait_for(pb::SiteInstallStarted::filter(), &b_again.id, Duration::from_secs(30)).await;
    assert!(started.is_some(), "B's second install did not start");
    let r2 = roll_out_to_b(&fleet, "1.30.1").await;
    assert!(fleet.wait_for(pb::RolloutPlanned::filter(), &r2.id, Duration::from_secs(30)).await.is_some());

    let sagas = bus.kv(names::SAGAS_BUCKET).await.unwrap();
    let (b_saga, _) = sagas.get::<pb::InstallSaga>(&keys::saga(&b_again.id)).await.unwrap().expect("B's saga");
    let stage = b_saga.jobs.iter().find(|j| j.kind == pb::StageArtifacts::KIND).expect("the StageArtifacts job");
    let stage_job = pb::StageArtifacts { site_id: B.into(), ..Default::default() };
    let jobs = bus.jetstream().get_stream(names::site_jobs_stream(B)).await.unwrap();
    let pending = jobs.get_last_raw_message_by_subject(&stage_job.subject()).await.expect("B's job waits");
    let key = |role: Role| d.access(&role).public_key().unwrap().unwrap();
    let scene = Scene {
        b_nodes: b_design.nodes.clone(),
        a_install: a_install.id.clone(),
        b_saga: b_again.id.clone(),
        b_stage_job: stage.id.clone(),
        b_job_seq: pending.sequence,
        r1: rollout(&bus, &r1.id).await,
        r2: rollout(&bus, &r2.id).await,
        kubelet: fleet.catalog.iter().find(|p| p.name == "kubelet").expect("kubelet in the catalog").clone(),
        kubeconfig_key: key(Role::Kubeconfig),
        orchestrator_key: key(Role::Orchestrator),
        b_gateway_key: key(Role::Site(B.into())),
    };
    assert_eq!(scene.r2.sites, 1, "the second rollout plans B");
    assert!(!scene.kubelet.object_key.is_empty(), "kubelet's bytes are in the artifact store");

    let before = SiteState::read_settled(&bus, B).await;
    assert!(before.kv.keys().any(|k| k.ends_with(&keys::rollout_site(&r1.id, B))), "B has a rollout record");
    assert!(before.kv.keys().any(|k| k.ends_with(&keys::kubeconfig(B))), "B has a kubeconfig");
    let (r1_before, r2_before) = (counters(&scene.r1), counters(&scene.r2));
    println!(
        "compromised site: B holds {} KV entries, {} events, jobs {:?}; attacking as {A}",
        before.kv.len(),
        before.events.len(),
        before.jobs
    );

    // The thief: A's seed, straight at the hub.
    let thief = Intruder::connect(&url, &d.users(Some(&tls.ca))(&Role::Site(A.into())), bus.clone()).await;
    let tried = every_attack(&thief, &scene).await;

    // Give anything a forgery set off time to land before looking at B.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = SiteState::read(&bus, B).await;
    let mut problems: Vec<String> = tried
        .iter()
        .filter(|t| !t.defence.holds(&t.outcome))
        .map(|t| format!("{} ({} expected): {}", t.name, t.defence, t.outcome))
        .collect();
    let got_through = problems.len();
    problems.extend(before.differences(&after).into_iter().map(|d| format!("B changed: {d}")));
    for (id, was) in [(&r1.id, r1_before), (&r2.id, r2_before)] {
        let now = counters(&rollout(&bus, id).await);
        if now != was {
            problems.push(format!("rollout {id}'s counters moved: {was:?} → {now:?}"));
        }
    }
    println!(
        "compromised site: {} attacks, {} stopped, {got_through} got through; B or a rollout changed in {} way(s)",
        tried.len(),
        tried.len() - got_through,
        problems.len() - got_through
    );
    assert!(problems.is_empty(), "a stolen key of {A} got through:\n  {}", problems.join("\n  "));
    fleet.stop().await;
}
