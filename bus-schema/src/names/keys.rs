//! KV keys.

/// Every site design key starts with this.
pub const SITE_PREFIX: &str = "site.";
/// Every catalog key starts with this.
pub const PACKAGE_PREFIX: &str = "pkg.";

pub fn site(site: &str) -> String {
    format!("{SITE_PREFIX}{site}")
}

/// The site id of a [`site`] key.
pub fn site_of(key: &str) -> Option<&str> {
    key.strip_prefix(SITE_PREFIX)
}
/// One design revision of a site (immutable).
pub fn design_revision(site: &str, revision: u64) -> String {
    format!("design.{site}.{revision}")
}
/// The latest design revision of a site (a copy of its record).
pub fn design_latest(site: &str) -> String {
    format!("design.{site}.latest")
}
pub fn package(name: &str, version: &str) -> String {
    // KV keys allow [-/_=.a-zA-Z0-9]; versions such as 1.29.1+k3s1 need escaping.
    format!("{PACKAGE_PREFIX}{}.{}", escape(name), escape(version))
}
/// A site's enrolled identity (`landfall-identity`).
pub fn identity_site(site: &str) -> String {
    format!("site.{site}")
}
/// Every site identity's key starts with this.
pub const IDENTITY_SITE_PREFIX: &str = "site.";
/// A gateway's request to join, by its identity key (`landfall-identity`).
pub fn enrollment(key: &str) -> String {
    format!("enroll.{key}")
}
/// Every enrollment's key starts with this.
pub const ENROLLMENT_PREFIX: &str = "enroll.";
/// The ledger's record of a command (`landfall-ledger`).
pub fn command(command_id: &str) -> String {
    format!("cmd.{command_id}")
}
/// How far the commands of one scope are settled, in stream order (`landfall-ledger`): the
/// last sequence up to which every command of the scope is in the ledger.
pub fn scope_order(scope: &str) -> String {
    format!("order.{scope}")
}
pub fn saga(saga_id: &str) -> String {
    format!("saga.{saga_id}")
}
/// A node removal or reprovision, or a site decommission, by its command's id.
/// A command the API holds for a second person, by its id.
pub fn held(id: &str) -> String {
    format!("approval.{id}")
}
pub fn lifecycle(id: &str) -> String {
    format!("{LIFECYCLE_PREFIX}{id}")
}
/// Every lifecycle record's key starts with this.
pub const LIFECYCLE_PREFIX: &str = "lifecycle.";
/// What is kept of a decommissioned site (in landfall-sites).
pub fn site_archive(site: &str) -> String {
    format!("{ARCHIVE_PREFIX}{site}")
}
/// Every decommissioned site's archive key starts with this.
pub const ARCHIVE_PREFIX: &str = "archive.";
pub fn site_lease(site: &str) -> String {
    format!("lease.{site}")
}
pub fn latest_install(site: &str) -> String {
    format!("latest.{site}")
}
/// The saga that last brought one node into its site's cluster after the install (a node
/// added, or reprovisioned), so a reader of one site finds every node's latest work
/// without scanning the fleet's sagas (`landfall-sagas`).
pub fn latest_join(site: &str, node: &str) -> String {
    format!("{JOIN_PREFIX}{site}.{node}")
}
/// Every node's latest join of one site.
pub fn site_joins_prefix(site: &str) -> String {
    format!("{JOIN_PREFIX}{site}.")
}
/// Every latest-join key starts with this.
pub const JOIN_PREFIX: &str = "joined.";
pub fn kubeconfig(site: &str) -> String {
    format!("kubeconfig.{site}")
}
/// Every sealed kubeconfig (`landfall-kubeconfigs`).
pub const KUBECONFIG_PREFIX: &str = "kubeconfig.";
/// A host's sealed BMC credentials (`landfall-kubeconfigs`, the bucket of sealed secrets).
pub fn bmc_credentials(site: &str, node: &str) -> String {
    format!("{BMC_PREFIX}{site}.{node}")
}
/// Every sealed BMC credential.
pub const BMC_PREFIX: &str = "bmc.";
/// Where the distribution service announces the artifact store it reads
/// (`landfall-packages`; the URL without credentials).
pub const ARTIFACT_STORE: &str = "artifact-store";

/// A site's render of a helm-chart package version from one set of inputs (chart, values,
/// helm, cluster: their digest) (`landfall-packages`): what the distribution service made
/// for it, and the only renders of that chart it serves the site. Never overwritten.
pub fn chart_render(site: &str, name: &str, version: &str, inputs_digest: &str) -> String {
    format!("{RENDER_PREFIX}{site}.{}.{}.{}", escape(name), escape(version), escape(inputs_digest))
}
/// Every render of one site.
pub fn site_renders_prefix(site: &str) -> String {
    format!("{RENDER_PREFIX}{site}.")
}
/// Every render key starts with this.
pub const RENDER_PREFIX: &str = "render.";

/// Every observed-package key starts with this (`landfall-observed`).
pub const OBSERVED_PREFIX: &str = "node.";
/// What one node runs of one package, as observed (`landfall-observed`).
pub fn observed(site: &str, node: &str, package: &str) -> String {
    format!("{OBSERVED_PREFIX}{site}.{node}.{}", escape(package))
}
/// Every observed package of one site.
pub fn observed_site_prefix(site: &str) -> String {
    format!("{OBSERVED_PREFIX}{site}.")
}
/// Every observed package of one node.
pub fn observed_node_prefix(site: &str, node: &str) -> String {
    format!("{OBSERVED_PREFIX}{site}.{node}.")
}
/// A key pattern matching one package on every node of every site.
pub fn observed_package_everywhere(package: &str) -> String {
    format!("{OBSERVED_PREFIX}*.*.{}", escape(package))
}

/// Every package policy key starts with this (`landfall-packages`).
pub const POLICY_PREFIX: &str = "policy.";
/// A package name's auto-rollout policy (`landfall-packages`).
pub fn policy(name: &str) -> String {
    format!("{POLICY_PREFIX}{}", escape(name))
}

/// One design revision's key prefix of a site: `design.<site>.`.
pub fn design_revisions_prefix(site: &str) -> String {
    format!("design.{site}.")
}

/// What is kept of an install or join saga once compacted (`landfall-sagas`).
pub fn saga_summary(saga_id: &str) -> String {
    format!("{SAGA_SUMMARY_PREFIX}{saga_id}")
}
/// Every saga summary.
pub const SAGA_SUMMARY_PREFIX: &str = "summary.saga.";
/// What is kept of a rollout once compacted (`landfall-sagas`).
pub fn rollout_summary(rollout_id: &str) -> String {
    format!("{ROLLOUT_SUMMARY_PREFIX}{rollout_id}")
}
/// Every rollout summary.
pub const ROLLOUT_SUMMARY_PREFIX: &str = "summary.rollout.";
/// The index of sagas under way: one key per saga that has not ended (`landfall-sagas`).
pub fn active_saga(saga_id: &str) -> String {
    format!("{ACTIVE_SAGA_PREFIX}{saga_id}")
}
pub const ACTIVE_SAGA_PREFIX: &str = "active.saga.";
/// The index of rollouts under way (`landfall-sagas`).
pub fn active_rollout(rollout_id: &str) -> String {
    format!("{ACTIVE_ROLLOUT_PREFIX}{rollout_id}")
}
pub const ACTIVE_ROLLOUT_PREFIX: &str = "active.rollout.";
/// Every key of one rollout but its state: plan chunks and site records.
pub fn rollout_parts_prefix(id: &str) -> String {
    format!("{ROLLOUT_PREFIX}{id}.")
}

/// A node that left its site (`landfall-observed`): late reports of it are not written.
pub fn node_departed(site: &str, node: &str) -> String {
    format!("{DEPARTED_PREFIX}{site}.{node}")
}
/// Every departed node.
pub const DEPARTED_PREFIX: &str = "left.";
/// Whether the hub hears a site (`landfall-observed`).
pub fn link(site: &str) -> String {
    format!("{LINK_PREFIX}{site}")
}
/// Every site's link.
pub const LINK_PREFIX: &str = "link.";
/// Every departed node of one site.
pub fn departed_site_prefix(site: &str) -> String {
    format!("{DEPARTED_PREFIX}{site}.")
}

/// Every rollout key starts with this (`landfall-sagas`).
pub const ROLLOUT_PREFIX: &str = "rollout.";
/// A rollout's state.
pub fn rollout(id: &str) -> String {
    format!("{ROLLOUT_PREFIX}{id}")
}
/// A key pattern matching every rollout's state (not its plan or site keys).
pub fn every_rollout() -> String {
    format!("{ROLLOUT_PREFIX}*")
}
/// The rollout id of a [`rollout`] key (not of its plan or site keys).
pub fn rollout_of(key: &str) -> Option<&str> {
    key.strip_prefix(ROLLOUT_PREFIX).filter(|rest| !rest.contains('.'))
}
/// One immutable slice of a rollout's plan.
pub fn rollout_plan(id: &str, chunk: u32) -> String {
    format!("{ROLLOUT_PREFIX}{id}.plan.{chunk}")
}
/// One site's part of a rollout.
pub fn rollout_site(id: &str, site: &str) -> String {
    format!("{ROLLOUT_PREFIX}{id}.site.{site}")
}
/// Every site record of a rollout.
pub fn rollout_sites_prefix(id: &str) -> String {
    format!("{ROLLOUT_PREFIX}{id}.site.")
}

fn escape(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '_' => c.to_string(),
            other => format!("={:02x}", other as u32),
        })
        .collect()
}
