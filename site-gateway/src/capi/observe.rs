//! What Cluster API and CAPM3 show of a site's build, read from their objects: which host each
//! machine claimed (`Machine` → its `Metal3Machine` → the `metal3.io/BareMetalHost` annotation),
//! each host's Metal3 state, each Node's readiness and kubelet version, and whether the whole
//! stands at its target. Pure: the objects come in as the API serves them (JSON).
//!
//! A build is done when the `Cluster` is `Available`, the `KubeadmControlPlane` and every
//! `MachineDeployment` have observed their latest generation and count all their replicas up to
//! date, ready and available (the control plane at the target version), and every machine's
//! Node is Ready at the target kubelet version. Until then, `waiting` says what is not, in
//! the words Cluster API and Metal3 used, so a time-out names it.

use std::collections::BTreeMap;

use serde_json::Value;

/// The annotation CAPM3 puts on a `Metal3Machine` naming the host it claimed (`namespace/name`).
pub const HOST_ANNOTATION: &str = "metal3.io/BareMetalHost";

/// A site's Cluster API objects, as its bootstrap cluster serves them, and the Nodes of its
/// workload cluster.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    pub cluster: Option<Value>,
    pub control_plane: Option<Value>,
    pub deployments: Vec<Value>,
    pub machines: Vec<Value>,
    pub metal3_machines: Vec<Value>,
    pub hosts: Vec<Value>,
    pub nodes: Vec<Value>,
}

/// One host a machine claimed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostProgress {
    /// The `Machine` that claimed it.
    pub machine: String,
    /// The host's Metal3 provisioning state (empty before Metal3 wrote one).
    pub metal3_state: String,
    /// The Node the machine became, once it has one.
    pub node: Option<String>,
    /// Whether that Node is Ready at the target kubelet version.
    pub ready: bool,
}

/// Where a build stands.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// Every host a machine claimed, by host name (the design's node name).
    pub hosts: BTreeMap<String, HostProgress>,
    /// What is not yet as the target wants it, one line each; empty once the build stands.
    pub waiting: Vec<String>,
    /// Hosts Metal3 failed, with what it said.
    pub failed: BTreeMap<String, String>,
}

impl Progress {
    /// Whether the build stands at its target.
    pub fn done(&self) -> bool {
        self.waiting.is_empty() && self.failed.is_empty()
    }
}

/// Where the build in `o` stands against the Kubernetes `version` (`v1.29.2`).
pub fn observe(o: &Observed, version: &str) -> Progress {
    let mut p = Progress::default();
    match &o.cluster {
        None => p.waiting.push("no Cluster yet".to_string()),
        Some(c) => {
            if let Some(why) = condition_not_true(c, "Available") {
                p.waiting.push(format!("Cluster {} is not Available: {why}", name(c)));
            }
        }
    }
    match &o.control_plane {
        None => p.waiting.push("no KubeadmControlPlane yet".to_string()),
        Some(cp) => p.waiting.extend(replicas_short(cp, Some(version))),
    }
    for md in &o.deployments {
        p.waiting.extend(replicas_short(md, None));
    }
    let hosts_by_name: BTreeMap<&str, &Value> = o.hosts.iter().map(|h| (name(h), h)).collect();
    let nodes_by_name: BTreeMap<&str, &Value> = o.nodes.iter().map(|n| (name(n), n)).collect();
    for machine in &o.machines {
        let machine_name = name(machine);
        let infra = text(machine, "/spec/infrastructureRef/name");
        let claimed = o
            .metal3_machines
            .iter()
            .find(|m| name(m) == infra)
            .and_then(|m| m.pointer(&format!("/metadata/annotations/{}", escape(HOST_ANNOTATION))))
            .and_then(Value::as_str)
            .map(|a| a.rsplit('/').next().unwrap_or(a));
        let Some(host_name) = claimed else {
            let said = o.metal3_machines.iter().find(|m| name(m) == infra).map(false_conditions).unwrap_or_default();
            let said = if said.is_empty() { "no Metal3Machine has claimed one".to_string() } else { said.join("; ") };
            p.waiting.push(format!("Machine {machine_name} has no host: {said}"));
            continue;
        };
        let host = hosts_by_name.get(host_name).copied();
        let metal3_state = host.map(|h| text(h, "/status/provisioning/state")).unwrap_or_default().to_string();
        if let Some(h) = host
            && text(h, "/status/operationalStatus") == "error"
        {
            let said = format!("{}: {}", text(h, "/status/errorType"), text(h, "/status/errorMessage"));
            p.failed.insert(host_name.to_string(), said);
        }
        let node_name = Some(text(machine, "/status/nodeRef/name")).filter(|n| !n.is_empty()).map(str::to_string);
        let ready = match node_name.as_deref().map(|n| (n, nodes_by_name.get(n))) {
            None => {
                p.waiting.push(format!("{host_name} has no Node yet (Metal3: {})", or_none(&metal3_state)));
                false
            }
            Some((n, None)) => {
                p.waiting.push(format!("{host_name}: Node {n} is not in the cluster"));
                false
            }
            Some((n, Some(node))) => match node_not_ready(node, version) {
                Some(why) => {
                    p.waiting.push(format!("{host_name}: Node {n} {why}"));
                    false
                }
                None => true,
            },
        };
        p.hosts.insert(
            host_name.to_string(),
            HostProgress { machine: machine_name.to_string(), metal3_state, node: node_name, ready },
        );
    }
    p
}

/// Why a KubeadmControlPlane or MachineDeployment does not count all its replicas at the
/// target, if it does not: its latest generation not observed yet, or its counts; the control
/// plane also at `version`.
fn replicas_short(o: &Value, version: Option<&str>) -> Option<String> {
    let kind = text(o, "/kind");
    let want = o.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(1);
    let generation = o.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(0);
    let observed = o.pointer("/status/observedGeneration").and_then(Value::as_i64).unwrap_or(0);
    if observed < generation {
        return Some(format!("{kind} {} has not observed generation {generation} yet", name(o)));
    }
    let count = |field: &str| o.pointer(&format!("/status/{field}")).and_then(Value::as_i64).unwrap_or(0);
    let counts = [
        ("replicas", count("replicas")),
        ("up to date", count("upToDateReplicas")),
        ("ready", count("readyReplicas")),
        ("available", count("availableReplicas")),
    ];
    let short: Vec<String> = counts.iter().filter(|(_, n)| *n != want).map(|(what, n)| format!("{n} {what}")).collect();
    let at = version.filter(|v| text(o, "/status/version") != *v);
    if short.is_empty() && at.is_none() {
        return None;
    }
    let mut why = format!("{kind} {} wants {want}", name(o));
    if !short.is_empty() {
        why.push_str(&format!(": {}", short.join(", ")));
    }
    if let Some(v) = at {
        why.push_str(&format!(" (at {}, not yet {v})", or_none(text(o, "/status/version"))));
    }
    Some(why)
}

/// Why a Node is not Ready at kubelet `version`, if it is not.
fn node_not_ready(node: &Value, version: &str) -> Option<String> {
    let ready = node
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .is_some_and(|c| c["status"] == "True");
    if !ready {
        return Some("is not Ready".to_string());
    }
    let kubelet = text(node, "/status/nodeInfo/kubeletVersion");
    (kubelet != version).then(|| format!("runs kubelet {}, not {version}", or_none(kubelet)))
}

/// The message of condition `kind` when it is not `True` (or the condition is missing).
fn condition_not_true(o: &Value, kind: &str) -> Option<String> {
    let condition =
        o.pointer("/status/conditions").and_then(Value::as_array).and_then(|cs| cs.iter().find(|c| c["type"] == kind));
    match condition {
        None => Some(format!("no {kind} condition yet")),
        Some(c) if c["status"] == "True" => None,
        Some(c) => Some(condition_text(c)),
    }
}

/// Each condition of `o` that is not `True`, as `Type: reason: message`.
fn false_conditions(o: &Value) -> Vec<String> {
    o.pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|c| c["status"] != "True")
        .map(|c| format!("{}: {}", c["type"].as_str().unwrap_or("?"), condition_text(c)))
        .collect()
}

fn condition_text(c: &Value) -> String {
    let (reason, message) = (c["reason"].as_str().unwrap_or(""), c["message"].as_str().unwrap_or(""));
    match (reason, message) {
        ("", "") => format!("status {}", c["status"].as_str().unwrap_or("Unknown")),
        (r, "") => r.to_string(),
        ("", m) => m.to_string(),
        (r, m) => format!("{r}: {m}"),
    }
}

fn name(o: &Value) -> &str {
    text(o, "/metadata/name")
}

fn text<'a>(o: &'a Value, pointer: &str) -> &'a str {
    o.pointer(pointer).and_then(Value::as_str).unwrap_or_default()
}

fn or_none(s: &str) -> &str {
    if s.is_empty() { "none" } else { s }
}

/// A JSON pointer's token for `key` (`/` and `~` escaped).
fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const V: &str = "v1.29.3";

    fn ready(kind: &str, name: &str, replicas: i64, version: Option<&str>) -> Value {
        let mut status = json!({ "observedGeneration": 2, "replicas": replicas, "upToDateReplicas": replicas,
                                 "readyReplicas": replicas, "availableReplicas": replicas });
        if let Some(v) = version {
            status["version"] = json!(v);
        }
        json!({ "kind": kind, "metadata": { "name": name, "generation": 2 }, "spec": { "replicas": replicas }, "status": status })
    }

    fn machine(name: &str, infra: &str, node: Option<&str>) -> Value {
        let mut m = json!({ "kind": "Machine", "metadata": { "name": name }, "spec": { "infrastructureRef": { "name": infra } } });
        if let Some(n) = node {
            m["status"] = json!({ "nodeRef": { "name": n } });
        }
        m
    }

    fn metal3_machine(name: &str, host: Option<&str>) -> Value {
        let mut m = json!({ "kind": "Metal3Machine", "metadata": { "name": name } });
        if let Some(h) = host {
            m["metadata"]["annotations"] = json!({ HOST_ANNOTATION: format!("metal3/{h}") });
        }
        m
    }

    fn host(name: &str, state: &str) -> Value {
        json!({ "metadata": { "name": name }, "status": { "provisioning": { "state": state }, "operationalStatus": "OK" } })
    }

    fn node(name: &str, ready: bool, kubelet: &str) -> Value {
        json!({ "metadata": { "name": name }, "status": {
            "conditions": [{ "type": "Ready", "status": if ready { "True" } else { "False" } }],
            "nodeInfo": { "kubeletVersion": kubelet } } })
    }

    /// One master and one worker, all at `V`.
    fn built() -> Observed {
        Observed {
            cluster: Some(
                json!({ "metadata": { "name": "edge-01" }, "status": { "conditions": [{ "type": "Available", "status": "True" }] } }),
            ),
            control_plane: Some(ready("KubeadmControlPlane", "edge-01-control-plane", 1, Some(V))),
            deployments: vec![ready("MachineDeployment", "edge-01-workers", 1, None)],
            machines: vec![machine("cp-1", "m3-cp-1", Some("node-1")), machine("w-1", "m3-w-1", Some("node-2"))],
            metal3_machines: vec![metal3_machine("m3-cp-1", Some("node-1")), metal3_machine("m3-w-1", Some("node-2"))],
            hosts: vec![host("node-1", "provisioned"), host("node-2", "provisioned")],
            nodes: vec![node("node-1", true, V), node("node-2", true, V)],
        }
    }

    #[test]
    fn a_build_at_its_target_is_done_with_each_host_its_machine_and_node() {
        let p = observe(&built(), V);
        assert!(p.done(), "{p:?}");
        let node_2 = &p.hosts["node-2"];
        assert_eq!(
            (node_2.machine.as_str(), node_2.metal3_state.as_str(), node_2.node.as_deref(), node_2.ready),
            ("w-1", "provisioned", Some("node-2"), true)
        );
    }

    #[test]
    fn what_is_short_of_the_target_is_said_in_cluster_apis_and_metal3s_words() {
        let mut o = built();
        o.cluster.as_mut().unwrap()["status"]["conditions"][0] = json!({ "type": "Available", "status": "False", "reason": "NotAvailable", "message": "* WorkersAvailable: 0 of 1 ready" });
        o.control_plane.as_mut().unwrap()["status"]["version"] = json!("v1.29.2");
        o.control_plane.as_mut().unwrap()["status"]["upToDateReplicas"] = json!(0);
        o.deployments[0]["metadata"]["generation"] = json!(3);
        o.machines.push(machine("w-2", "m3-w-2", None));
        let mut stuck = metal3_machine("m3-w-2", None);
        stuck["status"] = json!({ "conditions": [{ "type": "Ready", "status": "False", "reason": "NoAvailableHost", "message": "no host matches the selector" }] });
        o.metal3_machines.push(stuck);
        o.nodes[1] = node("node-2", true, "v1.29.2");
        let p = observe(&o, V);
        assert_eq!(
            p.waiting,
            [
                "Cluster edge-01 is not Available: NotAvailable: * WorkersAvailable: 0 of 1 ready",
                "KubeadmControlPlane edge-01-control-plane wants 1: 0 up to date (at v1.29.2, not yet v1.29.3)",
                "MachineDeployment edge-01-workers has not observed generation 3 yet",
                "node-2: Node node-2 runs kubelet v1.29.2, not v1.29.3",
                "Machine w-2 has no host: Ready: NoAvailableHost: no host matches the selector",
            ]
        );
        assert!(!p.done());
        assert!(!p.hosts["node-2"].ready);
    }

    #[test]
    fn a_host_metal3_failed_fails_with_what_metal3_said() {
        let mut o = built();
        o.nodes.pop();
        o.machines[1]["status"] = json!({});
        o.hosts[1] = json!({ "metadata": { "name": "node-2" }, "status": { "provisioning": { "state": "provisioning" },
            "operationalStatus": "error", "errorType": "provisioning error", "errorMessage": "image checksum mismatch" } });
        let p = observe(&o, V);
        assert_eq!(p.failed["node-2"], "provisioning error: image checksum mismatch");
        assert_eq!(p.waiting, ["node-2 has no Node yet (Metal3: provisioning)"]);
        assert_eq!(p.hosts["node-2"].metal3_state, "provisioning");
    }

    #[test]
    fn nothing_yet_is_waited_for_not_taken_for_done() {
        let p = observe(&Observed::default(), V);
        assert_eq!(p.waiting, ["no Cluster yet", "no KubeadmControlPlane yet"]);
        assert!(!p.done());
    }
}
