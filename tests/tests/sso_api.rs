//! People signed in through a real OpenID Connect provider (oidc-provider, `tests/oidc`) at the
//! real API over a real fleet: a regional operator's access token is allowed in its region and
//! refused elsewhere (commands, pages, events), a person the policy grants nothing is refused,
//! forged tokens are refused, and the commands they send name them.
//!
//! Needs Node.js and `LANDFALL_OIDC_MODULES` (`scripts/ensure-oidc-provider`; `scripts/test`
//! sets it).

use std::time::Duration;

use landfall_tests::api::Api;
use landfall_tests::fleet::Fleet;
use landfall_tests::nats::NatsServer;
use landfall_tests::oidc::{AUDIENCE, Options, Provider, User, device_login};
use producers::api::oidc::{OidcArgs, Verifier};
use serde_json::json;

const POLICY: &str = "grants:\n  - {group: eu-ops, role: operator, sites: {region: eu-west}}\n  \
                      - {group: us-ops, role: viewer, sites: {region: us-east}}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_regional_operator_signed_in_through_the_identity_provider_acts_in_its_region_only() {
    let users = [
        User::new("alice", "alice-password", &["eu-ops"]),
        User::new("bob", "bob-password", &["us-ops"]),
        User::new("carol", "carol-password", &["elsewhere"]),
    ];
    let idp = Provider::start(&users, Options::default()).await;
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(2).nodes(1).start().await;
    let verifier = Verifier::start(&OidcArgs::new(idp.issuer(), AUDIENCE)).await.unwrap();
    let api = Api::start_full(&fleet.bus, POLICY, &[], verifier).await;
    api.put_in_region(&fleet, 0, "eu-west").await;
    api.put_in_region(&fleet, 1, "us-east").await;
    let (eu, us) = (fleet.site_id(0), fleet.site_id(1));

    // How to sign in, without a token.
    let auth = api.http.get(api.url("/v1/auth")).send().await.unwrap().bytes().await.unwrap();
    let auth: serde_json::Value = serde_json::from_slice(&auth).unwrap();
    assert_eq!(auth["oidc"]["issuer"], idp.issuer());
    assert_eq!(auth["oidc"]["cli_client"], "landfall-cli");

    // Alice logs in as the CLI does (device code), with the provider's own pages.
    let alice = device_login(&idp, "alice", "alice-password").await.access_token;
    let (status, who) = api.get(&alice, "/v1/whoami").await;
    assert_eq!(status, 200, "{who}");
    assert_eq!((who["actor"].as_str(), who["role"].as_str()), (Some("user:alice"), Some("operator")));
    let (_, page) = api.get(&alice, "/v1/sites").await;
    assert_eq!(page["total"], 1, "{page}");
    assert_eq!(api.get(&alice, &format!("/v1/sites/{us}")).await.0, 404);
    let install = |site: &str| json!({ "site_id": site }).to_string();
    let (status, refused) = api.post(&alice, "/v1/commands/install_site", &install(&us), &[]).await;
    assert_eq!(status, 404, "{refused}");
    let (status, ok) = api.post(&alice, "/v1/commands/install_site", &install(&eu), &[]).await;
    assert_eq!((status, ok["actor"].as_str()), (202, Some("user:alice")), "{ok}");

    // Bob views his region only: no commands, none of alice's events.
    let bob = device_login(&idp, "bob", "bob-password").await.access_token;
    let (status, refused) = api.post(&bob, "/v1/commands/install_site", &install(&us), &[]).await;
    assert_eq!(status, 403, "{refused}");
    let events = api.events_as(&bob, "from_seq=1", None, Duration::from_secs(3), |_| false).await;
    assert!(!events.is_empty());
    // The catalog is the whole fleet's: its events reach every reader.
    for e in &events {
        let catalog = e.data["subject"].as_str().is_some_and(|s| s.contains(".package."));
        assert!(e.data["site"] == us.as_str() || catalog, "bob saw another region's event: {:?}", e.data);
    }

    // Carol's groups have no grant: she is known but may do nothing.
    let carol = device_login(&idp, "carol", "carol-password").await.access_token;
    let (status, refused) = api.get(&carol, "/v1/sites").await;
    assert_eq!(status, 403, "{refused}");
    assert!(refused["message"].as_str().unwrap().contains("granted nothing"), "{refused}");

    // A token with one byte of its signature changed, or one of no provider, is refused.
    let mut forged = alice.clone().into_bytes();
    let last = forged.len() - 2;
    forged[last] = if forged[last] == b'A' { b'B' } else { b'A' };
    let forged = String::from_utf8(forged).unwrap();
    let (status, err) = api.get(&forged, "/v1/whoami").await;
    assert_eq!(status, 401, "{err}");
    assert_eq!(api.get("eyJhbGciOiJub25lIn0.e30.", "/v1/whoami").await.0, 401);

    // Her command is on record under her name.
    let id = ok["id"].as_str().unwrap();
    for _ in 0..200 {
        let (status, record) = api.get(&alice, &format!("/v1/commands/{id}")).await;
        if status == 200 {
            assert_eq!(record["actor"], "user:alice", "{record}");
            let (_, audit) = api.get(&alice, "/v1/audit?actor=alice").await;
            assert!(audit["items"].as_array().unwrap().iter().any(|r| r["id"] == id), "{audit}");
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("alice's install was never settled");
}
