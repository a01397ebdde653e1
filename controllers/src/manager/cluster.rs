//! Wiring of the controllers that look after the cluster as a whole: the
//! namespace controller, the garbage collector, service accounts, the root
//! CA publisher, pod GC, node IPAM and node lifecycle.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, ServiceAccount};
use skiff_api::resources;
use skiff_client::resources::ListParams;
use skiff_client::runtime::controller::{Controller, ReconcileAction, Request};
use skiff_client::runtime::informer::{Notification, Subscription};
use skiff_client::runtime::queue::{QueueConfig, WorkQueue};
use skiff_client::runtime::reflector::{Change, Index, ObjectKey, Store};
use skiff_client::runtime::watcher::WatcherConfig;
use skiff_shutdown::Shutdown;
use tokio::sync::mpsc;

use super::custom::feed_custom_objects;
use super::dynamic::{every_kind, AnyChange, AnyInformer};
use super::{drive, drive_about, export_queue_depth, Context};
use crate::action::Reconciled;
use crate::execute::ExecuteError;
use crate::garbage_collector::{Graph, Node as GraphNode};
use crate::node_ipam::CidrAllocator;
use crate::node_lifecycle::{self, NodeLifecycle};
use crate::{namespace, podgc, root_ca, serviceaccount};

/// How often a terminating namespace with content left is looked at again.
const NAMESPACE_RECHECK: Duration = Duration::from_secs(1);

struct Namespaces {
    ctx: Arc<Context>,
    content: Vec<Arc<AnyInformer>>,
}

pub(super) fn namespaces(ctx: &Arc<Context>, shutdown: &Shutdown) {
    let namespaces = ctx.informers.informer::<Namespace>();
    let controller = Controller::new(&namespaces);
    export_queue_depth("namespace", controller.metrics(), shutdown);
    let shared = Arc::new(Namespaces { ctx: ctx.clone(), content: every_kind(ctx) });
    let reconcile = |request: Request<Namespace>, shared: Arc<Namespaces>| async move {
        let Some(ns) = request.object else { return Ok::<_, ExecuteError>(ReconcileAction::AwaitChange) };
        if ns.metadata.deletion_timestamp.is_none() {
            return Ok(ReconcileAction::AwaitChange);
        }
        let started = Instant::now();
        let name = request.key.name.as_str();
        let mut content = namespace::Content::new();
        for informer in shared.content.iter().filter(|i| resources::of(i.kind).namespaced) {
            (informer.ready)().await;
            let objects = (informer.in_namespace)(name);
            if !objects.is_empty() {
                content.insert(resources::of(informer.kind).qualified(), objects);
            }
        }
        let _ = shared.ctx.custom.0.wait_until_ready().await;
        for served in shared.ctx.custom.namespaced() {
            let params = ListParams { limit: 500, ..ListParams::default() };
            match shared.ctx.client.list_all_of(&served.group, &served.plural, name, &params).await {
                Ok(list) if !list.items.is_empty() => {
                    content.insert(served.qualified(), list.items);
                }
                Ok(_) => {}
                // Defined but not served yet (not Established), or gone.
                Err(e) if e.is(skiff_api::Reason::NotFound) => {}
                Err(e) => {
                    return Err(ExecuteError::Api {
                        verb: "list",
                        kind: served.qualified(),
                        namespace: name.to_string(),
                        name: String::new(),
                        source: Box::new(e),
                    })
                }
            }
        }
        let left = !content.is_empty();
        let actions = namespace::reconcile(&ns, &content, Utc::now());
        let reconciled = Reconciled { actions, requeue_after: left.then_some(NAMESPACE_RECHECK) };
        drive_about(&shared.ctx, "namespace", started, reconciled, ns.as_ref(), |_, _| {}).await
    };
    let workers = ctx.config.workers("namespace");
    let stop = shutdown.clone();
    shutdown.spawn(controller.run(reconcile, shared, workers, stop));
}

pub(super) fn service_accounts(ctx: &Arc<Context>, shutdown: &Shutdown) {
    let namespaces = ctx.informers.informer::<Namespace>();
    let accounts = ctx.informers.informer::<ServiceAccount>();
    // A deleted `default` brings its namespace back for a look.
    let controller = Controller::new(&namespaces).watches(&accounts, |sa: &ServiceAccount| {
        match sa.metadata.name.as_deref() == Some(serviceaccount::DEFAULT) {
            true => vec![ObjectKey::new("", sa.metadata.namespace.clone().unwrap_or_default())],
            false => Vec::new(),
        }
    });
    export_queue_depth("serviceaccount", controller.metrics(), shutdown);
    let shared = Arc::new((ctx.clone(), accounts.store()));
    let reconcile = |request: Request<Namespace>, shared: Arc<(Arc<Context>, Store<ServiceAccount>)>| async move {
        let Some(ns) = request.object else { return Ok::<_, ExecuteError>(ReconcileAction::AwaitChange) };
        let started = Instant::now();
        let accounts: Vec<ServiceAccount> =
            shared.1.by_index(Index::Namespace, &request.key.name).iter().map(|a| (**a).clone()).collect();
        let reconciled = Reconciled { actions: serviceaccount::reconcile(&ns, &accounts), requeue_after: None };
        drive(&shared.0, "serviceaccount", started, reconciled, |_, _| {}).await
    };
    let stop = shutdown.clone();
    shutdown.spawn(controller.run(reconcile, shared, 2, stop));
}

/// How often the root CA file is read again: a rotated CA (or one that
/// gained a second certificate during a rotation) reaches every
/// namespace's `kube-root-ca.crt` within this.
const ROOT_CA_REREAD: Duration = Duration::from_secs(10);

/// Publishes the cluster CA into every namespace, following its file: when
/// its contents change, every namespace is reconciled again.
pub(super) fn root_ca_publisher(ctx: &Arc<Context>, shutdown: &Shutdown) {
    let file = ctx.config.root_ca_file.clone().or_else(|| ctx.config.tls.as_ref().map(|t| t.ca.clone()));
    let Some(file) = file else {
        tracing::info!("no --root-ca-file and no apiserver CA: kube-root-ca.crt is not published");
        return;
    };
    let ca = match std::fs::read_to_string(&file) {
        Ok(ca) => Arc::new(std::sync::RwLock::new(Arc::new(ca))),
        Err(e) => {
            tracing::error!(file = %file.display(), error = %e, "cannot read the root CA; kube-root-ca.crt is not published");
            return;
        }
    };
    let namespaces = ctx.informers.informer::<Namespace>();
    // Only the one ConfigMap of each namespace is followed.
    let published = ctx.informers.informer_with::<ConfigMap>(WatcherConfig {
        field_selector: format!("metadata.name={}", root_ca::NAME),
        ..WatcherConfig::default()
    });
    let controller = Controller::new(&namespaces).watches(&published, |cm: &ConfigMap| {
        vec![ObjectKey::new("", cm.metadata.namespace.clone().unwrap_or_default())]
    });
    export_queue_depth("root-ca-cert-publisher", controller.metrics(), shutdown);
    follow_root_ca(file, ca.clone(), namespaces.store(), controller.queue(), shutdown);
    let shared = Arc::new((ctx.clone(), published.store(), ca));
    type Shared = Arc<(Arc<Context>, Store<ConfigMap>, Arc<std::sync::RwLock<Arc<String>>>)>;
    let reconcile = |request: Request<Namespace>, shared: Shared| async move {
        let Some(ns) = request.object else { return Ok::<_, ExecuteError>(ReconcileAction::AwaitChange) };
        let started = Instant::now();
        let existing = shared.1.get_named(&request.key.name, root_ca::NAME);
        let ca = shared.2.read().expect("root CA lock").clone();
        let actions = root_ca::reconcile(&ns, existing.as_deref(), &ca);
        drive(&shared.0, "root-ca-cert-publisher", started, Reconciled { actions, requeue_after: None }, |_, _| {})
            .await
    };
    let stop = shutdown.clone();
    shutdown.spawn(controller.run(reconcile, shared, 2, stop));
}

/// Reads `file` again every [`ROOT_CA_REREAD`]; when it holds another CA,
/// `ca` becomes it and every namespace goes back on `queue`. A file that
/// cannot be read keeps the CA last read (with a warning).
fn follow_root_ca(
    file: std::path::PathBuf,
    ca: Arc<std::sync::RwLock<Arc<String>>>,
    namespaces: Store<Namespace>,
    queue: WorkQueue<ObjectKey>,
    shutdown: &Shutdown,
) {
    let stop = shutdown.clone();
    shutdown.spawn(async move {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(ROOT_CA_REREAD) => {}
            }
            let now = match tokio::fs::read_to_string(&file).await {
                Ok(now) => now,
                Err(e) => {
                    tracing::warn!(file = %file.display(), error = %e, "cannot read the root CA again; publishing the one read before");
                    continue;
                }
            };
            if **ca.read().expect("root CA lock") == now {
                continue;
            }
            *ca.write().expect("root CA lock") = Arc::new(now);
            tracing::info!(file = %file.display(), "the root CA changed; publishing it in every namespace");
            for key in namespaces.keys() {
                queue.add_after(key, Duration::ZERO);
            }
        }
    });
}

/// The garbage collector: one graph of every object, fed by every kind's
/// changes; a work queue of uids to look at.
pub(super) fn garbage_collector(ctx: &Arc<Context>, shutdown: &Shutdown) {
    let informers = every_kind(ctx);
    let graph = Arc::new(Mutex::new(Graph::new()));
    let queue: WorkQueue<String> = WorkQueue::new(QueueConfig::default());
    let (tx, mut rx) = mpsc::channel::<AnyChange>(4096);
    for informer in &informers {
        (informer.forward)(tx.clone(), shutdown.clone());
    }
    feed_custom_objects(ctx, shutdown, tx);
    // Feed: first every kind's initial list, then changes as they come.
    let (feed_graph, feed_queue, stop) = (graph.clone(), queue.clone(), shutdown.clone());
    let all = informers.clone();
    shutdown.spawn(async move {
        for informer in &all {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = (informer.ready)() => {}
            }
        }
        let mut affected = HashSet::new();
        {
            let mut g = feed_graph.lock().unwrap_or_else(|e| e.into_inner());
            for informer in &all {
                for obj in (informer.all)() {
                    affected.extend(g.observe(&obj));
                }
            }
        }
        for uid in affected {
            let _ = feed_queue.add(uid).await;
        }
        loop {
            let change = tokio::select! {
                _ = stop.cancelled() => return,
                c = rx.recv() => c,
            };
            let Some(change) = change else { return };
            let uids = {
                let mut g = feed_graph.lock().unwrap_or_else(|e| e.into_inner());
                match change {
                    AnyChange::Applied(obj) => g.observe(&obj),
                    AnyChange::Deleted(obj) => g.forget(&obj),
                    AnyChange::Resync(kind) => {
                        let informer = all.iter().find(|i| i.kind == kind);
                        informer.map(|i| (i.all)().iter().flat_map(|o| g.observe(o)).collect()).unwrap_or_default()
                    }
                }
            };
            for uid in uids {
                if feed_queue.add(uid).await.is_err() {
                    return;
                }
            }
        }
    });
    {
        let (queue, stop) = (queue.clone(), shutdown.clone());
        shutdown.spawn(async move {
            stop.cancelled().await;
            queue.shut_down();
        });
    }
    for _ in 0..ctx.config.workers("garbagecollector") {
        let (ctx, graph, queue) = (ctx.clone(), graph.clone(), queue.clone());
        shutdown.spawn(async move {
            while let Some(uid) = queue.next().await {
                let started = Instant::now();
                let (node, actions) = {
                    let g = graph.lock().unwrap_or_else(|e| e.into_inner());
                    (g.get(&uid).cloned(), g.reconcile(&uid))
                };
                let result = match node {
                    Some(node) if !actions.is_empty() => collect(&ctx, &graph, &node, actions, started).await,
                    _ => Ok(ReconcileAction::AwaitChange),
                };
                match result {
                    Ok(ReconcileAction::RequeueAfter(after)) => {
                        queue.forget(&uid);
                        queue.add_after(uid.clone(), after);
                    }
                    Ok(ReconcileAction::AwaitChange) => queue.forget(&uid),
                    Err(e) => {
                        tracing::debug!(%uid, error = %e, "garbage collection failed; retrying");
                        queue.add_rate_limited(uid.clone());
                    }
                }
                queue.done(&uid);
            }
        });
    }
}

/// How often a dependent of a custom object the graph lacks is looked at
/// again while that object lives.
const CUSTOM_OWNER_RECHECK: Duration = Duration::from_secs(10);

/// Carries out the collector's actions for `node`, after confirming with a
/// live read that the owners the graph misses are really gone (one created
/// a moment ago may not have reached its informer yet). A custom owner
/// the graph lacks (its resource's feed has not listed it yet) is read
/// live too: a dependent of a live one waits, and is looked at again every
/// [`CUSTOM_OWNER_RECHECK`].
async fn collect(
    ctx: &Context,
    graph: &Mutex<Graph>,
    node: &GraphNode,
    actions: Vec<crate::Action>,
    started: Instant,
) -> Result<ReconcileAction, ExecuteError> {
    let missing: Vec<_> = {
        let g = graph.lock().unwrap_or_else(|e| e.into_inner());
        node.owners.iter().filter(|o| g.get(&o.uid).is_none()).cloned().collect()
    };
    for owner in missing {
        let live = match resources::by_kind(&owner.api_version, &owner.kind) {
            Some(info) => {
                let namespace = if info.namespaced { node.namespace.as_str() } else { "" };
                ctx.client.get(info, namespace, &owner.name).await
            }
            None => {
                let Some(served) = ctx.custom.serving(&owner.api_version, &owner.kind, false) else {
                    // A kind nobody serves (its definition not created yet,
                    // or deleted): the reference cannot be checked, so the
                    // object stays, as in Kubernetes.
                    tracing::debug!(owner = %owner.name, kind = %owner.kind, "owner of a kind no resource serves");
                    return Ok(ReconcileAction::RequeueAfter(CUSTOM_OWNER_RECHECK));
                };
                let namespace = if served.namespaced { node.namespace.as_str() } else { "" };
                let live = ctx.client.get_of(&served.group, &served.plural, namespace, &owner.name).await;
                if live.as_ref().is_ok_and(|l| skiff_api::meta::uid(l) == Some(owner.uid.as_str())) {
                    return Ok(ReconcileAction::RequeueAfter(CUSTOM_OWNER_RECHECK));
                }
                live
            }
        };
        match live {
            Ok(live) if skiff_api::meta::uid(&live) == Some(owner.uid.as_str()) => {
                // Still there: look again once the informer has caught up.
                return Ok(ReconcileAction::RequeueAfter(Duration::from_secs(1)));
            }
            Ok(_) => {}
            Err(e) if e.is(skiff_api::Reason::NotFound) => {}
            Err(e) => {
                tracing::debug!(owner = %owner.name, error = %e, "owner not confirmed gone");
                return Ok(ReconcileAction::RequeueAfter(Duration::from_secs(1)));
            }
        }
    }
    let reconciled = Reconciled { actions, requeue_after: None };
    drive(ctx, "garbagecollector", started, reconciled, |_, _| {}).await
}

/// How often the pod GC passes over every pod.
const POD_GC_PERIOD: Duration = Duration::from_secs(20);

pub(super) fn pod_gc(ctx: &Arc<Context>, shutdown: &Shutdown) {
    let pods = ctx.informers.informer::<Pod>().store();
    let nodes = ctx.informers.informer::<Node>().store();
    let mut gc =
        podgc::PodGc::new(podgc::Config { terminated_pod_gc_threshold: ctx.config.terminated_pod_gc_threshold });
    let (ctx, stop) = (ctx.clone(), shutdown.clone());
    shutdown.spawn(async move {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = async { let _ = pods.wait_until_ready().await; let _ = nodes.wait_until_ready().await; } => {}
        }
        loop {
            let started = Instant::now();
            let all_pods: Vec<Pod> = pods.list().iter().map(|p| (**p).clone()).collect();
            let all_nodes: Vec<Node> = nodes.list().iter().map(|n| (**n).clone()).collect();
            let actions = gc.reconcile(&all_pods, &all_nodes, Utc::now());
            if !actions.is_empty() {
                let reconciled = Reconciled { actions, requeue_after: None };
                if let Err(e) = drive(&ctx, "podgc", started, reconciled, |_, _| {}).await {
                    tracing::warn!(error = %e, "pod garbage collection failed");
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(POD_GC_PERIOD) => {}
            }
        }
    });
}

pub(super) fn node_ipam(ctx: &Arc<Context>, shutdown: &Shutdown) {
    let allocator = match CidrAllocator::new(&ctx.config.cluster_cidr, ctx.config.node_cidr_mask_size) {
        Ok(a) => Arc::new(Mutex::new(a)),
        Err(e) => {
            tracing::error!(error = %e, "node IPAM not started");
            return;
        }
    };
    let nodes = ctx.informers.informer::<Node>();
    let store = nodes.store();
    let stop = shutdown.clone();
    let controller = Controller::new(&nodes);
    export_queue_depth("nodeipam", controller.metrics(), shutdown);
    let mut changes = nodes.subscribe();
    let released = allocator.clone();
    shutdown.spawn(async move {
        loop {
            let n = tokio::select! {
                _ = stop.cancelled() => return,
                n = changes.recv() => n,
            };
            match n {
                Some(Notification::Changed(Change::Deleted(node))) => {
                    released.lock().unwrap_or_else(|e| e.into_inner()).release(&node)
                }
                Some(_) => {}
                None => return,
            }
        }
    });
    // `primed`: the blocks the nodes in the cache already hold are taken
    // before the first block is handed out.
    let shared = Arc::new((ctx.clone(), allocator, std::sync::atomic::AtomicBool::new(false), store));
    type Shared = (Arc<Context>, Arc<Mutex<CidrAllocator>>, std::sync::atomic::AtomicBool, Store<Node>);
    let reconcile = |request: Request<Node>, shared: Arc<Shared>| async move {
        let Some(node) = request.object else { return Ok::<_, ExecuteError>(ReconcileAction::AwaitChange) };
        let started = Instant::now();
        let (ctx, allocator, primed, store) = (&shared.0, &shared.1, &shared.2, &shared.3);
        let result = {
            let mut a = allocator.lock().unwrap_or_else(|e| e.into_inner());
            if !primed.swap(true, std::sync::atomic::Ordering::SeqCst) {
                for n in store.list() {
                    a.occupy(&n);
                }
            }
            a.reconcile(&node)
        };
        let actions = match result {
            Ok(actions) => actions,
            Err(crate::node_ipam::IpamError::Exhausted { event, .. }) => vec![*event],
            Err(e) => {
                tracing::warn!(error = %e, "no pod CIDR for the node");
                Vec::new()
            }
        };
        drive(ctx, "nodeipam", started, Reconciled { actions, requeue_after: None }, |_, _| {}).await
    };
    let stop = shutdown.clone();
    shutdown.spawn(controller.run(reconcile, shared, 1, stop));
}

/// How often node health is judged.
const NODE_MONITOR_PERIOD: Duration = Duration::from_secs(1);

pub(super) fn node_lifecycle(ctx: &Arc<Context>, shutdown: &Shutdown) {
    let config = node_lifecycle::Config {
        node_monitor_grace_period: chrono::Duration::from_std(ctx.config.node_monitor_grace_period)
            .unwrap_or(chrono::Duration::seconds(40)),
        default_not_ready_toleration_seconds: ctx.config.default_toleration_seconds as i64,
        default_unreachable_toleration_seconds: ctx.config.default_toleration_seconds as i64,
        ..node_lifecycle::Config::default()
    };
    let lifecycle = Arc::new(Mutex::new(NodeLifecycle::new(config)));
    let nodes = ctx.informers.informer::<Node>();
    let leases = ctx.informers.informer::<Lease>();
    let pods = ctx.informers.informer::<Pod>().store();
    // Heartbeats: note when each Lease and Node changed, by our clock.
    for_each_change(nodes.subscribe(), shutdown, {
        let l = lifecycle.clone();
        move |change: Change<Node>| {
            let mut l = l.lock().unwrap_or_else(|e| e.into_inner());
            match change {
                Change::Applied(n) => l.observe_node(&n, Utc::now()),
                Change::Deleted(n) => l.forget_node(n.metadata.name.as_deref().unwrap_or_default()),
            }
        }
    });
    for_each_change(leases.subscribe(), shutdown, {
        let l = lifecycle.clone();
        move |change: Change<Lease>| {
            if let Change::Applied(lease) = change {
                if lease.metadata.namespace.as_deref() == Some(node_lifecycle::LEASE_NAMESPACE) {
                    l.lock().unwrap_or_else(|e| e.into_inner()).observe_lease(&lease, Utc::now());
                }
            }
        }
    });
    let (node_store, lease_store) = (nodes.store(), leases.store());
    let (ctx, stop) = (ctx.clone(), shutdown.clone());
    shutdown.spawn(async move {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = async {
                let _ = node_store.wait_until_ready().await;
                let _ = lease_store.wait_until_ready().await;
                let _ = pods.wait_until_ready().await;
            } => {}
        }
        {
            // What the caches held before the subscriptions heard anything.
            let now = Utc::now();
            let mut l = lifecycle.lock().unwrap_or_else(|e| e.into_inner());
            for n in node_store.list() {
                l.observe_node(&n, now);
            }
            for lease in lease_store.by_index(Index::Namespace, node_lifecycle::LEASE_NAMESPACE) {
                l.observe_lease(&lease, now);
            }
        }
        loop {
            let started = Instant::now();
            let all: Vec<Node> = node_store.list().iter().map(|n| (**n).clone()).collect();
            let mut actions = Vec::new();
            {
                let now = Utc::now();
                let mut l = lifecycle.lock().unwrap_or_else(|e| e.into_inner());
                actions.extend(l.monitor(&all, now).actions);
                for node in &all {
                    let name = node.metadata.name.as_deref().unwrap_or_default();
                    let bound: Vec<Pod> = pods.by_index(Index::NodeName, name).iter().map(|p| (**p).clone()).collect();
                    actions.extend(l.evict(node, &bound, now).actions);
                }
            }
            if !actions.is_empty() {
                let reconciled = Reconciled { actions, requeue_after: None };
                if let Err(e) = drive(&ctx, "nodelifecycle", started, reconciled, |_, _| {}).await {
                    tracing::debug!(error = %e, "node lifecycle pass failed; next pass retries");
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(NODE_MONITOR_PERIOD) => {}
            }
        }
    });
}

/// Calls `f` with every change of an informer until `shutdown`. A lagging
/// subscriber misses some: fine for heartbeats, whose next change comes.
fn for_each_change<K: skiff_client::runtime::api::Resource>(
    mut subscription: Subscription<K>,
    shutdown: &Shutdown,
    f: impl Fn(Change<K>) + Send + 'static,
) {
    let stop = shutdown.clone();
    shutdown.spawn(async move {
        loop {
            let next = tokio::select! {
                _ = stop.cancelled() => return,
                n = subscription.recv() => n,
            };
            match next {
                Some(Notification::Changed(change)) => f(change),
                Some(Notification::Resync) => {}
                None => return,
            }
        }
    });
}
