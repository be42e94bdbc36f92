//! The metrics and alerts reference: every metric the services record (each
//! `metrics::counter!`, `gauge!` and `histogram!` with a literal name in the crates' sources,
//! outside their unit tests), its labels, where it is recorded, and the help text its
//! `describe_*!` gives; then every recording and alerting rule of
//! `deploy/observability/rules.yml`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{Page, escape_cell, escape_text, one_line};

/// The crates whose sources record metrics.
const SOURCES: &[&str] = &["bus-schema/src", "consumers/src", "site-gateway/src", "producers/src"];
const RULES: &str = "deploy/observability/rules.yml";

/// One metric, as the sources record and describe it.
#[derive(Debug, Default)]
pub struct Metric {
    pub kinds: BTreeSet<&'static str>,
    pub labels: BTreeSet<String>,
    pub files: BTreeSet<String>,
    pub help: Option<String>,
}

/// Every metric with a literal name, by name.
pub fn metrics(root: &Path) -> BTreeMap<String, Metric> {
    let mut out: BTreeMap<String, Metric> = BTreeMap::new();
    for file in rust_files(root) {
        let text = std::fs::read_to_string(&file).expect("read a source file");
        let text = without_unit_tests(&text);
        let rel = file.strip_prefix(root).unwrap_or(&file).display().to_string();
        for kind in ["counter", "gauge", "histogram"] {
            for args in macro_args(text, &format!("metrics::{kind}!(")) {
                let Some(name) =
                    string_literals(args).into_iter().next().filter(|_| args.trim_start().starts_with('"'))
                else {
                    continue;
                };
                let m = out.entry(name).or_default();
                m.kinds.insert(kind);
                m.files.insert(rel.clone());
                m.labels.extend(labels(args));
            }
        }
    }
    for file in rust_files(root) {
        let text = std::fs::read_to_string(&file).expect("read a source file");
        for kind in ["describe_counter", "describe_gauge", "describe_histogram"] {
            for args in macro_args(&text, &format!("{kind}!(")) {
                let strings = string_literals(args);
                if let (Some(name), Some(help), true) = (strings.first(), strings.last(), strings.len() >= 2)
                    && let Some(m) = out.get_mut(name)
                {
                    m.help = Some(one_line(help));
                }
            }
        }
    }
    out
}

/// Metrics recorded without a `describe_*!` (their `/metrics` has no HELP line).
pub fn undescribed(root: &Path) -> Vec<String> {
    metrics(root).into_iter().filter(|(_, m)| m.help.is_none()).map(|(n, _)| n).collect()
}

fn rust_files(root: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
                if name != "tests.rs" && !name.ends_with("_tests.rs") {
                    out.push(p);
                }
            }
        }
    }
    let mut out = Vec::new();
    for s in SOURCES {
        walk(&root.join(s), &mut out);
    }
    out.sort();
    out
}

/// A file up to its unit tests (`#[cfg(test)]` then `mod tests`), which record made-up metrics.
fn without_unit_tests(text: &str) -> &str {
    let mut at = 0;
    while let Some(i) = text[at..].find("#[cfg(test)]") {
        let start = at + i;
        if text[start..].trim_start_matches("#[cfg(test)]").trim_start().starts_with("mod tests") {
            return &text[..start];
        }
        at = start + 1;
    }
    text
}

/// The argument text of every call of `open` (which ends with its `(`), up to the matching `)`.
fn macro_args<'a>(text: &'a str, open: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = text[from..].find(open) {
        let start = from + i + open.len();
        let (mut depth, mut in_str, mut escaped) = (1, false, false);
        let mut end = start;
        for (j, c) in text[start..].char_indices() {
            match (in_str, c) {
                (true, _) if escaped => escaped = false,
                (true, '\\') => escaped = true,
                (true, '"') => in_str = false,
                (true, _) => {}
                (false, '"') => in_str = true,
                (false, '(') => depth += 1,
                (false, ')') => {
                    depth -= 1;
                    if depth == 0 {
                        end = start + j;
                        break;
                    }
                }
                _ => {}
            }
        }
        out.push(&text[start..end]);
        from = end.max(start);
    }
    out
}

/// The string literals in `args`, unescaped (a `\` at a line's end joins it to the next).
fn string_literals(args: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = args.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut s = String::new();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => match chars.next() {
                    Some('\n') => {
                        while chars.peek().is_some_and(|c| c.is_whitespace()) {
                            chars.next();
                        }
                    }
                    Some('n') => s.push('\n'),
                    Some(other) => s.push(other),
                    None => {}
                },
                c => s.push(c),
            }
        }
        out.push(s);
    }
    out
}

/// The label names of a call: each `"name" =>`.
fn labels(args: &str) -> Vec<String> {
    args.split("=>")
        .collect::<Vec<_>>()
        .split_last()
        .map(|(_, before)| before.iter().filter_map(|b| string_literals(b).pop()).collect())
        .unwrap_or_default()
}

#[derive(Debug, Deserialize)]
struct Rules {
    groups: Vec<Group>,
}

#[derive(Debug, Deserialize)]
struct Group {
    name: String,
    rules: Vec<Rule>,
}

#[derive(Debug, Deserialize)]
struct Rule {
    record: Option<String>,
    alert: Option<String>,
    expr: String,
    #[serde(rename = "for")]
    pending: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

pub fn page(root: &Path) -> Page {
    let mut out = String::new();
    writeln!(
        out,
        "Every service serves these on `/metrics` when given `--metrics-listen ADDR` (`landfall up` also on \
         the API's `/metrics`). [Operate](../howto/operate.md) says what to scrape, and what to do when \
         an alert fires.\n"
    )
    .unwrap();
    writeln!(out, "## Metrics\n").unwrap();
    writeln!(out, "| metric | type | labels | what it counts | recorded in |").unwrap();
    writeln!(out, "| --- | --- | --- | --- | --- |").unwrap();
    for (name, m) in metrics(root) {
        let kinds: Vec<&str> = m.kinds.iter().copied().collect();
        let labels: Vec<String> = m.labels.iter().map(|l| format!("`{l}`")).collect();
        let files: Vec<String> = m.files.iter().map(|f| format!("`{f}`")).collect();
        writeln!(
            out,
            "| `{name}` | {} | {} | {} | {} |",
            kinds.join(", "),
            labels.join(", "),
            escape_cell(m.help.as_deref().unwrap_or("")),
            files.join(", ")
        )
        .unwrap();
    }
    writeln!(out).unwrap();

    let text = std::fs::read_to_string(root.join(RULES)).expect("read the alert rules");
    let rules: Rules = serde_saphyr::from_str(&text).expect("the alert rules are YAML");
    writeln!(out, "## Rules\n").unwrap();
    writeln!(out, "From `{RULES}`.\n").unwrap();
    for group in &rules.groups {
        writeln!(out, "### {}\n", group.name).unwrap();
        let recording: Vec<&Rule> = group.rules.iter().filter(|r| r.record.is_some()).collect();
        if !recording.is_empty() {
            writeln!(out, "| recorded series | expression |").unwrap();
            writeln!(out, "| --- | --- |").unwrap();
            for r in recording {
                writeln!(out, "| `{}` | `{}` |", r.record.as_deref().unwrap_or(""), escape_cell(&one_line(&r.expr)))
                    .unwrap();
            }
            writeln!(out).unwrap();
        }
        for r in group.rules.iter().filter(|r| r.alert.is_some()) {
            writeln!(out, "#### {}\n", r.alert.as_deref().unwrap_or("")).unwrap();
            if let Some(summary) = r.annotations.get("summary") {
                writeln!(out, "{}\n", escape_text(&one_line(summary))).unwrap();
            }
            let mut facts = Vec::new();
            if let Some(severity) = r.labels.get("severity") {
                facts.push(format!("severity `{severity}`"));
            }
            if let Some(pending) = &r.pending {
                facts.push(format!("fires after `{pending}`"));
            }
            if !facts.is_empty() {
                writeln!(out, "{}.\n", facts.join(", ")).unwrap();
            }
            writeln!(out, "```promql\n{}\n```\n", r.expr.trim()).unwrap();
            if let Some(runbook) = r.annotations.get("runbook") {
                writeln!(out, "What to do: {}\n", escape_text(&one_line(runbook))).unwrap();
            }
        }
    }
    Page { file: "metrics.md".to_string(), title: "Metrics and alerts".to_string(), body: out }
}
