//! What the catalog and the observed state hold, read as a whole: every package reference,
//! and what every node runs.

use super::error::BusError;
use super::kv::Kv;
use crate::names;
use crate::pb;

/// Every package reference in the catalog (`landfall-packages`); entries that no longer
/// validate are skipped.
pub async fn package_refs(packages: &Kv) -> Result<std::collections::BTreeSet<crate::domain::PackageRef>, BusError> {
    Ok(packages
        .scan::<pb::Package>(names::keys::PACKAGE_PREFIX)
        .await?
        .into_iter()
        .filter_map(|(_, p, _)| crate::domain::Package::try_from(p).ok())
        .map(|p| p.reference())
        .collect())
}

/// What nodes run, as observed (`landfall-observed`), one record per node with every package
/// reported for it, for keys starting with `prefix` (e.g. [`names::keys::OBSERVED_PREFIX`]).
pub async fn observed_nodes(observed: &Kv, prefix: &str) -> Result<Vec<pb::NodeObserved>, BusError> {
    Ok(by_node(observed.scan::<pb::ObservedVersion>(prefix).await?))
}

/// [`observed_nodes`] of one site, read key by key ([`Kv::scan_few`]): a site's share of a
/// fleet's bucket is small.
pub async fn site_observed_nodes(observed: &Kv, site: &str) -> Result<Vec<pb::NodeObserved>, BusError> {
    Ok(by_node(observed.scan_few::<pb::ObservedVersion>(&names::keys::observed_site_prefix(site)).await?))
}

fn by_node(entries: Vec<(String, pb::ObservedVersion, u64)>) -> Vec<pb::NodeObserved> {
    let mut nodes: std::collections::BTreeMap<(String, String), pb::NodeObserved> = Default::default();
    for (_, v, _) in entries {
        let n = nodes.entry((v.site_id.clone(), v.node.clone())).or_insert_with(|| pb::NodeObserved {
            site_id: v.site_id.clone(),
            node: v.node.clone(),
            ..Default::default()
        });
        if v.updated_unix_ms > n.updated_unix_ms {
            n.updated_unix_ms = v.updated_unix_ms;
            n.last_event_id = v.event_id.clone();
        }
        n.packages.push(pb::ObservedPackage { name: v.name, version: v.version, kind: v.kind });
    }
    nodes.into_values().collect()
}
