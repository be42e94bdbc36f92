//! The artifact store: package bytes, content-addressed (`sha256/<hex>`), in a local directory
//! or an S3-compatible bucket, through the `object_store` crate.
//!
//! An upload streams the file into a scratch object while hashing it, in parts of
//! [`PART_SIZE`] with at most [`PART_CONCURRENCY`] in flight, so memory stays bounded whatever
//! the file's size. The scratch object then becomes `sha256/<hex>`; if that object exists
//! already, the bytes were uploaded before and the scratch object is dropped.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bus_schema::domain::Sha256 as Sha256Digest;
use bytes::Bytes;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::prefix::PrefixStore;
use object_store::{ObjectStore, ObjectStoreExt, WriteMultipart};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt};

/// Parts an upload is cut into (S3's smallest part is 5 MiB).
pub const PART_SIZE: usize = 8 * 1024 * 1024;
/// Parts of one upload in flight at once.
pub const PART_CONCURRENCY: usize = 3;
/// What an upload reads from its file at a time.
const READ_SIZE: usize = 1024 * 1024;
/// Where uploads are written before they are known by their digest.
const SCRATCH_PREFIX: &str = "uploads";
/// Where artifacts live, by digest.
pub const OBJECT_PREFIX: &str = "sha256/";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("artifact store {url}: {source}")]
    Store {
        url: String,
        #[source]
        source: object_store::Error,
    },
    #[error("artifact store location {0:?}: expected a directory path, file:///path or s3://bucket[/prefix]")]
    BadUrl(String),
    #[error("create the artifact directory {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("read the file to upload")]
    Read(#[source] std::io::Error),
    #[error(
        "the file changed while it was uploaded (sha256 {before} when hashed, {after} when sent); nothing was kept"
    )]
    Changed { before: String, after: String },
    #[error("{key} is not an artifact object key (sha256/<64 hex digits>)")]
    BadKey { key: String },
}

/// How to reach an S3-compatible store beyond what the usual AWS variables say.
#[derive(Clone, Default)]
pub struct S3Options {
    /// e.g. `http://127.0.0.1:9000`; `AWS_ENDPOINT` when unset.
    pub endpoint: Option<String>,
    /// `AWS_REGION` / `AWS_DEFAULT_REGION` when unset, else `us-east-1`.
    pub region: Option<String>,
    /// Allow plain http to the endpoint (a store on a trusted local network).
    pub allow_http: bool,
    /// Credentials given by a program (`AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` otherwise).
    pub credentials: Option<(String, String)>,
}

impl std::fmt::Debug for S3Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Options")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("allow_http", &self.allow_http)
            .field("credentials", &self.credentials.as_ref().map(|(id, _)| (id, "<hidden>")))
            .finish()
    }
}

/// Where artifacts are kept.
#[derive(Clone)]
pub struct ArtifactStore {
    store: Arc<dyn ObjectStore>,
    url: String,
    /// S3 renames by CopyObject, which stops at 5 GiB: files are uploaded straight to their key.
    copy_limited: bool,
}

impl std::fmt::Debug for ArtifactStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArtifactStore").field("url", &self.url).finish()
    }
}

/// An artifact now in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub sha256: String,
    pub size: u64,
    pub object_key: String,
    /// `false` when the store held these bytes already: nothing new was kept.
    pub new: bool,
}

/// The object key of an artifact with this digest.
pub fn object_key(sha256: &str) -> String {
    format!("{OBJECT_PREFIX}{sha256}")
}

/// Whether `key` is an artifact's object key (the only objects the store hands out).
pub fn is_object_key(key: &str) -> bool {
    key.strip_prefix(OBJECT_PREFIX).is_some_and(|hex| Sha256Digest::try_from(hex).is_ok())
}

/// Makes ring rustls's process-wide crypto provider (the S3 and Kubernetes clients' TLS ask for it).
pub fn install_tls_provider() {
    // An error means a provider is installed already, which is as good.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

impl ArtifactStore {
    /// Opens the store at `location`: a directory path, `file:///path`, or
    /// `s3://bucket[/prefix]` (credentials from `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`).
    pub fn open(location: &str, s3: &S3Options) -> Result<Self, StoreError> {
        if let Some(rest) = location.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(StoreError::BadUrl(location.to_string()));
            }
            install_tls_provider();
            let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
            if let Some(endpoint) = &s3.endpoint {
                builder = builder.with_endpoint(endpoint);
            }
            let region = s3
                .region
                .clone()
                .or_else(|| std::env::var("AWS_REGION").ok())
                .or_else(|| std::env::var("AWS_DEFAULT_REGION").ok())
                .unwrap_or_else(|| "us-east-1".to_string());
            builder = builder.with_region(region);
            if s3.allow_http {
                builder = builder.with_allow_http(true);
            }
            if let Some((key_id, secret)) = &s3.credentials {
                builder = builder.with_access_key_id(key_id).with_secret_access_key(secret);
            }
            let url = location.trim_end_matches('/').to_string();
            let s3 = builder.build().map_err(|source| StoreError::Store { url: url.clone(), source })?;
            let prefix = prefix.trim_matches('/');
            let store: Arc<dyn ObjectStore> =
                if prefix.is_empty() { Arc::new(s3) } else { Arc::new(PrefixStore::new(s3, prefix)) };
            return Ok(Self { store, url, copy_limited: true });
        }
        let path = match location.strip_prefix("file://") {
            Some(p) => PathBuf::from(p),
            None if location.contains("://") => return Err(StoreError::BadUrl(location.to_string())),
            None => PathBuf::from(location),
        };
        Self::local(&path)
    }

    /// A store in a local directory, created when missing.
    pub fn local(dir: &Path) -> Result<Self, StoreError> {
        std::fs::create_dir_all(dir).map_err(|source| StoreError::CreateDir { path: dir.into(), source })?;
        let dir = dir.canonicalize().map_err(|source| StoreError::CreateDir { path: dir.into(), source })?;
        let url = format!("file://{}", dir.display());
        let fs =
            LocalFileSystem::new_with_prefix(&dir).map_err(|source| StoreError::Store { url: url.clone(), source })?;
        Ok(Self { store: Arc::new(fs), url, copy_limited: false })
    }

    /// The store's location, without credentials.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn err(&self, source: object_store::Error) -> StoreError {
        StoreError::Store { url: self.url.clone(), source }
    }

    /// Uploads a file. Into a directory it streams once (as [`Self::upload`]); into S3, whose
    /// copy stops at 5 GiB, it hashes the file first and streams it straight to its key,
    /// checking the digest again on the way (a file that changed in between is not kept).
    pub async fn upload_file(&self, path: &Path) -> Result<Stored, StoreError> {
        let open = || async { tokio::fs::File::open(path).await.map_err(StoreError::Read) };
        if !self.copy_limited {
            return self.upload(tokio::io::BufReader::with_capacity(READ_SIZE, open().await?)).await;
        }
        let (sha256, size) = hash_file(path).await.map_err(StoreError::Read)?;
        let key = object_key(&sha256);
        let target = ObjectPath::from(key.as_str());
        match self.store.head(&target).await {
            Ok(_) => return Ok(Stored { sha256, size, object_key: key, new: false }),
            Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(self.err(e)),
        }
        let (after, sent) = self.stream(open().await?, &target).await?;
        if after != sha256 || sent != size {
            let _ = self.store.delete(&target).await;
            return Err(StoreError::Changed { before: sha256, after });
        }
        Ok(Stored { sha256, size, object_key: key, new: true })
    }

    /// Streams `reader` into the store, hashing as it goes, and files it under its digest.
    pub async fn upload(&self, reader: impl AsyncRead + Unpin) -> Result<Stored, StoreError> {
        let scratch = ObjectPath::from(format!("{SCRATCH_PREFIX}/{}", uuid::Uuid::new_v4()));
        let (sha256, size) = self.stream(reader, &scratch).await?;
        let key = object_key(&sha256);
        let target = ObjectPath::from(key.as_str());
        let new = match self.store.head(&target).await {
            Ok(_) => {
                self.store.delete(&scratch).await.map_err(|e| self.err(e))?;
                false
            }
            Err(object_store::Error::NotFound { .. }) => {
                self.store.rename(&scratch, &target).await.map_err(|e| self.err(e))?;
                true
            }
            Err(e) => return Err(self.err(e)),
        };
        Ok(Stored { sha256, size, object_key: key, new })
    }

    /// Writes `reader` to `location` in parts, hashing it; its digest and size.
    async fn stream(
        &self,
        mut reader: impl AsyncRead + Unpin,
        location: &ObjectPath,
    ) -> Result<(String, u64), StoreError> {
        let upload = self.store.put_multipart(location).await.map_err(|e| self.err(e))?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_SIZE);
        let mut hasher = Sha256::new();
        let mut size = 0u64;
        let mut buf = vec![0u8; READ_SIZE];
        let read = async {
            loop {
                let n = reader.read(&mut buf).await.map_err(StoreError::Read)?;
                if n == 0 {
                    return Ok::<_, StoreError>(());
                }
                hasher.update(&buf[..n]);
                size += n as u64;
                writer.wait_for_capacity(PART_CONCURRENCY).await.map_err(|e| self.err(e))?;
                writer.write(&buf[..n]);
            }
        };
        if let Err(e) = read.await {
            // The scratch object never appears; a failed abort leaves parts the store expires.
            let _ = writer.abort().await;
            return Err(e);
        }
        writer.finish().await.map_err(|e| self.err(e))?;
        Ok((Sha256Digest::hex(&hasher.finalize()), size))
    }

    /// The object's size, or `None` when the store does not hold it.
    pub async fn size(&self, key: &str) -> Result<Option<u64>, StoreError> {
        let path = self.artifact_path(key)?;
        match self.store.head(&path).await {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.err(e)),
        }
    }

    /// One byte range of an artifact.
    pub async fn read(&self, key: &str, range: Range<u64>) -> Result<Bytes, StoreError> {
        let path = self.artifact_path(key)?;
        self.store.get_range(&path, range).await.map_err(|e| self.err(e))
    }

    /// Writes an object under an artifact key as it is given, bypassing the upload's digest:
    /// for tests and benchmarks that need a store with bytes that do not match their key.
    pub async fn put_raw(&self, key: &str, bytes: Bytes) -> Result<(), StoreError> {
        let path = self.artifact_path(key)?;
        self.store.put(&path, bytes.into()).await.map_err(|e| self.err(e))?;
        Ok(())
    }

    fn artifact_path(&self, key: &str) -> Result<ObjectPath, StoreError> {
        if !is_object_key(key) {
            return Err(StoreError::BadKey { key: key.to_string() });
        }
        Ok(ObjectPath::from(key))
    }
}

/// The sha256 of `bytes`, in lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256Digest::hex(&Sha256::digest(bytes))
}

/// The sha256 and size of a local file, read in pieces.
pub async fn hash_file(path: &Path) -> std::io::Result<(String, u64)> {
    let mut file = tokio::fs::File::open(path).await?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; READ_SIZE];
    let mut size = 0u64;
    loop {
        let n = file.read(&mut buf).await?;
        if n == 0 {
            return Ok((Sha256Digest::hex(&hasher.finalize()), size));
        }
        hasher.update(&buf[..n]);
        size += n as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn uploads_by_digest_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = ArtifactStore::local(dir.path()).unwrap();
        let bytes: Vec<u8> = (0..3 * READ_SIZE + 17).map(|i| (i % 251) as u8).collect();
        let first = store.upload(bytes.as_slice()).await.unwrap();
        assert_eq!(first.sha256, sha256_hex(&bytes));
        assert_eq!(first.size, bytes.len() as u64);
        assert!(first.new);
        let again = store.upload(bytes.as_slice()).await.unwrap();
        assert_eq!((again.object_key.as_str(), again.new), (first.object_key.as_str(), false));
        assert_eq!(store.size(&first.object_key).await.unwrap(), Some(bytes.len() as u64));
        assert_eq!(store.read(&first.object_key, 5..9).await.unwrap().as_ref(), &bytes[5..9]);
        // Only the artifact is left: no scratch object.
        let files: Vec<_> = walk(dir.path());
        assert_eq!(files.len(), 1, "{files:?}");
    }

    #[test]
    fn only_artifact_keys_are_read() {
        assert!(is_object_key(&object_key(&"a".repeat(64))));
        assert!(!is_object_key("sha256/../../etc/passwd"));
        assert!(!is_object_key("uploads/x"));
        assert!(matches!(ArtifactStore::open("ftp://x", &S3Options::default()), Err(StoreError::BadUrl(_))));
        assert!(matches!(ArtifactStore::open("s3://", &S3Options::default()), Err(StoreError::BadUrl(_))));
    }

    fn walk(dir: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() { out.extend(walk(&path)) } else { out.push(path) }
        }
        out
    }
}
