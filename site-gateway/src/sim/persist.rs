//! A simulated site kept in a file, so that a gateway restarted after a crash finds the site's
//! hosts as it left them, as a real site's Metal3 keeps them whatever becomes of its gateway.
//!
//! The file is JSON, written again (to a scratch file, then renamed over it) each time the
//! site's state changes, before the change is reported to anyone. A provisioning under way when
//! the process died goes on from where the host was, as Ironic's would, and does not count as a
//! second one; a host that was still registering walks on to `available`. Injected failures
//! are not kept.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use bus_schema::domain::{NodeDesign, PackageRef};
use bus_schema::pb;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tracing::warn;

use super::{Attempt, Binary, Host, Image, Inner, S, SimConfig, SimEffects, SimSite, State, pause, provision};
use crate::backend::ImageSpec;

/// Why a simulated site's state file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SimStateError {
    #[error("read the simulated site's state {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parse the simulated site's state {path}")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("the simulated site's state {path} is site {found}'s, not {site}'s")]
    OtherSite { path: PathBuf, site: String, found: String },
    #[error("the simulated site's state {path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
}

/// Where a site's state is kept, and the bytes written last (an unchanged state is not
/// written again).
#[derive(Debug)]
pub(super) struct StateFile {
    path: PathBuf,
    written: Mutex<Vec<u8>>,
}

impl StateFile {
    fn new(path: &Path) -> Self {
        Self { path: path.to_path_buf(), written: Mutex::default() }
    }

    fn save(&self, site: &str, state: &State) {
        let bytes = match serde_json::to_vec_pretty(&Saved::of(site, state)) {
            Ok(b) => b,
            Err(error) => return warn!(site, %error, "cannot encode the simulated site's state"),
        };
        let mut written = self.written.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if *written == bytes {
            return;
        }
        let scratch = self.path.with_extension("tmp");
        match std::fs::write(&scratch, &bytes).and_then(|()| std::fs::rename(&scratch, &self.path)) {
            Ok(()) => *written = bytes,
            Err(error) => warn!(site, path = %self.path.display(), %error, "cannot write the simulated site's state"),
        }
    }
}

/// The site's state under its lock; written to the site's file (when it has one) as the lock
/// is let go, so no change is seen by anyone before it is kept.
pub(super) struct StateGuard<'a> {
    state: MutexGuard<'a, State>,
    inner: &'a Inner,
}

impl<'a> StateGuard<'a> {
    pub(super) fn new(inner: &'a Inner) -> Self {
        Self { state: inner.state.lock().expect("sim state lock"), inner }
    }
}

impl Deref for StateGuard<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.state
    }
}

impl DerefMut for StateGuard<'_> {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.state
    }
}

impl Drop for StateGuard<'_> {
    fn drop(&mut self) {
        if let Some(file) = &self.inner.file {
            file.save(&self.inner.site, &self.state);
        }
    }
}

/// The file's content.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Saved {
    site: String,
    hosts: BTreeMap<String, SavedHost>,
    /// The hosts that arrived after the start, announced again by a restarted gateway (under
    /// the same command id, so the bus drops the copy).
    arrived: Vec<pb::NodeSpec>,
    cluster_master: Option<String>,
    kubeconfig: Option<String>,
    containers: BTreeMap<String, String>,
    /// The artifacts handed to provisioning, by sha256.
    cache: BTreeSet<String>,
    effects: SimEffects,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SavedHost {
    state: String,
    image: Option<SavedImage>,
    /// The image of the provisioning under way.
    provisioning: Option<SavedImage>,
    binaries: Option<BTreeMap<String, SavedBinary>>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SavedImage {
    url: String,
    checksum: String,
    checksum_type: String,
    format: String,
    package: pb::PackageRef,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SavedBinary {
    version: String,
    sha256: String,
}

impl Saved {
    fn of(site: &str, st: &State) -> Self {
        let hosts = st
            .hosts
            .iter()
            .map(|(name, h)| {
                let host = SavedHost {
                    state: h.state().as_str().to_string(),
                    image: h.image.as_ref().map(SavedImage::of),
                    provisioning: h.attempt.as_ref().map(|a| SavedImage::of(&a.image)),
                    binaries: h.binaries.as_ref().map(|set| {
                        set.iter()
                            .map(|(name, b)| {
                                (name.clone(), SavedBinary { version: b.version.clone(), sha256: b.sha256.clone() })
                            })
                            .collect()
                    }),
                };
                (name.clone(), host)
            })
            .collect();
        Self {
            site: site.to_string(),
            hosts,
            arrived: st.arrived.iter().map(pb::NodeSpec::from).collect(),
            cluster_master: st.cluster_master.clone(),
            kubeconfig: st.kubeconfig.as_ref().map(|k| String::from_utf8_lossy(k).into_owned()),
            containers: st.containers.clone(),
            cache: st.cache.clone(),
            effects: st.effects.clone(),
        }
    }
}

impl SavedImage {
    fn of(image: &Image) -> Self {
        let spec = &image.spec;
        Self {
            url: spec.url.clone(),
            checksum: spec.checksum.clone(),
            checksum_type: spec.checksum_type.clone(),
            format: spec.format.clone(),
            package: pb::PackageRef::from(&image.package),
        }
    }

    fn image(self) -> Result<Image, String> {
        let package = PackageRef::try_from(self.package).map_err(|e| format!("image package: {e}"))?;
        let spec = ImageSpec {
            url: self.url,
            checksum: self.checksum,
            checksum_type: self.checksum_type,
            format: self.format,
        };
        Ok(Image { spec, package })
    }
}

/// Reads a state file; `None` when there is none yet.
fn read(path: &Path) -> Result<Option<Saved>, SimStateError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(SimStateError::Read { path: path.to_path_buf(), source }),
    };
    serde_json::from_slice(&bytes).map(Some).map_err(|source| SimStateError::Parse { path: path.to_path_buf(), source })
}

/// What the site kept in `path` has done so far, across every process that ran it.
///
/// # Errors
/// When the file cannot be read or parsed, or does not exist.
pub fn saved_effects(path: &Path) -> Result<SimEffects, SimStateError> {
    match read(path)? {
        Some(saved) => Ok(saved.effects),
        None => Err(SimStateError::Read { path: path.to_path_buf(), source: std::io::ErrorKind::NotFound.into() }),
    }
}

impl SimSite {
    /// Like [`SimSite::new`], with the site kept in the file `path`: what it holds is taken up
    /// again (hosts, their images and binaries, the cluster, the effects counted so far), the
    /// design's nodes it lacks register as new hosts, and every change is written to it.
    ///
    /// # Errors
    /// When the file cannot be read, does not parse, or is another site's.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn with_state_file(
        site_id: &str,
        nodes: &[NodeDesign],
        config: SimConfig,
        path: &Path,
    ) -> Result<Self, SimStateError> {
        let saved = read(path)?;
        if let Some(s) = saved.as_ref().filter(|s| s.site != site_id) {
            let (site, found) = (site_id.to_string(), s.site.clone());
            return Err(SimStateError::OtherSite { path: path.to_path_buf(), site, found });
        }
        let inner =
            Inner { site: site_id.to_string(), config, state: Mutex::default(), file: Some(StateFile::new(path)) };
        let site = Self { inner: Arc::new(inner) };
        if let Some(saved) = saved {
            site.restore(saved).map_err(|reason| SimStateError::Invalid { path: path.to_path_buf(), reason })?;
        }
        for node in nodes {
            site.add_host(node);
        }
        Ok(site)
    }

    /// Takes up a saved state; hosts that were on their way somewhere carry on.
    fn restore(&self, saved: Saved) -> Result<(), String> {
        let mut st = self.inner.lock();
        for (name, saved_host) in saved.hosts {
            let state = S::parse(&saved_host.state).ok_or_else(|| format!("{name}: state {:?}", saved_host.state))?;
            let mut host = Host::new();
            host.state.send_replace(state);
            host.image = saved_host.image.map(SavedImage::image).transpose().map_err(|e| format!("{name}: {e}"))?;
            host.binaries = saved_host.binaries.map(|set| {
                set.into_iter().map(|(n, b)| (n, Binary { version: b.version, sha256: b.sha256 })).collect()
            });
            if let Some(image) = saved_host.provisioning {
                let image = image.image().map_err(|e| format!("{name}: {e}"))?;
                let (done_tx, done) = watch::channel(None);
                host.attempt = Some(Attempt { image: image.clone(), done });
                let redeploy = state == S::Deprovisioning;
                tokio::spawn(provision(Arc::clone(&self.inner), name.clone(), image, redeploy, done_tx));
            } else if matches!(state, S::Registering | S::Inspecting | S::Preparing) {
                tokio::spawn(walk_on(Arc::clone(&self.inner), name.clone(), state));
            }
            st.hosts.insert(name, host);
        }
        st.arrived = saved
            .arrived
            .into_iter()
            .map(|n| NodeDesign::try_from(n).map_err(|e| format!("arrived host: {e}")))
            .collect::<Result<_, _>>()?;
        st.cluster_master = saved.cluster_master;
        st.kubeconfig = saved.kubeconfig.map(String::into_bytes);
        st.containers = saved.containers;
        st.cache = saved.cache;
        st.effects = saved.effects;
        Ok(())
    }
}

/// A host's walk to `available`, from the state it was in.
async fn walk_on(inner: Arc<Inner>, host: String, from: S) {
    let c = &inner.config;
    let steps = [
        (S::Registering, c.registering, S::Inspecting),
        (S::Inspecting, c.inspecting, S::Preparing),
        (S::Preparing, c.preparing, S::Available),
    ];
    for (_, wait, next) in steps.into_iter().skip_while(|(at, _, _)| *at != from) {
        pause(wait).await;
        inner.set_state(&host, next);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bus_schema::domain::Role;
    use bus_schema::pb::PackageKind;
    use tokio::sync::mpsc;

    use super::*;
    use crate::SiteBackend;
    use crate::backend::{ClusterRequest, HostRequest};
    use crate::sim::tests::versioned;

    fn node(name: &str, role: Role, last: u8) -> NodeDesign {
        NodeDesign {
            name: name.try_into().unwrap(),
            role,
            boot_mac: format!("52:54:00:00:01:{last:02x}").try_into().unwrap(),
            bmc_address: "ipmi://10.0.1.1".to_string().try_into().unwrap(),
            labels: BTreeMap::new(),
        }
    }

    /// A runtime of its own, so that dropping it ends every task of the site, as a kill -9 would.
    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap()
    }

    async fn provision(site: &SimSite, req: &HostRequest) {
        let (tx, _rx) = mpsc::unbounded_channel();
        site.provision_host(req, tx).await.unwrap();
    }

    #[test]
    fn a_site_killed_mid_provisioning_carries_on_from_its_file_and_provisions_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("edge-01.json");
        let nodes = [node("m-1", Role::Master, 1), node("w-1", Role::Worker, 2)];
        let ubuntu = versioned("ubuntu", "22.04", PackageKind::OsImage, 'a');
        let reqs: Vec<HostRequest> = nodes.iter().map(|n| HostRequest::new(n.clone(), &ubuntu)).collect();
        let config = SimConfig::fast();

        // m-1 is provisioned; w-1's provisioning is halfway when the process dies.
        runtime().block_on(async {
            let site = SimSite::with_state_file("edge-01", &nodes, config.clone(), &path).unwrap();
            provision(&site, &reqs[0]).await;
            let w1 = tokio::spawn({
                let (site, req) = (site.clone(), reqs[1].clone());
                async move { provision(&site, &req).await }
            });
            tokio::time::sleep(config.provisioning / 2).await;
            assert_eq!(site.hosts()[1], ("w-1".to_string(), S::Provisioning));
            drop(w1);
        });

        runtime().block_on(async {
            let site = SimSite::with_state_file("edge-01", &nodes, config.clone(), &path).unwrap();
            assert_eq!(site.hosts(), [("m-1".to_string(), S::Provisioned), ("w-1".to_string(), S::Provisioning)]);
            // The redelivered jobs: m-1 is done already, w-1 joins the provisioning under way.
            provision(&site, &reqs[0]).await;
            provision(&site, &reqs[1]).await;
            assert_eq!(site.hosts(), [("m-1".to_string(), S::Provisioned), ("w-1".to_string(), S::Provisioned)]);
            let once = BTreeMap::from([("m-1".to_string(), 1), ("w-1".to_string(), 1)]);
            assert_eq!(site.effects().provisions, once);
            assert_eq!(saved_effects(&path).unwrap().provisions, once);

            let binaries = vec![versioned("kubelet", "1.29.2", PackageKind::Binary, 'b')];
            let req = ClusterRequest { nodes: nodes.to_vec(), binaries, join_existing: false };
            site.install_binaries(&req).await.unwrap();
            site.kubeconfig().await.unwrap();
        });

        runtime().block_on(async {
            let site = SimSite::with_state_file("edge-01", &nodes, config.clone(), &path).unwrap();
            let binaries = vec![versioned("kubelet", "1.29.2", PackageKind::Binary, 'b')];
            let req = ClusterRequest { nodes: nodes.to_vec(), binaries, join_existing: false };
            site.install_binaries(&req).await.unwrap();
            assert!(site.kubeconfig().await.is_ok(), "the cluster outlives the gateway");
            let effects = site.effects();
            assert_eq!((effects.binary_installs.len(), effects.kubeconfigs_generated), (2, 1));
            assert!(effects.binary_installs.values().all(|n| *n == 1), "{effects:?}");
        });
    }

    #[test]
    fn a_host_that_was_registering_walks_on_and_another_sites_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("edge-01.json");
        let nodes = [node("m-1", Role::Master, 1)];
        runtime().block_on(async {
            let site = SimSite::with_state_file("edge-01", &nodes, SimConfig::fast(), &path).unwrap();
            tokio::time::sleep(Duration::from_millis(30)).await;
            assert_eq!(site.hosts()[0].1, S::Inspecting);
        });
        runtime().block_on(async {
            let site = SimSite::with_state_file("edge-01", &nodes, SimConfig::fast(), &path).unwrap();
            assert_eq!(site.hosts()[0].1, S::Inspecting);
            tokio::time::sleep(Duration::from_secs(1)).await;
            assert_eq!(site.hosts()[0].1, S::Available);
            let other = SimSite::with_state_file("edge-02", &nodes, SimConfig::fast(), &path).unwrap_err();
            assert!(matches!(other, SimStateError::OtherSite { .. }), "{other}");
        });
        std::fs::write(&path, b"{").unwrap();
        let garbage = runtime().block_on(async {
            SimSite::with_state_file("edge-01", &nodes, SimConfig::fast(), &path).map(|_| ()).unwrap_err()
        });
        assert!(matches!(garbage, SimStateError::Parse { .. }), "{garbage}");
    }
}
