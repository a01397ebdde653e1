//! The per-member fan-out of applied revisions to watchers.
//!
//! The state machine publishes each revision here after its `WriteBatch` is
//! committed, so anything a watcher receives is already readable from
//! RocksDB. Watchers register the key or range they watch: a revision is
//! handed only to the watchers of keys it changed (single keys through a
//! hash index, ranges by a scan of the range watchers), so a write wakes the
//! watchers it concerns, not all of them.
//!
//! Every watcher has a bounded queue. When it is full the revision is not
//! queued and the watcher is marked lagged; it then catches up from RocksDB,
//! so a slow watcher never holds memory or stalls the applier, and loses
//! nothing. A snapshot install replaces the whole state and marks every
//! watcher lagged the same way.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use crate::mvcc::{in_range, RevisionEvents};

/// Revisions queued per watcher before it must catch up from RocksDB.
pub const WATCHER_QUEUE: usize = 256;

#[derive(Clone, Debug)]
pub enum HubMessage {
    Revision(Arc<RevisionEvents>),
    /// The state was replaced by a snapshot: re-read from the store.
    Reset,
}

#[derive(Default)]
struct Registry {
    next_id: u64,
    /// Watchers of one key, by key.
    by_key: HashMap<Vec<u8>, Vec<u64>>,
    /// Watchers of a range.
    ranges: Vec<u64>,
    subs: HashMap<u64, Sub>,
}

struct Sub {
    key: Vec<u8>,
    range_end: Vec<u8>,
    tx: mpsc::Sender<HubMessage>,
    lagged: Arc<AtomicBool>,
}

#[derive(Default)]
struct Inner {
    registry: Mutex<Registry>,
    /// The newest revision handed to every interested watcher.
    published: AtomicI64,
}

#[derive(Clone, Default)]
pub struct Hub {
    inner: Arc<Inner>,
}

/// One watcher's feed; unregisters itself when dropped.
pub struct Subscription {
    id: u64,
    rx: mpsc::Receiver<HubMessage>,
    lagged: Arc<AtomicBool>,
    hub: Arc<Inner>,
}

impl Subscription {
    /// The next revision (or reset) for this watcher; `None` once the hub is gone.
    pub async fn recv(&mut self) -> Option<HubMessage> {
        self.rx.recv().await
    }

    /// Whether revisions were dropped since the last call (and clears it):
    /// the watcher must catch up from RocksDB.
    pub fn take_lagged(&self) -> bool {
        self.lagged.swap(false, Ordering::AcqRel)
    }

    /// A revision up to which this watcher has received everything it
    /// watches, if it can tell: nothing is queued and nothing was dropped.
    pub fn caught_up_to(&self) -> Option<i64> {
        // Read first: every revision up to it was queued before it was stored.
        let published = self.hub.published.load(Ordering::Acquire);
        (self.rx.is_empty() && !self.lagged.load(Ordering::Acquire)).then_some(published)
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut reg = self.hub.registry.lock().expect("hub lock poisoned");
        if let Some(sub) = reg.subs.remove(&self.id) {
            if sub.range_end.is_empty() {
                if let Some(ids) = reg.by_key.get_mut(&sub.key) {
                    ids.retain(|i| *i != self.id);
                    if ids.is_empty() {
                        reg.by_key.remove(&sub.key);
                    }
                }
            } else {
                reg.ranges.retain(|i| *i != self.id);
            }
        }
    }
}

impl Hub {
    /// Registers a watcher of `[key, range_end)` (etcd's range rules).
    pub fn subscribe(&self, key: &[u8], range_end: &[u8]) -> Subscription {
        let (tx, rx) = mpsc::channel(WATCHER_QUEUE);
        let lagged = Arc::new(AtomicBool::new(false));
        let mut reg = self.inner.registry.lock().expect("hub lock poisoned");
        let id = reg.next_id;
        reg.next_id += 1;
        if range_end.is_empty() {
            reg.by_key.entry(key.to_vec()).or_default().push(id);
        } else {
            reg.ranges.push(id);
        }
        let sub = Sub { key: key.to_vec(), range_end: range_end.to_vec(), tx, lagged: lagged.clone() };
        reg.subs.insert(id, sub);
        Subscription { id, rx, lagged, hub: self.inner.clone() }
    }

    pub fn publish(&self, msg: HubMessage) {
        let reg = self.inner.registry.lock().expect("hub lock poisoned");
        match msg {
            HubMessage::Revision(rev) => {
                let mut targets = BTreeSet::new();
                for e in &rev.events {
                    if let Some(ids) = reg.by_key.get(&e.kv.key) {
                        targets.extend(ids.iter().copied());
                    }
                }
                for id in &reg.ranges {
                    let sub = &reg.subs[id];
                    if rev.events.iter().any(|e| in_range(&e.kv.key, &sub.key, &sub.range_end)) {
                        targets.insert(*id);
                    }
                }
                for id in targets {
                    let sub = &reg.subs[&id];
                    if sub.tx.try_send(HubMessage::Revision(rev.clone())).is_err() {
                        sub.lagged.store(true, Ordering::Release);
                    }
                }
                self.inner.published.store(rev.revision, Ordering::Release);
            }
            HubMessage::Reset => {
                for sub in reg.subs.values() {
                    sub.lagged.store(true, Ordering::Release);
                    let _ = sub.tx.try_send(HubMessage::Reset);
                }
            }
        }
    }

    /// Registered watchers.
    pub fn watchers(&self) -> usize {
        self.inner.registry.lock().expect("hub lock poisoned").subs.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::{Event, EventKind};
    use crate::types::KeyValue;

    fn rev(revision: i64, keys: &[&str]) -> HubMessage {
        let events = keys
            .iter()
            .map(|k| Event {
                kind: EventKind::Put,
                kv: KeyValue { key: k.as_bytes().to_vec(), mod_revision: revision, ..Default::default() },
                prev_kv: None,
            })
            .collect();
        HubMessage::Revision(Arc::new(RevisionEvents { revision, timestamp_ms: 0, events }))
    }

    #[tokio::test]
    async fn a_revision_reaches_only_the_watchers_of_the_keys_it_changed() {
        let hub = Hub::default();
        let mut a = hub.subscribe(b"a", b"");
        let b = hub.subscribe(b"b", b"");
        let mut prefix = hub.subscribe(b"a", b"b");
        hub.publish(rev(1, &["a"]));
        hub.publish(rev(2, &["ab", "c"]));
        assert!(matches!(a.recv().await, Some(HubMessage::Revision(r)) if r.revision == 1));
        assert!(b.rx.is_empty());
        assert!(matches!(prefix.recv().await, Some(HubMessage::Revision(r)) if r.revision == 1));
        assert!(matches!(prefix.recv().await, Some(HubMessage::Revision(r)) if r.revision == 2));
        assert_eq!(a.caught_up_to(), Some(2));
    }

    #[tokio::test]
    async fn a_full_queue_marks_the_watcher_lagged_instead_of_blocking() {
        let hub = Hub::default();
        let slow = hub.subscribe(b"k", b"");
        for r in 1..=(WATCHER_QUEUE as i64 + 5) {
            hub.publish(rev(r, &["k"]));
        }
        assert_eq!(slow.caught_up_to(), None);
        assert!(slow.take_lagged());
        assert!(!slow.take_lagged());
    }

    #[tokio::test]
    async fn dropped_subscriptions_unregister() {
        let hub = Hub::default();
        let a = hub.subscribe(b"k", b"");
        let b = hub.subscribe(b"k", b"\0");
        assert_eq!(hub.watchers(), 2);
        drop(a);
        drop(b);
        assert_eq!(hub.watchers(), 0);
        hub.publish(rev(1, &["k"]));
    }
}
