//! `landfall node remove`, `landfall node reprovision` and `landfall site decommission`: each
//! publishes its command and follows it to its end (the node gone from the design, the node
//! Ready again, the site gone), its failure with the site's reason, or its refusal.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::bail;
use async_nats::jetstream::consumer::DeliverPolicy;
use bus_schema::domain::SiteId;
use bus_schema::ids;
use bus_schema::names;
use bus_schema::pb::{self, BusMessage};
use bus_schema::runtime::{Delivery, Envelope};
use clap::Args;

use super::connect::{EXIT_REJECTED, EXIT_TIMEOUT, connect};
use super::output::{Format, emit_line};
use crate::flags::parse_duration;
use crate::views::event::{event_json, event_line};

#[derive(Debug, Args)]
pub struct NodeOperationArgs {
    pub site: String,
    pub node: String,
    /// Why (kept in the commands stream and in the events).
    #[arg(long, default_value = "")]
    pub reason: String,
    /// How long to follow it; it goes on after that.
    #[arg(long, default_value = "30m", value_parser = parse_duration)]
    pub timeout: Duration,
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
    pub output: Format,
}

#[derive(Debug, Args)]
pub struct DecommissionArgs {
    pub site: String,
    /// Why (kept in the commands stream, the events and the site's archive).
    #[arg(long, default_value = "")]
    pub reason: String,
    /// How long to follow it; it goes on after that.
    #[arg(long, default_value = "60m", value_parser = parse_duration)]
    pub timeout: Duration,
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
    pub output: Format,
}

/// Which operation is followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Remove,
    Reprovision,
    Decommission,
}

/// The operation's command id, and its reprovision's join (sagas are found by their own id).
struct Followed<'a> {
    op: Operation,
    id: &'a str,
    rejoin: String,
    node: &'a str,
}

impl<'a> Followed<'a> {
    fn new(op: Operation, id: &'a str, node: &'a str) -> Self {
        Self { op, id, rejoin: ids::derived_id(id, "rejoin", Some(node)).to_string(), node }
    }

    fn concerned_by(&self, d: &Delivery) -> bool {
        d.envelope.correlation == self.id
            || (self.op == Operation::Reprovision && d.envelope.correlation == self.rejoin)
    }

    /// Whether the wait ends with `d`: its exit code and what to say. 0 done, 1 failed, 2 refused.
    fn verdict(&self, d: &Delivery) -> Option<(u8, String)> {
        let node = self.node;
        let text = |r: anyhow::Result<String>| r.unwrap_or_else(|e| e.to_string());
        match (self.op, d.type_name.as_str()) {
            (_, pb::CommandRejected::TYPE) => {
                let r: pb::CommandRejected = d.decode().ok()?;
                Some((EXIT_REJECTED, format!("refused: {}", r.reason)))
            }
            (_, pb::LifecycleFailed::TYPE) => {
                let f: pb::LifecycleFailed = d.decode().ok()?;
                Some((1, format!("{} did not finish: {}", f.operation, f.reason)))
            }
            (Operation::Remove, pb::NodeLeft::TYPE) => {
                let l: pb::NodeLeft = d.decode().ok()?;
                Some((
                    0,
                    format!(
                        "node {} removed from {}: out of its cluster and its design, its host deleted",
                        l.node, l.site_id
                    ),
                ))
            }
            (Operation::Reprovision, pb::NodeReady::TYPE) => {
                Some((0, format!("node {node} reprovisioned: re-imaged, joined again and Ready")))
            }
            (Operation::Reprovision, pb::NodeJoinFailed::TYPE) => {
                let f: pb::NodeJoinFailed = d.decode().ok()?;
                Some((1, format!("node {node} was wiped but could not join again: {}: {}", f.step, f.reason)))
            }
            (Operation::Decommission, pb::SiteDecommissioned::TYPE) => {
                let s: pb::SiteDecommissioned = d.decode().ok()?;
                Some((0, text(Ok(decommissioned(&s)))))
            }
            _ => None,
        }
    }
}

/// What `site decommission` says at its end.
fn decommissioned(s: &pb::SiteDecommissioned) -> String {
    format!(
        "site {} decommissioned: {} host(s) deprovisioned and deleted, {} resource(s) deleted at the site ({}); its \
         records are archived as {} in landfall-sites.\nIts NATS user {} can still connect until it is revoked: {}",
        s.site_id,
        s.hosts.len(),
        s.resources.len(),
        s.resources.join(", "),
        s.archive_key,
        s.nats_user,
        s.revoke
    )
}

pub async fn remove_node(url: &str, args: &NodeOperationArgs) -> anyhow::Result<ExitCode> {
    let cmd = pb::RemoveNode { site_id: args.site.clone(), node: args.node.clone(), reason: args.reason.clone() };
    run(url, &args.site, &args.node, Operation::Remove, &cmd, args.timeout, args.output).await
}

pub async fn reprovision_node(url: &str, args: &NodeOperationArgs) -> anyhow::Result<ExitCode> {
    let cmd = pb::ReprovisionNode { site_id: args.site.clone(), node: args.node.clone(), reason: args.reason.clone() };
    run(url, &args.site, &args.node, Operation::Reprovision, &cmd, args.timeout, args.output).await
}

pub async fn decommission_site(url: &str, args: &DecommissionArgs) -> anyhow::Result<ExitCode> {
    let cmd = pb::DecommissionSite { site_id: args.site.clone(), reason: args.reason.clone() };
    run(url, &args.site, "", Operation::Decommission, &cmd, args.timeout, args.output).await
}

async fn run<C: pb::BusCommand>(
    url: &str,
    site: &str,
    node: &str,
    op: Operation,
    cmd: &C,
    timeout: Duration,
    output: Format,
) -> anyhow::Result<ExitCode> {
    let site = SiteId::try_from(site)?;
    let bus = connect(url).await?;
    let env = Envelope::root();
    // Subscribe before publishing, so no event of it can slip by.
    let mut reader = bus.read_events(vec![names::scope_events(site.as_str())], DeliverPolicy::New).await?;
    bus.publish_command(cmd, &env).await?;
    eprintln!("{} {site} {node} published as {}", C::TYPE.rsplit('.').next().unwrap_or(C::TYPE), env.id);
    let followed = Followed::new(op, &env.id, node);
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let next = match tokio::time::timeout_at(deadline, reader.next()).await {
            Err(_) => {
                eprintln!("gave up following after {timeout:?}; it goes on (landfall events {site})");
                return Ok(ExitCode::from(EXIT_TIMEOUT));
            }
            Ok(None) => bail!("the event stream ended"),
            Ok(Some(e)) => e?,
        };
        if !followed.concerned_by(&next.delivery) {
            continue;
        }
        match output {
            Format::Json | Format::Yaml => emit_line(output, &event_json(&next))?,
            Format::Table => eprintln!("{}", event_line(&next)),
        }
        if let Some((code, message)) = followed.verdict(&next.delivery) {
            match code {
                0 => println!("{message}"),
                _ => eprintln!("{message}"),
            }
            return Ok(ExitCode::from(code));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::delivery;

    #[test]
    fn each_operation_ends_on_its_own_outcome_its_failure_or_its_refusal() {
        let remove = Followed::new(Operation::Remove, "op", "w-1");
        let left = pb::NodeLeft { site_id: "edge-01".into(), node: "w-1".into(), ..Default::default() };
        assert_eq!(remove.verdict(&delivery(&left, "op")).map(|v| v.0), Some(0));
        let failed = pb::LifecycleFailed { site_id: "edge-01".into(), reason: "PDB".into(), ..Default::default() };
        assert_eq!(remove.verdict(&delivery(&failed, "op")).map(|v| v.0), Some(1));
        let refused = pb::CommandRejected { reason: "last master".into(), ..Default::default() };
        assert_eq!(remove.verdict(&delivery(&refused, "op")).map(|v| v.0), Some(EXIT_REJECTED));
        let ready = pb::NodeReady { site_id: "edge-01".into(), node: "w-1".into(), ..Default::default() };
        assert_eq!(remove.verdict(&delivery(&ready, "op")), None, "a removal does not end on a join");

        let again = Followed::new(Operation::Reprovision, "op", "w-1");
        assert!(again.concerned_by(&delivery(&ready, &again.rejoin)), "its join is a saga of its own");
        assert!(!remove.concerned_by(&delivery(&ready, &again.rejoin)));
        assert_eq!(again.verdict(&delivery(&ready, &again.rejoin)).map(|v| v.0), Some(0));

        let gone = Followed::new(Operation::Decommission, "op", "");
        let done = pb::SiteDecommissioned {
            site_id: "edge-01".into(),
            hosts: vec!["m-1".into()],
            nats_user: "site-edge-01".into(),
            revoke: "run deploy".into(),
            ..Default::default()
        };
        let (code, message) = gone.verdict(&delivery(&done, "op")).unwrap();
        assert_eq!(code, 0);
        assert!(message.contains("site-edge-01") && message.contains("run deploy"), "{message}");
    }
}
