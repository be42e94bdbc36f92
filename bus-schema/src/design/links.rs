//! The network a node's interfaces make, and the rules it follows: bonds of the node's ports,
//! VLANs on its interfaces, the site's routes, gateways and name servers.
//!
//! The site's networks are checked as written: a gateway and a route's router on the network
//! they belong to, routes and routers of one address family, search domains that are domain
//! names. A node's interfaces are checked as resolved (a bond's ports may come from the hardware
//! profile and the bond from a host profile), each error located at the document that wrote the
//! interface: a bond of the node's own ports, each in one bond at most and carrying no network
//! of its own; a VLAN with an id from 1 to 4094 on an interface of the node, once per id; and
//! at most one default route, so at most one network with a gateway per node.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::document::{Network, Origin, Site};
use super::error::Errors;
use super::resolve::EffectiveNode;
use crate::pb;

/// The site's networks as written.
pub(crate) fn check_networks(origin: &Origin, site: &Site, errors: &mut Errors) {
    for network in &site.networks {
        let field = |f: &str| format!("networks[{}].{f}", network.name);
        if let Some(gateway) = network.gateway
            && !network.cidr.contains(gateway)
        {
            errors.push(origin.error(field("gateway"), outside(gateway, network)));
        }
        for route in &network.routes {
            let at = field(&format!("routes[{}].via", route.to));
            if route.to.network().is_ipv4() != route.via.is_ipv4() {
                errors.push(
                    origin.error(at, format!("{} and {} are of different address families", route.to, route.via)),
                );
            } else if !network.cidr.contains(route.via) {
                errors.push(origin.error(at, outside(route.via, network)));
            }
        }
        for domain in network.dns.iter().flat_map(|d| &d.search) {
            if !is_domain_name(domain) {
                errors.push(origin.error(
                    field("dns.search"),
                    format!("{domain:?} is not a domain name (labels of letters, digits and '-', dot-separated)"),
                ));
            }
        }
    }
}

fn outside(ip: IpAddr, network: &Network) -> String {
    format!("{ip} is not in {} ({}): a router is reached on the network it serves", network.name, network.cidr)
}

fn is_domain_name(s: &str) -> bool {
    let s = s.strip_suffix('.').unwrap_or(s);
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// A node's interfaces as resolved.
pub(crate) fn check_node(site: Option<&Site>, node: &EffectiveNode, errors: &mut Errors) {
    let interfaces = &node.interfaces;
    // Which bond took each port first, in name order.
    let mut bonded: BTreeMap<&str, &str> = BTreeMap::new();
    let mut vlans: BTreeSet<(&str, u16)> = BTreeSet::new();
    for (name, iface) in interfaces {
        let error = |field: &str, reason: String| iface.origin.error(format!("interfaces[{name}].{field}"), reason);
        let value = &iface.value;
        if value.bond.is_some() && value.vlan.is_some() {
            errors.push(error("vlan", "an interface is a bond or a VLAN, not both".into()));
            continue;
        }
        if let Some(bond) = &value.bond {
            if bond.members.is_empty() {
                errors.push(error("bond.members", "a bond needs at least one port".into()));
            }
            for member in &bond.members {
                let Some(port) = interfaces.get(member) else {
                    errors.push(error("bond.members", format!("no interface named {member:?} to join the bond")));
                    continue;
                };
                if port.value.bond.is_some() || port.value.vlan.is_some() {
                    errors.push(error("bond.members", format!("{member} is not a port: a bond joins physical ports")));
                } else if let Some(first) = bonded.get(member.as_str()) {
                    errors.push(error(
                        "bond.members",
                        format!("{member} is a member of {first} already: a port joins one bond at most"),
                    ));
                } else {
                    bonded.insert(member, name);
                    if let Some(network) = &port.value.network {
                        errors.push(port.origin.error(
                            format!("interfaces[{member}].network"),
                            format!("{member} is a port of {name}, so the bond is on {network}, not the port"),
                        ));
                    }
                }
            }
        }
        if let Some(vlan) = &value.vlan {
            if !(1..=4094).contains(&vlan.id) {
                errors.push(error("vlan.id", format!("VLAN id {} is not from 1 to 4094", vlan.id)));
            } else if !interfaces.contains_key(&vlan.parent) {
                errors.push(error(
                    "vlan.parent",
                    format!("no interface named {:?} to carry VLAN {}", vlan.parent, vlan.id),
                ));
            } else if !vlans.insert((vlan.parent.as_str(), vlan.id)) {
                errors.push(error("vlan.id", format!("VLAN {} is on {} twice", vlan.id, vlan.parent)));
            }
        }
    }
    // A VLAN on a bond's port would bypass the bond.
    for (name, iface) in interfaces {
        if let Some(vlan) = &iface.value.vlan
            && let Some(bond) = bonded.get(vlan.parent.as_str())
        {
            errors.push(iface.origin.error(
                format!("interfaces[{name}].vlan.parent"),
                format!("{} is a port of {bond}: carry VLAN {} on {bond}", vlan.parent, vlan.id),
            ));
        }
    }
    if let Some(site) = site {
        check_default_routes(site, node, errors);
    }
}

/// At most one of the networks the node's interfaces are on has a gateway.
fn check_default_routes(site: &Site, node: &EffectiveNode, errors: &mut Errors) {
    let mut gateways: Vec<(&str, IpAddr)> = Vec::new();
    for iface in node.interfaces.values() {
        let Some(network) = iface.value.network.as_deref().and_then(|n| site.networks.iter().find(|x| x.name == n))
        else {
            continue;
        };
        if let Some(gateway) = network.gateway
            && !gateways.iter().any(|(n, _)| *n == network.name)
        {
            gateways.push((&network.name, gateway));
        }
    }
    if gateways.len() > 1 {
        let which: Vec<String> = gateways.iter().map(|(n, g)| format!("via {g} on {n}")).collect();
        errors.push(node.origin.error(
            "interfaces",
            format!(
                "{} would have {} default routes ({}): give one of these networks a gateway, reach the others by routes",
                node.name,
                gateways.len(),
                which.join(", ")
            ),
        ));
    }
}

/// The node's network as its host is set up with it: every interface (its address on its
/// network from the node's addressing, none meaning DHCP) and the networks they are on. `None`
/// when the design gives the node no interfaces.
pub(crate) fn node_network(site: &Site, node: &EffectiveNode) -> Option<pb::NodeNetwork> {
    if node.interfaces.is_empty() {
        return None;
    }
    let mut on: BTreeSet<&str> = BTreeSet::new();
    let interfaces = node
        .interfaces
        .values()
        .map(|iface| {
            let i = &iface.value;
            let network = i.network.clone().unwrap_or_default();
            if !network.is_empty() {
                on.insert(i.network.as_deref().unwrap_or_default());
            }
            pb::NodeInterface {
                name: i.name.clone(),
                address: node.addresses.get(&network).map(ToString::to_string).unwrap_or_default(),
                network,
                mtu: i.mtu.unwrap_or(0),
                bond_members: i.bond.as_ref().map(|b| b.members.clone()).unwrap_or_default(),
                bond_mode: i.bond.as_ref().map(|b| b.mode.as_str().to_string()).unwrap_or_default(),
                vlan_id: i.vlan.as_ref().map_or(0, |v| u32::from(v.id)),
                vlan_parent: i.vlan.as_ref().map(|v| v.parent.clone()).unwrap_or_default(),
            }
        })
        .collect();
    let networks = site
        .networks
        .iter()
        .filter(|n| on.contains(n.name.as_str()))
        .map(|n| pb::SiteNetwork {
            name: n.name.clone(),
            cidr: n.cidr.to_string(),
            gateway: n.gateway.map(|g| g.to_string()).unwrap_or_default(),
            routes: n
                .routes
                .iter()
                .map(|r| pb::NetworkRoute { to: r.to.to_string(), via: r.via.to_string() })
                .collect(),
            nameservers: n.dns.iter().flat_map(|d| &d.nameservers).map(ToString::to_string).collect(),
            search: n.dns.iter().flat_map(|d| d.search.clone()).collect(),
        })
        .collect();
    Some(pb::NodeNetwork { interfaces, networks })
}

/// The disk the node's image goes on: the storage entry mounted at `/` (else the one named
/// `root`), as Metal3's root device hints.
pub(crate) fn root_device(node: &EffectiveNode) -> Option<pb::RootDeviceHints> {
    let storage = node.storage.values().map(|s| &s.value);
    let root = storage
        .clone()
        .find(|s| s.mount.as_deref() == Some("/"))
        .or_else(|| storage.clone().find(|s| s.name == "root"))?;
    Some(pb::RootDeviceHints { device_name: root.device.clone(), min_size_gigabytes: root.size_gb.unwrap_or(0) })
}

#[cfg(test)]
mod tests {
    use crate::design::document::parse_documents;
    use crate::design::fixtures::catalog;
    use crate::design::validate::validate;

    /// A site whose one node has `interfaces` (on top of the hardware's eno1, on provisioning),
    /// with `networks` added to the site's.
    fn design(networks: &str, interfaces: &str) -> String {
        format!(
            "kind: Site
name: edge-01
networks:
  - {{ name: provisioning, cidr: 10.1.0.0/24 }}
{networks}cluster: {{ apiNetwork: provisioning, masters: {{ count: 1 }} }}
---
kind: HardwareProfile
name: r640
interfaces: [{{ name: eno1, network: provisioning }}, {{ name: eno2 }}, {{ name: eno3 }}]
---
kind: HostProfile
name: control
hardwareProfile: r640
role: master
packages: [{{ name: ubuntu, version: \"22.04\" }}]
interfaces: {interfaces}
---
kind: Node
name: node-1
hostProfile: control
bootMac: 52:54:00:00:01:01
bmc: {{ address: ipmi://10.0.0.1 }}
addressing: [{{ network: provisioning, ip: 10.1.0.11 }}]
"
        )
    }

    fn errors(networks: &str, interfaces: &str) -> Vec<(String, String, String)> {
        let docs = parse_documents(&design(networks, interfaces), "site.yaml").unwrap();
        match validate(&docs, &catalog()) {
            Ok(_) => Vec::new(),
            Err(errors) => errors.into_iter().map(|e| (e.document, e.field, e.reason)).collect(),
        }
    }

    fn one(networks: &str, interfaces: &str) -> (String, String, String) {
        let mut all = errors(networks, interfaces);
        assert_eq!(all.len(), 1, "{all:#?}");
        all.remove(0)
    }

    #[test]
    fn bonds_vlans_routes_and_name_servers_that_fit_are_valid() {
        let networks = "  - { name: storage, cidr: 10.5.0.0/24, routes: [{ to: 10.50.0.0/16, via: 10.5.0.254 }] }
  - { name: public, cidr: 192.0.2.0/24, gateway: 192.0.2.1, dns: { nameservers: [192.0.2.53], search: [edge.example.com] } }
";
        let interfaces = "[{ name: bond0, bond: { members: [eno2, eno3], mode: 802.3ad }, network: public, mtu: 9000 },
             { name: bond0.200, vlan: { id: 200, parent: bond0 }, network: storage }]";
        assert_eq!(errors(networks, interfaces), Vec::<(String, String, String)>::new());
    }

    #[test]
    fn what_the_host_is_set_up_with_comes_from_the_resolved_node_and_its_networks() {
        let networks = "  - { name: storage, cidr: 10.5.0.0/24, routes: [{ to: 10.50.0.0/16, via: 10.5.0.254 }] }
  - { name: public, cidr: 192.0.2.0/24, gateway: 192.0.2.1, dns: { nameservers: [192.0.2.53], search: [edge.example.com] } }
  - { name: unused, cidr: 10.9.0.0/24 }
";
        let interfaces = "[{ name: bond0, bond: { members: [eno2, eno3], mode: 802.3ad }, network: public, mtu: 9000 },
             { name: bond0.200, vlan: { id: 200, parent: bond0 }, network: storage }]";
        let text = design(networks, interfaces)
            .replace("[{ network: provisioning, ip: 10.1.0.11 }]", "[{ network: provisioning, ip: 10.1.0.11 }, { network: public, ip: 192.0.2.11 }]")
            .replace("interfaces: [{ name: eno1, network: provisioning }, { name: eno2 }, { name: eno3 }]", "interfaces: [{ name: eno1, network: provisioning }, { name: eno2 }, { name: eno3 }]\nstorage: [{ name: root, device: /dev/nvme0n1, sizeGb: 400, mount: / }]");
        let docs = parse_documents(&text, "site.yaml").unwrap();
        let site = validate(&docs, &catalog()).unwrap();
        let node = site.node("node-1").unwrap();
        let network = super::node_network(&site.site, node).unwrap();
        let names: Vec<&str> = network.interfaces.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["bond0", "bond0.200", "eno1", "eno2", "eno3"]);
        let bond = &network.interfaces[0];
        assert_eq!((bond.network.as_str(), bond.address.as_str(), bond.mtu), ("public", "192.0.2.11", 9000));
        assert_eq!(
            (bond.bond_members.clone(), bond.bond_mode.as_str()),
            (vec!["eno2".to_string(), "eno3".into()], "802.3ad")
        );
        let vlan = &network.interfaces[1];
        assert_eq!(
            (vlan.vlan_id, vlan.vlan_parent.as_str(), vlan.address.as_str()),
            (200, "bond0", ""),
            "no address: DHCP"
        );
        assert_eq!(network.interfaces[2].address, "10.1.0.11");
        let nets: Vec<&str> = network.networks.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(
            nets,
            ["provisioning", "storage", "public"],
            "the networks its interfaces are on, as the site lists them"
        );
        let public = &network.networks[2];
        assert_eq!(
            (public.gateway.as_str(), public.nameservers.clone(), public.search.clone()),
            ("192.0.2.1", vec!["192.0.2.53".to_string()], vec!["edge.example.com".to_string()])
        );
        assert_eq!(
            network.networks[1].routes,
            [crate::pb::NetworkRoute { to: "10.50.0.0/16".into(), via: "10.5.0.254".into() }]
        );
        assert_eq!(
            crate::host_setup::check_network(&network),
            Ok(()),
            "what the hub sends passes the check on arrival"
        );
        let root = super::root_device(node).unwrap();
        assert_eq!((root.device_name.as_str(), root.min_size_gigabytes), ("/dev/nvme0n1", 400));
    }

    #[test]
    fn a_port_in_two_bonds_is_refused_at_the_second() {
        let (document, field, reason) =
            one("", "[{ name: bond0, bond: { members: [eno2, eno3] } }, { name: bond1, bond: { members: [eno3] } }]");
        assert_eq!(document, "HostProfile/control (site.yaml #3)");
        assert_eq!(field, "interfaces[bond1].bond.members");
        assert_eq!(reason, "eno3 is a member of bond0 already: a port joins one bond at most");
    }

    #[test]
    fn a_bond_of_what_is_not_a_port_of_the_node_is_refused() {
        let (_, field, reason) = one("", "[{ name: bond0, bond: { members: [eno2, eno7] } }]");
        assert_eq!(
            (field.as_str(), reason.as_str()),
            ("interfaces[bond0].bond.members", "no interface named \"eno7\" to join the bond")
        );
        let (_, _, reason) = one("", "[{ name: bond0, bond: { members: [] } }]");
        assert_eq!(reason, "a bond needs at least one port");
        let (_, _, reason) =
            one("", "[{ name: bond0, bond: { members: [eno2] } }, { name: bond1, bond: { members: [bond0] } }]");
        assert_eq!(reason, "bond0 is not a port: a bond joins physical ports");
    }

    #[test]
    fn a_bonds_port_carries_no_network_of_its_own_and_the_error_is_where_the_port_was_written() {
        let (document, field, reason) = one("", "[{ name: bond0, bond: { members: [eno1, eno2] } }]");
        assert_eq!(document, "HardwareProfile/r640 (site.yaml #2)");
        assert_eq!(field, "interfaces[eno1].network");
        assert_eq!(reason, "eno1 is a port of bond0, so the bond is on provisioning, not the port");
    }

    #[test]
    fn a_vlan_needs_a_parent_an_id_in_range_and_one_place_per_id() {
        let (_, field, reason) = one("", "[{ name: eno9.100, vlan: { id: 100, parent: eno9 } }]");
        assert_eq!(
            (field.as_str(), reason.as_str()),
            ("interfaces[eno9.100].vlan.parent", "no interface named \"eno9\" to carry VLAN 100")
        );
        let (_, field, reason) = one("", "[{ name: eno2.4095, vlan: { id: 4095, parent: eno2 } }]");
        assert_eq!(
            (field.as_str(), reason.as_str()),
            ("interfaces[eno2.4095].vlan.id", "VLAN id 4095 is not from 1 to 4094")
        );
        let (_, field, reason) =
            one("", "[{ name: a, vlan: { id: 7, parent: eno2 } }, { name: b, vlan: { id: 7, parent: eno2 } }]");
        assert_eq!((field.as_str(), reason.as_str()), ("interfaces[b].vlan.id", "VLAN 7 is on eno2 twice"));
        let (_, _, reason) =
            one("", "[{ name: bond0, bond: { members: [eno2] } }, { name: eno2.5, vlan: { id: 5, parent: eno2 } }]");
        assert_eq!(reason, "eno2 is a port of bond0: carry VLAN 5 on bond0");
        let (_, _, reason) = one("", "[{ name: odd, vlan: { id: 5, parent: eno2 }, bond: { members: [eno3] } }]");
        assert_eq!(reason, "an interface is a bond or a VLAN, not both");
    }

    #[test]
    fn a_gateway_and_a_routes_router_are_on_their_network() {
        let (document, field, reason) = one("  - { name: public, cidr: 192.0.2.0/24, gateway: 198.51.100.1 }\n", "[]");
        assert_eq!(document, "Site/edge-01 (site.yaml #1)");
        assert_eq!(field, "networks[public].gateway");
        assert_eq!(
            reason,
            "198.51.100.1 is not in public (192.0.2.0/24): a router is reached on the network it serves"
        );
        let (_, field, reason) =
            one("  - { name: storage, cidr: 10.5.0.0/24, routes: [{ to: 10.50.0.0/16, via: 172.16.0.1 }] }\n", "[]");
        assert_eq!(field, "networks[storage].routes[10.50.0.0/16].via");
        assert!(reason.starts_with("172.16.0.1 is not in storage (10.5.0.0/24)"), "{reason}");
        let (_, _, reason) =
            one("  - { name: storage, cidr: 10.5.0.0/24, routes: [{ to: fd00::/64, via: 10.5.0.1 }] }\n", "[]");
        assert_eq!(reason, "fd00::/64 and 10.5.0.1 are of different address families");
    }

    #[test]
    fn search_domains_are_domain_names_and_name_servers_addresses() {
        let (field, reason) = {
            let (_, f, r) =
                one("  - { name: public, cidr: 192.0.2.0/24, dns: { search: [\"-bad-.example\"] } }\n", "[]");
            (f, r)
        };
        assert_eq!(field, "networks[public].dns.search");
        assert!(reason.starts_with("\"-bad-.example\" is not a domain name"), "{reason}");
        let text = design("  - { name: public, cidr: 192.0.2.0/24, dns: { nameservers: [dns.example] } }\n", "[]");
        assert!(parse_documents(&text, "site.yaml").is_err(), "a name server is an address");
    }

    #[test]
    fn a_node_on_two_networks_with_gateways_would_have_two_default_routes() {
        let networks = "  - { name: public, cidr: 192.0.2.0/24, gateway: 192.0.2.1 }
  - { name: backup, cidr: 198.51.100.0/24, gateway: 198.51.100.1 }
";
        let (document, field, reason) =
            one(networks, "[{ name: eno2, network: public }, { name: eno3, network: backup }]");
        assert_eq!((document.as_str(), field.as_str()), ("Node/node-1 (site.yaml #4)", "interfaces"));
        assert_eq!(
            reason,
            "node-1 would have 2 default routes (via 192.0.2.1 on public, via 198.51.100.1 on backup): give one of \
             these networks a gateway, reach the others by routes"
        );
        let one_gateway = "  - { name: public, cidr: 192.0.2.0/24, gateway: 192.0.2.1 }\n  - { name: backup, cidr: 198.51.100.0/24 }\n";
        assert!(errors(one_gateway, "[{ name: eno2, network: public }, { name: eno3, network: backup }]").is_empty());
    }
}
