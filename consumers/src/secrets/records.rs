//! The sealed records of `landfall-kubeconfigs` as both secrets services see them: what each
//! record is bound to (its purpose, from its key), which keys they were sealed under, and the
//! check the kubeconfig collector and the secrets service run before they start: a key ring
//! that cannot open every record does not start either.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use bus_schema::names::{self, keys};
use bus_schema::pb;
use bus_schema::runtime::{Bus, BusError, Kv};

use super::pkcs11::TokenKey;
use super::sealing::{KeyProvider, KeyRing, SecretError};

/// What a site's sealed kubeconfig is bound to.
pub fn kubeconfig_purpose(site: &str) -> String {
    format!("kubeconfig/{site}")
}

/// What a host's sealed BMC credentials are bound to.
pub fn bmc_purpose(site: &str, node: &str) -> String {
    format!("bmc/{site}/{node}")
}

/// The purpose a record of the sealed-secrets bucket is bound to, from its key.
pub(super) fn purpose_of(key: &str) -> Option<String> {
    if let Some(site) = key.strip_prefix(keys::KUBECONFIG_PREFIX) {
        return Some(kubeconfig_purpose(site));
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
    /// A ring file (made by `landfall secrets hsm-init`) whose keys are wrapped under a
    /// key-encryption key in a PKCS#11 token.
    Pkcs11 { token: TokenKey, ring_file: PathBuf },
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
pub(super) async fn sealed_records(store: &Kv) -> Result<Vec<(String, pb::SealedSecret, u64)>, BusError> {
    let mut all = store.scan::<pb::SealedSecret>(keys::KUBECONFIG_PREFIX).await?;
    all.extend(store.scan::<pb::SealedSecret>(keys::BMC_PREFIX).await?);
    Ok(all)
}

/// The key ids of `sealed` that `keys` does not hold, with how many records need them.
pub(super) fn missing(sealed: &BTreeMap<String, usize>, keys: &dyn KeyProvider) -> BTreeMap<String, usize> {
    sealed.iter().filter(|(id, _)| keys.get(id).is_err()).map(|(id, n)| (id.clone(), *n)).collect()
}

pub(super) fn keys_missing(missing: &BTreeMap<String, usize>, keys: &dyn KeyProvider) -> MissingKeys {
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
        KeySource::File(path) | KeySource::Pkcs11 { ring_file: path, .. } if !path.exists() && !sealed.is_empty() => {
            return Err(SecretError::NoKeyFile {
                path,
                records: sealed.values().sum(),
                needed: sealed.keys().cloned().collect::<Vec<_>>().join(", "),
            }
            .into());
        }
        KeySource::File(path) => KeyRing::from_file(&path)?,
        KeySource::Hex { hex, from } => KeyRing::from_hex(&hex, &from)?,
        KeySource::Pkcs11 { token, ring_file } => super::pkcs11::open_ring(&token, &ring_file)?,
    };
    let missing = missing(&sealed, &ring);
    if !missing.is_empty() {
        return Err(StartupError::KeysMissing(keys_missing(&missing, &ring)));
    }
    Ok(Arc::new(ring))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secrets::sealing::StaticKey;

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
}
