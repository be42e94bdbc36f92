//! Operators' requests to the identity service (`landfall.identity.admin`, an `IdentityAdmin`):
//! bootstrap credentials, the requests to join and the sites' identities, decisions, and
//! revocation.

use std::time::{Duration, Instant};

use bus_schema::credentials::Kind;
use bus_schema::names::{self, keys};
use bus_schema::pb::{self, identity_admin::Op};
use bus_schema::runtime::{self, Reply, Update};
use prost::Message;

use super::{IdentityService, ok};
use crate::clock::now_ms;

/// A bootstrap credential lasts this long unless asked otherwise, and at most a day.
const BOOTSTRAP_TTL: Duration = Duration::from_secs(3600);
const BOOTSTRAP_TTL_MAX: Duration = Duration::from_secs(24 * 3600);
/// When a revocation closes a site's connections again: one let in while the revocation was
/// being written is registered by its server a moment after the callout answered.
const KICK_AGAIN_AFTER: [Duration; 2] = [Duration::from_millis(500), Duration::from_secs(2)];

impl IdentityService {
    pub(super) async fn admin(&self, payload: &[u8]) -> Reply {
        let op = match pb::IdentityAdmin::decode(payload).map(|a| a.op) {
            Ok(Some(op)) => op,
            Ok(None) => return runtime::error_reply("an IdentityAdmin with no operation"),
            Err(e) => return runtime::error_reply(&format!("not an IdentityAdmin: {e}")),
        };
        let mut reply = pb::IdentityAdminReply::default();
        match op {
            Op::IssueBootstrap(b) => {
                if !b.site_id.is_empty()
                    && let Err(e) = bus_schema::domain::SiteId::try_from(b.site_id.clone())
                {
                    return runtime::error_reply(&format!("site: {e}"));
                }
                let ttl = match b.ttl_seconds {
                    0 => BOOTSTRAP_TTL,
                    s => Duration::from_secs(s).min(BOOTSTRAP_TTL_MAX),
                };
                let expires = now_ms() + ttl.as_millis() as i64;
                match self.credential(Kind::Bootstrap, &b.site_id, "", Some(expires)) {
                    Ok(token) => (reply.bootstrap_credential, reply.bootstrap_expires_unix_ms) = (token, expires),
                    Err(refusal) => return refusal,
                }
            }
            Op::ListEnrollments(l) => match self.store.scan::<pb::Enrollment>(keys::ENROLLMENT_PREFIX).await {
                Ok(all) => {
                    reply.enrollments = all
                        .into_iter()
                        .map(|(_, e, _)| e)
                        .filter(|e| !l.pending_only || e.state == pb::EnrollmentState::Pending as i32)
                        .collect();
                }
                Err(e) => return runtime::error_reply(&format!("the identity store failed: {e}")),
            },
            Op::ListSites(_) => match self.store.scan::<pb::SiteIdentity>(keys::IDENTITY_SITE_PREFIX).await {
                Ok(all) => reply.sites = all.into_iter().map(|(_, s, _)| s).collect(),
                Err(e) => return runtime::error_reply(&format!("the identity store failed: {e}")),
            },
            Op::Decide(d) => {
                let key = match self.key_of(&d.identity_key).await {
                    Ok(key) => key,
                    Err(why) => return runtime::error_reply(&why),
                };
                match self.decide(&key, d.approve, &d.reason, "operator").await {
                    Ok(e) => reply.enrollments.push(e),
                    Err(why) => return runtime::error_reply(&why),
                }
            }
            Op::Revoke(r) => match self.revoke(&r.site_id, &r.reason).await {
                Ok(None) => return runtime::error_reply(&format!("site {} has no identity to revoke", r.site_id)),
                Ok(Some((record, disconnected, took))) => {
                    reply.sites.push(record);
                    reply.disconnected = disconnected;
                    reply.revoke_millis = took.as_millis() as u64;
                }
                Err(why) => return runtime::error_reply(&why),
            },
        }
        ok(&reply)
    }

    /// The identity key a request names, by key or by fingerprint.
    async fn key_of(&self, named: &str) -> Result<String, String> {
        if named.starts_with('U') && named.len() == 56 {
            return Ok(named.to_string());
        }
        let all = self.store.scan::<pb::Enrollment>(keys::ENROLLMENT_PREFIX).await.map_err(|e| e.to_string())?;
        let matching: Vec<String> =
            all.into_iter().filter(|(_, e, _)| e.fingerprint == named).map(|(_, e, _)| e.identity_key).collect();
        match matching.as_slice() {
            [key] => Ok(key.clone()),
            [] => Err(format!("no request to join with key or fingerprint {named}")),
            _ => Err(format!("several requests have fingerprint {named}: give the whole key")),
        }
    }

    /// Marks `site` revoked (the callout lets none of its keys in from then on), and closes its
    /// connections on every hub server: the record, how many were closed, how long it took.
    /// `None` when the site has no identity (it never joined by enrollment).
    pub(super) async fn revoke(
        &self,
        site: &str,
        reason: &str,
    ) -> Result<Option<(pb::SiteIdentity, u32, Duration)>, String> {
        let started = Instant::now();
        let now = now_ms();
        let record = self
            .store
            .update_with(&keys::identity_site(site), |r: Option<&pb::SiteIdentity>| match r {
                None => Update::Abort(Ok::<_, String>(None)),
                Some(r) if r.revoked => Update::Keep(Ok(Some(r.clone()))),
                Some(r) => {
                    let next = pb::SiteIdentity {
                        revoked: true,
                        revoked_unix_ms: now,
                        revoked_reason: reason.to_string(),
                        ..r.clone()
                    };
                    Update::Put(next.clone(), Ok(Some(next)))
                }
            })
            .await
            .map_err(|e| format!("the identity store failed: {e}"))??;
        let Some(record) = record else { return Ok(None) };
        tracing::warn!(site, reason, "site revoked");
        let Some(system) = self.system.clone() else {
            tracing::warn!(site, "no system account connection: the site's open connections stay until they drop");
            return Ok(Some((record, 0, started.elapsed())));
        };
        let disconnected = kick(&system, &record).await;
        let took = started.elapsed();
        // Again a moment later, without keeping the operator waiting.
        let (store, site) = (self.store.clone(), site.to_string());
        tokio::spawn(async move {
            for wait in KICK_AGAIN_AFTER {
                tokio::time::sleep(wait).await;
                if let Ok(Some((latest, _))) = store.get::<pb::SiteIdentity>(&keys::identity_site(&site)).await {
                    kick(&system, &latest).await;
                }
            }
        });
        Ok(Some((record, disconnected, took)))
    }
}

/// Closes every connection of `record` its servers still have: how many they closed.
async fn kick(system: &async_nats::Client, record: &pb::SiteIdentity) -> u32 {
    let mut closed = 0;
    for c in &record.connections {
        let body = serde_json::json!({ "cid": c.client_id }).to_string();
        let asked = system.request(names::server_kick(&c.server_id), body.into());
        // No answer: the server restarted since (its id is new), and the connection went with it.
        if let Ok(Ok(answer)) = tokio::time::timeout(Duration::from_secs(2), asked).await {
            let v: serde_json::Value = serde_json::from_slice(&answer.payload).unwrap_or_default();
            if v.get("error").is_none() {
                closed += 1;
                tracing::info!(site = %record.site_id, server = %c.server_id, client = c.client_id, kind = %c.kind, "connection closed");
            }
        }
    }
    closed
}
