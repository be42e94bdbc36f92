//! A simulated site kept in a file, so that a gateway restarted after a crash finds the site's
//! hosts as it left them, as a real site's Metal3 keeps them whatever becomes of its gateway.
//!
//! The file is a journal of JSON lines: the site's id first, then a line per host (its state,
//! image, binaries and the effects counted on it) and a line for the rest of the site (its
//! cluster, containers, cache, arrivals and counters). A change appends the lines of what it
//! changed, before the change is reported to anyone; a later line for the same host replaces
//! the earlier one. Once the journal is several times the size of the site, it is written
//! again whole (to a scratch file, then renamed over it). So a change costs what it changed,
//! not the whole site: a site of a thousand hosts changes some ten thousand times during its
//! install. A line cut short by a kill during its write is the end of the journal (the change
//! it carried was not yet seen by anyone).
//!
//! A provisioning under way when the process died goes on from where the host was, as
//! Ironic's would, and does not count as a second one; a host that was still registering walks
//! on to `available`. Injected failures are not kept.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write as _;
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
    #[error("parse the simulated site's state {path}, line {line}")]
    Parse {
        path: PathBuf,
        line: usize,
        #[source]
        source: serde_json::Error,
    },
    #[error("the simulated site's state {path} is site {found}'s, not {site}'s")]
    OtherSite { path: PathBuf, site: String, found: String },
    #[error("the simulated site's state {path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
}

/// Where a site's state is kept, and what its journal holds now.
#[derive(Debug)]
pub(super) struct StateFile {
    path: PathBuf,
    journal: Mutex<Journal>,
}

/// The journal as written: each host's line and the rest's (a change that leaves them as they
/// are writes nothing), the open file, and its size against the site's.
#[derive(Debug, Default)]
struct Journal {
    file: Option<std::fs::File>,
    hosts: HashMap<String, Vec<u8>>,
    rest: Vec<u8>,
    /// Bytes in the file, and in the site written whole.
    size: u64,
    whole: u64,
}

/// Past this many times the site's own size (and this much), the journal is written again whole.
const REWRITE_FACTOR: u64 = 4;
const REWRITE_AT_LEAST: u64 = 1 << 20;

impl StateFile {
    pub(super) fn new(path: &Path) -> Self {
        Self { path: path.to_path_buf(), journal: Mutex::default() }
    }

    /// Writes what changed in the site's state since the last call: the hosts `state` marks
    /// touched, and the rest when it differs. The first call writes the site whole.
    pub(super) fn save(&self, site: &str, state: &mut State) {
        let touched = state.hosts.take_touched();
        let mut journal = self.journal.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let result = if journal.file.is_none() {
            self.rewrite(&mut journal, site, state)
        } else {
            self.append(&mut journal, site, state, &touched)
        };
        if let Err(error) = result {
            warn!(site, path = %self.path.display(), %error, "cannot write the simulated site's state");
            // Written whole again on the next change.
            journal.file = None;
        }
    }

    fn append(
        &self,
        journal: &mut Journal,
        site: &str,
        state: &State,
        touched: &BTreeSet<String>,
    ) -> Result<(), Error> {
        let mut lines = Vec::new();
        for name in touched {
            let line = encode(&Line::host(name, state))?;
            if journal.hosts.get(name) != Some(&line) {
                lines.extend_from_slice(&line);
                journal.hosts.insert(name.clone(), line);
            }
        }
        let rest = encode(&Line::Rest(Rest::of(state)))?;
        if journal.rest != rest {
            lines.extend_from_slice(&rest);
            journal.rest = rest;
        }
        if lines.is_empty() {
            return Ok(());
        }
        if journal.size + lines.len() as u64 > (REWRITE_FACTOR * journal.whole).max(REWRITE_AT_LEAST) {
            return self.rewrite(journal, site, state);
        }
        journal.file.as_mut().map_or(Ok(()), |f| f.write_all(&lines))?;
        journal.size += lines.len() as u64;
        Ok(())
    }

    /// Writes the site whole to a scratch file and renames it over the journal.
    fn rewrite(&self, journal: &mut Journal, site: &str, state: &State) -> Result<(), Error> {
        let mut bytes = encode(&Line::Site(site.to_string()))?;
        let mut hosts = HashMap::new();
        let names: BTreeSet<&String> = state.hosts.iter().map(|(n, _)| n).chain(state.effects.nodes()).collect();
        for name in names {
            let line = encode(&Line::host(name, state))?;
            bytes.extend_from_slice(&line);
            hosts.insert(name.clone(), line);
        }
        let rest = encode(&Line::Rest(Rest::of(state)))?;
        bytes.extend_from_slice(&rest);
        let scratch = self.path.with_extension("tmp");
        std::fs::write(&scratch, &bytes)?;
        std::fs::rename(&scratch, &self.path)?;
        let file = std::fs::OpenOptions::new().append(true).open(&self.path)?;
        let size = bytes.len() as u64;
        *journal = Journal { file: Some(file), hosts, rest, size, whole: size };
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
enum Error {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Encode(#[from] serde_json::Error),
}

/// A line and its newline.
fn encode(line: &Line) -> Result<Vec<u8>, serde_json::Error> {
    let mut bytes = serde_json::to_vec(line)?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// One line of the journal.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum Line {
    /// The first line: whose site this is.
    Site(String),
    /// A host as it is now (none: a node only counted), and what was done to it.
    Host { name: String, host: Option<Box<SavedHost>>, counts: Counts },
    /// Everything else.
    Rest(Rest),
}

impl Line {
    fn host(name: &str, st: &State) -> Self {
        let host = st.hosts.get(name).map(|h| Box::new(SavedHost::of(h)));
        Self::Host { name: name.to_string(), host, counts: Counts::of(&st.effects, name) }
    }
}

/// The effects counted on one node.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Counts {
    provisions: u32,
    binary_installs: u32,
    patches: u32,
    patch_failures: u32,
}

impl Counts {
    fn of(e: &SimEffects, node: &str) -> Self {
        let of = |counts: &BTreeMap<String, u32>| counts.get(node).copied().unwrap_or(0);
        Self {
            provisions: of(&e.provisions),
            binary_installs: of(&e.binary_installs),
            patches: of(&e.patches),
            patch_failures: of(&e.patch_failures),
        }
    }

    fn add_to(&self, e: &mut SimEffects, node: &str) {
        let counters = [
            (&mut e.provisions, self.provisions),
            (&mut e.binary_installs, self.binary_installs),
            (&mut e.patches, self.patches),
            (&mut e.patch_failures, self.patch_failures),
        ];
        for (counts, n) in counters {
            if n > 0 {
                counts.insert(node.to_string(), n);
            } else {
                counts.remove(node);
            }
        }
    }
}

/// The site apart from its hosts.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Rest {
    /// The hosts that arrived after the start, announced again by a restarted gateway (under
    /// the same command id, so the bus drops the copy).
    arrived: Vec<pb::NodeSpec>,
    cluster_master: Option<String>,
    kubeconfig: Option<String>,
    containers: BTreeMap<String, String>,
    /// The artifacts handed to provisioning, by sha256.
    cache: BTreeSet<String>,
    kubeconfigs_generated: u32,
    container_applies: u32,
    bytes_handed: u64,
    bmc_logins: u32,
    /// The nodes the gateway took out of service (a patch under way when it stopped): a job
    /// come again gives back only a node that carries its cordon.
    #[serde(default)]
    cordoned: BTreeSet<String>,
    /// Those of them drained already: their pods are gone.
    #[serde(default)]
    drained: BTreeSet<String>,
}

impl Rest {
    fn of(st: &State) -> Self {
        let e = &st.effects;
        Self {
            arrived: st.arrived.iter().map(pb::NodeSpec::from).collect(),
            cluster_master: st.cluster_master.clone(),
            kubeconfig: st.kubeconfig.as_ref().map(|k| String::from_utf8_lossy(k).into_owned()),
            containers: st.containers.clone(),
            cache: st.cache.clone(),
            kubeconfigs_generated: e.kubeconfigs_generated,
            container_applies: e.container_applies,
            bytes_handed: e.bytes_handed,
            bmc_logins: e.bmc_logins,
            cordoned: st.cordoned.clone(),
            drained: st.drained.clone(),
        }
    }
}

/// What the journal holds, read back.
#[derive(Debug, Default)]
pub(super) struct Saved {
    site: String,
    hosts: BTreeMap<String, SavedHost>,
    effects: SimEffects,
    rest: Rest,
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

impl SavedHost {
    fn of(h: &Host) -> Self {
        Self {
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
    let mut saved = Saved::default();
    let mut lines = bytes.split_inclusive(|b| *b == b'\n').enumerate().peekable();
    while let Some((at, line)) = lines.next() {
        let parse = |source| SimStateError::Parse { path: path.to_path_buf(), line: at + 1, source };
        let line = match serde_json::from_slice::<Line>(line) {
            Ok(line) => line,
            // The last line, cut short by a kill while it was written: its change was not yet
            // seen by anyone.
            Err(_) if at > 0 && lines.peek().is_none() && !line.ends_with(b"\n") => break,
            Err(source) => return Err(parse(source)),
        };
        match (at, line) {
            (0, Line::Site(site)) => saved.site = site,
            (0, _) | (_, Line::Site(_)) => {
                let reason = format!("line {}: the site's id comes first, and only there", at + 1);
                return Err(SimStateError::Invalid { path: path.to_path_buf(), reason });
            }
            (_, Line::Host { name, host, counts }) => {
                counts.add_to(&mut saved.effects, &name);
                match host {
                    Some(host) => saved.hosts.insert(name, *host),
                    None => saved.hosts.remove(&name),
                };
            }
            (_, Line::Rest(rest)) => saved.rest = rest,
        }
    }
    if saved.site.is_empty() {
        return Err(SimStateError::Invalid { path: path.to_path_buf(), reason: "empty".into() });
    }
    Ok(Some(saved))
}

/// What the site kept in `path` has done so far, across every process that ran it.
///
/// # Errors
/// When the file cannot be read or parsed, or does not exist.
pub fn saved_effects(path: &Path) -> Result<SimEffects, SimStateError> {
    match read(path)? {
        Some(mut saved) => Ok(saved.effects()),
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
    /// Everything counted, the site's counters with its nodes'.
    fn effects(&mut self) -> SimEffects {
        let rest = &self.rest;
        SimEffects {
            kubeconfigs_generated: rest.kubeconfigs_generated,
            container_applies: rest.container_applies,
            bytes_handed: rest.bytes_handed,
            bmc_logins: rest.bmc_logins,
            ..std::mem::take(&mut self.effects)
        }
    }

    /// The state the file kept, and what its hosts were on their way to do; the reason when the
    /// file does not hold a valid state.
    pub(super) fn restore(mut self) -> Result<(State, Vec<(String, Resume)>), String> {
        let mut st = State { effects: self.effects(), ..State::default() };
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
        let rest = self.rest;
        st.arrived = rest
            .arrived
            .into_iter()
            .map(|n| NodeDesign::try_from(n).map_err(|e| format!("arrived host: {e}")))
            .collect::<Result<_, _>>()?;
        st.cluster_master = rest.cluster_master;
        st.kubeconfig = rest.kubeconfig.map(String::into_bytes);
        st.containers = rest.containers;
        st.cache = rest.cache;
        st.cordoned = rest.cordoned;
        st.drained = rest.drained;
        Ok((st, resume))
    }
}
