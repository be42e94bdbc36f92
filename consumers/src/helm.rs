//! Helm charts rendered at the hub with the real helm binary (v4): `helm template` of a chart
//! archive for one release, with layers of values, the site's Kubernetes version and the API
//! versions its cluster serves, CRDs included and test hooks left out. Nothing else of helm is
//! used: no repository, no cluster connection, no state of its own (its config, cache and data
//! directories are a temporary directory per render).
//!
//! What helm prints is split the way Helm installs it ([`Rendered`]): the CRDs first, then the
//! `pre-install`/`pre-upgrade` hooks by weight, then the chart's objects, then the
//! `post-install`/`post-upgrade` hooks by weight. A chart helm cannot render (a broken template,
//! a required value missing, values its `values.schema.json` refuses, a Kubernetes version its
//! `kubeVersion` excludes) is refused with helm's own message.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

/// How long one `helm` run may take.
const HELM_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a chart was not rendered.
#[derive(Debug, thiserror::Error)]
pub enum HelmError {
    /// helm refused the chart or its values: its own message.
    #[error("helm refused the chart: {0}")]
    Refused(String),
    /// helm could not be run at all.
    #[error("running helm ({binary}): {reason}")]
    NotRun { binary: String, reason: String },
    /// helm printed what is not YAML manifests.
    #[error("helm printed a document that is not a manifest: {0}")]
    Output(String),
}

/// The helm binary landfall renders charts with.
#[derive(Debug, Clone)]
pub struct Helm {
    binary: PathBuf,
}

/// One render: a chart archive for a release, with its values and the cluster it is for.
#[derive(Debug, Clone)]
pub struct Template<'a> {
    /// The chart archive (`.tgz`).
    pub chart: &'a Path,
    pub release: &'a str,
    pub namespace: &'a str,
    /// Values, each layer over the ones before (the chart's own defaults under all of them).
    pub values: &'a [Value],
    /// `Capabilities.KubeVersion`: the site's Kubernetes version (`v1.29.2`).
    pub kube_version: Option<&'a str>,
    /// `Capabilities.APIVersions`: what the site's cluster serves (`group/version`, and
    /// `group/version/Kind`).
    pub api_versions: &'a [String],
}

pub use bus_schema::chart::{Hook, Rendered};

/// The helm version `scripts/ensure-helm` pins, where it leaves the binary.
pub const PINNED_VERSION: &str = "v4.1.4";

/// A chart's name and version, as its `Chart.yaml` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChartMeta {
    pub name: String,
    pub version: String,
}

impl Helm {
    pub fn new(binary: impl Into<PathBuf>) -> Self {
        Self { binary: binary.into() }
    }

    /// The helm binary to use: `LANDFALL_HELM`, else the one `scripts/ensure-helm` left in the
    /// cache (`$LANDFALL_CACHE` or `~/.cache/landfall`), else `helm` on the `PATH`.
    ///
    /// # Errors
    /// When none is found: what to do about it.
    pub fn locate() -> Result<Self, String> {
        if let Some(path) = std::env::var_os("LANDFALL_HELM").filter(|p| !p.is_empty()) {
            return Ok(Self::new(path));
        }
        let cache = std::env::var_os("LANDFALL_CACHE").map(PathBuf::from).or_else(|| {
            std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
                .map(|c| c.join("landfall"))
        });
        if let Some(bin) = cache.map(|c| c.join("helm").join(PINNED_VERSION).join("helm")).filter(|b| b.is_file()) {
            return Ok(Self::new(bin));
        }
        let on_path = std::env::var_os("PATH")
            .into_iter()
            .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .map(|d| d.join("helm"))
            .find(|b| b.is_file());
        on_path.map(Self::new).ok_or_else(|| {
            "no helm binary: helm-chart packages are rendered with helm v4; run scripts/ensure-helm (it fetches \
             the pinned build into the cache) or set LANDFALL_HELM"
                .to_string()
        })
    }

    /// The binary's path.
    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// The name and version of the chart archive at `archive` (`helm show chart`).
    ///
    /// # Errors
    /// [`HelmError::Refused`] with helm's message when it is not a chart.
    pub async fn chart(&self, archive: &Path) -> Result<ChartMeta, HelmError> {
        let home = self.home()?;
        let text = self.run(&home, &["show", "chart", &archive.display().to_string()]).await?;
        let chart: Value = bus_schema::yaml::from_str(&text).map_err(|e| HelmError::Output(e.to_string()))?;
        let field = |k: &str| chart[k].as_str().map(str::to_string);
        match (field("name"), field("version")) {
            (Some(name), Some(version)) => Ok(ChartMeta { name, version }),
            _ => Err(HelmError::Refused("Chart.yaml has no name or version".into())),
        }
    }

    /// helm's version (`v4.1.4`).
    ///
    /// # Errors
    /// When helm cannot be run.
    pub async fn version(&self) -> Result<String, HelmError> {
        let home = self.home()?;
        let out = self.run(&home, &["version", "--template", "{{.Version}}"]).await?;
        Ok(out.trim().to_string())
    }

    /// Renders `t` (see the module's comment).
    ///
    /// # Errors
    /// [`HelmError::Refused`] with helm's message when it cannot render the chart with these
    /// values for this cluster.
    pub async fn template(&self, t: &Template<'_>) -> Result<Rendered, HelmError> {
        let home = self.home()?;
        let mut args: Vec<String> = vec![
            "template".into(),
            t.release.into(),
            t.chart.display().to_string(),
            "--namespace".into(),
            t.namespace.into(),
            "--include-crds".into(),
            "--skip-tests".into(),
        ];
        if let Some(v) = t.kube_version {
            args.extend(["--kube-version".into(), v.into()]);
        }
        for api in t.api_versions {
            args.extend(["--api-versions".into(), api.clone()]);
        }
        for (i, layer) in t.values.iter().enumerate() {
            // JSON is YAML: each layer a file, in order.
            let path = home.path().join(format!("values-{i}.json"));
            std::fs::write(&path, serde_json::to_vec(layer).unwrap_or_default())
                .map_err(|e| self.not_run(format!("writing values: {e}")))?;
            args.extend(["--values".into(), path.display().to_string()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let text = self.run(&home, &args).await?;
        bus_schema::chart::split(&text).map_err(HelmError::Output)
    }

    fn home(&self) -> Result<tempfile::TempDir, HelmError> {
        tempfile::Builder::new().prefix("landfall-helm-").tempdir().map_err(|e| self.not_run(e.to_string()))
    }

    fn not_run(&self, reason: String) -> HelmError {
        HelmError::NotRun { binary: self.binary.display().to_string(), reason }
    }

    /// Runs helm with `args`, its state in `home`; what it printed.
    async fn run(&self, home: &tempfile::TempDir, args: &[&str]) -> Result<String, HelmError> {
        let dir = home.path();
        let mut command = tokio::process::Command::new(&self.binary);
        command
            .args(args)
            .env_clear()
            .env("HOME", dir)
            .env("HELM_CACHE_HOME", dir.join("cache"))
            .env("HELM_CONFIG_HOME", dir.join("config"))
            .env("HELM_DATA_HOME", dir.join("data"))
            .env("KUBECONFIG", dir.join("no-cluster"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let child = command.spawn().map_err(|e| self.not_run(e.to_string()))?;
        let out = match tokio::time::timeout(HELM_TIMEOUT, child.wait_with_output()).await {
            Ok(out) => out.map_err(|e| self.not_run(e.to_string()))?,
            Err(_) => return Err(self.not_run(format!("no answer within {HELM_TIMEOUT:?}"))),
        };
        if !out.status.success() {
            let said = String::from_utf8_lossy(&out.stderr);
            let said = said.trim().trim_start_matches("Error: ").to_string();
            return Err(HelmError::Refused(said));
        }
        String::from_utf8(out.stdout).map_err(|_| HelmError::Output("helm printed what is not UTF-8".into()))
    }
}

/// What a chart does that a render at the hub does differently from a `helm install` at the
/// site: named at registration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChartTraits {
    /// Templates that call `lookup`, which finds nothing when rendering without a cluster.
    pub lookup: Vec<String>,
    /// Templates that make random values (`randAlphaNum`, `uuidv4`, `genCA`, …): a render is
    /// kept, so a site gets the same values until its values or the chart change.
    pub random: Vec<String>,
}

/// The template functions whose result differs from one render to the next.
const RANDOM_FUNCTIONS: [&str; 12] = [
    "randAlphaNum",
    "randAlpha",
    "randNumeric",
    "randAscii",
    "randInt",
    "randBytes",
    "uuidv4",
    "shuffle",
    "genCA",
    "genPrivateKey",
    "genSelfSignedCert",
    "genSignedCert",
];

/// The [`ChartTraits`] of the chart archive at `archive` (its templates and its subcharts'),
/// each template named by its path in the archive.
///
/// # Errors
/// When the archive cannot be unpacked (with `tar`).
pub async fn traits(archive: &Path) -> Result<ChartTraits, HelmError> {
    let dir = tempfile::Builder::new()
        .prefix("landfall-chart-")
        .tempdir()
        .map_err(|e| HelmError::Output(format!("a directory to unpack the chart: {e}")))?;
    let out = tokio::process::Command::new("tar")
        .arg("-xzf")
        .arg(archive)
        .arg("-C")
        .arg(dir.path())
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| HelmError::Output(format!("running tar: {e}")))?;
    if !out.status.success() {
        return Err(HelmError::Refused(format!(
            "the chart archive cannot be unpacked: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let mut found = ChartTraits::default();
    let mut pending = vec![dir.path().to_path_buf()];
    let mut templates = Vec::new();
    while let Some(path) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&path) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.components().any(|c| c.as_os_str() == "templates") {
                templates.push(path);
            }
        }
    }
    templates.sort();
    for path in templates {
        let Ok(text) = std::fs::read_to_string(&path) else { continue };
        let name = path.strip_prefix(dir.path()).unwrap_or(&path).display().to_string();
        let calls = |function: &str| {
            text.match_indices(function).any(|(at, _)| {
                let before = text[..at].chars().next_back();
                let after = text[at + function.len()..].chars().next();
                !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.')
                    && after.is_some_and(|c| c.is_whitespace() || c == ')')
            })
        };
        if calls("lookup") {
            found.lookup.push(name.clone());
        }
        if RANDOM_FUNCTIONS.iter().any(|f| calls(f)) {
            found.random.push(name);
        }
    }
    Ok(found)
}
