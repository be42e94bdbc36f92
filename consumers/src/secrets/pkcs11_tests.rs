//! The PKCS#11 key ring against a real SoftHSM2. Each test runs again in a child process of this
//! test binary with a SoftHSM2 of its own (`SOFTHSM2_CONF` is read once per process), so the
//! tests stay apart however many run at once.

use std::path::{Path, PathBuf};
use std::process::Command;

use cryptoki::object::{Attribute, AttributeType};

use super::*;
use crate::secrets::records::{bmc_purpose, kubeconfig_purpose};
use crate::secrets::sealing::{KeyProvider, open, seal};
use crate::secrets::softhsm::{self, SoftHsm, write_pin_file};

const CHILD_ENV: &str = "LANDFALL_TEST_PKCS11_CHILD";
const DIR_ENV: &str = "LANDFALL_TEST_PKCS11_DIR";
const PIN: &str = "1234-user";

/// Runs `body` (given the SoftHSM2's directory) in a child process of this test binary whose
/// SoftHSM2 has the tokens `tokens` (label, user PIN). The parent never loads the module.
fn in_own_softhsm(test: &str, tokens: &[(&str, &str)], body: impl FnOnce(&Path)) {
    if std::env::var(CHILD_ENV).as_deref() == Ok(test) {
        let dir = PathBuf::from(std::env::var_os(DIR_ENV).expect("the SoftHSM2 directory"));
        return body(&dir);
    }
    let hsm = SoftHsm::new();
    for (label, pin) in tokens {
        hsm.init_token(label, pin);
    }
    let name = format!("{}::{test}", module_path!().split_once("::").expect("a crate path").1);
    let (conf_var, conf) = hsm.conf_env();
    let out = Command::new(std::env::current_exe().expect("the test binary"))
        .args([name.as_str(), "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, test)
        .env(DIR_ENV, hsm.dir())
        .env(conf_var, conf)
        .output()
        .expect("run the test binary again");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{name} in its own process with its own SoftHSM2 ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The token `label`'s key-encryption key of the default label, its PIN in a file in `dir`.
fn token(dir: &Path, label: &str, pin: &str) -> TokenKey {
    let pin_file = dir.join(format!("{label}.pin"));
    write_pin_file(&pin_file, pin);
    TokenKey {
        module: softhsm::module(),
        token_label: label.into(),
        pin: PinSource::File(pin_file),
        key_label: DEFAULT_KEY_LABEL.into(),
    }
}

fn hex_of(key: &[u8; 32]) -> String {
    hex(key)
}

/// Whether `file` holds `key` in any form a key file would: raw bytes or hex.
fn holds(file: &[u8], key: &[u8; 32]) -> bool {
    let text = String::from_utf8_lossy(file).to_lowercase();
    file.windows(32).any(|w| w == key) || text.contains(&hex_of(key))
}

#[test]
fn records_seal_and_open_with_a_ring_whose_file_holds_no_usable_key() {
    in_own_softhsm("records_seal_and_open_with_a_ring_whose_file_holds_no_usable_key", &[("hub", PIN)], |dir| {
        let config = token(dir, "hub", PIN);
        let path = dir.join("ring.wrapped");
        let ring = init_ring(&config, &path, None).unwrap();
        let (id, key) = ring.current();
        let kubeconfig = seal(&ring, &kubeconfig_purpose("edge-01"), b"apiVersion: v1\nkind: Config\n").unwrap();
        let bmc = seal(&ring, &bmc_purpose("edge-01", "node-1"), b"admin:s3cret").unwrap();
        assert_eq!(kubeconfig.key_id, id);

        // Another process reading the ring file opens both, through the token.
        let again = open_ring(&config, &path).unwrap();
        assert_eq!(again.key_ids(), vec![id.clone()]);
        let plain = open(&again, &kubeconfig_purpose("edge-01"), &kubeconfig).unwrap();
        assert_eq!(plain.as_slice(), b"apiVersion: v1\nkind: Config\n");
        assert_eq!(open(&again, &bmc_purpose("edge-01", "node-1"), &bmc).unwrap().as_slice(), b"admin:s3cret");
        let source = again.source();
        assert!(source.ends_with("(wrapped under key \"landfall-kek\" of PKCS#11 token \"hub\")"), "{source}");
        assert!(!format!("{again:?}").contains(&hex_of(&key)));

        // The file holds the key only wrapped: not as bytes, not as hex, and it is no key file.
        let file = std::fs::read(&path).unwrap();
        assert!(!holds(&file, &key), "the data key is in the ring file");
        assert!(String::from_utf8_lossy(&file).lines().any(|l| l.starts_with("kek ")));
        assert!(matches!(KeyRing::from_file(&path), Err(SecretError::BadKey { .. })));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);

        // The key-encryption key was made on the token, sensitive and never extractable.
        let kek = TokenKek::open(&config).unwrap();
        kek.with_key(|session, found| {
            assert_eq!(found.id.len(), KEK_ID_LEN);
            let wanted = [AttributeType::Sensitive, AttributeType::Extractable, AttributeType::Token];
            let attrs = session.get_attributes(found.handle, &wanted).unwrap();
            assert!(attrs.contains(&Attribute::Sensitive(true)), "{attrs:?}");
            assert!(attrs.contains(&Attribute::Extractable(false)), "{attrs:?}");
            assert!(attrs.contains(&Attribute::Token(true)), "{attrs:?}");
            let value = session.get_attributes(found.handle, &[AttributeType::Value]).unwrap_or_default();
            assert!(!value.iter().any(|a| matches!(a, Attribute::Value(_))), "the KEK's value was read out");
            Ok(())
        })
        .unwrap();

        // hsm-init is once: an existing ring, or an existing key of that label, is refused.
        let err = init_ring(&config, &path, None).unwrap_err().to_string();
        assert!(err.contains("exists already"), "{err}");
        let err = init_ring(&config, &dir.join("other.wrapped"), None).unwrap_err().to_string();
        assert!(err.contains("already holds a key labelled \"landfall-kek\""), "{err}");
        assert!(!dir.join("other.wrapped").exists());
    });
}

#[test]
fn rotate_retire_and_reload_keep_the_keys_wrapped() {
    in_own_softhsm("rotate_retire_and_reload_keep_the_keys_wrapped", &[("hub", PIN)], |dir| {
        let config = token(dir, "hub", PIN);
        let path = dir.join("ring.wrapped");
        let ring = init_ring(&config, &path, None).unwrap();
        let elsewhere = open_ring(&config, &path).unwrap();
        let (old, old_key) = ring.current();
        let before = seal(&ring, "p", b"before").unwrap();

        let new = ring.rotate().unwrap();
        assert_eq!(ring.key_ids(), vec![new.clone(), old.clone()]);
        let (_, new_key) = ring.current();
        let file = std::fs::read(&path).unwrap();
        assert!(!holds(&file, &old_key) && !holds(&file, &new_key), "a data key is in the rotated ring file");
        assert_eq!(String::from_utf8_lossy(&file).lines().filter(|l| l.starts_with("key ")).count(), 2);
        // Another ring on the same file follows: it notices the change before sealing.
        let after = seal(&elsewhere, "p", b"after").unwrap();
        assert_eq!(after.key_id, new);
        assert_eq!(open(&elsewhere, "p", &before).unwrap().as_slice(), b"before");

        assert_eq!(ring.retire(&new).unwrap(), vec![old.clone()]);
        elsewhere.reload().unwrap();
        assert_eq!(elsewhere.key_ids(), vec![new.clone()]);
        assert!(matches!(open(&elsewhere, "p", &before), Err(SecretError::UnknownKey { .. })));
        assert_eq!(open(&open_ring(&config, &path).unwrap(), "p", &after).unwrap().as_slice(), b"after");
        let file = std::fs::read(&path).unwrap();
        assert!(!holds(&file, &new_key));
        let names: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        assert!(!names.iter().any(|n| n.contains(".tmp-")), "a temporary file is left: {names:?}");
    });
}

#[test]
fn another_tokens_key_of_the_same_label_does_not_open_the_ring() {
    let test = "another_tokens_key_of_the_same_label_does_not_open_the_ring";
    in_own_softhsm(test, &[("hub", PIN), ("other", "5678-other")], |dir| {
        let hub = token(dir, "hub", PIN);
        let other = token(dir, "other", "5678-other");
        let path = dir.join("ring.wrapped");
        init_ring(&hub, &path, None).unwrap();
        TokenKek::create(&other).unwrap();

        let err = open_ring(&other, &path).unwrap_err();
        assert!(matches!(&err, SecretError::Hsm(e) if matches!(**e, HsmError::OtherKek { .. })), "{err:?}");
        let text = err.to_string();
        assert!(text.contains("belongs to another token's key"), "{text}");
        assert!(text.contains("PKCS#11 token \"other\""), "{text}");

        // A wrapped key altered in the file does not open either, and says which line.
        let ring = std::fs::read_to_string(&path).unwrap();
        let (n, line) = ring.lines().enumerate().find(|(_, l)| l.starts_with("key ")).unwrap();
        let last = line.chars().last().unwrap();
        let flipped = format!("{}{}", &line[..line.len() - 1], if last == '0' { '1' } else { '0' });
        std::fs::write(&path, ring.replace(line, &flipped)).unwrap();
        let err = open_ring(&hub, &path).unwrap_err().to_string();
        assert!(err.contains(&format!("line {} does not open under key", n + 1)), "{err}");
        assert!(err.contains("wrapped under another key, or altered"), "{err}");
    });
}

#[test]
fn a_wrong_pin_a_missing_key_token_module_or_ring_are_clear_errors() {
    in_own_softhsm("a_wrong_pin_a_missing_key_token_module_or_ring_are_clear_errors", &[("hub", PIN)], |dir| {
        let config = token(dir, "hub", PIN);
        let path = dir.join("ring.wrapped");
        let open_err = |c: &TokenKey| open_ring(c, &path).unwrap_err().to_string();

        let err = open_err(&config);
        assert!(err.contains("does not exist: make it and the key-encryption key once"), "{err}");
        // Before hsm-init the token holds no key-encryption key.
        std::fs::write(&path, "").unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        let err = open_err(&config);
        assert!(err.contains("holds no key labelled \"landfall-kek\": make it once with"), "{err}");
        std::fs::remove_file(&path).unwrap();
        init_ring(&config, &path, None).unwrap();

        let wrong = token(dir, "hub-wrong", "not-the-pin");
        let err = open_err(&TokenKey { token_label: "hub".into(), ..wrong });
        assert_eq!(err, "PKCS#11 token \"hub\" refused the PIN (wrong PIN)");
        assert!(!err.contains("not-the-pin"));

        let err = open_err(&TokenKey { key_label: "no-such-key".into(), ..config.clone() });
        assert!(err.contains("holds no key labelled \"no-such-key\""), "{err}");

        let err = open_err(&TokenKey { token_label: "nowhere".into(), ..config.clone() });
        assert!(err.contains("no PKCS#11 token labelled \"nowhere\"") && err.contains("\"hub\""), "{err}");

        let err = open_err(&TokenKey { module: dir.join("no-such-module.so"), ..config.clone() });
        assert!(err.starts_with("cannot load the PKCS#11 module") && err.contains("no such file"), "{err}");
        let not_a_module = dir.join("not-a-module.so");
        std::fs::write(&not_a_module, b"not a shared library").unwrap();
        let err = open_err(&TokenKey { module: not_a_module, ..config.clone() });
        assert!(err.starts_with("cannot load the PKCS#11 module"), "{err}");

        let unset = "LANDFALL_TEST_PKCS11_PIN_NEVER_SET";
        let err = open_err(&TokenKey { pin: PinSource::Env(unset.into()), ..config.clone() });
        assert!(err.contains("no PIN for PKCS#11 token \"hub\""), "{err}");
        let PinSource::File(pin_file) = &config.pin else { unreachable!() };
        std::fs::set_permissions(pin_file, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
        let err = open_err(&config);
        assert!(err.contains("chmod 600"), "{err}");

        // A plain key file given as the ring is not taken for one.
        std::fs::set_permissions(pin_file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        std::fs::write(&path, format!("{}\n", "ab".repeat(32))).unwrap();
        let err = open_err(&config);
        assert!(err.contains("is not a wrapped key ring"), "{err}");
    });
}

#[test]
fn a_plain_key_ring_moves_into_the_token_and_what_it_sealed_still_opens() {
    in_own_softhsm("a_plain_key_ring_moves_into_the_token_and_what_it_sealed_still_opens", &[("hub", PIN)], |dir| {
        let config = token(dir, "hub", PIN);
        let plain_path = dir.join("secret.key");
        let plain = KeyRing::load_or_create(&plain_path, &Default::default()).unwrap();
        plain.rotate().unwrap();
        let sealed = seal(&plain, &kubeconfig_purpose("edge-01"), b"kind: Config").unwrap();
        let (_, newest) = plain.current();

        let path = dir.join("ring.wrapped");
        let ring = init_ring(&config, &path, Some(&plain)).unwrap();
        assert_eq!(ring.key_ids(), plain.key_ids(), "the same keys, in the same order");
        let reopened = open_ring(&config, &path).unwrap();
        assert_eq!(open(&reopened, &kubeconfig_purpose("edge-01"), &sealed).unwrap().as_slice(), b"kind: Config");
        assert!(!holds(&std::fs::read(&path).unwrap(), &newest), "the imported key is in the ring file");
    });
}
