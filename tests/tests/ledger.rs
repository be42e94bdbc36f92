//! Exactly once beyond the duplicate window: the commands stream here forgets ids after one
//! second, so a copy published later reaches the orchestrator, which finds the command in its
//! ledger and does nothing again.

use std::time::Duration;

use async_nats::jetstream::consumer::DeliverPolicy;
use async_nats::jetstream::stream;
use bus_schema::names::{self, keys};
use bus_schema::pb::{self, BusEvent};
use bus_schema::runtime::{Bus, Envelope};
use landfall_tests::fleet::Fleet;
use landfall_tests::nats::NatsServer;

const WAIT: Duration = Duration::from_secs(20);
/// The commands stream's duplicate window in this test.
const WINDOW: Duration = Duration::from_secs(1);

/// The commands stream made before the services start (they leave an existing one alone), with
/// a short duplicate window.
async fn commands_stream_with_a_short_window(url: &str) {
    let bus = Bus::connect(url, "ledger-test-setup").await.unwrap();
    let config = stream::Config {
        name: names::COMMANDS_STREAM.into(),
        subjects: vec![names::COMMANDS_ALL.into()],
        duplicate_window: WINDOW,
        max_age: names::RETENTION,
        ..Default::default()
    };
    bus.jetstream().create_stream(config).await.unwrap();
}

/// Publishes `cmd` with `env` and waits until the orchestrator has settled everything stored so far.
async fn publish_and_settle<C: pb::BusCommand>(fleet: &Fleet, cmd: &C, env: &Envelope) -> u64 {
    let ack = fleet.bus.publish_command(cmd, env).await.unwrap();
    assert!(!ack.duplicate, "past the window, the stream takes the copy");
    let js = fleet.bus.jetstream();
    let mut consumer = js.get_stream(names::COMMANDS_STREAM).await.unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let info =
            consumer.get_consumer::<async_nats::jetstream::consumer::pull::Config>(names::ORCHESTRATOR_COMMANDS).await;
        let mut info = info.unwrap();
        if info.info().await.unwrap().ack_floor.stream_sequence >= ack.sequence {
            return ack.sequence;
        }
        assert!(tokio::time::Instant::now() < deadline, "command {} not settled", ack.sequence);
        tokio::time::sleep(Duration::from_millis(50)).await;
        consumer = js.get_stream(names::COMMANDS_STREAM).await.unwrap();
    }
}

async fn design_nodes(fleet: &Fleet, site: &str) -> Vec<String> {
    let sites = fleet.bus.kv(names::SITES_BUCKET).await.unwrap();
    let (design, _) = sites.get::<pb::SiteDesign>(&keys::site(site)).await.unwrap().unwrap();
    design.nodes.into_iter().map(|n| n.name).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_published_again_after_the_duplicate_window_changes_nothing() {
    let server = NatsServer::start();
    commands_stream_with_a_short_window(&server.url()).await;
    let fleet = Fleet::builder(&server.url()).sites(1).nodes(2).without_gateways().start().await;

    // A site registered, then a node added to it.
    let design = producers::up::demo_site(4, 2);
    let site = design.site.to_string();
    let register = pb::RegisterSite { design: Some(pb::SiteDesign::from(&design)) };
    let first = Envelope::root();
    publish_and_settle(&fleet, &register, &first).await;
    assert_eq!(design_nodes(&fleet, &site).await, ["node-1", "node-2"]);
    let third = producers::up::demo_site(4, 3).nodes.pop().unwrap();
    let added = pb::NodeSpec { name: "node-9".into(), ..pb::NodeSpec::from(&third) };
    let node_added = pb::NodeAdded { site_id: site.clone(), node: Some(added), hardware: None };
    publish_and_settle(&fleet, &node_added, &Envelope::root()).await;
    assert_eq!(design_nodes(&fleet, &site).await, ["node-1", "node-2", "node-9"]);

    // The registration again, with its id, once the stream has forgotten it: stored, handled,
    // and nothing changes (before the ledger, it put the two-node design back).
    tokio::time::sleep(WINDOW * 2).await;
    publish_and_settle(&fleet, &register, &first).await;
    assert_eq!(design_nodes(&fleet, &site).await, ["node-1", "node-2", "node-9"]);
    let mut reader = fleet.bus.read_events(vec![pb::SiteRegistered::filter()], DeliverPolicy::All).await.unwrap();
    let mut registered = 0;
    while let Ok(Some(e)) = tokio::time::timeout(Duration::from_millis(500), reader.next()).await {
        registered += usize::from(e.unwrap().delivery.envelope.correlation == first.id);
    }
    assert_eq!(registered, 1, "one SiteRegistered for the registration");

    // A refused command, again after the window: refused again, the same way, and recorded once.
    let bogus = pb::InstallSite { site_id: "edge-77".into(), design_revision: 0 };
    let refused = Envelope::root();
    publish_and_settle(&fleet, &bogus, &refused).await;
    tokio::time::sleep(WINDOW * 2).await;
    publish_and_settle(&fleet, &bogus, &refused).await;
    let ledger = fleet.bus.kv(names::LEDGER_BUCKET).await.unwrap();
    let (record, revision) = ledger.get::<pb::CommandRecord>(&keys::command(&refused.id)).await.unwrap().unwrap();
    assert!(record.rejected && record.code == pb::RejectCode::UnknownSite as i32, "{record:?}");
    assert_eq!(revision, ledger.get::<pb::CommandRecord>(&keys::command(&refused.id)).await.unwrap().unwrap().1);
    let (first_record, _) = ledger.get::<pb::CommandRecord>(&keys::command(&first.id)).await.unwrap().unwrap();
    assert!(!first_record.rejected, "{first_record:?}");
    fleet.stop().await;
}
