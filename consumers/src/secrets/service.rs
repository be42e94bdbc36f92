//! The secrets service: core-NATS request/reply (queue group [`names::SECRETS_GROUP`]) over
//! the sealed records of `landfall-kubeconfigs`.
//!
//! - `landfall.admin.kubeconfig_get`: a site's kubeconfig, opened;
//! - `landfall.admin.bmc_credentials_put`: seal and store a host's BMC credentials;
//! - `landfall.svc.<site>.bmc_credentials`: a gateway's request for a host's credentials,
//!   answered only for the provision job an install or join saga sent that site for that
//!   host, while the host is being provisioned;
//! - `landfall.admin.rotate_key`: seal every record again under a new key, then retire the old.
//!
//! Secrets travel only in request and reply bodies, never in a stream, a log line, an event or
//! an error. A record sealed under a key the ring does not hold stops the service from
//! starting, and stops a rotation before it writes anything.

use std::sync::Arc;

use async_nats::HeaderMap;
use bus_schema::domain::{InvalidField, NodeName, SiteId};
use bus_schema::ids;
use bus_schema::names::{self, keys};
use bus_schema::pb::{self, BusMessage};
use bus_schema::runtime::{self, Bus, BusError, Envelope, Kv, Reply, Update};
use prost::Message;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::records::{
    bmc_purpose, check_keys, keys_missing, kubeconfig_purpose, missing, purpose_of, sealed_key_ids, sealed_records,
};
use super::sealing::{self, KeyProvider, KeyRing, SecretError};
use crate::failpoint;
use crate::saga;

/// How a refusal of a BMC credentials request for a host with none stored starts; gateways
/// read it as "no credentials" rather than as a failure.
pub const NO_BMC_CREDENTIALS: &str = "no BMC credentials stored";
/// How a refusal of a BMC credentials request starts when no job the hub sent drives that
/// host's BMC now (a job redelivered after its saga ended needs none, since the backend finds
/// the host done). Gateways go on without credentials.
pub const NO_BMC_JOB: &str = "no job drives the BMCs of site";
/// How many passes over the bucket a rotation makes before it gives up on records that keep
/// being written under an old key.
const ROTATION_PASSES: usize = 5;
/// Requests of one kind answered at once by one replica.
const CONCURRENCY: usize = 32;
const MAX_USERNAME: usize = 256;
const MAX_PASSWORD: usize = 1024;

/// Why a request was not answered. The text goes back in the error header: it names what
/// was wrong and never carries a secret.
#[derive(Debug, thiserror::Error)]
enum RequestError {
    /// The request is fine, and the answer is "none": expected, not worth a warning.
    #[error("{0}")]
    Declined(String),
    #[error("{0}")]
    Refused(String),
    /// A field of the request is not valid.
    #[error(transparent)]
    Field(#[from] InvalidField),
    /// The request is not the message asked for, or one of its fields is not valid.
    #[error("{what}")]
    Invalid {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("{what}")]
    Secret {
        what: String,
        #[source]
        source: SecretError,
    },
    #[error(transparent)]
    Bus(#[from] BusError),
}

impl RequestError {
    fn secret(what: impl Into<String>) -> impl FnOnce(SecretError) -> Self {
        let what = what.into();
        move |source| RequestError::Secret { what, source }
    }

    fn invalid(what: impl Into<String>, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        RequestError::Invalid { what: what.into(), source: Box::new(source) }
    }

    /// The message with its causes, as the reply header carries it.
    fn text(&self) -> String {
        runtime::error_chain(self)
    }
}

fn refused(reason: impl Into<String>) -> RequestError {
    RequestError::Refused(reason.into())
}

fn decode<M: BusMessage>(payload: &[u8]) -> Result<M, RequestError> {
    M::decode(payload).map_err(|e| RequestError::invalid(format!("not a {}", M::TYPE), e))
}

fn site_id(s: String) -> Result<SiteId, RequestError> {
    Ok(SiteId::try_from(s)?)
}

fn node_name(s: String) -> Result<NodeName, RequestError> {
    NodeName::try_from(s).map_err(|e| RequestError::invalid("node", e))
}

/// The request kinds the service answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    KubeconfigGet,
    BmcPut,
    BmcGet,
    RotateKey,
}

struct SecretsService {
    bus: Bus,
    store: Kv,
    sites: Kv,
    sagas: Kv,
    keys: Arc<KeyRing>,
    /// One rotation at a time in this process.
    rotation: tokio::sync::Mutex<()>,
}

impl SecretsService {
    /// The answer to one request: the body, or the reason in the error header.
    async fn reply(&self, kind: Kind, subject: &str, payload: &[u8]) -> Reply {
        match self.answer(kind, subject, payload).await {
            Ok(body) => (HeaderMap::new(), body.into()),
            Err(e) => {
                let text = e.text();
                if let RequestError::Declined(_) = e {
                    debug!(%subject, reason = %text, "secrets request declined");
                } else {
                    warn!(%subject, reason = %text, "secrets request refused");
                }
                runtime::error_reply(&text)
            }
        }
    }

    async fn answer(&self, kind: Kind, subject: &str, payload: &[u8]) -> Result<Vec<u8>, RequestError> {
        Ok(match kind {
            Kind::KubeconfigGet => self.kubeconfig_get(payload).await?,
            Kind::BmcPut => self.bmc_put(payload).await?.encode_to_vec(),
            Kind::BmcGet => self.bmc_get(subject, payload).await?.encode_to_vec(),
            Kind::RotateKey => self.rotate(payload).await?.encode_to_vec(),
        })
    }

    async fn kubeconfig_get(&self, payload: &[u8]) -> Result<Vec<u8>, RequestError> {
        let req: pb::KubeconfigGet = decode(payload)?;
        let site = site_id(req.site_id)?;
        let Some((sealed, _)) = self.store.get::<pb::SealedSecret>(&keys::kubeconfig(site.as_str())).await? else {
            return Err(refused(format!("no kubeconfig stored for site {site}")));
        };
        let what = format!("open the kubeconfig of site {site} (sealed under key {})", sealed.key_id);
        let kubeconfig = sealing::open(self.keys.as_ref(), &kubeconfig_purpose(site.as_str()), &sealed)
            .map_err(RequestError::secret(what))?;
        info!(%site, key_id = %sealed.key_id, "kubeconfig read");
        // The reply carries a copy; this one is zeroed when dropped.
        Ok(kubeconfig.to_vec())
    }

    async fn bmc_put(&self, payload: &[u8]) -> Result<pb::SecretStored, RequestError> {
        let req: pb::PutBmcCredentials = decode(payload)?;
        let site = site_id(req.site_id)?;
        let node = node_name(req.node)?;
        let creds = req.credentials.ok_or_else(|| refused("credentials are missing"))?;
        if creds.username.is_empty() || creds.username.len() > MAX_USERNAME {
            return Err(refused(format!("credentials.username must be 1 to {MAX_USERNAME} bytes")));
        }
        if creds.password.is_empty() || creds.password.len() > MAX_PASSWORD {
            return Err(refused(format!("credentials.password must be 1 to {MAX_PASSWORD} bytes")));
        }
        if self.sites.get::<pb::SiteDesign>(&keys::site(site.as_str())).await?.is_none() {
            return Err(refused(format!("site {site} is not registered")));
        }
        let plain = creds.encode_to_vec();
        drop(creds);
        let sealed = sealing::seal(self.keys.as_ref(), &bmc_purpose(site.as_str(), node.as_str()), &plain)
            .map_err(RequestError::secret("seal the BMC credentials"))?;
        drop(plain);
        let revision = self.store.put(&keys::bmc_credentials(site.as_str(), node.as_str()), &sealed).await?;
        info!(%site, %node, key_id = %sealed.key_id, revision, "bmc credentials stored");
        let evt = pb::BmcCredentialsStored {
            site_id: site.to_string(),
            node: node.to_string(),
            key_id: sealed.key_id.clone(),
        };
        self.bus.publish_event(&evt, &Envelope::root()).await?;
        Ok(pb::SecretStored { key_id: sealed.key_id, revision })
    }

    async fn bmc_get(&self, subject: &str, payload: &[u8]) -> Result<pb::BmcCredentials, RequestError> {
        // landfall.svc.<site>.bmc_credentials: the subject says which site asks (and what its
        // credentials on the bus allow it to ask for).
        let req: pb::BmcCredentialsRequest = bus_schema::trust::decode_request(subject, payload).map_err(refused)?;
        let site = site_id(req.site_id)?;
        let node = node_name(req.node)?;
        let Some((design, _)) = self.sites.get::<pb::SiteDesign>(&keys::site(site.as_str())).await? else {
            return Err(refused(format!("site {site} is not registered")));
        };
        if !design.nodes.iter().any(|n| n.name == node.as_str()) {
            return Err(refused(format!("node {node} is not in the design of site {site}")));
        }
        // Only for the job that drives this host's BMC, while it does.
        let saga = match req.correlation_id.as_str() {
            "" => None,
            id => self.sagas.get::<pb::InstallSaga>(&keys::saga(id)).await?,
        };
        let grant = match saga {
            Some((saga, _)) => saga::bmc_grant(&saga, site.as_str(), node.as_str(), &req.job_id),
            None => Err(format!("no install or join saga {:?}", req.correlation_id)),
        };
        if let Err(why) = grant {
            return Err(RequestError::Declined(format!("{NO_BMC_JOB} {site} for node {node}: {why}")));
        }
        let Some((sealed, _)) =
            self.store.get::<pb::SealedSecret>(&keys::bmc_credentials(site.as_str(), node.as_str())).await?
        else {
            return Err(RequestError::Declined(format!("{NO_BMC_CREDENTIALS} for node {node} of site {site}")));
        };
        let what =
            format!("open the BMC credentials of node {node} of site {site} (sealed under key {})", sealed.key_id);
        let plain = sealing::open(self.keys.as_ref(), &bmc_purpose(site.as_str(), node.as_str()), &sealed)
            .map_err(RequestError::secret(what))?;
        let creds = pb::BmcCredentials::decode(plain.as_slice())
            .map_err(|_| refused(format!("the BMC credentials of node {node} of site {site} do not decode")))?;
        info!(%site, %node, job_id = %req.job_id, "bmc credentials handed to the gateway");
        Ok(creds)
    }

    async fn rotate(&self, payload: &[u8]) -> Result<pb::KeyRotated, RequestError> {
        let _: pb::RotateKey = decode(payload)?;
        let _one = self.rotation.lock().await;
        let keys = self.keys.as_ref();
        if keys.path().is_none() {
            return Err(RequestError::Secret {
                what: "rotate the data key".into(),
                source: SecretError::RotationNeedsFile { from: keys.source() },
            });
        }
        keys.reload().map_err(RequestError::secret("read the key file"))?;
        // Every record must open before anything is written.
        let sealed = sealed_key_ids(&self.store).await?;
        let missing = missing(&sealed, keys);
        if !missing.is_empty() {
            return Err(refused(format!("rotation refused, nothing written: {}", keys_missing(&missing, keys))));
        }
        let held = keys.key_ids();
        let new = if held.len() > 1 {
            // An earlier rotation stopped midway: its key seals, the others still open. Finish it.
            info!(key_id = %held[0], "finishing an earlier rotation");
            held[0].clone()
        } else {
            keys.rotate().map_err(RequestError::secret("add a new data key"))?
        };
        failpoint::hit("rotate_key_added");

        let mut resealed = 0u32;
        for pass in 0.. {
            let pending: Vec<String> = sealed_records(&self.store)
                .await?
                .into_iter()
                .filter(|(_, s, _)| s.key_id != new)
                .map(|(k, _, _)| k)
                .collect();
            if pending.is_empty() {
                break;
            }
            if pass == ROTATION_PASSES {
                return Err(refused(format!(
                    "{} record(s) keep being written under an old key; both keys stay in the key file: run the rotation again",
                    pending.len()
                )));
            }
            for key in pending {
                if self.reseal(&key, &new).await? {
                    resealed += 1;
                    failpoint::hit("rotate_resealed_one");
                }
            }
        }
        let retired = keys.retire(&new).map_err(RequestError::secret("retire the old data keys"))?.join(", ");
        info!(%retired, key_id = %new, records = resealed, "data key rotated");
        let evt = pb::SecretKeyRotated { retired_key_id: retired.clone(), key_id: new.clone(), records: resealed };
        let envelope = Envelope::root_with_id(ids::derived_id(&new, "secret_key_rotated", None));
        self.bus.publish_event(&evt, &envelope).await?;
        Ok(pb::KeyRotated { retired_key_id: retired, key_id: new, records: resealed })
    }

    /// Seals one record again under `new` (compare-and-set; a record someone wrote meanwhile
    /// is read again). `false` when it needed nothing.
    async fn reseal(&self, key: &str, new: &str) -> Result<bool, RequestError> {
        let purpose = purpose_of(key).ok_or_else(|| refused(format!("{key} is not a record landfall seals")))?;
        let resealed = self
            .store
            .update_with(key, |sealed: Option<&pb::SealedSecret>| match sealed {
                None => Update::Keep(Ok(false)),
                Some(sealed) if sealed.key_id == new => Update::Keep(Ok(false)),
                Some(sealed) => match self.seal_again(key, &purpose, sealed, new) {
                    Ok(again) => Update::Put(again, Ok(true)),
                    Err(e) => Update::Abort(Err(e)),
                },
            })
            .await;
        match resealed {
            Ok(resealed) => resealed,
            Err(BusError::KeptChanging { .. }) => {
                Err(refused(format!("{key} kept changing while it was sealed again")))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// `sealed` opened and sealed again, under `new`; no I/O.
    fn seal_again(
        &self,
        key: &str,
        purpose: &str,
        sealed: &pb::SealedSecret,
        new: &str,
    ) -> Result<pb::SealedSecret, RequestError> {
        let plain = sealing::open(self.keys.as_ref(), purpose, sealed)
            .map_err(RequestError::secret(format!("open {key} (sealed under key {})", sealed.key_id)))?;
        let again = sealing::seal(self.keys.as_ref(), purpose, &plain)
            .map_err(RequestError::secret(format!("seal {key} again")))?;
        drop(plain);
        if again.key_id != new {
            return Err(refused(format!(
                "the key file changed during the rotation (key {} seals now, not {new}): run the rotation again",
                again.key_id
            )));
        }
        Ok(again)
    }
}

/// Answers the secrets requests until `shutdown`, after checking that `keys` opens every sealed
/// record (see [`check_keys`]). Requests are answered concurrently; rotations one at a time in
/// a process (replicas sharing a key file should not rotate at once).
///
/// # Errors
/// [`StartupError`](super::records::StartupError) when a record needs a key the ring lacks;
/// bus errors when subscribing.
pub async fn run_secrets_service(bus: Bus, keys: Arc<KeyRing>, shutdown: CancellationToken) -> anyhow::Result<()> {
    check_keys(&bus, keys.as_ref()).await?;
    let service = Arc::new(SecretsService {
        store: bus.kv(names::KUBECONFIGS_BUCKET).await?,
        sites: bus.kv(names::SITES_BUCKET).await?,
        sagas: bus.kv(names::SAGAS_BUCKET).await?,
        bus: bus.clone(),
        keys,
        rotation: tokio::sync::Mutex::new(()),
    });
    info!(key_id = %service.keys.current_id(), "secrets service ready");
    let serve = |kind: Kind, subject: String| {
        let service = service.clone();
        runtime::serve_requests(
            &bus,
            subject,
            names::SECRETS_GROUP,
            CONCURRENCY,
            shutdown.clone(),
            move |subject, payload| {
                let service = service.clone();
                async move { service.reply(kind, &subject, &payload).await }
            },
        )
    };
    tokio::try_join!(
        serve(Kind::KubeconfigGet, names::KUBECONFIG_GET_ADMIN.to_string()),
        serve(Kind::BmcPut, names::BMC_CREDENTIALS_PUT_ADMIN.to_string()),
        serve(Kind::BmcGet, names::svc_every_site(names::BMC_CREDENTIALS)),
        serve(Kind::RotateKey, names::ROTATE_KEY_ADMIN.to_string()),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_carry_their_causes_but_no_secret() {
        let e = RequestError::secret("open the kubeconfig of site edge-01 (sealed under key abcd)")(
            SecretError::UnknownKey { wanted: "abcd".into(), held: "ef01".into(), from: "key file /k".into() },
        );
        let text = e.text();
        assert!(text.contains("sealed under key abcd") && text.contains("key file /k does not hold"), "{text}");
        assert!(refused(format!("{NO_BMC_CREDENTIALS} for node n of site s")).text().starts_with(NO_BMC_CREDENTIALS));
    }
}
