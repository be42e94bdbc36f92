//! The NATS server's auth callout: who a connection that is not a hub service is, decided
//! from the credential it presents and the key it proves it holds.
//!
//! - a bootstrap credential, with the key the gateway made: it may ask to join
//!   ([`access::enrollment`]) until the credential expires;
//! - a site's identity credential: it may ask for new link credentials ([`access::site_renewal`]);
//! - a site's link credential, for a key the site still holds: the site's permissions
//!   ([`access::site_link`]) until the link key expires.
//!
//! - a site's leaf node: its URL's user names the site and the nonce is signed by one of the
//!   site's unexpired link keys (the credentials file its gateway keeps).
//!
//! Everything else is refused with the reason, which the server logs. A site let in is
//! recorded (server and connection id) in the same compare-and-set that finds it not revoked,
//! so a revocation finds every connection it must close.

use bus_schema::access::{self, Permissions};
use bus_schema::credentials::{self, AuthRequest, Kind};
use bus_schema::names::keys;
use bus_schema::pb;
use bus_schema::runtime::Update;

use super::IdentityService;
use crate::clock::now_ms;

/// How many connections of a site are remembered for a revocation to close.
const CONNECTIONS_KEPT: usize = 8;

/// Who the connection is, for the answer.
pub(super) struct LetIn {
    pub name: String,
    pub permissions: Permissions,
    /// Unix seconds.
    pub exp: Option<i64>,
}

impl IdentityService {
    /// The answer to one callout request: the signed response, letting in or refusing.
    pub(super) async fn callout(&self, payload: &[u8]) -> Option<Vec<u8>> {
        let request = match credentials::decode_auth_request(payload) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "an auth callout request that does not decode: not answered");
                return None;
            }
        };
        let now = now_ms() / 1000;
        let answer = match self.admission(&request).await {
            Ok(ok) => credentials::authorized(&request, &self.settings.issuer, &ok.name, &ok.permissions, now, ok.exp),
            Err(why) => {
                tracing::info!(
                    client = request.client_info.id,
                    host = %request.client_info.host,
                    kind = %request.client_info.kind,
                    reason = %why,
                    "connection refused"
                );
                metrics::counter!("landfall_identity_refused_total").increment(1);
                credentials::refused(&request, &self.settings.issuer, now, &why)
            }
        };
        answer.map_err(|e| tracing::warn!(error = %e, "cannot sign the callout's answer")).ok()
    }

    async fn admission(&self, request: &AuthRequest) -> Result<LetIn, String> {
        let opts = &request.connect_opts;
        if opts.credential().is_empty() {
            return self.leaf_link(request).await;
        }
        let now_s = now_ms() / 1000;
        let credential = credentials::verify(opts.credential(), &self.settings.issuer.public_key(), now_s)
            .map_err(|e| format!("credential refused: {e}"))?;
        let key = match credential.landfall.kind {
            Kind::Bootstrap => opts.nkey.clone(),
            Kind::Identity | Kind::Link => credential.sub.clone(),
        };
        if key.is_empty() || (!opts.nkey.is_empty() && opts.nkey != key) {
            return Err("the connection's key is not the credential's".into());
        }
        if !credentials::nonce_signed_by(&key, &request.client_info.nonce, &opts.sig) {
            return Err("the connection did not prove it holds the credential's key".into());
        }
        let site = credential.landfall.site.clone();
        match credential.landfall.kind {
            Kind::Bootstrap => {
                self.note_bootstrap(&key, &site, &credential.jti).await?;
                Ok(LetIn {
                    name: format!("enroll-{}", credentials::fingerprint(&key)),
                    permissions: access::enrollment(&key),
                    exp: credential.exp,
                })
            }
            Kind::Identity => {
                self.admit(request, &site, |r, _| (r.identity_key == key).then(|| key.clone())).await?;
                Ok(LetIn { name: format!("site-{site}-renewal"), permissions: access::site_renewal(&site), exp: None })
            }
            Kind::Link => {
                let held = |r: &pb::SiteIdentity, now| {
                    r.links.iter().any(|l| l.key == key && l.expires_unix_ms > now).then(|| key.clone())
                };
                let (record, key) = self.admit(request, &site, held).await?;
                Ok(self.as_site(&site, &record, &key, credential.exp))
            }
        }
    }

    /// A site's leaf node linking to the hub: it names its site (the user of its remote's URL)
    /// and signs the nonce with the link key of the credentials file its gateway keeps (a
    /// server not in operator mode passes no JWT on, so the key is found among the site's).
    async fn leaf_link(&self, request: &AuthRequest) -> Result<LetIn, String> {
        let opts = &request.connect_opts;
        if opts.user.is_empty() || opts.sig.is_empty() {
            return Err("no landfall credential presented".into());
        }
        let site = bus_schema::domain::SiteId::try_from(opts.user.clone())
            .map_err(|e| format!("the leaf node names no site: {e}"))?
            .to_string();
        let nonce = &request.client_info.nonce;
        let signed = |r: &pb::SiteIdentity, now| {
            r.links
                .iter()
                .find(|l| l.expires_unix_ms > now && credentials::nonce_signed_by(&l.key, nonce, &opts.sig))
                .map(|l| l.key.clone())
        };
        let (record, key) = self.admit(request, &site, signed).await?;
        Ok(self.as_site(&site, &record, &key, None))
    }

    /// Who a site's link key connects as: the site's permissions until the key (or its
    /// credential, `exp`) expires.
    fn as_site(&self, site: &str, record: &pb::SiteIdentity, key: &str, exp: Option<i64>) -> LetIn {
        let until = record.links.iter().find(|l| l.key == key).map(|l| l.expires_unix_ms / 1000);
        LetIn {
            name: format!("site-{site}"),
            permissions: access::site_link(site),
            exp: [exp, until].into_iter().flatten().min(),
        }
    }

    /// The site's record and the key `pick` finds in it (at this time, unix ms) that may
    /// connect, with this connection recorded: refused when the site is not enrolled, is
    /// revoked, or `pick` finds none. One compare-and-set, so a revocation written meanwhile
    /// either refuses the connection or finds it recorded.
    async fn admit(
        &self,
        request: &AuthRequest,
        site: &str,
        pick: impl Fn(&pb::SiteIdentity, i64) -> Option<String>,
    ) -> Result<(pb::SiteIdentity, String), String> {
        let now = now_ms();
        self.store
            .update_with(&keys::identity_site(site), |r: Option<&pb::SiteIdentity>| {
                let Some(r) = r else { return Update::Abort(Err(format!("site {site} is not enrolled"))) };
                if r.revoked {
                    return Update::Abort(Err(format!("site {site} is revoked")));
                }
                let Some(key) = pick(r, now) else {
                    return Update::Abort(Err(format!("the key is not one site {site} may connect with")));
                };
                let mut next = r.clone();
                next.connections.push(pb::ConnectionSeen {
                    server_id: request.server_id.id.clone(),
                    client_id: request.client_info.id,
                    kind: request.client_info.kind.clone(),
                    at_unix_ms: now,
                    key: key.clone(),
                });
                let extra = next.connections.len().saturating_sub(CONNECTIONS_KEPT);
                next.connections.drain(..extra);
                Update::Put(next.clone(), Ok((next, key)))
            })
            .await
            .map_err(|e| format!("the identity store failed: {e}"))?
    }

    /// Notes which bootstrap credential (and site, if it names one) a key asked to join with.
    async fn note_bootstrap(&self, key: &str, site: &str, bootstrap_id: &str) -> Result<(), String> {
        let now = now_ms();
        self.store
            .update_with(&keys::enrollment(key), |r: Option<&pb::Enrollment>| match r {
                Some(e) if e.bootstrap_id == bootstrap_id || e.state != pb::EnrollmentState::Pending as i32 => {
                    Update::Keep(())
                }
                Some(e) => Update::Put(
                    pb::Enrollment {
                        bootstrap_id: bootstrap_id.to_string(),
                        bootstrap_site: site.to_string(),
                        ..e.clone()
                    },
                    (),
                ),
                None => Update::Put(
                    pb::Enrollment {
                        identity_key: key.to_string(),
                        site_id: site.to_string(),
                        bootstrap_site: site.to_string(),
                        fingerprint: credentials::fingerprint(key),
                        bootstrap_id: bootstrap_id.to_string(),
                        requested_unix_ms: now,
                        ..Default::default()
                    },
                    (),
                ),
            })
            .await
            .map_err(|e| format!("the identity store failed: {e}"))
    }
}
