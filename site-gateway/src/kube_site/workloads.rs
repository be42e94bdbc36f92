//! Whether a container package's workloads came up: a Deployment, DaemonSet or StatefulSet is
//! available when its controller has seen its current spec and every replica is updated and
//! available; a Job when it is complete; a chart's CustomResourceDefinition when established. Applying the manifests is not enough: the package is
//! done when these say so, or fails when the time-out passes (naming what was not ready) or a
//! Job fails.

use std::time::Duration;

use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject};
use serde_json::Value;
use tokio::time::Instant;

use super::error::kube_error;
use crate::backend::BackendError;

/// An object a package applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub api_version: String,
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
}

impl Applied {
    /// `Kind namespace/name`.
    pub fn id(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{} {ns}/{}", self.kind, self.name),
            None => format!("{} {}", self.kind, self.name),
        }
    }

    fn plural(&self) -> Option<&'static str> {
        match (self.api_version.as_str(), self.kind.as_str()) {
            ("apps/v1", "Deployment") => Some("deployments"),
            ("apps/v1", "DaemonSet") => Some("daemonsets"),
            ("apps/v1", "StatefulSet") => Some("statefulsets"),
            ("batch/v1", "Job") => Some("jobs"),
            ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => Some("customresourcedefinitions"),
            _ => None,
        }
    }
}

/// What a workload's status says.
#[derive(Debug, PartialEq, Eq)]
pub enum Readiness {
    Available,
    /// Not yet: what is missing.
    Waiting(String),
    /// It will not come up (a failed Job): why.
    Failed(String),
}

fn int(v: &Value) -> i64 {
    v.as_i64().unwrap_or(0)
}

fn condition<'a>(status: &'a Value, kind: &str) -> Option<&'a Value> {
    status["conditions"].as_array()?.iter().find(|c| c["type"] == kind && c["status"] == "True")
}

/// Reads a workload's status as its controller wrote it.
pub fn readiness(kind: &str, object: &Value) -> Readiness {
    let status = &object["status"];
    let seen = int(&status["observedGeneration"]) >= int(&object["metadata"]["generation"]);
    let replicas = object["spec"]["replicas"].as_i64().unwrap_or(1);
    let waiting = |what: String| {
        if seen { Readiness::Waiting(what) } else { Readiness::Waiting("its controller has not seen it yet".into()) }
    };
    match kind {
        "Deployment" => {
            let (updated, available) = (int(&status["updatedReplicas"]), int(&status["availableReplicas"]));
            if seen && updated >= replicas && available >= replicas {
                Readiness::Available
            } else {
                waiting(format!("{available} of {replicas} available, {updated} updated"))
            }
        }
        "DaemonSet" => {
            let desired = int(&status["desiredNumberScheduled"]);
            let (updated, available) = (int(&status["updatedNumberScheduled"]), int(&status["numberAvailable"]));
            if seen && updated >= desired && available >= desired {
                Readiness::Available
            } else {
                waiting(format!("{available} of {desired} available, {updated} updated"))
            }
        }
        "StatefulSet" => {
            let (updated, ready) = (int(&status["updatedReplicas"]), int(&status["readyReplicas"]));
            if seen && updated >= replicas && ready >= replicas {
                Readiness::Available
            } else {
                waiting(format!("{ready} of {replicas} ready, {updated} updated"))
            }
        }
        "Job" => {
            if condition(status, "Complete").is_some() {
                Readiness::Available
            } else if let Some(failed) = condition(status, "Failed") {
                let reason = failed["reason"].as_str().unwrap_or_default();
                let message = failed["message"].as_str().unwrap_or_default();
                Readiness::Failed(format!("failed: {reason} {message}").trim().to_string())
            } else {
                let completions = object["spec"]["completions"].as_i64().unwrap_or(1);
                Readiness::Waiting(format!("{} of {completions} completed", int(&status["succeeded"])))
            }
        }
        // A chart's CRD: its kind is served once the API server says it is established.
        "CustomResourceDefinition" => {
            if condition(status, "Established").is_some() {
                Readiness::Available
            } else {
                Readiness::Waiting("not established yet".into())
            }
        }
        _ => Readiness::Available,
    }
}

/// Waits until every workload among `objects` is available.
pub async fn wait_available(
    client: &Client,
    objects: &[Applied],
    timeout: Duration,
    poll: Duration,
) -> Result<(), BackendError> {
    let deadline = Instant::now() + timeout;
    let workloads: Vec<(&Applied, &str)> = objects.iter().filter_map(|o| Some((o, o.plural()?))).collect();
    loop {
        let mut waiting = Vec::new();
        for (object, plural) in &workloads {
            let (group, version) = object.api_version.split_once('/').unwrap_or(("", object.api_version.as_str()));
            let resource = ApiResource {
                group: group.into(),
                version: version.into(),
                api_version: object.api_version.clone(),
                kind: object.kind.clone(),
                plural: (*plural).into(),
            };
            let api: Api<DynamicObject> = match &object.namespace {
                Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
                None => Api::all_with(client.clone(), &resource),
            };
            let found = api.get_opt(&object.name).await.map_err(|e| kube_error(&object.id(), e))?;
            let state = match found {
                None => Readiness::Waiting("gone".into()),
                Some(found) => readiness(&object.kind, &serde_json::to_value(&found).unwrap_or_default()),
            };
            match state {
                Readiness::Available => {}
                Readiness::Waiting(what) => waiting.push(format!("{}: {what}", object.id())),
                Readiness::Failed(why) => {
                    return Err(BackendError::permanent_reason(format!("{}: {why}", object.id())));
                }
            }
        }
        if waiting.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(BackendError::permanent_reason(format!(
                "not available within {timeout:?}: {}",
                waiting.join("; ")
            )));
        }
        tokio::time::sleep(poll).await;
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_deployment_is_available_once_its_controller_saw_it_and_every_replica_is_up() {
        let mut d = json!({"metadata": {"generation": 2}, "spec": {"replicas": 3},
                           "status": {"observedGeneration": 1, "updatedReplicas": 3, "availableReplicas": 3}});
        assert_eq!(readiness("Deployment", &d), Readiness::Waiting("its controller has not seen it yet".into()));
        d["status"] = json!({"observedGeneration": 2, "updatedReplicas": 3, "availableReplicas": 2});
        assert_eq!(readiness("Deployment", &d), Readiness::Waiting("2 of 3 available, 3 updated".into()));
        d["status"]["availableReplicas"] = json!(3);
        assert_eq!(readiness("Deployment", &d), Readiness::Available);
    }

    #[test]
    fn daemon_sets_stateful_sets_and_jobs_read_their_own_fields() {
        let ds = json!({"metadata": {"generation": 1}, "status": {"observedGeneration": 1, "desiredNumberScheduled": 4,
                        "updatedNumberScheduled": 4, "numberAvailable": 3}});
        assert_eq!(readiness("DaemonSet", &ds), Readiness::Waiting("3 of 4 available, 4 updated".into()));
        let sts = json!({"metadata": {"generation": 1}, "spec": {"replicas": 2},
                         "status": {"observedGeneration": 1, "readyReplicas": 2, "updatedReplicas": 2}});
        assert_eq!(readiness("StatefulSet", &sts), Readiness::Available);
        let job = json!({"metadata": {"generation": 1}, "spec": {"completions": 2}, "status": {"succeeded": 1}});
        assert_eq!(readiness("Job", &job), Readiness::Waiting("1 of 2 completed".into()));
        let failed = json!({"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                            "message": "Job has reached the specified backoff limit"}]}});
        assert_eq!(
            readiness("Job", &failed),
            Readiness::Failed("failed: BackoffLimitExceeded Job has reached the specified backoff limit".into())
        );
        assert_eq!(readiness("ConfigMap", &json!({})), Readiness::Available);
        let crd = json!({"status": {"conditions": [{"type": "NamesAccepted", "status": "True"}]}});
        assert_eq!(readiness("CustomResourceDefinition", &crd), Readiness::Waiting("not established yet".into()));
        let crd = json!({"status": {"conditions": [{"type": "Established", "status": "True"}]}});
        assert_eq!(readiness("CustomResourceDefinition", &crd), Readiness::Available);
    }
}
