//! An in-memory [`ListWatch`] source with a change log, for tests of the
//! watcher, reflector, informers and controllers (here and in crates built
//! on them) without an apiserver.
//!
//! It keeps objects and every change with a resourceVersion, so a watch
//! from an old revision replays what followed it, a watch from before the
//! compacted point fails with `Expired`, and tests can break watches
//! (disconnect, expire) or make the next lists and watches fail.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use skiff_api::{ApiError, Reason};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::api::{ListParams, ListWatch, ObjectList, Resource, WatchEvent, WatchParams, WatchStream};
use crate::resources::ClientError;

/// An in-memory list/watch source; clones share it.
pub struct FakeSource<K> {
    inner: Arc<Mutex<Fake<K>>>,
}

impl<K> Clone for FakeSource<K> {
    fn clone(&self) -> Self {
        FakeSource { inner: self.inner.clone() }
    }
}

struct Fake<K> {
    objects: BTreeMap<(String, String), K>,
    revision: u64,
    /// Every change, oldest first, with its revision.
    log: Vec<(u64, WatchEvent<K>)>,
    /// Watches from before this revision fail with `Expired`.
    compacted: u64,
    watchers: Vec<mpsc::Sender<Result<WatchEvent<K>, ClientError>>>,
    list_failures: VecDeque<ClientError>,
    watch_failures: VecDeque<ClientError>,
    lists: usize,
    watch_versions: Vec<String>,
}

fn key_of<K: Resource>(obj: &K) -> (String, String) {
    let meta = obj.metadata();
    (meta.namespace.clone().unwrap_or_default(), meta.name.clone().unwrap_or_default())
}

impl<K: Resource> Default for FakeSource<K> {
    fn default() -> Self {
        FakeSource::new(Vec::new())
    }
}

impl<K: Resource> FakeSource<K> {
    /// A source holding `objects`.
    pub fn new(objects: Vec<K>) -> FakeSource<K> {
        let source = FakeSource {
            inner: Arc::new(Mutex::new(Fake {
                objects: BTreeMap::new(),
                revision: 1,
                log: Vec::new(),
                compacted: 0,
                watchers: Vec::new(),
                list_failures: VecDeque::new(),
                watch_failures: VecDeque::new(),
                lists: 0,
                watch_versions: Vec::new(),
            })),
        };
        for obj in objects {
            source.apply(obj);
        }
        source
    }

    fn lock(&self) -> MutexGuard<'_, Fake<K>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Creates or replaces `obj` (by namespace and name), giving it the next
    /// resourceVersion; returns it as stored.
    pub fn apply(&self, mut obj: K) -> K {
        let mut fake = self.lock();
        fake.revision += 1;
        obj.metadata_mut().resource_version = Some(fake.revision.to_string());
        let key = key_of(&obj);
        let event = if fake.objects.insert(key, obj.clone()).is_some() {
            WatchEvent::Modified(obj.clone())
        } else {
            WatchEvent::Added(obj.clone())
        };
        fake.publish(event);
        obj
    }

    /// Deletes the object `namespace/name`, if present.
    pub fn delete(&self, namespace: &str, name: &str) {
        let mut fake = self.lock();
        if let Some(mut obj) = fake.objects.remove(&(namespace.to_string(), name.to_string())) {
            fake.revision += 1;
            obj.metadata_mut().resource_version = Some(fake.revision.to_string());
            fake.publish(WatchEvent::Deleted(obj));
        }
    }

    /// Moves the revision on as changes this source does not show would
    /// (another selector's), and sends open watches a bookmark at it.
    pub fn bookmark(&self) {
        let mut fake = self.lock();
        fake.revision += 1;
        let rv = fake.revision.to_string();
        fake.watchers.retain(|w| w.try_send(Ok(WatchEvent::Bookmark(rv.clone()))).is_ok());
    }

    /// Ends every open watch as a lost connection would.
    pub fn disconnect(&self) {
        self.lock().watchers.clear();
    }

    /// Forgets the change log: open watches get `Expired` and end, and
    /// watches from any earlier revision fail with `Expired`.
    pub fn compact(&self) {
        let mut fake = self.lock();
        fake.compacted = fake.revision;
        fake.log.clear();
        for w in fake.watchers.drain(..) {
            let _ = w.try_send(Err(ClientError::Api(ApiError::expired("too old resource version"))));
        }
    }

    /// Makes the next list fail with `error`.
    pub fn fail_next_list(&self, error: ClientError) {
        self.lock().list_failures.push_back(error);
    }

    /// Makes the next watch fail to start with `error`.
    pub fn fail_next_watch(&self, error: ClientError) {
        self.lock().watch_failures.push_back(error);
    }

    /// How many list calls (pages) were made.
    pub fn lists(&self) -> usize {
        self.lock().lists
    }

    /// The resourceVersion of every watch started, in order.
    pub fn watch_versions(&self) -> Vec<String> {
        self.lock().watch_versions.clone()
    }

    /// How many watches are open.
    pub fn open_watches(&self) -> usize {
        let mut fake = self.lock();
        fake.watchers.retain(|w| !w.is_closed());
        fake.watchers.len()
    }
}

impl<K: Resource> Fake<K> {
    fn publish(&mut self, event: WatchEvent<K>) {
        let revision = self.revision;
        self.log.push((revision, event.clone()));
        self.watchers.retain(|w| w.try_send(Ok(event.clone())).is_ok());
    }
}

impl<K: Resource> ListWatch<K> for FakeSource<K> {
    fn list(&self, params: ListParams) -> BoxFuture<'_, Result<ObjectList<K>, ClientError>> {
        let result = (|| {
            let mut fake = self.lock();
            fake.lists += 1;
            if let Some(e) = fake.list_failures.pop_front() {
                return Err(e);
            }
            let start: usize = if params.continue_token.is_empty() {
                0
            } else {
                params.continue_token.parse().map_err(|_| ClientError::Api(ApiError::bad_request("bad continue")))?
            };
            let limit = if params.limit > 0 { params.limit as usize } else { usize::MAX };
            let items: Vec<K> = fake.objects.values().skip(start).take(limit).cloned().collect();
            let end = start + items.len();
            let continue_token = if end < fake.objects.len() { end.to_string() } else { String::new() };
            Ok(ObjectList { items, resource_version: fake.revision.to_string(), continue_token })
        })();
        async move { result }.boxed()
    }

    fn watch(&self, params: WatchParams) -> BoxFuture<'_, Result<WatchStream<K>, ClientError>> {
        let result = (|| {
            let mut fake = self.lock();
            fake.watch_versions.push(params.resource_version.clone());
            if let Some(e) = fake.watch_failures.pop_front() {
                return Err(e);
            }
            let from: u64 = params.resource_version.parse().unwrap_or(fake.revision);
            if from < fake.compacted {
                return Err(ClientError::Api(ApiError::new(Reason::Expired, "too old resource version")));
            }
            let (tx, rx) = mpsc::channel(1024);
            for (revision, event) in &fake.log {
                if *revision > from {
                    let _ = tx.try_send(Ok(event.clone()));
                }
            }
            fake.watchers.push(tx);
            Ok(ReceiverStream::new(rx).boxed())
        })();
        async move { result }.boxed()
    }
}
