//! Which artifacts leave a site's cache when it holds more than its limit, decided purely
//! ([`plan`]): never one a job in progress uses or the site's current packages are (the
//! latest version staged of each package name, [`Usage`]); of the rest, the least recently
//! used first, until the cache fits.

use std::collections::{BTreeSet, HashMap};
use std::time::SystemTime;

/// One complete artifact in the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub sha256: String,
    pub size: u64,
    /// When a job last used it (its file's modification time, set at each use).
    pub used: SystemTime,
}

/// The artifacts to delete so that the cache's entries fit in `max_bytes`, least recently
/// used first, never one of `keep`. The cache may still be over the limit after them, when
/// what is kept alone is more.
pub fn plan(entries: &[Entry], keep: &BTreeSet<String>, max_bytes: u64) -> Vec<String> {
    let mut total: u64 = entries.iter().map(|e| e.size).sum();
    let mut candidates: Vec<&Entry> = entries.iter().filter(|e| !keep.contains(&e.sha256)).collect();
    candidates.sort_by(|a, b| a.used.cmp(&b.used).then_with(|| a.sha256.cmp(&b.sha256)));
    let mut out = Vec::new();
    for e in candidates {
        if total <= max_bytes {
            break;
        }
        total = total.saturating_sub(e.size);
        out.push(e.sha256.clone());
    }
    out
}

/// What the site needs of its cache now: the latest version staged of each package, and what
/// jobs in progress use (counted, as two jobs may use one artifact).
#[derive(Debug, Default)]
pub struct Usage {
    current: HashMap<String, String>,
    in_use: HashMap<String, usize>,
}

impl Usage {
    /// `packages` (name, sha256) were staged for a job: each is its name's current version.
    pub fn staged<'a>(&mut self, packages: impl IntoIterator<Item = (&'a str, &'a str)>) {
        for (name, sha) in packages {
            self.current.insert(name.to_string(), sha.to_string());
        }
    }

    /// A job starts using `shas`.
    pub fn pin(&mut self, shas: &[String]) {
        for s in shas {
            *self.in_use.entry(s.clone()).or_default() += 1;
        }
    }

    /// A job is done with `shas`.
    pub fn unpin(&mut self, shas: &[String]) {
        for s in shas {
            if let Some(n) = self.in_use.get_mut(s) {
                *n -= 1;
                if *n == 0 {
                    self.in_use.remove(s);
                }
            }
        }
    }

    /// What eviction must leave alone.
    pub fn keep(&self) -> BTreeSet<String> {
        self.current.values().chain(self.in_use.keys()).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn entry(sha: &str, size: u64, used_s: u64) -> Entry {
        Entry { sha256: sha.into(), size, used: SystemTime::UNIX_EPOCH + Duration::from_secs(used_s) }
    }

    #[test]
    fn the_least_recently_used_go_first_until_the_cache_fits() {
        let entries = [entry("a", 40, 3), entry("b", 40, 1), entry("c", 40, 2)];
        assert_eq!(plan(&entries, &BTreeSet::new(), 120), Vec::<String>::new(), "it fits");
        assert_eq!(plan(&entries, &BTreeSet::new(), 80), ["b"]);
        assert_eq!(plan(&entries, &BTreeSet::new(), 10), ["b", "c", "a"]);
    }

    #[test]
    fn what_is_current_or_in_use_is_never_evicted() {
        let entries = [entry("old", 50, 1), entry("cur", 50, 0), entry("busy", 50, 0)];
        let mut usage = Usage::default();
        usage.staged([("kubelet", "cur")]);
        usage.pin(&["busy".to_string()]);
        assert_eq!(plan(&entries, &usage.keep(), 0), ["old"], "over the limit, but the rest is needed");
        usage.unpin(&["busy".to_string()]);
        assert_eq!(plan(&entries, &usage.keep(), 0), ["busy", "old"]);
        // A newer version staged makes the older one evictable.
        usage.staged([("kubelet", "new")]);
        assert!(usage.keep().contains("new") && !usage.keep().contains("cur"));
    }
}
