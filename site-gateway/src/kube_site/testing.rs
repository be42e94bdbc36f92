//! Fixtures for the kube backend's tests: a backend whose API server is a mock the test answers
//! request by request.

use http::{Method, Request, Response, StatusCode};
use k8s_openapi::ByteString;
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};
use tower_test::mock;

use super::{KubeSite, KubeSiteConfig, UserData};
use crate::cache::ArtifactCache;

pub(super) type Handle = mock::Handle<Request<Body>, Response<Body>>;

/// A backend whose API server is a mock that the test answers request by request.
pub(super) fn mocked(user_data: UserData) -> (KubeSite, Handle, tempfile::TempDir) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = KubeSiteConfig::new("edge-01", "metal3", dir.path().join("state"));
    cfg.user_data = user_data;
    let site =
        KubeSite::new(Client::new(service, "metal3"), cfg, ArtifactCache::new(dir.path().join("cache"))).unwrap();
    (site, handle, dir)
}

/// The next request: method, path and query, and its JSON body (Null when empty).
pub(super) async fn next(handle: &mut Handle, reply: (StatusCode, Value)) -> (Method, String, Value) {
    let (req, send) = handle.next_request().await.expect("a request");
    let (method, uri) = (req.method().clone(), req.uri().to_string());
    let bytes = req.into_body().collect_bytes().await.unwrap();
    let body = if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).unwrap() };
    let response = Response::builder().status(reply.0).body(Body::from(serde_json::to_vec(&reply.1).unwrap()));
    send.send_response(response.unwrap());
    (method, uri, body)
}

pub(super) fn b64(s: &str) -> String {
    serde_json::to_value(ByteString(s.as_bytes().to_vec())).unwrap().as_str().unwrap().to_string()
}

pub(super) fn not_found() -> (StatusCode, Value) {
    (
        StatusCode::NOT_FOUND,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"}),
    )
}

/// A server-side apply, never forced: the query kube-rs sends for it.
pub(super) const APPLY_QUERY: &str = "?&fieldManager=landfall-gateway";
