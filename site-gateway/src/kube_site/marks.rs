//! The names the gateway writes on the site's objects: the field manager of its server-side
//! applies, the annotations, labels and finalizer it puts on hosts, Nodes and Secrets, and the
//! names of the Secrets it writes for a host.

use serde_json::{Value, json};

/// The one field manager every server-side apply of the gateway uses: the fields it sets are
/// its own, and it never forces fields another manager owns.
pub const FIELD_MANAGER: &str = "landfall-gateway";

/// On a host the gateway created for a node of the site's design: the node's name.
pub const NODE: &str = "landfall.io/node";
/// On a host the gateway announced (`NodeAdded`): the command's id.
pub const ANNOUNCED: &str = "landfall.io/announced";
/// Keeps a known host until the gateway has announced its removal (`NodeRemoved`).
pub const FINALIZER: &str = "landfall.io/node-removal";
/// On a host the gateway deletes itself (`landfall node remove`, a site's decommission), written
/// before the delete: the host watch lets it go without announcing a departure, since the
/// command that removes the node says so already.
pub const RETIRED: &str = "landfall.io/retired";
/// On every Secret the gateway writes, what it holds (`bmc-credentials`, `user-data`,
/// `network-data`): how a site's decommission finds the Secrets that are landfall's to delete.
pub const PURPOSE_LABEL: &str = "landfall.io/purpose";
/// On a Node of the application cluster that the gateway made unschedulable for a patch: it
/// makes it schedulable again, and never lifts a cordon without it.
pub const CORDONED: &str = "landfall.io/cordoned";
/// On the Job that installs a binary on one node: the node.
pub const UPGRADE_LABEL: &str = "landfall.io/upgrade";
/// On that Job: the package and the version it installs.
pub const UPGRADE_PACKAGE: &str = "landfall.io/package";
pub const UPGRADE_VERSION: &str = "landfall.io/version";
/// The node's role for a host that arrives: `master` or `worker` (the default).
pub const ROLE_LABEL: &str = "landfall.io/role";
/// What a node runs, one annotation per package: `landfall.io/pkg.<name>: <version>`.
pub fn package(name: &str) -> String {
    format!("landfall.io/pkg.{name}")
}

/// The Secret of a host's BMC credentials, for a host the gateway creates.
pub fn bmc_secret(host: &str) -> String {
    format!("{host}-bmc-secret")
}

/// The Secret of a host's user data, when the gateway generates it.
pub fn user_data_secret(host: &str) -> String {
    format!("{host}-user-data")
}

/// The Secret of a host's network data (`networkData`), for a node whose design has a network.
pub fn network_data_secret(host: &str) -> String {
    format!("{host}-network-data")
}

/// Adds the gateway's finalizer to an intent's `metadata.finalizers` (a set).
pub(super) fn add_finalizer(intent: &mut Value) {
    let list = &mut intent["metadata"]["finalizers"];
    if !list.is_array() {
        *list = json!([]);
    }
    if let Some(items) = list.as_array_mut()
        && !items.iter().any(|f| f == FINALIZER)
    {
        items.push(json!(FINALIZER));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_finalizer_is_added_once_beside_others() {
        let mut intent = json!({"metadata": {"finalizers": ["x"]}});
        add_finalizer(&mut intent);
        add_finalizer(&mut intent);
        assert_eq!(intent["metadata"]["finalizers"], json!(["x", FINALIZER]));
        let mut bare = json!({"metadata": {}});
        add_finalizer(&mut bare);
        assert_eq!(bare["metadata"]["finalizers"], json!([FINALIZER]));
    }
}
