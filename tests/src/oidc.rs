//! A real OpenID Connect provider per test (oidc-provider under Node.js, `tests/oidc/provider.mjs`)
//! and real tokens from it, obtained through the real flows over HTTP: what a person does in the
//! provider's pages (sign in, enter a device's code) is done here by submitting the pages' forms.
//!
//! ```text
//! let idp = Provider::start(&[User::new("alice", "pw", &["eu-ops"])], Options::default()).await;
//! let tokens = device_login(&idp, "alice", "pw").await;       // as `landfall login` does
//! let tokens = code_login(&idp, "alice", "pw", redirect).await; // as the dashboard does
//! idp.restart_with_keys(&[Provider::new_key().await]).await;  // the signing key rotated
//! ```
//!
//! oidc-provider is loaded from `$LANDFALL_OIDC_MODULES` (`scripts/ensure-oidc-provider` installs
//! it and prints the directory; `scripts/test` sets it). The provider listens on 127.0.0.1 on a
//! port it picks, is killed when dropped, and logs to `<dir>/provider.log`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use producers::embedded::tied;
use reqwest::header::{self, HeaderMap};
use reqwest::{Method, StatusCode, Url};
use serde::Serialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tempfile::TempDir;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/oidc/provider.mjs");
/// The API's audience, which the provider makes every access token for unless told otherwise.
pub const AUDIENCE: &str = "urn:landfall:api";
pub const DASHBOARD_CLIENT: &str = "landfall-dashboard";
pub const CLI_CLIENT: &str = "landfall-cli";
pub const SCOPES: &str = "openid profile email groups offline_access";
const DEVICE_GRANT: &str = "urn:ietf:params:oauth:grant-type:device_code";

/// A person the provider knows; they sign in with `sub` and `password`.
#[derive(Debug, Clone, Serialize)]
pub struct User {
    pub sub: String,
    pub password: String,
    pub name: String,
    pub email: String,
    pub groups: Vec<String>,
}

impl User {
    /// `sub` with `password` and `groups`, named after the sub, mail at example.test.
    pub fn new(sub: &str, password: &str, groups: &[&str]) -> User {
        User {
            sub: sub.into(),
            password: password.into(),
            name: sub.to_uppercase(),
            email: format!("{sub}@example.test"),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        }
    }
}

/// How the provider is started.
#[derive(Debug, Clone)]
pub struct Options {
    /// Lifetime of access tokens.
    pub access_token_ttl: Duration,
    /// The audience access tokens are for.
    pub audience: String,
    /// The dashboard client's redirect URIs (its origins may call the token endpoint).
    pub dashboard_redirect_uris: Vec<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            access_token_ttl: Duration::from_secs(600),
            audience: AUDIENCE.into(),
            dashboard_redirect_uris: vec!["http://127.0.0.1:8080/".into()],
        }
    }
}

/// Tokens from the provider's token endpoint.
#[derive(Debug, Clone)]
pub struct TokenSet {
    pub access_token: String,
    pub refresh_token: Option<String>,
    pub id_token: Option<String>,
    pub expires_in: u64,
}

/// A running provider; killed when dropped.
pub struct Provider {
    dir: TempDir,
    port: u16,
    issuer: String,
    options: Options,
    keys: Vec<Value>,
    child: Option<Child>,
}

/// Where oidc-provider is; a clear failure, never a skip, when it is not installed.
pub fn modules() -> PathBuf {
    const HOW: &str = "run `export LANDFALL_OIDC_MODULES=\"$(scripts/ensure-oidc-provider)\"` (it installs \
                       oidc-provider with npm into the cache), or run the suite with scripts/test";
    crate::node::modules("LANDFALL_OIDC_MODULES", "oidc-provider", HOW)
}

impl Provider {
    /// Starts a provider that knows `users`, signing with one new RSA key, and waits until its
    /// discovery document answers.
    ///
    /// # Panics
    /// When oidc-provider is not installed (see [`modules`]) or the provider does not start.
    pub async fn start(users: &[User], options: Options) -> Provider {
        modules();
        let dir = tempfile::Builder::new().prefix("landfall-oidc-").tempdir().expect("a temp dir");
        std::fs::write(dir.path().join("users.json"), serde_json::to_vec(users).unwrap()).expect("write users.json");
        let keys = vec![Provider::new_key().await];
        let mut provider = Provider { dir, port: 0, issuer: String::new(), options, keys, child: None };
        provider.run().await;
        provider
    }

    /// A new RS256 private JWK, with its own kid.
    pub async fn new_key() -> Value {
        let out = tokio::process::Command::new("node")
            .args([SCRIPT, "--new-key"])
            .output()
            .await
            .expect("run node (the OpenID Connect tests need Node.js >= 20)");
        assert!(out.status.success(), "provider.mjs --new-key: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("a JWK")
    }

    /// `http://127.0.0.1:<port>`.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// The private keys it signs with, the first one first.
    pub fn keys(&self) -> &[Value] {
        &self.keys
    }

    /// The kid of a private JWK.
    pub fn kid(key: &Value) -> &str {
        key["kid"].as_str().expect("a kid")
    }

    pub fn options(&self) -> &Options {
        &self.options
    }

    /// Stops the provider and starts it again on the same port with `keys` (the first one
    /// signs); what it held in memory (sign-ins, refresh tokens) is gone.
    pub async fn restart_with_keys(&mut self, keys: &[Value]) {
        self.stop();
        self.keys = keys.to_vec();
        self.run().await;
    }

    /// Kills the provider (its port stays reserved for [`Provider::restart_with_keys`]).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("provider.log")).unwrap_or_default()
    }

    async fn run(&mut self) {
        let dir = self.dir.path();
        let keys = json!({ "keys": self.keys });
        std::fs::write(dir.join("keys.json"), serde_json::to_vec(&keys).unwrap()).expect("write keys.json");
        let stdout = dir.join("provider.out");
        let _ = std::fs::remove_file(&stdout);
        let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("provider.log")).unwrap();
        let mut cmd = tied::command("node");
        cmd.arg(SCRIPT).args(["--port", &self.port.to_string()]);
        cmd.arg("--users").arg(dir.join("users.json")).arg("--keys").arg(dir.join("keys.json"));
        cmd.args(["--access-token-ttl", &self.options.access_token_ttl.as_secs().max(1).to_string()]);
        cmd.args(["--audience", &self.options.audience]);
        for uri in &self.options.dashboard_redirect_uris {
            cmd.args(["--dashboard-redirect-uri", uri]);
        }
        cmd.env("LANDFALL_OIDC_MODULES", modules()).env_remove("DEBUG");
        cmd.stdin(Stdio::null()).stdout(std::fs::File::create(&stdout).unwrap()).stderr(log);
        self.child = Some(tied::spawn(cmd).expect("start node"));

        let deadline = Instant::now() + Duration::from_secs(30);
        let issuer = loop {
            let printed = std::fs::read_to_string(&stdout).unwrap_or_default();
            if let Some(issuer) = printed.lines().find_map(|l| l.strip_prefix("issuer ")) {
                break issuer.trim().to_string();
            }
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("the OpenID Connect provider exited ({status}):\n{}", self.log());
            }
            assert!(Instant::now() < deadline, "the OpenID Connect provider did not start:\n{}", self.log());
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        self.port = issuer.rsplit(':').next().and_then(|p| p.parse().ok()).expect("the issuer's port");
        self.issuer = issuer;
        let discovery = format!("{}/.well-known/openid-configuration", self.issuer);
        loop {
            match http().get(&discovery).send().await {
                Ok(r) if r.status().is_success() => break,
                _ if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(100)).await,
                other => panic!("{discovery} does not answer ({other:?}):\n{}", self.log()),
            }
        }
    }

    /// The discovery document.
    pub async fn discovery(&self) -> Value {
        let url = format!("{}/.well-known/openid-configuration", self.issuer);
        http().get(&url).send().await.expect("discovery").json_value().await
    }

    /// The endpoint `name` (`token_endpoint`, …) from the discovery document.
    pub async fn endpoint(&self, name: &str) -> String {
        self.discovery().await[name].as_str().unwrap_or_else(|| panic!("no {name}")).to_string()
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        self.stop();
    }
}

/// An http client that follows no redirects (they are followed by hand, to keep cookies).
pub fn http() -> reqwest::Client {
    let _ = async_nats::rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(20))
        .build()
        .expect("an http client")
}

trait JsonBody {
    async fn json_value(self) -> Value;
}

impl JsonBody for reqwest::Response {
    async fn json_value(self) -> Value {
        let status = self.status();
        let body = self.bytes().await.expect("a body");
        serde_json::from_slice(&body)
            .unwrap_or_else(|_| panic!("{status}: not JSON: {}", String::from_utf8_lossy(&body)))
    }
}

/// `application/x-www-form-urlencoded`.
pub fn form(fields: &[(&str, &str)]) -> String {
    let mut url = Url::parse("form:").unwrap();
    url.query_pairs_mut().extend_pairs(fields);
    url.query().unwrap_or_default().to_string()
}

async fn post_form(url: &str, fields: &[(&str, &str)], headers: HeaderMap) -> reqwest::Response {
    http()
        .post(url)
        .headers(headers)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(form(fields))
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {url}: {e}"))
}

fn token_set(v: &Value) -> TokenSet {
    let text = |k: &str| v[k].as_str().map(str::to_string);
    TokenSet {
        access_token: text("access_token").unwrap_or_else(|| panic!("no access_token in {v}")),
        refresh_token: text("refresh_token"),
        id_token: text("id_token"),
        expires_in: v["expires_in"].as_u64().unwrap_or(0),
    }
}

/// The device authorization grant as `landfall login` does it: ask for a code, have `user` sign
/// in and enter it in the provider's pages, poll the token endpoint.
pub async fn device_login(provider: &Provider, user: &str, password: &str) -> TokenSet {
    let endpoint = provider.endpoint("device_authorization_endpoint").await;
    let r = post_form(&endpoint, &[("client_id", CLI_CLIENT), ("scope", SCOPES)], HeaderMap::new()).await;
    assert!(r.status().is_success(), "device authorization: {}", r.status());
    let grant = r.json_value().await;
    let user_code = grant["user_code"].as_str().expect("a user_code");
    let device_code = grant["device_code"].as_str().expect("a device_code");
    complete_device_verification(provider, user_code, user, password).await;

    let token_endpoint = provider.endpoint("token_endpoint").await;
    let mut interval = grant["interval"].as_u64().unwrap_or(5);
    let deadline = Instant::now() + Duration::from_secs(grant["expires_in"].as_u64().unwrap_or(60).min(120));
    loop {
        let fields = [("grant_type", DEVICE_GRANT), ("device_code", device_code), ("client_id", CLI_CLIENT)];
        let r = post_form(&token_endpoint, &fields, HeaderMap::new()).await;
        let ok = r.status().is_success();
        let body = r.json_value().await;
        if ok {
            return token_set(&body);
        }
        match body["error"].as_str() {
            Some("authorization_pending") => {}
            Some("slow_down") => interval += 5,
            _ => panic!("device code grant refused: {body}"),
        }
        assert!(Instant::now() < deadline, "the device code was never granted");
        tokio::time::sleep(Duration::from_secs(interval)).await;
    }
}

/// The person's side of the device flow: in the provider's verification page, enter
/// `user_code`, confirm it, sign in as `user`.
///
/// # Panics
/// When any page refuses, or the last page is not the provider's success page.
pub async fn complete_device_verification(provider: &Provider, user_code: &str, user: &str, password: &str) {
    let mut person = Person::new(user, password);
    person.user_code = Some(user_code.to_string());
    let start = format!("{}/device", provider.issuer());
    let last = match person.walk(Method::GET, &start, None, None).await {
        Walk::Page(page) => page,
        Walk::Redirected(url) => panic!("the device verification left the provider for {url}"),
    };
    assert!(
        last.status.is_success() && last.body.contains("Sign-in Success"),
        "the device verification did not succeed ({}):\n{}",
        last.status,
        last.body
    );
}

/// The authorization code grant with PKCE (S256), signing in as `user` in the provider's pages.
/// The client is the dashboard when `redirect_uri` is one of its redirect URIs (the code is then
/// exchanged from its origin, as its script does, and CORS must allow that), else the CLI (whose
/// loopback redirect takes any port).
pub async fn code_login(provider: &Provider, user: &str, password: &str, redirect_uri: &str) -> TokenSet {
    let dashboard = provider.options.dashboard_redirect_uris.iter().any(|u| u == redirect_uri);
    let client_id = if dashboard { DASHBOARD_CLIENT } else { CLI_CLIENT };
    let verifier = URL_SAFE_NO_PAD.encode(uuid::Uuid::new_v4().as_bytes().repeat(2));
    let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()));
    let state = uuid::Uuid::new_v4().simple().to_string();
    let mut auth = Url::parse(&provider.endpoint("authorization_endpoint").await).unwrap();
    auth.query_pairs_mut().extend_pairs([
        ("client_id", client_id),
        ("response_type", "code"),
        ("redirect_uri", redirect_uri),
        ("scope", SCOPES),
        ("code_challenge", &challenge),
        ("code_challenge_method", "S256"),
        ("state", &state),
        ("nonce", &uuid::Uuid::new_v4().simple().to_string()),
        // OpenID Connect issues a refresh token (offline_access) in this flow only with
        // prompt=consent; the provider grants it to its first-party clients without asking.
        ("prompt", "consent"),
    ]);
    let mut person = Person::new(user, password);
    let back = match person.walk(Method::GET, auth.as_str(), None, Some(redirect_uri)).await {
        Walk::Redirected(url) => url,
        Walk::Page(page) => panic!("the sign-in did not come back to {redirect_uri} ({}):\n{}", page.status, page.body),
    };
    let query: BTreeMap<String, String> = back.query_pairs().into_owned().collect();
    assert_eq!(query.get("state"), Some(&state), "the state came back changed: {back}");
    assert_eq!(query.get("iss").map(String::as_str), Some(provider.issuer()), "{back}");
    let code = query.get("code").unwrap_or_else(|| panic!("no code in {back}"));

    let mut headers = HeaderMap::new();
    let origin = Url::parse(redirect_uri).unwrap().origin().ascii_serialization();
    if dashboard {
        headers.insert(header::ORIGIN, origin.parse().unwrap());
    }
    let token_endpoint = provider.endpoint("token_endpoint").await;
    let fields = [
        ("grant_type", "authorization_code"),
        ("code", code.as_str()),
        ("redirect_uri", redirect_uri),
        ("client_id", client_id),
        ("code_verifier", &verifier),
    ];
    let r = post_form(&token_endpoint, &fields, headers).await;
    if dashboard {
        let allowed = r.headers().get(header::ACCESS_CONTROL_ALLOW_ORIGIN).and_then(|v| v.to_str().ok());
        assert_eq!(allowed, Some(origin.as_str()), "the token endpoint must allow the dashboard's origin");
    }
    let ok = r.status().is_success();
    let body = r.json_value().await;
    assert!(ok, "the code exchange was refused: {body}");
    token_set(&body)
}

/// A person opens `url` (a client's authorization request) in a browser and signs in as `user`;
/// the browser follows every redirect, the client's own redirect URI too. Returns the last
/// page's status and text.
pub async fn open_in_browser(url: &str, user: &str, password: &str) -> (StatusCode, String) {
    match Person::new(user, password).walk(Method::GET, url, None, None).await {
        Walk::Page(page) => (page.status, page.body),
        Walk::Redirected(url) => unreachable!("nothing to stop at, yet stopped at {url}"),
    }
}

/// New tokens for a refresh token (refresh tokens of public clients rotate: use the new one).
pub async fn refresh(provider: &Provider, client_id: &str, refresh_token: &str) -> TokenSet {
    let token_endpoint = provider.endpoint("token_endpoint").await;
    let fields = [("grant_type", "refresh_token"), ("refresh_token", refresh_token), ("client_id", client_id)];
    let r = post_form(&token_endpoint, &fields, HeaderMap::new()).await;
    let ok = r.status().is_success();
    let body = r.json_value().await;
    assert!(ok, "the refresh was refused: {body}");
    token_set(&body)
}

/// A page as the browser ended on it.
struct Page {
    url: Url,
    status: StatusCode,
    body: String,
}

enum Walk {
    /// No more redirects: the page shown.
    Page(Page),
    /// A redirect to the client's redirect URI, which is not followed.
    Redirected(Url),
}

/// A person at a browser without JavaScript: follows redirects keeping the provider's cookies,
/// and fills in and submits the provider's forms.
struct Person {
    user: String,
    password: String,
    user_code: Option<String>,
    cookies: BTreeMap<String, String>,
}

impl Person {
    fn new(user: &str, password: &str) -> Person {
        Person { user: user.into(), password: password.into(), user_code: None, cookies: BTreeMap::new() }
    }

    /// Goes to `url` and through every page after it, submitting each form found, until a page
    /// has none or a redirect leads to `stop_at`.
    async fn walk(&mut self, method: Method, url: &str, body: Option<String>, stop_at: Option<&str>) -> Walk {
        let (mut method, mut url, mut body) = (method, Url::parse(url).expect("a URL"), body);
        for _ in 0..30 {
            if let Some(stop) = stop_at
                && url.as_str().split('?').next() == Some(stop.split('?').next().unwrap_or(stop))
            {
                return Walk::Redirected(url);
            }
            let page = self.load(method.clone(), &url, body.take()).await;
            if let Some(location) = page.1 {
                // 303, and 301/302 after a POST, are followed with a GET, as browsers do.
                method = Method::GET;
                url = location;
                continue;
            }
            let page = page.0;
            match self.fill(&page) {
                Some((action, fields)) => {
                    method = Method::POST;
                    url = action;
                    body = Some(fields);
                }
                None => return Walk::Page(page),
            }
        }
        panic!("more than 30 pages and redirects: the sign-in loops");
    }

    async fn load(&mut self, method: Method, url: &Url, body: Option<String>) -> (Page, Option<Url>) {
        let mut request = http().request(method.clone(), url.clone());
        if !self.cookies.is_empty() {
            let jar: Vec<String> = self.cookies.iter().map(|(k, v)| format!("{k}={v}")).collect();
            request = request.header(header::COOKIE, jar.join("; "));
        }
        if let Some(body) = body {
            request = request.header(header::CONTENT_TYPE, "application/x-www-form-urlencoded").body(body);
        }
        let r = request.send().await.unwrap_or_else(|e| panic!("{method} {url}: {e}"));
        for cookie in r.headers().get_all(header::SET_COOKIE) {
            self.keep(cookie.to_str().unwrap_or_default());
        }
        let status = r.status();
        let location = status
            .is_redirection()
            .then(|| r.headers().get(header::LOCATION).and_then(|l| l.to_str().ok()).map(|l| url.join(l)))
            .flatten()
            .map(|l| l.expect("a Location URL"));
        let body = r.text().await.unwrap_or_default();
        assert!(
            !(status.is_client_error() || status.is_server_error()) || status == StatusCode::UNAUTHORIZED,
            "{method} {url}: {status}\n{body}"
        );
        (Page { url: url.clone(), status, body }, location)
    }

    fn keep(&mut self, set_cookie: &str) {
        let mut parts = set_cookie.split(';');
        let Some((name, value)) = parts.next().and_then(|p| p.split_once('=')) else { return };
        let gone = value.is_empty()
            || parts.any(|a| {
                let a = a.trim().to_ascii_lowercase();
                a == "max-age=0" || a.starts_with("expires=thu, 01 jan 1970")
            });
        if gone {
            self.cookies.remove(name.trim());
        } else {
            self.cookies.insert(name.trim().to_string(), value.trim().to_string());
        }
    }

    /// The page's form filled in as the person would: the action and the fields, or `None`
    /// when the page has no form.
    fn fill(&self, page: &Page) -> Option<(Url, String)> {
        let start = page.body.find("<form")?;
        let rest = &page.body[start..];
        let form_end = rest.find("</form>").unwrap_or(rest.len());
        let form_html = &rest[..form_end];
        let tag_end = form_html.find('>').unwrap_or(form_html.len());
        let action = attr(&form_html[..tag_end], "action").unwrap_or_else(|| page.url.to_string());
        let action = page.url.join(&action).expect("a form action");
        let mut fields: Vec<(String, String)> = Vec::new();
        for input in form_html.split("<input").skip(1) {
            let tag = &input[..input.find('>').unwrap_or(input.len())];
            let Some(name) = attr(tag, "name") else { continue };
            let value = match name.as_str() {
                "login" => self.user.clone(),
                "password" => self.password.clone(),
                "user_code" if attr(tag, "type").as_deref() == Some("text") => {
                    self.user_code.clone().expect("the page asks for a user code")
                }
                _ => attr(tag, "value").unwrap_or_default(),
            };
            fields.push((name, value));
        }
        if page.status == StatusCode::UNAUTHORIZED {
            panic!("the provider refused the sign-in of {:?}:\n{}", self.user, page.body);
        }
        let pairs: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        Some((action, form(&pairs)))
    }
}

/// An attribute's value in an HTML tag (double-quoted), its entities decoded.
fn attr(tag: &str, name: &str) -> Option<String> {
    let needle = format!("{name}=\"");
    let mut from = 0;
    while let Some(at) = tag[from..].find(&needle) {
        let at = from + at;
        let before = tag[..at].chars().last();
        let start = at + needle.len();
        if before.is_some_and(char::is_whitespace) {
            let end = start + tag[start..].find('"')?;
            return Some(unescape(&tag[start..end]));
        }
        from = start;
    }
    None
}

fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        rest = &rest[amp..];
        let Some(semi) = rest.find(';') else { break };
        let entity = &rest[1..semi];
        let decoded = match entity {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            e if e.starts_with("#x") => u32::from_str_radix(&e[2..], 16).ok().and_then(char::from_u32),
            e if e.starts_with('#') => e[1..].parse().ok().and_then(char::from_u32),
            _ => None,
        };
        match decoded {
            Some(c) => {
                out.push(c);
                rest = &rest[semi + 1..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}
