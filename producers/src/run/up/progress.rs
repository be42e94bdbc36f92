//! What `landfall up` shows the person who ran it: a line for each thing that happens to a site
//! or a rollout (installs, nodes joining and leaving, rollouts as they go, sites cut off), read
//! from the events stream like any client. The services' logs go to a file.

use async_nats::jetstream::consumer::DeliverPolicy;
use bus_schema::names;
use bus_schema::pb::{self, BusMessage};
use bus_schema::runtime::{Bus, ReadEvent};
use tokio_util::sync::CancellationToken;

use crate::views::event::summary;

/// Prints a line for each event worth a person's eye until `shutdown`, through `say`; a reader
/// lost (the embedded server restarting) is made again, from where it was.
pub(super) async fn show(
    bus: Bus,
    say: fn(std::fmt::Arguments<'_>),
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let mut from = DeliverPolicy::New;
    while !shutdown.is_cancelled() {
        let mut reader = match bus.read_events(vec![names::EVENTS_ALL.to_string()], from).await {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, "cannot read events for the terminal yet");
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => continue,
                }
            }
        };
        loop {
            let next = tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                next = reader.next() => next,
            };
            match next {
                Some(Ok(e)) => {
                    from = DeliverPolicy::ByStartSequence { start_sequence: e.delivery.stream_sequence + 1 };
                    if let Some(line) = line(&e) {
                        say(format_args!("{line}"));
                    }
                }
                Some(Err(e)) => tracing::debug!(error = %e, "reading events for the terminal"),
                None => break,
            }
        }
    }
    Ok(())
}

/// The event's line (`12:04:31  edge-01     installed        4 nodes`), or `None` for the
/// steps in between (each node's provisioning, the site's own reports).
pub(super) fn line(e: &ReadEvent) -> Option<String> {
    let d = &e.delivery;
    let (what, detail) = what_happened(&d.type_name, &d.payload)?;
    let scope = d.subject.split('.').nth(names::SCOPE_TOKEN).unwrap_or_default();
    let time = e.published.time();
    let (h, m, s) = (time.hour(), time.minute(), time.second());
    let detail = clip(&detail, 90);
    Some(format!("{h:02}:{m:02}:{s:02}  {scope:<10}  {what:<18} {detail}").trim_end().to_string())
}

fn clip(text: &str, at: usize) -> String {
    match text.char_indices().nth(at) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_string(),
    }
}

fn decode<M: BusMessage>(payload: &[u8]) -> Option<M> {
    M::decode(payload).ok()
}

fn short(id: &str) -> &str {
    id.get(..8).unwrap_or(id)
}

fn package(p: Option<&pb::PackageRef>) -> String {
    p.map(|p| format!("{}@{}", p.name, p.version)).unwrap_or_default()
}

/// What an event of type `type_name` says, in a few words and a detail.
fn what_happened(type_name: &str, payload: &[u8]) -> Option<(&'static str, String)> {
    let other = |what: &'static str| {
        let mut json = pb::decode_to_json(type_name, payload).and_then(Result::ok).unwrap_or_default();
        if let Some(o) = json.as_object_mut() {
            o.remove("site_id");
        }
        Some((what, summary(&json)))
    };
    match type_name {
        t if t == pb::SiteInstallStarted::TYPE => {
            let e: pb::SiteInstallStarted = decode(payload)?;
            Some(("install started", format!("{} nodes", e.nodes.len())))
        }
        t if t == pb::SiteInstalled::TYPE => {
            let e: pb::SiteInstalled = decode(payload)?;
            let ok = e.results.iter().filter(|r| r.failed_step.is_empty()).count();
            Some(("installed", format!("{ok} of {} nodes", e.results.len())))
        }
        t if t == pb::SiteInstallFailed::TYPE => {
            let e: pb::SiteInstallFailed = decode(payload)?;
            Some(("install failed", e.reason))
        }
        t if t == pb::NodeReady::TYPE => {
            let e: pb::NodeReady = decode(payload)?;
            Some(("node ready", e.node))
        }
        t if t == pb::NodeJoinFailed::TYPE => {
            let e: pb::NodeJoinFailed = decode(payload)?;
            Some(("node join failed", format!("{}: {}", e.node, e.reason)))
        }
        t if t == pb::NodeLeft::TYPE => other("node left"),
        t if t == pb::SiteRemoved::TYPE => other("removed"),
        t if t == pb::SiteDecommissioned::TYPE => Some(("decommissioned", String::new())),
        t if t == pb::LifecycleFailed::TYPE => other("removal failed"),
        t if t == pb::RolloutPlanned::TYPE => {
            let e: pb::RolloutPlanned = decode(payload)?;
            let undo =
                if e.rollback_of.is_empty() { String::new() } else { format!(", undoing {}", short(&e.rollback_of)) };
            let what = format!(
                "{} {}: {} nodes at {} sites{undo}",
                short(&e.rollout_id),
                package(e.package.as_ref()),
                e.planned_nodes,
                e.sites.len()
            );
            Some(("rollout planned", what))
        }
        t if t == pb::RolloutProgress::TYPE => {
            let e: pb::RolloutProgress = decode(payload)?;
            let failed = if e.failed > 0 { format!(", {} failed", e.failed) } else { String::new() };
            let what = format!(
                "{} {} of {} nodes, {} of {} sites{failed}",
                short(&e.rollout_id),
                e.patched,
                e.planned_nodes,
                e.sites_done,
                e.sites_total
            );
            Some(("rollout", what))
        }
        t if t == pb::RolloutCompleted::TYPE => {
            let e: pb::RolloutCompleted = decode(payload)?;
            let what = format!(
                "{} {}: {} of {} nodes patched in {:.1} s",
                short(&e.rollout_id),
                package(e.package.as_ref()),
                e.patched,
                e.planned_nodes,
                e.duration_ms as f64 / 1000.0
            );
            Some(("rollout completed", what))
        }
        t if t == pb::RolloutHalted::TYPE => {
            let e: pb::RolloutHalted = decode(payload)?;
            Some(("rollout halted", format!("{} {}", short(&e.rollout_id), e.reason)))
        }
        t if t == pb::RolloutCancelled::TYPE => other("rollout cancelled"),
        t if t == pb::RolloutPaused::TYPE => other("rollout paused"),
        t if t == pb::RolloutResumed::TYPE => other("rollout resumed"),
        t if t == pb::SiteCutOff::TYPE => Some(("cut off", String::new())),
        t if t == pb::SiteLinkRestored::TYPE => Some(("link restored", String::new())),
        t if t == pb::SiteDisagrees::TYPE => other("disagrees"),
        t if t == pb::StoreFull::TYPE => other("store full"),
        t if t == pb::CommandRejected::TYPE => {
            let e: pb::CommandRejected = decode(payload)?;
            let kind = e.command_type.rsplit('.').next().unwrap_or_default().to_string();
            Some(("command refused", format!("{kind}: {}", e.reason)))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read<M: BusMessage>(m: &M) -> ReadEvent {
        let delivery = crate::testing::delivery(m, "c");
        let published = time::OffsetDateTime::UNIX_EPOCH + time::Duration::seconds(12 * 3600 + 4 * 60 + 31);
        ReadEvent { delivery, pending: 0, published }
    }

    #[test]
    fn installs_and_rollouts_read_in_a_line_and_steps_are_not_shown() {
        let installed = pb::SiteInstalled {
            site_id: "edge-01".into(),
            results: vec![pb::NodeResult::default(), pb::NodeResult::default()],
            outcome: 0,
        };
        let e = read(&installed);
        assert_eq!(line(&e).unwrap(), "12:04:31  edge-01     installed          2 of 2 nodes");
        let progress = pb::RolloutProgress {
            rollout_id: "01a21de5-e215-70b1".into(),
            planned_nodes: 12,
            patched: 4,
            sites_done: 1,
            sites_total: 3,
            ..Default::default()
        };
        let e = read(&progress);
        assert_eq!(line(&e).unwrap(), "12:04:31  fleet       rollout            01a21de5 4 of 12 nodes, 1 of 3 sites");
        let step = pb::NodeOsProvisioned { site_id: "edge-01".into(), ..Default::default() };
        let e = read(&step);
        assert_eq!(line(&e), None);
    }
}
