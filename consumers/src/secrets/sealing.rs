//! Secrets at rest: XChaCha20-Poly1305 under a key from a [`KeyProvider`].
//!
//! Only [`pb::SealedSecret`] (key id, fresh random nonce, ciphertext) is ever stored. The
//! associated data binds a record to what it is for (e.g. `kubeconfig/edge-1`), so a
//! ciphertext moved to another key opens nowhere.
//!
//! A [`KeyRing`] reads a key file of one or more keys, one per line (64 hex digits, `#`
//! comments allowed): the first seals, the others only open. Rotation adds a key in front and,
//! once every record is sealed again, retires the others. No key, and nothing that holds one,
//! is ever printed: `Debug` shows key ids only. A ring file may instead hold its keys wrapped
//! under a key-encryption key kept elsewhere (a [`KeyWrap`], e.g. a PKCS#11 token: see
//! [`super::pkcs11`]); the keys are opened into memory when the file is read.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError, RwLock};
use std::time::SystemTime;

use bus_schema::pb;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use sha2::{Digest, Sha256};
use tracing::{info, warn};
use zeroize::{Zeroize, Zeroizing};

pub const ALGORITHM: &str = "xchacha20poly1305";

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The key file may be read by others: refused, with the fix.
    #[error("{0}")]
    KeyFileOpen(String),
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
    #[error("{from} holds no key")]
    NoKeys { from: String },
    #[error("secret was sealed under key {wanted}, which {from} does not hold (it holds {held})")]
    UnknownKey { wanted: String, held: String, from: String },
    #[error(
        "key file {} does not exist, but {records} sealed record(s) need key(s) {needed}: restore that key \
         file (a new key would open none of them); no key was created",
        path.display()
    )]
    NoKeyFile { path: PathBuf, records: usize, needed: String },
    #[error("the key from {from} cannot be rotated: rotation needs a key file (--secret-key-file)")]
    RotationNeedsFile { from: String },
    #[error("key file {} changed while it was being rotated (its current key is now {found}, not {expected})", path.display())]
    RotatedElsewhere { path: PathBuf, expected: String, found: String },
    #[error("secret is sealed with {0}, not {ALGORITHM}")]
    Algorithm(String),
    #[error("secret does not open: wrong key, or the record was altered")]
    Open,
    #[error("seal failed")]
    Seal,
    #[error("the operating system's random source failed")]
    Random,
    /// The token that holds the key-encryption key of a wrapped ring.
    #[error(transparent)]
    Hsm(Box<super::pkcs11::HsmError>),
}

/// How a ring file holds its keys when not as hex: wrapped under a key-encryption key that never
/// leaves where it is kept, which wraps and unwraps them.
pub trait KeyWrap: Send + Sync + 'static {
    /// The data keys of a ring file's text, in order.
    fn unwrap_keys(&self, text: &str, from: &str) -> Result<Vec<Zeroizing<[u8; 32]>>, SecretError>;
    /// A ring file's text holding `keys` wrapped, in order.
    fn wrap_keys(&self, keys: &[&[u8; 32]]) -> Result<String, SecretError>;
    /// What holds the key-encryption key, for messages.
    fn describe(&self) -> String;
}

/// Where data keys come from. A file or the environment now; a KMS or a TPM-sealed key fits
/// behind the same trait.
pub trait KeyProvider: Send + Sync + 'static {
    /// The key new records are sealed with: (key id, key).
    fn current(&self) -> (String, [u8; 32]);
    /// A key by id, to open an older record.
    fn get(&self, key_id: &str) -> Result<[u8; 32], SecretError>;
    /// The ids of every key held, the current one first.
    fn key_ids(&self) -> Vec<String> {
        vec![self.current().0]
    }
    /// Where the keys come from, for error messages (a key file's path, an environment variable).
    fn source(&self) -> String {
        "the key provider".into()
    }
}

/// One data key. Its `Debug` shows the id only.
#[derive(Clone)]
struct DataKey {
    id: String,
    key: [u8; 32],
}

impl Drop for DataKey {
    fn drop(&mut self) {
        self.key.zeroize();
    }
}

impl fmt::Debug for DataKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DataKey").field("id", &self.id).finish_non_exhaustive()
    }
}

impl DataKey {
    fn from_hex(hex: &str, from: &str) -> Result<Self, SecretError> {
        let hex = hex.trim();
        if hex.len() != 64 || !hex.is_ascii() {
            return Err(SecretError::BadKey { from: from.to_string() });
        }
        let mut key = [0u8; 32];
        for (i, byte) in key.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[i * 2..i * 2 + 2], 16)
                .map_err(|_| SecretError::BadKey { from: from.to_string() })?;
        }
        Ok(Self::new(key))
    }

    fn new(key: [u8; 32]) -> Self {
        Self { id: key_id(&key), key }
    }

    fn hex(&self) -> String {
        self.key.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// The id that names a key without revealing it.
fn key_id(key: &[u8; 32]) -> String {
    let digest = Sha256::digest([b"landfall key id\0".as_slice(), key].concat());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// One static key, from a file or an environment variable (64 hex digits).
pub struct StaticKey {
    key: DataKey,
    from: String,
}

impl fmt::Debug for StaticKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StaticKey").field("id", &self.key.id).field("from", &self.from).finish()
    }
}

impl StaticKey {
    pub fn from_hex(hex: &str, from: &str) -> Result<Self, SecretError> {
        Ok(Self { key: DataKey::from_hex(hex, from)?, from: from.to_string() })
    }

    pub fn from_file(path: &Path) -> Result<Self, SecretError> {
        let text = read_private(path)?;
        Self::from_hex(&text, &path.display().to_string())
    }

    pub fn id(&self) -> &str {
        &self.key.id
    }
}

impl KeyProvider for StaticKey {
    fn current(&self) -> (String, [u8; 32]) {
        (self.key.id.clone(), self.key.key)
    }

    fn get(&self, key_id: &str) -> Result<[u8; 32], SecretError> {
        if key_id == self.key.id {
            Ok(self.key.key)
        } else {
            Err(SecretError::UnknownKey {
                wanted: key_id.to_string(),
                held: self.key.id.clone(),
                from: self.from.clone(),
            })
        }
    }

    fn source(&self) -> String {
        self.from.clone()
    }
}

/// Several keys: the first seals, the others only open. From a key file (one 64-hex key per
/// line, `#` comments allowed; today's single-key file is a ring of one), or a single key from
/// the environment, which cannot rotate.
///
/// A ring read from a file follows the file: a key id it does not hold makes it read the
/// file again once (another replica may have rotated), and [`KeyProvider::current`] notices
/// a file that changed, so a key another process rotated in seals from then on here too.
pub struct KeyRing {
    /// The key file, or where the single key came from.
    origin: Origin,
    loaded: RwLock<Loaded>,
    /// Held while the file is rewritten, so two rotations in one process do not interleave.
    writing: Mutex<()>,
    /// What wraps the file's keys; none for a file of hex keys.
    wrap: Option<Box<dyn KeyWrap>>,
}

enum Origin {
    File(PathBuf),
    Fixed(String),
}

#[derive(Debug)]
struct Loaded {
    /// Never empty; the first seals.
    keys: Vec<DataKey>,
    /// The file as it was when read: a different stamp means it changed.
    stamp: Option<FileStamp>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct FileStamp {
    modified: Option<SystemTime>,
    len: u64,
    #[cfg(unix)]
    inode: u64,
}

impl FileStamp {
    fn of(path: &Path) -> Option<Self> {
        let meta = std::fs::metadata(path).ok()?;
        Some(Self {
            modified: meta.modified().ok(),
            len: meta.len(),
            #[cfg(unix)]
            inode: std::os::unix::fs::MetadataExt::ino(&meta),
        })
    }
}

impl fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyRing").field("source", &self.source()).field("key_ids", &self.key_ids()).finish()
    }
}

/// The keys of a key file's text, in order, without repeats: hex, or opened by `wrap`.
fn parse_keys(text: &str, from: &str, wrap: Option<&dyn KeyWrap>) -> Result<Vec<DataKey>, SecretError> {
    let found = match wrap {
        Some(wrap) => wrap.unwrap_keys(text, from)?.iter().map(|k| DataKey::new(**k)).collect(),
        None => text
            .lines()
            .enumerate()
            .map(|(n, line)| (n, line.trim()))
            .filter(|(_, line)| !line.is_empty() && !line.starts_with('#'))
            .map(|(n, line)| DataKey::from_hex(line, &format!("{from} line {}", n + 1)))
            .collect::<Result<Vec<_>, _>>()?,
    };
    let mut keys: Vec<DataKey> = Vec::new();
    for key in found {
        if !keys.iter().any(|k| k.id == key.id) {
            keys.push(key);
        }
    }
    if keys.is_empty() {
        return Err(SecretError::NoKeys { from: from.to_string() });
    }
    Ok(keys)
}

/// A key file's text: the keys, first the one that seals; wrapped by `wrap` when there is one.
fn render_keys(keys: &[DataKey], wrap: Option<&dyn KeyWrap>) -> Result<Zeroizing<String>, SecretError> {
    if let Some(wrap) = wrap {
        return wrap.wrap_keys(&keys.iter().map(|k| &k.key).collect::<Vec<_>>()).map(Zeroizing::new);
    }
    let mut text = String::from(
        "# landfall data keys, 64 hex digits each: the first seals, the others only open.\n\
         # Rotate with `landfall kubeconfig rotate-key`; do not edit while a rotation runs.\n",
    );
    for k in keys {
        text.push_str(&k.hex());
        text.push('\n');
    }
    Ok(Zeroizing::new(text))
}

impl KeyRing {
    /// Reads a key file (one key or several).
    ///
    /// # Errors
    /// When the file cannot be read, or a line is not a key, or it holds none.
    pub fn from_file(path: &Path) -> Result<Self, SecretError> {
        Self::from_file_with(path, None)
    }

    /// Reads a ring file whose keys `wrap` wraps: they are opened (by `wrap`) into memory now
    /// and whenever the file is read again, and written wrapped by rotation.
    ///
    /// # Errors
    /// As [`KeyRing::from_file`], and when `wrap` does not open a key.
    pub fn from_wrapped_file(path: &Path, wrap: Box<dyn KeyWrap>) -> Result<Self, SecretError> {
        Self::from_file_with(path, Some(wrap))
    }

    /// Writes a new ring file (mode 0600, refused if it exists) wrapped by `wrap`, of the keys of
    /// `import` (in order: records sealed under them still open) or else one fresh random key,
    /// and returns the ring.
    ///
    /// # Errors
    /// [`SecretError::WriteKey`] (e.g. the file exists); errors of `wrap`.
    pub fn create_wrapped(path: &Path, wrap: Box<dyn KeyWrap>, import: Option<&KeyRing>) -> Result<Self, SecretError> {
        let keys = match import {
            Some(ring) => ring.lock_read().keys.clone(),
            None => vec![DataKey::new(random::<32>()?)],
        };
        let text = render_keys(&keys, Some(wrap.as_ref()))?;
        write_new_private(path, &text).map_err(|source| SecretError::WriteKey { path: path.into(), source })?;
        info!(path = %path.display(), key_id = %keys[0].id, wrapped_by = %wrap.describe(), "wrapped key ring created");
        Self::from_wrapped_file(path, wrap)
    }

    fn from_file_with(path: &Path, wrap: Option<Box<dyn KeyWrap>>) -> Result<Self, SecretError> {
        let loaded = Self::read(path, wrap.as_deref())?;
        let origin = Origin::File(path.to_path_buf());
        Ok(Self { origin, loaded: RwLock::new(loaded), writing: Mutex::new(()), wrap })
    }

    /// A ring of one key given as hex (e.g. from an environment variable). It cannot rotate.
    pub fn from_hex(hex: &str, from: &str) -> Result<Self, SecretError> {
        let key = DataKey::from_hex(hex, from)?;
        Ok(Self {
            origin: Origin::Fixed(from.to_string()),
            loaded: RwLock::new(Loaded { keys: vec![key], stamp: None }),
            writing: Mutex::new(()),
            wrap: None,
        })
    }

    /// Reads the key file, creating it (mode 0600, one fresh random key) when it does not
    /// exist and no sealed record does either. `sealed` counts the records in store by the id
    /// of the key that sealed them.
    ///
    /// # Errors
    /// [`SecretError::NoKeyFile`] when the file is missing but records are sealed: a new key
    /// would open none of them, so none is created.
    pub fn load_or_create(path: &Path, sealed: &BTreeMap<String, usize>) -> Result<Self, SecretError> {
        if !path.exists() {
            if !sealed.is_empty() {
                return Err(SecretError::NoKeyFile {
                    path: path.to_path_buf(),
                    records: sealed.values().sum(),
                    needed: sealed.keys().cloned().collect::<Vec<_>>().join(", "),
                });
            }
            let key = DataKey::new(random::<32>()?);
            match write_new_private(path, &render_keys(std::slice::from_ref(&key), None)?) {
                Ok(()) => info!(path = %path.display(), key_id = %key.id, "data key created"),
                // Another process created it first: use theirs.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(source) => return Err(SecretError::WriteKey { path: path.into(), source }),
            }
        }
        Self::from_file(path)
    }

    fn read(path: &Path, wrap: Option<&dyn KeyWrap>) -> Result<Loaded, SecretError> {
        let stamp = FileStamp::of(path);
        let text = read_private(path)?;
        Ok(Loaded { keys: parse_keys(&text, &path.display().to_string(), wrap)?, stamp })
    }

    /// The key file, when the ring has one.
    pub fn path(&self) -> Option<&Path> {
        match &self.origin {
            Origin::File(p) => Some(p),
            Origin::Fixed(_) => None,
        }
    }

    /// The id of the key that seals.
    pub fn current_id(&self) -> String {
        self.current().0
    }

    /// Whether the ring holds the key (reading the file again once if it does not).
    pub fn holds(&self, key_id: &str) -> bool {
        self.get(key_id).is_ok()
    }

    fn lock_read(&self) -> std::sync::RwLockReadGuard<'_, Loaded> {
        self.loaded.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reads the key file again. A ring without a file has nothing to read.
    ///
    /// # Errors
    /// When the file cannot be read or parsed; the ring keeps what it held.
    pub fn reload(&self) -> Result<(), SecretError> {
        let Origin::File(path) = &self.origin else { return Ok(()) };
        let loaded = Self::read(path, self.wrap.as_deref())?;
        *self.loaded.write().unwrap_or_else(PoisonError::into_inner) = loaded;
        Ok(())
    }

    /// Reads the file again if it changed since it was read; a file that does not read now
    /// leaves the ring as it was (with a warning).
    fn refresh_if_changed(&self) {
        let Origin::File(path) = &self.origin else { return };
        let stamp = FileStamp::of(path);
        if stamp.is_none() || self.lock_read().stamp == stamp {
            return;
        }
        if let Err(e) = self.reload() {
            warn!(path = %path.display(), error = %e, "key file changed but does not read: keeping the keys held");
        }
    }

    fn file_for_rotation(&self) -> Result<&Path, SecretError> {
        match &self.origin {
            Origin::File(p) => Ok(p),
            Origin::Fixed(from) => Err(SecretError::RotationNeedsFile { from: from.clone() }),
        }
    }

    /// Adds a fresh random key in front of the file's keys (it seals from now on; the others
    /// still open) and returns its id. The file is replaced atomically (mode 0600).
    ///
    /// # Errors
    /// [`SecretError::RotationNeedsFile`] for a ring without a file; I/O errors.
    pub fn rotate(&self) -> Result<String, SecretError> {
        let path = self.file_for_rotation()?;
        let _writing = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
        let mut loaded = Self::read(path, self.wrap.as_deref())?;
        let key = DataKey::new(random::<32>()?);
        let id = key.id.clone();
        loaded.keys.insert(0, key);
        write_atomic(path, &render_keys(&loaded.keys, self.wrap.as_deref())?)
            .map_err(|source| SecretError::WriteKey { path: path.into(), source })?;
        loaded.stamp = FileStamp::of(path);
        *self.loaded.write().unwrap_or_else(PoisonError::into_inner) = loaded;
        info!(path = %path.display(), key_id = %id, "data key added");
        Ok(id)
    }

    /// Rewrites the file with only its current key, which must still be `current` (the key
    /// every record was sealed again under), and returns the ids of the keys retired.
    ///
    /// # Errors
    /// [`SecretError::RotatedElsewhere`] when the file's current key is another one by now.
    pub fn retire(&self, current: &str) -> Result<Vec<String>, SecretError> {
        let path = self.file_for_rotation()?;
        let _writing = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
        let mut loaded = Self::read(path, self.wrap.as_deref())?;
        if loaded.keys[0].id != current {
            return Err(SecretError::RotatedElsewhere {
                path: path.into(),
                expected: current.to_string(),
                found: loaded.keys[0].id.clone(),
            });
        }
        let retired: Vec<String> = loaded.keys.drain(1..).map(|k| k.id.clone()).collect();
        if !retired.is_empty() {
            write_atomic(path, &render_keys(&loaded.keys, self.wrap.as_deref())?)
                .map_err(|source| SecretError::WriteKey { path: path.into(), source })?;
            info!(path = %path.display(), retired = %retired.join(", "), "data keys retired");
        }
        loaded.stamp = FileStamp::of(path);
        *self.loaded.write().unwrap_or_else(PoisonError::into_inner) = loaded;
        Ok(retired)
    }
}

impl KeyProvider for KeyRing {
    fn current(&self) -> (String, [u8; 32]) {
        self.refresh_if_changed();
        let loaded = self.lock_read();
        (loaded.keys[0].id.clone(), loaded.keys[0].key)
    }

    fn get(&self, key_id: &str) -> Result<[u8; 32], SecretError> {
        let find = |l: &Loaded| l.keys.iter().find(|k| k.id == key_id).map(|k| k.key);
        if let Some(key) = find(&self.lock_read()) {
            return Ok(key);
        }
        // Another replica may have rotated: read the file once more before giving up.
        if let Err(e) = self.reload() {
            warn!(source = %self.source(), error = %e, "cannot read the key file again");
        }
        find(&self.lock_read()).ok_or_else(|| SecretError::UnknownKey {
            wanted: key_id.to_string(),
            held: self.key_ids().join(", "),
            from: self.source(),
        })
    }

    fn key_ids(&self) -> Vec<String> {
        self.lock_read().keys.iter().map(|k| k.id.clone()).collect()
    }

    fn source(&self) -> String {
        match &self.origin {
            Origin::File(p) => match &self.wrap {
                Some(wrap) => format!("key ring {} (wrapped under {})", p.display(), wrap.describe()),
                None => format!("key file {}", p.display()),
            },
            Origin::Fixed(from) => from.clone(),
        }
    }
}

/// Creates `path` (and its directory) with `text`, mode 0600; fails if it exists.
/// Reads a key file that only its owner may read, zeroed when dropped.
fn read_private(path: &Path) -> Result<Zeroizing<String>, SecretError> {
    bus_schema::runtime::private_file(path).map_err(SecretError::KeyFileOpen)?;
    let text = std::fs::read_to_string(path).map_err(|source| SecretError::ReadKey { path: path.into(), source })?;
    Ok(Zeroizing::new(text))
}

fn write_new_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let mut file = opts.open(path)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()
}

/// Replaces `path` with `text` atomically: a private temporary file beside it, synced, then
/// renamed over it. A reader sees the old file or the new one, never half of one.
fn write_atomic(path: &Path, text: &str) -> std::io::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let suffix: String = random::<6>().unwrap_or_default().iter().map(|b| format!("{b:02x}")).collect();
    let tmp = dir.join(format!(".{name}.tmp-{}-{suffix}", std::process::id()));
    let result = write_new_private(&tmp, text).and_then(|()| std::fs::rename(&tmp, path));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
        return result;
    }
    // The rename is durable once the directory is.
    std::fs::File::open(dir).and_then(|d| d.sync_all()).or(Ok(()))
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
pub fn open(
    keys: &dyn KeyProvider,
    purpose: &str,
    sealed: &pb::SealedSecret,
) -> Result<Zeroizing<Vec<u8>>, SecretError> {
    if sealed.algorithm != ALGORITHM {
        return Err(SecretError::Algorithm(sealed.algorithm.clone()));
    }
    let key = keys.get(&sealed.key_id)?;
    let nonce: [u8; 24] = sealed.nonce.as_slice().try_into().map_err(|_| SecretError::Open)?;
    let cipher = XChaCha20Poly1305::new(&key.into());
    cipher
        .decrypt(&XNonce::from(nonce), Payload { msg: &sealed.ciphertext, aad: purpose.as_bytes() })
        .map(Zeroizing::new)
        .map_err(|_| SecretError::Open)
}

#[cfg(test)]
mod tests {
    use super::*;

    const K1: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    const K2: &str = "ff0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    /// A fresh directory under the system temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!(
                "landfall-{name}-{}-{}",
                std::process::id(),
                key_id(&random::<32>().unwrap())
            ));
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn mode(path: &Path) -> u32 {
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(path).unwrap().permissions().mode() & 0o777
        }
        #[cfg(not(unix))]
        0o600
    }

    #[test]
    fn seals_and_opens_with_fresh_nonces() {
        let k = StaticKey::from_hex(K1, "test").unwrap();
        let a = seal(&k, "kubeconfig/edge-1", b"secret").unwrap();
        let b = seal(&k, "kubeconfig/edge-1", b"secret").unwrap();
        assert_ne!(a.nonce, b.nonce);
        assert!(!a.ciphertext.windows(6).any(|w| w == b"secret"));
        assert_eq!(open(&k, "kubeconfig/edge-1", &a).unwrap().as_slice(), b"secret");
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

    fn write_private(path: &Path, text: impl AsRef<[u8]>) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(path, text).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }

    #[test]
    fn a_key_file_others_may_read_is_refused_with_the_fix() {
        use std::os::unix::fs::PermissionsExt;
        let dir = TempDir::new("ring-open");
        let path = dir.0.join("secret.key");
        write_private(&path, K1);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = KeyRing::from_file(&path).unwrap_err().to_string();
        assert!(e.contains(&format!("(mode 640); make it the owner's alone: chmod 600 {}", path.display())), "{e}");
        assert!(StaticKey::from_file(&path).is_err());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(KeyRing::from_file(&path).is_ok());
    }

    #[test]
    fn a_single_key_file_of_today_reads_as_a_ring_of_one() {
        let dir = TempDir::new("ring-one");
        let path = dir.0.join("secret.key");
        write_private(&path, K1);
        let ring = KeyRing::from_file(&path).unwrap();
        let fixed = StaticKey::from_hex(K1, "test").unwrap();
        assert_eq!(ring.key_ids(), vec![fixed.id().to_string()]);
        let sealed = seal(&fixed, "p", b"x").unwrap();
        assert_eq!(open(&ring, "p", &sealed).unwrap().as_slice(), b"x");
    }

    #[test]
    fn the_first_key_seals_and_every_key_opens() {
        let dir = TempDir::new("ring-two");
        let path = dir.0.join("secret.key");
        write_private(&path, format!("# new\n{K2}\n\n  # old\n{K1}\n{K1}\n"));
        let ring = KeyRing::from_file(&path).unwrap();
        let (k1, k2) = (StaticKey::from_hex(K1, "t").unwrap(), StaticKey::from_hex(K2, "t").unwrap());
        assert_eq!(ring.key_ids(), vec![k2.id().to_string(), k1.id().to_string()]);
        assert_eq!(ring.current_id(), k2.id());
        let old = seal(&k1, "p", b"old").unwrap();
        assert_eq!(open(&ring, "p", &old).unwrap().as_slice(), b"old");
        assert_eq!(seal(&ring, "p", b"new").unwrap().key_id, k2.id());

        write_private(&path, format!("{K1}\nnot a key\n"));
        let err = KeyRing::from_file(&path).unwrap_err();
        assert!(err.to_string().contains("line 2"), "{err}");
        write_private(&path, "# only a comment\n");
        assert!(matches!(KeyRing::from_file(&path), Err(SecretError::NoKeys { .. })));
    }

    #[test]
    fn rotate_adds_a_key_in_front_and_retire_keeps_only_it() {
        let dir = TempDir::new("ring-rotate");
        let path = dir.0.join("secret.key");
        let ring = KeyRing::load_or_create(&path, &BTreeMap::new()).unwrap();
        let old = ring.current_id();
        let sealed = seal(&ring, "p", b"before").unwrap();

        let new = ring.rotate().unwrap();
        assert_ne!(new, old);
        assert_eq!(ring.key_ids(), vec![new.clone(), old.clone()]);
        assert_eq!(mode(&path), 0o600);
        // Another process reading the file sees both keys.
        assert_eq!(KeyRing::from_file(&path).unwrap().key_ids(), vec![new.clone(), old.clone()]);
        assert_eq!(open(&ring, "p", &sealed).unwrap().as_slice(), b"before");

        assert!(matches!(ring.retire(&old), Err(SecretError::RotatedElsewhere { .. })));
        assert_eq!(ring.retire(&new).unwrap(), vec![old.clone()]);
        assert_eq!(KeyRing::from_file(&path).unwrap().key_ids(), vec![new.clone()]);
        assert_eq!(mode(&path), 0o600);
        assert!(matches!(open(&ring, "p", &sealed), Err(SecretError::UnknownKey { .. })));
        // No temporary file is left behind.
        assert_eq!(std::fs::read_dir(&dir.0).unwrap().count(), 1);
    }

    #[test]
    fn a_ring_follows_a_rotation_made_by_another_process() {
        let dir = TempDir::new("ring-follow");
        let path = dir.0.join("secret.key");
        let here = KeyRing::load_or_create(&path, &BTreeMap::new()).unwrap();
        let elsewhere = KeyRing::from_file(&path).unwrap();
        let new = elsewhere.rotate().unwrap();
        let sealed = seal(&elsewhere, "p", b"x").unwrap();
        // An unknown key id makes the ring read the file again.
        assert_eq!(open(&here, "p", &sealed).unwrap().as_slice(), b"x");
        assert_eq!(here.current_id(), new);

        let third = KeyRing::from_file(&path).unwrap();
        let newer = elsewhere.rotate().unwrap();
        // A changed file is noticed before sealing.
        assert_eq!(seal(&third, "p", b"x").unwrap().key_id, newer);
    }

    #[test]
    fn a_key_from_the_environment_does_not_rotate() {
        let ring = KeyRing::from_hex(K1, "LANDFALL_SECRET_KEY").unwrap();
        let err = ring.rotate().unwrap_err();
        assert!(err.to_string().contains("needs a key file"), "{err}");
        let err = ring.get("0000").unwrap_err();
        assert!(err.to_string().contains("LANDFALL_SECRET_KEY"), "{err}");
    }

    #[test]
    fn key_file_is_created_private_and_reused_but_not_when_records_exist() {
        let dir = TempDir::new("ring-create");
        let path = dir.0.join("sub").join("secret.key");
        let sealed = BTreeMap::from([("0123456789abcdef".to_string(), 2)]);
        let err = KeyRing::load_or_create(&path, &sealed).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("0123456789abcdef") && text.contains("2 sealed record"), "{text}");
        assert!(!path.exists(), "no key may be created while records exist");

        let a = KeyRing::load_or_create(&path, &BTreeMap::new()).unwrap();
        let b = KeyRing::load_or_create(&path, &BTreeMap::new()).unwrap();
        assert_eq!(a.key_ids(), b.key_ids());
        assert_eq!(mode(&path), 0o600);
        // With the file there, records under its key do not stop it from loading.
        let sealed = BTreeMap::from([(a.current_id(), 1)]);
        assert_eq!(KeyRing::load_or_create(&path, &sealed).unwrap().key_ids(), a.key_ids());
    }

    #[test]
    fn debug_shows_key_ids_never_keys() {
        let ring = KeyRing::from_hex(K1, "env").unwrap();
        let fixed = StaticKey::from_hex(K1, "env").unwrap();
        for text in [format!("{ring:?}"), format!("{fixed:?}"), format!("{:?}", ring.lock_read())] {
            assert!(text.contains(fixed.id()), "{text}");
            assert!(!text.contains(&K1[..16]), "{text}");
            assert!(!text.contains("[0, 1, 2"), "{text}");
        }
    }
}
