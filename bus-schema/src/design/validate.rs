//! The design rules, checked before anything runs: every error at once, each naming its
//! document, field and reason.
//!
//! On top of what [`super::resolve()`] reports (unknown parents, hardware and host profiles,
//! cycles, duplicate names, malformed names and addresses), a design must have:
//! - unique boot MACs and unique IP addresses across all nodes (hostnames are node names, which
//!   are unique and DNS labels);
//! - known networks wherever interfaces, addresses and the cluster name one, networks defined
//!   once, and every address inside its network;
//! - a role on every node, and a master: some node with role master, and `cluster.masters.count`
//!   of at least one;
//! - every node reachable on the cluster's API network;
//! - only packages the catalog holds, at the versions it holds.
//!
//! Profiles are checked as written (their interfaces' networks, their packages), so a profile
//! no node uses yet is checked too; nodes are checked as resolved.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::document::{Body, Document, Interface, Kind, Origin, Site};
use super::error::{DesignError, Errors};
use super::inherit::Setting;
use super::resolve::{EffectiveNode, ResolvedSite, resolve_all};
use crate::domain::{MacAddress, NodeName, PackageRef, Role};

/// Resolves the documents of one site and checks every design rule against them and the
/// package `catalog`. Returns the resolved site, or every error found (resolution errors
/// first); when any error is returned, nothing of the design may be applied.
pub fn validate(docs: &[Document], catalog: &BTreeSet<PackageRef>) -> Result<ResolvedSite, Vec<DesignError>> {
    let mut resolution = resolve_all(docs);
    let mut found = Errors::default();
    let site = resolution.site.as_ref().map(|(origin, site, _)| (origin, site));
    check_profiles(docs, site.map(|(_, s)| s), catalog, &mut found);
    check(site, &resolution.nodes, &mut found);
    resolution.errors.extend(found.into_vec());
    resolution.into_site()
}

/// The profiles as written: their interfaces name known networks, their packages are in the
/// catalog.
fn check_profiles(docs: &[Document], site: Option<&Site>, catalog: &BTreeSet<PackageRef>, errors: &mut Errors) {
    for doc in docs {
        let (interfaces, packages): (&[Interface], &[PackageRef]) = match &doc.body {
            Body::HardwareProfile(hw) => (&hw.interfaces.set, &[]),
            Body::HostProfile(host) => (&host.interfaces.set, &host.packages.set),
            Body::Site(_) | Body::Node(_) => continue,
        };
        let origin = doc.origin();
        if let Some(site) = site {
            for interface in interfaces {
                if let Some(network) = &interface.network
                    && !site.networks.iter().any(|n| &n.name == network)
                {
                    errors.push(
                        origin.error(format!("interfaces[{}].network", interface.name), unknown_network(network, site)),
                    );
                }
            }
        }
        for package in packages.iter().filter(|p| !catalog.contains(*p)) {
            errors.push(origin.error(format!("packages[{}]", package.name), not_in_catalog(package, catalog)));
        }
    }
}

/// Every rule about the site and its resolved nodes; `site` is missing when the design has none.
fn check(site: Option<(&Origin, &Site)>, nodes: &BTreeMap<NodeName, EffectiveNode>, errors: &mut Errors) {
    if let Some((origin, site)) = site {
        check_site(origin, site, errors);
        check_has_master(origin, nodes, errors);
    }
    for node in nodes.values() {
        check_role(node, errors);
        check_addresses(site.map(|(_, s)| s), node, errors);
    }
    check_unique_macs(nodes, errors);
    check_unique_ips(nodes, errors);
}

/// Networks defined once; the cluster's API network known; at least one master wanted.
fn check_site(origin: &Origin, site: &Site, errors: &mut Errors) {
    let mut names = BTreeSet::new();
    for network in &site.networks {
        if !names.insert(network.name.as_str()) {
            errors.push(origin.error(format!("networks[{}]", network.name), "this network is defined twice"));
        }
    }
    let Some(cluster) = &site.cluster else { return };
    if !names.contains(cluster.api_network.as_str()) {
        errors.push(origin.error("cluster.apiNetwork", unknown_network(&cluster.api_network, site)));
    }
    if cluster.masters.count == 0 {
        errors.push(origin.error("cluster.masters.count", "a site needs at least one master"));
    }
}

/// Some node has role master.
fn check_has_master(origin: &Origin, nodes: &BTreeMap<NodeName, EffectiveNode>, errors: &mut Errors) {
    if !nodes.values().any(|n| n.role() == Some(Role::Master)) {
        errors.push(origin.error("nodes", "no node has role master: a site needs at least one"));
    }
}

/// The node's chain sets a role. A node without a known host profile is already reported.
fn check_role(node: &EffectiveNode, errors: &mut Errors) {
    let profiles: Vec<String> = node.chain.iter().filter(|o| o.kind != Kind::Node).map(ToString::to_string).collect();
    let reason = match &node.role {
        Setting::Set(_) => return,
        Setting::Unset if profiles.is_empty() => return,
        Setting::Cleared(by) => format!("no role: {by} clears it"),
        Setting::Unset => format!("no role: none of {} sets one", profiles.join(", ")),
    };
    errors.push(node.origin.error("role", reason));
}

/// Addresses name known networks and lie in them, and the node has an address on the cluster's
/// API network.
fn check_addresses(site: Option<&Site>, node: &EffectiveNode, errors: &mut Errors) {
    let Some(site) = site else { return };
    for (network, ip) in &node.addresses {
        match site.networks.iter().find(|n| &n.name == network) {
            None => errors.push(node.origin.error(format!("addressing[{network}]"), unknown_network(network, site))),
            Some(n) if !n.cidr.contains(*ip) => errors.push(
                node.origin
                    .error(format!("addressing[{network}].ip"), format!("{ip} is not in {network} ({})", n.cidr)),
            ),
            Some(_) => {}
        }
    }
    if let Some(cluster) = &site.cluster
        && site.networks.iter().any(|n| n.name == cluster.api_network)
        && !node.addresses.contains_key(&cluster.api_network)
    {
        errors.push(node.origin.error(
            "addressing",
            format!("no address on {}, the cluster's API network: every node needs one", cluster.api_network),
        ));
    }
}

/// No two nodes boot from the same MAC.
fn check_unique_macs(nodes: &BTreeMap<NodeName, EffectiveNode>, errors: &mut Errors) {
    let mut first: BTreeMap<&MacAddress, &EffectiveNode> = BTreeMap::new();
    for node in nodes.values() {
        match first.get(&node.boot_mac) {
            Some(other) => {
                errors.push(node.origin.error(
                    "bootMac",
                    format!("{} is already the boot MAC of {}", node.boot_mac, other.origin.location()),
                ))
            }
            None => {
                first.insert(&node.boot_mac, node);
            }
        }
    }
}

/// No IP address is used twice, on any network by any node.
fn check_unique_ips(nodes: &BTreeMap<NodeName, EffectiveNode>, errors: &mut Errors) {
    let mut first: BTreeMap<IpAddr, (&EffectiveNode, &str)> = BTreeMap::new();
    for node in nodes.values() {
        for (network, ip) in &node.addresses {
            match first.get(ip) {
                Some((other, on)) => errors.push(node.origin.error(
                    format!("addressing[{network}].ip"),
                    format!("{ip} is already used by {} on {on}", other.origin.location()),
                )),
                None => {
                    first.insert(*ip, (node, network));
                }
            }
        }
    }
}

/// Why a network name is refused.
fn unknown_network(name: &str, site: &Site) -> String {
    let mut known: Vec<&str> = Vec::new();
    for network in &site.networks {
        if !known.contains(&network.name.as_str()) {
            known.push(&network.name);
        }
    }
    let known = if known.is_empty() { "none".to_string() } else { known.join(", ") };
    format!("no network named {name:?} in Site/{} (it has {known})", site.name)
}

/// Why a package is refused: the versions the catalog has of it, if any.
fn not_in_catalog(package: &PackageRef, catalog: &BTreeSet<PackageRef>) -> String {
    let versions: Vec<String> =
        catalog.iter().filter(|c| c.name == package.name).map(|c| c.version.to_string()).collect();
    if versions.is_empty() {
        format!("{} is not in the catalog, which has no version of {}", package.key(), package.name)
    } else {
        format!("{} is not in the catalog, which has {} {}", package.key(), package.name, versions.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::design::document::parse_documents;
    use crate::design::fixtures::catalog;

    /// A valid design; each case below breaks one rule of it.
    const BASE: &str = r#"kind: Site
name: edge-01
networks:
  - { name: provisioning, cidr: 10.1.0.0/24 }
  - { name: oob, cidr: 10.0.0.0/24 }
cluster:
  apiNetwork: provisioning
  masters: { count: 1 }
  workers: { count: 1 }
---
kind: HardwareProfile
name: r640
interfaces: [{ name: eno1, network: provisioning }]
---
kind: HostProfile
name: base
hardwareProfile: r640
role: worker
packages: [{ name: ubuntu, version: "22.04" }]
---
kind: HostProfile
name: control
parent: base
role: master
---
kind: Node
name: node-1
hostProfile: control
bootMac: 52:54:00:00:01:01
bmc: { address: ipmi://10.0.0.1 }
addressing: [{ network: provisioning, ip: 10.1.0.11 }]
---
kind: Node
name: node-2
hostProfile: base
bootMac: 52:54:00:00:01:02
bmc: { address: ipmi://10.0.0.2 }
addressing: [{ network: provisioning, ip: 10.1.0.12 }]
"#;

    /// How a case breaks the base design.
    enum Change {
        /// Replace the first occurrence of a text of the base design.
        Replace(&'static str, &'static str),
        /// Add documents, read from `<case name>.yaml`.
        Add(&'static str),
    }

    /// One broken rule and the one error it must produce.
    struct Case {
        name: &'static str,
        change: Change,
        document: &'static str,
        field: &'static str,
        reason: &'static str,
    }

    /// A node of an added document: `Node/<name>` on `profile` with one provisioning address.
    macro_rules! node {
        ($name:literal, $profile:literal, $mac:literal, $bmc:literal, $addressing:literal) => {
            concat!(
                "kind: Node\nname: ",
                $name,
                "\nhostProfile: ",
                $profile,
                "\nbootMac: ",
                $mac,
                "\nbmc: { address: ",
                $bmc,
                " }\naddressing: ",
                $addressing,
                "\n"
            )
        };
    }

    const CASES: &[Case] = &[
        Case {
            name: "duplicate-mac",
            change: Change::Replace("bootMac: 52:54:00:00:01:02", "bootMac: 52-54-00-00-01-01"),
            document: "Node/node-2 (site.yaml #6)",
            field: "bootMac",
            reason: "52:54:00:00:01:01 is already the boot MAC of Node/node-1 (site.yaml #5)",
        },
        Case {
            name: "duplicate-ip",
            change: Change::Replace("ip: 10.1.0.12", "ip: 10.1.0.11"),
            document: "Node/node-2 (site.yaml #6)",
            field: "addressing[provisioning].ip",
            reason: "10.1.0.11 is already used by Node/node-1 (site.yaml #5) on provisioning",
        },
        Case {
            name: "duplicate-hostname",
            change: Change::Add(node!(
                "node-1",
                "base",
                "52:54:00:00:01:09",
                "ipmi://10.0.0.9",
                "[{ network: provisioning, ip: 10.1.0.19 }]"
            )),
            document: "Node/node-1 (duplicate-hostname.yaml #1)",
            field: "name",
            reason: "hostname node-1 is already used by Node/node-1 (site.yaml #5)",
        },
        Case {
            name: "hostname-not-a-dns-label",
            change: Change::Add(node!(
                "Node_3",
                "base",
                "52:54:00:00:01:03",
                "ipmi://10.0.0.3",
                "[{ network: provisioning, ip: 10.1.0.13 }]"
            )),
            document: "Node/Node_3 (hostname-not-a-dns-label.yaml #1)",
            field: "name",
            reason: "\"Node_3\" must be lowercase letters, digits and '-', not starting or ending with '-'",
        },
        Case {
            name: "unknown-parent",
            change: Change::Add("kind: HostProfile\nname: orphan\nparent: nope\n"),
            document: "HostProfile/orphan (unknown-parent.yaml #1)",
            field: "parent",
            reason: "no HostProfile named \"nope\"",
        },
        Case {
            name: "unknown-hardware-profile",
            change: Change::Add("kind: HostProfile\nname: odd\nparent: base\nhardwareProfile: r999\n"),
            document: "HostProfile/odd (unknown-hardware-profile.yaml #1)",
            field: "hardwareProfile",
            reason: "no HardwareProfile named \"r999\"",
        },
        Case {
            name: "unknown-host-profile",
            change: Change::Add(node!(
                "node-4",
                "missing",
                "52:54:00:00:01:04",
                "ipmi://10.0.0.4",
                "[{ network: provisioning, ip: 10.1.0.14 }]"
            )),
            document: "Node/node-4 (unknown-host-profile.yaml #1)",
            field: "hostProfile",
            reason: "no HostProfile named \"missing\"",
        },
        Case {
            name: "inheritance-cycle",
            change: Change::Add(
                "kind: HostProfile\nname: loop-b\nparent: loop-a\n---\nkind: HostProfile\nname: loop-a\nparent: loop-b\n",
            ),
            document: "HostProfile/loop-a (inheritance-cycle.yaml #2)",
            field: "parent",
            reason: "inheritance cycle: loop-a -> loop-b -> loop-a",
        },
        Case {
            name: "interface-on-unknown-network",
            change: Change::Add(
                "kind: HostProfile\nname: storage\nparent: base\ninterfaces: [{ name: eno3, network: san }]\n",
            ),
            document: "HostProfile/storage (interface-on-unknown-network.yaml #1)",
            field: "interfaces[eno3].network",
            reason: "no network named \"san\" in Site/edge-01 (it has provisioning, oob)",
        },
        Case {
            name: "address-on-unknown-network",
            change: Change::Replace(
                "addressing: [{ network: provisioning, ip: 10.1.0.11 }]",
                "addressing: [{ network: provisioning, ip: 10.1.0.11 }, { network: san, ip: 10.9.0.11 }]",
            ),
            document: "Node/node-1 (site.yaml #5)",
            field: "addressing[san]",
            reason: "no network named \"san\" in Site/edge-01 (it has provisioning, oob)",
        },
        Case {
            name: "address-outside-its-network",
            change: Change::Add(node!(
                "node-5",
                "base",
                "52:54:00:00:01:05",
                "ipmi://10.0.0.5",
                "[{ network: provisioning, ip: 10.2.0.15 }]"
            )),
            document: "Node/node-5 (address-outside-its-network.yaml #1)",
            field: "addressing[provisioning].ip",
            reason: "10.2.0.15 is not in provisioning (10.1.0.0/24)",
        },
        Case {
            name: "no-address-on-the-api-network",
            change: Change::Add(node!(
                "node-6",
                "base",
                "52:54:00:00:01:06",
                "ipmi://10.0.0.6",
                "[{ network: oob, ip: 10.0.0.106 }]"
            )),
            document: "Node/node-6 (no-address-on-the-api-network.yaml #1)",
            field: "addressing",
            reason: "no address on provisioning, the cluster's API network: every node needs one",
        },
        Case {
            name: "node-without-role",
            change: Change::Add(concat!(
                "kind: HostProfile\nname: roleless\nparent: base\nrole: '!'\n---\n",
                node!(
                    "node-7",
                    "roleless",
                    "52:54:00:00:01:07",
                    "ipmi://10.0.0.7",
                    "[{ network: provisioning, ip: 10.1.0.17 }]"
                )
            )),
            document: "Node/node-7 (node-without-role.yaml #2)",
            field: "role",
            reason: "no role: HostProfile/roleless clears it",
        },
        Case {
            name: "site-without-master",
            change: Change::Replace("role: master", "role: worker"),
            document: "Site/edge-01 (site.yaml #1)",
            field: "nodes",
            reason: "no node has role master: a site needs at least one",
        },
        Case {
            name: "cluster-without-master",
            change: Change::Replace("masters: { count: 1 }", "masters: { count: 0 }"),
            document: "Site/edge-01 (site.yaml #1)",
            field: "cluster.masters.count",
            reason: "a site needs at least one master",
        },
        Case {
            name: "network-defined-twice",
            change: Change::Replace(
                "  - { name: oob, cidr: 10.0.0.0/24 }\n",
                "  - { name: oob, cidr: 10.0.0.0/24 }\n  - { name: oob, cidr: 10.3.0.0/24 }\n",
            ),
            document: "Site/edge-01 (site.yaml #1)",
            field: "networks[oob]",
            reason: "this network is defined twice",
        },
        Case {
            name: "version-not-in-catalog",
            change: Change::Add(
                "kind: HostProfile\nname: newer\nparent: base\npackages: [{ name: kubelet, version: 9.9.9 }]\n",
            ),
            document: "HostProfile/newer (version-not-in-catalog.yaml #1)",
            field: "packages[kubelet]",
            reason: "kubelet@9.9.9 is not in the catalog, which has kubelet 1.29.1, 1.30.0",
        },
        Case {
            name: "package-not-in-catalog",
            change: Change::Add(
                "kind: HostProfile\nname: extra\nparent: base\npackages: [{ name: htop, version: \"3.3\" }]\n",
            ),
            document: "HostProfile/extra (package-not-in-catalog.yaml #1)",
            field: "packages[htop]",
            reason: "htop@3.3 is not in the catalog, which has no version of htop",
        },
        Case {
            name: "bmc-scheme-metal3-does-not-know",
            change: Change::Add(node!(
                "node-8",
                "base",
                "52:54:00:00:01:08",
                "telnet://10.0.0.8",
                "[{ network: provisioning, ip: 10.1.0.18 }]"
            )),
            document: "Node/node-8 (bmc-scheme-metal3-does-not-know.yaml #1)",
            field: "bmc.address",
            reason: "scheme \"telnet\" is not one Metal3 knows (ipmi, libvirt, redfish,",
        },
        Case {
            name: "malformed-mac",
            change: Change::Add(node!(
                "node-9",
                "base",
                "52:54:00:00:09",
                "ipmi://10.0.0.9",
                "[{ network: provisioning, ip: 10.1.0.29 }]"
            )),
            document: "Node/node-9 (malformed-mac.yaml #1)",
            field: "bootMac",
            reason: "\"52:54:00:00:09\" is not a MAC address (aa:bb:cc:dd:ee:ff)",
        },
        Case {
            name: "unknown-api-network",
            change: Change::Replace("apiNetwork: provisioning", "apiNetwork: public"),
            document: "Site/edge-01 (site.yaml #1)",
            field: "cluster.apiNetwork",
            reason: "no network named \"public\" in Site/edge-01 (it has provisioning, oob)",
        },
    ];

    /// The base design with `cases` applied.
    fn design_with(cases: &[&Case]) -> Vec<Document> {
        let mut base = BASE.to_string();
        let mut added = Vec::new();
        for case in cases {
            match case.change {
                Change::Replace(from, to) => {
                    assert!(base.contains(from), "{}: {from:?} is not in the base design", case.name);
                    base = base.replacen(from, to, 1);
                }
                Change::Add(yaml) => added.push((case.name, yaml)),
            }
        }
        let mut docs = parse_documents(&base, "site.yaml").unwrap();
        for (name, yaml) in added {
            docs.extend(parse_documents(yaml, &format!("{name}.yaml")).unwrap());
        }
        docs
    }

    fn reports(case: &Case, error: &DesignError) -> bool {
        error.document == case.document && error.field == case.field && error.reason.starts_with(case.reason)
    }

    #[test]
    fn the_base_design_is_valid() {
        let site = validate(&design_with(&[]), &catalog()).unwrap();
        assert_eq!(site.nodes.len(), 2);
    }

    #[test]
    fn each_rule_reports_its_document_field_and_reason() {
        for case in CASES {
            let errors = validate(&design_with(&[case]), &catalog()).unwrap_err();
            assert_eq!(errors.len(), 1, "{}: {errors:#?}", case.name);
            assert!(reports(case, &errors[0]), "{}: {:#?}", case.name, errors[0]);
        }
    }

    #[test]
    fn every_error_is_reported_at_once() {
        // An unknown API network hides the API-address check, so it is left out here.
        let cases: Vec<&Case> = CASES.iter().filter(|c| c.name != "unknown-api-network").collect();
        let errors = validate(&design_with(&cases), &catalog()).unwrap_err();
        for case in &cases {
            assert!(errors.iter().any(|e| reports(case, e)), "{} is missing from {errors:#?}", case.name);
        }
        assert_eq!(errors.len(), cases.len(), "{errors:#?}");
    }

    #[test]
    fn a_profile_no_node_uses_is_checked_too_and_each_error_once() {
        // `newer` is used by two nodes and `unused` by none: one error each.
        let added = concat!(
            "kind: HostProfile\nname: newer\nparent: base\npackages: [{ name: kubelet, version: 9.9.9 }]\n---\n",
            "kind: HostProfile\nname: unused\npackages: [{ name: kubelet, version: 9.9.8 }]\n---\n",
            node!(
                "node-3",
                "newer",
                "52:54:00:00:01:03",
                "ipmi://10.0.0.3",
                "[{ network: provisioning, ip: 10.1.0.13 }]"
            ),
            "---\n",
            node!(
                "node-4",
                "newer",
                "52:54:00:00:01:04",
                "ipmi://10.0.0.4",
                "[{ network: provisioning, ip: 10.1.0.14 }]"
            ),
        );
        let mut docs = design_with(&[]);
        docs.extend(parse_documents(added, "more.yaml").unwrap());
        let errors = validate(&docs, &catalog()).unwrap_err();
        let got: Vec<&str> = errors.iter().map(|e| e.document.as_str()).collect();
        assert_eq!(got, ["HostProfile/newer (more.yaml #1)", "HostProfile/unused (more.yaml #2)"]);
    }

    #[test]
    fn a_node_on_an_unknown_profile_is_not_also_reported_as_roleless() {
        let case = CASES.iter().find(|c| c.name == "unknown-host-profile").unwrap();
        let errors = validate(&design_with(&[case]), &catalog()).unwrap_err();
        assert!(errors.iter().all(|e| e.field != "role"), "{errors:#?}");
    }
}
