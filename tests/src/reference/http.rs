//! The HTTP API reference: every path of the OpenAPI document the API serves at
//! `/openapi.json` (`producers::api::openapi::document`), its parameters, body and answers, and
//! the read views' schemas. Request bodies that are protobuf messages link to the protobuf page.

use std::fmt::Write;

use serde_json::Value;

use super::{Page, escape_cell, escape_text, one_line, slug};

const PROTO_PREFIX: &str = "landfall.v1.";

pub fn page() -> Page {
    let doc = producers::api::openapi::document();
    let mut out = String::new();
    if let Some(d) = doc["info"]["description"].as_str() {
        writeln!(out, "{}\n", escape_text(&one_line(d))).unwrap();
    }
    writeln!(
        out,
        "The API serves this document itself at `/openapi.json` (OpenAPI {}); `landfall up` prints its address, \
         and [Use the HTTP API and the dashboard](../howto/api.md) shows it in use.\n",
        doc["openapi"].as_str().unwrap_or("")
    )
    .unwrap();
    let paths = doc["paths"].as_object().expect("the document has paths");
    let (commands, others): (Vec<_>, Vec<_>) = paths.iter().partition(|(p, _)| is_command(p));

    writeln!(out, "## Commands\n").unwrap();
    writeln!(out, "Each command is a `POST` of the protobuf message as JSON.\n").unwrap();
    writeln!(out, "| path | body | what it does |").unwrap();
    writeln!(out, "| --- | --- | --- |").unwrap();
    for (path, item) in &commands {
        let op = &item["post"];
        let body = schema_name(&op["requestBody"]["content"]["application/json"]["schema"]);
        writeln!(out, "| `POST {path}` | {body} | {} |", escape_cell(op["summary"].as_str().unwrap_or(""))).unwrap();
    }
    writeln!(out).unwrap();
    // What every command path shares (headers, answers) is said once; a path that differs gets
    // its own section.
    let shared = commands.first().map(|(_, item)| common(&item["post"]));
    if let Some(shared) = &shared {
        writeln!(out, "Every command path takes these headers and gives these answers:\n").unwrap();
        parameters(&mut out, &shared["parameters"]);
        responses(&mut out, &shared["responses"]);
    }
    for (path, item) in &commands {
        let op = &item["post"];
        if Some(common(op)) != shared {
            operation(&mut out, "post", path, op);
        }
    }

    writeln!(out, "## Reads and the rest\n").unwrap();
    for (path, item) in others {
        for (method, op) in item.as_object().into_iter().flatten() {
            operation(&mut out, method, path, op);
        }
    }

    writeln!(out, "## Schemas\n").unwrap();
    writeln!(
        out,
        "The read views' schemas (the commands' bodies are the [protobuf messages](proto.md)). \
         A field marked required is always present.\n"
    )
    .unwrap();
    let schemas = doc["components"]["schemas"].as_object().expect("the document has schemas");
    for (name, schema) in schemas.iter().filter(|(n, _)| !n.starts_with(PROTO_PREFIX)) {
        writeln!(out, "### {name}\n").unwrap();
        if let Some(d) = schema["description"].as_str() {
            writeln!(out, "{}\n", escape_text(&one_line(d))).unwrap();
        }
        match schema["properties"].as_object() {
            Some(props) if !props.is_empty() => {
                let required: Vec<&str> =
                    schema["required"].as_array().into_iter().flatten().filter_map(|r| r.as_str()).collect();
                writeln!(out, "| field | type | what it is |").unwrap();
                writeln!(out, "| --- | --- | --- |").unwrap();
                for (field, s) in props {
                    let mut what = s["description"].as_str().map(one_line).unwrap_or_default();
                    if required.contains(&field.as_str()) {
                        what = format!("{what} (required)").trim().to_string();
                    }
                    writeln!(out, "| `{field}` | {} | {} |", type_of(s), escape_cell(&what)).unwrap();
                }
                writeln!(out).unwrap();
            }
            _ => writeln!(out, "Type: {}.\n", type_of(schema)).unwrap(),
        }
    }
    Page { file: "http-api.md".to_string(), title: "HTTP API".to_string(), body: out }
}

fn is_command(path: &str) -> bool {
    path.strip_prefix("/v1/commands/").is_some_and(|kind| !kind.starts_with('{'))
}

/// An operation without what is its own (its summary, description, id and body).
fn common(op: &Value) -> Value {
    let mut v = op.clone();
    if let Some(o) = v.as_object_mut() {
        for own in ["summary", "description", "operationId", "requestBody"] {
            o.remove(own);
        }
    }
    v
}

fn operation(out: &mut String, method: &str, path: &str, op: &Value) {
    let method = method.to_uppercase();
    writeln!(out, "### {method} {path}\n").unwrap();
    if let Some(s) = op["summary"].as_str() {
        writeln!(out, "**{}.** {}\n", escape_text(s), escape_text(&one_line(op["description"].as_str().unwrap_or(""))))
            .unwrap();
    }
    if op.get("security").and_then(Value::as_array).is_some_and(|s| s.is_empty()) {
        writeln!(out, "No token needed.\n").unwrap();
    }
    parameters(out, &op["parameters"]);
    if let Some(schema) = op.pointer("/requestBody/content/application~1json/schema") {
        writeln!(out, "Body (JSON): {}.\n", schema_name(schema)).unwrap();
    }
    responses(out, &op["responses"]);
}

fn parameters(out: &mut String, params: &Value) {
    let Some(params) = params.as_array().filter(|p| !p.is_empty()) else { return };
    writeln!(out, "| parameter | in | type | what it is |").unwrap();
    writeln!(out, "| --- | --- | --- | --- |").unwrap();
    for p in params {
        let mut what = p["description"].as_str().map(one_line).unwrap_or_default();
        if p["required"].as_bool() == Some(true) {
            what = format!("{what} (required)").trim().to_string();
        }
        writeln!(
            out,
            "| `{}` | {} | {} | {} |",
            p["name"].as_str().unwrap_or(""),
            p["in"].as_str().unwrap_or(""),
            type_of(&p["schema"]),
            escape_cell(&what)
        )
        .unwrap();
    }
    writeln!(out).unwrap();
}

fn responses(out: &mut String, responses: &Value) {
    let Some(responses) = responses.as_object() else { return };
    writeln!(out, "| answer | what it means | body |").unwrap();
    writeln!(out, "| --- | --- | --- |").unwrap();
    for (code, r) in responses {
        let body = r["content"]
            .as_object()
            .and_then(|c| c.iter().next())
            .map(|(media, c)| format!("{} (`{media}`)", type_of(&c["schema"])))
            .unwrap_or_default();
        writeln!(out, "| {code} | {} | {body} |", escape_cell(r["description"].as_str().unwrap_or(""))).unwrap();
    }
    writeln!(out).unwrap();
}

/// A schema `$ref` as a link: a protobuf message to its section of the protobuf page, a view to
/// its section below.
fn schema_name(schema: &Value) -> String {
    let Some(reference) = schema["$ref"].as_str() else { return type_of(schema) };
    let name = reference.rsplit('/').next().unwrap_or(reference);
    match name.strip_prefix(PROTO_PREFIX) {
        Some(message) => super::proto::link(message),
        None => format!("[`{name}`](#{})", slug(name)),
    }
}

fn type_of(schema: &Value) -> String {
    if schema.get("$ref").is_some() {
        return schema_name(schema);
    }
    if let Some(all) = schema["allOf"].as_array().and_then(|a| a.first()) {
        return format!("{} or null", schema_name(all));
    }
    let t = schema["type"].as_str().unwrap_or("any");
    let mut s = match t {
        "array" => format!("array of {}", type_of(&schema["items"])),
        "object" if schema["additionalProperties"].is_object() => {
            format!("map to {}", type_of(&schema["additionalProperties"]))
        }
        _ => format!("`{t}`"),
    };
    if let Some(values) = schema["enum"].as_array() {
        let names: Vec<String> =
            values.iter().map(|v| format!("`{}`", v.as_str().map_or(v.to_string(), str::to_string))).collect();
        s = format!("{s}: {}", names.join(", "));
    }
    if let Some(f) = schema["format"].as_str() {
        s = format!("{s} ({f})");
    }
    if schema["nullable"].as_bool() == Some(true) {
        s = format!("{s} or null");
    }
    escape_cell(&s)
}
