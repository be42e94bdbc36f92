//! A SoftHSM2 of one's own, for the tests of the PKCS#11 key ring (here and in the integration
//! tests): a configuration and a token directory in a temporary directory, tokens made with
//! `softhsm2-util`, and the module `scripts/ensure-softhsm` prints (`LANDFALL_SOFTHSM_MODULE`,
//! which `scripts/test` exports).
//!
//! SoftHSM2 reads its configuration (`SOFTHSM2_CONF`) once per process, when the module is
//! initialised, and a process may not change its own environment while threads run: whatever
//! loads the module against one of these runs as a child process given [`SoftHsm::conf_env`].
//! Each `SoftHsm` is its own directory, so any number of them can be used at once.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The environment variable SoftHSM2 reads its configuration file's path from.
pub const CONF_ENV: &str = "SOFTHSM2_CONF";
/// The environment variable naming the SoftHSM2 module for the tests.
pub const MODULE_ENV: &str = "LANDFALL_SOFTHSM_MODULE";

/// The SoftHSM2 module (`$LANDFALL_SOFTHSM_MODULE`).
///
/// # Panics
/// When it is not set or not a file: a clear failure, never a skip.
pub fn module() -> PathBuf {
    const HOW: &str =
        "run `export LANDFALL_SOFTHSM_MODULE=\"$(scripts/ensure-softhsm)\"`, or run the tests with scripts/test";
    let module = std::env::var_os(MODULE_ENV)
        .filter(|m| !m.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("{MODULE_ENV} is not set; {HOW}"));
    assert!(module.is_file(), "{MODULE_ENV}={} is not a file; {HOW}", module.display());
    module
}

/// A configuration and token directory of one's own.
pub struct SoftHsm {
    dir: tempfile::TempDir,
}

impl SoftHsm {
    /// A new, empty SoftHSM2 (no token yet).
    ///
    /// # Panics
    /// When the module is not there ([`module`]) or the directory cannot be written.
    pub fn new() -> Self {
        module();
        let dir = tempfile::Builder::new().prefix("landfall-softhsm-").tempdir().expect("a temporary directory");
        let tokens = dir.path().join("tokens");
        std::fs::create_dir(&tokens).expect("the token directory");
        let conf = format!(
            "directories.tokendir = {}\nobjectstore.backend = file\nlog.level = ERROR\nslots.removable = false\n",
            tokens.display()
        );
        std::fs::write(dir.path().join("softhsm2.conf"), conf).expect("the SoftHSM2 configuration");
        Self { dir }
    }

    /// The directory everything of this SoftHSM2 is in (a test may put its own files there).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `SOFTHSM2_CONF` and its value, for a child process.
    pub fn conf_env(&self) -> (&'static str, PathBuf) {
        (CONF_ENV, self.dir.path().join("softhsm2.conf"))
    }

    /// Makes a token in the next free slot, with this label and user PIN.
    ///
    /// # Panics
    /// When `softhsm2-util` fails.
    pub fn init_token(&self, label: &str, pin: &str) {
        let (var, conf) = self.conf_env();
        let out = Command::new("softhsm2-util")
            .args(["--init-token", "--free", "--label", label, "--pin", pin, "--so-pin", "so-pin-of-the-test"])
            .env(var, conf)
            .output()
            .unwrap_or_else(|e| panic!("cannot run softhsm2-util ({e}): run the tests with scripts/test"));
        assert!(
            out.status.success(),
            "softhsm2-util --init-token {label} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Default for SoftHsm {
    fn default() -> Self {
        Self::new()
    }
}

/// Writes `pin` to `path`, readable by its owner only, as a PIN file is kept.
///
/// # Panics
/// When the file cannot be written.
pub fn write_pin_file(path: &Path, pin: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, format!("{pin}\n")).expect("write the PIN file");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod the PIN file");
}
