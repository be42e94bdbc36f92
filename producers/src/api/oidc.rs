//! OpenID Connect single sign-on for the API: the access tokens of one identity provider (the
//! issuer), JWTs naming the API as their audience, are checked here without asking the provider
//! about each one.
//!
//! [`Verifier::start`] reads the provider's discovery document and its signing keys (the JWK Set
//! at `jwks_uri`). A token signed by a key not yet known (a new `kid`) makes it fetch the set
//! again, at most once every [`REFETCH_AT_MOST_EVERY`] so that made-up tokens cannot make the API
//! hammer the provider; the set is also refreshed every [`REFRESH_EVERY`] in the background, so
//! keys the provider dropped stop working. While the provider cannot be reached, the keys already
//! fetched keep working; if it has never been reached (it was down when the API started), the
//! API still starts, tokens are refused until it answers, and it is tried again in the
//! background.
//!
//! Signatures are checked with ring ([`jwt`]); the claims must name the issuer exactly and the
//! audience, and be within their time bounds ([`LEEWAY`] either side for clocks that differ).

mod jwt;
#[cfg(test)]
mod tests;

use std::sync::{Arc, RwLock, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use jwt::{Expect, Jwk, KeyCheck};

/// How often the signing keys are fetched again in the background.
pub const REFRESH_EVERY: Duration = Duration::from_secs(600);
/// A token with an unknown key id fetches the keys again at most this often.
pub const REFETCH_AT_MOST_EVERY: Duration = Duration::from_secs(10);
/// Clock difference allowed between the provider and the API, in seconds.
pub const LEEWAY: i64 = 30;
/// While the provider has never answered, it is tried again after 1 s, then less and less often
/// down to this.
const RETRY_AT_MOST: Duration = Duration::from_secs(30);
/// One request to the provider.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);

/// Which identity provider's tokens the API accepts, and what clients need to log in with it.
#[derive(Debug, Clone, clap::Args)]
pub struct OidcArgs {
    /// The OpenID Connect issuer whose access tokens the API accepts (its discovery document is
    /// read from <issuer>/.well-known/openid-configuration).
    #[arg(long = "oidc-issuer", env = "LANDFALL_OIDC_ISSUER")]
    pub issuer: Option<String>,
    /// The audience the access tokens must name (required with --oidc-issuer).
    #[arg(long = "oidc-audience", env = "LANDFALL_OIDC_AUDIENCE")]
    pub audience: Option<String>,
    /// The client id the dashboard logs in with (a public client: authorization code with PKCE).
    #[arg(
        long = "oidc-dashboard-client",
        env = "LANDFALL_OIDC_DASHBOARD_CLIENT",
        default_value = "landfall-dashboard"
    )]
    pub dashboard_client: String,
    /// The client id `landfall login` uses (a public native client: device authorization, or
    /// authorization code with PKCE on a loopback redirect).
    #[arg(long = "oidc-cli-client", env = "LANDFALL_OIDC_CLI_CLIENT", default_value = "landfall-cli")]
    pub cli_client: String,
    /// The access token claim that lists the person's groups.
    #[arg(long = "oidc-groups-claim", env = "LANDFALL_OIDC_GROUPS_CLAIM", default_value = "groups")]
    pub groups_claim: String,
    /// The scopes clients ask for when they log in.
    #[arg(
        long = "oidc-scopes",
        env = "LANDFALL_OIDC_SCOPES",
        default_value = "openid profile email groups offline_access"
    )]
    pub scopes: String,
}

impl OidcArgs {
    /// `issuer` and `audience` with every other setting at its default.
    pub fn new(issuer: impl Into<String>, audience: impl Into<String>) -> Self {
        OidcArgs {
            issuer: Some(issuer.into()),
            audience: Some(audience.into()),
            dashboard_client: "landfall-dashboard".into(),
            cli_client: "landfall-cli".into(),
            groups_claim: "groups".into(),
            scopes: "openid profile email groups offline_access".into(),
        }
    }
}

/// Who a verified access token speaks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// `sub`: stable, unique at the issuer.
    pub subject: String,
    /// For people to read: `preferred_username`, else `email`, else `sub`.
    pub name: String,
    /// The groups claim's strings (empty when the token has none).
    pub groups: Vec<String>,
    /// `exp`, in seconds since the Unix epoch.
    pub expires_at: i64,
}

/// Why a token was refused: a sentence for the client, which never contains the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

/// Checks access tokens of one issuer. Cheap to clone; all clones share the keys.
#[derive(Clone)]
pub struct Verifier {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier").field("issuer", &self.inner.issuer).field("audience", &self.inner.audience).finish()
    }
}

struct Inner {
    issuer: String,
    audience: String,
    dashboard_client: String,
    cli_client: String,
    groups_claim: String,
    scopes: String,
    http: reqwest::Client,
    known: RwLock<Known>,
    /// Held while the provider is asked, so that requests that all miss a key wait for one
    /// fetch rather than each making their own; it holds when a token with an unknown key id
    /// last made the verifier ask.
    fetching: tokio::sync::Mutex<Option<Instant>>,
}

/// What has been read from the provider.
#[derive(Default)]
struct Known {
    endpoints: Option<Endpoints>,
    keys: Arc<Vec<Jwk>>,
}

/// The discovery document's fields the API and its clients use.
#[derive(Debug, Clone)]
struct Endpoints {
    jwks_uri: String,
    authorization_endpoint: Option<String>,
    token_endpoint: Option<String>,
    device_authorization_endpoint: Option<String>,
    end_session_endpoint: Option<String>,
}

impl Verifier {
    /// Reads discovery and the JWKS; `Ok(None)` when no issuer is configured.
    ///
    /// A provider that does not answer is not an error: the verifier refuses tokens until it
    /// does, and keeps trying in the background.
    ///
    /// # Errors
    /// When the settings are wrong: an issuer without an audience, or an issuer that is not an
    /// http(s) URL.
    pub async fn start(args: &OidcArgs) -> anyhow::Result<Option<Verifier>> {
        let Some(issuer) = args.issuer.as_deref().map(str::trim).filter(|i| !i.is_empty()) else {
            return Ok(None);
        };
        let Some(audience) = args.audience.as_deref().map(str::trim).filter(|a| !a.is_empty()) else {
            bail!("--oidc-audience is required with --oidc-issuer: the audience the API's access tokens name");
        };
        let url = reqwest::Url::parse(issuer).with_context(|| format!("--oidc-issuer {issuer:?} is not a URL"))?;
        if !matches!(url.scheme(), "https" | "http") || url.query().is_some() || url.fragment().is_some() {
            bail!("--oidc-issuer {issuer:?} must be an http(s) URL without a query or fragment");
        }
        if url.scheme() == "http" && !matches!(url.host_str(), Some("127.0.0.1" | "localhost" | "[::1]")) {
            tracing::warn!(issuer, "the OpenID Connect issuer is plain http: its keys can be changed on the way");
        }
        // reqwest is built without a crypto provider and asks for the process's default even for
        // plain http; ring's is the one the workspace builds.
        let _ = async_nats::rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(HTTP_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .context("build the http client for the identity provider")?;
        let inner = Arc::new(Inner {
            issuer: issuer.to_string(),
            audience: audience.to_string(),
            dashboard_client: args.dashboard_client.clone(),
            cli_client: args.cli_client.clone(),
            groups_claim: args.groups_claim.clone(),
            scopes: args.scopes.clone(),
            http,
            known: RwLock::new(Known::default()),
            fetching: tokio::sync::Mutex::new(None),
        });
        match inner.fetch().await {
            Ok(keys) => tracing::info!(issuer, keys, "OpenID Connect: the identity provider's keys are read"),
            Err(e) => tracing::warn!(
                issuer,
                error = format!("{e:#}"),
                "OpenID Connect: the identity provider cannot be read; its tokens are refused until it answers (retrying)"
            ),
        }
        tokio::spawn(refresh_in_background(Arc::downgrade(&inner)));
        Ok(Some(Verifier { inner }))
    }

    /// Checks an access token: its signature by one of the provider's keys, its issuer,
    /// audience and times; returns whom it speaks for.
    ///
    /// # Errors
    /// [`Refused`], saying why, for any token that is not good now.
    pub async fn verify(&self, token: &str) -> Result<Identity, Refused> {
        let token = jwt::split(token).map_err(Refused)?;
        let claims = match token.check(&self.keys()?) {
            KeyCheck::Verified(claims) => claims,
            KeyCheck::Refused(why) => return Err(Refused(why)),
            KeyCheck::UnknownKid => {
                self.inner.refetch_for_unknown_kid().await;
                match token.check(&self.keys()?) {
                    KeyCheck::Verified(claims) => claims,
                    KeyCheck::Refused(why) => return Err(Refused(why)),
                    KeyCheck::UnknownKid => {
                        return Err(Refused(format!(
                            "the token's signing key {} is not one the identity provider publishes",
                            jwt::shown(token.kid.as_deref().unwrap_or_default())
                        )));
                    }
                }
            }
        };
        let want = Expect { issuer: &self.inner.issuer, audience: &self.inner.audience, now: now(), leeway: LEEWAY };
        let expires_at = jwt::check_claims(&claims, &want).map_err(Refused)?;
        let text = |name: &str| claims.get(name).and_then(Value::as_str).filter(|s| !s.is_empty());
        let subject = text("sub").ok_or_else(|| Refused("the token names no subject (sub)".into()))?;
        let name = text("preferred_username").or_else(|| text("email")).unwrap_or(subject);
        let groups = match claims.get(&self.inner.groups_claim) {
            Some(Value::Array(groups)) => groups.iter().filter_map(Value::as_str).map(str::to_string).collect(),
            Some(Value::String(group)) => vec![group.clone()],
            _ => Vec::new(),
        };
        Ok(Identity { subject: subject.to_string(), name: name.to_string(), groups, expires_at })
    }

    /// What clients need to log in: `{"issuer", "audience", "dashboard_client", "cli_client",
    /// "scopes", "authorization_endpoint", "token_endpoint", "device_authorization_endpoint",
    /// "end_session_endpoint"}` (the endpoints are null until the provider has been read).
    pub fn public_config(&self) -> Value {
        let i = &self.inner;
        let endpoints = i.known.read().unwrap_or_else(|e| e.into_inner()).endpoints.clone();
        let e = endpoints.as_ref();
        json!({
            "issuer": i.issuer,
            "audience": i.audience,
            "dashboard_client": i.dashboard_client,
            "cli_client": i.cli_client,
            "scopes": i.scopes,
            "authorization_endpoint": e.and_then(|e| e.authorization_endpoint.clone()),
            "token_endpoint": e.and_then(|e| e.token_endpoint.clone()),
            "device_authorization_endpoint": e.and_then(|e| e.device_authorization_endpoint.clone()),
            "end_session_endpoint": e.and_then(|e| e.end_session_endpoint.clone()),
        })
    }

    /// The issuer whose tokens are accepted.
    pub fn issuer(&self) -> &str {
        &self.inner.issuer
    }

    fn keys(&self) -> Result<Arc<Vec<Jwk>>, Refused> {
        let known = self.inner.known.read().unwrap_or_else(|e| e.into_inner());
        match known.endpoints {
            Some(_) => Ok(known.keys.clone()),
            None => Err(Refused("the identity provider has not been reached yet".into())),
        }
    }
}

impl Inner {
    /// Reads discovery and the key set, and keeps them; returns how many keys there are. On
    /// failure what was read before stays.
    async fn fetch(&self) -> anyhow::Result<usize> {
        let _one_at_a_time = self.fetching.lock().await;
        self.fetch_now().await
    }

    async fn fetch_now(&self) -> anyhow::Result<usize> {
        let endpoints = self.discover().await?;
        let doc = self.get_json(&endpoints.jwks_uri).await.context("the identity provider's signing keys")?;
        let keys = jwt::parse_jwks(&doc).map_err(anyhow::Error::msg).context("the identity provider's signing keys")?;
        let n = keys.len();
        let mut known = self.known.write().unwrap_or_else(|e| e.into_inner());
        *known = Known { endpoints: Some(endpoints), keys: Arc::new(keys) };
        Ok(n)
    }

    async fn discover(&self) -> anyhow::Result<Endpoints> {
        let url = format!("{}/.well-known/openid-configuration", self.issuer.trim_end_matches('/'));
        let doc = self.get_json(&url).await.context("the identity provider's discovery document")?;
        let field = |name: &str| doc.get(name).and_then(Value::as_str).map(str::to_string);
        let issuer = field("issuer").unwrap_or_default();
        if issuer != self.issuer {
            bail!("{url} names the issuer {issuer:?}, not {:?} (they must be equal)", self.issuer);
        }
        let jwks_uri = field("jwks_uri").with_context(|| format!("{url} has no jwks_uri"))?;
        Ok(Endpoints {
            jwks_uri,
            authorization_endpoint: field("authorization_endpoint"),
            token_endpoint: field("token_endpoint"),
            device_authorization_endpoint: field("device_authorization_endpoint"),
            end_session_endpoint: field("end_session_endpoint"),
        })
    }

    async fn get_json(&self, url: &str) -> anyhow::Result<Value> {
        let response = self
            .http
            .get(url)
            .header(reqwest::header::ACCEPT, "application/json")
            .send()
            .await
            .with_context(|| format!("GET {url}"))?;
        let status = response.status();
        if !status.is_success() {
            bail!("GET {url}: {status}");
        }
        let body = response.bytes().await.with_context(|| format!("GET {url}"))?;
        serde_json::from_slice(&body).with_context(|| format!("GET {url}: not JSON"))
    }

    /// A token named a key not in the set: fetch the set again, unless a token did that within
    /// [`REFETCH_AT_MOST_EVERY`] (the start and the background refreshes do not count).
    async fn refetch_for_unknown_kid(&self) {
        let mut last = self.fetching.lock().await;
        if last.is_some_and(|t| t.elapsed() < REFETCH_AT_MOST_EVERY) {
            return;
        }
        *last = Some(Instant::now());
        match self.fetch_now().await {
            Ok(keys) => {
                tracing::info!(issuer = %self.issuer, keys, "OpenID Connect: signing keys fetched again for a new key id")
            }
            Err(e) => tracing::warn!(
                issuer = %self.issuer,
                error = format!("{e:#}"),
                "OpenID Connect: cannot fetch the signing keys again; the ones already read stay"
            ),
        }
    }
}

/// Refreshes the keys every [`REFRESH_EVERY`], or retries discovery until it first answers; ends
/// when the last [`Verifier`] is dropped.
async fn refresh_in_background(inner: Weak<Inner>) {
    let mut retry = Duration::from_secs(1);
    loop {
        let reached = match inner.upgrade() {
            Some(i) => i.known.read().unwrap_or_else(|e| e.into_inner()).endpoints.is_some(),
            None => return,
        };
        tokio::time::sleep(if reached { REFRESH_EVERY } else { retry }).await;
        let Some(i) = inner.upgrade() else { return };
        match i.fetch().await {
            Ok(keys) if !reached => {
                tracing::info!(issuer = %i.issuer, keys, "OpenID Connect: the identity provider answers; its keys are read");
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(issuer = %i.issuer, error = format!("{e:#}"), "OpenID Connect: cannot read the identity provider");
                retry = (retry * 2).min(RETRY_AT_MOST);
            }
        }
    }
}

fn now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}
