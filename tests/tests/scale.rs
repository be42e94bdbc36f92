//! Many sites at once through one orchestrator: contention on the saga records, ordering of
//! commands, and the consumers under load. `LANDFALL_SCALE_SITES` / `LANDFALL_SCALE_NODES`
//! size it up for a manual run (`scripts/test --test scale -- --nocapture`).

use std::time::Instant;

use async_nats::jetstream::consumer::DeliverPolicy;
use bus_schema::pb::{self, BusEvent, BusMessage};
use landfall_tests::fleet::Fleet;
use landfall_tests::fleet::INSTALL_TIMEOUT;
use landfall_tests::nats::NatsServer;
use site_gateway::sim::SimConfig;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_sites_install_at_once_each_exactly_once() {
    let sites = env_or("LANDFALL_SCALE_SITES", 24);
    let nodes = env_or("LANDFALL_SCALE_NODES", 4);
    let server = NatsServer::start();
    let fleet = Fleet::builder(&server.url()).sites(sites).nodes(nodes).sim(SimConfig::instant()).start().await;

    // One reader for every site's end, opened before the first command.
    let mut ends = fleet
        .bus
        .read_events(vec![pb::SiteInstalled::filter(), pb::SiteInstallFailed::filter()], DeliverPolicy::New)
        .await
        .unwrap();
    let started = Instant::now();
    for i in 0..sites {
        fleet.install(&fleet.site_id(i)).await;
    }
    let mut installed = 0;
    while installed < sites {
        let end = tokio::time::timeout(INSTALL_TIMEOUT, ends.next()).await.expect("installs end").unwrap().unwrap();
        assert_eq!(end.delivery.type_name, pb::SiteInstalled::TYPE, "{}", end.delivery.subject);
        installed += 1;
    }
    let secs = started.elapsed().as_secs_f64();

    for i in 0..sites {
        let effects = fleet.backend(i).effects();
        assert!(effects.provisions.values().all(|n| *n == 1), "site {i}: {effects:?}");
        assert_eq!(effects.provisions.len(), nodes);
        assert!(effects.binary_installs.values().all(|n| *n == 1), "site {i}: {effects:?}");
    }
    println!(
        "{sites} sites x {nodes} nodes installed in {secs:.2} s ({:.0} nodes/s) with instant simulated sites",
        (sites * nodes) as f64 / secs
    );
    fleet.stop().await;
}
