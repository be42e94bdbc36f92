//! Secrets at rest: XChaCha20-Poly1305 under a key from a [`KeyProvider`].
//!
//! Only [`pb::SealedSecret`] (key id, fresh random nonce, ciphertext) is ever stored. The
//! associated data binds a record to what it is for (e.g. `kubeconfig/edge-1`), so a
//! ciphertext moved to another key opens nowhere.

use std::path::{Path, PathBuf};

use bus_schema::pb;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use sha2::{Digest, Sha256};

pub const ALGORITHM: &str = "xchacha20poly1305";

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("read key file {path}")]
    ReadKey {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("write key file {path}")]
    WriteKey {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("key from {from} is not 64 hex digits (32 bytes)")]
    BadKey { from: String },
    #[error("secret was sealed under key {wanted}, which this key provider does not hold (it holds {held})")]
    UnknownKey { wanted: String, held: String },
    #[error("secret is sealed with {0}, not {ALGORITHM}")]
    Algorithm(String),
    #[error("secret does not open: wrong key, or the record was altered")]
    Open,
    #[error("seal failed")]
    Seal,
    #[error("the operating system's random source failed")]
    Random,
}

/// Where data keys come from. A file or the environment now; a KMS or a TPM-sealed key fits
/// behind the same trait.
pub trait KeyProvider: Send + Sync + 'static {
    /// The key new records are sealed with: (key id, key).
    fn current(&self) -> (String, [u8; 32]);
    /// A key by id, to open an older record.
    fn get(&self, key_id: &str) -> Result<[u8; 32], SecretError>;
}

/// One static key, from a file or an environment variable (64 hex digits).
pub struct StaticKey {
    id: String,
    key: [u8; 32],
}

impl StaticKey {
    pub fn from_hex(hex: &str, from: &str) -> Result<Self, SecretError> {
        let hex = hex.trim();
        if hex.len() != 64 {
            return Err(SecretError::BadKey { from: from.to_string() });
        }
        let mut key = [0u8; 32];
        for (i, byte) in key.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[i * 2..i * 2 + 2], 16)
                .map_err(|_| SecretError::BadKey { from: from.to_string() })?;
        }
        // The id names the key without revealing it.
        let digest = Sha256::digest([b"landfall key id\0".as_slice(), &key].concat());
        let id = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
        Ok(Self { id, key })
    }

    pub fn from_file(path: &Path) -> Result<Self, SecretError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| SecretError::ReadKey { path: path.into(), source })?;
        Self::from_hex(&text, &path.display().to_string())
    }

    /// Reads the key file, creating it (mode 0600, a fresh random key) when it does not exist.
    pub fn load_or_create(path: &Path) -> Result<Self, SecretError> {
        if !path.exists() {
            let key = random::<32>()?;
            let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
            write_private(path, &hex).map_err(|source| SecretError::WriteKey { path: path.into(), source })?;
        }
        Self::from_file(path)
    }

    pub fn id(&self) -> &str {
        &self.id
    }
}

fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    opts.open(path)?.write_all(text.as_bytes())
}

impl KeyProvider for StaticKey {
    fn current(&self) -> (String, [u8; 32]) {
        (self.id.clone(), self.key)
    }

    fn get(&self, key_id: &str) -> Result<[u8; 32], SecretError> {
        if key_id == self.id {
            Ok(self.key)
        } else {
            Err(SecretError::UnknownKey { wanted: key_id.to_string(), held: self.id.clone() })
        }
    }
}

/// Bytes from the operating system's random source.
fn random<const N: usize>() -> Result<[u8; N], SecretError> {
    let mut buf = [0u8; N];
    getrandom::fill(&mut buf).map_err(|_| SecretError::Random)?;
    Ok(buf)
}

/// Seals `plaintext` for `purpose` under the provider's current key, with a fresh nonce.
pub fn seal(keys: &dyn KeyProvider, purpose: &str, plaintext: &[u8]) -> Result<pb::SealedSecret, SecretError> {
    let (key_id, key) = keys.current();
    let cipher = XChaCha20Poly1305::new(&key.into());
    let nonce = XNonce::from(random::<24>()?);
    let ciphertext =
        cipher.encrypt(&nonce, Payload { msg: plaintext, aad: purpose.as_bytes() }).map_err(|_| SecretError::Seal)?;
    Ok(pb::SealedSecret { key_id, algorithm: ALGORITHM.into(), nonce: nonce.to_vec(), ciphertext })
}

/// Opens a sealed record made for `purpose`.
pub fn open(keys: &dyn KeyProvider, purpose: &str, sealed: &pb::SealedSecret) -> Result<Vec<u8>, SecretError> {
    if sealed.algorithm != ALGORITHM {
        return Err(SecretError::Algorithm(sealed.algorithm.clone()));
    }
    let key = keys.get(&sealed.key_id)?;
    let nonce: [u8; 24] = sealed.nonce.as_slice().try_into().map_err(|_| SecretError::Open)?;
    let cipher = XChaCha20Poly1305::new(&key.into());
    cipher
        .decrypt(&XNonce::from(nonce), Payload { msg: &sealed.ciphertext, aad: purpose.as_bytes() })
        .map_err(|_| SecretError::Open)
}

#[cfg(test)]
mod tests {
    use super::*;

    const K1: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    const K2: &str = "ff0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    #[test]
    fn seals_and_opens_with_fresh_nonces() {
        let k = StaticKey::from_hex(K1, "test").unwrap();
        let a = seal(&k, "kubeconfig/edge-1", b"secret").unwrap();
        let b = seal(&k, "kubeconfig/edge-1", b"secret").unwrap();
        assert_ne!(a.nonce, b.nonce);
        assert!(!a.ciphertext.windows(6).any(|w| w == b"secret"));
        assert_eq!(open(&k, "kubeconfig/edge-1", &a).unwrap(), b"secret");
    }

    #[test]
    fn wrong_key_or_purpose_does_not_open() {
        let k1 = StaticKey::from_hex(K1, "test").unwrap();
        let k2 = StaticKey::from_hex(K2, "test").unwrap();
        let sealed = seal(&k1, "kubeconfig/edge-1", b"secret").unwrap();
        assert!(matches!(open(&k2, "kubeconfig/edge-1", &sealed), Err(SecretError::UnknownKey { .. })));
        assert!(matches!(open(&k1, "kubeconfig/edge-2", &sealed), Err(SecretError::Open)));
        assert!(matches!(StaticKey::from_hex("abc", "env"), Err(SecretError::BadKey { .. })));
    }

    #[test]
    fn key_file_is_created_private_and_reused() {
        let dir = std::env::temp_dir().join(format!("landfall-key-{}", std::process::id()));
        let path = dir.join("secret.key");
        let a = StaticKey::load_or_create(&path).unwrap();
        let b = StaticKey::load_or_create(&path).unwrap();
        assert_eq!(a.id(), b.id());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        }
        std::fs::remove_dir_all(dir).unwrap();
    }
}
