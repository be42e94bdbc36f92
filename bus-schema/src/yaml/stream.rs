//! A YAML stream split into its documents, each read on its own with the positions of the whole
//! source; tags and the unquoted numbers YAML readers disagree on are found, with their field
//! path, before any document is read.

use serde::de::DeserializeOwned;
use serde_saphyr::granit_parser::{Event, Marker, Parser, ScalarStyle, Span, Tag};
use serde_saphyr::{DuplicateKeyPolicy, MergeKeyPolicy, NonFiniteFloatPolicy};

use super::{Error, Shapes, options, read};

/// One document of a stream: its text, where it begins, and what [`documents`] found wrong in it.
#[derive(Debug, Clone)]
pub struct Document<'a> {
    /// The document's text, from the end of the one before it (so with its directives).
    text: &'a str,
    /// Where `text` begins: line from 1, column from 0.
    origin: (u64, u64),
    /// Where the document itself begins (its `---`, or its first node): line and column from 1.
    start: (u64, u64),
    /// The first tag, or number that YAML readers disagree on, the document writes.
    refused: Option<Error>,
    /// What starts where: each sequence and mapping by position (line and column from 1).
    shapes: Shapes,
}

impl Document<'_> {
    /// Reads the document as a `T` (a null `T`, e.g. `Option`, for an empty document).
    ///
    /// # Errors
    /// As [`super::from_str`], with the lines and columns of the whole stream.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, Error> {
        match &self.refused {
            Some(error) => Err(error.clone()),
            None => read(self.text, self.origin, options(), &self.shapes),
        }
    }

    /// Reads the document leniently, to learn what it says it is before reading it: tags are
    /// dropped, a key given twice counts once, `<<` is an ordinary key, `.inf` is text. Never
    /// for its content, which [`Document::parse`] reads.
    pub(crate) fn skim<T: DeserializeOwned>(&self) -> Result<T, Error> {
        let mut lenient = options();
        lenient.reject_unsupported_tags = false;
        lenient.duplicate_keys = DuplicateKeyPolicy::FirstWins;
        lenient.merge_keys = MergeKeyPolicy::AsOrdinary;
        lenient.non_finite_float_policy = NonFiniteFloatPolicy::AsString;
        read(self.text, self.origin, lenient, &self.shapes)
    }

    /// Where the document begins: line and column from 1.
    pub fn start(&self) -> (u64, u64) {
        self.start
    }
}

/// The documents of a `---` stream, in order, empty ones included (so the n-th entry is the
/// stream's n-th document). A syntax error is the last entry: nothing after it can be read.
pub fn documents(text: &str) -> Vec<Result<Document<'_>, Error>> {
    let mut out = Vec::new();
    let mut walk = Walk::default();
    let (mut from, mut origin) = (0, (1, 0));
    let mut start = (1, 1);
    for event in Parser::new_from_str(text) {
        let (event, span) = match event {
            Ok(event) => event,
            Err(e) => {
                let at = Some(position(e.marker()));
                out.push(Err(Error { field: String::new(), reason: e.info().to_string(), at }));
                break;
            }
        };
        match event {
            Event::DocumentStart(..) => {
                walk = Walk::default();
                start = position(&span.start);
            }
            Event::DocumentEnd => {
                let to = offset(text, &span.end);
                let text = &text[from..to];
                let (refused, shapes) = (walk.refused.take(), std::mem::take(&mut walk.shapes));
                out.push(Ok(Document { text, origin, start, refused, shapes }));
                from = to;
                origin = (span.end.line() as u64, span.end.col() as u64);
            }
            other => walk.event(&other, &span),
        }
    }
    out
}

/// A marker as a line and column from 1.
fn position(marker: &Marker) -> (u64, u64) {
    (marker.line() as u64, marker.col() as u64 + 1)
}

/// A marker's byte offset in `text`.
fn offset(text: &str, marker: &Marker) -> usize {
    marker.byte_offset().unwrap_or_else(|| text.char_indices().nth(marker.index()).map_or(text.len(), |(at, _)| at))
}

/// Follows a document's nodes to know the field path of each, refusing the first tag or unquoted
/// number that YAML readers disagree on, and notes where each collection starts.
#[derive(Default)]
struct Walk {
    /// The open collections, outermost first.
    open: Vec<Open>,
    refused: Option<Error>,
    shapes: Shapes,
}

/// An open collection and where in it the next node goes.
enum Open {
    /// A mapping: the key of the value being read, or `None` when a key comes next.
    Map(Option<String>),
    /// A sequence: the index of the next item.
    Seq(usize),
}

impl Walk {
    fn event(&mut self, event: &Event<'_>, span: &Span) {
        // A tag is refused where it is written, before the node it is on.
        let at = span.tag_start.as_ref().unwrap_or(&span.start);
        match event {
            Event::Scalar(value, style, _, tag) => {
                if let Some(tag) = tag {
                    self.check_tag(tag, at);
                } else if *style == ScalarStyle::Plain
                    && let Some(why) = disputed_number(value)
                {
                    self.refuse(format!("unquoted {value} {why}: write it in quotes for text"), at);
                }
                self.node_done(Some(value));
            }
            Event::Alias(_) => self.node_done(None),
            Event::SequenceStart(_, _, tag) | Event::MappingStart(_, _, tag) => {
                if let Some(tag) = tag {
                    self.check_tag(tag, at);
                }
                let sequence = matches!(event, Event::SequenceStart(..));
                self.shapes.insert(position(&span.start), if sequence { "sequence" } else { "map" });
                self.open.push(if sequence { Open::Seq(0) } else { Open::Map(None) });
            }
            Event::SequenceEnd | Event::MappingEnd => {
                self.open.pop();
                self.node_done(None);
            }
            _ => {}
        }
    }

    /// Refuses a tag other than the standard ones (`!!str`) and the bare `!`: an unquoted
    /// `!name` is a tag, and would otherwise change what its node reads as without a word.
    fn check_tag(&mut self, tag: &Tag, at: &Marker) {
        let bare = tag.handle().is_empty() && tag.suffix() == "!";
        if !tag.is_yaml_core_schema() && !bare {
            self.refuse(super::tag_reason(&tag.to_string()), at);
        }
    }

    /// Refuses the document for the node at `at`, unless it is refused already. A sequence's
    /// own item is named by its number, as list errors are: `interfaces: item 2: …`.
    fn refuse(&mut self, reason: String, at: &Marker) {
        if self.refused.is_some() {
            return;
        }
        let (field, reason) = match self.open.split_last() {
            Some((Open::Seq(index), outer)) => (path(outer), format!("item {}: {reason}", index + 1)),
            _ => (path(&self.open), reason),
        };
        self.refused = Some(Error { field, reason, at: Some(position(at)) });
    }

    /// A node ends: it was a key (`text` names it), a mapping's value, or a sequence's item.
    fn node_done(&mut self, text: Option<&str>) {
        match self.open.last_mut() {
            Some(Open::Map(key @ None)) => *key = Some(text.unwrap_or("?").to_string()),
            Some(Open::Map(key)) => *key = None,
            Some(Open::Seq(index)) => *index += 1,
            None => {}
        }
    }
}

/// The field path of the node read next in `open`, as serde names it: `networks[0].cidr`.
fn path(open: &[Open]) -> String {
    let mut path = String::new();
    for open in open {
        match open {
            Open::Seq(index) => path.push_str(&format!("[{index}]")),
            Open::Map(Some(key)) => super::push_key(&mut path, key),
            // A key being read: the mapping is the field.
            Open::Map(None) => {}
        }
    }
    path
}

/// Why an unquoted scalar is a number that YAML readers disagree on, if it is one: this reader
/// takes `0X1F` and `0O17` as numbers where the YAML 1.2 core schema has text, and an integer
/// beyond 64 bits as an approximate float where others refuse it.
fn disputed_number(text: &str) -> Option<&'static str> {
    const TOO_BIG: &str = "is beyond a 64-bit integer";
    let negative = text.starts_with('-');
    let unsigned = text.strip_prefix(['-', '+']).unwrap_or(text);
    let fits = |digits: &str, base: u32| {
        if negative {
            i64::from_str_radix(&format!("-{digits}"), base).is_ok()
        } else {
            u64::from_str_radix(digits, base).is_ok()
        }
    };
    let prefixed = [("0x", 16), ("0o", 8), ("0b", 2)].into_iter().find_map(|(prefix, base)| {
        let written = unsigned.get(..2).filter(|p| p.eq_ignore_ascii_case(prefix))?;
        Some((written, &unsigned[2..], base))
    });
    match prefixed {
        Some((written, digits, base)) if !digits.is_empty() && digits.chars().all(|c| c.is_digit(base)) => {
            if written.as_bytes()[1].is_ascii_uppercase() {
                Some("has an upper-case radix prefix, which not every YAML reader takes for a number")
            } else {
                (!fits(digits, base)).then_some(TOO_BIG)
            }
        }
        Some(_) => None,
        None => {
            let decimal = !unsigned.is_empty() && unsigned.bytes().all(|b| b.is_ascii_digit());
            let leading_zero = unsigned.len() > 1 && unsigned.starts_with('0');
            (decimal && !leading_zero && !fits(unsigned, 10)).then_some(TOO_BIG)
        }
    }
}
