//! Fixtures for the simulated site's tests: nodes, packages and requests, and sites at each
//! stage of an install.

use std::collections::BTreeMap;

use bus_schema::domain::{NodeDesign, Package, Role};
use bus_schema::pb::PackageKind;
use tokio::sync::mpsc;

use super::{SimConfig, SimSite};
use crate::SiteBackend;
use crate::backend::{BackendError, ClusterRequest, HostRequest, PatchOutcome, PatchRequest, ProvisioningState as S};

pub(super) fn node(name: &str, role: Role) -> NodeDesign {
    NodeDesign {
        name: name.try_into().unwrap(),
        role,
        boot_mac: "52:54:00:00:01:01".to_string().try_into().unwrap(),
        bmc_address: "ipmi://10.0.1.1".to_string().try_into().unwrap(),
        labels: BTreeMap::new(),
        network: None,
        root_device: None,
        kernel_parameters: Default::default(),
        cleaning: Default::default(),
    }
}

pub(super) fn package(name: &str, digit: char, size: u64) -> Package {
    Package { size, ..versioned(name, "1.29.1", PackageKind::Binary, digit) }
}

/// A package whose sha256 is `digit` 64 times (the state file's tests use it too).
pub(super) fn versioned(name: &str, version: &str, kind: PackageKind, digit: char) -> Package {
    Package {
        name: name.try_into().unwrap(),
        version: version.try_into().unwrap(),
        kind,
        sha256: digit.to_string().repeat(64).try_into().unwrap(),
        size: 1,
        object_key: format!("artifacts/{name}/{version}"),
        chart: None,
        render: None,
    }
}

pub(super) fn host(node: &NodeDesign, os: char) -> HostRequest {
    HostRequest::new(node.clone(), &versioned("ubuntu", "1.29.1", PackageKind::OsImage, os))
}

pub(super) async fn provision(site: &SimSite, req: &HostRequest) -> (Result<(), BackendError>, Vec<S>) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let result = site.provision_host(req, tx).await;
    let mut states = Vec::new();
    while let Some(s) = rx.recv().await {
        states.push(s);
    }
    (result, states)
}

pub(super) fn one_host() -> (SimSite, NodeDesign) {
    let n1 = node("node-1", Role::Master);
    (SimSite::new("edge-01", std::slice::from_ref(&n1), SimConfig::fast()), n1)
}

pub(super) fn provisions(site: &SimSite, host: &str) -> u32 {
    site.effects().provisions.get(host).copied().unwrap_or(0)
}

/// A site with a provisioned master and worker, and a third node never provisioned.
pub(super) async fn provisioned_site() -> (SimSite, ClusterRequest) {
    let nodes = [node("m-1", Role::Master), node("w-1", Role::Worker), node("w-2", Role::Worker)];
    let site = SimSite::new("edge-01", &nodes, SimConfig::fast());
    let (master, worker) = (host(&nodes[0], 'a'), host(&nodes[1], 'a'));
    let (m, w) = tokio::join!(provision(&site, &master), provision(&site, &worker));
    m.0.unwrap();
    w.0.unwrap();
    let binaries = vec![package("kubelet", 'c', 10)];
    (site, ClusterRequest { nodes: nodes.to_vec(), binaries, join_existing: false, capi: None })
}

/// [`provisioned_site`] with its cluster formed: kubelet 1.29.1 on m-1 and w-1.
pub(super) async fn installed_site() -> (SimSite, ClusterRequest) {
    let (site, req) = provisioned_site().await;
    site.install_binaries(&req).await.unwrap();
    (site, req)
}

pub(super) fn patch(req: &ClusterRequest, node: usize, package: Package) -> PatchRequest {
    PatchRequest {
        node: req.nodes[node].clone(),
        package,
        reinstall: req.binaries.clone(),
        progress: None,
        max_unavailable: 1,
    }
}

pub(super) fn outcome(from_version: &str, changed: bool) -> PatchOutcome {
    PatchOutcome { from_version: Some(from_version.to_string()), changed }
}

pub(super) fn per_node(counts: &[(&str, u32)]) -> BTreeMap<String, u32> {
    counts.iter().map(|(node, n)| (node.to_string(), *n)).collect()
}
