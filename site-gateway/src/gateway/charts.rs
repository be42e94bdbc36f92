//! A job's helm-chart packages, each turned into its site's render before anything else
//! happens to it: the gateway asks the hub (`landfall.svc.<site>.chart_render`) with what its
//! cluster is, and gets the package back with the render's digest and object standing in for
//! the chart's. The render is then staged into the cache and applied like a container
//! package, in Helm's order. The hub renders with the values the site's design gives; the
//! gateway has no say in them.

use std::time::Duration;

use bus_schema::domain::Package;
use bus_schema::names;
use bus_schema::pb;
use bus_schema::runtime::RequestError;
use prost::Message;

use super::Gateway;
use crate::backend::{BackendError, SiteBackend};

/// How long a render may take at the hub: helm runs there, for a minute at most.
const RENDER_TIMEOUT: Duration = Duration::from_secs(90);

impl<B: SiteBackend> Gateway<B> {
    /// `packages` with each helm-chart package replaced by its site's render (others as they are).
    pub(super) async fn rendered(&self, packages: Vec<Package>) -> Result<Vec<Package>, BackendError> {
        if !packages.iter().any(|p| p.kind == pb::PackageKind::HelmChart) {
            return Ok(packages);
        }
        let facts = self.backend.cluster_facts().await?;
        let mut out = Vec::with_capacity(packages.len());
        for p in packages {
            out.push(if p.kind == pb::PackageKind::HelmChart { self.render(&p, &facts).await? } else { p });
        }
        Ok(out)
    }

    async fn render(&self, chart: &Package, facts: &crate::backend::ClusterFacts) -> Result<Package, BackendError> {
        let what = chart.reference().key();
        let req = pb::ChartRenderRequest {
            site_id: self.site.to_string(),
            name: chart.name.to_string(),
            version: chart.version.to_string(),
            kube_version: facts.kube_version.clone(),
            api_versions: facts.api_versions.clone(),
        };
        let subject = names::chart_render_svc(self.site.as_str());
        let (_, body) =
            self.bus.request(subject, req.encode_to_vec().into(), RENDER_TIMEOUT).await.map_err(|e| match e {
                RequestError::Refused { reason, .. } => {
                    BackendError::permanent_reason(format!("helm chart {what} not rendered for this site: {reason}"))
                }
                e => BackendError::transient(
                    format!("asking the hub to render {what} (is `landfall serve distribution` running?)"),
                    e,
                ),
            })?;
        let reply = pb::ChartRenderReply::decode(body)
            .map_err(|e| BackendError::permanent("the hub's answer is not a ChartRenderReply", e))?;
        let rendered = Package::try_from(reply.package.unwrap_or_default())
            .map_err(|e| BackendError::permanent_reason(format!("the hub's render of {what}: {e}")))?;
        let ours = rendered.render.as_ref().is_some_and(|r| r.site_id == self.site.as_str());
        if rendered.reference() != chart.reference() || !ours {
            return Err(BackendError::permanent_reason(format!(
                "the hub answered {what}'s render with another package"
            )));
        }
        Ok(rendered)
    }
}
