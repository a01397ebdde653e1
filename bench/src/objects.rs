//! `skiff-bench objects`: Skiff's resource API (Kubernetes pods as JSON over
//! gRPC, through `skiff-client`) on a fresh 3-member cluster, for issue 4
//! ("API server core"). One cluster, measured in this order:
//!
//! 1. **Create throughput and memory.** `pods` pods (namespace `default`,
//!    one container `c`/`busybox`, not bound to a node) are created by
//!    `create_clients` clients, each with its own connection to the leader
//!    and one create in flight: throughput, p50/p99 latency. Before and after,
//!    every member's RSS (`VmRSS` in `/proc/PID/status`) and data directory
//!    size (sum of file lengths), once every member has applied the last
//!    create; the growth is reported per 10,000 pods.
//! 2. **LIST from a follower.** `lists` full LISTs of the namespace (no
//!    limit) with resourceVersion "" (linearizable: a quorum round first),
//!    then `lists` with "0" (the follower's own state), one at a time. Time
//!    = request sent to every item decoded into a `serde_json::Value` by
//!    skiff-client; the harness's own share (decoding the JSON, on this
//!    machine's cores) is measured apart and reported with the results.
//! 3. **Pod watch fan-out.** `nodes` pods, pod *i* bound to `node-i`, then
//!    `watchers` watches over all namespaces, watcher *w* with the field
//!    selector `spec.nodeName=node-(w mod nodes)`, from the revision after
//!    those creates (no initial list), over `watch_clients` connections,
//!    connection *c* to member *c* mod 3 and watcher *w* on connection *w* mod
//!    `watch_clients`, so every node's watchers are spread over the members.
//!    Then for `duration` a writer merge-patches the pods round robin, paced
//!    at `update_rate` per second through the leader with at most
//!    `max_inflight` patches in flight, each setting the annotation
//!    `bench/sent` to its send time (ns since the Unix epoch; harness and
//!    servers share one clock). A watcher's delivery latency is its receive
//!    time minus that, for each MODIFIED event: read-modify-write on the
//!    leader, commit, apply on the watcher's member, fan-out, transport and
//!    decode. Every update must reach exactly the watchers of its pod's node:
//!    each watcher's count is checked against the successful patches of its
//!    node. The members' CPU time during the write phase (utime + stime from
//!    `/proc/PID/stat`) is reported as % of one core, next to the harness's
//!    own, since both share the machine.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use futures::{Stream, StreamExt, TryStreamExt};
use serde_json::{json, Value};
use skiff_api::watch::EventType;
use skiff_api::{Kind, ResourceInfo};
use skiff_client::resources::{ListParams, WatchParams};
use skiff_client::{Client, ClientError};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use crate::cluster::{Cluster, ClusterSpec, EtcdTiming, System};
use crate::cpu::Sampler;
use crate::latency::Latency;

/// Lines between these markers in bench/README.md are replaced by each run
/// of `skiff-bench objects --readme` (the suite has its own pair).
pub const BEGIN: &str = "<!-- skiff-bench objects results: begin (written by `make bench-objects`) -->";
pub const END: &str = "<!-- skiff-bench objects results: end -->";

/// The annotation carrying a patch's send time, in ns since the Unix epoch.
const SENT: &str = "bench/sent";
/// The namespace every pod goes to.
const NAMESPACE: &str = "default";
/// How long watchers may take to deliver the last events once writing stops.
const DRAIN: Duration = Duration::from_secs(5);
/// Bounds every unary request, so a stuck server fails the run instead of hanging it.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Watches being opened at once.
const OPENING: usize = 64;
/// Targets of issue 4.
const WATCH_P99_TARGET_MS: f64 = 100.0;
const LIST_P99_TARGET_MS: f64 = 1000.0;

#[derive(Clone, Debug)]
pub struct ObjectsConfig {
    /// The `skiff` executable.
    pub skiff: PathBuf,
    /// The cluster's data and logs go here.
    pub dir: PathBuf,
    /// Extra flags for every member.
    pub skiff_args: Vec<String>,
    /// Pods created for the create and LIST measurements.
    pub pods: usize,
    pub create_clients: usize,
    /// LISTs of each kind (linearizable, resourceVersion "0").
    pub lists: usize,
    /// Node names, one watched pod each.
    pub nodes: usize,
    pub watchers: usize,
    /// Connections the watches share, spread over the members.
    pub watch_clients: usize,
    /// Patches per second during the write phase.
    pub update_rate: u64,
    pub duration: Duration,
    /// Patches in flight at most; a writer this far behind sends late.
    pub max_inflight: usize,
    /// TLS on every port, authentication and RBAC (see `tls.rs`).
    pub tls: bool,
}

/// One member's resident memory and data directory size, in bytes.
#[derive(Clone, Copy, Debug, Default)]
pub struct Footprint {
    pub rss: u64,
    pub disk: u64,
}

#[derive(Default)]
pub struct CreateResult {
    pub created: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    pub elapsed: Duration,
    pub latency: Latency,
}

impl CreateResult {
    pub fn throughput(&self) -> f64 {
        self.created as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn summary(&self) -> String {
        format!(
            "{} pods created in {:.1}s: {:.0} pods/s, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms, {} errors{}",
            self.created,
            self.elapsed.as_secs_f64(),
            self.throughput(),
            self.latency.quantile_ms(0.50),
            self.latency.quantile_ms(0.99),
            self.latency.max_ms(),
            self.errors,
            self.first_error.as_deref().map(|e| format!(" (first: {e})")).unwrap_or_default()
        )
    }
}

pub struct ListResult {
    /// "linearizable" or "resourceVersion 0".
    pub name: &'static str,
    pub latency: Latency,
    /// Each LIST's time, in order, ms.
    pub samples: Vec<f64>,
    /// Items in the last LIST.
    pub items: usize,
}

impl ListResult {
    pub fn summary(&self) -> String {
        let samples: Vec<String> = self.samples.iter().map(|s| format!("{s:.0}")).collect();
        format!(
            "{} LISTs of {} pods: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms; samples (ms): {}",
            self.samples.len(),
            self.items,
            self.latency.quantile_ms(0.50),
            self.latency.quantile_ms(0.99),
            self.latency.max_ms(),
            samples.join(" ")
        )
    }
}

#[derive(Default)]
pub struct FanoutResult {
    pub updates: u64,
    pub update_errors: u64,
    pub first_error: Option<String>,
    pub write_elapsed: Duration,
    /// The writer's patch latency, to tell a slow write from a slow delivery.
    pub patch_latency: Latency,
    /// MODIFIED events the successful patches should have produced.
    pub expected: u64,
    /// MODIFIED events carrying the annotation, as received.
    pub delivered: u64,
    pub latency: Latency,
    /// Watchers that received more or fewer events than their node's updates.
    pub miscounted_watchers: usize,
    /// Events for a pod of another node, or of another type than MODIFIED.
    pub stray_events: u64,
    /// Watch streams that ended or failed before the run stopped them.
    pub ended_streams: usize,
    pub first_stream_error: Option<String>,
    /// Each member's CPU during the write phase, % of one core.
    pub member_cpu: Vec<f64>,
    /// The harness's own CPU during the write phase, % of one core.
    pub harness_cpu: f64,
    /// Each member's RSS before and after the watches were opened.
    pub rss_before_watches: Vec<u64>,
    pub rss_with_watches: Vec<u64>,
    pub setup: Duration,
}

impl FanoutResult {
    pub fn update_rate(&self) -> f64 {
        self.updates as f64 / self.write_elapsed.as_secs_f64().max(1e-9)
    }

    pub fn summary(&self) -> String {
        format!(
            "{} patches ({:.0}/s, {} errors{}, patch p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms), {}/{} events \
             delivered: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; {} watchers with a wrong count, {} stray \
             events, {} streams ended early{}; watches opened in {:.1}s",
            self.updates,
            self.update_rate(),
            self.update_errors,
            self.first_error.as_deref().map(|e| format!(", first: {e}")).unwrap_or_default(),
            self.patch_latency.quantile_ms(0.50),
            self.patch_latency.quantile_ms(0.99),
            self.patch_latency.max_ms(),
            self.delivered,
            self.expected,
            self.latency.quantile_ms(0.50),
            self.latency.quantile_ms(0.99),
            self.latency.max_ms(),
            self.miscounted_watchers,
            self.stray_events,
            self.ended_streams,
            self.first_stream_error.as_deref().map(|e| format!(" (first: {e})")).unwrap_or_default(),
            self.setup.as_secs_f64(),
        )
    }
}

/// Everything one run measured.
pub struct ObjectsReport {
    pub config: ObjectsConfig,
    /// Member indexes (0-based).
    pub leader: usize,
    pub follower: usize,
    pub create: CreateResult,
    pub before_pods: Vec<Footprint>,
    pub after_pods: Vec<Footprint>,
    pub lists: Vec<ListResult>,
    /// Decoding one LIST's items into JSON values in the harness, ms.
    pub list_decode_ms: f64,
    /// One LIST's items as JSON, bytes.
    pub list_bytes: usize,
    pub fanout: FanoutResult,
}

fn now_nanos() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

fn pods() -> &'static ResourceInfo {
    skiff_api::resources::of(Kind::Pod)
}

fn pod(name: &str, node: Option<&str>) -> Value {
    let mut spec = json!({"containers": [{"name": "c", "image": "busybox"}]});
    if let Some(node) = node {
        spec["nodeName"] = json!(node);
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec})
}

fn node_name(i: usize) -> String {
    format!("node-{i}")
}

fn watch_pod_name(i: usize) -> String {
    format!("watch-{i:05}")
}

/// Launches the cluster, measures, and stops it (its directory is left to the caller).
pub async fn run(config: &ObjectsConfig) -> Result<ObjectsReport> {
    if config.pods == 0 || config.create_clients == 0 || config.lists == 0 {
        bail!("--pods, --create-clients and --lists must be positive");
    }
    if config.nodes == 0 || config.watchers == 0 || config.watch_clients == 0 {
        bail!("--nodes, --watchers and --watch-clients must be positive");
    }
    if config.update_rate == 0 || config.max_inflight == 0 {
        bail!("--update-rate and --max-inflight must be positive");
    }
    let mut extra_args = config.skiff_args.clone();
    if config.tls {
        extra_args.extend(crate::tls::set(&config.dir)?);
    }
    let spec = ClusterSpec {
        system: System::Skiff,
        binary: config.skiff.clone(),
        members: 3,
        dir: config.dir.clone(),
        // Unused: only Skiff runs here.
        etcd_timing: EtcdTiming { heartbeat_ms: 40, election_timeout_ms: 200 },
        extra_args,
        skiff_subcommand: "apiserver",
    };
    eprintln!("== Skiff: starting 3 members in {}", config.dir.display());
    let mut cluster = Cluster::launch(spec).await?;
    let leader = cluster.must_leader().await?;
    let endpoints = cluster.endpoints();
    let follower = (0..endpoints.len()).find(|&i| i != leader).context("a cluster of one member")?;
    crate::tls::bind_user(&endpoints).await?;
    must_namespace(&endpoints, NAMESPACE, Duration::from_secs(60)).await?;

    eprintln!("  create {} pods, {} clients, through member {}", config.pods, config.create_clients, leader + 1);
    let before_pods = footprints(&cluster)?;
    let names: Vec<String> = (0..config.pods).map(|i| format!("list-{i:06}")).collect();
    let create = create_pods(&endpoints[leader], &names, |_| None, config.create_clients).await?;
    eprintln!("    {}", create.summary());
    must_apply_everywhere(&endpoints, &endpoints[leader]).await?;
    let after_pods = footprints(&cluster)?;

    eprintln!("  LIST the namespace from member {} (a follower)", follower + 1);
    let mut lists = Vec::new();
    for (name, resource_version) in [("linearizable", ""), ("resourceVersion 0", "0")] {
        let result = list_pods(&endpoints[follower], name, resource_version, config.lists).await?;
        eprintln!("    {name}: {}", result.summary());
        lists.push(result);
    }
    let (list_decode_ms, list_bytes) = decode_cost(&endpoints[follower]).await?;
    eprintln!(
        "    the harness decodes one LIST's {:.1} MiB of items in {list_decode_ms:.0} ms",
        mib(list_bytes as f64)
    );

    eprintln!(
        "  watch fan-out: {} watchers on {} nodes, {} updates/s for {}",
        config.watchers,
        config.nodes,
        config.update_rate,
        humantime::format_duration(config.duration)
    );
    let fanout = fanout(&cluster, leader, config).await?;
    eprintln!("    {}", fanout.summary());
    cluster.must_leader().await.context("the cluster after the run")?;
    Ok(ObjectsReport {
        config: config.clone(),
        leader,
        follower,
        create,
        before_pods,
        after_pods,
        lists,
        list_decode_ms,
        list_bytes,
        fanout,
    })
}

/// Waits until namespace `name` exists (the members create it shortly after start).
async fn must_namespace(endpoints: &[String], name: &str, within: Duration) -> Result<()> {
    let client = crate::tls::skiff_client(endpoints)?;
    let info = skiff_api::resources::of(Kind::Namespace);
    let deadline = Instant::now() + within;
    loop {
        match tokio::time::timeout(REQUEST_TIMEOUT, client.get(info, "", name)).await {
            Ok(Ok(_)) => return Ok(()),
            _ if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(100)).await,
            Ok(Err(e)) => bail!("namespace {name} not there within {within:?}: {e}"),
            Err(_) => bail!("namespace {name} not there within {within:?}: the request timed out"),
        }
    }
}

/// The current revision, read linearizably through `endpoint`.
async fn revision(endpoint: &str) -> Result<i64> {
    let client = crate::tls::skiff_client(&[endpoint])?;
    let params = ListParams { limit: 1, ..Default::default() };
    let list = tokio::time::timeout(REQUEST_TIMEOUT, client.list(pods(), NAMESPACE, &params))
        .await
        .context("reading the revision timed out")??;
    list.resource_version.parse().with_context(|| format!("resourceVersion {:?}", list.resource_version))
}

/// Waits until every member has applied everything `leader` has.
async fn must_apply_everywhere(endpoints: &[String], leader: &str) -> Result<()> {
    let at = revision(leader).await?.to_string();
    for endpoint in endpoints {
        let client = crate::tls::skiff_client(&[endpoint])?;
        let params = ListParams { limit: 1, resource_version: at.clone(), ..Default::default() };
        // "At least N": the member waits (a few seconds) until it has applied N.
        let mut tries = 0;
        while let Err(e) = client.list(pods(), NAMESPACE, &params).await {
            tries += 1;
            if tries >= 10 {
                bail!("{endpoint} did not apply revision {at}: {e}");
            }
        }
    }
    Ok(())
}

/// Creates a pod per name, `clients` at a time, each client with its own
/// connection to `endpoint` and one create in flight.
async fn create_pods(
    endpoint: &str,
    names: &[String],
    node: impl Fn(usize) -> Option<String>,
    clients: usize,
) -> Result<CreateResult> {
    let bodies: Arc<Vec<Value>> =
        Arc::new(names.iter().enumerate().map(|(i, name)| pod(name, node(i).as_deref())).collect());
    let next = Arc::new(AtomicUsize::new(0));
    let info = pods();
    let start = Instant::now();
    let mut tasks = JoinSet::new();
    for _ in 0..clients.min(names.len()) {
        let client = crate::tls::skiff_client(&[endpoint])?;
        let (bodies, next) = (bodies.clone(), next.clone());
        tasks.spawn(async move {
            let mut result = CreateResult::default();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(body) = bodies.get(i) else { break };
                let sent = Instant::now();
                match tokio::time::timeout(REQUEST_TIMEOUT, client.create(info, NAMESPACE, body)).await {
                    Ok(Ok(_)) => {
                        result.created += 1;
                        result.latency.record(sent.elapsed());
                    }
                    outcome => {
                        result.errors += 1;
                        if result.first_error.is_none() {
                            result.first_error = Some(match outcome {
                                Ok(Err(e)) => e.to_string(),
                                _ => "timed out".into(),
                            });
                        }
                    }
                }
            }
            result
        });
    }
    let mut total = CreateResult::default();
    while let Some(part) = tasks.join_next().await {
        let part = part?;
        total.created += part.created;
        total.errors += part.errors;
        total.first_error = total.first_error.or(part.first_error);
        total.latency.merge(&part.latency);
    }
    total.elapsed = start.elapsed();
    Ok(total)
}

/// `count` full LISTs of the namespace through `endpoint`, one at a time.
async fn list_pods(endpoint: &str, name: &'static str, resource_version: &str, count: usize) -> Result<ListResult> {
    let client = crate::tls::skiff_client(&[endpoint])?;
    let params = ListParams { resource_version: resource_version.into(), ..Default::default() };
    let mut result = ListResult { name, latency: Latency::default(), samples: Vec::new(), items: 0 };
    for _ in 0..count {
        let start = Instant::now();
        let list = tokio::time::timeout(REQUEST_TIMEOUT, client.list(pods(), NAMESPACE, &params))
            .await
            .context("LIST timed out")?
            .with_context(|| format!("LIST ({name})"))?;
        let took = start.elapsed();
        result.latency.record(took);
        result.samples.push(took.as_secs_f64() * 1000.0);
        result.items = list.items.len();
        if !list.continue_token.is_empty() {
            bail!("a LIST without a limit came back with a continue token");
        }
    }
    Ok(result)
}

/// How long the harness takes to decode one LIST's items into JSON values
/// (the part of a LIST's time spent in this process), in ms, and their size.
async fn decode_cost(endpoint: &str) -> Result<(f64, usize)> {
    let client = crate::tls::skiff_client(&[endpoint])?;
    let list = tokio::time::timeout(REQUEST_TIMEOUT, client.list(pods(), NAMESPACE, &ListParams::default()))
        .await
        .context("LIST timed out")??;
    let encoded: Vec<Vec<u8>> = list.items.iter().map(serde_json::to_vec).collect::<Result<_, _>>()?;
    drop(list);
    let start = Instant::now();
    let decoded: Vec<Value> = encoded.iter().map(|b| serde_json::from_slice(b)).collect::<Result<_, _>>()?;
    let took = start.elapsed();
    drop(decoded);
    Ok((took.as_secs_f64() * 1000.0, encoded.iter().map(Vec::len).sum()))
}

type EventStream = Pin<Box<dyn Stream<Item = Result<skiff_client::resources::WatchEvent, ClientError>> + Send>>;

/// What one watcher saw.
#[derive(Default)]
struct Seen {
    node: usize,
    events: u64,
    stray: u64,
    ended: Option<String>,
    /// Delivery latencies in µs (a histogram per watcher would take ~150 KB each).
    latencies: Vec<u64>,
}

async fn fanout(cluster: &Cluster, leader: usize, config: &ObjectsConfig) -> Result<FanoutResult> {
    let endpoints = cluster.endpoints();
    let mut result = FanoutResult::default();
    let setup = Instant::now();
    let names: Vec<String> = (0..config.nodes).map(watch_pod_name).collect();
    let created = create_pods(&endpoints[leader], &names, |i| Some(node_name(i)), config.create_clients).await?;
    if created.errors > 0 {
        bail!("creating the watched pods: {}", created.summary());
    }
    let from = revision(&endpoints[leader]).await?;

    result.rss_before_watches = footprints(cluster)?.iter().map(|f| f.rss).collect();
    let clients: Vec<Client> = (0..config.watch_clients)
        .map(|c| crate::tls::skiff_client(&[&endpoints[c % endpoints.len()]]))
        .collect::<Result<_, _>>()?;
    let streams: Vec<(usize, EventStream)> = futures::stream::iter(0..config.watchers)
        .map(|w| {
            let client = clients[w % clients.len()].clone();
            let params = WatchParams {
                field_selector: format!("spec.nodeName={}", node_name(w % config.nodes)),
                resource_version: from.to_string(),
                ..Default::default()
            };
            async move {
                let stream = tokio::time::timeout(REQUEST_TIMEOUT, client.watch(pods(), "", &params))
                    .await
                    .with_context(|| format!("opening watch {w} timed out"))?
                    .with_context(|| format!("opening watch {w}"))?;
                Ok::<_, anyhow::Error>((w, Box::pin(stream) as EventStream))
            }
        })
        .buffer_unordered(OPENING)
        .try_collect()
        .await?;
    let delivered = Arc::new(AtomicU64::new(0));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut receivers = JoinSet::new();
    for (w, stream) in streams {
        let node = w % config.nodes;
        receivers.spawn(receive(stream, node, delivered.clone(), stop_rx.clone()));
    }
    // Let the members settle after the burst of opens before measuring.
    tokio::time::sleep(Duration::from_secs(1)).await;
    result.rss_with_watches = footprints(cluster)?.iter().map(|f| f.rss).collect();
    result.setup = setup.elapsed();

    let pids: Vec<u32> =
        cluster.pids().into_iter().map(|p| p.context("a member is not running")).collect::<Result<_>>()?;
    let sampler = Sampler::start(pids)?;
    let per_node = write_paced(&endpoints[leader], &names, config, &mut result).await?;
    let used = sampler.finish()?;
    result.member_cpu = used.members.iter().map(|s| s / used.wall * 100.0).collect();
    result.harness_cpu = used.harness / used.wall * 100.0;

    let mut watchers_per_node = vec![0u64; config.nodes];
    for w in 0..config.watchers {
        watchers_per_node[w % config.nodes] += 1;
    }
    result.expected = per_node.iter().zip(&watchers_per_node).map(|(u, w)| u * w).sum();
    let drain_deadline = Instant::now() + DRAIN;
    while delivered.load(Ordering::Relaxed) < result.expected && Instant::now() < drain_deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = stop_tx.send(true);
    while let Some(seen) = receivers.join_next().await {
        let seen = seen?;
        result.delivered += seen.events;
        result.stray_events += seen.stray;
        for &micros in &seen.latencies {
            result.latency.record(Duration::from_micros(micros));
        }
        if seen.events != per_node[seen.node] {
            result.miscounted_watchers += 1;
        }
        if let Some(e) = seen.ended {
            result.ended_streams += 1;
            result.first_stream_error.get_or_insert(e);
        }
    }
    Ok(result)
}

/// Patches the pods round robin at `config.update_rate` per second for
/// `config.duration`; returns the successful patches per node.
async fn write_paced(
    endpoint: &str,
    names: &[String],
    config: &ObjectsConfig,
    result: &mut FanoutResult,
) -> Result<Vec<u64>> {
    let client = crate::tls::skiff_client(&[endpoint])?;
    let period = Duration::from_secs_f64(1.0 / config.update_rate as f64);
    let total = (config.duration.as_secs_f64() * config.update_rate as f64) as u64;
    let inflight = Arc::new(Semaphore::new(config.max_inflight));
    let mut per_node = vec![0u64; names.len()];
    let mut writes = JoinSet::new();
    let mut tally = |outcome: Result<(usize, Result<Duration, String>), tokio::task::JoinError>| match outcome {
        Ok((node, Ok(latency))) => {
            per_node[node] += 1;
            result.updates += 1;
            result.patch_latency.record(latency);
        }
        Ok((_, Err(e))) => {
            result.update_errors += 1;
            result.first_error.get_or_insert(e);
        }
        Err(e) => {
            result.update_errors += 1;
            result.first_error.get_or_insert(e.to_string());
        }
    };
    let start = tokio::time::Instant::now();
    for n in 0..total {
        tokio::time::sleep_until(start + period.mul_f64(n as f64)).await;
        let Ok(permit) = inflight.clone().acquire_owned().await else { break };
        let node = n as usize % names.len();
        let (client, name) = (client.clone(), names[node].clone());
        writes.spawn(async move {
            let sent = Instant::now();
            let patch = json!({"metadata": {"annotations": {SENT: now_nanos().to_string()}}});
            let outcome =
                tokio::time::timeout(REQUEST_TIMEOUT, client.patch(pods(), NAMESPACE, &name, "merge", &patch, ""))
                    .await;
            drop(permit);
            let outcome = match outcome {
                Ok(Ok(_)) => Ok(sent.elapsed()),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err("timed out".to_string()),
            };
            (node, outcome)
        });
        while let Some(done) = writes.try_join_next() {
            tally(done);
        }
    }
    while let Some(done) = writes.join_next().await {
        tally(done);
    }
    result.write_elapsed = start.elapsed();
    Ok(per_node)
}

/// One watcher: records the delivery latency of every MODIFIED event of its
/// node's pod until told to stop.
async fn receive(
    mut stream: EventStream,
    node: usize,
    delivered: Arc<AtomicU64>,
    mut stop: watch::Receiver<bool>,
) -> Seen {
    let mut seen = Seen { node, ..Default::default() };
    let expected_node = node_name(node);
    loop {
        tokio::select! {
            event = stream.next() => {
                let event = match event {
                    Some(Ok(event)) => event,
                    Some(Err(e)) => {
                        seen.ended = Some(e.to_string());
                        break;
                    }
                    None => {
                        seen.ended = Some("the server ended the stream".into());
                        break;
                    }
                };
                let now = now_nanos();
                let object = &event.object;
                let sent = object["metadata"]["annotations"][SENT].as_str().and_then(|s| s.parse::<u64>().ok());
                match sent {
                    Some(sent) if event.kind == EventType::Modified && object["spec"]["nodeName"] == expected_node.as_str() => {
                        seen.latencies.push(now.saturating_sub(sent) / 1000);
                        seen.events += 1;
                        delivered.fetch_add(1, Ordering::Relaxed);
                    }
                    _ if event.kind == EventType::Bookmark => {}
                    _ => seen.stray += 1,
                }
            }
            _ = stop.changed() => break,
        }
    }
    seen
}

/// Each member's RSS and data directory size, in member order.
fn footprints(cluster: &Cluster) -> Result<Vec<Footprint>> {
    cluster
        .pids()
        .into_iter()
        .zip(cluster.data_dirs())
        .map(|(pid, dir)| {
            let pid = pid.context("a member is not running")?;
            Ok(Footprint { rss: rss_bytes(pid)?, disk: dir_size(&dir)? })
        })
        .collect()
}

/// `VmRSS` of process `pid`, in bytes.
pub(crate) fn rss_bytes(pid: u32) -> Result<u64> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .with_context(|| format!("no VmRSS in {path}"))
}

/// The total length of the files under `dir`.
fn dir_size(dir: &Path) -> Result<u64> {
    let mut total = 0;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            // RocksDB deletes files while this walks; a vanished directory holds nothing.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("listing {}", dir.display())),
        };
        for entry in entries {
            let Ok(entry) = entry else { continue };
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                pending.push(entry.path());
            } else {
                total += meta.len();
            }
        }
    }
    Ok(total)
}

fn mib(bytes: f64) -> f64 {
    bytes / (1024.0 * 1024.0)
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "NOT met"
    }
}

impl ObjectsReport {
    fn member(&self, i: usize) -> String {
        let role = if i == self.leader {
            " (leader)"
        } else if i == self.follower {
            " (follower, serves the LISTs)"
        } else {
            ""
        };
        format!("member {}{role}", i + 1)
    }

    /// Growth per 10,000 pods of each member's RSS and data directory, MiB.
    fn growth(&self) -> Vec<(f64, f64)> {
        let per = 10_000.0 / self.create.created.max(1) as f64;
        self.before_pods
            .iter()
            .zip(&self.after_pods)
            .map(|(b, a)| (mib((a.rss as f64 - b.rss as f64) * per), mib((a.disk as f64 - b.disk as f64) * per)))
            .collect()
    }

    fn fanout_name(&self) -> String {
        let c = &self.config;
        format!("pod watch fan-out, {} watchers on {} nodes, {} updates/s", c.watchers, c.nodes, c.update_rate)
    }

    /// The results table: scenario, metric, value.
    pub fn table(&self) -> String {
        let c = &self.config;
        let mut rows: Vec<(String, String, String)> = Vec::new();
        let mut row = |scenario: &str, metric: &str, value: String| {
            rows.push((scenario.to_string(), metric.to_string(), value));
        };
        let f = &self.fanout;
        let name = self.fanout_name();
        row(&name, "delivery p50 ms", format!("{:.2}", f.latency.quantile_ms(0.50)));
        row(&name, "delivery p99 ms (target < 100)", format!("{:.2}", f.latency.quantile_ms(0.99)));
        row(&name, "delivery max ms", format!("{:.2}", f.latency.max_ms()));
        let percent = f.delivered as f64 / f.expected.max(1) as f64 * 100.0;
        row(&name, "delivered / expected events", format!("{} / {} ({percent:.2} %)", f.delivered, f.expected));
        row(&name, "updates sent / s", format!("{:.0} ({} errors)", f.update_rate(), f.update_errors));
        let patch = format!("{:.2} / {:.2}", f.patch_latency.quantile_ms(0.99), f.patch_latency.max_ms());
        row(&name, "the writer's patch p99 / max ms (commit, before any delivery)", patch);
        for (i, cpu) in f.member_cpu.iter().enumerate() {
            row(&name, &format!("CPU % of one core, {}", self.member(i)), format!("{cpu:.0}"));
        }
        row(&name, "CPU % of one core, all 3 members", format!("{:.0}", f.member_cpu.iter().sum::<f64>()));
        row(
            &name,
            &format!("CPU % of one core, the harness ({} watchers)", c.watchers),
            format!("{:.0}", f.harness_cpu),
        );
        let create = format!("create {} pods, {} clients, through the leader", c.pods, c.create_clients);
        row(&create, "throughput pods/s", format!("{:.0}", self.create.throughput()));
        row(&create, "p50 ms", format!("{:.2}", self.create.latency.quantile_ms(0.50)));
        row(&create, "p99 ms", format!("{:.2}", self.create.latency.quantile_ms(0.99)));
        for list in &self.lists {
            let scenario = format!("LIST {} pods from a follower, {}", list.items, list.name);
            row(&scenario, "p50 ms", format!("{:.0}", list.latency.quantile_ms(0.50)));
            row(&scenario, "p99 ms (target < 1000)", format!("{:.0}", list.latency.quantile_ms(0.99)));
            row(&scenario, "max ms", format!("{:.0}", list.latency.max_ms()));
        }
        let growth = self.growth();
        for (i, (rss, _)) in growth.iter().enumerate() {
            row("memory per 10,000 pods", &format!("RSS MiB, {}", self.member(i)), format!("{rss:.1}"));
        }
        for (i, (_, disk)) in growth.iter().enumerate() {
            row("disk per 10,000 pods", &format!("data dir MiB, {}", self.member(i)), format!("{disk:.1}"));
        }
        let mut out = String::from("| scenario | metric | value |\n| --- | --- | ---: |\n");
        for (scenario, metric, value) in rows {
            let _ = writeln!(out, "| {scenario} | {metric} | {value} |");
        }
        out
    }

    /// The targets with this run's verdicts.
    pub fn targets(&self) -> String {
        let mut out = String::new();
        let p99 = self.fanout.latency.quantile_ms(0.99);
        let _ = writeln!(
            out,
            "- Pod watch delivery p99 under {WATCH_P99_TARGET_MS:.0} ms ({}): {} ({p99:.2} ms)",
            self.fanout_name(),
            verdict(p99 < WATCH_P99_TARGET_MS && self.fanout.delivered > 0)
        );
        for list in &self.lists {
            let p99 = list.latency.quantile_ms(0.99);
            let _ = writeln!(
                out,
                "- LIST of {} pods from a follower ({}) p99 under 1 s: {} ({p99:.0} ms)",
                list.items,
                list.name,
                verdict(p99 < LIST_P99_TARGET_MS)
            );
        }
        out
    }

    /// The whole results section as it goes into bench/README.md.
    pub fn markdown(&self, date: &str, command: &str, machine: &[(String, String)]) -> String {
        let c = &self.config;
        let d = |d: Duration| humantime::format_duration(d).to_string();
        let mut out = String::new();
        let _ = writeln!(out, "Last run: {date}, with `{command}`.\n");
        out.push_str(&self.table());
        out.push_str("\nTargets from issue 4:\n\n");
        out.push_str(&self.targets());
        out.push_str("\nSettings:\n\n");
        let settings = [
            format!(
                "3 Skiff members on 127.0.0.1, data under {} (fsync on), extra flags {:?}; {}",
                c.dir.parent().unwrap_or(&c.dir).display(),
                c.skiff_args,
                if c.tls {
                    "TLS on the client, HTTP and peer ports (mutual between peers), every request authenticated by \
                     client certificate and authorized by RBAC as a user bound to cluster-admin (`--tls`)"
                } else {
                    "plaintext, no authentication (without `--tls`)"
                }
            ),
            format!(
                "create: {} pods (one container, no node) by {} clients, one connection each to the leader \
                 (member {}), one create in flight each",
                c.pods,
                c.create_clients,
                self.leader + 1
            ),
            format!(
                "LIST: {} full LISTs of namespace default (no limit) per kind, one at a time, from member {}; \
                 time = request to items decoded by skiff-client, of which the harness's JSON decoding \
                 of the {:.1} MiB of items takes {:.0} ms (measured apart); p99 of {} samples is their max",
                c.lists,
                self.follower + 1,
                mib(self.list_bytes as f64),
                self.list_decode_ms,
                c.lists
            ),
            format!(
                "memory and disk: VmRSS and data dir size (file lengths) of each member before and after the \
                 creates (all members caught up), growth x 10,000 / {} pods",
                self.create.created
            ),
            format!(
                "watch: {} watchers (all namespaces, `spec.nodeName=node-i`, from the revision after setup) on \
                 {} nodes with one pod each, over {} connections (connection c to member c mod 3); a writer \
                 merge-patches the annotation `{SENT}` = send time at {} updates/s round robin for {} through \
                 the leader, at most {} in flight; latency = receive time - send time, per MODIFIED event; \
                 CPU = utime + stime from /proc/PID/stat over the write phase",
                c.watchers,
                c.nodes,
                c.watch_clients,
                c.update_rate,
                d(c.duration),
                c.max_inflight
            ),
        ];
        for s in settings {
            let _ = writeln!(out, "- {s}");
        }
        out.push_str("\nMachine:\n\n");
        for (name, value) in machine {
            let _ = writeln!(out, "- {name}: {value}");
        }
        out.push_str("\nDetails:\n\n");
        for line in self.details() {
            let _ = writeln!(out, "- {line}");
        }
        out
    }

    fn details(&self) -> Vec<String> {
        let mut lines = vec![format!("create: {}", self.create.summary())];
        for list in &self.lists {
            lines.push(format!("LIST, {}: {}", list.name, list.summary()));
        }
        let f = &self.fanout;
        lines.push(format!("{}: {}", self.fanout_name(), f.summary()));
        let footprint = |fs: &[Footprint]| -> String {
            fs.iter()
                .map(|f| format!("{:.0}/{:.0}", mib(f.rss as f64), mib(f.disk as f64)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        lines.push(format!(
            "RSS/data dir MiB per member before the creates: {}; after: {}",
            footprint(&self.before_pods),
            footprint(&self.after_pods)
        ));
        let watches: Vec<String> = f
            .rss_before_watches
            .iter()
            .zip(&f.rss_with_watches)
            .enumerate()
            .map(|(i, (b, a))| format!("member {} {:.0} -> {:.0}", i + 1, mib(*b as f64), mib(*a as f64)))
            .collect();
        lines.push(format!(
            "RSS MiB before and with the {} watches open (about {} per member): {}",
            self.config.watchers,
            self.config.watchers / 3,
            watches.join(", ")
        ));
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_are_the_kubernetes_json_the_api_takes() {
        let p = pod("watch-00001", Some("node-1"));
        assert_eq!(p["metadata"]["namespace"], "default");
        assert_eq!(p["spec"]["nodeName"], "node-1");
        assert_eq!(p["spec"]["containers"][0], json!({"name": "c", "image": "busybox"}));
        assert!(pod("list-000001", None)["spec"].get("nodeName").is_none());
    }
}
