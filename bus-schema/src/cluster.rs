//! How a site's cluster is built from its hosts: by ICN's Binary Provisioning Agent, or by
//! Cluster API with its Metal3 provider (CAPM3) and kubeadm, as sites are built today. For
//! Cluster API, where the Kubernetes API is served and how each node set is replaced when it
//! rolls, with the rules Cluster API's admission webhooks enforce, checked here so that a design
//! they would refuse is refused before anything is written at the site.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::domain::InvalidField;
use crate::pb;

/// What builds a site's cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Builder {
    /// ICN's BPA: `Provisioning` and `Software` resources, kubespray underneath.
    #[default]
    Bpa,
    /// Cluster API: `Cluster`, `KubeadmControlPlane`, `MachineDeployment`s and CAPM3's templates.
    Capi,
}

impl Builder {
    pub fn as_str(self) -> &'static str {
        match self {
            Builder::Bpa => "bpa",
            Builder::Capi => "capi",
        }
    }
}

/// The port the Kubernetes API is served on unless the design names another.
pub const API_PORT: u16 = 6443;

fn api_port() -> u16 {
    API_PORT
}

/// Where a Cluster API site's control plane is reached: an address on the API network that no
/// host holds (the masters share it), and its port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApiEndpoint {
    pub host: IpAddr,
    #[serde(default = "api_port")]
    pub port: u16,
}

/// How one node set rolls under Cluster API. Unset values take the defaults of bare metal
/// without spare hosts ([`ClusterBuild::with_defaults`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeSetRollout {
    /// Machines made beyond the set's count while it rolls: each claims a spare host.
    #[serde(default)]
    pub max_surge: Option<u32>,
    /// Machines of the set taken away at once while it rolls (workers only).
    #[serde(default)]
    pub max_unavailable: Option<u32>,
    /// Spare hosts enrolled for the set (a design's `standby`), which a surge claims.
    #[serde(default)]
    pub spare: u32,
}

/// How a site's cluster is built. The default is the BPA, as for every site before the choice.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterBuild {
    #[serde(default)]
    pub builder: Builder,
    /// Cluster API: the control plane's endpoint.
    #[serde(default)]
    pub endpoint: Option<ApiEndpoint>,
    #[serde(default)]
    pub masters: NodeSetRollout,
    #[serde(default)]
    pub workers: NodeSetRollout,
}

impl ClusterBuild {
    /// Whether Cluster API builds the cluster.
    pub fn is_capi(&self) -> bool {
        self.builder == Builder::Capi
    }

    /// The build with every Cluster API default written out, for a control plane of `masters`
    /// nodes: on bare metal a replacement needs a free host, so masters are taken out before
    /// their replacement comes (surge 0) from three up, where etcd keeps its quorum with one
    /// out; fewer masters are replaced by a new one on a spare host first (surge 1). Workers go
    /// one at a time with no surge. A BPA build is left as it is.
    pub fn with_defaults(mut self, masters: usize) -> Self {
        if !self.is_capi() {
            return self;
        }
        let master_surge = if masters >= 3 { 0 } else { 1 };
        self.masters.max_surge = Some(self.masters.max_surge.unwrap_or(master_surge));
        self.workers.max_surge = Some(self.workers.max_surge.unwrap_or(0));
        self.workers.max_unavailable = Some(self.workers.max_unavailable.unwrap_or(1));
        self
    }

    /// Every reason the build cannot be used for a site of `masters` control-plane nodes, each
    /// under the design field a person changes (`cluster.…`): the rules Cluster API's webhooks
    /// enforce, and what bare metal adds (a surge claims a spare host). Checked on the build
    /// with its defaults written out; a BPA build may set none of Cluster API's fields.
    pub fn problems(&self, masters: usize) -> Vec<InvalidField> {
        let mut out = Vec::new();
        if !self.is_capi() {
            let capi_only = [
                ("cluster.endpoint", self.endpoint.is_some()),
                ("cluster.masters.maxSurge", self.masters.max_surge.is_some()),
                ("cluster.masters.maxUnavailable", self.masters.max_unavailable.is_some()),
                ("cluster.workers.maxSurge", self.workers.max_surge.is_some()),
                ("cluster.workers.maxUnavailable", self.workers.max_unavailable.is_some()),
            ];
            for (field, set) in capi_only {
                if set {
                    out.push(InvalidField::new(field, "applies to a Cluster API site only (builder: capi)"));
                }
            }
            return out;
        }
        let build = self.clone().with_defaults(masters);
        if build.endpoint.is_none() {
            out.push(InvalidField::new(
                "cluster.endpoint",
                "a Cluster API site needs its control plane's endpoint: an address on the API network that no \
                 host holds, e.g. { host: 10.0.0.5 }",
            ));
        }
        if masters.is_multiple_of(2) {
            out.push(InvalidField::new(
                "cluster.masters.count",
                format!(
                    "{masters} masters: Cluster API's KubeadmControlPlane refuses an even number while etcd runs \
                     on the masters (an even count tolerates no more failures than one fewer); use {} or {}",
                    masters.saturating_sub(1).max(1),
                    masters + 1
                ),
            ));
        }
        let surge = build.masters.max_surge.unwrap_or_default();
        match surge {
            0 if masters < 3 => out.push(InvalidField::new(
                "cluster.masters.maxSurge",
                format!(
                    "0 takes a master out before its replacement comes, which etcd survives from 3 masters up, \
                     not with {masters}: use maxSurge 1 with a spare host (masters.standby: 1)"
                ),
            )),
            0 => {}
            1 if build.masters.spare < 1 => out.push(InvalidField::new(
                "cluster.masters.maxSurge",
                "1 makes each master's replacement before the master goes, on a free host: give the masters a \
                 spare host matching their selector (masters.standby: 1), or use maxSurge 0 with 3 masters or more",
            )),
            1 => {}
            n => out.push(InvalidField::new(
                "cluster.masters.maxSurge",
                format!("{n}: KubeadmControlPlane replaces masters one at a time, so maxSurge is 0 or 1"),
            )),
        }
        if self.masters.max_unavailable.is_some() {
            out.push(InvalidField::new(
                "cluster.masters.maxUnavailable",
                "KubeadmControlPlane has no maxUnavailable: a master goes only once its replacement is ready, or \
                 (maxSurge 0) one at a time",
            ));
        }
        let (surge, unavailable) =
            (build.workers.max_surge.unwrap_or_default(), build.workers.max_unavailable.unwrap_or_default());
        if surge == 0 && unavailable == 0 {
            out.push(InvalidField::new(
                "cluster.workers.maxUnavailable",
                "0 with maxSurge 0 would never replace a worker: Cluster API's MachineDeployment refuses both 0",
            ));
        }
        if surge > build.workers.spare {
            out.push(InvalidField::new(
                "cluster.workers.maxSurge",
                format!(
                    "{surge} makes that many workers beyond the count, each on a free host, but the workers have {} \
                     spare (workers.standby)",
                    build.workers.spare
                ),
            ));
        }
        out
    }
}

impl From<&NodeSetRollout> for pb::NodeSetRollout {
    fn from(r: &NodeSetRollout) -> Self {
        Self {
            max_surge: r.max_surge.unwrap_or_default(),
            max_unavailable: r.max_unavailable.unwrap_or_default(),
            spare: r.spare,
        }
    }
}

impl From<&ClusterBuild> for pb::ClusterBuild {
    fn from(b: &ClusterBuild) -> Self {
        Self {
            builder: match b.builder {
                Builder::Bpa => pb::ClusterBuilder::Bpa,
                Builder::Capi => pb::ClusterBuilder::Capi,
            } as i32,
            endpoint_host: b.endpoint.map(|e| e.host.to_string()).unwrap_or_default(),
            endpoint_port: b.endpoint.map_or(0, |e| u32::from(e.port)),
            masters: Some((&b.masters).into()),
            workers: Some((&b.workers).into()),
        }
    }
}

impl TryFrom<pb::ClusterBuild> for ClusterBuild {
    type Error = InvalidField;
    fn try_from(b: pb::ClusterBuild) -> Result<Self, InvalidField> {
        let builder = match pb::ClusterBuilder::try_from(b.builder) {
            Ok(pb::ClusterBuilder::Unspecified | pb::ClusterBuilder::Bpa) => Builder::Bpa,
            Ok(pb::ClusterBuilder::Capi) => Builder::Capi,
            Err(_) => return Err(InvalidField::new("cluster.builder", format!("unknown builder {}", b.builder))),
        };
        if builder == Builder::Bpa {
            return Ok(Self::default());
        }
        let endpoint = match b.endpoint_host.as_str() {
            "" => None,
            host => Some(ApiEndpoint {
                host: host.parse().map_err(|_| {
                    InvalidField::new("cluster.endpoint_host", format!("{host:?} is not an IP address"))
                })?,
                port: u16::try_from(b.endpoint_port)
                    .ok()
                    .filter(|p| *p > 0)
                    .ok_or_else(|| InvalidField::new("cluster.endpoint_port", "must be a port, 1 to 65535"))?,
            }),
        };
        let rollout = |r: Option<pb::NodeSetRollout>| {
            let r = r.unwrap_or_default();
            NodeSetRollout { max_surge: Some(r.max_surge), max_unavailable: Some(r.max_unavailable), spare: r.spare }
        };
        let mut masters = rollout(b.masters);
        // The control plane has none; a default written out as 0 is not one.
        masters.max_unavailable = None;
        Ok(Self { builder, endpoint, masters, workers: rollout(b.workers) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capi(masters: NodeSetRollout, workers: NodeSetRollout) -> ClusterBuild {
        ClusterBuild {
            builder: Builder::Capi,
            endpoint: Some(ApiEndpoint { host: "10.0.0.5".parse().unwrap(), port: API_PORT }),
            masters,
            workers,
        }
    }

    fn fields(problems: Vec<InvalidField>) -> Vec<String> {
        problems.into_iter().map(|p| format!("{}: {}", p.field, p.reason)).collect()
    }

    #[test]
    fn defaults_fit_bare_metal_without_spare_hosts() {
        let three = capi(NodeSetRollout::default(), NodeSetRollout::default()).with_defaults(3);
        assert_eq!(three.masters.max_surge, Some(0));
        assert_eq!((three.workers.max_surge, three.workers.max_unavailable), (Some(0), Some(1)));
        assert!(three.problems(3).is_empty(), "{:?}", three.problems(3));
        // One master is replaced on a spare host first: without one, the design says so.
        let one = capi(NodeSetRollout::default(), NodeSetRollout::default());
        assert_eq!(one.clone().with_defaults(1).masters.max_surge, Some(1));
        let got = fields(one.problems(1));
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(got[0].starts_with("cluster.masters.maxSurge: 1 makes each master's replacement"), "{got:?}");
        let spare = capi(NodeSetRollout { spare: 1, ..Default::default() }, NodeSetRollout::default());
        assert!(spare.problems(1).is_empty());
    }

    #[test]
    fn what_cluster_apis_webhooks_refuse_is_refused_with_a_reason() {
        let surge = |n| NodeSetRollout { max_surge: Some(n), spare: 1, ..Default::default() };
        let got = fields(capi(surge(0), NodeSetRollout::default()).problems(2));
        assert!(got[0].starts_with("cluster.masters.count: 2 masters: Cluster API's KubeadmControlPlane"), "{got:?}");
        assert!(got[0].ends_with("use 1 or 3"), "{got:?}");
        assert!(got[1].starts_with("cluster.masters.maxSurge: 0 takes a master out"), "{got:?}");
        let got = fields(capi(surge(2), NodeSetRollout::default()).problems(3));
        assert_eq!(
            got,
            ["cluster.masters.maxSurge: 2: KubeadmControlPlane replaces masters one at a time, so maxSurge is 0 or 1"]
        );
        let frozen = NodeSetRollout { max_surge: Some(0), max_unavailable: Some(0), spare: 0 };
        let got = fields(capi(NodeSetRollout::default(), frozen).problems(3));
        assert!(got[0].contains("Cluster API's MachineDeployment refuses both 0"), "{got:?}");
        let surging = NodeSetRollout { max_surge: Some(2), max_unavailable: Some(0), spare: 1 };
        let got = fields(capi(NodeSetRollout::default(), surging).problems(3));
        assert!(got[0].starts_with("cluster.workers.maxSurge: 2 makes that many workers"), "{got:?}");
        let mut no_endpoint = capi(NodeSetRollout::default(), NodeSetRollout::default());
        no_endpoint.endpoint = None;
        assert!(fields(no_endpoint.problems(3))[0].starts_with("cluster.endpoint: a Cluster API site needs"));
    }

    #[test]
    fn a_bpa_site_sets_none_of_cluster_apis_fields() {
        let mut bpa = ClusterBuild::default();
        assert!(bpa.problems(2).is_empty(), "two BPA masters are the BPA's business");
        bpa.workers.max_surge = Some(1);
        assert_eq!(
            fields(bpa.problems(1)),
            ["cluster.workers.maxSurge: applies to a Cluster API site only (builder: capi)"]
        );
    }

    #[test]
    fn a_build_crosses_the_bus_with_its_defaults_written_out() {
        let build = capi(NodeSetRollout { spare: 1, ..Default::default() }, NodeSetRollout::default()).with_defaults(1);
        let back = ClusterBuild::try_from(pb::ClusterBuild::from(&build)).unwrap();
        assert_eq!(back, build);
        assert_eq!(ClusterBuild::try_from(pb::ClusterBuild::default()).unwrap(), ClusterBuild::default());
        let bad = pb::ClusterBuild { builder: 2, endpoint_host: "api.example".into(), ..Default::default() };
        assert_eq!(ClusterBuild::try_from(bad).unwrap_err().field, "cluster.endpoint_host");
    }
}
