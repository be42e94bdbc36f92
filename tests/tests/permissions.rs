//! The site trust boundary on real servers, with the users the real `landfall deploy
//! nats-config` generates: a site's key in a stranger's hands reaches no other site's jobs
//! through its consumer and answers into no reply subject not meant for it (not even across its
//! leaf node's link), the API writes no bucket, and no hub service touches another's consumers
//! or deletes a stream. That the whole install still works with every process as its own user
//! is `topology.rs`'s and `chaos.rs`'s to show.

use std::time::Duration;

use async_nats::jetstream::consumer;
use bus_schema::access::{self, HUB_DOMAIN, Role};
use bus_schema::names;
use bus_schema::pb::BusMessage;
use bus_schema::runtime::{self, Access, Bus, RequestError, Topology};
use bytes::Bytes;
use futures::StreamExt;
use landfall_tests::topology::{ConfServer, Deployment, ServerErrors, connect_when_ready, raw_client, refused};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// The hub (one server) of two sites, its streams and buckets made by the operator.
async fn hub() -> (Deployment, Vec<ConfServer>, String, Bus) {
    let d = Deployment::generate(&["edge-01", "edge-02"], 1, None);
    let hubs = d.start_hubs();
    let url = d.hub_urls("nats");
    let operator = connect_when_ready(&url, "landfall-test-operator", &d.access(&Role::Operator)).await;
    operator.ensure_topology(&Topology::default()).await.expect("the streams and buckets");
    (d, hubs, url, operator)
}

/// The hub's JetStream API as a site's gateway addresses it from its leaf node.
fn hub_api() -> String {
    format!("$JS.{HUB_DOMAIN}.API")
}

fn site(id: &str) -> Role {
    Role::Site(id.into())
}

fn key(d: &Deployment, role: &Role) -> String {
    d.access(role).public_key().unwrap().unwrap()
}

/// A JetStream API request the user may make, and the server's answer.
async fn js_request(client: &async_nats::Client, subject: &str, body: &Value) -> Value {
    let request =
        async_nats::Request::new().payload(Bytes::from(body.to_string())).timeout(Some(Duration::from_secs(10)));
    let answer = client.send_request(subject.to_string(), request).await.expect("an answer");
    serde_json::from_slice(&answer.payload).expect("a JSON answer")
}

/// `subject` is refused by the server as a publish of this user's, and gets no answer.
async fn publish_refused(client: &async_nats::Client, errors: &ServerErrors, subject: &str, body: &Value) {
    errors.lock().unwrap().clear();
    let inbox = client.new_inbox();
    let mut answers = client.subscribe(inbox.clone()).await.unwrap();
    client.publish_with_reply(subject.to_string(), inbox, Bytes::from(body.to_string())).await.unwrap();
    // The hub maps its own domain's API (`$JS.hub.API`) onto `$JS.API` before it checks a
    // permission, and names the subject it checked.
    let checked = subject.replacen(&hub_api(), "$JS.API", 1);
    let e = refused(errors, &format!("\"{checked}\"")).await;
    assert!(e.contains("Permissions Violation for Publish"), "{e}");
    let answer = tokio::time::timeout(Duration::from_millis(100), answers.next()).await;
    assert!(answer.is_err(), "{subject} was answered: {answer:?}");
}

/// A core publish that the server lets through (no violation within a moment).
async fn publish_allowed(client: &async_nats::Client, errors: &ServerErrors, subject: &str) {
    errors.lock().unwrap().clear();
    client.publish(subject.to_string(), Bytes::from_static(b"x")).await.unwrap();
    client.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(errors.lock().unwrap().is_empty(), "{subject}: {:?}", errors.lock().unwrap());
}

/// A create request for the durable `name` on the jobs stream, with `config`'s fields.
fn create(name: &str, config: Value) -> Value {
    let mut c = json!({"durable_name": name, "ack_policy": "explicit", "deliver_policy": "all"});
    for (k, v) in config.as_object().unwrap() {
        c[k] = v.clone();
    }
    json!({"stream_name": names::site_jobs_stream("edge-01"), "config": c})
}

fn filter(site: &str) -> Value {
    json!({"filter_subject": names::site_jobs(site)})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_creates_no_consumer_not_even_its_own() {
    let (d, _hubs, url, operator) = hub().await;
    let (client, errors) = raw_client(&url, &d.access(&site("edge-01"))).await;
    let jobs = names::site_jobs_stream("edge-01");
    let own = names::gateway_consumer("edge-01");
    let other = names::gateway_consumer("edge-02");
    let pinned = |api: &str| format!("{api}.CONSUMER.CREATE.{jobs}.{own}.{}", names::site_jobs("edge-01"));
    let push =
        json!({"filter_subject": names::site_jobs("edge-01"), "deliver_subject": "landfall.cmd.node_added.edge-02"});

    // Refused by its permissions, through the hub's API and through the hub's domain alike.
    for api in ["$JS.API".to_string(), hub_api()] {
        for (subject, body) in [
            // Its own durable, its own jobs as the filter: the hub makes it, not the site (which
            // could make it a push consumer delivering its jobs wherever it likes).
            (pinned(&api), create(&own, filter("edge-01"))),
            (pinned(&api), create(&own, push.clone())),
            // Its durable, filtered on edge-02's jobs (or every site's).
            (format!("{api}.CONSUMER.CREATE.{jobs}.{own}.landfall.job.edge-02.>"), create(&own, filter("edge-02"))),
            (format!("{api}.CONSUMER.CREATE.{jobs}.{own}.landfall.job.*.>"), create(&own, filter("*"))),
            // Its durable with the filter only in the body: edge-02's, or its own.
            (format!("{api}.CONSUMER.CREATE.{jobs}.{own}"), create(&own, filter("edge-02"))),
            (format!("{api}.CONSUMER.CREATE.{jobs}.{own}"), create(&own, filter("edge-01"))),
            (format!("{api}.CONSUMER.DURABLE.CREATE.{jobs}.{own}"), create(&own, filter("edge-02"))),
            // Another site's durable, an unnamed consumer, another name.
            (format!("{api}.CONSUMER.CREATE.{jobs}.{other}.landfall.job.edge-02.>"), create(&other, filter("edge-02"))),
            (format!("{api}.CONSUMER.CREATE.{jobs}"), json!({"stream_name": jobs, "config": filter("edge-02")})),
            (format!("{api}.CONSUMER.CREATE.{jobs}.spare.landfall.job.edge-01.>"), create("spare", filter("edge-01"))),
        ] {
            publish_refused(&client, &errors, &subject, &body).await;
        }
    }
    let stream = operator.jetstream().get_stream(jobs).await.unwrap();
    for name in [&own, &other, &"spare".to_string()] {
        assert!(stream.consumer_info(name.as_str()).await.is_err(), "{name} was created");
    }

    // The orchestrator makes it; even it only with the filter its create subject names.
    let (orchestrator, _) = raw_client(&url, &d.access(&Role::Orchestrator)).await;
    for body in [
        create(&own, filter("edge-02")),
        create(&own, json!({"filter_subjects": [names::site_jobs("edge-02")]})),
        create(
            &own,
            json!({"filter_subject": names::site_jobs("edge-01"), "filter_subjects": [names::site_jobs("edge-02")]}),
        ),
    ] {
        let answer = js_request(&orchestrator, &pinned("$JS.API"), &body).await;
        assert_eq!(answer["error"]["code"], 400, "{answer}");
    }
    // Nor in another shard's stream than the site's.
    let elsewhere = names::jobs_stream((names::job_shard("edge-01") + 1) % names::JOB_SHARDS);
    let (orchestrator_raw, orchestrator_errors) = raw_client(&url, &d.access(&Role::Orchestrator)).await;
    publish_refused(
        &orchestrator_raw,
        &orchestrator_errors,
        &format!("$JS.API.CONSUMER.CREATE.{elsewhere}.{own}.{}", names::site_jobs("edge-01")),
        &json!({"stream_name": elsewhere, "config": {"durable_name": own, "filter_subject": names::site_jobs("edge-01")}}),
    )
    .await;
    let answer = js_request(&orchestrator, &pinned("$JS.API"), &create(&own, filter("edge-01"))).await;
    assert_eq!(answer["config"]["filter_subject"], names::site_jobs("edge-01"), "{answer}");
    let info = stream.consumer_info(own.as_str()).await.unwrap();
    assert_eq!(info.config.filter_subject, names::site_jobs("edge-01"));
    // Once it exists, the site still may not touch it.
    publish_refused(&client, &errors, &pinned("$JS.API"), &create(&own, push)).await;
    println!("permissions: site edge-01 may create no consumer, its own included");
}

/// The gateway's own consume loop waits for the durable the hub makes when the site is
/// registered, then consumes its jobs through the hub's domain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_waits_for_the_durable_the_hub_makes_then_consumes_through_the_hubs_domain() {
    let (d, _hubs, url, operator) = hub().await;
    let access = Access { js_domain: Some(HUB_DOMAIN.into()), ..d.access(&site("edge-01")) };
    let bus = Bus::connect_with(&url, "landfall-test-gateway", &access).await.unwrap();
    let spec = runtime::ConsumerSpec::gateway("edge-01");
    let durable = spec.durable.clone();
    struct Count(std::sync::atomic::AtomicUsize);
    impl runtime::Handler for Count {
        async fn handle(&self, _: &runtime::Delivery) -> Result<(), runtime::HandlerError> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        }
    }
    let handled = std::sync::Arc::new(Count(Default::default()));
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(runtime::consume(bus, spec, handled.clone(), shutdown.clone()));
    let stream = operator.jetstream().get_stream(names::site_jobs_stream("edge-01")).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(stream.consumer_info(durable.as_str()).await.is_err(), "the site made its own consumer");

    // The orchestrator makes it (as it does when the site is registered); the gateway finds it.
    let orchestrator =
        Bus::connect_with(&url, "landfall-test-orchestrator", &d.access(&Role::Orchestrator)).await.unwrap();
    runtime::ensure_consumer(&orchestrator, &runtime::ConsumerSpec::gateway("edge-01")).await.unwrap();
    operator
        .jetstream()
        .publish(names::job_subject("edge-01", "stage_artifacts"), Bytes::new())
        .await
        .unwrap()
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while handled.0.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        assert!(std::time::Instant::now() < deadline, "the gateway consumed nothing");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let info = stream.consumer_info(durable.as_str()).await.unwrap();
    assert_eq!(info.config.filter_subject, names::site_jobs("edge-01"));
    shutdown.cancel();
    run.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_answers_only_into_reply_subjects_scoped_to_it_even_across_its_leaf_link() {
    let (d, hubs, url, _operator) = hub().await;
    let (client, errors) = raw_client(&url, &d.access(&site("edge-01"))).await;
    let (kc, op, api) = (key(&d, &Role::Kubeconfig), key(&d, &Role::Operator), key(&d, &Role::Api));
    let scoped = |k: &str, s: &str| names::site_replies(s, &access::inbox(k));
    for subject in [
        format!("{}.reply1", access::inbox(&kc)),
        format!("{}.mux.1", access::inbox(&op)),
        format!("{}.x1", scoped(&kc, "edge-02")),
        format!("{}.x1", scoped(&op, "edge-02")),
        format!("{}.site.edge-01.x1", access::inbox(&api)),
        "_INBOX.site.edge-01.x1".to_string(),
    ] {
        errors.lock().unwrap().clear();
        client.publish(subject.clone(), Bytes::new()).await.unwrap();
        let e = refused(&errors, &format!("\"{subject}\"")).await;
        assert!(e.contains("Permissions Violation for Publish"), "{e}");
    }
    // Into its own scope, the requester gets it.
    for (role, k) in [(Role::Kubeconfig, &kc), (Role::Operator, &op)] {
        let (requester, refusals) = raw_client(&url, &d.access(&role)).await;
        let mut replies = requester.subscribe(format!("{}.>", scoped(k, "edge-01"))).await.unwrap();
        requester.flush().await.unwrap();
        let subject = format!("{}.answer", scoped(k, "edge-01"));
        // Published again every 2 s, for 20 s: with the whole suite beside it, one answer in
        // about ten full runs never arrived (nothing refused, on a single server), and the
        // property here is that the answer is let through, not that a lone message is never lost.
        let mut got = None;
        for attempt in 1..=10 {
            publish_allowed(&client, &errors, &subject).await;
            if let Ok(answer) = tokio::time::timeout(Duration::from_secs(2), replies.next()).await {
                if attempt > 1 {
                    eprintln!("the answer on {subject} arrived at attempt {attempt}");
                }
                got = answer;
                break;
            }
        }
        let got = got.unwrap_or_else(|| {
            panic!("no answer on {subject} within 20 s; the requester was refused: {:?}", refusals.lock().unwrap())
        });
        assert_eq!(got.subject.as_str(), subject);
    }

    // Across the site's leaf node: a responder there, as the site's user, answers the
    // collector's request made with `request_site`; a plain request's inbox is not the site's,
    // and its answer never reaches the hub.
    let leaf = d.start_leaf("edge-01");
    let site_bus = Bus::connect_with(&format!("nats://127.0.0.1:{}", leaf.port), "landfall-test-site", &{
        Access { js_domain: Some(HUB_DOMAIN.into()), ..d.access(&site("edge-01")) }
    })
    .await
    .unwrap();
    let collector = Bus::connect_with(&url, "landfall-test-collector", &d.access(&Role::Kubeconfig)).await.unwrap();
    let subject = names::kubeconfig_rpc("edge-01");
    let ask = || collector.request_site("edge-01", subject.clone(), Bytes::from_static(b"hi"), Duration::from_secs(2));
    let shutdown = CancellationToken::new();
    let serving = tokio::spawn({
        let (bus, subject, shutdown) = (site_bus.clone(), subject.clone(), shutdown.clone());
        async move {
            runtime::serve_requests(&bus, subject, "gateway-edge-01", 1, shutdown, |_, payload| async move {
                match &payload[..] {
                    b"hi" => (async_nats::HeaderMap::new(), Bytes::from_static(b"kubeconfig")),
                    _ => runtime::error_reply("not what a gateway is asked"),
                }
            })
            .await
        }
    });
    // The responder's interest crosses the link in a moment.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let (_, body) = loop {
        match ask().await {
            Ok(answer) => break answer,
            Err(e) => {
                assert!(std::time::Instant::now() < deadline, "no answer across the leaf link: {e}\n{}", leaf.log());
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert_eq!(&body[..], b"kubeconfig");
    let refusal = collector.request_site("edge-01", subject.clone(), Bytes::from_static(b"?"), Duration::from_secs(2));
    match refusal.await {
        Err(RequestError::Refused { reason, .. }) => assert_eq!(reason, "not what a gateway is asked"),
        other => panic!("{other:?}"),
    }
    match collector.request(subject.clone(), Bytes::from_static(b"hi"), Duration::from_secs(2)).await {
        Err(RequestError::TimedOut { .. }) => {}
        other => panic!("an answer into an inbox not scoped to the site crossed its link: {other:?}"),
    }
    match collector
        .request_site("edge-02", names::kubeconfig_rpc("edge-02"), Bytes::new(), Duration::from_secs(2))
        .await
    {
        Err(RequestError::NoResponders { .. }) => {}
        other => panic!("{other:?}"),
    }
    shutdown.cancel();
    serving.await.unwrap().unwrap();
    drop(leaf);
    drop(hubs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_writes_only_what_it_holds_and_no_service_touches_anothers_consumers_or_deletes_a_stream() {
    let (d, _hubs, url, operator) = hub().await;
    // The durables exist, as their services made them.
    let events = operator.jetstream().get_stream(names::EVENTS_STREAM).await.unwrap();
    for durable in [names::ORCHESTRATOR_EVENTS, names::OBSERVER_EVENTS, names::KUBECONFIG_EVENTS] {
        events
            .create_consumer(consumer::pull::Config { durable_name: Some(durable.into()), ..Default::default() })
            .await
            .unwrap();
    }
    let (api, errors) = raw_client(&url, &d.access(&Role::Api)).await;
    // Only the commands it holds for a second person are the API's to write.
    for bucket in names::ALL_BUCKETS.into_iter().filter(|b| *b != names::APPROVALS_BUCKET) {
        let subject = format!("$KV.{bucket}.site.edge-01");
        errors.lock().unwrap().clear();
        api.publish(subject.clone(), Bytes::from_static(b"x")).await.unwrap();
        refused(&errors, &format!("\"{subject}\"")).await;
    }
    let evt = names::EVENTS_STREAM;
    let cfg =
        |name: &str| json!({"stream_name": evt, "config": {"name": name, "filter_subject": "landfall.evt.none.>"}});
    for (subject, body) in [
        (format!("$JS.API.STREAM.DELETE.{evt}"), json!({})),
        (format!("$JS.API.STREAM.PURGE.{evt}"), json!({})),
        (format!("$JS.API.CONSUMER.DELETE.{evt}.{}", names::ORCHESTRATOR_EVENTS), json!({})),
        (format!("$JS.API.CONSUMER.CREATE.{evt}.{}", names::ORCHESTRATOR_EVENTS), cfg(names::ORCHESTRATOR_EVENTS)),
        (
            format!("$JS.API.CONSUMER.CREATE.{evt}.{}.landfall.evt.none.>", names::OBSERVER_EVENTS),
            cfg(names::OBSERVER_EVENTS),
        ),
        (format!("$JS.API.CONSUMER.MSG.NEXT.{evt}.{}", names::KUBECONFIG_EVENTS), json!({"batch": 1})),
        // Unnamed, the name would be in the body: the server would rename a durable by it.
        (format!("$JS.API.CONSUMER.CREATE.{evt}"), cfg(names::ORCHESTRATOR_EVENTS)),
        (
            format!("$JS.API.CONSUMER.DURABLE.CREATE.{evt}.{}", names::ORCHESTRATOR_EVENTS),
            cfg(names::ORCHESTRATOR_EVENTS),
        ),
    ] {
        publish_refused(&api, &errors, &subject, &body).await;
    }
    // Other services keep to their own, too.
    let refusals = [
        (Role::Orchestrator, format!("$JS.API.CONSUMER.DELETE.{evt}.{}", names::OBSERVER_EVENTS)),
        (Role::Orchestrator, format!("$JS.API.CONSUMER.CREATE.{evt}.{}", names::KUBECONFIG_EVENTS)),
        (Role::Observer, format!("$JS.API.CONSUMER.MSG.NEXT.{evt}.{}", names::ORCHESTRATOR_EVENTS)),
        (Role::Kubeconfig, format!("$JS.API.STREAM.PURGE.{}", names::site_jobs_stream("edge-01"))),
        (Role::Orchestrator, format!("$KV.{}.kubeconfig.edge-01", names::KUBECONFIGS_BUCKET)),
        (Role::Observer, format!("$KV.{}.site.edge-01", names::SITES_BUCKET)),
        (Role::Kubeconfig, format!("$KV.{}.saga.x", names::SAGAS_BUCKET)),
        (Role::Distribution, format!("$KV.{}.pkg.kubelet.1", names::PACKAGES_BUCKET)),
    ];
    for (role, subject) in refusals {
        let (client, errors) = raw_client(&url, &d.access(&role)).await;
        publish_refused(&client, &errors, &subject, &json!({})).await;
    }
    let info = events.consumer_info(names::ORCHESTRATOR_EVENTS).await.unwrap();
    assert_eq!(info.config.durable_name.as_deref(), Some(names::ORCHESTRATOR_EVENTS), "the durable is untouched");

    // What the API does read, it still can: buckets (get, watch, scan) and events (its own readers).
    let bus = Bus::connect_with(&url, "landfall-test-api", &d.access(&Role::Api)).await.unwrap();
    operator
        .kv(names::SAGAS_BUCKET)
        .await
        .unwrap()
        .put(&bus_schema::names::keys::rollout("r1"), &bus_schema::pb::Rollout::default())
        .await
        .unwrap();
    let sagas = bus.kv(names::SAGAS_BUCKET).await.unwrap();
    assert!(sagas.get::<bus_schema::pb::Rollout>("rollout.r1").await.unwrap().is_some());
    assert_eq!(sagas.scan::<bus_schema::pb::Rollout>("rollout.").await.unwrap().len(), 1);
    let mut watch = Box::pin(sagas.watch_latest(vec!["rollout.*".into()]).await.unwrap());
    let first = tokio::time::timeout(Duration::from_secs(5), watch.next()).await.unwrap().unwrap().unwrap();
    assert_eq!(first.key, "rollout.r1");
    let event = bus_schema::pb::SiteRegistered { site_id: "edge-01".into(), ..Default::default() };
    operator.publish_event(&event, &runtime::Envelope::root()).await.unwrap();
    let mut reader = bus.read_events(vec![names::EVENTS_ALL.into()], consumer::DeliverPolicy::All).await.unwrap();
    let read = tokio::time::timeout(Duration::from_secs(5), reader.next()).await.unwrap().unwrap().unwrap();
    assert_eq!(read.delivery.type_name, bus_schema::pb::SiteRegistered::TYPE);
    assert!(sagas.put(&bus_schema::names::keys::rollout("r2"), &bus_schema::pb::Rollout::default()).await.is_err());
}

/// The orchestrator moves an earlier version's one jobs stream into the shards with nothing but
/// its own permissions (the hub logs no refusal), filing what it held that is no job as a dead
/// letter, and a site's gateway then takes its moved job through its durable in its shard, with
/// its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_orchestrator_moves_an_earlier_versions_jobs_stream_with_its_own_permissions() {
    let d = Deployment::generate(&["edge-01", "edge-02"], 1, None);
    let hubs = d.start_hubs();
    let url = d.hub_urls("nats");
    let operator = connect_when_ready(&url, "landfall-test-operator", &d.access(&Role::Operator)).await;
    let js = operator.jetstream();
    let legacy = landfall_tests::site_state::earlier_jobs_stream(js).await;
    legacy
        .create_consumer(consumer::push::Config {
            durable_name: Some(names::gateway_consumer("edge-01")),
            deliver_subject: names::site_deliver("edge-01"),
            filter_subject: names::site_every_job("edge-01"),
            ack_policy: consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(names::headers::MSG_ID, "moved-job");
    js.publish_with_headers("landfall.job.edge-01.stage_artifacts", headers, "job".into())
        .await
        .unwrap()
        .await
        .unwrap();
    // Something the old stream held that is no job: filed as a dead letter, not lost.
    js.publish("landfall.job.edge-01.not.a.job", "stray".into()).await.unwrap().await.unwrap();

    // A hub keeping a durable per site makes the moved durable in its shard.
    let orchestrator = Bus::connect_with(&url, "landfall-test-orchestrator", &d.access(&Role::Orchestrator))
        .await
        .unwrap()
        .with_job_delivery(runtime::JobDelivery::Durable);
    orchestrator.ensure_topology(&Topology::default().aligning()).await.expect("the move");
    assert!(js.get_stream(names::LEGACY_JOBS_STREAM).await.is_err());
    let letters = operator.read_dead_letters().await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = &letters[0].letter;
    assert_eq!(
        (letter.subject.as_str(), letter.consumer.as_str()),
        ("landfall.job.edge-01.not.a.job", names::JOBS_MOVE)
    );
    assert_eq!(letter.payload, b"stray");

    let access = Access { js_domain: Some(HUB_DOMAIN.into()), ..d.access(&site("edge-01")) };
    let gateway = Bus::connect_with(&url, "landfall-test-gateway", &access).await.unwrap();
    struct Seen(tokio::sync::mpsc::UnboundedSender<String>);
    impl runtime::Handler for Seen {
        async fn handle(&self, d: &runtime::Delivery) -> Result<(), runtime::HandlerError> {
            self.0.send(d.subject.clone()).ok();
            Ok(())
        }
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let shutdown = CancellationToken::new();
    let spec = runtime::ConsumerSpec::gateway("edge-01");
    let run = tokio::spawn(runtime::consume(gateway, spec, std::sync::Arc::new(Seen(tx)), shutdown.clone()));
    let got = tokio::time::timeout(Duration::from_secs(20), rx.recv()).await.expect("the moved job").unwrap();
    assert_eq!(got, names::job_subject("edge-01", "stage_artifacts"));
    let shard = js.get_stream(names::site_jobs_stream("edge-01")).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while shard.clone().info().await.unwrap().state.messages > 0 {
        assert!(std::time::Instant::now() < deadline, "the job was not acknowledged");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    shutdown.cancel();
    run.await.unwrap().unwrap();
    let log = hubs[0].log();
    assert!(!log.contains("Permissions Violation"), "refused:\n{log}");
}
