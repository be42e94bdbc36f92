//! The kube API server harness: a real etcd + apiextensions-apiserver with the upstream Metal3
//! and BPA CRDs, enforcing their schemas, one isolated server per test.

use std::time::{Duration, Instant};

use kube::api::{Api, ApiResource, DynamicObject, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use landfall_tests::kube::KubeApiServer;
use serde_json::json;

fn bare_metal_host() -> ApiResource {
    ApiResource {
        group: "metal3.io".into(),
        version: "v1alpha1".into(),
        api_version: "metal3.io/v1alpha1".into(),
        kind: "BareMetalHost".into(),
        plural: "baremetalhosts".into(),
    }
}

fn provisioning() -> ApiResource {
    ApiResource {
        group: "bpa.akraino.org".into(),
        version: "v1alpha1".into(),
        api_version: "bpa.akraino.org/v1alpha1".into(),
        kind: "Provisioning".into(),
        plural: "provisionings".into(),
    }
}

fn host(name: &str, spec: serde_json::Value) -> DynamicObject {
    DynamicObject::new(name, &bare_metal_host()).within("default").data(json!({ "spec": spec }))
}

/// The upstream BareMetalHost schema is enforced: defaults filled in, wrong types refused.
#[tokio::test]
async fn bare_metal_hosts_are_defaulted_and_validated() {
    let started = Instant::now();
    let server = KubeApiServer::start().await;
    eprintln!("KubeApiServer::start took {:?} ({})", started.elapsed(), server.url());
    let client = server.client().await;
    assert_eq!(client.default_namespace(), "default");
    let hosts: Api<DynamicObject> = Api::default_namespaced_with(client, &bare_metal_host());

    // The first create is not held back for the just-established CRD (the server sleeps 2 s).
    let spec = json!({ "online": true, "bootMACAddress": "00:c6:14:04:61:b2" });
    let create = Instant::now();
    let created = hosts.create(&PostParams::default(), &host("node-0", spec)).await.unwrap();
    assert!(create.elapsed() < Duration::from_secs(2), "the first create took {:?}", create.elapsed());
    assert_eq!(created.data["spec"]["automatedCleaningMode"], "metadata", "{:?}", created.data);
    let stored = hosts.get("node-0").await.unwrap();
    assert_eq!(stored.data["spec"]["automatedCleaningMode"], "metadata");
    assert_eq!(stored.data["spec"]["online"], true);

    let err = hosts.create(&PostParams::default(), &host("node-1", json!({ "online": "notabool" }))).await.unwrap_err();
    let kube::Error::Api(status) = &err else { panic!("expected an API error, got {err:?}") };
    assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"), "{status:?}");
    assert!(status.message.contains("spec.online"), "{}", status.message);
    assert!(hosts.get_opt("node-1").await.unwrap().is_none());
}

/// The BPA CRDs are v1beta1 upstream; converted, they keep whatever `spec` holds (no pruning).
#[tokio::test]
async fn bpa_provisioning_keeps_its_spec() {
    let server = KubeApiServer::start().await;
    let provisionings: Api<DynamicObject> = Api::default_namespaced_with(server.client().await, &provisioning());
    let spec = json!({
        "masters": [{ "master-1": { "mac-address": "00:c6:14:04:61:b2" } }],
        "workers": [{ "worker-1": { "mac-address": "00:c4:13:04:62:b5" } }],
        "KUDPlugins": ["emco"],
    });
    let object = DynamicObject::new("provisioning-test-1", &provisioning()).data(json!({ "spec": spec }));
    provisionings.create(&PostParams::default(), &object).await.unwrap();
    let stored = provisionings.get("provisioning-test-1").await.unwrap();
    assert_eq!(stored.data["spec"], spec);

    let software = ApiResource { kind: "Software".into(), plural: "softwares".into(), ..provisioning() };
    let softwares: Api<DynamicObject> = Api::default_namespaced_with(server.client().await, &software);
    let spec = json!({ "masterSoftware": ["curl", { "jq": { "version": "1.6" } }] });
    softwares
        .create(&PostParams::default(), &DynamicObject::new("sw", &software).data(json!({ "spec": spec })))
        .await
        .unwrap();
    assert_eq!(softwares.get("sw").await.unwrap().data["spec"], spec);
}

/// Two servers started at once share nothing: ports, store, kubeconfig.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_started_together_are_isolated() {
    let started = Instant::now();
    let (a, b) = tokio::join!(KubeApiServer::start(), KubeApiServer::start());
    eprintln!("two KubeApiServer::start in parallel took {:?}", started.elapsed());
    assert_ne!(a.url(), b.url());
    assert_ne!(a.kubeconfig_path(), b.kubeconfig_path());

    let in_a: Api<DynamicObject> = Api::default_namespaced_with(a.client().await, &bare_metal_host());
    let in_b: Api<DynamicObject> = Api::default_namespaced_with(b.client().await, &bare_metal_host());
    in_a.create(&PostParams::default(), &host("only-in-a", json!({ "online": false }))).await.unwrap();
    assert!(in_a.get_opt("only-in-a").await.unwrap().is_some());
    assert!(in_b.get_opt("only-in-a").await.unwrap().is_none());
    assert!(in_b.list(&ListParams::default()).await.unwrap().items.is_empty());

    // Each server has its own CA: b's kubeconfig does not get into a.
    let mut cross = kube::Config::from_custom_kubeconfig(
        Kubeconfig::read_from(b.kubeconfig_path()).unwrap(),
        &KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    cross.cluster_url = a.url().parse().unwrap();
    let cross: Api<DynamicObject> =
        Api::default_namespaced_with(kube::Client::try_from(cross).unwrap(), &bare_metal_host());
    assert!(cross.list(&ListParams::default()).await.is_err(), "b's kubeconfig was accepted by a");

    let url = a.url();
    drop(a);
    assert!(in_b.list(&ListParams::default()).await.is_ok(), "b outlives a");
    assert!(in_a.list(&ListParams::default()).await.is_err(), "{url} still answers after drop");
}
