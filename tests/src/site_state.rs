//! Everything the hub holds about one site, as stored: every KV entry of every landfall bucket
//! that names the site (in its key or in its value) with its revision and bytes, the site's
//! events, and its jobs. Two snapshots compare byte for byte; [`SiteState::differences`] says
//! what moved.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::DeliverPolicy;
use bus_schema::names;
use bus_schema::runtime::Bus;
use futures::StreamExt;

use crate::secrets::contains;

/// One site's stored state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SiteState {
    pub site: String,
    /// `bucket/key` → (revision, value).
    pub kv: BTreeMap<String, (u64, Vec<u8>)>,
    /// The site's events in LANDFALL_EVENTS: (stream sequence, type, message id).
    pub events: Vec<(u64, String, String)>,
    /// LANDFALL_JOBS: messages stored per subject of the site's jobs.
    pub jobs: BTreeMap<String, usize>,
    /// The last job the site's gateway consumer acknowledged (its ack floor's stream sequence).
    pub jobs_acked: u64,
}

impl SiteState {
    /// Reads the site's state as `bus` (an operator) sees it.
    pub async fn read(bus: &Bus, site: &str) -> SiteState {
        let mut kv = BTreeMap::new();
        // The command ledger is the hub's record of what it was asked, refusals included (a
        // refused forgery naming the site is recorded there): not the site's state.
        for bucket in names::ALL_BUCKETS.into_iter().filter(|b| *b != names::LEDGER_BUCKET) {
            let store = bus.jetstream().get_key_value(bucket).await.expect("the bucket");
            let mut keys = store.keys().await.expect("the bucket's keys");
            let mut all = Vec::new();
            while let Some(key) = keys.next().await {
                all.push(key.expect("a key"));
            }
            for key in all {
                let Some(entry) = store.entry(key.as_str()).await.expect("an entry") else { continue };
                if key.split('.').any(|token| token == site) || contains(&entry.value, site.as_bytes()) {
                    kv.insert(format!("{bucket}/{key}"), (entry.revision, entry.value.to_vec()));
                }
            }
        }
        let mut events = Vec::new();
        let mut reader =
            bus.read_events(vec![names::scope_events(site)], DeliverPolicy::All).await.expect("read the events");
        for _ in 0..reader.pending_at_start {
            let Some(e) = tokio::time::timeout(Duration::from_secs(10), reader.next()).await.ok().flatten() else {
                break;
            };
            let d = e.expect("an event").delivery;
            events.push((d.stream_sequence, d.type_name, d.envelope.id));
        }
        let jobs = jobs_stored(bus, site).await;
        let stream = bus.jetstream().get_stream(names::site_jobs_stream(site)).await.expect("the site's jobs stream");
        let jobs_acked = match stream.consumer_info(names::gateway_consumer(site)).await {
            Ok(info) => info.ack_floor.stream_sequence,
            Err(_) => 0,
        };
        SiteState { site: site.to_string(), kv, events, jobs, jobs_acked }
    }

    /// Reads until two reads a second apart agree: what is under way when it is called lands first.
    pub async fn read_settled(bus: &Bus, site: &str) -> SiteState {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last = SiteState::read(bus, site).await;
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let now = SiteState::read(bus, site).await;
            if now == last {
                return now;
            }
            assert!(Instant::now() < deadline, "site {site} kept changing: {:?}", last.differences(&now));
            last = now;
        }
    }

    /// What differs in `after`, one line each (empty when nothing does).
    pub fn differences(&self, after: &SiteState) -> Vec<String> {
        let mut out = Vec::new();
        for (key, before) in &self.kv {
            match after.kv.get(key) {
                None => out.push(format!("{key} was deleted (it was at revision {})", before.0)),
                Some(now) if now != before => out.push(format!(
                    "{key} changed: revision {} → {} ({} → {} bytes)",
                    before.0,
                    now.0,
                    before.1.len(),
                    now.1.len()
                )),
                Some(_) => {}
            }
        }
        for (key, now) in &after.kv {
            if !self.kv.contains_key(key) {
                out.push(format!("{key} appeared at revision {} ({} bytes)", now.0, now.1.len()));
            }
        }
        if self.events != after.events {
            let new: Vec<_> = after.events.iter().filter(|e| !self.events.contains(e)).collect();
            out.push(format!(
                "events of {}: {} before, {} after; new: {new:?}",
                self.site,
                self.events.len(),
                after.events.len()
            ));
        }
        if self.jobs != after.jobs {
            out.push(format!("jobs of {}: {:?} before, {:?} after", self.site, self.jobs, after.jobs));
        }
        if self.jobs_acked != after.jobs_acked {
            out.push(format!(
                "{}'s gateway consumer acknowledged up to {} before, {} after",
                self.site, self.jobs_acked, after.jobs_acked
            ));
        }
        out
    }
}

/// The one jobs stream an earlier version of landfall made (`LANDFALL_JOBS`, a work queue of
/// `landfall.job.>`), as it made it: what the orchestrator moves into the shards.
/// The site's jobs its shard of the jobs still holds (a work queue keeps a job until it is
/// acknowledged): messages stored per subject.
pub async fn jobs_stored(bus: &Bus, site: &str) -> BTreeMap<String, usize> {
    let stream = bus.jetstream().get_stream(names::site_jobs_stream(site)).await.expect("the site's jobs stream");
    let mut jobs = BTreeMap::new();
    let mut subjects = stream.info_with_subjects(names::site_jobs(site)).await.expect("the jobs stream's subjects");
    while let Some(subject) = subjects.next().await {
        let (subject, n) = subject.expect("a subject");
        jobs.insert(subject, n);
    }
    jobs
}

pub async fn earlier_jobs_stream(js: &async_nats::jetstream::Context) -> async_nats::jetstream::stream::Stream {
    use async_nats::jetstream::stream;
    let config = stream::Config {
        name: names::LEGACY_JOBS_STREAM.into(),
        subjects: vec![names::JOBS_ALL.into()],
        retention: stream::RetentionPolicy::WorkQueue,
        ..Default::default()
    };
    js.create_stream(config).await.expect("the earlier version's jobs stream")
}
