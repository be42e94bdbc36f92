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
//! - gateways and routes' routers on their networks, bonds of the node's own ports (each in one
//!   bond, carrying no network itself), VLANs from 1 to 4094 on an interface of the node, at most
//!   one default route per node (`links.rs`);
//! - kernel parameters a kernel command line takes as they are (no blanks, quotes or `$`);
//! - maintenance windows that read (cron, time zone, duration) and open some day;
//! - only packages the catalog holds, at the versions it holds.
//!
//! Profiles are checked as written (their interfaces' networks, their packages), so a profile
//! no node uses yet is checked too; nodes are checked as resolved.
//!
//! Documents that do not parse do not stop the checks: [`validate_parsed`] reports their
//! errors and checks every other document, leaving out only what the unreadable ones would
//! decide (a node's role inherited through an unreadable profile, whether the site has a
//! master when a Node is unreadable, anything that needs an unreadable Site).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::document::{Body, ClusterSpec, Document, Entry, Interface, Kind, Origin, Parsed, Site, entries};
use super::error::{DesignError, Errors};
use super::inherit::Setting;
use super::resolve::{NodeFacts, ResolvedSite, resolve_all};
use crate::domain::{MacAddress, PackageRef, Role};

/// Resolves the documents of one site and checks every design rule against them and the
/// package `catalog`. Returns the resolved site, or every error found (resolution errors
/// first); when any error is returned, nothing of the design may be applied.
pub fn validate(docs: &[Document], catalog: &BTreeSet<PackageRef>) -> Result<ResolvedSite, Vec<DesignError>> {
    validate_entries(&entries(docs), Errors::default(), catalog)
}

/// [`validate()`] on what could be read of a design's sources: the errors of the documents that
/// did not parse first, then every error of the documents that did.
pub fn validate_parsed(parsed: &Parsed, catalog: &BTreeSet<PackageRef>) -> Result<ResolvedSite, Vec<DesignError>> {
    let mut errors = Errors::default();
    errors.extend(parsed.errors().iter().cloned());
    validate_entries(&parsed.entries(), errors, catalog)
}

/// Validates `entries`, reporting `errors` found before first.
fn validate_entries(
    entries: &[Entry<'_>],
    mut errors: Errors,
    catalog: &BTreeSet<PackageRef>,
) -> Result<ResolvedSite, Vec<DesignError>> {
    let mut resolution = resolve_all(entries);
    let mut found = Errors::default();
    let site = resolution.site.as_ref().map(|(origin, site, _)| (origin, site));
    let docs = entries.iter().filter_map(|e| match e {
        Entry::Read(doc) => Some(*doc),
        Entry::Unreadable(_) => None,
    });
    check_profiles(docs, site.map(|(_, s)| s), catalog, &mut found);
    let nodes_unreadable = resolution.unreadable.iter().any(|o| o.kind == Kind::Node);
    check(site, &resolution.facts, nodes_unreadable, &mut found);
    for node in resolution.nodes.values() {
        super::links::check_node(site.map(|(_, s)| s), node, &mut found);
        check_kernel_parameters(node, &mut found);
    }
    errors.extend(resolution.errors.into_vec());
    errors.extend(found.into_vec());
    resolution.errors = errors;
    resolution.into_site()
}

/// The profiles as written: their interfaces name known networks, their packages are in the
/// catalog.
fn check_profiles<'a>(
    docs: impl Iterator<Item = &'a Document>,
    site: Option<&Site>,
    catalog: &BTreeSet<PackageRef>,
    errors: &mut Errors,
) {
    for doc in docs {
        let (interfaces, packages): (&[Interface], Vec<PackageRef>) = match &doc.body {
            Body::HardwareProfile(hw) => (&hw.interfaces.set, Vec::new()),
            Body::HostProfile(host) => (
                &host.interfaces.set,
                host.packages.set.iter().map(super::document::PackageEntry::package_ref).collect(),
            ),
            Body::Site(_) | Body::Node(_) => continue,
        };
        let origin = doc.origin();
        if let Body::HostProfile(host) = &doc.body {
            if let Some(windows) = &host.maintenance_windows {
                super::windows::check(&origin, windows, errors);
            }
            for entry in host.packages.set.iter().filter(|e| e.values.as_ref().is_some_and(|v| !v.is_object())) {
                errors.push(
                    origin.error(format!("packages[{}].values", entry.name), "must be a mapping of the chart's values"),
                );
            }
        }
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

/// Every rule about the site and its resolved nodes; `site` is missing when the design has none
/// (or it could not be read), `nodes_unreadable` when some Node document could not be read.
fn check(site: Option<(&Origin, &Site)>, nodes: &[NodeFacts], nodes_unreadable: bool, errors: &mut Errors) {
    if let Some((origin, site)) = site {
        check_site(origin, site, errors);
        if !nodes_unreadable {
            check_has_master(origin, nodes, errors);
        }
    }
    for node in nodes {
        check_role(node, errors);
        check_addresses(site.map(|(_, s)| s), node, errors);
    }
    check_unique_macs(nodes, errors);
    check_unique_ips(nodes, errors);
}

/// Networks defined once; the cluster's API network known; at least one master wanted; chart
/// values mappings.
fn check_site(origin: &Origin, site: &Site, errors: &mut Errors) {
    for package in site.values.iter().filter(|(_, v)| !v.is_object()).map(|(p, _)| p) {
        errors.push(origin.error(format!("values.{package}"), "must be a mapping of the chart's values"));
    }
    super::links::check_networks(origin, site, errors);
    super::windows::check(origin, &site.maintenance_windows, errors);
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
    check_build(origin, site, cluster, errors);
}

/// What Cluster API's webhooks (and bare metal) would refuse of how the cluster is built, judged
/// on the node sets as written (their counts and standby hosts); a Cluster API endpoint on the
/// API network.
fn check_build(origin: &Origin, site: &Site, cluster: &ClusterSpec, errors: &mut Errors) {
    let build = cluster.build(|role| cluster.node_set(role).standby);
    let masters = usize::try_from(cluster.masters.count).unwrap_or(usize::MAX);
    if masters > 0 {
        for problem in build.problems(masters) {
            errors.push(origin.error(problem.field, problem.reason));
        }
    }
    if let (Some(endpoint), Some(network)) =
        (cluster.endpoint, site.networks.iter().find(|n| n.name == cluster.api_network))
        && !network.cidr.contains(endpoint.host)
    {
        errors.push(origin.error(
            "cluster.endpoint.host",
            format!("{} is not on {}, the cluster's API network ({})", endpoint.host, network.name, network.cidr),
        ));
    }
}

/// Some node has role master. Not judged while a node's role is unknown: set, if at all, by a
/// document that could not be read.
fn check_has_master(origin: &Origin, nodes: &[NodeFacts], errors: &mut Errors) {
    if nodes.iter().any(role_unknown) {
        return;
    }
    if !nodes.iter().any(|n| n.role() == Some(Role::Master)) {
        errors.push(origin.error("nodes", "no node has role master: a site needs at least one"));
    }
}

/// Whether the node's role may be set by a document of its chain that could not be read. Such
/// a document is below every host profile read, so a role set or cleared above it stands.
fn role_unknown(node: &NodeFacts) -> bool {
    matches!(node.role, Setting::Unset) && !node.unreadable.is_empty()
}

/// The node's chain sets a role. A node without a known host profile is already reported, and
/// one whose chain holds a document that could not be read may have its role there.
fn check_role(node: &NodeFacts, errors: &mut Errors) {
    if role_unknown(node) {
        return;
    }
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
fn check_addresses(site: Option<&Site>, node: &NodeFacts, errors: &mut Errors) {
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
fn check_unique_macs(nodes: &[NodeFacts], errors: &mut Errors) {
    let mut first: BTreeMap<&MacAddress, &NodeFacts> = BTreeMap::new();
    for node in nodes {
        let Some(mac) = &node.boot_mac else { continue };
        match first.get(mac) {
            Some(other) => errors.push(
                node.origin.error("bootMac", format!("{mac} is already the boot MAC of {}", other.origin.location())),
            ),
            None => {
                first.insert(mac, node);
            }
        }
    }
}

/// No IP address is used twice, on any network by any node.
fn check_unique_ips(nodes: &[NodeFacts], errors: &mut Errors) {
    let mut first: BTreeMap<IpAddr, (&NodeFacts, &str)> = BTreeMap::new();
    for node in nodes {
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

/// Kernel parameters a command line can take as they are, each error at the document that set it.
fn check_kernel_parameters(node: &super::resolve::EffectiveNode, errors: &mut Errors) {
    for (key, value) in &node.kernel_parameters {
        if let Err(e) = crate::host_setup::check_kernel_parameters([(key, &value.value)]) {
            errors.push(value.origin.error(format!("kernelParameters[{key}]"), e.reason));
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
mod tests;
