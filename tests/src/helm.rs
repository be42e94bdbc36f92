//! The real helm binary for the tests, and charts written by them.
//!
//! The binary is `$LANDFALL_HELM` when set, else whatever `scripts/ensure-helm` prints (it
//! fetches the pinned build once into `~/.cache/landfall`). A [`Chart`] is a chart directory
//! written file by file into a temporary directory and packaged into an archive by that helm.
//!
//! ```text
//! let chart = Chart::new("edge-addons", "1.0.0").file("templates/cm.yaml", CM).package();
//! let rendered = Helm::new(helm_bin()).template(&Template { chart: chart.archive(), .. }).await?;
//! ```

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use tempfile::TempDir;

const ENSURE_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/ensure-helm");

/// The helm binary, resolved once per test binary.
pub fn helm_bin() -> &'static Path {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match BIN.get_or_init(resolve) {
        Ok(path) => path,
        Err(msg) => panic!("{msg}"),
    }
}

fn resolve() -> Result<PathBuf, String> {
    match std::env::var_os("LANDFALL_HELM").filter(|p| !p.is_empty()) {
        Some(path) => Ok(PathBuf::from(path)),
        None => crate::procs::ensured(ENSURE_SCRIPT, &[], "no helm for the tests: set LANDFALL_HELM"),
    }
}

/// A chart the test writes: `Chart.yaml` from its name and version, then its files.
pub struct Chart {
    dir: TempDir,
    name: String,
    version: String,
    archive: Option<PathBuf>,
}

impl Chart {
    /// A chart `name` at `version` with no files yet (an empty `values.yaml`).
    pub fn new(name: &str, version: &str) -> Self {
        let dir = tempfile::Builder::new().prefix("landfall-chart-").tempdir().expect("a temporary directory");
        let chart = Self { dir, name: name.into(), version: version.into(), archive: None };
        chart
            .file("Chart.yaml", &format!("apiVersion: v2\nname: {name}\nversion: {version}\ntype: application\n"))
            .file("values.yaml", "")
    }

    /// Writes `text` at `path` in the chart (parents made).
    pub fn file(self, path: &str, text: &str) -> Self {
        let path = self.dir.path().join(&self.name).join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
        self
    }

    /// Packages the chart with helm (`helm package`) into its archive.
    pub fn package(mut self) -> Self {
        let out = Command::new(helm_bin())
            .arg("package")
            .arg(self.dir.path().join(&self.name))
            .arg("--destination")
            .arg(self.dir.path())
            .env("HOME", self.dir.path())
            .output()
            .expect("run helm package");
        assert!(out.status.success(), "helm package: {}", String::from_utf8_lossy(&out.stderr));
        self.archive = Some(self.dir.path().join(format!("{}-{}.tgz", self.name, self.version)));
        self
    }

    /// The chart's archive (after [`Self::package`]).
    pub fn archive(&self) -> &Path {
        self.archive.as_deref().expect("package the chart first")
    }
}
