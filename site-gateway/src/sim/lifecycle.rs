//! Taking things away at the simulated site: a node out of its cluster, a host deprovisioned
//! (Metal3 cleans it and it is `available` again) and deleted, the cluster's records deleted.
//! A host deleted here is landfall's own doing, so it is not announced as a departure, and a
//! gateway that subscribes later does not hear of its arrival again.

use tokio::sync::mpsc;
use tracing::info;

use super::SimSite;
use super::timing::pause;
use crate::backend::{BackendError, ProvisioningState as S};

/// What deprovisioning a host does next, decided under the lock.
enum Next {
    /// Nothing to deprovision: no host, or it is available with no image.
    Done(bool),
    /// The host is on its way somewhere (registering, provisioning): look again when it moves.
    Wait(tokio::sync::watch::Receiver<S>),
    /// The image is coming off: wait as long as Metal3's cleaning takes, then it is available.
    Clean,
}

impl SimSite {
    /// The hosts the site has, by name.
    pub(super) fn host_names_now(&self) -> Vec<String> {
        self.inner.lock().hosts.iter().map(|(name, _)| name.clone()).collect()
    }

    /// Takes the node out of the cluster: it runs no binaries any more, and no cordon is kept
    /// for it. The cluster keeps its first master while another master runs.
    pub(super) fn delete_cluster_node(&self, node: &str) -> bool {
        let mut st = self.inner.lock();
        st.cordoned.remove(node);
        st.drained.remove(node);
        let Some(host) = st.hosts.get_mut(node) else { return false };
        if host.binaries.take().is_none() {
            return false;
        }
        if st.cluster_master.as_deref() == Some(node) {
            let next =
                st.hosts.iter().find(|(n, h)| n.as_str() != node && h.binaries.is_some()).map(|(n, _)| n.clone());
            st.cluster_master = next;
        }
        info!(site = %self.inner.site, node, "node deleted from the cluster");
        true
    }

    /// Deprovisions the host: `deprovisioning` for as long as cleaning takes, then `available`
    /// with no image and no binaries. Each state it passes goes on `progress`.
    pub(super) async fn deprovision(
        &self,
        node: &str,
        progress: mpsc::UnboundedSender<S>,
    ) -> Result<bool, BackendError> {
        loop {
            match self.deprovision_step(node, &progress) {
                Next::Done(had) => return Ok(had),
                Next::Wait(mut state) => {
                    state.changed().await.map_err(|_| BackendError::transient_reason("the site stopped"))?;
                }
                Next::Clean => {
                    pause(self.inner.config.dwell(S::Deprovisioning)).await;
                    let mut st = self.inner.lock();
                    if let Some(h) = st.hosts.get_mut(node).filter(|h| h.state() == S::Deprovisioning) {
                        h.set_state(&self.inner.site, node, S::Available);
                        let _ = progress.send(S::Available);
                    }
                }
            }
        }
    }

    fn deprovision_step(&self, node: &str, progress: &mpsc::UnboundedSender<S>) -> Next {
        let mut st = self.inner.lock();
        let Some(host) = st.hosts.get_mut(node) else { return Next::Done(false) };
        if host.attempt.is_some() {
            return Next::Wait(host.state.subscribe());
        }
        match host.state() {
            S::Available if host.image.is_none() => Next::Done(true),
            S::Provisioned | S::Available => {
                host.image = None;
                host.binaries = None;
                host.set_state(&self.inner.site, node, S::Deprovisioning);
                let _ = progress.send(S::Deprovisioning);
                Next::Clean
            }
            // Taken up again: an earlier call started it and went.
            S::Deprovisioning => Next::Clean,
            _ => Next::Wait(host.state.subscribe()),
        }
    }

    /// Deletes the host, and forgets that it arrived.
    pub(super) fn forget(&self, node: &str) -> bool {
        let mut st = self.inner.lock();
        st.cordoned.remove(node);
        st.drained.remove(node);
        st.arrived.retain(|n| n.name.as_str() != node);
        let had = st.hosts.remove(node);
        if had {
            info!(site = %self.inner.site, host = node, "host deleted");
        }
        had
    }

    /// Deletes the cluster's records: the BPA's resources, its kubeconfig, what was applied to it
    /// and handed to its provisioning.
    pub(super) fn tear_down(&self) -> Vec<String> {
        let mut st = self.inner.lock();
        let site = self.inner.site.clone();
        let mut gone = Vec::new();
        if st.cluster_master.take().is_some() {
            gone.push(format!("Provisioning/{site}"));
            gone.push(format!("Software/{site}"));
        }
        if st.kubeconfig.take().is_some() {
            gone.push(format!("Secret/{site}-kubeconfig"));
        }
        st.containers.clear();
        st.cache.clear();
        st.cordoned.clear();
        st.drained.clear();
        gone.sort();
        gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SiteBackend;
    use crate::sim::testing::installed_site;

    #[tokio::test(start_paused = true)]
    async fn a_node_is_taken_out_of_its_cluster_deprovisioned_and_forgotten_once() {
        let (site, _) = installed_site().await;
        let name = "w-1".to_string();
        assert!(site.delete_node(&name).await.unwrap());
        assert!(!site.delete_node(&name).await.unwrap(), "a second delete finds no node");

        let (tx, mut rx) = mpsc::unbounded_channel();
        assert!(site.deprovision_host(&name, Default::default(), tx.clone()).await.unwrap());
        assert_eq!(rx.recv().await, Some(S::Deprovisioning));
        assert_eq!(rx.recv().await, Some(S::Available));
        assert!(
            site.deprovision_host(&name, Default::default(), tx).await.unwrap(),
            "an available host has nothing to take off"
        );
        assert!(site.hosts().contains(&(name.clone(), S::Available)));

        assert!(site.forget_host(&name).await.unwrap());
        assert!(!site.forget_host(&name).await.unwrap());
        assert!(!site.host_names().await.unwrap().contains(&name));
        assert!(!site.deprovision_host(&name, Default::default(), mpsc::unbounded_channel().0).await.unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn tearing_down_the_cluster_deletes_its_records_once() {
        let (site, _) = installed_site().await;
        site.kubeconfig().await.unwrap();
        let gone = site.tear_down_cluster().await.unwrap();
        assert_eq!(gone.len(), 3, "{gone:?}");
        assert!(site.tear_down_cluster().await.unwrap().is_empty());
        assert!(site.kubeconfig().await.is_err(), "no cluster, no kubeconfig");
    }
}
