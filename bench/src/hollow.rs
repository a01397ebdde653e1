//! Hollow nodes, in the manner of kwok and kubemark: Node objects with
//! capacity and a Ready condition, each renewing its Lease, and pods bound to
//! them marked Running, all through Skiff's resource API, with no runtime.
//!
//! - **Nodes.** `hollow-NNNNN`, cpu 4, memory 32Gi, pods 110 (capacity =
//!   allocatable), labels `kubernetes.io/hostname` and
//!   `topology.kubernetes.io/zone` (`zone-K`, node i in zone i mod zones).
//!   Created, then their status merge-patched, as a kubelet registers.
//! - **Leases.** One per node in `kube-node-lease`, renewed every
//!   `lease_interval` (the kubelet's 10 s; zero: never) by a merge patch of
//!   `spec.renewTime`. The renewals are spread evenly over the interval, so
//!   they are a steady write load of nodes / interval writes per second.
//! - **Pods.** One watch of every pod with `spec.nodeName!=` (a list first,
//!   then the watch from its revision; a failed watch lists again). A pod
//!   seen bound for the first time is recorded with the instant it was seen
//!   (the benchmark's "bound") and queued for a status write to Running
//!   (unless `mark_running` is off; a bounded queue served by
//!   `status_writers` writes in flight); a pod
//!   with a deletionTimestamp is deleted with grace 0, as a kubelet confirms
//!   a termination (preemption's victims).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use serde_json::{json, Value};
use skiff_api::status::Reason;
use skiff_api::watch::EventType;
use skiff_api::{Kind, ResourceInfo};
use skiff_client::resources::{DeleteParams, ListParams, WatchParams};
use skiff_client::{Client, ClientError};
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinHandle;

use crate::latency::Latency;

/// Every node's capacity and allocatable.
pub const NODE_CPU_MILLIS: u64 = 4000;
pub const NODE_MEMORY: &str = "32Gi";
pub const NODE_PODS: u64 = 110;
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
const LEASE_NAMESPACE: &str = "kube-node-lease";
/// Node registrations (create, status, Lease) in flight at most.
pub const REGISTER_INFLIGHT: usize = 64;
/// Lease renewals in flight at most; a renewal due while all are busy waits
/// (and is counted late).
const RENEW_INFLIGHT: usize = 64;
/// Pod status writes and deletions waiting for a writer at most.
const STATUS_QUEUE: usize = 65_536;
/// Bounds every unary request, so a stuck server fails the run instead of hanging it.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Clone, Debug)]
pub struct HollowConfig {
    pub nodes: usize,
    pub zones: usize,
    /// How often each node renews its Lease.
    pub lease_interval: Duration,
    /// Pod status writes (and deletions) in flight at most.
    pub status_writers: usize,
    /// Mark bound pods Running (a kubelet's status write); terminating pods
    /// are deleted either way.
    pub mark_running: bool,
}

pub fn node_name(i: usize) -> String {
    format!("hollow-{i:05}")
}

pub fn zone_name(zone: usize) -> String {
    format!("zone-{zone}")
}

/// The zone of node `i`: round robin, so every zone has nodes / zones of them.
pub fn zone_of(i: usize, zones: usize) -> String {
    zone_name(i % zones.max(1))
}

pub fn info(kind: Kind) -> &'static ResourceInfo {
    skiff_api::resources::of(kind)
}

/// `fut` with [`REQUEST_TIMEOUT`].
pub async fn timed<T>(fut: impl std::future::Future<Output = Result<T, ClientError>>) -> Result<T> {
    match tokio::time::timeout(REQUEST_TIMEOUT, fut).await {
        Ok(r) => Ok(r?),
        Err(_) => bail!("request timed out after {REQUEST_TIMEOUT:?}"),
    }
}

/// Creates namespace `name` unless it exists, retrying while the cluster settles.
pub async fn ensure_namespace(client: &Client, name: &str) -> Result<()> {
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match tokio::time::timeout(REQUEST_TIMEOUT, client.create(info(Kind::Namespace), "", &ns)).await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(e)) if e.is(Reason::AlreadyExists) => return Ok(()),
            _ if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(200)).await,
            Ok(Err(e)) => bail!("creating namespace {name}: {e}"),
            Err(_) => bail!("creating namespace {name}: timed out"),
        }
    }
}

/// Now as RFC 3339 with microseconds (a Lease's `MicroTime`).
fn micro_now() -> String {
    humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string()
}

/// Now as RFC 3339 with seconds, as Kubernetes writes most times.
fn now() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

/// The Node object node `i` registers.
pub fn node(i: usize, zones: usize) -> Value {
    let name = node_name(i);
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            HOSTNAME_LABEL: name,
            ZONE_LABEL: zone_of(i, zones),
            "kubernetes.io/os": "linux",
            "type": "hollow",
        }},
        "spec": {},
    })
}

/// The status node `i` reports: capacity, Ready, an address.
pub fn node_status(i: usize) -> Value {
    let resources = json!({
        "cpu": format!("{NODE_CPU_MILLIS}m"), "memory": NODE_MEMORY, "pods": NODE_PODS.to_string(),
        "ephemeral-storage": "100Gi",
    });
    let now = now();
    let condition = |kind: &str, status: &str, reason: &str| json!({"type": kind, "status": status, "reason": reason, "lastHeartbeatTime": now, "lastTransitionTime": now});
    json!({"status": {
        "capacity": resources, "allocatable": resources,
        "conditions": [
            condition("Ready", "True", "KubeletReady"),
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID"),
        ],
        "addresses": [{"type": "InternalIP", "address": format!("10.{}.{}.{}", 64 + i / 65_536, (i / 256) % 256, i % 256)},
                      {"type": "Hostname", "address": node_name(i)}],
        "nodeInfo": {"kubeletVersion": "hollow", "operatingSystem": "linux", "architecture": "amd64"},
    }})
}

fn lease(i: usize) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": node_name(i), "namespace": LEASE_NAMESPACE},
        "spec": {"holderIdentity": node_name(i), "leaseDurationSeconds": 40, "renewTime": micro_now()},
    })
}

/// Pods first seen bound, by namespace and name, with counts by name group
/// (the part of the name before its last `-`: `m-17` is in group `m`).
#[derive(Default)]
pub struct Bindings {
    at: HashMap<String, HashMap<String, Instant>>,
    counts: HashMap<(String, String), usize>,
}

pub fn group_of(name: &str) -> &str {
    name.rsplit_once('-').map(|(group, _)| group).unwrap_or(name)
}

impl Bindings {
    /// Records `namespace/name` as bound at `at`; false if it already was.
    pub fn record(&mut self, namespace: &str, name: &str, at: Instant) -> bool {
        let names = self.at.entry(namespace.to_string()).or_default();
        if names.contains_key(name) {
            return false;
        }
        names.insert(name.to_string(), at);
        *self.counts.entry((namespace.to_string(), group_of(name).to_string())).or_default() += 1;
        true
    }

    pub fn count(&self, namespace: &str, group: &str) -> usize {
        self.counts.get(&(namespace.to_string(), group.to_string())).copied().unwrap_or(0)
    }

    /// When each pod of `group` in `namespace` was first seen bound.
    pub fn times(&self, namespace: &str, group: &str) -> HashMap<String, Instant> {
        self.at
            .get(namespace)
            .map(|names| names.iter().filter(|(n, _)| group_of(n) == group).map(|(n, t)| (n.clone(), *t)).collect())
            .unwrap_or_default()
    }

    pub fn forget(&mut self, namespace: &str) {
        self.at.remove(namespace);
        self.counts.retain(|(ns, _), _| ns != namespace);
    }
}

/// Lease renewals so far.
#[derive(Default)]
pub struct LeaseStats {
    pub renewals: AtomicU64,
    pub errors: AtomicU64,
    /// Renewals that found every renewal slot busy when due.
    pub late: AtomicU64,
    pub latency: Mutex<Latency>,
}

/// Pod writes so far.
#[derive(Default)]
pub struct PodStats {
    pub running: AtomicU64,
    pub deleted: AtomicU64,
    pub errors: AtomicU64,
}

/// The simulator, running. Dropping it stops its tasks.
pub struct Hollow {
    pub bindings: Arc<Mutex<Bindings>>,
    pub leases: Arc<LeaseStats>,
    pub pods: Arc<PodStats>,
    /// The pod writers' queue, for its backlog.
    queue: mpsc::Sender<PodWork>,
    stopping: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Hollow {
    /// Registers every node and its Lease (returns once all exist), then
    /// starts the Lease renewals and the pod watch.
    pub async fn start(endpoints: &[String], config: &HollowConfig) -> Result<Hollow> {
        if config.nodes == 0 || config.zones == 0 || config.status_writers == 0 {
            bail!("nodes, zones and status writers must be positive");
        }
        let client = Client::new(endpoints)?;
        ensure_namespace(&client, LEASE_NAMESPACE).await?;
        let zones = config.zones;
        let registered = futures::stream::iter(0..config.nodes)
            .map(|i| {
                let client = client.clone();
                async move { register(&client, i, zones).await.with_context(|| format!("registering {}", node_name(i))) }
            })
            .buffer_unordered(REGISTER_INFLIGHT)
            .collect::<Vec<Result<()>>>()
            .await;
        registered.into_iter().collect::<Result<Vec<()>>>()?;

        let stopping = Arc::new(AtomicBool::new(false));
        let bindings = Arc::new(Mutex::new(Bindings::default()));
        let leases = Arc::new(LeaseStats::default());
        let pods = Arc::new(PodStats::default());
        let (queue, work) = mpsc::channel(STATUS_QUEUE);
        let mut tasks = Vec::new();
        if !config.lease_interval.is_zero() {
            let (client, stats, stopping) = (client.clone(), leases.clone(), stopping.clone());
            let (nodes, interval) = (config.nodes, config.lease_interval);
            tasks.push(tokio::spawn(async move { renew_leases(client, nodes, interval, stats, stopping).await }));
        }
        {
            let (client, stats, stopping) = (client.clone(), pods.clone(), stopping.clone());
            let (writers, mark_running) = (config.status_writers, config.mark_running);
            tasks.push(tokio::spawn(
                async move { write_pods(client, work, writers, mark_running, stats, stopping).await },
            ));
        }
        let nodes: HashSet<String> = (0..config.nodes).map(node_name).collect();
        let watching = Arc::new(tokio::sync::Notify::new());
        {
            let (bindings, stopping, watching) = (bindings.clone(), stopping.clone(), watching.clone());
            let queue = queue.clone();
            tasks.push(tokio::spawn(async move {
                if let Err(e) = watch_pods(client, nodes, bindings, queue, watching, stopping).await {
                    eprintln!("skiff-bench: the hollow nodes' pod watch stopped: {e:#}");
                }
            }));
        }
        let hollow = Hollow { bindings, leases, pods, queue, stopping, tasks };
        tokio::time::timeout(Duration::from_secs(60), watching.notified())
            .await
            .context("the hollow nodes' pod watch did not start within 60s")?;
        Ok(hollow)
    }

    /// Pods of `group` in `namespace` seen bound so far.
    pub fn bound(&self, namespace: &str, group: &str) -> usize {
        self.bindings.lock().map(|b| b.count(namespace, group)).unwrap_or(0)
    }

    pub fn bound_times(&self, namespace: &str, group: &str) -> HashMap<String, Instant> {
        self.bindings.lock().map(|b| b.times(namespace, group)).unwrap_or_default()
    }

    pub fn forget(&self, namespace: &str) {
        if let Ok(mut b) = self.bindings.lock() {
            b.forget(namespace);
        }
    }

    /// Pod status writes and deletions queued, not yet started: how far the
    /// hollow kubelets lag behind the bindings.
    pub fn backlog(&self) -> usize {
        self.queue.max_capacity() - self.queue.capacity()
    }

    /// (renewals, errors, late) so far.
    pub fn lease_counts(&self) -> (u64, u64, u64) {
        let l = &self.leases;
        (l.renewals.load(Ordering::Relaxed), l.errors.load(Ordering::Relaxed), l.late.load(Ordering::Relaxed))
    }

    /// Renewal latency since the last call (the histogram starts over).
    pub fn take_lease_latency(&self) -> Latency {
        self.leases.latency.lock().map(|mut l| std::mem::take(&mut *l)).unwrap_or_default()
    }

    pub fn stop(&mut self) {
        self.stopping.store(true, Ordering::Relaxed);
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Drop for Hollow {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn register(client: &Client, i: usize, zones: usize) -> Result<()> {
    match timed(client.create(info(Kind::Node), "", &node(i, zones))).await {
        Ok(_) => {}
        Err(e) if e.downcast_ref::<ClientError>().is_some_and(|e| e.is(Reason::AlreadyExists)) => {}
        Err(e) => return Err(e),
    }
    timed(client.patch(info(Kind::Node), "", &node_name(i), "merge", &node_status(i), "status")).await?;
    match timed(client.create(info(Kind::Lease), LEASE_NAMESPACE, &lease(i))).await {
        Ok(_) => Ok(()),
        Err(e) if e.downcast_ref::<ClientError>().is_some_and(|e| e.is(Reason::AlreadyExists)) => Ok(()),
        Err(e) => Err(e),
    }
}

/// When renewal `k` (counting from 0, node k mod nodes) is due: evenly spread.
pub fn renewal_due(start: Instant, k: u64, nodes: usize, interval: Duration) -> Instant {
    let step = interval.as_nanos() / nodes.max(1) as u128;
    start + Duration::from_nanos(u64::try_from(step * k as u128).unwrap_or(u64::MAX))
}

async fn renew_leases(client: Client, nodes: usize, interval: Duration, stats: Arc<LeaseStats>, stop: Arc<AtomicBool>) {
    let inflight = Arc::new(Semaphore::new(RENEW_INFLIGHT));
    let start = Instant::now();
    let mut k: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        k += 1;
        tokio::time::sleep_until(renewal_due(start, k, nodes, interval).into()).await;
        let permit = match inflight.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                stats.late.fetch_add(1, Ordering::Relaxed);
                match inflight.clone().acquire_owned().await {
                    Ok(p) => p,
                    Err(_) => return,
                }
            }
        };
        let (client, stats) = (client.clone(), stats.clone());
        let name = node_name((k % nodes as u64) as usize);
        tokio::spawn(async move {
            let _permit = permit;
            let sent = Instant::now();
            let patch = json!({"spec": {"renewTime": micro_now()}});
            match timed(client.patch_raw(info(Kind::Lease), LEASE_NAMESPACE, &name, "merge", &patch, "")).await {
                Ok(_) => {
                    stats.renewals.fetch_add(1, Ordering::Relaxed);
                    if let Ok(mut l) = stats.latency.lock() {
                        l.record(sent.elapsed());
                    }
                }
                Err(_) => {
                    stats.errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
}

/// What a hollow kubelet does for one pod.
#[derive(Debug)]
enum PodWork {
    Run { namespace: String, name: String },
    Delete { namespace: String, name: String, uid: String },
}

async fn watch_pods(
    client: Client,
    nodes: HashSet<String>,
    bindings: Arc<Mutex<Bindings>>,
    queue: mpsc::Sender<PodWork>,
    watching: Arc<tokio::sync::Notify>,
    stop: Arc<AtomicBool>,
) -> Result<()> {
    let selector = "spec.nodeName!=".to_string();
    let mut deleting: HashSet<String> = HashSet::new();
    let mut from: Option<String> = None;
    while !stop.load(Ordering::Relaxed) {
        let rv = match from.take() {
            Some(rv) => rv,
            None => {
                let params = ListParams { field_selector: selector.clone(), ..Default::default() };
                let list = timed(client.list_all(info(Kind::Pod), "", &params)).await?;
                for pod in list.items {
                    let pod: PodView = serde_json::from_value(pod).context("a listed pod")?;
                    if let Some(work) = observe(&pod, &nodes, &bindings, &mut deleting) {
                        queue.send(work).await.context("the pod writers stopped")?;
                    }
                }
                list.resource_version
            }
        };
        let params =
            WatchParams { field_selector: selector.clone(), resource_version: rv.clone(), ..Default::default() };
        let mut stream = match client.watch_raw(info(Kind::Pod), "", &params).await {
            Ok(s) => Box::pin(s),
            Err(e) => {
                eprintln!("skiff-bench: hollow pod watch: {e}; listing again");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        watching.notify_one();
        let mut last = rv;
        let mut relist = false;
        while let Some(event) = stream.next().await {
            let event = match event {
                Ok(event) => event,
                Err(e) => {
                    if !stop.load(Ordering::Relaxed) {
                        eprintln!("skiff-bench: hollow pod watch ended: {e}");
                    }
                    break;
                }
            };
            if event.kind == EventType::Error {
                // The history is compacted past `last`: list again.
                relist = true;
                break;
            }
            let pod: PodView = serde_json::from_slice(&event.json).context("a watched pod")?;
            if !pod.metadata.resource_version.is_empty() {
                last = pod.metadata.resource_version.clone();
            }
            if !matches!(event.kind, EventType::Added | EventType::Modified) {
                continue;
            }
            if let Some(work) = observe(&pod, &nodes, &bindings, &mut deleting) {
                queue.send(work).await.context("the pod writers stopped")?;
            }
        }
        // Resume where the stream ended, unless it said to list again.
        from = (!relist).then_some(last);
    }
    Ok(())
}

/// The fields of a pod a hollow kubelet reads (serde skips the rest
/// without building them).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
struct PodView {
    metadata: PodViewMeta,
    spec: PodViewSpec,
    status: PodViewStatus,
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct PodViewMeta {
    namespace: String,
    name: String,
    uid: String,
    resource_version: String,
    deletion_timestamp: Option<String>,
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct PodViewSpec {
    node_name: String,
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
struct PodViewStatus {
    phase: String,
}

/// Records a pod seen bound to a hollow node and says what to do with it.
fn observe(
    pod: &PodView,
    nodes: &HashSet<String>,
    bindings: &Mutex<Bindings>,
    deleting: &mut HashSet<String>,
) -> Option<PodWork> {
    let seen = Instant::now();
    let meta = &pod.metadata;
    if !nodes.contains(&pod.spec.node_name) {
        return None;
    }
    let (namespace, name) = (meta.namespace.clone(), meta.name.clone());
    if meta.deletion_timestamp.is_some() {
        let uid = meta.uid.clone();
        return deleting.insert(uid.clone()).then_some(PodWork::Delete { namespace, name, uid });
    }
    let new = bindings.lock().map(|mut b| b.record(&namespace, &name, seen)).unwrap_or(false);
    let running = pod.status.phase == "Running";
    (new && !running).then_some(PodWork::Run { namespace, name })
}

async fn write_pods(
    client: Client,
    mut work: mpsc::Receiver<PodWork>,
    writers: usize,
    mark_running: bool,
    stats: Arc<PodStats>,
    stop: Arc<AtomicBool>,
) {
    let inflight = Arc::new(Semaphore::new(writers));
    while let Some(item) = work.recv().await {
        if !mark_running && matches!(item, PodWork::Run { .. }) {
            continue;
        }
        let Ok(permit) = inflight.clone().acquire_owned().await else { return };
        let (client, stats, stop) = (client.clone(), stats.clone(), stop.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let result = match &item {
                PodWork::Run { namespace, name } => run_pod(&client, namespace, name).await.map(|()| &stats.running),
                PodWork::Delete { namespace, name, uid } => {
                    delete_pod(&client, namespace, name, uid).await.map(|()| &stats.deleted)
                }
            };
            match result {
                Ok(counter) => {
                    counter.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    stats.errors.fetch_add(1, Ordering::Relaxed);
                    if !stop.load(Ordering::Relaxed) && stats.errors.load(Ordering::Relaxed) <= 10 {
                        eprintln!("skiff-bench: hollow kubelet on {item:?}: {e:#}");
                    }
                }
            }
        });
    }
}

/// The status a kubelet writes once the pod's containers run.
pub fn running_status(name: &str) -> Value {
    let now = now();
    let condition = |kind: &str| json!({"type": kind, "status": "True", "lastTransitionTime": now});
    let n = name.bytes().fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(b as u32));
    let ip = format!("10.244.{}.{}", (n >> 8) % 250, n % 250 + 2);
    json!({"status": {
        "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "startTime": now,
        "conditions": [condition("PodScheduled"), condition("Initialized"), condition("ContainersReady"),
                       condition("Ready")],
        "containerStatuses": [{"name": "c", "image": "registry.k8s.io/pause:3.9", "ready": true, "started": true,
            "restartCount": 0, "state": {"running": {"startedAt": now}}}],
    }})
}

async fn run_pod(client: &Client, namespace: &str, name: &str) -> Result<()> {
    match timed(client.patch_raw(info(Kind::Pod), namespace, name, "merge", &running_status(name), "status")).await {
        Ok(_) => Ok(()),
        // Deleted meanwhile (a workload's cleanup, a preemption).
        Err(e) if e.downcast_ref::<ClientError>().is_some_and(|e| e.is(Reason::NotFound)) => Ok(()),
        Err(e) => Err(e),
    }
}

async fn delete_pod(client: &Client, namespace: &str, name: &str, uid: &str) -> Result<()> {
    let params = DeleteParams { grace_period_seconds: Some(0), ..Default::default() }.with_uid(uid);
    match timed(client.delete(info(Kind::Pod), namespace, name, &params)).await {
        Ok(_) => Ok(()),
        Err(e) if e.downcast_ref::<ClientError>().is_some_and(|e| e.is(Reason::NotFound)) => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{Cluster, ClusterSpec, EtcdTiming, System};

    /// Polls `check` every 50 ms for up to 30 s.
    async fn eventually<F, Fut>(what: &str, mut check: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !check().await {
            assert!(Instant::now() < deadline, "{what} within 30 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Real processes: `SKIFF_BIN=/path/to/skiff cargo test --release -- --ignored`.
    #[tokio::test(flavor = "multi_thread")]
    #[ignore = "needs a skiff binary in SKIFF_BIN"]
    async fn hollow_nodes_renew_leases_run_bound_pods_and_finish_terminating_ones() {
        let binary = std::env::var("SKIFF_BIN").expect("SKIFF_BIN names the skiff binary");
        let dir = tempfile::tempdir().unwrap();
        let spec = ClusterSpec {
            system: System::Skiff,
            binary: binary.into(),
            members: 3,
            dir: dir.path().to_path_buf(),
            etcd_timing: EtcdTiming { heartbeat_ms: 40, election_timeout_ms: 200 },
            extra_args: Vec::new(),
            skiff_subcommand: "apiserver",
        };
        let cluster = Cluster::launch(spec).await.unwrap();
        let endpoints = cluster.endpoints();
        let config = HollowConfig {
            nodes: 3,
            zones: 2,
            lease_interval: Duration::from_millis(300),
            status_writers: 4,
            mark_running: true,
        };
        let hollow = Hollow::start(&endpoints, &config).await.unwrap();
        let client = Client::new(&endpoints).unwrap();
        let node = client.get(info(Kind::Node), "", &node_name(2)).await.unwrap();
        assert_eq!(node["metadata"]["labels"][ZONE_LABEL], "zone-0");
        assert_eq!(node["status"]["allocatable"]["cpu"], "4000m");

        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "m-0"},
                         "spec": {"containers": [{"name": "c", "image": "pause"}]}});
        client.create(info(Kind::Pod), "default", &pod).await.unwrap();
        client.bind("default", "m-0", &node_name(1)).await.unwrap();
        eventually("the binding seen", || async { hollow.bound("default", "m") == 1 }).await;
        eventually("the pod Running", || async {
            let pod = client.get(info(Kind::Pod), "default", "m-0").await.unwrap();
            pod["status"]["phase"] == "Running"
        })
        .await;

        // A bound pod's delete waits for its kubelet: the hollow node finishes it.
        let deleted = client.delete(info(Kind::Pod), "default", "m-0", &DeleteParams::default()).await.unwrap();
        assert!(!deleted["metadata"]["deletionTimestamp"].is_null(), "a graceful deletion: {deleted}");
        eventually("the pod gone", || async {
            client.get(info(Kind::Pod), "default", "m-0").await.is_err_and(|e| e.is(Reason::NotFound))
        })
        .await;
        assert_eq!(hollow.pods.deleted.load(Ordering::Relaxed), 1);

        eventually("every Lease renewed", || async { hollow.lease_counts().0 >= 6 }).await;
        let lease = client.get(info(Kind::Lease), LEASE_NAMESPACE, &node_name(0)).await.unwrap();
        assert_eq!(lease["spec"]["holderIdentity"], node_name(0));
        assert_eq!(hollow.lease_counts().1, 0, "no renewal failed");
    }

    #[test]
    fn nodes_carry_hostname_and_zone_labels_spread_round_robin() {
        let n = node(13, 10);
        assert_eq!(n["metadata"]["name"], "hollow-00013");
        assert_eq!(n["metadata"]["labels"][HOSTNAME_LABEL], "hollow-00013");
        assert_eq!(n["metadata"]["labels"][ZONE_LABEL], "zone-3");
        let status = node_status(13);
        assert_eq!(status["status"]["allocatable"]["cpu"], "4000m");
        assert_eq!(status["status"]["allocatable"]["pods"], "110");
        assert_eq!(status["status"]["conditions"][0]["type"], "Ready");
        assert_eq!(status["status"]["conditions"][0]["status"], "True");
    }

    #[test]
    fn renewals_are_spread_evenly_over_the_interval() {
        let start = Instant::now();
        let interval = Duration::from_secs(10);
        assert_eq!(renewal_due(start, 0, 5000, interval), start);
        assert_eq!(renewal_due(start, 1, 5000, interval) - start, Duration::from_millis(2));
        assert_eq!(renewal_due(start, 5000, 5000, interval) - start, interval);
        assert_eq!(renewal_due(start, 7500, 5000, interval) - start, Duration::from_secs(15));
    }

    #[test]
    fn a_binding_is_recorded_once_and_counted_by_group() {
        let mut b = Bindings::default();
        let t = Instant::now();
        assert!(b.record("ns", "m-1", t));
        assert!(!b.record("ns", "m-1", t + Duration::from_secs(1)));
        assert!(b.record("ns", "m-2", t));
        assert!(b.record("ns", "init-1", t));
        assert!(b.record("other", "m-1", t));
        assert_eq!(b.count("ns", "m"), 2);
        assert_eq!(b.count("ns", "init"), 1);
        assert_eq!(b.times("ns", "m").get("m-1"), Some(&t));
        b.forget("ns");
        assert_eq!(b.count("ns", "m"), 0);
        assert_eq!(b.count("other", "m"), 1);
    }

    #[test]
    fn a_pod_bound_to_a_hollow_node_is_run_once_and_a_terminating_one_deleted_once() {
        let nodes: HashSet<String> = [node_name(0)].into();
        let bindings = Mutex::new(Bindings::default());
        let mut deleting = HashSet::new();
        let view = |pod: &Value| -> PodView { serde_json::from_slice(&serde_json::to_vec(pod).unwrap()).unwrap() };
        let pod = json!({"metadata": {"namespace": "ns", "name": "m-0", "uid": "u", "resourceVersion": "5"},
                         "spec": {"nodeName": node_name(0), "containers": [{"name": "c"}]}, "status": {}});
        assert_eq!(view(&pod).metadata.resource_version, "5");
        assert!(matches!(observe(&view(&pod), &nodes, &bindings, &mut deleting), Some(PodWork::Run { .. })));
        assert!(observe(&view(&pod), &nodes, &bindings, &mut deleting).is_none());
        let elsewhere = json!({"metadata": {"namespace": "ns", "name": "m-1"}, "spec": {"nodeName": "real-node"}});
        assert!(observe(&view(&elsewhere), &nodes, &bindings, &mut deleting).is_none());
        let mut terminating = pod.clone();
        terminating["metadata"]["deletionTimestamp"] = json!("2026-12-02T00:00:00Z");
        assert!(matches!(observe(&view(&terminating), &nodes, &bindings, &mut deleting), Some(PodWork::Delete { .. })));
        assert!(observe(&view(&terminating), &nodes, &bindings, &mut deleting).is_none());
        let running = json!({"metadata": {"namespace": "ns", "name": "m-2"}, "spec": {"nodeName": node_name(0)},
                             "status": {"phase": "Running"}});
        assert!(observe(&view(&running), &nodes, &bindings, &mut deleting).is_none(), "already running");
        assert_eq!(bindings.lock().unwrap().count("ns", "m"), 2, "seen bound all the same");
    }
}
