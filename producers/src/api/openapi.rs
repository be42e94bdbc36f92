//! The OpenAPI document at `/openapi.json`.
//!
//! Request bodies are the protobuf messages themselves: their schemas are generated from the
//! .proto descriptors compiled into `bus-schema` (with the .proto comments as descriptions),
//! so the document cannot drift from the messages the bus carries. The read views' schemas
//! are written here, next to nothing else, and a test checks real responses against them.

use std::collections::BTreeMap;

use bus_schema::pb;
use prost::Message;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FileDescriptorSet};
use serde_json::{Map, Value, json};

use bus_schema::domain::BMC_SCHEMES;

use super::commands::COMMANDS;
use super::views::{NODE_STEPS, SITE_STATES};

const PACKAGE: &str = "landfall.v1";

fn schema_ref(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

fn nullable(schema: Value) -> Value {
    match schema.get("$ref") {
        Some(_) => json!({ "nullable": true, "allOf": [schema] }),
        None => {
            let mut s = schema;
            s["nullable"] = json!(true);
            s
        }
    }
}

/// The .proto comments by descriptor path (message `[4, i]`, field `[4, i, 2, j]`, enum `[5, i]`).
pub fn comments(file: &prost_types::FileDescriptorProto) -> BTreeMap<Vec<i32>, String> {
    let mut out = BTreeMap::new();
    for loc in file.source_code_info.iter().flat_map(|s| &s.location) {
        let text = [loc.leading_comments(), loc.trailing_comments()]
            .iter()
            .map(|c| c.lines().map(str::trim).collect::<Vec<_>>().join(" ").trim().to_string())
            .filter(|c| !c.is_empty())
            .collect::<Vec<_>>()
            .join(" ");
        if !text.is_empty() {
            out.insert(loc.path.clone(), text);
        }
    }
    out
}

/// An enum's schema: the names JSON writes and the .proto names, or the value's number.
fn enum_schema(e: &prost_types::EnumDescriptorProto, json_names: &[&str], description: Option<&String>) -> Value {
    let mut names: Vec<String> = json_names.iter().map(|s| s.to_string()).collect();
    for v in &e.value {
        if !names.iter().any(|n| n == v.name()) {
            names.push(v.name().to_string());
        }
    }
    let numbers: Vec<i32> = e.value.iter().map(|v| v.number()).collect();
    let mut s = json!({ "oneOf": [ { "type": "string", "enum": names }, { "type": "integer", "enum": numbers } ] });
    if let Some(d) = description {
        s["description"] = json!(d);
    }
    s
}

fn scalar(t: Type) -> Value {
    match t {
        Type::Double | Type::Float => json!({ "type": "number" }),
        Type::Int64 | Type::Sint64 | Type::Sfixed64 => {
            json!({ "type": "integer", "format": "int64", "minimum": i64::MIN, "maximum": i64::MAX })
        }
        Type::Uint64 | Type::Fixed64 => json!({ "type": "integer", "minimum": 0, "maximum": u64::MAX }),
        Type::Int32 | Type::Sint32 | Type::Sfixed32 => {
            json!({ "type": "integer", "format": "int32", "minimum": i32::MIN, "maximum": i32::MAX })
        }
        Type::Uint32 | Type::Fixed32 => json!({ "type": "integer", "minimum": 0, "maximum": u32::MAX }),
        Type::Bool => json!({ "type": "boolean" }),
        Type::String => json!({ "type": "string" }),
        Type::Bytes => json!({ "type": "array", "items": { "type": "integer", "minimum": 0, "maximum": 255 } }),
        Type::Enum | Type::Message | Type::Group => json!({}),
    }
}

/// The schema of one field's value (before `repeated`).
fn field_value(field: &prost_types::FieldDescriptorProto, maps: &BTreeMap<String, &DescriptorProto>) -> Value {
    let short = |type_name: &str| {
        type_name.trim_start_matches('.').trim_start_matches(PACKAGE).trim_start_matches('.').to_string()
    };
    match field.r#type() {
        Type::Enum => schema_ref(&format!("{PACKAGE}.{}", short(field.type_name()))),
        Type::Message => match maps.get(field.type_name()) {
            Some(entry) => {
                let value =
                    entry.field.iter().find(|f| f.name() == "value").map(|f| field_value(f, maps)).unwrap_or_default();
                json!({ "type": "object", "additionalProperties": value })
            }
            None => schema_ref(&format!("{PACKAGE}.{}", short(field.type_name()))),
        },
        t => scalar(t),
    }
}

/// A schema per landfall message and enum, named by its full protobuf name.
pub fn message_schemas() -> Map<String, Value> {
    let set = FileDescriptorSet::decode(pb::FILE_DESCRIPTOR_SET).expect("bus-schema embeds a valid descriptor set");
    let mut out = Map::new();
    for file in set.file.iter().filter(|f| f.package() == PACKAGE) {
        let notes = comments(file);
        for (i, e) in file.enum_type.iter().enumerate() {
            let schema = enum_schema(e, &pb::json::json_names(e.name()), notes.get(&vec![5, i as i32]));
            out.insert(format!("{PACKAGE}.{}", e.name()), schema);
        }
        for (i, m) in file.message_type.iter().enumerate() {
            let maps: BTreeMap<String, &DescriptorProto> = m
                .nested_type
                .iter()
                .filter(|n| n.options.as_ref().is_some_and(|o| o.map_entry()))
                .map(|n| (format!(".{PACKAGE}.{}.{}", m.name(), n.name()), n))
                .collect();
            let mut properties = Map::new();
            for (j, f) in m.field.iter().enumerate() {
                let value = field_value(f, &maps);
                let is_map = maps.contains_key(f.type_name());
                let mut schema = if f.label() == Label::Repeated && !is_map {
                    json!({ "type": "array", "items": value })
                } else {
                    value
                };
                if let Some(d) = notes.get(&vec![4, i as i32, 2, j as i32]) {
                    schema = match schema.get("$ref") {
                        Some(_) => json!({ "allOf": [schema], "description": d }),
                        None => {
                            schema["description"] = json!(d);
                            schema
                        }
                    };
                }
                // A message field may be absent or null: both read as "not set".
                if f.r#type() == Type::Message && f.label() != Label::Repeated && !is_map {
                    schema = nullable(schema);
                }
                properties.insert(f.name().to_string(), schema);
            }
            let mut schema = json!({ "type": "object", "properties": properties, "additionalProperties": false });
            if let Some(d) = notes.get(&vec![4, i as i32]) {
                schema["description"] = json!(d);
            }
            out.insert(format!("{PACKAGE}.{}", m.name()), schema);
        }
    }
    out
}

/// What the .proto files cannot say and the API checks: the shape of ids, and the fields a
/// command cannot do without. (Rules across fields, such as a master per site or unique MACs,
/// are checked too, and answered with 422; OpenAPI 3.0 cannot express them.)
fn constrain(schemas: &mut Map<String, Value>) {
    let site_id = json!({
        "minLength": 1, "maxLength": 63, "pattern": "^[a-z0-9]([a-z0-9-]*[a-z0-9])?$", "not": { "enum": ["fleet"] },
    });
    let uuid = json!({ "format": "uuid", "pattern": "^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$" });
    for schema in schemas.values_mut() {
        let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) else { continue };
        for (field, extra) in [("site_id", &site_id), ("rollout_id", &uuid)] {
            if let Some(Value::Object(p)) = props.get_mut(field) {
                p.extend(extra.as_object().into_iter().flatten().map(|(k, v)| (k.clone(), v.clone())));
            }
        }
    }
    let dns_label = json!({ "minLength": 1, "maxLength": 63, "pattern": "^[a-z0-9]([a-z0-9-]*[a-z0-9])?$" });
    let mac = json!({ "pattern": "^[0-9a-fA-F]{2}([:-][0-9a-fA-F]{2}){5}$" });
    let schemes: Vec<String> = BMC_SCHEMES.iter().map(|s| s.replace('+', "\\+").replace('.', "\\.")).collect();
    let bmc = json!({ "pattern": format!("^({})://[^/\\s][^\\s]*$", schemes.join("|")) });
    let mac_or_none = json!({ "pattern": "^([0-9a-fA-F]{2}([:-][0-9a-fA-F]{2}){5})?$" });
    let name = json!({ "minLength": 1, "maxLength": 128, "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]*$" });
    let version = json!({ "minLength": 1, "maxLength": 128, "pattern": "^[A-Za-z0-9][A-Za-z0-9._+~-]*$" });
    let sha256 = json!({ "pattern": "^[0-9a-f]{64}$" });
    let nonempty = json!({ "minLength": 1 });
    let bond_modes: Vec<&str> = std::iter::once("").chain(bus_schema::host_setup::BOND_MODES).collect();
    let bond_mode = json!({ "enum": bond_modes });
    let vlan_id = json!({ "maximum": 4094 });
    let device = json!({ "pattern": "^(/dev/.+)?$" });
    let window_duration = json!({
        "minimum": bus_schema::window::MIN_DURATION_SECONDS, "maximum": bus_schema::window::MAX_DURATION_SECONDS,
    });
    let fields: [(&str, &str, &Value); 21] = [
        ("NodeInterface", "name", &nonempty),
        ("NodeInterface", "bond_mode", &bond_mode),
        ("NodeInterface", "vlan_id", &vlan_id),
        ("SiteNetwork", "name", &nonempty),
        ("RootDeviceHints", "device_name", &device),
        ("NodeRemoved", "boot_mac", &mac_or_none),
        ("NodeSpec", "name", &dns_label),
        ("NodeSpec", "boot_mac", &mac),
        ("NodeSpec", "bmc_address", &bmc),
        ("NodeRemoved", "node", &dns_label),
        ("RemoveNode", "node", &dns_label),
        ("ReprovisionNode", "node", &dns_label),
        ("PackageRef", "name", &name),
        ("PackageRef", "version", &version),
        ("Package", "name", &name),
        ("Package", "version", &version),
        ("Package", "sha256", &sha256),
        ("PatchPackage", "name", &name),
        ("PatchPackage", "version", &version),
        ("MaintenanceWindow", "duration_seconds", &window_duration),
        ("MaintenanceWindow", "time_zone", &nonempty),
    ];
    for (message, field, extra) in fields {
        if let Some(Value::Object(p)) =
            schemas.get_mut(&format!("{PACKAGE}.{message}")).map(|s| &mut s["properties"][field])
        {
            p.extend(extra.as_object().into_iter().flatten().map(|(k, v)| (k.clone(), v.clone())));
        }
    }
    // A node is a master or a worker; a package has a kind; a site has nodes.
    let known = |enum_name: &str, json_names: &[&str], numbers: &[i32]| {
        json!({ "oneOf": [ { "type": "string", "enum": json_names }, { "type": "integer", "enum": numbers } ],
                "description": format!("A {enum_name} other than unspecified.") })
    };
    schemas[&format!("{PACKAGE}.NodeSpec")]["properties"]["role"] =
        known("Role", &["master", "worker", "ROLE_MASTER", "ROLE_WORKER"], &[1, 2]);
    schemas[&format!("{PACKAGE}.RolePackages")]["properties"]["role"] =
        known("Role", &["master", "worker", "ROLE_MASTER", "ROLE_WORKER"], &[1, 2]);
    schemas[&format!("{PACKAGE}.NodeSpec")]["required"] = json!(["name", "role", "boot_mac", "bmc_address"]);
    schemas[&format!("{PACKAGE}.Package")]["properties"]["kind"] = known(
        "PackageKind",
        &["os-image", "binary", "container", "PACKAGE_KIND_OS_IMAGE", "PACKAGE_KIND_BINARY", "PACKAGE_KIND_CONTAINER"],
        &[1, 2, 3],
    );
    schemas[&format!("{PACKAGE}.Package")]["required"] = json!(["name", "version", "kind", "sha256"]);
    // A helm chart is registered with `landfall package upload`, which checks it with helm; a
    // render is what a job carries, never a registration. Chart values come in designs.
    schemas[&format!("{PACKAGE}.Package")]["properties"]["chart"] =
        json!({ "type": "null", "description": "Helm charts are registered with `landfall package upload`." });
    schemas[&format!("{PACKAGE}.Package")]["properties"]["render"] =
        json!({ "type": "null", "description": "Set on the packages of jobs only." });
    schemas[&format!("{PACKAGE}.SiteDesign")]["properties"]["chart_values"] = json!({
        "type": "object", "maxProperties": 0,
        "description": "Helm chart values are given in design documents (ApplyDesign)."
    });
    schemas[&format!("{PACKAGE}.PackageRef")]["required"] = json!(["name", "version"]);
    schemas[&format!("{PACKAGE}.SiteDesign")]["properties"]["nodes"]["minItems"] = json!(1);
    schemas[&format!("{PACKAGE}.SiteDesign")]["required"] = json!(["site_id", "nodes"]);
    let required: [(&str, &[&str]); 17] = [
        ("RegisterSite", &["design"]),
        ("ApplyDesign", &["site_id", "sources"]),
        ("InstallSite", &["site_id"]),
        ("StageSite", &["site_id"]),
        ("NodeAdded", &["site_id", "node"]),
        ("NodeRemoved", &["site_id", "node"]),
        ("RemoveSite", &["site_id"]),
        ("RemoveNode", &["site_id", "node"]),
        ("ReprovisionNode", &["site_id", "node"]),
        ("DecommissionSite", &["site_id"]),
        ("RegisterPackage", &["package"]),
        ("PatchPackage", &["name", "version"]),
        ("PauseRollout", &["rollout_id"]),
        ("ResumeRollout", &["rollout_id"]),
        ("CancelRollout", &["rollout_id"]),
        ("RollbackRollout", &["rollout_id"]),
        ("MaintenanceWindow", &["cron", "time_zone", "duration_seconds"]),
    ];
    for (message, fields) in required {
        let Some(schema) = schemas.get_mut(&format!("{PACKAGE}.{message}")) else { continue };
        schema["required"] = json!(fields);
        for f in fields.iter() {
            let prop = &mut schema["properties"][*f];
            // Required means present and set: not null, not empty.
            if let Some(inner) = prop.get("allOf").and_then(|a| a.get(0)).cloned() {
                *prop = inner;
            } else if prop["type"] == "string" {
                prop["minLength"] = json!(1);
            } else if prop["type"] == "array" {
                prop["minItems"] = json!(1);
            }
        }
    }
}

fn string() -> Value {
    json!({ "type": "string" })
}

fn integer() -> Value {
    json!({ "type": "integer", "minimum": 0 })
}

fn object(required: &[&str], properties: Value) -> Value {
    json!({ "type": "object", "required": required, "properties": properties })
}

fn counts() -> Value {
    json!({ "type": "object", "additionalProperties": { "type": "integer", "minimum": 0 } })
}

/// The schemas of the read views (see `views`).
fn view_schemas() -> Map<String, Value> {
    let install = object(
        &["id", "phase", "outcome", "reason", "started", "finished"],
        json!({
            "id": string(), "phase": string(), "outcome": nullable(string()), "reason": string(),
            "started": string(), "finished": string(),
        }),
    );
    let last_event = object(
        &["type", "seq", "time", "summary"],
        json!({ "type": string(), "seq": integer(), "time": string(), "summary": string() }),
    );
    let site_props = json!({
        "site": string(),
        "labels": { "type": "object", "additionalProperties": string() },
        "state": { "type": "string", "enum": SITE_STATES },
        "busy": { "type": "string", "enum": ["install", "join", "rollout"], "nullable": true,
                  "description": "What holds the site's lease now, if anything." },
        "nodes": integer(), "nodes_ready": integer(), "nodes_failed": integer(),
        "versions": { "type": "object", "additionalProperties": { "type": "array", "items": string() },
                      "description": "Per package, the versions the site's nodes report running." },
        "install": nullable(schema_ref("Install")),
        "last_event": nullable(schema_ref("LastEvent")),
        "link": nullable(schema_ref("Link")),
        "attention": { "type": "array", "items": schema_ref("Attention"),
                       "description": "What a person must do before the site can go on, each with why: its gateway was never heard from, or the site found its hosts other than the hub believes." },
    });
    let attention = object(
        &["kind", "reason"],
        json!({
            "kind": { "type": "string", "enum": ["no_gateway", "site_disagrees"] },
            "reason": string(),
        }),
    );
    let link = object(
        &["state", "since", "outbox_waiting", "last_report", "cut_off_since"],
        json!({
            "state": { "type": "string", "enum": ["up", "cut_off"],
                       "description": "cut_off: nothing heard of the site's gateway for longer than the observer's --cut-off-after. Its work goes on; its reports arrive when it is heard again." },
            "since": { "type": "string", "description": "When the state began: for cut_off, the last time the site was heard (RFC 3339)." },
            "outbox_waiting": { "type": "integer", "description": "Reports the site still held for the hub, as it said last." },
            "last_report": nullable(object(&["type", "time"], json!({ "type": string(), "time": string() }))),
            "cut_off_since": { "type": "string", "nullable": true, "description": "For up after a cut: when the cut began." },
        }),
    );
    let site_required = [
        "site",
        "labels",
        "state",
        "busy",
        "nodes",
        "nodes_ready",
        "nodes_failed",
        "versions",
        "install",
        "last_event",
        "link",
        "attention",
    ];
    let site = object(&site_required, site_props.clone());
    let mut detail_props = site_props;
    detail_props["node_list"] = json!({ "type": "array", "items": schema_ref("Node") });
    let mut detail_required = site_required.to_vec();
    detail_required.push("node_list");
    let node_package = object(
        &["name", "version", "kind", "desired", "differs"],
        json!({
            "name": string(), "version": string(), "kind": string(),
            "desired": nullable(string()), "differs": { "type": "boolean" },
        }),
    );
    let node = object(
        &[
            "name",
            "role",
            "boot_mac",
            "bmc_address",
            "in_design",
            "step",
            "metal3_state",
            "out_of_service",
            "failed_step",
            "reason",
            "packages",
        ],
        json!({
            "name": string(), "role": string(), "boot_mac": string(), "bmc_address": string(),
            "in_design": { "type": "boolean" },
            "step": { "type": "string", "enum": NODE_STEPS },
            "metal3_state": { "type": "string", "description": "The BareMetalHost's provisioning state, as last reported." },
            "out_of_service": { "type": "string", "enum": ["", "cordoned", "drained"],
                "description": "Taken out of service by a patch and not given back yet: cordoned, or cordoned and drained; empty otherwise." },
            "failed_step": string(), "reason": string(),
            "packages": { "type": "array", "items": schema_ref("NodePackage") },
        }),
    );
    let rollout_props = json!({
        "id": string(), "package": string(), "version": string(), "phase": string(), "reason": string(),
        "planned_nodes": integer(), "patched": integer(), "failed": integer(), "sites": integer(),
        "sites_done": integer(), "wave": integer(), "waves": integer(), "trigger": string(), "actor": string(),
        "started": string(), "finished": string(),
        "started_unix_ms": { "type": "integer" }, "finished_unix_ms": { "type": "integer" },
    });
    let rollout_required = [
        "id",
        "package",
        "version",
        "phase",
        "reason",
        "planned_nodes",
        "patched",
        "failed",
        "sites",
        "sites_done",
        "wave",
        "waves",
        "trigger",
        "started",
        "finished",
    ];
    let mut head_props = rollout_props.clone();
    head_props["strategy"] = nullable(schema_ref("landfall.v1.ResolvedStrategy"));
    head_props["selector"] = nullable(schema_ref("landfall.v1.SiteSelector"));
    head_props["timed_out_sites"] = integer();
    head_props["nodes"] = counts();
    let rollout_node = object(
        &["node", "role", "from_version", "to_version", "status", "observed_version", "planned"],
        json!({
            "node": string(), "role": string(), "from_version": string(), "to_version": string(),
            "status": { "type": "string", "enum": ["pending", "not_started", "patching", "patched", "failed", "skipped", "timed_out", "unreported"] },
            "observed_version": nullable(string()), "planned": { "type": "boolean" },
            "times_patched": integer(), "failed_step": string(), "reason": string(),
        }),
    );
    let rollout_site = object(
        &["index", "site", "wave", "canary", "state", "nodes"],
        json!({
            "index": integer(), "site": string(), "wave": integer(), "canary": { "type": "boolean" },
            "state": string(), "nodes": { "type": "array", "items": schema_ref("RolloutNode") },
        }),
    );
    let schemas = json!({
        "Error": object(&["error", "message"], json!({
            "error": { "type": "string", "description": "A code: bad_request, unauthorized, forbidden, not_found, invalid, too_large, unsupported_media_type, bus_unavailable." },
            "message": { "type": "string", "description": "What was wrong, and what to do." },
        })),
        "CommandAccepted": object(
            &["id", "correlation_id", "type", "subject", "stream_sequence", "duplicate", "events"],
            json!({
                "id": { "type": "string", "description": "The command id (its Nats-Msg-Id)." },
                "correlation_id": string(),
                "type": { "type": "string", "description": "The protobuf type published." },
                "subject": string(),
                "stream_sequence": integer(),
                "duplicate": { "type": "boolean", "description": "The same id was already stored: this request changed nothing." },
                "events": { "type": "string", "description": "Where to follow what the command leads to." },
                "actor": { "type": "string", "description": "Who the command names as its author." },
                "narrowed_to": { "type": "string", "description": "A rollout sent by an operator of part of the fleet: the part it was held to." },
            }),
        ),
        "Command": object(
            &["id", "type", "subject", "actor", "scope", "outcome", "code", "reason", "handled_at", "handled_by"],
            json!({
                "id": { "type": "string", "description": "The command id." },
                "actor": { "type": "string", "description": "Who asked for it: user:<name>, token:<name>, nats:<key>, cli:<login>@<host>, service:<name> or site:<id> (empty: not recorded)." },
                "scope": { "type": "string", "description": "The site it was about, or `fleet`." },
                "type": { "type": "string", "description": "The protobuf type." },
                "subject": string(),
                "outcome": { "type": "string", "enum": ["carried_out", "rejected", "dead_lettered"] },
                "code": { "type": "string", "description": "When rejected: why, as a code (unknown_site, conflict, ...)." },
                "reason": { "type": "string", "description": "When rejected: why, in words." },
                "handled_at": { "type": "string", "description": "When it was settled (RFC 3339)." },
                "handled_by": { "type": "string", "description": "The orchestrator replica that settled it (host/pid/instance)." },
                "duplicate": { "type": "boolean", "description": "In answer to a POST: the Idempotency-Key was used before; nothing was published." },
            }),
        ),
        "Overview": object(&["ready", "sites", "nodes", "rollouts", "packages"], json!({
            "ready": { "type": "boolean", "description": "The read model has caught up with the bus." },
            "sites": object(&["total", "busy", "cut_off", "by_state"], json!({ "total": integer(), "busy": integer(), "cut_off": integer(), "by_state": counts() })),
            "nodes": object(&["total", "by_step"], json!({ "total": integer(), "by_step": counts() })),
            "rollouts": object(&["total", "by_phase"], json!({ "total": integer(), "by_phase": counts() })),
            "packages": integer(),
        })),
        "Install": install,
        "LastEvent": last_event,
        "Link": link,
        "Site": site,
        "Attention": attention,
        "SiteDetail": { "type": "object", "required": detail_required, "properties": detail_props },
        "SitePage": object(&["total", "offset", "limit", "items"], json!({
            "total": integer(), "offset": integer(), "limit": integer(),
            "items": { "type": "array", "items": schema_ref("Site") },
        })),
        "NodePackage": node_package,
        "Node": node,
        "SiteChart": object(&["name", "version", "chart_sha256", "values_digest", "helm_version", "kube_version", "render_sha256", "rendered_at_ms"], json!({
            "name": string(), "version": string(), "chart_sha256": string(), "values_digest": string(),
            "helm_version": string(), "kube_version": string(), "render_sha256": string(), "rendered_at_ms": integer(),
        })),
        "CatalogEntry": object(&["name", "version", "kind", "sha256", "size", "in_store", "auto_rollout"], json!({
            "name": string(), "version": string(), "kind": string(), "sha256": string(), "size": integer(),
            "in_store": { "type": "boolean" }, "auto_rollout": { "type": "boolean" },
        })),
        "Rollout": object(&rollout_required, rollout_props),
        "RolloutDetail": object(&["rollout", "sites"], json!({
            "rollout": { "type": "object", "required": rollout_required, "properties": head_props },
            "sites": { "type": "array", "items": schema_ref("RolloutSite") },
        })),
        "RolloutNode": rollout_node,
        "RolloutSite": rollout_site,
        "Principal": object(&["name", "actor", "role", "grants"], json!({
            "name": string(),
            "actor": { "type": "string", "description": "What the commands they send name as their author." },
            "role": { "type": "string", "nullable": true, "enum": ["viewer", "operator", "admin"], "description": "Their highest role anywhere." },
            "grants": { "type": "array", "items": object(&["role", "sites"], json!({
                "role": { "type": "string", "enum": ["viewer", "operator", "admin"] },
                "sites": { "type": "object", "nullable": true, "additionalProperties": string(), "description": "The labels a site must hold; null: the whole fleet." },
            })) },
        })),
    });
    match schemas {
        Value::Object(m) => m,
        _ => unreachable!("a JSON object literal"),
    }
}

fn error_response(description: &str) -> Value {
    json!({ "description": description, "content": { "application/json": { "schema": schema_ref("Error") } } })
}

fn ok_json(description: &str, schema: Value) -> Value {
    json!({ "200": { "description": description, "content": { "application/json": { "schema": schema } } },
            "400": error_response("A query parameter is wrong."),
            "401": error_response("No token, or an unknown one.") })
}

fn get(summary: &str, description: &str, responses: Value, parameters: Value) -> Value {
    json!({ "get": { "summary": summary, "description": description, "parameters": parameters, "responses": responses } })
}

/// The whole document.
pub fn document() -> Value {
    let messages = message_schemas();
    let mut paths = Map::new();
    for c in COMMANDS {
        let message = c.type_name.trim_start_matches(&format!("{PACKAGE}."));
        let description = messages.get(c.type_name).and_then(|s| s["description"].as_str()).unwrap_or("").to_string();
        let scope = if c.site_scoped { "the site's id" } else { "`fleet`" };
        paths.insert(
            format!("/v1/commands/{}", c.kind),
            json!({ "post": {
                "summary": format!("Publish {message}"),
                "description": format!(
                    "{description}\n\nPublished as `{}` on `landfall.cmd.<scope>.hub.{}` (scope: {scope}). Requires an operator token. \
                     What it leads to is told by the events correlated with the returned id.",
                    c.type_name, c.kind
                ),
                "operationId": format!("command_{}", c.kind),
                "tags": ["commands"],
                "parameters": [
                    { "name": "Idempotency-Key", "in": "header", "required": false,
                      "description": "A UUID that becomes the command id: the same key again publishes the command once. Once the command is settled, the same key is answered with its outcome (200) for as long as the command ledger keeps it (the commands stream's retention), without publishing.",
                      "schema": { "type": "string", "format": "uuid" } },
                    { "name": "traceparent", "in": "header", "required": false,
                      "description": "W3C trace context to continue.", "schema": { "type": "string" } },
                ],
                "requestBody": { "required": true, "content": { "application/json": { "schema": schema_ref(c.type_name) } } },
                "responses": {
                    "202": { "description": "Stored on the bus.", "content": { "application/json": { "schema": schema_ref("CommandAccepted") } } },
                    "200": { "description": "This Idempotency-Key's command was settled before: how. Nothing was published.", "content": { "application/json": { "schema": schema_ref("Command") } } },
                    "409": error_response("This Idempotency-Key was used for another kind of command."),
                    "400": error_response("The body is not this command as JSON, or a header is wrong."),
                    "401": error_response("No token, or an unknown one."),
                    "403": error_response("The caller may not change what the command reaches (a viewer, or a site or rollout outside their grants; the message says which)."),
                    "404": error_response("The command names a site the caller may not read, or that is not registered."),
                    "413": error_response("Too large for the bus."),
                    "415": error_response("Not JSON."),
                    "422": error_response("The command is well-formed but invalid (the message says which field and why)."),
                    "503": error_response("The bus did not store the command; send it again (with the same Idempotency-Key)."),
                },
            }}),
        );
    }
    let site_param = json!([{ "name": "site", "in": "path", "required": true, "schema": { "type": "string" } }]);
    let entries = [
        (
            "/v1/overview",
            get(
                "Fleet overview",
                "Counts of sites by state, nodes by step, rollouts by phase.",
                ok_json("The overview.", schema_ref("Overview")),
                json!([]),
            ),
        ),
        (
            "/v1/sites",
            get(
                "Sites",
                "A page of the sites table, in site id order.",
                ok_json("A page of sites.", schema_ref("SitePage")),
                json!([
                    { "name": "state", "in": "query", "schema": { "type": "string", "enum": SITE_STATES } },
                    { "name": "q", "in": "query", "description": "Only sites whose id contains this.", "schema": string() },
                    { "name": "link", "in": "query", "description": "Only sites the hub hears (up) or does not (cut_off).", "schema": { "type": "string", "enum": ["up", "cut_off"] } },
                    { "name": "ids", "in": "query", "description": "Only these sites (comma-separated).", "schema": string() },
                    { "name": "limit", "in": "query", "schema": { "type": "integer", "minimum": 1, "maximum": super::views::MAX_PAGE } },
                    { "name": "offset", "in": "query", "schema": { "type": "integer", "minimum": 0, "maximum": u32::MAX } },
                ]),
            ),
        ),
        ("/v1/sites/{site}", {
            let mut g = get(
                "One site",
                "A site with its nodes (Metal3 state, role, versions).",
                ok_json("The site.", schema_ref("SiteDetail")),
                site_param.clone(),
            );
            g["get"]["responses"]["404"] = error_response("No such site.");
            g
        }),
        ("/v1/sites/{site}/nodes", {
            let mut g = get(
                "A site's nodes",
                "Every node: Metal3 state, role, package versions (observed and desired).",
                ok_json("The nodes.", json!({ "type": "array", "items": schema_ref("Node") })),
                site_param.clone(),
            );
            g["get"]["responses"]["404"] = error_response("No such site.");
            g
        }),
        ("/v1/sites/{site}/charts", {
            let mut g = get(
                "A site's helm charts",
                "The latest render of each helm chart made for the site, and what it was made of: the chart \
                 archive's and the values' sha256, the helm and Kubernetes versions.",
                ok_json("The charts.", json!({ "type": "array", "items": schema_ref("SiteChart") })),
                site_param,
            );
            g["get"]["responses"]["404"] = error_response("No such site.");
            g
        }),
        (
            "/v1/packages",
            get(
                "The package catalog",
                "Every registered package version.",
                ok_json("The catalog.", json!({ "type": "array", "items": schema_ref("CatalogEntry") })),
                json!([]),
            ),
        ),
        (
            "/v1/rollouts",
            get(
                "Rollouts",
                "Every rollout, newest first, with its progress.",
                ok_json("The rollouts.", json!({ "type": "array", "items": schema_ref("Rollout") })),
                json!([]),
            ),
        ),
        ("/v1/rollouts/{id}", {
            let mut g = get(
                "One rollout",
                "A rollout with every site and node of its plan and what happened to it.",
                ok_json("The rollout.", schema_ref("RolloutDetail")),
                json!([{ "name": "id", "in": "path", "required": true, "schema": { "type": "string" } }]),
            );
            g["get"]["responses"]["404"] = error_response("No such rollout.");
            g["get"]["responses"]["503"] = error_response("The bus could not be read.");
            g
        }),
        ("/v1/commands/{id}", {
            let mut g = get(
                "How a command was settled",
                "Carried out, or refused with its code and reason, as the command ledger recorded it (kept as long as \
                 the commands stream keeps commands).",
                ok_json("The command's outcome.", schema_ref("Command")),
                json!([{ "name": "id", "in": "path", "required": true, "schema": { "type": "string" } }]),
            );
            g["get"]["responses"]["404"] = error_response("Not settled: still queued or waiting, or never published.");
            g["get"]["responses"]["503"] = error_response("The bus could not be read.");
            g
        }),
        (
            "/v1/whoami",
            get(
                "The caller",
                "Who the token sent is: their name, the actor their commands name, their highest role and their grants.",
                ok_json("The caller.", schema_ref("Principal")),
                json!([]),
            ),
        ),
        ("/v1/events", {
            let mut g = get(
                "Events (Server-Sent Events)",
                "The events stream, live, or replayed from a time or stream sequence. Each SSE message's `event` is the \
                 protobuf message name, its `id` the stream sequence (reconnect with `Last-Event-ID` to resume), its \
                 `data` a JSON object: seq, time, subject, site, type, id, correlation_id, causation_id, traceparent, event.",
                json!({
                    "200": { "description": "An endless stream of events.", "content": { "text/event-stream": { "schema": string() } } },
                    "400": error_response("A query parameter is wrong."),
                    "401": error_response("No token, or an unknown one."),
                    "503": error_response("The events stream could not be read."),
                }),
                json!([
                    { "name": "site", "in": "query", "description": "Only these sites (comma-separated; `fleet` for fleet events).", "schema": string() },
                    { "name": "type", "in": "query", "description": "Only these event types (comma-separated: SiteInstalled, landfall.v1.SiteInstalled or site.installed).", "schema": string() },
                    { "name": "correlation", "in": "query", "description": "Only events of this command.", "schema": string() },
                    { "name": "since", "in": "query", "description": "Replay from this time.", "schema": { "type": "string", "format": "date-time" } },
                    { "name": "from_seq", "in": "query", "description": "Replay from this stream sequence.", "schema": { "type": "integer", "minimum": 0 } },
                    { "name": "last", "in": "query", "description": "Replay the stream's last N events (those the filters match), then go on live. Before `since`; after `from_seq` and Last-Event-ID.", "schema": { "type": "integer", "minimum": 1, "maximum": super::sse::MAX_LAST } },
                    { "name": "Last-Event-ID", "in": "header", "description": "Resume after this stream sequence.", "schema": { "type": "string" } },
                ]),
            );
            g["get"]["tags"] = json!(["events"]);
            g
        }),
        (
            "/healthz",
            json!({ "get": { "summary": "Liveness", "security": [], "responses": {
            "200": { "description": "The process serves requests.", "content": { "application/json": { "schema": object(&["status"], json!({ "status": string() })) } } } } } }),
        ),
        (
            "/readyz",
            json!({ "get": { "summary": "Readiness", "security": [], "responses": {
            "200": { "description": "Connected to the bus, read model caught up. `store_full` lists the streams and buckets with no room (commands wait until there is room; nothing is lost).", "content": { "application/json": { "schema": { "type": "object" } } } },
            "503": { "description": "Not ready yet.", "content": { "application/json": { "schema": { "type": "object" } } } } } } }),
        ),
    ];
    let more = [super::identity::paths, super::audit::paths, super::approvals::paths, super::policy::paths]
        .into_iter()
        .flat_map(|paths| paths(error_response));
    for (path, item) in entries.into_iter().chain(more) {
        paths.insert(path.to_string(), item);
    }
    let mut schemas = messages;
    constrain(&mut schemas);
    schemas.extend(view_schemas());
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "landfall",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Bring up and patch fleets of bare-metal edge sites. Commands are published on the bus \
                (NATS JetStream) as the protobuf messages whose JSON they take; reads come from the fleet's read models. \
                Every /v1 request needs a bearer token (a static token, or an access token of the identity provider): \
                a viewer reads, an operator also publishes commands, an admin also approves; each over the sites its \
                grants cover.",
        },
        "security": [{ "bearer": [] }],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } },
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_has_a_path_and_a_schema_from_the_protos() {
        let doc = document();
        for c in COMMANDS {
            let path = &doc["paths"][format!("/v1/commands/{}", c.kind)]["post"];
            assert!(path.is_object(), "{}", c.kind);
            assert!(doc["components"]["schemas"][c.type_name]["properties"].is_object(), "{}", c.type_name);
        }
        let install = &doc["components"]["schemas"]["landfall.v1.InstallSite"];
        assert_eq!(install["properties"]["design_revision"]["maximum"], u64::MAX);
        assert!(
            install["properties"]["design_revision"]["description"].as_str().unwrap().contains("0 means the latest")
        );
        let node = &doc["components"]["schemas"]["landfall.v1.NodeSpec"]["properties"];
        assert_eq!(node["labels"]["type"], "object");
        assert_eq!(node["role"]["oneOf"][1]["enum"], json!([1, 2]), "a node is a master or a worker");
        let result = &doc["components"]["schemas"]["landfall.v1.NodeResult"]["properties"];
        assert_eq!(result["role"]["$ref"], "#/components/schemas/landfall.v1.Role");
        let window = &doc["components"]["schemas"]["landfall.v1.MaintenanceWindow"];
        assert_eq!(window["properties"]["duration_seconds"]["minimum"], 60, "a window lasts a minute at least");
        assert_eq!(window["properties"]["duration_seconds"]["maximum"], 604_800, "and seven days at most");
        let site = &doc["components"]["schemas"]["landfall.v1.SiteDesign"]["properties"];
        assert_eq!(site["maintenance_windows"]["items"]["$ref"], "#/components/schemas/landfall.v1.MaintenanceWindow");
        let role = &doc["components"]["schemas"]["landfall.v1.Role"];
        assert!(role["oneOf"][0]["enum"].as_array().unwrap().contains(&json!("master")));
    }

    #[test]
    fn every_reference_resolves() {
        let doc = document();
        let text = doc.to_string();
        for r in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
            let name = &r[..r.find('"').unwrap()];
            assert!(doc["components"]["schemas"][name].is_object(), "dangling reference to {name}");
        }
    }
}
