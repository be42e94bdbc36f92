//! The book's reference pages (`docs/src/reference/*.md`), generated from the code: every
//! command and flag ([`cli`]), protobuf message and field ([`proto`]), NATS subject, stream,
//! bucket and header ([`subjects`]), HTTP path ([`http`]), metric and alert rule ([`metrics`]).
//!
//! `cargo run -p landfall-tests --bin landfall-docs -- --out docs/src/reference` writes them;
//! `tests/tests/reference.rs` fails when a checked-in page differs from what this makes.

pub mod cli;
pub mod http;
pub mod metrics;
pub mod proto;
pub mod subjects;

use std::path::{Path, PathBuf};

/// The command that writes the pages, as each page's header names it.
pub const REGENERATE: &str = "cargo run -p landfall-tests --bin landfall-docs -- --out docs/src/reference";

/// Where the checked-in pages are, from the workspace root.
pub const PAGES_DIR: &str = "docs/src/reference";

/// One generated page.
pub struct Page {
    /// The file, relative to the reference directory (`cli.md`, `cli/site.md`).
    pub file: String,
    pub title: String,
    pub body: String,
}

impl Page {
    /// The page as written: its title, the line saying it is generated, its body.
    pub fn text(&self) -> String {
        format!(
            "# {}\n\n> Generated from the code by `{REGENERATE}`: do not edit by hand. The tests fail when this page \
             differs from what the code says.\n\n{}",
            self.title,
            self.body.trim_end().to_string() + "\n"
        )
    }
}

/// The workspace's root (the source files the metrics page reads are under it).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the tests crate is in the workspace").to_path_buf()
}

/// Every page, made from the code.
pub fn pages() -> Vec<Page> {
    let root = repo();
    let mut pages = cli::pages();
    pages.extend(proto::pages());
    pages.extend([subjects::page(&root), http::page(), metrics::page(&root)]);
    pages
}

/// Writes every page into `dir` (made if missing), and returns the files written.
pub fn write(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    for page in pages() {
        let path = dir.join(&page.file);
        std::fs::create_dir_all(path.parent().unwrap_or(dir))?;
        std::fs::write(&path, page.text())?;
        written.push(path);
    }
    Ok(written)
}

/// The anchor mdBook (and GitHub) gives a heading: lowercase, letters, digits, `-` and `_`
/// kept, spaces made `-`, everything else dropped.
pub fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Text made safe for a table cell: `|` escaped, line breaks joined, and `<` outside code spans
/// written as an entity so Markdown does not take it for HTML.
pub fn escape_cell(text: &str) -> String {
    escape(&one_line(text), true)
}

/// Prose made safe for a page: `<` outside code spans written as an entity.
pub fn escape_text(text: &str) -> String {
    escape(text, false)
}

fn escape(text: &str, cell: bool) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_code = false;
    for c in text.chars() {
        match c {
            '`' => {
                in_code = !in_code;
                out.push(c);
            }
            '|' if cell => out.push_str("\\|"),
            '<' if !in_code => out.push_str("&lt;"),
            _ => out.push(c),
        }
    }
    out
}

/// Free text (a comment or a description) as one line.
pub fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
