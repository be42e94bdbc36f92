//! Plain tests of the rollback decisions.

use std::collections::BTreeMap;

use bus_schema::envelope::Envelope;
use bus_schema::pb;

use super::super::{count_site, patch_job, site_report};
use super::*;

fn entry(version: &str) -> pb::Package {
    pb::Package {
        name: "kubelet".into(),
        version: version.into(),
        kind: pb::PackageKind::Binary as i32,
        ..Default::default()
    }
}

/// A completed rollout of kubelet to 1.30.0 over `sites` (plan order), a canary first.
fn undone(sites: u32) -> pb::Rollout {
    pb::Rollout {
        rollout_id: "r1".into(),
        package: Some(pb::PackageRef { name: "kubelet".into(), version: "1.30.0".into() }),
        entry: Some(entry("1.30.0")),
        phase: pb::RolloutPhase::Completed as i32,
        sites,
        strategy: Some(pb::ResolvedStrategy {
            canary_sites: 1,
            max_concurrent_sites: 2,
            failure_threshold: 1,
            approval: pb::ApprovalGate::AfterCanary as i32,
            on_failure: pb::OnNodeFailure::RollBack as i32,
            roll_back_on_halt: true,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A site of the undone plan: nodes n0.. with the versions they ran.
fn planned(site: &str, from: &[&str]) -> pb::RolloutPlanSite {
    pb::RolloutPlanSite {
        site_id: site.into(),
        nodes: (0..from.len())
            .map(|i| pb::NodeSpec { name: format!("n{i}"), role: pb::Role::Worker as i32, ..Default::default() })
            .collect(),
        from_versions: from.iter().map(ToString::to_string).collect(),
        ..Default::default()
    }
}

fn record(patched: &[&str], failed: &[(&str, bool)], unchanged: &[&str], skipped: &[&str]) -> pb::RolloutSite {
    let names = |l: &[&str]| l.iter().map(ToString::to_string).collect::<Vec<_>>();
    pb::RolloutSite {
        patched: names(patched),
        failed: failed
            .iter()
            .map(|(n, back)| pb::NodeResult { node: n.to_string(), rolled_back: *back, ..Default::default() })
            .collect(),
        unchanged: names(unchanged),
        skipped: names(skipped),
        ..Default::default()
    }
}

fn catalog(versions: &[&str]) -> BTreeMap<String, pb::Package> {
    versions.iter().map(|v| (v.to_string(), entry(v))).collect()
}

#[test]
fn only_an_ended_or_stopped_rollout_is_rolled_back_and_only_once() {
    let r = undone(3);
    let refused = |res: Result<Before, crate::decision::Refusal>| res.unwrap_err();
    let unknown = refused(may_roll_back("r9", None, None, false));
    assert_eq!((unknown.code, unknown.reason.as_str()), (pb::RejectCode::Invalid, "there is no rollout r9"));
    assert_eq!(may_roll_back("r1", Some(&r), None, false), Ok(Before::Nothing));

    let running = pb::Rollout { phase: pb::RolloutPhase::Running as i32, ..r.clone() };
    let e = refused(may_roll_back("r1", Some(&running), None, false));
    assert_eq!(e.code, pb::RejectCode::Conflict);
    assert!(
        e.reason.contains("cancel it first (landfall rollout cancel r1), or roll it back with --cancel"),
        "{}",
        e.reason
    );
    assert_eq!(may_roll_back("r1", Some(&running), None, true), Ok(Before::Cancel));
    let halted = pb::Rollout { phase: pb::RolloutPhase::Halted as i32, ..r.clone() };
    assert_eq!(may_roll_back("r1", Some(&halted), None, false), Ok(Before::Cancel), "a halted rollout is ended first");

    let rb = pb::Rollout {
        rollout_id: rollback_id("r1"),
        phase: pb::RolloutPhase::Completed as i32,
        patched: 4,
        planned_nodes: 4,
        rollback_of: "r1".into(),
        ..Default::default()
    };
    let again = refused(may_roll_back("r1", Some(&r), Some(&rb), true));
    assert_eq!(again.code, pb::RejectCode::Conflict);
    assert!(
        again.reason.contains("was rolled back already by rollout") && again.reason.contains("4 of 4 nodes back"),
        "{}",
        again.reason
    );
    let of_a_rollback = refused(may_roll_back(&rb.rollout_id, Some(&rb), None, false));
    assert!(of_a_rollback.reason.contains("a rollback is not rolled back"), "{}", of_a_rollback.reason);
    assert_eq!(rollback_id("r1"), rollback_id("r1"), "one rollback per rollout, whoever asks");
    assert_ne!(rollback_id("r1"), rollback_id("r2"));
}

#[test]
fn a_rollback_moves_back_only_the_nodes_the_rollout_changed_last_sites_first() {
    let r = undone(4);
    let sites = vec![
        // The canary: both nodes patched.
        UndoneSite {
            planned: planned("edge-1", &["1.29.9", "1.29.9"]),
            record: Some(record(&["n0", "n1"], &[], &[], &[])),
        },
        // One patched, one failed and put back by on_failure, one found at the version, one skipped.
        UndoneSite {
            planned: planned("edge-2", &["1.29.8", "1.29.9", "1.29.9", "1.29.9"]),
            record: Some(record(&["n0"], &[("n1", true)], &["n2"], &["n3"])),
        },
        // One failed and left as it was (it may have changed).
        UndoneSite { planned: planned("edge-3", &["1.29.9"]), record: Some(record(&[], &[("n0", false)], &[], &[])) },
        // Its job is out, no report yet (it waited for its window first): every node may have changed.
        UndoneSite {
            planned: planned("edge-4", &["1.28.0", "1.29.9"]),
            record: Some(pb::RolloutSite { state: pb::RolloutSiteState::WaitingWindow as i32, ..Default::default() }),
        },
    ];
    assert_eq!(
        versions_to_go_back_to(&sites).into_iter().collect::<Vec<_>>(),
        ["1.28.0", "1.29.8", "1.29.9"],
        "the unchanged and rolled back nodes' versions are not needed"
    );
    let cmd = Envelope::root();
    let planned =
        rollback_plan(&r, &sites, &catalog(&["1.28.0", "1.29.8", "1.29.9"]), "bad kubelet", &cmd, 1_000).unwrap();
    let rb = &planned.rollout;
    assert_eq!(rb.rollout_id, rollback_id("r1"));
    assert_eq!((rb.rollback_of.as_str(), rb.command_id.as_str()), ("r1", cmd.id.as_str()));
    assert_eq!(rb.trigger, "rollback of rollout r1: bad kubelet");
    let order: Vec<(&str, Vec<&str>, Vec<&str>, bool)> = planned.chunks[0]
        .sites
        .iter()
        .map(|s| {
            let nodes = s.nodes.iter().map(|n| n.name.as_str()).collect();
            (s.site_id.as_str(), nodes, s.to_versions.iter().map(String::as_str).collect(), s.canary)
        })
        .collect();
    assert_eq!(
        order,
        [
            ("edge-4", vec!["n0", "n1"], vec!["1.28.0", "1.29.9"], true),
            ("edge-3", vec!["n0"], vec!["1.29.9"], false),
            ("edge-2", vec!["n0"], vec!["1.29.8"], false),
            ("edge-1", vec!["n0", "n1"], vec!["1.29.9", "1.29.9"], false),
        ],
        "reverse plan order, the last site changed is the rollback's canary"
    );
    assert_eq!((rb.planned_nodes, rb.wave_ends.clone()), (6, vec![1, 3, 4]));
    let strategy = rb.strategy.clone().unwrap();
    assert_eq!(strategy.max_concurrent_sites, 2, "the rollout's own strategy");
    assert_eq!(strategy.failure_threshold, 1);
    assert_eq!(strategy.approval, pb::ApprovalGate::Unspecified as i32, "undoing waits for nobody");
    assert!(!strategy.roll_back_on_halt && strategy.on_failure == pb::OnNodeFailure::Leave as i32);
    assert_eq!(rb.targets.iter().map(|t| t.version.as_str()).collect::<Vec<_>>(), ["1.28.0", "1.29.8", "1.29.9"]);
    let planned_evt: pb::RolloutPlanned =
        prost::Message::decode(rb.outbox[0].payload.as_slice()).expect("RolloutPlanned first");
    assert_eq!((planned_evt.rollback_of.as_str(), planned_evt.nodes_unchanged), ("r1", 3));

    // Each node's job goes to its own version; the site's design follows.
    let mut rb = rb.clone();
    assert!(super::super::mark_dispatched(&mut rb, &[0]));
    let edge4 = planned.chunks[0].sites[0].clone();
    let (job, _) = patch_job(&rb, 0, edge4.clone(), &[], &BTreeMap::new());
    assert_eq!(job.targets.iter().map(|t| t.version.as_str()).collect::<Vec<_>>(), ["1.28.0", "1.29.9"]);
    assert_eq!(job.package.as_ref().map(|p| p.version.as_str()), Some("1.30.0"), "the rollout's package, as reported");
    let report = pb::SitePatched {
        site_id: "edge-4".into(),
        rollout_id: rb.rollout_id.clone(),
        package: rb.package.clone(),
        patched: vec!["n1".into()],
        unchanged: vec!["n0".into()],
        ..Default::default()
    };
    let rep = site_report(&rb, &edge4, &report, &Envelope::root(), 2_000);
    assert_eq!(rep.design_to.map(|p| p.version), Some("1.29.9".to_string()));
    assert_eq!((rep.count.patched, rep.count.unchanged), (1, 1));
}

#[test]
fn a_version_gone_from_the_catalog_refuses_the_rollback() {
    let sites = vec![UndoneSite { planned: planned("edge-1", &["1.29.9"]), record: None }];
    let e = rollback_plan(&undone(1), &sites, &catalog(&[]), "", &Envelope::root(), 1).unwrap_err();
    assert_eq!(e.code, pb::RejectCode::UnknownPackage);
    assert!(e.reason.contains("kubelet@1.29.9, which node n0 of site edge-1 ran before rollout r1"), "{}", e.reason);
    assert_eq!(mark_rolled_back(&undone(1)).map(|r| r.rolled_back_by), Some(rollback_id("r1")));
    assert_eq!(mark_rolled_back(&pb::Rollout { rolled_back_by: rollback_id("r1"), ..undone(1) }), None);
}

#[test]
fn a_rollout_that_rolls_itself_back_asks_for_it_when_it_halts() {
    let mut r = pb::Rollout { phase: pb::RolloutPhase::Running as i32, wave_ends: vec![1, 3], ..undone(3) };
    r.strategy.as_mut().unwrap().failure_threshold = 0;
    let halted = count_site(&r, 0, 1, 1, &Envelope::root(), 10).unwrap();
    assert_eq!(halted.phase, pb::RolloutPhase::Halted as i32);
    let types: Vec<&str> = halted.outbox.iter().map(|e| e.message_type.as_str()).collect();
    assert!(types.contains(&"landfall.v1.RollbackRollout"), "{types:?}");
    let cmd = halted.outbox.iter().find(|e| e.message_type == "landfall.v1.RollbackRollout").unwrap();
    assert_eq!(cmd.subject, "landfall.cmd.fleet.hub.rollback_rollout");
    let cmd: pb::RollbackRollout = prost::Message::decode(cmd.payload.as_slice()).unwrap();
    assert!(cmd.cancel && cmd.rollout_id == "r1" && cmd.reason.contains("failure threshold"), "{cmd:?}");

    let plain = pb::Rollout { strategy: Some(pb::ResolvedStrategy::default()), ..r };
    let halted = count_site(&plain, 0, 1, 1, &Envelope::root(), 10).unwrap();
    assert!(!halted.outbox.iter().any(|e| e.message_type.ends_with("RollbackRollout")));
}

#[test]
fn a_rollout_that_rolls_nodes_back_sends_each_node_what_it_ran() {
    let mut r = pb::Rollout { phase: pb::RolloutPhase::Running as i32, wave_ends: vec![1], ..undone(1) };
    assert!(super::super::mark_dispatched(&mut r, &[0]));
    let site = planned("edge-1", &["1.29.9", "1.29.8"]);
    let (job, _) = patch_job(&r, 0, site.clone(), &[], &catalog(&["1.29.8", "1.29.9"]));
    assert_eq!(job.on_failure, pb::OnNodeFailure::RollBack as i32);
    assert_eq!(job.previous.iter().map(|p| p.version.as_str()).collect::<Vec<_>>(), ["1.29.9", "1.29.8"]);
    assert!(job.targets.is_empty(), "a forward rollout sends every node to its package");
    r.strategy.as_mut().unwrap().on_failure = pb::OnNodeFailure::Leave as i32;
    let (job, _) = patch_job(&r, 0, site, &[], &catalog(&["1.29.8", "1.29.9"]));
    assert!(job.previous.is_empty() && job.on_failure == pb::OnNodeFailure::Leave as i32);
}
