//! The identity service: how sites join, the credentials they connect with, and revocation.
//!
//! - [`callout`]: the NATS server's auth callout (`$SYS.REQ.USER.AUTH`), which lets a site in
//!   by the credential it presents and the key it proves it holds;
//! - `landfall.identity.enroll.<key>`: a gateway asking to join, connected with a bootstrap
//!   credential; an operator approves or denies it (`landfall.identity.admin`), or the rule
//!   ([`Approval::Registered`]) approves a registered site that has no identity yet;
//! - `landfall.svc.<site>.renew_identity`: new link credentials, asked with the site's identity
//!   key's signature: from the site's link connection before the old ones expire, or from its
//!   identity connection after a cut longer than their life;
//! - `landfall.identity.admin`: bootstrap credentials, the list of requests and identities,
//!   decisions, and revocation, which closes the site's connections on every hub server
//!   (`$SYS.REQ.SERVER.<id>.KICK`, through the system account) and keeps them out.
//!
//! The hub's NATS configuration never changes for any of this: it names the identity service's
//! issuer key once.

mod admin;
mod callout;

use std::sync::Arc;
use std::time::Duration;

use async_nats::HeaderMap;
use bus_schema::credentials::{self, Kind};
use bus_schema::names::{self, keys};
use bus_schema::pb::{self, BusEvent, BusMessage};
use bus_schema::runtime::{self, Bus, Kv, Reply, Update};
use bytes::Bytes;
use futures::StreamExt;
use prost::Message;
use tokio_util::sync::CancellationToken;

use crate::clock::now_ms;

/// How long link credentials last unless set otherwise.
pub const LINK_TTL: Duration = Duration::from_secs(30 * 24 * 3600);
/// How far a renewal request's time may be from the hub's.
const RENEWAL_SKEW_MS: i64 = 10 * 60 * 1000;
/// Link keys a site keeps at once (the newest, and those not yet expired before them).
const LINKS_KEPT: usize = 3;
const CONCURRENCY: usize = 64;

/// Who approves a gateway's request to join.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Approval {
    /// An operator, always.
    #[default]
    Operator,
    /// The rule: a registered site with no identity yet is approved by itself; anything else
    /// waits for an operator.
    Registered,
}

/// How the identity service runs.
#[derive(Clone)]
pub struct IdentitySettings {
    /// The key credentials and the callout's answers are signed with (an account nkey); the hub's
    /// configuration names its public key as the callout's issuer.
    pub issuer: Arc<nkeys::KeyPair>,
    pub link_ttl: Duration,
    pub approval: Approval,
}

pub(crate) struct IdentityService {
    store: Kv,
    sites: Kv,
    settings: IdentitySettings,
    /// A system account connection, to close a revoked site's connections.
    system: Option<async_nats::Client>,
}

/// Runs the identity service until `shutdown`: the callout, enrollment, renewal and the
/// operators' requests, each a queue group shared by its replicas.
///
/// # Errors
/// The identity bucket cannot be made or opened, or a subscription fails.
pub async fn run_identity_service(
    bus: Bus,
    system: Option<async_nats::Client>,
    settings: IdentitySettings,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let service = Arc::new(IdentityService {
        store: bus.kv(names::IDENTITY_BUCKET).await?,
        sites: bus.kv(names::SITES_BUCKET).await?,
        settings,
        system,
    });
    tracing::info!(issuer = %service.settings.issuer.public_key(), approval = ?service.settings.approval, "identity service started");
    let mut callouts =
        bus.client().queue_subscribe(names::AUTH_CALLOUT.to_string(), names::IDENTITY_GROUP.to_string()).await?;
    let answering = {
        let (service, client, shutdown) = (service.clone(), bus.client().clone(), shutdown.clone());
        tokio::spawn(async move {
            let permits = Arc::new(tokio::sync::Semaphore::new(CONCURRENCY));
            loop {
                let msg = tokio::select! {
                    _ = shutdown.cancelled() => break,
                    m = callouts.next() => match m { Some(m) => m, None => break },
                };
                let Some(reply) = msg.reply else { continue };
                let Ok(permit) = permits.clone().acquire_owned().await else { break };
                let (service, client) = (service.clone(), client.clone());
                tokio::spawn(async move {
                    if let Some(answer) = service.callout(&msg.payload).await
                        && let Err(e) = client.publish(reply, answer.into()).await
                    {
                        tracing::warn!(error = %e, "cannot answer the auth callout");
                    }
                    drop(permit);
                });
            }
        })
    };
    let serve = |subject: String, answer: fn(Arc<IdentityService>, String, Bytes) -> Answer| {
        let service = service.clone();
        runtime::serve_requests(&bus, subject, names::IDENTITY_GROUP, CONCURRENCY, shutdown.clone(), move |s, p| {
            answer(service.clone(), s.to_string(), p)
        })
    };
    let enroll =
        serve(names::identity_enroll("*"), |s, subject, p| Box::pin(async move { s.enroll(&subject, &p).await }));
    let renew = serve(names::identity_renew("*"), |s, subject, p| Box::pin(async move { s.renew(&subject, &p).await }));
    let admin = serve(names::IDENTITY_ADMIN.to_string(), |s, _, p| Box::pin(async move { s.admin(&p).await }));
    // A site decommissioned or removed is revoked: its credentials are worth nothing from then on.
    let spec = runtime::ConsumerSpec::new(
        names::EVENTS_STREAM,
        names::IDENTITY_EVENTS,
        vec![pb::SiteDecommissioned::filter(), pb::SiteRemoved::filter()],
        runtime::RejectAs::Message { consumer: names::IDENTITY_EVENTS.to_string() },
    );
    let revoking = runtime::consume(bus.clone(), spec, Arc::new(Revoker(service.clone())), shutdown.clone());
    let (e, r, a, v) = tokio::join!(enroll, renew, admin, revoking);
    e?;
    r?;
    a?;
    v?;
    let _ = answering.await;
    Ok(())
}

/// Revokes the identity of each site decommissioned or removed.
struct Revoker(Arc<IdentityService>);

impl runtime::Handler for Revoker {
    async fn handle(&self, d: &runtime::Delivery) -> Result<(), runtime::HandlerError> {
        let (site, why) = if d.type_name == pb::SiteDecommissioned::TYPE {
            (d.decode::<pb::SiteDecommissioned>()?.site_id, "decommissioned")
        } else {
            (d.decode::<pb::SiteRemoved>()?.site_id, "removed")
        };
        match self.0.revoke(&site, &format!("site {why}")).await {
            Ok(_) => Ok(()),
            Err(e) => Err(runtime::HandlerError::transient(format!("revoking site {site}"), std::io::Error::other(e))),
        }
    }
}

type Answer = std::pin::Pin<Box<dyn std::future::Future<Output = Reply> + Send>>;

fn ok<M: Message>(m: &M) -> Reply {
    (HeaderMap::new(), Bytes::from(m.encode_to_vec()))
}

fn last_token(subject: &str) -> &str {
    subject.rsplit('.').next().unwrap_or_default()
}

impl IdentityService {
    fn credential(&self, kind: Kind, site: &str, key: &str, exp_ms: Option<i64>) -> Result<String, Reply> {
        credentials::issue(&self.settings.issuer, kind, site, key, now_ms() / 1000, exp_ms.map(|ms| ms / 1000))
            .map_err(|e| runtime::error_reply(&format!("cannot issue a credential: {e}")))
    }

    /// A gateway's request to join, from the key the subject names.
    async fn enroll(&self, subject: &str, payload: &[u8]) -> Reply {
        let key = last_token(subject).to_string();
        let request = match pb::EnrollRequest::decode(payload) {
            Ok(r) => r,
            Err(e) => return runtime::error_reply(&format!("not an EnrollRequest: {e}")),
        };
        if let Err(e) = bus_schema::domain::SiteId::try_from(request.site_id.clone()) {
            return runtime::error_reply(&format!("site: {e}"));
        }
        if nkeys::KeyPair::from_public_key(&request.link_key).is_err() || !request.link_key.starts_with('U') {
            return runtime::error_reply("link_key is not a user's public nkey");
        }
        if request.facts.len() > 64 || request.facts.iter().any(|(k, v)| k.len() > 128 || v.len() > 1024) {
            return runtime::error_reply("too many facts, or a fact too long (64 facts of 1 KiB at most)");
        }
        let now = now_ms();
        let recorded = self
            .store
            .update_with(&keys::enrollment(&key), |r: Option<&pb::Enrollment>| {
                let mut e = r.cloned().unwrap_or_else(|| pb::Enrollment {
                    identity_key: key.clone(),
                    fingerprint: credentials::fingerprint(&key),
                    requested_unix_ms: now,
                    ..Default::default()
                });
                if !e.bootstrap_site.is_empty() && e.bootstrap_site != request.site_id {
                    return Update::Abort(Err(format!(
                        "the bootstrap credential this gateway joined with is for site {}, not {}",
                        e.bootstrap_site, request.site_id
                    )));
                }
                if e.state == pb::EnrollmentState::Pending as i32 {
                    e.site_id = request.site_id.clone();
                    e.facts = request.facts.clone();
                    e.link_key = request.link_key.clone();
                } else if e.site_id != request.site_id {
                    return Update::Abort(Err(format!("this key's request was decided for site {}", e.site_id)));
                }
                e.asked = e.asked.saturating_add(1);
                Update::Put(e.clone(), Ok(e))
            })
            .await;
        let mut e = match recorded {
            Ok(Ok(e)) => e,
            Ok(Err(why)) => return runtime::error_reply(&why),
            Err(err) => return runtime::error_reply(&format!("the identity store failed: {err}")),
        };
        if e.state == pb::EnrollmentState::Pending as i32 && self.rule_approves(&e).await {
            match self.decide(&key, true, "", "rule: registered site without an identity").await {
                Ok(decided) => e = decided,
                Err(why) => tracing::info!(site = %e.site_id, reason = %why, "the rule did not approve"),
            }
        }
        let mut reply = pb::EnrollReply {
            state: e.state,
            reason: e.reason.clone(),
            site_id: e.site_id.clone(),
            ..Default::default()
        };
        if e.state == pb::EnrollmentState::Approved as i32 {
            match self.register_link(&e.site_id, &request.link_key).await {
                Ok(expires) => {
                    reply.link_expires_unix_ms = expires;
                    let issued = self.credential(Kind::Identity, &e.site_id, &key, None).and_then(|id| {
                        Ok((id, self.credential(Kind::Link, &e.site_id, &request.link_key, Some(expires))?))
                    });
                    match issued {
                        Ok((id, link)) => (reply.identity_credential, reply.link_credential) = (id, link),
                        Err(refusal) => return refusal,
                    }
                }
                Err(why) => return runtime::error_reply(&why),
            }
        }
        ok(&reply)
    }

    /// Whether the rule approves `e`: a registered site with no identity, or a revoked one.
    async fn rule_approves(&self, e: &pb::Enrollment) -> bool {
        if self.settings.approval != Approval::Registered {
            return false;
        }
        let registered = matches!(self.sites.get::<pb::SiteDesign>(&keys::site(&e.site_id)).await, Ok(Some(_)));
        let taken = matches!(self.store.get::<pb::SiteIdentity>(&keys::identity_site(&e.site_id)).await, Ok(Some(_)));
        registered && !taken
    }

    /// Approves or denies the request of `key` (or of the key with that fingerprint); an
    /// approval makes it the site's identity (a revoked identity is replaced; an active one is
    /// not: revoke it first).
    async fn decide(&self, key: &str, approve: bool, reason: &str, by: &str) -> Result<pb::Enrollment, String> {
        let now = now_ms();
        let e = self
            .store
            .update_with(&keys::enrollment(key), |r: Option<&pb::Enrollment>| {
                let Some(e) = r else { return Update::Abort(Err(format!("no request to join from key {key}"))) };
                if e.state != pb::EnrollmentState::Pending as i32 {
                    return Update::Abort(Err("the request was decided already".to_string()));
                }
                if e.site_id.is_empty() {
                    return Update::Abort(Err("the gateway has not said which site it is yet".to_string()));
                }
                let state = if approve { pb::EnrollmentState::Approved } else { pb::EnrollmentState::Denied };
                let next = pb::Enrollment {
                    state: state as i32,
                    decided_unix_ms: now,
                    reason: reason.to_string(),
                    decided_by: by.to_string(),
                    ..e.clone()
                };
                Update::Put(next.clone(), Ok(next))
            })
            .await
            .map_err(|e| e.to_string())??;
        if approve {
            let site = e.site_id.clone();
            let made = self
                .store
                .update_with(&keys::identity_site(&site), |r: Option<&pb::SiteIdentity>| match r {
                    Some(r) if !r.revoked && r.identity_key != key => {
                        Update::Abort(Err(format!("site {site} has an identity already: revoke it first")))
                    }
                    Some(r) if !r.revoked => Update::Keep(Ok(())),
                    _ => Update::Put(
                        pb::SiteIdentity {
                            site_id: site.clone(),
                            identity_key: key.to_string(),
                            enrolled_unix_ms: now,
                            ..Default::default()
                        },
                        Ok(()),
                    ),
                })
                .await
                .map_err(|e| e.to_string())?;
            if let Err(why) = made {
                // The approval stands in no record: back to pending, with the reason.
                let _ = self
                    .store
                    .update_with(&keys::enrollment(key), |r: Option<&pb::Enrollment>| match r {
                        Some(e) => Update::Put(
                            pb::Enrollment {
                                state: pb::EnrollmentState::Pending as i32,
                                reason: why.clone(),
                                ..e.clone()
                            },
                            (),
                        ),
                        None => Update::Keep(()),
                    })
                    .await;
                return Err(why);
            }
            tracing::info!(site = %site, key = %key, by, "site enrolled");
        } else {
            tracing::info!(site = %e.site_id, key = %key, by, "request to join denied");
        }
        Ok(e)
    }

    /// Registers `link_key` for `site` (not revoked), expiring after the link lifetime: when.
    async fn register_link(&self, site: &str, link_key: &str) -> Result<i64, String> {
        let now = now_ms();
        let expires = now + self.settings.link_ttl.as_millis() as i64;
        self.store
            .update_with(&keys::identity_site(site), |r: Option<&pb::SiteIdentity>| {
                let Some(r) = r else { return Update::Abort(Err(format!("site {site} is not enrolled"))) };
                if r.revoked {
                    return Update::Abort(Err(format!("site {site} is revoked")));
                }
                let mut next = r.clone();
                next.links.retain(|l| l.key != link_key && l.expires_unix_ms > now);
                next.links.push(pb::LinkKey {
                    key: link_key.to_string(),
                    issued_unix_ms: now,
                    expires_unix_ms: expires,
                });
                let extra = next.links.len().saturating_sub(LINKS_KEPT);
                next.links.drain(..extra);
                Update::Put(next, Ok(expires))
            })
            .await
            .map_err(|e| format!("the identity store failed: {e}"))?
    }

    /// New link credentials for the site the subject names, signed for by its identity key.
    async fn renew(&self, subject: &str, payload: &[u8]) -> Reply {
        let site = subject.split('.').nth(names::SCOPE_TOKEN).unwrap_or_default();
        let request = match pb::RenewRequest::decode(payload) {
            Ok(r) => r,
            Err(e) => return runtime::error_reply(&format!("not a RenewRequest: {e}")),
        };
        if request.site_id != site {
            return runtime::error_reply(&format!(
                "a renewal for site {} asked on site {site}'s subject",
                request.site_id
            ));
        }
        if (now_ms() - request.at_unix_ms).abs() > RENEWAL_SKEW_MS {
            return runtime::error_reply("the renewal's time is more than 10 minutes from the hub's");
        }
        if nkeys::KeyPair::from_public_key(&request.link_key).is_err() || !request.link_key.starts_with('U') {
            return runtime::error_reply("link_key is not a user's public nkey");
        }
        let identity = match self.store.get::<pb::SiteIdentity>(&keys::identity_site(site)).await {
            Ok(Some((r, _))) if !r.revoked => r,
            Ok(Some(_)) => return runtime::error_reply(&format!("site {site} is revoked")),
            Ok(None) => return runtime::error_reply(&format!("site {site} is not enrolled")),
            Err(e) => return runtime::error_reply(&format!("the identity store failed: {e}")),
        };
        let message = credentials::renewal_message(site, &request.link_key, request.at_unix_ms);
        let signed = nkeys::KeyPair::from_public_key(&identity.identity_key)
            .is_ok_and(|k| k.verify(&message, &request.signature).is_ok());
        if !signed {
            return runtime::error_reply("the renewal is not signed by the site's identity key");
        }
        let expires = match self.register_link(site, &request.link_key).await {
            Ok(expires) => expires,
            Err(why) => return runtime::error_reply(&why),
        };
        match self.credential(Kind::Link, site, &request.link_key, Some(expires)) {
            Ok(link) => {
                tracing::info!(site, "link credentials renewed");
                ok(&pb::RenewReply { link_credential: link, link_expires_unix_ms: expires })
            }
            Err(refusal) => refusal,
        }
    }
}
