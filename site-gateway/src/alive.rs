//! The gateway's heartbeat: every few seconds it tells the hub it is there
//! (`landfall.svc.<site>.alive`, core NATS, nothing stored), with how many reports its outbox
//! still holds and the latest report it made. While the link is down the heartbeats go nowhere,
//! and the hub's observer counts the site cut off (see `consumers::links`).

use std::sync::Mutex;
use std::time::Duration;

use bus_schema::names;
use bus_schema::pb;
use bus_schema::runtime::Bus;
use prost::Message;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::outbox::Outbox;

/// The latest report a gateway made: its type and when.
#[derive(Debug, Default)]
pub struct LastReport(Mutex<(String, i64)>);

impl LastReport {
    pub fn note(&self, type_name: &str) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = (type_name.to_string(), now_ms());
    }

    fn get(&self) -> (String, i64) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The wall clock, in unix milliseconds.
pub(crate) fn now_ms() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

/// Says the site is there every `every` until `shutdown`. A heartbeat that cannot be sent is
/// dropped: the next one says the same, newer.
pub async fn keep_alive(
    site: String,
    bus: Bus,
    every: Duration,
    outbox: Option<std::sync::Arc<Outbox>>,
    last: std::sync::Arc<LastReport>,
    shutdown: CancellationToken,
) {
    let subject = names::site_alive(&site);
    let started = now_ms();
    let mut tick = tokio::time::interval(every.max(Duration::from_millis(50)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let outbox_waiting = match &outbox {
            Some(o) => o.waiting().await.unwrap_or_default(),
            None => 0,
        };
        let (last_report_type, last_report_unix_ms) = last.get();
        let alive = pb::SiteAlive {
            site_id: site.clone(),
            sent_unix_ms: now_ms(),
            gateway_started_unix_ms: started,
            outbox_waiting,
            last_report_type,
            last_report_unix_ms,
        };
        if let Err(e) = bus.client().publish(subject.clone(), alive.encode_to_vec().into()).await {
            debug!(%site, error = %e, "heartbeat not sent");
        }
    }
}
