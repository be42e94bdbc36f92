//! The flags `package register`, `package upload` and `package patch` share: a package
//! version, its name's auto-rollout policy, and which sites a rollout covers and how it moves
//! through them, checked here as the orchestrator will check them.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use anyhow::{anyhow, bail};
use bus_schema::domain::{InvalidField, SiteId};
use bus_schema::pb;
use bus_schema::rollout::Strategy;
use clap::{Args, ValueEnum};

use crate::flags::parse_duration;

/// A package version: what `package register` and `package upload` both name.
#[derive(Debug, Args)]
pub struct PackageIdArgs {
    #[arg(long)]
    pub name: String,
    #[arg(long)]
    pub version: String,
    /// os-image, binary, container or helm-chart.
    #[arg(long)]
    pub kind: String,
    #[command(flatten)]
    pub chart: ChartArgs,
    #[command(flatten)]
    pub policy: PolicyArgs,
}

/// A helm-chart package's release, and the values it brings over the chart's own.
#[derive(Debug, Default, Args)]
pub struct ChartArgs {
    /// helm-chart: the Helm release's name [default: the package's name].
    #[arg(long)]
    pub release: Option<String>,
    /// helm-chart: the namespace its namespaced objects go to.
    #[arg(long)]
    pub namespace: Option<String>,
    /// helm-chart: a YAML file of values over the chart's defaults (each site's design may
    /// give its own on top).
    #[arg(long, value_name = "FILE")]
    pub values: Option<std::path::PathBuf>,
    /// helm-chart: each site's gateway puts back what drifted from the render (an object
    /// deleted, a field changed by hand), taking the fields back; without it drift is reported
    /// only.
    #[arg(long)]
    pub correct_drift: bool,
}

impl ChartArgs {
    /// The chart's release for a package of `kind` named `name`: `None` for any other kind
    /// (which takes none of these flags).
    pub fn release(&self, kind: pb::PackageKind, name: &str) -> anyhow::Result<Option<pb::HelmChart>> {
        if kind != pb::PackageKind::HelmChart {
            if self.release.is_some() || self.namespace.is_some() || self.values.is_some() || self.correct_drift {
                bail!("--release, --namespace, --values and --correct-drift are for --kind helm-chart");
            }
            return Ok(None);
        }
        let Some(namespace) = self.namespace.clone() else {
            bail!("a helm-chart package needs --namespace: where its release's objects go");
        };
        let values = match &self.values {
            Some(path) => std::fs::read_to_string(path).map_err(|e| anyhow!("--values {}: {e}", path.display()))?,
            None => String::new(),
        };
        Ok(Some(pb::HelmChart {
            release: self.release.clone().unwrap_or_else(|| name.to_string()),
            namespace,
            values,
            correct_drift: self.correct_drift,
            ..Default::default()
        }))
    }
}

/// A package name's auto-rollout policy, as `package register` and `package upload` set it.
#[derive(Debug, Args)]
pub struct PolicyArgs {
    /// Set this name's auto-rollout policy: from this version on, a version registered that is
    /// the newest of its name patches the selected sites' nodes that run an older one, with
    /// the strategy given here (the selector and strategy flags below).
    #[arg(long, conflicts_with = "no_auto_rollout")]
    pub auto_rollout: bool,
    /// Turn this name's auto-rollout policy off.
    #[arg(long)]
    pub no_auto_rollout: bool,
    #[command(flatten)]
    pub rollout: RolloutArgs,
}

/// The auto-rollout policy the flags of `package register` / `package upload` set, if any.
impl PolicyArgs {
    pub fn policy(&self) -> anyhow::Result<Option<pb::AutoRollout>> {
        let (auto_rollout, no_auto_rollout, rollout) = (self.auto_rollout, self.no_auto_rollout, &self.rollout);
        Ok(match (auto_rollout, no_auto_rollout) {
            (true, _) => Some(rollout.auto_rollout()?),
            (false, true) if !rollout.is_empty() => {
                bail!("--no-auto-rollout turns the policy off: it takes no selector or strategy flags")
            }
            (false, true) => Some(pb::AutoRollout { enabled: false, selector: None, strategy: None }),
            (false, false) if !rollout.is_empty() => {
                bail!("the selector and strategy flags set an auto-rollout policy: add --auto-rollout")
            }
            (false, false) => None,
        })
    }
}

/// Which sites a rollout covers and how it moves through them: shared by `package patch` and
/// `package register --auto-rollout`.
#[derive(Debug, Clone, Default, Args)]
pub struct RolloutArgs {
    /// Only these sites (comma-separated site ids).
    #[arg(long, value_delimiter = ',', value_name = "SITE,...")]
    pub sites: Vec<String>,
    /// Only sites whose labels hold every pair given.
    #[arg(long, value_delimiter = ',', value_parser = parse_label, value_name = "KEY=VALUE,...")]
    pub labels: Vec<(String, String)>,
    /// Patch the first N sites of the plan first, as a wave of their own.
    #[arg(long, value_name = "N", conflicts_with = "canary_sites")]
    pub canary: Option<u32>,
    /// Patch these sites first, as a wave of their own.
    #[arg(long, value_delimiter = ',', value_name = "SITE,...")]
    pub canary_sites: Vec<String>,
    /// Sites patched at once, per wave [default: every site in one wave].
    #[arg(long, value_name = "N")]
    pub max_concurrent_sites: Option<u32>,
    /// Nodes of one site patched at once: a count or a percentage of the site's nodes
    /// [default: 1].
    #[arg(long, value_name = "N|P%")]
    pub max_unavailable: Option<String>,
    /// Node failures tolerated, over the whole rollout, before it halts [default: 0].
    #[arg(long, value_name = "N|P%")]
    pub failure_threshold: Option<String>,
    /// How long one wave may take [default: no limit].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub wave_timeout: Option<Duration>,
    /// What a wave that runs out of time does [default: abort].
    #[arg(long, value_enum, requires = "wave_timeout")]
    pub on_wave_timeout: Option<OnWaveTimeout>,
    /// Wait for a person (`landfall rollout approve ID`) after the canary, or after every wave
    /// [default: never].
    #[arg(long, value_enum)]
    pub approval: Option<Approval>,
    /// What a node whose patch fails its health check becomes [default: left as it is].
    #[arg(long, value_enum)]
    pub on_failure: Option<OnFailure>,
    /// Once failures pass --failure-threshold, halt and roll the whole rollout back
    /// (`landfall rollout rollback`) by itself.
    #[arg(long)]
    pub roll_back_on_halt: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnFailure {
    /// Leave the node as the failed patch left it, for a person to look at.
    Leave,
    /// Put the node back to the version it ran (reinstalled, re-applied, or reimaged), then
    /// check it healthy again.
    RollBack,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Approval {
    /// After the canary wave.
    AfterCanary,
    /// After every wave but the last.
    AfterEachWave,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnWaveTimeout {
    /// Count the wave's unfinished sites as timed out and start the next wave.
    Continue,
    /// Halt the rollout.
    Abort,
}

/// Parses one `KEY=VALUE` of `--labels`.
pub fn parse_label(s: &str) -> Result<(String, String), String> {
    let (k, v) = s.split_once('=').ok_or_else(|| format!("{s:?} is not KEY=VALUE"))?;
    let (k, v) = (k.trim(), v.trim());
    if k.is_empty() {
        return Err(format!("{s:?} has no key (KEY=VALUE)"));
    }
    Ok((k.to_string(), v.to_string()))
}

/// Site ids given on the command line, checked, each once.
fn site_ids(ids: &[String], flag: &str) -> anyhow::Result<Vec<String>> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::with_capacity(ids.len());
    for id in ids.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        let id = SiteId::try_from(id).map_err(|e| anyhow!("{flag}: {}", e.reason))?;
        if !seen.insert(id.to_string()) {
            bail!("{flag}: {id} is given twice");
        }
        out.push(id.to_string());
    }
    Ok(out)
}

/// The flag a strategy field comes from, for error messages.
fn flag_of(field: &str) -> &str {
    match field.strip_prefix("strategy.").unwrap_or(field) {
        "canary" => "--canary/--canary-sites",
        "canary_site_ids" => "--canary-sites",
        "max_unavailable" => "--max-unavailable",
        "failure_threshold" => "--failure-threshold",
        "on_wave_timeout" => "--on-wave-timeout",
        "approval" => "--approval",
        "site_ids" | "selector.site_ids" => "--sites",
        other => other,
    }
}

/// A strategy field the orchestrator would refuse, named by its flag.
pub(crate) fn invalid(e: InvalidField) -> anyhow::Error {
    anyhow!("{}: {}", flag_of(&e.field), e.reason)
}

impl RolloutArgs {
    /// Whether any selector or strategy flag was given.
    pub fn is_empty(&self) -> bool {
        self.sites.is_empty()
            && self.labels.is_empty()
            && self.canary.is_none()
            && self.canary_sites.is_empty()
            && self.max_concurrent_sites.is_none()
            && self.max_unavailable.is_none()
            && self.failure_threshold.is_none()
            && self.wave_timeout.is_none()
            && self.on_wave_timeout.is_none()
            && self.approval.is_none()
            && self.on_failure.is_none()
            && !self.roll_back_on_halt
    }

    /// The sites the flags select (every site when none is given).
    ///
    /// # Errors
    /// An invalid or repeated site id, or a label key given twice with different values.
    pub fn selector(&self) -> anyhow::Result<pb::SiteSelector> {
        let site_ids = site_ids(&self.sites, "--sites")?;
        let mut labels = HashMap::new();
        for (k, v) in &self.labels {
            if let Some(old) = labels.insert(k.clone(), v.clone())
                && old != *v
            {
                bail!("--labels: {k} is given twice ({k}={old}, {k}={v})");
            }
        }
        Ok(pb::SiteSelector { site_ids, labels })
    }

    /// The strategy the flags say, checked as the orchestrator will check it.
    ///
    /// # Errors
    /// Whatever [`Strategy::try_from`] refuses, named by its flag.
    pub fn strategy(&self) -> anyhow::Result<(pb::RolloutStrategy, Strategy)> {
        let wave_timeout_seconds = match self.wave_timeout {
            None => 0,
            Some(d) if d < Duration::from_secs(1) => {
                bail!("--wave-timeout must be at least 1s (leave it out for no limit)")
            }
            Some(d) => u32::try_from(d.as_secs()).map_err(|_| anyhow!("--wave-timeout {d:?} is too long"))?,
        };
        let on_wave_timeout = match self.on_wave_timeout {
            None => pb::WaveTimeoutAction::Unspecified,
            Some(OnWaveTimeout::Continue) => pb::WaveTimeoutAction::Continue,
            Some(OnWaveTimeout::Abort) => pb::WaveTimeoutAction::Abort,
        };
        let s = pb::RolloutStrategy {
            canary_site_ids: site_ids(&self.canary_sites, "--canary-sites")?,
            canary_sites: self.canary.unwrap_or(0),
            max_concurrent_sites: self.max_concurrent_sites.unwrap_or(0),
            max_unavailable: self.max_unavailable.clone().unwrap_or_default(),
            failure_threshold: self.failure_threshold.clone().unwrap_or_default(),
            wave_timeout_seconds,
            on_wave_timeout: on_wave_timeout as i32,
            approval: match self.approval {
                None => pb::ApprovalGate::Unspecified,
                Some(Approval::AfterCanary) => pb::ApprovalGate::AfterCanary,
                Some(Approval::AfterEachWave) => pb::ApprovalGate::AfterEachWave,
            } as i32,
            on_failure: match self.on_failure {
                None => pb::OnNodeFailure::Unspecified,
                Some(OnFailure::Leave) => pb::OnNodeFailure::Leave,
                Some(OnFailure::RollBack) => pb::OnNodeFailure::RollBack,
            } as i32,
            roll_back_on_halt: self.roll_back_on_halt,
        };
        let checked = Strategy::try_from(&s).map_err(invalid)?;
        Ok((s, checked))
    }

    /// An enabled auto-rollout policy with this selector and strategy.
    ///
    /// # Errors
    /// See [`RolloutArgs::selector`] and [`RolloutArgs::strategy`].
    pub fn auto_rollout(&self) -> anyhow::Result<pb::AutoRollout> {
        Ok(pb::AutoRollout { enabled: true, selector: Some(self.selector()?), strategy: Some(self.strategy()?.0) })
    }
}
