//! Independent consumers of the landfall bus.
//!
//! - [`orchestrator`]: commands in, install sagas advanced in KV, jobs and events out; it runs
//!   the rollouts too.
//! - [`saga`]: the install saga's decisions, pure; the orchestrator executes them.
//! - [`rollout`]: rollouts of a package across sites, as pure decisions and their executor.
//! - [`compaction`]: what is kept of a finished saga or rollout after the retention (pure).
//! - [`lease`]: the site lease an install, a join, a rollout or a node or site operation holds while it works on a site.
//! - [`lifecycle`]: node removal, node reprovision and site decommission, as pure decisions.
//! - [`observer`]: keeps `landfall-observed` (what each node runs) from what gateways report.
//! - [`distribution`]: the [`artifacts`] store and the service that sends its bytes to gateways.
//! - [`secrets`]: sealing under a key ring, the [`kubeconfig`] collector, and the secrets
//!   service (kubeconfigs and BMC credentials by request/reply, key rotation).
//! - [`failpoint`]: named crash points for fault tests.
//!
//! `artifacts`, `kubeconfig` and `secrets_service` keep the paths callers have always used.

mod active;
mod answers;
mod clock;
pub use clock::WindowClock;
pub mod compaction;
mod decision;
pub mod distribution;
pub mod failpoint;
mod group_commit;
pub mod helm;
pub mod identity;
pub mod lease;
pub mod lifecycle;
pub mod links;
pub mod observer;
pub mod orchestrator;
pub mod rollout;
pub mod saga;
pub mod secrets;
pub mod store_watch;

pub use decision::outgoing;
pub use distribution::{artifacts, run_distribution};
pub use observer::{run_observer, run_observer_with};
pub use orchestrator::{
    OrchestratorOptions, make_missing_durables, redeliver_stranded_jobs, run_orchestrator, run_orchestrator_with,
};
pub use secrets::kubeconfig::{self, run_kubeconfig};
pub use secrets::service::run_secrets_service;

/// The secrets service and its startup, by the path callers have always used.
pub mod secrets_service {
    pub use crate::secrets::records::{
        KeySource, MissingKeys, StartupError, bmc_purpose, check_keys, open_key_ring, sealed_key_ids,
    };
    pub use crate::secrets::run_secrets;
    pub use crate::secrets::service::{NO_BMC_CREDENTIALS, NO_BMC_JOB, run_secrets_service};
}
