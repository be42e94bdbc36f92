//! A simulated site kept in a file, so that a gateway restarted after a crash finds the site's
//! hosts as it left them, as a real site's Metal3 keeps them whatever becomes of its gateway.
//!
//! The file is JSON, written again (to a scratch file, then renamed over it) each time the
//! site's state changes, before the change is reported to anyone. A provisioning under way when
//! the process died goes on from where the host was, as Ironic's would, and does not count as a
//! second one; a host that was still registering walks on to `available`. Injected failures
//! are not kept.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use bus_schema::domain::{NodeDesign, PackageRef};
use bus_schema::pb;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tracing::warn;

use super::effects::SimEffects;
use super::metal3::registration_next;
use super::state::{Attempt, Binary, Host, Image, Outcome, State};
use crate::backend::{ImageSpec, ProvisioningState as S};

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
    pub(super) fn new(path: &Path) -> Self {
        Self { path: path.to_path_buf(), written: Mutex::default() }
    }

    /// Writes the site's state, unless the file holds it already.
    pub(super) fn save(&self, site: &str, state: &State) {
        let bytes = match serde_json::to_vec(&Saved::of(site, state)) {
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

/// The file's content.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Saved {
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

/// Reads site `site`'s state file; `None` when there is none yet.
///
/// # Errors
/// When the file cannot be read, does not parse, or is another site's.
pub(super) fn load(path: &Path, site: &str) -> Result<Option<Saved>, SimStateError> {
    let saved = read(path)?;
    if let Some(s) = saved.as_ref().filter(|s| s.site != site) {
        let (site, found) = (site.to_string(), s.site.clone());
        return Err(SimStateError::OtherSite { path: path.to_path_buf(), site, found });
    }
    Ok(saved)
}

/// What a host restored from the file was doing, to carry on with.
#[derive(Debug)]
pub(super) enum Resume {
    /// A provisioning under way, as Ironic's would go on: from `deprovisioning` when it was a
    /// redeploy, and `done` told its outcome.
    Provision { image: Image, redeploy: bool, done: watch::Sender<Outcome> },
    /// A new host's walk to `available`, from this state.
    Walk(S),
}

impl Saved {
    /// The state the file kept, and what its hosts were on their way to do; the reason when the
    /// file does not hold a valid state.
    pub(super) fn restore(self) -> Result<(State, Vec<(String, Resume)>), String> {
        let mut st = State::default();
        let mut resume = Vec::new();
        for (name, saved_host) in self.hosts {
            let state = S::parse(&saved_host.state).ok_or_else(|| format!("{name}: state {:?}", saved_host.state))?;
            let mut host = Host::in_state(state);
            host.image = saved_host.image.map(SavedImage::image).transpose().map_err(|e| format!("{name}: {e}"))?;
            host.binaries = saved_host.binaries.map(|set| {
                set.into_iter().map(|(n, b)| (n, Binary { version: b.version, sha256: b.sha256 })).collect()
            });
            if let Some(image) = saved_host.provisioning {
                let image = image.image().map_err(|e| format!("{name}: {e}"))?;
                let (done_tx, done) = watch::channel(None);
                host.attempt = Some(Attempt { image: image.clone(), done });
                let redeploy = state == S::Deprovisioning;
                resume.push((name.clone(), Resume::Provision { image, redeploy, done: done_tx }));
            } else if registration_next(state).is_some() {
                resume.push((name.clone(), Resume::Walk(state)));
            }
            st.hosts.insert(name, host);
        }
        st.arrived = self
            .arrived
            .into_iter()
            .map(|n| NodeDesign::try_from(n).map_err(|e| format!("arrived host: {e}")))
            .collect::<Result<_, _>>()?;
        st.cluster_master = self.cluster_master;
        st.kubeconfig = self.kubeconfig.map(String::into_bytes);
        st.containers = self.containers;
        st.cache = self.cache;
        st.effects = self.effects;
        Ok((st, resume))
    }
}
