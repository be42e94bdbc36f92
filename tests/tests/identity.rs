//! A site's identity through the real hub: `deploy nats-config --site-auth enroll` run as a real
//! nats-server whose auth callout is `landfall serve identity` (a process of its own), and a
//! gateway's side (`site_gateway::enrollment`) asking to join, connecting, renewing, and being
//! revoked. Operators act through the real CLI.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bus_schema::access::Role;
use bus_schema::names;
use bus_schema::names::keys;
use bus_schema::pb;
use bus_schema::runtime::{Bus, Presented};
use landfall_tests::procs::Service;
use landfall_tests::topology::{ConfServer, Deployment, connect_when_ready};
use site_gateway::enrollment::{self, Asked, SiteKeys};
use tokio_util::sync::CancellationToken;

struct Hub {
    d: Deployment,
    _servers: Vec<ConfServer>,
    _identity: Service,
    url: String,
}

fn start(sites: &[&str], link_ttl: &str, approve: &str) -> Hub {
    let d = Deployment::generate_enrolled(sites, 1);
    let servers = d.start_hubs();
    let url = d.hub_urls("nats");
    let identity = d.start_identity(&url, link_ttl, approve);
    d.wait_for_identity(&url, &identity);
    Hub { d, _servers: servers, _identity: identity, url }
}

fn landfall(hub: &Hub, args: &[&str]) -> std::process::Output {
    hub.d.operator_cli(&hub.url, args)
}

/// `landfall ARGS` as the operator: its stdout, or a panic with its stderr.
fn cli(hub: &Hub, args: &[&str]) -> String {
    let out = landfall(hub, args);
    assert!(out.status.success(), "landfall {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `landfall ARGS` that must fail: its stderr.
fn cli_fails(hub: &Hub, args: &[&str]) -> String {
    let out = landfall(hub, args);
    assert!(!out.status.success(), "landfall {args:?} succeeded: {}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

type Joining = tokio::task::JoinHandle<anyhow::Result<Result<Arc<SiteKeys>, Asked>>>;

/// A gateway's enrollment running in the background; `pending` is told when it waits.
fn ask_to_join(
    hub: &Hub,
    bootstrap: &str,
    site: &str,
    identity: Arc<nkeys::KeyPair>,
    dir: &Path,
) -> (Joining, tokio::sync::oneshot::Receiver<()>) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (url, bootstrap, site, dir) = (hub.url.clone(), bootstrap.to_string(), site.to_string(), dir.to_path_buf());
    let task = tokio::spawn(async move {
        enrollment::enroll(
            &url,
            &bootstrap,
            &site,
            enrollment::machine_facts(),
            identity,
            &dir,
            move || {
                let _ = tx.send(());
            },
            CancellationToken::new(),
        )
        .await
    });
    (task, rx)
}

/// Connects as the site with its keys, as its gateway does.
async fn connect_site(hub: &Hub, keys: &Arc<SiteKeys>) -> Bus {
    let access = keys.access(Default::default());
    tokio::time::timeout(Duration::from_secs(20), Bus::connect_client(&hub.url, "gateway", &access))
        .await
        .expect("connect in time")
        .expect("the site connects with its link credentials")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_joins_on_approval_connects_as_its_site_only_and_a_revocation_throws_it_out_within_seconds() {
    let hub = start(&["edge-01", "edge-02"], "30d", "operator");
    let tmp = tempfile::tempdir().unwrap();
    // Nothing may connect without a credential, a site or otherwise.
    let anonymous = async_nats::ConnectOptions::new().connect(&hub.url).await;
    assert!(anonymous.is_err(), "a connection without any credential was let in");

    let bootstrap = cli(&hub, &["site", "bootstrap", "--site", "edge-01", "--ttl", "10m"]).trim().to_string();
    let identity = Arc::new(nkeys::KeyPair::new_user());
    let (joining, pending) = ask_to_join(&hub, &bootstrap, "edge-01", identity.clone(), tmp.path());
    tokio::time::timeout(Duration::from_secs(30), pending).await.expect("the request waits").unwrap();
    let listed = cli(&hub, &["site", "enrollments"]);
    let fingerprint = bus_schema::credentials::fingerprint(&identity.public_key());
    assert!(listed.contains(&fingerprint) && listed.contains("edge-01") && listed.contains("pending"), "{listed}");
    assert!(listed.contains("cpus="), "the gateway's facts are listed: {listed}");

    // The bootstrap credential is for edge-01: a gateway holding it cannot join as edge-02.
    let other = Arc::new(nkeys::KeyPair::new_user());
    let (forged, _) = ask_to_join(&hub, &bootstrap, "edge-02", other.clone(), &tmp.path().join("other"));
    let refused = forged.await.unwrap().err().expect("an enrollment for another site than its bootstrap's");
    assert!(format!("{refused:#}").contains("is for site edge-01"), "{refused:#}");

    // Approved by an operator by its fingerprint: the waiting gateway gets its credentials.
    cli(&hub, &["site", "approve", &fingerprint]);
    let keys = tokio::time::timeout(Duration::from_secs(30), joining).await.unwrap().unwrap().unwrap().unwrap();
    assert_eq!(keys.site(), "edge-01");
    let creds = std::fs::read_to_string(tmp.path().join("link.creds")).unwrap();
    assert!(!creds.contains(&identity.seed().unwrap()), "the identity key's seed is never on disk");

    // Connected as edge-01: its own event subjects pass, another site's are refused.
    let bus = connect_site(&hub, &keys).await;
    let (credential, key) = keys.present().expect("credentials");
    let (raw, errors) = landfall_tests::topology::raw_client_presenting(&hub.url, &credential, key).await;
    let theirs = names::event_subject_from(names::Origin::Gateway, "edge-02", "node", "patched");
    raw.publish(theirs.clone(), "x".into()).await.unwrap();
    raw.flush().await.unwrap();
    let why = landfall_tests::topology::refused(&errors, &theirs).await;
    assert!(why.contains("Permissions Violation"), "{why}");

    // Revoked: the connection is closed within seconds, and it cannot come back.
    let revoked_at = Instant::now();
    let said = cli(&hub, &["site", "revoke", "edge-01", "--reason", "stolen cabinet"]);
    assert!(said.contains("revoked") && !said.contains(": 0 connection"), "{said}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while raw.connection_state() == async_nats::connection::State::Connected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = revoked_at.elapsed();
    assert_ne!(raw.connection_state(), async_nats::connection::State::Connected, "still connected after {took:?}");
    eprintln!("revocation: the site's connections closed {took:?} after `site revoke` was started");
    assert!(took < Duration::from_secs(5), "the revoked site stayed connected for {took:?}");
    let again = tokio::time::timeout(
        Duration::from_secs(5),
        Bus::connect_client(&hub.url, "again", &keys.access(Default::default())),
    )
    .await;
    assert!(!matches!(again, Ok(Ok(_))), "a revoked site connected again");
    // Nor may it renew with its identity.
    assert!(enrollment::renew_with_identity(&hub.url, &keys).await.is_err(), "a revoked site renewed");
    let identities = cli(&hub, &["site", "identities"]);
    assert!(identities.contains("REVOKED") && identities.contains("stolen cabinet"), "{identities}");
    drop(bus);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_gateway_gets_nothing_and_a_bootstrap_credential_can_only_ask() {
    let hub = start(&["edge-01"], "30d", "operator");
    let tmp = tempfile::tempdir().unwrap();
    let bootstrap = cli(&hub, &["site", "bootstrap"]).trim().to_string();
    let identity = Arc::new(nkeys::KeyPair::new_user());

    // With the bootstrap credential, a connection may ask to join and nothing else.
    let (raw, errors) = landfall_tests::topology::raw_client_presenting(&hub.url, &bootstrap, identity.clone()).await;
    for subject in [
        names::event_subject_from(names::Origin::Gateway, "edge-01", "node", "patched"),
        names::command_subject_from(names::Origin::Gateway, "node_added", "edge-01"),
        names::identity_renew("edge-01"),
        names::IDENTITY_ADMIN.to_string(),
        names::identity_enroll(&nkeys::KeyPair::new_user().public_key()),
        "$JS.API.INFO".to_string(),
    ] {
        raw.publish(subject.clone(), "x".into()).await.unwrap();
        raw.flush().await.unwrap();
        let why = landfall_tests::topology::refused(&errors, &subject).await;
        assert!(why.contains("Permissions Violation"), "{subject}: {why}");
    }
    // A bootstrap credential proves nothing without the key the connection claims.
    let stranger = Arc::new(nkeys::KeyPair::new_user());
    assert!(
        landfall_tests::topology::try_connect_presenting(&hub.url, "not a credential", stranger.clone()).await.is_err(),
        "garbage for a credential was let in"
    );

    let (joining, pending) = ask_to_join(&hub, &bootstrap, "edge-01", identity.clone(), tmp.path());
    tokio::time::timeout(Duration::from_secs(30), pending).await.unwrap().unwrap();
    // Through the HTTP API, as its own NATS user: a viewer sees the request, only an operator
    // decides it.
    let api_bus = connect_when_ready(&hub.url, "api", &hub.d.access(&Role::Api)).await;
    let api = landfall_tests::api::Api::start(&api_bus).await;
    let (status, listed) = api.get(landfall_tests::api::VIEWER, "/v1/enrollments").await;
    assert_eq!(status, 200, "{listed}");
    let fingerprint = bus_schema::credentials::fingerprint(&identity.public_key());
    assert_eq!(listed["enrollments"][0]["fingerprint"], fingerprint, "{listed}");
    assert_eq!(listed["enrollments"][0]["state"], "ENROLLMENT_STATE_PENDING", "{listed}");
    let deny = format!("/v1/enrollments/{fingerprint}/deny");
    let (status, _) = api.post(landfall_tests::api::VIEWER, &deny, r#"{"reason":"x"}"#, &[]).await;
    assert_eq!(status, 403, "a viewer decided a request to join");
    let (status, decided) =
        api.post(landfall_tests::api::OPERATOR, &deny, r#"{"reason":"unknown machine"}"#, &[]).await;
    assert_eq!(status, 200, "{decided}");
    assert_eq!(decided["state"], "ENROLLMENT_STATE_DENIED", "{decided}");
    let (status, again) = api.post(landfall_tests::api::OPERATOR, "/v1/sites/edge-01/revoke", "", &[]).await;
    assert_eq!(status, 404, "a site with no identity: {again}");
    let answer = tokio::time::timeout(Duration::from_secs(30), joining).await.unwrap().unwrap().unwrap();
    assert_eq!(answer.err(), Some(Asked::Denied("unknown machine".into())));
    assert!(!tmp.path().join("link.creds").exists(), "a denied gateway holds no credentials");
    let again = cli_fails(&hub, &["site", "approve", &identity.public_key()]);
    assert!(again.contains("decided already"), "{again}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn link_credentials_renew_while_connected_and_after_a_cut_longer_than_their_life() {
    // Link credentials last 6 s: the gateway renews them with a third left, and one cut off past
    // their expiry comes back through its identity credential.
    let hub = start(&["edge-01"], "6s", "registered");
    let tmp = tempfile::tempdir().unwrap();
    // The rule approves a registered site with no identity: edge-01's design is in the sites
    // bucket (written here as the orchestrator would).
    let orchestrator = connect_when_ready(&hub.url, "orchestrator", &hub.d.access(&Role::Orchestrator)).await;
    let design = pb::SiteDesign { site_id: "edge-01".into(), ..Default::default() };
    orchestrator.kv(names::SITES_BUCKET).await.unwrap().put(&keys::site("edge-01"), &design).await.unwrap();
    let bootstrap = cli(&hub, &["site", "bootstrap"]).trim().to_string();
    let identity = Arc::new(nkeys::KeyPair::new_user());
    let (joining, _) = ask_to_join(&hub, &bootstrap, "edge-01", identity.clone(), tmp.path());
    let keys = tokio::time::timeout(Duration::from_secs(30), joining).await.unwrap().unwrap().unwrap().unwrap();
    let first = keys.link_expires().unwrap();

    let bus = connect_site(&hub, &keys).await;
    let shutdown = CancellationToken::new();
    let renewing =
        tokio::spawn(enrollment::keep_renewed(hub.url.clone(), hub.url.clone(), keys.clone(), shutdown.clone()));
    // Renewed while connected, before the first expired.
    let deadline = Instant::now() + Duration::from_secs(8);
    while keys.link_expires() == Some(first) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(keys.link_expires().unwrap() > first, "the link credentials were not renewed");
    shutdown.cancel();
    let _ = renewing.await;
    drop(bus);

    // Cut off past the link credentials' life: the link key is refused, the identity renews.
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert!(keys.link_due());
    enrollment::renew_with_identity(&hub.url, &keys).await.expect("renewed with the identity after the cut");
    let back = connect_site(&hub, &keys).await;
    let reloaded = SiteKeys::load(tmp.path(), identity).unwrap().unwrap();
    assert_eq!(reloaded.link_expires(), keys.link_expires(), "the renewed credentials are on disk");

    // The site removed at the hub (as the orchestrator announces it): the identity service
    // revokes it by itself and closes its connection.
    let removed = pb::SiteRemoved { site_id: "edge-01".into(), reason: "lease ended".into(), ..Default::default() };
    let env = bus_schema::runtime::Envelope::root();
    orchestrator.publish_event(&removed, &env).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while back.client().connection_state() == async_nats::connection::State::Connected {
        assert!(Instant::now() < deadline, "a removed site stayed connected");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let identities = cli(&hub, &["site", "identities"]);
    assert!(identities.contains("REVOKED") && identities.contains("site removed"), "{identities}");
}

/// One connection attempt with `auth` made from the server's nonce.
async fn try_connect(
    url: &str,
    auth: impl Fn(Vec<u8>) -> async_nats::Auth + Send + Sync + 'static,
) -> Result<async_nats::Client, async_nats::ConnectError> {
    let auth = Arc::new(auth);
    async_nats::ConnectOptions::with_auth_callback(move |nonce| {
        let auth = auth.clone();
        async move { Ok(auth(nonce)) }
    })
    .connect(url)
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stolen_forged_and_borrowed_credentials_are_refused() {
    let hub = start(&["edge-01", "edge-02"], "30d", "operator");
    let tmp = tempfile::tempdir().unwrap();
    let bootstrap = cli(&hub, &["site", "bootstrap"]).trim().to_string();
    let identity = Arc::new(nkeys::KeyPair::new_user());
    let (joining, pending) = ask_to_join(&hub, &bootstrap, "edge-01", identity.clone(), tmp.path());
    tokio::time::timeout(Duration::from_secs(30), pending).await.unwrap().unwrap();
    cli(&hub, &["site", "approve", &identity.public_key()]);
    let keys = tokio::time::timeout(Duration::from_secs(30), joining).await.unwrap().unwrap().unwrap().unwrap();
    let (link, link_key) = keys.present().unwrap();
    let thief = Arc::new(nkeys::KeyPair::new_user());

    // The link credential copied without its key: whatever key signs, it is not the credential's.
    let (l, t) = (link.clone(), thief.clone());
    let stolen = try_connect(&hub.url, move |n| bus_schema::credentials::auth(&l, &t, &n).unwrap()).await;
    assert!(stolen.is_err(), "a link credential was used without its key");
    // A credential the thief signs himself, for his own key, as edge-01.
    let forger = nkeys::KeyPair::new_account();
    let forged = bus_schema::credentials::issue(
        &forger,
        bus_schema::credentials::Kind::Link,
        "edge-01",
        &thief.public_key(),
        0,
        Some(i64::MAX / 2),
    )
    .unwrap();
    let t = thief.clone();
    let refused = try_connect(&hub.url, move |n| bus_schema::credentials::auth(&forged, &t, &n).unwrap()).await;
    assert!(refused.is_err(), "a credential from another issuer was let in");
    // A leaf node naming edge-02 while signing with edge-01's link key.
    let k = link_key.clone();
    let borrowed = try_connect(&hub.url, move |n| {
        let mut auth = async_nats::Auth::new();
        auth.username = Some("edge-02".into());
        auth.signature = Some(k.sign(&n).unwrap());
        auth
    })
    .await;
    assert!(borrowed.is_err(), "edge-01's link key linked as edge-02");

    // The identity credential connects, to renew only.
    let id_credential = std::fs::read_to_string(tmp.path().join("identity.jwt")).unwrap();
    let (raw, errors) =
        landfall_tests::topology::raw_client_presenting(&hub.url, &id_credential, identity.clone()).await;
    let event = names::event_subject_from(names::Origin::Gateway, "edge-01", "node", "patched");
    raw.publish(event.clone(), "x".into()).await.unwrap();
    raw.flush().await.unwrap();
    let why = landfall_tests::topology::refused(&errors, &event).await;
    assert!(why.contains("Permissions Violation"), "{why}");

    // A renewal not signed by the identity key, over the site's own link.
    let site = connect_site(&hub, &keys).await;
    let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let new_link = nkeys::KeyPair::new_user().public_key();
    let signature = thief.sign(&bus_schema::credentials::renewal_message("edge-01", &new_link, at)).unwrap();
    let request = pb::RenewRequest { site_id: "edge-01".into(), link_key: new_link, at_unix_ms: at, signature };
    let answer = site
        .client()
        .request(names::identity_renew("edge-01"), prost::Message::encode_to_vec(&request).into())
        .await
        .unwrap();
    let why = answer.headers.as_ref().and_then(|h| h.get(names::headers::REPLY_ERROR)).map(|v| v.to_string());
    assert!(why.as_deref().is_some_and(|w| w.contains("not signed by the site's identity key")), "{why:?}");
    // Nor may it ask for another site's, whatever it signs.
    let (site_raw, errors) = landfall_tests::topology::raw_client_presenting(&hub.url, &link, link_key).await;
    let theirs = names::identity_renew("edge-02");
    site_raw.publish(theirs.clone(), "x".into()).await.unwrap();
    site_raw.flush().await.unwrap();
    let why = landfall_tests::topology::refused(&errors, &theirs).await;
    assert!(why.contains("Permissions Violation"), "{why}");
}
