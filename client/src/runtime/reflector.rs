//! The reflector: a watcher's events kept as an in-memory cache. One
//! [`Writer`] applies the events; any number of cheap, cloneable,
//! read-only [`Store`]s read the cache (client-go's Indexer, kube-runtime's
//! `reflector::store`).
//!
//! Objects are shared as `Arc<K>` keyed by [`ObjectKey`] (namespace/name)
//! and indexed by namespace, controller-owner uid, node name (pods) and
//! label `key=value` ([`Index`]). A store is ready once the first list is
//! in. A relist is applied atomically at `InitDone`: readers see the old
//! content or the new, never a half-filled cache, and objects that vanished
//! while the watch was down come out as [`Change::Deleted`].
//!
//! Locking: one `std::sync::RwLock`, never held across an `.await`.

use std::any::Any;
use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::watch;

use super::api::Resource;
use super::watcher::Event;

/// Which object: namespace ("" for cluster-scoped) and name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// "" for cluster-scoped objects.
    pub namespace: String,
    /// The object's name.
    pub name: String,
}

impl ObjectKey {
    /// The key `namespace/name`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> ObjectKey {
        ObjectKey { namespace: namespace.into(), name: name.into() }
    }

    /// The key of `obj`.
    pub fn of<K: Resource>(obj: &K) -> ObjectKey {
        let meta = obj.metadata();
        ObjectKey::new(meta.namespace.clone().unwrap_or_default(), meta.name.clone().unwrap_or_default())
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            f.write_str(&self.name)
        } else {
            write!(f, "{}/{}", self.namespace, self.name)
        }
    }
}

/// The indexes every store keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Index {
    /// `metadata.namespace`.
    Namespace,
    /// The uid of every owner in `metadata.ownerReferences`.
    OwnerUid,
    /// `spec.nodeName` of pods (other types are not in this index).
    NodeName,
    /// Every label as `key=value`.
    Label,
}

const INDEXES: [Index; 4] = [Index::Namespace, Index::OwnerUid, Index::NodeName, Index::Label];

impl Index {
    fn slot(self) -> usize {
        self as usize
    }

    /// The values `obj` is filed under in this index.
    pub fn values<K: Resource>(self, obj: &K) -> Vec<String> {
        let meta = obj.metadata();
        match self {
            Index::Namespace => meta.namespace.iter().filter(|ns| !ns.is_empty()).cloned().collect(),
            Index::OwnerUid => meta.owner_references.iter().flatten().map(|o| o.uid.clone()).collect(),
            Index::NodeName => (obj as &dyn Any)
                .downcast_ref::<Pod>()
                .and_then(|pod| pod.spec.as_ref()?.node_name.clone())
                .filter(|n| !n.is_empty())
                .into_iter()
                .collect(),
            Index::Label => meta.labels.iter().flatten().map(|(k, v)| format!("{k}={v}")).collect(),
        }
    }
}

/// A change of the cache, as the writer tells subscribers.
#[derive(Debug)]
pub enum Change<K> {
    /// The object was added or changed (its new state).
    Applied(Arc<K>),
    /// The object is gone (its last known state).
    Deleted(Arc<K>),
}

impl<K> Clone for Change<K> {
    fn clone(&self) -> Self {
        match self {
            Change::Applied(o) => Change::Applied(o.clone()),
            Change::Deleted(o) => Change::Deleted(o.clone()),
        }
    }
}

impl<K> Change<K> {
    /// The object the change is about.
    pub fn object(&self) -> &Arc<K> {
        match self {
            Change::Applied(o) | Change::Deleted(o) => o,
        }
    }
}

struct Cache<K> {
    objects: HashMap<ObjectKey, Arc<K>>,
    /// Per [`Index`] slot: value -> keys of the objects filed under it.
    indexes: [HashMap<String, BTreeSet<ObjectKey>>; 4],
}

impl<K: Resource> Cache<K> {
    fn new() -> Cache<K> {
        Cache { objects: HashMap::new(), indexes: Default::default() }
    }

    fn file(&mut self, key: &ObjectKey, obj: &K) {
        for index in INDEXES {
            for value in index.values(obj) {
                self.indexes[index.slot()].entry(value).or_default().insert(key.clone());
            }
        }
    }

    fn unfile(&mut self, key: &ObjectKey, obj: &K) {
        for index in INDEXES {
            for value in index.values(obj) {
                let slot = &mut self.indexes[index.slot()];
                if let Some(keys) = slot.get_mut(&value) {
                    keys.remove(key);
                    if keys.is_empty() {
                        slot.remove(&value);
                    }
                }
            }
        }
    }

    fn insert(&mut self, key: ObjectKey, obj: Arc<K>) {
        if let Some(old) = self.objects.remove(&key) {
            self.unfile(&key, &old);
        }
        self.file(&key, &obj);
        self.objects.insert(key, obj);
    }

    fn remove(&mut self, key: &ObjectKey) -> Option<Arc<K>> {
        let old = self.objects.remove(key)?;
        self.unfile(key, &old);
        Some(old)
    }
}

fn resource_version<K: Resource>(obj: &K) -> Option<&str> {
    obj.metadata().resource_version.as_deref()
}

/// The only writer of a cache.
pub struct Writer<K> {
    cache: Arc<RwLock<Cache<K>>>,
    ready: watch::Sender<bool>,
    /// While a (re)list is in progress: the objects it returned so far.
    relist: Option<HashMap<ObjectKey, Arc<K>>>,
}

impl<K: Resource> Default for Writer<K> {
    fn default() -> Self {
        Writer::new()
    }
}

impl<K: Resource> Writer<K> {
    /// An empty cache, not ready.
    pub fn new() -> Writer<K> {
        Writer { cache: Arc::new(RwLock::new(Cache::new())), ready: watch::channel(false).0, relist: None }
    }

    /// A reader of this cache.
    pub fn store(&self) -> Store<K> {
        Store { cache: self.cache.clone(), ready: self.ready.subscribe() }
    }

    fn write(&self) -> RwLockWriteGuard<'_, Cache<K>> {
        self.cache.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies one watcher event and returns what changed in the cache.
    pub fn apply(&mut self, event: Event<K>) -> Vec<Change<K>> {
        match event {
            Event::Init => {
                self.relist = Some(HashMap::new());
                Vec::new()
            }
            Event::InitApply(obj) => {
                self.relist.get_or_insert_with(HashMap::new).insert(ObjectKey::of(&obj), Arc::new(obj));
                Vec::new()
            }
            Event::InitDone => {
                let listed = self.relist.take().unwrap_or_default();
                let changes = self.replace(listed);
                self.ready.send_replace(true);
                changes
            }
            Event::Apply(obj) => {
                let obj = Arc::new(obj);
                self.write().insert(ObjectKey::of(&*obj), obj.clone());
                vec![Change::Applied(obj)]
            }
            Event::Delete(obj) => {
                let key = ObjectKey::of(&obj);
                self.write().remove(&key);
                vec![Change::Deleted(Arc::new(obj))]
            }
        }
    }

    /// Swaps in a complete list; returns the objects that appeared or
    /// changed, and those that are gone.
    fn replace(&mut self, listed: HashMap<ObjectKey, Arc<K>>) -> Vec<Change<K>> {
        let mut fresh = Cache::new();
        for (key, obj) in &listed {
            fresh.insert(key.clone(), obj.clone());
        }
        let old = std::mem::replace(&mut *self.write(), fresh);
        let mut changes: Vec<Change<K>> = old
            .objects
            .iter()
            .filter(|(key, _)| !listed.contains_key(key))
            .map(|(_, obj)| Change::Deleted(obj.clone()))
            .collect();
        for (key, obj) in &listed {
            let same = old.objects.get(key).is_some_and(|o| resource_version(&**o) == resource_version(&**obj));
            if !same {
                changes.push(Change::Applied(obj.clone()));
            }
        }
        changes
    }
}

/// The writer was dropped before the cache became ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the cache's writer stopped before its first list")]
pub struct WriterDropped;

/// A read-only view of a cache; clones share it.
pub struct Store<K> {
    cache: Arc<RwLock<Cache<K>>>,
    ready: watch::Receiver<bool>,
}

impl<K> Clone for Store<K> {
    fn clone(&self) -> Self {
        Store { cache: self.cache.clone(), ready: self.ready.clone() }
    }
}

impl<K: Resource> Store<K> {
    fn read(&self) -> RwLockReadGuard<'_, Cache<K>> {
        self.cache.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The object under `key`.
    pub fn get(&self, key: &ObjectKey) -> Option<Arc<K>> {
        self.read().objects.get(key).cloned()
    }

    /// The object `namespace/name`.
    pub fn get_named(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        self.get(&ObjectKey::new(namespace, name))
    }

    /// Every object, in no particular order.
    pub fn list(&self) -> Vec<Arc<K>> {
        self.read().objects.values().cloned().collect()
    }

    /// Every key, sorted.
    pub fn keys(&self) -> Vec<ObjectKey> {
        let mut keys: Vec<ObjectKey> = self.read().objects.keys().cloned().collect();
        keys.sort();
        keys
    }

    /// The objects filed under `value` in `index`, ordered by key
    /// (`by_index(Index::Label, "app=web")`, `by_index(Index::NodeName, "n1")`).
    pub fn by_index(&self, index: Index, value: &str) -> Vec<Arc<K>> {
        let cache = self.read();
        cache.indexes[index.slot()]
            .get(value)
            .into_iter()
            .flatten()
            .filter_map(|key| cache.objects.get(key).cloned())
            .collect()
    }

    /// How many objects the cache holds.
    pub fn len(&self) -> usize {
        self.read().objects.len()
    }

    /// Whether the cache holds no object.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the first list is in.
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Waits until the first list is in.
    pub async fn wait_until_ready(&self) -> Result<(), WriterDropped> {
        let mut ready = self.ready.clone();
        ready.wait_for(|r| *r).await.map(|_| ()).map_err(|_| WriterDropped)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::PodSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

    use super::*;

    fn pod(name: &str, rv: &str, node: &str, owner: &str, app: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                resource_version: Some(rv.into()),
                labels: Some(BTreeMap::from([("app".to_string(), app.to_string())])),
                owner_references: Some(vec![OwnerReference {
                    uid: owner.into(),
                    kind: "ReplicaSet".into(),
                    name: owner.into(),
                    api_version: "apps/v1".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            },
            spec: Some(PodSpec { node_name: Some(node.into()), ..Default::default() }),
            ..Default::default()
        }
    }

    fn names(objects: &[Arc<Pod>]) -> Vec<String> {
        let mut names: Vec<String> = objects.iter().map(|p| p.metadata.name.clone().unwrap_or_default()).collect();
        names.sort();
        names
    }

    fn describe(changes: &[Change<Pod>]) -> Vec<String> {
        let mut out: Vec<String> = changes
            .iter()
            .map(|c| match c {
                Change::Applied(p) => format!("applied {}", p.metadata.name.as_deref().unwrap_or("")),
                Change::Deleted(p) => format!("deleted {}", p.metadata.name.as_deref().unwrap_or("")),
            })
            .collect();
        out.sort();
        out
    }

    #[tokio::test]
    async fn a_store_is_ready_after_the_first_init_done_and_not_before() {
        let mut writer = Writer::new();
        let store = writer.store();
        writer.apply(Event::Init);
        writer.apply(Event::InitApply(pod("a", "1", "n1", "rs1", "web")));
        assert!(!store.is_ready());
        assert!(store.is_empty(), "a list in progress is not visible");
        let changes = writer.apply(Event::InitDone);
        assert!(store.is_ready());
        store.wait_until_ready().await.unwrap();
        assert_eq!(describe(&changes), ["applied a"]);
        assert_eq!(store.get_named("ns", "a").unwrap().metadata.resource_version.as_deref(), Some("1"));
    }

    #[tokio::test]
    async fn waiting_on_a_store_whose_writer_is_gone_fails() {
        let writer = Writer::<Pod>::new();
        let store = writer.store();
        drop(writer);
        assert_eq!(store.wait_until_ready().await, Err(WriterDropped));
    }

    #[test]
    fn indexes_follow_updates_and_deletes() {
        let mut writer = Writer::new();
        let store = writer.store();
        writer.apply(Event::Apply(pod("a", "1", "n1", "rs1", "web")));
        writer.apply(Event::Apply(pod("b", "2", "n1", "rs2", "db")));
        assert_eq!(names(&store.by_index(Index::NodeName, "n1")), ["a", "b"]);
        assert_eq!(names(&store.by_index(Index::OwnerUid, "rs1")), ["a"]);
        assert_eq!(names(&store.by_index(Index::Label, "app=db")), ["b"]);
        assert_eq!(names(&store.by_index(Index::Namespace, "ns")), ["a", "b"]);
        // a moves to another node and app; b is deleted.
        writer.apply(Event::Apply(pod("a", "3", "n2", "rs1", "db")));
        writer.apply(Event::Delete(pod("b", "4", "n1", "rs2", "db")));
        assert!(store.by_index(Index::NodeName, "n1").is_empty());
        assert_eq!(names(&store.by_index(Index::NodeName, "n2")), ["a"]);
        assert_eq!(names(&store.by_index(Index::Label, "app=db")), ["a"]);
        assert!(store.by_index(Index::Label, "app=web").is_empty());
        assert!(store.by_index(Index::OwnerUid, "rs2").is_empty());
        assert_eq!(store.keys(), [ObjectKey::new("ns", "a")]);
    }

    #[test]
    fn a_relist_replaces_the_content_and_reports_what_vanished_meanwhile() {
        let mut writer = Writer::new();
        let store = writer.store();
        for event in [
            Event::Init,
            Event::InitApply(pod("a", "1", "n1", "rs1", "web")),
            Event::InitApply(pod("b", "2", "n1", "rs1", "web")),
            Event::InitApply(pod("c", "3", "n1", "rs1", "web")),
            Event::InitDone,
        ] {
            writer.apply(event);
        }
        // During a disconnect b was deleted, c changed and d appeared.
        writer.apply(Event::Init);
        writer.apply(Event::InitApply(pod("a", "1", "n1", "rs1", "web")));
        writer.apply(Event::InitApply(pod("c", "5", "n2", "rs1", "web")));
        writer.apply(Event::InitApply(pod("d", "6", "n1", "rs1", "web")));
        // Until InitDone readers still see the old content.
        assert_eq!(names(&store.list()), ["a", "b", "c"]);
        let changes = writer.apply(Event::InitDone);
        assert_eq!(describe(&changes), ["applied c", "applied d", "deleted b"]);
        assert_eq!(names(&store.list()), ["a", "c", "d"]);
        assert_eq!(names(&store.by_index(Index::NodeName, "n1")), ["a", "d"]);
    }

    #[test]
    fn keys_print_as_namespace_slash_name() {
        assert_eq!(ObjectKey::new("ns", "a").to_string(), "ns/a");
        assert_eq!(ObjectKey::new("", "node-1").to_string(), "node-1");
    }
}
