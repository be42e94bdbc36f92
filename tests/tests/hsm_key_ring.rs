//! The hub's key ring in a PKCS#11 token (SoftHSM2), end to end: `landfall secrets hsm-init`
//! makes the key-encryption key and the ring file, and `landfall serve kubeconfig` — a process of
//! its own, with a SoftHSM2 of its own — seals and opens a site's kubeconfig and its hosts' BMC
//! credentials through a real nats-server, rotates, and starts again from the token and the ring
//! file alone. The ring file opens nothing without its token: not with another token's key of
//! the same label, not with a wrong PIN.
//!
//! SoftHSM2 reads its configuration once per process, so only the `landfall` processes load the
//! module (`SOFTHSM2_CONF` in their environment), never this test process.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use consumers::secrets::KeyRing;
use consumers::secrets::softhsm::{self, SoftHsm, write_pin_file};
use landfall_tests::cli::text;
use landfall_tests::fleet::Fleet;
use landfall_tests::nats::NatsServer;
use landfall_tests::procs::Service;
use landfall_tests::secrets::{
    ask_bmc, assert_nowhere_on_disk, capture_logs, get_kubeconfig, grant_bmc, put_bmc, rotate_key, sealed_records,
};

const PIN: &str = "hub-user-pin-4711";
const OTHER_PIN: &str = "other-user-pin-0815";

/// `landfall ARGS` to its end, with the SoftHSM2's configuration and `env` in its environment
/// (and no PKCS#11 setting of this process's).
async fn landfall(hsm: &SoftHsm, args: &[&str], env: &[(&str, &str)]) -> Output {
    let (conf_var, conf) = hsm.conf_env();
    let mut cmd = tokio::process::Command::new(landfall_tests::cli::binary());
    for (var, _) in std::env::vars_os().filter(|(v, _)| v.to_string_lossy().starts_with("LANDFALL_PKCS11_")) {
        cmd.env_remove(var);
    }
    let run = cmd.args(args).env(conf_var, conf).envs(env.iter().copied()).kill_on_drop(true).output();
    tokio::time::timeout(Duration::from_secs(60), run).await.expect("landfall ends").expect("run landfall")
}

/// The `serve kubeconfig` arguments for `token`'s key and the ring file `ring`.
fn serve_args<'a>(ring: &'a str, module: &'a str, token: &'a str) -> Vec<&'a str> {
    vec!["serve", "kubeconfig", "--secret-key-file", ring, "--pkcs11-module", module, "--pkcs11-token", token]
}

/// Waits until the service has said it is ready `times` times (its log spans its restarts).
async fn ready(service: &mut Service, times: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while service.log_text().matches("secrets service ready").count() < times {
        assert!(service.is_running(), "the secrets service stopped:\n{}", service.log_tail(40));
        assert!(tokio::time::Instant::now() < deadline, "not ready:\n{}", service.log_tail(40));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The site's kubeconfig, once the collector has stored it.
async fn kubeconfig_stored(fleet: &Fleet, site: &str) -> Vec<u8> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        match get_kubeconfig(&fleet.bus, site).await {
            Ok(k) => return k,
            Err(e) if tokio::time::Instant::now() < deadline => {
                assert!(e.starts_with("no kubeconfig stored"), "{e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("no kubeconfig within a minute: {e}"),
        }
    }
}

fn wrapped_lines(ring: &Path) -> Vec<String> {
    std::fs::read_to_string(ring).unwrap().lines().filter(|l| l.starts_with("key ")).map(String::from).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_secrets_service_seals_and_opens_under_a_ring_whose_key_encryption_key_is_in_a_token() {
    let logs = capture_logs();
    let module = softhsm::module();
    let hsm = SoftHsm::new();
    hsm.init_token("hub", PIN);
    hsm.init_token("other", OTHER_PIN);
    let (pin_file, other_pin_file) = (hsm.dir().join("hub.pin"), hsm.dir().join("other.pin"));
    write_pin_file(&pin_file, PIN);
    write_pin_file(&other_pin_file, OTHER_PIN);
    let ring: PathBuf = hsm.dir().join("ring.wrapped");
    let (ring_s, module_s) = (ring.to_str().unwrap(), module.to_str().unwrap());

    // The key-encryption key and the ring, once.
    let init = ["secrets", "hsm-init", "--secret-key-file", ring_s, "--pkcs11-module", module_s, "--pkcs11-token"];
    let hub_pin = ["--pkcs11-pin-file", pin_file.to_str().unwrap()];
    let out = landfall(&hsm, &[&init[..], &["hub"], &hub_pin].concat(), &[]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with("key-encryption key \"landfall-kek\" made in PKCS#11 token \"hub\""));
    let out = landfall(&hsm, &[&init[..], &["hub"], &hub_pin].concat(), &[]).await;
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains(&format!("key ring {ring_s} exists already")), "{}", text(&out.stderr));
    assert_eq!(wrapped_lines(&ring).len(), 1);

    // The real secrets service, its PIN from the environment, under a fleet that runs none.
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).nodes(2).without_secrets().start().await;
    let (conf_var, conf) = hsm.conf_env();
    let env = [(conf_var, conf.to_str().unwrap()), ("LANDFALL_PKCS11_PIN", PIN)];
    let mut service =
        Service::start_with_env("secrets", &server.url(), hsm.dir(), &serve_args(ring_s, module_s, "hub"), &env);
    ready(&mut service, 1).await;

    // A kubeconfig collected at install, and BMC credentials, sealed under the ring's key.
    let site = fleet.site_id(0);
    let cmd = fleet.install(&site).await;
    fleet.wait_install(&cmd).await;
    let kubeconfig = kubeconfig_stored(&fleet, &site).await;
    assert!(text(&kubeconfig).contains("kind: Config"));
    let node = fleet.sites[0].0.nodes[0].name.to_string();
    let password = format!("bmc-pw-{}", uuid::Uuid::new_v4().simple());
    let stored = put_bmc(&fleet.bus, &site, &node, "root", &password).await.unwrap();
    grant_bmc(&fleet.bus, &site, std::slice::from_ref(&node)).await;
    assert_eq!(ask_bmc(&fleet.bus, &site, &site, &node).await.unwrap().password, password);
    let records = sealed_records(&fleet.bus).await;
    assert_eq!(records.len(), 2);
    assert!(records.iter().all(|(_, s, _)| s.key_id == stored.key_id), "{records:?}");

    // The ring file holds no key a plain key ring could use, and nothing secret is on the disk.
    assert!(KeyRing::from_file(&ring).is_err(), "the ring file reads as plain keys");
    let secrets: [(&str, &[u8]); 2] = [("the BMC password", password.as_bytes()), ("the kubeconfig", &kubeconfig)];
    assert_nowhere_on_disk(&[hsm.dir(), logs], &secrets);
    assert!(!service.log_text().contains(PIN), "the PIN is logged");

    // Rotation through the service writes the new key wrapped, and retires the old one.
    let before = wrapped_lines(&ring);
    let rotated = rotate_key(&fleet.bus).await.unwrap();
    assert_eq!((rotated.retired_key_id.as_str(), rotated.records), (stored.key_id.as_str(), 2));
    let after = wrapped_lines(&ring);
    assert_eq!(after.len(), 1);
    assert_ne!(after, before);
    assert!(sealed_records(&fleet.bus).await.iter().all(|(_, s, _)| s.key_id == rotated.key_id));

    // Started again, the service has only the token and the ring file to go on: enough.
    service.kill();
    service.restart();
    ready(&mut service, 2).await;
    assert_eq!(get_kubeconfig(&fleet.bus, &site).await.unwrap(), kubeconfig);
    assert_eq!(ask_bmc(&fleet.bus, &site, &site, &node).await.unwrap().password, password);
    service.kill();

    // Another token with a key-encryption key of the same label opens nothing of this ring.
    let other_ring = hsm.dir().join("other.wrapped");
    let other_pin = ["--pkcs11-pin-file", other_pin_file.to_str().unwrap()];
    let other_init = [&init[..3], &[other_ring.to_str().unwrap()], &init[4..], &["other"], &other_pin].concat();
    let out = landfall(&hsm, &other_init, &[]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let url = [("NATS_URL", server.url())];
    let url = [(url[0].0, url[0].1.as_str())];
    let out = landfall(&hsm, &[&serve_args(ring_s, module_s, "other")[..], &other_pin].concat(), &url).await;
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains(&format!("key ring {ring_s} was wrapped under key-encryption key")), "{err}");
    assert!(err.contains("the ring belongs to another token's key"), "{err}");

    // A wrong PIN is refused, and not repeated.
    let wrong = [url[0], ("LANDFALL_PKCS11_PIN", "not-the-pin-31337")];
    let out = landfall(&hsm, &serve_args(ring_s, module_s, "hub"), &wrong).await;
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("PKCS#11 token \"hub\" refused the PIN (wrong PIN)") && !err.contains("31337"), "{err}");
    // No PIN at all says where it comes from.
    let out = landfall(&hsm, &serve_args(ring_s, module_s, "hub"), &url).await;
    assert!(text(&out.stderr).contains("pass --pkcs11-pin-file or set LANDFALL_PKCS11_PIN"), "{}", text(&out.stderr));

    // The records are as the last service left them: nothing was sealed again.
    assert!(sealed_records(&fleet.bus).await.iter().all(|(_, s, _)| s.key_id == rotated.key_id));
    fleet.stop().await;
}
