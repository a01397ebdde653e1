//! Watch fan-out: one decoded event stream per resource type feeds every
//! watcher of that type on this member.
//!
//! A [`Feed`] per resource subscribes once to the store's hub for the
//! resource's key prefix, decodes each change once, and hands it to the
//! watchers it concerns. Watchers are indexed by namespace and by an exact
//! field (`metadata.name`, pods' `spec.nodeName`), so a node agent's watch
//! costs O(its own pods), not O(cluster). Selectors are evaluated here: an
//! object that stops matching is delivered as DELETED, one that starts
//! matching as ADDED.
//!
//! A watcher starts by catching up from RocksDB (from its resourceVersion to
//! the revision the feed had dispatched when it registered), or with a list
//! (synthetic ADDED events), then follows the feed. Each watcher has a
//! bounded queue; a watcher that lets it fill is cut off with an ERROR
//! event naming the revision to resume from, and nobody else waits for it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde_json::json;
use skiff_api::resources::{Kind, ResourceInfo};
use skiff_api::selector::{object_fields, FieldSelector, Fields, LabelSelector};
use skiff_api::{meta, ApiError, Reason};
use skiff_raft_store::types::KeyValue;
use skiff_raft_store::types::{ApplyError, RangeRequest};
use skiff_raft_store::{Changes, ChangesError, EventKind, RevisionEvents, Store, StoreError};
use skiff_shutdown::Shutdown;
use tokio::sync::mpsc;

use crate::metrics;
use crate::storage::{self, prefix_end, with_resource_version, Consistency, ObjectStore};

/// Changes queued per watcher before it is cut off as too slow.
pub const WATCHER_QUEUE: usize = 1024;
/// Events buffered between a watcher and its client connection.
const OUT_BUFFER: usize = 64;
/// How often a feed learns the store's revision when its resource is quiet.
const PROGRESS_TICK: Duration = Duration::from_secs(1);

/// The event types of the wire, shared with the client (`api::watch`).
pub use skiff_api::watch::EventType;

/// One event as sent to a client: its type and the object's JSON.
#[derive(Clone, Debug)]
pub struct WatchEvent {
    pub kind: EventType,
    pub object: Arc<Vec<u8>>,
}

impl WatchEvent {
    fn error(e: &ApiError) -> WatchEvent {
        WatchEvent { kind: EventType::Error, object: Arc::new(serde_json::to_vec(&e.to_status()).expect("status")) }
    }
}

/// What a watcher wants to see.
#[derive(Clone, Debug)]
pub struct Filter {
    pub kind: Kind,
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Filter {
    fn matches(&self, obj: &Decoded) -> bool {
        self.namespace.as_deref().is_none_or(|ns| ns == obj.namespace)
            && self.labels.matches(&obj.labels)
            && self.fields.matches(&obj.fields)
    }

    /// Where the watcher is indexed: the narrowest exact match it has.
    fn index(&self) -> Index {
        if let Some(name) = self.fields.exact("metadata.name") {
            return Index::Field("metadata.name", name.to_string());
        }
        if self.kind == Kind::Pod {
            if let Some(node) = self.fields.exact("spec.nodeName") {
                return Index::Field("spec.nodeName", node.to_string());
            }
        }
        match &self.namespace {
            Some(ns) => Index::Namespace(ns.clone()),
            None => Index::Cluster,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Index {
    Cluster,
    Namespace(String),
    Field(&'static str, String),
}

/// An object decoded once, with what filters look at.
#[derive(Debug)]
struct Decoded {
    namespace: String,
    labels: BTreeMap<String, String>,
    fields: Fields,
    /// The stored bytes with the resourceVersion of this version.
    json: Arc<Vec<u8>>,
    /// The raw stored bytes (no resourceVersion), for re-stamping.
    stored: Vec<u8>,
}

impl Decoded {
    fn new(kind: Kind, stored: &[u8], revision: i64) -> Option<Decoded> {
        // Only what filters read is built: a pod's spec and managed fields,
        // most of its bytes, are parsed past.
        let value = skiff_api::selector::selectable_parts(kind, stored).ok()?;
        Some(Decoded {
            namespace: meta::namespace(&value).unwrap_or_default().to_string(),
            labels: meta::labels(&value),
            fields: object_fields(kind, &value),
            json: Arc::new(with_resource_version(stored, revision)),
            stored: stored.to_vec(),
        })
    }

    /// Roughly the bytes it holds.
    fn size(&self) -> usize {
        self.json.len() + self.stored.len() + 64 * (self.labels.len() + self.fields.len())
    }
}

/// The decoded newest version of recently changed objects, by key: one
/// change's new version is the old version of that object's next change,
/// which would otherwise be decoded a second time. Two generations, each
/// up to half of [`RECENT_BYTES`]: when the young one is full it becomes
/// the old one and the previous old one is dropped.
#[derive(Default)]
struct Recent {
    young: HashMap<Vec<u8>, (i64, Arc<Decoded>)>,
    old: HashMap<Vec<u8>, (i64, Arc<Decoded>)>,
    young_bytes: usize,
}

/// What a feed's [`Recent`] holds at most. A scheduled pod changes twice
/// within a few hundred ms (created, then bound). At 2,000 pods/s a pod
/// feed decodes some 25 MB of versions a second (each kept as stored and
/// as sent), so 4 MiB per generation keep the newest 150-300 ms: most
/// bindings find their pod's first version. A kubelet's status write,
/// seconds later, usually decodes its old version again.
const RECENT_BYTES: usize = 8 << 20;

impl Recent {
    /// The object as decoded at `mod_revision`, if kept.
    fn get(&self, key: &[u8], mod_revision: i64) -> Option<Arc<Decoded>> {
        [&self.young, &self.old]
            .into_iter()
            .find_map(|g| g.get(key))
            .filter(|(revision, _)| *revision == mod_revision)
            .map(|(_, decoded)| decoded.clone())
    }

    fn put(&mut self, key: &[u8], mod_revision: i64, decoded: Arc<Decoded>) {
        let size = decoded.size();
        if self.young_bytes + size > RECENT_BYTES / 2 {
            self.old = std::mem::take(&mut self.young);
            self.young_bytes = 0;
        }
        self.old.remove(key);
        self.young_bytes += size;
        if let Some((_, replaced)) = self.young.insert(key.to_vec(), (mod_revision, decoded)) {
            self.young_bytes -= replaced.size();
        }
    }

    fn forget(&mut self, key: &[u8]) {
        self.old.remove(key);
        if let Some((_, removed)) = self.young.remove(key) {
            self.young_bytes -= removed.size();
        }
    }
}

/// One key's change at one revision.
#[derive(Debug)]
struct Change {
    revision: i64,
    old: Option<Arc<Decoded>>,
    new: Option<Arc<Decoded>>,
    /// The old object stamped with this revision: what DELETED carries.
    old_at_revision: OnceLock<Arc<Vec<u8>>>,
}

impl Change {
    /// What `filter`'s watcher sees of this change, if anything.
    fn event_for(&self, filter: &Filter) -> Option<(EventType, Arc<Vec<u8>>)> {
        let old_match = self.old.as_ref().is_some_and(|o| filter.matches(o));
        let new_match = self.new.as_ref().is_some_and(|n| filter.matches(n));
        match (old_match, new_match) {
            (true, true) => Some((EventType::Modified, self.new.as_ref()?.json.clone())),
            (false, true) => Some((EventType::Added, self.new.as_ref()?.json.clone())),
            (true, false) => {
                let old = self.old.as_ref()?;
                let bytes =
                    self.old_at_revision.get_or_init(|| Arc::new(with_resource_version(&old.stored, self.revision)));
                Some((EventType::Deleted, bytes.clone()))
            }
            (false, false) => None,
        }
    }

    fn index_keys(&self, kind: Kind) -> Vec<Index> {
        let mut keys = vec![Index::Cluster];
        for obj in [&self.old, &self.new].into_iter().flatten() {
            keys.push(Index::Namespace(obj.namespace.clone()));
            if let Some(name) = obj.fields.get("metadata.name") {
                keys.push(Index::Field("metadata.name", name.clone()));
            }
            if kind == Kind::Pod {
                if let Some(node) = obj.fields.get("spec.nodeName") {
                    keys.push(Index::Field("spec.nodeName", node.clone()));
                }
            }
        }
        keys.sort();
        keys.dedup();
        keys
    }
}

/// `kv` decrypted and decoded; what cannot be is logged and skipped, as a
/// list would fail on it.
fn decoded(objects: &ObjectStore, kind: Kind, kv: &KeyValue) -> Option<Decoded> {
    match objects.open(&kv.key, &kv.value) {
        Ok(opened) => Decoded::new(kind, &opened.bytes, kv.mod_revision),
        Err(e) => {
            tracing::warn!(key = %String::from_utf8_lossy(&kv.key), error = %e, "a watched object cannot be read");
            None
        }
    }
}

/// The changes a revision made to keys under `prefix`. The old versions
/// are taken from `recent` when it has them, and the new ones kept there.
fn changes_of(
    objects: &ObjectStore,
    kind: Kind,
    prefix: &[u8],
    rev: &RevisionEvents,
    recent: &mut Recent,
) -> Vec<Arc<Change>> {
    rev.events
        .iter()
        .filter(|e| e.kv.key.starts_with(prefix))
        .map(|e| {
            let old = e
                .prev_kv
                .as_ref()
                .and_then(|p| recent.get(&p.key, p.mod_revision).or_else(|| decoded(objects, kind, p).map(Arc::new)));
            let new = match e.kind {
                EventKind::Put => decoded(objects, kind, &e.kv).map(Arc::new),
                EventKind::Delete => None,
            };
            match &new {
                Some(n) => recent.put(&e.kv.key, e.kv.mod_revision, n.clone()),
                None => recent.forget(&e.kv.key),
            }
            Arc::new(Change { revision: rev.revision, old, new, old_at_revision: OnceLock::new() })
        })
        .collect()
}

type Delivery = (EventType, Arc<Vec<u8>>, i64);

struct Slot {
    filter: Arc<Filter>,
    index: Index,
    tx: mpsc::Sender<Delivery>,
    overflowed: Arc<AtomicBool>,
}

#[derive(Default)]
struct FeedState {
    /// Every change up to this revision has been handed to the watchers
    /// registered at the time.
    dispatched: i64,
    next_id: u64,
    slots: HashMap<u64, Slot>,
    index: HashMap<Index, HashSet<u64>>,
}

impl FeedState {
    fn remove(&mut self, id: u64) {
        if let Some(slot) = self.slots.remove(&id) {
            if let Some(ids) = self.index.get_mut(&slot.index) {
                ids.remove(&id);
                if ids.is_empty() {
                    self.index.remove(&slot.index);
                }
            }
        }
    }

    fn dispatch(&mut self, kind: Kind, change: &Change) {
        let mut full = Vec::new();
        for key in change.index_keys(kind) {
            let Some(ids) = self.index.get(&key) else { continue };
            for id in ids {
                let slot = &self.slots[id];
                let Some((event, bytes)) = change.event_for(&slot.filter) else { continue };
                if slot.tx.try_send((event, bytes, change.revision)).is_err() {
                    slot.overflowed.store(true, Ordering::Release);
                    full.push(*id);
                }
            }
        }
        for id in full {
            self.remove(id);
        }
    }
}

/// The decoded event stream of one resource type.
struct Feed {
    info: &'static ResourceInfo,
    state: Mutex<FeedState>,
}

struct Registration {
    id: u64,
    dispatched: i64,
    rx: mpsc::Receiver<Delivery>,
    overflowed: Arc<AtomicBool>,
}

impl Feed {
    fn register(&self, filter: Arc<Filter>) -> Registration {
        let (tx, rx) = mpsc::channel(WATCHER_QUEUE);
        let overflowed = Arc::new(AtomicBool::new(false));
        let mut state = self.state.lock().expect("feed lock poisoned");
        let id = state.next_id;
        state.next_id += 1;
        let index = filter.index();
        state.index.entry(index.clone()).or_default().insert(id);
        state.slots.insert(id, Slot { filter, index, tx, overflowed: overflowed.clone() });
        Registration { id, dispatched: state.dispatched, rx, overflowed }
    }

    fn unregister(&self, id: u64) {
        self.state.lock().expect("feed lock poisoned").remove(id);
    }

    fn dispatched(&self) -> i64 {
        self.state.lock().expect("feed lock poisoned").dispatched
    }

    fn publish(&self, changes: &[Arc<Change>], revision: i64) {
        let mut state = self.state.lock().expect("feed lock poisoned");
        for c in changes {
            state.dispatch(self.info.kind_id, c);
        }
        state.dispatched = state.dispatched.max(revision);
    }

    /// Cuts every watcher off (the feed cannot continue, e.g. its history
    /// was compacted past it after a snapshot install).
    fn close_all(&self) {
        let mut state = self.state.lock().expect("feed lock poisoned");
        for slot in state.slots.values() {
            slot.overflowed.store(true, Ordering::Release);
        }
        state.slots.clear();
        state.index.clear();
    }
}

/// Options of one watch.
#[derive(Clone, Debug, Default)]
pub struct WatchOptions {
    pub resource_version: String,
    pub allow_bookmarks: bool,
    pub send_initial_events: bool,
    pub timeout: Option<Duration>,
}

/// Every feed of this member, created on first use.
#[derive(Clone)]
pub struct Fanout {
    inner: Arc<FanoutInner>,
}

struct FanoutInner {
    objects: ObjectStore,
    /// The member's shutdown: feed and watcher tasks run on it, so a
    /// stopping member ends its watches and waits for them.
    shutdown: Shutdown,
    /// By storage prefix: one per built-in kind, one per custom resource
    /// (its served versions share it).
    feeds: Mutex<HashMap<String, Arc<Feed>>>,
    bookmark_interval: Duration,
}

impl Fanout {
    /// `bookmark_interval`: how often watchers that allow bookmarks get one.
    pub fn new(objects: ObjectStore, bookmark_interval: Duration, shutdown: Shutdown) -> Fanout {
        Fanout {
            inner: Arc::new(FanoutInner { objects, shutdown, feeds: Mutex::new(HashMap::new()), bookmark_interval }),
        }
    }

    fn feed(&self, info: &'static ResourceInfo) -> Arc<Feed> {
        let mut feeds = self.inner.feeds.lock().expect("fanout lock poisoned");
        let key = info.prefix();
        if let Some(f) = feeds.get(&key) {
            return f.clone();
        }
        let store = &self.inner.objects.store;
        let prefix = key.clone().into_bytes();
        let changes = store.subscribe(&prefix, &prefix_end(&prefix), None);
        let dispatched = changes.next_revision() - 1;
        let feed = Arc::new(Feed { info, state: Mutex::new(FeedState { dispatched, ..Default::default() }) });
        feeds.insert(key, feed.clone());
        let stopped = self.inner.shutdown.cancelled_owned();
        let run = run_feed(feed.clone(), self.inner.objects.clone(), changes);
        self.inner.shutdown.spawn(async move {
            tokio::select! {
                _ = run => {}
                _ = stopped => {}
            }
        });
        feed
    }

    /// Starts a watch; events (and a final ERROR, if it is cut off) arrive
    /// on the returned channel.
    pub async fn watch(
        &self,
        info: &'static ResourceInfo,
        filter: Filter,
        opts: WatchOptions,
    ) -> Result<mpsc::Receiver<WatchEvent>, ApiError> {
        let store = &self.inner.objects.store;
        let start = match opts.resource_version.as_str() {
            "" => Start::List(Consistency::Linearizable),
            "0" => Start::List(Consistency::Any),
            rv => {
                let n = storage::parse_resource_version(rv)?;
                let compacted = store.compacted();
                if n < compacted {
                    return Err(ApiError::expired(format!("too old resource version: {n} ({compacted})")));
                }
                storage::wait_for_revision(store, n).await?;
                if opts.send_initial_events {
                    Start::List(Consistency::AtLeast(n))
                } else {
                    Start::After(n)
                }
            }
        };
        if let Start::List(c) = start {
            self.inner.objects.prepare_read(c).await?;
        }
        let feed = self.feed(info);
        let filter = Arc::new(filter);
        let registration = feed.register(filter.clone());
        let (out, rx) = mpsc::channel(OUT_BUFFER);
        let watcher = Watcher {
            feed,
            objects: self.inner.objects.clone(),
            filter,
            out,
            delivered: 0,
            bookmarks: opts.allow_bookmarks.then_some(self.inner.bookmark_interval),
        };
        metrics::watchers(info.plural).inc();
        let plural = info.plural;
        let send_initial_events = opts.send_initial_events;
        let timeout = opts.timeout;
        // A stopping member ends its watches (the response ends, as when
        // `timeoutSeconds` runs out); clients watch again elsewhere.
        let mut stopping = store.stopping();
        let stopped = self.inner.shutdown.cancelled_owned();
        self.inner.shutdown.spawn(async move {
            let run = watcher.run(registration, start, send_initial_events);
            let run = async move {
                match timeout {
                    Some(t) => {
                        let _ = tokio::time::timeout(t, run).await;
                    }
                    None => run.await,
                }
            };
            tokio::select! {
                _ = run => {}
                _ = stopping.wait_for(|s| *s) => {}
                _ = stopped => {}
            }
            metrics::watchers(plural).dec();
        });
        Ok(rx)
    }
}

async fn run_feed(feed: Arc<Feed>, objects: ObjectStore, mut changes: Changes) {
    let prefix = feed.info.prefix().into_bytes();
    let kind = feed.info.kind_id;
    let mut tick = tokio::time::interval(PROGRESS_TICK);
    let mut recent = Recent::default();
    loop {
        tokio::select! {
            next = changes.next() => match next {
                Ok(revisions) => {
                    for rev in &revisions {
                        feed.publish(&changes_of(&objects, kind, &prefix, rev, &mut recent), rev.revision);
                    }
                }
                Err(ChangesError::Closed) => return,
                Err(e) => {
                    // The history is gone (compacted): every watcher is cut
                    // off and must resume; the feed starts over from the
                    // current state.
                    tracing::warn!(resource = feed.info.plural, error = %e, "watch feed lost its history; watchers cut off");
                    feed.close_all();
                    recent = Recent::default();
                    feed.publish(&[], changes.skip_to_current());
                }
            },
            _ = tick.tick() => feed.publish(&[], changes.progress()),
        }
    }
}

/// Revisions from `from` up to the current one, at most a chunk; or why not.
async fn read_revisions(store: &Store, from: i64) -> Result<Vec<RevisionEvents>, ApiError> {
    match store.changes_since(from).await {
        Ok(step) => Ok(step.revisions),
        Err(StoreError::Apply(ApplyError::Compacted { compacted })) => {
            Err(ApiError::expired(format!("too old resource version: {} ({compacted})", from - 1)))
        }
        Err(e) => Err(ApiError::internal(e.to_string())),
    }
}

#[derive(Clone, Copy, Debug)]
enum Start {
    /// Changes after this revision.
    After(i64),
    /// The current state as ADDED events, then changes.
    List(Consistency),
}

struct Watcher {
    feed: Arc<Feed>,
    objects: ObjectStore,
    filter: Arc<Filter>,
    out: mpsc::Sender<WatchEvent>,
    /// Every event up to this revision has been sent.
    delivered: i64,
    bookmarks: Option<Duration>,
}

/// Why a watcher stopped.
enum Stop {
    /// The client went away.
    Gone,
    /// Tell the client, then stop.
    Error(ApiError),
}

impl Watcher {
    async fn run(mut self, mut reg: Registration, start: Start, send_initial_events: bool) {
        let result = self.start(&mut reg, start, send_initial_events).await;
        let result = match result {
            Ok(()) => self.follow(&mut reg).await,
            Err(e) => Err(e),
        };
        self.feed.unregister(reg.id);
        if let Err(Stop::Error(e)) = result {
            let _ = self.out.send(WatchEvent::error(&e)).await;
        }
    }

    async fn send(&self, kind: EventType, object: Arc<Vec<u8>>) -> Result<(), Stop> {
        self.out.send(WatchEvent { kind, object }).await.map_err(|_| Stop::Gone)
    }

    fn bookmark_object(&self, revision: i64, initial_end: bool) -> Arc<Vec<u8>> {
        let info = self.feed.info;
        let mut metadata = json!({"resourceVersion": revision.to_string()});
        if initial_end {
            metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let obj = json!({"kind": info.kind, "apiVersion": info.api_version(), "metadata": metadata});
        Arc::new(serde_json::to_vec(&obj).expect("bookmark serializes"))
    }

    /// Sends what happened before the live feed takes over: a list, or
    /// history from RocksDB.
    async fn start(&mut self, reg: &mut Registration, start: Start, send_initial_events: bool) -> Result<(), Stop> {
        match start {
            Start::After(n) => self.delivered = n,
            Start::List(_) => {
                // Read after registering: the list's revision is at least
                // what the feed had dispatched, so nothing falls between.
                let info = self.feed.info;
                let prefix = info.namespace_prefix(self.filter.namespace.as_deref());
                let req = RangeRequest {
                    key: prefix.as_bytes().to_vec(),
                    range_end: prefix_end(prefix.as_bytes()),
                    ..Default::default()
                };
                let (page, header) =
                    self.objects.store.range(req, true).await.map_err(|e| Stop::Error(storage::store_error(e)))?;
                for kv in page.kvs {
                    let Some(d) = decoded(&self.objects, info.kind_id, &kv) else { continue };
                    if self.filter.matches(&d) {
                        self.send(EventType::Added, d.json.clone()).await?;
                    }
                }
                self.delivered = header.revision;
            }
        }
        // Catch up from RocksDB to what the feed had dispatched, again if
        // the queue overflowed meanwhile.
        loop {
            self.replay(reg.dispatched).await?;
            if !reg.overflowed.load(Ordering::Acquire) {
                break;
            }
            self.feed.unregister(reg.id);
            *reg = self.feed.register(self.filter.clone());
        }
        if send_initial_events {
            let b = self.bookmark_object(self.delivered, true);
            self.send(EventType::Bookmark, b).await?;
        }
        Ok(())
    }

    /// Sends the changes in (delivered, to] from RocksDB.
    async fn replay(&mut self, to: i64) -> Result<(), Stop> {
        let prefix = self.feed.info.prefix().into_bytes();
        let mut recent = Recent::default();
        while self.delivered < to {
            let revisions = read_revisions(&self.objects.store, self.delivered + 1).await.map_err(Stop::Error)?;
            if revisions.is_empty() {
                break;
            }
            for rev in revisions.iter().take_while(|r| r.revision <= to) {
                for change in changes_of(&self.objects, self.feed.info.kind_id, &prefix, rev, &mut recent) {
                    if let Some((kind, bytes)) = change.event_for(&self.filter) {
                        self.send(kind, bytes).await?;
                    }
                }
                self.delivered = rev.revision;
            }
            if revisions.last().is_some_and(|r| r.revision >= to) {
                break;
            }
        }
        self.delivered = self.delivered.max(to);
        Ok(())
    }

    /// Follows the live feed until the client goes away or falls behind.
    async fn follow(&mut self, reg: &mut Registration) -> Result<(), Stop> {
        let floor = self.delivered;
        let mut bookmark =
            self.bookmarks.map(|every| tokio::time::interval_at(tokio::time::Instant::now() + every, every));
        loop {
            let tick = async {
                match bookmark.as_mut() {
                    Some(b) => b.tick().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                delivery = reg.rx.recv() => match delivery {
                    Some((kind, bytes, revision)) => {
                        if revision > floor {
                            self.send(kind, bytes).await?;
                            self.delivered = self.delivered.max(revision);
                        }
                    }
                    None => {
                        let e = ApiError::too_many_requests(format!(
                            "watch of {} fell behind by more than {WATCHER_QUEUE} events and was closed; \
                             resume from resourceVersion {}",
                            self.feed.info.plural, self.delivered
                        ));
                        return Err(Stop::Error(e));
                    }
                },
                _ = tick => {
                    // Everything dispatched so far is delivered if nothing is queued.
                    let dispatched = self.feed.dispatched();
                    if reg.rx.is_empty() && !reg.overflowed.load(Ordering::Acquire) {
                        self.delivered = self.delivered.max(dispatched);
                    }
                    let b = self.bookmark_object(self.delivered, false);
                    self.send(EventType::Bookmark, b).await?;
                }
                _ = self.out.closed() => return Err(Stop::Gone),
            }
        }
    }
}

/// Whether `e` means the client must list again (410).
pub fn is_expired(e: &ApiError) -> bool {
    matches!(e.reason, Reason::Expired | Reason::Gone)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn pod(name: &str, node: &str, app: &str) -> Vec<u8> {
        serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": {"app": app}},
            "spec": {"nodeName": node}}))
        .unwrap()
    }

    #[test]
    fn recent_gives_back_only_the_version_asked_for_and_stays_bounded() {
        let mut recent = Recent::default();
        let v1 = Arc::new(Decoded::new(Kind::Pod, &pod("a", "", "web"), 5).unwrap());
        recent.put(b"/pods/default/a", 5, v1.clone());
        assert!(Arc::ptr_eq(&recent.get(b"/pods/default/a", 5).unwrap(), &v1));
        assert!(recent.get(b"/pods/default/a", 4).is_none(), "another version of the key");
        assert!(recent.get(b"/pods/default/b", 5).is_none());
        let v2 = Arc::new(Decoded::new(Kind::Pod, &pod("a", "n1", "web"), 7).unwrap());
        recent.put(b"/pods/default/a", 7, v2.clone());
        assert!(recent.get(b"/pods/default/a", 5).is_none(), "replaced");
        assert!(Arc::ptr_eq(&recent.get(b"/pods/default/a", 7).unwrap(), &v2));
        recent.forget(b"/pods/default/a");
        assert!(recent.get(b"/pods/default/a", 7).is_none(), "deleted");
        assert_eq!(recent.young_bytes, 0);

        // Far more than it may hold: the oldest go, the newest stay.
        let per = Decoded::new(Kind::Pod, &pod("p-0000000", "", "web"), 1).unwrap().size();
        let n = 4 * RECENT_BYTES / per;
        for i in 0..n {
            let name = format!("p-{i:07}");
            recent.put(
                name.as_bytes(),
                i as i64,
                Arc::new(Decoded::new(Kind::Pod, &pod(&name, "", "web"), 1).unwrap()),
            );
        }
        let held: usize = [&recent.young, &recent.old].iter().flat_map(|g| g.values()).map(|(_, d)| d.size()).sum();
        assert!(held <= RECENT_BYTES, "{held} bytes held");
        assert!(recent.get(format!("p-{:07}", n - 1).as_bytes(), n as i64 - 1).is_some());
        assert!(recent.get(b"p-0000000", 0).is_none());
    }

    fn change(old: Option<Vec<u8>>, new: Option<Vec<u8>>, revision: i64) -> Change {
        Change {
            revision,
            old: old.and_then(|b| Decoded::new(Kind::Pod, &b, revision - 1)).map(Arc::new),
            new: new.and_then(|b| Decoded::new(Kind::Pod, &b, revision)).map(Arc::new),
            old_at_revision: OnceLock::new(),
        }
    }

    fn filter(labels: &str, fields: &str) -> Filter {
        Filter {
            kind: Kind::Pod,
            namespace: Some("default".into()),
            labels: LabelSelector::parse(labels).unwrap(),
            fields: FieldSelector::parse(fields).unwrap(),
        }
    }

    fn kind_of(c: &Change, f: &Filter) -> Option<EventType> {
        c.event_for(f).map(|(k, _)| k)
    }

    #[test]
    fn objects_entering_and_leaving_a_selection_are_added_and_deleted() {
        let web = filter("app=web", "");
        let relabel = change(Some(pod("a", "n1", "db")), Some(pod("a", "n1", "web")), 5);
        assert_eq!(kind_of(&relabel, &web), Some(EventType::Added));
        let leave = change(Some(pod("a", "n1", "web")), Some(pod("a", "n1", "db")), 6);
        let (kind, bytes) = leave.event_for(&web).unwrap();
        assert_eq!(kind, EventType::Deleted);
        // The last state the watcher could see, at the revision it left.
        let obj: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            (obj["metadata"]["labels"]["app"].as_str(), obj["metadata"]["resourceVersion"].as_str()),
            (Some("web"), Some("6"))
        );
        let stay = change(Some(pod("a", "n1", "web")), Some(pod("a", "n2", "web")), 7);
        assert_eq!(kind_of(&stay, &web), Some(EventType::Modified));
        let elsewhere = change(None, Some(pod("b", "n1", "db")), 8);
        assert_eq!(kind_of(&elsewhere, &web), None);
        let gone = change(Some(pod("a", "n1", "web")), None, 9);
        assert_eq!(kind_of(&gone, &web), Some(EventType::Deleted));
    }

    #[test]
    fn a_pod_moving_between_nodes_reaches_the_watchers_of_both() {
        let on_n1 = filter("", "spec.nodeName=n1");
        let on_n2 = filter("", "spec.nodeName=n2");
        assert_eq!(on_n1.index(), Index::Field("spec.nodeName", "n1".into()));
        let moved = change(Some(pod("a", "n1", "web")), Some(pod("a", "n2", "web")), 3);
        let keys = moved.index_keys(Kind::Pod);
        assert!(keys.contains(&on_n1.index()) && keys.contains(&on_n2.index()));
        assert_eq!(kind_of(&moved, &on_n1), Some(EventType::Deleted));
        assert_eq!(kind_of(&moved, &on_n2), Some(EventType::Added));
    }

    #[test]
    fn a_full_queue_cuts_off_only_its_own_watcher() {
        let feed = Feed { info: skiff_api::resources::of(Kind::Pod), state: Mutex::new(FeedState::default()) };
        let mut slow = feed.register(Arc::new(filter("", "")));
        let mut fast = feed.register(Arc::new(filter("", "")));
        for i in 0..(WATCHER_QUEUE as i64 + 10) {
            feed.publish(&[Arc::new(change(None, Some(pod(&format!("p{i}"), "n1", "web")), i + 1))], i + 1);
            // The fast one keeps up.
            fast.rx.try_recv().unwrap();
        }
        assert!(slow.overflowed.load(Ordering::Acquire));
        assert!(!fast.overflowed.load(Ordering::Acquire));
        assert_eq!(slow.rx.len(), WATCHER_QUEUE);
        let state = feed.state.lock().unwrap();
        assert!(!state.slots.contains_key(&slow.id) && state.slots.contains_key(&fast.id));
        drop(state);
        // What was queued is still delivered, then the queue ends.
        while slow.rx.try_recv().is_ok() {}
        assert!(matches!(slow.rx.try_recv(), Err(mpsc::error::TryRecvError::Disconnected)));
    }
}
