//! The read model, fed KV changes by hand: its counts and what it keeps.

use super::*;

fn model() -> Model {
    Model { state: Arc::new(RwLock::new(State::default())) }
}

fn put(m: &Model, bucket: &str, key: &str, value: &impl Message) {
    let value = Some(bytes::Bytes::from(value.encode_to_vec()));
    m.apply(bucket, KvChange { key: key.into(), value, revision: 0, caught_up: true });
    checked(m);
}

fn purge(m: &Model, bucket: &str, key: &str) {
    m.apply(bucket, KvChange { key: key.into(), value: None, revision: 0, caught_up: true });
    checked(m);
}

/// The counts kept change by change are the counts of every site from scratch.
fn checked(m: &Model) {
    let mut st = m.write();
    let (kept, facts) = (*st.counts(), st.facts.clone());
    st.recount();
    assert_eq!(kept, *st.counts());
    assert_eq!(facts, st.facts);
}

fn design(site: &str, nodes: &[&str]) -> pb::SiteDesign {
    let nodes = nodes.iter().map(|n| pb::NodeSpec { name: n.to_string(), ..Default::default() }).collect();
    pb::SiteDesign { site_id: site.into(), nodes, ..Default::default() }
}

fn saga(id: &str, site: &str, phase: pb::InstallPhase, nodes: &[(&str, pb::NodeStep)]) -> pb::InstallSaga {
    pb::InstallSaga {
        saga_id: id.into(),
        site_id: site.into(),
        phase: phase as i32,
        started_unix_ms: 1000,
        nodes: nodes
            .iter()
            .map(|(n, step)| pb::NodeProgress {
                node: Some(pb::NodeSpec {
                    name: n.to_string(),
                    boot_mac: "52:54:00:00:00:01".into(),
                    ..Default::default()
                }),
                step: *step as i32,
                ..Default::default()
            })
            .collect(),
        jobs: vec![pb::SentJob { id: "job".into(), kind: "provision_os".into(), nodes: vec!["m1".into()] }],
        ..Default::default()
    }
}

fn pointer(site: &str, saga: &str) -> pb::SiteLease {
    pb::SiteLease { site_id: site.into(), saga_id: saga.into(), ..Default::default() }
}

#[test]
fn the_overview_counts_follow_every_change_of_a_site() {
    use pb::{InstallPhase as P, NodeStep as S};
    let m = model();
    let sagas = names::SAGAS_BUCKET;
    put(&m, names::SITES_BUCKET, &keys::site("edge-01"), &design("edge-01", &["m1", "w1"]));
    put(&m, names::SITES_BUCKET, &keys::site("edge-02"), &design("edge-02", &["m1"]));
    assert_eq!(m.read().counts().by_state, [2, 0, 0, 0, 0]);

    // An install: its lease, its saga, the pointer to it, its progress, its end.
    put(&m, sagas, "lease.edge-01", &pointer("edge-01", "s1"));
    put(&m, sagas, "saga.s1", &saga("s1", "edge-01", P::Staging, &[("m1", S::Pending), ("w1", S::Pending)]));
    put(&m, sagas, "latest.edge-01", &pointer("edge-01", "s1"));
    let provisioning = saga("s1", "edge-01", P::ProvisioningOs, &[("m1", S::OsProvisioned), ("w1", S::OsProvisioning)]);
    put(&m, sagas, "saga.s1", &provisioning);
    {
        let st = m.read();
        assert_eq!((st.counts().busy, st.counts().by_state), (1, [1, 1, 0, 0, 0]));
        assert_eq!(st.counts().by_step, [1, 0, 1, 1, 0, 0]);
        // What views do not read is not kept.
        let kept = &st.sagas["s1"];
        assert!(kept.jobs.is_empty() && kept.nodes[0].node.as_ref().is_some_and(|n| n.boot_mac.is_empty()));
    }
    put(&m, sagas, "saga.s1", &saga("s1", "edge-01", P::Succeeded, &[("m1", S::BinariesInstalled), ("w1", S::Failed)]));
    purge(&m, sagas, "lease.edge-01");
    assert_eq!(m.read().counts().by_step, [1, 0, 0, 0, 1, 1]);

    // The failed worker joins again, and is ready.
    let mut join = saga("j1", "edge-01", P::Succeeded, &[("w1", S::BinariesInstalled)]);
    (join.join, join.started_unix_ms) = (true, 2000);
    put(&m, sagas, "saga.j1", &join);
    assert_eq!(m.read().counts().by_step, [1, 0, 0, 0, 2, 0]);

    // Compacted: the install's summary stands in for it, with no per-node detail.
    let summary = pb::SagaSummary {
        saga_id: "s1".into(),
        site_id: "edge-01".into(),
        phase: P::Succeeded as i32,
        started_unix_ms: 1000,
        ..Default::default()
    };
    put(&m, sagas, "summary.saga.s1", &summary);
    purge(&m, sagas, "saga.s1");
    assert_eq!(m.read().counts().by_state, [1, 0, 1, 0, 0]);

    // A node's reports, then the site removed.
    for (node, name) in [("w1", "kubelet"), ("w1", "containerd"), ("m1", "kubelet")] {
        let o = pb::ObservedVersion {
            site_id: "edge-01".into(),
            node: node.into(),
            name: name.into(),
            version: "1.29.2".into(),
            ..Default::default()
        };
        put(&m, names::OBSERVED_BUCKET, &keys::observed("edge-01", node, name), &o);
    }
    {
        let st = m.read();
        let nodes = &st.observed["edge-01"];
        let names: Vec<&str> = nodes["w1"].iter().map(|r| &*r.name).collect();
        assert_eq!(names, ["containerd", "kubelet"]);
        assert!(Arc::ptr_eq(&nodes["w1"][1].name, &nodes["m1"][0].name), "one copy of each name");
    }
    purge(&m, names::OBSERVED_BUCKET, &keys::observed("edge-01", "w1", "kubelet"));
    purge(&m, names::OBSERVED_BUCKET, &keys::observed("edge-01", "m1", "kubelet"));
    assert_eq!(m.read().observed["edge-01"].keys().map(|n| &**n).collect::<Vec<_>>(), ["w1"]);
    purge(&m, names::SITES_BUCKET, &keys::site("edge-01"));
    let st = m.read();
    assert_eq!((st.counts().sites, st.counts().by_state, st.counts().nodes()), (1, [1, 0, 0, 0, 0], 1));
}

#[test]
fn a_cut_off_site_is_counted_and_shown_from_its_record_or_its_event_whichever_comes_first() {
    use pb::BusMessage;
    let m = model();
    put(&m, names::SITES_BUCKET, &keys::site("edge-01"), &design("edge-01", &["m1"]));
    let link = |state: pb::LinkState, since: i64| pb::SiteLink {
        site_id: "edge-01".into(),
        state: state as i32,
        since_unix_ms: since,
        ..Default::default()
    };
    put(&m, names::OBSERVED_BUCKET, &keys::link("edge-01"), &link(pb::LinkState::Up, 1_000));
    assert_eq!(m.read().counts().cut_off, 0);

    // The event of the cut comes first; its record after.
    let cut =
        pb::SiteCutOff { site_id: "edge-01".into(), since_unix_ms: 5_000, outbox_waiting: 3, ..Default::default() };
    let from_event = link_of_event(pb::SiteCutOff::TYPE, &cut.encode_to_vec()).unwrap();
    m.write().link(from_event);
    checked(&m);
    assert_eq!(m.read().counts().cut_off, 1);
    assert!(m.read().facts("edge-01").is_some_and(|f| f.cut_off));
    put(&m, names::OBSERVED_BUCKET, &keys::link("edge-01"), &link(pb::LinkState::CutOff, 5_000));
    assert_eq!(m.read().counts().cut_off, 1);

    // The record of the link back comes first; the cut's event, read again late, changes nothing.
    put(&m, names::OBSERVED_BUCKET, &keys::link("edge-01"), &link(pb::LinkState::Up, 9_000));
    m.write().link(link_of_event(pb::SiteCutOff::TYPE, &cut.encode_to_vec()).unwrap());
    checked(&m);
    assert_eq!(m.read().counts().cut_off, 0);
    assert_eq!(m.read().links["edge-01"].since_unix_ms, 9_000);

    // Removed: forgotten.
    purge(&m, names::OBSERVED_BUCKET, &keys::link("edge-01"));
    assert!(m.read().links.is_empty());
}

#[test]
fn strings_no_record_holds_are_dropped() {
    let mut strings = Strings::default();
    let kept = strings.get("kept");
    for i in 0..5000 {
        strings.get(&format!("gone-{i}"));
    }
    assert!(strings.set.len() < 2100, "{} strings kept", strings.set.len());
    assert!(Arc::ptr_eq(&kept, &strings.get("kept")));
}

#[test]
fn the_steps_of_a_node_out_of_service_read_as_its_state_until_it_is_back() {
    use pb::BusMessage;
    let of = |t: &str, payload: Vec<u8>| service_of_node_event(t, &payload).map(|(_, _, s)| s);
    let cordoned = pb::NodeCordoned { site_id: "edge-01".into(), node: "w1".into(), rollout_id: "r".into() };
    assert_eq!(
        service_of_node_event(pb::NodeCordoned::TYPE, &cordoned.encode_to_vec()),
        Some(("edge-01".to_string(), "w1".to_string(), Service::Out("cordoned")))
    );
    let drained = pb::NodeDrained { site_id: "edge-01".into(), node: "w1".into(), ..Default::default() };
    assert_eq!(of(pb::NodeDrained::TYPE, drained.encode_to_vec()), Some(Service::Out("drained")));
    let back = pb::NodeUncordoned { site_id: "edge-01".into(), node: "w1".into(), rollout_id: "r".into() };
    assert_eq!(of(pb::NodeUncordoned::TYPE, back.encode_to_vec()), Some(Service::Back));
    let wiped = pb::NodeRetired { site_id: "edge-01".into(), node: "w1".into(), ..Default::default() };
    assert_eq!(of(pb::NodeRetired::TYPE, wiped.encode_to_vec()), Some(Service::Out("wiped")));
    let ready = pb::NodeReady { site_id: "edge-01".into(), node: "w1".into(), ..Default::default() };
    assert_eq!(of(pb::NodeReady::TYPE, ready.encode_to_vec()), Some(Service::Back), "joined again");
    let patched = pb::NodePatched { site_id: "edge-01".into(), node: "w1".into(), ..Default::default() };
    assert_eq!(of(pb::NodePatched::TYPE, patched.encode_to_vec()), Some(Service::BackFromPatch));
    // A failure's held steps: left cordoned (and drained) it stays out; given back, it is back;
    // with no steps it says nothing of the node's service.
    let failed = |steps: Option<pb::NodeSteps>| {
        pb::NodePatchFailed { site_id: "edge-01".into(), node: "w1".into(), steps, ..Default::default() }
            .encode_to_vec()
    };
    let steps = |cordoned, drained, uncordoned| pb::NodeSteps { cordoned, drained, uncordoned, evicted: Vec::new() };
    assert_eq!(of(pb::NodePatchFailed::TYPE, failed(Some(steps(true, false, false)))), Some(Service::Out("cordoned")));
    assert_eq!(of(pb::NodePatchFailed::TYPE, failed(Some(steps(true, true, false)))), Some(Service::Out("drained")));
    assert_eq!(of(pb::NodePatchFailed::TYPE, failed(Some(steps(true, false, true)))), Some(Service::BackFromPatch));
    assert_eq!(of(pb::NodePatchFailed::TYPE, failed(None)), None);
    assert_eq!(service_of_node_event(pb::NodeDrained::TYPE, &[0xff, 0xff]), None, "garbage is no state");
    // Node reports that came in their site's report: each node back as from its own report.
    let site = pb::SitePatched {
        site_id: "edge-01".into(),
        nodes: vec![patched.clone(), pb::NodePatched { node: "w2".into(), ..patched.clone() }],
        ..Default::default()
    };
    let each: Vec<(String, Service)> =
        service_of_event(pb::SitePatched::TYPE, &site.encode_to_vec()).into_iter().map(|(_, n, s)| (n, s)).collect();
    assert_eq!(each, [("w1".to_string(), Service::BackFromPatch), ("w2".to_string(), Service::BackFromPatch)]);
    assert_eq!(service_of_event(pb::NodeUncordoned::TYPE, &back.encode_to_vec()).len(), 1);
    assert!(service_of_event(pb::SitePatched::TYPE, &[0xff, 0xff]).is_empty());
}
