//! The simulated Metal3 at work: a new host's walk to `available` and each provisioning
//! attempt, run as tasks that follow [`metal3`](super::metal3)'s state machine, and the
//! `provision_host` calls that start or join them.

use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tracing::{debug, warn};

use super::faults::provisioning_error;
use super::metal3::{Step, provision_step, registration_next};
use super::persist::Resume;
use super::state::{Attempt, Host, Image, Outcome, State};
use super::timing::pause;
use super::{Inner, SimSite};
use crate::backend::{BackendError, HostRequest, ProvisioningState as S};

impl Inner {
    pub(super) fn set_state(&self, host: &str, state: S) {
        if let Some(h) = self.lock().hosts.get_mut(host) {
            h.set_state(&self.site, host, state);
        }
    }

    /// Ends a provisioning attempt: the host is provisioned, or back to available.
    fn finish(&self, host: &str, image: Image, outcome: Result<(), BackendError>, done: &watch::Sender<Outcome>) {
        let mut st = self.lock();
        if let Some(h) = st.hosts.get_mut(host) {
            h.attempt = None;
            h.image = outcome.is_ok().then_some(image);
            h.set_state(&self.site, host, if outcome.is_ok() { S::Provisioned } else { S::Available });
        }
        if let Err(error) = &outcome {
            warn!(site = %self.site, host, error = %error.reason(), "provisioning failed");
        }
        done.send_replace(Some(outcome));
    }
}

/// What a `provision_host` call does next.
enum Next {
    /// The host already runs the image.
    Done,
    /// The host is busy; look again when its state changes.
    Wait(watch::Receiver<S>),
    /// Wait for this provisioning attempt's result.
    Join(watch::Receiver<Outcome>),
}

/// A `provision_host` caller's subscription to its host's states, dropped with the call.
struct Watcher<'a> {
    inner: &'a Inner,
    host: &'a str,
    progress: mpsc::UnboundedSender<S>,
}

impl Drop for Watcher<'_> {
    fn drop(&mut self) {
        if let Ok(mut st) = self.inner.state.lock()
            && let Some(h) = st.hosts.get_mut(self.host)
        {
            h.watchers.retain(|w| !w.same_channel(&self.progress));
        }
    }
}

impl SimSite {
    /// Provisions the host with the request's image, joining an identical provisioning under
    /// way, and sends every state the host passes through on `progress`.
    pub(super) async fn provision(
        &self,
        req: &HostRequest,
        progress: mpsc::UnboundedSender<S>,
    ) -> Result<(), BackendError> {
        let host = req.node.name.as_str();
        if req.bmc.is_some() {
            self.inner.lock().effects.bmc_logins += 1;
        }
        // As a real site: a host it does not have yet is registered through its BMC, which
        // needs the credentials the hub could not be asked for.
        if req.bmc.is_none() && req.bmc_out_of_reach && !self.inner.lock().hosts.contains_key(host) {
            return Err(BackendError::transient_reason(format!(
                "host {host} is not registered yet, and its BMC credentials wait for the hub to be reachable"
            )));
        }
        let _watcher = self.watch_host(host, progress);
        let image = Image::of(req);
        loop {
            match self.next_step(host, &image) {
                Next::Done => return Ok(()),
                Next::Join(done) => return wait_outcome(done).await,
                Next::Wait(mut state) => state.changed().await.map_err(|_| site_stopped())?,
            }
        }
    }

    /// The host, registered first if the site does not have it yet.
    pub(super) fn ensure_host<'s>(&self, st: &'s mut State, host: &str) -> &'s mut Host {
        if !st.hosts.contains_key(host) {
            debug!(site = %self.inner.site, host, state = %S::Registering, "host state");
            tokio::spawn(walk(Arc::clone(&self.inner), host.to_string(), S::Registering));
        }
        st.hosts.get_or_insert(host, Host::new)
    }

    /// Carries on with what a host restored from the site's file was doing.
    pub(super) fn resume(&self, host: String, resume: Resume) {
        let inner = Arc::clone(&self.inner);
        match resume {
            Resume::Provision { image, redeploy, done } => tokio::spawn(attempt(inner, host, image, redeploy, done)),
            Resume::Walk(from) => tokio::spawn(walk(inner, host, from)),
        };
    }

    /// Sends the host's current state on `progress`, then every state it passes through.
    fn watch_host<'a>(&'a self, host: &'a str, progress: mpsc::UnboundedSender<S>) -> Watcher<'a> {
        let mut st = self.inner.lock();
        let h = self.ensure_host(&mut st, host);
        if progress.send(h.state()).is_ok() {
            h.watchers.push(progress.clone());
        }
        Watcher { inner: &self.inner, host, progress }
    }

    /// Decides, under the lock, whether to return, wait, join an attempt, or start one.
    fn next_step(&self, host: &str, image: &Image) -> Next {
        let mut st = self.inner.lock();
        let h = self.ensure_host(&mut st, host);
        let redeploy = match provision_step(h, image) {
            Step::Done => return Next::Done,
            Step::Wait => return Next::Wait(h.state.subscribe()),
            Step::Join(attempt) => return Next::Join(attempt.done.clone()),
            Step::Start { redeploy } => redeploy,
        };
        let (done_tx, done) = watch::channel(None);
        h.attempt = Some(Attempt { image: image.clone(), done: done.clone() });
        h.image = None;
        h.binaries = None;
        h.set_state(&self.inner.site, host, Step::first_state(redeploy));
        st.count(|e| &mut e.provisions, host);
        tokio::spawn(attempt(Arc::clone(&self.inner), host.to_string(), image.clone(), redeploy, done_tx));
        Next::Join(done)
    }
}

/// A host's walk to `available`, from the state it is in.
async fn walk(inner: Arc<Inner>, host: String, mut state: S) {
    while let Some(next) = registration_next(state) {
        pause(inner.config.dwell(state)).await;
        inner.set_state(&host, next);
        state = next;
    }
}

/// One provisioning attempt, from the state `next_step` left the host in to its outcome.
async fn attempt(inner: Arc<Inner>, host: String, image: Image, redeploy: bool, done: watch::Sender<Outcome>) {
    let c = &inner.config;
    if redeploy {
        pause(c.dwell(S::Deprovisioning)).await;
        inner.set_state(&host, S::Provisioning);
    }
    pause(c.dwell(S::Provisioning)).await;
    let failed = inner.lock().faults.provisioning.contains(&host);
    if failed {
        inner.set_state(&host, S::Deprovisioning);
        pause(c.dwell(S::Deprovisioning)).await;
    }
    let outcome = if failed { Err(provisioning_error(&host, &image.spec)) } else { Ok(()) };
    inner.finish(&host, image, outcome, &done);
}

async fn wait_outcome(mut done: watch::Receiver<Outcome>) -> Result<(), BackendError> {
    let outcome = done.wait_for(Option::is_some).await.map(|o| (*o).clone()).map_err(|_| site_stopped())?;
    outcome.unwrap_or_else(|| Err(site_stopped()))
}

fn site_stopped() -> BackendError {
    BackendError::transient_reason("simulated site stopped")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bus_schema::domain::Role;

    use super::*;
    use crate::sim::testing::{host, node, one_host, provision, provisions};
    use crate::sim::{SimConfig, SimEffects};

    #[tokio::test(start_paused = true)]
    async fn a_new_host_walks_to_available() {
        let site = SimSite::new("edge-01", &[node("node-1", Role::Master)], SimConfig::fast());
        assert_eq!(site.hosts(), [("node-1".to_string(), S::Registering)]);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(site.hosts(), [("node-1".to_string(), S::Available)]);
        assert_eq!(site.effects(), SimEffects::default());
    }

    #[tokio::test(start_paused = true)]
    async fn provisioning_reports_every_state_in_order_and_is_idempotent() {
        let (site, n1) = one_host();
        let (result, states) = provision(&site, &host(&n1, 'a')).await;
        result.unwrap();
        let walk = [S::Registering, S::Inspecting, S::Preparing, S::Available, S::Provisioning, S::Provisioned];
        assert_eq!(states, walk);
        let (again, states) = provision(&site, &host(&n1, 'a')).await;
        again.unwrap();
        assert_eq!(states, [S::Provisioned]);
        assert_eq!(provisions(&site, "node-1"), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_unknown_host_is_registered_first() {
        let site = SimSite::new("edge-01", &[], SimConfig::instant());
        let (result, states) = provision(&site, &host(&node("node-9", Role::Worker), 'a')).await;
        result.unwrap();
        assert_eq!(states.first(), Some(&S::Registering));
        assert_eq!(site.hosts(), [("node-9".to_string(), S::Provisioned)]);
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_identical_provisions_share_one_effect() {
        let (site, n1) = one_host();
        let req = host(&n1, 'a');
        let ((a, a_states), (b, b_states)) = tokio::join!(provision(&site, &req), provision(&site, &req));
        a.unwrap();
        b.unwrap();
        assert_eq!(a_states.last(), Some(&S::Provisioned));
        assert_eq!(b_states.last(), Some(&S::Provisioned));
        assert_eq!(provisions(&site, "node-1"), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn another_image_deprovisions_then_provisions() {
        let (site, n1) = one_host();
        provision(&site, &host(&n1, 'a')).await.0.unwrap();
        let (result, states) = provision(&site, &host(&n1, 'b')).await;
        result.unwrap();
        assert_eq!(states, [S::Provisioned, S::Deprovisioning, S::Provisioning, S::Provisioned]);
        assert_eq!(provisions(&site, "node-1"), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_provisioning_leaves_the_host_available_for_a_retry() {
        let (site, n1) = one_host();
        site.fail_provisioning("node-1");
        let req = host(&n1, 'a');
        let (result, states) = provision(&site, &req).await;
        let Err(BackendError::HostFailed { host, error_type, message }) = result else {
            panic!("expected HostFailed, got {result:?}");
        };
        assert_eq!((host.as_str(), error_type.as_str()), ("node-1", "provisioning error"));
        assert!(message.contains("node-1") && message.contains(&req.image.url), "{message}");
        assert_eq!(states[states.len() - 3..], [S::Provisioning, S::Deprovisioning, S::Available]);
        assert_eq!(site.hosts(), [("node-1".to_string(), S::Available)]);
        site.heal("node-1");
        provision(&site, &req).await.0.unwrap();
        assert_eq!(provisions(&site, "node-1"), 2);
    }
}
