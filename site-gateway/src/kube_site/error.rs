//! How an error of the site's Kubernetes API becomes a [`BackendError`]: whether trying again
//! may help.

use crate::backend::BackendError;

/// How the API server's server-side apply begins the message of an applied object that does not
/// fit the kind's schema.
const TYPED_PATCH_FAILED: &str = "failed to create typed patch object";

/// Whether trying again may help: the server rejecting an object (schema, conflict with another
/// field manager, forbidden, not found) will not; an unreachable, overloaded or failing one may.
pub(super) fn kube_error(context: &str, e: kube::Error) -> BackendError {
    match e {
        kube::Error::Api(status) => {
            let message = if status.message.is_empty() { status.reason.clone() } else { status.message.clone() };
            let message = format!("{context}: {message}");
            match status.code {
                // The server cannot make the applied object fit its schema (a string where an
                // integer belongs, a field the schema does not declare), but says so with a 500:
                // kubernetes/kubernetes#139253.
                500 if status.message.contains(TYPED_PATCH_FAILED) => BackendError::permanent_reason(message),
                408 | 429 | 500..=599 => BackendError::transient_reason(message),
                _ => BackendError::permanent_reason(message),
            }
        }
        e @ (kube::Error::BuildRequest(_) | kube::Error::HttpError(_)) => BackendError::permanent(context, e),
        e => BackendError::transient(context, e),
    }
}
