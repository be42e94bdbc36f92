//! Site design documents through the real bus and the real CLI: apply, re-apply, diff, show,
//! refusal of a broken design, and an install at a named revision. Also what users are given
//! to start from: every example under `examples/sites`, every example of `docs/src/designs.md`,
//! and what `design init` writes must be what landfall accepts (or, where marked, refuses
//! with exactly the errors shown).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bus_schema::design::{self, Kind, Parsed, Planned};
use bus_schema::domain::{Package, PackageRef, SiteDesign, SiteId};
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
storage: [{ name: root, device: /dev/sda, sizeGb: 480, mount: / }]
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
    // What each host is set up with travels with its node: its interfaces (as its chain
    // resolves them), its addresses and networks, and its root disk.
    let node = |name: &str| effective.nodes.iter().find(|n| n.name.as_str() == name).unwrap();
    let interfaces = |name: &str| -> Vec<(String, String, String)> {
        let network = node(name).network.clone().expect("a network");
        network.interfaces.into_iter().map(|i| (i.name, i.network, i.address)).collect()
    };
    let eno1 = |ip: &str| ("eno1".to_string(), "provisioning".to_string(), ip.to_string());
    assert_eq!(interfaces("node-1"), [eno1("10.1.0.11")], "eno2 removed by '!eno2'");
    assert_eq!(interfaces("node-4"), [eno1("10.1.0.14"), ("eno2".into(), String::new(), String::new())]);
    let networks = node("node-4").network.clone().unwrap().networks;
    assert_eq!(
        networks.iter().map(|n| (n.name.as_str(), n.cidr.as_str())).collect::<Vec<_>>(),
        [("provisioning", "10.1.0.0/24")]
    );
    assert_eq!(node("node-4").kernel_parameters, BTreeMap::from([("isolcpus".to_string(), "2-7".to_string())]));
    assert!(node("node-1").kernel_parameters.is_empty(), "removed by '!isolcpus'");
    let root = node("node-4").root_device.clone().unwrap();
    assert_eq!((root.device_name.as_str(), root.min_size_gigabytes), ("/dev/sda", 480));

    // Identical documents: nothing changes, nothing is published.
    let out = landfall(&url, &["design", "apply", "-f", &file]).await;
    assert!(text(&out.stdout).contains("unchanged"), "{}", text(&out.stdout));
    let same = pb::ApplyDesign {
        site_id: SITE.into(),
        sources: vec![pb::DesignSource { name: "site.yaml".into(), text: design("1.29.2") }],
        expected: None,
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
        expected: None,
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
            expected: None,
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
        bus_schema::names::ALIVE_EVERY,
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

/// The repository's root.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the tests crate is in the workspace").to_path_buf()
}

/// The catalog `landfall up` registers, as design validation reads it.
fn demo_refs() -> BTreeSet<PackageRef> {
    demo_catalog().values().map(Package::reference).collect()
}

/// The catalog `landfall up` registers, as an install reads it.
fn demo_catalog() -> BTreeMap<String, Package> {
    producers::up::demo_packages()
        .into_iter()
        .map(|p| Package::try_from(p).expect("a demo package"))
        .map(|p| (p.reference().key(), p))
        .collect()
}

/// Whether YAML text holds design documents (`kind: …`) rather than a flat site file.
fn is_documents(text: &str) -> bool {
    text.lines().any(|l| l.starts_with("kind:"))
}

/// A flat site file as `site register` reads it, and the check an install makes of its
/// packages against the demo catalog.
fn check_flat(text: &str, source: &str) -> Result<SiteDesign, String> {
    let design = producers::cli::site::parse_site_design(text, source).map_err(|e| format!("error: {e:#}"))?;
    consumers::saga::resolve(&design, &demo_catalog()).map_err(|r| format!("install refused: {}", r.reason))?;
    Ok(design)
}

/// Design documents as `design validate` and `design apply` check them against the demo
/// catalog (the site is their Site document's), and the check an install makes of the
/// effective design.
fn check_documents(sources: &[pb::DesignSource]) -> Result<Planned, String> {
    let mut parsed = Parsed::default();
    for s in sources {
        parsed.read(&s.text, &s.name);
    }
    let site = parsed
        .documents()
        .iter()
        .find(|d| d.kind() == Kind::Site)
        .map(|d| d.name().to_string())
        .ok_or("no readable Site document")?;
    let site = SiteId::try_from(site).map_err(|e| e.to_string())?;
    let planned =
        design::plan(&site, sources, &demo_refs(), None).map_err(|e| producers::cli::design::error_report(&e))?;
    let effective = SiteDesign::try_from(planned.effective.clone()).map_err(|e| e.to_string())?;
    consumers::saga::resolve(&effective, &demo_catalog()).map_err(|r| format!("install refused: {}", r.reason))?;
    Ok(planned)
}

#[test]
fn every_example_site_is_valid_against_the_demo_catalog() {
    let root = repo().join("examples/sites");
    let mut entries: Vec<PathBuf> = std::fs::read_dir(&root).unwrap().map(|e| e.unwrap().path()).collect();
    entries.sort();
    let (mut flat, mut documents, mut failures) = (0, 0, Vec::new());
    for path in entries {
        let name = path.strip_prefix(repo()).unwrap().display().to_string();
        let result = if path.is_dir() {
            documents += 1;
            let sources = producers::cli::design::read_sources(std::slice::from_ref(&path)).unwrap();
            check_documents(&sources).map(drop)
        } else if path.extension().is_some_and(|x| x == "yaml" || x == "yml") {
            let text = std::fs::read_to_string(&path).unwrap();
            if is_documents(&text) {
                documents += 1;
                check_documents(&producers::cli::design::read_sources(std::slice::from_ref(&path)).unwrap()).map(drop)
            } else {
                flat += 1;
                // What `site register -f` reads, from the file itself.
                producers::cli::site::read_site_design(&path)
                    .map_err(|e| format!("error: {e:#}"))
                    .and_then(|_| check_flat(&text, &name).map(drop))
            }
        } else {
            continue;
        };
        if let Err(e) = result {
            failures.push(format!("{name}:\n{e}"));
        }
    }
    assert!(failures.is_empty(), "invalid examples:\n{}", failures.join("\n"));
    assert!(flat >= 1 && documents >= 1, "{flat} flat and {documents} document examples: the walk found too few");
}

/// One example of the design docs: the YAML block after a `<!-- example: … -->` marker, and
/// for `invalid` and `show NODE` the text block after it, what landfall prints.
struct DocExample {
    line: usize,
    marker: String,
    yaml: String,
    expected: Option<String>,
}

/// The examples of a Markdown text, in order.
fn doc_examples(markdown: &str) -> Vec<DocExample> {
    type Lines<'a> = std::iter::Enumerate<std::str::Lines<'a>>;
    /// The body of the fenced block that opens on the next non-empty line, which must be `fence`.
    fn block(lines: &mut Lines<'_>, fence: &str, after: usize) -> String {
        lines
            .by_ref()
            .find(|(_, l)| !l.trim().is_empty())
            .filter(|(_, l)| l.trim() == fence)
            .unwrap_or_else(|| panic!("designs.md:{after}: a {fence} block must follow"));
        lines.by_ref().map(|(_, l)| l).take_while(|l| *l != "```").map(|l| format!("{l}\n")).collect()
    }
    /// The body of the next `text` block, with only prose before it.
    fn text_block(lines: &mut Lines<'_>, after: usize) -> String {
        for (at, l) in lines.by_ref() {
            if l.trim() == "```text" {
                return lines.by_ref().map(|(_, l)| l).take_while(|l| *l != "```").map(|l| format!("{l}\n")).collect();
            }
            assert!(
                !l.starts_with("```"),
                "designs.md:{}: a ```text block must follow the example of line {after}",
                at + 1
            );
        }
        panic!("designs.md:{after}: no ```text block follows");
    }
    let mut examples = Vec::new();
    let mut lines = markdown.lines().enumerate();
    while let Some((at, line)) = lines.next() {
        let Some(marker) = line.strip_prefix("<!-- example: ").and_then(|m| m.strip_suffix(" -->")) else {
            continue;
        };
        let yaml = block(&mut lines, "```yaml", at + 1);
        let expected = (marker != "valid").then(|| text_block(&mut lines, at + 1));
        examples.push(DocExample { line: at + 1, marker: marker.to_string(), yaml, expected });
    }
    examples
}

#[test]
fn every_example_in_the_design_docs_is_what_landfall_does() {
    let markdown = std::fs::read_to_string(repo().join("docs/src/designs.md")).unwrap();
    let examples = doc_examples(&markdown);
    let mut failures = Vec::new();
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for ex in &examples {
        let kind = ex.marker.split_whitespace().next().unwrap_or("");
        *seen.entry(kind).or_default() += 1;
        let documents = is_documents(&ex.yaml);
        let sources = vec![pb::DesignSource { name: "site.yaml".into(), text: ex.yaml.clone() }];
        let problem = match (kind, documents) {
            ("valid", true) => check_documents(&sources).err(),
            ("valid", false) => check_flat(&ex.yaml, "site.yaml").err(),
            ("invalid", _) => {
                let got = if documents {
                    check_documents(&sources).map(drop).err()
                } else {
                    check_flat(&ex.yaml, "site.yaml").map(drop).err()
                };
                match got {
                    None => Some("it is valid".to_string()),
                    Some(got) if Some(got.trim_end()) != ex.expected.as_deref().map(str::trim_end) => {
                        Some(format!("landfall says:\n{got}"))
                    }
                    Some(_) => None,
                }
            }
            ("show", true) => {
                // `show NODE`, or `show NODE at TIME` for the maintenance windows read at TIME.
                let mut words = ex.marker.split_whitespace().skip(1);
                let node = words.next().unwrap_or("");
                let at = match (words.next(), words.next()) {
                    (Some("at"), Some(time)) => Some(bus_schema::window::parse_instant(time).unwrap()),
                    _ => None,
                };
                let mut parsed = Parsed::default();
                parsed.read(&ex.yaml, "site.yaml");
                match (check_documents(&sources), design::resolve_parsed(&parsed)) {
                    (Err(e), _) => Some(e),
                    (_, Err(e)) => Some(format!("{e:?}")),
                    (Ok(_), Ok(site)) => match site.node(node).map(|n| match at {
                        Some(at) => design::render_effective_at(n, at),
                        None => design::render_effective(n),
                    }) {
                        None => Some(format!("no node {node}")),
                        Some(shown) if Some(&shown) != ex.expected.as_ref() => {
                            Some(format!("design show prints:\n{shown}"))
                        }
                        Some(_) => None,
                    },
                }
            }
            _ => Some(format!("unknown marker {:?}", ex.marker)),
        };
        if let Some(problem) = problem {
            failures.push(format!("designs.md:{} ({}):\n{problem}", ex.line, ex.marker));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    for kind in ["valid", "invalid", "show"] {
        assert!(seen.get(kind).copied().unwrap_or(0) >= 2, "too few `{kind}` examples found: {seen:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn design_init_writes_designs_that_validate_and_keeps_what_exists() {
    let dir = tempfile::tempdir().unwrap();
    // No landfall is needed to write a design.
    let url = "nats://127.0.0.1:1";
    for racks in [1u8, 3, 5] {
        let into = dir.path().join(format!("racks-{racks}"));
        let into_arg = into.display().to_string();
        let out = landfall(url, &["design", "init", "--racks", &racks.to_string(), "--dir", &into_arg]).await;
        assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
        let said = text(&out.stdout);
        for next in [format!("landfall design validate -f {into_arg}"), format!("landfall design apply -f {into_arg}")]
        {
            assert!(said.contains(&next), "{next} missing from:\n{said}");
        }
        // The same path as `design validate`: the directory's files, then the shared planner.
        let sources = producers::cli::design::read_sources(std::slice::from_ref(&into)).unwrap();
        assert_eq!(sources.len(), 3, "{racks} racks");
        let planned = check_documents(&sources).unwrap_or_else(|e| panic!("{racks} racks:\n{e}"));
        let masters = if racks >= 3 { 3 } else { 1 };
        assert_eq!(planned.selection.masters.active.len(), masters, "{racks} racks");
        assert_eq!(planned.resolved.nodes.len(), usize::from(racks) * 3, "{racks} racks");
    }

    let into = dir.path().join("racks-3");
    let into_arg = into.display().to_string();
    std::fs::write(into.join("nodes.yaml"), "# mine\n").unwrap();
    let out = landfall(url, &["design", "init", "--dir", &into_arg]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert!(text(&out.stderr).contains("nothing written"), "{}", text(&out.stderr));
    assert_eq!(std::fs::read_to_string(into.join("nodes.yaml")).unwrap(), "# mine\n");
    let out = landfall(url, &["design", "init", "--dir", &into_arg, "--site", "Edge_1"]).await;
    assert!(!out.status.success() && text(&out.stderr).contains("--site"), "{}", text(&out.stderr));
    let out = landfall(url, &["design", "init", "--dir", &into_arg, "--force", "--racks", "2"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(std::fs::read_to_string(into.join("nodes.yaml")).unwrap().contains("name: r2-n3"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_examples_and_a_starter_design_go_through_the_cli_against_the_demo_catalog() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(0).start().await;
    let url = server.url();
    let examples = repo().join("examples/sites");

    let flat = examples.join("small-flat.yaml").display().to_string();
    let out = landfall(&url, &["site", "register", "-f", &flat]).await;
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));

    let racks = examples.join("three-racks").display().to_string();
    let out = landfall(&url, &["design", "validate", "-f", &racks]).await;
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
    assert!(text(&out.stdout).contains("masters r1-n1,r2-n1,r3-n1"), "{}", text(&out.stdout));
    let out = landfall(&url, &["design", "apply", "-f", &racks]).await;
    assert!(text(&out.stdout).contains("applied: edge-racks revision 1"), "{}{}", text(&out.stdout), text(&out.stderr));

    let dir = tempfile::tempdir().unwrap();
    let starter = dir.path().join("design").display().to_string();
    let out = landfall(&url, &["design", "init", "--racks", "5", "--site", "edge-init", "--dir", &starter]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = landfall(&url, &["design", "validate", "-f", &starter]).await;
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
    assert!(!text(&out.stderr).contains("not checking packages"), "checked against the catalog: {}", text(&out.stderr));
    let out = landfall(&url, &["design", "apply", "-f", &starter]).await;
    assert!(text(&out.stdout).contains("applied: edge-init revision 1"), "{}{}", text(&out.stdout), text(&out.stderr));
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_that_does_not_parse_hides_no_node_error_in_the_cli_nor_the_orchestrator() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(0).start().await;
    // `control` does not parse (a list where a role goes); node-1 is on it, node-5 is not.
    let broken = design("1.29.2")
        .replace("name: control\nparent: base\nrole: master\n", "name: control\nparent: base\nrole: [master]\n")
        .replace("bootMac: 52:54:00:10:00:05", "bootMac: 52:54:00:10:00:01")
        .replace("ip: 10.1.0.11 }", "ip: 10.9.0.11 }")
        .replace(
            "addressing: [{ network: provisioning, ip: 10.1.0.16 }]",
            "addressing: [{ network: san, ip: 10.1.0.16 }]",
        );
    let wanted = [
        "HostProfile/control (site.yaml #4): role: invalid type: sequence",
        "Node/node-1 (site.yaml #5): addressing[provisioning].ip: 10.9.0.11 is not in provisioning (10.1.0.0/24)",
        "Node/node-6 (site.yaml #10): addressing[san]: no network named \"san\"",
        "Node/node-6 (site.yaml #10): addressing: no address on provisioning",
        "Node/node-5 (site.yaml #9): bootMac: 52:54:00:10:00:01 is already the boot MAC of Node/node-1 (site.yaml #5)",
    ];
    let unwanted = ["no HostProfile named", "no role", "no node has role master"];

    // Run where the file is, so that errors name it `site.yaml` as the bus's source does.
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "site.yaml", &broken);
    let out = tokio::process::Command::new(landfall_tests::cli::binary())
        .args(["design", "validate", "-f", "site.yaml"])
        .current_dir(dir.path())
        .env("NATS_URL", server.url())
        .output()
        .await
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.starts_with(&format!("the design is invalid ({} errors):\n", wanted.len())), "{err}");
    for line in wanted {
        assert!(err.contains(line), "{line} missing from:\n{err}");
    }
    for line in unwanted {
        assert!(!err.contains(line), "{line} in:\n{err}");
    }

    let cmd = pb::ApplyDesign {
        site_id: SITE.into(),
        sources: vec![pb::DesignSource { name: "site.yaml".into(), text: broken }],
        expected: None,
    };
    let env = Envelope::root();
    fleet.bus.publish_command(&cmd, &env).await.unwrap();
    let r: pb::CommandRejected = fleet.wait_install(&env).await.terminal().delivery.decode().unwrap();
    for line in wanted {
        assert!(r.reason.contains(line), "{line} missing from:\n{}", r.reason);
    }
    for line in unwanted {
        assert!(!r.reason.contains(line), "{line} in:\n{}", r.reason);
    }
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_last_revisions_are_kept_and_an_install_of_a_pruned_one_says_so() {
    let server = NatsServer::start();
    let policy = bus_schema::retention::StorePolicy { design_revisions: 2, ..Default::default() };
    let fleet = Fleet::builder(&server.url()).sites(0).store_policy(policy).start().await;
    let mut last = Envelope::root();
    for tier in ["t1", "t2", "t3", "t4"] {
        last = Envelope::root();
        let text = design("1.29.2").replace("tier: gold", &format!("tier: {tier}"));
        let cmd = pb::ApplyDesign {
            site_id: SITE.into(),
            sources: vec![pb::DesignSource { name: "site.yaml".into(), text }],
            expected: None,
        };
        fleet.bus.publish_command(&cmd, &last).await.unwrap();
    }
    fleet.wait_for(pb::DesignApplied::filter(), &last.id, Duration::from_secs(20)).await.expect("revision 4 applied");
    assert_eq!(latest_revision(&fleet).await.unwrap().revision, 4);
    let kv = fleet.bus.kv(names::SITES_BUCKET).await.unwrap();
    let kept: Vec<bool> = futures::future::join_all((1..=4).map(|r| {
        let kv = kv.clone();
        async move { kv.get::<pb::DesignRevision>(&keys::design_revision(SITE, r)).await.unwrap().is_some() }
    }))
    .await;
    assert_eq!(kept, [false, false, true, true]);

    let env = Envelope::root();
    fleet.bus.publish_command(&pb::InstallSite { site_id: SITE.into(), design_revision: 1 }, &env).await.unwrap();
    let e = fleet.wait_for(names::EVENTS_ALL.to_string(), &env.id, Duration::from_secs(20)).await.expect("refused");
    let refused: pb::CommandRejected = e.delivery.decode().unwrap();
    assert!(refused.reason.contains("revision 1") && refused.reason.contains("pruned"), "{}", refused.reason);
}

/// The three-rack design built by Cluster API, its API served on `endpoint`.
fn capi_design(kubelet: &str, endpoint: &str) -> String {
    let bpa = design(kubelet);
    let at = "  apiNetwork: provisioning\n";
    assert!(bpa.contains(at));
    bpa.replacen(at, &format!("  builder: capi\n  endpoint: {{ host: {endpoint} }}\n{at}"), 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_api_design_is_checked_applied_and_rendered_as_the_gateway_would_apply_it() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(0).start().await;
    let dir = tempfile::tempdir().unwrap();
    let url = server.url();

    // What Cluster API's webhooks would refuse is refused at validate, each with its reason.
    let even = capi_design("1.29.2", "10.1.0.250").replacen(
        "masters: { count: 3, standby: 0",
        "masters: { count: 2, standby: 0",
        1,
    );
    let file = write(dir.path(), "even.yaml", &even);
    let out = landfall(&url, &["design", "validate", "-f", &file]).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr)
            .contains("cluster.masters.count: 2 masters: Cluster API's KubeadmControlPlane refuses an even number"),
        "{}",
        text(&out.stderr)
    );

    let file = write(dir.path(), "site.yaml", &capi_design("1.29.2", "10.1.0.250"));
    let out = landfall(&url, &["design", "validate", "-f", &file]).await;
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
    assert!(text(&out.stdout).contains("built by capi (Cluster API 1.13 + CAPM3 1.13): endpoint 10.1.0.250:6443; masters maxSurge 0, 0 spare; workers maxSurge 0, maxUnavailable 1, 1 spare"), "{}", text(&out.stdout));

    // Offline from the files, and from the hub once applied: the same objects.
    let from_files = landfall(&url, &["design", "render", "-f", &file, "-o", "json"]).await;
    assert!(from_files.status.success(), "{}", text(&from_files.stderr));
    let out = landfall(&url, &["design", "apply", "-f", &file]).await;
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
    let rev = latest_revision(&fleet).await.expect("revision stored");
    let effective = SiteDesign::try_from(rev.effective.unwrap()).unwrap();
    assert!(effective.cluster.is_capi());
    assert_eq!(effective.cluster.workers.spare, 1, "the standby worker is the workers' spare host");
    let from_hub = landfall(&url, &["site", "render", SITE, "-o", "json"]).await;
    assert!(from_hub.status.success(), "{}", text(&from_hub.stderr));
    assert_eq!(text(&from_files.stdout), text(&from_hub.stdout));
    let objects: Vec<serde_json::Value> = serde_json::from_slice(&from_hub.stdout).unwrap();
    let kinds: Vec<&str> = objects.iter().map(|o| o["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "Cluster",
            "Metal3Cluster",
            "Metal3DataTemplate",
            "Metal3MachineTemplate",
            "KubeadmControlPlane",
            "KubeadmConfigTemplate",
            "Metal3MachineTemplate",
            "MachineDeployment"
        ]
    );
    let ubuntu = fleet.catalog.iter().find(|p| p.name == "ubuntu").expect("the fleet's os-image");
    assert_eq!(
        objects[3]["spec"]["template"]["spec"]["image"]["checksum"],
        ubuntu.sha256.as_str(),
        "the catalog's image"
    );
    assert_eq!(objects[4]["spec"]["replicas"], 3);
    assert_eq!(objects[7]["spec"]["replicas"], 2);
    assert_eq!(objects[7]["spec"]["template"]["spec"]["version"], "v1.29.2");

    // The YAML a person reviews: one document per object, as kubectl reads them.
    let yaml =
        landfall(&url, &["site", "render", SITE, "--namespace", "edge", "--image-base-url", "http://cache:8080"]).await;
    assert!(yaml.status.success(), "{}", text(&yaml.stderr));
    let yaml = text(&yaml.stdout);
    assert_eq!(yaml.matches("---\n").count(), 8, "{yaml}");
    assert!(yaml.contains("namespace: edge") && yaml.contains("http://cache:8080/sha256/"), "{yaml}");

    // A BPA site has nothing to render, and says so.
    let bpa = write(dir.path(), "bpa.yaml", &design("1.29.2").replace(SITE, "bpa-site"));
    let out = landfall(&url, &["design", "render", "-f", &bpa]).await;
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("site bpa-site is built by the BPA, not Cluster API"), "{}", text(&out.stderr));
    fleet.stop().await;
}
