//! The Raft state machine: the MVCC engine's database plus what openraft
//! needs to restart from it (last applied log id and membership).
//!
//! Data flow: openraft hands committed entries to [`StateMachine::apply`],
//! which runs the [`Applier`] over them off the async workers and commits
//! data, revision counters, `last_applied` and membership in **one**
//! `WriteBatch`, so a SIGKILL at any instant leaves a consistent state that
//! openraft completes by re-applying `(last_applied, committed]`. Only then
//! are the revisions published to the watch [`Hub`].
//!
//! The database lives in `sm/db-<n>`, named by `sm/CURRENT`. A snapshot is a
//! RocksDB checkpoint of it, taken while applies go on (the log id it covers
//! is read from the checkpoint itself), then packed into one file in the
//! background; installing one unpacks it into a fresh `db-<n+1>`, syncs it,
//! and only then flips `CURRENT`.
//!
//! An entry is applied only once the Raft log has it on this member's disk
//! ([`StateMachine::gate_applies_on`]): the leader writes its own entries
//! without waiting for the fsync, so this is what keeps a reply or a
//! published revision from getting ahead of the leader's disk.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{EntryPayload, RaftSnapshotBuilder, StorageIOError};
use rocksdb::DB;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::auth::{AuthCommand, AuthView};
use crate::hub::{Hub, HubMessage};
use crate::latest::LatestCache;
use crate::mvcc::{self, cf, encode, Applier, Reader, CF_META};
use crate::types::{
    now_ms, BatchResponse, Command, LogId, MemberInfo, NodeId, SnapshotMeta, StorageError, StoredMembership, TypeConfig,
};

const META_LAST_APPLIED: &[u8] = b"last_applied";
const META_MEMBERSHIP: &[u8] = b"membership";
const META_MEMBER_PREFIX: &[u8] = b"member/";

/// How often (at most) applies re-read the database size, in ms.
const DB_SIZE_REFRESH_MS: u64 = 500;

/// Memory for the applier's cache of newest records (keys and values).
const LATEST_CACHE_BYTES: usize = 64 * 1024 * 1024;

/// Batches of at most this many writes, and this many bytes, are applied
/// on the async worker; bigger ones on the blocking pool, so that a worker
/// (and the heartbeats it serves) is never held for long.
const APPLY_IN_PLACE_PROPOSALS: usize = 16;
const APPLY_IN_PLACE_BYTES: u64 = 64 * 1024;

/// Values bigger than this are not kept in the applier's record cache.
const LATEST_CACHE_MAX_VALUE: usize = 64 * 1024;

/// A range with no limit, revision filter, sort or projection: the cache
/// answers only those.
fn is_plain_range(req: &crate::types::RangeRequest) -> bool {
    use crate::types::{SortOrder, SortTarget};
    req.limit == 0
        && req.sort_order == SortOrder::None
        && req.sort_target == SortTarget::Key
        && !req.keys_only
        && !req.count_only
        && req.min_mod_revision == 0
        && req.max_mod_revision == 0
        && req.min_create_revision == 0
        && req.max_create_revision == 0
}

fn member_key(id: NodeId) -> Vec<u8> {
    let mut k = META_MEMBER_PREFIX.to_vec();
    k.extend_from_slice(&id.to_be_bytes());
    k
}

/// What the applier has reached, for readers that must wait for it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    pub index: u64,
    pub revision: i64,
}

/// Failures opening the state machine.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("cannot open state machine at {path}: {source}")]
    Rocks { path: PathBuf, source: rocksdb::Error },
    #[error("state machine at {path} is unreadable: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

struct Shared {
    dir: PathBuf,
    snapshot_dir: PathBuf,
    db: RwLock<Arc<DB>>,
    hub: Hub,
    applied: watch::Sender<Applied>,
    compacted: AtomicI64,
    /// Cached database size in bytes; see [`StateMachine::db_size`].
    db_size: AtomicU64,
    /// Last applied log id and membership, as committed with the data.
    raft_state: Mutex<(Option<LogId>, StoredMembership)>,
    /// The file openraft is writing an incoming snapshot into.
    receiving: Mutex<Option<PathBuf>>,
    /// When the cached database size was last read (ms since the epoch).
    db_size_read_ms: AtomicU64,
    /// Held while snapshot files are packed or removed, so that a snapshot
    /// being packed for a follower is not deleted under it by a newer one.
    snapshot_files: Mutex<()>,
    /// Newest records of recently written keys, for the applier; see
    /// [`LatestCache`]. Locked for a whole apply.
    latest: Mutex<LatestCache>,
    /// The Raft log's durable index: an entry is applied only once it is on
    /// this member's disk (see the log store's durability rules).
    log_durable: std::sync::OnceLock<watch::Receiver<crate::log_store::Durable>>,
    /// The auth store as last applied, with permissions merged: replaced
    /// (never changed in place) after an apply that changed it and after a
    /// snapshot install, so a request checks against one consistent view.
    auth: RwLock<Arc<AuthView>>,
    /// Where applied `Authenticate` commands register their tokens (this
    /// member's token store, in memory only). Set once, before Raft starts.
    tokens: std::sync::OnceLock<Arc<crate::auth::token::Tokens>>,
}

/// A cheap handle: openraft owns one, the servers clone others for reads.
#[derive(Clone)]
pub struct StateMachine {
    shared: Arc<Shared>,
}

#[derive(Serialize, Deserialize)]
struct StoredSnapshotMeta {
    meta: SnapshotMeta,
}

fn io_err(path: &Path) -> impl Fn(io::Error) -> OpenError + '_ {
    move |source| OpenError::Io { path: path.to_path_buf(), source }
}

fn sm_error(e: impl std::fmt::Display) -> StorageError {
    StorageIOError::write_state_machine(&io::Error::other(e.to_string())).into()
}

fn snapshot_error(e: impl std::fmt::Display) -> StorageError {
    StorageIOError::write_snapshot(None, &io::Error::other(e.to_string())).into()
}

impl StateMachine {
    /// Opens the state machine under `data_dir`, creating an empty one if none exists.
    pub fn open(data_dir: &Path) -> Result<Self, OpenError> {
        let dir = data_dir.join("sm");
        let snapshot_dir = data_dir.join("snapshots");
        std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        std::fs::create_dir_all(&snapshot_dir).map_err(io_err(&snapshot_dir))?;
        // Half-received or half-built snapshots from before a restart are of no use.
        for e in std::fs::read_dir(&snapshot_dir).map_err(io_err(&snapshot_dir))?.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if name.starts_with("incoming-") {
                let _ = std::fs::remove_file(e.path());
            } else if name.starts_with("building-") {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        let current = dir.join("CURRENT");
        let name = match std::fs::read_to_string(&current) {
            Ok(s) => s.trim().to_string(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                write_durably(&current, b"db-1").map_err(io_err(&current))?;
                "db-1".to_string()
            }
            Err(e) => return Err(OpenError::Io { path: current, source: e }),
        };
        let db_path = dir.join(&name);
        let db = mvcc::open_db(&db_path).map_err(|source| OpenError::Rocks { path: db_path.clone(), source })?;
        let (last_applied, membership) =
            read_raft_state(&db).map_err(|reason| OpenError::Corrupt { path: db_path.clone(), reason })?;
        let reader = Reader::live(&db);
        let corrupt = |e: mvcc::EngineError| OpenError::Corrupt { path: db_path.clone(), reason: e.to_string() };
        let applied =
            Applied { index: last_applied.map_or(0, |l| l.index), revision: reader.revision().map_err(corrupt)? };
        let compacted = reader.compacted().map_err(corrupt)?;
        let auth = reader.auth().map_err(corrupt)?;
        drop(reader);
        let (applied_tx, _) = watch::channel(applied);
        let sm = StateMachine {
            shared: Arc::new(Shared {
                dir,
                snapshot_dir,
                db: RwLock::new(Arc::new(db)),
                hub: Hub::default(),
                applied: applied_tx,
                compacted: AtomicI64::new(compacted),
                db_size: AtomicU64::new(0),
                raft_state: Mutex::new((last_applied, membership)),
                receiving: Mutex::new(None),
                log_durable: std::sync::OnceLock::new(),
                db_size_read_ms: AtomicU64::new(0),
                latest: Mutex::new(LatestCache::new(LATEST_CACHE_BYTES)),
                snapshot_files: Mutex::new(()),
                auth: RwLock::new(Arc::new(AuthView::new(auth))),
                tokens: std::sync::OnceLock::new(),
            }),
        };
        sm.refresh_db_size();
        Ok(sm)
    }

    /// The current database, for reads. Hold it only for one request: a
    /// snapshot install swaps it.
    pub fn db(&self) -> Arc<DB> {
        self.shared.db.read().expect("state machine lock poisoned").clone()
    }

    /// Makes applied `Authenticate` commands register their tokens in
    /// `tokens`. Set once, before Raft starts.
    pub fn register_tokens_in(&self, tokens: Arc<crate::auth::token::Tokens>) {
        let _ = self.shared.tokens.set(tokens);
    }

    /// The auth store as last applied.
    pub fn auth(&self) -> Arc<AuthView> {
        self.shared.auth.read().expect("state machine lock poisoned").clone()
    }

    pub fn hub(&self) -> &Hub {
        &self.shared.hub
    }

    /// The applied index and revision, updated after each commit.
    pub fn applied(&self) -> watch::Receiver<Applied> {
        self.shared.applied.subscribe()
    }

    pub fn revision(&self) -> i64 {
        self.shared.applied.borrow().revision
    }

    /// etcd's Range at the current revision, with the revision it was
    /// read at, answered from the cache of newest records: a key the cache
    /// holds, or a plain range whose answer it kept
    /// ([`StateMachine::remember_read`]). `None` when it cannot answer (an
    /// older revision, a key or range not cached, or an apply holding the
    /// cache this moment, which is not waited for). The cache is updated
    /// under its lock together with its revision, after the batch is
    /// committed, so an answer is the store's state at that revision, as a
    /// RocksDB snapshot taken then would give it.
    pub fn range_cached(&self, req: &crate::types::RangeRequest) -> Option<(crate::types::RangeResult, i64)> {
        if req.revision != 0 {
            return None;
        }
        let mut latest = self.shared.latest.try_lock().ok()?;
        let revision = latest.revision();
        if revision == 0 {
            return None;
        }
        if req.range_end.is_empty() {
            let record = latest.read(&req.key)?;
            return Some((mvcc::range_of_one(req, &req.key, record.as_ref()), revision));
        }
        if !is_plain_range(req) {
            return None;
        }
        latest.range(&req.key, &req.range_end).map(|result| (result.clone(), revision))
    }

    /// Keeps what a read at the current revision found in RocksDB, so the
    /// next read of the same key or range is answered from the cache: a
    /// key's newest record, or a plain range's answer. `revision` is the
    /// revision of the view read; nothing is kept if a batch was applied
    /// since (or an apply holds the cache this moment).
    pub fn remember_read(&self, req: &crate::types::RangeRequest, result: &crate::types::RangeResult, revision: i64) {
        if req.revision != 0 || !is_plain_range(req) || req.range_end == b"\0" {
            return;
        }
        let Ok(mut latest) = self.shared.latest.try_lock() else { return };
        if revision == 0 || latest.revision() != revision {
            return;
        }
        if !req.range_end.is_empty() {
            latest.insert_range(&req.key, &req.range_end, result.clone());
            return;
        }
        match result.kvs.first() {
            Some(kv) if kv.value.len() > LATEST_CACHE_MAX_VALUE => {}
            Some(kv) => latest.insert(
                kv.key.clone(),
                Some(mvcc::KvRecord {
                    create_revision: kv.create_revision,
                    mod_revision: kv.mod_revision,
                    version: kv.version,
                    lease: kv.lease,
                    value: kv.value.clone(),
                    deleted: false,
                }),
            ),
            None => latest.insert(req.key.clone(), None),
        }
    }

    pub fn compacted(&self) -> i64 {
        self.shared.compacted.load(Ordering::Acquire)
    }

    /// Waits until the entry at `index` has been applied here.
    pub async fn wait_applied(&self, index: u64) {
        let mut rx = self.applied();
        // The sender lives as long as `self`, so this cannot fail.
        let _ = rx.wait_for(|a| a.index >= index).await;
    }

    /// Members' published names and URLs.
    pub fn members(&self) -> Vec<MemberInfo> {
        let db = self.db();
        let mut out = Vec::new();
        let mut it = db.raw_iterator_cf(cf(&db, CF_META));
        it.seek(META_MEMBER_PREFIX);
        while let (Some(k), Some(v)) = (it.key(), it.value()) {
            if !k.starts_with(META_MEMBER_PREFIX) {
                break;
            }
            if let Ok(m) = bincode::deserialize::<MemberInfo>(v) {
                out.push(m);
            }
            it.next();
        }
        out
    }

    /// The membership as last applied here.
    pub fn membership(&self) -> StoredMembership {
        self.shared.raft_state.lock().expect("state machine lock poisoned").1.clone()
    }

    /// Approximate on-disk size of the state-machine database, as of the
    /// last apply, install or space reclaim (cheap: the quota check reads it
    /// on every write).
    pub fn db_size(&self) -> u64 {
        self.shared.db_size.load(Ordering::Acquire)
    }

    /// Re-reads the database size unless it was read less than `period_ms`
    /// ago: ten property reads per apply would cost more than the quota
    /// check needs (it tolerates being a moment late, as etcd's does).
    fn refresh_db_size_at_most_every(&self, period_ms: u64) {
        let now = now_ms();
        let last = self.shared.db_size_read_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= period_ms {
            self.refresh_db_size();
        }
    }

    /// Measures the database size (SST files plus memtables) and caches it.
    pub(crate) fn refresh_db_size(&self) {
        self.shared.db_size_read_ms.store(now_ms(), Ordering::Relaxed);
        let db = self.db();
        let size = mvcc::COLUMN_FAMILIES
            .iter()
            .filter_map(|name| db.property_int_value_cf(cf(&db, name), "rocksdb.total-sst-files-size").ok().flatten())
            .sum::<u64>()
            + mvcc::COLUMN_FAMILIES
                .iter()
                .filter_map(|name| {
                    db.property_int_value_cf(cf(&db, name), "rocksdb.cur-size-all-mem-tables").ok().flatten()
                })
                .sum::<u64>();
        self.shared.db_size.store(size, Ordering::Release);
    }

    /// Flushes and fully compacts the database so that space freed by
    /// deletes and history compaction is returned to the filesystem (what
    /// etcd calls defragmentation). Blocking: run it off the async workers.
    pub fn reclaim_space(&self) -> Result<(), rocksdb::Error> {
        let db = self.db();
        // All families in one flush: applies bypass the WAL, so the families
        // on disk must always be at the same point (see `mvcc::open_db`).
        let families: Vec<_> = mvcc::COLUMN_FAMILIES.iter().map(|name| cf(&db, name)).collect();
        db.flush_cfs_opt(&families, &rocksdb::FlushOptions::default())?;
        for family in families {
            db.compact_range_cf(family, None::<&[u8]>, None::<&[u8]>);
        }
        self.refresh_db_size();
        Ok(())
    }

    /// Writes a consistent backup of the whole state (a RocksDB checkpoint,
    /// packed into one file) under `data_dir/exports` and returns its path;
    /// the caller removes it. Blocking.
    pub fn export(&self) -> io::Result<PathBuf> {
        let dir = self.shared.dir.parent().unwrap_or(Path::new(".")).join("exports");
        std::fs::create_dir_all(&dir)?;
        let name = format!("backup-{:016x}", rand::random::<u64>());
        let checkpoint = dir.join(format!("{name}.checkpoint"));
        let file = dir.join(format!("{name}.snap"));
        let db = self.db();
        rocksdb::checkpoint::Checkpoint::new(&db)
            .and_then(|c| c.create_checkpoint(&checkpoint))
            .map_err(io::Error::other)?;
        let packed = pack(&checkpoint, &file);
        std::fs::remove_dir_all(&checkpoint)?;
        packed?;
        Ok(file)
    }

    /// Seeds a fresh data dir with the state in `backup` (made by
    /// [`StateMachine::export`], e.g. through `etcdctl snapshot save`): all
    /// keys, history and the revision are kept, while the Raft position and
    /// membership are cleared so that a new cluster can be founded on it.
    /// Every founding member restores the same file, as with etcd.
    pub fn restore(data_dir: &Path, backup: &Path) -> Result<(), OpenError> {
        let dir = data_dir.join("sm");
        if dir.exists() {
            return Err(OpenError::Corrupt {
                path: dir,
                reason: "a restore needs a fresh data dir, and this one has a state machine".into(),
            });
        }
        verify_backup(backup)?;
        std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        let db_path = dir.join("db-1");
        unpack(backup, &db_path).map_err(|e| OpenError::Corrupt {
            path: backup.to_path_buf(),
            reason: format!("not a Skiff backup: {e}"),
        })?;
        let db = mvcc::open_db(&db_path).map_err(|source| OpenError::Rocks { path: db_path.clone(), source })?;
        let meta = cf(&db, CF_META);
        let corrupt = |e: rocksdb::Error| OpenError::Rocks { path: db_path.clone(), source: e };
        if db.get_cf(meta, mvcc::META_REVISION).map_err(corrupt)?.is_none() {
            return Err(OpenError::Corrupt {
                path: backup.to_path_buf(),
                reason: "not a Skiff backup: no revision".into(),
            });
        }
        let mut batch = rocksdb::WriteBatch::default();
        batch.delete_cf(meta, META_LAST_APPLIED);
        batch.delete_cf(meta, META_MEMBERSHIP);
        // Alarms name members of the old cluster, which would never clear them.
        batch.delete_cf(meta, mvcc::META_ALARMS);
        let mut end = META_MEMBER_PREFIX.to_vec();
        end.push(0xff);
        batch.delete_range_cf(meta, META_MEMBER_PREFIX, end.as_slice());
        let mut opts = rocksdb::WriteOptions::default();
        opts.set_sync(true);
        db.write_opt(batch, &opts).map_err(corrupt)?;
        drop(db);
        let current = dir.join("CURRENT");
        write_durably(&current, b"db-1").map_err(io_err(&current))
    }

    fn apply_blocking(&self, entries: Vec<crate::types::Entry>) -> Result<Vec<BatchResponse>, StorageError> {
        let _timer = crate::metrics::metrics().apply_seconds.start_timer();
        let db = self.db();
        let mut latest = self.shared.latest.lock().expect("poisoned");
        let mut applier = Applier::new(&db, &latest).map_err(sm_error)?;
        let compacted_before = applier.compacted;
        let (mut last_applied, mut membership) = self.shared.raft_state.lock().expect("poisoned").clone();
        let mut responses = Vec::with_capacity(entries.len());
        let mut last_ts = None;
        // Tokens of successful `Authenticate` commands, accepted once the batch is committed.
        let mut tokens = Vec::new();
        for entry in entries {
            last_applied = Some(entry.log_id);
            match entry.payload {
                EntryPayload::Blank => responses.push(BatchResponse::default()),
                EntryPayload::Membership(m) => {
                    membership = StoredMembership::new(Some(entry.log_id), m);
                    responses.push(BatchResponse::default());
                }
                EntryPayload::Normal(batch) => {
                    let mut results = Vec::with_capacity(batch.proposals.len());
                    for p in batch.proposals.iter() {
                        if let Command::PublishMember(info) = &p.command {
                            applier.batch.put_cf(cf(&db, CF_META), member_key(info.id), encode(info));
                        }
                        let result = applier.apply(p.id, &p.command, batch.timestamp_ms).map_err(sm_error)?;
                        if let (Command::Auth(AuthCommand::Authenticate { token, user, password_revision }), Ok(_)) =
                            (&p.command, &result)
                        {
                            tokens.push((token.clone(), user.clone(), *password_revision));
                        }
                        results.push(result);
                    }
                    last_ts = Some(batch.timestamp_ms);
                    responses.push(BatchResponse { results });
                }
            }
        }
        if let Some(ts) = last_ts {
            applier.expire_request_ids(ts);
        }
        let compacted = applier.compacted;
        let auth = applier.take_auth();
        // Records with big values are not worth a copy: they are dropped
        // from the cache instead (a later write to the key seeks once).
        let written: Vec<(Vec<u8>, Option<Option<mvcc::KvRecord>>)> = applier
            .take_latest_records()
            .into_iter()
            .map(|(k, r)| match r {
                Some(r) if r.value.len() > LATEST_CACHE_MAX_VALUE => (k, None),
                r => (k, Some(r)),
            })
            .collect();
        let (mut batch, events, revision) = applier.finish();
        batch.put_cf(cf(&db, CF_META), META_LAST_APPLIED, encode(&last_applied));
        batch.put_cf(cf(&db, CF_META), META_MEMBERSHIP, encode(&membership));
        // Neither fsynced nor in RocksDB's WAL: the log holds every applied
        // entry until a snapshot (a checkpoint, which is durable) covers it,
        // and openraft re-applies `(last_applied, committed]` after a crash.
        db.write_opt(batch, &mvcc::apply_write_options()).map_err(sm_error)?;
        for (key, record) in written {
            latest.changed(&key);
            match record {
                Some(record) => latest.insert(key, record),
                None => latest.forget(&key),
            }
        }
        latest.set_revision(revision);
        drop(latest);
        *self.shared.raft_state.lock().expect("poisoned") = (last_applied, membership);
        self.shared.compacted.store(compacted, Ordering::Release);
        if let Some(auth) = auth {
            // Published before the replies go out: a client that changed a
            // permission sees it enforced by its next request to this member.
            *self.shared.auth.write().expect("poisoned") = Arc::new(AuthView::new(auth));
        }
        if let Some(store) = self.shared.tokens.get() {
            for (token, user, password_revision) in tokens {
                store.insert(&token, &user, password_revision);
            }
        }
        self.refresh_db_size_at_most_every(DB_SIZE_REFRESH_MS);
        for ev in events {
            self.shared.hub.publish(HubMessage::Revision(Arc::new(ev)));
        }
        self.shared.applied.send_replace(Applied { index: last_applied.map_or(0, |l| l.index), revision });
        if compacted > compacted_before {
            // History was dropped: give the space back without delaying applies.
            let sm = self.clone();
            std::thread::spawn(move || {
                if let Err(e) = sm.reclaim_space() {
                    tracing::warn!(error = %e, "reclaiming space after compaction failed");
                }
            });
        }
        Ok(responses)
    }

    /// Makes [`RaftStateMachine::apply`] wait until the Raft log has the
    /// entries on disk. Set once, before Raft starts.
    pub fn gate_applies_on(&self, durable: watch::Receiver<crate::log_store::Durable>) {
        let _ = self.shared.log_durable.set(durable);
    }

    fn snapshot_paths(&self, id: &str) -> (PathBuf, PathBuf) {
        let d = &self.shared.snapshot_dir;
        (d.join(format!("{id}.snap")), d.join(format!("{id}.meta")))
    }

    /// Makes a checkpoint into the snapshot directory and records it as the
    /// current snapshot; returns its meta and the meta file's path. Blocking.
    fn checkpoint_snapshot(&self) -> Result<(SnapshotMeta, PathBuf), StorageError> {
        let partial = self.shared.snapshot_dir.join(format!("building-{:016x}.checkpoint", rand::random::<u64>()));
        let db = self.db();
        rocksdb::checkpoint::Checkpoint::new(&db)
            .and_then(|c| c.create_checkpoint(&partial))
            .map_err(snapshot_error)?;
        drop(db);
        let state = {
            let opts = rocksdb::Options::default();
            let checkpoint =
                DB::open_cf_for_read_only(&opts, &partial, mvcc::COLUMN_FAMILIES, false).map_err(snapshot_error)?;
            read_raft_state(&checkpoint).map_err(snapshot_error)?
        };
        let (last_applied, membership) = state;
        let snapshot_id = format!(
            "{}-{}-{:016x}",
            last_applied.map_or(0, |l| l.leader_id.term),
            last_applied.map_or(0, |l| l.index),
            rand::random::<u64>()
        );
        let checkpoint = self.shared.snapshot_dir.join(format!("{snapshot_id}.checkpoint"));
        std::fs::rename(&partial, &checkpoint).map_err(snapshot_error)?;
        // The checkpoint's directory entries are durable before the meta that
        // makes it the current snapshot.
        std::fs::File::open(&checkpoint).and_then(|d| d.sync_all()).map_err(snapshot_error)?;
        std::fs::File::open(&self.shared.snapshot_dir).and_then(|d| d.sync_all()).map_err(snapshot_error)?;
        let meta = SnapshotMeta { last_log_id: last_applied, last_membership: membership, snapshot_id };
        let (_, meta_path) = self.snapshot_paths(&meta.snapshot_id);
        write_durably(&meta_path, &encode(&StoredSnapshotMeta { meta: meta.clone() })).map_err(snapshot_error)?;
        self.remove_other_snapshots(&meta.snapshot_id);
        self.pack_in_background(meta.snapshot_id.clone());
        Ok((meta, meta_path))
    }

    /// The newest snapshot and its packed file, packing it first if the
    /// background packing has not happened (it failed, or the process
    /// restarted before it ran). The packed file is written under a
    /// temporary name and renamed. Holds the snapshot-files lock throughout,
    /// so a newer snapshot cannot remove this one's checkpoint mid-way.
    fn current_snapshot_file(&self) -> Result<Option<(SnapshotMeta, PathBuf)>, StorageError> {
        let _files = self.shared.snapshot_files.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut best: Option<SnapshotMeta> = None;
        for e in std::fs::read_dir(&self.shared.snapshot_dir).map_err(snapshot_error)?.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "meta") {
                let Ok(bytes) = std::fs::read(&p) else { continue };
                let Ok(m) = bincode::deserialize::<StoredSnapshotMeta>(&bytes) else { continue };
                if best.as_ref().is_none_or(|b| m.meta.last_log_id > b.last_log_id) {
                    best = Some(m.meta);
                }
            }
        }
        let Some(meta) = best else { return Ok(None) };
        let snap_path = self.packed(&meta.snapshot_id).map_err(snapshot_error)?;
        Ok(Some((meta, snap_path)))
    }

    /// The packed file of snapshot `id`, packing its checkpoint first if
    /// that has not happened yet; the checkpoint is removed once packed.
    /// The caller holds the snapshot-files lock.
    fn packed(&self, id: &str) -> io::Result<PathBuf> {
        let (snap_path, _) = self.snapshot_paths(id);
        let checkpoint = self.shared.snapshot_dir.join(format!("{id}.checkpoint"));
        if !snap_path.exists() {
            let partial = snap_path.with_extension("packing");
            pack(&checkpoint, &partial)?;
            std::fs::rename(&partial, &snap_path)?;
            std::fs::File::open(&self.shared.snapshot_dir)?.sync_all()?;
        }
        if checkpoint.exists() {
            std::fs::remove_dir_all(&checkpoint)?;
        }
        Ok(snap_path)
    }

    /// Packs snapshot `id` on a thread of its own, so that a follower that
    /// needs it later gets it at once (`get_current_snapshot` runs inline
    /// with applies). Skipped if a newer snapshot replaced it meanwhile.
    fn pack_in_background(&self, id: String) {
        let sm = self.clone();
        let spawned = std::thread::Builder::new().name("skiff-snapshot-pack".into()).spawn(move || {
            let _files = sm.shared.snapshot_files.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let (_, meta_path) = sm.snapshot_paths(&id);
            if !meta_path.exists() {
                return;
            }
            if let Err(error) = sm.packed(&id) {
                tracing::warn!(%error, snapshot = %id, "packing a snapshot failed; it will be packed when sent");
            }
        });
        if let Err(error) = spawned {
            tracing::warn!(%error, "cannot start the snapshot packing thread; it will be packed when sent");
        }
    }

    /// Keeps only the snapshot `keep` in the snapshot directory.
    fn remove_other_snapshots(&self, keep: &str) {
        let _files = self.shared.snapshot_files.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let Ok(dir) = std::fs::read_dir(&self.shared.snapshot_dir) else { return };
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let stem = name.rsplit_once('.').map_or(name.as_str(), |(s, _)| s);
            // A snapshot being received concurrently is not ours to remove.
            if stem != keep && !name.starts_with("incoming-") && !name.starts_with("building-") {
                let p = e.path();
                let _ = if p.is_dir() { std::fs::remove_dir_all(&p) } else { std::fs::remove_file(&p) };
            }
        }
    }

    fn install_blocking(&self, meta: SnapshotMeta, incoming: PathBuf) -> Result<(), StorageError> {
        // Keep the received file as our current snapshot.
        let (snap_path, meta_path) = self.snapshot_paths(&meta.snapshot_id);
        std::fs::rename(&incoming, &snap_path).map_err(snapshot_error)?;
        write_durably(&meta_path, &encode(&StoredSnapshotMeta { meta: meta.clone() })).map_err(snapshot_error)?;

        let current = self.shared.dir.join("CURRENT");
        let old_name = std::fs::read_to_string(&current).map_err(snapshot_error)?.trim().to_string();
        let n: u64 = old_name.strip_prefix("db-").and_then(|s| s.parse().ok()).unwrap_or(1);
        let new_name = format!("db-{}", n + 1);
        let new_path = self.shared.dir.join(&new_name);
        if new_path.exists() {
            std::fs::remove_dir_all(&new_path).map_err(snapshot_error)?;
        }
        unpack(&snap_path, &new_path).map_err(snapshot_error)?;
        let db = mvcc::open_db(&new_path).map_err(snapshot_error)?;
        db.flush_wal(true).map_err(snapshot_error)?;
        let (last_applied, membership) = read_raft_state(&db).map_err(snapshot_error)?;
        if last_applied != meta.last_log_id {
            return Err(snapshot_error(format!(
                "snapshot {} covers {:?} but its data was applied to {:?}",
                meta.snapshot_id, meta.last_log_id, last_applied
            )));
        }
        let reader = Reader::live(&db);
        let revision = reader.revision().map_err(snapshot_error)?;
        let compacted = reader.compacted().map_err(snapshot_error)?;
        let auth = reader.auth().map_err(snapshot_error)?;
        drop(reader);
        // The new database is complete and synced: only now does it become current.
        write_durably(&current, new_name.as_bytes()).map_err(snapshot_error)?;
        *self.shared.db.write().expect("poisoned") = Arc::new(db);
        *self.shared.raft_state.lock().expect("poisoned") = (last_applied, membership);
        self.shared.latest.lock().expect("poisoned").clear();
        self.shared.compacted.store(compacted, Ordering::Release);
        *self.shared.auth.write().expect("poisoned") = Arc::new(AuthView::new(auth));
        self.shared.applied.send_replace(Applied { index: last_applied.map_or(0, |l| l.index), revision });
        self.refresh_db_size();
        self.shared.hub.publish(HubMessage::Reset);
        // Readers holding the old database keep it open until they finish.
        let _ = std::fs::remove_dir_all(self.shared.dir.join(&old_name));
        self.remove_other_snapshots(&meta.snapshot_id);
        crate::metrics::metrics().snapshots_installed.inc();
        Ok(())
    }
}

fn read_raft_state(db: &DB) -> Result<(Option<LogId>, StoredMembership), String> {
    let get = |k: &[u8]| db.get_cf(cf(db, CF_META), k).map_err(|e| e.to_string());
    let last_applied = match get(META_LAST_APPLIED)? {
        Some(v) => bincode::deserialize(&v).map_err(|e| e.to_string())?,
        None => None,
    };
    let membership = match get(META_MEMBERSHIP)? {
        Some(v) => bincode::deserialize(&v).map_err(|e| e.to_string())?,
        None => StoredMembership::default(),
    };
    Ok((last_applied, membership))
}

/// A backup streamed by the Maintenance service ends with the SHA-256 of
/// the archive before it (etcd's convention); checks it when present. The
/// archive itself is a multiple of 512 bytes, so the trailer is recognisable.
fn verify_backup(backup: &Path) -> Result<(), OpenError> {
    use sha2::Digest;
    use std::io::Read;
    let bad = |reason: String| OpenError::Corrupt { path: backup.to_path_buf(), reason };
    let mut f = std::fs::File::open(backup).map_err(io_err(backup))?;
    let len = f.metadata().map_err(io_err(backup))?.len();
    if len % 512 != 32 {
        return Ok(());
    }
    let mut hash = sha2::Sha256::new();
    let mut left = len - 32;
    let mut buf = vec![0u8; 1 << 16];
    while left > 0 {
        let n = f.read(&mut buf[..left.min(1 << 16) as usize]).map_err(io_err(backup))?;
        if n == 0 {
            return Err(bad("truncated backup".into()));
        }
        hash.update(&buf[..n]);
        left -= n as u64;
    }
    let mut trailer = [0u8; 32];
    f.read_exact(&mut trailer).map_err(io_err(backup))?;
    if hash.finalize().as_slice() != trailer {
        return Err(bad("backup checksum mismatch: the file is damaged".into()));
    }
    Ok(())
}

/// Writes `path` through a temporary file, syncs it, renames it into place
/// and syncs the directory, so a crash leaves the old or the new content.
pub fn write_durably(path: &Path, data: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(data)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Packs a checkpoint directory into one file.
fn pack(dir: &Path, file: &Path) -> io::Result<()> {
    let f = SyncEvery { file: std::fs::File::create(file)?, unsynced: 0 };
    let mut tar = tar::Builder::new(io::BufWriter::new(f));
    tar.append_dir_all(".", dir)?;
    let f = tar.into_inner()?.into_inner().map_err(|e| e.into_error())?;
    f.file.sync_all()
}

/// A file written in syncs of [`SyncEvery::BYTES`]: one fsync of a whole
/// snapshot at the end would hold up the Raft log's fsyncs on the same disk.
struct SyncEvery {
    file: std::fs::File,
    unsynced: usize,
}

impl SyncEvery {
    const BYTES: usize = 8 * 1024 * 1024;
}

impl io::Write for SyncEvery {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write(buf)?;
        self.unsynced += n;
        if self.unsynced >= Self::BYTES {
            self.file.sync_data()?;
            self.unsynced = 0;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

fn unpack(file: &Path, dir: &Path) -> io::Result<()> {
    let f = std::fs::File::open(file)?;
    tar::Archive::new(io::BufReader::new(f)).unpack(dir)?;
    std::fs::File::open(dir)?.sync_all()
}

/// Builds a snapshot: a RocksDB checkpoint of the state machine.
pub struct SnapshotBuilder {
    sm: StateMachine,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    /// Takes a checkpoint (a consistent point-in-time copy of every column
    /// family, mostly hard links) while applies go on, and records as the
    /// snapshot's log id and membership what the checkpoint itself says was
    /// applied, so data and meta always agree. The one file sent to
    /// followers is packed from the checkpoint on a background thread that
    /// syncs as it goes, so neither applies nor the log's fsyncs wait for a
    /// copy of the whole database.
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let sm = self.sm.clone();
        let (meta, meta_path) =
            tokio::task::spawn_blocking(move || sm.checkpoint_snapshot()).await.map_err(snapshot_error)??;
        // openraft keeps only the meta of a snapshot it just had built (the
        // data is read through `get_current_snapshot`), so the handle given
        // back is the meta file itself rather than a packed copy.
        let file = tokio::fs::File::open(meta_path).await.map_err(snapshot_error)?;
        Ok(Snapshot { meta, snapshot: Box::new(file) })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        Ok(self.shared.raft_state.lock().expect("poisoned").clone())
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<BatchResponse>, StorageError>
    where
        I: IntoIterator<Item = crate::types::Entry> + Send,
        I::IntoIter: Send,
    {
        let entries: Vec<_> = entries.into_iter().collect();
        if let (Some(durable), Some(last)) = (self.shared.log_durable.get(), entries.last()) {
            let last = last.log_id.index;
            let mut durable = durable.clone();
            let reached = durable.wait_for(|d| d.index >= last || d.failed.is_some()).await.map_err(sm_error)?;
            if let Some(failed) = &reached.failed {
                return Err(sm_error(format!("the raft log could not be synced: {failed}")));
            }
        }
        // A small batch is applied in place: it takes tens of microseconds,
        // less than a round trip through the blocking pool would add.
        let proposals: usize = entries
            .iter()
            .map(|e| match &e.payload {
                EntryPayload::Normal(batch) => batch.proposals.len(),
                _ => 1,
            })
            .sum();
        let small = proposals <= APPLY_IN_PLACE_PROPOSALS
            && entries.iter().try_fold(0u64, |n, e| Some(n + bincode::serialized_size(e).ok()?))
                <= Some(APPLY_IN_PLACE_BYTES);
        if small {
            return self.apply_blocking(entries);
        }
        let sm = self.clone();
        tokio::task::spawn_blocking(move || sm.apply_blocking(entries)).await.map_err(sm_error)?
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        // Nothing is captured here (this runs serialized with `apply`, and a
        // checkpoint flushes memtables, which stalled writes for hundreds of
        // ms): the builder takes a checkpoint later, concurrently with
        // applies, and reads the log id it covers from the checkpoint itself.
        SnapshotBuilder { sm: self.clone() }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<tokio::fs::File>, StorageError> {
        let path = self.shared.snapshot_dir.join(format!("incoming-{:016x}.part", rand::random::<u64>()));
        let file = tokio::fs::File::create(&path).await.map_err(snapshot_error)?;
        *self.shared.receiving.lock().expect("poisoned") = Some(path);
        Ok(Box::new(file))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<tokio::fs::File>,
    ) -> Result<(), StorageError> {
        use std::os::unix::fs::MetadataExt;
        use tokio::io::AsyncSeekExt;

        let mut snapshot = snapshot;
        let incoming =
            self.shared.receiving.lock().expect("poisoned").take().unwrap_or_else(|| {
                self.shared.snapshot_dir.join(format!("incoming-{:016x}.part", rand::random::<u64>()))
            });
        // openraft normally fills the file `begin_receiving_snapshot` made;
        // if it hands over another file, copy that one into place.
        let given = snapshot.metadata().await.map_err(snapshot_error)?;
        let same = std::fs::metadata(&incoming).is_ok_and(|m| m.dev() == given.dev() && m.ino() == given.ino());
        if !same {
            snapshot.seek(std::io::SeekFrom::Start(0)).await.map_err(snapshot_error)?;
            let mut dest = tokio::fs::File::create(&incoming).await.map_err(snapshot_error)?;
            tokio::io::copy(&mut snapshot, &mut dest).await.map_err(snapshot_error)?;
            dest.sync_all().await.map_err(snapshot_error)?;
        } else {
            // openraft's receiver does not sync what it wrote: do it here.
            snapshot.sync_all().await.map_err(snapshot_error)?;
        }
        drop(snapshot);
        let sm = self.clone();
        let meta = meta.clone();
        tokio::task::spawn_blocking(move || sm.install_blocking(meta, incoming)).await.map_err(snapshot_error)?
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let sm = self.clone();
        let found = tokio::task::spawn_blocking(move || sm.current_snapshot_file()).await.map_err(snapshot_error)??;
        let Some((meta, path)) = found else { return Ok(None) };
        let file = tokio::fs::File::open(path).await.map_err(snapshot_error)?;
        Ok(Some(Snapshot { meta, snapshot: Box::new(file) }))
    }
}
