//! A rollout undone as a whole (`RollbackRollout`): read what the undone rollout did, have
//! [`decide::rollback_plan`] plan the rollout that moves it back, and start that like any rollout.
//! Nothing is decided here.

use std::collections::{BTreeMap, HashMap};

use bus_schema::names::keys;
use bus_schema::pb;
use bus_schema::runtime::{Delivery, HandlerError};
use tracing::info;

use super::{Overwrite, Rollouts, gauge_nodes, reject};
use crate::active;
use crate::clock::now_ms;
use crate::rollout::decide;

impl Rollouts {
    /// Plans and starts the rollback of a rollout (cancelling it first when it must be): one
    /// per rollout, whatever asks (a person, or the rollout itself past its threshold).
    pub async fn rollback(&self, d: &Delivery) -> Result<(), HandlerError> {
        let cmd: pb::RollbackRollout = d.decode()?;
        let undone_id = cmd.rollout_id.as_str();
        if undone_id.is_empty() || !undone_id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            return Err(HandlerError::reject(
                pb::RejectCode::Invalid,
                format!("rollout_id {undone_id:?} is not a rollout id"),
            ));
        }
        let id = decide::rollback_id(undone_id);
        let existing = self.sagas.get::<pb::Rollout>(&keys::rollout(&id)).await?;
        if let Some((rb, rev)) = existing.clone()
            && rb.command_id == d.envelope.id
        {
            // A redelivery of the command that started it: finish what it started.
            return self.settle(rb, rev).await;
        }
        let undone = self.sagas.get::<pb::Rollout>(&keys::rollout(undone_id)).await?.map(|(r, _)| r);
        let before = decide::may_roll_back(undone_id, undone.as_ref(), existing.as_ref().map(|(r, _)| r), cmd.cancel)
            .map_err(reject)?;
        let now = now_ms();
        if before == decide::Before::Cancel {
            let reason = format!("cancelled to be rolled back (rollout {id})");
            self.update(undone_id, |r| decide::cancel(r, &reason, &d.envelope, now).map_err(reject)).await?;
        }
        let Some((undone, _)) = self.sagas.get::<pb::Rollout>(&keys::rollout(undone_id)).await? else {
            return Err(HandlerError::reject(pb::RejectCode::Invalid, format!("there is no rollout {undone_id}")));
        };

        // What the undone rollout did: every site it sent a job, with its record when it has one.
        let mut records: HashMap<String, pb::RolloutSite> = self
            .sagas
            .scan::<pb::RolloutSite>(&keys::rollout_sites_prefix(undone_id))
            .await?
            .into_iter()
            .map(|(_, rec, _)| (rec.site_id.clone(), rec))
            .collect();
        let mut sites = Vec::new();
        for i in (0..undone.sites as usize).filter(|&i| decide::dispatched(&undone, i)) {
            let planned = self.plan_site(&undone, i).await?;
            let record = records.remove(&planned.site_id);
            sites.push(decide::UndoneSite { planned, record });
        }
        let name = undone.package.as_ref().map(|p| p.name.clone()).unwrap_or_default();
        let mut catalog = BTreeMap::new();
        for version in decide::versions_to_go_back_to(&sites) {
            if let Some(entry) = self.catalog_entry(&name, &version).await? {
                catalog.insert(version, entry);
            }
        }
        let planned =
            decide::rollback_plan(&undone, &sites, &catalog, &cmd.reason, &d.envelope, now).map_err(reject)?;
        // What the plan was made of, and the plan once written, are not held while it starts.
        drop((sites, records, catalog));
        self.update(undone_id, |r| Ok(decide::mark_rolled_back(r))).await?;
        // Written over any an interrupted attempt left: nobody reads them before the record is.
        let r = self.write_plan(&id, planned, Overwrite::Yes).await?;
        info!(rollout = %id, undoes = %undone_id, sites = r.sites, nodes = r.planned_nodes, "rollback planned");
        active::mark(&self.sagas, &keys::active_rollout(&id), &id, "").await?;
        let (created, (r, rev)) = self.sagas.create_or_get(&keys::rollout(&id), &r).await?;
        if created {
            gauge_nodes(&r);
        }
        self.settle(r, rev).await
    }
}
