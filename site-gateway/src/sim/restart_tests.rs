//! A simulated site killed and started again from its state file
//! ([`SimSite::with_state_file`]): it carries on where it was, and does nothing twice.

use std::collections::BTreeMap;
use std::time::Duration;

use bus_schema::domain::{NodeDesign, Role};
use bus_schema::pb::PackageKind;
use tokio::sync::mpsc;

use super::testing::versioned;
use super::{SimConfig, SimSite, SimStateError, saved_effects};
use crate::SiteBackend;
use crate::backend::{ClusterRequest, HostRequest, ProvisioningState as S};

fn node(name: &str, role: Role, last: u8) -> NodeDesign {
    NodeDesign {
        name: name.try_into().unwrap(),
        role,
        boot_mac: format!("52:54:00:00:01:{last:02x}").try_into().unwrap(),
        bmc_address: "ipmi://10.0.1.1".to_string().try_into().unwrap(),
        labels: BTreeMap::new(),
        network: None,
        root_device: None,
        kernel_parameters: Default::default(),
        cleaning: Default::default(),
    }
}

/// A runtime of its own, so that dropping it ends every task of the site, as a kill -9 would.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap()
}

async fn provision(site: &SimSite, req: &HostRequest) {
    let (tx, _rx) = mpsc::unbounded_channel();
    site.provision_host(req, tx).await.unwrap();
}

#[test]
fn a_site_killed_mid_provisioning_carries_on_from_its_file_and_provisions_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edge-01.json");
    let nodes = [node("m-1", Role::Master, 1), node("w-1", Role::Worker, 2)];
    let ubuntu = versioned("ubuntu", "22.04", PackageKind::OsImage, 'a');
    let reqs: Vec<HostRequest> = nodes.iter().map(|n| HostRequest::new(n.clone(), &ubuntu)).collect();
    let config = SimConfig::fast();

    // m-1 is provisioned; w-1's provisioning is halfway when the process dies.
    runtime().block_on(async {
        let site = SimSite::with_state_file("edge-01", &nodes, config.clone(), &path).unwrap();
        provision(&site, &reqs[0]).await;
        let w1 = tokio::spawn({
            let (site, req) = (site.clone(), reqs[1].clone());
            async move { provision(&site, &req).await }
        });
        tokio::time::sleep(config.provisioning / 2).await;
        assert_eq!(site.hosts()[1], ("w-1".to_string(), S::Provisioning));
        drop(w1);
    });

    runtime().block_on(async {
        let site = SimSite::with_state_file("edge-01", &nodes, config.clone(), &path).unwrap();
        assert_eq!(site.hosts(), [("m-1".to_string(), S::Provisioned), ("w-1".to_string(), S::Provisioning)]);
        // The redelivered jobs: m-1 is done already, w-1 joins the provisioning under way.
        provision(&site, &reqs[0]).await;
        provision(&site, &reqs[1]).await;
        assert_eq!(site.hosts(), [("m-1".to_string(), S::Provisioned), ("w-1".to_string(), S::Provisioned)]);
        let once = BTreeMap::from([("m-1".to_string(), 1), ("w-1".to_string(), 1)]);
        assert_eq!(site.effects().provisions, once);
        assert_eq!(saved_effects(&path).unwrap().provisions, once);

        let binaries = vec![versioned("kubelet", "1.29.2", PackageKind::Binary, 'b')];
        let req = ClusterRequest { nodes: nodes.to_vec(), binaries, join_existing: false, capi: None };
        site.install_binaries(&req).await.unwrap();
        site.kubeconfig().await.unwrap();
    });

    runtime().block_on(async {
        let site = SimSite::with_state_file("edge-01", &nodes, config.clone(), &path).unwrap();
        let binaries = vec![versioned("kubelet", "1.29.2", PackageKind::Binary, 'b')];
        let req = ClusterRequest { nodes: nodes.to_vec(), binaries, join_existing: false, capi: None };
        site.install_binaries(&req).await.unwrap();
        assert!(site.kubeconfig().await.is_ok(), "the cluster outlives the gateway");
        let effects = site.effects();
        assert_eq!((effects.binary_installs.len(), effects.kubeconfigs_generated), (2, 1));
        assert!(effects.binary_installs.values().all(|n| *n == 1), "{effects:?}");
    });
}

#[test]
fn a_host_that_was_registering_walks_on_and_another_sites_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edge-01.json");
    let nodes = [node("m-1", Role::Master, 1)];
    runtime().block_on(async {
        let site = SimSite::with_state_file("edge-01", &nodes, SimConfig::fast(), &path).unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert_eq!(site.hosts()[0].1, S::Inspecting);
    });
    runtime().block_on(async {
        let site = SimSite::with_state_file("edge-01", &nodes, SimConfig::fast(), &path).unwrap();
        assert_eq!(site.hosts()[0].1, S::Inspecting);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(site.hosts()[0].1, S::Available);
        let other = SimSite::with_state_file("edge-02", &nodes, SimConfig::fast(), &path).unwrap_err();
        assert!(matches!(other, SimStateError::OtherSite { .. }), "{other}");
    });
    std::fs::write(&path, b"{").unwrap();
    let garbage = runtime().block_on(async {
        SimSite::with_state_file("edge-01", &nodes, SimConfig::fast(), &path).map(|_| ()).unwrap_err()
    });
    assert!(matches!(garbage, SimStateError::Parse { .. }), "{garbage}");
}

/// A site of a thousand hosts: each change appends what it changed, the journal is written
/// again whole as it grows, and a restart finds every host and count as they were. A line cut
/// short by a kill is the journal's end; a bad line before the end is refused.
#[test]
fn a_large_site_writes_what_changed_and_reads_back_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edge-01.json");
    let nodes: Vec<NodeDesign> = (0..1000_u32)
        .map(|i| {
            let mut n = node(&format!("w-{i}"), Role::Worker, 0);
            n.boot_mac = format!("52:54:00:00:{:02x}:{:02x}", i / 256, i % 256).try_into().unwrap();
            n
        })
        .collect();
    let ubuntu = versioned("ubuntu", "22.04", PackageKind::OsImage, 'a');
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let started = std::time::Instant::now();
    runtime.block_on(async {
        let site = SimSite::with_state_file("edge-01", &nodes, SimConfig::fast(), &path).unwrap();
        let mut provisions = tokio::task::JoinSet::new();
        for n in &nodes {
            let (site, req) = (site.clone(), HostRequest::new(n.clone(), &ubuntu));
            provisions.spawn(async move { provision(&site, &req).await });
        }
        provisions.join_all().await;
    });
    // Whole, the site is some 300 bytes a host; each of its ~8,000 changes wrote one host's line.
    let size = std::fs::metadata(&path).unwrap().len();
    assert!(size < 4 * 1000 * 400 + (1 << 20), "the journal was not written again whole: {size} bytes");
    println!("1,000 hosts provisioned in {:?}; the journal holds {size} bytes", started.elapsed());

    let check = |path: &std::path::Path| {
        runtime.block_on(async {
            let site = SimSite::with_state_file("edge-01", &nodes, SimConfig::fast(), path).unwrap();
            assert!(site.hosts().iter().all(|(_, s)| *s == S::Provisioned), "{:?}", &site.hosts()[..3]);
            assert_eq!(site.effects().provisions.len(), 1000);
            assert!(site.effects().provisions.values().all(|n| *n == 1));
        });
    };
    check(&path);
    let mut journal = std::fs::read(&path).unwrap();
    let line = br#"{"host":{"name":"w-1","host":null,"counts":{"provisions":9,"binary_installs":0,"patches":0,"patch_failures":0}}}"#;
    journal.extend_from_slice(&line[..40]);
    std::fs::write(&path, &journal).unwrap();
    check(&path);
    journal.extend_from_slice(b"\n");
    journal.extend_from_slice(line);
    std::fs::write(&path, &journal).unwrap();
    let bad = SimSite::with_state_file("edge-01", &nodes, SimConfig::fast(), &path).map(|_| ()).unwrap_err();
    assert!(matches!(bad, SimStateError::Parse { .. }), "{bad}");
}
