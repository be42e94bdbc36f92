//! `landfall deploy nats-config`: the NATS side of a deployment, generated so no per-site
//! configuration is ever written by hand.
//!
//! - `hub/<server>.conf`: the hub's servers (one, or a JetStream cluster of three or more, in
//!   the JetStream domain `hub`), each listening for clients, routes and leaf nodes.
//! - `hub/accounts.conf`: the `LANDFALL` account with one user per hub service, one for
//!   operators and one per site, each with the permissions of [`bus_schema::access`]; the hub
//!   knows only their public keys.
//! - `sites/<site>/leaf.conf`: the site's leaf node, with a JetStream domain of its own (the
//!   site id), linked to the hub as the site's user, so everything the site sends or receives
//!   is held to that user's permissions.
//! - `relays/<relay>.conf` (with `--relay`): servers in front of the hub that let sites in,
//!   each as its own user with its own permissions, and carry them to the hub over one leaf
//!   link each, so the hub holds one connection per relay, not one per site.
//! - `users/<user>.nk` and `sites/<site>/gateway.nk`: the seeds, mode 0600, for each process's
//!   `--nats-nkey-file`.
//! - With `--region` (and `--core`): a regional hub below a core (`deploy core-config`), in the
//!   JetStream domain `hub-<region>`, linked to the core (`deploy/regions.rs`).
//!
//! Run again with more sites, it keeps every key it made before.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use bus_schema::access::{HUB_DOMAIN, Permissions, Role};
use bus_schema::domain::SiteId;
use servers::{leaf, leaf_enrolled, relay_server};

#[derive(Debug, clap::Subcommand)]
pub enum DeployCommand {
    /// Write the NATS configuration of the hub (one server or a cluster), of each site's leaf
    /// node, and every user's key, with least-privilege permissions per service and per site.
    NatsConfig(Box<NatsConfigArgs>),
    /// Write the configuration of a core above regional hubs: its server (JetStream domain
    /// `core`), and keys for the operator and each region's link.
    CoreConfig(regions::CoreConfigArgs),
    /// At the core (NATS_URL and --nats-nkey-file: the core's operator): make a region's streams
    /// there (its commands, kept until its hub takes them; its events, mirrored) and have the
    /// region's commands stream source the first. Run once the region's hub is linked and its
    /// orchestrator started; running it again changes nothing.
    RegionLink(regions::RegionLinkArgs),
}

#[derive(Debug, clap::Args)]
pub struct NatsConfigArgs {
    /// The sites, each with a leaf node and a user of its own (comma-separated or repeated).
    /// With `--site-auth enroll`, only their leaf nodes: sites join by enrollment.
    #[arg(long, value_delimiter = ',', required_unless_present = "site_auth")]
    pub sites: Vec<String>,
    /// How sites prove who they are: `static`, a user per site written into the hub's
    /// configuration; `enroll`, credentials the identity service issues when a site's request to
    /// join is approved, checked at each connection by the hub's auth callout, renewed by the
    /// gateway and revoked without touching the hub's configuration.
    #[arg(long, value_enum)]
    pub site_auth: Option<SiteAuth>,
    /// With `--site-auth enroll`: where a site's leaf node reads the link credentials its gateway
    /// keeps (`landfall-gateway … --link-creds`).
    #[arg(long, default_value = "/var/lib/landfall/gateway/link.creds")]
    pub site_creds: PathBuf,
    /// Where to write (created if missing; keys already there are kept).
    #[arg(long, default_value = "./landfall-nats")]
    pub out: PathBuf,
    /// A hub server: HOST[:CLIENT[:CLUSTER[:LEAF[:HTTP]]]] (ports default 4222, 6222, 7422,
    /// 8222). Once for a single server; three times (or more) for a JetStream cluster whose
    /// streams keep three replicas.
    #[arg(long = "hub", default_value = "127.0.0.1")]
    pub hubs: Vec<String>,
    /// Where sites reach each hub server's leaf listener, HOST:PORT, one per --hub in order,
    /// when that is not its own address (a NAT, a load balancer). Sites dial it, and the hub
    /// announces it to them: a leaf node that loses its link also redials what the hub
    /// announced, which must then be reachable from the site.
    #[arg(long = "leaf-advertise")]
    pub leaf_advertise: Vec<String>,
    /// A relay in front of the hub: HOST[:CLIENT[:LEAF[:HTTP]]] (ports default 4222, 7422,
    /// 8222). Given once or more, the sites are spread over the relays by a hash of their ids
    /// (adding sites moves none): each relay lets its sites in, each as its own user with its
    /// own permissions, checked there, and carries them to the hub over one leaf link, held
    /// there to what any site may do: a relay's key is the hub's, kept with the hub's servers.
    /// For fleets past what one server's connections hold; static site users only. With
    /// --tls-cert, its listeners use the same certificate, which must then name the relays'
    /// hosts too.
    #[arg(long = "relay")]
    pub relays: Vec<String>,
    /// Where each server keeps its JetStream store (`<dir>/<server>`).
    #[arg(long, default_value = "/var/lib/nats")]
    pub store_dir: PathBuf,
    /// Where a site's leaf node listens for its gateway.
    #[arg(long, default_value = "127.0.0.1:4222")]
    pub site_listen: String,
    /// The hub servers' TLS certificate (PEM), valid for every hub host: clients, routes and
    /// leaf nodes then speak TLS. Needs --tls-key and --tls-ca.
    #[arg(long, requires_all = ["tls_key", "tls_ca"])]
    pub tls_cert: Option<PathBuf>,
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// The CA that signed the hub's certificate: the sites' leaf nodes verify the hub with it.
    #[arg(long, requires = "tls_cert")]
    pub tls_ca: Option<PathBuf>,
    /// The region this hub serves, below a core: its JetStream domain is then `hub-<region>`,
    /// which its sites' grants name and their gateways are given (`--js-domain`).
    #[arg(long)]
    pub region: Option<String>,
    /// With --region: the core's leaf listener, HOST[:PORT] (port 7422 by default), once per
    /// core server. The hub links to it carrying no landfall subject either way.
    #[arg(long = "core", requires = "region")]
    pub core: Vec<String>,
    /// With --core: the region's key at the core, as `deploy core-config` wrote it
    /// (`core/regions/<region>.nk`).
    #[arg(long, requires = "core")]
    pub core_key: Option<PathBuf>,
    /// With --core, when the core speaks TLS (`deploy core-config --tls-cert`): the CA its
    /// certificate is verified with.
    #[arg(long, requires = "core")]
    pub core_ca: Option<PathBuf>,
}

/// How sites prove who they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum SiteAuth {
    #[default]
    Static,
    Enroll,
}

/// One hub server's addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hub {
    pub host: String,
    pub client: u16,
    pub cluster: u16,
    pub leaf: u16,
    pub http: u16,
    /// Where sites reach the leaf listener (HOST:PORT), when not at `host:leaf`.
    pub leaf_advertise: Option<String>,
}

impl Hub {
    /// The address sites dial for this server's leaf listener.
    pub fn leaf_address(&self) -> String {
        self.leaf_advertise.clone().unwrap_or_else(|| format!("{}:{}", self.host, self.leaf))
    }
}

/// A server's address, HOST[:PORT…]: its host, then each of `ports` (a name and a default)
/// in order, as many as are given.
fn parse_address<const N: usize>(s: &str, what: &str, ports: [(&str, u16); N]) -> Result<(String, [u16; N]), String> {
    let mut parts = s.split(':');
    let host = parts.next().filter(|h| !h.is_empty()).ok_or(format!("a {what} needs a host"))?.to_string();
    let mut out = [0; N];
    for (slot, (name, default)) in out.iter_mut().zip(ports) {
        *slot = match parts.next() {
            None => default,
            Some(p) => p.parse().map_err(|_| format!("{name} port {p:?} of {what} {s:?} is not a port"))?,
        };
    }
    if parts.next().is_some() {
        let shape: Vec<String> = ports.iter().map(|(name, _)| name.to_uppercase()).collect();
        return Err(format!("{what} {s:?} has more than HOST:{}", shape.join(":")));
    }
    Ok((host, out))
}

impl std::str::FromStr for Hub {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let ports = [("client", 4222), ("cluster", 6222), ("leaf", 7422), ("monitoring", 8222)];
        let (host, [client, cluster, leaf, http]) = parse_address(s, "hub", ports)?;
        Ok(Hub { host, client, cluster, leaf, http, leaf_advertise: None })
    }
}

/// One relay's addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relay {
    pub host: String,
    pub client: u16,
    pub leaf: u16,
    pub http: u16,
}

impl std::str::FromStr for Relay {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (host, [client, leaf, http]) =
            parse_address(s, "relay", [("client", 4222), ("leaf", 7422), ("monitoring", 8222)])?;
        Ok(Relay { host, client, leaf, http })
    }
}

/// The name of relay `i` (0-based).
pub fn relay_name(i: usize) -> String {
    format!("relay-{}", i + 1)
}

/// Which of `relays` relays `site` lets in: a hash of the site's id (FNV-1a), so a site keeps
/// its relay however many sites are added.
pub fn relay_of(site: &str, relays: usize) -> usize {
    let hash = site.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    (hash % relays.max(1) as u64) as usize
}

/// The TLS files of the hub's servers.
#[derive(Debug, Clone)]
pub struct Tls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

/// Everything the configuration is made of.
#[derive(Debug, Clone)]
pub struct Plan {
    pub sites: Vec<SiteId>,
    pub hubs: Vec<Hub>,
    /// Relays in front of the hub (none: every site connects to the hub itself).
    pub relays: Vec<Relay>,
    pub store_dir: PathBuf,
    pub site_listen: String,
    pub tls: Option<Tls>,
    pub site_auth: SiteAuth,
    pub site_creds: PathBuf,
    /// The region this hub serves, and its link to the core.
    pub region: Option<(String, Option<regions::CoreLink>)>,
}

impl Plan {
    /// The hub's JetStream domain: `hub`, or a regional hub's `hub-<region>`.
    pub fn domain(&self) -> String {
        match &self.region {
            Some((region, _)) => bus_schema::access::region_domain(region),
            None => HUB_DOMAIN.to_string(),
        }
    }
}

/// A key pair: the public key the server knows, the seed its user holds.
pub struct Key {
    pub public_key: String,
    pub seed: String,
}

/// A user and its key pair.
pub struct User {
    pub role: Role,
    pub key: Key,
}

/// A file to write: its path under the output directory, its text, and whether it is secret.
#[derive(Debug)]
pub struct File {
    pub path: PathBuf,
    pub text: String,
    pub secret: bool,
}

/// The name of hub server `i` (0-based).
pub fn hub_name(i: usize) -> String {
    format!("hub-{}", i + 1)
}

/// The name of the hub's cluster.
pub const CLUSTER_NAME: &str = "landfall-hub";
/// The account every landfall user is in.
pub const ACCOUNT: &str = "LANDFALL";

/// The files of `plan`, with `users` (every service, the operator and each site) and the
/// routes' password.
pub fn render(
    plan: &Plan,
    users: &[User],
    relays: &[Key],
    system: &Key,
    issuer: &Key,
    route_password: &str,
) -> Vec<File> {
    let mut files = Vec::new();
    let callout = (plan.site_auth == SiteAuth::Enroll).then_some(issuer);
    // A site behind a relay is a user of its relay, not of the hub.
    let behind = |u: &&User| match &u.role {
        Role::Site(site) if !plan.relays.is_empty() => Some(relay_of(site, plan.relays.len())),
        _ => None,
    };
    let hub_users: Vec<&User> = users.iter().filter(|u| behind(u).is_none()).collect();
    let links: Vec<LinkUser<'_>> = relays
        .iter()
        .enumerate()
        .map(|(i, key)| LinkUser {
            name: relay_name(i),
            key,
            permissions: bus_schema::access::relay_link(&plan.domain()),
        })
        .collect();
    files.push(File {
        path: "hub/accounts.conf".into(),
        text: accounts(&hub_users, &links, system, callout, &plan.domain()),
        secret: false,
    });
    for (i, (relay, link)) in plan.relays.iter().zip(&links).enumerate() {
        let sites: Vec<&User> = users.iter().filter(|u| behind(u) == Some(i)).collect();
        files.push(File {
            path: format!("relays/{}.conf", relay_name(i)).into(),
            text: relay_server(plan, i, relay, link.key, &sites),
            secret: true,
        });
        files.push(File {
            path: format!("relays/{}.nk", relay_name(i)).into(),
            text: seed_file(&format!("relay {}", relay_name(i)), link.key),
            secret: true,
        });
    }
    for (i, hub) in plan.hubs.iter().enumerate() {
        files.push(File {
            path: format!("hub/{}.conf", hub_name(i)).into(),
            text: hub_server(plan, i, hub, route_password),
            secret: true,
        });
    }
    if plan.site_auth == SiteAuth::Enroll {
        for site in &plan.sites {
            files.push(File {
                path: format!("sites/{site}/leaf.conf").into(),
                text: leaf_enrolled(plan, site.as_str()),
                secret: false,
            });
        }
        files.push(File {
            path: "identity/issuer.nk".into(),
            text: format!(
                "# The identity service's issuer ({}): it signs sites' credentials and the hub's auth callout\n\
                 # answers. Pass this file as `landfall serve identity --issuer-file`.\n{}\n",
                issuer.public_key, issuer.seed
            ),
            secret: true,
        });
    }
    for user in users {
        let (path, what) = match &user.role {
            Role::Site(site) => (format!("sites/{site}/gateway.nk"), format!("the gateway of site {site}")),
            role => (format!("users/{}.nk", role.user()), format!("the {} service", role.user())),
        };
        files.push(File { path: path.into(), text: seed_file(&what, &user.key), secret: true });
        if let Role::Site(site) = &user.role {
            let relay = behind(&user).map(|i| &plan.relays[i]);
            files.push(File {
                path: format!("sites/{site}/leaf.conf").into(),
                text: leaf(plan, site, user, relay),
                secret: true,
            });
        }
    }
    files.push(File { path: "users/sys.nk".into(), text: seed_file("the system account", system), secret: true });
    files
}

fn seed_file(what: &str, key: &Key) -> String {
    format!("# The NATS user of {what} ({}): pass this file as --nats-nkey-file.\n{}\n", key.public_key, key.seed)
}

fn quoted(list: &[String]) -> String {
    list.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(", ")
}

fn permissions(p: &Permissions) -> String {
    let deny = match p.publish_deny.is_empty() {
        true => String::new(),
        false => format!(", deny: [{}]", quoted(&p.publish_deny)),
    };
    let mut out = format!(
        "permissions: {{\n        publish: {{ allow: [{}]{deny} }}\n        subscribe: {{ allow: [{}] }}\n",
        quoted(&p.publish),
        quoted(&p.subscribe)
    );
    if p.allow_responses {
        out.push_str("        allow_responses: true\n");
    }
    out.push_str("      }");
    out
}

/// A relay's user at the hub: its link carries what any site may send and receive.
struct LinkUser<'a> {
    name: String,
    key: &'a Key,
    permissions: Permissions,
}

/// The `users` list entries of `users`, each with its role's permissions, a site's at a hub in
/// JetStream domain `domain`.
fn user_entries(out: &mut String, users: &[&User], domain: &str) {
    for user in users {
        let granted = match &user.role {
            Role::Site(site) => bus_schema::access::site_in_domain(site, domain),
            role => role.permissions(&user.key.public_key),
        };
        let _ = writeln!(
            out,
            "      # {}\n      {{ nkey: {:?}\n      {}\n      }}",
            user.role.user(),
            user.key.public_key,
            permissions(&granted)
        );
    }
}

fn accounts(users: &[&User], relays: &[LinkUser<'_>], system: &Key, callout: Option<&Key>, domain: &str) -> String {
    let mut out = String::from(
        "# Generated by `landfall deploy nats-config`: run it again instead of editing.\n\
         # One user per hub service, one for operators, one per site (one per relay for the sites\n\
         # behind relays); public keys only.\n\n",
    );
    let _ = writeln!(out, "accounts {{\n  {ACCOUNT} {{\n    jetstream: enabled\n    users: [");
    user_entries(&mut out, users, domain);
    for relay in relays {
        let _ = writeln!(
            out,
            "      # {}: what any site may do, each site held to its own at the relay\n      {{ nkey: {:?}\n      {}\n      }}",
            relay.name,
            relay.key.public_key,
            permissions(&relay.permissions)
        );
    }
    let _ = writeln!(out, "    ]\n  }}\n  SYS {{\n    users: [ {{ nkey: {:?} }} ]\n  }}\n}}", system.public_key);
    out.push_str("system_account: SYS\n");
    if let Some(issuer) = callout {
        // Every other connection (a site's gateway or leaf node, a gateway asking to join) is
        // let in, or not, by the identity service: the list of sites is never written here.
        let bypass: Vec<String> = users
            .iter()
            .map(|u| u.key.public_key.clone())
            .chain(relays.iter().map(|r| r.key.public_key.clone()))
            .chain([system.public_key.clone()])
            .collect();
        let _ = writeln!(
            out,
            "\n# Sites are let in by the identity service (landfall serve identity), which signs its answers\n\
             # with this issuer: the hub's services and the system user bypass it. A storm of returning\n\
             # sites queues at the service: each connection may wait {CALLOUT_TIMEOUT_S} s for its answer.\n\
             authorization {{\n  timeout: {CALLOUT_TIMEOUT_S}\n  auth_callout {{\n    issuer: {:?}\n    account: {ACCOUNT}\n    auth_users: [{}]\n  }}\n}}",
            issuer.public_key,
            quoted(&bypass)
        );
    }
    out
}

fn tls_block(tls: &Tls, indent: &str, verify: bool) -> String {
    let mut out = format!(
        "{indent}tls {{\n{indent}  cert_file: {:?}\n{indent}  key_file: {:?}\n{indent}  ca_file: {:?}\n",
        tls.cert.display().to_string(),
        tls.key.display().to_string(),
        tls.ca.display().to_string()
    );
    if verify {
        let _ = writeln!(out, "{indent}  verify: true");
    }
    let _ = writeln!(out, "{indent}  timeout: {TLS_TIMEOUT_S}\n{indent}}}");
    out
}

/// How long one write to a connection may take (nats-server's default is 10 s). A server
/// writes all it has queued for a connection at once, and a site's leaf link may be slow: an
/// artifact's chunks queued for a site on a 5 Mbit/s link take longer than 10 s to cross. Past
/// the deadline the server counts a slow consumer, and a TLS connection is dropped (a TLS
/// stream cannot go on after a write timed out), so the leaf node reconnects, its transfer
/// resumes, queues as much again, and the link drops again: a reconnect loop.
/// `deploy/nats/README.md` says more.
const WRITE_DEADLINE: &str = "60s";

/// The lines every server gets: its write deadline, for slow site links.
fn slow_link_settings() -> String {
    format!(
        "# A site's leaf link may be slow: one write may take this long before the connection counts as a\n\
         # slow consumer (deploy/nats/README.md, \"Slow site links\").\nwrite_deadline: {WRITE_DEADLINE:?}\n"
    )
}

fn hub_server(plan: &Plan, i: usize, hub: &Hub, route_password: &str) -> String {
    let name = hub_name(i);
    let mut out = format!(
        "# Generated by `landfall deploy nats-config`: hub server {} of {}.\n\
         server_name: {}\nlisten: \"{}:{}\"\nhttp: \"{}:{}\"\nmax_payload: {}\n{}\n",
        i + 1,
        plan.hubs.len(),
        // Servers linked to one core must be named apart: a regional hub's name has its region.
        match &plan.region {
            Some((region, _)) => format!("{}-{}", bus_schema::access::region_domain(region), i + 1),
            None => name.clone(),
        },
        hub.host,
        hub.client,
        hub.host,
        hub.http,
        bus_schema::names::MAX_PAYLOAD + 64 * 1024,
        slow_link_settings(),
    );
    let _ = writeln!(
        out,
        "jetstream {{\n  domain: {}\n  store_dir: {:?}\n}}\n",
        plan.domain(),
        plan.store_dir.join(&name).display().to_string()
    );
    if let Some(tls) = &plan.tls {
        out.push_str(&tls_block(tls, "", false));
        out.push('\n');
    }
    if plan.hubs.len() > 1 {
        let routes: Vec<String> = plan
            .hubs
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, h)| format!("nats-route://route:{route_password}@{}:{}", h.host, h.cluster))
            .collect();
        let _ = writeln!(
            out,
            "cluster {{\n  name: {CLUSTER_NAME}\n  listen: \"{}:{}\"\n  authorization {{ user: route, password: {route_password:?} }}\n  routes: [{}]",
            hub.host,
            hub.cluster,
            quoted(&routes)
        );
        if let Some(tls) = &plan.tls {
            out.push_str(&tls_block(tls, "  ", true));
        }
        out.push_str("}\n\n");
    }
    let _ = writeln!(out, "leafnodes {{\n  listen: \"{}:{}\"", hub.host, hub.leaf);
    if let Some(address) = &hub.leaf_advertise {
        let _ = writeln!(out, "  advertise: {address:?}");
    }
    let _ = writeln!(out, "{HUB_LEAF_SETTINGS}");
    // A leaf node's link waits for its answer (the identity service's, or the server's own
    // check of the site's key) as long as a client does: a storm of returning sites queues.
    let _ = writeln!(out, "  authorization {{ timeout: {CALLOUT_TIMEOUT_S} }}");
    if let Some(tls) = &plan.tls {
        out.push_str(&tls_block(tls, "  ", false));
    }
    if let Some((_, Some(link))) = &plan.region {
        out.push_str(&regions::core_remote(link));
    }
    out.push_str("}\n\ninclude \"accounts.conf\"\n");
    out
}

/// The hub's settings for thousands of leaf nodes (docs/src/benchmarks.md, "A hub for many leaf
/// nodes", has the measurements):
/// - Interest isolated per leaf node: what one site subscribes to is not propagated to every
///   other site's leaf node (sites never hear each other), only to the hub's own clients.
/// - No compression: nats-server's default (`s2_auto`) keeps an S2 encoder per leaf link, about
///   1 MiB of the hub's memory each (70 KiB per link without); what crosses is small protobuf and
///   artifacts that are archives already.
const HUB_LEAF_SETTINGS: &str = "  isolate_leafnode_interest: true\n  compression: off";

/// How a leaf node comes back after its link drops: it waits this long (nats-server adds a
/// random delay of up to as much again after each failed attempt), so a restarted hub is not met
/// by every site in the same second.
const LEAF_RECONNECT: &str = "2s";

/// A TLS handshake may take this long (nats-server's default is 2 s, which thousands of
/// handshakes at once on a restarted hub outlast, each failure bringing another attempt).
const TLS_TIMEOUT_S: u32 = 10;

/// How long a connection may wait for the identity service's answer (nats-server's default is
/// 2 s, which a storm of returning sites outlasts).
const CALLOUT_TIMEOUT_S: u32 = 10;

/// The issuer kept from an earlier run, or a new account key.
fn issuer_key(path: &Path) -> anyhow::Result<Key> {
    let pair = match path.exists() {
        true => crate::run::identity::issuer(path)?,
        false => nkeys::KeyPair::new_account(),
    };
    Ok(Key { public_key: pair.public_key(), seed: pair.seed().context("the key pair has no seed")? })
}

/// The key kept from an earlier run, or a new one.
fn key_pair(existing: Option<String>) -> anyhow::Result<Key> {
    let pair = match existing {
        Some(seed) => nkeys::KeyPair::from_seed(&seed).context("a seed file there holds no valid seed")?,
        None => nkeys::KeyPair::new_user(),
    };
    Ok(Key { public_key: pair.public_key(), seed: pair.seed().context("the key pair has no seed")? })
}

fn read_seed(path: &Path) -> Option<String> {
    bus_schema::runtime::Access::seed_from_file(path).ok()
}

fn random_password() -> anyhow::Result<String> {
    let mut bytes = [0u8; 24];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The plan the flags describe, checked.
pub fn plan(args: &NatsConfigArgs) -> anyhow::Result<Plan> {
    let link =
        regions::core_link(args.region.as_deref(), &args.core, args.core_key.as_deref(), args.core_ca.as_deref())?;
    let region = args.region.clone().map(|r| (r, link));
    let domain = region.as_ref().map_or(HUB_DOMAIN.to_string(), |(r, _)| bus_schema::access::region_domain(r));
    let mut sites = Vec::new();
    for s in &args.sites {
        let site = SiteId::try_from(s.trim().to_string()).map_err(|e| anyhow::anyhow!("--sites: {e}"))?;
        if site.as_str() == domain {
            bail!("--sites: {domain:?} is the hub's JetStream domain, so no site may have that id");
        }
        // A site's leaf node has its id as its domain: one named as the core would be taken for it.
        if region.is_some() && site.as_str() == bus_schema::access::CORE_DOMAIN {
            bail!("--sites: {site:?} is the core's JetStream domain, so no site of a region may have that id");
        }
        if sites.contains(&site) {
            bail!("--sites: {site} is named twice");
        }
        sites.push(site);
    }
    let mut hubs =
        args.hubs.iter().map(|h| h.parse::<Hub>().map_err(anyhow::Error::msg)).collect::<Result<Vec<_>, _>>()?;
    if hubs.len() == 2 {
        bail!("two hub servers cannot keep a JetStream quorum when one fails: give one, or three or more");
    }
    if !args.leaf_advertise.is_empty() {
        if args.leaf_advertise.len() != hubs.len() {
            bail!(
                "--leaf-advertise is given {} time(s) for {} hub server(s): give one per --hub, in the same order",
                args.leaf_advertise.len(),
                hubs.len()
            );
        }
        for (hub, address) in hubs.iter_mut().zip(&args.leaf_advertise) {
            let valid = address
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
            if !valid {
                bail!("--leaf-advertise {address:?} is not HOST:PORT");
            }
            hub.leaf_advertise = Some(address.clone());
        }
    }
    let relays =
        args.relays.iter().map(|r| r.parse::<Relay>().map_err(anyhow::Error::msg)).collect::<Result<Vec<_>, _>>()?;
    if !relays.is_empty() && args.site_auth == Some(SiteAuth::Enroll) {
        bail!(
            "--relay lets in sites with static users: enrolled sites connect to the hub, whose auth callout lets them in"
        );
    }
    if region.is_some() && args.site_auth == Some(SiteAuth::Enroll) {
        bail!(
            "--region lets in sites with static users: the identity service's credentials grant a site the hub's \
             domain `hub`, not a region's"
        );
    }
    let tls = match (&args.tls_cert, &args.tls_key, &args.tls_ca) {
        (Some(cert), Some(key), Some(ca)) => {
            for f in [cert, key, ca] {
                if !f.is_file() {
                    bail!("{} does not exist", f.display());
                }
            }
            Some(Tls { cert: abs(cert)?, key: abs(key)?, ca: abs(ca)? })
        }
        _ => None,
    };
    Ok(Plan {
        sites,
        hubs,
        relays,
        store_dir: args.store_dir.clone(),
        site_listen: args.site_listen.clone(),
        tls,
        site_auth: args.site_auth.unwrap_or_default(),
        site_creds: args.site_creds.clone(),
        region,
    })
}

fn abs(p: &Path) -> anyhow::Result<PathBuf> {
    std::fs::canonicalize(p).with_context(|| format!("{}", p.display()))
}

/// Writes the configuration into `out`, keeping keys an earlier run left there.
pub fn write(plan: &Plan, out: &Path) -> anyhow::Result<Vec<File>> {
    let static_sites = plan.sites.iter().filter(|_| plan.site_auth == SiteAuth::Static);
    let roles = Role::services().into_iter().chain(static_sites.map(|s| Role::Site(s.to_string())));
    let mut users = Vec::new();
    for role in roles {
        let path = match &role {
            Role::Site(site) => out.join(format!("sites/{site}/gateway.nk")),
            role => out.join(format!("users/{}.nk", role.user())),
        };
        users.push(User { role, key: key_pair(read_seed(&path))? });
    }
    let relays = (0..plan.relays.len())
        .map(|i| key_pair(read_seed(&out.join(format!("relays/{}.nk", relay_name(i))))))
        .collect::<Result<Vec<_>, _>>()?;
    let system = key_pair(read_seed(&out.join("users/sys.nk")))?;
    let route_password = existing_route_password(out).map_or_else(random_password, Ok)?;
    let issuer = issuer_key(&out.join("identity/issuer.nk"))?;
    let files = render(plan, &users, &relays, &system, &issuer, &route_password);
    write_files(out, &files)?;
    Ok(files)
}

/// Writes `files` under `out`, making their directories.
fn write_files(out: &Path, files: &[File]) -> anyhow::Result<()> {
    for file in files {
        let path = out.join(&file.path);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        }
        write_file(&path, &file.text, file.secret)?;
    }
    Ok(())
}

fn existing_route_password(out: &Path) -> Option<String> {
    let text = std::fs::read_to_string(out.join(format!("hub/{}.conf", hub_name(0)))).ok()?;
    let line = text.lines().find(|l| l.contains("authorization { user: route, password: "))?;
    line.split('"').nth(1).map(String::from)
}

fn write_file(path: &Path, text: &str, secret: bool) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true).mode(if secret { 0o600 } else { 0o644 });
    let mut f = options.open(path).with_context(|| format!("write {}", path.display()))?;
    f.write_all(text.as_bytes()).with_context(|| format!("write {}", path.display()))?;
    Ok(())
}

pub async fn run(cmd: DeployCommand, url: &str) -> anyhow::Result<ExitCode> {
    match cmd {
        DeployCommand::CoreConfig(args) => {
            for f in regions::write_core(&args)? {
                println!("{}{}", args.out.join(&f.path).display(), if f.secret { "  (secret, 0600)" } else { "" });
            }
            println!(
                "\nStart the core with `nats-server -c core/core.conf`; give each region's `deploy nats-config \
                 --region <region> --core HOST:LEAF` its core/regions/<region>.nk as --core-key, then \
                 `landfall deploy region-link --region <region>` here as the operator (core/users/operator.nk)."
            );
            Ok(ExitCode::SUCCESS)
        }
        DeployCommand::RegionLink(args) => {
            let core = crate::cli::connect::connect(url).await?;
            let linked = regions::link_region(&core, &args.region).await?;
            println!(
                "region {}: commands published at the core on {} are kept in {} and taken by the region's hub{}; \
                 its events are mirrored into {}",
                args.region,
                bus_schema::names::region_commands(&args.region),
                linked.commands,
                if linked.source_added { " (source added)" } else { " (already sourcing)" },
                linked.events
            );
            Ok(ExitCode::SUCCESS)
        }
        DeployCommand::NatsConfig(args) => {
            let plan = plan(&args)?;
            let files = write(&plan, &args.out)?;
            for f in &files {
                println!("{}{}", args.out.join(&f.path).display(), if f.secret { "  (secret, 0600)" } else { "" });
            }
            let hubs = plan.hubs.len();
            if !plan.relays.is_empty() {
                println!(
                    "\n{} relay(s) in front of the hub: start each with `nats-server -c relays/<relay>.conf`; \
                     each site's gateway connects to its relay (its leaf.conf says which).",
                    plan.relays.len()
                );
            }
            println!(
                "\n{} hub server{} ({}), {} site leaf node{}. Start each with `nats-server -c FILE`; give each \
                 service its users/<name>.nk as --nats-nkey-file, and each site's gateway its \
                 sites/<site>/gateway.nk with --js-domain {}.",
                hubs,
                if hubs == 1 { "" } else { "s" },
                if hubs == 1 { "streams at one replica" } else { "a JetStream cluster, streams at three replicas" },
                plan.sites.len(),
                if plan.sites.len() == 1 { "" } else { "s" },
                plan.domain(),
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

pub mod regions;
mod servers;
#[cfg(test)]
mod tests;
