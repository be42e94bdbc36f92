//! The gateway's BPA upload client against the stand-in BPA REST agent: whole uploads, images
//! the BPA has already, transfers cut and resumed, conflicts, an unreachable BPA.

use std::path::PathBuf;
use std::time::Duration;

use bus_schema::domain::{Package, Sha256};
use bus_schema::pb::PackageKind;
use landfall_tests::bpa_rest::BpaRest;
use sha2::Digest;
use site_gateway::backend::BackendError;
use site_gateway::kube_site::bpa_upload::{BpaUploader, UploadOutcome, image_name};

const MIB: u64 = 1 << 20;
const CHUNK: u64 = 4 * MIB;
const PREFIX: &str = "/v1/baremetalcluster/edge/edge-01";

/// A file of `size` bytes in a temp dir (no two alike: `seed` changes them), and its package.
struct Artifact {
    _dir: tempfile::TempDir,
    path: PathBuf,
    bytes: Vec<u8>,
    package: Package,
}

fn artifact(name: &str, version: &str, kind: PackageKind, size: u64, seed: u8) -> Artifact {
    let bytes: Vec<u8> = (0..size).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 13) as u8).collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("{name}-{version}"));
    std::fs::write(&path, &bytes).unwrap();
    let package = Package {
        name: name.try_into().unwrap(),
        version: version.try_into().unwrap(),
        kind,
        sha256: Sha256::hex(&sha2::Sha256::digest(&bytes)).try_into().unwrap(),
        size,
        object_key: String::new(),
        chart: None,
        render: None,
    };
    Artifact { _dir: dir, path, bytes, package }
}

fn kubelet(size: u64) -> Artifact {
    artifact("kubelet", "1.29.1+k3s1", PackageKind::Binary, size, 7)
}

fn uploader(bpa: &BpaRest) -> BpaUploader {
    BpaUploader::new(&bpa.url(), "edge", "edge-01").unwrap().with_retries(3, Duration::from_millis(10))
}

fn patch(collection: &str, name: &str, offset: u64, len: u64) -> String {
    format!("PATCH {PREFIX}/{collection}/{name} offset={offset} len={len}")
}

#[tokio::test]
async fn a_file_uploads_whole_in_chunks_and_its_bytes_are_the_files() {
    let bpa = BpaRest::start().await;
    let a = kubelet(10 * MIB);

    let outcome = uploader(&bpa).upload(&a.package, &a.path).await.unwrap();

    assert_eq!(outcome, UploadOutcome { bytes_sent: 10 * MIB, resumed_from: 0, already_complete: false });
    let name = "kubelet-1.29.1_k3s1";
    assert_eq!(image_name(&a.package), name);
    let (record, bytes) = bpa.image("binary_images", name).expect("the bpa holds the image");
    assert!(bytes == a.bytes, "the bytes held are not the file's");
    assert_eq!(record["upload_complete"], true);
    assert_eq!(record["image_offset"], 10 * MIB);
    assert_eq!(record["image_length"], 10 * MIB);
    assert_eq!(record["type"], "binary");
    assert_eq!(record["owner"], "edge");
    assert_eq!(record["cluster_name"], "edge-01");
    let image_record = &record["description"]["image_records"][0];
    assert_eq!(image_record["repo"], "kubelet");
    assert_eq!(image_record["tag"], format!("sha256:{}", a.package.sha256));
    assert_eq!(
        bpa.requests(),
        [
            format!("POST {PREFIX}/binary_images"),
            patch("binary_images", name, 0, CHUNK),
            patch("binary_images", name, CHUNK, CHUNK),
            patch("binary_images", name, 2 * CHUNK, 2 * MIB),
        ]
    );
    assert_eq!(bpa.bytes_received(), 10 * MIB);
}

#[tokio::test]
async fn an_image_the_bpa_has_whole_is_not_sent_again() {
    let bpa = BpaRest::start().await;
    let a = kubelet(10 * MIB);
    let bpa_client = uploader(&bpa);
    bpa_client.upload(&a.package, &a.path).await.unwrap();
    let before = bpa.requests().len();

    let outcome = bpa_client.upload(&a.package, &a.path).await.unwrap();

    assert_eq!(outcome, UploadOutcome { bytes_sent: 0, resumed_from: 10 * MIB, already_complete: true });
    assert_eq!(bpa.bytes_received(), 10 * MIB);
    let name = image_name(&a.package);
    assert_eq!(
        bpa.requests()[before..],
        [format!("POST {PREFIX}/binary_images"), format!("GET {PREFIX}/binary_images/{name}")]
    );
}

#[tokio::test]
async fn a_cut_transfer_resumes_from_the_bpas_offset_on_the_next_upload() {
    let bpa = BpaRest::start().await;
    let a = kubelet(10 * MIB);
    let name = image_name(&a.package);
    // ~41%: a whole first chunk, then the connection drops inside the second.
    let cut = CHUNK + 123_457;
    bpa.cut_after(cut);

    let no_retries = BpaUploader::new(&bpa.url(), "edge", "edge-01").unwrap().with_retries(1, Duration::ZERO);
    let err = no_retries.upload(&a.package, &a.path).await.unwrap_err();
    assert!(matches!(err, BackendError::Transient { .. }), "{err:?}");
    let (record, held) = bpa.image("binary_images", &name).unwrap();
    assert_eq!(held.len() as u64, cut);
    assert_eq!(record["upload_complete"], false);
    let before = bpa.requests().len();

    let outcome = uploader(&bpa).upload(&a.package, &a.path).await.unwrap();

    assert_eq!(outcome, UploadOutcome { bytes_sent: 10 * MIB - cut, resumed_from: cut, already_complete: false });
    assert_eq!(bpa.bytes_received(), 10 * MIB, "a byte the bpa held was sent again");
    assert!(bpa.image("binary_images", &name).unwrap().1 == a.bytes);
    assert_eq!(
        bpa.requests()[before..],
        [
            format!("POST {PREFIX}/binary_images"),
            format!("GET {PREFIX}/binary_images/{name}"),
            patch("binary_images", &name, cut, CHUNK),
            patch("binary_images", &name, cut + CHUNK, 10 * MIB - cut - CHUNK),
        ]
    );
}

#[tokio::test]
async fn a_cut_transfer_resumes_within_the_same_upload_when_retries_are_left() {
    let bpa = BpaRest::start().await;
    let a = kubelet(10 * MIB);
    let name = image_name(&a.package);
    let cut = CHUNK + 123_457;
    bpa.cut_after(cut);

    let outcome = uploader(&bpa).upload(&a.package, &a.path).await.unwrap();

    assert_eq!(outcome, UploadOutcome { bytes_sent: 10 * MIB, resumed_from: 0, already_complete: false });
    assert_eq!(bpa.bytes_received(), 10 * MIB, "a byte the bpa held was sent again");
    assert!(bpa.image("binary_images", &name).unwrap().1 == a.bytes);
    assert_eq!(
        bpa.requests(),
        [
            format!("POST {PREFIX}/binary_images"),
            patch("binary_images", &name, 0, CHUNK),
            patch("binary_images", &name, CHUNK, CHUNK),
            format!("GET {PREFIX}/binary_images/{name}"),
            patch("binary_images", &name, cut, CHUNK),
            patch("binary_images", &name, cut + CHUNK, 10 * MIB - cut - CHUNK),
        ]
    );
}

#[tokio::test]
async fn a_complete_image_of_the_same_name_and_another_length_is_refused() {
    let bpa = BpaRest::start().await;
    let theirs = kubelet(3 * MIB);
    let ours = artifact("kubelet", "1.29.1+k3s1", PackageKind::Binary, 2 * MIB, 9);
    uploader(&bpa).upload(&theirs.package, &theirs.path).await.unwrap();

    let err = uploader(&bpa).upload(&ours.package, &ours.path).await.unwrap_err();

    let BackendError::Permanent { .. } = &err else { panic!("not permanent: {err:?}") };
    let message = err.reason();
    assert!(message.contains(&(3 * MIB).to_string()) && message.contains(&(2 * MIB).to_string()), "{message}");
    assert!(message.contains("kubelet-1.29.1_k3s1"), "{message}");
    let (_, held) = bpa.image("binary_images", "kubelet-1.29.1_k3s1").unwrap();
    assert!(held == theirs.bytes, "the bpa's image was overwritten");
    assert_eq!(bpa.bytes_received(), 3 * MIB);
}

#[tokio::test]
async fn an_image_of_the_same_name_and_length_but_another_digest_is_refused() {
    let bpa = BpaRest::start().await;
    let theirs = kubelet(MIB);
    let ours = artifact("kubelet", "1.29.1+k3s1", PackageKind::Binary, MIB, 9);
    uploader(&bpa).upload(&theirs.package, &theirs.path).await.unwrap();

    let err = uploader(&bpa).upload(&ours.package, &ours.path).await.unwrap_err();

    let BackendError::Permanent { .. } = &err else { panic!("not permanent: {err:?}") };
    let message = err.reason();
    assert!(message.contains(theirs.package.sha256.as_str()) && message.contains(ours.package.sha256.as_str()));
    assert_eq!(bpa.bytes_received(), MIB);
}

#[tokio::test]
async fn an_unreachable_bpa_is_transient() {
    // A port nothing listens on any more.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let a = kubelet(1000);
    let bpa = BpaUploader::new(&format!("http://127.0.0.1:{port}"), "edge", "edge-01")
        .unwrap()
        .with_retries(2, Duration::from_millis(10));

    let err = bpa.upload(&a.package, &a.path).await.unwrap_err();

    assert!(matches!(err, BackendError::Transient { .. }), "{err:?}");
}

#[tokio::test]
async fn the_three_kinds_go_to_the_three_collections() {
    let bpa = BpaRest::start().await;
    let artifacts = [
        (artifact("kubelet", "1.29.1", PackageKind::Binary, 1000, 1), "binary_images", "binary"),
        (artifact("ingress", "4.9.0", PackageKind::Container, 2000, 2), "container_images", "container"),
        (artifact("ubuntu", "22.04", PackageKind::OsImage, 3000, 3), "os_images", "os"),
    ];
    for (a, _, _) in &artifacts {
        uploader(&bpa).upload(&a.package, &a.path).await.unwrap();
    }
    for (a, collection, kind) in &artifacts {
        let name = image_name(&a.package);
        let (record, bytes) = bpa.image(collection, &name).unwrap_or_else(|| panic!("{name} is not in {collection}"));
        assert_eq!(record["type"], *kind);
        assert!(bytes == a.bytes);
        for other in ["binary_images", "container_images", "os_images"].into_iter().filter(|c| c != collection) {
            assert!(bpa.image(other, &name).is_none(), "{name} is in {other} too");
        }
    }
    assert_eq!(bpa.bytes_received(), 6000);
}

#[tokio::test]
async fn offset_races_are_read_again_and_continued_a_bounded_number_of_times() {
    let bpa = BpaRest::start().await;
    let a = kubelet(6 * MIB);
    let name = image_name(&a.package);

    // Twice someone else "moved" the offset: the client reads it again and carries on.
    bpa.fail_patches(409, 2);
    let outcome = uploader(&bpa).upload(&a.package, &a.path).await.unwrap();
    assert_eq!(outcome.bytes_sent, 6 * MIB);
    assert!(bpa.image("binary_images", &name).unwrap().1 == a.bytes);
    assert_eq!(
        bpa.requests(),
        [
            format!("POST {PREFIX}/binary_images"),
            patch("binary_images", &name, 0, CHUNK),
            format!("GET {PREFIX}/binary_images/{name}"),
            patch("binary_images", &name, 0, CHUNK),
            format!("GET {PREFIX}/binary_images/{name}"),
            patch("binary_images", &name, 0, CHUNK),
            patch("binary_images", &name, CHUNK, 2 * MIB),
        ]
    );

    // An offset that never settles is given up on, as transient.
    let b = artifact("kubelet", "1.30.0", PackageKind::Binary, MIB, 3);
    bpa.fail_patches(409, 100);
    let err = uploader(&bpa).upload(&b.package, &b.path).await.unwrap_err();
    assert!(matches!(&err, BackendError::Transient { .. } if err.reason().contains("409")), "{err:?}");
    let patches = bpa.requests().iter().filter(|r| r.contains("kubelet-1.30.0") && r.starts_with("PATCH")).count();
    assert_eq!(patches, 4, "one patch and three more after reading the offset again");
}

#[tokio::test]
async fn a_busy_bpa_is_retried_then_transient_and_a_refusal_is_permanent() {
    let bpa = BpaRest::start().await;
    let a = kubelet(MIB);
    bpa.fail_patches(503, 2);
    uploader(&bpa).upload(&a.package, &a.path).await.unwrap();
    assert_eq!(bpa.bytes_received(), MIB);

    let b = artifact("kubelet", "1.30.0", PackageKind::Binary, MIB, 3);
    bpa.fail_patches(503, 3);
    let err = uploader(&bpa).upload(&b.package, &b.path).await.unwrap_err();
    assert!(matches!(&err, BackendError::Transient { .. } if err.reason().contains("503")), "{err:?}");

    let c = artifact("kubelet", "1.31.0", PackageKind::Binary, MIB, 4);
    bpa.fail_patches(400, 1);
    let err = uploader(&bpa).upload(&c.package, &c.path).await.unwrap_err();
    let message = err.reason();
    assert!(
        matches!(&err, BackendError::Permanent { .. }) && message.contains("400") && message.contains("injected"),
        "{err:?}"
    );
}

#[tokio::test]
async fn two_gateways_at_once_never_have_a_byte_accepted_twice() {
    let bpa = BpaRest::start().await;
    let a = kubelet(10 * MIB);
    let (one, other) = (uploader(&bpa).with_chunk_size(MIB), uploader(&bpa).with_chunk_size(MIB));

    let (first, second) = tokio::join!(one.upload(&a.package, &a.path), other.upload(&a.package, &a.path));
    // Either may give up on the moving offset; a later call finishes what is left.
    for result in [&first, &second] {
        assert!(matches!(result, Ok(_) | Err(BackendError::Transient { .. })), "{result:?}");
    }
    let last = uploader(&bpa).upload(&a.package, &a.path).await.unwrap();

    assert!(last.already_complete || first.is_err() && second.is_err(), "{first:?} {second:?} {last:?}");
    assert_eq!(bpa.bytes_received(), 10 * MIB);
    assert!(bpa.image("binary_images", &image_name(&a.package)).unwrap().1 == a.bytes);
}
