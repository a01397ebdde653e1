//! `skiff-bench proxy`: the service proxy and the cluster DNS server at
//! scale, and how soon a ready endpoint takes traffic. Needs root.
//!
//! Every iptables and nftables change and every packet stays inside a network namespace
//! the run creates (`skiff-bench-proxy-<pid>`): [`in_namespace`] adds it,
//! runs this same command again inside it with `--inside <name>`, and
//! deletes it when that run ends, failed or not. The run inside refuses to
//! start anywhere but in that namespace (`ip netns identify`). There it brings `lo` up, adds `sb0`
//! (a dummy interface, or one end of a veth pair where the kernel has no
//! dummy driver) with 10.250.0.1/24, and routes the service range
//! 10.96.0.0/12 to it, so connections to cluster IPs leave through the
//! OUTPUT chain, where the proxy's DNAT takes them.
//!
//! Steps, in order:
//! 1. **Sync**, once per mode of `--modes` (iptables, nftables): `services`
//!    Services with `endpoints` ready endpoints each
//!    (one EndpointSlice per Service, 10,000 endpoints by default), built
//!    as JSON and read into k8s-openapi objects as an informer would. One
//!    in-process [`Syncer`] (node `bench-sync`) writes their rules. A
//!    **full** sync (`full_runs` times, the syncer forgetting what it wrote
//!    and the tables emptied, untimed, before each: `iptables-save`, every
//!    chain and jump written), a **resync** over the same rules in place
//!    (`full_runs` times: what a restarted proxy does; `iptables-save`, the
//!    comparison, nothing written) and an **incremental** one
//!    (`incremental_runs` times, each removing one endpoint of one Service
//!    or putting it back: only the changed chains written) are each timed
//!    from the model ([`service_ports`]) to the sync's end. Then the rules
//!    programmed are counted (`-A` lines of `iptables-save`) and removed.
//!    In the nftables mode a full sync lists the node's table and rewrites
//!    all of it (there is no comparison: the transaction replaces it
//!    atomically), the resync does the same over the table in place, and
//!    the rules are counted from `nft list table`.
//! 2. **DNS**: the server's [`Records`] for the same Services on
//!    127.0.0.1; `dns_clients` tasks each send one A query at a time for a
//!    random Service's name over UDP for `dns_duration`. Queries/s and
//!    latency (send to reply). The clients share the process, and the 2
//!    cores, with the server.
//! 3. **Ready → traffic**, once per mode: a 1-member Skiff (`skiff
//!    apiserver`) and a `skiff proxy` process against it, `ready_runs` times: a Service
//!    without selector (ClusterIP, 80/TCP) and its EndpointSlice with one
//!    endpoint 10.250.0.1:P, not ready, P a port this process listens on;
//!    once connecting to the cluster IP is refused (the proxy rejects
//!    service ports without endpoints) and [`QUIET`] has passed since the
//!    slice's create, the slice is updated to ready at t0 and connect() is
//!    tried every millisecond until one succeeds, at t1, and the listener
//!    accepts it. t1 - t0 includes the update's write, its watch event to
//!    the proxy, the proxy's sync and its `iptables-restore` or `nft -f`. [`PAUSE`]
//!    follows each run. At the end the proxy is killed and `skiff proxy
//!    --cleanup` removes its chains.

use std::fmt::Write as _;
use std::fs::OpenOptions;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hickory_proto::op::{Message, MessageType, OpCode, Query};
use hickory_proto::rr::{Name, RecordType};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use skiff_api::Kind;
use skiff_client::Client;
use skiff_node::dns::{server, Records};
use skiff_node::proxy::model::service_ports;
use skiff_node::proxy::rules::{self, Context as RuleContext};
use skiff_node::proxy::{nft, Mode, ProxyConfig as SyncerConfig, Synced, Syncer};
use skiff_shutdown::Shutdown;
use tokio::net::{TcpListener, TcpStream, UdpSocket};

use crate::cluster::{tail, Cluster, ClusterSpec, EtcdTiming, System};
use crate::hollow::{ensure_namespace, info, timed};
use crate::latency::Latency;

/// Lines between these markers in bench/README.md are replaced by each run
/// of `skiff-bench proxy --readme`.
pub const BEGIN: &str = "<!-- skiff-bench proxy results: begin (written by `make bench-proxy`) -->";
pub const END: &str = "<!-- skiff-bench proxy results: end -->";

/// The benchmark's objects live here (in the cluster and in the model).
const NAMESPACE: &str = "bench-proxy";
/// The in-process syncer's node; its chains carry this name's tag.
const SYNC_NODE: &str = "bench-sync";
/// The `skiff proxy` process's `--hostname-override`.
const PROXY_NODE: &str = "bench";
const CLUSTER_CIDR: &str = "10.244.0.0/16";
const SERVICE_CIDR: &str = "10.96.0.0/12";
/// The interface the service range is routed to, and its address: the
/// endpoint of the ready → traffic step.
const DEVICE: &str = "sb0";
const DEVICE_ADDRESS: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 1);
const DOMAIN: &str = "cluster.local";
/// The proxy's `--iptables-min-sync-period`.
const MIN_SYNC_PERIOD: Duration = Duration::from_secs(1);
/// From the last setup write of a ready → traffic run to t0, so that the
/// syncs the setup causes cannot hold t0's change back: a sync may come up
/// to a min sync period after the last one. (Sized when the proxy still
/// synced once per queued notification; kept so figures stay comparable.)
const QUIET: Duration = Duration::from_millis(3 * MIN_SYNC_PERIOD.as_millis() as u64 + 200);
/// After each ready → traffic run, before the next one's writes: the
/// proxy's min sync period passes since the sync that let t1 through.
const PAUSE: Duration = Duration::from_millis(1_500);
/// How often connect() is tried while waiting for the endpoint.
const CONNECT_EVERY: Duration = Duration::from_millis(1);
/// One connect() attempt: refusals and DNATed connections are immediate;
/// this bounds a SYN nobody answers (before the proxy's first sync).
const CONNECT_TIMEOUT: Duration = Duration::from_millis(100);
/// Consecutive refusals, [`REFUSED_EVERY`] apart, that count as refused.
const REFUSED_TIMES: usize = 5;
const REFUSED_EVERY: Duration = Duration::from_millis(10);
/// A DNS query without a reply within this long is lost.
const DNS_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Clone, Debug)]
pub struct ProxyConfig {
    /// The `skiff` executable (with the `apiserver` and `proxy` subcommands).
    pub skiff: PathBuf,
    /// The member's data and the logs go here.
    pub dir: PathBuf,
    /// The network namespace this run is in (for the report).
    pub netns: String,
    /// Extra flags for the member.
    pub skiff_args: Vec<String>,
    pub services: usize,
    /// Ready endpoints per Service.
    pub endpoints: usize,
    pub full_runs: usize,
    pub incremental_runs: usize,
    pub dns_clients: usize,
    pub dns_duration: Duration,
    pub ready_runs: usize,
    /// A run whose endpoint takes no connection within this long fails.
    pub ready_timeout: Duration,
    /// The proxy modes measured, each in the sync and ready → traffic steps.
    pub modes: Vec<Mode>,
}

/// The mode's `--proxy-mode` value.
pub fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Iptables => "iptables",
        Mode::Nftables => "nftables",
    }
}

/// Adds the network namespace `skiff-bench-proxy-<pid>`, runs this
/// command again inside it (`args`: the arguments after the program, plus
/// `--inside <name>`), and deletes the namespace however that ends.
pub async fn in_namespace(args: &[String]) -> Result<()> {
    let name = format!("skiff-bench-proxy-{}", std::process::id());
    let namespace = Namespace::add(&name)?;
    let exe = std::env::current_exe().context("finding this executable")?;
    let mut child = tokio::process::Command::new("ip")
        .args(["netns", "exec", &namespace.0])
        .arg(&exe)
        .args(args)
        .args(["--inside", &namespace.0])
        .spawn()
        .context("running `ip netns exec`")?;
    // Ctrl-C reaches the child (one process group); this process waits
    // for it, so the namespace is still deleted.
    let status = tokio::select! {
        status = child.wait() => status,
        _ = tokio::signal::ctrl_c() => child.wait().await,
    }
    .context("waiting for the run inside the namespace")?;
    drop(namespace);
    if !status.success() {
        bail!("the run inside network namespace {name} failed ({status})");
    }
    Ok(())
}

/// A network namespace this run added; dropping it deletes it.
struct Namespace(String);

impl Namespace {
    fn add(name: &str) -> Result<Namespace> {
        must_run("ip", &["netns", "add", name]).context("adding a network namespace (needs root)")?;
        Ok(Namespace(name.to_string()))
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        if let Err(e) = must_run("ip", &["netns", "delete", &self.0]) {
            eprintln!("skiff-bench: deleting network namespace {}: {e:#}", self.0);
        }
    }
}

/// Runs `program args`; its stdout, or its stderr as the error.
fn must_run(program: &str, args: &[&str]) -> Result<String> {
    let output = Command::new(program).args(args).output().with_context(|| format!("running {program}"))?;
    if !output.status.success() {
        bail!("{program} {} failed: {}", args.join(" "), String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Whether this process is in the network namespace named `name`.
fn in_namespace_named(name: &str) -> Result<bool> {
    Ok(must_run("ip", &["netns", "identify"])?.lines().any(|l| l.trim() == name))
}

/// `lo` up, [`DEVICE`] with [`DEVICE_ADDRESS`], the service range routed
/// to it. The kind of device used.
fn set_up_network() -> Result<&'static str> {
    must_run("ip", &["link", "set", "lo", "up"])?;
    let kind = if must_run("ip", &["link", "add", DEVICE, "type", "dummy"]).is_ok() {
        "dummy"
    } else {
        must_run("ip", &["link", "add", DEVICE, "type", "veth", "peer", "name", "sb1"])?;
        must_run("ip", &["link", "set", "sb1", "up"])?;
        "veth"
    };
    must_run("ip", &["addr", "add", &format!("{DEVICE_ADDRESS}/24"), "dev", DEVICE])?;
    must_run("ip", &["link", "set", DEVICE, "up"])?;
    must_run("ip", &["route", "add", SERVICE_CIDR, "dev", DEVICE])?;
    Ok(kind)
}

/// Service `i`'s cluster IP: 10.100.x.y, inside the service range.
fn cluster_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 100, (i / 250) as u8, (i % 250 + 1) as u8)
}

/// Endpoint `j` of Service `i`: 10.244.x.y, inside the cluster CIDR.
fn endpoint_ip(i: usize, j: usize, per_service: usize) -> Ipv4Addr {
    let n = i * per_service + j;
    Ipv4Addr::new(10, 244, (n / 250) as u8, (n % 250 + 1) as u8)
}

fn service_name(i: usize) -> String {
    format!("svc-{i}")
}

/// Service `i` of the sync and DNS steps: ClusterIP, port `http` 80/TCP.
pub fn service(i: usize) -> Value {
    let ip = cluster_ip(i).to_string();
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": NAMESPACE, "name": service_name(i)},
        "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip],
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]},
    })
}

/// Service `i`'s EndpointSlice: its endpoints but those in `missing`, all ready.
pub fn slice(i: usize, per_service: usize, missing: Option<usize>) -> Value {
    let endpoints: Vec<Value> = (0..per_service)
        .filter(|j| Some(*j) != missing)
        .map(|j| {
            json!({"addresses": [endpoint_ip(i, j, per_service).to_string()], "conditions": {"ready": true},
                   "nodeName": format!("node-{}", j % 4)})
        })
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"namespace": NAMESPACE, "name": format!("{}-0", service_name(i)),
                     "labels": {"kubernetes.io/service-name": service_name(i)}},
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    })
}

/// Incremental run `k`: the Service it changes, the endpoint, and whether
/// the endpoint is removed (even runs) or put back (the odd run after).
pub fn flip(k: usize, services: usize, per_service: usize) -> (usize, usize, bool) {
    let pair = k / 2;
    ((pair * 37) % services, pair % per_service, k.is_multiple_of(2))
}

/// `-A` lines of an `iptables-save`, per table.
pub fn rules_in_save(saved: &str) -> Vec<(String, usize)> {
    let mut out: Vec<(String, usize)> = Vec::new();
    for line in saved.lines() {
        if let Some(table) = line.strip_prefix('*') {
            out.push((table.trim().to_string(), 0));
        } else if line.starts_with("-A ") {
            if let Some((_, n)) = out.last_mut() {
                *n += 1;
            }
        }
    }
    out.retain(|(_, n)| *n > 0);
    out
}

/// Rules (lines in chain blocks but the hook line) and map elements
/// (`key : verdict` pairs in map blocks) of an `nft list table`.
pub fn nft_objects_in_listing(listed: &str) -> Vec<(String, usize)> {
    let (mut rules, mut elements) = (0, 0);
    let mut block = "";
    for line in listed.lines().map(str::trim) {
        if line.starts_with("chain ") {
            block = "chain";
        } else if line.starts_with("map ") || line.starts_with("set ") {
            block = "map";
        } else if line == "}" {
            block = "";
        } else if block == "chain" && !line.is_empty() && !line.starts_with("type ") {
            rules += 1;
        } else if block == "map" && !line.starts_with("type ") {
            elements += line.matches(" : ").count();
        }
    }
    vec![("rules".to_string(), rules), ("map elements".to_string(), elements)]
}

fn typed<T: k8s_openapi::serde::de::DeserializeOwned>(value: Value) -> Result<Arc<T>> {
    Ok(Arc::new(serde_json::from_value(value).context("reading an object built by the bench")?))
}

/// Step 1's figures, for one mode.
#[derive(Clone)]
pub struct SyncFigures {
    pub mode: Mode,
    pub services: usize,
    /// Per Service.
    pub endpoints: usize,
    /// Every chain written into tables holding none of them.
    pub full: Latency,
    pub full_each: Vec<Duration>,
    /// Of `full`, the model's share ([`service_ports`]).
    pub full_model: Latency,
    /// Chains the last full sync wrote.
    pub full_chains: usize,
    /// A full sync over the same rules in place (a restarted proxy): read
    /// back, compared, nothing written.
    pub resync: Latency,
    pub resync_each: Vec<Duration>,
    /// Chains the resyncs wrote, summed (0 when the comparison holds).
    pub resync_chains: usize,
    pub incremental: Latency,
    pub incremental_runs: usize,
    pub incremental_model: Latency,
    /// `-A` lines per table after the syncs (iptables); rules and map
    /// elements in the node's table (nftables).
    pub rules: Vec<(String, usize)>,
    /// One `iptables-save` of those rules (a full sync runs one), or one
    /// `nft list table` of them.
    pub save: Duration,
    /// Chains the in-process cleanup removed.
    pub cleaned_chains: usize,
}

/// Step 2's figures.
#[derive(Clone, Default)]
pub struct DnsFigures {
    pub clients: usize,
    pub wall: Duration,
    pub answered: u64,
    /// Replies that were not NOERROR with an answer.
    pub wrong: u64,
    pub lost: u64,
    pub latency: Latency,
    pub names: usize,
    pub build: Duration,
}

/// Step 3's figures, for one mode.
#[derive(Clone)]
pub struct ReadyFigures {
    pub mode: Mode,
    pub to_traffic: Latency,
    pub each: Vec<Duration>,
    /// t0 to the update's reply.
    pub write: Latency,
    /// connect() attempts refused before the one that got through, summed.
    pub refused: usize,
    /// What `iptables-save` and `nft list tables` held of Skiff's after
    /// `skiff proxy --cleanup`.
    pub left_after_cleanup: usize,
}

#[derive(Clone, Default)]
pub struct ProxyReport {
    pub sync: Vec<SyncFigures>,
    pub dns: DnsFigures,
    pub ready: Vec<ReadyFigures>,
    pub settings: Vec<String>,
}

pub async fn run(config: &ProxyConfig) -> Result<ProxyReport> {
    if config.services == 0 || config.services > 62_500 || config.endpoints == 0 {
        bail!("--services must be 1 to 62,500 and --endpoints positive");
    }
    if config.services * config.endpoints > 62_500 {
        bail!("--services x --endpoints must fit in 10.244.0.0/16 (62,500 endpoints at most)");
    }
    if config.full_runs == 0 || config.incremental_runs == 0 || config.dns_clients == 0 || config.ready_runs == 0 {
        bail!("--full-runs, --incremental-runs, --dns-clients and --ready-runs must be positive");
    }
    if config.modes.is_empty() {
        bail!("--modes must name at least one of iptables, nftables");
    }
    if !in_namespace_named(&config.netns)? {
        bail!("not inside network namespace {}: refusing to touch iptables (run without --inside)", config.netns);
    }
    let device = set_up_network()?;
    let mut report = ProxyReport::default();
    report.settings.push(format!(
        "network namespace `{}`, made for the run and deleted after it: `lo` up, `{DEVICE}` ({device}) \
         {DEVICE_ADDRESS}/24, route {SERVICE_CIDR} dev {DEVICE}; no rule or packet of the run leaves it",
        config.netns
    ));
    let services: Vec<Arc<Service>> = (0..config.services).map(|i| typed(service(i))).collect::<Result<_>>()?;
    let mut slices: Vec<Arc<EndpointSlice>> =
        (0..config.services).map(|i| typed(slice(i, config.endpoints, None))).collect::<Result<_>>()?;

    for &mode in &config.modes {
        eprintln!("== sync ({}): {} services x {} endpoints", mode_name(mode), config.services, config.endpoints);
        report.sync.push(sync_step(config, mode, &services, &mut slices).await?);
    }
    report.settings.push(format!(
        "sync: {} Services (ClusterIP, one port 80/TCP) x {} ready endpoints, one EndpointSlice each, read from JSON \
         into k8s-openapi objects; one in-process `Syncer` (node `{SYNC_NODE}`, cluster CIDR {CLUSTER_CIDR}) per \
         mode; each run timed from `service_ports` to the exit of the command that writes the rules. iptables: \
         `iptables-restore --noflush --wait`; a full run after `forget()` first reads the tables back \
         (`iptables-save`) and writes what differs from them. nftables: `nft -f -`; a full run lists the table's \
         chains and sets (`nft list chains ip`, `nft list sets ip`) and rewrites the whole table in one transaction",
        config.services, config.endpoints
    ));

    eprintln!("== DNS: {} clients for {:?}", config.dns_clients, config.dns_duration);
    report.dns = dns_step(config, &services, &slices).await?;
    report.settings.push(format!(
        "DNS: `skiff_node::dns::server` in this process on 127.0.0.1, the table of the same Services; {} client \
         tasks in the same process (tokio, 2 cores shared with the server), each one UDP socket and one A query \
         for `svc-N.{NAMESPACE}.svc.{DOMAIN}` (N random) at a time for {:?}; a query unanswered after {:?} is lost",
        config.dns_clients, config.dns_duration, DNS_TIMEOUT
    ));

    for &mode in &config.modes {
        eprintln!("== ready -> traffic ({}): {} runs", mode_name(mode), config.ready_runs);
        report.ready.push(ready_step(config, mode, &mut report.settings).await?);
    }
    Ok(report)
}

async fn sync_step(
    config: &ProxyConfig,
    mode: Mode,
    services: &[Arc<Service>],
    slices: &mut [Arc<EndpointSlice>],
) -> Result<SyncFigures> {
    let context = RuleContext { tag: rules::tag(SYNC_NODE), cluster_cidr: CLUSTER_CIDR.into() };
    let mut syncer_config = SyncerConfig::new(SYNC_NODE, CLUSTER_CIDR);
    syncer_config.mode = mode;
    let mut syncer = Syncer::new(syncer_config, context.clone());
    let mut figures = SyncFigures {
        mode,
        services: config.services,
        endpoints: config.endpoints,
        full: Latency::default(),
        full_each: Vec::new(),
        full_model: Latency::default(),
        full_chains: 0,
        resync: Latency::default(),
        resync_each: Vec::new(),
        resync_chains: 0,
        incremental: Latency::default(),
        incremental_runs: 0,
        incremental_model: Latency::default(),
        rules: Vec::new(),
        save: Duration::ZERO,
        cleaned_chains: 0,
    };
    for run in 0..config.full_runs {
        skiff_node::proxy::cleanup(None).await.context("emptying the tables")?;
        syncer.forget();
        let (total, model, synced) = timed_sync(&mut syncer, services, slices).await?;
        eprintln!(
            "  full sync {}: {:.1} ms (model {:.1} ms), {} chains",
            run + 1,
            ms_of(total),
            ms_of(model),
            synced.chains_written
        );
        figures.full.record(total);
        figures.full_model.record(model);
        figures.full_each.push(total);
        figures.full_chains = synced.chains_written;
    }
    for run in 0..config.full_runs {
        syncer.forget();
        let (total, _, synced) = timed_sync(&mut syncer, services, slices).await?;
        eprintln!("  resync {}: {:.1} ms, {} chains written", run + 1, ms_of(total), synced.chains_written);
        figures.resync.record(total);
        figures.resync_each.push(total);
        figures.resync_chains += synced.chains_written;
    }
    for k in 0..config.incremental_runs {
        let (i, j, remove) = flip(k, config.services, config.endpoints);
        slices[i] = typed(slice(i, config.endpoints, remove.then_some(j)))?;
        let (total, model, _) = timed_sync(&mut syncer, services, slices).await?;
        figures.incremental.record(total);
        figures.incremental_model.record(model);
        figures.incremental_runs += 1;
    }
    // The last odd run put its endpoint back; an odd count leaves one out.
    if !config.incremental_runs.is_multiple_of(2) {
        let (i, _, _) = flip(config.incremental_runs - 1, config.services, config.endpoints);
        slices[i] = typed(slice(i, config.endpoints, None))?;
    }
    let started = Instant::now();
    match mode {
        Mode::Iptables => {
            let saved = must_run("iptables-save", &[])?;
            figures.save = started.elapsed();
            figures.rules = rules_in_save(&saved);
        }
        Mode::Nftables => {
            let listed = must_run("nft", &["list", "table", "ip", &nft::table(&context.tag)])?;
            figures.save = started.elapsed();
            figures.rules = nft_objects_in_listing(&listed);
        }
    }
    figures.cleaned_chains = skiff_node::proxy::cleanup(None).await.context("removing the sync step's chains")?;
    Ok(figures)
}

/// One sync of every Service: the whole time, the model's part, and what it wrote.
async fn timed_sync(
    syncer: &mut Syncer,
    services: &[Arc<Service>],
    slices: &[Arc<EndpointSlice>],
) -> Result<(Duration, Duration, Synced)> {
    let started = Instant::now();
    let ports = service_ports(services, slices, SYNC_NODE);
    let model = started.elapsed();
    let synced = syncer.sync(&ports).await.context("syncing the rules")?;
    Ok((started.elapsed(), model, synced))
}

/// Service `i`'s A query, with id 0 (each send sets its own).
fn query(i: usize) -> Result<Vec<u8>> {
    let name = format!("{}.{NAMESPACE}.svc.{DOMAIN}.", service_name(i));
    let mut message = Message::new(0, MessageType::Query, OpCode::Query);
    message.add_query(Query::query(Name::from_str(&name).with_context(|| format!("name {name}"))?, RecordType::A));
    message.to_vec().context("encoding a DNS query")
}

/// What a reply to the query with `id` says, from its header (RFC 1035
/// 4.1.1): `None` when it is another query's; `Some(true)` for NOERROR
/// with at least one answer.
pub fn reply_to(reply: &[u8], id: u16) -> Option<bool> {
    if reply.len() < 12 || u16::from_be_bytes([reply[0], reply[1]]) != id || reply[2] & 0x80 == 0 {
        return None;
    }
    let rcode = reply[3] & 0x0f;
    let answers = u16::from_be_bytes([reply[6], reply[7]]);
    Some(rcode == 0 && answers > 0)
}

async fn dns_step(
    config: &ProxyConfig,
    services: &[Arc<Service>],
    slices: &[Arc<EndpointSlice>],
) -> Result<DnsFigures> {
    let started = Instant::now();
    let records = Records::build(DOMAIN, services, slices);
    let build = started.elapsed();
    let (udp, tcp) = server::bind("127.0.0.1:0".parse()?).context("binding the DNS server")?;
    let addr = udp.local_addr()?;
    let (_table, records) = tokio::sync::watch::channel(Arc::new(records));
    let shutdown = Shutdown::new();
    shutdown.spawn(server::serve(udp, tcp, records, Vec::new(), shutdown.clone()));
    let queries: Arc<Vec<Vec<u8>>> = Arc::new((0..config.services).map(query).collect::<Result<_>>()?);
    must_answer(addr, &queries[0], cluster_ip(0)).await?;

    let deadline = Instant::now() + config.dns_duration;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..config.dns_clients {
        let queries = queries.clone();
        tasks.push(tokio::spawn(async move { dns_client(addr, &queries, c as u64, deadline).await }));
    }
    let mut figures = DnsFigures { clients: config.dns_clients, names: config.services, build, ..Default::default() };
    for task in tasks {
        let client = task.await.context("a DNS client task")??;
        figures.answered += client.answered;
        figures.wrong += client.wrong;
        figures.lost += client.lost;
        figures.latency.merge(&client.latency);
    }
    figures.wall = started.elapsed();
    shutdown.stop().await;
    Ok(figures)
}

/// Checks one query and its answer with hickory before the load.
async fn must_answer(server: SocketAddr, query: &[u8], expected: Ipv4Addr) -> Result<()> {
    let socket = UdpSocket::bind("127.0.0.1:0").await?;
    socket.send_to(query, server).await?;
    let mut buffer = vec![0u8; 4096];
    let (len, _) = tokio::time::timeout(DNS_TIMEOUT, socket.recv_from(&mut buffer))
        .await
        .context("the DNS server did not answer")??;
    let reply = Message::from_vec(&buffer[..len]).context("decoding the DNS reply")?;
    let answers: Vec<String> = reply.answers.iter().map(|r| r.data.to_string()).collect();
    if answers != [expected.to_string()] {
        bail!("the DNS server answered {answers:?} for svc-0, not {expected}");
    }
    Ok(())
}

#[derive(Default)]
struct ClientCounts {
    answered: u64,
    wrong: u64,
    lost: u64,
    latency: Latency,
}

async fn dns_client(server: SocketAddr, queries: &[Vec<u8>], seed: u64, deadline: Instant) -> Result<ClientCounts> {
    let socket = UdpSocket::bind("127.0.0.1:0").await?;
    socket.connect(server).await?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut counts = ClientCounts::default();
    let mut buffer = vec![0u8; 4096];
    let mut id: u16 = 0;
    while Instant::now() < deadline {
        id = id.wrapping_add(1);
        let mut query = queries[rng.gen_range(0..queries.len())].clone();
        query[..2].copy_from_slice(&id.to_be_bytes());
        let sent = Instant::now();
        socket.send(&query).await?;
        let outcome = tokio::time::timeout(DNS_TIMEOUT, async {
            loop {
                let len = socket.recv(&mut buffer).await?;
                // A late reply to a lost query is skipped.
                if let Some(ok) = reply_to(&buffer[..len], id) {
                    return io::Result::Ok(ok);
                }
            }
        })
        .await;
        match outcome {
            Ok(Ok(true)) => {
                counts.answered += 1;
                counts.latency.record(sent.elapsed());
            }
            Ok(Ok(false)) => counts.wrong += 1,
            Ok(Err(e)) => return Err(e).context("receiving a DNS reply"),
            Err(_) => counts.lost += 1,
        }
    }
    Ok(counts)
}

/// A `skiff proxy` process; dropping it kills it.
struct ProxyProcess {
    child: Child,
    log: PathBuf,
}

impl ProxyProcess {
    fn spawn(skiff: &Path, server: &str, mode: Mode, log: PathBuf) -> Result<ProxyProcess> {
        let file = OpenOptions::new().create(true).append(true).open(&log)?;
        let child = Command::new(skiff)
            .args(["proxy", "--server", server, "--hostname-override", PROXY_NODE])
            .args(["--proxy-mode", mode_name(mode)])
            .args(["--iptables-min-sync-period", &format!("{}s", MIN_SYNC_PERIOD.as_secs())])
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .context("starting skiff proxy")?;
        Ok(ProxyProcess { child, log })
    }

    /// Fails with the log's tail when the proxy has exited.
    fn must_run(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("skiff proxy exited ({status}); its log ({}) ends:\n{}", self.log.display(), tail(&self.log));
        }
        Ok(())
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn ready_step(config: &ProxyConfig, mode: Mode, settings: &mut Vec<String>) -> Result<ReadyFigures> {
    let spec = ClusterSpec {
        system: System::Skiff,
        binary: config.skiff.clone(),
        members: 1,
        dir: config.dir.clone(),
        etcd_timing: EtcdTiming { heartbeat_ms: 40, election_timeout_ms: 200 },
        extra_args: config.skiff_args.clone(),
        skiff_subcommand: "apiserver",
    };
    let cluster = Cluster::launch(spec).await?;
    let endpoints = cluster.endpoints();
    let client = Client::new(&endpoints)?;
    ensure_namespace(&client, NAMESPACE).await?;
    let log = config.dir.join(format!("proxy-{}.log", mode_name(mode)));
    let mut proxy = ProxyProcess::spawn(&config.skiff, &endpoints[0], mode, log)?;
    settings.push(format!(
        "ready → traffic ({}): 1 Skiff member on 127.0.0.1 (`skiff apiserver`{}, fsync on) and `skiff proxy --server \
         {} --hostname-override {PROXY_NODE} --proxy-mode {} --iptables-min-sync-period {}s`; per run a Service without selector \
         and its EndpointSlice (one endpoint {DEVICE_ADDRESS}:P, P a port this process listens on), t0 {:.1} s \
         after the slice's create, {:.1} s between runs; connect() to the cluster IP every {:?} ({:?} timeout each)",
        mode_name(mode),
        if config.skiff_args.is_empty() { String::new() } else { format!(" {}", config.skiff_args.join(" ")) },
        endpoints[0],
        mode_name(mode),
        MIN_SYNC_PERIOD.as_secs(),
        QUIET.as_secs_f64(),
        PAUSE.as_secs_f64(),
        CONNECT_EVERY,
        CONNECT_TIMEOUT,
    ));
    let mut figures = ReadyFigures {
        mode,
        to_traffic: Latency::default(),
        each: Vec::new(),
        write: Latency::default(),
        refused: 0,
        left_after_cleanup: 0,
    };
    for run in 0..config.ready_runs {
        let (took, write, refused) =
            ready_run(config, &client, &mut proxy, &format!("ready-{}-{run}", mode_name(mode))).await?;
        eprintln!(
            "  run {}: ready → traffic {:.1} ms (update written in {:.1} ms)",
            run + 1,
            ms_of(took),
            ms_of(write)
        );
        figures.to_traffic.record(took);
        figures.each.push(took);
        figures.write.record(write);
        figures.refused += refused;
        tokio::time::sleep(PAUSE).await;
    }
    proxy.must_run()?;
    drop(proxy);
    must_run(&config.skiff.to_string_lossy(), &["proxy", "--cleanup"]).context("skiff proxy --cleanup")?;
    figures.left_after_cleanup = must_run("iptables-save", &[])?.lines().filter(|l| l.contains(rules::PREFIX)).count()
        + must_run("nft", &["list", "tables"])?.lines().filter(|l| l.contains(nft::TABLE_PREFIX)).count();
    drop(cluster);
    Ok(figures)
}

/// One ready → traffic run: t1 - t0, the update's write time, and the
/// refusals seen after t0.
async fn ready_run(
    config: &ProxyConfig,
    client: &Client,
    proxy: &mut ProxyProcess,
    name: &str,
) -> Result<(Duration, Duration, usize)> {
    let listener = TcpListener::bind("0.0.0.0:0").await?;
    let port = listener.local_addr()?.port();
    let service = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": NAMESPACE, "name": name},
        "spec": {"type": "ClusterIP", "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]},
    });
    let created = timed(client.create(info(Kind::Service), NAMESPACE, &service)).await?;
    let ip: Ipv4Addr = created["spec"]["clusterIP"]
        .as_str()
        .and_then(|ip| ip.parse().ok())
        .with_context(|| format!("service {name} got no IPv4 cluster IP"))?;
    let target = SocketAddr::from((ip, 80));
    let mut slice = json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"namespace": NAMESPACE, "name": name, "labels": {"kubernetes.io/service-name": name}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [DEVICE_ADDRESS.to_string()], "conditions": {"ready": false}}],
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
    });
    slice = timed(client.create(info(Kind::EndpointSlice), NAMESPACE, &slice)).await?;
    let written = Instant::now();
    must_be_refused(target, proxy, config.ready_timeout).await.with_context(|| format!("{name} ({target})"))?;
    tokio::time::sleep(QUIET.saturating_sub(written.elapsed())).await;

    slice["endpoints"][0]["conditions"]["ready"] = json!(true);
    let t0 = Instant::now();
    let update = client.update(info(Kind::EndpointSlice), &slice);
    let connect = connect_when_open(target, t0 + config.ready_timeout);
    let (updated, connected) = tokio::join!(
        async {
            let r = timed(update).await;
            (r, t0.elapsed())
        },
        connect
    );
    updated.0.context("updating the slice to ready")?;
    let (stream, t1, refused) = match connected {
        Some(c) => c,
        None => {
            proxy.must_run()?;
            bail!("{name} ({target}) took no connection within {:?} of its endpoint being ready", config.ready_timeout);
        }
    };
    let accepted = tokio::time::timeout(Duration::from_secs(1), listener.accept()).await;
    if !matches!(accepted, Ok(Ok(_))) {
        bail!("{name}: connect() to {target} succeeded but the listener on port {port} accepted nothing");
    }
    drop(stream);
    Ok((t1.saturating_duration_since(t0), updated.1, refused))
}

/// Waits until connecting to `target` is refused [`REFUSED_TIMES`] times in a row.
async fn must_be_refused(target: SocketAddr, proxy: &mut ProxyProcess, within: Duration) -> Result<()> {
    let deadline = Instant::now() + within;
    let mut in_a_row = 0;
    while in_a_row < REFUSED_TIMES {
        if Instant::now() > deadline {
            proxy.must_run()?;
            bail!("connecting was not refused within {within:?} (the proxy never rejected the port)");
        }
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(target)).await {
            Ok(Err(e)) if e.kind() == io::ErrorKind::ConnectionRefused => in_a_row += 1,
            Ok(Ok(_)) => bail!("a connection got through before the endpoint was ready"),
            _ => in_a_row = 0,
        }
        tokio::time::sleep(REFUSED_EVERY).await;
    }
    Ok(())
}

/// connect() to `target` every [`CONNECT_EVERY`] until one succeeds: the
/// stream, when, and how many were refused; `None` at `deadline`.
async fn connect_when_open(target: SocketAddr, deadline: Instant) -> Option<(TcpStream, Instant, usize)> {
    let mut refused = 0;
    while Instant::now() < deadline {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(target)).await {
            Ok(Ok(stream)) => return Some((stream, Instant::now(), refused)),
            Ok(Err(e)) if e.kind() == io::ErrorKind::ConnectionRefused => refused += 1,
            _ => {}
        }
        tokio::time::sleep(CONNECT_EVERY).await;
    }
    None
}

fn ms_of(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn ms(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0} ms")
    } else {
        format!("{v:.1} ms")
    }
}

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "NOT met"
    }
}

impl ProxyReport {
    pub fn table(&self) -> String {
        let d = &self.dns;
        let mut out = String::from(
            "| measurement | samples | p50 | p99 | max | target |\n| --- | ---: | ---: | ---: | ---: | --- |\n",
        );
        let mut row = |what: &str, samples: String, l: &Latency, target: String| {
            let _ = writeln!(
                out,
                "| {what} | {samples} | {} | {} | {} | {target} |",
                ms(l.quantile_ms(0.5)),
                ms(l.quantile_ms(0.99)),
                ms(l.max_ms())
            );
        };
        for s in &self.sync {
            let mode = mode_name(s.mode);
            let (full, resync) = match s.mode {
                Mode::Iptables => ("every chain written", "read back, nothing written"),
                Mode::Nftables => ("the whole table written", "the whole table rewritten"),
            };
            row(
                &format!(
                    "{mode}: full sync into empty tables, {} services x {} endpoints, {full}",
                    s.services, s.endpoints
                ),
                s.full_each.len().to_string(),
                &s.full,
                format!("under 1 s, every run: {}", verdict(s.full.max_ms() < 1000.0)),
            );
            row(
                &format!("{mode}: full sync over the same rules in place (a restart): {resync}"),
                s.resync_each.len().to_string(),
                &s.resync,
                format!("under 1 s, every run: {}", verdict(s.resync.max_ms() < 1000.0)),
            );
            row(
                &format!("{mode}: incremental sync, one endpoint removed or put back"),
                s.incremental_runs.to_string(),
                &s.incremental,
                format!("under 100 ms, every run: {}", verdict(s.incremental.max_ms() < 100.0)),
            );
        }
        row(
            &format!("DNS A query, {} UDP clients, {:.0} queries/s", d.clients, d.rate()),
            d.answered.to_string(),
            &d.latency,
            "-".into(),
        );
        for r in &self.ready {
            row(
                &format!("{}: endpoint ready → connection to the cluster IP", mode_name(r.mode)),
                r.each.len().to_string(),
                &r.to_traffic,
                "-".into(),
            );
        }
        out
    }

    pub fn details(&self) -> Vec<String> {
        let d = &self.dns;
        let mut out = Vec::new();
        for s in &self.sync {
            let mode = mode_name(s.mode);
            let rules: Vec<String> = s.rules.iter().map(|(t, n)| format!("{t} {n}")).collect();
            let (counted, listing) = match s.mode {
                Mode::Iptables => ("`-A` lines of `iptables-save`", "`iptables-save`"),
                Mode::Nftables => ("from `nft list table`", "`nft list table`"),
            };
            out.push(format!(
                "{mode}: rules programmed for the sync step's Services: {} ({counted}: {}); the cleanup then \
                 removed {} chains; one {listing} of them took {}",
                s.rules.iter().map(|(_, n)| n).sum::<usize>(),
                rules.join(", "),
                s.cleaned_chains,
                ms(ms_of(s.save))
            ));
            out.push(format!(
                "{mode}: full syncs one by one (each into tables the cleanup emptied, untimed; {} chains): {}; of \
                 which the model (`service_ports`) p50 {}",
                s.full_chains,
                s.full_each.iter().map(|d| ms(ms_of(*d))).collect::<Vec<_>>().join(", "),
                ms(s.full_model.quantile_ms(0.5))
            ));
            out.push(format!(
                "{mode}: full syncs over the rules in place one by one: {}; chains they wrote: {}",
                s.resync_each.iter().map(|d| ms(ms_of(*d))).collect::<Vec<_>>().join(", "),
                s.resync_chains
            ));
            out.push(format!(
                "{mode}: incremental syncs: the model p50 {} (max {}) of it",
                ms(s.incremental_model.quantile_ms(0.5)),
                ms(s.incremental_model.max_ms())
            ));
        }
        out.push(format!(
            "DNS: {} answered in {:.1} s, {} lost (no reply within {:?}), {} not NOERROR with an answer; table \
             of {} Services built in {}",
            d.answered,
            d.wall.as_secs_f64(),
            d.lost,
            DNS_TIMEOUT,
            d.wrong,
            d.names,
            ms(ms_of(d.build))
        ));
        for r in &self.ready {
            let mode = mode_name(r.mode);
            out.push(format!(
                "{mode}: ready → traffic one by one: {}; the update's write (t0 to its reply) p50 {}, max {}; {} \
                 connect() attempts refused after t0 in all",
                r.each.iter().map(|d| ms(ms_of(*d))).collect::<Vec<_>>().join(", "),
                ms(r.write.quantile_ms(0.5)),
                ms(r.write.max_ms()),
                r.refused
            ));
            out.push(format!(
                "{mode}: after the proxy was killed and `skiff proxy --cleanup` ran, `iptables-save` and `nft list \
                 tables` held {} lines naming a Skiff chain or table",
                r.left_after_cleanup
            ));
        }
        out
    }

    pub fn markdown(&self, date: &str, command: &str, machine: &[(String, String)]) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "Last run: {date}, with `{command}`.\n");
        out.push_str(&self.table());
        out.push_str("\nDetails:\n\n");
        for d in self.details() {
            let _ = writeln!(out, "- {d}");
        }
        out.push_str("\nSettings:\n\n");
        for s in &self.settings {
            let _ = writeln!(out, "- {s}");
        }
        out.push_str("\nMachine:\n\n");
        for (name, value) in machine {
            let _ = writeln!(out, "- {name}: {value}");
        }
        out
    }
}

impl DnsFigures {
    fn rate(&self) -> f64 {
        let secs = self.wall.as_secs_f64();
        if secs > 0.0 {
            self.answered as f64 / secs
        } else {
            0.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_nft_listing_counts_rules_and_map_elements_not_hooks_or_types() {
        let listed = "table ip skiff-ABC {\n\tmap service-ips {\n\t\ttype ipv4_addr . inet_proto . inet_service : verdict\n\
                      \t\telements = { 10.100.0.1 . tcp . 80 : goto service-a,\n\t\t\t     10.100.0.2 . tcp . 80 : goto service-b }\n\t}\n\
                      \tchain nat-output {\n\t\ttype nat hook output priority -100; policy accept;\n\t\tjump services\n\t}\n\
                      \tchain service-a {\n\t\tnumgen random mod 2 vmap { 0 : goto endpoint-a, 1 : goto endpoint-b }\n\t}\n}\n";
        assert_eq!(nft_objects_in_listing(listed), vec![("rules".to_string(), 2), ("map elements".to_string(), 2)]);
    }

    #[test]
    fn the_objects_become_one_service_port_with_every_endpoint_each() {
        let services: Vec<Arc<Service>> = (0..3).map(|i| typed(service(i)).unwrap()).collect();
        let slices: Vec<Arc<EndpointSlice>> = (0..3).map(|i| typed(slice(i, 10, None)).unwrap()).collect();
        let ports = service_ports(&services, &slices, SYNC_NODE);
        assert_eq!(ports.len(), 3);
        assert!(ports.iter().all(|p| p.endpoints.len() == 10 && p.port == 80), "{ports:?}");
        assert_eq!(ports[0].cluster_ips, [cluster_ip(0)]);
        let short = typed(slice(1, 10, Some(4))).unwrap();
        let ports = service_ports(&services, &[slices[0].clone(), short], SYNC_NODE);
        let one = ports.iter().find(|p| p.key == "bench-proxy/svc-1:http").unwrap();
        assert_eq!(one.endpoints.len(), 9);
        assert!(!one.endpoints.iter().any(|e| e.ip == endpoint_ip(1, 4, 10)));
    }

    #[test]
    fn addresses_stay_in_their_ranges_and_apart() {
        assert_eq!(cluster_ip(999), Ipv4Addr::new(10, 100, 3, 250));
        assert_eq!(endpoint_ip(999, 9, 10), Ipv4Addr::new(10, 244, 39, 250));
        assert_ne!(endpoint_ip(0, 249, 250), endpoint_ip(1, 0, 250));
    }

    #[test]
    fn each_removed_endpoint_is_put_back_by_the_next_run() {
        let runs: Vec<_> = (0..4).map(|k| flip(k, 1000, 10)).collect();
        assert_eq!(runs, [(0, 0, true), (0, 0, false), (37, 1, true), (37, 1, false)]);
    }

    #[test]
    fn rules_are_counted_per_table() {
        let saved = "# Generated\n*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j SKIFF-SVCS-ABC\nCOMMIT\n*nat\n\
                     :SKIFF-SVCS-ABC - [0:0]\n-A SKIFF-SVCS-ABC -j X\n-A OUTPUT -j SKIFF-SVCS-ABC\nCOMMIT\n*mangle\nCOMMIT\n";
        assert_eq!(rules_in_save(saved), [("filter".to_string(), 1), ("nat".to_string(), 2)]);
    }

    #[test]
    fn a_reply_counts_only_for_its_own_query_and_only_with_an_answer() {
        let mut reply = vec![0u8; 12];
        reply[..2].copy_from_slice(&7u16.to_be_bytes());
        reply[2] = 0x84; // QR, AA
        reply[7] = 1; // one answer
        assert_eq!(reply_to(&reply, 7), Some(true));
        assert_eq!(reply_to(&reply, 8), None);
        reply[3] = 3; // NXDOMAIN
        assert_eq!(reply_to(&reply, 7), Some(false));
        reply[2] = 0; // a query, not a reply
        assert_eq!(reply_to(&reply, 7), None);
        assert_eq!(reply_to(&reply[..5], 7), None);
    }

    #[test]
    fn the_query_asks_for_the_services_a_record() {
        let message = Message::from_vec(&query(5).unwrap()).unwrap();
        assert_eq!(message.queries.len(), 1);
        assert_eq!(message.queries[0].name().to_string(), "svc-5.bench-proxy.svc.cluster.local.");
        assert_eq!(message.queries[0].query_type(), RecordType::A);
    }
}
