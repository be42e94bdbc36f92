//! Bounded redelivery and dead letters, parked deliveries, and per-site order across replicas,
//! against a real nats-server: a message that keeps failing (or whose process is lost each time)
//! ends in `LANDFALL_DEAD` with a `MessageDeadLettered` notice and can be replayed; messages
//! queued behind a slow one are kept alive; a message delivered again while its first attempt
//! still runs is handled once; a full store is told apart; two orchestrator replicas keep a
//! site's commands in order.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_nats::jetstream::stream;
use bus_schema::names::{self, keys};
use bus_schema::pb::{self, BusEvent, BusMessage};
use bus_schema::runtime::{
    self, Bus, BusError, ConsumerSpec, Delivery, Envelope, ErrorKind, HandlerError, RejectAs, Topology,
};
use landfall_tests::cli::{landfall, text};
use landfall_tests::fleet::{self, Fleet};
use landfall_tests::nats::NatsServer;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(30);

async fn bus(url: &str) -> Bus {
    fleet::init_tracing();
    let bus = Bus::connect(url, "dead-letter-test").await.unwrap();
    bus.ensure_topology(&Topology::default()).await.unwrap();
    bus
}

/// A test consumer of one site's `site.*` events (not the notices of its own dead letters).
fn spec(durable: &str, site: &str, max_attempts: u32) -> ConsumerSpec {
    ConsumerSpec::new(
        names::EVENTS_STREAM,
        durable,
        vec![format!("landfall.evt.{site}.hub.site.>")],
        RejectAs::Message { consumer: durable.to_string() },
    )
    .max_attempts(Some(max_attempts))
}

async fn publish_event(bus: &Bus, site: &str, n: u32) -> Envelope {
    let env = Envelope::root();
    let evt = pb::SiteInstalled { site_id: site.to_string(), ..Default::default() };
    let subject = names::event_subject(site, "site", &format!("test_{n}"));
    bus.publish(subject, &evt, &env).await.unwrap();
    env
}

/// Waits until `LANDFALL_DEAD` holds a letter from `consumer`.
async fn dead_letter_of(bus: &Bus, consumer: &str) -> runtime::StoredDeadLetter {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let letters = bus.read_dead_letters().await.unwrap();
        if let Some(l) = letters.into_iter().find(|l| l.letter.consumer == consumer) {
            return l;
        }
        assert!(tokio::time::Instant::now() < deadline, "no dead letter from {consumer}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Always fails transiently; counts its attempts and the dead letters it is told of.
#[derive(Default)]
struct Poison {
    attempts: AtomicU32,
    told: AtomicU32,
}

impl runtime::Handler for Poison {
    async fn handle(&self, _: &Delivery) -> Result<(), HandlerError> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        Err(HandlerError::transient_reason("the test handler always fails"))
    }

    async fn on_dead_lettered(&self, _: &Delivery, reason: &str) -> Result<(), HandlerError> {
        assert!(reason.contains("always fails"), "{reason}");
        self.told.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_keeps_failing_is_filed_as_a_dead_letter_after_n_attempts() {
    let server = NatsServer::start();
    let bus = bus(&server.url()).await;
    let handler = Arc::new(Poison::default());
    let shutdown = CancellationToken::new();
    let consumer = "test-poison";
    let task =
        tokio::spawn(runtime::consume(bus.clone(), spec(consumer, "edge-07", 3), handler.clone(), shutdown.clone()));
    let mut notices = bus
        .read_events(
            vec![names::events_of_kind(pb::rejection::MESSAGE_AGGREGATE, pb::rejection::DEAD_LETTERED_KIND)],
            async_nats::jetstream::consumer::DeliverPolicy::New,
        )
        .await
        .unwrap();
    let env = publish_event(&bus, "edge-07", 1).await;

    let letter = dead_letter_of(&bus, consumer).await;
    assert_eq!(handler.attempts.load(Ordering::SeqCst), 3, "tried in place, N times");
    assert_eq!(handler.told.load(Ordering::SeqCst), 1);
    let l = &letter.letter;
    assert_eq!((l.deliveries, l.attempts), (1, 3), "one delivery: the retries were in place");
    assert_eq!(l.message_id, env.id);
    assert_eq!(l.subject, "landfall.evt.edge-07.hub.site.test_1");
    assert!(l.error.contains("always fails"), "{}", l.error);
    assert!(l.headers.iter().any(|h| h.name == names::headers::CORRELATION_ID && h.value == env.correlation));

    let notice = tokio::time::timeout(WAIT, notices.next()).await.unwrap().unwrap().unwrap();
    assert_eq!(notice.delivery.subject, "landfall.evt.edge-07.hub.message.dead_lettered", "in the site's scope");
    let n: pb::MessageDeadLettered = notice.delivery.decode().unwrap();
    assert_eq!(
        (n.message_id.as_str(), n.dead_sequence, n.consumer.as_str()),
        (env.id.as_str(), letter.sequence, consumer)
    );

    // Terminated: not delivered again.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(handler.attempts.load(Ordering::SeqCst), 3);
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

/// Never returns: the process handling it is lost (the test aborts it).
#[derive(Default)]
struct Hangs {
    calls: AtomicU32,
}

impl runtime::Handler for Hangs {
    async fn handle(&self, _: &Delivery) -> Result<(), HandlerError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        std::future::pending().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_whose_process_is_lost_every_time_is_given_up_by_its_delivery_count() {
    let server = NatsServer::start();
    let bus = bus(&server.url()).await;
    let handler = Arc::new(Hangs::default());
    let consumer = "test-crashes";
    let spec = spec(consumer, "edge-08", 2).ack_wait(Duration::from_secs(1));
    publish_event(&bus, "edge-08", 1).await;
    // Two lives, each lost while handling it (aborted: no ack, no NAK, like a crash).
    for life in 1..=2 {
        let task = tokio::spawn(runtime::consume(bus.clone(), spec.clone(), handler.clone(), CancellationToken::new()));
        let deadline = tokio::time::Instant::now() + WAIT;
        while handler.calls.load(Ordering::SeqCst) < life {
            assert!(tokio::time::Instant::now() < deadline, "not handled in life {life}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        task.abort();
        let _ = task.await;
    }
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(runtime::consume(bus.clone(), spec, handler.clone(), shutdown.clone()));
    let letter = dead_letter_of(&bus, consumer).await;
    assert_eq!(handler.calls.load(Ordering::SeqCst), 2, "given up before it was handled a third time");
    assert_eq!(letter.letter.deliveries, 3);
    assert!(letter.letter.error.contains("lost each time"), "{}", letter.letter.error);
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

/// The first message of its key takes three times the ack wait; records every delivery count.
#[derive(Default)]
struct Slow {
    seen: std::sync::Mutex<Vec<(String, i64)>>,
}

impl runtime::Handler for Slow {
    async fn handle(&self, d: &Delivery) -> Result<(), HandlerError> {
        if d.subject.ends_with("test_0") {
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        self.seen.lock().unwrap().push((d.subject.clone(), d.delivered));
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_queued_behind_a_slow_one_of_their_key_are_kept_alive_and_delivered_once() {
    let server = NatsServer::start();
    let bus = bus(&server.url()).await;
    let handler = Arc::new(Slow::default());
    let shutdown = CancellationToken::new();
    let spec =
        spec("test-queued", "edge-09", 10).ack_wait(Duration::from_secs(1)).ordered_by_token(names::SCOPE_TOKEN, None);
    let task = tokio::spawn(runtime::consume(bus.clone(), spec, handler.clone(), shutdown.clone()));
    for n in 0..3 {
        publish_event(&bus, "edge-09", n).await;
    }
    let deadline = tokio::time::Instant::now() + WAIT;
    while handler.seen.lock().unwrap().len() < 3 {
        assert!(tokio::time::Instant::now() < deadline, "not all handled");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Long enough for a redelivery, had one been due.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let seen = handler.seen.lock().unwrap().clone();
    let subjects: Vec<&str> = seen.iter().map(|(s, _)| s.rsplit('.').next().unwrap()).collect();
    assert_eq!(subjects, ["test_0", "test_1", "test_2"], "in order, each once: {seen:?}");
    assert!(seen.iter().all(|(_, delivered)| *delivered == 1), "{seen:?}");
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

/// Its first attempt stalls the whole process past the ack wait (no progress reaches the server,
/// as when a hub is too busy to take it in time), then goes on a while; counts attempts, and
/// those running at once.
#[derive(Default)]
struct Stalls {
    calls: AtomicU32,
    running: AtomicU32,
    most_at_once: AtomicU32,
}

impl runtime::Handler for Stalls {
    async fn handle(&self, _: &Delivery) -> Result<(), HandlerError> {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_at_once.fetch_max(now, Ordering::SeqCst);
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            std::thread::sleep(Duration::from_secs(3));
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        self.running.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_delivered_again_while_its_attempt_runs_is_handled_once() {
    let server = NatsServer::start();
    let bus = bus(&server.url()).await;
    let handler = Arc::new(Stalls::default());
    let consumer = "test-stalls";
    let spec = spec(consumer, "edge-10", 10).ack_wait(Duration::from_secs(1));
    // The loop on a runtime of one thread of its own, which the stall stops whole.
    let shutdown = CancellationToken::new();
    let looped = {
        let (bus, spec, handler, shutdown) = (bus.clone(), spec.clone(), handler.clone(), shutdown.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(runtime::consume(bus, spec, handler, shutdown))
        })
    };
    publish_event(&bus, "edge-10", 1).await;
    let stream = bus.jetstream().get_stream(names::EVENTS_STREAM).await.unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    let info = loop {
        let info = stream.consumer_info(consumer).await;
        if let Ok(info) = info
            && handler.calls.load(Ordering::SeqCst) > 0
            && handler.running.load(Ordering::SeqCst) == 0
            && info.num_ack_pending == 0
            && info.num_pending == 0
        {
            break info;
        }
        assert!(tokio::time::Instant::now() < deadline, "never settled");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(info.delivered.stream_sequence > 0);
    // Long enough for another delivery, had one been due.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let info = stream.consumer_info(consumer).await.unwrap();
    // Its one message delivered more than once (a consumer sequence a delivery).
    assert!(info.delivered.consumer_sequence >= 2, "the server delivered it again during the stall: {info:?}");
    assert_eq!(handler.calls.load(Ordering::SeqCst), 1, "handled once, the delivery again dropped");
    assert_eq!(handler.most_at_once.load(Ordering::SeqCst), 1);
    assert_eq!((info.num_ack_pending, info.num_pending), (0, 0), "settled by the first attempt's ack");
    shutdown.cancel();
    tokio::task::spawn_blocking(move || looped.join().unwrap()).await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_answers_for_a_full_stream_are_store_full() {
    let server = NatsServer::start();
    let bus = bus(&server.url()).await;
    for (name, config) in [
        ("FULL_BYTES", stream::Config { max_bytes: 4096, ..Default::default() }),
        ("FULL_MSGS", stream::Config { max_messages: 2, ..Default::default() }),
    ] {
        let subject = format!("{}.x", name.to_lowercase());
        let config = stream::Config {
            name: name.into(),
            subjects: vec![subject.clone()],
            discard: stream::DiscardPolicy::New,
            ..config
        };
        bus.jetstream().create_stream(config).await.unwrap();
        let mut failure = None;
        for _ in 0..100 {
            let payload = bytes::Bytes::from(vec![b'x'; 512]);
            if let Err(e) = bus.publish_raw(subject.clone(), "test", payload, &Envelope::root()).await {
                failure = Some(e);
                break;
            }
        }
        let e: BusError = failure.expect("the stream fills up");
        assert_eq!(e.kind(), ErrorKind::StoreFull, "{name}: {}", runtime::error_chain(&e));
        let handler_error = HandlerError::from(e);
        assert!(handler_error.is_store_full(), "{name}");
    }
}

/// The real orchestrator: a command that keeps failing (its bucket refuses the write) is given up,
/// recorded as such in the ledger, listed by `landfall dead list`, and carried out by `landfall
/// dead replay` once the cause is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_keeps_failing_is_dead_lettered_and_replayed_once_fixed() {
    let server = NatsServer::start();
    let url = server.url();
    let bus = bus(&url).await;
    let packages = names::kv_stream(names::PACKAGES_BUCKET);
    let set_max_msg_size = async |size: i32| {
        let mut s = bus.jetstream().get_stream(&packages).await.unwrap();
        let mut config = s.info().await.unwrap().config.clone();
        config.max_message_size = size;
        bus.jetstream().update_stream(config).await.unwrap();
    };
    // The catalog refuses every record: registering a package fails, transiently, every time.
    set_max_msg_size(16).await;
    let shutdown = CancellationToken::new();
    let options = consumers::OrchestratorOptions { max_attempts: Some(3), ..Default::default() };
    let orchestrator = tokio::spawn(consumers::run_orchestrator_with(bus.clone(), options, shutdown.clone()));

    let env = Envelope::root();
    let cmd = pb::RegisterPackage { package: Some(fleet::kubelet("1.29.9")), auto_rollout: None };
    bus.publish_command(&cmd, &env).await.unwrap();
    let letter = dead_letter_of(&bus, names::ORCHESTRATOR_COMMANDS).await;
    assert_eq!(letter.letter.message_id, env.id);
    assert!(letter.letter.error.contains("transient"), "{}", letter.letter.error);
    let notice = fleet::wait_for(&bus, names::scope_events(names::FLEET), &env.correlation, WAIT).await;
    assert_eq!(notice.expect("a notice").delivery.type_name, pb::MessageDeadLettered::TYPE);
    let ledger = bus.kv(names::LEDGER_BUCKET).await.unwrap();
    let (record, _) = ledger.get::<pb::CommandRecord>(&keys::command(&env.id)).await.unwrap().unwrap();
    assert!(record.dead_lettered && !record.rejected, "{record:?}");

    let listed = landfall(&url, &["dead", "list"]).await;
    assert!(listed.status.success(), "{}", text(&listed.stderr));
    let listed = text(&listed.stdout);
    assert!(
        listed.contains("landfall.cmd.fleet.hub.register_package") && listed.contains(names::ORCHESTRATOR_COMMANDS),
        "{listed}"
    );
    let shown = landfall(&url, &["dead", "show", &letter.sequence.to_string(), "-o", "json"]).await;
    let shown: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(shown["payload"]["package"]["version"], "1.29.9", "{shown}");

    set_max_msg_size(-1).await;
    let replayed = landfall(&url, &["dead", "replay", &letter.sequence.to_string()]).await;
    assert!(replayed.status.success(), "{}", text(&replayed.stderr));
    assert!(text(&replayed.stdout).contains("replayed dead letter"), "{}", text(&replayed.stdout));
    let filter = names::event_subject(names::FLEET, pb::PackageRegistered::AGGREGATE, pb::PackageRegistered::KIND);
    let registered = fleet::wait_for(&bus, filter, &env.correlation, WAIT).await;
    assert!(registered.is_some(), "the replay was carried out");
    assert!(bus.dead_letter(letter.sequence).await.unwrap().is_none(), "the dead letter is removed");
    let again = landfall(&url, &["dead", "replay", &letter.sequence.to_string()]).await;
    assert!(!again.status.success(), "a dead letter is replayed once");

    shutdown.cancel();
    orchestrator.await.unwrap().unwrap();
}

/// Two orchestrator replicas share the command consumer. A site's first command waits for the
/// site's lease; the next, which needs no lease, is carried out only after it, whichever replica
/// holds which.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_keep_a_sites_commands_in_order() {
    const SITES: usize = 12;
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(SITES).nodes(2).orchestrators(2).start().await;
    let sagas = fleet.bus.kv(names::SAGAS_BUCKET).await.unwrap();
    let ledger = fleet.bus.kv(names::LEDGER_BUCKET).await.unwrap();
    let record = async |id: &str| ledger.get::<pb::CommandRecord>(&keys::command(id)).await.unwrap().map(|(r, _)| r);
    // Another saga holds each site (one that has no record yet is young: it holds for a minute).
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let mut pairs = Vec::new();
    for i in 0..SITES {
        let site = fleet.site_id(i);
        let lease = pb::SiteLease {
            site_id: site.clone(),
            saga_id: "held-by-the-test".into(),
            acquired_unix_ms: now,
            holder: 0,
        };
        sagas.put(&keys::site_lease(&site), &lease).await.unwrap();
        // A first command that must wait for the lease...
        let node = fleet.sites[i].0.nodes[0].name.to_string();
        let first = Envelope::root();
        let remove = pb::NodeRemoved { site_id: site.clone(), node, boot_mac: String::new(), reason: "test".into() };
        fleet.bus.publish_command(&remove, &first).await.unwrap();
        pairs.push((site, first));
    }
    // The server hands messages to the replicas' pulls in turn: one command of another scope in
    // between, so each site's next command goes to the replica that does not hold its first.
    let other = pb::InstallSite { site_id: "edge-99".into(), design_revision: 0 };
    fleet.bus.publish_command(&other, &Envelope::root()).await.unwrap();
    // ... then a second command of each site, which needs no lease.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut seconds = Vec::new();
    for (i, (site, _)) in pairs.iter().enumerate() {
        let second = Envelope::root();
        let register = pb::RegisterSite { design: Some(pb::SiteDesign::from(&fleet.sites[i].0)), expected: None };
        fleet.bus.publish_command(&register, &second).await.unwrap();
        seconds.push(second);
        assert!(!site.is_empty());
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    for ((site, first), second) in pairs.iter().zip(&seconds) {
        assert!(record(&first.id).await.is_none(), "{site}: the first waits for the lease");
        assert!(record(&second.id).await.is_none(), "{site}: the second waits for the first");
    }

    for (site, _) in &pairs {
        let (_, revision) = sagas.get::<pb::SiteLease>(&keys::site_lease(site)).await.unwrap().unwrap();
        sagas.delete_if(&keys::site_lease(site), revision).await.unwrap();
    }
    let mut crossed = 0;
    let mut replicas = std::collections::BTreeSet::new();
    for ((site, first), second) in pairs.iter().zip(&seconds) {
        let deadline = tokio::time::Instant::now() + WAIT;
        let (a, b) = loop {
            if let (Some(a), Some(b)) = (record(&first.id).await, record(&second.id).await) {
                break (a, b);
            }
            assert!(tokio::time::Instant::now() < deadline, "{site}: both settle once the lease is free");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(
            a.handled_unix_ms <= b.handled_unix_ms,
            "{site}: the second ({b:?}) was carried out before the first ({a:?})"
        );
        crossed += usize::from(a.handled_by != b.handled_by);
        replicas.extend([a.handled_by, b.handled_by]);
    }
    // Both replicas took part; where a site's two commands went to different replicas, the
    // order held across them (not only inside one process).
    assert_eq!(replicas.len(), 2, "{replicas:?}");
    assert!(crossed > 0, "no site's commands were split between the replicas: {replicas:?}");
    eprintln!("{crossed} of {SITES} sites had their two commands carried out by different replicas");
    fleet.stop().await;
}
