//! Reading what the store changed: a key's history, the revisions since a
//! point, and [`Changes`], a live feed of revisions with catch-up from
//! RocksDB. The etcd Watch service and the apiserver's watch fan-out both
//! follow the store through [`Changes`], so the replay rules live here once.
//!
//! A [`Changes`] subscribes to the member's [`Hub`](crate::hub::Hub) first
//! and only then reads the current revision, so nothing applied in between
//! is missed. It keeps `next`, below which every revision touching its keys
//! has been handed out, and delivers revisions whole, in order, once each:
//! from RocksDB while catching up (at the start, after its live queue
//! overflowed, after a snapshot install replaced the state), from the hub
//! otherwise. All blocking RocksDB work runs on the blocking pool.

use std::sync::Arc;

use crate::error::StoreError;
use crate::hub::{HubMessage, Subscription};
use crate::mvcc::Reader;
use crate::state_machine::StateMachine;
use crate::types::ApplyError;

pub use crate::mvcc::{Event, EventKind, HistoryEntry, RevisionEvents};

/// Revisions read from RocksDB per step of a catch-up.
pub const REPLAY_CHUNK: usize = 512;

/// A key's history as read from one RocksDB snapshot: entries, revision and
/// compaction point agree.
#[derive(Clone, Debug)]
pub struct History {
    /// Every retained change of the key, oldest first.
    pub entries: Vec<HistoryEntry>,
    /// The store's revision at the read.
    pub revision: i64,
    /// Where the (possibly truncated) history begins.
    pub compacted: i64,
}

/// Revisions read in one step, with the revision current at the read.
#[derive(Clone, Debug)]
pub struct ChangesSince {
    /// Consecutive stored revisions from the requested one, at most
    /// [`REPLAY_CHUNK`]; empty once the read is past `current`.
    pub revisions: Vec<RevisionEvents>,
    /// The store's revision at the read.
    pub current: i64,
}

/// Why a [`Changes`] feed cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum ChangesError {
    /// The next revision the feed needs was compacted away.
    #[error("etcdserver: mvcc: required revision has been compacted")]
    Compacted { compacted: i64 },
    /// Reading the history from RocksDB failed.
    #[error("replaying history: {0}")]
    Read(#[source] StoreError),
    /// The member's state machine is gone (the store stopped).
    #[error("the store stopped")]
    Closed,
}

/// Reads `key`'s history off the async workers.
pub(crate) async fn read_history(sm: &StateMachine, key: Vec<u8>) -> Result<History, StoreError> {
    let sm = sm.clone();
    let read = tokio::task::spawn_blocking(move || -> Result<History, crate::mvcc::EngineError> {
        let db = sm.db();
        let reader = Reader::snapshot(&db);
        Ok(History { entries: reader.history(&key)?, revision: reader.revision()?, compacted: reader.compacted()? })
    });
    match read.await {
        Ok(history) => history.map_err(StoreError::from),
        Err(e) => Err(StoreError::from(e)),
    }
}

/// Reads the revisions from `from` up to the current one (at most a chunk)
/// off the async workers; `ApplyError::Compacted` if `from` is compacted.
pub(crate) async fn read_changes(sm: &StateMachine, from: i64) -> Result<ChangesSince, StoreError> {
    let sm = sm.clone();
    let read = tokio::task::spawn_blocking(move || {
        let db = sm.db();
        let reader = Reader::snapshot(&db);
        let current = reader.revision()?;
        let compacted = reader.compacted()?;
        if from < compacted {
            return Ok(Err(compacted));
        }
        reader.revisions(from, current, REPLAY_CHUNK).map(|revisions| Ok(ChangesSince { revisions, current }))
    })
    .await?
    .map_err(StoreError::from)?;
    read.map_err(|compacted| StoreError::Apply(ApplyError::Compacted { compacted }))
}

/// A live feed of the revisions that touch one key or range, with catch-up
/// from RocksDB. Made by [`Store::subscribe`](crate::Store::subscribe).
///
/// Revisions read back from RocksDB carry all their events, including ones
/// outside the watched range: the consumer filters.
pub struct Changes {
    sm: StateMachine,
    live: Subscription,
    /// The first revision not yet handed out.
    next: i64,
    /// Whether the next step reads from RocksDB instead of the live queue.
    catching_up: bool,
}

impl Changes {
    /// Follows `[key, range_end)` (etcd's range rules) from `start`, or from
    /// the revision after the current one.
    pub(crate) fn new(sm: &StateMachine, key: &[u8], range_end: &[u8], start: Option<i64>) -> Changes {
        // Subscribe before reading the revision: nothing after it is missed.
        let live = sm.hub().subscribe(key, range_end);
        let next = start.unwrap_or_else(|| sm.revision() + 1);
        Changes { sm: sm.clone(), live, next, catching_up: true }
    }

    /// The first revision not yet handed out: every revision below it that
    /// touches the watched keys has been.
    pub fn next_revision(&self) -> i64 {
        self.next
    }

    /// The next consecutive revisions, at least one. Cancel-safe: dropping
    /// the future loses nothing (a catch-up read is simply done again).
    pub async fn next(&mut self) -> Result<Vec<Arc<RevisionEvents>>, ChangesError> {
        loop {
            if self.catching_up {
                let read = read_changes(&self.sm, self.next).await;
                let step = read.map_err(|e| match e {
                    StoreError::Apply(ApplyError::Compacted { compacted }) => ChangesError::Compacted { compacted },
                    other => ChangesError::Read(other),
                })?;
                let Some(last) = step.revisions.last() else {
                    // Nothing stored in [next, current]: every revision up
                    // to `current` has been seen.
                    self.next = self.next.max(step.current + 1);
                    self.catching_up = false;
                    continue;
                };
                self.next = last.revision + 1;
                return Ok(step.revisions.into_iter().map(Arc::new).collect());
            }
            match self.live.recv().await {
                Some(HubMessage::Revision(rev)) => {
                    // Revisions dropped from a full queue: read them back
                    // after this one.
                    if self.live.take_lagged() {
                        self.catching_up = true;
                    }
                    if rev.revision >= self.next {
                        self.next = rev.revision + 1;
                        return Ok(vec![rev]);
                    }
                }
                Some(HubMessage::Reset) => {
                    self.live.take_lagged();
                    self.catching_up = true;
                }
                None => return Err(ChangesError::Closed),
            }
        }
    }

    /// A revision up to which everything touching the watched keys has been
    /// handed out: the hub's newest if nothing is queued or dropped, else
    /// the last revision handed out.
    pub fn progress(&mut self) -> i64 {
        if !self.catching_up {
            if let Some(published) = self.live.caught_up_to() {
                self.next = self.next.max(published + 1);
            }
        }
        self.next - 1
    }

    /// Gives up on the history this feed missed (after
    /// [`ChangesError::Compacted`]) and follows on from the current
    /// revision, which it returns.
    pub fn skip_to_current(&mut self) -> i64 {
        self.next = self.sm.revision() + 1;
        self.catching_up = false;
        self.next - 1
    }
}
