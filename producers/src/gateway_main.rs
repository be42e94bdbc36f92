//! The `landfall-gateway` program: one site's gateway on its own.

fn main() -> std::process::ExitCode {
    producers::gateway_main()
}
