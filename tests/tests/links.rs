//! Whether the hub hears a site: a site whose gateway goes quiet is counted cut off since it was
//! last heard, and up again when heard, each change recorded and announced once however many
//! observers see it; a heartbeat speaks only for the site its subject names, and only for a
//! registered one.

use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::DeliverPolicy;
use bus_schema::names::{self, keys};
use bus_schema::pb::{self, BusMessage};
use landfall_tests::fleet::Fleet;
use landfall_tests::nats::NatsServer;
use prost::Message;
use tokio_util::sync::CancellationToken;

const ALIVE_EVERY: Duration = Duration::from_millis(100);
const CUT_OFF_AFTER: Duration = Duration::from_secs(1);

fn now_ms() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    i64::try_from(since.as_millis()).unwrap()
}

async fn link(fleet: &Fleet, site: &str) -> Option<pb::SiteLink> {
    let observed = fleet.bus.kv(names::OBSERVED_BUCKET).await.unwrap();
    observed.get::<pb::SiteLink>(&keys::link(site)).await.unwrap().map(|(l, _)| l)
}

/// Waits (10 s at most) until `site`'s link is `state`.
async fn until_link(fleet: &Fleet, site: &str, state: pb::LinkState) -> pb::SiteLink {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let held = link(fleet, site).await;
        if let Some(l) = held.as_ref().filter(|l| l.state == state as i32) {
            return l.clone();
        }
        assert!(Instant::now() < deadline, "{site} not {state:?}: {held:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A heartbeat on `subject_site`'s subject that says it is `claimed`'s.
async fn beat(fleet: &Fleet, subject_site: &str, claimed: &str) {
    let alive = pb::SiteAlive {
        site_id: claimed.to_string(),
        sent_unix_ms: now_ms(),
        outbox_waiting: 3,
        last_report_type: pb::NodePatched::TYPE.into(),
        last_report_unix_ms: now_ms(),
        ..Default::default()
    };
    fleet.bus.client().publish(names::site_alive(subject_site), alive.encode_to_vec().into()).await.unwrap();
    fleet.bus.client().flush().await.unwrap();
}

/// The link events the hub stored of `site`, by type.
async fn link_events(fleet: &Fleet, site: &str) -> Vec<String> {
    let filter = names::event_subject(site, "link", "*");
    let mut reader = fleet.bus.read_events(vec![filter], DeliverPolicy::All).await.unwrap();
    let mut types = Vec::new();
    if reader.pending_at_start == 0 {
        return types;
    }
    while let Some(e) = reader.next().await {
        let e = e.unwrap();
        types.push(e.delivery.type_name.clone());
        if e.pending == 0 {
            break;
        }
    }
    types
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_site_is_cut_off_once_and_up_again_once_and_no_heartbeat_speaks_for_another_site() {
    let server = NatsServer::start();
    let fleet =
        Fleet::builder(&server.url()).sites(2).without_gateways().link_timing(ALIVE_EVERY, CUT_OFF_AFTER).start().await;
    // A second observer replica: both hear every heartbeat, and both see the site go quiet.
    let second = CancellationToken::new();
    let policy = bus_schema::retention::StorePolicy::default();
    let replica = tokio::spawn(consumers::run_observer_with(fleet.bus.clone(), policy, CUT_OFF_AFTER, second.clone()));
    let (a, b) = (fleet.site_id(0), fleet.site_id(1));
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Garbage, a heartbeat on a's subject naming b, and one of a site never registered: none
    // is recorded.
    fleet.bus.client().publish(names::site_alive(&a), b"\xff\x01not a heartbeat".to_vec().into()).await.unwrap();
    beat(&fleet, &a, &b).await;
    beat(&fleet, "edge-99", "edge-99").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!((link(&fleet, &a).await, link(&fleet, &b).await, link(&fleet, "edge-99").await), (None, None, None));

    // a says it is there for a while: up.
    let mut last = 0;
    for _ in 0..10 {
        beat(&fleet, &a, &a).await;
        last = now_ms();
        tokio::time::sleep(ALIVE_EVERY).await;
    }
    let up = until_link(&fleet, &a, pb::LinkState::Up).await;
    assert_eq!(up.cut_off_since_unix_ms, 0, "heard for the first time: no cut before");
    assert!(link(&fleet, &b).await.is_none(), "b was never heard: neither up nor cut off");

    // a goes quiet: cut off since it was last heard, with what it said last.
    let cut = until_link(&fleet, &a, pb::LinkState::CutOff).await;
    assert!(
        (last - 200..=last + 200).contains(&cut.since_unix_ms),
        "cut off since {} (last heard {last})",
        cut.since_unix_ms
    );
    let said = cut.last_alive.clone().unwrap_or_default();
    assert_eq!((said.outbox_waiting, said.last_report_type.as_str()), (3, pb::NodePatched::TYPE));
    tokio::time::sleep(CUT_OFF_AFTER).await;
    assert_eq!(link(&fleet, &a).await.map(|l| l.since_unix_ms), Some(cut.since_unix_ms), "recorded once");

    // Heard again: up, with when the cut began.
    beat(&fleet, &a, &a).await;
    let back = until_link(&fleet, &a, pb::LinkState::Up).await;
    assert_eq!(back.cut_off_since_unix_ms, cut.since_unix_ms);
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Two observers saw each change; each was announced once.
    let types = link_events(&fleet, &a).await;
    assert_eq!(types, [pb::SiteCutOff::TYPE, pb::SiteLinkRestored::TYPE], "{types:?}");
    assert!(link_events(&fleet, &b).await.is_empty());

    second.cancel();
    replica.await.unwrap().unwrap();
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_heard_before_its_site_was_registered_is_shown_heard_without_waiting_for_its_next_heartbeat() {
    let server = NatsServer::start();
    // Heartbeats every 15 s, as deployed; the observer checks every 2 s.
    let fleet = Fleet::builder(&server.url())
        .sites(0)
        .without_gateways()
        .link_timing(Duration::from_secs(15), Duration::from_secs(8))
        .start()
        .await;
    let design = producers::up::demo_site(76, 1);
    let site = design.site.to_string();
    beat(&fleet, &site, &site).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(link(&fleet, &site).await, None, "a site not registered is not recorded");

    let env = bus_schema::runtime::Envelope::root();
    let cmd = pb::RegisterSite { design: Some(pb::SiteDesign::from(&design)), expected: None };
    fleet.bus.publish_command(&cmd, &env).await.unwrap();
    let registered = Instant::now();
    let up = until_link(&fleet, &site, pb::LinkState::Up).await;
    assert!(
        registered.elapsed() < Duration::from_secs(5),
        "recorded {:?} after the registration",
        registered.elapsed()
    );
    assert_eq!(up.last_alive.unwrap().outbox_waiting, 3, "with what its heartbeat said");
    fleet.stop().await;
}
