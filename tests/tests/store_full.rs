//! A store with no room: nats-server here may keep at most a few megabytes, and a stream of the
//! test's own fills them while commands wait. The orchestrator's writes are refused; its store
//! watch says so (its health answer, `StoreFull` once it can be stored); nothing is given up or
//! dead-lettered; and once room is made, every stored command is carried out, once.

use std::time::Duration;

use async_nats::jetstream::consumer::DeliverPolicy;
use async_nats::jetstream::stream;
use bus_schema::names;
use bus_schema::pb::{self, BusEvent, BusMessage};
use bus_schema::runtime::{Envelope, store_health};
use landfall_tests::fleet::Fleet;
use landfall_tests::nats::NatsServer;
use tokio_util::sync::CancellationToken;

const FILLER: &str = "TEST_FILLER";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_wait_for_room_and_are_all_carried_out_once_it_is_made() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("small-store.conf");
    std::fs::write(&conf, "jetstream { max_file_store: 8MB }\n").unwrap();
    let server = NatsServer::start_with(&["-c", conf.to_str().unwrap()]);
    let fleet = Fleet::builder(&server.url()).sites(0).without_orchestrator().start().await;
    let bus = fleet.bus.clone();

    // Five registrations stored, none carried out yet.
    let mut ids = Vec::new();
    for i in 10..15 {
        let design = producers::up::demo_site(i, 2);
        let cmd = pb::RegisterSite { design: Some(pb::SiteDesign::from(&design)), expected: None };
        let env = Envelope::root();
        bus.publish_command(&cmd, &env).await.unwrap();
        ids.push(env.id);
    }

    // Every byte the server will keep, taken.
    let filler = stream::Config { name: FILLER.into(), subjects: vec!["filler.>".into()], ..Default::default() };
    bus.jetstream().create_stream(filler).await.unwrap();
    let block = vec![0u8; 256 * 1024];
    let mut stored = 0;
    loop {
        match bus.jetstream().publish("filler.x", block.clone().into()).await.unwrap().await {
            Ok(_) => stored += 1,
            Err(e) => {
                assert!(bus_schema::runtime::is_store_full(&e), "the server refuses for lack of room: {e}");
                break;
            }
        }
        assert!(stored < 64, "an 8 MB store took more than 16 MB");
    }

    // The orchestrator starts into a full store: its writes are refused, it says so.
    let shutdown = CancellationToken::new();
    let orchestrator = tokio::spawn(consumers::run_orchestrator(bus.clone(), Default::default(), shutdown.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while store_health::alarm().is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "no store alarm within 30 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let full = store_health::alarm();
    assert!(full.iter().any(|f| f.reason.contains("refused")), "{full:?}");

    // Some time full: the commands keep waiting, none is dead-lettered or refused.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let dead = bus.jetstream().get_stream(names::DEAD_STREAM).await;
    if let Ok(mut dead) = dead {
        assert_eq!(dead.info().await.unwrap().state.messages, 0, "nothing given up while the store is full");
    }

    // Room made: every command carried out, and the watch says the store is full no more.
    bus.jetstream().delete_stream(FILLER).await.unwrap();
    let mut reader = bus.read_events(vec![names::EVENTS_ALL.into()], DeliverPolicy::All).await.unwrap();
    let mut registered = std::collections::BTreeMap::new();
    let (mut full_seen, mut room_seen) = (false, false);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while registered.len() < ids.len() || !room_seen {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let e = tokio::time::timeout(left, reader.next())
            .await
            .unwrap_or_else(|_| panic!("registered {registered:?}, full {full_seen}, room {room_seen}"))
            .unwrap()
            .unwrap();
        match e.delivery.type_name.as_str() {
            t if t == pb::SiteRegistered::TYPE => {
                *registered.entry(e.delivery.envelope.correlation.clone()).or_insert(0) += 1;
            }
            t if t == pb::StoreFull::TYPE => full_seen = true,
            t if t == pb::StoreRoomAgain::TYPE => {
                assert!(full_seen, "room again after full");
                room_seen = true;
            }
            t if t == pb::CommandRejected::TYPE => panic!("a command was refused: {:?}", e.delivery.subject),
            _ => {}
        }
    }
    assert!(ids.iter().all(|id| registered.get(id) == Some(&1)), "each once: {registered:?}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !store_health::alarm().is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "the alarm stays: {:?}", store_health::alarm());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(pb::StoreFull::filter().ends_with("store.full"));
    shutdown.cancel();
    let _ = orchestrator.await;
    fleet.stop().await;
}
