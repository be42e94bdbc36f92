//! The package catalog as `package list` shows it: entries sorted by name and version, each
//! with whether its name rolls out on its own.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use bus_schema::pb;
use bus_schema::rollout;
use serde_json::{Value, json};

use super::human::{human_size, kind_label};

/// One catalog entry as `package list` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct CatalogRow {
    pub package: pb::Package,
    pub auto_rollout: bool,
}

/// Catalog entries sorted by name then version, each with whether its name rolls out on its own.
pub fn catalog_rows(mut packages: Vec<pb::Package>, policies: &[pb::PackagePolicy]) -> Vec<CatalogRow> {
    let auto: BTreeSet<&str> = policies
        .iter()
        .filter(|p| p.auto_rollout.as_ref().is_some_and(|a| a.enabled))
        .map(|p| p.name.as_str())
        .collect();
    packages.sort_by(|a, b| {
        a.name
            .cmp(&b.name)
            .then_with(|| rollout::version_cmp(&a.version, &b.version))
            .then_with(|| a.version.cmp(&b.version))
    });
    packages.into_iter().map(|p| CatalogRow { auto_rollout: auto.contains(p.name.as_str()), package: p }).collect()
}

/// The catalog as JSON, one object per entry.
pub fn catalog_json(rows: &[CatalogRow]) -> Value {
    Value::Array(
        rows.iter()
            .map(|r| {
                let p = &r.package;
                json!({
                    "name": p.name,
                    "version": p.version,
                    "kind": kind_label(p.kind),
                    "size": p.size,
                    "sha256": p.sha256,
                    "object_key": p.object_key,
                    "auto_rollout": r.auto_rollout,
                })
            })
            .collect(),
    )
}

/// The catalog as a table.
pub fn catalog_text(rows: &[CatalogRow]) -> String {
    if rows.is_empty() {
        return "the catalog is empty (landfall package register …)\n".to_string();
    }
    let mut out = String::new();
    let w = rows.iter().map(|r| r.package.name.len()).max().unwrap_or(0).max(4);
    let v = rows.iter().map(|r| r.package.version.len()).max().unwrap_or(0).max(7);
    let _ = writeln!(
        out,
        "{:<w$}  {:<v$}  {:<9}  {:>10}  {:<12}  AUTO-ROLLOUT",
        "NAME", "VERSION", "KIND", "SIZE", "SHA256"
    );
    for r in rows {
        let p = &r.package;
        let sha: String = p.sha256.chars().take(12).collect();
        let auto = if r.auto_rollout { "yes" } else { "-" };
        let _ = writeln!(
            out,
            "{:<w$}  {:<v$}  {:<9}  {:>10}  {:<12}  {auto}",
            p.name,
            p.version,
            kind_label(p.kind),
            human_size(p.size),
            sha
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pkg(name: &str, version: &str, size: u64) -> pb::Package {
        pb::Package {
            name: name.into(),
            version: version.into(),
            kind: pb::PackageKind::Binary as i32,
            sha256: "0123456789abcdef".repeat(4),
            size,
            object_key: format!("{name}/{version}"),
            chart: None,
            render: None,
        }
    }

    #[test]
    fn catalog_rows_are_sorted_and_flag_auto_rollout() {
        let policies = vec![
            pb::PackagePolicy {
                name: "kubelet".into(),
                auto_rollout: Some(pb::AutoRollout { enabled: true, ..Default::default() }),
                ..Default::default()
            },
            pb::PackagePolicy {
                name: "ubuntu".into(),
                auto_rollout: Some(pb::AutoRollout { enabled: false, ..Default::default() }),
                ..Default::default()
            },
        ];
        let rows = catalog_rows(
            vec![pkg("kubelet", "1.10.0", 1536), pkg("ubuntu", "22.04", 10), pkg("kubelet", "1.9.0", 1)],
            &policies,
        );
        let order: Vec<_> = rows.iter().map(|r| (r.package.name.as_str(), r.package.version.as_str())).collect();
        assert_eq!(order, [("kubelet", "1.9.0"), ("kubelet", "1.10.0"), ("ubuntu", "22.04")]);
        assert_eq!(rows.iter().map(|r| r.auto_rollout).collect::<Vec<_>>(), [true, true, false]);
        let text = catalog_text(&rows);
        let line = text.lines().nth(2).unwrap();
        assert!(line.contains("1.5 KiB") && line.contains("0123456789ab ") && line.ends_with("yes"), "{line}");
        assert!(!text.contains("0123456789abc"), "sha256 cut at 12: {text}");
        let json = catalog_json(&rows);
        assert_eq!(json[2]["auto_rollout"], false);
        assert_eq!(json[0]["kind"], "binary");
        assert_eq!(json[0]["sha256"].as_str().unwrap().len(), 64, "JSON keeps the whole digest");
        assert!(catalog_text(&[]).contains("empty"));
    }
}
