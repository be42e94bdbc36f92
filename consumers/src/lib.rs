//! Independent consumers of the landfall bus.
//!
//! - [`orchestrator`]: runs InstallSite sagas (state in KV, advanced with compare-and-set).
//! - [`kubeconfig`]: collects each site's kubeconfig and stores it sealed.
//! - [`saga`]: the pure decision logic the orchestrator executes.
//! - [`secrets`]: AEAD sealing under a key from a [`secrets::KeyProvider`].

pub mod failpoint;
pub mod kubeconfig;
pub mod orchestrator;
pub mod saga;
pub mod secrets;

pub use kubeconfig::run_kubeconfig;
pub use orchestrator::run_orchestrator;
