//! `run(config, shutdown)`: the scheduler process. It serves `/metrics`
//! and `/healthz`, competes for the `kube-system/kube-scheduler` Lease, and
//! while it leads runs one scheduling loop on fresh informers.
//!
//! The loop is one task that owns the [`Cache`] and takes, in this order of
//! preference: node and pod changes from the informers (into the cache,
//! and pending pods into the [`SchedulingQueue`]), the outcomes of
//! bindings, then the next pod of the queue. A decision assumes its pod
//! onto the chosen node and hands the binding to a task of its own, so the
//! next decision does not wait for the commit. What a failed decision
//! writes (the `FailedScheduling` Event, the `PodScheduled` condition,
//! preemption's evictions) is written off the loop as well.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ReplicationController, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use serde_json::{json, Value};
use skiff_api::resources::{self, Kind};
use skiff_api::{meta, Reason};
use skiff_client::resources::DeleteParams;
use skiff_client::runtime::events::Recorder;
use skiff_client::runtime::informer::{Informers, Notification, Subscription};
use skiff_client::runtime::leader::LeaderElector;
use skiff_client::runtime::reflector::{Change, ObjectKey, Store};
use skiff_client::{Client, ClientConfig, ClientError};
use skiff_shutdown::Shutdown;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use crate::algorithm::{self, FitError, Profile};
use crate::cache::{is_terminal, Cache, Nomination, UNSEEN_EVICTION_WAIT};
use crate::config::SchedulerConfig;
use crate::metrics::metrics;
use crate::preemption::{self, Budget, Preemption};
use crate::queue::{ClusterEvent, Hint, QueuedPod, SchedulingQueue};
use crate::selector::Selector;

/// Changes an informer buffers for the loop before it must resync.
const INFORMER_BUFFER: usize = 1 << 16;
/// Writes about unschedulable pods (conditions, preemption) in flight.
const STATUS_WRITES_IN_FLIGHT: usize = 32;
/// How often the queue lengths are exported.
const EXPORT_EVERY: Duration = Duration::from_secs(1);

/// Why the scheduler could not start.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The apiserver client could not be set up.
    #[error("apiserver client: {0}")]
    Client(#[from] ClientError),
    /// The `/metrics` listener could not bind.
    #[error("cannot listen on {addr} for /metrics: {source}")]
    Listen {
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Runs the scheduler until `shutdown`.
pub async fn run(config: SchedulerConfig, shutdown: Shutdown) -> Result<(), RunError> {
    let mut client_config = ClientConfig::new(&config.servers);
    client_config.tls = config.tls.clone();
    client_config.token = config.token.clone();
    client_config.qps = config.kube_api_qps;
    client_config.burst = config.kube_api_burst;
    let client = Client::from_config(&client_config)?;
    if let Some(addr) = config.http {
        let bound = skiff_metrics::serve(addr, metrics().registry.clone(), shutdown.clone())
            .await
            .map_err(|source| RunError::Listen { addr, source })?;
        tracing::info!(%bound, "serving /metrics and /healthz");
    }
    tracing::info!(scheduler_name = %config.profile.scheduler_name, "scheduler starting");
    let Some(lease) = config.leader_election.clone() else {
        leading(client, config, shutdown.child()).await;
        return Ok(());
    };
    LeaderElector::new(client.clone(), lease)
        .run(shutdown.clone(), move |lead: Shutdown| {
            let (client, config) = (client.clone(), config.clone());
            // Losing the lease cancels `lead`; the elector waits for every
            // binding started on it before competing again.
            async move { leading(client, config, lead).await }
        })
        .await;
    Ok(())
}

/// Schedules while `shutdown` is not cancelled.
async fn leading(client: Client, config: SchedulerConfig, shutdown: Shutdown) {
    metrics().leader.set(1);
    tracing::info!("leading: scheduling");
    let informers = Informers::with_capacity(client.clone(), shutdown.clone(), INFORMER_BUFFER);
    let (nodes, pods) = (informers.informer::<Node>(), informers.informer::<Pod>());
    let namespaces = informers.informer::<Namespace>();
    let (services, replica_sets) = (informers.informer::<Service>(), informers.informer::<ReplicaSet>());
    let replication_controllers = informers.informer::<ReplicationController>();
    // Read only when preempting, so no change feed.
    let budgets = informers.informer::<PodDisruptionBudget>();
    let changes = Changes {
        nodes: nodes.subscribe(),
        pods: pods.subscribe(),
        namespaces: namespaces.subscribe(),
        services: services.subscribe(),
        replica_sets: replica_sets.subscribe(),
        replication_controllers: replication_controllers.subscribe(),
    };
    let stores = Stores {
        nodes: nodes.store(),
        pods: pods.store(),
        namespaces: namespaces.store(),
        services: services.store(),
        replica_sets: replica_sets.store(),
        replication_controllers: replication_controllers.store(),
        budgets: budgets.store(),
    };
    let ready = async {
        futures::join!(
            stores.nodes.wait_until_ready(),
            stores.pods.wait_until_ready(),
            stores.namespaces.wait_until_ready(),
            stores.services.wait_until_ready(),
            stores.replica_sets.wait_until_ready(),
            stores.replication_controllers.wait_until_ready(),
            stores.budgets.wait_until_ready(),
        )
    };
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = ready => Scheduler::new(client, config, stores, shutdown.clone()).run(changes).await,
    }
    metrics().leader.set(0);
    tracing::info!("scheduling stopped");
}

/// The informers' caches the loop reads.
struct Stores {
    nodes: Store<Node>,
    pods: Store<Pod>,
    namespaces: Store<Namespace>,
    services: Store<Service>,
    replica_sets: Store<ReplicaSet>,
    replication_controllers: Store<ReplicationController>,
    budgets: Store<PodDisruptionBudget>,
}

/// The informers' change feeds the loop takes in.
struct Changes {
    nodes: Subscription<Node>,
    pods: Subscription<Pod>,
    namespaces: Subscription<Namespace>,
    services: Subscription<Service>,
    replica_sets: Subscription<ReplicaSet>,
    replication_controllers: Subscription<ReplicationController>,
}

/// What a binding task reports to the loop. The permit is the binding's
/// slot: the loop drops it once it has read the outcome, so the outcomes
/// channel never holds more than the slots and a sender never waits.
struct Bound {
    queued: QueuedPod,
    node: String,
    result: Result<(), ClientError>,
    took: Duration,
    _slot: OwnedSemaphorePermit,
}

/// The scheduling loop's state.
struct Scheduler {
    client: Client,
    profile: Arc<Profile>,
    cache: Cache,
    queue: SchedulingQueue,
    stores: Stores,
    recorder: Arc<Recorder>,
    /// Where the next search over the nodes begins.
    next_start: usize,
    bind_slots: Arc<Semaphore>,
    bound_tx: mpsc::Sender<Bound>,
    bound_rx: mpsc::Receiver<Bound>,
    status_slots: Arc<Semaphore>,
    shutdown: Shutdown,
}

impl Scheduler {
    fn new(client: Client, config: SchedulerConfig, stores: Stores, shutdown: Shutdown) -> Self {
        let slots = config.parallel_binds.max(1);
        let (bound_tx, bound_rx) = mpsc::channel(slots);
        Scheduler {
            client,
            profile: Arc::new(config.profile),
            cache: Cache::new(),
            queue: SchedulingQueue::new(config.queue),
            stores,
            recorder: Arc::new(Recorder::new("default-scheduler")),
            next_start: 0,
            bind_slots: Arc::new(Semaphore::new(slots)),
            bound_tx,
            bound_rx,
            status_slots: Arc::new(Semaphore::new(STATUS_WRITES_IN_FLIGHT)),
            shutdown,
        }
    }

    async fn run(mut self, mut changes: Changes) {
        self.resync();
        let mut export = tokio::time::interval(EXPORT_EVERY);
        let queue = self.queue.clone();
        loop {
            tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => break,
                change = changes.nodes.recv() => match change {
                    Some(Notification::Changed(change)) => self.node_changed(change),
                    Some(Notification::Resync) => self.resync(),
                    None => break,
                },
                change = changes.pods.recv() => match change {
                    Some(Notification::Changed(change)) => self.pod_changed(change),
                    Some(Notification::Resync) => self.resync(),
                    None => break,
                },
                change = changes.namespaces.recv() => match change {
                    Some(Notification::Changed(change)) => self.namespace_changed(change),
                    Some(Notification::Resync) => self.resync(),
                    None => break,
                },
                change = changes.services.recv() => match change {
                    Some(Notification::Changed(change)) => self.spreader_changed(change, service_selector),
                    Some(Notification::Resync) => self.resync(),
                    None => break,
                },
                change = changes.replica_sets.recv() => match change {
                    Some(Notification::Changed(change)) => self.spreader_changed(change, replica_set_selector),
                    Some(Notification::Resync) => self.resync(),
                    None => break,
                },
                change = changes.replication_controllers.recv() => match change {
                    Some(Notification::Changed(change)) => self.spreader_changed(change, controller_selector),
                    Some(Notification::Resync) => self.resync(),
                    None => break,
                },
                Some(bound) = self.bound_rx.recv() => self.binding_done(bound),
                _ = export.tick() => export_queue_lengths(&queue),
                next = queue.pop() => match next {
                    Some(queued) => self.schedule_one(queued).await,
                    None => break,
                },
            }
        }
        queue.shut_down();
    }

    /// Starts over from the informers' stores: after the start, and after
    /// the loop fell behind an informer and missed changes.
    fn resync(&mut self) {
        let (nodes, pods) = (self.stores.nodes.list(), self.stores.pods.list());
        self.cache.rebuild(&nodes, &pods);
        for namespace in self.stores.namespaces.list() {
            self.namespace_changed(Change::Applied(namespace));
        }
        for service in self.stores.services.list() {
            self.spreader_changed(Change::Applied(service), service_selector);
        }
        for set in self.stores.replica_sets.list() {
            self.spreader_changed(Change::Applied(set), replica_set_selector);
        }
        for controller in self.stores.replication_controllers.list() {
            self.spreader_changed(Change::Applied(controller), controller_selector);
        }
        for pod in pods {
            self.enqueue_if_pending(pod);
        }
        self.queue.move_all();
        tracing::info!(nodes = self.cache.cluster().node_count(), "scheduler cache rebuilt");
    }

    fn node_changed(&mut self, change: Change<Node>) {
        match change {
            Change::Applied(node) => {
                let name = node.metadata.name.clone().unwrap_or_default();
                let event = match self.cache.cluster().node(&name) {
                    None => Some(ClusterEvent::NodeAdded),
                    Some(old) if node_update_matters(&old.node, &node) => Some(ClusterEvent::NodeChanged),
                    // A heartbeat: nothing the filters read.
                    Some(_) => None,
                };
                self.cache.upsert_node(node.clone());
                if let Some(reason) = self.cache.cluster().node(&name).and_then(|n| n.malformed.clone()) {
                    self.node_skipped(&node, reason);
                }
                if let Some(event) = event {
                    self.queue.on_cluster_event(event, Some(&name));
                }
            }
            Change::Deleted(node) => {
                let name = node.metadata.name.as_deref().unwrap_or_default();
                self.cache.remove_node(name);
                self.queue.on_cluster_event(ClusterEvent::NodeDeleted, Some(name));
            }
        }
    }

    fn namespace_changed(&mut self, change: Change<Namespace>) {
        let name = change.object().metadata.name.clone().unwrap_or_default();
        match change {
            Change::Applied(ns) => {
                self.cache.set_namespace_labels(&name, ns.metadata.labels.clone().unwrap_or_default())
            }
            Change::Deleted(_) => self.cache.remove_namespace(&name),
        }
    }

    /// A Service, ReplicaSet or ReplicationController, whose pods the
    /// selector spreading score spreads.
    fn spreader_changed<K>(&mut self, change: Change<K>, selector: fn(&K) -> Option<Selector>)
    where
        K: k8s_openapi::Resource
            + k8s_openapi::Metadata<Ty = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>,
    {
        let meta = change.object().metadata();
        let namespace = meta.namespace.clone().unwrap_or_default();
        let owner = format!("{}/{}", K::KIND, meta.name.as_deref().unwrap_or_default());
        let selector = match &change {
            Change::Applied(obj) => selector(obj),
            Change::Deleted(_) => None,
        };
        self.cache.set_spreading_selector(&namespace, &owner, selector);
    }

    fn pod_changed(&mut self, change: Change<Pod>) {
        match change {
            Change::Applied(pod) => {
                let key = ObjectKey::of(pod.as_ref());
                // What the cache counted before: the pod as bound and seen,
                // or as assumed or holding room (not yet seen bound), or not.
                let seen_bound = !self.cache.is_assumed(&key) && !self.cache.is_nominated(&key);
                let before = self.cache.cluster().pod(&key).filter(|_| seen_bound).map(|p| p.pod.clone());
                let event = match (&before, is_bound(&pod)) {
                    (_, false) => None,
                    (Some(_), true) if is_terminal(&pod) => Some(ClusterEvent::PodDeleted),
                    (None, true) if is_terminal(&pod) => None,
                    (None, true) => Some(ClusterEvent::AssignedPodAdded),
                    (Some(old), true) if assigned_update_matters(old, &pod) => Some(ClusterEvent::PodChanged),
                    // Its status, as the kubelet reports it: nothing the
                    // filters read.
                    (Some(_), true) => None,
                };
                self.cache.observe_pod(pod.clone());
                if !self.enqueue_if_pending(pod.clone()) {
                    self.queue.delete(&key);
                }
                if let Some(event) = event {
                    self.queue.on_cluster_event(event, pod.spec.as_ref().and_then(|s| s.node_name.as_deref()));
                }
            }
            Change::Deleted(pod) => {
                let key = ObjectKey::of(pod.as_ref());
                self.cache.remove_pod(&key);
                self.queue.delete(&key);
                if is_bound(&pod) {
                    self.queue.on_cluster_event(
                        ClusterEvent::PodDeleted,
                        pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
                    );
                }
            }
        }
    }

    /// Queues `pod` if it waits for this scheduler; whether it does.
    fn enqueue_if_pending(&self, pod: Arc<Pod>) -> bool {
        if !self.is_ours_and_pending(&pod) || self.cache.is_assumed(&ObjectKey::of(pod.as_ref())) {
            return false;
        }
        if let Err(e) = self.queue.add(pod) {
            tracing::warn!(error = %e, "scheduling queue full; the pod waits for the next resync");
        }
        true
    }

    fn is_ours_and_pending(&self, pod: &Pod) -> bool {
        let name = pod.spec.as_ref().and_then(|s| s.scheduler_name.as_deref()).unwrap_or("default-scheduler");
        name == self.profile.scheduler_name
            && !is_bound(pod)
            && !is_terminal(pod)
            && pod.metadata.deletion_timestamp.is_none()
    }

    /// One decision for the pod at the head of the queue.
    async fn schedule_one(&mut self, queued: QueuedPod) {
        // The queue may hold an older copy; the store has the latest.
        let current = self.stores.pods.get(&queued.key);
        let Some(pod) = current.filter(|p| self.is_ours_and_pending(p)) else {
            self.queue.done(&queued.key);
            return;
        };
        if self.cache.is_assumed(&queued.key) {
            self.queue.done(&queued.key);
            return;
        }
        // Room it held since preempting is its own to take again, not an
        // obstacle to itself.
        let (pod, held) = self.cache.release_for_retry(&queued.key, pod);
        let info = crate::framework::PodInfo::new(pod.clone());
        let started = Instant::now();
        let decision = algorithm::schedule(&info, self.cache.cluster(), &self.profile, &mut self.next_start);
        metrics().algorithm_latency.observe(started.elapsed().as_secs_f64());
        match decision {
            Ok(placement) => {
                metrics().attempts.with_label_values(&["scheduled"]).inc();
                self.cache.assume(&info, &placement.node);
                let slot = self.bind_slot().await;
                self.spawn_binding(queued, pod, placement.node, slot);
            }
            Err(mut fit) => {
                metrics().attempts.with_label_values(&["unschedulable"]).inc();
                let cluster = self.cache.cluster();
                let waiting = held.as_ref().is_some_and(|h| self.cache.victims_remain(h));
                let held_node = held.as_ref().filter(|_| waiting).map(|h| h.node.clone());
                let preemption = match preempts(&pod) && !waiting {
                    true => {
                        let budgets: Vec<Budget> =
                            self.stores.budgets.list().iter().filter_map(|b| Budget::new(b)).collect();
                        preemption::preempt(&info, cluster, &self.profile, &fit, &budgets)
                    }
                    false => None,
                };
                // A pending pod holding room is not on the node to evict;
                // without it the eviction would not make room, so none.
                let preemption = preemption.filter(|p| !p.victims.iter().any(|v| self.cache.is_nominated(&v.key)));
                match (&preemption, held) {
                    (Some(p), _) => {
                        let victims = p.victims.iter().map(|v| v.key.clone()).collect();
                        self.cache.nominate(&info, Nomination { node: p.node.clone(), victims, at: Instant::now() });
                    }
                    // Its victims have not all left: it keeps their room,
                    // or another pod takes it and this one has to preempt
                    // a second time.
                    (None, Some(held)) if waiting => self.cache.nominate(&info, held),
                    _ => {}
                }
                if waiting {
                    fit.post_filter = Some(WAITING_FOR_VICTIMS.into());
                } else if preemption.is_none() && preempts(&pod) {
                    fit.post_filter = Some(preemption::failure_message(&fit));
                }
                // Holding room where its victims are leaving, it goes there
                // once they have: only what happens on that node concerns
                // it, and a victim that never shows leaving is waited for
                // only briefly.
                let hint = match preemption.as_ref().map(|p| p.node.clone()).or(held_node) {
                    Some(node) => Hint::holding_room(fit.helped_by, node, UNSEEN_EVICTION_WAIT),
                    None => Hint::events(fit.helped_by),
                };
                self.spawn_unschedulable(pod, &fit, preemption);
                self.queue.requeue_unschedulable(queued, hint);
            }
        }
    }

    /// A free binding slot; while there is none, the outcomes of bindings
    /// are taken in (each frees its slot).
    async fn bind_slot(&mut self) -> OwnedSemaphorePermit {
        loop {
            if let Ok(slot) = self.bind_slots.clone().try_acquire_owned() {
                return slot;
            }
            match self.bound_rx.recv().await {
                Some(bound) => self.binding_done(bound),
                None => unreachable!("the loop holds a sender"),
            }
        }
    }

    fn spawn_binding(&self, queued: QueuedPod, pod: Arc<Pod>, node: String, slot: OwnedSemaphorePermit) {
        let (client, tx, recorder) = (self.client.clone(), self.bound_tx.clone(), self.recorder.clone());
        self.shutdown.spawn(async move {
            let (namespace, name) = (queued.key.namespace.clone(), queued.key.name.clone());
            let started = Instant::now();
            let result = client.bind(&namespace, &name, &node).await;
            let took = started.elapsed();
            if result.is_ok() {
                let message = format!("Successfully assigned {namespace}/{name} to {node}");
                recorder.record(&client, &pod_ref(&pod), "Normal", "Scheduled", &message).await;
            }
            let _ = tx.send(Bound { queued, node, result, took, _slot: slot }).await;
        });
    }

    fn binding_done(&mut self, bound: Bound) {
        let Bound { queued, node, result, took, .. } = bound;
        metrics().binding_latency.observe(took.as_secs_f64());
        match result {
            Ok(()) => {
                metrics().e2e_latency.observe(queued.first_queued.elapsed().as_secs_f64());
                self.queue.done(&queued.key);
            }
            // Bound elsewhere already, or deleted: never bound a second
            // time; the watch tells the cache the truth.
            Err(e) if e.is(Reason::Conflict) || e.is(Reason::NotFound) => {
                tracing::info!(pod = %queued.key, %node, error = %e, "binding refused; not retried");
                metrics().attempts.with_label_values(&["error"]).inc();
                self.cache.forget(&queued.key);
                self.queue.done(&queued.key);
            }
            Err(e) => {
                tracing::warn!(pod = %queued.key, %node, error = %e, "binding failed; retrying after back-off");
                metrics().attempts.with_label_values(&["error"]).inc();
                self.cache.forget(&queued.key);
                self.queue.requeue_error(queued);
            }
        }
    }

    /// Writes, off the loop, what a pod that fits nowhere shows: when
    /// preemption found room, the evictions first (the pod waits for
    /// them), then the Warning Event, the `PodScheduled` condition and
    /// `status.nominatedNodeName`.
    fn spawn_unschedulable(&self, pod: Arc<Pod>, fit: &FitError, preemption: Option<Preemption>) {
        let message = fit.to_string();
        let (client, recorder, slots) = (self.client.clone(), self.recorder.clone(), self.status_slots.clone());
        self.shutdown.spawn(async move {
            let Ok(_slot) = slots.acquire_owned().await else { return };
            let nominated = match preemption {
                Some(p) => evict(&client, &recorder, &pod, p).await,
                None => None,
            };
            recorder.record(&client, &pod_ref(&pod), "Warning", "FailedScheduling", &message).await;
            if let Some(patch) = unschedulable_status(&pod, &message, nominated.as_deref()) {
                let (namespace, name) = (meta_namespace(&pod), pod.metadata.name.clone().unwrap_or_default());
                let info = resources::of(Kind::Pod);
                if let Err(e) = client.patch(info, &namespace, &name, "strategic", &patch, "status").await {
                    tracing::debug!(pod = %name, error = %e, "PodScheduled condition not written");
                }
            }
        });
    }

    /// Records on the node why it is left out of every decision.
    fn node_skipped(&self, node: &Node, reason: String) {
        let (client, recorder) = (self.client.clone(), self.recorder.clone());
        let regarding = json!({"apiVersion": "v1", "kind": "Node", "metadata": node.metadata});
        tracing::warn!(node = ?node.metadata.name, %reason, "node skipped by the scheduler");
        self.shutdown.spawn(async move {
            recorder.record(&client, &regarding, "Warning", "FailedToParseNode", &reason).await;
        });
    }
}

/// Deletes a preemption's victims (gracefully, each with its own grace
/// period), then tells each deleted one why, as kube does; the node the
/// preemptor is nominated to.
async fn evict(client: &Client, recorder: &Recorder, preemptor: &Pod, p: Preemption) -> Option<String> {
    metrics().preemption_attempts.inc();
    let info = resources::of(Kind::Pod);
    let mut evicted = Vec::with_capacity(p.victims.len());
    for victim in &p.victims {
        let uid = victim.pod.metadata.uid.clone().unwrap_or_default();
        let params = DeleteParams::background().with_uid(uid);
        match client.delete(info, &victim.key.namespace, &victim.key.name, &params).await {
            Ok(_) => {
                metrics().preemption_victims.inc();
                evicted.push(victim);
            }
            Err(e) if e.is(Reason::NotFound) || e.is(Reason::Conflict) => {}
            Err(e) => {
                tracing::warn!(victim = %victim.key, error = %e, "preemption: eviction failed");
                return None;
            }
        }
    }
    let preemptor_name = format!("{}/{}", meta_namespace(preemptor), preemptor.metadata.name.as_deref().unwrap_or(""));
    let message = format!("Preempted by pod {preemptor_name} on node {}", p.node);
    for victim in evicted {
        recorder.record(client, &pod_ref(&victim.pod), "Normal", "Preempted", &message).await;
    }
    Some(p.node)
}

/// The status patch for a pod that fits nowhere, or `None` if it already
/// shows exactly that.
fn unschedulable_status(pod: &Pod, message: &str, nominated: Option<&str>) -> Option<Value> {
    let status = pod.status.as_ref();
    let current = status.and_then(|s| s.conditions.as_ref()).and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"));
    let same = current.is_some_and(|c| {
        c.status == "False" && c.reason.as_deref() == Some("Unschedulable") && c.message.as_deref() == Some(message)
    });
    let nominated_now = status.and_then(|s| s.nominated_node_name.as_deref());
    if same && (nominated.is_none() || nominated == nominated_now) {
        return None;
    }
    let mut patch = json!({"status": {"conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
        "lastProbeTime": null, "lastTransitionTime": meta::now_rfc3339(),
    }]}});
    if let Some(node) = nominated {
        patch["status"]["nominatedNodeName"] = json!(node);
    }
    Some(patch)
}

fn service_selector(service: &Service) -> Option<Selector> {
    service.spec.as_ref()?.selector.as_ref().map(Selector::from_labels)
}

fn replica_set_selector(set: &ReplicaSet) -> Option<Selector> {
    set.spec.as_ref().map(|s| Selector::from_label_selector(&s.selector))
}

fn controller_selector(controller: &ReplicationController) -> Option<Selector> {
    controller.spec.as_ref()?.selector.as_ref().map(Selector::from_labels)
}

/// Whether a node's update changes what the filters and scores read: its
/// labels, spec (taints, cordon), allocatable or capacity, or a condition's
/// status. A node agent's heartbeat changes none of these.
fn node_update_matters(old: &Node, new: &Node) -> bool {
    fn conditions(n: &Node) -> Option<Vec<(&String, &String)>> {
        let conditions = n.status.as_ref()?.conditions.as_ref()?;
        Some(conditions.iter().map(|c| (&c.type_, &c.status)).collect())
    }
    fn sizes(n: &Node) -> Option<(&Option<Quantities>, &Option<Quantities>)> {
        n.status.as_ref().map(|s| (&s.allocatable, &s.capacity))
    }
    old.metadata.labels != new.metadata.labels
        || old.spec != new.spec
        || sizes(old) != sizes(new)
        || conditions(old) != conditions(new)
}

type Quantities = std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>;

/// Whether a bound pod's update changes what other pods' filters read of
/// it: its labels (affinity and spread terms) or its spec. Its status, as
/// its kubelet reports it, does not.
fn assigned_update_matters(old: &Pod, new: &Pod) -> bool {
    old.metadata.labels != new.metadata.labels || old.spec != new.spec
}

fn is_bound(pod: &Pod) -> bool {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some_and(|n| !n.is_empty())
}

/// What a pod waiting for its victims to leave adds to FailedScheduling
/// (kube's PodEligibleToPreemptOthers).
const WAITING_FOR_VICTIMS: &str = "preemption: not eligible due to a terminating pod on the nominated node";

/// Whether a pod that fits nowhere may evict others (`preemptionPolicy`).
fn preempts(pod: &Pod) -> bool {
    pod.spec.as_ref().and_then(|s| s.preemption_policy.as_deref()) != Some("Never")
}

fn meta_namespace(pod: &Pod) -> String {
    pod.metadata.namespace.clone().unwrap_or_else(|| "default".into())
}

/// The pod as an Event's `regarding`.
fn pod_ref(pod: &Pod) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": pod.metadata.name, "namespace": pod.metadata.namespace,
        "uid": pod.metadata.uid, "resourceVersion": pod.metadata.resource_version,
    }})
}

fn export_queue_lengths(queue: &SchedulingQueue) {
    let lengths = queue.lengths();
    let pending = &metrics().pending;
    pending.with_label_values(&["active"]).set(lengths.active as i64);
    pending.with_label_values(&["backoff"]).set(lengths.backoff as i64);
    pending.with_label_values(&["unschedulable"]).set(lengths.unschedulable as i64);
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::*;

    fn pod(status: Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "default"}, "status": status}))
            .expect("a pod")
    }

    #[test]
    fn an_unchanged_unschedulable_condition_is_not_written_again() {
        let message = "0/3 nodes are available: 3 Insufficient cpu.";
        let fresh = pod(json!({}));
        let patch = unschedulable_status(&fresh, message, None).expect("a first write");
        assert_eq!(patch["status"]["conditions"][0]["reason"], "Unschedulable");
        assert_eq!(patch["status"]["conditions"][0]["message"], message);
        let shown = pod(json!({"conditions": [{"type": "PodScheduled", "status": "False",
            "reason": "Unschedulable", "message": message}]}));
        assert!(unschedulable_status(&shown, message, None).is_none());
        assert!(unschedulable_status(&shown, "0/4 nodes are available: 4 Insufficient cpu.", None).is_some());
        let patch = unschedulable_status(&shown, message, Some("n2")).expect("a nomination is news");
        assert_eq!(patch["status"]["nominatedNodeName"], "n2");
    }

    #[test]
    fn a_heartbeat_or_a_status_report_is_no_cluster_event_but_a_taint_or_a_label_is() {
        let node: Node = serde_json::from_value(json!({"metadata": {"name": "n1", "labels": {"zone": "a"}},
            "status": {"allocatable": {"cpu": "4"}, "conditions": [{"type": "Ready", "status": "True",
                "lastHeartbeatTime": "2026-12-07T10:00:00Z"}]}}))
        .unwrap();
        let mut beat = node.clone();
        beat.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].last_heartbeat_time =
            serde_json::from_value(json!("2026-12-07T10:00:10Z")).unwrap();
        assert!(!node_update_matters(&node, &beat));
        let mut not_ready = beat.clone();
        not_ready.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "False".into();
        assert!(node_update_matters(&beat, &not_ready));
        let tainted: Node = serde_json::from_value(json!({"metadata": node.metadata, "status": node.status,
            "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}}))
        .unwrap();
        assert!(node_update_matters(&node, &tainted));
        let mut relabelled = node.clone();
        relabelled.metadata.labels.as_mut().unwrap().insert("zone".into(), "b".into());
        assert!(node_update_matters(&node, &relabelled));
        let mut grown = node.clone();
        grown.status.as_mut().unwrap().allocatable.as_mut().unwrap().insert("cpu".into(), Quantity("8".into()));
        assert!(node_update_matters(&node, &grown));

        let bound: Pod = serde_json::from_value(json!({"metadata": {"name": "p", "labels": {"app": "web"}},
            "spec": {"nodeName": "n1", "containers": []}}))
        .unwrap();
        let mut running = bound.clone();
        running.status = Some(serde_json::from_value(json!({"phase": "Running", "podIP": "10.0.0.9"})).unwrap());
        assert!(!assigned_update_matters(&bound, &running));
        let mut relabelled = running.clone();
        relabelled.metadata.labels.as_mut().unwrap().insert("app".into(), "db".into());
        assert!(assigned_update_matters(&running, &relabelled));
    }

    #[test]
    fn only_a_pod_that_allows_it_preempts() {
        let mut p = pod(json!({}));
        assert!(preempts(&p));
        p.spec = Some(serde_json::from_value(json!({"containers": [], "preemptionPolicy": "Never"})).unwrap());
        assert!(!preempts(&p));
    }
}
