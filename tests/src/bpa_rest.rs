//! A stand-in for the ICN BPA's REST agent (`cmd/bpa-restapi-agent`): its image upload API over
//! real HTTP on a free port, records and bytes in memory, with faults to inject.
//!
//! `{url}/v1/baremetalcluster/{owner}/{cluster}/{binary_images|container_images|os_images}`:
//! - `POST {collection}` with the image's metadata → `201` and the stored record; a name the
//!   collection holds already → `409`; metadata the agent's Go types would not decode → `400`
//!   (its image records are `map[string]string`: every value a string).
//! - `GET {collection}/{image}` → `200` and the record (`image_offset`: the bytes held,
//!   `upload_complete`), `404` when unknown.
//! - `PATCH {collection}/{image}` with `Upload-Offset: n` and `Content-Type:
//!   application/offset+octet-stream` → `204` with `Upload-Offset: n + len`; an offset that is not
//!   the held length → `409`; more bytes than `image_length` → `400`. Bytes are kept as they
//!   arrive, so a transfer that breaks leaves what came before the break. The image is
//!   `upload_complete` once its offset reaches `image_length`.
//! - `DELETE {collection}/{image}` → `204`.
//!
//! Like the agent, images are keyed by collection and name, whatever the owner and cluster.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use axum::Router;
use axum::body::{Body, BodyDataStream};
use axum::extract::connect_info::Connected;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::{IncomingStream, Listener};
use futures::StreamExt;
use serde_json::{Map, Value, json};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

const COLLECTIONS: [&str; 3] = ["binary_images", "container_images", "os_images"];
const UPLOAD_OFFSET: &str = "upload-offset";
const OFFSET_OCTET_STREAM: &str = "application/offset+octet-stream";

/// A running stand-in BPA. Stops when dropped.
pub struct BpaRest {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: CancellationToken,
}

#[derive(Default)]
struct Shared {
    state: Mutex<BpaState>,
}

#[derive(Default)]
struct BpaState {
    /// By (collection, image name).
    images: HashMap<(String, String), Image>,
    bytes_received: u64,
    /// Bytes still to accept before the connection carrying the next one is dropped.
    cut_after: Option<u64>,
    /// The next PATCHes answered with this status, doing nothing.
    failing_patches: Option<(StatusCode, u32)>,
    requests: Vec<String>,
}

struct Image {
    /// The metadata as registered; offset, length and completeness are the server's.
    metadata: Map<String, Value>,
    length: u64,
    bytes: Vec<u8>,
    complete: bool,
}

impl Image {
    fn record(&self) -> Value {
        let mut record = self.metadata.clone();
        record.insert("image_offset".into(), json!(self.bytes.len()));
        record.insert("image_length".into(), json!(self.length));
        record.insert("upload_complete".into(), json!(self.complete));
        Value::Object(record)
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, BpaState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl BpaRest {
    /// Binds 127.0.0.1 on a free port and serves in a tokio task.
    pub async fn start() -> BpaRest {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the stand-in bpa");
        let addr = listener.local_addr().expect("the stand-in bpa's address");
        let shared = Arc::new(Shared::default());
        let app = Router::new()
            .route("/v1/baremetalcluster/{owner}/{cluster}/{collection}", post(register))
            .route(
                "/v1/baremetalcluster/{owner}/{cluster}/{collection}/{image}",
                get(fetch).patch(append).delete(remove),
            )
            .fallback(unknown)
            .layer(DefaultBodyLimit::disable())
            .with_state(shared.clone());
        let stop = CancellationToken::new();
        let serve = axum::serve(CuttableListener(listener), app.into_make_service_with_connect_info::<Connection>())
            .with_graceful_shutdown(stop.clone().cancelled_owned());
        tokio::spawn(async move {
            let _ = serve.await;
        });
        BpaRest { addr, shared, stop }
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The record and the bytes held of an image; `kind` is the collection, e.g. `binary_images`.
    pub fn image(&self, kind: &str, name: &str) -> Option<(Value, Vec<u8>)> {
        let state = self.shared.lock();
        state.images.get(&(kind.to_string(), name.to_string())).map(|i| (i.record(), i.bytes.clone()))
    }

    /// All the PATCH body bytes accepted so far.
    pub fn bytes_received(&self) -> u64 {
        self.shared.lock().bytes_received
    }

    /// Fault: once `n` more bytes have been accepted in all, the PATCH carrying the next byte has
    /// its connection dropped: the bytes before it are kept, the client gets no answer. Once.
    pub fn cut_after(&self, n: u64) {
        self.shared.lock().cut_after = Some(n);
    }

    /// Fault: the next `times` PATCHes are answered `status` and change nothing (a `409` as when
    /// another writer moved the offset, a `503` as a busy BPA).
    pub fn fail_patches(&self, status: u16, times: u32) {
        let status = StatusCode::from_u16(status).expect("an http status");
        self.shared.lock().failing_patches = Some((status, times));
    }

    /// Every request so far, in order: `POST /v1/…`, `GET /v1/…`, `DELETE /v1/…`, and
    /// `PATCH /v1/… offset=N len=M` (the `Upload-Offset` and `Content-Length` headers, `-` when
    /// missing).
    pub fn requests(&self) -> Vec<String> {
        self.shared.lock().requests.clone()
    }
}

impl Drop for BpaRest {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

type SharedState = State<Arc<Shared>>;

async fn register(
    State(shared): SharedState,
    Path((_owner, _cluster, collection)): Path<(String, String, String)>,
    uri: Uri,
    body: Body,
) -> Response {
    shared.lock().requests.push(format!("POST {}", uri.path()));
    if !COLLECTIONS.contains(&collection.as_str()) {
        return (StatusCode::NOT_FOUND, "404 page not found").into_response();
    }
    let body = match axum::body::to_bytes(body, 1 << 20).await {
        Ok(body) => body,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    };
    let (metadata, length) = match decode_image(&body) {
        Ok(decoded) => decoded,
        Err(why) => return (StatusCode::BAD_REQUEST, why).into_response(),
    };
    let name = metadata["image_name"].as_str().unwrap_or_default().to_string();
    let mut state = shared.lock();
    let key = (collection, name);
    if state.images.contains_key(&key) {
        return (StatusCode::CONFLICT, "Image already exists").into_response();
    }
    let image = Image { metadata, length, bytes: Vec::new(), complete: false };
    let record = image.record();
    state.images.insert(key, image);
    (StatusCode::CREATED, axum::Json(record)).into_response()
}

/// The metadata, checked as the agent's `Image` struct would decode it, and its `image_length`.
fn decode_image(body: &[u8]) -> Result<(Map<String, Value>, u64), String> {
    let Ok(Value::Object(metadata)) = serde_json::from_slice::<Value>(body) else {
        return Err("json: cannot unmarshal into Go value of type app.Image".into());
    };
    for field in ["owner", "cluster_name", "type", "image_name"] {
        if !matches!(metadata.get(field), None | Some(Value::Null | Value::String(_))) {
            return Err(format!("json: cannot unmarshal into Go struct field Image.{field} of type string"));
        }
    }
    if metadata.get("image_name").and_then(Value::as_str).is_none_or(str::is_empty) {
        return Err("image_name is required".into());
    }
    let length = match metadata.get("image_length") {
        None | Some(Value::Null) => 0,
        Some(v) => v.as_u64().ok_or("json: cannot unmarshal into Go struct field Image.image_length of type int")?,
    };
    if !matches!(metadata.get("image_offset"), None | Some(Value::Null)) && metadata["image_offset"].as_u64().is_none()
    {
        return Err("json: cannot unmarshal into Go struct field Image.image_offset of type int".into());
    }
    if !matches!(metadata.get("upload_complete"), None | Some(Value::Null | Value::Bool(_))) {
        return Err("json: cannot unmarshal into Go struct field Image.upload_complete of type bool".into());
    }
    let records = metadata.get("description").and_then(|d| d.get("image_records"));
    match records {
        None | Some(Value::Null) => {}
        Some(Value::Array(records)) => {
            for record in records {
                let Value::Object(record) = record else {
                    return Err("json: cannot unmarshal into Go struct field ImageRecordList.description.image_records of type map[string]string".into());
                };
                if let Some((key, _)) = record.iter().find(|(_, v)| !v.is_string()) {
                    return Err(format!(
                        "json: cannot unmarshal non-string into Go struct field \
                         ImageRecordList.description.image_records of type string ({key})"
                    ));
                }
            }
        }
        Some(_) => return Err("json: cannot unmarshal into Go struct field ImageRecordList.description.image_records of type []map[string]string".into()),
    }
    Ok((metadata, length))
}

async fn fetch(
    State(shared): SharedState,
    Path((_owner, _cluster, collection, name)): Path<(String, String, String, String)>,
    uri: Uri,
) -> Response {
    let mut state = shared.lock();
    state.requests.push(format!("GET {}", uri.path()));
    match state.images.get(&(collection, name)) {
        Some(image) => (StatusCode::OK, axum::Json(image.record())).into_response(),
        None => (StatusCode::NOT_FOUND, "Image not found").into_response(),
    }
}

async fn remove(
    State(shared): SharedState,
    Path((_owner, _cluster, collection, name)): Path<(String, String, String, String)>,
    uri: Uri,
) -> Response {
    let mut state = shared.lock();
    state.requests.push(format!("DELETE {}", uri.path()));
    match state.images.remove(&(collection, name)) {
        Some(_) => StatusCode::NO_CONTENT.into_response(),
        None => (StatusCode::NOT_FOUND, "Image not found").into_response(),
    }
}

async fn append(
    State(shared): SharedState,
    ConnectInfo(connection): ConnectInfo<Connection>,
    Path((_owner, _cluster, collection, name)): Path<(String, String, String, String)>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    let offset = header(UPLOAD_OFFSET).and_then(|v| v.parse::<u64>().ok());
    let declared = header(header::CONTENT_LENGTH.as_str()).and_then(|v| v.parse::<u64>().ok());
    let shown = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
    let key = (collection, name);
    let refusal = {
        let mut state = shared.lock();
        state.requests.push(format!("PATCH {} offset={} len={}", uri.path(), shown(offset), shown(declared)));
        let injected = match &mut state.failing_patches {
            Some((status, times)) if *times > 0 => {
                *times -= 1;
                Some(*status)
            }
            _ => None,
        };
        match (injected, offset, state.images.get(&key)) {
            (Some(status), ..) => Some((status, format!("injected {status}"), None)),
            _ if header(header::CONTENT_TYPE.as_str()) != Some(OFFSET_OCTET_STREAM) => {
                Some((StatusCode::UNSUPPORTED_MEDIA_TYPE, format!("Content-Type must be {OFFSET_OCTET_STREAM}"), None))
            }
            (None, None, _) => Some((StatusCode::BAD_REQUEST, "Upload-Offset is required".into(), None)),
            (None, _, None) => Some((StatusCode::NOT_FOUND, "Image not found".into(), None)),
            (None, Some(offset), Some(image)) => {
                let held = image.bytes.len() as u64;
                if offset != held {
                    Some((
                        StatusCode::CONFLICT,
                        format!("offset mismatch: the image holds {held}, got {offset}"),
                        Some(held),
                    ))
                } else if declared.is_some_and(|len| offset + len > image.length) {
                    Some((StatusCode::BAD_REQUEST, format!("more than image_length {}", image.length), Some(held)))
                } else {
                    None
                }
            }
        }
    };
    if let Some((status, why, held)) = refusal {
        return refuse(status, why, held, body.into_data_stream()).await;
    }
    let mut at = offset.expect("checked above");

    let mut stream = body.into_data_stream();
    while let Some(frame) = stream.next().await {
        // A client that went away leaves what arrived before it did.
        let Ok(frame) = frame else { return StatusCode::BAD_REQUEST.into_response() };
        let accepted = shared.lock().accept(&key, &mut at, &frame);
        match accepted {
            Accepted::All => {}
            Accepted::Cut => {
                connection.drop_it();
                return StatusCode::INTERNAL_SERVER_ERROR.into_response();
            }
            Accepted::Refused(status, why, held) => return refuse(status, why, held, stream).await,
        }
    }
    let mut state = shared.lock();
    if let Some(image) = state.images.get_mut(&key)
        && at == image.length
    {
        // An empty image is complete with its first (empty) PATCH.
        image.complete = true;
    }
    let mut response = StatusCode::NO_CONTENT.into_response();
    response.headers_mut().insert(UPLOAD_OFFSET, HeaderValue::from(at));
    response
}

/// What became of one piece of a PATCH body.
enum Accepted {
    All,
    /// A prefix was kept, then the cut fault struck: the connection is to be dropped.
    Cut,
    Refused(StatusCode, String, Option<u64>),
}

impl BpaState {
    /// Appends `frame` to the image if it holds exactly `at` bytes, and moves `at` on.
    fn accept(&mut self, key: &(String, String), at: &mut u64, frame: &[u8]) -> Accepted {
        let Some(image) = self.images.get_mut(key) else {
            return Accepted::Refused(StatusCode::NOT_FOUND, "Image deleted".into(), None);
        };
        let held = image.bytes.len() as u64;
        if held != *at {
            let why = format!("offset mismatch: the image holds {held}, this upload is at {at}");
            return Accepted::Refused(StatusCode::CONFLICT, why, Some(held));
        }
        if held + frame.len() as u64 > image.length {
            return Accepted::Refused(
                StatusCode::BAD_REQUEST,
                format!("more than image_length {}", image.length),
                Some(held),
            );
        }
        let take = match self.cut_after {
            Some(left) => left.min(frame.len() as u64) as usize,
            None => frame.len(),
        };
        image.bytes.extend_from_slice(&frame[..take]);
        *at += take as u64;
        self.bytes_received += take as u64;
        image.complete = *at == image.length;
        if let Some(left) = &mut self.cut_after {
            *left -= take as u64;
            if take < frame.len() {
                self.cut_after = None;
                return Accepted::Cut;
            }
        }
        Accepted::All
    }
}

/// Answers `status` once the request's body is read: a client still sending would otherwise see
/// its connection reset instead of the answer.
async fn refuse(status: StatusCode, why: String, held: Option<u64>, mut stream: BodyDataStream) -> Response {
    while let Some(Ok(_)) = stream.next().await {}
    let mut response = (status, why).into_response();
    if let Some(held) = held {
        response.headers_mut().insert(UPLOAD_OFFSET, HeaderValue::from(held));
    }
    response
}

async fn unknown(State(shared): SharedState, method: axum::http::Method, uri: Uri) -> Response {
    shared.lock().requests.push(format!("{method} {}", uri.path()));
    (StatusCode::NOT_FOUND, "404 page not found").into_response()
}

/// A TCP listener whose connections a handler can drop: each one's [`Connection`] is the switch.
struct CuttableListener(TcpListener);

/// The connection a request came on; [`Connection::drop_it`] makes its reads and writes fail, so
/// the server closes it without answering.
#[derive(Debug, Clone, Default)]
struct Connection {
    dropped: Arc<AtomicBool>,
}

impl Connection {
    fn drop_it(&self) {
        self.dropped.store(true, Ordering::SeqCst);
    }
}

impl Listener for CuttableListener {
    type Io = CuttableStream;
    type Addr = Connection;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.0.accept().await {
                Ok((stream, _)) => {
                    let connection = Connection::default();
                    return (CuttableStream { stream, dropped: connection.dropped.clone() }, connection);
                }
                // Out of file descriptors and the like: wait a little, as axum's own listener does.
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<Connection> {
        Ok(Connection::default())
    }
}

impl Connected<IncomingStream<'_, CuttableListener>> for Connection {
    fn connect_info(stream: IncomingStream<'_, CuttableListener>) -> Self {
        stream.remote_addr().clone()
    }
}

struct CuttableStream {
    stream: TcpStream,
    dropped: Arc<AtomicBool>,
}

impl CuttableStream {
    fn check(&self) -> io::Result<()> {
        match self.dropped.load(Ordering::SeqCst) {
            true => Err(io::Error::new(io::ErrorKind::ConnectionReset, "the stand-in bpa dropped the connection")),
            false => Ok(()),
        }
    }
}

impl AsyncRead for CuttableStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        self.check()?;
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for CuttableStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.check()?;
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.check()?;
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
