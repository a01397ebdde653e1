//! The controller runner: informers feed keys into a [`WorkQueue`], and
//! workers hand each key to a reconcile function, which says what to do
//! next (kube-runtime's `Controller`, client-go's controller loop).
//!
//! ```text
//! primary informer ---- key of the object -----------\
//! owned informers ----- key of the controller owner --+--> WorkQueue --> N workers --> reconcile(Request, ctx)
//! watched informers --- keys from a mapper ----------/        ^                          |
//!                                                             \---- requeue / back-off --/
//! ```
//!
//! The queue guarantees a key is never reconciled twice at once and that a
//! change during a reconcile is reconciled again afterwards. The reconcile
//! reads the object from the primary store at dequeue time, so it always
//! sees the latest state, and sees `None` once the object is gone.
//! Workers start once every informer's first list is in (client-go's
//! `WaitForCacheSync`).

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use skiff_shutdown::Shutdown;
use tokio::time::Instant;

use super::api::Resource;
use super::informer::{Informer, Notification, Subscription};
use super::queue::{QueueConfig, WorkQueue};
use super::reflector::{ObjectKey, Store};

/// What a reconcile asks for next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReconcileAction {
    /// Reconcile the key again after this long (also on any change before).
    RequeueAfter(Duration),
    /// Nothing to do until something changes.
    AwaitChange,
}

/// One reconcile's input: the key, and the primary object as the cache
/// holds it now (`None`: it is gone, clean up after it).
#[derive(Debug)]
pub struct Request<K> {
    /// Which object.
    pub key: ObjectKey,
    /// The object from the primary store, if it still exists.
    pub object: Option<Arc<K>>,
}

/// A controller's counters, for `/metrics`.
#[derive(Debug)]
pub struct ControllerMetrics {
    queue: WorkQueue<ObjectKey>,
    reconciles: AtomicU64,
    errors: AtomicU64,
    retries: AtomicU64,
    work_micros: AtomicU64,
}

/// The counters at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MetricsSnapshot {
    /// Keys ready to be reconciled.
    pub queue_depth: usize,
    /// Keys waiting for a requeue delay or back-off.
    pub delayed: usize,
    /// Reconciles finished (successful or not).
    pub reconciles: u64,
    /// Reconciles that returned an error.
    pub errors: u64,
    /// Keys requeued with back-off after an error.
    pub retries: u64,
    /// Time spent in reconciles, in total.
    pub work_duration: Duration,
}

impl ControllerMetrics {
    /// The counters now.
    pub fn snapshot(&self) -> MetricsSnapshot {
        MetricsSnapshot {
            queue_depth: self.queue.len(),
            delayed: self.queue.delayed_len(),
            reconciles: self.reconciles.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
            work_duration: Duration::from_micros(self.work_micros.load(Ordering::Relaxed)),
        }
    }
}

/// A task that feeds the queue from one informer until shutdown.
type Feeder = Box<dyn FnOnce(WorkQueue<ObjectKey>, Shutdown) -> BoxFuture<'static, ()> + Send>;

/// Which keys a change of a watched object concerns.
type Mapper<W> = Arc<dyn Fn(&W) -> Vec<ObjectKey> + Send + Sync>;

/// A controller of `K`, built with [`Controller::new`] and the
/// [`owns`](Controller::owns)/[`watches`](Controller::watches) builders,
/// then [`run`](Controller::run).
pub struct Controller<K> {
    store: Store<K>,
    queue: WorkQueue<ObjectKey>,
    feeders: Vec<Feeder>,
    /// Resolve once each informer's first list is in.
    synced: Vec<BoxFuture<'static, ()>>,
    metrics: Arc<ControllerMetrics>,
}

fn feeder<W: Resource>(mut changes: Subscription<W>, store: Store<W>, map: Mapper<W>, initial: bool) -> Feeder {
    Box::new(move |queue, shutdown| {
        async move {
            let enqueue = |keys: Vec<ObjectKey>| {
                let (queue, shutdown) = (queue.clone(), shutdown.clone());
                async move {
                    for key in keys {
                        tokio::select! {
                            biased;
                            _ = shutdown.cancelled() => return false,
                            added = queue.add(key) => if added.is_err() { return false },
                        }
                    }
                    true
                }
            };
            if initial {
                tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => return,
                    ready = store.wait_until_ready() => if ready.is_err() { return },
                }
                if !enqueue(store.list().iter().flat_map(|o| map(o)).collect()).await {
                    return;
                }
            }
            loop {
                let notification = tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => return,
                    n = changes.recv() => n,
                };
                let keys = match notification {
                    Some(Notification::Changed(change)) => map(change.object()),
                    Some(Notification::Resync) => store.list().iter().flat_map(|o| map(o)).collect(),
                    None => return,
                };
                if !enqueue(keys).await {
                    return;
                }
            }
        }
        .boxed()
    })
}

fn synced<W: Resource>(store: Store<W>) -> BoxFuture<'static, ()> {
    async move {
        // A writer gone before its first list only happens at shutdown,
        // which the caller watches.
        let _ = store.wait_until_ready().await;
    }
    .boxed()
}

/// The key of `child`'s controller owner of kind `K`, if it has one.
pub fn controller_owner<K: Resource, C: Resource>(child: &C) -> Option<ObjectKey> {
    let meta = child.metadata();
    let owner = meta
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true) && o.kind == K::KIND && o.api_version == K::API_VERSION)?;
    let namespaced = skiff_api::resources::by_kind(K::API_VERSION, K::KIND).is_none_or(|info| info.namespaced);
    let namespace = if namespaced { meta.namespace.clone().unwrap_or_default() } else { String::new() };
    Some(ObjectKey::new(namespace, owner.name.clone()))
}

impl<K: Resource> Controller<K> {
    /// A controller of the objects of `primary`, with the default queue.
    pub fn new(primary: &Informer<K>) -> Controller<K> {
        Controller::with_queue(primary, QueueConfig::default())
    }

    /// A controller whose work queue is configured by `config`.
    pub fn with_queue(primary: &Informer<K>, config: QueueConfig) -> Controller<K> {
        let queue = WorkQueue::new(config);
        let store = primary.store();
        let own_key: Mapper<K> = Arc::new(|obj: &K| vec![ObjectKey::of(obj)]);
        let metrics = Arc::new(ControllerMetrics {
            queue: queue.clone(),
            reconciles: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            work_micros: AtomicU64::new(0),
        });
        Controller {
            feeders: vec![feeder(primary.subscribe(), store.clone(), own_key, true)],
            synced: vec![synced(store.clone())],
            store,
            queue,
            metrics,
        }
    }

    /// Reconciles an object's controller owner (ownerReferences with
    /// `controller: true`, kind and apiVersion of `K`) when it changes.
    pub fn owns<C: Resource>(mut self, child: &Informer<C>) -> Controller<K> {
        let map: Mapper<C> = Arc::new(|obj: &C| controller_owner::<K, C>(obj).into_iter().collect());
        self.feeders.push(feeder(child.subscribe(), child.store(), map, false));
        self.synced.push(synced(child.store()));
        self
    }

    /// Reconciles the keys `mapper` returns whenever an object of
    /// `informer` changes.
    pub fn watches<W: Resource>(
        mut self,
        informer: &Informer<W>,
        mapper: impl Fn(&W) -> Vec<ObjectKey> + Send + Sync + 'static,
    ) -> Controller<K> {
        self.feeders.push(feeder(informer.subscribe(), informer.store(), Arc::new(mapper), false));
        self.synced.push(synced(informer.store()));
        self
    }

    /// The controller's counters (they stay readable after `run`).
    pub fn metrics(&self) -> Arc<ControllerMetrics> {
        self.metrics.clone()
    }

    /// The work queue, to enqueue keys by hand.
    pub fn queue(&self) -> WorkQueue<ObjectKey> {
        self.queue.clone()
    }

    /// Runs `concurrency` workers calling `reconcile` until `shutdown` is
    /// cancelled; returns once every worker has finished its current
    /// reconcile. A reconcile's error is logged and requeues the key with
    /// back-off; success forgets the key's back-off.
    pub async fn run<C, E, F, Fut>(self, reconcile: F, ctx: Arc<C>, concurrency: usize, shutdown: Shutdown)
    where
        C: Send + Sync + 'static,
        E: fmt::Display + Send + 'static,
        F: Fn(Request<K>, Arc<C>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<ReconcileAction, E>> + Send + 'static,
    {
        let Controller { store, queue, feeders, synced, metrics } = self;
        let mut tasks = Vec::new();
        for feeder in feeders {
            tasks.push(shutdown.spawn(feeder(queue.clone(), shutdown.clone())));
        }
        {
            let (queue, stop) = (queue.clone(), shutdown.clone());
            tasks.push(shutdown.spawn(async move {
                stop.cancelled().await;
                queue.shut_down();
            }));
        }
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => {}
            _ = futures::future::join_all(synced) => {}
        }
        let reconcile = Arc::new(reconcile);
        for _ in 0..concurrency.max(1) {
            let worker = worker(queue.clone(), store.clone(), reconcile.clone(), ctx.clone(), metrics.clone());
            tasks.push(shutdown.spawn(worker));
        }
        for task in tasks {
            if let Err(e) = task.await {
                tracing::error!(kind = K::KIND, error = %e, "controller task failed");
            }
        }
    }
}

async fn worker<K, C, E, F, Fut>(
    queue: WorkQueue<ObjectKey>,
    store: Store<K>,
    reconcile: Arc<F>,
    ctx: Arc<C>,
    metrics: Arc<ControllerMetrics>,
) where
    K: Resource,
    E: fmt::Display,
    F: Fn(Request<K>, Arc<C>) -> Fut,
    Fut: Future<Output = Result<ReconcileAction, E>>,
{
    while let Some(key) = queue.next().await {
        let request = Request { object: store.get(&key), key: key.clone() };
        let started = Instant::now();
        let result = reconcile(request, ctx.clone()).await;
        let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        metrics.work_micros.fetch_add(micros, Ordering::Relaxed);
        metrics.reconciles.fetch_add(1, Ordering::Relaxed);
        match result {
            Ok(ReconcileAction::AwaitChange) => queue.forget(&key),
            Ok(ReconcileAction::RequeueAfter(delay)) => {
                queue.forget(&key);
                queue.add_after(key.clone(), delay);
            }
            Err(e) => {
                metrics.errors.fetch_add(1, Ordering::Relaxed);
                metrics.retries.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(kind = K::KIND, %key, error = %e, retries = queue.requeues(&key), "reconcile failed");
                queue.add_rate_limited(key.clone());
            }
        }
        queue.done(&key);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use k8s_openapi::api::apps::v1::ReplicaSet;
    use k8s_openapi::api::core::v1::{ConfigMap, Pod};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

    use super::*;
    use crate::runtime::fake::FakeSource;
    use crate::runtime::watcher::WatcherConfig;

    fn cm(name: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta { name: Some(name.into()), namespace: Some("ns".into()), ..Default::default() },
            ..Default::default()
        }
    }

    fn informer<K: Resource>(source: &FakeSource<K>, shutdown: &Shutdown) -> Informer<K> {
        Informer::spawn(source.clone(), WatcherConfig::default(), 64, shutdown)
    }

    /// Polls `done` every 10ms of (paused) time, for at most `limit`.
    async fn must_eventually(limit: Duration, mut done: impl FnMut() -> bool) {
        let waited = tokio::time::timeout(limit, async {
            while !done() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        assert!(waited.is_ok(), "condition not reached within {limit:?}");
    }

    #[derive(Default)]
    struct Seen {
        in_flight: HashMap<ObjectKey, usize>,
        max_in_flight: usize,
        reconciles: HashMap<ObjectKey, usize>,
        /// The resourceVersion each key's last reconcile saw (None: gone).
        last: HashMap<ObjectKey, Option<String>>,
    }

    type Shared = Arc<Mutex<Seen>>;

    async fn record(request: Request<ConfigMap>, seen: Shared, work: Duration) {
        {
            let mut s = seen.lock().unwrap();
            let n = s.in_flight.entry(request.key.clone()).or_default();
            *n += 1;
            let n = *n;
            s.max_in_flight = s.max_in_flight.max(n);
        }
        tokio::time::sleep(work).await;
        let mut s = seen.lock().unwrap();
        *s.in_flight.get_mut(&request.key).unwrap() -= 1;
        *s.reconciles.entry(request.key.clone()).or_default() += 1;
        s.last.insert(request.key, request.object.map(|o| o.metadata.resource_version.clone().unwrap_or_default()));
    }

    #[tokio::test(start_paused = true)]
    async fn the_same_key_is_never_reconciled_concurrently_and_its_last_change_is_seen() {
        let shutdown = Shutdown::new();
        let source = FakeSource::new(vec![cm("a"), cm("b")]);
        let controller = Controller::new(&informer(&source, &shutdown));
        let seen = Shared::default();
        let run = tokio::spawn(controller.run(
            |request, seen: Shared| async move {
                record(request, seen, Duration::from_millis(100)).await;
                Ok::<_, String>(ReconcileAction::AwaitChange)
            },
            seen.clone(),
            4,
            shutdown.clone(),
        ));
        let mut latest = String::new();
        for _ in 0..30 {
            latest = source.apply(cm("a")).metadata.resource_version.unwrap();
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
        let key = ObjectKey::new("ns", "a");
        must_eventually(Duration::from_secs(10), || {
            seen.lock().unwrap().last.get(&key).cloned().flatten().as_deref() == Some(latest.as_str())
        })
        .await;
        let (max_in_flight, n) = {
            let s = seen.lock().unwrap();
            (s.max_in_flight, s.reconciles[&key])
        };
        assert_eq!(max_in_flight, 1);
        // Coalesced: far fewer reconciles than changes, but more than one.
        assert!((2..30).contains(&n), "{n} reconciles");
        shutdown.stop().await;
        run.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_with_failing_reconciles_does_not_deadlock() {
        let shutdown = Shutdown::new();
        let source = FakeSource::new((0..40).map(|i| cm(&format!("c{i}"))).collect());
        let config = QueueConfig { capacity: 2, ..Default::default() };
        let controller = Controller::with_queue(&informer(&source, &shutdown), config);
        let metrics = controller.metrics();
        let attempts = Arc::new(Mutex::new(HashMap::<ObjectKey, usize>::new()));
        let run = tokio::spawn(controller.run(
            |request: Request<ConfigMap>, attempts: Arc<Mutex<HashMap<ObjectKey, usize>>>| async move {
                let n = {
                    let mut a = attempts.lock().unwrap();
                    let n = a.entry(request.key).or_default();
                    *n += 1;
                    *n
                };
                tokio::time::sleep(Duration::from_millis(1)).await;
                // Every key fails twice before it succeeds.
                if n <= 2 {
                    Err("not yet")
                } else {
                    Ok(ReconcileAction::AwaitChange)
                }
            },
            attempts.clone(),
            2,
            shutdown.clone(),
        ));
        // Meanwhile changes keep arriving for every object.
        for i in 0..40 {
            source.apply(cm(&format!("c{i}")));
        }
        must_eventually(Duration::from_secs(60), || {
            let a = attempts.lock().unwrap();
            a.len() == 40 && a.values().all(|n| *n >= 3)
        })
        .await;
        let m = metrics.snapshot();
        assert!(m.errors >= 80, "{m:?}");
        assert_eq!(m.retries, m.errors);
        assert!(m.reconciles >= 120);
        shutdown.stop().await;
        run.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_deleted_primary_is_reconciled_with_its_key_only() {
        let shutdown = Shutdown::new();
        let source = FakeSource::new(vec![cm("a")]);
        let controller = Controller::new(&informer(&source, &shutdown));
        let seen = Shared::default();
        let run = tokio::spawn(controller.run(
            |request, seen: Shared| async move {
                record(request, seen, Duration::ZERO).await;
                Ok::<_, String>(ReconcileAction::AwaitChange)
            },
            seen.clone(),
            1,
            shutdown.clone(),
        ));
        let key = ObjectKey::new("ns", "a");
        must_eventually(Duration::from_secs(5), || seen.lock().unwrap().reconciles.get(&key) == Some(&1)).await;
        source.delete("ns", "a");
        must_eventually(Duration::from_secs(5), || seen.lock().unwrap().reconciles.get(&key) == Some(&2)).await;
        assert_eq!(seen.lock().unwrap().last[&key], None);
        shutdown.stop().await;
        run.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn requeue_after_reconciles_again_without_a_change() {
        let shutdown = Shutdown::new();
        let source = FakeSource::new(vec![cm("a")]);
        let controller = Controller::new(&informer(&source, &shutdown));
        let seen = Shared::default();
        let run = tokio::spawn(controller.run(
            |request, seen: Shared| async move {
                record(request, seen, Duration::ZERO).await;
                Ok::<_, String>(ReconcileAction::RequeueAfter(Duration::from_secs(30)))
            },
            seen.clone(),
            1,
            shutdown.clone(),
        ));
        let start = Instant::now();
        let key = ObjectKey::new("ns", "a");
        must_eventually(Duration::from_secs(100), || seen.lock().unwrap().reconciles.get(&key) == Some(&3)).await;
        let elapsed = start.elapsed();
        assert!(elapsed >= Duration::from_secs(60) && elapsed < Duration::from_secs(61), "{elapsed:?}");
        shutdown.stop().await;
        run.await.unwrap();
    }

    fn owned_pod(name: &str, owner: &str, controller: bool) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                owner_references: Some(vec![OwnerReference {
                    api_version: "apps/v1".into(),
                    kind: "ReplicaSet".into(),
                    name: owner.into(),
                    uid: format!("uid-{owner}"),
                    controller: Some(controller),
                    ..Default::default()
                }]),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn a_child_maps_to_its_controller_owner_only() {
        assert_eq!(
            controller_owner::<ReplicaSet, Pod>(&owned_pod("p", "rs1", true)),
            Some(ObjectKey::new("ns", "rs1"))
        );
        assert_eq!(controller_owner::<ReplicaSet, Pod>(&owned_pod("p", "rs1", false)), None);
        assert_eq!(controller_owner::<ConfigMap, Pod>(&owned_pod("p", "rs1", true)), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_of_an_owned_object_reconciles_its_owner() {
        let shutdown = Shutdown::new();
        let rs = ReplicaSet {
            metadata: ObjectMeta { name: Some("rs1".into()), namespace: Some("ns".into()), ..Default::default() },
            ..Default::default()
        };
        let sets = FakeSource::new(vec![rs]);
        let pods = FakeSource::new(Vec::<Pod>::new());
        let controller = Controller::new(&informer(&sets, &shutdown)).owns(&informer(&pods, &shutdown));
        let keys = Arc::new(Mutex::new(Vec::<ObjectKey>::new()));
        let run = tokio::spawn(controller.run(
            |request: Request<ReplicaSet>, keys: Arc<Mutex<Vec<ObjectKey>>>| async move {
                keys.lock().unwrap().push(request.key);
                Ok::<_, String>(ReconcileAction::AwaitChange)
            },
            keys.clone(),
            1,
            shutdown.clone(),
        ));
        must_eventually(Duration::from_secs(5), || keys.lock().unwrap().len() == 1).await;
        pods.apply(owned_pod("p1", "rs1", true));
        must_eventually(Duration::from_secs(5), || keys.lock().unwrap().len() == 2).await;
        assert_eq!(keys.lock().unwrap()[1], ObjectKey::new("ns", "rs1"));
        shutdown.stop().await;
        run.await.unwrap();
    }
}
