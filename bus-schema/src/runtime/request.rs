//! Asking a service: one core request and its answer, a refusal (the `Landfall-Error` header
//! [`super::error_reply`] sets) read as [`RequestError::Refused`], so no caller reads that
//! header by hand. A request made of a site ([`Bus::request_site`]) is answered into a reply
//! subject scoped to that site, the only replies a site may send across its leaf node's link.

use std::time::Duration;

use async_nats::RequestErrorKind;
use bytes::Bytes;

use super::connect::Bus;
use super::error::ErrorKind;
use super::serve::Reply;
use crate::names::headers;

/// Why a request got no usable answer.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// Nobody listens on the subject: the service is not running (or not for this site).
    #[error("no service answers on {subject}")]
    NoResponders { subject: String },
    /// A service listens but did not answer in time.
    #[error("no answer on {subject} within {timeout:?}")]
    TimedOut { subject: String, timeout: Duration },
    /// The request could not be sent (connection lost, payload too large, bad subject).
    #[error("request {subject}")]
    Failed {
        subject: String,
        #[source]
        source: async_nats::RequestError,
    },
    /// The service answered with a refusal; `reason` is its own words.
    #[error("{reason}")]
    Refused { subject: String, reason: String },
    /// The service answered, but not with what was asked for.
    #[error("the answer on {subject} is not a {expected}")]
    Malformed {
        subject: String,
        expected: &'static str,
        #[source]
        source: prost::DecodeError,
    },
}

impl RequestError {
    /// No answer (nobody listens, too slow, not sent) may come next time; a refusal or a
    /// malformed answer is the service's word on this request.
    pub fn kind(&self) -> ErrorKind {
        match self {
            RequestError::NoResponders { .. } | RequestError::TimedOut { .. } | RequestError::Failed { .. } => {
                ErrorKind::Transient
            }
            RequestError::Refused { .. } | RequestError::Malformed { .. } => ErrorKind::Reject,
        }
    }

    fn sending(subject: &str, timeout: Duration, source: async_nats::RequestError) -> Self {
        let subject = subject.to_string();
        match source.kind() {
            RequestErrorKind::NoResponders => RequestError::NoResponders { subject },
            RequestErrorKind::TimedOut => RequestError::TimedOut { subject, timeout },
            _ => RequestError::Failed { subject, source },
        }
    }
}

/// A reply subject for one request to `site`: the site's replies to `inbox_prefix`, then the
/// unique last token of `fresh_inbox` (a new inbox of the connection).
fn site_reply(inbox_prefix: &str, site: &str, fresh_inbox: &str) -> String {
    let unique = fresh_inbox.rsplit('.').next().unwrap_or(fresh_inbox);
    format!("{}.{unique}", crate::names::site_replies(site, inbox_prefix))
}

/// The answer's headers and body, or the service's refusal.
fn answer(subject: &str, reply: async_nats::Message) -> Result<Reply, RequestError> {
    let h = reply.headers.unwrap_or_default();
    if let Some(reason) = h.get(headers::REPLY_ERROR) {
        let reason = super::serve::reply_error_text(reason.as_str());
        return Err(RequestError::Refused { subject: subject.to_string(), reason });
    }
    Ok((h, reply.payload))
}

impl Bus {
    /// Sends `payload` to the service answering on `subject` and waits up to `timeout` for its
    /// answer: the headers and body of the reply.
    ///
    /// # Errors
    /// [`RequestError::NoResponders`] or [`RequestError::TimedOut`] without an answer,
    /// [`RequestError::Refused`] when the service answered with a refusal (its reason),
    /// [`RequestError::Failed`] when the request could not be sent.
    pub async fn request(&self, subject: String, payload: Bytes, timeout: Duration) -> Result<Reply, RequestError> {
        self.send(subject, async_nats::Request::new().payload(payload), timeout).await
    }

    /// Sends a request; one made while handling a message carries the handling's trace context
    /// (the answer's span is its child).
    async fn send(
        &self,
        subject: String,
        mut request: async_nats::Request,
        timeout: Duration,
    ) -> Result<Reply, RequestError> {
        if let Some(traceparent) = super::trace::traceparent_now() {
            let mut h = async_nats::HeaderMap::new();
            h.insert(headers::TRACEPARENT, traceparent.as_str());
            request = request.headers(h);
        }
        let reply = self
            .client()
            .send_request(subject.clone(), request.timeout(Some(timeout)))
            .await
            .map_err(|e| RequestError::sending(&subject, timeout, e))?;
        answer(&subject, reply)
    }

    /// [`Bus::request`] of one site's gateway (`subject` is one of `landfall.to.<site>.rpc.…`):
    /// the answer comes back among the site's own subjects, on a reply subject for this
    /// connection ([`crate::names::site_replies`]), so the answer can cross the site's leaf
    /// node's link and no other site's can land there.
    ///
    /// # Errors
    /// As [`Bus::request`].
    pub async fn request_site(
        &self,
        site: &str,
        subject: String,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<Reply, RequestError> {
        let reply = site_reply(self.inbox_prefix(), site, &self.client().new_inbox());
        self.send(subject, async_nats::Request::new().payload(payload).inbox(reply), timeout).await
    }

    /// [`Bus::request`] with a protobuf request and answer.
    ///
    /// # Errors
    /// As [`Bus::request`], and [`RequestError::Malformed`] when the answer is not a `Resp`.
    pub async fn request_message<Req: prost::Message, Resp: prost::Message + Default>(
        &self,
        subject: String,
        request: &Req,
        timeout: Duration,
    ) -> Result<Resp, RequestError> {
        let (_, body) = self.request(subject.clone(), Bytes::from(request.encode_to_vec()), timeout).await?;
        Resp::decode(body).map_err(|source| RequestError::Malformed {
            subject,
            expected: std::any::type_name::<Resp>(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use async_nats::HeaderMap;

    use super::*;

    fn reply(h: Option<HeaderMap>, body: &'static [u8]) -> async_nats::Message {
        async_nats::Message {
            subject: "_INBOX.x".into(),
            reply: None,
            payload: Bytes::from_static(body),
            headers: h,
            status: None,
            description: None,
            length: 0,
        }
    }

    #[test]
    fn a_refusal_is_an_error_with_the_services_reason() {
        let (h, _) = crate::runtime::error_reply("no such site");
        match answer("landfall.svc.edge-01.x", reply(Some(h), b"")) {
            Err(e @ RequestError::Refused { .. }) => {
                assert_eq!(e.to_string(), "no such site");
                assert_eq!(e.kind(), ErrorKind::Reject);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_answer_keeps_its_headers_and_body() {
        let mut h = HeaderMap::new();
        h.insert(headers::CHUNK_SHA256, "abc");
        let (h, body) = answer("s", reply(Some(h), b"body")).unwrap();
        assert_eq!(h.get(headers::CHUNK_SHA256).map(|v| v.as_str()), Some("abc"));
        assert_eq!(&body[..], b"body");
        let (_, body) = answer("s", reply(None, b"")).unwrap();
        assert!(body.is_empty(), "an empty answer is an answer");
    }

    #[test]
    fn a_reply_to_a_site_is_scoped_to_it_and_unique() {
        let reply = site_reply("_INBOX_UKC", "edge-01", "_INBOX_UKC.Zq3x9");
        assert_eq!(reply, "landfall.svc.edge-01.reply._INBOX_UKC.Zq3x9");
        assert_ne!(reply, site_reply("_INBOX_UKC", "edge-01", "_INBOX_UKC.Ab7k2"));
    }

    #[test]
    fn no_answer_says_whether_anyone_listens() {
        let timeout = Duration::from_secs(5);
        let none = RequestError::sending("s", timeout, RequestErrorKind::NoResponders.into());
        assert!(matches!(none, RequestError::NoResponders { .. }), "{none:?}");
        let slow = RequestError::sending("s", timeout, RequestErrorKind::TimedOut.into());
        assert_eq!(slow.to_string(), "no answer on s within 5s");
        assert_eq!(slow.kind(), ErrorKind::Transient);
        let other = RequestError::sending("s", timeout, RequestErrorKind::Other.into());
        assert!(std::error::Error::source(&other).is_some(), "the cause is kept");
    }
}
