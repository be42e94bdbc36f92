//! `GET /v1/events`: the events stream as Server-Sent Events, filtered by site and event
//! type, live or replayed from a time, a stream sequence or the last few events.
//!
//! Each SSE message's `id` is the event's stream sequence, so a client that reconnects with
//! `Last-Event-ID` (browsers do this by themselves) resumes right after the last event it saw:
//! nothing is missed and nothing is seen twice.

use std::convert::Infallible;
use std::time::Duration;

use async_nats::jetstream::consumer::DeliverPolicy;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use bus_schema::domain::SiteId;
use bus_schema::names;
use bus_schema::pb::EventType;
use bus_schema::runtime::EventReader;
use futures::Stream;
use serde::Deserialize;

use super::auth::{Principal, Role};
use super::state::{ApiError, ApiState};
use crate::views::event::event_json;

/// What a client asks of the events stream.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// Only these sites' events (comma-separated site ids; `fleet` for fleet-wide events).
    pub site: Option<String>,
    /// Only these event types (comma-separated: `SiteInstalled`, `landfall.v1.SiteInstalled`
    /// or `site.installed`).
    #[serde(rename = "type")]
    pub types: Option<String>,
    /// Only events correlated with this command id.
    pub correlation: Option<String>,
    /// Replay from this time (RFC 3339) on.
    pub since: Option<String>,
    /// Replay from this stream sequence on.
    pub from_seq: Option<u64>,
    /// Replay the stream's last N events (those of them the filters match), then go on live.
    pub last: Option<u64>,
}

/// At most this many subject filters (sites × types) in one request.
pub const MAX_FILTERS: usize = 256;

/// At most this many of the latest events replayed (`last`): a dashboard's feed, not a fleet's
/// history (after a fleet's install that is hundreds of thousands).
pub const MAX_LAST: u64 = 1000;

/// Where a request starts reading the events stream.
#[derive(Debug, Clone, PartialEq)]
pub enum Start {
    At(DeliverPolicy),
    /// After the stream's last N events, whichever they are when the request comes.
    Last(u64),
}

fn list(s: &Option<String>) -> Vec<&str> {
    s.as_deref().map(|s| s.split(',').map(str::trim).filter(|s| !s.is_empty()).collect()).unwrap_or_default()
}

/// The subject filters and the start a query asks for.
pub fn plan(q: &EventsQuery, last_event_id: Option<&str>) -> Result<(Vec<String>, Start), String> {
    let mut scopes = Vec::new();
    for s in list(&q.site) {
        if s != names::FLEET {
            SiteId::try_from(s).map_err(|e| format!("site: {e}"))?;
        }
        scopes.push(s.to_string());
    }
    let mut types: Vec<&EventType> = Vec::new();
    for t in list(&q.types) {
        types.push(EventType::find(t).ok_or_else(|| {
            format!("type: unknown event type {t:?} (e.g. SiteInstalled, landfall.v1.NodeReady, node.os_provisioned)")
        })?);
    }
    // Every event: the stream's own subjects, which nats-server reads as an unfiltered
    // consumer. A wildcard that matches every subject all the same (`landfall.evt.*.>`) is
    // read as a filter, matched against each of the stream's subjects (a fleet's events have
    // a hundred thousand), and delivers a few hundred events a second instead of tens of
    // thousands.
    if scopes.is_empty() && types.is_empty() {
        return Ok((vec![names::EVENTS_ALL.to_string()], start(q, last_event_id)?));
    }
    let scopes = if scopes.is_empty() { vec!["*".to_string()] } else { scopes };
    let mut filters = Vec::new();
    for scope in &scopes {
        if types.is_empty() {
            filters.push(names::scope_events(scope));
        }
        for t in &types {
            filters.push(names::events_at(scope, t.aggregate, t.kind));
        }
    }
    if filters.len() > MAX_FILTERS {
        return Err(format!("{} site × type filters; at most {MAX_FILTERS}", filters.len()));
    }
    Ok((filters, start(q, last_event_id)?))
}

/// Where a query starts reading: after `Last-Event-ID`, at `from_seq`, at the `last` events,
/// at `since`, or live.
fn start(q: &EventsQuery, last_event_id: Option<&str>) -> Result<Start, String> {
    let resume = match last_event_id {
        Some(id) => Some(id.trim().parse::<u64>().map_err(|_| format!("Last-Event-ID {id:?} is not a sequence"))? + 1),
        None => None,
    };
    if let Some(n) = q.last
        && !(1..=MAX_LAST).contains(&n)
    {
        return Err(format!("last must be between 1 and {MAX_LAST}"));
    }
    let policy = match (resume.or(q.from_seq), q.last, &q.since) {
        (Some(seq), _, _) => DeliverPolicy::ByStartSequence { start_sequence: seq.max(1) },
        (None, Some(n), _) => return Ok(Start::Last(n)),
        (None, None, Some(since)) => {
            let t = time::OffsetDateTime::parse(since, &time::format_description::well_known::Rfc3339)
                .map_err(|e| format!("since: {since:?} is not an RFC 3339 time: {e}"))?;
            DeliverPolicy::ByStartTime { start_time: t }
        }
        (None, None, None) => DeliverPolicy::New,
    };
    Ok(Start::At(policy))
}

/// Whether a reader whose grants cover part of the fleet may see an event: a site's, when
/// they may read the site; a fleet-wide one, when it is about the catalog or follows from a
/// rollout they see. A reader of the whole fleet sees every event.
fn visible(model: &super::model::Model, who: &Principal, e: &bus_schema::runtime::ReadEvent) -> bool {
    if who.over_fleet(Role::Viewer) {
        return true;
    }
    let Some(names::ParsedSubject::Event { scope, aggregate, .. }) = names::parse_subject(&e.delivery.subject) else {
        return false;
    };
    let st = model.read();
    if scope != names::FLEET {
        return st.designs.get(scope).is_some_and(|d| who.may(Role::Viewer, &d.labels));
    }
    if aggregate == "package" {
        return true;
    }
    st.rollouts.get(&e.delivery.envelope.correlation).is_some_and(|r| super::views::Sees::Only(who).rollout(&st, r))
}

pub(super) async fn events(
    State(api): State<ApiState>,
    axum::Extension(who): axum::Extension<Principal>,
    headers: HeaderMap,
    query: Result<Query<EventsQuery>, QueryRejection>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let last = headers.get("last-event-id").and_then(|v| v.to_str().ok());
    let (filters, start) = plan(&q, last).map_err(ApiError::bad_request)?;
    let unavailable = |e: String| {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "bus_unavailable", format!("cannot read the events stream: {e}"))
    };
    let policy = match start {
        Start::At(policy) => policy,
        Start::Last(n) => {
            let stream =
                api.bus.jetstream().get_stream(names::EVENTS_STREAM).await.map_err(|e| unavailable(e.to_string()))?;
            let last_seq = stream.cached_info().state.last_sequence;
            DeliverPolicy::ByStartSequence { start_sequence: (last_seq + 1).saturating_sub(n).max(1) }
        }
    };
    let reader = api.bus.read_events(filters, policy).await.map_err(|e| unavailable(e.to_string()))?;
    let model = api.model.clone();
    let shown = move |e: &bus_schema::runtime::ReadEvent| visible(&model, &who, e);
    let stream = stream(reader, q.correlation, std::sync::Arc::new(shown), api.shutdown.clone());
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

/// Whether the reader may see an event.
type Shown = std::sync::Arc<dyn Fn(&bus_schema::runtime::ReadEvent) -> bool + Send + Sync>;

fn stream(
    reader: EventReader,
    correlation: Option<String>,
    shown: Shown,
    shutdown: tokio_util::sync::CancellationToken,
) -> impl Stream<Item = Result<Event, Infallible>> {
    futures::stream::unfold(Some(reader), move |reader| {
        let (correlation, shown, shutdown) = (correlation.clone(), shown.clone(), shutdown.clone());
        async move {
            let mut reader = reader?;
            loop {
                // A stopping process ends the stream; the client resumes elsewhere with Last-Event-ID.
                let next = tokio::select! {
                    _ = shutdown.cancelled() => return None,
                    n = reader.next() => n,
                };
                match next {
                    Some(Ok(e)) => {
                        if correlation.as_deref().is_some_and(|c| c != e.delivery.envelope.correlation) || !shown(&e) {
                            continue;
                        }
                        let mut data = event_json(&e);
                        if let Some(names::ParsedSubject::Event { scope, .. }) =
                            names::parse_subject(&e.delivery.subject)
                        {
                            data["site"] = serde_json::Value::String(scope.to_string());
                        }
                        let short = e.delivery.type_name.rsplit('.').next().unwrap_or("event").to_string();
                        let event = Event::default()
                            .id(e.delivery.stream_sequence.to_string())
                            .event(short)
                            .data(data.to_string());
                        return Some((Ok(event), Some(reader)));
                    }
                    Some(Err(err)) => {
                        // The client reconnects with Last-Event-ID and resumes where it was.
                        let event = Event::default().event("error").data(format!("the events stream broke: {err}"));
                        return Some((Ok(event), None));
                    }
                    None => return None,
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(site: Option<&str>, types: Option<&str>) -> EventsQuery {
        EventsQuery { site: site.map(String::from), types: types.map(String::from), ..Default::default() }
    }

    #[test]
    fn filters_are_sites_times_types() {
        let (f, p) = plan(&q(None, None), None).unwrap();
        assert_eq!(f, [names::EVENTS_ALL]);
        assert_eq!(p, Start::At(DeliverPolicy::New));
        let (f, _) = plan(&q(Some("edge-01,fleet"), Some("SiteInstalled, node.os_provisioned")), None).unwrap();
        assert_eq!(
            f,
            [
                "landfall.evt.edge-01.*.site.installed",
                "landfall.evt.edge-01.*.node.os_provisioned",
                "landfall.evt.fleet.*.site.installed",
                "landfall.evt.fleet.*.node.os_provisioned",
            ]
        );
        let (f, _) = plan(&q(None, Some("landfall.v1.CommandRejected")), None).unwrap();
        assert_eq!(f, ["landfall.evt.*.*.command.rejected"]);
    }

    #[test]
    fn replay_from_a_sequence_a_time_or_the_last_event_seen() {
        let mut query = q(None, None);
        query.from_seq = Some(40);
        assert_eq!(plan(&query, None).unwrap().1, Start::At(DeliverPolicy::ByStartSequence { start_sequence: 40 }));
        assert_eq!(
            plan(&query, Some("99")).unwrap().1,
            Start::At(DeliverPolicy::ByStartSequence { start_sequence: 100 })
        );
        let query = EventsQuery { since: Some("2026-11-22T10:00:00Z".into()), ..Default::default() };
        assert!(matches!(plan(&query, None).unwrap().1, Start::At(DeliverPolicy::ByStartTime { .. })));
        // The last events, unless the client resumes after one it saw.
        let query = EventsQuery { last: Some(200), since: Some("2026-11-22T10:00:00Z".into()), ..Default::default() };
        assert_eq!(plan(&query, None).unwrap().1, Start::Last(200));
        assert_eq!(plan(&query, Some("7")).unwrap().1, Start::At(DeliverPolicy::ByStartSequence { start_sequence: 8 }));
    }

    #[test]
    fn bad_queries_say_what_is_wrong() {
        assert!(plan(&q(Some("Not A Site"), None), None).unwrap_err().starts_with("site:"));
        assert!(plan(&q(None, Some("Exploded")), None).unwrap_err().contains("unknown event type"));
        let query = EventsQuery { since: Some("yesterday".into()), ..Default::default() };
        assert!(plan(&query, None).unwrap_err().contains("RFC 3339"));
        assert!(plan(&q(None, None), Some("x")).unwrap_err().contains("Last-Event-ID"));
        for n in [0, MAX_LAST + 1] {
            let query = EventsQuery { last: Some(n), ..Default::default() };
            assert!(plan(&query, None).unwrap_err().starts_with("last must be"));
        }
    }
}
