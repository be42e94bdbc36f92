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
    Body, Cleaning, Document, Entry, HardwareProfile, HostProfile, Interface, Kind, Network, Node, Origin,
    PackageEntry, Parsed, Site, Storage, entries,
};
use super::error::{DesignError, Errors};
use super::inherit::{ListPatch, MapPatch, ScalarPatch, Setting, Sourced};
use crate::domain::{BmcAddress, InvalidField, MacAddress, NodeName, PackageRef, Role, SiteId};
use crate::window::WindowSpec;

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
    /// The values each helm-chart package is given, by package name: every layer that gave
    /// some, bottom first (host profiles, then the Site document).
    pub values: BTreeMap<String, Vec<Sourced<serde_json::Value>>>,
    /// Kernel parameters, by key; an empty value is a parameter without value.
    pub kernel_parameters: BTreeMap<String, Sourced<String>>,
    /// Network interfaces, by name.
    pub interfaces: BTreeMap<String, Sourced<Interface>>,
    /// Disks and filesystems, by name.
    pub storage: BTreeMap<String, Sourced<Storage>>,
    /// How Metal3 cleans the disks when the OS comes off.
    pub cleaning: Setting<Cleaning>,
    /// When changes may start at the site, as written: the Site document's when it gives any,
    /// else those of the leaf-most host profile that gives a list. `None`: no layer does.
    pub maintenance_windows: Option<Sourced<Vec<WindowSpec>>>,
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

    /// The values of package `name`, its layers merged as Helm merges values files (see
    /// [`crate::chart::merge_values`]); `None` when no layer gives any.
    pub fn values_of(&self, name: &str) -> Option<serde_json::Value> {
        let layers = self.values.get(name).filter(|l| !l.is_empty())?;
        Some(layers.iter().fold(serde_json::Value::Object(Default::default()), |below, layer| {
            crate::chart::merge_values(&below, &layer.value)
        }))
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
        // The Site document's values go over the profiles' for every package the node runs, and
        // its maintenance windows, when it gives any, over theirs.
        if let Some((site, site_origin)) = &self.site {
            if !site.maintenance_windows.is_empty() {
                merged.maintenance_windows = Some(Sourced::new(site.maintenance_windows.clone(), site_origin.clone()));
            }
            for (package, values) in &site.values {
                if merged.packages.contains_key(package) {
                    merged
                        .values
                        .entry(package.clone())
                        .or_default()
                        .push(Sourced::new(values.clone(), site_origin.clone()));
                }
            }
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
            values: merged.values,
            kernel_parameters: merged.kernel_parameters,
            interfaces: merged.interfaces,
            storage: merged.storage,
            cleaning: merged.cleaning,
            maintenance_windows: merged.maintenance_windows,
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
    packages: Option<&'a ListPatch<PackageEntry>>,
    kernel_parameters: Option<&'a MapPatch>,
    interfaces: Option<&'a ListPatch<Interface>>,
    storage: Option<&'a ListPatch<Storage>>,
    cleaning: Option<&'a ScalarPatch<Cleaning>>,
    maintenance_windows: Option<&'a Vec<WindowSpec>>,
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
            cleaning: None,
            maintenance_windows: None,
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
            cleaning: host.cleaning.as_ref(),
            maintenance_windows: host.maintenance_windows.as_ref(),
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
            cleaning: None,
            maintenance_windows: None,
        }
    }
}

/// The inheritable fields, as merged so far.
#[derive(Default)]
struct Merged {
    role: Setting<Role>,
    labels: BTreeMap<String, Sourced<String>>,
    packages: BTreeMap<String, Sourced<PackageRef>>,
    values: BTreeMap<String, Vec<Sourced<serde_json::Value>>>,
    kernel_parameters: BTreeMap<String, Sourced<String>>,
    interfaces: BTreeMap<String, Sourced<Interface>>,
    storage: BTreeMap<String, Sourced<Storage>>,
    cleaning: Setting<Cleaning>,
    maintenance_windows: Option<Sourced<Vec<WindowSpec>>>,
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
            // A package removed takes its values with it; one named again keeps the values
            // given below it, and this layer's go over them.
            for name in &patch.remove {
                self.packages.remove(name);
                self.values.remove(name);
            }
            for entry in &patch.set {
                let name = entry.name.to_string();
                self.packages.insert(name.clone(), Sourced::new(entry.package_ref(), origin.clone()));
                if let Some(values) = &entry.values {
                    self.values.entry(name).or_default().push(Sourced::new(values.clone(), origin.clone()));
                }
            }
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
        if let Some(patch) = layer.cleaning {
            patch.apply(&mut self.cleaning, origin);
        }
        // A list replaces the one inherited whole.
        if let Some(windows) = layer.maintenance_windows {
            self.maintenance_windows = Some(Sourced::new(windows.clone(), origin.clone()));
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
    render(node, None)
}

/// [`render_effective`], with each maintenance window's next opening after `now_ms` (in UTC and
/// in the window's zone) and whether it is open then.
pub fn render_effective_at(node: &EffectiveNode, now_ms: i64) -> String {
    render(node, Some(now_ms))
}

fn render(node: &EffectiveNode, now_ms: Option<i64>) -> String {
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
    if node.cleaning != Setting::Unset {
        lines.push(setting_line("cleaning", &node.cleaning, |c| c.as_str()));
    }
    lines.extend(node.bmc_credentials_ref.as_ref().map(|c| (format!("bmc.credentialsRef = {c}"), own)));
    lines.extend(node.rack.as_ref().map(|r| (format!("rack = {r}"), own)));
    lines.extend(sourced_lines("labels", &node.labels, |v| shown(v)));
    lines.extend(sourced_lines("packages", &node.packages, |p| p.version.to_string()));
    for (package, layers) in &node.values {
        lines.extend(value_lines(package, layers));
    }
    lines.extend(sourced_lines("kernelParameters", &node.kernel_parameters, |v| shown(v)));
    lines.extend(sourced_lines("interfaces", &node.interfaces, |i| shown(&i.to_string())));
    lines.extend(sourced_lines("storage", &node.storage, ToString::to_string));
    lines.extend(node.addresses.iter().map(|(network, ip)| (format!("addressing.{network} = {ip}"), own)));
    lines.extend(super::windows::lines(node, now_ms));

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

/// A chart's values as the node's layers leave them, one leaf per line
/// (`values.cni.ipam.blockSize = 26`), each with the layer that set it last.
fn value_lines<'a>(package: &str, layers: &'a [Sourced<serde_json::Value>]) -> Vec<(String, Option<&'a Origin>)> {
    let mut leaves: BTreeMap<String, (serde_json::Value, &'a Origin)> = BTreeMap::new();
    for layer in layers {
        let mut set = Vec::new();
        flatten(&layer.value, "", &mut set);
        for (path, value) in set {
            // What is set or removed here replaces whatever lay above or below the path.
            let under = format!("{path}.");
            leaves.retain(|k, _| k != &path && !k.starts_with(&under) && !path.starts_with(&format!("{k}.")));
            if let Some(value) = value {
                leaves.insert(path, (value, &layer.origin));
            }
        }
    }
    leaves
        .into_iter()
        .map(|(path, (value, origin))| (format!("values.{package}.{path} = {value}"), Some(origin)))
        .collect()
}

/// The leaves of one layer of values: `(path, Some(value))` set, `(path, None)` removed (`'!key'`
/// or `~`).
fn flatten(value: &serde_json::Value, at: &str, out: &mut Vec<(String, Option<serde_json::Value>)>) {
    let Some(map) = value.as_object() else { return };
    for (key, v) in map {
        let (key, removed) = match key.strip_prefix('!') {
            Some(k) => (k, true),
            None => (key.as_str(), v.is_null()),
        };
        let path = if at.is_empty() { key.to_string() } else { format!("{at}.{key}") };
        match (removed, v) {
            (true, _) => out.push((path, None)),
            (false, serde_json::Value::Object(inner)) if !inner.is_empty() => flatten(v, &path, out),
            (false, v) => out.push((path, Some(v.clone()))),
        }
    }
}

/// A value as shown: the empty string quoted, so that it is visible.
fn shown(value: &str) -> String {
    if value.is_empty() { "\"\"".to_string() } else { value.to_string() }
}

#[cfg(test)]
mod tests;
