//! Maintenance windows, as the rollout decider reads them: whether a site's job may start now,
//! and the record of a site that waits for its window.

use bus_schema::envelope::Envelope;
use bus_schema::pb;
use bus_schema::window::{self, Window};

use super::envelope;

/// Whether a site's job may start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Now: the rollout ignores windows, the site has none, or one is open.
    Open,
    /// Not before `opens` (milliseconds since the epoch); `None`: no window of it ever opens.
    Closed { opens: Option<i64> },
}

/// Whether rollout `r` may start a site whose design gives `windows`, at `now` (the time windows
/// are read at). Downloads are not gated: only the job that changes nodes is.
pub fn gate(r: &pb::Rollout, windows: &[pb::MaintenanceWindow], now: i64) -> Gate {
    if r.ignore_windows || windows.is_empty() {
        return Gate::Open;
    }
    // A design is checked when it is stored: a window that does not read is left out here.
    let windows: Vec<Window> =
        windows.iter().filter_map(|w| Window::from_seconds(&w.cron, &w.time_zone, w.duration_seconds).ok()).collect();
    if window::open_now(&windows, now) {
        Gate::Open
    } else {
        Gate::Closed { opens: window::next_opening(&windows, now) }
    }
}

/// The record of the site at plan `index` while it waits for its window, as people read it.
pub fn waiting_record(r: &pb::Rollout, index: usize, site: &str, opens: Option<i64>, now: i64) -> pb::RolloutSite {
    pb::RolloutSite {
        rollout_id: r.rollout_id.clone(),
        site_id: site.to_string(),
        plan_index: index as u32,
        state: pb::RolloutSiteState::WaitingWindow as i32,
        window_opens_unix_ms: opens.unwrap_or_default(),
        updated_unix_ms: now,
        ..Default::default()
    }
}

/// The job that fills the cache of a site waiting for its window with what its job will need
/// (the rollout's package, a rollback's versions), so the download runs outside the window and
/// the change inside it starts from the site's cache. A chart is left out: its render is made
/// for the site when its job asks.
pub fn stage_ahead(r: &pb::Rollout, site: &str) -> Option<(pb::StageArtifacts, Envelope)> {
    let artifacts: Vec<pb::Package> = r
        .entry
        .iter()
        .chain(&r.targets)
        .filter(|p| p.kind != pb::PackageKind::HelmChart as i32 && !p.sha256.is_empty())
        .cloned()
        .collect();
    if artifacts.is_empty() {
        return None;
    }
    let env = envelope(r).derive("stage_ahead", Some(site));
    Some((pb::StageArtifacts { site_id: site.to_string(), artifacts }, env))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn windows(list: &[(&str, &str, u32)]) -> Vec<pb::MaintenanceWindow> {
        list.iter()
            .map(|(cron, tz, secs)| pb::MaintenanceWindow {
                cron: cron.to_string(),
                time_zone: tz.to_string(),
                duration_seconds: *secs,
            })
            .collect()
    }

    /// 2026-11-27 21:30 UTC: 22:30 in Berlin, 13:30 in Los Angeles.
    const NOW: i64 = 1_795_815_000_000;

    #[test]
    fn a_site_starts_only_inside_its_window_in_its_own_zone() {
        let r = pb::Rollout::default();
        let nightly = |tz| windows(&[("0 22 * * *", tz, 4 * 3600)]);
        assert_eq!(gate(&r, &nightly("Europe/Berlin"), NOW), Gate::Open, "22:30 in Berlin");
        let Gate::Closed { opens: Some(opens) } = gate(&r, &nightly("America/Los_Angeles"), NOW) else {
            panic!("13:30 in Los Angeles is outside 22:00-02:00");
        };
        assert_eq!(opens, NOW + (8 * 60 + 30) * 60_000, "22:00 in Los Angeles is 06:00 UTC");
        assert_eq!(gate(&r, &[], NOW), Gate::Open, "no windows: any time");
        let emergency = pb::Rollout { ignore_windows: true, ..r.clone() };
        assert_eq!(gate(&emergency, &nightly("America/Los_Angeles"), NOW), Gate::Open);
        assert_eq!(gate(&r, &windows(&[("0 0 30 2 *", "UTC", 3600)]), NOW), Gate::Closed { opens: None });
        let kubelet = pb::Package { name: "kubelet".into(), sha256: "ab".repeat(32), ..Default::default() };
        let (stage, _) = stage_ahead(&pb::Rollout { entry: Some(kubelet), ..r.clone() }, "edge-7").unwrap();
        assert_eq!((stage.site_id.as_str(), stage.artifacts.len()), ("edge-7", 1));
        assert!(stage_ahead(&r, "edge-7").is_none(), "nothing to fetch");
        let record = waiting_record(&r, 3, "edge-7", Some(opens), NOW);
        assert_eq!((record.state, record.window_opens_unix_ms), (pb::RolloutSiteState::WaitingWindow as i32, opens));
    }
}
