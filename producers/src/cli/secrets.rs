//! `landfall kubeconfig …` and `landfall bmc …`: requests to the secrets service (run by
//! `landfall serve kubeconfig` or `landfall up`), which holds the data key. The CLI never sees a
//! key; a BMC password is read from a file or stdin, never from the command line.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use bus_schema::names;
use bus_schema::pb::{self, BusMessage};
use bus_schema::runtime::{Bus, RequestError};
use bytes::Bytes;
use clap::{Args, Subcommand};
use prost::Message;

#[derive(Debug, Subcommand)]
pub enum KubeconfigCommand {
    /// Print a site's kubeconfig (opened by the secrets service).
    Get { site: String },
    /// Seal every stored secret (kubeconfigs, BMC credentials) again under a new data key, then
    /// retire the old key. Needs the secrets service to run with a key file.
    RotateKey {
        /// How long to wait for the rotation to finish.
        #[arg(long, default_value = "5m", value_parser = crate::flags::parse_duration)]
        timeout: Duration,
    },
}

#[derive(Debug, Subcommand)]
pub enum BmcCommand {
    /// Store a host's BMC credentials, sealed; gateways get them only while a job drives the BMC.
    Set(BmcSetArgs),
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("password").required(true)))]
pub struct BmcSetArgs {
    pub site: String,
    pub node: String,
    #[arg(long)]
    pub username: String,
    /// Read the password from this file (one trailing newline is dropped).
    #[arg(long, group = "password", value_name = "FILE")]
    pub password_file: Option<PathBuf>,
    /// Read the password from standard input (one trailing newline is dropped).
    #[arg(long, group = "password")]
    pub password_stdin: bool,
}

/// How long an ordinary request waits for the secrets service.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Sends one request to the secrets service and returns the reply body.
///
/// # Errors
/// When no service answers (saying what to start), or with the service's reason for refusing.
async fn ask(url: &str, subject: &str, payload: Vec<u8>, timeout: Duration) -> anyhow::Result<Bytes> {
    let bus = Bus::connect_client(url, "landfall-cli", crate::nats_access::get()).await?;
    let no_service = || {
        anyhow::anyhow!(
            "no secrets service answered on {subject}; is `landfall serve kubeconfig` (or `landfall up`) running?"
        )
    };
    match bus.request(subject.to_string(), payload.into(), timeout).await {
        Ok((_, body)) => Ok(body),
        Err(RequestError::NoResponders { .. }) => Err(no_service()),
        Err(RequestError::TimedOut { .. }) => {
            anyhow::bail!("the secrets service did not answer on {subject} within {timeout:?}")
        }
        Err(RequestError::Refused { reason, .. }) => anyhow::bail!("{reason}"),
        Err(e) => Err(e.into()),
    }
}

fn decode<M: BusMessage>(body: Bytes) -> anyhow::Result<M> {
    M::decode(body).with_context(|| format!("the secrets service's answer is not a {}", M::TYPE))
}

pub async fn kubeconfig(url: &str, cmd: KubeconfigCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        KubeconfigCommand::Get { site } => {
            let req = pb::KubeconfigGet { site_id: site }.encode_to_vec();
            let kubeconfig = ask(url, names::KUBECONFIG_GET_ADMIN, req, REQUEST_TIMEOUT).await?;
            let mut out = std::io::stdout().lock();
            out.write_all(&kubeconfig)?;
            out.flush()?;
        }
        KubeconfigCommand::RotateKey { timeout } => {
            let body = ask(url, names::ROTATE_KEY_ADMIN, pb::RotateKey {}.encode_to_vec(), timeout).await?;
            let done: pb::KeyRotated = decode(body)?;
            println!("data key {} → {}: {} record(s) sealed again", done.retired_key_id, done.key_id, done.records);
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn bmc(url: &str, cmd: BmcCommand) -> anyhow::Result<ExitCode> {
    let BmcCommand::Set(args) = cmd;
    let password = read_password(&args)?;
    let req = pb::PutBmcCredentials {
        site_id: args.site.clone(),
        node: args.node.clone(),
        credentials: Some(pb::BmcCredentials { username: args.username.clone(), password }),
    };
    let body = ask(url, names::BMC_CREDENTIALS_PUT_ADMIN, req.encode_to_vec(), REQUEST_TIMEOUT).await?;
    drop(req);
    let stored: pb::SecretStored = decode(body)?;
    println!(
        "BMC credentials of node {} at site {} stored (sealed under key {}, revision {})",
        args.node, args.site, stored.key_id, stored.revision
    );
    Ok(ExitCode::SUCCESS)
}

fn read_password(args: &BmcSetArgs) -> anyhow::Result<String> {
    let raw = match &args.password_file {
        Some(path) => std::fs::read(path).with_context(|| format!("read the password file {}", path.display()))?,
        None => {
            let mut buf = Vec::new();
            std::io::stdin().read_to_end(&mut buf).context("read the password from stdin")?;
            buf
        }
    };
    let text = String::from_utf8(raw).map_err(|_| anyhow::anyhow!("the password is not UTF-8"))?;
    let password = text.strip_suffix('\n').map(|p| p.strip_suffix('\r').unwrap_or(p)).unwrap_or(&text);
    anyhow::ensure!(!password.is_empty(), "the password is empty");
    Ok(password.to_string())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        bmc: BmcCommand,
    }

    #[test]
    fn a_password_comes_from_a_file_or_stdin_never_the_command_line() {
        assert!(Cli::try_parse_from(["x", "set", "edge-01", "node-1", "--username", "admin"]).is_err());
        assert!(Cli::try_parse_from(["x", "set", "edge-01", "node-1", "--username", "a", "--password", "p"]).is_err());
        let both = ["x", "set", "e", "n", "--username", "a", "--password-file", "f", "--password-stdin"];
        assert!(Cli::try_parse_from(both).is_err());
        assert!(Cli::try_parse_from(["x", "set", "e", "n", "--username", "a", "--password-stdin"]).is_ok());
    }

    #[test]
    fn one_trailing_newline_is_dropped_from_a_password_file() {
        let dir = std::env::temp_dir().join(format!("landfall-pw-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("pw");
        let args = |f: &PathBuf| BmcSetArgs {
            site: "e".into(),
            node: "n".into(),
            username: "a".into(),
            password_file: Some(f.clone()),
            password_stdin: false,
        };
        std::fs::write(&file, "s3cret \r\n").unwrap();
        assert_eq!(read_password(&args(&file)).unwrap(), "s3cret ");
        std::fs::write(&file, "s3cret\n\n").unwrap();
        assert_eq!(read_password(&args(&file)).unwrap(), "s3cret\n");
        std::fs::write(&file, "\n").unwrap();
        assert!(read_password(&args(&file)).is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
