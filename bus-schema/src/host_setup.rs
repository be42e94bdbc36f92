//! What a node's host is set up with besides its image: its network ([`pb::NodeNetwork`]) and
//! the disk the image goes on ([`pb::RootDeviceHints`]), as they travel in a [`pb::NodeSpec`].
//! The site design's rules (`design::links`) made them; [`check_network`] makes sure what
//! arrives over the bus holds together before a gateway renders it for Metal3.

use std::collections::BTreeSet;
use std::net::IpAddr;

use crate::design::Cidr;
use crate::domain::InvalidField;
use crate::pb;

/// The interfaces name each other and the networks consistently, and every address, network
/// and VLAN id is well-formed.
///
/// # Errors
/// The first field that does not, with why.
pub fn check_network(n: &pb::NodeNetwork) -> Result<(), InvalidField> {
    let mut networks = BTreeSet::new();
    for (i, net) in n.networks.iter().enumerate() {
        let field = |f: &str| format!("networks[{i}].{f}");
        if net.name.is_empty() || !networks.insert(net.name.as_str()) {
            return Err(InvalidField::new(field("name"), format!("{:?} is empty or given twice", net.name)));
        }
        let cidr: Cidr = net.cidr.parse().map_err(|e| InvalidField::new(field("cidr"), format!("{e}")))?;
        if !net.gateway.is_empty() {
            let gateway = address(&net.gateway, field("gateway"))?;
            if !cidr.contains(gateway) {
                return Err(InvalidField::new(field("gateway"), format!("{gateway} is not in {cidr}")));
            }
        }
        for route in &net.routes {
            route.to.parse::<Cidr>().map_err(|e| InvalidField::new(field("routes.to"), format!("{e}")))?;
            let via = address(&route.via, field("routes.via"))?;
            if !cidr.contains(via) {
                return Err(InvalidField::new(field("routes.via"), format!("{via} is not in {cidr}")));
            }
        }
        for server in &net.nameservers {
            address(server, field("nameservers"))?;
        }
    }
    let names: BTreeSet<&str> = n.interfaces.iter().map(|i| i.name.as_str()).collect();
    if names.len() != n.interfaces.len() || names.contains("") {
        return Err(InvalidField::new("interfaces", "interface names must be given, each once"));
    }
    for (i, iface) in n.interfaces.iter().enumerate() {
        let field = |f: &str| format!("interfaces[{i}].{f}");
        if !iface.network.is_empty() && !networks.contains(iface.network.as_str()) {
            return Err(InvalidField::new(field("network"), format!("{:?} is not among the networks", iface.network)));
        }
        if !iface.address.is_empty() {
            let ip = address(&iface.address, field("address"))?;
            let Some(net) = n.networks.iter().find(|x| x.name == iface.network) else {
                return Err(InvalidField::new(field("address"), "an address needs the network it is on"));
            };
            let cidr: Cidr = net.cidr.parse().map_err(|e| InvalidField::new(field("network"), format!("{e}")))?;
            if !cidr.contains(ip) {
                return Err(InvalidField::new(field("address"), format!("{ip} is not in {cidr}")));
            }
        }
        if let Some(member) = iface.bond_members.iter().find(|m| !names.contains(m.as_str())) {
            return Err(InvalidField::new(field("bond_members"), format!("no interface named {member:?}")));
        }
        if !iface.bond_mode.is_empty() && !BOND_MODES.contains(&iface.bond_mode.as_str()) {
            return Err(InvalidField::new(
                field("bond_mode"),
                format!("{:?} is not one of {}", iface.bond_mode, BOND_MODES.join(", ")),
            ));
        }
        if iface.vlan_id != 0 || !iface.vlan_parent.is_empty() {
            if !(1..=4094).contains(&iface.vlan_id) {
                return Err(InvalidField::new(field("vlan_id"), format!("{} is not from 1 to 4094", iface.vlan_id)));
            }
            if !names.contains(iface.vlan_parent.as_str()) {
                return Err(InvalidField::new(
                    field("vlan_parent"),
                    format!("no interface named {:?}", iface.vlan_parent),
                ));
            }
        }
    }
    Ok(())
}

/// The bonding modes a bond may have (the kernel's names).
pub const BOND_MODES: [&str; 7] =
    ["active-backup", "balance-rr", "balance-xor", "broadcast", "802.3ad", "balance-tlb", "balance-alb"];

fn address(text: &str, field: String) -> Result<IpAddr, InvalidField> {
    text.parse().map_err(|_| InvalidField::new(field, format!("{text:?} is not an IP address")))
}

/// Kernel parameters that can be written on a kernel command line as they are: keys of
/// letters, digits, `_`, `-` and `.`; values of those and `,:=/+@`, so nothing in them can
/// quote, expand or end a line of the configuration they are written to.
///
/// # Errors
/// The first parameter that is not.
pub fn check_kernel_parameters<'a>(
    params: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> Result<(), InvalidField> {
    let key_ok = |k: &str| !k.is_empty() && k.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
    let value_ok = |v: &str| v.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.,:=/+@".contains(&b));
    for (key, value) in params {
        if !key_ok(key) {
            return Err(InvalidField::new("kernel_parameters", format!("{key:?} is not a kernel parameter name")));
        }
        if !value_ok(value) {
            return Err(InvalidField::new(
                format!("kernel_parameters[{key}]"),
                format!("{value:?} has characters a kernel command line cannot take as they are"),
            ));
        }
    }
    Ok(())
}

/// The kernel command line `params` make: `key=value`, or `key` alone for an empty value.
pub fn kernel_command_line<'a>(params: impl IntoIterator<Item = (&'a String, &'a String)>) -> String {
    let words: Vec<String> =
        params.into_iter().map(|(k, v)| if v.is_empty() { k.clone() } else { format!("{k}={v}") }).collect();
    words.join(" ")
}

/// A root device named by a path under `/dev/`.
///
/// # Errors
/// When the device name is not one.
pub fn check_root_device(r: &pb::RootDeviceHints) -> Result<(), InvalidField> {
    if !r.device_name.is_empty() && !r.device_name.starts_with("/dev/") {
        return Err(InvalidField::new("device_name", format!("{:?} is not a path under /dev/", r.device_name)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn network() -> pb::NodeNetwork {
        pb::NodeNetwork {
            interfaces: vec![
                pb::NodeInterface { name: "eno1".into(), ..Default::default() },
                pb::NodeInterface { name: "eno2".into(), ..Default::default() },
                pb::NodeInterface {
                    name: "bond0".into(),
                    bond_members: vec!["eno1".into(), "eno2".into()],
                    bond_mode: "802.3ad".into(),
                    network: "public".into(),
                    address: "192.0.2.11".into(),
                    ..Default::default()
                },
                pb::NodeInterface {
                    name: "bond0.200".into(),
                    vlan_id: 200,
                    vlan_parent: "bond0".into(),
                    ..Default::default()
                },
            ],
            networks: vec![pb::SiteNetwork {
                name: "public".into(),
                cidr: "192.0.2.0/24".into(),
                gateway: "192.0.2.1".into(),
                routes: vec![pb::NetworkRoute { to: "10.50.0.0/16".into(), via: "192.0.2.254".into() }],
                nameservers: vec!["192.0.2.53".into()],
                search: vec!["edge.example.com".into()],
            }],
        }
    }

    #[test]
    fn a_network_that_holds_together_passes_and_each_break_is_named() {
        assert_eq!(check_network(&network()), Ok(()));
        let broken = |f: fn(&mut pb::NodeNetwork)| {
            let mut n = network();
            f(&mut n);
            check_network(&n).unwrap_err().to_string()
        };
        assert!(broken(|n| n.networks[0].cidr = "10.0.0.1/8".into()).starts_with("networks[0].cidr:"));
        assert_eq!(
            broken(|n| n.networks[0].gateway = "10.0.0.1".into()),
            "networks[0].gateway: 10.0.0.1 is not in 192.0.2.0/24"
        );
        assert!(broken(|n| n.networks[0].nameservers[0] = "dns".into()).contains("is not an IP address"));
        assert_eq!(
            broken(|n| n.interfaces[2].address = "10.9.9.9".into()),
            "interfaces[2].address: 10.9.9.9 is not in 192.0.2.0/24"
        );
        assert_eq!(
            broken(|n| n.interfaces[2].bond_members[1] = "eno9".into()),
            "interfaces[2].bond_members: no interface named \"eno9\""
        );
        assert!(broken(|n| n.interfaces[2].bond_mode = "fast".into()).starts_with("interfaces[2].bond_mode:"));
        assert_eq!(broken(|n| n.interfaces[3].vlan_id = 4095), "interfaces[3].vlan_id: 4095 is not from 1 to 4094");
        assert_eq!(
            broken(|n| n.interfaces[3].vlan_parent = "x".into()),
            "interfaces[3].vlan_parent: no interface named \"x\""
        );
        assert_eq!(
            broken(|n| n.interfaces[1].name = "eno1".into()),
            "interfaces: interface names must be given, each once"
        );
        assert!(broken(|n| n.interfaces[0].network = "nowhere".into()).starts_with("interfaces[0].network:"));
    }

    #[test]
    fn kernel_parameters_are_plain_words_and_make_one_command_line() {
        let params: std::collections::BTreeMap<String, String> =
            [("isolcpus", "2-7"), ("nosmt", ""), ("hugepagesz", "1G")].map(|(k, v)| (k.into(), v.into())).into();
        assert_eq!(check_kernel_parameters(&params), Ok(()));
        assert_eq!(kernel_command_line(&params), "hugepagesz=1G isolcpus=2-7 nosmt");
        let bad =
            |k: &str, v: &str| check_kernel_parameters([(&k.to_string(), &v.to_string())]).unwrap_err().to_string();
        assert!(bad("quiet\"; reboot", "").contains("is not a kernel parameter name"));
        assert!(bad("console", "ttyS0 $(reboot)").contains("cannot take as they are"));
        assert!(bad("x", "a\nb").contains("cannot take as they are"));
    }

    #[test]
    fn a_root_device_is_a_device_path() {
        assert!(
            check_root_device(&pb::RootDeviceHints { device_name: "/dev/sda".into(), min_size_gigabytes: 400 }).is_ok()
        );
        assert!(check_root_device(&pb::RootDeviceHints { device_name: "sda".into(), min_size_gigabytes: 0 }).is_err());
    }
}
