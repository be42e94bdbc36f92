//! The jobs that reached the site, kept at the site until its gateway has carried them out. A
//! gateway on its site's leaf node takes each job the hub delivers, stores it in
//! [`names::INBOX_STREAM`] (the site's own JetStream domain) and only then acknowledges it to
//! the hub; it carries the jobs out from there, through a durable consumer of the leaf node's.
//! A gateway killed while the link is down starts again and goes on with the jobs it had, and
//! the reports go to its outbox ([`crate::outbox`]) as before: the site's work does not wait
//! for the link.
//!
//! A job the hub delivers again (its acknowledgement was lost with the link) is stored once:
//! the inbox's duplicate window is as long as it keeps jobs.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, stream};
use bus_schema::names;
use bus_schema::pb;
use bus_schema::runtime::{self, Bus, BusError, ConsumerSpec, Delivery, HandlerError, RejectAs};

/// How long the inbox keeps a job, done or not.
pub const INBOX_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);
/// The most the inbox holds; past it a new job is refused (the hub delivers it again later)
/// rather than one not carried out dropped.
pub const INBOX_MAX_BYTES: i64 = 256 * 1024 * 1024;

/// Makes the inbox, in the domain of the server `bus` is connected to (the site's leaf node),
/// or brings one made by an earlier version to this one's keeping times.
pub async fn open(bus: &Bus) -> Result<(), BusError> {
    let err = |e: async_nats::Error| BusError::Topology { what: "stream", name: names::INBOX_STREAM.into(), source: e };
    let local = bus.local_jetstream();
    let config = stream::Config {
        name: names::INBOX_STREAM.to_string(),
        subjects: vec![names::INBOX_ALL.to_string()],
        storage: stream::StorageType::File,
        retention: stream::RetentionPolicy::Limits,
        max_age: INBOX_RETENTION,
        max_bytes: INBOX_MAX_BYTES,
        discard: stream::DiscardPolicy::New,
        duplicate_window: INBOX_RETENTION,
        max_message_size: names::MAX_PAYLOAD as i32,
        ..Default::default()
    };
    crate::outbox::ensure_local_stream(&local, config).await.map_err(err)?;
    Ok(())
}

/// Jobs carried out at once: every host of a site of up to a thousand provisions together, so
/// each has its BMC credentials from the hub before a cut, not after.
pub const CONCURRENCY: usize = 1024;
/// A job whose gateway was killed is taken up again this soon by the next: progress is sent
/// every third of it while a job runs, over the leaf node's own connection.
pub const ACK_WAIT: Duration = Duration::from_secs(3);

/// How the gateway carries out the jobs kept at its site: a durable pull consumer of the leaf
/// node's, retried until settled (a site files no dead letters), its rejections filed as the
/// hub's durable's.
pub fn spec(site: &str) -> ConsumerSpec {
    ConsumerSpec::new(
        names::INBOX_STREAM,
        names::INBOX_CONSUMER,
        vec![names::inbox_subject(&names::site_every_job(site))],
        RejectAs::Message { consumer: names::gateway_consumer(site) },
    )
    .concurrency(CONCURRENCY)
    .ack_wait(ACK_WAIT)
    .max_attempts(None)
    .in_local_domain()
}

/// Takes the hub's deliveries: each job is stored in the inbox, and acknowledged once stored.
pub struct Keep {
    local: jetstream::Context,
}

impl Keep {
    pub fn new(bus: &Bus) -> Self {
        Self { local: bus.local_jetstream() }
    }
}

impl runtime::Handler for Keep {
    async fn handle(&self, d: &Delivery) -> Result<(), HandlerError> {
        let subject = names::inbox_subject(&d.subject);
        let failed =
            |e: async_nats::Error| HandlerError::transient(format!("keeping job {} at the site", d.envelope.id), e);
        let ack = self
            .local
            .publish_with_headers(subject, d.envelope.headers(&d.type_name), d.payload.clone())
            .await
            .map_err(|e| failed(e.into()))?;
        ack.await.map_err(|e| failed(e.into()))?;
        Ok(())
    }
}

/// Hands a kept job to `H` as the hub delivered it: on its own subject.
pub struct FromInbox<H>(pub Arc<H>);

impl<H: runtime::Handler> runtime::Handler for FromInbox<H> {
    async fn handle(&self, d: &Delivery) -> Result<(), HandlerError> {
        let Some(origin) = names::inbox_origin(&d.subject) else {
            return Err(HandlerError::reject(pb::RejectCode::Malformed, format!("{} is not a kept job", d.subject)));
        };
        let job = Delivery { subject: origin.to_string(), ..d.clone() };
        self.0.handle(&job).await
    }
}
