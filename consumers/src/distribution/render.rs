//! Helm charts rendered for a site (`landfall.svc.<site>.chart_render`), by the distribution
//! service: it holds the artifact store the chart archive is in and the render goes to.
//!
//! The site names only the package and what its cluster is (Kubernetes version, served API
//! versions); everything else comes from the hub: the catalog entry (the archive, its release,
//! the package's values) and the site's design (its values for the package, and the facts those
//! values may name). A site's credentials therefore get it its own render and no other, and a
//! site whose design does not run the package gets none.
//!
//! A render is made once per inputs and kept, at `render.<site>.<name>.<version>`: the same
//! inputs get the same render (a chart that makes random values keeps them), and the
//! distribution service sends the site that render's bytes and no other render's.

use std::collections::BTreeMap;

use bus_schema::chart::merge_values;
use bus_schema::domain::SiteDesign;
use bus_schema::names::keys;
use bus_schema::pb;
use bus_schema::runtime::{Kv, Reply, Update};
use bus_schema::trust;
use prost::Message;
use serde_json::Value;
use tracing::info;

use super::artifacts::{ArtifactStore, sha256_hex};
use crate::clock::now_ms;
use crate::helm::{Helm, Template};

/// How many renders of one chart are kept per site (the newest); older records are forgotten
/// (their bytes stay in the store, content-addressed, as every artifact's).
pub const KEPT_RENDERS: usize = 16;
/// The most API versions a render request may name (a large cluster serves a few hundred).
const MAX_API_VERSIONS: usize = 20_000;

/// Renders charts for sites; see the module's comment.
pub struct Renderer {
    /// The helm binary, or why there is none (said to every site that asks).
    pub helm: Result<Helm, String>,
    pub store: ArtifactStore,
    pub packages: Kv,
    pub sites: Kv,
}

impl Renderer {
    /// Answers one render request (see the module's comment).
    pub async fn answer(&self, subject: &str, payload: &[u8]) -> Result<Reply, String> {
        let req: pb::ChartRenderRequest = trust::decode_request(subject, payload)?;
        let package = self.render(&req).await?;
        let reply = pb::ChartRenderReply { package: Some(package) };
        Ok((Default::default(), reply.encode_to_vec().into()))
    }

    /// The site's render of the package, made now or found made with the same inputs.
    pub async fn render(&self, req: &pb::ChartRenderRequest) -> Result<pb::Package, String> {
        let what = format!("{}@{}", req.name, req.version);
        if req.kube_version.len() > 64
            || req.api_versions.len() > MAX_API_VERSIONS
            || req.api_versions.iter().any(|v| v.is_empty() || v.len() > 317)
        {
            return Err(format!(
                "{what}: the cluster's facts are not a Kubernetes version and at most {MAX_API_VERSIONS} API versions"
            ));
        }
        let err = |e: bus_schema::runtime::BusError| e.to_string();
        let catalog = self.packages.get::<pb::Package>(&keys::package(&req.name, &req.version)).await.map_err(err)?;
        let Some((entry, _)) = catalog else { return Err(format!("{what} is not in the catalog")) };
        let chart = match (pb::PackageKind::try_from(entry.kind), &entry.chart) {
            (Ok(pb::PackageKind::HelmChart), Some(chart)) => chart.clone(),
            _ => return Err(format!("{what} is not a helm-chart package")),
        };
        if entry.object_key.is_empty() {
            return Err(format!("{what} has no archive in the artifact store"));
        }
        let design = self.sites.get::<pb::SiteDesign>(&keys::site(&req.site_id)).await.map_err(err)?;
        let Some((design, _)) = design else { return Err(format!("site {} has no design", req.site_id)) };
        let design = SiteDesign::try_from(design).map_err(|e| format!("site {}'s design: {e}", req.site_id))?;
        if !design.all_packages().iter().any(|p| p.name.as_str() == req.name) {
            return Err(format!("site {}'s design does not run {}", req.site_id, req.name));
        }
        let values = site_values(&chart, &design, &req.name)?;
        let helm = self.helm.as_ref().map_err(Clone::clone)?;
        let helm_version = helm.version().await.map_err(|e| e.to_string())?;
        // Asked without the cluster's facts (an operator, or a gateway before its cluster
        // stands): as the site's gateway last reported them.
        let mut asked = (req.kube_version.trim().to_string(), req.api_versions.clone());
        if asked.0.is_empty() && asked.1.is_empty() {
            asked = self.last_reported(&req.site_id).await?;
        }
        let kube_version = match asked.0.as_str() {
            "" => design_kube_version(&design),
            v => Some(v.to_string()),
        };
        let mut api_versions = asked.1;
        api_versions.sort();
        api_versions.dedup();
        let values_digest = sha256_hex(values.to_string().as_bytes());
        let inputs = serde_json::json!([entry.sha256, values_digest, helm_version, kube_version, api_versions]);
        let inputs_digest = sha256_hex(inputs.to_string().as_bytes());
        let key = keys::chart_render(&req.site_id, &req.name, &req.version, &inputs_digest);
        if let Some((kept, _)) = self.packages.get::<pb::Package>(&key).await.map_err(err)? {
            return Ok(kept);
        }

        let scratch = tempfile::Builder::new()
            .prefix("landfall-render-")
            .tempdir()
            .map_err(|e| format!("a scratch directory for {what}: {e}"))?;
        let archive = scratch.path().join("chart.tgz");
        let bytes = self.store.read(&entry.object_key, 0..entry.size).await.map_err(|e| format!("{what}: {e:#}"))?;
        if sha256_hex(&bytes) != entry.sha256 {
            return Err(format!("{what}: the artifact store's archive does not have the catalog's sha256"));
        }
        tokio::fs::write(&archive, &bytes).await.map_err(|e| format!("{what}: {e}"))?;
        let template = Template {
            chart: &archive,
            release: &chart.release,
            namespace: &chart.namespace,
            values: std::slice::from_ref(&values),
            kube_version: kube_version.as_deref(),
            api_versions: &api_versions,
        };
        let rendered = helm.template(&template).await.map_err(|e| format!("{what} for site {}: {e}", req.site_id))?;
        let manifests = rendered.manifests();
        let stored = self
            .store
            .upload(std::io::Cursor::new(manifests.into_bytes()))
            .await
            .map_err(|e| format!("{what}: storing the render: {e:#}"))?;
        let render = pb::ChartRender {
            site_id: req.site_id.clone(),
            chart_sha256: entry.sha256.clone(),
            values_digest,
            helm_version,
            kube_version: kube_version.unwrap_or_default(),
            api_versions,
            inputs_digest: inputs_digest.clone(),
            rendered_at_ms: u64::try_from(now_ms()).unwrap_or_default(),
            values: values.to_string(),
        };
        let made = pb::Package {
            sha256: stored.sha256,
            size: stored.size,
            object_key: stored.object_key,
            render: Some(render),
            ..entry
        };
        // Another replica may have rendered the same inputs meanwhile: its render is the one kept.
        let kept = self
            .packages
            .update_with(&key, |existing: Option<&pb::Package>| match existing {
                Some(e) => Update::Keep(e.clone()),
                None => Update::Put(made.clone(), made.clone()),
            })
            .await
            .map_err(err)?;
        info!(site = %req.site_id, package = %what, sha256 = %kept.sha256, bytes = kept.size, "chart rendered");
        self.forget_old_renders(&req.site_id, &req.name, &key).await?;
        Ok(kept)
    }

    /// Keeps the site's [`KEPT_RENDERS`] latest records of chart `name` (never `made`, the one
    /// just made): a site asking again and again with other cluster facts churns its own
    /// records, not the bucket.
    async fn forget_old_renders(&self, site: &str, name: &str, made: &str) -> Result<(), String> {
        let err = |e: bus_schema::runtime::BusError| e.to_string();
        let mut renders: Vec<(String, u64)> = self
            .packages
            .scan_few::<pb::Package>(&keys::site_renders_prefix(site))
            .await
            .map_err(err)?
            .into_iter()
            .filter(|(key, p, _)| p.name == name && key != made)
            .map(|(key, p, _)| (key, p.render.map_or(0, |r| r.rendered_at_ms)))
            .collect();
        renders.sort_by_key(|(_, at)| std::cmp::Reverse(*at));
        for (key, _) in renders.into_iter().skip(KEPT_RENDERS - 1) {
            self.packages.purge(&key).await.map_err(err)?;
        }
        Ok(())
    }

    /// The Kubernetes version and API versions of the site's latest render.
    async fn last_reported(&self, site: &str) -> Result<(String, Vec<String>), String> {
        let renders =
            self.packages.scan_few::<pb::Package>(&keys::site_renders_prefix(site)).await.map_err(|e| e.to_string())?;
        let latest = renders.into_iter().filter_map(|(_, p, _)| p.render).max_by_key(|r| r.rendered_at_ms);
        Ok(latest.map(|r| (r.kube_version, r.api_versions)).unwrap_or_default())
    }

    /// Whether `wanted` is one of the site's renders of its chart (the only renders the site is
    /// sent).
    pub async fn is_render_of(&self, site: &str, wanted: &pb::Package) -> Result<bool, String> {
        let Some(render) = &wanted.render else { return Ok(false) };
        let key = keys::chart_render(site, &wanted.name, &wanted.version, &render.inputs_digest);
        let kept = self.packages.get::<pb::Package>(&key).await.map_err(|e| e.to_string())?;
        Ok(kept.is_some_and(|(k, _)| k.sha256 == wanted.sha256 && k.object_key == wanted.object_key))
    }
}

/// The values a site renders `chart` with: the package's, then the site design's, each
/// `${…}` fact in them replaced by the site's.
fn site_values(chart: &pb::HelmChart, design: &SiteDesign, name: &str) -> Result<Value, String> {
    let package: Value = match chart.values.trim() {
        "" => Value::Object(Default::default()),
        text => bus_schema::yaml::from_str(text).map_err(|e| format!("{name}'s values: {e}"))?,
    };
    let site = design.values.get(name).cloned().unwrap_or(Value::Object(Default::default()));
    let merged = merge_values(&package, &site);
    with_facts(&merged, &facts(design)).map_err(|e| format!("{name}'s values for site {}: {e}", design.site))
}

/// What values may name: `${site.id}`, `${site.label.<key>}`, `${cluster.endpoint}`.
fn facts(design: &SiteDesign) -> BTreeMap<String, String> {
    let mut facts = BTreeMap::from([("site.id".to_string(), design.site.to_string())]);
    for (k, v) in &design.labels {
        facts.insert(format!("site.label.{k}"), v.clone());
    }
    if let Some(endpoint) = &design.cluster.endpoint {
        facts.insert("cluster.endpoint".into(), format!("{}:{}", endpoint.host, endpoint.port));
    }
    facts
}

/// `value` with every `${fact}` in its strings replaced.
///
/// # Errors
/// A fact the site does not have, named.
fn with_facts(value: &Value, facts: &BTreeMap<String, String>) -> Result<Value, String> {
    Ok(match value {
        Value::String(s) => Value::String(substitute(s, facts)?),
        Value::Array(items) => Value::Array(items.iter().map(|v| with_facts(v, facts)).collect::<Result<_, _>>()?),
        Value::Object(map) => Value::Object(
            map.iter().map(|(k, v)| Ok((k.clone(), with_facts(v, facts)?))).collect::<Result<_, String>>()?,
        ),
        other => other.clone(),
    })
}

fn substitute(text: &str, facts: &BTreeMap<String, String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let Some(end) = rest[at..].find('}') else {
            return Err(format!("{text:?} opens ${{ and does not close it"));
        };
        let name = &rest[at + 2..at + end];
        match facts.get(name) {
            Some(v) => out.push_str(v),
            None => {
                let known: Vec<&str> = facts.keys().map(String::as_str).collect();
                return Err(format!(
                    "{text:?} names ${{{name}}}, which the site has not (it has {})",
                    known.join(", ")
                ));
            }
        }
        rest = &rest[at + end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The Kubernetes version a site's design runs: its kubelet package's.
fn design_kube_version(design: &SiteDesign) -> Option<String> {
    design.all_packages().into_iter().find(|p| p.name.as_str() == "kubelet").map(|p| p.version.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facts_are_replaced_and_an_unknown_one_is_named() {
        let facts = BTreeMap::from([("site.id".to_string(), "edge-01".to_string())]);
        let v = serde_json::json!({"name": "${site.id}-cni", "n": 1, "list": ["a ${site.id}"]});
        assert_eq!(
            with_facts(&v, &facts).unwrap(),
            serde_json::json!({"name": "edge-01-cni", "n": 1, "list": ["a edge-01"]})
        );
        let e = with_facts(&serde_json::json!({"x": "${site.label.rack}"}), &facts).unwrap_err();
        assert!(e.contains("${site.label.rack}") && e.contains("site.id"), "{e}");
    }
}
