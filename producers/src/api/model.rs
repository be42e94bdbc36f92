//! The read model behind the API's GETs: every site, node, package and rollout, kept in
//! memory and up to date from KV watches and the events stream, so a request reads memory
//! and a dashboard over a thousand sites costs the bus nothing per page view.
//!
//! Each API replica keeps its own copy; a watch that breaks is made again and replays the
//! latest value of every key, so nothing is missed. It keeps what views read, not every record
//! ever written: sagas under way, each site's latest install and each node's latest join (a
//! compacted one as its summary), and rollouts (a compacted one as its summary).
//!
//! It stays small and quick at fleet size: of the observed versions (a fleet of 10,000 sites
//! of 10 nodes running 5 packages has 500,000) it keeps the package, version and kind, each
//! name one shared string; of a saga, what views read (no outbox, jobs or hardware); and what
//! the overview counts of each site, updated with the site's records, so that the overview and
//! a page filtered by state read counters instead of walking every site.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_nats::jetstream::consumer::DeliverPolicy;
use bus_schema::names::{self, keys};
use bus_schema::pb;
use bus_schema::runtime::{Bus, KvChange};
use futures::StreamExt;
use prost::Message;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::facts::{Counts, SiteFacts};
use crate::views::attention;

/// The last event seen of a site.
#[derive(Debug, Clone)]
pub struct LastEvent {
    pub type_name: String,
    pub seq: u64,
    pub time: time::OffsetDateTime,
    pub summary: String,
}

/// One package on one node, as its gateway last reported it: what views read of an
/// `ObservedVersion` (the record's time and event are not kept).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    pub name: Arc<str>,
    pub version: Arc<str>,
    pub kind: i32,
}

/// What each node of a site runs: node → its packages, by name.
pub type SiteObserved = BTreeMap<Arc<str>, Vec<Running>>;

/// One shared copy of each package name, version and node name the model holds: a fleet's
/// nodes run a handful of packages at a handful of versions, and node names repeat from site
/// to site. Strings no record holds any more are dropped once the table has doubled.
#[derive(Default)]
struct Strings {
    set: HashSet<Arc<str>>,
    sweep_at: usize,
}

impl Strings {
    fn get(&mut self, s: &str) -> Arc<str> {
        if let Some(shared) = self.set.get(s) {
            return shared.clone();
        }
        let shared: Arc<str> = Arc::from(s);
        self.set.insert(shared.clone());
        if self.set.len() > self.sweep_at {
            self.set.retain(|s| Arc::strong_count(s) > 1);
            self.sweep_at = (self.set.len() * 2).max(1024);
        }
        shared
    }
}

/// What the model holds. Read it through [`Model::read`].
#[derive(Default)]
pub struct State {
    /// Site id → its design and the design's KV revision.
    pub designs: BTreeMap<String, pb::SiteDesign>,
    /// Site id → the saga id of its latest install.
    pub latest_install: HashMap<String, String>,
    /// Saga id → the saga, without its outbox, catalog and design (what views need): those
    /// under way, each site's latest install and each node's latest join; a compacted one
    /// stands in as its summary.
    pub sagas: HashMap<String, pb::InstallSaga>,
    /// Saga id → its summary, for the sagas views read (see `sagas`).
    saga_summaries: HashMap<String, pb::SagaSummary>,
    /// Rollout ids compacted: their summary stands in when the record goes.
    rollout_summaries: HashMap<String, pb::RolloutSummary>,
    /// Site id → node → the latest join saga of that node.
    pub joins: HashMap<String, BTreeMap<String, String>>,
    /// Site id → who holds its lease.
    pub leases: HashMap<String, pb::SiteLease>,
    /// Site id → node → what the node runs.
    pub observed: HashMap<String, SiteObserved>,
    strings: Strings,
    /// `name@version` → catalog entry.
    pub packages: BTreeMap<String, pb::Package>,
    /// Package name → auto-rollout policy.
    pub policies: BTreeMap<String, pb::PackagePolicy>,
    /// Rollout id → its state, without its outbox and bitmaps.
    pub rollouts: HashMap<String, pb::Rollout>,
    /// Site id → its last event.
    pub last_event: HashMap<String, LastEvent>,
    /// Site id → whether the hub hears it, for every site heard once (`link.<site>`, and the
    /// link events, whichever arrives first).
    pub links: HashMap<String, pb::SiteLink>,
    /// Site id → what it last found unlike the hub (`SiteDisagrees`), until an install starts
    /// there again or a rollout passes it with no node left aside.
    pub disagrees: HashMap<String, String>,
    /// Site id → node → the Metal3 state its latest `NodeOsProvisioning` reported, an install's
    /// or a reimage's (a rollout of an os-image): newer than what the install's record says.
    pub metal3: HashMap<String, HashMap<String, String>>,
    /// Site id → node → `cordoned`, `drained` or `wiped`, for a node a patch or a reprovision has
    /// taken out of service and not given back yet (`NodeCordoned`, `NodeDrained`, `NodeRetired`,
    /// a `NodePatchFailed` whose steps left it cordoned; `NodeUncordoned`, `NodePatched` or the
    /// node's `NodeReady` ends it, `NodePatched` not for a node wiped for its reprovision).
    pub out_of_service: HashMap<String, HashMap<String, String>>,
    /// Site id → what the overview counts of it, for every site with a design; and their sum.
    /// Kept as the site's records change (see [`State::refresh`]).
    facts: HashMap<String, SiteFacts>,
    counts: Counts,
    /// How many of the sources have caught up with the bus.
    caught_up: usize,
}

/// The sources the model follows: four KV watches and the events stream.
const SOURCES: usize = 5;

impl State {
    /// Whether every source has read what the bus held when it started.
    pub fn ready(&self) -> bool {
        self.caught_up >= SOURCES
    }

    /// What the overview counts of every registered site.
    pub fn counts(&self) -> &Counts {
        &self.counts
    }

    /// What the overview counts of one registered site.
    pub fn facts(&self, site: &str) -> Option<&SiteFacts> {
        self.facts.get(site)
    }

    /// What a node runs now, as its gateway reported.
    pub(super) fn observe(&mut self, o: pb::ObservedVersion) {
        let State { observed, strings, .. } = self;
        let running = Running { name: strings.get(&o.name), version: strings.get(&o.version), kind: o.kind };
        let node = strings.get(&o.node);
        let packages = observed.entry(o.site_id).or_default().entry(node).or_default();
        match packages.binary_search_by(|r| r.name.cmp(&running.name)) {
            Ok(i) => packages[i] = running,
            Err(i) => {
                // Grown one at a time: a node runs a few packages, and this keeps no spare room.
                packages.reserve_exact(1);
                packages.insert(i, running);
            }
        }
    }

    /// The site's link as `link` says, unless what the model holds is newer: the record and the
    /// event of one change arrive by two paths, in either order.
    pub(super) fn link(&mut self, link: pb::SiteLink) {
        let site = link.site_id.clone();
        if self.links.get(&site).is_some_and(|held| held.since_unix_ms > link.since_unix_ms) {
            return;
        }
        self.links.insert(site.clone(), link);
        self.refresh(&site);
    }

    /// `key` (`node.<site>.<node>.<package>`) was purged: its node no longer runs it.
    fn forget_observed(&mut self, key: &str) {
        let mut parts = key.splitn(4, '.').skip(1);
        let (Some(site), Some(node)) = (parts.next(), parts.next()) else { return };
        let Some(nodes) = self.observed.get_mut(site) else { return };
        if let Some(packages) = nodes.get_mut(node) {
            packages.retain(|r| keys::observed(site, node, &r.name) != key);
            if packages.is_empty() {
                nodes.remove(node);
            }
        }
        if nodes.is_empty() {
            self.observed.remove(site);
        }
    }

    /// Counts every site again from its records (as [`State::refresh`] keeps them counted).
    #[cfg(test)]
    pub(super) fn recount(&mut self) {
        let sites: Vec<String> = self.designs.keys().chain(self.facts.keys()).cloned().collect();
        for site in sites {
            self.refresh(&site);
        }
    }

    /// Counts `site` again from its records, after one of them changed.
    fn refresh(&mut self, site: &str) {
        if let Some(before) = self.facts.remove(site) {
            self.counts.remove(&before);
        }
        let Some(design) = self.designs.get(site) else { return };
        let install = self.latest_install.get(site).and_then(|id| self.sagas.get(id));
        let mut facts = SiteFacts::of(design, install, self.leases.contains_key(site), |n| self.node_saga(site, n));
        facts.cut_off = self.links.get(site).is_some_and(|l| l.state == pb::LinkState::CutOff as i32);
        self.counts.add(&facts);
        self.facts.insert(site.to_string(), facts);
    }

    /// The saga that last worked on `node` of `site`: its join, when newer than the install.
    pub fn node_saga(&self, site: &str, node: &str) -> Option<&pb::InstallSaga> {
        let install = self.latest_install.get(site).and_then(|id| self.sagas.get(id));
        let join = self.joins.get(site).and_then(|j| j.get(node)).and_then(|id| self.sagas.get(id));
        super::facts::latest_work(install, join)
    }
}

#[derive(Clone)]
pub struct Model {
    state: Arc<RwLock<State>>,
}

impl Model {
    /// Starts following the bus; the model fills as the watches deliver.
    pub fn start(bus: &Bus, shutdown: &CancellationToken) -> Self {
        let model = Self { state: Arc::new(RwLock::new(State::default())) };
        let follow = [
            (names::SITES_BUCKET, vec![format!("{}>", keys::SITE_PREFIX)]),
            (
                names::SAGAS_BUCKET,
                ["saga.>", "latest.>", "lease.>", "rollout.*", "summary.>"].map(String::from).to_vec(),
            ),
            (names::OBSERVED_BUCKET, vec![format!("{}>", keys::OBSERVED_PREFIX), format!("{}>", keys::LINK_PREFIX)]),
            (names::PACKAGES_BUCKET, vec![format!("{}>", keys::PACKAGE_PREFIX), format!("{}>", keys::POLICY_PREFIX)]),
        ];
        for (bucket, patterns) in follow {
            tokio::spawn(model.clone().follow_bucket(bus.clone(), bucket, patterns, shutdown.clone()));
        }
        tokio::spawn(model.clone().follow_events(bus.clone(), shutdown.clone()));
        model
    }

    pub fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    async fn follow_bucket(self, bus: Bus, bucket: &'static str, patterns: Vec<String>, shutdown: CancellationToken) {
        let mut counted = false;
        while !shutdown.is_cancelled() {
            let watch = match bus.kv(bucket).await {
                Ok(kv) => kv.watch_latest(patterns.clone()).await,
                Err(e) => Err(e),
            };
            match watch {
                Ok(changes) => {
                    tokio::pin!(changes);
                    // An empty bucket delivers nothing: it is caught up at once.
                    let mut idle = Box::pin(tokio::time::sleep(Duration::from_millis(300)));
                    loop {
                        let change = tokio::select! {
                            _ = shutdown.cancelled() => return,
                            _ = &mut idle, if !counted => {
                                counted = true;
                                self.write().caught_up += 1;
                                continue;
                            }
                            c = changes.next() => c,
                        };
                        match change {
                            Some(Ok(c)) => {
                                // Still reading what the bucket holds: the quiet spell starts again.
                                if !counted {
                                    idle.as_mut().reset(tokio::time::Instant::now() + Duration::from_millis(300));
                                }
                                let caught_up = c.caught_up;
                                self.apply(bucket, c);
                                if caught_up && !counted {
                                    counted = true;
                                    self.write().caught_up += 1;
                                }
                            }
                            Some(Err(e)) => {
                                warn!(bucket, error = %e, "read model: watch broke, watching again");
                                break;
                            }
                            None => break,
                        }
                    }
                }
                Err(e) => warn!(bucket, error = %e, "read model: cannot watch, retrying"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    fn apply(&self, bucket: &str, change: KvChange) {
        let KvChange { key, value, .. } = change;
        match bucket {
            names::SITES_BUCKET => {
                let Some(site) = keys::site_of(&key) else { return };
                let design = value.and_then(|v| decode::<pb::SiteDesign>(&key, v));
                let mut st = self.write();
                match design {
                    Some(d) => {
                        st.designs.insert(site.to_string(), d);
                    }
                    None => {
                        st.designs.remove(site);
                        st.metal3.remove(site);
                        st.disagrees.remove(site);
                    }
                }
                st.refresh(site);
            }
            names::SAGAS_BUCKET => {
                let mut st = self.write();
                if let Some(site) = apply_saga_key(&mut st, &key, value) {
                    st.refresh(&site);
                }
            }
            names::OBSERVED_BUCKET if key.starts_with(keys::LINK_PREFIX) => {
                let site = &key[keys::LINK_PREFIX.len()..];
                let mut st = self.write();
                match value.and_then(|v| decode::<pb::SiteLink>(&key, v)) {
                    Some(link) => st.link(link),
                    None => {
                        st.links.remove(site);
                        st.refresh(site);
                    }
                }
            }
            // node.<site>.<node>.<package>: the record itself names all three.
            names::OBSERVED_BUCKET => match value.and_then(|v| decode::<pb::ObservedVersion>(&key, v)) {
                Some(o) => self.write().observe(o),
                None => self.write().forget_observed(&key),
            },
            names::PACKAGES_BUCKET => {
                let mut st = self.write();
                if key.starts_with(keys::PACKAGE_PREFIX) {
                    match value.and_then(|v| decode::<pb::Package>(&key, v)) {
                        Some(p) => {
                            st.packages.insert(format!("{}@{}", p.name, p.version), p);
                        }
                        None => st.packages.retain(|_, p| keys::package(&p.name, &p.version) != key),
                    }
                } else if key.starts_with(keys::POLICY_PREFIX) {
                    match value.and_then(|v| decode::<pb::PackagePolicy>(&key, v)) {
                        Some(p) => {
                            st.policies.insert(p.name.clone(), p);
                        }
                        None => st.policies.retain(|name, _| keys::policy(name) != key),
                    }
                }
            }
            _ => {}
        }
    }

    async fn follow_events(self, bus: Bus, shutdown: CancellationToken) {
        let mut counted = false;
        let mut from: Option<u64> = None;
        while !shutdown.is_cancelled() {
            // First the last event of every subject (so every site's latest), then live.
            let policy = match from {
                Some(seq) => DeliverPolicy::ByStartSequence { start_sequence: seq },
                None => DeliverPolicy::LastPerSubject,
            };
            match bus.read_events(vec![names::EVENTS_ALL.to_string()], policy).await {
                Ok(mut reader) => {
                    if reader.pending_at_start == 0 && !counted {
                        counted = true;
                        self.write().caught_up += 1;
                    }
                    loop {
                        let next = tokio::select! {
                            _ = shutdown.cancelled() => return,
                            n = reader.next() => n,
                        };
                        match next {
                            Some(Ok(e)) => {
                                from = Some(e.delivery.stream_sequence + 1);
                                self.apply_event(&e);
                                if e.pending == 0 && !counted {
                                    counted = true;
                                    self.write().caught_up += 1;
                                }
                            }
                            Some(Err(e)) => {
                                warn!(error = %e, "read model: event reader broke, reading again");
                                break;
                            }
                            None => break,
                        }
                    }
                }
                Err(e) => warn!(error = %e, "read model: cannot read events, retrying"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    fn apply_event(&self, e: &bus_schema::runtime::ReadEvent) {
        let Some(names::ParsedSubject::Event { scope, .. }) = names::parse_subject(&e.delivery.subject) else { return };
        if scope == names::FLEET {
            return;
        }
        let summary = match pb::decode_to_json(&e.delivery.type_name, &e.delivery.payload) {
            Some(Ok(v)) => crate::views::event::summary(&v),
            _ => String::new(),
        };
        let last = LastEvent {
            type_name: e.delivery.type_name.clone(),
            seq: e.delivery.stream_sequence,
            time: e.published,
            summary,
        };
        let link = link_of_event(&e.delivery.type_name, &e.delivery.payload);
        let metal3 = metal3_of_event(&e.delivery.type_name, &e.delivery.payload).filter(|m| m.site_id == scope);
        let mut service = service_of_event(&e.delivery.type_name, &e.delivery.payload);
        service.retain(|(site, ..)| site == scope);
        let disagrees = attention::disagreement_of(&e.delivery.type_name, &e.delivery.payload);
        let agrees = attention::clears_disagreement(&e.delivery.type_name, &e.delivery.payload);
        let mut st = self.write();
        // The subject's site is the one it speaks for.
        if let Some(reason) = disagrees {
            st.disagrees.insert(scope.to_string(), reason);
        } else if agrees {
            st.disagrees.remove(scope);
        }
        if let Some(m) = metal3 {
            st.metal3.entry(m.site_id).or_default().insert(m.node, m.state);
        }
        for (site, node, service) in service {
            let nodes = st.out_of_service.entry(site).or_default();
            match service {
                Service::Out(state) => {
                    nodes.insert(node, state.to_string());
                }
                Service::Back => {
                    nodes.remove(&node);
                }
                Service::BackFromPatch => {
                    if nodes.get(&node).is_some_and(|s| s != WIPED) {
                        nodes.remove(&node);
                    }
                }
            }
        }
        let newer = st.last_event.get(scope).is_none_or(|l| l.seq < last.seq);
        if newer {
            st.last_event.insert(scope.to_string(), last);
        }
        if let Some(link) = link {
            st.link(link);
        }
    }
}

fn decode<M: Message + Default>(key: &str, value: bytes::Bytes) -> Option<M> {
    match M::decode(value) {
        Ok(m) => Some(m),
        Err(e) => {
            debug!(key, error = %e, "read model: skipping a value that does not decode");
            None
        }
    }
}

/// The Metal3 state a `NodeOsProvisioning` reports (whose site must be its subject's).
fn metal3_of_event(type_name: &str, payload: &[u8]) -> Option<pb::NodeOsProvisioning> {
    use pb::BusMessage;
    (type_name == pb::NodeOsProvisioning::TYPE).then(|| pb::NodeOsProvisioning::decode(payload).ok()).flatten()
}

/// What an event says of a node's service.
#[derive(Debug, PartialEq, Eq)]
enum Service {
    /// Out of service, in this state.
    Out(&'static str),
    Back,
    /// Back from a patch's cordon: a node wiped for its reprovision stays out.
    BackFromPatch,
}

/// A node's state while it is wiped for its reprovision.
const WIPED: &str = "wiped";

/// Nodes going out of service or back: (site, node, what of its service) each.
fn service_of_event(type_name: &str, payload: &[u8]) -> Vec<(String, String, Service)> {
    use pb::BusMessage;
    // The node reports that came in a site's report, each as if it had come alone.
    if type_name == pb::SitePatched::TYPE {
        let nodes = pb::SitePatched::decode(payload).map(|e| e.nodes).unwrap_or_default();
        return nodes.into_iter().map(|n| (n.site_id, n.node, Service::BackFromPatch)).collect();
    }
    service_of_node_event(type_name, payload).into_iter().collect()
}

/// A node going out of service or back: (site, node, what of its service).
fn service_of_node_event(type_name: &str, payload: &[u8]) -> Option<(String, String, Service)> {
    use pb::BusMessage;
    match type_name {
        t if t == pb::NodeCordoned::TYPE => {
            pb::NodeCordoned::decode(payload).ok().map(|e| (e.site_id, e.node, Service::Out("cordoned")))
        }
        t if t == pb::NodeDrained::TYPE => {
            pb::NodeDrained::decode(payload).ok().map(|e| (e.site_id, e.node, Service::Out("drained")))
        }
        t if t == pb::NodeUncordoned::TYPE => {
            pb::NodeUncordoned::decode(payload).ok().map(|e| (e.site_id, e.node, Service::Back))
        }
        // Seen Ready at its new version: given back, whether its steps came on their own or not.
        t if t == pb::NodePatched::TYPE => {
            pb::NodePatched::decode(payload).ok().map(|e| (e.site_id, e.node, Service::BackFromPatch))
        }
        // A failed node's steps held until its report: cordoned and not given back, it stays out.
        t if t == pb::NodePatchFailed::TYPE => {
            let e = pb::NodePatchFailed::decode(payload).ok()?;
            let steps = e.steps?;
            let service = match (steps.uncordoned, steps.drained, steps.cordoned) {
                (true, ..) => Service::BackFromPatch,
                (false, true, _) => Service::Out("drained"),
                (false, false, true) => Service::Out("cordoned"),
                (false, false, false) => return None,
            };
            Some((e.site_id, e.node, service))
        }
        // Wiped for its reprovision (a removed node leaves with NodeLeft): out of service until
        // its join sees it Ready.
        t if t == pb::NodeRetired::TYPE => {
            pb::NodeRetired::decode(payload).ok().map(|e| (e.site_id, e.node, Service::Out(WIPED)))
        }
        t if t == pb::NodeReady::TYPE => {
            pb::NodeReady::decode(payload).ok().map(|e| (e.site_id, e.node, Service::Back))
        }
        _ => None,
    }
}

/// What a link event says of its site's link (see `consumers::links`).
fn link_of_event(type_name: &str, payload: &[u8]) -> Option<pb::SiteLink> {
    use pb::BusMessage;
    if type_name == pb::SiteCutOff::TYPE {
        let e = pb::SiteCutOff::decode(payload).ok()?;
        let alive = pb::SiteAlive {
            outbox_waiting: e.outbox_waiting,
            last_report_type: e.last_report_type,
            last_report_unix_ms: e.last_report_unix_ms,
            ..Default::default()
        };
        let state = pb::LinkState::CutOff as i32;
        Some(pb::SiteLink {
            site_id: e.site_id,
            state,
            since_unix_ms: e.since_unix_ms,
            last_alive: Some(alive),
            ..Default::default()
        })
    } else if type_name == pb::SiteLinkRestored::TYPE {
        let e = pb::SiteLinkRestored::decode(payload).ok()?;
        let alive = pb::SiteAlive { outbox_waiting: e.outbox_waiting, ..Default::default() };
        Some(pb::SiteLink {
            site_id: e.site_id,
            state: pb::LinkState::Up as i32,
            since_unix_ms: e.restored_unix_ms,
            last_alive: Some(alive),
            cut_off_since_unix_ms: e.cut_off_since_unix_ms,
        })
    } else {
        None
    }
}

/// Applies a change of `landfall-sagas`; the site whose records it changed, if any.
fn apply_saga_key(st: &mut State, key: &str, value: Option<bytes::Bytes>) -> Option<String> {
    let (kind, rest) = key.split_once('.').unwrap_or((key, ""));
    match kind {
        "saga" => match value.and_then(|v| decode::<pb::InstallSaga>(key, v)) {
            Some(saga) => {
                let saga = what_views_read(saga);
                let site = saga.site_id.clone();
                if saga.join {
                    let joins = st.joins.entry(saga.site_id.clone()).or_default();
                    let mut replaced = Vec::new();
                    for n in saga.nodes.iter().filter_map(|n| n.node.as_ref()) {
                        if let Some(before) = joins.insert(n.name.clone(), saga.saga_id.clone())
                            && before != saga.saga_id
                        {
                            replaced.push(before);
                        }
                    }
                    // A node's earlier join is read by no view any more, once it has ended.
                    for before in replaced {
                        if st.sagas.get(&before).is_some_and(ended) && !st.latest_install.values().any(|i| i == &before)
                        {
                            st.sagas.remove(&before);
                            st.saga_summaries.remove(&before);
                        }
                    }
                }
                if ended(&saga) && !st.read_by_views(&saga) {
                    st.sagas.remove(rest);
                } else {
                    st.sagas.insert(rest.to_string(), saga);
                }
                Some(site)
            }
            // Compacted (its summary stands in) or gone.
            None => {
                let site = st.sagas.get(rest).map(|s| s.site_id.clone());
                match st.saga_summaries.get(rest) {
                    Some(summary) => {
                        st.sagas.insert(rest.to_string(), saga_of_summary(summary));
                    }
                    None => {
                        st.sagas.remove(rest);
                    }
                }
                site
            }
        },
        "latest" => {
            match value.and_then(|v| decode::<pb::SiteLease>(key, v)) {
                Some(l) => {
                    // The install it replaces is read by no view any more.
                    if let Some(before) = st.latest_install.insert(rest.to_string(), l.saga_id.clone())
                        && before != l.saga_id
                        && st.sagas.get(&before).is_some_and(|s| ended(s) && !s.join)
                    {
                        st.sagas.remove(&before);
                        st.saga_summaries.remove(&before);
                    }
                }
                None => {
                    st.latest_install.remove(rest);
                }
            }
            Some(rest.to_string())
        }
        "lease" => {
            match value.and_then(|v| decode::<pb::SiteLease>(key, v)) {
                Some(l) => {
                    st.leases.insert(rest.to_string(), l);
                }
                None => {
                    st.leases.remove(rest);
                }
            }
            Some(rest.to_string())
        }
        "rollout" if !rest.contains('.') => {
            match value.and_then(|v| decode::<pb::Rollout>(key, v)) {
                Some(mut r) => {
                    r.outbox.clear();
                    r.dispatched.clear();
                    r.done.clear();
                    st.rollouts.insert(rest.to_string(), r);
                }
                None => match st.rollout_summaries.get(rest) {
                    Some(summary) => {
                        st.rollouts.insert(rest.to_string(), consumers::compaction::rollout_from_summary(summary));
                    }
                    None => {
                        st.rollouts.remove(rest);
                    }
                },
            }
            None
        }
        "summary" => apply_summary(st, rest, value),
        _ => None,
    }
}

/// A saga as views read it: its phase, outcome and times, and each node's name, role and
/// progress. Its outbox, jobs, catalog entries, design and the nodes' hardware are dropped:
/// they are most of its size, and no view reads them.
fn what_views_read(mut saga: pb::InstallSaga) -> pb::InstallSaga {
    saga.outbox = Vec::new();
    saga.jobs = Vec::new();
    saga.packages = Default::default();
    saga.design = None;
    saga.traceparent = String::new();
    for n in &mut saga.nodes {
        n.node = n.node.take().map(|spec| pb::NodeSpec { name: spec.name, role: spec.role, ..Default::default() });
    }
    saga.nodes.shrink_to_fit();
    saga
}

/// `summary.saga.<id>` or `summary.rollout.<id>`: kept when a view reads it, standing in for
/// its record when that is absent. The site of a saga's summary, when it was kept.
fn apply_summary(st: &mut State, rest: &str, value: Option<bytes::Bytes>) -> Option<String> {
    let value = value?;
    match rest.split_once('.') {
        Some(("saga", id)) => {
            let summary = decode::<pb::SagaSummary>(rest, value)?;
            let read = st.latest_install.get(&summary.site_id) == Some(&summary.saga_id)
                || st.joins.get(&summary.site_id).is_some_and(|j| j.values().any(|s| s == id));
            if !read {
                return None;
            }
            st.sagas.entry(id.to_string()).or_insert_with(|| saga_of_summary(&summary));
            let site = summary.site_id.clone();
            st.saga_summaries.insert(id.to_string(), summary);
            Some(site)
        }
        Some(("rollout", id)) => {
            let summary = decode::<pb::RolloutSummary>(rest, value)?;
            st.rollouts.entry(id.to_string()).or_insert_with(|| consumers::compaction::rollout_from_summary(&summary));
            st.rollout_summaries.insert(id.to_string(), summary);
            None
        }
        _ => None,
    }
}

impl State {
    /// Whether a view reads this saga: its site's latest install, or a node's latest join.
    fn read_by_views(&self, saga: &pb::InstallSaga) -> bool {
        self.latest_install.get(&saga.site_id) == Some(&saga.saga_id)
            || self.joins.get(&saga.site_id).is_some_and(|j| j.values().any(|id| id == &saga.saga_id))
    }
}

fn ended(saga: &pb::InstallSaga) -> bool {
    matches!(pb::InstallPhase::try_from(saga.phase), Ok(pb::InstallPhase::Succeeded | pb::InstallPhase::Failed))
}

/// A compacted saga as views read it: how it ended, with no per-node detail.
fn saga_of_summary(s: &pb::SagaSummary) -> pb::InstallSaga {
    pb::InstallSaga {
        saga_id: s.saga_id.clone(),
        site_id: s.site_id.clone(),
        join: s.join,
        phase: s.phase,
        outcome: s.outcome,
        reason: s.reason.clone(),
        started_unix_ms: s.started_unix_ms,
        finished_unix_ms: s.finished_unix_ms,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;
