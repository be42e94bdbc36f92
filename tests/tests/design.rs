//! Site design documents through the real bus and the real CLI: apply, re-apply, diff, show,
//! refusal of a broken design, and an install at a named revision.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bus_schema::domain::SiteDesign;
use bus_schema::names::{self, keys};
use bus_schema::pb::{self, BusEvent, BusMessage};
use bus_schema::runtime::Envelope;
use landfall_tests::cli::{landfall, text};
use landfall_tests::fleet::Fleet;
use landfall_tests::nats::NatsServer;
use site_gateway::sim::{SimConfig, SimSite};

const SITE: &str = "rack-site";

/// Three racks, two levels of host profiles over a hardware profile, six nodes.
fn design(kubelet: &str) -> String {
    let mut docs = vec![
        format!(
            r#"kind: Site
name: {SITE}
region: eu-west
labels: {{ tier: gold }}
networks: [{{ name: provisioning, cidr: 10.1.0.0/24 }}]
cluster:
  apiNetwork: provisioning
  masters: {{ count: 3, standby: 0, selector: {{}}, topologyKey: rack }}
  workers: {{ count: 2, standby: 1, selector: {{}}, topologyKey: "" }}
"#
        ),
        r#"kind: HardwareProfile
name: r640
labels: { hw: r640 }
interfaces: [{ name: eno1, network: provisioning }, { name: eno2 }]
"#
        .to_string(),
        format!(
            r#"kind: HostProfile
name: base
hardwareProfile: r640
role: worker
packages: [{{ name: ubuntu, version: "22.04.4" }}, {{ name: containerd, version: 1.7.13 }}, {{ name: kubelet, version: {kubelet} }}]
kernelParameters: {{ isolcpus: 2-7 }}
"#
        ),
        r#"kind: HostProfile
name: control
parent: base
role: master
interfaces: ['!eno2']
kernelParameters: { '!isolcpus': ~ }
"#
        .to_string(),
    ];
    for n in 1..=6u8 {
        let (profile, rack) = if n <= 3 { ("control", n) } else { ("base", n - 3) };
        docs.push(format!(
            "kind: Node\nname: node-{n}\nhostProfile: {profile}\nbootMac: 52:54:00:10:00:{n:02x}\n\
             bmc: {{ address: ipmi://10.0.0.{n}, credentialsRef: bmc-node-{n} }}\nrack: r{rack}\n\
             addressing: [{{ network: provisioning, ip: 10.1.0.{} }}]\n",
            10 + u16::from(n)
        ));
    }
    docs.join("---\n")
}

fn write(dir: &Path, name: &str, body: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, body).unwrap();
    path.display().to_string()
}

async fn latest_revision(fleet: &Fleet) -> Option<pb::DesignRevision> {
    let kv = fleet.bus.kv(names::SITES_BUCKET).await.unwrap();
    kv.get::<pb::DesignRevision>(&keys::design_latest(SITE)).await.unwrap().map(|(r, _)| r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_rack_design_applies_once_shows_origins_and_diffs() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(0).start().await;
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "site.yaml", &design("1.29.2"));
    let url = server.url();

    let out = landfall(&url, &["design", "validate", "-f", &file]).await;
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
    assert!(text(&out.stdout).contains("masters node-1,node-2,node-3"), "{}", text(&out.stdout));

    let out = landfall(&url, &["design", "apply", "-f", &file]).await;
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
    assert!(text(&out.stdout).contains("revision 1"), "{}", text(&out.stdout));
    let rev = latest_revision(&fleet).await.expect("revision stored");
    assert_eq!(rev.masters, ["node-1", "node-2", "node-3"], "one master per rack");
    assert_eq!(rev.workers, ["node-4", "node-5"]);
    assert_eq!(rev.standby_workers, ["node-6"]);
    let effective = SiteDesign::try_from(rev.effective.clone().unwrap()).unwrap();
    assert_eq!(effective.nodes.len(), 5, "standby nodes wait outside the cluster");
    assert!(effective.nodes.iter().all(|n| n.labels.contains_key("rack")));

    // Identical documents: nothing changes, nothing is published.
    let out = landfall(&url, &["design", "apply", "-f", &file]).await;
    assert!(text(&out.stdout).contains("unchanged"), "{}", text(&out.stdout));
    let same = pb::ApplyDesign {
        site_id: SITE.into(),
        sources: vec![pb::DesignSource { name: "site.yaml".into(), text: design("1.29.2") }],
    };
    let env = Envelope::root();
    fleet.bus.publish_command(&same, &env).await.unwrap();
    // A command for the same site published after it is handled after it: once it is done, so is ours.
    let probe = Envelope::root();
    fleet.bus.publish_command(&pb::InstallSite { site_id: SITE.into(), design_revision: 99 }, &probe).await.unwrap();
    fleet.wait_install(&probe).await;
    assert!(fleet.wait_for(pb::DesignApplied::filter(), &env.id, Duration::from_millis(500)).await.is_none());
    assert_eq!(latest_revision(&fleet).await.unwrap().revision, 1);

    // What the supporting services need: the API load balancer's backends and the inventory.
    let out = landfall(&url, &["design", "cluster", "-f", &file]).await;
    let cluster = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for backend in ["node-1 10.1.0.11:6443", "node-2 10.1.0.12:6443", "node-3 10.1.0.13:6443"] {
        assert!(cluster.contains(backend), "{backend}: {cluster}");
    }
    assert!(cluster.contains("[kube-master]\nnode-1\nnode-2\nnode-3\n"), "{cluster}");
    assert!(cluster.contains("[kube-node]\nnode-4\nnode-5\n"), "{cluster}");
    assert!(cluster.contains("workers  node-4,node-5 (standby node-6)"), "{cluster}");

    // Where each value came from.
    let out = landfall(&url, &["design", "show", "node-1", "--effective", "-f", &file]).await;
    let shown = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(shown.contains("HostProfile/control"), "{shown}");
    assert!(shown.contains("HostProfile/base"), "{shown}");
    assert!(!shown.contains("eno2"), "removed by '!eno2': {shown}");
    assert!(!shown.contains("isolcpus"), "removed by '!isolcpus': {shown}");

    // A new kubelet: the diff names what changes, and applying it makes revision 2.
    let file2 = write(dir.path(), "site-v2.yaml", &design("1.30.0"));
    fleet
        .bus
        .publish_command(&pb::RegisterPackage { package: Some(kubelet_1_30()), auto_rollout: None }, &Envelope::root())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let out = landfall(&url, &["design", "diff", "-f", &file2]).await;
    assert!(
        text(&out.stdout).contains("revision 1 -> 2") && text(&out.stdout).contains("~ site packages"),
        "{}",
        text(&out.stdout)
    );
    let out = landfall(&url, &["design", "apply", "-f", &file2]).await;
    assert!(text(&out.stdout).contains("revision 2"), "{}{}", text(&out.stdout), text(&out.stderr));
    fleet.stop().await;
}

fn kubelet_1_30() -> pb::Package {
    let mut p = producers::up::demo_packages().into_iter().find(|p| p.name == "kubelet").unwrap();
    p.version = "1.30.0".into();
    p.sha256 = "ab".repeat(32);
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_design_is_refused_whole_with_every_error_named() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(0).start().await;
    let broken = design("9.9.9")
        .replace("ipmi://10.0.0.2", "telnet://10.0.0.2")
        .replace("bootMac: 52:54:00:10:00:03", "bootMac: 52:54:00:10:00:01")
        .replace("parent: base", "parent: basis");

    // Through the CLI: checked before anything is sent.
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "site.yaml", &broken);
    let out = landfall(&server.url(), &["design", "apply", "-f", &file]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    for needle in ["telnet", "52:54:00:10:00:01", "basis", "9.9.9", "Node/node-2"] {
        assert!(err.contains(needle), "{needle} missing from:\n{err}");
    }

    // Through the bus, as another client would: rejected with every reason, nothing stored.
    let cmd = pb::ApplyDesign {
        site_id: SITE.into(),
        sources: vec![pb::DesignSource { name: "site.yaml".into(), text: broken }],
    };
    let env = Envelope::root();
    fleet.bus.publish_command(&cmd, &env).await.unwrap();
    let rejected = fleet.wait_install(&env).await;
    let r: pb::CommandRejected = rejected.terminal().delivery.decode().unwrap();
    assert_eq!(r.code, pb::RejectCode::Invalid as i32);
    assert!(r.reason.lines().count() >= 5, "{}", r.reason);
    assert!(latest_revision(&fleet).await.is_none(), "nothing applied");
    let sites = fleet.bus.kv(names::SITES_BUCKET).await.unwrap();
    assert!(sites.get::<pb::SiteDesign>(&keys::site(SITE)).await.unwrap().is_none());
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_install_uses_the_design_at_the_revision_it_names() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(0).start().await;
    fleet
        .bus
        .publish_command(&pb::RegisterPackage { package: Some(kubelet_1_30()), auto_rollout: None }, &Envelope::root())
        .await
        .unwrap();
    let mut last = Envelope::root();
    for kubelet in ["1.29.2", "1.30.0"] {
        last = Envelope::root();
        let cmd = pb::ApplyDesign {
            site_id: SITE.into(),
            sources: vec![pb::DesignSource { name: "site.yaml".into(), text: design(kubelet) }],
        };
        fleet.bus.publish_command(&cmd, &last).await.unwrap();
    }
    fleet.wait_for(pb::DesignApplied::filter(), &last.id, Duration::from_secs(20)).await.expect("revision 2 applied");
    assert_eq!(latest_revision(&fleet).await.unwrap().revision, 2);

    // A gateway over a simulated site built from the effective design.
    let sites = fleet.bus.kv(names::SITES_BUCKET).await.unwrap();
    let (effective, _) = sites.get::<pb::SiteDesign>(&keys::site(SITE)).await.unwrap().unwrap();
    let effective = SiteDesign::try_from(effective).unwrap();
    let backend = Arc::new(SimSite::new(SITE, &effective.nodes, SimConfig::instant()));
    tokio::spawn(site_gateway::run_gateway(
        effective.site.clone(),
        fleet.bus.clone(),
        backend,
        fleet.cache_for(effective.site.as_str()),
        Default::default(),
    ));

    let cmd = Envelope::root();
    let install = pb::InstallSite { site_id: SITE.into(), design_revision: 1 };
    fleet.bus.publish_command(&install, &cmd).await.unwrap();
    let run = fleet.wait_install(&cmd).await;
    assert_eq!(run.terminal().delivery.type_name, pb::SiteInstalled::TYPE);
    let binaries = run.of_type::<pb::NodeBinariesInstalled>();
    assert_eq!(binaries.len(), 5);
    assert!(
        binaries[0].binaries.iter().any(|b| b.name == "kubelet" && b.version == "1.29.2"),
        "{:?}",
        binaries[0].binaries
    );

    let missing = Envelope::root();
    fleet.bus.publish_command(&pb::InstallSite { site_id: SITE.into(), design_revision: 7 }, &missing).await.unwrap();
    let r: pb::CommandRejected = fleet.wait_install(&missing).await.terminal().delivery.decode().unwrap();
    assert!(r.reason.contains("no design revision 7"), "{}", r.reason);
    fleet.stop().await;
}
