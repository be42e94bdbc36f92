//! How a command prints what it reads: `-o table|json|yaml`, and JSON or YAML documents and
//! streams on stdout.

use clap::ValueEnum;
use serde_json::Value;

/// How a command prints what it reads: `-o table|json|yaml`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// For people: tables and lines (`text` is accepted too).
    #[value(alias = "text")]
    Table,
    /// For programs: JSON (one object per line when following events).
    Json,
    /// For people and programs: YAML (one document per event when following events).
    Yaml,
}

/// Prints a document as `-o json` (pretty) or `-o yaml` asks.
///
/// # Errors
/// When the value cannot be written as YAML (it always can be as JSON).
pub fn emit(format: Format, v: &Value) -> anyhow::Result<()> {
    match format {
        Format::Yaml => print!("{}", serde_saphyr::to_string(v)?),
        _ => println!("{}", serde_json::to_string_pretty(v)?),
    }
    Ok(())
}

/// Prints one item of a stream: a JSON line, or a YAML document of its own.
///
/// # Errors
/// As [`emit`].
pub fn emit_line(format: Format, v: &Value) -> anyhow::Result<()> {
    match format {
        Format::Yaml => print!("---\n{}", serde_saphyr::to_string(v)?),
        _ => println!("{v}"),
    }
    Ok(())
}
