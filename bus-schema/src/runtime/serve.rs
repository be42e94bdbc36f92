//! Answering core requests: [`serve_requests`] runs a service's queue group until shutdown,
//! and [`error_reply`] is how a refusal is answered.

use std::future::Future;
use std::sync::Arc;

use async_nats::HeaderMap;
use bytes::Bytes;
use futures::StreamExt;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, warn};

use super::connect::Bus;
use super::error::BusError;
use crate::envelope::trace_id;
use crate::names::headers;

/// The answer to a core request: headers and body.
pub type Reply = (HeaderMap, Bytes);

/// A failed request's answer: an empty body, and the reason in the `Landfall-Error` header.
/// A header holds one line: a reason of several (helm's, for one) travels with each line break
/// written `\n` (and `\` as `\\`), which [`reply_error_text`] reads back.
pub fn error_reply(reason: &str) -> Reply {
    let mut one_line = String::with_capacity(reason.len());
    for c in reason.chars() {
        match c {
            '\\' => one_line.push_str("\\\\"),
            '\n' => one_line.push_str("\\n"),
            '\r' => {}
            c => one_line.push(c),
        }
    }
    let mut h = HeaderMap::new();
    h.insert(headers::REPLY_ERROR, one_line.as_str());
    (h, Bytes::new())
}

/// The reason an [`error_reply`] carries, its line breaks back.
pub fn reply_error_text(header: &str) -> String {
    let mut out = String::with_capacity(header.len());
    let mut chars = header.chars();
    while let Some(c) = chars.next() {
        match (c, c == '\\') {
            (_, true) => match chars.next() {
                Some('n') => out.push('\n'),
                Some(other) => out.push(other),
                None => out.push('\\'),
            },
            (c, false) => out.push(c),
        }
    }
    out
}

/// Answers the core requests on `subject` (a queue group `group` shared by the service's
/// replicas), at most `concurrency` at once, until `shutdown`. `answer` gets the subject the
/// request came on and its payload. Requests in hand when `shutdown` comes are answered first.
pub async fn serve_requests<F, Fut>(
    bus: &Bus,
    subject: String,
    group: &str,
    concurrency: usize,
    shutdown: CancellationToken,
    answer: F,
) -> Result<(), BusError>
where
    F: Fn(async_nats::Subject, Bytes) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Reply> + Send + 'static,
{
    let mut sub = bus
        .client()
        .queue_subscribe(subject.clone(), group.to_string())
        .await
        .map_err(|e| BusError::Request { subject: subject.clone(), source: Box::new(e) })?;
    let answer = Arc::new(answer);
    let permits = Arc::new(tokio::sync::Semaphore::new(concurrency.max(1)));
    let mut tasks = JoinSet::new();
    loop {
        let msg = tokio::select! {
            _ = shutdown.cancelled() => break,
            m = sub.next() => match m { Some(m) => m, None => break },
        };
        let Some(reply) = msg.reply else { continue };
        let Ok(permit) = permits.clone().acquire_owned().await else { break };
        let (answer, client, subject, group) =
            (answer.clone(), bus.client().clone(), subject.clone(), group.to_string());
        // A request's span has the fields of a consumed message's, those its headers give.
        let header = |name: &str| msg.headers.as_ref().and_then(|h| h.get(name)).map(|v| v.as_str().to_string());
        let (msg_id, traceparent) = (header(headers::MSG_ID), header(headers::TRACEPARENT));
        let span = tracing::error_span!(
            "handle",
            consumer = group,
            subject = %msg.subject,
            msg_id = msg_id.as_deref(),
            trace_id = traceparent.as_deref().and_then(trace_id),
        );
        tasks.spawn(
            async move {
                let asked = msg.subject.to_string();
                let work = answer(msg.subject, msg.payload);
                let (headers, body) = super::trace::answered(&group, &asked, traceparent.as_deref(), work).await;
                if let Err(e) = client.publish_with_headers(reply, headers, body).await {
                    warn!(%subject, error = %e, "cannot answer request");
                }
                drop(permit);
            }
            .instrument(span),
        );
        while tasks.try_join_next().is_some() {}
    }
    let _ = sub.unsubscribe().await;
    while tasks.join_next().await.is_some() {}
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_of_several_lines_travels_in_one_header_and_comes_back_whole() {
        let reason = "helm refused the chart: values don't meet the schema:\nc:\n- at '/size': minimum\\max\r\n";
        let (h, _) = error_reply(reason);
        let sent = h.get(headers::REPLY_ERROR).unwrap().as_str().to_string();
        assert!(!sent.contains('\n') && !sent.contains('\r'), "{sent}");
        assert_eq!(reply_error_text(&sent), reason.replace('\r', ""));
    }
}
