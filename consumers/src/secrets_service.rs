//! The secrets service: core-NATS request/reply (queue group [`names::SECRETS_GROUP`]) over
//! the sealed records of `landfall-kubeconfigs`.
//!
//! - `landfall.admin.kubeconfig_get`: a site's kubeconfig, opened;
//! - `landfall.admin.bmc_credentials_put`: seal and store a host's BMC credentials;
//! - `landfall.svc.<site>.bmc_credentials`: a gateway's request for a host's credentials,
//!   answered only while the site's lease is held (an install or join drives its BMCs);
//! - `landfall.admin.rotate_key`: seal every record again under a new key, then retire the old.
//!
//! Secrets travel only in request and reply bodies, never in a stream, a log line, an event or
//! an error. A record sealed under a key the ring does not hold stops the service from
//! starting, and stops a rotation before it writes anything.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use async_nats::HeaderMap;
use bus_schema::domain::{NodeName, SiteId};
use bus_schema::ids;
use bus_schema::names::{self, keys};
use bus_schema::pb::{self, BusMessage};
use bus_schema::runtime::{self, Bus, BusError, Cas, Envelope, Kv, Reply};
use prost::Message;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::failpoint;
use crate::kubeconfig;
use crate::lease;
use crate::secrets::{self, KeyProvider, KeyRing, SecretError};

/// How a refusal of a BMC credentials request for a host with none stored starts; gateways
/// read it as "no credentials" rather than as a failure.
pub const NO_BMC_CREDENTIALS: &str = "no BMC credentials stored";
/// How a refusal of a BMC credentials request starts when the site's lease is not held: no
/// job of the site drives a BMC now (a job redelivered after its saga ended needs none, since
/// the backend finds the host done). Gateways go on without credentials.
pub const NO_BMC_JOB: &str = "no job drives the BMCs of site";
/// How many compare-and-set races on one record a rotation retries.
const CAS_ATTEMPTS: usize = 64;
/// How many passes over the bucket a rotation makes before it gives up on records that keep
/// being written under an old key.
const ROTATION_PASSES: usize = 5;
/// Requests of one kind answered at once by one replica.
const CONCURRENCY: usize = 32;
const MAX_USERNAME: usize = 256;
const MAX_PASSWORD: usize = 1024;

/// What a host's sealed BMC credentials are bound to.
pub fn bmc_purpose(site: &str, node: &str) -> String {
    format!("bmc/{site}/{node}")
}

/// The purpose a record of the sealed-secrets bucket is bound to, from its key.
fn purpose_of(key: &str) -> Option<String> {
    if let Some(site) = key.strip_prefix(keys::KUBECONFIG_PREFIX) {
        return Some(kubeconfig::purpose(site));
    }
    let (site, node) = key.strip_prefix(keys::BMC_PREFIX)?.split_once('.')?;
    Some(bmc_purpose(site, node))
}

/// Sealed records that need keys a key provider does not hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingKeys {
    /// How many records.
    pub records: usize,
    /// The ids of the keys they need.
    pub needed: Vec<String>,
    /// Where the provider's keys come from, and the ids it holds.
    pub from: String,
    pub held: Vec<String>,
}

impl std::fmt::Display for MissingKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} sealed record(s) in {} need key(s) {}, which {} does not hold (it holds {})",
            self.records,
            names::KUBECONFIGS_BUCKET,
            self.needed.join(", "),
            self.from,
            self.held.join(", ")
        )
    }
}

/// Why the secrets service (or the kubeconfig collector) does not start.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error("{0}: start with the key file they were sealed under")]
    KeysMissing(MissingKeys),
    #[error("load the data key")]
    Key(#[from] SecretError),
    #[error("read the sealed records")]
    Bus(#[from] BusError),
}

/// Where the key ring comes from.
#[derive(Debug, Clone)]
pub enum KeySource {
    /// A key file that must exist.
    File(PathBuf),
    /// A key file created with a fresh key when neither it nor any sealed record exists
    /// (`landfall up`).
    CreateFile(PathBuf),
    /// One key, as hex, from `from` (an environment variable): it opens and seals, but does
    /// not rotate.
    Hex { hex: String, from: String },
}

/// How many sealed records each key id sealed.
pub async fn sealed_key_ids(store: &Kv) -> Result<BTreeMap<String, usize>, BusError> {
    let mut ids = BTreeMap::new();
    for (_, sealed, _) in sealed_records(store).await? {
        *ids.entry(sealed.key_id).or_default() += 1;
    }
    Ok(ids)
}

/// Every sealed record (kubeconfigs and BMC credentials), by key, with its revision.
async fn sealed_records(store: &Kv) -> Result<Vec<(String, pb::SealedSecret, u64)>, BusError> {
    let mut all = store.scan::<pb::SealedSecret>(keys::KUBECONFIG_PREFIX).await?;
    all.extend(store.scan::<pb::SealedSecret>(keys::BMC_PREFIX).await?);
    Ok(all)
}

/// The key ids of `sealed` that `keys` does not hold, with how many records need them.
fn missing(sealed: &BTreeMap<String, usize>, keys: &dyn KeyProvider) -> BTreeMap<String, usize> {
    sealed.iter().filter(|(id, _)| keys.get(id).is_err()).map(|(id, n)| (id.clone(), *n)).collect()
}

fn keys_missing(missing: &BTreeMap<String, usize>, keys: &dyn KeyProvider) -> MissingKeys {
    MissingKeys {
        records: missing.values().sum(),
        needed: missing.keys().cloned().collect(),
        from: keys.source(),
        held: keys.key_ids(),
    }
}

/// Checks that `keys` opens every sealed record in store: a service started with the wrong key
/// would seal new records under it and answer nothing it holds, so it does not start.
///
/// # Errors
/// [`StartupError::KeysMissing`] naming the key ids, how many records need them, and the key
/// source.
pub async fn check_keys(bus: &Bus, keys: &dyn KeyProvider) -> Result<(), StartupError> {
    let store = bus.kv(names::KUBECONFIGS_BUCKET).await?;
    let missing = missing(&sealed_key_ids(&store).await?, keys);
    if missing.is_empty() { Ok(()) } else { Err(StartupError::KeysMissing(keys_missing(&missing, keys))) }
}

/// Loads the key ring and checks it against the sealed records. A key file is created only
/// for [`KeySource::CreateFile`], and only while no sealed record exists.
///
/// # Errors
/// [`SecretError::NoKeyFile`] (inside [`StartupError::Key`]) when the file is missing but
/// records exist; [`StartupError::KeysMissing`] when records need keys the ring lacks.
pub async fn open_key_ring(bus: &Bus, source: KeySource) -> Result<Arc<KeyRing>, StartupError> {
    let store = bus.kv(names::KUBECONFIGS_BUCKET).await?;
    let sealed = sealed_key_ids(&store).await?;
    let ring = match source {
        KeySource::CreateFile(path) => KeyRing::load_or_create(&path, &sealed)?,
        KeySource::File(path) if !path.exists() && !sealed.is_empty() => {
            return Err(SecretError::NoKeyFile {
                path,
                records: sealed.values().sum(),
                needed: sealed.keys().cloned().collect::<Vec<_>>().join(", "),
            }
            .into());
        }
        KeySource::File(path) => KeyRing::from_file(&path)?,
        KeySource::Hex { hex, from } => KeyRing::from_hex(&hex, &from)?,
    };
    let missing = missing(&sealed, &ring);
    if !missing.is_empty() {
        return Err(StartupError::KeysMissing(keys_missing(&missing, &ring)));
    }
    Ok(Arc::new(ring))
}

/// Why a request was not answered. The text goes back in the error header: it names what
/// was wrong and never carries a secret.
#[derive(Debug, thiserror::Error)]
enum RequestError {
    /// The request is fine, and the answer is "none": expected, not worth a warning.
    #[error("{0}")]
    Declined(String),
    #[error("{0}")]
    Refused(String),
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

    /// The message with its causes, as the reply header carries it.
    fn text(&self) -> String {
        let mut text = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(s) = source {
            text.push_str(": ");
            text.push_str(&s.to_string());
            source = s.source();
        }
        text
    }
}

fn refused(reason: impl Into<String>) -> RequestError {
    RequestError::Refused(reason.into())
}

fn decode<M: BusMessage>(payload: &[u8]) -> Result<M, RequestError> {
    M::decode(payload).map_err(|e| refused(format!("not a {}: {e}", M::TYPE)))
}

fn site_id(s: String) -> Result<SiteId, RequestError> {
    SiteId::try_from(s).map_err(|e| refused(e.to_string()))
}

fn node_name(s: String) -> Result<NodeName, RequestError> {
    NodeName::try_from(s).map_err(|e| refused(format!("node: {e}")))
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
        let kubeconfig = secrets::open(self.keys.as_ref(), &kubeconfig::purpose(site.as_str()), &sealed)
            .map_err(RequestError::secret(what))?;
        info!(%site, key_id = %sealed.key_id, "kubeconfig read");
        Ok(kubeconfig)
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
        let sealed = secrets::seal(self.keys.as_ref(), &bmc_purpose(site.as_str(), node.as_str()), &plain)
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
        let req: pb::BmcCredentialsRequest = decode(payload)?;
        // landfall.svc.<site>.bmc_credentials: the subject says which site asks (and what its
        // credentials on the bus allow it to ask for).
        let asking = match names::parse_subject(subject) {
            Some(names::ParsedSubject::Service { site, .. }) => site,
            _ => "",
        };
        if req.site_id != asking {
            return Err(refused(format!("request for site {:?} came on the subject of site {asking:?}", req.site_id)));
        }
        let site = site_id(req.site_id)?;
        let node = node_name(req.node)?;
        let Some((design, _)) = self.sites.get::<pb::SiteDesign>(&keys::site(site.as_str())).await? else {
            return Err(refused(format!("site {site} is not registered")));
        };
        if !design.nodes.iter().any(|n| n.name == node.as_str()) {
            return Err(refused(format!("node {node} is not in the design of site {site}")));
        }
        let busy = match self.sagas.get::<pb::SiteLease>(&keys::site_lease(site.as_str())).await? {
            Some((held, _)) => lease::holder_busy(&self.sagas, &held).await?,
            None => false,
        };
        if !busy {
            return Err(RequestError::Declined(format!("{NO_BMC_JOB} {site} (its lease is not held)")));
        }
        let Some((sealed, _)) =
            self.store.get::<pb::SealedSecret>(&keys::bmc_credentials(site.as_str(), node.as_str())).await?
        else {
            return Err(RequestError::Declined(format!("{NO_BMC_CREDENTIALS} for node {node} of site {site}")));
        };
        let what =
            format!("open the BMC credentials of node {node} of site {site} (sealed under key {})", sealed.key_id);
        let plain = secrets::open(self.keys.as_ref(), &bmc_purpose(site.as_str(), node.as_str()), &sealed)
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
        for _ in 0..CAS_ATTEMPTS {
            let Some((sealed, revision)) = self.store.get::<pb::SealedSecret>(key).await? else { return Ok(false) };
            if sealed.key_id == new {
                return Ok(false);
            }
            let plain = secrets::open(self.keys.as_ref(), &purpose, &sealed)
                .map_err(RequestError::secret(format!("open {key} (sealed under key {})", sealed.key_id)))?;
            let again = secrets::seal(self.keys.as_ref(), &purpose, &plain)
                .map_err(RequestError::secret(format!("seal {key} again")))?;
            drop(plain);
            if again.key_id != new {
                return Err(refused(format!(
                    "the key file changed during the rotation (key {} seals now, not {new}): run the rotation again",
                    again.key_id
                )));
            }
            if let Cas::Written(_) = self.store.update(key, &again, revision).await? {
                return Ok(true);
            }
        }
        Err(refused(format!("{key} kept changing while it was sealed again")))
    }
}

/// Answers the secrets requests until `shutdown`, after checking that `keys` opens every sealed
/// record (see [`check_keys`]). Requests are answered concurrently; rotations one at a time in
/// a process (replicas sharing a key file should not rotate at once).
///
/// # Errors
/// [`StartupError`] when a record needs a key the ring lacks; bus errors when subscribing.
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
        async { stopping(run_secrets_service(bus.clone(), keys, stop.clone()).await) },
    );
    collected.and(served)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secrets::StaticKey;

    #[test]
    fn every_record_key_has_its_purpose() {
        assert_eq!(purpose_of(&keys::kubeconfig("edge-01")).as_deref(), Some("kubeconfig/edge-01"));
        assert_eq!(purpose_of(&keys::bmc_credentials("edge-01", "node-2")).as_deref(), Some("bmc/edge-01/node-2"));
        assert_eq!(purpose_of("bmc.edge-01"), None);
        assert_eq!(purpose_of("other.x"), None);
    }

    #[test]
    fn missing_keys_are_named_with_their_records_and_the_key_source() {
        let k = StaticKey::from_hex(&"11".repeat(32), "LANDFALL_SECRET_KEY").unwrap();
        let sealed = BTreeMap::from([(k.id().to_string(), 3), ("aaaa".to_string(), 2), ("bbbb".to_string(), 1)]);
        let missing = missing(&sealed, &k);
        assert_eq!(missing.keys().collect::<Vec<_>>(), ["aaaa", "bbbb"]);
        let text = keys_missing(&missing, &k).to_string();
        assert!(text.starts_with("3 sealed record(s) in landfall-kubeconfigs need key(s) aaaa, bbbb"), "{text}");
        assert!(text.contains("LANDFALL_SECRET_KEY") && text.contains(k.id()), "{text}");
    }

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
