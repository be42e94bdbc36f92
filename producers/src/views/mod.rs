//! The read models the CLI and the HTTP API share, pure where they can be: what a rollout's
//! plan and progress look like, what nodes run against their design, the catalog, and events
//! and values as people read them, a command as the ledger recorded it, and the charts rendered
//! for a site.

pub mod attention;
pub mod audit;
pub mod catalog;
pub mod charts;
pub mod command;
pub mod event;
pub mod human;
pub mod link;
pub mod observed;
pub mod plan;
pub mod rollout;
pub mod rollout_event;
