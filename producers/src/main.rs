//! The `landfall` program.

fn main() -> std::process::ExitCode {
    producers::main()
}
