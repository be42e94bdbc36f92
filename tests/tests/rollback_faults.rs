//! Rollbacks through faults at the sites: a site's gateway killed (-9) while the rollback
//! patches its nodes, and a site cut off from the hub while the rollback runs. Each rollback
//! ends once, with every node back at the version it ran and changed no more than its two
//! moves (forward once, back once), by what the simulated sites themselves counted. And a
//! patch whose gateway is killed while it holds a node's steps: they reach the hub once.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::DeliverPolicy;
use bus_schema::domain::SiteDesign;
use bus_schema::names::{self, keys};
use bus_schema::pb::{self, BusEvent, BusMessage};
use bus_schema::runtime::{Bus, Envelope, ReadEvent};
use landfall_tests::fleet::{Fleet, RolloutRun, kubelet};
use landfall_tests::nats::NatsServer;
use landfall_tests::procs::Service;
use site_gateway::sim::{SimConfig, SimSite, saved_effects};
use tokio_util::sync::CancellationToken;

const TIMEOUT: Duration = Duration::from_secs(90);
const FROM: &str = "1.29.2";
const TO: &str = "1.30.0";
/// The gateway processes' simulated sites run this many times faster than real ones: an install
/// takes some twenty seconds, one node's kubelet close to a second, long enough for a kill to
/// land inside it.
const TIME_SCALE: &str = "100";
/// How often in-process gateways say they are there, and how long the hub waits without word
/// of a site before it counts it cut off.
const ALIVE_EVERY: Duration = Duration::from_millis(200);
const CUT_OFF_AFTER: Duration = Duration::from_millis(1500);

async fn register(fleet: &Fleet, package: pb::Package) {
    let env = Envelope::root();
    fleet.bus.publish_command(&pb::RegisterPackage { package: Some(package), auto_rollout: None }, &env).await.unwrap();
    fleet.wait_for(pb::PackageRegistered::filter(), &env.id, Duration::from_secs(20)).await.expect("registered");
}

/// Rolls kubelet 1.30.0 out to every site, all at once, and waits until it completes.
async fn roll_out(fleet: &Fleet) -> String {
    register(fleet, kubelet(TO)).await;
    let cmd = fleet.patch(pb::PatchPackage { name: "kubelet".into(), version: TO.into(), ..Default::default() }).await;
    let run = fleet.wait_rollout(&cmd.id, TIMEOUT).await;
    let done = run.of_type::<pb::RolloutCompleted>().pop().unwrap_or_else(|| panic!("rolled out: {:?}", run.kinds()));
    assert_eq!(done.failed, 0, "{:?}", run.kinds());
    cmd.id
}

/// Asks for `rollout_id` to be undone; the rollback's id.
async fn roll_back(fleet: &Fleet, rollout_id: &str) -> String {
    let cmd = pb::RollbackRollout { rollout_id: rollout_id.into(), cancel: false, reason: "bad kubelet".into() };
    fleet.bus.publish_command(&cmd, &Envelope::root()).await.unwrap();
    bus_schema::rollout::rollback_id(rollout_id)
}

async fn rollout(bus: &Bus, id: &str) -> pb::Rollout {
    let sagas = bus.kv(names::SAGAS_BUCKET).await.unwrap();
    sagas.get::<pb::Rollout>(&keys::rollout(id)).await.unwrap().expect("the rollout's record").0
}

async fn site_record(bus: &Bus, id: &str, site: &str) -> pb::RolloutSite {
    let sagas = bus.kv(names::SAGAS_BUCKET).await.unwrap();
    sagas.get::<pb::RolloutSite>(&keys::rollout_site(id, site)).await.unwrap().expect("the site's record").0
}

/// Waits (20 s at most) until the hub records `site`'s link as `state`.
async fn until_link(bus: &Bus, site: &str, state: pb::LinkState) {
    let observed = bus.kv(names::OBSERVED_BUCKET).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let held = observed.get::<pb::SiteLink>(&keys::link(site)).await.unwrap().map(|(l, _)| l);
        if held.as_ref().is_some_and(|l| l.state == state as i32) {
            return;
        }
        assert!(Instant::now() < deadline, "{site} not {state:?}: {held:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every event correlated with `correlation` stored so far, oldest first.
async fn events_of(bus: &Bus, correlation: &str) -> Vec<ReadEvent> {
    let mut reader = bus.read_events(vec![names::EVENTS_ALL.to_string()], DeliverPolicy::All).await.unwrap();
    let mut events = Vec::new();
    if reader.pending_at_start == 0 {
        return events;
    }
    while let Some(e) = tokio::time::timeout(Duration::from_secs(10), reader.next()).await.expect("read the events") {
        let e = e.expect("an event");
        let last = e.pending == 0;
        if e.delivery.envelope.correlation == correlation {
            events.push(e);
        }
        if last {
            break;
        }
    }
    events
}

fn of_type<M: BusMessage>(events: &[ReadEvent]) -> Vec<M> {
    events.iter().filter(|e| e.delivery.type_name == M::TYPE).map(|e| e.delivery.decode().unwrap()).collect()
}

fn kinds(events: &[ReadEvent]) -> Vec<&str> {
    events.iter().map(|e| e.delivery.type_name.trim_start_matches("landfall.v1.")).collect()
}

/// How many times each node was reported patched, by site and node: once each is right.
fn reports(events: &[ReadEvent]) -> BTreeMap<(String, String), usize> {
    let mut out = BTreeMap::new();
    for p in landfall_tests::fleet::node_reports(events) {
        *out.entry((p.site_id, p.node)).or_default() += 1;
    }
    out
}

/// Waits until the rollback ends, then a moment longer, and checks it ended once, completed,
/// with nothing failed and each node reported back once; every event of the rollback.
async fn ended_once(fleet: &Fleet, rollback_id: &str, nodes: usize) -> Vec<ReadEvent> {
    let run: RolloutRun = fleet.wait_rollout(rollback_id, TIMEOUT).await;
    assert!(run.of_type::<pb::RolloutCompleted>().pop().is_some(), "the rollback completed: {:?}", run.kinds());
    // Anything a redelivered job or a second decision would add lands in this time.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let events = events_of(&fleet.bus, rollback_id).await;
    let ends: Vec<&str> = kinds(&events)
        .into_iter()
        .filter(|k| ["RolloutCompleted", "RolloutHalted", "RolloutCancelled", "CommandRejected"].contains(k))
        .collect();
    assert_eq!(ends, ["RolloutCompleted"], "the rollback ends once: {:?}", kinds(&events));
    let reported = reports(&events);
    assert_eq!(reported.len(), nodes, "every node reported back: {reported:?}");
    assert!(reported.values().all(|n| *n == 1), "each node reported back once: {reported:?}");
    let unchanged: Vec<pb::NodePatched> =
        landfall_tests::fleet::node_reports(&events).into_iter().filter(|p| p.unchanged).collect();
    assert!(unchanged.is_empty(), "every node was moved back, none found there: {unchanged:?}");
    let done = &of_type::<pb::RolloutCompleted>(&events)[0];
    assert_eq!((done.planned_nodes, done.failed), (nodes as u32, 0), "{done:?}");
    let record = rollout(&fleet.bus, rollback_id).await;
    assert_eq!(record.phase, pb::RolloutPhase::Completed as i32, "{record:?}");
    events
}

/// Checks that the rollback counts every node it moved back as moved back: each site's report
/// names them patched, none unchanged, and the rollback's end and record say all `nodes`.
async fn counted_back(fleet: &Fleet, rollback_id: &str, events: &[ReadEvent], nodes: usize) {
    for site in of_type::<pb::SitePatched>(events) {
        assert!(
            site.unchanged.is_empty() && site.failed.is_empty() && site.skipped.is_empty(),
            "{}'s report counts a node the rollback itself moved back as found there already \
             (unchanged), or failed or skipped one: {site:?}",
            site.site_id
        );
    }
    let done = &of_type::<pb::RolloutCompleted>(events)[0];
    let record = rollout(&fleet.bus, rollback_id).await;
    assert_eq!(
        (done.patched, record.patched, record.unchanged),
        (nodes as u32, nodes as u32, 0),
        "every node the rollback moved back is counted back: {done:?}"
    );
}

/// Which of the two kubelets `node` runs at `site` ("?" for neither).
fn kubelet_of(site: &SimSite, node: &str) -> String {
    [FROM, TO].into_iter().find(|v| site.runs(node, &kubelet(v).try_into().unwrap())).unwrap_or("?").to_string()
}

/// The kubelet each node of `site` runs.
fn kubelets(site: &SimSite, design: &SiteDesign) -> BTreeMap<String, String> {
    design.nodes.iter().map(|n| (n.name.to_string(), kubelet_of(site, n.name.as_str()))).collect()
}

/// Simulated sites kept in state files, each run by its own `landfall serve gateway` process,
/// which a test can kill with SIGKILL and start again over the same file. (Dropped in order:
/// the processes before the directory their logs and files are in.)
struct GatewayProcesses {
    gateways: Vec<Service>,
    designs: Vec<SiteDesign>,
    dir: tempfile::TempDir,
}

impl GatewayProcesses {
    /// One gateway for each of the fleet's sites (registered already: a simulated site is built
    /// from its design), each node's steps sent on their own as they happen: a kill is aimed by
    /// a node's drain.
    fn start(fleet: &Fleet, url: &str) -> Self {
        Self::showing_steps_after(fleet, url, "0s")
    }

    /// [`Self::start`], a node's steps held until its report unless it is out of service for
    /// `after` (`--show-steps-after`).
    fn showing_steps_after(fleet: &Fleet, url: &str, after: &str) -> Self {
        let dir = tempfile::Builder::new().prefix("landfall-rollback-faults-").tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("sim")).unwrap();
        let designs: Vec<SiteDesign> = fleet.sites.iter().map(|(d, _)| d.clone()).collect();
        let gateways = designs
            .iter()
            .map(|design| {
                let site = design.site.as_str();
                let cache = dir.path().join("caches").join(site);
                let state = dir.path().join("sim").join(format!("{site}.json"));
                let args = [
                    "serve",
                    "gateway",
                    "--site",
                    site,
                    "--backend",
                    "sim",
                    "--time-scale",
                    TIME_SCALE,
                    "--cache-dir",
                    cache.to_str().unwrap(),
                    "--sim-state",
                    state.to_str().unwrap(),
                    "--show-steps-after",
                    after,
                ];
                Service::start(&format!("gateway-{site}"), url, dir.path(), &args)
            })
            .collect();
        GatewayProcesses { gateways, designs, dir }
    }

    /// Where site `i`'s gateway keeps its jobs' records.
    fn jobs_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join("caches").join(self.designs[i].site.as_str()).join("jobs")
    }

    /// The records of the jobs site `i`'s gateway has in hand, by file name (the job's id).
    fn job_records(&self, i: usize) -> BTreeMap<String, String> {
        let Ok(entries) = std::fs::read_dir(self.jobs_dir(i)) else { return BTreeMap::new() };
        entries
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().to_string())
            .map(|name| {
                let text = std::fs::read_to_string(self.jobs_dir(i).join(&name)).unwrap_or_default();
                (name, text)
            })
            .collect()
    }

    fn state_file(&self, i: usize) -> PathBuf {
        self.dir.path().join("sim").join(format!("{}.json", self.designs[i].site))
    }

    /// The patches that changed each node of site `i`, as its file counts them.
    fn patches(&self, i: usize) -> BTreeMap<String, u32> {
        saved_effects(&self.state_file(i)).unwrap_or_else(|e| panic!("site {i}'s state: {e}")).patches
    }

    /// The kubelet each node of site `i` runs, as its file holds it: read through a copy of the
    /// file, taken up as a gateway would take it up, so the running gateway's file is left alone.
    fn kubelets(&self, i: usize) -> BTreeMap<String, String> {
        let copy = self.dir.path().join(format!("read-{i}.json"));
        std::fs::copy(self.state_file(i), &copy).unwrap();
        let design = &self.designs[i];
        let site = SimSite::with_state_file(design.site.as_str(), &design.nodes, SimConfig::instant(), &copy)
            .unwrap_or_else(|e| panic!("site {i}'s state: {e}"));
        kubelets(&site, design)
    }

    fn every_node_at(&self, version: &str) -> bool {
        (0..self.designs.len()).all(|i| self.kubelets(i).values().all(|v| v == version))
    }

    fn all_kubelets(&self) -> Vec<BTreeMap<String, String>> {
        (0..self.designs.len()).map(|i| self.kubelets(i)).collect()
    }

    /// Panics, with its logs, when a gateway has exited by itself.
    fn assert_running(&mut self) {
        for g in &mut self.gateways {
            if let Some(status) = g.exit_status() {
                panic!("{} exited by itself ({status}):\n{}", g.name, g.log_tail(40));
            }
        }
    }
}

/// Follows the rollback's events at `site` as they are stored until, one node patched back, it
/// drains another: that node's patch is under way. The two nodes, (patched, being patched).
async fn second_node_patching(bus: &Bus, site: &str, rollback_id: &str) -> (String, String) {
    let mut reader = bus.read_events(vec![names::scope_events(site)], DeliverPolicy::All).await.unwrap();
    let mut patched: Option<String> = None;
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let next = tokio::time::timeout(left, reader.next()).await;
        let e = next.unwrap_or_else(|_| panic!("no second node of {site} was patched back within {TIMEOUT:?}"));
        let d = e.expect("the event stream").expect("an event").delivery;
        if d.envelope.correlation != rollback_id {
            continue;
        }
        if d.type_name == pb::NodePatched::TYPE && patched.is_none() {
            patched = Some(d.decode::<pb::NodePatched>().unwrap().node);
        } else if d.type_name == pb::NodeDrained::TYPE {
            let node = d.decode::<pb::NodeDrained>().unwrap().node;
            if let Some(first) = patched.as_ref().filter(|first| **first != node) {
                return (first.clone(), node);
            }
        }
    }
}

/// Two sites of three nodes, each behind a gateway process over a simulated site kept in a file;
/// kubelet rolled out to 1.30.0, then rolled back. While the rollback patches the first site's
/// second node, one node there already back at 1.29.2, that site's gateway is killed (-9) and
/// started again over the same file: the job it held comes again, the node patched back is not
/// touched again, the one cut short is patched once, and the rollback completes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_through_a_killed_gateway_finishes_once() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(2).nodes(3).without_gateways().start().await;
    let mut sites = GatewayProcesses::start(&fleet, &server.url());
    fleet.install_all().await;
    let rollout_id = roll_out(&fleet).await;
    assert!(sites.every_node_at(TO), "{:?}", sites.all_kubelets());

    let rollback_id = roll_back(&fleet, &rollout_id).await;
    let (back, cut_short) = second_node_patching(&fleet.bus, &fleet.site_id(0), &rollback_id).await;
    sites.gateways[0].kill();
    let at_kill = sites.patches(0);
    assert_eq!(
        (at_kill[&back], at_kill[&cut_short]),
        (2, 1),
        "the kill landed inside {cut_short}'s patch, after {back}'s: {at_kill:?}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    sites.gateways[0].restart();

    let events = ended_once(&fleet, &rollback_id, 6).await;
    assert!(sites.every_node_at(FROM), "{:?}", sites.all_kubelets());
    for i in 0..2 {
        let patches = sites.patches(i);
        assert_eq!(patches.len(), 3, "site {i}: {patches:?}");
        assert!(patches.values().all(|n| *n == 2), "site {i}, each node forward once and back once: {patches:?}");
    }
    let undone = rollout(&fleet.bus, &rollout_id).await;
    assert_eq!(undone.rolled_back_by, rollback_id);
    sites.assert_running();
    assert_eq!(sites.gateways[0].starts(), 2);
    // The node moved back before the kill was moved by this job, and reported so (NodePatched,
    // not unchanged): the job, come again, counts it moved back too.
    let report = of_type::<pb::SitePatched>(&events).into_iter().find(|s| s.site_id == fleet.site_id(0)).unwrap();
    assert!(
        report.unchanged.is_empty(),
        "{back}, moved back to {FROM} by this rollback's job before its gateway was killed, is counted as found \
         there already (SitePatched.unchanged) by the job come again after the restart, so the rollback counts \
         it as never moved: {report:?}"
    );
    counted_back(&fleet, &rollback_id, &events, 6).await;
    drop(sites);
    fleet.stop().await;
}

/// Three sites of two nodes, kubelet rolled out to 1.30.0. The second site's gateway goes off the
/// bus and the hub counts the site cut off; the rollout is rolled back: the other two sites go
/// back, the cut-off site's job waits in the stream (its nodes at 1.30.0, the rollback running).
/// Its gateway comes back over the same site: the job is carried out, the rollback completes
/// once, every node back at 1.29.2, each moved back once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_site_is_rolled_back_once_its_link_returns() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(3).nodes(2).link_timing(ALIVE_EVERY, CUT_OFF_AFTER).start().await;
    fleet.install_all().await;
    let rollout_id = roll_out(&fleet).await;
    let all_at =
        |version: &str| (0..3).all(|i| kubelets(fleet.backend(i), &fleet.sites[i].0).values().all(|v| v == version));
    let versions = || (0..3).map(|i| kubelets(fleet.backend(i), &fleet.sites[i].0)).collect::<Vec<_>>();
    assert!(all_at(TO), "{:?}", versions());

    let cut = 1;
    let cut_site = fleet.site_id(cut);
    fleet.stop_gateway(cut);
    until_link(&fleet.bus, &cut_site, pb::LinkState::CutOff).await;
    let rollback_id = roll_back(&fleet, &rollout_id).await;

    // The others go back; the cut-off site's job waits.
    let others: Vec<String> = [0, 2].map(|i| fleet.site_id(i)).into();
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let events = events_of(&fleet.bus, &rollback_id).await;
        let mut back: Vec<String> = of_type::<pb::SitePatched>(&events).into_iter().map(|s| s.site_id).collect();
        back.sort();
        if back == others {
            break;
        }
        assert!(Instant::now() < deadline, "the sites still linked went back: {back:?}; {:?}", kinds(&events));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    for i in [0, 2] {
        assert!(kubelets(fleet.backend(i), &fleet.sites[i].0).values().all(|v| v == FROM), "{:?}", versions());
    }
    assert!(kubelets(fleet.backend(cut), &fleet.sites[cut].0).values().all(|v| v == TO), "{:?}", versions());
    let events = events_of(&fleet.bus, &rollback_id).await;
    assert!(of_type::<pb::RolloutCompleted>(&events).is_empty(), "not complete while a site is cut off");
    let at_cut: Vec<&str> = events
        .iter()
        .filter(|e| {
            pb::decode_to_json(&e.delivery.type_name, &e.delivery.payload)
                .and_then(Result::ok)
                .is_some_and(|v| v["site_id"] == cut_site.as_str())
        })
        .map(|e| e.delivery.type_name.as_str())
        .collect();
    assert!(at_cut.is_empty(), "nothing was heard of the cut-off site: {at_cut:?}");
    let waiting = rollout(&fleet.bus, &rollback_id).await;
    assert_eq!((waiting.phase, waiting.sites_done), (pb::RolloutPhase::Running as i32, 2), "{waiting:?}");
    // Its job is out, unreported, and waits for its gateway in the jobs stream.
    let planned = &of_type::<pb::RolloutPlanned>(&events)[0];
    let index = planned.sites.iter().position(|s| s.site_id == cut_site).expect("the cut-off site is planned");
    assert!(consumers::rollout::decide::dispatched(&waiting, index), "its job was sent: {waiting:?}");
    let sagas = fleet.bus.kv(names::SAGAS_BUCKET).await.unwrap();
    let record = sagas.get::<pb::RolloutSite>(&keys::rollout_site(&rollback_id, &cut_site)).await.unwrap();
    assert!(record.is_none(), "no report of the cut-off site: {record:?}");
    let waiting: usize = landfall_tests::site_state::jobs_stored(&fleet.bus, &cut_site).await.values().sum();
    assert!(waiting >= 1, "the job waits in the stream");
    assert!(fleet.backend(cut).effects().patches.values().all(|n| *n == 1), "forward only, so far");

    // The link returns: a gateway over the same site takes the job that waited.
    let linked = CancellationToken::new();
    let gateway = tokio::spawn(site_gateway::run_gateway(
        fleet.sites[cut].0.site.clone(),
        fleet.bus.clone(),
        Arc::clone(fleet.backend(cut)),
        fleet.cache(cut),
        ALIVE_EVERY,
        linked.clone(),
    ));
    until_link(&fleet.bus, &cut_site, pb::LinkState::Up).await;
    let events = ended_once(&fleet, &rollback_id, 6).await;
    assert!(all_at(FROM), "{:?}", versions());
    for i in 0..3 {
        let patches = fleet.backend(i).effects().patches;
        assert_eq!(patches.len(), 2, "site {i}: {patches:?}");
        assert!(patches.values().all(|n| *n == 2), "site {i}, each node forward once and back once: {patches:?}");
    }
    let record = site_record(&fleet.bus, &rollback_id, &cut_site).await;
    assert_eq!((record.state, record.patched.len()), (pb::RolloutSiteState::Done as i32, 2), "{record:?}");
    counted_back(&fleet, &rollback_id, &events, 6).await;

    linked.cancel();
    gateway.await.unwrap().unwrap();
    fleet.stop().await;
}

/// One site of three nodes behind a gateway process that holds each node's steps for its report
/// (`--show-steps-after 1h`); kubelet rolled out. Once the gateway holds a node's cordon and
/// drain (written down in the job's record in its cache), it is killed (-9) and started again over the same files:
/// the job's next attempt takes the held steps up, and that node's cordon, drain, uncordon and
/// patch each reach the hub once, in order, whichever way they come (on their own, or in its
/// report); every node is patched once, and nothing held is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_steps_held_by_a_gateway_killed_mid_patch_reach_the_hub_once() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(1).nodes(3).without_gateways().start().await;
    let mut sites = GatewayProcesses::showing_steps_after(&fleet, &server.url(), "1h");
    fleet.install_all().await;
    register(&fleet, kubelet(TO)).await;
    let cmd = fleet.patch(pb::PatchPackage { name: "kubelet".into(), version: TO.into(), ..Default::default() }).await;

    let deadline = Instant::now() + TIMEOUT;
    // A node's held drain, written down in its job's record: `held <node> drained <pod>…`.
    let (record, node, evicted) = loop {
        let found = sites.job_records(0).into_values().find_map(|text| {
            let line = text.lines().find(|l| l.starts_with("held ") && l.contains(" drained"))?;
            let (node, pods) = line.strip_prefix("held ")?.split_once(" drained")?;
            Some((text.clone(), node.to_string(), pods.trim().to_string()))
        });
        if let Some(found) = found {
            break found;
        }
        assert!(Instant::now() < deadline, "the gateway never held a node's drain");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    sites.gateways[0].kill();
    assert!(record.contains(&format!("held {node} cordoned\n")), "{record:?}");
    sites.gateways[0].restart();

    let run = fleet.wait_rollout(&cmd.id, TIMEOUT).await;
    let done = run.of_type::<pb::RolloutCompleted>().pop().unwrap_or_else(|| panic!("rolled out: {:?}", run.kinds()));
    assert_eq!((done.patched, done.failed), (3, 0), "{:?}", run.kinds());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let events = events_of(&fleet.bus, &cmd.id).await;
    // What the first drain evicted: the next attempt finds the node drained, and evicts nothing.
    assert!(!evicted.is_empty(), "the drain evicted the node's pods: {record:?}");
    let steps: Vec<String> = landfall_tests::fleet::node_steps(&events)
        .into_iter()
        .filter_map(|s| s.strip_prefix(&format!("{node} ")).map(String::from))
        .collect();
    assert_eq!(
        steps,
        ["cordoned".to_string(), format!("drained [{evicted}]"), "uncordoned".into(), "patched".into()],
        "{node}'s steps, held by the gateway killed ({record:?}), reach the hub once each, the pods its drain \
         evicted with them: {:?}",
        kinds(&events)
    );
    // Each node reported once, from the version it ran: the reports the killed attempt held
    // for the site's report (nodes done before the kill) come from the next, alone, their
    // version before the patch read from the job's record.
    let reported = reports(&events);
    assert!(reported.len() == 3 && reported.values().all(|n| *n == 1), "each node reported once: {reported:?}");
    for r in landfall_tests::fleet::node_reports(&events) {
        assert_eq!(r.from_version, FROM, "{}: {:?}", r.node, kinds(&events));
    }
    let patches = sites.patches(0);
    assert!(patches.len() == 3 && patches.values().all(|n| *n == 1), "each node patched once: {patches:?}");
    assert!(sites.job_records(0).is_empty(), "a job's record left behind: {:?}", sites.job_records(0));
    assert_eq!(sites.gateways[0].starts(), 2);
    sites.assert_running();
    drop(sites);
    fleet.stop().await;
}
