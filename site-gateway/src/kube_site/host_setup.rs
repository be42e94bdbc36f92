//! What a host is set up with besides its image, from the site's design: its network as
//! Metal3's `networkData` and the disk the image goes on as its `rootDeviceHints`.
//!
//! The network is rendered in the OpenStack `network_data.json` format: Metal3 writes the
//! Secret's `networkData` to the host's config drive under that name, and cloud-init (its
//! ConfigDrive source) sets the network up from it on first boot. Ports are matched by MAC
//! there, so each port the design names is looked up, by name, among the NICs Metal3's
//! inspection found on the host: a port the host does not have fails the provisioning with the
//! names it does have. The format has no search domains: only name servers reach the host.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use bus_schema::design::Cidr;
use bus_schema::domain::NodeDesign;
use bus_schema::pb;
use k8s_openapi::ByteString;
use serde_json::{Value, json};

use super::metal3::{BareMetalHost, Nic};
use super::{KubeSite, marks};
use crate::backend::BackendError;

/// The key of the Secret Metal3 reads the network data from.
pub const NETWORK_DATA_KEY: &str = "networkData";

impl KubeSite {
    /// Sets `spec` (a host intent's) up with the node's root device and network: the network
    /// data is written to the Secret `<host>-network-data` first. `host` is the host as it is
    /// (its inspected NICs give the ports' MACs).
    pub(super) async fn set_up_host(
        &self,
        node: &NodeDesign,
        host: Option<&BareMetalHost>,
        spec: &mut Value,
    ) -> Result<(), BackendError> {
        let name = node.name.as_str();
        if let Some(root) = &node.root_device {
            let mut hints = serde_json::Map::new();
            if !root.device_name.is_empty() {
                hints.insert("deviceName".into(), json!(root.device_name));
            }
            if root.min_size_gigabytes > 0 {
                hints.insert("minSizeGigabytes".into(), json!(root.min_size_gigabytes));
            }
            if !hints.is_empty() {
                spec["rootDeviceHints"] = Value::Object(hints);
            }
        }
        let Some(network) = &node.network else { return Ok(()) };
        let nics = host.and_then(|h| h.status.as_ref()?.hardware.as_ref()).map(|hw| hw.nics.as_slice());
        let Some(nics) = nics.filter(|n| !n.is_empty()) else {
            return Err(BackendError::transient_reason(format!(
                "host {name} has no inspected NICs yet: its network data needs their MACs"
            )));
        };
        let data =
            network_data(network, nics).map_err(|e| BackendError::permanent_reason(format!("host {name}: {e}")))?;
        let secret = marks::network_data_secret(name);
        let bytes = serde_json::to_vec_pretty(&data).unwrap_or_default();
        self.apply_secret(&secret, BTreeMap::from([(NETWORK_DATA_KEY.to_string(), ByteString(bytes))]), "network-data")
            .await?;
        spec["networkData"] = json!({"name": secret, "namespace": self.cfg.namespace});
        Ok(())
    }
}

/// `network` as OpenStack's `network_data.json`: a link per interface (`phy` with the MAC the
/// host's NIC of that name has, `bond`, `vlan`), a network per interface on one (static with
/// its address, its network's default route and routes; DHCP without an address), and the
/// name servers as `dns` services.
///
/// # Errors
/// A port the host has no NIC of that name for.
pub fn network_data(network: &pb::NodeNetwork, nics: &[Nic]) -> Result<Value, String> {
    let by_name: BTreeMap<&str, &pb::NodeInterface> = network.interfaces.iter().map(|i| (i.name.as_str(), i)).collect();
    // The MAC each interface goes by: its NIC's for a port, its first port's for a bond, its
    // parent's for a VLAN.
    let mac_of = |name: &str| -> Result<String, String> {
        let mut at = name;
        for _ in 0..=by_name.len() {
            let Some(iface) = by_name.get(at) else { break };
            if let Some(first) = iface.bond_members.first() {
                at = first;
            } else if !iface.vlan_parent.is_empty() {
                at = &iface.vlan_parent;
            } else {
                return nics.iter().find(|n| n.name == at).map(|n| n.mac.to_lowercase()).ok_or_else(|| {
                    let found: Vec<&str> = nics.iter().map(|n| n.name.as_str()).collect();
                    format!("the design's port {at} is not a NIC of the host (inspection found {})", found.join(", "))
                });
            }
        }
        Err(format!("interface {name} leads to no port"))
    };
    let mut links = Vec::new();
    let mut networks = Vec::new();
    for iface in &network.interfaces {
        let mac = mac_of(&iface.name)?;
        let mut link = if !iface.bond_members.is_empty() {
            let mode = if iface.bond_mode.is_empty() { "active-backup" } else { iface.bond_mode.as_str() };
            json!({"id": iface.name, "type": "bond", "bond_links": iface.bond_members, "bond_mode": mode,
                   "ethernet_mac_address": mac})
        } else if iface.vlan_id != 0 {
            json!({"id": iface.name, "type": "vlan", "vlan_link": iface.vlan_parent, "vlan_id": iface.vlan_id,
                   "vlan_mac_address": mac})
        } else {
            json!({"id": iface.name, "type": "phy", "ethernet_mac_address": mac})
        };
        if iface.mtu > 0 {
            link["mtu"] = json!(iface.mtu);
        }
        links.push(link);
        let Some(net) = network.networks.iter().find(|n| n.name == iface.network) else { continue };
        let cidr: Cidr = net.cidr.parse().map_err(|e| format!("network {}: {e}", net.name))?;
        let v4 = cidr.network().is_ipv4();
        let id = format!("{}-{}", iface.name, net.name);
        if iface.address.is_empty() {
            networks.push(json!({"id": id, "type": if v4 { "ipv4_dhcp" } else { "ipv6_dhcp" }, "link": iface.name}));
            continue;
        }
        let mut routes = Vec::new();
        if !net.gateway.is_empty() {
            let any = if v4 { "0.0.0.0" } else { "::" };
            routes.push(json!({"network": any, "netmask": any, "gateway": net.gateway}));
        }
        for route in &net.routes {
            let to: Cidr = route.to.parse().map_err(|e| format!("network {}: {e}", net.name))?;
            routes.push(json!({"network": to.network().to_string(), "netmask": netmask(&to).to_string(),
                               "gateway": route.via}));
        }
        networks.push(json!({"id": id, "type": if v4 { "ipv4" } else { "ipv6" }, "link": iface.name,
                             "ip_address": iface.address, "netmask": netmask(&cidr).to_string(), "routes": routes}));
    }
    let mut seen = BTreeSet::new();
    let services: Vec<Value> = network
        .networks
        .iter()
        .flat_map(|n| &n.nameservers)
        .filter(|s| seen.insert(s.as_str()))
        .map(|s| json!({"type": "dns", "address": s}))
        .collect();
    Ok(json!({"links": links, "networks": networks, "services": services}))
}

/// The mask of `cidr`'s prefix, as an address (`/24` → `255.255.255.0`).
fn netmask(cidr: &Cidr) -> IpAddr {
    let prefix = u32::from(cidr.prefix());
    match cidr.network() {
        IpAddr::V4(_) => IpAddr::from(u32::MAX.checked_shl(32 - prefix).unwrap_or(0).to_be_bytes()),
        IpAddr::V6(_) => IpAddr::from(u128::MAX.checked_shl(128 - prefix).unwrap_or(0).to_be_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use bus_schema::domain::Role;
    use http::{Method, StatusCode};

    use super::*;
    use crate::kube_site::UserData;
    use crate::kube_site::testing::{APPLY_QUERY, b64, mocked, next};

    fn nic(name: &str, mac: &str) -> Nic {
        Nic { name: name.into(), mac: mac.into(), ..Default::default() }
    }

    fn iface(name: &str) -> pb::NodeInterface {
        pb::NodeInterface { name: name.into(), ..Default::default() }
    }

    /// A port on provisioning by DHCP, a bond of two ports with a static address, a gateway,
    /// a route and a name server, and a VLAN on the bond with a static address.
    fn network() -> pb::NodeNetwork {
        pb::NodeNetwork {
            interfaces: vec![
                pb::NodeInterface { network: "provisioning".into(), ..iface("eno1") },
                iface("eno2"),
                iface("eno3"),
                pb::NodeInterface {
                    bond_members: vec!["eno2".into(), "eno3".into()],
                    bond_mode: "802.3ad".into(),
                    network: "public".into(),
                    address: "192.0.2.11".into(),
                    mtu: 9000,
                    ..iface("bond0")
                },
                pb::NodeInterface {
                    vlan_id: 200,
                    vlan_parent: "bond0".into(),
                    network: "storage".into(),
                    address: "fd00:5::11".into(),
                    ..iface("bond0.200")
                },
            ],
            networks: vec![
                pb::SiteNetwork { name: "provisioning".into(), cidr: "10.1.0.0/24".into(), ..Default::default() },
                pb::SiteNetwork {
                    name: "public".into(),
                    cidr: "192.0.2.0/24".into(),
                    gateway: "192.0.2.1".into(),
                    routes: vec![pb::NetworkRoute { to: "10.50.0.0/16".into(), via: "192.0.2.254".into() }],
                    nameservers: vec!["192.0.2.53".into()],
                    search: vec!["edge.example.com".into()],
                },
                pb::SiteNetwork { name: "storage".into(), cidr: "fd00:5::/64".into(), ..Default::default() },
            ],
        }
    }

    fn nics() -> Vec<Nic> {
        vec![nic("eno1", "52:54:00:00:00:01"), nic("eno2", "52:54:00:00:00:02"), nic("eno3", "52:54:00:00:00:03")]
    }

    #[test]
    fn the_design_becomes_openstack_network_data_with_the_inspected_macs() {
        let data = network_data(&network(), &nics()).unwrap();
        assert_eq!(
            data["links"],
            json!([
                {"id": "eno1", "type": "phy", "ethernet_mac_address": "52:54:00:00:00:01"},
                {"id": "eno2", "type": "phy", "ethernet_mac_address": "52:54:00:00:00:02"},
                {"id": "eno3", "type": "phy", "ethernet_mac_address": "52:54:00:00:00:03"},
                {"id": "bond0", "type": "bond", "bond_links": ["eno2", "eno3"], "bond_mode": "802.3ad",
                 "ethernet_mac_address": "52:54:00:00:00:02", "mtu": 9000},
                {"id": "bond0.200", "type": "vlan", "vlan_link": "bond0", "vlan_id": 200,
                 "vlan_mac_address": "52:54:00:00:00:02"},
            ])
        );
        assert_eq!(
            data["networks"],
            json!([
                {"id": "eno1-provisioning", "type": "ipv4_dhcp", "link": "eno1"},
                {"id": "bond0-public", "type": "ipv4", "link": "bond0", "ip_address": "192.0.2.11",
                 "netmask": "255.255.255.0",
                 "routes": [{"network": "0.0.0.0", "netmask": "0.0.0.0", "gateway": "192.0.2.1"},
                            {"network": "10.50.0.0", "netmask": "255.255.0.0", "gateway": "192.0.2.254"}]},
                {"id": "bond0.200-storage", "type": "ipv6", "link": "bond0.200", "ip_address": "fd00:5::11",
                 "netmask": "ffff:ffff:ffff:ffff::", "routes": []},
            ])
        );
        assert_eq!(data["services"], json!([{"type": "dns", "address": "192.0.2.53"}]));
    }

    #[test]
    fn a_port_the_host_lacks_is_named_with_what_the_host_has() {
        let err = network_data(&network(), &nics()[..2]).unwrap_err();
        assert_eq!(err, "the design's port eno3 is not a NIC of the host (inspection found eno1, eno2)");
    }

    fn node(network: Option<pb::NodeNetwork>, root: Option<pb::RootDeviceHints>) -> NodeDesign {
        NodeDesign {
            name: "n1".try_into().unwrap(),
            role: Role::Worker,
            boot_mac: "52:54:00:00:00:01".to_string().try_into().unwrap(),
            bmc_address: "ipmi://10.0.0.1".to_string().try_into().unwrap(),
            labels: BTreeMap::new(),
            network,
            root_device: root,
            kernel_parameters: Default::default(),
            cleaning: Default::default(),
        }
    }

    fn inspected() -> BareMetalHost {
        serde_json::from_value(json!({
            "apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost",
            "metadata": {"name": "n1", "namespace": "metal3"},
            "spec": {"online": true},
            "status": {"provisioning": {"state": "available"},
                       "hardware": {"nics": [{"name": "eno1", "mac": "52:54:00:00:00:01"},
                                             {"name": "eno2", "mac": "52:54:00:00:00:02"},
                                             {"name": "eno3", "mac": "52:54:00:00:00:03"}]}}
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn the_network_data_goes_in_a_secret_the_host_names_and_the_root_disk_in_its_hints() {
        let (site, mut handle, _dir) = mocked(UserData::Existing("ud".into()));
        let server = tokio::spawn(async move { next(&mut handle, (StatusCode::OK, json!({}))).await });
        let root = pb::RootDeviceHints { device_name: "/dev/nvme0n1".into(), min_size_gigabytes: 400 };
        let mut spec = json!({"online": true});
        site.set_up_host(&node(Some(network()), Some(root)), Some(&inspected()), &mut spec).await.unwrap();
        let (method, uri, body) = server.await.unwrap();
        assert_eq!(
            (method, uri.as_str()),
            (Method::PATCH, format!("/api/v1/namespaces/metal3/secrets/n1-network-data{APPLY_QUERY}").as_str())
        );
        let expected = serde_json::to_vec_pretty(&network_data(&network(), &nics()).unwrap()).unwrap();
        assert_eq!(body["data"], json!({NETWORK_DATA_KEY: b64(std::str::from_utf8(&expected).unwrap())}));
        assert_eq!(body["metadata"]["labels"], json!({"landfall.io/purpose": "network-data"}));
        assert_eq!(spec["networkData"], json!({"name": "n1-network-data", "namespace": "metal3"}));
        assert_eq!(spec["rootDeviceHints"], json!({"deviceName": "/dev/nvme0n1", "minSizeGigabytes": 400}));
    }

    #[tokio::test]
    async fn without_a_network_in_the_design_nothing_is_written_and_without_inspection_it_waits() {
        let (site, mut handle, _dir) = mocked(UserData::Existing("ud".into()));
        let mut spec = json!({"online": true});
        site.set_up_host(&node(None, None), Some(&inspected()), &mut spec).await.unwrap();
        assert_eq!(spec, json!({"online": true}));
        let err = site.set_up_host(&node(Some(network()), None), None, &mut spec).await.unwrap_err();
        assert!(matches!(err, BackendError::Transient { .. }), "{err}");
        assert!(tokio::time::timeout(std::time::Duration::from_millis(100), handle.next_request()).await.is_err());
    }
}
