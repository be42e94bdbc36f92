//! Site credentials, and the NATS server's auth callout protocol that checks them.
//!
//! A credential is a token the hub's identity service signs with its issuer key (an account
//! nkey): a JWT as NATS writes them (`ed25519-nkey`), naming the key it was issued to (`sub`),
//! what it lets that key do (`landfall.kind`: ask to join, renew, or connect as the site) and
//! for which site, and when it expires. A connection presents it with a signature of the
//! server's nonce by that key, so a credential copied without its key is worth nothing. A
//! client sends the credential as its password ([`auth`]); a leaf node's link, from the
//! credentials file its gateway keeps ([`creds_file`]).
//!
//! The server hands every connection that is not a hub service to the identity service
//! ([`AuthRequest`], on [`crate::names::AUTH_CALLOUT`]), which answers with a user whose
//! permissions and expiry the server enforces ([`authorized`]) or a refusal ([`refused`]).

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::access::Permissions;

/// The account every landfall user is in, where the callout places sites.
pub const ACCOUNT: &str = "LANDFALL";

/// Why a credential or a callout request was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CredentialError {
    #[error("not a credential: {0}")]
    Malformed(String),
    #[error("the credential's signature does not verify")]
    Signature,
    #[error("the credential was not issued by this hub")]
    Issuer,
    #[error("the credential expired")]
    Expired,
    #[error("the connection did not prove it holds the credential's key")]
    Proof,
}

/// What a credential lets its key do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Ask to join (any key, or the one the gateway proves it holds), nothing else.
    Bootstrap,
    /// The site's enrolled identity key: connect only to ask for new link credentials.
    Identity,
    /// A link key: connect as the site.
    Link,
}

/// Landfall's part of a credential.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub kind: Kind,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub site: String,
}

/// A credential's claims.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credential {
    pub jti: String,
    pub iat: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exp: Option<i64>,
    pub iss: String,
    /// The key it was issued to; empty for a bootstrap credential, which any key may carry.
    #[serde(default)]
    pub sub: String,
    #[serde(default)]
    pub name: String,
    pub landfall: Grant,
}

const HEADER: &str = r#"{"typ":"JWT","alg":"ed25519-nkey"}"#;

/// `claims` signed by `signer`, as a NATS JWT.
///
/// # Errors
/// When the key cannot sign (a public key only).
pub fn sign_jwt<T: Serialize>(claims: &T, signer: &nkeys::KeyPair) -> Result<String, CredentialError> {
    let body = serde_json::to_vec(claims).map_err(|e| CredentialError::Malformed(e.to_string()))?;
    let signed = format!("{}.{}", URL_SAFE_NO_PAD.encode(HEADER), URL_SAFE_NO_PAD.encode(body));
    let sig = signer.sign(signed.as_bytes()).map_err(|_| CredentialError::Signature)?;
    Ok(format!("{signed}.{}", URL_SAFE_NO_PAD.encode(sig)))
}

/// A NATS JWT's claims, its signature checked against the key its `iss` names.
///
/// # Errors
/// Not three parts of base64, not JSON of `T`, or a signature that does not verify.
pub fn decode_jwt<T: DeserializeOwned>(token: &str) -> Result<(T, String), CredentialError> {
    let token = token.trim();
    let mut parts = token.split('.');
    let (Some(header), Some(body), Some(sig), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Err(CredentialError::Malformed("not three dot-separated parts".into()));
    };
    let decode = |s: &str| URL_SAFE_NO_PAD.decode(s).map_err(|e| CredentialError::Malformed(e.to_string()));
    let head: serde_json::Value =
        serde_json::from_slice(&decode(header)?).map_err(|e| CredentialError::Malformed(e.to_string()))?;
    if head.get("alg").and_then(|a| a.as_str()).is_none_or(|a| !a.eq_ignore_ascii_case("ed25519-nkey")) {
        return Err(CredentialError::Malformed("not signed with an nkey".into()));
    }
    let body = decode(body)?;
    let issuer = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("iss").and_then(|i| i.as_str()).map(str::to_string))
        .ok_or_else(|| CredentialError::Malformed("no issuer".into()))?;
    let key = nkeys::KeyPair::from_public_key(&issuer).map_err(|_| CredentialError::Issuer)?;
    let sig = decode(sig)?;
    let signed = token.rsplit_once('.').map_or("", |(signed, _)| signed);
    key.verify(signed.as_bytes(), &sig).map_err(|_| CredentialError::Signature)?;
    let claims = serde_json::from_slice(&body).map_err(|e| CredentialError::Malformed(e.to_string()))?;
    Ok((claims, issuer))
}

/// A credential of `kind` for `key` (empty for a bootstrap credential) at `site`, signed by
/// `issuer`, expiring at `exp` (unix seconds).
///
/// # Errors
/// When `issuer` cannot sign.
pub fn issue(
    issuer: &nkeys::KeyPair,
    kind: Kind,
    site: &str,
    key: &str,
    now: i64,
    exp: Option<i64>,
) -> Result<String, CredentialError> {
    let claims = Credential {
        jti: uuid::Uuid::new_v4().simple().to_string(),
        iat: now,
        exp,
        iss: issuer.public_key(),
        sub: key.to_string(),
        name: match site {
            "" => "landfall bootstrap".into(),
            site => format!("site {site}"),
        },
        landfall: Grant { kind, site: site.to_string() },
    };
    sign_jwt(&claims, issuer)
}

/// A credential `issuer` signed, unexpired at `now` (unix seconds).
///
/// # Errors
/// Not a credential, another issuer's, a bad signature, or expired.
pub fn verify(token: &str, issuer: &str, now: i64) -> Result<Credential, CredentialError> {
    let (claims, by): (Credential, String) = decode_jwt(token)?;
    if by != issuer {
        return Err(CredentialError::Issuer);
    }
    if claims.exp.is_some_and(|exp| exp <= now) {
        return Err(CredentialError::Expired);
    }
    Ok(claims)
}

/// The signature a client sends of the server's nonce (base64url, as NATS clients send it).
///
/// # Errors
/// When `key` cannot sign.
pub fn sign_nonce(key: &nkeys::KeyPair, nonce: &[u8]) -> Result<String, CredentialError> {
    key.sign(nonce).map(|s| URL_SAFE_NO_PAD.encode(s)).map_err(|_| CredentialError::Proof)
}

/// Whether `sig` (base64url or standard base64) is `key`'s signature of `nonce`.
pub fn nonce_signed_by(key: &str, nonce: &str, sig: &str) -> bool {
    let Ok(public) = nkeys::KeyPair::from_public_key(key) else { return false };
    let Some(sig) = URL_SAFE_NO_PAD.decode(sig.trim_end_matches('=')).ok().or_else(|| STANDARD.decode(sig).ok()) else {
        return false;
    };
    !nonce.is_empty() && public.verify(nonce.as_bytes(), &sig).is_ok()
}

/// What the server sends the callout about one connection (the fields landfall reads).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct AuthRequest {
    pub server_id: ServerId,
    /// The user key the server made for this connection: the answer must name it.
    pub user_nkey: String,
    pub client_info: ClientInfo,
    pub connect_opts: ConnectOpts,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ServerId {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub id: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ClientInfo {
    #[serde(default)]
    pub host: String,
    #[serde(default)]
    pub id: u64,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub nonce: String,
    #[serde(default)]
    pub name: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ConnectOpts {
    #[serde(default)]
    pub jwt: String,
    #[serde(default)]
    pub nkey: String,
    #[serde(default)]
    pub sig: String,
    #[serde(default)]
    pub user: String,
    #[serde(default)]
    pub pass: String,
}

impl ConnectOpts {
    /// The credential the connection presents: a client sends it as its password (a server
    /// not in operator mode drops a client's JWT before the callout sees it), a leaf node's link
    /// as the JWT of its credentials file.
    pub fn credential(&self) -> &str {
        if self.jwt.is_empty() { &self.pass } else { &self.jwt }
    }
}

#[derive(Deserialize)]
struct RequestClaims {
    nats: AuthRequest,
}

/// The server's request, signed by the server (whose key is its own; only servers may publish
/// on the callout subject).
///
/// # Errors
/// Not a signed authorization request.
pub fn decode_auth_request(token: &[u8]) -> Result<AuthRequest, CredentialError> {
    let token = std::str::from_utf8(token).map_err(|e| CredentialError::Malformed(e.to_string()))?;
    let (claims, _server): (RequestClaims, String) = decode_jwt(token)?;
    Ok(claims.nats)
}

/// The answer letting the connection in as `name` with `permissions` until `exp` (unix
/// seconds), signed by `issuer`.
///
/// # Errors
/// When `issuer` cannot sign.
pub fn authorized(
    request: &AuthRequest,
    issuer: &nkeys::KeyPair,
    name: &str,
    permissions: &Permissions,
    now: i64,
    exp: Option<i64>,
) -> Result<Vec<u8>, CredentialError> {
    let list = |allow: &[String], deny: &[String]| {
        let mut m = BTreeMap::new();
        m.insert("allow", allow.to_vec());
        if !deny.is_empty() {
            m.insert("deny", deny.to_vec());
        }
        m
    };
    let mut nats = serde_json::json!({
        "pub": list(&permissions.publish, &permissions.publish_deny),
        "sub": list(&permissions.subscribe, &[]),
        "subs": -1, "data": -1, "payload": -1,
        "type": "user", "version": 2,
    });
    if permissions.allow_responses {
        nats["resp"] = serde_json::json!({ "max": 1, "ttl": 0 });
    }
    let mut user = serde_json::json!({
        "jti": uuid::Uuid::new_v4().simple().to_string(),
        "iat": now,
        "iss": issuer.public_key(),
        "sub": request.user_nkey,
        "name": name,
        "aud": ACCOUNT,
        "nats": nats,
    });
    if let Some(exp) = exp {
        user["exp"] = exp.into();
    }
    respond(request, issuer, now, &sign_jwt(&user, issuer)?, "")
}

/// The answer refusing the connection, saying why (the server logs it).
///
/// # Errors
/// When `issuer` cannot sign.
pub fn refused(
    request: &AuthRequest,
    issuer: &nkeys::KeyPair,
    now: i64,
    why: &str,
) -> Result<Vec<u8>, CredentialError> {
    respond(request, issuer, now, "", why)
}

fn respond(
    request: &AuthRequest,
    issuer: &nkeys::KeyPair,
    now: i64,
    user_jwt: &str,
    error: &str,
) -> Result<Vec<u8>, CredentialError> {
    let response = serde_json::json!({
        "jti": uuid::Uuid::new_v4().simple().to_string(),
        "iat": now,
        "iss": issuer.public_key(),
        "sub": request.user_nkey,
        "aud": request.server_id.id,
        "nats": { "jwt": user_jwt, "error": error, "type": "authorization_response", "version": 2 },
    });
    sign_jwt(&response, issuer).map(String::into_bytes)
}

/// What a client sends to present `credential` with `key`'s proof of the server's `nonce`.
///
/// # Errors
/// When `key` cannot sign.
pub fn auth(credential: &str, key: &nkeys::KeyPair, nonce: &[u8]) -> Result<async_nats::Auth, async_nats::AuthError> {
    let mut auth = async_nats::Auth::new();
    auth.signature = Some(key.sign(nonce).map_err(|e| async_nats::AuthError::new(e.to_string()))?);
    auth.nkey = Some(key.public_key());
    auth.username = Some("landfall".into());
    auth.password = Some(credential.to_string());
    Ok(auth)
}

/// A short name for a key, for people comparing what a gateway prints with what the hub lists:
/// the first 8 bytes of its SHA-256, in hex, in groups of four (`1a2b:3c4d:5e6f:7a8b`).
pub fn fingerprint(key: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(key.as_bytes());
    digest[..8].chunks(2).map(|c| format!("{:02x}{:02x}", c[0], c[1])).collect::<Vec<_>>().join(":")
}

/// What the identity key signs to ask for new link credentials.
pub fn renewal_message(site: &str, link_key: &str, at_unix_ms: i64) -> Vec<u8> {
    format!("landfall renew\0{site}\0{link_key}\0{at_unix_ms}").into_bytes()
}

/// A NATS credentials file (what a leaf node's remote `credentials` reads): the credential and
/// the seed of its key.
pub fn creds_file(credential: &str, seed: &str) -> String {
    format!(
        "-----BEGIN NATS USER JWT-----\n{credential}\n------END NATS USER JWT------\n\n\
         ************************* IMPORTANT *************************\n\
         This file holds a short-lived key of this site; the gateway renews it.\n\n\
         -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_verifies_only_with_its_issuer_and_until_it_expires() {
        let issuer = nkeys::KeyPair::new_account();
        let other = nkeys::KeyPair::new_account();
        let key = nkeys::KeyPair::new_user();
        let token = issue(&issuer, Kind::Link, "s1", &key.public_key(), 100, Some(200)).unwrap();
        let c = verify(&token, &issuer.public_key(), 150).unwrap();
        assert_eq!((c.landfall.kind, c.landfall.site.as_str(), c.sub.as_str()), (Kind::Link, "s1", &*key.public_key()));
        assert_eq!(verify(&token, &other.public_key(), 150), Err(CredentialError::Issuer));
        assert_eq!(verify(&token, &issuer.public_key(), 200), Err(CredentialError::Expired));
        // One changed character in the claims breaks the signature.
        let (head, rest) = token.split_once('.').unwrap();
        let (body, sig) = rest.split_once('.').unwrap();
        let mut claims: serde_json::Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(body).unwrap()).unwrap();
        claims["landfall"]["site"] = "s2".into();
        let forged = format!("{head}.{}.{sig}", URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims).unwrap()));
        assert_eq!(verify(&forged, &issuer.public_key(), 150), Err(CredentialError::Signature));
        assert!(matches!(verify("garbage", &issuer.public_key(), 150), Err(CredentialError::Malformed(_))));
    }

    #[test]
    fn a_nonce_proves_the_key_only_when_that_key_signed_it() {
        let key = nkeys::KeyPair::new_user();
        let other = nkeys::KeyPair::new_user();
        let sig = sign_nonce(&key, b"abc").unwrap();
        assert!(nonce_signed_by(&key.public_key(), "abc", &sig));
        assert!(!nonce_signed_by(&other.public_key(), "abc", &sig));
        assert!(!nonce_signed_by(&key.public_key(), "abd", &sig));
        assert!(!nonce_signed_by(&key.public_key(), "", &sig));
        assert!(!nonce_signed_by("not a key", "abc", &sig));
    }

    #[test]
    fn fingerprints_are_short_and_grouped() {
        let (a, b) = (fingerprint(&nkeys::KeyPair::new_user().public_key()), fingerprint("U2"));
        assert_eq!((a.len(), a.matches(':').count()), (19, 3), "{a}");
        assert_ne!(a, b);
    }
}
