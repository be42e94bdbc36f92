//! `landfall bench slopes RUN.json…`: the hub's costs across production-shape runs of different
//! sizes (each `bench fanout --shape production` run's JSON), as slopes between sizes, checked
//! against the targets, and drawn as an SVG (hub memory per site and CPU per node update
//! against fleet size).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde_json::json;

use super::round;

/// What a hub is sized by, at 10,000 sites on a 2-core machine.
const TARGET_RSS_KIB_PER_SITE: f64 = 150.0;
const TARGET_CPU_US_PER_UPDATE: f64 = 120.0;
const TARGET_PATCH_S: f64 = 20.0;
const TARGET_SETUP_S: f64 = 180.0;
const TARGET_REGISTER_AND_CONNECT_S: f64 = 20.0;
const TARGET_ORCHESTRATOR_MB: f64 = 300.0;

/// One run, as its JSON says.
#[derive(Debug, Clone, PartialEq)]
struct Run {
    sites: f64,
    node_updates: f64,
    /// The hub's RSS and live heap once installed, and before any site.
    rss_installed_kib: f64,
    rss_empty_kib: f64,
    heap_installed_kib: f64,
    heap_empty_kib: f64,
    /// The hub's RSS after the run's idle period, when it had one (`--idle`).
    rss_settled_kib: Option<f64>,
    hub_cpu_patch_s: f64,
    patch_s: f64,
    setup_s: f64,
    register_and_connect_s: f64,
    orchestrator_peak_mb: f64,
    updates_per_s: f64,
    raw_msgs_per_s: f64,
}

impl Run {
    fn read(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
        Self::from_json(&v).with_context(|| format!("{} is not a production-shape fanout report", path.display()))
    }

    fn from_json(v: &serde_json::Value) -> anyhow::Result<Self> {
        let f = |pointer: &str| v.pointer(pointer).and_then(|x| x.as_f64()).with_context(|| format!("no {pointer}"));
        let mib_to_kib = 1024.0;
        Ok(Self {
            sites: f("/sites")?,
            node_updates: f("/node_updates")?,
            rss_installed_kib: f("/hub_costs/installed/rss_mib")? * mib_to_kib,
            rss_empty_kib: f("/hub_costs/empty/rss_mib")? * mib_to_kib,
            heap_installed_kib: f("/hub_costs/installed/heap_mib")? * mib_to_kib,
            heap_empty_kib: f("/hub_costs/empty/heap_mib")? * mib_to_kib,
            rss_settled_kib: f("/hub_costs/settled/rss_mib").ok().map(|mib| mib * mib_to_kib),
            hub_cpu_patch_s: f("/hub_nats/cpu_seconds_patch")?,
            patch_s: f("/wall_seconds")?,
            setup_s: f("/setup_seconds/total")?,
            register_and_connect_s: f("/setup_seconds/register")? + f("/setup_seconds/gateways_connect")?,
            orchestrator_peak_mb: f("/services_rss_mib/orchestrator/peak_rss_mib")? * 1.048_576,
            updates_per_s: f("/node_updates_per_second")?,
            raw_msgs_per_s: f("/raw_jetstream_msgs_per_second")?,
        })
    }

    fn rss_kib_per_site(&self) -> f64 {
        (self.rss_installed_kib - self.rss_empty_kib) / self.sites.max(1.0)
    }

    fn settled_rss_kib_per_site(&self) -> Option<f64> {
        self.rss_settled_kib.map(|settled| (settled - self.rss_empty_kib) / self.sites.max(1.0))
    }

    fn cpu_us_per_update(&self) -> f64 {
        self.hub_cpu_patch_s * 1e6 / self.node_updates.max(1.0)
    }
}

/// Reads the runs, prints their slopes and the targets at the largest, and writes `svg`.
pub async fn slopes(files: &[PathBuf], svg: Option<&Path>) -> anyhow::Result<serde_json::Value> {
    let mut runs = files.iter().map(|f| Run::read(f)).collect::<anyhow::Result<Vec<_>>>()?;
    anyhow::ensure!(!runs.is_empty(), "no runs given");
    runs.sort_by(|a, b| a.sites.total_cmp(&b.sites));
    if let Some(path) = svg {
        std::fs::write(path, draw(&runs)).with_context(|| format!("write {}", path.display()))?;
    }
    Ok(report(&runs))
}

fn report(runs: &[Run]) -> serde_json::Value {
    let each: Vec<serde_json::Value> = runs
        .iter()
        .map(|r| {
            json!({
                "sites": r.sites,
                "hub_rss_kib_per_site": round(r.rss_kib_per_site(), 1),
                "hub_rss_kib_per_site_settled": r.settled_rss_kib_per_site().map(|kib| round(kib, 1)),
                "hub_heap_kib_per_site": round((r.heap_installed_kib - r.heap_empty_kib) / r.sites.max(1.0), 1),
                "hub_cpu_us_per_node_update": round(r.cpu_us_per_update(), 1),
                "patch_seconds": r.patch_s,
                "setup_seconds": r.setup_s,
                "register_and_connect_seconds": round(r.register_and_connect_s, 2),
                "orchestrator_peak_mb": round(r.orchestrator_peak_mb, 0),
                "node_updates_per_raw_jetstream_msg": round(r.updates_per_s / r.raw_msgs_per_s.max(1.0), 4),
            })
        })
        .collect();
    // Between consecutive sizes: what each further site cost the installed hub, and what each
    // further node update cost its CPU.
    let between: Vec<serde_json::Value> = runs
        .windows(2)
        // Two runs of one size have no slope between them.
        .filter(|w| w[1].sites > w[0].sites)
        .map(|w| {
            let (a, b) = (&w[0], &w[1]);
            json!({
                "from_sites": a.sites,
                "to_sites": b.sites,
                "hub_rss_kib_per_further_site": round((b.rss_installed_kib - a.rss_installed_kib) / (b.sites - a.sites), 1),
                "hub_rss_kib_per_further_site_settled": a.rss_settled_kib.zip(b.rss_settled_kib)
                    .map(|(a_kib, b_kib)| round((b_kib - a_kib) / (b.sites - a.sites), 1)),
                "hub_cpu_us_per_further_node_update":
                    round((b.hub_cpu_patch_s - a.hub_cpu_patch_s) * 1e6 / (b.node_updates - a.node_updates), 1),
            })
        })
        .collect();
    let largest = runs.last().expect("at least one run");
    let check = |name: &str, value: f64, target: f64| json!({ "what": name, "measured": round(value, 1), "target": target, "met": value <= target });
    let mut targets = vec![
        check("hub RSS KiB per site", largest.rss_kib_per_site(), TARGET_RSS_KIB_PER_SITE),
        check("hub CPU µs per node update", largest.cpu_us_per_update(), TARGET_CPU_US_PER_UPDATE),
        check("patch seconds", largest.patch_s, TARGET_PATCH_S),
        check("setup seconds", largest.setup_s, TARGET_SETUP_S),
        check("register and connect seconds", largest.register_and_connect_s, TARGET_REGISTER_AND_CONNECT_S),
        check("orchestrator peak MB", largest.orchestrator_peak_mb, TARGET_ORCHESTRATOR_MB),
    ];
    if let Some(settled) = largest.settled_rss_kib_per_site() {
        targets
            .insert(1, check("hub RSS KiB per site, settled after the idle period", settled, TARGET_RSS_KIB_PER_SITE));
    }
    json!({ "runs": each, "slopes": between, "targets_at_sites": largest.sites, "targets": targets })
}

/// Two panels side by side: hub RSS per site (KiB) and hub CPU per node update (µs) against the
/// fleet's size, each with its target as a dashed line.
fn draw(runs: &[Run]) -> String {
    let panels = [
        (
            "hub RSS per site (KiB)",
            TARGET_RSS_KIB_PER_SITE,
            runs.iter().map(|r| (r.sites, r.rss_kib_per_site())).collect::<Vec<_>>(),
        ),
        (
            "hub CPU per node update (µs)",
            TARGET_CPU_US_PER_UPDATE,
            runs.iter().map(|r| (r.sites, r.cpu_us_per_update())).collect(),
        ),
    ];
    let (w, h, pad) = (360.0, 260.0, 50.0);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">\n",
        w * 2.0
    );
    let max_sites = runs.iter().map(|r| r.sites).fold(0.0, f64::max) * 1.1;
    for (i, (title, target, points)) in panels.iter().enumerate() {
        let x0 = i as f64 * w;
        let max_y = points.iter().map(|p| p.1).fold(*target, f64::max) * 1.15;
        let px = |sites: f64| x0 + pad + (w - 1.5 * pad) * sites / max_sites;
        let py = |y: f64| h - pad + (pad * 1.5 - h) * y / max_y;
        let _ = writeln!(svg, "<text x=\"{}\" y=\"18\" font-weight=\"bold\">{title}</text>", x0 + pad);
        let _ = writeln!(
            svg,
            "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/><line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>",
            px(0.0),
            py(0.0),
            px(max_sites),
            py(0.0),
            px(0.0),
            py(0.0),
            px(0.0),
            py(max_y)
        );
        let _ =
            writeln!(svg, "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">sites</text>", px(max_sites / 2.0), h - 12.0);
        for k in 0..=4 {
            let y = max_y * k as f64 / 4.0;
            let _ =
                writeln!(svg, "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{y:.0}</text>", px(0.0) - 4.0, py(y) + 4.0);
        }
        let _ = writeln!(
            svg,
            "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"green\" stroke-dasharray=\"4 3\"/><text x=\"{}\" y=\"{}\" fill=\"green\">target {target}</text>",
            px(0.0),
            py(*target),
            px(max_sites),
            py(*target),
            px(0.0) + 4.0,
            py(*target) - 4.0
        );
        let path: Vec<String> = points.iter().map(|(s, y)| format!("{:.1},{:.1}", px(*s), py(*y))).collect();
        let _ = writeln!(
            svg,
            "<polyline fill=\"none\" stroke=\"steelblue\" stroke-width=\"2\" points=\"{}\"/>",
            path.join(" ")
        );
        for (s, y) in points {
            let _ = writeln!(
                svg,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"steelblue\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{:.0} @ {:.0}</text>",
                px(*s),
                py(*y),
                px(*s),
                py(*y) - 7.0,
                y,
                s
            );
        }
    }
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(sites: f64, rss_mib: f64, cpu: f64) -> serde_json::Value {
        json!({
            "sites": sites, "node_updates": sites * 10.0, "wall_seconds": 10.0,
            "node_updates_per_second": 1000.0, "raw_jetstream_msgs_per_second": 50000.0,
            "setup_seconds": { "total": 100.0, "register": 5.0, "gateways_connect": 2.0 },
            "hub_costs": {
                "empty": { "rss_mib": 20.0, "heap_mib": 10.0 },
                "installed": { "rss_mib": rss_mib, "heap_mib": rss_mib / 2.0 },
            },
            "hub_nats": { "cpu_seconds_patch": cpu },
            "services_rss_mib": { "orchestrator": { "peak_rss_mib": 100.0 } },
        })
    }

    #[test]
    fn slopes_are_taken_between_sizes_and_the_largest_is_checked() {
        let runs: Vec<Run> =
            [run(1000.0, 120.0, 1.0), run(2000.0, 220.0, 2.2)].iter().map(|v| Run::from_json(v).unwrap()).collect();
        let r = report(&runs);
        assert_eq!(r["slopes"][0]["hub_rss_kib_per_further_site"], 102.4);
        assert_eq!(r["slopes"][0]["hub_cpu_us_per_further_node_update"], 120.0);
        assert_eq!(r["runs"][1]["hub_cpu_us_per_node_update"], 110.0);
        assert_eq!(r["runs"][0]["hub_heap_kib_per_site"], 51.2, "(60 - 10) MiB over 1,000 sites");
        assert_eq!(r["targets"][1]["met"], true);
        assert_eq!(r["targets"][0]["met"], true, "{}", r["targets"][0]);
        let svg = draw(&runs);
        assert!(svg.starts_with("<svg") && svg.contains("polyline") && svg.trim_end().ends_with("</svg>"));
        assert!(Run::from_json(&json!({ "sites": 1 })).is_err());
        assert!(r["runs"][1]["hub_rss_kib_per_site_settled"].is_null(), "no idle period, no settled figure");
    }

    #[test]
    fn a_run_with_an_idle_period_is_also_checked_settled_beside_its_figure_right_after_the_install() {
        let mut v = run(1000.0, 220.0, 1.0);
        v["hub_costs"]["settled"] = json!({ "rss_mib": 120.0, "heap_mib": 50.0 });
        let r = report(&[Run::from_json(&v).unwrap()]);
        assert_eq!(r["runs"][0]["hub_rss_kib_per_site_settled"], 102.4);
        assert_eq!(r["targets"][0]["measured"], 204.8);
        assert_eq!(r["targets"][0]["met"], false);
        assert_eq!(r["targets"][1]["what"], "hub RSS KiB per site, settled after the idle period");
        assert_eq!(r["targets"][1]["met"], true);
        let mut bigger = run(2000.0, 420.0, 2.0);
        bigger["hub_costs"]["settled"] = json!({ "rss_mib": 220.0, "heap_mib": 90.0 });
        let r = report(&[Run::from_json(&v).unwrap(), Run::from_json(&bigger).unwrap()]);
        assert_eq!(r["slopes"][0]["hub_rss_kib_per_further_site_settled"], 102.4);
    }
}
