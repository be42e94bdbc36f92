//! What a finished install leaves on the hub, for every site of a registered fleet, made
//! without running one: the install saga is driven to its end by the saga's own decisions
//! (`consumers::saga`), as the orchestrator would over the gateways' reports, then written as
//! the orchestrator leaves it (outbox published and cleared, `latest.<site>` naming it); what
//! every node runs is written as the observer writes it from those reports; and every event of
//! the install, the reports and the orchestrator's own, is published. The read model cannot
//! tell this fleet from one really installed.

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
/// install, and every event the install published: the gateway's reports (each one the input
/// the saga decided on) and the orchestrator's own, in the order they were published.
fn finished_install(
    design: &SiteDesign,
    catalog: &BTreeMap<String, Package>,
    now_ms: i64,
) -> anyhow::Result<(pb::InstallSaga, Vec<Outgoing>)> {
    let cmd = Envelope::root();
    let site = design.site.to_string();
    let resolved = saga::resolve(design, catalog).map_err(|r| anyhow::anyhow!("{site}: {}", r.reason))?;
    let staged = pb::ArtifactsStaged {
        site_id: site.clone(),
        artifacts: resolved.packages.len() as u32,
        bytes_transferred: resolved.packages.values().map(|p| p.size).sum(),
        ..Default::default()
    };
    let mut state = saga::start(&cmd, design, resolved, now_ms);
    let mut events = outbox_events(&state);
    let image = |role: Role| {
        design
            .packages_for(role)
            .iter()
            .find(|p| catalog.get(&p.key()).is_some_and(|c| c.kind == pb::PackageKind::OsImage))
    };
    let by_role = |role: Role| design.nodes.iter().filter(|n| n.role == role).map(|n| n.name.to_string()).collect();
    let report = |step: &str, node: Option<&str>| cmd.derive(step, node);

    // What the gateway and the kubeconfig collector report, each with what the saga makes of it.
    let mut reports: Vec<(Option<Input>, Outgoing)> =
        vec![(Some(Input::Staged), Outgoing::event(&staged, report("artifacts_staged", None)))];
    for n in &design.nodes {
        let (node, image) = (n.name.to_string(), image(n.role).map(|p| p.key()).unwrap_or_default());
        for state in ["inspecting", "provisioning"] {
            let evt = pb::NodeOsProvisioning {
                site_id: site.clone(),
                node: node.clone(),
                state: state.into(),
                image: image.clone(),
            };
            let input = Input::OsState { node: node.clone(), state: state.into() };
            reports.push((Some(input), Outgoing::event(&evt, report(&format!("os_state/{state}"), Some(&node)))));
        }
        let evt = pb::NodeOsProvisioned { site_id: site.clone(), node: node.clone(), image };
        let env = report("os_provisioned", Some(&node));
        reports.push((Some(Input::OsProvisioned { node }), Outgoing::event(&evt, env)));
    }
    for n in &design.nodes {
        let binaries = design
            .packages_for(n.role)
            .iter()
            .filter(|p| catalog.get(&p.key()).is_some_and(|c| c.kind == pb::PackageKind::Binary))
            .map(pb::PackageRef::from)
            .collect();
        let evt = pb::NodeBinariesInstalled { site_id: site.clone(), node: n.name.to_string(), binaries };
        reports.push((None, Outgoing::event(&evt, report("binaries_installed", Some(n.name.as_str())))));
    }
    let ready = pb::ClusterReady {
        site_id: site.clone(),
        masters: by_role(Role::Master),
        workers: by_role(Role::Worker),
        failed: Vec::new(),
    };
    reports.push((Some(Input::ClusterReady(ready.clone())), Outgoing::event(&ready, report("cluster_ready", None))));
    let stored = pb::KubeconfigStored { site_id: site.clone(), key_id: "bench".into(), revision: 1 };
    reports.push((Some(Input::KubeconfigStored), Outgoing::event(&stored, report("kubeconfig_stored", None))));
    let containers: Vec<pb::PackageRef> = design
        .all_packages()
        .into_iter()
        .filter(|p| catalog.get(&p.key()).is_some_and(|c| c.kind == pb::PackageKind::Container))
        .map(pb::PackageRef::from)
        .collect();
    let applied = pb::ContainerPackagesApplied { site_id: site.clone(), packages: containers };
    reports.push((Some(Input::ContainersApplied), Outgoing::event(&applied, report("containers_applied", None))));

    for (input, evt) in reports {
        let cause = evt.envelope.clone();
        events.push(evt);
        let Some(input) = input else { continue };
        // The orchestrator publishes each step's outbox and clears it before the next.
        state.outbox.clear();
        match saga::decide(&state, &input, &cause, now_ms) {
            Decision::Apply(next) => state = *next,
            other => anyhow::bail!("{site}: the install saga did not take {input:?}: {other:?}"),
        }
        events.extend(outbox_events(&state));
    }
    state.outbox.clear();
    anyhow::ensure!(
        state.phase == pb::InstallPhase::Succeeded as i32,
        "{site}: the install saga ended in phase {}",
        saga::phase_name(state.phase)
    );
    Ok((state, events))
}

/// The events of an outbox, ready to publish with their recorded ids (its jobs are left out:
/// no gateway is there to take them).
fn outbox_events(saga: &pb::InstallSaga) -> Vec<Outgoing> {
    consumers::outgoing(&saga.outbox, &saga.saga_id)
        .into_iter()
        .filter(|m| matches!(names::parse_subject(&m.subject), Some(names::ParsedSubject::Event { .. })))
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
                event_seq: 0,
            })
        })
        .collect()
}

/// Which of a site's two records in `landfall-sagas` is written.
#[derive(Clone, Copy)]
enum Write {
    Latest,
    Saga,
}

/// Writes what a finished install leaves for every site of `designs` (registered already, with
/// `catalog` registered), and publishes the install's events.
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
            let (saga, published) = finished_install(design, &catalog, now_ms)?;
            events.extend(published);
            versions.extend(observed_of(design, &catalog, &saga.saga_id, now_ms));
            let pointer = pb::SiteLease {
                site_id: saga.site_id.clone(),
                saga_id: saga.saga_id.clone(),
                acquired_unix_ms: saga.started_unix_ms,
                ..Default::default()
            };
            records.push((saga, pointer));
        }
        // The pointer before the saga, as the orchestrator writes them (at the install's start,
        // and as it goes): a reader replaying the bucket meets them in that order.
        for write in [Write::Latest, Write::Saga] {
            let puts = records.iter().map(|(saga, pointer)| {
                let sagas = sagas.clone();
                async move {
                    match write {
                        Write::Latest => sagas.put(&keys::latest_install(&pointer.site_id), pointer).await,
                        Write::Saga => sagas.put(&keys::saga(&saga.saga_id), saga).await,
                    }
                }
            });
            for r in futures::stream::iter(puts).buffer_unordered(512).collect::<Vec<_>>().await {
                r?;
            }
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
        // In parts: the client holds at most 5,000 acks in flight, and publish_all awaits its
        // acks only after sending every message.
        let mut events = events.into_iter().peekable();
        while events.peek().is_some() {
            bus.publish_all(events.by_ref().take(2048).collect()).await?;
        }
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
        let (saga, events) = finished_install(&design, &catalog(), 1_700_000_000_000).unwrap();
        assert_eq!(saga.outcome, pb::InstallOutcome::Success as i32);
        assert!(saga.nodes.iter().all(|n| n.step == pb::NodeStep::BinariesInstalled as i32));
        assert!(saga.outbox.is_empty());
        let types: Vec<&str> = events.iter().map(|e| e.type_name.as_str()).collect();
        assert_eq!(types.first(), Some(&"landfall.v1.SiteInstallStarted"));
        assert_eq!(types.last(), Some(&"landfall.v1.SiteInstalled"));
        // The reports (staged; two states, provisioned and binaries per node; the cluster, the
        // kubeconfig, the containers) and the orchestrator's start and end: no job.
        assert_eq!(events.len(), 1 + 10 * 4 + 3 + 2);
        assert!(events.iter().all(|e| e.subject.starts_with("landfall.evt.edge-08.")));
        let observed = observed_of(&design, &catalog(), &saga.saga_id, 0);
        assert_eq!(observed.len(), 10 * 5);
        assert!(observed.iter().all(|o| o.kind != 0 && !o.event_id.is_empty()));
    }
}
