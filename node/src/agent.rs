//! `run(config, runtime, network, shutdown)`: the node agent process.
//!
//! It registers the Node and keeps its two heartbeats (`heartbeat`),
//! serves its HTTP API (`server`), and runs one loop that takes the pods
//! of this node from their sources (a watch of pods with `spec.nodeName`
//! = this node, and the static manifests) into the pod workers, and
//! what the workers report back to the apiserver: pod statuses (latest
//! wins, written off the loop), Events, and the final deletion of a pod
//! whose containers are gone. Static pods are mirrored.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod, PodStatus, Service};
use serde_json::json;
use skiff_api::Reason;
use skiff_client::resources::DeleteParams;
use skiff_client::runtime::api::Api;
use skiff_client::runtime::events::Recorder;
use skiff_client::runtime::informer::{Informers, Notification};
use skiff_client::runtime::reflector::{Change, ObjectKey};
use skiff_client::runtime::watcher::WatcherConfig;
use skiff_client::{Client, ClientConfig, ClientError};
use skiff_shutdown::Shutdown;
use tokio::sync::{mpsc, watch, Notify};

use crate::cni;
use crate::config::NodeConfig;
use crate::dns;
use crate::heartbeat;
use crate::host;
use crate::metrics::metrics;
use crate::pod::{PodWorkers, WorkerConfig, WorkerOutput};
use crate::pod_objects::PodObjects;
use crate::proxy;
use crate::routes;
use crate::runtime::Runtime;
use crate::server::{self, PodLookup};
use crate::static_pods::{self, ManifestDir};
use crate::stats;

/// Outputs of the workers buffered for the loop.
const OUTPUT_BUFFER: usize = 4096;
/// Status writes in flight at once.
const STATUS_WRITERS: usize = 4;
/// How often the manifest directory is checked for a change.
const MANIFEST_POLL: Duration = Duration::from_secs(1);

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The apiserver client could not be set up.
    #[error("apiserver client: {0}")]
    Client(#[from] ClientError),
    /// The Node could not be registered.
    #[error("registering node {node}: {source}")]
    Register {
        /// The node.
        node: String,
        /// Why.
        source: ClientError,
    },
    /// The HTTP listener could not bind.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// What sets up the pods' network once the node's pod CIDR is known
/// (the CNI configuration); a no-op for tests on the fake runtime.
pub trait NodeNetwork: Send + Sync + 'static {
    /// Configures the node's pod network for `pod_cidr`; called again
    /// only if the CIDR changes.
    fn configure(&self, pod_cidr: &str) -> Result<(), String>;

    /// Whether the agent keeps routes to the pod CIDRs of nodes on other
    /// hosts ([`crate::routes`]).
    fn routes_to_other_hosts(&self) -> bool {
        false
    }
}

/// No network to set up.
pub struct NoNetwork;

impl NodeNetwork for NoNetwork {
    fn configure(&self, _pod_cidr: &str) -> Result<(), String> {
        Ok(())
    }
}

/// The `<NAME>_SERVICE_HOST`/`_PORT` variables kube gives every container
/// for the Services of its namespace (and `kubernetes` in `default`).
pub fn service_env(services: &[Arc<Service>], namespace: &str) -> Vec<(String, String)> {
    let mut env = Vec::new();
    for svc in services {
        let ns = svc.metadata.namespace.as_deref().unwrap_or("");
        let name = svc.metadata.name.as_deref().unwrap_or("");
        let master = ns == "default" && name == "kubernetes";
        if ns != namespace && !master {
            continue;
        }
        let Some(spec) = svc.spec.as_ref() else { continue };
        let Some(ip) = spec.cluster_ip.as_deref().filter(|ip| !ip.is_empty() && *ip != "None") else { continue };
        let prefix = name.to_uppercase().replace('-', "_");
        let ports = spec.ports.as_deref().unwrap_or_default();
        let Some(first) = ports.first() else { continue };
        env.push((format!("{prefix}_SERVICE_HOST"), ip.to_string()));
        env.push((format!("{prefix}_SERVICE_PORT"), first.port.to_string()));
        for p in ports {
            if let Some(port_name) = p.name.as_deref().filter(|n| !n.is_empty()) {
                env.push((
                    format!("{prefix}_SERVICE_PORT_{}", port_name.to_uppercase().replace('-', "_")),
                    p.port.to_string(),
                ));
            }
        }
        let proto = first.protocol.as_deref().unwrap_or("TCP");
        env.push((format!("{prefix}_PORT"), format!("{}://{ip}:{}", proto.to_lowercase(), first.port)));
        for p in ports {
            let proto = p.protocol.as_deref().unwrap_or("TCP");
            let base = format!("{prefix}_PORT_{}_{}", p.port, proto.to_uppercase());
            env.push((base.clone(), format!("{}://{ip}:{}", proto.to_lowercase(), p.port)));
            env.push((format!("{base}_PROTO"), proto.to_lowercase()));
            env.push((format!("{base}_PORT"), p.port.to_string()));
            env.push((format!("{base}_ADDR"), ip.to_string()));
        }
    }
    env
}

/// The workers' container ids, for the HTTP API.
struct WorkersLookup(PodWorkers);

impl PodLookup for WorkersLookup {
    fn container_id(&self, namespace: &str, pod: &str, container: &str) -> Option<String> {
        self.0.container_id(namespace, pod, container)
    }

    fn pod_ip(&self, namespace: &str, pod: &str) -> Option<String> {
        self.0.pod_ip(namespace, pod)
    }
}

/// Latest status per pod, written by a few writer tasks: a pod whose
/// status changes ten times while a write is in flight is written once more.
/// A pod has at most one write in flight, so an older status can never land
/// after a newer one (the worker sends a status only when it changes: one
/// overwritten by an older one would stay wrong until the pod changes again).
#[derive(Default)]
struct StatusQueue {
    pending: Mutex<Pending>,
    ready: Notify,
}

/// The statuses waiting to be written, oldest pod first, and the pods
/// being written.
#[derive(Default)]
struct Pending {
    latest: HashMap<ObjectKey, (String, PodStatus)>,
    /// Pods with a status waiting and no write in flight.
    order: VecDeque<ObjectKey>,
    writing: HashSet<ObjectKey>,
}

impl StatusQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, key: ObjectKey, uid: String, status: PodStatus) {
        let mut pending = self.lock();
        let waiting = pending.latest.insert(key.clone(), (uid, status)).is_some();
        // A pod being written is queued again when its write ends.
        if !waiting && !pending.writing.contains(&key) {
            pending.order.push_back(key);
        }
        drop(pending);
        self.ready.notify_one();
    }

    /// The next status to write; its pod counts as being written until
    /// [`StatusQueue::written`].
    fn pop(&self) -> Option<(ObjectKey, String, PodStatus)> {
        let mut pending = self.lock();
        while let Some(key) = pending.order.pop_front() {
            if let Some((uid, status)) = pending.latest.remove(&key) {
                pending.writing.insert(key.clone());
                return Some((key, uid, status));
            }
        }
        None
    }

    /// Ends the write of `key`'s status. A failed one (`retry`) is written
    /// again unless a newer status came meanwhile.
    fn written(&self, key: ObjectKey, retry: Option<(String, PodStatus)>) {
        let mut pending = self.lock();
        pending.writing.remove(&key);
        if let Some(failed) = retry {
            pending.latest.entry(key.clone()).or_insert(failed);
        }
        // A pod being written is never in `order`: push left it out.
        if pending.latest.contains_key(&key) {
            pending.order.push_back(key);
            drop(pending);
            self.ready.notify_one();
        }
    }
}

/// Runs the agent until `shutdown`.
pub async fn run(
    config: NodeConfig,
    runtime: Arc<dyn Runtime>,
    network: Arc<dyn NodeNetwork>,
    shutdown: Shutdown,
) -> Result<(), RunError> {
    let config = Arc::new(config);
    let mut client_config = ClientConfig::new(&config.servers);
    client_config.tls = config.tls.clone();
    client_config.token = config.token.clone();
    let client = Client::from_config(&client_config)?;
    let info = host::info();
    let node = heartbeat::register(&client, &config, &info)
        .await
        .map_err(|source| RunError::Register { node: config.name.clone(), source })?;
    let node_uid = node.metadata.uid.clone().unwrap_or_default();
    let (posted_tx, mut posted) = watch::channel::<Option<Node>>(Some(node));
    shutdown.spawn(heartbeat::lease_loop(client.clone(), config.clone(), node_uid, shutdown.clone()));
    shutdown.spawn(heartbeat::status_loop(
        client.clone(),
        config.clone(),
        runtime.clone(),
        posted_tx,
        shutdown.clone(),
    ));

    let informers = Informers::new(client.clone(), shutdown.clone());
    if network.routes_to_other_hosts() {
        shutdown.spawn(routes::run(informers.informer::<Node>(), shutdown.clone()));
    }
    if let Some(proxy_config) = config.proxy.clone() {
        let (informers, client, stop) = (informers.clone(), client.clone(), shutdown.clone());
        shutdown.spawn(async move { proxy::run(&informers, client, proxy_config, stop).await });
    }
    let cluster_dns = cluster_dns(&config, &informers, &mut posted, &shutdown).await;
    let pods = informers.informer_with::<Pod>(WatcherConfig {
        field_selector: format!("spec.nodeName={}", config.name),
        ..WatcherConfig::default()
    });
    // Secrets and ConfigMaps are read one by one: a node may list neither.
    let lookups = Arc::new(PodObjects::new(client.clone(), informers.informer::<Service>().store()));
    let mut changes = pods.subscribe();
    let pod_store = pods.store();

    let (out_tx, mut outputs) = mpsc::channel(OUTPUT_BUFFER);
    let worker_config = worker_config(&config, cluster_dns);
    let workers = PodWorkers::new(runtime.clone(), worker_config, lookups, out_tx, shutdown.clone());
    if let Err(e) = workers.adopt().await {
        tracing::warn!(error = %e, "listing the runtime's containers at start failed; nothing adopted");
    }
    let api = server::Api {
        node: config.name.clone(),
        runtime: runtime.clone(),
        pods: Arc::new(WorkersLookup(workers.clone())),
        data_dir: config.data_dir.clone(),
        registry: metrics().registry.clone(),
        usage: stats::spawn_sampler(&config.name, runtime.clone(), config.housekeeping_interval, &shutdown),
    };
    let bound = server::serve(config.listen, api, shutdown.clone())
        .await
        .map_err(|source| RunError::Listen { addr: config.listen, source })?;
    tracing::info!(node = %config.name, %bound, "node agent serving");

    let statuses = Arc::new(StatusQueue::default());
    for _ in 0..STATUS_WRITERS {
        shutdown.spawn(write_statuses(client.clone(), statuses.clone(), shutdown.clone()));
    }
    let recorder = Arc::new(Recorder::new("kubelet"));
    let mut network_cidr: Option<String> = None;
    configure_network(&config, posted.borrow().as_ref(), network.as_ref(), &mut network_cidr);

    let mut manifests = config.manifest_dir.as_deref().map(ManifestDir::new);
    let mut statics: BTreeMap<String, Arc<Pod>> = BTreeMap::new();
    let mut url_pods: Option<Vec<Pod>> = None;
    let mut static_statuses: HashMap<String, (ObjectKey, PodStatus)> = HashMap::new();
    let mut last_full_read = tokio::time::Instant::now() - static_pods::RESYNC;
    let mut manifest_tick = tokio::time::interval(MANIFEST_POLL);
    let mut synced = false;
    let ready = pod_store.clone();
    let mut informer_ready = std::pin::pin!(async move { ready.wait_until_ready().await });
    let mut informer_is_ready = false;

    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            r = &mut informer_ready, if !informer_is_ready => {
                informer_is_ready = true;
                if r.is_err() { break; }
                for pod in pod_store.list() {
                    if !static_pods::is_mirror(&pod) {
                        workers.update(pod);
                    }
                }
            }
            changed = posted.changed() => {
                if changed.is_err() { break; }
                let node = posted.borrow_and_update().clone();
                configure_network(&config, node.as_ref(), network.as_ref(), &mut network_cidr);
            }
            n = changes.recv() => match n {
                None => break,
                Some(Notification::Resync) => {
                    for pod in pod_store.list() {
                        if !static_pods::is_mirror(&pod) {
                            workers.update(pod);
                        }
                    }
                }
                Some(Notification::Changed(Change::Applied(pod))) => {
                    if static_pods::is_mirror(&pod) {
                        // Being deleted by a user: the static pod still runs,
                        // so its mirror is replaced at once.
                        let name = pod.metadata.name.clone().unwrap_or_default();
                        if let (Some(s), true) = (statics.get(&name), pod.metadata.deletion_timestamp.is_some()) {
                            if ensure_mirror(&client, s, Some(&pod)).await {
                                repost_status(&statuses, &static_statuses, &name);
                            }
                        }
                        continue;
                    }
                    workers.update(pod);
                }
                Some(Notification::Changed(Change::Deleted(pod))) => {
                    if static_pods::is_mirror(&pod) {
                        let name = pod.metadata.name.clone().unwrap_or_default();
                        if let Some(s) = statics.get(&name) {
                            if ensure_mirror(&client, s, None).await {
                                repost_status(&statuses, &static_statuses, &name);
                            }
                        }
                        continue;
                    }
                    if let Some(uid) = pod.metadata.uid.as_deref() {
                        workers.remove(uid);
                    }
                }
            },
            _ = manifest_tick.tick() => {
                let due = last_full_read.elapsed() >= static_pods::RESYNC;
                let dir_changed = manifests.as_ref().is_some_and(ManifestDir::changed);
                let has_sources = manifests.is_some() || config.manifest_url.is_some();
                if has_sources && (due || dir_changed || !synced) {
                    let mut reading = manifests.as_mut().map(|d| d.read(&config.name)).unwrap_or_default();
                    if let Some(url) = &config.manifest_url {
                        if due || url_pods.is_none() {
                            // A failed read keeps the last good one, as the kubelet does.
                            match static_pods::fetch(url, &config.name).await {
                                Ok(pods) => url_pods = Some(pods),
                                Err(bad) => reading.bad.push(bad),
                            }
                        }
                        reading.pods.extend(url_pods.clone().unwrap_or_default());
                    }
                    if due {
                        last_full_read = tokio::time::Instant::now();
                    }
                    for bad in &reading.bad {
                        tracing::warn!(manifest = %bad.source, reason = %bad.reason, "static pod manifest refused");
                        let regarding = node_ref(&config.name);
                        let message = format!("{}: {}", bad.source, bad.reason);
                        recorder.record(&client, &regarding, "Warning", "FailedStaticPod", &message).await;
                    }
                    let now: BTreeMap<String, Arc<Pod>> = reading
                        .pods
                        .into_iter()
                        .map(|p| (p.metadata.name.clone().unwrap_or_default(), Arc::new(p)))
                        .collect();
                    for (name, old) in &statics {
                        if now.get(name).and_then(|p| p.metadata.uid.clone()) != old.metadata.uid {
                            if let Some(uid) = old.metadata.uid.as_deref() {
                                workers.remove(uid);
                            }
                            if !now.contains_key(name) {
                                delete_mirror(&client, old).await;
                            }
                        }
                    }
                    for pod in now.values() {
                        workers.update(pod.clone());
                        let (ns, name) = (pod.metadata.namespace.as_deref(), pod.metadata.name.as_deref());
                        let mirror = pod_store.get_named(ns.unwrap_or(""), name.unwrap_or(""));
                        if ensure_mirror(&client, pod, mirror.as_deref()).await {
                            repost_status(&statuses, &static_statuses, name.unwrap_or(""));
                        }
                    }
                    statics = now;
                }
                if !synced && informer_is_ready {
                    synced = true;
                    forget_unknown(&workers).await;
                }
                metrics().running_pods.set(workers.len() as i64);
            }
            out = outputs.recv() => match out {
                None => break,
                Some(WorkerOutput::Status { key, uid, status }) => {
                    // A static pod's status goes to its mirror.
                    let uid = if statics.contains_key(&key.name) {
                        // Kept to give a recreated mirror its status at once.
                        static_statuses.insert(key.name.clone(), (key.clone(), status.clone()));
                        String::new()
                    } else {
                        uid
                    };
                    statuses.push(key, uid, status);
                }
                Some(WorkerOutput::Event { key, uid, type_, reason, message }) => {
                    let regarding = json!({
                        "apiVersion": "v1", "kind": "Pod",
                        "metadata": {"namespace": key.namespace, "name": key.name, "uid": uid},
                    });
                    let (client, recorder) = (client.clone(), recorder.clone());
                    shutdown.spawn(async move { recorder.record(&client, &regarding, &type_, &reason, &message).await });
                }
                Some(WorkerOutput::Terminated { key, uid }) => {
                    let deleting = pod_store
                        .get(&key)
                        .filter(|p| p.metadata.uid.as_deref() == Some(uid.as_str()))
                        .is_some_and(|p| p.metadata.deletion_timestamp.is_some());
                    if deleting {
                        let client = client.clone();
                        shutdown.spawn(async move { finish_deletion(&client, &key, &uid).await });
                    }
                }
            },
        }
    }
    tracing::info!(node = %config.name, "node agent stopping; containers keep running");
    Ok(())
}

/// Once every source was read: what runs here that no pod wants goes.
async fn forget_unknown(workers: &PodWorkers) {
    match workers.forget_unknown().await {
        Ok(removed) if !removed.is_empty() => tracing::info!(pods = ?removed, "removed containers no pod wants"),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "listing the runtime's containers to remove orphans"),
    }
}

/// The workers' settings from the agent's and the host's.
fn worker_config(config: &NodeConfig, cluster_dns: Vec<String>) -> WorkerConfig {
    let host = host::figures(&config.data_dir);
    let resolv = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    WorkerConfig {
        node_name: config.name.clone(),
        pod_log_dir: config.pod_log_dir(),
        pods_dir: config.pods_dir(),
        seccomp_dir: config.data_dir.join("seccomp"),
        allowed_unsafe_sysctls: config.allowed_unsafe_sysctls.clone(),
        host_ip: config.node_ip.clone(),
        cluster_dns,
        cluster_domain: config.cluster_domain.clone(),
        host_dns: crate::pod::parse_resolv_conf(&resolv),
        // Several agents may share a host: each has its own cgroup subtree.
        cgroup_root: format!("/skiff/{}", config.name),
        node_cpu_cores: host.cpus as f64,
        node_memory_bytes: host.memory_total,
        node_ephemeral_storage_bytes: host.disk_total,
        ..WorkerConfig::default()
    }
}

/// How long the agent waits for its pod CIDR (from the node IPAM
/// controller) before pods start without the node's own DNS server.
const POD_CIDR_WAIT: Duration = Duration::from_secs(30);

/// The DNS servers pods get for `dnsPolicy: ClusterFirst`: `--cluster-dns`,
/// or this agent's own, started here at its pod bridge's gateway address
/// (known once the pod CIDR is: from the flag or the Node's spec).
async fn cluster_dns(
    config: &NodeConfig,
    informers: &Informers,
    posted: &mut watch::Receiver<Option<Node>>,
    shutdown: &Shutdown,
) -> Vec<String> {
    if !config.cluster_dns.is_empty() || !config.serve_dns {
        return config.cluster_dns.clone();
    }
    let deadline = tokio::time::Instant::now() + POD_CIDR_WAIT;
    let cidr = loop {
        if let Some(cidr) = pod_cidr(config, posted.borrow().as_ref()) {
            break Some(cidr);
        }
        tokio::select! {
            _ = shutdown.cancelled() => return Vec::new(),
            _ = tokio::time::sleep_until(deadline) => break None,
            changed = posted.changed() => if changed.is_err() { break None },
        }
    };
    let Some(gateway) = cidr.as_deref().and_then(cni::gateway_of) else {
        tracing::warn!("no pod CIDR yet: pods get the host's resolvers instead of the node's DNS server");
        return Vec::new();
    };
    let resolv = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    let upstreams = dns::upstreams_from_resolv_conf(&resolv);
    let listen = std::net::SocketAddr::new(gateway, 53);
    match dns::run(informers, listen, config.cluster_domain.clone(), upstreams, shutdown.clone()).await {
        Ok(()) => {
            tracing::info!(%listen, "serving cluster DNS to this node's pods");
            vec![gateway.to_string()]
        }
        Err(e) => {
            tracing::error!(%listen, error = %e, "cannot serve cluster DNS; pods get the host's resolvers");
            Vec::new()
        }
    }
}

fn pod_cidr(config: &NodeConfig, node: Option<&Node>) -> Option<String> {
    config
        .pod_cidr
        .clone()
        .or_else(|| node.and_then(|n| n.spec.as_ref()).and_then(|s| s.pod_cidr.clone()))
        .filter(|c| !c.is_empty())
}

fn node_ref(name: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "uid": name}})
}

fn configure_network(
    config: &NodeConfig,
    node: Option<&Node>,
    network: &dyn NodeNetwork,
    current: &mut Option<String>,
) {
    let Some(cidr) = pod_cidr(config, node) else { return };
    if current.as_deref() == Some(cidr.as_str()) {
        return;
    }
    match network.configure(&cidr) {
        Ok(()) => {
            tracing::info!(pod_cidr = %cidr, "pod network configured");
            *current = Some(cidr);
        }
        Err(e) => tracing::error!(pod_cidr = %cidr, error = %e, "configuring the pod network failed"),
    }
}

/// Creates the mirror of a static pod, or replaces one from an older
/// manifest or one being deleted; whether a new mirror was created.
async fn ensure_mirror(client: &Client, pod: &Pod, existing: Option<&Pod>) -> bool {
    let hash = pod.metadata.annotations.as_ref().and_then(|a| a.get(static_pods::CONFIG_HASH)).cloned();
    if let Some(existing) = existing {
        let mirrored = existing.metadata.annotations.as_ref().and_then(|a| a.get(static_pods::CONFIG_MIRROR)).cloned();
        if mirrored == hash && existing.metadata.deletion_timestamp.is_none() {
            return false;
        }
        delete_mirror(client, existing).await;
    }
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    match api.create(&static_pods::mirror_of(pod)).await {
        Ok(_) => {
            tracing::info!(pod = ?pod.metadata.name, "mirror pod created");
            true
        }
        Err(e) if e.is(Reason::AlreadyExists) => false,
        Err(e) => {
            tracing::warn!(pod = ?pod.metadata.name, error = %e, "creating the mirror pod failed");
            false
        }
    }
}

/// Writes a static pod's last status again, onto its new mirror.
fn repost_status(queue: &StatusQueue, statuses: &HashMap<String, (ObjectKey, PodStatus)>, name: &str) {
    if let Some((key, status)) = statuses.get(name) {
        queue.push(key.clone(), String::new(), status.clone());
    }
}

async fn delete_mirror(client: &Client, pod: &Pod) {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let name = pod.metadata.name.clone().unwrap_or_default();
    let mut params = DeleteParams::background();
    params.grace_period_seconds = Some(0);
    if let Err(e) = api.delete(&name, &params).await {
        if !e.is(Reason::NotFound) {
            tracing::warn!(pod = %name, error = %e, "deleting the mirror pod failed");
        }
    }
}

/// The pod's containers are gone: remove the object (grace 0, only that uid).
async fn finish_deletion(client: &Client, key: &ObjectKey, uid: &str) {
    let api: Api<Pod> = Api::namespaced(client.clone(), &key.namespace);
    let mut params = DeleteParams::background().with_uid(uid);
    params.grace_period_seconds = Some(0);
    match api.delete(&key.name, &params).await {
        Ok(_) => {}
        Err(e) if e.is(Reason::NotFound) || e.is(Reason::Conflict) => {}
        Err(e) => tracing::warn!(pod = %key.name, error = %e, "removing the terminated pod failed"),
    }
}

async fn write_statuses(client: Client, queue: Arc<StatusQueue>, shutdown: Shutdown) {
    loop {
        while let Some((key, uid, status)) = queue.pop() {
            let api: Api<Pod> = Api::namespaced(client.clone(), &key.namespace);
            let mut patch = json!({ "status": status });
            if !uid.is_empty() {
                // Never write one pod's status onto a namesake.
                patch["metadata"] = json!({ "uid": uid });
            }
            let retry = match api.patch_status(&key.name, &patch).await {
                Ok(_) => {
                    metrics().status_writes.with_label_values(&["ok"]).inc();
                    None
                }
                Err(e) if e.is(Reason::NotFound) || e.is(Reason::Conflict) => {
                    metrics().status_writes.with_label_values(&["gone"]).inc();
                    None
                }
                Err(e) => {
                    metrics().status_writes.with_label_values(&["error"]).inc();
                    tracing::warn!(pod = %key.name, error = %e, "writing the pod status failed; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    Some((uid, status))
                }
            };
            queue.written(key, retry);
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = queue.ready.notified() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn service(ns: &str, name: &str, ip: &str, ports: &[(i32, Option<&str>)]) -> Arc<Service> {
        Arc::new(Service {
            metadata: ObjectMeta { namespace: Some(ns.into()), name: Some(name.into()), ..Default::default() },
            spec: Some(ServiceSpec {
                cluster_ip: Some(ip.into()),
                ports: Some(
                    ports
                        .iter()
                        .map(|(p, n)| ServicePort { port: *p, name: n.map(Into::into), ..Default::default() })
                        .collect(),
                ),
                ..Default::default()
            }),
            status: None,
        })
    }

    #[test]
    fn service_variables_follow_kubes_names_for_the_pods_namespace_and_the_master() {
        let services = vec![
            service("web", "my-api", "10.96.0.10", &[(80, Some("http")), (443, Some("https"))]),
            service("other", "db", "10.96.0.11", &[(5432, None)]),
            service("default", "kubernetes", "10.96.0.1", &[(443, Some("https"))]),
            service("web", "headless", "None", &[(80, None)]),
        ];
        let env: HashMap<String, String> = service_env(&services, "web").into_iter().collect();
        assert_eq!(env["MY_API_SERVICE_HOST"], "10.96.0.10");
        assert_eq!(env["MY_API_SERVICE_PORT"], "80");
        assert_eq!(env["MY_API_SERVICE_PORT_HTTPS"], "443");
        assert_eq!(env["MY_API_PORT"], "tcp://10.96.0.10:80");
        assert_eq!(env["MY_API_PORT_443_TCP_ADDR"], "10.96.0.10");
        assert_eq!(env["KUBERNETES_SERVICE_HOST"], "10.96.0.1");
        assert!(!env.contains_key("DB_SERVICE_HOST"), "other namespaces' services are not given");
        assert!(!env.contains_key("HEADLESS_SERVICE_HOST"), "headless services have no address");
    }

    #[test]
    fn the_status_queue_keeps_only_the_latest_status_of_a_pod() {
        let queue = StatusQueue::default();
        let key = ObjectKey::new("ns", "p");
        let status = |phase: &str| PodStatus { phase: Some(phase.into()), ..Default::default() };
        queue.push(key.clone(), "u".into(), status("Pending"));
        queue.push(key.clone(), "u".into(), status("Running"));
        queue.push(ObjectKey::new("ns", "q"), "v".into(), status("Pending"));
        let (k, _, s) = queue.pop().expect("one");
        assert_eq!((k, s.phase.as_deref()), (key, Some("Running")));
        assert_eq!(queue.pop().expect("two").0, ObjectKey::new("ns", "q"));
        assert!(queue.pop().is_none());
    }

    #[test]
    fn a_pod_has_one_status_write_in_flight_and_a_retry_never_replaces_a_newer_status() {
        let queue = StatusQueue::default();
        let key = ObjectKey::new("ns", "p");
        let status = |phase: &str| PodStatus { phase: Some(phase.into()), ..Default::default() };
        queue.push(key.clone(), "u".into(), status("Pending"));
        let (_, uid, first) = queue.pop().expect("the first status");
        // A newer status waits for the write in flight: a second writer
        // racing it could land the older status last.
        queue.push(key.clone(), "u".into(), status("Running"));
        assert!(queue.pop().is_none(), "one write per pod at a time");
        // The first write failed; its retry must not undo the newer status.
        queue.written(key.clone(), Some((uid, first)));
        let (_, uid, second) = queue.pop().expect("the newer status");
        assert_eq!(second.phase.as_deref(), Some("Running"));
        assert!(queue.pop().is_none());
        // A failed write with nothing newer is written again.
        queue.written(key.clone(), Some((uid, second)));
        assert_eq!(queue.pop().expect("the retry").2.phase.as_deref(), Some("Running"));
        queue.written(key, None);
        assert!(queue.pop().is_none());
    }
}
