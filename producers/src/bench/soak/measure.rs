//! What a soak measures at the end of each simulated day (every stream's and bucket's stored
//! bytes, the sites' caches on disk, resident memory, a fresh orchestrator's recovery scan), and
//! how much each grew over the run.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use bus_schema::names;
use bus_schema::runtime::Bus;
use futures::StreamExt;
use serde::Serialize;

use super::day::DayOps;
use crate::bench::transfer::status_bytes;

/// A measure that grows by less than this from the baseline day to the last is flat.
pub(super) const FLAT_PERCENT: f64 = 5.0;

/// A measure of bytes that grows by less than this is flat too: a bucket of a few KiB moves by
/// that much as records expire and others are written, whatever the day.
pub(super) const FLAT_BYTES: f64 = 4096.0;

/// Recovery that grows by less than this is flat too: a scan of a few milliseconds moves by
/// that much with a shared machine's load (one that grows with history grows by tens of
/// milliseconds a day at 50 sites).
pub(super) const FLAT_MS: f64 = 5.0;

/// The measure that holds what operators add, not history: the package catalog grows by each
/// version registered (one a day in a soak), and is shown but not judged.
pub(super) const NOT_HISTORY: &str = "KV_landfall-packages bytes";

/// One stream's (or KV bucket's) stored size.
#[derive(Debug, Clone, Copy, Serialize)]
pub(super) struct Stored {
    pub bytes: u64,
    pub messages: u64,
}

/// The end of one simulated day.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Day {
    pub day: usize,
    /// Wall time the day's operations took (the rest of the day is idle).
    pub busy_seconds: f64,
    pub ops: DayOps,
    /// Every stream but the raw benchmark's, KV buckets (`KV_…`) included.
    pub streams: BTreeMap<String, Stored>,
    pub stream_bytes_total: u64,
    /// The sites' artifact caches on disk, together.
    pub site_cache_bytes: u64,
    /// Resident memory of this process: the observer, the secrets and distribution services,
    /// the gateways and simulated sites, and the orchestrator too when it runs in this process.
    pub process_rss_bytes: u64,
    /// Resident memory of the orchestrator's own process, when it runs as one.
    pub orchestrator_rss_bytes: Option<u64>,
    /// A new orchestrator's startup: opening its buckets and the recovery scan of every saga
    /// (the fastest of three).
    pub recovery_ms: f64,
}

impl Day {
    /// Every measure by name, for the growth summary.
    pub fn measures(&self) -> Vec<(String, f64)> {
        let mut out: Vec<(String, f64)> =
            self.streams.iter().map(|(name, s)| (format!("{name} bytes"), s.bytes as f64)).collect();
        out.push(("streams total bytes".into(), self.stream_bytes_total as f64));
        out.push(("site caches bytes".into(), self.site_cache_bytes as f64));
        out.push(("process RSS".into(), self.process_rss_bytes as f64));
        if let Some(rss) = self.orchestrator_rss_bytes {
            out.push(("orchestrator RSS".into(), rss as f64));
        }
        out.push(("recovery ms".into(), self.recovery_ms));
        out
    }

    /// One line for people.
    pub fn line(&self) -> String {
        let streams: Vec<String> = self
            .streams
            .iter()
            .map(|(n, s)| {
                format!("{} {}", n.trim_start_matches("LANDFALL_").trim_start_matches("KV_landfall-"), kib(s.bytes))
            })
            .collect();
        let ops = self.ops.total();
        format!(
            "day {}: streams {} ({}); caches {}; process RSS {}{}; recovery {:.1} ms; ops ok {} refused {} failed {} timed out {} ({} nodes patched), busy {:.1} s",
            self.day,
            kib(self.stream_bytes_total),
            streams.join(", "),
            kib(self.site_cache_bytes),
            kib(self.process_rss_bytes),
            self.orchestrator_rss_bytes.map(|b| format!(", orchestrator RSS {}", kib(b))).unwrap_or_default(),
            self.recovery_ms,
            ops.ok,
            ops.refused,
            ops.failed,
            ops.timed_out,
            self.ops.nodes_patched,
            self.busy_seconds,
        )
    }
}

fn kib(bytes: u64) -> String {
    format!("{:.1} KiB", bytes as f64 / 1024.0)
}

/// Stored bytes and messages of every stream but the raw benchmark's.
pub(super) async fn streams(bus: &Bus) -> anyhow::Result<BTreeMap<String, Stored>> {
    let mut names = bus.jetstream().stream_names();
    let mut out = BTreeMap::new();
    while let Some(name) = names.next().await {
        let name = name?;
        if name == names::BENCH_STREAM {
            continue;
        }
        let state = bus.jetstream().get_stream(&name).await?.info().await?.state.clone();
        out.insert(name, Stored { bytes: state.bytes, messages: state.messages });
    }
    Ok(out)
}

/// Bytes of every file under `dir` (0 when it does not exist).
pub(super) fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(_) => e.metadata().map_or(0, |m| m.len()),
            Err(_) => 0,
        })
        .sum()
}

/// Resident memory of a process (this one when `pid` is `None`).
pub(super) fn rss(pid: Option<u32>) -> Option<u64> {
    let path = pid.map_or_else(|| "/proc/self/status".to_string(), |p| format!("/proc/{p}/status"));
    status_bytes(&std::fs::read_to_string(path).ok()?, "VmRSS")
}

/// A new orchestrator started the way a restarted one starts: its buckets opened and the
/// recovery scan run. The fastest of three, so one slow moment of a shared machine counts less.
pub(super) async fn recovery(bus: &Bus) -> anyhow::Result<Duration> {
    let mut best = Duration::MAX;
    for _ in 0..3 {
        let start = Instant::now();
        let orchestrator = consumers::orchestrator::Orchestrator::new(bus.clone(), Default::default()).await?;
        orchestrator.recover().await.map_err(|e| anyhow::anyhow!("recovery scan: {e}"))?;
        best = best.min(start.elapsed());
    }
    Ok(best)
}

/// How much one measure grew from the baseline day to the last.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Growth {
    pub measure: String,
    pub baseline: f64,
    pub last: f64,
    /// Percent; `None` when the baseline was zero and the last day's is not.
    pub percent: Option<f64>,
}

impl Growth {
    pub fn flat(&self) -> bool {
        let grew = self.last - self.baseline;
        let small =
            (self.measure.ends_with("bytes") && grew < FLAT_BYTES) || (self.measure.ends_with("ms") && grew < FLAT_MS);
        small || self.percent.is_some_and(|p| p < FLAT_PERCENT)
    }

    /// Whether the verdict counts this measure (see [`NOT_HISTORY`]).
    pub fn judged(&self) -> bool {
        self.measure != NOT_HISTORY
    }
}

/// Each measure's growth from `baseline` to `last` (measures missing from either are left out).
pub(super) fn growth(baseline: &Day, last: &Day) -> Vec<Growth> {
    let before: BTreeMap<String, f64> = baseline.measures().into_iter().collect();
    last.measures()
        .into_iter()
        .filter_map(|(measure, last)| {
            let baseline = *before.get(&measure)?;
            let percent = if baseline == 0.0 {
                (last == 0.0).then_some(0.0)
            } else {
                Some(((last - baseline) / baseline * 1000.0).round() / 10.0)
            };
            Some(Growth { measure, baseline, last, percent })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day(n: usize, events: u64, rss: u64) -> Day {
        Day {
            day: n,
            busy_seconds: 1.0,
            ops: DayOps::default(),
            streams: [("LANDFALL_EVENTS".to_string(), Stored { bytes: events, messages: 1 })].into(),
            stream_bytes_total: events,
            site_cache_bytes: 0,
            process_rss_bytes: rss,
            orchestrator_rss_bytes: None,
            recovery_ms: 2.0,
        }
    }

    #[test]
    fn growth_is_in_percent_and_flat_below_the_threshold() {
        let g = growth(&day(2, 100_000, 100), &day(9, 130_000, 103));
        let of = |m: &str| g.iter().find(|g| g.measure == m).unwrap().clone();
        assert_eq!(of("LANDFALL_EVENTS bytes").percent, Some(30.0));
        assert!(!of("LANDFALL_EVENTS bytes").flat());
        assert_eq!(of("process RSS").percent, Some(3.0));
        assert!(of("process RSS").flat());
        assert!(of("site caches bytes").flat(), "nothing to nothing is flat");
        let from_zero = growth(&day(2, 0, 100), &day(3, 10_000, 100));
        assert!(!from_zero.iter().find(|g| g.measure == "LANDFALL_EVENTS bytes").unwrap().flat());
        // A few KiB bucket moving by a few hundred bytes is flat, whatever the percent.
        let small = growth(&day(2, 1000, 100), &day(9, 1300, 100));
        assert!(small.iter().find(|g| g.measure == "LANDFALL_EVENTS bytes").unwrap().flat());
        let recovery = Growth { measure: "recovery ms".into(), baseline: 4.0, last: 5.0, percent: Some(25.0) };
        assert!(recovery.flat(), "a millisecond more of a few-millisecond scan");
        let catalog = Growth { measure: NOT_HISTORY.into(), baseline: 1.0, last: 9.0, percent: Some(800.0) };
        assert!(!catalog.judged());
    }

    #[test]
    fn directory_bytes_count_nested_files() {
        let dir = std::env::temp_dir().join(format!("landfall-soak-test-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(dir.join("a/b")).unwrap();
        std::fs::write(dir.join("x"), [0u8; 10]).unwrap();
        std::fs::write(dir.join("a/b/y"), [0u8; 5]).unwrap();
        assert_eq!(dir_bytes(&dir), 15);
        assert_eq!(dir_bytes(&dir.join("missing")), 0);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
