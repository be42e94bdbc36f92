//! The ICN BPA's custom resources (`bpa.akraino.org/v1alpha1`, `deploy/crds/icn-bpa`) and the
//! kubespray inventory the gateway writes for it.
//!
//! - `Provisioning`: the cluster's masters and workers, each by name with its boot MAC, the KUD
//!   plugins to install and the pod subnet. Written by `InstallBinaries`.
//! - `Software`: the packages and versions masters and workers run. Written by package installs
//!   and patches.
//! - `hosts.ini`: `[all]` with each node's `ansible_ssh_host=` (the address Metal3's inspection
//!   saw on its boot NIC), `[kube-master]`, `[kube-node]`, `[etcd]`, `[k8s-cluster:children]`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use bus_schema::domain::Role;
use kube::api::ApiResource;
use serde_json::{Value, json};

pub const GROUP: &str = "bpa.akraino.org";
pub const VERSION: &str = "v1alpha1";

pub fn provisioning_resource() -> ApiResource {
    resource("Provisioning", "provisionings")
}

pub fn software_resource() -> ApiResource {
    resource("Software", "softwares")
}

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: VERSION.into(),
        api_version: format!("{GROUP}/{VERSION}"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// One cluster node as the BPA knows it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ClusterNode {
    pub name: String,
    pub role: Role,
    pub mac: String,
    /// The address inspection saw on the boot NIC; the inventory needs one for every node.
    pub ip: String,
}

/// Which BPA cluster a site is: the labels every BPA resource carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterIdentity {
    pub owner: String,
    pub cluster: String,
}

impl ClusterIdentity {
    fn metadata(&self, name: &str, namespace: &str) -> Value {
        json!({"name": name, "namespace": namespace, "labels": {"cluster": self.cluster, "owner": self.owner}})
    }
}

/// The `Provisioning` resource for `nodes`, named after the cluster.
pub fn provisioning(
    id: &ClusterIdentity,
    namespace: &str,
    nodes: &[ClusterNode],
    kud_plugins: &[String],
    pod_subnet: &str,
) -> Value {
    let by_role = |role: Role| -> Vec<Value> {
        nodes.iter().filter(|n| n.role == role).map(|n| json!({ n.name.clone(): {"mac-address": n.mac} })).collect()
    };
    let mut spec = json!({"masters": by_role(Role::Master), "workers": by_role(Role::Worker)});
    if !kud_plugins.is_empty() {
        spec["KUDPlugins"] = json!(kud_plugins);
    }
    if !pod_subnet.is_empty() {
        spec["PodSubnet"] = json!(pod_subnet);
    }
    json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": "Provisioning",
        "metadata": id.metadata(&id.cluster, namespace),
        "spec": spec,
    })
}

/// The nodes a `Provisioning` resource lists (`spec.masters` / `spec.workers`), by name: role
/// and MAC.
pub fn provisioned_nodes(provisioning: &Value) -> BTreeMap<String, (Role, String)> {
    let mut out = BTreeMap::new();
    for (key, role) in [("masters", Role::Master), ("workers", Role::Worker)] {
        let entries = provisioning["spec"][key].as_array().into_iter().flatten();
        for (name, v) in entries.filter_map(Value::as_object).flatten() {
            let mac = v["mac-address"].as_str().unwrap_or_default().to_string();
            out.insert(name.clone(), (role, mac));
        }
    }
    out
}

/// The `Software` resource of the cluster: each role's packages with their versions.
pub fn software(id: &ClusterIdentity, namespace: &str, by_role: &BTreeMap<Role, BTreeMap<String, String>>) -> Value {
    let list = |role: Role| -> Vec<Value> {
        by_role
            .get(&role)
            .into_iter()
            .flatten()
            .map(|(name, version)| json!({ name.clone(): {"version": version} }))
            .collect()
    };
    json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": "Software",
        "metadata": id.metadata(&format!("{}-software", id.cluster), namespace),
        "spec": {"masterSoftware": list(Role::Master), "workerSoftware": list(Role::Worker)},
    })
}

/// Each role's packages and versions as a `Software` resource lists them. An entry without a
/// version (the BPA allows plain names) has an empty one.
pub fn software_versions(software: &Value) -> BTreeMap<Role, BTreeMap<String, String>> {
    let mut out = BTreeMap::<Role, BTreeMap<String, String>>::new();
    for (key, role) in [("masterSoftware", Role::Master), ("workerSoftware", Role::Worker)] {
        for entry in software["spec"][key].as_array().into_iter().flatten() {
            let role_map = out.entry(role).or_default();
            match entry {
                Value::String(name) => {
                    role_map.insert(name.clone(), String::new());
                }
                Value::Object(m) => {
                    for (name, v) in m {
                        role_map.insert(name.clone(), v["version"].as_str().unwrap_or_default().to_string());
                    }
                }
                _ => {}
            }
        }
    }
    out
}

/// The kubespray inventory of `nodes`: masters run etcd and the control plane, workers are
/// kube nodes (masters too, as kubespray's own samples have it).
pub fn hosts_ini(nodes: &[ClusterNode]) -> String {
    let mut sorted = nodes.to_vec();
    sorted.sort();
    let mut out = String::from("[all]\n");
    for n in &sorted {
        let _ = writeln!(out, "{} ansible_ssh_host={} ip={}", n.name, n.ip, n.ip);
    }
    let names = |pred: &dyn Fn(&ClusterNode) -> bool| -> String {
        sorted.iter().filter(|n| pred(n)).map(|n| format!("{}\n", n.name)).collect()
    };
    let masters = names(&|n| n.role == Role::Master);
    let _ = write!(out, "\n[kube-master]\n{masters}\n[kube-node]\n{}", names(&|_| true));
    let _ = write!(out, "\n[etcd]\n{masters}\n[k8s-cluster:children]\nkube-node\nkube-master\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, role: Role, mac: &str, ip: &str) -> ClusterNode {
        ClusterNode { name: name.into(), role, mac: mac.into(), ip: ip.into() }
    }

    fn id() -> ClusterIdentity {
        ClusterIdentity { owner: "landfall".into(), cluster: "edge-01".into() }
    }

    #[test]
    fn the_inventory_lists_roles_and_addresses() {
        let nodes = [
            node("w-1", Role::Worker, "aa", "10.0.0.21"),
            node("m-1", Role::Master, "bb", "10.0.0.11"),
            node("w-2", Role::Worker, "cc", "10.0.0.22"),
        ];
        assert_eq!(
            hosts_ini(&nodes),
            "[all]\n\
             m-1 ansible_ssh_host=10.0.0.11 ip=10.0.0.11\n\
             w-1 ansible_ssh_host=10.0.0.21 ip=10.0.0.21\n\
             w-2 ansible_ssh_host=10.0.0.22 ip=10.0.0.22\n\
             \n[kube-master]\nm-1\n\
             \n[kube-node]\nm-1\nw-1\nw-2\n\
             \n[etcd]\nm-1\n\
             \n[k8s-cluster:children]\nkube-node\nkube-master\n"
        );
    }

    #[test]
    fn provisioning_lists_nodes_by_mac_in_the_bpa_shape_and_reads_back() {
        let nodes = [
            node("m-1", Role::Master, "00:c6:14:04:61:b2", "ip"),
            node("w-1", Role::Worker, "00:c4:13:04:62:b5", "ip"),
        ];
        let p = provisioning(&id(), "site", &nodes, &["emco".into()], "10.244.64.0/18");
        assert_eq!(p["metadata"]["labels"], json!({"cluster": "edge-01", "owner": "landfall"}));
        assert_eq!(p["spec"]["masters"], json!([{"m-1": {"mac-address": "00:c6:14:04:61:b2"}}]));
        assert_eq!(p["spec"]["workers"], json!([{"w-1": {"mac-address": "00:c4:13:04:62:b5"}}]));
        assert_eq!(p["spec"]["KUDPlugins"], json!(["emco"]));
        assert_eq!(p["spec"]["PodSubnet"], json!("10.244.64.0/18"));
        let back = provisioned_nodes(&p);
        assert_eq!(back["w-1"], (Role::Worker, "00:c4:13:04:62:b5".to_string()));
    }

    #[test]
    fn software_round_trips_and_reads_plain_names() {
        let mut by_role = BTreeMap::new();
        by_role.insert(Role::Master, BTreeMap::from([("kubelet".to_string(), "1.30.0".to_string())]));
        let s = software(&id(), "site", &by_role);
        assert_eq!(s["spec"]["masterSoftware"], json!([{"kubelet": {"version": "1.30.0"}}]));
        assert_eq!(software_versions(&s), by_role);
        let sample = json!({"spec": {"masterSoftware": ["htop", {"jq": {"version": "1.5"}}]}});
        let read = software_versions(&sample);
        assert_eq!(read[&Role::Master]["jq"], "1.5");
        assert_eq!(read[&Role::Master]["htop"], "");
    }
}
