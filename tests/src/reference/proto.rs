//! The protobuf reference: every message, field, enum and value of `landfall.v1`, with the
//! comments of the .proto files, read from the descriptor set `bus-schema` compiles in (the one
//! the HTTP API's OpenAPI document is made from).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::LazyLock;

use bus_schema::pb;
use prost::Message;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, EnumDescriptorProto, FileDescriptorProto, FileDescriptorSet};

use super::{Page, escape_cell, escape_text, slug};

const PACKAGE: &str = "landfall.v1";

fn descriptors() -> FileDescriptorSet {
    FileDescriptorSet::decode(pb::FILE_DESCRIPTOR_SET).expect("bus-schema embeds a valid descriptor set")
}

fn files(set: &FileDescriptorSet) -> Vec<&FileDescriptorProto> {
    set.file.iter().filter(|f| f.package() == PACKAGE).collect()
}

/// The page of a .proto file, relative to `proto.md`'s directory: `proto/commands.md`.
fn file_page(file: &FileDescriptorProto) -> String {
    let stem = file.name().rsplit('/').next().unwrap_or_default().trim_end_matches(".proto");
    format!("proto/{stem}.md")
}

/// Every message and enum of the package (nested ones as `Outer.Inner`), and the page that has it.
static PAGES: LazyLock<BTreeMap<String, String>> = LazyLock::new(|| {
    fn add(out: &mut BTreeMap<String, String>, outer: &str, m: &DescriptorProto, page: &str) {
        let name = format!("{outer}{}", m.name());
        for e in &m.enum_type {
            out.insert(format!("{name}.{}", e.name()), page.to_string());
        }
        for n in &m.nested_type {
            add(out, &format!("{name}."), n, page);
        }
        out.insert(name, page.to_string());
    }
    let set = descriptors();
    let mut out = BTreeMap::new();
    for file in files(&set) {
        let page = file_page(file);
        for m in &file.message_type {
            add(&mut out, "", m, &page);
        }
        for e in &file.enum_type {
            out.insert(e.name().to_string(), page.clone());
        }
    }
    out
});

/// A link to a message or enum's section from a page in the reference directory.
pub fn link(local: &str) -> String {
    match PAGES.get(local) {
        Some(page) => format!("[`{local}`]({page}#{})", slug(local)),
        None => format!("`{local}`"),
    }
}

/// `proto.md`, listing the files and what each holds, and a page per .proto file.
pub fn pages() -> Vec<Page> {
    let set = descriptors();
    let mut index = String::new();
    writeln!(
        index,
        "Every message of the package `{PACKAGE}`, from `bus-schema/proto/landfall/v1/`, with the comments \
         of the .proto files. Which message is a command, a job or an event, and its subject, is in \
         [NATS subjects, streams and buckets](subjects.md). In JSON (the HTTP API, `-o json`) a field \
         has its .proto name and an enum value its name.\n"
    )
    .unwrap();
    let mut pages = Vec::new();
    for file in files(&set) {
        let page = file_page(file);
        let names: Vec<String> = file
            .message_type
            .iter()
            .map(|m| m.name())
            .chain(file.enum_type.iter().map(|e| e.name()))
            .map(link)
            .collect();
        writeln!(index, "- [`{}`]({page}): {}", file.name(), names.join(", ")).unwrap();
        // The comments as the OpenAPI document has them: each one line.
        let comments = producers::api::openapi::comments(file);
        let mut body = String::new();
        for (i, message) in file.message_type.iter().enumerate() {
            message_section(&mut body, message, "", &[4, i as i32], &comments);
        }
        for (i, e) in file.enum_type.iter().enumerate() {
            enum_section(&mut body, e, "", &[5, i as i32], &comments);
        }
        pages.push(Page { file: page, title: file.name().to_string(), body });
    }
    pages.insert(0, Page { file: "proto.md".to_string(), title: "Protobuf messages".to_string(), body: index });
    pages
}

fn message_section(
    out: &mut String,
    message: &DescriptorProto,
    outer: &str,
    path: &[i32],
    comments: &BTreeMap<Vec<i32>, String>,
) {
    if message.options.as_ref().is_some_and(|o| o.map_entry()) {
        return;
    }
    let name = format!("{outer}{}", message.name());
    writeln!(out, "### {name}\n").unwrap();
    if let Some(c) = comments.get(path) {
        writeln!(out, "{}\n", escape_text(c)).unwrap();
    }
    if message.field.is_empty() {
        writeln!(out, "No fields.\n").unwrap();
    } else {
        writeln!(out, "| field | number | type | what it is |").unwrap();
        writeln!(out, "| --- | --- | --- | --- |").unwrap();
        for (j, field) in message.field.iter().enumerate() {
            let mut field_path = path.to_vec();
            field_path.extend([2, j as i32]);
            let mut what = comments.get(&field_path).cloned().unwrap_or_default();
            if let Some(oneof) = field.oneof_index.filter(|_| !field.proto3_optional()) {
                let group = message.oneof_decl.get(oneof as usize).map(|o| o.name()).unwrap_or_default();
                what = format!("{what} (one of `{group}`)").trim().to_string();
            }
            writeln!(
                out,
                "| `{}` | {} | {} | {} |",
                field.name(),
                field.number(),
                field_type(message, field),
                escape_cell(&what)
            )
            .unwrap();
        }
        writeln!(out).unwrap();
    }
    for (j, nested) in message.nested_type.iter().enumerate() {
        let mut nested_path = path.to_vec();
        nested_path.extend([3, j as i32]);
        message_section(out, nested, &format!("{name}."), &nested_path, comments);
    }
    for (j, e) in message.enum_type.iter().enumerate() {
        let mut enum_path = path.to_vec();
        enum_path.extend([4, j as i32]);
        enum_section(out, e, &format!("{name}."), &enum_path, comments);
    }
}

fn enum_section(
    out: &mut String,
    e: &EnumDescriptorProto,
    outer: &str,
    path: &[i32],
    comments: &BTreeMap<Vec<i32>, String>,
) {
    let name = format!("{outer}{}", e.name());
    writeln!(out, "### {name}\n").unwrap();
    if let Some(c) = comments.get(path) {
        writeln!(out, "{}\n", escape_text(c)).unwrap();
    }
    writeln!(out, "| value | number | what it is |").unwrap();
    writeln!(out, "| --- | --- | --- |").unwrap();
    for (j, v) in e.value.iter().enumerate() {
        let mut value_path = path.to_vec();
        value_path.extend([2, j as i32]);
        let what = comments.get(&value_path).cloned().unwrap_or_default();
        writeln!(out, "| `{}` | {} | {} |", v.name(), v.number(), escape_cell(&what)).unwrap();
    }
    writeln!(out).unwrap();
}

/// A field's type as the .proto says it, a message or enum of this package linked to its section.
fn field_type(message: &DescriptorProto, field: &prost_types::FieldDescriptorProto) -> String {
    let named = |type_name: &str| -> String {
        match type_name.strip_prefix(&format!(".{PACKAGE}.")) {
            // From a file's page, its sibling pages are in the same directory.
            Some(local) => match PAGES.get(local) {
                Some(page) => format!("[`{local}`]({}#{})", page.trim_start_matches("proto/"), slug(local)),
                None => format!("`{local}`"),
            },
            None => format!("`{}`", type_name.trim_start_matches('.')),
        }
    };
    let base = |f: &prost_types::FieldDescriptorProto| -> String {
        match f.r#type() {
            Type::Message | Type::Enum | Type::Group => named(f.type_name()),
            t => format!("`{}`", t.as_str_name().trim_start_matches("TYPE_").to_lowercase()),
        }
    };
    if field.r#type() == Type::Message {
        let entry_name = field.type_name().rsplit('.').next().unwrap_or_default();
        if let Some(entry) = message
            .nested_type
            .iter()
            .find(|n| n.name() == entry_name && n.options.as_ref().is_some_and(|o| o.map_entry()))
        {
            let (k, v) = (&entry.field[0], &entry.field[1]);
            return format!("map of {} to {}", base(k), base(v));
        }
    }
    match field.label() {
        Label::Repeated => format!("repeated {}", base(field)),
        _ if field.proto3_optional() => format!("optional {}", base(field)),
        _ => base(field),
    }
}
