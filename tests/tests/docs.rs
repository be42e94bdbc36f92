//! The README and the book (`docs/src`) hold together: every relative link reaches a file, and
//! every `#anchor` a heading there; a book page links only to pages of the book (a link out of
//! `docs/src` would be broken in the built book: name such a file in backticks); and every
//! `landfall` or `landfall-gateway` command the pages show in a shell block parses with the real
//! command line.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};
use landfall_tests::reference::{repo, slug};

/// The README and every page of the book.
fn documents() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let root = repo();
    let mut out = vec![root.join("README.md")];
    walk(&root.join("docs/src"), &mut out);
    out.sort();
    out
}

/// The text outside fenced code blocks, with inline code spans blanked: what Markdown reads as
/// prose, where links and headings are.
fn prose(markdown: &str) -> String {
    let mut out = String::new();
    let mut fence: Option<&str> = None;
    for line in markdown.lines() {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(f), Some(m)) if f == m => fence = None,
            (None, None) => {
                let mut in_code = false;
                for c in line.chars() {
                    if c == '`' {
                        in_code = !in_code;
                    }
                    out.push(if in_code || c == '`' { ' ' } else { c });
                }
            }
            _ => {}
        }
        out.push('\n');
    }
    out
}

/// The anchors of a page's headings, as mdBook makes them (a repeated one gets `-1`, `-2`, …).
fn anchors(markdown: &str) -> Vec<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = Vec::new();
    let mut fence = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
            continue;
        }
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if fence || hashes == 0 || hashes > 6 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(&line[hashes..].replace('`', ""));
        let n = seen.entry(base.clone()).or_default();
        out.push(if *n == 0 { base.clone() } else { format!("{base}-{n}") });
        *n += 1;
    }
    out
}

/// Every inline link's target in a page's prose: `[text](target)`.
fn links(markdown: &str) -> Vec<String> {
    let text = prose(markdown);
    let mut out = Vec::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        let end = after.find([')', ' ', '\n']).unwrap_or(after.len());
        out.push(after[..end].to_string());
        rest = &after[end..];
    }
    out
}

/// `path` with `.` and `..` taken out.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

#[test]
fn every_relative_link_and_anchor_in_the_readme_and_the_book_resolves() {
    let root = repo();
    let book = root.join("docs/src");
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        let name = doc.strip_prefix(&root).unwrap().display().to_string();
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = link.split_once('#').map_or((link.as_str(), None), |(p, a)| (p, Some(a)));
            let target = if path.is_empty() { doc.clone() } else { normalize(&doc.parent().unwrap().join(path)) };
            if !target.exists() {
                broken.push(format!("{name}: ({link}): no file {}", target.display()));
                continue;
            }
            if doc.starts_with(&book) && !target.starts_with(&book) {
                broken.push(format!(
                    "{name}: ({link}) leaves the book (docs/src), so the built book cannot follow it: name the file in backticks"
                ));
            }
            if let Some(anchor) = anchor {
                let page = std::fs::read_to_string(&target).unwrap_or_default();
                if !anchors(&page).iter().any(|a| a == anchor) {
                    broken.push(format!(
                        "{name}: ({link}): no heading with the anchor #{anchor} in {}",
                        target.display()
                    ));
                }
            }
        }
    }
    assert!(checked > 100, "only {checked} links found: is the scan broken?");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The words of a shell line, as far as a command goes (quotes grouped; a comment, a pipe or a
/// redirection ends it), with an optional `[...]` part and leading `VAR=value`s left out.
fn words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let (mut word, mut quote, mut any) = (String::new(), None, false);
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                any = true;
            }
            (None, c) if c.is_whitespace() => {
                if any || !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
                any = false;
            }
            (None, c) => word.push(c),
        }
    }
    if any || !word.is_empty() {
        words.push(word);
    }
    let end = words.iter().position(|w| w.starts_with('#') || ["|", ">", "&&", ";", "2>&1"].contains(&w.as_str()));
    words.truncate(end.unwrap_or(words.len()));
    let mut optional = false;
    words.retain(|w| {
        let keep = !optional && !w.starts_with('[');
        if w.starts_with('[') {
            optional = true;
        }
        if w.ends_with(']') {
            optional = false;
        }
        keep
    });
    let first = words.iter().position(|w| !w.contains('=') || w.starts_with('-')).unwrap_or(0);
    words.split_off(first)
}

/// Every command line of a shell block, its continuations joined, with where it is.
fn shell_commands(markdown: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let (mut in_shell, mut pending): (bool, Option<(usize, String)>) = (false, None);
    for (n, line) in markdown.lines().enumerate() {
        let trimmed = line.trim();
        if trimmed.starts_with("```") {
            in_shell = !in_shell && matches!(trimmed, "```sh" | "```bash" | "```shell");
            continue;
        }
        if !in_shell {
            continue;
        }
        let (at, joined) = match pending.take() {
            Some((at, before)) => (at, format!("{before} {trimmed}")),
            None => (n + 1, trimmed.to_string()),
        };
        match joined.strip_suffix('\\') {
            Some(more) => pending = Some((at, more.to_string())),
            None => out.push((at, joined)),
        }
    }
    out
}

#[test]
fn every_landfall_command_the_readme_and_the_book_show_parses() {
    let root = repo();
    let mut failures = Vec::new();
    let mut parsed = 0;
    for doc in documents() {
        let name = doc.strip_prefix(&root).unwrap().display().to_string();
        if name.starts_with("docs/src/reference/") {
            continue; // generated from the command line itself
        }
        let text = std::fs::read_to_string(&doc).unwrap();
        for (line, command) in shell_commands(&text) {
            let mut args = words(&command);
            // `cargo run [-q] [--release] -- ARGS` runs `landfall ARGS` (another package or
            // binary is not landfall).
            if args.first().is_some_and(|w| w == "cargo") && args.get(1).is_some_and(|w| w == "run") {
                let Some(at) = args.iter().position(|w| w == "--") else { continue };
                let other = args[..at].windows(2).any(|w| {
                    ["-p", "--package", "--bin"].contains(&w[0].as_str())
                        && !["producers", "landfall"].contains(&w[1].as_str())
                });
                if other {
                    continue;
                }
                args.splice(..=at, ["landfall".to_string()]);
            }
            let result = match args.first().map(String::as_str) {
                Some("landfall") => producers::Cli::try_parse_from(&args).map(drop),
                // As the program parses: its `identity` commands apart from the gateway's own flags.
                Some("landfall-gateway") => {
                    producers::run::gateway::GatewayCli::command().try_get_matches_from(&args).map(drop)
                }
                _ => continue,
            };
            parsed += 1;
            // `--help` and `--version` parse too: clap answers them with an "error" that prints.
            if let Err(e) = result
                && !matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion)
            {
                let why = e.to_string().lines().next().unwrap_or_default().to_string();
                failures.push(format!("{name}:{line}: `{}`: {why}", args.join(" ")));
            }
        }
    }
    assert!(parsed > 50, "only {parsed} commands found: is the scan broken?");
    assert!(failures.is_empty(), "commands the docs show that landfall does not take:\n{}", failures.join("\n"));
}
