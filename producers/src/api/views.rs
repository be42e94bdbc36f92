//! The read views as JSON, computed from the model: pure functions over [`State`], so they
//! are tested without a bus. Their shapes are the OpenAPI document's `Overview`, `Site`,
//! `SiteDetail`, `Node`, `CatalogEntry` and `Rollout` schemas.

use std::collections::{BTreeMap, BTreeSet};

use bus_schema::pb;
use serde_json::{Value, json};

use super::auth::{Principal, Role};
use super::facts::{progress_of, step_label};
use super::model::State;
use crate::views::human::{kind_label, rfc3339, rfc3339_ms, role_label};
use crate::views::link::link_json;
use crate::views::observed::{desired_versions, observed_package_json};
use crate::views::rollout::{rollout_summary_json, sort_newest_first};

pub use super::facts::{NODE_STEPS, SITE_STATES, site_state};

/// Which sites a reader may see: every one, or those their grants cover (a reader of part of
/// the fleet). What they may not see is left out of every view as if it did not exist.
#[derive(Clone, Copy)]
pub enum Sees<'a> {
    All,
    Only(&'a Principal),
}

impl<'a> Sees<'a> {
    /// What `who` sees.
    pub fn of(who: &'a Principal) -> Self {
        if who.over_fleet(Role::Viewer) { Sees::All } else { Sees::Only(who) }
    }

    /// Whether the reader sees the site of design `d`.
    pub fn design(&self, d: &pb::SiteDesign) -> bool {
        match self {
            Sees::All => true,
            Sees::Only(who) => who.may(Role::Viewer, &d.labels),
        }
    }

    /// Whether the reader sees registered site `site`.
    pub fn site(&self, st: &State, site: &str) -> bool {
        matches!(self, Sees::All) || st.designs.get(site).is_some_and(|d| self.design(d))
    }

    /// Whether the reader sees a rollout: every reader of the whole fleet does; another, one
    /// that picks at least one site they see.
    pub fn rollout(&self, st: &State, r: &pb::Rollout) -> bool {
        if matches!(self, Sees::All) {
            return true;
        }
        let selector = r.selector.clone().unwrap_or_default();
        st.designs.values().any(|d| picks(&selector, d) && self.design(d))
    }
}

/// Whether `selector` picks site `d` (named, if it names sites, and holding its labels).
pub fn picks(selector: &pb::SiteSelector, d: &pb::SiteDesign) -> bool {
    (selector.site_ids.is_empty() || selector.site_ids.contains(&d.site_id))
        && selector.labels.iter().all(|(k, v)| d.labels.get(k) == Some(v))
}

fn phase_label(phase: i32) -> String {
    pb::InstallPhase::try_from(phase)
        .map(|p| p.as_str_name().trim_start_matches("INSTALL_PHASE_").to_lowercase())
        .unwrap_or_default()
}

fn outcome_label(outcome: i32) -> Option<String> {
    match pb::InstallOutcome::try_from(outcome) {
        Ok(pb::InstallOutcome::Unspecified) | Err(_) => None,
        Ok(o) => Some(o.as_str_name().trim_start_matches("INSTALL_OUTCOME_").to_lowercase()),
    }
}

fn busy(st: &State, site: &str) -> Value {
    match st.leases.get(site) {
        None => Value::Null,
        Some(l) if l.holder == pb::LeaseHolder::Rollout as i32 => json!("rollout"),
        Some(l) => match st.sagas.get(&l.saga_id) {
            Some(s) if s.join => json!("join"),
            _ => json!("install"),
        },
    }
}

/// One row of the sites table.
pub fn site_summary(st: &State, site: &str, design: &pb::SiteDesign) -> Value {
    let install = st.latest_install.get(site).and_then(|id| st.sagas.get(id));
    let (mut ready, mut failed) = (0, 0);
    for n in &design.nodes {
        match step_label(progress_of(st.node_saga(site, &n.name), &n.name).map(|p| p.step)) {
            "ready" => ready += 1,
            "failed" => failed += 1,
            _ => {}
        }
    }
    let mut versions: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for packages in st.observed.get(site).into_iter().flat_map(|nodes| nodes.values()) {
        for r in packages {
            versions.entry(&r.name).or_default().insert(&r.version);
        }
    }
    json!({
        "site": site,
        "labels": design.labels,
        "state": site_state(install),
        "busy": busy(st, site),
        "nodes": design.nodes.len(),
        "nodes_ready": ready,
        "nodes_failed": failed,
        "versions": versions,
        "install": install.map(|s| json!({
            "id": s.saga_id,
            "phase": phase_label(s.phase),
            "outcome": outcome_label(s.outcome),
            "reason": s.reason,
            "started": rfc3339_ms(s.started_unix_ms),
            "finished": rfc3339_ms(s.finished_unix_ms),
        })),
        "last_event": st.last_event.get(site).map(|e| json!({
            "type": e.type_name.rsplit('.').next().unwrap_or(&e.type_name),
            "seq": e.seq,
            "time": rfc3339(e.time),
            "summary": e.summary,
        })),
        "link": st.links.get(site).map(link_json),
        "attention": attention(st, site),
    })
}

/// What a person must do before `site` can go on, each with why.
pub fn attention(st: &State, site: &str) -> Vec<Value> {
    let disagrees = st.disagrees.get(site).map(String::as_str);
    crate::views::attention::attention_json(site, st.links.contains_key(site), disagrees)
}

/// Every node of a site: the design's, then any other node the site reported.
pub fn site_nodes(st: &State, site: &str, design: &pb::SiteDesign) -> Vec<Value> {
    let observed = st.observed.get(site);
    let mut nodes: Vec<(pb::NodeSpec, bool)> = design.nodes.iter().map(|n| (n.clone(), true)).collect();
    for name in observed.into_iter().flat_map(|o| o.keys()) {
        if !design.nodes.iter().any(|n| *n.name == **name) {
            nodes.push((pb::NodeSpec { name: name.to_string(), ..Default::default() }, false));
        }
    }
    nodes
        .into_iter()
        .map(|(n, in_design)| {
            let progress = progress_of(st.node_saga(site, &n.name), &n.name);
            let wants = desired_versions(design, n.role);
            let packages: Vec<Value> = observed
                .and_then(|o| o.get(n.name.as_str()))
                .into_iter()
                .flatten()
                .map(|r| observed_package_json(&r.name, &r.version, r.kind, &wants))
                .collect();
            json!({
                "name": n.name,
                "role": role_label(n.role),
                "boot_mac": n.boot_mac,
                "bmc_address": n.bmc_address,
                "in_design": in_design,
                "step": step_label(progress.map(|p| p.step)),
                "metal3_state": st
                    .metal3
                    .get(site)
                    .and_then(|m| m.get(n.name.as_str()))
                    .map(String::as_str)
                    .or(progress.map(|p| p.metal3_state.as_str()))
                    .unwrap_or(""),
                "out_of_service": st
                    .out_of_service
                    .get(site)
                    .and_then(|m| m.get(n.name.as_str()))
                    .map(String::as_str)
                    .unwrap_or(""),
                "failed_step": progress.map(|p| p.failed_step.as_str()).unwrap_or(""),
                "reason": progress.map(|p| p.reason.as_str()).unwrap_or(""),
                "packages": packages,
            })
        })
        .collect()
}

/// Counts by state: sites, nodes, rollouts; and whether the model has caught up with the bus.
/// The sites' and nodes' counts are the model's, kept as sites change: nothing here walks the
/// fleet.
pub fn overview(st: &State, sees: Sees<'_>) -> Value {
    let mine;
    let counts = match sees {
        Sees::All => st.counts(),
        Sees::Only(_) => {
            let mut c = super::facts::Counts::default();
            for site in st.designs.keys().filter(|site| sees.site(st, site)) {
                if let Some(f) = st.facts(site) {
                    c.add(f);
                }
            }
            mine = c;
            &mine
        }
    };
    let sites: BTreeMap<&str, usize> = SITE_STATES.iter().copied().zip(counts.by_state).collect();
    let nodes: BTreeMap<&str, usize> = NODE_STEPS.iter().copied().zip(counts.by_step).collect();
    let mut rollouts: BTreeMap<String, usize> =
        ["running", "paused", "halted", "completed", "cancelled"].iter().map(|p| (p.to_string(), 0)).collect();
    let visible: Vec<&pb::Rollout> = st.rollouts.values().filter(|r| sees.rollout(st, r)).collect();
    for r in &visible {
        if let Ok(p) = pb::RolloutPhase::try_from(r.phase)
            && p != pb::RolloutPhase::Unspecified
        {
            *rollouts.entry(p.as_str_name().trim_start_matches("ROLLOUT_PHASE_").to_lowercase()).or_default() += 1;
        }
    }
    json!({
        "ready": st.ready(),
        "sites": { "total": counts.sites, "busy": counts.busy, "cut_off": counts.cut_off, "by_state": sites },
        "nodes": { "total": counts.nodes(), "by_step": nodes },
        "rollouts": { "total": visible.len(), "by_phase": rollouts },
        "packages": st.packages.len(),
    })
}

/// Which sites a list request wants, and which page of them.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SiteQuery {
    /// Only sites in this state.
    pub state: Option<String>,
    /// Only sites whose id contains this.
    pub q: Option<String>,
    /// Only sites whose link is this: `cut_off` (the hub hears nothing of them) or `up`.
    pub link: Option<String>,
    /// Only these sites (comma-separated ids).
    pub ids: Option<String>,
    pub limit: Option<u32>,
    pub offset: Option<u32>,
}

pub const DEFAULT_PAGE: usize = 100;
pub const MAX_PAGE: usize = 1000;

/// A page of the sites table, in site id order, with the total that matched.
pub fn sites_page(st: &State, q: &SiteQuery, sees: Sees<'_>) -> Result<Value, String> {
    if let Some(s) = &q.state
        && !SITE_STATES.contains(&s.as_str())
    {
        return Err(format!("unknown state {s:?}: one of {}", SITE_STATES.join(", ")));
    }
    let link = match q.link.as_deref() {
        None => None,
        Some("cut_off") => Some(pb::LinkState::CutOff as i32),
        Some("up") => Some(pb::LinkState::Up as i32),
        Some(other) => return Err(format!("unknown link {other:?}: one of cut_off, up")),
    };
    let limit = q.limit.map_or(DEFAULT_PAGE, |l| l as usize);
    if limit == 0 || limit > MAX_PAGE {
        return Err(format!("limit must be between 1 and {MAX_PAGE}"));
    }
    let ids: Option<BTreeSet<&str>> = q.ids.as_deref().map(|ids| ids.split(',').map(str::trim).collect());
    let matching: Vec<(&String, &pb::SiteDesign)> = st
        .designs
        .iter()
        .filter(|(_, d)| sees.design(d))
        .filter(|(site, _)| ids.as_ref().is_none_or(|ids| ids.contains(site.as_str())))
        .filter(|(site, _)| q.q.as_deref().is_none_or(|needle| site.contains(needle)))
        .filter(|(site, _)| q.state.as_deref().is_none_or(|want| st.facts(site).is_some_and(|f| f.state() == want)))
        .filter(|(site, _)| link.is_none_or(|want| st.links.get(site.as_str()).is_some_and(|l| l.state == want)))
        .collect();
    let offset = q.offset.unwrap_or(0) as usize;
    let items: Vec<Value> =
        matching.iter().skip(offset).take(limit).map(|(site, d)| site_summary(st, site, d)).collect();
    Ok(json!({ "total": matching.len(), "offset": offset, "limit": limit, "items": items }))
}

/// One site with its nodes; `None` when it is not registered.
pub fn site_detail(st: &State, site: &str, sees: Sees<'_>) -> Option<Value> {
    let design = st.designs.get(site).filter(|_| sees.site(st, site))?;
    let mut v = site_summary(st, site, design);
    v["node_list"] = Value::Array(site_nodes(st, site, design));
    Some(v)
}

/// The catalog, by name then version, each with whether its name rolls out by itself.
pub fn catalog(st: &State) -> Value {
    let items: Vec<Value> = st
        .packages
        .values()
        .map(|p| {
            let auto = st.policies.get(&p.name).and_then(|pol| pol.auto_rollout.as_ref()).is_some_and(|a| a.enabled);
            json!({
                "name": p.name,
                "version": p.version,
                "kind": kind_label(p.kind),
                "sha256": p.sha256,
                "size": p.size,
                "in_store": !p.object_key.is_empty(),
                "auto_rollout": auto,
            })
        })
        .collect();
    Value::Array(items)
}

/// Every rollout, newest first.
pub fn rollouts(st: &State, sees: Sees<'_>) -> Value {
    let mut all: Vec<pb::Rollout> = st.rollouts.values().filter(|r| sees.rollout(st, r)).cloned().collect();
    sort_newest_first(&mut all);
    Value::Array(all.iter().map(rollout_summary_json).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn design(site: &str, nodes: &[(&str, pb::Role)]) -> pb::SiteDesign {
        pb::SiteDesign {
            site_id: site.into(),
            nodes: nodes
                .iter()
                .map(|(n, r)| pb::NodeSpec { name: n.to_string(), role: *r as i32, ..Default::default() })
                .collect(),
            packages: vec![pb::RolePackages {
                role: pb::Role::Worker as i32,
                packages: vec![pb::PackageRef { name: "kubelet".into(), version: "1.30.0".into() }],
            }],
            ..Default::default()
        }
    }

    fn saga(id: &str, site: &str, phase: pb::InstallPhase, steps: &[(&str, pb::NodeStep, &str)]) -> pb::InstallSaga {
        pb::InstallSaga {
            saga_id: id.into(),
            site_id: site.into(),
            phase: phase as i32,
            started_unix_ms: 1_700_000_000_000,
            nodes: steps
                .iter()
                .map(|(n, s, m3)| pb::NodeProgress {
                    node: Some(pb::NodeSpec { name: n.to_string(), ..Default::default() }),
                    step: *s as i32,
                    metal3_state: m3.to_string(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn state() -> State {
        let mut st = State::default();
        st.designs.insert("edge-01".into(), design("edge-01", &[("m1", pb::Role::Master), ("w1", pb::Role::Worker)]));
        st.designs.insert("edge-02".into(), design("edge-02", &[("m1", pb::Role::Master)]));
        st.sagas.insert(
            "s1".into(),
            saga(
                "s1",
                "edge-01",
                pb::InstallPhase::ProvisioningOs,
                &[
                    ("m1", pb::NodeStep::OsProvisioned, "provisioned"),
                    ("w1", pb::NodeStep::OsProvisioning, "provisioning"),
                ],
            ),
        );
        st.latest_install.insert("edge-01".into(), "s1".into());
        st.observe(pb::ObservedVersion {
            site_id: "edge-01".into(),
            node: "w1".into(),
            name: "kubelet".into(),
            version: "1.29.2".into(),
            kind: pb::PackageKind::Binary as i32,
            ..Default::default()
        });
        st.recount();
        st
    }

    #[test]
    fn sites_show_their_install_nodes_and_versions() {
        let st = state();
        let page = sites_page(&st, &SiteQuery::default(), Sees::All).unwrap();
        assert_eq!(page["total"], 2);
        let a = &page["items"][0];
        assert_eq!(a["state"], "installing");
        assert_eq!(a["install"]["phase"], "provisioning_os");
        assert_eq!(a["install"]["outcome"], Value::Null);
        assert_eq!(a["versions"]["kubelet"], json!(["1.29.2"]));
        assert_eq!(page["items"][1]["state"], "registered");
        assert_eq!(page["items"][1]["install"], Value::Null);

        let d = site_detail(&st, "edge-01", Sees::All).unwrap();
        let w1 = &d["node_list"][1];
        assert_eq!((w1["step"].as_str(), w1["metal3_state"].as_str()), (Some("os_provisioning"), Some("provisioning")));
        assert_eq!(w1["packages"][0]["desired"], "1.30.0");
        assert_eq!(w1["packages"][0]["differs"], true);
        assert!(site_detail(&st, "nope", Sees::All).is_none());
    }

    #[test]
    fn a_reimage_reports_a_newer_metal3_state_than_the_install() {
        let mut st = state();
        st.metal3.entry("edge-01".into()).or_default().insert("w1".into(), "deprovisioning".into());
        let d = site_detail(&st, "edge-01", Sees::All).unwrap();
        assert_eq!(d["node_list"][1]["metal3_state"], "deprovisioning");
        assert_eq!(d["node_list"][0]["metal3_state"], "provisioned", "the other node as its install left it");
    }

    #[test]
    fn a_node_out_of_service_says_so_and_the_others_do_not() {
        let mut st = state();
        st.out_of_service.entry("edge-01".into()).or_default().insert("w1".into(), "drained".into());
        let d = site_detail(&st, "edge-01", Sees::All).unwrap();
        assert_eq!(d["node_list"][1]["out_of_service"], "drained");
        assert_eq!(d["node_list"][0]["out_of_service"], "");
    }

    #[test]
    fn a_join_newer_than_the_install_tells_its_node() {
        let mut st = state();
        let mut join = saga(
            "j1",
            "edge-01",
            pb::InstallPhase::Succeeded,
            &[("w1", pb::NodeStep::BinariesInstalled, "provisioned")],
        );
        join.join = true;
        join.started_unix_ms += 1000;
        st.sagas.insert("j1".into(), join);
        st.joins.entry("edge-01".into()).or_default().insert("w1".into(), "j1".into());
        let d = site_detail(&st, "edge-01", Sees::All).unwrap();
        assert_eq!(d["node_list"][1]["step"], "ready");
        assert_eq!(d["nodes_ready"], 1);
    }

    #[test]
    fn filters_and_pages() {
        let st = state();
        let q = SiteQuery { state: Some("registered".into()), ..Default::default() };
        assert_eq!(sites_page(&st, &q, Sees::All).unwrap()["items"][0]["site"], "edge-02");
        let q = SiteQuery { q: Some("01".into()), ..Default::default() };
        assert_eq!(sites_page(&st, &q, Sees::All).unwrap()["total"], 1);
        let q = SiteQuery { ids: Some("edge-02, edge-09".into()), ..Default::default() };
        assert_eq!(sites_page(&st, &q, Sees::All).unwrap()["total"], 1);
        let q = SiteQuery { limit: Some(1), offset: Some(1), ..Default::default() };
        let page = sites_page(&st, &q, Sees::All).unwrap();
        assert_eq!((page["total"].as_u64(), page["items"].as_array().unwrap().len()), (Some(2), 1));
        assert!(
            sites_page(&st, &SiteQuery { state: Some("burning".into()), ..Default::default() }, Sees::All).is_err()
        );
        assert!(sites_page(&st, &SiteQuery { limit: Some(0), ..Default::default() }, Sees::All).is_err());
    }

    #[test]
    fn a_cut_off_site_says_since_when_and_what_it_said_last() {
        let mut st = state();
        let alive = pb::SiteAlive {
            outbox_waiting: 7,
            last_report_type: "landfall.v1.NodePatched".into(),
            last_report_unix_ms: 1_700_000_000_000,
            ..Default::default()
        };
        st.link(pb::SiteLink {
            site_id: "edge-01".into(),
            state: pb::LinkState::CutOff as i32,
            since_unix_ms: 1_700_000_001_000,
            last_alive: Some(alive),
            ..Default::default()
        });
        let q = SiteQuery { link: Some("cut_off".into()), ..Default::default() };
        let page = sites_page(&st, &q, Sees::All).unwrap();
        assert_eq!(page["total"], 1);
        let link = &page["items"][0]["link"];
        assert_eq!(link["state"], "cut_off");
        assert_eq!(link["since"], "2023-11-14T22:13:21Z");
        assert_eq!((link["outbox_waiting"].as_u64(), &link["last_report"]["type"]), (Some(7), &json!("NodePatched")));
        assert_eq!(page["items"][0]["state"], "installing", "its install goes on: cut off is not failed");
        let up = sites_page(&st, &SiteQuery { link: Some("up".into()), ..Default::default() }, Sees::All).unwrap();
        assert_eq!(up["total"], 0, "a site never heard is neither");
        assert_eq!(overview(&st, Sees::All)["sites"]["cut_off"], 1);
        assert!(sites_page(&st, &SiteQuery { link: Some("down".into()), ..Default::default() }, Sees::All).is_err());
    }

    #[test]
    fn overview_counts_every_site_and_node() {
        let o = overview(&state(), Sees::All);
        assert_eq!(o["sites"]["by_state"]["installing"], 1);
        assert_eq!(o["sites"]["by_state"]["registered"], 1);
        assert_eq!(o["nodes"]["total"], 3);
        assert_eq!(o["nodes"]["by_step"]["not_installed"], 1);
        assert_eq!(o["ready"], false);
    }
}
