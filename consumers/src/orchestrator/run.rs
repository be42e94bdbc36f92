//! The orchestrator's consumers, started: commands (checked against the ledger and their scope's
//! order, then dispatched by kind to their handlers), the events that move install sagas, the
//! site reports of rollouts, the rollout tick, the compaction pass and the store watch.

use std::sync::Arc;

use bus_schema::names;
use bus_schema::pb::{self, BusEvent};
use bus_schema::retention::StorePolicy;
use bus_schema::runtime::{self, Bus, ConsumerSpec, Delivery, HandlerError, RejectAs};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::install::saga_event_filters;
use super::service::Orchestrator;
use crate::rollout;

struct Commands(Arc<Orchestrator>);
struct Events(Arc<Orchestrator>);

impl runtime::Handler for Commands {
    async fn handle(&self, d: &Delivery) -> Result<(), HandlerError> {
        // A copy of a command carried out or refused before, however long ago: nothing again,
        // and the same answer.
        if let Some(first) = self.0.ledger.first_answer(d).await? {
            debug!(subject = %d.subject, id = %d.envelope.id, "a copy of a command already settled: nothing done");
            return first;
        }
        // Every earlier command of its scope settled first, whichever replica holds it.
        self.0.check_order(d).await?;
        let result = self.dispatch(d).await;
        self.0.ledger.record(d, &result).await?;
        count_command(d, &result);
        result
    }

    /// A command given up is settled for its scope's order (the ones after it go on), and not
    /// answered: `landfall dead replay` carries it out.
    async fn on_dead_lettered(&self, d: &Delivery, reason: &str) -> Result<(), HandlerError> {
        self.0.ledger.record_dead_lettered(d, reason).await?;
        let kind = d.kind().unwrap_or_default();
        let type_name = pb::COMMAND_TYPES.iter().find(|(k, _)| *k == kind).map_or("unknown", |(_, t)| t);
        metrics::counter!("landfall_commands_total", "type" => type_name, "outcome" => "dead_lettered").increment(1);
        Ok(())
    }
}

/// Counts a command the orchestrator accepted or rejected, by type (`unknown` for a subject
/// naming no command, so a stray publisher cannot grow the label set). A command that will be
/// tried again (transient, or waiting for its site) is counted when it is settled.
fn count_command(d: &Delivery, result: &Result<(), HandlerError>) {
    let kind = d.kind().unwrap_or_default();
    let type_name = pb::COMMAND_TYPES.iter().find(|(k, _)| *k == kind).map_or("unknown", |(_, t)| t);
    match result {
        Ok(()) => {
            metrics::counter!("landfall_commands_total", "type" => type_name, "outcome" => "accepted").increment(1);
        }
        Err(HandlerError::Reject(r)) => {
            let code = runtime::reject_code_label(r.code);
            metrics::counter!("landfall_commands_total", "type" => type_name, "outcome" => "rejected", "code" => code)
                .increment(1);
        }
        Err(HandlerError::Transient { .. } | HandlerError::Wait { .. }) => {}
    }
}

impl Commands {
    async fn dispatch(&self, d: &Delivery) -> Result<(), HandlerError> {
        use pb::BusCommand;
        match d.kind()? {
            pb::RegisterSite::KIND => self.0.register_site(d).await,
            pb::RegisterPackage::KIND => self.0.register_package(d).await,
            pb::InstallSite::KIND => self.0.install_site(d).await,
            pb::StageSite::KIND => self.0.stage_site(d).await,
            pb::ApplyDesign::KIND => self.0.apply_design(d).await,
            pb::PatchPackage::KIND => self.0.rollouts.patch_package(d).await,
            pb::PauseRollout::KIND => self.0.rollouts.pause(d).await,
            pb::ResumeRollout::KIND => self.0.rollouts.resume(d).await,
            pb::CancelRollout::KIND => self.0.rollouts.cancel(d).await,
            pb::RollbackRollout::KIND => self.0.rollouts.rollback(d).await,
            pb::NodeAdded::KIND => self.0.node_added(d).await,
            pb::NodeRemoved::KIND => self.0.node_removed(d).await,
            pb::RemoveSite::KIND => self.0.remove_site(d).await,
            pb::RemoveNode::KIND => self.0.remove_node_cmd(d).await,
            pb::ReprovisionNode::KIND => self.0.reprovision_node(d).await,
            pb::DecommissionSite::KIND => self.0.decommission_site(d).await,
            other => Err(HandlerError::reject(pb::RejectCode::Unsupported, format!("no such command {other:?}"))),
        }
    }
}

impl runtime::Handler for Events {
    async fn handle(&self, d: &Delivery) -> Result<(), HandlerError> {
        if super::lifecycle::is_lifecycle_answer(d)? {
            return self.0.on_lifecycle_event(d).await;
        }
        self.0.on_event(d).await
    }
}

struct RolloutEvents(Arc<Orchestrator>);

impl runtime::Handler for RolloutEvents {
    async fn handle(&self, d: &Delivery) -> Result<(), HandlerError> {
        self.0.rollouts.on_site_patched(d).await
    }
}

/// Looks at the rollouts under way every [`rollout::TICK`] until `shutdown`.
async fn tick_rollouts(orchestrator: Arc<Orchestrator>, shutdown: CancellationToken) {
    let mut every = tokio::time::interval(rollout::TICK);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = every.tick() => {}
        }
        if let Err(e) = orchestrator.rollouts.tick().await {
            warn!(error = %runtime::error_chain(&e), "rollout tick failed; trying again");
        }
    }
}

/// How the orchestrator's consumers run.
#[derive(Debug, Clone)]
pub struct OrchestratorOptions {
    /// Transient failures a message may have before it is given up as a dead letter
    /// ([`ConsumerSpec::max_attempts`]).
    pub max_attempts: Option<u32>,
    /// What is kept, and for how long.
    pub policy: StorePolicy,
    /// The time sites' maintenance windows are read at (the wall clock's, unless simulated).
    pub window_clock: crate::WindowClock,
}

impl Default for OrchestratorOptions {
    fn default() -> Self {
        Self {
            max_attempts: Some(runtime::DEFAULT_MAX_ATTEMPTS),
            policy: StorePolicy::default(),
            window_clock: crate::WindowClock::wall(),
        }
    }
}

/// Runs the orchestrator's consumers until `shutdown`.
pub async fn run_orchestrator(bus: Bus, policy: StorePolicy, shutdown: CancellationToken) -> anyhow::Result<()> {
    run_orchestrator_with(bus, OrchestratorOptions { policy, ..OrchestratorOptions::default() }, shutdown).await
}

/// [`run_orchestrator`], as `options` say.
pub async fn run_orchestrator_with(
    bus: Bus,
    options: OrchestratorOptions,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let mut orchestrator = Orchestrator::new(bus.clone(), options.policy.validate()?).await?;
    orchestrator.rollouts.set_window_clock(options.window_clock);
    let orchestrator = Arc::new(orchestrator);
    super::install::zero_saga_counters();
    info!(replica = %orchestrator.ledger.replica, "orchestrator starting (the ledger names this replica)");
    match orchestrator.recover().await {
        Ok(0) => {}
        Ok(n) => info!(sagas = n, "resumed sagas interrupted before publishing"),
        Err(e) => warn!(error = %runtime::error_chain(&e), "could not resume interrupted sagas now; redelivery will"),
    }
    let commands = ConsumerSpec::new(
        names::COMMANDS_STREAM,
        names::ORCHESTRATOR_COMMANDS,
        vec![names::COMMANDS_ALL.to_string()],
        RejectAs::Command,
    )
    .ordered_by_token(names::SCOPE_TOKEN, Some(names::FLEET))
    .max_attempts(options.max_attempts);
    let events = ConsumerSpec::new(
        names::EVENTS_STREAM,
        names::ORCHESTRATOR_EVENTS,
        saga_event_filters(),
        RejectAs::Message { consumer: names::ORCHESTRATOR_EVENTS.to_string() },
    )
    // Not one site's events at a time: those that arrive together (a site's nodes report
    // together) are applied to the site's saga in one write (`Orchestrator::on_event`).
    .max_attempts(options.max_attempts);
    let rollouts = ConsumerSpec::new(
        names::EVENTS_STREAM,
        names::ORCHESTRATOR_ROLLOUTS,
        vec![pb::SitePatched::filter()],
        RejectAs::Message { consumer: names::ORCHESTRATOR_ROLLOUTS.to_string() },
    )
    // Reports are handled side by side; those of one rollout are counted together in one
    // write (see `Rollouts::count`).
    .concurrency(512)
    .max_attempts(options.max_attempts);
    let ticks = tokio::spawn(tick_rollouts(orchestrator.clone(), shutdown.clone()));
    let store =
        tokio::spawn(crate::store_watch::run_store_watch(bus.clone(), crate::store_watch::EVERY, shutdown.clone()));
    let compaction = tokio::spawn(super::compact::compact_periodically(orchestrator.clone(), shutdown.clone()));
    let stranded = tokio::spawn(super::stranded::sweep_periodically(bus.clone(), shutdown.clone()));
    let durables = tokio::spawn(super::durables::keep_made(bus.clone(), orchestrator.sites.clone(), shutdown.clone()));
    let dispatcher = (bus.job_delivery() == runtime::JobDelivery::Dispatch).then(|| {
        let run = runtime::dispatch::run_dispatcher(bus.clone(), orchestrator.sites.clone(), shutdown.clone());
        tokio::spawn(async move {
            if let Err(e) = run.await {
                warn!(error = %runtime::error_chain(&e), "the dispatcher stopped");
            }
        })
    });
    let c = runtime::consume(bus.clone(), commands, Arc::new(Commands(orchestrator.clone())), shutdown.clone());
    let e = runtime::consume(bus.clone(), events, Arc::new(Events(orchestrator.clone())), shutdown.clone());
    let r = runtime::consume(bus, rollouts, Arc::new(RolloutEvents(orchestrator)), shutdown);
    let (c, e, r) = tokio::join!(c, e, r);
    if let Err(err) = &c {
        warn!(error = %err, "command consumer stopped");
    }
    let _ = ticks.await;
    let _ = store.await;
    let _ = compaction.await;
    let _ = stranded.await;
    let _ = durables.await;
    if let Some(dispatcher) = dispatcher {
        let _ = dispatcher.await;
    }
    c?;
    e?;
    r?;
    Ok(())
}
