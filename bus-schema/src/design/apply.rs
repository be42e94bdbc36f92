//! Planning an apply: from a site's design sources to its next revision, or every reason not to.
//!
//! Shared by the orchestrator (which stores the revision) and the CLI (`design validate`,
//! `design diff`, and the "unchanged" check before `design apply` publishes anything).

use std::collections::{BTreeMap, BTreeSet};

use crate::domain::{NodeName, PackageRef, SiteId};
use crate::pb;

use super::{NodeSet, Parsed, ResolvedSite, Selection, select, to_site_design, validate_parsed};

/// A valid design, resolved, with its cluster selected.
#[derive(Debug, Clone)]
pub struct Planned {
    pub resolved: ResolvedSite,
    pub selection: Selection,
    pub effective: pb::SiteDesign,
}

impl Planned {
    /// Whether applying this would change nothing after `previous`.
    pub fn same_as(&self, previous: &pb::DesignRevision) -> bool {
        previous.effective.as_ref() == Some(&self.effective) && selection_of(previous) == self.selection
    }

    /// The revision record this plan becomes.
    pub fn revision(
        &self,
        revision: u64,
        sources: Vec<pb::DesignSource>,
        command_id: &str,
        now_ms: i64,
    ) -> pb::DesignRevision {
        let names = |v: &[NodeName]| v.iter().map(ToString::to_string).collect::<Vec<_>>();
        pb::DesignRevision {
            site_id: self.resolved.id.to_string(),
            revision,
            sources,
            effective: Some(self.effective.clone()),
            applied_unix_ms: now_ms,
            masters: names(&self.selection.masters.active),
            workers: names(&self.selection.workers.active),
            standby_masters: names(&self.selection.masters.standby),
            standby_workers: names(&self.selection.workers.standby),
            command_id: command_id.to_string(),
        }
    }
}

/// The selection a stored revision made (names that no longer parse are dropped).
pub fn selection_of(rev: &pb::DesignRevision) -> Selection {
    let names = |v: &[String]| v.iter().filter_map(|n| NodeName::try_from(n.as_str()).ok()).collect::<Vec<_>>();
    Selection {
        masters: NodeSet { active: names(&rev.masters), standby: names(&rev.standby_masters) },
        workers: NodeSet { active: names(&rev.workers), standby: names(&rev.standby_workers) },
    }
}

/// Parses, validates, selects and flattens a site's design. Every problem is returned at once,
/// each as a line that names the document, the field and the reason.
pub fn plan(
    site: &SiteId,
    sources: &[pb::DesignSource],
    catalog: &BTreeSet<PackageRef>,
    previous: Option<&pb::DesignRevision>,
) -> Result<Planned, Vec<String>> {
    if sources.is_empty() {
        return Err(vec!["no design documents".to_string()]);
    }
    // Documents that do not parse are reported with everything wrong in the others.
    let mut parsed = Parsed::default();
    for source in sources {
        parsed.read(&source.text, &source.name);
    }
    let resolved =
        validate_parsed(&parsed, catalog).map_err(|e| e.iter().map(ToString::to_string).collect::<Vec<_>>())?;
    if resolved.id != *site {
        return Err(vec![format!(
            "{}: name: the documents describe site {}, not {site}",
            resolved.origin, resolved.id
        )]);
    }
    let previous_selection = previous.map(selection_of).unwrap_or_default();
    let selection = select(&resolved, &previous_selection).map_err(|u| vec![u.to_string()])?;
    let design =
        to_site_design(&resolved, &selection).map_err(|e| e.iter().map(ToString::to_string).collect::<Vec<_>>())?;
    Ok(Planned { effective: pb::SiteDesign::from(&design), resolved, selection })
}

/// What changed between two effective designs, node by node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    /// Node name and the fields that differ.
    pub changed: Vec<(String, Vec<&'static str>)>,
    pub site_fields: Vec<&'static str>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty() && self.site_fields.is_empty()
    }
}

/// Compares a site's effective design before and after.
pub fn changes(before: Option<&pb::SiteDesign>, after: &pb::SiteDesign) -> Changes {
    let index = |d: Option<&pb::SiteDesign>| -> BTreeMap<String, pb::NodeSpec> {
        d.map(|d| d.nodes.iter().map(|n| (n.name.clone(), n.clone())).collect()).unwrap_or_default()
    };
    let (old, new) = (index(before), index(Some(after)));
    let mut out = Changes {
        added: new.keys().filter(|k| !old.contains_key(*k)).cloned().collect(),
        removed: old.keys().filter(|k| !new.contains_key(*k)).cloned().collect(),
        ..Default::default()
    };
    for (name, n) in &new {
        let Some(o) = old.get(name) else { continue };
        let fields: Vec<&'static str> = [
            ("role", o.role != n.role),
            ("bootMac", o.boot_mac != n.boot_mac),
            ("bmcAddress", o.bmc_address != n.bmc_address),
            ("labels", o.labels != n.labels),
        ]
        .into_iter()
        .filter_map(|(f, differs)| differs.then_some(f))
        .collect();
        if !fields.is_empty() {
            out.changed.push((name.clone(), fields));
        }
    }
    if let Some(b) = before {
        if b.labels != after.labels {
            out.site_fields.push("labels");
        }
        let sets = |d: &pb::SiteDesign| {
            d.packages
                .iter()
                .map(|r| {
                    (r.role, r.packages.iter().map(|p| (p.name.clone(), p.version.clone())).collect::<BTreeSet<_>>())
                })
                .collect::<BTreeMap<_, _>>()
        };
        if sets(b) != sets(after) {
            out.site_fields.push("packages");
        }
        if b.maintenance_windows != after.maintenance_windows {
            out.site_fields.push("maintenanceWindows");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::design::fixtures;

    fn example() -> String {
        fixtures::design(
            &fixtures::site(
                "{ count: 3, standby: 0, selector: {}, topologyKey: rack }",
                "{ count: 2, standby: 0, selector: {}, topologyKey: \"\" }",
            ),
            &[
                (1, "control", "r1"),
                (2, "control", "r2"),
                (3, "control", "r3"),
                (4, "worker", "r1"),
                (5, "worker", "r2"),
            ],
        )
    }

    fn source(text: &str) -> Vec<pb::DesignSource> {
        vec![pb::DesignSource { name: "site.yaml".into(), text: text.into() }]
    }

    #[test]
    fn the_documented_example_plans_and_reapplies_as_unchanged() {
        let text = &example();
        let catalog = fixtures::catalog();
        let site = SiteId::try_from("edge-01").unwrap();
        let planned = plan(&site, &source(text), &catalog, None).expect("valid");
        assert_eq!(planned.selection.masters.active.len(), 3);
        assert_eq!(planned.effective.nodes.len(), 5);
        let rev = planned.revision(1, source(text), "cmd", 0);
        let again = plan(&site, &source(text), &catalog, Some(&rev)).expect("valid");
        assert!(again.same_as(&rev));
        assert!(changes(rev.effective.as_ref(), &again.effective).is_empty());

        let windowed = text.replace(
            "kind: Site\n",
            "kind: Site\nmaintenanceWindows: [{ cron: '0 22 * * *', timeZone: UTC, duration: 4h }]\n",
        );
        let planned = plan(&site, &source(&windowed), &catalog, Some(&rev)).expect("valid");
        assert!(!planned.same_as(&rev));
        assert_eq!(changes(rev.effective.as_ref(), &planned.effective).site_fields, ["maintenanceWindows"]);
    }

    #[test]
    fn a_source_that_does_not_parse_hides_no_error_of_the_others() {
        // `worker` does not parse (an unknown field); node-4 is on it, node-5 on a profile
        // whose chain passes through it, node-2 on another profile.
        let text = example()
            .replace("name: worker\nparent: base\n", "name: worker\nparent: base\nrack: r9\n")
            .replace("ip: 10.1.0.14 }", "ip: 10.1.1.14 }")
            .replace("bootMac: 52:54:00:00:01:05", "bootMac: 52:54:00:00:01:01")
            .replace("{ network: oob, ip: 10.0.0.102 }", "{ network: storage, ip: 10.5.0.102 }");
        let mut sources = source(&text);
        sources.push(pb::DesignSource {
            name: "more.yaml".into(),
            text: "kind: HostProfile\nname: small-worker\nparent: worker\n---\nkind: Node\nname: node-6\n\
                   hostProfile: small-worker\nbootMac: 52:54:00:00:01:06\nbmc: { address: ipmi://10.0.0.6 }\n\
                   addressing: [{ network: provisioning, ip: 10.1.0.16 }]\n"
                .into(),
        });
        let site = SiteId::try_from("edge-01").unwrap();
        let errors = plan(&site, &sources, &fixtures::catalog(), None).unwrap_err();
        let fields: Vec<&str> = errors.iter().map(|e| e.split(": ").take(2).collect::<Vec<_>>()[1]).collect();
        assert_eq!(
            fields,
            ["(document)", "addressing[storage]", "addressing[provisioning].ip", "bootMac"],
            "{errors:#?}"
        );
        assert!(errors[0].starts_with("HostProfile/worker (site.yaml #6): (document): unknown field `rack`"));
        assert!(errors[1].starts_with("Node/node-2 (site.yaml #9): addressing[storage]: no network named"));
        assert!(errors[2].starts_with("Node/node-4 (site.yaml #11): addressing[provisioning].ip: 10.1.1.14 is not in"));
        assert!(errors[3].starts_with("Node/node-5 (site.yaml #12): bootMac: 52:54:00:00:01:01 is already"));
    }

    #[test]
    fn a_design_for_another_site_is_refused() {
        let site = SiteId::try_from("edge-99").unwrap();
        let err = plan(&site, &source(&example()), &fixtures::catalog(), None).unwrap_err();
        assert!(err[0].contains("not edge-99"), "{err:?}");
        assert_eq!(plan(&site, &[], &fixtures::catalog(), None).unwrap_err(), ["no design documents"]);
    }
}
