//! The MVCC engine against a simple in-memory model: random sequences of
//! puts, deletes, transactions and compactions, with every read compared
//! at every revision still retained.

use std::collections::BTreeMap;

use crate::latest::LatestCache;
use crate::mvcc::{open_db, Applier, EventKind, Reader, RevisionEvents, COLUMN_FAMILIES};
use crate::types::{
    ApplyError, Command, Compare, CompareResult, CompareTarget, DeleteRequest, KeyValue, Op, Output, PutRequest,
    RangeRequest, RequestId, SortOrder, Txn,
};
use proptest::prelude::*;

/// The model: the full state at every revision.
#[derive(Default)]
struct Model {
    states: Vec<BTreeMap<Vec<u8>, KeyValue>>, // index = revision
    compacted: i64,
}

impl Model {
    fn new() -> Self {
        Model { states: vec![BTreeMap::new()], compacted: 0 }
    }
    fn revision(&self) -> i64 {
        self.states.len() as i64 - 1
    }
    fn current(&self) -> &BTreeMap<Vec<u8>, KeyValue> {
        self.states.last().unwrap()
    }
    /// Applies a txn's chosen ops to a copy; returns whether anything changed.
    fn apply(&mut self, txn: &Txn) -> Result<bool, ApplyError> {
        let cur = self.current().clone();
        let ok = txn.compare.iter().all(|c| {
            let kv = cur.get(&c.key);
            match &c.target {
                CompareTarget::Value(v) => kv.is_some_and(|kv| &kv.value == v),
                CompareTarget::Version(v) => kv.map_or(0, |kv| kv.version) == *v,
                _ => unreachable!(),
            }
        });
        let ops = if ok { &txn.success } else { &txn.failure };
        let rev = self.revision() + 1;
        let mut next = cur.clone();
        let mut changed = false;
        let mut touched = std::collections::BTreeSet::new();
        for op in ops {
            match op {
                Op::Put(p) => {
                    if !touched.insert(p.key.clone()) {
                        return Err(ApplyError::DuplicateKey);
                    }
                    let prev = next.get(&p.key);
                    let kv = KeyValue {
                        key: p.key.clone(),
                        create_revision: prev.map_or(rev, |k| k.create_revision),
                        mod_revision: rev,
                        version: prev.map_or(1, |k| k.version + 1),
                        value: p.value.clone(),
                        lease: 0,
                    };
                    next.insert(p.key.clone(), kv);
                    changed = true;
                }
                Op::DeleteRange(d) => {
                    let keys: Vec<_> =
                        next.keys().filter(|k| crate::mvcc::in_range(k, &d.key, &d.range_end)).cloned().collect();
                    for k in keys {
                        if touched.contains(&k) {
                            return Err(ApplyError::DuplicateKey);
                        }
                        next.remove(&k);
                        changed = true;
                    }
                }
                _ => unreachable!(),
            }
        }
        if changed {
            self.states.push(next);
        }
        Ok(changed)
    }
}

#[derive(Clone, Debug)]
enum Action {
    Put(u8, u8),
    Delete(u8, Option<u8>),
    CasPut { key: u8, expect_version: i64, value: u8 },
    Compact(u8),
}

fn key(k: u8) -> Vec<u8> {
    vec![b'k', k]
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        4 => (0u8..6, any::<u8>()).prop_map(|(k, v)| Action::Put(k, v)),
        2 => (0u8..6, proptest::option::of(0u8..7)).prop_map(|(k, e)| Action::Delete(k, e)),
        2 => (0u8..6, 0i64..3, any::<u8>()).prop_map(|(key, expect_version, value)| Action::CasPut { key, expect_version, value }),
        1 => any::<u8>().prop_map(Action::Compact),
    ]
}

fn to_txn(a: &Action) -> Txn {
    match a {
        Action::Put(k, v) => Txn {
            success: vec![Op::Put(PutRequest { key: key(*k), value: vec![*v], ..Default::default() })],
            ..Default::default()
        },
        Action::Delete(k, end) => Txn {
            success: vec![Op::DeleteRange(DeleteRequest {
                key: key(*k),
                range_end: end.map(key).unwrap_or_default(),
                prev_kv: false,
            })],
            ..Default::default()
        },
        Action::CasPut { key: k, expect_version, value } => Txn {
            compare: vec![Compare {
                result: CompareResult::Equal,
                target: CompareTarget::Version(*expect_version),
                key: key(*k),
                range_end: vec![],
            }],
            success: vec![Op::Put(PutRequest { key: key(*k), value: vec![*value], ..Default::default() })],
            failure: vec![Op::DeleteRange(DeleteRequest { key: key(*k), ..Default::default() })],
        },
        Action::Compact(_) => unreachable!(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn engine_reads_match_the_model_at_every_revision(
        actions in proptest::collection::vec(action(), 1..60),
        batch in 1usize..5,
        // The applier's cache of newest records: none, one that evicts all
        // the time, and one that holds everything.
        cache_bytes in proptest::sample::select(vec![0usize, 400, 1 << 20]),
        // Flush the memtables to tables after every this many batches (0:
        // never), so that reads also go through tables and their filters.
        flush_every in proptest::sample::select(vec![0usize, 1, 3]),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let db = open_db(dir.path()).unwrap();
        let mut model = Model::new();
        let mut cache = LatestCache::new(cache_bytes);
        let mut live_events: Vec<RevisionEvents> = Vec::new();
        for (i, chunk) in actions.chunks(batch).enumerate() {
            if flush_every > 0 && i % flush_every == 0 {
                for name in COLUMN_FAMILIES {
                    db.flush_cf(db.cf_handle(name).unwrap()).unwrap();
                }
            }
            // One chunk = one Raft entry's batch, committed together.
            let mut applier = Applier::new(&db, &cache).unwrap();
            for a in chunk {
                match a {
                    Action::Compact(r) => {
                        let target = (*r as i64) % (model.revision() + 2);
                        let got = applier.apply(RequestId::fresh(), &Command::Compact { revision: target }, 1).unwrap();
                        if target <= model.compacted {
                            prop_assert!(matches!(got, Err(ApplyError::Compacted { .. })), "{got:?}");
                        } else if target > model.revision() {
                            prop_assert!(matches!(got, Err(ApplyError::FutureRevision { .. })), "{got:?}");
                        } else {
                            prop_assert_eq!(got, Ok(Output::Compacted { revision: target }));
                            model.compacted = target;
                        }
                    }
                    other => {
                        let txn = to_txn(other);
                        let expected = model.apply(&txn);
                        let got = applier.apply(RequestId::fresh(), &Command::Txn(txn), 1).unwrap();
                        match (expected, got) {
                            (Ok(_), Ok(Output::Txn { revision, .. })) => prop_assert_eq!(revision, model.revision()),
                            (Err(e), Err(g)) => prop_assert_eq!(e, g),
                            (e, g) => prop_assert!(false, "model {e:?} engine {g:?}"),
                        }
                    }
                }
            }
            let written: Vec<_> = applier.latest_records().map(|(k, r)| (k.to_vec(), r.cloned())).collect();
            let (wb, events, _) = applier.finish();
            db.write(wb).unwrap();
            live_events.extend(events);
            for (k, r) in written {
                cache.insert(k, r);
            }
        }
        let reader = Reader::snapshot(&db);
        prop_assert_eq!(reader.revision().unwrap(), model.revision());
        for rev in 0..=model.revision() + 1 {
            let req = RangeRequest { key: vec![0], range_end: vec![0], revision: rev, ..Default::default() };
            let got = reader.range(&req);
            if rev > model.revision() {
                prop_assert!(got.is_err());
                continue;
            }
            if rev > 0 && rev < model.compacted {
                prop_assert!(got.is_err(), "read at compacted revision {} succeeded", rev);
                continue;
            }
            let at = if rev == 0 { model.revision() } else { rev };
            let expected: Vec<KeyValue> = model.states[at as usize].values().cloned().collect();
            let got = got.unwrap();
            prop_assert_eq!(got.count, expected.len() as i64);
            prop_assert_eq!(got.kvs, expected);
            // Single-key reads agree too.
            for k in 0u8..8 {
                let req = RangeRequest { key: key(k), revision: rev, ..Default::default() };
                let got = reader.range(&req).unwrap();
                let expected: Vec<KeyValue> = model.states[at as usize].get(&key(k)).cloned().into_iter().collect();
                prop_assert_eq!(got.kvs, expected);
            }
            // Sub-ranges, pages of them and a descending page agree too:
            // the count is of the whole range, the items of the page.
            for (a, b, limit, order) in [
                (1u8, 4u8, 0i64, SortOrder::None),
                (0, 8, 2, SortOrder::None),
                (2, 3, 1, SortOrder::None),
                (3, 8, 1, SortOrder::Ascend),
                (0, 8, 2, SortOrder::Descend),
            ] {
                let req = RangeRequest {
                    key: key(a),
                    range_end: key(b),
                    revision: rev,
                    limit,
                    sort_order: order,
                    ..Default::default()
                };
                let got = reader.range(&req).unwrap();
                let mut all: Vec<KeyValue> = model.states[at as usize].range(key(a)..key(b)).map(|(_, v)| v.clone()).collect();
                if order == SortOrder::Descend {
                    all.reverse();
                }
                prop_assert_eq!(got.count, all.len() as i64);
                let shown = if limit > 0 { all.len().min(limit as usize) } else { all.len() };
                prop_assert_eq!(&got.kvs[..], &all[..shown]);
                prop_assert_eq!(got.more, limit > 0 && all.len() as i64 > limit);
            }
        }
        // The events published live carry the model's new and previous
        // values (prev_kv comes from the applier's newest-record lookups).
        for r in &live_events {
            let before = &model.states[r.revision as usize - 1];
            let after = &model.states[r.revision as usize];
            for e in &r.events {
                prop_assert_eq!(e.prev_kv.as_ref(), before.get(&e.kv.key), "prev_kv at {}", r.revision);
                match e.kind {
                    EventKind::Put => prop_assert_eq!(Some(&e.kv), after.get(&e.kv.key)),
                    EventKind::Delete => prop_assert!(!after.contains_key(&e.kv.key)),
                }
            }
        }
        // Watch replay yields exactly the model's changes, revision by revision.
        let from = model.compacted.max(1);
        let revs = reader.revisions(from, model.revision(), usize::MAX).unwrap();
        prop_assert_eq!(revs.len() as i64, (model.revision() - from + 1).max(0));
        for r in &revs {
            let before = &model.states[r.revision as usize - 1];
            let after = &model.states[r.revision as usize];
            let changed = after.iter().filter(|(k, v)| before.get(*k) != Some(*v)).count()
                + before.keys().filter(|k| !after.contains_key(*k)).count();
            prop_assert_eq!(r.events.len(), changed);
            // Above the compaction point, replayed events carry their
            // prev_kv, so compaction kept every version they need.
            if r.revision > model.compacted {
                for e in &r.events {
                    prop_assert_eq!(e.prev_kv.as_ref(), before.get(&e.kv.key), "replayed prev_kv at {}", r.revision);
                }
            }
        }
    }
}

/// A range over keys with many versions (more than a scan steps through
/// before it seeks) and keys with one, read at every revision, whole and
/// in pages: each key shows its newest version at that revision, deleted
/// keys none, and a page is the first keys of the whole answer.
#[test]
fn ranges_over_keys_with_many_versions_show_the_newest_at_each_revision() {
    let dir = tempfile::tempdir().unwrap();
    let db = open_db(dir.path()).unwrap();
    let cache = LatestCache::new(0);
    let mut model = Model::new();
    let put = |k: u8, v: u8| Txn {
        success: vec![Op::Put(PutRequest { key: key(k), value: vec![v], ..Default::default() })],
        ..Default::default()
    };
    let delete = |k: u8| Txn {
        success: vec![Op::DeleteRange(DeleteRequest { key: key(k), ..Default::default() })],
        ..Default::default()
    };
    // Key 1 gets 30 versions, key 3 is deleted after 12, keys 0, 2 and 4 one each.
    let mut txns = vec![put(0, 0), put(2, 0), put(4, 0)];
    for v in 0..30u8 {
        txns.push(put(1, v));
        if v < 12 {
            txns.push(put(3, v));
        }
    }
    txns.push(delete(3));
    txns.push(put(1, 99));
    for (i, txn) in txns.iter().enumerate() {
        model.apply(txn).unwrap();
        let mut applier = Applier::new(&db, &cache).unwrap();
        let applied = applier.apply(RequestId::fresh(), &Command::Txn(txn.clone()), 1).unwrap();
        assert!(matches!(applied, Ok(Output::Txn { .. })), "{applied:?}");
        let (wb, _, _) = applier.finish();
        db.write(wb).unwrap();
        // Some versions in tables, some in the memtable.
        if i % 10 == 0 {
            for name in COLUMN_FAMILIES {
                db.flush_cf(db.cf_handle(name).unwrap()).unwrap();
            }
        }
    }
    let reader = Reader::snapshot(&db);
    for rev in 1..=model.revision() {
        let all: Vec<KeyValue> = model.states[rev as usize].values().cloned().collect();
        for limit in [0i64, 1, 2, 3, 10] {
            let req = RangeRequest { key: key(0), range_end: key(9), revision: rev, limit, ..Default::default() };
            let got = reader.range(&req).unwrap();
            let shown = if limit > 0 { all.len().min(limit as usize) } else { all.len() };
            assert_eq!(got.kvs, all[..shown], "revision {rev}, limit {limit}");
            assert_eq!(got.count, all.len() as i64, "revision {rev}");
            assert_eq!(got.more, shown < all.len(), "revision {rev}, limit {limit}");
        }
    }
}

#[test]
fn a_retried_request_id_is_applied_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = open_db(dir.path()).unwrap();
    let id = RequestId::fresh();
    let cmd = Command::Txn(Txn {
        success: vec![Op::Put(PutRequest { key: b"k".to_vec(), value: b"v".to_vec(), ..Default::default() })],
        ..Default::default()
    });
    let cache = LatestCache::new(0);
    let mut a = Applier::new(&db, &cache).unwrap();
    let first = a.apply(id, &cmd, 1).unwrap();
    let (wb, _, _) = a.finish();
    db.write(wb).unwrap();
    let mut a = Applier::new(&db, &cache).unwrap();
    let second = a.apply(id, &cmd, 2).unwrap();
    assert_eq!(first, second);
    let (wb, _, revision) = a.finish();
    db.write(wb).unwrap();
    assert_eq!(revision, 1, "the retry must not create a second revision");
}

#[test]
fn request_ids_are_forgotten_once_the_retention_has_passed() {
    use crate::mvcc::{DEDUP_EXPIRY_STEP_MS, DEDUP_RETENTION_MS};
    let dir = tempfile::tempdir().unwrap();
    let db = open_db(dir.path()).unwrap();
    let cache = LatestCache::new(0);
    let cmd = Command::Txn(Txn {
        success: vec![Op::Put(PutRequest { key: b"k".to_vec(), value: b"v".to_vec(), ..Default::default() })],
        ..Default::default()
    });
    let t0 = 1_000_000_000_000;
    let old = RequestId::at(t0, 7);
    let young = RequestId::at(t0 + DEDUP_EXPIRY_STEP_MS * 3, 8);
    // Applies `id` at leader time `now` as one batch (expiring at its end,
    // as the state machine does) and returns the store's revision after it.
    let apply = |id: RequestId, now: u64| {
        let mut a = Applier::new(&db, &cache).unwrap();
        a.apply(id, &cmd, now).unwrap().unwrap();
        a.expire_request_ids(now);
        let (wb, _, revision) = a.finish();
        db.write(wb).unwrap();
        revision
    };
    assert_eq!(apply(old, t0), 1);
    assert_eq!(apply(young, t0 + DEDUP_EXPIRY_STEP_MS * 3), 2);
    // Within the retention a retry is answered from memory.
    assert_eq!(apply(old, t0 + DEDUP_RETENTION_MS - 1), 2);
    // Past it (and a whole expiry step), a batch forgets the old id; a retry
    // after that is a new write, while the younger id is still remembered.
    let later = t0 + DEDUP_RETENTION_MS + DEDUP_EXPIRY_STEP_MS;
    assert_eq!(apply(young, later), 2);
    assert_eq!(apply(old, later + 1), 3);
    assert_eq!(apply(young, later + 2), 3);
}

#[test]
fn a_raised_nospace_alarm_refuses_only_what_adds_data_until_cleared() {
    use crate::types::{Alarm, AlarmKind};
    let dir = tempfile::tempdir().unwrap();
    let db = open_db(dir.path()).unwrap();
    let cache = LatestCache::new(0);
    // Applies `cmd` as one batch of its own.
    let apply = |cmd: Command| {
        let mut a = Applier::new(&db, &cache).unwrap();
        let result = a.apply(RequestId::fresh(), &cmd, 1).unwrap();
        let (wb, _, _) = a.finish();
        db.write(wb).unwrap();
        result
    };
    let one = |op: Op| Command::Txn(Txn { success: vec![op], ..Default::default() });
    let put = |k: &[u8]| one(Op::Put(PutRequest { key: k.to_vec(), value: b"v".to_vec(), ..Default::default() }));
    let delete = |k: &[u8]| one(Op::DeleteRange(DeleteRequest { key: k.to_vec(), ..Default::default() }));
    let alarm = Alarm { member: 2, kind: AlarmKind::NoSpace };

    apply(put(b"a")).unwrap();
    apply(put(b"b")).unwrap();
    assert_eq!(apply(Command::Alarm { alarm, raise: true }), Ok(Output::Alarm { changed: vec![alarm] }));
    assert_eq!(apply(Command::Alarm { alarm, raise: true }), Ok(Output::Alarm { changed: vec![] }));
    assert_eq!(Reader::live(&db).alarms().unwrap(), vec![alarm]);

    assert_eq!(apply(put(b"c")), Err(ApplyError::NoSpace));
    assert_eq!(apply(Command::LeaseGrant { id: 7, ttl_seconds: 60 }), Err(ApplyError::NoSpace));
    // What frees space passes: deletes, compaction, and a txn without puts.
    apply(delete(b"a")).unwrap();
    apply(Command::Compact { revision: 3 }).unwrap();
    let read_only = one(Op::Range(RangeRequest { key: b"b".to_vec(), ..Default::default() }));
    apply(read_only).unwrap();
    assert_eq!(Reader::live(&db).revision().unwrap(), 3, "the refused writes made no revision");

    assert_eq!(apply(Command::Alarm { alarm, raise: false }), Ok(Output::Alarm { changed: vec![alarm] }));
    assert_eq!(Reader::live(&db).alarms().unwrap(), vec![]);
    apply(put(b"c")).unwrap();
    assert_eq!(Reader::live(&db).revision().unwrap(), 4);
}

/// A revoked lease deletes its keys in one revision whose events carry the
/// deleted values, and leaves no attachment behind: a lease granted later
/// under the same id starts with no keys.
#[test]
fn revoking_a_lease_deletes_its_keys_with_their_previous_values_and_forgets_them() {
    let dir = tempfile::tempdir().unwrap();
    let db = open_db(dir.path()).unwrap();
    let cache = LatestCache::new(1 << 20);
    let apply = |cmd: Command| {
        let mut a = Applier::new(&db, &cache).unwrap();
        let result = a.apply(RequestId::fresh(), &cmd, 1).unwrap();
        let (wb, events, _) = a.finish();
        db.write(wb).unwrap();
        (result, events)
    };
    let put = |k: &[u8], lease: i64| {
        Command::Txn(Txn {
            success: vec![Op::Put(PutRequest { key: k.to_vec(), value: b"v".to_vec(), lease, ..Default::default() })],
            ..Default::default()
        })
    };
    apply(Command::LeaseGrant { id: 9, ttl_seconds: 60 }).0.unwrap();
    apply(put(b"a", 9)).0.unwrap();
    apply(put(b"b", 9)).0.unwrap();
    apply(put(b"c", 0)).0.unwrap();
    let (revoked, events) = apply(Command::LeaseRevoke { id: 9 });
    assert!(matches!(revoked, Ok(Output::LeaseRevoked { revision: 4 })), "{revoked:?}");
    let deleted: Vec<(EventKind, Vec<u8>, Option<Vec<u8>>)> = events
        .iter()
        .flat_map(|r| &r.events)
        .map(|e| (e.kind, e.kv.key.clone(), e.prev_kv.as_ref().map(|p| p.value.clone())))
        .collect();
    assert_eq!(
        deleted,
        [
            (EventKind::Delete, b"a".to_vec(), Some(b"v".to_vec())),
            (EventKind::Delete, b"b".to_vec(), Some(b"v".to_vec()))
        ]
    );
    let reader = Reader::live(&db);
    assert_eq!(reader.lease(9).unwrap(), None);
    assert!(reader.lease_keys(9).unwrap().is_empty(), "attachments left behind: {:?}", reader.lease_keys(9));
    drop(reader);
    apply(Command::LeaseGrant { id: 9, ttl_seconds: 60 }).0.unwrap();
    assert!(Reader::live(&db).lease_keys(9).unwrap().is_empty());
}

/// The auth store is replicated state of its own: changes make no revision,
/// never show in a range over the whole keyspace, and a refused change
/// writes nothing.
#[test]
fn auth_changes_make_no_revision_and_stay_out_of_the_keyspace() {
    use crate::auth::{AuthCommand, AuthError};
    let dir = tempfile::tempdir().unwrap();
    let db = open_db(dir.path()).unwrap();
    let cache = LatestCache::new(0);
    let apply = |cmds: &[Command]| {
        let mut a = Applier::new(&db, &cache).unwrap();
        let results: Vec<_> = cmds.iter().map(|c| a.apply(RequestId::fresh(), c, 1).unwrap()).collect();
        let changed = a.take_auth();
        let (wb, _, _) = a.finish();
        db.write(wb).unwrap();
        (results, changed)
    };
    let put = Command::Txn(Txn {
        success: vec![Op::Put(PutRequest { key: b"k".to_vec(), value: b"v".to_vec(), ..Default::default() })],
        ..Default::default()
    });
    let add = |name: &str| Command::Auth(AuthCommand::UserAdd { name: name.into(), password_hash: Some("h".into()) });

    let (results, changed) = apply(&[put, add("alice"), add("bob")]);
    assert_eq!(results[1..], [Ok(Output::Auth { revision: 1 }), Ok(Output::Auth { revision: 2 })]);
    assert_eq!(changed.map(|s| s.users.len()), Some(2), "one batch sees its own earlier changes");
    let reader = Reader::live(&db);
    assert_eq!(reader.revision().unwrap(), 1, "only the put made a revision");
    let everything = RangeRequest { key: vec![0], range_end: vec![0], ..Default::default() };
    let all = reader.range(&everything).unwrap();
    assert_eq!(all.kvs.iter().map(|kv| kv.key.clone()).collect::<Vec<_>>(), [b"k".to_vec()]);
    assert_eq!(reader.auth().unwrap().revision, 2);
    drop(reader);

    let (results, _) = apply(&[add("alice")]);
    assert_eq!(results, [Err(ApplyError::Auth(AuthError::UserAlreadyExist))]);
    assert_eq!(Reader::live(&db).auth().unwrap().revision, 2, "a refused change writes nothing");
}
