use std::path::PathBuf;

fn main() {
    let protos = [
        "proto/landfall/v1/common.proto",
        "proto/landfall/v1/commands.proto",
        "proto/landfall/v1/jobs.proto",
        "proto/landfall/v1/events.proto",
        "proto/landfall/v1/state.proto",
        "proto/landfall/v1/services.proto",
    ];
    for proto in &protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    println!("cargo:rerun-if-env-changed=PROTOC");

    // A `protoc` from the environment wins; otherwise the one vendored as a crate, so a
    // fresh machine builds without installing anything.
    let protoc = std::env::var_os("PROTOC").map(PathBuf::from).unwrap_or_else(|| {
        protoc_bin_vendored::protoc_bin_path().expect("no vendored protoc for this platform; set PROTOC")
    });

    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc);
    config.type_attribute(".", "#[derive(serde::Serialize)]");
    for (field, with) in [
        ("landfall.v1.NodeSpec.role", "role"),
        ("landfall.v1.RolePackages.role", "role"),
        ("landfall.v1.NodeResult.role", "role"),
        ("landfall.v1.Package.kind", "package_kind"),
        ("landfall.v1.NodeResult.outcome", "node_outcome"),
        ("landfall.v1.SiteInstalled.outcome", "install_outcome"),
        ("landfall.v1.SiteInstallFailed.outcome", "install_outcome"),
        ("landfall.v1.InstallSaga.outcome", "install_outcome"),
        ("landfall.v1.InstallSaga.phase", "install_phase"),
        ("landfall.v1.NodeProgress.step", "node_step"),
        ("landfall.v1.CommandRejected.code", "reject_code"),
        ("landfall.v1.MessageRejected.code", "reject_code"),
        ("landfall.v1.RolloutStrategy.on_wave_timeout", "wave_timeout_action"),
        ("landfall.v1.ResolvedStrategy.on_wave_timeout", "wave_timeout_action"),
        ("landfall.v1.Rollout.phase", "rollout_phase"),
        ("landfall.v1.RolloutSite.state", "rollout_site_state"),
        ("landfall.v1.SiteLease.holder", "lease_holder"),
        ("landfall.v1.NodeObserved.role", "role"),
        ("landfall.v1.NodeReady.role", "role"),
        ("landfall.v1.ObservedPackage.kind", "package_kind"),
        ("landfall.v1.ObservedVersion.kind", "package_kind"),
        ("landfall.v1.RoleArtifacts.role", "role"),
    ] {
        config.field_attribute(field, format!("#[serde(serialize_with = \"crate::pb::json::{with}\")]"));
    }
    config.compile_protos(&protos, &["proto"]).expect("compile landfall protos");
}
