//! `landfall design init`: a starting design to edit, written as the three files a design is
//! usually kept in. What it writes validates against the demo catalog of `landfall up`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use bus_schema::domain::SiteId;
use clap::Args;

#[derive(Debug, Args)]
pub struct InitArgs {
    /// How many racks: three nodes each, a master in each of the first three (one master in
    /// all with fewer than three racks).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(1..=100))]
    pub racks: u8,
    /// The directory to write the design into.
    #[arg(long, default_value = "design")]
    pub dir: PathBuf,
    /// The site's name: lowercase letters, digits and '-'. (Not one of `landfall up`'s demo
    /// sites, edge-01 and on, whose designs applying this would replace.)
    #[arg(long, default_value = "my-site")]
    pub site: String,
    /// Overwrite the design's files if they exist.
    #[arg(long)]
    pub force: bool,
}

/// Nodes per rack.
const NODES_PER_RACK: u8 = 3;

/// One file of the starting design.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StarterFile {
    /// The file's name in the design directory.
    pub name: &'static str,
    /// What it holds, in a few words.
    pub about: String,
    /// Its text.
    pub text: String,
}

/// The starting design of `site` over `racks` racks: `site.yaml`, `profiles.yaml` and
/// `nodes.yaml`, commented where a user edits.
pub fn starter(site: &SiteId, racks: u8) -> Vec<StarterFile> {
    let racks = racks.max(1);
    let masters = if racks >= 3 { 3 } else { 1 };
    let nodes = u32::from(racks) * u32::from(NODES_PER_RACK);
    let workers = nodes - masters;
    vec![
        StarterFile {
            name: "site.yaml",
            about: format!("the site {site}: its networks, and a cluster of {masters} masters and {workers} workers"),
            text: site_file(site, masters, workers),
        },
        StarterFile {
            name: "profiles.yaml",
            about: "a hardware profile and the host profiles base < master, base < worker".to_string(),
            text: profiles_file(),
        },
        StarterFile {
            name: "nodes.yaml",
            about: format!("{nodes} nodes over {racks} racks, a master in each of the first {masters}"),
            text: nodes_file(racks, masters),
        },
    ]
}

fn site_file(site: &SiteId, masters: u32, workers: u32) -> String {
    format!(
        r#"# The site: its name, networks, and how its Kubernetes cluster is formed.
# Check it with `landfall design validate -f DIR`; docs/src/designs.md describes every field.
kind: Site
name: {site}                  # the site's id: lowercase letters, digits and '-'
region: eu-west               # optional; becomes the site's `region` label
labels: {{ tier: standard }}    # optional site labels
networks:
  # Every network a node has an address on, or an interface is attached to.
  # Change the ranges to yours; every node address must fall inside its network.
  - {{ name: provisioning, cidr: 10.10.0.0/16 }}
  - {{ name: oob, cidr: 10.11.0.0/16 }}
cluster:
  apiNetwork: provisioning    # the Kubernetes API is served here; every node needs an address on it
  # Masters: nodes with role master (the `master` host profile) and hw=standard,
  # at most one per rack. Keep the count odd (1, 3, 5) for etcd.
  masters: {{ count: {masters}, standby: 0, selector: {{ hw: standard }}, topologyKey: rack }}
  # Workers: nodes with role worker. `standby` holds more nodes ready, outside the cluster.
  workers: {{ count: {workers}, standby: 0 }}
"#
    )
}

fn profiles_file() -> String {
    let mut packages = String::new();
    for p in crate::run::demo::demo_packages() {
        let _ = writeln!(packages, "  - {{ name: {}, version: \"{}\" }}", p.name, p.version);
    }
    format!(
        r#"# What the machines are (HardwareProfile) and how they are set up (HostProfile).
# A node takes its hardware profile, then each host profile from the root down to its own,
# then what the Node itself says: a later layer's value wins, lists merge by name and maps by
# key, and '!name' removes an inherited entry.
kind: HardwareProfile
name: standard
labels: {{ hw: standard }}        # the masters' selector in site.yaml matches this label
interfaces:
  - {{ name: eno1, network: provisioning, mtu: 9000 }}
  - {{ name: eno2 }}               # not attached to any network yet
storage:
  - {{ name: root, device: /dev/sda, sizeGb: 480, mount: / }}
---
# The root host profile: what every node runs.
kind: HostProfile
name: base
hardwareProfile: standard
role: worker
packages:
  # The versions must be in landfall's package catalog (`landfall package list`);
  # these are the ones `landfall up` registers.
{packages}kernelParameters: {{ transparent_hugepage: never }}
---
kind: HostProfile
name: master
parent: base
role: master                      # overrides base's role
interfaces: ['!eno2']             # removes eno2, inherited from the hardware profile
---
kind: HostProfile
name: worker
parent: base
labels: {{ pool: general }}
kernelParameters: {{ isolcpus: 2-7 }}   # added to base's
"#
    )
}

fn nodes_file(racks: u8, masters: u32) -> String {
    let mut out = String::from(
        "# One document per machine. Put in each node's real boot MAC and BMC address;\n\
         # `rack` also becomes the node's `rack` label, which spreads the masters.\n",
    );
    for rack in 1..=racks {
        for n in 1..=NODES_PER_RACK {
            let master = n == 1 && u32::from(rack) <= masters;
            let profile = if master { "master" } else { "worker" };
            let _ = write!(
                out,
                "---\nkind: Node\nname: r{rack}-n{n}\nhostProfile: {profile}\nrack: r{rack}\n\
                 bootMac: 52:54:00:00:{rack:02x}:{n:02x}\n\
                 bmc: {{ address: ipmi://10.11.{rack}.{bmc}, credentialsRef: bmc-r{rack}-n{n} }}\n\
                 addressing:\n  - {{ network: provisioning, ip: 10.10.{rack}.{ip} }}\n",
                bmc = 100 + u16::from(n),
                ip = 10 + u16::from(n),
            );
        }
    }
    out
}

/// Writes the starting design into `args.dir` and says what comes next.
pub fn run(args: &InitArgs) -> anyhow::Result<ExitCode> {
    let site = SiteId::try_from(args.site.as_str()).context("--site")?;
    let files = starter(&site, args.racks);
    write(&args.dir, &files, args.force)?;
    let dir = args.dir.display();
    for file in &files {
        println!("wrote {}  ({})", args.dir.join(file.name).display(), file.about);
    }
    println!("\nedit them (docs/src/designs.md has every field), then:");
    println!("  landfall design validate -f {dir}     check the design, against the catalog when landfall is running");
    println!("  landfall design show r1-n1 -f {dir}   one node as its profiles make it");
    println!("  landfall design apply -f {dir}        store it as the site's next revision");
    Ok(ExitCode::SUCCESS)
}

/// Writes `files` into `dir`, creating it; refuses, writing nothing, when any of them exists
/// and `force` is not set.
pub fn write(dir: &Path, files: &[StarterFile], force: bool) -> anyhow::Result<()> {
    let existing: Vec<String> =
        files.iter().map(|f| dir.join(f.name)).filter(|p| p.exists()).map(|p| p.display().to_string()).collect();
    if !existing.is_empty() && !force {
        bail!(
            "{} already exist{}; nothing written (--force overwrites)",
            existing.join(", "),
            match existing.len() {
                1 => "s",
                _ => "",
            }
        );
    }
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    for file in files {
        let path = dir.join(file.name);
        std::fs::write(&path, &file.text).with_context(|| format!("write {}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bus_schema::design;
    use bus_schema::domain::PackageRef;
    use bus_schema::pb;
    use std::collections::BTreeSet;

    fn demo_catalog() -> BTreeSet<PackageRef> {
        crate::run::demo::demo_packages()
            .into_iter()
            .map(|p| PackageRef::try_from(pb::PackageRef { name: p.name, version: p.version }).unwrap())
            .collect()
    }

    fn sources(files: &[StarterFile]) -> Vec<pb::DesignSource> {
        files.iter().map(|f| pb::DesignSource { name: f.name.to_string(), text: f.text.clone() }).collect()
    }

    #[test]
    fn every_rack_count_makes_a_valid_design_with_a_master_per_rack() {
        let site = SiteId::try_from("edge-01").unwrap();
        for (racks, masters) in [(1, 1), (2, 1), (3, 3), (5, 3), (100, 3)] {
            let planned = design::plan(&site, &sources(&starter(&site, racks)), &demo_catalog(), None)
                .unwrap_or_else(|e| panic!("{racks} racks: {e:#?}"));
            let nodes = usize::from(racks) * 3;
            assert_eq!(planned.effective.nodes.len(), nodes, "{racks} racks");
            let chosen = &planned.selection.masters.active;
            assert_eq!(chosen.len(), masters, "{racks} racks");
            let racks_of: BTreeSet<_> =
                chosen.iter().map(|n| planned.resolved.node(n.as_str()).unwrap().rack.clone()).collect();
            assert_eq!(racks_of.len(), masters, "one master per rack: {chosen:?}");
            assert_eq!(planned.selection.workers.active.len(), nodes - masters);
        }
    }

    #[test]
    fn existing_files_are_kept_unless_forced() {
        let dir = tempfile::tempdir().unwrap();
        let site = SiteId::try_from("edge-01").unwrap();
        write(dir.path(), &starter(&site, 1), false).unwrap();
        std::fs::write(dir.path().join("nodes.yaml"), "mine").unwrap();
        let err = write(dir.path(), &starter(&site, 3), false).unwrap_err().to_string();
        assert!(err.contains("site.yaml, ") && err.contains("nothing written"), "{err}");
        assert_eq!(std::fs::read_to_string(dir.path().join("nodes.yaml")).unwrap(), "mine");
        write(dir.path(), &starter(&site, 3), true).unwrap();
        assert!(std::fs::read_to_string(dir.path().join("nodes.yaml")).unwrap().contains("name: r3-n3"));
    }
}
