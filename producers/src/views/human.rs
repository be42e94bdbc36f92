//! Values as people read them, in tables, lines and JSON views alike: times, sizes,
//! durations, counts, package kinds and roles.

use bus_schema::pb;

/// A time as RFC 3339.
pub fn rfc3339(t: time::OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}

/// A Unix time in milliseconds as RFC 3339, to the second; "" for 0 (never).
pub fn rfc3339_ms(unix_ms: i64) -> String {
    if unix_ms <= 0 {
        return String::new();
    }
    time::OffsetDateTime::from_unix_timestamp(unix_ms / 1000).map(rfc3339).unwrap_or_default()
}

/// A byte count for people: `512 B`, `1.5 KiB`, `20.0 MiB`.
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// A duration in milliseconds for people: `850ms`, `12.3s`, `4m05s`, `1h02m`.
pub fn human_duration_ms(ms: i64) -> String {
    let ms = ms.max(0);
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..60_000 => format!("{:.1}s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{}m{:02}s", ms / 60_000, ms % 60_000 / 1000),
        _ => format!("{}h{:02}m", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

/// `1 node`, `2 nodes`.
pub fn plural(n: impl Into<u64>, one: &str, many: &str) -> String {
    let n = n.into();
    format!("{n} {}", if n == 1 { one } else { many })
}

/// A package kind as people say it (`os-image`), for tables and JSON views.
pub fn kind_label(kind: i32) -> &'static str {
    pb::PackageKind::try_from(kind).map(pb::PackageKind::label).unwrap_or("unspecified")
}

/// A role as people say it (`master`), for tables and JSON views.
pub fn role_label(role: i32) -> &'static str {
    pb::Role::try_from(role).map(pb::Role::label).unwrap_or("unspecified")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations_for_people() {
        assert_eq!(human_size(0), "0 B");
        assert_eq!(human_size(1023), "1023 B");
        assert_eq!(human_size(1536), "1.5 KiB");
        assert_eq!(human_size(20 * 1024 * 1024), "20.0 MiB");
        assert_eq!(human_size(3 * 1024 * 1024 * 1024), "3.0 GiB");
        assert_eq!(human_duration_ms(850), "850ms");
        assert_eq!(human_duration_ms(12_345), "12.3s");
        assert_eq!(human_duration_ms(245_000), "4m05s");
        assert_eq!(human_duration_ms(3_720_000), "1h02m");
        assert_eq!(rfc3339_ms(0), "");
        assert_eq!(rfc3339_ms(1_700_000_000_999), "2023-11-14T22:13:20Z");
    }
}
