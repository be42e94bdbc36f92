//! YAML fixtures shared by the design tests.

use std::collections::BTreeSet;

use super::document::{Document, parse_documents};
use super::resolve::ResolvedSite;
use super::validate::validate;
use crate::domain::PackageRef;

/// Two hardware models and a chain: `base` (worker) < `control` (master), `base` < `worker`,
/// and `worker` < `big-worker` on the other hardware.
pub(crate) const PROFILES: &str = r#"
kind: HardwareProfile
name: r640
labels: { hw: r640 }
interfaces: [{ name: eno1, network: provisioning, mtu: 9000 }, { name: eno2 }]
storage: [{ name: root, device: /dev/sda, sizeGb: 480, mount: / }]
---
kind: HardwareProfile
name: r740
labels: { hw: r740 }
interfaces: [{ name: eno1, network: provisioning }]
---
kind: HostProfile
name: base
hardwareProfile: r640
role: worker
packages: [{ name: ubuntu, version: "22.04" }, { name: kubelet, version: 1.29.1 }]
kernelParameters: { isolcpus: 2-7 }
---
kind: HostProfile
name: control
parent: base
role: master
packages: [{ name: etcd, version: 3.5.12 }]
---
kind: HostProfile
name: worker
parent: base
---
kind: HostProfile
name: big-worker
parent: worker
hardwareProfile: r740
"#;

/// A Site document with the given node sets (YAML flow mappings).
pub(crate) fn site(masters: &str, workers: &str) -> String {
    format!(
        "kind: Site
name: edge-01
region: eu-west
labels: {{ tier: gold }}
networks: [{{ name: provisioning, cidr: 10.1.0.0/24 }}, {{ name: oob, cidr: 10.0.0.0/24 }}]
cluster:
  apiNetwork: provisioning
  masters: {masters}
  workers: {workers}
"
    )
}

/// Node `node-{n}` on `profile` in `rack`, with MAC, BMC and addresses derived from `n`.
pub(crate) fn node(n: u8, profile: &str, rack: &str) -> String {
    format!(
        "kind: Node
name: node-{n}
hostProfile: {profile}
bootMac: 52:54:00:00:01:{n:02x}
bmc: {{ address: ipmi://10.0.0.{n}, credentialsRef: bmc-node-{n} }}
rack: {rack}
addressing: [{{ network: provisioning, ip: 10.1.0.{} }}, {{ network: oob, ip: 10.0.0.{} }}]
",
        10 + u16::from(n),
        100 + u16::from(n)
    )
}

/// A whole design: the site, [`PROFILES`], and nodes `(n, profile, rack)`.
pub(crate) fn design(site: &str, nodes: &[(u8, &str, &str)]) -> String {
    let mut docs = vec![site.to_string(), PROFILES.to_string()];
    docs.extend(nodes.iter().map(|(n, profile, rack)| node(*n, profile, rack)));
    docs.join("---\n")
}

/// The documents of `text`, read from `site.yaml`.
pub(crate) fn documents(text: &str) -> Vec<Document> {
    match parse_documents(text, "site.yaml") {
        Ok(docs) => docs,
        Err(errors) => panic!("fixture does not parse: {errors:#?}"),
    }
}

/// The packages the fixtures use.
pub(crate) fn catalog() -> BTreeSet<PackageRef> {
    [("ubuntu", "22.04"), ("kubelet", "1.29.1"), ("kubelet", "1.30.0"), ("etcd", "3.5.12")]
        .into_iter()
        .map(|(name, version)| PackageRef { name: name.try_into().unwrap(), version: version.try_into().unwrap() })
        .collect()
}

/// The validated site of `text`.
pub(crate) fn resolved(text: &str) -> ResolvedSite {
    match validate(&documents(text), &catalog()) {
        Ok(site) => site,
        Err(errors) => panic!("fixture does not validate: {errors:#?}"),
    }
}
