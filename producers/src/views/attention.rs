//! What a person must do before a site can go on, as the API, the dashboard and `landfall
//! status` say it: its gateway was never heard from, or the site found its hosts other than the
//! hub believes (`SiteDisagrees`). Pure.

use bus_schema::pb::{self, BusMessage};
use prost::Message;
use serde_json::{Value, json};

/// The site's attention list: `heard` says whether its gateway was ever heard from,
/// `disagrees` is the reason of what it last found unlike the hub, while that stands.
pub fn attention_json(site: &str, heard: bool, disagrees: Option<&str>) -> Vec<Value> {
    let mut out = Vec::new();
    if !heard {
        out.push(json!({ "kind": "no_gateway", "reason": no_gateway_reason(site) }));
    }
    if let Some(reason) = disagrees {
        out.push(json!({ "kind": "site_disagrees", "reason": reason }));
    }
    out
}

/// What a site's event says of its disagreement with the hub: `Some(reason)` when it is one,
/// `None` otherwise; see [`clears_disagreement`] for what ends one.
pub fn disagreement_of(type_name: &str, payload: &[u8]) -> Option<String> {
    (type_name == pb::SiteDisagrees::TYPE).then(|| pb::SiteDisagrees::decode(payload).ok()).flatten().map(|d| d.reason)
}

/// Whether a site's event, coming after its disagreement, ends it: an install started again,
/// or a rollout's part of the site that left no node aside.
pub fn clears_disagreement(type_name: &str, payload: &[u8]) -> bool {
    match type_name {
        pb::SiteInstallStarted::TYPE => true,
        pb::SitePatched::TYPE => pb::SitePatched::decode(payload).is_ok_and(|p| p.skipped.is_empty()),
        _ => false,
    }
}

/// Why a site whose gateway was never heard from does nothing, and what to do.
pub fn no_gateway_reason(site: &str) -> String {
    format!(
        "no gateway has ever been heard from {site}: its jobs wait until one runs. Start one for it \
         (landfall serve gateway --site {site} --backend sim for a simulated site, --backend kube at a \
         real one; landfall up --simulate-new-sites runs simulated gateways for sites registered \
         after it started)"
    )
}
