//! Which nats-server versions landfall works with.

/// The oldest nats-server landfall works with. Older servers lack the account-info fields
/// KV creation needs and ignore multi-subject consumer filters.
pub const MIN_SERVER_VERSION: (u64, u64, u64) = (2, 10, 8);
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
        assert!(!server_supported("2.10.7"));
        assert!(server_supported("2.10.8"));
        assert!(server_supported("v2.11.0-RC.1"));
        assert!(server_supported("2.15.1"));
        assert!(!server_supported("garbage"));
    }
}
