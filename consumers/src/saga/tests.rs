//! Plain, fast tests of the install saga: each calls a pure function of `saga` directly.

use super::*;
use bus_schema::domain::SiteDesign;
use bus_schema::pb::BusMessage;
use prost::Message;

fn sha(c: char) -> String {
    std::iter::repeat_n(c, 64).collect()
}

fn catalog() -> BTreeMap<String, Package> {
    [
        ("ubuntu", "22.04", pb::PackageKind::OsImage, 'a'),
        ("kubelet", "1.29.1", pb::PackageKind::Binary, 'b'),
        ("cni", "1.0", pb::PackageKind::Container, 'c'),
    ]
    .into_iter()
    .map(|(n, v, k, c)| {
        let p = Package {
            name: n.try_into().unwrap(),
            version: v.try_into().unwrap(),
            kind: k,
            sha256: sha(c).try_into().unwrap(),
            size: 10,
            object_key: format!("{n}/{v}"),
            chart: None,
            render: None,
        };
        (format!("{n}@{v}"), p)
    })
    .collect()
}

fn design(nodes: usize) -> SiteDesign {
    let pb_nodes = (0..nodes)
        .map(|i| pb::NodeSpec {
            name: format!("n{i}"),
            role: if i == 0 { pb::Role::Master } else { pb::Role::Worker } as i32,
            boot_mac: format!("52:54:00:00:00:{i:02x}"),
            bmc_address: format!("ipmi://10.0.0.{i}"),
            labels: Default::default(),
            ..Default::default()
        })
        .collect();
    let set: Vec<pb::PackageRef> = [("ubuntu", "22.04"), ("kubelet", "1.29.1"), ("cni", "1.0")]
        .iter()
        .map(|(n, v)| pb::PackageRef { name: n.to_string(), version: v.to_string() })
        .collect();
    SiteDesign::try_from(pb::SiteDesign {
        site_id: "edge-1".into(),
        labels: Default::default(),
        nodes: pb_nodes,
        packages: vec![
            pb::RolePackages { role: pb::Role::Master as i32, packages: set.clone() },
            pb::RolePackages { role: pb::Role::Worker as i32, packages: set },
        ],
        cluster: None,
        chart_values: Default::default(),
        maintenance_windows: Vec::new(),
    })
    .unwrap()
}

fn apply(saga: &pb::InstallSaga, input: Input) -> pb::InstallSaga {
    let cause = Envelope::root();
    match decide(saga, &input, &cause, 1) {
        Decision::Apply(mut s) => {
            s.outbox.clear();
            *s
        }
        other => panic!("{input:?} gave {other:?}"),
    }
}

/// `ClusterReady` of edge-1 with master n0 and `workers`, none failed.
fn cluster_ready(workers: &[&str]) -> pb::ClusterReady {
    pb::ClusterReady {
        site_id: "edge-1".into(),
        masters: vec!["n0".into()],
        workers: workers.iter().map(|w| w.to_string()).collect(),
        failed: vec![],
    }
}

pub(crate) fn started(nodes: usize) -> pb::InstallSaga {
    let d = design(nodes);
    let saga = start(&Envelope::root(), &d, resolve(&d, &catalog()).unwrap(), 0);
    assert_eq!(saga.outbox.len(), 2, "started event and stage job");
    pb::InstallSaga { outbox: vec![], ..saga }
}

#[test]
fn resolve_refuses_unknown_packages_and_missing_images() {
    let d = design(2);
    let mut cat = catalog();
    cat.remove("kubelet@1.29.1");
    assert_eq!(resolve(&d, &cat).unwrap_err().code, pb::RejectCode::UnknownPackage);
    let mut cat = catalog();
    cat.get_mut("ubuntu@22.04").unwrap().kind = pb::PackageKind::Binary;
    assert!(resolve(&d, &cat).unwrap_err().reason.contains("exactly one os-image"));
}

#[test]
fn happy_path_publishes_each_step_once() {
    let saga = started(3);
    let cause = Envelope::root();
    let Decision::Apply(s) = decide(&saga, &Input::Staged, &cause, 1) else { panic!() };
    assert_eq!(s.outbox.iter().filter(|o| o.message_type == pb::ProvisionOs::TYPE).count(), 3);
    let ids: std::collections::BTreeSet<_> = s.outbox.iter().map(|o| o.message_id.clone()).collect();
    assert_eq!(ids.len(), 3, "one distinct id per node");
    // The same input again (a redelivery) changes nothing.
    let s = apply(&saga, Input::Staged);
    assert_eq!(decide(&s, &Input::Staged, &cause, 1), Decision::Ignore);

    let s = apply(&s, Input::OsProvisioned { node: "n0".into() });
    let s = apply(&s, Input::OsProvisioned { node: "n1".into() });
    assert_eq!(decide(&s, &Input::OsProvisioned { node: "n1".into() }, &cause, 1), Decision::Ignore);
    let Decision::Apply(s) = decide(&s, &Input::OsProvisioned { node: "n2".into() }, &cause, 1) else { panic!() };
    assert_eq!(s.phase, InstallPhase::InstallingBinaries as i32);
    assert_eq!(s.outbox.len(), 1);
    assert_eq!(s.outbox[0].message_type, pb::InstallBinaries::TYPE);

    // The kubeconfig may be stored before ClusterReady is processed: wait, don't drop it.
    assert_eq!(decide(&s, &Input::KubeconfigStored, &cause, 1), Decision::Wait);
    let s = apply(&s, Input::ClusterReady(cluster_ready(&["n1", "n2"])));
    let Decision::Apply(s) = decide(&s, &Input::KubeconfigStored, &cause, 1) else { panic!() };
    assert_eq!(s.outbox[0].message_type, pb::ApplyContainerPackages::TYPE);
    let s = pb::InstallSaga { outbox: vec![], ..*s };
    let Decision::Apply(s) = decide(&s, &Input::ContainersApplied, &cause, 1) else { panic!() };
    assert_eq!(s.phase, InstallPhase::Succeeded as i32);
    assert_eq!(s.outbox[0].message_type, pb::SiteInstalled::TYPE);
    let done = pb::SiteInstalled::decode(s.outbox[0].payload.as_slice()).unwrap();
    assert!(done.results.iter().all(|r| r.outcome == pb::NodeOutcome::Succeeded as i32));
    assert_eq!(decide(&s, &Input::ContainersApplied, &cause, 1), Decision::Ignore);
}

#[test]
fn a_cluster_api_site_gets_its_build_with_the_hosts_and_waits_for_them_before_its_cluster() {
    let mut d = design(3);
    d.cluster = bus_schema::domain::ClusterBuild {
        builder: bus_schema::domain::Builder::Capi,
        endpoint: Some(bus_schema::domain::ApiEndpoint { host: "10.0.0.100".parse().unwrap(), port: 6443 }),
        ..Default::default()
    }
    .with_defaults(1);
    let saga = start(&Envelope::root(), &d, resolve(&d, &catalog()).unwrap(), 0);
    let saga = pb::InstallSaga { outbox: vec![], ..saga };
    let cause = Envelope::root();
    let Decision::Apply(s) = decide(&saga, &Input::Staged, &cause, 1) else { panic!() };
    let hosts: Vec<pb::ProvisionOs> = s
        .outbox
        .iter()
        .filter(|o| o.message_type == pb::ProvisionOs::TYPE)
        .map(|o| pb::ProvisionOs::decode(o.payload.as_slice()).unwrap())
        .collect();
    assert_eq!(hosts.len(), 3);
    assert!(hosts.iter().all(|j| j.builder == pb::ClusterBuilder::Capi as i32), "each host is enrolled for CAPM3");
    let builds: Vec<pb::InstallBinaries> = s
        .outbox
        .iter()
        .filter(|o| o.message_type == pb::InstallBinaries::TYPE)
        .map(|o| pb::InstallBinaries::decode(o.payload.as_slice()).unwrap())
        .collect();
    assert_eq!(builds.len(), 1, "the build goes with the hosts: CAPM3 provisions them");
    assert_eq!(builds[0].nodes.len(), 3);
    assert!(builds[0].design.as_ref().is_some_and(|d| d.cluster.is_some()));
    assert_eq!(builds[0].images.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["ubuntu"]);

    // A node that came up before the saga saw every host provisioned waits its turn.
    let s = pb::InstallSaga { outbox: vec![], ..*s };
    assert_eq!(decide(&s, &Input::BinariesInstalled { node: "n0".into() }, &cause, 1), Decision::Wait);
    let s = apply(&s, Input::OsProvisioned { node: "n0".into() });
    let s = apply(&s, Input::OsProvisioned { node: "n1".into() });
    let Decision::Apply(s) = decide(&s, &Input::OsProvisioned { node: "n2".into() }, &cause, 1) else { panic!() };
    assert_eq!(s.phase, InstallPhase::InstallingBinaries as i32);
    assert!(s.outbox.is_empty(), "no second build: {:?}", s.outbox);
    assert_eq!(s.jobs.iter().filter(|j| j.kind == pb::InstallBinaries::KIND).count(), 1);
    let s = apply(&s, Input::ClusterReady(cluster_ready(&["n1", "n2"])));
    assert_eq!(s.phase, InstallPhase::CollectingKubeconfig as i32);
}

#[test]
fn each_phase_is_timed_from_when_the_saga_entered_it() {
    let saga = start(&Envelope::root(), &design(2), resolve(&design(2), &catalog()).unwrap(), 1_000);
    assert_eq!(saga.phase_started_unix_ms, 1_000);
    let cause = Envelope::root();
    let Decision::Apply(s) = decide(&saga, &Input::Staged, &cause, 3_500) else { panic!("staged applies") };
    assert_eq!(s.phase_started_unix_ms, 3_500);
    assert_eq!(phase_left(&saga, &s), Some(("staging", 2.5)));
    let inspecting = Input::OsState { node: "n0".into(), state: "inspecting".into() };
    let Decision::Apply(t) = decide(&s, &inspecting, &cause, 4_000) else { panic!("a new Metal3 state applies") };
    assert_eq!((t.phase_started_unix_ms, phase_left(&s, &t)), (3_500, None), "same phase: nothing left");
    let old = pb::InstallSaga { phase_started_unix_ms: 0, ..(*t).clone() };
    let next = pb::InstallSaga { phase: InstallPhase::Failed as i32, phase_started_unix_ms: 9_000, ..(*t).clone() };
    assert_eq!(phase_left(&old, &next), None, "a saga from before phases were timed");
    assert_eq!(phase_left(&t, &next), Some(("provisioning_os", 5.5)));
}

#[test]
fn a_failed_worker_gives_partial_success_naming_it() {
    let s = apply(&started(3), Input::Staged);
    let s = apply(&s, Input::OsProvisioned { node: "n0".into() });
    let s =
        apply(&s, Input::NodeFailed { node: "n2".into(), step: "provision_os".into(), reason: "disk on fire".into() });
    let Decision::Apply(s) = decide(&s, &Input::OsProvisioned { node: "n1".into() }, &Envelope::root(), 1) else {
        panic!()
    };
    let job = pb::InstallBinaries::decode(s.outbox[0].payload.as_slice()).unwrap();
    assert_eq!(job.nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(), ["n0", "n1"]);
    let s = pb::InstallSaga { outbox: vec![], ..*s };
    let s = apply(&s, Input::ClusterReady(cluster_ready(&["n1"])));
    let s = apply(&s, Input::KubeconfigStored);
    let Decision::Apply(s) = decide(&s, &Input::ContainersApplied, &Envelope::root(), 1) else { panic!() };
    let failed = pb::SiteInstallFailed::decode(s.outbox[0].payload.as_slice()).unwrap();
    assert_eq!(failed.outcome, pb::InstallOutcome::PartialSuccess as i32);
    assert_eq!(failed.failed_nodes, ["n2"]);
    assert!(failed.reason.contains("disk on fire"), "{}", failed.reason);
    assert_eq!(failed.results.iter().filter(|r| r.outcome == pb::NodeOutcome::Succeeded as i32).count(), 2);
}

#[test]
fn losing_the_only_master_stops_the_install() {
    let s = apply(&started(2), Input::Staged);
    let s = apply(&s, Input::OsProvisioned { node: "n1".into() });
    let Decision::Apply(s) = decide(
        &s,
        &Input::NodeFailed { node: "n0".into(), step: "provision_os".into(), reason: "x".into() },
        &Envelope::root(),
        1,
    ) else {
        panic!()
    };
    assert_eq!(s.phase, InstallPhase::Failed as i32);
    let failed = pb::SiteInstallFailed::decode(s.outbox[0].payload.as_slice()).unwrap();
    assert!(failed.reason.contains("no master"));
}

#[test]
fn a_job_failure_ends_the_saga() {
    let s = started(2);
    let Decision::Apply(s) = decide(
        &s,
        &Input::JobFailed { job: "stage_artifacts".into(), reason: "checksum mismatch".into() },
        &Envelope::root(),
        1,
    ) else {
        panic!()
    };
    assert!(is_terminal(&s));
    assert_eq!(s.outcome, pb::InstallOutcome::Failure as i32);
}

#[test]
fn a_joining_worker_gets_os_and_binaries_then_node_ready() {
    let d = design(3);
    let saga = start_join(&Envelope::root(), &d, "n2", None, resolve(&d, &catalog()).unwrap(), 0);
    assert!(saga.join);
    let kinds: Vec<_> = saga.outbox.iter().map(|o| o.message_type.as_str()).collect();
    assert_eq!(kinds, [pb::NodeAccepted::TYPE, pb::StageArtifacts::TYPE]);
    let saga = pb::InstallSaga { outbox: vec![], ..saga };
    let Decision::Apply(s) = decide(&saga, &Input::Staged, &Envelope::root(), 1) else { panic!() };
    assert_eq!(s.outbox.len(), 1, "only the new node is provisioned");
    let s = pb::InstallSaga { outbox: vec![], ..*s };
    let Decision::Apply(s) = decide(&s, &Input::OsProvisioned { node: "n2".into() }, &Envelope::root(), 1) else {
        panic!()
    };
    let job = pb::InstallBinaries::decode(s.outbox[0].payload.as_slice()).unwrap();
    assert!(job.join_existing, "a worker alone joins the running cluster");
    let s = pb::InstallSaga { outbox: vec![], ..*s };
    let Decision::Apply(s) = decide(&s, &Input::BinariesInstalled { node: "n2".into() }, &Envelope::root(), 1) else {
        panic!()
    };
    assert_eq!(s.phase, InstallPhase::Succeeded as i32);
    let ready = pb::NodeReady::decode(s.outbox[0].payload.as_slice()).unwrap();
    assert_eq!((ready.node.as_str(), ready.packages.len()), ("n2", 3));
}

#[test]
fn a_joining_node_that_fails_says_where() {
    let d = design(2);
    let saga = start_join(&Envelope::root(), &d, "n1", None, resolve(&d, &catalog()).unwrap(), 0);
    let s = apply(&pb::InstallSaga { outbox: vec![], ..saga }, Input::Staged);
    let fail = Input::NodeFailed { node: "n1".into(), step: "provision_os".into(), reason: "bad disk".into() };
    let Decision::Apply(s) = decide(&s, &fail, &Envelope::root(), 1) else { panic!() };
    assert_eq!(s.phase, InstallPhase::Failed as i32);
    let failed = pb::NodeJoinFailed::decode(s.outbox[0].payload.as_slice()).unwrap();
    assert_eq!((failed.step.as_str(), failed.reason.as_str()), ("provision_os", "bad disk"));
}

#[test]
fn a_site_report_counts_only_as_the_answer_to_a_job_the_saga_sent_that_site() {
    let saga = started(2);
    let site = saga.site_id.clone();
    let Decision::Apply(s) = decide(&saga, &Input::Staged, &Envelope::root(), 1) else { panic!() };
    let provision = s.outbox.iter().find(|o| o.message_type == pb::ProvisionOs::TYPE).unwrap();
    let job = Envelope { id: provision.message_id.clone(), ..Envelope::root() };
    let answer = job.derive("os_provisioned", Some("n0"));
    let provisioned = [pb::ProvisionOs::KIND];
    assert_eq!(check_answer(&s, &site, &provisioned, Some("n0"), &answer), Ok(()));

    // Another site speaking of this saga.
    let e = check_answer(&s, "edge-9", &provisioned, Some("n0"), &answer).unwrap_err();
    assert!(e.contains(&format!("is site {site}'s, not site edge-9's")), "{e}");
    // Another node of the saga, answered with n0's job.
    let e = check_answer(&s, &site, &provisioned, Some("n1"), &answer).unwrap_err();
    assert!(e.contains("is not about node n1"), "{e}");
    // A node the saga does not have.
    let e = check_answer(&s, &site, &provisioned, Some("intruder"), &answer).unwrap_err();
    assert!(e.contains("has no node intruder"), "{e}");
    // A job the saga never sent.
    let e = check_answer(&s, &site, &provisioned, Some("n0"), &Envelope::root().derive("x", None)).unwrap_err();
    assert!(e.contains("sent site"), "{e}");
    // The answer to another kind of job (a stage job answered as if it provisioned a node).
    let stage = saga.jobs.iter().find(|j| j.kind == pb::StageArtifacts::KIND).expect("the stage job is recorded");
    let e = check_answer(
        &s,
        &site,
        &provisioned,
        Some("n0"),
        &Envelope { id: stage.id.clone(), ..Envelope::root() }.derive("y", None),
    )
    .unwrap_err();
    assert!(e.contains("a stage_artifacts job is not answered"), "{e}");
    // Every job sent is recorded, with the id the outbox publishes it under.
    let sent: Vec<_> = s.jobs.iter().map(|j| j.id.clone()).collect();
    for o in s.outbox.iter().filter(|o| o.subject.starts_with("landfall.job.")) {
        assert!(sent.contains(&o.message_id), "{}", o.subject);
    }
}
