//! Test support: a real nats-server per test ([`nats`]) and a running landfall over
//! simulated sites ([`fleet`]).

pub mod api;
pub mod bpa_rest;
pub mod cli;
pub mod fleet;
pub mod kube;
pub mod kube_site;
pub mod nats;
pub mod procs;
pub mod s3;
pub mod secrets;
pub mod topology;
