//! What the hub costs, by its own account: its monitoring endpoint (`/varz`: RSS) and Go's
//! profiler (`/debug/pprof`: live heap, goroutines), with its CPU seconds from `/proc`. Sampled
//! before the fleet is registered and after it is installed, the difference divided by the
//! sites is the hub's cost per site; the CPU of the patch divided by its node updates, its cost
//! per node update.

use std::time::Duration;

use anyhow::Context;
use serde_json::json;

use super::round;

/// The hub at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct HubSample {
    pub rss_bytes: f64,
    /// Live heap (`HeapAlloc` right after a collection the profiler asks for).
    pub heap_bytes: f64,
    pub goroutines: f64,
    pub cpu_seconds: f64,
}

impl HubSample {
    /// Reads the hub's monitoring port `http` and profiler port `prof`; `cpu_seconds` is its
    /// CPU so far (from `/proc`).
    pub(super) async fn take(http: u16, prof: u16, cpu_seconds: f64) -> anyhow::Result<Self> {
        let varz: serde_json::Value = serde_json::from_str(&get(format!("http://127.0.0.1:{http}/varz")).await?)?;
        let rss_bytes = varz["mem"].as_f64().context("/varz has no mem")?;
        let goroutines = get(format!("http://127.0.0.1:{prof}/debug/pprof/goroutine?debug=1")).await?;
        let goroutines = parse_goroutines(&goroutines).context("the goroutine profile has no total")?;
        let heap = get(format!("http://127.0.0.1:{prof}/debug/pprof/heap?gc=1&debug=1")).await?;
        let heap_bytes = parse_mem_stat(&heap, "HeapAlloc").context("the heap profile has no HeapAlloc")?;
        Ok(Self { rss_bytes, heap_bytes, goroutines, cpu_seconds })
    }

    pub(super) fn to_json(self) -> serde_json::Value {
        json!({
            "rss_mib": round(self.rss_bytes / MIB, 1),
            "heap_mib": round(self.heap_bytes / MIB, 1),
            "goroutines": self.goroutines,
            "cpu_seconds": round(self.cpu_seconds, 2),
        })
    }
}

const MIB: f64 = 1024.0 * 1024.0;

/// The hub's growth from `empty` (every service connected, no site registered) to `installed`
/// (every site registered, connected and installed), per site; and its CPU per node update.
pub(super) fn per_site(empty: HubSample, installed: HubSample, sites: usize) -> serde_json::Value {
    let n = sites.max(1) as f64;
    json!({
        "rss_kib": round((installed.rss_bytes - empty.rss_bytes) / 1024.0 / n, 1),
        "heap_kib": round((installed.heap_bytes - empty.heap_bytes) / 1024.0 / n, 1),
        "goroutines": round((installed.goroutines - empty.goroutines) / n, 2),
    })
}

/// The body of `GET url` on the hub's monitoring or profiling port.
pub(super) async fn get(url: String) -> anyhow::Result<String> {
    // reqwest is built without a crypto provider and asks for the process's default even for
    // plain http; ring's is the one the workspace builds.
    let _ = async_nats::rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder().timeout(Duration::from_secs(60)).build()?;
    Ok(client.get(&url).send().await?.error_for_status()?.text().await?)
}

/// `goroutine profile: total 1234` on the first line.
fn parse_goroutines(profile: &str) -> Option<f64> {
    profile.lines().next()?.strip_prefix("goroutine profile: total ")?.trim().parse().ok()
}

/// `# HeapAlloc = 920520` among the `runtime.MemStats` lines at the end of a heap profile.
fn parse_mem_stat(profile: &str, field: &str) -> Option<f64> {
    let prefix = format!("# {field} = ");
    profile.lines().rev().find_map(|l| l.strip_prefix(&prefix)?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profiles_totals_are_read() {
        assert_eq!(parse_goroutines("goroutine profile: total 15\n2 @ 0x48e62a\n"), Some(15.0));
        assert_eq!(parse_goroutines("nothing"), None);
        let heap = "heap profile: 1: 2 [3: 4] @ heap/1048576\n# runtime.MemStats\n# Alloc = 1\n# HeapAlloc = 920520\n";
        assert_eq!(parse_mem_stat(heap, "HeapAlloc"), Some(920_520.0));
        assert_eq!(parse_mem_stat(heap, "HeapSys"), None);
    }

    #[test]
    fn growth_is_divided_by_the_sites() {
        let empty = HubSample { rss_bytes: MIB, heap_bytes: MIB, goroutines: 10.0, cpu_seconds: 0.0 };
        let installed =
            HubSample { rss_bytes: 101.0 * MIB, heap_bytes: 51.0 * MIB, goroutines: 2010.0, cpu_seconds: 9.0 };
        let each = per_site(empty, installed, 1000);
        assert_eq!(each["rss_kib"], 102.4);
        assert_eq!(each["heap_kib"], 51.2);
        assert_eq!(each["goroutines"], 2.0);
    }
}
