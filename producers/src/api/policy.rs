//! Who may do what, on which sites: grants of a role over a part of the fleet, given to the
//! identity provider's groups and users and to static tokens, and which commands wait for a
//! second person.
//!
//! ```yaml
//! grants:
//!   - { group: platform, role: admin }                              # the whole fleet
//!   - { group: eu-ops, role: operator, sites: { region: eu-west } }  # sites with these labels
//!   - { user: carol, role: viewer }                                 # a subject or user name
//!   - { token: wall-screen, role: viewer, sites: { region: eu-west } }
//! approval:
//!   commands: [decommission_site, remove_site, remove_node]
//!   rollout_share: 0.25   # a rollout over more than a quarter of the fleet's sites
//!   by: admin             # who approves (default: an operator over what it reaches)
//! ```
//!
//! A token the policy names gets the policy's grants instead of its file's role; one it does not
//! name keeps its role over the whole fleet. A person signed in through the identity provider
//! gets the grants of their groups and of their user name, and nothing without one.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

/// A person's or program's power: each includes the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads: sites, nodes, packages, rollouts, events, the audit list.
    Viewer,
    /// Reads, and publishes commands.
    Operator,
    /// Also approves and refuses waiting commands, and reads and replaces the policy.
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
}

/// Which sites a grant covers: all, or those whose labels hold every pair given.
pub type Selector = Option<BTreeMap<String, String>>;

/// Whether a site with `labels` is one `sites` chooses.
pub fn chooses(sites: &Selector, labels: &std::collections::HashMap<String, String>) -> bool {
    sites.as_ref().is_none_or(|want| want.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

/// `region=eu-west,tier=edge`, or `the whole fleet`.
pub fn describe(sites: &Selector) -> String {
    match sites {
        None => "the whole fleet".into(),
        Some(want) => want.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(","),
    }
}

/// One role over some sites.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Grant {
    pub role: Role,
    /// `None`: the whole fleet.
    pub sites: Selector,
}

/// Whom a grant of the policy is for.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Holder {
    Group(String),
    User(String),
    Token(String),
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct GrantEntry {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    token: Option<String>,
    role: Role,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sites: Selector,
}

/// Which commands wait for a second person's approval.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Approval {
    /// Command kinds (`decommission_site`, …) that always wait.
    #[serde(default)]
    pub commands: Vec<String>,
    /// A rollout covering more than this share (0–1) of the fleet's sites waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_share: Option<f64>,
    /// The role the second person holds over what the command reaches (default: operator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<Role>,
}

impl Approval {
    /// The role that approves.
    pub fn approver(&self) -> Role {
        self.by.unwrap_or(Role::Operator)
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    #[serde(default)]
    grants: Vec<GrantEntry>,
    #[serde(default)]
    approval: Approval,
}

/// The policy the API enforces.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    grants: Vec<(Holder, Grant)>,
    pub approval: Approval,
    /// Whether any policy was given: without one, tokens keep their roles and nobody signed in
    /// through the identity provider has any.
    pub given: bool,
}

/// The command kinds a policy may name (the API's command routes).
fn known_kind(kind: &str) -> bool {
    super::commands::COMMANDS.iter().any(|c| c.kind == kind)
}

impl Policy {
    /// Reads a policy file.
    ///
    /// # Errors
    /// An unreadable file, bad YAML, a grant for nobody or for two holders, an unknown command
    /// kind, a share outside 0–1, an empty label.
    pub fn from_file(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading the policy {}", path.display()))?;
        Self::from_yaml(&text).with_context(|| format!("in the policy {}", path.display()))
    }

    pub fn from_yaml(text: &str) -> anyhow::Result<Self> {
        let file: PolicyFile = bus_schema::yaml::from_str(text)?;
        let mut grants = Vec::new();
        for (i, e) in file.grants.into_iter().enumerate() {
            let holder = match (e.group, e.user, e.token) {
                (Some(g), None, None) => Holder::Group(g),
                (None, Some(u), None) => Holder::User(u),
                (None, None, Some(t)) => Holder::Token(t),
                _ => bail!("grant {}: give exactly one of `group`, `user` and `token`", i + 1),
            };
            if let Some(sites) = &e.sites {
                if sites.is_empty() {
                    bail!(
                        "grant {}: `sites: {{}}` chooses every site; leave `sites` out to say the whole fleet",
                        i + 1
                    );
                }
                if sites.iter().any(|(k, v)| k.is_empty() || v.is_empty()) {
                    bail!("grant {}: a label and its value may not be empty", i + 1);
                }
            }
            grants.push((holder, Grant { role: e.role, sites: e.sites }));
        }
        for kind in &file.approval.commands {
            if !known_kind(kind) {
                bail!("approval: {kind:?} is not a command kind (they are named as in /v1/commands/<kind>)");
            }
        }
        if let Some(share) = file.approval.rollout_share
            && !(0.0..=1.0).contains(&share)
        {
            bail!("approval: rollout_share is a share of the fleet, from 0 to 1 (not {share})");
        }
        Ok(Self { grants, approval: file.approval, given: true })
    }

    /// The policy as YAML, as `GET /v1/policy` shows it.
    pub fn to_json(&self) -> serde_json::Value {
        let grants: Vec<serde_json::Value> = self
            .grants
            .iter()
            .map(|(holder, g)| {
                let mut v = serde_json::to_value(holder).unwrap_or_default();
                v["role"] = g.role.as_str().into();
                if let Some(sites) = &g.sites {
                    v["sites"] = serde_json::to_value(sites).unwrap_or_default();
                }
                v
            })
            .collect();
        serde_json::json!({ "grants": grants, "approval": self.approval, "given": self.given })
    }

    /// The grants of a person signed in as `user` (subject or name) in `groups`.
    pub fn person(&self, names: &[&str], groups: &[String]) -> Vec<Grant> {
        self.grants
            .iter()
            .filter(|(h, _)| match h {
                Holder::Group(g) => groups.iter().any(|x| x == g),
                Holder::User(u) => names.contains(&u.as_str()),
                Holder::Token(_) => false,
            })
            .map(|(_, g)| g.clone())
            .collect()
    }

    /// The grants of static token `name`, whose file gives it `role`.
    pub fn token(&self, name: &str, role: Role) -> Vec<Grant> {
        let named: Vec<Grant> =
            self.grants.iter().filter(|(h, _)| *h == Holder::Token(name.into())).map(|(_, g)| g.clone()).collect();
        if named.is_empty() { vec![Grant { role, sites: None }] } else { named }
    }

    /// Why a command of `kind` waits for a second person, if it does; `share` is the part of
    /// the fleet's sites a rollout covers.
    pub fn waits(&self, kind: &str, share: Option<f64>) -> Option<String> {
        if self.approval.commands.iter().any(|k| k == kind) {
            return Some(format!("the policy has {kind} wait for a second person"));
        }
        match (self.approval.rollout_share, share) {
            (Some(most), Some(share)) if share > most => Some(format!(
                "the rollout covers {:.0}% of the fleet's sites; the policy has one over {:.0}% wait for a second person",
                share * 100.0,
                most * 100.0
            )),
            _ => None,
        }
    }
}

/// `GET /v1/policy`: the policy the API enforces, for an admin. It is the file's
/// (`--api-policy`): changed there, and read again when the API starts.
pub(super) async fn show(
    axum::extract::State(api): axum::extract::State<super::ApiState>,
    axum::Extension(who): axum::Extension<super::auth::Principal>,
) -> Result<axum::Json<serde_json::Value>, super::ApiError> {
    if who.role() < Some(Role::Admin) {
        return Err(super::ApiError::new(
            axum::http::StatusCode::FORBIDDEN,
            "forbidden",
            format!("{:?} is not an admin: the policy is shown to admins", who.name),
        ));
    }
    Ok(axum::Json(api.policy.to_json()))
}

/// `/v1/policy`, for the OpenAPI document.
pub(super) fn paths(error: fn(&str) -> serde_json::Value) -> Vec<(&'static str, serde_json::Value)> {
    vec![(
        "/v1/policy",
        serde_json::json!({ "get": {
            "summary": "The policy",
            "description": "Who may do what on which sites (grants by group, user and token) and which commands wait for a second person, as the API enforces it. For admins. It is the `--api-policy` file's: changed there, read when the API starts.",
            "operationId": "policy",
            "tags": ["auth"],
            "responses": {
                "200": { "description": "The policy.", "content": { "application/json": { "schema": {
                    "type": "object", "required": ["grants", "approval", "given"], "additionalProperties": true } } } },
                "401": error("No token, or an unknown one."),
                "403": error("Not an admin."),
            },
        }}),
    )]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> std::collections::HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn grants_go_to_groups_users_and_tokens() {
        let p = Policy::from_yaml(
            "grants:\n  - {group: eu-ops, role: operator, sites: {region: eu-west}}\n  - {user: carol, role: admin}\n  \
             - {token: screen, role: viewer, sites: {region: us-east}}\napproval:\n  commands: [decommission_site]\n  \
             rollout_share: 0.25\n",
        )
        .unwrap();
        let eu = p.person(&["alice"], &["eu-ops".into(), "other".into()]);
        let eu_west = [("region".to_string(), "eu-west".to_string())].into_iter().collect();
        assert_eq!(eu, vec![Grant { role: Role::Operator, sites: Some(eu_west) }]);
        assert!(p.person(&["bob"], &["us-ops".into()]).is_empty(), "no group of the policy: no grant");
        assert_eq!(p.person(&["carol"], &[]), vec![Grant { role: Role::Admin, sites: None }]);
        assert_eq!(
            p.token("screen", Role::Operator)[0].role,
            Role::Viewer,
            "the policy's grant replaces the file's role"
        );
        assert_eq!(p.token("ci", Role::Operator), vec![Grant { role: Role::Operator, sites: None }]);
        assert!(p.waits("decommission_site", None).is_some() && p.waits("install_site", None).is_none());
        assert!(p.waits("patch_package", Some(0.3)).unwrap().contains("30%"));
        assert!(p.waits("patch_package", Some(0.2)).is_none());
        assert_eq!(p.approval.approver(), Role::Operator);
        assert!(chooses(&eu[0].sites, &labels(&[("region", "eu-west"), ("tier", "a")])));
        assert!(!chooses(&eu[0].sites, &labels(&[("region", "us-east")])));
        assert!(!chooses(&eu[0].sites, &labels(&[])));
        assert!(chooses(&None, &labels(&[])));
    }

    #[test]
    fn a_wrong_policy_says_what_is_wrong() {
        let err = |y: &str| format!("{:#}", Policy::from_yaml(y).unwrap_err());
        assert!(err("grants:\n  - {group: a, user: b, role: viewer}\n").contains("exactly one"));
        assert!(err("grants:\n  - {group: a, role: root}\n").contains("unknown variant"));
        assert!(err("grants:\n  - {group: a, role: viewer, sites: {}}\n").contains("leave `sites` out"));
        assert!(err("approval:\n  commands: [format_disk]\n").contains("not a command kind"));
        assert!(err("approval:\n  rollout_share: 2\n").contains("from 0 to 1"));
    }
}
