//! A rollout's plan before it starts (`package patch --dry-run`): per wave its sites and
//! their nodes, from → to, and the totals.

use std::fmt::Write as _;

use bus_schema::rollout::Plan;
use serde_json::{Value, json};

use super::human::{plural, role_label};

/// The plan as JSON: totals, then per wave its sites and their nodes, from → to.
pub fn plan_json(name: &str, version: &str, plan: &Plan) -> Value {
    let waves: Vec<Value> = (0..plan.wave_ends.len())
        .map(|w| {
            let sites = &plan.sites[plan.wave(w)];
            let sites: Vec<Value> = sites
                .iter()
                .map(|s| {
                    let nodes: Vec<Value> = s
                        .nodes
                        .iter()
                        .map(|n| {
                            json!({
                                "node": n.spec.name,
                                "role": role_label(n.spec.role),
                                "from_version": n.from_version,
                                "to_version": version,
                            })
                        })
                        .collect();
                    json!({ "site": s.site, "canary": s.canary, "nodes": nodes })
                })
                .collect();
            json!({ "wave": w + 1, "canary": plan.sites[plan.wave(w)].iter().all(|s| s.canary), "sites": sites })
        })
        .collect();
    json!({
        "package": { "name": name, "version": version },
        "sites": plan.sites.len(),
        "planned_nodes": plan.planned_nodes,
        "nodes_at_target": plan.nodes_at_target,
        "nodes_not_installed": plan.nodes_not_installed,
        "failure_threshold": plan.failure_threshold,
        "waves": waves,
    })
}

/// The plan for people: per wave its sites (canaries marked), their nodes from → to, totals.
pub fn plan_text(name: &str, version: &str, plan: &Plan) -> String {
    let mut out = String::new();
    let waves = plan.wave_ends.len();
    if plan.sites.is_empty() {
        let _ = writeln!(out, "{name} → {version}: nothing to patch (no selected node runs {name} at another version)");
    } else {
        let _ = writeln!(
            out,
            "{name} → {version}: {} on {}, in {}",
            plural(plan.planned_nodes, "node", "nodes"),
            plural(plan.sites.len() as u64, "site", "sites"),
            plural(waves as u64, "wave", "waves"),
        );
    }
    for w in 0..waves {
        let sites = &plan.sites[plan.wave(w)];
        let canary = if sites.iter().all(|s| s.canary) { " (canary)" } else { "" };
        let _ = writeln!(out, "\nwave {} of {waves}{canary}: {}", w + 1, plural(sites.len() as u64, "site", "sites"));
        for s in sites {
            let mark = if s.canary { " (canary)" } else { "" };
            let _ = writeln!(out, "  {}{mark}: {}", s.site, plural(s.nodes.len() as u64, "node", "nodes"));
            let width = s.nodes.iter().map(|n| n.spec.name.len()).max().unwrap_or(0);
            for n in &s.nodes {
                let from = if n.from_version.is_empty() { "(none)" } else { n.from_version.as_str() };
                let _ =
                    writeln!(out, "    {:<width$}  {:<6}  {from} → {version}", n.spec.name, role_label(n.spec.role));
            }
        }
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "planned nodes      {}", plan.planned_nodes);
    let _ = writeln!(out, "at {version:<15} {}  (left alone)", plan.nodes_at_target);
    let _ =
        writeln!(out, "not installed      {}  (nothing observed yet: left to their install)", plan.nodes_not_installed);
    let _ = writeln!(
        out,
        "failure threshold  {}  (the rollout halts when more than {} fail)",
        plan.failure_threshold,
        plural(plan.failure_threshold, "node", "nodes")
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::a_plan;

    #[test]
    fn plans_print_per_wave_with_canaries_and_totals() {
        let text = plan_text("kubelet", "1.30.0", &a_plan());
        let expected = "\
kubelet → 1.30.0: 4 nodes on 3 sites, in 2 waves

wave 1 of 2 (canary): 1 site
  edge-05 (canary): 1 node
    node-1  worker  1.29.2 → 1.30.0

wave 2 of 2: 2 sites
  edge-01: 2 nodes
    node-1  worker  1.29.2 → 1.30.0
    node-2  worker  (none) → 1.30.0
  edge-02: 1 node
    node-1  worker  1.28.0 → 1.30.0

planned nodes      4
at 1.30.0          2  (left alone)
not installed      1  (nothing observed yet: left to their install)
failure threshold  1  (the rollout halts when more than 1 node fail)
";
        assert_eq!(text, expected);
        let json = plan_json("kubelet", "1.30.0", &a_plan());
        assert_eq!(json["waves"][0]["canary"], true);
        assert_eq!(json["waves"][1]["canary"], false);
        assert_eq!(json["waves"][1]["sites"][0]["nodes"][1]["from_version"], "");
        assert_eq!(json["waves"][1]["sites"][1]["nodes"][0]["to_version"], "1.30.0");
        assert_eq!(json["planned_nodes"], 4);
        let empty = Plan { sites: vec![], wave_ends: vec![], planned_nodes: 0, ..a_plan() };
        assert!(plan_text("kubelet", "1.30.0", &empty).starts_with("kubelet → 1.30.0: nothing to patch"));
    }
}
