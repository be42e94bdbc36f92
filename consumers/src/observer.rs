//! The observer: keeps `landfall-observed` (what each node really runs) up to date from what
//! gateways report. One key per node and package: a report is checked against its node's
//! departure (`left.<site>.<node>`, known from a watch: [`departures`]) and costs a
//! compare-and-set write per package, so that what an earlier event reported never replaces
//! what a later one did (see [`Observer::write_if_later`]; the key's revision is remembered from
//! the last write, and read only when the write conflicts). A node that leaves, or a site
//! removed, is forgotten (purged, history and all).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bus_schema::names::{self, keys};
use bus_schema::pb::{self, BusEvent};
use bus_schema::retention;
use bus_schema::runtime::{self, Bus, BusError, ConsumerSpec, Delivery, HandlerError, Kv, RejectAs};
use futures::future::try_join_all;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

mod departures;

use crate::answers::Jobs;
use crate::clock::now_ms;
use crate::links::LinkWatch;

pub struct Observer {
    observed: Kv,
    packages: Kv,
    /// A site's report is written only as the answer to a job the hub sent that site.
    jobs: Jobs,
    /// Catalog kinds by "name@version": entries never change once registered.
    kinds: Mutex<HashMap<String, i32>>,
    /// What this process last wrote or found at each observed key (see [`Remembered`]).
    remembered: Mutex<Remembered>,
    /// The nodes that left their sites, as this process knows them.
    departures: departures::Departures,
}

/// Observed keys at most remembered (some 40 bytes each): past it, the memory starts over.
const MOST_REMEMBERED: usize = 2_000_000;

/// The revision and event of each observed key as this process last wrote or read it, so that a
/// report costs one compare-and-set write on the remembered revision (or one create, for a key
/// never seen), not a read first. Keys are remembered by a 64-bit hash, not whole (100,000 nodes'
/// packages in some 25 MB rather than 100): what is remembered is only a guess, which the
/// bucket checks. When another replica wrote the key since, it was purged, or two keys share a
/// hash, the write conflicts and the key is read, as it is when nothing is remembered. A report
/// no later than the remembered event reads the key too, before it is left unwritten.
#[derive(Default)]
struct Remembered {
    revisions: HashMap<u64, (u64, u64)>,
    hasher: std::hash::RandomState,
}

impl Remembered {
    fn hash(&self, key: &str) -> u64 {
        std::hash::BuildHasher::hash_one(&self.hasher, key)
    }

    fn get(&self, key: &str) -> Option<(u64, u64)> {
        self.revisions.get(&self.hash(key)).copied()
    }

    fn note(&mut self, key: &str, revision: u64, event_seq: u64) {
        let hash = self.hash(key);
        if self.revisions.len() >= MOST_REMEMBERED && !self.revisions.contains_key(&hash) {
            self.revisions.clear();
        }
        self.revisions.insert(hash, (revision, event_seq));
    }

    fn forget(&mut self, key: &str) {
        let hash = self.hash(key);
        self.revisions.remove(&hash);
    }
}

impl Observer {
    pub async fn new(bus: &Bus) -> Result<Self, BusError> {
        Ok(Self {
            observed: bus.kv(names::OBSERVED_BUCKET).await?,
            packages: bus.kv(names::PACKAGES_BUCKET).await?,
            jobs: Jobs::new(bus.kv(names::SAGAS_BUCKET).await?),
            kinds: Mutex::default(),
            remembered: Mutex::default(),
            departures: departures::Departures::default(),
        })
    }

    async fn kind_of(&self, name: &str, version: &str) -> Result<i32, BusError> {
        let key = format!("{name}@{version}");
        if let Some(k) = self.kinds.lock().expect("kinds lock").get(&key) {
            return Ok(*k);
        }
        let kind = self.packages.get::<pb::Package>(&keys::package(name, version)).await?.map_or(0, |(p, _)| p.kind);
        if kind != 0 {
            self.kinds.lock().expect("kinds lock").insert(key, kind);
        }
        Ok(kind)
    }

    async fn record(
        &self,
        d: &Delivery,
        site: &str,
        nodes: &[String],
        found: &[(String, String, i32)],
    ) -> Result<(), HandlerError> {
        let now = now_ms();
        let mut kept = Vec::with_capacity(nodes.len());
        for node in nodes {
            if self.back_or_never_left(d, site, node).await? {
                kept.push(node);
            }
        }
        let writes = kept.into_iter().flat_map(|node| {
            found.iter().map(move |(name, version, kind)| {
                let value = pb::ObservedVersion {
                    site_id: site.to_string(),
                    node: node.clone(),
                    name: name.clone(),
                    version: version.clone(),
                    kind: *kind,
                    updated_unix_ms: now,
                    event_id: d.envelope.id.clone(),
                    event_seq: d.stream_sequence,
                };
                async move { self.write_if_later(&keys::observed(site, node, name), &value).await }
            })
        });
        try_join_all(writes).await?;
        Ok(())
    }

    /// Writes `value` at `key` unless the key holds what the same or a later event reported.
    /// A site's reports are handled in stream order, but one can still come back late: its
    /// handler wrote it and died before the ack, a newer report of the node was handled by the
    /// next replica, and the server delivers the first again once its ack wait ends. Written
    /// blindly, that old version would stand until the node's next report.
    ///
    /// The first try goes without a read, on the revision this process remembers of the key
    /// ([`Remembered`]); a conflict, and every try after it, reads the key first.
    async fn write_if_later(&self, key: &str, value: &pb::ObservedVersion) -> Result<(), BusError> {
        let remembered = self.remembered().get(key);
        let mut written = match remembered {
            // Late, it seems: the read below says.
            Some((_, seq)) if seq >= value.event_seq => runtime::Cas::Conflict,
            Some((rev, _)) => self.observed.update(key, value, rev).await?,
            None => self.observed.create(key, value).await?,
        };
        loop {
            if let runtime::Cas::Written(rev) = written {
                self.remembered().note(key, rev, value.event_seq);
                return Ok(());
            }
            written = match self.observed.get::<pb::ObservedVersion>(key).await? {
                Some((held, rev)) if held.event_seq >= value.event_seq => {
                    debug!(%key, held = held.event_seq, late = value.event_seq, "a later report is written: kept");
                    self.remembered().note(key, rev, held.event_seq);
                    return Ok(());
                }
                Some((_, rev)) => self.observed.update(key, value, rev).await?,
                None => self.observed.create(key, value).await?,
            };
        }
    }

    fn remembered(&self) -> std::sync::MutexGuard<'_, Remembered> {
        self.remembered.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forgets what this process remembers of `keys`, which are purged.
    fn forget<'k>(&self, keys: impl IntoIterator<Item = &'k String>) {
        let mut remembered = self.remembered();
        keys.into_iter().for_each(|k| remembered.forget(k));
    }

    /// Whether what `d` reports of `node` may be written: the node never left its site, or it
    /// left and is back (the saga or rollout `d` answers started after it left, so the marker
    /// goes). A late report of a node that left is not written: it runs nothing of the site.
    async fn back_or_never_left(&self, d: &Delivery, site: &str, node: &str) -> Result<bool, HandlerError> {
        let key = keys::node_departed(site, node);
        let (left_unix_ms, rev) = match self.departures.of(&key) {
            departures::Known::Never => return Ok(true),
            departures::Known::Left(left, rev) => (left, rev),
            departures::Known::Unknown => {
                let Some((left, rev)) = self.observed.get::<pb::NodeDeparted>(&key).await? else { return Ok(true) };
                (left.left_unix_ms, rev)
            }
        };
        let started = self.jobs.started_unix_ms(&d.envelope.correlation).await?;
        if started.is_some_and(|t| t > left_unix_ms) {
            if self.observed.purge_if(&key, rev).await? != runtime::Cas::Conflict {
                self.departures.removed(&key, rev);
            }
            return Ok(true);
        }
        debug!(%site, %node, event = %d.envelope.id, "report of a node that left its site: not written");
        Ok(false)
    }

    /// Forgets what was observed of the node (its history too), and remembers that it left.
    async fn node_left(&self, d: &Delivery, e: &pb::NodeLeft) -> Result<(), HandlerError> {
        let departed = pb::NodeDeparted {
            site_id: e.site_id.clone(),
            node: e.node.clone(),
            boot_mac: e.boot_mac.clone(),
            left_unix_ms: now_ms(),
            event_id: d.envelope.id.clone(),
        };
        let key = keys::node_departed(&e.site_id, &e.node);
        let rev = self.observed.put(&key, &departed).await?;
        self.departures.wrote(&key, departed.left_unix_ms, rev);
        let prefix = keys::observed_node_prefix(&e.site_id, &e.node);
        let entries = self.observed.scan_few::<pb::ObservedVersion>(&prefix).await?;
        self.forget(entries.iter().map(|(key, _, _)| key));
        try_join_all(entries.iter().map(|(key, _, rev)| self.observed.purge_if(key, *rev))).await?;
        Ok(())
    }

    /// Forgets the departures older than the summary retention: no report of a node that left
    /// that long ago can still come (its jobs and events are gone by then).
    async fn forget_old_departures(&self, policy: &retention::StorePolicy, now: i64) -> Result<usize, BusError> {
        let mut forgotten = 0;
        for (key, d, rev) in self.observed.scan::<pb::NodeDeparted>(keys::DEPARTED_PREFIX).await? {
            if policy.summary_due(d.left_unix_ms, now)
                && self.observed.purge_if(&key, rev).await? != runtime::Cas::Conflict
            {
                self.departures.removed(&key, rev);
                forgotten += 1;
            }
        }
        Ok(forgotten)
    }

    /// Forgets everything observed at a removed site, and its departed nodes.
    async fn site_removed(&self, site: &str) -> Result<(), HandlerError> {
        let observed = self.observed.scan_few::<pb::ObservedVersion>(&keys::observed_site_prefix(site)).await?;
        self.forget(observed.iter().map(|(key, _, _)| key));
        try_join_all(observed.iter().map(|(key, _, _)| self.observed.purge(key))).await?;
        let departed = self.observed.scan_few::<pb::NodeDeparted>(&keys::departed_site_prefix(site)).await?;
        try_join_all(departed.iter().map(|(key, _, _)| self.observed.purge(key))).await?;
        departed.iter().for_each(|(key, _, rev)| self.departures.removed(key, *rev));
        self.observed.purge(&keys::link(site)).await?;
        debug!(%site, keys = observed.len(), "observed state of a removed site forgotten");
        Ok(())
    }

    /// Records what a node's report (`NodePatched`, alone or in its site's report `d`) says it
    /// runs, once it is checked to answer the job the hub sent its site.
    async fn node_patched(&self, d: &Delivery, e: pb::NodePatched) -> Result<(), HandlerError> {
        let p = e.package.unwrap_or_default();
        self.jobs.check(d, Some(&e.node), Some(&p)).await?;
        let kind = self.kind_of(&p.name, &p.version).await?;
        self.record(d, &e.site_id, &[e.node], &[(p.name, p.version, kind)]).await
    }

    async fn on_event(&self, d: &Delivery) -> Result<(), HandlerError> {
        let Some(names::ParsedSubject::Event { aggregate, kind, .. }) = names::parse_subject(&d.subject) else {
            return Ok(());
        };
        let is = |a: &str, k: &str| (aggregate, kind) == (a, k);
        if is(pb::NodeOsProvisioned::AGGREGATE, pb::NodeOsProvisioned::KIND) {
            let e: pb::NodeOsProvisioned = d.decode()?;
            self.jobs.check(d, Some(&e.node), None).await?;
            let Some((name, version)) = e.image.split_once('@') else { return Ok(()) };
            let found = [(name.to_string(), version.to_string(), pb::PackageKind::OsImage as i32)];
            self.record(d, &e.site_id, &[e.node], &found).await
        } else if is(pb::NodeBinariesInstalled::AGGREGATE, pb::NodeBinariesInstalled::KIND) {
            let e: pb::NodeBinariesInstalled = d.decode()?;
            self.jobs.check(d, Some(&e.node), None).await?;
            let kind = pb::PackageKind::Binary as i32;
            let found: Vec<_> = e.binaries.into_iter().map(|p| (p.name, p.version, kind)).collect();
            self.record(d, &e.site_id, &[e.node], &found).await
        } else if is(pb::NodePatched::AGGREGATE, pb::NodePatched::KIND) {
            let e: pb::NodePatched = d.decode()?;
            self.node_patched(d, e).await
        } else if is(pb::SitePatched::AGGREGATE, pb::SitePatched::KIND) {
            // Node reports that came in the site's report: each as if it had come alone.
            let e: pb::SitePatched = d.decode()?;
            if let Some(why) = unlike_its_site_report(&e) {
                return Err(HandlerError::reject(pb::RejectCode::Forbidden, why));
            }
            for node in e.nodes {
                self.node_patched(d, node).await?;
            }
            Ok(())
        } else if is(pb::NodeRolledBack::AGGREGATE, pb::NodeRolledBack::KIND) {
            // A failed node put back runs what it ran before again.
            let e: pb::NodeRolledBack = d.decode()?;
            let p = e.package.unwrap_or_default();
            self.jobs.check(d, Some(&e.node), Some(&p)).await?;
            let kind = self.kind_of(&p.name, &p.version).await?;
            self.record(d, &e.site_id, &[e.node], &[(p.name, p.version, kind)]).await
        } else if is(pb::NodeReady::AGGREGATE, pb::NodeReady::KIND) {
            // A node that joined runs its role's whole set, the cluster's container packages included.
            let e: pb::NodeReady = d.decode()?;
            let mut found = Vec::with_capacity(e.packages.len());
            for p in e.packages {
                let kind = self.kind_of(&p.name, &p.version).await?;
                found.push((p.name, p.version, kind));
            }
            self.record(d, &e.site_id, &[e.node], &found).await
        } else if is(pb::ContainerPackagesApplied::AGGREGATE, pb::ContainerPackagesApplied::KIND) {
            // Container packages run on the cluster: every node of the site known so far runs them
            // (`observed_nodes` gives each node once).
            let e: pb::ContainerPackagesApplied = d.decode()?;
            self.jobs.check(d, None, None).await?;
            let nodes: Vec<String> =
                runtime::site_observed_nodes(&self.observed, &e.site_id).await?.into_iter().map(|n| n.node).collect();
            let mut found = Vec::with_capacity(e.packages.len());
            for p in e.packages {
                let kind = self.kind_of(&p.name, &p.version).await?;
                found.push((p.name, p.version, kind));
            }
            self.record(d, &e.site_id, &nodes, &found).await
        } else if is(pb::NodeLeft::AGGREGATE, pb::NodeLeft::KIND) {
            // A node that left the site runs nothing of it any more.
            let e: pb::NodeLeft = d.decode()?;
            self.node_left(d, &e).await
        } else if is(pb::SiteRemoved::AGGREGATE, pb::SiteRemoved::KIND) {
            let e: pb::SiteRemoved = d.decode()?;
            self.site_removed(&e.site_id).await
        } else {
            Ok(())
        }
    }
}

struct Events(Arc<Observer>);

impl runtime::Handler for Events {
    async fn handle(&self, d: &Delivery) -> Result<(), HandlerError> {
        self.0.on_event(d).await
    }
}

/// Runs the observer until `shutdown`.
pub async fn run_observer(bus: Bus, shutdown: CancellationToken) -> anyhow::Result<()> {
    run_observer_with(bus, retention::StorePolicy::default(), names::CUT_OFF_AFTER, shutdown).await
}

/// [`run_observer`], sweeping deletion markers as `policy` says (how often, how old), and
/// writing a site cut off once nothing was heard of it for `cut_off_after` (see [`crate::links`]).
pub async fn run_observer_with(
    bus: Bus,
    policy: retention::StorePolicy,
    cut_off_after: std::time::Duration,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let observer = Arc::new(Observer::new(&bus).await?);
    let links = LinkWatch::new(&bus, cut_off_after).await?;
    let links = tokio::spawn(links.run(shutdown.clone()));
    let spec = ConsumerSpec::new(
        names::EVENTS_STREAM,
        names::OBSERVER_EVENTS,
        // Every event: see `saga_event_filters` for why not the kinds above alone.
        vec![names::EVENTS_ALL.to_string()],
        RejectAs::Message { consumer: names::OBSERVER_EVENTS.to_string() },
    )
    // A node's reports are written in the order they were made; sites run side by side.
    .ordered_by_token(names::SCOPE_TOKEN, None)
    .concurrency(512);
    let sweep = tokio::spawn(sweep_markers(observer.clone(), policy, shutdown.clone()));
    let departures = {
        let (observer, shutdown) = (observer.clone(), shutdown.clone());
        tokio::spawn(async move { observer.departures.follow(&observer.observed, shutdown).await })
    };
    runtime::consume(bus, spec, Arc::new(Events(observer)), shutdown).await?;
    let _ = sweep.await;
    let _ = departures.await;
    links.await??;
    Ok(())
}

/// Removes the markers forgotten keys leave in `landfall-observed` once they are old (see
/// `Kv::sweep_markers`), every compaction interval, until `shutdown`.
async fn sweep_markers(observer: Arc<Observer>, policy: retention::StorePolicy, shutdown: CancellationToken) {
    let mut every = tokio::time::interval(policy.compaction_interval);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = every.tick() => {}
        }
        if let Err(e) = observer.observed.sweep_markers(">", policy.marker_retention, now_ms()).await {
            warn!(error = %runtime::error_chain(&e), "sweeping the observed bucket's markers failed; trying again later");
        }
        if let Err(e) = observer.forget_old_departures(&policy, now_ms()).await {
            warn!(error = %runtime::error_chain(&e), "forgetting old departures failed; trying again later");
        }
    }
}

/// Why the node reports that came in a site's report cannot be its own, if they cannot: each
/// must be of the report's rollout and package, and one of the nodes it says were patched or
/// found at the version, once.
fn unlike_its_site_report(e: &pb::SitePatched) -> Option<String> {
    let mut seen = std::collections::HashSet::new();
    for n in &e.nodes {
        let said = if n.unchanged { &e.unchanged } else { &e.patched };
        if !said.contains(&n.node) || !seen.insert(n.node.as_str()) {
            return Some(format!(
                "the report of site {} carries a report of node {} that it does not list as {} (or carries twice)",
                e.site_id,
                n.node,
                if n.unchanged { "found at the version" } else { "patched" }
            ));
        }
        if n.rollout_id != e.rollout_id || n.package != e.package {
            return Some(format!(
                "the report of site {} for rollout {} carries a report of node {} for another rollout or package",
                e.site_id, e.rollout_id, n.node
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_reports_in_a_site_report_must_be_of_its_nodes_rollout_and_package() {
        let package = Some(pb::PackageRef { name: "kubelet".into(), version: "1.31.2".into() });
        let node = |name: &str, unchanged: bool| pb::NodePatched {
            site_id: "edge-01".into(),
            node: name.into(),
            rollout_id: "r-1".into(),
            package: package.clone(),
            unchanged,
            ..Default::default()
        };
        let honest = pb::SitePatched {
            site_id: "edge-01".into(),
            rollout_id: "r-1".into(),
            package: package.clone(),
            patched: vec!["w-1".into(), "w-2".into()],
            unchanged: vec!["w-3".into()],
            nodes: vec![node("w-1", false), node("w-3", true)],
            ..Default::default()
        };
        assert_eq!(unlike_its_site_report(&honest), None);
        let with = |nodes: Vec<pb::NodePatched>| pb::SitePatched { nodes, ..honest.clone() };
        for (forged, what) in [
            (with(vec![node("w-9", false)]), "a node the report does not list"),
            (with(vec![node("w-1", true)]), "a patched node said found at the version"),
            (with(vec![node("w-1", false), node("w-1", false)]), "a node twice"),
            (with(vec![pb::NodePatched { rollout_id: "r-2".into(), ..node("w-1", false) }]), "another rollout"),
            (with(vec![pb::NodePatched { package: None, ..node("w-1", false) }]), "another package"),
        ] {
            assert!(unlike_its_site_report(&forged).is_some(), "{what}");
        }
    }
}
