//! Whether a site's report answers a job the hub sent that site: read from the saga or rollout
//! record its correlation names. The saga and the rollout executor check the reports that move
//! them themselves; this is for the consumers that only listen (the observer).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bus_schema::names::keys;
use bus_schema::pb::{self, BusJob};
use bus_schema::runtime::{Delivery, HandlerError, Kv};
use bus_schema::trust;

use crate::rollout::decide;
use crate::saga;

/// Finds the job a report answers, in `landfall-sagas`.
pub struct Jobs {
    sagas: Kv,
    /// Rollouts by id: what the check reads of one (its id, trace and package) never changes.
    rollouts: Mutex<HashMap<String, Arc<pb::Rollout>>>,
}

fn forbidden(reason: String) -> HandlerError {
    HandlerError::reject(pb::RejectCode::Forbidden, reason)
}

impl Jobs {
    pub fn new(sagas: Kv) -> Self {
        Self { sagas, rollouts: Mutex::default() }
    }

    async fn rollout(&self, id: &str) -> Result<Option<Arc<pb::Rollout>>, HandlerError> {
        let Some((r, _)) = self.sagas.get::<pb::Rollout>(&keys::rollout(id)).await? else { return Ok(None) };
        let r = Arc::new(r);
        self.rollouts.lock().expect("rollouts lock").insert(id.to_string(), r.clone());
        Ok(Some(r))
    }

    /// When the saga or rollout `id` started; `None` when there is neither (or it was compacted).
    pub async fn started_unix_ms(&self, id: &str) -> Result<Option<i64>, HandlerError> {
        if let Some(r) = self.rollouts.lock().expect("rollouts lock").get(id) {
            return Ok(Some(r.started_unix_ms));
        }
        if let Some((s, _)) = self.sagas.get::<pb::InstallSaga>(&keys::saga(id)).await? {
            return Ok(Some(s.started_unix_ms));
        }
        Ok(self.rollout(id).await?.map(|r| r.started_unix_ms))
    }

    /// Checks that `d`, a report of the site its subject names about `node` (and, from a
    /// rollout, of `package`), answers a job the hub sent that site: a saga's job of a kind its
    /// row in `trust::RULES` answers, for one of the saga's nodes; or the rollout's patch job
    /// for that site, of the rollout's package. Reports of kinds that answer no job pass.
    ///
    /// # Errors
    /// A `FORBIDDEN` rejection saying what did not match; a transient error when KV fails.
    pub async fn check(
        &self,
        d: &Delivery,
        node: Option<&str>,
        package: Option<&pb::PackageRef>,
    ) -> Result<(), HandlerError> {
        let Some(rule) = trust::rule_for_subject(&d.subject) else { return Ok(()) };
        if rule.answers.is_empty() {
            return Ok(());
        }
        let site = trust::subject_site(&d.subject).unwrap_or_default();
        let correlation = &d.envelope.correlation;
        // A rollout seen before answers from memory: a rollout's node reports, by the thousand,
        // cost no read.
        let cached = self.rollouts.lock().expect("rollouts lock").get(correlation.as_str()).cloned();
        let r = match cached {
            Some(r) => Some(r),
            None => match self.sagas.get::<pb::InstallSaga>(&keys::saga(correlation)).await? {
                Some((saga, _)) => {
                    return saga::check_answer(&saga, site, rule.answers, node, &d.envelope).map_err(forbidden);
                }
                None => self.rollout(correlation).await?,
            },
        };
        let Some(r) = r else {
            return Err(forbidden(format!("{correlation} is no saga or rollout that sent site {site} a job")));
        };
        if !rule.answers.contains(&pb::PatchNodes::KIND) || d.envelope.causation != decide::patch_job_id(&r, site) {
            return Err(forbidden(format!(
                "rollout {} sent site {site} no job {}",
                r.rollout_id, d.envelope.causation
            )));
        }
        let entry = r.entry.clone().unwrap_or_default();
        if let Some(p) = package
            && !decide::names_package(&r, p)
        {
            return Err(forbidden(format!(
                "rollout {} patches {}@{}, not {}@{}",
                r.rollout_id, entry.name, entry.version, p.name, p.version
            )));
        }
        Ok(())
    }
}
