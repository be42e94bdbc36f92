//! A node removed, a node reprovisioned and a site decommissioned, through the real bus, the
//! orchestrator and a simulated site's gateway: each leaves nothing behind, is refused where it
//! would break the cluster, fails with the site's reason when the site cannot do it (and leaves
//! the node in service), and done again finds nothing left to do.

use std::time::Duration;

use bus_schema::names::{self, keys};
use bus_schema::pb::{self, BusEvent, BusMessage};
use bus_schema::runtime::Envelope;
use landfall_tests::fleet::{Fleet, Run, collect};
use landfall_tests::nats::NatsServer;
use site_gateway::backend::ProvisioningState as S;

const WAIT: Duration = Duration::from_secs(60);

/// Publishes `cmd` and collects the site's events of it until one of `ends`.
async fn run<C: pb::BusCommand>(fleet: &Fleet, cmd: &C, ends: &[&str]) -> (Envelope, Run) {
    let env = Envelope::root();
    fleet.bus.publish_command(cmd, &env).await.unwrap();
    let run = collect(&fleet.bus, names::scope_events("edge-01"), "operation", &env.id, ends, WAIT).await;
    (env, run)
}

fn remove(node: &str) -> pb::RemoveNode {
    pb::RemoveNode { site_id: "edge-01".into(), node: node.into(), reason: "retired hardware".into() }
}

const REMOVE_ENDS: &[&str] = &[pb::NodeLeft::TYPE, pb::LifecycleFailed::TYPE, pb::CommandRejected::TYPE];

async fn design_nodes(fleet: &Fleet) -> Vec<String> {
    let sites = fleet.bus.kv(names::SITES_BUCKET).await.unwrap();
    match sites.get::<pb::SiteDesign>(&keys::site("edge-01")).await.unwrap() {
        Some((design, _)) => design.nodes.into_iter().map(|n| n.name).collect(),
        None => Vec::new(),
    }
}

/// Waits until the design has just `nodes` (NodeLeft goes out before the design is written).
async fn design_becomes(fleet: &Fleet, nodes: &[&str]) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while design_nodes(fleet).await != nodes {
        assert!(tokio::time::Instant::now() < deadline, "{:?}", design_nodes(fleet).await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn host_names(fleet: &Fleet) -> Vec<String> {
    fleet.backend(0).hosts().into_iter().map(|(name, _)| name).collect()
}

#[tokio::test]
async fn a_worker_is_removed_once_leaving_nothing_and_the_last_master_is_refused() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(1).nodes(3).start().await;
    fleet.install_all().await;

    let (_, removed) = run(&fleet, &remove("node-3"), REMOVE_ENDS).await;
    assert_eq!(
        removed.kinds(),
        ["NodeCordoned", "NodeDrained", "NodeOsProvisioning", "NodeOsProvisioning", "NodeRetired", "NodeLeft"],
        "{:?}",
        removed.kinds()
    );
    let retired = &removed.of_type::<pb::NodeRetired>()[0];
    assert!(retired.node_deleted && retired.host_deprovisioned && retired.host_deleted, "{retired:?}");
    assert_eq!(host_names(&fleet), ["node-1", "node-2"], "its host is gone from the site");
    design_becomes(&fleet, &["node-1", "node-2"]).await;

    // Asked again: the site finds nothing of it, and says the node has left.
    let (_, again) = run(&fleet, &remove("node-3"), REMOVE_ENDS).await;
    let retired = &again.of_type::<pb::NodeRetired>()[0];
    assert!(!retired.node_deleted && !retired.host_deprovisioned && !retired.host_deleted, "{retired:?}");
    assert_eq!(again.terminal().delivery.type_name, pb::NodeLeft::TYPE);

    // The last master: the cluster would go with it. Nothing is sent to the site.
    let (_, master) = run(&fleet, &remove("node-1"), REMOVE_ENDS).await;
    let refused: pb::CommandRejected = master.terminal().delivery.decode().unwrap();
    assert_eq!(refused.code, pb::RejectCode::Conflict as i32);
    assert!(refused.reason.contains("last master"), "{}", refused.reason);
    assert_eq!(master.kinds(), ["CommandRejected"]);
    assert_eq!(host_names(&fleet), ["node-1", "node-2"]);

    let unknown = pb::RemoveNode { site_id: "edge-99".into(), ..remove("node-2") };
    let env = Envelope::root();
    fleet.bus.publish_command(&unknown, &env).await.unwrap();
    let e = fleet.wait_for(names::EVENTS_ALL.to_string(), &env.id, WAIT).await.expect("a rejection");
    assert_eq!(e.delivery.type_name, pb::CommandRejected::TYPE, "{}", e.delivery.subject);
    let refused: pb::CommandRejected = e.delivery.decode().unwrap();
    assert_eq!(refused.code, pb::RejectCode::UnknownSite as i32);
}

#[tokio::test]
async fn a_blocked_drain_fails_the_removal_with_the_reason_and_leaves_the_node_in_service() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(1).nodes(3).start().await;
    fleet.install_all().await;
    fleet.backend(0).block_drain("node-2");

    let (_, blocked) = run(&fleet, &remove("node-2"), REMOVE_ENDS).await;
    assert_eq!(
        blocked.kinds(),
        ["NodeCordoned", "NodeUncordoned", "JobFailed", "LifecycleFailed"],
        "{:?}",
        blocked.kinds()
    );
    let failed: pb::LifecycleFailed = blocked.terminal().delivery.decode().unwrap();
    assert_eq!(failed.operation, "remove_node");
    assert!(failed.reason.contains("draining node-2"), "{}", failed.reason);
    assert!(fleet.backend(0).hosts().contains(&("node-2".to_string(), S::Provisioned)), "the node stays");
    assert_eq!(design_nodes(&fleet).await, ["node-1", "node-2", "node-3"]);

    // The site's lease was let go: once the budget allows it, the removal goes through.
    fleet.backend(0).heal("node-2");
    let (_, removed) = run(&fleet, &remove("node-2"), REMOVE_ENDS).await;
    assert_eq!(removed.terminal().delivery.type_name, pb::NodeLeft::TYPE, "{:?}", removed.kinds());
    design_becomes(&fleet, &["node-1", "node-3"]).await;
}

#[tokio::test]
async fn a_reprovisioned_node_is_wiped_and_joins_again_at_the_sites_versions() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(1).nodes(3).start().await;
    fleet.install_all().await;
    let provisions = |fleet: &Fleet| fleet.backend(0).effects().provisions.get("node-2").copied().unwrap_or(0);
    assert_eq!(provisions(&fleet), 1);

    let cmd = pb::ReprovisionNode { site_id: "edge-01".into(), node: "node-2".into(), reason: "suspect disk".into() };
    let (env, wiped) = run(&fleet, &cmd, &[pb::NodeRetired::TYPE, pb::LifecycleFailed::TYPE]).await;
    let retired: pb::NodeRetired = wiped.terminal().delivery.decode().unwrap();
    assert!(retired.node_deleted && retired.host_deprovisioned && !retired.host_deleted, "{retired:?}");
    // Its join is a saga of its own, found by the id derived from the command's.
    let rejoin = bus_schema::ids::derived_id(&env.id, "rejoin", Some("node-2")).to_string();
    let ends = [pb::NodeReady::TYPE, pb::NodeJoinFailed::TYPE];
    let joined = collect(&fleet.bus, names::scope_events("edge-01"), "rejoin", &rejoin, &ends, WAIT).await;
    assert_eq!(joined.terminal().delivery.type_name, pb::NodeReady::TYPE, "{:?}", joined.kinds());
    assert!(joined.kinds().contains(&"NodeOsProvisioned".to_string()), "{:?}", joined.kinds());
    assert_eq!(provisions(&fleet), 2, "re-imaged once");
    assert!(fleet.backend(0).hosts().contains(&("node-2".to_string(), S::Provisioned)));
    assert_eq!(design_nodes(&fleet).await, ["node-1", "node-2", "node-3"], "it stays in the design");

    // The only master is never re-imaged: its cluster's etcd would be lost.
    let master = pb::ReprovisionNode { node: "node-1".into(), ..cmd };
    let (_, refused) = run(&fleet, &master, &[pb::CommandRejected::TYPE, pb::NodeRetired::TYPE]).await;
    let refused: pb::CommandRejected = refused.terminal().delivery.decode().unwrap();
    assert!(refused.reason.contains("only master"), "{}", refused.reason);
}

#[tokio::test]
async fn a_decommissioned_site_leaves_nothing_at_the_site_or_the_hub_but_its_archive() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(1).nodes(3).start().await;
    fleet.install_all().await;
    let kubeconfigs = fleet.bus.kv(names::KUBECONFIGS_BUCKET).await.unwrap();
    assert!(!kubeconfigs.keys_with_prefix("").await.unwrap().is_empty(), "the kubeconfig was collected");

    let cmd = pb::DecommissionSite { site_id: "edge-01".into(), reason: "lease ended".into() };
    let ends = [pb::SiteDecommissioned::TYPE, pb::LifecycleFailed::TYPE, pb::CommandRejected::TYPE];
    let (_, gone) = run(&fleet, &cmd, &ends).await;
    let done: pb::SiteDecommissioned = gone.terminal().delivery.decode().unwrap();
    assert_eq!(done.hosts, ["node-1", "node-2", "node-3"]);
    assert!(done.resources.iter().any(|r| r.starts_with("Secret/")), "{:?}", done.resources);
    assert_eq!(done.nats_user, "site-edge-01");
    assert!(done.revoke.contains("deploy nats-config"), "{}", done.revoke);
    assert!(gone.kinds().contains(&"SiteRemoved".to_string()), "{:?}", gone.kinds());
    assert!(fleet.backend(0).hosts().is_empty(), "every host is gone from the site");

    let sites = fleet.bus.kv(names::SITES_BUCKET).await.unwrap();
    assert!(sites.get::<pb::SiteDesign>(&keys::site("edge-01")).await.unwrap().is_none());
    let (archive, _) = sites.get::<pb::SiteArchive>(&done.archive_key).await.unwrap().expect("its archive");
    assert_eq!(archive.design.unwrap().nodes.len(), 3);
    assert_eq!(archive.reason, "lease ended");
    assert!(archive.install.is_some(), "its install's summary is kept");
    // The collector forgets the sealed kubeconfig once it hears SiteRemoved.
    let deadline = tokio::time::Instant::now() + WAIT;
    while !kubeconfigs.keys_with_prefix("").await.unwrap().is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "the sealed kubeconfig stays");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Done again: there is no such site any more.
    let (_, again) = run(&fleet, &cmd, &ends).await;
    let refused: pb::CommandRejected = again.terminal().delivery.decode().unwrap();
    assert_eq!(refused.code, pb::RejectCode::UnknownSite as i32);
}

#[tokio::test]
async fn a_forged_answer_is_refused_and_a_repeated_one_does_nothing_twice() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(1).nodes(3).start().await;
    fleet.install_all().await;

    // A removal done, its answer delivered again: nothing is done twice.
    let (env, removed) = run(&fleet, &remove("node-3"), REMOVE_ENDS).await;
    let answer = removed.events.iter().find(|e| e.delivery.type_name == pb::NodeRetired::TYPE).unwrap();
    let d = &answer.delivery;
    let again = Envelope { id: Envelope::root().id, ..d.envelope.clone() };
    fleet.bus.publish_raw(d.subject.clone(), &d.type_name, d.payload.clone(), &again).await.unwrap();

    // The site goes quiet: the next removal's job waits for it, and the site's lease is held.
    fleet.stop_gateway(0);
    let pending = Envelope::root();
    fleet.bus.publish_command(&remove("node-2"), &pending).await.unwrap();
    let sagas = fleet.bus.kv(names::SAGAS_BUCKET).await.unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    while sagas.get::<pb::Lifecycle>(&keys::lifecycle(&pending.id)).await.unwrap().is_none() {
        assert!(tokio::time::Instant::now() < deadline, "the removal never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Someone holding the site's key answers the removal without the job: refused.
    let forged = pb::NodeRetired {
        site_id: "edge-01".into(),
        node: "node-2".into(),
        node_deleted: true,
        host_deprovisioned: true,
        host_deleted: true,
        ..Default::default()
    };
    let lie = Envelope {
        id: Envelope::root().id,
        correlation: pending.id.clone(),
        causation: pending.id.clone(),
        ..pending.clone()
    };
    let subject = forged.subject();
    fleet
        .bus
        .publish_raw(subject, pb::NodeRetired::TYPE, prost::Message::encode_to_vec(&forged).into(), &lie)
        .await
        .unwrap();
    let rejections = names::event_subject("edge-01", pb::rejection::MESSAGE_AGGREGATE, pb::rejection::KIND);
    let refused = fleet.wait_for(rejections, &pending.id, WAIT).await.expect("a rejection");
    let refused: pb::MessageRejected = refused.delivery.decode().unwrap();
    assert!(refused.reason.contains("sent site edge-01 no job"), "{}", refused.reason);
    assert_eq!(design_nodes(&fleet).await, ["node-1", "node-2"], "node-2 stays");

    // Another operation on the site waits its turn: refused while this one holds the site.
    let (_, busy) = run(
        &fleet,
        &pb::ReprovisionNode { site_id: "edge-01".into(), node: "node-2".into(), reason: String::new() },
        REMOVE_ENDS,
    )
    .await;
    let busy: pb::CommandRejected = busy.terminal().delivery.decode().unwrap();
    assert!(busy.reason.contains("busy with node or site operation"), "{}", busy.reason);

    // One NodeLeft for the first removal, however often its answer came.
    let left = collect(&fleet.bus, pb::NodeLeft::filter(), "left", &env.id, &[pb::NodeLeft::TYPE], WAIT).await;
    assert_eq!(left.events.len(), 1);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut reader = fleet
        .bus
        .read_events(vec![pb::NodeLeft::filter()], async_nats::jetstream::consumer::DeliverPolicy::All)
        .await
        .unwrap();
    let mut lefts = 0;
    while let Ok(Some(Ok(e))) = tokio::time::timeout(Duration::from_millis(500), reader.next()).await {
        lefts += usize::from(e.delivery.envelope.correlation == env.id);
    }
    assert_eq!(lefts, 1, "node-3 left once");
}

/// What an operation leaves at the hub is bounded too: its record and a decommissioned site's
/// archive go after the summaries' retention.
#[tokio::test]
async fn an_operations_record_and_a_sites_archive_go_after_their_retention() {
    let server = NatsServer::start();
    let policy = bus_schema::retention::StorePolicy {
        finished_retention: Duration::from_secs(1),
        summary_retention: Duration::from_secs(3),
        compaction_interval: Duration::from_millis(300),
        marker_retention: Duration::from_secs(1),
        ..Default::default()
    };
    let fleet = Fleet::builder(&server.url()).sites(1).nodes(3).store_policy(policy).start().await;
    fleet.install_all().await;
    let (removal, _) = run(&fleet, &remove("node-3"), REMOVE_ENDS).await;
    let cmd = pb::DecommissionSite { site_id: "edge-01".into(), reason: String::new() };
    let (_, gone) = run(&fleet, &cmd, &[pb::SiteDecommissioned::TYPE, pb::LifecycleFailed::TYPE]).await;
    let done: pb::SiteDecommissioned = gone.terminal().delivery.decode().unwrap();

    let sagas = fleet.bus.kv(names::SAGAS_BUCKET).await.unwrap();
    let sites = fleet.bus.kv(names::SITES_BUCKET).await.unwrap();
    assert!(sagas.get::<pb::Lifecycle>(&keys::lifecycle(&removal.id)).await.unwrap().is_some());
    assert!(sites.get::<pb::SiteArchive>(&done.archive_key).await.unwrap().is_some());
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let record = sagas.get::<pb::Lifecycle>(&keys::lifecycle(&removal.id)).await.unwrap();
        let archive = sites.get::<pb::SiteArchive>(&done.archive_key).await.unwrap();
        if record.is_none() && archive.is_none() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "kept past the retention: {record:?} {}", archive.is_some());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
