//! The design documents as written: multi-document YAML, one `kind` per document.
//!
//! Four kinds: [`Site`], [`HardwareProfile`], [`HostProfile`] and [`Node`]. Every document has
//! `kind:` and `name:`; fields are camelCase and unknown fields are refused. What a profile
//! writes is a patch on what it inherits (see [`super::inherit`]).
//!
//! Parsing checks shape only: YAML syntax, kinds, known fields, types, and values whose format
//! stands alone (package references, roles, networks). The site id, node names, MAC and BMC
//! addresses and IP addresses are kept as written and checked by [`super::resolve()`], so that
//! one report lists every problem of a design.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use serde::Deserialize;
use serde::de::IgnoredAny;

use super::error::{DesignError, Errors};
use super::inherit::{ListPatch, MapPatch, Named, ScalarPatch, text_map};
use super::net::Cidr;
pub use super::origin::{Kind, Origin};
use crate::domain::{PackageRef, Role};
use crate::window::WindowSpec;
use crate::yaml;

/// One parsed document, with where it was read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Document {
    /// Where the document was read from, e.g. a file name.
    pub source: String,
    /// The document's position in its source, from 1 (empty documents count).
    pub index: usize,
    /// The document itself.
    pub body: Body,
}

impl Document {
    /// The document's kind.
    pub fn kind(&self) -> Kind {
        match &self.body {
            Body::Site(_) => Kind::Site,
            Body::HardwareProfile(_) => Kind::HardwareProfile,
            Body::HostProfile(_) => Kind::HostProfile,
            Body::Node(_) => Kind::Node,
        }
    }

    /// The document's name.
    pub fn name(&self) -> &str {
        match &self.body {
            Body::Site(d) => &d.name,
            Body::HardwareProfile(d) => &d.name,
            Body::HostProfile(d) => &d.name,
            Body::Node(d) => &d.name,
        }
    }

    /// Which document this is, for origins and errors.
    pub fn origin(&self) -> Origin {
        Origin { kind: self.kind(), name: self.name().to_string(), source: self.source.clone(), index: self.index }
    }
}

/// A document's content, by kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// `kind: Site`.
    Site(Site),
    /// `kind: HardwareProfile`.
    HardwareProfile(HardwareProfile),
    /// `kind: HostProfile`.
    HostProfile(HostProfile),
    /// `kind: Node`.
    Node(Node),
}

/// `kind: Site`: the site, its networks and how its cluster is formed.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Site {
    #[serde(rename = "kind")]
    _kind: Kind,
    /// The site id, as written; checked as a [`crate::domain::SiteId`].
    pub name: String,
    /// The region the site is in, e.g. `eu-west`.
    #[serde(default)]
    pub region: Option<String>,
    /// The site's labels.
    #[serde(default, deserialize_with = "text_map")]
    pub labels: BTreeMap<String, String>,
    /// The site's networks, which interfaces and addresses refer to by name.
    #[serde(default)]
    pub networks: Vec<Network>,
    /// How the site's cluster is formed from its nodes.
    #[serde(default)]
    pub cluster: Option<ClusterSpec>,
    /// The values the site gives each helm-chart package it runs, by package name.
    #[serde(default)]
    pub values: std::collections::BTreeMap<String, serde_json::Value>,
    /// When changes may start at the site; when it gives none, the host profiles of the
    /// cluster's nodes decide.
    #[serde(default)]
    pub maintenance_windows: Vec<WindowSpec>,
}

/// A network of the site.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Network {
    /// The name interfaces and addresses refer to.
    pub name: String,
    /// The network's address range.
    pub cidr: Cidr,
    /// The router on this network that a node's default route goes through. A node may be on
    /// one network with a gateway at most.
    #[serde(default)]
    pub gateway: Option<IpAddr>,
    /// Other networks reached through a router on this one.
    #[serde(default)]
    pub routes: Vec<Route>,
    /// Name servers and search domains for the nodes on this network.
    #[serde(default)]
    pub dns: Option<Dns>,
}

/// A route: the network `to`, reached through the router `via`, which is on the network the
/// route belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Route {
    pub to: Cidr,
    pub via: IpAddr,
}

/// Name resolution for the nodes of a network.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Dns {
    #[serde(default)]
    pub nameservers: Vec<IpAddr>,
    /// Search domains, e.g. `edge.example.com`.
    #[serde(default)]
    pub search: Vec<String>,
}

/// How the cluster is formed: which nodes serve as masters and workers.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterSpec {
    /// What builds the cluster: the BPA (the default) or Cluster API.
    #[serde(default)]
    pub builder: crate::cluster::Builder,
    /// Cluster API: the control plane's endpoint, an address on the API network no host holds.
    #[serde(default)]
    pub endpoint: Option<crate::cluster::ApiEndpoint>,
    /// The network the Kubernetes API is served on, and the jump host reaches nodes by.
    pub api_network: String,
    /// The control-plane node set.
    pub masters: NodeSetSpec,
    /// The worker node set.
    #[serde(default)]
    pub workers: NodeSetSpec,
}

impl ClusterSpec {
    /// How the cluster is built, with `spare(role)` spare hosts for each node set (its standby
    /// nodes, as written or as chosen).
    pub fn build(&self, spare: impl Fn(Role) -> u32) -> crate::cluster::ClusterBuild {
        let rollout = |role: Role| {
            let set = self.node_set(role);
            crate::cluster::NodeSetRollout {
                max_surge: set.max_surge,
                max_unavailable: set.max_unavailable,
                spare: spare(role),
            }
        };
        crate::cluster::ClusterBuild {
            builder: self.builder,
            endpoint: self.endpoint,
            masters: rollout(Role::Master),
            workers: rollout(Role::Worker),
        }
    }

    /// The spec of the node set for `role`.
    pub fn node_set(&self, role: Role) -> &NodeSetSpec {
        match role {
            Role::Master => &self.masters,
            Role::Worker => &self.workers,
        }
    }
}

/// A node set: how many nodes of a role, which nodes qualify, and how they spread.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeSetSpec {
    /// How many nodes are active.
    pub count: u32,
    /// How many more nodes are held in standby.
    #[serde(default)]
    pub standby: u32,
    /// Labels a node must have (all of them, with these values) to qualify.
    #[serde(default, deserialize_with = "text_map")]
    pub selector: BTreeMap<String, String>,
    /// A label, e.g. `rack`: at most one chosen node per value of it. Empty: no constraint.
    #[serde(default)]
    pub topology_key: String,
    /// Cluster API: machines made beyond `count` while the set rolls, each on a spare host.
    #[serde(default)]
    pub max_surge: Option<u32>,
    /// Cluster API (workers): machines of the set taken away at once while it rolls.
    #[serde(default)]
    pub max_unavailable: Option<u32>,
}

impl NodeSetSpec {
    /// The topology key, if one is set.
    pub fn topology_key(&self) -> Option<&str> {
        Some(self.topology_key.as_str()).filter(|k| !k.is_empty())
    }
}

/// `kind: HardwareProfile`: what a model of machine brings. The bottom of every chain.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HardwareProfile {
    #[serde(rename = "kind")]
    _kind: Kind,
    /// The profile's name.
    pub name: String,
    /// Labels every node of this hardware gets, e.g. `hw: r640`.
    #[serde(default)]
    pub labels: MapPatch,
    /// Network interfaces.
    #[serde(default)]
    pub interfaces: ListPatch<Interface>,
    /// Disks and filesystems.
    #[serde(default)]
    pub storage: ListPatch<Storage>,
    /// Kernel parameters the hardware needs.
    #[serde(default)]
    pub kernel_parameters: MapPatch,
}

/// `kind: HostProfile`: one layer of host configuration over its parent.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HostProfile {
    #[serde(rename = "kind")]
    _kind: Kind,
    /// The profile's name.
    pub name: String,
    /// The HostProfile this one inherits from; none for a root profile.
    #[serde(default)]
    pub parent: Option<String>,
    /// The HardwareProfile at the bottom of the chain.
    #[serde(default)]
    pub hardware_profile: Option<ScalarPatch<String>>,
    /// The node's role.
    #[serde(default)]
    pub role: Option<ScalarPatch<Role>>,
    /// Node labels.
    #[serde(default)]
    pub labels: MapPatch,
    /// Packages, merged by name.
    #[serde(default)]
    pub packages: ListPatch<PackageEntry>,
    /// Kernel parameters, merged by key.
    #[serde(default)]
    pub kernel_parameters: MapPatch,
    /// Network interfaces, merged by name.
    #[serde(default)]
    pub interfaces: ListPatch<Interface>,
    /// Disks and filesystems, merged by name.
    #[serde(default)]
    pub storage: ListPatch<Storage>,
    /// How Metal3 cleans the disks when the OS comes off.
    #[serde(default)]
    pub cleaning: Option<ScalarPatch<Cleaning>>,
    /// When changes may start at the site, replacing the parent's list whole (`[]`: at any
    /// time); absent: inherited.
    #[serde(default)]
    pub maintenance_windows: Option<Vec<WindowSpec>>,
}

/// Metal3's `automatedCleaningMode`, as a design writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Cleaning {
    /// Partition tables and filesystem signatures are wiped (Metal3's default).
    Metadata,
    /// The disks are left as they are.
    Disabled,
}

impl Cleaning {
    pub fn as_str(self) -> &'static str {
        match self {
            Cleaning::Metadata => "metadata",
            Cleaning::Disabled => "disabled",
        }
    }
}

impl From<Cleaning> for crate::pb::CleaningMode {
    fn from(c: Cleaning) -> Self {
        match c {
            Cleaning::Metadata => crate::pb::CleaningMode::Metadata,
            Cleaning::Disabled => crate::pb::CleaningMode::Disabled,
        }
    }
}

/// `kind: Node`: one machine, the top of its chain.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Node {
    #[serde(rename = "kind")]
    _kind: Kind,
    /// The hostname; checked as a [`crate::domain::NodeName`].
    pub name: String,
    /// The leaf HostProfile of the node's chain.
    pub host_profile: String,
    /// The MAC address the node boots from, as written.
    pub boot_mac: String,
    /// How the node's BMC is reached.
    pub bmc: Bmc,
    /// The rack the node is in; also the node's `rack` label.
    #[serde(default)]
    pub rack: Option<String>,
    /// Node labels, over the profiles' labels.
    #[serde(default)]
    pub labels: MapPatch,
    /// The node's address on each network, one per network.
    #[serde(default)]
    pub addressing: Vec<Address>,
}

/// A node's BMC.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Bmc {
    /// `scheme://host[:port][/path]`, as written; checked as a [`crate::domain::BmcAddress`].
    pub address: String,
    /// The name of the secret holding the BMC credentials.
    #[serde(default)]
    pub credentials_ref: Option<String>,
}

/// A node's address on one network.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Address {
    /// The network's name.
    pub network: String,
    /// The address, as written.
    pub ip: String,
}

/// A network interface, merged by name: a physical port, a bond of ports, or a VLAN on
/// another interface.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Interface {
    /// The interface name, e.g. `eno1`, `bond0`, `bond0.100`.
    pub name: String,
    /// The site network it is attached to.
    #[serde(default)]
    pub network: Option<String>,
    /// Its MTU.
    #[serde(default)]
    pub mtu: Option<u32>,
    /// A bond of these ports.
    #[serde(default)]
    pub bond: Option<Bond>,
    /// A VLAN on another interface.
    #[serde(default)]
    pub vlan: Option<Vlan>,
}

/// A bond: the ports it joins (interfaces of the node, each in one bond at most) and how.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Bond {
    pub members: Vec<String>,
    #[serde(default)]
    pub mode: BondMode,
}

/// The Linux bonding modes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum BondMode {
    #[default]
    #[serde(rename = "active-backup")]
    ActiveBackup,
    #[serde(rename = "balance-rr")]
    BalanceRr,
    #[serde(rename = "balance-xor")]
    BalanceXor,
    #[serde(rename = "broadcast")]
    Broadcast,
    /// LACP.
    #[serde(rename = "802.3ad")]
    Lacp,
    #[serde(rename = "balance-tlb")]
    BalanceTlb,
    #[serde(rename = "balance-alb")]
    BalanceAlb,
}

impl BondMode {
    /// The mode as the kernel (and the design) names it.
    pub fn as_str(self) -> &'static str {
        match self {
            BondMode::ActiveBackup => "active-backup",
            BondMode::BalanceRr => "balance-rr",
            BondMode::BalanceXor => "balance-xor",
            BondMode::Broadcast => "broadcast",
            BondMode::Lacp => "802.3ad",
            BondMode::BalanceTlb => "balance-tlb",
            BondMode::BalanceAlb => "balance-alb",
        }
    }
}

/// A VLAN: tagged frames with `id` (1 to 4094) on the interface `parent`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Vlan {
    pub id: u16,
    pub parent: String,
}

/// A package a host profile names: which version, and for a helm chart the values this layer
/// gives it (merged over what the profiles below gave, key by key; `'!key'` removes one).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackageEntry {
    pub name: crate::domain::PackageName,
    pub version: crate::domain::Version,
    /// A helm chart's values, a mapping.
    #[serde(default)]
    pub values: Option<serde_json::Value>,
}

impl PackageEntry {
    /// The package it names.
    pub fn package_ref(&self) -> PackageRef {
        PackageRef { name: self.name.clone(), version: self.version.clone() }
    }
}

impl Named for PackageEntry {
    fn name(&self) -> &str {
        self.name.as_str()
    }
}

impl Named for Interface {
    fn name(&self) -> &str {
        &self.name
    }
}

impl fmt::Display for Interface {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(network) = &self.network {
            parts.push(format!("network={network}"));
        }
        if let Some(mtu) = self.mtu {
            parts.push(format!("mtu={mtu}"));
        }
        if let Some(bond) = &self.bond {
            parts.push(format!("bond={} mode={}", bond.members.join("+"), bond.mode.as_str()));
        }
        if let Some(vlan) = &self.vlan {
            parts.push(format!("vlan={} parent={}", vlan.id, vlan.parent));
        }
        f.write_str(&parts.join(" "))
    }
}

/// A disk or filesystem, merged by name.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Storage {
    /// The entry's name, e.g. `root`.
    pub name: String,
    /// The device, e.g. `/dev/sda`.
    pub device: String,
    /// Its size in GB.
    #[serde(default)]
    pub size_gb: Option<u64>,
    /// Where it is mounted.
    #[serde(default)]
    pub mount: Option<String>,
}

impl Named for Storage {
    fn name(&self) -> &str {
        &self.name
    }
}

impl fmt::Display for Storage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "device={}", self.device)?;
        if let Some(size) = self.size_gb {
            write!(f, " sizeGb={size}")?;
        }
        if let Some(mount) = &self.mount {
            write!(f, " mount={mount}")?;
        }
        Ok(())
    }
}

/// Parses the `---`-separated documents of `text`, read from `source` (e.g. a file name).
///
/// Empty documents are skipped but counted, so `#n` in errors is the n-th document of the
/// source. Returns every document, or an error for each document that does not parse (a YAML
/// syntax error ends the source: nothing after it can be read). To go on with the documents
/// that do parse, read the sources into [`Parsed`] instead.
pub fn parse_documents(text: &str, source: &str) -> Result<Vec<Document>, Vec<DesignError>> {
    let mut parsed = Parsed::default();
    parsed.read(text, source);
    parsed.into_documents()
}

/// The documents of a design's sources, as far as they can be read.
///
/// A document that does not parse is refused with its error, but when its head names a known
/// kind and a name, it is still known by them ([`Parsed::unreadable`]): checking the rest
/// then does not report what refers to it as unknown, nor what it would have set as missing,
/// so that one report lists the errors of every document at once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parsed {
    documents: Vec<Document>,
    /// Each unreadable document, with how many documents were read before it.
    unreadable: Vec<(usize, Origin)>,
    errors: Vec<DesignError>,
}

/// One document of a design in the order it was read: parsed, or known by its head alone.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Entry<'a> {
    /// A document that parsed.
    Read(&'a Document),
    /// A document that names its kind and name but does not parse.
    Unreadable(&'a Origin),
}

impl Parsed {
    /// Reads the documents of `text`, from `source`, after those read before.
    pub fn read(&mut self, text: &str, source: &str) -> &mut Self {
        let mut errors = Errors::default();
        for (position, document) in yaml::documents(text).into_iter().enumerate() {
            let index = position + 1;
            let unnamed = || format!("{source} #{index}");
            let document = match document {
                Ok(document) => document,
                Err(e) => {
                    errors.push(yaml_error(unnamed(), e));
                    break;
                }
            };
            let head = match document.skim::<serde_json::Value>() {
                Ok(serde_json::Value::Null) => continue,
                Ok(head) => head,
                Err(e) => {
                    errors.push(yaml_error(unnamed(), e));
                    continue;
                }
            };
            match parse_document(&head, &document, source, index) {
                Ok(document) => self.documents.push(document),
                Err(refused) => {
                    errors.push(refused.error);
                    self.unreadable.extend(refused.origin.map(|o| (self.documents.len(), o)));
                }
            }
        }
        self.errors.extend(errors.into_vec());
        self
    }

    /// The documents that parsed, in the order they were read.
    pub fn documents(&self) -> &[Document] {
        &self.documents
    }

    /// The documents that did not parse but name their kind and name.
    pub fn unreadable(&self) -> impl Iterator<Item = &Origin> {
        self.unreadable.iter().map(|(_, origin)| origin)
    }

    /// Why each document that did not parse was refused.
    pub fn errors(&self) -> &[DesignError] {
        &self.errors
    }

    /// Every document, or every error when any document did not parse.
    pub fn into_documents(self) -> Result<Vec<Document>, Vec<DesignError>> {
        if self.errors.is_empty() { Ok(self.documents) } else { Err(self.errors) }
    }

    /// Every document in the order it was read, the unreadable ones among them.
    pub(crate) fn entries(&self) -> Vec<Entry<'_>> {
        let mut entries = Vec::with_capacity(self.documents.len() + self.unreadable.len());
        let mut unreadable = self.unreadable.iter().peekable();
        for (read, document) in self.documents.iter().enumerate() {
            while let Some((_, origin)) = unreadable.next_if(|(before, _)| *before == read) {
                entries.push(Entry::Unreadable(origin));
            }
            entries.push(Entry::Read(document));
        }
        entries.extend(unreadable.map(|(_, origin)| Entry::Unreadable(origin)));
        entries
    }
}

/// The documents as entries, all of them read.
pub(crate) fn entries(docs: &[Document]) -> Vec<Entry<'_>> {
    docs.iter().map(Entry::Read).collect()
}

/// Why a document was refused, and which document it is when its head says.
struct Refused {
    error: DesignError,
    /// The document, when its head names a known kind and a name.
    origin: Option<Origin>,
}

/// Parses one non-empty document: `head` says its kind and name, the document is read as that
/// kind.
fn parse_document(
    head: &serde_json::Value,
    document: &yaml::Document<'_>,
    source: &str,
    index: usize,
) -> Result<Document, Box<Refused>> {
    let text = |key: &str| head.get(key).and_then(serde_json::Value::as_str);
    let (kind, name) = (text("kind"), text("name"));
    let location = format!("{}/{} ({source} #{index})", kind.unwrap_or("?"), name.unwrap_or("?"));
    let refuse = |field: &str, reason: &str| {
        Box::new(Refused { error: DesignError::new(&location, field, reason), origin: None })
    };
    if !head.is_object() {
        return Err(refuse("(document)", "a design document is a mapping with kind and name"));
    }
    let name = name.filter(|n| !n.is_empty());
    if kind.is_none() || name.is_none() {
        // What the YAML rules refuse (a tagged kind, say) explains a missing kind or name best.
        if let Err(e) = document.parse::<IgnoredAny>() {
            return Err(Box::new(Refused { error: yaml_error(location.clone(), e), origin: None }));
        }
    }
    let kind: Kind = match kind {
        Some(kind) => kind.parse().map_err(|reason: String| refuse("kind", &reason))?,
        None => return Err(refuse("kind", "missing: every document says its kind")),
    };
    let Some(name) = name else {
        return Err(refuse("name", "missing: every document has a name"));
    };
    let origin = Origin { kind, name: name.to_string(), source: source.to_string(), index };
    let body = match kind {
        Kind::Site => document.parse().map(Body::Site),
        Kind::HardwareProfile => document.parse().map(Body::HardwareProfile),
        Kind::HostProfile => document.parse().map(Body::HostProfile),
        Kind::Node => document.parse().map(Body::Node),
    };
    let body = body.map_err(|e| Box::new(Refused { error: yaml_error(location, e), origin: Some(origin) }))?;
    Ok(Document { source: source.to_string(), index, body })
}

/// A YAML error as a [`DesignError`]: its field path becomes the field, its position goes into
/// the reason.
fn yaml_error(document: String, error: yaml::Error) -> DesignError {
    let field = if error.field.is_empty() { "(document)".to_string() } else { error.field.clone() };
    DesignError::new(document, field, error.reason_at())
}

#[cfg(test)]
mod tests;
