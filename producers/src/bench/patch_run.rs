//! One PatchPackage over a benchmark's fleet, timed from its publish to `RolloutCompleted`, and
//! what its rollout comes to: node updates, messages stored per update, the rate against raw
//! JetStream, and when its milestones were stored.

use std::time::{Duration, Instant};

use anyhow::Context;
use async_nats::jetstream::consumer::DeliverPolicy;
use bus_schema::names;
use bus_schema::pb::{self, BusEvent, BusMessage};
use bus_schema::runtime::{Bus, Envelope};
use serde_json::json;

use super::{round, stored_messages};

/// One PatchPackage over the whole fleet, timed from its publish to `RolloutCompleted`.
pub(super) struct Patched {
    pub wall: f64,
    pub completed: pb::RolloutCompleted,
    /// The command's id, which the rollout's events carry as their correlation.
    pub rollout_id: String,
    /// Messages stored in every stream and bucket when the command was published.
    messages_before: u64,
}

/// Publishes a PatchPackage of `target` with `strategy` and waits for the rollout's end; a
/// rollout that halts is an error.
pub(super) async fn patch_fleet(
    bus: &Bus,
    target: &pb::Package,
    strategy: &pb::RolloutStrategy,
) -> anyhow::Result<Patched> {
    let cmd = pb::PatchPackage {
        name: target.name.clone(),
        version: target.version.clone(),
        strategy: Some(strategy.clone()),
        ..Default::default()
    };
    let mut done =
        bus.read_events(vec![pb::RolloutCompleted::filter(), pb::RolloutHalted::filter()], DeliverPolicy::New).await?;
    let messages_before = stored_messages(bus).await?;
    let env = Envelope::root();
    let start = Instant::now();
    bus.publish_command(&cmd, &env).await?;
    let end = loop {
        let e = tokio::time::timeout(Duration::from_secs(3600), done.next())
            .await
            .context("no RolloutCompleted within an hour")?
            .context("event stream ended")??;
        if e.delivery.envelope.correlation == env.id {
            break e;
        }
    };
    let wall = start.elapsed().as_secs_f64();
    anyhow::ensure!(
        end.delivery.type_name == pb::RolloutCompleted::TYPE,
        "the rollout halted: {:?}",
        pb::decode_to_json(&end.delivery.type_name, &end.delivery.payload)
    );
    Ok(Patched { wall, completed: end.delivery.decode()?, rollout_id: env.id, messages_before })
}

impl Patched {
    /// What every fanout reports of its rollout: node updates and the backends' patches (`patched_effects`), the
    /// rate, bus messages per update (`messages_after`: stored when it ended), and the rate
    /// against `raw` JetStream messages per second.
    pub(super) fn figures(&self, messages_after: u64, raw: f64, patched_effects: u64) -> serde_json::Value {
        let updates = f64::from(self.completed.patched);
        let messages = messages_after.saturating_sub(self.messages_before);
        let rate = updates / self.wall;
        let per_update = messages as f64 / updates.max(1.0);
        json!({
            // The nodes the rollout planned: each node of the sites that had reported what it
            // runs, at another version. A node the observer had not recorded yet is left out, so
            // fewer than the fleet's nodes says the observer was behind when the patch began.
            "planned_nodes": self.completed.planned_nodes,
            "node_updates": self.completed.patched,
            "node_updates_failed": self.completed.failed,
            "backend_patch_effects": patched_effects,
            "wall_seconds": round(self.wall, 3),
            "node_updates_per_second": round(rate, 1),
            "bus_messages": messages,
            "bus_messages_per_node_update": round(per_update, 2),
            "raw_jetstream_msgs_per_second": round(raw, 0),
            // What one node update costs against one raw message, however many messages it
            // takes: the old "efficiency" multiplied by messages per update, so it rose when an
            // update got costlier.
            "node_updates_per_raw_jetstream_msg": round(rate / raw, 4),
        })
    }
}

/// When the rollout's milestones were stored, in seconds after the command was: planned, first
/// and last node report (alone, or carried in its site's report), first and last site report,
/// completed.
pub(super) async fn rollout_phases(bus: &Bus, rollout_id: &str) -> anyhow::Result<serde_json::Value> {
    let mut reader = bus.read_events(vec![names::EVENTS_ALL.to_string()], DeliverPolicy::All).await?;
    let mut times: std::collections::BTreeMap<&str, Vec<time::OffsetDateTime>> = Default::default();
    let commands = bus.jetstream().get_stream(names::COMMANDS_STREAM).await?;
    let last = commands
        .get_last_raw_message_by_subject(&names::command_subject(
            <pb::PatchPackage as pb::BusCommand>::KIND,
            names::FLEET,
        ))
        .await?;
    let start = last.time;
    while reader.pending_at_start > 0 {
        let Some(e) = reader.next().await else { break };
        let e = e?;
        if e.delivery.envelope.correlation == rollout_id {
            let kind = match e.delivery.type_name.as_str() {
                t if t == pb::RolloutPlanned::TYPE => "planned",
                t if t == pb::SitePatched::TYPE => {
                    // A site's report that carries node reports: those nodes' reports are there.
                    let carries = <pb::SitePatched as prost::Message>::decode(e.delivery.payload.clone())
                        .is_ok_and(|s| !s.nodes.is_empty());
                    if carries {
                        times.entry("node_patched").or_default().push(e.published);
                    }
                    "site_patched"
                }
                t if t == pb::NodePatched::TYPE => "node_patched",
                t if t == pb::RolloutCompleted::TYPE => "completed",
                _ => "",
            };
            times.entry(kind).or_default().push(e.published);
        }
        if e.pending == 0 {
            break;
        }
    }
    let at = |t: Option<&time::OffsetDateTime>| t.map_or(-1.0, |t| round((*t - start).as_seconds_f64(), 3));
    let first = |k: &str| at(times.get(k).and_then(|v| v.first()));
    let last = |k: &str| at(times.get(k).and_then(|v| v.last()));
    Ok(json!({
        "planned": first("planned"),
        "first_node_patched": first("node_patched"),
        "first_site_reported": first("site_patched"),
        "last_node_patched": last("node_patched"),
        "last_site_reported": last("site_patched"),
        "completed": last("completed"),
    }))
}
