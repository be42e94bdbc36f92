//! Kubeconfig collection: on `ClusterReady`, ask the site's gateway for the application
//! cluster's kubeconfig (core request/reply, never stored in a stream), seal it, store only
//! the ciphertext in KV, and publish `KubeconfigStored`, which carries no secret. On
//! `SiteRemoved`, the site's sealed kubeconfig and BMC credentials are purged.

use std::sync::Arc;
use std::time::Duration;

use bus_schema::names::{self, keys};
use bus_schema::pb::{self, BusEvent, BusMessage};
use bus_schema::runtime::{self, Bus, ConsumerSpec, Delivery, HandlerError, Kv, RejectAs, RequestError};
use prost::Message;
use tokio_util::sync::CancellationToken;
use tracing::info;

use super::records::{check_keys, kubeconfig_purpose};
use super::sealing::{self, KeyProvider};

pub struct KubeconfigCollector {
    bus: Bus,
    store: Kv,
    keys: Arc<dyn KeyProvider>,
}

impl KubeconfigCollector {
    pub async fn new(bus: Bus, keys: Arc<dyn KeyProvider>) -> Result<Self, runtime::BusError> {
        Ok(Self { store: bus.kv(names::KUBECONFIGS_BUCKET).await?, bus, keys })
    }

    async fn fetch(&self, site: &str) -> Result<Vec<u8>, HandlerError> {
        let request = pb::KubeconfigRequest { site_id: site.to_string() }.encode_to_vec();
        let (_, kubeconfig) = self
            .bus
            .request_site(site, names::kubeconfig_rpc(site), request.into(), Duration::from_secs(15))
            .await
            .map_err(|e| {
                let context = match &e {
                    RequestError::TimedOut { .. } => format!("gateway of {site} did not answer the kubeconfig request"),
                    RequestError::Refused { .. } => format!("gateway of {site}"),
                    _ => format!("kubeconfig request to {site}"),
                };
                HandlerError::transient(context, e)
            })?;
        if kubeconfig.is_empty() {
            return Err(HandlerError::transient_reason(format!("gateway of {site} sent an empty kubeconfig")));
        }
        Ok(kubeconfig.to_vec())
    }
}

impl KubeconfigCollector {
    /// Purges the sealed secrets of a removed site: its kubeconfig and its hosts' credentials.
    async fn site_removed(&self, d: &Delivery) -> Result<(), HandlerError> {
        let removed: pb::SiteRemoved = d.decode()?;
        let site = removed.site_id;
        self.store.purge(&keys::kubeconfig(&site)).await?;
        let bmc = self.store.scan_few::<pb::SealedSecret>(&keys::bmc_credentials(&site, "")).await?;
        for (key, _, _) in &bmc {
            self.store.purge(key).await?;
        }
        info!(%site, bmc = bmc.len(), "sealed secrets of a removed site purged");
        Ok(())
    }
}

impl runtime::Handler for KubeconfigCollector {
    async fn handle(&self, d: &Delivery) -> Result<(), HandlerError> {
        if d.type_name == pb::SiteRemoved::TYPE {
            return self.site_removed(d).await;
        }
        let ready: pb::ClusterReady = d.decode()?;
        let site = bus_schema::domain::SiteId::try_from(ready.site_id)
            .map_err(|e| HandlerError::reject(pb::RejectCode::Invalid, e.to_string()))?
            .to_string();
        let kubeconfig = self.fetch(&site).await?;
        let sealed = sealing::seal(self.keys.as_ref(), &kubeconfig_purpose(&site), &kubeconfig)
            .map_err(|e| HandlerError::transient(format!("sealing the kubeconfig of {site}"), e))?;
        drop(kubeconfig);
        let revision = self.store.put(&keys::kubeconfig(&site), &sealed).await?;
        info!(%site, key_id = %sealed.key_id, revision, "kubeconfig stored");
        let evt = pb::KubeconfigStored { site_id: site, key_id: sealed.key_id, revision };
        self.bus.publish_event(&evt, &d.envelope.derive("kubeconfig_stored", None)).await?;
        Ok(())
    }
}

/// Reads and opens a site's stored kubeconfig (zeroed when dropped).
pub async fn read_kubeconfig(
    bus: &Bus,
    keys: &dyn KeyProvider,
    site: &str,
) -> anyhow::Result<Option<zeroize::Zeroizing<Vec<u8>>>> {
    let store = bus.kv(names::KUBECONFIGS_BUCKET).await?;
    let Some((sealed, _)) = store.get::<pb::SealedSecret>(&keys::kubeconfig(site)).await? else {
        return Ok(None);
    };
    Ok(Some(sealing::open(keys, &kubeconfig_purpose(site), &sealed)?))
}

/// Runs the kubeconfig consumer until `shutdown`. It does not start when a stored record was
/// sealed under a key `keys` does not hold (see [`check_keys`]): a
/// collector with the wrong key would go on sealing under it.
pub async fn run_kubeconfig(bus: Bus, keys: Arc<dyn KeyProvider>, shutdown: CancellationToken) -> anyhow::Result<()> {
    check_keys(&bus, keys.as_ref()).await?;
    let collector = Arc::new(KubeconfigCollector::new(bus.clone(), keys).await?);
    let spec = ConsumerSpec::new(
        names::EVENTS_STREAM,
        names::KUBECONFIG_EVENTS,
        vec![pb::ClusterReady::filter(), pb::SiteRemoved::filter()],
        RejectAs::Message { consumer: names::KUBECONFIG_EVENTS.to_string() },
    );
    runtime::consume(bus, spec, collector, shutdown).await?;
    Ok(())
}
