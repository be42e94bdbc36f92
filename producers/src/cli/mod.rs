//! The client commands, one module per command group, each owning its arguments: they
//! publish commands and read events and KV state, through `bus-schema` alone (`package upload`
//! and `site stage` also reach the artifact store). `approval`, `whoami` and `audit --api` go
//! through the HTTP API instead ([`api_client`]), as the person logged in to it.

pub mod api_client;
pub mod approval;
pub mod artifacts;
pub mod audit;
pub mod chart;
pub mod command;
pub mod connect;
pub mod dead;
pub mod design;
pub mod events;
pub mod hsm;
pub mod identity;
pub mod lifecycle;
pub mod login;
pub mod node;
pub mod output;
pub mod package;
pub mod package_args;
pub mod progress;
pub mod render;
pub mod rollout;
pub mod secrets;
pub mod site;
pub mod status;
pub mod whoami;
