//! Services dying while they work, and the hub's NATS restarted under them. Every service runs
//! as a process of its own (`landfall serve …`), as deployed: two orchestrators, the observer,
//! the kubeconfig collector and secrets service, the distribution service, the HTTP API, and
//! one gateway per simulated site, each keeping its site in a state file (`--sim-state`) as a
//! real site's Metal3 keeps its hosts whatever becomes of the gateway. What each command led
//! to is read back from LANDFALL_EVENTS by correlation id, and what the sites did from their
//! state files. The hub restart runs twice: on a single server, and on the production topology
//! (a three-server cluster over TLS from `landfall deploy nats-config`, each process as its own
//! user), where services are also killed while the whole cluster is down.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::DeliverPolicy;
use bus_schema::access::Role;
use bus_schema::domain::SiteDesign;
use bus_schema::ids;
use bus_schema::names::{self, keys};
use bus_schema::pb::{self, BusCommand, BusEvent, BusMessage};
use bus_schema::runtime::{self, Access, Bus, Envelope, ReadEvent, Topology};
use consumers::artifacts::ArtifactStore;
use landfall_tests::fleet::{TEST_KEY_HEX, TEST_SHRINK};
use landfall_tests::nats::{NatsServer, free_port};
use landfall_tests::procs::Service;
use landfall_tests::topology::{ConfServer, TlsFiles, connect_when_ready};
use serde_json::Value;
use tokio::task::JoinHandle;

/// The simulated sites run this many times faster than real ones: an install takes a few
/// seconds, long enough for kills to land inside its steps.
const TIME_SCALE: &str = "300";
/// Each kind of service is killed this many times in the first test.
const KILLS: u32 = 20;
/// Time between two kills (of any service), and how long a killed service stays down.
const KILL_EVERY: (Duration, Duration) = (Duration::from_millis(250), Duration::from_millis(1000));
const DOWN_FOR: (Duration, Duration) = (Duration::from_millis(100), Duration::from_millis(1500));
/// How long one command may take to end, kills included.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(150);
/// Each test fails, rather than hangs, past this.
const TEST_TIMEOUT: Duration = Duration::from_secs(330);
const OPERATOR: &str = "chaos-operator-token-000000000001";

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Orchestrator,
    Observer,
    Kubeconfig,
    Distribution,
    Api,
    Gateway,
}

/// Each process as its own NATS user, from the generated configuration: the arguments that
/// make it so, and how the test itself connects (as an operator).
struct Users {
    deployment: landfall_tests::topology::Deployment,
    ca: PathBuf,
}

impl Users {
    fn args(&self, role: &Role) -> Vec<String> {
        let seed = self.deployment.seed_file(role);
        ["--nats-nkey-file", seed.to_str().unwrap(), "--nats-ca", self.ca.to_str().unwrap()].map(String::from).into()
    }

    fn operator(&self) -> Access {
        Access { ca_file: Some(self.ca.clone()), ..self.deployment.access(&Role::Operator) }
    }
}

impl Kind {
    fn role(self) -> Role {
        match self {
            Kind::Orchestrator => Role::Orchestrator,
            Kind::Observer => Role::Observer,
            Kind::Kubeconfig => Role::Kubeconfig,
            Kind::Distribution => Role::Distribution,
            Kind::Api => Role::Api,
            Kind::Gateway => unreachable!("a gateway is its site's user"),
        }
    }

    const ALL: [Kind; 6] =
        [Kind::Orchestrator, Kind::Observer, Kind::Kubeconfig, Kind::Distribution, Kind::Api, Kind::Gateway];

    fn name(self) -> &'static str {
        match self {
            Kind::Orchestrator => "orchestrator",
            Kind::Observer => "observer",
            Kind::Kubeconfig => "kubeconfig",
            Kind::Distribution => "distribution",
            Kind::Api => "api",
            Kind::Gateway => "gateway",
        }
    }
}

/// SplitMix64: the kills' schedule, repeatable from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn between(&mut self, (lo, hi): (Duration, Duration)) -> Duration {
        let span = (hi - lo).as_millis() as u64;
        lo + Duration::from_millis(self.next() % (span + 1))
    }
}

/// The seed: `LANDFALL_CHAOS_SEED` when set, else the clock.
fn seed() -> u64 {
    match std::env::var("LANDFALL_CHAOS_SEED") {
        Ok(s) => s.trim().parse().unwrap_or_else(|_| panic!("LANDFALL_CHAOS_SEED={s} is not a number")),
        Err(_) => std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64,
    }
}

/// A command the test published, and what it expects to end it.
#[derive(Debug, Clone)]
struct Sent {
    id: String,
    type_name: &'static str,
    what: String,
}

/// The events that end a command of this type; the first is the one a test expects.
fn ends(command: &str) -> Vec<(&'static str, String)> {
    fn e<E: BusEvent>() -> (&'static str, String) {
        (E::TYPE, E::filter())
    }
    let mut list = match command {
        t if t == pb::RegisterPackage::TYPE => vec![e::<pb::PackageRegistered>()],
        t if t == pb::RegisterSite::TYPE => vec![e::<pb::SiteRegistered>()],
        t if t == pb::InstallSite::TYPE => vec![e::<pb::SiteInstalled>(), e::<pb::SiteInstallFailed>()],
        t if t == pb::PatchPackage::TYPE => {
            vec![e::<pb::RolloutCompleted>(), e::<pb::RolloutHalted>(), e::<pb::RolloutCancelled>()]
        }
        // NodeAccepted ends it only at a site never installed; the test adds nodes to installed ones.
        t if t == pb::NodeAdded::TYPE => vec![e::<pb::NodeReady>(), e::<pb::NodeJoinFailed>()],
        other => panic!("no terminal events known for {other}"),
    };
    let rejected = names::events_of_kind(pb::rejection::COMMAND_AGGREGATE, pb::rejection::KIND);
    list.push((pb::CommandRejected::TYPE, rejected));
    list
}

/// Events that mark one step of a command: each (type, site, node) once per command.
const STEPS: &[&str] = &[
    pb::SiteInstallStarted::TYPE,
    pb::ArtifactsStaged::TYPE,
    pb::NodeOsProvisioned::TYPE,
    pb::NodeBinariesInstalled::TYPE,
    pb::ClusterReady::TYPE,
    pb::KubeconfigStored::TYPE,
    pb::ContainerPackagesApplied::TYPE,
    pb::NodeAccepted::TYPE,
    pb::RolloutPlanned::TYPE,
    pb::NodePatched::TYPE,
    pb::SitePatched::TYPE,
];

/// Events that say something was lost or refused; none is expected.
const FAILURES: &[&str] = &[
    pb::NodeFailed::TYPE,
    pb::JobFailed::TYPE,
    pb::NodePatchFailed::TYPE,
    pb::SiteInstallFailed::TYPE,
    pb::NodeJoinFailed::TYPE,
    pb::RolloutHalted::TYPE,
    pb::RolloutCancelled::TYPE,
    pb::CommandRejected::TYPE,
    pb::MessageRejected::TYPE,
];

/// How the test reaches landfall (the bus, the HTTP API, the artifact store), and what it sent.
struct Client {
    bus: Bus,
    http: reqwest::Client,
    api: String,
    store: ArtifactStore,
    sites: Vec<SiteDesign>,
    sent: Mutex<Vec<Sent>>,
}

impl Client {
    fn track(&self, id: &str, type_name: &'static str, what: String) {
        self.sent.lock().unwrap().push(Sent { id: id.to_string(), type_name, what });
    }

    fn sent(&self) -> Vec<Sent> {
        self.sent.lock().unwrap().clone()
    }

    /// Publishes a command on the bus; its id.
    async fn publish<C: BusCommand>(&self, cmd: &C, what: String) -> String {
        let env = Envelope::root();
        self.bus.publish_command(cmd, &env).await.unwrap_or_else(|e| panic!("publish {what}: {e}"));
        self.track(&env.id, C::TYPE, what);
        env.id
    }

    /// POSTs a command to the HTTP API with `id` as its Idempotency-Key, again and again until
    /// it is taken: the API may be down, or killed mid-request.
    async fn post<C: BusCommand>(&self, cmd: &C, id: &str, what: String) {
        let url = format!("{}/v1/commands/{}", self.api, C::KIND);
        let body = serde_json::to_string(cmd).unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last = String::new();
        while Instant::now() < deadline {
            let sent = self
                .http
                .post(&url)
                .bearer_auth(OPERATOR)
                .header("content-type", "application/json")
                .header("idempotency-key", id)
                .timeout(Duration::from_secs(5))
                .body(body.clone())
                .send()
                .await;
            match sent {
                Ok(r) if r.status() == 202 => {
                    self.track(id, C::TYPE, what);
                    return;
                }
                Ok(r) if r.status().is_server_error() => last = format!("{}", r.status()),
                Ok(r) => panic!("POST {url} {body}: {} {}", r.status(), r.text().await.unwrap_or_default()),
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("POST {url} was not taken within 60 s: {last}");
    }

    /// The first event ending command `id`, its type; `Err` naming the command after `timeout`.
    /// A reader that breaks (its consumer lost while the hub restarts) is opened again.
    async fn wait_end(&self, sent: &Sent, timeout: Duration) -> Result<String, String> {
        let ends = ends(sent.type_name);
        let filters: Vec<String> = ends.iter().map(|(_, f)| f.clone()).collect();
        let deadline = Instant::now() + timeout;
        let mut broken = String::new();
        while Instant::now() < deadline {
            let found = tokio::time::timeout_at(deadline.into(), async {
                let mut reader =
                    self.bus.read_events(filters.clone(), DeliverPolicy::All).await.map_err(|e| e.to_string())?;
                while let Some(e) = reader.next().await {
                    let e = e.map_err(|e| e.to_string())?;
                    let t = e.delivery.type_name.as_str();
                    if e.delivery.envelope.correlation == sent.id && ends.iter().any(|(end, _)| *end == t) {
                        return Ok(e.delivery.type_name);
                    }
                }
                Err("the event stream ended".to_string())
            })
            .await;
            match found {
                Ok(Ok(end)) => return Ok(end),
                Ok(Err(e)) => broken = e,
                Err(_) => break,
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Err(format!("{} ({}) did not end within {timeout:?} (last reader error: {broken:?})", sent.what, sent.id))
    }

    /// Waits for `id`'s end and checks it is the expected one.
    async fn expect_end(&self, id: &str, timeout: Duration) -> Result<(), String> {
        let sent = self.sent().into_iter().find(|s| s.id == id).expect("a command the test sent");
        let end = self.wait_end(&sent, timeout).await?;
        let expected = ends(sent.type_name)[0].0;
        if end == expected { Ok(()) } else { Err(format!("{} ended with {end}, not {expected}", sent.what)) }
    }

    /// A new version of kubelet in the artifact store, registered; the command's id.
    async fn register_kubelet(&self, version: &str) -> String {
        let bytes = producers::up::demo_content("kubelet", version, (111_955_968 / TEST_SHRINK) as usize);
        let stored = self.store.upload(bytes.as_slice()).await.expect("upload kubelet");
        let package = pb::Package {
            name: "kubelet".into(),
            version: version.into(),
            kind: pb::PackageKind::Binary as i32,
            sha256: stored.sha256,
            size: stored.size,
            object_key: stored.object_key,
            chart: None,
            render: None,
        };
        let cmd = pb::RegisterPackage { package: Some(package), auto_rollout: None };
        self.publish(&cmd, format!("RegisterPackage kubelet@{version}")).await
    }

    /// A new worker at site `site`, announced through the HTTP API with the id a gateway
    /// would give it; the command's id.
    async fn add_node(&self, site: usize, number: usize) -> String {
        let site_id = self.sites[site].site.to_string();
        let node = pb::NodeSpec {
            name: format!("node-{number}"),
            role: pb::Role::Worker as i32,
            boot_mac: format!("52:54:02:00:{site:02x}:{number:02x}"),
            bmc_address: format!("ipmi://10.2.{site}.{number}"),
            labels: Default::default(),
            ..Default::default()
        };
        let id = ids::node_added_id(&site_id, &node.name, &node.boot_mac, "").to_string();
        let what = format!("NodeAdded {site_id}/{}", node.name);
        self.post(&pb::NodeAdded { site_id, node: Some(node), hardware: None }, &id, what).await;
        id
    }

    /// Every event in the stream, oldest first.
    async fn all_events(&self) -> Vec<ReadEvent> {
        let mut reader = self.bus.read_events(vec![names::EVENTS_ALL.to_string()], DeliverPolicy::All).await.unwrap();
        let mut events = Vec::new();
        loop {
            match tokio::time::timeout(Duration::from_secs(5), reader.next()).await {
                Ok(Some(e)) => {
                    let e = e.expect("read an event");
                    let last = e.pending == 0;
                    events.push(e);
                    if last {
                        return events;
                    }
                }
                Ok(None) | Err(_) => return events,
            }
        }
    }
}

/// A running landfall: every service a process, one gateway per site.
struct Deployment {
    dir: tempfile::TempDir,
    client: Arc<Client>,
    services: Vec<(Kind, Service)>,
}

impl Deployment {
    /// Starts the hub's services, registers the demo packages (their stand-in bytes in the
    /// artifact store) and `sites` sites of `nodes` nodes, then starts each site's gateway.
    async fn start(url: &str, sites: usize, nodes: usize, orchestrators: usize, users: Option<&Users>) -> Deployment {
        // LANDFALL_CHAOS_KEEP=1 keeps the services' logs and the sites' state files.
        let keep = std::env::var_os("LANDFALL_CHAOS_KEEP").is_some();
        let dir = tempfile::Builder::new().prefix("landfall-chaos-").disable_cleanup(keep).tempdir().unwrap();
        if keep {
            println!("chaos: logs and state in {}", dir.path().display());
        }
        let path = |p: &str| dir.path().join(p).to_str().unwrap().to_string();
        let access = users.map(Users::operator).unwrap_or_default();
        let bus = Bus::connect_with(url, "landfall-chaos-test", &access).await.expect("connect");
        bus.ensure_topology(&Topology::default()).await.expect("streams and buckets");
        let store = ArtifactStore::local(&dir.path().join("artifacts")).expect("the artifact store");
        let catalog = producers::up::upload_demo_packages(&store, TEST_SHRINK).await.expect("upload the demo packages");
        let tokens = dir.path().join("api-tokens.yaml");
        std::fs::write(&tokens, format!("tokens:\n  - {{name: chaos, role: operator, token: {OPERATOR}}}\n")).unwrap();
        let api_addr = format!("127.0.0.1:{}", free_port());

        let mut services = Vec::new();
        let as_user = |args: &[&str], role: &Role| -> Vec<String> {
            let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
            args.extend(users.map(|u| u.args(role)).unwrap_or_default());
            args
        };
        let mut hub = |kind: Kind, name: &str, args: &[&str]| {
            let args = as_user(args, &kind.role());
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            services.push((kind, Service::start(name, url, dir.path(), &args)));
        };
        for i in 1..=orchestrators {
            hub(Kind::Orchestrator, &format!("orchestrator-{i}"), &["serve", "orchestrator"]);
        }
        hub(Kind::Observer, "observer", &["serve", "observer"]);
        let key = dir.path().join("secret.key");
        landfall_tests::secrets::write_key_file(&key, TEST_KEY_HEX);
        hub(Kind::Kubeconfig, "kubeconfig", &["serve", "kubeconfig", "--secret-key-file", key.to_str().unwrap()]);
        hub(Kind::Distribution, "distribution", &["serve", "distribution", "--store", &path("artifacts")]);
        hub(Kind::Api, "api", &["serve", "api", "--api-listen", &api_addr, "--api-tokens", tokens.to_str().unwrap()]);

        let designs: Vec<SiteDesign> = (0..sites).map(|i| producers::up::demo_site(i, nodes)).collect();
        consumers::artifacts::install_tls_provider();
        let client = Arc::new(Client {
            bus,
            http: reqwest::Client::new(),
            api: format!("http://{api_addr}"),
            store,
            sites: designs.clone(),
            sent: Mutex::default(),
        });
        for p in catalog {
            let what = format!("RegisterPackage {}@{}", p.name, p.version);
            client.publish(&pb::RegisterPackage { package: Some(p), auto_rollout: None }, what).await;
        }
        let mut last = String::new();
        for design in &designs {
            let cmd = pb::RegisterSite { design: Some(pb::SiteDesign::from(design)), expected: None };
            last = client.publish(&cmd, format!("RegisterSite {}", design.site)).await;
        }
        // A simulated site is built from its registered design: the gateways start after.
        client.expect_end(&last, Duration::from_secs(60)).await.expect("the sites are registered");
        std::fs::create_dir_all(dir.path().join("sim")).unwrap();
        for design in &designs {
            let site = design.site.as_str();
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
                &path(&format!("caches/{site}")),
                "--sim-state",
                &path(&format!("sim/{site}.json")),
            ];
            let args = as_user(&args, &Role::Site(site.to_string()));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            services.push((Kind::Gateway, Service::start(&format!("gateway-{site}"), url, dir.path(), &args)));
        }
        Deployment { dir, client, services }
    }

    fn sim_state(&self, site: &str) -> PathBuf {
        self.dir.path().join("sim").join(format!("{site}.json"))
    }

    /// Panics, with its logs, when a service has exited by itself.
    fn assert_running(&mut self) {
        for (_, s) in &mut self.services {
            if let Some(status) = s.exit_status() {
                panic!("{} exited by itself ({status}):\n{}", s.name, s.log_tail(40));
            }
        }
    }

    /// Waits for command `id`'s expected end; panics with a diagnosis otherwise.
    async fn expect_end(&self, id: &str) {
        if let Err(e) = self.client.expect_end(id, COMMAND_TIMEOUT).await {
            panic!("{e}\n{}", self.diagnose().await);
        }
    }

    /// Why something did not end: the events of every command that has no end yet, and what
    /// each service logged as a warning or an error last.
    async fn diagnose(&self) -> String {
        let events = self.client.all_events().await;
        let mut out = String::new();
        for s in self.client.sent() {
            let ends = ends(s.type_name);
            let mine: Vec<&ReadEvent> = events.iter().filter(|e| e.delivery.envelope.correlation == s.id).collect();
            if mine.iter().any(|e| ends.iter().any(|(t, _)| *t == e.delivery.type_name)) {
                continue;
            }
            let kinds: Vec<&str> =
                mine.iter().map(|e| e.delivery.type_name.trim_start_matches("landfall.v1.")).collect();
            out.push_str(&format!("{} ({}) has not ended; its events: {kinds:?}\n", s.what, s.id));
        }
        for (_, service) in &self.services {
            let text = service.log_text();
            let noisy: Vec<&str> = text.lines().filter(|l| l.contains(" WARN ") || l.contains("ERROR")).collect();
            let tail = &noisy[noisy.len().saturating_sub(8)..];
            out.push_str(&format!("---- {} ({} starts) ----\n{}\n", service.name, service.starts(), tail.join("\n")));
        }
        out
    }

    /// What every command led to, and what the sites did, judged; a summary of the counts.
    async fn judge(&self) -> Verdict {
        let client = &self.client;
        let sent = client.sent();
        let events = client.all_events().await;
        let mut problems = Vec::new();
        let json = |e: &ReadEvent| {
            pb::decode_to_json(&e.delivery.type_name, &e.delivery.payload).and_then(Result::ok).unwrap_or(Value::Null)
        };
        let field = |v: &Value, name: &str| v[name].as_str().unwrap_or_default().to_string();
        // Every event as (correlation, type, body), and each node report a site's report carries
        // as a `NodePatched` of its own, where that report is.
        let mut unfolded: Vec<(String, String, Value)> = Vec::new();
        for e in &events {
            let (corr, v) = (e.delivery.envelope.correlation.clone(), json(e));
            if e.delivery.type_name == pb::SitePatched::TYPE {
                for n in v["nodes"].as_array().cloned().unwrap_or_default() {
                    unfolded.push((corr.clone(), pb::NodePatched::TYPE.to_string(), n));
                }
            }
            unfolded.push((corr, e.delivery.type_name.clone(), v));
        }

        // Every command ends once, the way it should.
        let mut terminal = 0;
        for s in &sent {
            let ends = ends(s.type_name);
            let seen: Vec<&str> = events
                .iter()
                .filter(|e| e.delivery.envelope.correlation == s.id)
                .map(|e| e.delivery.type_name.as_str())
                .filter(|t| ends.iter().any(|(end, _)| end == t))
                .collect();
            match seen.as_slice() {
                [one] if *one == ends[0].0 => terminal += 1,
                other => {
                    problems.push(format!("{} ({}) ended with {other:?}, not once with {}", s.what, s.id, ends[0].0))
                }
            }
        }

        // No step twice: each (command, step, site, node) once in the stream.
        let mut steps: BTreeMap<(String, String, String, String), usize> = BTreeMap::new();
        for (corr, type_name, v) in unfolded.iter().filter(|(_, t, _)| STEPS.contains(&t.as_str())) {
            let key = (corr.clone(), type_name.clone(), field(v, "site_id"), field(v, "node"));
            *steps.entry(key).or_default() += 1;
        }
        let repeated: Vec<_> = steps.iter().filter(|(_, n)| **n > 1).collect();
        for ((corr, t, site, node), n) in &repeated {
            problems.push(format!("{t} of {site}/{node} for {corr}: {n} times"));
        }
        // A rollout plans each site once.
        for e in events.iter().filter(|e| e.delivery.type_name == pb::RolloutPlanned::TYPE) {
            let planned = e.delivery.decode::<pb::RolloutPlanned>().expect("RolloutPlanned decodes");
            let mut seen = BTreeSet::new();
            for site in planned.sites.iter().filter(|s| !seen.insert(s.site_id.as_str())) {
                problems.push(format!("rollout {} plans {} twice", planned.rollout_id, site.site_id));
            }
        }
        for e in events.iter().filter(|e| FAILURES.contains(&e.delivery.type_name.as_str())) {
            problems.push(format!("{}: {}", e.delivery.type_name, json(e)));
        }

        // What the sites did, by their own counters: each host provisioned once, binaries
        // installed once per node, one kubeconfig and one container apply per site, and no
        // more patches than reported (nor fewer than reported as changes).
        let sites_kv = client.bus.kv(names::SITES_BUCKET).await.unwrap();
        let mut hosts = 0;
        for design in &client.sites {
            let site = design.site.to_string();
            // A cluster just restarted whole may time out a read while its leaders settle.
            let mut tries = 0;
            let (now, _) = loop {
                match sites_kv.get::<pb::SiteDesign>(&keys::site(&site)).await {
                    Ok(found) => break found.expect("the site's design"),
                    Err(e) if tries < 20 => {
                        tries += 1;
                        tracing::warn!(error = %e, "reading {site}'s design again");
                        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                    }
                    Err(e) => panic!("reading {site}'s design: {e}"),
                }
            };
            let names: BTreeSet<String> = now.nodes.iter().map(|n| n.name.clone()).collect();
            hosts += names.len();
            let effects = match site_gateway::sim::saved_effects(&self.sim_state(&site)) {
                Ok(e) => e,
                Err(e) => {
                    problems.push(format!("{site}: {e}"));
                    continue;
                }
            };
            let once: BTreeMap<String, u32> = names.iter().map(|n| (n.clone(), 1)).collect();
            if effects.provisions != once {
                problems.push(format!("{site}: provisions {:?}, want each of {names:?} once", effects.provisions));
            }
            if effects.binary_installs != once {
                problems.push(format!("{site}: binary installs {:?}, want each node once", effects.binary_installs));
            }
            if (effects.kubeconfigs_generated, effects.container_applies) != (1, 1) {
                problems.push(format!(
                    "{site}: {} kubeconfigs generated, {} container applies, want 1 and 1",
                    effects.kubeconfigs_generated, effects.container_applies
                ));
            }
            for node in &names {
                let patched: Vec<&Value> = unfolded
                    .iter()
                    .filter(|(_, t, v)| {
                        t == pb::NodePatched::TYPE && field(v, "site_id") == site && &field(v, "node") == node
                    })
                    .map(|(_, _, v)| v)
                    .collect();
                let changes = patched.iter().filter(|v| field(v, "from_version") != field(&v["package"], "version"));
                let (reported, as_changes) = (patched.len() as u32, changes.count() as u32);
                let done = effects.patches.get(node).copied().unwrap_or(0);
                if done > reported || done < as_changes {
                    problems.push(format!(
                        "{site}/{node}: patched {done} times, {reported} NodePatched ({as_changes} as changes)"
                    ));
                }
            }
        }
        // The observer, killed or not, ends up with what each node last reported running.
        let observed = client.bus.kv(names::OBSERVED_BUCKET).await.unwrap();
        let mut reported: BTreeMap<(String, String), String> = BTreeMap::new();
        for (_, type_name, v) in &unfolded {
            let kubelet = |list: &Value| {
                let list = list.as_array().cloned().unwrap_or_default();
                list.into_iter().find(|p| p["name"] == "kubelet").map(|p| field(&p, "version"))
            };
            let version = match type_name.as_str() {
                t if t == pb::NodeBinariesInstalled::TYPE => kubelet(&v["binaries"]),
                t if t == pb::NodeReady::TYPE => kubelet(&v["packages"]),
                t if t == pb::NodePatched::TYPE && v["package"]["name"] == "kubelet" => {
                    Some(field(&v["package"], "version"))
                }
                _ => None,
            };
            if let Some(version) = version {
                reported.insert((field(v, "site_id"), field(v, "node")), version);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let mut behind = Vec::new();
            for ((site, node), version) in &reported {
                let seen = observed.get::<pb::ObservedVersion>(&keys::observed(site, node, "kubelet")).await.unwrap();
                let seen = seen.map(|(v, _)| v.version).unwrap_or_default();
                if &seen != version {
                    behind.push(format!("{site}/{node}: observed kubelet {seen:?}, reported {version}"));
                }
            }
            if behind.is_empty() || Instant::now() > deadline {
                problems.extend(behind);
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Verdict { commands: sent.len(), terminal, repeated: repeated.len(), hosts, events: events.len(), problems }
    }
}

struct Verdict {
    commands: usize,
    terminal: usize,
    repeated: usize,
    hosts: usize,
    events: usize,
    problems: Vec<String>,
}

impl Verdict {
    fn assert_clean(&self) {
        assert!(self.problems.is_empty(), "{} problems:\n{}", self.problems.len(), self.problems.join("\n"));
        assert_eq!(self.terminal, self.commands);
    }
}

fn patch(version: &str) -> pb::PatchPackage {
    let strategy = pb::RolloutStrategy { canary_sites: 1, max_concurrent_sites: 2, ..Default::default() };
    pb::PatchPackage { name: "kubelet".into(), version: version.into(), strategy: Some(strategy), ..Default::default() }
}

/// The mixed workload: every site installed, then rounds of a new kubelet version registered and
/// rolled out while a new worker arrives at one site, until `stop`. Returns how many rounds ran.
async fn workload(client: Arc<Client>, nodes: usize, stop: tokio_util::sync::CancellationToken) -> Result<u32, String> {
    let mut installs = Vec::new();
    for design in &client.sites {
        let cmd = pb::InstallSite { site_id: design.site.to_string(), ..Default::default() };
        installs.push(client.publish(&cmd, format!("InstallSite {}", design.site)).await);
    }
    for id in &installs {
        client.expect_end(id, COMMAND_TIMEOUT).await?;
    }
    let mut round = 0;
    while !stop.is_cancelled() {
        round += 1;
        let version = format!("1.30.{round}");
        let registered = client.register_kubelet(&version).await;
        // A PatchPackage right behind its RegisterPackage may be handled first when an
        // orchestrator dies holding the registration: wait for it.
        client.expect_end(&registered, COMMAND_TIMEOUT).await?;
        let rollout = client.publish(&patch(&version), format!("PatchPackage kubelet@{version}")).await;
        // The new node arrives while the rollout is planned and runs.
        let site = (round as usize - 1) % client.sites.len();
        let number = nodes + 1 + (round as usize - 1) / client.sites.len();
        let arrival = client.add_node(site, number).await;
        client.expect_end(&rollout, COMMAND_TIMEOUT).await?;
        client.expect_end(&arrival, COMMAND_TIMEOUT).await?;
    }
    Ok(round)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_each_service_twenty_times_during_installs_rollouts_and_arrivals_loses_nothing_and_repeats_nothing() {
    tokio::time::timeout(TEST_TIMEOUT, kill_everything_twenty_times()).await.expect("the test ran out of time");
}

async fn kill_everything_twenty_times() {
    let started = Instant::now();
    let seed = seed();
    println!("chaos: seed={seed} (LANDFALL_CHAOS_SEED={seed} repeats the kills' schedule)");
    let mut rng = Rng(seed);
    let (sites, nodes) = (4, 3);
    let server = NatsServer::start();
    let mut d = Deployment::start(&server.url(), sites, nodes, 2, None).await;

    let stop = tokio_util::sync::CancellationToken::new();
    let work: JoinHandle<Result<u32, String>> = tokio::spawn(workload(d.client.clone(), nodes, stop.clone()));

    // The killer: at random moments, a random running service of a kind not yet killed
    // KILLS times gets SIGKILL, and is started again after a random pause.
    let mut kills: BTreeMap<Kind, u32> = Kind::ALL.iter().map(|k| (*k, 0)).collect();
    let mut down: BTreeMap<usize, Instant> = BTreeMap::new();
    let mut next_kill = Instant::now() + rng.between(KILL_EVERY);
    while kills.values().any(|n| *n < KILLS) || !down.is_empty() {
        let now = Instant::now();
        let due: Vec<usize> = down.iter().filter(|(_, at)| **at <= now).map(|(i, _)| *i).collect();
        for i in due {
            down.remove(&i);
            d.services[i].1.restart();
        }
        for (i, (_, s)) in d.services.iter_mut().enumerate() {
            if !down.contains_key(&i)
                && let Some(status) = s.exit_status()
            {
                panic!("{} exited by itself ({status}):\n{}", s.name, s.log_tail(40));
            }
        }
        if work.is_finished() {
            let result = work.await.expect("the workload panicked");
            panic!("the workload stopped while services were being killed: {result:?}\n{}", d.diagnose().await);
        }
        if now >= next_kill {
            let running = |k: Kind, i: usize, kind: Kind| k == kind && !down.contains_key(&i);
            let kinds: Vec<Kind> = Kind::ALL
                .into_iter()
                .filter(|k| kills[k] < KILLS && d.services.iter().enumerate().any(|(i, (s, _))| running(*s, i, *k)))
                .collect();
            if !kinds.is_empty() {
                let kind = kinds[rng.below(kinds.len())];
                let candidates: Vec<usize> =
                    (0..d.services.len()).filter(|i| running(d.services[*i].0, *i, kind)).collect();
                let i = candidates[rng.below(candidates.len())];
                d.services[i].1.kill();
                *kills.get_mut(&kind).unwrap() += 1;
                down.insert(i, now + rng.between(DOWN_FOR));
            }
            next_kill = now + rng.between(KILL_EVERY);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let chaos = started.elapsed();
    stop.cancel();
    let rounds = match work.await.expect("the workload panicked") {
        Ok(rounds) => rounds,
        Err(e) => panic!("the workload failed: {e}\n{}", d.diagnose().await),
    };
    d.assert_running();

    // Every command sent ends; then the stream is read whole.
    for s in d.client.sent() {
        if let Err(e) = d.client.wait_end(&s, COMMAND_TIMEOUT).await {
            panic!("{e}\n{}", d.diagnose().await);
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let verdict = d.judge().await;
    let counts: Vec<String> = kills.iter().map(|(k, n)| format!("{}={n}", k.name())).collect();
    let restarts: u32 = d.services.iter().map(|(_, s)| s.starts() - 1).sum();
    println!(
        "chaos: seed={seed}, kills: {}, restarts={restarts}, commands={}, terminal={}, steps repeated={}, \
         rounds={rounds}, hosts={}, events={}, problems={}, killing={:.1}s, elapsed={:.1}s",
        counts.join(" "),
        verdict.commands,
        verdict.terminal,
        verdict.repeated,
        verdict.hosts,
        verdict.events,
        verdict.problems.len(),
        chaos.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    assert!(kills.values().all(|n| *n == KILLS), "{kills:?}");
    assert!(rounds >= 1, "at least one rollout and one arrival ran while services were killed");
    verdict.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hub_nats_restarted_as_a_whole_every_service_reconnects_and_carries_on() {
    let test = async {
        let server = NatsServer::start();
        let url = server.url();
        restart_hub_mid_install(Hub::One(server), &url, None, false).await
    };
    tokio::time::timeout(TEST_TIMEOUT, test).await.expect("the test ran out of time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_production_cluster_restarted_as_a_whole_with_services_killed_meanwhile_loses_nothing() {
    let test = async {
        let tls_dir = tempfile::tempdir().unwrap();
        let tls = TlsFiles::make(tls_dir.path());
        let deployment = landfall_tests::topology::Deployment::generate(&["edge-01", "edge-02"], 3, Some(&tls));
        let servers = deployment.start_hubs();
        let url = deployment.hub_urls("tls");
        let users = Users { deployment, ca: tls.ca.clone() };
        let _ready = connect_when_ready(&url, "landfall-chaos-ready", &users.operator()).await;
        restart_hub_mid_install(Hub::Cluster(servers), &url, Some(&users), true).await
    };
    tokio::time::timeout(TEST_TIMEOUT, test).await.expect("the test ran out of time");
}

/// `landfall node add SITE --wait` for node `number` of site `site`, run as the operator; the id
/// of the `NodeAdded` its gateway announces.
async fn node_add_cli(client: &Client, url: &str, users: Option<&Users>, site: usize, number: usize) -> String {
    let site_id = client.sites[site].site.to_string();
    let (name, mac) = (format!("node-{number}"), format!("52:54:03:00:{site:02x}:{number:02x}"));
    let mut args: Vec<String> =
        ["node", "add", &site_id, "--name", &name, "--role", "worker", "--mac", &mac, "--wait", "--timeout", "150s"]
            .map(String::from)
            .into();
    if let Some(users) = users {
        args.extend(users.args(&Role::Operator));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = landfall_tests::cli::landfall(url, &args).await;
    let (stdout, stderr) = (landfall_tests::cli::text(&out.stdout), landfall_tests::cli::text(&out.stderr));
    assert!(out.status.success(), "landfall {args:?}: {}\n{stdout}\n{stderr}", out.status);
    let id = ids::node_added_id(&site_id, &name, &mac, "").to_string();
    client.track(&id, pb::NodeAdded::TYPE, format!("NodeAdded {site_id}/{name} (landfall node add)"));
    id
}

/// The hub's NATS: one server, or a cluster's servers.
enum Hub {
    One(NatsServer),
    Cluster(Vec<ConfServer>),
}

impl Hub {
    fn stop(&mut self) {
        match self {
            Hub::One(server) => server.stop(),
            Hub::Cluster(servers) => servers.iter_mut().for_each(ConfServer::kill),
        }
    }

    fn restart(&mut self) {
        match self {
            Hub::One(server) => server.restart(),
            Hub::Cluster(servers) => servers.iter_mut().for_each(ConfServer::restart),
        }
    }

    fn logs(&self) -> Vec<String> {
        match self {
            Hub::One(_) => Vec::new(),
            Hub::Cluster(servers) => servers.iter().map(ConfServer::log).collect(),
        }
    }
}

/// Stops the whole hub mid-install for 4 s (killing, with `kill_services`, the orchestrator and
/// the installing site's gateway while it is down, and starting them again before it is back),
/// then runs a command of every kind through it.
async fn restart_hub_mid_install(mut server: Hub, url: &str, users: Option<&Users>, kill_services: bool) {
    let started = Instant::now();
    let (sites, nodes) = (2, 3);
    let mut d = Deployment::start(url, sites, nodes, 1, users).await;
    let client = d.client.clone();
    let first = client.sites[0].site.to_string();
    let install = client
        .publish(&pb::InstallSite { site_id: first.clone(), ..Default::default() }, format!("InstallSite {first}"))
        .await;

    // Down mid-install: hosts are provisioning.
    let provisioning =
        landfall_tests::fleet::wait_for(&client.bus, pb::NodeOsProvisioning::filter(), &install, COMMAND_TIMEOUT).await;
    assert!(provisioning.is_some(), "the install reached provisioning");
    let outage = started.elapsed();
    let before = client.all_events().await.last().map_or(0, |e| e.delivery.stream_sequence);
    server.stop();
    let mut killed = Vec::new();
    if kill_services {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let gateway = format!("gateway-{first}");
        for (_, s) in d.services.iter_mut().filter(|(_, s)| s.name == "orchestrator-1" || s.name == gateway) {
            s.restart();
            killed.push(s.name.clone());
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
    } else {
        tokio::time::sleep(Duration::from_secs(4)).await;
    }
    d.assert_running();
    server.restart();

    d.expect_end(&install).await;
    let events = client.all_events().await;
    let installed = events
        .iter()
        .find(|e| e.delivery.envelope.correlation == install && e.delivery.type_name == pb::SiteInstalled::TYPE)
        .expect("SiteInstalled");
    assert!(installed.delivery.stream_sequence > before, "the install was still under way when NATS stopped");
    // Commands after the restart need every kind of service: an install (orchestrator, gateway,
    // distribution, secrets service, kubeconfig collector), a node announced through the API,
    // a rollout planned from what the observer recorded.
    let second = client.sites[1].site.to_string();
    let install2 = client
        .publish(&pb::InstallSite { site_id: second.clone(), ..Default::default() }, format!("InstallSite {second}"))
        .await;
    let arrival = client.add_node(0, nodes + 1).await;
    d.expect_end(&install2).await;
    d.expect_end(&arrival).await;
    // A host appearing at the second site's simulated racks (`landfall node add`, answered by
    // that site's gateway process), announced by the gateway and joined.
    let cli_arrival = node_add_cli(&client, url, users, 1, nodes + 1).await;
    d.expect_end(&cli_arrival).await;
    let registered = client.register_kubelet("1.30.0").await;
    d.expect_end(&registered).await;
    // The observer has recorded every node of both sites (it trails the events).
    let observed = client.bus.kv(names::OBSERVED_BUCKET).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut seen = 0;
        for design in &client.sites {
            seen += runtime::observed_nodes(&observed, &keys::observed_site_prefix(design.site.as_str()))
                .await
                .unwrap()
                .len();
        }
        if seen == sites * nodes + 2 {
            break;
        }
        assert!(Instant::now() < deadline, "the observer recorded {seen} nodes of {}", sites * nodes + 2);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let rollout = client.publish(&patch("1.30.0"), "PatchPackage kubelet@1.30.0".into()).await;
    d.expect_end(&rollout).await;
    let ready = client.http.get(format!("{}/readyz", client.api)).send().await.expect("the API answers");
    assert_eq!(ready.status(), 200, "{}", ready.text().await.unwrap_or_default());

    // Nothing lost, nothing twice, and every service is the process it was: none restarted,
    // each lost its connection and made it again.
    d.assert_running();
    for (_, s) in &d.services {
        let log = s.log_text();
        let lost = log.find("nats disconnected");
        let back = lost.is_some_and(|at| log[at..].contains("nats connected"));
        assert!(back, "{} did not lose and regain its connection:\n{}", s.name, s.log_tail(30));
        assert!(!log.contains("Permissions Violation"), "{} was refused something:\n{}", s.name, s.log_tail(30));
    }
    for log in server.logs() {
        assert!(!log.contains("Permissions Violation"), "the hub refused a service something:\n{log}");
    }
    // One server keeps the sites' durables in its memory only: the orchestrator made them again
    // once it was back (a cluster keeps them in its replicated assignments). The dispatcher's
    // durables are kept on disk, and the rollout above ended through them.
    let durables = bus_schema::runtime::JobDelivery::from_env() == Ok(bus_schema::runtime::JobDelivery::Durable);
    if durables && matches!(server, Hub::One(_)) {
        let (_, orchestrator) = d.services.iter().find(|(_, s)| s.name == "orchestrator-1").expect("an orchestrator");
        assert!(
            orchestrator.log_text().contains("durables were missing on this server: made again"),
            "the orchestrator did not make the sites' durables again:\n{}",
            orchestrator.log_tail(30)
        );
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let verdict = d.judge().await;
    let starts: u32 = d.services.iter().map(|(_, s)| s.starts()).sum();
    println!(
        "nats restart ({}): outage at {:.1}s for 4s, killed meanwhile={killed:?}, services={} starts={starts}, \
         commands={}, terminal={}, steps repeated={}, hosts={}, events={}, problems={}, elapsed={:.1}s",
        match server {
            Hub::One(_) => "one server",
            Hub::Cluster(_) => "three-server cluster, TLS, a user per process",
        },
        outage.as_secs_f64(),
        d.services.len(),
        verdict.commands,
        verdict.terminal,
        verdict.repeated,
        verdict.hosts,
        verdict.events,
        verdict.problems.len(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(starts as usize, d.services.len() + killed.len(), "no service was started twice but those killed");
    verdict.assert_clean();
}
