//! One install drawn as one trace. The orchestrator, the kubeconfig collector, the distribution
//! service and a site's gateway run as processes of their own, each sending spans to an OTLP/HTTP
//! receiver here (`--otlp-endpoint`), which reads them with the OpenTelemetry project's own
//! protobuf definitions (`opentelemetry-proto`). The install's spans, parented only through the
//! `traceparent` each message and request carries, must make one tree.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::routing::post;
use bus_schema::names;
use bus_schema::pb::{self, BusEvent, BusMessage};
use bus_schema::runtime::{Bus, Envelope, Topology};
use consumers::artifacts::ArtifactStore;
use landfall_tests::fleet::{self, TEST_KEY_HEX, TEST_SHRINK};
use landfall_tests::nats::NatsServer;
use landfall_tests::procs::Service;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message;

const WITHIN: Duration = Duration::from_secs(90);

/// A span as received: its service (its resource's `service.name`) and the span itself.
#[derive(Debug, Clone)]
struct Received {
    service: String,
    span: opentelemetry_proto::tonic::trace::v1::Span,
}

impl Received {
    fn id(&self) -> String {
        hex(&self.span.span_id)
    }

    fn parent(&self) -> Option<String> {
        (!self.span.parent_span_id.is_empty()).then(|| hex(&self.span.parent_span_id))
    }

    fn attribute(&self, key: &str) -> Option<String> {
        self.span.attributes.iter().find(|a| a.key == key).and_then(|a| match a.value.as_ref()?.value.as_ref()? {
            Value::StringValue(s) => Some(s.clone()),
            _ => None,
        })
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An OTLP/HTTP receiver: `POST /v1/traces` with a protobuf `ExportTraceServiceRequest`.
struct Receiver {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<Received>>>,
    refused: Arc<Mutex<Vec<String>>>,
}

impl Receiver {
    async fn start() -> Receiver {
        let spans = Arc::new(Mutex::new(Vec::new()));
        let refused = Arc::new(Mutex::new(Vec::new()));
        let (kept, bad) = (spans.clone(), refused.clone());
        let app = axum::Router::new().route(
            "/v1/traces",
            post(move |headers: axum::http::HeaderMap, body: Bytes| {
                let (kept, bad) = (kept.clone(), bad.clone());
                async move {
                    let content_type = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("");
                    if content_type != "application/x-protobuf" {
                        bad.lock().unwrap().push(format!("content-type {content_type:?}"));
                        return (axum::http::StatusCode::UNSUPPORTED_MEDIA_TYPE, Vec::new());
                    }
                    let request = match ExportTraceServiceRequest::decode(body) {
                        Ok(r) => r,
                        Err(e) => {
                            bad.lock().unwrap().push(e.to_string());
                            return (axum::http::StatusCode::BAD_REQUEST, Vec::new());
                        }
                    };
                    let mut kept = kept.lock().unwrap();
                    for rs in request.resource_spans {
                        let service = rs
                            .resource
                            .iter()
                            .flat_map(|r| &r.attributes)
                            .find(|a| a.key == "service.name")
                            .and_then(|a| match a.value.as_ref()?.value.as_ref()? {
                                Value::StringValue(s) => Some(s.clone()),
                                _ => None,
                            })
                            .unwrap_or_default();
                        for span in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
                            kept.push(Received { service: service.clone(), span });
                        }
                    }
                    // An empty ExportTraceServiceResponse: everything taken.
                    (axum::http::StatusCode::OK, Vec::new())
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Receiver { addr, spans, refused }
    }

    fn trace(&self, trace_id: &str) -> Vec<Received> {
        self.spans.lock().unwrap().iter().filter(|s| hex(&s.span.trace_id) == trace_id).cloned().collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_install_is_one_trace_across_the_orchestrator_gateway_kubeconfig_and_distribution() {
    let nats = NatsServer::start();
    let url = nats.url();
    let receiver = Receiver::start().await;
    let endpoint = format!("http://{}", receiver.addr);
    let dir = tempfile::tempdir().unwrap();
    let path = |p: &str| dir.path().join(p).to_str().unwrap().to_string();

    let bus = Bus::connect(&url, "traces-test").await.unwrap();
    bus.ensure_topology(&Topology::default()).await.unwrap();
    let store = ArtifactStore::local(&dir.path().join("artifacts")).unwrap();
    let catalog = producers::up::upload_demo_packages(&store, TEST_SHRINK).await.unwrap();
    let key = dir.path().join("secret.key");
    landfall_tests::secrets::write_key_file(&key, TEST_KEY_HEX);

    let traced = |name: &str, args: &[&str]| {
        let mut args = args.to_vec();
        args.extend(["--otlp-endpoint", endpoint.as_str()]);
        Service::start(name, &url, dir.path(), &args)
    };
    let mut services = vec![
        traced("orchestrator", &["serve", "orchestrator"]),
        traced("kubeconfig", &["serve", "kubeconfig", "--secret-key-file", key.to_str().unwrap()]),
        traced("distribution", &["serve", "distribution", "--store", &path("artifacts")]),
    ];
    let mut last = Envelope::root();
    for p in catalog {
        last = Envelope::root();
        bus.publish_command(&pb::RegisterPackage { package: Some(p), auto_rollout: None }, &last).await.unwrap();
    }
    fleet::wait_for(&bus, pb::PackageRegistered::filter(), &last.id, WITHIN).await.expect("packages registered");
    let design = producers::up::demo_site(0, 2);
    let site = design.site.to_string();
    let registered = Envelope::root();
    let cmd = pb::RegisterSite { design: Some(pb::SiteDesign::from(&design)), expected: None };
    bus.publish_command(&cmd, &registered).await.unwrap();
    fleet::wait_for(&bus, pb::SiteRegistered::filter(), &registered.id, WITHIN).await.expect("site registered");
    services.push(traced(
        "gateway",
        &[
            "serve",
            "gateway",
            "--site",
            &site,
            "--backend",
            "sim",
            "--time-scale",
            "300",
            "--cache-dir",
            &path("cache"),
        ],
    ));

    // The install, published by this test (which sends no spans): its acceptance is the root.
    let install = Envelope::root();
    bus.publish_command(&pb::InstallSite { site_id: site.clone(), ..Default::default() }, &install).await.unwrap();
    let ends = [pb::SiteInstalled::TYPE, pb::SiteInstallFailed::TYPE];
    let run = fleet::collect(&bus, names::EVENTS_ALL.into(), "install", &install.id, &ends, WITHIN).await;
    let types: Vec<&str> = run.events.iter().map(|e| e.delivery.type_name.as_str()).collect();
    assert_eq!(types.last(), Some(&pb::SiteInstalled::TYPE), "{types:?}");
    fleet::wait_for(&bus, pb::KubeconfigStored::filter(), &install.id, WITHIN).await.expect("kubeconfig collected");

    // Every span of the install has come once nothing new has come for a few batches.
    let trace_id = install.trace_id().unwrap().to_string();
    let deadline = tokio::time::Instant::now() + WITHIN;
    let mut seen = 0;
    let spans = loop {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let spans = receiver.trace(&trace_id);
        let stored = spans.iter().any(|s| s.span.name == "publish KubeconfigStored");
        if stored && spans.len() == seen {
            break spans;
        }
        seen = spans.len();
        assert!(
            tokio::time::Instant::now() < deadline,
            "spans still coming after {WITHIN:?}: {}\n{}",
            spans.len(),
            services
                .iter()
                .map(|s| format!("{}:\n{}", s.name, s.log_text().lines().take(12).collect::<Vec<_>>().join("\n")))
                .collect::<Vec<_>>()
                .join("\n")
        );
    };
    assert!(receiver.refused.lock().unwrap().is_empty(), "refused: {:?}", receiver.refused.lock().unwrap());
    for s in &services {
        assert!(!s.log_text().contains("spans; dropped"), "{} dropped spans:\n{}", s.name, s.log_tail(30));
    }
    let tree = draw(&spans);
    println!("{tree}");

    // One tree: span ids unique, one root, every other span's parent in the trace.
    let by_id: BTreeMap<String, &Received> = spans.iter().map(|s| (s.id(), s)).collect();
    assert_eq!(by_id.len(), spans.len(), "a span id twice:\n{tree}");
    let roots: Vec<&Received> = spans.iter().filter(|s| s.parent().is_none()).collect();
    assert_eq!(roots.len(), 1, "one root:\n{tree}");
    assert_eq!(
        (roots[0].service.as_str(), roots[0].span.name.as_str()),
        ("landfall-orchestrator", "InstallSite accepted")
    );
    for s in &spans {
        if let Some(parent) = s.parent() {
            assert!(by_id.contains_key(&parent), "{} has no parent in the trace:\n{tree}", s.span.name);
        }
        assert!(s.span.end_time_unix_nano >= s.span.start_time_unix_nano, "{} ends before it starts", s.span.name);
        assert_eq!(s.attribute("landfall.correlation_id").unwrap_or(install.id.clone()), install.id);
    }
    let services_seen: BTreeSet<&str> = spans.iter().map(|s| s.service.as_str()).collect();
    for service in ["landfall-orchestrator", "landfall-gateway", "landfall-kubeconfig", "landfall-distribution"] {
        assert!(services_seen.contains(service), "no span of {service}:\n{tree}");
    }

    // What the spans stand for, each under what caused it.
    let parent_of = |s: &Received| by_id.get(&s.parent().unwrap_or_default()).copied();
    let named = |name: &str| spans.iter().filter(|s| s.span.name == name).collect::<Vec<_>>();
    let accepted = named("orchestrator-commands InstallSite");
    assert_eq!(accepted.len(), 1, "the command handled once:\n{tree}");
    assert_eq!(parent_of(accepted[0]).map(|p| p.span.name.as_str()), Some("InstallSite accepted"));
    // Each job the orchestrator published is a gateway's handling's parent, across processes.
    let jobs: Vec<&Received> = spans
        .iter()
        .filter(|s| s.service == "landfall-orchestrator" && s.span.kind == SpanKind::Producer as i32)
        .filter(|s| s.attribute("messaging.destination.name").is_some_and(|d| d.starts_with("landfall.job.")))
        .collect();
    assert!(jobs.len() >= 3, "the install's jobs:\n{tree}");
    for job in &jobs {
        let handled = spans.iter().any(|s| {
            s.service == "landfall-gateway" && s.span.kind == SpanKind::Consumer as i32 && s.parent() == Some(job.id())
        });
        assert!(handled, "{} has no gateway handling under it:\n{tree}", job.span.name);
    }
    // Each event the gateway published is handled by the orchestrator under it: a saga step.
    let steps = spans.iter().filter(|s| {
        s.service == "landfall-orchestrator"
            && s.span.name.starts_with("orchestrator-events ")
            && parent_of(s).is_some_and(|p| p.service == "landfall-gateway")
    });
    assert!(steps.count() >= 3, "saga steps moved by the gateway's events:\n{tree}");
    // Staging asks the distribution service, from within the gateway's job.
    let staging = named("answer artifact_plan");
    assert!(!staging.is_empty(), "no plan answered:\n{tree}");
    for s in &staging {
        assert_eq!(s.service, "landfall-distribution");
        let asked_by = parent_of(s).unwrap();
        assert_eq!(asked_by.span.name, format!("gateway-{site} StageArtifacts"), "{tree}");
    }
    // The collector asks the gateway for the kubeconfig while handling ClusterReady.
    let collected = named("kubeconfig-events ClusterReady");
    assert_eq!(collected.len(), 1, "{tree}");
    let answered: Vec<&Received> = spans
        .iter()
        .filter(|s| s.parent() == Some(collected[0].id()) && s.span.kind == SpanKind::Server as i32)
        .collect();
    assert_eq!(answered.len(), 1, "{tree}");
    assert_eq!(answered[0].service, "landfall-gateway");
    assert!(spans.iter().any(|s| s.span.name == "publish KubeconfigStored" && s.service == "landfall-kubeconfig"));

    // A command refused: its span and its handling's say why, and the rejection hangs under
    // the handling that refused it.
    let refused = Envelope::root();
    bus.publish_command(&pb::InstallSite { site_id: "nowhere".into(), ..Default::default() }, &refused).await.unwrap();
    let ends = [pb::CommandRejected::TYPE];
    fleet::collect(&bus, names::EVENTS_ALL.into(), "refusal", &refused.id, &ends, WITHIN).await;
    let trace_id = refused.trace_id().unwrap().to_string();
    let deadline = tokio::time::Instant::now() + WITHIN;
    let spans = loop {
        let spans = receiver.trace(&trace_id);
        if spans.len() >= 3 {
            break spans;
        }
        assert!(tokio::time::Instant::now() < deadline, "the refusal's spans: {}", draw(&spans));
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let tree = draw(&spans);
    let named = |name: &str| spans.iter().find(|s| s.span.name == name).unwrap_or_else(|| panic!("{name}:\n{tree}"));
    let (root, handling, rejection) =
        (named("InstallSite accepted"), named("orchestrator-commands InstallSite"), named("publish CommandRejected"));
    let error = opentelemetry_proto::tonic::trace::v1::status::StatusCode::Error as i32;
    for s in [root, handling] {
        let status = s.span.status.clone().unwrap_or_default();
        assert_eq!(status.code, error, "{}: {status:?}", s.span.name);
        assert!(status.message.contains("nowhere"), "{}: {status:?}", s.span.name);
    }
    assert_eq!(rejection.parent(), Some(handling.id()), "{tree}");
    assert_eq!(rejection.service, "landfall-orchestrator");
    drop(services);
}

/// The trace as an indented tree, for the test's output and its failures.
fn draw(spans: &[Received]) -> String {
    let mut children: BTreeMap<Option<String>, Vec<&Received>> = BTreeMap::new();
    for s in spans {
        children.entry(s.parent()).or_default().push(s);
    }
    for list in children.values_mut() {
        list.sort_by_key(|s| s.span.start_time_unix_nano);
    }
    let ids: BTreeSet<String> = spans.iter().map(Received::id).collect();
    let mut out = format!("{} spans\n", spans.len());
    fn walk(out: &mut String, children: &BTreeMap<Option<String>, Vec<&Received>>, at: Option<String>, depth: usize) {
        for s in children.get(&at).into_iter().flatten() {
            let ms = (s.span.end_time_unix_nano.saturating_sub(s.span.start_time_unix_nano)) / 1_000_000;
            out.push_str(&format!("{}{} [{}] {ms} ms\n", "  ".repeat(depth), s.span.name, s.service));
            walk(out, children, Some(s.id()), depth + 1);
        }
    }
    walk(&mut out, &children, None, 0);
    // Spans whose parent never came, drawn under a marker.
    for (parent, list) in &children {
        if let Some(p) = parent
            && !ids.contains(p)
        {
            out.push_str(&format!("(missing parent {p})\n"));
            for s in list {
                out.push_str(&format!("  {} [{}]\n", s.span.name, s.service));
            }
        }
    }
    out
}
