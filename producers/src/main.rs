//! The `landfall` program.

/// mimalloc, not the system's allocator: the services and gateways make and drop many small
/// buffers per message, and in a rollout over 10,000 sites glibc's malloc took two fifths of the
/// services' CPU and a quarter of the gateways' (its free lists consolidated again and again;
/// docs/src/benchmarks.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    producers::main()
}
