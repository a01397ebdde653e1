//! The pod workers: one task per pod turning its desired spec into
//! sandboxes and containers through the [`Runtime`], and reporting what
//! the runtime shows as the pod's status and events.
//!
//! Data flows: the agent calls [`PodWorkers::update`] / [`remove`](PodWorkers::remove)
//! with the pods its sources give; each pod's worker keeps only the
//! newest version in a one-slot mailbox (a bounded wake channel of one, so
//! a burst of updates never queues, the worker sees the last), syncs every
//! `sync_period` and whenever woken, and sends [`WorkerOutput`]s (status
//! when it changed, events, terminated) on the agent's bounded channel.
//!
//! # Layout
//! - [`spec`]: Pod → sandbox and container specs (env, DNS, limits).
//! - [`volumes`]: volumes materialized under the pod's directory; mounts.
//! - [`backoff`]: CrashLoopBackOff and ImagePullBackOff delays.
//! - [`probe`]: probe and hook handlers; probe thresholds.
//! - [`plan`]: one sync's decisions, a pure function (computePodActions).
//! - [`worker`]: one pod's task: `State` + `step`, the executor of the
//!   plan, probes, status reports, termination.
//! - [`status`]: PodStatus from what the runtime reports.

pub mod backoff;
pub mod plan;
pub mod probe;
pub mod security;
pub mod spec;
pub mod status;
pub mod volumes;
pub mod worker;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Pod, PodStatus, Secret, ServiceAccountTokenProjection};
use skiff_client::runtime::reflector::ObjectKey;
use skiff_shutdown::Shutdown;
use tokio::sync::mpsc;

use crate::runtime::{DnsConfig, LabelFilter, Runtime, RuntimeError, LABEL_NODE, LABEL_POD_UID};

/// What the workers need to know about the node.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// This node's name (labels every sandbox and container).
    pub node_name: String,
    /// Where container logs go: `<pod_log_dir>/<ns>_<name>_<uid>/<container>/<n>.log`.
    pub pod_log_dir: PathBuf,
    /// Per-pod directories: `<pods_dir>/<uid>/volumes/...`.
    pub pods_dir: PathBuf,
    /// Where `seccompProfile.type: Localhost` profiles are found (the
    /// kubelet's `<root-dir>/seccomp`).
    pub seccomp_dir: PathBuf,
    /// Sysctls allowed beyond the safe ones: names, or prefixes ending in
    /// `*` (`--allowed-unsafe-sysctls`).
    pub allowed_unsafe_sysctls: Vec<String>,
    /// The node's IP (status.hostIP, hostNetwork pods' IP).
    pub host_ip: String,
    /// Cluster DNS servers for dnsPolicy ClusterFirst.
    pub cluster_dns: Vec<String>,
    /// The cluster's domain, e.g. "cluster.local".
    pub cluster_domain: String,
    /// The host's resolv.conf, for dnsPolicy Default (and ClusterFirst
    /// without cluster DNS).
    pub host_dns: DnsConfig,
    /// The cgroup under which pod cgroups go, e.g. "/kubepods".
    pub cgroup_root: String,
    /// Allocatable CPU, the default of a `limits.cpu` resourceFieldRef.
    pub node_cpu_cores: f64,
    /// Allocatable memory, the default of a `limits.memory` resourceFieldRef.
    pub node_memory_bytes: u64,
    /// Allocatable ephemeral storage.
    pub node_ephemeral_storage_bytes: u64,
    /// Mount a tmpfs for emptyDir `medium: Memory` (needs root); else a
    /// plain directory.
    pub memory_medium_tmpfs: bool,
    /// How often a worker looks at the runtime without being woken (the
    /// kubelet's PLEG relists every second).
    pub sync_period: Duration,
    /// First CrashLoopBackOff / ImagePullBackOff delay.
    pub backoff_initial: Duration,
    /// Largest back-off delay.
    pub backoff_max: Duration,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            node_name: "node".to_string(),
            pod_log_dir: PathBuf::from("/var/log/pods"),
            pods_dir: PathBuf::from("/var/lib/skiff/pods"),
            seccomp_dir: PathBuf::from("/var/lib/skiff/seccomp"),
            allowed_unsafe_sysctls: Vec::new(),
            host_ip: "127.0.0.1".to_string(),
            cluster_dns: Vec::new(),
            cluster_domain: "cluster.local".to_string(),
            host_dns: DnsConfig::default(),
            cgroup_root: "/kubepods".to_string(),
            node_cpu_cores: 1.0,
            node_memory_bytes: 1 << 30,
            node_ephemeral_storage_bytes: 10 << 30,
            memory_medium_tmpfs: false,
            sync_period: Duration::from_secs(1),
            backoff_initial: Duration::from_secs(10),
            backoff_max: Duration::from_secs(300),
        }
    }
}

/// Parses resolv.conf text (nameserver, search, options lines).
pub fn parse_resolv_conf(text: &str) -> DnsConfig {
    let mut dns = DnsConfig::default();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("nameserver") => dns.servers.extend(words.next().map(str::to_string)),
            Some("search") | Some("domain") => dns.searches.extend(words.map(str::to_string)),
            Some("options") => dns.options.extend(words.map(str::to_string)),
            _ => {}
        }
    }
    dns
}

/// What the workers look up through the agent: ConfigMaps and Secrets of
/// the pod's namespace, its service account tokens, and the Service
/// variables (`<NAME>_SERVICE_HOST`, `_PORT`...) for it. The getters answer
/// from what [`prepare`](PodResources::prepare) fetched last.
#[async_trait::async_trait]
pub trait PodResources: Send + Sync + 'static {
    /// The ConfigMap, if it exists.
    fn config_map(&self, namespace: &str, name: &str) -> Option<ConfigMap>;
    /// The Secret, if it exists.
    fn secret(&self, namespace: &str, name: &str) -> Option<Secret>;
    /// The Service environment variables for pods of `namespace`.
    fn service_env(&self, namespace: &str) -> Vec<(String, String)>;
    /// Fetches what `pod` references, before its volumes and containers
    /// are made; nothing to fetch by default.
    async fn prepare(&self, _pod: &Pod) {}
    /// The token for one serviceAccountToken source of `pod`'s projected
    /// volumes, if one was issued and is still valid.
    fn service_account_token(&self, _pod: &Pod, _source: &ServiceAccountTokenProjection) -> Option<String> {
        None
    }
    /// `pod` is gone: what was fetched for it alone may go.
    fn forget(&self, _pod: &Pod) {}
}

/// No ConfigMaps, Secrets or Services.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoResources;

impl PodResources for NoResources {
    fn config_map(&self, _: &str, _: &str) -> Option<ConfigMap> {
        None
    }
    fn secret(&self, _: &str, _: &str) -> Option<Secret> {
        None
    }
    fn service_env(&self, _: &str) -> Vec<(String, String)> {
        Vec::new()
    }
}

/// What the workers tell the agent.
// The status is carried inline, as the agent's interface asks; a few
// outputs per pod per change do not make the size matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum WorkerOutput {
    /// The pod's status changed; write it through `pods/status`.
    Status {
        /// The pod.
        key: ObjectKey,
        /// Its uid (a precondition for the write).
        uid: String,
        /// The new status.
        status: PodStatus,
    },
    /// Record an event about the pod.
    Event {
        /// The pod.
        key: ObjectKey,
        /// Its uid.
        uid: String,
        /// "Normal" or "Warning".
        type_: String,
        /// e.g. "Pulled", "BackOff".
        reason: String,
        /// The human message.
        message: String,
    },
    /// Everything of the pod is removed from the runtime and the disk; the
    /// agent may delete the pod object.
    Terminated {
        /// The pod.
        key: ObjectKey,
        /// Its uid.
        uid: String,
    },
}

/// The newest desired state of one pod, waiting for its worker.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    pub(crate) pod: Option<Arc<Pod>>,
    pub(crate) removed: bool,
}

struct Handle {
    slot: Arc<Mutex<Pending>>,
    /// Capacity one: a full channel means a wake is already pending.
    wake: mpsc::Sender<()>,
}

/// How many finished uids are remembered, so a late update for a pod
/// already torn down does not start it again.
const FINISHED_MEMORY: usize = 10_000;

/// A pod's container ids by container name.
type ContainerIds = BTreeMap<String, String>;

pub(crate) struct Shared {
    pub(crate) runtime: Arc<dyn Runtime>,
    pub(crate) config: Arc<WorkerConfig>,
    pub(crate) resources: Arc<dyn PodResources>,
    pub(crate) out: mpsc::Sender<WorkerOutput>,
    pub(crate) shutdown: Shutdown,
    workers: Mutex<HashMap<String, Handle>>,
    finished: Mutex<(HashSet<String>, VecDeque<String>)>,
    /// Container ids by pod and container name, for logs and exec, and
    /// the pod's address, for port-forwarding.
    ids: Mutex<HashMap<ObjectKey, (ContainerIds, String)>>,
    adopted: Mutex<HashSet<String>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Shared {
    pub(crate) fn set_ids(&self, key: &ObjectKey, ids: ContainerIds, ip: String) {
        lock(&self.ids).insert(key.clone(), (ids, ip));
    }

    /// A worker ended: forget it (and, if it tore the pod down, remember
    /// its uid as finished).
    pub(crate) fn finish(&self, uid: &str, key: &ObjectKey, torn_down: bool) {
        lock(&self.workers).remove(uid);
        lock(&self.ids).remove(key);
        if torn_down {
            let mut finished = lock(&self.finished);
            if finished.0.insert(uid.to_string()) {
                finished.1.push_back(uid.to_string());
            }
            while finished.1.len() > FINISHED_MEMORY {
                if let Some(old) = finished.1.pop_front() {
                    finished.0.remove(&old);
                }
            }
        }
    }
}

/// Every pod's worker on this node.
#[derive(Clone)]
pub struct PodWorkers {
    shared: Arc<Shared>,
}

impl PodWorkers {
    /// Workers that run pods on `runtime` and report on `out`; they stop
    /// (leaving containers running, for the next agent to adopt) when
    /// `shutdown` is cancelled.
    pub fn new(
        runtime: Arc<dyn Runtime>,
        config: WorkerConfig,
        resources: Arc<dyn PodResources>,
        out: mpsc::Sender<WorkerOutput>,
        shutdown: Shutdown,
    ) -> PodWorkers {
        PodWorkers {
            shared: Arc::new(Shared {
                runtime,
                config: Arc::new(config),
                resources,
                out,
                shutdown,
                workers: Mutex::new(HashMap::new()),
                finished: Mutex::new((HashSet::new(), VecDeque::new())),
                ids: Mutex::new(HashMap::new()),
                adopted: Mutex::new(HashSet::new()),
            }),
        }
    }

    fn node_filter(&self) -> LabelFilter {
        LabelFilter(BTreeMap::from([(LABEL_NODE.to_string(), self.shared.config.node_name.clone())]))
    }

    /// At start: lists the sandboxes and containers labelled with this
    /// node and returns the uids of the pods they belong to. A pod given
    /// later with one of these uids takes its sandbox and containers over
    /// as they are (running ones keep running); call
    /// [`forget_unknown`](Self::forget_unknown) (or [`sync_all`](Self::sync_all))
    /// after the first full list of pods to remove the rest.
    pub async fn adopt(&self) -> Result<Vec<String>, RuntimeError> {
        let filter = self.node_filter();
        let sandboxes = self.shared.runtime.list_sandboxes(&filter).await?;
        let containers = self.shared.runtime.list_containers(&filter).await?;
        let uids: HashSet<String> = sandboxes
            .iter()
            .map(|s| &s.labels)
            .chain(containers.iter().map(|c| &c.labels))
            .filter_map(|l| l.get(LABEL_POD_UID).cloned())
            .collect();
        lock(&self.shared.adopted).extend(uids.iter().cloned());
        let mut uids: Vec<String> = uids.into_iter().collect();
        uids.sort();
        Ok(uids)
    }

    /// Removes every sandbox and container labelled with this node whose
    /// pod has no worker (orphans of pods deleted while the agent was
    /// down); returns their pods' uids.
    pub async fn forget_unknown(&self) -> Result<Vec<String>, RuntimeError> {
        let filter = self.node_filter();
        let runtime = &self.shared.runtime;
        let known: HashSet<String> = lock(&self.shared.workers).keys().cloned().collect();
        let orphan =
            |labels: &BTreeMap<String, String>| labels.get(LABEL_POD_UID).filter(|uid| !known.contains(*uid)).cloned();
        let mut removed = HashSet::new();
        for c in runtime.list_containers(&filter).await? {
            if let Some(uid) = orphan(&c.labels) {
                runtime.stop_container(&c.id, Duration::from_secs(2)).await?;
                runtime.remove_container(&c.id).await?;
                removed.insert(uid);
            }
        }
        for s in runtime.list_sandboxes(&filter).await? {
            if let Some(uid) = orphan(&s.labels) {
                runtime.stop_sandbox(&s.id).await?;
                runtime.remove_sandbox(&s.id).await?;
                removed.insert(uid);
            }
        }
        let mut adopted = lock(&self.shared.adopted);
        for uid in &removed {
            adopted.remove(uid);
            let _ = std::fs::remove_dir_all(self.shared.config.pods_dir.join(uid));
        }
        let mut removed: Vec<String> = removed.into_iter().collect();
        removed.sort();
        Ok(removed)
    }

    /// The full list of desired pods: updates each, terminates the
    /// workers of pods not in it, and removes orphans.
    pub async fn sync_all(&self, pods: Vec<Arc<Pod>>) -> Result<Vec<String>, RuntimeError> {
        let wanted: HashSet<String> = pods.iter().filter_map(|p| p.metadata.uid.clone()).collect();
        for pod in pods {
            self.update(pod);
        }
        let gone: Vec<String> =
            lock(&self.shared.workers).keys().filter(|uid| !wanted.contains(*uid)).cloned().collect();
        for uid in gone {
            self.remove(&uid);
        }
        self.forget_unknown().await
    }

    /// A new or changed desired pod. A pod with a deletionTimestamp is
    /// terminated with its deletion grace period.
    pub fn update(&self, pod: Arc<Pod>) {
        let Some(uid) = pod.metadata.uid.clone().filter(|u| !u.is_empty()) else {
            tracing::warn!(pod = ?pod.metadata.name, "pod without uid ignored");
            return;
        };
        if lock(&self.shared.finished).0.contains(&uid) {
            return;
        }
        let mut workers = lock(&self.shared.workers);
        let handle = workers.entry(uid.clone()).or_insert_with(|| {
            let (wake, rx) = mpsc::channel(1);
            let slot = Arc::new(Mutex::new(Pending::default()));
            let worker = worker::Worker::new(self.shared.clone(), pod.clone(), slot.clone(), rx);
            self.shared.shutdown.spawn(worker.run());
            Handle { slot, wake }
        });
        lock(&handle.slot).pod = Some(pod);
        // Full: a wake is already pending and the worker will read the
        // slot. Closed: the worker ended; nothing to do.
        let _ = handle.wake.try_send(());
    }

    /// The pod is gone from every source: terminate it now, with its
    /// deletion grace period if it had one, else its spec's.
    pub fn remove(&self, uid: &str) {
        let workers = lock(&self.shared.workers);
        if let Some(handle) = workers.get(uid) {
            lock(&handle.slot).removed = true;
            let _ = handle.wake.try_send(());
        }
    }

    /// The runtime's id of the newest container `container` of the pod.
    pub fn container_id(&self, namespace: &str, name: &str, container: &str) -> Option<String> {
        lock(&self.shared.ids).get(&ObjectKey::new(namespace, name)).and_then(|(ids, _)| ids.get(container)).cloned()
    }

    /// The pod's address (the node's for a host-network pod), once its
    /// sandbox has one.
    pub fn pod_ip(&self, namespace: &str, name: &str) -> Option<String> {
        lock(&self.shared.ids)
            .get(&ObjectKey::new(namespace, name))
            .map(|(_, ip)| ip.clone())
            .filter(|ip| !ip.is_empty())
    }

    /// How many pods have a worker.
    pub fn len(&self) -> usize {
        lock(&self.shared.workers).len()
    }

    /// Whether no pod has a worker.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
