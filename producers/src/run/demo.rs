//! The demo fleet `landfall up` runs, and benchmarks and tests build on: its packages (the
//! catalog entries, and stand-in bytes for the artifact store), its sites' designs, and the
//! auto-rollout strategy of its binaries.

use bus_schema::domain::SiteDesign;
use bus_schema::pb;
use consumers::artifacts::ArtifactStore;
use sha2::{Digest, Sha256};

/// The demo packages' stand-in bytes `up` uploads are this many times smaller than the real
/// packages (an 18 MiB OS image, a 0.9 MiB kubelet), so every install moves real bytes.
pub const UP_SHRINK: u64 = 128;

/// The rollout strategy the demo packages' auto-rollout policy uses: one canary site, then
/// waves of five sites, one node of a site at a time, halt past 10 % failed nodes, and a site
/// that does not report within ten minutes counts as failed.
pub fn demo_strategy() -> pb::RolloutStrategy {
    pb::RolloutStrategy {
        canary_sites: 1,
        max_concurrent_sites: 5,
        max_unavailable: "1".into(),
        failure_threshold: "10%".into(),
        wave_timeout_seconds: 600,
        on_wave_timeout: pb::WaveTimeoutAction::Continue as i32,
        ..Default::default()
    }
}

/// The package set every simulated site runs.
const DEMO_PACKAGES: &[(&str, &str, pb::PackageKind, u64)] = &[
    ("ubuntu", "22.04.4", pb::PackageKind::OsImage, 2_361_393_152),
    ("containerd", "1.7.13", pb::PackageKind::Binary, 38_338_560),
    ("kubelet", "1.29.2", pb::PackageKind::Binary, 111_955_968),
    ("kubeadm", "1.29.2", pb::PackageKind::Binary, 50_458_624),
    ("cni-calico", "3.27.2", pb::PackageKind::Container, 1_048_576),
];

/// The catalog entries of the demo packages, by their metadata alone (digests of a stand-in
/// content, no bytes in the artifact store): what benchmarks and most tests register.
pub fn demo_packages() -> Vec<pb::Package> {
    DEMO_PACKAGES
        .iter()
        .map(|(name, version, kind, size)| {
            let digest = Sha256::digest(format!("{name}@{version}").as_bytes());
            pb::Package {
                name: name.to_string(),
                version: version.to_string(),
                kind: *kind as i32,
                sha256: bus_schema::domain::Sha256::hex(&digest),
                size: *size,
                object_key: String::new(),
                chart: None,
                render: None,
            }
        })
        .collect()
}

/// Stand-in bytes for a demo package: `len` bytes, always the same for the same package.
pub fn demo_content(name: &str, version: &str, len: usize) -> Vec<u8> {
    let seed = Sha256::digest(format!("{name}@{version}").as_bytes());
    let mut x = u64::from_le_bytes(seed[..8].try_into().expect("8 bytes")) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        // xorshift64: cheap, and no two packages share their bytes.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Uploads stand-in bytes for every demo package, each `1/shrink` of the real package's size,
/// into `store`, and returns their catalog entries (real digests, sizes and object keys).
pub async fn upload_demo_packages(store: &ArtifactStore, shrink: u64) -> anyhow::Result<Vec<pb::Package>> {
    let mut out = Vec::new();
    for mut p in demo_packages() {
        let bytes = demo_content(&p.name, &p.version, (p.size / shrink.max(1)).max(1) as usize);
        let stored = store.upload(bytes.as_slice()).await?;
        (p.sha256, p.size, p.object_key) = (stored.sha256, stored.size, stored.object_key);
        out.push(p);
    }
    Ok(out)
}

/// A simulated site's design: `nodes` nodes, the first (or first three) masters. Every
/// node of up to 16,384 sites of up to 1,000 nodes each has a MAC and a BMC address of its own:
/// the site's index and the node's are packed into their last bytes (a node past the 246th
/// carries its high bits in the byte above the site's).
pub fn demo_site(index: usize, nodes: usize) -> SiteDesign {
    let site = format!("edge-{:02}", index + 1);
    let masters = if nodes >= 5 { 3 } else { 1 };
    let node_specs = (0..nodes)
        .map(|i| {
            let host = i + 10;
            pb::NodeSpec {
                name: format!("node-{}", i + 1),
                role: if i < masters { pb::Role::Master } else { pb::Role::Worker } as i32,
                boot_mac: format!(
                    "52:54:00:{:02x}:{:02x}:{:02x}",
                    (index >> 8) | (i >> 8) << 6,
                    index & 0xff,
                    i & 0xff
                ),
                bmc_address: format!(
                    "redfish-virtualmedia://10.{}.{}.{}/redfish/v1/Systems/1",
                    (index >> 8) | (host >> 8) << 6,
                    index & 0xff,
                    host & 0xff
                ),
                labels: Default::default(),
                ..Default::default()
            }
        })
        .collect();
    let set: Vec<pb::PackageRef> =
        demo_packages().iter().map(|p| pb::PackageRef { name: p.name.clone(), version: p.version.clone() }).collect();
    let design = pb::SiteDesign {
        site_id: site,
        labels: [("region".to_string(), if index.is_multiple_of(2) { "eu-west" } else { "us-east" }.to_string())]
            .into(),
        nodes: node_specs,
        packages: [pb::Role::Master, pb::Role::Worker]
            .into_iter()
            .map(|role| pb::RolePackages { role: role as i32, packages: set.clone() })
            .collect(),
        cluster: None,
        chart_values: Default::default(),
        maintenance_windows: Vec::new(),
    };
    SiteDesign::try_from(design).expect("the demo design is valid")
}

#[cfg(test)]
mod tests {
    use super::*;
    use bus_schema::domain::SiteId;
    use bus_schema::names;

    #[test]
    fn demo_sites_are_valid_and_distinct() {
        let a = demo_site(0, 5);
        let b = demo_site(1, 5);
        assert_eq!(a.site.as_str(), "edge-01");
        assert_eq!(a.nodes.iter().filter(|n| n.role == bus_schema::domain::Role::Master).count(), 3);
        assert_ne!(a.nodes[0].boot_mac, b.nodes[0].boot_mac);
        // A site of a thousand nodes: each its own MAC and BMC address.
        let big = demo_site(9_999, 1_000);
        let macs: std::collections::BTreeSet<_> = big.nodes.iter().map(|n| n.boot_mac.to_string()).collect();
        let bmcs: std::collections::BTreeSet<_> = big.nodes.iter().map(|n| format!("{:?}", n.bmc_address)).collect();
        assert_eq!((macs.len(), bmcs.len()), (1_000, 1_000));
        assert_eq!(demo_packages().iter().filter(|p| p.kind == pb::PackageKind::OsImage as i32).count(), 1);
        let _ = SiteId::try_from(names::FLEET).unwrap_err();
    }
}
