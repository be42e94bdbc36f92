//! `landfall login` and `landfall logout`: single sign-on with the identity provider an API
//! names, and the tokens kept for later commands.
//!
//! `login --api URL` reads `URL/v1/auth`, which names the provider and the CLI's client id, then
//! logs in with the device authorization grant (RFC 8628: it prints a page to open and a code to
//! enter there, on any device, and waits), or with `--browser` the authorization code grant with
//! PKCE on a loopback redirect (RFC 8252: a browser on this machine comes back to a port this
//! command listens on). The tokens are saved in `$XDG_CONFIG_HOME/landfall/credentials.json`
//! (else `~/.config/landfall/credentials.json`), one login per API URL, readable by the owner
//! only. [`bearer`] gives a command the access token for an API, refreshed when it is about to
//! expire.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// A saved token is refreshed when it expires within this many seconds.
const REFRESH_WITHIN: i64 = 60;
/// How long `--browser` waits for the browser to come back.
const BROWSER_WAIT: Duration = Duration::from_secs(300);
const DEVICE_GRANT: &str = "urn:ietf:params:oauth:grant-type:device_code";

#[derive(Debug, clap::Args)]
pub struct LoginArgs {
    /// The landfall API to log in to, e.g. https://landfall.example.com (its /v1/auth names the
    /// identity provider).
    #[arg(long, env = "LANDFALL_API")]
    pub api: String,
    /// Log in with a browser on this machine (it is sent back to a port this command listens on
    /// at 127.0.0.1), instead of with a code entered on any device.
    #[arg(long)]
    pub browser: bool,
}

#[derive(Debug, clap::Args)]
pub struct LogoutArgs {
    /// The API whose saved login to forget [default: every API's].
    #[arg(long, env = "LANDFALL_API")]
    pub api: Option<String>,
}

/// One API's saved login.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Saved {
    pub api: String,
    pub issuer: String,
    pub access_token: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_token: Option<String>,
    /// Seconds since the Unix epoch.
    pub expires_at: i64,
    /// What refreshing takes: the client the tokens were issued to, and where.
    pub client_id: String,
    pub token_endpoint: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Credentials {
    logins: Vec<Saved>,
}

/// What `/v1/auth` says about the identity provider (the fields the CLI uses).
struct Provider {
    issuer: String,
    client_id: String,
    scopes: String,
    token_endpoint: String,
    device_authorization_endpoint: Option<String>,
    authorization_endpoint: Option<String>,
}

/// `landfall login`.
pub async fn login(args: &LoginArgs) -> anyhow::Result<ExitCode> {
    let api = normalize(&args.api);
    let http = http()?;
    let provider = provider(&http, &api).await?;
    let tokens =
        if args.browser { browser_login(&http, &provider).await? } else { device_login(&http, &provider).await? };
    let saved = saved(&api, &provider.issuer, &provider.client_id, &provider.token_endpoint, &tokens, None)?;
    let who = claims(&saved.access_token)
        .and_then(|c| ["preferred_username", "email", "sub"].iter().find_map(|k| c[*k].as_str().map(str::to_string)));
    let path = save(saved)?;
    match who {
        Some(who) => eprintln!("Logged in to {api} as {who}."),
        None => eprintln!("Logged in to {api}."),
    }
    eprintln!("The tokens are saved in {}.", path.display());
    Ok(ExitCode::SUCCESS)
}

/// `landfall logout`: forgets the saved login (the identity provider still remembers the
/// sign-in until it ends it).
pub fn logout(args: &LogoutArgs) -> anyhow::Result<ExitCode> {
    let path = credentials_path()?;
    let mut creds = load(&path)?;
    let before = creds.logins.len();
    match &args.api {
        Some(api) => {
            let api = normalize(api);
            creds.logins.retain(|s| s.api != api);
            if creds.logins.len() == before {
                eprintln!("Not logged in to {api}.");
            } else {
                eprintln!("Logged out of {api}.");
            }
        }
        None => {
            creds.logins.clear();
            eprintln!("Logged out of {before} API{}.", if before == 1 { "" } else { "s" });
        }
    }
    write(&path, &creds)?;
    Ok(ExitCode::SUCCESS)
}

/// The saved access token for `api`, refreshed (and saved again) with the refresh token when it
/// expires within a minute; `Ok(None)` when not logged in to it.
///
/// # Errors
/// When the file cannot be read or written, or the token has expired and cannot be refreshed
/// (the message says to log in again).
pub async fn bearer(api: &str) -> anyhow::Result<Option<String>> {
    bearer_in(&credentials_path()?, api).await
}

/// [`bearer`] with the credentials file at `path`.
///
/// # Errors
/// As [`bearer`].
pub async fn bearer_in(path: &Path, api: &str) -> anyhow::Result<Option<String>> {
    let api = normalize(api);
    let Some(saved) = load(path)?.logins.into_iter().find(|s| s.api == api) else {
        return Ok(None);
    };
    let now = now();
    if saved.expires_at - now > REFRESH_WITHIN {
        return Ok(Some(saved.access_token));
    }
    let again = format!("run `landfall login --api {api}`");
    let Some(refresh_token) = saved.refresh_token.clone() else {
        if saved.expires_at > now {
            return Ok(Some(saved.access_token));
        }
        bail!("your login to {api} has expired and cannot be refreshed: {again}");
    };
    let http = http()?;
    let fields =
        [("grant_type", "refresh_token"), ("refresh_token", refresh_token.as_str()), ("client_id", &saved.client_id)];
    let refreshed = match token_request(&http, &saved.token_endpoint, &fields).await {
        Ok(Ok(tokens)) => tokens,
        Ok(Err(refused)) => bail!("your login to {api} could not be refreshed ({}): {again}", refused.describe()),
        Err(e) if saved.expires_at > now => {
            tracing::warn!(
                error = format!("{e:#}"),
                "cannot refresh the login to {api}; its token still works for now"
            );
            return Ok(Some(saved.access_token));
        }
        Err(e) => return Err(e.context(format!("your login to {api} has expired and cannot be refreshed"))),
    };
    let renewed =
        self::saved(&api, &saved.issuer, &saved.client_id, &saved.token_endpoint, &refreshed, Some(refresh_token))?;
    let token = renewed.access_token.clone();
    save_in(path, renewed)?;
    Ok(Some(token))
}

/// `$XDG_CONFIG_HOME/landfall/credentials.json`, else `~/.config/landfall/credentials.json`.
pub fn credentials_path() -> anyhow::Result<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    let config = match (var("XDG_CONFIG_HOME"), var("HOME")) {
        (Some(dir), _) if dir.is_absolute() => dir,
        (_, Some(home)) => home.join(".config"),
        _ => bail!("no place for the credentials: set XDG_CONFIG_HOME or HOME"),
    };
    Ok(config.join("landfall").join("credentials.json"))
}

fn normalize(api: &str) -> String {
    api.trim().trim_end_matches('/').to_string()
}

fn now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// The HTTP client of the commands that speak to the API or the identity provider.
pub(super) fn http() -> anyhow::Result<reqwest::Client> {
    // reqwest is built without a crypto provider; ring's is the one the workspace builds.
    let _ = async_nats::rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(30))
        .build()
        .context("build the http client")
}

async fn get_json(http: &reqwest::Client, url: &str) -> anyhow::Result<Value> {
    let r = http
        .get(url)
        .header(reqwest::header::ACCEPT, "application/json")
        .send()
        .await
        .with_context(|| format!("GET {url}"))?;
    let status = r.status();
    let body = r.bytes().await.with_context(|| format!("GET {url}"))?;
    if !status.is_success() {
        bail!("GET {url}: {status}: {}", String::from_utf8_lossy(&body).chars().take(300).collect::<String>());
    }
    serde_json::from_slice(&body).with_context(|| format!("GET {url}: the answer is not JSON"))
}

fn form(fields: &[(&str, &str)]) -> String {
    let mut url = reqwest::Url::parse("form:").expect("a URL");
    url.query_pairs_mut().extend_pairs(fields);
    url.query().unwrap_or_default().to_string()
}

/// An OAuth error response (RFC 6749 §5.2).
struct OAuthError {
    error: String,
    description: Option<String>,
}

impl OAuthError {
    fn describe(&self) -> String {
        match &self.description {
            Some(d) => format!("{}: {d}", self.error),
            None => self.error.clone(),
        }
    }
}

/// POSTs a form to an OAuth endpoint: the JSON answer, or the OAuth error it refused with.
async fn oauth_post(
    http: &reqwest::Client,
    url: &str,
    fields: &[(&str, &str)],
) -> anyhow::Result<Result<Value, OAuthError>> {
    let r = http
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header(reqwest::header::ACCEPT, "application/json")
        .body(form(fields))
        .send()
        .await
        .with_context(|| format!("POST {url}"))?;
    let status = r.status();
    let body = r.bytes().await.with_context(|| format!("POST {url}"))?;
    let json: Option<Value> = serde_json::from_slice(&body).ok();
    if status.is_success() {
        return json.map(Ok).with_context(|| format!("POST {url}: the answer is not JSON"));
    }
    match json.as_ref().and_then(|j| j["error"].as_str()) {
        Some(error) => Ok(Err(OAuthError {
            error: error.to_string(),
            description: json.as_ref().and_then(|j| j["error_description"].as_str()).map(str::to_string),
        })),
        None => bail!("POST {url}: {status}: {}", String::from_utf8_lossy(&body).chars().take(300).collect::<String>()),
    }
}

/// Tokens from a token endpoint answer.
struct Tokens {
    access_token: String,
    refresh_token: Option<String>,
    expires_in: i64,
}

async fn token_request(
    http: &reqwest::Client,
    url: &str,
    fields: &[(&str, &str)],
) -> anyhow::Result<Result<Tokens, OAuthError>> {
    Ok(match oauth_post(http, url, fields).await? {
        Ok(v) => Ok(Tokens {
            access_token: v["access_token"].as_str().context("the token endpoint sent no access_token")?.to_string(),
            refresh_token: v["refresh_token"].as_str().map(str::to_string),
            expires_in: v["expires_in"].as_i64().unwrap_or(300),
        }),
        Err(e) => Err(e),
    })
}

fn saved(
    api: &str,
    issuer: &str,
    client_id: &str,
    token_endpoint: &str,
    t: &Tokens,
    old_refresh: Option<String>,
) -> anyhow::Result<Saved> {
    Ok(Saved {
        api: api.to_string(),
        issuer: issuer.to_string(),
        access_token: t.access_token.clone(),
        // A provider that does not rotate refresh tokens sends none back: the old one stays good.
        refresh_token: t.refresh_token.clone().or(old_refresh),
        expires_at: now() + t.expires_in,
        client_id: client_id.to_string(),
        token_endpoint: token_endpoint.to_string(),
    })
}

/// The claims of a JWT, unverified: only to say whom the CLI logged in as.
fn claims(token: &str) -> Option<Value> {
    let payload = token.split('.').nth(1)?;
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).ok()?).ok()
}

/// Reads `/v1/auth`, and the provider's discovery document for what it leaves out.
async fn provider(http: &reqwest::Client, api: &str) -> anyhow::Result<Provider> {
    let auth = get_json(http, &format!("{api}/v1/auth")).await.with_context(|| format!("is {api} a landfall API?"))?;
    let oidc = match auth.get("oidc") {
        Some(Value::Object(o)) => o.clone(),
        Some(Value::Null) => bail!("{api} does not use single sign-on: use a token it was given instead"),
        _ => bail!("{api}/v1/auth does not say how to log in (no \"oidc\")"),
    };
    let text = |name: &str| oidc.get(name).and_then(Value::as_str).map(str::to_string);
    let issuer = text("issuer").context("/v1/auth names no issuer")?;
    // The API may not have reached the provider yet: its endpoints then come from discovery.
    let discovery = if text("token_endpoint").is_none() {
        let url = format!("{}/.well-known/openid-configuration", issuer.trim_end_matches('/'));
        get_json(http, &url).await.context("the identity provider's discovery document")?
    } else {
        Value::Null
    };
    let endpoint = |name: &str| text(name).or_else(|| discovery[name].as_str().map(str::to_string));
    Ok(Provider {
        client_id: text("cli_client").unwrap_or_else(|| "landfall-cli".into()),
        scopes: text("scopes").unwrap_or_else(|| "openid offline_access".into()),
        token_endpoint: endpoint("token_endpoint").context("the identity provider has no token endpoint")?,
        device_authorization_endpoint: endpoint("device_authorization_endpoint"),
        authorization_endpoint: endpoint("authorization_endpoint"),
        issuer,
    })
}

async fn device_login(http: &reqwest::Client, p: &Provider) -> anyhow::Result<Tokens> {
    let Some(endpoint) = &p.device_authorization_endpoint else {
        bail!("the identity provider has no device authorization endpoint: log in with --browser");
    };
    let grant = match oauth_post(http, endpoint, &[("client_id", &p.client_id), ("scope", &p.scopes)]).await? {
        Ok(g) => g,
        Err(e) => bail!("the identity provider refused to start a device login: {}", e.describe()),
    };
    let field = |name: &str| grant[name].as_str().with_context(|| format!("the device authorization has no {name}"));
    let (device_code, user_code, uri) = (field("device_code")?, field("user_code")?, field("verification_uri")?);
    match grant["verification_uri_complete"].as_str() {
        Some(complete) => eprintln!("To log in, open {complete}\n  (or open {uri} and enter the code {user_code})"),
        None => eprintln!("To log in, open {uri} and enter the code {user_code}"),
    }
    eprintln!("Waiting for the login to be approved…");
    let mut interval = Duration::from_secs(grant["interval"].as_u64().unwrap_or(5).max(1));
    let deadline = Instant::now() + Duration::from_secs(grant["expires_in"].as_u64().unwrap_or(600));
    let fields = [("grant_type", DEVICE_GRANT), ("device_code", device_code), ("client_id", &p.client_id)];
    loop {
        if Instant::now() + interval > deadline {
            bail!("the code {user_code} expired before the login was approved: run `landfall login` again");
        }
        tokio::time::sleep(interval).await;
        match token_request(http, &p.token_endpoint, &fields).await? {
            Ok(tokens) => return Ok(tokens),
            Err(e) if e.error == "authorization_pending" => {}
            Err(e) if e.error == "slow_down" => interval += Duration::from_secs(5),
            Err(e) if e.error == "access_denied" => bail!("the login was denied"),
            Err(e) if e.error == "expired_token" => bail!("the code {user_code} expired: run `landfall login` again"),
            Err(e) => bail!("the identity provider refused the login: {}", e.describe()),
        }
    }
}

fn random_b64(bytes: usize) -> anyhow::Result<String> {
    let mut b = vec![0u8; bytes];
    getrandom::fill(&mut b).map_err(|e| anyhow::anyhow!("no randomness from the OS: {e}"))?;
    Ok(URL_SAFE_NO_PAD.encode(b))
}

async fn browser_login(http: &reqwest::Client, p: &Provider) -> anyhow::Result<Tokens> {
    let Some(authorization_endpoint) = &p.authorization_endpoint else {
        bail!("the identity provider has no authorization endpoint: log in without --browser");
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.context("listen on 127.0.0.1 for the browser")?;
    let redirect_uri = format!("http://127.0.0.1:{}/callback", listener.local_addr()?.port());
    let verifier = random_b64(32)?;
    let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()));
    let state = random_b64(16)?;
    let mut url = reqwest::Url::parse(authorization_endpoint).context("the authorization endpoint is not a URL")?;
    url.query_pairs_mut().extend_pairs([
        ("client_id", p.client_id.as_str()),
        ("response_type", "code"),
        ("redirect_uri", &redirect_uri),
        ("scope", &p.scopes),
        ("code_challenge", &challenge),
        ("code_challenge_method", "S256"),
        ("state", &state),
    ]);
    if p.scopes.split(' ').any(|s| s == "offline_access") {
        // OpenID Connect issues a refresh token in this flow only when consent is asked for.
        url.query_pairs_mut().append_pair("prompt", "consent");
    }
    eprintln!("To log in, open this page in a browser on this machine:\n  {url}");

    let (tx, mut rx) = tokio::sync::mpsc::channel::<Answer>(1);
    let app = axum::Router::new().route("/callback", axum::routing::get(callback)).with_state(tx);
    let stop = tokio_util::sync::CancellationToken::new();
    let shutdown = stop.clone();
    let server =
        tokio::spawn(
            async move { axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned()).await },
        );
    let answer = tokio::time::timeout(BROWSER_WAIT, rx.recv()).await;
    stop.cancel();
    let _ = server.await;
    let q = match answer {
        Ok(Some(q)) => q,
        _ => bail!("the browser did not come back within {} minutes", BROWSER_WAIT.as_secs() / 60),
    };
    if let Some(error) = q.get("error") {
        let description = q.get("error_description").map(|d| format!(": {d}")).unwrap_or_default();
        bail!("the identity provider refused the login ({error}{description})");
    }
    if q.get("state") != Some(&state) {
        bail!(
            "the browser came back with another login's answer (state differs): run `landfall login --browser` again"
        );
    }
    if let Some(iss) = q.get("iss")
        && iss != &p.issuer
    {
        bail!("the answer came from {iss:?}, not from the identity provider {:?}", p.issuer);
    }
    let code = q.get("code").context("the browser came back without a code")?;
    let fields = [
        ("grant_type", "authorization_code"),
        ("code", code.as_str()),
        ("redirect_uri", &redirect_uri),
        ("client_id", &p.client_id),
        ("code_verifier", &verifier),
    ];
    match token_request(http, &p.token_endpoint, &fields).await? {
        Ok(tokens) => Ok(tokens),
        Err(e) => bail!("the identity provider refused the code: {}", e.describe()),
    }
}

/// The query the browser comes back with.
type Answer = std::collections::HashMap<String, String>;

/// The loopback redirect's page: hands the answer to the waiting login.
async fn callback(
    axum::extract::State(tx): axum::extract::State<tokio::sync::mpsc::Sender<Answer>>,
    axum::extract::Query(q): axum::extract::Query<Answer>,
) -> axum::response::Html<&'static str> {
    let done = q.contains_key("code");
    let _ = tx.send(q).await;
    axum::response::Html(if done {
        "<p>landfall: you are logged in; this page can be closed.</p>"
    } else {
        "<p>landfall: the login did not succeed; see the terminal.</p>"
    })
}

fn load(path: &Path) -> anyhow::Result<Credentials> {
    match std::fs::read(path) {
        Ok(bytes) => {
            serde_json::from_slice(&bytes).with_context(|| format!("{} is not a credentials file", path.display()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Credentials::default()),
        Err(e) => Err(e).with_context(|| format!("read {}", path.display())),
    }
}

/// Saves one API's login in place of the one it had; returns the file's path.
fn save(login: Saved) -> anyhow::Result<PathBuf> {
    let path = credentials_path()?;
    save_in(&path, login)?;
    Ok(path)
}

fn save_in(path: &Path, login: Saved) -> anyhow::Result<()> {
    let mut creds = load(path)?;
    creds.logins.retain(|s| s.api != login.api);
    creds.logins.push(login);
    write(path, &creds)
}

/// Writes the file atomically (a new file, owner-only, renamed over the old one), or removes it
/// when it would hold no login.
fn write(path: &Path, creds: &Credentials) -> anyhow::Result<()> {
    use std::io::Write;

    if creds.logins.is_empty() {
        return match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).with_context(|| format!("remove {}", path.display()))
            }
            _ => Ok(()),
        };
    }
    let dir = path.parent().context("the credentials file has no directory")?;
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir).with_context(|| format!("create {}", dir.display()))?;
    let tmp = dir.join(format!(".credentials.json.{}.tmp", std::process::id()));
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let result = (|| {
        let mut file = options.open(&tmp)?;
        // A file left by a crash may have been made with other permissions.
        #[cfg(unix)]
        file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
        file.write_all(&serde_json::to_vec_pretty(creds)?)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.with_context(|| format!("write {}", path.display()))
}
