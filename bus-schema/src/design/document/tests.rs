//! Reading design documents: what parses, and what is refused with where.

use super::*;

const DESIGN: &str = r#"
kind: Site
name: edge-01
region: eu-west
labels: { tier: gold }
networks: [{ name: provisioning, cidr: 10.1.0.0/24 }]
cluster:
  apiNetwork: provisioning
  masters: { count: 1, selector: { hw: r640 }, topologyKey: rack }
---
kind: HardwareProfile
name: r640
labels: { hw: r640 }
interfaces: [{ name: eno1, mtu: 9000 }]
storage: [{ name: root, device: /dev/sda, sizeGb: 480, mount: / }]
---
---
kind: HostProfile
name: base
hardwareProfile: r640
role: worker
packages: [{ name: kubelet, version: 1.29.1 }]
kernelParameters: { isolcpus: 2-7, nosmt: ~ }
---
kind: Node
name: node-1
hostProfile: base
bootMac: 52:54:00:00:01:01
bmc: { address: ipmi://10.0.0.11, credentialsRef: bmc-node-1 }
rack: r1
addressing: [{ network: provisioning, ip: 10.1.0.11 }]
"#;

#[test]
fn parses_every_kind_and_remembers_source_and_index() {
    let docs = parse_documents(DESIGN, "site.yaml").unwrap();
    let seen: Vec<_> = docs.iter().map(|d| d.origin().location()).collect();
    assert_eq!(
        seen,
        [
            "Site/edge-01 (site.yaml #1)",
            "HardwareProfile/r640 (site.yaml #2)",
            "HostProfile/base (site.yaml #4)",
            "Node/node-1 (site.yaml #5)",
        ]
    );
    let Body::Site(site) = &docs[0].body else { panic!("not a site") };
    let cluster = site.cluster.as_ref().unwrap();
    assert_eq!(cluster.masters.standby, 0);
    assert_eq!(cluster.masters.topology_key(), Some("rack"));
    assert_eq!(cluster.workers, NodeSetSpec::default());
    assert_eq!(cluster.workers.topology_key(), None);
    let Body::HostProfile(base) = &docs[2].body else { panic!("not a host profile") };
    assert_eq!(base.kernel_parameters.set["nosmt"], "");
    assert_eq!(base.role, Some(ScalarPatch::Set(Role::Worker)));
    let Body::Node(node) = &docs[3].body else { panic!("not a node") };
    assert_eq!(node.bmc.credentials_ref.as_deref(), Some("bmc-node-1"));
}

#[test]
fn reports_each_bad_document_with_its_field() {
    let text = "kind: Node\nname: n1\nhostProfile: p\nbootMac: x\nbmc: { address: y }\nrak: r1\n\
                ---\nkind: Site\nname: Edge.01\nregion: [eu]\n\
                ---\nkind: Rack\nname: r1\n\
                ---\nkind: HostProfile\n\
                ---\nkind: HostProfile\nname: p\ninterfaces: [{ name: eno1, ntwork: x }]\n\
                ---\nkind: Site\nname: s\nnetworks: [{ name: n, cidr: 10.0.0.1/8 }]\n\
                ---\n- a list\n";
    let errors = parse_documents(text, "bad.yaml").unwrap_err();
    let got: Vec<_> = errors.iter().map(|e| (e.document.as_str(), e.field.as_str())).collect();
    assert_eq!(
        got,
        [
            ("Node/n1 (bad.yaml #1)", "(document)"),
            ("Site/Edge.01 (bad.yaml #2)", "region"),
            ("Rack/r1 (bad.yaml #3)", "kind"),
            ("HostProfile/? (bad.yaml #4)", "name"),
            ("HostProfile/p (bad.yaml #5)", "interfaces"),
            ("Site/s (bad.yaml #6)", "networks[0].cidr"),
            ("?/? (bad.yaml #7)", "(document)"),
        ]
    );
    assert!(errors[0].reason.starts_with("unknown field `rak`"), "{}", errors[0].reason);
    assert!(errors[0].reason.ends_with("(line 6, column 1)"), "{}", errors[0].reason);
    assert!(errors[2].reason.contains("\"Rack\" is not a kind"), "{}", errors[2].reason);
    assert!(errors[4].reason.starts_with("item 1: unknown field `ntwork`"), "{}", errors[4].reason);
    assert!(errors[5].reason.contains("host bits are set"), "{}", errors[5].reason);
}

#[test]
fn unquoted_tags_are_refused_at_their_line_in_the_whole_file() {
    let text = "kind: Site\nname: s\n\
                ---\nkind: HostProfile\nname: p\ninterfaces:\n  - '!eno1'\n  - !eno2\n\
                ---\nkind: HostProfile\nname: q\nkernelParameters: { nosmt: ~, isolcpus: !2-7 }\n\
                ---\nkind: HostProfile\nname: r\nrole: [master]\n\
                ---\nkind: !Node\nname: n\n";
    let mut parsed = Parsed::default();
    parsed.read(text, "t.yaml");
    let got: Vec<_> =
        parsed.errors().iter().map(|e| (e.document.as_str(), e.field.as_str(), e.reason.as_str())).collect();
    let tag = |tag: &str, item: &str, at: &str| {
        format!(
            "{item}{tag} is read as a YAML tag, which is not supported here; write '{tag}' in quotes for text \
             that starts with '!' (e.g. a '!name' removal) ({at})"
        )
    };
    assert_eq!(
        got,
        [
            ("HostProfile/p (t.yaml #2)", "interfaces", tag("!eno2", "item 2: ", "line 8, column 5").as_str()),
            ("HostProfile/q (t.yaml #3)", "kernelParameters.isolcpus", &tag("!2-7", "", "line 12, column 41")),
            ("HostProfile/r (t.yaml #4)", "role", "invalid type: sequence, expected a string (line 16, column 7)"),
            ("?/n (t.yaml #5)", "kind", &tag("!Node", "", "line 18, column 7")),
        ]
    );
    // Refused for its content, a document is still known by its kind and name.
    let unreadable: Vec<String> = parsed.unreadable().map(Origin::location).collect();
    assert_eq!(unreadable, ["HostProfile/p (t.yaml #2)", "HostProfile/q (t.yaml #3)", "HostProfile/r (t.yaml #4)"]);
}

#[test]
fn what_does_not_parse_is_known_by_its_head_and_the_rest_is_kept_in_order() {
    let mut parsed = Parsed::default();
    parsed
        .read("kind: HostProfile\nname: a\nrole: [x]\n---\nkind: HostProfile\nname: b\n", "one.yaml")
        .read("kind: Node\nname: n1\n---\nkind: Rack\nname: r\n---\nkind: Site\nname: s\n", "two.yaml");
    let order: Vec<String> = parsed
        .entries()
        .iter()
        .map(|e| match e {
            Entry::Read(doc) => doc.origin().location(),
            Entry::Unreadable(origin) => format!("unreadable {}", origin.location()),
        })
        .collect();
    assert_eq!(
        order,
        [
            "unreadable HostProfile/a (one.yaml #1)",
            "HostProfile/b (one.yaml #2)",
            "unreadable Node/n1 (two.yaml #1)",
            "Site/s (two.yaml #3)",
        ]
    );
    let errors: Vec<&str> = parsed.errors().iter().map(|e| e.document.as_str()).collect();
    assert_eq!(errors, ["HostProfile/a (one.yaml #1)", "Node/n1 (two.yaml #1)", "Rack/r (two.yaml #2)"]);
    assert_eq!(parsed.documents().len(), 2);
    assert_eq!(parsed.into_documents().unwrap_err().len(), 3);
}

#[test]
fn a_syntax_error_ends_the_source() {
    let errors = parse_documents("kind: Node\nname: [\n---\nkind: Site\n", "broken.yaml").unwrap_err();
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].document, "broken.yaml #1");
}

#[test]
fn an_empty_source_has_no_documents() {
    assert_eq!(parse_documents("", "empty.yaml").unwrap(), []);
    assert_eq!(parse_documents("---\n---\n", "empty.yaml").unwrap(), []);
}
