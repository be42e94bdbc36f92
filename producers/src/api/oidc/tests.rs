//! The verifier against an issuer served from this process (discovery and a JWK Set), with
//! tokens signed here by hand: ES256 and Ed25519 keys made by ring, RS256 and PS256 with a fixed
//! RSA key.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, Ed25519KeyPair, KeyPair, RsaKeyPair};
use serde_json::{Value, json};

use super::*;

const AUDIENCE: &str = "urn:landfall:api";

/// A 2048-bit RSA key (PKCS#8, base64) made for these tests only: ring cannot make RSA keys.
const TEST_RSA_PKCS8: &str = concat!(
    "MIIEvAIBADANBgkqhkiG9w0BAQEFAASCBKYwggSiAgEAAoIBAQCeHfOm0D4bvK5CVZ8KDMOf5PZxnnjeEIFM4miIfKFJNoYs",
    "gMZqr4vyUgIuYtiypZUxd3T1b52lRuygCjPTb3ngtvgXtYjsyXsE0cyNWbS5kapInEjspDIcyO7W3JSWmpgnMxBLkLIuG3xf",
    "f42Nw5jUTrAXo2hrnzFGFgem6tgj2TTUwUBDdecxiYT7cPz1hX7hJnjPF5gvjis8vSatq6wLV5cI/rvak86+yDqC4UNySAbR",
    "8NAFYS5PuFc+LGOq4Pj+lWl1gmozqEOtTrnfaLljhWiLD+LxTXai3DEqEow1/blDTBLaCjUmHdunfEr7AT4bDQ7lNeiXdg4V",
    "Mz+OSUahAgMBAAECggEABA7rjsFNGkr1/6otHMnUBK7gqcz0EApNOMoN/fyRqtB8SjCwEwt8WnbjEyHmqyNpilt1JjJoKdaJ",
    "ptALOWzU1GUK1igyznXLh12rh/hcrXeC/vYKr771QbCRM4Tl6A2JzKYEh9V78seyIgz69we9ZLvcLH+lW7+KSSDSL4U7IOSh",
    "Pxn87Y63OqX4Xa/fVxJE5lbr7efSx/hUfgeoGy78pP3x9quFkZBBJ5TNH+IEJZTgRbthRkwoYyij+iocZLTp3WzOIl/EWeEi",
    "bHA//282g0TY/RANZuSpv42a9zxTvkKFhu0lYlyxrg54g6c3MWUkEMmmlXvo3KfoFyz4AjuwQQKBgQDQzHjnb9DFApBVdUAF",
    "32KaPqdmVdtdW854YumEeIDdngmtlyku9feuL16z+brOosyAXC7jl98NWm+kLw1SfuYXs2qQxnr++9ZGxa5UWop0yiomnb9w",
    "xUyJXZ1b/h6HmCenbTkABPn5xiAgJGmJWGoW85hjTNeo/ZRB838O5KJOQQKBgQDB3HHB7oI7vTCIlaBNoUoBgsIlyQ3va1Vc",
    "V4mtLiXCBZdjlZxin4hN608lZnGGXnLPjDTRRJV7MVQmcenTGctDBmYI+O7Qrv40pxvsetgG0lhGPqxcUlr+N2dvtUVQr0dk",
    "7SNwbb39bGtbQrzKruQSlfwrKc1bdNbzFblbBaGgYQKBgHezMQDlDldTL/F+BVUYikuI7ajyQY8U6ZoEgoDqIF5sknnM9dQx",
    "OGvIRk+BNEHv/LL9pffeAgaCuQvz2XxYuYoO1mHnF24EbAQooddEDKoFmAKJXs3EnisF2wd4+IGdjeYi7JGBSNmTZqlmloYh",
    "hLhhsBQFYoFD1nG0qTudgRrBAoGAVqZe3mzqHyOQBuzCKxC1kHlOqC72oJYcIFssOZEP5Wo0YZmkvdxKw3Ey/ieNBJ9AuA4W",
    "KZd7LQY+c7Sk6+tyk/HPN6F0tSgSjZxH+epqlpn8ROGMjvNsooZHIIIoikjeI3lvRrh2nEiSr8bjtcB4RuptPSnBFWjjDuId",
    "6FZbCOECgYB70aMZemkcZT11IKQ2lTItjMDqHmV3QMXJPpP5gERgdLP4O+228Sgs4wTzTKJK3s2fF9BX07SzAfvqj3N5/Y56",
    "yyqwkq6yhDBG8ftG8JDHcDBVoasyPIs0FIWBzqQy63LMrTxynfvCFMSzK1mVaa6C7dRH8N4+nbUOA5eaP/jLtg==",
);

/// An identity provider as far as the verifier sees one: its discovery document and key set,
/// which a test may change or take down, counting the key set's fetches.
struct Issuer {
    url: String,
    jwks: Mutex<Value>,
    jwks_fetches: AtomicUsize,
    down: AtomicBool,
}

impl Issuer {
    async fn start(jwks: Value) -> Arc<Issuer> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let issuer = Arc::new(Issuer {
            url,
            jwks: Mutex::new(jwks),
            jwks_fetches: AtomicUsize::new(0),
            down: AtomicBool::new(false),
        });
        let app = axum::Router::new()
            .route("/.well-known/openid-configuration", get(discovery))
            .route("/jwks", get(key_set))
            .with_state(issuer.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        issuer
    }

    fn set_keys(&self, jwks: Value) {
        *self.jwks.lock().unwrap() = jwks;
    }

    fn fetches(&self) -> usize {
        self.jwks_fetches.load(Ordering::SeqCst)
    }

    async fn verifier(&self) -> Verifier {
        Verifier::start(&OidcArgs::new(&self.url, AUDIENCE)).await.unwrap().expect("an issuer is configured")
    }
}

async fn discovery(State(i): State<Arc<Issuer>>) -> Response {
    if i.down.load(Ordering::SeqCst) {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    axum::Json(json!({
        "issuer": i.url,
        "jwks_uri": format!("{}/jwks", i.url),
        "authorization_endpoint": format!("{}/auth", i.url),
        "token_endpoint": format!("{}/token", i.url),
        "device_authorization_endpoint": format!("{}/device/auth", i.url),
    }))
    .into_response()
}

async fn key_set(State(i): State<Arc<Issuer>>) -> Response {
    i.jwks_fetches.fetch_add(1, Ordering::SeqCst);
    if i.down.load(Ordering::SeqCst) {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    axum::Json(i.jwks.lock().unwrap().clone()).into_response()
}

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// A signing key of the tests, with its kid.
enum Signer {
    Es256(EcdsaKeyPair),
    Ed25519(Ed25519KeyPair),
    Rsa(RsaKeyPair, &'static str),
}

struct Key {
    kid: String,
    signer: Signer,
}

impl Key {
    fn es256(kid: &str) -> Key {
        let rng = SystemRandom::new();
        let alg = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).unwrap();
        Key { kid: kid.into(), signer: Signer::Es256(pair) }
    }

    fn ed25519(kid: &str) -> Key {
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
        Key { kid: kid.into(), signer: Signer::Ed25519(Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap()) }
    }

    fn rsa(kid: &str, alg: &'static str) -> Key {
        let der = STANDARD.decode(TEST_RSA_PKCS8).unwrap();
        Key { kid: kid.into(), signer: Signer::Rsa(RsaKeyPair::from_pkcs8(&der).unwrap(), alg) }
    }

    fn alg(&self) -> &'static str {
        match &self.signer {
            Signer::Es256(_) => "ES256",
            Signer::Ed25519(_) => "EdDSA",
            Signer::Rsa(_, alg) => alg,
        }
    }

    /// The public JWK, as a provider publishes it.
    fn jwk(&self) -> Value {
        match &self.signer {
            Signer::Es256(pair) => {
                let point = pair.public_key().as_ref();
                json!({"kty": "EC", "crv": "P-256", "kid": self.kid, "use": "sig", "alg": "ES256",
                       "x": b64(&point[1..33]), "y": b64(&point[33..65])})
            }
            Signer::Ed25519(pair) => {
                json!({"kty": "OKP", "crv": "Ed25519", "kid": self.kid, "use": "sig",
                       "x": b64(pair.public_key().as_ref())})
            }
            Signer::Rsa(pair, _) => {
                let c = signature::RsaPublicKeyComponents::<Vec<u8>>::from(pair.public());
                json!({"kty": "RSA", "kid": self.kid, "use": "sig", "n": b64(&c.n), "e": b64(&c.e)})
            }
        }
    }

    fn sign(&self, input: &[u8]) -> Vec<u8> {
        let rng = SystemRandom::new();
        match &self.signer {
            Signer::Es256(pair) => pair.sign(&rng, input).unwrap().as_ref().to_vec(),
            Signer::Ed25519(pair) => pair.sign(input).as_ref().to_vec(),
            Signer::Rsa(pair, alg) => {
                let padding: &dyn signature::RsaEncoding =
                    if *alg == "PS256" { &signature::RSA_PSS_SHA256 } else { &signature::RSA_PKCS1_SHA256 };
                let mut sig = vec![0; pair.public().modulus_len()];
                pair.sign(padding, &rng, input, &mut sig).unwrap();
                sig
            }
        }
    }

    /// A token with this key's alg and kid.
    fn token(&self, claims: &Value) -> String {
        self.token_with(&json!({"alg": self.alg(), "kid": self.kid, "typ": "at+jwt"}), claims)
    }

    fn token_with(&self, header: &Value, claims: &Value) -> String {
        let input = format!("{}.{}", b64(header.to_string().as_bytes()), b64(claims.to_string().as_bytes()));
        let sig = self.sign(input.as_bytes());
        format!("{input}.{}", b64(&sig))
    }
}

fn jwks(keys: &[&Key]) -> Value {
    json!({ "keys": keys.iter().map(|k| k.jwk()).collect::<Vec<_>>() })
}

/// Good claims for `issuer`, expiring in five minutes.
fn claims(issuer: &Issuer) -> Value {
    let now = now();
    json!({
        "iss": issuer.url, "aud": AUDIENCE, "sub": "alice-id", "preferred_username": "alice",
        "email": "alice@example.test", "groups": ["eu-ops", "viewers"],
        "iat": now, "exp": now + 300, "client_id": "landfall-cli", "scope": "profile email groups",
    })
}

fn with(mut claims: Value, changes: Value) -> Value {
    for (k, v) in changes.as_object().unwrap() {
        if v.is_null() {
            claims.as_object_mut().unwrap().remove(k);
        } else {
            claims[k] = v.clone();
        }
    }
    claims
}

/// Refused, and the sentence says `why` and holds no part of the token.
async fn refused(v: &Verifier, token: &str, why: &str) {
    let Refused(sentence) = v.verify(token).await.expect_err("the token must be refused");
    assert!(sentence.contains(why), "refused with {sentence:?}, expected it to say {why:?}");
    for part in token.split('.').filter(|p| p.len() > 8) {
        assert!(!sentence.contains(part), "the refusal {sentence:?} repeats the token");
    }
}

#[tokio::test]
async fn good_es256_token_verifies() {
    let key = Key::es256("k1");
    let issuer = Issuer::start(jwks(&[&key])).await;
    let v = issuer.verifier().await;
    let c = claims(&issuer);
    let who = v.verify(&key.token(&c)).await.unwrap();
    assert_eq!(
        who,
        Identity {
            subject: "alice-id".into(),
            name: "alice".into(),
            groups: vec!["eu-ops".into(), "viewers".into()],
            expires_at: c["exp"].as_i64().unwrap(),
        }
    );
    // The name falls back to the email, then the subject; an audience list is accepted.
    let who = v.verify(&key.token(&with(c.clone(), json!({"preferred_username": null})))).await.unwrap();
    assert_eq!(who.name, "alice@example.test");
    let bare = with(c, json!({"preferred_username": null, "email": null, "groups": null, "aud": ["x", AUDIENCE]}));
    let who = v.verify(&key.token(&bare)).await.unwrap();
    assert_eq!((who.name.as_str(), who.groups.len()), ("alice-id", 0));
}

#[tokio::test]
async fn rs256_ps256_and_eddsa_verify() {
    let rs = Key::rsa("rsa-1", "RS256");
    let ps = Key::rsa("rsa-1", "PS256");
    let ed = Key::ed25519("ed-1");
    let issuer = Issuer::start(jwks(&[&rs, &ed])).await;
    let v = issuer.verifier().await;
    for key in [&rs, &ps, &ed] {
        let who = v.verify(&key.token(&claims(&issuer))).await.unwrap_or_else(|e| panic!("{}: {e}", key.alg()));
        assert_eq!(who.name, "alice");
    }
}

#[tokio::test]
async fn tampered_unsigned_and_shared_secret_tokens_are_refused() {
    let key = Key::es256("k1");
    let issuer = Issuer::start(jwks(&[&key])).await;
    let v = issuer.verifier().await;
    let good = key.token(&claims(&issuer));
    let parts: Vec<&str> = good.split('.').collect();

    // The payload changed: another subject, same signature.
    let forged = b64(with(claims(&issuer), json!({"sub": "root"})).to_string().as_bytes());
    refused(&v, &format!("{}.{forged}.{}", parts[0], parts[2]), "signature does not verify").await;

    // alg none, with and without a signature.
    let none = b64(json!({"alg": "none", "kid": "k1"}).to_string().as_bytes());
    refused(&v, &format!("{none}.{}.", parts[1]), "alg none").await;
    refused(&v, &format!("{none}.{}.{}", parts[1], parts[2]), "alg none").await;

    // HS256 with the public key as the secret (the classic confusion).
    let header = b64(json!({"alg": "HS256", "kid": "k1"}).to_string().as_bytes());
    let input = format!("{header}.{}", parts[1]);
    let secret = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key.jwk().to_string().as_bytes());
    let mac = ring::hmac::sign(&secret, input.as_bytes());
    refused(&v, &format!("{input}.{}", b64(mac.as_ref())), "shared secret (\"HS256\")").await;

    // Not a JWT at all, and a header naming an algorithm not accepted.
    refused(&v, "not-a-token", "not a JWT").await;
    refused(&v, &key.token_with(&json!({"alg": "ES384", "kid": "k1"}), &claims(&issuer)), "not accepted").await;
    refused(&v, &key.token_with(&json!({"alg": "ES256", "kid": "k1", "crit": ["b64"]}), &claims(&issuer)), "crit")
        .await;
}

#[tokio::test]
async fn alg_must_fit_the_key() {
    let ec = Key::es256("ec");
    let rsa = Key::rsa("rsa", "RS256");
    let issuer = Issuer::start(jwks(&[&ec, &rsa])).await;
    let v = issuer.verifier().await;
    let c = claims(&issuer);
    // An ES256 signature that names the RSA key, and an RS256 one that names the EC key.
    refused(&v, &ec.token_with(&json!({"alg": "ES256", "kid": "rsa"}), &c), "cannot have signed it").await;
    refused(&v, &rsa.token_with(&json!({"alg": "RS256", "kid": "ec"}), &c), "cannot have signed it").await;
    // A key the set pins to ES256 does not check EdDSA, even without a kid.
    let pinned = Key::ed25519("ed");
    let mut jwk = pinned.jwk();
    jwk["alg"] = json!("ES256");
    issuer.set_keys(json!({"keys": [jwk]}));
    let v = issuer.verifier().await;
    refused(&v, &pinned.token_with(&json!({"alg": "EdDSA"}), &c), "cannot have signed it").await;
}

#[tokio::test]
async fn issuer_audience_and_times_are_checked() {
    let key = Key::es256("k1");
    let issuer = Issuer::start(jwks(&[&key])).await;
    let v = issuer.verifier().await;
    let c = claims(&issuer);
    let now = now();
    let cases = [
        (json!({"iss": format!("{}/", issuer.url)}), "not by"),
        (json!({"iss": null}), "no issuer"),
        (json!({"aud": "urn:other"}), "not for \"urn:landfall:api\""),
        (json!({"aud": ["urn:a", "urn:b"]}), "not for"),
        (json!({"aud": null}), "no audience"),
        (json!({"exp": now - LEEWAY - 1}), "expired"),
        (json!({"exp": null}), "no expiry"),
        (json!({"exp": "soon"}), "not a number"),
        (json!({"nbf": now + LEEWAY + 60}), "not valid for another"),
        (json!({"iat": now + LEEWAY + 60}), "issued"),
        (json!({"sub": null}), "no subject"),
    ];
    for (change, why) in cases {
        refused(&v, &key.token(&with(c.clone(), change)), why).await;
    }
    // Within the leeway: just expired, just not yet valid.
    let lenient = with(c, json!({"exp": now - LEEWAY + 5, "nbf": now + LEEWAY - 5, "iat": now + 5}));
    v.verify(&key.token(&lenient)).await.unwrap();
}

#[tokio::test]
async fn unknown_kid_refetches_at_most_once_per_interval() {
    let old = Key::es256("old");
    let new = Key::es256("new");
    let issuer = Issuer::start(jwks(&[&old])).await;
    let v = issuer.verifier().await;
    assert_eq!(issuer.fetches(), 1, "the keys are read at start");
    v.verify(&old.token(&claims(&issuer))).await.unwrap();

    // The provider rotates: the first token with the new kid fetches the set again.
    issuer.set_keys(jwks(&[&new]));
    v.verify(&new.token(&claims(&issuer))).await.unwrap();
    assert_eq!(issuer.fetches(), 2);
    refused(&v, &old.token(&claims(&issuer)), "not one the identity provider publishes").await;

    // Made-up key ids, many at once and one after another, fetch nothing more for a while.
    let stranger = Key::es256("garbage");
    let token = stranger.token(&claims(&issuer));
    let many = (0..20).map(|_| v.verify(&token));
    for r in futures::future::join_all(many).await {
        assert!(r.unwrap_err().0.contains("not one the identity provider publishes"));
    }
    assert_eq!(issuer.fetches(), 2, "unknown key ids within {REFETCH_AT_MOST_EVERY:?} must not fetch again");
}

#[tokio::test]
async fn keys_keep_working_while_the_provider_is_down() {
    let key = Key::es256("k1");
    let issuer = Issuer::start(jwks(&[&key])).await;
    let v = issuer.verifier().await;
    issuer.down.store(true, Ordering::SeqCst);
    // An unknown kid's refetch fails; the keys already read stay.
    refused(&v, &Key::es256("k2").token(&claims(&issuer)), "not one the identity provider publishes").await;
    v.verify(&key.token(&claims(&issuer))).await.unwrap();
}

#[tokio::test]
async fn provider_down_at_start_is_retried() {
    let key = Key::es256("k1");
    let issuer = Issuer::start(jwks(&[&key])).await;
    issuer.down.store(true, Ordering::SeqCst);
    let v = issuer.verifier().await;
    let token = key.token(&claims(&issuer));
    refused(&v, &token, "the identity provider has not been reached yet").await;
    assert_eq!(v.public_config()["token_endpoint"], Value::Null);

    issuer.down.store(false, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(10);
    while v.verify(&token).await.is_err() {
        assert!(Instant::now() < deadline, "the verifier never read the provider once it answered");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(v.public_config()["token_endpoint"], json!(format!("{}/token", issuer.url)));
}

#[tokio::test]
async fn settings_and_public_config() {
    assert!(Verifier::start(&OidcArgs { issuer: None, ..OidcArgs::new("", AUDIENCE) }).await.unwrap().is_none());
    let no_audience = OidcArgs { audience: None, ..OidcArgs::new("http://127.0.0.1:1", "") };
    let e = Verifier::start(&no_audience).await.unwrap_err();
    assert!(e.to_string().contains("--oidc-audience is required"), "{e}");
    assert!(Verifier::start(&OidcArgs::new("ftp://x", AUDIENCE)).await.is_err());

    let key = Key::es256("k1");
    let issuer = Issuer::start(jwks(&[&key])).await;
    let v = issuer.verifier().await;
    assert_eq!(
        v.public_config(),
        json!({
            "issuer": issuer.url, "audience": AUDIENCE,
            "dashboard_client": "landfall-dashboard", "cli_client": "landfall-cli",
            "scopes": "openid profile email groups offline_access",
            "authorization_endpoint": format!("{}/auth", issuer.url),
            "token_endpoint": format!("{}/token", issuer.url),
            "device_authorization_endpoint": format!("{}/device/auth", issuer.url),
            "end_session_endpoint": null,
        })
    );
}
