//! Known-bad histories are reported (each with the guarantee it breaks), and
//! known-good ones pass.

use skiff_checker::*;

fn op(client: u64, kind: OpKind, t: (u64, Option<u64>), result: Outcome) -> Op {
    Op { client, key: "k".to_string(), kind, invoke_ns: t.0, complete_ns: t.1, result }
}

fn write(v: &str, invoke: u64, complete: u64, revision: u64) -> Op {
    op(1, OpKind::Write { value: v.to_string() }, (invoke, Some(complete)), Outcome::Ok { revision })
}

fn read(v: Option<&str>, invoke: u64, complete: u64, revision: u64) -> Op {
    op(
        2,
        OpKind::Read,
        (invoke, Some(complete)),
        Outcome::Read { value: v.map(str::to_string), revision, mod_revision: 0 },
    )
}

fn indeterminate_write(v: &str, invoke: u64) -> Op {
    op(3, OpKind::Write { value: v.to_string() }, (invoke, None), Outcome::Indeterminate)
}

fn verdict(history: &[Op]) -> Verdict {
    let kv = check_kv(history, &Budget::default()).expect("well formed");
    assert_eq!(kv.verdicts.len(), 1);
    kv.verdicts.into_values().next().expect("one key")
}

fn violation(history: &[Op]) -> Violation {
    match verdict(history) {
        Verdict::Violation(v) => v,
        other => panic!("expected a violation, got {other:?}"),
    }
}

/// Strips revisions so only the linearizability search can find the problem.
fn without_revisions(history: &[Op]) -> Vec<Op> {
    history
        .iter()
        .cloned()
        .map(|mut op| {
            op.result = match op.result {
                Outcome::Ok { .. } => Outcome::Ok { revision: 0 },
                Outcome::Read { value, .. } => Outcome::Read { value, revision: 0, mod_revision: 0 },
                other => other,
            };
            op
        })
        .collect()
}

#[test]
fn a_lost_acknowledged_write_is_reported() {
    // "a" is acknowledged, yet a later read finds the key absent.
    let history = vec![write("a", 0, 10, 2), read(None, 20, 30, 3)];
    let v = violation(&history);
    assert_eq!(v.kind, ViolationKind::StaleRead, "{v}");
    assert_eq!(v.history.len(), 2, "{v}");

    let v = violation(&without_revisions(&history));
    assert_eq!(v.kind, ViolationKind::Linearizability, "{v}");
    assert!(v.history.iter().any(|op| matches!(op.kind, OpKind::Write { .. })), "{v}");
}

#[test]
fn a_stale_read_is_reported() {
    let good = vec![write("a", 0, 10, 2), write("b", 20, 30, 3)];
    // Right revision, old value.
    let v = violation(&[good.clone(), vec![read(Some("a"), 40, 50, 3)]].concat());
    assert_eq!(v.kind, ViolationKind::StaleRead, "{v}");
    // Old revision: the read started after revision 3 was acknowledged.
    let v = violation(&[good.clone(), vec![read(Some("a"), 40, 50, 2)]].concat());
    assert_eq!(v.kind, ViolationKind::StaleRead, "{v}");
    // No revisions: the search finds it, and shrinks away the noise.
    let mut history = [good, vec![read(Some("a"), 40, 50, 0)]].concat();
    for i in 0..30 {
        history.push(read(Some("a"), 100 + 10 * i, 105 + 10 * i, 0));
    }
    let v = violation(&without_revisions(&history));
    assert_eq!(v.kind, ViolationKind::Linearizability, "{v}");
    assert_eq!(v.history.len(), 3, "{v}");
    assert!(v.explanation.contains("no linearization"), "{v}");
}

#[test]
fn revisions_that_contradict_real_time_are_reported() {
    let v = violation(&[write("a", 0, 10, 5), write("b", 20, 30, 4)]);
    assert_eq!(v.kind, ViolationKind::RevisionOrder, "{v}");
    let v = violation(&[write("a", 0, 10, 5), write("b", 5, 30, 5)]);
    assert_eq!(v.kind, ViolationKind::RevisionOrder, "{v}");
}

#[test]
fn a_read_that_misdates_its_value_is_reported() {
    let seen_at = |m: u64| {
        op(
            2,
            OpKind::Read,
            (20, Some(30)),
            Outcome::Read { value: Some("a".to_string()), revision: 5, mod_revision: m },
        )
    };
    let v = violation(&[write("a", 0, 10, 5), seen_at(4)]);
    assert_eq!(v.kind, ViolationKind::RevisionOrder, "{v}");
    assert!(v.explanation.contains("written at revision 4"), "{v}");
    assert!(verdict(&[write("a", 0, 10, 5), seen_at(5)]).is_ok());
}

#[test]
fn a_read_of_a_value_never_written_is_reported() {
    let v = violation(&[write("a", 0, 10, 2), read(Some("zzz"), 20, 30, 2)]);
    assert_eq!(v.kind, ViolationKind::StaleRead, "{v}");
    assert!(v.explanation.contains("no write produced"), "{v}");
}

#[test]
fn a_cas_that_ignored_its_compare_is_reported() {
    let cas = op(
        1,
        OpKind::Cas { expected: Some("x".to_string()), new: "b".to_string() },
        (20, Some(30)),
        Outcome::Ok { revision: 0 },
    );
    let v = violation(&without_revisions(&[write("a", 0, 10, 0), cas]));
    assert_eq!(v.kind, ViolationKind::Linearizability, "{v}");
    // With revisions the search orders the writes by them: the CAS at 4
    // follows "c" at 3, however the calls overlap. No read is involved, so
    // only the search can see it.
    let cas = op(
        1,
        OpKind::Cas { expected: Some("a".to_string()), new: "b".to_string() },
        (0, Some(100)),
        Outcome::Ok { revision: 4 },
    );
    let v = violation(&[
        write("a", 0, 100, 2),
        op(4, OpKind::Write { value: "c".into() }, (0, Some(100)), Outcome::Ok { revision: 3 }),
        cas,
    ]);
    assert_eq!(v.kind, ViolationKind::Linearizability, "{v}");
    assert!(v.explanation.contains("revision"), "{v}");
}

#[test]
fn concurrent_overlapping_ops_pass() {
    // Two writes overlap; reads during the overlap may see either, in one order.
    let history = vec![
        write("a", 0, 100, 2),
        op(4, OpKind::Write { value: "b".to_string() }, (10, Some(90)), Outcome::Ok { revision: 3 }),
        read(Some("a"), 20, 40, 2),
        read(Some("b"), 50, 120, 3),
        read(Some("b"), 130, 140, 3),
    ];
    assert!(verdict(&history).is_ok());
    assert!(verdict(&without_revisions(&history)).is_ok());
    // The same values in the other order contradict the first read.
    let mut swapped = without_revisions(&history);
    swapped[2] = read(Some("b"), 20, 40, 0);
    swapped[3] = read(Some("a"), 50, 120, 0);
    swapped[4] = read(Some("b"), 130, 140, 0);
    assert_eq!(violation(&swapped).kind, ViolationKind::Linearizability);
}

#[test]
fn indeterminate_writes_that_did_or_did_not_take_effect_pass() {
    // Took effect long after its caller gave up.
    let took_effect = vec![
        write("a", 0, 10, 2),
        indeterminate_write("b", 20),
        read(Some("a"), 30, 40, 2),
        read(Some("b"), 500, 510, 3),
    ];
    assert!(verdict(&took_effect).is_ok(), "{:?}", verdict(&took_effect));
    assert!(verdict(&without_revisions(&took_effect)).is_ok());
    // Never took effect.
    let never = vec![write("a", 0, 10, 2), indeterminate_write("b", 20), read(Some("a"), 500, 510, 2)];
    assert!(verdict(&never).is_ok());
    // But it cannot take effect before it was invoked.
    let too_early = vec![read(Some("b"), 0, 10, 0), indeterminate_write("b", 20)];
    assert_eq!(violation(&too_early).kind, ViolationKind::Linearizability);
    // And once seen, an overwritten value cannot come back.
    let flicker = vec![
        indeterminate_write("b", 0),
        read(Some("b"), 10, 20, 0),
        write("c", 30, 40, 0),
        read(Some("b"), 50, 60, 0),
    ];
    assert_eq!(violation(&flicker).kind, ViolationKind::Linearizability);
}

#[test]
fn cas_and_deletes_pass() {
    let cas = |expected: Option<&str>, new: &str, t: (u64, u64), result| {
        op(5, OpKind::Cas { expected: expected.map(str::to_string), new: new.to_string() }, (t.0, Some(t.1)), result)
    };
    let history = vec![
        cas(None, "a", (0, 10), Outcome::Ok { revision: 2 }),
        cas(None, "x", (20, 30), Outcome::CasFailed),
        cas(Some("a"), "b", (40, 50), Outcome::Ok { revision: 3 }),
        op(6, OpKind::Delete, (60, Some(70)), Outcome::Ok { revision: 4 }),
        // Deleting an absent key creates no revision.
        op(6, OpKind::Delete, (80, Some(90)), Outcome::Ok { revision: 4 }),
        read(None, 100, 110, 4),
        op(6, OpKind::Write { value: "f".to_string() }, (120, Some(130)), Outcome::Failed),
        read(None, 140, 150, 4),
    ];
    assert!(verdict(&history).is_ok(), "{:?}", verdict(&history));
    assert!(verdict(&without_revisions(&history)).is_ok());
}

#[test]
fn malformed_ops_are_errors_not_verdicts() {
    let backwards = read(None, 10, 5, 0);
    assert!(matches!(check_kv(&[backwards], &Budget::default()), Err(CheckerError::MalformedOp { .. })));
    let read_with_write_outcome = op(1, OpKind::Read, (0, Some(1)), Outcome::Ok { revision: 1 });
    assert!(check_kv(&[read_with_write_outcome], &Budget::default()).is_err());
    let unfinished = op(1, OpKind::Read, (0, None), Outcome::Read { value: None, revision: 1, mod_revision: 0 });
    assert!(check_kv(&[unfinished], &Budget::default()).is_err());
}

// ---- watches ----

fn put(key: &str, value: &str, revision: u64) -> StoreWrite {
    StoreWrite { key: key.to_string(), value: Some(value.to_string()), revision: Some(revision), acknowledged: true }
}

fn event(key: &str, value: &str, revision: u64) -> WatchEntry {
    WatchEntry::Event(WatchEvent { key: key.to_string(), value: Some(value.to_string()), revision })
}

fn watcher(entries: Vec<WatchEntry>) -> WatchLog {
    WatchLog { watcher: 7, range: KeyRange::Prefix { prefix: String::new() }, start_revision: 2, entries }
}

/// Revisions 2..=6 on keys a and b; revision 5 is one transaction on both.
fn writes() -> Vec<StoreWrite> {
    vec![
        put("a", "a1", 2),
        put("b", "b1", 3),
        put("a", "a2", 4),
        put("a", "a3", 5),
        put("b", "b2", 5),
        put("b", "b3", 6),
    ]
}

fn all_events() -> Vec<WatchEntry> {
    vec![
        event("a", "a1", 2),
        event("b", "b1", 3),
        event("a", "a2", 4),
        event("a", "a3", 5),
        event("b", "b2", 5),
        event("b", "b3", 6),
    ]
}

fn kinds(log: WatchLog) -> Vec<ViolationKind> {
    check_watches(&writes(), &[log]).expect("well formed").into_iter().map(|v| v.kind).collect()
}

#[test]
fn a_complete_watch_with_progress_and_a_resume_passes() {
    let mut entries = all_events();
    entries.insert(3, WatchEntry::Progress { revision: 4 });
    entries.insert(4, WatchEntry::Resumed { start_revision: 5 });
    entries.push(WatchEntry::Progress { revision: 6 });
    assert_eq!(kinds(watcher(entries)), vec![]);
    // A watcher on one key, from the middle.
    let log = WatchLog {
        watcher: 8,
        range: KeyRange::Key { key: "b".to_string() },
        start_revision: 4,
        entries: vec![event("b", "b2", 5), event("b", "b3", 6)],
    };
    assert_eq!(kinds(log), vec![]);
}

#[test]
fn a_watch_gap_is_reported() {
    let mut entries = all_events();
    entries.remove(2);
    assert_eq!(kinds(watcher(entries)), vec![ViolationKind::WatchReliable]);
}

#[test]
fn a_duplicated_watch_event_is_reported() {
    let mut entries = all_events();
    // Redelivered after a resume that started one revision too early.
    entries.insert(3, WatchEntry::Resumed { start_revision: 4 });
    entries.insert(4, event("a", "a2", 4));
    assert_eq!(kinds(watcher(entries)), vec![ViolationKind::WatchUnique]);
}

#[test]
fn out_of_order_events_are_reported() {
    let mut entries = all_events();
    entries.swap(1, 2);
    assert_eq!(kinds(watcher(entries)), vec![ViolationKind::WatchOrdered]);
}

#[test]
fn a_bookmark_ahead_of_delivery_is_reported() {
    let mut entries = all_events();
    entries.insert(2, WatchEntry::Progress { revision: 4 });
    assert_eq!(kinds(watcher(entries)), vec![ViolationKind::WatchBookmarkable]);
}

#[test]
fn a_split_revision_is_reported() {
    let mut entries = all_events();
    entries.remove(4);
    assert_eq!(kinds(watcher(entries)), vec![ViolationKind::WatchAtomic]);
}

#[test]
fn an_invented_event_is_reported() {
    let mut entries = all_events();
    entries.push(event("a", "never-written", 7));
    assert_eq!(kinds(watcher(entries)), vec![ViolationKind::WatchValid]);
    // A corrupted value at a real revision.
    let mut entries = all_events();
    entries[2] = event("a", "a2-corrupted", 4);
    assert_eq!(kinds(watcher(entries)), vec![ViolationKind::WatchValid]);
}

#[test]
fn a_resume_that_skips_revisions_is_reported() {
    let mut entries = all_events();
    entries.insert(2, WatchEntry::Resumed { start_revision: 5 });
    entries.remove(3);
    assert_eq!(kinds(watcher(entries)), vec![ViolationKind::WatchResumable]);
}

#[test]
fn indeterminate_writes_may_appear_in_watches_and_then_must_appear_everywhere() {
    let history = vec![
        write("a", 0, 10, 2),
        indeterminate_write("b", 20),
        op(1, OpKind::Write { value: "c".to_string() }, (30, Some(40)), Outcome::Ok { revision: 4 }),
    ];
    let writes = store_writes(&history);
    let k =
        |v: &str, r| WatchEntry::Event(WatchEvent { key: "k".to_string(), value: Some(v.to_string()), revision: r });
    let log = |id, entries| WatchLog {
        watcher: id,
        range: KeyRange::Key { key: "k".to_string() },
        start_revision: 1,
        entries,
    };
    let saw_it = log(1, vec![k("a", 2), k("b", 3), k("c", 4)]);
    assert_eq!(check_watches(&writes, std::slice::from_ref(&saw_it)).expect("ok"), vec![]);
    let missed_it = log(2, vec![k("a", 2), k("c", 4)]);
    assert_eq!(check_watches(&writes, std::slice::from_ref(&missed_it)).expect("ok"), vec![]);
    let both = check_watches(&writes, &[saw_it, missed_it]).expect("ok");
    assert_eq!(
        both.iter().map(|v| (v.kind, v.watcher)).collect::<Vec<_>>(),
        vec![(ViolationKind::WatchReliable, Some(2))]
    );
}

#[test]
fn an_acknowledged_write_without_revision_is_an_error() {
    let w = StoreWrite { key: "a".to_string(), value: None, revision: None, acknowledged: true };
    assert!(matches!(check_watches(&[w], &[]), Err(CheckerError::MalformedWrite { .. })));
}

// ---- resource watches ----

fn object(name: &str, resource_version: u64, deleted: bool) -> ObjectWrite {
    ObjectWrite { name: name.to_string(), resource_version, deleted }
}

fn rev(event_type: ResourceEventType, name: &str, resource_version: u64) -> ResourceEvent {
    ResourceEvent { event_type, name: name.to_string(), resource_version }
}

#[test]
fn resource_watches_are_checked() {
    use ResourceEventType::*;
    let writes =
        vec![object("p1", 10, false), object("p2", 11, false), object("p1", 12, false), object("p1", 13, true)];
    let good = vec![
        rev(Added, "p1", 10),
        rev(Added, "p2", 11),
        rev(Bookmark, "", 11),
        rev(Modified, "p1", 12),
        rev(Deleted, "p1", 13),
    ];
    assert_eq!(check_resource_watch(&writes, &good), vec![]);
    let kinds = |events: &[ResourceEvent]| {
        check_resource_watch(&writes, events).into_iter().map(|v| v.kind).collect::<Vec<_>>()
    };

    let mut missing = good.clone();
    missing.remove(3);
    assert_eq!(kinds(&missing), vec![ViolationKind::ResourceMissing]);
    let mut duplicated = good.clone();
    duplicated.insert(2, rev(Added, "p2", 11));
    assert_eq!(kinds(&duplicated), vec![ViolationKind::ResourceDuplicate]);
    let mut backwards = good.clone();
    backwards.swap(0, 1);
    assert_eq!(kinds(&backwards), vec![ViolationKind::ResourceVersionOrder]);
    let mut after_bookmark = good.clone();
    after_bookmark.swap(1, 2);
    assert_eq!(kinds(&after_bookmark), vec![ViolationKind::ResourceVersionOrder]);
    let mut wrong_type = good;
    wrong_type[4] = rev(Modified, "p1", 13);
    assert_eq!(kinds(&wrong_type), vec![ViolationKind::ResourceMismatch]);
}

// ---- report ----

#[test]
fn the_report_round_trips_through_json_and_summarizes() {
    let history = vec![write("a", 0, 10, 2), read(None, 20, 30, 3)];
    let faults = vec![
        Fault {
            kind: "kill".into(),
            target: "leader".into(),
            at_ns: 5,
            healed_at_ns: Some(25),
            leaderless_ms: Some(900),
        },
        Fault {
            kind: "partition".into(),
            target: "node-2".into(),
            at_ns: 7,
            healed_at_ns: None,
            leaderless_ms: Some(300),
        },
        Fault { kind: "pause".into(), target: "node-3".into(), at_ns: 9, healed_at_ns: Some(12), leaderless_ms: None },
    ];
    let mut report = Report::new(42, &history, faults);
    report.add_kv(&check_kv(&history, &Budget::default()).expect("well formed"));
    assert!(!report.passed());
    assert_eq!(report.failover_ms, Failover { samples: 2, p50_ms: Some(300), max_ms: Some(900) });
    assert_eq!(report.operations.total, 2);
    let json = report.to_json().expect("serializes");
    assert_eq!(Report::from_json(&json).expect("parses"), report);
    let summary = report.summary();
    assert!(summary.starts_with("FAIL (seed 42)"), "{summary}");
    assert!(summary.contains("StaleRead"), "{summary}");
    // Histories themselves round-trip too.
    let json = serde_json::to_string(&history).expect("serializes");
    assert_eq!(serde_json::from_str::<Vec<Op>>(&json).expect("parses"), history);
}
