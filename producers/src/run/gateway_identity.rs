//! The gateway's identity on its command line: `landfall-gateway identity init|show`, and
//! `--identity-dir` (with `--tpm`) for the gateway to connect to NATS as it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use bus_schema::runtime::Access;
use site_gateway::enrollment::{self, SiteKeys};
use site_gateway::identity::{Identity, TpmChoice};

use crate::nats_access::NatsAccessArgs;

/// What the gateway warns of at start when its key is a file.
pub const FILE_KEY_WARNING: &str = "the gateway's identity key is a file: anyone with a copy of this disk has it \
     (make an identity sealed to this machine's TPM: landfall-gateway identity init --identity-dir DIR --tpm auto)";

/// `--identity-dir` and `--tpm` of the gateway itself.
#[derive(Debug, Clone, clap::Args)]
pub struct IdentityArgs {
    /// Connect to NATS as the identity in this directory (`landfall-gateway identity init`
    /// makes one), instead of --nats-nkey-file.
    #[arg(long, value_name = "DIR", env = "LANDFALL_IDENTITY_DIR", conflicts_with = "nats_nkey_file")]
    pub identity_dir: Option<PathBuf>,
    /// The TPM the identity is sealed to.
    #[arg(long, value_name = "auto|none|TCTI", env = "LANDFALL_TPM", default_value = "auto", long_help = TPM_HELP)]
    pub tpm: TpmChoice,
    /// Join by enrollment, with this bootstrap credential (`landfall site bootstrap`): the
    /// gateway asks to join as --site, prints its fingerprint and waits until an operator
    /// approves (`landfall site approve FINGERPRINT`). Its credentials are then kept in
    /// --identity-dir and renewed by it, so later starts need no bootstrap credential.
    #[arg(long, value_name = "FILE", env = "LANDFALL_BOOTSTRAP_FILE", requires = "identity_dir")]
    pub bootstrap_file: Option<PathBuf>,
    /// The hub's client URL, where an enrolling gateway asks to join and renews its
    /// credentials after a cut longer than their life (default: --nats-url). A gateway on its
    /// site's leaf node needs it: the leaf's link to the hub runs on those credentials.
    #[arg(long, value_name = "URL", env = "LANDFALL_HUB_URL")]
    pub hub_url: Option<String>,
}

const TPM_HELP: &str = "The TPM the identity is sealed to: auto (the kernel's /dev/tpmrm0 when the machine has one, \
    else none), none (the key is a file, mode 0600), or a TCTI for tpm2-tools (device:/dev/tpmrm0, \
    swtpm:host=127.0.0.1,port=2321).";

/// `landfall-gateway identity …`.
#[derive(Debug, clap::Subcommand)]
pub enum IdentityCommand {
    /// Makes a new identity (an nkey user key pair) in the directory: sealed to the TPM, or a
    /// key file without one. Never replaces an identity. Prints its public key, for the hub's
    /// NATS configuration.
    Init(IdentityDirArgs),
    /// Loads the identity (with a TPM, unseals it: proof that this machine's TPM can) and
    /// prints its public key, its fingerprint and whether it is sealed.
    Show(IdentityDirArgs),
}

#[derive(Debug, clap::Args)]
pub struct IdentityDirArgs {
    /// The identity directory.
    #[arg(long, value_name = "DIR", env = "LANDFALL_IDENTITY_DIR")]
    pub identity_dir: PathBuf,
    /// The TPM the identity is (to be) sealed to.
    #[arg(long, value_name = "auto|none|TCTI", env = "LANDFALL_TPM", default_value = "auto", long_help = TPM_HELP)]
    pub tpm: TpmChoice,
}

/// Runs `landfall-gateway identity …`: what it says goes to stdout, an error to stderr.
pub fn run(command: IdentityCommand) -> ExitCode {
    let (made, args) = match &command {
        IdentityCommand::Init(args) => (Identity::init(&args.identity_dir, &args.tpm), args),
        IdentityCommand::Show(args) => (Identity::load(&args.identity_dir, &args.tpm), args),
    };
    match made {
        Ok(identity) => {
            print!("{}", describe(&identity, &args.identity_dir, &args.tpm));
            if !identity.sealed() {
                eprintln!("warning: {FILE_KEY_WARNING}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {}: {e}", args.identity_dir.display());
            ExitCode::FAILURE
        }
    }
}

/// What `identity init` and `identity show` print.
fn describe(identity: &Identity, dir: &Path, tpm: &TpmChoice) -> String {
    let sealed = match tpm.tcti().filter(|_| identity.sealed()) {
        Some(tcti) => format!("yes, to the TPM at {tcti} (it unsealed the key just now)"),
        None => format!("no: the key is the file {}", dir.join("seed.nkey").display()),
    };
    format!("public key:  {}\nfingerprint: {}\nsealed:      {sealed}\n", identity.public_key(), identity.fingerprint())
}

/// How often a gateway whose credentials expired tries again to renew them.
const RENEW_RETRY: std::time::Duration = std::time::Duration::from_secs(10);

/// The gateway's access when its site joined by enrollment (its credentials in
/// `--identity-dir`, or a `--bootstrap-file` to ask with): the access presenting them, and the
/// keys, to renew. `None` for a gateway whose identity key is a NATS user of its own.
///
/// # Errors
/// The identity does not load, the hub refuses or denies the request, or `shutdown` while
/// waiting.
pub async fn enrolled(
    nats: &NatsAccessArgs,
    identity: &IdentityArgs,
    site: &str,
    hub_url: &str,
    shutdown: tokio_util::sync::CancellationToken,
) -> anyhow::Result<Option<(Access, std::sync::Arc<SiteKeys>)>> {
    let Some(dir) = &identity.identity_dir else { return Ok(None) };
    let loaded = Identity::load(dir, &identity.tpm).map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
    let key = std::sync::Arc::new(loaded.key_pair()?);
    let keys = match (SiteKeys::load(dir, key.clone())?, &identity.bootstrap_file) {
        (Some(keys), _) => keys,
        (None, None) => return Ok(None),
        (None, Some(file)) => {
            let bootstrap = std::fs::read_to_string(file).with_context(|| format!("read {}", file.display()))?;
            let fingerprint = loaded.fingerprint();
            let asked = enrollment::enroll(
                hub_url,
                &bootstrap,
                site,
                enrollment::machine_facts(),
                key,
                dir,
                || {
                    eprintln!(
                        "asked to join as site {site}; waiting for an operator: landfall site approve {fingerprint}"
                    )
                },
                shutdown.clone(),
            )
            .await?;
            match asked {
                Ok(keys) => keys,
                Err(enrollment::Asked::Denied(why)) => {
                    anyhow::bail!("the request to join as site {site} was denied: {why}")
                }
                Err(enrollment::Asked::Pending) => anyhow::bail!("the request to join as site {site} is still pending"),
            }
        }
    };
    if keys.site() != site {
        anyhow::bail!("the identity in {} is site {}'s, not {site}'s", dir.display(), keys.site());
    }
    if !loaded.sealed() {
        tracing::warn!(public_key = loaded.public_key(), "{FILE_KEY_WARNING}");
    }
    // Connected straight to the hub and cut off past the link credentials' life: new ones
    // through the identity before anything. A gateway on its site's leaf node goes on at once
    // (its leaf node holds its jobs and records; the renewal runs beside it).
    while identity.hub_url.is_none() && keys.link_expires().is_none_or(|exp| exp <= now_s()) {
        match enrollment::renew_with_identity(hub_url, &keys).await {
            Ok(()) => break,
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "the link credentials expired and cannot be renewed yet")
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => anyhow::bail!("stopped while renewing the link credentials"),
            _ = tokio::time::sleep(RENEW_RETRY) => {}
        }
    }
    Ok(Some((keys.access(nats.access()?), keys)))
}

fn now_s() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

/// The gateway's NATS access with its identity: the other `--nats-*` flags as given, the key
/// unsealed (or read) from `--identity-dir`. Without `--identity-dir`, the access the flags say.
pub fn access(nats: &NatsAccessArgs, identity: &IdentityArgs) -> anyhow::Result<Access> {
    let access = nats.access()?;
    let Some(dir) = &identity.identity_dir else {
        if nats.nats_nkey_file.is_some() {
            tracing::warn!("{FILE_KEY_WARNING}");
        }
        return Ok(access);
    };
    let loaded = Identity::load(dir, &identity.tpm).map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
    if loaded.sealed() {
        tracing::info!(public_key = loaded.public_key(), fingerprint = %loaded.fingerprint(), "identity unsealed by the TPM");
    } else {
        tracing::warn!(public_key = loaded.public_key(), "{FILE_KEY_WARNING}");
    }
    Ok(loaded.nats_access(access))
}
