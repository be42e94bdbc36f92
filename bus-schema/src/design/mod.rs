//! Site design documents: sites, hardware and host profiles and nodes in YAML, resolved
//! through profile inheritance, validated as a whole, and turned into a cluster.
//!
//! ```yaml
//! kind: Site
//! name: edge-01
//! region: eu-west
//! labels: { tier: gold }
//! networks: [{ name: provisioning, cidr: 10.1.0.0/24 }, { name: oob, cidr: 10.0.0.0/24 }]
//! cluster:
//!   apiNetwork: provisioning
//!   masters: { count: 3, standby: 0, selector: { hw: r640 }, topologyKey: rack }
//!   workers: { count: 4, standby: 1, selector: {}, topologyKey: "" }
//! ---
//! kind: HardwareProfile
//! name: r640
//! labels: { hw: r640 }
//! interfaces: [{ name: eno1, network: provisioning, mtu: 9000 }, { name: eno2 }]
//! storage: [{ name: root, device: /dev/sda, sizeGb: 480, mount: / }]
//! ---
//! kind: HostProfile
//! name: base
//! hardwareProfile: r640
//! role: worker
//! packages: [{ name: ubuntu, version: "22.04" }, { name: kubelet, version: 1.29.1 }]
//! kernelParameters: { isolcpus: 2-7, nosmt: ~ }
//! ---
//! kind: HostProfile
//! name: control
//! parent: base
//! role: master                     # a scalar overrides
//! interfaces: ['!eno2']            # '!name' removes an inherited entry
//! kernelParameters: { '!isolcpus': ~ }
//! packages: [{ name: etcd, version: 3.5.12 }]
//! ---
//! kind: Node
//! name: node-1
//! hostProfile: control
//! bootMac: 52:54:00:00:01:01
//! bmc: { address: ipmi://10.0.0.11, credentialsRef: bmc-node-1 }
//! rack: r1
//! labels: { zone: a }
//! addressing: [{ network: provisioning, ip: 10.1.0.11 }, { network: oob, ip: 10.0.0.111 }]
//! ```
//!
//! The flow: [`parse_documents`] each source, [`validate()`] the documents of the site against
//! the package catalog (every error at once; apply nothing unless it succeeds), [`select()`]
//! the cluster's nodes given the previous selection, then derive what the rest needs: the
//! flat [`SiteDesign`](crate::domain::SiteDesign) ([`to_site_design`]), the API load
//! balancer's backends and the jump host's inventory. [`render_effective`] shows a node with
//! where each value came from (`design show NODE --effective`).
//!
//! Inheritance: a node's chain is its hardware profile < root host profile < … < leaf host
//! profile < the node. A scalar in a later layer overrides, `'!'` clears it; lists (packages,
//! interfaces, storage, by name) and maps (labels, kernel parameters, by key) merge, an entry
//! of the same name replacing the inherited one, and `'!name'` removes an inherited entry.
//! Maintenance windows are one list replaced whole; the Site document's go over the profiles'.

pub mod apply;
pub mod convert;
pub mod document;
pub mod error;
pub mod inherit;
mod links;
pub mod net;
pub mod origin;
pub mod resolve;
pub mod select;
pub mod validate;
mod windows;

#[cfg(test)]
pub(crate) mod fixtures;

pub use apply::{Changes, Planned, changes, plan, selection_of};
pub use convert::to_site_design;
pub use document::{
    Address, Bmc, Body, ClusterSpec, Document, HardwareProfile, HostProfile, Interface, Kind, Network, Node,
    NodeSetSpec, Origin, PackageEntry, Parsed, Site, Storage, parse_documents,
};
pub use error::DesignError;
pub use inherit::{ListPatch, MapPatch, Named, ScalarPatch, Setting, Sourced};
pub use net::Cidr;
pub use resolve::{EffectiveNode, ResolvedSite, render_effective, render_effective_at, resolve, resolve_parsed};
pub use select::{
    API_PORT, Backend, Inventory, InventoryHost, NodeSet, Placement, ROLE_LABEL, STANDBY_LABEL, Selection,
    Unschedulable, select,
};
pub use validate::{validate, validate_parsed};

#[cfg(test)]
mod tests {
    use super::*;

    /// The YAML example of this module's documentation.
    fn documented_example() -> String {
        let source = include_str!("mod.rs");
        let lines: Vec<&str> = source
            .lines()
            .skip_while(|l| *l != "//! ```yaml")
            .skip(1)
            .take_while(|l| *l != "//! ```")
            .map(|l| l.strip_prefix("//! ").unwrap_or(l.trim_start_matches("//!")))
            .collect();
        lines.join("\n")
    }

    #[test]
    fn the_documented_example_is_valid_and_shows_inheritance() {
        let docs = parse_documents(&documented_example(), "example.yaml").unwrap();
        assert_eq!(docs.len(), 5);
        let site = validate(&docs, &fixtures::catalog()).unwrap();
        let node = site.node("node-1").unwrap();
        assert_eq!(node.interfaces.keys().collect::<Vec<_>>(), ["eno1"]);
        assert_eq!(node.kernel_parameters.keys().collect::<Vec<_>>(), ["nosmt"]);
        let shown = render_effective(node);
        assert!(shown.contains("role = master"), "{shown}");
        assert!(shown.contains("(from HostProfile/control)"), "{shown}");
        // One r640 master cannot make three, one per rack.
        let err = select(&site, &Selection::default()).unwrap_err();
        assert!(err.reason.starts_with("need 3 nodes (3 active + 0 standby) of role master with hw=r640"), "{err}");
    }

    #[test]
    fn from_yaml_to_everything_the_services_need() {
        let text = fixtures::design(
            &fixtures::site("{ count: 1, selector: { hw: r640 } }", "{ count: 1 }"),
            &[(1, "control", "r1"), (2, "worker", "r2")],
        );
        let docs = parse_documents(&text, "site.yaml").unwrap();
        let site = validate(&docs, &fixtures::catalog()).unwrap();
        let selection = select(&site, &Selection::default()).unwrap();
        let flat = to_site_design(&site, &selection).unwrap();
        assert_eq!(flat.nodes.len(), 2);
        assert_eq!(selection.load_balancer_backends(&site)[0].address.to_string(), "10.1.0.11:6443");
        assert!(selection.inventory(&site).to_ini().starts_with("[all]\nnode-1 ansible_ssh_host=10.1.0.11\n"));
    }

    #[test]
    fn a_host_profiles_cleaning_is_inherited_cleared_and_reaches_the_node() {
        let text = fixtures::design(
            &fixtures::site("{ count: 1, selector: { hw: r640 } }", "{ count: 2 }"),
            &[(1, "control", "r1"), (2, "worker", "r2"), (3, "big-worker", "r2")],
        )
        .replace("name: base\n", "name: base\ncleaning: disabled\n")
        .replace("name: big-worker\n", "name: big-worker\ncleaning: '!'\n");
        let docs = parse_documents(&text, "site.yaml").unwrap();
        let site = validate(&docs, &fixtures::catalog()).unwrap();
        let shown = render_effective(site.node("node-2").unwrap());
        assert!(shown.contains("cleaning = disabled"), "{shown}");
        assert!(shown.contains("(from HostProfile/base)"), "{shown}");
        let flat = to_site_design(&site, &select(&site, &Selection::default()).unwrap()).unwrap();
        let cleaning = |name: &str| flat.nodes.iter().find(|n| n.name.as_str() == name).unwrap().cleaning;
        assert_eq!(cleaning("node-1"), crate::pb::CleaningMode::Disabled, "inherited by the control profile");
        assert_eq!(cleaning("node-3"), crate::pb::CleaningMode::Unspecified, "cleared: the host's own");
        let bad = text.replace("cleaning: disabled", "cleaning: wipe-everything");
        assert!(parse_documents(&bad, "site.yaml").is_err(), "an unknown mode is refused");
    }
}
