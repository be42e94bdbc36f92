//! Each party's permissions against what it must and must not do.

use super::*;

fn allows(list: &[String], subject: &str) -> bool {
    list.iter().any(|p| names::subject_matches(p, subject))
}

/// Whether the server lets the user publish `subject`: allowed, and not denied.
fn may_publish(p: &Permissions, subject: &str) -> bool {
    allows(&p.publish, subject) && !allows(&p.publish_deny, subject)
}

/// `subject` as written with the jobs' layout before the shards (`LANDFALL_JOBS`,
/// `landfall.job.<site>.<kind>`) in the sharded layout: the stream and subjects of the shard of
/// the site it names (edge-02, or else edge-01).
fn sharded(subject: &str) -> String {
    let site = if subject.contains("edge-02") { "edge-02" } else { "edge-01" };
    let shard = names::job_shard(site);
    subject
        .replace("LANDFALL_JOBS", names::jobs_stream(shard))
        .replace(&format!("landfall.job.{site}."), &format!("landfall.job.{site}.{shard:02}."))
}

fn site(id: &str) -> Permissions {
    Role::Site(id.into()).permissions("UKEY")
}

#[test]
fn a_site_holds_eight_wildcards_each_naming_it() {
    let p = site("edge-01");
    assert!(p.publish.len() + p.subscribe.len() <= 8, "{p:?}");
    for entry in p.publish.iter().chain(&p.subscribe) {
        if entry.starts_with("landfall.") {
            assert_eq!(entry.split('.').nth(names::SCOPE_TOKEN), Some("edge-01"), "{entry}");
        } else {
            assert!(entry.contains("gateway-edge-01") || entry.contains(".edge-01"), "{entry}");
        }
    }
    assert_eq!(site_link("edge-01"), p, "a link credential carries the site's permissions");
}

#[test]
fn a_site_reaches_its_own_work_and_nothing_of_another_site() {
    let p = site("edge-01");
    let gw = |kind: &str| format!("landfall.evt.edge-01.gateway.{kind}");
    for ok in [
        gw("node.os_provisioned"),
        "landfall.cmd.edge-01.gateway.node_added".into(),
        "landfall.svc.edge-01.artifact_chunk".into(),
        names::identity_renew("edge-01"),
        "$JS.ACK.LANDFALL_JOBS.gateway-edge-01.1.2.3.4.5".into(),
        "$JS.FC.LANDFALL_JOBS.gateway-edge-01.abc".into(),
        "landfall.svc.edge-01.reply._INBOX_UKC.reply1".into(),
        "$JS.hub.API.DIRECT.GET.LANDFALL_EVENTS.landfall.evt.edge-01.gateway.node.patched".into(),
        "$JS.hub.API.DIRECT.GET.KV_landfall-sites.$KV.landfall-sites.site.edge-01".into(),
        "$JS.API.DIRECT.GET.KV_landfall-sites.$KV.landfall-sites.site.edge-01".into(),
        // The kinds only the hub sends, under its own site's gateway subjects: the server
        // lets them through, `trust::check` refuses them (see the trust tests).
        gw("site.installed"),
    ] {
        let ok = sharded(&ok);
        assert!(may_publish(&p, &ok), "{ok}");
    }
    for denied in [
        "landfall.evt.edge-02.gateway.node.os_provisioned",
        "landfall.evt.fleet.hub.rollout.completed",
        "landfall.evt.fleet.gateway.rollout.completed",
        // The hub's subjects in its own scope.
        "landfall.evt.edge-01.hub.site.installed",
        "landfall.evt.edge-01.hub.node.os_provisioned",
        "landfall.evt.edge-01.hub.command.rejected",
        "landfall.cmd.edge-01.hub.install_site",
        "landfall.cmd.edge-01.hub.node_added",
        "landfall.cmd.edge-02.gateway.node_added",
        "landfall.cmd.fleet.gateway.patch_package",
        "landfall.job.edge-01.provision_os",
        "landfall.svc.edge-02.bmc_credentials",
        "landfall.svc.edge-02.reply._INBOX_UKC.reply1",
        "landfall.identity.renew.edge-01",
        // It reads its deliveries as the hub made its durable, and asks nothing about it.
        "$JS.API.CONSUMER.INFO.LANDFALL_JOBS.gateway-edge-01",
        "$JS.hub.API.CONSUMER.INFO.LANDFALL_JOBS.gateway-edge-01",
        "$JS.API.INFO",
        "$JS.hub.API.STREAM.INFO.LANDFALL_JOBS",
        "$JS.hub.API.CONSUMER.MSG.NEXT.LANDFALL_JOBS.gateway-edge-02",
        "$JS.hub.API.CONSUMER.CREATE.LANDFALL_JOBS.gateway-edge-02.landfall.job.edge-02.>",
        "$JS.FC.LANDFALL_JOBS.gateway-edge-02.abc",
        "$JS.ACK.LANDFALL_JOBS.gateway-edge-02.1.2.3.4.5",
        "$JS.ACK.LANDFALL_JOBS.gateway-edge-012.1.2.3.4.5",
        "landfall.to.edge-01.jobs",
        "landfall.to.edge-02.jobs",
        "$JS.hub.API.STREAM.DELETE.LANDFALL_JOBS",
        "$JS.hub.API.DIRECT.GET.KV_landfall-sites.$KV.landfall-sites.site.edge-02",
        "$JS.hub.API.DIRECT.GET.KV_landfall-kubeconfigs.$KV.landfall-kubeconfigs.kubeconfig.edge-01",
        "$KV.landfall-sites.site.edge-01",
        // Another site's reports, the hub's, or any event by a request whose body names it.
        "$JS.hub.API.DIRECT.GET.LANDFALL_EVENTS.landfall.evt.edge-02.gateway.node.patched",
        "$JS.hub.API.DIRECT.GET.LANDFALL_EVENTS.landfall.evt.edge-01.hub.site.installed",
        "$JS.hub.API.DIRECT.GET.LANDFALL_EVENTS.landfall.evt.fleet.hub.rollout.completed",
        "$JS.hub.API.DIRECT.GET.LANDFALL_EVENTS",
        "$JS.hub.API.STREAM.MSG.GET.LANDFALL_EVENTS",
        "_INBOX_UAPI.reply.1",
        "_INBOX_UKC.site.edge-01.reply1",
    ] {
        let denied = sharded(denied);
        assert!(!may_publish(&p, &denied), "{denied}");
    }
    assert!(p.publish_deny.is_empty(), "a site's list is only what it may do");
    // Another shard's stream, with its own durable's name.
    let elsewhere = names::jobs_stream((names::job_shard("edge-01") + 1) % names::JOB_SHARDS);
    assert!(!may_publish(&p, &format!("$JS.ACK.{elsewhere}.gateway-edge-01.1.2.3.4.5")));
    for ok in ["landfall.to.edge-01.rpc.kubeconfig", "landfall.to.edge-01.jobs", "landfall.to.edge-01.inbox.ab.1"] {
        assert!(allows(&p.subscribe, ok), "{ok}");
    }
    for denied in [
        "_INBOX.abc",
        "_INBOX_UKEY.abc.1",
        "_INBOX_UOTHER.abc",
        "landfall.to.edge-02.jobs",
        "landfall.to.*.jobs",
        "landfall.job.edge-02.provision_os",
        "landfall.to.edge-02.rpc.kubeconfig",
        "landfall.svc.*.reply._INBOX_UKC.>",
        ">",
    ] {
        let denied = sharded(denied);
        assert!(!allows(&p.subscribe, &denied), "{denied}");
    }
}

#[test]
fn a_site_creates_no_consumer_and_uses_only_the_one_the_hub_made_for_it() {
    let p = site("edge-01");
    for api in ["$JS.API", "$JS.hub.API"] {
        for denied in [
            // Its durable pushes to it: no pull, which would take its jobs off another
            // connection's hands.
            "CONSUMER.MSG.NEXT.LANDFALL_JOBS.gateway-edge-01",
            // Not even its own, with its own filter: the hub made it (a site could make it a
            // push consumer handing its jobs elsewhere).
            "CONSUMER.CREATE.LANDFALL_JOBS.gateway-edge-01.landfall.job.edge-01.>",
            // Its durable filtered on another site's jobs, or on every site's.
            "CONSUMER.CREATE.LANDFALL_JOBS.gateway-edge-01.landfall.job.edge-02.>",
            "CONSUMER.CREATE.LANDFALL_JOBS.gateway-edge-01.landfall.job.*.>",
            "CONSUMER.CREATE.LANDFALL_JOBS.gateway-edge-01.landfall.>",
            "CONSUMER.CREATE.LANDFALL_JOBS.gateway-edge-01.>",
            // Its durable with the filter only in the body, where no permission sees it.
            "CONSUMER.CREATE.LANDFALL_JOBS.gateway-edge-01",
            "CONSUMER.DURABLE.CREATE.LANDFALL_JOBS.gateway-edge-01",
            // Another durable, or one without a name.
            "CONSUMER.CREATE.LANDFALL_JOBS.gateway-edge-02.landfall.job.edge-02.>",
            "CONSUMER.CREATE.LANDFALL_JOBS.other.landfall.job.edge-01.>",
            "CONSUMER.CREATE.LANDFALL_JOBS",
            "CONSUMER.DELETE.LANDFALL_JOBS.gateway-edge-01",
            "CONSUMER.DELETE.LANDFALL_JOBS.gateway-edge-02",
        ] {
            let subject = sharded(&format!("{api}.{denied}"));
            assert!(!may_publish(&p, &subject), "{subject}");
        }
    }
}

#[test]
fn sites_answer_the_hub_under_their_own_subjects_and_only_the_asker_hears() {
    let p = site("edge-01");
    assert_eq!(names::site_replies("edge-01", &inbox("UKC")), "landfall.svc.edge-01.reply._INBOX_UKC");
    for ok in ["landfall.svc.edge-01.reply._INBOX_UKC.abc", "landfall.svc.edge-01.reply._INBOX_UOP.abc"] {
        assert!(may_publish(&p, ok), "{ok}");
    }
    for denied in ["_INBOX_UKC.abc.1", "landfall.svc.edge-02.reply._INBOX_UKC.abc", "_INBOX_UOP.site.edge-01.abc"] {
        assert!(!may_publish(&p, denied), "{denied}");
    }
    // Each asker hears every site's answers to itself, and no one else's.
    let collector = Role::Kubeconfig.permissions("UKC");
    let operator = Role::Operator.permissions("UOP");
    assert!(allows(&collector.subscribe, "landfall.svc.edge-01.reply._INBOX_UKC.abc"));
    assert!(allows(&operator.subscribe, "landfall.svc.edge-02.reply._INBOX_UOP.abc"));
    assert!(!allows(&collector.subscribe, "landfall.svc.edge-01.reply._INBOX_UOP.abc"));
    assert!(!allows(&operator.subscribe, "landfall.svc.edge-01.reply._INBOX_UKC.abc"));
    for role in Role::services() {
        let key = format!("U{}", role.user().to_uppercase());
        let p = role.permissions(&key);
        for other in ["landfall.svc.edge-01.reply._INBOX_USOMEONE.abc", "landfall.svc.edge-01.artifact_plan.x"] {
            assert!(!allows(&p.subscribe, other), "{role:?}: {other}");
        }
    }
    // An operator may write anything of landfall's but a site's jobs and its answers.
    assert!(!may_publish(&operator, "landfall.to.edge-01.inbox.abc.1"));
    assert!(!may_publish(&operator, "landfall.to.edge-01.jobs"));
    assert!(may_publish(&operator, "landfall.to.edge-01.rpc.kubeconfig"));
}

#[test]
fn hub_services_keep_to_their_role() {
    let api = Role::Api.permissions("UAPI");
    assert!(may_publish(&api, "landfall.cmd.edge-01.hub.install_site"));
    assert!(!may_publish(&api, &sharded("landfall.job.edge-01.provision_os")));
    assert!(!may_publish(&api, "$JS.API.DIRECT.GET.KV_landfall-kubeconfigs.$KV.landfall-kubeconfigs.x"));
    assert!(!may_publish(&api, "landfall.evt.edge-01.hub.site.installed"), "the API publishes commands only");
    let observer = Role::Observer.permissions("UOBS");
    assert!(may_publish(&observer, "landfall.evt.edge-01.hub.message.rejected"));
    assert!(!may_publish(&observer, "landfall.evt.edge-01.hub.site.installed"));
    let kc = Role::Kubeconfig.permissions("UKC");
    assert!(may_publish(&kc, "landfall.evt.edge-01.hub.cluster.kubeconfig_stored"));
    assert!(!may_publish(&kc, "landfall.evt.edge-01.hub.node.os_provisioned"), "a site's report");
    assert!(!may_publish(&kc, "landfall.cmd.edge-01.hub.install_site"));
    assert!(!may_publish(&observer, "landfall.cmd.edge-01.hub.install_site"));
    assert!(may_publish(&observer, "$KV.landfall-observed.node.edge-01.m-1.kubelet"));
    assert!(!may_publish(&observer, "$KV.landfall-sites.site.edge-01"));
    let orchestrator = Role::Orchestrator.permissions("UORC");
    assert!(may_publish(&orchestrator, &sharded("landfall.job.edge-01.provision_os")));
    assert!(may_publish(&orchestrator, "landfall.cmd.fleet.hub.patch_package"), "auto-rollouts");
    assert!(!may_publish(&orchestrator, "landfall.cmd.edge-01.hub.install_site"));
    assert!(!may_publish(&orchestrator, "landfall.evt.edge-01.hub.node.os_provisioned"), "a site's report");
    assert!(!may_publish(&orchestrator, "landfall.evt.edge-01.hub.cluster.kubeconfig_stored"));
    assert!(!may_publish(&orchestrator, &sharded("$JS.API.STREAM.DELETE.LANDFALL_JOBS")));
    // Only the stream of an earlier version, whose jobs it moves into the shards.
    assert!(may_publish(&orchestrator, "$JS.API.STREAM.DELETE.LANDFALL_JOBS"));
    let kubeconfig = Role::Kubeconfig.permissions("UKC");
    assert!(allows(&kubeconfig.subscribe, names::KUBECONFIG_GET_ADMIN));
    assert!(may_publish(&kubeconfig, "$KV.landfall-kubeconfigs.kubeconfig.edge-01"));
    for role in Role::services() {
        assert!(!allows(&role.permissions("U").subscribe, "_INBOX.x"), "{role:?}");
    }
}

#[test]
fn a_consumer_files_dead_letters_under_its_own_name_and_a_site_none() {
    let orchestrator = Role::Orchestrator.permissions("UORC");
    assert!(may_publish(&orchestrator, &names::dead_letter_subject(names::ORCHESTRATOR_COMMANDS)));
    assert!(may_publish(&orchestrator, "landfall.evt.edge-01.hub.message.dead_lettered"));
    assert!(may_publish(&orchestrator, "$JS.API.STREAM.MSG.GET.LANDFALL_COMMANDS"), "the order check");
    assert!(!may_publish(&orchestrator, &names::dead_letter_subject(names::OBSERVER_EVENTS)));
    let observer = Role::Observer.permissions("UOBS");
    assert!(may_publish(&observer, &names::dead_letter_subject(names::OBSERVER_EVENTS)));
    let api = Role::Api.permissions("UAPI");
    assert!(!may_publish(&api, &names::dead_letter_subject(names::ORCHESTRATOR_COMMANDS)));
    assert!(!may_publish(&api, "landfall.evt.edge-01.hub.message.dead_lettered"));
    let site = site("edge-01");
    for subject in [
        names::dead_letter_subject(&names::gateway_consumer("edge-01")),
        "landfall.evt.edge-01.hub.message.dead_lettered".to_string(),
        "$JS.API.STREAM.MSG.GET.LANDFALL_DEAD".to_string(),
        "$JS.API.CONSUMER.CREATE.LANDFALL_DEAD.x".to_string(),
    ] {
        assert!(!may_publish(&site, &subject), "{subject}");
    }
    assert!(!allows(&site.subscribe, "landfall.dead.orchestrator-commands"));
}

#[test]
fn each_service_writes_only_the_buckets_it_owns_and_the_api_only_what_it_holds() {
    let writes = |role: Role, subject: &str| may_publish(&role.permissions("U"), subject);
    let every_bucket = |key: &str| names::ALL_BUCKETS.map(|b| format!("$KV.{b}.{key}"));
    for subject in every_bucket("x").iter().chain(&every_bucket("artifact-store")) {
        let held = subject.starts_with(&format!("$KV.{}.", names::APPROVALS_BUCKET));
        assert_eq!(writes(Role::Api, subject), held, "the API writes only the commands it holds: {subject}");
    }
    let owned = [
        (
            Role::Orchestrator,
            vec![
                "$KV.landfall-sites.site.edge-01",
                "$KV.landfall-sagas.saga.x",
                "$KV.landfall-sagas.lease.edge-01",
                "$KV.landfall-packages.pkg.kubelet.1=2e30",
                "$KV.landfall-packages.policy.kubelet",
            ],
        ),
        (Role::Observer, vec!["$KV.landfall-observed.node.edge-01.m-1.kubelet"]),
        (
            Role::Kubeconfig,
            vec!["$KV.landfall-kubeconfigs.kubeconfig.edge-01", "$KV.landfall-kubeconfigs.bmc.edge-01.m-1"],
        ),
        (Role::Distribution, vec!["$KV.landfall-packages.artifact-store"]),
    ];
    for (role, subjects) in &owned {
        for subject in subjects {
            assert!(writes(role.clone(), subject), "{role:?} writes {subject}");
        }
        for (other, theirs) in &owned {
            if other == role {
                continue;
            }
            for subject in theirs {
                assert!(!writes(role.clone(), subject), "{role:?} writes {other:?}'s {subject}");
            }
        }
    }
    assert!(!writes(Role::Distribution, "$KV.landfall-packages.pkg.kubelet.1"), "the catalog is the orchestrator's");
    // A site's chart renders: the distribution service makes them, the orchestrator purges
    // them with the site; nobody else writes them.
    let render = "$KV.landfall-packages.render.edge-01.cni.1.ab";
    assert!(writes(Role::Distribution, render) && writes(Role::Orchestrator, render));
    assert!(!writes(Role::Observer, render) && !writes(Role::Kubeconfig, render));
}

#[test]
fn each_service_runs_its_own_durables_and_no_others() {
    let owners = [
        (Role::Orchestrator, names::COMMANDS_STREAM, names::ORCHESTRATOR_COMMANDS),
        (Role::Orchestrator, names::EVENTS_STREAM, names::ORCHESTRATOR_EVENTS),
        (Role::Orchestrator, names::EVENTS_STREAM, names::ORCHESTRATOR_ROLLOUTS),
        (Role::Observer, names::EVENTS_STREAM, names::OBSERVER_EVENTS),
        (Role::Kubeconfig, names::EVENTS_STREAM, names::KUBECONFIG_EVENTS),
        (Role::Identity, names::EVENTS_STREAM, names::IDENTITY_EVENTS),
    ];
    for role in Role::services().into_iter().filter(|r| *r != Role::Operator) {
        let p = role.permissions("U");
        for (owner, stream, durable) in &owners {
            let own = *owner == role;
            let run = [
                format!("$JS.API.CONSUMER.CREATE.{stream}.{durable}"),
                format!("$JS.API.CONSUMER.CREATE.{stream}.{durable}.landfall.evt.*.*.cluster.ready"),
                format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}"),
                format!("$JS.ACK.{stream}.{durable}.1.2.3.4.5"),
            ];
            for subject in &run {
                assert_eq!(may_publish(&p, subject), own, "{role:?}: {subject}");
            }
            for never in [
                format!("$JS.API.CONSUMER.DELETE.{stream}.{durable}"),
                format!("$JS.API.CONSUMER.DURABLE.CREATE.{stream}.{durable}"),
            ] {
                assert!(!may_publish(&p, &never), "{role:?}: {never}");
            }
        }
        for stream in [names::COMMANDS_STREAM, names::site_jobs_stream("edge-01"), names::EVENTS_STREAM] {
            for never in ["STREAM.DELETE", "STREAM.PURGE", "STREAM.UPDATE", "STREAM.MSG.DELETE"] {
                let subject = format!("$JS.API.{never}.{stream}");
                // Removing a site drops its jobs (a purge filtered to them); the keeping times
                // follow the orchestrator's settings.
                if role == Role::Orchestrator
                    && (subject == sharded("$JS.API.STREAM.PURGE.LANDFALL_JOBS") || never == "STREAM.UPDATE")
                {
                    assert!(may_publish(&p, &subject));
                    continue;
                }
                assert!(!may_publish(&p, &subject), "{role:?}: {subject}");
            }
            // A name-less create names its consumer in the body: allowed only where no
            // durable is, so no one renames another's durable through it.
            let unnamed = format!("$JS.API.CONSUMER.CREATE.{stream}");
            assert!(!may_publish(&p, &unnamed), "{role:?}: {unnamed}");
        }
        let site_durable = sharded("$JS.API.CONSUMER.CREATE.LANDFALL_JOBS.gateway-edge-01.landfall.job.edge-01.>");
        assert_eq!(may_publish(&p, &site_durable), role == Role::Orchestrator, "{role:?}: only the orchestrator");
        // Not a durable of one shard filtered on another's jobs.
        let elsewhere = names::jobs_stream((names::job_shard("edge-01") + 1) % names::JOB_SHARDS);
        let crossed = format!("$JS.API.CONSUMER.CREATE.{elsewhere}.gateway-edge-01.{}", names::site_jobs("edge-01"));
        assert!(!may_publish(&p, &crossed), "{role:?}: {crossed}");
    }
    // A site's jobs reach it alone: no hub user reads its delivery subject, and none but the
    // orchestrator (its dispatcher) writes into it (operators publish every other landfall
    // subject).
    for role in Role::services() {
        let p = role.permissions("U");
        assert!(!allows(&p.subscribe, "landfall.to.edge-01.jobs"), "{role:?}");
        assert_eq!(may_publish(&p, "landfall.to.edge-01.jobs"), role == Role::Orchestrator, "{role:?}");
    }
    // The API reads events with consumers of its own (named), and watches and scans buckets.
    let api = Role::Api.permissions("U");
    for ok in [
        "$JS.API.CONSUMER.CREATE.LANDFALL_EVENTS.events-0a1b",
        "$JS.API.CONSUMER.CREATE.LANDFALL_EVENTS.events-0a1b_1",
        "$JS.API.CONSUMER.INFO.LANDFALL_EVENTS.events-0a1b",
        "$JS.API.CONSUMER.MSG.NEXT.LANDFALL_EVENTS.events-0a1b",
        "$JS.API.CONSUMER.DELETE.LANDFALL_EVENTS.events-0a1b",
        "$JS.API.CONSUMER.CREATE.KV_landfall-sagas",
        "$JS.API.CONSUMER.CREATE.KV_landfall-sagas.x1_1.$KV.landfall-sagas.rollout.r1.site.>",
        "$JS.FC.KV_landfall-sites.x.1",
        "$JS.API.DIRECT.GET.KV_landfall-sites.$KV.landfall-sites.site.edge-01",
    ] {
        assert!(may_publish(&api, ok), "{ok}");
    }
    for denied in ["$JS.API.CONSUMER.CREATE.KV_landfall-kubeconfigs", "$JS.API.CONSUMER.CREATE.LANDFALL_COMMANDS.x"] {
        assert!(!may_publish(&api, denied), "{denied}");
    }
    // Every durable landfall names has one owner.
    let owned: Vec<(&str, &str)> = Role::services().iter().flat_map(|r| r.durables().iter().copied()).collect();
    assert_eq!(owned, owners.iter().map(|(_, s, d)| (*s, *d)).collect::<Vec<_>>());
}

#[test]
fn the_orchestrators_dispatcher_hands_jobs_to_any_site_and_only_the_site_takes_or_answers_them() {
    let orchestrator = Role::Orchestrator.permissions("UOR");
    assert!(may_publish(&orchestrator, "landfall.to.edge-01.jobs"));
    assert!(!may_publish(&orchestrator, "landfall.to.edge-01.rpc.kubeconfig"));
    assert!(allows(&orchestrator.subscribe, "landfall.svc.edge-01.reply._INBOX_UOR.abc"));
    assert!(!allows(&orchestrator.subscribe, "landfall.svc.edge-01.reply._INBOX_UOP.abc"));
    for shard in [0, 63] {
        let jobs = names::jobs_stream(shard);
        assert!(may_publish(&orchestrator, &format!("$JS.API.CONSUMER.MSG.NEXT.{jobs}.{}", names::DISPATCHER)));
        assert!(may_publish(&orchestrator, &format!("$JS.ACK.{jobs}.{}.1.2.3.4.5", names::DISPATCHER)));
    }
    // A site takes its own jobs and answers under its own subjects; it hands no job to another.
    let p = site("edge-01");
    assert!(allows(&p.subscribe, "landfall.to.edge-01.jobs"));
    assert!(!allows(&p.subscribe, "landfall.to.edge-02.jobs"));
    assert!(!may_publish(&p, "landfall.to.edge-02.jobs"));
    assert!(!may_publish(&p, "landfall.to.edge-01.jobs"));
    assert!(may_publish(&p, "landfall.svc.edge-01.reply._INBOX_UOR.abc"));
    assert!(!may_publish(&p, "landfall.svc.edge-02.reply._INBOX_UOR.abc"));
}
