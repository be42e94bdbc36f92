//! Secrets end to end: kubeconfigs opened by the secrets service, BMC credentials stored
//! sealed and handed to a gateway only while its site runs a job, key rotation, and the keys
//! a service starts with. Nothing secret may reach a KV value, an event, a log or the disk.

use std::time::Duration;

use async_nats::jetstream::consumer::DeliverPolicy;
use bus_schema::names::{self, keys};
use bus_schema::pb::{self, BusEvent, BusMessage};
use bus_schema::runtime::Bus;
use consumers::secrets::{self, KeyProvider, KeyRing, StaticKey};
use consumers::secrets_service::{self, KeySource};
use landfall_tests::cli::text;
use landfall_tests::fleet::{Fleet, TEST_KEY_HEX};
use landfall_tests::nats::NatsServer;
use landfall_tests::secrets::{
    ask_bmc, ask_bmc_for, assert_nowhere_on_disk, bmc_job, capture_logs, contains, every_stored_message,
    get_kubeconfig, grant_bmc, key_file, landfall_with_stdin, put_bmc, rotate_key, sealed_records, write_key_file,
};
use tokio_util::sync::CancellationToken;

const OTHER_KEY_HEX: &str = "0f0e0d0c0b0a09080706050403020100f0e0d0c0b0a090807060504030201000";

/// A fleet of one site of `nodes` nodes, installed.
async fn installed(server: &NatsServer, nodes: usize) -> Fleet {
    let fleet = Fleet::builder(&server.url()).nodes(nodes).start().await;
    let cmd = fleet.install(&fleet.site_id(0)).await;
    let run = fleet.wait_install(&cmd).await;
    assert_eq!(run.terminal().delivery.type_name, pb::SiteInstalled::TYPE);
    fleet
}

fn node_names(fleet: &Fleet, i: usize) -> Vec<String> {
    fleet.sites[i].0.nodes.iter().map(|n| n.name.to_string()).collect()
}

/// Every record's revision, by key.
async fn revisions(bus: &Bus) -> Vec<(String, u64)> {
    sealed_records(bus).await.into_iter().map(|(k, _, rev)| (k, rev)).collect()
}

/// The site's lease as an install that has just begun holds it.
/// The event payloads of one type.
async fn events_of<M: BusEvent + BusMessage>(bus: &Bus) -> Vec<M> {
    let mut reader = bus.read_events(vec![M::filter()], DeliverPolicy::All).await.unwrap();
    let mut out = Vec::new();
    while let Ok(Some(e)) = tokio::time::timeout(Duration::from_millis(500), reader.next()).await {
        out.push(e.unwrap().delivery.decode::<M>().unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubeconfig_get_after_an_install_returns_the_simulated_kubeconfig() {
    capture_logs();
    let server = NatsServer::start();
    let fleet = installed(&server, 1).await;
    let site = fleet.site_id(0);
    let stored =
        consumers::kubeconfig::read_kubeconfig(&fleet.bus, fleet.keys.as_ref(), &site).await.unwrap().unwrap().to_vec();
    assert!(text(&stored).contains("kind: Config"));

    assert_eq!(get_kubeconfig(&fleet.bus, &site).await.unwrap(), stored);
    let out = landfall_with_stdin(&server.url(), &["kubeconfig", "get", &site], b"", capture_logs()).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(out.stdout, stored, "the CLI prints the kubeconfig as stored");

    let none = get_kubeconfig(&fleet.bus, "edge-09").await.unwrap_err();
    assert_eq!(none, "no kubeconfig stored for site edge-09");
    let bad = get_kubeconfig(&fleet.bus, "Not A Site").await.unwrap_err();
    assert!(bad.starts_with("site_id:"), "{bad}");
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_secrets_service_the_cli_says_what_to_start() {
    capture_logs();
    let server = NatsServer::start();
    let out = landfall_with_stdin(&server.url(), &["kubeconfig", "get", "edge-01"], b"", capture_logs()).await;
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains(&format!("no secrets service answered on {}", names::KUBECONFIG_GET_ADMIN)), "{err}");
    assert!(err.contains("is `landfall serve kubeconfig` (or `landfall up`) running?"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotate_key_reseals_every_record_and_retires_the_old_key() {
    capture_logs();
    let server = NatsServer::start();
    let fleet = installed(&server, 3).await;
    let site = fleet.site_id(0);
    let nodes = node_names(&fleet, 0);
    for node in &nodes {
        put_bmc(&fleet.bus, &site, node, "admin", &format!("pw-of-{node}")).await.unwrap();
    }
    let kubeconfig = get_kubeconfig(&fleet.bus, &site).await.unwrap();
    let old = StaticKey::from_hex(TEST_KEY_HEX, "test").unwrap().id().to_string();
    let before = sealed_records(&fleet.bus).await;
    assert_eq!(before.len(), 1 + nodes.len());
    assert!(before.iter().all(|(_, s, _)| s.key_id == old));

    let out = landfall_with_stdin(&server.url(), &["kubeconfig", "rotate-key"], b"", capture_logs()).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let new = fleet.keys.current().0;
    assert_ne!(new, old);
    assert_eq!(text(&out.stdout).trim(), format!("data key {old} → {new}: {} record(s) sealed again", before.len()));

    // Every record is sealed under the new key, written with compare-and-set over the old one.
    let after = sealed_records(&fleet.bus).await;
    assert_eq!(after.len(), before.len());
    for ((key, sealed, rev), (key0, _, rev0)) in after.iter().zip(&before) {
        assert_eq!(key, key0);
        assert_eq!(sealed.key_id, new, "{key}");
        assert!(rev > rev0, "{key} was written again");
    }
    // The key file holds the new key only.
    let file = std::fs::read_to_string(key_file(&fleet)).unwrap();
    assert!(!file.contains(TEST_KEY_HEX), "the old key is gone from the file");
    let reread = KeyRing::from_file(&key_file(&fleet)).unwrap();
    assert_eq!(reread.key_ids(), vec![new.clone()]);
    // Everything opens, with the file as it is now.
    assert_eq!(get_kubeconfig(&fleet.bus, &site).await.unwrap(), kubeconfig);
    for (key, sealed, _) in &after {
        if let Some(node) = key.strip_prefix(&format!("{}{site}.", keys::BMC_PREFIX)) {
            let plain = secrets::open(&reread, &secrets_service::bmc_purpose(&site, node), &sealed.clone()).unwrap();
            let creds: pb::BmcCredentials = prost::Message::decode(plain.as_slice()).unwrap();
            assert_eq!(creds.password, format!("pw-of-{node}"));
        }
    }
    let rotated = events_of::<pb::SecretKeyRotated>(&fleet.bus).await;
    assert_eq!(rotated.len(), 1);
    assert_eq!((rotated[0].retired_key_id.as_str(), rotated[0].key_id.as_str()), (old.as_str(), new.as_str()));
    assert_eq!(rotated[0].records as usize, before.len());

    // A second rotation moves on to yet another key.
    let again = rotate_key(&fleet.bus).await.unwrap();
    assert_eq!(again.retired_key_id, new);
    assert_eq!(again.records as usize, before.len());
    assert_eq!(get_kubeconfig(&fleet.bus, &site).await.unwrap(), kubeconfig);
    fleet.stop().await;
}

/// A rotation that stopped after adding its key (the process died) left both keys in the file,
/// so every record still opens; the next rotation finishes it with that key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotation_cut_short_leaves_every_record_openable_and_the_next_one_finishes_it() {
    capture_logs();
    let server = NatsServer::start();
    let fleet = installed(&server, 2).await;
    let site = fleet.site_id(0);
    let node = node_names(&fleet, 0).remove(0);
    put_bmc(&fleet.bus, &site, &node, "admin", "pw-cut-short").await.unwrap();
    let kubeconfig = get_kubeconfig(&fleet.bus, &site).await.unwrap();

    // As if the process had died right after adding the key: another ring rewrites the file.
    let elsewhere = KeyRing::from_file(&key_file(&fleet)).unwrap();
    let added = elsewhere.rotate().unwrap();
    assert_eq!(KeyRing::from_file(&key_file(&fleet)).unwrap().key_ids().len(), 2);
    assert_eq!(get_kubeconfig(&fleet.bus, &site).await.unwrap(), kubeconfig, "records under the old key open");

    let done = rotate_key(&fleet.bus).await.unwrap();
    assert_eq!(done.key_id, added, "the rotation under way is finished, not a new one started");
    assert_eq!(done.records, 2);
    assert!(sealed_records(&fleet.bus).await.iter().all(|(_, s, _)| s.key_id == added));
    assert_eq!(KeyRing::from_file(&key_file(&fleet)).unwrap().key_ids(), vec![added]);
    assert_eq!(get_kubeconfig(&fleet.bus, &site).await.unwrap(), kubeconfig);
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_is_refused_and_writes_nothing_when_a_record_is_under_an_unknown_key() {
    capture_logs();
    let server = NatsServer::start();
    let fleet = installed(&server, 1).await;
    let site = fleet.site_id(0);
    let node = node_names(&fleet, 0).remove(0);
    // A record sealed under a key the service does not hold (written behind its back).
    let stranger = StaticKey::from_hex(OTHER_KEY_HEX, "elsewhere").unwrap();
    let sealed = secrets::seal(&stranger, &secrets_service::bmc_purpose(&site, &node), b"x").unwrap();
    let store = fleet.bus.kv(names::KUBECONFIGS_BUCKET).await.unwrap();
    store.put(&keys::bmc_credentials(&site, &node), &sealed).await.unwrap();
    let before = revisions(&fleet.bus).await;
    let file_before = std::fs::read(key_file(&fleet)).unwrap();

    let err = rotate_key(&fleet.bus).await.unwrap_err();
    assert!(err.starts_with("rotation refused, nothing written: 1 sealed record(s)"), "{err}");
    assert!(err.contains(stranger.id()), "names the key: {err}");
    assert_eq!(revisions(&fleet.bus).await, before, "no record written");
    assert_eq!(std::fs::read(key_file(&fleet)).unwrap(), file_before, "the key file is unchanged");
    assert!(events_of::<pb::SecretKeyRotated>(&fleet.bus).await.is_empty());

    // Reading that record says which key it needs.
    grant_bmc(&fleet.bus, &site, std::slice::from_ref(&node)).await;
    let err = ask_bmc(&fleet.bus, &site, &site, &node).await.unwrap_err();
    assert!(err.contains(&format!("sealed under key {}", stranger.id())), "{err}");
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_with_the_wrong_key_file_refuses_to_start_and_changes_nothing() {
    capture_logs();
    let server = NatsServer::start();
    let fleet = installed(&server, 1).await;
    let needed = fleet.keys.current().0;
    let before = revisions(&fleet.bus).await;
    let dir = tempfile::tempdir().unwrap();
    let wrong = dir.path().join("wrong.key");
    write_key_file(&wrong, OTHER_KEY_HEX);
    let wrong_file = std::fs::read(&wrong).unwrap();
    let ring = std::sync::Arc::new(KeyRing::from_file(&wrong).unwrap());

    let bus = Bus::connect(&server.url(), "wrong-key").await.unwrap();
    let started = tokio::time::timeout(
        Duration::from_secs(20),
        secrets_service::run_secrets(bus.clone(), ring.clone(), CancellationToken::new()),
    )
    .await
    .expect("it stops at once");
    let err = format!("{:#}", started.unwrap_err());
    let expected = format!("1 sealed record(s) in {} need key(s) {needed}", names::KUBECONFIGS_BUCKET);
    assert!(err.contains(&expected), "{err}");
    assert!(err.contains(&format!("key file {}", wrong.display())), "{err}");
    let collector = consumers::run_kubeconfig(bus.clone(), ring.clone(), CancellationToken::new()).await;
    assert!(format!("{:#}", collector.unwrap_err()).contains(&expected));

    // The real CLI says the same and exits.
    let url = server.url();
    let args = ["serve", "kubeconfig", "--secret-key-file", wrong.to_str().unwrap()];
    let out = tokio::time::timeout(Duration::from_secs(30), landfall_with_stdin(&url, &args, b"", capture_logs()))
        .await
        .expect("serve kubeconfig exits");
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains(&expected), "{}", text(&out.stderr));

    assert_eq!(revisions(&fleet.bus).await, before, "no record written");
    assert_eq!(std::fs::read(&wrong).unwrap(), wrong_file, "the key file is unchanged");

    // A key file others may read is refused before anything else, with the fix.
    let open = dir.path().join("open.key");
    write_key_file(&open, TEST_KEY_HEX);
    std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let args = ["serve", "kubeconfig", "--secret-key-file", open.to_str().unwrap()];
    let out = tokio::time::timeout(Duration::from_secs(30), landfall_with_stdin(&url, &args, b"", capture_logs()))
        .await
        .expect("serve kubeconfig exits");
    assert!(!out.status.success());
    let fix =
        format!("others may read or write it (mode 644); make it the owner's alone: chmod 600 {}", open.display());
    assert!(text(&out.stderr).contains(&fix), "{}", text(&out.stderr));
    // And no key on the command line, where every process of the machine can read it.
    let args = ["serve", "kubeconfig", "--secret-key", TEST_KEY_HEX];
    let out = tokio::time::timeout(Duration::from_secs(30), landfall_with_stdin(&url, &args, b"", capture_logs()))
        .await
        .expect("serve kubeconfig exits");
    assert!(!out.status.success(), "a key on the command line is refused");
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_key_file_with_records_present_is_an_error_and_no_key_is_created() {
    capture_logs();
    let server = NatsServer::start();
    let fleet = installed(&server, 1).await;
    let needed = fleet.keys.current().0;
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("data").join("secret.key");
    for source in [KeySource::CreateFile(missing.clone()), KeySource::File(missing.clone())] {
        let err = secrets_service::open_key_ring(&fleet.bus, source).await.unwrap_err();
        let text = format!("{:#}", anyhow::Error::from(err));
        assert!(text.contains(&format!("key file {} does not exist", missing.display())), "{text}");
        assert!(text.contains(&format!("1 sealed record(s) need key(s) {needed}")), "{text}");
        assert!(text.contains("no key was created"), "{text}");
        assert!(!missing.exists(), "no key file was created");
    }
    // With no record stored, `landfall up` creates its key file.
    let empty = NatsServer::start();
    let bus = Bus::connect(&empty.url(), "fresh").await.unwrap();
    bus.ensure_topology(&Default::default()).await.unwrap();
    let ring = secrets_service::open_key_ring(&bus, KeySource::CreateFile(missing.clone())).await.unwrap();
    assert!(missing.exists());
    assert_eq!(ring.key_ids().len(), 1);
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bmc_set_stores_only_ciphertext() {
    capture_logs();
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).nodes(2).start().await;
    let site = fleet.site_id(0);
    let node = node_names(&fleet, 0).remove(0);
    let password = format!("bmc-pw-{}", uuid::Uuid::new_v4().simple());

    let args = ["bmc", "set", &site, &node, "--username", "root", "--password-stdin"];
    let out = landfall_with_stdin(&server.url(), &args, format!("{password}\n").as_bytes(), capture_logs()).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(said.starts_with(&format!("BMC credentials of node {node} at site {site} stored")), "{said}");
    assert!(!said.contains(&password));

    // Only ciphertext is stored, under the node's key, and it opens to what was given.
    let records = sealed_records(&fleet.bus).await;
    let (key, sealed, _) = &records[0];
    assert_eq!((records.len(), key.as_str()), (1, keys::bmc_credentials(&site, &node).as_str()));
    let plain = secrets::open(fleet.keys.as_ref(), &secrets_service::bmc_purpose(&site, &node), sealed).unwrap();
    let creds: pb::BmcCredentials = prost::Message::decode(plain.as_slice()).unwrap();
    assert_eq!((creds.username.as_str(), creds.password.as_str()), ("root", password.as_str()));
    // The event says what was stored, and carries no secret.
    let stored = events_of::<pb::BmcCredentialsStored>(&fleet.bus).await;
    assert_eq!(stored.len(), 1);
    assert_eq!((stored[0].site_id.as_str(), stored[0].node.as_str()), (site.as_str(), node.as_str()));
    assert_eq!(stored[0].key_id, fleet.keys.current().0);
    // Nowhere in any stream (KV values with their history, commands, jobs, events).
    let messages = every_stored_message(&fleet.bus).await;
    assert!(messages.iter().any(|(stream, _, _)| stream == &format!("KV_{}", names::KUBECONFIGS_BUCKET)));
    for (stream, seq, bytes) in &messages {
        assert!(!contains(bytes, password.as_bytes()), "the password is in {stream} #{seq}");
    }

    // What is refused: an empty password, an unknown site, a bad node name.
    let err = put_bmc(&fleet.bus, &site, &node, "root", "").await.unwrap_err();
    assert!(err.starts_with("credentials.password must be"), "{err}");
    let err = put_bmc(&fleet.bus, &site, &node, "", "pw").await.unwrap_err();
    assert!(err.starts_with("credentials.username must be"), "{err}");
    let err = put_bmc(&fleet.bus, "edge-77", &node, "root", "pw").await.unwrap_err();
    assert_eq!(err, "site edge-77 is not registered");
    let err = put_bmc(&fleet.bus, &site, "Node 1", "root", "pw").await.unwrap_err();
    assert!(err.starts_with("node: name:"), "{err}");
    let out =
        landfall_with_stdin(&server.url(), &["bmc", "set", &site, &node, "--username", "root"], b"", capture_logs())
            .await;
    assert!(!out.status.success(), "a password is required");
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_gets_bmc_credentials_during_an_install() {
    capture_logs();
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).nodes(3).start().await;
    let site = fleet.site_id(0);
    let nodes = node_names(&fleet, 0);
    for node in &nodes[..2] {
        put_bmc(&fleet.bus, &site, node, "admin", &format!("pw-{node}")).await.unwrap();
    }
    let cmd = fleet.install(&site).await;
    let run = fleet.wait_install(&cmd).await;
    assert_eq!(run.terminal().delivery.type_name, pb::SiteInstalled::TYPE);
    let effects = fleet.backend(0).effects();
    assert_eq!(effects.bmc_logins, 2, "one BMC login per node with credentials");
    assert_eq!(effects.provisions.len(), 3, "the node without credentials is provisioned too");
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bmc_credentials_go_only_to_the_job_that_drives_the_host_while_it_does() {
    capture_logs();
    // The refusals a gateway reads as "no credentials" are the ones the service gives.
    assert_eq!(site_gateway::credentials::NONE_STORED, secrets_service::NO_BMC_CREDENTIALS);
    assert_eq!(site_gateway::credentials::NO_JOB, secrets_service::NO_BMC_JOB);
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(2).nodes(2).start().await;
    let (site, other) = (fleet.site_id(0), fleet.site_id(1));
    let nodes = node_names(&fleet, 0);
    put_bmc(&fleet.bus, &site, &nodes[0], "admin", "pw-lease").await.unwrap();
    let job = bmc_job(&nodes[0]);

    // No job the hub sent drives the host: refused, and a gateway (with a job redelivered after
    // its saga ended) goes on without credentials.
    let err = ask_bmc(&fleet.bus, &site, &site, &nodes[0]).await.unwrap_err();
    assert_eq!(
        err,
        format!(
            "no job drives the BMCs of site {site} for node {}: no install or join saga \"saga-granting\"",
            nodes[0]
        )
    );
    let refused = site_gateway::credentials::bmc_credentials(&fleet.bus, &site, &nodes[0], &job).await.unwrap();
    assert!(refused.is_none());

    grant_bmc(&fleet.bus, &site, &nodes).await;
    let creds = ask_bmc(&fleet.bus, &site, &site, &nodes[0]).await.unwrap();
    assert_eq!((creds.username.as_str(), creds.password.as_str()), ("admin", "pw-lease"));
    let got = site_gateway::credentials::bmc_credentials(&fleet.bus, &site, &nodes[0], &job).await.unwrap();
    assert_eq!(got.map(|c| (c.username, c.password)), Some(("admin".to_string(), "pw-lease".to_string())));
    // Another node's job, a job the saga never sent, another site's saga: nothing.
    let err = ask_bmc_for(&fleet.bus, &site, &site, &nodes[0], &bmc_job(&nodes[1])).await.unwrap_err();
    assert!(err.contains(&format!("sent no job provision-{} provisioning node {}", nodes[1], nodes[0])), "{err}");
    let forged = bus_schema::envelope::Envelope { id: "made-up".into(), ..job.clone() };
    let err = ask_bmc_for(&fleet.bus, &site, &site, &nodes[0], &forged).await.unwrap_err();
    assert!(err.starts_with(secrets_service::NO_BMC_JOB), "{err}");
    let other_nodes = node_names(&fleet, 1);
    put_bmc(&fleet.bus, &other, &other_nodes[0], "admin", "pw-other").await.unwrap();
    let err = ask_bmc_for(&fleet.bus, &other, &other, &other_nodes[0], &bmc_job(&other_nodes[0])).await.unwrap_err();
    assert!(err.contains(&format!("is not site {other}'s")), "{err}");
    // A node with none stored: the gateway drives it without credentials.
    let err = ask_bmc(&fleet.bus, &site, &site, &nodes[1]).await.unwrap_err();
    assert_eq!(err, format!("no BMC credentials stored for node {} of site {site}", nodes[1]));
    let none =
        site_gateway::credentials::bmc_credentials(&fleet.bus, &site, &nodes[1], &bmc_job(&nodes[1])).await.unwrap();
    assert!(none.is_none());
    // Not in the site's design.
    let err = ask_bmc(&fleet.bus, &site, &site, "node-99").await.unwrap_err();
    assert_eq!(err, format!("node node-99 is not in the design of site {site}"));
    // Another site's subject asking for this site's host.
    let err = ask_bmc(&fleet.bus, &other, &site, &nodes[0]).await.unwrap_err();
    assert_eq!(
        err,
        format!(
            "landfall.v1.BmcCredentialsRequest on landfall.svc.{other}.bmc_credentials speaks for site {other} only, \
             and its site_id names {site:?}"
        )
    );
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_plaintext_on_disk() {
    let logs = capture_logs();
    let server = NatsServer::start();
    // Real artifacts, so the artifact store and the site's cache hold files to scan too.
    let mut fleet = Fleet::builder(&server.url()).nodes(2).with_artifacts().start().await;
    // Kept past the fleet's stop: the artifact store, the site caches, the key file.
    let fleet_dir = std::mem::replace(&mut fleet.dir, tempfile::tempdir().unwrap());
    let url = server.url();
    let site = fleet.site_id(0);
    let password = format!("bmc-pw-{}", uuid::Uuid::new_v4().simple());
    for node in node_names(&fleet, 0) {
        let args = ["bmc", "set", &site, &node, "--username", "admin", "--password-stdin"];
        let out = landfall_with_stdin(&url, &args, password.as_bytes(), logs).await;
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let cmd = fleet.install(&site).await;
    let run = fleet.wait_install(&cmd).await;
    assert_eq!(run.terminal().delivery.type_name, pb::SiteInstalled::TYPE);
    assert_eq!(fleet.backend(0).effects().bmc_logins, 2);

    let out = landfall_with_stdin(&url, &["kubeconfig", "get", &site], b"", logs).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let kubeconfig = out.stdout;
    let out = landfall_with_stdin(&url, &["kubeconfig", "rotate-key"], b"", logs).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    fleet.stop().await;

    let kc = text(&kubeconfig);
    let token = kc.lines().find_map(|l| l.trim().strip_prefix("token: ")).expect("a token in the kubeconfig");
    let ca = kc.lines().find_map(|l| l.trim().strip_prefix("certificate-authority-data: ")).expect("a CA");
    let needles: [(&str, &[u8]); 4] = [
        ("the kubeconfig", &kubeconfig[kubeconfig.len() / 2..kubeconfig.len() / 2 + 40]),
        ("the kubeconfig's token", token.as_bytes()),
        ("the kubeconfig's CA", &ca.as_bytes()[ca.len() / 2..ca.len() / 2 + 48]),
        ("the BMC password", password.as_bytes()),
    ];
    // The nats-server's directory (its JetStream store and its log), the artifact store, the
    // site's artifact cache, and every log written.
    let server_dir = server.store_dir().parent().expect("the server's directory");
    assert!(std::fs::read_dir(logs).unwrap().count() >= 4, "the CLI's logs are there");
    let staged = fleet_dir.path().join("caches").join(&site).join("sha256");
    assert_eq!(std::fs::read_dir(&staged).unwrap().count(), 5, "the site's cache holds the artifacts");
    assert_nowhere_on_disk(&[server_dir, logs, fleet_dir.path()], &needles);
}
