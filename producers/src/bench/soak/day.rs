//! One simulated day of a soak: what a fleet's hosts and operators do in a day, each through the
//! bus as a client would, and each waited for until the event that ends it.
//!
//! Hosts arrive at some sites and join their clusters; yesterday's arrivals are removed again, so
//! the fleet keeps its size. A few designs change (`ApplyDesign` at some sites, `RegisterSite`
//! with a new label at others), a new kubelet is registered and rolled out everywhere, and a few
//! sites are installed again.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::consumer::DeliverPolicy;
use bus_schema::domain::{NodeDesign, Role, SiteDesign};
use bus_schema::names::{self, keys};
use bus_schema::pb::{self, BusCommand, BusMessage};
use bus_schema::runtime::{Bus, Delivery, Envelope, EventReader};
use consumers::artifacts::ArtifactStore;
use serde::Serialize;
use serde_json::json;
use site_gateway::sim::SimSite;

use super::SHRINK;
use crate::run::demo::demo_content;

/// How long one batch of a day's operations may take before what is left counts as timed out.
const BATCH_TIMEOUT: Duration = Duration::from_secs(300);

/// How many refusal and failure reasons a tally keeps, to say what went wrong.
const KEPT_NOTES: usize = 5;

/// How a day's operations ended.
#[derive(Debug, Default, Clone, Serialize)]
pub(super) struct Tally {
    pub ok: u32,
    pub refused: u32,
    pub failed: u32,
    pub timed_out: u32,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        self.ok += other.ok;
        self.refused += other.refused;
        self.failed += other.failed;
        self.timed_out += other.timed_out;
        self.notes.extend(other.notes);
        self.notes.truncate(KEPT_NOTES);
    }

    fn note(&mut self, note: String) {
        if self.notes.len() < KEPT_NOTES {
            self.notes.push(note);
        }
    }

    pub fn all_ok(&self) -> bool {
        self.refused + self.failed + self.timed_out == 0
    }
}

/// What ends one operation: the event types of a success and of a failure (a command's refusal
/// ends it too).
#[derive(Clone, Copy)]
struct Ends {
    what: &'static str,
    ok: &'static [&'static str],
    failed: &'static [&'static str],
}

const INSTALL: Ends = Ends { what: "install", ok: &[pb::SiteInstalled::TYPE], failed: &[pb::SiteInstallFailed::TYPE] };
const JOIN: Ends = Ends { what: "node join", ok: &[pb::NodeReady::TYPE], failed: &[pb::NodeJoinFailed::TYPE] };
const LEAVE: Ends = Ends { what: "node removal", ok: &[pb::NodeLeft::TYPE], failed: &[] };
const APPLY: Ends = Ends { what: "design apply", ok: &[pb::DesignApplied::TYPE], failed: &[] };
const REGISTER: Ends = Ends { what: "site register", ok: &[pb::SiteRegistered::TYPE], failed: &[] };
const PACKAGE: Ends = Ends { what: "package register", ok: &[pb::PackageRegistered::TYPE], failed: &[] };
const ROLLOUT: Ends = Ends {
    what: "rollout",
    ok: &[pb::RolloutCompleted::TYPE],
    failed: &[pb::RolloutHalted::TYPE, pb::RolloutCancelled::TYPE],
};

/// Operations under way, each waited for by the correlation of the command that started it (or,
/// for a host that arrived, by its site and name: its gateway sends the command).
struct Batch {
    reader: EventReader,
    pending: HashMap<String, Ends>,
}

fn node_key(site: &str, node: &str) -> String {
    format!("node {site}/{node}")
}

impl Batch {
    /// Starts reading events now, before anything of the batch is published.
    async fn open(bus: &Bus) -> anyhow::Result<Self> {
        let reader = bus.read_events(vec![names::EVENTS_ALL.to_string()], DeliverPolicy::New).await?;
        Ok(Self { reader, pending: HashMap::new() })
    }

    async fn command<C: BusCommand>(&mut self, bus: &Bus, cmd: &C, ends: Ends) -> anyhow::Result<()> {
        let env = Envelope::root();
        bus.publish_command(cmd, &env).await.with_context(|| format!("publish a {}", ends.what))?;
        self.pending.insert(env.id, ends);
        Ok(())
    }

    /// Waits until every operation has ended, or the batch's time is up.
    async fn wait(self) -> anyhow::Result<Tally> {
        Ok(self.wait_for_ends().await?.0)
    }

    /// As [`Batch::wait`], with the events that ended operations well.
    async fn wait_for_ends(mut self) -> anyhow::Result<(Tally, Vec<Delivery>)> {
        let mut tally = Tally::default();
        let mut ended = Vec::new();
        let deadline = tokio::time::Instant::now() + BATCH_TIMEOUT;
        while !self.pending.is_empty() {
            let e = match tokio::time::timeout_at(deadline, self.reader.next()).await {
                Err(_) => break,
                Ok(None) => anyhow::bail!("the event stream ended"),
                Ok(Some(e)) => e?,
            };
            let t = e.delivery.type_name.as_str();
            let key = if t == pb::NodeReady::TYPE {
                let r: pb::NodeReady = e.delivery.decode()?;
                node_key(&r.site_id, &r.node)
            } else if t == pb::NodeJoinFailed::TYPE {
                let f: pb::NodeJoinFailed = e.delivery.decode()?;
                node_key(&f.site_id, &f.node)
            } else {
                e.delivery.envelope.correlation.clone()
            };
            let Some(ends) = self.pending.get(&key).copied() else { continue };
            if ends.ok.contains(&t) {
                tally.ok += 1;
                ended.push(e.delivery);
            } else if ends.failed.contains(&t) {
                tally.failed += 1;
                let what = pb::decode_to_json(t, &e.delivery.payload).and_then(Result::ok).unwrap_or_default();
                tally.note(format!("{} failed: {what}", ends.what));
            } else if t == pb::CommandRejected::TYPE {
                let r: pb::CommandRejected = e.delivery.decode()?;
                tally.refused += 1;
                tally.note(format!("{} refused: {}", ends.what, r.reason));
            } else {
                continue;
            }
            self.pending.remove(&key);
        }
        for ends in self.pending.values() {
            tally.timed_out += 1;
            tally.note(format!("{} did not end within {BATCH_TIMEOUT:?}", ends.what));
        }
        Ok((tally, ended))
    }
}

/// What a day's operations came to, by kind.
#[derive(Debug, Default, Clone, Serialize)]
pub(super) struct DayOps {
    pub nodes_joined: Tally,
    pub nodes_removed: Tally,
    pub designs_changed: Tally,
    pub rollout: Tally,
    /// Nodes the day's rollout moved to the new version.
    pub nodes_patched: u32,
    pub installs: Tally,
}

impl DayOps {
    pub fn total(&self) -> Tally {
        let mut t = Tally::default();
        for part in [&self.nodes_joined, &self.nodes_removed, &self.designs_changed, &self.rollout, &self.installs] {
            t.add(part.clone());
        }
        t
    }
}

/// The simulated fleet the days run on.
pub(super) struct SoakFleet {
    pub bus: Bus,
    pub sites: Vec<(SiteDesign, SimSite)>,
    pub store: ArtifactStore,
    /// The hosts that arrived yesterday, by the index of their site: today they leave.
    arrived: Vec<(usize, NodeDesign)>,
}

impl SoakFleet {
    pub fn new(bus: Bus, sites: Vec<(SiteDesign, SimSite)>, store: ArtifactStore) -> Self {
        Self { bus, sites, store, arrived: Vec::new() }
    }

    /// How many sites take part in each kind of change on a day: a tenth of the fleet, at least one.
    fn share(&self) -> usize {
        (self.sites.len() / 10).max(1)
    }

    /// The `n` sites whose turn it is on `day` for the change numbered `lane` (lanes of one day
    /// fall on different sites while the fleet has room for them).
    fn turn(&self, day: usize, lane: usize, n: usize) -> Vec<usize> {
        let len = self.sites.len();
        (0..n.min(len)).map(|j| (day * n + lane * len / 4 + j) % len).collect()
    }

    /// Installs every site, all at once.
    pub async fn install_all(&self) -> anyhow::Result<Tally> {
        let all: Vec<usize> = (0..self.sites.len()).collect();
        self.install(&all).await
    }

    async fn install(&self, sites: &[usize]) -> anyhow::Result<Tally> {
        let mut batch = Batch::open(&self.bus).await?;
        for &i in sites {
            let cmd = pb::InstallSite { site_id: self.sites[i].0.site.to_string(), design_revision: 0 };
            batch.command(&self.bus, &cmd, INSTALL).await?;
        }
        batch.wait().await
    }

    /// One simulated day's operations, each phase waited for before the next starts.
    pub async fn day(&mut self, day: usize) -> anyhow::Result<DayOps> {
        let mut ops = DayOps::default();
        (ops.nodes_joined, ops.nodes_removed) = self.node_churn(day).await?;
        ops.designs_changed = self.design_changes(day).await?;
        (ops.rollout, ops.nodes_patched) = self.rollout(day).await?;
        ops.installs = self.install(&self.turn(day, 3, self.share())).await?;
        Ok(ops)
    }

    /// New hosts at some sites (their gateways announce them, the orchestrator joins them), and
    /// yesterday's new hosts removed by an operator.
    async fn node_churn(&mut self, day: usize) -> anyhow::Result<(Tally, Tally)> {
        let mut joins = Batch::open(&self.bus).await?;
        let mut leaves = Batch::open(&self.bus).await?;
        for (i, node) in std::mem::take(&mut self.arrived) {
            let cmd = pb::NodeRemoved {
                site_id: self.sites[i].0.site.to_string(),
                node: node.name.to_string(),
                boot_mac: node.boot_mac.to_string(),
                reason: "decommissioned".into(),
            };
            leaves.command(&self.bus, &cmd, LEAVE).await?;
        }
        for i in self.turn(day, 0, self.share()) {
            let node = arriving_host(i, day)?;
            let (design, sim) = &self.sites[i];
            if sim.arrive(&node) {
                joins.pending.insert(node_key(design.site.as_str(), node.name.as_str()), JOIN);
                self.arrived.push((i, node));
            }
        }
        let (joined, left) = tokio::join!(joins.wait(), leaves.wait());
        Ok((joined?, left?))
    }

    /// `ApplyDesign` at some sites (the site's current design as documents, with the day as a
    /// label), `RegisterSite` at others (the current design with the day as a label), both over
    /// the revision read. The same few sites apply a design every day, so their revisions reach
    /// the count the policy keeps within the run (other sites' would, over weeks).
    async fn design_changes(&self, day: usize) -> anyhow::Result<Tally> {
        let n = (self.sites.len() / 25).max(1);
        let sites = self.bus.kv(names::SITES_BUCKET).await?;
        let mut batch = Batch::open(&self.bus).await?;
        for i in self.turn(0, 1, n) {
            let site = self.sites[i].0.site.as_str();
            let Some((current, _)) = sites.get::<pb::SiteDesign>(&keys::site(site)).await? else { continue };
            let current = SiteDesign::try_from(current)?;
            let latest = sites.get::<pb::DesignRevision>(&keys::design_latest(site)).await?;
            let cmd = pb::ApplyDesign {
                site_id: site.to_string(),
                sources: vec![design_documents(&current, day)],
                expected: Some(pb::ExpectedRevision { revision: latest.map_or(0, |(l, _)| l.revision) }),
            };
            batch.command(&self.bus, &cmd, APPLY).await?;
        }
        for i in self.turn(day, 2, n) {
            let site = self.sites[i].0.site.as_str();
            let Some((mut current, revision)) = sites.get::<pb::SiteDesign>(&keys::site(site)).await? else { continue };
            current.labels.insert("soak-day".into(), day.to_string());
            let cmd = pb::RegisterSite { design: Some(current), expected: Some(pb::ExpectedRevision { revision }) };
            batch.command(&self.bus, &cmd, REGISTER).await?;
        }
        batch.wait().await
    }

    /// A new kubelet (its bytes in the artifact store) registered, then rolled out to every site;
    /// how that ended, and how many nodes it patched.
    async fn rollout(&self, day: usize) -> anyhow::Result<(Tally, u32)> {
        let version = format!("1.30.{day}");
        let mut package = super::super::target_package();
        package.version.clone_from(&version);
        let bytes = demo_content(&package.name, &version, (package.size / SHRINK).max(1) as usize);
        let stored = self.store.upload(bytes.as_slice()).await.context("upload the day's kubelet")?;
        (package.sha256, package.size, package.object_key) = (stored.sha256, stored.size, stored.object_key);

        let mut register = Batch::open(&self.bus).await?;
        let cmd = pb::RegisterPackage { package: Some(package.clone()), auto_rollout: None };
        register.command(&self.bus, &cmd, PACKAGE).await?;
        let mut tally = register.wait().await?;

        let mut patch = Batch::open(&self.bus).await?;
        let cmd = pb::PatchPackage {
            name: package.name,
            version,
            strategy: Some(pb::RolloutStrategy {
                max_unavailable: "50%".into(),
                failure_threshold: "10%".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        patch.command(&self.bus, &cmd, ROLLOUT).await?;
        let (patched, ended) = patch.wait_for_ends().await?;
        tally.add(patched);
        let mut nodes = 0;
        for d in ended {
            nodes += d.decode::<pb::RolloutCompleted>()?.patched;
        }
        Ok((tally, nodes))
    }
}

/// The worker host that arrives at site `index` on `day`: a name, boot MAC and BMC no other
/// host of the site has had (for 256 days).
fn arriving_host(index: usize, day: usize) -> anyhow::Result<NodeDesign> {
    let spec = pb::NodeSpec {
        name: format!("arrival-{day}"),
        role: pb::Role::Worker as i32,
        boot_mac: format!("52:54:02:{:02x}:{:02x}:{:02x}", index >> 8, index & 0xff, day & 0xff),
        bmc_address: format!("ipmi://10.{}.{}.{}", 200 + (index >> 8), index & 0xff, day % 250 + 1),
        labels: Default::default(),
        ..Default::default()
    };
    Ok(NodeDesign::try_from(spec)?)
}

/// A site's flat design as design documents (a Site, a host profile per role, a Node per node),
/// with the day as a site label, so each day's documents differ from the last.
fn design_documents(d: &SiteDesign, day: usize) -> pb::DesignSource {
    let role_name = |r: Role| if r == Role::Master { "master" } else { "worker" };
    let count = |r: Role| d.nodes.iter().filter(|n| n.role == r).count();
    let mut labels = d.labels.clone();
    labels.insert("soak-day".into(), day.to_string());
    let mut docs = vec![json!({
        "kind": "Site",
        "name": d.site.as_str(),
        "labels": labels,
        "networks": [{ "name": "provisioning", "cidr": "10.200.0.0/16" }],
        "cluster": {
            "apiNetwork": "provisioning",
            "masters": { "count": count(Role::Master) },
            "workers": { "count": count(Role::Worker) },
        },
    })];
    for role in [Role::Master, Role::Worker] {
        let packages: Vec<_> = d
            .packages_for(role)
            .iter()
            .map(|p| json!({ "name": p.name.as_str(), "version": p.version.as_str() }))
            .collect();
        docs.push(
            json!({ "kind": "HostProfile", "name": role_name(role), "role": role_name(role), "packages": packages }),
        );
    }
    for (i, n) in d.nodes.iter().enumerate() {
        docs.push(json!({
            "kind": "Node",
            "name": n.name.as_str(),
            "hostProfile": role_name(n.role),
            "bootMac": n.boot_mac.to_string(),
            "bmc": { "address": n.bmc_address.as_str() },
            "addressing": [{ "network": "provisioning", "ip": format!("10.200.{}.{}", i / 250, i % 250 + 1) }],
        }));
    }
    // JSON is YAML's flow style: one document per line.
    let text = docs.iter().map(serde_json::Value::to_string).collect::<Vec<_>>().join("\n---\n");
    pb::DesignSource { name: "soak.yaml".into(), text }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::demo::{demo_packages, demo_site};

    #[test]
    fn a_site_as_documents_plans_to_the_same_nodes_and_packages() {
        let site = demo_site(3, 5);
        let catalog: std::collections::BTreeSet<_> = demo_packages()
            .into_iter()
            .map(|p| bus_schema::domain::PackageRef::try_from(pb::PackageRef { name: p.name, version: p.version }))
            .collect::<Result<_, _>>()
            .unwrap();
        let source = design_documents(&site, 7);
        let planned = bus_schema::design::plan(&site.site, &[source], &catalog, None).unwrap();
        let effective = SiteDesign::try_from(planned.effective.clone()).unwrap();
        let shape = |d: &SiteDesign| {
            d.nodes.iter().map(|n| (n.name.to_string(), n.role, n.boot_mac.to_string())).collect::<Vec<_>>()
        };
        assert_eq!(shape(&effective), shape(&site));
        let packages = |d: &SiteDesign| {
            let mut keys: Vec<String> = d.packages_for(Role::Worker).iter().map(|p| p.key()).collect();
            keys.sort();
            keys
        };
        assert_eq!(packages(&effective), packages(&site));
        assert_eq!(effective.labels.get("soak-day").map(String::as_str), Some("7"));
    }

    #[test]
    fn arriving_hosts_differ_by_site_and_day() {
        let a = arriving_host(1, 2).unwrap();
        let b = arriving_host(2, 2).unwrap();
        let c = arriving_host(1, 3).unwrap();
        assert_ne!(a.boot_mac, b.boot_mac);
        assert_ne!(a.boot_mac, c.boot_mac);
        assert_ne!(a.name, c.name);
    }
}
