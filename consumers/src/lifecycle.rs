//! Node removal, node reprovision and site decommission, as pure decisions: what is refused and
//! why, the job each sends its site, the record that holds the site's lease while the job is
//! there, and the envelope of a reprovision's join. [`crate::orchestrator`] executes them.

use bus_schema::domain::{Role, SiteDesign};
use bus_schema::envelope::Envelope;
use bus_schema::pb::{self, BusJob};

use crate::decision::Refusal;

fn refused(code: pb::RejectCode, reason: String) -> Refusal {
    Refusal { code, reason }
}

/// The site's masters, by name.
pub fn masters(design: &SiteDesign) -> Vec<String> {
    design.nodes.iter().filter(|n| n.role == Role::Master).map(|n| n.name.to_string()).collect()
}

/// The job that takes `node` away from `design`'s site: `None` when the design does not have the
/// node (a removal repeated after it ended: the site is asked all the same, and finds nothing).
///
/// # Errors
/// Removing the last master: the cluster would be gone with it.
pub fn remove_job(site: &str, design: &SiteDesign, node: &str) -> Result<pb::RetireNode, Refusal> {
    let masters = masters(design);
    let cleaning = design.node(node).map_or(pb::CleaningMode::Unspecified, |n| n.cleaning);
    let role = match design.node(node) {
        Some(n) if n.role == Role::Master && masters.len() == 1 => {
            return Err(refused(
                pb::RejectCode::Conflict,
                format!(
                    "{node} is the last master of {site}: its cluster would be gone (decommission the site instead)"
                ),
            ));
        }
        Some(n) => n.role,
        None => Role::Worker,
    };
    Ok(pb::RetireNode {
        site_id: site.to_string(),
        node: node.to_string(),
        role: pb::Role::from(role) as i32,
        masters,
        keep_host: false,
        cleaning: cleaning as i32,
    })
}

/// The job that wipes `node` for its reprovision (its host stays, available, for the join).
///
/// # Errors
/// A node the design does not have; the site's only master (re-imaging it loses the cluster's
/// etcd).
pub fn reprovision_job(site: &str, design: &SiteDesign, node: &str) -> Result<pb::RetireNode, Refusal> {
    let Some(n) = design.node(node) else {
        return Err(refused(pb::RejectCode::Invalid, format!("{site} has no node {node} in its design")));
    };
    let masters = masters(design);
    if n.role == Role::Master && masters.len() == 1 {
        return Err(refused(
            pb::RejectCode::Conflict,
            format!("{node} is the only master of {site}: re-imaging it would lose the cluster's etcd"),
        ));
    }
    Ok(pb::RetireNode {
        site_id: site.to_string(),
        node: node.to_string(),
        role: pb::Role::from(n.role) as i32,
        masters,
        keep_host: true,
        cleaning: n.cleaning as i32,
    })
}

/// The record of an operation begun by the command with envelope `cmd`, whose job goes out with
/// the envelope `job`.
pub fn start(
    cmd: &Envelope,
    job: &Envelope,
    site: &str,
    kind: pb::LifecycleKind,
    node: &str,
    reason: &str,
    now_ms: i64,
) -> pb::Lifecycle {
    pb::Lifecycle {
        id: cmd.id.clone(),
        site_id: site.to_string(),
        kind: kind as i32,
        node: node.to_string(),
        phase: pb::LifecyclePhase::TearingDown as i32,
        reason: reason.to_string(),
        job_id: job.id.clone(),
        correlation: cmd.correlation.clone(),
        traceparent: cmd.traceparent.clone(),
        actor: cmd.actor.clone(),
        started_unix_ms: now_ms,
        ..Default::default()
    }
}

/// The envelope of the command that began `op`, as it was: what its job, its events and a
/// reprovision's join derive from.
pub fn envelope(op: &pb::Lifecycle) -> Envelope {
    Envelope {
        id: op.id.clone(),
        correlation: op.correlation.clone(),
        causation: op.id.clone(),
        traceparent: op.traceparent.clone(),
        actor: op.actor.clone(),
    }
}

/// The envelope a reprovision's join saga starts from: a root of its own (sagas are found by
/// their correlation), its id derived from the operation's, its trace the operation's.
pub fn rejoin_envelope(op: &pb::Lifecycle) -> Envelope {
    let derived = envelope(op).derive("rejoin", Some(&op.node));
    Envelope { correlation: derived.id.clone(), causation: op.id.clone(), ..derived }
}

/// The command kind that begins an operation of `kind`, as events name it.
pub fn operation(kind: i32) -> &'static str {
    use pb::BusCommand;
    match pb::LifecycleKind::try_from(kind) {
        Ok(pb::LifecycleKind::RemoveNode) => pb::RemoveNode::KIND,
        Ok(pb::LifecycleKind::ReprovisionNode) => pb::ReprovisionNode::KIND,
        Ok(pb::LifecycleKind::DecommissionSite) => pb::DecommissionSite::KIND,
        _ => "unknown",
    }
}

/// Whether a site's report may answer `op`'s job: it names `op`'s site in its subject, was
/// caused by `op`'s job, and is about `op`'s node when it names one.
///
/// # Errors
/// The reason, for its `FORBIDDEN` rejection.
pub fn check_answer(op: &pb::Lifecycle, site: &str, node: Option<&str>, causation: &str) -> Result<(), String> {
    if op.site_id != site {
        return Err(format!("operation {} is site {}'s, not site {site}'s", op.id, op.site_id));
    }
    if op.job_id != causation {
        return Err(format!("operation {} sent site {site} no job {causation}", op.id));
    }
    if let Some(node) = node
        && !op.node.is_empty()
        && node != op.node
    {
        return Err(format!("operation {} is about node {}, not {node}", op.id, op.node));
    }
    Ok(())
}

/// The job kinds an operation sends: a `JobFailed` naming one of them is about an operation.
pub fn is_lifecycle_job(kind: &str) -> bool {
    kind == pb::RetireNode::KIND || kind == pb::TearDownSite::KIND
}

/// How a decommissioned site's NATS user is revoked.
pub fn revocation(site: &str) -> String {
    format!(
        "a site that joined by enrollment is revoked by the identity service now, its connections closed; a \
         site with a user in the hub's configuration (--site-auth static): run `landfall deploy nats-config` \
         again with --sites no longer naming {site}, reload the hub's servers (`nats-server --signal reload`) \
         and delete the site's key file"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn design(masters: &[&str], workers: &[&str]) -> SiteDesign {
        let mut nodes = Vec::new();
        for (i, (name, role)) in
            masters.iter().map(|m| (m, Role::Master)).chain(workers.iter().map(|w| (w, Role::Worker))).enumerate()
        {
            nodes.push(bus_schema::domain::NodeDesign {
                name: (*name).try_into().unwrap(),
                role,
                boot_mac: format!("52:54:00:00:00:{i:02x}").try_into().unwrap(),
                bmc_address: format!("ipmi://10.0.0.{}", i + 1).try_into().unwrap(),
                labels: Default::default(),
                network: None,
                root_device: None,
                kernel_parameters: Default::default(),
                cleaning: Default::default(),
            });
        }
        SiteDesign {
            site: "edge-01".try_into().unwrap(),
            labels: Default::default(),
            nodes,
            packages: Default::default(),
            cluster: Default::default(),
            values: Default::default(),
            maintenance_windows: Vec::new(),
        }
    }

    #[test]
    fn the_last_master_is_never_removed_and_the_only_one_never_reprovisioned() {
        let one = design(&["m-1"], &["w-1"]);
        let e = remove_job("edge-01", &one, "m-1").unwrap_err();
        assert_eq!(e.code, pb::RejectCode::Conflict);
        assert!(e.reason.contains("last master"), "{}", e.reason);
        let e = reprovision_job("edge-01", &one, "m-1").unwrap_err();
        assert!(e.reason.contains("only master"), "{}", e.reason);

        let three = design(&["m-1", "m-2", "m-3"], &["w-1"]);
        let job = remove_job("edge-01", &three, "m-2").unwrap();
        assert_eq!(job.role, pb::Role::Master as i32);
        assert_eq!(job.masters, ["m-1", "m-2", "m-3"]);
        assert!(!job.keep_host);
        assert!(reprovision_job("edge-01", &three, "m-2").unwrap().keep_host);
    }

    #[test]
    fn a_node_the_design_lacks_is_still_looked_for_by_a_removal_but_not_reprovisioned() {
        let d = design(&["m-1"], &["w-1"]);
        assert_eq!(remove_job("edge-01", &d, "w-9").unwrap().role, pb::Role::Worker as i32);
        assert_eq!(reprovision_job("edge-01", &d, "w-9").unwrap_err().code, pb::RejectCode::Invalid);
    }

    #[test]
    fn a_report_answers_only_its_operations_job_at_its_site_about_its_node() {
        let cmd = Envelope::root();
        let job = cmd.derive(pb::RetireNode::KIND, Some("w-1"));
        let op = start(&cmd, &job, "edge-01", pb::LifecycleKind::RemoveNode, "w-1", "", 1);
        assert_eq!(check_answer(&op, "edge-01", Some("w-1"), &job.id), Ok(()));
        assert!(check_answer(&op, "edge-02", Some("w-1"), &job.id).is_err());
        assert!(check_answer(&op, "edge-01", Some("w-2"), &job.id).is_err());
        assert!(check_answer(&op, "edge-01", Some("w-1"), &cmd.id).is_err());
        assert_eq!(envelope(&op), cmd);
    }

    #[test]
    fn a_reprovisions_join_is_a_root_of_its_own_carrying_the_operations_trace() {
        let cmd = Envelope::root();
        let op = start(&cmd, &cmd.derive("job", None), "edge-01", pb::LifecycleKind::ReprovisionNode, "w-1", "", 1);
        let rejoin = rejoin_envelope(&op);
        assert_eq!(rejoin.id, rejoin.correlation);
        assert_ne!(rejoin.id, cmd.id);
        assert_eq!(rejoin, rejoin_envelope(&op), "the same every time");
        assert_eq!(rejoin.trace_id(), cmd.trace_id());
    }
}
