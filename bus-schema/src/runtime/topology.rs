//! Making the streams and KV buckets exist ([`Topology`], [`Bus::ensure_topology`]), and
//! waiting for a stream another service makes.

use std::time::Duration;

use async_nats::jetstream::{kv, stream};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::connect::Bus;
use super::error::{BoxError, BusError, boxed, retry_delay};
use crate::names;

/// The most jobs of one kind one site may have waiting (`provision_os` goes out per node, so
/// this sits well above any site's node count).
pub const JOBS_PER_SUBJECT: i64 = 10_000;
/// Durable consumers a jobs stream may hold: one per site's gateway of its shard. nats-server
/// 2.15 gives a stream that names no limit 1,000 (`default_max_consumers`), and takes no value
/// below one for "unlimited": past 1,000 sites in one stream, registering the next was refused.
pub const JOBS_MAX_CONSUMERS: i32 = 1_000_000;

/// How the streams and buckets are laid out on the server, and how long they keep things.
#[derive(Debug, Clone)]
pub struct Topology {
    /// Replicas of every stream and bucket: 1 on a single server, 3 on a JetStream cluster.
    pub replicas: usize,
    /// How long JetStream recognises a repeated `Nats-Msg-Id` and drops the copy. Exactly once
    /// does not rest on it (the command ledger recognises a copy however late); it only saves
    /// the work of storing and settling copies that come soon.
    pub duplicate_window: Duration,
    /// How long commands and events are kept, and with them the command ledger's records.
    pub retention: Duration,
    /// Whether existing streams and buckets are brought to these keeping times (and buckets to
    /// a key's latest value only): the orchestrator's and `landfall up`'s part. Other services
    /// make what is missing and leave what exists alone.
    pub align: bool,
}

/// Whether `e` is the server's refusal of replicas on a server that is no cluster
/// (`JSStreamReplicasNotSupportedErr`, error code 10074).
fn not_clustered(e: &BusError) -> bool {
    super::error::error_chain(e).contains("error code 10074")
}

impl Default for Topology {
    fn default() -> Self {
        Self { replicas: 1, duplicate_window: names::DEDUP_WINDOW, retention: names::RETENTION, align: false }
    }
}

impl Topology {
    /// What suits the server connected to: three replicas on a JetStream cluster, one on a
    /// single server.
    pub fn for_server(bus: &Bus) -> Self {
        let clustered = bus.client().server_info().cluster.is_some_and(|c| !c.is_empty());
        Self { replicas: if clustered { 3 } else { 1 }, ..Self::default() }
    }

    /// With these keeping times (`None` keeps the default).
    pub fn keeping(mut self, duplicate_window: Option<Duration>, retention: Option<Duration>) -> Self {
        self.duplicate_window = duplicate_window.unwrap_or(self.duplicate_window);
        self.retention = retention.unwrap_or(self.retention);
        self
    }

    /// Bringing existing streams and buckets to these keeping times (see [`Topology::align`]).
    pub fn aligning(mut self) -> Self {
        self.align = true;
        self
    }

    /// Whether these settings can be: JetStream refuses a duplicate window longer than what
    /// the stream keeps.
    ///
    /// # Errors
    /// What is wrong, in words.
    pub fn check(&self) -> Result<(), String> {
        if self.duplicate_window.is_zero() || self.retention.is_zero() {
            return Err("the duplicate window and the retention must be longer than zero".into());
        }
        if self.duplicate_window > self.retention {
            return Err(format!(
                "the duplicate window ({:?}) is longer than the retention ({:?})",
                self.duplicate_window, self.retention
            ));
        }
        Ok(())
    }
}

impl Bus {
    /// Creates the streams and KV buckets if they do not exist. Existing ones are left alone
    /// but for their keeping times (duplicate window, retention), which follow `topology`.
    pub async fn ensure_topology(&self, topology: &Topology) -> Result<(), BusError> {
        topology.check().map_err(|e| BusError::Topology {
            what: "settings",
            name: "keeping times".into(),
            source: e.into(),
        })?;
        let base = |name: &str, subjects: &str, retention| stream::Config {
            name: name.to_string(),
            subjects: vec![subjects.to_string()],
            retention,
            storage: stream::StorageType::File,
            num_replicas: topology.replicas,
            duplicate_window: topology.duplicate_window,
            max_message_size: names::MAX_PAYLOAD as i32,
            ..Default::default()
        };
        // A job nobody took within the retention was for a site long gone. Per subject (a
        // site's kind of job), a runaway sender is refused at publish, where it is seen and
        // retried, rather than older jobs other nodes wait for being dropped.
        let jobs = |shard: usize| stream::Config {
            max_age: topology.retention,
            max_messages_per_subject: JOBS_PER_SUBJECT,
            max_consumers: JOBS_MAX_CONSUMERS,
            discard: stream::DiscardPolicy::New,
            discard_new_per_subject: true,
            ..base(names::jobs_stream(shard), &names::shard_jobs(shard), stream::RetentionPolicy::WorkQueue)
        };
        let streams = [
            stream::Config {
                max_age: topology.retention,
                ..base(names::COMMANDS_STREAM, names::COMMANDS_ALL, stream::RetentionPolicy::Limits)
            },
            // Direct gets: a site's outbox asks for the last report of a kind its site stored
            // here, to know what reached the hub before its forwarder stopped.
            stream::Config {
                max_age: topology.retention,
                allow_direct: true,
                ..base(names::EVENTS_STREAM, names::EVENTS_ALL, stream::RetentionPolicy::Limits)
            },
        ];
        for config in streams {
            self.ensure_stream(config, topology.align).await?;
        }
        // Dead letters: what consumers gave up on, kept as long as commands and events (and
        // what the move of an earlier version's jobs below finds that is no job).
        let dead = stream::Config {
            max_age: names::RETENTION,
            ..base(names::DEAD_STREAM, names::DEAD_ALL, stream::RetentionPolicy::Limits)
        };
        self.jetstream().get_or_create_stream(dead).await.map_err(|e| BusError::Topology {
            what: "stream",
            name: names::DEAD_STREAM.to_string(),
            source: boxed(e),
        })?;
        // The jobs of an earlier version's one stream are moved into the shards by the
        // orchestrator (`job_shards`); until then the shards, whose subjects it holds, cannot be.
        let moving = if topology.align { self.take_legacy_jobs(topology).await? } else { false };
        if !topology.align && self.has_stream(names::LEGACY_JOBS_STREAM).await {
            warn!(
                stream = names::LEGACY_JOBS_STREAM,
                "an earlier version's jobs stream: the orchestrator moves its jobs when it starts"
            );
        } else {
            for shard in 0..names::JOB_SHARDS {
                self.ensure_stream(jobs(shard), topology.align).await?;
            }
        }
        if moving {
            self.put_moved_jobs().await?;
        }
        for bucket in names::ALL_BUCKETS {
            self.ensure_bucket(bucket, topology).await?;
        }
        Ok(())
    }

    /// Makes `config`'s stream, and with `align` brings an existing one's keeping times to
    /// `config`'s.
    async fn ensure_stream(&self, config: stream::Config, align: bool) -> Result<(), BusError> {
        let topology_err = |e: BoxError| BusError::Topology { what: "stream", name: config.name.clone(), source: e };
        let mut stream =
            self.jetstream().get_or_create_stream(config.clone()).await.map_err(|e| topology_err(boxed(e)))?;
        if !align {
            return Ok(());
        }
        let mut current = stream.info().await.map_err(|e| topology_err(boxed(e)))?.config.clone();
        // A stream made before it named its limit of consumers (nats-server 2.15 reads none as
        // 1,000). Older servers could not change that limit, and have no such default: their
        // refusal is only a warning.
        if config.max_consumers > 0 && current.max_consumers != config.max_consumers {
            let updated = stream::Config { max_consumers: config.max_consumers, ..current.clone() };
            match self.jetstream().update_stream(updated).await {
                Ok(_) => {
                    info!(stream = %config.name, max_consumers = config.max_consumers, "limit of consumers set");
                    current.max_consumers = config.max_consumers;
                }
                Err(e) => warn!(stream = %config.name, error = %e, "could not set the stream's limit of consumers"),
            }
        }
        if current.duplicate_window != config.duplicate_window
            || current.max_age != config.max_age
            || current.allow_direct != config.allow_direct
        {
            info!(
                stream = %config.name,
                duplicate_window = ?config.duplicate_window,
                max_age = ?config.max_age,
                allow_direct = config.allow_direct,
                "keeping times or direct gets changed"
            );
            let updated = stream::Config {
                duplicate_window: config.duplicate_window,
                max_age: config.max_age,
                allow_direct: config.allow_direct,
                ..current
            };
            self.jetstream().update_stream(updated).await.map_err(|e| topology_err(boxed(e)))?;
        }
        Ok(())
    }

    async fn ensure_bucket(&self, bucket: &str, topology: &Topology) -> Result<kv::Store, BusError> {
        // The ledger keeps a command's record as long as the commands stream keeps the command.
        let max_age = if bucket == names::LEDGER_BUCKET { topology.retention } else { Duration::ZERO };
        // Every bucket keeps a key's latest value only: what landfall keeps of the past it keeps
        // under keys of their own (design revisions, summaries), by policy.
        let history = 1;
        if let Ok(store) = self.jetstream().get_key_value(bucket).await {
            if topology.align {
                self.align_bucket(bucket, max_age, history).await?;
            }
            return Ok(store);
        }
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

    /// Brings an existing bucket's keeping time and history to these (the ledger's age follows
    /// the retention; a bucket made when it kept more history keeps only the latest value now).
    async fn align_bucket(&self, bucket: &str, max_age: Duration, history: i64) -> Result<(), BusError> {
        let topology_err = |e: BoxError| BusError::Topology { what: "kv bucket", name: bucket.into(), source: e };
        let mut stream =
            self.jetstream().get_stream(names::kv_stream(bucket)).await.map_err(|e| topology_err(boxed(e)))?;
        let current = stream.info().await.map_err(|e| topology_err(boxed(e)))?.config.clone();
        if current.max_age != max_age || current.max_messages_per_subject != history {
            info!(bucket, ?max_age, history, "bucket's keeping changed");
            // A bucket's duplicate window may not outlast what it keeps.
            let duplicate_window =
                if max_age.is_zero() { current.duplicate_window } else { current.duplicate_window.min(max_age) };
            let updated = stream::Config { max_age, duplicate_window, max_messages_per_subject: history, ..current };
            self.jetstream().update_stream(updated).await.map_err(|e| topology_err(boxed(e)))?;
        }
        Ok(())
    }

    /// [`Bus::ensure_topology`], tried again for up to `within` while it fails: a JetStream
    /// cluster that is still forming (or electing) refuses replicated streams for a moment.
    ///
    /// # Errors
    /// The last failure once `within` has passed.
    pub async fn ensure_topology_within(&self, topology: &Topology, within: Duration) -> Result<(), BusError> {
        let deadline = tokio::time::Instant::now() + within;
        let mut topology = topology.clone();
        for attempt in 1.. {
            match self.ensure_topology(&topology).await {
                Ok(()) => return Ok(()),
                // A single server names a cluster too once a leaf link of its own is up (a
                // regional hub's link to the core): the server's refusal of replicas is what
                // tells it is not a cluster.
                Err(e) if topology.replicas > 1 && not_clustered(&e) => {
                    info!("the server keeps no replicas (it is no cluster, though it names one): one replica each");
                    topology.replicas = 1;
                }
                Err(e) if tokio::time::Instant::now() < deadline => {
                    warn!(attempt, error = %super::error::error_chain(&e), "cannot make the streams and buckets yet");
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
