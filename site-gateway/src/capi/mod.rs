//! Cluster API sites: the objects a site's design becomes ([`render`]), and what Cluster API
//! and CAPM3 show of them ([`observe`]): which host each machine claimed, each host's Metal3
//! state, and whether the build stands at its target.

pub mod observe;
pub mod render;

pub use observe::{Observed, Progress, observe};
pub use render::{
    RenderError, RenderSettings, control_plane_name, kubernetes_version, render, template_base, template_name,
};

/// The API groups and version landfall writes.
pub const CLUSTER_GROUP: &str = "cluster.x-k8s.io";
pub const CONTROL_PLANE_GROUP: &str = "controlplane.cluster.x-k8s.io";
pub const BOOTSTRAP_GROUP: &str = "bootstrap.cluster.x-k8s.io";
pub const INFRASTRUCTURE_GROUP: &str = "infrastructure.cluster.x-k8s.io";
pub const VERSION: &str = "v1beta2";

/// The Cluster API and CAPM3 releases whose `v1beta2` APIs the objects are written for.
pub const CLUSTER_API_RELEASE: &str = "1.13";
pub const CAPM3_RELEASE: &str = "1.13";

/// The label landfall puts on each host it enrolls, which the templates select hosts by.
pub const HOST_ROLE_LABEL: &str = "landfall.io/role";
/// The label every rendered object carries, naming its site.
pub const SITE_LABEL: &str = "landfall.io/site";
