//! The MVCC engine: etcd's data model on RocksDB.
//!
//! Every change to a key is a record under `hist` keyed by the key (escaped
//! so that byte order is preserved) followed by the big-endian revision, so a
//! read at revision `R` is one `seek_for_prev` per key. `rev` maps each
//! revision to its commit time and the keys it changed, which is what watch
//! replay and `history` walk. `meta` holds the replicated counters. Nothing in
//! this module knows about Raft: the state machine calls [`Applier`] for each
//! batch and commits its `WriteBatch` together with `last_applied`.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};

use rocksdb::{ColumnFamily, DBRawIterator, ReadOptions, SnapshotWithThreadMode, WriteBatch, DB};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::auth::{AuthCommand, AuthState};
use crate::latest::LatestCache;
use crate::types::{
    Alarm, AlarmKind, ApplyError, Command, Compare, CompareResult, CompareTarget, DeleteRequest, KeyValue, Op,
    OpResult, Output, ProposalResult, PutRequest, RangeRequest, RangeResult, RequestId, SortOrder, SortTarget, Txn,
    TxnResult,
};

pub const CF_HIST: &str = "hist";
pub const CF_REV: &str = "rev";
pub const CF_META: &str = "meta";
pub const CF_DEDUP: &str = "dedup";
/// Leases (`l` ++ id -> TTL) and the keys attached to them (`k` ++ id ++ key).
pub const CF_LEASE: &str = "lease";
/// Column families of the state-machine database.
pub const COLUMN_FAMILIES: [&str; 5] = [CF_HIST, CF_REV, CF_META, CF_DEDUP, CF_LEASE];

pub const META_REVISION: &[u8] = b"revision";
pub const META_COMPACTED: &[u8] = b"compacted";

/// How long a request id is remembered after it was made (by the member
/// that took the write): a retry arriving later than this is applied again.
pub const DEDUP_RETENTION_MS: u64 = 10 * 60 * 1000;

/// Expired request ids are deleted when this much more time has passed
/// since the last deletion (one range tombstone per step).
pub const DEDUP_EXPIRY_STEP_MS: u64 = 10 * 1000;

/// Request ids made before this time (ms) are forgotten; advanced by
/// [`Applier::expire_request_ids`].
pub const META_DEDUP_EXPIRED: &[u8] = b"dedup_expired";

/// The raised alarms (bincode of a sorted `Vec<Alarm>`; absent: none).
pub const META_ALARMS: &[u8] = b"alarms";
/// The auth store (bincode of an `AuthState`; absent: empty, disabled). In
/// the meta column, so no KV range or watch ever sees it, while snapshots
/// and backups (checkpoints of the whole database) carry it.
pub const META_AUTH: &[u8] = b"auth";

/// One stored version of a key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvRecord {
    pub create_revision: i64,
    pub mod_revision: i64,
    pub version: i64,
    pub lease: i64,
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
    /// A tombstone: the key was deleted at `mod_revision`.
    pub deleted: bool,
}

impl KvRecord {
    /// The record of a delete at `revision`.
    fn tombstone(revision: i64) -> Self {
        KvRecord { create_revision: 0, mod_revision: revision, version: 0, lease: 0, value: Vec::new(), deleted: true }
    }

    fn to_kv(&self, key: &[u8]) -> KeyValue {
        KeyValue {
            key: key.to_vec(),
            create_revision: self.create_revision,
            mod_revision: self.mod_revision,
            version: self.version,
            value: self.value.clone(),
            lease: self.lease,
        }
    }
}

/// A stored version read in place: the value borrowed from the database's
/// buffer (or a record), so a scan copies only the values it returns.
#[derive(Clone, Copy, Debug, Deserialize)]
struct RecordView<'a> {
    create_revision: i64,
    mod_revision: i64,
    version: i64,
    lease: i64,
    #[serde(borrow)]
    value: &'a [u8],
    deleted: bool,
}

impl<'a> From<&'a KvRecord> for RecordView<'a> {
    fn from(r: &'a KvRecord) -> Self {
        RecordView {
            create_revision: r.create_revision,
            mod_revision: r.mod_revision,
            version: r.version,
            lease: r.lease,
            value: &r.value,
            deleted: r.deleted,
        }
    }
}

/// What one revision changed, as stored under `rev`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RevRecord {
    pub timestamp_ms: u64,
    pub keys: Vec<Vec<u8>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventKind {
    Put,
    Delete,
}

/// A change to one key, as a watcher sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub kind: EventKind,
    /// For a delete: the key with `mod_revision` set to the deleting revision.
    pub kv: KeyValue,
    pub prev_kv: Option<KeyValue>,
}

/// Everything one revision changed, delivered to watchers atomically.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RevisionEvents {
    pub revision: i64,
    pub timestamp_ms: u64,
    pub events: Vec<Event>,
}

/// One entry of a key's history.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HistoryEntry {
    pub revision: i64,
    pub timestamp_ms: u64,
    pub kind: EventKind,
    pub kv: KeyValue,
}

/// Failures of the engine's own storage (not of a client's request).
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("rocksdb: {0}")]
    Rocks(#[from] rocksdb::Error),
    #[error("corrupt record in {cf}: {reason}")]
    Corrupt { cf: &'static str, reason: String },
}

/// Reads fail either because of the request (compacted, future revision)
/// or because of storage.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Request(#[from] ApplyError),
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl From<rocksdb::Error> for ReadError {
    fn from(e: rocksdb::Error) -> Self {
        ReadError::Engine(EngineError::Rocks(e))
    }
}

// ---------------------------------------------------------------------------
// Key encoding

/// Escapes `key` so that the encoding sorts like the raw bytes and no
/// encoded key is a prefix of another: 0x00 becomes 0x00 0xff and the key
/// ends with 0x00 0x01.
pub fn encode_key(key: &[u8], out: &mut Vec<u8>) {
    for &b in key {
        out.push(b);
        if b == 0 {
            out.push(0xff);
        }
    }
    out.extend_from_slice(&[0, 1]);
}

fn hist_key(key: &[u8], revision: i64) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len() + 10);
    encode_key(key, &mut out);
    out.extend_from_slice(&(revision as u64).to_be_bytes());
    out
}

/// Splits a `hist` key into the raw key and the revision.
fn decode_hist_key(raw: &[u8]) -> Result<(Vec<u8>, i64), EngineError> {
    let corrupt = || EngineError::Corrupt { cf: CF_HIST, reason: "bad key encoding".into() };
    if raw.len() < 10 {
        return Err(corrupt());
    }
    let (enc, rev) = raw.split_at(raw.len() - 8);
    let revision = u64::from_be_bytes(rev.try_into().map_err(|_| corrupt())?) as i64;
    let mut key = Vec::with_capacity(enc.len());
    let mut i = 0;
    while i < enc.len() {
        let b = enc[i];
        if b == 0 {
            match enc.get(i + 1) {
                Some(0xff) => key.push(0),
                Some(1) if i + 2 == enc.len() => return Ok((key, revision)),
                _ => return Err(corrupt()),
            }
            i += 2;
        } else {
            key.push(b);
            i += 1;
        }
    }
    Err(corrupt())
}

pub fn rev_key(revision: i64) -> [u8; 8] {
    (revision as u64).to_be_bytes()
}

/// The revision of a `hist` key (its last eight bytes).
fn hist_revision(raw: &[u8]) -> i64 {
    let mut rev = [0u8; 8];
    rev.copy_from_slice(&raw[raw.len() - 8..]);
    u64::from_be_bytes(rev) as i64
}

/// How many versions of one key a range scan steps through before it seeks
/// to the one it wants (RocksDB's `max_sequential_skip_in_iterations`).
const SEQUENTIAL_VERSIONS: usize = 8;

/// Whether `key` lies in etcd's range `[start, end)`; an empty `end` means
/// `start` alone and `"\0"` means every key from `start` on.
pub fn in_range(key: &[u8], start: &[u8], end: &[u8]) -> bool {
    if end.is_empty() {
        key == start
    } else if end == [0] {
        key >= start
    } else {
        key >= start && key < end
    }
}

fn decode<T: for<'de> Deserialize<'de>>(cf: &'static str, bytes: &[u8]) -> Result<T, EngineError> {
    bincode::deserialize(bytes).map_err(|e| EngineError::Corrupt { cf, reason: e.to_string() })
}

/// A `hist` record read in place (its value borrowed from `raw`).
fn decode_view(raw: &[u8]) -> Result<RecordView<'_>, EngineError> {
    bincode::deserialize(raw).map_err(|e| EngineError::Corrupt { cf: CF_HIST, reason: e.to_string() })
}

pub(crate) fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    bincode::serialize(value).expect("bincode serialization of plain data cannot fail")
}

pub(crate) fn cf<'a>(db: &'a DB, name: &'static str) -> &'a ColumnFamily {
    db.cf_handle(name).expect("column families are created when the database is opened")
}

// ---------------------------------------------------------------------------
// Reads

/// A consistent view for reads: a RocksDB snapshot, or the live database
/// inside `apply` (the only writer).
pub struct Reader<'a> {
    db: &'a DB,
    snapshot: Option<SnapshotWithThreadMode<'a, DB>>,
}

/// The newest record of `key` at or below `revision`, tombstones included,
/// sought with `it` (from [`Reader::one_key_iterator`]).
fn record_in(it: &mut DBRawIterator<'_>, key: &[u8], revision: i64) -> Result<Option<KvRecord>, EngineError> {
    it.seek_for_prev(hist_key(key, revision));
    if let (Some(k), Some(v)) = (it.key(), it.value()) {
        let (found, _) = decode_hist_key(k)?;
        if found == key {
            return Ok(Some(decode(CF_HIST, v)?));
        }
    }
    it.status()?;
    Ok(None)
}

impl<'a> Reader<'a> {
    /// A point-in-time view for serving clients.
    pub fn snapshot(db: &'a DB) -> Self {
        Reader { db, snapshot: Some(db.snapshot()) }
    }

    /// The live database; only for the applier, which is the only writer.
    pub fn live(db: &'a DB) -> Self {
        Reader { db, snapshot: None }
    }

    /// Options for a scan in key order. `hist` has a prefix extractor, so
    /// without `total_order_seek` RocksDB would answer seeks in prefix mode
    /// and could skip keys of other prefixes.
    fn opts(&self) -> ReadOptions {
        let mut opts = ReadOptions::default();
        opts.set_total_order_seek(true);
        if let Some(s) = &self.snapshot {
            opts.set_snapshot(s);
        }
        opts
    }

    /// Options for looking up one key's versions in `hist`: the seek stays
    /// within the key's prefix, so the prefix blooms (memtable and tables)
    /// answer "never written" without walking the memtable's skiplist.
    fn one_key_opts(&self) -> ReadOptions {
        let mut opts = ReadOptions::default();
        opts.set_prefix_same_as_start(true);
        if let Some(s) = &self.snapshot {
            opts.set_snapshot(s);
        }
        opts
    }

    pub(crate) fn meta_i64(&self, key: &[u8]) -> Result<i64, EngineError> {
        Ok(self
            .db
            .get_cf_opt(cf(self.db, CF_META), key, &self.opts())?
            .map(|v| decode::<i64>(CF_META, &v))
            .transpose()?
            .unwrap_or(0))
    }

    /// The store's current revision in this view.
    pub fn revision(&self) -> Result<i64, EngineError> {
        self.meta_i64(META_REVISION)
    }

    /// The compacted revision in this view (0 if never compacted).
    pub fn compacted(&self) -> Result<i64, EngineError> {
        self.meta_i64(META_COMPACTED)
    }

    /// The newest record of `key` at or below `revision`, tombstones included.
    pub fn record_at(&self, key: &[u8], revision: i64) -> Result<Option<KvRecord>, EngineError> {
        record_in(&mut self.one_key_iterator(), key, revision)
    }

    /// An iterator for [`record_in`], which may look up any number of keys
    /// in this view.
    fn one_key_iterator(&self) -> DBRawIterator<'a> {
        self.db.raw_iterator_cf_opt(cf(self.db, CF_HIST), self.one_key_opts())
    }

    /// The newest record at or below `revision` of every key in the range,
    /// tombstones included, in key order.
    fn scan_at(&self, start: &[u8], end: &[u8], revision: i64) -> Result<BTreeMap<Vec<u8>, KvRecord>, EngineError> {
        let mut out = BTreeMap::new();
        if end.is_empty() {
            if let Some(r) = self.record_at(start, revision)? {
                out.insert(start.to_vec(), r);
            }
            return Ok(out);
        }
        self.visit_at(start, end, revision, |key, raw| {
            out.insert(key, decode(CF_HIST, raw)?);
            Ok(())
        })?;
        Ok(out)
    }

    /// Calls `visit` with every key of the range `[start, end)` (`end`
    /// not empty) and the raw record of its newest version at or below
    /// `revision` (tombstones included), in key order.
    ///
    /// The versions of a key are stored oldest first, so the scan walks
    /// forward through them: a step is far cheaper than a seek, and most
    /// keys have a few versions. A key with more than
    /// [`SEQUENTIAL_VERSIONS`] at or below `revision` is jumped through
    /// with one seek instead, as RocksDB's own iterator bounds its
    /// sequential skips.
    fn visit_at(
        &self,
        start: &[u8],
        end: &[u8],
        revision: i64,
        mut visit: impl FnMut(Vec<u8>, &[u8]) -> Result<(), EngineError>,
    ) -> Result<(), EngineError> {
        let mut it = self.db.raw_iterator_cf_opt(cf(self.db, CF_HIST), self.opts());
        let mut seek = Vec::with_capacity(start.len() + 2);
        encode_key(start, &mut seek);
        it.seek(&seek);
        // The newest version seen so far of the current key.
        let mut newest = Vec::new();
        while let Some(k) = it.key() {
            let (key, _) = decode_hist_key(k)?;
            if !in_range(&key, start, end) {
                break;
            }
            let prefix = k[..k.len() - 8].to_vec();
            let of_key = |k: &[u8]| k.len() == prefix.len() + 8 && k.starts_with(&prefix);
            let mut found = false;
            let mut steps = 0;
            while let (Some(k), Some(v)) = (it.key(), it.value()) {
                if !of_key(k) || hist_revision(k) > revision {
                    break;
                }
                found = true;
                steps += 1;
                if steps == SEQUENTIAL_VERSIONS {
                    let mut target = prefix.clone();
                    target.extend_from_slice(&(revision as u64).to_be_bytes());
                    it.seek_for_prev(&target);
                    if let (Some(k), Some(v)) = (it.key(), it.value()) {
                        if of_key(k) {
                            newest.clear();
                            newest.extend_from_slice(v);
                        }
                    }
                    break;
                }
                newest.clear();
                newest.extend_from_slice(v);
                it.next();
            }
            if found {
                visit(key, &newest)?;
            }
            // Past this key's remaining versions (newer than `revision`,
            // or left behind by the jump): no revision reaches u64::MAX.
            if it.key().is_some_and(of_key) {
                let mut past = prefix.clone();
                past.extend_from_slice(&u64::MAX.to_be_bytes());
                it.seek(&past);
            }
        }
        it.status()?;
        Ok(())
    }

    /// etcd's Range, served from this view.
    pub fn range(&self, req: &RangeRequest) -> Result<RangeResult, ReadError> {
        let current = self.revision()?;
        let compacted = self.compacted()?;
        let at = resolve_revision(req.revision, current, compacted)?;
        if req.range_end.is_empty() {
            let found = self.scan_at(&req.key, &req.range_end, at)?;
            return Ok(finish_range(req, found.into_iter()));
        }
        let mut result = RangeBuilder::new(req);
        self.visit_at(&req.key, &req.range_end, at, |key, raw| {
            result.add(key, decode_view(raw)?);
            Ok(())
        })?;
        Ok(result.finish())
    }

    /// etcd's HashKV: a digest of every stored version of every key up to
    /// `revision` (0: the current one), which is what compaction left plus
    /// everything newer. Members that applied the same log up to the same
    /// compaction give the same hash for the same revision, so differing
    /// hashes mean diverged state. Returns (hash, compacted, revision hashed).
    pub fn hash_kv(&self, revision: i64) -> Result<(u32, i64, i64), ReadError> {
        let current = self.revision()?;
        let compacted = self.compacted()?;
        let at = resolve_revision(revision, current, compacted)?;
        let mut digest = Sha256::new();
        let mut it = self.db.raw_iterator_cf_opt(cf(self.db, CF_HIST), self.opts());
        it.seek_to_first();
        while let (Some(k), Some(v)) = (it.key(), it.value()) {
            if decode_hist_key(k)?.1 <= at {
                digest_entry(&mut digest, k, v);
            }
            it.next();
        }
        it.status()?;
        Ok((fold_digest(digest), compacted, at))
    }

    /// etcd's Hash: a digest of the whole replicated keyspace in this view
    /// (history, revision index and leases), for checking members against
    /// each other, as etcd's is "for testing only".
    pub fn hash_all(&self) -> Result<u32, EngineError> {
        let mut digest = Sha256::new();
        for name in [CF_HIST, CF_REV, CF_LEASE] {
            digest.update(name.as_bytes());
            let mut it = self.db.raw_iterator_cf_opt(cf(self.db, name), self.opts());
            it.seek_to_first();
            while let (Some(k), Some(v)) = (it.key(), it.value()) {
                digest_entry(&mut digest, k, v);
                it.next();
            }
            it.status()?;
        }
        Ok(fold_digest(digest))
    }

    /// Every revision in `[from, to]` with its events (prev_kv included),
    /// at most `limit` revisions.
    pub fn revisions(&self, from: i64, to: i64, limit: usize) -> Result<Vec<RevisionEvents>, EngineError> {
        let mut out = Vec::new();
        if from > to {
            return Ok(out);
        }
        let mut it = self.db.raw_iterator_cf_opt(cf(self.db, CF_REV), self.opts());
        it.seek(rev_key(from));
        while let (Some(k), Some(v)) = (it.key(), it.value()) {
            let revision = u64::from_be_bytes(
                k.try_into().map_err(|_| EngineError::Corrupt { cf: CF_REV, reason: "bad revision key".into() })?,
            ) as i64;
            if revision > to || out.len() >= limit {
                break;
            }
            let rec: RevRecord = decode(CF_REV, v)?;
            let mut events = Vec::with_capacity(rec.keys.len());
            for key in &rec.keys {
                let Some(now) = self.record_at(key, revision)? else { continue };
                let prev = if revision > 1 { self.record_at(key, revision - 1)? } else { None };
                events.push(make_event(key, &now, prev.as_ref()));
            }
            out.push(RevisionEvents { revision, timestamp_ms: rec.timestamp_ms, events });
            it.next();
        }
        it.status()?;
        Ok(out)
    }

    /// The raised alarms, sorted.
    pub fn alarms(&self) -> Result<Vec<Alarm>, EngineError> {
        let v = self.db.get_cf_opt(cf(self.db, CF_META), META_ALARMS, &self.opts())?;
        Ok(v.map(|v| decode(CF_META, &v)).transpose()?.unwrap_or_default())
    }

    /// The auth store as last applied.
    pub fn auth(&self) -> Result<AuthState, EngineError> {
        let v = self.db.get_cf_opt(cf(self.db, CF_META), META_AUTH, &self.opts())?;
        Ok(v.map(|v| decode(CF_META, &v)).transpose()?.unwrap_or_default())
    }

    /// The granted TTL (seconds) of lease `id`, if it exists.
    pub fn lease(&self, id: i64) -> Result<Option<i64>, EngineError> {
        let v = self.db.get_cf_opt(cf(self.db, CF_LEASE), lease_key(id), &self.opts())?;
        v.map(|v| decode::<LeaseRecord>(CF_LEASE, &v).map(|l| l.ttl_seconds)).transpose()
    }

    /// Every lease with its granted TTL.
    pub fn leases(&self) -> Result<Vec<(i64, i64)>, EngineError> {
        let mut it = self.db.raw_iterator_cf_opt(cf(self.db, CF_LEASE), self.opts());
        it.seek(LEASE_PREFIX);
        let mut out = Vec::new();
        while let (Some(k), Some(v)) = (it.key(), it.value()) {
            if !k.starts_with(LEASE_PREFIX) || k.len() != 9 {
                break;
            }
            let id = i64::from_be_bytes(k[1..9].try_into().expect("length checked"));
            out.push((id, decode::<LeaseRecord>(CF_LEASE, v)?.ttl_seconds));
            it.next();
        }
        it.status()?;
        Ok(out)
    }

    /// The keys attached to lease `id`.
    pub fn lease_keys(&self, id: i64) -> Result<Vec<Vec<u8>>, EngineError> {
        let prefix = lease_key_prefix(id);
        let mut it = self.db.raw_iterator_cf_opt(cf(self.db, CF_LEASE), self.opts());
        it.seek(&prefix);
        let mut out = Vec::new();
        while let Some(k) = it.key() {
            if !k.starts_with(&prefix) {
                break;
            }
            out.push(k[prefix.len()..].to_vec());
            it.next();
        }
        it.status()?;
        Ok(out)
    }

    /// Every stored version of `key`, oldest first.
    pub fn history(&self, key: &[u8]) -> Result<Vec<HistoryEntry>, EngineError> {
        let mut prefix = Vec::with_capacity(key.len() + 2);
        encode_key(key, &mut prefix);
        let mut it = self.db.raw_iterator_cf_opt(cf(self.db, CF_HIST), self.opts());
        it.seek(&prefix);
        let mut out = Vec::new();
        while let (Some(k), Some(v)) = (it.key(), it.value()) {
            if !k.starts_with(&prefix) {
                break;
            }
            let (_, revision) = decode_hist_key(k)?;
            let rec: KvRecord = decode(CF_HIST, v)?;
            let timestamp_ms = self
                .db
                .get_cf_opt(cf(self.db, CF_REV), rev_key(revision), &self.opts())?
                .map(|v| decode::<RevRecord>(CF_REV, &v))
                .transpose()?
                .map(|r| r.timestamp_ms)
                .unwrap_or(0);
            let kind = if rec.deleted { EventKind::Delete } else { EventKind::Put };
            out.push(HistoryEntry { revision, timestamp_ms, kind, kv: rec.to_kv(key) });
            it.next();
        }
        it.status()?;
        Ok(out)
    }
}

fn make_event(key: &[u8], now: &KvRecord, prev: Option<&KvRecord>) -> Event {
    let prev_kv = prev.filter(|p| !p.deleted).map(|p| p.to_kv(key));
    if now.deleted {
        Event {
            kind: EventKind::Delete,
            kv: KeyValue { key: key.to_vec(), mod_revision: now.mod_revision, ..Default::default() },
            prev_kv,
        }
    } else {
        Event { kind: EventKind::Put, kv: now.to_kv(key), prev_kv }
    }
}

/// Adds one stored key/value to a hash, length-prefixed so that entries
/// cannot run into each other.
fn digest_entry(digest: &mut Sha256, key: &[u8], value: &[u8]) {
    digest.update((key.len() as u64).to_be_bytes());
    digest.update(key);
    digest.update((value.len() as u64).to_be_bytes());
    digest.update(value);
}

/// etcd's hashes are 32-bit: the first four bytes of the SHA-256.
fn fold_digest(digest: Sha256) -> u32 {
    let out = digest.finalize();
    u32::from_be_bytes([out[0], out[1], out[2], out[3]])
}

/// The revision a read names, checked against the store: 0 or less means
/// the current one.
pub fn resolve_revision(requested: i64, current: i64, compacted: i64) -> Result<i64, ApplyError> {
    if requested <= 0 {
        Ok(current)
    } else if requested > current {
        Err(ApplyError::FutureRevision { current })
    } else if requested < compacted {
        Err(ApplyError::Compacted { compacted })
    } else {
        Ok(requested)
    }
}

/// Turns the newest records of the keys in range into etcd's response:
/// count of live keys, then the mod/create filters, sort and limit.
fn finish_range(req: &RangeRequest, found: impl Iterator<Item = (Vec<u8>, KvRecord)>) -> RangeResult {
    let mut result = RangeBuilder::new(req);
    for (key, record) in found {
        result.add(key, RecordView::from(&record));
    }
    result.finish()
}

/// etcd's Range answer for one key whose newest record is `record`.
pub(crate) fn range_of_one(req: &RangeRequest, key: &[u8], record: Option<&KvRecord>) -> RangeResult {
    let mut result = RangeBuilder::new(req);
    if let Some(record) = record {
        result.add(key.to_vec(), RecordView::from(record));
    }
    result.finish()
}

/// etcd's Range answer, built from the range's newest records in key
/// order: every live key is counted; those the revision filters pass are
/// kept. When the answer is in key order only the first `limit` of them are
/// built, so a page of a large range copies only the page.
struct RangeBuilder<'r> {
    req: &'r RangeRequest,
    order: SortOrder,
    /// The answer's order is the keys' own: nothing to sort.
    in_key_order: bool,
    count: i64,
    /// Live keys the filters passed.
    matched: i64,
    kvs: Vec<KeyValue>,
}

impl<'r> RangeBuilder<'r> {
    fn new(req: &'r RangeRequest) -> Self {
        let order = match (req.sort_order, req.sort_target) {
            // etcd sorts by key ascending when only a target is named.
            (SortOrder::None, SortTarget::Key) => SortOrder::None,
            (SortOrder::None, _) => SortOrder::Ascend,
            (o, _) => o,
        };
        let in_key_order =
            order == SortOrder::None || (order == SortOrder::Ascend && req.sort_target == SortTarget::Key);
        RangeBuilder { req, order, in_key_order, count: 0, matched: 0, kvs: Vec::new() }
    }

    fn add(&mut self, key: Vec<u8>, r: RecordView<'_>) {
        let req = self.req;
        if r.deleted {
            return;
        }
        self.count += 1;
        if req.count_only {
            return;
        }
        let passes = (req.min_mod_revision <= 0 || r.mod_revision >= req.min_mod_revision)
            && (req.max_mod_revision <= 0 || r.mod_revision <= req.max_mod_revision)
            && (req.min_create_revision <= 0 || r.create_revision >= req.min_create_revision)
            && (req.max_create_revision <= 0 || r.create_revision <= req.max_create_revision);
        if !passes {
            return;
        }
        self.matched += 1;
        if self.in_key_order && req.limit > 0 && self.matched > req.limit {
            return;
        }
        // A sort by value needs the values even when only keys are returned.
        let value = if req.keys_only && self.in_key_order { Vec::new() } else { r.value.to_vec() };
        self.kvs.push(KeyValue {
            key,
            create_revision: r.create_revision,
            mod_revision: r.mod_revision,
            version: r.version,
            value,
            lease: r.lease,
        });
    }

    fn finish(self) -> RangeResult {
        let (req, order, count) = (self.req, self.order, self.count);
        if req.count_only {
            return RangeResult { kvs: Vec::new(), more: false, count };
        }
        let mut kvs = self.kvs;
        if !self.in_key_order {
            kvs.sort_by(|a, b| {
                let ord = match req.sort_target {
                    SortTarget::Key => a.key.cmp(&b.key),
                    SortTarget::Version => a.version.cmp(&b.version),
                    SortTarget::Create => a.create_revision.cmp(&b.create_revision),
                    SortTarget::Mod => a.mod_revision.cmp(&b.mod_revision),
                    SortTarget::Value => a.value.cmp(&b.value),
                };
                // Ties stay in key order, as etcd's stable sort leaves them.
                if order == SortOrder::Descend {
                    ord.reverse()
                } else {
                    ord
                }
            });
        }
        let more = req.limit > 0 && self.matched > req.limit;
        if more {
            kvs.truncate(req.limit as usize);
        }
        if req.keys_only {
            for kv in &mut kvs {
                kv.value.clear();
            }
        }
        RangeResult { kvs, more, count }
    }
}

// ---------------------------------------------------------------------------
// Writes

/// Applies proposals to the database through one `WriteBatch`.
///
/// Writes are buffered in `pending` (every version written in this batch, per
/// key) so that later transactions in the same batch, and reads inside a
/// transaction, see them before the batch is committed.
pub struct Applier<'a> {
    reader: Reader<'a>,
    /// Newest records of recently written keys (committed state only).
    cache: &'a LatestCache,
    /// Newest records read from the database during this batch, so that a
    /// key is sought at most once per batch.
    looked_up: RefCell<HashMap<Vec<u8>, Option<KvRecord>>>,
    /// The iterator those lookups seek with, made at the batch's first.
    /// Making one (a reference to every memtable and table file, their
    /// child iterators, an arena) costs more than its seek, and every
    /// create made one (a short profile put 7% of a follower's samples
    /// there; the benchmark's throughput did not move measurably). The
    /// database does not change until the batch is written, so one serves
    /// the batch.
    seeker: RefCell<Option<DBRawIterator<'a>>>,
    pub batch: WriteBatch,
    pub revision: i64,
    pub compacted: i64,
    pending: BTreeMap<Vec<u8>, Vec<KvRecord>>,
    /// Revisions created by this batch, for the watch hub.
    pub events: Vec<RevisionEvents>,
    dedup: BTreeMap<RequestId, ProposalResult>,
    /// Leases granted (`Some(ttl)`) or revoked (`None`) in this batch.
    pending_leases: BTreeMap<i64, Option<i64>>,
    /// Key attachments added (`true`) or removed (`false`) in this batch.
    pending_lease_keys: BTreeMap<(i64, Vec<u8>), bool>,
    /// Request ids made before this time are forgotten (replicated).
    dedup_expired: u64,
    /// The raised alarms, including this batch's changes.
    alarms: Vec<Alarm>,
    /// The auth store with this batch's changes, once a command of the
    /// batch changed it (read on first use: most batches never touch it).
    auth: Option<AuthState>,
}

#[derive(Serialize, Deserialize)]
struct LeaseRecord {
    ttl_seconds: i64,
}

const LEASE_PREFIX: &[u8] = b"l";

fn lease_key(id: i64) -> Vec<u8> {
    let mut k = LEASE_PREFIX.to_vec();
    k.extend_from_slice(&id.to_be_bytes());
    k
}

fn lease_key_prefix(id: i64) -> Vec<u8> {
    let mut k = b"k".to_vec();
    k.extend_from_slice(&id.to_be_bytes());
    k
}

fn lease_attachment_key(id: i64, key: &[u8]) -> Vec<u8> {
    let mut k = lease_key_prefix(id);
    k.extend_from_slice(key);
    k
}

/// A transaction's writes so far: each key's new record, with the live
/// record it replaces (for the event's `prev_kv` and the lease index).
type Changes = BTreeMap<Vec<u8>, Change>;

struct Change {
    now: KvRecord,
    prev: Option<KvRecord>,
}

/// A request id's remembered result, with its application time for expiry.
#[derive(Serialize, Deserialize)]
struct DedupRecord {
    timestamp_ms: u64,
    result: ProposalResult,
}

impl<'a> Applier<'a> {
    pub fn new(db: &'a DB, cache: &'a LatestCache) -> Result<Self, EngineError> {
        let reader = Reader::live(db);
        let revision = reader.revision()?;
        let compacted = reader.compacted()?;
        let dedup_expired = reader.meta_i64(META_DEDUP_EXPIRED)? as u64;
        let alarms = reader.alarms()?;
        Ok(Applier {
            dedup_expired,
            alarms,
            reader,
            cache,
            looked_up: RefCell::new(HashMap::new()),
            seeker: RefCell::new(None),
            batch: WriteBatch::default(),
            revision,
            compacted,
            pending: BTreeMap::new(),
            events: Vec::new(),
            dedup: BTreeMap::new(),
            pending_leases: BTreeMap::new(),
            pending_lease_keys: BTreeMap::new(),
            auth: None,
        })
    }

    fn db(&self) -> &'a DB {
        self.reader.db
    }

    /// Applies one proposal, or returns the remembered result of an earlier
    /// proposal with the same id.
    pub fn apply(
        &mut self,
        id: RequestId,
        command: &Command,
        timestamp_ms: u64,
    ) -> Result<ProposalResult, EngineError> {
        if let Some(done) = self.remembered(id)? {
            return Ok(done);
        }
        let result = match command {
            // etcd's capped applier: while any member's space alarm is
            // raised, every member refuses what would grow the database.
            _ if command.adds_data() && self.alarms.iter().any(|a| a.kind == AlarmKind::NoSpace) => {
                Err(ApplyError::NoSpace)
            }
            Command::Alarm { alarm, raise } => self.alarm(*alarm, *raise),
            Command::Txn(txn) => self.apply_txn(txn, timestamp_ms)?,
            Command::Compact { revision } => self.compact(*revision)?,
            Command::PublishMember(_) => Ok(Output::Published),
            Command::LeaseGrant { id, ttl_seconds } => self.lease_grant(*id, *ttl_seconds)?,
            Command::LeaseRevoke { id } => self.lease_revoke(*id, timestamp_ms)?,
            Command::Auth(change) => self.auth(change)?,
        };
        self.remember(id, &result, timestamp_ms);
        Ok(result)
    }

    fn remembered(&self, id: RequestId) -> Result<Option<ProposalResult>, EngineError> {
        if let Some(r) = self.dedup.get(&id) {
            return Ok(Some(r.clone()));
        }
        let key = dedup_key(id);
        match self.db().get_cf(cf(self.db(), CF_DEDUP), key)? {
            Some(v) => Ok(Some(decode::<DedupRecord>(CF_DEDUP, &v)?.result)),
            None => Ok(None),
        }
    }

    fn remember(&mut self, id: RequestId, result: &ProposalResult, timestamp_ms: u64) {
        let rec = DedupRecord { timestamp_ms, result: result.clone() };
        let db = self.db();
        self.batch.put_cf(cf(db, CF_DEDUP), dedup_key(id), encode(&rec));
        self.dedup.insert(id, result.clone());
    }

    /// Forgets request ids made more than [`DEDUP_RETENTION_MS`] before
    /// `now_ms` (the leader's time carried in the entry, so every member
    /// deletes the same ids at the same point of the log). Ids sort by age,
    /// so this is one range deletion every [`DEDUP_EXPIRY_STEP_MS`]; it also
    /// covers the records of the earlier layout (`i` and `t` keys).
    pub fn expire_request_ids(&mut self, now_ms: u64) {
        let cutoff = now_ms.saturating_sub(DEDUP_RETENTION_MS);
        if cutoff < self.dedup_expired.saturating_add(DEDUP_EXPIRY_STEP_MS) {
            return;
        }
        let db = self.db();
        self.batch.delete_range_cf(cf(db, CF_DEDUP), &b""[..], &dedup_key(RequestId::at(cutoff, 0))[..]);
        self.batch.put_cf(cf(db, CF_META), META_DEDUP_EXPIRED, encode(&(cutoff as i64)));
        self.dedup_expired = cutoff;
    }

    /// The newest record of `key` including this batch's and this txn's
    /// writes. A deleted key may come back as its tombstone or as `None`;
    /// every caller treats them alike.
    fn latest(&self, key: &[u8], txn: &Changes) -> Result<Option<KvRecord>, EngineError> {
        if let Some(c) = txn.get(key) {
            return Ok(Some(c.now.clone()));
        }
        if let Some(r) = self.pending.get(key).and_then(|v| v.last()) {
            return Ok(Some(r.clone()));
        }
        if let Some(r) = self.cache.get(key) {
            return Ok(r.clone());
        }
        if let Some(r) = self.looked_up.borrow().get(key) {
            return Ok(r.clone());
        }
        let mut seeker = self.seeker.borrow_mut();
        let it = seeker.get_or_insert_with(|| self.reader.one_key_iterator());
        let found = record_in(it, key, i64::MAX)?.filter(|r| !r.deleted);
        self.looked_up.borrow_mut().insert(key.to_vec(), found.clone());
        Ok(found)
    }

    /// The newest record of every key this batch wrote (`None`: deleted),
    /// for the [`LatestCache`] once the batch is committed (the model test
    /// checks the cache against it).
    #[cfg(test)]
    pub fn latest_records(&self) -> impl Iterator<Item = (&[u8], Option<&KvRecord>)> + '_ {
        self.pending
            .iter()
            .filter_map(|(k, versions)| versions.last().map(|r| (k.as_slice(), Some(r).filter(|r| !r.deleted))))
    }

    /// Moves out what `Applier::latest_records` lists, leaving this
    /// batch's pending versions empty: for the caller that is done applying.
    pub fn take_latest_records(&mut self) -> Vec<(Vec<u8>, Option<KvRecord>)> {
        std::mem::take(&mut self.pending)
            .into_iter()
            .filter_map(|(k, mut versions)| versions.pop().map(|r| (k, Some(r).filter(|r| !r.deleted))))
            .collect()
    }

    fn apply_txn(&mut self, txn: &Txn, timestamp_ms: u64) -> Result<ProposalResult, EngineError> {
        let mut changes = Changes::new();
        let revision = self.revision + 1;
        let result = match self.exec_txn(txn, revision, &mut changes)? {
            Ok(r) => r,
            Err(e) => return Ok(Err(e)),
        };
        if !changes.is_empty() {
            self.commit_revision(revision, timestamp_ms, changes)?;
        }
        Ok(Ok(Output::Txn { result, revision: self.revision }))
    }

    fn exec_txn(
        &mut self,
        txn: &Txn,
        revision: i64,
        changes: &mut Changes,
    ) -> Result<Result<TxnResult, ApplyError>, EngineError> {
        let mut succeeded = true;
        for c in &txn.compare {
            if !self.compare(c, changes)? {
                succeeded = false;
                break;
            }
        }
        let ops = if succeeded { &txn.success } else { &txn.failure };
        let mut responses = Vec::with_capacity(ops.len());
        for op in ops {
            let r = match op {
                Op::Range(r) => self.txn_range(r, revision, changes)?.map(OpResult::Range),
                Op::Put(p) => self.put(p, revision, changes)?,
                Op::DeleteRange(d) => self.delete(d, revision, changes)?,
                Op::Txn(t) => self.exec_txn(t, revision, changes)?.map(OpResult::Txn),
            };
            match r {
                Ok(r) => responses.push(r),
                Err(e) => return Ok(Err(e)),
            }
        }
        Ok(Ok(TxnResult { succeeded, responses }))
    }

    fn compare(&self, c: &Compare, changes: &Changes) -> Result<bool, EngineError> {
        let keys: Vec<(Vec<u8>, Option<KvRecord>)> = if c.range_end.is_empty() {
            vec![(c.key.clone(), self.latest(&c.key, changes)?.filter(|r| !r.deleted))]
        } else {
            self.view_range(&c.key, &c.range_end, i64::MAX, changes)?
                .into_iter()
                .filter(|(_, r)| !r.deleted)
                .map(|(k, r)| (k, Some(r)))
                .collect()
        };
        // etcd: a range compare holds when it holds for every key in range.
        for (_, rec) in keys {
            let ord = match (&c.target, &rec) {
                (CompareTarget::Value(v), Some(r)) => r.value.as_slice().cmp(v.as_slice()),
                // Comparing the value of a missing key is false.
                (CompareTarget::Value(_), None) => return Ok(false),
                (CompareTarget::Version(v), r) => r.as_ref().map_or(0, |r| r.version).cmp(v),
                (CompareTarget::CreateRevision(v), r) => r.as_ref().map_or(0, |r| r.create_revision).cmp(v),
                (CompareTarget::ModRevision(v), r) => r.as_ref().map_or(0, |r| r.mod_revision).cmp(v),
                (CompareTarget::Lease(v), r) => r.as_ref().map_or(0, |r| r.lease).cmp(v),
            };
            let ok = match c.result {
                CompareResult::Equal => ord.is_eq(),
                CompareResult::NotEqual => ord.is_ne(),
                CompareResult::Greater => ord.is_gt(),
                CompareResult::Less => ord.is_lt(),
            };
            if !ok {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Newest records at or below `at` of every key in range, from the
    /// database overlaid with this batch's and this txn's writes.
    fn view_range(
        &self,
        start: &[u8],
        end: &[u8],
        at: i64,
        changes: &Changes,
    ) -> Result<BTreeMap<Vec<u8>, KvRecord>, EngineError> {
        let mut found = self.reader.scan_at(start, end, at)?;
        for (k, versions) in &self.pending {
            if in_range(k, start, end) {
                if let Some(r) = versions.iter().rev().find(|r| r.mod_revision <= at) {
                    found.insert(k.clone(), r.clone());
                }
            }
        }
        for (k, c) in changes {
            if in_range(k, start, end) && c.now.mod_revision <= at {
                found.insert(k.clone(), c.now.clone());
            }
        }
        Ok(found)
    }

    fn txn_range(
        &self,
        req: &RangeRequest,
        revision: i64,
        changes: &Changes,
    ) -> Result<Result<RangeResult, ApplyError>, EngineError> {
        // Reads inside a txn see its earlier writes, as in etcd.
        let current = if changes.is_empty() { self.revision } else { revision };
        let at = match resolve_revision(req.revision, current, self.compacted) {
            Ok(at) => at,
            Err(e) => return Ok(Err(e)),
        };
        let found = self.view_range(&req.key, &req.range_end, at, changes)?;
        Ok(Ok(finish_range(req, found.into_iter())))
    }

    fn put(
        &self,
        p: &PutRequest,
        revision: i64,
        changes: &mut Changes,
    ) -> Result<Result<OpResult, ApplyError>, EngineError> {
        if changes.contains_key(&p.key) {
            return Ok(Err(ApplyError::DuplicateKey));
        }
        let prev = self.latest(&p.key, changes)?.filter(|r| !r.deleted);
        let value = if p.ignore_value {
            match &prev {
                Some(r) => r.value.clone(),
                None => return Ok(Err(ApplyError::KeyNotFound)),
            }
        } else {
            p.value.clone()
        };
        let lease = if p.ignore_lease {
            match &prev {
                Some(r) => r.lease,
                None => return Ok(Err(ApplyError::KeyNotFound)),
            }
        } else {
            p.lease
        };
        if lease != 0 && !self.lease_exists(lease)? {
            return Ok(Err(ApplyError::LeaseNotFound { id: lease }));
        }
        let rec = KvRecord {
            create_revision: prev.as_ref().map_or(revision, |r| r.create_revision),
            mod_revision: revision,
            version: prev.as_ref().map_or(1, |r| r.version + 1),
            lease,
            value,
            deleted: false,
        };
        let prev_kv = if p.prev_kv { prev.as_ref().map(|r| r.to_kv(&p.key)) } else { None };
        changes.insert(p.key.clone(), Change { now: rec, prev });
        Ok(Ok(OpResult::Put { prev_kv }))
    }

    fn delete(
        &self,
        d: &DeleteRequest,
        revision: i64,
        changes: &mut Changes,
    ) -> Result<Result<OpResult, ApplyError>, EngineError> {
        let live: Vec<(Vec<u8>, KvRecord)> =
            self.view_range(&d.key, &d.range_end, i64::MAX, changes)?.into_iter().filter(|(_, r)| !r.deleted).collect();
        let mut prev_kvs = Vec::new();
        for (k, r) in &live {
            if changes.get(k).is_some_and(|c| c.now.mod_revision == revision) {
                return Ok(Err(ApplyError::DuplicateKey));
            }
            if d.prev_kv {
                prev_kvs.push(r.to_kv(k));
            }
        }
        let deleted = live.len() as i64;
        for (k, r) in live {
            changes.insert(k, Change { now: KvRecord::tombstone(revision), prev: Some(r) });
        }
        Ok(Ok(OpResult::DeleteRange { deleted, prev_kvs }))
    }

    fn commit_revision(&mut self, revision: i64, timestamp_ms: u64, changes: Changes) -> Result<(), EngineError> {
        let db = self.db();
        let mut events = Vec::with_capacity(changes.len());
        let mut keys = Vec::with_capacity(changes.len());
        for (k, Change { now: rec, prev }) in changes {
            let old_lease = prev.as_ref().filter(|p| !p.deleted).map_or(0, |p| p.lease);
            let new_lease = if rec.deleted { 0 } else { rec.lease };
            if old_lease != new_lease {
                self.attach(old_lease, &k, false);
                self.attach(new_lease, &k, true);
            }
            events.push(make_event(&k, &rec, prev.as_ref()));
            self.batch.put_cf(cf(db, CF_HIST), hist_key(&k, revision), encode(&rec));
            keys.push(k.clone());
            self.pending.entry(k).or_default().push(rec);
        }
        self.batch.put_cf(cf(db, CF_REV), rev_key(revision), encode(&RevRecord { timestamp_ms, keys }));
        self.revision = revision;
        self.events.push(RevisionEvents { revision, timestamp_ms, events });
        Ok(())
    }

    fn lease_exists(&self, id: i64) -> Result<bool, EngineError> {
        match self.pending_leases.get(&id) {
            Some(pending) => Ok(pending.is_some()),
            None => Ok(self.reader.lease(id)?.is_some()),
        }
    }

    /// Records that `key` is (or is no longer) attached to lease `id`.
    fn attach(&mut self, id: i64, key: &[u8], attached: bool) {
        if id == 0 {
            return;
        }
        let db = self.db();
        let k = lease_attachment_key(id, key);
        if attached {
            self.batch.put_cf(cf(db, CF_LEASE), k, []);
        } else {
            self.batch.delete_cf(cf(db, CF_LEASE), k);
        }
        self.pending_lease_keys.insert((id, key.to_vec()), attached);
    }

    fn lease_grant(&mut self, id: i64, ttl_seconds: i64) -> Result<ProposalResult, EngineError> {
        if self.lease_exists(id)? {
            return Ok(Err(ApplyError::LeaseExists { id }));
        }
        let db = self.db();
        self.batch.put_cf(cf(db, CF_LEASE), lease_key(id), encode(&LeaseRecord { ttl_seconds }));
        self.pending_leases.insert(id, Some(ttl_seconds));
        Ok(Ok(Output::LeaseGranted { id, ttl_seconds }))
    }

    /// Deletes the lease and, in one revision, every key still attached to it.
    fn lease_revoke(&mut self, id: i64, timestamp_ms: u64) -> Result<ProposalResult, EngineError> {
        if !self.lease_exists(id)? {
            return Ok(Err(ApplyError::LeaseNotFound { id }));
        }
        let mut keys: std::collections::BTreeSet<Vec<u8>> = self.reader.lease_keys(id)?.into_iter().collect();
        for ((lease, key), attached) in &self.pending_lease_keys {
            if *lease == id {
                if *attached {
                    keys.insert(key.clone());
                } else {
                    keys.remove(key);
                }
            }
        }
        let revision = self.revision + 1;
        let mut changes = Changes::new();
        for key in keys {
            if let Some(live) = self.latest(&key, &changes)?.filter(|r| !r.deleted && r.lease == id) {
                changes.insert(key, Change { now: KvRecord::tombstone(revision), prev: Some(live) });
            }
        }
        if !changes.is_empty() {
            self.commit_revision(revision, timestamp_ms, changes)?;
        }
        let db = self.db();
        self.batch.delete_cf(cf(db, CF_LEASE), lease_key(id));
        self.pending_leases.insert(id, None);
        Ok(Ok(Output::LeaseRevoked { revision: self.revision }))
    }

    /// Applies one change to the auth store; a refused change writes nothing.
    fn auth(&mut self, change: &AuthCommand) -> Result<ProposalResult, EngineError> {
        let mut state = match self.auth.take() {
            Some(state) => state,
            None => self.reader.auth()?,
        };
        let before = state.revision;
        let result = state.apply(change);
        if state.revision != before {
            let db = self.db();
            self.batch.put_cf(cf(db, CF_META), META_AUTH, encode(&state));
        }
        self.auth = Some(state);
        Ok(result.map(|revision| Output::Auth { revision }).map_err(ApplyError::from))
    }

    /// The auth store as this batch left it, if a command of the batch
    /// touched it.
    pub fn take_auth(&mut self) -> Option<AuthState> {
        self.auth.take()
    }

    /// Raises or clears `alarm`; answers with what changed.
    fn alarm(&mut self, alarm: Alarm, raise: bool) -> ProposalResult {
        let found = self.alarms.binary_search(&alarm);
        match (found, raise) {
            (Err(at), true) => self.alarms.insert(at, alarm),
            (Ok(at), false) => {
                self.alarms.remove(at);
            }
            _ => return Ok(Output::Alarm { changed: Vec::new() }),
        }
        let db = self.db();
        self.batch.put_cf(cf(db, CF_META), META_ALARMS, encode(&self.alarms));
        Ok(Output::Alarm { changed: vec![alarm] })
    }

    /// Replicated compaction: reads below `revision` fail from now on, and
    /// every version no read at or above it can reach is deleted.
    fn compact(&mut self, revision: i64) -> Result<ProposalResult, EngineError> {
        if revision <= self.compacted {
            return Ok(Err(ApplyError::Compacted { compacted: self.compacted }));
        }
        if revision > self.revision {
            return Ok(Err(ApplyError::FutureRevision { current: self.revision }));
        }
        self.compacted = revision;
        let db = self.db();
        let hist = cf(db, CF_HIST);
        let mut it = db.raw_iterator_cf_opt(hist, self.reader.opts());
        it.seek_to_first();
        // Of each key's versions at or below `revision`, keep only the
        // newest, and only if it is live or at `revision` itself: it is what
        // a read at `revision` returns (as etcd, the version it replaced is
        // dropped, so the event at `revision` replays without its prev_kv).
        // Keeping the version below a delete at `revision` would keep the
        // deleted value, and the space it holds, until the next compaction.
        let mut group: Option<Vec<u8>> = None;
        let mut newest_below: Option<(Vec<u8>, bool)> = None; // (raw hist key, tombstone)
        while let (Some(k), Some(v)) = (it.key(), it.value()) {
            let (key, rev) = decode_hist_key(k)?;
            if group.as_ref() != Some(&key) {
                if let Some((raw, true)) = newest_below.take() {
                    self.batch.delete_cf(hist, raw);
                }
                group = Some(key);
            }
            if rev < revision {
                if let Some((older, _)) = newest_below.take() {
                    self.batch.delete_cf(hist, older);
                }
                let rec: KvRecord = decode(CF_HIST, v)?;
                newest_below = Some((k.to_vec(), rec.deleted));
            } else if rev == revision {
                if let Some((older, _)) = newest_below.take() {
                    self.batch.delete_cf(hist, older);
                }
            }
            it.next();
        }
        it.status()?;
        if let Some((raw, true)) = newest_below {
            self.batch.delete_cf(hist, raw);
        }
        self.batch.delete_range_cf(cf(db, CF_REV), rev_key(0), rev_key(revision));
        Ok(Ok(Output::Compacted { revision }))
    }

    /// Adds the counters to the batch; the caller adds `last_applied` and
    /// writes the batch.
    pub fn finish(mut self) -> (WriteBatch, Vec<RevisionEvents>, i64) {
        let db = self.db();
        self.batch.put_cf(cf(db, CF_META), META_REVISION, encode(&self.revision));
        self.batch.put_cf(cf(db, CF_META), META_COMPACTED, encode(&self.compacted));
        (self.batch, self.events, self.revision)
    }
}

/// Request ids: `u` ++ the big-endian id, which sorts by age. (The earlier
/// layout's `i` and `t` keys sort before it and expire with it.)
const DEDUP_PREFIX: u8 = b'u';

fn dedup_key(id: RequestId) -> Vec<u8> {
    let mut k = Vec::with_capacity(17);
    k.push(DEDUP_PREFIX);
    k.extend_from_slice(&id.0.to_be_bytes());
    k
}

/// Memtable size of `hist`. Keys arrive in random order, so each insert
/// walks the skiplist from the top and misses the cache at most levels; a
/// memtable of 8 MiB instead of RocksDB's 64 MiB keeps that walk mostly in
/// cache. Measured on 3 members, 256 clients, 100,000 keys: members' CPU
/// per write 82 -> 74 us (8 alternating runs, all in the same direction);
/// 4 MiB flushed and compacted enough to give some of it back.
const HIST_MEMTABLE_BYTES: usize = 8 << 20;

/// Memtable memory of all families together past which RocksDB flushes
/// them. Applies bypass the WAL (see [`apply_write_options`]), so what sits
/// in memtables is what a crashed member re-applies from the Raft log when
/// it restarts. `hist` flushes every 8 MiB under writes of any size, but
/// `rev` and `dedup` take a few dozen bytes per write into 64 MiB
/// memtables: without this bound, writes of small values would leave over
/// a million writes to re-apply.
const SM_MEMTABLES_BYTES: usize = 16 << 20;

/// How the state machine writes an applied batch: without RocksDB's WAL.
/// The Raft log already holds every applied entry on disk, and keeps it
/// until a snapshot covers it; a snapshot is a checkpoint, which flushes
/// every memtable first. With atomic flush (see [`open_db`]) the families
/// reach disk together, so after a crash the database is the state after
/// some applied entry, and `last_applied` stored with it says which: openraft
/// re-applies the log from there. A WAL would write every applied byte a
/// second time only to shorten that replay. Measured on 3 members at 256
/// clients: see bench/README.md.
pub fn apply_write_options() -> rocksdb::WriteOptions {
    let mut opts = rocksdb::WriteOptions::default();
    opts.disable_wal(true);
    opts
}

/// The key part of a `hist` key (the encoded key with its terminator, without
/// the revision): all versions of one key share it. The name is stored with
/// each table; tables written under another extractor just go unfiltered.
fn hist_key_prefix() -> rocksdb::SliceTransform {
    fn key_part(hist_key: &[u8]) -> &[u8] {
        &hist_key[..hist_key.len().saturating_sub(8)]
    }
    fn is_hist_key(raw: &[u8]) -> bool {
        raw.len() >= 10
    }
    rocksdb::SliceTransform::create("skiff.hist.key.v1", key_part, Some(is_hist_key))
}

/// Runs RocksDB's compactions (its process-wide low-priority thread pool,
/// shared by every database this process opens) at nice 19. They are never
/// on a write's path, but on a machine with few cores a long merge competes
/// with the threads that are: the apply loop, the log's fsyncs, the gRPC
/// server. Flushes run in the high-priority pool and keep normal priority,
/// because a memtable that cannot flush stalls writes.
fn lower_compaction_priority() {
    static LOWERED: std::sync::Once = std::sync::Once::new();
    LOWERED.call_once(|| match rocksdb::Env::new() {
        Ok(mut env) => env.lower_thread_pool_cpu_priority(),
        Err(e) => tracing::warn!(error = %e, "cannot lower the priority of RocksDB's compactions"),
    });
}

/// Opens (creating if needed) a state-machine database with its column families.
pub fn open_db(path: &std::path::Path) -> Result<DB, rocksdb::Error> {
    lower_compaction_priority();
    let mut opts = rocksdb::Options::default();
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    opts.set_compression_type(rocksdb::DBCompressionType::Lz4);
    // Flushes and compactions sync their files a megabyte at a time instead
    // of in one fsync at the end, which otherwise holds up the Raft log's
    // fsyncs on the same disk for tens of ms (RocksDB's tuning guide
    // recommends 1 MiB).
    opts.set_bytes_per_sync(1 << 20);
    // Writes that bypass the WAL are only consistent across families if
    // the families flush together: `dedup` on disk ahead of `hist` would
    // make a re-applied write look applied already.
    opts.set_atomic_flush(true);
    opts.set_db_write_buffer_size(SM_MEMTABLES_BYTES);
    let families = COLUMN_FAMILIES.iter().map(|name| {
        let mut cf_opts = opts.clone();
        if *name == CF_HIST {
            // Every put looks up the key's newest version, and a create finds
            // none: without a filter that costs a full skiplist walk in the
            // memtable and a seek in every table that may hold the key.
            // Blooms over the key part of `hist` keys answer it instead.
            cf_opts.set_write_buffer_size(HIST_MEMTABLE_BYTES);
            // Every put adds a version of a key anywhere in the key space,
            // so with leveled compaction each L0 file overlaps the whole of
            // the bottom level, and while the history is under a few hundred
            // MB that level is also the base level: every L0 compaction
            // rewrote all of history, a cost per write that grew with it.
            // Universal compaction merges sorted runs of similar size
            // instead, so a version is rewritten a few times, whatever the
            // history's size. 5 runs of 10 s at 256 clients on one cluster
            // (history growing to ~1M versions), twice each way: leveled
            // 23.4k -> 18.2k writes/s from the first run to the fifth and
            // 5.3 s of compaction CPU per member; universal 23.7k -> 21.0k
            // and 3.4 s. Its merges of large runs once raised the 1-client
            // p99 round by round in `make bench`; compactions now run at
            // nice 19 (see `lower_compaction_priority`). bench/README.md
            // has the runs.
            cf_opts.set_compaction_style(rocksdb::DBCompactionStyle::Universal);
            cf_opts.set_prefix_extractor(hist_key_prefix());
            cf_opts.set_memtable_prefix_bloom_ratio(0.05);
            let mut table = rocksdb::BlockBasedOptions::default();
            table.set_bloom_filter(10.0, false);
            table.set_whole_key_filtering(false);
            cf_opts.set_block_based_table_factory(&table);
        }
        if *name == CF_DEDUP {
            // Every write looks its request id up, and almost always finds
            // nothing: bloom filters (memtable and tables) answer that
            // without walking the skiplist or reading a block.
            cf_opts.set_memtable_prefix_bloom_ratio(0.05);
            cf_opts.set_memtable_whole_key_filtering(true);
            let mut table = rocksdb::BlockBasedOptions::default();
            table.set_bloom_filter(10.0, false);
            cf_opts.set_block_based_table_factory(&table);
        }
        rocksdb::ColumnFamilyDescriptor::new(*name, cf_opts)
    });
    DB::open_cf_descriptors(&opts, path, families)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Byte fields are encoded in bulk (`serde_bytes`), which must not change
    /// bincode's encoding: logs, snapshots and databases written before it
    /// are read back as they were.
    #[test]
    fn byte_fields_keep_the_bincode_encoding_of_a_plain_vec() {
        #[derive(Serialize, Deserialize, PartialEq, Debug)]
        struct PlainRecord {
            create_revision: i64,
            mod_revision: i64,
            version: i64,
            lease: i64,
            value: Vec<u8>,
            deleted: bool,
        }
        #[derive(Serialize, Deserialize)]
        struct PlainPut {
            key: Vec<u8>,
            value: Vec<u8>,
            lease: i64,
            prev_kv: bool,
            ignore_value: bool,
            ignore_lease: bool,
        }
        let value: Vec<u8> = (0..=255).collect();
        let record = KvRecord {
            create_revision: 3,
            mod_revision: 9,
            version: 2,
            lease: 7,
            value: value.clone(),
            deleted: false,
        };
        let plain = PlainRecord {
            create_revision: 3,
            mod_revision: 9,
            version: 2,
            lease: 7,
            value: value.clone(),
            deleted: false,
        };
        assert_eq!(encode(&record), encode(&plain));
        assert_eq!(decode::<KvRecord>(CF_HIST, &encode(&plain)).unwrap(), record);
        let put = PutRequest { key: b"k".to_vec(), value: value.clone(), lease: 1, ..Default::default() };
        let plain_put =
            PlainPut { key: b"k".to_vec(), value, lease: 1, prev_kv: false, ignore_value: false, ignore_lease: false };
        assert_eq!(encode(&put), encode(&plain_put));
        assert_eq!(bincode::deserialize::<PutRequest>(&encode(&plain_put)).unwrap(), put);
    }

    #[test]
    fn encoded_keys_sort_like_raw_keys() {
        let keys: Vec<&[u8]> =
            vec![b"", b"\0", b"\0\0", b"\0\x01", b"a", b"a\0", b"a\0b", b"a\x01", b"ab", b"b", b"\xff"];
        for w in keys.windows(2) {
            let (a, b) = (hist_key(w[0], 5), hist_key(w[1], 1));
            assert!(a < b, "{:?} should sort before {:?}", w[0], w[1]);
        }
    }

    #[test]
    fn hist_keys_round_trip() {
        for key in [&b""[..], b"\0", b"a\0\xffb", b"plain/key"] {
            assert_eq!(decode_hist_key(&hist_key(key, 42)).unwrap(), (key.to_vec(), 42));
        }
    }

    /// Total size of the WAL files in `dir`.
    fn wal_bytes(dir: &std::path::Path) -> u64 {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
            .map(|e| e.metadata().unwrap().len())
            .sum()
    }

    /// Writes what an applied batch `n` writes to each family: a 1 KiB
    /// version in `hist` (so `hist` flushes every few thousand batches), a
    /// `rev` record, a request id, and the revision in `meta`.
    fn write_applied_batch(db: &DB, n: i64) {
        let mut batch = WriteBatch::default();
        batch.put_cf(cf(db, CF_HIST), hist_key(format!("k{}", n % 1000).as_bytes(), n), [7u8; 1024]);
        batch.put_cf(cf(db, CF_REV), rev_key(n), [1u8; 40]);
        batch.put_cf(cf(db, CF_DEDUP), n.to_be_bytes(), [2u8; 40]);
        batch.put_cf(cf(db, CF_META), META_REVISION, encode(&n));
        db.write_opt(batch, &apply_write_options()).unwrap();
    }

    fn count(db: &DB, family: &'static str) -> i64 {
        db.iterator_cf(cf(db, family), rocksdb::IteratorMode::Start).count() as i64
    }

    /// Applies bypass the WAL, so a crash loses what is in memtables; what
    /// is on disk must still be one consistent point, with every family at
    /// the same batch, for the Raft log to re-apply from. A child process
    /// writes batches through several flushes of `hist` and aborts (no
    /// destructor, no flush); the parent reopens the database.
    #[test]
    fn after_a_crash_every_family_is_at_the_same_applied_batch() {
        const CHILD: &str = "SKIFF_TEST_CRASH_DIR";
        if let Ok(dir) = std::env::var(CHILD) {
            let db = open_db(std::path::Path::new(&dir)).unwrap();
            for n in 1..=30_000 {
                write_applied_batch(&db, n);
            }
            std::process::abort();
        }
        let dir = tempfile::tempdir().unwrap();
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "mvcc::tests::after_a_crash_every_family_is_at_the_same_applied_batch"])
            .env(CHILD, dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(!status.success(), "the child was meant to abort");
        assert_eq!(wal_bytes(dir.path()), 0, "applies wrote to the WAL");
        let db = open_db(dir.path()).unwrap();
        let applied = Reader::live(&db).revision().unwrap();
        assert!(applied > 0 && applied < 30_000, "expected some but not all batches on disk, found {applied}");
        for family in [CF_REV, CF_DEDUP] {
            assert_eq!(count(&db, family), applied, "`{family}` is not at batch {applied}");
        }
        let hist_max = db
            .iterator_cf(cf(&db, CF_HIST), rocksdb::IteratorMode::Start)
            .map(|kv| decode_hist_key(&kv.unwrap().0).unwrap().1)
            .max();
        assert_eq!(hist_max, Some(applied), "`hist` is not at batch {applied}");
        assert_eq!(count(&db, CF_HIST), applied);
    }

    /// Writes that bypass the WAL are only flushed when memtables fill, so
    /// the families that take a few dozen bytes per write must not be left
    /// to fill 64 MiB each: that is what a restarted member re-applies.
    #[test]
    fn memtables_stay_bounded_when_only_small_records_are_written() {
        let dir = tempfile::tempdir().unwrap();
        let db = open_db(dir.path()).unwrap();
        for n in 1..=1_000_000i64 {
            let mut batch = WriteBatch::default();
            batch.put_cf(cf(&db, CF_REV), rev_key(n), [1u8; 40]);
            batch.put_cf(cf(&db, CF_DEDUP), n.to_be_bytes(), [2u8; 40]);
            db.write_opt(batch, &apply_write_options()).unwrap();
        }
        let in_memtables: u64 = COLUMN_FAMILIES
            .iter()
            .map(|name| db.property_int_value_cf(cf(&db, name), "rocksdb.cur-size-all-mem-tables").unwrap().unwrap())
            .sum();
        assert!(
            in_memtables <= 2 * SM_MEMTABLES_BYTES as u64,
            "{in_memtables} bytes in memtables after 1,000,000 small writes"
        );
    }

    /// The nice value in a `/proc/.../stat` file: fields after the
    /// parenthesised name start at the state (field 3); nice is field 19.
    fn nice_in_stat(stat: &std::path::Path) -> Option<i64> {
        std::fs::read_to_string(stat).ok()?.rsplit_once(')')?.1.split_whitespace().nth(16)?.parse().ok()
    }

    /// The nice value of every thread of this process named `name`.
    fn nice_of_threads(name: &str) -> Vec<i64> {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|task| {
                let task = task.ok()?.path();
                if std::fs::read_to_string(task.join("comm")).ok()?.trim() != name {
                    return None;
                }
                nice_in_stat(&task.join("stat"))
            })
            .collect()
    }

    #[test]
    fn compactions_run_at_the_lowest_cpu_priority() {
        let dir = tempfile::tempdir().unwrap();
        let db = open_db(dir.path()).unwrap();
        for round in 0..3i64 {
            let mut batch = WriteBatch::default();
            for n in 0..1_000i64 {
                batch.put_cf(cf(&db, CF_HIST), hist_key(&n.to_be_bytes(), round * 1_000 + n), [round as u8; 64]);
            }
            db.write_opt(batch, &apply_write_options()).unwrap();
            db.flush_cf(cf(&db, CF_HIST)).unwrap();
        }
        // A manual compaction runs in the low-priority pool, whose threads
        // take their priority when they pick a job up.
        db.compact_range_cf(cf(&db, CF_HIST), None::<&[u8]>, None::<&[u8]>);
        let nice = nice_of_threads("rocksdb:low");
        assert!(!nice.is_empty(), "no RocksDB compaction thread found");
        assert!(nice.iter().all(|&n| n == 19), "compaction threads' nice values: {nice:?}");
        // Flushes keep the priority the process was started with.
        let own = nice_in_stat(std::path::Path::new("/proc/thread-self/stat")).unwrap();
        let flush_nice = nice_of_threads("rocksdb:high");
        assert!(flush_nice.iter().all(|&n| n == own), "flush threads' nice values {flush_nice:?}, ours {own}");
    }

    #[test]
    fn range_ends_follow_etcd() {
        assert!(in_range(b"a", b"a", b""));
        assert!(!in_range(b"ab", b"a", b""));
        assert!(in_range(b"zzz", b"a", b"\0"));
        assert!(in_range(b"ab", b"a", b"b"));
        assert!(!in_range(b"b", b"a", b"b"));
    }
}
