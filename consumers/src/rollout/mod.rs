//! Rollouts: a `PatchPackage` carried out across sites, canaries first, wave after wave.
//!
//! State lives in `landfall-sagas`, sized to stay small at any fleet size:
//! - `rollout.<id>.plan.<n>`: the plan, cut in chunks, written once and never changed (so any
//!   replica may cache it);
//! - `rollout.<id>`: phase, counters, the current wave, and two bits per planned site
//!   (`dispatched`, `done`), advanced with compare-and-set, with an outbox of events;
//! - `rollout.<id>.site.<site>`: one site's results, written when it reports.
//!
//! A site is patched under the site lease (never while an install or another rollout holds it),
//! by one `PatchNodes` job its gateway carries out at most `max_unavailable` nodes at a time. The
//! gateway's `SitePatched` is counted once (its done bit); when a wave's sites are all counted,
//! the next wave starts. A periodic tick, on every replica, starts sites that were busy, and
//! ends waves that time out.
//!
//! [`decide`] holds every decision as a pure function of the rollout, what was read and the time
//! it is; the executor ([`Rollouts`]) reads, calls them, writes with compare-and-set, publishes.
//! Which nodes, canaries and waves a plan has is [`bus_schema::rollout`]'s.

pub mod decide;
mod executor;

pub use decide::{advance, count_site, is_terminal, wave_range};
pub use executor::{Rollouts, TICK};
