use super::*;

#[test]
fn subjects_round_trip() {
    let s = command_subject("install_site", "edge-1");
    assert_eq!(s, "landfall.cmd.edge-1.hub.install_site");
    assert_eq!(
        parse_subject(&s),
        Some(ParsedSubject::Command { kind: "install_site", scope: "edge-1", origin: Origin::Hub })
    );
    let s = event_subject_from(Origin::Gateway, "edge-1", "node", "os_provisioned");
    assert_eq!(s, "landfall.evt.edge-1.gateway.node.os_provisioned");
    assert_eq!(
        parse_subject(&s),
        Some(ParsedSubject::Event {
            scope: "edge-1",
            origin: Origin::Gateway,
            aggregate: "node",
            kind: "os_provisioned"
        })
    );
    assert_eq!(parse_subject("landfall.evt.edge-1.elsewhere.node.os_provisioned"), None);
    assert_eq!(
        parse_subject(&kubeconfig_rpc("edge-1")),
        Some(ParsedSubject::Rpc { site: "edge-1", kind: KUBECONFIG_RPC })
    );
    assert_eq!(parse_subject(&site_deliver("edge-1")), None);
    // What an earlier version kept in a site's outbox goes as the gateway sends it now.
    let kept = |s: &str| outbox_destination(&outbox_subject(s));
    assert_eq!(kept("landfall.evt.e.node.patched").unwrap(), "landfall.evt.e.gateway.node.patched");
    assert_eq!(kept("landfall.cmd.node_added.e").unwrap(), "landfall.cmd.e.gateway.node_added");
    assert_eq!(kept("landfall.evt.e.gateway.node.patched").unwrap(), "landfall.evt.e.gateway.node.patched");
    assert_eq!(outbox_destination("landfall.evt.e.gateway.node.patched"), None);
    assert_eq!(parse_subject("landfall.job.a.b"), Some(ParsedSubject::Job { site: "a", kind: "b" }));
    let job = job_subject("edge-1", "patch_node");
    assert_eq!(parse_subject(&job), Some(ParsedSubject::Job { site: "edge-1", kind: "patch_node" }));
    assert!(subject_matches(&site_jobs("edge-1"), &job) && subject_matches(&site_every_job("edge-1"), &job));
    assert!(subject_matches(&shard_jobs(job_shard("edge-1")), &job));
    assert_eq!(stream_of_subject(&job), Some(site_jobs_stream("edge-1")));
    // A shard that is not its site's is no job.
    let wrong = format!("landfall.job.edge-1.{:02}.patch_node", (job_shard("edge-1") + 1) % JOB_SHARDS);
    assert_eq!(parse_subject(&wrong), None);
    assert_eq!(
        parse_subject(&artifact_chunk_svc("edge-1")),
        Some(ParsedSubject::Service { site: "edge-1", kind: ARTIFACT_CHUNK })
    );
    assert_eq!(parse_subject("landfall.cmd.x"), None);
}

#[test]
fn sites_spread_over_every_shard_and_each_keeps_its_own() {
    // FNV-1a, fixed: a site's jobs stay in the stream its durable reads.
    assert_eq!(job_shard(""), 0x811c_9dc5_usize % JOB_SHARDS);
    assert_eq!(job_shard("a"), 0xe40c_292c_usize % JOB_SHARDS);
    let mut counts = [0usize; JOB_SHARDS];
    for i in 0..10_000 {
        counts[job_shard(&format!("site-{i:05}"))] += 1;
    }
    let (least, most) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
    assert!(*least > 100 && *most < 220, "10,000 sites spread {least}..{most} per shard");
    assert_eq!(jobs_stream(7), "LANDFALL_JOBS_07");
    assert_eq!(streams().len(), 3 + JOB_SHARDS);
}

#[test]
fn package_keys_are_valid_kv_keys() {
    let k = keys::package("kubelet", "1.29.1+k3s1");
    assert!(k.chars().all(|c| c.is_ascii_alphanumeric() || "-/_=.".contains(c)), "{k}");
    assert_ne!(keys::package("a", "1.2"), keys::package("a.1", "2"));
}
