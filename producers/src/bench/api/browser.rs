//! The dashboard's first paint, measured in headless Chromium: the `firstpaint` case of the
//! dashboard's browser script (`tests/browser/dashboard.mjs`, compiled in), run by Node.js with
//! playwright-core from `LANDFALL_BROWSER_MODULES` (`scripts/ensure-browser` prints it) and
//! Debian's Chromium. Without them it is not measured, and the answer says why.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};

const SCRIPT: &str = include_str!("../../../../tests/browser/dashboard.mjs");
const CHROMIUM: &str = "/usr/bin/chromium";
/// How long the browser case may take (it loads the page a few times).
const TIMEOUT: Duration = Duration::from_secs(180);
/// What the script prints its measurement after, as one JSON line.
const MARK: &str = "firstpaint: ";

/// Why the browser part cannot run here, if it cannot.
fn missing() -> Option<String> {
    let node = std::process::Command::new("node").arg("--version").output();
    if !node.is_ok_and(|o| o.status.success()) {
        return Some("node is not installed".into());
    }
    if !Path::new(CHROMIUM).exists() {
        return Some(format!("{CHROMIUM} is missing (scripts/ensure-browser installs it)"));
    }
    let Some(modules) = std::env::var_os("LANDFALL_BROWSER_MODULES").filter(|m| !m.is_empty()).map(PathBuf::from)
    else {
        return Some("LANDFALL_BROWSER_MODULES is not set (export it from scripts/ensure-browser)".into());
    };
    if !modules.join("playwright-core").join("package.json").exists() {
        return Some(format!("LANDFALL_BROWSER_MODULES={} holds no playwright-core", modules.display()));
    }
    None
}

/// Runs the `firstpaint` case against the API at `base` with a viewer `token`; its JSON, or
/// `{"measured": false, "why": …}`.
pub(super) async fn first_paint(base: &str, token: &str, sites: usize) -> Value {
    if let Some(why) = missing() {
        return json!({ "measured": false, "why": why });
    }
    match run(base, token, sites).await {
        Ok(v) => v,
        Err(e) => json!({ "measured": false, "why": format!("{e:#}") }),
    }
}

async fn run(base: &str, token: &str, sites: usize) -> anyhow::Result<Value> {
    let dir = std::env::temp_dir().join(format!("landfall-bench-browser-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir)?;
    let script = dir.join("dashboard.mjs");
    std::fs::write(&script, SCRIPT)?;
    let child = tokio::process::Command::new("node")
        .arg(&script)
        .args(["--case", "firstpaint", "--url", base, "--token", token, "--sites", &sites.to_string()])
        .arg("--out")
        .arg(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let output = tokio::time::timeout(TIMEOUT, child.wait_with_output()).await;
    let _ = std::fs::remove_dir_all(&dir);
    let output = output.map_err(|_| anyhow::anyhow!("the browser case did not finish within {TIMEOUT:?}"))??;
    let printed = String::from_utf8_lossy(&output.stdout);
    let found = printed.lines().find_map(|l| l.strip_prefix(MARK));
    match found {
        Some(line) if output.status.success() => {
            let mut v: Value = serde_json::from_str(line)?;
            v["measured"] = json!(true);
            Ok(v)
        }
        _ => {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let tail: Vec<&str> = printed.lines().chain(stderr.lines()).collect();
            anyhow::bail!(
                "the browser case failed ({}): {}",
                output.status,
                tail[tail.len().saturating_sub(8)..].join(" | ")
            )
        }
    }
}
