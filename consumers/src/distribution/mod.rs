//! Package bytes, from upload to a site's cache: [`artifacts`], the content-addressed store
//! (a directory or S3) uploads go into, and [`service`], the distribution service that sends
//! what a gateway's cache lacks, chunk by chunk, as the gateway asks; and [`render`], each
//! site's render of the helm charts its design runs, made with the real helm and kept there.

pub mod artifacts;
pub mod render;
pub mod service;

pub use service::{DEFAULT_CHUNK_SIZE, DistributionConfig, DistributionStats, MAX_CHUNK_SIZE, run_distribution};
