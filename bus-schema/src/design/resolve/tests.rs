//! Resolution's tests: inheritance layer by layer, each value's origin, and what a broken design
//! still resolves.

use super::*;
use crate::design::document::parse_documents;
use crate::design::fixtures;

/// A four-level chain over a hardware profile: hw < a < b < c < d < node.
const CHAIN: &str = r#"
kind: Site
name: s1
networks: [{ name: prov, cidr: 10.1.0.0/24 }]
---
kind: HardwareProfile
name: hw
labels: { hw: r640, vendor: dell }
interfaces: [{ name: eno1, mtu: 1500 }, { name: eno2 }]
storage: [{ name: root, device: /dev/sda }]
kernelParameters: { intel_iommu: "on" }
---
kind: HostProfile
name: a
hardwareProfile: hw
role: worker
packages: [{ name: ubuntu, version: "22.04" }, { name: kubelet, version: 1.29.1 }]
kernelParameters: { isolcpus: 2-7, nosmt: ~ }
---
kind: HostProfile
name: b
parent: a
role: master
interfaces: ['!eno2', { name: eno1, network: prov, mtu: 9000 }]
kernelParameters: { '!isolcpus': ~ }
---
kind: HostProfile
name: c
parent: b
labels: { '!vendor': ~, tier: gold }
packages: [{ name: kubelet, version: 1.30.0 }]
---
kind: HostProfile
name: d
parent: c
storage: ['!root', { name: data, device: /dev/sdb, sizeGb: 960 }]
"#;

fn node_on(profile: &str) -> String {
    format!(
        "---\nkind: Node\nname: n1\nhostProfile: {profile}\nbootMac: 52:54:00:00:00:01\n\
         bmc: {{ address: redfish://10.0.0.1/redfish/v1/Systems/1 }}\nrack: r7\n\
         labels: {{ tier: silver }}\naddressing: [{{ network: prov, ip: 10.1.0.11 }}]\n"
    )
}

fn resolve_text(text: &str) -> Result<ResolvedSite, Vec<DesignError>> {
    resolve(&parse_documents(text, "t.yaml").unwrap())
}

fn n1(text: &str) -> EffectiveNode {
    let site = resolve_text(text).unwrap();
    site.node("n1").unwrap().clone()
}

fn from(kind: Kind, name: &str, index: usize) -> Origin {
    Origin { kind, name: name.to_string(), source: "t.yaml".to_string(), index }
}

fn host(name: &str, index: usize) -> Origin {
    from(Kind::HostProfile, name, index)
}

#[test]
fn a_deep_chain_applies_bottom_up_and_tracks_origins() {
    let node = n1(&format!("{CHAIN}{}", node_on("d")));
    let names: Vec<String> = node.chain.iter().map(ToString::to_string).collect();
    assert_eq!(
        names,
        ["HardwareProfile/hw", "HostProfile/a", "HostProfile/b", "HostProfile/c", "HostProfile/d", "Node/n1"]
    );

    // a scalar in the child overrides
    assert_eq!(node.role, Setting::Set(Sourced::new(Role::Master, host("b", 4))));
    assert_eq!(node.hardware_profile, Setting::Set(Sourced::new("hw".to_string(), host("a", 3))));
    // a list entry of the same name replaces the inherited one; '!name' removes one
    assert_eq!(node.packages["kubelet"].value.version.as_str(), "1.30.0");
    assert_eq!(node.packages["kubelet"].origin, host("c", 5));
    assert_eq!(node.packages["ubuntu"].origin, host("a", 3));
    assert_eq!(node.interfaces.keys().collect::<Vec<_>>(), ["eno1"]);
    assert_eq!(node.interfaces["eno1"].value.mtu, Some(9000));
    assert_eq!(node.interfaces["eno1"].origin, host("b", 4));
    assert_eq!(node.storage.keys().collect::<Vec<_>>(), ["data"]);
    // maps merge by key; '!key' removes one
    let kernel: Vec<(&str, &str, String)> =
        node.kernel_parameters.iter().map(|(k, v)| (k.as_str(), v.value.as_str(), v.origin.to_string())).collect();
    assert_eq!(kernel, [("intel_iommu", "on", "HardwareProfile/hw".into()), ("nosmt", "", "HostProfile/a".into())]);
    let labels: Vec<(&str, &str, String)> =
        node.labels.iter().map(|(k, v)| (k.as_str(), v.value.as_str(), v.origin.to_string())).collect();
    assert_eq!(
        labels,
        [
            ("hw", "r640", "HardwareProfile/hw".into()),
            ("rack", "r7", "Node/n1".into()),
            ("tier", "silver", "Node/n1".into()),
        ]
    );
    assert_eq!(node.boot_mac.as_str(), "52:54:00:00:00:01");
    assert_eq!(node.addresses["prov"], "10.1.0.11".parse::<IpAddr>().unwrap());
}

#[test]
fn bang_clears_a_scalar_and_the_clearing_document_is_named() {
    let text =
        format!("{CHAIN}---\nkind: HostProfile\nname: e\nparent: d\nrole: '!'\nhardwareProfile: '!'\n{}", node_on("e"));
    let node = n1(&text);
    assert_eq!(node.role, Setting::Cleared(host("e", 7)));
    assert_eq!(node.role(), None);
    // without a hardware profile, nothing of it is inherited
    assert_eq!(node.hardware_profile, Setting::Cleared(host("e", 7)));
    assert_eq!(node.chain[0], host("a", 3));
    assert!(!node.kernel_parameters.contains_key("intel_iommu"));
    assert_eq!(node.label("hw"), None);
}

#[test]
fn a_child_can_name_another_hardware_profile() {
    let text = format!(
        "{CHAIN}---\nkind: HardwareProfile\nname: hw2\nlabels: {{ hw: r740 }}\n\
         ---\nkind: HostProfile\nname: e\nparent: d\nhardwareProfile: hw2\n{}",
        node_on("e")
    );
    let node = n1(&text);
    assert_eq!(node.hardware_profile.value().map(String::as_str), Some("hw2"));
    assert_eq!(node.labels["hw"].value, "r740");
    assert_eq!(node.labels["hw"].origin, from(Kind::HardwareProfile, "hw2", 7));
    // the eno1 of hw is gone with it, b's eno1 stays
    assert_eq!(node.interfaces["eno1"].origin, host("b", 4));
}

#[test]
fn cycles_are_reported_once_with_their_path() {
    let text = "kind: Site\nname: s1\n\
                ---\nkind: HostProfile\nname: x\nparent: y\n\
                ---\nkind: HostProfile\nname: y\nparent: x\n\
                ---\nkind: HostProfile\nname: m\nparent: k\n\
                ---\nkind: HostProfile\nname: z\nparent: m\n\
                ---\nkind: HostProfile\nname: k\nparent: z\n\
                ---\nkind: HostProfile\nname: tail\nparent: k\n\
                ---\nkind: HostProfile\nname: self\nparent: self\n";
    let errors = resolve_text(text).unwrap_err();
    let got: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        got,
        [
            "HostProfile/k (t.yaml #6): parent: inheritance cycle: k -> z -> m -> k",
            "HostProfile/self (t.yaml #8): parent: inheritance cycle: self -> self",
            "HostProfile/x (t.yaml #2): parent: inheritance cycle: x -> y -> x",
        ]
    );
}

#[test]
fn a_node_on_a_cycle_still_resolves_what_it_can() {
    let text = format!(
        "{CHAIN}---\nkind: HostProfile\nname: e\nparent: f\n---\nkind: HostProfile\nname: f\nparent: e\n{}",
        node_on("e")
    );
    let docs = parse_documents(&text, "t.yaml").unwrap();
    let resolution = resolve_all(&entries(&docs));
    assert_eq!(resolution.errors.into_vec().len(), 1);
    let node = resolution.nodes.values().next().unwrap();
    assert_eq!(node.chain, [host("f", 8), host("e", 7), from(Kind::Node, "n1", 9)]);
}

#[test]
fn unknown_references_are_reported_where_they_are_written() {
    let text = "kind: Site\nname: s1\n\
                ---\nkind: HostProfile\nname: a\nparent: nope\nhardwareProfile: r999\n\
                ---\nkind: Node\nname: n1\nhostProfile: missing\nbootMac: 52:54:00:00:00:01\nbmc: { address: ipmi://h }\n";
    let got: Vec<String> = resolve_text(text).unwrap_err().iter().map(ToString::to_string).collect();
    assert_eq!(
        got,
        [
            "HostProfile/a (t.yaml #2): parent: no HostProfile named \"nope\"",
            "HostProfile/a (t.yaml #2): hardwareProfile: no HardwareProfile named \"r999\"",
            "Node/n1 (t.yaml #3): hostProfile: no HostProfile named \"missing\"",
        ]
    );
}

#[test]
fn malformed_node_fields_are_all_reported() {
    let text = "kind: Site\nname: s1\n---\nkind: HostProfile\nname: a\n\
                ---\nkind: Node\nname: Node_1\nhostProfile: a\nbootMac: 52:54:00:00:01\nbmc: { address: telnet://h }\n\
                addressing: [{ network: p, ip: 10.1.0.x }, { network: q, ip: 10.1.0.1 }, { network: q, ip: 10.1.0.2 }]\n";
    let got: Vec<(String, String)> =
        resolve_text(text).unwrap_err().into_iter().map(|e| (e.field, e.reason.chars().take(30).collect())).collect();
    let want = [
        ("name", "\"Node_1\" must be lowercase let"),
        ("bootMac", "\"52:54:00:00:01\" is not a MAC "),
        ("bmc.address", "scheme \"telnet\" is not one Met"),
        ("addressing[p].ip", "\"10.1.0.x\" is not an IP addres"),
        ("addressing[q]", "a node has one address per net"),
    ];
    assert_eq!(got, want.map(|(f, r)| (f.to_string(), r.to_string())));
}

#[test]
fn a_design_holds_one_site_and_unique_names() {
    let bad_id = resolve_text("kind: Site\nname: Edge.01\n").unwrap_err();
    assert_eq!(bad_id.len(), 1);
    assert_eq!((bad_id[0].document.as_str(), bad_id[0].field.as_str()), ("Site/Edge.01 (t.yaml #1)", "name"));
    let none = resolve_text("kind: HostProfile\nname: a\n").unwrap_err();
    assert_eq!(none[0].to_string(), "(design): kind: no Site document: a design describes one site");
    let text = "kind: Site\nname: s1\n---\nkind: Site\nname: s2\n---\nkind: HostProfile\nname: a\n---\nkind: HostProfile\nname: a\n";
    let got: Vec<String> = resolve_text(text).unwrap_err().iter().map(ToString::to_string).collect();
    assert_eq!(
        got,
        [
            "Site/s2 (t.yaml #2): kind: a design describes one site, and Site/s1 (t.yaml #1) is already defined",
            "HostProfile/a (t.yaml #4): name: HostProfile/a is already defined by HostProfile/a (t.yaml #3)",
        ]
    );
}

#[test]
fn render_lists_every_value_with_its_origin() {
    let text = "kind: Site\nname: s1\n\
                ---\nkind: HardwareProfile\nname: hw\nlabels: { hw: r640 }\nstorage: [{ name: root, device: /dev/sda, sizeGb: 480 }]\n\
                ---\nkind: HostProfile\nname: base\nhardwareProfile: hw\nrole: worker\npackages: [{ name: kubelet, version: 1.29.1 }]\n\
                ---\nkind: HostProfile\nname: control\nparent: base\nrole: master\nkernelParameters: { isolcpus: 2-7, nosmt: ~ }\n\
                interfaces: [{ name: eno1, network: prov, mtu: 9000 }]\n\
                ---\nkind: Node\nname: node-1\nhostProfile: control\nbootMac: 52:54:00:00:01:01\n\
                bmc: { address: ipmi://10.0.0.11, credentialsRef: bmc-1 }\nrack: r1\naddressing: [{ network: prov, ip: 10.1.0.11 }]\n";
    let site = resolve_text(text).unwrap();
    let expected = "\
name = node-1                                (from Node/node-1)
chain = HardwareProfile/hw < HostProfile/base < HostProfile/control < Node/node-1
hostProfile = control                        (from Node/node-1)
hardwareProfile = hw                         (from HostProfile/base)
role = master                                (from HostProfile/control)
bootMac = 52:54:00:00:01:01                  (from Node/node-1)
bmc.address = ipmi://10.0.0.11               (from Node/node-1)
bmc.credentialsRef = bmc-1                   (from Node/node-1)
rack = r1                                    (from Node/node-1)
labels.hw = r640                             (from HardwareProfile/hw)
labels.rack = r1                             (from Node/node-1)
packages.kubelet = 1.29.1                    (from HostProfile/base)
kernelParameters.isolcpus = 2-7              (from HostProfile/control)
kernelParameters.nosmt = \"\"                  (from HostProfile/control)
interfaces.eno1 = network=prov mtu=9000      (from HostProfile/control)
storage.root = device=/dev/sda sizeGb=480    (from HardwareProfile/hw)
addressing.prov = 10.1.0.11                  (from Node/node-1)
";
    assert_eq!(render_effective(site.node("node-1").unwrap()), expected);
}

#[test]
fn render_shows_unset_and_cleared_scalars() {
    let text = "kind: Site\nname: s1\n---\nkind: HostProfile\nname: a\nrole: '!'\n\
                ---\nkind: Node\nname: n1\nhostProfile: a\nbootMac: 52:54:00:00:00:01\nbmc: { address: ipmi://h }\n";
    let out = render_effective(resolve_text(text).unwrap().node("n1").unwrap());
    assert!(out.contains("\nhardwareProfile = (unset)\n"), "{out}");
    let role = out.lines().find(|l| l.starts_with("role = ")).unwrap();
    assert!(role.starts_with("role = (cleared)  ") && role.ends_with("  (from HostProfile/a)"), "{out}");
}

#[test]
fn resolving_twice_gives_the_same_site() {
    let text =
        fixtures::design(&fixtures::site("{ count: 1 }", "{ count: 1 }"), &[(1, "control", "r1"), (2, "worker", "r2")]);
    let docs = fixtures::documents(&text);
    assert_eq!(resolve(&docs).unwrap(), resolve(&docs).unwrap());
    assert_eq!(resolve(&docs).unwrap(), resolve(&fixtures::documents(&text)).unwrap());
}
