//! The bus runtime against real servers: the version check, and bad input on job subjects.

use producers::embedded::tied;
use std::time::Duration;

use async_nats::jetstream::consumer::DeliverPolicy;
use bus_schema::names;
use bus_schema::pb::{self, BusEvent, BusJob, BusMessage};
use bus_schema::runtime::{Bus, BusError, Envelope, ErrorKind};
use landfall_tests::fleet::Fleet;
use landfall_tests::nats::NatsServer;

/// A nats-server older than 2.12.0 is refused at connect with an error naming its version.
#[tokio::test]
async fn an_old_nats_server_is_refused_with_its_version_named() {
    let old = NatsServer::start_debian("bookworm");
    let err = match Bus::connect(&old.url(), "landfall-test").await {
        Ok(_) => panic!("connected to an unsupported server"),
        Err(e) => e,
    };
    assert!(matches!(err, BusError::ServerTooOld { .. }), "{err}");
    assert_eq!(err.kind(), ErrorKind::Fatal);
    let text = err.to_string();
    assert!(text.contains("2.9.10") && text.contains("2.12.0 or newer"), "{text}");
}

#[tokio::test]
async fn a_server_without_jetstream_is_refused_clearly() {
    // The same supported binary, but a plain core-NATS listener: no -js.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut child = tokio::process::Command::from(tied::command(landfall_tests::nats::binary()))
        .args(["-a", "127.0.0.1", "-p", &port.to_string()])
        .kill_on_drop(true)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("nats://127.0.0.1:{port}");
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let err = Bus::connect(&url, "landfall-test").await.err().expect("refused");
    assert!(matches!(err, BusError::NoJetStream { .. }), "{err}");
    assert!(err.to_string().contains("-js"), "{err}");
    child.kill().await.unwrap();
}

/// Garbage on a gateway's job subject is terminated with a `MessageRejected` that says why, and
/// the gateway goes on with its next job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_a_job_subject_is_rejected_and_the_gateway_goes_on() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).nodes(2).start().await;
    let site = fleet.site_id(0);
    let subject = pb::ProvisionOs { site_id: site.clone(), ..Default::default() }.subject();
    let mut rejections = fleet.bus.read_events(vec![names::scope_events(&site)], DeliverPolicy::New).await.unwrap();

    fleet.bus.jetstream().publish(subject.clone(), b"\x08\xff\xff\xff".to_vec().into()).await.unwrap().await.unwrap();
    // A well-formed job whose node is invalid: a permanent, not a transient, failure.
    let bad = pb::ProvisionOs {
        site_id: site.clone(),
        node: Some(pb::NodeSpec { name: "Not A Name".into(), ..Default::default() }),
        ..Default::default()
    };
    fleet.bus.publish_job(&bad, &Envelope::root()).await.unwrap();
    // A job for a kind no gateway knows.
    fleet
        .bus
        .publish_raw(
            names::job_subject(&site, "defragment"),
            "landfall.v1.Defragment",
            vec![].into(),
            &Envelope::root(),
        )
        .await
        .unwrap();

    let mut reasons = Vec::new();
    while reasons.len() < 3 {
        let e = tokio::time::timeout(Duration::from_secs(10), rejections.next())
            .await
            .expect("rejections")
            .unwrap()
            .unwrap();
        if e.delivery.type_name == pb::MessageRejected::TYPE {
            let r: pb::MessageRejected = e.delivery.decode().unwrap();
            assert_eq!(r.consumer, names::gateway_consumer(&site));
            reasons.push(r.reason);
        }
    }
    assert!(reasons.iter().any(|r| r.contains("not a valid landfall.v1.ProvisionOs")), "{reasons:?}");
    assert!(reasons.iter().any(|r| r.contains("name")), "{reasons:?}");
    assert!(reasons.iter().any(|r| r.contains("defragment")), "{reasons:?}");

    let cmd = fleet.install(&site).await;
    assert_eq!(fleet.wait_install(&cmd).await.terminal().delivery.type_name, pb::SiteInstalled::TYPE);
    fleet.stop().await;
}

/// One mutating saga per site: a second install of a busy site waits its turn, and the two
/// never overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_installs_of_one_site_take_turns() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).nodes(2).start().await;
    let site = fleet.site_id(0);
    let first = fleet.install(&site).await;
    let second = fleet.install(&site).await;
    let a = fleet.wait_install(&first).await;
    let b = fleet.wait_install(&second).await;
    assert_eq!(a.terminal().delivery.type_name, pb::SiteInstalled::TYPE);
    assert_eq!(b.terminal().delivery.type_name, pb::SiteInstalled::TYPE);
    let b_started = b.events.iter().find(|e| e.delivery.type_name == pb::SiteInstallStarted::TYPE).unwrap();
    assert!(
        b_started.delivery.stream_sequence > a.terminal().delivery.stream_sequence,
        "the second install started only after the first ended"
    );
    // The second install found the hosts already provisioned with the same image: no new effect.
    let effects = fleet.backend(0).effects();
    assert!(effects.provisions.values().all(|n| *n == 1), "{effects:?}");
    fleet.stop().await;
}

/// A lease with no saga behind it is presumed fresh for a grace period (its taker may be about
/// to write the saga) and taken over after it: a dead replica blocks a site for a minute at most.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_without_a_saga_is_respected_then_taken_over() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).nodes(1).start().await;
    let site = fleet.site_id(0);
    let sagas = fleet.bus.kv(names::SAGAS_BUCKET).await.unwrap();
    let now_ms = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let ghost = pb::SiteLease {
        site_id: site.clone(),
        saga_id: "ghost".into(),
        acquired_unix_ms: now_ms(),
        ..Default::default()
    };
    sagas.put(&names::keys::site_lease(&site), &ghost).await.unwrap();

    let cmd = fleet.install(&site).await;
    let started = fleet.wait_for(pb::SiteInstallStarted::filter(), &cmd.id, Duration::from_secs(3)).await;
    assert!(started.is_none(), "the install waited for the fresh lease");

    let stale = pb::SiteLease { acquired_unix_ms: now_ms() - 120_000, ..ghost };
    sagas.put(&names::keys::site_lease(&site), &stale).await.unwrap();
    let run = fleet.wait_install(&cmd).await;
    assert_eq!(run.terminal().delivery.type_name, pb::SiteInstalled::TYPE);
    fleet.stop().await;
}

/// A scan that meets writes: keys rewritten while the bucket is scanned come back once, with
/// a value they had, and no key is missed (a rollout plans from such scans: a site counted twice
/// never completed, a site missed would be left out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_during_writes_sees_each_key_once() {
    let server = NatsServer::start();
    let bus = Bus::connect(&server.url(), "landfall-test").await.unwrap();
    bus.ensure_topology(&Default::default()).await.unwrap();
    let kv = bus.kv(names::OBSERVED_BUCKET).await.unwrap();
    let value = |v: &str| pb::NodeObserved { node: v.into(), ..Default::default() };
    for i in 0..200 {
        kv.put(&format!("node.edge-01.n{i:03}.kubelet"), &value("1")).await.unwrap();
    }
    let stop = tokio_util::sync::CancellationToken::new();
    // Keys early, in the middle and last in the bucket, each rewritten as fast as it goes.
    let writers: Vec<_> = ["n000", "n100", "n199"]
        .into_iter()
        .map(|node| {
            let (kv, stop) = (kv.clone(), stop.clone());
            tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.is_cancelled() {
                    n += 1;
                    kv.put(&format!("node.edge-01.{node}.kubelet"), &value(&n.to_string())).await.unwrap();
                }
            })
        })
        .collect();
    for scan in 0..30 {
        let got = kv.scan_matching::<pb::NodeObserved>("node.*.*.kubelet").await.unwrap();
        let keys: std::collections::BTreeSet<&str> = got.iter().map(|(k, _, _)| k.as_str()).collect();
        assert_eq!((got.len(), keys.len()), (200, 200), "scan {scan}: every key once");
    }
    stop.cancel();
    for writer in writers {
        writer.await.unwrap();
    }
}

/// A scan that keeps part of each entry as it reads it (the compaction pass keeps little of each
/// of thousands of sagas) returns what it kept, in key order with each key's revision; a purged
/// key, or one it kept nothing of, does not come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_keeping_part_of_each_entry_returns_only_what_it_kept() {
    let server = NatsServer::start();
    let bus = Bus::connect(&server.url(), "landfall-test").await.unwrap();
    bus.ensure_topology(&Default::default()).await.unwrap();
    let kv = bus.kv(names::OBSERVED_BUCKET).await.unwrap();
    let value = |v: &str| pb::NodeObserved { node: v.into(), ..Default::default() };
    for i in 0..10 {
        kv.put(&format!("node.edge-01.n{i}.kubelet"), &value(&i.to_string())).await.unwrap();
    }
    kv.purge("node.edge-01.n4.kubelet").await.unwrap();
    let rev6 = kv.put("node.edge-01.n6.kubelet", &value("66")).await.unwrap();
    let got = kv
        .scan_matching_map("node.*.*.kubelet", |key, v: pb::NodeObserved| {
            let n: u32 = v.node.parse().ok()?;
            n.is_multiple_of(2).then(|| (key.to_string(), n))
        })
        .await
        .unwrap();
    let kept: Vec<(&str, u32)> = got.iter().map(|(_, (key, n), _)| (key.as_str(), *n)).collect();
    assert_eq!(
        kept,
        [
            ("node.edge-01.n0.kubelet", 0),
            ("node.edge-01.n2.kubelet", 2),
            ("node.edge-01.n6.kubelet", 66),
            ("node.edge-01.n8.kubelet", 8)
        ]
    );
    assert!(got.iter().all(|(key, (kept_key, _), _)| key == kept_key), "each with its own key");
    assert_eq!(got.iter().find(|(key, _, _)| key == "node.edge-01.n6.kubelet").unwrap().2, rev6, "its latest revision");
}

/// A key-by-key scan of one site's keys finds each live key of that site once, with a value it
/// had during the scan, while its keys are rewritten, deleted and purged and other sites' keys
/// are written around them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_of_few_keys_sees_each_live_key_of_its_prefix_once() {
    let server = NatsServer::start();
    let bus = Bus::connect(&server.url(), "landfall-test").await.unwrap();
    bus.ensure_topology(&Default::default()).await.unwrap();
    let kv = bus.kv(names::OBSERVED_BUCKET).await.unwrap();
    let value = |v: &str| pb::NodeObserved { node: v.into(), ..Default::default() };
    for i in 0..20 {
        for site in ["edge-01", "edge-02", "edge-010"] {
            kv.put(&format!("node.{site}.n{i:02}.kubelet"), &value("1")).await.unwrap();
        }
    }
    kv.put("node.edge-01.n05.kubelet", &value("2")).await.unwrap();
    let (_, n06) = kv.get::<pb::NodeObserved>("node.edge-01.n06.kubelet").await.unwrap().unwrap();
    kv.delete_if("node.edge-01.n06.kubelet", n06).await.unwrap();
    kv.purge("node.edge-01.n07.kubelet").await.unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let writer = {
        let (kv, stop) = (kv.clone(), stop.clone());
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.is_cancelled() {
                n += 1;
                kv.put("node.edge-01.n00.kubelet", &value(&n.to_string())).await.unwrap();
                kv.put(&format!("node.edge-02.x{n}.kubelet"), &value("1")).await.unwrap();
            }
        })
    };
    for scan in 0..20 {
        let got = kv.scan_few::<pb::NodeObserved>("node.edge-01.").await.unwrap();
        let keys: Vec<&str> = got.iter().map(|(k, _, _)| k.as_str()).collect();
        let expected: Vec<String> =
            (0..20).filter(|i| ![6, 7].contains(i)).map(|i| format!("node.edge-01.n{i:02}.kubelet")).collect();
        assert_eq!(keys, expected, "scan {scan}: each live key of edge-01 once, in key order");
        let n05 = got.iter().find(|(k, _, _)| k == "node.edge-01.n05.kubelet").unwrap();
        assert_eq!(n05.1.node, "2", "the key's latest value");
    }
    stop.cancel();
    writer.await.unwrap();
}

/// Two writers changing one key at once through `Kv::update_with`: every change of each is in
/// the value once, none lost to the other's write and none applied twice by a retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_updates_of_one_key_are_each_applied_once() {
    use bus_schema::runtime::Update;

    let server = NatsServer::start();
    let bus = Bus::connect(&server.url(), "landfall-test").await.unwrap();
    bus.ensure_topology(&Default::default()).await.unwrap();
    let kv = bus.kv(names::OBSERVED_BUCKET).await.unwrap();
    let key = "node.edge-01.n1.kubelet";
    const EACH: usize = 100;
    let writers: Vec<_> = ["a", "b"]
        .into_iter()
        .map(|writer| {
            let kv = kv.clone();
            tokio::spawn(async move {
                for i in 0..EACH {
                    let mark = format!("{writer}-{i}");
                    kv.update_with(key, |current: Option<&pb::NodeObserved>| {
                        let mut next = current.cloned().unwrap_or_default();
                        next.packages.push(pb::ObservedPackage { name: mark.clone(), ..Default::default() });
                        Update::Put(next, ())
                    })
                    .await
                    .unwrap();
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }
    let (value, _) = kv.get::<pb::NodeObserved>(key).await.unwrap().expect("written");
    let marks: std::collections::BTreeSet<&str> = value.packages.iter().map(|p| p.name.as_str()).collect();
    assert_eq!((value.packages.len(), marks.len()), (2 * EACH, 2 * EACH), "each change once");

    // Keep writes nothing; Delete removes the key, and then has nothing to do.
    let kept = kv.update_with(key, |_: Option<&pb::NodeObserved>| Update::Keep("kept")).await.unwrap();
    assert_eq!(kept, "kept");
    let (_, revision) = kv.update_with_revision(key, |_: Option<&pb::NodeObserved>| Update::Delete(())).await.unwrap();
    assert_eq!(revision, None);
    assert!(kv.get::<pb::NodeObserved>(key).await.unwrap().is_none());
    let absent = kv.update_with(key, |v: Option<&pb::NodeObserved>| Update::Delete(v.is_none())).await.unwrap();
    assert!(absent, "the key is gone");
}

/// A hub service's durable made by an earlier version with other filters (the observer's
/// once listed the kinds it reads) takes this version's filters when the service starts, and
/// the service reads on from where the durable was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_made_with_other_filters_takes_this_versions() {
    let server = NatsServer::start();
    let bus = Bus::connect(&server.url(), "landfall-test").await.unwrap();
    bus.ensure_topology(&Default::default()).await.unwrap();
    let stream = bus.jetstream().get_stream(names::EVENTS_STREAM).await.unwrap();
    let earlier = async_nats::jetstream::consumer::pull::Config {
        durable_name: Some(names::OBSERVER_EVENTS.into()),
        filter_subjects: vec![pb::NodePatched::filter(), pb::NodeReady::filter()],
        ack_policy: async_nats::jetstream::consumer::AckPolicy::Explicit,
        ..Default::default()
    };
    stream.create_consumer(earlier).await.unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let observer = tokio::spawn(consumers::run_observer(bus.clone(), shutdown.clone()));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let mut c: async_nats::jetstream::consumer::PullConsumer =
            stream.get_consumer(names::OBSERVER_EVENTS).await.unwrap();
        let config = &c.info().await.unwrap().config;
        if config.filter_subject == names::EVENTS_ALL && config.filter_subjects.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "filters still {:?} {:?}",
            config.filter_subject,
            config.filter_subjects
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    shutdown.cancel();
    observer.await.unwrap().unwrap();
}

/// Thousands of messages in one `publish_all` (a fleet's installs, say) are all stored: the
/// client lets 5,000 acknowledgements wait at most, and sending every message before awaiting
/// any once hung for good past that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_all_stores_more_messages_than_the_client_lets_wait() {
    let server = NatsServer::start();
    let bus = Bus::connect(&server.url(), "landfall-test").await.unwrap();
    bus.ensure_topology(&Default::default()).await.unwrap();
    let out: Vec<_> = (0..12_000)
        .map(|i| {
            let cmd = pb::InstallSite { site_id: format!("edge-{i}"), design_revision: 0 };
            bus_schema::runtime::Outgoing::new(pb::BusCommand::subject(&cmd), &cmd, Envelope::root())
        })
        .collect();
    tokio::time::timeout(Duration::from_secs(60), bus.publish_all(out))
        .await
        .expect("publish_all finished within 60 s")
        .unwrap();
    let mut commands = bus.jetstream().get_stream(names::COMMANDS_STREAM).await.unwrap();
    assert_eq!(commands.info().await.unwrap().state.messages, 12_000);
}

/// The one jobs stream of an earlier version, with a site's durable (a pull consumer, as an
/// earlier version still made them) and jobs no gateway took, is moved into the shards when the
/// orchestrator's topology aligns: each job lands in its site's shard under the sharded subject
/// with its own id, each site's durable is made there as this version makes it and delivers the
/// job, and both old streams are gone. A service that starts before the orchestrator leaves the
/// old stream alone, and aligning again moves nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_versions_jobs_stream_is_moved_into_the_shards_with_its_durables_and_jobs() {
    use async_nats::jetstream::consumer;
    use bus_schema::runtime::Topology;
    use futures::StreamExt;
    let server = NatsServer::start();
    let bus = durable_per_site(Bus::connect(&server.url(), "landfall-test").await.unwrap());
    let js = bus.jetstream();
    let legacy = landfall_tests::site_state::earlier_jobs_stream(js).await;
    let sites = ["edge-01", "edge-02", "edge-17"];
    for site in sites {
        legacy
            .create_consumer(consumer::pull::Config {
                durable_name: Some(names::gateway_consumer(site)),
                filter_subject: names::site_every_job(site),
                ack_policy: consumer::AckPolicy::Explicit,
                ..Default::default()
            })
            .await
            .unwrap();
    }
    // Jobs as the earlier version sent them: `landfall.job.<site>.<kind>`.
    let old_job = |site: &str, kind: &str, id: &str| {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(names::headers::MSG_ID, id);
        (format!("landfall.job.{site}.{kind}"), headers)
    };
    for (site, id) in [("edge-01", "job-a"), ("edge-17", "job-b"), ("edge-01", "job-c")] {
        let kind = if id == "job-c" { pb::ProvisionOs::KIND } else { pb::StageArtifacts::KIND };
        let (subject, headers) = old_job(site, kind, id);
        js.publish_with_headers(subject, headers, id.as_bytes().to_vec().into()).await.unwrap().await.unwrap();
    }

    // A service other than the orchestrator leaves it be, and makes no shard beside it.
    bus.ensure_topology(&Topology::default()).await.unwrap();
    assert!(js.get_stream(names::LEGACY_JOBS_STREAM).await.is_ok());
    assert!(js.get_stream(names::jobs_stream(0)).await.is_err(), "a shard was made beside the old stream");

    bus.ensure_topology(&Topology::default().aligning()).await.unwrap();
    assert!(js.get_stream(names::LEGACY_JOBS_STREAM).await.is_err(), "the old stream is still there");
    assert!(js.get_stream(names::MOVING_JOBS_STREAM).await.is_err(), "the holding stream is still there");
    // Aligned again (the orchestrator's next start): nothing moves twice.
    bus.ensure_topology(&Topology::default().aligning()).await.unwrap();
    let mut stored = 0;
    for stream in names::jobs_streams() {
        stored += js.get_stream(stream).await.unwrap().cached_info().state.messages;
    }
    assert_eq!(stored, 3, "each job once, in the shards");
    for site in sites {
        let shard = js.get_stream(names::site_jobs_stream(site)).await.unwrap();
        let info = shard.consumer_info(names::gateway_consumer(site)).await.unwrap();
        assert_eq!(info.config.deliver_subject.as_deref(), Some(names::site_deliver(site).as_str()), "{site}");
        assert_eq!(info.config.filter_subject, names::site_jobs(site));
    }
    // Each site's durable delivers its own jobs, in order, with their ids, under the new subjects.
    for (site, expected) in [("edge-01", vec!["job-a", "job-c"]), ("edge-17", vec!["job-b"]), ("edge-02", vec![])] {
        let shard = js.get_stream(names::site_jobs_stream(site)).await.unwrap();
        let durable = shard.get_consumer::<consumer::push::Config>(&names::gateway_consumer(site)).await.unwrap();
        let mut deliveries = durable.messages().await.unwrap();
        let mut got = Vec::new();
        while let Ok(Some(m)) = tokio::time::timeout(Duration::from_secs(2), deliveries.next()).await {
            let m = m.unwrap();
            let id = m.headers.as_ref().and_then(|h| h.get(names::headers::MSG_ID)).unwrap().to_string();
            assert_eq!(m.payload.as_ref(), id.as_bytes());
            assert!(matches!(
                names::parse_subject(&m.subject),
                Some(names::ParsedSubject::Job { site: s, .. }) if s == site
            ));
            assert!(names::subject_matches(&names::site_jobs(site), &m.subject), "{}", m.subject);
            got.push(id);
            m.double_ack().await.unwrap();
        }
        assert_eq!(got, expected, "{site}");
    }
}

/// Two orchestrator replicas starting together both move the old jobs stream: both start, and
/// each job and durable is in its shard once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_orchestrators_moving_the_old_jobs_stream_at_once_both_start_and_move_each_job_once() {
    use async_nats::jetstream::consumer;
    use bus_schema::runtime::Topology;
    let server = NatsServer::start();
    let bus = durable_per_site(Bus::connect(&server.url(), "landfall-test").await.unwrap());
    let js = bus.jetstream();
    let legacy = landfall_tests::site_state::earlier_jobs_stream(js).await;
    let sites: Vec<String> = (0..20).map(|i| format!("edge-{i:02}")).collect();
    for site in &sites {
        let durable = consumer::pull::Config {
            durable_name: Some(names::gateway_consumer(site)),
            filter_subject: names::site_every_job(site),
            ack_policy: consumer::AckPolicy::Explicit,
            ..Default::default()
        };
        legacy.create_consumer(durable).await.unwrap();
        for n in 0..5 {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(names::headers::MSG_ID, format!("{site}-{n}").as_str());
            let subject = format!("landfall.job.{site}.{}", pb::ProvisionOs::KIND);
            js.publish_with_headers(subject, headers, "job".into()).await.unwrap().await.unwrap();
        }
    }
    let other = durable_per_site(Bus::connect(&server.url(), "landfall-test-2").await.unwrap());
    let aligning = Topology::default().aligning();
    let (a, b) = tokio::join!(bus.ensure_topology(&aligning), other.ensure_topology(&aligning));
    a.expect("the first replica");
    b.expect("the second replica");
    assert!(js.get_stream(names::LEGACY_JOBS_STREAM).await.is_err());
    assert!(js.get_stream(names::MOVING_JOBS_STREAM).await.is_err());
    for site in &sites {
        let shard = js.get_stream(names::site_jobs_stream(site)).await.unwrap();
        let info = shard.consumer_info(names::gateway_consumer(site)).await.unwrap();
        assert_eq!(info.num_pending, 5, "{site}: each of its jobs once");
    }
}

/// A move of the old jobs stream that stopped part way through putting the jobs kept aside into
/// their shards (the old stream deleted, the shards made, one job put) is finished at the
/// orchestrator's next start: the jobs kept aside reach their shards once, and the durables kept
/// aside are made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_of_the_old_jobs_stream_cut_short_goes_on_at_the_next_start() {
    use async_nats::jetstream::stream;
    use bus_schema::runtime::Topology;
    let server = NatsServer::start();
    let bus = durable_per_site(Bus::connect(&server.url(), "landfall-test").await.unwrap());
    let js = bus.jetstream();
    let site = "edge-05";
    let job = |id: &str| {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(names::headers::MSG_ID, id);
        headers
    };
    // The shards were made, and the first job kept aside was put into its shard.
    bus.ensure_topology(&Topology::default()).await.unwrap();
    let put = names::job_subject(site, pb::PatchNodes::KIND);
    js.publish_with_headers(put, job("job-x"), "x".into()).await.unwrap().await.unwrap();
    // What the move had kept aside: edge-05's durable and two of its jobs, the first put already.
    js.create_stream(stream::Config {
        name: names::MOVING_JOBS_STREAM.into(),
        subjects: vec![names::MOVING_JOBS_ALL.into()],
        ..Default::default()
    })
    .await
    .unwrap();
    js.publish(format!("landfall.moving.durable.{site}"), Default::default()).await.unwrap().await.unwrap();
    for id in ["job-x", "job-y"] {
        let subject = format!("landfall.moving.job.landfall.job.{site}.{}", pb::PatchNodes::KIND);
        js.publish_with_headers(subject, job(id), id.as_bytes().to_vec().into()).await.unwrap().await.unwrap();
    }

    bus.ensure_topology(&Topology::default().aligning()).await.unwrap();
    assert!(js.get_stream(names::MOVING_JOBS_STREAM).await.is_err(), "the holding stream is still there");
    let mut shard = js.get_stream(names::site_jobs_stream(site)).await.unwrap();
    let info = shard.info().await.unwrap();
    assert_eq!(info.state.messages, 2, "each job once: the one put before is dropped by its id");
    assert_eq!(info.state.consumer_count, 1);
    let last = shard.get_last_raw_message_by_subject(&names::job_subject(site, pb::PatchNodes::KIND)).await.unwrap();
    assert_eq!(last.payload.as_ref(), b"job-y");
    let durable = shard.consumer_info(names::gateway_consumer(site)).await.unwrap();
    assert_eq!(durable.num_pending, 2, "its durable holds both jobs");
}

/// Only what a site's durable delivers is a job to its gateway: a message published straight
/// onto the site's delivery subject (no acknowledgement subject of the durable's) is ignored,
/// while the same bytes through the jobs stream, before and after it, are handled (here:
/// refused as malformed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_on_a_sites_delivery_subject_not_from_its_durable_is_not_a_job() {
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(1).nodes(1).start().await;
    let site = fleet.site_id(0);
    let mut events = fleet.bus.read_events(vec![names::EVENTS_ALL.to_string()], DeliverPolicy::New).await.unwrap();
    let garbage = b"\x08\xff\xff\xff".to_vec();
    let with_id = |id: &str| {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(names::headers::TYPE, pb::ProvisionOs::TYPE);
        headers.insert(names::headers::MSG_ID, id);
        headers
    };
    let subject = pb::ProvisionOs { site_id: site.clone(), ..Default::default() }.subject();
    let mut refused = Vec::new();
    for id in ["before", "stranger", "after"] {
        if id == "stranger" {
            let client = fleet.bus.client();
            client.publish_with_headers(names::site_deliver(&site), with_id(id), garbage.clone().into()).await.unwrap();
            client.flush().await.unwrap();
            continue;
        }
        let js = fleet.bus.jetstream();
        js.publish_with_headers(subject.clone(), with_id(id), garbage.clone().into()).await.unwrap().await.unwrap();
        // Each job through the stream is refused before the next message goes out.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !refused.iter().any(|r| r == id) {
            let e = tokio::time::timeout_at(deadline, events.next()).await.expect("a rejection").unwrap().unwrap();
            if e.delivery.type_name == pb::MessageRejected::TYPE {
                refused.push(e.delivery.decode::<pb::MessageRejected>().unwrap().message_id);
            }
        }
    }
    let quiet = tokio::time::Instant::now() + Duration::from_secs(1);
    while let Ok(Some(e)) = tokio::time::timeout_at(quiet, events.next()).await {
        let e = e.unwrap();
        if e.delivery.type_name == pb::MessageRejected::TYPE {
            refused.push(e.delivery.decode::<pb::MessageRejected>().unwrap().message_id);
        }
    }
    assert_eq!(refused, ["before", "after"], "only what the durable delivered was handled");
    fleet.stop().await;
}

/// A site's registration makes its gateway's durable in one request; made again, it is left as it
/// is; a durable of that name made otherwise (an earlier version's pull durable, or a push
/// durable delivering elsewhere) is made anew as the gateway's push durable, and jobs reach it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateways_durable_is_made_once_left_as_it_is_and_made_anew_when_made_otherwise() {
    use async_nats::jetstream::consumer;
    use bus_schema::runtime::ConsumerSpec;
    use futures::StreamExt;
    let server = NatsServer::start();
    let bus = Bus::connect(&server.url(), "landfall-test").await.unwrap();
    bus.ensure_topology(&Default::default()).await.unwrap();
    let site = "edge-07";
    let jobs = bus.jetstream().get_stream(names::site_jobs_stream(site)).await.unwrap();
    let durable = names::gateway_consumer(site);
    let spec = ConsumerSpec::gateway(site);
    let ensure = || bus_schema::runtime::ensure_consumer(&bus, &spec);
    ensure().await.unwrap();
    let made = jobs.consumer_info(&durable).await.unwrap();
    assert_eq!(made.config.deliver_subject.as_deref(), Some(names::site_deliver(site).as_str()));
    ensure().await.unwrap();
    assert_eq!(jobs.consumer_info(&durable).await.unwrap().created, made.created, "made again, not left as it was");

    let pull = consumer::pull::Config {
        durable_name: Some(durable.clone()),
        filter_subject: names::site_jobs(site),
        ack_policy: consumer::AckPolicy::Explicit,
        ..Default::default()
    };
    let elsewhere = consumer::push::Config {
        durable_name: Some(durable.clone()),
        deliver_subject: "somewhere.else".into(),
        filter_subject: names::site_jobs(site),
        ack_policy: consumer::AckPolicy::Explicit,
        ..Default::default()
    };
    use consumer::IntoConsumerConfig;
    for (i, made_otherwise) in [pull.into_consumer_config(), elsewhere.into_consumer_config()].into_iter().enumerate() {
        jobs.delete_consumer(&durable).await.unwrap();
        jobs.create_consumer(made_otherwise).await.unwrap();
        ensure().await.unwrap();
        let info = jobs.consumer_info(&durable).await.unwrap();
        assert_eq!(info.config.deliver_subject.as_deref(), Some(names::site_deliver(site).as_str()), "case {i}");
    }
    let mut delivered = bus.client().subscribe(names::site_deliver(site)).await.unwrap();
    let job = pb::StageArtifacts { site_id: site.into(), artifacts: vec![] };
    bus.publish_job(&job, &Envelope::root()).await.unwrap();
    let got =
        tokio::time::timeout(Duration::from_secs(10), delivered.next()).await.expect("the job delivered").unwrap();
    assert_eq!(got.subject.as_str(), job.subject(), "the job, on its durable's delivery subject");
}

/// A job still in the jobs stream that its site's durable holds nothing of (here: a durable that
/// gave up on it after one delivery, as a restarted hub once left two durables past their jobs)
/// is delivered again once the orchestrator's sweep makes the durable anew; a job a durable
/// still holds is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_stranded_past_its_durable_is_delivered_again() {
    use async_nats::jetstream::consumer;
    use bus_schema::runtime::ConsumerSpec;
    use futures::StreamExt;
    let server = NatsServer::start();
    let bus = Bus::connect(&server.url(), "landfall-test").await.unwrap();
    bus.ensure_topology(&Default::default()).await.unwrap();
    let (stranded, held) = ("edge-01", "edge-02");
    let jobs = bus.jetstream().get_stream(names::site_jobs_stream(stranded)).await.unwrap();
    let held_jobs = bus.jetstream().get_stream(names::site_jobs_stream(held)).await.unwrap();
    let job = |site: &str| pb::StageArtifacts { site_id: site.into(), artifacts: vec![] };
    // edge-01's durable delivers its job once, is not answered, and gives it up.
    let once = consumer::push::Config {
        durable_name: Some(names::gateway_consumer(stranded)),
        deliver_subject: names::site_deliver(stranded),
        filter_subject: names::site_jobs(stranded),
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait: Duration::from_millis(500),
        max_deliver: 1,
        ..Default::default()
    };
    let mut first = jobs.create_consumer(once).await.unwrap().messages().await.unwrap();
    bus.publish_job(&job(stranded), &Envelope::root()).await.unwrap();
    let lost = tokio::time::timeout(Duration::from_secs(10), first.next()).await.expect("delivered").unwrap().unwrap();
    drop((lost, first));
    // edge-02's durable holds its job, undelivered (no gateway listens).
    bus_schema::runtime::ensure_consumer(&bus, &ConsumerSpec::gateway(held)).await.unwrap();
    bus.publish_job(&job(held), &Envelope::root()).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let info = jobs.consumer_info(names::gateway_consumer(stranded)).await.unwrap();
        if info.num_ack_pending == 0 && info.num_pending == 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "edge-01's durable still holds its job: {info:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let found = consumers::redeliver_stranded_jobs(&bus, Duration::from_secs(60)).await.unwrap();
    assert!(found.is_empty(), "younger than a minute: left alone, {found:?}");
    let found = consumers::redeliver_stranded_jobs(&bus, Duration::ZERO).await.unwrap();
    assert_eq!(found, [stranded], "only the durable that holds nothing of its job");

    let pushed = jobs.get_consumer::<consumer::push::Config>(&names::gateway_consumer(stranded)).await.unwrap();
    assert_eq!(pushed.cached_info().config.max_deliver, -1, "made anew as landfall makes it");
    let mut deliveries = pushed.messages().await.unwrap();
    let got =
        tokio::time::timeout(Duration::from_secs(10), deliveries.next()).await.expect("the job").unwrap().unwrap();
    assert_eq!(got.subject.as_str(), job(stranded).subject());
    got.double_ack().await.unwrap();
    let held_info = held_jobs.consumer_info(names::gateway_consumer(held)).await.unwrap();
    assert_eq!(held_info.num_pending, 1, "edge-02's job still waits in its own durable");
}

/// The sites' durables live in the hub server's memory: a server started again has none, and a
/// site's job published meanwhile waits in its stream. The stranded-job sweep makes the durable
/// of a registered site whose job waits, and the orchestrator's look every registered site's;
/// the job is delivered; a look that finds every durable makes none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_started_again_has_its_sites_durables_made_again() {
    use async_nats::jetstream::context::ConsumerInfoErrorKind;
    use bus_schema::names::keys;
    use bus_schema::runtime::ConsumerSpec;
    use futures::StreamExt;
    let mut server = NatsServer::start();
    let bus = Bus::connect(&server.url(), "landfall-test").await.unwrap();
    bus.ensure_topology(&Default::default()).await.unwrap();
    let sites_kv = bus.kv(names::SITES_BUCKET).await.unwrap();
    let sites = ["edge-01", "edge-02", "edge-03"];
    for site in sites {
        sites_kv.put(&keys::site(site), &pb::SiteDesign::default()).await.unwrap();
        bus_schema::runtime::ensure_consumer(&bus, &ConsumerSpec::gateway(site)).await.unwrap();
    }
    assert_eq!(consumers::make_missing_durables(&bus, &sites_kv).await.unwrap(), 0, "none missing");

    server.restart();
    let durable = |site: &'static str| {
        let bus = bus.clone();
        async move {
            let jobs = bus.jetstream().get_stream(names::site_jobs_stream(site)).await?;
            jobs.consumer_info(names::gateway_consumer(site)).await.map_err(Box::<dyn std::error::Error>::from)
        }
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let gone = loop {
        match durable("edge-01").await {
            Err(e)
                if e.downcast_ref::<async_nats::jetstream::context::ConsumerInfoError>().map(|e| e.kind())
                    == Some(ConsumerInfoErrorKind::NotFound) =>
            {
                break true;
            }
            Ok(_) => break false,
            Err(_) => {}
        }
        assert!(std::time::Instant::now() < deadline, "the hub did not come back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(gone, "a site's durable outlived its server");
    let mut delivered = bus.client().subscribe(names::site_deliver("edge-01")).await.unwrap();
    let job = pb::StageArtifacts { site_id: "edge-01".into(), artifacts: vec![] };
    bus.publish_job(&job, &Envelope::root()).await.unwrap();
    // A job of a site no longer registered (its removal cut short) gets it no durable.
    let stray = pb::StageArtifacts { site_id: "edge-09".into(), artifacts: vec![] };
    bus.publish_job(&stray, &Envelope::root()).await.unwrap();

    // The stranded-job sweep makes the durable of a registered site with a job waiting, and
    // only that; the look at every site makes the others.
    let found = consumers::redeliver_stranded_jobs(&bus, Duration::ZERO).await.unwrap();
    assert_eq!(found, ["edge-01"], "a registered site with a job, without a durable");
    assert!(consumers::make_missing_durables(&bus, &sites_kv).await.unwrap() > 0, "edge-02's and edge-03's");
    for site in sites {
        let info = durable(site).await.unwrap_or_else(|e| panic!("{site}'s durable: {e}"));
        assert_eq!(info.config.deliver_subject.as_deref(), Some(names::site_deliver(site).as_str()));
    }
    let got =
        tokio::time::timeout(Duration::from_secs(10), delivered.next()).await.expect("the job delivered").unwrap();
    assert_eq!(got.subject.as_str(), job.subject(), "the job, on its durable's delivery subject");
    assert_eq!(consumers::make_missing_durables(&bus, &sites_kv).await.unwrap(), 0, "none missing any more");
    assert!(durable("edge-09").await.is_err(), "a site not registered has no durable made");
}

/// nats-server 2.15 lets a stream that names no limit 1,000 consumers, and a jobs stream holds a
/// durable per site of its shard: each names its own limit, and a shard made before it did is
/// given that limit when the orchestrator's topology aligns it. Then a thousand and first site's
/// durable is made in one shard.
#[tokio::test]
async fn a_jobs_stream_holds_a_durable_for_each_of_more_than_a_thousand_sites() {
    use async_nats::jetstream::{consumer, stream};
    use bus_schema::runtime::{JOBS_MAX_CONSUMERS, Topology};
    let nats = NatsServer::start();
    let bus = Bus::connect(&nats.url(), "landfall-test").await.unwrap();
    let js = bus.jetstream();
    js.create_stream(stream::Config {
        name: names::jobs_stream(0).into(),
        subjects: vec![names::shard_jobs(0)],
        retention: stream::RetentionPolicy::WorkQueue,
        ..Default::default()
    })
    .await
    .unwrap();
    bus.ensure_topology(&Topology::default().aligning()).await.unwrap();
    let mut jobs = js.get_stream(names::jobs_stream(0)).await.unwrap();
    assert_eq!(jobs.info().await.unwrap().config.max_consumers, JOBS_MAX_CONSUMERS);
    let in_shard = (0..).map(|i| format!("edge-{i:05}")).filter(|s| names::job_shard(s) == 0);
    for (i, site) in in_shard.take(1_001).enumerate() {
        let made = jobs
            .create_consumer(consumer::push::Config {
                durable_name: Some(names::gateway_consumer(&site)),
                deliver_subject: names::site_deliver(&site),
                filter_subject: names::site_jobs(&site),
                ack_policy: consumer::AckPolicy::Explicit,
                ..Default::default()
            })
            .await;
        if let Err(e) = made {
            panic!("site {i}'s durable was refused: {e}");
        }
    }
    assert_eq!(jobs.info().await.unwrap().state.consumer_count, 1_001);
}

/// `bus` as a hub's with a durable per site (not the dispatcher): the earlier version's jobs
/// stream is moved with the sites' durables.
fn durable_per_site(bus: Bus) -> Bus {
    bus.with_job_delivery(bus_schema::runtime::JobDelivery::Durable)
}
