//! Spans sent to an OpenTelemetry collector (or any backend that takes OTLP) over OTLP/HTTP
//! with protobuf bodies: `POST <endpoint>/v1/traces`.
//!
//! The spans are those the bus runtime makes (`bus_schema::runtime::trace`): one per message
//! handled, published and request answered, parented through the `traceparent` every message and
//! request carries, so one install is one trace across the orchestrator, the gateway, the
//! kubeconfig collector and the distribution service. They are batched (up to
//! [`BATCH`] spans, or what came in [`EVERY`]) and sent by one task; a batch the collector
//! does not take is tried again a few times, then dropped and counted
//! (`landfall_spans_dropped_total`). Spans never hold up the work they describe: when the
//! queue is full (the collector is out of reach), new ones are dropped and counted.
//!
//! Configured the OpenTelemetry way: `--otlp-endpoint` or `OTEL_EXPORTER_OTLP_ENDPOINT` (a
//! base URL, `/v1/traces` appended), `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (the full URL, as
//! given), `OTEL_EXPORTER_OTLP_HEADERS` / `…_TRACES_HEADERS` (`key=value,…`, e.g. a backend's
//! API key), `OTEL_RESOURCE_ATTRIBUTES` (`key=value,…`, added to every service's resource) and
//! `OTEL_SDK_DISABLED=true`. Only the `http/protobuf` protocol is spoken: `grpc` is refused
//! with a clear error rather than sent to the wrong port.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use bus_schema::runtime::trace::{self, SpanKind, SpanRecord};
use prost::Message;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// Spans sent in one request at most.
pub const BATCH: usize = 512;
/// How long a span waits for its batch at most.
pub const EVERY: Duration = Duration::from_secs(1);
/// Spans waiting to be sent at most; past this, new ones are dropped.
const QUEUE: usize = 16_384;
/// Attempts at sending one batch.
const ATTEMPTS: u32 = 4;
/// How long sending what is left may take when the process stops.
const FINAL_FLUSH: Duration = Duration::from_secs(5);

/// Where and how spans are sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtlpConfig {
    /// The full URL spans are POSTed to.
    pub url: String,
    pub headers: Vec<(String, String)>,
    /// Added to every service's resource.
    pub resource: Vec<(String, String)>,
}

impl OtlpConfig {
    /// The configuration `flag` (`--otlp-endpoint`, which clap also reads from
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`) and the other `OTEL_*` variables (`env`) make, or `None`
    /// when no endpoint is given (or `OTEL_SDK_DISABLED=true`).
    ///
    /// # Errors
    /// A protocol other than `http/protobuf`, an endpoint that is not an http(s) URL, or a
    /// malformed `key=value` list.
    pub fn resolve(flag: Option<&str>, env: impl Fn(&str) -> Option<String>) -> anyhow::Result<Option<Self>> {
        if env("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        let url = match (env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").filter(|u| !u.trim().is_empty()), flag) {
            // The signal's own endpoint is used as given; a flag on the command line wins.
            (_, Some(base)) if !base.trim().is_empty() => traces_url(base),
            (Some(full), _) => full.trim().to_string(),
            _ => return Ok(None),
        };
        anyhow::ensure!(
            url.starts_with("http://") || url.starts_with("https://"),
            "OTLP endpoint {url:?}: not an http:// or https:// URL"
        );
        let protocol = env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").or_else(|| env("OTEL_EXPORTER_OTLP_PROTOCOL"));
        if let Some(p) = protocol.map(|p| p.trim().to_string()).filter(|p| !p.is_empty() && p != "http/protobuf") {
            anyhow::bail!(
                "OTLP protocol {p:?} is not spoken here: landfall sends http/protobuf (a collector's OTLP/HTTP \
                 port, 4318 by default)"
            );
        }
        let mut headers = key_values("OTEL_EXPORTER_OTLP_HEADERS", env("OTEL_EXPORTER_OTLP_HEADERS"))?;
        headers.extend(key_values("OTEL_EXPORTER_OTLP_TRACES_HEADERS", env("OTEL_EXPORTER_OTLP_TRACES_HEADERS"))?);
        let resource = key_values("OTEL_RESOURCE_ATTRIBUTES", env("OTEL_RESOURCE_ATTRIBUTES"))?;
        Ok(Some(Self { url, headers, resource }))
    }
}

/// `<base>/v1/traces`.
fn traces_url(base: &str) -> String {
    format!("{}/v1/traces", base.trim().trim_end_matches('/'))
}

/// A `key=value,key=value` list (values percent-decoded), as the OpenTelemetry variables hold.
fn key_values(name: &str, text: Option<String>) -> anyhow::Result<Vec<(String, String)>> {
    let Some(text) = text else { return Ok(Vec::new()) };
    text.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').with_context(|| format!("{name}: {pair:?} is not key=value"))?;
            anyhow::ensure!(!k.trim().is_empty(), "{name}: {pair:?} has no key");
            Ok((k.trim().to_string(), percent_decode(v.trim())))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The exporter while it runs: [`Exporter::finish`] sends what is left and stops it.
pub struct Exporter {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Exporter {
    /// Installs the span sink of this process and starts sending to `config.url`. `None` when
    /// another sink was installed first (a second start in one process).
    pub fn start(config: OtlpConfig) -> Option<Exporter> {
        let (tx, rx) = mpsc::channel::<SpanRecord>(QUEUE);
        metrics::counter!("landfall_spans_dropped_total", "reason" => "queue_full").increment(0);
        metrics::counter!("landfall_spans_dropped_total", "reason" => "export_failed").increment(0);
        let installed = trace::set_sink(move |span| {
            if tx.try_send(span).is_err() {
                metrics::counter!("landfall_spans_dropped_total", "reason" => "queue_full").increment(1);
            }
        });
        if !installed {
            return None;
        }
        // The HTTP client is built with TLS whatever the URL: it needs the provider either way.
        consumers::artifacts::install_tls_provider();
        info!(url = %config.url, "sending spans over OTLP/HTTP");
        let stop = CancellationToken::new();
        let task = tokio::spawn(send_batches(rx, config, stop.clone()));
        Some(Exporter { stop, task })
    }

    /// Sends the spans still waiting (for a few seconds at most) and stops.
    pub async fn finish(self) {
        self.stop.cancel();
        if tokio::time::timeout(FINAL_FLUSH + Duration::from_secs(1), self.task).await.is_err() {
            warn!("spans still unsent when the process stopped were dropped");
        }
    }
}

async fn send_batches(mut rx: mpsc::Receiver<SpanRecord>, config: OtlpConfig, stop: CancellationToken) {
    let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap_or_default();
    let resource = Resource::new(&config.resource);
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        let deadline = tokio::time::sleep(EVERY);
        tokio::pin!(deadline);
        let stopping = loop {
            tokio::select! {
                _ = stop.cancelled() => break true,
                _ = &mut deadline => break false,
                span = rx.recv() => match span {
                    Some(s) => {
                        batch.push(s);
                        if batch.len() >= BATCH { break false; }
                    }
                    None => break true,
                },
            }
        };
        if stopping {
            while let Ok(s) = rx.try_recv() {
                batch.push(s);
            }
            for chunk in batch.chunks(BATCH) {
                let body = encode(chunk, &resource);
                let _ = tokio::time::timeout(FINAL_FLUSH, send(&client, &config, body, chunk.len())).await;
            }
            return;
        }
        if !batch.is_empty() {
            let body = encode(&batch, &resource);
            send(&client, &config, body, batch.len()).await;
            batch.clear();
        }
    }
}

/// POSTs one batch, trying again on a failure the collector may get over; counts it dropped
/// when it does not.
async fn send(client: &reqwest::Client, config: &OtlpConfig, body: Vec<u8>, spans: usize) {
    for attempt in 1..=ATTEMPTS {
        let mut request = client.post(&config.url).header("content-type", "application/x-protobuf");
        for (k, v) in &config.headers {
            request = request.header(k, v);
        }
        let outcome = request.body(body.clone()).send().await;
        let retry = match outcome {
            Ok(r) if r.status().is_success() => {
                debug!(spans, "spans sent");
                return;
            }
            // The OTLP/HTTP rules: these may pass; any other refusal will not.
            Ok(r) if matches!(r.status().as_u16(), 429 | 502 | 503 | 504) => format!("{}", r.status()),
            Ok(r) => {
                let status = r.status();
                let text = r.text().await.unwrap_or_default();
                warn!(url = %config.url, %status, answer = %text.chars().take(200).collect::<String>(), spans, "the collector refused spans; dropped");
                break;
            }
            Err(e) => e.to_string(),
        };
        if attempt == ATTEMPTS {
            warn!(url = %config.url, error = %retry, spans, "cannot send spans; dropped");
            break;
        }
        tokio::time::sleep(Duration::from_millis(500 << attempt)).await;
    }
    metrics::counter!("landfall_spans_dropped_total", "reason" => "export_failed").increment(spans as u64);
}

/// What every service's resource says besides its name.
struct Resource {
    instance: String,
    extra: Vec<(String, String)>,
}

impl Resource {
    fn new(extra: &[(String, String)]) -> Self {
        Self { instance: uuid::Uuid::new_v4().to_string(), extra: extra.to_vec() }
    }

    fn of(&self, service: &str) -> proto::Resource {
        let name = if service == "landfall" { service.to_string() } else { format!("landfall-{service}") };
        let mut attributes = vec![
            kv("service.name", name),
            kv("service.namespace", "landfall".to_string()),
            kv("service.instance.id", self.instance.clone()),
            kv("service.version", env!("CARGO_PKG_VERSION").to_string()),
        ];
        // A name the operator set (OTEL_RESOURCE_ATTRIBUTES) is not overridden, nor doubled.
        for (k, v) in &self.extra {
            attributes.retain(|a| a.key != *k);
            attributes.push(kv(k, v.clone()));
        }
        proto::Resource { attributes, dropped_attributes_count: 0 }
    }
}

/// One `ExportTraceServiceRequest`: the spans grouped by service, each service its resource.
fn encode(spans: &[SpanRecord], resource: &Resource) -> Vec<u8> {
    let mut by_service: BTreeMap<&str, Vec<proto::Span>> = BTreeMap::new();
    for s in spans {
        by_service.entry(s.service.as_str()).or_default().push(span(s));
    }
    let request = proto::ExportTraceServiceRequest {
        resource_spans: by_service
            .into_iter()
            .map(|(service, spans)| proto::ResourceSpans {
                resource: Some(resource.of(service)),
                scope_spans: vec![proto::ScopeSpans {
                    scope: Some(proto::InstrumentationScope {
                        name: "landfall".into(),
                        version: env!("CARGO_PKG_VERSION").into(),
                    }),
                    spans,
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            })
            .collect(),
    };
    request.encode_to_vec()
}

fn span(s: &SpanRecord) -> proto::Span {
    let nanos = |t: SystemTime| t.duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(0));
    proto::Span {
        trace_id: s.trace_id.to_vec(),
        span_id: s.span_id.to_vec(),
        trace_state: String::new(),
        parent_span_id: s.parent.map(|p| p.to_vec()).unwrap_or_default(),
        name: s.name.clone(),
        kind: match s.kind {
            SpanKind::Server => proto::SPAN_KIND_SERVER,
            SpanKind::Producer => proto::SPAN_KIND_PRODUCER,
            SpanKind::Consumer => proto::SPAN_KIND_CONSUMER,
        },
        start_time_unix_nano: nanos(s.start),
        end_time_unix_nano: nanos(s.end).max(nanos(s.start)),
        attributes: s.attributes.iter().map(|(k, v)| kv(k, v.clone())).collect(),
        status: Some(match &s.error {
            Some(message) => proto::Status { message: message.clone(), code: proto::STATUS_CODE_ERROR },
            None => proto::Status { message: String::new(), code: proto::STATUS_CODE_UNSET },
        }),
        flags: 1, // the W3C trace flags: sampled
    }
}

fn kv(key: &str, value: String) -> proto::KeyValue {
    proto::KeyValue { key: key.to_string(), value: Some(proto::AnyValue { value: Some(proto::Value::String(value)) }) }
}

/// The messages of OTLP's trace export (`opentelemetry/proto/collector/trace/v1` and the
/// `trace`, `resource` and `common` packages it uses), with the field numbers of the protocol:
/// only what landfall sends.
pub mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ExportTraceServiceRequest {
        #[prost(message, repeated, tag = "1")]
        pub resource_spans: Vec<ResourceSpans>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ResourceSpans {
        #[prost(message, optional, tag = "1")]
        pub resource: Option<Resource>,
        #[prost(message, repeated, tag = "2")]
        pub scope_spans: Vec<ScopeSpans>,
        #[prost(string, tag = "3")]
        pub schema_url: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Resource {
        #[prost(message, repeated, tag = "1")]
        pub attributes: Vec<KeyValue>,
        #[prost(uint32, tag = "2")]
        pub dropped_attributes_count: u32,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ScopeSpans {
        #[prost(message, optional, tag = "1")]
        pub scope: Option<InstrumentationScope>,
        #[prost(message, repeated, tag = "2")]
        pub spans: Vec<Span>,
        #[prost(string, tag = "3")]
        pub schema_url: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct InstrumentationScope {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "2")]
        pub version: String,
    }

    pub const SPAN_KIND_SERVER: i32 = 2;
    pub const SPAN_KIND_PRODUCER: i32 = 4;
    pub const SPAN_KIND_CONSUMER: i32 = 5;
    pub const STATUS_CODE_UNSET: i32 = 0;
    pub const STATUS_CODE_ERROR: i32 = 2;

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Span {
        #[prost(bytes = "vec", tag = "1")]
        pub trace_id: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        pub span_id: Vec<u8>,
        #[prost(string, tag = "3")]
        pub trace_state: String,
        #[prost(bytes = "vec", tag = "4")]
        pub parent_span_id: Vec<u8>,
        #[prost(string, tag = "5")]
        pub name: String,
        #[prost(int32, tag = "6")]
        pub kind: i32,
        #[prost(fixed64, tag = "7")]
        pub start_time_unix_nano: u64,
        #[prost(fixed64, tag = "8")]
        pub end_time_unix_nano: u64,
        #[prost(message, repeated, tag = "9")]
        pub attributes: Vec<KeyValue>,
        #[prost(message, optional, tag = "15")]
        pub status: Option<Status>,
        #[prost(fixed32, tag = "16")]
        pub flags: u32,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Status {
        #[prost(string, tag = "2")]
        pub message: String,
        #[prost(int32, tag = "3")]
        pub code: i32,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct KeyValue {
        #[prost(string, tag = "1")]
        pub key: String,
        #[prost(message, optional, tag = "2")]
        pub value: Option<AnyValue>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct AnyValue {
        #[prost(oneof = "Value", tags = "1")]
        pub value: Option<Value>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Value {
        #[prost(string, tag = "1")]
        String(String),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    #[test]
    fn the_endpoint_is_a_base_url_unless_it_is_the_traces_one() {
        let none = OtlpConfig::resolve(None, env(&[])).unwrap();
        assert_eq!(none, None, "no endpoint, no exporter");
        let base = OtlpConfig::resolve(Some("http://collector:4318/"), env(&[])).unwrap().unwrap();
        assert_eq!(base.url, "http://collector:4318/v1/traces");
        let full = env(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://otel.example/ingest/traces")]);
        assert_eq!(OtlpConfig::resolve(None, &full).unwrap().unwrap().url, "https://otel.example/ingest/traces");
        let flag_wins = OtlpConfig::resolve(Some("http://local:4318"), &full).unwrap().unwrap();
        assert_eq!(flag_wins.url, "http://local:4318/v1/traces");
        let off = env(&[("OTEL_SDK_DISABLED", "true")]);
        assert_eq!(OtlpConfig::resolve(Some("http://collector:4318"), off).unwrap(), None);
    }

    #[test]
    fn grpc_and_bad_urls_and_bad_lists_are_refused_clearly() {
        let grpc = env(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]);
        let e = OtlpConfig::resolve(Some("http://collector:4317"), grpc).unwrap_err().to_string();
        assert!(e.contains("http/protobuf"), "{e}");
        let e = OtlpConfig::resolve(Some("collector:4318"), env(&[])).unwrap_err().to_string();
        assert!(e.contains("not an http"), "{e}");
        let bad = env(&[("OTEL_EXPORTER_OTLP_HEADERS", "api-key")]);
        let e = OtlpConfig::resolve(Some("http://c:4318"), bad).unwrap_err().to_string();
        assert!(e.contains("OTEL_EXPORTER_OTLP_HEADERS") && e.contains("key=value"), "{e}");
    }

    #[test]
    fn headers_and_resource_attributes_are_read_and_decoded() {
        let vars = env(&[
            ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=abc%3D%3D, x-team=edge"),
            ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod,service.namespace=fleet"),
        ]);
        let c = OtlpConfig::resolve(Some("http://c:4318"), vars).unwrap().unwrap();
        assert_eq!(c.headers, vec![("api-key".into(), "abc==".into()), ("x-team".into(), "edge".into())]);
        let resource = Resource::new(&c.resource).of("gateway");
        let get = |k: &str| {
            resource.attributes.iter().filter(|a| a.key == k).map(|a| a.value.clone().unwrap()).collect::<Vec<_>>()
        };
        let string = |s: &str| proto::AnyValue { value: Some(proto::Value::String(s.into())) };
        assert_eq!(get("service.name"), vec![string("landfall-gateway")]);
        assert_eq!(get("service.namespace"), vec![string("fleet")], "the operator's value, once");
        assert_eq!(get("deployment.environment"), vec![string("prod")]);
    }
}
