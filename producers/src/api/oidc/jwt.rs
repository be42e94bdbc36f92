//! Signed JWTs as OpenID Connect providers issue access tokens: a compact JWS (RFC 7515) read, its
//! signature checked with ring against one key of the provider's published set (a JWK Set, RFC
//! 7517), and its registered claims (RFC 7519) checked.
//!
//! The token decides nothing about how it is checked: its `alg` must be one of a fixed few and fit
//! the key it names (an RSA key checks RS256 and PS256 only, a P-256 key ES256 only, an Ed25519
//! key EdDSA only, and a key that states its `alg` that one only). Keys come only from the
//! provider's set, never from the token (`jwk`, `jku`, `x5u` and `x5c` headers are ignored).

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::signature;
use serde_json::{Map, Value};

/// Longer tokens are refused before any work is done on them.
pub(super) const MAX_TOKEN_LEN: usize = 16 * 1024;

/// The signature algorithms accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Alg {
    Rs256,
    Ps256,
    Es256,
    /// `EdDSA`, or its fully specified name `Ed25519`: Ed25519 signatures.
    Ed25519,
}

impl Alg {
    fn parse(name: &str) -> Result<Alg, String> {
        match name {
            "RS256" => Ok(Alg::Rs256),
            "PS256" => Ok(Alg::Ps256),
            "ES256" => Ok(Alg::Es256),
            "EdDSA" | "Ed25519" => Ok(Alg::Ed25519),
            n if n.eq_ignore_ascii_case("none") => {
                Err("the token is unsigned (alg none), which is never accepted".into())
            }
            n if n.starts_with("HS") => {
                Err(format!("the token is signed with a shared secret ({}), which is never accepted", shown(n)))
            }
            n => Err(format!("the token's algorithm {} is not accepted (RS256, PS256, ES256 and EdDSA are)", shown(n))),
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Alg::Rs256 => "RS256",
            Alg::Ps256 => "PS256",
            Alg::Es256 => "ES256",
            Alg::Ed25519 => "EdDSA",
        }
    }
}

/// A public key of the provider's set.
#[derive(Clone)]
enum PublicKey {
    Rsa {
        n: Vec<u8>,
        e: Vec<u8>,
    },
    /// An uncompressed P-256 point (0x04 ‖ x ‖ y).
    P256(Vec<u8>),
    Ed25519(Vec<u8>),
}

/// One usable signing key of the provider's set.
#[derive(Clone)]
pub(super) struct Jwk {
    pub(super) kid: Option<String>,
    /// The one algorithm the set says the key is for, when it says.
    alg: Option<String>,
    key: PublicKey,
}

impl std::fmt::Debug for Jwk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jwk").field("kid", &self.kid).field("kty", &self.kty()).field("alg", &self.alg).finish()
    }
}

impl Jwk {
    fn kty(&self) -> &'static str {
        match self.key {
            PublicKey::Rsa { .. } => "RSA",
            PublicKey::P256(_) => "EC P-256",
            PublicKey::Ed25519(_) => "OKP Ed25519",
        }
    }

    /// Whether this key can have made an `alg` signature.
    fn fits(&self, alg: Alg) -> bool {
        let kind = matches!(
            (&self.key, alg),
            (PublicKey::Rsa { .. }, Alg::Rs256 | Alg::Ps256)
                | (PublicKey::P256(_), Alg::Es256)
                | (PublicKey::Ed25519(_), Alg::Ed25519)
        );
        let stated = match self.alg.as_deref() {
            None => true,
            Some("EdDSA" | "Ed25519") => alg == Alg::Ed25519,
            Some(a) => a == alg.name(),
        };
        kind && stated
    }

    fn verifies(&self, alg: Alg, message: &[u8], sig: &[u8]) -> bool {
        match (&self.key, alg) {
            (PublicKey::Rsa { n, e }, Alg::Rs256) => signature::RsaPublicKeyComponents { n, e }
                .verify(&signature::RSA_PKCS1_2048_8192_SHA256, message, sig)
                .is_ok(),
            (PublicKey::Rsa { n, e }, Alg::Ps256) => signature::RsaPublicKeyComponents { n, e }
                .verify(&signature::RSA_PSS_2048_8192_SHA256, message, sig)
                .is_ok(),
            (PublicKey::P256(point), Alg::Es256) => {
                signature::UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
                    .verify(message, sig)
                    .is_ok()
            }
            (PublicKey::Ed25519(x), Alg::Ed25519) => {
                signature::UnparsedPublicKey::new(&signature::ED25519, x).verify(message, sig).is_ok()
            }
            _ => false,
        }
    }

    /// One member of a JWK Set; `None` for keys that cannot check these tokens (encryption keys,
    /// other curves, malformed members), which are skipped rather than failing the whole set.
    fn parse(jwk: &Value) -> Option<Jwk> {
        let text = |name: &str| jwk.get(name).and_then(Value::as_str);
        let bytes = |name: &str| text(name).and_then(|s| URL_SAFE_NO_PAD.decode(s).ok());
        if text("use").is_some_and(|u| u != "sig") {
            return None;
        }
        if let Some(ops) = jwk.get("key_ops").and_then(Value::as_array)
            && !ops.iter().any(|o| o.as_str() == Some("verify"))
        {
            return None;
        }
        let key = match text("kty")? {
            "RSA" => {
                let n = without_leading_zeros(bytes("n")?);
                let e = without_leading_zeros(bytes("e")?);
                (!n.is_empty() && !e.is_empty()).then_some(PublicKey::Rsa { n, e })?
            }
            "EC" if text("crv") == Some("P-256") => {
                let (x, y) = (bytes("x")?, bytes("y")?);
                if x.len() != 32 || y.len() != 32 {
                    return None;
                }
                PublicKey::P256([&[4u8][..], &x, &y].concat())
            }
            "OKP" if text("crv") == Some("Ed25519") => {
                let x = bytes("x")?;
                (x.len() == 32).then_some(PublicKey::Ed25519(x))?
            }
            _ => return None,
        };
        Some(Jwk { kid: text("kid").map(str::to_string), alg: text("alg").map(str::to_string), key })
    }
}

fn without_leading_zeros(mut b: Vec<u8>) -> Vec<u8> {
    let zeros = b.iter().take_while(|&&x| x == 0).count();
    b.drain(..zeros);
    b
}

/// The usable signing keys of a JWK Set document (`{"keys": [...]}`).
pub(super) fn parse_jwks(doc: &Value) -> Result<Vec<Jwk>, String> {
    let keys = doc.get("keys").and_then(Value::as_array).ok_or("the JWK Set has no \"keys\" array")?;
    Ok(keys.iter().filter_map(Jwk::parse).collect())
}

/// A token split and its header read; nothing in it is trusted yet.
pub(super) struct Unverified<'a> {
    pub(super) alg: Alg,
    pub(super) kid: Option<String>,
    signing_input: &'a str,
    signature: Vec<u8>,
    payload: &'a str,
}

/// Reads a compact JWS's header and refuses what no key could make acceptable.
pub(super) fn split(token: &str) -> Result<Unverified<'_>, String> {
    const NOT_JWT: &str = "the token is not a JWT (three base64url parts separated by dots)";
    if token.len() > MAX_TOKEN_LEN {
        return Err(format!("the token is longer than {MAX_TOKEN_LEN} bytes"));
    }
    let mut parts = token.split('.');
    let (Some(header), Some(payload), Some(sig), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(NOT_JWT.into());
    };
    let header: Value = URL_SAFE_NO_PAD
        .decode(header)
        .ok()
        .and_then(|h| serde_json::from_slice(&h).ok())
        .filter(Value::is_object)
        .ok_or(NOT_JWT)?;
    let alg = header.get("alg").and_then(Value::as_str).ok_or("the token's header names no algorithm (alg)")?;
    let alg = Alg::parse(alg)?;
    if header.get("crit").is_some() {
        return Err("the token's header has critical extensions (crit), which this API does not implement".into());
    }
    let kid = match header.get("kid") {
        None => None,
        Some(Value::String(k)) => Some(k.clone()),
        Some(_) => return Err("the token's key id (kid) is not a string".into()),
    };
    let signature = URL_SAFE_NO_PAD.decode(sig).map_err(|_| NOT_JWT)?;
    let signing_input = &token[..token.len() - sig.len() - 1];
    Ok(Unverified { alg, kid, signing_input, signature, payload })
}

/// What became of looking for a token's key.
pub(super) enum KeyCheck {
    /// The claims, the signature having verified.
    Verified(Map<String, Value>),
    /// No key in the set has the token's `kid`: a newer set may.
    UnknownKid,
    Refused(String),
}

impl Unverified<'_> {
    /// Checks the signature against the keys of `set` that may have made it, and only then
    /// reads the claims.
    pub(super) fn check(&self, set: &[Jwk]) -> KeyCheck {
        let candidates: Vec<&Jwk> = match &self.kid {
            Some(kid) => set.iter().filter(|k| k.kid.as_deref() == Some(kid.as_str())).collect(),
            None => set.iter().collect(),
        };
        if candidates.is_empty() {
            return match self.kid {
                Some(_) => KeyCheck::UnknownKid,
                None => KeyCheck::Refused("the identity provider publishes no signing keys".into()),
            };
        }
        let fitting: Vec<&Jwk> = candidates.iter().copied().filter(|k| k.fits(self.alg)).collect();
        if fitting.is_empty() {
            let what: Vec<String> = candidates
                .iter()
                .map(|k| {
                    format!(
                        "{} key{}",
                        k.kty(),
                        k.alg.as_deref().map(|a| format!(" for {}", shown(a))).unwrap_or_default()
                    )
                })
                .collect();
            return KeyCheck::Refused(format!(
                "the token says {} but its key {} is {}; that key cannot have signed it",
                self.alg.name(),
                self.kid.as_deref().map(shown).unwrap_or_else(|| "(no kid)".into()),
                what.join(" or ")
            ));
        }
        if !fitting.iter().any(|k| k.verifies(self.alg, self.signing_input.as_bytes(), &self.signature)) {
            return KeyCheck::Refused("the token's signature does not verify".into());
        }
        match URL_SAFE_NO_PAD.decode(self.payload).ok().and_then(|p| serde_json::from_slice(&p).ok()) {
            Some(Value::Object(claims)) => KeyCheck::Verified(claims),
            _ => KeyCheck::Refused("the token's payload is not a JSON object".into()),
        }
    }
}

/// What the claims must say, and the time to check them at.
pub(super) struct Expect<'a> {
    pub(super) issuer: &'a str,
    pub(super) audience: &'a str,
    pub(super) now: i64,
    pub(super) leeway: i64,
}

/// The registered claims of a verified token; returns its `exp`.
pub(super) fn check_claims(claims: &Map<String, Value>, want: &Expect<'_>) -> Result<i64, String> {
    match claims.get("iss").and_then(Value::as_str) {
        Some(iss) if iss == want.issuer => {}
        Some(iss) => return Err(format!("the token was issued by {}, not by {}", shown(iss), shown(want.issuer))),
        None => return Err("the token names no issuer (iss)".into()),
    }
    let audiences: Vec<&str> = match claims.get("aud") {
        Some(Value::String(a)) => vec![a.as_str()],
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
        _ => return Err("the token names no audience (aud)".into()),
    };
    if !audiences.contains(&want.audience) {
        let named: Vec<String> = audiences.iter().take(5).map(|a| shown(a)).collect();
        return Err(format!("the token is for {}, not for {}", named.join(", "), shown(want.audience)));
    }
    let time = |name: &str| -> Result<Option<i64>, String> {
        match claims.get(name) {
            None => Ok(None),
            Some(v) => v
                .as_i64()
                .or_else(|| v.as_f64().filter(|f| f.is_finite()).map(|f| f.floor() as i64))
                .map(Some)
                .ok_or_else(|| format!("the token's {name} is not a number of seconds")),
        }
    };
    let exp = time("exp")?.ok_or("the token has no expiry (exp)")?;
    if exp.saturating_add(want.leeway) <= want.now {
        return Err(format!("the token expired {} s ago", want.now.saturating_sub(exp)));
    }
    if let Some(nbf) = time("nbf")?
        && nbf > want.now.saturating_add(want.leeway)
    {
        return Err(format!("the token is not valid for another {} s (nbf)", nbf - want.now));
    }
    if let Some(iat) = time("iat")?
        && iat > want.now.saturating_add(want.leeway)
    {
        return Err(format!("the token says it was issued {} s from now (iat)", iat - want.now));
    }
    Ok(exp)
}

/// A value from a token, for a message: quoted, and cut short.
pub(super) fn shown(s: &str) -> String {
    let cut: String = s.chars().take(80).collect();
    if cut.len() < s.len() { format!("{:?}…", cut) } else { format!("{cut:?}") }
}
