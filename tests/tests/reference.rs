//! The book's reference pages (`docs/src/reference`) are what the code says: each is generated
//! again here and compared with the checked-in page, so a flag, message, subject, path or metric
//! changed in the code and not in the book fails the test run, with the command that brings the
//! pages up to date.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use landfall_tests::reference::{self, PAGES_DIR, REGENERATE};

/// Every file under `dir`, relative to it.
fn files_under(dir: &Path) -> BTreeSet<PathBuf> {
    fn walk(base: &Path, dir: &Path, out: &mut BTreeSet<PathBuf>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(base, &path, out);
            } else {
                out.insert(path.strip_prefix(base).expect("under the base").to_path_buf());
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(dir, dir, &mut out);
    out
}

/// Where two texts first differ: the line's number and both lines.
fn first_difference(checked_in: &str, generated: &str) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) = (checked_in.lines().collect(), generated.lines().collect());
    let at = a.iter().zip(&b).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()));
    format!(
        "line {}:\n    checked in: {}\n    the code:   {}",
        at + 1,
        a.get(at).unwrap_or(&"(end of the page)"),
        b.get(at).unwrap_or(&"(end of the page)")
    )
}

#[test]
fn the_checked_in_reference_pages_are_what_the_code_says() {
    let generated = tempfile::tempdir().unwrap();
    reference::write(generated.path()).unwrap();
    let checked_in_dir = reference::repo().join(PAGES_DIR);
    let made = files_under(generated.path());
    let there = files_under(&checked_in_dir);
    let mut problems = Vec::new();
    for file in &made {
        let new = std::fs::read_to_string(generated.path().join(file)).unwrap();
        match std::fs::read_to_string(checked_in_dir.join(file)) {
            Err(_) => problems.push(format!("{PAGES_DIR}/{} is missing", file.display())),
            Ok(old) if old != new => problems.push(format!(
                "{PAGES_DIR}/{} differs from the code at {}",
                file.display(),
                first_difference(&old, &new)
            )),
            Ok(_) => {}
        }
    }
    for stale in there.difference(&made) {
        problems.push(format!("{PAGES_DIR}/{} is no longer generated: remove it", stale.display()));
    }
    assert!(
        problems.is_empty(),
        "the reference pages are not what the code says:\n\n{}\n\nRegenerate them with `{REGENERATE}` and commit \
         the result (and list a new page in docs/src/SUMMARY.md).",
        problems.join("\n\n")
    );
}

#[test]
fn every_reference_page_is_in_the_books_summary() {
    let summary = std::fs::read_to_string(reference::repo().join("docs/src/SUMMARY.md")).unwrap();
    let missing: Vec<String> = reference::pages()
        .into_iter()
        .map(|p| format!("(reference/{})", p.file))
        .filter(|link| !summary.contains(link.as_str()))
        .collect();
    assert!(missing.is_empty(), "docs/src/SUMMARY.md does not list these generated pages: {missing:?}");
}

#[test]
fn every_name_in_names_rs_is_on_the_subjects_page() {
    let (missing, unknown) = reference::subjects::unlisted(&reference::repo());
    assert!(
        missing.is_empty(),
        "bus-schema/src/names.rs declares {missing:?}, which the subjects page neither shows nor sets aside: add \
         each to tests/src/reference/subjects.rs (a row of its table, or NOT_NAMES when it names nothing on NATS)"
    );
    assert!(
        unknown.is_empty(),
        "tests/src/reference/subjects.rs names {unknown:?} as items of bus-schema/src/names.rs, which has none of that name"
    );
}

#[test]
fn every_metric_recorded_is_described() {
    let undescribed = reference::metrics::undescribed(&reference::repo());
    assert!(
        undescribed.is_empty(),
        "these metrics are recorded with no describe_*! (no HELP line on /metrics, no description in the book): \
         {undescribed:?}; describe them in producers/src/run/telemetry.rs"
    );
}
