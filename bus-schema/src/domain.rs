//! Validated domain types, and the conversions at the protobuf edge.
//!
//! Everything that crosses into the services goes through `TryFrom<pb::X>` here, so the
//! logic behind it never sees an unchecked site id, MAC address or version.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::Deserialize;

pub use crate::cluster::{ApiEndpoint, Builder, ClusterBuild, NodeSetRollout};
use crate::pb;
pub use crate::window::Window;

/// Why a value was refused. The message names the field and the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct InvalidField {
    pub field: String,
    pub reason: String,
}

impl InvalidField {
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self { field: field.into(), reason: reason.into() }
    }

    fn within(self, parent: &str) -> Self {
        Self { field: format!("{parent}.{}", self.field), reason: self.reason }
    }
}

macro_rules! validated_string {
    ($(#[$doc:meta])* $name:ident, $field:literal, $check:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
        #[serde(try_from = "String")]
        pub struct $name(String);

        impl $name {
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = InvalidField;
            fn try_from(value: String) -> Result<Self, InvalidField> {
                let check: fn(&str) -> Result<(), String> = $check;
                check(&value).map_err(|reason| InvalidField::new($field, reason))?;
                Ok(Self(value))
            }
        }

        impl TryFrom<&str> for $name {
            type Error = InvalidField;
            fn try_from(value: &str) -> Result<Self, InvalidField> {
                Self::try_from(value.to_string())
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<$name> for String {
            fn from(v: $name) -> String {
                v.0
            }
        }
    };
}

/// A DNS-label-like name: it becomes a subject token, so no dots, wildcards or spaces.
fn dns_label(s: &str) -> Result<(), String> {
    if s.is_empty() || s.len() > 63 {
        return Err(format!("{s:?} must be 1 to 63 characters"));
    }
    let ok = s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-');
    if !ok {
        return Err(format!("{s:?} must be lowercase letters, digits and '-', not starting or ending with '-'"));
    }
    Ok(())
}

validated_string!(
    /// A site id: a DNS label, and never the reserved scope `fleet`.
    SiteId,
    "site_id",
    |s| {
        dns_label(s)?;
        if s == crate::names::FLEET {
            return Err(format!("{s:?} is reserved"));
        }
        Ok(())
    }
);

validated_string!(
    /// A node name: a DNS label, unique within its site.
    NodeName,
    "name",
    dns_label
);

validated_string!(
    /// A package name, e.g. `kubelet`, `ubuntu-22.04`.
    PackageName,
    "name",
    |s| {
        if s.is_empty() || s.len() > 128 {
            return Err(format!("{s:?} must be 1 to 128 characters"));
        }
        if !s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) || !s.starts_with(|c: char| c.is_ascii_alphanumeric()) {
            return Err(format!("{s:?} must be letters, digits, '-', '_' and '.', starting with a letter or digit"));
        }
        Ok(())
    }
);

validated_string!(
    /// A package version, e.g. `1.29.1`, `1.29.1+k3s1`, `22.04-20240101`.
    Version,
    "version",
    |s| {
        if s.is_empty() || s.len() > 128 {
            return Err(format!("{s:?} must be 1 to 128 characters"));
        }
        if !s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.+~".contains(c)) || !s.starts_with(|c: char| c.is_ascii_alphanumeric()) {
            return Err(format!("{s:?} is not a version (letters, digits and . + - _ ~, starting with a letter or digit)"));
        }
        Ok(())
    }
);

validated_string!(
    /// A lowercase hex sha256 digest.
    Sha256,
    "sha256",
    |s| {
        if s.len() != 64 || !s.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)) {
            return Err(format!("{s:?} is not 64 lowercase hex digits"));
        }
        Ok(())
    }
);

impl Sha256 {
    /// The digest's bytes as lowercase hex (what this type holds).
    pub fn hex(digest: &[u8]) -> String {
        use std::fmt::Write;
        digest.iter().fold(String::with_capacity(digest.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
    }
}

/// A boot MAC address, kept in lowercase colon form.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(try_from = "String")]
pub struct MacAddress(String);

impl MacAddress {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for MacAddress {
    type Error = InvalidField;
    fn try_from(value: String) -> Result<Self, InvalidField> {
        let lower = value.to_ascii_lowercase().replace('-', ":");
        let parts: Vec<&str> = lower.split(':').collect();
        if parts.len() != 6 || !parts.iter().all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit())) {
            return Err(InvalidField::new("boot_mac", format!("{value:?} is not a MAC address (aa:bb:cc:dd:ee:ff)")));
        }
        Ok(Self(lower))
    }
}

impl fmt::Display for MacAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The BMC address schemes Metal3 (baremetal-operator) knows.
pub const BMC_SCHEMES: &[&str] = &[
    "ipmi",
    "libvirt",
    "redfish",
    "redfish+http",
    "redfish+https",
    "redfish-virtualmedia",
    "redfish-virtualmedia+http",
    "redfish-virtualmedia+https",
    "redfish-uefihttp",
    "idrac",
    "idrac+http",
    "idrac+https",
    "idrac-redfish",
    "idrac-redfish+http",
    "idrac-redfish+https",
    "idrac-virtualmedia",
    "idrac-virtualmedia+http",
    "idrac-virtualmedia+https",
    "ilo4",
    "ilo4-virtualmedia",
    "ilo5",
    "ilo5-redfish",
    "ilo5-virtualmedia",
    "irmc",
    "ibmc",
];

/// A BMC address, `scheme://host[:port][/path]`, with a scheme Metal3 knows.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize)]
#[serde(try_from = "String")]
pub struct BmcAddress(String);

impl BmcAddress {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for BmcAddress {
    type Error = InvalidField;
    fn try_from(value: String) -> Result<Self, InvalidField> {
        let Some((scheme, rest)) = value.split_once("://") else {
            return Err(InvalidField::new(
                "bmc_address",
                format!("{value:?} must look like scheme://host (e.g. ipmi://10.0.0.5)"),
            ));
        };
        if !BMC_SCHEMES.contains(&scheme) {
            return Err(InvalidField::new(
                "bmc_address",
                format!("scheme {scheme:?} is not one Metal3 knows ({})", BMC_SCHEMES.join(", ")),
            ));
        }
        if rest.is_empty() || rest.starts_with('/') || rest.chars().any(char::is_whitespace) {
            return Err(InvalidField::new("bmc_address", format!("{value:?} has no host")));
        }
        Ok(Self(value))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Master,
    Worker,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Master => "master",
            Role::Worker => "worker",
        }
    }
}

impl TryFrom<i32> for Role {
    type Error = InvalidField;
    fn try_from(v: i32) -> Result<Self, InvalidField> {
        match pb::Role::try_from(v) {
            Ok(pb::Role::Master) => Ok(Role::Master),
            Ok(pb::Role::Worker) => Ok(Role::Worker),
            _ => Err(InvalidField::new("role", format!("{v} is not a role (master or worker)"))),
        }
    }
}

impl From<Role> for pb::Role {
    fn from(r: Role) -> Self {
        match r {
            Role::Master => pb::Role::Master,
            Role::Worker => pb::Role::Worker,
        }
    }
}

/// A package by name and version. In YAML, `{ name, version }` and nothing else, so that a
/// misspelt key is refused rather than ignored.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackageRef {
    pub name: PackageName,
    pub version: Version,
}

impl PackageRef {
    pub fn key(&self) -> String {
        format!("{}@{}", self.name, self.version)
    }
}

impl TryFrom<pb::PackageRef> for PackageRef {
    type Error = InvalidField;
    fn try_from(p: pb::PackageRef) -> Result<Self, InvalidField> {
        Ok(Self { name: p.name.try_into()?, version: p.version.try_into()? })
    }
}

impl From<&PackageRef> for pb::PackageRef {
    fn from(p: &PackageRef) -> Self {
        Self { name: p.name.to_string(), version: p.version.to_string() }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeDesign {
    pub name: NodeName,
    pub role: Role,
    pub boot_mac: MacAddress,
    pub bmc_address: BmcAddress,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// How the host's network is set up (design documents only: the flat file has none).
    #[serde(skip)]
    pub network: Option<pb::NodeNetwork>,
    /// The disk the image goes on (design documents only).
    #[serde(skip)]
    pub root_device: Option<pb::RootDeviceHints>,
    /// Kernel parameters the OS boots with (design documents only).
    #[serde(skip)]
    pub kernel_parameters: BTreeMap<String, String>,
    /// How Metal3 cleans the disks when the OS comes off (design documents only; unspecified:
    /// as the host says).
    #[serde(skip)]
    pub cleaning: pb::CleaningMode,
}

impl TryFrom<pb::NodeSpec> for NodeDesign {
    type Error = InvalidField;
    fn try_from(n: pb::NodeSpec) -> Result<Self, InvalidField> {
        if let Some(network) = &n.network {
            crate::host_setup::check_network(network).map_err(|e| e.within("network"))?;
        }
        if let Some(root) = &n.root_device {
            crate::host_setup::check_root_device(root).map_err(|e| e.within("root_device"))?;
        }
        crate::host_setup::check_kernel_parameters(&n.kernel_parameters)?;
        Ok(Self {
            name: n.name.try_into()?,
            role: Role::try_from(n.role)?,
            boot_mac: n.boot_mac.try_into()?,
            bmc_address: n.bmc_address.try_into()?,
            labels: n.labels.into_iter().collect(),
            network: n.network,
            root_device: n.root_device,
            kernel_parameters: n.kernel_parameters.into_iter().collect(),
            cleaning: pb::CleaningMode::try_from(n.cleaning)
                .map_err(|_| InvalidField::new("cleaning", format!("{} is no cleaning mode", n.cleaning)))?,
        })
    }
}

impl From<&NodeDesign> for pb::NodeSpec {
    fn from(n: &NodeDesign) -> Self {
        Self {
            name: n.name.to_string(),
            role: pb::Role::from(n.role) as i32,
            boot_mac: n.boot_mac.to_string(),
            bmc_address: n.bmc_address.as_str().to_string(),
            labels: n.labels.clone().into_iter().collect(),
            network: n.network.clone(),
            root_device: n.root_device.clone(),
            kernel_parameters: n.kernel_parameters.clone().into_iter().collect(),
            cleaning: n.cleaning as i32,
        }
    }
}

/// A site's design: its nodes and, per role, the packages its nodes run.
///
/// In YAML (`landfall site register -f site.yaml`):
///
/// ```yaml
/// site: edge-01
/// labels: { region: eu-west }
/// nodes:
///   - { name: node-1, role: master, bootMac: "52:54:00:00:01:01", bmcAddress: "ipmi://10.0.1.1" }
///   - { name: node-2, role: worker, bootMac: "52:54:00:00:01:02", bmcAddress: "redfish://10.0.1.2" }
/// packages:
///   master: [{ name: ubuntu, version: "22.04" }, { name: kubelet, version: "1.29.1" }]
///   worker: [{ name: ubuntu, version: "22.04" }, { name: kubelet, version: "1.29.1" }]
/// maintenanceWindows: [{ cron: "0 22 * * *", timeZone: Europe/Berlin, duration: 4h }]
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SiteDesign {
    pub site: SiteId,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    pub nodes: Vec<NodeDesign>,
    #[serde(default)]
    pub packages: BTreeMap<Role, Vec<PackageRef>>,
    /// How the site's cluster is built (the BPA unless it says Cluster API).
    #[serde(default)]
    pub cluster: ClusterBuild,
    /// The values this site gives each helm-chart package, by package name: layered over the
    /// package's own when the hub renders the chart for the site (`'!key'` removes a key the
    /// package sets).
    #[serde(default)]
    pub values: BTreeMap<String, serde_json::Value>,
    /// When changes may start at the site; none: at any time.
    #[serde(default, rename = "maintenanceWindows")]
    pub maintenance_windows: Vec<Window>,
}

impl SiteDesign {
    /// Checks what one field alone cannot: unique names and MACs, at least one master; and
    /// writes out the defaults of how the cluster is built. The rules of a Cluster API build
    /// are [`SiteDesign::cluster_problems`]: judged when a design is registered or applied, not
    /// each time one is read (a node removed does not make the stored design unreadable).
    pub fn validate(mut self) -> Result<Self, InvalidField> {
        let masters = self.nodes.iter().filter(|n| n.role == Role::Master).count();
        self.cluster = self.cluster.with_defaults(masters);
        if self.nodes.is_empty() {
            return Err(InvalidField::new("nodes", "a site needs at least one node"));
        }
        let mut names = BTreeSet::new();
        let mut macs = BTreeSet::new();
        for (i, node) in self.nodes.iter().enumerate() {
            if !names.insert(node.name.as_str()) {
                return Err(InvalidField::new(format!("nodes[{i}].name"), format!("{} appears twice", node.name)));
            }
            if !macs.insert(node.boot_mac.as_str()) {
                return Err(InvalidField::new(
                    format!("nodes[{i}].bootMac"),
                    format!("{} is used by two nodes", node.boot_mac),
                ));
            }
        }
        if !self.nodes.iter().any(|n| n.role == Role::Master) {
            return Err(InvalidField::new("nodes", "a site needs at least one master"));
        }
        for (role, pkgs) in &self.packages {
            let mut seen = BTreeSet::new();
            for p in pkgs {
                if !seen.insert(p.name.as_str()) {
                    return Err(InvalidField::new(
                        format!("packages.{}", role.as_str()),
                        format!("{} is listed twice", p.name),
                    ));
                }
            }
        }
        for (name, values) in &self.values {
            if !values.is_object() {
                return Err(InvalidField::new(format!("values.{name}"), "must be a mapping of the chart's values"));
            }
            if !self.all_packages().iter().any(|p| p.name.as_str() == name) {
                return Err(InvalidField::new(format!("values.{name}"), format!("no node of the site runs {name}")));
            }
        }
        for (i, window) in self.maintenance_windows.iter().enumerate() {
            window.check_opens().map_err(|e| e.within(&format!("maintenanceWindows[{i}]")))?;
        }
        Ok(self)
    }

    pub fn node(&self, name: &str) -> Option<&NodeDesign> {
        self.nodes.iter().find(|n| n.name.as_str() == name)
    }

    /// Why the cluster cannot be built as the design says (see [`ClusterBuild::problems`]).
    pub fn cluster_problems(&self) -> Vec<InvalidField> {
        self.cluster.problems(self.nodes.iter().filter(|n| n.role == Role::Master).count())
    }

    pub fn packages_for(&self, role: Role) -> &[PackageRef] {
        self.packages.get(&role).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Every distinct package any role of the site runs.
    pub fn all_packages(&self) -> BTreeSet<&PackageRef> {
        self.packages.values().flatten().collect()
    }
}

impl TryFrom<pb::SiteDesign> for SiteDesign {
    type Error = InvalidField;
    fn try_from(d: pb::SiteDesign) -> Result<Self, InvalidField> {
        let nodes = d
            .nodes
            .into_iter()
            .enumerate()
            .map(|(i, n)| NodeDesign::try_from(n).map_err(|e| e.within(&format!("nodes[{i}]"))))
            .collect::<Result<Vec<_>, _>>()?;
        let mut packages: BTreeMap<Role, Vec<PackageRef>> = BTreeMap::new();
        for rp in d.packages {
            let role = Role::try_from(rp.role).map_err(|e| e.within("packages"))?;
            let list = rp
                .packages
                .into_iter()
                .map(PackageRef::try_from)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| e.within(&format!("packages.{}", role.as_str())))?;
            packages.entry(role).or_default().extend(list);
        }
        let cluster = d.cluster.map(ClusterBuild::try_from).transpose()?.unwrap_or_default();
        let mut values = BTreeMap::new();
        for (name, text) in d.chart_values {
            let value: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| InvalidField::new(format!("chart_values.{name}"), format!("not JSON: {e}")))?;
            values.insert(name, value);
        }
        let maintenance_windows = d
            .maintenance_windows
            .iter()
            .enumerate()
            .map(|(i, w)| {
                Window::from_seconds(&w.cron, &w.time_zone, w.duration_seconds).map_err(|e| {
                    let field = match e.field.as_str() {
                        "timeZone" => "time_zone",
                        "duration" => "duration_seconds",
                        other => other,
                    };
                    InvalidField::new(format!("maintenance_windows[{i}].{field}"), e.reason)
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Self {
            site: d.site_id.try_into()?,
            labels: d.labels.into_iter().collect(),
            nodes,
            packages,
            cluster,
            values,
            maintenance_windows,
        }
        .validate()
    }
}

impl From<&SiteDesign> for pb::SiteDesign {
    fn from(d: &SiteDesign) -> Self {
        Self {
            site_id: d.site.to_string(),
            labels: d.labels.clone().into_iter().collect(),
            nodes: d.nodes.iter().map(pb::NodeSpec::from).collect(),
            packages: d
                .packages
                .iter()
                .map(|(role, pkgs)| pb::RolePackages {
                    role: pb::Role::from(*role) as i32,
                    packages: pkgs.iter().map(pb::PackageRef::from).collect(),
                })
                .collect(),
            // A BPA site's message stays as it was before there was a choice.
            cluster: (d.cluster != ClusterBuild::default()).then(|| pb::ClusterBuild::from(&d.cluster)),
            chart_values: d.values.iter().map(|(name, v)| (name.clone(), v.to_string())).collect(),
            maintenance_windows: d.maintenance_windows.iter().map(pb::MaintenanceWindow::from).collect(),
        }
    }
}

impl From<&Window> for pb::MaintenanceWindow {
    fn from(w: &Window) -> Self {
        Self {
            cron: w.cron().to_string(),
            time_zone: w.time_zone().to_string(),
            duration_seconds: w.duration_seconds(),
        }
    }
}

/// A catalog entry, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Package {
    pub name: PackageName,
    pub version: Version,
    pub kind: pb::PackageKind,
    pub sha256: Sha256,
    pub size: u64,
    pub object_key: String,
    /// A helm-chart package's release and values; `None` for every other kind.
    pub chart: Option<pb::HelmChart>,
    /// A helm-chart package as a job carries it: its site's render stands in for the chart
    /// (`sha256`, `size` and `object_key` are the render's), and this says what it was made of.
    pub render: Option<pb::ChartRender>,
}

impl Package {
    /// Its name and version.
    pub fn reference(&self) -> PackageRef {
        PackageRef { name: self.name.clone(), version: self.version.clone() }
    }

    /// Whether it goes to the site's cluster as manifests (a container package or a chart).
    pub fn is_manifests(&self) -> bool {
        matches!(self.kind, pb::PackageKind::Container | pb::PackageKind::HelmChart)
    }
}

/// Checks a helm-chart package's release: a release name and namespace as Kubernetes takes them.
fn check_chart(kind: pb::PackageKind, chart: Option<pb::HelmChart>) -> Result<Option<pb::HelmChart>, InvalidField> {
    match (kind, chart) {
        (pb::PackageKind::HelmChart, None) => {
            Err(InvalidField::new("chart", "a helm-chart package needs its release and namespace"))
        }
        (pb::PackageKind::HelmChart, Some(c)) => {
            // Helm's own limit for a release name is 53 characters (its objects' names append to it).
            if c.release.len() > 53 {
                return Err(InvalidField::new("chart.release", "at most 53 characters, as Helm takes it"));
            }
            dns_label(&c.release).map_err(|r| InvalidField::new("chart.release", r))?;
            dns_label(&c.namespace).map_err(|r| InvalidField::new("chart.namespace", r))?;
            if !c.values.trim().is_empty() {
                match crate::yaml::from_str::<serde_json::Value>(&c.values) {
                    Ok(serde_json::Value::Object(_)) | Ok(serde_json::Value::Null) => {}
                    Ok(_) => return Err(InvalidField::new("chart.values", "must be a YAML mapping")),
                    Err(e) => return Err(InvalidField::new("chart.values", e.to_string())),
                }
            }
            Ok(Some(c))
        }
        (_, Some(_)) => Err(InvalidField::new("chart", "only a helm-chart package has a release")),
        (_, None) => Ok(None),
    }
}

impl TryFrom<pb::Package> for Package {
    type Error = InvalidField;
    fn try_from(p: pb::Package) -> Result<Self, InvalidField> {
        let kind = match pb::PackageKind::try_from(p.kind) {
            Ok(k) if k != pb::PackageKind::Unspecified => k,
            _ => return Err(InvalidField::new("kind", "must be os-image, binary, container or helm-chart")),
        };
        if p.render.is_some() && kind != pb::PackageKind::HelmChart {
            return Err(InvalidField::new("render", "only a helm-chart package is rendered"));
        }
        Ok(Self {
            name: p.name.try_into()?,
            version: p.version.try_into()?,
            kind,
            sha256: p.sha256.try_into()?,
            size: p.size,
            object_key: p.object_key,
            chart: check_chart(kind, p.chart)?,
            render: p.render,
        })
    }
}

impl From<&Package> for pb::Package {
    fn from(p: &Package) -> Self {
        Self {
            name: p.name.to_string(),
            version: p.version.to_string(),
            kind: p.kind as i32,
            sha256: p.sha256.to_string(),
            size: p.size,
            object_key: p.object_key.clone(),
            chart: p.chart.clone(),
            render: p.render.clone(),
        }
    }
}

impl std::str::FromStr for pb::PackageKind {
    type Err = InvalidField;
    fn from_str(s: &str) -> Result<Self, InvalidField> {
        match s {
            "os-image" => Ok(Self::OsImage),
            "binary" => Ok(Self::Binary),
            "container" => Ok(Self::Container),
            "helm-chart" => Ok(Self::HelmChart),
            _ => Err(InvalidField::new("kind", format!("{s:?} is not os-image, binary, container or helm-chart"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SITE: &str = r#"
site: edge-01
labels: { region: eu-west }
nodes:
  - { name: node-1, role: master, bootMac: "52:54:00:00:01:01", bmcAddress: "ipmi://10.0.1.1" }
  - { name: node-2, role: worker, bootMac: "52-54-00-00-01-02", bmcAddress: "redfish-virtualmedia://10.0.1.2/redfish/v1/Systems/1" }
packages:
  master: [{ name: ubuntu, version: "22.04" }, { name: kubelet, version: "1.29.1+k3s1" }]
  worker: [{ name: ubuntu, version: "22.04" }]
maintenanceWindows: [{ cron: "0 22 * * *", timeZone: Europe/Berlin, duration: 4h }]
"#;

    fn parse(yaml: &str) -> Result<SiteDesign, String> {
        crate::yaml::from_str::<SiteDesign>(yaml).map_err(|e| e.to_string())?.validate().map_err(|e| e.to_string())
    }

    #[test]
    fn yaml_round_trips_through_protobuf() {
        let d = parse(SITE).unwrap();
        assert_eq!(d.nodes[1].boot_mac.as_str(), "52:54:00:00:01:02");
        assert_eq!(d.all_packages().len(), 2);
        assert_eq!(d.maintenance_windows[0].to_string(), r#""0 22 * * *" in Europe/Berlin for 4h"#);
        let back = SiteDesign::try_from(pb::SiteDesign::from(&d)).unwrap();
        assert_eq!(back, d);
    }

    #[test]
    fn refuses_what_it_should_with_the_field_named() {
        for (bad, field) in [
            (SITE.replace("edge-01", "Edge.01"), "site_id"),
            (SITE.replace("edge-01", "fleet"), "reserved"),
            (SITE.replace("52:54:00:00:01:01", "52:54:00:00:01"), "boot_mac"),
            (SITE.replace("ipmi://", "telnet://"), "Metal3"),
            (SITE.replace("node-2", "node-1"), "appears twice"),
            (SITE.replace("52-54-00-00-01-02", "52:54:00:00:01:01"), "two nodes"),
            (SITE.replace("role: master", "role: worker"), "at least one master"),
            (SITE.replace("\"22.04\" }]\n", "\"22 04\" }]\n"), "version"),
            (SITE.replace("role: master", "role: boss"), "role"),
            (SITE.replace("\"1.29.1+k3s1\" }", "\"1.29.1+k3s1\", kind: binary }"), "unknown field `kind`"),
            (
                SITE.replace("0 22 * * *", "0 25 * * *"),
                r#"maintenanceWindows[0]: cron: field "hour" value 25 is out of 0-23"#,
            ),
            (
                SITE.replace("Europe/Berlin", "Europe/Bern1"),
                r#"maintenanceWindows[0]: timeZone: "Europe/Bern1" is not"#,
            ),
            (SITE.replace("duration: 4h", "duration: 45s"), "maintenanceWindows[0]: duration: 45s is shorter"),
            (
                SITE.replace("0 22 * * *", "0 0 30 2 *"),
                "maintenanceWindows[0].cron: \"0 0 30 2 *\" never matches a day",
            ),
        ] {
            let err = parse(&bad).expect_err(field);
            assert!(err.contains(field), "{err} should mention {field}");
        }
    }

    #[test]
    fn protobuf_with_unspecified_role_is_refused() {
        let mut p = pb::SiteDesign::from(&parse(SITE).unwrap());
        p.nodes[0].role = 0;
        let err = SiteDesign::try_from(p).unwrap_err();
        assert_eq!(err.field, "nodes[0].role");
    }

    #[test]
    fn protobuf_windows_are_checked_with_the_field_named() {
        let mut p = pb::SiteDesign::from(&parse(SITE).unwrap());
        assert_eq!(p.maintenance_windows[0].duration_seconds, 14_400);
        p.maintenance_windows[0].duration_seconds = 30;
        let err = SiteDesign::try_from(p.clone()).unwrap_err();
        assert_eq!(err.field, "maintenance_windows[0].duration_seconds");
        p.maintenance_windows[0].duration_seconds = 60;
        p.maintenance_windows[0].time_zone = "Nowhere".into();
        assert_eq!(SiteDesign::try_from(p).unwrap_err().field, "maintenance_windows[0].time_zone");
    }
}
