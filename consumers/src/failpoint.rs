//! Crash points for fault tests: `LANDFALL_FAILPOINT=<name>:<n>` makes the process abort
//! (no cleanup, like `kill -9`) the n-th time it reaches the point called `name`. Unset,
//! a failpoint costs one relaxed atomic load.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

static ARMED: OnceLock<Option<(String, u64)>> = OnceLock::new();
static HITS: AtomicU64 = AtomicU64::new(0);

fn armed() -> &'static Option<(String, u64)> {
    ARMED.get_or_init(|| {
        let spec = std::env::var("LANDFALL_FAILPOINT").ok()?;
        let (name, n) = spec.split_once(':').unwrap_or((spec.as_str(), "1"));
        Some((name.to_string(), n.parse().unwrap_or(1)))
    })
}

/// Aborts the process here if this failpoint is armed and its count is reached.
pub fn hit(name: &str) {
    if let Some((armed, n)) = armed()
        && armed == name
        && HITS.fetch_add(1, Ordering::Relaxed) + 1 == *n
    {
        tracing::error!(failpoint = name, "failpoint reached: aborting");
        std::process::abort();
    }
}
