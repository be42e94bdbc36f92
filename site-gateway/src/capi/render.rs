//! A Cluster API site's objects, rendered from its design: what the gateway applies in the
//! site's bootstrap cluster for Cluster API (1.13, `v1beta2`) and its Metal3 provider CAPM3
//! (1.13, `v1beta2`) to build the cluster, and what `landfall site render` prints. Pure: the
//! same design, catalog and settings give the same objects, byte for byte.
//!
//! - `Cluster` and `Metal3Cluster`: the control plane's endpoint from the design.
//! - the masters: a `KubeadmControlPlane` (replicas, the Kubernetes version of the masters'
//!   kubelet, the rollout's `maxSurge`) over a `Metal3MachineTemplate` (the masters' os-image
//!   with its sha256, a `hostSelector` on the role landfall marks the hosts it enrolls with,
//!   cleaning as the design says);
//! - the workers: a `MachineDeployment` (replicas, version, `maxSurge` / `maxUnavailable`) over a
//!   `KubeadmConfigTemplate` and a `Metal3MachineTemplate`;
//! - a `Metal3DataTemplate` naming each node after its host, so a Node is called what the
//!   design calls it. A host's network data stays the `networkData` Secret the gateway writes
//!   when it enrolls the host, as for every site.
//!
//! Templates are immutable to Cluster API: each is named by a hash of its content, so a change
//! (a new image, a new version) is a new template and one write to the object that uses it.
//! Every value Cluster API would default is written out.

use bus_schema::domain::{Package, PackageRef, Role, SiteDesign};
use bus_schema::pb::{CleaningMode, PackageKind};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::*;

/// Where and how the site's objects are written: what the gateway's flags say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderSettings {
    /// The bootstrap cluster's namespace the hosts and objects are in.
    pub namespace: String,
    /// The cluster's name (its kubeconfig Secret is `<cluster>-kubeconfig`).
    pub cluster: String,
    /// Where Ironic downloads os-images from; the image URL is this followed by `sha256/<hex>`.
    pub image_base_url: String,
    /// The pods' network.
    pub pod_subnet: String,
    /// The services' network.
    pub service_subnet: String,
}

impl RenderSettings {
    /// The settings of a site's gateway by default (`landfall-gateway --backend kube`).
    pub fn new(site: &str) -> Self {
        Self {
            namespace: "metal3".into(),
            cluster: site.to_string(),
            image_base_url: "http://localhost:8080/".into(),
            pod_subnet: "10.244.64.0/18".into(),
            service_subnet: "10.96.0.0/12".into(),
        }
    }
}

/// Why a site's design cannot become Cluster API objects.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    #[error("site {0} is built by the BPA, not Cluster API (its design's cluster.builder)")]
    NotCapi(String),
    #[error("site {0} has no control-plane endpoint (cluster.endpoint): Cluster API needs one")]
    NoEndpoint(String),
    #[error("the {role}s of {site} run no {what}: Cluster API needs {why}")]
    Missing { site: String, role: &'static str, what: &'static str, why: &'static str },
    #[error("the catalog lacks {packages} (the {role}s' os-image among them?): an image is checked against its sha256")]
    NotInCatalog { role: &'static str, packages: String },
}

/// The objects of `design`'s cluster, in the order they are applied (what others refer to
/// first). `catalog` finds a package's entry (for the os-image's sha256).
///
/// # Errors
/// When the site is not built by Cluster API, has no endpoint, or a role lacks its os-image or
/// kubelet (or the catalog the image).
pub fn render(
    design: &SiteDesign,
    catalog: impl Fn(&PackageRef) -> Option<Package>,
    settings: &RenderSettings,
) -> Result<Vec<Value>, RenderError> {
    let site = design.site.as_str();
    let build = &design.cluster;
    if !build.is_capi() {
        return Err(RenderError::NotCapi(site.to_string()));
    }
    let endpoint = build.endpoint.ok_or_else(|| RenderError::NoEndpoint(site.to_string()))?;
    let masters = design.nodes.iter().filter(|n| n.role == Role::Master).count();
    let workers = design.nodes.iter().filter(|n| n.role == Role::Worker).count();
    let r = Renderer { design, settings, catalog: &catalog };
    let name = settings.cluster.as_str();
    let endpoint = json!({ "host": endpoint.host.to_string(), "port": endpoint.port });

    let mut out = Vec::new();
    out.push(r.object(
        CLUSTER_GROUP,
        "Cluster",
        name,
        json!({
            "paused": false,
            "clusterNetwork": {
                "apiServerPort": endpoint["port"],
                "pods": { "cidrBlocks": [settings.pod_subnet] },
                "services": { "cidrBlocks": [settings.service_subnet] },
                "serviceDomain": "cluster.local",
            },
            "controlPlaneEndpoint": endpoint,
            "controlPlaneRef": reference(CONTROL_PLANE_GROUP, "KubeadmControlPlane", &control_plane_name(name)),
            "infrastructureRef": reference(INFRASTRUCTURE_GROUP, "Metal3Cluster", name),
        }),
    ));
    out.push(r.object(
        INFRASTRUCTURE_GROUP,
        "Metal3Cluster",
        name,
        json!({ "controlPlaneEndpoint": endpoint, "cloudProviderEnabled": false }),
    ));
    let data = r.template(
        INFRASTRUCTURE_GROUP,
        "Metal3DataTemplate",
        &format!("{name}-nodes"),
        json!({
            "clusterName": name,
            "metaData": { "objectNames": [
                { "key": "local-hostname", "object": "baremetalhost" },
                { "key": "name", "object": "baremetalhost" },
            ] },
        }),
    );
    let data_name = object_name(&data);
    out.push(data);

    let version = r.kubernetes_version(Role::Master)?;
    let masters_hosts = r.machine_template(Role::Master, &data_name)?;
    let masters_hosts_name = object_name(&masters_hosts);
    out.push(masters_hosts);
    out.push(r.object(
        CONTROL_PLANE_GROUP,
        "KubeadmControlPlane",
        &control_plane_name(name),
        json!({
            "replicas": masters,
            "version": version,
            "machineTemplate": {
                "metadata": { "labels": { SITE_LABEL: site } },
                "spec": {
                    "infrastructureRef": reference(INFRASTRUCTURE_GROUP, "Metal3MachineTemplate", &masters_hosts_name),
                },
            },
            "kubeadmConfigSpec": {
                "format": "cloud-config",
                "initConfiguration": { "nodeRegistration": node_registration(Role::Master) },
                "joinConfiguration": { "nodeRegistration": node_registration(Role::Master) },
            },
            "rollout": { "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": { "maxSurge": build.masters.max_surge.unwrap_or_default() },
            } },
        }),
    ));

    if workers > 0 {
        let version = r.kubernetes_version(Role::Worker)?;
        let bootstrap = r.template(
            BOOTSTRAP_GROUP,
            "KubeadmConfigTemplate",
            &format!("{name}-workers"),
            json!({ "template": { "spec": {
                "format": "cloud-config",
                "joinConfiguration": { "nodeRegistration": node_registration(Role::Worker) },
            } } }),
        );
        let bootstrap_name = object_name(&bootstrap);
        let hosts = r.machine_template(Role::Worker, &data_name)?;
        let hosts_name = object_name(&hosts);
        out.push(bootstrap);
        out.push(hosts);
        let selected = json!({ "cluster.x-k8s.io/cluster-name": name, "cluster.x-k8s.io/deployment-name": format!("{name}-workers") });
        out.push(r.object(
            CLUSTER_GROUP,
            "MachineDeployment",
            &format!("{name}-workers"),
            json!({
                "clusterName": name,
                "replicas": workers,
                "selector": { "matchLabels": selected },
                "template": {
                    "metadata": { "labels": selected },
                    "spec": {
                        "clusterName": name,
                        "version": version,
                        "bootstrap": { "configRef": reference(BOOTSTRAP_GROUP, "KubeadmConfigTemplate", &bootstrap_name) },
                        "infrastructureRef": reference(INFRASTRUCTURE_GROUP, "Metal3MachineTemplate", &hosts_name),
                    },
                },
                "rollout": { "strategy": {
                    "type": "RollingUpdate",
                    "rollingUpdate": {
                        "maxSurge": build.workers.max_surge.unwrap_or_default(),
                        "maxUnavailable": build.workers.max_unavailable.unwrap_or(1),
                    },
                } },
            }),
        ));
    }
    Ok(out)
}

/// `v<version>` of the kubelet `role`'s nodes run in `design`: the Kubernetes version Cluster
/// API builds them at.
///
/// # Errors
/// When the role runs no kubelet.
pub fn kubernetes_version(design: &SiteDesign, role: Role) -> Result<String, RenderError> {
    design
        .packages_for(role)
        .iter()
        .find(|p| p.name.as_str() == "kubelet")
        .map(|p| format!("v{}", p.version.as_str().trim_start_matches('v')))
        .ok_or_else(|| RenderError::Missing {
            site: design.site.to_string(),
            role: role.as_str(),
            what: "kubelet",
            why: "the Kubernetes version to build",
        })
}

/// The name of a template whose `spec` is this: `<base>-<10 hex digits of its sha256>`, so a
/// template changed is a template renamed (Cluster API treats templates as immutable).
pub fn template_name(base: &str, spec: &Value) -> String {
    let digest = Sha256::digest(serde_json::to_vec(spec).unwrap_or_default());
    let hash: String = digest.iter().take(5).map(|b| format!("{b:02x}")).collect();
    format!("{base}-{hash}")
}

/// The base a template's name was made from by [`template_name`].
pub fn template_base(name: &str) -> &str {
    match name.rsplit_once('-') {
        Some((base, hash)) if hash.len() == 10 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => base,
        _ => name,
    }
}

/// The control plane's name: `<cluster>-control-plane`.
pub fn control_plane_name(cluster: &str) -> String {
    format!("{cluster}-control-plane")
}

struct Renderer<'a, C> {
    design: &'a SiteDesign,
    settings: &'a RenderSettings,
    catalog: &'a C,
}

impl<C: Fn(&PackageRef) -> Option<Package>> Renderer<'_, C> {
    /// An object of the site's namespace with `spec`.
    fn object(&self, group: &str, kind: &str, name: &str, spec: Value) -> Value {
        json!({
            "apiVersion": format!("{group}/{VERSION}"),
            "kind": kind,
            "metadata": {
                "name": name,
                "namespace": self.settings.namespace,
                "labels": { SITE_LABEL: self.design.site.as_str(), "cluster.x-k8s.io/cluster-name": self.settings.cluster },
            },
            "spec": spec,
        })
    }

    /// An immutable template, named `<base>-<hash of its spec>`.
    fn template(&self, group: &str, kind: &str, base: &str, spec: Value) -> Value {
        let name = template_name(base, &spec);
        self.object(group, kind, &name, spec)
    }

    fn kubernetes_version(&self, role: Role) -> Result<String, RenderError> {
        kubernetes_version(self.design, role)
    }

    /// The hosts of a role as CAPM3 claims them: its os-image, the role's hosts, its cleaning.
    fn machine_template(&self, role: Role, data: &str) -> Result<Value, RenderError> {
        let image = self.os_image(role)?;
        let cleaning = self
            .design
            .nodes
            .iter()
            .find(|n| n.role == role)
            .map(|n| n.cleaning)
            .filter(|c| *c != CleaningMode::Unspecified)
            .map_or("metadata", |c| if c == CleaningMode::Disabled { "disabled" } else { "metadata" });
        let base = self.settings.image_base_url.trim_end_matches('/');
        let spec = json!({
            "nodeReuse": false,
            "template": { "spec": {
                "image": {
                    "url": format!("{base}/sha256/{}", image.sha256),
                    "checksum": image.sha256.to_string(),
                    "checksumType": "sha256",
                    "diskFormat": "raw",
                },
                "hostSelector": { "matchLabels": { HOST_ROLE_LABEL: role.as_str() } },
                "dataTemplate": { "name": data, "namespace": self.settings.namespace },
                "automatedCleaningMode": cleaning,
            } },
        });
        Ok(self.template(
            INFRASTRUCTURE_GROUP,
            "Metal3MachineTemplate",
            &format!("{}-{}s", self.settings.cluster, role.as_str()),
            spec,
        ))
    }

    fn os_image(&self, role: Role) -> Result<Package, RenderError> {
        let mut not_in_catalog = Vec::new();
        for r in self.design.packages_for(role) {
            match (self.catalog)(r) {
                Some(p) if p.kind == PackageKind::OsImage => return Ok(p),
                Some(_) => {}
                None => not_in_catalog.push(r.key()),
            }
        }
        Err(match not_in_catalog.is_empty() {
            false => RenderError::NotInCatalog { role: role.as_str(), packages: not_in_catalog.join(", ") },
            true => self.missing(role, "os-image", "the image CAPM3 writes to each host"),
        })
    }

    fn missing(&self, role: Role, what: &'static str, why: &'static str) -> RenderError {
        RenderError::Missing { site: self.design.site.to_string(), role: role.as_str(), what, why }
    }
}

/// A `v1beta2` reference to an object of the same namespace.
fn reference(group: &str, kind: &str, name: &str) -> Value {
    json!({ "apiGroup": group, "kind": kind, "name": name })
}

fn object_name(object: &Value) -> String {
    object["metadata"]["name"].as_str().unwrap_or_default().to_string()
}

/// How a node registers: named after its host (the data template's `local-hostname`), labelled
/// with its role as landfall labels the Nodes it installs.
fn node_registration(role: Role) -> Value {
    json!({
        "name": "{{ ds.meta_data.local_hostname }}",
        "kubeletExtraArgs": [{ "name": "node-labels", "value": format!("{HOST_ROLE_LABEL}={}", role.as_str()) }],
    })
}

#[cfg(test)]
mod tests {
    use bus_schema::domain::{ApiEndpoint, Builder, ClusterBuild, NodeSetRollout};
    use bus_schema::pb;

    use super::*;

    fn design(masters: usize, workers: usize, kubelet: &str) -> SiteDesign {
        let node = |i: usize, role: pb::Role| pb::NodeSpec {
            name: format!("node-{i}"),
            role: role as i32,
            boot_mac: format!("52:54:00:00:00:{i:02x}"),
            bmc_address: format!("ipmi://10.0.0.{i}"),
            ..Default::default()
        };
        let nodes = (1..=masters)
            .map(|i| node(i, pb::Role::Master))
            .chain((masters + 1..=masters + workers).map(|i| node(i, pb::Role::Worker)))
            .collect();
        let refs = vec![
            pb::PackageRef { name: "ubuntu".into(), version: "22.04.4".into() },
            pb::PackageRef { name: "kubelet".into(), version: kubelet.into() },
        ];
        let build = ClusterBuild {
            builder: Builder::Capi,
            endpoint: Some(ApiEndpoint { host: "10.0.0.100".parse().unwrap(), port: 6443 }),
            masters: NodeSetRollout { spare: 1, ..Default::default() },
            workers: NodeSetRollout::default(),
        };
        let pb = pb::SiteDesign {
            site_id: "edge-01".into(),
            labels: Default::default(),
            nodes,
            packages: [pb::Role::Master, pb::Role::Worker]
                .map(|role| pb::RolePackages { role: role as i32, packages: refs.clone() })
                .to_vec(),
            cluster: Some(pb::ClusterBuild::from(&build.with_defaults(masters))),
            chart_values: Default::default(),
            maintenance_windows: Vec::new(),
        };
        SiteDesign::try_from(pb).unwrap()
    }

    fn catalog(r: &PackageRef) -> Option<Package> {
        let kind = if r.name.as_str() == "ubuntu" { pb::PackageKind::OsImage } else { pb::PackageKind::Binary };
        Package::try_from(pb::Package {
            name: r.name.to_string(),
            version: r.version.to_string(),
            kind: kind as i32,
            sha256: format!("{:0>64}", r.version.as_str().replace('.', "")),
            size: 1,
            object_key: String::new(),
            chart: None,
            render: None,
        })
        .ok()
    }

    fn kinds(objects: &[Value]) -> Vec<String> {
        objects
            .iter()
            .map(|o| format!("{} {}", o["kind"].as_str().unwrap(), o["metadata"]["name"].as_str().unwrap()))
            .collect()
    }

    #[test]
    fn a_site_becomes_cluster_api_objects_referring_to_each_other() {
        let objects = render(&design(3, 2, "1.29.2"), catalog, &RenderSettings::new("edge-01")).unwrap();
        let kinds = kinds(&objects);
        assert_eq!(kinds.len(), 8, "{kinds:?}");
        for (i, want) in [
            "Cluster edge-01",
            "Metal3Cluster edge-01",
            "Metal3DataTemplate edge-01-nodes-",
            "Metal3MachineTemplate edge-01-masters-",
            "KubeadmControlPlane edge-01-control-plane",
            "KubeadmConfigTemplate edge-01-workers-",
            "Metal3MachineTemplate edge-01-workers-",
            "MachineDeployment edge-01-workers",
        ]
        .iter()
        .enumerate()
        {
            assert!(kinds[i].starts_with(want), "{i}: {} is not {want}", kinds[i]);
        }
        assert!(objects.iter().all(|o| o["apiVersion"].as_str().unwrap().ends_with("/v1beta2")));
        let kcp = &objects[4]["spec"];
        assert_eq!(kcp["replicas"], 3);
        assert_eq!(kcp["version"], "v1.29.2");
        assert_eq!(kcp["rollout"]["strategy"]["rollingUpdate"]["maxSurge"], 0, "bare metal, three masters: no surge");
        assert_eq!(kcp["machineTemplate"]["spec"]["infrastructureRef"]["name"], objects[3]["metadata"]["name"]);
        let hosts = &objects[3]["spec"]["template"]["spec"];
        assert_eq!(hosts["image"]["url"], format!("http://localhost:8080/sha256/{:0>64}", "22044"));
        assert_eq!(hosts["hostSelector"]["matchLabels"][HOST_ROLE_LABEL], "master");
        assert_eq!(hosts["dataTemplate"]["name"], objects[2]["metadata"]["name"]);
        let md = &objects[7]["spec"];
        assert_eq!(md["replicas"], 2);
        assert_eq!(md["template"]["spec"]["bootstrap"]["configRef"]["name"], objects[5]["metadata"]["name"]);
        assert_eq!(md["selector"]["matchLabels"], md["template"]["metadata"]["labels"]);
        assert_eq!(md["rollout"]["strategy"]["rollingUpdate"], json!({ "maxSurge": 0, "maxUnavailable": 1 }));
        assert_eq!(objects[0]["spec"]["controlPlaneEndpoint"], json!({ "host": "10.0.0.100", "port": 6443 }));
    }

    #[test]
    fn a_new_version_is_new_templates_only_where_it_changes_them_and_the_same_design_renders_the_same() {
        let settings = RenderSettings::new("edge-01");
        let before = render(&design(3, 2, "1.29.2"), catalog, &settings).unwrap();
        assert_eq!(before, render(&design(3, 2, "1.29.2"), catalog, &settings).unwrap());
        let after = render(&design(3, 2, "1.29.3"), catalog, &settings).unwrap();
        // The version lives in the control plane and the deployment, not in the templates.
        assert_eq!(kinds(&before), kinds(&after));
        assert_eq!(after[4]["spec"]["version"], "v1.29.3");
        let mut settings = settings;
        settings.image_base_url = "http://cache.edge-01:8080".into();
        let moved = render(&design(3, 2, "1.29.2"), catalog, &settings).unwrap();
        assert_ne!(kinds(&before)[3], kinds(&moved)[3], "a new image URL is a new masters template");
        assert_eq!(kinds(&before)[2], kinds(&moved)[2], "the data template did not change");
    }

    #[test]
    fn what_cannot_be_rendered_says_why() {
        let settings = RenderSettings::new("edge-01");
        let mut bpa = design(1, 0, "1.29.2");
        bpa.cluster = ClusterBuild::default();
        assert_eq!(render(&bpa, catalog, &settings).unwrap_err(), RenderError::NotCapi("edge-01".into()));
        let err = render(&design(1, 0, "1.29.2"), |_: &PackageRef| None, &settings).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the catalog lacks ubuntu@22.04.4, kubelet@1.29.2 (the masters' os-image among them?): an image is checked against its sha256"
        );
        let mut no_kubelet = design(1, 0, "1.29.2");
        no_kubelet.packages.values_mut().for_each(|v| v.retain(|p| p.name.as_str() != "kubelet"));
        let err = render(&no_kubelet, catalog, &settings).unwrap_err();
        assert!(err.to_string().contains("the masters of edge-01 run no kubelet"), "{err}");
        assert_eq!(render(&design(1, 0, "1.29.2"), catalog, &settings).unwrap().len(), 5, "no workers: no deployment");
    }
}
