//! Independent consumers of the landfall bus.
//!
//! - [`orchestrator`]: runs InstallSite sagas (state in KV, advanced with compare-and-set).
//! - [`observer`]: keeps `landfall-observed` (what each node runs) from what gateways report.
//! - [`kubeconfig`]: collects each site's kubeconfig and stores it sealed.
//! - [`distribution`]: sends artifacts from the [`artifacts`] store to site gateways.
//! - [`saga`]: the pure decision logic the orchestrator executes.
//! - [`secrets`]: AEAD sealing under a key from a [`secrets::KeyProvider`] (a [`secrets::KeyRing`]).
//! - [`secrets_service`]: kubeconfigs and BMC credentials by request/reply, and key rotation.

pub mod artifacts;
mod clock;
mod decision;
pub mod distribution;
pub mod failpoint;
pub mod kubeconfig;
pub mod lease;
pub mod observer;
pub mod orchestrator;
pub mod rollout;
pub mod saga;
pub mod secrets;
pub mod secrets_service;

pub use distribution::run_distribution;
pub use kubeconfig::run_kubeconfig;
pub use observer::run_observer;
pub use orchestrator::run_orchestrator;
pub use secrets_service::run_secrets_service;
