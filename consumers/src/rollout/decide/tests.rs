//! Plain, fast tests of the rollout decisions: each calls a pure function of `decide` directly.

use std::collections::HashMap;

use super::*;

fn rollout(wave_ends: &[u32], threshold: u32) -> pb::Rollout {
    pb::Rollout {
        rollout_id: "r1".into(),
        phase: pb::RolloutPhase::Running as i32,
        sites: *wave_ends.last().unwrap(),
        wave_ends: wave_ends.to_vec(),
        planned_nodes: wave_ends.last().unwrap() * 2,
        strategy: Some(pb::ResolvedStrategy { failure_threshold: threshold, ..Default::default() }),
        ..Default::default()
    }
}

fn kinds(r: &pb::Rollout) -> Vec<String> {
    r.outbox.iter().map(|e| e.message_type.trim_start_matches("landfall.v1.").to_string()).collect()
}

fn plan_site(site: &str, nodes: usize) -> pb::RolloutPlanSite {
    pb::RolloutPlanSite {
        site_id: site.into(),
        nodes: (0..nodes)
            .map(|i| pb::NodeSpec { name: format!("n{i}"), role: pb::Role::Worker as i32, ..Default::default() })
            .collect(),
        ..Default::default()
    }
}

#[test]
fn waves_follow_each_other_and_the_last_completes() {
    let env = Envelope::root();
    let r = rollout(&[1, 3], 0);
    let r = count_site(&r, 0, 2, 0, &env, 10).unwrap();
    assert_eq!(r.wave, 1);
    assert!(kinds(&r).contains(&"RolloutWaveStarted".to_string()), "{:?}", kinds(&r));
    assert!(count_site(&r, 0, 2, 0, &env, 10).is_none(), "a site is counted once");
    let r = pb::Rollout { outbox: vec![], ..r };
    let r = count_site(&r, 2, 2, 0, &env, 11).unwrap();
    assert_eq!(r.phase, pb::RolloutPhase::Running as i32, "site 1 of wave 1 has not reported");
    let r = count_site(&pb::Rollout { outbox: vec![], ..r }, 1, 2, 0, &env, 12).unwrap();
    assert_eq!(r.phase, pb::RolloutPhase::Completed as i32);
    assert_eq!((r.patched, r.sites_done), (6, 3));
    assert!(kinds(&r).contains(&"RolloutCompleted".to_string()));
}

#[test]
fn failures_past_the_threshold_halt_and_resume_starts_a_new_budget() {
    let env = Envelope::root();
    let r = rollout(&[1, 2, 3], 1);
    let r = count_site(&r, 0, 1, 1, &env, 1).unwrap();
    assert_eq!(r.phase, pb::RolloutPhase::Running as i32, "1 failure is within a threshold of 1");
    let r = count_site(&pb::Rollout { outbox: vec![], ..r }, 1, 0, 2, &env, 2).unwrap();
    assert_eq!(r.phase, pb::RolloutPhase::Halted as i32);
    assert!(r.reason.contains("3 node(s) failed"), "{}", r.reason);
    assert_eq!(r.wave, 1, "a halted rollout starts no wave");
    let resumed = resume(&pb::Rollout { outbox: vec![], ..r }, &env, 3).unwrap().unwrap();
    assert_eq!(resumed.phase, pb::RolloutPhase::Running as i32);
    assert_eq!(resumed.wave, 2);
    assert_eq!(failures_counted(&resumed), 0);
}

#[test]
fn an_empty_plan_completes_at_once() {
    let mut r =
        pb::Rollout { wave_ends: vec![], sites: 0, phase: pb::RolloutPhase::Running as i32, ..Default::default() };
    advance(&mut r, 5);
    assert_eq!(r.phase, pb::RolloutPhase::Completed as i32);
}

#[test]
fn bits() {
    let mut b = Vec::new();
    set_bit(&mut b, 9);
    set_bit(&mut b, 0);
    assert!(bit(&b, 9) && bit(&b, 0) && !bit(&b, 1) && !bit(&b, 100));
    assert_eq!(count_bits(&b, 0..16), 2);
}

fn site(id: &str, nodes: usize) -> SiteDesign {
    let set = vec![
        pb::PackageRef { name: "ubuntu".into(), version: "22.04".into() },
        pb::PackageRef { name: "kubelet".into(), version: "1.29.1".into() },
    ];
    SiteDesign::try_from(pb::SiteDesign {
        site_id: id.into(),
        labels: Default::default(),
        nodes: (0..nodes)
            .map(|i| pb::NodeSpec {
                name: format!("n{i}"),
                role: if i == 0 { pb::Role::Master } else { pb::Role::Worker } as i32,
                boot_mac: format!("52:54:00:00:00:{i:02x}"),
                bmc_address: format!("ipmi://10.0.0.{i}"),
                labels: Default::default(),
                ..Default::default()
            })
            .collect(),
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

#[test]
fn a_patch_package_is_planned_in_chunks_and_starts_its_first_wave() {
    let cmd = pb::PatchPackage {
        name: "kubelet".into(),
        version: "1.30.0".into(),
        strategy: Some(pb::RolloutStrategy { canary_sites: 1, ..Default::default() }),
        ..Default::default()
    };
    let req = request(&cmd).unwrap();
    let refused = in_catalog(&req, None).unwrap_err();
    assert_eq!(refused.code, pb::RejectCode::UnknownPackage);
    assert!(refused.reason.starts_with("kubelet@1.30.0 is not in the catalog"), "{}", refused.reason);
    let entry = in_catalog(&req, Some(pb::Package { name: "kubelet".into(), ..Default::default() })).unwrap();

    let designs = [site("edge-1", 2), site("edge-2", 2), site("edge-3", 1)];
    let mut observed = ObservedVersions::new();
    for d in &designs {
        for n in &d.nodes {
            observed.insert((d.site.to_string(), n.name.to_string()), Some("1.29.1".into()));
        }
    }
    observed.insert(("edge-2".into(), "n1".into()), Some("1.30.0".into()));
    let cause = Envelope::root();
    let planned = plan(&cmd, &req, entry, &designs, &observed, &cause, 100).unwrap();
    let r = &planned.rollout;
    assert_eq!((r.rollout_id.as_str(), r.trigger.as_str()), (cause.id.as_str(), "operator"));
    assert_eq!((phase(r), r.sites, r.planned_nodes, r.wave), (pb::RolloutPhase::Running, 3, 4, 0));
    assert_eq!((r.started_unix_ms, r.wave_started_unix_ms, r.chunk_size), (100, 100, CHUNK_SIZE));
    assert_eq!(r.strategy.as_ref().unwrap().canary_sites, 1);
    assert_eq!(kinds(r), ["RolloutPlanned", "RolloutWaveStarted"]);
    assert_eq!((planned.chunks.len(), r.plan_chunks), (1, 1));
    let nodes: usize = planned.chunks[0].sites.iter().map(|s| s.nodes.len()).sum();
    assert_eq!(nodes, 4, "the node at the version already is left alone");
    assert_eq!(wave_range(r, 0), 0..1, "the canary wave");

    let unknown = pb::PatchPackage {
        selector: Some(pb::SiteSelector { site_ids: vec!["edge-9".into()], ..Default::default() }),
        ..cmd.clone()
    };
    let refused = plan(&unknown, &req, pb::Package::default(), &designs, &observed, &cause, 100).unwrap_err();
    assert_eq!(refused.code, pb::RejectCode::UnknownSite);
    let bad = pb::PatchPackage { version: String::new(), ..cmd };
    assert_eq!(request(&bad).unwrap_err().code, pb::RejectCode::Invalid);
}

#[test]
fn nothing_to_patch_completes_at_once() {
    let cmd = pb::PatchPackage { name: "kubelet".into(), version: "1.29.1".into(), ..Default::default() };
    let req = request(&cmd).unwrap();
    let designs = [site("edge-1", 1)];
    let observed = ObservedVersions::from([(("edge-1".into(), "n0".into()), Some("1.29.1".into()))]);
    let planned = plan(&cmd, &req, pb::Package::default(), &designs, &observed, &Envelope::root(), 7).unwrap();
    assert_eq!((phase(&planned.rollout), planned.rollout.finished_unix_ms), (pb::RolloutPhase::Completed, 7));
    assert!(planned.chunks.is_empty());
    assert_eq!(kinds(&planned.rollout), ["RolloutPlanned", "RolloutCompleted"]);
}

#[test]
fn pause_resume_and_cancel_follow_the_phase() {
    let env = Envelope::root();
    let running = rollout(&[2], 0);
    let paused = pause(&running, "", &env).unwrap().unwrap();
    assert_eq!((phase(&paused), paused.reason.as_str()), (pb::RolloutPhase::Paused, "paused by an operator"));
    assert_eq!(kinds(&paused), ["RolloutPaused"]);
    assert_eq!(pause(&paused, "again", &env).unwrap(), None, "paused already");
    let paused = pb::Rollout { outbox: vec![], ..paused };
    let resumed = resume(&paused, &env, 7).unwrap().unwrap();
    assert_eq!(phase(&resumed), pb::RolloutPhase::Running);
    assert!(resumed.reason.is_empty());
    assert_eq!(resumed.failure_base, 0, "a pause keeps the failure budget");
    assert_eq!(resume(&resumed, &env, 8).unwrap(), None, "running already");

    let cancelled = cancel(&resumed, "wrong version", &env, 9).unwrap().unwrap();
    assert_eq!((phase(&cancelled), cancelled.finished_unix_ms), (pb::RolloutPhase::Cancelled, 9));
    assert!(kinds(&cancelled).contains(&"RolloutCancelled".to_string()));
    assert_eq!(cancel(&cancelled, "", &env, 10).unwrap(), None, "cancelled already");
    let refused = pause(&cancelled, "", &env).unwrap_err();
    assert_eq!(refused.code, pb::RejectCode::Conflict);
    assert!(refused.reason.contains("is cancelled and cannot be paused"), "{}", refused.reason);
    assert!(resume(&cancelled, &env, 11).is_err());

    let completed = pb::Rollout { phase: pb::RolloutPhase::Completed as i32, ..rollout(&[1], 0) };
    assert!(cancel(&completed, "", &env, 12).unwrap_err().reason.contains("is completed and cannot be cancelled"));
}

#[test]
fn resuming_a_paused_rollout_whose_wave_finished_starts_the_next() {
    let env = Envelope::root();
    let r = rollout(&[1, 2], 0);
    let paused = pb::Rollout { outbox: vec![], ..pause(&r, "", &env).unwrap().unwrap() };
    let counted = count_site(&paused, 0, 2, 0, &env, 5).unwrap();
    assert_eq!((phase(&counted), counted.wave), (pb::RolloutPhase::Paused, 0), "a paused rollout waits");
    let resumed = resume(&pb::Rollout { outbox: vec![], ..counted }, &env, 6).unwrap().unwrap();
    assert_eq!((resumed.wave, resumed.wave_started_unix_ms), (1, 6));
    assert_eq!(kinds(&resumed), ["RolloutResumed", "RolloutWaveStarted"]);
}

#[test]
fn a_site_report_is_recorded_and_counted_once() {
    let env = Envelope::root();
    let node = |n: &str| pb::NodeResult { node: n.into(), ..Default::default() };
    let e = pb::SitePatched {
        rollout_id: "r1".into(),
        site_id: "edge-2".into(),
        plan_index: 1,
        package: Some(pb::PackageRef { name: "kubelet".into(), version: "1.30.0".into() }),
        patched: vec!["n0".into(), "n1".into()],
        failed: vec![node("n2")],
        ..Default::default()
    };
    let (plain, site) = (pb::Rollout::default(), pb::RolloutPlanSite::default());
    let rep = site_report(&plain, &site, &e, &env, 42);
    assert_eq!(rep.record.state, pb::RolloutSiteState::Done as i32);
    assert_eq!((rep.record.updated_unix_ms, rep.record.patched.len()), (42, 2));
    assert_eq!(rep.design_to.as_ref().map(|p| p.version.as_str()), Some("1.30.0"));
    assert_eq!((rep.count.index, rep.count.patched, rep.count.failed), (1, 2, 1));
    let none_patched = site_report(&plain, &site, &pb::SitePatched { patched: vec![], ..e }, &env, 42);
    assert_eq!(none_patched.design_to, None, "a site that patched nothing keeps its design");

    let r = rollout(&[3], 5);
    assert!(!counted(&r, 1));
    let next = count_reports(&r, &[&rep.count, &rep.count], 43).unwrap();
    assert!(counted(&next, 1));
    assert_eq!((next.sites_done, next.patched, next.failed), (1, 2, 1), "the same report twice counts once");
    assert_eq!(count_reports(&next, &[&rep.count], 44), None);
}

#[test]
fn a_design_moves_to_the_version_patched() {
    let refs = |v: &str| vec![pb::PackageRef { name: "kubelet".into(), version: v.into() }];
    let mut design = pb::SiteDesign {
        packages: vec![
            pb::RolePackages { role: pb::Role::Master as i32, packages: refs("1.29.1") },
            pb::RolePackages { role: pb::Role::Worker as i32, packages: refs("1.29.1") },
        ],
        ..Default::default()
    };
    let to = pb::PackageRef { name: "kubelet".into(), version: "1.30.0".into() };
    assert!(move_design(&mut design, &to));
    assert!(design.packages.iter().all(|rp| rp.packages == refs("1.30.0")));
    assert!(!move_design(&mut design, &to), "there already");
}

#[test]
fn sites_start_once_with_the_failure_budget_left() {
    let mut r = rollout(&[2, 3], 4);
    r.failed = 1;
    r.strategy.as_mut().unwrap().max_unavailable = "50%".into();
    r.entry = Some(pb::Package { name: "ubuntu".into(), kind: pb::PackageKind::OsImage as i32, ..Default::default() });
    assert_eq!(pending_sites(&r), [0, 1]);
    assert!(mark_dispatched(&mut r, &[0]));
    assert!(!mark_dispatched(&mut r, &[0]), "marked already");
    assert_eq!(pending_sites(&r), [1]);

    assert!(reinstalls(&r), "an os-image patch reinstalls the binaries");
    let entry =
        |name: &str, kind: pb::PackageKind| pb::Package { name: name.into(), kind: kind as i32, ..Default::default() };
    let installed = [pb::RoleArtifacts {
        role: pb::Role::Worker as i32,
        packages: vec![entry("ubuntu", pb::PackageKind::OsImage), entry("kubelet", pb::PackageKind::Binary)],
    }];
    let (job, env) = patch_job(&r, 1, plan_site("edge-2", 4), &installed, &Default::default());
    assert_eq!((job.site_id.as_str(), job.plan_index, job.nodes.len()), ("edge-2", 1, 4));
    assert_eq!((job.max_unavailable, job.max_failures), (2, 3));
    assert_eq!(job.reinstall[0].packages.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["kubelet"]);
    assert_eq!(env, envelope(&r).derive(pb::PatchNodes::KIND, Some("edge-2")));
}

#[test]
fn a_wave_past_its_timeout_counts_silent_sites_as_failed_and_goes_on() {
    let mut r = rollout(&[2, 3], 10);
    r.wave_started_unix_ms = 1_000;
    r.strategy.as_mut().unwrap().wave_timeout_seconds = 60;
    let r = count_site(&r, 0, 2, 0, &Envelope::root(), 2_000).unwrap();
    assert!(!wave_timed_out(&r, 61_000));
    assert!(wave_timed_out(&r, 61_001));
    assert_eq!(silent_sites(&r), [1]);

    let timeout = wave_timeout(&r, vec![(1, plan_site("edge-2", 3))]);
    assert!(timeout.goes_on());
    assert!(
        timeout.why.starts_with("wave 0 timed out after 60s: 1 site(s) did not report (edge-2)"),
        "{}",
        timeout.why
    );
    let records = timeout.site_records(61_002, &HashMap::new());
    assert_eq!(records.len(), 1);
    assert_eq!((records[0].state, records[0].failed.len()), (pb::RolloutSiteState::TimedOut as i32, 3));
    assert!(records[0].failed[0].reason.contains("no report within the wave timeout of 60s"));
    // A site the hub counts cut off says so, and since when.
    let cut_off = HashMap::from([("edge-2".to_string(), 1_700_000_000_000)]);
    let records = timeout.site_records(61_002, &cut_off);
    assert!(
        records[0].failed[0].reason.contains("the site is cut off (nothing heard since 2023-11-14T22:13:20Z)"),
        "{}",
        records[0].failed[0].reason
    );

    let next = timeout.apply(&pb::Rollout { outbox: vec![], ..r.clone() }, 61_002).unwrap();
    assert_eq!((next.failed, next.timed_out_sites, next.sites_done), (3, 1, 2));
    assert_eq!((next.wave, next.wave_started_unix_ms), (1, 61_002));
    assert_eq!(kinds(&next), ["RolloutProgress", "RolloutWaveStarted"]);
    assert_eq!(timeout.apply(&next, 61_003), None, "the rollout has left that wave");
}

#[test]
fn a_report_after_the_wave_timed_out_lands_in_the_sites_record_and_leaves_the_counts() {
    let mut r = rollout(&[2], 10);
    r.strategy.as_mut().unwrap().wave_timeout_seconds = 60;
    let timeout = wave_timeout(&r, vec![(0, plan_site("edge-1", 2))]);
    let held = timeout.site_records(70_000, &HashMap::new()).remove(0);
    let report = pb::SitePatched {
        site_id: "edge-1".into(),
        rollout_id: "r1".into(),
        plan_index: 0,
        patched: vec!["n0".into(), "n1".into()],
        package: Some(pb::PackageRef { name: "kubelet".into(), version: "1.31.0".into() }),
        ..Default::default()
    };
    let report = site_report(&pb::Rollout::default(), &plan_site("edge-1", 2), &report, &Envelope::root(), 90_000);
    let late = late_record(&held, &report).expect("a timed-out site's report is recorded");
    assert!(late.reported_late);
    assert_eq!(late.state, pb::RolloutSiteState::TimedOut as i32, "it still counted as timed out");
    assert_eq!((late.patched.len(), late.failed.len(), late.updated_unix_ms), (2, 0, 90_000));
    assert!(late.timed_out_reason.contains("no report within the wave timeout"), "{}", late.timed_out_reason);
    assert!(late_record(&late, &report).is_none(), "recorded once");
    assert!(late_record(&report.record, &report).is_none(), "a site counted from its report has nothing late");
    assert_eq!(report.design_to.as_ref().map(|p| p.version.as_str()), Some("1.31.0"));
}

#[test]
fn a_wave_past_its_timeout_halts_when_the_strategy_says_abort() {
    let mut r = rollout(&[2], 10);
    r.strategy.as_mut().unwrap().wave_timeout_seconds = 1;
    r.strategy.as_mut().unwrap().on_wave_timeout = pb::WaveTimeoutAction::Abort as i32;
    let timeout = wave_timeout(&r, vec![(0, plan_site("edge-1", 1)), (1, plan_site("edge-2", 1))]);
    assert!(!timeout.goes_on());
    assert!(timeout.site_records(5, &HashMap::new()).is_empty(), "a halted rollout keeps its sites' leases");
    let next = timeout.apply(&r, 5).unwrap();
    assert_eq!(phase(&next), pb::RolloutPhase::Halted);
    assert!(next.reason.ends_with("; the strategy says abort"), "{}", next.reason);
    assert_eq!((next.failed, next.sites_done), (0, 0));
    assert_eq!(kinds(&next), ["RolloutHalted"]);
}

#[test]
fn a_site_report_counts_only_as_the_answer_to_the_job_that_site_was_sent() {
    let mut r = rollout(&[3], 10);
    r.entry = Some(pb::Package { name: "kubelet".into(), version: "1.31.0".into(), ..Default::default() });
    assert!(mark_dispatched(&mut r, &[1]));
    let planned = plan_site("edge-2", 2);
    let (job, job_env) = patch_job(&r, 1, planned.clone(), &[], &Default::default());
    let honest = pb::SitePatched {
        site_id: "edge-2".into(),
        rollout_id: "r1".into(),
        plan_index: 1,
        patched: vec!["n0".into()],
        failed: vec![pb::NodeResult { node: "n1".into(), ..Default::default() }],
        skipped: vec![],
        package: Some(pb::PackageRef { name: "kubelet".into(), version: "1.31.0".into() }),
        unchanged: vec![],
        nodes: vec![],
    };
    let cause = job_env.derive("site_patched", None);
    assert_eq!(job.plan_index, 1);
    assert_eq!(check_report(&r, &planned, &honest, &cause), Ok(()));

    let refused = |e: pb::SitePatched, planned: &pb::RolloutPlanSite, cause: &Envelope| {
        check_report(&r, planned, &e, cause).expect_err("a forgery")
    };
    // Another site's place in the plan (it would mark that site done).
    let e = refused(pb::SitePatched { plan_index: 0, ..honest.clone() }, &plan_site("edge-1", 2), &cause);
    assert!(e.contains("planned no site edge-2 at index 0"), "{e}");
    // A place past the plan's end.
    let e = refused(pb::SitePatched { plan_index: 9, ..honest.clone() }, &pb::RolloutPlanSite::default(), &cause);
    assert!(e.contains("index 9"), "{e}");
    // A site the rollout has not started.
    let e = refused(
        pb::SitePatched { site_id: "edge-3".into(), plan_index: 2, ..honest.clone() },
        &plan_site("edge-3", 2),
        &cause,
    );
    assert!(e.contains("has sent site edge-3 no job"), "{e}");
    // Caused by something other than the job.
    let e = refused(honest.clone(), &planned, &Envelope::root());
    assert!(e.contains("not the job rollout r1 sent site edge-2"), "{e}");
    // A node the job did not name.
    let e = refused(pb::SitePatched { patched: vec!["intruder".into()], ..honest.clone() }, &planned, &cause);
    assert!(e.contains("node intruder was not in the job"), "{e}");
    let failed = vec![pb::NodeResult { node: "other".into(), ..Default::default() }];
    assert!(check_report(&r, &planned, &pb::SitePatched { failed, ..honest.clone() }, &cause).is_err());
    // Another package.
    let package = Some(pb::PackageRef { name: "kubelet".into(), version: "9.9.9".into() });
    let e = refused(pb::SitePatched { package, ..honest.clone() }, &planned, &cause);
    assert!(e.contains("kubelet@9.9.9"), "{e}");
}

#[test]
fn a_site_removed_since_the_plan_is_done_with_its_nodes_skipped() {
    let r = rollout(&[2], 100);
    let report = removed_site_report(&r, 1, &plan_site("edge-02", 3), 1_000);
    assert_eq!(report.record.skipped.len(), 3);
    assert!(report.record.patched.is_empty() && report.record.failed.is_empty());
    assert_eq!(report.record.state, pb::RolloutSiteState::Done as i32);
    assert_eq!((report.count.index, report.count.patched, report.count.failed), (1, 0, 0));
    assert!(report.design_to.is_none(), "a removed site's design is not moved");
    let counted = count_reports(&r, &[&report.count], 1_000).expect("counted");
    assert_eq!((counted.sites_done, counted.failed), (1, 0));
}

#[test]
fn a_package_another_rollout_moves_is_refused_naming_it_and_one_that_ended_is_not() {
    let req =
        request(&pb::PatchPackage { name: "kubelet".into(), version: "1.30.0".into(), ..Default::default() }).unwrap();
    let rollout = |id: &str, name: &str, phase: pb::RolloutPhase| pb::Rollout {
        rollout_id: id.into(),
        package: Some(pb::PackageRef { name: name.into(), version: "1.29.9".into() }),
        phase: phase as i32,
        planned_nodes: 6,
        patched: 2,
        ..Default::default()
    };
    let others = [
        rollout("r-done", "kubelet", pb::RolloutPhase::Completed),
        rollout("r-halted", "kubelet", pb::RolloutPhase::Halted),
        rollout("r-other", "containerd", pb::RolloutPhase::Running),
    ];
    assert!(not_moved_by_another(&req, &others).is_ok(), "ended, halted, or another package");
    let refusal = not_moved_by_another(&req, &[rollout("r-1", "kubelet", pb::RolloutPhase::Running)]).unwrap_err();
    assert_eq!(refusal.code, pb::RejectCode::Conflict);
    assert_eq!(
        refusal.reason,
        "rollout r-1 is moving kubelet (to 1.29.9, 2 of 6 nodes patched): one rollout moves a package's nodes at a \
         time; wait for it to end, or cancel it (landfall rollout cancel r-1)"
    );
    let paused = not_moved_by_another(&req, &[rollout("r-2", "kubelet", pb::RolloutPhase::Paused)]).unwrap_err();
    assert!(paused.reason.starts_with("rollout r-2 is paused over kubelet"), "{}", paused.reason);
}

fn gated(wave_ends: &[u32], canary: u32, gate: pb::ApprovalGate) -> pb::Rollout {
    let mut r = rollout(wave_ends, 0);
    let s = r.strategy.as_mut().unwrap();
    s.canary_sites = canary;
    s.approval = gate as i32;
    r
}

#[test]
fn an_approval_gate_holds_the_rollout_after_its_canary_until_a_resume_approves() {
    let env = Envelope::root();
    let r = count_site(&gated(&[1, 3], 1, pb::ApprovalGate::AfterCanary), 0, 2, 0, &env, 10).unwrap();
    assert_eq!((r.phase, r.wave, r.awaiting_approval), (pb::RolloutPhase::Paused as i32, 0, true));
    assert!(r.reason.contains("after the canary") && r.reason.contains("2 of 6 nodes patched"), "{}", r.reason);
    assert_eq!(kinds(&r), ["RolloutProgress", "RolloutPaused"], "no wave starts before the approval");
    let approved = resume(&pb::Rollout { outbox: vec![], ..r }, &env, 11).unwrap().unwrap();
    assert_eq!(
        (approved.phase, approved.wave, approved.awaiting_approval),
        (pb::RolloutPhase::Running as i32, 1, false)
    );
    assert_eq!(approved.approved_waves, 1);
    assert!(kinds(&approved).contains(&"RolloutWaveStarted".to_string()), "{:?}", kinds(&approved));
    // The last wave ends the rollout: no gate after it.
    let r = count_site(&pb::Rollout { outbox: vec![], ..approved }, 1, 2, 0, &env, 12).unwrap();
    let r = count_site(&pb::Rollout { outbox: vec![], ..r }, 2, 2, 0, &env, 13).unwrap();
    assert_eq!(r.phase, pb::RolloutPhase::Completed as i32);
}

#[test]
fn after_each_wave_gates_every_wave_but_the_last_and_a_plain_pause_approves_nothing() {
    let env = Envelope::root();
    let r = gated(&[1, 2, 3], 0, pb::ApprovalGate::AfterEachWave);
    // Paused by an operator mid-wave and resumed: the gate at the wave's end still holds.
    let paused = pause(&r, "", &env).unwrap().unwrap();
    let r = resume(&pb::Rollout { outbox: vec![], ..paused }, &env, 1).unwrap().unwrap();
    assert_eq!(r.approved_waves, 0);
    let r = count_site(&pb::Rollout { outbox: vec![], ..r }, 0, 2, 0, &env, 2).unwrap();
    assert!(r.awaiting_approval && r.reason.contains("after wave 1"), "{}", r.reason);
    let r = resume(&pb::Rollout { outbox: vec![], ..r }, &env, 3).unwrap().unwrap();
    let r = count_site(&pb::Rollout { outbox: vec![], ..r }, 1, 2, 0, &env, 4).unwrap();
    assert!(r.awaiting_approval && r.reason.contains("after wave 2") && r.wave == 1, "{}", r.reason);
    let r = resume(&pb::Rollout { outbox: vec![], ..r }, &env, 5).unwrap().unwrap();
    let r = count_site(&pb::Rollout { outbox: vec![], ..r }, 2, 2, 0, &env, 6).unwrap();
    assert_eq!(r.phase, pb::RolloutPhase::Completed as i32);
}
