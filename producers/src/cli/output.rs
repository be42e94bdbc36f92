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

#[cfg(test)]
mod tests {
    use serde_json::json;

    /// What `-o yaml` prints reads back as the same value, text that looks like something else
    /// included (quoted where it must be).
    #[test]
    fn yaml_output_reads_back_equal() {
        let texts = [
            "",
            "yes",
            "no",
            "on",
            "~",
            "null",
            "true",
            "1",
            "1.50",
            "0x1F",
            "0X1F",
            "012",
            "1_000",
            ".inf",
            "!eno2",
            "!",
            "&a",
            "*a",
            "- a",
            "a: b",
            "a #b",
            "#x",
            "'q'",
            "multi\nline",
            "trail\n",
            " lead",
            "%x",
            "@x",
            "{x}",
            "[x]",
            "--- x",
            "...",
            "2024-01-01",
            "18446744073709551616",
            "1.29.1+k3s1",
        ];
        for text in texts {
            let value = json!({ "k": text, text: [text, { "n": text }] });
            let printed = serde_saphyr::to_string(&value).unwrap();
            let back: serde_json::Value =
                bus_schema::yaml::from_str(&printed).unwrap_or_else(|e| panic!("{text:?}: {e}\n{printed}"));
            assert_eq!(back, value, "{text:?}:\n{printed}");
        }
        let value =
            json!([{ "a": 1, "b": [], "c": {}, "d": null, "e": true, "f": 1.5, "g": -3, "h": [[2, 3], { "x": "y" }] }]);
        let printed = format!("---\n{}", serde_saphyr::to_string(&value).unwrap());
        assert_eq!(bus_schema::yaml::from_str::<serde_json::Value>(&printed).unwrap(), value, "{printed}");
    }
}
