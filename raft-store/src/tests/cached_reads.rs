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
