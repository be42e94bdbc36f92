//! What the hub's streams hold for one site, removed when the site is: its gateway's durable
//! consumer ([`Bus::delete_gateway_consumer`]) and its jobs not yet delivered
//! ([`Bus::drop_site_jobs`]).

use super::connect::Bus;
use super::consume::consumer_missing;
use super::error::{BusError, boxed};
use crate::names;

impl Bus {
    /// Deletes the site's gateway durable on its shard of the jobs; whether there was one.
    ///
    /// # Errors
    /// When the stream cannot be reached or the server refuses.
    pub async fn delete_gateway_consumer(&self, site: &str) -> Result<bool, BusError> {
        let durable = names::gateway_consumer(site);
        let err = |source| BusError::Consume { consumer: durable.clone(), source };
        let stream =
            self.jetstream().get_stream_no_info(names::site_jobs_stream(site)).await.map_err(|e| err(boxed(e)))?;
        match stream.delete_consumer(&durable).await {
            Ok(status) => Ok(status.success),
            Err(e) if consumer_missing(&e) => Ok(false),
            Err(e) => Err(err(boxed(e))),
        }
    }

    /// Drops every job of `site` still in its shard of the jobs; how many there were.
    ///
    /// # Errors
    /// When the stream cannot be reached or the purge is refused.
    pub async fn drop_site_jobs(&self, site: &str) -> Result<u64, BusError> {
        let name = names::site_jobs_stream(site);
        let err = |source| BusError::Topology { what: "stream purge", name: name.to_string(), source };
        let stream = self.jetstream().get_stream_no_info(name).await.map_err(|e| err(boxed(e)))?;
        let purged = stream.purge().filter(names::site_jobs(site)).await.map_err(|e| err(boxed(e)))?;
        Ok(purged.purged)
    }
}
