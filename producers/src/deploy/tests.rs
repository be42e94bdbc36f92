use super::*;

/// Arguments for `sites` and one hub at 10.0.0.5, nothing else given.
fn args_for(sites: &[&str]) -> NatsConfigArgs {
    NatsConfigArgs {
        sites: sites.iter().map(|s| s.to_string()).collect(),
        out: "x".into(),
        hubs: vec!["10.0.0.5".into()],
        leaf_advertise: Vec::new(),
        relays: Vec::new(),
        store_dir: "/s".into(),
        site_listen: "127.0.0.1:4222".into(),
        tls_cert: None,
        tls_key: None,
        tls_ca: None,
        site_auth: None,
        site_creds: PathBuf::from("/tmp/link.creds"),
        region: None,
        core: Vec::new(),
        core_key: None,
        core_ca: None,
    }
}

#[test]
fn hubs_parse_with_default_ports_and_refuse_nonsense() {
    assert_eq!(
        "nats-0".parse::<Hub>().unwrap(),
        Hub { host: "nats-0".into(), client: 4222, cluster: 6222, leaf: 7422, http: 8222, leaf_advertise: None }
    );
    assert_eq!("h:1:2:3:4".parse::<Hub>().unwrap().http, 4);
    assert!("h:x".parse::<Hub>().unwrap_err().contains("client port"));
    assert!("h:1:2:3:4:5".parse::<Hub>().is_err());
    assert!(":1".parse::<Hub>().is_err());
}

#[test]
fn a_site_holds_a_handful_of_its_own_wildcards_and_services_are_denied_others_consumers() {
    let user = |role: Role| User { role, key: key_pair(None).unwrap() };
    let users = [user(Role::Kubeconfig), user(Role::Operator), user(Role::Api), user(Role::Site("edge-01".into()))];
    let text = accounts(&users.iter().collect::<Vec<_>>(), &[], &key_pair(None).unwrap(), None, HUB_DOMAIN);
    let block = |name: &str| {
        let start = text.find(&format!("# {name}\n")).unwrap();
        text[start..].split("\n      # ").next().unwrap().to_string()
    };
    let site = block("site-edge-01");
    for user in &users[..3] {
        assert!(!site.contains(&user.key.public_key), "a site's grants name no other user: {site}");
    }
    assert!(site.contains("\"landfall.svc.edge-01.>\""), "{site}");
    assert!(site.contains("\"landfall.to.edge-01.>\""), "{site}");
    assert_eq!(site.matches("edge-01").count(), 1 + 8, "its name, and eight grants: {site}");
    assert!(!site.contains("deny"), "{site}");
    let api = block("api");
    assert!(api.contains("deny: [\"$JS.API.CONSUMER.CREATE.LANDFALL_EVENTS.orchestrator-events\""), "{api}");
    let writes: Vec<&str> = api.split('"').filter(|s| s.starts_with("$KV.")).collect();
    assert_eq!(writes, ["$KV.landfall-approvals.>"], "the API writes only the commands it holds: {api}");
}

#[test]
fn sites_are_checked() {
    let args = |sites: &[&str], hubs: &[&str]| NatsConfigArgs {
        hubs: hubs.iter().map(|s| s.to_string()).collect(),
        ..args_for(sites)
    };
    assert!(plan(&args(&["edge-01", "edge-01"], &["h"])).unwrap_err().to_string().contains("twice"));
    assert!(plan(&args(&["Edge 1"], &["h"])).is_err());
    assert!(plan(&args(&["hub"], &["h"])).unwrap_err().to_string().contains("domain"));
    assert!(plan(&args(&["edge-01"], &["a", "b"])).unwrap_err().to_string().contains("quorum"));
    assert_eq!(plan(&args(&["edge-01", "edge-02"], &["a", "b", "c"])).unwrap().hubs.len(), 3);
}

#[test]
fn hub_and_leaf_servers_allow_slow_writes_to_a_slow_site_link() {
    let args = args_for(&["edge-01"]);
    let p = plan(&args).unwrap();
    let site = User { role: Role::Site("edge-01".into()), key: key_pair(None).unwrap() };
    for conf in [hub_server(&p, 0, &p.hubs[0], "pw"), leaf(&p, "edge-01", &site, None)] {
        assert!(conf.contains("\nwrite_deadline: \"60s\"\n"), "{conf}");
    }
    // Many leaf nodes: interest isolated and no compression at the hub, a reconnect delay
    // (jittered by the server) at the site, and the same compression on both ends.
    let hub = hub_server(&p, 0, &p.hubs[0], "pw");
    let leafnodes = &hub[hub.find("leafnodes {").unwrap()..];
    assert!(leafnodes.contains("isolate_leafnode_interest: true\n  compression: off"), "{hub}");
    assert!(leafnodes.contains("authorization { timeout: 10 }"), "{hub}");
    for conf in [leaf(&p, "edge-01", &site, None), leaf_enrolled(&p, "edge-01")] {
        assert!(conf.contains("leafnodes {\n  reconnect: \"2s\"\n"), "{conf}");
        assert!(conf.contains("      compression: off\n"), "{conf}");
    }
}

#[test]
fn sites_behind_relays_are_users_of_their_relay_whose_link_holds_a_sites_grants_for_any_site() {
    let sites: Vec<String> = (1..=6).map(|i| format!("edge-{i:02}")).collect();
    let names: Vec<&str> = sites.iter().map(String::as_str).collect();
    let relays = vec!["10.0.1.1".into(), "10.0.1.2:4333:7433:8333".into()];
    let mut args = NatsConfigArgs { relays, ..args_for(&names) };
    let p = plan(&args).unwrap();
    assert_eq!(p.relays[1], Relay { host: "10.0.1.2".into(), client: 4333, leaf: 7433, http: 8333 });
    let users: Vec<User> = Role::services()
        .into_iter()
        .chain(sites.iter().map(|s| Role::Site(s.clone())))
        .map(|role| User { role, key: key_pair(None).unwrap() })
        .collect();
    let relays = [key_pair(None).unwrap(), key_pair(None).unwrap()];
    let files = render(&p, &users, &relays, &key_pair(None).unwrap(), &key_pair(None).unwrap(), "pw");
    let text = |path: &str| files.iter().find(|f| f.path == Path::new(path)).unwrap().text.clone();
    let hub = text("hub/accounts.conf");
    let mut behind = [0, 0];
    for (site, user) in sites.iter().zip(&users[Role::services().len()..]) {
        let r = relay_of(site, 2);
        behind[r] += 1;
        assert!(!hub.contains(&user.key.public_key), "a relayed site is no user of the hub: {hub}");
        let relay = text(&format!("relays/{}.conf", relay_name(r)));
        let other = text(&format!("relays/{}.conf", relay_name(1 - r)));
        assert!(relay.contains(&user.key.public_key) && !other.contains(&user.key.public_key), "{relay}");
        assert!(relay.contains(&format!("\"landfall.to.{site}.>\"")), "checked at its relay: {relay}");
        let leaf = text(&format!("sites/{site}/leaf.conf"));
        let port = if r == 0 { 7422 } else { 7433 };
        assert!(leaf.contains(&format!("\"nats-leaf://{}:{port}\"", p.relays[r].host)), "{leaf}");
    }
    assert!(behind[0] > 0 && behind[1] > 0, "six sites land on both relays: {behind:?}");
    for (i, key) in relays.iter().enumerate() {
        let relay = text(&format!("relays/{}.conf", relay_name(i)));
        assert!(!relay.contains("jetstream"), "{relay}");
        assert!(!relay.contains("isolate_leafnode_interest"), "the hub's interest reaches sites' leaf nodes: {relay}");
        assert!(relay.contains(&format!("nkey: {:?}\n      account: LANDFALL", key.seed)), "{relay}");
        assert!(relay.contains("\"nats-leaf://10.0.0.5:7422\""), "{relay}");
        // At the hub, the relay's user may carry what any site may, and nothing of the hub's.
        let start = hub.find(&format!("# {}:", relay_name(i))).unwrap();
        let grant = hub[start..].split("\n      # ").next().unwrap();
        assert!(grant.contains(&key.public_key), "{grant}");
        assert!(grant.contains("\"landfall.to.*.>\"") && grant.contains("\"landfall.svc.*.>\""), "{grant}");
        assert!(grant.contains("\"$JS.*.LANDFALL_JOBS_63.*.>\""), "any site's durable, in any shard: {grant}");
        assert!(!sites.iter().any(|site| grant.contains(site.as_str())), "no site by name: {grant}");
        for hubs_own in ["\"landfall.>\"", "\"$JS.ACK.>\"", "\"$JS.API.>\""] {
            assert!(!grant.contains(hubs_own), "{hubs_own}: {grant}");
        }
        assert!(grant.contains("deny: [\"landfall.cmd.*.hub.>\", \"landfall.evt.*.hub.>\"]"), "{grant}");
    }
    args.site_auth = Some(SiteAuth::Enroll);
    assert!(plan(&args).unwrap_err().to_string().contains("static users"));
    args.site_auth = None;
    args.relays = vec!["r:x".into()];
    assert!(plan(&args).unwrap_err().to_string().contains("client port"));
}

#[test]
fn a_hub_behind_an_address_of_its_own_is_dialled_there_and_announces_it() {
    let mut args = NatsConfigArgs { leaf_advertise: vec!["hub.example.net:443".into()], ..args_for(&["edge-01"]) };
    let p = plan(&args).unwrap();
    let site = User { role: Role::Site("edge-01".into()), key: key_pair(None).unwrap() };
    let leaf_conf = leaf(&p, "edge-01", &site, None);
    assert!(leaf_conf.contains("\"nats-leaf://hub.example.net:443\""), "{leaf_conf}");
    assert!(!leaf_conf.contains("10.0.0.5"), "{leaf_conf}");
    let hub_conf = hub_server(&p, 0, &p.hubs[0], "pw");
    assert!(hub_conf.contains("listen: \"10.0.0.5:7422\"\n  advertise: \"hub.example.net:443\""), "{hub_conf}");
    args.leaf_advertise.push("b:1".into());
    assert!(plan(&args).unwrap_err().to_string().contains("one per --hub"));
    args.leaf_advertise = vec!["no-port".into()];
    assert!(plan(&args).unwrap_err().to_string().contains("HOST:PORT"));
}

#[test]
fn a_regional_hub_has_its_own_domain_its_sites_grants_name_it_and_its_link_to_the_core_carries_no_landfall_subject() {
    let dir = tempfile::tempdir().unwrap();
    let core = regions::CoreConfigArgs {
        regions: vec!["eu-west".into(), "us-east".into()],
        core: "10.9.0.1:4222:7500:8222".into(),
        out: dir.path().into(),
        store_dir: "/s".into(),
        tls_cert: None,
        tls_key: None,
    };
    regions::write_core(&core).unwrap();
    let core_conf = std::fs::read_to_string(dir.path().join("core/core.conf")).unwrap();
    assert!(core_conf.contains("domain: core"), "{core_conf}");
    assert!(core_conf.contains("listen: \"10.9.0.1:7500\""), "{core_conf}");
    let key = dir.path().join("core/regions/eu-west.nk");
    let seed = read_seed(&key).unwrap();
    let public = nkeys::KeyPair::from_seed(&seed).unwrap().public_key();
    assert!(core_conf.contains(&public), "the region's link is a user of the core: {core_conf}");
    // Written again, the keys stay.
    regions::write_core(&core).unwrap();
    assert_eq!(read_seed(&key).unwrap(), seed);

    let mut args = NatsConfigArgs {
        region: Some("eu-west".into()),
        core: vec!["10.9.0.1:7500".into()],
        core_key: Some(key),
        ..args_for(&["edge-01"])
    };
    let p = plan(&args).unwrap();
    assert_eq!(p.domain(), "hub-eu-west");
    let hub = hub_server(&p, 0, &p.hubs[0], "pw");
    assert!(hub.contains("domain: hub-eu-west"), "{hub}");
    assert!(hub.contains("server_name: hub-eu-west-1"), "servers linked to one core are named apart: {hub}");
    assert!(hub.contains("urls: [\"nats-leaf://10.9.0.1:7500\"]"), "{hub}");
    assert!(hub.contains(&format!("nkey: {seed:?}\n      account: LANDFALL")), "{hub}");
    assert!(hub.contains("deny_imports: [\"landfall.>\"]\n      deny_exports: [\"landfall.>\"]"), "{hub}");
    let user = User { role: Role::Site("edge-01".into()), key: key_pair(None).unwrap() };
    let text = accounts(&[&user], &[], &key_pair(None).unwrap(), None, &p.domain());
    assert!(
        text.contains("$JS.hub-eu-west.API.DIRECT.GET.LANDFALL_EVENTS"),
        "its leaf node reaches its own region's hub: {text}"
    );
    assert!(!text.contains("$JS.hub.API"), "{text}");

    // Without a region nothing changes; a region's name is checked, and a link needs its key.
    assert_eq!(plan(&args_for(&["edge-01"])).unwrap().domain(), "hub");
    // A site's leaf node's domain is its id: below a core, none may be named as the core.
    assert!(plan(&args_for(&["core"])).is_ok(), "no core above: any id");
    let core_named = NatsConfigArgs { region: args.region.clone(), ..args_for(&["core"]) };
    assert!(plan(&core_named).unwrap_err().to_string().contains("core's JetStream domain"));
    args.site_auth = Some(SiteAuth::Enroll);
    assert!(plan(&args).unwrap_err().to_string().contains("static users"));
    args.site_auth = None;
    args.core_key = None;
    assert!(plan(&args).unwrap_err().to_string().contains("--core-key"));
    args.region = Some("EU West".into());
    assert!(plan(&args).unwrap_err().to_string().contains("not a region name"));
    let twice = regions::CoreConfigArgs { regions: vec!["a".into(), "a".into()], ..core };
    assert!(regions::write_core(&twice).unwrap_err().to_string().contains("named twice"));
}
