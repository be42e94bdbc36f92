//! The protobuf types of `landfall.v1`, and what each message is on the bus.

#![allow(clippy::all, missing_docs)]

include!(concat!(env!("OUT_DIR"), "/landfall.v1.rs"));

use crate::names;

/// A protobuf message that travels on the bus.
pub trait BusMessage: prost::Message + Default + Clone + serde::Serialize + Send + Sync + 'static {
    /// The protobuf full name, carried in the `Landfall-Type` header.
    const TYPE: &'static str;
}

/// A command: `landfall.cmd.<scope>.<origin>.<KIND>`.
pub trait BusCommand: BusMessage {
    const KIND: &'static str;
    /// The site the command is about, or [`names::FLEET`].
    fn scope(&self) -> &str;
    /// Its subject as the hub sends it.
    fn subject(&self) -> String {
        self.subject_from(names::Origin::Hub)
    }
    fn subject_from(&self, origin: names::Origin) -> String {
        names::command_subject_from(origin, Self::KIND, self.scope())
    }
}

/// A job for one site's gateway: `landfall.job.<site>.<shard>.<KIND>` ([`names::job_subject`]).
pub trait BusJob: BusMessage {
    const KIND: &'static str;
    fn site(&self) -> &str;
    fn subject(&self) -> String {
        names::job_subject(self.site(), Self::KIND)
    }
}

/// An event: `landfall.evt.<scope>.<origin>.<AGGREGATE>.<KIND>`.
pub trait BusEvent: BusMessage {
    const AGGREGATE: &'static str;
    const KIND: &'static str;
    fn scope(&self) -> &str;
    /// Its subject as the hub sends it.
    fn subject(&self) -> String {
        self.subject_from(names::Origin::Hub)
    }
    fn subject_from(&self, origin: names::Origin) -> String {
        names::event_subject_from(origin, self.scope(), Self::AGGREGATE, Self::KIND)
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
    ApprovalRequested,
    CommandApproved,
    ApprovalRefused,
    HeldCommand,
    RegisterSite,
    InstallSite,
    NodeAdded,
    NodeRemoved,
    RemoveSite,
    RemoveNode,
    ReprovisionNode,
    DecommissionSite,
    RetireNode,
    TearDownSite,
    NodeRetired,
    SiteTornDown,
    SiteDecommissioned,
    LifecycleFailed,
    Lifecycle,
    SiteArchive,
    RegisterPackage,
    PatchPackage,
    PauseRollout,
    ResumeRollout,
    CancelRollout,
    RollbackRollout,
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
    ChartRenderRequest,
    ChartRenderReply,
    KubeconfigGet,
    PutBmcCredentials,
    SecretStored,
    RotateKey,
    KeyRotated,
    BmcCredentialsStored,
    SecretKeyRotated,
    StoreFull,
    StoreRoomAgain,
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
    SiteRemoved,
    NodeReady,
    NodeJoinFailed,
    RolloutPlanned,
    RolloutWaveStarted,
    NodeCordoned,
    NodeDrained,
    NodeUncordoned,
    NodePatched,
    NodePatchFailed,
    NodeRolledBack,
    NodeRollbackFailed,
    SitePatched,
    RolloutProgress,
    RolloutHalted,
    RolloutPaused,
    RolloutResumed,
    RolloutCancelled,
    RolloutCompleted,
    CommandRejected,
    MessageRejected,
    MessageDeadLettered,
    DeadLetter,
    ScopeOrder,
    InstallSaga,
    CommandRecord,
    SiteLease,
    SealedSecret,
    NodeObserved,
    ObservedVersion,
    PackagePolicy,
    Rollout,
    RolloutPlanChunk,
    RolloutSite,
    ArtifactStoreInfo,
    SagaSummary,
    RolloutSummary,
    ActiveEntry,
    NodeDeparted,
    SiteAlive,
    SiteLink,
    SiteCutOff,
    SiteLinkRestored,
    SiteDisagrees,
    ChartDrifted,
    DriftCheck,
    DriftReport,
);

macro_rules! commands {
    ($($ty:ident => $kind:literal, |$m:ident| $scope:expr;)*) => {
        $(impl BusCommand for $ty {
            const KIND: &'static str = $kind;
            fn scope(&self) -> &str {
                let $m = self;
                $scope
            }
        })*

        /// Every command: its subject kind and its protobuf type.
        pub const COMMAND_TYPES: &[(&str, &str)] = &[$(($kind, <$ty as BusMessage>::TYPE)),*];
    };
}

commands!(
    RegisterSite => "register_site", |m| m.design.as_ref().map_or("", |d| d.site_id.as_str());
    InstallSite => "install_site", |m| &m.site_id;
    ApplyDesign => "apply_design", |m| &m.site_id;
    NodeAdded => "node_added", |m| &m.site_id;
    NodeRemoved => "node_removed", |m| &m.site_id;
    RemoveSite => "remove_site", |m| &m.site_id;
    RemoveNode => "remove_node", |m| &m.site_id;
    ReprovisionNode => "reprovision_node", |m| &m.site_id;
    DecommissionSite => "decommission_site", |m| &m.site_id;
    StageSite => "stage_site", |m| &m.site_id;
    RegisterPackage => "register_package", |_m| names::FLEET;
    PatchPackage => "patch_package", |_m| names::FLEET;
    PauseRollout => "pause_rollout", |_m| names::FLEET;
    ResumeRollout => "resume_rollout", |_m| names::FLEET;
    CancelRollout => "cancel_rollout", |_m| names::FLEET;
    RollbackRollout => "rollback_rollout", |_m| names::FLEET;
);

macro_rules! job {
    ($($ty:ident => $kind:literal),* $(,)?) => {
        $(impl BusJob for $ty {
            const KIND: &'static str = $kind;
            fn site(&self) -> &str { &self.site_id }
        })*

        /// Every job: its subject kind and its protobuf type.
        pub const JOB_TYPES: &[(&str, &str)] = &[$(($kind, <$ty as BusMessage>::TYPE)),*];
    };
}

job!(
    StageArtifacts => "stage_artifacts",
    ProvisionOs => "provision_os",
    InstallBinaries => "install_binaries",
    ApplyContainerPackages => "apply_container_packages",
    PatchNodes => "patch_nodes",
    RetireNode => "retire_node",
    TearDownSite => "tear_down_site",
);

/// An event type as its subject and `Landfall-Type` header name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventType {
    /// The protobuf full name, e.g. `landfall.v1.SiteInstalled`.
    pub type_name: &'static str,
    pub aggregate: &'static str,
    pub kind: &'static str,
    /// Published in the fleet scope rather than a site's.
    pub fleet: bool,
}

impl EventType {
    /// The message name alone, e.g. `SiteInstalled`.
    pub fn short_name(&self) -> &'static str {
        self.type_name.rsplit('.').next().unwrap_or(self.type_name)
    }

    /// The type `name` stands for: a full or short message name (`SiteInstalled`), or
    /// `<aggregate>.<kind>` as in subjects (`site.installed`).
    pub fn find(name: &str) -> Option<&'static EventType> {
        EVENT_TYPES.iter().find(|t| {
            t.type_name == name
                || t.short_name() == name
                || name.split_once('.').is_some_and(|(a, k)| a == t.aggregate && k == t.kind)
        })
    }
}

macro_rules! event {
    ($($ty:ident => $agg:literal . $kind:literal),* $(,)?) => {
        $(impl BusEvent for $ty {
            const AGGREGATE: &'static str = $agg;
            const KIND: &'static str = $kind;
            fn scope(&self) -> &str { &self.site_id }
        })*
        const SITE_EVENT_TYPES: &[EventType] = &[$(EventType {
            type_name: <$ty as BusMessage>::TYPE, aggregate: $agg, kind: $kind, fleet: false,
        }),*];
    };
}

event!(
    SiteRegistered => "site"."registered",
    ApprovalRequested => "approval"."requested",
    CommandApproved => "approval"."approved",
    ApprovalRefused => "approval"."refused",
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
    SiteRemoved => "site"."removed",
    NodeReady => "node"."ready",
    NodeJoinFailed => "node"."join_failed",
    NodeRetired => "node"."retired",
    SiteTornDown => "site"."torn_down",
    SiteDecommissioned => "site"."decommissioned",
    LifecycleFailed => "site"."lifecycle_failed",
    NodeCordoned => "node"."cordoned",
    NodeDrained => "node"."drained",
    NodeUncordoned => "node"."uncordoned",
    NodePatched => "node"."patched",
    NodePatchFailed => "node"."patch_failed",
    NodeRolledBack => "node"."rolled_back",
    NodeRollbackFailed => "node"."rollback_failed",
    SitePatched => "rollout"."site_patched",
    SiteDisagrees => "site"."disagrees",
    ChartDrifted => "site"."chart_drifted",
    BmcCredentialsStored => "node"."bmc_credentials_stored",
    SiteCutOff => "link"."cut_off",
    SiteLinkRestored => "link"."restored",
);

macro_rules! fleet_event {
    ($($ty:ident => $agg:literal . $kind:literal),* $(,)?) => {
        $(impl BusEvent for $ty {
            const AGGREGATE: &'static str = $agg;
            const KIND: &'static str = $kind;
            fn scope(&self) -> &str { names::FLEET }
        })*
        const FLEET_EVENT_TYPES: &[EventType] = &[$(EventType {
            type_name: <$ty as BusMessage>::TYPE, aggregate: $agg, kind: $kind, fleet: true,
        }),*];
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
    StoreFull => "store"."full",
    StoreRoomAgain => "store"."room_again",
);

/// Every event type: site events, fleet events, then the two rejections and the dead letter's
/// notice (published in the scope of what they answer).
pub static EVENT_TYPES: std::sync::LazyLock<Vec<EventType>> = std::sync::LazyLock::new(|| {
    let rejections = [
        (<CommandRejected as BusMessage>::TYPE, rejection::COMMAND_AGGREGATE, rejection::KIND),
        (<MessageRejected as BusMessage>::TYPE, rejection::MESSAGE_AGGREGATE, rejection::KIND),
        (<MessageDeadLettered as BusMessage>::TYPE, rejection::MESSAGE_AGGREGATE, rejection::DEAD_LETTERED_KIND),
    ]
    .map(|(type_name, aggregate, kind)| EventType { type_name, aggregate, kind, fleet: false });
    SITE_EVENT_TYPES.iter().chain(FLEET_EVENT_TYPES).copied().chain(rejections).collect()
});

/// Rejections are published in the scope of the subject they answer; see
/// [`crate::names::parse_subject`]. The `scope` here is filled in by the publisher.
pub mod rejection {
    pub const COMMAND_AGGREGATE: &str = "command";
    pub const MESSAGE_AGGREGATE: &str = "message";
    pub const KIND: &str = "rejected";
    /// `MessageDeadLettered`: `landfall.evt.<scope>.message.dead_lettered`.
    pub const DEAD_LETTERED_KIND: &str = "dead_lettered";

    /// Whether an event kind is published in the scope of the message it answers (a site's, or
    /// the fleet's), rather than always in the fleet's.
    pub fn in_answered_scope(kind: &str) -> bool {
        kind == KIND || kind == DEAD_LETTERED_KIND
    }
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
            PackageKind::HelmChart => "helm-chart",
        }
    }
}

impl ClusterBuilder {
    pub fn label(self) -> &'static str {
        match self {
            ClusterBuilder::Unspecified => "unspecified",
            ClusterBuilder::Bpa => "bpa",
            ClusterBuilder::Capi => "capi",
        }
    }
}

/// Enum fields in JSON: written by name, read by name (or by number).
///
/// Every enum field of every message uses these (the build script attaches them), so the JSON
/// of a message maps one-to-one onto it: `"role": "master"`, `"outcome": "NODE_OUTCOME_FAILED"`.
pub mod json {
    use super::*;
    use serde::de::{self, Visitor};

    /// A protobuf enum as JSON names it.
    pub trait Named: Copy + Into<i32> + TryFrom<i32> + 'static {
        /// The name JSON writes.
        fn json_name(self) -> &'static str;
        /// The name in the .proto file, e.g. `ROLE_MASTER`.
        fn proto_name(self) -> &'static str;

        /// Every value, in number order (the numbers of landfall enums are small).
        fn values() -> impl Iterator<Item = Self> {
            (0..=255).filter_map(|n| Self::try_from(n).ok())
        }

        /// Reads a name: the JSON name, the .proto name, or the .proto name without the enum's
        /// prefix, in any case, `-` standing for `_` (`master`, `ROLE_MASTER`, `os-image`).
        fn from_name(name: &str) -> Option<Self> {
            let wanted = name.trim().to_ascii_uppercase().replace('-', "_");
            let unspecified = Self::values().next().map_or("", |v| v.proto_name());
            let prefix = unspecified.trim_end_matches("UNSPECIFIED");
            Self::values().find(|v| {
                v.json_name().eq_ignore_ascii_case(name.trim())
                    || v.proto_name() == wanted
                    || v.proto_name().strip_prefix(prefix) == Some(wanted.as_str())
            })
        }
    }

    macro_rules! named {
        ($($ty:ident => $name:ident),* $(,)?) => {
            $(impl Named for $ty {
                fn json_name(self) -> &'static str {
                    self.$name()
                }
                fn proto_name(self) -> &'static str {
                    self.as_str_name()
                }
            })*

            /// The names JSON writes for the values of the enum called `enum_name` in the
            /// .proto files (`Role` → `unspecified, master, worker`); empty for another name.
            pub fn json_names(enum_name: &str) -> Vec<&'static str> {
                match enum_name {
                    $(stringify!($ty) => $ty::values().map(Named::json_name).collect(),)*
                    _ => Vec::new(),
                }
            }
        };
    }

    named!(
        Role => label,
        PackageKind => label,
        NodeOutcome => as_str_name,
        InstallOutcome => as_str_name,
        InstallPhase => as_str_name,
        NodeStep => as_str_name,
        RejectCode => as_str_name,
        WaveTimeoutAction => as_str_name,
        ApprovalGate => as_str_name,
        OnNodeFailure => as_str_name,
        RolloutPhase => as_str_name,
        RolloutSiteState => as_str_name,
        LeaseHolder => as_str_name,
        LifecycleKind => as_str_name,
        CleaningMode => as_str_name,
        LifecyclePhase => as_str_name,
        LinkState => as_str_name,
        ClusterBuilder => label,
        EnrollmentState => as_str_name,
        ApprovalState => as_str_name,
    );

    /// Writes an enum field by name (a number no value has, as the number).
    pub fn ser<E: Named, S: serde::Serializer>(value: &i32, s: S) -> Result<S::Ok, S::Error> {
        match E::try_from(*value) {
            Ok(e) => s.serialize_str(e.json_name()),
            Err(_) => s.serialize_i32(*value),
        }
    }

    /// Reads an enum field from a name [`Named::from_name`] knows, or from a value's number.
    pub fn de<'de, E: Named, D: serde::Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
        struct ByName<E>(std::marker::PhantomData<E>);
        impl<E: Named> ByName<E> {
            fn names() -> String {
                E::values().map(|v| v.json_name()).collect::<Vec<_>>().join(", ")
            }
        }
        impl<E: Named> Visitor<'_> for ByName<E> {
            type Value = i32;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "one of {}", Self::names())
            }
            fn visit_str<Er: de::Error>(self, v: &str) -> Result<i32, Er> {
                E::from_name(v)
                    .map(Into::into)
                    .ok_or_else(|| Er::custom(format!("unknown value {v:?}, expected one of {}", Self::names())))
            }
            fn visit_i64<Er: de::Error>(self, v: i64) -> Result<i32, Er> {
                i32::try_from(v)
                    .ok()
                    .filter(|n| E::try_from(*n).is_ok())
                    .ok_or_else(|| Er::custom(format!("unknown value {v}, expected one of {}", Self::names())))
            }
            fn visit_u64<Er: de::Error>(self, v: u64) -> Result<i32, Er> {
                self.visit_i64(i64::try_from(v).unwrap_or(i64::MAX))
            }
        }
        d.deserialize_any(ByName::<E>(std::marker::PhantomData))
    }
}

/// The descriptors of every landfall message, with the comments of the .proto files
/// (a serialized `google.protobuf.FileDescriptorSet`).
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/landfall.fds"));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_and_types() {
        let cmd = InstallSite { site_id: "edge-1".into(), ..Default::default() };
        assert_eq!(cmd.subject(), "landfall.cmd.edge-1.hub.install_site");
        assert_eq!(InstallSite::TYPE, "landfall.v1.InstallSite");
        let evt = NodeOsProvisioned { site_id: "edge-1".into(), node: "n1".into(), image: String::new() };
        assert_eq!(evt.subject_from(names::Origin::Gateway), "landfall.evt.edge-1.gateway.node.os_provisioned");
        assert_eq!(NodeOsProvisioned::filter(), "landfall.evt.*.*.node.os_provisioned");
        let job = ProvisionOs { site_id: "edge-1".into(), ..Default::default() };
        assert_eq!(job.subject(), "landfall.job.edge-1.54.provision_os");
    }

    #[test]
    fn every_command_kind_has_its_type() {
        let kinds: std::collections::BTreeSet<_> = COMMAND_TYPES.iter().map(|(k, _)| *k).collect();
        assert_eq!(kinds.len(), COMMAND_TYPES.len());
        for (kind, type_name) in COMMAND_TYPES {
            assert!(type_name.starts_with("landfall.v1."), "{kind}: {type_name}");
        }
        assert!(COMMAND_TYPES.contains(&(InstallSite::KIND, InstallSite::TYPE)));
    }

    #[test]
    fn json_reads_back_what_it_writes() {
        let cmd = PatchPackage {
            name: "kubelet".into(),
            version: "1.30.0".into(),
            strategy: Some(RolloutStrategy {
                on_wave_timeout: WaveTimeoutAction::Continue as i32,
                ..Default::default()
            }),
            ..Default::default()
        };
        let text = serde_json::to_string(&cmd).unwrap();
        assert_eq!(serde_json::from_str::<PatchPackage>(&text).unwrap(), cmd);

        // Absent fields default; enums by any of their names or by number.
        let node: NodeSpec = serde_json::from_str(r#"{"name": "n1", "role": "MASTER"}"#).unwrap();
        assert_eq!(node.role, Role::Master as i32);
        for role in [r#""worker""#, r#""ROLE_WORKER""#, "2"] {
            let n: NodeSpec = serde_json::from_str(&format!(r#"{{"role": {role}}}"#)).unwrap();
            assert_eq!(n.role, Role::Worker as i32, "{role}");
        }
        let p: Package = serde_json::from_str(r#"{"kind": "os-image"}"#).unwrap();
        assert_eq!(p.kind, PackageKind::OsImage as i32);

        // A typo, an unknown enum value, a wrong type: errors that say what was wrong.
        let e = serde_json::from_str::<InstallSite>(r#"{"site": "edge-01"}"#).unwrap_err().to_string();
        assert!(e.contains("unknown field `site`"), "{e}");
        let e = serde_json::from_str::<NodeSpec>(r#"{"role": "boss"}"#).unwrap_err().to_string();
        assert!(e.contains("unknown value \"boss\", expected one of unspecified, master, worker"), "{e}");
        assert!(serde_json::from_str::<NodeSpec>(r#"{"role": 9}"#).is_err());
        assert!(serde_json::from_str::<InstallSite>(r#"{"design_revision": "x"}"#).is_err());
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
