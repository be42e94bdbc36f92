//! Maintenance windows through the real bus, orchestrator and simulated gateways, on a
//! time-scaled window clock (an hour a second): two sites in two time zones in one rollout, the
//! one whose night comes later waiting for it with no lease and no job (its downloads staged
//! meanwhile), then patched; an emergency rollout that ignores windows.

use std::time::Duration;

use bus_schema::names::{self, keys};
use bus_schema::pb::{self, BusEvent};
use bus_schema::runtime::Envelope;
use bus_schema::window::parse_instant;
use landfall_tests::fleet::{Fleet, kubelet};
use landfall_tests::nats::NatsServer;

const TIMEOUT: Duration = Duration::from_secs(60);

fn nightly(zone: &str) -> pb::MaintenanceWindow {
    pb::MaintenanceWindow { cron: "0 22 * * *".into(), time_zone: zone.into(), duration_seconds: 2 * 3600 }
}

/// Gives site `i` of the fleet these windows (its design registered again).
async fn set_windows(fleet: &Fleet, i: usize, windows: Vec<pb::MaintenanceWindow>) {
    let mut design = pb::SiteDesign::from(&fleet.sites[i].0);
    design.maintenance_windows = windows;
    let env = Envelope::root();
    fleet.bus.publish_command(&pb::RegisterSite { design: Some(design), expected: None }, &env).await.unwrap();
    fleet.wait_for(pb::SiteRegistered::filter(), &env.id, Duration::from_secs(20)).await.expect("registered");
}

async fn register(fleet: &Fleet, package: pb::Package) {
    let env = Envelope::root();
    fleet.bus.publish_command(&pb::RegisterPackage { package: Some(package), auto_rollout: None }, &env).await.unwrap();
    fleet.wait_for(pb::PackageRegistered::filter(), &env.id, Duration::from_secs(20)).await.expect("registered");
}

#[tokio::test]
async fn each_site_starts_inside_its_own_window_and_the_later_one_waits() {
    let server = NatsServer::start();
    // 21:30 UTC: 22:30 in Berlin (its night has begun), 13:30 in Los Angeles (its begins at
    // 06:00 UTC, eight and a half hours on: eight and a half seconds here).
    let start = parse_instant("2026-11-27T21:30:00Z").unwrap();
    let clock = consumers::WindowClock::simulated(start, 3600.0);
    let fleet = Fleet::builder(&server.url()).sites(2).nodes(1).window_clock(clock.clone()).start().await;
    fleet.install_all().await;
    set_windows(&fleet, 0, vec![nightly("Europe/Berlin")]).await;
    set_windows(&fleet, 1, vec![nightly("America/Los_Angeles")]).await;
    register(&fleet, kubelet("1.30.0")).await;
    clock.set(start);
    let started = std::time::Instant::now();
    let patch = pb::PatchPackage { name: "kubelet".into(), version: "1.30.0".into(), ..Default::default() };
    let cmd = fleet.patch(patch).await;

    // Berlin's site is patched at once; Los Angeles' waits for its night, holding no lease.
    let (berlin, la) = (fleet.site_id(0), fleet.site_id(1));
    let first = fleet.wait_for(pb::SitePatched::filter(), &cmd.id, TIMEOUT).await.expect("a site patched");
    assert_eq!(first.delivery.decode::<pb::SitePatched>().unwrap().site_id, berlin);
    let sagas = fleet.bus.kv(names::SAGAS_BUCKET).await.unwrap();
    let waiting = sagas.get::<pb::RolloutSite>(&keys::rollout_site(&cmd.id, &la)).await.unwrap().map(|(r, _)| r);
    let waiting = waiting.expect("the waiting site's record");
    assert_eq!(waiting.state, pb::RolloutSiteState::WaitingWindow as i32);
    assert_eq!(waiting.window_opens_unix_ms, parse_instant("2026-11-28T06:00:00Z").unwrap());
    assert!(sagas.get::<pb::SiteLease>(&keys::site_lease(&la)).await.unwrap().is_none(), "no lease while it waits");
    assert!(fleet.backend(1).effects().patches.is_empty());
    // Its downloads need no window: its cache is filled while it waits.
    let staged = fleet.wait_for(pb::ArtifactsStaged::filter(), &cmd.id, Duration::from_secs(5)).await;
    let staged = staged.expect("staged ahead of the window").delivery.decode::<pb::ArtifactsStaged>().unwrap();
    assert_eq!(staged.site_id, la);
    assert!(fleet.backend(1).effects().patches.is_empty(), "staged, not patched");
    let out = landfall_tests::cli::landfall(&server.url(), &["rollout", "show", &cmd.id]).await;
    let shown = landfall_tests::cli::text(&out.stdout);
    assert!(shown.contains("waiting for the site's maintenance window (opens 2026-11-28T06:00:00"), "{shown}");

    let run = fleet.wait_rollout(&cmd.id, TIMEOUT).await;
    let done = run.of_type::<pb::RolloutCompleted>().pop().unwrap_or_else(|| panic!("completed: {:?}", run.kinds()));
    assert_eq!((done.patched, done.failed), (2, 0));
    assert!(
        started.elapsed() >= Duration::from_secs(7),
        "Los Angeles' site waited for its night: {:?}",
        started.elapsed()
    );
    let record = sagas.get::<pb::RolloutSite>(&keys::rollout_site(&cmd.id, &la)).await.unwrap().unwrap().0;
    assert_eq!(record.state, pb::RolloutSiteState::Done as i32);

    // An emergency: windows ignored, on record; both sites (one outside its window now) start at once.
    let emergency = pb::PatchPackage {
        name: "kubelet".into(),
        version: "1.29.2".into(),
        ignore_windows: true,
        ..Default::default()
    };
    set_windows(&fleet, 0, vec![nightly("Pacific/Auckland"), nightly("Asia/Tokyo")]).await;
    let cmd = fleet.patch(emergency).await;
    let quick = std::time::Instant::now();
    let run = fleet.wait_rollout(&cmd.id, TIMEOUT).await;
    assert!(run.of_type::<pb::RolloutCompleted>().pop().is_some(), "{:?}", run.kinds());
    assert!(quick.elapsed() < Duration::from_secs(5), "{:?}", quick.elapsed());
    let r = sagas.get::<pb::Rollout>(&keys::rollout(&cmd.id)).await.unwrap().unwrap().0;
    assert!(r.ignore_windows);
    fleet.stop().await;
}
