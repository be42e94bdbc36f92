//! Independent consumers of the landfall bus.
//!
//! - [`orchestrator`]: runs InstallSite sagas (state in KV, advanced with compare-and-set).
//! - [`observer`]: keeps `landfall-observed` (what each node runs) from what gateways report.
//! - [`kubeconfig`]: collects each site's kubeconfig and stores it sealed.
//! - [`distribution`]: sends artifacts from the [`artifacts`] store to site gateways.
//! - [`saga`]: the pure decision logic the orchestrator executes.
//! - [`secrets`]: AEAD sealing under a key from a [`secrets::KeyProvider`] (a [`secrets::KeyRing`]).
//! - [`secrets_service`]: kubeconfigs and BMC credentials by request/reply, and key rotation.

mod clock;
mod decision;
pub mod distribution;
pub mod failpoint;
pub mod lease;
pub mod observer;
pub mod orchestrator;
pub mod rollout;
pub mod saga;
pub mod secrets;

pub use distribution::{artifacts, run_distribution};
pub use observer::run_observer;
pub use orchestrator::run_orchestrator;
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
