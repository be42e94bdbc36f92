//! The landfall bus contract.
//!
//! - [`pb`]: the protobuf types of package `landfall.v1` (commands, jobs, events, state).
//! - [`names`]: every subject, stream, consumer, KV bucket and header name. No other crate
//!   writes one as a literal.
//! - [`chart`]: a Helm chart's render as a site gets it (Helm's install order), and values merged.
//! - [`cluster`]: how a site's cluster is built (the BPA or Cluster API) and Cluster API's rules.
//! - [`domain`]: validated domain types and the `TryFrom` conversions at the protobuf edge.
//! - [`ids`]: message ids, correlation and deterministic ids for derived messages.
//! - [`envelope`]: the id, correlation, causation and trace context every message carries.
//! - [`outgoing`]: a message ready to publish (subject, type, payload, envelope).
//! - [`access`]: the NATS permissions of each service's user and of each site.
//! - [`design`]: site design documents (profiles, inheritance, validation, node selection).
//! - [`retention`]: what landfall keeps and for how long ([`retention::StorePolicy`]).
//! - [`rollout`]: rollout planning (which nodes a `PatchPackage` touches, canaries, waves).
//! - [`window`]: maintenance windows (cron, time zone, duration): when changes may start at a
//!   site.
//! - [`yaml`]: reading YAML that people write, under one set of rules, with errors that name
//!   the field, line and column.
//! - [`credentials`] (feature `runtime`): site credentials and the NATS auth callout protocol.
//! - [`runtime`] (feature `runtime`): the one bus runtime every service uses.

pub mod access;
pub mod chart;
pub mod cluster;
pub mod design;
pub mod domain;
pub mod envelope;
pub mod host_setup;
pub mod ids;
pub mod names;
pub mod outgoing;
pub mod pb;
pub mod retention;
pub mod rollout;
pub mod trust;
pub mod window;
pub mod yaml;

#[cfg(feature = "runtime")]
pub mod credentials;
#[cfg(feature = "runtime")]
pub mod runtime;

pub use pb::{BusCommand, BusEvent, BusJob, BusMessage};
