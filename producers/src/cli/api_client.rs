//! The HTTP API as the commands that go through it reach it (`approval`, `whoami`, `audit
//! --api`): the API's URL, the bearer token (`LANDFALL_API_TOKEN`, else the saved login of
//! `landfall login`), JSON both ways, and the API's refusals as messages and exit codes.

use std::process::ExitCode;

use anyhow::{Context, bail};
use serde_json::Value;

use super::connect::EXIT_REJECTED;

/// The environment variable a token for the API can be given in (instead of `landfall login`).
pub const TOKEN_ENV: &str = "LANDFALL_API_TOKEN";

/// `--api`: the API a command goes through.
#[derive(Debug, clap::Args)]
pub struct ApiArgs {
    /// The landfall API to go through, e.g. https://landfall.example.com; the token is
    /// LANDFALL_API_TOKEN's, else the one `landfall login --api URL` saved.
    #[arg(long, env = "LANDFALL_API")]
    pub api: String,
}

/// The API refused a request: its status and its message.
#[derive(Debug)]
pub struct Refused {
    pub status: u16,
    pub message: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let reason = reqwest::StatusCode::from_u16(self.status).ok().and_then(|s| s.canonical_reason());
        match reason {
            Some(reason) => write!(f, "{} ({} {reason})", self.message, self.status),
            None => write!(f, "{} ({})", self.message, self.status),
        }
    }
}

impl std::error::Error for Refused {}

/// A client of one API, with the caller's token.
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Client {
    /// A client of `api` with the token of `LANDFALL_API_TOKEN`, else of the saved login.
    ///
    /// # Errors
    /// When there is neither, or the saved login cannot be refreshed.
    pub async fn new(api: &str) -> anyhow::Result<Self> {
        let base = api.trim().trim_end_matches('/').to_string();
        if base.is_empty() {
            bail!("--api is empty: give the API's URL (or set LANDFALL_API)");
        }
        let token = match std::env::var(TOKEN_ENV).ok().filter(|t| !t.trim().is_empty()) {
            Some(token) => token.trim().to_string(),
            None => match super::login::bearer(&base).await? {
                Some(token) => token,
                None => bail!("not logged in: run `landfall login --api {base}` (or set {TOKEN_ENV})"),
            },
        };
        Ok(Self { http: super::login::http()?, base, token })
    }

    /// The URL of `path` with `query` (the pairs whose value is `None` left out).
    fn url(&self, path: &str, query: &[(&str, Option<String>)]) -> anyhow::Result<reqwest::Url> {
        let mut url = reqwest::Url::parse(&format!("{}{path}", self.base))
            .with_context(|| format!("{:?} is not a URL", self.base))?;
        let pairs: Vec<(&str, &str)> = query.iter().filter_map(|(k, v)| v.as_deref().map(|v| (*k, v))).collect();
        if !pairs.is_empty() {
            url.query_pairs_mut().extend_pairs(pairs);
        }
        Ok(url)
    }

    /// `GET path?query`: the answer as JSON.
    ///
    /// # Errors
    /// When the API cannot be reached, or refuses ([`Refused`]).
    pub async fn get(&self, path: &str, query: &[(&str, Option<String>)]) -> anyhow::Result<Value> {
        let url = self.url(path, query)?;
        let request = self.http.get(url.clone());
        self.send(request, "GET", &url).await
    }

    /// `POST path` with a JSON body: the answer as JSON.
    ///
    /// # Errors
    /// As [`Client::get`].
    pub async fn post(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        let url = self.url(path, &[])?;
        let request = self
            .http
            .post(url.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(serde_json::to_vec(body)?);
        self.send(request, "POST", &url).await
    }

    async fn send(&self, request: reqwest::RequestBuilder, method: &str, url: &reqwest::Url) -> anyhow::Result<Value> {
        let what = format!("{method} {}", url.path());
        let r = request
            .bearer_auth(&self.token)
            .header(reqwest::header::ACCEPT, "application/json")
            .send()
            .await
            .with_context(|| format!("{what}: is the API at {} up?", self.base))?;
        let status = r.status();
        let body = r.bytes().await.with_context(|| format!("{what}: the answer was cut off"))?;
        let json: Option<Value> = serde_json::from_slice(&body).ok();
        if status.is_success() {
            return json.with_context(|| format!("{what}: the answer is not JSON"));
        }
        let message = match json.as_ref().and_then(|j| j["message"].as_str()) {
            Some(message) => message.to_string(),
            None => {
                let text = String::from_utf8_lossy(&body).trim().chars().take(300).collect::<String>();
                if text.is_empty() { what } else { format!("{what}: {text}") }
            }
        };
        Err(Refused { status: status.as_u16(), message }.into())
    }
}

/// The exit of a command that went through the API: a refusal (403 or 409) is printed and ends
/// with the code of a rejected command; any other error is the caller's to print.
///
/// # Errors
/// Every error but a refusal.
pub fn exit(result: anyhow::Result<ExitCode>) -> anyhow::Result<ExitCode> {
    match result {
        Err(e) => match e.downcast_ref::<Refused>() {
            Some(r) if r.status == 403 || r.status == 409 => {
                eprintln!("error: {r}");
                Ok(ExitCode::from(EXIT_REJECTED))
            }
            _ => Err(e),
        },
        ok => ok,
    }
}

/// Text of a JSON field for a table (`-` when empty or missing).
pub fn cell(v: &Value) -> String {
    match v {
        Value::String(s) if !s.is_empty() => s.clone(),
        Value::Null => "-".into(),
        Value::String(_) => "-".into(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_say_the_message_and_the_status() {
        let r = Refused { status: 403, message: "a second person decides it".into() };
        assert_eq!(r.to_string(), "a second person decides it (403 Forbidden)");
        let code = exit(Err(r.into())).unwrap();
        assert_eq!(code, ExitCode::from(EXIT_REJECTED));
        let other = Refused { status: 404, message: "no command".into() };
        assert!(exit(Err(other.into())).is_err());
    }

    #[test]
    fn cells_of_empty_fields_are_dashes() {
        assert_eq!(cell(&Value::Null), "-");
        assert_eq!(cell(&serde_json::json!("")), "-");
        assert_eq!(cell(&serde_json::json!("x")), "x");
        assert_eq!(cell(&serde_json::json!(2)), "2");
    }
}
