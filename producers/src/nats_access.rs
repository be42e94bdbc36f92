//! How this process reaches NATS: who it proves to be (`--nats-nkey-file`), what it trusts
//! (`--nats-ca`) and whose JetStream it uses (`--js-domain`), flags every command shares, read
//! once at start; and where NATS is when no URL is given.

use std::path::PathBuf;
use std::sync::OnceLock;

use anyhow::Context;
use bus_schema::runtime::Access;

#[derive(Debug, Clone, Default, clap::Args)]
pub struct NatsAccessArgs {
    /// The NATS user's nkey seed file (one line `SU…`), as `landfall deploy nats-config` writes
    /// them; without it the connection is anonymous.
    #[arg(long, global = true, value_name = "FILE", env = "LANDFALL_NATS_NKEY_FILE")]
    pub nats_nkey_file: Option<PathBuf>,
    /// Verify the NATS server with this CA certificate (PEM), and require TLS.
    #[arg(long, global = true, value_name = "FILE", env = "LANDFALL_NATS_CA")]
    pub nats_ca: Option<PathBuf>,
    /// A client certificate (PEM) for servers that verify clients; needs --nats-key.
    #[arg(long, global = true, value_name = "FILE", env = "LANDFALL_NATS_CERT", requires = "nats_key")]
    pub nats_cert: Option<PathBuf>,
    /// The client certificate's key (PEM).
    #[arg(long, global = true, value_name = "FILE", env = "LANDFALL_NATS_KEY", requires = "nats_cert")]
    pub nats_key: Option<PathBuf>,
    /// The JetStream domain to use: a site gateway connected to its site's leaf node gives the
    /// hub's (`hub`).
    #[arg(long, global = true, value_name = "DOMAIN", env = "LANDFALL_JS_DOMAIN")]
    pub js_domain: Option<String>,
}

impl NatsAccessArgs {
    /// The access these flags describe; the seed file is read and checked now.
    pub fn access(&self) -> anyhow::Result<Access> {
        let mut access = Access {
            ca_file: self.nats_ca.clone(),
            client_cert: self.nats_cert.clone().zip(self.nats_key.clone()),
            js_domain: self.js_domain.clone().filter(|d| !d.is_empty()),
            ..Access::default()
        };
        if let Some(path) = &self.nats_nkey_file {
            access.nkey_seed = Some(Access::seed_from_file(path).map_err(anyhow::Error::msg)?);
            access.public_key().map_err(anyhow::Error::msg).with_context(|| format!("{}", path.display()))?;
        }
        Ok(access)
    }
}

/// Where clients and services look for NATS when neither `--nats-url` nor `NATS_URL` says.
pub const DEFAULT_NATS_URL: &str = "nats://127.0.0.1:4222";

static ACCESS: OnceLock<Access> = OnceLock::new();

/// Sets this process's NATS access (once, at start).
pub fn init(args: &NatsAccessArgs) -> anyhow::Result<()> {
    let access = args.access()?;
    let _ = ACCESS.set(access);
    Ok(())
}

/// Sets this process's NATS access to `access` (once, at start): the gateway's, with the key
/// of its identity.
pub fn set(access: Access) {
    let _ = ACCESS.set(access);
}

/// This process's NATS access: anonymous until [`init`].
pub fn get() -> &'static Access {
    static ANONYMOUS: OnceLock<Access> = OnceLock::new();
    ACCESS.get().unwrap_or_else(|| ANONYMOUS.get_or_init(Access::default))
}
