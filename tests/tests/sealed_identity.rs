//! A site gateway's identity sealed in a TPM, on software TPMs (one or two per test) and a
//! real nats-server: the key is unsealed on the TPM that sealed it and nowhere else, a copy of
//! the identity directory is no copy of the key, the unsealed key is the NATS user the hub
//! lists, and the real `landfall-gateway` connects with it (or, with a key file, warns).
//!
//! Needs `$LANDFALL_SWTPM` and tpm2-tools (`scripts/ensure-tpm`; `scripts/test` sets it).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use bus_schema::runtime::{Access, Bus};
use landfall_tests::nats::NatsServer;
use landfall_tests::swtpm::SoftwareTpm;
use producers::embedded::tied;
use site_gateway::identity::{Identity, IdentityError, TpmChoice};

const GATEWAY: &str = env!("CARGO_BIN_EXE_landfall-gateway-cli");

/// `landfall-gateway ARGS`, its environment cleared of what would change it, temporary files
/// under `tmp`.
fn gateway_command(args: &[&str], tmp: &Path) -> Command {
    let mut command = Command::new(GATEWAY);
    command.args(args).env("TMPDIR", tmp).env("RUST_LOG", "info").stdin(Stdio::null());
    for var in ["LANDFALL_IDENTITY_DIR", "LANDFALL_TPM", "LANDFALL_NATS_NKEY_FILE", "NATS_URL", "LANDFALL_LOG_FORMAT"] {
        command.env_remove(var);
    }
    command
}

fn run(args: &[&str], tmp: &Path) -> Output {
    gateway_command(args, tmp).output().expect("run landfall-gateway")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

/// Every seed the file could be read as: the file whole, each line, each word, and any run of
/// 58 characters that starts with `S` (an encoded seed's length), anywhere in its bytes.
fn seeds_in(bytes: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(bytes);
    let mut candidates: Vec<String> = vec![text.trim().to_string()];
    candidates.extend(text.lines().map(|l| l.trim().to_string()));
    candidates.extend(text.split_whitespace().map(String::from));
    let chars: Vec<char> = text.chars().collect();
    for (i, c) in chars.iter().enumerate() {
        if *c == 'S' && i + 58 <= chars.len() {
            candidates.push(chars[i..i + 58].iter().collect());
        }
    }
    candidates.into_iter().filter(|c| nkeys::KeyPair::from_seed(c).is_ok()).collect()
}

/// Copies the files of an identity directory into a new one (as a copied disk would).
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

/// A nats-server whose only user is this public key.
fn server_for(public_key: &str, dir: &Path) -> NatsServer {
    let conf = dir.join("nats.conf");
    std::fs::write(&conf, format!("authorization {{\n  users: [ {{ nkey: {public_key:?} }} ]\n}}\n")).unwrap();
    NatsServer::start_with(&["-c", path(&conf)])
}

/// The real gateway for a site over a simulated site, as its identity; its stderr in `log`.
fn start_gateway(url: &str, identity: &[&str], dir: &Path) -> (Child, PathBuf) {
    let log = dir.join("gateway.log");
    let mut args = vec!["--site", "edge-01", "--backend", "sim", "--nats-url", url, "--cache-dir"];
    let cache = dir.join("cache");
    args.push(path(&cache));
    args.extend_from_slice(identity);
    let mut command = tied::command(GATEWAY);
    command
        .args(args)
        .env("TMPDIR", dir)
        .env("RUST_LOG", "info")
        .env_remove("LANDFALL_IDENTITY_DIR")
        .env_remove("LANDFALL_TPM")
        .env_remove("LANDFALL_NATS_NKEY_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    (tied::spawn(command).expect("start landfall-gateway"), log)
}

/// Waits until the gateway's log has `line`, or it exits; returns the log and whether it runs.
fn wait_for(child: &mut Child, log: &Path, line: &str) -> (String, bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let running = matches!(child.try_wait(), Ok(None));
        if text.contains(line) || !running || Instant::now() > deadline {
            return (text, running);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn stop(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn a_sealed_identity_loads_on_its_tpm_and_no_file_holds_the_seed() {
    let tpm = SoftwareTpm::start();
    let dir = tempfile::tempdir().unwrap();
    let id = dir.path().join("identity");
    let made = Identity::init(&id, &tpm.choice()).unwrap();
    assert!(made.sealed());
    let loaded = Identity::load(&id, &tpm.choice()).unwrap();
    assert_eq!(loaded.public_key(), made.public_key());
    assert_eq!(loaded.fingerprint(), made.fingerprint());
    assert!(loaded.sealed());
    let signature = loaded.sign(b"site edge-01").unwrap();
    nkeys::KeyPair::from_public_key(made.public_key()).unwrap().verify(b"site edge-01", &signature).unwrap();

    // The seed, as the connection gets it, is nowhere on disk: not as text, not as any seed.
    let seed = loaded.nats_access(Access::default()).nkey_seed.unwrap();
    let (_, raw) = nkeys::decode_seed(&seed).unwrap();
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&id).unwrap() {
        let entry = entry.unwrap();
        let bytes = std::fs::read(entry.path()).unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        assert!(!text(&bytes).contains(&seed), "{name} holds the seed");
        assert!(!bytes.windows(raw.len()).any(|w| w == raw), "{name} holds the seed's bytes");
        assert_eq!(seeds_in(&bytes), Vec::<String>::new(), "{name} holds a seed");
        names.push(name);
    }
    names.sort();
    assert_eq!(names, ["identity.json", "identity.pub.nkey", "seed.sealed.priv", "seed.sealed.pub"]);
    assert_eq!(std::fs::read_to_string(id.join("identity.pub.nkey")).unwrap().trim(), made.public_key());
    // The check can fail: a file identity's directory does hold the seed.
    let file_id = dir.path().join("file");
    Identity::init(&file_id, &TpmChoice::None).unwrap();
    assert!(!seeds_in(&std::fs::read(file_id.join("seed.nkey")).unwrap()).is_empty());
}

#[test]
fn a_copy_on_another_tpm_is_refused_and_the_gateway_does_not_connect() {
    let (a, b) = (SoftwareTpm::start(), SoftwareTpm::start());
    let dir = tempfile::tempdir().unwrap();
    let id = dir.path().join("identity");
    let made = Identity::init(&id, &a.choice()).unwrap();
    let copy = dir.path().join("copied-disk");
    copy_dir(&id, &copy);

    let err = Identity::load(&copy, &b.choice()).unwrap_err();
    assert!(matches!(err, IdentityError::OtherTpm), "{err:?}");
    assert!(err.to_string().contains("sealed to another TPM: this identity cannot be used on this machine"), "{err}");
    // On the TPM it was sealed to, the copy is the identity.
    assert_eq!(Identity::load(&copy, &a.choice()).unwrap().public_key(), made.public_key());

    let shown = run(&["identity", "show", "--identity-dir", path(&copy), "--tpm", &b.tcti()], dir.path());
    assert!(!shown.status.success());
    assert!(text(&shown.stderr).contains("sealed to another TPM"), "{}", text(&shown.stderr));
    assert!(!text(&shown.stdout).contains(made.public_key()), "{}", text(&shown.stdout));

    // The hub lists the key; the gateway on the other machine still cannot connect as it.
    let server = server_for(made.public_key(), dir.path());
    let (mut gateway, log) =
        start_gateway(&server.url(), &["--identity-dir", path(&copy), "--tpm", &b.tcti()], dir.path());
    let (log, running) = wait_for(&mut gateway, &log, "nats connected");
    assert!(!running, "the gateway runs with an identity sealed to another TPM: {log}");
    assert!(!log.contains("nats connected"), "{log}");
    assert!(log.contains("sealed to another TPM"), "{log}");
    stop(gateway);
}

#[tokio::test]
async fn the_unsealed_key_is_the_nats_user_and_another_key_is_refused() {
    let tpm = SoftwareTpm::start();
    let dir = tempfile::tempdir().unwrap();
    let id = dir.path().join("identity");
    let identity = Identity::init(&id, &tpm.choice()).unwrap();
    let server = server_for(identity.public_key(), dir.path());

    let loaded = Identity::load(&id, &tpm.choice()).unwrap();
    let bus = Bus::connect_client(&server.url(), "sealed-identity-test", &loaded.nats_access(Access::default()))
        .await
        .expect("the unsealed identity is a user of the server");
    bus.client().flush().await.unwrap();

    let stranger = Access { nkey_seed: Some(nkeys::KeyPair::new_user().seed().unwrap()), ..Access::default() };
    let refused = Bus::connect_client(&server.url(), "sealed-identity-test", &stranger).await;
    let err = refused.err().expect("a key the server does not list is refused");
    let err = bus_schema::runtime::error_chain(&err);
    assert!(err.to_lowercase().contains("authorization"), "{err}");
    let anonymous = Bus::connect_client(&server.url(), "sealed-identity-test", &Access::default()).await;
    assert!(anonymous.is_err(), "an anonymous connection is accepted");

    // The real gateway unseals it and connects; it leaves no temporary file behind.
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let (mut gateway, log) = start_gateway(&server.url(), &["--identity-dir", path(&id), "--tpm", &tpm.tcti()], &tmp);
    let (log, running) = wait_for(&mut gateway, &log, "nats connected");
    stop(gateway);
    assert!(running && log.contains("nats connected"), "{log}");
    assert!(log.contains("identity unsealed by the TPM"), "{log}");
    assert!(!log.contains("identity key is a file"), "{log}");
    let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.iter().all(|n| !n.to_string_lossy().starts_with("landfall-tpm-")), "left behind: {left:?}");
}

#[tokio::test]
async fn a_key_file_identity_works_and_the_gateway_warns() {
    let dir = tempfile::tempdir().unwrap();
    let id = dir.path().join("identity");
    let made = run(&["identity", "init", "--identity-dir", path(&id), "--tpm", "none"], dir.path());
    assert!(made.status.success(), "{}", text(&made.stderr));
    let stdout = text(&made.stdout);
    assert!(stdout.contains("sealed:      no"), "{stdout}");
    assert!(text(&made.stderr).contains("identity key is a file"), "{}", text(&made.stderr));
    let public_key = stdout.lines().find_map(|l| l.strip_prefix("public key:")).unwrap().trim().to_string();
    assert_eq!(Identity::load(&id, &TpmChoice::None).unwrap().public_key(), public_key);

    let server = server_for(&public_key, dir.path());
    let (mut gateway, log) = start_gateway(&server.url(), &["--identity-dir", path(&id), "--tpm", "none"], dir.path());
    let (log, running) = wait_for(&mut gateway, &log, "nats connected");
    stop(gateway);
    assert!(running && log.contains("nats connected"), "{log}");
    assert!(log.contains("the gateway's identity key is a file: anyone with a copy of this disk has it"), "{log}");
}

#[test]
fn the_identity_commands_say_what_is_wrong() {
    let (a, b) = (SoftwareTpm::start(), SoftwareTpm::start());
    let dir = tempfile::tempdir().unwrap();
    let id = dir.path().join("identity");
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let id_arg = path(&id);

    let made = run(&["identity", "init", "--identity-dir", id_arg, "--tpm", &a.tcti()], &tmp);
    assert!(made.status.success(), "{}", text(&made.stderr));
    let stdout = text(&made.stdout);
    assert!(stdout.contains(&format!("sealed:      yes, to the TPM at {}", a.tcti())), "{stdout}");
    assert!(!text(&made.stderr).contains("identity key is a file"), "{}", text(&made.stderr));
    let shown = run(&["identity", "show", "--identity-dir", id_arg, "--tpm", &a.tcti()], &tmp);
    assert!(shown.status.success(), "{}", text(&shown.stderr));
    assert_eq!(text(&shown.stdout), stdout);
    assert_eq!(std::fs::read_dir(&tmp).unwrap().count(), 0, "the TPM's contexts are left behind");

    let again = run(&["identity", "init", "--identity-dir", id_arg, "--tpm", &a.tcti()], &tmp);
    assert!(!again.status.success());
    assert!(text(&again.stderr).contains("holds an identity already"), "{}", text(&again.stderr));
    assert_eq!(text(&run(&["identity", "show", "--identity-dir", id_arg, "--tpm", &a.tcti()], &tmp).stdout), stdout);

    let cases: Vec<(Vec<String>, Option<&str>, &str)> = vec![
        (vec!["--tpm".into(), "none".into()], None, "sealed to a TPM, and no TPM was given"),
        (vec!["--tpm".into(), b.tcti()], None, "sealed to another TPM"),
        (vec!["--tpm".into(), "swtpm:host=127.0.0.1,port=1".into()], None, "cannot be reached"),
        (vec!["--tpm".into(), a.tcti()], Some(""), "tpm2_createprimary is not installed"),
        (vec!["--tpm".into(), "bogus".into()], None, "give auto, none or a TCTI"),
    ];
    for (tpm, path_var, says) in cases {
        let mut command = gateway_command(&["identity", "show", "--identity-dir", id_arg], &tmp);
        command.args(&tpm);
        if let Some(p) = path_var {
            command.env("PATH", p);
        }
        let out = command.output().unwrap();
        assert!(!out.status.success(), "{tpm:?}: {}", text(&out.stdout));
        assert!(text(&out.stderr).contains(says), "{tpm:?}: {}", text(&out.stderr));
        assert!(!text(&out.stderr).contains("panicked"), "{tpm:?}: {}", text(&out.stderr));
    }

    let file_id = dir.path().join("file-identity");
    Identity::init(&file_id, &TpmChoice::None).unwrap();
    let out = run(&["identity", "show", "--identity-dir", path(&file_id), "--tpm", &a.tcti()], &tmp);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("a key file, made without a TPM"), "{}", text(&out.stderr));
}

#[test]
fn corrupt_blobs_are_named_as_corrupt() {
    let tpm = SoftwareTpm::start();
    let dir = tempfile::tempdir().unwrap();
    let id = dir.path().join("identity");
    Identity::init(&id, &tpm.choice()).unwrap();

    for (n, (file, damage)) in [
        ("seed.sealed.priv", (|b: &mut Vec<u8>| b[40] ^= 0x01) as fn(&mut Vec<u8>)),
        ("seed.sealed.pub", |b: &mut Vec<u8>| b.truncate(10)),
        ("seed.sealed.priv", |b: &mut Vec<u8>| b.clear()),
    ]
    .into_iter()
    .enumerate()
    {
        let copy = dir.path().join(format!("damaged-{n}"));
        copy_dir(&id, &copy);
        let mut bytes = std::fs::read(copy.join(file)).unwrap();
        damage(&mut bytes);
        std::fs::write(copy.join(file), bytes).unwrap();
        let err = Identity::load(&copy, &tpm.choice()).unwrap_err();
        assert!(matches!(err, IdentityError::Corrupt { .. }), "{file}: {err:?}");
        assert!(err.to_string().contains("the identity directory is corrupt"), "{file}: {err}");
        assert!(err.to_string().contains("not what was sealed"), "{file}: {err}");
    }

    let gone = dir.path().join("blob-gone");
    copy_dir(&id, &gone);
    std::fs::remove_file(gone.join("seed.sealed.priv")).unwrap();
    let err = Identity::load(&gone, &tpm.choice()).unwrap_err();
    assert!(err.to_string().contains("seed.sealed.priv is missing"), "{err}");
    // The undamaged original still loads.
    Identity::load(&id, &tpm.choice()).unwrap();
}
