//! Rollouts, executed: read the rollout and what a decision needs from KV, call [`super::decide`],
//! write its result with compare-and-set, publish the outbox, send the jobs, let go of leases.
//! Nothing is decided here.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bus_schema::domain::SiteDesign;
use bus_schema::names::{self, keys};
use bus_schema::pb;
use bus_schema::runtime::{Bus, BusError, Cas, Delivery, HandlerError, Kv, Update};
use futures::StreamExt;
use tracing::{debug, info, warn};

use super::decide::{self, Report};
use crate::active;
use crate::clock::{WindowClock, now_ms};
use crate::decision::{self, Refusal};
use crate::group_commit::GroupCommit;
use crate::lease::{self, Acquired, Holder};

mod undo;

/// Sites of a wave started at once by one replica.
const DISPATCH_PARALLEL: usize = 256;
/// How soon a report that arrived before its job was marked sent is looked at again.
const REPORT_BEFORE_MARK_RETRY: Duration = Duration::from_millis(250);

/// How long a site found outside its windows is not looked at again (on the window clock),
/// unless its next window opens sooner: a design's windows changed meanwhile are seen then.
const WINDOW_RECHECK_MS: i64 = 60_000;

/// How often every replica looks at the rollouts under way.
pub const TICK: Duration = Duration::from_secs(1);

fn reject(r: Refusal) -> HandlerError {
    HandlerError::reject(r.code, r.reason)
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

/// The rollout's state, the plan it runs, and how to carry it out.
pub struct Rollouts {
    bus: Bus,
    sites: Kv,
    packages: Kv,
    observed: Kv,
    sagas: Kv,
    /// Plan chunks by rollout and number: immutable once written. Each is read once however
    /// many handlers ask for it at once, and let go at the first tick that finds its rollout no
    /// longer under way.
    chunks: Mutex<HashMap<(String, u32), Arc<ChunkCell>>>,
    /// Catalog entries by key: immutable once registered.
    catalog: Mutex<HashMap<String, pb::Package>>,
    /// Site reports waiting to be counted, by rollout: counted together in one write.
    counting: GroupCommit<Report, Counted>,
    /// Rollouts this process is starting sites of: one dispatch at a time per rollout, or
    /// every settle during a long dispatch would start the same sites again.
    dispatching: Mutex<HashSet<String>>,
    /// The time sites' maintenance windows are read at.
    windows: WindowClock,
    /// Sites found outside their windows, by (rollout, site): not looked at again before the
    /// first time (window clock), and the opening their waiting record says.
    closed: Mutex<HashMap<(String, String), (i64, i64)>>,
}

/// Whether a plan's chunks are written over what an interrupted attempt left.
#[derive(Clone, Copy)]
enum Overwrite {
    /// A new rollout's: a chunk already there is another replica's, of the same plan.
    No,
    /// A rollback's: nobody reads them before its record is written.
    Yes,
}

/// A plan chunk, read from the bucket by the first that asks for it.
type ChunkCell = tokio::sync::OnceCell<Arc<pb::RolloutPlanChunk>>;

/// Whether the write that counts a batch of reports went in; its failure is shared by every
/// report of the batch.
type Counted = Result<(), Arc<HandlerError>>;

/// One site to start, from the plan.
struct Start {
    index: usize,
    site: pb::RolloutPlanSite,
}

/// What starting a site came to.
enum Started {
    /// Its job is out.
    Sent(usize),
    /// Another holds the site; it starts when free.
    Busy,
    /// Removed since the plan: no job.
    Removed(Start),
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
            counting: GroupCommit::default(),
            dispatching: Mutex::default(),
            windows: WindowClock::wall(),
            closed: Mutex::default(),
        })
    }

    /// Reads sites' maintenance windows at `clock`'s time rather than the wall clock's.
    pub fn set_window_clock(&mut self, clock: WindowClock) {
        self.windows = clock;
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
        let cell = {
            let mut chunks = self.chunks.lock().expect("chunks lock");
            let cell = chunks.entry((rollout_id.to_string(), n)).or_default().clone();
            metrics::gauge!("landfall_rollout_plan_chunks").set(chunks.len() as f64);
            cell
        };
        let chunk = cell
            .get_or_try_init(|| async {
                let key = keys::rollout_plan(rollout_id, n);
                match self.sagas.get::<pb::RolloutPlanChunk>(&key).await? {
                    Some((c, _)) => Ok(Arc::new(c)),
                    None => Err(BusError::Kv {
                        op: "get",
                        bucket: self.sagas.bucket().to_string(),
                        key,
                        source: "plan chunk missing".into(),
                    }),
                }
            })
            .await?;
        Ok(chunk.clone())
    }

    /// Lets go of the plan chunks of every rollout but those `under_way`.
    fn forget_chunks_but(&self, under_way: &HashSet<&str>) {
        let mut chunks = self.chunks.lock().expect("chunks lock");
        chunks.retain(|(id, _), _| under_way.contains(id.as_str()));
        metrics::gauge!("landfall_rollout_plan_chunks").set(chunks.len() as f64);
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
        let req = decide::request(&cmd).map_err(reject)?;
        // The fleet's commands are carried out in order, so no other rollout can start meanwhile.
        decide::not_moved_by_another(&req, &self.under_way().await?).map_err(reject)?;
        let entry = self.catalog_entry(req.name.as_str(), req.version.as_str()).await?;
        let entry = decide::in_catalog(&req, entry).map_err(reject)?;
        let planned = self.plan(&cmd, &req, entry, d).await?;
        let r = self.write_plan(&id, planned, Overwrite::No).await?;
        info!(rollout = %id, package = %req.name, version = %req.version, sites = r.sites, nodes = r.planned_nodes, waves = r.wave_ends.len(), trigger = %r.trigger, "rollout planned");
        active::mark(&self.sagas, &keys::active_rollout(&id), &id, "").await?;
        // Created here, or by another replica first: either way it is settled.
        let (created, (r, rev)) = self.sagas.create_or_get(&keys::rollout(&id), &r).await?;
        if created {
            gauge_nodes(&r);
        }
        self.settle(r, rev).await
    }

    /// The rollout `cmd` asks for, planned over every site's design and what its nodes were seen
    /// to run. Each record is turned into what the plan needs as it is read, and all of them are
    /// let go of once it is made: at 10,000 sites neither every design nor every observed version
    /// is held whole, nor held while the rollout starts.
    async fn plan(
        &self,
        cmd: &pb::PatchPackage,
        req: &decide::Request,
        entry: pb::Package,
        d: &Delivery,
    ) -> Result<decide::Planned, HandlerError> {
        let designs: Vec<SiteDesign> = self
            .sites
            .scan_matching_map(&format!("{}>", keys::SITE_PREFIX), |key, d: pb::SiteDesign| {
                SiteDesign::try_from(d)
                    .inspect_err(|e| warn!(%key, error = %e, "skipping a site design that does not validate"))
                    .ok()
            })
            .await?
            .into_iter()
            .map(|(_, d, _)| d)
            .collect();
        let everywhere = keys::observed_package_everywhere(req.name.as_str());
        let observed = self
            .observed
            .scan_matching_map(&everywhere, |_, v: pb::ObservedVersion| Some(((v.site_id, v.node), Some(v.version))))
            .await?
            .into_iter()
            .map(|(_, seen, _)| seen)
            .collect();
        decide::plan(cmd, req, entry, &designs, &observed, &d.envelope, now_ms()).map_err(reject)
    }

    /// Writes the plan's immutable chunks and lets go of them: the dispatch reads them back a
    /// chunk at a time, and what the orchestrator holds at the start of a rollout over 10,000
    /// sites is what sets its peak. The rollout to start is what is left.
    async fn write_plan(&self, id: &str, planned: decide::Planned, over: Overwrite) -> Result<pb::Rollout, BusError> {
        let decide::Planned { chunks, rollout } = planned;
        let writes = chunks.iter().enumerate().map(|(n, c)| {
            let key = keys::rollout_plan(id, n as u32);
            async move {
                match over {
                    Overwrite::No => self.sagas.create(&key, c).await.map(drop),
                    Overwrite::Yes => self.sagas.put(&key, c).await.map(drop),
                }
            }
        });
        futures::future::try_join_all(writes).await?;
        Ok(rollout)
    }

    /// The rollouts the index holds under way (a few: each one's record read once).
    async fn under_way(&self) -> Result<Vec<pb::Rollout>, BusError> {
        let mut out = Vec::new();
        for id in active::ids(&self.sagas, keys::ACTIVE_ROLLOUT_PREFIX).await? {
            if let Some((r, _)) = self.sagas.get::<pb::Rollout>(&keys::rollout(&id)).await? {
                out.push(r);
            }
        }
        Ok(out)
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
        if decide::phase(&r) == pb::RolloutPhase::Running {
            self.dispatch(r).await?;
        } else if decide::is_terminal(&r) {
            active::clear(&self.sagas, &keys::active_rollout(&r.rollout_id)).await?;
            self.closed.lock().expect("closed lock").retain(|(id, _), _| id != &r.rollout_id);
        }
        Ok(())
    }

    /// Starts every site of the current wave not started yet whose lease it can take, marking
    /// them started a slice at a time (other replicas and later ticks skip what is marked).
    /// A dispatch already running in this process for the rollout covers this one.
    async fn dispatch(&self, r: pb::Rollout) -> Result<(), HandlerError> {
        let pending = decide::pending_sites(&r);
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
            let results: Vec<Result<Started, BusError>> = futures::stream::iter(starts)
                .map(|s| self.start_site(r, s))
                .buffer_unordered(DISPATCH_PARALLEL)
                .collect()
                .await;
            let mut started = Vec::new();
            for res in results {
                match res? {
                    Started::Sent(i) => started.push(i),
                    Started::Busy => {}
                    Started::Removed(s) => self.skip_removed(r, s).await?,
                }
            }
            if !started.is_empty() {
                crate::failpoint::hit("rollout-jobs-sent-unmarked");
                self.mark_dispatched(&r.rollout_id, &started).await?;
            }
        }
        Ok(())
    }

    /// Takes the site's lease and sends its job: [`Started::Busy`] while the site is busy, and
    /// [`Started::Removed`] (lease given back, no job) for a site removed since the plan.
    async fn start_site(&self, r: &pb::Rollout, s: Start) -> Result<Started, BusError> {
        let site = s.site.site_id.clone();
        if self.waits_for_window(r, &s).await? {
            return Ok(Started::Busy);
        }
        match lease::acquire(&self.sagas, &site, Holder::Rollout(&r.rollout_id)).await? {
            Acquired::Yes => {}
            Acquired::Busy(why) => {
                debug!(rollout = %r.rollout_id, %site, %why, "site busy; it starts when free");
                return Ok(Started::Busy);
            }
        }
        if !r.rollback_of.is_empty() && self.undone_job_out(r, &site).await? {
            lease::release(&self.sagas, &site, Holder::Rollout(&r.rollout_id)).await?;
            debug!(rollout = %r.rollout_id, %site, "the undone rollout's job is still out there; the site goes back after");
            return Ok(Started::Busy);
        }
        // Checked under the lease: a site's removal is refused while anyone holds it.
        if self.sites.get::<pb::SiteDesign>(&keys::site(&site)).await?.is_none() {
            lease::release(&self.sagas, &site, Holder::Rollout(&r.rollout_id)).await?;
            return Ok(Started::Removed(s));
        }
        let installed = if decide::reinstalls(r) { self.installed(&site).await? } else { vec![] };
        let mut previous = std::collections::BTreeMap::new();
        if decide::rolls_nodes_back(r) {
            let name = r.package.as_ref().map(|p| p.name.as_str()).unwrap_or_default();
            for v in &s.site.from_versions {
                if !previous.contains_key(v)
                    && let Some(entry) = self.catalog_entry(name, v).await?
                {
                    previous.insert(v.clone(), entry);
                }
            }
        }
        let index = s.index;
        let (job, env) = decide::patch_job(r, index, s.site, &installed, &previous);
        self.bus.publish_job(&job, &env).await?;
        Ok(Started::Sent(index))
    }

    /// Whether the site of `s` is outside its maintenance windows (it takes no lease and gets no
    /// job then): its record says it waits, and until when, once per opening.
    async fn waits_for_window(&self, r: &pb::Rollout, s: &Start) -> Result<bool, BusError> {
        if r.ignore_windows {
            return Ok(false);
        }
        let site = &s.site.site_id;
        let key = (r.rollout_id.clone(), site.clone());
        let now = self.windows.now_ms();
        let cached = self.closed.lock().expect("closed lock").get(&key).copied();
        if cached.is_some_and(|(until, _)| until > now) {
            return Ok(true);
        }
        // A site removed meanwhile is found so under the lease.
        let Some((design, _)) = self.sites.get::<pb::SiteDesign>(&keys::site(site)).await? else { return Ok(false) };
        match decide::gate(r, &design.maintenance_windows, now) {
            decide::Gate::Open => {
                self.closed.lock().expect("closed lock").remove(&key);
                Ok(false)
            }
            decide::Gate::Closed { opens } => {
                let said = opens.unwrap_or_default();
                if cached.is_none_or(|(_, written)| written != said) {
                    info!(rollout = %r.rollout_id, %site, opens = ?opens, "the site waits for its maintenance window");
                    let record = decide::waiting_record(r, s.index, site, opens, now_ms());
                    self.sagas.put(&keys::rollout_site(&r.rollout_id, site), &record).await?;
                    // Downloads may run outside the window: the job finds them cached.
                    if cached.is_none()
                        && let Some((job, env)) = decide::stage_ahead(r, site)
                    {
                        self.bus.publish_job(&job, &env).await?;
                    }
                }
                let until = opens.unwrap_or(i64::MAX).min(now.saturating_add(WINDOW_RECHECK_MS));
                self.closed.lock().expect("closed lock").insert(key, (until, said));
                Ok(true)
            }
        }
    }

    /// Whether the job the rollout a rollback undoes sent `site` has not reported yet (its
    /// record is missing, or says only that the site waited for its window or that its wave
    /// timed out): the site goes back once that
    /// job is over, never while it still moves the site forward. (Cancelling a rollout lets go
    /// of its leases; this keeps the two jobs apart.)
    async fn undone_job_out(&self, r: &pb::Rollout, site: &str) -> Result<bool, BusError> {
        let key = keys::rollout_site(&r.rollback_of, site);
        Ok(match self.sagas.get::<pb::RolloutSite>(&key).await? {
            None => true,
            // Waited for its window, then sent its job: no report yet.
            Some((rec, _)) if rec.state == pb::RolloutSiteState::WaitingWindow as i32 => true,
            Some((rec, _)) => rec.state == pb::RolloutSiteState::TimedOut as i32 && !rec.reported_late,
        })
    }

    /// A site removed since the rollout was planned: no job; its nodes are counted skipped, so
    /// the rollout goes on without waiting for it.
    async fn skip_removed(&self, r: &pb::Rollout, s: Start) -> Result<(), HandlerError> {
        let report = decide::removed_site_report(r, s.index, &s.site, now_ms());
        info!(rollout = %r.rollout_id, site = %s.site.site_id, "site removed since the plan: its nodes are skipped");
        self.sagas.put(&keys::rollout_site(&r.rollout_id, &s.site.site_id), &report.record).await?;
        // Counted in a write of its own, not through the group commit of site reports: this may
        // run under a count (a report ended the wave before, and settling it dispatched this
        // one), which would wait for itself. The settle this write ends in finds the dispatch
        // under way; a wave this completes starts from the next tick. Boxed: settling a rollout
        // may dispatch, and dispatching may come here.
        let now = now_ms();
        Box::pin(self.update(&r.rollout_id, |current| Ok(decide::count_reports(current, &[&report.count], now))))
            .await?;
        Ok(())
    }

    /// The catalog entries each role of the site's design names.
    async fn installed(&self, site: &str) -> Result<Vec<pb::RoleArtifacts>, BusError> {
        let Some((design, _)) = self.sites.get::<pb::SiteDesign>(&keys::site(site)).await? else { return Ok(vec![]) };
        let mut out = Vec::new();
        for rp in design.packages {
            let mut packages = Vec::new();
            for p in rp.packages {
                if let Some(e) = self.catalog_entry(&p.name, &p.version).await? {
                    packages.push(e);
                }
            }
            out.push(pb::RoleArtifacts { role: rp.role, packages });
        }
        Ok(out)
    }

    async fn mark_dispatched(&self, rollout_id: &str, started: &[usize]) -> Result<(), HandlerError> {
        self.sagas
            .update_with(&keys::rollout(rollout_id), |r: Option<&pb::Rollout>| {
                let Some(r) = r else { return Update::Keep(()) };
                let mut next = r.clone();
                if decide::mark_dispatched(&mut next, started) { Update::Put(next, ()) } else { Update::Keep(()) }
            })
            .await?;
        Ok(())
    }

    /// Changes the rollout with `f` (compare-and-set), then settles it; whether `f` changed it.
    /// `f` returns `None` for "nothing to change".
    ///
    /// An outbox a previous write did not finish publishing stays in the record, and what `f`
    /// adds goes after it; the settle publishes both, in that order.
    async fn update(
        &self,
        rollout_id: &str,
        mut f: impl FnMut(&pb::Rollout) -> Result<Option<pb::Rollout>, HandlerError>,
    ) -> Result<bool, HandlerError> {
        let (changed, entry) = self
            .sagas
            .update_with_entry(&keys::rollout(rollout_id), |current: Option<&pb::Rollout>| {
                let Some(current) = current else {
                    return Update::Abort(Err(HandlerError::reject(
                        pb::RejectCode::Invalid,
                        format!("there is no rollout {rollout_id}"),
                    )));
                };
                match f(current) {
                    Ok(Some(next)) => Update::Put(next, Ok(true)),
                    Ok(None) => Update::Keep(Ok(false)),
                    Err(refused) => Update::Abort(Err(refused)),
                }
            })
            .await?;
        let Some((r, rev)) = entry else { return changed };
        match changed {
            Ok(changed) => {
                if changed {
                    gauge_nodes(&r);
                }
                self.settle(r, rev).await?;
                Ok(changed)
            }
            Err(refused) => {
                if !r.outbox.is_empty() {
                    self.settle(r, rev).await?;
                }
                Err(refused)
            }
        }
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
        let planned = match e.plan_index < r.sites {
            true => self.plan_site(&r, e.plan_index as usize).await?,
            false => pb::RolloutPlanSite::default(),
        };
        let index = e.plan_index as usize;
        if planned.site_id == e.site_id && !decide::dispatched(&r, index) {
            // A site's job is published before it is marked sent (a slice of sites at a time),
            // and a quick site can answer in between. While this rollout holds the site's lease
            // its job is on its way: the report waits to be counted until the mark is written.
            if lease::holds(&self.sagas, &e.site_id, Holder::Rollout(&r.rollout_id)).await? {
                return Err(HandlerError::Wait {
                    reason: format!("rollout {} is still recording the job it sent site {}", r.rollout_id, e.site_id),
                    delay: REPORT_BEFORE_MARK_RETRY,
                });
            }
        }
        decide::check_report(&r, &planned, &e, &d.envelope)
            .map_err(|reason| HandlerError::reject(pb::RejectCode::Forbidden, reason))?;
        let report = decide::site_report(&r, &planned, &e, &d.envelope, now_ms());
        if decide::counted(&r, report.count.index) {
            // Counted already: this report again, or the report of a site the wave's time-out
            // counted failed, which its record keeps now (the counts stay as they were).
            self.record_late(&report).await?;
        } else {
            let site_key = keys::rollout_site(&e.rollout_id, &e.site_id);
            let (a, b) = tokio::join!(self.sagas.put(&site_key, &report.record), async {
                match &report.design_to {
                    Some(package) => self.move_design(&e.site_id, package).await,
                    None => Ok(()),
                }
            });
            a?;
            b?;
        }
        lease::release(&self.sagas, &e.site_id, Holder::Rollout(&e.rollout_id)).await?;
        let (patched, failed) = (report.count.patched, report.count.failed);
        self.count(&e.rollout_id, report.count).await?;
        if failed > 0 {
            info!(rollout = %e.rollout_id, site = %e.site_id, patched, failed, "site patched with failures");
        }
        Ok(())
    }

    /// A report that arrives after its site was counted failed at the wave's time-out: what the
    /// site really did goes in its record, and its design moves to the version when it patched
    /// nodes (they run it, whatever the rollout counted).
    async fn record_late(&self, report: &decide::SiteReport) -> Result<(), HandlerError> {
        let site = &report.record.site_id;
        let key = keys::rollout_site(&report.record.rollout_id, site);
        let Some((held, rev)) = self.sagas.get::<pb::RolloutSite>(&key).await? else { return Ok(()) };
        let Some(late) = decide::late_record(&held, report) else { return Ok(()) };
        if let Some(package) = &report.design_to {
            self.move_design(site, package).await?;
        }
        if self.sagas.update(&key, &late, rev).await? == bus_schema::runtime::Cas::Conflict {
            return Err(HandlerError::Wait {
                reason: format!("the record of site {site} changed while its late report was written"),
                delay: REPORT_BEFORE_MARK_RETRY,
            });
        }
        info!(rollout = %late.rollout_id, %site, patched = late.patched.len(), failed = late.failed.len(), "a site timed out reported late: recorded");
        Ok(())
    }

    /// Counts a site's report on the rollout, together with the reports of other sites that
    /// arrive meanwhile: one compare-and-set write for many sites (group commit). Returns once
    /// the write that counts this report is stored, so the delivery is acknowledged only then.
    async fn count(&self, rollout_id: &str, report: Report) -> Result<(), HandlerError> {
        let counted = self
            .counting
            .submit(rollout_id, report, |batch: Vec<Report>| async move {
                let reports: Vec<&Report> = batch.iter().collect();
                let now = now_ms();
                let result = self
                    .update(rollout_id, |r| Ok(decide::count_reports(r, &reports, now)))
                    .await
                    .map(drop)
                    .map_err(Arc::new);
                vec![result; batch.len()]
            })
            .await;
        match counted {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => {
                Err(HandlerError::transient(format!("counting a site's report on rollout {rollout_id}"), e))
            }
            None => {
                Err(HandlerError::transient_reason(format!("rollout {rollout_id}: the counting write was dropped")))
            }
        }
    }

    /// Moves the site's design to `package` (see [`decide::move_design`]).
    async fn move_design(&self, site: &str, package: &pb::PackageRef) -> Result<(), BusError> {
        self.sites
            .update_with(&keys::site(site), |design: Option<&pb::SiteDesign>| {
                let Some(design) = design else { return Update::Keep(()) };
                let mut next = design.clone();
                if decide::move_design(&mut next, package) { Update::Put(next, ()) } else { Update::Keep(()) }
            })
            .await
    }

    pub async fn pause(&self, d: &Delivery) -> Result<(), HandlerError> {
        let cmd: pb::PauseRollout = d.decode()?;
        self.update(&cmd.rollout_id, |r| decide::pause(r, &cmd.reason, &d.envelope).map_err(reject)).await?;
        Ok(())
    }

    pub async fn resume(&self, d: &Delivery) -> Result<(), HandlerError> {
        let cmd: pb::ResumeRollout = d.decode()?;
        let now = now_ms();
        self.update(&cmd.rollout_id, |r| decide::resume(r, &d.envelope, now).map_err(reject)).await?;
        Ok(())
    }

    pub async fn cancel(&self, d: &Delivery) -> Result<(), HandlerError> {
        let cmd: pb::CancelRollout = d.decode()?;
        let now = now_ms();
        self.update(&cmd.rollout_id, |r| decide::cancel(r, &cmd.reason, &d.envelope, now).map_err(reject)).await?;
        Ok(())
    }

    /// One look at every rollout that has not ended: publish what a crash left in an outbox,
    /// start sites that were busy, and end waves that ran out of time. Runs on every replica,
    /// and reads the rollouts under way (the index, `active.rollout.*`), not every one ever run.
    pub async fn tick(&self) -> Result<(), HandlerError> {
        let mut rollouts = Vec::new();
        for id in active::ids(&self.sagas, keys::ACTIVE_ROLLOUT_PREFIX).await? {
            if let Some((r, rev)) = self.sagas.get::<pb::Rollout>(&keys::rollout(&id)).await? {
                rollouts.push((id, r, rev));
            }
        }
        self.forget_chunks_but(&rollouts.iter().map(|(id, ..)| id.as_str()).collect());
        // Every replica's gauges follow the records, whichever replica wrote them.
        let mut phases: HashMap<pb::RolloutPhase, u32> = HashMap::new();
        for (_, r, _) in &rollouts {
            *phases.entry(decide::phase(r)).or_default() += 1;
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
            if decide::is_terminal(&r) && r.outbox.is_empty() {
                // Ended, and the write that ended it did not get to take it out of the index.
                active::clear(&self.sagas, &keys::active_rollout(&r.rollout_id)).await?;
                continue;
            }
            if !(decide::wave_timed_out(&r, now_ms()) && self.time_out_wave(&r.rollout_id).await?) {
                self.settle(r, rev).await?;
            }
        }
        Ok(())
    }

    /// The current wave ran out of time: abort the rollout, or count the sites that did not
    /// report as failed (each of their planned nodes) and go on.
    /// Whether it did: sites waiting for their windows are not counted, and a wave whose only
    /// silent sites wait for theirs goes on waiting.
    async fn time_out_wave(&self, rollout_id: &str) -> Result<bool, HandlerError> {
        let Some((r, _)) = self.sagas.get::<pb::Rollout>(&keys::rollout(rollout_id)).await? else { return Ok(true) };
        let now = now_ms();
        if !decide::wave_timed_out(&r, now) {
            return Ok(true);
        }
        let mut late = Vec::new();
        // The silent sites the hub counts cut off, and since when: their records say so.
        let mut cut_off = std::collections::HashMap::new();
        for i in decide::silent_sites(&r) {
            let site = self.plan_site(&r, i).await?;
            // A site waiting for its window has not started: the wave's clock is not its own.
            if !decide::dispatched(&r, i)
                && let Some((rec, _)) =
                    self.sagas.get::<pb::RolloutSite>(&keys::rollout_site(rollout_id, &site.site_id)).await?
                && rec.state == pb::RolloutSiteState::WaitingWindow as i32
            {
                continue;
            }
            if let Some((link, _)) = self.observed.get::<pb::SiteLink>(&keys::link(&site.site_id)).await?
                && link.state == pb::LinkState::CutOff as i32
            {
                cut_off.insert(site.site_id.clone(), link.since_unix_ms);
            }
            late.push((i, site));
        }
        if late.is_empty() {
            return Ok(false);
        }
        let timeout = decide::wave_timeout(&r, late);
        // Each silent site says why it counts as failed, in its record, and lets go of its lease.
        for record in timeout.site_records(now, &cut_off) {
            self.sagas.put(&keys::rollout_site(rollout_id, &record.site_id), &record).await?;
            lease::release(&self.sagas, &record.site_id, Holder::Rollout(rollout_id)).await?;
        }
        let applied = self.update(rollout_id, |current| Ok(timeout.apply(current, now))).await?;
        if applied && timeout.goes_on() {
            warn!(rollout = %rollout_id, why = %timeout.why, "wave timed out; going on");
        }
        Ok(true)
    }
}
