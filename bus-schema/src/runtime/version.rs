//! Which nats-server versions landfall works with.

/// The oldest nats-server landfall works with. The hub's configuration isolates each leaf
/// node's interest from the others (`isolate_leafnode_interest`, new in 2.12.0), which older
/// servers refuse to start with; older still (before 2.10.8) lack the account-info fields KV
/// creation needs and ignore multi-subject consumer filters.
pub const MIN_SERVER_VERSION: (u64, u64, u64) = (2, 12, 0);
/// Parses `2.10.27`, `v2.11.0-RC.1` and the like.
pub fn parse_server_version(v: &str) -> Option<(u64, u64, u64)> {
    let core = v.trim().trim_start_matches('v').split(['-', '+']).next()?;
    let mut parts = core.split('.').map(|p| p.parse::<u64>());
    Some((parts.next()?.ok()?, parts.next()?.ok()?, parts.next().unwrap_or(Ok(0)).ok()?))
}

/// Whether a server of this version is supported.
pub fn server_supported(version: &str) -> bool {
    parse_server_version(version).is_some_and(|v| v >= MIN_SERVER_VERSION)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_versions() {
        assert!(!server_supported("2.9.10"));
        assert!(!server_supported("2.10.27"));
        assert!(!server_supported("v2.11.0"));
        assert!(server_supported("2.12.0"));
        assert!(server_supported("v2.12.1-RC.1"));
        assert!(server_supported("2.15.1"));
        assert!(!server_supported("garbage"));
    }
}
