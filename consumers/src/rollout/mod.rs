//! Rollouts: a `PatchPackage` carried out across sites, canaries first, wave after wave.
//!
//! State lives in `landfall-sagas`, sized to stay small at any fleet size:
//! - `rollout.<id>.plan.<n>`: the plan, cut in chunks, written once and never changed (so any
//!   replica may cache it);
//! - `rollout.<id>`: phase, counters, the current wave, and two bits per planned site
//!   (`dispatched`, `done`), advanced with compare-and-set, with an outbox of events;
//! - `rollout.<id>.site.<site>`: one site's results, written when it reports.
//!
//! A site is patched under the site lease (never while an install or another rollout holds it),
//! by one `PatchNodes` job its gateway carries out at most `max_unavailable` nodes at a time. The
//! gateway's `SitePatched` is counted once (its done bit); when a wave's sites are all counted,
//! the next wave starts. A periodic tick, on every replica, starts sites that were busy, and
//! ends waves that time out.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bus_schema::domain::{PackageName, SiteDesign, Version};
use bus_schema::names::{self, keys};
use bus_schema::pb::{self, BusEvent, BusJob};
use bus_schema::rollout::{self as plan, Direction, Strategy};
use bus_schema::runtime::{Bus, BusError, Cas, Delivery, Envelope, HandlerError, Kv};
use futures::StreamExt;
use tracing::{debug, info, warn};

use crate::clock::now_ms;
use crate::decision::{self, outbox_entry};
use crate::lease::{self, Acquired, Holder};

/// Sites per plan chunk: a chunk of 500 sites of 10 nodes is about 60 KB.
const CHUNK_SIZE: u32 = 500;
/// Sites of a wave started at once by one replica.
const DISPATCH_PARALLEL: usize = 256;
/// How many times a compare-and-set race is retried inside one delivery.
const CAS_ATTEMPTS: usize = 256;
/// Progress events per rollout, at most (plus one per wave).
const PROGRESS_STEPS: u32 = 10;

fn bit(bits: &[u8], i: usize) -> bool {
    bits.get(i / 8).is_some_and(|b| b & (1 << (i % 8)) != 0)
}

fn set_bit(bits: &mut Vec<u8>, i: usize) {
    if bits.len() <= i / 8 {
        bits.resize(i / 8 + 1, 0);
    }
    bits[i / 8] |= 1 << (i % 8);
}

fn count_bits(bits: &[u8], range: Range<usize>) -> usize {
    range.filter(|&i| bit(bits, i)).count()
}

/// The envelope of the rollout itself (its id is the PatchPackage command's).
fn envelope(r: &pb::Rollout) -> Envelope {
    Envelope {
        id: r.rollout_id.clone(),
        correlation: r.rollout_id.clone(),
        causation: r.rollout_id.clone(),
        traceparent: r.traceparent.clone(),
    }
}

fn push<E: BusEvent>(r: &mut pb::Rollout, evt: &E, env: &Envelope) {
    r.outbox.push(outbox_entry(evt.subject(), evt, env));
}

/// Sets the rollout's node gauges from its record, as it was just written (or read by a tick).
fn gauge_nodes(r: &pb::Rollout) {
    for (state, n) in [("planned", r.planned_nodes), ("patched", r.patched), ("failed", r.failed)] {
        metrics::gauge!("landfall_rollout_nodes", "rollout" => r.rollout_id.clone(), "state" => state)
            .set(f64::from(n));
    }
}

/// A rollout phase as metrics give it: `running`.
fn phase_label(p: pb::RolloutPhase) -> &'static str {
    match p {
        pb::RolloutPhase::Unspecified => "unspecified",
        pb::RolloutPhase::Running => "running",
        pb::RolloutPhase::Paused => "paused",
        pb::RolloutPhase::Halted => "halted",
        pb::RolloutPhase::Completed => "completed",
        pb::RolloutPhase::Cancelled => "cancelled",
    }
}

fn phase(r: &pb::Rollout) -> pb::RolloutPhase {
    pb::RolloutPhase::try_from(r.phase).unwrap_or(pb::RolloutPhase::Unspecified)
}

/// Whether the rollout has ended for good.
pub fn is_terminal(r: &pb::Rollout) -> bool {
    matches!(phase(r), pb::RolloutPhase::Completed | pb::RolloutPhase::Cancelled)
}

/// Plan indexes of wave `w`.
pub fn wave_range(r: &pb::Rollout, w: u32) -> Range<usize> {
    let w = w as usize;
    let start = if w == 0 { 0 } else { r.wave_ends.get(w - 1).copied().unwrap_or(r.sites) as usize };
    start..r.wave_ends.get(w).copied().unwrap_or(r.sites) as usize
}

fn failures_counted(r: &pb::Rollout) -> u32 {
    r.failed.saturating_sub(r.failure_base)
}

fn threshold(r: &pb::Rollout) -> u32 {
    r.strategy.as_ref().map_or(0, |s| s.failure_threshold)
}

/// Halts a running or paused rollout whose failures passed its threshold.
fn check_halt(r: &mut pb::Rollout, cause: &Envelope) {
    if !matches!(phase(r), pb::RolloutPhase::Running | pb::RolloutPhase::Paused) {
        return;
    }
    if failures_counted(r) > threshold(r) {
        r.phase = pb::RolloutPhase::Halted as i32;
        r.reason = format!(
            "{} node(s) failed, more than the failure threshold of {}{}",
            failures_counted(r),
            threshold(r),
            if r.timed_out_sites > 0 {
                format!(" ({} site(s) counted as failed after their wave timed out)", r.timed_out_sites)
            } else {
                String::new()
            }
        );
        let evt = pb::RolloutHalted {
            rollout_id: r.rollout_id.clone(),
            reason: r.reason.clone(),
            patched: r.patched,
            failed: r.failed,
            wave: r.wave,
        };
        push(r, &evt, &cause.derive("rollout_halted", None));
    }
}

fn progress(r: &mut pb::Rollout) {
    let evt = pb::RolloutProgress {
        rollout_id: r.rollout_id.clone(),
        wave: r.wave,
        planned_nodes: r.planned_nodes,
        patched: r.patched,
        failed: r.failed,
        sites_done: r.sites_done,
        sites_total: r.sites,
    };
    let env = envelope(r).derive(&format!("rollout_progress/{}", r.sites_done), None);
    push(r, &evt, &env);
}

/// Moves a running rollout on while its current wave is complete: the next wave, or the end.
pub fn advance(r: &mut pb::Rollout, now_ms: i64) {
    while phase(r) == pb::RolloutPhase::Running {
        let range = wave_range(r, r.wave);
        if count_bits(&r.done, range.clone()) < range.len() {
            return;
        }
        if r.wave as usize + 1 >= r.wave_ends.len() {
            r.phase = pb::RolloutPhase::Completed as i32;
            r.finished_unix_ms = now_ms;
            let evt = pb::RolloutCompleted {
                rollout_id: r.rollout_id.clone(),
                package: r.package.clone(),
                planned_nodes: r.planned_nodes,
                patched: r.patched,
                failed: r.failed,
                sites: r.sites,
                duration_ms: now_ms.saturating_sub(r.started_unix_ms),
            };
            let env = envelope(r).derive("rollout_completed", None);
            push(r, &evt, &env);
            return;
        }
        r.wave += 1;
        r.wave_started_unix_ms = now_ms;
        wave_started(r);
    }
}

fn wave_started(r: &mut pb::Rollout) {
    let canary = r.wave == 0 && r.strategy.as_ref().is_some_and(|s| s.canary_sites > 0);
    let evt = pb::RolloutWaveStarted { rollout_id: r.rollout_id.clone(), wave: r.wave, site_ids: vec![], canary };
    let env = envelope(r).derive(&format!("wave_started/{}", r.wave), None);
    push(r, &evt, &env);
}

/// Counts one site's report; `None` when it was counted already.
pub fn count_site(
    r: &pb::Rollout,
    index: usize,
    patched: u32,
    failed: u32,
    cause: &Envelope,
    now_ms: i64,
) -> Option<pb::Rollout> {
    if index >= r.sites as usize || bit(&r.done, index) {
        return None;
    }
    let mut next = r.clone();
    set_bit(&mut next.done, index);
    next.sites_done += 1;
    next.patched += patched;
    next.failed += failed;
    check_halt(&mut next, cause);
    let step = (next.sites / PROGRESS_STEPS).max(1);
    let range = wave_range(&next, next.wave);
    let wave_over = count_bits(&next.done, range.clone()) == range.len();
    if next.sites_done.is_multiple_of(step) || wave_over {
        progress(&mut next);
    }
    advance(&mut next, now_ms);
    Some(next)
}

/// The rollout's state, the plan it runs, and how to carry it out.
pub struct Rollouts {
    bus: Bus,
    sites: Kv,
    packages: Kv,
    observed: Kv,
    sagas: Kv,
    /// Plan chunks by key: immutable once written.
    chunks: Mutex<HashMap<String, Arc<pb::RolloutPlanChunk>>>,
    /// Catalog entries by key: immutable once registered.
    catalog: Mutex<HashMap<String, pb::Package>>,
    /// Site reports waiting to be counted, by rollout: counted together in one write.
    counting: Mutex<HashMap<String, Batch>>,
    /// Rollouts this process is starting sites of: one dispatch at a time per rollout, or
    /// every settle during a long dispatch would start the same sites again.
    dispatching: Mutex<std::collections::HashSet<String>>,
}

/// Site reports of one rollout waiting for the write that counts them.
#[derive(Default)]
struct Batch {
    waiting: Vec<(Report, tokio::sync::oneshot::Sender<Result<(), String>>)>,
    /// A handler is writing: it takes what arrives meanwhile in its next write.
    writing: bool,
}

/// One site's report, as counted.
struct Report {
    index: usize,
    patched: u32,
    failed: u32,
    cause: Envelope,
}

/// One site to start, from the plan.
struct Start {
    index: usize,
    site: pb::RolloutPlanSite,
}

impl Rollouts {
    pub async fn new(bus: Bus) -> Result<Self, BusError> {
        Ok(Self {
            sites: bus.kv(names::SITES_BUCKET).await?,
            packages: bus.kv(names::PACKAGES_BUCKET).await?,
            observed: bus.kv(names::OBSERVED_BUCKET).await?,
            sagas: bus.kv(names::SAGAS_BUCKET).await?,
            bus,
            chunks: Mutex::default(),
            catalog: Mutex::default(),
            counting: Mutex::default(),
            dispatching: Mutex::default(),
        })
    }

    async fn catalog_entry(&self, name: &str, version: &str) -> Result<Option<pb::Package>, BusError> {
        let key = keys::package(name, version);
        if let Some(p) = self.catalog.lock().expect("catalog lock").get(&key) {
            return Ok(Some(p.clone()));
        }
        let found = self.packages.get::<pb::Package>(&key).await?.map(|(p, _)| p);
        if let Some(p) = &found {
            self.catalog.lock().expect("catalog lock").insert(key, p.clone());
        }
        Ok(found)
    }

    async fn chunk(&self, rollout_id: &str, n: u32) -> Result<Arc<pb::RolloutPlanChunk>, BusError> {
        let key = keys::rollout_plan(rollout_id, n);
        if let Some(c) = self.chunks.lock().expect("chunks lock").get(&key) {
            return Ok(c.clone());
        }
        let chunk = self.sagas.get::<pb::RolloutPlanChunk>(&key).await?.map(|(c, _)| Arc::new(c)).ok_or_else(|| {
            BusError::Kv {
                op: "get",
                bucket: self.sagas.bucket().to_string(),
                key: key.clone(),
                source: "plan chunk missing".into(),
            }
        })?;
        self.chunks.lock().expect("chunks lock").insert(key, chunk.clone());
        Ok(chunk)
    }

    async fn plan_site(&self, r: &pb::Rollout, index: usize) -> Result<pb::RolloutPlanSite, BusError> {
        let size = r.chunk_size.max(1) as usize;
        let chunk = self.chunk(&r.rollout_id, (index / size) as u32).await?;
        Ok(chunk.sites.get(index - chunk.first_index as usize).cloned().unwrap_or_default())
    }

    /// Plans and starts a rollout.
    pub async fn patch_package(&self, d: &Delivery) -> Result<(), HandlerError> {
        let cmd: pb::PatchPackage = d.decode()?;
        let id = d.envelope.id.clone();
        if let Some((existing, rev)) = self.sagas.get::<pb::Rollout>(&keys::rollout(&id)).await? {
            // A redelivery of an accepted command: finish what it started.
            self.settle(existing, rev).await?;
            return Ok(());
        }
        let invalid =
            |e: bus_schema::domain::InvalidField| HandlerError::reject(pb::RejectCode::Invalid, e.to_string());
        let name = PackageName::try_from(cmd.name.as_str()).map_err(invalid)?;
        let version = Version::try_from(cmd.version.as_str()).map_err(invalid)?;
        let strategy = Strategy::try_from(&cmd.strategy.clone().unwrap_or_default()).map_err(invalid)?;
        let Some(entry) = self.catalog_entry(name.as_str(), version.as_str()).await? else {
            return Err(HandlerError::reject(
                pb::RejectCode::UnknownPackage,
                format!("{name}@{version} is not in the catalog (landfall package register)"),
            ));
        };
        let selector = cmd.selector.clone().unwrap_or_default();
        let designs: Vec<SiteDesign> = self
            .sites
            .scan::<pb::SiteDesign>(keys::SITE_PREFIX)
            .await?
            .into_iter()
            .filter_map(|(key, d, _)| match SiteDesign::try_from(d) {
                Ok(d) => Some(d),
                Err(e) => {
                    warn!(%key, error = %e, "skipping a site design that does not validate");
                    None
                }
            })
            .collect();
        let observed = self
            .observed
            .scan_matching::<pb::ObservedVersion>(&keys::observed_package_everywhere(name.as_str()))
            .await?
            .into_iter()
            .map(|(_, v, _)| ((v.site_id, v.node), Some(v.version)))
            .collect();
        let direction = if cmd.only_older { Direction::OnlyOlder } else { Direction::Any };
        let planned =
            plan::plan_with(&name, &version, direction, &selector, &strategy, &designs, &observed).map_err(|e| {
                let code =
                    if e.field == "selector.site_ids" { pb::RejectCode::UnknownSite } else { pb::RejectCode::Invalid };
                HandlerError::reject(code, e.to_string())
            })?;

        // The plan, in immutable chunks.
        let chunks: Vec<pb::RolloutPlanChunk> = planned
            .sites
            .chunks(CHUNK_SIZE as usize)
            .enumerate()
            .map(|(n, sites)| pb::RolloutPlanChunk {
                first_index: n as u32 * CHUNK_SIZE,
                sites: sites
                    .iter()
                    .map(|s| pb::RolloutPlanSite {
                        site_id: s.site.clone(),
                        nodes: s.nodes.iter().map(|n| n.spec.clone()).collect(),
                        from_versions: s.nodes.iter().map(|n| n.from_version.clone()).collect(),
                        canary: s.canary,
                    })
                    .collect(),
            })
            .collect();
        let writes = chunks.iter().enumerate().map(|(n, c)| {
            let key = keys::rollout_plan(&id, n as u32);
            async move { self.sagas.create(&key, c).await }
        });
        futures::future::try_join_all(writes).await?;

        let canary_sites = planned.sites.iter().filter(|s| s.canary).count() as u32;
        let now = now_ms();
        let mut r = pb::Rollout {
            rollout_id: id.clone(),
            package: Some(pb::PackageRef { name: name.to_string(), version: version.to_string() }),
            entry: Some(entry),
            strategy: Some(pb::ResolvedStrategy {
                canary_sites,
                max_concurrent_sites: strategy.max_concurrent_sites,
                max_unavailable: strategy.max_unavailable.to_string(),
                failure_threshold: planned.failure_threshold,
                wave_timeout_seconds: strategy.wave_timeout.map_or(0, |t| t.as_secs() as u32),
                on_wave_timeout: strategy.on_wave_timeout as i32,
            }),
            phase: pb::RolloutPhase::Running as i32,
            sites: planned.sites.len() as u32,
            planned_nodes: planned.planned_nodes,
            wave_ends: planned.wave_ends.clone(),
            wave_started_unix_ms: now,
            plan_chunks: chunks.len() as u32,
            chunk_size: CHUNK_SIZE,
            started_unix_ms: now,
            trigger: if cmd.trigger.is_empty() { "operator".into() } else { cmd.trigger.clone() },
            traceparent: d.envelope.traceparent.clone(),
            selector: Some(selector),
            ..Default::default()
        };
        let evt = pb::RolloutPlanned {
            rollout_id: id.clone(),
            package: r.package.clone(),
            sites: planned.site_plans(),
            planned_nodes: planned.planned_nodes,
            waves: planned.wave_ends.len() as u32,
            nodes_at_target: planned.nodes_at_target,
            nodes_not_installed: planned.nodes_not_installed,
            trigger: r.trigger.clone(),
            failure_threshold: planned.failure_threshold,
        };
        push(&mut r, &evt, &d.envelope.derive("rollout_planned", None));
        if r.sites > 0 {
            wave_started(&mut r);
        }
        advance(&mut r, now);
        info!(rollout = %id, package = %name, %version, sites = r.sites, nodes = r.planned_nodes, waves = r.wave_ends.len(), trigger = %r.trigger, "rollout planned");
        match self.sagas.create(&keys::rollout(&id), &r).await? {
            Cas::Written(rev) => {
                gauge_nodes(&r);
                self.settle(r, rev).await?;
            }
            Cas::Conflict => {
                if let Some((existing, rev)) = self.sagas.get::<pb::Rollout>(&keys::rollout(&id)).await? {
                    self.settle(existing, rev).await?;
                }
            }
        }
        Ok(())
    }

    /// Publishes the rollout's outbox and clears it, then starts the sites of the current wave
    /// that are not started yet (when it is running). Safe to repeat.
    pub async fn settle(&self, mut r: pb::Rollout, rev: u64) -> Result<(), HandlerError> {
        if !r.outbox.is_empty() {
            crate::failpoint::hit("rollout-written-outbox-unpublished");
            self.bus.publish_all(decision::outgoing(&r.outbox, &r.rollout_id)).await?;
            r.outbox.clear();
            if self.sagas.update(&keys::rollout(&r.rollout_id), &r, rev).await? == Cas::Conflict {
                // Someone else changed it meanwhile; they (or the next tick) go on from here.
                return Ok(());
            }
        }
        if phase(&r) == pb::RolloutPhase::Running {
            self.dispatch(r).await?;
        }
        Ok(())
    }

    /// Starts every site of the current wave not started yet whose lease it can take, marking
    /// them started a slice at a time (other replicas and later ticks skip what is marked).
    /// A dispatch already running in this process for the rollout covers this one.
    async fn dispatch(&self, r: pb::Rollout) -> Result<(), HandlerError> {
        let range = wave_range(&r, r.wave);
        let pending: Vec<usize> = range.filter(|&i| !bit(&r.dispatched, i) && !bit(&r.done, i)).collect();
        if pending.is_empty() {
            return Ok(());
        }
        if !self.dispatching.lock().expect("dispatching lock").insert(r.rollout_id.clone()) {
            return Ok(());
        }
        let result = self.dispatch_sites(&r, pending).await;
        self.dispatching.lock().expect("dispatching lock").remove(&r.rollout_id);
        result
    }

    async fn dispatch_sites(&self, r: &pb::Rollout, pending: Vec<usize>) -> Result<(), HandlerError> {
        const SLICE: usize = 1024;
        for slice in pending.chunks(SLICE) {
            let mut starts = Vec::with_capacity(slice.len());
            for &i in slice {
                starts.push(Start { index: i, site: self.plan_site(r, i).await? });
            }
            let results: Vec<Result<Option<usize>, BusError>> = futures::stream::iter(starts)
                .map(|s| self.start_site(r, s))
                .buffer_unordered(DISPATCH_PARALLEL)
                .collect()
                .await;
            let mut started = Vec::new();
            for res in results {
                if let Some(i) = res? {
                    started.push(i);
                }
            }
            if !started.is_empty() {
                self.mark_dispatched(&r.rollout_id, &started).await?;
            }
        }
        Ok(())
    }

    /// Takes the site's lease and sends its job; `None` while the site is busy.
    async fn start_site(&self, r: &pb::Rollout, s: Start) -> Result<Option<usize>, BusError> {
        let site = s.site.site_id.clone();
        match lease::acquire(&self.sagas, &site, Holder::Rollout(&r.rollout_id)).await? {
            Acquired::Yes => {}
            Acquired::Busy(why) => {
                debug!(rollout = %r.rollout_id, %site, %why, "site busy; it starts when free");
                return Ok(None);
            }
        }
        let entry = r.entry.clone().unwrap_or_default();
        let reinstall =
            if entry.kind == pb::PackageKind::OsImage as i32 { self.reinstall_for(&site).await? } else { vec![] };
        let nodes = s.site.nodes.len() as u32;
        let max_unavailable = plan::Amount::parse(
            r.strategy.as_ref().map_or("", |st| st.max_unavailable.as_str()),
            "max_unavailable",
            plan::Amount::Count(1),
        )
        .unwrap_or(plan::Amount::Count(1))
        .of(nodes)
        .max(1);
        let job = pb::PatchNodes {
            site_id: site.clone(),
            rollout_id: r.rollout_id.clone(),
            plan_index: s.index as u32,
            package: Some(entry),
            nodes: s.site.nodes,
            max_unavailable,
            max_failures: threshold(r).saturating_sub(failures_counted(r)),
            reinstall,
        };
        let env = envelope(r).derive(pb::PatchNodes::KIND, Some(&site));
        self.bus.publish_job(&job, &env).await?;
        Ok(Some(s.index))
    }

    /// The binaries each role of the site reinstalls after a reimage.
    async fn reinstall_for(&self, site: &str) -> Result<Vec<pb::RoleArtifacts>, BusError> {
        let Some((design, _)) = self.sites.get::<pb::SiteDesign>(&keys::site(site)).await? else { return Ok(vec![]) };
        let mut out = Vec::new();
        for rp in design.packages {
            let mut packages = Vec::new();
            for p in rp.packages {
                if let Some(e) = self.catalog_entry(&p.name, &p.version).await?
                    && e.kind == pb::PackageKind::Binary as i32
                {
                    packages.push(e);
                }
            }
            out.push(pb::RoleArtifacts { role: rp.role, packages });
        }
        Ok(out)
    }

    async fn mark_dispatched(&self, rollout_id: &str, started: &[usize]) -> Result<(), HandlerError> {
        let key = keys::rollout(rollout_id);
        for _ in 0..CAS_ATTEMPTS {
            let Some((mut r, rev)) = self.sagas.get::<pb::Rollout>(&key).await? else { return Ok(()) };
            if started.iter().all(|&i| bit(&r.dispatched, i)) {
                return Ok(());
            }
            for &i in started {
                set_bit(&mut r.dispatched, i);
            }
            if let Cas::Written(_) = self.sagas.update(&key, &r, rev).await? {
                return Ok(());
            }
        }
        Err(HandlerError::Transient(format!("rollout {rollout_id} kept changing")))
    }

    /// Reads, changes with `f`, and writes the rollout until the write wins; then settles it.
    /// `f` returns `None` for "nothing to change".
    async fn update(
        &self,
        rollout_id: &str,
        mut f: impl FnMut(&pb::Rollout) -> Result<Option<pb::Rollout>, HandlerError>,
    ) -> Result<(), HandlerError> {
        let key = keys::rollout(rollout_id);
        for _ in 0..CAS_ATTEMPTS {
            let Some((current, rev)) = self.sagas.get::<pb::Rollout>(&key).await? else {
                return Err(HandlerError::reject(pb::RejectCode::Invalid, format!("there is no rollout {rollout_id}")));
            };
            if !current.outbox.is_empty() {
                self.settle(current, rev).await?;
                continue;
            }
            let Some(next) = f(&current)? else {
                return self.settle(current, rev).await;
            };
            match self.sagas.update(&key, &next, rev).await? {
                Cas::Written(new) => {
                    gauge_nodes(&next);
                    return self.settle(next, new).await;
                }
                Cas::Conflict => continue,
            }
        }
        Err(HandlerError::Transient(format!("rollout {rollout_id} kept changing")))
    }

    /// A site's report: its results recorded, its lease let go, the site's design moved to the
    /// version, and the rollout counted and moved on.
    pub async fn on_site_patched(&self, d: &Delivery) -> Result<(), HandlerError> {
        let e: pb::SitePatched = d.decode()?;
        let key = keys::rollout(&e.rollout_id);
        let Some((r, _)) = self.sagas.get::<pb::Rollout>(&key).await? else {
            debug!(rollout = %e.rollout_id, site = %e.site_id, "site report of no known rollout");
            return Ok(());
        };
        let index = e.plan_index as usize;
        if !bit(&r.done, index) {
            let record = pb::RolloutSite {
                rollout_id: e.rollout_id.clone(),
                site_id: e.site_id.clone(),
                plan_index: e.plan_index,
                state: pb::RolloutSiteState::Done as i32,
                patched: e.patched.clone(),
                failed: e.failed.clone(),
                skipped: e.skipped.clone(),
                updated_unix_ms: now_ms(),
            };
            let site_key = keys::rollout_site(&e.rollout_id, &e.site_id);
            let package = e.package.clone().unwrap_or_default();
            let (a, b) = tokio::join!(self.sagas.put(&site_key, &record), async {
                if e.patched.is_empty() { Ok(()) } else { self.move_design(&e.site_id, &package).await }
            });
            a?;
            b?;
        }
        lease::release(&self.sagas, &e.site_id, Holder::Rollout(&e.rollout_id)).await?;
        let (patched, failed) = (e.patched.len() as u32, e.failed.len() as u32);
        self.count(&e.rollout_id, Report { index, patched, failed, cause: d.envelope.clone() }).await?;
        if failed > 0 {
            info!(rollout = %e.rollout_id, site = %e.site_id, patched, failed, "site patched with failures");
        }
        Ok(())
    }

    /// Counts a site's report on the rollout, together with the reports of other sites that
    /// arrive meanwhile: one compare-and-set write for many sites (group commit). Returns once
    /// the write that counts this report is stored, so the delivery is acknowledged only then.
    async fn count(&self, rollout_id: &str, report: Report) -> Result<(), HandlerError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let lead = {
            let mut counting = self.counting.lock().expect("counting lock");
            let batch = counting.entry(rollout_id.to_string()).or_default();
            batch.waiting.push((report, tx));
            !std::mem::replace(&mut batch.writing, true)
        };
        if lead {
            loop {
                let batch = {
                    let mut counting = self.counting.lock().expect("counting lock");
                    let Some(b) = counting.get_mut(rollout_id) else { break };
                    if b.waiting.is_empty() {
                        counting.remove(rollout_id);
                        break;
                    }
                    std::mem::take(&mut b.waiting)
                };
                let reports: Vec<&Report> = batch.iter().map(|(r, _)| r).collect();
                let result = self
                    .update(rollout_id, |r| {
                        let mut next: Option<pb::Rollout> = None;
                        for rep in &reports {
                            let current = next.as_ref().unwrap_or(r);
                            if let Some(n) =
                                count_site(current, rep.index, rep.patched, rep.failed, &rep.cause, now_ms())
                            {
                                next = Some(n);
                            }
                        }
                        Ok(next)
                    })
                    .await
                    .map_err(|e| e.to_string());
                for (_, tx) in batch {
                    let _ = tx.send(result.clone());
                }
            }
        }
        match rx.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(HandlerError::Transient(e)),
            Err(_) => Err(HandlerError::Transient(format!("rollout {rollout_id}: the counting write was dropped"))),
        }
    }

    /// The site's design now wants `package` wherever it wanted another version of it, so an
    /// install or a node added later runs what the rest of the site runs.
    async fn move_design(&self, site: &str, package: &pb::PackageRef) -> Result<(), BusError> {
        let key = keys::site(site);
        for _ in 0..CAS_ATTEMPTS {
            let Some((mut design, rev)) = self.sites.get::<pb::SiteDesign>(&key).await? else { return Ok(()) };
            let mut changed = false;
            for p in design.packages.iter_mut().flat_map(|rp| rp.packages.iter_mut()) {
                if p.name == package.name && p.version != package.version {
                    p.version = package.version.clone();
                    changed = true;
                }
            }
            if !changed {
                return Ok(());
            }
            if let Cas::Written(_) = self.sites.update(&key, &design, rev).await? {
                return Ok(());
            }
        }
        Err(BusError::Kv { op: "update", bucket: self.sites.bucket().to_string(), key, source: "kept changing".into() })
    }

    pub async fn pause(&self, d: &Delivery) -> Result<(), HandlerError> {
        let cmd: pb::PauseRollout = d.decode()?;
        self.update(&cmd.rollout_id, |r| match phase(r) {
            pb::RolloutPhase::Paused => Ok(None),
            pb::RolloutPhase::Running => {
                let mut next = r.clone();
                next.phase = pb::RolloutPhase::Paused as i32;
                next.reason = if cmd.reason.is_empty() { "paused by an operator".into() } else { cmd.reason.clone() };
                let evt = pb::RolloutPaused { rollout_id: r.rollout_id.clone(), reason: next.reason.clone() };
                push(&mut next, &evt, &d.envelope.derive("rollout_paused", None));
                Ok(Some(next))
            }
            other => Err(not_now(r, other, "paused")),
        })
        .await
    }

    pub async fn resume(&self, d: &Delivery) -> Result<(), HandlerError> {
        let cmd: pb::ResumeRollout = d.decode()?;
        self.update(&cmd.rollout_id, |r| match phase(r) {
            pb::RolloutPhase::Running => Ok(None),
            pb::RolloutPhase::Paused | pb::RolloutPhase::Halted => {
                let mut next = r.clone();
                if phase(r) == pb::RolloutPhase::Halted {
                    // Its failure budget starts again from here.
                    next.failure_base = r.failed;
                }
                next.phase = pb::RolloutPhase::Running as i32;
                next.reason.clear();
                let evt = pb::RolloutResumed { rollout_id: r.rollout_id.clone() };
                push(&mut next, &evt, &d.envelope.derive("rollout_resumed", None));
                advance(&mut next, now_ms());
                Ok(Some(next))
            }
            other => Err(not_now(r, other, "resumed")),
        })
        .await
    }

    pub async fn cancel(&self, d: &Delivery) -> Result<(), HandlerError> {
        let cmd: pb::CancelRollout = d.decode()?;
        self.update(&cmd.rollout_id, |r| match phase(r) {
            pb::RolloutPhase::Cancelled => Ok(None),
            pb::RolloutPhase::Completed => Err(not_now(r, pb::RolloutPhase::Completed, "cancelled")),
            _ => {
                let mut next = r.clone();
                next.phase = pb::RolloutPhase::Cancelled as i32;
                next.finished_unix_ms = now_ms();
                next.reason =
                    if cmd.reason.is_empty() { "cancelled by an operator".into() } else { cmd.reason.clone() };
                let evt = pb::RolloutCancelled {
                    rollout_id: r.rollout_id.clone(),
                    reason: next.reason.clone(),
                    patched: r.patched,
                    failed: r.failed,
                };
                push(&mut next, &evt, &d.envelope.derive("rollout_cancelled", None));
                Ok(Some(next))
            }
        })
        .await
    }

    /// One look at every rollout that has not ended: publish what a crash left in an outbox,
    /// start sites that were busy, and end waves that ran out of time. Runs on every replica.
    pub async fn tick(&self) -> Result<(), HandlerError> {
        let rollouts = self.sagas.scan_matching::<pb::Rollout>(&keys::every_rollout()).await?;
        // Every replica's gauges follow the records, whichever replica wrote them.
        let mut phases: HashMap<pb::RolloutPhase, u32> = HashMap::new();
        for (_, r, _) in &rollouts {
            *phases.entry(phase(r)).or_default() += 1;
            gauge_nodes(r);
        }
        for p in [
            pb::RolloutPhase::Running,
            pb::RolloutPhase::Paused,
            pb::RolloutPhase::Halted,
            pb::RolloutPhase::Completed,
            pb::RolloutPhase::Cancelled,
        ] {
            let n = phases.get(&p).copied().unwrap_or_default();
            metrics::gauge!("landfall_rollouts", "phase" => phase_label(p)).set(f64::from(n));
        }
        for (_, r, rev) in rollouts {
            if is_terminal(&r) && r.outbox.is_empty() {
                continue;
            }
            if self.wave_timed_out(&r) {
                self.time_out_wave(&r.rollout_id).await?;
            } else {
                self.settle(r, rev).await?;
            }
        }
        Ok(())
    }

    fn wave_timed_out(&self, r: &pb::Rollout) -> bool {
        let Some(timeout) = r.strategy.as_ref().map(|s| s.wave_timeout_seconds).filter(|t| *t > 0) else {
            return false;
        };
        phase(r) == pb::RolloutPhase::Running
            && now_ms().saturating_sub(r.wave_started_unix_ms) > i64::from(timeout) * 1000
    }

    /// The current wave ran out of time: abort the rollout, or count the sites that did not
    /// report as failed (each of their planned nodes) and go on.
    async fn time_out_wave(&self, rollout_id: &str) -> Result<(), HandlerError> {
        let Some((r, _)) = self.sagas.get::<pb::Rollout>(&keys::rollout(rollout_id)).await? else { return Ok(()) };
        if !self.wave_timed_out(&r) {
            return Ok(());
        }
        let timeout = r.strategy.as_ref().map_or(0, |s| s.wave_timeout_seconds);
        let silent: Vec<usize> = wave_range(&r, r.wave).filter(|&i| !bit(&r.done, i)).collect();
        let mut late = Vec::with_capacity(silent.len());
        for &i in &silent {
            late.push((i, self.plan_site(&r, i).await?));
        }
        let names: Vec<&str> = late.iter().map(|(_, s)| s.site_id.as_str()).take(10).collect();
        let abort = r.strategy.as_ref().is_some_and(|s| s.on_wave_timeout == pb::WaveTimeoutAction::Abort as i32);
        let wave = r.wave;
        let why = format!(
            "wave {wave} timed out after {timeout}s: {} site(s) did not report ({}{})",
            late.len(),
            names.join(", "),
            if late.len() > names.len() { ", …" } else { "" }
        );
        if !abort {
            // Each silent site says why it counts as failed, in its record, and lets go of its lease.
            for (i, s) in &late {
                let reason =
                    format!("no report within the wave timeout of {timeout}s (site offline?): counted as failed");
                let record = pb::RolloutSite {
                    rollout_id: rollout_id.to_string(),
                    site_id: s.site_id.clone(),
                    plan_index: *i as u32,
                    state: pb::RolloutSiteState::TimedOut as i32,
                    failed: s
                        .nodes
                        .iter()
                        .map(|n| pb::NodeResult {
                            node: n.name.clone(),
                            role: n.role,
                            outcome: pb::NodeOutcome::Failed as i32,
                            failed_step: pb::PatchNodes::KIND.to_string(),
                            reason: reason.clone(),
                        })
                        .collect(),
                    updated_unix_ms: now_ms(),
                    ..Default::default()
                };
                self.sagas.put(&keys::rollout_site(rollout_id, &s.site_id), &record).await?;
                lease::release(&self.sagas, &s.site_id, Holder::Rollout(rollout_id)).await?;
            }
        }
        let cause = envelope(&r).derive(&format!("wave_timeout/{wave}"), None);
        self.update(rollout_id, |current| {
            if current.wave != wave || phase(current) != pb::RolloutPhase::Running {
                return Ok(None);
            }
            let mut next = current.clone();
            if abort {
                next.phase = pb::RolloutPhase::Halted as i32;
                next.reason = format!("{why}; the strategy says abort");
                let evt = pb::RolloutHalted {
                    rollout_id: next.rollout_id.clone(),
                    reason: next.reason.clone(),
                    patched: next.patched,
                    failed: next.failed,
                    wave,
                };
                push(&mut next, &evt, &cause.derive("rollout_halted", None));
                return Ok(Some(next));
            }
            for (i, s) in &late {
                if !bit(&next.done, *i) {
                    set_bit(&mut next.done, *i);
                    next.sites_done += 1;
                    next.timed_out_sites += 1;
                    next.failed += s.nodes.len() as u32;
                }
            }
            warn!(rollout = %next.rollout_id, %why, "wave timed out; going on");
            check_halt(&mut next, &cause);
            progress(&mut next);
            advance(&mut next, now_ms());
            Ok(Some(next))
        })
        .await
    }
}

fn not_now(r: &pb::Rollout, phase: pb::RolloutPhase, what: &str) -> HandlerError {
    HandlerError::reject(
        pb::RejectCode::Conflict,
        format!(
            "rollout {} is {} and cannot be {what}",
            r.rollout_id,
            phase.as_str_name().trim_start_matches("ROLLOUT_PHASE_").to_lowercase()
        ),
    )
}

/// How often every replica looks at the rollouts under way.
pub const TICK: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;

    fn rollout(wave_ends: &[u32], threshold: u32) -> pb::Rollout {
        pb::Rollout {
            rollout_id: "r1".into(),
            phase: pb::RolloutPhase::Running as i32,
            sites: *wave_ends.last().unwrap(),
            wave_ends: wave_ends.to_vec(),
            planned_nodes: wave_ends.last().unwrap() * 2,
            strategy: Some(pb::ResolvedStrategy { failure_threshold: threshold, ..Default::default() }),
            ..Default::default()
        }
    }

    fn kinds(r: &pb::Rollout) -> Vec<String> {
        r.outbox.iter().map(|e| e.message_type.trim_start_matches("landfall.v1.").to_string()).collect()
    }

    #[test]
    fn waves_follow_each_other_and_the_last_completes() {
        let env = Envelope::root();
        let r = rollout(&[1, 3], 0);
        let r = count_site(&r, 0, 2, 0, &env, 10).unwrap();
        assert_eq!(r.wave, 1);
        assert!(kinds(&r).contains(&"RolloutWaveStarted".to_string()), "{:?}", kinds(&r));
        assert!(count_site(&r, 0, 2, 0, &env, 10).is_none(), "a site is counted once");
        let r = pb::Rollout { outbox: vec![], ..r };
        let r = count_site(&r, 2, 2, 0, &env, 11).unwrap();
        assert_eq!(r.phase, pb::RolloutPhase::Running as i32, "site 1 of wave 1 has not reported");
        let r = count_site(&pb::Rollout { outbox: vec![], ..r }, 1, 2, 0, &env, 12).unwrap();
        assert_eq!(r.phase, pb::RolloutPhase::Completed as i32);
        assert_eq!((r.patched, r.sites_done), (6, 3));
        assert!(kinds(&r).contains(&"RolloutCompleted".to_string()));
    }

    #[test]
    fn failures_past_the_threshold_halt_and_resume_starts_a_new_budget() {
        let env = Envelope::root();
        let r = rollout(&[1, 2, 3], 1);
        let r = count_site(&r, 0, 1, 1, &env, 1).unwrap();
        assert_eq!(r.phase, pb::RolloutPhase::Running as i32, "1 failure is within a threshold of 1");
        let r = count_site(&pb::Rollout { outbox: vec![], ..r }, 1, 0, 2, &env, 2).unwrap();
        assert_eq!(r.phase, pb::RolloutPhase::Halted as i32);
        assert!(r.reason.contains("3 node(s) failed"), "{}", r.reason);
        assert_eq!(r.wave, 1, "a halted rollout starts no wave");
        let mut resumed =
            pb::Rollout { outbox: vec![], phase: pb::RolloutPhase::Running as i32, failure_base: r.failed, ..r };
        advance(&mut resumed, 3);
        assert_eq!(resumed.wave, 2);
        assert_eq!(failures_counted(&resumed), 0);
    }

    #[test]
    fn an_empty_plan_completes_at_once() {
        let mut r =
            pb::Rollout { wave_ends: vec![], sites: 0, phase: pb::RolloutPhase::Running as i32, ..Default::default() };
        advance(&mut r, 5);
        assert_eq!(r.phase, pb::RolloutPhase::Completed as i32);
    }

    #[test]
    fn bits() {
        let mut b = Vec::new();
        set_bit(&mut b, 9);
        set_bit(&mut b, 0);
        assert!(bit(&b, 9) && bit(&b, 0) && !bit(&b, 1) && !bit(&b, 100));
        assert_eq!(count_bits(&b, 0..16), 2);
    }
}
