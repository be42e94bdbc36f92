//! Test support: a real nats-server per test ([`nats`]) and a running landfall over
//! simulated sites ([`fleet`]).

pub mod cli;
pub mod fleet;
pub mod nats;
pub mod s3;
pub mod secrets;
