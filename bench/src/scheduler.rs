//! `skiff-bench scheduler`: the scheduler's throughput, for issue 22, in the
//! manner of kube-scheduler's `scheduler_perf`, but through the real
//! apiservers and Raft: a fresh 3-member cluster on loopback (`skiff
//! apiserver`, which runs neither a scheduler nor a controller manager; or
//! `--masters server` with `--disable-scheduler --controllers
//! '*,-nodelifecycle'`), one `skiff scheduler` process of its own (so its CPU
//! and RSS are its own), and [hollow nodes](crate::hollow) standing in for
//! the kubelets.
//!
//! Each workload runs in a namespace of its own: its initial pods are
//! created and bound first (not measured), then its measured pods, created
//! by `create_clients` concurrent creates (as fast as the apiservers take
//! them). Throughput = measured pods bound / (last one's binding seen by the
//! hollow nodes' watch - the first measured create sent); each pod's latency
//! is its create sent to its binding seen. The scheduler's CPU (utime +
//! stime from `/proc/PID/stat`) over that window, per measured pod, and its
//! RSS at the end. Afterwards every pod of the namespace is deleted (grace
//! 0, and 2 s for the scheduler to see it), so each workload starts on
//! empty nodes. Last, unless skipped, a fill step creates `fill_to` basic
//! pods and leaves them: the scheduler's RSS there is its memory at that
//! many nodes and pods.
//!
//! If no pod of a workload is bound within `bind_timeout`, the run fails,
//! with the scheduler's log tail: there is no scheduler to measure.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use serde_json::{json, Value};
use skiff_api::status::Reason;
use skiff_api::watch::EventType;
use skiff_api::Kind;
use skiff_client::resources::{DeleteParams, ListParams, WatchParams};
use skiff_client::{Client, ClientError};
use tokio::sync::Semaphore;

use crate::cluster::{tail, Cluster, ClusterSpec, EtcdTiming, System};
use crate::cpu::Sampler;
use crate::hollow::{self, info, timed, Hollow, HollowConfig, HOSTNAME_LABEL, NODE_CPU_MILLIS, NODE_PODS, ZONE_LABEL};
use crate::latency::Latency;

/// Lines between these markers in bench/README.md are replaced by each run
/// of `skiff-bench scheduler --readme`.
pub const BEGIN: &str = "<!-- skiff-bench scheduler results: begin (written by `make bench-scheduler`) -->";
pub const END: &str = "<!-- skiff-bench scheduler results: end -->";

/// Issue 22's targets, measured pods bound per second.
pub const BASIC_TARGET: f64 = 2000.0;
pub const ANTI_AFFINITY_TARGET: f64 = 600.0;
/// How often binding progress is polled.
const POLL: Duration = Duration::from_millis(20);
/// Deletes in flight at most when a workload's pods are cleaned up.
const DELETE_INFLIGHT: usize = 64;
/// A pause after a workload's pods are deleted, so that the scheduler's
/// cache has seen the deletions before the next workload counts on the room.
const SETTLE: Duration = Duration::from_secs(2);
/// A node label no hollow node has: the pods of `--pending-pods` select it.
const NOWHERE_LABEL: &str = "bench.skiff.dev/nowhere";
/// Binds in flight at most in the stand-in scheduler.
const STAND_IN_INFLIGHT: usize = 64;
/// A basic pod's requests: 40 of them fill a node's cpu.
const BASIC_CPU_MILLIS: u64 = 100;
/// A preemption pod's cpu request: one per node, and any second one needs a victim.
const BIG_CPU_MILLIS: u64 = 3000;
const LOW_PRIORITY: i64 = 100;
const HIGH_PRIORITY: i64 = 1000;

/// What the masters run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Masters {
    /// `skiff apiserver`: Raft, store and APIs only.
    Apiserver,
    /// `skiff server --disable-scheduler --controllers '*,-nodelifecycle'`.
    Server,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum WorkloadKind {
    Basic,
    AntiAffinity,
    Affinity,
    Spread,
    Preemption,
}

impl WorkloadKind {
    #[cfg(test)]
    pub fn all() -> Vec<WorkloadKind> {
        vec![
            WorkloadKind::Basic,
            WorkloadKind::AntiAffinity,
            WorkloadKind::Affinity,
            WorkloadKind::Spread,
            WorkloadKind::Preemption,
        ]
    }

    fn slug(self) -> &'static str {
        match self {
            WorkloadKind::Basic => "basic",
            WorkloadKind::AntiAffinity => "anti-affinity",
            WorkloadKind::Affinity => "affinity",
            WorkloadKind::Spread => "spread",
            WorkloadKind::Preemption => "preemption",
        }
    }

    fn target(self) -> Option<f64> {
        match self {
            WorkloadKind::Basic => Some(BASIC_TARGET),
            WorkloadKind::AntiAffinity => Some(ANTI_AFFINITY_TARGET),
            _ => None,
        }
    }
}

#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// The `skiff` executable.
    pub skiff: PathBuf,
    /// The cluster's data and logs go here.
    pub dir: PathBuf,
    pub masters: Masters,
    /// Extra flags for every master.
    pub skiff_args: Vec<String>,
    pub hollow: HollowConfig,
    pub workloads: Vec<WorkloadKind>,
    /// Measured basic pods (10,000); the other workloads' defaults follow from it.
    pub pods: usize,
    pub warmup_pods: Option<usize>,
    pub anti_affinity_pods: Option<usize>,
    pub affinity_pods: Option<usize>,
    pub spread_pods: Option<usize>,
    pub preemption_pods: Option<usize>,
    /// Pods that fit no node, left pending in each workload's namespace
    /// while its measured pods are scheduled.
    pub pending_pods: usize,
    /// Basic pods of the final fill step; 0 skips it.
    pub fill_to: usize,
    /// Concurrent pod creates.
    pub create_clients: usize,
    /// The creates' connections go to every master in turn, not only the leader.
    pub creates_to_every_member: bool,
    /// The run fails when no pod of a workload is bound within this long.
    pub bind_timeout: Duration,
    /// A workload stops waiting after this long without a new binding.
    pub stall_timeout: Duration,
    /// How long the Lease renewals alone are measured before the workloads.
    pub idle_window: Duration,
    /// Bind from the harness instead of running `skiff scheduler`.
    pub stand_in: bool,
    pub scheduler_leader_elect: bool,
    pub percentage_of_nodes_to_score: Option<u32>,
    /// Extra flags for `skiff scheduler`.
    pub scheduler_args: Vec<String>,
}

/// The kind of pod a workload creates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// 100m cpu, 500Mi memory.
    Basic,
    /// Basic, labelled `color=green`, required anti-affinity to `color=green` per hostname.
    AntiAffinity,
    /// Basic, labelled `team=a`, nodeSelector zone-0: what the affinity pods are drawn to.
    ZoneAnchor,
    /// Basic, labelled `team=a`, required affinity to `team=a` per zone.
    Affinity,
    /// Basic, labelled `app=spread`, maxSkew 1 over zones, DoNotSchedule.
    Spread,
    /// 3 cpu, low priority.
    Low,
    /// 3 cpu, high priority: needs a low one preempted.
    High,
    /// Basic, with a nodeSelector no node has: stays pending.
    Nowhere,
}

/// One workload, sized.
#[derive(Clone, Debug)]
pub struct Workload {
    pub kind: Option<WorkloadKind>,
    pub label: String,
    pub namespace: String,
    pub init: usize,
    pub init_shape: Shape,
    pub measured: usize,
    pub shape: Shape,
    /// Delete its pods afterwards (all but the fill step).
    pub clean_up: bool,
    pub notes: Vec<String>,
}

/// Sizes every workload for the node count, clamping what cannot fit.
pub fn plan(config: &SchedulerConfig) -> Vec<Workload> {
    let nodes = config.hollow.nodes;
    let zones = config.hollow.zones.max(1);
    let pods = config.pods;
    // Basic pods one node holds: bounded by cpu and by the pod count.
    let per_node = (NODE_CPU_MILLIS / BASIC_CPU_MILLIS).min(NODE_PODS) as usize;
    let mut out = Vec::new();
    for &kind in &config.workloads {
        let namespace = format!("sched-{}", kind.slug());
        let mut notes = Vec::new();
        let mut clamp = |what: &str, wanted: usize, room: usize| {
            if wanted > room {
                notes.push(format!("{what} clamped from {wanted} to {room}, what {nodes} nodes hold"));
            }
            wanted.min(room)
        };
        let w = match kind {
            WorkloadKind::Basic => {
                let room = nodes * per_node;
                let init = clamp("warm-up pods", config.warmup_pods.unwrap_or(pods / 2), room);
                let measured = clamp("measured pods", pods, room - init);
                Workload {
                    kind: Some(kind),
                    label: "basic".into(),
                    namespace,
                    init,
                    init_shape: Shape::Basic,
                    measured,
                    shape: Shape::Basic,
                    clean_up: true,
                    notes,
                }
            }
            WorkloadKind::AntiAffinity => {
                // One pod per node at most: half the pods initial, half measured.
                let wanted = config.anti_affinity_pods.unwrap_or((pods / 10).min(nodes / 5).max(1));
                let measured = clamp("measured pods", wanted, nodes / 2);
                let init = measured.min(nodes - measured);
                Workload {
                    kind: Some(kind),
                    label: "required anti-affinity (hostname)".into(),
                    namespace,
                    init,
                    init_shape: Shape::AntiAffinity,
                    measured,
                    shape: Shape::AntiAffinity,
                    clean_up: true,
                    notes,
                }
            }
            WorkloadKind::Affinity => {
                // Anchors in zone-0 draw every measured pod there.
                let zone_nodes = nodes.div_ceil(zones).max(1);
                let init = zone_nodes.min(1000);
                let room = zone_nodes * per_node - init;
                let measured = clamp("measured pods", config.affinity_pods.unwrap_or(pods / 2), room);
                Workload {
                    kind: Some(kind),
                    label: "required affinity (zone)".into(),
                    namespace,
                    init,
                    init_shape: Shape::ZoneAnchor,
                    measured,
                    shape: Shape::Affinity,
                    clean_up: true,
                    notes,
                }
            }
            WorkloadKind::Spread => {
                let room = nodes * per_node;
                let init = (pods / 10).min(room / 2);
                let measured = clamp("measured pods", config.spread_pods.unwrap_or(pods / 2), room - init);
                Workload {
                    kind: Some(kind),
                    label: "topology spread (zone, maxSkew 1)".into(),
                    namespace,
                    init,
                    init_shape: Shape::Basic,
                    measured,
                    shape: Shape::Spread,
                    clean_up: true,
                    notes,
                }
            }
            WorkloadKind::Preemption => {
                // One low-priority pod fills each node; each high one needs a victim.
                let measured = clamp("measured pods", config.preemption_pods.unwrap_or(pods / 10), nodes);
                Workload {
                    kind: Some(kind),
                    label: "preemption".into(),
                    namespace,
                    init: nodes,
                    init_shape: Shape::Low,
                    measured,
                    shape: Shape::High,
                    clean_up: true,
                    notes,
                }
            }
        };
        out.push(w);
    }
    if config.fill_to > 0 {
        let mut notes = Vec::new();
        let room = nodes * per_node;
        if config.fill_to > room {
            notes.push(format!("fill clamped from {} to {room}, what {nodes} nodes hold", config.fill_to));
        }
        out.push(Workload {
            kind: None,
            label: format!("fill to {} pods", config.fill_to.min(room)),
            namespace: "sched-fill".into(),
            init: 0,
            init_shape: Shape::Basic,
            measured: config.fill_to.min(room),
            shape: Shape::Basic,
            clean_up: false,
            notes,
        });
    }
    out
}

/// How pods get their priority.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Priority {
    /// `priorityClassName` of the PriorityClasses `bench-low` and `bench-high`.
    Classes,
    /// `spec.priority` set directly (no PriorityClass resource served).
    Direct,
}

/// The pod `name` of `shape`.
pub fn pod(shape: Shape, name: &str, priority: Priority) -> Value {
    let cpu = match shape {
        Shape::Low | Shape::High => BIG_CPU_MILLIS,
        _ => BASIC_CPU_MILLIS,
    };
    let memory = match shape {
        Shape::Low | Shape::High => "1Gi",
        _ => "500Mi",
    };
    let resources = json!({"cpu": format!("{cpu}m"), "memory": memory});
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {}},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.9",
                                 "resources": {"requests": resources, "limits": resources}}]},
    });
    let term = |key: &str, value: &str, topology: &str| json!([{"labelSelector": {"matchLabels": {key: value}}, "topologyKey": topology}]);
    match shape {
        Shape::Basic => {}
        Shape::Nowhere => pod["spec"]["nodeSelector"] = json!({NOWHERE_LABEL: "true"}),
        Shape::AntiAffinity => {
            pod["metadata"]["labels"]["color"] = json!("green");
            pod["spec"]["affinity"] = json!({"podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": term("color", "green", HOSTNAME_LABEL)}});
        }
        Shape::ZoneAnchor => {
            pod["metadata"]["labels"]["team"] = json!("a");
            pod["spec"]["nodeSelector"] = json!({ZONE_LABEL: hollow::zone_name(0)});
        }
        Shape::Affinity => {
            pod["metadata"]["labels"]["team"] = json!("a");
            pod["spec"]["affinity"] = json!({"podAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": term("team", "a", ZONE_LABEL)}});
        }
        Shape::Spread => {
            pod["metadata"]["labels"]["app"] = json!("spread");
            pod["spec"]["topologySpreadConstraints"] = json!([{
                "maxSkew": 1, "topologyKey": ZONE_LABEL, "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app": "spread"}}}]);
        }
        Shape::Low | Shape::High => {
            let (class, value) =
                if shape == Shape::Low { ("bench-low", LOW_PRIORITY) } else { ("bench-high", HIGH_PRIORITY) };
            match priority {
                Priority::Classes => pod["spec"]["priorityClassName"] = json!(class),
                Priority::Direct => pod["spec"]["priority"] = json!(value),
            }
        }
    }
    pod
}

/// Creates the PriorityClasses if this cluster serves them.
async fn priority_mode(client: &Client) -> Result<Priority> {
    let Some(classes) = skiff_api::resources::by_kind("scheduling.k8s.io/v1", "PriorityClass") else {
        return Ok(Priority::Direct);
    };
    for (name, value) in [("bench-low", LOW_PRIORITY), ("bench-high", HIGH_PRIORITY)] {
        let class = json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                           "metadata": {"name": name}, "value": value, "globalDefault": false});
        match timed(client.create(classes, "", &class)).await {
            Ok(_) => {}
            Err(e) if e.downcast_ref::<ClientError>().is_some_and(|e| e.is(Reason::AlreadyExists)) => {}
            // Known to this harness's client, not served by this cluster.
            Err(e) if e.downcast_ref::<ClientError>().is_some_and(|e| e.is(Reason::NotFound)) => {
                return Ok(Priority::Direct)
            }
            Err(e) => return Err(e.context(format!("creating PriorityClass {name}"))),
        }
    }
    Ok(Priority::Classes)
}

/// The `skiff scheduler` process this harness runs.
struct SchedulerProcess {
    child: Option<Child>,
    pid: u32,
    http: String,
    log: PathBuf,
}

impl SchedulerProcess {
    fn start(config: &SchedulerConfig, endpoints: &[String]) -> Result<SchedulerProcess> {
        let http = format!("127.0.0.1:{}", std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port());
        let log = config.dir.join("scheduler.log");
        let file = OpenOptions::new().create(true).append(true).open(&log)?;
        let mut cmd = Command::new(&config.skiff);
        cmd.arg("scheduler")
            .args(["--server", &endpoints.join(","), "--http-listen", &http])
            .args(["--leader-elect", if config.scheduler_leader_elect { "true" } else { "false" }])
            .args(["--identity", "bench-scheduler"]);
        if let Some(p) = config.percentage_of_nodes_to_score {
            cmd.args(["--percentage-of-nodes-to-score", &p.to_string()]);
        }
        let child = cmd
            .args(&config.scheduler_args)
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("starting {} scheduler", config.skiff.display()))?;
        Ok(SchedulerProcess { pid: child.id(), child: Some(child), http, log })
    }

    /// Why the process is gone, with its log tail; `None` while it runs.
    fn exited(&mut self) -> Option<String> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        self.child = None;
        Some(format!(
            "`skiff scheduler` exited ({status}); its log ({}) ends:\n{}",
            self.log.display(),
            tail(&self.log)
        ))
    }

    async fn metrics(&self) -> Result<String> {
        crate::controllers::http_get(&self.http, "/metrics").await
    }
}

impl Drop for SchedulerProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// What a workload's measured step gave.
#[derive(Clone, Debug, Default)]
pub struct Row {
    pub label: String,
    pub nodes: usize,
    pub measured: usize,
    pub bound: usize,
    pub pods_per_second: Option<f64>,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub cpu_ms_per_pod: Option<f64>,
    pub rss_mib: Option<f64>,
    pub target: Option<f64>,
    pub detail: String,
}

#[derive(Default)]
pub struct SchedulerReport {
    pub rows: Vec<Row>,
    /// The Lease renewals with nothing else running.
    pub lease_load: String,
    /// The Lease renewals over the whole run.
    pub lease_run: String,
    pub settings: Vec<String>,
    pub notes: Vec<String>,
    /// The scheduler's own lines of its `/metrics` at the end (names with
    /// `schedul` in them; no histogram buckets, no zeros).
    pub metrics: Vec<String>,
}

/// The measured pods' figures: `sent` is each create's send instant by pod
/// index, `bound` each pod's binding seen by name (`m-INDEX`).
pub fn figures(
    sent: &[Option<Instant>],
    bound: &HashMap<String, Instant>,
    group: &str,
) -> (usize, Option<f64>, Latency) {
    let mut latency = Latency::default();
    let first = sent.iter().flatten().min().copied();
    let mut last: Option<Instant> = None;
    let mut n = 0;
    for (i, at) in sent.iter().enumerate() {
        let (Some(at), Some(done)) = (at, bound.get(&format!("{group}-{i}"))) else { continue };
        latency.record(done.saturating_duration_since(*at));
        last = Some(last.map_or(*done, |l| l.max(*done)));
        n += 1;
    }
    let rate = match (first, last) {
        (Some(f), Some(l)) if l > f => Some(n as f64 / (l - f).as_secs_f64()),
        _ => None,
    };
    (n, rate, latency)
}

/// Pods created by the load generator.
struct Created {
    sent: Vec<Option<Instant>>,
    errors: usize,
    first_error: Option<String>,
    elapsed: Duration,
}

/// One batch of a workload's pods: `count` pods `GROUP-i` of `shape` in `namespace`.
struct Batch<'a> {
    namespace: &'a str,
    group: &'static str,
    count: usize,
    shape: Shape,
}

/// A batch's progress, shared by its creator and its waiter.
struct Progress {
    /// Pods to wait for: the batch, less the creates that failed.
    expected: AtomicUsize,
    creating: AtomicBool,
}

/// Creates `batch`, `concurrency` at a time over `clients`; each failed
/// create lowers `progress.expected` by one.
async fn create_pods(
    clients: &[Client],
    batch: &Batch<'_>,
    priority: Priority,
    concurrency: usize,
    progress: &Progress,
) -> Created {
    let Batch { namespace, group, count, shape } = *batch;
    let expected = &progress.expected;
    let started = Instant::now();
    let next = AtomicUsize::new(0);
    let sent = Mutex::new(vec![None; count]);
    let errors = Mutex::new((0usize, None::<String>));
    let worker = |w: usize| {
        let client = &clients[w % clients.len()];
        let (next, sent, errors) = (&next, &sent, &errors);
        async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return;
                }
                let name = format!("{group}-{i}");
                let body = pod(shape, &name, priority);
                let at = Instant::now();
                let mut outcome = Err(anyhow::anyhow!("not tried"));
                for attempt in 0..3 {
                    outcome = match timed(client.create_raw(info(Kind::Pod), namespace, &body)).await {
                        Ok(_) => Ok(()),
                        Err(e) if e.downcast_ref::<ClientError>().is_some_and(|e| e.is(Reason::AlreadyExists)) => {
                            Ok(())
                        }
                        Err(e) => Err(e),
                    };
                    let refused = outcome
                        .as_ref()
                        .err()
                        .and_then(|e| e.downcast_ref::<ClientError>())
                        .is_some_and(|e| e.reason().is_some_and(|r| r != Reason::Timeout));
                    if outcome.is_ok() || refused {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                }
                match outcome {
                    Ok(()) => {
                        if let Ok(mut s) = sent.lock() {
                            s[i] = Some(at);
                        }
                    }
                    Err(e) => {
                        expected.fetch_sub(1, Ordering::Relaxed);
                        if let Ok(mut errors) = errors.lock() {
                            errors.0 += 1;
                            errors.1.get_or_insert_with(|| format!("{namespace}/{name}: {e:#}"));
                        }
                    }
                }
            }
        }
    };
    futures::future::join_all((0..concurrency.max(1)).map(worker)).await;
    progress.creating.store(false, Ordering::Relaxed);
    let (errors, first_error) = errors.into_inner().unwrap_or_default();
    Created { sent: sent.into_inner().unwrap_or_default(), errors, first_error, elapsed: started.elapsed() }
}

/// Waits until the batch's pods are seen bound (true), or none was for
/// `stall_timeout` (false). Fails when none at all is bound within
/// `bind_timeout` of `since`, or the scheduler exits.
async fn wait_bound(
    hollow: &Hollow,
    scheduler: &mut Option<SchedulerProcess>,
    config: &SchedulerConfig,
    batch: &Batch<'_>,
    progress: &Progress,
    since: Instant,
) -> Result<bool> {
    let (namespace, group) = (batch.namespace, batch.group);
    let (expected, creating) = (&progress.expected, &progress.creating);
    let mut seen = 0;
    let mut moved = Instant::now();
    loop {
        let bound = hollow.bound(namespace, group);
        if bound >= expected.load(Ordering::Relaxed) && !creating.load(Ordering::Relaxed) {
            return Ok(true);
        }
        if bound > seen {
            seen = bound;
            moved = Instant::now();
        }
        if let Some(why) = scheduler.as_mut().and_then(SchedulerProcess::exited) {
            bail!("{why}");
        }
        if seen == 0 && since.elapsed() > config.bind_timeout {
            let log = scheduler
                .as_ref()
                .map(|s| format!("; the scheduler runs, its log ({}) ends:\n{}", s.log.display(), tail(&s.log)))
                .unwrap_or_default();
            bail!(
                "no pod of {namespace} was bound within {:?} (--bind-timeout): the scheduler binds nothing{log}",
                config.bind_timeout
            );
        }
        if moved.elapsed() > config.stall_timeout && !creating.load(Ordering::Relaxed) {
            return Ok(false);
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Creates a batch and waits for its bindings, both at once: the pods
/// created, and whether all of them were bound.
async fn run_batch(
    hollow: &Hollow,
    scheduler: &mut Option<SchedulerProcess>,
    clients: &[Client],
    config: &SchedulerConfig,
    priority: Priority,
    batch: &Batch<'_>,
) -> Result<(Created, bool)> {
    let progress = Progress { expected: AtomicUsize::new(batch.count), creating: AtomicBool::new(true) };
    let started = Instant::now();
    let create = create_pods(clients, batch, priority, config.create_clients, &progress);
    let wait = wait_bound(hollow, scheduler, config, batch, &progress, started);
    let (created, all) = tokio::join!(create, wait);
    Ok((created, all?))
}

/// Deletes every pod of `namespace` with grace 0.
async fn clean_up(client: &Client, namespace: &str) -> Result<usize> {
    let list =
        timed(client.list_all(info(Kind::Pod), namespace, &ListParams { limit: 1000, ..Default::default() })).await?;
    let names: Vec<String> =
        list.items.iter().filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string)).collect();
    let deleted = names.len();
    let results = futures::stream::iter(names)
        .map(|name| async move {
            let params = DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
            match timed(client.delete(info(Kind::Pod), namespace, &name, &params)).await {
                Ok(_) => Ok(()),
                Err(e) if e.downcast_ref::<ClientError>().is_some_and(|e| e.is(Reason::NotFound)) => Ok(()),
                Err(e) => Err(e.context(format!("deleting {namespace}/{name}"))),
            }
        })
        .buffer_unordered(DELETE_INFLIGHT)
        .collect::<Vec<Result<()>>>()
        .await;
    results.into_iter().collect::<Result<Vec<()>>>()?;
    Ok(deleted)
}

/// Binds every unbound pod round robin over the hollow nodes, ignoring
/// every constraint: the harness's plumbing without a scheduler, and the
/// apiservers' ceiling for create + bind + status.
async fn stand_in_scheduler(client: Client, nodes: usize) -> Result<()> {
    let inflight = Arc::new(Semaphore::new(STAND_IN_INFLIGHT));
    let mut next = 0usize;
    let mut from = String::new();
    let mut bound: std::collections::HashSet<String> = std::collections::HashSet::new();
    loop {
        let params = WatchParams {
            field_selector: "spec.nodeName=".into(),
            resource_version: from.clone(),
            ..Default::default()
        };
        let mut stream = match client.watch(info(Kind::Pod), "", &params).await {
            Ok(s) => Box::pin(s),
            Err(e) => {
                eprintln!("skiff-bench: stand-in scheduler watch: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        while let Some(event) = stream.next().await {
            let Ok(event) = event else { break };
            if let Some(rv) = event.resource_version() {
                from = rv.to_string();
            }
            if event.kind != EventType::Added {
                continue;
            }
            let meta = &event.object["metadata"];
            let uid = meta["uid"].as_str().unwrap_or_default().to_string();
            if !meta["deletionTimestamp"].is_null() || !bound.insert(uid) {
                continue;
            }
            let namespace = meta["namespace"].as_str().unwrap_or_default().to_string();
            let name = meta["name"].as_str().unwrap_or_default().to_string();
            let node = hollow::node_name(next % nodes);
            next += 1;
            let permit = inflight.clone().acquire_owned().await?;
            let client = client.clone();
            tokio::spawn(async move {
                let _permit = permit;
                if let Err(e) = timed(client.bind(&namespace, &name, &node)).await {
                    eprintln!("skiff-bench: stand-in bind of {namespace}/{name}: {e:#}");
                }
            });
        }
    }
}

fn rss_mib(pid: u32) -> Option<f64> {
    crate::objects::rss_bytes(pid).ok().map(|b| b as f64 / 1024.0 / 1024.0)
}

/// Launches everything, runs the workloads, and stops it all.
pub async fn run(config: &SchedulerConfig) -> Result<SchedulerReport> {
    if config.create_clients == 0 || config.hollow.nodes == 0 || config.hollow.zones == 0 {
        bail!("--create-clients, --nodes and --zones must be positive");
    }
    let mut extra_args = Vec::new();
    let subcommand = match config.masters {
        Masters::Apiserver => "apiserver",
        Masters::Server => {
            must_have_flag(&config.skiff, "server", "--disable-scheduler")?;
            extra_args.extend(["--disable-scheduler", "--controllers", "*,-nodelifecycle"].map(String::from));
            "server"
        }
    };
    extra_args.extend(config.skiff_args.iter().cloned());
    let spec = ClusterSpec {
        system: System::Skiff,
        binary: config.skiff.clone(),
        members: 3,
        dir: config.dir.clone(),
        etcd_timing: EtcdTiming { heartbeat_ms: 40, election_timeout_ms: 200 },
        extra_args: extra_args.clone(),
        skiff_subcommand: subcommand,
    };
    eprintln!("== Skiff: starting 3 members (`skiff {subcommand}`) in {}", config.dir.display());
    let mut cluster = Cluster::launch(spec).await?;
    let leader = cluster.must_leader().await?;
    let endpoints = cluster.endpoints();
    let mut leader_first = endpoints.clone();
    leader_first.rotate_left(leader);
    let client = Client::new(&leader_first)?;
    let mut report = SchedulerReport::default();
    report.settings.push(format!(
        "3 Skiff members on 127.0.0.1 (`skiff {subcommand}`{}), data under {} (fsync on)",
        if extra_args.is_empty() { String::new() } else { format!(" {}", extra_args.join(" ")) },
        config.dir.display()
    ));

    let n = config.hollow.nodes;
    if !config.hollow.mark_running {
        report.notes.push("--no-mark-running: the hollow nodes wrote no pod status".into());
    }
    if config.hollow.lease_interval.is_zero() {
        report.notes.push("--lease-interval 0s: the hollow nodes renewed no Lease".into());
    }
    eprintln!("  registering {n} hollow nodes in {} zones", config.hollow.zones);
    let registering = Instant::now();
    let hollow = Hollow::start(&endpoints, &config.hollow).await?;
    report.settings.push(format!(
        "{n} hollow nodes (cpu {}, memory {}, pods {NODE_PODS}; {} zones), registered in {:.1} s (Node create + status \
         patch + Lease create each, {} in flight)",
        NODE_CPU_MILLIS / 1000,
        hollow::NODE_MEMORY,
        config.hollow.zones,
        registering.elapsed().as_secs_f64(),
        hollow::REGISTER_INFLIGHT
    ));
    let priority = priority_mode(&client).await?;
    if priority == Priority::Direct {
        report.notes.push(
            "no `scheduling.k8s.io/v1` PriorityClass served: preemption pods set `spec.priority` directly \
             (100 low, 1000 high)"
                .into(),
        );
    }

    let mut pids: Vec<u32> = cluster.pids().into_iter().flatten().collect();
    let mut stand_in = None;
    let mut scheduler = if config.stand_in {
        let client = client.clone();
        stand_in = Some(tokio::spawn(async move {
            if let Err(e) = stand_in_scheduler(client, n).await {
                eprintln!("skiff-bench: the stand-in scheduler stopped: {e:#}");
            }
        }));
        report.notes.push(
            "STAND-IN: no `skiff scheduler` ran; the harness bound pods round robin ignoring every constraint \
             (plumbing test; pods/s is the apiservers' ceiling for create + bind + status, the CPU and RSS columns \
             are empty)"
                .into(),
        );
        None
    } else {
        let s = SchedulerProcess::start(config, &leader_first)?;
        pids.insert(0, s.pid);
        Some(s)
    };
    let scheduler_pid = scheduler.as_ref().map(|s| s.pid);

    // The Lease renewals alone: what the hollow nodes cost the masters.
    tokio::time::sleep(Duration::from_secs(1)).await;
    if let Some(why) = scheduler.as_mut().and_then(SchedulerProcess::exited) {
        bail!("{why}");
    }
    let (r0, e0, l0) = hollow.lease_counts();
    hollow.take_lease_latency();
    let idle = Sampler::start(pids.clone())?;
    tokio::time::sleep(config.idle_window).await;
    let idle = idle.finish()?;
    let (r1, e1, l1) = hollow.lease_counts();
    let lat = hollow.take_lease_latency();
    let members_cpu: f64 = idle.members[scheduler_pid.is_some() as usize..].iter().sum();
    let scheduler_idle = scheduler_pid
        .map(|_| format!(", the scheduler {:.0}%", 100.0 * idle.members[0] / idle.wall))
        .unwrap_or_default();
    report.lease_load = format!(
        "{n} nodes renewing every {:?}: {:.0} renewals/s expected, {:.0}/s measured over {:.0} s ({} errors, {} late), \
         renewal p50 {:.2} ms, p99 {:.2} ms; CPU while only they run: the 3 members {:.0}% of one core together{}",
        config.hollow.lease_interval,
        if config.hollow.lease_interval.is_zero() { 0.0 } else { n as f64 / config.hollow.lease_interval.as_secs_f64() },
        (r1 - r0) as f64 / idle.wall,
        idle.wall,
        e1 - e0,
        l1 - l0,
        lat.quantile_ms(0.5),
        lat.quantile_ms(0.99),
        100.0 * members_cpu / idle.wall,
        scheduler_idle,
    );
    eprintln!("  lease load: {}", report.lease_load);

    let clients: Vec<Client> = (0..config.create_clients.min(8))
        .map(|i| {
            let mut order = leader_first.clone();
            if config.creates_to_every_member {
                let turn = i % order.len();
                order.rotate_left(turn);
            }
            Client::new(&order)
        })
        .collect::<Result<_, _>>()?;
    for workload in plan(config) {
        eprintln!(
            "  {}: {} initial, {} measured pods in {}",
            workload.label, workload.init, workload.measured, workload.namespace
        );
        hollow::ensure_namespace(&client, &workload.namespace).await?;
        let mut detail = Vec::new();
        if workload.init > 0 {
            let batch = Batch {
                namespace: &workload.namespace,
                group: "init",
                count: workload.init,
                shape: workload.init_shape,
            };
            let started = Instant::now();
            let (created, all) = run_batch(&hollow, &mut scheduler, &clients, config, priority, &batch).await?;
            let bound = hollow.bound(&workload.namespace, "init");
            detail.push(format!(
                "{} initial pods created in {:.1} s ({} errors), {bound} bound after {:.1} s{}",
                workload.init,
                created.elapsed.as_secs_f64(),
                created.errors,
                started.elapsed().as_secs_f64(),
                if all { "" } else { " (stalled: measured anyway)" }
            ));
        }
        if config.pending_pods > 0 && workload.kind.is_some() {
            let batch = Batch {
                namespace: &workload.namespace,
                group: "pending",
                count: config.pending_pods,
                shape: Shape::Nowhere,
            };
            let progress = Progress { expected: AtomicUsize::new(batch.count), creating: AtomicBool::new(true) };
            let created = create_pods(&clients, &batch, priority, config.create_clients, &progress).await;
            // Time for the scheduler to try each once and find it fits nowhere.
            tokio::time::sleep(SETTLE).await;
            detail.push(format!(
                "{} pods that fit no node created in {:.1} s ({} errors) and left pending",
                config.pending_pods,
                created.elapsed.as_secs_f64(),
                created.errors
            ));
        }
        let batch =
            Batch { namespace: &workload.namespace, group: "m", count: workload.measured, shape: workload.shape };
        let sampler = Sampler::start(pids.clone())?;
        let (created, all) = run_batch(&hollow, &mut scheduler, &clients, config, priority, &batch).await?;
        let cpu = sampler.finish()?;
        let bound_at = hollow.bound_times(&workload.namespace, "m");
        let (bound, rate, latency) = figures(&created.sent, &bound_at, "m");
        let backlog = hollow.backlog();
        let cpu_ms_per_pod = scheduler_pid.filter(|_| bound > 0).map(|_| 1000.0 * cpu.members[0] / bound as f64);
        let rss = scheduler_pid.and_then(rss_mib);
        detail.push(format!(
            "{} measured pods created in {:.1} s ({:.0}/s, {} errors{}); {bound} bound{}; {backlog} pod status \
             writes still queued at the last binding",
            workload.measured,
            created.elapsed.as_secs_f64(),
            workload.measured as f64 / created.elapsed.as_secs_f64().max(1e-9),
            created.errors,
            created.first_error.as_deref().map(|e| format!(", first: {e}")).unwrap_or_default(),
            if all {
                String::new()
            } else {
                format!(" (gave up after {:?} without a new binding)", config.stall_timeout)
            }
        ));
        let offset = scheduler_pid.is_some() as usize;
        let members: Vec<String> = cpu.members[offset..].iter().map(|s| format!("{s:.1}")).collect();
        detail.push(format!(
            "CPU s over the {:.1} s window: {}members {} (member {} leads), harness {:.1}",
            cpu.wall,
            scheduler_pid.map(|_| format!("scheduler {:.1}, ", cpu.members[0])).unwrap_or_default(),
            members.join(" / "),
            leader + 1,
            cpu.harness
        ));
        detail.extend(workload.notes.iter().cloned());
        let row = Row {
            label: workload.label.clone(),
            nodes: n,
            measured: workload.measured,
            bound,
            pods_per_second: rate,
            p50_ms: (bound > 0).then(|| latency.quantile_ms(0.5)),
            p99_ms: (bound > 0).then(|| latency.quantile_ms(0.99)),
            cpu_ms_per_pod,
            rss_mib: rss,
            // A stand-in's figures say nothing of the scheduler's targets.
            target: workload.kind.and_then(WorkloadKind::target).filter(|_| !config.stand_in),
            detail: detail.join("; "),
        };
        eprintln!("     {}", row.summary());
        report.rows.push(row);
        if workload.clean_up {
            let deleted = clean_up(&client, &workload.namespace).await?;
            hollow.forget(&workload.namespace);
            eprintln!("     {deleted} pods deleted");
            tokio::time::sleep(SETTLE).await;
        }
    }

    let (renewals, errors, late) = hollow.lease_counts();
    let lat = hollow.take_lease_latency();
    report.lease_run = format!(
        "over the workloads: {} renewals, {errors} errors, {late} late; renewal p50 {:.2} ms, p99 {:.2} ms, max {:.0} \
         ms; pods marked Running {}, terminating pods deleted {}, pod write errors {}",
        renewals - r1,
        lat.quantile_ms(0.5),
        lat.quantile_ms(0.99),
        lat.max_ms(),
        hollow.pods.running.load(Ordering::Relaxed),
        hollow.pods.deleted.load(Ordering::Relaxed),
        hollow.pods.errors.load(Ordering::Relaxed),
    );
    if let Some(s) = &scheduler {
        match s.metrics().await {
            Ok(body) => {
                let _ = std::fs::write(config.dir.join("scheduler.metrics"), &body);
                report.metrics = body
                    .lines()
                    .filter(|l| {
                        !l.starts_with('#') && l.contains("schedul") && !l.ends_with(" 0") && !l.contains("_bucket")
                    })
                    .take(40)
                    .map(str::to_string)
                    .collect();
            }
            Err(e) => report.notes.push(format!("scraping the scheduler's /metrics at {}: {e:#}", s.http)),
        }
    }
    report.settings.push(format!(
        "pods created by {} concurrent creates over {} connections {}; each workload in its own \
         namespace, its pods deleted (grace 0) before the next; bound = first seen with spec.nodeName by the \
         hollow nodes' watch",
        config.create_clients,
        clients.len(),
        if config.creates_to_every_member {
            "spread over the 3 masters (--creates-to-every-member)"
        } else {
            "to the leader"
        }
    ));
    report.settings.push(match &scheduler {
        Some(_) => format!(
            "`skiff scheduler --leader-elect {}{}{}`",
            config.scheduler_leader_elect,
            config
                .percentage_of_nodes_to_score
                .map(|p| format!(" --percentage-of-nodes-to-score {p}"))
                .unwrap_or_default(),
            if config.scheduler_args.is_empty() {
                String::new()
            } else {
                format!(" {}", config.scheduler_args.join(" "))
            }
        ),
        None => "stand-in scheduler in the harness (no `skiff scheduler`)".into(),
    });
    if let Some(task) = stand_in {
        task.abort();
    }
    drop(scheduler);
    drop(hollow);
    drop(cluster);
    Ok(report)
}

/// Fails unless `skiff SUBCOMMAND --help` lists `flag`.
fn must_have_flag(skiff: &Path, subcommand: &str, flag: &str) -> Result<()> {
    let output = Command::new(skiff)
        .args([subcommand, "--help"])
        .output()
        .with_context(|| format!("running {} {subcommand} --help", skiff.display()))?;
    if !String::from_utf8_lossy(&output.stdout).contains(flag) {
        bail!(
            "`{} {subcommand}` has no {flag} yet: use --masters apiserver (no scheduler, no controller manager \
             in the masters)",
            skiff.display()
        );
    }
    Ok(())
}

fn ms(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.0} ms")).unwrap_or_else(|| "-".into())
}

impl Row {
    fn pods(&self) -> String {
        if self.bound == self.measured {
            self.measured.to_string()
        } else {
            format!("{} ({} bound)", self.measured, self.bound)
        }
    }

    fn verdict(&self) -> String {
        let Some(target) = self.target else { return "-".into() };
        let met = self.bound == self.measured && self.pods_per_second.is_some_and(|r| r >= target);
        format!("≥ {target:.0} pods/s: {}", if met { "met" } else { "NOT met" })
    }

    pub fn summary(&self) -> String {
        format!(
            "{}: {} pods, {} pods/s, p50 {}, p99 {}, scheduler {} CPU ms/pod, RSS {}",
            self.label,
            self.pods(),
            self.pods_per_second.map(|r| format!("{r:.0}")).unwrap_or_else(|| "-".into()),
            ms(self.p50_ms),
            ms(self.p99_ms),
            self.cpu_ms_per_pod.map(|c| format!("{c:.2}")).unwrap_or_else(|| "-".into()),
            self.rss_mib.map(|r| format!("{r:.0} MiB")).unwrap_or_else(|| "-".into()),
        )
    }
}

impl SchedulerReport {
    pub fn table(&self) -> String {
        let mut out = String::new();
        out.push_str(
            "| workload | nodes | pods measured | pods/s | p50 create→bound | p99 create→bound | scheduler CPU ms/pod \
             | scheduler RSS | target |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n",
        );
        for r in &self.rows {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                r.label,
                r.nodes,
                r.pods(),
                r.pods_per_second.map(|v| format!("{v:.0}")).unwrap_or_else(|| "-".into()),
                ms(r.p50_ms),
                ms(r.p99_ms),
                r.cpu_ms_per_pod.map(|v| format!("{v:.2}")).unwrap_or_else(|| "-".into()),
                r.rss_mib.map(|v| format!("{v:.0} MiB")).unwrap_or_else(|| "-".into()),
                r.verdict(),
            );
        }
        out
    }

    pub fn markdown(&self, date: &str, command: &str, machine: &[(String, String)]) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "Last run: {date}, with `{command}`.\n");
        out.push_str(&self.table());
        let _ = writeln!(
            out,
            "\nTargets (issue 22): basic ≥ {BASIC_TARGET:.0} pods/s, required anti-affinity ≥ \
             {ANTI_AFFINITY_TARGET:.0} pods/s.\n"
        );
        let _ = writeln!(out, "Hollow node Leases: {}; {}.\n", self.lease_load, self.lease_run);
        out.push_str("Details:\n\n");
        for r in &self.rows {
            let _ = writeln!(out, "- {}: {}", r.label, r.detail);
        }
        for note in &self.notes {
            let _ = writeln!(out, "- {note}");
        }
        out.push_str("\nSettings:\n\n");
        for s in &self.settings {
            let _ = writeln!(out, "- {s}");
        }
        if !self.metrics.is_empty() {
            out.push_str("\nThe scheduler's metrics at the end:\n\n```\n");
            for line in &self.metrics {
                let _ = writeln!(out, "{line}");
            }
            out.push_str("```\n");
        }
        out.push_str("\nMachine:\n\n");
        for (name, value) in machine {
            let _ = writeln!(out, "- {name}: {value}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(nodes: usize, pods: usize) -> SchedulerConfig {
        SchedulerConfig {
            skiff: PathBuf::from("skiff"),
            dir: PathBuf::from("/tmp"),
            masters: Masters::Apiserver,
            skiff_args: Vec::new(),
            hollow: HollowConfig {
                nodes,
                zones: 10,
                lease_interval: Duration::from_secs(10),
                status_writers: 16,
                mark_running: true,
            },
            workloads: WorkloadKind::all(),
            pods,
            warmup_pods: None,
            anti_affinity_pods: None,
            affinity_pods: None,
            spread_pods: None,
            preemption_pods: None,
            pending_pods: 0,
            fill_to: 50_000,
            create_clients: 64,
            creates_to_every_member: false,
            bind_timeout: Duration::from_secs(60),
            stall_timeout: Duration::from_secs(60),
            idle_window: Duration::from_secs(10),
            stand_in: false,
            scheduler_leader_elect: false,
            percentage_of_nodes_to_score: None,
            scheduler_args: Vec::new(),
        }
    }

    fn sizes(plan: &[Workload]) -> Vec<(usize, usize)> {
        plan.iter().map(|w| (w.init, w.measured)).collect()
    }

    #[test]
    fn the_default_plan_is_scheduler_perfs_sizes_on_5000_nodes() {
        let plan = plan(&config(5000, 10_000));
        // basic 5,000 + 10,000; anti-affinity 1,000 + 1,000; affinity anchors in
        // zone-0's 500 nodes + 5,000; spread 1,000 + 5,000; preemption one low
        // pod per node + 1,000; the fill to 50,000.
        assert_eq!(
            sizes(&plan),
            vec![(5000, 10_000), (1000, 1000), (500, 5000), (1000, 5000), (5000, 1000), (0, 50_000)]
        );
        assert!(plan.iter().all(|w| w.notes.is_empty()), "nothing clamped");
        assert!(plan.last().is_some_and(|w| !w.clean_up));
    }

    #[test]
    fn a_quick_plan_fits_its_few_nodes() {
        let mut c = config(500, 1000);
        c.anti_affinity_pods = Some(400);
        c.fill_to = 0;
        let plan = plan(&c);
        assert_eq!(sizes(&plan), vec![(500, 1000), (250, 250), (50, 500), (100, 500), (500, 100)]);
        assert!(plan[1].notes[0].contains("clamped from 400 to 250"), "{:?}", plan[1].notes);
        // Anti-affinity: one pod per node at most.
        assert!(plan[1].init + plan[1].measured <= 500);
    }

    #[test]
    fn pods_carry_their_workloads_constraints() {
        let anti = pod(Shape::AntiAffinity, "m-1", Priority::Classes);
        let term = &anti["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0];
        assert_eq!(term["topologyKey"], HOSTNAME_LABEL);
        assert_eq!(term["labelSelector"]["matchLabels"]["color"], anti["metadata"]["labels"]["color"]);
        let affinity = pod(Shape::Affinity, "m-1", Priority::Classes);
        let term = &affinity["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0];
        assert_eq!(term["topologyKey"], ZONE_LABEL);
        assert_eq!(pod(Shape::ZoneAnchor, "init-1", Priority::Classes)["spec"]["nodeSelector"][ZONE_LABEL], "zone-0");
        let spread = pod(Shape::Spread, "m-1", Priority::Classes);
        assert_eq!(spread["spec"]["topologySpreadConstraints"][0]["maxSkew"], 1);
        assert_eq!(spread["spec"]["topologySpreadConstraints"][0]["whenUnsatisfiable"], "DoNotSchedule");
        assert_eq!(pod(Shape::High, "m-1", Priority::Classes)["spec"]["priorityClassName"], "bench-high");
        assert_eq!(pod(Shape::Low, "init-1", Priority::Direct)["spec"]["priority"], LOW_PRIORITY);
        assert_eq!(
            pod(Shape::Basic, "m-1", Priority::Direct)["spec"]["containers"][0]["resources"]["requests"]["cpu"],
            "100m"
        );
        assert_eq!(
            pod(Shape::High, "m-1", Priority::Direct)["spec"]["containers"][0]["resources"]["requests"]["cpu"],
            "3000m"
        );
    }

    #[test]
    fn throughput_runs_from_the_first_create_to_the_last_binding() {
        let t = Instant::now();
        let sent = vec![Some(t), Some(t + Duration::from_millis(100)), None, Some(t + Duration::from_millis(200))];
        let bound: HashMap<String, Instant> = [
            ("m-0".to_string(), t + Duration::from_millis(50)),
            ("m-1".to_string(), t + Duration::from_millis(150)),
            ("m-2".to_string(), t + Duration::from_millis(100)),
            ("init-3".to_string(), t + Duration::from_millis(900)),
        ]
        .into();
        let (n, rate, latency) = figures(&sent, &bound, "m");
        // m-2 failed to be created and m-3 is not bound: two pods in 150 ms.
        assert_eq!(n, 2);
        assert!((rate.unwrap() - 2.0 / 0.15).abs() < 1e-6, "{rate:?}");
        assert!((latency.quantile_ms(0.5) - 50.0).abs() < 0.1);
        assert!((latency.max_ms() - 50.0).abs() < 0.1);
    }

    #[test]
    fn the_table_checks_the_targets_and_shows_partial_bindings() {
        let report = SchedulerReport {
            rows: vec![
                Row {
                    label: "basic".into(),
                    nodes: 5000,
                    measured: 10_000,
                    bound: 10_000,
                    pods_per_second: Some(2100.0),
                    p50_ms: Some(12.0),
                    p99_ms: Some(80.0),
                    cpu_ms_per_pod: Some(0.31),
                    rss_mib: Some(210.0),
                    target: Some(BASIC_TARGET),
                    detail: String::new(),
                },
                Row {
                    label: "required anti-affinity (hostname)".into(),
                    nodes: 5000,
                    measured: 1000,
                    bound: 990,
                    pods_per_second: Some(700.0),
                    target: Some(ANTI_AFFINITY_TARGET),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let table = report.table();
        assert!(
            table.contains("| basic | 5000 | 10000 | 2100 | 12 ms | 80 ms | 0.31 | 210 MiB | ≥ 2000 pods/s: met |"),
            "{table}"
        );
        assert!(table.contains("| 1000 (990 bound) | 700 |"), "{table}");
        assert!(table.contains("≥ 600 pods/s: NOT met"), "{table}");
    }
}
