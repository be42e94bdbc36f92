//! A key ring whose data keys are kept in the ring file only wrapped under an AES-256
//! key-encryption key (KEK) that lives in a PKCS#11 token (an HSM; SoftHSM2 in the tests).
//!
//! The KEK is made on the token once ([`init_ring`], `landfall secrets hsm-init`): sensitive and
//! not extractable, so its value never leaves the token. The token wraps and unwraps the data
//! keys itself, with `C_Encrypt`/`C_Decrypt` under `CKM_AES_GCM` (a fresh random 96-bit IV per
//! key, a 128-bit tag, and associated data naming the KEK): the tag makes a key wrapped under
//! another KEK, or an altered line, fail to open instead of opening to garbage. Encryption
//! rather than `C_WrapKey`/`C_UnwrapKey`: those wrap only keys that are objects of the token, so
//! each data key would have to be imported as an extractable object and unwrapped into one
//! whose value is then read out again; SoftHSM2 wraps with AES key wrap (RFC 3394/5649), which
//! binds no associated data. `CKM_AES_GCM` encryption is there in SoftHSM2 and most HSMs, and the
//! KEK then needs only `CKA_ENCRYPT`/`CKA_DECRYPT`.
//!
//! A ring file reads:
//!
//! ```text
//! # comments
//! kek <the KEK's CKA_ID, hex>
//! key <IV, hex> <ciphertext and tag, hex>     (the first seals, the others only open)
//! ```
//!
//! The keys are opened into memory when the file is read (at start, on reload, and when another
//! process rotated), and held as [`super::KeyRing`] holds keys from a plain key file: zeroed on
//! drop, never printed. The PIN comes from a file or an environment variable and is held as a
//! secret string; neither it nor a key is ever logged.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use cryptoki::context::{CInitializeArgs, CInitializeFlags, Pkcs11};
use cryptoki::error::{Error as CkError, RvError};
use cryptoki::mechanism::Mechanism;
use cryptoki::mechanism::aead::GcmParams;
use cryptoki::object::{Attribute, AttributeType, KeyType, ObjectClass, ObjectHandle};
use cryptoki::session::{Session, UserType};
use cryptoki::types::AuthPin;
use zeroize::Zeroizing;

use super::sealing::{KeyRing, KeyWrap, SecretError};

/// The label of the key-encryption key when none is given.
pub const DEFAULT_KEY_LABEL: &str = "landfall-kek";
/// The environment variable the PIN is read from when no PIN file is given.
pub const PIN_ENV: &str = "LANDFALL_PKCS11_PIN";

const IV_LEN: usize = 12;
const TAG_BITS: u64 = 128;
const KEK_ID_LEN: usize = 16;

/// Where the token's user PIN comes from. Never the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PinSource {
    /// A file the owner alone may read (one trailing newline is dropped).
    File(PathBuf),
    /// An environment variable, by name.
    Env(String),
}

/// Which token, and which key in it, holds the key-encryption key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenKey {
    /// The PKCS#11 module (a shared library), e.g. `/usr/lib/softhsm/libsofthsm2.so`.
    pub module: PathBuf,
    /// The token's label.
    pub token_label: String,
    pub pin: PinSource,
    /// The key-encryption key's label.
    pub key_label: String,
}

#[derive(Debug, thiserror::Error)]
pub enum HsmError {
    #[error("cannot load the PKCS#11 module {}: {reason}", path.display())]
    Module { path: PathBuf, reason: String },
    #[error("no PKCS#11 token labelled {label:?} in {} (tokens there: {found})", module.display())]
    NoToken { label: String, module: PathBuf, found: String },
    #[error("no PIN for PKCS#11 token {token:?}: pass --pkcs11-pin-file or set {PIN_ENV}")]
    NoPin { token: String },
    #[error("the PIN file {}: {reason}", path.display())]
    PinFile { path: PathBuf, reason: String },
    #[error("PKCS#11 token {token:?} refused the PIN (wrong PIN)")]
    WrongPin { token: String },
    #[error("the user PIN of PKCS#11 token {token:?} is locked")]
    PinLocked { token: String },
    #[error("PKCS#11 token {token:?} holds no key labelled {label:?}: make it once with `landfall secrets hsm-init`")]
    NoKey { token: String, label: String },
    #[error(
        "PKCS#11 token {token:?} holds {count} keys labelled {label:?}: the key-encryption key's label must be unique"
    )]
    ManyKeys { token: String, label: String, count: usize },
    #[error("PKCS#11 token {token:?} already holds a key labelled {label:?}: it is made only once")]
    KeyExists { token: String, label: String },
    #[error(
        "key ring {path} was wrapped under key-encryption key {wanted}, but key {label:?} of PKCS#11 token \
         {token:?} is {held}: the ring belongs to another token's key; start with the token it was made with"
    )]
    OtherKek { path: String, wanted: String, held: String, token: String, label: String },
    #[error(
        "{from} line {line} does not open under key {label:?} of PKCS#11 token {token:?}: wrapped under another \
         key, or altered"
    )]
    Unwrap { from: String, line: usize, token: String, label: String },
    #[error("{from} line {line}: {what}")]
    BadRing { from: String, line: usize, what: String },
    #[error(
        "{from} is not a wrapped key ring (no `kek` line): a ring for a PKCS#11 token is made by `landfall secrets hsm-init`"
    )]
    NotWrapped { from: String },
    #[error(
        "key ring {} does not exist: make it and the key-encryption key once with `landfall secrets hsm-init`",
        path.display()
    )]
    NoRing { path: PathBuf },
    #[error("key ring {} exists already: hsm-init makes a new one only", path.display())]
    RingExists { path: PathBuf },
    #[error("the operating system's random source failed")]
    Random,
    #[error("PKCS#11 {what} on token {token:?}: {source}")]
    Token {
        what: &'static str,
        token: String,
        #[source]
        source: CkError,
    },
}

impl From<HsmError> for SecretError {
    fn from(e: HsmError) -> Self {
        SecretError::Hsm(Box::new(e))
    }
}

/// Loads the module once per process and initialises it: a second `C_Initialize`, or a
/// `C_Finalize` while another ring still uses the module, would break the rings of this process
/// that share it. Modules stay loaded until the process ends.
fn module(path: &Path) -> Result<Pkcs11, HsmError> {
    static LOADED: Mutex<Vec<(PathBuf, Pkcs11)>> = Mutex::new(Vec::new());
    let mut loaded = LOADED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, m)) = loaded.iter().find(|(p, _)| p == path) {
        return Ok(m.clone());
    }
    let failed = |e: CkError| HsmError::Module { path: path.to_path_buf(), reason: e.to_string() };
    if !path.is_file() {
        return Err(HsmError::Module { path: path.into(), reason: "no such file".into() });
    }
    let m = Pkcs11::new(path).map_err(failed)?;
    match m.initialize(CInitializeArgs::new(CInitializeFlags::OS_LOCKING_OK)) {
        Ok(()) | Err(CkError::Pkcs11(RvError::CryptokiAlreadyInitialized, _)) => {}
        Err(e) => return Err(failed(e)),
    }
    loaded.push((path.to_path_buf(), m.clone()));
    Ok(m)
}

impl PinSource {
    fn read(&self, token: &str) -> Result<AuthPin, HsmError> {
        let text = match self {
            PinSource::File(path) => {
                let failed = |reason: String| HsmError::PinFile { path: path.clone(), reason };
                bus_schema::runtime::private_file(path).map_err(failed)?;
                Zeroizing::new(std::fs::read_to_string(path).map_err(|e| failed(e.to_string()))?)
            }
            PinSource::Env(var) => match std::env::var(var) {
                Ok(pin) => Zeroizing::new(pin),
                Err(_) => return Err(HsmError::NoPin { token: token.into() }),
            },
        };
        let pin = text.strip_suffix('\n').map(|p| p.strip_suffix('\r').unwrap_or(p)).unwrap_or(&text);
        if pin.is_empty() {
            return Err(HsmError::NoPin { token: token.into() });
        }
        Ok(AuthPin::from(pin))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok()).collect()
}

/// What the associated data of a wrapped key says: which KEK wrapped it, for what.
fn aad(kek_id: &[u8]) -> Vec<u8> {
    [b"landfall data key\0".as_slice(), kek_id].concat()
}

/// The key-encryption key in a token, as a [`KeyWrap`]: every wrap and unwrap is done by the
/// token, in a session of its own that is closed after.
pub struct TokenKek {
    config: TokenKey,
    module: Pkcs11,
    pin: AuthPin,
}

impl fmt::Debug for TokenKek {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenKek").field("config", &self.config).finish_non_exhaustive()
    }
}

/// The key-encryption key, found in a logged-in session.
struct Found {
    handle: ObjectHandle,
    id: Vec<u8>,
}

impl TokenKek {
    /// Loads the module, finds the token, logs in and finds the key, so a wrong module, token,
    /// PIN or label is said now, not at the first seal.
    ///
    /// # Errors
    /// [`HsmError`] naming what is wrong.
    pub fn open(config: &TokenKey) -> Result<Self, HsmError> {
        let kek = Self::connect(config)?;
        kek.with_key(|_, _| Ok(()))?;
        Ok(kek)
    }

    fn connect(config: &TokenKey) -> Result<Self, HsmError> {
        let module = module(&config.module)?;
        let pin = config.pin.read(&config.token_label)?;
        Ok(Self { config: config.clone(), module, pin })
    }

    fn token_error(&self, what: &'static str) -> impl Fn(CkError) -> HsmError + '_ {
        move |source| HsmError::Token { what, token: self.config.token_label.clone(), source }
    }

    /// A session on the token, logged in as its user.
    fn session(&self, rw: bool) -> Result<Session, HsmError> {
        let token = &self.config.token_label;
        let slots = self.module.get_slots_with_token().map_err(self.token_error("list the slots"))?;
        let mut found = Vec::new();
        let mut slot = None;
        for s in slots {
            let info = self.module.get_token_info(s).map_err(self.token_error("read a token's info"))?;
            let label = info.label().trim_end().to_string();
            if label == *token {
                slot = Some(s);
                break;
            }
            if !label.is_empty() {
                found.push(format!("{label:?}"));
            }
        }
        let Some(slot) = slot else {
            let found = if found.is_empty() { "none".into() } else { found.join(", ") };
            return Err(HsmError::NoToken { label: token.clone(), module: self.config.module.clone(), found });
        };
        let session = if rw { self.module.open_rw_session(slot) } else { self.module.open_ro_session(slot) }
            .map_err(self.token_error("open a session"))?;
        match session.login(UserType::User, Some(&self.pin)) {
            Ok(()) | Err(CkError::Pkcs11(RvError::UserAlreadyLoggedIn, _)) => Ok(session),
            Err(CkError::Pkcs11(RvError::PinIncorrect | RvError::PinInvalid | RvError::PinLenRange, _)) => {
                Err(HsmError::WrongPin { token: token.clone() })
            }
            Err(CkError::Pkcs11(RvError::PinLocked, _)) => Err(HsmError::PinLocked { token: token.clone() }),
            Err(e) => Err(self.token_error("log in")(e)),
        }
    }

    /// The keys labelled so in a session.
    fn find(&self, session: &Session) -> Result<Vec<ObjectHandle>, HsmError> {
        let template = [
            Attribute::Class(ObjectClass::SECRET_KEY),
            Attribute::KeyType(KeyType::AES),
            Attribute::Label(self.config.key_label.as_bytes().to_vec()),
        ];
        session.find_objects(&template).map_err(self.token_error("find the key-encryption key"))
    }

    /// Runs `f` with a logged-in session and the key-encryption key.
    fn with_key<T>(&self, f: impl FnOnce(&Session, &Found) -> Result<T, HsmError>) -> Result<T, HsmError> {
        let session = self.session(false)?;
        let (token, label) = (&self.config.token_label, &self.config.key_label);
        let handle = match self.find(&session)?.as_slice() {
            [] => return Err(HsmError::NoKey { token: token.clone(), label: label.clone() }),
            [one] => *one,
            many => {
                return Err(HsmError::ManyKeys { token: token.clone(), label: label.clone(), count: many.len() });
            }
        };
        let attrs =
            session.get_attributes(handle, &[AttributeType::Id]).map_err(self.token_error("read the key's id"))?;
        let id = attrs.into_iter().find_map(|a| if let Attribute::Id(id) = a { Some(id) } else { None });
        f(&session, &Found { handle, id: id.unwrap_or_default() })
    }

    /// Makes the key-encryption key on the token: AES-256, generated there, sensitive and not
    /// extractable (its value can never be read out), usable only to encrypt and decrypt.
    ///
    /// # Errors
    /// [`HsmError::KeyExists`] when a key of that label is there already.
    pub fn create(config: &TokenKey) -> Result<Self, HsmError> {
        let kek = Self::connect(config)?;
        let session = kek.session(true)?;
        if !kek.find(&session)?.is_empty() {
            return Err(HsmError::KeyExists { token: config.token_label.clone(), label: config.key_label.clone() });
        }
        let mut id = [0u8; KEK_ID_LEN];
        getrandom::fill(&mut id).map_err(|_| HsmError::Random)?;
        let template = [
            Attribute::Class(ObjectClass::SECRET_KEY),
            Attribute::KeyType(KeyType::AES),
            Attribute::ValueLen(32.into()),
            Attribute::Token(true),
            Attribute::Private(true),
            Attribute::Sensitive(true),
            Attribute::Extractable(false),
            Attribute::Encrypt(true),
            Attribute::Decrypt(true),
            Attribute::Wrap(false),
            Attribute::Unwrap(false),
            Attribute::Label(config.key_label.as_bytes().to_vec()),
            Attribute::Id(id.to_vec()),
        ];
        session.generate_key(&Mechanism::AesKeyGen, &template).map_err(kek.token_error("make the key"))?;
        drop(session);
        Ok(kek)
    }

    fn unwrap_line(
        &self,
        session: &Session,
        kek: &Found,
        line: usize,
        fields: &[&str],
        from: &str,
    ) -> Result<Zeroizing<[u8; 32]>, HsmError> {
        let bad = |what: &str| HsmError::BadRing { from: from.into(), line, what: what.into() };
        let [iv, sealed] = fields else { return Err(bad("a `key` line holds an IV and a wrapped key")) };
        let mut iv = unhex(iv).filter(|iv| iv.len() == IV_LEN).ok_or_else(|| bad("the IV is not 24 hex digits"))?;
        let sealed = unhex(sealed).ok_or_else(|| bad("the wrapped key is not hex"))?;
        let aad = aad(&kek.id);
        let params = GcmParams::new(&mut iv, &aad, TAG_BITS.into()).map_err(self.token_error("unwrap a key"))?;
        let unwrap_failed = || HsmError::Unwrap {
            from: from.into(),
            line,
            token: self.config.token_label.clone(),
            label: self.config.key_label.clone(),
        };
        let plain = Zeroizing::new(
            session.decrypt(&Mechanism::AesGcm(params), kek.handle, &sealed).map_err(|_| unwrap_failed())?,
        );
        let key: [u8; 32] = plain.as_slice().try_into().map_err(|_| unwrap_failed())?;
        Ok(Zeroizing::new(key))
    }
}

impl KeyWrap for TokenKek {
    fn unwrap_keys(&self, text: &str, from: &str) -> Result<Vec<Zeroizing<[u8; 32]>>, SecretError> {
        self.with_key(|session, kek| {
            let mut wanted: Option<String> = None;
            let mut keys = Vec::new();
            for (n, line) in text.lines().enumerate() {
                let line = line.trim();
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                let bad = |what: &str| HsmError::BadRing { from: from.into(), line: n + 1, what: what.into() };
                let fields: Vec<&str> = line.split_whitespace().collect();
                match (fields[0], &wanted) {
                    ("kek", None) => {
                        let [_, id] = fields[..] else { return Err(bad("a `kek` line holds the key's id")) };
                        if id != hex(&kek.id) {
                            return Err(HsmError::OtherKek {
                                path: from.into(),
                                wanted: id.into(),
                                held: hex(&kek.id),
                                token: self.config.token_label.clone(),
                                label: self.config.key_label.clone(),
                            });
                        }
                        wanted = Some(id.into());
                    }
                    ("kek", Some(_)) => return Err(bad("a second `kek` line")),
                    ("key", Some(_)) => keys.push(self.unwrap_line(session, kek, n + 1, &fields[1..], from)?),
                    _ => return Err(HsmError::NotWrapped { from: from.into() }),
                }
            }
            if wanted.is_none() {
                return Err(HsmError::NotWrapped { from: from.into() });
            }
            Ok(keys)
        })
        .map_err(SecretError::from)
    }

    fn wrap_keys(&self, keys: &[&[u8; 32]]) -> Result<String, SecretError> {
        self.with_key(|session, kek| {
            let mut text = String::from(
                "# landfall data keys, wrapped under a key-encryption key held in a PKCS#11 token: they open\n\
                 # only there. The first seals, the others only open. Rotate with `landfall kubeconfig rotate-key`.\n",
            );
            text.push_str(&format!("kek {}\n", hex(&kek.id)));
            let aad = aad(&kek.id);
            for key in keys {
                let mut iv = [0u8; IV_LEN];
                getrandom::fill(&mut iv).map_err(|_| HsmError::Random)?;
                let shown = hex(&iv);
                let params = GcmParams::new(&mut iv, &aad, TAG_BITS.into()).map_err(self.token_error("wrap a key"))?;
                let sealed = session
                    .encrypt(&Mechanism::AesGcm(params), kek.handle, key.as_slice())
                    .map_err(self.token_error("wrap a key"))?;
                text.push_str(&format!("key {shown} {}\n", hex(&sealed)));
            }
            Ok(text)
        })
        .map_err(SecretError::from)
    }

    fn describe(&self) -> String {
        format!("key {:?} of PKCS#11 token {:?}", self.config.key_label, self.config.token_label)
    }
}

/// Opens the ring file `ring` with the token's key-encryption key.
///
/// # Errors
/// [`HsmError::NoRing`] when the file is missing; what [`TokenKek::open`] and
/// [`KeyRing::from_wrapped_file`] say.
pub fn open_ring(config: &TokenKey, ring: &Path) -> Result<KeyRing, SecretError> {
    if !ring.exists() {
        return Err(HsmError::NoRing { path: ring.into() }.into());
    }
    KeyRing::from_wrapped_file(ring, Box::new(TokenKek::open(config)?))
}

/// Makes the key-encryption key on the token and a new ring file wrapped under it, of the keys of
/// `import` (a hub's plain key ring, so what they sealed still opens) or else of one new data
/// key: once, for a hub that has neither.
///
/// # Errors
/// [`HsmError::RingExists`] when the ring file exists (checked first, so nothing is made);
/// [`HsmError::KeyExists`] when the token holds a key of that label.
pub fn init_ring(config: &TokenKey, ring: &Path, import: Option<&KeyRing>) -> Result<KeyRing, SecretError> {
    if ring.exists() {
        return Err(HsmError::RingExists { path: ring.into() }.into());
    }
    KeyRing::create_wrapped(ring, Box::new(TokenKek::create(config)?), import)
}

#[cfg(test)]
#[path = "pkcs11_tests.rs"]
mod tests;
