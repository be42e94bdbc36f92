//! The `landfall` program.

/// mimalloc, not the system's allocator: the services and gateways make and drop many small
/// buffers per message, and glibc's malloc spent two fifths of their CPU doing it (its free
/// lists consolidated again and again) in a rollout over 10,000 sites (docs/src/benchmarks.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    producers::main()
}
