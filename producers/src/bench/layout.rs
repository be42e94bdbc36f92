//! `bench job-layout`: what each way of bringing jobs to sites costs the hub per site, with
//! nothing else running. A plain nats-server, one connection per site; for each layout, the
//! hub's RSS and CPU while every site waits idle, then the time to deliver one job to every site
//! and have it acknowledged.
//!
//! - `pull`: one jobs stream, a durable pull consumer per site filtered on its jobs, each site
//!   waiting on a pull request (async-nats' defaults: 30 s expiry, 15 s idle heartbeat). This is
//!   how landfall's gateways take their jobs.
//! - `push`: one jobs stream, a durable push consumer per site delivering to a subject of the
//!   site's own, no heartbeat: an idle site costs no traffic.
//! - `stream`: a stream per site, with one unfiltered durable pull consumer.
//!
//! The three layouts above keep their jobs by limits, as first measured. Three more keep them as
//! landfall's jobs stream does, or could, each with a durable push consumer per site:
//! - `push-work-queue`: one work-queue stream (as deployed). nats-server checks each new
//!   consumer's filter against every other consumer's, so making them grows with the square of
//!   the sites.
//! - `push-interest`: one stream kept by interest: no such check, but a job no consumer is
//!   interested in when it is stored is dropped, and one whose consumer is deleted goes with it.
//! - `push-sharded`: `SHARDS` work-queue streams, a site's jobs in the one its number picks
//!   (the shard a token of the job's subject): each check covers one shard's consumers.
//!
//! Two more keep no consumer for a site at all:
//! - `dispatch`: `SHARDS` work-queue streams, each read by one durable of a dispatcher (a hub
//!   service: here, in the benchmark's process), which hands each job to its site as a request
//!   on the site's own subject and acknowledges it once the site answers. Per site, the hub keeps
//!   a subscription; a site needs no permission beyond its own subject and the answer.
//! - `direct`: `SHARDS` streams kept by limits, allowing direct gets. A site listens on its jobs'
//!   subjects (a plain subscription: a job stored there is also a nudge), keeps its own place
//!   (the last sequence it took), and takes each job with a direct get of the next message on its
//!   subjects past that place. It says it took the job by publishing its place to
//!   `bench.taken.<site>`, stored in a stream that keeps the last of each subject: what the hub
//!   would hold for a site with no disk of its own. Per site, the hub keeps a subscription and
//!   two subjects' state, no consumer.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use async_nats::jetstream::{self, consumer, stream};
use futures::StreamExt;
use serde_json::json;
use tokio::task::JoinSet;

use super::round;
use super::servers::{Process, free_port, wait_listening};
use crate::run::embedded::{find_nats_server, tied};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Layout {
    Pull,
    Push,
    Stream,
    PushWorkQueue,
    PushInterest,
    PushSharded,
    Direct,
    Dispatch,
}

impl Layout {
    fn name(self) -> &'static str {
        match self {
            Layout::Pull => "pull",
            Layout::Push => "push",
            Layout::Stream => "stream",
            Layout::PushWorkQueue => "push-work-queue",
            Layout::PushInterest => "push-interest",
            Layout::PushSharded => "push-sharded",
            Layout::Direct => "direct",
            Layout::Dispatch => "dispatch",
        }
    }

    fn retention(self) -> stream::RetentionPolicy {
        match self {
            Layout::Pull | Layout::Push | Layout::Stream | Layout::Direct => stream::RetentionPolicy::Limits,
            Layout::PushWorkQueue | Layout::PushSharded | Layout::Dispatch => stream::RetentionPolicy::WorkQueue,
            Layout::PushInterest => stream::RetentionPolicy::Interest,
        }
    }

    fn push(self) -> bool {
        !matches!(self, Layout::Pull | Layout::Stream | Layout::Direct | Layout::Dispatch)
    }

    fn sharded(self) -> bool {
        matches!(self, Layout::PushSharded | Layout::Direct | Layout::Dispatch)
    }
}

/// Work-queue streams of the `push-sharded` layout.
const SHARDS: usize = 64;

/// The subjects site `i`'s jobs are stored under (a wildcard for its kinds).
fn site_jobs(layout: Layout, i: usize) -> String {
    match layout {
        Layout::PushSharded | Layout::Direct | Layout::Dispatch => format!("bench.job.{}.{}.>", i % SHARDS, site(i)),
        _ => format!("bench.job.{}.>", site(i)),
    }
}

const AT_ONCE: usize = 64;

fn site(i: usize) -> String {
    format!("edge-{i:05}")
}

fn stream_name(layout: Layout, i: usize) -> String {
    match layout {
        Layout::Stream => format!("BENCH_JOBS_{}", site(i)),
        Layout::PushSharded | Layout::Direct | Layout::Dispatch => format!("BENCH_JOBS_{}", i % SHARDS),
        _ => "BENCH_JOBS".into(),
    }
}

pub async fn job_layout(sites: usize, layout: Layout, idle: Duration) -> anyhow::Result<serde_json::Value> {
    let dir = std::env::temp_dir().join(format!("landfall-bench-layout-{}", uuid::Uuid::now_v7()));
    let result = measure(&dir, sites, layout, idle).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn measure(
    dir: &std::path::Path,
    sites: usize,
    layout: Layout,
    idle: Duration,
) -> anyhow::Result<serde_json::Value> {
    std::fs::create_dir_all(dir)?;
    let (port, http) = (free_port()?, free_port()?);
    let mut cmd = tied::command(find_nats_server().await?);
    cmd.args(["-a", "127.0.0.1", "-p", &port.to_string(), "-m", &http.to_string(), "-js", "-sd"])
        .arg(dir.join("store"));
    let log = dir.join("nats-server.log");
    let mut hub = Process::spawn(cmd, &log)?;
    wait_listening(&mut hub, port, &log).await?;
    let url = format!("nats://127.0.0.1:{port}");
    let mut admin = jetstream::new(async_nats::connect(&url).await?);
    // Making the ten thousandth consumer of a work-queue stream takes the hub seconds: wait.
    admin.set_timeout(Duration::from_secs(120));
    let base_rss = hub.rss_mib();

    let received = Arc::new(AtomicUsize::new(0));
    let mut tasks = JoinSet::new();
    let t = Instant::now();
    let streams: Vec<String> = match layout {
        Layout::Stream => (0..sites).map(|i| stream_name(layout, i)).collect(),
        l if l.sharded() => (0..SHARDS.min(sites)).map(|i| stream_name(layout, i)).collect(),
        _ => vec![stream_name(layout, 0)],
    };
    let made: Vec<anyhow::Result<()>> = futures::stream::iter(streams.iter().enumerate())
        .map(|(i, name)| {
            let admin = admin.clone();
            let subjects = match layout {
                Layout::Stream => vec![format!("bench.job.{}.>", site(i))],
                l if l.sharded() => vec![format!("bench.job.{i}.>")],
                _ => vec!["bench.job.>".into()],
            };
            let retention = layout.retention();
            async move {
                // As landfall's jobs stream: a consumer per site (nats-server 2.15 allows 1,000
                // to a stream that names no limit).
                let max_consumers = bus_schema::runtime::JOBS_MAX_CONSUMERS;
                let allow_direct = layout == Layout::Direct;
                let config = stream::Config {
                    name: name.clone(),
                    subjects,
                    retention,
                    max_consumers,
                    allow_direct,
                    ..Default::default()
                };
                admin.create_stream(config).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(AT_ONCE)
        .collect()
        .await;
    made.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    if layout == Layout::Direct {
        admin
            .create_stream(stream::Config {
                name: "BENCH_TAKEN".into(),
                subjects: vec!["bench.taken.>".into()],
                max_messages_per_subject: 1,
                ..Default::default()
            })
            .await?;
    }
    let made: Vec<anyhow::Result<()>> = futures::stream::iter(0..sites)
        .map(|i| {
            let admin = admin.clone();
            async move { make_consumer(&admin, layout, i).await }
        })
        .buffer_unordered(AT_ONCE)
        .collect()
        .await;
    made.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    if layout == Layout::Dispatch {
        let client = async_nats::connect(&url).await?;
        for shard in 0..SHARDS.min(sites) {
            tasks.spawn(dispatch(client.clone(), stream_name(layout, shard)));
        }
    }
    let consumers_s = t.elapsed().as_secs_f64();

    let t = Instant::now();
    let clients: Vec<anyhow::Result<async_nats::Client>> = futures::stream::iter(0..sites)
        .map(|_| async { Ok(async_nats::connect(&url).await?) })
        .buffered(AT_ONCE)
        .collect()
        .await;
    for (i, client) in clients.into_iter().enumerate() {
        let client = client?;
        let received = received.clone();
        tasks.spawn(async move { take_jobs(client, layout, i, received).await });
    }
    let connect_s = t.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(2)).await;

    let cpu = hub.cpu_seconds();
    tokio::time::sleep(idle).await;
    let idle_cpu = hub.cpu_seconds() - cpu;
    let idle_rss = hub.rss_mib();

    let cpu = hub.cpu_seconds();
    let t = Instant::now();
    let mut acks = futures::stream::FuturesUnordered::new();
    for i in 0..sites {
        let subject = site_jobs(layout, i).replace('>', "patch");
        let ack = admin.publish(subject, bytes::Bytes::from_static(&[b'x'; 200])).await?;
        acks.push(std::future::IntoFuture::into_future(ack));
        while acks.len() >= 1024 {
            acks.next().await.context("ack")??;
        }
    }
    while let Some(ack) = acks.next().await {
        ack?;
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    while received.load(Ordering::Relaxed) < sites {
        anyhow::ensure!(
            Instant::now() < deadline,
            "{} of {sites} jobs taken after 600 s",
            received.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let fanout = t.elapsed().as_secs_f64();
    let fanout_cpu = hub.cpu_seconds() - cpu;
    let peak = hub.peak_mib();
    tasks.abort_all();
    hub.stop();
    Ok(json!({
        "bench": "job-layout",
        "layout": layout.name(),
        "sites": sites,
        "setup_seconds": { "streams_and_consumers": round(consumers_s, 2), "sites_connect": round(connect_s, 2) },
        "hub_rss_mib": { "empty": round(base_rss, 1), "idle_sites_waiting": round(idle_rss, 1), "peak": round(peak, 1) },
        "hub_rss_kib_per_site": round((idle_rss - base_rss) * 1024.0 / sites as f64, 1),
        "idle_seconds": idle.as_secs(),
        "hub_idle_cpu_percent": round(idle_cpu / idle.as_secs_f64() * 100.0, 1),
        "one_job_to_every_site_seconds": round(fanout, 3),
        "jobs_per_second": round(sites as f64 / fanout, 0),
        "hub_cpu_seconds_for_the_jobs": round(fanout_cpu, 2),
    }))
}

async fn make_consumer(js: &jetstream::Context, layout: Layout, i: usize) -> anyhow::Result<()> {
    if matches!(layout, Layout::Direct | Layout::Dispatch) {
        return Ok(());
    }
    let s = js.get_stream(stream_name(layout, i)).await?;
    let durable = format!("gateway-{}", site(i));
    let filter = match layout {
        Layout::Stream => String::new(),
        _ => site_jobs(layout, i),
    };
    match layout {
        l if l.push() => {
            s.create_consumer(consumer::push::Config {
                durable_name: Some(durable),
                deliver_subject: format!("bench.deliver.{}", site(i)),
                filter_subject: filter,
                ack_policy: consumer::AckPolicy::Explicit,
                ..Default::default()
            })
            .await?;
        }
        _ => {
            s.create_consumer(consumer::pull::Config {
                durable_name: Some(durable),
                filter_subject: filter,
                ack_policy: consumer::AckPolicy::Explicit,
                ..Default::default()
            })
            .await?;
        }
    }
    Ok(())
}

/// A site: takes its jobs and acknowledges each (with the server's confirmation).
async fn take_jobs(
    client: async_nats::Client,
    layout: Layout,
    i: usize,
    received: Arc<AtomicUsize>,
) -> anyhow::Result<()> {
    match layout {
        Layout::Direct => return take_jobs_directly(client, i, received).await,
        Layout::Dispatch => return answer_dispatcher(client, i, received).await,
        _ => {}
    }
    let js = jetstream::new(client);
    let s = js.get_stream(stream_name(layout, i)).await?;
    let durable = format!("gateway-{}", site(i));
    if layout.push() {
        let c: consumer::PushConsumer = s.get_consumer(&durable).await.map_err(|e| anyhow::anyhow!("{e}"))?;
        let mut messages = c.messages().await?;
        while let Some(m) = messages.next().await {
            m?.double_ack().await.map_err(|e| anyhow::anyhow!("{e}"))?;
            received.fetch_add(1, Ordering::Relaxed);
        }
    } else {
        let c: consumer::PullConsumer = s.get_consumer(&durable).await.map_err(|e| anyhow::anyhow!("{e}"))?;
        let mut messages = c.messages().await?;
        while let Some(m) = messages.next().await {
            m?.double_ack().await.map_err(|e| anyhow::anyhow!("{e}"))?;
            received.fetch_add(1, Ordering::Relaxed);
        }
    }
    Ok(())
}

/// A site of the `direct` layout: on each nudge (and each minute, for a nudge lost), takes
/// every job past its place by direct gets, and publishes its new place once taken.
async fn take_jobs_directly(client: async_nats::Client, i: usize, received: Arc<AtomicUsize>) -> anyhow::Result<()> {
    let filter = site_jobs(Layout::Direct, i);
    let mut nudges = client.subscribe(filter.clone()).await?;
    let js = jetstream::new(client);
    let s = js.get_stream(stream_name(Layout::Direct, i)).await?;
    let mut next = 1;
    loop {
        // A nudge can come before its job is stored: look again shortly before waiting.
        for _ in 0..5 {
            let mut took = false;
            loop {
                match s.direct_get_next_for_subject(filter.as_str(), Some(next)).await {
                    Ok(m) => {
                        next = m.sequence + 1;
                        js.publish(format!("bench.taken.{}", site(i)), m.sequence.to_string().into()).await?.await?;
                        received.fetch_add(1, Ordering::Relaxed);
                        took = true;
                    }
                    Err(e) if e.kind() == jetstream::stream::DirectGetErrorKind::NotFound => break,
                    Err(e) => return Err(e.into()),
                }
            }
            if took {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = tokio::time::timeout(Duration::from_secs(60), nudges.next()).await;
    }
}

/// The dispatcher of one shard: its one durable, each job handed to its site as a request on the
/// site's own subject and acknowledged once the site answers. Each site has one job here, so
/// jobs are handed out as they come; landfall's would hand a site's jobs one at a time, in order.
async fn dispatch(client: async_nats::Client, stream: String) -> anyhow::Result<()> {
    let js = jetstream::new(client.clone());
    let c = js
        .get_stream(&stream)
        .await?
        .create_consumer(consumer::pull::Config {
            durable_name: Some("dispatcher".into()),
            ack_policy: consumer::AckPolicy::Explicit,
            max_ack_pending: 20_000,
            ..Default::default()
        })
        .await?;
    let messages = c.messages().await?;
    messages
        .for_each_concurrent(1024, |m| {
            let client = client.clone();
            async move {
                let Ok(m) = m else { return };
                let site = m.subject.split('.').nth(3).unwrap_or_default().to_string();
                let deliver = format!("bench.deliver.{site}");
                if client.request(deliver, m.payload.clone()).await.is_ok() {
                    let _ = m.double_ack().await;
                } else {
                    let _ = m.ack_with(jetstream::AckKind::Nak(Some(Duration::from_secs(1)))).await;
                }
            }
        })
        .await;
    Ok(())
}

/// A site of the `dispatch` layout: answers each job handed to it.
async fn answer_dispatcher(client: async_nats::Client, i: usize, received: Arc<AtomicUsize>) -> anyhow::Result<()> {
    let mut jobs = client.subscribe(format!("bench.deliver.{}", site(i))).await?;
    while let Some(job) = jobs.next().await {
        if let Some(reply) = job.reply {
            client.publish(reply, "taken".into()).await?;
            received.fetch_add(1, Ordering::Relaxed);
        }
    }
    Ok(())
}
