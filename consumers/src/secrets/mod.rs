//! Secrets: sealed at rest, opened only by the services that hold the key ring.
//!
//! - [`sealing`]: XChaCha20-Poly1305 under a key from a [`KeyProvider`] (a [`KeyRing`]);
//! - [`pkcs11`]: a key ring whose keys are wrapped under a key-encryption key in a PKCS#11 token
//!   ([`softhsm`]: a SoftHSM2 of one's own, for its tests);
//! - [`records`]: the sealed records (what each is bound to, the keys they need) and the key
//!   check both services run before they start;
//! - [`kubeconfig`]: the kubeconfig collector (on `ClusterReady`, ask the gateway, seal, store);
//! - [`service`]: kubeconfigs and BMC credentials by request/reply, and key rotation;
//! - [`run_secrets`]: the collector and the service together under one key ring.
//!
//! The collector and the service know nothing of each other: both use [`records`] and
//! [`sealing`], and only [`run_secrets`] starts both.

use std::sync::Arc;

use bus_schema::runtime::Bus;
use tokio_util::sync::CancellationToken;

pub mod kubeconfig;
pub mod pkcs11;
pub mod records;
pub mod sealing;
pub mod service;
pub mod softhsm;

pub use sealing::{ALGORITHM, KeyProvider, KeyRing, SecretError, StaticKey, open, seal};

/// The kubeconfig collector and the secrets service under one key ring, until `shutdown`
/// (`landfall serve kubeconfig`, `landfall up`). When one of them stops with an error, the
/// other is stopped too.
///
/// # Errors
/// The first error of either.
pub async fn run_secrets(bus: Bus, keys: Arc<KeyRing>, shutdown: CancellationToken) -> anyhow::Result<()> {
    let stop = shutdown.child_token();
    let stopping = |r: anyhow::Result<()>| {
        if r.is_err() {
            stop.cancel();
        }
        r
    };
    let provider: Arc<dyn KeyProvider> = keys.clone();
    let (collected, served) = tokio::join!(
        async { stopping(kubeconfig::run_kubeconfig(bus.clone(), provider, stop.clone()).await) },
        async { stopping(service::run_secrets_service(bus.clone(), keys, stop.clone()).await) },
    );
    collected.and(served)
}
