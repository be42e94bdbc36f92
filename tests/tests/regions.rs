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
use landfall_tests::nats::free_port;
use landfall_tests::topology::{ConfServer, TlsFiles, leaf_links};

/// `landfall <args>` as the core's operator (for `region-link`), its output.
fn landfall(args: &[&str], core: Option<(&str, &Path, &Path)>) -> std::process::Output {
    let mut cmd = std::process::Command::new(landfall_tests::cli::binary());
    cmd.env_remove("NATS_URL");
    if let Some((url, key, ca)) = core {
        cmd.env("NATS_URL", url).arg("--nats-nkey-file").arg(key).arg("--nats-ca").arg(ca);
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
    let link =
        |region: &str| landfall(&["deploy", "region-link", "--region", region], Some((&core.url, &operator, &tls.ca)));
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
