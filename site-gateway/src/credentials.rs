//! A host's BMC credentials, asked of the hub's secrets service for the job that drives the
//! host's BMC (core request/reply on `landfall.svc.<site>.bmc_credentials`, never stored in a
//! stream). The gateway holds them only for that job, and never logs them.

use std::time::Duration;

use bus_schema::envelope::Envelope;
use bus_schema::names;
use bus_schema::pb;
use bus_schema::runtime::{Bus, HandlerError, RequestError};
use tracing::warn;

use crate::backend::BmcCredentials;

/// How long the secrets service has to answer.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How the secrets service's refusal for a host with no credentials stored starts
/// (`consumers::secrets_service::NO_BMC_CREDENTIALS`): that host is driven without any.
pub const NONE_STORED: &str = "no BMC credentials stored";
/// How its refusal starts when no job the hub sent drives the host's BMC now
/// (`consumers::secrets_service::NO_BMC_JOB`): the job is a redelivery after its saga ended,
/// and the backend, finding the host as the job wants it, needs no BMC.
pub const NO_JOB: &str = "no job drives the BMCs of site";

/// The BMC credentials of `node` at `site` for the job `job` (its envelope: the id and the saga
/// that sent it), or `None` when the hub holds none for the host, or hands none out because the
/// job no longer drives the host (a job redelivered after its saga ended).
///
/// # Errors
/// [`HandlerError::Transient`] when no secrets service answers, or it refuses for another
/// reason (e.g. a record under a key it lacks): the job is tried again later.
pub async fn bmc_credentials(
    bus: &Bus,
    site: &str,
    node: &str,
    job: &Envelope,
) -> Result<Option<BmcCredentials>, HandlerError> {
    match ask(bus, site, node, job).await {
        Ok(creds) => Ok(creds),
        Err(Asked::OutOfReach(e) | Asked::Failed(e)) => Err(e),
    }
}

/// Why no credentials came back.
pub enum Asked {
    /// No secrets service answered: the hub is out of reach (the link is cut) or the service is
    /// down. A host the site has already is driven without them.
    OutOfReach(HandlerError),
    Failed(HandlerError),
}

/// [`bmc_credentials`], saying apart a hub out of reach.
///
/// # Errors
/// [`Asked::OutOfReach`] when no secrets service answered in time; [`Asked::Failed`] otherwise.
pub async fn ask(bus: &Bus, site: &str, node: &str, job: &Envelope) -> Result<Option<BmcCredentials>, Asked> {
    let subject = names::bmc_credentials_svc(site);
    let job_id = job.id.as_str();
    let request = pb::BmcCredentialsRequest {
        site_id: site.to_string(),
        node: node.to_string(),
        job_id: job.id.clone(),
        correlation_id: job.correlation.clone(),
    };
    let creds: pb::BmcCredentials = match bus.request_message(subject.clone(), &request, REQUEST_TIMEOUT).await {
        Ok(creds) => creds,
        Err(e @ (RequestError::TimedOut { .. } | RequestError::NoResponders { .. })) => {
            return Err(Asked::OutOfReach(HandlerError::transient(format!("bmc credentials of {node} at {site}"), e)));
        }
        Err(RequestError::Refused { reason, .. }) => {
            return match answer_error(&reason) {
                None => {
                    if reason.starts_with(NO_JOB) {
                        warn!(%site, %node, job_id, %reason, "provisioning without BMC credentials");
                    }
                    Ok(None)
                }
                Some(reason) => Err(Asked::Failed(HandlerError::transient_reason(format!(
                    "bmc credentials of {node} at {site}: {reason}"
                )))),
            };
        }
        Err(RequestError::Malformed { source, .. }) => {
            let e = HandlerError::transient(format!("bmc credentials of {node} at {site} do not decode"), source);
            return Err(Asked::Failed(e));
        }
        Err(e) => {
            return Err(Asked::Failed(HandlerError::transient(
                format!(
                    "bmc credentials of {node} at {site} (is the secrets service running? `landfall serve kubeconfig`)"
                ),
                e,
            )));
        }
    };
    Ok(Some(BmcCredentials { username: creds.username, password: creds.password }))
}

/// `None` when the refusal means "no credentials for this job"; the reason otherwise.
fn answer_error(reason: &str) -> Option<&str> {
    if reason.starts_with(NONE_STORED) || reason.starts_with(NO_JOB) { None } else { Some(reason) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn none_stored_is_no_credentials_and_anything_else_an_error() {
        assert_eq!(answer_error("no BMC credentials stored for node n-1 of site edge-01"), None);
        assert_eq!(answer_error("no job drives the BMCs of site edge-01 for node n1: saga s1 has ended"), None);
        let key = "open the BMC credentials of node n-1 of site edge-01 (sealed under key ab): ...";
        assert_eq!(answer_error(key), Some(key));
    }

    #[test]
    fn debug_hides_the_password() {
        let creds = BmcCredentials { username: "admin".into(), password: "hunter2-secret".into() };
        let text = format!("{creds:?}");
        assert!(text.contains("admin") && !text.contains("hunter2"), "{text}");
    }
}
