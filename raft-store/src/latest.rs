//! The newest record of recently written keys, for the applier.
//!
//! Every put needs the record it overwrites (for `create_revision`,
//! `version`, the lease and the event's `prev_kv`). Without this cache that
//! is a `seek_for_prev` into the history per write, on every member, which
//! profiling showed to be most of a follower's apply time. etcd keeps its
//! whole key index in memory for the same reason; Skiff keeps a bounded LRU
//! of whole records instead, so memory stays bounded however many keys exist.
//!
//! The cache is write-through: the state machine fills it only after the
//! batch that produced the records is committed to RocksDB, and empties it
//! when a snapshot replaces the database. It holds exactly what the database
//! says the newest record is, so a member's answers never depend on whether
//! a key was cached. A deleted key is cached as `None`: for the applier a
//! tombstone and a missing key mean the same.
//!
//! Reads of one key at the current revision are answered from it too
//! ([`crate::state_machine::StateMachine::range_cached`]): the cache knows
//! the revision its records are the newest at, so a hit needs no RocksDB
//! snapshot, seek or blocking-pool hop.
//!
//! It also keeps the answers of a few small ranges read at its revision
//! (what admission reads on every write: the PriorityClasses, a
//! namespace's ResourceQuotas). A range's answer is kept until a write to
//! a key inside it is applied, so a kept answer is the range's state at the
//! cache's revision, however far that has moved since.

use std::collections::VecDeque;

use lru::LruCache;

use crate::mvcc::KvRecord;
use crate::types::RangeResult;

/// Bytes a cached record is charged beyond its key and value.
const RECORD_OVERHEAD: usize = 96;

/// The most range answers kept, and the most bytes of keys and values they
/// hold together; the oldest kept goes first.
const RANGES_MAX: usize = 256;
const RANGE_BYTES_MAX: usize = 4 << 20;

/// The answer of a plain range (no limit, filter or sort) over
/// `[start, end)`.
struct CachedRange {
    start: Vec<u8>,
    end: Vec<u8>,
    result: RangeResult,
    bytes: usize,
}

impl CachedRange {
    fn holds(&self, key: &[u8]) -> bool {
        self.start.as_slice() <= key && key < self.end.as_slice()
    }
}

pub struct LatestCache {
    records: LruCache<Vec<u8>, Option<KvRecord>>,
    bytes: usize,
    limit: usize,
    /// The store revision the records are the newest at: that of the last
    /// batch committed (0: unknown, after a start or a snapshot install).
    revision: i64,
    ranges: VecDeque<CachedRange>,
    range_bytes: usize,
}

fn cost(key: &[u8], record: &Option<KvRecord>) -> usize {
    key.len() + record.as_ref().map_or(0, |r| r.value.len()) + RECORD_OVERHEAD
}

impl LatestCache {
    /// A cache holding at most about `limit` bytes of keys and values.
    pub fn new(limit: usize) -> LatestCache {
        LatestCache {
            records: LruCache::unbounded(),
            bytes: 0,
            limit,
            revision: 0,
            ranges: VecDeque::new(),
            range_bytes: 0,
        }
    }

    /// The newest record of `key` if cached: `Some(None)` means the key does
    /// not exist (or was deleted).
    pub fn get(&self, key: &[u8]) -> Option<&Option<KvRecord>> {
        self.records.peek(key)
    }

    /// [`LatestCache::get`] for a reader: a hit counts as a use, so keys
    /// read often stay cached as keys written often do.
    pub fn read(&mut self, key: &[u8]) -> Option<&Option<KvRecord>> {
        self.records.get(key)
    }

    /// Records that the newest record of `key` is now `record`.
    pub fn insert(&mut self, key: Vec<u8>, record: Option<KvRecord>) {
        let added = cost(&key, &record);
        if added > self.limit {
            if let Some(old) = self.records.pop(&key) {
                self.bytes -= cost(&key, &old);
            }
            return;
        }
        if let Some(old) = self.records.peek(&key) {
            self.bytes -= cost(&key, old);
        }
        self.bytes += added;
        self.records.put(key, record);
        while self.bytes > self.limit {
            match self.records.pop_lru() {
                Some((k, r)) => self.bytes -= cost(&k, &r),
                None => break,
            }
        }
    }

    /// Forgets `key` (its newest record is not worth keeping).
    pub fn forget(&mut self, key: &[u8]) {
        if let Some(old) = self.records.pop(key) {
            self.bytes -= cost(key, &old);
        }
    }

    /// Forgets everything (the database was replaced).
    pub fn clear(&mut self) {
        self.records.clear();
        self.bytes = 0;
        self.revision = 0;
        self.ranges.clear();
        self.range_bytes = 0;
    }

    /// The kept answer of the plain range `[start, end)`, as of
    /// [`LatestCache::revision`].
    pub fn range(&self, start: &[u8], end: &[u8]) -> Option<&RangeResult> {
        self.ranges.iter().find(|r| r.start == start && r.end == end).map(|r| &r.result)
    }

    /// Keeps `result`, the answer of the plain range `[start, end)` read at
    /// [`LatestCache::revision`] (the caller checks that it was). `end` is a
    /// key: not empty (one key) and not `\0` (every key from `start`).
    pub fn insert_range(&mut self, start: &[u8], end: &[u8], result: RangeResult) {
        debug_assert!(!end.is_empty() && end != b"\0");
        let bytes = start.len()
            + end.len()
            + result.kvs.iter().map(|kv| kv.key.len() + kv.value.len() + RECORD_OVERHEAD).sum::<usize>()
            + RECORD_OVERHEAD;
        if bytes > RANGE_BYTES_MAX || self.range(start, end).is_some() {
            return;
        }
        while self.ranges.len() >= RANGES_MAX || self.range_bytes + bytes > RANGE_BYTES_MAX {
            let Some(oldest) = self.ranges.pop_front() else { break };
            self.range_bytes -= oldest.bytes;
        }
        self.range_bytes += bytes;
        self.ranges.push_back(CachedRange { start: start.to_vec(), end: end.to_vec(), result, bytes });
    }

    /// Drops the kept answers of every range that holds `key`, which a
    /// batch being committed changes.
    pub fn changed(&mut self, key: &[u8]) {
        if self.ranges.iter().any(|r| r.holds(key)) {
            let bytes = &mut self.range_bytes;
            self.ranges.retain(|r| {
                let keep = !r.holds(key);
                if !keep {
                    *bytes -= r.bytes;
                }
                keep
            });
        }
    }

    /// Records that the batch committed last left the store at `revision`.
    pub fn set_revision(&mut self, revision: i64) {
        self.revision = revision;
    }

    /// The revision the cached records are the newest at (0: unknown).
    pub fn revision(&self) -> i64 {
        self.revision
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.records.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(value_len: usize, revision: i64) -> Option<KvRecord> {
        Some(KvRecord {
            create_revision: 1,
            mod_revision: revision,
            version: revision,
            lease: 0,
            value: vec![b'x'; value_len],
            deleted: false,
        })
    }

    #[test]
    fn keeps_the_newest_record_and_its_byte_count() {
        let mut cache = LatestCache::new(10_000);
        cache.insert(b"a".to_vec(), record(10, 1));
        cache.insert(b"a".to_vec(), record(20, 2));
        assert_eq!(cache.get(b"a"), Some(&record(20, 2)));
        assert_eq!(cache.bytes(), 1 + 20 + RECORD_OVERHEAD);
        cache.insert(b"a".to_vec(), None);
        assert_eq!(cache.get(b"a"), Some(&None));
        assert_eq!(cache.bytes(), 1 + RECORD_OVERHEAD);
        assert_eq!(cache.get(b"b"), None);
    }

    #[test]
    fn evicts_the_least_recently_written_past_the_limit() {
        let per = 1 + 100 + RECORD_OVERHEAD;
        let mut cache = LatestCache::new(3 * per);
        for k in [b"a", b"b", b"c"] {
            cache.insert(k.to_vec(), record(100, 1));
        }
        cache.insert(b"a".to_vec(), record(100, 2));
        cache.insert(b"d".to_vec(), record(100, 1));
        assert_eq!(cache.len(), 3);
        assert_eq!(cache.get(b"b"), None, "b was written least recently");
        assert!(cache.get(b"a").is_some() && cache.get(b"c").is_some() && cache.get(b"d").is_some());
        assert!(cache.bytes() <= 3 * per);
    }

    #[test]
    fn a_record_bigger_than_the_cache_is_not_kept_and_drops_a_stale_one() {
        let mut cache = LatestCache::new(500);
        cache.insert(b"a".to_vec(), record(10, 1));
        cache.insert(b"a".to_vec(), record(1_000, 2));
        assert_eq!(cache.get(b"a"), None);
        assert_eq!(cache.bytes(), 0);
    }

    #[test]
    fn forget_drops_one_key() {
        let mut cache = LatestCache::new(10_000);
        cache.insert(b"a".to_vec(), record(10, 1));
        cache.insert(b"b".to_vec(), record(10, 1));
        cache.forget(b"a");
        cache.forget(b"zzz");
        assert_eq!(cache.get(b"a"), None);
        assert!(cache.get(b"b").is_some());
        assert_eq!(cache.bytes(), 1 + 10 + RECORD_OVERHEAD);
    }

    #[test]
    fn clear_empties_it() {
        let mut cache = LatestCache::new(10_000);
        cache.insert(b"a".to_vec(), record(10, 1));
        cache.insert_range(b"a", b"b", RangeResult::default());
        cache.clear();
        assert!(cache.is_empty());
        assert_eq!(cache.bytes(), 0);
        assert!(cache.range(b"a", b"b").is_none());
        assert_eq!(cache.range_bytes, 0);
    }

    fn answer(keys: &[&str]) -> RangeResult {
        let kvs: Vec<crate::types::KeyValue> = keys
            .iter()
            .map(|k| crate::types::KeyValue { key: k.as_bytes().to_vec(), value: b"v".to_vec(), ..Default::default() })
            .collect();
        RangeResult { count: kvs.len() as i64, kvs, more: false }
    }

    #[test]
    fn a_range_answer_is_kept_until_a_key_inside_it_changes() {
        let mut cache = LatestCache::new(10_000);
        cache.insert_range(b"/q/ns1/", b"/q/ns10", answer(&["/q/ns1/a"]));
        cache.insert_range(b"/q/ns2/", b"/q/ns20", answer(&[]));
        cache.changed(b"/q/ns10");
        cache.changed(b"/q/ns0/a");
        cache.changed(b"/p/x");
        assert_eq!(cache.range(b"/q/ns1/", b"/q/ns10"), Some(&answer(&["/q/ns1/a"])), "writes outside keep it");
        assert!(cache.range(b"/q/ns1/", b"/q/ns2").is_none(), "another range is another answer");
        cache.changed(b"/q/ns1/b");
        assert!(cache.range(b"/q/ns1/", b"/q/ns10").is_none(), "a new key inside drops it");
        assert_eq!(cache.range(b"/q/ns2/", b"/q/ns20"), Some(&answer(&[])));
        cache.changed(b"/q/ns2/");
        assert!(cache.range(b"/q/ns2/", b"/q/ns20").is_none(), "the start is inside");
        assert_eq!(cache.range_bytes, 0);
    }

    #[test]
    fn range_answers_are_bounded_oldest_first() {
        let mut cache = LatestCache::new(10_000);
        for i in 0..RANGES_MAX + 10 {
            let start = format!("/r/{i:05}/");
            let end = format!("/r/{i:05}0");
            cache.insert_range(start.as_bytes(), end.as_bytes(), answer(&[]));
        }
        assert_eq!(cache.ranges.len(), RANGES_MAX);
        assert!(cache.range(b"/r/00000/", b"/r/000000").is_none(), "the oldest went");
        assert!(cache.range(b"/r/00265/", b"/r/002650").is_some());
        let big = RangeResult {
            kvs: vec![crate::types::KeyValue {
                key: b"/b/1".to_vec(),
                value: vec![0; RANGE_BYTES_MAX],
                ..Default::default()
            }],
            more: false,
            count: 1,
        };
        cache.insert_range(b"/b/", b"/b0", big);
        assert!(cache.range(b"/b/", b"/b0").is_none(), "an answer bigger than the budget is not kept");
        assert!(cache.range_bytes <= RANGE_BYTES_MAX);
    }
}
