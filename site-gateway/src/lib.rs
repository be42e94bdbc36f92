//! The site gateway: one per site. It consumes only its own site's jobs, drives the site's
//! backend (Metal3 + BPA, or the simulation), publishes what happened as events, announces
//! the hosts that arrive at the site, and answers the kubeconfig consumer's requests.

pub mod alive;
mod announce;
pub mod backend;
pub mod cache;
pub mod capi;
pub mod credentials;
pub mod enrollment;
pub mod eviction;
pub mod gateway;
pub mod identity;
pub mod inbox;
pub mod kube_site;
pub mod outbox;
pub mod sim;

pub use backend::SiteBackend;
pub use cache::ArtifactCache;
pub use gateway::{Gateway, HostScope, STEPS_SHOWN_AFTER, run_gateway, run_gateway_host, run_gateway_showing_steps};
pub use sim::control::serve_sim_control;
