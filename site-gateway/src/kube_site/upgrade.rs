//! A binary patched on one node alone. The BPA's `Software` names a version per role, and the
//! BPA installs it on every node of the role at once: moved for one node's patch, it would take
//! the whole role down together, past any `max_unavailable`. So the binary goes on the node the
//! patch is for by a Job of the application cluster pinned to it (`nodeName`, the host's
//! filesystem at `/host`), which fetches the artifact from the site's artifact server, checks
//! its sha256, installs it as `/usr/local/bin/<name>` and restarts the unit of that name if the
//! host has one. The role's `Software` entry moves only once every node of the role runs the
//! version, so the BPA never changes a node the rollout has not reached, and a node it installs
//! later (a join, a reprovision) gets what the rest of its role runs.

use std::time::Instant;

use bus_schema::domain::{Package, Role};
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use tracing::info;

use super::KubeSite;
use super::bpa;
use super::error::kube_error;
use super::marks;
use crate::backend::BackendError;

/// What the Job runs: fetch, check, install, restart.
const SCRIPT: &str = r#"set -eu
dir=/host/var/lib/landfall/upgrade
mkdir -p "$dir"
tmp="$dir/$PACKAGE-$SHA256"
wget -q -O "$tmp" "$URL"
echo "$SHA256  $tmp" | sha256sum -c -
install -m 0755 "$tmp" "/host/usr/local/bin/$PACKAGE"
rm -f "$tmp"
if chroot /host systemctl cat "$PACKAGE" >/dev/null 2>&1; then chroot /host systemctl restart "$PACKAGE"; fi
"#;

/// The Job's name: the node, the package and its digest's start (a DNS label, at most 63).
pub(super) fn job_name(node: &str, package: &Package) -> String {
    let mut name = format!("landfall-upgrade-{node}-{}", package.name);
    name.truncate(50);
    format!("{}-{}", name.trim_end_matches('-'), &package.sha256.as_str()[..12])
}

/// The Job that installs `package` (served at `url`) on `node`.
pub(super) fn upgrade_job(name: &str, node: &str, package: &Package, url: &str, image: &str) -> serde_json::Value {
    let labels = json!({ marks::UPGRADE_LABEL: node });
    json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {
                marks::UPGRADE_PACKAGE: package.name.as_str(),
                marks::UPGRADE_VERSION: package.version.as_str(),
            },
        },
        "spec": {
            "backoffLimit": 2,
            "ttlSecondsAfterFinished": 3600,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    // Pinned past the scheduler: the node is cordoned while it is patched.
                    "nodeName": node,
                    "restartPolicy": "Never",
                    "hostPID": true,
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{
                        "name": "upgrade",
                        "image": image,
                        "command": ["sh", "-c", SCRIPT],
                        "env": [
                            {"name": "PACKAGE", "value": package.name.as_str()},
                            {"name": "VERSION", "value": package.version.as_str()},
                            {"name": "SHA256", "value": package.sha256.as_str()},
                            {"name": "URL", "value": url},
                        ],
                        "securityContext": {"privileged": true},
                        "volumeMounts": [{"name": "host", "mountPath": "/host"}],
                    }],
                    "volumes": [{"name": "host", "hostPath": {"path": "/"}}],
                },
            },
        },
    })
}

/// A Job's end: `Some(Ok)` succeeded, `Some(Err(why))` failed, `None` still running.
pub(super) fn outcome(job: &Job) -> Option<Result<(), String>> {
    let status = job.status.as_ref()?;
    if status.succeeded.unwrap_or(0) > 0 {
        return Some(Ok(()));
    }
    let failed = status.conditions.iter().flatten().find(|c| c.type_ == "Failed" && c.status == "True")?;
    let why = [failed.reason.as_deref(), failed.message.as_deref()].into_iter().flatten().collect::<Vec<_>>();
    Some(Err(if why.is_empty() { "failed".to_string() } else { why.join(": ") }))
}

impl KubeSite {
    /// Installs the binary on `node` alone, waiting for its Job; then the Job goes. A Job of the
    /// same name already there (the patch came again after its gateway died) is waited for.
    pub(super) async fn upgrade_node(&self, node: &str, package: &Package) -> Result<(), BackendError> {
        let jobs: Api<Job> = Api::namespaced(self.application_cluster().await?, &self.cfg.upgrade_namespace);
        let name = job_name(node, package);
        let url = self.image_url(package.sha256.as_str());
        let body = upgrade_job(&name, node, package, &url, &self.cfg.upgrade_image);
        let job: Job = serde_json::from_value(body).map_err(|e| BackendError::permanent("the upgrade Job", e))?;
        match jobs.create(&PostParams::default(), &job).await {
            Ok(_) => info!(site = %self.cfg.site, node, job = %name, "upgrade Job created"),
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(kube_error(&format!("upgrade Job {name}"), e)),
        }
        let deadline = Instant::now() + self.cfg.upgrade_timeout;
        let ended = loop {
            let found = jobs.get_opt(&name).await.map_err(|e| kube_error(&format!("upgrade Job {name}"), e))?;
            if let Some(ended) = found.as_ref().and_then(outcome) {
                break ended;
            }
            if found.is_none() || Instant::now() >= deadline {
                let what = if found.is_none() { "was deleted" } else { "did not finish in time" };
                break Err(format!("{what} ({:?})", self.cfg.upgrade_timeout));
            }
            tokio::time::sleep(self.cfg.poll).await;
        };
        let gone = DeleteParams::background();
        match jobs.delete(&name, &gone).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(kube_error(&format!("upgrade Job {name}"), e)),
        }
        ended.map_err(|why| {
            BackendError::permanent_reason(format!(
                "installing {} on {node}: Job {name}: {why}",
                package.reference().key()
            ))
        })
    }

    /// Moves `role`'s entry in the BPA's `Software` to `package` once every node of the role
    /// (the `Provisioning`'s, whose host is still there) runs it; whether it moved.
    pub(super) async fn software_follows_role(&self, role: Role, package: &Package) -> Result<bool, BackendError> {
        let cluster = &self.cfg.cluster;
        let Some(provisioning) = self.provisionings.get_opt(cluster).await.map_err(|e| kube_error(cluster, e))? else {
            return Ok(false);
        };
        for (node, (node_role, _)) in bpa::provisioned_nodes(&provisioning.data) {
            if node_role != role {
                continue;
            }
            let Some(host) = self.host(&node).await? else { continue };
            if Self::version_on(&host, package.name.as_str()).as_deref() != Some(package.version.as_str()) {
                return Ok(false);
            }
        }
        self.set_software(&[role], std::slice::from_ref(package)).await?;
        info!(site = %self.cfg.site, role = role.as_str(), package = %package.reference().key(), "every node of the role runs it: Software moved");
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bus_schema::pb::PackageKind;

    fn kubelet() -> Package {
        Package {
            name: "kubelet".try_into().unwrap(),
            version: "1.29.3".try_into().unwrap(),
            kind: PackageKind::Binary,
            sha256: "ab".repeat(32).try_into().unwrap(),
            size: 1,
            object_key: "k".into(),
            chart: None,
            render: None,
        }
    }

    #[test]
    fn the_job_is_pinned_to_its_node_and_checks_what_it_installs() {
        let name = job_name("w-1", &kubelet());
        assert_eq!(name, "landfall-upgrade-w-1-kubelet-abababababab");
        let long = job_name(&"n".repeat(60), &kubelet());
        assert!(long.len() <= 63, "{long}");
        let job = upgrade_job(&name, "w-1", &kubelet(), "http://site/sha256/abab", "busybox");
        let spec = &job["spec"]["template"]["spec"];
        assert_eq!(spec["nodeName"], "w-1");
        assert_eq!(spec["tolerations"][0]["operator"], "Exists", "runs on the cordoned node");
        assert_eq!(job["metadata"]["annotations"][marks::UPGRADE_VERSION], "1.29.3");
        let script = spec["containers"][0]["command"][2].as_str().unwrap();
        assert!(script.contains("sha256sum -c"), "{script}");
        let _: Job = serde_json::from_value(job).unwrap();
    }

    #[test]
    fn a_jobs_end_is_read_from_its_status() {
        let job = |status: serde_json::Value| -> Job {
            serde_json::from_value(json!({"metadata": {"name": "j"}, "status": status})).unwrap()
        };
        assert_eq!(outcome(&job(json!({"active": 1}))), None);
        assert_eq!(outcome(&job(json!({"succeeded": 1}))), Some(Ok(())));
        let failed = json!({"failed": 3, "conditions": [{"type": "Failed", "status": "True",
                            "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit"}]});
        assert_eq!(
            outcome(&job(failed)),
            Some(Err("BackoffLimitExceeded: Job has reached the specified backoff limit".into()))
        );
    }
}
