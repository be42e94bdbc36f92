//! Hosts appearing at the simulated site: those it starts with ([`SimSite::add_host`]) and
//! those racked and cabled later ([`SimSite::arrive`]), which every
//! [`SiteBackend::host_changes`](crate::SiteBackend::host_changes) subscriber hears of.

use bus_schema::domain::NodeDesign;
use tokio::sync::mpsc;
use tracing::info;

use super::SimSite;
use crate::backend::HostNotice;

impl SimSite {
    /// Registers a host the site starts with: it walks registering → inspecting → preparing →
    /// available. A host the site already has is left as it is. Unlike [`SimSite::arrive`], the
    /// host is not announced: it is in the site's design already.
    pub fn add_host(&self, node: &NodeDesign) {
        self.ensure_host(&mut self.inner.lock(), node.name.as_str());
    }

    /// A new host appears at the site (racked and cabled after the install): it registers as
    /// [`SimSite::add_host`] does, and is announced to every
    /// [`SiteBackend::host_changes`](crate::SiteBackend::host_changes) subscriber. Returns
    /// `false`, and announces nothing, when the site has a host of that name.
    pub fn arrive(&self, node: &NodeDesign) -> bool {
        let mut st = self.inner.lock();
        if st.hosts.contains_key(node.name.as_str()) {
            return false;
        }
        self.ensure_host(&mut st, node.name.as_str());
        info!(site = %self.inner.site, host = %node.name, mac = %node.boot_mac, "host arrived");
        st.arrived.push(node.clone());
        st.arrival_watchers.retain(|w| w.send(HostNotice::arrived(node.clone())).is_ok());
        true
    }

    /// Every host that arrived so far, then each new one as it arrives.
    pub(super) fn arrivals(&self) -> mpsc::UnboundedReceiver<HostNotice> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut st = self.inner.lock();
        // Under the lock, so no arrival is missed between the backlog and the subscription.
        if st.arrived.iter().all(|n| tx.send(HostNotice::arrived(n.clone())).is_ok()) {
            st.arrival_watchers.push(tx);
        }
        rx
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bus_schema::domain::Role;

    use super::*;
    use crate::SiteBackend;
    use crate::backend::ProvisioningState as S;
    use crate::sim::testing::{node, one_host};

    #[tokio::test(start_paused = true)]
    async fn an_arrival_is_announced_once_to_every_subscriber() {
        let (site, n1) = one_host();
        let mut early = site.host_changes();
        let w9 = node("w-9", Role::Worker);
        assert!(site.arrive(&w9));
        assert!(!site.arrive(&w9), "a host the site has is not announced again");
        assert!(!site.arrive(&n1), "nor is a host it started with");
        let mut late = site.host_changes();
        for arrivals in [&mut early, &mut late] {
            assert_eq!(arrivals.recv().await.and_then(HostNotice::into_arrival), Some(w9.clone()));
            assert!(arrivals.try_recv().is_err());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(site.hosts(), [("node-1".to_string(), S::Available), ("w-9".to_string(), S::Available)]);
    }
}
