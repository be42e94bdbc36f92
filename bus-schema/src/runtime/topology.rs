//! Making the streams and KV buckets exist ([`Topology`], [`Bus::ensure_topology`]), and
//! waiting for a stream another service makes.

use std::time::Duration;

use async_nats::jetstream::{kv, stream};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::connect::Bus;
use super::error::{BusError, boxed, retry_delay};
use crate::names;

/// How the streams and buckets are laid out on the server.
#[derive(Debug, Clone)]
pub struct Topology {
    /// Replicas of every stream and bucket: 1 on a single server, 3 on a JetStream cluster.
    pub replicas: usize,
}

impl Default for Topology {
    fn default() -> Self {
        Self { replicas: 1 }
    }
}

impl Topology {
    /// What suits the server connected to: three replicas on a JetStream cluster, one on a
    /// single server.
    pub fn for_server(bus: &Bus) -> Self {
        let clustered = bus.client().server_info().cluster.is_some_and(|c| !c.is_empty());
        Self { replicas: if clustered { 3 } else { 1 } }
    }
}

impl Bus {
    /// Creates the streams and KV buckets if they do not exist; leaves existing ones alone.
    pub async fn ensure_topology(&self, topology: &Topology) -> Result<(), BusError> {
        let base = |name: &str, subjects: &str, retention| stream::Config {
            name: name.to_string(),
            subjects: vec![subjects.to_string()],
            retention,
            storage: stream::StorageType::File,
            num_replicas: topology.replicas,
            duplicate_window: names::DEDUP_WINDOW,
            max_message_size: names::MAX_PAYLOAD as i32,
            ..Default::default()
        };
        let streams = [
            stream::Config {
                max_age: names::RETENTION,
                ..base(names::COMMANDS_STREAM, names::COMMANDS_ALL, stream::RetentionPolicy::Limits)
            },
            base(names::JOBS_STREAM, names::JOBS_ALL, stream::RetentionPolicy::WorkQueue),
            stream::Config {
                max_age: names::RETENTION,
                ..base(names::EVENTS_STREAM, names::EVENTS_ALL, stream::RetentionPolicy::Limits)
            },
        ];
        for config in streams {
            let name = config.name.clone();
            self.jetstream().get_or_create_stream(config).await.map_err(|e| BusError::Topology {
                what: "stream",
                name,
                source: boxed(e),
            })?;
        }
        // Dead letters: what consumers gave up on, kept as long as commands and events.
        let dead = stream::Config {
            max_age: names::RETENTION,
            ..base(names::DEAD_STREAM, names::DEAD_ALL, stream::RetentionPolicy::Limits)
        };
        self.jetstream().get_or_create_stream(dead).await.map_err(|e| BusError::Topology {
            what: "stream",
            name: names::DEAD_STREAM.to_string(),
            source: boxed(e),
        })?;
        for bucket in names::ALL_BUCKETS {
            self.ensure_bucket(bucket, topology).await?;
        }
        Ok(())
    }

    async fn ensure_bucket(&self, bucket: &str, topology: &Topology) -> Result<kv::Store, BusError> {
        if let Ok(store) = self.jetstream().get_key_value(bucket).await {
            return Ok(store);
        }
        let history = if bucket == names::SITES_BUCKET { 16 } else { 1 };
        // The ledger keeps a command's record as long as the commands stream keeps the command.
        let max_age = if bucket == names::LEDGER_BUCKET { names::RETENTION } else { Duration::ZERO };
        let config = kv::Config {
            bucket: bucket.to_string(),
            history,
            max_age,
            num_replicas: topology.replicas,
            max_value_size: names::MAX_PAYLOAD as i32,
            storage: stream::StorageType::File,
            ..Default::default()
        };
        match self.jetstream().create_key_value(config).await {
            Ok(store) => Ok(store),
            // Another service may have created it in the meantime.
            Err(e) => self.jetstream().get_key_value(bucket).await.map_err(|_| BusError::Topology {
                what: "kv bucket",
                name: bucket.to_string(),
                source: boxed(e),
            }),
        }
    }

    /// [`Bus::ensure_topology`], tried again for up to `within` while it fails: a JetStream
    /// cluster that is still forming (or electing) refuses replicated streams for a moment.
    ///
    /// # Errors
    /// The last failure once `within` has passed.
    pub async fn ensure_topology_within(&self, topology: &Topology, within: Duration) -> Result<(), BusError> {
        let deadline = tokio::time::Instant::now() + within;
        for attempt in 1.. {
            match self.ensure_topology(topology).await {
                Ok(()) => return Ok(()),
                Err(e) if tokio::time::Instant::now() < deadline => {
                    warn!(attempt, error = %e, "cannot make the streams and buckets yet");
                    tokio::time::sleep(retry_delay(attempt)).await;
                }
                Err(e) => return Err(e),
            }
        }
        unreachable!("the loop returns")
    }

    /// Waits until `stream` exists (another service creates it), or `shutdown`.
    ///
    /// # Errors
    /// [`BusError::Topology`] when `shutdown` came first.
    pub async fn wait_for_stream(&self, stream: &str, shutdown: &CancellationToken) -> Result<(), BusError> {
        for attempt in 1.. {
            match self.jetstream().get_stream(stream).await {
                Ok(_) => return Ok(()),
                Err(e) => {
                    if attempt == 1 || attempt % 10 == 0 {
                        warn!(stream, error = %e, "waiting for the stream (the hub's services create it)");
                    }
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => {
                    return Err(BusError::Topology { what: "stream", name: stream.to_string(), source: "stopped while waiting for it".into() });
                }
                _ = tokio::time::sleep(retry_delay(attempt)) => {}
            }
        }
        unreachable!("the loop returns")
    }
}
