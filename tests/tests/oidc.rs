//! Single sign-on against a real OpenID Connect provider (oidc-provider, `tests/oidc`): access
//! tokens obtained through the real flows are checked by the API's [`Verifier`], forgeries and
//! stale tokens are refused, the provider's key rotation is followed, and `landfall login` logs
//! in, saves its tokens and refreshes them.
//!
//! Each test starts its own provider on a port of its own, so they run side by side. They need
//! Node.js and `LANDFALL_OIDC_MODULES` (`scripts/ensure-oidc-provider`; `scripts/test` sets it).

use std::process::Stdio;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use landfall_tests::oidc::{self, AUDIENCE, Options, Provider, TokenSet, User};
use producers::api::oidc::{LEEWAY, OidcArgs, REFETCH_AT_MOST_EVERY, Verifier};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

fn users() -> Vec<User> {
    vec![User::new("alice", "alice-password", &["eu-ops", "viewers"]), User::new("bob", "bob-password", &[])]
}

async fn provider(options: Options) -> Provider {
    Provider::start(&users(), options).await
}

async fn verifier(idp: &Provider, audience: &str) -> Verifier {
    Verifier::start(&OidcArgs::new(idp.issuer(), audience)).await.unwrap().expect("an issuer is configured")
}

/// A JWT's header.
fn header(token: &str) -> Value {
    let part = token.split('.').next().unwrap();
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(part).unwrap()).unwrap()
}

async fn refused(v: &Verifier, token: &str, why: &str) {
    let refusal = v.verify(token).await.expect_err("the token must be refused").0;
    assert!(refusal.contains(why), "refused with {refusal:?}, expected it to say {why:?}");
    assert!(!refusal.contains(token.split('.').nth(1).unwrap()), "the refusal repeats the token");
}

#[tokio::test]
async fn device_login_token_verifies() {
    let idp = provider(Options::default()).await;
    let v = verifier(&idp, AUDIENCE).await;
    let tokens = oidc::device_login(&idp, "alice", "alice-password").await;
    assert!(tokens.refresh_token.is_some() && tokens.id_token.is_some(), "{tokens:?}");
    assert_eq!(header(&tokens.access_token)["alg"], "RS256");
    let who = v.verify(&tokens.access_token).await.unwrap();
    assert_eq!((who.subject.as_str(), who.name.as_str()), ("alice", "alice"));
    assert_eq!(who.groups, ["eu-ops", "viewers"]);
    let left = who.expires_at - time_now();
    assert!((500..=600).contains(&left), "the token expires in {left} s, not in about 600");

    let bob = v.verify(&oidc::device_login(&idp, "bob", "bob-password").await.access_token).await.unwrap();
    assert_eq!((bob.name.as_str(), bob.groups.len()), ("bob", 0));

    // A refreshed token is as good.
    let again = oidc::refresh(&idp, oidc::CLI_CLIENT, tokens.refresh_token.as_deref().unwrap()).await;
    assert_eq!(v.verify(&again.access_token).await.unwrap().groups, ["eu-ops", "viewers"]);
}

#[tokio::test]
async fn code_login_tokens_verify() {
    let dashboard = "http://127.0.0.1:18080/";
    let options = Options { dashboard_redirect_uris: vec![dashboard.into()], ..Options::default() };
    let idp = provider(options).await;
    let v = verifier(&idp, AUDIENCE).await;
    // The dashboard (its origin allowed to exchange the code), then the CLI on a loopback port.
    for redirect in [dashboard, "http://127.0.0.1:49152/callback"] {
        let tokens = oidc::code_login(&idp, "alice", "alice-password", redirect).await;
        let who = v.verify(&tokens.access_token).await.unwrap_or_else(|e| panic!("{redirect}: {e}"));
        assert_eq!(
            (who.name.as_str(), who.groups.as_slice()),
            ("alice", &["eu-ops".to_string(), "viewers".into()][..])
        );
        assert!(tokens.refresh_token.is_some(), "{redirect}: no refresh token");
    }
    // The provider's discovery is what the API hands clients.
    let config = v.public_config();
    assert_eq!(config["token_endpoint"], idp.endpoint("token_endpoint").await.as_str());
    assert_eq!(config["device_authorization_endpoint"], idp.endpoint("device_authorization_endpoint").await.as_str());
}

#[tokio::test]
async fn forgeries_and_other_audiences_are_refused() {
    let idp = provider(Options::default()).await;
    let v = verifier(&idp, AUDIENCE).await;
    let token = oidc::device_login(&idp, "alice", "alice-password").await.access_token;
    v.verify(&token).await.unwrap();

    // One byte of the signature changed.
    let parts: Vec<&str> = token.split('.').collect();
    let mut sig = URL_SAFE_NO_PAD.decode(parts[2]).unwrap();
    sig[17] ^= 0x01;
    let flipped = format!("{}.{}.{}", parts[0], parts[1], URL_SAFE_NO_PAD.encode(&sig));
    refused(&v, &flipped, "signature does not verify").await;

    // The real payload, unsigned.
    let none = URL_SAFE_NO_PAD.encode(json!({"alg": "none", "typ": "at+jwt"}).to_string());
    refused(&v, &format!("{none}.{}.", parts[1]), "alg none").await;

    // The same good token, at an API that expects another audience.
    let other = verifier(&idp, "urn:landfall:other-api").await;
    refused(&other, &token, "not for \"urn:landfall:other-api\"").await;
    // A provider that makes its tokens for another audience.
    let elsewhere = provider(Options { audience: "urn:landfall:elsewhere".into(), ..Options::default() }).await;
    let foreign = oidc::device_login(&elsewhere, "alice", "alice-password").await.access_token;
    refused(&verifier(&elsewhere, AUDIENCE).await, &foreign, "not for").await;
    // And a token of another issuer (its keys unknown here).
    refused(&v, &foreign, "not one the identity provider publishes").await;
}

#[tokio::test]
async fn expired_tokens_are_refused() {
    let idp = provider(Options { access_token_ttl: Duration::from_secs(2), ..Options::default() }).await;
    let v = verifier(&idp, AUDIENCE).await;
    let TokenSet { access_token, expires_in, .. } = oidc::device_login(&idp, "alice", "alice-password").await;
    assert_eq!(expires_in, 2);
    let exp = v.verify(&access_token).await.unwrap().expires_at;
    // Past its expiry, within the leeway for clocks that differ: still good.
    tokio::time::sleep(Duration::from_secs(3)).await;
    v.verify(&access_token).await.expect("within the leeway");
    // Past the leeway.
    let past = exp + LEEWAY + 1 - time_now();
    tokio::time::sleep(Duration::from_secs(past.max(0) as u64 + 1)).await;
    refused(&v, &access_token, "expired").await;
}

#[tokio::test]
async fn rotated_keys_are_followed() {
    let mut idp = provider(Options::default()).await;
    let v = verifier(&idp, AUDIENCE).await;
    let first = idp.keys()[0].clone();
    let old = oidc::device_login(&idp, "alice", "alice-password").await.access_token;
    assert_eq!(header(&old)["kid"], Provider::kid(&first));
    v.verify(&old).await.unwrap();

    // A new key signs; the old one is still published. The new kid makes the verifier fetch the
    // keys again at once.
    let second = Provider::new_key().await;
    idp.restart_with_keys(&[second.clone(), first.clone()]).await;
    let new = oidc::device_login(&idp, "alice", "alice-password").await.access_token;
    assert_eq!(header(&new)["kid"], Provider::kid(&second));
    let refetched = Instant::now();
    v.verify(&new).await.expect("a token of the new key verifies");
    v.verify(&old).await.expect("the old key is still published");

    // The old keys are dropped. Once the interval between fetches has passed, a token of a
    // newer key fetches the set again, and the dropped keys no longer verify.
    let third = Provider::new_key().await;
    idp.restart_with_keys(std::slice::from_ref(&third)).await;
    let newest = oidc::device_login(&idp, "alice", "alice-password").await.access_token;
    assert_eq!(header(&newest)["kid"], Provider::kid(&third));
    let wait = (REFETCH_AT_MOST_EVERY + Duration::from_millis(500)).saturating_sub(refetched.elapsed());
    tokio::time::sleep(wait).await;
    v.verify(&newest).await.expect("a token of the newest key verifies");
    refused(&v, &old, "not one the identity provider publishes").await;
    refused(&v, &new, "not one the identity provider publishes").await;

    // While the provider is down the keys already read keep working.
    idp.stop();
    v.verify(&newest).await.expect("the keys already read work while the provider is down");
}

/// A stand-in for the API's `/v1/auth`: what a verifier says clients need.
async fn serve_auth(config: Value) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api = format!("http://{}", listener.local_addr().unwrap());
    let body = json!({ "oidc": config });
    let app = axum::Router::new().route("/v1/auth", axum::routing::get(move || async move { axum::Json(body) }));
    tokio::spawn(async move { axum::serve(listener, app).await });
    api
}

/// `landfall ARGS` with its config home in `home`, stderr piped.
fn landfall(home: &std::path::Path, args: &[&str]) -> tokio::process::Child {
    tokio::process::Command::new(landfall_tests::cli::binary())
        .args(args)
        .env("XDG_CONFIG_HOME", home)
        .env("HOME", home)
        .env_remove("LANDFALL_API")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run landfall")
}

/// Reads the child's stderr until a line holds `marker`; returns that line.
async fn line_with(reader: &mut BufReader<tokio::process::ChildStderr>, marker: &str, seen: &mut String) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut line = String::new();
        let n = tokio::time::timeout_at(deadline.into(), reader.read_line(&mut line))
            .await
            .unwrap_or_else(|_| panic!("landfall printed no {marker:?}:\n{seen}"))
            .unwrap();
        assert!(n > 0, "landfall ended without printing {marker:?}:\n{seen}");
        seen.push_str(&line);
        if line.contains(marker) {
            return line;
        }
    }
}

/// Waits for the child to end successfully, with the rest of its stderr.
async fn succeeds(
    mut child: tokio::process::Child,
    mut reader: BufReader<tokio::process::ChildStderr>,
    mut seen: String,
) {
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait()).await.expect("landfall ends").unwrap();
    reader.read_to_string(&mut seen).await.unwrap();
    assert!(status.success(), "landfall: {status}\n{seen}");
}

fn saved(home: &std::path::Path) -> Value {
    serde_json::from_slice(&std::fs::read(home.join("landfall/credentials.json")).unwrap()).unwrap()
}

#[tokio::test]
async fn cli_login_saves_tokens_and_refreshes_them() {
    use std::os::unix::fs::PermissionsExt;

    let idp = provider(Options::default()).await;
    let v = verifier(&idp, AUDIENCE).await;
    let api = serve_auth(v.public_config()).await;
    let home = tempfile::tempdir().unwrap();

    // The device flow: the CLI prints the page and the code, a person enters it and signs in.
    let mut child = landfall(home.path(), &["login", "--api", &format!("{api}/")]);
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    let line = line_with(&mut err, "enter the code ", &mut seen).await;
    let code = line.rsplit("enter the code ").next().unwrap().trim().trim_end_matches(')').to_string();
    oidc::complete_device_verification(&idp, &code, "alice", "alice-password").await;
    succeeds(child, err, seen).await;

    let file = home.path().join("landfall/credentials.json");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the credentials file must be the owner's alone");
    let dir_mode = std::fs::metadata(file.parent().unwrap()).unwrap().permissions().mode() & 0o777;
    assert_eq!(dir_mode, 0o700);
    let login = saved(home.path())["logins"][0].clone();
    assert_eq!((login["api"].as_str(), login["issuer"].as_str()), (Some(api.as_str()), Some(idp.issuer())));
    let token = login["access_token"].as_str().unwrap().to_string();
    assert_eq!(v.verify(&token).await.unwrap().name, "alice");

    // A token far from expiry is handed out as saved; one about to expire is refreshed.
    use producers::cli::login::bearer_in;
    assert_eq!(bearer_in(&file, &api).await.unwrap().as_deref(), Some(token.as_str()));
    assert_eq!(bearer_in(&file, "http://127.0.0.1:1").await.unwrap(), None, "not logged in there");
    let mut doc = saved(home.path());
    doc["logins"][0]["expires_at"] = json!(time_now() + 30);
    std::fs::write(&file, serde_json::to_vec(&doc).unwrap()).unwrap();
    let fresh = bearer_in(&file, &api).await.unwrap().expect("a refreshed token");
    assert_ne!(fresh, token, "the token about to expire must be refreshed");
    assert_eq!(v.verify(&fresh).await.unwrap().groups, ["eu-ops", "viewers"]);
    let renewed = saved(home.path())["logins"][0].clone();
    assert_eq!(renewed["access_token"], fresh.as_str(), "the refreshed token is saved");
    assert!(renewed["expires_at"].as_i64().unwrap() > time_now() + 500);
    assert_ne!(renewed["refresh_token"], login["refresh_token"], "the provider rotates refresh tokens");
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);

    // A refresh token the provider no longer knows: a clear sentence to log in again.
    let mut doc = saved(home.path());
    doc["logins"][0]["expires_at"] = json!(time_now() - 5);
    doc["logins"][0]["refresh_token"] = json!("not-a-refresh-token");
    std::fs::write(&file, serde_json::to_vec(&doc).unwrap()).unwrap();
    let e = bearer_in(&file, &api).await.unwrap_err();
    assert!(format!("{e:#}").contains("landfall login --api"), "{e:#}");

    // Logging out forgets it.
    let mut child = landfall(home.path(), &["logout", "--api", &api]);
    let err = BufReader::new(child.stderr.take().unwrap());
    succeeds(child, err, String::new()).await;
    assert!(!file.exists(), "the only login is gone, and so is the file");
    assert_eq!(bearer_in(&file, &api).await.unwrap(), None);
}

#[tokio::test]
async fn cli_login_with_a_browser() {
    let idp = provider(Options::default()).await;
    let v = verifier(&idp, AUDIENCE).await;
    let api = serve_auth(v.public_config()).await;
    let home = tempfile::tempdir().unwrap();

    let mut child = landfall(home.path(), &["login", "--browser", "--api", &api]);
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    line_with(&mut err, "open this page in a browser", &mut seen).await;
    let url = line_with(&mut err, "http", &mut seen).await.trim().to_string();
    assert!(url.contains("code_challenge_method=S256"), "{url}");
    let (status, page) = oidc::open_in_browser(&url, "bob", "bob-password").await;
    assert!(status.is_success() && page.contains("you are logged in"), "{status}: {page}");
    succeeds(child, err, seen).await;

    let login = saved(home.path())["logins"][0].clone();
    assert_eq!(v.verify(login["access_token"].as_str().unwrap()).await.unwrap().name, "bob");
    assert!(login["refresh_token"].is_string(), "no refresh token: {login}");
}

#[tokio::test]
async fn wrong_password_is_refused_by_the_provider() {
    let idp = provider(Options::default()).await;
    let attempt = tokio::spawn(async move {
        oidc::code_login(&idp, "alice", "not-her-password", "http://127.0.0.1:49153/callback").await;
    });
    let panic = attempt.await.expect_err("signing in with a wrong password must fail").into_panic();
    let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(message.contains("wrong name or password"), "{message}");
}

fn time_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64
}
