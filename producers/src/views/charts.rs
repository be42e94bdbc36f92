//! The helm charts rendered for a site, as the hub keeps them (`render.<site>.…` in
//! `landfall-packages`): the latest render of each chart, and what it was made of. Read by
//! `landfall status SITE` and `GET /v1/sites/{site}/charts`.

use bus_schema::names::{self, keys};
use bus_schema::pb;
use bus_schema::runtime::Bus;
use serde_json::json;

/// The helm charts rendered for the site: the latest render of each, and what it was made of.
pub async fn site_charts(bus: &Bus, site: &str) -> anyhow::Result<serde_json::Value> {
    let packages = bus.kv(names::PACKAGES_BUCKET).await?;
    let mut latest: std::collections::BTreeMap<String, pb::Package> = Default::default();
    for (_, p, _) in packages.scan_few::<pb::Package>(&keys::site_renders_prefix(site)).await? {
        let at = |p: &pb::Package| p.render.as_ref().map_or(0, |r| r.rendered_at_ms);
        if latest.get(&p.name).is_none_or(|l| at(l) < at(&p)) {
            latest.insert(p.name.clone(), p);
        }
    }
    Ok(latest
        .values()
        .map(|p| {
            let r = p.render.clone().unwrap_or_default();
            json!({
                "name": p.name,
                "version": p.version,
                "chart_sha256": r.chart_sha256,
                "values_digest": r.values_digest,
                "helm_version": r.helm_version,
                "kube_version": r.kube_version,
                "render_sha256": p.sha256,
                "rendered_at_ms": r.rendered_at_ms,
            })
        })
        .collect())
}
