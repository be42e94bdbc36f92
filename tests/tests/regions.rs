//! Regions below a core, as `deploy core-config` and `deploy nats-config --region` write them:
//! a regional hub's link to the core, over TLS, carries JetStream and no landfall subject either
//! way, and `deploy region-link` has the region's commands stream take what the core keeps for
//! it, under the commands' own subjects. (`bench regions`, in `lifetime.rs`, runs whole regions
//! through a core.)

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use bus_schema::names;
use bus_schema::runtime::{Access, Bus};
use futures::StreamExt;
use landfall_tests::api::{OPERATOR, VIEWER};
use landfall_tests::nats::free_port;
use landfall_tests::topology::{ConfServer, TlsFiles, leaf_links};

/// `landfall <args>` as the core's operator (for `region-link`), its output.
fn landfall(args: &[&str], core: Option<(&str, &Path, Option<&Path>)>) -> std::process::Output {
    let mut cmd = std::process::Command::new(landfall_tests::cli::binary());
    cmd.env_remove("NATS_URL");
    if let Some((url, key, ca)) = core {
        cmd.env("NATS_URL", url).arg("--nats-nkey-file").arg(key);
        if let Some(ca) = ca {
            cmd.arg("--nats-ca").arg(ca);
        }
    }
    cmd.args(args).output().expect("run landfall")
}

fn succeeded(out: &std::process::Output) -> String {
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    text
}

fn user(seed_file: &Path, ca: Option<&Path>) -> Access {
    Access {
        nkey_seed: Some(Access::seed_from_file(seed_file).unwrap()),
        ca_file: ca.map(Path::to_path_buf),
        ..Access::default()
    }
}

/// What `sub` hears within a second.
async fn heard(sub: &mut async_nats::Subscriber) -> Vec<String> {
    let mut out = Vec::new();
    while let Ok(Some(m)) = tokio::time::timeout(Duration::from_secs(1), sub.next()).await {
        out.push(String::from_utf8_lossy(&m.payload).into_owned());
    }
    out
}

struct Core {
    out: PathBuf,
    url: String,
    _server: ConfServer,
}

#[tokio::test]
async fn a_regional_hub_links_to_the_core_over_tls_carrying_jetstream_and_no_landfall_subject_either_way() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let tls = TlsFiles::make(d);
    let (client, leaf, http) = (free_port(), free_port(), free_port());
    let out = d.join("core-config");
    succeeded(&landfall(
        &[
            "deploy",
            "core-config",
            "--regions",
            "eu",
            "--core",
            &format!("127.0.0.1:{client}:{leaf}:{http}"),
            "--out",
            &out.display().to_string(),
            "--store-dir",
            &d.join("store").display().to_string(),
            "--tls-cert",
            &tls.cert.display().to_string(),
            "--tls-key",
            &tls.key.display().to_string(),
        ],
        None,
    ));
    let server = ConfServer::start("core", out.join("core/core.conf"), client);
    let core = Core { out, url: format!("tls://127.0.0.1:{client}"), _server: server };

    let hub_client = free_port();
    let eu = d.join("eu");
    let hub = format!("127.0.0.1:{hub_client}:{}:{}:{}", free_port(), free_port(), free_port());
    let args = {
        let mut args = vec![
            "deploy".to_string(),
            "nats-config".into(),
            "--sites".into(),
            "edge-01".into(),
            "--out".into(),
            eu.display().to_string(),
            "--hub".into(),
            hub.clone(),
            "--store-dir".into(),
            d.join("store").display().to_string(),
            "--region".into(),
            "eu".into(),
            "--core".into(),
            format!("127.0.0.1:{leaf}"),
            "--core-key".into(),
            core.out.join("core/regions/eu.nk").display().to_string(),
        ];
        args.extend(["--core-ca".into(), tls.ca.display().to_string()]);
        args
    };
    let text = succeeded(&landfall(&args.iter().map(String::as_str).collect::<Vec<_>>(), None));
    assert!(text.contains("--js-domain hub-eu"), "{text}");
    let _hub = ConfServer::start("hub-eu", eu.join("hub/hub-1.conf"), hub_client);
    let deadline = Instant::now() + Duration::from_secs(30);
    while leaf_links(http).await < 1 {
        assert!(Instant::now() < deadline, "the region's hub did not link to the core over TLS within 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let operator = core.out.join("core/users/operator.nk");
    let at_core = Bus::connect_with(&core.url, "core", &user(&operator, Some(&tls.ca))).await.unwrap();
    let hub_url = format!("nats://127.0.0.1:{hub_client}");
    let at_hub = Bus::connect_with(&hub_url, "hub", &user(&eu.join("users/operator.nk"), None)).await.unwrap();

    // JetStream crosses: the core reaches the region's streams by the region's domain.
    jetstream::with_domain(at_core.client().clone(), "hub-eu")
        .query_account()
        .await
        .expect("the core reaches the region's JetStream through its domain");

    // Landfall's own subjects do not, either way: each side hears only what was published on
    // its own side (each subscription hears its own side, so it was listening).
    let mut core_hears = at_core.client().subscribe("landfall.>").await.unwrap();
    let mut hub_hears = at_hub.client().subscribe("landfall.evt.>").await.unwrap();
    at_core.client().flush().await.unwrap();
    at_hub.client().flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let subject = "landfall.evt.edge-01.gateway.site.Probe";
    at_hub.client().publish(subject, "published at the region".into()).await.unwrap();
    at_core.client().publish(subject, "published at the core".into()).await.unwrap();
    at_hub.client().flush().await.unwrap();
    at_core.client().flush().await.unwrap();
    assert_eq!(heard(&mut core_hears).await, ["published at the core"]);
    assert_eq!(heard(&mut hub_hears).await, ["published at the region"]);

    // Linking: what the core keeps for the region reaches the region's commands stream under
    // the command's own subject (the region's orchestrator would have made that stream).
    at_hub
        .jetstream()
        .create_stream(stream::Config {
            name: names::COMMANDS_STREAM.into(),
            subjects: vec![names::COMMANDS_ALL.into()],
            ..Default::default()
        })
        .await
        .unwrap();
    let link = |region: &str| {
        landfall(&["deploy", "region-link", "--region", region], Some((&core.url, &operator, Some(&tls.ca))))
    };
    let text = succeeded(&link("eu"));
    assert!(text.contains("(source added)"), "{text}");
    let text = succeeded(&link("eu"));
    assert!(text.contains("(already sourcing)"), "linked again, nothing changes: {text}");
    let command = "landfall.cmd.edge-01.hub.site.InstallSite";
    let at_core_subject = names::to_region(command, "eu").unwrap();
    at_core.jetstream().publish(at_core_subject, "a command for region eu".into()).await.unwrap().await.unwrap();
    let mut commands = at_hub.jetstream().get_stream(names::COMMANDS_STREAM).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let taken = loop {
        match commands.get_last_raw_message_by_subject(command).await {
            Ok(m) => break m,
            Err(e) => assert!(Instant::now() < deadline, "the region never took the core's command: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(taken.payload, "a command for region eu".as_bytes());
    assert_eq!(commands.info().await.unwrap().state.messages, 1);

    // A region the core cannot reach is refused, and nothing is left for it at the core.
    let out = link("us");
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("region us's hub has no LANDFALL_COMMANDS in domain hub-us"), "{said}");
    for stream in [names::core_commands_stream("us"), names::core_events_stream("us")] {
        assert!(at_core.jetstream().get_stream(&stream).await.is_err(), "{stream} was made at the core");
    }
}

/// The core's API (`serve api --region`): each region's sites, commands and ledger read and
/// posted at the core, through the region's domain, with the regions' own services doing the
/// work and no region seeing another's sites.
#[tokio::test]
async fn the_cores_api_reads_and_commands_each_region_through_its_domain() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (client, leaf, http) = (free_port(), free_port(), free_port());
    let out = d.join("core-config");
    let store = d.join("store").display().to_string();
    let core_address = format!("127.0.0.1:{client}:{leaf}:{http}");
    succeeded(&landfall(
        &[
            "deploy",
            "core-config",
            "--regions",
            "eu,us",
            "--core",
            &core_address,
            "--out",
            &out.display().to_string(),
            "--store-dir",
            &store,
        ],
        None,
    ));
    let _core = ConfServer::start("core", out.join("core/core.conf"), client);
    let core_url = format!("nats://127.0.0.1:{client}");
    let operator = out.join("core/users/operator.nk");

    // Two regions, each a hub of its own with its own orchestrator.
    let shutdown = tokio_util::sync::CancellationToken::new();
    let mut hubs = Vec::new();
    for (region, site) in [("eu", 0), ("us", 1)] {
        let at = d.join(region);
        let hub_client = free_port();
        let hub = format!("127.0.0.1:{hub_client}:{}:{}:{}", free_port(), free_port(), free_port());
        let key = out.join(format!("core/regions/{region}.nk")).display().to_string();
        let site = producers::run::demo::demo_site(site, 1).site.to_string();
        succeeded(&landfall(
            &[
                "deploy",
                "nats-config",
                "--sites",
                &site,
                "--out",
                &at.display().to_string(),
                "--hub",
                &hub,
                "--store-dir",
                &store,
                "--region",
                region,
                "--core",
                &format!("127.0.0.1:{leaf}"),
                "--core-key",
                &key,
            ],
            None,
        ));
        hubs.push(ConfServer::start(&format!("hub-{region}"), at.join("hub/hub-1.conf"), hub_client));
        let url = format!("nats://127.0.0.1:{hub_client}");
        let bus =
            landfall_tests::topology::connect_when_ready(&url, "hub", &user(&at.join("users/operator.nk"), None)).await;
        let topology = bus_schema::runtime::Topology::for_server(&bus);
        bus.ensure_topology_within(&topology, Duration::from_secs(30)).await.unwrap();
        tokio::spawn(consumers::run_orchestrator(bus, Default::default(), shutdown.clone()));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while leaf_links(http).await < 2 {
        assert!(Instant::now() < deadline, "the regions' hubs did not link to the core within 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for region in ["eu", "us"] {
        succeeded(&landfall(&["deploy", "region-link", "--region", region], Some((&core_url, &operator, None))));
    }

    let at_core = Bus::connect_with(&core_url, "core", &user(&operator, None)).await.unwrap();
    let api = landfall_tests::api::Api::start_at_core(&at_core, &["eu", "us"]).await;
    let (eu_site, us_site) = (producers::run::demo::demo_site(0, 1), producers::run::demo::demo_site(1, 1));

    // Each region's site registered through the core's API, under its region's path.
    let mut ids = Vec::new();
    for (region, design) in [("eu", &eu_site), ("us", &us_site)] {
        let cmd = bus_schema::pb::RegisterSite { design: Some(design.into()), expected: None };
        let path = format!("/regions/{region}/v1/commands/register_site");
        let (status, body) = api.post(OPERATOR, &path, &serde_json::to_string(&cmd).unwrap(), &[]).await;
        assert_eq!(status, 202, "{body}");
        assert!(body["subject"].as_str().unwrap().starts_with("landfall.cmd."), "{body}");
        ids.push((region, body["id"].as_str().unwrap().to_string()));
    }
    // The region's orchestrator took it (its ledger says so), and its site shows at the core,
    // in its own region only.
    for (region, id) in &ids {
        let path = format!("/regions/{region}/v1/commands/{id}");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (status, body) = api.get(VIEWER, &path).await;
            if status == 200 {
                assert_eq!(body["outcome"], "carried_out", "{body}");
                break;
            }
            assert!(Instant::now() < deadline, "{path} was never settled: {status} {body}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    for (region, mine, theirs) in [("eu", &eu_site, &us_site), ("us", &us_site, &eu_site)] {
        let site_path = |s: &bus_schema::domain::SiteDesign| format!("/regions/{region}/v1/sites/{}", s.site);
        let deadline = Instant::now() + Duration::from_secs(30);
        while api.get(VIEWER, &site_path(mine)).await.0 != 200 {
            assert!(Instant::now() < deadline, "{} never showed", site_path(mine));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(api.get(VIEWER, &site_path(theirs)).await.0, 404, "region {region} shows another region's site");
    }
    let (status, listed) = api.get(VIEWER, "/v1/regions").await;
    assert_eq!(status, 200, "{listed}");
    let names: Vec<&str> = listed.as_array().unwrap().iter().map(|r| r["region"].as_str().unwrap()).collect();
    assert_eq!(names, ["eu", "us"]);
    for region in listed.as_array().unwrap() {
        assert_eq!(region["overview"]["sites"]["total"], 1, "{region}");
    }
    // The CLI reads a region at the core by its path: the audit names who registered its site.
    let mut cli = std::process::Command::new(landfall_tests::cli::binary());
    cli.env_remove("NATS_URL").env("LANDFALL_API_TOKEN", VIEWER).args([
        "audit",
        "--kind",
        "register_site",
        "-o",
        "json",
        "--api",
        &api.url("/regions/us"),
    ]);
    // Apart from this test's runtime, which serves the API it asks.
    let audit = tokio::task::spawn_blocking(move || cli.output()).await.unwrap().unwrap();
    let text = succeeded(&audit);
    assert!(text.contains(&us_site.site.to_string()) && text.contains("token:test-operator"), "{text}");
    assert!(!text.contains(&eu_site.site.to_string()), "region us's audit shows region eu's command: {text}");
    // Nothing landfall keeps was made at the core but the regions' own streams.
    let mut streams = at_core.jetstream().stream_names();
    let mut at_the_core = Vec::new();
    while let Some(name) = streams.next().await {
        at_the_core.push(name.unwrap());
    }
    at_the_core.sort();
    let mut linked: Vec<String> =
        ["eu", "us"].iter().flat_map(|r| [names::core_commands_stream(r), names::core_events_stream(r)]).collect();
    linked.sort();
    assert_eq!(at_the_core, linked);
    // Without a token, the core's list is refused; a path of no region is not found.
    assert_eq!(api.http.get(api.url("/v1/regions")).send().await.unwrap().status(), 401);
    assert_eq!(api.get(VIEWER, "/regions/asia/v1/sites").await.0, 404);
    let (_, document) = api.get(VIEWER, "/openapi.json").await;
    assert!(
        document["paths"]["/v1/regions"].is_object() && document["paths"]["/regions/{region}/v1/sites"].is_object()
    );
    shutdown.cancel();
}
