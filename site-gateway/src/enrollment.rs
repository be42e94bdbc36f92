//! A gateway's side of its site's identity: asking to join, the credentials it connects with,
//! and renewing them before they expire.
//!
//! The gateway holds an identity key (see the identity module for where it lives) and, in its
//! credentials directory:
//! - `identity.jwt`: the identity key's credential, issued on approval (it lets the key connect
//!   only to ask for new link credentials);
//! - `link.creds`: the current link credential and the seed of its short-lived link key, in the
//!   NATS credentials file format, so the site's leaf node reads the same file for its link to
//!   the hub (mode 0600; renewed, never the identity key).
//!
//! Every connection presents the link credential while it is valid, else the identity
//! credential ([`SiteKeys`] is a [`Presented`]), so a site cut off past its link credentials'
//! expiry reconnects with its identity and renews them without a person, unless it was revoked.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use bus_schema::credentials::{self, Credential};
use bus_schema::names;
use bus_schema::pb;
use bus_schema::runtime::{Access, Fixed, Presented};
use prost::Message;
use tokio_util::sync::CancellationToken;

/// How often a waiting gateway asks again whether its request to join was decided.
pub const ASK_EVERY: Duration = Duration::from_secs(5);
/// How often the renewal loop looks at the link credentials' expiry, at most.
const LOOK_EVERY: Duration = Duration::from_secs(30);

const IDENTITY_FILE: &str = "identity.jwt";
const LINK_FILE: &str = "link.creds";

/// A link credential and its key.
#[derive(Clone)]
struct Link {
    credential: String,
    key: Arc<nkeys::KeyPair>,
    issued_unix_s: i64,
    expires_unix_s: i64,
}

/// The site's identity key and the credentials it holds.
pub struct SiteKeys {
    site: String,
    identity: Arc<nkeys::KeyPair>,
    dir: PathBuf,
    identity_credential: Mutex<Option<String>>,
    link: Mutex<Option<Link>>,
}

use crate::alive::now_ms;

fn now_s() -> i64 {
    now_ms() / 1000
}

/// A credential's claims, as issued (the hub checks the signature; the gateway reads what it
/// holds).
fn claims(credential: &str) -> anyhow::Result<Credential> {
    Ok(credentials::decode_jwt::<Credential>(credential).map_err(|e| anyhow::anyhow!("{e}"))?.0)
}

impl SiteKeys {
    /// The credentials kept in `dir` for `identity`, if the site was enrolled.
    ///
    /// # Errors
    /// A file there that cannot be read or does not parse, or one issued to another key.
    pub fn load(dir: &Path, identity: Arc<nkeys::KeyPair>) -> anyhow::Result<Option<Arc<SiteKeys>>> {
        let path = dir.join(IDENTITY_FILE);
        let Ok(text) = std::fs::read_to_string(&path) else { return Ok(None) };
        let credential = text.trim().to_string();
        let c = claims(&credential).with_context(|| format!("{}", path.display()))?;
        if c.sub != identity.public_key() {
            bail!("{} was issued to another identity key than this gateway's", path.display());
        }
        let keys = SiteKeys {
            site: c.landfall.site,
            identity,
            dir: dir.to_path_buf(),
            identity_credential: Mutex::new(Some(credential)),
            link: Mutex::new(None),
        };
        if let Ok(text) = std::fs::read_to_string(dir.join(LINK_FILE)) {
            let link = parse_creds(&text).with_context(|| format!("{}", dir.join(LINK_FILE).display()))?;
            *keys.link.lock().expect("not poisoned") = Some(link);
        }
        Ok(Some(Arc::new(keys)))
    }

    pub fn site(&self) -> &str {
        &self.site
    }

    pub fn identity_key(&self) -> String {
        self.identity.public_key()
    }

    /// When the link credentials expire (unix seconds), if there are any.
    pub fn link_expires(&self) -> Option<i64> {
        self.link.lock().expect("not poisoned").as_ref().map(|l| l.expires_unix_s)
    }

    /// Whether the link credentials are gone, expired, or have less than a third of their
    /// life left.
    pub fn link_due(&self) -> bool {
        let now = now_s();
        match &*self.link.lock().expect("not poisoned") {
            None => true,
            Some(l) => l.expires_unix_s - now < (l.expires_unix_s - l.issued_unix_s) / 3,
        }
    }

    /// How long until the link credentials are due (a third of their life left), at most
    /// [`LOOK_EVERY`], at least a tenth of a second.
    fn until_due(&self) -> Duration {
        let now = now_s();
        let due = match &*self.link.lock().expect("not poisoned") {
            None => return Duration::from_millis(100),
            Some(l) => l.expires_unix_s - (l.expires_unix_s - l.issued_unix_s) / 3,
        };
        Duration::from_secs(due.saturating_sub(now).max(0) as u64).clamp(Duration::from_millis(100), LOOK_EVERY)
    }

    /// `base` (its TLS, its JetStream domain) connecting as this site: presenting these
    /// credentials, with no nkey of its own.
    pub fn access(self: &Arc<Self>, base: Access) -> Access {
        Access { presented: Some(self.clone() as Arc<dyn Presented>), nkey_seed: None, ..base }
    }

    fn keep_link(&self, credential: String, key: nkeys::KeyPair) -> anyhow::Result<()> {
        let c = claims(&credential)?;
        let seed = key.seed().map_err(|e| anyhow::anyhow!("{e}"))?;
        write_private(&self.dir.join(LINK_FILE), credentials::creds_file(&credential, &seed).as_bytes())?;
        *self.link.lock().expect("not poisoned") = Some(Link {
            credential,
            key: Arc::new(key),
            issued_unix_s: c.iat,
            expires_unix_s: c.exp.unwrap_or(i64::MAX),
        });
        Ok(())
    }

    /// New link credentials from the hub, asked on `bus` (connected as the site, with either
    /// credential) with the identity key's signature.
    ///
    /// # Errors
    /// The hub refused (the site revoked, say) or did not answer.
    pub async fn renew(&self, bus: &async_nats::Client) -> anyhow::Result<()> {
        let link = nkeys::KeyPair::new_user();
        let at = now_ms();
        let message = credentials::renewal_message(&self.site, &link.public_key(), at);
        let signature = self.identity.sign(&message).map_err(|e| anyhow::anyhow!("{e}"))?;
        let request =
            pb::RenewRequest { site_id: self.site.clone(), link_key: link.public_key(), at_unix_ms: at, signature };
        let answer = ask(bus, names::identity_renew(&self.site), request.encode_to_vec()).await?;
        let reply = pb::RenewReply::decode(answer.as_slice()).context("the hub's renewal answer")?;
        self.keep_link(reply.link_credential, link)?;
        tracing::info!(site = %self.site, "link credentials renewed");
        Ok(())
    }
}

impl Presented for SiteKeys {
    fn present(&self) -> Option<(String, Arc<nkeys::KeyPair>)> {
        let link = self.link.lock().expect("not poisoned").clone();
        match link {
            Some(l) if l.expires_unix_s > now_s() => Some((l.credential, l.key)),
            _ => Some((self.identity_credential.lock().expect("not poisoned").clone()?, self.identity.clone())),
        }
    }

    fn inbox_prefix(&self) -> String {
        names::site_inbox(&self.site)
    }
}

/// Writes `bytes` to `path` readable by its owner only, whole or not at all (a leaf node reading
/// the link credentials meanwhile reads the old file or the new one).
fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("new");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("write {}", tmp.display()))?;
    f.write_all(bytes).and_then(|()| f.sync_all()).with_context(|| format!("write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("write {}", path.display()))
}

/// A credentials file's credential and key.
fn parse_creds(text: &str) -> anyhow::Result<Link> {
    let credential = text
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("eyJ"))
        .context("no credential in the credentials file")?
        .to_string();
    let seed = text.lines().map(str::trim).find(|l| l.starts_with("SU")).context("no key in the credentials file")?;
    let key = nkeys::KeyPair::from_seed(seed).map_err(|e| anyhow::anyhow!("{e}"))?;
    let c = claims(&credential)?;
    Ok(Link { credential, key: Arc::new(key), issued_unix_s: c.iat, expires_unix_s: c.exp.unwrap_or(i64::MAX) })
}

/// A core request's answer, or the hub's refusal as an error.
async fn ask(client: &async_nats::Client, subject: String, body: Vec<u8>) -> anyhow::Result<Vec<u8>> {
    let answer = tokio::time::timeout(Duration::from_secs(10), client.request(subject.clone(), body.into()))
        .await
        .with_context(|| format!("no answer on {subject} within 10 s"))?
        .with_context(|| format!("request on {subject}"))?;
    if let Some(why) = answer.headers.as_ref().and_then(|h| h.get(names::headers::REPLY_ERROR)) {
        bail!("the hub refused: {}", bus_schema::runtime::reply_error_text(why.as_str()));
    }
    Ok(answer.payload.to_vec())
}

/// What a gateway reports about its machine when it asks to join.
pub fn machine_facts() -> HashMap<String, String> {
    let mut facts = HashMap::new();
    let read = |path: &str| std::fs::read_to_string(path).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
    for (fact, path) in [
        ("hostname", "/proc/sys/kernel/hostname"),
        ("machine_id", "/etc/machine-id"),
        ("product_serial", "/sys/class/dmi/id/product_serial"),
        ("product_name", "/sys/class/dmi/id/product_name"),
        ("board_serial", "/sys/class/dmi/id/board_serial"),
    ] {
        if let Some(value) = read(path) {
            facts.insert(fact.to_string(), value);
        }
    }
    facts.insert("cpus".into(), std::thread::available_parallelism().map_or(0, |n| n.get()).to_string());
    facts.insert("tpm".into(), Path::new("/dev/tpmrm0").exists().to_string());
    facts
}

/// Where a request to join stands, as the hub answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Asked {
    Pending,
    Denied(String),
}

/// Asks the hub at `url` to let `identity` join as `site`, with the bootstrap credential
/// `bootstrap`, asking again every [`ASK_EVERY`] until an operator (or the hub's rule) decides:
/// the site's keys when approved (kept in `dir`), the refusal when denied. `on_pending` is
/// called once while it waits.
///
/// # Errors
/// The hub cannot be reached, refuses the bootstrap credential or the request, or `shutdown`.
#[allow(clippy::too_many_arguments)]
pub async fn enroll(
    url: &str,
    bootstrap: &str,
    site: &str,
    facts: HashMap<String, String>,
    identity: Arc<nkeys::KeyPair>,
    dir: &Path,
    on_pending: impl FnOnce(),
    shutdown: CancellationToken,
) -> anyhow::Result<Result<Arc<SiteKeys>, Asked>> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let client = connect_presenting(
        url,
        "landfall-gateway-enroll",
        bootstrap.trim().to_string(),
        identity.clone(),
        bus_schema::access::inbox(&identity.public_key()),
    )
    .await?;
    let link = nkeys::KeyPair::new_user();
    let request = pb::EnrollRequest { site_id: site.to_string(), facts, link_key: link.public_key() };
    let mut on_pending = Some(on_pending);
    loop {
        let answer = ask(&client, names::identity_enroll(&identity.public_key()), request.encode_to_vec()).await?;
        let reply = pb::EnrollReply::decode(answer.as_slice()).context("the hub's answer to the request to join")?;
        match pb::EnrollmentState::try_from(reply.state).unwrap_or_default() {
            pb::EnrollmentState::Approved => {
                write_private(&dir.join(IDENTITY_FILE), reply.identity_credential.as_bytes())?;
                let keys = SiteKeys {
                    site: site.to_string(),
                    identity,
                    dir: dir.to_path_buf(),
                    identity_credential: Mutex::new(Some(reply.identity_credential)),
                    link: Mutex::new(None),
                };
                keys.keep_link(reply.link_credential, link)?;
                let _ = client.drain().await;
                return Ok(Ok(Arc::new(keys)));
            }
            pb::EnrollmentState::Denied => return Ok(Err(Asked::Denied(reply.reason))),
            pb::EnrollmentState::Pending => {
                if let Some(f) = on_pending.take() {
                    f();
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => bail!("stopped while waiting for the request to join to be decided"),
            _ = tokio::time::sleep(ASK_EVERY) => {}
        }
    }
}

/// A plain connection presenting `credential` with `key`'s proof (a bootstrap credential
/// asking to join; a site's credential renewing), replies under `inbox_prefix`.
async fn connect_presenting(
    url: &str,
    name: &str,
    credential: String,
    key: Arc<nkeys::KeyPair>,
    inbox_prefix: String,
) -> anyhow::Result<async_nats::Client> {
    let servers: Vec<&str> = url.split(',').map(str::trim).filter(|u| !u.is_empty()).collect();
    bus_schema::runtime::presenting(Arc::new(Fixed { credential, key, inbox_prefix }))
        .name(name)
        .connect(servers)
        .await
        .with_context(|| format!("connect to {url} (is the credential valid, and the identity service running?)"))
}

/// New link credentials for a site that has none valid (cut off past their expiry): asked
/// over a connection to the hub at `url` that presents the identity credential.
///
/// # Errors
/// As [`SiteKeys::renew`], or the identity connection refused (the site revoked).
pub async fn renew_with_identity(url: &str, keys: &SiteKeys) -> anyhow::Result<()> {
    let credential =
        keys.identity_credential.lock().expect("not poisoned").clone().context("no identity credential")?;
    renew_presenting(url, keys, credential, keys.identity.clone()).await
}

/// New link credentials, asked over a connection of its own to `url` (the hub, or the site's
/// leaf node while its link holds) presenting the current link credential, or the identity
/// credential once that expired.
///
/// # Errors
/// As [`SiteKeys::renew`].
pub async fn renew_now(url: &str, keys: &SiteKeys) -> anyhow::Result<()> {
    let (credential, key) = keys.present().context("no credential to present")?;
    renew_presenting(url, keys, credential, key).await
}

async fn renew_presenting(
    url: &str,
    keys: &SiteKeys,
    credential: String,
    key: Arc<nkeys::KeyPair>,
) -> anyhow::Result<()> {
    let inbox = names::site_inbox(&keys.site);
    let client = connect_presenting(url, "landfall-gateway-renew", credential, key, inbox).await?;
    let renewed = keys.renew(&client).await;
    let _ = client.drain().await;
    renewed
}

/// Renews the link credentials whenever a third of their life is left, until `shutdown`:
/// through `via` (the gateway's own server: the hub, or its leaf node while the leaf's link holds),
/// else straight at the hub (`hub`; a leaf node whose link credentials expired has no link to
/// ask through).
pub async fn keep_renewed(via: String, hub: String, keys: Arc<SiteKeys>, shutdown: CancellationToken) {
    loop {
        if keys.link_due() {
            let mut renewed = renew_now(&via, &keys).await;
            if renewed.is_err() && hub != via {
                renewed = renew_now(&hub, &keys).await;
            }
            if let Err(e) = renewed {
                tracing::warn!(site = %keys.site, error = %format!("{e:#}"), "cannot renew the link credentials yet");
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(keys.until_due()) => {}
        }
    }
}
