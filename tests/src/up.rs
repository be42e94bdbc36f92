//! `landfall up` as a child process, as a newcomer runs it: the whole system on its embedded
//! default, its HTTP API on a free port, the local tokens it made.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use producers::embedded::tied;

use crate::nats::free_port;

/// How long `landfall up` may take to serve a caught-up API.
const START_TIMEOUT: Duration = Duration::from_secs(90);

/// A running `landfall up`; killed and reaped on drop, panicking or not.
pub struct Up {
    child: Child,
    pub dir: tempfile::TempDir,
    /// The HTTP API's address (the dashboard, `/metrics`).
    pub api: SocketAddr,
    pub nats_port: u16,
    /// The local tokens `up` made: an operator's and a viewer's.
    pub operator: String,
    pub viewer: String,
    /// What `up` was started with, after its data directory and ports.
    args: Vec<String>,
}

impl Up {
    pub fn start(sites: usize) -> Up {
        Up::start_with(sites, &[])
    }

    /// `landfall up` with these arguments as well (`--install none` unless they say).
    pub fn start_with(sites: usize, extra: &[&str]) -> Up {
        Up::start_on(SocketAddr::from((Ipv4Addr::LOCALHOST, free_port())), sites, extra)
    }

    /// As [`Up::start_with`], the API and dashboard on `api`: an address chosen before `up` starts,
    /// for what must know the dashboard's origin first (an identity provider's redirect URIs).
    pub fn start_on(api: SocketAddr, sites: usize, extra: &[&str]) -> Up {
        let dir = tempfile::tempdir().expect("a temp dir for landfall up");
        let mut args = vec!["--sites".to_string(), sites.to_string()];
        if !extra.iter().any(|a| a.starts_with("--install")) {
            args.extend(["--install".to_string(), "none".to_string()]);
        }
        args.extend(extra.iter().map(|a| a.to_string()));
        let nats_port = free_port();
        let child = spawn(dir.path(), api, nats_port, &args);
        let mut up = Up { child, dir, api, nats_port, operator: String::new(), viewer: String::new(), args };
        up.wait_ready();
        up
    }

    /// Stops `up` as a person would (`INT`: Ctrl-C) or as a crash does (`KILL`), and waits
    /// until it has exited; its data directory stays, to [`Up::start_again`].
    pub fn stop(&mut self, signal: &str) {
        let status = std::process::Command::new("kill")
            .args([format!("-{signal}"), self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} landfall up");
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.child.try_wait().expect("poll landfall up").is_none() {
            assert!(Instant::now() < deadline, "landfall up did not stop within 60 s of {signal}\n{}", self.output());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `landfall up` once more, with the same arguments and data directory as before, as a
    /// person does the next day (on ports free now).
    pub fn start_again(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.api = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
        self.nats_port = free_port();
        self.child = spawn(self.dir.path(), self.api, self.nats_port, &self.args);
        self.wait_ready();
    }

    /// The NATS URL of `up`'s embedded server.
    pub fn nats_url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.nats_port)
    }

    /// Where `up` keeps simulated site `site`'s hosts.
    pub fn site_state(&self, site: &str) -> std::path::PathBuf {
        self.dir.path().join("data").join("gateways").join(site).join("site.json")
    }

    pub fn output(&self) -> String {
        let read = |name: &str| std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
        // Its services' log (in its data directory), after what it wrote to its standard error.
        let log = read("up.log") + &read("data/landfall.log");
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        format!(
            "stdout:\n{}\nlog (last lines):\n{}",
            read("up.out"),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        )
    }

    /// Waits for the banner and a caught-up read model, then takes the tokens `up` made.
    fn wait_ready(&mut self) {
        let data = self.dir.path().join("data");
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().expect("poll landfall up") {
                panic!("landfall up exited ({status}) before it was ready\n{}", self.output());
            }
            let banner = std::fs::read_to_string(self.dir.path().join("up.out")).unwrap_or_default();
            if banner.contains("landfall is up") && http(self.api, "GET", "/readyz", None, None).0 == 200 {
                break;
            }
            assert!(Instant::now() < deadline, "landfall up was not ready within {START_TIMEOUT:?}\n{}", self.output());
            std::thread::sleep(Duration::from_millis(200));
        }
        let text = std::fs::read_to_string(data.join("api-tokens.yaml")).expect("landfall up wrote api-tokens.yaml");
        let file: serde_json::Value = bus_schema::yaml::from_str(&text).expect("api-tokens.yaml is YAML");
        let token = |role: &str| {
            file["tokens"]
                .as_array()
                .and_then(|ts| ts.iter().find(|t| t["role"].as_str() == Some(role)))
                .and_then(|t| t["token"].as_str())
                .unwrap_or_else(|| panic!("no {role} token in api-tokens.yaml"))
                .to_string()
        };
        self.operator = token("operator");
        self.viewer = token("viewer");
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.api)
    }

    /// One site as the API shows it (or the API's answer, when it has no such site yet).
    pub fn site(&self, site: &str) -> serde_json::Value {
        let (status, body) = http(self.api, "GET", &format!("/v1/sites/{site}"), Some(&self.operator), None);
        assert!(status == 200 || status == 404, "{status}: {body}");
        serde_json::from_str(&body).expect("JSON")
    }

    /// Waits until the API shows `site` as `what` says.
    pub fn until_site(&self, site: &str, what: &str, within: Duration, ok: impl Fn(&serde_json::Value) -> bool) {
        let deadline = Instant::now() + within;
        loop {
            let s = self.site(site);
            if ok(&s) {
                return;
            }
            assert!(Instant::now() < deadline, "{site} was not {what} within {within:?}: {s}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Publishes a command through the API, as any client would.
    pub fn command(&self, kind: &str, body: serde_json::Value) {
        let path = format!("/v1/commands/{kind}");
        let (status, answer) = http(self.api, "POST", &path, Some(&self.operator), Some(&body.to_string()));
        assert_eq!(status, 202, "{kind}: {answer}");
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("landfall up, as it stood:\n{}", self.output());
        }
    }
}

/// Starts `landfall up` in `dir` (its data directory `dir/data`); its standard output goes to
/// `dir/up.out` (anew each start, for the banner), its log to the end of `dir/up.log`.
fn spawn(dir: &Path, api: SocketAddr, nats_port: u16, args: &[String]) -> Child {
    let data = dir.join("data");
    let stdout = std::fs::File::create(dir.join("up.out")).expect("create up.out");
    let stderr = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("up.log")).expect("open up.log");
    let mut cmd = tied::command(crate::cli::binary());
    cmd.arg("up")
        .args(["--data-dir", &data.display().to_string()])
        .args(["--nats-port", &nats_port.to_string()])
        .args(["--api-listen", &api.to_string()])
        .args(args)
        .env("LANDFALL_NATS_SERVER", crate::nats::binary())
        .env_remove("RUST_LOG")
        .env_remove("NATS_URL")
        .env_remove("LANDFALL_API_TOKENS_FILE")
        .env_remove("LANDFALL_API_LISTEN")
        .env_remove("LANDFALL_DATA_DIR")
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr);
    tied::spawn(cmd).expect("start landfall up")
}

/// One HTTP/1.1 request (the test crate has no HTTP client): status and body.
pub fn http(addr: SocketAddr, method: &str, path: &str, token: Option<&str>, body: Option<&str>) -> (u16, String) {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else { return (0, String::new()) };
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("set a read timeout");
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let body = body.unwrap_or("");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    if stream.write_all(request.as_bytes()).is_err() {
        return (0, String::new());
    }
    let mut response = String::new();
    if stream.read_to_string(&mut response).is_err() {
        return (0, String::new());
    }
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let chunked = head.lines().any(|l| l.to_ascii_lowercase().starts_with("transfer-encoding: chunked"));
    (status, if chunked { unchunked(body) } else { body.to_string() })
}

/// A chunked body's content.
fn unchunked(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16).unwrap_or(0);
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].strip_prefix("\r\n").unwrap_or(&rest[size..]);
    }
    out
}
