//! `landfall node add`: a host appears at a simulated site; with `--wait`, its join is
//! followed until the node is ready, could not join, or the site refused it. `node remove` and
//! `node reprovision` are `lifecycle.rs`'s.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, bail};
use async_nats::jetstream::consumer::DeliverPolicy;
use bus_schema::domain::{MacAddress, NodeDesign, SiteId};
use bus_schema::ids;
use bus_schema::names;
use bus_schema::pb::{self, BusMessage};
use bus_schema::runtime::{Delivery, RequestError};
use clap::{Args, Subcommand, ValueEnum};
use serde_json::json;

use super::connect::{EXIT_REJECTED, EXIT_TIMEOUT, connect};
use super::output::{Format, emit_line};
use crate::flags::parse_duration;
use crate::views::event::{event_json, event_line};

#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// A new host appears at a simulated site (`landfall up`); its gateway announces it and
    /// the orchestrator provisions it and joins it to the site's cluster.
    Add(NodeAddArgs),
    /// Take a node away for good: cordoned, drained (its pods' disruption budgets honoured),
    /// its Node deleted, its host deprovisioned (Metal3 cleans it) and deleted, and out of the
    /// site's design. Refused for the last master, or (by the site) while another master is not
    /// Ready. Exit 0 removed, 1 failed (the reason; the node stays), 2 refused, 3 out of time.
    Remove(super::lifecycle::NodeOperationArgs),
    /// Re-image a failed or suspect node and join it again at the site's current versions:
    /// cordoned, drained, its Node deleted, its host deprovisioned, then provisioned, its
    /// binaries installed and seen Ready. Exit codes as for `remove`.
    Reprovision(super::lifecycle::NodeOperationArgs),
}

#[derive(Debug, Args)]
pub struct NodeAddArgs {
    pub site: String,
    #[arg(long)]
    pub name: String,
    #[arg(long, value_enum)]
    pub role: NodeRole,
    /// The boot MAC address (aa:bb:cc:dd:ee:ff).
    #[arg(long)]
    pub mac: String,
    /// The BMC address [default: ipmi://10.X.Y.Z from the MAC's last three bytes].
    #[arg(long)]
    pub bmc: Option<String>,
    /// Wait until the node is ready in the cluster (exit 0), could not join (1), or the site
    /// refused it (2); 3 when out of time.
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits.
    #[arg(long, default_value = "30m", value_parser = parse_duration)]
    pub timeout: Duration,
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
    pub output: Format,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum NodeRole {
    Master,
    Worker,
}

/// Runs one `landfall node …` command.
pub async fn run(url: &str, cmd: NodeCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        NodeCommand::Add(args) => node_add(url, &args).await,
        NodeCommand::Remove(args) => super::lifecycle::remove_node(url, &args).await,
        NodeCommand::Reprovision(args) => super::lifecycle::reprovision_node(url, &args).await,
    }
}

/// The BMC address of a simulated host that was given none: `ipmi://10.X.Y.Z` from the last
/// three bytes of its MAC.
pub fn default_bmc(mac: &MacAddress) -> String {
    let bytes: Vec<u8> = mac.as_str().split(':').filter_map(|b| u8::from_str_radix(b, 16).ok()).collect();
    let tail = &bytes[bytes.len().saturating_sub(3)..];
    let octets: Vec<String> = tail.iter().map(u8::to_string).collect();
    format!("ipmi://10.{}", octets.join("."))
}

/// The node `node add` asks for, validated as a design node.
pub fn node_spec(args: &NodeAddArgs) -> anyhow::Result<NodeDesign> {
    let mac = MacAddress::try_from(args.mac.clone()).map_err(|e| anyhow!("--mac: {}", e.reason))?;
    let bmc = args.bmc.clone().unwrap_or_else(|| default_bmc(&mac));
    let role = match args.role {
        NodeRole::Master => pb::Role::Master,
        NodeRole::Worker => pb::Role::Worker,
    };
    let spec = pb::NodeSpec {
        name: args.name.clone(),
        role: role as i32,
        boot_mac: mac.to_string(),
        bmc_address: bmc,
        labels: Default::default(),
        ..Default::default()
    };
    NodeDesign::try_from(spec).map_err(|e| {
        let flag = match e.field.as_str() {
            "name" => "--name",
            "bmc_address" => "--bmc",
            "boot_mac" => "--mac",
            other => other,
        };
        anyhow!("{flag}: {}", e.reason)
    })
}

/// The id of the `NodeAdded` with which the site's gateway announces this host
/// ([`ids::node_added_id`]), so the join it starts (its correlation id) and its rejection can
/// be told from any other.
pub fn node_added_id(site: &SiteId, node: &NodeDesign) -> String {
    ids::node_added_id(site.as_str(), node.name.as_str(), node.boot_mac.as_str(), "").to_string()
}

fn encode<M: BusMessage>(m: &M) -> Vec<u8> {
    m.encode_to_vec()
}

pub async fn node_add(url: &str, args: &NodeAddArgs) -> anyhow::Result<ExitCode> {
    let site = SiteId::try_from(args.site.as_str())?;
    let node = node_spec(args)?;
    let bus = connect(url).await?;
    // Subscribe before the host appears, so no event of its join can slip by.
    let mut reader = match args.wait {
        true => Some(bus.read_events(vec![names::scope_events(site.as_str())], DeliverPolicy::New).await?),
        false => None,
    };
    let request = pb::SimulateHostArrival { site_id: site.to_string(), node: Some(pb::NodeSpec::from(&node)) };
    let subject = names::sim_host_arrival_rpc(site.as_str());
    match bus.request_site(site.as_str(), subject, encode(&request).into(), Duration::from_secs(5)).await {
        Ok(_) => {}
        Err(RequestError::TimedOut { .. }) => bail!("simulated site {site} did not answer within 5 s"),
        Err(RequestError::NoResponders { .. }) => {
            bail!("no simulated site {site} answers (is `landfall up` running with that site?)")
        }
        Err(RequestError::Refused { reason, .. }) => bail!("simulated site {site} refused the host: {reason}"),
        Err(e) => return Err(anyhow!(e).context(format!("ask simulated site {site} for a new host"))),
    }
    match args.output {
        Format::Json | Format::Yaml => emit_line(
            args.output,
            &json!({
                "site": site.as_str(),
                "node": node.name.as_str(),
                "role": node.role.as_str(),
                "boot_mac": node.boot_mac.as_str(),
                "bmc_address": node.bmc_address.as_str(),
                "appeared": true,
            }),
        )?,
        Format::Table => println!(
            "host {} ({}, {}) appeared at {site}; its gateway announces it (NodeAdded), then the orchestrator \
             provisions it and joins it to the cluster",
            node.name,
            node.role.as_str(),
            node.boot_mac.as_str()
        ),
    }
    let Some(reader) = reader.as_mut() else { return Ok(ExitCode::SUCCESS) };
    let host = Host { name: node.name.as_str(), mac: node.boot_mac.as_str(), added_id: &node_added_id(&site, &node) };
    let deadline = tokio::time::Instant::now() + args.timeout;
    loop {
        let next = match tokio::time::timeout_at(deadline, reader.next()).await {
            Err(_) => {
                eprintln!("gave up waiting after {:?}; the join goes on (landfall status {site})", args.timeout);
                return Ok(ExitCode::from(EXIT_TIMEOUT));
            }
            Ok(None) => bail!("the event stream ended"),
            Ok(Some(e)) => e?,
        };
        if !host.concerned_by(&next.delivery) {
            continue;
        }
        match args.output {
            Format::Json | Format::Yaml => emit_line(args.output, &event_json(&next))?,
            Format::Table => eprintln!("{}", event_line(&next)),
        }
        if let Some((code, message)) = host.join_verdict(&next.delivery) {
            eprintln!("{message}");
            return Ok(ExitCode::from(code));
        }
    }
}

/// The host `node add` waits for.
pub struct Host<'a> {
    pub name: &'a str,
    pub mac: &'a str,
    /// See [`node_added_id`].
    pub added_id: &'a str,
}

impl Host<'_> {
    /// Whether a site event belongs to this host's join (by correlation, or by the node it
    /// names), or rejects its `NodeAdded`.
    fn concerned_by(&self, d: &Delivery) -> bool {
        if d.envelope.correlation == self.added_id {
            return true;
        }
        if d.type_name == pb::CommandRejected::TYPE {
            return self.join_verdict(d).is_some();
        }
        let Some(Ok(v)) = pb::decode_to_json(&d.type_name, &d.payload) else { return false };
        v["node"] == self.name || v["node"]["name"] == self.name
    }

    /// Whether `--wait` of `node add` ends with this event, with its exit code and what to say:
    /// 0 ready (or accepted at a site never installed, which it joins at the install), 1 could
    /// not join, 2 its NodeAdded was rejected.
    pub fn join_verdict(&self, d: &Delivery) -> Option<(u8, String)> {
        let name = self.name;
        match d.type_name.as_str() {
            pb::NodeReady::TYPE => {
                let r: pb::NodeReady = d.decode().ok()?;
                (r.node == name).then(|| (0, format!("node {name} is ready in the cluster of {}", r.site_id)))
            }
            pb::NodeJoinFailed::TYPE => {
                let f: pb::NodeJoinFailed = d.decode().ok()?;
                let step = if f.step.is_empty() { String::new() } else { format!("{}: ", f.step) };
                (f.node == name).then(|| (1, format!("node {name} could not join: {step}{}", f.reason)))
            }
            pb::NodeAccepted::TYPE => {
                let a: pb::NodeAccepted = d.decode().ok()?;
                let ours = a.node.as_ref().is_some_and(|n| n.name == name);
                (ours && !a.joining).then(|| {
                    let msg = format!(
                        "node {name} is in the design of {} now; the site was never installed, so it comes up \
                         with the install (landfall site install {})",
                        a.site_id, a.site_id
                    );
                    (0, msg)
                })
            }
            pb::CommandRejected::TYPE => {
                let r: pb::CommandRejected = d.decode().ok()?;
                let named = r.reason.contains(name) || r.reason.contains(self.mac);
                let ours = r.command_id == self.added_id || (r.command_type == pb::NodeAdded::TYPE && named);
                ours.then(|| (EXIT_REJECTED, format!("the site refused node {name}: {}", r.reason)))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Command;
    use crate::testing::{delivery, parse};

    fn node_args(args: &[&str]) -> NodeAddArgs {
        let command = parse(&[&["landfall", "node", "add"], args].concat()).unwrap();
        let Command::Node(NodeCommand::Add(a)) = command else { panic!("not node add") };
        a
    }

    #[test]
    fn node_add_validates_and_derives_a_bmc() {
        let n =
            node_spec(&node_args(&["edge-01", "--name", "node-4", "--role", "worker", "--mac", "52-54-00-0A-01-FF"]))
                .unwrap();
        assert_eq!(n.boot_mac.as_str(), "52:54:00:0a:01:ff");
        assert_eq!(n.bmc_address.as_str(), "ipmi://10.10.1.255");
        let err = |args: &[&str]| node_spec(&node_args(args)).unwrap_err().to_string();
        assert!(
            err(&["e", "--name", "Node_4", "--role", "worker", "--mac", "52:54:00:00:00:01"]).starts_with("--name")
        );
        assert!(err(&["e", "--name", "n", "--role", "master", "--mac", "52:54:00"]).starts_with("--mac"));
        let bad_bmc = ["e", "--name", "n", "--role", "master", "--mac", "52:54:00:00:00:01", "--bmc", "telnet://x"];
        assert!(err(&bad_bmc).starts_with("--bmc"));
        assert!(parse(&["landfall", "node", "add", "e", "--name", "n", "--role", "boss", "--mac", "x"]).is_err());
    }

    #[test]
    fn join_waits_end_on_ready_failed_or_rejected() {
        let host = Host { name: "node-4", mac: "52:54:00:00:00:04", added_id: "added" };
        let verdict = |d: Delivery| host.join_verdict(&d);
        let ready = pb::NodeReady { site_id: "edge-01".into(), node: "node-4".into(), ..Default::default() };
        assert_eq!(verdict(delivery(&ready, "x")).map(|v| v.0), Some(0));
        let other = pb::NodeReady { node: "node-5".into(), ..ready.clone() };
        assert_eq!(verdict(delivery(&other, "x")), None);
        let failed = pb::NodeJoinFailed {
            site_id: "edge-01".into(),
            node: "node-4".into(),
            step: "provision_os".into(),
            reason: "bmc".into(),
        };
        let (code, msg) = verdict(delivery(&failed, "x")).unwrap();
        assert_eq!((code, msg.as_str()), (1, "node node-4 could not join: provision_os: bmc"));
        let rejected = pb::CommandRejected {
            command_type: pb::NodeAdded::TYPE.into(),
            reason: "boot MAC 52:54:00:00:00:04 is node-1's".into(),
            ..Default::default()
        };
        assert_eq!(verdict(delivery(&rejected, "x")).map(|v| v.0), Some(2), "named by its MAC");
        let by_id =
            pb::CommandRejected { command_id: "added".into(), reason: "site unknown".into(), ..rejected.clone() };
        assert_eq!(verdict(delivery(&by_id, "x")).map(|v| v.0), Some(2), "by the announcement's id");
        let elsewhere = pb::CommandRejected { reason: "node-7 is there".into(), ..rejected };
        assert_eq!(verdict(delivery(&elsewhere, "x")), None);
        let accepted = |joining| pb::NodeAccepted {
            site_id: "edge-01".into(),
            node: Some(pb::NodeSpec { name: "node-4".into(), ..Default::default() }),
            joining,
            hardware: None,
        };
        assert_eq!(verdict(delivery(&accepted(true), "x")), None, "joining: wait for ready");
        assert_eq!(verdict(delivery(&accepted(false), "x")).map(|v| v.0), Some(0));
        // What gets printed while waiting: the join's events, by correlation or by node.
        let provisioning = pb::NodeOsProvisioning { node: "node-4".into(), ..Default::default() };
        assert!(host.concerned_by(&delivery(&provisioning, "x")));
        assert!(host.concerned_by(&delivery(&pb::ClusterReady::default(), "added")));
        assert!(!host.concerned_by(&delivery(&pb::ClusterReady::default(), "x")));
        assert!(host.concerned_by(&delivery(&accepted(true), "x")));
    }

    #[test]
    fn the_announcement_id_depends_on_the_host_alone() {
        let site = SiteId::try_from("edge-01").unwrap();
        let node =
            node_spec(&node_args(&["edge-01", "--name", "node-4", "--role", "worker", "--mac", "52:54:00:00:00:04"]))
                .unwrap();
        assert_eq!(node_added_id(&site, &node), node_added_id(&site, &node.clone()));
        let other =
            node_spec(&node_args(&["edge-01", "--name", "node-5", "--role", "worker", "--mac", "52:54:00:00:00:04"]))
                .unwrap();
        assert_ne!(node_added_id(&site, &node), node_added_id(&site, &other));
    }
}
