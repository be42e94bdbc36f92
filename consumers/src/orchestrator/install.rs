//! The install saga, executed: `InstallSite` and `StageSite` started, the events that move a
//! saga decided by [`crate::saga::decide`] and written with compare-and-set, outboxes published
//! and cleared, the site lease let go when the saga ends, and what a crash left resumed.

use std::sync::Arc;
use std::time::Duration;

use bus_schema::names::{self, keys};
use bus_schema::pb::{self, BusEvent};
use bus_schema::runtime::{Cas, Delivery, HandlerError, Update};
use bus_schema::trust;
use tracing::{debug, info};

use super::service::{LEASE_RETRY, Orchestrator, invalid};
use crate::active;
use crate::clock::now_ms;
use crate::lease::{self, Holder};
use crate::saga::{self, Decision, Input};

impl Orchestrator {
    pub(super) async fn install_site(&self, d: &Delivery) -> Result<(), HandlerError> {
        let cmd: pb::InstallSite = d.decode()?;
        let site = bus_schema::domain::SiteId::try_from(cmd.site_id).map_err(invalid)?.to_string();
        let saga_key = keys::saga(&d.envelope.id);

        // A redelivery of an accepted command: finish what it started, nothing more.
        if let Some((existing, rev)) = self.sagas.get::<pb::InstallSaga>(&saga_key).await? {
            self.settle(&saga_key, existing, rev).await?;
            return Ok(());
        }

        let design = self.design_at(&site, cmd.design_revision).await?;
        let resolved = saga::resolve(&design, &self.catalog_for(&design).await?)
            .map_err(|r| HandlerError::reject(r.code, r.reason))?;

        lease::acquire_or_wait(&self.sagas, &site, Holder::Saga(&d.envelope.id), LEASE_RETRY).await?;
        active::mark(&self.sagas, &keys::active_saga(&d.envelope.id), &d.envelope.id, &site).await?;
        let new = saga::start(&d.envelope, &design, resolved, now_ms());
        // Created here, or by another replica first: either way its outbox goes out.
        let (created, (saga, rev)) = self.sagas.create_or_get(&saga_key, &new).await?;
        if created {
            info!(%site, saga = %d.envelope.id, nodes = design.nodes.len(), "install started");
            let pointer = pb::SiteLease {
                site_id: site.clone(),
                saga_id: d.envelope.id.clone(),
                acquired_unix_ms: now_ms(),
                ..Default::default()
            };
            self.sagas.put(&keys::latest_install(&site), &pointer).await?;
        }
        self.settle(&saga_key, saga, rev).await
    }

    /// Stages a site's artifacts into its gateway's cache, ahead of an install. It changes no
    /// node, so it takes no site lease; the job's id comes from the command's, so a redelivered
    /// command sends no second job.
    pub(super) async fn stage_site(&self, d: &Delivery) -> Result<(), HandlerError> {
        let cmd: pb::StageSite = d.decode()?;
        let site = bus_schema::domain::SiteId::try_from(cmd.site_id).map_err(invalid)?.to_string();
        let design = self.design_at(&site, cmd.design_revision).await?;
        let resolved = saga::resolve(&design, &self.catalog_for(&design).await?)
            .map_err(|r| HandlerError::reject(r.code, r.reason))?;
        let job = saga::stage_job(site.clone(), &resolved);
        info!(%site, artifacts = job.artifacts.len(), "staging ahead of an install");
        self.bus.publish_job(&job, &d.envelope.derive("stage_artifacts", None)).await?;
        Ok(())
    }

    /// Publishes the saga's outbox, clears it, and releases the lease once the saga has ended.
    /// Safe to repeat: the messages carry fixed ids, so a second publish is dropped as a duplicate.
    pub(super) async fn settle(&self, key: &str, mut saga: pb::InstallSaga, rev: u64) -> Result<(), HandlerError> {
        if !saga.outbox.is_empty() {
            crate::failpoint::hit("saga-written-outbox-unpublished");
            self.bus.publish_all(crate::decision::outgoing(&saga.outbox, &saga.saga_id)).await?;
            crate::failpoint::hit("outbox-published-not-cleared");
            saga.outbox.clear();
            if self.sagas.update(key, &saga, rev).await? == Cas::Conflict {
                // Someone else changed it meanwhile; they (or the next delivery) settle it.
                return Ok(());
            }
        }
        if saga::is_terminal(&saga) {
            lease::release(&self.sagas, &saga.site_id, Holder::Saga(&saga.saga_id)).await?;
            active::clear(&self.sagas, &keys::active_saga(&saga.saga_id)).await?;
        }
        Ok(())
    }

    /// Publishes what sagas decided before a crash and did not get to publish. Redelivery
    /// would get there too, but only after the ack wait; this resumes at once from KV state.
    /// It reads the sagas under way (the index, `active.saga.*`), not every saga ever written.
    pub async fn recover(&self) -> Result<usize, HandlerError> {
        let mut settled = 0;
        for id in active::ids(&self.sagas, keys::ACTIVE_SAGA_PREFIX).await? {
            let key = keys::saga(&id);
            if let Some((saga, rev)) = self.sagas.get::<pb::InstallSaga>(&key).await?
                && (!saga.outbox.is_empty() || saga::is_terminal(&saga))
            {
                settled += usize::from(!saga.outbox.is_empty());
                self.settle(&key, saga, rev).await?;
            }
        }
        Ok(settled)
    }

    /// Applies an event to its saga. Events of one saga that arrive while a write of it is under
    /// way are applied together, in stream order, by the next write: a site's nodes report
    /// together, and one compare-and-set write (and one outbox) for all of them costs the hub a
    /// fraction of one each.
    pub(super) async fn on_event(&self, d: &Delivery) -> Result<(), HandlerError> {
        let Some(input) = input_of(d)? else { return Ok(()) };
        let key = keys::saga(&d.envelope.correlation);
        let arrival =
            Arrival { input, subject: d.subject.clone(), envelope: d.envelope.clone(), sequence: d.stream_sequence };
        let answer = self
            .saga_batches
            .submit(&key, arrival, |arrivals| {
                let key = &key;
                async move { self.apply_events(key, &arrivals).await }
            })
            .await;
        match answer {
            Some(Answer::Done) => Ok(()),
            Some(Answer::Forbidden(reason)) => Err(HandlerError::reject(pb::RejectCode::Forbidden, reason)),
            Some(Answer::Wait) => Err(HandlerError::Wait {
                reason: format!("{} arrived before the saga reached its phase", d.type_name),
                delay: Duration::from_millis(200),
            }),
            Some(Answer::Failed(e)) => Err(HandlerError::transient(format!("applying {} to {key}", d.type_name), e)),
            None => {
                Err(HandlerError::transient_reason(format!("{key}: the write applying {} was dropped", d.type_name)))
            }
        }
    }

    /// Applies `arrivals` (in stream order, whatever order they came in) to the saga at `key`
    /// in one compare-and-set write, publishes what they decided, and says what became of
    /// each, in the order they came in.
    async fn apply_events(&self, key: &str, arrivals: &[Arrival]) -> Vec<Answer> {
        let now = now_ms();
        let result = self
            .sagas
            .update_with_entry(key, |current: Option<&pb::InstallSaga>| match current {
                None => Update::Keep(vec![Step::Ignored; arrivals.len()]),
                Some(current) => match apply_in_turn(current, arrivals, now) {
                    (Some(next), steps) => Update::Put(next, steps),
                    (None, steps) => Update::Keep(steps),
                },
            })
            .await;
        let (steps, saga) = match result {
            Ok(done) => done,
            Err(e) => {
                let e = Arc::new(HandlerError::from(e));
                return arrivals.iter().map(|_| Answer::Failed(e.clone())).collect();
            }
        };
        let Some((saga, rev)) = saga else {
            debug!(%key, events = arrivals.len(), "events belong to no install saga");
            return arrivals.iter().map(|_| Answer::Done).collect();
        };
        let mut applied = false;
        for step in &steps {
            if let Step::Applied(observed) = step {
                applied = true;
                observed.record();
            }
        }
        if applied && saga::is_terminal(&saga) {
            info!(site = %saga.site_id, saga = %saga.saga_id, outcome = saga.outcome, "install finished");
        }
        let settled =
            if applied { self.settle(key, saga, rev).await } else { self.settle_pending(key, saga, rev).await };
        let failed = settled.err().map(Arc::new);
        steps
            .into_iter()
            .map(|step| match (step, &failed) {
                (Step::Forbidden(reason), _) => Answer::Forbidden(reason),
                (_, Some(e)) => Answer::Failed(e.clone()),
                (Step::Wait, None) => Answer::Wait,
                (Step::Ignored | Step::Applied(_), None) => Answer::Done,
            })
            .collect()
    }

    /// Settles a saga read but not written, if a previous step left its outbox unpublished.
    async fn settle_pending(&self, key: &str, saga: pb::InstallSaga, rev: u64) -> Result<(), HandlerError> {
        if saga.outbox.is_empty() { Ok(()) } else { self.settle(key, saga, rev).await }
    }
}

/// Applies `arrivals` one after another in stream order to `saga`, each to what the ones
/// before it made: the saga after them (`None` when none moved it) and what became of each, in
/// the order of `arrivals` (the order their handlers wait for their answers in).
fn apply_in_turn(saga: &pb::InstallSaga, arrivals: &[Arrival], now: i64) -> (Option<pb::InstallSaga>, Vec<Step>) {
    let mut in_stream_order: Vec<usize> = (0..arrivals.len()).collect();
    in_stream_order.sort_by_key(|&i| arrivals[i].sequence);
    let mut moved: Option<pb::InstallSaga> = None;
    let mut steps: Vec<(usize, Step)> = in_stream_order
        .into_iter()
        .map(|i| {
            let a = &arrivals[i];
            let current = moved.as_ref().unwrap_or(saga);
            let site = trust::subject_site(&a.subject).unwrap_or_default();
            let answers = trust::rule_for_subject(&a.subject).map_or(&[][..], |r| r.answers);
            if let Err(reason) = saga::check_answer(current, site, answers, a.input.node(), &a.envelope) {
                return (i, Step::Forbidden(reason));
            }
            let step = match saga::decide(current, &a.input, &a.envelope, now) {
                Decision::Ignore => Step::Ignored,
                Decision::Wait => Step::Wait,
                Decision::Apply(next) => {
                    let observed = SagaMetrics::of(current, &next);
                    moved = Some(*next);
                    Step::Applied(observed)
                }
            };
            (i, step)
        })
        .collect();
    steps.sort_by_key(|(i, _)| *i);
    (moved, steps.into_iter().map(|(_, step)| step).collect())
}

/// Events of sagas waiting for the write that applies them, by saga key.
pub(super) type SagaBatches = crate::group_commit::GroupCommit<Arrival, Answer>;

/// An event, as its saga's write needs it.
pub(super) struct Arrival {
    input: Input,
    subject: String,
    envelope: bus_schema::runtime::Envelope,
    sequence: u64,
}

/// What became of one event of a write.
pub(super) enum Answer {
    Done,
    Forbidden(String),
    Wait,
    /// The write or the publishing of its outbox failed; the event is tried again.
    Failed(Arc<HandlerError>),
}

/// What an event did to its saga.
#[derive(Clone)]
enum Step {
    /// It does not come from where an answer for the saga must (see [`saga::check_answer`]).
    Forbidden(String),
    /// Already applied, or stale.
    Ignored,
    /// It came before the saga reached its phase.
    Wait,
    /// The saga moved; what to observe of the move.
    Applied(SagaMetrics),
}

/// What a saga's move adds to the metrics: how long it spent in the phase it has just left
/// and, once it has ended, in all. Only the write that moved it counts, so each is observed
/// once whatever the replicas.
#[derive(Clone)]
struct SagaMetrics {
    phase_left: Option<(&'static str, f64)>,
    /// Kind, outcome and seconds of a saga that has just ended.
    ended: Option<(&'static str, &'static str, f64)>,
}

impl SagaMetrics {
    fn of(before: &pb::InstallSaga, after: &pb::InstallSaga) -> Self {
        let ended = (saga::is_terminal(after) && !saga::is_terminal(before)).then(|| {
            let kind = if after.join { "join" } else { "install" };
            let outcome = match pb::InstallOutcome::try_from(after.outcome) {
                Ok(pb::InstallOutcome::Success) => "success",
                Ok(pb::InstallOutcome::PartialSuccess) => "partial_success",
                _ => "failure",
            };
            (kind, outcome, (after.finished_unix_ms - after.started_unix_ms).max(0) as f64 / 1000.0)
        });
        Self { phase_left: saga::phase_left(before, after), ended }
    }

    fn record(&self) {
        if let Some((step, seconds)) = self.phase_left {
            metrics::histogram!("landfall_saga_step_seconds", "step" => step).record(seconds);
        }
        if let Some((kind, outcome, seconds)) = self.ended {
            metrics::histogram!("landfall_saga_seconds", "kind" => kind, "outcome" => outcome).record(seconds);
            metrics::counter!("landfall_sagas_ended_total", "kind" => kind, "outcome" => outcome).increment(1);
        }
    }
}

/// Every saga-ended counter at 0 from the start, so that an alert on its increase sees the
/// first failure (a series born at 1 shows no increase).
pub(super) fn zero_saga_counters() {
    for kind in ["install", "join"] {
        for outcome in ["success", "partial_success", "failure"] {
            metrics::counter!("landfall_sagas_ended_total", "kind" => kind, "outcome" => outcome).increment(0);
        }
    }
}

/// The saga input an event carries; `None` for events the orchestrator does not act on.
fn input_of(d: &Delivery) -> Result<Option<Input>, HandlerError> {
    let kind = match names::parse_subject(&d.subject) {
        Some(names::ParsedSubject::Event { aggregate, kind, .. }) => (aggregate, kind),
        _ => return Ok(None),
    };
    let is = |a: &str, k: &str| kind == (a, k);
    Ok(Some(if is(pb::ArtifactsStaged::AGGREGATE, pb::ArtifactsStaged::KIND) {
        d.decode::<pb::ArtifactsStaged>()?;
        Input::Staged
    } else if is(pb::NodeOsProvisioning::AGGREGATE, pb::NodeOsProvisioning::KIND) {
        let e: pb::NodeOsProvisioning = d.decode()?;
        Input::OsState { node: e.node, state: e.state }
    } else if is(pb::NodeOsProvisioned::AGGREGATE, pb::NodeOsProvisioned::KIND) {
        Input::OsProvisioned { node: d.decode::<pb::NodeOsProvisioned>()?.node }
    } else if is(pb::NodeFailed::AGGREGATE, pb::NodeFailed::KIND) {
        let e: pb::NodeFailed = d.decode()?;
        Input::NodeFailed { node: e.node, step: e.step, reason: e.reason }
    } else if is(pb::NodeBinariesInstalled::AGGREGATE, pb::NodeBinariesInstalled::KIND) {
        Input::BinariesInstalled { node: d.decode::<pb::NodeBinariesInstalled>()?.node }
    } else if is(pb::ClusterReady::AGGREGATE, pb::ClusterReady::KIND) {
        Input::ClusterReady(d.decode()?)
    } else if is(pb::KubeconfigStored::AGGREGATE, pb::KubeconfigStored::KIND) {
        d.decode::<pb::KubeconfigStored>()?;
        Input::KubeconfigStored
    } else if is(pb::ContainerPackagesApplied::AGGREGATE, pb::ContainerPackagesApplied::KIND) {
        d.decode::<pb::ContainerPackagesApplied>()?;
        Input::ContainersApplied
    } else if is(pb::JobFailed::AGGREGATE, pb::JobFailed::KIND) {
        let e: pb::JobFailed = d.decode()?;
        Input::JobFailed { job: e.job, reason: e.reason }
    } else {
        return Ok(None);
    }))
}

/// The events the saga consumer reads: every event. The kinds that move an install saga (those
/// `input_of` knows) are most of what an install reports, and nats-server finds the next message
/// of a consumer with several filters that has fallen behind by walking the stream's subjects: at
/// thousands of sites that cost the hub most of its CPU during installs on 2.10, and still does on
/// 2.15.1 (2,500 sites: the install took 119.4 s instead of 48.1 s, the hub 139.1 CPU seconds
/// instead of 43.5, though the patch, whose cordon, drain and uncordon events the saga passes
/// over, took 10.0 s instead of 12.6). An unfiltered consumer reads on, and the kinds that move no
/// saga are passed over without a read.
pub fn saga_event_filters() -> Vec<String> {
    vec![names::EVENTS_ALL.to_string()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use bus_schema::pb::{BusJob, BusMessage};
    use bus_schema::runtime::Envelope;

    #[test]
    fn every_filter_is_an_event_subject() {
        for f in saga_event_filters() {
            assert!(f.starts_with("landfall.evt."), "{f}");
        }
        assert_eq!(pb::ClusterReady::TYPE, "landfall.v1.ClusterReady");
    }

    /// A site's report as the saga consumer gets it: on the site's subject, answering `job`.
    fn report(site: &str, input: Input, job: &str, node: Option<&str>, sequence: u64) -> Arrival {
        let subject = match &input {
            Input::OsProvisioned { node } => {
                pb::NodeOsProvisioned { site_id: site.into(), node: node.clone(), ..Default::default() }.subject()
            }
            Input::BinariesInstalled { node } => {
                pb::NodeBinariesInstalled { site_id: site.into(), node: node.clone(), ..Default::default() }.subject()
            }
            other => panic!("no subject for {other:?} here"),
        };
        let job = Envelope { id: job.into(), ..Envelope::root() };
        Arrival { input, subject, envelope: job.derive("report", node), sequence }
    }

    /// Events written together are each decided against what those before them made, and each
    /// gets its own answer: one refused or early does not hold back or carry the others.
    #[test]
    fn events_applied_together_are_each_decided_in_turn_and_answered_alone() {
        let started = crate::saga::tests::started(2);
        let Decision::Apply(staged) = saga::decide(&started, &Input::Staged, &Envelope::root(), 1) else { panic!() };
        let staged = pb::InstallSaga { outbox: vec![], ..*staged };
        let site = staged.site_id.clone();
        let job_of = |node: &str| {
            let job = staged.jobs.iter().find(|j| j.kind == pb::ProvisionOs::KIND && j.nodes == [node]).unwrap();
            job.id.clone()
        };
        let (n0, n1) = (job_of("n0"), job_of("n1"));
        let os = |node: &str| Input::OsProvisioned { node: node.into() };
        let arrivals = [
            report(&site, os("n0"), &n0, Some("n0"), 10),
            // n0 again, right behind: the first one already moved it.
            report(&site, os("n0"), &n0, Some("n0"), 11),
            // Another site speaking of this saga.
            report("edge-9", os("n1"), &n1, Some("n1"), 12),
            // Binaries before the site's OS is all there.
            report(&site, Input::BinariesInstalled { node: "n0".into() }, &n0, Some("n0"), 13),
            report(&site, os("n1"), &n1, Some("n1"), 14),
        ];
        let kind = |s: &Step| match s {
            Step::Applied(_) => "applied",
            Step::Ignored => "ignored",
            Step::Forbidden(_) => "forbidden",
            Step::Wait => "wait",
        };
        let (after, steps) = apply_in_turn(&staged, &arrivals, 2);
        let kinds: Vec<&str> = steps.iter().map(kind).collect();
        assert_eq!(kinds, ["applied", "ignored", "forbidden", "forbidden", "applied"]);
        let after = after.expect("two of them moved the saga");
        assert!(after.nodes.iter().all(|n| n.step == pb::NodeStep::OsProvisioned as i32), "{:?}", after.nodes);
        assert_eq!(after.phase, pb::InstallPhase::InstallingBinaries as i32, "the last OS moved the phase on");
        // Nothing in the batch moves the saga: no write.
        let (none, steps) = apply_in_turn(&after, &arrivals[..2], 3);
        assert!(none.is_none() && steps.iter().all(|s| matches!(s, Step::Ignored)));

        // The same events handed over in another order are decided in stream order, and each
        // answer goes to its own event: an early one answered as a repeat would be acknowledged
        // unapplied, and its saga would wait for it for good.
        let reversed: Vec<Arrival> = arrivals.into_iter().rev().collect();
        let (again, steps) = apply_in_turn(&staged, &reversed, 2);
        let kinds: Vec<&str> = steps.iter().map(kind).collect();
        assert_eq!(kinds, ["applied", "forbidden", "forbidden", "ignored", "applied"]);
        assert_eq!(again.map(|s| s.phase), Some(pb::InstallPhase::InstallingBinaries as i32));
    }
}
