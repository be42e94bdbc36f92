//! Whether the hub hears each site. Every gateway says it is there every few seconds
//! (`landfall.svc.<site>.alive`, core NATS, not stored); the observer listens, and when a site
//! it heard goes quiet for longer than its cut-off time it writes the site cut off
//! (`link.<site>` in `landfall-observed`) and publishes `SiteCutOff`; when the site is heard
//! again, `SiteLinkRestored`. The record is written when the state changes, never on a
//! heartbeat: 10,000 sites cost the hub their heartbeats and nothing stored.
//!
//! Every observer replica hears every heartbeat (no queue group: each needs the whole picture)
//! and may find the same change; the record is written by compare-and-set, and the event's id
//! is derived from the record's revision it replaces, so the change is recorded and announced
//! once whichever replicas see it, and a replica that died between the two does it again alike.
//!
//! A site never heard is not cut off: only a site whose gateway came up once can go quiet.
//! An observer that starts counts a site it has not heard yet from its own start. A heartbeat of
//! a site not registered is not recorded; once the site is registered, the next check records
//! it heard, so a gateway started before its site was registered is not shown missing until its
//! next heartbeat.

use std::collections::HashMap;
use std::time::Duration;

use bus_schema::envelope::Envelope;
use bus_schema::ids;
use bus_schema::names::{self, keys};
use bus_schema::pb::{self, BusEvent};
use bus_schema::runtime::{self, Bus, BusError, Cas, Kv};
use bus_schema::trust;
use futures::StreamExt;
use prost::Message;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::clock::now_ms;

/// What one observer knows of the sites' links.
pub struct LinkWatch {
    bus: Bus,
    observed: Kv,
    sites: Kv,
    cut_off_after: Duration,
    /// When this watch started listening: a site it has not heard counts from then.
    started_ms: i64,
    /// Site → its last heartbeat heard by this process, and when.
    heard: HashMap<String, (i64, pb::SiteAlive)>,
    /// Site → its link as last read or written.
    known: HashMap<String, pb::SiteLink>,
}

impl LinkWatch {
    pub async fn new(bus: &Bus, cut_off_after: Duration) -> Result<Self, BusError> {
        // At 0 from the start, so an alert on their increase sees the first.
        metrics::counter!("landfall_site_alive_rejected_total").increment(0);
        Ok(Self {
            bus: bus.clone(),
            observed: bus.kv(names::OBSERVED_BUCKET).await?,
            sites: bus.kv(names::SITES_BUCKET).await?,
            cut_off_after,
            started_ms: now_ms(),
            heard: HashMap::new(),
            known: HashMap::new(),
        })
    }

    /// Listens until `shutdown`. Errors writing a change are logged and the change is tried again
    /// at the next heartbeat or check.
    pub async fn run(mut self, shutdown: CancellationToken) -> Result<(), BusError> {
        let pattern = names::site_alive("*");
        let mut alive = self
            .bus
            .client()
            .subscribe(pattern.clone())
            .await
            .map_err(|e| BusError::Request { subject: pattern, source: Box::new(e) })?;
        // Listening first, then reading what is recorded: a heartbeat in between is not missed.
        self.started_ms = now_ms();
        for (_, link, _) in self.observed.scan::<pb::SiteLink>(keys::LINK_PREFIX).await? {
            self.known.insert(link.site_id.clone(), link);
        }
        self.gauge();
        let every = (self.cut_off_after / 4).clamp(Duration::from_millis(100), Duration::from_secs(5));
        let mut check = tokio::time::interval(every);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                m = alive.next() => match m {
                    Some(m) => self.on_alive(&m.subject, &m.payload, now_ms()).await,
                    None => return Ok(()),
                },
                _ = check.tick() => self.check(now_ms()).await,
            }
        }
    }

    async fn on_alive(&mut self, subject: &str, payload: &[u8], now: i64) {
        let Some(names::ParsedSubject::Service { site, .. }) = names::parse_subject(subject) else { return };
        // A site speaks for the site its subject names, and only for it.
        let alive = pb::SiteAlive::decode(payload)
            .map_err(|e| e.to_string())
            .and_then(|a| trust::check(subject, &a).map(|()| a).map_err(|e| e.to_string()));
        let alive = match alive {
            Ok(a) => a,
            Err(e) => {
                metrics::counter!("landfall_site_alive_rejected_total").increment(1);
                warn!(%site, error = %e, "a heartbeat refused");
                return;
            }
        };
        let site = site.to_string();
        self.heard.insert(site.clone(), (now, alive.clone()));
        if self.known.get(&site).is_none_or(|l| l.state != pb::LinkState::Up as i32) {
            self.change(&site, pb::LinkState::Up, now, alive).await;
        }
    }

    /// Writes cut off every site heard before whose last heartbeat is older than the cut-off;
    /// records up a site heard lately while it was not registered, once it is (its gateway
    /// started first): it need not wait for its next heartbeat to be shown heard.
    async fn check(&mut self, now: i64) {
        let cut_off_after = i64::try_from(self.cut_off_after.as_millis()).unwrap_or(i64::MAX);
        let unrecorded: Vec<(String, i64, pb::SiteAlive)> = self
            .heard
            .iter()
            .filter(|(site, (at, _))| !self.known.contains_key(*site) && now.saturating_sub(*at) <= cut_off_after)
            .map(|(site, (at, alive))| (site.clone(), *at, alive.clone()))
            .collect();
        for (site, at, alive) in unrecorded {
            self.change(&site, pb::LinkState::Up, at, alive).await;
        }
        let quiet: Vec<(String, i64, pb::SiteAlive)> = self
            .known
            .values()
            .filter(|l| l.state == pb::LinkState::Up as i32)
            .filter_map(|l| {
                let (last, alive) = match self.heard.get(&l.site_id) {
                    Some((at, alive)) => (*at, alive.clone()),
                    None => (self.started_ms.max(l.since_unix_ms), l.last_alive.clone().unwrap_or_default()),
                };
                (now.saturating_sub(last) > cut_off_after).then(|| (l.site_id.clone(), last, alive))
            })
            .collect();
        for (site, last, alive) in quiet {
            self.change(&site, pb::LinkState::CutOff, last, alive).await;
        }
    }

    /// Records the site's link as `to` since `since` (and announces it), unless it is so already.
    async fn change(&mut self, site: &str, to: pb::LinkState, since: i64, alive: pb::SiteAlive) {
        match self.try_change(site, to, since, alive).await {
            Ok(Some(link)) => {
                self.known.insert(site.to_string(), link);
            }
            Ok(None) => {
                self.known.remove(site);
            }
            Err(e) => warn!(%site, error = %runtime::error_chain(&e), "recording a site's link failed; trying again"),
        }
        self.gauge();
    }

    /// `landfall_sites_cut_off`, from what this replica knows.
    fn gauge(&self) {
        let cut_off = self.known.values().filter(|l| l.state == pb::LinkState::CutOff as i32).count();
        metrics::gauge!("landfall_sites_cut_off").set(cut_off as f64);
    }

    /// The link as it is now recorded, or `None` when it is not to be kept (a site not registered,
    /// or no record to cut off).
    async fn try_change(
        &self,
        site: &str,
        to: pb::LinkState,
        since: i64,
        alive: pb::SiteAlive,
    ) -> Result<Option<pb::SiteLink>, BusError> {
        let key = keys::link(site);
        loop {
            let held = self.observed.get::<pb::SiteLink>(&key).await?;
            let next = match (&held, to) {
                (Some((link, _)), _) if link.state == to as i32 => return Ok(Some(link.clone())),
                // Only a site heard once is cut off; a site removed meanwhile is not.
                (None, pb::LinkState::CutOff) => return Ok(None),
                (None, _) if self.sites.get::<pb::SiteDesign>(&keys::site(site)).await?.is_none() => {
                    debug!(%site, "heartbeat of a site not registered: not recorded");
                    return Ok(None);
                }
                (held, _) => {
                    let previous = held.as_ref().map(|(l, _)| l);
                    let cut_since =
                        previous.filter(|l| l.state == pb::LinkState::CutOff as i32).map(|l| l.since_unix_ms);
                    pb::SiteLink {
                        site_id: site.to_string(),
                        state: to as i32,
                        since_unix_ms: since,
                        last_alive: Some(alive.clone()),
                        cut_off_since_unix_ms: cut_since.unwrap_or_default(),
                    }
                }
            };
            let revision = held.as_ref().map_or(0, |(_, r)| *r);
            self.announce(&next, revision).await?;
            let written = match revision {
                0 => self.observed.create(&key, &next).await?,
                r => self.observed.update(&key, &next, r).await?,
            };
            if written != Cas::Conflict {
                log_change(&next);
                return Ok(Some(next));
            }
        }
    }

    /// Publishes the change's event, with an id that names the record it replaces: every replica
    /// that finds the same change announces it under the same id.
    async fn announce(&self, link: &pb::SiteLink, replaces: u64) -> Result<(), BusError> {
        let site = link.site_id.as_str();
        let alive = link.last_alive.clone().unwrap_or_default();
        let id = ids::derived_id(&keys::link(site), &format!("{}/{replaces}", link.state), None);
        let envelope = Envelope::root_with_id(id);
        if link.state == pb::LinkState::CutOff as i32 {
            let evt = pb::SiteCutOff {
                site_id: site.to_string(),
                since_unix_ms: link.since_unix_ms,
                outbox_waiting: alive.outbox_waiting,
                last_report_type: alive.last_report_type,
                last_report_unix_ms: alive.last_report_unix_ms,
            };
            self.bus.publish(evt.subject(), &evt, &envelope).await?;
        } else if link.cut_off_since_unix_ms > 0 {
            let evt = pb::SiteLinkRestored {
                site_id: site.to_string(),
                cut_off_since_unix_ms: link.cut_off_since_unix_ms,
                restored_unix_ms: link.since_unix_ms,
                outbox_waiting: alive.outbox_waiting,
            };
            self.bus.publish(evt.subject(), &evt, &envelope).await?;
        }
        Ok(())
    }
}

fn log_change(link: &pb::SiteLink) {
    let site = &link.site_id;
    let waiting = link.last_alive.as_ref().map_or(0, |a| a.outbox_waiting);
    if link.state == pb::LinkState::CutOff as i32 {
        info!(%site, since = link.since_unix_ms, waiting, "site cut off: nothing heard of its gateway");
    } else if link.cut_off_since_unix_ms > 0 {
        let cut_ms = link.since_unix_ms.saturating_sub(link.cut_off_since_unix_ms);
        info!(%site, cut_ms, waiting, "site heard again");
    }
}
