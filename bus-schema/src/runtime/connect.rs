//! Connecting to the bus: who the process is ([`Access`]), the connection ([`Bus`]), and the
//! check that the server is new enough and has JetStream.

use std::time::Duration;

use async_nats::jetstream;
use tracing::{debug, info, warn};

use super::error::{BusError, boxed};
use super::version::server_supported;
use crate::names;

/// How a process proves who it is to NATS and what it trusts, and where its JetStream is.
///
/// The default is an anonymous plain-text connection to the JetStream of the server connected
/// to, which is what a single local server and the tests use.
#[derive(Clone, Default)]
pub struct Access {
    /// The user's nkey seed (`SU…`): the server knows only its public key.
    pub nkey_seed: Option<String>,
    /// Verify the server's certificate with this CA (PEM), and require TLS.
    pub ca_file: Option<std::path::PathBuf>,
    /// A client certificate and its key (PEM), for servers that verify clients.
    pub client_cert: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// The JetStream domain to use: a site gateway connected to its site's leaf node names the
    /// hub's domain, so its consumer and its events are the hub's.
    pub js_domain: Option<String>,
    /// A credential and the key that proves it, asked for at each connection (a site's link or
    /// identity credential, which its gateway renews): replaces `nkey_seed`.
    pub presented: Option<std::sync::Arc<dyn Presented>>,
    /// The site this connection speaks for (a gateway's): the commands and events it sends say
    /// a gateway sent them ([`names::Origin::Gateway`]), and the answers to its requests come to
    /// the site's inbox ([`names::site_inbox`]), both among the site's own subjects.
    pub site: Option<String>,
    /// The connection's read buffer, in bytes, when not the client's 64 KiB: a process that
    /// holds thousands of connections (simulated gateways) keeps them smaller. Longer
    /// messages still arrive whole: the buffer grows for them.
    pub read_buffer: Option<u16>,
}

/// What a connection presents when the hub's identity service lets it in: asked at every
/// (re)connection, so renewed credentials are used from the next one on.
pub trait Presented: Send + Sync + 'static {
    /// The credential, and the key that signs the server's nonce; `None` when there is none
    /// yet (the connection then fails and is tried again).
    fn present(&self) -> Option<(String, std::sync::Arc<nkeys::KeyPair>)>;
    /// Where the connection's replies come (a site's inbox, whichever of its keys connects).
    fn inbox_prefix(&self) -> String;
}

/// One credential presented with one key, replies under `inbox_prefix`.
pub struct Fixed {
    pub credential: String,
    pub key: std::sync::Arc<nkeys::KeyPair>,
    pub inbox_prefix: String,
}

impl Presented for Fixed {
    fn present(&self) -> Option<(String, std::sync::Arc<nkeys::KeyPair>)> {
        Some((self.credential.clone(), self.key.clone()))
    }

    fn inbox_prefix(&self) -> String {
        self.inbox_prefix.clone()
    }
}

/// Options that present what `presented` holds at each (re)connection, replies at its inbox.
pub fn presenting(presented: std::sync::Arc<dyn Presented>) -> async_nats::ConnectOptions {
    let inbox = presented.inbox_prefix();
    async_nats::ConnectOptions::with_auth_callback(move |nonce| {
        let presented = presented.clone();
        async move {
            let (credential, key) = presented
                .present()
                .ok_or_else(|| async_nats::AuthError::new("no credential to present: not enrolled, or expired"))?;
            crate::credentials::auth(&credential, &key, &nonce)
        }
    })
    .custom_inbox_prefix(inbox)
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access")
            .field("nkey", &self.public_key().ok().flatten())
            .field("ca_file", &self.ca_file)
            .field("client_cert", &self.client_cert)
            .field("js_domain", &self.js_domain)
            .field("site", &self.site)
            .finish()
    }
}

impl Access {
    /// The public key of the nkey seed, if there is one.
    ///
    /// # Errors
    /// When the seed is not a user nkey seed.
    pub fn public_key(&self) -> Result<Option<String>, String> {
        let Some(seed) = &self.nkey_seed else { return Ok(None) };
        let pair = nkeys::KeyPair::from_seed(seed.trim()).map_err(|e| format!("not an nkey seed: {e}"))?;
        if !pair.public_key().starts_with('U') {
            return Err("the nkey seed is not a user's (a user seed starts with SU)".into());
        }
        Ok(Some(pair.public_key()))
    }

    /// Reads the seed from a file (one line, `SU…`; other lines, such as comments, are skipped).
    ///
    /// # Errors
    /// When the file cannot be read or holds no seed.
    pub fn seed_from_file(path: &std::path::Path) -> Result<String, String> {
        private_file(path)?;
        let text = zeroize::Zeroizing::new(
            std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?,
        );
        text.lines()
            .map(str::trim)
            .find(|l| l.starts_with("SU"))
            .map(String::from)
            .ok_or_else(|| format!("{} holds no user nkey seed (a line starting with SU)", path.display()))
    }
}

/// Refuses a key file that anyone but its owner may read or write, saying how to fix it: a key
/// others can read is a key others have.
///
/// # Errors
/// The refusal, naming the file, its mode and the `chmod` that fixes it.
pub fn private_file(path: &std::path::Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).map_err(|e| format!("reading {}: {e}", path.display()))?.permissions().mode();
    if mode & 0o077 != 0 {
        return Err(format!(
            "{} holds a key and others may read or write it (mode {:o}); make it the owner's alone: chmod 600 {}",
            path.display(),
            mode & 0o777,
            path.display()
        ));
    }
    Ok(())
}

/// How long a connection waits before its `attempts`-th try to reach a server: nothing before
/// the first, then a random share ("full jitter") of a bound that starts at 100 ms and doubles
/// up to 8 s.
///
/// Ten thousand gateways lose the hub at the same moment when it restarts. Without jitter
/// (async-nats doubles from 2 ms to 4 s by default) they all try again at the same moments and
/// arrive together; with it, once the hub is back they come back spread over the last bound,
/// about a thousand a second, and the hub keeps answering meanwhile.
pub fn reconnect_delay(attempts: usize) -> Duration {
    if attempts == 0 {
        return Duration::ZERO;
    }
    let exp = attempts.saturating_sub(1).min(7) as u32;
    let bound = (100u64 << exp).min(8_000);
    Duration::from_millis(jitter(bound))
}

/// A number from 0 to `bound`, from the random bits of a UUIDv7.
pub(super) fn jitter(bound: u64) -> u64 {
    (uuid::Uuid::now_v7().as_u128() as u64) % (bound + 1)
}

/// A connection to the bus.
#[derive(Clone)]
pub struct Bus {
    client: async_nats::Client,
    js: jetstream::Context,
    url: String,
    /// Where this connection's replies arrive: `_INBOX_<key>` for a user with a key, the site's
    /// inbox for a gateway.
    inbox_prefix: String,
    js_domain: Option<String>,
    /// Whether the connected server runs JetStream of its own (a relay in front of the hub does
    /// not: every JetStream request crosses to the hub's domain).
    local_js: bool,
    /// Who the commands and events it sends say sent them.
    origin: names::Origin,
    /// Who asked, on what it publishes whose envelope names no one (`names::headers::ACTOR`):
    /// `nats:<user's public key>` for a user with a key, `service:<connection name>` else.
    actor: std::sync::Arc<str>,
    /// The region below this core its commands are for ([`Bus::in_region`]).
    region: Option<std::sync::Arc<str>>,
    /// How the hub's jobs reach sites ([`super::JobDelivery`]).
    job_delivery: super::JobDelivery,
}

impl Bus {
    /// Connects and checks that the server is new enough and has JetStream.
    ///
    /// # Errors
    /// [`BusError::Connect`] when the server cannot be reached, [`BusError::ServerTooOld`] for a
    /// server older than [`super::MIN_SERVER_VERSION`], [`BusError::NoJetStream`] without JetStream.
    pub async fn connect(url: &str, name: &str) -> Result<Self, BusError> {
        Self::connect_inner(url, name, true, &Access::default()).await
    }

    /// [`Bus::connect`] as a user, over TLS, or to another JetStream domain.
    pub async fn connect_with(url: &str, name: &str, access: &Access) -> Result<Self, BusError> {
        Self::connect_inner(url, name, true, access).await
    }

    /// Like [`Bus::connect_with`], but fails at once when the server does not answer, instead
    /// of waiting for it to come up: for command-line clients, not services.
    pub async fn connect_client(url: &str, name: &str, access: &Access) -> Result<Self, BusError> {
        Self::connect_inner(url, name, false, access).await
    }

    async fn connect_inner(url: &str, name: &str, patient: bool, access: &Access) -> Result<Self, BusError> {
        let bad = |reason: String| BusError::Connect { url: url.to_string(), source: reason.into() };
        let mut options = match &access.presented {
            Some(presented) => presenting(presented.clone()).name(name),
            None => async_nats::ConnectOptions::new().name(name),
        };
        if patient {
            options = options.retry_on_initial_connect();
        }
        let mut inbox_prefix = crate::access::INBOX_PREFIX.to_string();
        let mut actor = format!("service:{name}");
        if let Some(presented) = &access.presented {
            inbox_prefix = presented.inbox_prefix();
        } else if let Some(key) = access.public_key().map_err(bad)? {
            inbox_prefix = crate::access::inbox(&key);
            actor = format!("nats:{key}");
            options =
                options.nkey(access.nkey_seed.clone().unwrap_or_default()).custom_inbox_prefix(inbox_prefix.clone());
        }
        let origin = match &access.site {
            Some(site) => {
                inbox_prefix = names::site_inbox(site);
                options = options.custom_inbox_prefix(inbox_prefix.clone());
                names::Origin::Gateway
            }
            None => names::Origin::Hub,
        };
        if let Some(ca) = &access.ca_file {
            if !ca.is_file() {
                return Err(bad(format!("the CA file {} does not exist", ca.display())));
            }
            options = options.add_root_certificates(ca.clone()).require_tls(true);
        }
        if let Some((cert, key)) = &access.client_cert {
            options = options.add_client_certificate(cert.clone(), key.clone());
        }
        if let Some(bytes) = access.read_buffer {
            options = options.read_buffer_capacity(bytes);
        }
        let (connected_tx, mut connected_rx) = tokio::sync::watch::channel(false);
        let client = options
            .max_reconnects(None)
            .reconnect_delay_callback(reconnect_delay)
            .connection_timeout(Duration::from_secs(5))
            .request_timeout(Some(Duration::from_secs(10)))
            .event_callback(move |event| {
                let connected = connected_tx.clone();
                async move {
                    match event {
                        async_nats::Event::Disconnected => warn!("nats disconnected"),
                        async_nats::Event::Connected => {
                            connected.send_replace(true);
                            info!("nats connected")
                        }
                        // A permission violation, say: the server refused what this user may not do.
                        async_nats::Event::ServerError(e) => warn!(error = %e, "the nats server refused a request"),
                        other => debug!(%other, "nats event"),
                    }
                }
            });
        // A cluster is given as its servers' URLs, comma-separated (as `NATS_URL` usually is).
        let servers: Vec<&str> = url.split(',').map(str::trim).filter(|u| !u.is_empty()).collect();
        let client = tokio::time::timeout(Duration::from_secs(20), client.connect(servers))
            .await
            .map_err(|e| BusError::Connect { url: url.to_string(), source: boxed(e) })?
            .map_err(|e| BusError::Connect { url: url.to_string(), source: boxed(e) })?;
        // With retry_on_initial_connect the server info arrives with the first connection. It is
        // looked for as soon as the connection says it is up (the client stores it a moment
        // after), else every 20 ms: a fixed 20 ms poll cost each of 10,000 gateways starting at
        // once that much.
        let mut info = client.server_info();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while info.version.is_empty() && tokio::time::Instant::now() < deadline {
            if *connected_rx.borrow_and_update() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            } else {
                let _ = tokio::time::timeout(Duration::from_millis(20), connected_rx.changed()).await;
            }
            info = client.server_info();
        }
        if info.version.is_empty() {
            return Err(BusError::Connect {
                url: url.to_string(),
                source: "no answer from the server within 20 s".into(),
            });
        }
        if !server_supported(&info.version) {
            return Err(BusError::ServerTooOld { url: url.to_string(), found: info.version });
        }
        // A client that names a JetStream domain reaches it across leaf links: the server it
        // connects to (a relay in front of the hub) may have none of its own.
        if !info.jetstream && access.js_domain.is_none() {
            return Err(BusError::NoJetStream { url: url.to_string() });
        }
        let js = match &access.js_domain {
            Some(domain) => jetstream::with_domain(client.clone(), domain),
            None => jetstream::new(client.clone()),
        };
        // The hub's own domain named on the hub (a gateway connected to the hub directly, whose
        // user reaches the hub's JetStream through its domain only) is the server's own.
        let js_domain = access.js_domain.clone().filter(|d| info.domain.as_deref() != Some(d.as_str()));
        let local_js = info.jetstream;
        Ok(Self {
            client,
            js,
            url: url.to_string(),
            inbox_prefix,
            js_domain,
            local_js,
            origin,
            actor: actor.into(),
            region: None,
            job_delivery: super::JobDelivery::from_env().map_err(bad)?,
        })
    }

    /// This connection, saying `actor` asked for what it publishes whose envelope names no one.
    pub fn with_actor(mut self, actor: &str) -> Self {
        self.actor = actor.into();
        self
    }

    /// Who this connection says asked for what it publishes (see [`Bus::with_actor`]).
    pub fn actor(&self) -> &str {
        &self.actor
    }

    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    pub fn jetstream(&self) -> &jetstream::Context {
        &self.js
    }

    /// The JetStream domain [`Bus::jetstream`] names, when not the connected server's own: a
    /// gateway on its site's leaf node names the hub's.
    pub fn js_domain(&self) -> Option<&str> {
        self.js_domain.as_deref()
    }

    /// Whether the server this connection reached runs JetStream of its own: a site's leaf node
    /// does, a relay in front of the hub does not.
    pub fn has_local_jetstream(&self) -> bool {
        self.local_js
    }

    /// The JetStream of the server this connection reached, in its own domain: a gateway's
    /// site's leaf node, whatever [`Bus::jetstream`] names.
    pub fn local_jetstream(&self) -> jetstream::Context {
        jetstream::new(self.client.clone())
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The prefix of this connection's reply subjects (`_INBOX_<key>`, or `_INBOX` without a key;
    /// a gateway's site's inbox).
    pub fn inbox_prefix(&self) -> &str {
        &self.inbox_prefix
    }

    /// Who the commands and events this connection sends say sent them.
    pub fn origin(&self) -> names::Origin {
        self.origin
    }

    /// This connection, its commands and events sent as a site's gateway's: what a gateway
    /// uses whichever access it connected with (one connection may carry many simulated sites).
    pub fn as_gateway(&self) -> Bus {
        Bus { origin: names::Origin::Gateway, ..self.clone() }
    }

    /// This connection to a core (`deploy core-config`) as a client of `region`'s hub: its
    /// JetStream (buckets, streams, consumers) is the region's, reached through the region's
    /// domain across its link, and the commands it publishes are kept at the core for the
    /// region (`landfall.region.<region>.cmd.…`, [`names::to_region`]), whose commands stream
    /// takes them under their own subjects. Only JetStream crosses the link: a request to a site
    /// (a kubeconfig, a drift check) does not reach the region's sites from here.
    pub fn in_region(&self, region: &str) -> Bus {
        let domain = crate::access::region_domain(region);
        Bus {
            js: jetstream::with_domain(self.client.clone(), &domain),
            js_domain: Some(domain),
            local_js: false,
            region: Some(region.into()),
            ..self.clone()
        }
    }

    /// This connection, the hub's jobs reaching sites as `how` says: what the orchestrator and
    /// a gateway read to know which way (by default, [`super::JobDelivery::ENV`]).
    pub fn with_job_delivery(mut self, how: super::JobDelivery) -> Self {
        self.job_delivery = how;
        self
    }

    /// How the hub's jobs reach sites (see [`Bus::with_job_delivery`]).
    pub fn job_delivery(&self) -> super::JobDelivery {
        self.job_delivery
    }

    /// Where a message on `subject` is published from this connection: a command for a region
    /// at the core goes to what the core keeps for that region.
    pub(super) fn published_on(&self, subject: String) -> String {
        match &self.region {
            Some(region) => names::to_region(&subject, region).unwrap_or(subject),
            None => subject,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnect_delays_are_spread_under_a_bound_that_doubles_to_eight_seconds() {
        assert_eq!(reconnect_delay(0), Duration::ZERO);
        for (attempts, bound) in [(1, 100), (2, 200), (4, 800), (7, 6_400), (8, 8_000), (1000, 8_000)] {
            let delays: Vec<u64> = (0..200).map(|_| reconnect_delay(attempts).as_millis() as u64).collect();
            assert!(delays.iter().all(|&d| d <= bound), "attempt {attempts}: {delays:?} over {bound}");
            let (min, max) = (delays.iter().min().unwrap(), delays.iter().max().unwrap());
            assert!(max - min > bound / 2, "attempt {attempts}: spread only {min}..{max} of 0..{bound}");
        }
    }
}
