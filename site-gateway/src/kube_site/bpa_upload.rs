//! The ICN BPA's REST upload API: how the gateway hands the artifacts its cache holds, verified,
//! to the site's binary provisioning agent.
//!
//! `{base}/v1/baremetalcluster/{owner}/{cluster}/{binary_images|container_images|os_images}`:
//! `POST` registers an image's metadata; `GET …/{image}` says how many bytes the BPA holds
//! (`image_offset`) and whether the image is whole (`upload_complete`); `PATCH …/{image}` with
//! `Upload-Offset: n` appends the bytes from `n`, and an offset that is not the BPA's is
//! `409 Conflict`. A transfer that breaks resumes from the offset the BPA reports, so no byte the
//! BPA holds is sent again.
//!
//! Landfall's identity of an image: `image_name` is `<package>-<version>`, and its one image
//! record has `repo` = the package and `tag` = `sha256:<hex>`. An image the BPA holds under that
//! name with another length or digest is refused, never overwritten.

use std::io::SeekFrom;
use std::path::Path;
use std::time::Duration;

use bus_schema::domain::Package;
use bus_schema::pb::PackageKind;
use bytes::Bytes;
use reqwest::header::{CONTENT_TYPE, HeaderMap};
use reqwest::{StatusCode, Url};
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tracing::{debug, info, warn};

use crate::backend::BackendError;

/// How much one `PATCH` carries: read from the file for each request, never the whole file.
pub const CHUNK_SIZE: u64 = 4 << 20;
/// Tries of one request (or one chunk) before a connection error or a 5xx is given up on.
const ATTEMPTS: u32 = 3;
/// The pause before the first retry; it doubles with each further one.
const RETRY_DELAY: Duration = Duration::from_millis(250);
/// `409`s on `PATCH` (someone else moved the offset) in a row before giving up.
const OFFSET_RACES: u32 = 3;
/// How much of an error body goes into an error message.
const ERROR_BODY_CHARS: usize = 512;

const UPLOAD_OFFSET: &str = "Upload-Offset";
const OFFSET_OCTET_STREAM: &str = "application/offset+octet-stream";

/// The BPA's image collections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageKind {
    Binary,
    Container,
    Os,
}

impl ImageKind {
    /// The collection a package of this kind goes to. A validated [`Package`] never has the kind
    /// `Unspecified` (its `TryFrom` refuses it); should one reach here it is taken for a binary.
    pub fn of(kind: PackageKind) -> Self {
        match kind {
            PackageKind::OsImage => Self::Os,
            PackageKind::Container | PackageKind::HelmChart => Self::Container,
            PackageKind::Binary | PackageKind::Unspecified => Self::Binary,
        }
    }

    /// The collection's path segment: `binary_images`, `container_images`, `os_images`.
    pub fn collection(self) -> &'static str {
        match self {
            Self::Binary => "binary_images",
            Self::Container => "container_images",
            Self::Os => "os_images",
        }
    }

    /// The record's `type`: `binary`, `container`, `os`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Binary => "binary",
            Self::Container => "container",
            Self::Os => "os",
        }
    }
}

/// The BPA's name for a package's image: `<name>-<version>`, every character outside
/// `[A-Za-z0-9._-]` (a version's `+` or `~`) replaced by `_`.
pub fn image_name(package: &Package) -> String {
    sanitize(&format!("{}-{}", package.name, package.version))
}

fn sanitize(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' }).collect()
}

/// What one [`BpaUploader::upload`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadOutcome {
    /// Where the BPA's offset ended less [`Self::resumed_from`]: what this call sent, plus what
    /// another writer of the same image added meanwhile, if one did.
    pub bytes_sent: u64,
    /// The bytes the BPA held already when the call began (the whole length when complete).
    pub resumed_from: u64,
    /// The BPA had the whole image already: nothing was sent.
    pub already_complete: bool,
}

/// A client of one BPA's upload API, for one baremetalcluster. Clones share the connection pool.
#[derive(Debug, Clone)]
pub struct BpaUploader {
    http: reqwest::Client,
    /// `{base}/v1/baremetalcluster/{owner}/{cluster}`, so each collection is one segment more.
    cluster_url: Url,
    owner: String,
    cluster: String,
    chunk_size: u64,
    attempts: u32,
    retry_delay: Duration,
}

impl BpaUploader {
    /// base: e.g. "http://10.0.0.2:9015"; owner and cluster name the BPA's baremetalcluster.
    ///
    /// # Errors
    /// `Permanent` when `base` is not an http(s) URL, or owner or cluster is empty.
    pub fn new(base: &str, owner: &str, cluster: &str) -> Result<Self, BackendError> {
        let api = format!("bpa upload api {base:?}");
        if owner.is_empty() || cluster.is_empty() {
            return Err(BackendError::permanent_reason(format!("{api}: owner and cluster must not be empty")));
        }
        let cluster_url = cluster_url(base, owner, cluster).map_err(|e| BackendError::permanent(api.clone(), e))?;
        // reqwest is built without a crypto provider and asks for the process's default even for
        // plain http; ring's is the one the workspace builds (async-nats re-exports its rustls).
        let _ = async_nats::rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(Duration::from_secs(120))
            .build()
            .map_err(|e| BackendError::permanent(format!("{api}: building the http client"), e))?;
        Ok(Self {
            http,
            cluster_url,
            owner: owner.to_string(),
            cluster: cluster.to_string(),
            chunk_size: CHUNK_SIZE,
            attempts: ATTEMPTS,
            retry_delay: RETRY_DELAY,
        })
    }

    /// Carries `bytes` per `PATCH` instead of [`CHUNK_SIZE`] (at least one).
    pub fn with_chunk_size(mut self, bytes: u64) -> Self {
        self.chunk_size = bytes.max(1);
        self
    }

    /// Tries each request (each chunk) `attempts` times (at least once) when the BPA cannot be
    /// reached or answers 5xx, pausing `delay` before the first retry, twice that before the next.
    pub fn with_retries(mut self, attempts: u32, delay: Duration) -> Self {
        self.attempts = attempts.max(1);
        self.retry_delay = delay;
        self
    }

    /// Hands one cached, verified file to the BPA: registers it unless known, then PATCHes from the
    /// offset the BPA reports, in chunks ([`CHUNK_SIZE`], each read from the file when it is sent,
    /// never the whole file in memory), until complete. An image the BPA already has whole is not
    /// sent again. A chunk that fails is sent again from the offset the BPA then reports.
    ///
    /// # Errors
    /// `Permanent` when the BPA holds another image under the package's name (another length or
    /// digest), refuses a request with a 4xx, or the file is not the package's size; `Transient`
    /// when the BPA stays unreachable, answers 5xx, or others keep moving the offset, after the
    /// retries, and when the file cannot be read.
    pub async fn upload(&self, package: &Package, path: &Path) -> Result<UploadOutcome, BackendError> {
        let name = image_name(package);
        if package.kind == PackageKind::Unspecified {
            return Err(BackendError::permanent_reason(format!("bpa upload of {name}: the package has no kind")));
        }
        let kind = ImageKind::of(package.kind);
        let local = |e: std::io::Error| {
            BackendError::transient(format!("bpa upload of {name}: reading the cached {}", path.display()), e)
        };
        let mut file = tokio::fs::File::open(path).await.map_err(local)?;
        let length = file.metadata().await.map_err(local)?.len();
        if length != package.size {
            return Err(BackendError::permanent_reason(format!(
                "bpa upload of {name}: the cached {} is {length} bytes, the catalog says {}",
                path.display(),
                package.size
            )));
        }
        let identity = Identity { name: name.clone(), length, tag: format!("sha256:{}", package.sha256) };
        let record = self.register(kind, &identity, package).await?;
        identity.check(&record)?;
        let resumed_from = record.offset();
        if record.is_complete() {
            debug!(image = %name, kind = kind.as_str(), "bpa holds the image already");
            return Ok(UploadOutcome { bytes_sent: 0, resumed_from, already_complete: true });
        }

        let mut offset = resumed_from;
        let (mut failures, mut races) = (0, 0);
        loop {
            let len = self.chunk_size.min(length - offset);
            let chunk = read_chunk(&mut file, offset, len).await.map_err(local)?;
            match self.patch(kind, &name, offset, chunk).await? {
                Patched::To(next) => {
                    if next > length || (next <= offset && len > 0) {
                        return Err(BackendError::permanent_reason(format!(
                            "bpa image {name}: after {len} bytes at offset {offset} the bpa reports offset {next} of {length}"
                        )));
                    }
                    offset = next;
                    (failures, races) = (0, 0);
                    if offset == length {
                        break;
                    }
                    continue;
                }
                Patched::Conflict(why) => {
                    races += 1;
                    if races > OFFSET_RACES {
                        return Err(BackendError::transient(
                            format!("bpa image {name}: the offset kept moving under us ({races} conflicts in a row)"),
                            why,
                        ));
                    }
                    debug!(image = %name, offset, "bpa offset moved; reading it again");
                }
                Patched::Failed(why) => {
                    failures += 1;
                    if failures >= self.attempts {
                        return Err(why);
                    }
                    let pause = self.retry_delay.saturating_mul(2u32.saturating_pow(failures - 1));
                    warn!(image = %name, offset, error = %why.reason(), ?pause, "bpa patch failed; retrying from the bpa's offset");
                    tokio::time::sleep(pause).await;
                }
            }
            let Some(record) = self.fetch(kind, &name).await? else {
                return Err(BackendError::transient_reason(format!("bpa image {name}: deleted while being uploaded")));
            };
            identity.check(&record)?;
            offset = record.offset();
            if record.is_complete() {
                break;
            }
        }
        info!(image = %name, kind = kind.as_str(), bytes = offset - resumed_from, resumed_from, "image handed to the bpa");
        Ok(UploadOutcome { bytes_sent: offset - resumed_from, resumed_from, already_complete: false })
    }

    fn collection_url(&self, kind: ImageKind) -> Url {
        let mut url = self.cluster_url.clone();
        url.path_segments_mut().expect("an http url has a path").push(kind.collection());
        url
    }

    fn image_url(&self, kind: ImageKind, name: &str) -> Url {
        let mut url = self.collection_url(kind);
        url.path_segments_mut().expect("an http url has a path").push(name);
        url
    }

    /// Registers the image, or, when the BPA knows the name already, reads what it holds.
    async fn register(&self, kind: ImageKind, identity: &Identity, package: &Package) -> Result<Record, BackendError> {
        let metadata = serde_json::json!({
            "owner": self.owner,
            "cluster_name": self.cluster,
            "type": kind.as_str(),
            "image_name": identity.name,
            "image_offset": 0,
            "image_length": identity.length,
            "upload_complete": false,
            "description": { "image_records": [{
                "image_record_name": identity.name,
                "repo": package.name.as_str(),
                "tag": identity.tag,
                // The BPA keeps image records as string maps (Go `map[string]string`): a JSON
                // boolean here would fail its decoding.
                "installed": "false",
            }]},
        });
        let body = Bytes::from(serde_json::to_vec(&metadata).expect("a json value serializes"));
        let url = self.collection_url(kind);
        let reply = self
            .send("POST", &url, || {
                self.http.post(url.clone()).header(CONTENT_TYPE, "application/json").body(body.clone())
            })
            .await?;
        match reply.status {
            s if s.is_success() => match serde_json::from_slice::<Record>(&reply.body) {
                Ok(record) => Ok(record),
                // A BPA that answers 201 without the record holds what was asked: nothing yet.
                Err(_) => Ok(Record { image_length: identity.length, ..Record::default() }),
            },
            // It exists (409; some BPAs say 400): what it holds decides. A 400 for a name that is
            // not there was a refusal of the metadata.
            StatusCode::CONFLICT | StatusCode::BAD_REQUEST => match self.fetch(kind, &identity.name).await? {
                Some(record) => Ok(record),
                None if reply.status == StatusCode::CONFLICT => Err(BackendError::transient_reason(format!(
                    "bpa image {}: registration conflicted, then the image was gone",
                    identity.name
                ))),
                None => Err(reply.error("POST", &url)),
            },
            _ => Err(reply.error("POST", &url)),
        }
    }

    /// The BPA's record of the image, `None` when it does not know it.
    async fn fetch(&self, kind: ImageKind, name: &str) -> Result<Option<Record>, BackendError> {
        let url = self.image_url(kind, name);
        let reply = self.send("GET", &url, || self.http.get(url.clone())).await?;
        match reply.status {
            StatusCode::OK => serde_json::from_slice(&reply.body).map(Some).map_err(|e| {
                BackendError::permanent(format!("bpa GET {url}: the record does not read ({})", reply.text()), e)
            }),
            StatusCode::NOT_FOUND => Ok(None),
            _ => Err(reply.error("GET", &url)),
        }
    }

    /// One `PATCH` of `chunk` at `offset`, tried once: the caller learns the offset again before
    /// any retry.
    async fn patch(&self, kind: ImageKind, name: &str, offset: u64, chunk: Bytes) -> Result<Patched, BackendError> {
        let url = self.image_url(kind, name);
        let len = chunk.len() as u64;
        debug!(image = %name, offset, len, "bpa patch");
        let request = self
            .http
            .patch(url.clone())
            .header(UPLOAD_OFFSET, offset)
            .header(CONTENT_TYPE, OFFSET_OCTET_STREAM)
            .body(chunk);
        let reply = match Reply::of(request.send().await).await {
            Ok(reply) => reply,
            Err(e) => {
                return Ok(Patched::Failed(BackendError::transient(format!("bpa PATCH {url} at offset {offset}"), e)));
            }
        };
        match reply.status {
            // A BPA that does not say where it stands took the whole chunk (it said 2xx).
            s if s.is_success() => Ok(Patched::To(reply.upload_offset().unwrap_or(offset + len))),
            StatusCode::CONFLICT => Ok(Patched::Conflict(reply.error("PATCH", &url))),
            s if retryable(s) => Ok(Patched::Failed(reply.error("PATCH", &url))),
            _ => Err(reply.error("PATCH", &url)),
        }
    }

    /// Sends the request `build` makes, again after a connection error or a retryable status,
    /// and returns the first other reply.
    async fn send(
        &self,
        method: &str,
        url: &Url,
        build: impl Fn() -> reqwest::RequestBuilder,
    ) -> Result<Reply, BackendError> {
        let mut attempt = 1;
        loop {
            let why = match Reply::of(build().send().await).await {
                Ok(reply) if !retryable(reply.status) => return Ok(reply),
                Ok(reply) => reply.error(method, url),
                Err(e) => BackendError::transient(format!("bpa {method} {url}"), e),
            };
            if attempt >= self.attempts {
                return Err(why);
            }
            let pause = self.retry_delay.saturating_mul(2u32.saturating_pow(attempt - 1));
            warn!(%url, method, error = %why.reason(), ?pause, "bpa request failed; retrying");
            tokio::time::sleep(pause).await;
            attempt += 1;
        }
    }
}

/// Why a BPA base is not one.
#[derive(Debug, thiserror::Error)]
enum BadBase {
    #[error("not a url")]
    NotUrl(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("not an http(s) url")]
    NotHttp,
}

/// `{base}/v1/baremetalcluster/{owner}/{cluster}`, each segment escaped.
fn cluster_url(base: &str, owner: &str, cluster: &str) -> Result<Url, BadBase> {
    let mut url = Url::parse(base).map_err(|e| BadBase::NotUrl(e.into()))?;
    if !matches!(url.scheme(), "http" | "https") || url.cannot_be_a_base() {
        return Err(BadBase::NotHttp);
    }
    url.set_query(None);
    url.set_fragment(None);
    url.path_segments_mut().map_err(|()| BadBase::NotHttp)?.pop_if_empty().extend([
        "v1",
        "baremetalcluster",
        owner,
        cluster,
    ]);
    Ok(url)
}

/// Which image the BPA must hold under the name, if it holds one.
struct Identity {
    name: String,
    length: u64,
    /// `sha256:<hex>`
    tag: String,
}

impl Identity {
    fn check(&self, record: &Record) -> Result<(), BackendError> {
        let held = if record.is_complete() { "a complete image" } else { "part of an image" };
        if record.image_length != self.length {
            return Err(BackendError::permanent_reason(format!(
                "bpa image {}: the bpa holds {held} of {} bytes under the name, ours is {} bytes; \
                 refusing to overwrite it",
                self.name, record.image_length, self.length
            )));
        }
        if record.offset() > record.image_length {
            return Err(BackendError::permanent_reason(format!(
                "bpa image {}: the bpa reports {} bytes held of {}",
                self.name,
                record.offset(),
                record.image_length
            )));
        }
        if let Some(theirs) = record.digest_tag()
            && theirs != self.tag
        {
            return Err(BackendError::permanent_reason(format!(
                "bpa image {}: the bpa holds {held} tagged {theirs} under the name, ours is {}; \
                 refusing to overwrite it",
                self.name, self.tag
            )));
        }
        Ok(())
    }
}

/// The BPA's record of an image, read tolerantly: the agent keeps `image_offset` and
/// `upload_complete` as optional.
#[derive(Debug, Clone, Default, Deserialize)]
struct Record {
    #[serde(default)]
    image_offset: Option<u64>,
    #[serde(default)]
    image_length: u64,
    #[serde(default)]
    upload_complete: Option<bool>,
    #[serde(default)]
    description: Description,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct Description {
    #[serde(default)]
    image_records: Vec<serde_json::Map<String, serde_json::Value>>,
}

impl Record {
    fn offset(&self) -> u64 {
        self.image_offset.unwrap_or(0)
    }

    fn is_complete(&self) -> bool {
        self.upload_complete == Some(true)
    }

    /// The `sha256:` tag of its first image record, when it has one (others tag by version).
    fn digest_tag(&self) -> Option<&str> {
        let tag = self.description.image_records.first()?.get("tag")?.as_str()?;
        tag.starts_with("sha256:").then_some(tag)
    }
}

enum Patched {
    /// Accepted; the BPA's offset is now this.
    To(u64),
    /// `409`: the offset was not the BPA's.
    Conflict(BackendError),
    /// Unreachable, cut, or 5xx: worth another try from the BPA's offset.
    Failed(BackendError),
}

/// Connection errors and these statuses are the BPA being down or busy.
fn retryable(status: StatusCode) -> bool {
    status.is_server_error() || status == StatusCode::REQUEST_TIMEOUT || status == StatusCode::TOO_MANY_REQUESTS
}

/// A response, read whole (the BPA's answers are small records or empty).
struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Reply {
    async fn of(sent: reqwest::Result<reqwest::Response>) -> reqwest::Result<Self> {
        let response = sent?;
        let (status, headers) = (response.status(), response.headers().clone());
        let body = response.bytes().await?;
        Ok(Self { status, headers, body })
    }

    fn upload_offset(&self) -> Option<u64> {
        self.headers.get(UPLOAD_OFFSET)?.to_str().ok()?.trim().parse().ok()
    }

    fn text(&self) -> String {
        let text = String::from_utf8_lossy(&self.body);
        let text = text.trim();
        match text.char_indices().nth(ERROR_BODY_CHARS) {
            Some((end, _)) => format!("{}…", &text[..end]),
            None => text.to_string(),
        }
    }

    /// The error this reply is: `Transient` when the BPA is down or busy, `Permanent` otherwise.
    fn error(&self, method: &str, url: &Url) -> BackendError {
        let message = format!("bpa {method} {url}: {}: {}", self.status, self.text());
        if retryable(self.status) {
            BackendError::transient_reason(message)
        } else {
            BackendError::permanent_reason(message)
        }
    }
}

/// `len` bytes of the file from `offset`.
async fn read_chunk(file: &mut tokio::fs::File, offset: u64, len: u64) -> std::io::Result<Bytes> {
    file.seek(SeekFrom::Start(offset)).await?;
    let mut buf = Vec::with_capacity(len as usize);
    let read = (&mut *file).take(len).read_to_end(&mut buf).await?;
    if read as u64 != len {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("{read} bytes at offset {offset}, expected {len}: the file changed"),
        ));
    }
    Ok(buf.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn package(name: &str, version: &str, kind: PackageKind) -> Package {
        Package {
            name: name.try_into().unwrap(),
            version: version.try_into().unwrap(),
            kind,
            sha256: "ab".repeat(32).try_into().unwrap(),
            size: 1,
            object_key: String::new(),
            chart: None,
            render: None,
        }
    }

    #[test]
    fn image_names_are_name_dash_version_in_the_bpas_alphabet() {
        assert_eq!(image_name(&package("kubelet", "1.29.1", PackageKind::Binary)), "kubelet-1.29.1");
        assert_eq!(image_name(&package("kubelet", "1.29.1+k3s1", PackageKind::Binary)), "kubelet-1.29.1_k3s1");
        assert_eq!(image_name(&package("ubuntu_22.04", "2024~rc1", PackageKind::OsImage)), "ubuntu_22.04-2024_rc1");
        assert_eq!(sanitize("a/b c?d#é"), "a_b_c_d__");
    }

    #[test]
    fn kinds_name_their_collection_and_type() {
        let cases = [
            (PackageKind::Binary, ImageKind::Binary, "binary_images", "binary"),
            (PackageKind::Container, ImageKind::Container, "container_images", "container"),
            (PackageKind::OsImage, ImageKind::Os, "os_images", "os"),
        ];
        for (package, kind, collection, json) in cases {
            assert_eq!(ImageKind::of(package), kind);
            assert_eq!(kind.collection(), collection);
            assert_eq!(kind.as_str(), json);
        }
    }

    #[test]
    fn urls_are_built_segment_by_segment() {
        let bpa = BpaUploader::new("http://10.0.0.2:9015", "alpha", "beta").unwrap();
        assert_eq!(
            bpa.collection_url(ImageKind::Os).as_str(),
            "http://10.0.0.2:9015/v1/baremetalcluster/alpha/beta/os_images"
        );
        assert_eq!(
            bpa.image_url(ImageKind::Binary, "kubelet-1.29.1").as_str(),
            "http://10.0.0.2:9015/v1/baremetalcluster/alpha/beta/binary_images/kubelet-1.29.1"
        );
        // A base with a path (behind a proxy) keeps it; odd names are escaped, not spliced in.
        let bpa = BpaUploader::new("https://gw.example/bpa/?x=1", "my owner", "c/1").unwrap();
        assert_eq!(
            bpa.image_url(ImageKind::Container, "app-1").as_str(),
            "https://gw.example/bpa/v1/baremetalcluster/my%20owner/c%2F1/container_images/app-1"
        );
    }

    #[test]
    fn bad_bases_are_refused() {
        for (base, owner, cluster) in
            [("10.0.0.2:9015", "o", "c"), ("ftp://h/", "o", "c"), ("not a url", "o", "c"), ("http://h", "", "c")]
        {
            let err = BpaUploader::new(base, owner, cluster).unwrap_err();
            assert!(matches!(err, BackendError::Permanent { .. }), "{base}: {err:?}");
        }
    }

    #[test]
    fn records_read_tolerantly_and_name_their_digest() {
        let record: Record = serde_json::from_str(
            r#"{"image_name":"k-1","image_offset":null,"image_length":10,"upload_complete":null,
                "description":{"image_records":[{"repo":"k","tag":"sha256:abc"}]}}"#,
        )
        .unwrap();
        assert_eq!((record.offset(), record.is_complete(), record.digest_tag()), (0, false, Some("sha256:abc")));
        let record: Record =
            serde_json::from_str(r#"{"image_length":3,"description":{"image_records":[{"tag":"2"}]}}"#).unwrap();
        assert_eq!(record.digest_tag(), None);

        let ours = Identity { name: "k-1".into(), length: 10, tag: "sha256:abc".into() };
        let other = |json: &str| ours.check(&serde_json::from_str(json).unwrap());
        assert!(other(r#"{"image_length":10,"upload_complete":true}"#).is_ok());
        let err = other(r#"{"image_length":11,"upload_complete":true}"#).unwrap_err().to_string();
        assert!(err.contains("complete image of 11 bytes") && err.contains("ours is 10 bytes"), "{err}");
        let err = other(r#"{"image_length":10,"description":{"image_records":[{"tag":"sha256:def"}]}}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("sha256:def") && err.contains("sha256:abc"), "{err}");
        assert!(other(r#"{"image_length":10,"image_offset":11}"#).is_err());
    }
}
