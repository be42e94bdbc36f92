//! Which sites a command reaches, and whether the person sending it may change them: an
//! operator of part of the fleet changes only the sites their grants cover, and a rollout they
//! start covers only those (narrowed to their part of the fleet, or refused saying why).
//! A site they may not read is answered as not registered, so its existence is not told.

use std::collections::HashMap;

use axum::http::StatusCode;
use bus_schema::pb;

use super::auth::{Principal, Role};
use super::model::State;
use super::policy::describe;
use super::state::ApiError;
use super::views::picks;

/// What a command is about.
pub enum Reach<'a> {
    /// One site; with the labels it is to have, when the command gives them (its design).
    Site { site: &'a str, labels: Option<&'a HashMap<String, String>> },
    /// The whole fleet (the catalog).
    Fleet,
    /// A rollout already started, by its id.
    Rollout(&'a str),
    /// The sites a selector picks (a new rollout): see [`narrow`].
    Selector,
}

fn forbidden(message: String) -> ApiError {
    ApiError::new(StatusCode::FORBIDDEN, "forbidden", message)
}

/// What `who` holds as an operator, for messages: `region=eu-west; region=eu-north`.
fn scope_of(who: &Principal) -> String {
    let parts: Vec<String> = who.grants_of(Role::Operator).map(|g| describe(&g.sites)).collect();
    if parts.is_empty() { "no site".into() } else { parts.join("; ") }
}

/// Whether `who` may send a command that reaches `reach`.
pub fn authorize(st: &State, who: &Principal, kind: &str, reach: &Reach<'_>) -> Result<(), ApiError> {
    if who.over_fleet(Role::Operator) {
        return Ok(());
    }
    match reach {
        Reach::Site { site, labels } => {
            let current = st.designs.get(*site);
            if let Some(d) = current
                && !who.may(Role::Operator, &d.labels)
            {
                if who.may(Role::Viewer, &d.labels) {
                    return Err(forbidden(format!(
                        "{:?} may read site {site} but not change it: {kind} takes an operator over it (yours: {})",
                        who.name,
                        scope_of(who)
                    )));
                }
                return Err(ApiError::new(
                    StatusCode::NOT_FOUND,
                    "not_found",
                    format!("site {site:?} is not registered"),
                ));
            }
            match (current, labels) {
                (_, Some(new)) if !who.may(Role::Operator, new) => Err(forbidden(format!(
                    "site {site}'s design gives it labels outside what {:?} may change ({}): {kind} refused",
                    who.name,
                    scope_of(who)
                ))),
                (None, None) => Err(forbidden(format!(
                    "site {site} is not registered, and {:?} may change only registered sites of their part of the \
                     fleet ({})",
                    who.name,
                    scope_of(who)
                ))),
                _ => Ok(()),
            }
        }
        Reach::Fleet => Err(forbidden(format!(
            "{kind} changes the whole fleet: it takes an operator of the whole fleet ({:?} is one over {})",
            who.name,
            scope_of(who)
        ))),
        Reach::Rollout(id) => {
            let Some(r) = st.rollouts.get(*id) else {
                return Err(forbidden(format!(
                    "rollout {id} is not known here yet, and only an operator of the whole fleet may {kind} a rollout \
                     this API cannot check"
                )));
            };
            let selector = r.selector.clone().unwrap_or_default();
            let outside: Vec<&str> = st
                .designs
                .values()
                .filter(|d| picks(&selector, d) && !who.may(Role::Operator, &d.labels))
                .map(|d| d.site_id.as_str())
                .collect();
            if outside.is_empty() {
                Ok(())
            } else {
                Err(forbidden(format!(
                    "rollout {id} covers {} site(s) outside what {:?} may change ({}): {kind} takes an operator over \
                     all of its sites",
                    outside.len(),
                    who.name,
                    scope_of(who)
                )))
            }
        }
        Reach::Selector => Ok(()),
    }
}

/// Holds a new rollout's selector to the part of the fleet `who` may change: named sites must all
/// be theirs; otherwise the selector takes the labels of the one grant it fits. Returns what it
/// was narrowed to, when it was.
pub fn narrow(st: &State, who: &Principal, selector: &mut pb::SiteSelector) -> Result<Option<String>, ApiError> {
    if who.over_fleet(Role::Operator) {
        return Ok(None);
    }
    if !selector.site_ids.is_empty() {
        let outside: Vec<&str> = selector
            .site_ids
            .iter()
            .filter(|s| !st.designs.get(s.as_str()).is_some_and(|d| who.may(Role::Operator, &d.labels)))
            .map(String::as_str)
            .collect();
        if outside.is_empty() {
            return Ok(None);
        }
        let shown: Vec<&str> = outside.iter().take(5).copied().collect();
        return Err(forbidden(format!(
            "the rollout names {} site(s) that {:?} may not change ({}{}): they hold operator over {}",
            outside.len(),
            who.name,
            shown.join(", "),
            if outside.len() > shown.len() { ", …" } else { "" },
            scope_of(who)
        )));
    }
    let grants: Vec<_> = who.grants_of(Role::Operator).collect();
    // Already within one grant: every pair of the grant is in the selector.
    let within = |g: &&super::policy::Grant| {
        g.sites.as_ref().is_some_and(|want| want.iter().all(|(k, v)| selector.labels.get(k) == Some(v)))
    };
    if grants.iter().any(within) {
        return Ok(None);
    }
    let fits: Vec<_> = grants
        .iter()
        .filter(|g| {
            g.sites.as_ref().is_some_and(|want| want.iter().all(|(k, v)| selector.labels.get(k).is_none_or(|x| x == v)))
        })
        .collect();
    match fits.as_slice() {
        [one] => {
            let want = one.sites.clone().unwrap_or_default();
            selector.labels.extend(want);
            Ok(Some(describe(&one.sites)))
        }
        [] => Err(forbidden(format!(
            "the rollout's selector picks no part of the fleet that {:?} may change ({})",
            who.name,
            scope_of(who)
        ))),
        _ => Err(forbidden(format!(
            "{:?} holds operator over several parts of the fleet ({}): say which one the rollout covers (add its \
             labels to the selector, or name its sites)",
            who.name,
            scope_of(who)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::policy::Grant;

    fn labels(region: &str) -> HashMap<String, String> {
        [("region".to_string(), region.to_string())].into_iter().collect()
    }

    fn state() -> State {
        let mut st = State::default();
        for (site, region) in [("eu-1", "eu-west"), ("eu-2", "eu-west"), ("us-1", "us-east")] {
            st.designs.insert(
                site.into(),
                pb::SiteDesign { site_id: site.into(), labels: labels(region), ..Default::default() },
            );
        }
        st
    }

    fn person(grants: &[(Role, Option<&str>)]) -> Principal {
        Principal {
            name: "alice".into(),
            actor: "user:alice".into(),
            grants: grants
                .iter()
                .map(|(role, region)| Grant {
                    role: *role,
                    sites: region.map(|r| [("region".to_string(), r.to_string())].into_iter().collect()),
                })
                .collect(),
        }
    }

    #[test]
    fn a_regional_operator_changes_only_their_sites() {
        let st = state();
        let alice = person(&[(Role::Operator, Some("eu-west")), (Role::Viewer, Some("us-east"))]);
        let site = |s| Reach::Site { site: s, labels: None };
        assert!(authorize(&st, &alice, "install_site", &site("eu-1")).is_ok());
        let e = format!("{:?}", authorize(&st, &alice, "install_site", &site("us-1")).unwrap_err());
        assert!(e.contains("may read site us-1 but not change it"), "{e}");
        let bob = person(&[(Role::Operator, Some("eu-west"))]);
        let e = format!("{:?}", authorize(&st, &bob, "install_site", &site("us-1")).unwrap_err());
        assert!(e.contains("not registered"), "a site they may not read is not told of: {e}");
        assert!(authorize(&st, &alice, "register_package", &Reach::Fleet).is_err());
        let moved = labels("us-east");
        let relabel = Reach::Site { site: "eu-1", labels: Some(&moved) };
        assert!(authorize(&st, &alice, "register_site", &relabel).is_err(), "no moving a site out of one's part");
        let root = person(&[(Role::Operator, None)]);
        assert!(authorize(&st, &root, "register_package", &Reach::Fleet).is_ok());
    }

    #[test]
    fn a_regional_rollout_is_narrowed_or_refused() {
        let st = state();
        let alice = person(&[(Role::Operator, Some("eu-west"))]);
        let mut everywhere = pb::SiteSelector::default();
        assert_eq!(narrow(&st, &alice, &mut everywhere).unwrap().as_deref(), Some("region=eu-west"));
        assert_eq!(everywhere.labels, labels("eu-west"));
        let mut named = pb::SiteSelector { site_ids: vec!["eu-1".into(), "us-1".into()], ..Default::default() };
        let e = format!("{:?}", narrow(&st, &alice, &mut named).unwrap_err());
        assert!(e.contains("us-1") && !e.contains("eu-1,"), "{e}");
        let mut other = pb::SiteSelector { labels: labels("us-east"), ..Default::default() };
        assert!(narrow(&st, &alice, &mut other).is_err());
        let two = person(&[(Role::Operator, Some("eu-west")), (Role::Operator, Some("us-east"))]);
        assert!(narrow(&st, &two, &mut pb::SiteSelector::default()).is_err(), "which part is not guessed");
    }
}
