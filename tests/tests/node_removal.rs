//! NodeRemoved: a node leaves its site's design once, with NodeLeft; what cannot be removed is
//! refused with the reason.

use std::time::Duration;

use bus_schema::names;
use bus_schema::pb::{self, BusEvent};
use bus_schema::runtime::Envelope;
use landfall_tests::fleet::Fleet;
use landfall_tests::nats::NatsServer;

const WAIT: Duration = Duration::from_secs(20);

fn removal(node: &str, mac: &str) -> pb::NodeRemoved {
    pb::NodeRemoved {
        site_id: "edge-01".into(),
        node: node.into(),
        boot_mac: mac.into(),
        reason: "decommissioned".into(),
    }
}

async fn design_nodes(fleet: &Fleet) -> Vec<String> {
    let sites = fleet.bus.kv(names::SITES_BUCKET).await.unwrap();
    let (design, _) = sites.get::<pb::SiteDesign>(&names::keys::site("edge-01")).await.unwrap().unwrap();
    design.nodes.into_iter().map(|n| n.name).collect()
}

async fn rejection(fleet: &Fleet, cmd: &pb::NodeRemoved) -> pb::CommandRejected {
    let env = Envelope::root();
    fleet.bus.publish_command(cmd, &env).await.unwrap();
    let e = fleet.wait_for(names::EVENTS_ALL.to_string(), &env.id, WAIT).await.expect("a rejection");
    assert_eq!(e.delivery.type_name, <pb::CommandRejected as pb::BusMessage>::TYPE);
    e.delivery.decode().unwrap()
}

#[tokio::test]
async fn a_node_leaves_once_and_what_cannot_leave_is_refused_with_the_reason() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(1).nodes(3).start().await;
    let worker = fleet.sites[0].0.nodes[2].clone();
    let mac = worker.boot_mac.to_string();

    let env = Envelope::root();
    let cmd = removal("node-3", &mac.to_uppercase());
    fleet.bus.publish_command(&cmd, &env).await.unwrap();
    let left = fleet.wait_for(pb::NodeLeft::filter(), &env.id, WAIT).await.expect("NodeLeft");
    let left: pb::NodeLeft = left.delivery.decode().unwrap();
    assert_eq!(
        (left.node.as_str(), left.boot_mac.as_str(), left.reason.as_str()),
        ("node-3", mac.as_str(), "decommissioned")
    );
    // NodeLeft goes out before the design is written (a redelivery after a crash in between
    // must find it published): the design follows within moments.
    let deadline = tokio::time::Instant::now() + WAIT;
    while design_nodes(&fleet).await != ["node-1", "node-2"] {
        assert!(tokio::time::Instant::now() < deadline, "{:?}", design_nodes(&fleet).await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The same command again is a copy the stream drops; a new one for the node gone is refused.
    fleet.bus.publish_command(&cmd, &env).await.unwrap();
    let gone = rejection(&fleet, &cmd).await;
    assert_eq!(gone.code, pb::RejectCode::Invalid as i32);
    assert!(gone.reason.contains("no node node-3"), "{}", gone.reason);

    // Another host under a design node's name is not that node.
    let other = rejection(&fleet, &removal("node-2", "52:54:00:ff:ff:ff")).await;
    assert_eq!(other.code, pb::RejectCode::Conflict as i32);
    assert!(other.reason.contains("another one"), "{}", other.reason);
    // The only master cannot leave: the site would have none.
    let master = rejection(&fleet, &removal("node-1", "")).await;
    assert_eq!(master.code, pb::RejectCode::Conflict as i32);
    assert!(master.reason.contains("master"), "{}", master.reason);
    let unknown_site = rejection(&fleet, &pb::NodeRemoved { site_id: "edge-99".into(), ..removal("node-2", "") }).await;
    assert_eq!(unknown_site.code, pb::RejectCode::UnknownSite as i32);
    assert_eq!(design_nodes(&fleet).await, ["node-1", "node-2"]);

    // Exactly one NodeLeft for node-3.
    let mut reader = fleet
        .bus
        .read_events(vec![pb::NodeLeft::filter()], async_nats::jetstream::consumer::DeliverPolicy::All)
        .await
        .unwrap();
    let mut count = 0;
    while let Ok(Some(Ok(_))) = tokio::time::timeout(Duration::from_millis(500), reader.next()).await {
        count += 1;
    }
    assert_eq!(count, 1);
}
