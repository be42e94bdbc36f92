//! Rollout planning, as pure functions shared by the orchestrator and `landfall package patch
//! --dry-run`: which nodes a `PatchPackage` touches, in which order, in which waves.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::domain::{InvalidField, PackageName, SiteDesign, SiteId, Version};
use crate::pb;

/// A count, or a percentage of some total (`"3"`, `"25%"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Amount {
    Count(u32),
    Percent(u32),
}

impl Amount {
    /// Parses `"N"` or `"P%"`; an empty string is `default`.
    pub fn parse(s: &str, field: &str, default: Amount) -> Result<Amount, InvalidField> {
        let s = s.trim();
        if s.is_empty() {
            return Ok(default);
        }
        let bad = || InvalidField::new(field, format!("{s:?} is not a count (\"3\") or a percentage (\"25%\")"));
        match s.strip_suffix('%') {
            Some(p) => {
                let p: u32 = p.trim().parse().map_err(|_| bad())?;
                if p > 100 {
                    return Err(InvalidField::new(field, format!("{s:?} is more than 100%")));
                }
                Ok(Amount::Percent(p))
            }
            None => s.parse().map(Amount::Count).map_err(|_| bad()),
        }
    }

    /// The amount out of `total` (a percentage rounds down).
    pub fn of(self, total: u32) -> u32 {
        match self {
            Amount::Count(n) => n,
            Amount::Percent(p) => (u64::from(total) * u64::from(p) / 100) as u32,
        }
    }
}

impl std::fmt::Display for Amount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Amount::Count(n) => write!(f, "{n}"),
            Amount::Percent(p) => write!(f, "{p}%"),
        }
    }
}

/// Canary sites: named, or the first N of the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Canary {
    Sites(Vec<SiteId>),
    Count(u32),
}

/// A validated `RolloutStrategy`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Strategy {
    pub canary: Canary,
    /// Sites per wave; 0 means every site in one wave.
    pub max_concurrent_sites: u32,
    /// Nodes of one site patched at once (at least one).
    pub max_unavailable: Amount,
    /// Failures tolerated, over all planned nodes, before the rollout halts.
    pub failure_threshold: Amount,
    pub wave_timeout: Option<Duration>,
    pub on_wave_timeout: pb::WaveTimeoutAction,
    /// Where the rollout waits for a person.
    pub approval: pb::ApprovalGate,
    /// What a node whose patch fails becomes.
    pub on_failure: pb::OnNodeFailure,
    /// Whether crossing the failure threshold rolls the whole rollout back.
    pub roll_back_on_halt: bool,
}

impl Strategy {
    /// Nodes of a site with `nodes` planned nodes that are patched at once: at least one.
    pub fn max_unavailable_of(&self, nodes: u32) -> u32 {
        self.max_unavailable.of(nodes).max(1)
    }
}

impl TryFrom<&pb::RolloutStrategy> for Strategy {
    type Error = InvalidField;
    fn try_from(s: &pb::RolloutStrategy) -> Result<Self, InvalidField> {
        let canary = if s.canary_site_ids.is_empty() {
            Canary::Count(s.canary_sites)
        } else {
            if s.canary_sites != 0 {
                return Err(InvalidField::new("strategy.canary", "give canary sites by name or by count, not both"));
            }
            let ids = s
                .canary_site_ids
                .iter()
                .map(|id| SiteId::try_from(id.as_str()))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| InvalidField::new("strategy.canary_site_ids", e.reason))?;
            Canary::Sites(ids)
        };
        let on_wave_timeout = match pb::WaveTimeoutAction::try_from(s.on_wave_timeout) {
            Ok(pb::WaveTimeoutAction::Unspecified) => pb::WaveTimeoutAction::Abort,
            Ok(a) => a,
            Err(_) => {
                return Err(InvalidField::new(
                    "strategy.on_wave_timeout",
                    format!("{} is not continue or abort", s.on_wave_timeout),
                ));
            }
        };
        let approval = pb::ApprovalGate::try_from(s.approval).map_err(|_| {
            InvalidField::new("strategy.approval", format!("{} is not after-canary or after-each-wave", s.approval))
        })?;
        let on_failure = match pb::OnNodeFailure::try_from(s.on_failure) {
            Ok(pb::OnNodeFailure::Unspecified) => pb::OnNodeFailure::Leave,
            Ok(f) => f,
            Err(_) => {
                return Err(InvalidField::new(
                    "strategy.on_failure",
                    format!("{} is not leave or roll-back", s.on_failure),
                ));
            }
        };
        let no_canary = matches!(&canary, Canary::Count(0));
        if approval == pb::ApprovalGate::AfterCanary && no_canary {
            return Err(InvalidField::new(
                "strategy.approval",
                "approval after the canary needs a canary (canary sites)",
            ));
        }
        Ok(Self {
            approval,
            on_failure,
            roll_back_on_halt: s.roll_back_on_halt,
            canary,
            max_concurrent_sites: s.max_concurrent_sites,
            max_unavailable: Amount::parse(&s.max_unavailable, "strategy.max_unavailable", Amount::Count(1))?,
            failure_threshold: Amount::parse(&s.failure_threshold, "strategy.failure_threshold", Amount::Count(0))?,
            wave_timeout: (s.wave_timeout_seconds > 0).then(|| Duration::from_secs(u64::from(s.wave_timeout_seconds))),
            on_wave_timeout,
        })
    }
}

/// The id of the rollout that undoes rollout `undone` (`RollbackRollout`): derived, so a
/// rollout has one rollback whoever asks for it.
pub fn rollback_id(undone: &str) -> String {
    crate::ids::derived_id(undone, "rollback", None).to_string()
}

/// Which sites a selector picks: those named (all of them must exist), intersected with those
/// whose labels hold every pair given. An empty selector picks every site.
pub fn select<'a>(selector: &pb::SiteSelector, sites: &'a [SiteDesign]) -> Result<Vec<&'a SiteDesign>, InvalidField> {
    let known: BTreeSet<&str> = sites.iter().map(|s| s.site.as_str()).collect();
    if let Some(missing) = selector.site_ids.iter().find(|id| !known.contains(id.as_str())) {
        return Err(InvalidField::new("selector.site_ids", format!("site {missing} is not registered")));
    }
    let named: BTreeSet<&str> = selector.site_ids.iter().map(String::as_str).collect();
    Ok(sites
        .iter()
        .filter(|s| named.is_empty() || named.contains(s.site.as_str()))
        .filter(|s| selector.labels.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
        .collect())
}

/// One node the rollout patches.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedNode {
    pub spec: pb::NodeSpec,
    /// What it ran when planned ("" when its gateway never reported the package).
    pub from_version: String,
}

/// One site of the plan, with the nodes it patches.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedSite {
    pub site: String,
    pub canary: bool,
    pub nodes: Vec<PlannedNode>,
}

/// What a rollout does: sites in order (canaries first), cut into waves.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub sites: Vec<PlannedSite>,
    /// The plan index one past each wave's last site.
    pub wave_ends: Vec<u32>,
    pub planned_nodes: u32,
    /// Nodes that run the version already: never touched.
    pub nodes_at_target: u32,
    /// Nodes whose gateway has reported nothing yet (never installed): left to their install.
    pub nodes_not_installed: u32,
    /// Failures tolerated before the rollout halts, resolved against the planned nodes.
    pub failure_threshold: u32,
}

impl Plan {
    /// The sites of wave `w`, as a range of plan indexes.
    pub fn wave(&self, w: usize) -> std::ops::Range<usize> {
        let start = if w == 0 { 0 } else { self.wave_ends[w - 1] as usize };
        start..self.wave_ends[w] as usize
    }

    /// The wave of every site, in plan order.
    pub fn site_plans(&self) -> Vec<pb::RolloutSitePlan> {
        let mut out = Vec::with_capacity(self.sites.len());
        for w in 0..self.wave_ends.len() {
            for s in &self.sites[self.wave(w)] {
                out.push(pb::RolloutSitePlan {
                    site_id: s.site.clone(),
                    nodes: s.nodes.len() as u32,
                    wave: w as u32,
                    canary: s.canary,
                });
            }
        }
        out
    }
}

/// What each node runs of the package, by (site, node): its observed version, when reported.
pub type ObservedVersions = BTreeMap<(String, String), Option<String>>;

/// The versions of `package` that `landfall-observed` records, by (site, node): `None` for a
/// node whose record does not mention the package.
pub fn observed_versions<'a>(
    package: &str,
    records: impl IntoIterator<Item = &'a pb::NodeObserved>,
) -> ObservedVersions {
    records
        .into_iter()
        .map(|r| {
            let v = r.packages.iter().find(|p| p.name == package).map(|p| p.version.clone());
            ((r.site_id.clone(), r.node.clone()), v)
        })
        .collect()
}

/// Orders versions the way people read them: numeric parts as numbers, others as text, so
/// `1.29.10` is newer than `1.29.9` and `22.04.4` newer than `22.04`.
pub fn version_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    let parts = |s: &str| -> Vec<String> { s.split(|c: char| !c.is_ascii_alphanumeric()).map(str::to_owned).collect() };
    let (pa, pb) = (parts(a), parts(b));
    for i in 0..pa.len().max(pb.len()) {
        let (x, y) = (pa.get(i), pb.get(i));
        let ord = match (x, y) {
            (None, _) => std::cmp::Ordering::Less,
            (_, None) => std::cmp::Ordering::Greater,
            (Some(x), Some(y)) => match (x.parse::<u64>(), y.parse::<u64>()) {
                (Ok(x), Ok(y)) => x.cmp(&y),
                _ => x.cmp(y),
            },
        };
        if ord != std::cmp::Ordering::Equal {
            return ord;
        }
    }
    std::cmp::Ordering::Equal
}

/// Which nodes a plan takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Direction {
    /// Every node at another version.
    #[default]
    Any,
    /// Only nodes at an older version: an upgrade never downgrades a node that is ahead.
    OnlyOlder,
    /// Every node, those at the version too (a helm chart rendered again with its sites' values
    /// as they are now).
    Again,
}

/// Plans moving `name` to `version`: every node of the selected sites whose role's package set
/// holds `name`, that has reported what it runs, and runs another version (an older one, with
/// [`Direction::OnlyOlder`]).
pub fn plan(
    name: &PackageName,
    version: &Version,
    selector: &pb::SiteSelector,
    strategy: &Strategy,
    sites: &[SiteDesign],
    observed: &ObservedVersions,
) -> Result<Plan, InvalidField> {
    plan_with(name, version, Direction::Any, selector, strategy, sites, observed)
}

/// [`plan`], choosing the direction.
pub fn plan_with(
    name: &PackageName,
    version: &Version,
    direction: Direction,
    selector: &pb::SiteSelector,
    strategy: &Strategy,
    sites: &[SiteDesign],
    observed: &ObservedVersions,
) -> Result<Plan, InvalidField> {
    let selected = select(selector, sites)?;
    let mut planned: Vec<PlannedSite> = Vec::new();
    let (mut at_target, mut not_installed) = (0u32, 0u32);
    for site in &selected {
        let mut nodes = Vec::new();
        for node in &site.nodes {
            if !site.packages_for(node.role).iter().any(|p| p.name == *name) {
                continue;
            }
            match observed.get(&(site.site.to_string(), node.name.to_string())) {
                None => not_installed += 1,
                Some(Some(v)) if v == version.as_str() && direction != Direction::Again => at_target += 1,
                Some(Some(v))
                    if direction == Direction::OnlyOlder
                        && version_cmp(v, version.as_str()) == std::cmp::Ordering::Greater =>
                {
                    at_target += 1
                }
                Some(v) => nodes
                    .push(PlannedNode { spec: pb::NodeSpec::from(node), from_version: v.clone().unwrap_or_default() }),
            }
        }
        if !nodes.is_empty() {
            planned.push(PlannedSite { site: site.site.to_string(), canary: false, nodes });
        }
    }
    planned.sort_by(|a, b| a.site.cmp(&b.site));

    // Canaries first, in the order given (or the first N), then the rest.
    let canaries: Vec<String> = match &strategy.canary {
        Canary::Sites(ids) => {
            let chosen: BTreeSet<&str> = selected.iter().map(|s| s.site.as_str()).collect();
            if let Some(id) = ids.iter().find(|id| !chosen.contains(id.as_str())) {
                return Err(InvalidField::new(
                    "strategy.canary_site_ids",
                    format!("{id} is not among the selected sites"),
                ));
            }
            ids.iter().map(ToString::to_string).filter(|id| planned.iter().any(|p| &p.site == id)).collect()
        }
        Canary::Count(n) => planned.iter().take(*n as usize).map(|p| p.site.clone()).collect(),
    };
    let mut sites: Vec<PlannedSite> = Vec::with_capacity(planned.len());
    for id in &canaries {
        if let Some(i) = planned.iter().position(|p| &p.site == id) {
            let mut s = planned.remove(i);
            s.canary = true;
            sites.push(s);
        }
    }
    let canary_count = sites.len();
    sites.extend(planned);

    let mut wave_ends = Vec::new();
    if canary_count > 0 {
        wave_ends.push(canary_count as u32);
    }
    let per_wave =
        if strategy.max_concurrent_sites == 0 { sites.len() } else { strategy.max_concurrent_sites as usize };
    let mut end = canary_count;
    while end < sites.len() {
        end = (end + per_wave.max(1)).min(sites.len());
        wave_ends.push(end as u32);
    }
    let planned_nodes = sites.iter().map(|s| s.nodes.len() as u32).sum();
    Ok(Plan {
        failure_threshold: strategy.failure_threshold.of(planned_nodes),
        sites,
        wave_ends,
        planned_nodes,
        nodes_at_target: at_target,
        nodes_not_installed: not_installed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(id: &str, labels: &[(&str, &str)], nodes: usize) -> SiteDesign {
        let nodes: Vec<pb::NodeSpec> = (1..=nodes)
            .map(|i| pb::NodeSpec {
                name: format!("node-{i}"),
                role: if i == 1 { pb::Role::Master } else { pb::Role::Worker } as i32,
                boot_mac: format!("52:54:00:00:00:{i:02x}"),
                bmc_address: format!("ipmi://10.0.0.{i}"),
                labels: Default::default(),
                ..Default::default()
            })
            .collect();
        let refs = |v: &str| vec![pb::PackageRef { name: "kubelet".into(), version: v.into() }];
        SiteDesign::try_from(pb::SiteDesign {
            site_id: id.into(),
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            nodes,
            packages: vec![
                pb::RolePackages { role: pb::Role::Master as i32, packages: refs("1.29.2") },
                pb::RolePackages { role: pb::Role::Worker as i32, packages: refs("1.29.2") },
            ],
            cluster: None,
            chart_values: Default::default(),
            maintenance_windows: Vec::new(),
        })
        .unwrap()
    }

    fn observed_all(sites: &[SiteDesign], version: &str) -> ObservedVersions {
        sites
            .iter()
            .flat_map(|s| s.nodes.iter().map(move |n| ((s.site.to_string(), n.name.to_string()), Some(version.into()))))
            .collect()
    }

    fn strategy(s: pb::RolloutStrategy) -> Strategy {
        Strategy::try_from(&s).unwrap()
    }

    fn go(selector: pb::SiteSelector, st: &Strategy, sites: &[SiteDesign], obs: &ObservedVersions) -> Plan {
        let name = PackageName::try_from("kubelet").unwrap();
        plan(&name, &Version::try_from("1.30.0").unwrap(), &selector, st, sites, obs).unwrap()
    }

    #[test]
    fn versions_order_as_people_read_them() {
        use std::cmp::Ordering::*;
        assert_eq!(version_cmp("1.29.10", "1.29.9"), Greater);
        assert_eq!(version_cmp("22.04", "22.04.4"), Less);
        assert_eq!(version_cmp("1.29.2", "1.29.2"), Equal);
        assert_eq!(version_cmp("3.27.2", "3.28.0"), Less);
    }

    #[test]
    fn only_older_never_downgrades() {
        let sites = vec![site("edge-01", &[], 2)];
        let mut obs = observed_all(&sites, "1.29.2");
        obs.insert(("edge-01".into(), "node-2".into()), Some("1.31.0".into()));
        let (name, v) = (PackageName::try_from("kubelet").unwrap(), Version::try_from("1.30.0").unwrap());
        let st = strategy(Default::default());
        let p = plan_with(&name, &v, Direction::OnlyOlder, &Default::default(), &st, &sites, &obs).unwrap();
        assert_eq!((p.planned_nodes, p.nodes_at_target), (1, 1));
    }

    #[test]
    fn again_plans_the_nodes_at_the_version_too_but_not_those_never_installed() {
        let sites = vec![site("edge-01", &[], 3)];
        let mut obs = observed_all(&sites, "1.30.0");
        obs.remove(&("edge-01".into(), "node-3".into()));
        let (name, v) = (PackageName::try_from("kubelet").unwrap(), Version::try_from("1.30.0").unwrap());
        let st = strategy(Default::default());
        let p = plan_with(&name, &v, Direction::Any, &Default::default(), &st, &sites, &obs).unwrap();
        assert_eq!((p.planned_nodes, p.nodes_at_target, p.nodes_not_installed), (0, 2, 1));
        let p = plan_with(&name, &v, Direction::Again, &Default::default(), &st, &sites, &obs).unwrap();
        assert_eq!((p.planned_nodes, p.nodes_at_target, p.nodes_not_installed), (2, 0, 1));
    }

    #[test]
    fn amounts() {
        let c = Amount::Count(1);
        assert_eq!(Amount::parse("25%", "f", c).unwrap().of(10), 2);
        assert_eq!(Amount::parse(" 3 ", "f", c).unwrap().of(10), 3);
        assert_eq!(Amount::parse("", "f", c).unwrap(), c);
        for bad in ["x", "-1", "101%", "%"] {
            assert!(Amount::parse(bad, "strategy.max_unavailable", c).unwrap_err().field.contains("max_unavailable"));
        }
    }

    #[test]
    fn canaries_first_then_waves_of_at_most_n() {
        let sites: Vec<SiteDesign> = (1..=7).map(|i| site(&format!("edge-{i:02}"), &[], 3)).collect();
        let obs = observed_all(&sites, "1.29.2");
        let st = strategy(pb::RolloutStrategy { canary_sites: 2, max_concurrent_sites: 2, ..Default::default() });
        let p = go(Default::default(), &st, &sites, &obs);
        assert_eq!(p.wave_ends, [2, 4, 6, 7]);
        assert!(p.sites[0].canary && p.sites[1].canary && !p.sites[2].canary);
        assert_eq!(p.planned_nodes, 21);
        let named = strategy(pb::RolloutStrategy { canary_site_ids: vec!["edge-05".into()], ..Default::default() });
        let p = go(Default::default(), &named, &sites, &obs);
        assert_eq!(p.sites[0].site, "edge-05");
        assert_eq!(p.wave_ends, [1, 7], "one canary wave, then everything");
        assert_eq!(p.site_plans()[3].wave, 1);
    }

    #[test]
    fn nodes_at_target_or_never_installed_are_not_touched() {
        let sites = vec![site("edge-01", &[], 3), site("edge-02", &[], 2)];
        let mut obs = observed_all(&sites, "1.29.2");
        obs.insert(("edge-01".into(), "node-2".into()), Some("1.30.0".into()));
        obs.remove(&("edge-02".to_string(), "node-1".to_string()));
        let p = go(Default::default(), &strategy(Default::default()), &sites, &obs);
        assert_eq!((p.planned_nodes, p.nodes_at_target, p.nodes_not_installed), (3, 1, 1));
        let names: Vec<_> = p.sites[0].nodes.iter().map(|n| n.spec.name.as_str()).collect();
        assert_eq!(names, ["node-1", "node-3"]);
        assert_eq!(p.sites[0].nodes[0].from_version, "1.29.2");
    }

    #[test]
    fn selectors_by_id_and_label() {
        let sites = vec![site("edge-01", &[("region", "eu")], 1), site("edge-02", &[("region", "us")], 1)];
        let obs = observed_all(&sites, "1.29.2");
        let st = strategy(Default::default());
        let eu = pb::SiteSelector { labels: [("region".into(), "eu".into())].into(), ..Default::default() };
        assert_eq!(go(eu, &st, &sites, &obs).sites.len(), 1);
        let unknown = pb::SiteSelector { site_ids: vec!["edge-09".into()], ..Default::default() };
        let name = PackageName::try_from("kubelet").unwrap();
        let err = plan(&name, &Version::try_from("1.30.0").unwrap(), &unknown, &st, &sites, &obs).unwrap_err();
        assert!(err.reason.contains("edge-09"), "{err}");
    }

    #[test]
    fn strategy_defaults_and_refusals() {
        let st = strategy(Default::default());
        assert_eq!(st.max_unavailable_of(10), 1);
        assert_eq!(st.failure_threshold, Amount::Count(0));
        assert_eq!(st.on_wave_timeout, pb::WaveTimeoutAction::Abort);
        let both = pb::RolloutStrategy { canary_sites: 1, canary_site_ids: vec!["a".into()], ..Default::default() };
        assert!(Strategy::try_from(&both).is_err());
        let pct = strategy(pb::RolloutStrategy { max_unavailable: "50%".into(), ..Default::default() });
        assert_eq!(pct.max_unavailable_of(5), 2);
        assert_eq!(pct.max_unavailable_of(1), 1, "never zero");
    }
}
