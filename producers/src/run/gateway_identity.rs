//! The gateway's identity on its command line: `landfall-gateway identity init|show`, and
//! `--identity-dir` (with `--tpm`) for the gateway to connect to NATS as it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use bus_schema::runtime::Access;
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
