//! The one bus runtime every landfall service uses: connect (with a server version check),
//! ensure the streams, consumers and KV buckets exist, publish with a `Nats-Msg-Id` and wait
//! for the PubAck, and the consume loop that acks only after the handler's effect is durable.
//!
//! One file per job; every item is re-exported here, so other crates name it
//! `bus_schema::runtime::X`:
//! - `connect.rs`: [`Access`], [`Bus::connect`] and the server checks (`version.rs`: which
//!   servers).
//! - `error.rs`: [`BusError`], its [`ErrorKind`], and the backoff for transient failures.
//! - `topology.rs`: the streams and buckets ([`Bus::ensure_topology`]).
//! - `headers.rs`: an [`Envelope`] to and from NATS headers ([`Envelope::headers`]).
//! - `publish.rs`: [`Bus::publish`] and friends (of an [`Outgoing`], which lives outside the
//!   runtime so that decisions can build one), rejection events.
//! - `events.rs`: an ordered reader of the events stream ([`Bus::read_events`]).
//! - `kv.rs`: [`Kv`], a bucket of protobuf values with compare-and-set writes and scans;
//!   `kv_update.rs`: [`Kv::update_with`], read–apply–compare-and-set–retry (and
//!   [`Kv::create_or_get`] on top of it); `kv_compact.rs`: purges with compare-and-set and
//!   the sweep of the markers deletions leave ([`Kv::sweep_markers`]).
//! - `catalog.rs`: the package catalog and the observed state, read as a whole.
//! - `delivery.rs`: what a handler gets ([`Delivery`]) and answers ([`HandlerError`]).
//! - `consume.rs`: the consume loop ([`consume()`]); `settle.rs`: one delivery's life in it
//!   (its turn, its attempts, parked between them, acked, rejected or given up), with
//!   `keyed_order.rs` keeping messages that share a key in order.
//! - `dead_letter.rs`: what a consumer gives up on, filed in `LANDFALL_DEAD`
//!   ([`Bus::file_dead_letter`]), and read, replayed and removed by operators.
//! - `site_removal.rs`: a removed site's gateway durable and undelivered jobs, dropped.
//! - `request.rs` and `serve.rs`: core request/reply, asked ([`Bus::request`]) and answered
//!   ([`serve_requests`]).
//! - `trace.rs`: spans of what is handled, published and answered, for a tracing backend
//!   ([`trace::set_sink`]).
//! - `store_health.rs`: whether the store has room ([`store_health::assess`]), and the writes
//!   refused for lack of it.

mod catalog;
mod connect;
mod consume;
mod dead_letter;
mod delivery;
pub mod dispatch;
pub mod dispatched;
mod error;
mod events;
mod headers;
mod job_shards;
mod keyed_order;
mod kv;
mod kv_compact;
mod kv_update;
mod publish;
mod request;
mod serve;
mod settle;
mod site_removal;
pub mod store_health;
mod topology;
pub mod trace;
mod version;

pub use catalog::{observed_nodes, package_refs, site_observed_nodes};
pub use connect::{Access, Bus, Fixed, Presented, presenting, private_file};
pub use consume::{ConsumerSpec, DEFAULT_MAX_ATTEMPTS, Handler, consume, ensure_consumer};
pub use dead_letter::{Replayed, StoredDeadLetter, dead_letter_type};
pub use delivery::{Delivery, HandlerError, RejectAs, Rejection, reject_code_label};
pub use dispatch::JobDelivery;
pub use error::{BusError, ErrorKind, STORE_FULL_CODES, error_chain, is_store_full, retry_delay};
pub use events::{EventReader, ReadEvent};
pub use kv::{Cas, Kv, KvChange};
pub use kv_update::{UPDATE_ATTEMPTS, Update};
pub use request::RequestError;
pub use serve::{Reply, error_reply, reply_error_text, serve_requests};
pub use topology::{JOBS_MAX_CONSUMERS, Topology};
pub use version::{MIN_SERVER_VERSION, parse_server_version, server_supported};

pub use crate::envelope::{Envelope, trace_id};
pub use crate::outgoing::Outgoing;
