//! What a finished install leaves on the hub, for every site of a registered fleet, made
//! without running one: the install saga is driven to its end by the saga's own decisions
//! (`consumers::saga`), as the orchestrator would over the gateways' reports, then written as
//! the orchestrator leaves it (outbox published and cleared, `latest.<site>` naming it); what
//! every node runs is written as the observer writes it from those reports; and each site's
//! `SiteInstalled` is published. The read model cannot tell this fleet from one really installed.

use std::collections::BTreeMap;

use anyhow::Context;
use bus_schema::domain::{Package, Role, SiteDesign};
use bus_schema::envelope::Envelope;
use bus_schema::names::{self, keys};
use bus_schema::outgoing::Outgoing;
use bus_schema::pb;
use bus_schema::runtime::Bus;
use consumers::saga::{self, Decision, Input};
use futures::StreamExt;

/// How many records of each kind were written.
pub(super) struct Installed {
    pub sagas: usize,
    pub observed: usize,
    pub events: usize,
}

/// A finished install of `design`, as `saga::decide` leaves it after every report of a good
/// install, with the events its last step publishes (its outbox, before it is cleared).
fn finished_saga(
    design: &SiteDesign,
    catalog: &BTreeMap<String, Package>,
    now_ms: i64,
) -> anyhow::Result<pb::InstallSaga> {
    let cmd = Envelope::root();
    let resolved = saga::resolve(design, catalog).map_err(|r| anyhow::anyhow!("{}: {}", design.site, r.reason))?;
    let mut state = saga::start(&cmd, design, resolved, now_ms);
    let names: Vec<String> = design.nodes.iter().map(|n| n.name.to_string()).collect();
    let by_role = |role: Role| design.nodes.iter().filter(|n| n.role == role).map(|n| n.name.to_string()).collect();
    let mut inputs = vec![Input::Staged];
    inputs.extend(names.iter().map(|n| Input::OsProvisioned { node: n.clone() }));
    inputs.push(Input::ClusterReady(pb::ClusterReady {
        site_id: design.site.to_string(),
        masters: by_role(Role::Master),
        workers: by_role(Role::Worker),
        failed: Vec::new(),
    }));
    inputs.extend([Input::KubeconfigStored, Input::ContainersApplied]);
    for (i, input) in inputs.iter().enumerate() {
        // Each report is its own message, caused by the job it answers.
        let report = cmd.derive(&format!("report-{i}"), input.node());
        // Only the last step's messages are kept: the orchestrator publishes and clears each.
        state.outbox.clear();
        match saga::decide(&state, input, &report, now_ms) {
            Decision::Apply(next) => state = *next,
            other => anyhow::bail!("{}: the install saga did not take {input:?}: {other:?}", design.site),
        }
    }
    anyhow::ensure!(
        state.phase == pb::InstallPhase::Succeeded as i32,
        "{}: the install saga ended in phase {}",
        design.site,
        saga::phase_name(state.phase)
    );
    Ok(state)
}

/// The events of an outbox, ready to publish with their recorded ids (its jobs are left out:
/// no gateway is there to take them).
fn outbox_events(saga: &pb::InstallSaga) -> Vec<Outgoing> {
    saga.outbox
        .iter()
        .filter(|e| matches!(names::parse_subject(&e.subject), Some(names::ParsedSubject::Event { .. })))
        .map(|e| Outgoing {
            subject: e.subject.clone(),
            type_name: e.message_type.clone(),
            payload: e.payload.clone().into(),
            envelope: Envelope {
                id: e.message_id.clone(),
                correlation: saga.saga_id.clone(),
                causation: e.causation_id.clone(),
                traceparent: e.traceparent.clone(),
            },
        })
        .collect()
}

/// What every node of `design` runs after the install: its role's packages, each reported by
/// the event that installed it.
fn observed_of(
    design: &SiteDesign,
    catalog: &BTreeMap<String, Package>,
    saga_id: &str,
    now_ms: i64,
) -> Vec<pb::ObservedVersion> {
    let cmd = Envelope::root_with_id(uuid::Uuid::parse_str(saga_id).unwrap_or_else(|_| uuid::Uuid::now_v7()));
    design
        .nodes
        .iter()
        .flat_map(|n| {
            let report = cmd.derive("node_binaries_installed", Some(n.name.as_str()));
            design.packages_for(n.role).iter().map(move |p| pb::ObservedVersion {
                site_id: design.site.to_string(),
                node: n.name.to_string(),
                name: p.name.to_string(),
                version: p.version.to_string(),
                kind: catalog.get(&p.key()).map_or(0, |c| c.kind as i32),
                updated_unix_ms: now_ms,
                event_id: report.id.clone(),
            })
        })
        .collect()
}

/// One record written to `landfall-sagas`.
enum Record<'a> {
    Saga(&'a pb::InstallSaga),
    Latest(&'a pb::SiteLease),
}

/// Writes what a finished install leaves for every site of `designs` (registered already, with
/// `catalog` registered), and publishes each site's last events.
pub(super) async fn install(bus: &Bus, designs: &[SiteDesign], catalog: &[pb::Package]) -> anyhow::Result<Installed> {
    let catalog: BTreeMap<String, Package> = catalog
        .iter()
        .cloned()
        .map(|p| Package::try_from(p).map(|p| (p.reference().key(), p)))
        .collect::<Result<_, _>>()
        .context("the catalog")?;
    let sagas = bus.kv(names::SAGAS_BUCKET).await?;
    let observed = bus.kv(names::OBSERVED_BUCKET).await?;
    let now_ms = time::OffsetDateTime::now_utc().unix_timestamp() * 1000;
    let mut out = Installed { sagas: 0, observed: 0, events: 0 };
    // A few hundred sites at a time: their records are built, written and published together.
    for chunk in designs.chunks(500) {
        let mut records = Vec::new();
        let mut events = Vec::new();
        let mut versions = Vec::new();
        for design in chunk {
            let mut saga = finished_saga(design, &catalog, now_ms)?;
            events.extend(outbox_events(&saga));
            saga.outbox.clear();
            versions.extend(observed_of(design, &catalog, &saga.saga_id, now_ms));
            let pointer = pb::SiteLease {
                site_id: saga.site_id.clone(),
                saga_id: saga.saga_id.clone(),
                acquired_unix_ms: saga.started_unix_ms,
                ..Default::default()
            };
            records.push((saga, pointer));
        }
        let writes = records.iter().flat_map(|(saga, pointer)| {
            [
                (keys::saga(&saga.saga_id), Record::Saga(saga)),
                (keys::latest_install(&pointer.site_id), Record::Latest(pointer)),
            ]
        });
        let writes = writes.map(|(key, record)| {
            let sagas = sagas.clone();
            async move {
                match record {
                    Record::Saga(s) => sagas.put(&key, s).await,
                    Record::Latest(l) => sagas.put(&key, l).await,
                }
            }
        });
        for r in futures::stream::iter(writes).buffer_unordered(512).collect::<Vec<_>>().await {
            r?;
        }
        let puts = versions.iter().map(|v| {
            let observed = observed.clone();
            async move { observed.put(&keys::observed(&v.site_id, &v.node, &v.name), v).await }
        });
        for r in futures::stream::iter(puts).buffer_unordered(512).collect::<Vec<_>>().await {
            r?;
        }
        out.sagas += records.len();
        out.observed += versions.len();
        out.events += events.len();
        bus.publish_all(events).await?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::demo::{demo_packages, demo_site};

    fn catalog() -> BTreeMap<String, Package> {
        demo_packages().into_iter().map(|p| Package::try_from(p).unwrap()).map(|p| (p.reference().key(), p)).collect()
    }

    #[test]
    fn a_finished_install_has_every_node_ready_and_says_so() {
        let design = demo_site(7, 10);
        let saga = finished_saga(&design, &catalog(), 1_700_000_000_000).unwrap();
        assert_eq!(saga.outcome, pb::InstallOutcome::Success as i32);
        assert!(saga.nodes.iter().all(|n| n.step == pb::NodeStep::BinariesInstalled as i32));
        let events = outbox_events(&saga);
        assert_eq!(events.iter().map(|e| e.type_name.as_str()).collect::<Vec<_>>(), ["landfall.v1.SiteInstalled"]);
        assert!(events[0].subject.starts_with("landfall.evt.edge-08."));
        let observed = observed_of(&design, &catalog(), &saga.saga_id, 0);
        assert_eq!(observed.len(), 10 * 5);
        assert!(observed.iter().all(|o| o.kind != 0 && !o.event_id.is_empty()));
    }
}
