//! The orchestrator's shared state: the bus, the KV buckets it reads and writes, and the
//! rollouts it carries out; and what its handlers share (the lease retry, the invalid-field refusal).

use std::time::Duration;

use bus_schema::domain::InvalidField;
use bus_schema::names;
use bus_schema::pb;
use bus_schema::retention::StorePolicy;
use bus_schema::runtime::{self, Bus, HandlerError, Kv};

use super::ledger::Ledger;
use crate::rollout::Rollouts;

/// How long a command for a site that is busy with another saga waits before it is tried again.
pub(super) const LEASE_RETRY: Duration = Duration::from_secs(1);

pub(super) fn invalid(e: InvalidField) -> HandlerError {
    HandlerError::reject(pb::RejectCode::Invalid, e.to_string())
}

/// Shared state of the orchestrator's consumers.
pub struct Orchestrator {
    pub(super) bus: Bus,
    pub(super) sites: Kv,
    pub(super) packages: Kv,
    pub(super) sagas: Kv,
    pub(super) observed: Kv,
    /// Every command carried out or refused, by id.
    pub(super) ledger: Ledger,
    pub rollouts: Rollouts,
    /// What is kept, and for how long.
    pub(super) policy: StorePolicy,
    /// Events waiting for the write that applies them to their saga, by saga key.
    pub(super) saga_batches: super::install::SagaBatches,
}

/// This replica's name: its host (a pod's name), process id, and which orchestrator of the
/// process it is (tests run several in one).
fn replica_name() -> String {
    static STARTED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok().map(|h| h.trim().to_string()))
        .unwrap_or_else(|| "localhost".into());
    let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{host}/{}/{n}", std::process::id())
}

impl Orchestrator {
    pub async fn new(bus: Bus, policy: StorePolicy) -> Result<Self, runtime::BusError> {
        Ok(Self {
            policy,
            sites: bus.kv(names::SITES_BUCKET).await?,
            packages: bus.kv(names::PACKAGES_BUCKET).await?,
            sagas: bus.kv(names::SAGAS_BUCKET).await?,
            observed: bus.kv(names::OBSERVED_BUCKET).await?,
            ledger: Ledger { kv: bus.kv(names::LEDGER_BUCKET).await?, replica: replica_name() },
            rollouts: Rollouts::new(bus.clone()).await?,
            saga_batches: Default::default(),
            bus,
        })
    }
}
