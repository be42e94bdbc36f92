//! Sealing and unsealing the identity's seed with a TPM 2.0, through the `tpm2-tools` programs
//! (Debian's `tpm2-tools`, 5.x) run as child processes, the TPM named by an explicit TCTI.
//!
//! The seed is sealed in a keyed-hash data object under a primary key of the owner hierarchy.
//! The TPM derives that primary from its own secret seed and the template, so it is the same key
//! every time it is made again from the same template on the same TPM, and another key on any
//! other TPM: the sealed object's private part, encrypted and integrity-protected under it, loads
//! only on the TPM that sealed it. The object is `fixedtpm|fixedparent` (never duplicated to
//! another TPM or parent) and `noda` (its empty auth value takes no part in dictionary-attack
//! lockout). The seed goes in and out through pipes; only the TPM's transient contexts are
//! written, to a private temporary directory removed when the operation ends.
//!
//! No policy: neither PCRs nor an auth value guard the unsealing. What this defends against is a
//! copy of the disk, and the binding to the TPM does that alone. An auth value would have to be
//! kept somewhere the gateway reads at every start, unattended: on the same disk, so it would
//! add nothing. A PCR policy would tie the key to the firmware, boot loader and kernel measured at
//! boot, and every update of those (routine on a fleet) would lock the gateway out of its
//! identity until it is made again and registered with the hub; it would guard only against
//! someone who holds the machine itself and boots something else, which is out of this scope.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use zeroize::Zeroizing;

use super::IdentityError;

/// The primary key's template, the same at sealing and at every unsealing (the owner hierarchy,
/// an ECC P-256 storage key with AES-128-CFB for its children, SHA-256 names).
const PRIMARY_ARGS: &[&str] = &[
    "-C",
    "o",
    "-g",
    "sha256",
    "-G",
    "ecc256:aes128cfb",
    "-a",
    "fixedtpm|fixedparent|sensitivedataorigin|userwithauth|restricted|decrypt|noda",
];
/// The sealed data object's attributes: bound to this TPM and this parent.
const SEALED_ATTRIBUTES: &str = "fixedtpm|fixedparent|userwithauth|noda";
/// How [`PRIMARY_ARGS`] is named in the identity's manifest, so a template changed later is
/// noticed instead of read as "another TPM".
pub(crate) const PRIMARY_TEMPLATE: &str = "owner:ecc256:aes128cfb:sha256";

/// The sealed object's two parts, as `tpm2_create` writes them (TPM2B_PUBLIC, TPM2B_PRIVATE).
pub(crate) struct Sealed {
    pub public: Vec<u8>,
    pub private: Vec<u8>,
}

/// A TPM reached through `tcti` (e.g. `device:/dev/tpmrm0`, `swtpm:host=127.0.0.1,port=2321`).
pub(crate) struct Tpm {
    tcti: String,
}

impl Tpm {
    pub(crate) fn new(tcti: &str) -> Tpm {
        Tpm { tcti: tcti.to_string() }
    }

    /// Seals `secret` to this TPM, and unseals it once to check the TPM gives it back.
    pub(crate) fn seal(&self, secret: &[u8]) -> Result<Sealed, IdentityError> {
        let scratch = Scratch::new()?;
        self.primary(&scratch)?;
        let (public, private) = (scratch.path("sealed.pub"), scratch.path("sealed.priv"));
        let mut args = vec!["-C".into(), scratch.path("primary.ctx").into_os_string()];
        args.extend(["-i", "-", "-a", SEALED_ATTRIBUTES, "-u"].map(Into::into));
        args.push(public.clone().into_os_string());
        args.push("-r".into());
        args.push(private.clone().into_os_string());
        args.push("-Q".into());
        self.run("tpm2_create", &args, Some(secret))?;
        self.flush();
        let read =
            |path: &Path| std::fs::read(path).map_err(|e| IdentityError::io(path, "reading what tpm2_create wrote", e));
        let sealed = Sealed { public: read(&public)?, private: read(&private)? };
        if self.unseal(&public, &private)?.as_slice() != secret {
            return Err(IdentityError::Tpm {
                tool: "tpm2_unseal",
                detail: "it did not give back what was sealed".into(),
            });
        }
        Ok(sealed)
    }

    /// Unseals what [`Tpm::seal`] sealed (its parts in these files), into memory only.
    pub(crate) fn unseal(&self, public: &Path, private: &Path) -> Result<Zeroizing<Vec<u8>>, IdentityError> {
        let scratch = Scratch::new()?;
        self.primary(&scratch)?;
        let loaded = scratch.path("sealed.ctx");
        let mut args = vec!["-C".into(), scratch.path("primary.ctx").into_os_string()];
        for (flag, path) in [("-u", public), ("-r", private), ("-c", &loaded)] {
            args.push(flag.into());
            args.push(path.as_os_str().to_owned());
        }
        args.push("-Q".into());
        self.run("tpm2_load", &args, None)?;
        self.flush();
        let secret = self.run("tpm2_unseal", &["-c".into(), loaded.into_os_string()], None);
        self.flush();
        secret
    }

    /// Makes the primary key (the same on every call on this TPM) and saves its context.
    fn primary(&self, scratch: &Scratch) -> Result<(), IdentityError> {
        // A TPM reached without a resource manager (a socket to a simulator) keeps what
        // an earlier run that was killed left loaded, and has room for few objects.
        self.flush();
        let mut args: Vec<std::ffi::OsString> = PRIMARY_ARGS.iter().map(Into::into).collect();
        args.extend(["-c".into(), scratch.path("primary.ctx").into_os_string(), "-Q".into()]);
        self.run("tpm2_createprimary", &args, None)?;
        self.flush();
        Ok(())
    }

    /// Flushes the transient objects loaded (the contexts saved stay usable): best effort, as
    /// the next command says what is wrong if the TPM is gone.
    fn flush(&self) {
        let _ = Command::new("tpm2_flushcontext")
            .args(["-T", &self.tcti, "-t"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }

    /// Runs one tool against this TPM, `input` on its stdin; its stdout, kept in memory only.
    fn run(
        &self,
        tool: &'static str,
        args: &[std::ffi::OsString],
        input: Option<&[u8]>,
    ) -> Result<Zeroizing<Vec<u8>>, IdentityError> {
        let mut child = Command::new(tool)
            .arg("-T")
            .arg(&self.tcti)
            .args(args)
            .stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => IdentityError::NoTpmTools { tool },
                _ => IdentityError::Tpm { tool, detail: e.to_string() },
            })?;
        if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
            // A tool that fails early closes its stdin: what it says is worth more than EPIPE.
            let _ = stdin.write_all(input);
        }
        // Its stderr is read meanwhile, so that neither pipe fills while the other is read.
        let errors = child.stderr.take().map(|mut stderr| {
            std::thread::spawn(move || {
                let mut text = Vec::new();
                let _ = stderr.read_to_end(&mut text);
                text
            })
        });
        // Room enough from the start: a buffer that grows leaves copies of the secret behind.
        let mut stdout = Zeroizing::new(Vec::with_capacity(4096));
        if let Some(mut out) = child.stdout.take() {
            out.read_to_end(&mut stdout).map_err(|e| IdentityError::Tpm { tool, detail: e.to_string() })?;
        }
        let status = child.wait().map_err(|e| IdentityError::Tpm { tool, detail: e.to_string() })?;
        let stderr = errors.and_then(|t| t.join().ok()).unwrap_or_default();
        if status.success() {
            return Ok(stdout);
        }
        Err(classify(tool, &self.tcti, &String::from_utf8_lossy(&stderr)))
    }
}

/// What a tool's failure means, from what it printed.
fn classify(tool: &'static str, tcti: &str, stderr: &str) -> IdentityError {
    let detail = summary(stderr);
    if stderr.contains("Could not load tcti") || stderr.contains("Failed to instantiate TCTI") {
        return IdentityError::TpmUnreachable { tcti: tcti.to_string(), detail };
    }
    if tool == "tpm2_load" && (stderr.contains("integrity check failed") || stderr.contains("0x1DF")) {
        return IdentityError::OtherTpm;
    }
    if tool == "tpm2_load" && stderr.contains("Error deserializing") {
        return IdentityError::Corrupt { reason: format!("the TPM cannot read the sealed object ({detail})") };
    }
    IdentityError::Tpm { tool, detail }
}

/// The tool's error lines, without the library's source locations and the lines that only
/// repeat that the step failed: one line for people.
fn summary(stderr: &str) -> String {
    const REPEATS: &[&str] =
        &["Unable to run", "Could not initialize TCTI", "Failed to instantiate TCTI", "Could not load tcti"];
    let lines: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("ERROR") || l.starts_with("WARNING"))
        .filter(|l| !REPEATS.iter().any(|r| l.contains(r)))
        .map(|l| match l.strip_prefix("ERROR: ") {
            Some(rest) => rest,
            // `ERROR:tcti:src/….c:614:Function() What happened`
            None => l.split_once("() ").map_or(l, |(_, what)| what).trim(),
        })
        .collect();
    if lines.is_empty() { stderr.trim().lines().last().unwrap_or("no message").to_string() } else { lines.join("; ") }
}

/// A private temporary directory for the TPM's transient contexts, removed on drop.
struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    fn new() -> Result<Scratch, IdentityError> {
        // tempfile makes the directory 0700.
        let dir = tempfile::Builder::new()
            .prefix("landfall-tpm-")
            .tempdir()
            .map_err(|e| IdentityError::io(&std::env::temp_dir(), "making a private temporary directory", e))?;
        Ok(Scratch { dir })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_tcti_reads_as_an_unreachable_tpm() {
        let stderr = "WARNING:tcti:src/util/io.c:262:socket_connect() Failed to connect to host 127.0.0.1, port 1: errno 111: Connection refused \n\
            ERROR:tcti:src/tss2-tcti/tctildr.c:428:Tss2_TctiLdr_Initialize_Ex() Failed to instantiate TCTI \n\
            ERROR: Could not load tcti, got: \"swtpm:host=127.0.0.1,port=1\"\n";
        let err = classify("tpm2_createprimary", "swtpm:host=127.0.0.1,port=1", stderr);
        assert!(matches!(err, IdentityError::TpmUnreachable { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.contains("swtpm:host=127.0.0.1,port=1"), "{text}");
        assert!(text.contains("Connection refused"), "{text}");
        assert!(!text.contains("src/"), "{text}");
        assert!(!text.contains("instantiate"), "{text}");
    }

    #[test]
    fn an_integrity_failure_at_load_reads_as_another_tpm() {
        let stderr = "ERROR:esys:src/tss2-esys/api/Esys_Load.c:112:Esys_Load() Esys Finish ErrorCode (0x000001df) \n\
            ERROR: Eys_Load(0x1DF) - tpm:parameter(1):integrity check failed\nERROR: Unable to run tpm2_load\n";
        assert!(matches!(classify("tpm2_load", "device:/dev/tpmrm0", stderr), IdentityError::OtherTpm));
        // The same words from another tool are not about where the object was sealed.
        assert!(matches!(classify("tpm2_unseal", "device:/dev/tpmrm0", stderr), IdentityError::Tpm { .. }));
    }

    #[test]
    fn a_public_part_the_tpm_cannot_parse_reads_as_corrupt() {
        let stderr = "ERROR: Error deserializing public structure: 0x90006\nERROR: Unable to run tpm2_load\n";
        let err = classify("tpm2_load", "device:/dev/tpmrm0", stderr);
        assert!(matches!(err, IdentityError::Corrupt { .. }), "{err:?}");
    }
}
