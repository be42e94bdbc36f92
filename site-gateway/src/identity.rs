//! The gateway's identity: the nkey user key pair (ed25519) it connects to NATS with, kept in an
//! identity directory.
//!
//! With a TPM the seed is sealed to it (see [`tpm`]): the directory holds the sealed object's
//! public and private parts, which load on that TPM only, and the public key in clear. The seed
//! is unsealed into memory at load and never written anywhere. A copy of the disk is not a copy
//! of the key.
//!
//! Without a TPM the seed is a file (mode 0600), as `--nats-nkey-file` is: anyone with the disk
//! has the key, which [`Identity::sealed`] lets the gateway say at start.
//!
//! ```text
//! identity.json      what the directory holds: {"format":1,"storage":"tpm"|"file",…}
//! identity.pub.nkey  the public key (U…), for the hub's NATS configuration
//! seed.sealed.pub    with a TPM: the sealed object (TPM2B_PUBLIC)
//! seed.sealed.priv   with a TPM: the sealed object (TPM2B_PRIVATE, only this TPM can load it)
//! seed.nkey          without: the seed (SU…), mode 0600
//! ```

mod tpm;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use bus_schema::runtime::Access;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

/// What `/dev/tpmrm0`, the kernel's TPM resource manager, is reached through.
pub const DEVICE_TCTI: &str = "device:/dev/tpmrm0";

const MANIFEST: &str = "identity.json";
const PUBLIC_KEY: &str = "identity.pub.nkey";
const SEALED_PUBLIC: &str = "seed.sealed.pub";
const SEALED_PRIVATE: &str = "seed.sealed.priv";
const SEED_FILE: &str = "seed.nkey";
const FORMAT: u32 = 1;

/// Which TPM holds the identity (`--tpm`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum TpmChoice {
    /// The kernel's TPM (`/dev/tpmrm0`) when the machine has one, else none.
    #[default]
    Auto,
    /// No TPM: the seed is a file.
    None,
    /// The TPM this TCTI reaches, e.g. `device:/dev/tpmrm0` or `swtpm:host=127.0.0.1,port=2321`.
    Tcti(String),
}

impl FromStr for TpmChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "" => Err("an empty --tpm: give auto, none or a TCTI (device:/dev/tpmrm0, swtpm:host=…,port=…)".into()),
            "auto" => Ok(TpmChoice::Auto),
            "none" => Ok(TpmChoice::None),
            path if path.starts_with('/') => Ok(TpmChoice::Tcti(format!("device:{path}"))),
            tcti if tcti.contains(':') => Ok(TpmChoice::Tcti(tcti.to_string())),
            other => Err(format!(
                "--tpm {other}: give auto, none or a TCTI (device:/dev/tpmrm0, swtpm:host=127.0.0.1,port=2321)"
            )),
        }
    }
}

impl std::fmt::Display for TpmChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TpmChoice::Auto => f.write_str("auto"),
            TpmChoice::None => f.write_str("none"),
            TpmChoice::Tcti(tcti) => f.write_str(tcti),
        }
    }
}

impl TpmChoice {
    /// The TCTI this choice names on this machine: `auto` is [`DEVICE_TCTI`] when
    /// `/dev/tpmrm0` exists, else none.
    pub fn tcti(&self) -> Option<String> {
        match self {
            TpmChoice::Auto => Path::new("/dev/tpmrm0").exists().then(|| DEVICE_TCTI.to_string()),
            TpmChoice::None => None,
            TpmChoice::Tcti(tcti) => Some(tcti.clone()),
        }
    }
}

/// Why an identity cannot be made or used.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("{dir} holds an identity already ({file}): it is not replaced")]
    Exists { dir: PathBuf, file: &'static str },
    #[error("{dir} holds no identity: make one with `landfall-gateway identity init --identity-dir {dir}`")]
    Missing { dir: PathBuf },
    #[error("the identity directory is corrupt: {reason}")]
    Corrupt { reason: String },
    #[error("{path}: {doing}: {source}")]
    Io { path: PathBuf, doing: &'static str, source: std::io::Error },
    #[error(
        "this identity is sealed to a TPM, and no TPM was given (--tpm none, or auto on a machine without \
         /dev/tpmrm0): give the TPM it was made with (--tpm <TCTI>)"
    )]
    SealedWithoutTpm,
    #[error(
        "this identity is a key file, made without a TPM, and a TPM was given ({tcti}): load it with --tpm none, \
         or make a sealed identity in another directory with --tpm"
    )]
    FileWithTpm { tcti: String },
    #[error(
        "sealed to another TPM: this identity cannot be used on this machine (or its TPM was cleared since); \
         make a new identity here and register its public key with the hub"
    )]
    OtherTpm,
    #[error("{tool} is not installed: a sealed identity needs tpm2-tools (apt-get install tpm2-tools)")]
    NoTpmTools { tool: &'static str },
    #[error("the TPM at {tcti} cannot be reached: {detail}")]
    TpmUnreachable { tcti: String, detail: String },
    #[error("the TPM refused ({tool}): {detail}")]
    Tpm { tool: &'static str, detail: String },
    #[error("signing with the identity key: {0}")]
    Sign(String),
}

impl IdentityError {
    fn io(path: &Path, doing: &'static str, source: std::io::Error) -> IdentityError {
        IdentityError::Io { path: path.to_path_buf(), doing, source }
    }
}

/// Where the seed is kept, as the manifest says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Storage {
    Tpm,
    File,
}

/// `identity.json`: what the directory holds. Nothing in it is secret.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Manifest {
    format: u32,
    storage: Storage,
    /// The primary key's template the seed is sealed under (with a TPM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    primary: Option<String>,
    /// SHA-256 of the sealed object's public part then private part (hex): a damaged copy is
    /// told from one sealed to another TPM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sealed_sha256: Option<String>,
}

/// The gateway's identity, its seed in memory (zeroized on drop).
pub struct Identity {
    seed: Zeroizing<String>,
    public_key: String,
    sealed: bool,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity").field("public_key", &self.public_key).field("sealed", &self.sealed).finish()
    }
}

impl Identity {
    /// Makes a new identity in `dir` (created if missing), sealed to the TPM `tpm` names, or a
    /// seed file without one. Refuses to replace an identity there. With a TPM the sealed seed is
    /// unsealed once before anything is written, so an identity that is made is one that loads.
    ///
    /// # Errors
    /// [`IdentityError::Exists`], the TPM's errors, or the directory's.
    pub fn init(dir: &Path, tpm: &TpmChoice) -> Result<Identity, IdentityError> {
        for file in [MANIFEST, PUBLIC_KEY, SEALED_PUBLIC, SEALED_PRIVATE, SEED_FILE] {
            if dir.join(file).exists() {
                return Err(IdentityError::Exists { dir: dir.to_path_buf(), file });
            }
        }
        let pair = nkeys::KeyPair::new_user();
        let seed = Zeroizing::new(pair.seed().map_err(|e| IdentityError::Sign(e.to_string()))?);
        let public_key = pair.public_key();
        let tcti = tpm.tcti();
        let manifest = Manifest {
            format: FORMAT,
            storage: if tcti.is_some() { Storage::Tpm } else { Storage::File },
            primary: None,
            sealed_sha256: None,
        };
        let public_line = format!("{public_key}\n");
        match &tcti {
            Some(tcti) => {
                // Sealed, then unsealed once to check, before anything is written.
                let sealed = tpm::Tpm::new(tcti).seal(seed.as_bytes())?;
                let manifest = Manifest {
                    primary: Some(tpm::PRIMARY_TEMPLATE.into()),
                    sealed_sha256: Some(sealed_digest(&sealed.public, &sealed.private)),
                    ..manifest
                };
                manifest.write_with(
                    dir,
                    &[
                        (SEALED_PUBLIC, &sealed.public, 0o644),
                        (SEALED_PRIVATE, &sealed.private, 0o600),
                        (PUBLIC_KEY, public_line.as_bytes(), 0o644),
                    ],
                )?;
            }
            None => {
                let seed_line = Zeroizing::new(format!("{}\n", *seed));
                manifest.write_with(
                    dir,
                    &[(SEED_FILE, seed_line.as_bytes(), 0o600), (PUBLIC_KEY, public_line.as_bytes(), 0o644)],
                )?;
            }
        }
        Ok(Identity { seed, public_key, sealed: tcti.is_some() })
    }

    /// Loads the identity in `dir`: unseals its seed with the TPM `tpm` names, or reads its seed
    /// file, and checks the seed is the public key's.
    ///
    /// # Errors
    /// [`IdentityError::Missing`] for a directory without one, [`IdentityError::OtherTpm`] for an
    /// identity sealed to another TPM, [`IdentityError::SealedWithoutTpm`] and
    /// [`IdentityError::FileWithTpm`] when the TPM given is not how it was made,
    /// [`IdentityError::Corrupt`], and the TPM's errors.
    pub fn load(dir: &Path, tpm: &TpmChoice) -> Result<Identity, IdentityError> {
        let manifest = Manifest::read(dir)?;
        let public_key = read_public_key(dir)?;
        let tcti = tpm.tcti();
        let seed = match (manifest.storage, tcti) {
            (Storage::Tpm, None) => return Err(IdentityError::SealedWithoutTpm),
            (Storage::File, Some(tcti)) => return Err(IdentityError::FileWithTpm { tcti }),
            (Storage::File, None) => read_seed_file(&dir.join(SEED_FILE))?,
            (Storage::Tpm, Some(tcti)) => {
                if manifest.primary.as_deref() != Some(tpm::PRIMARY_TEMPLATE) {
                    return Err(IdentityError::Corrupt {
                        reason: format!(
                            "{MANIFEST} names the primary key template {:?}, not {:?}",
                            manifest.primary.as_deref().unwrap_or(""),
                            tpm::PRIMARY_TEMPLATE
                        ),
                    });
                }
                let (public, private) = (dir.join(SEALED_PUBLIC), dir.join(SEALED_PRIVATE));
                let digest = sealed_digest(&read(&public)?, &read(&private)?);
                if manifest.sealed_sha256.as_deref() != Some(digest.as_str()) {
                    return Err(IdentityError::Corrupt {
                        reason: format!(
                            "{SEALED_PUBLIC} and {SEALED_PRIVATE} are not what was sealed (their digest differs)"
                        ),
                    });
                }
                let secret = tpm::Tpm::new(&tcti).unseal(&public, &private)?;
                let text = std::str::from_utf8(&secret)
                    .map_err(|_| IdentityError::Corrupt { reason: "what the TPM unsealed is not a seed".into() })?;
                Zeroizing::new(text.trim().to_string())
            }
        };
        let pair = nkeys::KeyPair::from_seed(&seed)
            .map_err(|e| IdentityError::Corrupt { reason: format!("the seed is not an nkey seed: {e}") })?;
        if pair.public_key() != public_key {
            return Err(IdentityError::Corrupt {
                reason: format!("the seed is not the key of {PUBLIC_KEY} ({public_key})"),
            });
        }
        Ok(Identity { seed, public_key, sealed: manifest.storage == Storage::Tpm })
    }

    /// The public key (`U…`): what the hub's NATS configuration lists for this gateway.
    pub fn public_key(&self) -> &str {
        &self.public_key
    }

    /// A short fingerprint of the public key for people to compare: the first 8 bytes of its
    /// SHA-256, in hex, in groups of four (`1a2b:3c4d:5e6f:7a8b`).
    pub fn fingerprint(&self) -> String {
        fingerprint(&self.public_key)
    }

    /// Whether the seed is sealed to a TPM (else it is a file anyone with the disk can read).
    pub fn sealed(&self) -> bool {
        self.sealed
    }

    /// An ed25519 signature of `bytes` with the identity key (nkeys' `verify` checks it).
    ///
    /// # Errors
    /// None in practice: the key pair always has its seed.
    pub fn sign(&self, bytes: &[u8]) -> Result<Vec<u8>, IdentityError> {
        let pair = nkeys::KeyPair::from_seed(&self.seed).map_err(|e| IdentityError::Sign(e.to_string()))?;
        pair.sign(bytes).map_err(|e| IdentityError::Sign(e.to_string()))
    }

    /// The key pair, in memory (to sign a request to join, a renewal, a connection's nonce).
    ///
    /// # Errors
    /// The seed held is not a key's (never, for an identity that loaded).
    pub fn key_pair(&self) -> Result<nkeys::KeyPair, IdentityError> {
        nkeys::KeyPair::from_seed(&self.seed).map_err(|e| IdentityError::Sign(e.to_string()))
    }

    /// `access` with this identity as its NATS user: the seed is handed over in memory, for
    /// the connection's nkey authentication.
    pub fn nats_access(&self, access: Access) -> Access {
        Access { nkey_seed: Some(self.seed.to_string()), ..access }
    }
}

/// [`Identity::fingerprint`] of a public key (what the hub lists a request to join by).
pub fn fingerprint(public_key: &str) -> String {
    bus_schema::credentials::fingerprint(public_key)
}

impl Manifest {
    fn read(dir: &Path) -> Result<Manifest, IdentityError> {
        let path = dir.join(MANIFEST);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let others = [PUBLIC_KEY, SEALED_PUBLIC, SEALED_PRIVATE, SEED_FILE];
                return Err(match others.iter().find(|f| dir.join(f).exists()) {
                    Some(file) => IdentityError::Corrupt { reason: format!("{file} is there, {MANIFEST} is not") },
                    None => IdentityError::Missing { dir: dir.to_path_buf() },
                });
            }
            Err(e) => return Err(IdentityError::io(&path, "reading", e)),
        };
        let manifest: Manifest = serde_json::from_str(&text)
            .map_err(|e| IdentityError::Corrupt { reason: format!("{MANIFEST} cannot be read: {e}") })?;
        if manifest.format != FORMAT {
            return Err(IdentityError::Corrupt {
                reason: format!("{MANIFEST} is of format {}, this gateway reads {FORMAT}", manifest.format),
            });
        }
        Ok(manifest)
    }

    /// Creates `dir` if needed, writes `files` (name, contents, mode) there, then this manifest
    /// last: an identity is complete once its manifest is there. On an error what was written is
    /// removed.
    fn write_with(&self, dir: &Path, files: &[(&str, &[u8], u32)]) -> Result<(), IdentityError> {
        create_private_dir(dir)?;
        let text = serde_json::to_string_pretty(self).map_err(|e| IdentityError::Corrupt { reason: e.to_string() })?;
        let manifest = format!("{text}\n");
        let mut written = Vec::new();
        for (name, bytes, mode) in files.iter().copied().chain([(MANIFEST, manifest.as_bytes(), 0o644)]) {
            let path = dir.join(name);
            if let Err(e) = write_new(&path, bytes, mode) {
                for path in written {
                    let _ = std::fs::remove_file(path);
                }
                return Err(e);
            }
            written.push(path);
        }
        Ok(())
    }
}

fn create_private_dir(dir: &Path) -> Result<(), IdentityError> {
    use std::os::unix::fs::DirBuilderExt;
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| IdentityError::io(dir, "creating the identity directory", e))
}

/// Writes a new file (never replacing one) with this mode from its creation on.
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), IdentityError> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| IdentityError::io(path, "creating", e))?;
    file.write_all(bytes).and_then(|()| file.sync_all()).map_err(|e| IdentityError::io(path, "writing", e))
}

fn read(path: &Path) -> Result<Vec<u8>, IdentityError> {
    std::fs::read(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => IdentityError::Corrupt {
            reason: format!("{} is missing", path.file_name().unwrap_or_default().to_string_lossy()),
        },
        _ => IdentityError::io(path, "reading", e),
    })
}

fn read_public_key(dir: &Path) -> Result<String, IdentityError> {
    let bytes = read(&dir.join(PUBLIC_KEY))?;
    let text = String::from_utf8_lossy(&bytes);
    let key = text.lines().map(str::trim).find(|l| !l.is_empty() && !l.starts_with('#')).unwrap_or("");
    if !key.starts_with('U') || nkeys::KeyPair::from_public_key(key).is_err() {
        return Err(IdentityError::Corrupt { reason: format!("{PUBLIC_KEY} holds no user public key (U…)") });
    }
    Ok(key.to_string())
}

fn read_seed_file(path: &Path) -> Result<Zeroizing<String>, IdentityError> {
    if !path.exists() {
        return Err(IdentityError::Corrupt { reason: format!("{SEED_FILE} is missing") });
    }
    bus_schema::runtime::private_file(path).map_err(|reason| IdentityError::Corrupt { reason })?;
    let text = Zeroizing::new(std::fs::read_to_string(path).map_err(|e| IdentityError::io(path, "reading", e))?);
    text.lines()
        .map(str::trim)
        .find(|l| l.starts_with("SU"))
        .map(|l| Zeroizing::new(l.to_string()))
        .ok_or_else(|| IdentityError::Corrupt { reason: format!("{SEED_FILE} holds no user seed (SU…)") })
}

fn sealed_digest(public: &[u8], private: &[u8]) -> String {
    let mut hash = Sha256::new();
    for part in [public, private] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part);
    }
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests;
