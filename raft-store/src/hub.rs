//! The per-member fan-out of applied revisions to watchers.
//!
//! The state machine publishes each revision here after its `WriteBatch` is
//! committed, so anything a watcher receives is already readable from
//! RocksDB. The channel is bounded: a watcher that falls behind is told it
//! lagged and catches up from RocksDB instead of holding memory or stalling
//! the applier. A snapshot install replaces the whole state and is announced
//! as [`HubMessage::Reset`], which watchers handle the same way.

use std::sync::Arc;

use tokio::sync::broadcast;

use crate::mvcc::RevisionEvents;

/// Revisions buffered for live watchers before a slow one must catch up
/// from RocksDB.
pub const HUB_CAPACITY: usize = 4096;

#[derive(Clone, Debug)]
pub enum HubMessage {
    Revision(Arc<RevisionEvents>),
    /// The state was replaced by a snapshot: re-read from the store.
    Reset,
}

#[derive(Clone)]
pub struct Hub {
    tx: broadcast::Sender<HubMessage>,
}

impl Default for Hub {
    fn default() -> Self {
        let (tx, _) = broadcast::channel(HUB_CAPACITY);
        Hub { tx }
    }
}

impl Hub {
    pub fn publish(&self, msg: HubMessage) {
        // No receivers is fine: nobody is watching.
        let _ = self.tx.send(msg);
    }

    pub fn subscribe(&self) -> broadcast::Receiver<HubMessage> {
        self.tx.subscribe()
    }

    pub fn watchers(&self) -> usize {
        self.tx.receiver_count()
    }
}
