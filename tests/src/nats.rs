//! A real `nats-server` with JetStream, one per test.
//!
//! ```text
//! let server = NatsServer::start();
//! let url = server.url(); // nats://127.0.0.1:PORT, JetStream enabled, empty store
//! ```
//!
//! Each server listens on 127.0.0.1 on a free port and keeps its JetStream store in a fresh
//! temporary directory, so tests can run in parallel and never see each other's state. Dropping
//! the [`NatsServer`] kills the process and removes the directory.
//!
//! The binary is `$LANDFALL_NATS_SERVER` when set, else whatever `scripts/ensure-nats-server`
//! prints (it fetches a nats-server >= 2.12.0 into `~/.cache/landfall` when none is installed).
//! It is resolved once per test binary.

use producers::embedded::tied;
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// How long a server may take to accept connections with JetStream enabled.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How many times a start is retried when the port turns out to be taken.
const ADDR_IN_USE_ATTEMPTS: usize = 5;
/// The script that finds or fetches a nats-server, relative to this crate.
const ENSURE_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/ensure-nats-server");
/// Flags the harness sets itself; passing them to [`NatsServer::start_with`] would break it.
const RESERVED_FLAGS: &[&str] =
    &["-a", "--addr", "--net", "-p", "--port", "-sd", "--store_dir", "-n", "--name", "--server_name", "-l", "--log"];

/// A running `nats-server` (JetStream enabled) owned by a test.
///
/// Killed (SIGKILL, then reaped) on drop; its temporary directory goes with it. If the test is
/// panicking at that point, the tail of the server log is printed to stderr.
pub struct NatsServer {
    binary: PathBuf,
    args: Vec<String>,
    name: String,
    port: u16,
    /// Holds `store/` (the JetStream store dir) and `nats-server.log`.
    dir: TempDir,
    store: PathBuf,
    log_path: PathBuf,
    child: Option<Child>,
}

/// Why one attempt to spawn the server did not produce a ready server.
enum SpawnError {
    /// The port was taken; trying again (on another port, for a fresh start) may work.
    AddrInUse(String),
    Fatal(String),
}

impl NatsServer {
    /// Starts a server with JetStream on a free port and an empty store. Panics if it cannot.
    pub fn start() -> NatsServer {
        NatsServer::start_with(&[])
    }

    /// Like [`NatsServer::start`], with extra `nats-server` arguments appended (for example
    /// `["--user", "u", "--pass", "p"]` or `["-c", "extra.conf"]`). The harness owns the address,
    /// port, store dir, server name and log destination: passing any of those flags panics.
    pub fn start_with(args: &[&str]) -> NatsServer {
        NatsServer::start_binary(nats_server_binary().clone(), args)
    }

    /// A server of the version a Debian suite ships, however old (e.g. bookworm's 2.9.10), for
    /// tests that check what landfall does with servers it does not support.
    pub fn start_debian(suite: &str) -> NatsServer {
        let binary = run_ensure_script(&["--suite", suite]).unwrap_or_else(|msg| panic!("{msg}"));
        NatsServer::start_binary(binary, &[])
    }

    fn start_binary(binary: PathBuf, args: &[&str]) -> NatsServer {
        for arg in args {
            let flag = arg.split('=').next().unwrap_or(arg);
            assert!(
                !RESERVED_FLAGS.contains(&flag),
                "NatsServer::start_with: `{arg}` is set by the harness itself and must not be passed \
                 (reserved: {RESERVED_FLAGS:?})"
            );
        }
        let dir = tempfile::Builder::new()
            .prefix("landfall-nats-")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot create a temporary directory for nats-server: {e}"));
        let store = dir.path().join("store");
        std::fs::create_dir(&store).unwrap_or_else(|e| panic!("cannot create {}: {e}", store.display()));
        let log_path = dir.path().join("nats-server.log");
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let name = format!("landfall-test-{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));

        let mut server = NatsServer {
            binary,
            args: args.iter().map(|a| a.to_string()).collect(),
            name,
            port: 0,
            dir,
            store,
            log_path,
            child: None,
        };
        let mut attempt = 1;
        loop {
            server.port = free_port();
            match server.spawn() {
                Ok(()) => return server,
                Err(SpawnError::AddrInUse(_)) if attempt < ADDR_IN_USE_ATTEMPTS => attempt += 1,
                Err(SpawnError::AddrInUse(msg) | SpawnError::Fatal(msg)) => panic!("{msg}"),
            }
        }
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The client port; stays the same across [`NatsServer::restart`].
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The JetStream store directory (`-sd`); stays the same across [`NatsServer::restart`].
    pub fn store_dir(&self) -> &Path {
        &self.store
    }

    /// Everything the server wrote to stdout/stderr so far, across restarts.
    pub fn log(&self) -> String {
        match std::fs::read(&self.log_path) {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(e) => format!("<cannot read {}: {e}>", self.log_path.display()),
        }
    }

    /// Whether the server process is running (false after [`NatsServer::stop`] or a crash).
    pub fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Kills the server (SIGKILL, like a crash) and waits for it to exit. The port and store dir
    /// are kept; [`NatsServer::restart`] brings the server back. Does nothing if already stopped.
    pub fn stop(&mut self) {
        crate::procs::kill_and_reap(&mut self.child);
    }

    /// Kills the server (if running) and starts it again on the same port with the same store dir,
    /// so JetStream state written before survives. Panics if it does not come back.
    pub fn restart(&mut self) {
        self.stop();
        let mut attempt = 1;
        loop {
            match self.spawn() {
                Ok(()) => return,
                Err(SpawnError::AddrInUse(_)) if attempt < ADDR_IN_USE_ATTEMPTS => {
                    // The port must stay the same; give whoever holds it a moment to let go.
                    thread::sleep(Duration::from_millis(200 * attempt as u64));
                    attempt += 1;
                }
                Err(SpawnError::AddrInUse(msg) | SpawnError::Fatal(msg)) => panic!("restart: {msg}"),
            }
        }
    }

    /// Spawns the process on `self.port` and waits until it is ready. On error nothing is left
    /// running.
    fn spawn(&mut self) -> Result<(), SpawnError> {
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .map_err(|e| SpawnError::Fatal(format!("cannot open {}: {e}", self.log_path.display())))?;
        let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
        if log_start > 0 {
            let _ = writeln!(log, "---- landfall harness: starting again on port {} ----", self.port);
        }
        let stderr = log.try_clone().map_err(|e| SpawnError::Fatal(format!("cannot clone log file handle: {e}")))?;

        let mut cmd = tied::command(&self.binary);
        cmd.args(["-a", "127.0.0.1", "-p", &self.port.to_string(), "-js", "-sd"])
            .arg(&self.store)
            .args(["-n", &self.name])
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(stderr));
        let shown = format!("{cmd:?}");
        let mut child = tied::spawn(cmd).map_err(|e| {
            SpawnError::Fatal(format!(
                "cannot run {} ({e}); set LANDFALL_NATS_SERVER to a nats-server",
                self.binary.display()
            ))
        })?;

        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        let deadline = Instant::now() + READY_TIMEOUT;
        let failure = loop {
            if let Ok(Some(status)) = child.try_wait() {
                break format!("exited with {status} before it was ready");
            }
            // Ready means: something accepts on the port, it is *this* server (by name, so a
            // stranger that grabbed the port first does not count), JetStream is on, and the
            // process is still alive afterwards.
            if let Ok(info) = read_info(addr)
                && info.contains(&format!("\"server_name\":\"{}\"", self.name))
                && info.contains("\"jetstream\":true")
                && matches!(child.try_wait(), Ok(None))
            {
                self.child = Some(child);
                return Ok(());
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                break format!("was not ready within {READY_TIMEOUT:?}");
            }
            thread::sleep(Duration::from_millis(20));
        };

        let log = self.log_since(log_start);
        let msg = format!(
            "nats-server {} on 127.0.0.1:{} {failure}\ncommand: {shown}\n---- log ({}) ----\n{log}\n---- end of log ----",
            self.binary.display(),
            self.port,
            self.log_path.display(),
        );
        if log.contains("address already in use") {
            Err(SpawnError::AddrInUse(msg))
        } else {
            Err(SpawnError::Fatal(msg))
        }
    }

    fn log_since(&self, offset: u64) -> String {
        let log = self.log();
        log.get(offset as usize..).unwrap_or(&log).to_string()
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.stop();
        if thread::panicking() {
            let log = self.log();
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(60)..];
            eprintln!(
                "---- nats-server {} (port {}, dir {}) log tail ----\n{}\n---- end of nats-server log ----",
                self.name,
                self.port,
                self.dir.path().display(),
                tail.join("\n")
            );
        }
        // `self.dir` (TempDir) is removed when the fields drop.
    }
}

/// Connects and reads the `INFO {...}` line a NATS server sends first.
fn read_info(addr: SocketAddr) -> std::io::Result<String> {
    let stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    stream.set_read_timeout(Some(Duration::from_millis(500)))?;
    let mut line = String::new();
    BufReader::new(stream.take(64 * 1024)).read_line(&mut line)?;
    if line.starts_with("INFO ") { Ok(line) } else { Err(ErrorKind::InvalidData.into()) }
}

/// A port that was free a moment ago (the listener is dropped before returning), never the same
/// twice in one test binary, and below the kernel's range for outgoing connections: a server
/// started again later on its port (a hub restarted whole) would otherwise find it taken by some
/// client's connection, as a port the kernel handed out for `127.0.0.1:0` is also one it hands
/// to outgoing connections.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    const LOWEST: u32 = 10_000;
    let outgoing_from = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next().and_then(|p| p.parse::<u32>().ok()))
        .unwrap_or(32_768);
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    if outgoing_from > LOWEST + 1_000 {
        let span = outgoing_from - LOWEST;
        let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        let mut x = (seed as u32) ^ std::process::id().rotate_left(16);
        for _ in 0..1_000 {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            let port = (LOWEST + x % span) as u16;
            if !given.contains(&port) && TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
                given.insert(port);
                return port;
            }
        }
    }
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap_or_else(|e| panic!("cannot bind 127.0.0.1:0 to find a free port: {e}"));
    let port = listener.local_addr().expect("local_addr of a bound listener").port();
    given.insert(port);
    port
}

/// The nats-server binary, resolved once per test binary.
/// The supported nats-server binary the harness runs (resolved once per test binary).
pub fn binary() -> &'static Path {
    nats_server_binary()
}

fn nats_server_binary() -> &'static PathBuf {
    static BINARY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match BINARY.get_or_init(resolve_binary) {
        Ok(path) => path,
        Err(msg) => panic!("{msg}"),
    }
}

fn resolve_binary() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("LANDFALL_NATS_SERVER").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!("LANDFALL_NATS_SERVER={} is not a file", path.display()))
        };
    }
    run_ensure_script(&[])
}

/// Runs `scripts/ensure-nats-server` with `args` and returns the binary it prints.
fn run_ensure_script(args: &[&str]) -> Result<PathBuf, String> {
    let output = Command::new("bash")
        .arg(ENSURE_SCRIPT)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {ENSURE_SCRIPT}: {e}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let path = stdout.lines().rev().map(str::trim).find(|l| !l.is_empty()).unwrap_or("");
    if !output.status.success() || path.is_empty() {
        return Err(format!(
            "{ENSURE_SCRIPT} failed ({}); install nats-server >= 2.12.0 and set LANDFALL_NATS_SERVER\n{}{}",
            output.status,
            stdout,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let path = PathBuf::from(path);
    if !path.is_file() {
        return Err(format!("{ENSURE_SCRIPT} printed {}, which is not a file", path.display()));
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// True when a server with this name answers on the port (anything else there does not count).
    fn answers(port: u16, name: &str) -> bool {
        read_info(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
            .is_ok_and(|info| info.contains(&format!("\"server_name\":\"{name}\"")))
    }

    /// A JetStream API request over the raw NATS protocol; returns the reply payload.
    fn js_request(port: u16, subject: &str, payload: &str) -> String {
        let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        assert!(line.starts_with("INFO "), "{line}");
        write!(
            stream,
            "CONNECT {{\"verbose\":false,\"pedantic\":false,\"headers\":false,\"no_responders\":false}}\r\n\
             SUB _INBOX.harness 1\r\nPUB {subject} _INBOX.harness {}\r\n{payload}\r\n",
            payload.len()
        )
        .unwrap();
        loop {
            line.clear();
            assert!(reader.read_line(&mut line).unwrap() > 0, "connection closed");
            if line.starts_with("PING") {
                stream.write_all(b"PONG\r\n").unwrap();
            } else if let Some(header) = line.strip_prefix("MSG ") {
                let len: usize = header.split_whitespace().last().unwrap().parse().unwrap();
                let mut body = vec![0; len + 2];
                reader.read_exact(&mut body).unwrap();
                body.truncate(len);
                return String::from_utf8(body).unwrap();
            } else {
                assert!(!line.starts_with("-ERR"), "{line}");
            }
        }
    }

    #[test]
    fn parallel_servers_get_their_own_ports() {
        let (a, b) = thread::scope(|s| {
            let a = s.spawn(NatsServer::start);
            let b = s.spawn(NatsServer::start);
            (a.join().unwrap(), b.join().unwrap())
        });
        assert_ne!(a.port(), b.port());
        assert_ne!(a.store_dir(), b.store_dir());
        for server in [&a, &b] {
            assert_eq!(server.url(), format!("nats://127.0.0.1:{}", server.port()));
            let info = read_info(SocketAddr::from((Ipv4Addr::LOCALHOST, server.port()))).unwrap();
            assert!(info.contains("\"jetstream\":true"), "{info}");
            assert!(answers(server.port(), &server.name));
            assert!(server.log().contains("Server is ready"), "{}", server.log());
        }
    }

    #[test]
    fn drop_kills_the_server_and_removes_its_dir() {
        let server = NatsServer::start();
        let (port, name, dir) = (server.port(), server.name.clone(), server.dir.path().to_path_buf());
        assert!(answers(port, &name));
        drop(server);
        assert!(!answers(port, &name), "server still answers on {port} after drop");
        assert!(!dir.exists(), "{} still exists after drop", dir.display());
    }

    #[test]
    fn restart_keeps_port_store_and_streams() {
        let mut server = NatsServer::start();
        let (port, store) = (server.port(), server.store_dir().to_path_buf());
        let created = js_request(
            port,
            "$JS.API.STREAM.CREATE.KEEP",
            r#"{"name":"KEEP","subjects":["keep.>"],"storage":"file","num_replicas":1}"#,
        );
        assert!(created.contains("\"type\":\"io.nats.jetstream.api.v1.stream_create_response\""), "{created}");
        assert!(!created.contains("\"error\""), "{created}");

        server.stop();
        assert!(!server.is_running());
        assert!(!answers(port, &server.name));
        server.restart();
        assert!(server.is_running());
        assert_eq!(server.port(), port);
        assert_eq!(server.store_dir(), store);
        assert!(store.join("jetstream").is_dir());

        let info = js_request(port, "$JS.API.STREAM.INFO.KEEP", "");
        assert!(info.contains("\"name\":\"KEEP\""), "{info}");
        assert!(!info.contains("\"error\""), "{info}");

        server.restart(); // restarting a running server works too
        assert!(answers(port, &server.name));
        assert!(server.log().contains("starting again on port"), "{}", server.log());
    }

    #[test]
    fn start_failure_panics_with_the_log() {
        let err = std::panic::catch_unwind(|| NatsServer::start_with(&["--no-such-flag"])).err().unwrap();
        let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("exited with"), "{msg}");
        assert!(msg.contains("no-such-flag"), "{msg}");
    }

    #[test]
    #[should_panic(expected = "set by the harness")]
    fn reserved_flags_are_rejected() {
        NatsServer::start_with(&["-p", "4222"]);
    }
}
