//! The protobuf types of `landfall.v1`, and what each message is on the bus.

#![allow(clippy::all, missing_docs)]

include!(concat!(env!("OUT_DIR"), "/landfall.v1.rs"));

use crate::names;

/// A protobuf message that travels on the bus.
pub trait BusMessage: prost::Message + Default + Clone + serde::Serialize + Send + Sync + 'static {
    /// The protobuf full name, carried in the `Landfall-Type` header.
    const TYPE: &'static str;
}

/// A command: `landfall.cmd.<KIND>.<scope>`.
pub trait BusCommand: BusMessage {
    const KIND: &'static str;
    /// The site the command is about, or [`names::FLEET`].
    fn scope(&self) -> &str;
    fn subject(&self) -> String {
        names::command_subject(Self::KIND, self.scope())
    }
}

/// A job for one site's gateway: `landfall.job.<site>.<KIND>`.
pub trait BusJob: BusMessage {
    const KIND: &'static str;
    fn site(&self) -> &str;
    fn subject(&self) -> String {
        names::job_subject(self.site(), Self::KIND)
    }
}

/// An event: `landfall.evt.<scope>.<AGGREGATE>.<KIND>`.
pub trait BusEvent: BusMessage {
    const AGGREGATE: &'static str;
    const KIND: &'static str;
    fn scope(&self) -> &str;
    fn subject(&self) -> String {
        names::event_subject(self.scope(), Self::AGGREGATE, Self::KIND)
    }
    /// The subject filter matching this event at every site.
    fn filter() -> String {
        names::events_of_kind(Self::AGGREGATE, Self::KIND)
    }
}

macro_rules! bus_message {
    ($($ty:ident),* $(,)?) => {
        $(impl BusMessage for $ty { const TYPE: &'static str = concat!("landfall.v1.", stringify!($ty)); })*

        /// Decodes a payload of the named type into JSON, for people and dashboards.
        /// `None` when the type is not one of ours.
        pub fn decode_to_json(type_name: &str, payload: &[u8]) -> Option<Result<serde_json::Value, prost::DecodeError>> {
            match type_name {
                $(<$ty as BusMessage>::TYPE => Some(
                    <$ty as prost::Message>::decode(payload)
                        .map(|m| serde_json::to_value(&m).unwrap_or(serde_json::Value::Null)),
                ),)*
                _ => None,
            }
        }
    };
}

bus_message!(
    RegisterSite,
    InstallSite,
    NodeAdded,
    NodeRemoved,
    RegisterPackage,
    PatchPackage,
    PauseRollout,
    ResumeRollout,
    CancelRollout,
    ApplyDesign,
    StageArtifacts,
    ProvisionOs,
    InstallBinaries,
    ApplyContainerPackages,
    PatchNodes,
    KubeconfigRequest,
    SimulateHostArrival,
    StageSite,
    ArtifactPlanRequest,
    ArtifactPlan,
    ChunkRequest,
    BmcCredentialsRequest,
    KubeconfigGet,
    PutBmcCredentials,
    SecretStored,
    RotateKey,
    KeyRotated,
    BmcCredentialsStored,
    SecretKeyRotated,
    SiteRegistered,
    DesignApplied,
    DesignRevision,
    PackageRegistered,
    SiteInstallStarted,
    ArtifactsStaged,
    NodeOsProvisioning,
    NodeOsProvisioned,
    NodeBinariesInstalled,
    NodeFailed,
    ClusterReady,
    KubeconfigStored,
    ContainerPackagesApplied,
    JobFailed,
    SiteInstalled,
    SiteInstallFailed,
    NodeAccepted,
    NodeLeft,
    NodeReady,
    NodeJoinFailed,
    RolloutPlanned,
    RolloutWaveStarted,
    NodePatched,
    NodePatchFailed,
    SitePatched,
    RolloutProgress,
    RolloutHalted,
    RolloutPaused,
    RolloutResumed,
    RolloutCancelled,
    RolloutCompleted,
    CommandRejected,
    MessageRejected,
    InstallSaga,
    SiteLease,
    SealedSecret,
    NodeObserved,
    ObservedVersion,
    PackagePolicy,
    Rollout,
    RolloutPlanChunk,
    RolloutSite,
    ArtifactStoreInfo,
);

macro_rules! command {
    ($ty:ident, $kind:literal, |$m:ident| $scope:expr) => {
        impl BusCommand for $ty {
            const KIND: &'static str = $kind;
            fn scope(&self) -> &str {
                let $m = self;
                $scope
            }
        }
    };
}

command!(RegisterSite, "register_site", |m| m.design.as_ref().map_or("", |d| d.site_id.as_str()));
command!(InstallSite, "install_site", |m| &m.site_id);
command!(ApplyDesign, "apply_design", |m| &m.site_id);
command!(NodeAdded, "node_added", |m| &m.site_id);
command!(NodeRemoved, "node_removed", |m| &m.site_id);
command!(StageSite, "stage_site", |m| &m.site_id);
command!(RegisterPackage, "register_package", |_m| names::FLEET);
command!(PatchPackage, "patch_package", |_m| names::FLEET);
command!(PauseRollout, "pause_rollout", |_m| names::FLEET);
command!(ResumeRollout, "resume_rollout", |_m| names::FLEET);
command!(CancelRollout, "cancel_rollout", |_m| names::FLEET);

macro_rules! job {
    ($($ty:ident => $kind:literal),* $(,)?) => {
        $(impl BusJob for $ty {
            const KIND: &'static str = $kind;
            fn site(&self) -> &str { &self.site_id }
        })*
    };
}

job!(
    StageArtifacts => "stage_artifacts",
    ProvisionOs => "provision_os",
    InstallBinaries => "install_binaries",
    ApplyContainerPackages => "apply_container_packages",
    PatchNodes => "patch_nodes",
);

macro_rules! event {
    ($($ty:ident => $agg:literal . $kind:literal),* $(,)?) => {
        $(impl BusEvent for $ty {
            const AGGREGATE: &'static str = $agg;
            const KIND: &'static str = $kind;
            fn scope(&self) -> &str { &self.site_id }
        })*
    };
}

event!(
    SiteRegistered => "site"."registered",
    DesignApplied => "site"."design_applied",
    SiteInstallStarted => "site"."install_started",
    ArtifactsStaged => "site"."artifacts_staged",
    NodeOsProvisioning => "node"."os_provisioning",
    NodeOsProvisioned => "node"."os_provisioned",
    NodeBinariesInstalled => "node"."binaries_installed",
    NodeFailed => "node"."failed",
    ClusterReady => "cluster"."ready",
    KubeconfigStored => "cluster"."kubeconfig_stored",
    ContainerPackagesApplied => "site"."container_packages_applied",
    JobFailed => "job"."failed",
    SiteInstalled => "site"."installed",
    SiteInstallFailed => "site"."install_failed",
    NodeAccepted => "node"."accepted",
    NodeLeft => "node"."left",
    NodeReady => "node"."ready",
    NodeJoinFailed => "node"."join_failed",
    NodePatched => "node"."patched",
    NodePatchFailed => "node"."patch_failed",
    SitePatched => "rollout"."site_patched",
    BmcCredentialsStored => "node"."bmc_credentials_stored",
);

macro_rules! fleet_event {
    ($($ty:ident => $agg:literal . $kind:literal),* $(,)?) => {
        $(impl BusEvent for $ty {
            const AGGREGATE: &'static str = $agg;
            const KIND: &'static str = $kind;
            fn scope(&self) -> &str { names::FLEET }
        })*
    };
}

fleet_event!(
    PackageRegistered => "package"."registered",
    RolloutPlanned => "rollout"."planned",
    RolloutWaveStarted => "rollout"."wave_started",
    RolloutProgress => "rollout"."progress",
    RolloutHalted => "rollout"."halted",
    RolloutPaused => "rollout"."paused",
    RolloutResumed => "rollout"."resumed",
    RolloutCancelled => "rollout"."cancelled",
    RolloutCompleted => "rollout"."completed",
    SecretKeyRotated => "secrets"."key_rotated",
);

/// Rejections are published in the scope of the subject they answer; see
/// [`crate::names::parse_subject`]. The `scope` here is filled in by the publisher.
pub mod rejection {
    pub const COMMAND_AGGREGATE: &str = "command";
    pub const MESSAGE_AGGREGATE: &str = "message";
    pub const KIND: &str = "rejected";
}

impl Role {
    pub fn label(self) -> &'static str {
        match self {
            Role::Unspecified => "unspecified",
            Role::Master => "master",
            Role::Worker => "worker",
        }
    }
}

impl PackageKind {
    pub fn label(self) -> &'static str {
        match self {
            PackageKind::Unspecified => "unspecified",
            PackageKind::OsImage => "os-image",
            PackageKind::Binary => "binary",
            PackageKind::Container => "container",
        }
    }
}

/// Serializers that print enum fields by name in JSON output.
pub(crate) mod json {
    use super::*;

    fn by_name<S: serde::Serializer, E: TryFrom<i32>>(
        value: &i32,
        s: S,
        name: impl Fn(E) -> &'static str,
    ) -> Result<S::Ok, S::Error> {
        match E::try_from(*value) {
            Ok(e) => s.serialize_str(name(e)),
            Err(_) => s.serialize_i32(*value),
        }
    }

    macro_rules! named {
        ($($fn:ident: $ty:ty),* $(,)?) => {
            $(pub fn $fn<S: serde::Serializer>(v: &i32, s: S) -> Result<S::Ok, S::Error> {
                by_name::<S, $ty>(v, s, |e| e.as_str_name())
            })*
        };
    }

    named!(
        node_outcome: NodeOutcome,
        install_outcome: InstallOutcome,
        install_phase: InstallPhase,
        node_step: NodeStep,
        reject_code: RejectCode,
        wave_timeout_action: WaveTimeoutAction,
        rollout_phase: RolloutPhase,
        rollout_site_state: RolloutSiteState,
        lease_holder: LeaseHolder,
    );

    pub fn role<S: serde::Serializer>(v: &i32, s: S) -> Result<S::Ok, S::Error> {
        by_name::<S, Role>(v, s, Role::label)
    }

    pub fn package_kind<S: serde::Serializer>(v: &i32, s: S) -> Result<S::Ok, S::Error> {
        by_name::<S, PackageKind>(v, s, PackageKind::label)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_and_types() {
        let cmd = InstallSite { site_id: "edge-1".into(), ..Default::default() };
        assert_eq!(cmd.subject(), "landfall.cmd.install_site.edge-1");
        assert_eq!(InstallSite::TYPE, "landfall.v1.InstallSite");
        let evt = NodeOsProvisioned { site_id: "edge-1".into(), node: "n1".into(), image: String::new() };
        assert_eq!(evt.subject(), "landfall.evt.edge-1.node.os_provisioned");
        assert_eq!(NodeOsProvisioned::filter(), "landfall.evt.*.node.os_provisioned");
        let job = ProvisionOs { site_id: "edge-1".into(), ..Default::default() };
        assert_eq!(job.subject(), "landfall.job.edge-1.provision_os");
    }

    #[test]
    fn json_names_enums() {
        let r = NodeResult {
            node: "n1".into(),
            role: Role::Master as i32,
            outcome: NodeOutcome::Failed as i32,
            ..Default::default()
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["role"], "master");
        assert_eq!(v["outcome"], "NODE_OUTCOME_FAILED");
        let bytes = prost::Message::encode_to_vec(&r);
        assert!(decode_to_json("landfall.v1.NodeResult", &bytes).is_none(), "not a bus message");
        let bytes = prost::Message::encode_to_vec(&InstallSite { site_id: "x".into(), ..Default::default() });
        assert_eq!(decode_to_json(InstallSite::TYPE, &bytes).unwrap().unwrap()["site_id"], "x");
    }
}
