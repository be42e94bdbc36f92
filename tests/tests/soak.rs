//! `landfall bench soak`, tiny: a JSON line per simulated day with what every stream stores, the
//! day's operations all ended well, and a summary of the run; nothing left behind.

use std::time::Duration;

use serde_json::Value;

#[tokio::test]
async fn a_tiny_soak_reports_every_day_and_cleans_up() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tokio::process::Command::new(landfall_tests::cli::binary())
        .args(["bench", "soak", "--sites", "3", "--days", "3", "--day-length", "3s", "--raw-messages", "2000"])
        .args(["--design-revisions", "2"])
        .env("LANDFALL_NATS_SERVER", landfall_tests::nats::binary())
        .env("TMPDIR", tmp.path())
        .env_remove("NATS_URL")
        .env_remove("RUST_LOG")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(240), run).await.expect("the soak ends").expect("run landfall");
    let stdout = landfall_tests::cli::text(&out.stdout);
    let stderr = landfall_tests::cli::text(&out.stderr);
    assert!(out.status.success(), "landfall bench soak failed:\n{stderr}");

    let days: Vec<Value> =
        stdout.lines().filter(|l| l.starts_with("{\"day\"")).map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(days.iter().map(|d| d["day"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 2, 3], "{stdout}");
    for day in &days {
        for stream in ["LANDFALL_COMMANDS", "LANDFALL_EVENTS", "KV_landfall-sagas", "KV_landfall-sites"] {
            assert!(day["streams"][stream]["bytes"].as_u64().unwrap() > 0, "{stream} is empty: {day}");
        }
        assert!(day["site_cache_bytes"].as_u64().unwrap() > 0, "{day}");
        assert!(day["process_rss_bytes"].as_u64().unwrap() > 0, "{day}");
        assert!(day["orchestrator_rss_bytes"].as_u64().unwrap() > 0, "{day}");
        let ops = &day["ops"];
        for part in ["nodes_joined", "designs_changed", "rollout", "installs"] {
            assert!(ops[part]["ok"].as_u64().unwrap() >= 1, "no {part} ended well: {day}");
        }
        for part in ["nodes_joined", "nodes_removed", "designs_changed", "rollout", "installs"] {
            for bad in ["refused", "failed", "timed_out"] {
                assert_eq!(ops[part][bad].as_u64(), Some(0), "{part} {bad}: {day}");
            }
        }
        assert!(ops["nodes_patched"].as_u64().unwrap() > 0, "the rollout patched nothing: {day}");
    }
    // Yesterday's arrivals leave.
    assert_eq!(days[1]["ops"]["nodes_removed"]["ok"].as_u64(), Some(1), "{}", days[1]);

    let summary_at = stdout.find("\n{\n").expect("a summary after the days") + 1;
    let summary: Value = serde_json::from_str(&stdout[summary_at..]).unwrap();
    assert_eq!(summary["bench"], "soak");
    assert_eq!(summary["per_day"].as_array().unwrap().len(), 3);
    assert!(summary["growth"].as_array().unwrap().iter().any(|g| g["measure"] == "LANDFALL_EVENTS bytes"));
    assert!(summary["flat"].is_boolean(), "{summary}");
    assert!(stderr.contains("flat: "), "{stderr}");

    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("landfall-bench-"))
        .collect();
    assert!(left.is_empty(), "the soak left files behind: {left:?}");
}
