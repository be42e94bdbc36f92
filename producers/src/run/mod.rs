//! Running landfall's services in this process: `landfall up` (everything on one machine,
//! nats-server as a child), `landfall serve …` (one service), and what they share.

pub mod demo;
pub mod embedded;
pub mod gateway;
pub mod gateway_identity;
pub mod identity;
pub mod otlp;
pub mod serve;
pub mod service;
pub mod telemetry;
pub mod up;
