//! From a resolved and selected site to the flat [`SiteDesign`] the InstallSite saga takes.

use std::collections::{BTreeMap, BTreeSet};

use super::error::{DesignError, Errors};
use super::resolve::{EffectiveNode, ResolvedSite};
use super::select::Selection;
use crate::domain::{ClusterBuild, NodeDesign, PackageRef, Role, SiteDesign};

/// The flat [`SiteDesign`] of a validated site and its selection.
///
/// Holds the active nodes of the selection (standby nodes are held back until promoted), each
/// with its node set's role, boot MAC, BMC address, and labels: its effective labels (`rack`
/// among them) and the selection's labels. Per role, the packages are those of the role's
/// nodes, which must agree for now: a node whose package set differs from the first node of
/// its role is an error. The site's labels gain `region` when the site names one. The site's
/// maintenance windows are those of its active nodes, which must agree (the Site document's, when
/// it gives any, hold for every node).
pub fn to_site_design(site: &ResolvedSite, selection: &Selection) -> Result<SiteDesign, Vec<DesignError>> {
    let mut errors = Errors::default();
    let selection_labels = selection.labels();
    let mut nodes = Vec::new();
    let mut packages: BTreeMap<Role, Vec<PackageRef>> = BTreeMap::new();
    // A chart runs once per cluster: every node that runs it must give it the same values.
    let mut values: BTreeMap<String, (&EffectiveNode, Option<serde_json::Value>)> = BTreeMap::new();
    let mut cluster_nodes: Vec<&EffectiveNode> = Vec::new();
    for role in [Role::Master, Role::Worker] {
        let mut first: Option<&EffectiveNode> = None;
        for name in &selection.node_set(role).active {
            let Some(node) = site.nodes.get(name) else {
                errors.push(
                    site.origin
                        .error("cluster", format!("the selection names {name}, which is not a node of the site")),
                );
                continue;
            };
            cluster_nodes.push(node);
            let mut labels = node.label_values();
            labels.extend(selection_labels.get(name).cloned().unwrap_or_default());
            nodes.push(NodeDesign {
                name: name.clone(),
                role,
                boot_mac: node.boot_mac.clone(),
                bmc_address: node.bmc_address.clone(),
                labels,
                network: super::links::node_network(&site.site, node),
                root_device: super::links::root_device(node),
                kernel_parameters: node.kernel_parameters.iter().map(|(k, v)| (k.clone(), v.value.clone())).collect(),
                cleaning: node.cleaning.value().map_or(crate::pb::CleaningMode::Unspecified, |c| (*c).into()),
            });
            for package in node.packages.keys() {
                let own = node.values_of(package);
                match values.get(package) {
                    None => {
                        values.insert(package.clone(), (node, own));
                    }
                    Some((other, theirs)) if *theirs != own => errors.push(node.origin.error(
                        "packages",
                        format!(
                            "{package} runs once for the cluster, and {} gives it other values than {} (its host \
                             profiles differ in them)",
                            node.name, other.name
                        ),
                    )),
                    Some(_) => {}
                }
            }
            match first {
                None => {
                    first = Some(node);
                    packages.insert(role, node.package_refs());
                }
                Some(first) => {
                    if let Some(error) = package_mismatch(role, first, node) {
                        errors.push(error);
                    }
                }
            }
        }
    }
    let mut labels = site.site.labels.clone();
    if let Some(region) = &site.site.region {
        labels.insert("region".to_string(), region.clone());
    }
    let cluster = cluster_build(site, selection);
    for package in site.site.values.keys().filter(|p| !values.contains_key(*p)) {
        errors.push(site.origin.error(format!("values.{package}"), format!("no node of the cluster runs {package}")));
    }
    let values = values.into_iter().filter_map(|(package, (_, v))| Some((package, v?))).collect();
    let maintenance_windows = super::windows::of_cluster(&cluster_nodes, &mut errors);
    let design = SiteDesign { site: site.id.clone(), labels, nodes, packages, cluster, values, maintenance_windows };
    errors.into_result(design)?.validate().map_err(|e| vec![site.origin.error(e.field, e.reason)])
}

/// How the site's cluster is built, as its Site document says, with the standby nodes the
/// selection holds ready as each node set's spare hosts.
fn cluster_build(site: &ResolvedSite, selection: &Selection) -> ClusterBuild {
    let Some(spec) = &site.site.cluster else { return ClusterBuild::default() };
    spec.build(|role| u32::try_from(selection.node_set(role).standby.len()).unwrap_or(u32::MAX))
}

/// The error when `node` runs other packages than `first`, the first node of its role.
fn package_mismatch(role: Role, first: &EffectiveNode, node: &EffectiveNode) -> Option<DesignError> {
    let theirs: BTreeSet<PackageRef> = first.package_refs().into_iter().collect();
    let own: BTreeSet<PackageRef> = node.package_refs().into_iter().collect();
    if own == theirs {
        return None;
    }
    let keys = |set: BTreeSet<&PackageRef>| {
        let keys: Vec<String> = set.into_iter().map(PackageRef::key).collect();
        if keys.is_empty() { "nothing".to_string() } else { keys.join(", ") }
    };
    Some(node.origin.error(
        "packages",
        format!(
            "per-role package sets must agree for now, but {} (a {}) alone has {} and {} alone has {}",
            node.name,
            role.as_str(),
            keys(own.difference(&theirs).collect()),
            first.name,
            keys(theirs.difference(&own).collect()),
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::design::fixtures::{design, resolved, site};
    use crate::design::select::{ROLE_LABEL, STANDBY_LABEL, select};

    #[test]
    fn the_active_nodes_with_their_roles_labels_and_packages() {
        let text = design(
            &site("{ count: 2, topologyKey: rack }", "{ count: 1, standby: 1 }"),
            &[(1, "control", "r1"), (2, "control", "r2"), (3, "worker", "r1"), (4, "worker", "r2")],
        );
        let site = resolved(&text);
        let selection = select(&site, &Selection::default()).unwrap();
        let flat = to_site_design(&site, &selection).unwrap();

        assert_eq!(flat.site.as_str(), "edge-01");
        assert_eq!(
            flat.labels,
            BTreeMap::from([("region".to_string(), "eu-west".to_string()), ("tier".to_string(), "gold".to_string())])
        );
        let nodes: Vec<(&str, Role)> = flat.nodes.iter().map(|n| (n.name.as_str(), n.role)).collect();
        assert_eq!(nodes, [("node-1", Role::Master), ("node-2", Role::Master), ("node-3", Role::Worker)]);
        let node_1 = flat.node("node-1").unwrap();
        assert_eq!(node_1.boot_mac.as_str(), "52:54:00:00:01:01");
        assert_eq!(node_1.bmc_address.as_str(), "ipmi://10.0.0.1");
        assert_eq!(
            node_1.labels,
            BTreeMap::from([
                ("hw".to_string(), "r640".to_string()),
                (ROLE_LABEL.to_string(), "master".to_string()),
                ("rack".to_string(), "r1".to_string()),
            ])
        );
        assert!(flat.nodes.iter().all(|n| !n.labels.contains_key(STANDBY_LABEL)), "standby nodes are held back");
        let keys = |role| flat.packages_for(role).iter().map(PackageRef::key).collect::<Vec<_>>();
        assert_eq!(keys(Role::Master), ["etcd@3.5.12", "kubelet@1.29.1", "ubuntu@22.04"]);
        assert_eq!(keys(Role::Worker), ["kubelet@1.29.1", "ubuntu@22.04"]);
    }

    #[test]
    fn nodes_of_one_role_must_run_the_same_packages_for_now() {
        let text = design(
            &site("{ count: 1 }", "{ count: 2 }"),
            &[(1, "control", "r1"), (2, "worker", "r1"), (3, "newer-worker", "r2")],
        ) + "---\nkind: HostProfile\nname: newer-worker\nparent: worker\npackages: [{ name: kubelet, version: 1.30.0 }]\n";
        let site = resolved(&text);
        let selection = select(&site, &Selection::default()).unwrap();
        let errors = to_site_design(&site, &selection).unwrap_err();
        let got: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(
            got,
            ["Node/node-3 (site.yaml #10): packages: per-role package sets must agree for now, but node-3 \
                 (a worker) alone has kubelet@1.30.0 and node-2 alone has kubelet@1.29.1"]
        );
    }

    #[test]
    fn a_charts_values_come_from_the_profiles_then_the_site_and_every_node_must_agree() {
        let valued = "---\nkind: HostProfile\nname: valued\nparent: worker\npackages:\n  - { name: kubelet, version: \
                      1.29.1, values: { ipam: { size: 28 }, '!debug': ~ } }\n";
        let text = design(
            &site("{ count: 1 }", "{ count: 2 }"),
            &[(1, "control", "r1"), (2, "valued", "r1"), (3, "valued", "r2")],
        )
        .replace(
            "kind: Site\n",
            "kind: Site\nvalues: { kubelet: { cluster: '${site.id}', ipam: { strict: true } } }\n",
        ) + valued;
        let site = resolved(&text);
        let selection = select(&site, &Selection::default()).unwrap();
        let errors = to_site_design(&site, &selection).unwrap_err();
        let got: Vec<String> = errors.iter().map(ToString::to_string).collect();
        // The master has the site's values alone; each worker its profile's under them.
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(
            got.iter().all(|e| e.contains("kubelet runs once for the cluster") && e.contains("than node-1")),
            "{got:?}"
        );

        // The master runs kubelet too: with the same values everywhere, they are the site's.
        let all_valued = text.replace("hostProfile: control", "hostProfile: valued-control")
            + "---\nkind: HostProfile\nname: valued-control\nparent: control\npackages:\n  - { name: kubelet, version: \
               1.29.1, values: { ipam: { size: 28 }, '!debug': ~ } }\n";
        let site = resolved(&all_valued);
        let selection = select(&site, &Selection::default()).unwrap();
        let flat = to_site_design(&site, &selection).unwrap();
        assert_eq!(
            flat.values["kubelet"],
            serde_json::json!({"cluster": "${site.id}", "ipam": {"size": 28, "strict": true}})
        );
    }
}
