//! Maintenance windows in designs: checked as written, agreed on by the cluster's nodes, shown.
//!
//! A host profile's `maintenanceWindows` replaces the list it inherits whole (`[]`: changes may
//! start at any time); the Site document's, when it gives any, go over every node's (see
//! [`super::resolve()`]). The site's windows are those its cluster's nodes end up with, which
//! must be the same for all of them.

use super::error::Errors;
use super::origin::Origin;
use super::resolve::EffectiveNode;
use crate::window::{Window, WindowSpec, format_utc};

/// Every problem of the windows `origin` writes, each at `maintenanceWindows[i].field`.
pub(crate) fn check(origin: &Origin, windows: &[WindowSpec], errors: &mut Errors) {
    for (i, window) in windows.iter().enumerate() {
        for problem in window.problems() {
            errors.push(origin.error(format!("maintenanceWindows[{i}].{}", problem.field), problem.reason));
        }
    }
}

/// The site's maintenance windows: those of its cluster's `nodes`, which must all have the same.
/// Each node that has others than the first is an error naming both.
pub(crate) fn of_cluster(nodes: &[&EffectiveNode], errors: &mut Errors) -> Vec<Window> {
    let Some((first, others)) = nodes.split_first() else { return Vec::new() };
    for node in others.iter().filter(|node| compared(node) != compared(first)) {
        errors.push(node.origin.error(
            "maintenanceWindows",
            format!(
                "changes start in the same maintenance windows on every node of the cluster, and {} has other \
                 windows than {} (their host profiles differ in them; the Site document's would hold for both)",
                node.name, first.name
            ),
        ));
    }
    let Some(set) = &first.maintenance_windows else { return Vec::new() };
    let mut windows = Vec::new();
    for (i, spec) in set.value.iter().enumerate() {
        match spec.window() {
            Ok(window) => windows.push(window),
            Err(e) => errors.push(set.origin.error(format!("maintenanceWindows[{i}].{}", e.field), e.reason)),
        }
    }
    windows
}

/// A node's windows as they compare: read where they read (`240m` is `4h`), as written where not.
fn compared(node: &EffectiveNode) -> Vec<Result<Window, &WindowSpec>> {
    let written = node.maintenance_windows.as_ref().map_or(&[][..], |set| set.value.as_slice());
    written.iter().map(|spec| spec.window().map_err(|_| spec)).collect()
}

/// What `design show` prints of a node's windows, with the document that set them; given
/// `now_ms`, each window's next opening in UTC and on its zone's clock, and whether it is open.
pub(crate) fn lines(node: &EffectiveNode, now_ms: Option<i64>) -> Vec<(String, Option<&Origin>)> {
    let Some(set) = &node.maintenance_windows else { return Vec::new() };
    if set.value.is_empty() {
        return vec![("maintenanceWindows = none: changes may start at any time".to_string(), Some(&set.origin))];
    }
    let mut lines = Vec::new();
    for (i, spec) in set.value.iter().enumerate() {
        lines.push((format!("maintenanceWindows[{i}] = {spec}"), Some(&set.origin)));
        let Some(now) = now_ms else { continue };
        let next = match spec.window() {
            Err(e) => format!("not known: {e}"),
            Ok(window) => match window.next_opening(now) {
                None => "never".to_string(),
                Some(at) => {
                    let open = if window.open_at(now) { " (open now)" } else { "" };
                    format!("{}, {}{open}", format_utc(at), window.wall_clock(at))
                }
            },
        };
        lines.push((format!("maintenanceWindows[{i}].next = {next}"), None));
    }
    lines
}

#[cfg(test)]
mod tests {
    use crate::design::fixtures::{design, documents, resolved, site};
    use crate::design::select::{Selection, select};
    use crate::design::{render_effective, render_effective_at, to_site_design, validate};
    use crate::window::parse_instant;

    const NIGHTLY: &str = "[{ cron: '0 22 * * *', timeZone: Europe/Berlin, duration: 4h }]";

    /// The fixture design with windows `base` on the `base` profile, and `worker` on `worker`.
    fn with_windows(base: &str, worker: Option<&str>) -> String {
        let text = design(
            &site("{ count: 1 }", "{ count: 2 }"),
            &[(1, "control", "r1"), (2, "worker", "r1"), (3, "big-worker", "r2")],
        );
        let text = text.replace("name: base\n", &format!("name: base\nmaintenanceWindows: {base}\n"));
        match worker {
            Some(w) => text.replace("name: worker\n", &format!("name: worker\nmaintenanceWindows: {w}\n")),
            None => text,
        }
    }

    fn errors(text: &str) -> Vec<String> {
        match validate(&documents(text), &crate::design::fixtures::catalog()) {
            Ok(site) => match to_site_design(&site, &select(&site, &Selection::default()).unwrap()) {
                Ok(_) => Vec::new(),
                Err(errors) => errors.iter().map(ToString::to_string).collect(),
            },
            Err(errors) => errors.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn inherited_down_the_profiles_and_resolved_into_the_site() {
        let site = resolved(&with_windows(NIGHTLY, None));
        let shown = render_effective(site.node("node-3").unwrap());
        assert!(
            shown
                .contains(r#"maintenanceWindows[0] = "0 22 * * *" in Europe/Berlin for 4h    (from HostProfile/base)"#),
            "{shown}"
        );
        let flat = to_site_design(&site, &select(&site, &Selection::default()).unwrap()).unwrap();
        assert_eq!(flat.maintenance_windows.len(), 1);
        assert_eq!(flat.maintenance_windows[0].duration_seconds(), 14_400);
        let message = crate::pb::SiteDesign::from(&flat);
        assert_eq!(message.maintenance_windows[0].time_zone, "Europe/Berlin");
    }

    #[test]
    fn a_childs_list_replaces_its_parents_and_the_cluster_must_agree() {
        let text = with_windows(NIGHTLY, Some("[{ cron: '0 3 * * SUN', timeZone: UTC, duration: 2h }]"));
        let site = resolved(&text);
        let shown = render_effective(site.node("node-3").unwrap());
        assert!(shown.contains(r#"maintenanceWindows[0] = "0 3 * * SUN" in UTC for 2h"#), "{shown}");
        assert!(shown.contains("(from HostProfile/worker)"), "{shown}");
        assert!(!shown.contains("Europe/Berlin"), "replaced whole: {shown}");
        let got = errors(&text);
        assert_eq!(got.len(), 2, "{got:#?}");
        assert!(
            got[0].starts_with(
                "Node/node-2 (site.yaml #9): maintenanceWindows: changes start in the same maintenance windows"
            ) && got[0].contains("node-2 has other windows than node-1"),
            "{got:#?}"
        );

        // `[]`: at any time, which is another set again.
        let cleared = with_windows(NIGHTLY, Some("[]"));
        let shown = render_effective(resolved(&cleared).node("node-2").unwrap());
        assert!(shown.contains("maintenanceWindows = none: changes may start at any time"), "{shown}");
        assert_eq!(errors(&cleared).len(), 2);

        // Written differently, the same windows.
        let same = with_windows(NIGHTLY, Some("[{ cron: '0  22 * * *', timeZone: europe/berlin, duration: 240m }]"));
        assert_eq!(errors(&same), Vec::<String>::new());
    }

    #[test]
    fn the_site_documents_windows_hold_for_every_node() {
        let text = with_windows(NIGHTLY, Some("[]")).replace(
            "kind: Site\n",
            "kind: Site\nmaintenanceWindows: [{ cron: '30 1 * * *', timeZone: America/Los_Angeles, duration: 1h }]\n",
        );
        let site = resolved(&text);
        let shown = render_effective(site.node("node-2").unwrap());
        assert!(shown.contains("(from Site/edge-01)"), "{shown}");
        let flat = to_site_design(&site, &select(&site, &Selection::default()).unwrap()).unwrap();
        assert_eq!(flat.maintenance_windows[0].time_zone(), "America/Los_Angeles");
    }

    #[test]
    fn every_bad_window_is_reported_where_it_is_written() {
        let text = with_windows("[{ cron: '0 25 * * *', timeZone: Mars/Olympus, duration: 8d }]", None).replace(
            "kind: Site\n",
            "kind: Site\nmaintenanceWindows: [{ cron: '0 0 30 2 *', timeZone: UTC, duration: 1h }]\n",
        ) + "---\nkind: HostProfile\nname: unused\nmaintenanceWindows: [{ cron: '* * * *', timeZone: UTC, duration: 1h }]\n";
        let got = errors(&text);
        let expected = [
            r#"HostProfile/base (site.yaml #4): maintenanceWindows[0].cron: field "hour" value 25 is out of 0-23"#,
            r#"HostProfile/base (site.yaml #4): maintenanceWindows[0].timeZone: "Mars/Olympus" is not an IANA time zone"#,
            "HostProfile/base (site.yaml #4): maintenanceWindows[0].duration: 8d is longer than a window may be (7d)",
            r#"HostProfile/unused (site.yaml #11): maintenanceWindows[0].cron: "* * * *" has 4 fields"#,
            r#"Site/edge-01 (site.yaml #1): maintenanceWindows[0].cron: "0 0 30 2 *" never matches a day"#,
        ];
        assert_eq!(got.len(), expected.len(), "{got:#?}");
        for (got, expected) in got.iter().zip(expected) {
            assert!(got.starts_with(expected), "{got}\nshould start with\n{expected}");
        }
    }

    #[test]
    fn shown_with_the_next_opening_in_utc_and_in_the_zone() {
        let site = resolved(&with_windows(NIGHTLY, None));
        let node = site.node("node-1").unwrap();
        let at = |text| render_effective_at(node, parse_instant(text).unwrap());
        let shown = at("2025-01-10T12:00:00Z");
        assert!(shown.contains("maintenanceWindows[0].next = 2025-01-10 21:00 UTC, 2025-01-10 22:00 CET\n"), "{shown}");
        let shown = at("2025-07-10T22:00:00Z");
        assert!(
            shown.contains("maintenanceWindows[0].next = 2025-07-11 20:00 UTC, 2025-07-11 22:00 CEST (open now)\n"),
            "{shown}"
        );
        assert!(!render_effective(node).contains(".next"), "without a time, no next opening");
    }
}
