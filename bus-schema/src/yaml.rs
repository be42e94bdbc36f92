//! Reading YAML that people write — designs, site and token files, package manifests — under
//! one set of rules, with errors that say where: the field path, the line and the column.
//!
//! The rules ([`options`]):
//! - Only the YAML 1.2 core schema's spellings are typed: `true`/`false` (not `yes`, `on`), `~`
//!   and `null`; `012` and `1_000` stay text. `.inf` and `.nan` are refused.
//! - Tags are refused, except the standard ones (`!!str`) and the bare `!`: an unquoted `!name`
//!   is a YAML tag, which would otherwise change what the value reads as without a word.
//! - A key given twice is refused, and so is a merge key (`<<`).
//! - An unquoted number that YAML readers disagree on — an upper-case radix prefix (`0X1F`), an
//!   integer beyond 64 bits — is refused: quote it for text.
//! - Limits hold for aliases (alias bombs), nesting, events and scalar bytes.
//!
//! [`documents`] splits a `---` stream into its documents, each read on its own with the lines
//! and columns of the whole source.

mod stream;

use std::collections::BTreeMap;
use std::fmt;

use serde::de::DeserializeOwned;
use serde_saphyr::{MergeKeyPolicy, NonFiniteFloatPolicy, Options};

pub use stream::{Document, documents};

/// Why YAML was refused, and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Error {
    /// The field path as written in YAML, e.g. `networks[0].cidr`; empty for the document as a
    /// whole (its syntax, an unknown top-level field).
    pub field: String,
    /// Why, without the position.
    pub reason: String,
    /// Line and column in the whole source, from 1, when known.
    pub at: Option<(u64, u64)>,
}

impl Error {
    /// The reason with its position, e.g. `invalid type: … (line 20, column 7)`.
    pub fn reason_at(&self) -> String {
        match self.at {
            Some((line, column)) => format!("{} (line {line}, column {column})", self.reason),
            None => self.reason.clone(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        f.write_str(&self.reason_at())
    }
}

/// The rules every reader of people's YAML applies (see the module documentation).
pub fn options() -> Options {
    serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_aliases: 10_000,
            max_anchors: 10_000,
        },
        alias_limits: serde_saphyr::alias_limits! {
            max_total_replayed_events: 100_000,
            max_replay_stack_depth: 16,
        },
        emit_comments: false,
        merge_keys: MergeKeyPolicy::Error,
        strict_booleans: true,
        leading_zero_numbers_as_strings: true,
        underscored_numbers_as_strings: true,
        non_finite_float_policy: NonFiniteFloatPolicy::Reject,
        reject_unsupported_tags: true,
        with_snippet: false,
    }
}

/// Reads `text`, a single YAML document, as a `T`.
///
/// # Errors
/// YAML that breaks a rule or does not fit `T`, with the field, line and column; more than one
/// document.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, Error> {
    let mut documents = documents(text).into_iter();
    let first = documents.next().transpose()?;
    if let Some(second) = documents.next() {
        let second = second?;
        let reason = "a second YAML document starts here; one is expected".to_string();
        return Err(Error { field: String::new(), reason, at: Some(second.start()) });
    }
    match first {
        Some(document) => document.parse(),
        None => read(text, (1, 0), options(), &Shapes::new()),
    }
}

/// Where each sequence and mapping of a document starts (line and column from 1), to say what
/// was found where a scalar was expected.
type Shapes = BTreeMap<(u64, u64), &'static str>;

/// Reads `text` as a `T` under `options`; `start` is where `text` begins in its source (line
/// from 1, column from 0), so that positions are those of the whole source.
fn read<T: DeserializeOwned>(text: &str, start: (u64, u64), options: Options, shapes: &Shapes) -> Result<T, Error> {
    let mut path = None;
    let read = serde_saphyr::with_deserializer_from_str_with_options(text, options, |de| {
        serde_path_to_error::deserialize(de).map_err(|e| {
            path = Some(e.path().clone());
            e.into_inner()
        })
    });
    read.map_err(|e| error(&e, path.as_ref(), start, shapes))
}

/// A serde-saphyr error as an [`Error`]: the field from the path, the position moved from the
/// message into `at` and shifted to the whole source.
fn error(
    e: &serde_saphyr::Error,
    path: Option<&serde_path_to_error::Path>,
    start: (u64, u64),
    shapes: &Shapes,
) -> Error {
    let e = e.without_snippet();
    let at = e.location().filter(|l| l.line() > 0).map(|l| (l.line(), l.column()));
    let mut reason = e.to_string();
    if let Some((line, column)) = at {
        reason = reason.strip_suffix(&format!(" at line {line}, column {column}")).unwrap_or(&reason).to_string();
    }
    let at = at.map(|(line, column)| shift(start, line, column));
    match e {
        serde_saphyr::Error::UnsupportedTag { tag, .. } => reason = tag_reason(tag),
        // A collection where a scalar goes: say which, as serde does.
        serde_saphyr::Error::Unexpected { expected: expected @ ("string scalar" | "scalar"), .. } => {
            if let Some(found) = at.and_then(|at| shapes.get(&at)) {
                let expected = if *expected == "scalar" { "a scalar" } else { "a string" };
                reason = format!("invalid type: {found}, expected {expected}");
            }
        }
        _ => {}
    }
    // An unknown field is the fault of the mapping that holds it, as field paths name it.
    let unknown_field = matches!(e, serde_saphyr::Error::SerdeUnknownField { .. });
    let field = path.map(|p| field_path(p, unknown_field)).unwrap_or_default();
    Error { field, reason, at }
}

/// Why a tag is refused, with how to write text that starts with `!`.
fn tag_reason(tag: &str) -> String {
    format!(
        "{tag} is read as a YAML tag, which is not supported here; write '{tag}' in quotes for text that starts \
         with '!' (e.g. a '!name' removal)"
    )
}

/// `(line, column)` of a text that begins at `start` (line from 1, column from 0), in the whole
/// source: lines move by the lines before it, columns of its first line by its start column.
fn shift(start: (u64, u64), line: u64, column: u64) -> (u64, u64) {
    let (start_line, start_column) = start;
    (line + start_line - 1, if line == 1 { column + start_column } else { column })
}

/// A serde path as YAML field paths are written: `networks[0].cidr`. Segments that name no
/// field (a key being read) are left out, and so is the last one when `drop_last`.
fn field_path(path: &serde_path_to_error::Path, drop_last: bool) -> String {
    use serde_path_to_error::Segment;
    let mut segments: Vec<&Segment> = path.iter().collect();
    while matches!(segments.last(), Some(Segment::Unknown)) {
        segments.pop();
    }
    if drop_last {
        segments.pop();
    }
    let mut field = String::new();
    for segment in segments {
        match segment {
            Segment::Seq { index } => field.push_str(&format!("[{index}]")),
            Segment::Map { key } => push_key(&mut field, key),
            Segment::Enum { variant } => push_key(&mut field, variant),
            Segment::Unknown => push_key(&mut field, "?"),
        }
    }
    field
}

/// Appends `.key` to a field path (`key` alone at its start).
fn push_key(field: &mut String, key: &str) {
    if !field.is_empty() {
        field.push('.');
    }
    field.push_str(key);
}

#[cfg(test)]
mod tests;
