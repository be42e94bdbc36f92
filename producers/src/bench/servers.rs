//! The processes of the production shape (`bench fanout --shape production`) and of the
//! benchmarks that start their own hub: the hub as `deploy nats-config` writes it, its relays, the
//! first sites' leaf nodes and the hub's services, each a child whose memory and CPU are read
//! from `/proc`.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bus_schema::access::Role;
use bus_schema::domain::SiteDesign;
use bus_schema::names;
use bus_schema::runtime::{Access, Bus};
use serde_json::json;

use super::hub_costs::{self, HubSample};
use super::round;
use crate::deploy;
use crate::run::embedded::tied;

/// User and system CPU seconds so far of process `pid` (or `self`), in clock ticks of 1/100 s
/// (Linux's USER_HZ).
pub(super) fn cpu_seconds_of(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command's closing parenthesis: state is the first, utime the 12th.
    let fields: Vec<&str> =
        stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// A child process whose memory and CPU are read from `/proc`.
pub(super) struct Process {
    child: Child,
}

impl Process {
    pub(super) fn spawn(mut cmd: std::process::Command, log: &Path) -> anyhow::Result<Self> {
        let log = std::fs::File::create(log).with_context(|| format!("create {}", log.display()))?;
        cmd.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
        Ok(Self { child: tied::spawn(cmd)? })
    }

    fn status_mib(&self, field: &str) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        let kib = status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok());
        kib.unwrap_or(0.0) / 1024.0
    }

    pub(super) fn rss_mib(&self) -> f64 {
        self.status_mib("VmRSS:")
    }

    pub(super) fn peak_mib(&self) -> f64 {
        self.status_mib("VmHWM:")
    }

    pub(super) fn cpu_seconds(&self) -> f64 {
        cpu_seconds_of(&self.child.id().to_string())
    }

    pub(super) fn stop(self) {
        self.stop_within(Duration::from_secs(5));
    }

    /// SIGTERM, then SIGKILL if it has not ended `within`.
    pub(super) fn stop_within(mut self, within: Duration) {
        let _ = std::process::Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let t = Instant::now();
        while t.elapsed() < within {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// How it ended, if it has.
    pub(super) fn exited(&mut self) -> anyhow::Result<Option<std::process::ExitStatus>> {
        Ok(self.child.try_wait()?)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

pub(super) fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind(("127.0.0.1", 0))?.local_addr()?.port())
}

/// nats-server `binary` started on configuration `conf`, once it listens for clients on `port`.
pub(super) async fn start_configured(binary: &Path, conf: &Path, port: u16, log: &Path) -> anyhow::Result<Process> {
    let mut cmd = tied::command(binary);
    cmd.arg("-c").arg(conf);
    let mut process = Process::spawn(cmd, log)?;
    wait_listening(&mut process, port, log).await?;
    Ok(process)
}

pub(super) async fn wait_listening(process: &mut Process, port: u16, log: &Path) -> anyhow::Result<()> {
    for _ in 0..600 {
        if let Some(status) = process.child.try_wait()? {
            bail!("nats-server exited at start ({status}); see {}", log.display());
        }
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("nats-server did not listen on {port} within 60 s; see {}", log.display())
}

/// A regional hub's place below the core: its region's name, the core's leaf listener
/// (HOST:PORT) and the region's key there.
pub(super) struct RegionOf<'a> {
    pub(super) name: &'a str,
    pub(super) core_leaf: String,
    pub(super) key: PathBuf,
}

/// The hub: one nats-server as `deploy nats-config` writes it for the fleet's sites.
pub(super) struct Hub {
    pub(super) process: Process,
    pub(super) url: String,
    /// Where `deploy nats-config` wrote the configuration and keys.
    pub(super) config: PathBuf,
    client: u16,
    /// The monitoring port.
    http: u16,
    /// Go's profiler: the hub's live heap and goroutines (`LANDFALL_BENCH_HUB_PROF_PORT` names
    /// it, to profile the hub while the benchmark runs).
    prof: u16,
}

impl Hub {
    pub(super) async fn start(
        binary: &Path,
        root: &Path,
        designs: &[SiteDesign],
        relays: usize,
    ) -> anyhow::Result<Self> {
        Self::start_in(binary, root, designs, relays, None).await
    }

    /// The hub of a region below a core (`deploy nats-config --region --core --core-key`).
    pub(super) async fn start_in(
        binary: &Path,
        root: &Path,
        designs: &[SiteDesign],
        relays: usize,
        region: Option<&RegionOf<'_>>,
    ) -> anyhow::Result<Self> {
        let (client, leaf) = (free_port()?, free_port()?);
        let relays = (0..relays)
            .map(|_| Ok(format!("127.0.0.1:{}:{}:{}", free_port()?, free_port()?, free_port()?)))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let args = deploy::NatsConfigArgs {
            relays,
            sites: designs.iter().map(|d| d.site.to_string()).collect(),
            out: root.join("nats"),
            hubs: vec![format!("127.0.0.1:{client}:{}:{leaf}:{}", free_port()?, free_port()?)],
            leaf_advertise: Vec::new(),
            store_dir: root.join("store"),
            site_listen: "127.0.0.1:4222".into(),
            tls_cert: None,
            tls_key: None,
            tls_ca: None,
            site_auth: None,
            site_creds: root.join("link.creds"),
            region: region.map(|r| r.name.to_string()),
            core: region.map(|r| vec![r.core_leaf.clone()]).unwrap_or_default(),
            core_key: region.map(|r| r.key.clone()),
            core_ca: None,
        };
        let http = args.hubs[0].rsplit(':').next().unwrap_or_default().parse::<u16>()?;
        // A key per site is seconds of CPU at thousands of sites: off the runtime, so a signal
        // meanwhile stops the benchmark at once.
        let args = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
            deploy::write(&deploy::plan(&args)?, &args.out)?;
            Ok(args)
        })
        .await??;
        // One port for one hub: the regions' hubs each take a free one.
        let prof = match (region, std::env::var("LANDFALL_BENCH_HUB_PROF_PORT")) {
            (None, Ok(port)) => port.parse().context("LANDFALL_BENCH_HUB_PROF_PORT is not a port")?,
            _ => free_port()?,
        };
        let conf = args.out.join(format!("hub/{}.conf", deploy::hub_name(0)));
        let text = std::fs::read_to_string(&conf)?;
        std::fs::write(&conf, format!("prof_port: {prof}\n{text}"))?;
        let process = Self::spawn(binary, &args.out, client).await?;
        Ok(Self { process, url: format!("nats://127.0.0.1:{client}"), config: args.out, client, http, prof })
    }

    async fn spawn(binary: &Path, config: &Path, client: u16) -> anyhow::Result<Process> {
        let conf = config.join(format!("hub/{}.conf", deploy::hub_name(0)));
        start_configured(binary, &conf, client, &config.join("hub.log")).await
    }

    /// Stops the hub (SIGTERM: it flushes its store) and starts it again on the same store.
    pub(super) async fn restart(&mut self, binary: &Path) -> anyhow::Result<()> {
        let old = std::mem::replace(&mut self.process, Self::placeholder()?);
        old.stop();
        self.process = Self::spawn(binary, &self.config, self.client).await?;
        Ok(())
    }

    /// A process that has already ended, standing in while the hub restarts.
    fn placeholder() -> anyhow::Result<Process> {
        let mut child = std::process::Command::new("true").spawn()?;
        child.wait()?;
        Ok(Process { child })
    }

    /// Client connections the hub has now (its monitoring endpoint).
    pub(super) async fn connections(&self) -> anyhow::Result<usize> {
        let varz: serde_json::Value =
            serde_json::from_str(&hub_costs::get(format!("http://127.0.0.1:{}/varz", self.http)).await?)?;
        // Gateways behind leaf nodes reach the hub through their leaf node's link.
        let count = |field: &str| varz[field].as_u64().with_context(|| format!("/varz has no {field} count"));
        Ok((count("connections")? + count("leafnodes")?) as usize)
    }

    pub(super) fn seed_file(&self, role: &Role) -> PathBuf {
        match role {
            Role::Site(site) => self.config.join(format!("sites/{site}/gateway.nk")),
            role => self.config.join(format!("users/{}.nk", role.user())),
        }
    }

    /// The operator's connection, once the orchestrator has made the streams every run needs.
    pub(super) async fn operator_when_ready(&self) -> anyhow::Result<Bus> {
        let bus = Bus::connect_with(&self.url, "landfall-bench", &self.access(&Role::Operator)?).await?;
        let never = tokio_util::sync::CancellationToken::new();
        for stream in [names::jobs_stream(names::JOB_SHARDS - 1), names::EVENTS_STREAM, names::COMMANDS_STREAM] {
            tokio::time::timeout(Duration::from_secs(60), bus.wait_for_stream(stream, &never))
                .await
                .with_context(|| format!("the orchestrator did not make {stream} within 60 s"))??;
        }
        Ok(bus)
    }

    /// How a hub service or the operator connects.
    pub(super) fn access(&self, role: &Role) -> anyhow::Result<Access> {
        let seed = Access::seed_from_file(&self.seed_file(role)).map_err(anyhow::Error::msg)?;
        Ok(Access { nkey_seed: Some(seed), ..Access::default() })
    }

    pub(super) fn cpu_seconds(&self) -> f64 {
        self.process.cpu_seconds()
    }

    pub(super) async fn sample(&self) -> anyhow::Result<HubSample> {
        HubSample::take(self.http, self.prof, self.cpu_seconds()).await
    }
}

/// The relays in front of the hub, each a nats-server as `deploy nats-config --relay` wrote it.
pub(super) struct Relays {
    relays: Vec<(Process, String)>,
}

impl Relays {
    pub(super) async fn start(binary: &Path, hub: &Hub) -> anyhow::Result<Self> {
        let mut relays = Vec::new();
        for i in 0.. {
            let path = hub.config.join(format!("relays/{}.conf", deploy::relay_name(i)));
            if !path.exists() {
                break;
            }
            let conf = std::fs::read_to_string(&path)?;
            let port: u16 = conf
                .lines()
                .find_map(|l| l.strip_prefix("listen: \"127.0.0.1:"))
                .and_then(|p| p.trim_end_matches('"').parse().ok())
                .with_context(|| format!("{} has no listen address", path.display()))?;
            let log = hub.config.join(format!("relays/{}.log", deploy::relay_name(i)));
            let process = start_configured(binary, &path, port, &log).await?;
            relays.push((process, format!("nats://127.0.0.1:{port}")));
        }
        Ok(Self { relays })
    }

    pub(super) fn count(&self) -> usize {
        self.relays.len()
    }

    /// The relay `site`'s gateway connects to, if there are relays.
    pub(super) fn url(&self, site: &str) -> Option<&str> {
        (!self.relays.is_empty()).then(|| self.relays[deploy::relay_of(site, self.relays.len())].1.as_str())
    }

    pub(super) fn cpu_seconds(&self) -> f64 {
        self.relays.iter().map(|(p, _)| p.cpu_seconds()).sum()
    }

    pub(super) fn memory(&self, sites: usize) -> serde_json::Value {
        if self.relays.is_empty() {
            return serde_json::Value::Null;
        }
        let rss: f64 = self.relays.iter().map(|(p, _)| p.rss_mib()).sum();
        let peak: f64 = self.relays.iter().map(|(p, _)| p.peak_mib()).sum();
        json!({
            "count": self.relays.len(),
            "rss_mib_total": round(rss, 1),
            "peak_rss_mib_total": round(peak, 1),
            "rss_kib_per_site": round(rss * 1024.0 / sites as f64, 1),
        })
    }

    pub(super) fn stop(self) {
        for (p, _) in self.relays {
            p.stop();
        }
    }
}

/// The hub's services, each a `landfall serve …` process with its own user.
pub(super) struct Services {
    pub(super) processes: Vec<(&'static str, Process)>,
}

impl Services {
    pub(super) fn start(hub: &Hub, root: &Path, store: &Path) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("find the landfall executable")?;
        let key_file = root.join("secret.key");
        std::fs::write(&key_file, format!("{}\n", "5a".repeat(32)))?;
        std::fs::set_permissions(&key_file, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
        let mut processes = Vec::new();
        for (name, role) in [
            ("orchestrator", Role::Orchestrator),
            ("observer", Role::Observer),
            ("kubeconfig", Role::Kubeconfig),
            ("distribution", Role::Distribution),
        ] {
            let mut cmd = tied::command(&exe);
            cmd.args(["serve", name])
                .env("NATS_URL", &hub.url)
                .env("LANDFALL_NATS_NKEY_FILE", hub.seed_file(&role))
                .env("LANDFALL_SECRET_KEY_FILE", &key_file)
                .env("LANDFALL_STORE", store)
                .env("RUST_LOG", "warn");
            processes.push((name, Process::spawn(cmd, &root.join(format!("{name}.log")))?));
        }
        Ok(Self { processes })
    }

    /// Each service's RSS now and at its peak, in MiB.
    pub(super) fn memory(&self) -> serde_json::Value {
        let mut out = serde_json::Map::new();
        for (name, p) in &self.processes {
            out.insert(
                name.to_string(),
                json!({ "rss_mib": round(p.rss_mib(), 1), "peak_rss_mib": round(p.peak_mib(), 1) }),
            );
        }
        out.into()
    }

    pub(super) fn stop(self) {
        for (_, p) in self.processes {
            p.stop();
        }
    }
}

/// Leaf nodes of the first sites, each its own nats-server as `deploy nats-config` wrote it,
/// linked to the hub as its site's user.
pub(super) struct Leaves {
    leaves: Vec<(Process, String)>,
}

impl Leaves {
    pub(super) async fn start(binary: &Path, hub: &Hub, designs: &[SiteDesign]) -> anyhow::Result<Self> {
        let mut leaves = Vec::new();
        for d in designs {
            let dir = hub.config.join(format!("sites/{}", d.site));
            let port = free_port()?;
            let conf = std::fs::read_to_string(dir.join("leaf.conf"))?
                .replace("listen: \"127.0.0.1:4222\"", &format!("listen: \"127.0.0.1:{port}\""));
            let path = dir.join("leaf-bench.conf");
            std::fs::write(&path, conf)?;
            let process = start_configured(binary, &path, port, &dir.join("leaf.log")).await?;
            leaves.push((process, format!("nats://127.0.0.1:{port}")));
        }
        Ok(Self { leaves })
    }

    /// The leaf node the `i`-th site's gateway connects to, if it has one.
    pub(super) fn url(&self, i: usize) -> Option<&str> {
        self.leaves.get(i).map(|(_, url)| url.as_str())
    }

    pub(super) fn rss_mib(&self) -> serde_json::Value {
        if self.leaves.is_empty() {
            return serde_json::Value::Null;
        }
        let rss: Vec<f64> = self.leaves.iter().map(|(p, _)| p.rss_mib()).collect();
        let total: f64 = rss.iter().sum();
        json!({
            "count": rss.len(),
            "rss_mib_total": round(total, 1),
            "rss_mib_each": round(total / rss.len() as f64, 1),
        })
    }

    pub(super) fn stop(self) {
        for (p, _) in self.leaves {
            p.stop();
        }
    }
}
