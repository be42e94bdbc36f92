//! What a simulated site takes from outside that a real one gets from its racks: a new host
//! (`landfall node add` → `SimulateHostArrival`). A real site needs none of it: a new host
//! appears there as a BareMetalHost, and its gateway hears of it through the backend.

use bus_schema::domain::{NodeDesign, SiteId};
use bus_schema::names;
use bus_schema::pb::{self, BusMessage};
use bus_schema::runtime::{self, Bus, error_reply};
use bytes::Bytes;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::sim::SimSite;

/// Answers `SimulateHostArrival` requests for `site` until `shutdown`: a valid one makes the
/// host arrive at `sim` (which announces it, once, to the site's gateway) and gets an empty
/// reply; any other gets an error reply that says why.
///
/// # Errors
/// When the subscription cannot be made.
pub async fn serve_sim_control(
    site: SiteId,
    bus: Bus,
    sim: SimSite,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let subject = names::sim_host_arrival_rpc(site.as_str());
    let group = names::gateway_consumer(site.as_str());
    runtime::serve_requests(&bus, subject, &group, 1, shutdown, move |_, payload| {
        let reply = match host_arrival(&site, &sim, &payload) {
            Ok(()) => (async_nats::HeaderMap::new(), Bytes::new()),
            Err(reason) => error_reply(&reason),
        };
        std::future::ready(reply)
    })
    .await?;
    Ok(())
}

/// Carries out one request; the reason when it is refused. A host the site has already is
/// not an error: asking twice is what a retrying client does.
fn host_arrival(site: &SiteId, sim: &SimSite, payload: &[u8]) -> Result<(), String> {
    let req: pb::SimulateHostArrival =
        prost::Message::decode(payload).map_err(|e| format!("not a {}: {e}", pb::SimulateHostArrival::TYPE))?;
    if req.site_id != site.as_str() {
        return Err(format!("request for site {:?} reached {site}", req.site_id));
    }
    let node = NodeDesign::try_from(req.node.unwrap_or_default()).map_err(|e| format!("node.{e}"))?;
    if !sim.arrive(&node) {
        info!(%site, node = %node.name, "host already at the site: not announced again");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use bus_schema::domain::Role;
    use prost::Message;

    use super::*;
    use crate::SiteBackend;
    use crate::sim::SimConfig;

    fn request(site: &str, name: &str, mac: &str) -> Vec<u8> {
        let node = pb::NodeSpec {
            name: name.into(),
            role: pb::Role::Worker as i32,
            boot_mac: mac.into(),
            bmc_address: "ipmi://10.0.1.9".into(),
            labels: Default::default(),
            ..Default::default()
        };
        pb::SimulateHostArrival { site_id: site.into(), node: Some(node) }.encode_to_vec()
    }

    #[tokio::test(start_paused = true)]
    async fn a_valid_arrival_is_announced_once_and_bad_ones_say_why() {
        let site = SiteId::try_from("edge-01").unwrap();
        let sim = SimSite::new("edge-01", &[], SimConfig::instant());
        let mut arrivals = sim.host_changes();

        let garbage = host_arrival(&site, &sim, b"\xff\xff\xff").unwrap_err();
        assert!(garbage.contains(pb::SimulateHostArrival::TYPE), "{garbage}");
        let elsewhere = host_arrival(&site, &sim, &request("edge-02", "w-9", "52:54:00:00:09:09")).unwrap_err();
        assert!(elsewhere.contains("edge-02"), "{elsewhere}");
        let bad_mac = host_arrival(&site, &sim, &request("edge-01", "w-9", "not-a-mac")).unwrap_err();
        assert!(bad_mac.starts_with("node.boot_mac"), "{bad_mac}");
        let no_node = pb::SimulateHostArrival { site_id: "edge-01".into(), node: None }.encode_to_vec();
        assert!(host_arrival(&site, &sim, &no_node).is_err());
        assert!(sim.hosts().is_empty());

        host_arrival(&site, &sim, &request("edge-01", "w-9", "52:54:00:00:09:09")).unwrap();
        host_arrival(&site, &sim, &request("edge-01", "w-9", "52:54:00:00:09:09")).unwrap();
        let arrived = arrivals.recv().await.and_then(crate::backend::HostNotice::into_arrival).unwrap();
        assert_eq!((arrived.name.as_str(), arrived.role), ("w-9", Role::Worker));
        assert!(arrivals.try_recv().is_err(), "announced twice");
        assert_eq!(sim.hosts().len(), 1);
    }
}
