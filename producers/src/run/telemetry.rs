//! What a running service tells about itself: logs on stderr (text for people, JSON lines for
//! machines) and Prometheus metrics served over HTTP.
//!
//! Every message a service handles runs inside a `handle` span (see
//! `bus_schema::runtime::consume`) whose fields are the consumer, the subject, the message id
//! and the trace id of its `traceparent`; messages published while handling continue that
//! trace. So the JSON lines of one install, across the orchestrator, the gateway and the
//! kubeconfig collector, are found by one `trace_id`.

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use clap::{Args, ValueEnum};
use metrics::Unit;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::{info, warn};

/// The Prometheus text exposition format.
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Upper bounds, in seconds, of the buckets of every `*_seconds` histogram: from a
/// millisecond handler to a host provisioning for hours.
pub const DURATION_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0,
    3600.0, 7200.0,
];

/// How often histogram samples are folded into their buckets between scrapes.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// The telemetry flags of `landfall` and `landfall-gateway`.
#[derive(Debug, Clone, Args)]
pub struct TelemetryArgs {
    /// How logs are written to stderr: `text` for people, `json` for one JSON object per line
    /// carrying the fields of the span it was logged in (consumer, subject, msg_id, trace_id).
    #[arg(long, global = true, value_enum, env = "LANDFALL_LOG_FORMAT", default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Serve Prometheus metrics (`GET /metrics`) and a liveness check (`GET /healthz`) on this
    /// address, e.g. 0.0.0.0:9464 (port 0: any free port, logged). For services: `up`,
    /// `serve …` and the gateway.
    #[arg(long, global = true, value_name = "ADDR", env = "LANDFALL_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Send spans over OTLP/HTTP (protobuf) to this collector, e.g. http://otel-collector:4318
    /// (`/v1/traces` is appended). The other OTEL_EXPORTER_OTLP_* variables apply too. For
    /// services: `up`, `serve …` and the gateway.
    #[arg(long, global = true, value_name = "URL", env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Sends `tracing` output to stderr in `format`, filtered by `RUST_LOG` or else by
/// `default_filter`. A second call changes nothing.
pub fn init_logs(format: LogFormat, default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    // Colours only on a terminal: a log file or a journal gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    let _ = match format {
        LogFormat::Text => logs.try_init(),
        // The event's fields at the top level; `span` is the innermost span, `spans` every span
        // from the outermost in, so a trace id set by an outer span is never lost.
        LogFormat::Json => logs.json().flatten_event(true).with_current_span(true).with_span_list(true).try_init(),
    };
}

/// Sends `tracing` output, as text, to the end of the file at `path` (made, with its directory,
/// when missing), filtered as [`init_logs`] does.
///
/// # Errors
/// The file cannot be opened for appending.
pub fn init_logs_to_file(path: &std::path::Path, default_filter: &str) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::sync::Mutex::new(file))
        .with_ansi(false)
        .try_init();
    Ok(())
}

/// The process's Prometheus recorder, installed on the first call (later calls return the
/// same handle). Histograms named `*_seconds` get [`DURATION_BUCKETS`]; a background thread
/// folds histogram samples into them every few seconds.
///
/// # Errors
/// When another metrics recorder was installed in this process first.
pub fn prometheus() -> anyhow::Result<PrometheusHandle> {
    static HANDLE: OnceLock<Result<PrometheusHandle, String>> = OnceLock::new();
    let handle = HANDLE.get_or_init(|| {
        let handle = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), DURATION_BUCKETS)
            .and_then(|b| b.install_recorder())
            .map_err(|e| format!("install the Prometheus recorder: {e}"))?;
        describe();
        let upkeep = handle.clone();
        std::thread::Builder::new()
            .name("metrics-upkeep".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(UPKEEP_EVERY);
                    upkeep.run_upkeep();
                }
            })
            .map_err(|e| format!("start the metrics upkeep thread: {e}"))?;
        Ok(handle)
    });
    handle.clone().map_err(anyhow::Error::msg)
}

/// The text a scrape gets: every metric as of now.
pub fn render(handle: &PrometheusHandle) -> String {
    handle.run_upkeep();
    handle.render()
}

/// `GET /metrics` (the Prometheus text format) and `GET /healthz`, to serve alone
/// ([`serve_metrics`]) or merged into another router.
pub fn metrics_router(handle: PrometheusHandle) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(move || {
                let handle = handle.clone();
                async move { ([(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)], render(&handle)).into_response() }
            }),
        )
        .route("/healthz", get(|| async { health_text() }))
}

/// The liveness answer: `ok`, or, still alive, what has no room in the store as this process
/// last saw it (the orchestrator's store watch looks every few seconds).
fn health_text() -> String {
    let full = bus_schema::runtime::store_health::alarm();
    if full.is_empty() {
        return "ok\n".into();
    }
    let what: Vec<String> = full.iter().map(|f| format!("{}: {}", f.stream, f.reason)).collect();
    format!("degraded: no room in the store ({})\n", what.join("; "))
}

/// Listens on `addr` and serves [`metrics_router`] in a task of its own until `shutdown`.
/// Returns the address bound (port 0 picks a free one).
///
/// # Errors
/// When `addr` cannot be bound.
pub async fn serve_metrics(
    addr: SocketAddr,
    handle: PrometheusHandle,
    shutdown: CancellationToken,
) -> anyhow::Result<SocketAddr> {
    let listener =
        tokio::net::TcpListener::bind(addr).await.with_context(|| format!("listen for metrics scrapes on {addr}"))?;
    let bound = listener.local_addr().context("the metrics listener's address")?;
    let app = metrics_router(handle);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned()).await {
            warn!(addr = %bound, error = %e, "metrics server stopped");
        }
    });
    info!(addr = %bound, "serving metrics on /metrics");
    Ok(bound)
}

/// What a service started to tell about itself: [`Telemetry::finish`] when it stops.
pub struct Telemetry {
    _metrics: Option<DropGuard>,
    spans: Option<super::otlp::Exporter>,
}

impl Telemetry {
    /// Sends the spans still waiting, and stops serving metrics.
    pub async fn finish(self) {
        if let Some(spans) = self.spans {
            spans.finish().await;
        }
    }
}

/// Starts the metrics server when `--metrics-listen` asks for one, and the span exporter when
/// `--otlp-endpoint` (or the OpenTelemetry variables) name a collector.
///
/// # Errors
/// When the recorder cannot be installed, the address cannot be bound, or the OTLP settings
/// are not usable.
pub async fn start(args: &TelemetryArgs) -> anyhow::Result<Telemetry> {
    let otlp = super::otlp::OtlpConfig::resolve(args.otlp_endpoint.as_deref(), |name| std::env::var(name).ok())?;
    let metrics = match args.metrics_listen {
        Some(addr) => {
            let shutdown = CancellationToken::new();
            serve_metrics(addr, prometheus()?, shutdown.clone()).await?;
            Some(shutdown.drop_guard())
        }
        None => None,
    };
    Ok(Telemetry { _metrics: metrics, spans: otlp.and_then(super::otlp::Exporter::start) })
}

/// HELP lines for the metrics landfall records, wherever they are recorded.
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!("landfall_messages_handled_total", "Messages a consumer handled and acknowledged.");
    describe_counter!("landfall_messages_retried_total", "Messages a consumer NAKed after a transient failure.");
    describe_counter!("landfall_messages_rejected_total", "Messages a consumer refused for good (terminated).");
    describe_counter!("landfall_redeliveries_total", "Deliveries of a message after its first.");
    describe_counter!(
        "landfall_deliveries_in_hand_total",
        "Deliveries of a message the consumer was still handling (its progress late at the server): dropped, the \
         attempt under way settles it."
    );
    describe_counter!(
        "landfall_events_published_total",
        "Events stored in LANDFALL_EVENTS (copies dropped by dedup are not counted)."
    );
    describe_counter!(
        "landfall_commands_total",
        "Commands the orchestrator accepted or rejected, by type and reject code."
    );
    describe_histogram!(
        "landfall_saga_step_seconds",
        Unit::Seconds,
        "Time an install or join saga spent in a phase, observed when it leaves it."
    );
    describe_histogram!(
        "landfall_saga_seconds",
        Unit::Seconds,
        "Time from an install or join saga's start to its end, by outcome."
    );
    describe_gauge!("landfall_gateway_jobs_in_flight", "Jobs a gateway is working on, per site.");
    describe_histogram!(
        "landfall_gateway_job_seconds",
        Unit::Seconds,
        "Time a gateway spent on a job, by kind and outcome."
    );
    describe_gauge!("landfall_rollout_nodes", "A rollout's planned nodes, and those patched and failed so far.");
    describe_gauge!("landfall_rollouts", "Rollouts by phase.");
    describe_gauge!(
        "landfall_rollout_plan_chunks",
        "Chunks of rollouts' plans the orchestrator holds (let go of once their rollout is no longer under way)."
    );
    describe_counter!(
        "landfall_spans_dropped_total",
        "Spans not sent over OTLP: the queue was full, or the collector would not take them."
    );
    describe_counter!(
        "landfall_messages_dead_lettered_total",
        "Messages a consumer gave up on and filed in LANDFALL_DEAD (landfall dead list)."
    );
    describe_gauge!(
        "landfall_messages_parked",
        "Deliveries a consumer parked to try again (a wait, a transient failure), by consumer."
    );
    describe_counter!(
        "landfall_sagas_ended_total",
        "Install and join sagas ended, by kind (install, join) and outcome (success, partial_success, failure); \
         from 0 at start, so the first failure shows as an increase."
    );
    describe_gauge!(
        "landfall_consumer_pending",
        "Messages the hub's durable consumer has not yet delivered (the sites' job consumers are left out)."
    );
    describe_gauge!(
        "landfall_consumer_ack_pending",
        "Messages the hub's durable consumer delivered and not yet acknowledged."
    );
    describe_gauge!("landfall_store_bytes", "Bytes a stream or bucket stores.");
    describe_gauge!("landfall_store_messages", "Messages a stream or bucket stores.");
    describe_gauge!(
        "landfall_store_limit_bytes",
        "The most bytes a stream or bucket may store (0 or less: no limit of its own)."
    );
    describe_gauge!(
        "landfall_store_full",
        "1 when a stream or bucket (or the whole store) has no room for another write."
    );
    describe_counter!("landfall_store_refused_writes_total", "Writes the store refused for lack of room, by stream.");
    describe_gauge!(
        "landfall_site_outbox_waiting",
        "A gateway on its leaf node: reports kept at the site and not yet at the hub."
    );
    describe_gauge!("landfall_sites_cut_off", "Sites not heard for longer than the observer's --cut-off-after.");
    describe_counter!(
        "landfall_site_alive_rejected_total",
        "Heartbeats that did not decode, or named another site than their subject's."
    );
    describe_counter!(
        "landfall_identity_refused_total",
        "Connections the identity service refused (the NATS server's auth callout)."
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        telemetry: TelemetryArgs,
    }

    #[test]
    fn flags_parse_and_default_to_text_without_metrics() {
        let cli = Cli::try_parse_from(["x"]).unwrap();
        assert_eq!((cli.telemetry.log_format, cli.telemetry.metrics_listen), (LogFormat::Text, None));
        let cli = Cli::try_parse_from(["x", "--otlp-endpoint", "http://collector:4318"]).unwrap();
        assert_eq!(cli.telemetry.otlp_endpoint.as_deref(), Some("http://collector:4318"));
        let cli = Cli::try_parse_from(["x", "--log-format", "json", "--metrics-listen", "127.0.0.1:0"]).unwrap();
        assert_eq!(cli.telemetry.log_format, LogFormat::Json);
        assert_eq!(cli.telemetry.metrics_listen, Some("127.0.0.1:0".parse().unwrap()));
        assert!(Cli::try_parse_from(["x", "--metrics-listen", "nowhere"]).is_err());
        assert!(Cli::try_parse_from(["x", "--log-format", "xml"]).is_err());
    }

    #[test]
    fn the_recorder_is_installed_once_and_durations_get_buckets() {
        let first = prometheus().unwrap();
        let second = prometheus().unwrap();
        metrics::histogram!("landfall_test_step_seconds", "step" => "staging").record(0.2);
        metrics::counter!("landfall_test_total").increment(2);
        let text = render(&second);
        assert!(text.contains(r#"landfall_test_step_seconds_bucket{step="staging",le="0.25"} 1"#), "{text}");
        assert!(text.contains(r#"landfall_test_step_seconds_count{step="staging"} 1"#), "{text}");
        assert!(render(&first).contains("landfall_test_total 2"));
    }
}
