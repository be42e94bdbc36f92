//! The identity without a TPM, and what a directory that is not a usable identity gives. The
//! sealed identity is tested against software TPMs in tests/tests/sealed_identity.rs.

use std::os::unix::fs::PermissionsExt;

use super::*;

fn file_identity() -> (tempfile::TempDir, Identity) {
    let dir = tempfile::tempdir().unwrap();
    let identity = Identity::init(&dir.path().join("id"), &TpmChoice::None).unwrap();
    (dir, identity)
}

#[test]
fn tpm_choices_parse() {
    assert_eq!("auto".parse::<TpmChoice>().unwrap(), TpmChoice::Auto);
    assert_eq!("none".parse::<TpmChoice>().unwrap(), TpmChoice::None);
    assert_eq!("/dev/tpmrm0".parse::<TpmChoice>().unwrap(), TpmChoice::Tcti(DEVICE_TCTI.into()));
    let swtpm = "swtpm:host=127.0.0.1,port=2321";
    assert_eq!(swtpm.parse::<TpmChoice>().unwrap(), TpmChoice::Tcti(swtpm.into()));
    assert_eq!(swtpm.parse::<TpmChoice>().unwrap().to_string(), swtpm);
    assert!("".parse::<TpmChoice>().is_err());
    assert!("yes".parse::<TpmChoice>().unwrap_err().contains("give auto, none or a TCTI"));
    assert_eq!(TpmChoice::None.tcti(), None);
    assert_eq!(TpmChoice::Auto.tcti().is_some(), Path::new("/dev/tpmrm0").exists());
}

#[test]
fn a_file_identity_loads_as_it_was_made_and_signs() {
    let (dir, made) = file_identity();
    let dir = dir.path().join("id");
    assert!(!made.sealed());
    assert!(made.public_key().starts_with('U'), "{}", made.public_key());
    let loaded = Identity::load(&dir, &TpmChoice::None).unwrap();
    assert_eq!(loaded.public_key(), made.public_key());
    assert_eq!(loaded.fingerprint(), made.fingerprint());
    assert!(!loaded.sealed());

    let signature = loaded.sign(b"a site's word").unwrap();
    let public = nkeys::KeyPair::from_public_key(made.public_key()).unwrap();
    public.verify(b"a site's word", &signature).unwrap();
    assert!(public.verify(b"another word", &signature).is_err());

    let access = loaded.nats_access(Access { js_domain: Some("hub".into()), ..Access::default() });
    assert_eq!(access.public_key().unwrap().as_deref(), Some(made.public_key()));
    assert_eq!(access.js_domain.as_deref(), Some("hub"));

    let mode = |name: &str| std::fs::metadata(dir.join(name)).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(SEED_FILE), 0o600);
    assert_eq!(mode(""), 0o700);
    assert_eq!(std::fs::read_to_string(dir.join(PUBLIC_KEY)).unwrap().trim(), made.public_key());
    // Nothing else about the key is in the clear but the public key. (The seed, not its "SU"
    // prefix: a public key's base32 holds those two letters now and then.)
    let seed = std::fs::read_to_string(dir.join(SEED_FILE)).unwrap();
    let seed = seed.trim();
    assert!(seed.starts_with("SU"), "not a user seed");
    assert!(!format!("{loaded:?}").contains(seed), "{loaded:?}");
    assert!(!format!("{loaded:?}").contains(&seed[2..12]), "{loaded:?}");
}

#[test]
fn fingerprints_are_short_and_differ_between_keys() {
    let (_a, a) = file_identity();
    let (_b, b) = file_identity();
    assert_eq!(a.fingerprint().len(), 19, "{}", a.fingerprint());
    assert_eq!(a.fingerprint().matches(':').count(), 3, "{}", a.fingerprint());
    assert_ne!(a.fingerprint(), b.fingerprint());
    assert_eq!(a.fingerprint(), fingerprint(a.public_key()));
}

#[test]
fn init_never_replaces_an_identity() {
    let (dir, made) = file_identity();
    let dir = dir.path().join("id");
    let err = Identity::init(&dir, &TpmChoice::None).unwrap_err();
    assert!(matches!(err, IdentityError::Exists { .. }), "{err}");
    assert!(err.to_string().contains("is not replaced"), "{err}");
    assert_eq!(Identity::load(&dir, &TpmChoice::None).unwrap().public_key(), made.public_key());
}

#[test]
fn an_empty_directory_says_how_to_make_an_identity() {
    let dir = tempfile::tempdir().unwrap();
    let err = Identity::load(dir.path(), &TpmChoice::None).unwrap_err();
    assert!(matches!(err, IdentityError::Missing { .. }), "{err}");
    assert!(err.to_string().contains("landfall-gateway identity init --identity-dir"), "{err}");
}

#[test]
fn a_file_identity_is_not_loaded_with_a_tpm() {
    let (dir, _) = file_identity();
    let err =
        Identity::load(&dir.path().join("id"), &TpmChoice::Tcti("swtpm:host=127.0.0.1,port=1".into())).unwrap_err();
    assert!(matches!(err, IdentityError::FileWithTpm { .. }), "{err}");
    assert!(err.to_string().contains("--tpm none"), "{err}");
}

#[test]
fn a_sealed_identity_is_not_loaded_without_a_tpm() {
    let (dir, _) = file_identity();
    let dir = dir.path().join("id");
    // A manifest that says sealed: loading it without a TPM never reaches for a seed file.
    std::fs::write(
        dir.join(MANIFEST),
        r#"{"format":1,"storage":"tpm","primary":"owner:ecc256:aes128cfb:sha256","sealed_sha256":"00"}"#,
    )
    .unwrap();
    let err = Identity::load(&dir, &TpmChoice::None).unwrap_err();
    assert!(matches!(err, IdentityError::SealedWithoutTpm), "{err}");
    assert!(err.to_string().contains("sealed to a TPM"), "{err}");
}

#[test]
fn a_damaged_directory_is_corrupt_and_says_what() {
    type Damage = fn(&Path);
    let cases: &[(&str, Damage, &str)] = &[
        ("manifest gone", |d| std::fs::remove_file(d.join(MANIFEST)).unwrap(), "identity.json is not"),
        ("manifest garbage", |d| std::fs::write(d.join(MANIFEST), "{not json").unwrap(), "cannot be read"),
        (
            "manifest from the future",
            |d| std::fs::write(d.join(MANIFEST), r#"{"format":2,"storage":"file"}"#).unwrap(),
            "format 2",
        ),
        ("public key gone", |d| std::fs::remove_file(d.join(PUBLIC_KEY)).unwrap(), "identity.pub.nkey is missing"),
        ("public key garbage", |d| std::fs::write(d.join(PUBLIC_KEY), "hello\n").unwrap(), "no user public key"),
        (
            "public key of another",
            |d| std::fs::write(d.join(PUBLIC_KEY), nkeys::KeyPair::new_user().public_key()).unwrap(),
            "the seed is not the key of identity.pub.nkey",
        ),
        ("seed gone", |d| std::fs::remove_file(d.join(SEED_FILE)).unwrap(), "seed.nkey is missing"),
        (
            "seed garbage",
            |d| {
                let path = d.join(SEED_FILE);
                std::fs::remove_file(&path).unwrap();
                write_new(&path, b"SUnot-a-seed\n", 0o600).unwrap();
            },
            "not an nkey seed",
        ),
        (
            "seed readable by others",
            |d| std::fs::set_permissions(d.join(SEED_FILE), std::fs::Permissions::from_mode(0o644)).unwrap(),
            "chmod 600",
        ),
    ];
    for (case, damage, says) in cases {
        let (dir, _) = file_identity();
        let dir = dir.path().join("id");
        damage(&dir);
        let err = Identity::load(&dir, &TpmChoice::None).unwrap_err();
        assert!(matches!(err, IdentityError::Corrupt { .. }), "{case}: {err:?}");
        assert!(err.to_string().contains(says), "{case}: {err}");
        assert!(err.to_string().starts_with("the identity directory is corrupt"), "{case}: {err}");
    }
}

#[test]
fn init_in_a_directory_it_cannot_write_leaves_nothing_behind() {
    let parent = tempfile::tempdir().unwrap();
    let file = parent.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let err = Identity::init(&file.join("id"), &TpmChoice::None).unwrap_err();
    assert!(matches!(err, IdentityError::Io { .. }), "{err:?}");
    assert!(err.to_string().contains("creating the identity directory"), "{err}");
}
