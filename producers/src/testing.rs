//! Fixtures the unit tests of several modules share: the real command line parsed, a message as
//! a consumer receives it, and a rollout plan of three sites in two waves.

use bus_schema::names;
use bus_schema::pb::{self, BusMessage};
use bus_schema::rollout::{self, Plan};
use bus_schema::runtime::{Delivery, Envelope};

/// `args` (the program name first) parsed as the real `landfall` command line.
pub(crate) fn parse(args: &[&str]) -> Result<crate::Command, clap::Error> {
    use clap::Parser;
    crate::Cli::try_parse_from(args).map(|cli| cli.command)
}

/// `m` as a consumer receives it, correlated with `correlation`.
pub(crate) fn delivery<M: BusMessage>(m: &M, correlation: &str) -> Delivery {
    // The event's subject, as its publisher would have sent it: in its site's scope, or the fleet's.
    let rule = bus_schema::trust::rule(M::TYPE).expect("a message of the table of kinds");
    let json = serde_json::to_value(m).expect("JSON");
    let scope = json.get("site_id").and_then(|v| v.as_str()).filter(|s| !s.is_empty()).unwrap_or(names::FLEET);
    Delivery {
        subject: names::event_subject_from(bus_schema::trust::usual_origin(M::TYPE), scope, rule.aggregate, rule.kind),
        type_name: M::TYPE.to_string(),
        envelope: Envelope {
            id: "e".into(),
            correlation: correlation.into(),
            causation: correlation.into(),
            traceparent: String::new(),
            actor: String::new(),
        },
        payload: m.encode_to_vec().into(),
        delivered: 1,
        stream_sequence: 1,
    }
}

/// A planned site whose nodes (name, version it runs) are workers.
pub(crate) fn planned(site: &str, canary: bool, nodes: &[(&str, &str)]) -> rollout::PlannedSite {
    rollout::PlannedSite {
        site: site.into(),
        canary,
        nodes: nodes
            .iter()
            .map(|(n, from)| rollout::PlannedNode {
                spec: pb::NodeSpec { name: n.to_string(), role: pb::Role::Worker as i32, ..Default::default() },
                from_version: from.to_string(),
            })
            .collect(),
    }
}

/// Three sites in two waves, the first a canary, four planned nodes.
pub(crate) fn a_plan() -> Plan {
    Plan {
        sites: vec![
            planned("edge-05", true, &[("node-1", "1.29.2")]),
            planned("edge-01", false, &[("node-1", "1.29.2"), ("node-2", "")]),
            planned("edge-02", false, &[("node-1", "1.28.0")]),
        ],
        wave_ends: vec![1, 3],
        planned_nodes: 4,
        nodes_at_target: 2,
        nodes_not_installed: 1,
        failure_threshold: 1,
    }
}
