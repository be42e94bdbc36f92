//! A real Kubernetes API server, one per test: etcd and `landfall-test-apiserver`
//! (`tests/kube-apiserver`: the CRD server kube-apiserver embeds, with the core resources added
//! beside it), with the site's CRDs installed.
//!
//! ```text
//! let kube = KubeApiServer::start().await;     // BareMetalHost, Provisioning, Software served
//! let client = kube.client().await;            // system:masters, namespace "default"
//! let kubeconfig = kube.kubeconfig_path();     // the same identity, for a process under test
//! ```
//!
//! It serves CRDs and custom resources with the upstream schemas' validation and defaulting,
//! the status subresource, watch, resourceVersion conflicts and server-side apply; and, through
//! the same API machinery, Namespaces, Nodes, Pods (with eviction, which honours disruption
//! budgets), Secrets, ConfigMaps, Services, PodDisruptionBudgets, Deployments, DaemonSets,
//! StatefulSets and Jobs. Core objects are stored as sent, without validation or defaulting. It
//! runs no controllers: no garbage collector, no kubelet, no disruption controller; a test writes
//! what they would (a Node's Ready condition, a budget's status).
//!
//! One liberty is taken with the CRDs the harness installs: their `Established` condition is
//! dated back a minute. The API server holds every create for 2 s while that condition is
//! younger than 2 s (for HA control planes); one server has nobody to wait for.
//!
//! Each server has its own etcd (own data dir, own ports), its own certificates and a fresh
//! temporary directory, so tests run in parallel without seeing each other. Dropping the
//! [`KubeApiServer`] kills both processes and removes the directory; if the test is panicking,
//! the tails of both logs are printed first.
//!
//! The binaries come from the directory `$LANDFALL_KUBE_BIN` when set, else whatever
//! `scripts/ensure-kube-apiserver` prints (it builds the API server once into
//! `~/.cache/landfall`). Certificates are made with the `openssl` command.

use producers::embedded::tied;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bus_schema::yaml;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::{Map, Value};
use tempfile::TempDir;

/// The script that finds or builds the binaries, relative to this crate.
const ENSURE_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/ensure-kube-apiserver");
/// The CRDs a site runs (`deploy/crds`), installed into every server.
const SITE_CRDS: [&str; 3] = [
    include_str!("../../deploy/crds/metal3/metal3.io_baremetalhosts.yaml"),
    include_str!("../../deploy/crds/icn-bpa/bpa_v1alpha1_provisioning_crd.yaml"),
    include_str!("../../deploy/crds/icn-bpa/bpa_v1alpha1_software_crd.yaml"),
];
/// How long etcd and the API server together may take to answer (generous: parallel tests on a
/// small machine).
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a CRD may take from being applied to being served.
const CRD_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one readiness request may take before it counts as a failed poll (short: whatever
/// holds a port that turned out to be taken may accept and never answer).
const POLL_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// How many times a start is retried when a port turns out to be taken.
const ADDR_IN_USE_ATTEMPTS: usize = 5;
/// How many lines of each log a failure shows.
const LOG_TAIL_LINES: usize = 40;
/// How long after a CRD is Established the API server holds creates of its resource (plus a
/// second: the condition's time is truncated to seconds).
const CREATE_HOLD: SignedDuration = SignedDuration::from_secs(3);
/// The field manager of the CRDs the harness applies.
const FIELD_MANAGER: &str = "landfall-test-harness";
const V1BETA1: &str = "apiextensions.k8s.io/v1beta1";
const V1: &str = "apiextensions.k8s.io/v1";

/// A running etcd + landfall-test-apiserver, owned by a test; both killed on drop, temp dir
/// removed.
pub struct KubeApiServer {
    port: u16,
    kubeconfig: PathBuf,
    /// For the harness's own requests (CRD installation).
    client: kube::Client,
    processes: Processes,
    /// Holds the certificates, the kubeconfigs, etcd's data dir and both logs. Declared after
    /// `processes` so the processes are gone before it is removed.
    dir: TempDir,
}

impl KubeApiServer {
    /// Starts etcd and the API server on free loopback ports in a fresh temp dir, installs the
    /// Metal3 BareMetalHost CRD and the BPA Provisioning and Software CRDs from deploy/crds,
    /// and returns once all three are Established and served. Panics with the tail of the logs
    /// if it cannot.
    pub async fn start() -> KubeApiServer {
        // Finding the binaries may mean building them (minutes), and openssl runs a few times.
        let (bin, dir) = tokio::task::spawn_blocking(|| {
            let bin = kube_bin().to_path_buf();
            let dir = tempfile::Builder::new()
                .prefix("landfall-kube-")
                .tempdir()
                .unwrap_or_else(|e| panic!("cannot create a temporary directory for the kube API server: {e}"));
            make_certificates(dir.path());
            (bin, dir)
        })
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));

        let kubeconfig = dir.path().join("client.kubeconfig");
        let mut attempt = 1;
        let (port, processes, client) = loop {
            let [port, etcd_client_port, etcd_peer_port] = free_ports();
            write_kubeconfigs(dir.path(), port);
            let mut processes = Processes::spawn(&bin, dir.path(), port, etcd_client_port, etcd_peer_port);
            match processes.wait_ready(&kubeconfig).await {
                Ok(client) => break (port, processes, client),
                Err(failure) => {
                    processes.kill();
                    let logs = log_tails(dir.path());
                    if logs.contains("address already in use") && attempt < ADDR_IN_USE_ATTEMPTS {
                        attempt += 1;
                        for stale in ["etcd", "etcd.log", "apiserver.log"] {
                            let path = dir.path().join(stale);
                            let _ = if path.is_dir() { fs::remove_dir_all(path) } else { fs::remove_file(path) };
                        }
                        continue;
                    }
                    panic!(
                        "kube API server (127.0.0.1:{port}, etcd 127.0.0.1:{etcd_client_port}) {failure}\n\
                         binaries: {}\n{logs}",
                        bin.display()
                    );
                }
            }
        };

        let server = KubeApiServer { port, kubeconfig, client, processes, dir };
        futures::future::join_all(SITE_CRDS.iter().map(|yaml| server.install_crd(yaml))).await;
        server
    }

    /// Path of a kubeconfig file (client certificate auth, server CA, current-context set,
    /// namespace "default") for this server.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// A kube::Client for it (built from that kubeconfig with kube::Config::from_custom_kubeconfig).
    pub async fn client(&self) -> kube::Client {
        client_from(&self.kubeconfig, true).await.unwrap_or_else(|e| panic!("{e}"))
    }

    /// A client that hands a 429 (an eviction a disruption budget refuses) straight back: the
    /// default one tries again for minutes.
    pub async fn client_without_retries(&self) -> kube::Client {
        client_from(&self.kubeconfig, false).await.unwrap_or_else(|e| panic!("{e}"))
    }

    /// https://127.0.0.1:PORT
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// Installs one more CRD from YAML (apiextensions.k8s.io/v1, or v1beta1 converted with
    /// [`crd_to_v1`]) and waits until it is Established and its resource is served. Every
    /// document of a multi-document YAML is installed.
    pub async fn install_crd(&self, yaml: &str) {
        for document in yaml::documents(yaml) {
            let value: Value =
                document.and_then(|d| d.parse()).unwrap_or_else(|e| panic!("install_crd: not YAML: {e}"));
            if value.is_null() {
                continue;
            }
            let crd: CustomResourceDefinition = serde_json::from_value(crd_to_v1(value))
                .unwrap_or_else(|e| panic!("install_crd: not a CustomResourceDefinition: {e}"));
            self.apply_crd(&crd).await;
        }
    }

    async fn apply_crd(&self, crd: &CustomResourceDefinition) {
        let name = crd.metadata.name.as_deref().expect("install_crd: the CRD has no metadata.name");
        let crds: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        crds.patch(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(crd))
            .await
            .unwrap_or_else(|e| panic!("install_crd: applying {name} failed: {e}"));

        // Established can come a moment before the resource's endpoint serves: wait for both.
        let resources: Vec<ApiResource> = crd
            .spec
            .versions
            .iter()
            .filter(|v| v.served)
            .map(|v| ApiResource {
                group: crd.spec.group.clone(),
                version: v.name.clone(),
                api_version: format!("{}/{}", crd.spec.group, v.name),
                kind: crd.spec.names.kind.clone(),
                plural: crd.spec.names.plural.clone(),
            })
            .collect();
        let deadline = Instant::now() + CRD_TIMEOUT;
        loop {
            let Err(why) = self.crd_served(&crds, name, &resources).await else { return };
            assert!(Instant::now() < deadline, "install_crd: {name} was not served within {CRD_TIMEOUT:?}: {why}");
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// `Ok` when the CRD is Established (since long enough) and a list of each served version
    /// succeeds; `Err` says what is missing.
    async fn crd_served(
        &self,
        crds: &Api<CustomResourceDefinition>,
        name: &str,
        resources: &[ApiResource],
    ) -> Result<(), String> {
        let crd = crds.get_status(name).await.map_err(|e| format!("reading its status failed: {e}"))?;
        let mut conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
        let Some(established) = conditions.iter_mut().find(|c| c.type_ == "Established" && c.status == "True") else {
            return Err(format!("not Established; conditions: {conditions:?}"));
        };
        // The API server holds every create of a resource for 2 s while its CRD's Established
        // condition is younger than 2 s, so the other servers of an HA control plane catch up.
        // There are none here: date the condition back rather than make each test's first
        // create wait.
        let now = Timestamp::now();
        if let Some(since) = &mut established.last_transition_time
            && now.duration_since(since.0) < CREATE_HOLD
        {
            since.0 = now - SignedDuration::from_mins(1);
            let patch = serde_json::json!({
                "metadata": { "resourceVersion": crd.metadata.resource_version },
                "status": { "conditions": conditions },
            });
            crds.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| format!("dating Established back failed: {e}"))?;
            return Err("Established a moment ago; dated back, checking again".into());
        }
        for resource in resources {
            let api: Api<DynamicObject> = Api::all_with(self.client.clone(), resource);
            api.list(&ListParams::default().limit(1))
                .await
                .map_err(|e| format!("Established, but listing {} failed: {e}", resource.api_version))?;
        }
        Ok(())
    }
}

impl Drop for KubeApiServer {
    fn drop(&mut self) {
        self.processes.kill();
        if std::thread::panicking() {
            eprintln!(
                "---- kube API server {} (dir {}) ----\n{}",
                self.url(),
                self.dir.path().display(),
                log_tails(self.dir.path())
            );
        }
    }
}

/// etcd and the API server; killed (SIGKILL, then reaped) on drop.
struct Processes {
    etcd: Option<Child>,
    apiserver: Option<Child>,
}

impl Processes {
    fn spawn(bin: &Path, dir: &Path, port: u16, etcd_client_port: u16, etcd_peer_port: u16) -> Processes {
        let etcd_url = format!("http://127.0.0.1:{etcd_client_port}");
        let peer_url = format!("http://127.0.0.1:{etcd_peer_port}");
        let mut etcd = tied::command(bin.join("etcd"));
        etcd.arg("--name=landfall-test")
            .arg(format!("--data-dir={}", dir.join("etcd").display()))
            .arg(format!("--listen-client-urls={etcd_url}"))
            .arg(format!("--advertise-client-urls={etcd_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=landfall-test={peer_url}"))
            .args(["--logger=zap", "--log-outputs=stderr", "--log-level=warn"]);
        let etcd = spawn_logged(etcd, &dir.join("etcd.log"));

        let file = |name: &str| dir.join(name).display().to_string();
        let mut apiserver = tied::command(bin.join("landfall-test-apiserver"));
        apiserver
            .arg(format!("--etcd-servers={etcd_url}"))
            .arg(format!("--etcd-prefix=/landfall-test-{port}"))
            .arg(format!("--secure-port={port}"))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--cert-dir={}", file("apiserver-certs")))
            .arg(format!("--tls-cert-file={}", file("server.crt")))
            .arg(format!("--tls-private-key-file={}", file("server.key")))
            .arg(format!("--client-ca-file={}", file("ca.crt")))
            // There is no core API server to delegate to: these point at the server itself,
            // anonymously. Clients are in system:masters, which is authorized without asking.
            .arg(format!("--kubeconfig={}", file("apiserver.kubeconfig")))
            .arg(format!("--authentication-kubeconfig={}", file("apiserver.kubeconfig")))
            .arg(format!("--authorization-kubeconfig={}", file("apiserver.kubeconfig")))
            .arg("--authentication-skip-lookup")
            .arg("--enable-priority-and-fairness=false")
            // Nothing would ever run the garbage collector: with it "enabled", a foreground or
            // orphan delete would leave the object waiting for a finalizer forever.
            .arg("--enable-garbage-collector=false")
            .arg(
                "--disable-admission-plugins=NamespaceLifecycle,MutatingAdmissionWebhook,\
                 ValidatingAdmissionWebhook,ValidatingAdmissionPolicy,MutatingAdmissionPolicy",
            );
        let apiserver = spawn_logged(apiserver, &dir.join("apiserver.log"));
        Processes { etcd: Some(etcd), apiserver: Some(apiserver) }
    }

    /// Polls until the API server lists CRDs for the client of `kubeconfig` (its `/readyz`
    /// never turns ready: the informers of the missing core API never sync).
    async fn wait_ready(&mut self, kubeconfig: &Path) -> Result<kube::Client, String> {
        let client = client_from(kubeconfig, true).await?;
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            self.check_running()?;
            let answer = tokio::time::timeout(POLL_REQUEST_TIMEOUT, crds.list(&ListParams::default().limit(1))).await;
            // Checked after the answer too: an API server whose own etcd lost the race for its
            // port may have connected to another test's.
            self.check_running()?;
            let last = match answer {
                Ok(Ok(_)) => return Ok(client),
                Ok(Err(e)) => e.to_string(),
                Err(_) => format!("a list of CRDs took more than {POLL_REQUEST_TIMEOUT:?}"),
            };
            if Instant::now() >= deadline {
                return Err(format!("was not ready within {READY_TIMEOUT:?}; last error: {last}"));
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    fn check_running(&mut self) -> Result<(), String> {
        for (name, child) in [("etcd", &mut self.etcd), ("landfall-test-apiserver", &mut self.apiserver)] {
            if let Some(Ok(Some(status))) = child.as_mut().map(Child::try_wait) {
                return Err(format!("did not start: {name} exited with {status}"));
            }
        }
        Ok(())
    }

    fn kill(&mut self) {
        for mut child in [self.apiserver.take(), self.etcd.take()].into_iter().flatten() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        self.kill();
    }
}

fn spawn_logged(mut command: Command, log: &Path) -> Child {
    let out = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", log.display()));
    let err = out.try_clone().unwrap_or_else(|e| panic!("cannot clone the handle of {}: {e}", log.display()));
    command.stdin(Stdio::null()).stdout(out).stderr(err);
    let shown = format!("{command:?}");
    tied::spawn(command).unwrap_or_else(|e| {
        panic!("cannot run {shown} ({e}); set LANDFALL_KUBE_BIN to a directory of working binaries")
    })
}

/// The last lines of both logs, labelled.
fn log_tails(dir: &Path) -> String {
    let mut out = String::new();
    for name in ["etcd.log", "apiserver.log"] {
        let path = dir.join(name);
        let text = fs::read(&path).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n");
        out.push_str(&format!("---- {} (last {LOG_TAIL_LINES} lines) ----\n{tail}\n", path.display()));
    }
    out.push_str("---- end of logs ----");
    out
}

async fn client_from(kubeconfig: &Path, retries: bool) -> Result<kube::Client, String> {
    let file = Kubeconfig::read_from(kubeconfig).map_err(|e| format!("cannot read {}: {e}", kubeconfig.display()))?;
    let mut config = kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .map_err(|e| format!("cannot load {}: {e}", kubeconfig.display()))?;
    config.default_retry = retries;
    kube::Client::try_from(config).map_err(|e| format!("cannot build a client from {}: {e}", kubeconfig.display()))
}

/// Three distinct ports that were free a moment ago.
fn free_ports() -> [u16; 3] {
    [(); 3].map(|()| crate::nats::free_port())
}

/// The directory holding `etcd` and `landfall-test-apiserver`, resolved once per test binary.
pub fn kube_bin() -> &'static Path {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match BIN.get_or_init(resolve_bin) {
        Ok(path) => path,
        Err(msg) => panic!("{msg}"),
    }
}

fn resolve_bin() -> Result<PathBuf, String> {
    let dir = match std::env::var_os("LANDFALL_KUBE_BIN").filter(|p| !p.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => crate::procs::ensured(
            ENSURE_SCRIPT,
            &[],
            "no kube API server for the tests; set LANDFALL_KUBE_BIN to a directory holding landfall-test-apiserver and etcd",
        )?,
    };
    for binary in ["etcd", "landfall-test-apiserver"] {
        if !dir.join(binary).is_file() {
            return Err(format!("{} has no {binary} (LANDFALL_KUBE_BIN or {ENSURE_SCRIPT})", dir.display()));
        }
    }
    Ok(dir)
}

/// Writes into `dir` a CA, a serving certificate for 127.0.0.1/localhost and a client
/// certificate in `system:masters`, all X.509 v3 (rustls refuses v1) with P-256 keys.
fn make_certificates(dir: &Path) {
    const NEW_KEY: &str = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    openssl(
        dir,
        &format!(
            "req -x509 {NEW_KEY} -days 3650 -keyout ca.key -out ca.crt -subj /CN=landfall-test-ca \
             -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign"
        ),
    );
    for (name, subject, extensions) in [
        ("server", "/CN=127.0.0.1", "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n"),
        ("client", "/O=system:masters/CN=landfall-test", "extendedKeyUsage=clientAuth\n"),
    ] {
        let extensions =
            format!("basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n{extensions}");
        fs::write(dir.join(format!("{name}.ext")), extensions)
            .unwrap_or_else(|e| panic!("cannot write {name}.ext: {e}"));
        openssl(dir, &format!("req {NEW_KEY} -keyout {name}.key -out {name}.csr -subj {subject}"));
        openssl(
            dir,
            &format!(
                "x509 -req -in {name}.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
                 -out {name}.crt -extfile {name}.ext"
            ),
        );
    }
}

/// Runs `openssl` in `dir` with `args` (split at whitespace); returns its stdout, panics with its
/// stderr if it fails.
fn openssl(dir: &Path, args: &str) -> Vec<u8> {
    let output = Command::new("openssl")
        .args(args.split_whitespace())
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run openssl (needed for the kube API server's certificates): {e}"));
    assert!(
        output.status.success(),
        "openssl {args} failed ({}):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

fn base64_of(dir: &Path, file: &str) -> String {
    String::from_utf8(openssl(dir, &format!("base64 -A -in {file}"))).expect("base64 is ASCII")
}

/// Writes `client.kubeconfig` (client certificate, for tests; self-contained, so it can be
/// copied or read as text) and `apiserver.kubeconfig` (anonymous, for the server itself) for a
/// server on `port`.
fn write_kubeconfigs(dir: &Path, port: u16) {
    let server = format!("https://127.0.0.1:{port}");
    let ca = base64_of(dir, "ca.crt");
    let client = format!(
        "apiVersion: v1\nkind: Config\n\
         clusters:\n- name: landfall-test\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\n\
         users:\n- name: landfall-test\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\n\
         contexts:\n- name: landfall-test\n  context:\n    cluster: landfall-test\n    user: landfall-test\n    namespace: default\n\
         current-context: landfall-test\n",
        base64_of(dir, "client.crt"),
        base64_of(dir, "client.key"),
    );
    // The server asks itself who may do what (delegated authorization) as the same member of
    // system:masters: an anonymous identity would need asking about its own questions, round and
    // round, once the server reads its core resources.
    let apiserver = client.clone();
    for (name, text) in [("client.kubeconfig", client), ("apiserver.kubeconfig", apiserver)] {
        fs::write(dir.join(name), text).unwrap_or_else(|e| panic!("cannot write {name}: {e}"));
    }
}

/// Converts an `apiextensions.k8s.io/v1beta1` CRD to `apiextensions.k8s.io/v1`, which is all
/// current API servers serve; any other document is returned unchanged.
///
/// The schema (`spec.validation`), `subresources` and `additionalPrinterColumns` move into each
/// version; `spec.version` becomes a version if `spec.versions` is missing. v1beta1 kept unknown
/// fields by default (`preserveUnknownFields: true`), which v1 spells per object: unless the CRD
/// said `false`, every `type: object` schema without `properties` (nor `additionalProperties`)
/// gets `x-kubernetes-preserve-unknown-fields: true` — except the root's `metadata`, which v1
/// does not let a schema touch. A root schema without a type gets `type: object`, as v1 demands.
pub fn crd_to_v1(mut crd: Value) -> Value {
    if crd.get("apiVersion").and_then(Value::as_str) != Some(V1BETA1) {
        return crd;
    }
    crd["apiVersion"] = V1.into();
    let Some(spec) = crd.get_mut("spec").and_then(Value::as_object_mut) else { return crd };
    let preserve_unknown = spec.remove("preserveUnknownFields").and_then(|v| v.as_bool()).unwrap_or(true);
    let version = spec.remove("version");
    let schema = spec.remove("validation").and_then(|v| v.get("openAPIV3Schema").cloned());
    let subresources = spec.remove("subresources");
    let columns = spec.remove("additionalPrinterColumns");
    if !spec.contains_key("versions")
        && let Some(name) = version
    {
        let mut only = Map::new();
        only.insert("name".into(), name);
        only.insert("served".into(), true.into());
        only.insert("storage".into(), true.into());
        spec.insert("versions".into(), Value::Array(vec![only.into()]));
    }
    let Some(versions) = spec.get_mut("versions").and_then(Value::as_array_mut) else { return crd };
    for version in versions.iter_mut().filter_map(Value::as_object_mut) {
        for (key, value) in [("subresources", &subresources), ("additionalPrinterColumns", &columns)] {
            if let Some(value) = value
                && !version.contains_key(key)
            {
                version.insert(key.into(), value.clone());
            }
        }
        if let Some(schema) = &schema
            && !version.contains_key("schema")
        {
            let mut wrapper = Map::new();
            wrapper.insert("openAPIV3Schema".into(), schema.clone());
            version.insert("schema".into(), wrapper.into());
        }
        if let Some(columns) = version.get_mut("additionalPrinterColumns").and_then(Value::as_array_mut) {
            for column in columns.iter_mut().filter_map(Value::as_object_mut) {
                if let Some(path) = column.remove("JSONPath") {
                    column.insert("jsonPath".into(), path);
                }
            }
        }
        if let Some(root) =
            version.get_mut("schema").and_then(|s| s.get_mut("openAPIV3Schema")).and_then(Value::as_object_mut)
        {
            if !root.contains_key("type") {
                root.insert("type".into(), "object".into());
            }
            if preserve_unknown {
                preserve_unknown_fields(root, true);
            }
        }
    }
    crd
}

/// Marks every open object schema under (and including) `schema` as keeping unknown fields.
fn preserve_unknown_fields(schema: &mut Map<String, Value>, is_root: bool) {
    let is_object = schema.get("type").and_then(Value::as_str) == Some("object");
    if is_object && !schema.contains_key("properties") && !schema.contains_key("additionalProperties") {
        schema.insert("x-kubernetes-preserve-unknown-fields".into(), true.into());
    }
    if let Some(properties) = schema.get_mut("properties").and_then(Value::as_object_mut) {
        for (name, property) in properties.iter_mut() {
            if is_root && name == "metadata" {
                continue;
            }
            if let Some(property) = property.as_object_mut() {
                preserve_unknown_fields(property, false);
            }
        }
    }
    for key in ["items", "additionalProperties"] {
        if let Some(nested) = schema.get_mut(key).and_then(Value::as_object_mut) {
            preserve_unknown_fields(nested, false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROVISIONING: &str = include_str!("../../deploy/crds/icn-bpa/bpa_v1alpha1_provisioning_crd.yaml");

    #[test]
    fn crd_to_v1_converts_the_bpa_provisioning_crd() {
        let converted = crd_to_v1(yaml::from_str(PROVISIONING).unwrap());
        let expected: Value = yaml::from_str(
            r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: provisionings.bpa.akraino.org
spec:
  group: bpa.akraino.org
  names:
    kind: Provisioning
    listKind: ProvisioningList
    plural: provisionings
    singular: provisioning
    shortNames:
    - bpa
  scope: Namespaced
  versions:
  - name: v1alpha1
    served: true
    storage: true
    subresources:
      status: {}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          apiVersion:
            description: APIVERSION
            type: string
          kind:
            description: KIND
            type: string
          metadata:
            type: object
          spec:
            type: object
            x-kubernetes-preserve-unknown-fields: true
          status:
            type: object
            x-kubernetes-preserve-unknown-fields: true
"#,
        )
        .unwrap();
        // The long upstream descriptions are carried over untouched; compare the rest.
        let mut converted = converted;
        let properties = &mut converted["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"];
        assert!(properties["apiVersion"]["description"].as_str().unwrap().starts_with("APIVersion defines"));
        properties["apiVersion"]["description"] = "APIVERSION".into();
        properties["kind"]["description"] = "KIND".into();
        assert_eq!(converted, expected, "{}", serde_json::to_string_pretty(&converted).unwrap());
        let _: CustomResourceDefinition = serde_json::from_value(converted).expect("a v1 CRD");
    }

    #[test]
    fn crd_to_v1_handles_version_only_columns_nesting_and_explicit_pruning() {
        let v1beta1 = r#"
apiVersion: apiextensions.k8s.io/v1beta1
kind: CustomResourceDefinition
metadata: {name: things.example.org}
spec:
  group: example.org
  names: {kind: Thing, plural: things}
  scope: Cluster
  version: v1
  additionalPrinterColumns:
  - {name: Age, type: date, JSONPath: .metadata.creationTimestamp}
  validation:
    openAPIV3Schema:
      properties:
        spec:
          properties:
            open: {type: object}
            list: {type: array, items: {type: object}}
            map: {type: object, additionalProperties: {type: string}}
"#;
        let converted = crd_to_v1(yaml::from_str(v1beta1).unwrap());
        let version = &converted["spec"]["versions"][0];
        assert_eq!(version["name"], "v1");
        assert_eq!(version["served"], true);
        assert_eq!(version["storage"], true);
        assert_eq!(version["additionalPrinterColumns"][0]["jsonPath"], ".metadata.creationTimestamp");
        assert!(version["additionalPrinterColumns"][0].get("JSONPath").is_none());
        let root = &version["schema"]["openAPIV3Schema"];
        assert_eq!(root["type"], "object");
        let spec = &root["properties"]["spec"];
        let preserved = |v: &Value| v.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
        assert!(!preserved(spec), "spec has properties");
        assert!(preserved(&spec["properties"]["open"]));
        assert!(preserved(&spec["properties"]["list"]["items"]));
        assert!(!preserved(&spec["properties"]["map"]), "a map is not an open object");
        for gone in ["version", "validation", "additionalPrinterColumns"] {
            assert!(converted["spec"].get(gone).is_none(), "spec.{gone} is still there");
        }
        let _: CustomResourceDefinition = serde_json::from_value(converted).expect("a v1 CRD");

        let pruned = crd_to_v1(yaml::from_str(&format!("{v1beta1}  preserveUnknownFields: false\n")).unwrap());
        let open =
            &pruned["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["open"];
        assert!(open.get("x-kubernetes-preserve-unknown-fields").is_none(), "{open:?}");
        assert!(pruned["spec"].get("preserveUnknownFields").is_none());
    }

    #[test]
    fn crd_to_v1_leaves_v1_alone() {
        let v1: Value = yaml::from_str(SITE_CRDS[0]).unwrap();
        assert_eq!(crd_to_v1(v1.clone()), v1);
    }

    #[test]
    fn certificates_are_v3_with_the_right_names() {
        let dir = tempfile::tempdir().unwrap();
        make_certificates(dir.path());
        let text =
            |file: &str| String::from_utf8(openssl(dir.path(), &format!("x509 -noout -text -in {file}"))).unwrap();
        let (ca, server, client) = (text("ca.crt"), text("server.crt"), text("client.crt"));
        for cert in [&ca, &server, &client] {
            assert!(cert.contains("Version: 3 (0x2)"), "{cert}");
        }
        assert!(ca.contains("CA:TRUE"), "{ca}");
        assert!(server.contains("IP Address:127.0.0.1") && server.contains("DNS:localhost"), "{server}");
        assert!(server.contains("TLS Web Server Authentication"), "{server}");
        assert!(client.contains("O = system:masters, CN = landfall-test"), "{client}");
        assert!(client.contains("TLS Web Client Authentication"), "{client}");
    }
}
