//! Profile inheritance: every node's effective configuration, and where each value came from.
//!
//! A node's chain, from the bottom: its HardwareProfile, its root HostProfile, … its leaf
//! HostProfile (the node's `hostProfile`), the Node itself. Each layer applies on top of the
//! layers below it (see [`super::inherit`]). The hardware profile is itself a scalar of the
//! HostProfile chain: the leaf-most profile that names one decides.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::IpAddr;

use super::document::{
    Body, Document, Entry, HardwareProfile, HostProfile, Interface, Kind, Network, Node, Origin, Parsed, Site, Storage,
    entries,
};
use super::error::{DesignError, Errors};
use super::inherit::{ListPatch, MapPatch, ScalarPatch, Setting, Sourced};
use crate::domain::{BmcAddress, InvalidField, MacAddress, NodeName, PackageRef, Role, SiteId};

/// A site whose nodes are resolved: every node's effective configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedSite {
    /// The site id.
    pub id: SiteId,
    /// The Site document.
    pub origin: Origin,
    /// The site as written.
    pub site: Site,
    /// Every node, by name.
    pub nodes: BTreeMap<NodeName, EffectiveNode>,
}

impl ResolvedSite {
    /// The node named `name`.
    pub fn node(&self, name: &str) -> Option<&EffectiveNode> {
        self.nodes.get(&NodeName::try_from(name).ok()?)
    }

    /// The site network named `name`.
    pub fn network(&self, name: &str) -> Option<&Network> {
        self.site.networks.iter().find(|n| n.name == name)
    }
}

/// A node with its chain applied. Values that only the Node document sets (its name, MAC,
/// BMC, rack and addresses) come from [`EffectiveNode::origin`]; every other value carries the
/// document that set it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectiveNode {
    /// The hostname.
    pub name: NodeName,
    /// The Node document.
    pub origin: Origin,
    /// The documents applied, bottom first: hardware profile, root … leaf host profile, node.
    pub chain: Vec<Origin>,
    /// The leaf HostProfile, as named by the node.
    pub host_profile: String,
    /// The HardwareProfile the chain names.
    pub hardware_profile: Setting<String>,
    /// The node's role.
    pub role: Setting<Role>,
    /// The MAC address the node boots from.
    pub boot_mac: MacAddress,
    /// The node's BMC.
    pub bmc_address: BmcAddress,
    /// The secret holding the BMC credentials.
    pub bmc_credentials_ref: Option<String>,
    /// The node's rack (also its `rack` label).
    pub rack: Option<String>,
    /// Labels, by key.
    pub labels: BTreeMap<String, Sourced<String>>,
    /// Packages, by name.
    pub packages: BTreeMap<String, Sourced<PackageRef>>,
    /// Kernel parameters, by key; an empty value is a parameter without value.
    pub kernel_parameters: BTreeMap<String, Sourced<String>>,
    /// Network interfaces, by name.
    pub interfaces: BTreeMap<String, Sourced<Interface>>,
    /// Disks and filesystems, by name.
    pub storage: BTreeMap<String, Sourced<Storage>>,
    /// The node's address on each network, by network name.
    pub addresses: BTreeMap<String, IpAddr>,
}

/// What the design rules look at in a node, known even when the node's own fields are
/// malformed (and it has no [`EffectiveNode`]), so that its other mistakes are reported too.
#[derive(Debug, Clone)]
pub(crate) struct NodeFacts {
    /// The Node document.
    pub(crate) origin: Origin,
    /// The boot MAC, if well-formed.
    pub(crate) boot_mac: Option<MacAddress>,
    /// The role its chain sets.
    pub(crate) role: Setting<Role>,
    /// The documents applied, bottom first.
    pub(crate) chain: Vec<Origin>,
    /// Documents of its chain that exist but could not be read: what they would set is missing.
    pub(crate) unreadable: Vec<Origin>,
    /// Its well-formed addresses, by network.
    pub(crate) addresses: BTreeMap<String, IpAddr>,
}

impl NodeFacts {
    /// The role, if one is set.
    pub(crate) fn role(&self) -> Option<Role> {
        self.role.value().copied()
    }
}

impl EffectiveNode {
    /// The role, if one is set.
    pub fn role(&self) -> Option<Role> {
        self.role.value().copied()
    }

    /// The value of label `key`.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(|l| l.value.as_str())
    }

    /// The labels without their origins.
    pub fn label_values(&self) -> BTreeMap<String, String> {
        self.labels.iter().map(|(k, v)| (k.clone(), v.value.clone())).collect()
    }

    /// The packages, by name, without their origins.
    pub fn package_refs(&self) -> Vec<PackageRef> {
        self.packages.values().map(|p| p.value.clone()).collect()
    }
}

/// Resolves every node of a design: the documents of one site, from any number of sources.
///
/// Errors (all of them, each naming its document) when the design does not hold exactly one
/// Site, the site id is malformed, a name is defined twice, a HostProfile names an unknown
/// parent or hardware profile, parents form a cycle, a node names an unknown host profile, or
/// a node's name, MAC, BMC address or IP address is malformed. [`super::validate()`] adds the design rules on top.
pub fn resolve(docs: &[Document]) -> Result<ResolvedSite, Vec<DesignError>> {
    resolve_all(&entries(docs)).into_site()
}

/// [`resolve()`] on what could be read of a design's sources: the errors of the documents that
/// did not parse first, then every error of the documents that did.
pub fn resolve_parsed(parsed: &Parsed) -> Result<ResolvedSite, Vec<DesignError>> {
    let mut resolution = resolve_all(&parsed.entries());
    let mut errors = Errors::default();
    errors.extend(parsed.errors().iter().cloned());
    errors.extend(resolution.errors.into_vec());
    resolution.errors = errors;
    resolution.into_site()
}

/// What resolution produced, even from a faulty design: the checks after it run on whatever
/// could be resolved, so that one report lists every problem.
#[derive(Debug)]
pub(crate) struct Resolution {
    /// The Site document, and its id if well-formed.
    pub(crate) site: Option<(Origin, Site, Option<SiteId>)>,
    pub(crate) nodes: BTreeMap<NodeName, EffectiveNode>,
    /// Every Node document's facts (those of [`Resolution::nodes`] and of malformed nodes),
    /// by name.
    pub(crate) facts: Vec<NodeFacts>,
    /// The documents that could not be read.
    pub(crate) unreadable: Vec<Origin>,
    pub(crate) errors: Errors,
}

impl Resolution {
    /// The resolved site, or every error found.
    pub(crate) fn into_site(self) -> Result<ResolvedSite, Vec<DesignError>> {
        match self.site {
            Some((origin, site, Some(id))) if self.errors.is_empty() => {
                Ok(ResolvedSite { id, origin, site, nodes: self.nodes })
            }
            _ => Err(self.errors.into_vec()),
        }
    }
}

/// Resolves what can be resolved and records every error on the way. Unreadable documents
/// count as defined (their names are taken, references to them hold) but contribute nothing.
pub(crate) fn resolve_all(entries: &[Entry<'_>]) -> Resolution {
    let mut errors = Errors::default();
    let index = Index::build(entries, &mut errors);
    let site = index.site.as_ref().map(|(site, origin)| {
        let id = checked(SiteId::try_from(site.name.as_str()), origin, "name", &mut errors);
        (origin.clone(), (*site).clone(), id)
    });
    index.check_profiles(&mut errors);
    let mut nodes = BTreeMap::new();
    let mut facts = Vec::new();
    for (node, origin) in &index.nodes {
        let (node_facts, effective) = index.resolve_node(node, origin, &mut errors);
        facts.push(node_facts);
        if let Some(effective) = effective {
            nodes.insert(effective.name.clone(), effective);
        }
    }
    facts.sort_by(|a, b| a.origin.name.cmp(&b.origin.name));
    let unreadable = index.unreadable.values().cloned().collect();
    Resolution { site, nodes, facts, unreadable, errors }
}

/// The documents by kind and name; the first of a duplicated name wins.
struct Index<'a> {
    site: Option<(&'a Site, Origin)>,
    hardware: BTreeMap<&'a str, (&'a HardwareProfile, Origin)>,
    hosts: BTreeMap<&'a str, (&'a HostProfile, Origin)>,
    nodes: Vec<(&'a Node, Origin)>,
    /// The documents that could not be read, by kind and name.
    unreadable: BTreeMap<(Kind, &'a str), Origin>,
}

impl<'a> Index<'a> {
    fn build(entries: &[Entry<'a>], errors: &mut Errors) -> Self {
        let mut index = Index {
            site: None,
            hardware: BTreeMap::new(),
            hosts: BTreeMap::new(),
            nodes: Vec::new(),
            unreadable: BTreeMap::new(),
        };
        let mut seen: BTreeMap<(Kind, &str), Origin> = BTreeMap::new();
        let mut first_site: Option<Origin> = None;
        for entry in entries {
            let (origin, name) = match entry {
                Entry::Read(doc) => (doc.origin(), doc.name()),
                Entry::Unreadable(origin) => ((*origin).clone(), origin.name.as_str()),
            };
            if let Some(first) = seen.get(&(origin.kind, name)) {
                errors.push(duplicate(&origin, first));
                continue;
            }
            seen.insert((origin.kind, name), origin.clone());
            if origin.kind == Kind::Site {
                if let Some(first) = &first_site {
                    errors.push(origin.error(
                        "kind",
                        format!("a design describes one site, and {} is already defined", first.location()),
                    ));
                    continue;
                }
                first_site = Some(origin.clone());
            }
            let doc = match entry {
                Entry::Read(doc) => doc,
                Entry::Unreadable(_) => {
                    index.unreadable.insert((origin.kind, name), origin);
                    continue;
                }
            };
            match &doc.body {
                Body::Site(site) => index.site = Some((site, origin)),
                Body::HardwareProfile(hw) => {
                    index.hardware.insert(&hw.name, (hw, origin));
                }
                Body::HostProfile(host) => {
                    index.hosts.insert(&host.name, (host, origin));
                }
                Body::Node(node) => index.nodes.push((node, origin)),
            }
        }
        if first_site.is_none() {
            errors.push(DesignError::new("(design)", "kind", "no Site document: a design describes one site"));
        }
        index
    }

    /// Whether a document of `kind` named `name` exists, read or not.
    fn defines(&self, kind: Kind, name: &str) -> bool {
        let read = match kind {
            Kind::HardwareProfile => self.hardware.contains_key(name),
            Kind::HostProfile => self.hosts.contains_key(name),
            Kind::Site | Kind::Node => false,
        };
        read || self.unreadable.contains_key(&(kind, name))
    }

    /// Unknown parents and hardware profiles, and parent cycles, once per profile or cycle.
    fn check_profiles(&self, errors: &mut Errors) {
        for (profile, origin) in self.hosts.values() {
            if let Some(parent) = &profile.parent
                && !self.defines(Kind::HostProfile, parent)
            {
                errors.push(origin.error("parent", format!("no HostProfile named {parent:?}")));
            }
            if let Some(ScalarPatch::Set(hw)) = &profile.hardware_profile
                && !self.defines(Kind::HardwareProfile, hw)
            {
                errors.push(origin.error("hardwareProfile", format!("no HardwareProfile named {hw:?}")));
            }
        }
        for cycle in self.cycles() {
            if let Some((_, origin)) = cycle.first().and_then(|name| self.hosts.get(name)) {
                let mut path = cycle.clone();
                path.extend(cycle.first());
                errors.push(origin.error("parent", format!("inheritance cycle: {}", path.join(" -> "))));
            }
        }
    }

    /// Every parent cycle, each once, starting at its smallest name.
    fn cycles(&self) -> BTreeSet<Vec<&'a str>> {
        let mut cycles = BTreeSet::new();
        for &start in self.hosts.keys() {
            let mut path = vec![start];
            let mut current = start;
            while let Some(next) = self.parent_of(current) {
                if let Some(at) = path.iter().position(|&p| p == next) {
                    let mut cycle = path.split_off(at);
                    let smallest = cycle.iter().enumerate().min_by_key(|(_, name)| **name).map_or(0, |(i, _)| i);
                    cycle.rotate_left(smallest);
                    cycles.insert(cycle);
                    break;
                }
                path.push(next);
                current = next;
            }
        }
        cycles
    }

    /// The parent of profile `name`, if both exist.
    fn parent_of(&self, name: &str) -> Option<&'a str> {
        let (profile, _) = self.hosts.get(name)?;
        let parent = profile.parent.as_deref()?;
        self.hosts.get_key_value(parent).map(|(&k, _)| k)
    }

    /// The HostProfiles from the root down to `leaf`; stops at an unknown parent or a cycle.
    fn host_chain(&self, leaf: &str) -> Vec<&(&'a HostProfile, Origin)> {
        let mut chain: Vec<&(&'a HostProfile, Origin)> = Vec::new();
        let mut next = self.hosts.get_key_value(leaf);
        while let Some((&name, entry)) = next {
            if chain.iter().any(|(p, _)| p.name == name) {
                break;
            }
            chain.push(entry);
            next = entry.0.parent.as_deref().and_then(|p| self.hosts.get_key_value(p));
        }
        chain.reverse();
        chain
    }

    /// A node's facts, and its effective configuration unless its own fields are malformed.
    fn resolve_node(&self, node: &Node, origin: &Origin, errors: &mut Errors) -> (NodeFacts, Option<EffectiveNode>) {
        let name = checked(NodeName::try_from(node.name.as_str()), origin, "name", errors);
        let boot_mac = checked(MacAddress::try_from(node.boot_mac.clone()), origin, "bootMac", errors);
        let bmc_address = checked(BmcAddress::try_from(node.bmc.address.clone()), origin, "bmc.address", errors);
        let addresses = node_addresses(node, origin, errors);
        if !self.defines(Kind::HostProfile, &node.host_profile) {
            errors.push(origin.error("hostProfile", format!("no HostProfile named {:?}", node.host_profile)));
        }
        let profiles = self.host_chain(&node.host_profile);
        let mut hardware_profile = Setting::Unset;
        for (profile, origin) in &profiles {
            if let Some(patch) = &profile.hardware_profile {
                patch.apply(&mut hardware_profile, origin);
            }
        }
        let hardware = hardware_profile.value().and_then(|hw| self.hardware.get(hw.as_str()));
        let mut unreadable = Vec::new();
        // Where the chain stops at a document that could not be read: the leaf profile, the
        // parent of the root-most profile read, or the hardware profile.
        let cut = match profiles.first() {
            Some((root, _)) => root.parent.as_deref(),
            None => Some(node.host_profile.as_str()),
        };
        unreadable.extend(cut.and_then(|name| self.unreadable.get(&(Kind::HostProfile, name))).cloned());
        unreadable.extend(
            hardware_profile.value().and_then(|hw| self.unreadable.get(&(Kind::HardwareProfile, hw.as_str()))).cloned(),
        );

        let mut layers: Vec<Layer<'_>> = Vec::new();
        layers.extend(hardware.map(|(hw, origin)| Layer::hardware(hw, origin)));
        layers.extend(profiles.iter().map(|(profile, origin)| Layer::host(profile, origin)));
        layers.push(Layer::node(node, origin));
        let mut merged = Merged::default();
        for layer in &layers {
            merged.apply(layer);
        }
        if let Some(rack) = &node.rack {
            merged.labels.insert("rack".to_string(), Sourced::new(rack.clone(), origin.clone()));
        }

        let chain: Vec<Origin> = layers.iter().map(|l| l.origin.clone()).collect();
        let facts = NodeFacts {
            origin: origin.clone(),
            boot_mac: boot_mac.clone(),
            role: merged.role.clone(),
            chain: chain.clone(),
            unreadable,
            addresses: addresses.clone(),
        };
        let (Some(name), Some(boot_mac), Some(bmc_address)) = (name, boot_mac, bmc_address) else {
            return (facts, None);
        };
        let effective = EffectiveNode {
            name,
            origin: origin.clone(),
            chain,
            host_profile: node.host_profile.clone(),
            hardware_profile,
            role: merged.role,
            boot_mac,
            bmc_address,
            bmc_credentials_ref: node.bmc.credentials_ref.clone(),
            rack: node.rack.clone(),
            labels: merged.labels,
            packages: merged.packages,
            kernel_parameters: merged.kernel_parameters,
            interfaces: merged.interfaces,
            storage: merged.storage,
            addresses,
        };
        (facts, Some(effective))
    }
}

/// The checked value, or `None` with the error recorded against `origin`'s `field`.
fn checked<T>(result: Result<T, InvalidField>, origin: &Origin, field: &str, errors: &mut Errors) -> Option<T> {
    result.map_err(|e| errors.push(origin.error(field, e.reason))).ok()
}

/// The error for a second document of the same kind and name.
fn duplicate(origin: &Origin, first: &Origin) -> DesignError {
    let reason = match origin.kind {
        Kind::Node => format!("hostname {} is already used by {}", origin.name, first.location()),
        _ => format!("{origin} is already defined by {}", first.location()),
    };
    origin.error("name", reason)
}

/// A node's addresses, by network; malformed or repeated entries are reported and left out.
fn node_addresses(node: &Node, origin: &Origin, errors: &mut Errors) -> BTreeMap<String, IpAddr> {
    let mut addresses = BTreeMap::new();
    for address in &node.addressing {
        let field = format!("addressing[{}]", address.network);
        if addresses.contains_key(&address.network) {
            errors.push(origin.error(field, "a node has one address per network, and this network is listed twice"));
            continue;
        }
        match address.ip.parse::<IpAddr>() {
            Ok(ip) => {
                addresses.insert(address.network.clone(), ip);
            }
            Err(_) => {
                errors.push(origin.error(format!("{field}.ip"), format!("{:?} is not an IP address", address.ip)))
            }
        }
    }
    addresses
}

/// What one document of a chain contributes.
struct Layer<'a> {
    origin: &'a Origin,
    role: Option<&'a ScalarPatch<Role>>,
    labels: &'a MapPatch,
    packages: Option<&'a ListPatch<PackageRef>>,
    kernel_parameters: Option<&'a MapPatch>,
    interfaces: Option<&'a ListPatch<Interface>>,
    storage: Option<&'a ListPatch<Storage>>,
}

impl<'a> Layer<'a> {
    fn hardware(hw: &'a HardwareProfile, origin: &'a Origin) -> Self {
        Layer {
            origin,
            role: None,
            labels: &hw.labels,
            packages: None,
            kernel_parameters: Some(&hw.kernel_parameters),
            interfaces: Some(&hw.interfaces),
            storage: Some(&hw.storage),
        }
    }

    fn host(host: &'a HostProfile, origin: &'a Origin) -> Self {
        Layer {
            origin,
            role: host.role.as_ref(),
            labels: &host.labels,
            packages: Some(&host.packages),
            kernel_parameters: Some(&host.kernel_parameters),
            interfaces: Some(&host.interfaces),
            storage: Some(&host.storage),
        }
    }

    fn node(node: &'a Node, origin: &'a Origin) -> Self {
        Layer {
            origin,
            role: None,
            labels: &node.labels,
            packages: None,
            kernel_parameters: None,
            interfaces: None,
            storage: None,
        }
    }
}

/// The inheritable fields, as merged so far.
#[derive(Default)]
struct Merged {
    role: Setting<Role>,
    labels: BTreeMap<String, Sourced<String>>,
    packages: BTreeMap<String, Sourced<PackageRef>>,
    kernel_parameters: BTreeMap<String, Sourced<String>>,
    interfaces: BTreeMap<String, Sourced<Interface>>,
    storage: BTreeMap<String, Sourced<Storage>>,
}

impl Merged {
    /// Applies `layer` on top of what is merged so far.
    fn apply(&mut self, layer: &Layer<'_>) {
        let origin = layer.origin;
        if let Some(patch) = layer.role {
            patch.apply(&mut self.role, origin);
        }
        layer.labels.apply(&mut self.labels, origin);
        if let Some(patch) = layer.packages {
            patch.apply(&mut self.packages, origin);
        }
        if let Some(patch) = layer.kernel_parameters {
            patch.apply(&mut self.kernel_parameters, origin);
        }
        if let Some(patch) = layer.interfaces {
            patch.apply(&mut self.interfaces, origin);
        }
        if let Some(patch) = layer.storage {
            patch.apply(&mut self.storage, origin);
        }
    }
}

/// A human-readable listing of a node's effective configuration, one value per line, each
/// with the document it came from:
///
/// ```text
/// role = master                      (from HostProfile/control)
/// kernelParameters.isolcpus = 2-7    (from HostProfile/control)
/// ```
pub fn render_effective(node: &EffectiveNode) -> String {
    let own = Some(&node.origin);
    let mut lines: Vec<(String, Option<&Origin>)> = vec![
        (format!("name = {}", node.name), own),
        (format!("chain = {}", node.chain.iter().map(ToString::to_string).collect::<Vec<_>>().join(" < ")), None),
        (format!("hostProfile = {}", node.host_profile), own),
        setting_line("hardwareProfile", &node.hardware_profile, String::as_str),
        setting_line("role", &node.role, |r| r.as_str()),
        (format!("bootMac = {}", node.boot_mac), own),
        (format!("bmc.address = {}", node.bmc_address.as_str()), own),
    ];
    lines.extend(node.bmc_credentials_ref.as_ref().map(|c| (format!("bmc.credentialsRef = {c}"), own)));
    lines.extend(node.rack.as_ref().map(|r| (format!("rack = {r}"), own)));
    lines.extend(sourced_lines("labels", &node.labels, |v| shown(v)));
    lines.extend(sourced_lines("packages", &node.packages, |p| p.version.to_string()));
    lines.extend(sourced_lines("kernelParameters", &node.kernel_parameters, |v| shown(v)));
    lines.extend(sourced_lines("interfaces", &node.interfaces, |i| shown(&i.to_string())));
    lines.extend(sourced_lines("storage", &node.storage, ToString::to_string));
    lines.extend(node.addresses.iter().map(|(network, ip)| (format!("addressing.{network} = {ip}"), own)));

    let width =
        lines.iter().filter(|(_, origin)| origin.is_some()).map(|(text, _)| text.chars().count()).max().unwrap_or(0);
    let mut out = String::new();
    for (text, origin) in lines {
        match origin {
            Some(origin) => {
                let _ = writeln!(out, "{text:<width$}    (from {origin})");
            }
            None => {
                let _ = writeln!(out, "{text}");
            }
        }
    }
    out
}

/// The line of a scalar: its value, `(cleared)` or `(unset)`.
fn setting_line<'a, T>(
    field: &str,
    setting: &'a Setting<T>,
    show: impl Fn(&T) -> &str,
) -> (String, Option<&'a Origin>) {
    let value = match setting {
        Setting::Set(s) => show(&s.value).to_string(),
        Setting::Cleared(_) => "(cleared)".to_string(),
        Setting::Unset => "(unset)".to_string(),
    };
    (format!("{field} = {value}"), setting.origin())
}

/// The lines of a merged list or map, one per entry.
fn sourced_lines<'a, T>(
    field: &str,
    entries: &'a BTreeMap<String, Sourced<T>>,
    show: impl Fn(&T) -> String,
) -> Vec<(String, Option<&'a Origin>)> {
    entries.iter().map(|(key, s)| (format!("{field}.{key} = {}", show(&s.value)), Some(&s.origin))).collect()
}

/// A value as shown: the empty string quoted, so that it is visible.
fn shown(value: &str) -> String {
    if value.is_empty() { "\"\"".to_string() } else { value.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::design::document::parse_documents;
    use crate::design::fixtures;

    /// A four-level chain over a hardware profile: hw < a < b < c < d < node.
    const CHAIN: &str = r#"
kind: Site
name: s1
networks: [{ name: prov, cidr: 10.1.0.0/24 }]
---
kind: HardwareProfile
name: hw
labels: { hw: r640, vendor: dell }
interfaces: [{ name: eno1, mtu: 1500 }, { name: eno2 }]
storage: [{ name: root, device: /dev/sda }]
kernelParameters: { intel_iommu: "on" }
---
kind: HostProfile
name: a
hardwareProfile: hw
role: worker
packages: [{ name: ubuntu, version: "22.04" }, { name: kubelet, version: 1.29.1 }]
kernelParameters: { isolcpus: 2-7, nosmt: ~ }
---
kind: HostProfile
name: b
parent: a
role: master
interfaces: ['!eno2', { name: eno1, network: prov, mtu: 9000 }]
kernelParameters: { '!isolcpus': ~ }
---
kind: HostProfile
name: c
parent: b
labels: { '!vendor': ~, tier: gold }
packages: [{ name: kubelet, version: 1.30.0 }]
---
kind: HostProfile
name: d
parent: c
storage: ['!root', { name: data, device: /dev/sdb, sizeGb: 960 }]
"#;

    fn node_on(profile: &str) -> String {
        format!(
            "---\nkind: Node\nname: n1\nhostProfile: {profile}\nbootMac: 52:54:00:00:00:01\n\
             bmc: {{ address: redfish://10.0.0.1/redfish/v1/Systems/1 }}\nrack: r7\n\
             labels: {{ tier: silver }}\naddressing: [{{ network: prov, ip: 10.1.0.11 }}]\n"
        )
    }

    fn resolve_text(text: &str) -> Result<ResolvedSite, Vec<DesignError>> {
        resolve(&parse_documents(text, "t.yaml").unwrap())
    }

    fn n1(text: &str) -> EffectiveNode {
        let site = resolve_text(text).unwrap();
        site.node("n1").unwrap().clone()
    }

    fn from(kind: Kind, name: &str, index: usize) -> Origin {
        Origin { kind, name: name.to_string(), source: "t.yaml".to_string(), index }
    }

    fn host(name: &str, index: usize) -> Origin {
        from(Kind::HostProfile, name, index)
    }

    #[test]
    fn a_deep_chain_applies_bottom_up_and_tracks_origins() {
        let node = n1(&format!("{CHAIN}{}", node_on("d")));
        let names: Vec<String> = node.chain.iter().map(ToString::to_string).collect();
        assert_eq!(
            names,
            ["HardwareProfile/hw", "HostProfile/a", "HostProfile/b", "HostProfile/c", "HostProfile/d", "Node/n1"]
        );

        // a scalar in the child overrides
        assert_eq!(node.role, Setting::Set(Sourced::new(Role::Master, host("b", 4))));
        assert_eq!(node.hardware_profile, Setting::Set(Sourced::new("hw".to_string(), host("a", 3))));
        // a list entry of the same name replaces the inherited one; '!name' removes one
        assert_eq!(node.packages["kubelet"].value.version.as_str(), "1.30.0");
        assert_eq!(node.packages["kubelet"].origin, host("c", 5));
        assert_eq!(node.packages["ubuntu"].origin, host("a", 3));
        assert_eq!(node.interfaces.keys().collect::<Vec<_>>(), ["eno1"]);
        assert_eq!(node.interfaces["eno1"].value.mtu, Some(9000));
        assert_eq!(node.interfaces["eno1"].origin, host("b", 4));
        assert_eq!(node.storage.keys().collect::<Vec<_>>(), ["data"]);
        // maps merge by key; '!key' removes one
        let kernel: Vec<(&str, &str, String)> =
            node.kernel_parameters.iter().map(|(k, v)| (k.as_str(), v.value.as_str(), v.origin.to_string())).collect();
        assert_eq!(kernel, [("intel_iommu", "on", "HardwareProfile/hw".into()), ("nosmt", "", "HostProfile/a".into())]);
        let labels: Vec<(&str, &str, String)> =
            node.labels.iter().map(|(k, v)| (k.as_str(), v.value.as_str(), v.origin.to_string())).collect();
        assert_eq!(
            labels,
            [
                ("hw", "r640", "HardwareProfile/hw".into()),
                ("rack", "r7", "Node/n1".into()),
                ("tier", "silver", "Node/n1".into()),
            ]
        );
        assert_eq!(node.boot_mac.as_str(), "52:54:00:00:00:01");
        assert_eq!(node.addresses["prov"], "10.1.0.11".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn bang_clears_a_scalar_and_the_clearing_document_is_named() {
        let text = format!(
            "{CHAIN}---\nkind: HostProfile\nname: e\nparent: d\nrole: '!'\nhardwareProfile: '!'\n{}",
            node_on("e")
        );
        let node = n1(&text);
        assert_eq!(node.role, Setting::Cleared(host("e", 7)));
        assert_eq!(node.role(), None);
        // without a hardware profile, nothing of it is inherited
        assert_eq!(node.hardware_profile, Setting::Cleared(host("e", 7)));
        assert_eq!(node.chain[0], host("a", 3));
        assert!(!node.kernel_parameters.contains_key("intel_iommu"));
        assert_eq!(node.label("hw"), None);
    }

    #[test]
    fn a_child_can_name_another_hardware_profile() {
        let text = format!(
            "{CHAIN}---\nkind: HardwareProfile\nname: hw2\nlabels: {{ hw: r740 }}\n\
             ---\nkind: HostProfile\nname: e\nparent: d\nhardwareProfile: hw2\n{}",
            node_on("e")
        );
        let node = n1(&text);
        assert_eq!(node.hardware_profile.value().map(String::as_str), Some("hw2"));
        assert_eq!(node.labels["hw"].value, "r740");
        assert_eq!(node.labels["hw"].origin, from(Kind::HardwareProfile, "hw2", 7));
        // the eno1 of hw is gone with it, b's eno1 stays
        assert_eq!(node.interfaces["eno1"].origin, host("b", 4));
    }

    #[test]
    fn cycles_are_reported_once_with_their_path() {
        let text = "kind: Site\nname: s1\n\
                    ---\nkind: HostProfile\nname: x\nparent: y\n\
                    ---\nkind: HostProfile\nname: y\nparent: x\n\
                    ---\nkind: HostProfile\nname: m\nparent: k\n\
                    ---\nkind: HostProfile\nname: z\nparent: m\n\
                    ---\nkind: HostProfile\nname: k\nparent: z\n\
                    ---\nkind: HostProfile\nname: tail\nparent: k\n\
                    ---\nkind: HostProfile\nname: self\nparent: self\n";
        let errors = resolve_text(text).unwrap_err();
        let got: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(
            got,
            [
                "HostProfile/k (t.yaml #6): parent: inheritance cycle: k -> z -> m -> k",
                "HostProfile/self (t.yaml #8): parent: inheritance cycle: self -> self",
                "HostProfile/x (t.yaml #2): parent: inheritance cycle: x -> y -> x",
            ]
        );
    }

    #[test]
    fn a_node_on_a_cycle_still_resolves_what_it_can() {
        let text = format!(
            "{CHAIN}---\nkind: HostProfile\nname: e\nparent: f\n---\nkind: HostProfile\nname: f\nparent: e\n{}",
            node_on("e")
        );
        let docs = parse_documents(&text, "t.yaml").unwrap();
        let resolution = resolve_all(&entries(&docs));
        assert_eq!(resolution.errors.into_vec().len(), 1);
        let node = resolution.nodes.values().next().unwrap();
        assert_eq!(node.chain, [host("f", 8), host("e", 7), from(Kind::Node, "n1", 9)]);
    }

    #[test]
    fn unknown_references_are_reported_where_they_are_written() {
        let text = "kind: Site\nname: s1\n\
                    ---\nkind: HostProfile\nname: a\nparent: nope\nhardwareProfile: r999\n\
                    ---\nkind: Node\nname: n1\nhostProfile: missing\nbootMac: 52:54:00:00:00:01\nbmc: { address: ipmi://h }\n";
        let got: Vec<String> = resolve_text(text).unwrap_err().iter().map(ToString::to_string).collect();
        assert_eq!(
            got,
            [
                "HostProfile/a (t.yaml #2): parent: no HostProfile named \"nope\"",
                "HostProfile/a (t.yaml #2): hardwareProfile: no HardwareProfile named \"r999\"",
                "Node/n1 (t.yaml #3): hostProfile: no HostProfile named \"missing\"",
            ]
        );
    }

    #[test]
    fn malformed_node_fields_are_all_reported() {
        let text = "kind: Site\nname: s1\n---\nkind: HostProfile\nname: a\n\
                    ---\nkind: Node\nname: Node_1\nhostProfile: a\nbootMac: 52:54:00:00:01\nbmc: { address: telnet://h }\n\
                    addressing: [{ network: p, ip: 10.1.0.x }, { network: q, ip: 10.1.0.1 }, { network: q, ip: 10.1.0.2 }]\n";
        let got: Vec<(String, String)> = resolve_text(text)
            .unwrap_err()
            .into_iter()
            .map(|e| (e.field, e.reason.chars().take(30).collect()))
            .collect();
        let want = [
            ("name", "\"Node_1\" must be lowercase let"),
            ("bootMac", "\"52:54:00:00:01\" is not a MAC "),
            ("bmc.address", "scheme \"telnet\" is not one Met"),
            ("addressing[p].ip", "\"10.1.0.x\" is not an IP addres"),
            ("addressing[q]", "a node has one address per net"),
        ];
        assert_eq!(got, want.map(|(f, r)| (f.to_string(), r.to_string())));
    }

    #[test]
    fn a_design_holds_one_site_and_unique_names() {
        let bad_id = resolve_text("kind: Site\nname: Edge.01\n").unwrap_err();
        assert_eq!(bad_id.len(), 1);
        assert_eq!((bad_id[0].document.as_str(), bad_id[0].field.as_str()), ("Site/Edge.01 (t.yaml #1)", "name"));
        let none = resolve_text("kind: HostProfile\nname: a\n").unwrap_err();
        assert_eq!(none[0].to_string(), "(design): kind: no Site document: a design describes one site");
        let text = "kind: Site\nname: s1\n---\nkind: Site\nname: s2\n---\nkind: HostProfile\nname: a\n---\nkind: HostProfile\nname: a\n";
        let got: Vec<String> = resolve_text(text).unwrap_err().iter().map(ToString::to_string).collect();
        assert_eq!(
            got,
            [
                "Site/s2 (t.yaml #2): kind: a design describes one site, and Site/s1 (t.yaml #1) is already defined",
                "HostProfile/a (t.yaml #4): name: HostProfile/a is already defined by HostProfile/a (t.yaml #3)",
            ]
        );
    }

    #[test]
    fn render_lists_every_value_with_its_origin() {
        let text = "kind: Site\nname: s1\n\
                    ---\nkind: HardwareProfile\nname: hw\nlabels: { hw: r640 }\nstorage: [{ name: root, device: /dev/sda, sizeGb: 480 }]\n\
                    ---\nkind: HostProfile\nname: base\nhardwareProfile: hw\nrole: worker\npackages: [{ name: kubelet, version: 1.29.1 }]\n\
                    ---\nkind: HostProfile\nname: control\nparent: base\nrole: master\nkernelParameters: { isolcpus: 2-7, nosmt: ~ }\n\
                    interfaces: [{ name: eno1, network: prov, mtu: 9000 }]\n\
                    ---\nkind: Node\nname: node-1\nhostProfile: control\nbootMac: 52:54:00:00:01:01\n\
                    bmc: { address: ipmi://10.0.0.11, credentialsRef: bmc-1 }\nrack: r1\naddressing: [{ network: prov, ip: 10.1.0.11 }]\n";
        let site = resolve_text(text).unwrap();
        let expected = "\
name = node-1                                (from Node/node-1)
chain = HardwareProfile/hw < HostProfile/base < HostProfile/control < Node/node-1
hostProfile = control                        (from Node/node-1)
hardwareProfile = hw                         (from HostProfile/base)
role = master                                (from HostProfile/control)
bootMac = 52:54:00:00:01:01                  (from Node/node-1)
bmc.address = ipmi://10.0.0.11               (from Node/node-1)
bmc.credentialsRef = bmc-1                   (from Node/node-1)
rack = r1                                    (from Node/node-1)
labels.hw = r640                             (from HardwareProfile/hw)
labels.rack = r1                             (from Node/node-1)
packages.kubelet = 1.29.1                    (from HostProfile/base)
kernelParameters.isolcpus = 2-7              (from HostProfile/control)
kernelParameters.nosmt = \"\"                  (from HostProfile/control)
interfaces.eno1 = network=prov mtu=9000      (from HostProfile/control)
storage.root = device=/dev/sda sizeGb=480    (from HardwareProfile/hw)
addressing.prov = 10.1.0.11                  (from Node/node-1)
";
        assert_eq!(render_effective(site.node("node-1").unwrap()), expected);
    }

    #[test]
    fn render_shows_unset_and_cleared_scalars() {
        let text = "kind: Site\nname: s1\n---\nkind: HostProfile\nname: a\nrole: '!'\n\
                    ---\nkind: Node\nname: n1\nhostProfile: a\nbootMac: 52:54:00:00:00:01\nbmc: { address: ipmi://h }\n";
        let out = render_effective(resolve_text(text).unwrap().node("n1").unwrap());
        assert!(out.contains("\nhardwareProfile = (unset)\n"), "{out}");
        let role = out.lines().find(|l| l.starts_with("role = ")).unwrap();
        assert!(role.starts_with("role = (cleared)  ") && role.ends_with("  (from HostProfile/a)"), "{out}");
    }

    #[test]
    fn resolving_twice_gives_the_same_site() {
        let text = fixtures::design(
            &fixtures::site("{ count: 1 }", "{ count: 1 }"),
            &[(1, "control", "r1"), (2, "worker", "r2")],
        );
        let docs = fixtures::documents(&text);
        assert_eq!(resolve(&docs).unwrap(), resolve(&docs).unwrap());
        assert_eq!(resolve(&docs).unwrap(), resolve(&fixtures::documents(&text)).unwrap());
    }
}
