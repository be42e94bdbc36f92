//! Finds a nats-server that landfall supports, or fetches one from Debian's packages into the
//! cache, with nothing of the checkout needed: the `landfall` binary works from anywhere.
//!
//! Looked for, in order: `$LANDFALL_NATS_SERVER` (when set it must do; it is never replaced),
//! the cache's `nats-server/current/nats-server`, and `nats-server` on `PATH`. When none is new
//! enough, the package is fetched from Debian `$LANDFALL_NATS_SUITE` (default sid, which carries the current release) on the
//! mirror this machine's apt already uses (`$LANDFALL_DEBIAN_MIRROR` overrides it): apt reads
//! the suite's package lists into a private directory of the cache (the system's apt state is
//! left alone), names the package's URL, size and SHA-256, the download is shown with its size
//! and progress and checked against the digest, and `dpkg-deb` unpacks the binary. The layout
//! is the one `scripts/ensure-nats-server` uses, so both find what the other fetched.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use sha2::{Digest, Sha256};
use tokio::process::Command;

/// The oldest nats-server landfall runs on (`bus_schema::runtime::version::MIN_SERVER_VERSION`
/// says why).
pub const MIN_VERSION: Version = {
    let (major, minor, patch) = bus_schema::runtime::MIN_SERVER_VERSION;
    Version(major as u32, minor as u32, patch as u32)
};
/// The Debian suite fetched from when no suite is named: sid carries the current release
/// (trixie's 2.10 is older than `MIN_VERSION`).
const DEFAULT_SUITE: &str = "sid";

/// A nats-server version, as `nats-server --version` prints it (`nats-server: v2.10.27`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(pub u32, pub u32, pub u32);

impl Version {
    /// The first `vX.Y.Z` in `text`.
    pub fn parse(text: &str) -> Option<Version> {
        let at = text.find(|c: char| c.is_ascii_digit())?;
        let mut parts = text[at..]
            .split(|c: char| !c.is_ascii_digit() && c != '.')
            .next()?
            .split('.')
            .map(|p| p.parse::<u32>().ok());
        Some(Version(parts.next()??, parts.next()??, parts.next().flatten().unwrap_or(0)))
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

/// The cache root: `$LANDFALL_CACHE`, else `$XDG_CACHE_HOME/landfall`, else `~/.cache/landfall`.
pub fn cache_root() -> anyhow::Result<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = var("LANDFALL_CACHE") {
        return Ok(dir);
    }
    if let Some(dir) = var("XDG_CACHE_HOME") {
        return Ok(dir.join("landfall"));
    }
    match var("HOME") {
        Some(home) => Ok(home.join(".cache").join("landfall")),
        None => bail!("no cache directory: set LANDFALL_CACHE (or HOME)"),
    }
}

/// `name` on `PATH`, if it is an executable file there.
pub fn on_path(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

/// The version `binary --version` reports, or why there is none.
async fn version_of(binary: &Path) -> Result<Version, String> {
    let out = Command::new(binary)
        .arg("--version")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .await
        .map_err(|e| format!("cannot run it ({e})"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    Version::parse(&text).ok_or_else(|| format!("its --version printed no version ({:?})", text.trim()))
}

/// Whether `binary` is a nats-server landfall supports; the error says why not.
async fn supported(binary: &Path) -> Result<Version, String> {
    match version_of(binary).await? {
        v if v >= MIN_VERSION => Ok(v),
        v => Err(format!("v{v} is older than {MIN_VERSION}")),
    }
}

/// Finds a supported nats-server, or fetches one (see the module's documentation), saying on
/// stderr what it fetches, how big, and how far it has got.
///
/// # Errors
/// When none is found and the fetch fails: the message names everything tried, and why each
/// did not do.
pub async fn find_or_fetch() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("LANDFALL_NATS_SERVER").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        return match supported(&path).await {
            Ok(_) => Ok(path),
            Err(why) => bail!("LANDFALL_NATS_SERVER={} is not a nats-server >= {MIN_VERSION}: {why}", path.display()),
        };
    }
    let cache = cache_root()?;
    let mut tried = vec!["LANDFALL_NATS_SERVER: not set".to_string()];
    let cached = cache.join("nats-server").join("current").join("nats-server");
    let candidates = [(cached.clone(), "in the cache"), (on_path("nats-server").unwrap_or_default(), "on PATH")];
    for (path, place) in candidates {
        if path.as_os_str().is_empty() {
            tried.push(format!("nats-server {place}: none"));
            continue;
        }
        if !path.exists() {
            tried.push(format!("{} ({place}): none", path.display()));
            continue;
        }
        match supported(&path).await {
            Ok(_) => return Ok(path),
            Err(why) => tried.push(format!("{} ({place}): {why}", path.display())),
        }
    }
    let suite = std::env::var("LANDFALL_NATS_SUITE").ok().filter(|s| !s.is_empty());
    let suite = suite.as_deref().unwrap_or(DEFAULT_SUITE);
    eprintln!("landfall: no nats-server >= {MIN_VERSION} on this machine; fetching one from Debian {suite}");
    match fetch(&cache, suite).await {
        Ok(path) => Ok(path),
        Err(e) => {
            tried.push(format!("fetching nats-server from Debian {suite}: {e:#}"));
            bail!(
                "no nats-server >= {MIN_VERSION} found or fetched. Tried:\n  - {}\n\
                 Install nats-server >= {MIN_VERSION} and set LANDFALL_NATS_SERVER to it, or point NATS_URL at a \
                 running server (--nats-url)",
                tried.join("\n  - ")
            )
        }
    }
}

/// Fetches Debian `suite`'s nats-server into `cache` and returns the binary.
async fn fetch(cache: &Path, suite: &str) -> anyhow::Result<PathBuf> {
    let apt = PrivateApt::new(cache, suite)?;
    let dpkg_deb = on_path("dpkg-deb").context("no dpkg-deb on this machine (it unpacks the package)")?;
    apt.update().await?;
    let package = apt.locate("nats-server").await?;
    let deb = apt.dir.join("pkg").join(&package.file);
    download(&package, &deb).await?;

    let dest = cache.join("nats-server").join(&package.version);
    let staging = cache.join("nats-server").join(format!(".{}.{}", package.version, std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).with_context(|| format!("create {}", staging.display()))?;
    let unpacked = Command::new(&dpkg_deb)
        .arg("-x")
        .arg(&deb)
        .arg(staging.join("root"))
        .stdin(Stdio::null())
        .output()
        .await
        .context("run dpkg-deb")?;
    if !unpacked.status.success() {
        bail!("dpkg-deb -x {} failed: {}", deb.display(), String::from_utf8_lossy(&unpacked.stderr).trim());
    }
    let binary = find_file(&staging.join("root"), "nats-server")
        .with_context(|| format!("{} holds no nats-server binary", package.file))?;
    std::fs::rename(&binary, staging.join("nats-server"))?;
    std::fs::remove_dir_all(staging.join("root"))?;
    let _ = std::fs::remove_dir_all(&dest);
    std::fs::rename(&staging, &dest).with_context(|| format!("move the server into {}", dest.display()))?;
    let path = dest.join("nats-server");
    let version = supported(&path).await.map_err(|why| {
        anyhow::anyhow!(
            "fetched nats-server {} from Debian {suite}, but {why} (LANDFALL_NATS_SUITE names another suite)",
            package.version
        )
    })?;
    // `current` names the version to use, switched in one rename.
    let link = cache.join("nats-server").join(".current.tmp");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&package.version, &link)?;
    std::fs::rename(&link, cache.join("nats-server").join("current"))?;
    eprintln!("landfall: nats-server v{version} is at {}", path.display());
    Ok(path)
}

/// The first file called `name` below `dir`.
fn find_file(dir: &Path, name: &str) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        let kind = entry.file_type().ok()?;
        if kind.is_dir() {
            if let Some(found) = find_file(&path, name) {
                return Some(found);
            }
        } else if kind.is_file() && entry.file_name() == name {
            return Some(path);
        }
    }
    None
}

/// apt with a configuration of its own for one Debian suite, in the cache: the system's
/// sources, lists and caches are not touched, and no root is needed.
struct PrivateApt {
    apt_get: PathBuf,
    dir: PathBuf,
    suite: String,
    mirror: String,
}

/// A package as apt names it for download.
#[derive(Debug, PartialEq, Eq)]
struct Located {
    url: String,
    file: String,
    version: String,
    size: u64,
    sha256: String,
}

impl PrivateApt {
    fn new(cache: &Path, suite: &str) -> anyhow::Result<Self> {
        let apt_get = on_path("apt-get")
            .context("no apt-get on this machine: landfall fetches nats-server from Debian's packages")?;
        let mirror = match std::env::var("LANDFALL_DEBIAN_MIRROR").ok().filter(|m| !m.is_empty()) {
            Some(m) => m,
            None => system_mirror().context(
                "no Debian mirror in /etc/apt/sources.list.d/debian.sources or /etc/apt/sources.list \
                 (set LANDFALL_DEBIAN_MIRROR)",
            )?,
        };
        let dir = cache.join(format!("apt-{suite}"));
        for sub in ["lists/partial", "cache/archives/partial", "etc", "pkg"] {
            std::fs::create_dir_all(dir.join(sub)).with_context(|| format!("create {}", dir.join(sub).display()))?;
        }
        std::fs::write(dir.join("etc/sources.list"), format!("deb [trusted=yes] {mirror} {suite} main\n"))?;
        Ok(Self { apt_get, dir, suite: suite.to_string(), mirror })
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(&self.apt_get);
        let d = |sub: &str| self.dir.join(sub).display().to_string();
        for (key, value) in [
            ("Dir::Etc::SourceList", d("etc/sources.list")),
            ("Dir::Etc::SourceParts", "/dev/null".into()),
            ("Dir::State::Lists", d("lists")),
            ("Dir::Cache", d("cache")),
            ("APT::Get::List-Cleanup", "0".into()),
            ("Debug::NoLocking", "1".into()),
            ("APT::Sandbox::User", "root".into()),
            ("Acquire::Retries", "2".into()),
            ("Acquire::http::Timeout", "20".into()),
        ] {
            cmd.arg("-o").arg(format!("{key}={value}"));
        }
        cmd.stdin(Stdio::null());
        cmd
    }

    /// Reads the suite's package lists (a few MB) into the private directory.
    async fn update(&self) -> anyhow::Result<()> {
        let spinner = Spinner::start(format!("reading Debian {}'s package lists from {}", self.suite, self.mirror));
        let out = self.command().args(["-q", "update"]).output().await.context("run apt-get update")?;
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        // apt-get update exits 0 even when it could not reach the mirror: its W:/E: lines say so.
        let failed: Vec<&str> =
            text.lines().filter(|l| l.starts_with("E:") || l.starts_with("W:") || l.starts_with("Err:")).collect();
        spinner.finish();
        if !out.status.success() || !failed.is_empty() {
            bail!(
                "apt-get update for {} {} failed (no network, or no such suite?):\n    {}",
                self.mirror,
                self.suite,
                if failed.is_empty() { text.trim().to_string() } else { failed.join("\n    ") }
            );
        }
        Ok(())
    }

    /// Where `package` is downloaded from, with its size and digest.
    async fn locate(&self, package: &str) -> anyhow::Result<Located> {
        let out = self
            .command()
            .current_dir(self.dir.join("pkg"))
            .args(["-q", "--print-uris", "download", package])
            .output()
            .await
            .context("run apt-get download --print-uris")?;
        let text = String::from_utf8_lossy(&out.stdout);
        match text.lines().find_map(parse_print_uris) {
            Some(found) if out.status.success() => Ok(found),
            _ => bail!(
                "Debian {} has no {package} package apt can name ({})",
                self.suite,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        }
    }
}

/// One line of `apt-get --print-uris download`: `'URL' FILE SIZE SHA256:HEX`.
fn parse_print_uris(line: &str) -> Option<Located> {
    let mut words = line.split_whitespace();
    let url = words.next()?.trim_matches('\'').to_string();
    let file = words.next()?.to_string();
    let size = words.next()?.parse().ok()?;
    let sha256 = words.next()?.strip_prefix("SHA256:")?.to_ascii_lowercase();
    // nats-server_2.10.27-1+b2_amd64.deb: the version is the middle field (URL-escaped `:`).
    let version = file.strip_suffix(".deb")?.split('_').nth(1)?.replace("%3a", ":");
    Some(Located { url, file, version, size, sha256 })
}

/// The mirror the system's apt uses for Debian (not its security archive).
fn system_mirror() -> Option<String> {
    let sources = std::fs::read_to_string("/etc/apt/sources.list.d/debian.sources").unwrap_or_default();
    let deb822 = sources
        .lines()
        .filter_map(|l| l.strip_prefix("URIs:"))
        .flat_map(str::split_whitespace)
        .find(|u| !u.contains("security"));
    if let Some(uri) = deb822 {
        return Some(uri.to_string());
    }
    let list = std::fs::read_to_string("/etc/apt/sources.list").unwrap_or_default();
    list.lines()
        .filter_map(|l| l.trim().strip_prefix("deb "))
        .flat_map(|rest| rest.split_whitespace().find(|w| w.contains("://")))
        .find(|u| !u.contains("security"))
        .map(str::to_string)
}

/// Downloads `package` to `to`, showing its size and progress, and checks its size and digest.
/// A file already there with the right digest is kept.
async fn download(package: &Located, to: &Path) -> anyhow::Result<()> {
    if std::fs::read(to).is_ok_and(|bytes| hex(&Sha256::digest(&bytes)) == package.sha256) {
        return Ok(());
    }
    // reqwest is built without a crypto provider and asks for the process's default even for
    // plain http; ring's is the one the workspace builds.
    let _ = async_nats::rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(15))
        .read_timeout(Duration::from_secs(60))
        .build()
        .context("build the http client")?;
    let what = format!("nats-server {} ({})", package.version, megabytes(package.size));
    eprintln!("landfall: fetching {what} from {}", package.url);
    let started = Instant::now();
    let mut response = http
        .get(&package.url)
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .with_context(|| format!("GET {}", package.url))?;
    let bar = Bar::new(package.size, &what);
    let partial = to.with_extension("deb.partial");
    let mut file = std::fs::File::create(&partial).with_context(|| format!("create {}", partial.display()))?;
    let mut digest = Sha256::new();
    let mut received = 0u64;
    while let Some(chunk) = response.chunk().await.with_context(|| format!("read {}", package.url))? {
        file.write_all(&chunk)?;
        digest.update(&chunk);
        received += chunk.len() as u64;
        bar.set(received);
    }
    bar.finish();
    file.sync_all()?;
    let got = hex(&digest.finalize());
    if received != package.size || got != package.sha256 {
        let _ = std::fs::remove_file(&partial);
        bail!(
            "{} arrived damaged: {received} bytes with SHA-256 {got}, expected {} bytes with {}",
            package.url,
            package.size,
            package.sha256
        );
    }
    std::fs::rename(&partial, to)?;
    eprintln!("landfall: fetched {what} in {:.1} s, SHA-256 checked", started.elapsed().as_secs_f64());
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bus_schema::domain::Sha256::hex(bytes)
}

fn megabytes(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

/// A byte-count bar on a terminal; elsewhere nothing (the lines before and after say it all).
struct Bar(Option<ProgressBar>);

impl Bar {
    fn new(len: u64, what: &str) -> Self {
        if !std::io::stderr().is_terminal() {
            return Self(None);
        }
        let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template(
            "{prefix} [{bar:30}] {decimal_bytes}/{decimal_total_bytes} {decimal_bytes_per_sec} {eta}",
        ) {
            bar.set_style(style.progress_chars("█▉▊▋▌▍▎▏ "));
        }
        bar.set_prefix(what.to_string());
        Self(Some(bar))
    }

    fn set(&self, at: u64) {
        if let Some(bar) = &self.0 {
            bar.set_position(at);
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.0 {
            bar.finish_and_clear();
        }
    }
}

/// A spinner with a message on a terminal; elsewhere the message alone, once.
struct Spinner(Option<ProgressBar>);

impl Spinner {
    fn start(message: String) -> Self {
        if !std::io::stderr().is_terminal() {
            eprintln!("landfall: {message}");
            return Self(None);
        }
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
            bar.set_style(style);
        }
        bar.set_message(format!("landfall: {message}"));
        bar.enable_steady_tick(Duration::from_millis(120));
        Self(Some(bar))
    }

    fn finish(self) {
        if let Some(bar) = self.0 {
            bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_and_order() {
        assert_eq!(Version::parse("nats-server: v2.10.27"), Some(Version(2, 10, 27)));
        assert_eq!(Version::parse("nats-server: v2.9.10\n"), Some(Version(2, 9, 10)));
        assert_eq!(Version::parse("v2.11"), Some(Version(2, 11, 0)));
        assert_eq!(Version::parse("no version"), None);
        assert!(Version(2, 10, 27) < MIN_VERSION && MIN_VERSION < Version(2, 15, 1));
    }

    #[test]
    fn apt_print_uris_lines_parse() {
        let line = "'http://deb.debian.org/debian/pool/main/n/nats-server/nats-server_2.10.27-1%2bb2_amd64.deb' \
                    nats-server_2.10.27-1+b2_amd64.deb 5926832 SHA256:ABCDEF";
        let found = parse_print_uris(line).unwrap();
        assert_eq!(found.file, "nats-server_2.10.27-1+b2_amd64.deb");
        assert_eq!(found.version, "2.10.27-1+b2");
        assert_eq!(found.size, 5_926_832);
        assert_eq!(found.sha256, "abcdef");
        assert!(found.url.starts_with("http://") && found.url.ends_with(".deb"));
        assert_eq!(parse_print_uris("Reading package lists..."), None);
    }

    /// With no server anywhere and a mirror that cannot be reached, the error names each
    /// place it looked and why the fetch failed.
    #[test]
    fn the_error_names_what_was_tried() {
        if on_path("apt-get").is_none() {
            return;
        }
        let cache = tempfile::tempdir().unwrap();
        // A child process, so the environment set here stays its own.
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "embedded::fetch::tests::fetch_in_child", "--nocapture"])
            .env("LANDFALL_FETCH_CHILD", "1")
            .env_remove("LANDFALL_NATS_SERVER")
            .env("LANDFALL_CACHE", cache.path())
            .env("LANDFALL_DEBIAN_MIRROR", "http://127.0.0.1:9/debian")
            .env("PATH", "/usr/bin:/bin")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    }

    #[tokio::test]
    async fn fetch_in_child() {
        if std::env::var_os("LANDFALL_FETCH_CHILD").is_none() {
            return;
        }
        let e = format!("{:#}", find_or_fetch().await.unwrap_err());
        for part in [
            "LANDFALL_NATS_SERVER: not set",
            "(in the cache): none",
            "nats-server on PATH",
            "apt-get update",
            "127.0.0.1:9",
        ] {
            assert!(e.contains(part), "{part:?} missing from: {e}");
        }
    }
}
