//! Shared informers: one watcher and one cache per resource type per
//! process, however many controllers read it (client-go's
//! SharedInformerFactory).
//!
//! [`Informers`] starts an [`Informer`] the first time a type is asked
//! for, on the process's [`Shutdown`]; later calls get the same one. An
//! informer's task runs the [`watcher`], applies its events to the cache's
//! [`Writer`] and broadcasts every [`Change`] on a bounded channel. A
//! subscriber that falls more than the channel's capacity behind is not
//! waited for: it gets [`Notification::Resync`] and should re-read the
//! store, as client-go's resync would.
//!
//! Informers cache objects without `metadata.managedFields`, as
//! kube-scheduler's and kube-controller-manager's do (client-go's
//! `TransformStripManagedFields`): no component reads them, a write
//! without them keeps the live ones, and they are a large share of an
//! object's bytes (about 45% of a server-side-applied pod's JSON).

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use skiff_shutdown::Shutdown;
use tokio::sync::broadcast;

use super::api::{Api, ListWatch, Resource};
use super::reflector::{Change, Store, Writer};
use super::watcher::{watcher, Event, WatcherConfig};
use crate::resources::Client;

/// Changes an informer buffers for each subscriber before that subscriber
/// is told to resync instead.
pub const DEFAULT_SUBSCRIBER_CAPACITY: usize = 1024;

/// What a subscriber hears.
#[derive(Debug)]
pub enum Notification<K> {
    /// One change of the cache.
    Changed(Change<K>),
    /// The subscriber fell behind and missed changes: re-read the store.
    Resync,
}

/// A subscriber's end of an informer's change broadcast.
pub struct Subscription<K> {
    changes: broadcast::Receiver<Change<K>>,
}

impl<K: Clone> Subscription<K> {
    /// The next notification; `None` once the informer is gone.
    pub async fn recv(&mut self) -> Option<Notification<K>> {
        match self.changes.recv().await {
            Ok(change) => Some(Notification::Changed(change)),
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                tracing::debug!(missed, "informer subscriber lagged; resync");
                Some(Notification::Resync)
            }
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }
}

/// A running watch of one resource type: its cache and its changes.
pub struct Informer<K> {
    store: Store<K>,
    changes: broadcast::Sender<Change<K>>,
}

impl<K> Clone for Informer<K> {
    fn clone(&self) -> Self {
        Informer { store: self.store.clone(), changes: self.changes.clone() }
    }
}

impl<K: Resource> Informer<K> {
    /// Starts watching `source` on `shutdown`; the task ends when the
    /// shutdown is cancelled. `capacity`: changes buffered per subscriber.
    pub fn spawn<S: ListWatch<K>>(
        source: S,
        config: WatcherConfig,
        capacity: usize,
        shutdown: &Shutdown,
    ) -> Informer<K> {
        let mut writer = Writer::new();
        let store = writer.store();
        let (changes, _) = broadcast::channel(capacity.max(1));
        let (tx, stop) = (changes.clone(), shutdown.clone());
        shutdown.spawn(async move {
            let events = watcher(source, config);
            futures::pin_mut!(events);
            loop {
                let event = tokio::select! {
                    biased;
                    _ = stop.cancelled() => break,
                    event = events.next() => event,
                };
                match event {
                    Some(Ok(event)) => {
                        for change in writer.apply(without_managed_fields(event)) {
                            // No subscriber yet is fine: the store has it.
                            let _ = tx.send(change);
                        }
                    }
                    Some(Err(e)) => tracing::warn!(kind = K::KIND, error = %e, "informer watch error"),
                    None => break,
                }
            }
        });
        Informer { store, changes }
    }

    /// The cache (read-only; cheap to clone).
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// A new subscriber of the changes from now on. Subscribe before
    /// reading the store to miss nothing.
    pub fn subscribe(&self) -> Subscription<K> {
        Subscription { changes: self.changes.subscribe() }
    }
}

/// The event with its object's `metadata.managedFields` dropped.
fn without_managed_fields<K: Resource>(event: Event<K>) -> Event<K> {
    let strip = |mut obj: K| {
        obj.metadata_mut().managed_fields = None;
        obj
    };
    match event {
        Event::InitApply(obj) => Event::InitApply(strip(obj)),
        Event::Apply(obj) => Event::Apply(strip(obj)),
        Event::Delete(obj) => Event::Delete(strip(obj)),
        other => other,
    }
}

/// `TypeId` of `K`, label selector, field selector.
type InformerKey = (TypeId, String, String);

/// The process's informers, one per resource type; clones share them.
#[derive(Clone)]
pub struct Informers {
    client: Client,
    shutdown: Shutdown,
    capacity: usize,
    /// Which informer -> `Informer<K>`.
    started: Arc<Mutex<HashMap<InformerKey, Box<dyn Any + Send + Sync>>>>,
}

impl Informers {
    /// Informers of `client`'s cluster whose watches run until `shutdown`.
    pub fn new(client: Client, shutdown: Shutdown) -> Informers {
        Informers::with_capacity(client, shutdown, DEFAULT_SUBSCRIBER_CAPACITY)
    }

    /// [`Informers::new`] buffering `capacity` changes per subscriber.
    pub fn with_capacity(client: Client, shutdown: Shutdown, capacity: usize) -> Informers {
        Informers { client, shutdown, capacity, started: Arc::default() }
    }

    /// The informer of `K` over all namespaces, started on first use.
    pub fn informer<K: Resource>(&self) -> Informer<K> {
        self.informer_with(WatcherConfig::default())
    }

    /// The informer of the `K`s `config`'s selectors pick (the node agent's
    /// `spec.nodeName=<node>` pods), started on first use; one per type and
    /// selector pair.
    pub fn informer_with<K: Resource>(&self, config: WatcherConfig) -> Informer<K> {
        let key = (TypeId::of::<K>(), config.label_selector.clone(), config.field_selector.clone());
        let mut started = self.started.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(informer) = started.get(&key).and_then(|i| i.downcast_ref::<Informer<K>>()) {
            return informer.clone();
        }
        let informer = Informer::spawn(Api::<K>::all(self.client.clone()), config, self.capacity, &self.shutdown);
        started.insert(key, Box::new(informer.clone()));
        informer
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ConfigMap, Pod};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::runtime::fake::FakeSource;
    use crate::runtime::reflector::ObjectKey;

    fn cm(name: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta { name: Some(name.into()), namespace: Some("ns".into()), ..Default::default() },
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn an_informer_fills_its_store_and_tells_subscribers_of_changes() {
        let shutdown = Shutdown::new();
        let source = FakeSource::new(vec![cm("a")]);
        let informer = Informer::spawn(source.clone(), WatcherConfig::default(), 16, &shutdown);
        let mut sub = informer.subscribe();
        informer.store().wait_until_ready().await.unwrap();
        assert!(informer.store().get(&ObjectKey::new("ns", "a")).is_some());
        // The first list's object, then a new one.
        assert!(matches!(sub.recv().await, Some(Notification::Changed(Change::Applied(_)))));
        source.apply(cm("b"));
        match sub.recv().await {
            Some(Notification::Changed(Change::Applied(obj))) => assert_eq!(obj.metadata.name.as_deref(), Some("b")),
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(informer.store().len(), 2);
        shutdown.stop().await;
    }

    #[tokio::test]
    async fn informers_cache_objects_without_managed_fields() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
        let managed = |name: &str| {
            let mut obj = cm(name);
            obj.metadata.managed_fields =
                Some(vec![ManagedFieldsEntry { manager: Some("kubectl".into()), ..Default::default() }]);
            obj
        };
        let shutdown = Shutdown::new();
        let source = FakeSource::new(vec![managed("listed")]);
        let informer = Informer::spawn(source.clone(), WatcherConfig::default(), 16, &shutdown);
        let mut sub = informer.subscribe();
        informer.store().wait_until_ready().await.unwrap();
        assert!(matches!(sub.recv().await, Some(Notification::Changed(Change::Applied(_)))));
        source.apply(managed("watched"));
        match sub.recv().await {
            Some(Notification::Changed(Change::Applied(obj))) => assert_eq!(obj.metadata.managed_fields, None),
            other => panic!("unexpected {other:?}"),
        }
        for name in ["listed", "watched"] {
            let cached = informer.store().get(&ObjectKey::new("ns", name)).expect("cached");
            assert_eq!(cached.metadata.managed_fields, None, "{name}");
            assert_eq!(cached.metadata.name.as_deref(), Some(name));
        }
        shutdown.stop().await;
    }

    #[tokio::test]
    async fn a_lagging_subscriber_gets_a_resync_and_never_blocks_the_writer() {
        let shutdown = Shutdown::new();
        let source = FakeSource::<ConfigMap>::new(Vec::new());
        let informer = Informer::spawn(source.clone(), WatcherConfig::default(), 4, &shutdown);
        let store = informer.store();
        store.wait_until_ready().await.unwrap();
        let mut sub = informer.subscribe();
        for i in 0..20 {
            source.apply(cm(&format!("c{i}")));
        }
        // The writer went on without the subscriber.
        while store.len() < 20 {
            tokio::task::yield_now().await;
        }
        assert!(matches!(sub.recv().await, Some(Notification::Resync)));
        // After the resync the subscriber hears the newest changes again.
        assert!(matches!(sub.recv().await, Some(Notification::Changed(_))));
        shutdown.stop().await;
    }

    #[tokio::test]
    async fn informers_start_one_watch_per_type() {
        let shutdown = Shutdown::new();
        let informers = Informers::new(Client::new(&["127.0.0.1:1"]).unwrap(), shutdown.clone());
        let first = informers.informer::<Pod>();
        let second = informers.informer::<Pod>();
        let _other = informers.informer::<ConfigMap>();
        let selected = WatcherConfig { field_selector: "spec.nodeName=n1".into(), ..Default::default() };
        let on_node = informers.informer_with::<Pod>(selected.clone());
        assert!(first.changes.same_channel(&second.changes));
        assert!(!first.changes.same_channel(&on_node.changes));
        assert!(on_node.changes.same_channel(&informers.informer_with::<Pod>(selected).changes));
        assert_eq!(shutdown.running(), 3);
        assert!(!first.store().is_ready());
        shutdown.stop().await;
    }
}
