//! The wall clock, as KV records store times. Only executors read it; decisions take `now`.

/// Milliseconds since the Unix epoch, as KV records store times.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}
