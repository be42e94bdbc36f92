//! Test support: a real nats-server per test ([`nats`]) and a running landfall over
//! simulated sites ([`fleet`]).

pub mod api;
pub mod bpa_rest;
pub mod browser;
pub mod cli;
pub mod fleet;
pub mod helm;
pub mod intruder;
pub mod kube;
pub mod kube_site;
pub mod nats;
pub mod node;
pub mod oidc;
pub mod procs;
pub mod reference;
pub mod s3;
pub mod secrets;
pub mod site_state;
pub mod swtpm;
pub mod topology;
pub mod up;

/// The python the Python tests run (`$LANDFALL_PYTHON`, a virtualenv made by
/// `scripts/ensure-python-env`, which `scripts/test` sets).
pub fn python() -> std::path::PathBuf {
    match std::env::var_os("LANDFALL_PYTHON") {
        Some(p) if !p.is_empty() => std::path::PathBuf::from(p),
        _ => panic!(
            "LANDFALL_PYTHON is not set: export LANDFALL_PYTHON=\"$(scripts/ensure-python-env)\", \
             or run the tests with scripts/test"
        ),
    }
}
