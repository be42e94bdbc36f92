//! Flags several command groups share: durations such as `30m` or `90s`, where artifacts are
//! kept (`--store`, for `serve distribution`, `up`, `package upload` and `bench transfer`), and
//! how long the bus keeps things (`--duplicate-window`, `--retention`, for `up` and `serve`).

use std::time::Duration;

use anyhow::Context;
use consumers::artifacts::{ArtifactStore, S3Options};

/// Parses `90s`, `5m`, `2h`, `30d`, `1500ms` or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(s.len()));
    let n: f64 = num.parse().map_err(|_| format!("{s:?} is not a duration (e.g. 90s, 5m, 2h)"))?;
    let secs = match unit {
        "" | "s" => n,
        "ms" => n / 1000.0,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        "d" => n * 86400.0,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (ms, s, m, h, d)")),
    };
    Ok(Duration::from_secs_f64(secs))
}

/// How long the bus keeps things; the services that make the streams apply it to new and
/// existing ones.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct KeepingArgs {
    /// How long JetStream drops a repeated command id on arrival [default: 15m]. A copy that
    /// comes later is still recognised by the command ledger and changes nothing: this window
    /// only spares storing and settling copies that come soon.
    #[arg(long, global = true, value_parser = parse_duration, env = "LANDFALL_DUPLICATE_WINDOW")]
    pub duplicate_window: Option<Duration>,
    /// How long commands, events and the command ledger's records are kept [default: 30d]. A
    /// command is recognised as a copy for as long as this.
    #[arg(long, global = true, value_parser = parse_duration, env = "LANDFALL_RETENTION")]
    pub retention: Option<Duration>,
}

impl KeepingArgs {
    /// `topology` with these keeping times.
    pub fn apply(&self, topology: bus_schema::runtime::Topology) -> bus_schema::runtime::Topology {
        topology.keeping(self.duplicate_window, self.retention)
    }
}

/// What the orchestrator keeps, and for how long (`landfall up`, `landfall serve orchestrator`).
#[derive(Debug, Clone, clap::Args)]
pub struct RetentionArgs {
    /// How long a finished saga or rollout is kept whole; after it only its summary stays
    /// (e.g. 7d, 12h, 30m).
    #[arg(long, env = "LANDFALL_FINISHED_RETENTION", value_parser = parse_duration, default_value = "7d")]
    pub finished_retention: Duration,
    /// How many design revisions of each site are kept (the latest ones).
    #[arg(long, env = "LANDFALL_DESIGN_REVISIONS", default_value_t = bus_schema::retention::DESIGN_REVISIONS,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub design_revisions: u32,
    /// How often finished sagas and rollouts past their retention are compacted.
    #[arg(long, env = "LANDFALL_COMPACTION_EVERY", value_parser = parse_duration, default_value = "1m")]
    pub compaction_every: Duration,
    /// How long the marker a deletion leaves in a bucket is kept (watchers see the deletion
    /// meanwhile) before compaction removes it.
    #[arg(long, env = "LANDFALL_MARKER_RETENTION", value_parser = parse_duration, default_value = "1h")]
    pub marker_retention: Duration,
    /// How long the summary of a compacted saga or rollout, and the record that a node left its
    /// site, are kept.
    #[arg(long, env = "LANDFALL_SUMMARY_RETENTION", value_parser = parse_duration, default_value = "30d")]
    pub summary_retention: Duration,
}

impl RetentionArgs {
    pub fn policy(&self) -> bus_schema::retention::StorePolicy {
        bus_schema::retention::StorePolicy {
            finished_retention: self.finished_retention,
            design_revisions: self.design_revisions,
            compaction_interval: self.compaction_every,
            marker_retention: self.marker_retention,
            summary_retention: self.summary_retention,
            ..Default::default()
        }
    }
}

/// Where artifacts are kept.
#[derive(Debug, Clone, clap::Args)]
pub struct StoreArgs {
    /// The artifact store: a directory, file:///path, or s3://bucket[/prefix] (credentials from
    /// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY). Clients that do not name one use the store
    /// the distribution service announces.
    #[arg(long, env = "LANDFALL_STORE")]
    pub store: Option<String>,
    /// The S3 endpoint, e.g. http://127.0.0.1:9000 (default: AWS_ENDPOINT, else AWS itself).
    #[arg(long, env = "LANDFALL_S3_ENDPOINT")]
    pub s3_endpoint: Option<String>,
    /// The S3 region (default: AWS_REGION, else us-east-1).
    #[arg(long, env = "LANDFALL_S3_REGION")]
    pub s3_region: Option<String>,
    /// Allow plain http to the S3 endpoint.
    #[arg(long, env = "LANDFALL_S3_ALLOW_HTTP")]
    pub s3_allow_http: bool,
}

/// The artifact store of a data directory when none is named.
pub const DEFAULT_STORE: &str = "./landfall-data/artifacts";

impl StoreArgs {
    pub fn s3(&self) -> S3Options {
        S3Options {
            endpoint: self.s3_endpoint.clone(),
            region: self.s3_region.clone(),
            allow_http: self.s3_allow_http,
            credentials: None,
        }
    }

    /// The named store, else `announced` (what the distribution service serves), else
    /// [`DEFAULT_STORE`].
    pub fn open_or_default(&self, announced: Option<&str>) -> anyhow::Result<ArtifactStore> {
        let location = self.store.as_deref().or(announced).unwrap_or(DEFAULT_STORE);
        ArtifactStore::open(location, &self.s3()).with_context(|| format!("open the artifact store {location}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("1500ms").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("30d").unwrap(), Duration::from_secs(30 * 86400));
        assert!(parse_duration("5 parsecs").is_err());
    }
}
