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
//! - `append` writes all its entries in one synced `WriteBatch` and reports
//!   completion to openraft only after that write has returned.
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

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{AnyError, StorageIOError, Vote};
use rocksdb::{ColumnFamily, ColumnFamilyDescriptor, Direction, IteratorMode, Options, WriteBatch, WriteOptions, DB};
use serde::de::DeserializeOwned;
use serde::Serialize;

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
    db: Arc<DB>,
}

impl Debug for LogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogStore").field("path", &self.db.path()).finish()
    }
}

impl LogStore {
    /// Opens the log in `dir`, creating the database and its column families
    /// if they do not exist yet.
    pub fn open(dir: &Path) -> Result<LogStore, OpenError> {
        let mut options = Options::default();
        options.create_if_missing(true);
        options.create_missing_column_families(true);
        let column_families =
            [LOGS_CF, META_CF].into_iter().map(|name| ColumnFamilyDescriptor::new(name, Options::default()));
        let db = DB::open_cf_descriptors(&options, dir, column_families)
            .map_err(|source| OpenError::Open { path: dir.to_path_buf(), source })?;
        Ok(LogStore { db: Arc::new(db) })
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
        let meta = column_family(&self.db, META_CF)?;
        match self.db.get_pinned_cf(meta, key).map_err(any)? {
            Some(bytes) => Ok(Some(bincode::deserialize(&bytes).map_err(any)?)),
            None => Ok(None),
        }
    }

    /// The log id of the entry with the greatest index, if any.
    fn read_last_log_id(&self) -> Result<Option<LogId>, AnyError> {
        let logs = column_family(&self.db, LOGS_CF)?;
        match self.db.iterator_cf(logs, IteratorMode::End).next() {
            Some(item) => {
                let (_, value) = item.map_err(any)?;
                let entry: Entry = bincode::deserialize(&value).map_err(any)?;
                Ok(Some(entry.log_id))
            }
            None => Ok(None),
        }
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

    /// Serializes `entries` into one batch; `None` if there are none.
    fn entries_batch<I>(&self, entries: I) -> Result<Option<WriteBatch>, AnyError>
    where
        I: IntoIterator<Item = Entry>,
    {
        let logs = column_family(&self.db, LOGS_CF)?;
        let mut batch = WriteBatch::default();
        for entry in entries {
            let value = bincode::serialize(&entry).map_err(any)?;
            batch.put_cf(logs, index_key(entry.log_id.index), value);
        }
        Ok((!batch.is_empty()).then_some(batch))
    }

    async fn append_entries<I>(&self, entries: I) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry>,
    {
        let Some(batch) = self.entries_batch(entries).map_err(StorageIOError::write_logs)? else {
            return Ok(());
        };
        self.write_synced(batch).await.map_err(StorageIOError::write_logs)?;
        Ok(())
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

    /// Writes `batch` and fsyncs the WAL, on tokio's blocking pool; returns
    /// once the batch is on disk.
    async fn write_synced(&self, batch: WriteBatch) -> Result<(), AnyError> {
        let db = Arc::clone(&self.db);
        tokio::task::spawn_blocking(move || {
            let mut options = WriteOptions::default();
            options.set_sync(true);
            let _timer = crate::metrics::metrics().log_sync_seconds.start_timer();
            db.write_opt(batch, &options)
        })
        .await
        .map_err(any)?
        .map_err(any)
    }
}

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
        let result = self.append_entries(entries).await;
        // Durability: the callback tells openraft the entries are on disk, so
        // it fires only after the synced write has returned (or failed).
        match &result {
            Ok(()) => callback.log_io_completed(Ok(())),
            Err(error) => callback.log_io_completed(Err(io::Error::other(error.clone()))),
        }
        result
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        tracing::debug!(%log_id, "truncating raft log");
        // Everything from `log_id.index` on goes in one synced write, so the
        // log never has a hole. Indexes never reach `u64::MAX`, so an
        // exclusive end at `u64::MAX` covers the whole tail.
        let batch = self.delete_logs_batch(log_id.index, u64::MAX).map_err(StorageIOError::write_logs)?;
        self.write_synced(batch).await.map_err(StorageIOError::write_logs)?;
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
        let batch = self.delete_logs_batch(0, log_id.index.saturating_add(1)).map_err(StorageIOError::write_logs)?;
        self.write_synced(batch).await.map_err(StorageIOError::write_logs)?;
        Ok(())
    }
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
            payload: EntryPayload::Normal(Batch { timestamp_ms: index, proposals: Vec::new() }),
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

    #[tokio::test]
    async fn vote_survives_reopen() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let vote = Vote::new_committed(3, 2);
        {
            let mut store = LogStore::open(dir.path())?;
            assert_eq!(store.read_vote().await?, None);
            store.save_vote(&vote).await?;
        }
        let mut store = LogStore::open(dir.path())?;
        assert_eq!(store.read_vote().await?, Some(vote));
        Ok(())
    }

    #[tokio::test]
    async fn appended_entries_survive_reopen_and_read_back_in_order() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        {
            let mut store = LogStore::open(dir.path())?;
            // More than 255 entries, so byte order differs from a
            // little-endian key order.
            append_up_to(&mut store, 300).await?;
        }
        let mut store = LogStore::open(dir.path())?;
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
        let mut store = LogStore::open(dir.path())?;
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
            let mut store = LogStore::open(dir.path())?;
            append_up_to(&mut store, 10).await?;
            store.purge(log_id(1, 1, 4)).await?;
            assert_eq!(indexes(&store.try_get_log_entries(..).await?), [5, 6, 7, 8, 9, 10]);
        }
        let mut store = LogStore::open(dir.path())?;
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
        let mut store = LogStore::open(dir.path())?;
        assert!(!store.has_state());
        store.save_vote(&Vote::new(1, 1)).await?;
        assert!(store.has_state());
        Ok(())
    }

    #[tokio::test]
    async fn has_state_is_true_after_append() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let mut store = LogStore::open(dir.path())?;
        append_up_to(&mut store, 1).await?;
        assert!(store.has_state());
        Ok(())
    }

    #[tokio::test]
    async fn committed_survives_reopen() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        {
            let mut store = LogStore::open(dir.path())?;
            assert_eq!(store.read_committed().await?, None);
            store.save_committed(Some(log_id(1, 1, 7))).await?;
        }
        let mut store = LogStore::open(dir.path())?;
        assert_eq!(store.read_committed().await?, Some(log_id(1, 1, 7)));
        Ok(())
    }

    #[tokio::test]
    async fn opening_a_locked_dir_names_the_path() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let _held = LogStore::open(dir.path())?;
        let error = LogStore::open(dir.path()).expect_err("second open must fail on the lock");
        let message = error.to_string();
        assert!(message.contains(&dir.path().display().to_string()), "{message}");
        Ok(())
    }
}
