//! Who is asking: a static bearer token and its role, or a person signed in through the
//! identity provider ([`super::oidc`]), with the grants the policy ([`super::policy`]) gives them.
//!
//! Tokens come from a file (or `landfall up` makes one). Only their SHA-256 digests are kept
//! in memory, a presented token is compared by digest in constant time, and no token is ever
//! logged: [`Tokens`]'s `Debug` prints names and roles only.

use std::path::Path;

use anyhow::{Context, bail};
use serde::Deserialize;
use sha2::{Digest, Sha256};

pub use super::policy::Role;
use super::policy::{Grant, chooses};

/// One token as the tokens file gives it: the token itself, or its SHA-256 (hex).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    name: String,
    role: Role,
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    sha256: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    tokens: Vec<TokenEntry>,
}

/// Who a token belongs to, as its file says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenHolder {
    pub name: String,
    pub role: Role,
}

struct Known {
    digest: [u8; 32],
    who: TokenHolder,
}

/// Who a request is from, and what they may do where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// A person's user name, or a token's name.
    pub name: String,
    /// What the commands they send name as their author (`user:<name>`, `token:<name>`).
    pub actor: String,
    pub grants: Vec<Grant>,
}

impl Principal {
    /// Their highest role anywhere; `None` with no grant at all.
    pub fn role(&self) -> Option<Role> {
        self.grants.iter().map(|g| g.role).max()
    }

    /// Whether they hold `role` over a site with `labels`.
    pub fn may(&self, role: Role, labels: &std::collections::HashMap<String, String>) -> bool {
        self.grants.iter().any(|g| g.role >= role && chooses(&g.sites, labels))
    }

    /// Whether they hold `role` over the whole fleet.
    pub fn over_fleet(&self, role: Role) -> bool {
        self.grants.iter().any(|g| g.role >= role && g.sites.is_none())
    }

    /// Their grants of at least `role`.
    pub fn grants_of(&self, role: Role) -> impl Iterator<Item = &Grant> {
        self.grants.iter().filter(move |g| g.role >= role)
    }
}

/// The tokens the API accepts.
#[derive(Default)]
pub struct Tokens {
    known: Vec<Known>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.known.iter().map(|k| (&k.who.name, k.who.role))).finish()
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Equal digests, in time that does not depend on where they differ.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Tokens {
    /// Reads a tokens file:
    ///
    /// ```yaml
    /// tokens:
    ///   - { name: ci, role: operator, sha256: <64 hex digits> }
    ///   - { name: wall-screen, role: viewer, token: <the token> }
    /// ```
    ///
    /// # Errors
    /// An unreadable file, bad YAML, a token given both ways or neither, a short token.
    pub fn from_file(path: &Path) -> anyhow::Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading the tokens file {}", path.display()))?;
        Self::from_yaml(&text).with_context(|| format!("in the tokens file {}", path.display()))
    }

    pub fn from_yaml(text: &str) -> anyhow::Result<Self> {
        let file: TokensFile = bus_schema::yaml::from_str(text)?;
        let mut tokens = Self::default();
        for e in file.tokens {
            let digest = match (e.token, e.sha256) {
                (Some(t), None) if t.len() >= 16 => digest(&t),
                (Some(_), None) => bail!("token {:?}: a token must be at least 16 characters", e.name),
                (None, Some(hex)) => parse_digest(&hex).with_context(|| format!("token {:?}: sha256", e.name))?,
                _ => bail!("token {:?}: give exactly one of `token` and `sha256`", e.name),
            };
            tokens.known.push(Known { digest, who: TokenHolder { name: e.name, role: e.role } });
        }
        Ok(tokens)
    }

    /// Adds a token (as `landfall up` does with the ones it makes).
    pub fn add(&mut self, name: &str, role: Role, token: &str) {
        self.known.push(Known { digest: digest(token), who: TokenHolder { name: name.to_string(), role } });
    }

    pub fn is_empty(&self) -> bool {
        self.known.is_empty()
    }

    /// Whose token this is, if anyone's.
    pub fn check(&self, token: &str) -> Option<&TokenHolder> {
        let d = digest(token);
        // Every entry is compared, so the time taken does not tell which one matched.
        let mut found = None;
        for k in &self.known {
            if same(&k.digest, &d) && found.is_none() {
                found = Some(&k.who);
            }
        }
        found
    }
}

fn parse_digest(hex: &str) -> anyhow::Result<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        bail!("expected 64 hex digits");
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)?;
    }
    Ok(out)
}

/// A new random token: 32 bytes from the OS, as 64 hex digits.
pub fn new_token() -> anyhow::Result<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("no randomness from the OS: {e}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The tokens of a `landfall up` data directory: made once (mode 0600), then read again, so
/// a restart keeps the tokens people already use. Returns the operator's and the viewer's.
pub fn local_tokens(data_dir: &Path) -> anyhow::Result<(Tokens, String, String)> {
    let path = data_dir.join("api-tokens.yaml");
    if !path.exists() {
        let (operator, viewer) = (new_token()?, new_token()?);
        let text = format!(
            "# Bearer tokens of the local HTTP API (landfall up). Roles: viewer reads; operator\n\
             # also publishes commands; admin also approves waiting commands.\ntokens:\n  - {{ name: local-operator, role: operator, token: {operator} }}\n  \
             - {{ name: local-viewer, role: viewer, token: {viewer} }}\n"
        );
        write_private(&path, &text)?;
    }
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let tokens = Tokens::from_yaml(&text).with_context(|| format!("in {}", path.display()))?;
    let file: TokensFile = bus_schema::yaml::from_str(&text)?;
    let first =
        |role: Role| file.tokens.iter().find(|t| t.role == role).and_then(|t| t.token.clone()).unwrap_or_default();
    Ok((tokens, first(Role::Operator), first(Role::Viewer)))
}

fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    f.write_all(text.as_bytes()).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_by_value_or_digest() {
        let t = "0123456789abcdef-operator";
        let sha: String = digest("viewer-token-0123456789").iter().map(|b| format!("{b:02x}")).collect();
        let yaml = format!(
            "tokens:\n  - {{name: op, role: operator, token: {t}}}\n  - {{name: v, role: viewer, sha256: {sha}}}\n"
        );
        let tokens = Tokens::from_yaml(&yaml).unwrap();
        assert_eq!(tokens.check(t).unwrap().role, Role::Operator);
        assert_eq!(
            tokens.check("viewer-token-0123456789").unwrap(),
            &TokenHolder { name: "v".into(), role: Role::Viewer }
        );
        assert!(tokens.check("nope").is_none());
        let shown = format!("{tokens:?}");
        assert!(!shown.contains(t) && !shown.contains(&sha), "{shown}");
    }

    #[test]
    fn bad_entries_say_what_is_wrong() {
        let e = Tokens::from_yaml("tokens:\n  - {name: a, role: operator, token: short}\n").unwrap_err();
        assert!(format!("{e:#}").contains("at least 16"), "{e:#}");
        let e = Tokens::from_yaml("tokens:\n  - {name: a, role: root, token: 0123456789abcdefgh}\n").unwrap_err();
        assert!(format!("{e:#}").contains("unknown variant"), "{e:#}");
        let e = Tokens::from_yaml("tokens:\n  - {name: a, role: viewer}\n").unwrap_err();
        assert!(format!("{e:#}").contains("exactly one"), "{e:#}");
    }

    #[test]
    fn local_tokens_are_made_once_and_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (tokens, op, viewer) = local_tokens(dir.path()).unwrap();
        assert_eq!(tokens.check(&op).unwrap().role, Role::Operator);
        assert_eq!(tokens.check(&viewer).unwrap().role, Role::Viewer);
        let mode = std::fs::metadata(dir.path().join("api-tokens.yaml")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let (_, op2, _) = local_tokens(dir.path()).unwrap();
        assert_eq!(op, op2);
    }
}
