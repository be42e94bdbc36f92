//! Test support for secrets: the fleet's key file, requests to the secrets service, every byte
//! the bus holds, and a scan of directories for bytes that must never reach a disk.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bus_schema::names;
use bus_schema::pb;
use bus_schema::runtime::Bus;
use bytes::Bytes;
use consumers::secrets::KeyRing;
use futures::TryStreamExt;
use prost::Message;
use tokio::io::AsyncWriteExt;

use crate::fleet::{Fleet, TEST_KEY_HEX};

/// The key file's name in a fleet's temporary directory.
pub const KEY_FILE: &str = "secret.key";

/// Writes a key file holding `hex` (mode 0600) at `path`.
pub fn write_key_file(path: &Path, hex: &str) {
    std::fs::write(path, format!("{hex}\n")).expect("write the key file");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod the key file");
    }
}

/// The key ring a fleet's kubeconfig collector and secrets service share: a key file in `dir`
/// holding [`TEST_KEY_HEX`].
pub fn test_key_ring(dir: &Path) -> Arc<KeyRing> {
    let path = dir.join(KEY_FILE);
    write_key_file(&path, TEST_KEY_HEX);
    Arc::new(KeyRing::from_file(&path).expect("read the test key file"))
}

/// The fleet's key file.
pub fn key_file(fleet: &Fleet) -> PathBuf {
    fleet.dir.path().join(KEY_FILE)
}

/// Sends `msg` on `subject` and returns the reply body, or the reply's error header.
pub async fn request<M: Message>(bus: &Bus, subject: &str, msg: &M) -> Result<Bytes, String> {
    let reply = tokio::time::timeout(
        Duration::from_secs(60),
        bus.client().request(subject.to_string(), msg.encode_to_vec().into()),
    )
    .await
    .map_err(|_| format!("no answer on {subject}"))?
    .map_err(|e| format!("request {subject}: {e}"))?;
    match reply.headers.as_ref().and_then(|h| h.get(names::headers::REPLY_ERROR)) {
        Some(err) => Err(err.as_str().to_string()),
        None => Ok(reply.payload),
    }
}

fn decode<M: Message + Default>(body: Bytes) -> M {
    M::decode(body).expect("the reply decodes")
}

/// Stores a host's BMC credentials through the secrets service.
pub async fn put_bmc(
    bus: &Bus,
    site: &str,
    node: &str,
    username: &str,
    password: &str,
) -> Result<pb::SecretStored, String> {
    let req = pb::PutBmcCredentials {
        site_id: site.into(),
        node: node.into(),
        credentials: Some(pb::BmcCredentials { username: username.into(), password: password.into() }),
    };
    request(bus, names::BMC_CREDENTIALS_PUT_ADMIN, &req).await.map(decode)
}

/// A site's kubeconfig, opened by the secrets service.
pub async fn get_kubeconfig(bus: &Bus, site: &str) -> Result<Vec<u8>, String> {
    request(bus, names::KUBECONFIG_GET_ADMIN, &pb::KubeconfigGet { site_id: site.into() }).await.map(|b| b.to_vec())
}

/// Rotates the data key through the secrets service.
pub async fn rotate_key(bus: &Bus) -> Result<pb::KeyRotated, String> {
    request(bus, names::ROTATE_KEY_ADMIN, &pb::RotateKey {}).await.map(decode)
}

/// A gateway's request for a host's BMC credentials, on the subject of `subject_site`.
pub async fn ask_bmc(bus: &Bus, subject_site: &str, site: &str, node: &str) -> Result<pb::BmcCredentials, String> {
    ask_bmc_for(bus, subject_site, site, node, &bmc_job(node)).await
}

/// The envelope of the provision job of `node` that [`grant_bmc`] records.
pub fn bmc_job(node: &str) -> bus_schema::envelope::Envelope {
    bus_schema::envelope::Envelope {
        id: format!("provision-{node}"),
        correlation: "saga-granting".into(),
        causation: "saga-granting".into(),
        traceparent: String::new(),
        actor: String::new(),
    }
}

/// Asks for `node`'s BMC credentials for the job `job`.
pub async fn ask_bmc_for(
    bus: &Bus,
    subject_site: &str,
    site: &str,
    node: &str,
    job: &bus_schema::envelope::Envelope,
) -> Result<pb::BmcCredentials, String> {
    let req = pb::BmcCredentialsRequest {
        site_id: site.into(),
        node: node.into(),
        job_id: job.id.clone(),
        correlation_id: job.correlation.clone(),
    };
    request(bus, &names::bmc_credentials_svc(subject_site), &req).await.map(decode)
}

/// Every sealed record (kubeconfigs, BMC credentials): key, record, revision.
pub async fn sealed_records(bus: &Bus) -> Vec<(String, pb::SealedSecret, u64)> {
    let kv = bus.kv(names::KUBECONFIGS_BUCKET).await.unwrap();
    let mut all = kv.scan::<pb::SealedSecret>(names::keys::KUBECONFIG_PREFIX).await.unwrap();
    all.extend(kv.scan::<pb::SealedSecret>(names::keys::BMC_PREFIX).await.unwrap());
    all
}

/// Every message every stream on the server holds (KV buckets with their history, commands,
/// jobs, events): (stream, sequence, headers and payload as bytes).
pub async fn every_stored_message(bus: &Bus) -> Vec<(String, u64, Vec<u8>)> {
    let js = bus.jetstream();
    let names: Vec<String> = js.stream_names().try_collect().await.expect("list streams");
    let mut out = Vec::new();
    for name in names {
        let stream = js.get_stream(&name).await.expect("get stream");
        let info = stream.get_info().await.expect("stream info");
        for seq in info.state.first_sequence..=info.state.last_sequence {
            let Ok(m) = stream.get_raw_message(seq).await else { continue };
            let mut bytes = format!("{} {:?}", m.subject, m.headers).into_bytes();
            bytes.extend_from_slice(&m.payload);
            out.push((name.clone(), seq, bytes));
        }
    }
    out
}

/// Whether `needle` occurs in `haystack`.
pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

/// Walks every file under `dirs` (recursively, without following links) and panics, naming the
/// file and the needle's label (never the needle), if any needle's bytes appear in one.
pub fn assert_nowhere_on_disk(dirs: &[&Path], needles: &[(&str, &[u8])]) {
    for (label, needle) in needles {
        assert!(!needle.is_empty(), "needle {label} is empty");
    }
    let mut files = 0;
    let mut pending: Vec<PathBuf> = dirs.iter().map(|d| d.to_path_buf()).collect();
    while let Some(path) = pending.pop() {
        let meta = std::fs::symlink_metadata(&path).unwrap_or_else(|e| panic!("stat {}: {e}", path.display()));
        if meta.is_dir() {
            for entry in std::fs::read_dir(&path).unwrap_or_else(|e| panic!("read dir {}: {e}", path.display())) {
                pending.push(entry.expect("a directory entry").path());
            }
        } else if meta.is_file() {
            // A file removed while we walk (a server compacting) is no longer on disk.
            let Ok(bytes) = std::fs::read(&path) else { continue };
            files += 1;
            for (label, needle) in needles {
                assert!(!contains(&bytes, needle), "{label} found on disk in {}", path.display());
            }
        }
    }
    assert!(files > 0, "no file found under {dirs:?}");
}

/// Sends this test binary's logs (at debug level, every crate) to a file, once per process,
/// and returns the directory that holds it; call first in every test of a binary that scans
/// logs, so the fleet's own log setup finds the subscriber in place.
pub fn capture_logs() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::Builder::new().prefix("landfall-test-logs-").tempdir().expect("a log directory");
        let file = std::fs::File::create(dir.path().join("tests.log")).expect("create the log file");
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("debug"))
            .with_ansi(false)
            .with_writer(Mutex::new(file))
            .try_init();
        dir
    })
    .path()
}

/// Runs `landfall ARGS` with `NATS_URL=url`, `stdin` on its standard input, and debug logs;
/// its stderr is also written to a log file in `log_dir`.
pub async fn landfall_with_stdin(url: &str, args: &[&str], stdin: &[u8], log_dir: &Path) -> Output {
    let mut child = tokio::process::Command::new(crate::cli::binary())
        .args(args)
        .env("NATS_URL", url)
        .env("RUST_LOG", "debug")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run landfall");
    let mut input = child.stdin.take().expect("stdin");
    input.write_all(stdin).await.expect("write stdin");
    drop(input);
    let out = child.wait_with_output().await.expect("wait for landfall");
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::fs::write(log_dir.join(format!("landfall-cli-{}-{n}.log", std::process::id())), &out.stderr)
        .expect("write the CLI's log");
    out
}

/// Writes a running install saga of `site` that sent a provision job ([`bmc_job`]) for each of
/// `nodes`, all of them being provisioned: what the secrets service grants BMC credentials for.
pub async fn grant_bmc(bus: &Bus, site: &str, nodes: &[String]) {
    let sagas = bus.kv(names::SAGAS_BUCKET).await.unwrap();
    let saga = pb::InstallSaga {
        saga_id: "saga-granting".into(),
        site_id: site.into(),
        phase: pb::InstallPhase::ProvisioningOs as i32,
        nodes: nodes
            .iter()
            .map(|n| pb::NodeProgress {
                node: Some(pb::NodeSpec { name: n.clone(), ..Default::default() }),
                step: pb::NodeStep::OsProvisioning as i32,
                ..Default::default()
            })
            .collect(),
        jobs: nodes
            .iter()
            .map(|n| pb::SentJob {
                id: bmc_job(n).id,
                kind: <pb::ProvisionOs as pb::BusJob>::KIND.into(),
                nodes: vec![n.clone()],
            })
            .collect(),
        ..Default::default()
    };
    sagas.put(&names::keys::saga("saga-granting"), &saga).await.unwrap();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_disk_scan_finds_a_needle_in_a_nested_file_and_names_no_secret() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::write(dir.path().join("a/b/blk.dat"), b"xx hunter2-secret yy").unwrap();
        std::fs::write(dir.path().join("other"), b"nothing").unwrap();
        assert_nowhere_on_disk(&[dir.path()], &[("other", b"absent-bytes")]);
        let err = std::panic::catch_unwind(|| {
            assert_nowhere_on_disk(&[dir.path()], &[("the password", b"hunter2-secret")]);
        })
        .unwrap_err();
        let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("the password found on disk in") && msg.contains("blk.dat"), "{msg}");
        assert!(!msg.contains("hunter2"), "{msg}");
    }
}
