//! InstallSite end to end: a real nats-server, the real orchestrator, kubeconfig collector and
//! site gateways, over simulated sites.

use std::collections::BTreeMap;

use bus_schema::names::{self, keys};
use bus_schema::pb::{self, BusCommand, BusEvent, BusMessage};
use bus_schema::runtime::{BusError, Envelope};
use futures::StreamExt;
use landfall_tests::fleet::Fleet;
use landfall_tests::nats::NatsServer;
use prost::Message;

fn ones(site_nodes: &[bus_schema::domain::NodeDesign]) -> BTreeMap<String, u32> {
    site_nodes.iter().map(|n| (n.name.to_string(), 1)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sites_of_three_nodes_install_with_each_nodes_events_in_causal_order() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(2).nodes(3).start().await;

    let cmds = [fleet.install(&fleet.site_id(0)).await, fleet.install(&fleet.site_id(1)).await];
    for (i, cmd) in cmds.iter().enumerate() {
        let run = fleet.wait_install(cmd).await;
        assert_eq!(run.terminal().delivery.type_name, pb::SiteInstalled::TYPE, "site {i}");
        let done: pb::SiteInstalled = run.terminal().delivery.decode().unwrap();
        assert_eq!(done.outcome, pb::InstallOutcome::Success as i32);
        assert_eq!(done.results.len(), 3);

        // The flow, in order, once each.
        let kinds: Vec<&str> = run.events.iter().map(|e| e.delivery.type_name.as_str()).collect();
        let pos = |t: &str| kinds.iter().position(|k| *k == t).unwrap_or_else(|| panic!("no {t} in {kinds:?}"));
        let flow = [
            pb::SiteInstallStarted::TYPE,
            pb::ArtifactsStaged::TYPE,
            pb::ClusterReady::TYPE,
            pb::KubeconfigStored::TYPE,
            pb::ContainerPackagesApplied::TYPE,
            pb::SiteInstalled::TYPE,
        ];
        for pair in flow.windows(2) {
            assert!(pos(pair[0]) < pos(pair[1]), "{} before {}: {kinds:?}", pair[0], pair[1]);
        }
        for t in flow {
            assert_eq!(kinds.iter().filter(|k| **k == t).count(), 1, "{t} once");
        }

        // Each node: Metal3 states in the upstream order, then provisioned, then binaries.
        for node in &fleet.sites[i].0.nodes {
            let timeline = run.node_timeline(node.name.as_str());
            let last_state = timeline.iter().rposition(|t| t == "NodeOsProvisioning").expect("states");
            let provisioned = timeline.iter().position(|t| t == "NodeOsProvisioned").expect("provisioned");
            let binaries = timeline.iter().position(|t| t == "NodeBinariesInstalled").expect("binaries");
            assert!(last_state < provisioned && provisioned < binaries, "{node:?}: {timeline:?}");
            let states: Vec<String> = run
                .of_type::<pb::NodeOsProvisioning>()
                .into_iter()
                .filter(|e| e.node == node.name.as_str())
                .map(|e| e.state)
                .collect();
            let p = states.iter().position(|s| s == "provisioning").expect("provisioning state");
            let a = states.iter().position(|s| s == "available").expect("available state");
            assert!(a < p && states.last().unwrap() == "provisioned", "{states:?}");
            assert!(run.terminal().published >= run.events[provisioned].published);
        }

        // Every event carries the command as correlation and a cause that precedes it.
        let ids: Vec<&str> = run.events.iter().map(|e| e.delivery.envelope.id.as_str()).collect();
        for (n, e) in run.events.iter().enumerate() {
            let cause = e.delivery.envelope.causation.as_str();
            assert!(
                cause == cmd.id || ids[..n].contains(&cause) || is_job_id(cause),
                "{} has unknown cause",
                e.delivery.subject
            );
            assert!(e.delivery.envelope.traceparent.contains(&cmd.id.replace('-', "")), "one trace per command");
        }

        let effects = fleet.backend(i).effects();
        assert_eq!(effects.provisions, ones(&fleet.sites[i].0.nodes));
        assert_eq!(effects.binary_installs, ones(&fleet.sites[i].0.nodes));
        assert_eq!(effects.kubeconfigs_generated, 1);
        assert_eq!(effects.container_applies, 1);
    }
    fleet.stop().await;
}

/// Jobs are not events: an event caused by a job names the job's id, which the test does not
/// see in the events stream. A job id is a UUIDv5 (derived); a command id is a UUIDv7.
fn is_job_id(id: &str) -> bool {
    uuid::Uuid::parse_str(id).is_ok_and(|u| u.get_version_num() == 5)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_command_id_published_twice_installs_once() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).nodes(3).start().await;
    let site = fleet.site_id(0);
    let cmd = Envelope::root();
    fleet.install_with(&site, &cmd).await;
    fleet.install_with(&site, &cmd).await;
    let run = fleet.wait_install(&cmd).await;
    assert_eq!(run.terminal().delivery.type_name, pb::SiteInstalled::TYPE);

    // The stream holds the command once; the saga started once; each host provisioned once.
    let subject = pb::InstallSite { site_id: site.clone(), ..Default::default() }.subject();
    let stream = fleet.bus.jetstream().get_stream(names::COMMANDS_STREAM).await.unwrap();
    let counts: Vec<(String, usize)> =
        stream.info_with_subjects(&subject).await.unwrap().map(|r| r.unwrap()).collect().await;
    assert_eq!(counts, vec![(subject, 1)]);
    assert_eq!(run.of_type::<pb::SiteInstallStarted>().len(), 1);
    assert_eq!(fleet.backend(0).effects().provisions, ones(&fleet.sites[0].0.nodes));
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_a_command_subject_is_rejected_and_the_next_command_still_runs() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).nodes(2).start().await;
    let site = fleet.site_id(0);
    let subject = pb::InstallSite { site_id: site.clone(), ..Default::default() }.subject();

    // Not protobuf at all, published by a client that knows nothing of our headers.
    let garbage = fleet.bus.jetstream().publish(subject.clone(), vec![0xff, 0x01, 0x02, 0x03].into()).await.unwrap();
    let seq = garbage.await.unwrap().sequence;
    // A valid payload under the wrong type header.
    let wrong = Envelope::root();
    let register = pb::RegisterSite::default().encode_to_vec();
    fleet.bus.publish_raw(subject.clone(), pb::RegisterSite::TYPE, register.into(), &wrong).await.unwrap();
    // Then a valid command.
    let cmd = fleet.install(&site).await;
    let run = fleet.wait_install(&cmd).await;
    assert_eq!(run.terminal().delivery.type_name, pb::SiteInstalled::TYPE);

    let rejected: Vec<pb::CommandRejected> = {
        let mut reader = fleet
            .bus
            .read_events(vec![names::scope_events(&site)], async_nats::jetstream::consumer::DeliverPolicy::All)
            .await
            .unwrap();
        let mut out = Vec::new();
        while out.len() < 2 {
            let e = reader.next().await.unwrap().unwrap();
            if e.delivery.type_name == pb::CommandRejected::TYPE {
                out.push(e.delivery.decode().unwrap());
            }
        }
        out
    };
    let garbage_rejection = rejected.iter().find(|r| r.command_type.is_empty()).expect("garbage rejected");
    assert_eq!(garbage_rejection.code, pb::RejectCode::Malformed as i32);
    assert!(garbage_rejection.reason.contains("not a valid landfall.v1.InstallSite"), "{}", garbage_rejection.reason);
    assert_eq!(garbage_rejection.subject, subject);
    let wrong_rejection = rejected.iter().find(|r| r.command_id == wrong.id).expect("wrong type rejected");
    assert!(wrong_rejection.reason.contains("expected landfall.v1.InstallSite"), "{}", wrong_rejection.reason);

    // Terminated, not left to be redelivered: nothing is pending on the command consumer.
    let mut consumer: async_nats::jetstream::consumer::PullConsumer = fleet
        .bus
        .jetstream()
        .get_stream(names::COMMANDS_STREAM)
        .await
        .unwrap()
        .get_consumer(names::ORCHESTRATOR_COMMANDS)
        .await
        .unwrap();
    let info = consumer.info().await.unwrap();
    assert!(info.ack_floor.stream_sequence >= seq);
    assert_eq!(info.num_ack_pending, 0);
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_failing_host_fails_the_install_naming_it_and_reports_the_others() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).nodes(3).failing_host(0, "node-3").start().await;
    let cmd = fleet.install(&fleet.site_id(0)).await;
    let run = fleet.wait_install(&cmd).await;

    assert_eq!(run.terminal().delivery.type_name, pb::SiteInstallFailed::TYPE);
    let failed: pb::SiteInstallFailed = run.terminal().delivery.decode().unwrap();
    assert_eq!(failed.failed_nodes, ["node-3"]);
    assert_eq!(failed.outcome, pb::InstallOutcome::PartialSuccess as i32);
    assert!(failed.reason.contains("node-3"), "{}", failed.reason);
    let by_node: BTreeMap<_, _> = failed.results.iter().map(|r| (r.node.as_str(), r)).collect();
    assert_eq!(by_node["node-1"].outcome, pb::NodeOutcome::Succeeded as i32);
    assert_eq!(by_node["node-2"].outcome, pb::NodeOutcome::Succeeded as i32);
    assert_eq!(by_node["node-3"].outcome, pb::NodeOutcome::Failed as i32);
    assert_eq!(by_node["node-3"].failed_step, "provision_os");

    // Metal3's error reached the bus as it was.
    let node_failed = run.of_type::<pb::NodeFailed>();
    assert_eq!(node_failed.len(), 1);
    assert_eq!(node_failed[0].error_type, "provisioning error");
    // The healthy nodes still got their cluster.
    let ready = run.of_type::<pb::ClusterReady>();
    assert_eq!(ready[0].masters, ["node-1"]);
    assert_eq!(ready[0].workers, ["node-2"]);
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_bpa_install_on_a_worker_is_a_partial_success() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).nodes(3).failing_binaries(0, "node-2").start().await;
    let cmd = fleet.install(&fleet.site_id(0)).await;
    let run = fleet.wait_install(&cmd).await;
    let failed: pb::SiteInstallFailed = run.terminal().delivery.decode().unwrap();
    assert_eq!(failed.failed_nodes, ["node-2"]);
    assert_eq!(failed.results.iter().find(|r| r.node == "node-2").unwrap().failed_step, "install_binaries");
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_commands_are_rejected_with_reasons() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).nodes(1).start().await;

    let unknown = fleet.install("nowhere").await;
    let run = fleet.wait_install(&unknown).await;
    let r: pb::CommandRejected = run.terminal().delivery.decode().unwrap();
    assert_eq!(r.code, pb::RejectCode::UnknownSite as i32);
    assert!(r.reason.contains("nowhere is not registered"), "{}", r.reason);

    // A site whose package set names a version the catalog does not have.
    let mut design = pb::SiteDesign::from(&fleet.sites[0].0);
    design.site_id = "edge-99".into();
    design.packages[0].packages[0].version = "99.99".into();
    let reg = Envelope::root();
    fleet.bus.publish_command(&pb::RegisterSite { design: Some(design), expected: None }, &reg).await.unwrap();
    fleet
        .wait_for(<pb::SiteRegistered as BusEvent>::filter(), &reg.id, std::time::Duration::from_secs(10))
        .await
        .expect("registered");
    let cmd = fleet.install("edge-99").await;
    let r: pb::CommandRejected = fleet.wait_install(&cmd).await.terminal().delivery.decode().unwrap();
    assert_eq!(r.code, pb::RejectCode::UnknownPackage as i32);
    assert!(r.reason.contains("99.99"), "{}", r.reason);

    // An invalid design: no master.
    let mut design = pb::SiteDesign::from(&fleet.sites[0].0);
    design.nodes[0].role = pb::Role::Worker as i32;
    let bad = Envelope::root();
    fleet.bus.publish_command(&pb::RegisterSite { design: Some(design), expected: None }, &bad).await.unwrap();
    let run = fleet.wait_install(&bad).await;
    let r: pb::CommandRejected = run.terminal().delivery.decode().unwrap();
    assert_eq!(r.code, pb::RejectCode::Invalid as i32);
    assert!(r.reason.contains("master"), "{}", r.reason);

    // Oversized payloads are refused before they reach the bus.
    let huge = vec![0u8; names::MAX_PAYLOAD + 1];
    let err = fleet
        .bus
        .publish_raw(
            pb::InstallSite { site_id: fleet.site_id(0), ..Default::default() }.subject(),
            pb::InstallSite::TYPE,
            huge.into(),
            &Envelope::root(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, BusError::TooLarge { .. }), "{err}");

    // The site registered before all this is untouched and still installs.
    let cmd = fleet.install(&fleet.site_id(0)).await;
    assert_eq!(fleet.wait_install(&cmd).await.terminal().delivery.type_name, pb::SiteInstalled::TYPE);
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubeconfig_is_stored_sealed_and_opens_with_the_key() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).nodes(1).start().await;
    let site = fleet.site_id(0);
    let cmd = fleet.install(&site).await;
    let run = fleet.wait_install(&cmd).await;
    let stored = &run.of_type::<pb::KubeconfigStored>()[0];
    assert!(!stored.key_id.is_empty());

    let plain = consumers::kubeconfig::read_kubeconfig(&fleet.bus, fleet.keys.as_ref(), &site).await.unwrap().unwrap();
    let text = String::from_utf8(plain.to_vec()).unwrap();
    assert!(text.contains("kind: Config"), "{text}");

    // What is stored is ciphertext: the kubeconfig's bytes appear nowhere in the KV record,
    // nor anywhere in the event stream.
    let kv = fleet.bus.kv(names::KUBECONFIGS_BUCKET).await.unwrap();
    let (sealed, _) = kv.get::<pb::SealedSecret>(&keys::kubeconfig(&site)).await.unwrap().unwrap();
    let needle = &plain[plain.len() / 2..plain.len() / 2 + 32];
    assert!(!sealed.encode_to_vec().windows(needle.len()).any(|w| w == needle));
    for e in &run.events {
        assert!(!e.delivery.payload.windows(needle.len()).any(|w| w == needle), "{}", e.delivery.subject);
    }
    fleet.stop().await;
}

/// A client that registers a package and a site and installs it right away, without waiting
/// for anything in between, gets the install: commands are handled in the order they were
/// published, per site, with fleet-wide commands (the catalog) ahead of what follows them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_then_install_at_once_runs_in_publish_order() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(0).start().await;
    let bus = &fleet.bus;
    for i in 0..3 {
        let design = producers::up::demo_site(10 + i, 2);
        let backend = std::sync::Arc::new(site_gateway::sim::SimSite::new(
            design.site.as_str(),
            &design.nodes,
            site_gateway::sim::SimConfig::instant(),
        ));
        tokio::spawn(site_gateway::run_gateway(
            design.site.clone(),
            bus.clone(),
            backend,
            fleet.cache_for(design.site.as_str()),
            bus_schema::names::ALIVE_EVERY,
            Default::default(),
        ));
        let mut extra = producers::up::demo_packages()[0].clone();
        extra.version = format!("22.04.{}", 10 + i);
        bus.publish_command(
            &pb::RegisterPackage { package: Some(extra.clone()), auto_rollout: None },
            &Envelope::root(),
        )
        .await
        .unwrap();
        let mut site = pb::SiteDesign::from(&design);
        for set in &mut site.packages {
            set.packages[0].version = extra.version.clone();
        }
        bus.publish_command(&pb::RegisterSite { design: Some(site), expected: None }, &Envelope::root()).await.unwrap();
        let cmd = fleet.install(design.site.as_str()).await;
        let run = fleet.wait_install(&cmd).await;
        assert_eq!(run.terminal().delivery.type_name, pb::SiteInstalled::TYPE, "{}", design.site);
    }
    fleet.stop().await;
}

/// Orchestrators are stateless replicas: three of them share the work of five concurrent
/// installs, and every step is still done exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_orchestrator_replicas_share_installs_and_do_each_step_once() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).orchestrators(3).sites(5).nodes(3).start().await;
    let mut cmds = Vec::new();
    for i in 0..5 {
        cmds.push(fleet.install(&fleet.site_id(i)).await);
    }
    for (i, cmd) in cmds.iter().enumerate() {
        let run = fleet.wait_install(cmd).await;
        assert_eq!(run.terminal().delivery.type_name, pb::SiteInstalled::TYPE, "site {i}");
        for t in [pb::SiteInstallStarted::TYPE, pb::ClusterReady::TYPE, pb::SiteInstalled::TYPE] {
            assert_eq!(run.events.iter().filter(|e| e.delivery.type_name == t).count(), 1, "{t} once at site {i}");
        }
        let effects = fleet.backend(i).effects();
        assert_eq!(effects.provisions, ones(&fleet.sites[i].0.nodes), "site {i}");
        assert_eq!(effects.binary_installs, ones(&fleet.sites[i].0.nodes), "site {i}");
        assert_eq!((effects.kubeconfigs_generated, effects.container_applies), (1, 1), "site {i}");
    }
    // All three replicas are attached to the shared durable consumers and pulling from them.
    for durable in [names::ORCHESTRATOR_COMMANDS, names::ORCHESTRATOR_EVENTS] {
        let stream =
            if durable == names::ORCHESTRATOR_COMMANDS { names::COMMANDS_STREAM } else { names::EVENTS_STREAM };
        let mut consumer: async_nats::jetstream::consumer::PullConsumer =
            fleet.bus.jetstream().get_stream(stream).await.unwrap().get_consumer(durable).await.unwrap();
        let info = consumer.info().await.unwrap();
        assert!(info.num_waiting >= 3, "{durable}: {} pull requests waiting", info.num_waiting);
        assert_eq!(info.num_ack_pending, 0, "{durable}");
    }
    fleet.stop().await;
}
