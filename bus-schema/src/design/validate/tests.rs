//! The rules of [`super`], each broken once by a case of a valid base design.

use super::*;
use crate::design::document::parse_documents;
use crate::design::fixtures::catalog;

/// A valid design; each case below breaks one rule of it.
const BASE: &str = r#"kind: Site
name: edge-01
networks:
  - { name: provisioning, cidr: 10.1.0.0/24 }
  - { name: oob, cidr: 10.0.0.0/24 }
cluster:
  apiNetwork: provisioning
  masters: { count: 1 }
  workers: { count: 1 }
---
kind: HardwareProfile
name: r640
interfaces: [{ name: eno1, network: provisioning }]
---
kind: HostProfile
name: base
hardwareProfile: r640
role: worker
packages: [{ name: ubuntu, version: "22.04" }]
---
kind: HostProfile
name: control
parent: base
role: master
---
kind: Node
name: node-1
hostProfile: control
bootMac: 52:54:00:00:01:01
bmc: { address: ipmi://10.0.0.1 }
addressing: [{ network: provisioning, ip: 10.1.0.11 }]
---
kind: Node
name: node-2
hostProfile: base
bootMac: 52:54:00:00:01:02
bmc: { address: ipmi://10.0.0.2 }
addressing: [{ network: provisioning, ip: 10.1.0.12 }]
"#;

/// How a case breaks the base design.
enum Change {
    /// Replace the first occurrence of a text of the base design.
    Replace(&'static str, &'static str),
    /// Add documents, read from `<case name>.yaml`.
    Add(&'static str),
}

/// One broken rule and the one error it must produce.
struct Case {
    name: &'static str,
    change: Change,
    document: &'static str,
    field: &'static str,
    reason: &'static str,
}

/// A node of an added document: `Node/<name>` on `profile` with one provisioning address.
macro_rules! node {
    ($name:literal, $profile:literal, $mac:literal, $bmc:literal, $addressing:literal) => {
        concat!(
            "kind: Node\nname: ",
            $name,
            "\nhostProfile: ",
            $profile,
            "\nbootMac: ",
            $mac,
            "\nbmc: { address: ",
            $bmc,
            " }\naddressing: ",
            $addressing,
            "\n"
        )
    };
}

const CASES: &[Case] = &[
    Case {
        name: "duplicate-mac",
        change: Change::Replace("bootMac: 52:54:00:00:01:02", "bootMac: 52-54-00-00-01-01"),
        document: "Node/node-2 (site.yaml #6)",
        field: "bootMac",
        reason: "52:54:00:00:01:01 is already the boot MAC of Node/node-1 (site.yaml #5)",
    },
    Case {
        name: "duplicate-ip",
        change: Change::Replace("ip: 10.1.0.12", "ip: 10.1.0.11"),
        document: "Node/node-2 (site.yaml #6)",
        field: "addressing[provisioning].ip",
        reason: "10.1.0.11 is already used by Node/node-1 (site.yaml #5) on provisioning",
    },
    Case {
        name: "duplicate-hostname",
        change: Change::Add(node!(
            "node-1",
            "base",
            "52:54:00:00:01:09",
            "ipmi://10.0.0.9",
            "[{ network: provisioning, ip: 10.1.0.19 }]"
        )),
        document: "Node/node-1 (duplicate-hostname.yaml #1)",
        field: "name",
        reason: "hostname node-1 is already used by Node/node-1 (site.yaml #5)",
    },
    Case {
        name: "hostname-not-a-dns-label",
        change: Change::Add(node!(
            "Node_3",
            "base",
            "52:54:00:00:01:03",
            "ipmi://10.0.0.3",
            "[{ network: provisioning, ip: 10.1.0.13 }]"
        )),
        document: "Node/Node_3 (hostname-not-a-dns-label.yaml #1)",
        field: "name",
        reason: "\"Node_3\" must be lowercase letters, digits and '-', not starting or ending with '-'",
    },
    Case {
        name: "unknown-parent",
        change: Change::Add("kind: HostProfile\nname: orphan\nparent: nope\n"),
        document: "HostProfile/orphan (unknown-parent.yaml #1)",
        field: "parent",
        reason: "no HostProfile named \"nope\"",
    },
    Case {
        name: "unknown-hardware-profile",
        change: Change::Add("kind: HostProfile\nname: odd\nparent: base\nhardwareProfile: r999\n"),
        document: "HostProfile/odd (unknown-hardware-profile.yaml #1)",
        field: "hardwareProfile",
        reason: "no HardwareProfile named \"r999\"",
    },
    Case {
        name: "unknown-host-profile",
        change: Change::Add(node!(
            "node-4",
            "missing",
            "52:54:00:00:01:04",
            "ipmi://10.0.0.4",
            "[{ network: provisioning, ip: 10.1.0.14 }]"
        )),
        document: "Node/node-4 (unknown-host-profile.yaml #1)",
        field: "hostProfile",
        reason: "no HostProfile named \"missing\"",
    },
    Case {
        name: "inheritance-cycle",
        change: Change::Add(
            "kind: HostProfile\nname: loop-b\nparent: loop-a\n---\nkind: HostProfile\nname: loop-a\nparent: loop-b\n",
        ),
        document: "HostProfile/loop-a (inheritance-cycle.yaml #2)",
        field: "parent",
        reason: "inheritance cycle: loop-a -> loop-b -> loop-a",
    },
    Case {
        name: "interface-on-unknown-network",
        change: Change::Add(
            "kind: HostProfile\nname: storage\nparent: base\ninterfaces: [{ name: eno3, network: san }]\n",
        ),
        document: "HostProfile/storage (interface-on-unknown-network.yaml #1)",
        field: "interfaces[eno3].network",
        reason: "no network named \"san\" in Site/edge-01 (it has provisioning, oob)",
    },
    Case {
        name: "address-on-unknown-network",
        change: Change::Replace(
            "addressing: [{ network: provisioning, ip: 10.1.0.11 }]",
            "addressing: [{ network: provisioning, ip: 10.1.0.11 }, { network: san, ip: 10.9.0.11 }]",
        ),
        document: "Node/node-1 (site.yaml #5)",
        field: "addressing[san]",
        reason: "no network named \"san\" in Site/edge-01 (it has provisioning, oob)",
    },
    Case {
        name: "address-outside-its-network",
        change: Change::Add(node!(
            "node-5",
            "base",
            "52:54:00:00:01:05",
            "ipmi://10.0.0.5",
            "[{ network: provisioning, ip: 10.2.0.15 }]"
        )),
        document: "Node/node-5 (address-outside-its-network.yaml #1)",
        field: "addressing[provisioning].ip",
        reason: "10.2.0.15 is not in provisioning (10.1.0.0/24)",
    },
    Case {
        name: "no-address-on-the-api-network",
        change: Change::Add(node!(
            "node-6",
            "base",
            "52:54:00:00:01:06",
            "ipmi://10.0.0.6",
            "[{ network: oob, ip: 10.0.0.106 }]"
        )),
        document: "Node/node-6 (no-address-on-the-api-network.yaml #1)",
        field: "addressing",
        reason: "no address on provisioning, the cluster's API network: every node needs one",
    },
    Case {
        name: "node-without-role",
        change: Change::Add(concat!(
            "kind: HostProfile\nname: roleless\nparent: base\nrole: '!'\n---\n",
            node!(
                "node-7",
                "roleless",
                "52:54:00:00:01:07",
                "ipmi://10.0.0.7",
                "[{ network: provisioning, ip: 10.1.0.17 }]"
            )
        )),
        document: "Node/node-7 (node-without-role.yaml #2)",
        field: "role",
        reason: "no role: HostProfile/roleless clears it",
    },
    Case {
        name: "site-without-master",
        change: Change::Replace("role: master", "role: worker"),
        document: "Site/edge-01 (site.yaml #1)",
        field: "nodes",
        reason: "no node has role master: a site needs at least one",
    },
    Case {
        name: "cluster-without-master",
        change: Change::Replace("masters: { count: 1 }", "masters: { count: 0 }"),
        document: "Site/edge-01 (site.yaml #1)",
        field: "cluster.masters.count",
        reason: "a site needs at least one master",
    },
    Case {
        name: "network-defined-twice",
        change: Change::Replace(
            "  - { name: oob, cidr: 10.0.0.0/24 }\n",
            "  - { name: oob, cidr: 10.0.0.0/24 }\n  - { name: oob, cidr: 10.3.0.0/24 }\n",
        ),
        document: "Site/edge-01 (site.yaml #1)",
        field: "networks[oob]",
        reason: "this network is defined twice",
    },
    Case {
        name: "version-not-in-catalog",
        change: Change::Add(
            "kind: HostProfile\nname: newer\nparent: base\npackages: [{ name: kubelet, version: 9.9.9 }]\n",
        ),
        document: "HostProfile/newer (version-not-in-catalog.yaml #1)",
        field: "packages[kubelet]",
        reason: "kubelet@9.9.9 is not in the catalog, which has kubelet 1.29.1, 1.30.0",
    },
    Case {
        name: "package-not-in-catalog",
        change: Change::Add(
            "kind: HostProfile\nname: extra\nparent: base\npackages: [{ name: htop, version: \"3.3\" }]\n",
        ),
        document: "HostProfile/extra (package-not-in-catalog.yaml #1)",
        field: "packages[htop]",
        reason: "htop@3.3 is not in the catalog, which has no version of htop",
    },
    Case {
        name: "bmc-scheme-metal3-does-not-know",
        change: Change::Add(node!(
            "node-8",
            "base",
            "52:54:00:00:01:08",
            "telnet://10.0.0.8",
            "[{ network: provisioning, ip: 10.1.0.18 }]"
        )),
        document: "Node/node-8 (bmc-scheme-metal3-does-not-know.yaml #1)",
        field: "bmc.address",
        reason: "scheme \"telnet\" is not one Metal3 knows (ipmi, libvirt, redfish,",
    },
    Case {
        name: "malformed-mac",
        change: Change::Add(node!(
            "node-9",
            "base",
            "52:54:00:00:09",
            "ipmi://10.0.0.9",
            "[{ network: provisioning, ip: 10.1.0.29 }]"
        )),
        document: "Node/node-9 (malformed-mac.yaml #1)",
        field: "bootMac",
        reason: "\"52:54:00:00:09\" is not a MAC address (aa:bb:cc:dd:ee:ff)",
    },
    Case {
        name: "port-in-two-bonds",
        change: Change::Add(concat!(
            "kind: HostProfile\nname: bonded\nparent: base\ninterfaces: [{ name: eno2 }, { name: eno3 },\n",
            "  { name: bond0, bond: { members: [eno2, eno3] } }, { name: bond1, bond: { members: [eno3] } }]\n---\n",
            node!(
                "node-10",
                "bonded",
                "52:54:00:00:01:0a",
                "ipmi://10.0.0.10",
                "[{ network: provisioning, ip: 10.1.0.20 }]"
            )
        )),
        document: "HostProfile/bonded (port-in-two-bonds.yaml #1)",
        field: "interfaces[bond1].bond.members",
        reason: "eno3 is a member of bond0 already: a port joins one bond at most",
    },
    Case {
        name: "vlan-on-a-missing-parent",
        change: Change::Add(concat!(
            "kind: HostProfile\nname: tagged\nparent: base\n",
            "interfaces: [{ name: eno9.100, vlan: { id: 100, parent: eno9 }, network: oob }]\n---\n",
            node!(
                "node-11",
                "tagged",
                "52:54:00:00:01:0b",
                "ipmi://10.0.0.11",
                "[{ network: provisioning, ip: 10.1.0.21 }]"
            )
        )),
        document: "HostProfile/tagged (vlan-on-a-missing-parent.yaml #1)",
        field: "interfaces[eno9.100].vlan.parent",
        reason: "no interface named \"eno9\" to carry VLAN 100",
    },
    Case {
        name: "kernel-parameter-a-command-line-cannot-take",
        change: Change::Add(concat!(
            "kind: HostProfile\nname: tuned\nparent: base\nkernelParameters: { console: \"ttyS0 $(reboot)\" }\n---\n",
            node!(
                "node-12",
                "tuned",
                "52:54:00:00:01:0c",
                "ipmi://10.0.0.12",
                "[{ network: provisioning, ip: 10.1.0.22 }]"
            )
        )),
        document: "HostProfile/tuned (kernel-parameter-a-command-line-cannot-take.yaml #1)",
        field: "kernelParameters[console]",
        reason: "\"ttyS0 $(reboot)\" has characters a kernel command line cannot take as they are",
    },
    Case {
        name: "unknown-api-network",
        change: Change::Replace("apiNetwork: provisioning", "apiNetwork: public"),
        document: "Site/edge-01 (site.yaml #1)",
        field: "cluster.apiNetwork",
        reason: "no network named \"public\" in Site/edge-01 (it has provisioning, oob)",
    },
];

/// The base design with `cases` applied.
fn design_with(cases: &[&Case]) -> Vec<Document> {
    let mut base = BASE.to_string();
    let mut added = Vec::new();
    for case in cases {
        match case.change {
            Change::Replace(from, to) => {
                assert!(base.contains(from), "{}: {from:?} is not in the base design", case.name);
                base = base.replacen(from, to, 1);
            }
            Change::Add(yaml) => added.push((case.name, yaml)),
        }
    }
    let mut docs = parse_documents(&base, "site.yaml").unwrap();
    for (name, yaml) in added {
        docs.extend(parse_documents(yaml, &format!("{name}.yaml")).unwrap());
    }
    docs
}

fn reports(case: &Case, error: &DesignError) -> bool {
    error.document == case.document && error.field == case.field && error.reason.starts_with(case.reason)
}

#[test]
fn the_base_design_is_valid() {
    let site = validate(&design_with(&[]), &catalog()).unwrap();
    assert_eq!(site.nodes.len(), 2);
}

#[test]
fn each_rule_reports_its_document_field_and_reason() {
    for case in CASES {
        let errors = validate(&design_with(&[case]), &catalog()).unwrap_err();
        assert_eq!(errors.len(), 1, "{}: {errors:#?}", case.name);
        assert!(reports(case, &errors[0]), "{}: {:#?}", case.name, errors[0]);
    }
}

#[test]
fn every_error_is_reported_at_once() {
    // An unknown API network hides the API-address check, so it is left out here.
    let cases: Vec<&Case> = CASES.iter().filter(|c| c.name != "unknown-api-network").collect();
    let errors = validate(&design_with(&cases), &catalog()).unwrap_err();
    for case in &cases {
        assert!(errors.iter().any(|e| reports(case, e)), "{} is missing from {errors:#?}", case.name);
    }
    assert_eq!(errors.len(), cases.len(), "{errors:#?}");
}

#[test]
fn a_profile_no_node_uses_is_checked_too_and_each_error_once() {
    // `newer` is used by two nodes and `unused` by none: one error each.
    let added = concat!(
        "kind: HostProfile\nname: newer\nparent: base\npackages: [{ name: kubelet, version: 9.9.9 }]\n---\n",
        "kind: HostProfile\nname: unused\npackages: [{ name: kubelet, version: 9.9.8 }]\n---\n",
        node!("node-3", "newer", "52:54:00:00:01:03", "ipmi://10.0.0.3", "[{ network: provisioning, ip: 10.1.0.13 }]"),
        "---\n",
        node!("node-4", "newer", "52:54:00:00:01:04", "ipmi://10.0.0.4", "[{ network: provisioning, ip: 10.1.0.14 }]"),
    );
    let mut docs = design_with(&[]);
    docs.extend(parse_documents(added, "more.yaml").unwrap());
    let errors = validate(&docs, &catalog()).unwrap_err();
    let got: Vec<&str> = errors.iter().map(|e| e.document.as_str()).collect();
    assert_eq!(got, ["HostProfile/newer (more.yaml #1)", "HostProfile/unused (more.yaml #2)"]);
}

/// A HostProfile that does not parse (a map written as a list), a child of it, nodes on
/// both, and mistakes in those nodes and in the base design's.
const UNREADABLE_PROFILE: &str = concat!(
    "kind: HostProfile\nname: edge\nparent: base\nrole: worker\nkernelParameters: [isolcpus]\n---\n",
    "kind: HostProfile\nname: edge-small\nparent: edge\n---\n",
    node!("node-3", "edge", "52:54:00:00:01:01", "ipmi://10.0.0.3", "[{ network: provisioning, ip: 10.2.0.13 }]"),
    "---\n",
    node!(
        "node-4",
        "edge-small",
        "52:54:00:00:01:04",
        "ipmi://10.0.0.4",
        "[{ network: provisioning, ip: 10.1.0.14 }, { network: storage, ip: 10.5.0.14 }]"
    ),
);

/// The errors of one run, as (document, field) pairs.
fn located(errors: &[DesignError]) -> Vec<(&str, &str)> {
    errors.iter().map(|e| (e.document.as_str(), e.field.as_str())).collect()
}

#[test]
fn a_profile_that_does_not_parse_hides_no_other_error() {
    let base = BASE.replace(
        "addressing: [{ network: provisioning, ip: 10.1.0.12 }]",
        "addressing: [{ network: provisioning, ip: 10.1.0.12 }, { network: san, ip: 10.9.0.12 }]",
    );
    let mut parsed = Parsed::default();
    parsed.read(&base, "site.yaml").read(UNREADABLE_PROFILE, "edge.yaml");
    assert_eq!(parsed.unreadable().map(ToString::to_string).collect::<Vec<_>>(), ["HostProfile/edge"]);
    let errors = validate_parsed(&parsed, &catalog()).unwrap_err();
    // Neither `edge-small`'s parent nor node-3's profile is unknown, and node-4, whose
    // role `edge` would set, is not reported as roleless.
    assert_eq!(
        located(&errors),
        [
            ("HostProfile/edge (edge.yaml #1)", "kernelParameters"),
            ("Node/node-2 (site.yaml #6)", "addressing[san]"),
            ("Node/node-3 (edge.yaml #3)", "addressing[provisioning].ip"),
            ("Node/node-4 (edge.yaml #4)", "addressing[storage]"),
            ("Node/node-3 (edge.yaml #3)", "bootMac"),
        ],
        "{errors:#?}"
    );
    assert!(errors[0].reason.starts_with("invalid type: sequence, expected a map"), "{}", errors[0]);
    assert_eq!(errors[2].reason, "10.2.0.13 is not in provisioning (10.1.0.0/24)");
    assert_eq!(errors[4].reason, "52:54:00:00:01:01 is already the boot MAC of Node/node-1 (site.yaml #5)");
}

#[test]
fn a_node_with_malformed_fields_is_still_checked_for_the_rest() {
    // node-2's name and BMC are malformed, so it has no effective configuration; its MAC,
    // addresses and role are checked all the same.
    let base = BASE
        .replace("name: node-2\n", "name: Node_2\n")
        .replace("ipmi://10.0.0.2", "telnet://10.0.0.2")
        .replace("bootMac: 52:54:00:00:01:02", "bootMac: 52:54:00:00:01:01")
        .replace("ip: 10.1.0.12 }", "ip: 10.1.0.11 }, { network: san, ip: 10.9.0.12 }");
    let errors = validate(&parse_documents(&base, "site.yaml").unwrap(), &catalog()).unwrap_err();
    assert_eq!(
        located(&errors),
        [
            ("Node/Node_2 (site.yaml #6)", "name"),
            ("Node/Node_2 (site.yaml #6)", "bmc.address"),
            ("Node/Node_2 (site.yaml #6)", "addressing[san]"),
            ("Node/node-1 (site.yaml #5)", "bootMac"),
            ("Node/node-1 (site.yaml #5)", "addressing[provisioning].ip"),
        ],
        "{errors:#?}"
    );
    // The role rules see a malformed node too: node-1's BMC is malformed and its role cleared.
    let roleless = BASE.replace("ipmi://10.0.0.1", "telnet://10.0.0.1").replace("role: master", "role: '!'");
    let errors = validate(&parse_documents(&roleless, "site.yaml").unwrap(), &catalog()).unwrap_err();
    assert_eq!(
        located(&errors),
        [
            ("Node/node-1 (site.yaml #5)", "bmc.address"),
            ("Site/edge-01 (site.yaml #1)", "nodes"),
            ("Node/node-1 (site.yaml #5)", "role"),
        ],
        "{errors:#?}"
    );
}

#[test]
fn an_unreadable_master_profile_leaves_the_master_rule_unjudged() {
    // Whether node-1 is a master is up to `control`, which does not parse.
    let base = BASE
        .replace("name: control\nparent: base\nrole: master\n", "name: control\nparent: base\nrole: [master]\n")
        .replace("ip: 10.1.0.12", "ip: 10.1.0.11");
    let mut parsed = Parsed::default();
    parsed.read(&base, "site.yaml");
    let errors = validate_parsed(&parsed, &catalog()).unwrap_err();
    assert_eq!(
        located(&errors),
        [("HostProfile/control (site.yaml #4)", "role"), ("Node/node-2 (site.yaml #6)", "addressing[provisioning].ip")],
        "{errors:#?}"
    );
}

#[test]
fn unreadable_documents_keep_their_names() {
    // An unreadable Site is still the site; an unreadable Node still holds its hostname.
    let text = BASE.replacen("name: edge-01\n", "name: edge-01\nregion: [eu]\n", 1)
        + "---\nkind: Node\nname: node-2\nhostProfile: [base]\n";
    let mut parsed = Parsed::default();
    parsed.read(&text, "site.yaml");
    let errors = validate_parsed(&parsed, &catalog()).unwrap_err();
    assert_eq!(
        located(&errors),
        [
            ("Site/edge-01 (site.yaml #1)", "region"),
            ("Node/node-2 (site.yaml #7)", "hostProfile"),
            ("Node/node-2 (site.yaml #7)", "name"),
        ],
        "{errors:#?}"
    );
    assert!(errors[2].reason.starts_with("hostname node-2 is already used by Node/node-2 (site.yaml #6)"));
    // A hardware profile that does not parse is no unknown hardware profile either.
    let text = BASE.replace("interfaces: [{ name: eno1, network: provisioning }]", "interfaces: eno1");
    let mut parsed = Parsed::default();
    parsed.read(&text, "site.yaml");
    let errors = validate_parsed(&parsed, &catalog()).unwrap_err();
    assert_eq!(located(&errors), [("HardwareProfile/r640 (site.yaml #2)", "interfaces")], "{errors:#?}");
}

#[test]
fn a_node_on_an_unknown_profile_is_not_also_reported_as_roleless() {
    let case = CASES.iter().find(|c| c.name == "unknown-host-profile").unwrap();
    let errors = validate(&design_with(&[case]), &catalog()).unwrap_err();
    assert!(errors.iter().all(|e| e.field != "role"), "{errors:#?}");
}

/// The base design built by Cluster API, with `cluster`'s node sets as given.
fn capi(endpoint: &str, masters: &str, workers: &str) -> Vec<Document> {
    let from = "  apiNetwork: provisioning\n  masters: { count: 1 }\n  workers: { count: 1 }\n";
    assert!(BASE.contains(from));
    let to = format!(
        "  builder: capi\n  endpoint: {{ host: {endpoint} }}\n  apiNetwork: provisioning\n  masters: {masters}\n  workers: {workers}\n"
    );
    parse_documents(&BASE.replacen(from, &to, 1), "site.yaml").unwrap()
}

#[test]
fn a_cluster_api_design_its_webhooks_would_refuse_is_refused_with_every_reason() {
    let docs = capi("10.9.0.5", "{ count: 2, maxSurge: 2 }", "{ count: 1, maxSurge: 0, maxUnavailable: 0 }");
    let errors = validate(&docs, &catalog()).unwrap_err();
    let site = "Site/edge-01 (site.yaml #1)";
    let fields: Vec<(&str, &str)> = located(&errors);
    assert_eq!(
        fields,
        [
            (site, "cluster.masters.count"),
            (site, "cluster.masters.maxSurge"),
            (site, "cluster.workers.maxUnavailable"),
            (site, "cluster.endpoint.host"),
        ],
        "{errors:#?}"
    );
    assert!(errors[0].reason.contains("KubeadmControlPlane refuses an even number"), "{}", errors[0].reason);
    assert!(errors[2].reason.contains("MachineDeployment refuses both 0"), "{}", errors[2].reason);
    assert_eq!(errors[3].reason, "10.9.0.5 is not on provisioning, the cluster's API network (10.1.0.0/24)");

    // One master is replaced on a spare host first: refused without one, valid with one.
    let errors = validate(&capi("10.1.0.5", "{ count: 1 }", "{ count: 1 }"), &catalog()).unwrap_err();
    assert_eq!(located(&errors), [(site, "cluster.masters.maxSurge")], "{errors:#?}");
    assert!(errors[0].reason.contains("masters.standby: 1"), "{}", errors[0].reason);
    validate(&capi("10.1.0.5", "{ count: 1, standby: 1 }", "{ count: 1 }"), &catalog()).unwrap();
}

#[test]
fn cluster_apis_settings_on_a_bpa_site_are_refused_not_ignored() {
    let bpa = BASE.replacen("  workers: { count: 1 }", "  workers: { count: 1, maxSurge: 1 }", 1);
    let errors = validate(&parse_documents(&bpa, "site.yaml").unwrap(), &catalog()).unwrap_err();
    assert_eq!(located(&errors), [("Site/edge-01 (site.yaml #1)", "cluster.workers.maxSurge")]);
    assert_eq!(errors[0].reason, "applies to a Cluster API site only (builder: capi)");
}
