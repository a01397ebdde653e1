//! One-key reads answered from the cache of newest records give what a
//! RocksDB snapshot of the same state gives.

use std::sync::Arc;

use openraft::storage::RaftStateMachine;
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};

use crate::mvcc::Reader;
use crate::state_machine::StateMachine;
use crate::types::{Batch, Command, DeleteRequest, Op, Proposal, PutRequest, RangeRequest, RequestId, Txn};

fn entry(index: u64, ops: Vec<Op>) -> Entry<crate::types::TypeConfig> {
    let proposals: Vec<Proposal> = ops
        .into_iter()
        .map(|op| Proposal {
            id: RequestId::fresh(),
            command: Command::Txn(Txn { compare: vec![], success: vec![op], failure: vec![] }),
        })
        .collect();
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
        payload: EntryPayload::Normal(Batch { timestamp_ms: 1, proposals: Arc::from(proposals) }),
    }
}

fn put(key: &str, value: &str) -> Op {
    Op::Put(PutRequest { key: key.into(), value: value.into(), ..Default::default() })
}

fn get(key: &str) -> RangeRequest {
    RangeRequest { key: key.into(), ..Default::default() }
}

#[tokio::test]
async fn a_cached_key_reads_as_a_snapshot_of_the_same_revision() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut sm = StateMachine::open(dir.path()).expect("open state machine");
    assert!(sm.range_cached(&get("a")).is_none(), "nothing is known before the first apply");

    sm.apply([entry(1, vec![put("a", "1"), put("b", "1")])]).await.expect("apply");
    sm.apply([entry(2, vec![put("a", "2"), Op::DeleteRange(DeleteRequest { key: "b".into(), ..Default::default() })])])
        .await
        .expect("apply");

    let db = sm.db();
    let snapshot = Reader::snapshot(&db);
    let revision = snapshot.revision().expect("revision");
    for key in ["a", "b"] {
        let (cached, at) = sm.range_cached(&get(key)).expect("written keys are cached");
        assert_eq!(at, revision, "{key}");
        assert_eq!(cached, snapshot.range(&get(key)).expect("range"), "{key}");
    }
    let (a, _) = sm.range_cached(&get("a")).expect("cached");
    assert_eq!((a.kvs[0].value.as_slice(), a.kvs[0].version, a.kvs[0].create_revision), (&b"2"[..], 2, 1));
    assert!(sm.range_cached(&get("b")).expect("cached").0.kvs.is_empty(), "a deleted key reads as absent");

    // Filters apply as in any range.
    let newer = RangeRequest { min_mod_revision: revision + 1, ..get("a") };
    assert_eq!(sm.range_cached(&newer).expect("cached").0.kvs.len(), 0);
    let count = RangeRequest { count_only: true, ..get("a") };
    assert_eq!(sm.range_cached(&count).expect("cached").0.count, 1);

    // What the cache cannot answer goes to RocksDB.
    assert!(sm.range_cached(&get("never")).is_none(), "a key never written here");
    assert!(sm.range_cached(&RangeRequest { revision: 2, ..get("a") }).is_none(), "an older revision");
    assert!(sm.range_cached(&RangeRequest { range_end: "b".into(), ..get("a") }).is_none(), "a range");
}

fn range(start: &str, end: &str) -> RangeRequest {
    RangeRequest { key: start.into(), range_end: end.into(), ..Default::default() }
}

/// Reads `req` from a RocksDB snapshot, as `Store::range_small` does on a
/// miss, and offers the answer to the cache.
fn read_and_remember(sm: &StateMachine, req: &RangeRequest) -> crate::types::RangeResult {
    let db = sm.db();
    let snapshot = Reader::snapshot(&db);
    let result = snapshot.range(req).expect("range");
    sm.remember_read(req, &result, snapshot.revision().expect("revision"));
    result
}

#[tokio::test]
async fn a_remembered_range_reads_as_a_snapshot_until_a_key_inside_it_changes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut sm = StateMachine::open(dir.path()).expect("open state machine");
    sm.apply([entry(1, vec![put("/q/a/1", "1"), put("/q/b/1", "1")])]).await.expect("apply");

    let a = range("/q/a/", "/q/a0");
    let empty = range("/q/c/", "/q/c0");
    assert!(sm.range_cached(&a).is_none(), "not read yet");
    let read = read_and_remember(&sm, &a);
    assert_eq!(read.kvs.len(), 1);
    read_and_remember(&sm, &empty);
    assert_eq!(sm.range_cached(&a).expect("kept").0, read);
    assert_eq!(sm.range_cached(&empty).expect("kept").0.count, 0, "an empty answer is kept too");

    // A write elsewhere moves the revision and keeps both answers.
    sm.apply([entry(2, vec![put("/q/b/2", "1")])]).await.expect("apply");
    let db = sm.db();
    let snapshot = Reader::snapshot(&db);
    let (cached, at) = sm.range_cached(&a).expect("still kept");
    assert_eq!(at, snapshot.revision().expect("revision"));
    assert_eq!(cached, snapshot.range(&a).expect("range"));
    drop(snapshot);
    drop(db);

    // A new key, an overwrite and a delete inside each drop the answer.
    sm.apply([entry(3, vec![put("/q/c/1", "1")])]).await.expect("apply");
    assert!(sm.range_cached(&empty).is_none(), "a new key inside");
    assert!(sm.range_cached(&a).is_some());
    sm.apply([entry(4, vec![put("/q/a/1", "2")])]).await.expect("apply");
    assert!(sm.range_cached(&a).is_none(), "an overwrite inside");
    let read = read_and_remember(&sm, &a);
    assert_eq!(read.kvs[0].value, b"2");
    sm.apply([entry(5, vec![Op::DeleteRange(DeleteRequest { key: "/q/a/1".into(), ..Default::default() })])])
        .await
        .expect("apply");
    assert!(sm.range_cached(&a).is_none(), "a delete inside");
    assert_eq!(read_and_remember(&sm, &a).kvs.len(), 0);
    assert_eq!(sm.range_cached(&a).expect("kept").0.kvs.len(), 0);

    // Only plain ranges at the current revision are kept or answered.
    let limited = RangeRequest { limit: 1, ..range("/q/b/", "/q/b0") };
    read_and_remember(&sm, &limited);
    assert!(sm.range_cached(&limited).is_none(), "a limited range");
    assert!(sm.range_cached(&range("/q/b/", "/q/b0")).is_none(), "nor its plain form");
    let keys_only = RangeRequest { keys_only: true, ..a.clone() };
    assert!(sm.range_cached(&keys_only).is_none(), "a projection of a kept range");
}

#[tokio::test]
async fn an_answer_read_before_the_last_apply_is_not_kept() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut sm = StateMachine::open(dir.path()).expect("open state machine");
    sm.apply([entry(1, vec![put("/q/a/1", "1")])]).await.expect("apply");
    let a = range("/q/a/", "/q/a0");
    let db = sm.db();
    let old = Reader::snapshot(&db);
    let (result, revision) = (old.range(&a).expect("range"), old.revision().expect("revision"));
    drop(old);
    drop(db);
    sm.apply([entry(2, vec![put("/q/a/2", "1")])]).await.expect("apply");
    sm.remember_read(&a, &result, revision);
    assert!(sm.range_cached(&a).is_none(), "the answer of an older revision");
    sm.remember_read(&get("/q/a/9"), &Default::default(), revision);
    assert!(sm.range_cached(&get("/q/a/9")).is_none(), "nor a key's");
}

#[tokio::test]
async fn a_key_read_from_rocksdb_is_answered_from_the_cache_next() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut sm = StateMachine::open(dir.path()).expect("open state machine");
    sm.apply([entry(1, vec![put("a", "1")])]).await.expect("apply");
    // Restart: the cache is empty, the key is in RocksDB only.
    drop(sm);
    let mut sm = StateMachine::open(dir.path()).expect("reopen state machine");
    sm.apply([entry(2, vec![put("b", "1")])]).await.expect("apply");
    assert!(sm.range_cached(&get("a")).is_none(), "not cached after a restart");
    let read = read_and_remember(&sm, &get("a"));
    assert_eq!(sm.range_cached(&get("a")).expect("kept").0, read);
    read_and_remember(&sm, &get("missing"));
    assert!(sm.range_cached(&get("missing")).expect("kept").0.kvs.is_empty(), "an absent key is kept as absent");
    sm.apply([entry(3, vec![put("missing", "now")])]).await.expect("apply");
    let (found, _) = sm.range_cached(&get("missing")).expect("written");
    assert_eq!(found.kvs[0].value, b"now");
}
