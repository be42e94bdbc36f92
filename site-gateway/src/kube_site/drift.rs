//! Drift: a chart's release at the site checked against the render applied last (kept beside
//! its inventory). Every field the render sets must be in the live object with that value (the
//! server may add fields of its own: defaults, status, metadata); an object the render has and
//! the cluster has not is missing. Hooks are not checked (Helm deletes or leaves them as their
//! policy says). A package that asked for it (`correct_drift`) has what drifted put back, its
//! fields taken back from whoever changed them.

use bus_schema::chart;
use bus_schema::pb;
use serde_json::Value;
use tracing::{info, warn};

use super::KubeSite;
use super::chart::{KEPT_EXTENSION, manifests, read_kept};
use crate::backend::BackendError;

impl KubeSite {
    /// One report per chart the site runs (see the module's comment).
    pub(super) async fn charts_drift(&self) -> Result<Vec<pb::ChartDrifted>, BackendError> {
        let dir = self.kept_renders_dir();
        let mut names = Vec::new();
        let mut entries = match tokio::fs::read_dir(&dir).await {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(BackendError::transient(format!("read {}", dir.display()), e)),
        };
        while let Some(entry) =
            entries.next_entry().await.map_err(|e| BackendError::transient("read the kept renders", e))?
        {
            let path = entry.path();
            if path.extension().is_some_and(|x| x == KEPT_EXTENSION)
                && let Some(name) = path.file_stem().and_then(|s| s.to_str())
            {
                names.push((name.to_string(), path));
            }
        }
        if names.is_empty() {
            return Ok(Vec::new());
        }
        names.sort();
        let cluster = self.applier(self.application_cluster().await?);
        let mut reports = Vec::with_capacity(names.len());
        for (name, path) in names {
            let Some(kept) = read_kept(&path).await else { continue };
            let applier = cluster.in_namespace(&kept.namespace);
            let parts = chart::split(&kept.manifests).map_err(BackendError::permanent_reason)?;
            let checked = manifests(parts.crds.iter().chain(&parts.objects));
            let mut report = pb::ChartDrifted {
                site_id: self.cfg.site.to_string(),
                package: Some(pb::PackageRef { name: name.clone(), version: kept.version.clone() }),
                ..Default::default()
            };
            let mut drifted_objects = Vec::new();
            for (id, wanted, live) in applier.live(&name, &kept.version, &checked).await? {
                match live {
                    None => report.drifted.push(format!("{id}: missing")),
                    Some(live) => {
                        let mut fields = Vec::new();
                        drifted_fields(&wanted, &live, "", &mut fields);
                        if fields.is_empty() {
                            continue;
                        }
                        report.drifted.push(format!("{id}: {}", fields.join(", ")));
                    }
                }
                drifted_objects.push(wanted);
            }
            if !report.drifted.is_empty() && kept.correct_drift {
                match applier.put_back(&name, &kept.version, &manifests(&drifted_objects)).await {
                    Ok(_) => report.corrected = true,
                    Err(e) => report.reason = e.reason(),
                }
            }
            if !report.drifted.is_empty() {
                info!(site = %self.cfg.site, package = %name, drifted = ?report.drifted, corrected = report.corrected, "helm chart drifted");
            }
            if !report.reason.is_empty() {
                warn!(site = %self.cfg.site, package = %name, reason = %report.reason, "drift not put back");
            }
            reports.push(report);
        }
        Ok(reports)
    }
}

/// Where `live` differs from what `wanted` sets, as field paths (`data.greeting`,
/// `spec.template.spec.containers.0.image`); what `live` has besides is not drift.
pub(super) fn drifted_fields(wanted: &Value, live: &Value, at: &str, out: &mut Vec<String>) {
    let path = |k: &str| if at.is_empty() { k.to_string() } else { format!("{at}.{k}") };
    match (wanted, live) {
        (Value::Object(w), Value::Object(l)) => {
            for (k, v) in w {
                match l.get(k) {
                    Some(lv) => drifted_fields(v, lv, &path(k), out),
                    None if v.is_null() => {}
                    None => out.push(path(k)),
                }
            }
        }
        (Value::Array(w), Value::Array(l)) if w.len() == l.len() => {
            for (i, (wv, lv)) in w.iter().zip(l).enumerate() {
                drifted_fields(wv, lv, &path(&i.to_string()), out);
            }
        }
        (w, l) if w != l => out.push(if at.is_empty() { "(all)".into() } else { at.to_string() }),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn drift_is_what_the_render_sets_and_the_cluster_has_otherwise() {
        let wanted = json!({"metadata": {"name": "a", "labels": {"x": "1"}}, "data": {"k": "v", "n": "1"},
                            "spec": {"containers": [{"name": "c", "image": "i:1"}]}});
        // Defaults, status and metadata the server adds are not drift.
        let same = json!({"metadata": {"name": "a", "uid": "u", "labels": {"x": "1", "y": "2"}},
                          "data": {"k": "v", "n": "1", "extra": "e"},
                          "spec": {"containers": [{"name": "c", "image": "i:1", "imagePullPolicy": "IfNotPresent"}]},
                          "status": {}});
        let mut out = Vec::new();
        drifted_fields(&wanted, &same, "", &mut out);
        assert!(out.is_empty(), "{out:?}");
        let changed = json!({"metadata": {"name": "a", "labels": {}}, "data": {"k": "edited", "n": "1"},
                             "spec": {"containers": [{"name": "c", "image": "i:2"}]}});
        drifted_fields(&wanted, &changed, "", &mut out);
        assert_eq!(out, ["data.k", "metadata.labels.x", "spec.containers.0.image"]);
    }
}
