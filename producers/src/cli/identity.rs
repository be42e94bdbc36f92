//! `landfall site bootstrap|enrollments|approve|deny|revoke|identities`: sites joining and
//! leaving, through the identity service (`landfall serve identity`).

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use bus_schema::credentials::fingerprint;
use bus_schema::names;
use bus_schema::pb::{self, identity_admin::Op};
use bus_schema::runtime::{Bus, RequestError};
use clap::Args;
use prost::Message;

/// A revocation waits for the site's connections to close on every hub server.
const TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Debug, Args)]
pub struct BootstrapArgs {
    /// Only this site may join with it (a gateway claiming another is refused).
    #[arg(long)]
    pub site: Option<String>,
    /// How long it lets gateways ask to join (at most a day).
    #[arg(long, value_parser = crate::flags::parse_duration, default_value = "1h")]
    pub ttl: Duration,
}

#[derive(Debug, Args)]
pub struct DecideArgs {
    /// The gateway's identity key, or the fingerprint it printed (`ABCD-EFGH-IJKL`).
    pub key: String,
    /// Why (kept on the request's record).
    #[arg(long, default_value = "")]
    pub reason: String,
}

#[derive(Debug, Args)]
pub struct RevokeArgs {
    pub site: String,
    #[arg(long, default_value = "")]
    pub reason: String,
}

/// Why the identity service gave no answer.
#[derive(Debug)]
pub(crate) enum Unanswered {
    NoService,
    /// It refused, saying why (no such request, decided already, no identity to revoke, …).
    Refused(String),
    Bus(anyhow::Error),
}

impl std::fmt::Display for Unanswered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unanswered::NoService => write!(
                f,
                "no identity service answered on {}; is `landfall serve identity` running?",
                names::IDENTITY_ADMIN
            ),
            Unanswered::Refused(why) => f.write_str(why),
            Unanswered::Bus(e) => write!(f, "{e:#}"),
        }
    }
}

impl std::error::Error for Unanswered {}

/// One request to the identity service on `bus`.
pub(crate) async fn request(bus: &Bus, op: Op) -> Result<pb::IdentityAdminReply, Unanswered> {
    let body = pb::IdentityAdmin { op: Some(op) }.encode_to_vec();
    match bus.request(names::IDENTITY_ADMIN.to_string(), body.into(), TIMEOUT).await {
        Ok((_, body)) => {
            pb::IdentityAdminReply::decode(body).context("the identity service's answer").map_err(Unanswered::Bus)
        }
        Err(RequestError::NoResponders { .. }) => Err(Unanswered::NoService),
        Err(RequestError::Refused { reason, .. }) => Err(Unanswered::Refused(reason)),
        Err(e) => Err(Unanswered::Bus(e.into())),
    }
}

async fn ask(url: &str, op: Op) -> anyhow::Result<pb::IdentityAdminReply> {
    let bus = Bus::connect_client(url, "landfall-cli", crate::nats_access::get()).await?;
    Ok(request(&bus, op).await?)
}

fn when(unix_ms: i64) -> String {
    crate::views::human::rfc3339_ms(unix_ms)
}

fn state(e: &pb::Enrollment) -> &'static str {
    match pb::EnrollmentState::try_from(e.state).unwrap_or_default() {
        pb::EnrollmentState::Pending => "pending",
        pb::EnrollmentState::Approved => "approved",
        pb::EnrollmentState::Denied => "denied",
    }
}

pub async fn bootstrap(url: &str, args: &BootstrapArgs) -> anyhow::Result<ExitCode> {
    let op = Op::IssueBootstrap(pb::IssueBootstrap {
        site_id: args.site.clone().unwrap_or_default(),
        ttl_seconds: args.ttl.as_secs(),
    });
    let reply = ask(url, op).await?;
    eprintln!(
        "a bootstrap credential{}, valid until {}: give it to the gateway (`landfall-gateway … --bootstrap-file`); it lets a gateway ask to join and nothing else",
        args.site.as_ref().map(|s| format!(" for site {s}")).unwrap_or_default(),
        when(reply.bootstrap_expires_unix_ms)
    );
    println!("{}", reply.bootstrap_credential);
    Ok(ExitCode::SUCCESS)
}

pub async fn enrollments(url: &str, all: bool) -> anyhow::Result<ExitCode> {
    let reply = ask(url, Op::ListEnrollments(pb::ListEnrollments { pending_only: !all })).await?;
    if reply.enrollments.is_empty() {
        println!("{}", if all { "no requests to join" } else { "no request to join is waiting" });
    }
    for e in &reply.enrollments {
        let facts: Vec<String> = {
            let mut f: Vec<_> = e.facts.iter().map(|(k, v)| format!("{k}={v}")).collect();
            f.sort();
            f
        };
        println!(
            "{}  site {}  {}  asked {} ({} times)  key {}",
            e.fingerprint,
            if e.site_id.is_empty() { "?" } else { &e.site_id },
            state(e),
            when(e.requested_unix_ms),
            e.asked,
            e.identity_key
        );
        if !facts.is_empty() {
            println!("    {}", facts.join(" "));
        }
        if !e.reason.is_empty() || !e.decided_by.is_empty() {
            println!("    decided by {} {}", e.decided_by, e.reason);
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn decide(url: &str, args: &DecideArgs, approve: bool) -> anyhow::Result<ExitCode> {
    let op = Op::Decide(pb::DecideEnrollment { identity_key: args.key.clone(), approve, reason: args.reason.clone() });
    let reply = ask(url, op).await?;
    if let Some(e) = reply.enrollments.first() {
        println!(
            "{} {} as site {} ({}): the gateway gets its credentials the next time it asks",
            if approve { "approved" } else { "denied" },
            e.fingerprint,
            e.site_id,
            e.identity_key
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn revoke(url: &str, args: &RevokeArgs) -> anyhow::Result<ExitCode> {
    let reply =
        ask(url, Op::Revoke(pb::RevokeSite { site_id: args.site.clone(), reason: args.reason.clone() })).await?;
    println!(
        "site {} revoked: {} connection(s) closed ({} ms); none of its keys connects any more",
        args.site, reply.disconnected, reply.revoke_millis
    );
    Ok(ExitCode::SUCCESS)
}

pub async fn identities(url: &str) -> anyhow::Result<ExitCode> {
    let reply = ask(url, Op::ListSites(pb::ListSiteIdentities {})).await?;
    for s in &reply.sites {
        let link = s.links.last().map(|l| format!("link expires {}", when(l.expires_unix_ms))).unwrap_or_default();
        println!(
            "{}  {}  key {}  enrolled {}  {}",
            s.site_id,
            if s.revoked { "REVOKED" } else { "active" },
            fingerprint(&s.identity_key),
            when(s.enrolled_unix_ms),
            if s.revoked { format!("revoked {} {}", when(s.revoked_unix_ms), s.revoked_reason) } else { link }
        );
    }
    Ok(ExitCode::SUCCESS)
}
