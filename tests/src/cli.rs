//! Running the real `landfall` binary (built by this crate as `landfall-cli`) against a test server.

use std::path::PathBuf;
use std::process::Output;

/// The `landfall-cli` binary: where cargo says it is, else beside the running test binary
/// (`target/<profile>/deps/<test>` → `target/<profile>/landfall-cli`).
pub fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os("CARGO_BIN_EXE_landfall-cli") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>/deps/<test>");
    profile_dir.join("landfall-cli")
}

/// Runs `landfall ARGS` with `NATS_URL=url` and waits for it.
pub async fn landfall(url: &str, args: &[&str]) -> Output {
    tokio::process::Command::new(binary())
        .args(args)
        .env("NATS_URL", url)
        .env_remove("RUST_LOG")
        .output()
        .await
        .expect("run landfall")
}

/// Runs `landfall ARGS` with `NATS_URL=url` and these environment variables (a value of `None`
/// removes the variable), and waits for it.
pub async fn landfall_with(url: &str, env: &[(&str, Option<&str>)], args: &[&str]) -> Output {
    let mut command = tokio::process::Command::new(binary());
    command.args(args).env("NATS_URL", url).env_remove("RUST_LOG");
    for (name, value) in env {
        match value {
            Some(value) => command.env(name, value),
            None => command.env_remove(name),
        };
    }
    command.output().await.expect("run landfall")
}

/// Output bytes as text.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}
