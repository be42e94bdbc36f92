//! The table of kinds against forgeries: every kind on the bus has a row, and every site field of
//! every row, forged, is refused.

use prost::Message as _;
use serde_json::{Value, json};

use super::*;

/// The subject a row's message travels on at `site`: as a gateway sends it, when a site may.
fn subject_at(rule: &Rule, site: &str) -> String {
    let origin = if rule.allows(Party::Site) { Origin::Gateway } else { Origin::Hub };
    subject_from(rule, site, origin)
}

fn subject_from(rule: &Rule, site: &str, origin: Origin) -> String {
    let scope =
        if rule.site_fields.is_empty() && !pb::rejection::in_answered_scope(rule.kind) { names::FLEET } else { site };
    match rule.channel {
        Channel::Command => names::command_subject_from(origin, rule.kind, scope),
        Channel::Job => names::job_subject(site, rule.kind),
        Channel::Event => names::event_subject_from(origin, scope, rule.aggregate, rule.kind),
        Channel::Service => format!("landfall.svc.{site}.{}", rule.kind),
        Channel::SiteRpc => names::site_rpc(site, rule.kind),
        Channel::Admin => format!("landfall.admin.{}", rule.kind),
    }
}

/// A message of the row's type whose site fields name `site`, but `forged` naming `other`.
fn message(rule: &Rule, site: &str, forged: Option<(&str, &str)>) -> Vec<u8> {
    let mut doc = json!({});
    for field in rule.site_fields {
        let value = match forged {
            Some((f, other)) if f == *field => other,
            _ => site,
        };
        let mut at = &mut doc;
        let parts: Vec<&str> = field.split('.').collect();
        for part in &parts[..parts.len() - 1] {
            // A list (`name[]`): its one element.
            at = match part.strip_suffix("[]") {
                Some(list) => {
                    let items = at.as_object_mut().unwrap().entry(list.to_string()).or_insert_with(|| json!([{}]));
                    &mut items[0]
                }
                None => at.as_object_mut().unwrap().entry(part.to_string()).or_insert_with(|| json!({})),
            };
        }
        at[parts[parts.len() - 1]] = Value::String(value.into());
    }
    encode_json(rule.type_name, doc).expect("every row can be built from JSON").expect("valid JSON")
}

#[test]
fn every_kind_on_the_bus_has_a_row() {
    let mut types: Vec<&str> = pb::COMMAND_TYPES.iter().chain(pb::JOB_TYPES).map(|(_, t)| *t).collect();
    types.extend(pb::EVENT_TYPES.iter().map(|t| t.type_name));
    for t in &types {
        assert!(rule(t).is_some(), "{t} travels on the bus and has no row in trust::RULES");
    }
    // Every message of the files that define what travels is a row, or a part or reply of one.
    let parts_and_replies = [
        "DesignSource",
        "ExpectedRevision",
        "AutoRollout",
        "SiteSelector",
        "RolloutStrategy",
        "RolloutSitePlan",
        "ArtifactPlan",
        "ChartRenderReply",
        "DriftReport",
        "ArtifactTransfer",
        "BmcCredentials",
        "SecretStored",
        "KeyRotated",
        "RoleArtifacts",
        "HostFound",
        "NodeSteps",
    ];
    let set = prost_types::FileDescriptorSet::decode(pb::FILE_DESCRIPTOR_SET).unwrap();
    let mut missing = Vec::new();
    for file in set.file.iter().filter(|f| {
        ["commands.proto", "jobs.proto", "events.proto", "services.proto"].iter().any(|n| f.name().ends_with(n))
    }) {
        for m in &file.message_type {
            if rule(&format!("landfall.v1.{}", m.name())).is_none() && !parts_and_replies.contains(&m.name()) {
                missing.push(format!("{} ({})", m.name(), file.name()));
            }
        }
    }
    assert!(missing.is_empty(), "no row in trust::RULES, nor a known part or reply: {missing:?}");
    let mut names: Vec<_> = RULES.iter().map(|r| r.type_name).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), RULES.len(), "one row per type");
}

#[test]
fn every_site_field_of_every_row_must_name_the_subjects_site() {
    let mut forgeries = 0;
    for rule in RULES {
        let subject = subject_at(rule, "edge-01");
        let honest = message(rule, "edge-01", None);
        assert_eq!(check_payload(&subject, rule.type_name, &honest), Some(Ok(())), "{} on {subject}", rule.type_name);
        for field in rule.site_fields {
            for other in ["edge-02", ""] {
                let forged = message(rule, "edge-01", Some((field, other)));
                let refused = check_payload(&subject, rule.type_name, &forged).unwrap().unwrap_err();
                assert!(refused.0.contains(field) && refused.0.contains("edge-01"), "{}: {refused}", rule.type_name);
                forgeries += 1;
            }
        }
    }
    assert!(forgeries >= 2 * 38, "{forgeries}");
}

#[test]
fn every_row_is_refused_on_another_kinds_subject() {
    for rule in RULES {
        let honest = message(rule, "edge-01", None);
        let other =
            RULES.iter().find(|r| r.channel == rule.channel && r.subject_kind() != rule.subject_kind()).unwrap();
        let wrong = subject_at(other, "edge-01");
        assert!(check_payload(&wrong, rule.type_name, &honest).unwrap().is_err(), "{} on {wrong}", rule.type_name);
        assert!(check_payload("landfall.bogus", rule.type_name, &honest).unwrap().is_err());
    }
}

#[test]
fn each_node_report_in_a_sites_report_must_name_its_site() {
    let subject = "landfall.evt.edge-01.gateway.rollout.site_patched";
    let node =
        |site: &str, node: &str| pb::NodePatched { site_id: site.into(), node: node.into(), ..Default::default() };
    let mut report = pb::SitePatched { site_id: "edge-01".into(), ..Default::default() };
    assert_eq!(check(subject, &report), Ok(()), "no node reports in it");
    report.nodes = vec![node("edge-01", "w-1"), node("edge-01", "w-2")];
    assert_eq!(check(subject, &report), Ok(()));
    report.nodes.push(node("edge-02", "w-1"));
    let e = check(subject, &report).unwrap_err();
    assert!(e.0.contains("nodes[].site_id names \"edge-02\""), "{e}");
    report.nodes[2].site_id = String::new();
    assert!(check(subject, &report).is_err(), "a node report naming no site");
}

#[test]
fn a_site_announcing_a_host_of_another_site_is_refused() {
    let forged = pb::NodeAdded { site_id: "edge-02".into(), ..Default::default() };
    let e = check("landfall.cmd.hc-01.gateway.node_added", &forged).unwrap_err();
    assert_eq!(
        e.0,
        "landfall.v1.NodeAdded on landfall.cmd.hc-01.gateway.node_added speaks for site hc-01 only, and its site_id names \"edge-02\""
    );
    let own = pb::NodeAdded { site_id: "hc-01".into(), ..Default::default() };
    assert_eq!(check("landfall.cmd.hc-01.gateway.node_added", &own), Ok(()));
}

/// A site's user may publish anything under its own site's gateway subjects: of what only the
/// hub sends, nothing counts there.
#[test]
fn nothing_only_the_hub_sends_counts_from_a_gateway() {
    let mut refused = 0;
    for rule in RULES.iter().filter(|r| matches!(r.channel, Channel::Command | Channel::Event)) {
        let honest = message(rule, "edge-01", None);
        let from_gateway = subject_from(rule, "edge-01", Origin::Gateway);
        let from_hub = subject_from(rule, "edge-01", Origin::Hub);
        let verdict = check_payload(&from_gateway, rule.type_name, &honest).unwrap();
        assert_eq!(verdict.is_ok(), rule.allows(Party::Site), "{} on {from_gateway}: {verdict:?}", rule.type_name);
        assert_eq!(check_payload(&from_hub, rule.type_name, &honest).unwrap(), Ok(()), "{from_hub}");
        refused += usize::from(verdict.is_err());
    }
    assert!(refused >= 30, "{refused}");
    let e = check(
        "landfall.cmd.edge-01.gateway.decommission_site",
        &pb::DecommissionSite { site_id: "edge-01".into(), ..Default::default() },
    )
    .unwrap_err();
    assert!(e.0.contains("only the hub sends"), "{e}");
}

#[test]
fn fleet_wide_kinds_stay_in_the_fleets_scope() {
    let cmd = pb::PatchPackage::default();
    assert!(check("landfall.cmd.fleet.hub.patch_package", &cmd).is_ok());
    assert!(check("landfall.cmd.edge-01.hub.patch_package", &cmd).is_err());
    let rejected = pb::MessageRejected::default();
    assert!(check("landfall.evt.edge-01.hub.message.rejected", &rejected).is_ok());
    assert!(check("landfall.evt.edge-01.gateway.message.rejected", &rejected).is_ok());
}

#[test]
fn sites_may_send_what_a_gateway_sends_and_nothing_of_the_hubs() {
    let kinds: Vec<String> = sent_by(Party::Site).map(|r| r.subject_kind()).collect();
    for k in [
        "node_added",
        "node_removed",
        "node.os_provisioned",
        "rollout.site_patched",
        "artifact_chunk",
        "message.rejected",
    ] {
        assert!(kinds.iter().any(|x| x == k), "{k}");
    }
    for k in ["install_site", "site.installed", "cluster.kubeconfig_stored", "node.ready", "provision_os", "kubeconfig"]
    {
        assert!(!kinds.iter().any(|x| x == k), "{k}");
    }
    for r in sent_by(Party::Site) {
        assert!(
            !r.site_fields.is_empty() || r.kind == pb::rejection::KIND,
            "{} from a site names no site",
            r.type_name
        );
    }
}
