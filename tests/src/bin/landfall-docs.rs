//! Writes the book's reference pages from the code: `cargo run -p landfall-tests --bin
//! landfall-docs -- --out docs/src/reference`. `tests/tests/reference.rs` fails when a
//! checked-in page differs from what this writes.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// Writes docs/src/reference/*.md: every command and flag, protobuf message, NATS subject, HTTP
/// path, metric and alert rule, as the code has them.
#[derive(Debug, Parser)]
#[command(name = "landfall-docs")]
struct Args {
    /// The directory to write the pages into.
    #[arg(long, default_value = landfall_tests::reference::PAGES_DIR)]
    out: PathBuf,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match landfall_tests::reference::write(&args.out) {
        Ok(written) => {
            for path in written {
                println!("{}", path.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("landfall-docs: writing into {}: {e}", args.out.display());
            ExitCode::FAILURE
        }
    }
}
