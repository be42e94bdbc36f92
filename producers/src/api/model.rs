//! The read model behind the API's GETs: every site, node, package and rollout, kept in
//! memory and up to date from KV watches and the events stream, so a request reads memory
//! and a dashboard over a thousand sites costs the bus nothing per page view.
//!
//! Each API replica keeps its own copy; a watch that breaks is made again and replays the
//! latest value of every key, so nothing is missed. It keeps what views read, not every record
//! ever written: sagas under way, each site's latest install and each node's latest join (a
//! compacted one as its summary), and rollouts (a compacted one as its summary).

use std::collections::{BTreeMap, HashMap};
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

/// The last event seen of a site.
#[derive(Debug, Clone)]
pub struct LastEvent {
    pub type_name: String,
    pub seq: u64,
    pub time: time::OffsetDateTime,
    pub summary: String,
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
    /// Site id → node → package → what the node runs.
    pub observed: HashMap<String, BTreeMap<String, BTreeMap<String, pb::ObservedVersion>>>,
    /// `name@version` → catalog entry.
    pub packages: BTreeMap<String, pb::Package>,
    /// Package name → auto-rollout policy.
    pub policies: BTreeMap<String, pb::PackagePolicy>,
    /// Rollout id → its state, without its outbox and bitmaps.
    pub rollouts: HashMap<String, pb::Rollout>,
    /// Site id → its last event.
    pub last_event: HashMap<String, LastEvent>,
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

    /// The saga that last worked on `node` of `site`: its join, when newer than the install.
    pub fn node_saga(&self, site: &str, node: &str) -> Option<&pb::InstallSaga> {
        let install = self.latest_install.get(site).and_then(|id| self.sagas.get(id));
        let join = self.joins.get(site).and_then(|j| j.get(node)).and_then(|id| self.sagas.get(id));
        match (install, join) {
            (Some(i), Some(j)) if j.started_unix_ms >= i.started_unix_ms => Some(j),
            (Some(i), _) => Some(i),
            (None, j) => j,
        }
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
            (names::OBSERVED_BUCKET, vec![format!("{}>", keys::OBSERVED_PREFIX)]),
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
        let mut st = self.write();
        match bucket {
            names::SITES_BUCKET => {
                let Some(site) = keys::site_of(&key) else { return };
                match value.and_then(|v| decode::<pb::SiteDesign>(&key, v)) {
                    Some(d) => {
                        st.designs.insert(site.to_string(), d);
                    }
                    None => {
                        st.designs.remove(site);
                    }
                }
            }
            names::SAGAS_BUCKET => apply_saga_key(&mut st, &key, value),
            names::OBSERVED_BUCKET => {
                // node.<site>.<node>.<package>: the record itself names all three.
                match value.and_then(|v| decode::<pb::ObservedVersion>(&key, v)) {
                    Some(o) => {
                        st.observed
                            .entry(o.site_id.clone())
                            .or_default()
                            .entry(o.node.clone())
                            .or_default()
                            .insert(o.name.clone(), o);
                    }
                    None => {
                        let mut parts = key.splitn(4, '.').skip(1);
                        if let (Some(site), Some(node)) = (parts.next(), parts.next())
                            && let Some(nodes) = st.observed.get_mut(site)
                            && let Some(pkgs) = nodes.get_mut(node)
                        {
                            pkgs.retain(|name, _| keys::observed(site, node, name) != key);
                            if pkgs.is_empty() {
                                nodes.remove(node);
                            }
                        }
                    }
                }
            }
            names::PACKAGES_BUCKET => {
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
        let mut st = self.write();
        let newer = st.last_event.get(scope).is_none_or(|l| l.seq < last.seq);
        if newer {
            st.last_event.insert(scope.to_string(), last);
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

fn apply_saga_key(st: &mut State, key: &str, value: Option<bytes::Bytes>) {
    let (kind, rest) = key.split_once('.').unwrap_or((key, ""));
    match kind {
        "saga" => match value.and_then(|v| decode::<pb::InstallSaga>(key, v)) {
            Some(mut saga) => {
                saga.outbox.clear();
                saga.packages.clear();
                saga.design = None;
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
            }
            // Compacted (its summary stands in) or gone.
            None => match st.saga_summaries.get(rest) {
                Some(summary) => {
                    st.sagas.insert(rest.to_string(), saga_of_summary(summary));
                }
                None => {
                    st.sagas.remove(rest);
                }
            },
        },
        "latest" => match value.and_then(|v| decode::<pb::SiteLease>(key, v)) {
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
        },
        "lease" => match value.and_then(|v| decode::<pb::SiteLease>(key, v)) {
            Some(l) => {
                st.leases.insert(rest.to_string(), l);
            }
            None => {
                st.leases.remove(rest);
            }
        },
        "rollout" if !rest.contains('.') => match value.and_then(|v| decode::<pb::Rollout>(key, v)) {
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
        },
        "summary" => apply_summary(st, rest, value),
        _ => {}
    }
}

/// `summary.saga.<id>` or `summary.rollout.<id>`: kept when a view reads it, standing in for
/// its record when that is absent.
fn apply_summary(st: &mut State, rest: &str, value: Option<bytes::Bytes>) {
    let Some(value) = value else { return };
    match rest.split_once('.') {
        Some(("saga", id)) => {
            let Some(summary) = decode::<pb::SagaSummary>(rest, value) else { return };
            let read = st.latest_install.get(&summary.site_id) == Some(&summary.saga_id)
                || st.joins.get(&summary.site_id).is_some_and(|j| j.values().any(|s| s == id));
            if !read {
                return;
            }
            st.sagas.entry(id.to_string()).or_insert_with(|| saga_of_summary(&summary));
            st.saga_summaries.insert(id.to_string(), summary);
        }
        Some(("rollout", id)) => {
            let Some(summary) = decode::<pb::RolloutSummary>(rest, value) else { return };
            st.rollouts.entry(id.to_string()).or_insert_with(|| consumers::compaction::rollout_from_summary(&summary));
            st.rollout_summaries.insert(id.to_string(), summary);
        }
        _ => {}
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
