//! What nodes run, as their gateways last reported, against what their site's design wants:
//! for `landfall status` and the HTTP API's site views.

use std::collections::{BTreeMap, BTreeSet};

use bus_schema::pb;
use serde_json::json;

use super::human::{kind_label, rfc3339_ms, role_label};

/// What the design wants each node of `role` to run: package name → version.
pub fn desired_versions(design: &pb::SiteDesign, role: i32) -> BTreeMap<&str, &str> {
    design
        .packages
        .iter()
        .filter(|rp| rp.role == role)
        .flat_map(|rp| rp.packages.iter().map(|p| (p.name.as_str(), p.version.as_str())))
        .collect()
}

/// One package a node runs, as observed, with the version the design wants and whether they differ.
pub fn observed_package_json(name: &str, version: &str, kind: i32, wants: &BTreeMap<&str, &str>) -> serde_json::Value {
    let desired = wants.get(name).copied();
    json!({
        "name": name,
        "version": version,
        "kind": kind_label(kind),
        "desired": desired,
        "differs": desired.is_some_and(|d| d != version),
    })
}

/// Per node of the design (then any other node observed at the site): the packages it runs
/// as its gateway last reported, each with the version the design wants when it differs.
pub fn observed_json(design: &pb::SiteDesign, observed: &[&pb::NodeObserved]) -> serde_json::Value {
    let by_node: BTreeMap<&str, &pb::NodeObserved> = observed.iter().map(|o| (o.node.as_str(), *o)).collect();
    let mut nodes: Vec<(&str, i32)> = design.nodes.iter().map(|n| (n.name.as_str(), n.role)).collect();
    let in_design: BTreeSet<&str> = nodes.iter().map(|(n, _)| *n).collect();
    nodes.extend(observed.iter().filter(|o| !in_design.contains(o.node.as_str())).map(|o| (o.node.as_str(), o.role)));
    let out: Vec<serde_json::Value> = nodes
        .into_iter()
        .map(|(node, role)| {
            let wants = desired_versions(design, role);
            let Some(o) = by_node.get(node) else {
                return json!({ "node": node, "role": role_label(role), "observed": false, "packages": [] });
            };
            let packages: Vec<serde_json::Value> =
                o.packages.iter().map(|p| observed_package_json(&p.name, &p.version, p.kind, &wants)).collect();
            json!({
                "node": node,
                "role": role_label(role),
                "observed": true,
                "in_design": in_design.contains(node),
                "updated": rfc3339_ms(o.updated_unix_ms),
                "packages": packages,
            })
        })
        .collect();
    serde_json::Value::Array(out)
}

/// One observed package for people: `kubelet 1.29.2`, or `kubelet 1.29.2 (wants 1.30.0)`.
pub fn package_text(name: &str, version: &str, desired: Option<&str>) -> String {
    match desired {
        Some(d) if d != version => format!("{name} {version} (wants {d})"),
        _ => format!("{name} {version}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn design() -> pb::SiteDesign {
        let node =
            |name: &str, role: pb::Role| pb::NodeSpec { name: name.into(), role: role as i32, ..Default::default() };
        let kubelet = |v: &str| vec![pb::PackageRef { name: "kubelet".into(), version: v.into() }];
        pb::SiteDesign {
            site_id: "edge-01".into(),
            nodes: vec![
                node("node-1", pb::Role::Master),
                node("node-2", pb::Role::Worker),
                node("node-3", pb::Role::Worker),
            ],
            packages: vec![
                pb::RolePackages { role: pb::Role::Master as i32, packages: kubelet("1.30.0") },
                pb::RolePackages { role: pb::Role::Worker as i32, packages: kubelet("1.29.2") },
            ],
            ..Default::default()
        }
    }

    fn observed(node: &str, packages: &[(&str, &str)]) -> pb::NodeObserved {
        pb::NodeObserved {
            site_id: "edge-01".into(),
            node: node.into(),
            packages: packages
                .iter()
                .map(|(n, v)| pb::ObservedPackage {
                    name: n.to_string(),
                    version: v.to_string(),
                    kind: pb::PackageKind::Binary as i32,
                })
                .collect(),
            updated_unix_ms: 1_700_000_000_000,
            ..Default::default()
        }
    }

    #[test]
    fn observed_versions_are_marked_where_they_differ_from_the_design() {
        let (n1, n2, stray) = (
            observed("node-1", &[("kubelet", "1.29.2"), ("ubuntu", "22.04")]),
            observed("node-2", &[("kubelet", "1.29.2")]),
            observed("node-9", &[]),
        );
        let v = observed_json(&design(), &[&n1, &n2, &stray]);
        assert_eq!(v[0]["packages"][0]["desired"], "1.30.0");
        assert_eq!(v[0]["packages"][0]["differs"], true);
        assert_eq!(v[0]["packages"][1]["desired"], serde_json::Value::Null, "not in the design");
        assert_eq!(v[0]["packages"][1]["differs"], false);
        assert_eq!(v[1]["packages"][0]["differs"], false);
        assert_eq!(v[1]["role"], "worker");
        assert_eq!(v[2]["observed"], false, "node-3 never reported");
        assert_eq!((v[3]["node"].as_str(), v[3]["in_design"].as_bool()), (Some("node-9"), Some(false)));
        assert_eq!(v[0]["updated"], "2023-11-14T22:13:20Z");
    }

    #[test]
    fn packages_read_as_people_say_them() {
        assert_eq!(package_text("kubelet", "1.29.2", Some("1.30.0")), "kubelet 1.29.2 (wants 1.30.0)");
        assert_eq!(package_text("kubelet", "1.30.0", Some("1.30.0")), "kubelet 1.30.0");
        assert_eq!(package_text("ubuntu", "22.04", None), "ubuntu 22.04");
    }
}
