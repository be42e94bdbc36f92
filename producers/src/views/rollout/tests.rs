//! The rollout read model's tests: what `rollout show` and `list` say.

use super::*;
use crate::testing::a_plan;

fn a_rollout() -> pb::Rollout {
    pb::Rollout {
        rollout_id: "0190".into(),
        package: Some(pb::PackageRef { name: "kubelet".into(), version: "1.30.0".into() }),
        phase: pb::RolloutPhase::Running as i32,
        sites: 3,
        planned_nodes: 4,
        wave_ends: vec![1, 3],
        wave: 1,
        patched: 2,
        failed: 1,
        sites_done: 1,
        trigger: "operator".into(),
        started_unix_ms: 1_700_000_000_000,
        ..Default::default()
    }
}

fn plan_sites() -> Vec<(u32, pb::RolloutPlanSite)> {
    a_plan()
        .sites
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let site = pb::RolloutPlanSite {
                site_id: s.site.clone(),
                nodes: s.nodes.iter().map(|n| n.spec.clone()).collect(),
                from_versions: s.nodes.iter().map(|n| n.from_version.clone()).collect(),
                canary: s.canary,
                to_versions: vec![],
            };
            (i as u32, site)
        })
        .collect()
}

#[test]
fn show_tells_every_node_once_with_what_happened() {
    let records: BTreeMap<String, pb::RolloutSite> = [
        pb::RolloutSite {
            site_id: "edge-05".into(),
            state: pb::RolloutSiteState::Done as i32,
            patched: vec!["node-1".into()],
            ..Default::default()
        },
        pb::RolloutSite {
            site_id: "edge-01".into(),
            state: pb::RolloutSiteState::Patching as i32,
            failed: vec![pb::NodeResult {
                node: "node-2".into(),
                failed_step: "patch".into(),
                reason: "disk full".into(),
                ..Default::default()
            }],
            ..Default::default()
        },
    ]
    .into_iter()
    .map(|r| (r.site_id.clone(), r))
    .collect();
    let observed = [(("edge-05".to_string(), "node-1".to_string()), "1.30.0".to_string())].into();
    let sites = rollout_sites(&a_rollout(), &plan_sites(), &records, &observed, None);
    let statuses: Vec<(&str, usize, &str, NodeStatus)> = sites
        .iter()
        .flat_map(|s| s.nodes.iter().map(move |n| (s.site.as_str(), s.wave, n.node.as_str(), n.status.clone())))
        .collect();
    assert_eq!(
        statuses,
        [
            ("edge-05", 0, "node-1", NodeStatus::Patched(1)),
            ("edge-01", 1, "node-1", NodeStatus::Patching),
            (
                "edge-01",
                1,
                "node-2",
                NodeStatus::Failed { step: "patch".into(), reason: "disk full".into(), rollback: String::new() }
            ),
            ("edge-02", 1, "node-1", NodeStatus::Pending),
        ]
    );
    assert_eq!(sites[2].state, "pending");
    assert_eq!(sites[0].nodes[0].observed.as_deref(), Some("1.30.0"));
    let text = rollout_show_text(&a_rollout(), &sites);
    assert!(text.contains("phase     running"), "{text}");
    assert!(text.contains("wave 2/2"), "{text}");
    assert!(text.contains("\nwave 1 (canary)\n  edge-05 (canary): done, 1 node\n"), "{text}");
    assert!(text.contains("node-1  worker  1.29.2 → 1.30.0  patched  (runs 1.30.0)"), "{text}");
    assert!(text.contains("node-2  worker  (none) → 1.30.0  failed: patch: disk full"), "{text}");
    assert!(text.contains("  edge-02: pending, 1 node\n    node-1  worker  1.28.0 → 1.30.0  pending"), "{text}");
    assert!(text.contains("nodes     4 in the plan, 1 patched, 1 failed, 1 patching, 1 pending"), "{text}");
    assert!(text.contains("every patched node was patched once"), "{text}");
    let json = rollout_show_json(&a_rollout(), &sites);
    assert_eq!(json["rollout"]["phase"], "running");
    assert_eq!(json["rollout"]["nodes"]["pending"], 1);
    assert_eq!(json["sites"][0]["nodes"][0]["times_patched"], 1);
    assert_eq!(json["sites"][1]["nodes"][1]["reason"], "disk full");
    assert_eq!(json["sites"][2]["state"], "pending");
}

#[test]
fn show_flags_a_node_patched_twice_or_not_planned() {
    let records: BTreeMap<String, pb::RolloutSite> = [pb::RolloutSite {
        site_id: "edge-05".into(),
        state: pb::RolloutSiteState::Done as i32,
        patched: vec!["node-1".into(), "node-1".into(), "node-9".into()],
        ..Default::default()
    }]
    .into_iter()
    .map(|r| (r.site_id.clone(), r))
    .collect();
    let sites = rollout_sites(&a_rollout(), &plan_sites(), &records, &BTreeMap::new(), None);
    assert_eq!(sites[0].nodes[0].status, NodeStatus::Patched(2));
    assert!(!sites[0].nodes[1].planned);
    let text = rollout_show_text(&a_rollout(), &sites);
    assert!(text.contains("patched 2 times"), "{text}");
    assert!(text.contains("(not in the plan)"), "{text}");
    assert!(text.contains("1 patched more than once!"), "{text}");
}

#[test]
fn sites_of_a_cancelled_rollout_never_start() {
    let cancelled = pb::Rollout { phase: pb::RolloutPhase::Cancelled as i32, ..a_rollout() };
    let sites = rollout_sites(&cancelled, &plan_sites(), &BTreeMap::new(), &BTreeMap::new(), None);
    assert!(sites.iter().all(|s| s.state == "not_started"));
    assert!(sites.iter().flat_map(|s| &s.nodes).all(|n| n.status == NodeStatus::NotStarted));
    let text = rollout_show_text(&cancelled, &sites);
    assert!(text.contains("edge-02: not started, 1 node"), "{text}");
    assert!(text.contains("nodes     4 in the plan, 4 not started\n"), "{text}");
    let s = pb::ResolvedStrategy { max_unavailable: "25%".into(), failure_threshold: 1, ..Default::default() };
    assert_eq!(
        strategy_text(&s),
        "every site at once, 25% of a site's nodes at once, halts when more than 1 node fail"
    );
    let s = pb::ResolvedStrategy { canary_sites: 2, max_concurrent_sites: 5, wave_timeout_seconds: 600, ..s };
    assert!(strategy_text(&s).starts_with("2 canary sites first, 5 sites at once"), "{}", strategy_text(&s));
    assert!(strategy_text(&s).ends_with("wave timeout 10m00s (abort)"), "{}", strategy_text(&s));
}

#[test]
fn rollouts_list_newest_first() {
    let mut all = vec![
        pb::Rollout { rollout_id: "a".into(), started_unix_ms: 1, ..a_rollout() },
        pb::Rollout { rollout_id: "b".into(), started_unix_ms: 3, ..a_rollout() },
        pb::Rollout { rollout_id: "c".into(), started_unix_ms: 2, wave_ends: vec![], ..a_rollout() },
    ];
    sort_newest_first(&mut all);
    assert_eq!(all.iter().map(|r| r.rollout_id.as_str()).collect::<Vec<_>>(), ["b", "c", "a"]);
    let text = rollouts_text(&all);
    let row = text.lines().nth(1).unwrap();
    assert!(row.starts_with("b ") && row.contains("kubelet@1.30.0") && row.contains("2/4"), "{row}");
    assert!(text.lines().nth(2).unwrap().contains("  -  "), "no waves: {text}");
    let json = rollout_summary_json(&all[0]);
    assert_eq!((json["wave"].as_u64(), json["waves"].as_u64()), (Some(2), Some(2)));
    assert!(rollouts_text(&[]).starts_with("no rollouts"));
}

#[test]
fn rollout_ids_must_be_uuids() {
    assert!(rollout_id("nope").unwrap_err().to_string().contains("not a rollout id"));
    let id = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b";
    assert_eq!(rollout_id(&format!(" {id} ")).unwrap(), id);
}

/// The undone rollout says what its rollback did to each node it changed; the rollback says
/// where each node went back to; a site outside its window says when it opens.
#[test]
fn show_says_rolled_back_per_node_and_waiting_for_a_window() {
    let rollback = "9f00";
    let undone = pb::Rollout {
        rolled_back_by: rollback.into(),
        phase: pb::RolloutPhase::Cancelled as i32,
        dispatched: vec![0b011],
        ..a_rollout()
    };
    let node = |n: &str| n.to_string();
    let records: BTreeMap<String, pb::RolloutSite> = [
        pb::RolloutSite {
            site_id: "edge-05".into(),
            state: pb::RolloutSiteState::Done as i32,
            patched: vec![node("node-1")],
            ..Default::default()
        },
        pb::RolloutSite {
            site_id: "edge-01".into(),
            state: pb::RolloutSiteState::Done as i32,
            unchanged: vec![node("node-1")],
            failed: vec![pb::NodeResult {
                node: node("node-2"),
                reason: "not Ready".into(),
                rollback: "rolled back to 1.29.2, healthy again".into(),
                rolled_back: true,
                ..Default::default()
            }],
            ..Default::default()
        },
        pb::RolloutSite {
            site_id: "edge-02".into(),
            state: pb::RolloutSiteState::WaitingWindow as i32,
            window_opens_unix_ms: 1_700_000_600_000,
            ..Default::default()
        },
    ]
    .into_iter()
    .map(|r| (r.site_id.clone(), r))
    .collect();
    let undo: BTreeMap<String, pb::RolloutSite> =
        [("edge-05".to_string(), pb::RolloutSite { patched: vec![node("node-1")], ..Default::default() })].into();
    let sites = rollout_sites(&undone, &plan_sites(), &records, &BTreeMap::new(), Some(&undo));
    let text = rollout_show_text(&undone, &sites);
    assert!(text.contains("phase     cancelled, undone"), "{text}");
    assert!(text.contains(&format!("undone by rollout {rollback}")), "{text}");
    assert!(text.contains("1.29.2 → 1.30.0  patched  [rolled back]"), "{text}");
    assert!(
        text.contains("at the version already, left as it was\n"),
        "a node it never changed has no rollback: {text}"
    );
    assert!(text.contains("failed: not Ready; rolled back to 1.29.2, healthy again\n"), "{text}");
    assert!(
        text.contains("waiting for the site's maintenance window (opens 2023-11-14T22:23:20"),
        "a site not started waits for its window: {text}"
    );

    let rb = pb::Rollout {
        rollout_id: rollback.into(),
        rollback_of: "0190".into(),
        phase: pb::RolloutPhase::Completed as i32,
        targets: vec![pb::Package { version: "1.29.2".into(), ..Default::default() }],
        ..a_rollout()
    };
    let plan = vec![(
        0,
        pb::RolloutPlanSite {
            site_id: "edge-05".into(),
            nodes: vec![pb::NodeSpec { name: node("node-1"), ..Default::default() }],
            from_versions: vec!["1.30.0".into()],
            to_versions: vec!["1.29.2".into()],
            canary: true,
        },
    )];
    let sites = rollout_sites(&rb, &plan, &undo, &BTreeMap::new(), None);
    let text = rollout_show_text(&rb, &sites);
    assert!(text.contains("phase     rolled back"), "{text}");
    assert!(text.contains("package   kubelet 1.30.0 → back to 1.29.2"), "{text}");
    assert!(text.contains("undoes    rollout 0190"), "{text}");
    assert!(text.contains("1.30.0 → 1.29.2  rolled back"), "{text}");
    assert_eq!(rollout_show_json(&rb, &sites)["rollout"]["undo"], "rolled back");
}
