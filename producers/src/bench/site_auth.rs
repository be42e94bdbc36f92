//! `bench site-auth`: what letting sites in costs the hub, by how they prove who they are, in
//! one run on the hub as `deploy nats-config` writes it:
//!
//! - `static`: a user per site in the hub's configuration (`--site-auth static`);
//! - `enroll`: the hub's auth callout answered by the identity service (`--site-auth enroll`),
//!   each site presenting its link credential and proving its key.
//!
//! For each: the time to connect every site (64 at once, each subscribing as a gateway does),
//! the hub's RSS growth per connected site, and, for `enroll`, how long `site revoke` takes to
//! close a connected site's connection.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bus_schema::access::Role;
use bus_schema::credentials::{self, Kind};
use bus_schema::names::{self, keys};
use bus_schema::pb;
use bus_schema::runtime::{Access, Bus, Fixed, Topology};
use futures::StreamExt;
use prost::Message;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::round;
use super::servers::{free_port, start_configured};
use crate::deploy::{self, NatsConfigArgs, SiteAuth};
use crate::run::embedded::find_nats_server;

const AT_ONCE: usize = 64;

fn site(i: usize) -> String {
    format!("edge-{i:05}")
}

pub async fn site_auth(sites: usize) -> anyhow::Result<serde_json::Value> {
    anyhow::ensure!(sites >= 1, "--sites must be at least 1");
    let mut out = serde_json::Map::new();
    for mode in [SiteAuth::Static, SiteAuth::Enroll] {
        let dir = std::env::temp_dir().join(format!("landfall-bench-site-auth-{}", uuid::Uuid::now_v7()));
        let result = measure(&dir, sites, mode).await;
        let _ = std::fs::remove_dir_all(&dir);
        out.insert(format!("{mode:?}").to_lowercase(), result?);
    }
    let ratio = |key: &str| {
        let (s, e) = (out["static"][key].as_f64().unwrap_or(0.0), out["enroll"][key].as_f64().unwrap_or(0.0));
        if s > 0.0 { round(e / s, 2) } else { 0.0 }
    };
    let (connect, rss) = (ratio("connect_s"), ratio("rss_per_site_kib"));
    out.insert("enroll_over_static".into(), json!({ "connect_s": connect, "rss_per_site_kib": rss }));
    Ok(json!({ "bench": "site-auth", "sites": sites, "results": out }))
}

async fn measure(dir: &Path, sites: usize, mode: SiteAuth) -> anyhow::Result<serde_json::Value> {
    std::fs::create_dir_all(dir)?;
    let (client, leaf, http) = (free_port()?, free_port()?, free_port()?);
    let args = NatsConfigArgs {
        sites: (0..sites).map(site).collect(),
        out: dir.join("nats"),
        hubs: vec![format!("127.0.0.1:{client}:{}:{leaf}:{http}", free_port()?)],
        leaf_advertise: Vec::new(),
        relays: Vec::new(),
        store_dir: dir.join("store"),
        site_listen: "127.0.0.1:4222".into(),
        tls_cert: None,
        tls_key: None,
        tls_ca: None,
        site_auth: Some(mode),
        site_creds: dir.join("link.creds"),
        region: None,
        core: Vec::new(),
        core_key: None,
        core_ca: None,
    };
    let nats = args.out.clone();
    tokio::task::spawn_blocking(move || deploy::write(&deploy::plan(&args)?, &args.out)).await??;
    let conf = nats.join(format!("hub/{}.conf", deploy::hub_name(0)));
    let hub = start_configured(&find_nats_server().await?, &conf, client, &dir.join("hub.log")).await?;
    let url = format!("nats://127.0.0.1:{client}");
    let seed = |rel: &str| Access::seed_from_file(&nats.join(rel)).map_err(anyhow::Error::msg);

    let shutdown = CancellationToken::new();
    let (identity, accesses) = match mode {
        SiteAuth::Static => {
            let accesses: Vec<Access> = (0..sites)
                .map(|i| {
                    Ok(Access {
                        nkey_seed: Some(seed(&format!("sites/{}/gateway.nk", site(i)))?),
                        ..Default::default()
                    })
                })
                .collect::<anyhow::Result<_>>()?;
            (None, accesses)
        }
        SiteAuth::Enroll => {
            let (task, accesses) = enrolled(&url, &nats, sites, shutdown.clone()).await?;
            (Some(task), accesses)
        }
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let base_rss = hub.rss_mib();
    let t = Instant::now();
    let connected: Vec<anyhow::Result<Bus>> = futures::stream::iter(accesses.iter().enumerate())
        .map(|(i, access)| {
            let url = url.clone();
            async move {
                let bus = Bus::connect_client(&url, &format!("site-{i}"), access).await?;
                // As a gateway: its jobs and the hub's requests of it (its inbox is the client's).
                for subject in [names::site_deliver(&site(i)), names::site_rpcs(&site(i))] {
                    let sub = bus.client().subscribe(subject).await?;
                    std::mem::forget(sub);
                }
                anyhow::Ok(bus)
            }
        })
        .buffered(AT_ONCE)
        .collect()
        .await;
    let connected = connected.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
    let connect_s = t.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss = hub.rss_mib();
    let mut result = json!({
        "connect_s": round(connect_s, 2),
        "connects_per_s": round(sites as f64 / connect_s, 2),
        "hub_rss_mib": round(rss, 2),
        "rss_per_site_kib": round((rss - base_rss) * 1024.0 / sites as f64, 2),
    });
    if mode == SiteAuth::Enroll {
        let operator = Access { nkey_seed: Some(seed("users/operator.nk")?), ..Default::default() };
        let operator = Bus::connect_client(&url, "bench-operator", &operator).await?;
        let victim = connected[0].client().clone();
        let t = Instant::now();
        let revoke = pb::IdentityAdmin {
            op: Some(pb::identity_admin::Op::Revoke(pb::RevokeSite { site_id: site(0), reason: "bench".into() })),
        };
        operator
            .request(names::IDENTITY_ADMIN.to_string(), revoke.encode_to_vec().into(), Duration::from_secs(15))
            .await?;
        while victim.connection_state() == async_nats::connection::State::Connected {
            anyhow::ensure!(t.elapsed() < Duration::from_secs(15), "the revoked site stayed connected");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        result["revoke_ms"] = json!(round(t.elapsed().as_secs_f64() * 1000.0, 1));
    }
    drop(connected);
    shutdown.cancel();
    if let Some(task) = identity {
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    }
    hub.stop();
    Ok(result)
}

/// The identity service running in this process, and each site's access presenting link
/// credentials it holds (the sites' identities written as approvals leave them).
async fn enrolled(
    url: &str,
    nats: &Path,
    sites: usize,
    shutdown: CancellationToken,
) -> anyhow::Result<(tokio::task::JoinHandle<()>, Vec<Access>)> {
    let seed = |rel: &str| Access::seed_from_file(&nats.join(rel)).map_err(anyhow::Error::msg);
    let issuer = Arc::new(crate::run::identity::issuer(&nats.join("identity/issuer.nk"))?);
    let access =
        Access { nkey_seed: Some(seed(&format!("users/{}.nk", Role::Identity.user()))?), ..Default::default() };
    let bus = Bus::connect_with(url, "bench-identity", &access).await?;
    bus.ensure_topology_within(&Topology::for_server(&bus), Duration::from_secs(30)).await?;
    let system =
        async_nats::ConnectOptions::new().nkey(seed("users/sys.nk")?).connect(url).await.context("system user")?;
    let store = bus.kv(names::IDENTITY_BUCKET).await?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis() as i64;
    let expires = now + 30 * 24 * 3600 * 1000;
    let mut accesses = Vec::with_capacity(sites);
    let records: Vec<(pb::SiteIdentity, Access)> = (0..sites)
        .map(|i| {
            let (identity, link) = (nkeys::KeyPair::new_user(), Arc::new(nkeys::KeyPair::new_user()));
            let credential = credentials::issue(
                &issuer,
                Kind::Link,
                &site(i),
                &link.public_key(),
                now / 1000,
                Some(expires / 1000),
            )?;
            let record = pb::SiteIdentity {
                site_id: site(i),
                identity_key: identity.public_key(),
                links: vec![pb::LinkKey { key: link.public_key(), issued_unix_ms: now, expires_unix_ms: expires }],
                enrolled_unix_ms: now,
                ..Default::default()
            };
            let presented = Arc::new(Fixed { credential, key: link, inbox_prefix: names::site_inbox(&site(i)) });
            Ok((record, Access { presented: Some(presented), ..Default::default() }))
        })
        .collect::<anyhow::Result<_>>()?;
    let written: Vec<anyhow::Result<()>> = futures::stream::iter(records.iter())
        .map(|(r, _)| {
            let store = store.clone();
            async move {
                store.put(&keys::identity_site(&r.site_id), r).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(AT_ONCE)
        .collect()
        .await;
    written.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    accesses.extend(records.into_iter().map(|(_, a)| a));
    let settings = consumers::identity::IdentitySettings {
        issuer,
        link_ttl: Duration::from_secs(30 * 24 * 3600),
        approval: consumers::identity::Approval::Operator,
    };
    let task = tokio::spawn(async move {
        if let Err(e) = consumers::identity::run_identity_service(bus, Some(system), settings, shutdown).await {
            tracing::warn!(error = %e, "the identity service stopped");
        }
    });
    Ok((task, accesses))
}
