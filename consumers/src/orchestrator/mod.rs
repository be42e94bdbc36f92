//! The provisioning orchestrator: commands in, sagas advanced in KV, jobs and events out.
//!
//! Two durable consumers share one [`Orchestrator`]: one on commands, one on the events that
//! move sagas forward (a third counts rollouts' site reports). Any number of replicas may run;
//! KV compare-and-set decides who wins.
//!
//! - [`service`]: the shared state every handler works on;
//! - `register`, `design`, `nodes`: the command handlers, by what they change;
//! - `install`: the install saga, executed (its decisions are [`crate::saga`]);
//! - `ledger`: every command carried out, refused or given up, by id, so a late copy does nothing;
//! - `order`: a scope's commands carried out in stream order across replicas;
//! - `compact`: finished sagas and rollouts replaced by summaries after the retention;
//! - `remove_site`: a site taken out of landfall;
//! - `lifecycle`: a node removed or reprovisioned, a site decommissioned (its decisions are
//!   [`crate::lifecycle`]);
//! - `stranded`: a site's jobs its durable will not deliver again, delivered again;
//! - `durables`: the sites' durables, which the hub keeps in memory, made again after it restarts;
//! - `run`: the consumers, started, and commands dispatched to their handlers.

mod compact;
mod design;
mod durables;
mod install;
mod ledger;
mod lifecycle;
mod nodes;
mod order;
mod register;
mod remove_site;
mod run;
pub mod service;
mod stranded;

pub use compact::Compacted;
pub use durables::make_missing_durables;
pub use install::saga_event_filters;
pub use run::{OrchestratorOptions, run_orchestrator, run_orchestrator_with};
pub use service::Orchestrator;
pub use stranded::{STRANDED_AFTER, redeliver_stranded_jobs};
