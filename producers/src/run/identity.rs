//! `landfall serve identity`: the identity service, which lets sites in (the hub's auth
//! callout), takes their requests to join, renews their credentials and revokes them.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use bus_schema::runtime::{Access, Bus};
use consumers::identity::{Approval, IdentitySettings};
use tokio_util::sync::CancellationToken;

#[derive(Debug, clap::Args)]
pub struct IdentityArgs {
    /// The issuer's seed file (`identity/issuer.nk` of `landfall deploy nats-config --site-auth
    /// enroll`): it signs sites' credentials and the callout's answers.
    #[arg(long, env = "LANDFALL_IDENTITY_ISSUER_FILE")]
    pub issuer_file: PathBuf,
    /// The system account user's seed file (`users/sys.nk`): a revocation closes the site's
    /// open connections through it. Without it, a revoked site is kept out from its next
    /// connection only.
    #[arg(long, env = "LANDFALL_SYS_NKEY_FILE")]
    pub sys_nkey_file: Option<PathBuf>,
    /// How long a site's link credentials last; gateways renew them when a third is left.
    #[arg(long, value_parser = crate::flags::parse_duration, default_value = "30d")]
    pub link_ttl: std::time::Duration,
    /// Who approves a gateway's request to join: `operator` (always a person), or `registered`
    /// (a registered site with no identity yet is approved by itself).
    #[arg(long, value_enum, default_value = "operator")]
    pub approve: ApproveArg,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum ApproveArg {
    Operator,
    Registered,
}

/// The issuer key in `path` (a line starting `SA`).
///
/// # Errors
/// The file cannot be read or holds no account seed.
pub fn issuer(path: &std::path::Path) -> anyhow::Result<nkeys::KeyPair> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let seed = text
        .lines()
        .find(|l| l.starts_with("SA"))
        .with_context(|| format!("{} holds no account seed (a line starting with SA)", path.display()))?;
    nkeys::KeyPair::from_seed(seed.trim()).with_context(|| format!("{} holds no valid seed", path.display()))
}

/// The issuer key in `path`, made there (mode 0600) the first time.
///
/// # Errors
/// The file cannot be read or written, or holds no account seed.
pub fn issuer_or_new(path: &std::path::Path) -> anyhow::Result<nkeys::KeyPair> {
    if !path.exists() {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let key = nkeys::KeyPair::new_account();
        let seed = key.seed().map_err(|e| anyhow::anyhow!("{e}"))?;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .with_context(|| format!("write {}", path.display()))?;
        writeln!(f, "# The identity service's issuer ({}).\n{seed}", key.public_key())?;
    }
    issuer(path)
}

impl IdentityArgs {
    /// The service's settings from the flags.
    ///
    /// # Errors
    /// A file cannot be read.
    pub fn settings(&self) -> anyhow::Result<IdentitySettings> {
        Ok(IdentitySettings {
            issuer: Arc::new(issuer(&self.issuer_file)?),
            link_ttl: self.link_ttl,
            approval: match self.approve {
                ApproveArg::Operator => Approval::Operator,
                ApproveArg::Registered => Approval::Registered,
            },
        })
    }
}

/// Runs the identity service on `bus` until `shutdown`, with a system account connection to
/// `url` when a system user is given.
///
/// # Errors
/// A file cannot be read, or the service fails.
pub async fn serve(args: &IdentityArgs, bus: Bus, url: &str, shutdown: CancellationToken) -> anyhow::Result<()> {
    let settings = args.settings()?;
    let system = match &args.sys_nkey_file {
        Some(path) => {
            let seed = Access::seed_from_file(path).map_err(anyhow::Error::msg)?;
            let servers: Vec<&str> = url.split(',').map(str::trim).filter(|u| !u.is_empty()).collect();
            let client = async_nats::ConnectOptions::new()
                .name("landfall-identity-system")
                .nkey(seed)
                .retry_on_initial_connect()
                .max_reconnects(None)
                .connect(servers)
                .await
                .with_context(|| format!("connect to {url} as the system account's user"))?;
            Some(client)
        }
        None => None,
    };
    consumers::identity::run_identity_service(bus, system, settings, shutdown).await
}
