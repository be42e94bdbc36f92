//! Cluster node selection: which nodes serve as masters and workers, active or in standby.
//!
//! Per role, the site's cluster spec asks for `count` active and `standby` more nodes among
//! the nodes of that role whose labels match the set's selector and that have an address on
//! the cluster's API network. With a topology key (e.g. `rack`), at most one chosen node per
//! value of that label, and nodes without the label do not qualify.
//!
//! Selection is deterministic and changes as few nodes as it can: the previous selection is
//! kept first (its active nodes, then its standby nodes, each by name), and only then are new
//! nodes added, spreading over the topology values least used by the sets chosen before (ties
//! by value, then by node name). The first `count` kept-or-added nodes are active, so a standby
//! node is promoted before a new node becomes active. Masters are chosen before workers.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

use super::document::{ClusterSpec, NodeSetSpec};
use super::resolve::{EffectiveNode, ResolvedSite};
use crate::domain::{NodeName, Role};

/// The label that says which node set a chosen node is in: `master` or `worker`.
pub const ROLE_LABEL: &str = "landfall.io/role";
/// The label, `true`, on a chosen node held in standby.
pub const STANDBY_LABEL: &str = "landfall.io/standby";
/// The port of the Kubernetes API behind the load balancer.
pub const API_PORT: u16 = 6443;

/// The nodes chosen for the cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    /// The control-plane nodes.
    pub masters: NodeSet,
    /// The worker nodes.
    pub workers: NodeSet,
}

/// The nodes chosen for one role, each list sorted by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeSet {
    /// The nodes in service.
    pub active: Vec<NodeName>,
    /// The nodes held in standby.
    pub standby: Vec<NodeName>,
}

/// Where a chosen node serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// The node set it is in.
    pub role: Role,
    /// Whether it is held in standby.
    pub standby: bool,
}

/// A backend of the API load balancer: an active master's address on the API network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backend {
    /// The master.
    pub node: NodeName,
    /// Its address and the API port.
    pub address: SocketAddr,
}

/// Why the cluster spec cannot be met by the site's nodes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{node_set}: unschedulable: {reason}")]
pub struct Unschedulable {
    /// `masters`, `workers`, or `cluster` when the site has no cluster spec.
    pub node_set: String,
    /// What was needed and what there is.
    pub reason: String,
}

/// A jump host's inventory, in the groups kubespray expects.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inventory {
    /// Every active node, by name, with the address it is reached at.
    pub hosts: Vec<InventoryHost>,
    /// The active masters.
    pub kube_master: Vec<NodeName>,
    /// The active workers.
    pub kube_node: Vec<NodeName>,
    /// The etcd members: the active masters.
    pub etcd: Vec<NodeName>,
}

/// One host of an [`Inventory`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InventoryHost {
    /// The hostname.
    pub name: NodeName,
    /// Its address on the API network, if it has one.
    pub ansible_ssh_host: Option<IpAddr>,
}

impl NodeSet {
    /// Whether the set holds `node`, active or in standby.
    pub fn contains(&self, node: &NodeName) -> bool {
        self.active.contains(node) || self.standby.contains(node)
    }
}

impl Selection {
    /// The node set of `role`.
    pub fn node_set(&self, role: Role) -> &NodeSet {
        match role {
            Role::Master => &self.masters,
            Role::Worker => &self.workers,
        }
    }

    /// Where `node` serves, if it is chosen.
    pub fn placement(&self, node: &NodeName) -> Option<Placement> {
        [Role::Master, Role::Worker].into_iter().find_map(|role| {
            let set = self.node_set(role);
            let standby = set.standby.contains(node);
            (standby || set.active.contains(node)).then_some(Placement { role, standby })
        })
    }

    /// The labels each chosen node gets: [`ROLE_LABEL`], and [`STANDBY_LABEL`] in standby.
    pub fn labels(&self) -> BTreeMap<NodeName, BTreeMap<String, String>> {
        let mut labels = BTreeMap::new();
        for role in [Role::Master, Role::Worker] {
            let set = self.node_set(role);
            for (node, standby) in set.active.iter().map(|n| (n, false)).chain(set.standby.iter().map(|n| (n, true))) {
                let mut own = BTreeMap::from([(ROLE_LABEL.to_string(), role.as_str().to_string())]);
                if standby {
                    own.insert(STANDBY_LABEL.to_string(), "true".to_string());
                }
                labels.insert(node.clone(), own);
            }
        }
        labels
    }

    /// The API load balancer's backends: each active master's address on the cluster's API
    /// network, port [`API_PORT`]. Empty when the site has no cluster spec.
    pub fn load_balancer_backends(&self, site: &ResolvedSite) -> Vec<Backend> {
        self.masters
            .active
            .iter()
            .filter_map(|name| {
                let ip = api_address(site, name)?;
                Some(Backend { node: name.clone(), address: SocketAddr::new(ip, API_PORT) })
            })
            .collect()
    }

    /// The jump host's inventory: the active nodes, reached at their API-network addresses.
    pub fn inventory(&self, site: &ResolvedSite) -> Inventory {
        let mut names: Vec<&NodeName> = self.masters.active.iter().chain(&self.workers.active).collect();
        names.sort();
        Inventory {
            hosts: names
                .into_iter()
                .map(|name| InventoryHost { name: name.clone(), ansible_ssh_host: api_address(site, name) })
                .collect(),
            kube_master: self.masters.active.clone(),
            kube_node: self.workers.active.clone(),
            etcd: self.masters.active.clone(),
        }
    }
}

impl Inventory {
    /// The inventory as a kubespray `hosts.ini`.
    pub fn to_ini(&self) -> String {
        let mut out = String::from("[all]\n");
        for host in &self.hosts {
            let _ = match host.ansible_ssh_host {
                Some(ip) => writeln!(out, "{} ansible_ssh_host={ip}", host.name),
                None => writeln!(out, "{}", host.name),
            };
        }
        for (group, members) in
            [("kube-master", &self.kube_master), ("kube-node", &self.kube_node), ("etcd", &self.etcd)]
        {
            let _ = writeln!(out, "\n[{group}]");
            for member in members {
                let _ = writeln!(out, "{member}");
            }
        }
        out.push_str("\n[k8s-cluster:children]\nkube-master\nkube-node\n");
        out
    }
}

/// Chooses the cluster's nodes for `site`, keeping what `previous` chose where it still
/// qualifies. Pass `Selection::default()` for a first selection.
pub fn select(site: &ResolvedSite, previous: &Selection) -> Result<Selection, Unschedulable> {
    let cluster = site.site.cluster.as_ref().ok_or_else(|| Unschedulable {
        node_set: "cluster".to_string(),
        reason: format!("{} has no cluster spec", site.origin),
    })?;
    let mut chosen = Vec::new();
    let masters = choose(site, cluster, Role::Master, &previous.masters, &mut chosen)?;
    let workers = choose(site, cluster, Role::Worker, &previous.workers, &mut chosen)?;
    Ok(Selection { masters, workers })
}

/// Chooses the node set of `role`; `chosen` holds the nodes of the sets chosen before, and
/// gets this set's nodes.
fn choose<'a>(
    site: &'a ResolvedSite,
    cluster: &'a ClusterSpec,
    role: Role,
    previous: &NodeSet,
    chosen: &mut Vec<&'a EffectiveNode>,
) -> Result<NodeSet, Unschedulable> {
    let spec = cluster.node_set(role);
    let pool = Pool::new(site, &cluster.api_network, role, spec);
    let need = to_usize(spec.count.saturating_add(spec.standby));
    if pool.capacity() < need {
        return Err(pool.unschedulable(need));
    }
    let key = spec.topology_key();
    let mut picked: Vec<&'a EffectiveNode> = Vec::new();
    for name in sorted(&previous.active).into_iter().chain(sorted(&previous.standby)) {
        if picked.len() == need {
            break;
        }
        if let Some(node) = pool.candidates.iter().find(|n| &n.name == name)
            && !picked.iter().any(|p| p.name == node.name)
            && fits(key, node, &picked)
        {
            picked.push(node);
        }
    }
    while picked.len() < need {
        let next = pool.next_new(&picked, chosen).ok_or_else(|| pool.unschedulable(need))?;
        picked.push(next);
    }
    chosen.extend(&picked);
    let (active, standby) = picked.split_at(to_usize(spec.count).min(picked.len()));
    Ok(NodeSet { active: names(active), standby: names(standby) })
}

/// The nodes that qualify for one node set, and why others do not.
struct Pool<'a> {
    role: Role,
    spec: &'a NodeSetSpec,
    api_network: &'a str,
    /// The qualifying nodes, by name.
    candidates: Vec<&'a EffectiveNode>,
    /// Nodes of the role matching the selector, qualifying or not.
    matching: usize,
    /// Matching nodes without an address on the API network.
    without_address: usize,
    /// Matching nodes with an address but without the topology label.
    without_key: usize,
}

impl<'a> Pool<'a> {
    fn new(site: &'a ResolvedSite, api_network: &'a str, role: Role, spec: &'a NodeSetSpec) -> Self {
        let mut pool =
            Pool { role, spec, api_network, candidates: Vec::new(), matching: 0, without_address: 0, without_key: 0 };
        let matches = |node: &EffectiveNode| spec.selector.iter().all(|(k, v)| node.label(k) == Some(v.as_str()));
        for node in site.nodes.values().filter(|n| n.role() == Some(role) && matches(n)) {
            pool.matching += 1;
            if !node.addresses.contains_key(api_network) {
                pool.without_address += 1;
            } else if spec.topology_key().is_some_and(|key| node.label(key).is_none()) {
                pool.without_key += 1;
            } else {
                pool.candidates.push(node);
            }
        }
        pool
    }

    /// How many nodes the set can hold at most.
    fn capacity(&self) -> usize {
        match self.spec.topology_key() {
            Some(key) => self.values(key).len(),
            None => self.candidates.len(),
        }
    }

    /// The values of label `key` among the candidates.
    fn values(&self, key: &str) -> BTreeSet<&'a str> {
        self.candidates.iter().filter_map(|n| n.label(key)).collect()
    }

    /// The next new node: by name, or with a topology key, the first by name of the free
    /// value least used by the sets chosen before (ties by value).
    fn next_new(&self, picked: &[&EffectiveNode], chosen: &[&EffectiveNode]) -> Option<&'a EffectiveNode> {
        let mut free = self.candidates.iter().copied().filter(|n| !picked.iter().any(|p| p.name == n.name));
        let Some(key) = self.spec.topology_key() else { return free.next() };
        free.filter(|n| fits(Some(key), n, picked)).min_by_key(|n| {
            let value = n.label(key);
            (chosen.iter().filter(|c| c.label(key) == value).count(), value, &n.name)
        })
    }

    /// Why `need` nodes cannot be chosen.
    fn unschedulable(&self, need: usize) -> Unschedulable {
        let spec = self.spec;
        let mut wanted = format!(
            "need {need} nodes ({} active + {} standby) of role {}",
            spec.count,
            spec.standby,
            self.role.as_str()
        );
        if !spec.selector.is_empty() {
            let selector: Vec<String> = spec.selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let _ = write!(wanted, " with {}", selector.join(","));
        }
        let mut reason = match spec.topology_key() {
            Some(key) => {
                let values: Vec<&str> = self.values(key).into_iter().collect();
                format!(
                    "{wanted}, at most one per value of {key:?}, but the {} eligible nodes have {} values of {key:?} ({})",
                    self.candidates.len(),
                    values.len(),
                    values.join(", ")
                )
            }
            None => format!("{wanted}, but {} nodes are eligible", self.candidates.len()),
        };
        if self.without_address > 0 {
            let _ = write!(reason, "; {} matching nodes have no address on {}", self.without_address, self.api_network);
        }
        if let Some(key) = spec.topology_key().filter(|_| self.without_key > 0) {
            let _ = write!(reason, "; {} matching nodes have no {key:?} label", self.without_key);
        }
        let _ = write!(reason, " ({} nodes of role {} match the selector)", self.matching, self.role.as_str());
        Unschedulable { node_set: node_set_name(self.role).to_string(), reason }
    }
}

/// Whether `node` may join `picked` under the topology `key`: its value is not taken yet.
fn fits(key: Option<&str>, node: &EffectiveNode, picked: &[&EffectiveNode]) -> bool {
    let Some(key) = key else { return true };
    let value = node.label(key);
    value.is_some() && !picked.iter().any(|p| p.label(key) == value)
}

/// The node's address on the site's API network.
fn api_address(site: &ResolvedSite, name: &NodeName) -> Option<IpAddr> {
    let network = &site.site.cluster.as_ref()?.api_network;
    site.nodes.get(name)?.addresses.get(network).copied()
}

/// `masters` or `workers`.
fn node_set_name(role: Role) -> &'static str {
    match role {
        Role::Master => "masters",
        Role::Worker => "workers",
    }
}

/// The names, sorted.
fn names(nodes: &[&EffectiveNode]) -> Vec<NodeName> {
    let mut names: Vec<NodeName> = nodes.iter().map(|n| n.name.clone()).collect();
    names.sort();
    names
}

/// The names, sorted.
fn sorted(names: &[NodeName]) -> Vec<&NodeName> {
    let mut sorted: Vec<&NodeName> = names.iter().collect();
    sorted.sort();
    sorted
}

/// A count as a length (saturating on targets narrower than 32 bits).
fn to_usize(n: u32) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::design::fixtures::{design, resolved, site};

    const MASTERS_PER_RACK: &str = "{ count: 3, standby: 0, selector: { hw: r640 }, topologyKey: rack }";

    /// Three racks: masters node-1..3 (one per rack) and node-4 (rack r1); workers node-11..16.
    fn three_racks(masters: &str, workers: &str) -> ResolvedSite {
        resolved(&design(
            &site(masters, workers),
            &[
                (1, "control", "r1"),
                (2, "control", "r2"),
                (3, "control", "r3"),
                (4, "control", "r1"),
                (11, "worker", "r1"),
                (12, "worker", "r2"),
                (13, "worker", "r3"),
                (14, "worker", "r1"),
                (15, "worker", "r2"),
                (16, "big-worker", "r3"),
            ],
        ))
    }

    fn names(list: &[NodeName]) -> Vec<&str> {
        list.iter().map(NodeName::as_str).collect()
    }

    fn workers(count: u32, standby: u32) -> String {
        format!("{{ count: {count}, standby: {standby} }}")
    }

    #[test]
    fn one_master_per_rack_and_workers_by_name() {
        let site = three_racks(MASTERS_PER_RACK, &workers(4, 0));
        let selection = select(&site, &Selection::default()).unwrap();
        assert_eq!(names(&selection.masters.active), ["node-1", "node-2", "node-3"]);
        assert_eq!(names(&selection.workers.active), ["node-11", "node-12", "node-13", "node-14"]);
        assert!(selection.masters.standby.is_empty() && selection.workers.standby.is_empty());
    }

    #[test]
    fn workers_spread_over_racks_least_used_first() {
        // Masters take r1 (node-4 is not wanted: count 2), r2; workers one per rack start on r3.
        let site = three_racks("{ count: 2, topologyKey: rack }", "{ count: 3, topologyKey: rack }");
        let selection = select(&site, &Selection::default()).unwrap();
        assert_eq!(names(&selection.masters.active), ["node-1", "node-2"]);
        assert_eq!(names(&selection.workers.active), ["node-11", "node-12", "node-13"]);
        let site = three_racks("{ count: 2, topologyKey: rack }", "{ count: 1, topologyKey: rack }");
        let selection = select(&site, &Selection::default()).unwrap();
        assert_eq!(names(&selection.workers.active), ["node-13"], "r3 has no master yet");
    }

    #[test]
    fn standby_nodes_follow_the_active_ones_and_are_labelled() {
        let site = three_racks(MASTERS_PER_RACK, &workers(4, 1));
        let selection = select(&site, &Selection::default()).unwrap();
        assert_eq!(names(&selection.workers.active), ["node-11", "node-12", "node-13", "node-14"]);
        assert_eq!(names(&selection.workers.standby), ["node-15"]);
        let labels = selection.labels();
        let node = |n: &str| NodeName::try_from(n).unwrap();
        assert_eq!(labels[&node("node-1")], BTreeMap::from([(ROLE_LABEL.into(), "master".into())]));
        assert_eq!(
            labels[&node("node-15")],
            BTreeMap::from([(ROLE_LABEL.into(), "worker".into()), (STANDBY_LABEL.into(), "true".into())])
        );
        assert!(!labels.contains_key(&node("node-4")) && !labels.contains_key(&node("node-16")));
        assert_eq!(selection.placement(&node("node-15")), Some(Placement { role: Role::Worker, standby: true }));
        assert_eq!(selection.placement(&node("node-4")), None);
    }

    #[test]
    fn the_selector_filters_candidates() {
        let site = three_racks(MASTERS_PER_RACK, "{ count: 1, selector: { hw: r740 } }");
        let selection = select(&site, &Selection::default()).unwrap();
        assert_eq!(names(&selection.workers.active), ["node-16"]);
        let err = select(&three_racks(MASTERS_PER_RACK, "{ count: 2, selector: { hw: r740 } }"), &Selection::default())
            .unwrap_err();
        assert_eq!(err.node_set, "workers");
        assert_eq!(
            err.reason,
            "need 2 nodes (2 active + 0 standby) of role worker with hw=r740, but 1 nodes are eligible \
             (1 nodes of role worker match the selector)"
        );
    }

    #[test]
    fn three_masters_on_two_racks_are_unschedulable() {
        let site = resolved(&design(
            &site(MASTERS_PER_RACK, &workers(0, 0)),
            &[(1, "control", "r1"), (2, "control", "r2"), (3, "control", "r1"), (4, "control", "r2")],
        ));
        let err = select(&site, &Selection::default()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "masters: unschedulable: need 3 nodes (3 active + 0 standby) of role master with hw=r640, at most one \
             per value of \"rack\", but the 4 eligible nodes have 2 values of \"rack\" (r1, r2) \
             (4 nodes of role master match the selector)"
        );
    }

    #[test]
    fn nodes_without_the_topology_label_do_not_qualify() {
        let text = design(
            &site("{ count: 2, topologyKey: zone }", &workers(0, 0)),
            &[(1, "control", "r1"), (2, "control", "r2")],
        )
        .replace("rack: r1\n", "rack: r1\nlabels: { zone: a }\n");
        let err = select(&resolved(&text), &Selection::default()).unwrap_err();
        assert!(
            err.reason.contains(
                "the 1 eligible nodes have 1 values of \"zone\" (a); 1 matching nodes have no \"zone\" label"
            ),
            "{err}"
        );
    }

    #[test]
    fn scaling_workers_up_and_down_changes_the_fewest_nodes() {
        // A previous selection that is not the one a fresh selection would make: it is kept.
        let four = three_racks(MASTERS_PER_RACK, &workers(4, 0));
        let mut previous = select(&four, &Selection::default()).unwrap();
        previous.workers.active =
            ["node-12", "node-13", "node-15", "node-16"].map(|n| NodeName::try_from(n).unwrap()).to_vec();

        let five = select(&three_racks(MASTERS_PER_RACK, &workers(5, 0)), &previous).unwrap();
        assert_eq!(names(&five.workers.active), ["node-11", "node-12", "node-13", "node-15", "node-16"]);
        assert_eq!(five.masters, previous.masters);

        let three = select(&three_racks(MASTERS_PER_RACK, &workers(3, 0)), &five).unwrap();
        assert_eq!(names(&three.workers.active), ["node-11", "node-12", "node-13"]);
        assert!(three.workers.active.iter().all(|n| five.workers.active.contains(n)));

        // Unchanged spec, same selection.
        assert_eq!(select(&three_racks(MASTERS_PER_RACK, &workers(3, 0)), &three).unwrap(), three);
    }

    #[test]
    fn scaling_up_promotes_the_standby_and_a_new_node_stands_by() {
        let before = select(&three_racks(MASTERS_PER_RACK, &workers(4, 1)), &Selection::default()).unwrap();
        let after = select(&three_racks(MASTERS_PER_RACK, &workers(5, 1)), &before).unwrap();
        assert_eq!(names(&after.workers.active), ["node-11", "node-12", "node-13", "node-14", "node-15"]);
        assert_eq!(names(&after.workers.standby), ["node-16"]);
    }

    #[test]
    fn a_node_that_no_longer_qualifies_is_replaced() {
        let before = select(&three_racks(MASTERS_PER_RACK, &workers(4, 0)), &Selection::default()).unwrap();
        // node-12 moves to other hardware: the selector for r640 drops it, node-15 takes its place.
        let text = design(
            &site(MASTERS_PER_RACK, "{ count: 4, selector: { hw: r640 } }"),
            &[
                (1, "control", "r1"),
                (2, "control", "r2"),
                (3, "control", "r3"),
                (11, "worker", "r1"),
                (12, "big-worker", "r2"),
                (13, "worker", "r3"),
                (14, "worker", "r1"),
                (15, "worker", "r2"),
            ],
        );
        let after = select(&resolved(&text), &before).unwrap();
        assert_eq!(names(&after.workers.active), ["node-11", "node-13", "node-14", "node-15"]);
    }

    #[test]
    fn selection_is_deterministic() {
        let site = three_racks(MASTERS_PER_RACK, &workers(3, 2));
        let first = select(&site, &Selection::default()).unwrap();
        for _ in 0..3 {
            assert_eq!(select(&three_racks(MASTERS_PER_RACK, &workers(3, 2)), &Selection::default()).unwrap(), first);
        }
    }

    #[test]
    fn a_site_without_cluster_spec_is_unschedulable() {
        let text = design(&site("{ count: 1 }", "{ count: 0 }"), &[(1, "control", "r1")]);
        let text = text
            .replace("cluster:\n  apiNetwork: provisioning\n  masters: { count: 1 }\n  workers: { count: 0 }\n", "");
        let err = select(&resolved(&text), &Selection::default()).unwrap_err();
        assert_eq!(err.to_string(), "cluster: unschedulable: Site/edge-01 has no cluster spec");
    }

    #[test]
    fn backends_and_inventory_for_the_supporting_services() {
        let text = design(
            &site("{ count: 2, topologyKey: rack }", "{ count: 1, standby: 1 }"),
            &[(1, "control", "r1"), (2, "control", "r2"), (3, "worker", "r1"), (4, "worker", "r2")],
        );
        let site = resolved(&text);
        let selection = select(&site, &Selection::default()).unwrap();
        let backends: Vec<String> =
            selection.load_balancer_backends(&site).iter().map(|b| format!("{} {}", b.node, b.address)).collect();
        assert_eq!(backends, ["node-1 10.1.0.11:6443", "node-2 10.1.0.12:6443"]);
        let expected = "\
[all]
node-1 ansible_ssh_host=10.1.0.11
node-2 ansible_ssh_host=10.1.0.12
node-3 ansible_ssh_host=10.1.0.13

[kube-master]
node-1
node-2

[kube-node]
node-3

[etcd]
node-1
node-2

[k8s-cluster:children]
kube-master
kube-node
";
        assert_eq!(selection.inventory(&site).to_ini(), expected);
    }
}
