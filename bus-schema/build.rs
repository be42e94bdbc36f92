use std::path::PathBuf;

use prost_build::Config;

fn main() {
    let protos = [
        "proto/landfall/v1/common.proto",
        "proto/landfall/v1/commands.proto",
        "proto/landfall/v1/jobs.proto",
        "proto/landfall/v1/events.proto",
        "proto/landfall/v1/state.proto",
        "proto/landfall/v1/services.proto",
        "proto/landfall/v1/identity.proto",
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
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));

    let mut config = Config::new();
    config.protoc_executable(protoc);
    // The descriptors (with the .proto comments) are kept: the HTTP API's OpenAPI document is
    // generated from them, so it cannot drift from the messages.
    config.file_descriptor_set_path(out.join("landfall.fds"));
    // JSON that maps one-to-one onto the messages: proto field names, absent fields default,
    // an unknown field is an error (a typo must not be silently ignored).
    config.enum_attribute(".", "#[derive(serde::Serialize, serde::Deserialize)]");
    config.message_attribute(
        ".",
        "#[derive(serde::Serialize, serde::Deserialize)]\n#[serde(default, deny_unknown_fields)]",
    );
    // Part of a site's design, which compares whole.
    for message in ["NodeNetwork", "SiteNetwork"] {
        config.message_attribute(format!(".landfall.v1.{message}"), "#[derive(Eq)]");
    }
    let fds = config.load_fds(&protos, &["proto"]).expect("run protoc on the landfall protos");

    // Every enum field reads and writes its value by name (see `pb::json`).
    for file in &fds.file {
        let package = file.package();
        for message in &file.message_type {
            for field in &message.field {
                if field.r#type() != prost_types::field_descriptor_proto::Type::Enum {
                    continue;
                }
                let rust_enum = field.type_name().rsplit('.').next().expect("a type name");
                config.field_attribute(
                    format!("{package}.{}.{}", message.name(), field.name()),
                    format!(
                        "#[serde(serialize_with = \"crate::pb::json::ser::<{rust_enum}, _>\", \
                         deserialize_with = \"crate::pb::json::de::<{rust_enum}, _>\")]"
                    ),
                );
            }
        }
    }
    config.compile_fds(fds).expect("compile landfall protos");
}
