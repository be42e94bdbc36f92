//! A real S3-compatible server per test: `s3s-fs` over a temporary directory.
//!
//! ```text
//! let s3 = S3Server::start("artifacts");
//! let store = ArtifactStore::open(&s3.location(), &s3.options())?;
//! ```
//!
//! The binary is `$LANDFALL_S3S_FS` when set, else whatever `scripts/ensure-s3s-fs` prints (it
//! builds s3s-fs once into `~/.cache/landfall`).

use producers::embedded::tied;
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use consumers::artifacts::S3Options;
use tempfile::TempDir;

const ENSURE_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/ensure-s3s-fs");
const ACCESS_KEY: &str = "landfall-test";
const SECRET_KEY: &str = "landfall-test-secret";

fn binary() -> &'static PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        if let Some(path) = std::env::var_os("LANDFALL_S3S_FS") {
            return PathBuf::from(path);
        }
        let out = Command::new(ENSURE_SCRIPT).stderr(Stdio::inherit()).output().expect("run scripts/ensure-s3s-fs");
        assert!(out.status.success(), "scripts/ensure-s3s-fs failed: no S3-compatible server for the tests");
        PathBuf::from(String::from_utf8(out.stdout).expect("a path").trim())
    })
}

/// A running s3s-fs with one bucket; killed on drop, its directory removed.
pub struct S3Server {
    port: u16,
    bucket: String,
    /// The server's root: each bucket is a directory in it.
    pub dir: TempDir,
    child: Child,
}

impl S3Server {
    pub fn start(bucket: &str) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        std::fs::create_dir_all(dir.path().join(bucket)).expect("create the bucket");
        let port =
            TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).and_then(|l| l.local_addr()).expect("a free port").port();
        let mut cmd = tied::command(binary());
        cmd.args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = tied::spawn(cmd).expect("start s3s-fs");
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_err() {
            assert!(Instant::now() < deadline, "s3s-fs did not listen on {port} within 10 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        Self { port, bucket: bucket.to_string(), dir, child }
    }

    /// The store location: `s3://<bucket>/<prefix>`.
    pub fn location(&self, prefix: &str) -> String {
        format!("s3://{}/{prefix}", self.bucket)
    }

    pub fn options(&self) -> S3Options {
        S3Options {
            endpoint: Some(format!("http://127.0.0.1:{}", self.port)),
            region: None,
            allow_http: true,
            credentials: Some((ACCESS_KEY.to_string(), SECRET_KEY.to_string())),
        }
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
