//! The store watch: every few seconds, whether each landfall stream and bucket has room
//! (`runtime::store_health`): gauges per stream (`landfall_store_bytes`, `_limit_bytes`,
//! `_full`), this process's health answer, and a `StoreFull` event when one fills up and
//! `StoreRoomAgain` when it has room again. An event that cannot be stored (the store is full)
//! waits and goes out, in order, once it can.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use bus_schema::ids::derived_id;
use bus_schema::names;
use bus_schema::pb;
use bus_schema::pb::BusEvent;
use bus_schema::runtime::store_health::{self, Full};
use bus_schema::runtime::{Bus, Envelope, Outgoing, error_chain};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::clock::now_ms;

/// How often the watch looks.
pub const EVERY: Duration = Duration::from_secs(5);

/// What the watch keeps between looks: the streams full and since when, and the events not
/// stored yet.
#[derive(Default)]
struct Watch {
    full: BTreeMap<String, (Full, i64)>,
    pending: VecDeque<Outgoing>,
}

impl Watch {
    /// Takes in what is full now, at `now`: events for what filled up and what has room again.
    fn update(&mut self, now_full: Vec<Full>, now: i64) {
        let mut next = BTreeMap::new();
        for f in now_full {
            let since = match self.full.remove(&f.stream) {
                Some((_, since)) => since,
                None => {
                    warn!(stream = %f.stream, bytes = f.bytes, limit = f.limit_bytes, reason = %f.reason, "store full");
                    let evt = pb::StoreFull {
                        stream: f.stream.clone(),
                        bytes: f.bytes,
                        limit_bytes: f.limit_bytes,
                        reason: f.reason.clone(),
                        since_unix_ms: now,
                    };
                    self.pending.push_back(event(&evt, "store_full", &f.stream, now));
                    now
                }
            };
            next.insert(f.stream.clone(), (f, since));
        }
        for (stream, (f, since)) in std::mem::replace(&mut self.full, next) {
            info!(%stream, "store has room again");
            let evt = pb::StoreRoomAgain { stream: stream.clone(), bytes: f.bytes, full_since_unix_ms: since };
            self.pending.push_back(event(&evt, "store_room_again", &stream, since));
        }
    }
}

/// An event with an id of its stream and the minute it filled up: replicas that notice the
/// same change within a minute publish it once.
fn event<E: BusEvent>(evt: &E, step: &str, stream: &str, at_ms: i64) -> Outgoing {
    let id = derived_id(names::FLEET, step, Some(&format!("{stream}/{}", at_ms / 60_000)));
    Outgoing::event(evt, Envelope::root_with_id(id))
}

/// Sets the gauges of what the store holds and which streams are full.
fn record(usage: &store_health::StoreUse, full: &[Full]) {
    for s in &usage.streams {
        let stream = s.stream.clone();
        metrics::gauge!("landfall_store_bytes", "stream" => stream.clone()).set(s.bytes as f64);
        metrics::gauge!("landfall_store_messages", "stream" => stream.clone()).set(s.messages as f64);
        metrics::gauge!("landfall_store_limit_bytes", "stream" => stream.clone()).set(s.max_bytes as f64);
        let is_full = full.iter().any(|f| f.stream == s.stream);
        metrics::gauge!("landfall_store_full", "stream" => stream).set(f64::from(u8::from(is_full)));
    }
    let whole = full.iter().any(|f| f.stream == store_health::STORE);
    metrics::gauge!("landfall_store_full", "stream" => store_health::STORE).set(f64::from(u8::from(whole)));
}

/// How far behind each durable consumer of the commands and events is (the hub services'; the
/// sites' job consumers, one per site, are left out of the metrics): `landfall_consumer_pending`
/// (stored, not yet delivered) and `landfall_consumer_ack_pending` (delivered, not yet acked).
async fn record_consumers(bus: &Bus) {
    use futures::TryStreamExt;
    for stream in [names::COMMANDS_STREAM, names::EVENTS_STREAM] {
        let infos = async {
            let stream = bus.jetstream().get_stream(stream).await?;
            anyhow::Ok(stream.consumers().try_collect::<Vec<_>>().await?)
        };
        let infos = match infos.await {
            Ok(infos) => infos,
            Err(e) => return warn!(stream, error = %e, "cannot read the consumers' positions; looking again"),
        };
        for info in infos.into_iter().filter(|i| i.config.durable_name.is_some()) {
            let consumer = info.name.clone();
            metrics::gauge!("landfall_consumer_pending", "consumer" => consumer.clone()).set(info.num_pending as f64);
            metrics::gauge!("landfall_consumer_ack_pending", "consumer" => consumer).set(info.num_ack_pending as f64);
        }
    }
}

/// Runs the watch every `every` until `shutdown`.
pub async fn run_store_watch(bus: Bus, every: Duration, shutdown: CancellationToken) {
    let mut watch = Watch::default();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let usage = match store_health::store_use(&bus).await {
            Ok(u) => u,
            Err(e) => {
                warn!(error = %error_chain(&e), "cannot read the store's use; looking again");
                continue;
            }
        };
        let full = store_health::assess(&usage, &store_health::refused_within(store_health::REFUSED_FOR));
        record(&usage, &full);
        record_consumers(&bus).await;
        store_health::set_alarm(full.clone());
        watch.update(full, now_ms());
        while let Some(out) = watch.pending.front() {
            match bus.publish_all(vec![out.clone()]).await {
                Ok(_) => {
                    watch.pending.pop_front();
                }
                Err(e) => {
                    if bus_schema::runtime::is_store_full(&e) {
                        store_health::note_refused(names::EVENTS_STREAM);
                    }
                    warn!(error = %error_chain(&e), pending = watch.pending.len(), "store event not stored yet; trying again");
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full(stream: &str) -> Full {
        Full { stream: stream.into(), bytes: 10, limit_bytes: 10, reason: "at its limit".into() }
    }

    #[test]
    fn one_event_when_a_stream_fills_up_and_one_when_it_has_room_again() {
        let mut w = Watch::default();
        w.update(vec![full("LANDFALL_COMMANDS")], 1_000);
        w.update(vec![full("LANDFALL_COMMANDS")], 6_000);
        assert_eq!(w.pending.len(), 1, "still full: no second event");
        assert!(w.pending[0].subject.ends_with(".store.full"), "{}", w.pending[0].subject);
        w.update(vec![], 11_000);
        assert_eq!(w.pending.len(), 2);
        assert!(w.pending[1].subject.ends_with(".store.room_again"));
        let again: pb::StoreRoomAgain = prost::Message::decode(w.pending[1].payload.clone()).unwrap();
        assert_eq!((again.stream.as_str(), again.full_since_unix_ms), ("LANDFALL_COMMANDS", 1_000));
    }
}
