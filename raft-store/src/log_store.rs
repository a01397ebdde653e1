//! The Raft log and vote, on a RocksDB instance of their own.
//!
//! openraft drives this store through [`RaftLogStorage`]: the leader appends
//! entries, followers append and truncate what the leader sends, and once the
//! state machine has a durable snapshot openraft purges the head of the log.
//! Replication tasks read entries through clones of the store
//! ([`RaftLogReader`]). The log lives apart from the state machine's RocksDB
//! so that a checkpoint of the state machine does not ship the log with it.
//!
//! # On-disk layout
//!
//! - column family `logs`: big-endian `u64` index -> bincode of [`Entry`];
//!   big-endian keys make RocksDB's byte order the log order.
//! - column family `meta`: bincode of the vote, of `last_purged_log_id` and of
//!   the committed log id.
//!
//! # Durability rules
//!
//! - `save_vote` returns only after a synced write: a node must never vote
//!   twice in one term, even across a crash.
//! - A follower's `append` writes all its entries in one synced `WriteBatch`
//!   and reports completion to openraft only after that write has returned:
//!   its acknowledgement to the leader means "on my disk".
//! - The leader's own `append` (entries of the leader's own term, appended
//!   while this node holds that term's vote) is written to RocksDB's WAL at
//!   once, without waiting for the fsync, and reported complete, so that
//!   openraft replicates it while a WAL-sync thread fsyncs it in parallel.
//!   This is the "write to the leader's disk in parallel" of the Raft thesis
//!   (10.2.1) and what etcd does: the entry is in the kernel's page cache
//!   (it survives a SIGKILL of the process), and the state machine applies an
//!   entry only once [`LogStore::durable`] covers it, so no client sees the
//!   result of a write, and no revision is published, before the leader has
//!   it on disk as well as a quorum of followers.
//! - `truncate` deletes from the given index onward in one synced write, so no
//!   hole can appear.
//! - `purge` makes `last_purged_log_id` durable before it deletes anything, so
//!   entries never vanish without a record of it; the deletion is synced too.
//! - `save_committed` is not synced: after a crash openraft only re-applies
//!   less, and the state machine records what it applied itself.
//!
//! openraft serializes all writes (it awaits each call before the next), and
//! every write here has reached RocksDB before its call returns, so writes
//! reach the disk in the order openraft issued them. Synced writes run on
//! tokio's blocking pool so that an fsync never stalls an async worker.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};

use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{AnyError, StorageIOError, Vote};
use rocksdb::{ColumnFamily, ColumnFamilyDescriptor, Direction, IteratorMode, Options, WriteBatch, WriteOptions, DB};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::watch;

use crate::types::{Entry, LogId, NodeId, StorageError, TypeConfig};

const LOGS_CF: &str = "logs";
const META_CF: &str = "meta";

const VOTE_KEY: &[u8] = b"vote";
const LAST_PURGED_KEY: &[u8] = b"last_purged_log_id";
const COMMITTED_KEY: &[u8] = b"committed";

/// Why [`LogStore::open`] failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// RocksDB refused to open or create the database, e.g. because another
    /// process holds its lock or the directory is not writable.
    #[error("cannot open raft log at {}: {source}", path.display())]
    Open {
        /// The directory given to [`LogStore::open`].
        path: PathBuf,
        /// RocksDB's own error.
        source: rocksdb::Error,
    },
    /// The log on disk cannot be read back.
    #[error("raft log at {} is unreadable: {reason}", path.display())]
    Corrupt {
        /// The directory given to [`LogStore::open`].
        path: PathBuf,
        reason: String,
    },
    /// The WAL-sync thread could not be started.
    #[error("cannot start the raft log's sync thread for {}: {source}", path.display())]
    Thread {
        /// The directory given to [`LogStore::open`].
        path: PathBuf,
        source: io::Error,
    },
}

/// The data on disk is not laid out the way this module writes it.
#[derive(Debug, thiserror::Error)]
enum LayoutError {
    #[error("raft log column family {0:?} is missing")]
    MissingColumnFamily(&'static str),
    #[error("raft log key {0:02x?} is not a big-endian u64 index")]
    BadIndexKey(Box<[u8]>),
}

/// The Raft log store: openraft's log and vote on their own RocksDB.
///
/// Cloning is cheap and every clone sees the same database; openraft holds
/// one clone as the writer and hands others to replication tasks as readers.
#[derive(Clone)]
pub struct LogStore {
    /// Declared before `db`: dropping the last clone stops and joins the
    /// WAL-sync thread before the database closes.
    _sync_thread: Arc<SyncThread>,
    db: Arc<DB>,
    /// This member's id: appends of its own leadership take the fast path.
    node: NodeId,
    /// The vote last saved or read, to recognize the leader's own appends.
    vote: Arc<Mutex<Option<Vote<NodeId>>>>,
    durability: Arc<Durability>,
    /// Bytes of entries appended since the store was opened.
    appended: Arc<AtomicU64>,
    /// The newest entries, which openraft reads back at once.
    tail: Arc<Mutex<Tail>>,
}

/// Most bytes of encoded entries [`Tail`] keeps.
const TAIL_BYTES: usize = 16 << 20;

/// The newest entries of the log, in memory. openraft reads every entry
/// back right after it is appended: on every member to apply it, and on the
/// leader once more per follower to replicate it. From RocksDB each read
/// cost an iterator step and a decode of every write in the entry; from
/// here it costs a reference count (a batch's proposals are shared).
///
/// Holds a run of consecutive entries ending at the last one appended, as
/// they are in the database: appends add to it after their write, and
/// truncations and purges remove from it before theirs. Anything else is
/// read from the database.
#[derive(Default)]
struct Tail {
    /// Entries with their encoded size.
    entries: VecDeque<(Entry, usize)>,
    bytes: usize,
}

impl Tail {
    fn push(&mut self, entry: Entry, size: usize) {
        let index = entry.log_id.index;
        // An entry replaces whatever the log held from its index on; after a
        // gap the run starts again.
        self.truncate(index);
        if self.entries.back().is_some_and(|(last, _)| last.log_id.index + 1 != index) {
            self.entries.clear();
            self.bytes = 0;
        }
        self.entries.push_back((entry, size));
        self.bytes += size;
        while self.bytes > TAIL_BYTES && self.entries.len() > 1 {
            if let Some((_, size)) = self.entries.pop_front() {
                self.bytes -= size;
            }
        }
    }

    /// Forgets the entries from index `since` on.
    fn truncate(&mut self, since: u64) {
        while self.entries.back().is_some_and(|(last, _)| last.log_id.index >= since) {
            if let Some((_, size)) = self.entries.pop_back() {
                self.bytes -= size;
            }
        }
    }

    /// Forgets the entries up to index `upto`.
    fn purge(&mut self, upto: u64) {
        while self.entries.front().is_some_and(|(first, _)| first.log_id.index <= upto) {
            if let Some((_, size)) = self.entries.pop_front() {
                self.bytes -= size;
            }
        }
    }

    /// The entries with index in `[start, end)`, if this holds all of them.
    fn get(&self, start: u64, end: u64) -> Option<Vec<Entry>> {
        let first = self.entries.front()?.0.log_id.index;
        let last = self.entries.back()?.0.log_id.index;
        if start < first || end > last + 1 {
            return None;
        }
        let range = (start - first) as usize..end.saturating_sub(first).max(start - first) as usize;
        Some(self.entries.range(range).map(|(entry, _)| entry.clone()).collect())
    }
}

/// How much of the log is known to be on disk; shared by every clone of the
/// store and its WAL-sync thread.
struct Durability {
    state: Mutex<SyncState>,
    /// Wakes the WAL-sync thread when unsynced entries were written.
    wake: Condvar,
    durable: watch::Sender<Durable>,
}

struct SyncState {
    /// Index of the last entry written (synced or not).
    written: u64,
    /// Index up to which every entry is synced.
    durable: u64,
    /// Bumped by `truncate`: an fsync that started before a truncation does
    /// not vouch for entries written after it at the same indexes.
    generation: u64,
    /// The store is gone: the WAL-sync thread ends.
    closed: bool,
}

/// Stops the WAL-sync thread when the last clone of the store is dropped.
struct SyncThread {
    durability: Arc<Durability>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Drop for SyncThread {
    fn drop(&mut self) {
        self.durability.state().closed = true;
        self.durability.wake.notify_one();
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

/// The log's durable index, as published to the state machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Durable {
    /// Every entry up to this index is on disk.
    pub index: u64,
    /// Set once a WAL sync failed: nothing written after it may be trusted,
    /// and the state machine refuses to apply (openraft then stops the node).
    pub failed: Option<String>,
}

impl Durability {
    fn new(durable: u64) -> Durability {
        Durability {
            state: Mutex::new(SyncState { written: durable, durable, generation: 0, closed: false }),
            wake: Condvar::new(),
            durable: watch::channel(Durable { index: durable, failed: None }).0,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, SyncState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn publish(&self, state: &SyncState) {
        self.durable.send_if_modified(|d| {
            let changed = d.index != state.durable;
            d.index = state.durable;
            changed
        });
    }

    /// Entries up to `last` were written without a sync.
    fn written(&self, last: u64) {
        let mut state = self.state();
        state.written = last;
        self.wake.notify_one();
    }

    /// Entries up to `last` were written with a sync, which also covers
    /// everything written before them.
    fn synced(&self, last: u64) {
        let mut state = self.state();
        state.written = last;
        state.durable = last;
        self.publish(&state);
    }

    /// Entries from `since` on were deleted by a synced write.
    fn truncated(&self, since: u64) {
        let mut state = self.state();
        state.written = since.saturating_sub(1);
        state.durable = state.written;
        state.generation += 1;
        self.publish(&state);
    }
}

/// Fsyncs the WAL whenever entries were written without a sync, one fsync
/// for however many appends arrived meanwhile, and publishes the durable
/// index. Ends when the last clone of the store is dropped.
fn run_wal_sync(db: Weak<DB>, durability: Arc<Durability>) {
    loop {
        let (target, generation) = {
            let mut state = durability.state();
            while state.written <= state.durable && !state.closed {
                state = durability.wake.wait(state).unwrap_or_else(|poisoned| poisoned.into_inner());
            }
            if state.closed {
                return;
            }
            (state.written, state.generation)
        };
        let Some(db) = db.upgrade() else { return };
        let result = {
            let _timer = crate::metrics::metrics().log_sync_seconds.start_timer();
            db.flush_wal(true)
        };
        drop(db);
        let mut state = durability.state();
        match result {
            Ok(()) => {
                if state.generation == generation && target > state.durable {
                    state.durable = target;
                    durability.publish(&state);
                }
            }
            Err(error) => {
                tracing::error!(%error, "syncing the raft log's WAL failed; this member stops applying");
                durability.durable.send_modify(|d| d.failed = Some(error.to_string()));
                return;
            }
        }
    }
}

impl Debug for LogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogStore").field("path", &self.db.path()).finish()
    }
}

impl LogStore {
    /// Opens the log of member `node` in `dir`, creating the database and
    /// its column families if they do not exist yet.
    pub fn open(dir: &Path, node: NodeId) -> Result<LogStore, OpenError> {
        let mut options = Options::default();
        options.create_if_missing(true);
        options.create_missing_column_families(true);
        // Memtable flushes sync a megabyte at a time rather than in one
        // large fsync that the log's own WAL syncs would queue behind.
        options.set_bytes_per_sync(1 << 20);
        // Every write waits for a follower's fsync of this WAL. On ext4 an
        // fsync after appending to a growing file also commits the new file
        // size through the journal; overwriting a recycled WAL does not.
        // Three processes appending 450 bytes and fsyncing each on this
        // machine's disk: 190-200 us per fsync growing, 130-145 overwriting
        // (p99 325-375 vs 220-260). etcd preallocates its WAL segments for
        // the same reason. Both column families flush together, so the
        // `meta` family's small writes (committed id) never pin an old WAL
        // and keep it from being recycled.
        options.set_recycle_log_file_num(WAL_RECYCLE_FILES);
        options.set_atomic_flush(true);
        let column_families = [LOGS_CF, META_CF].into_iter().map(|name| {
            let mut cf = Options::default();
            if name == LOGS_CF {
                cf.set_write_buffer_size(LOGS_WRITE_BUFFER);
            }
            ColumnFamilyDescriptor::new(name, cf)
        });
        let fresh = !dir.join("CURRENT").exists();
        let db = DB::open_cf_descriptors(&options, dir, column_families)
            .map_err(|source| OpenError::Open { path: dir.to_path_buf(), source })?;
        if fresh {
            prime_wal(&db).map_err(|source| OpenError::Open { path: dir.to_path_buf(), source })?;
        }
        // What a crashed process left in the page cache is on disk from here.
        db.flush_wal(true).map_err(|source| OpenError::Open { path: dir.to_path_buf(), source })?;
        let corrupt = |error: AnyError| OpenError::Corrupt { path: dir.to_path_buf(), reason: error.to_string() };
        let last = read_last_log_id(&db).map_err(corrupt)?.map_or(0, |log_id| log_id.index);
        let vote = read_meta(&db, VOTE_KEY).map_err(corrupt)?;
        let db = Arc::new(db);
        let durability = Arc::new(Durability::new(last));
        let handle = {
            let (db, durability) = (Arc::downgrade(&db), Arc::clone(&durability));
            std::thread::Builder::new()
                .name("skiff-wal-sync".into())
                .spawn(move || run_wal_sync(db, durability))
                .map_err(|source| OpenError::Thread { path: dir.to_path_buf(), source })?
        };
        Ok(LogStore {
            _sync_thread: Arc::new(SyncThread { durability: Arc::clone(&durability), handle: Some(handle) }),
            db,
            node,
            vote: Arc::new(Mutex::new(vote)),
            durability,
            appended: Arc::new(AtomicU64::new(0)),
            tail: Arc::default(),
        })
    }

    /// Bytes of entries appended (as leader or follower) since the store was
    /// opened; what drives snapshots besides the entry count.
    pub fn appended_bytes(&self) -> u64 {
        self.appended.load(Ordering::Relaxed)
    }

    /// The durable index of the log, updated as the WAL-sync thread and
    /// synced writes put entries on disk.
    pub fn durable(&self) -> watch::Receiver<Durable> {
        self.durability.durable.subscribe()
    }

    /// Whether `entries` are this member's own, appended as the leader of the
    /// term of its current vote: only the leader of a term creates entries of
    /// that term, so a follower never sees its own term's entries while it
    /// holds that term's vote.
    fn is_own_append(&self, entries: &[Entry]) -> bool {
        let vote = self.vote.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match *vote {
            Some(vote) if vote.leader_id.node_id == self.node => {
                entries.iter().all(|entry| entry.log_id.leader_id == vote.leader_id)
            }
            _ => false,
        }
    }

    /// Whether this node has ever taken part in a Raft group: a vote, a log
    /// entry or a purge record exists. Used to refuse re-initializing.
    ///
    /// A read error counts as "has state": refusing to initialize is the safe
    /// answer when the disk cannot be read.
    pub fn has_state(&self) -> bool {
        match self.read_has_state() {
            Ok(has_state) => has_state,
            Err(error) => {
                tracing::error!(%error, "cannot read raft log; assuming it holds state");
                true
            }
        }
    }

    fn read_has_state(&self) -> Result<bool, AnyError> {
        let meta = column_family(&self.db, META_CF)?;
        for key in [VOTE_KEY, LAST_PURGED_KEY] {
            if self.db.get_pinned_cf(meta, key).map_err(any)?.is_some() {
                return Ok(true);
            }
        }
        let logs = column_family(&self.db, LOGS_CF)?;
        let first = self.db.iterator_cf(logs, IteratorMode::Start).next();
        Ok(first.transpose().map_err(any)?.is_some())
    }

    fn read_meta<T: DeserializeOwned>(&self, key: &[u8]) -> Result<Option<T>, AnyError> {
        read_meta(&self.db, key)
    }

    /// The log id of the entry with the greatest index, if any.
    fn read_last_log_id(&self) -> Result<Option<LogId>, AnyError> {
        read_last_log_id(&self.db)
    }

    fn tail(&self) -> std::sync::MutexGuard<'_, Tail> {
        self.tail.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn read_entries<RB: RangeBounds<u64>>(&self, range: RB) -> Result<Vec<Entry>, AnyError> {
        let start = match range.start_bound() {
            Bound::Included(&index) => index,
            Bound::Excluded(&index) => match index.checked_add(1) {
                Some(index) => index,
                None => return Ok(Vec::new()),
            },
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&index) => index.checked_add(1),
            Bound::Excluded(&index) => Some(index),
            Bound::Unbounded => None,
        };
        if let Some(entries) = end.and_then(|end| self.tail().get(start, end)) {
            return Ok(entries);
        }
        let logs = column_family(&self.db, LOGS_CF)?;
        let start_key = index_key(start);
        let mode = IteratorMode::From(&start_key, Direction::Forward);
        let mut entries = Vec::new();
        for item in self.db.iterator_cf(logs, mode) {
            let (key, value) = item.map_err(any)?;
            // The scan starts inside the range, so the first index outside it
            // is past its end.
            if !range.contains(&key_index(key)?) {
                break;
            }
            entries.push(bincode::deserialize(&value).map_err(any)?);
        }
        Ok(entries)
    }

    /// Serializes `entries` into one batch; `None` if there are none. Also
    /// returns each entry's encoded size.
    fn entries_batch(&self, entries: &[Entry]) -> Result<Option<(WriteBatch, Vec<usize>)>, AnyError> {
        let logs = column_family(&self.db, LOGS_CF)?;
        let mut batch = WriteBatch::default();
        let mut sizes = Vec::with_capacity(entries.len());
        for entry in entries {
            let value = bincode::serialize(entry).map_err(any)?;
            sizes.push(value.len());
            batch.put_cf(logs, index_key(entry.log_id.index), value);
        }
        Ok((!batch.is_empty()).then_some((batch, sizes)))
    }

    /// Writes `entries`; returns the index of the last one, if any.
    async fn append_entries(&self, entries: Vec<Entry>) -> Result<Option<u64>, StorageError> {
        let own = self.is_own_append(&entries);
        let Some(last) = entries.last().map(|entry| entry.log_id.index) else {
            return Ok(None);
        };
        let Some((batch, sizes)) = self.entries_batch(&entries).map_err(StorageIOError::write_logs)? else {
            return Ok(None);
        };
        self.appended.fetch_add(batch.size_in_bytes() as u64, Ordering::Relaxed);
        if own {
            self.write_unsynced(batch).await.map_err(StorageIOError::write_logs)?;
        } else {
            self.write_synced(batch).await.map_err(StorageIOError::write_logs)?;
        }
        {
            let mut tail = self.tail();
            for (entry, size) in entries.into_iter().zip(sizes) {
                tail.push(entry, size);
            }
        }
        if own {
            self.durability.written(last);
        } else {
            self.durability.synced(last);
        }
        Ok(Some(last))
    }

    fn meta_batch<T: Serialize>(&self, key: &[u8], value: &T) -> Result<WriteBatch, AnyError> {
        let meta = column_family(&self.db, META_CF)?;
        let mut batch = WriteBatch::default();
        batch.put_cf(meta, key, bincode::serialize(value).map_err(any)?);
        Ok(batch)
    }

    /// A batch deleting the entries with index in `[from, to)`.
    fn delete_logs_batch(&self, from: u64, to: u64) -> Result<WriteBatch, AnyError> {
        let logs = column_family(&self.db, LOGS_CF)?;
        let mut batch = WriteBatch::default();
        batch.delete_range_cf(logs, index_key(from), index_key(to));
        Ok(batch)
    }

    /// Writes `batch` to the WAL without waiting for an fsync. Small batches
    /// (a leader's usual entry) are written in place: a memtable insert and
    /// a `write(2)` cost less than a hop to the blocking pool.
    async fn write_unsynced(&self, batch: WriteBatch) -> Result<(), AnyError> {
        if batch.size_in_bytes() <= IN_PLACE_BYTES {
            return self.db.write(batch).map_err(any);
        }
        let db = Arc::clone(&self.db);
        tokio::task::spawn_blocking(move || db.write(batch)).await.map_err(any)?.map_err(any)
    }

    /// Writes `batch` and fsyncs the WAL; returns once the batch is on disk.
    ///
    /// Small batches (a follower's usual append) are written and synced in
    /// place, as etcd's raft loop does: openraft awaits the append inline
    /// anyway, so the caller could do nothing meanwhile, and the hops to the
    /// blocking pool and back cost a follower's acknowledgement two thread
    /// wakeups (1-client put p50 0.75 -> 0.67 ms). Another worker keeps
    /// serving meanwhile, so a runtime with a single worker, and large
    /// batches, still use the blocking pool.
    async fn write_synced(&self, batch: WriteBatch) -> Result<(), AnyError> {
        let in_place =
            batch.size_in_bytes() <= IN_PLACE_BYTES && tokio::runtime::Handle::current().metrics().num_workers() > 1;
        let db = Arc::clone(&self.db);
        let write = move || {
            let mut options = WriteOptions::default();
            options.set_sync(true);
            let _timer = crate::metrics::metrics().log_sync_seconds.start_timer();
            db.write_opt(batch, &options)
        };
        if in_place {
            return write().map_err(any);
        }
        tokio::task::spawn_blocking(write).await.map_err(any)?.map_err(any)
    }
}

/// Largest log write done on the calling task rather than the blocking pool.
const IN_PLACE_BYTES: usize = 256 * 1024;

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        Ok(self.read_entries(range).map_err(StorageIOError::read_logs)?)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged_log_id: Option<LogId> = self.read_meta(LAST_PURGED_KEY).map_err(StorageIOError::read_logs)?;
        let last_log_id = self.read_last_log_id().map_err(StorageIOError::read_logs)?.or(last_purged_log_id);
        Ok(LogState { last_purged_log_id, last_log_id })
    }

    async fn get_log_reader(&mut self) -> LogStore {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        let batch = self.meta_batch(VOTE_KEY, vote).map_err(StorageIOError::write_vote)?;
        // Durability: the vote is synced to disk before we return.
        self.write_synced(batch).await.map_err(StorageIOError::write_vote)?;
        *self.vote.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        Ok(self.read_meta(VOTE_KEY).map_err(StorageIOError::read_vote)?)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        // Not synced: losing it only makes openraft re-apply fewer entries on
        // restart, and they are re-applied once committed again.
        let batch = self.meta_batch(COMMITTED_KEY, &committed).map_err(StorageIOError::write)?;
        self.db.write(batch).map_err(|e| StorageIOError::write(&e))?;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        let committed: Option<Option<LogId>> = self.read_meta(COMMITTED_KEY).map_err(StorageIOError::read)?;
        Ok(committed.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let result = self.append_entries(entries.into_iter().collect()).await;
        // Durability: a follower's callback fires only after its synced write
        // has returned; the leader's own once the entries are in the WAL (see
        // the module's durability rules).
        match &result {
            Ok(_) => callback.log_io_completed(Ok(())),
            Err(error) => callback.log_io_completed(Err(io::Error::other(error.clone()))),
        }
        result.map(|_| ())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        tracing::debug!(%log_id, "truncating raft log");
        // Everything from `log_id.index` on goes in one synced write, so the
        // log never has a hole. Indexes never reach `u64::MAX`, so an
        // exclusive end at `u64::MAX` covers the whole tail.
        self.tail().truncate(log_id.index);
        let batch = self.delete_logs_batch(log_id.index, u64::MAX).map_err(StorageIOError::write_logs)?;
        self.write_synced(batch).await.map_err(StorageIOError::write_logs)?;
        self.durability.truncated(log_id.index);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        tracing::debug!(%log_id, "purging raft log");
        // Durability: `last_purged_log_id` is synced before any entry is
        // deleted, so after a crash the log state never claims an entry that
        // is gone.
        let batch = self.meta_batch(LAST_PURGED_KEY, &log_id).map_err(StorageIOError::write_logs)?;
        self.write_synced(batch).await.map_err(StorageIOError::write_logs)?;
        // The deletion is synced too: entries that came back after a crash
        // could sit below `last_purged_log_id` and make the log state go
        // backwards. Purges are rare, so the second fsync is cheap.
        self.tail().purge(log_id.index);
        let batch = self.delete_logs_batch(0, log_id.index.saturating_add(1)).map_err(StorageIOError::write_logs)?;
        self.write_synced(batch).await.map_err(StorageIOError::write_logs)?;
        Ok(())
    }
}

fn read_meta<T: DeserializeOwned>(db: &DB, key: &[u8]) -> Result<Option<T>, AnyError> {
    let meta = column_family(db, META_CF)?;
    match db.get_pinned_cf(meta, key).map_err(any)? {
        Some(bytes) => Ok(Some(bincode::deserialize(&bytes).map_err(any)?)),
        None => Ok(None),
    }
}

fn read_last_log_id(db: &DB) -> Result<Option<LogId>, AnyError> {
    let logs = column_family(db, LOGS_CF)?;
    match db.iterator_cf(logs, IteratorMode::End).next() {
        Some(item) => {
            let (_, value) = item.map_err(any)?;
            let entry: Entry = bincode::deserialize(&value).map_err(any)?;
            Ok(Some(entry.log_id))
        }
        None => Ok(None),
    }
}

/// WAL files kept for reuse (see [`LogStore::open`]).
const WAL_RECYCLE_FILES: usize = 4;

/// Memtable size of the `logs` family, and so about the size of each WAL.
const LOGS_WRITE_BUFFER: usize = 8 << 20;

/// Gives a new log database recycled WAL files from its first write on, as
/// etcd preallocates its first WAL segment: twice, a WAL-sized filler record
/// is written, deleted and flushed, which retires the WAL holding it to the
/// recycle list. About 16 MB of writes, once per data directory; a
/// reopened database recycles the WALs of its last run.
fn prime_wal(db: &DB) -> Result<(), rocksdb::Error> {
    const FILLER_KEY: &[u8] = b"wal-filler";
    let families = [LOGS_CF, META_CF].map(|name| db.cf_handle(name).expect("column families were opened"));
    let meta = families[1];
    let filler = vec![0u8; LOGS_WRITE_BUFFER];
    for _ in 0..2 {
        db.put_cf(meta, FILLER_KEY, &filler)?;
        db.delete_cf(meta, FILLER_KEY)?;
        db.flush_cfs_opt(&families, &rocksdb::FlushOptions::default())?;
    }
    Ok(())
}

fn column_family<'a>(db: &'a DB, name: &'static str) -> Result<&'a ColumnFamily, AnyError> {
    db.cf_handle(name).ok_or_else(|| any(LayoutError::MissingColumnFamily(name)))
}

fn index_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

fn key_index(key: Box<[u8]>) -> Result<u64, AnyError> {
    match <[u8; 8]>::try_from(&*key) {
        Ok(bytes) => Ok(u64::from_be_bytes(bytes)),
        Err(_) => Err(any(LayoutError::BadIndexKey(key))),
    }
}

fn any<E: std::error::Error + 'static>(error: E) -> AnyError {
    AnyError::new(&error)
}

#[cfg(test)]
mod tests {
    use openraft::storage::RaftLogStorageExt;
    use openraft::testing::log_id;
    use openraft::EntryPayload;

    use super::*;
    use crate::types::Batch;

    fn entry(term: u64, index: u64) -> Entry {
        Entry {
            log_id: log_id(term, 1, index),
            payload: EntryPayload::Normal(Batch { timestamp_ms: index, proposals: Arc::from([]) }),
        }
    }

    fn indexes(entries: &[Entry]) -> Vec<u64> {
        entries.iter().map(|entry| entry.log_id.index).collect()
    }

    /// Appends entries `1..=last` in term 1.
    async fn append_up_to(store: &mut LogStore, last: u64) -> anyhow::Result<()> {
        store.blocking_append((1..=last).map(|index| entry(1, index))).await?;
        Ok(())
    }

    /// An entry whose one proposal carries `value_bytes` bytes.
    fn sized_entry(term: u64, index: u64, value_bytes: usize) -> Entry {
        use crate::types::{Command, Op, Proposal, PutRequest, RequestId, Txn};
        let put = PutRequest { key: index.to_be_bytes().to_vec(), value: vec![7; value_bytes], ..Default::default() };
        let proposal = Proposal {
            id: RequestId::at(index, term),
            command: Command::Txn(Txn { success: vec![Op::Put(put)], ..Default::default() }),
        };
        Entry {
            log_id: log_id(term, 1, index),
            payload: EntryPayload::Normal(Batch { timestamp_ms: index, proposals: Arc::from([proposal]) }),
        }
    }

    /// Bounded reads (what openraft asks for) are served from the in-memory
    /// tail when it holds them: they must read exactly what the log holds
    /// through appends, truncations, purges and tails longer than the
    /// memory bound. Checked against a model of the log.
    #[tokio::test]
    async fn bounded_reads_match_the_log_through_appends_truncations_and_purges() -> anyhow::Result<()> {
        use rand::{Rng, SeedableRng};
        let dir = tempfile::tempdir()?;
        let mut store = LogStore::open(dir.path(), 1)?;
        let mut model: std::collections::BTreeMap<u64, Entry> = Default::default();
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let (mut term, mut next) = (1, 1);
        for _ in 0..400 {
            match rng.gen_range(0..12) {
                0 if !model.is_empty() => {
                    let first = *model.keys().next().unwrap();
                    let at = rng.gen_range(first..next);
                    term += 1;
                    store.truncate(log_id(term, 1, at)).await?;
                    model.split_off(&at);
                    next = at;
                }
                1 if !model.is_empty() => {
                    let at = rng.gen_range(*model.keys().next().unwrap()..next);
                    store.purge(log_id(term, 1, at)).await?;
                    model = model.split_off(&(at + 1));
                }
                _ => {
                    let n = rng.gen_range(1..20);
                    // Now and then entries big enough to push the oldest out
                    // of the tail's memory bound.
                    let size = if rng.gen_range(0..8) == 0 { 3 << 20 } else { 100 };
                    let entries: Vec<Entry> = (next..next + n).map(|i| sized_entry(term, i, size)).collect();
                    store.blocking_append(entries.clone()).await?;
                    model.extend(entries.into_iter().map(|e| (e.log_id.index, e)));
                    next += n;
                }
            }
            for _ in 0..4 {
                let start = rng.gen_range(next.saturating_sub(40)..=next);
                let end = rng.gen_range(start..=next + 1);
                let want: Vec<Entry> = model.range(start..end).map(|(_, e)| e.clone()).collect();
                assert_eq!(store.try_get_log_entries(start..end).await?, want, "entries {start}..{end}");
                let got = store.try_get_log_entries(start..=end).await?;
                assert_eq!(got, model.range(start..=end).map(|(_, e)| e.clone()).collect::<Vec<_>>());
            }
        }
        Ok(())
    }

    /// What openraft reads back right after an append comes from memory,
    /// not the database; older entries beyond the bound come from disk.
    #[tokio::test]
    async fn the_newest_entries_are_read_from_memory() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let mut store = LogStore::open(dir.path(), 1)?;
        let big = TAIL_BYTES / 4 + 1;
        store.blocking_append((1..=8).map(|i| sized_entry(1, i, big))).await?;
        // Remove every entry from the database behind the store's back.
        store.db.write(store.delete_logs_batch(0, u64::MAX)?)?;
        // The newest entries are still read; the oldest ones were beyond
        // the bound and are gone with the database's copy.
        assert_eq!(indexes(&store.try_get_log_entries(6..9).await?), [6, 7, 8]);
        assert!(store.try_get_log_entries(1..9).await?.is_empty());
        Ok(())
    }

    #[tokio::test]
    async fn vote_survives_reopen() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let vote = Vote::new_committed(3, 2);
        {
            let mut store = LogStore::open(dir.path(), 1)?;
            assert_eq!(store.read_vote().await?, None);
            store.save_vote(&vote).await?;
        }
        let mut store = LogStore::open(dir.path(), 1)?;
        assert_eq!(store.read_vote().await?, Some(vote));
        Ok(())
    }

    #[tokio::test]
    async fn appended_entries_survive_reopen_and_read_back_in_order() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        {
            let mut store = LogStore::open(dir.path(), 1)?;
            // More than 255 entries, so byte order differs from a
            // little-endian key order.
            append_up_to(&mut store, 300).await?;
        }
        let mut store = LogStore::open(dir.path(), 1)?;
        let all = store.try_get_log_entries(..).await?;
        assert_eq!(indexes(&all), (1..=300).collect::<Vec<_>>());
        assert_eq!(all[41], entry(1, 42));
        assert_eq!(indexes(&store.try_get_log_entries(255..258).await?), [255, 256, 257]);
        assert_eq!(indexes(&store.try_get_log_entries(..=2).await?), [1, 2]);
        assert!(store.try_get_log_entries(301..).await?.is_empty());
        let state = store.get_log_state().await?;
        assert_eq!(state.last_log_id, Some(log_id(1, 1, 300)));
        assert_eq!(state.last_purged_log_id, None);
        Ok(())
    }

    #[tokio::test]
    async fn truncate_removes_the_tail() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let mut store = LogStore::open(dir.path(), 1)?;
        append_up_to(&mut store, 10).await?;
        store.truncate(log_id(1, 1, 6)).await?;
        assert_eq!(indexes(&store.try_get_log_entries(..).await?), [1, 2, 3, 4, 5]);
        assert_eq!(store.get_log_state().await?.last_log_id, Some(log_id(1, 1, 5)));

        // A new leader's entries replace the truncated tail.
        store.blocking_append([entry(2, 6)]).await?;
        assert_eq!(store.try_get_log_entries(6..).await?, [entry(2, 6)]);
        Ok(())
    }

    #[tokio::test]
    async fn purge_removes_the_head_and_log_state_reports_last_purged() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        {
            let mut store = LogStore::open(dir.path(), 1)?;
            append_up_to(&mut store, 10).await?;
            store.purge(log_id(1, 1, 4)).await?;
            assert_eq!(indexes(&store.try_get_log_entries(..).await?), [5, 6, 7, 8, 9, 10]);
        }
        let mut store = LogStore::open(dir.path(), 1)?;
        let state = store.get_log_state().await?;
        assert_eq!(state.last_purged_log_id, Some(log_id(1, 1, 4)));
        assert_eq!(state.last_log_id, Some(log_id(1, 1, 10)));

        // With every entry purged, the last log id is the last purged one.
        store.purge(log_id(1, 1, 10)).await?;
        assert!(store.try_get_log_entries(..).await?.is_empty());
        let state = store.get_log_state().await?;
        assert_eq!(state.last_purged_log_id, Some(log_id(1, 1, 10)));
        assert_eq!(state.last_log_id, Some(log_id(1, 1, 10)));
        Ok(())
    }

    #[tokio::test]
    async fn has_state_is_false_on_a_fresh_dir_and_true_after_save_vote() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let mut store = LogStore::open(dir.path(), 1)?;
        assert!(!store.has_state());
        store.save_vote(&Vote::new(1, 1)).await?;
        assert!(store.has_state());
        Ok(())
    }

    #[tokio::test]
    async fn has_state_is_true_after_append() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let mut store = LogStore::open(dir.path(), 1)?;
        append_up_to(&mut store, 1).await?;
        assert!(store.has_state());
        Ok(())
    }

    #[tokio::test]
    async fn committed_survives_reopen() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        {
            let mut store = LogStore::open(dir.path(), 1)?;
            assert_eq!(store.read_committed().await?, None);
            store.save_committed(Some(log_id(1, 1, 7))).await?;
        }
        let mut store = LogStore::open(dir.path(), 1)?;
        assert_eq!(store.read_committed().await?, Some(log_id(1, 1, 7)));
        Ok(())
    }

    use std::time::Duration;

    /// Waits (bounded) until the published durable index reaches `index`.
    async fn durable_reaches(store: &LogStore, index: u64) -> anyhow::Result<()> {
        let mut durable = store.durable();
        tokio::time::timeout(Duration::from_secs(10), durable.wait_for(|d| d.index >= index)).await??;
        Ok(())
    }

    #[tokio::test]
    async fn a_followers_append_is_durable_when_it_returns() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let mut store = LogStore::open(dir.path(), 1)?;
        // Node 1 votes for node 2: entries of term 2 by node 2 are a follower's.
        store.save_vote(&Vote::new_committed(2, 2)).await?;
        store.blocking_append((1..=5).map(|index| Entry { log_id: log_id(2, 2, index), ..entry(2, index) })).await?;
        assert!(!store.is_own_append(&[Entry { log_id: log_id(2, 2, 6), ..entry(2, 6) }]));
        assert_eq!(store.durable().borrow().index, 5);
        Ok(())
    }

    #[tokio::test]
    async fn the_leaders_own_append_becomes_durable_through_the_sync_thread() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        {
            let mut store = LogStore::open(dir.path(), 1)?;
            store.save_vote(&Vote::new_committed(1, 1)).await?;
            assert!(store.is_own_append(&[entry(1, 1)]));
            // Entries of an older term by this node are not the leader's own
            // appends of its current term.
            store.save_vote(&Vote::new_committed(3, 1)).await?;
            assert!(!store.is_own_append(&[entry(1, 1)]));
            store.save_vote(&Vote::new_committed(1, 1)).await?;
            for last in [10, 20, 300] {
                let first = store.durable().borrow().index + 1;
                store.blocking_append((first..=last).map(|index| entry(1, index))).await?;
                // Readable at once (openraft replicates from the store) ...
                assert_eq!(store.try_get_log_entries(last..=last).await?, [entry(1, last)]);
                // ... and on disk soon after.
                durable_reaches(&store, last).await?;
            }
        }
        let mut store = LogStore::open(dir.path(), 1)?;
        assert_eq!(store.get_log_state().await?.last_log_id, Some(log_id(1, 1, 300)));
        assert_eq!(store.durable().borrow().index, 300);
        assert_eq!(store.read_vote().await?, Some(Vote::new_committed(1, 1)));
        Ok(())
    }

    #[tokio::test]
    async fn truncate_lowers_the_durable_index() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let mut store = LogStore::open(dir.path(), 1)?;
        append_up_to(&mut store, 10).await?;
        assert_eq!(store.durable().borrow().index, 10);
        store.truncate(log_id(1, 1, 4)).await?;
        assert_eq!(store.durable().borrow().index, 3);
        store.blocking_append([entry(2, 4)]).await?;
        assert_eq!(store.durable().borrow().index, 4);
        Ok(())
    }

    #[tokio::test]
    async fn opening_a_locked_dir_names_the_path() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let _held = LogStore::open(dir.path(), 1)?;
        let error = LogStore::open(dir.path(), 1).expect_err("second open must fail on the lock");
        let message = error.to_string();
        assert!(message.contains(&dir.path().display().to_string()), "{message}");
        Ok(())
    }
}
