//! Histories generated from a sequential model of the store (random
//! interleavings with real-time overlap, timeouts that did or did not take
//! effect, watchers with progress notifications and resumes) always pass,
//! arbitrary input never panics, and 2,000 ops over 10 keys stay in budget.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use skiff_checker::*;

/// splitmix64: a tiny deterministic generator driven by proptest's seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

struct Generated {
    history: Vec<Op>,
    watchers: Vec<WatchLog>,
    objects: Vec<ObjectWrite>,
    object_events: Vec<ResourceEvent>,
}

/// Runs `n` ops against a sequential store; each op takes effect at a strictly
/// increasing instant inside its [invoke, complete] window (indeterminate ones
/// at any instant after invocation, or never).
fn generate(seed: u64, n: usize, keys: u64, overlap: u64, faults: bool) -> Generated {
    let mut rng = Rng(seed);
    let mut store: BTreeMap<String, String> = BTreeMap::new();
    // The revision each key's current value was written at (its mod_revision).
    let mut written_at: BTreeMap<String, u64> = BTreeMap::new();
    let mut revision = 1u64;
    let mut history = Vec::new();
    // (key, value, revision, existed before) of every revision, in order.
    let mut changes: Vec<(String, Option<String>, u64, bool)> = Vec::new();
    let mut now = 1_000u64;
    for i in 0..n {
        now += 1 + rng.below(10);
        let key = format!("key-{}", rng.below(keys));
        let current = store.get(&key).cloned();
        let invoke_ns = now - rng.below(overlap.min(now));
        let mut complete_ns = Some(now + rng.below(overlap));
        let roll = rng.below(100);
        let kind = if roll < 40 {
            OpKind::Read
        } else if roll < 70 {
            OpKind::Write { value: format!("v{i}") }
        } else if roll < 90 {
            let expected = if rng.chance(60) { current.clone() } else { Some(format!("v{}", rng.below(i as u64 + 1))) };
            OpKind::Cas { expected, new: format!("v{i}") }
        } else {
            OpKind::Delete
        };
        let timed_out = faults && rng.chance(8);
        let rejected = faults && !timed_out && kind != OpKind::Read && rng.chance(4);
        let applies = !rejected && (!timed_out || rng.chance(50));
        let mut result = match &kind {
            OpKind::Read => Outcome::Read {
                value: current.clone(),
                revision,
                mod_revision: current.as_ref().map_or(0, |_| written_at[&key]),
            },
            OpKind::Cas { expected, .. } if *expected != current => Outcome::CasFailed,
            OpKind::Delete if current.is_none() => Outcome::Ok { revision },
            _ if !applies => Outcome::Failed,
            _ => {
                revision += 1;
                let value = match &kind {
                    OpKind::Write { value } | OpKind::Cas { new: value, .. } => Some(value.clone()),
                    _ => None,
                };
                match &value {
                    Some(v) => store.insert(key.clone(), v.clone()),
                    None => store.remove(&key),
                };
                written_at.insert(key.clone(), revision);
                changes.push((key.clone(), value, revision, current.is_some()));
                Outcome::Ok { revision }
            }
        };
        if timed_out {
            result = Outcome::Indeterminate;
            complete_ns = if rng.chance(50) { None } else { Some(invoke_ns + rng.below(2 * overlap + 1)) };
        } else if rejected {
            result = Outcome::Failed;
        }
        history.push(Op { client: rng.below(8), key, kind, invoke_ns, complete_ns, result });
    }

    // Watchers: everything from the start with progress notifications and
    // resumes; one key from the middle; a prefix "from now".
    let mut watchers = Vec::new();
    let ranges = [
        (KeyRange::Prefix { prefix: String::new() }, 1),
        (KeyRange::Key { key: "key-1".to_string() }, revision / 2),
        (KeyRange::Prefix { prefix: "key-2".to_string() }, 0),
    ];
    for (id, (range, start)) in ranges.into_iter().enumerate() {
        let mut entries = Vec::new();
        // A watch "from now" starts at a third of the run.
        let from = if start == 0 { revision / 3 } else { start };
        let mut last = from.saturating_sub(1);
        let mut progress_floor = 0;
        for (key, value, r, _) in &changes {
            if *r < from || !range.contains(key) {
                continue;
            }
            if rng.chance(5) {
                let at = last.max(progress_floor);
                progress_floor = at + rng.below(r - at);
                entries.push(WatchEntry::Progress { revision: progress_floor });
            }
            if rng.chance(5) {
                entries.push(WatchEntry::Resumed { start_revision: last + 1 });
            }
            entries.push(WatchEntry::Event(WatchEvent { key: key.clone(), value: value.clone(), revision: *r }));
            last = *r;
        }
        entries.push(WatchEntry::Progress { revision });
        watchers.push(WatchLog { watcher: id as u64, range, start_revision: start, entries });
    }

    let objects = changes
        .iter()
        .map(|(key, value, r, _)| ObjectWrite { name: key.clone(), resource_version: *r, deleted: value.is_none() })
        .collect();
    let mut object_events = Vec::new();
    for (key, value, r, existed) in &changes {
        let event_type = match (value, existed) {
            (None, _) => ResourceEventType::Deleted,
            (Some(_), false) => ResourceEventType::Added,
            (Some(_), true) => ResourceEventType::Modified,
        };
        if rng.chance(5) {
            object_events.push(ResourceEvent {
                event_type: ResourceEventType::Bookmark,
                name: String::new(),
                resource_version: r - 1,
            });
        }
        object_events.push(ResourceEvent { event_type, name: key.clone(), resource_version: *r });
    }
    Generated { history, watchers, objects, object_events }
}

fn assert_passes(g: &Generated, budget: &Budget) {
    let kv = check_kv(&g.history, budget).expect("generated histories are well formed");
    for (key, verdict) in &kv.verdicts {
        assert!(verdict.is_ok(), "{key}: {verdict:?}");
    }
    let writes = store_writes(&g.history);
    let watch = check_watches(&writes, &g.watchers).expect("well formed");
    assert!(watch.is_empty(), "{}", watch.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"));
    let resource = check_resource_watch(&g.objects, &g.object_events);
    assert!(resource.is_empty(), "{resource:?}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn histories_from_a_sequential_model_pass(
        seed in any::<u64>(), n in 1usize..300, keys in 1u64..6, overlap in 1u64..80, faults in any::<bool>(),
    ) {
        let g = generate(seed, n, keys, overlap, faults);
        assert_passes(&g, &Budget::default());
        let kv = check_kv(&without_revisions(&g.history), &Budget::default()).expect("well formed");
        prop_assert!(kv.is_ok(), "{:?}", kv.verdicts);
    }

    #[test]
    fn arbitrary_input_never_panics(seed in any::<u64>(), n in 0usize..60) {
        let mut rng = Rng(seed);
        let value = |rng: &mut Rng| (!rng.chance(20)).then(|| format!("v{}", rng.below(4)));
        let mut history = Vec::new();
        for _ in 0..n {
            let kind = match rng.below(4) {
                0 => OpKind::Read,
                1 => OpKind::Write { value: format!("v{}", rng.below(4)) },
                2 => OpKind::Cas { expected: value(&mut rng), new: format!("v{}", rng.below(4)) },
                _ => OpKind::Delete,
            };
            let result = match rng.below(5) {
                0 => Outcome::Read { value: value(&mut rng), revision: rng.below(8), mod_revision: rng.below(8) },
                1 => Outcome::Ok { revision: rng.below(8) },
                2 => Outcome::Failed,
                3 => Outcome::CasFailed,
                _ => Outcome::Indeterminate,
            };
            let invoke_ns = rng.below(100);
            let complete_ns = (!rng.chance(10)).then(|| rng.below(120));
            history.push(Op { client: rng.below(3), key: format!("k{}", rng.below(2)), kind, invoke_ns, complete_ns, result });
        }
        let budget = Budget { max_steps: 20_000, shrink_checks: 20, shrink_steps: 2_000, ..Budget::default() };
        let _ = check_kv(&history, &budget);
        let valid: Vec<Op> = history.iter().enumerate().filter(|(i, op)| op.validate(*i).is_ok()).map(|(_, op)| op.clone()).collect();
        let kv = check_kv(&valid, &budget).expect("only valid ops remain");
        for v in kv.violations() {
            prop_assert!(!v.history.is_empty() || v.kind != ViolationKind::Linearizability);
        }
        let writes = store_writes(&valid);
        let mut entries = Vec::new();
        for _ in 0..n {
            entries.push(match rng.below(3) {
                0 => WatchEntry::Event(WatchEvent { key: format!("k{}", rng.below(2)), value: value(&mut rng), revision: rng.below(9) }),
                1 => WatchEntry::Progress { revision: rng.below(9) },
                _ => WatchEntry::Resumed { start_revision: rng.below(9) },
            });
        }
        let log = WatchLog { watcher: 1, range: KeyRange::Range { start: "k0".into(), end: "k1".into() }, start_revision: rng.below(3), entries };
        let _ = check_watches(&writes, &[log]);
        let objects: Vec<ObjectWrite> = (0..n).map(|_| ObjectWrite { name: format!("o{}", rng.below(3)), resource_version: rng.below(9), deleted: rng.chance(30) }).collect();
        let events: Vec<ResourceEvent> = (0..n).map(|_| ResourceEvent { event_type: ResourceEventType::Modified, name: format!("o{}", rng.below(3)), resource_version: rng.below(9) }).collect();
        let _ = check_resource_watch(&objects, &events);
    }
}

/// The same history with revisions erased, so only the search can vouch for it.
fn without_revisions(history: &[Op]) -> Vec<Op> {
    let mut history = history.to_vec();
    for op in &mut history {
        match &mut op.result {
            Outcome::Ok { revision } => *revision = 0,
            Outcome::Read { revision, mod_revision, .. } => (*revision, *mod_revision) = (0, 0),
            _ => {}
        }
    }
    history
}

#[test]
fn two_thousand_ops_over_ten_keys_stay_within_budget() {
    let budget = Budget { max_time: Duration::from_secs(60), ..Budget::default() };
    for seed in 0..3 {
        // ~36 ops in flight at any time, ~8% timeouts.
        let g = generate(seed, 2_000, 10, 200, true);
        assert!(g.history.iter().filter(|op| op.is_indeterminate()).count() > 50);
        let started = Instant::now();
        assert_passes(&g, &budget);
        // Values alone are enough at this concurrency.
        let kv = check_kv(&without_revisions(&g.history), &budget).expect("well formed");
        assert!(kv.is_ok(), "seed {seed}: {:?}", kv.unknown());
        // With revisions, even ~180 ops in flight are quick.
        let crowded = generate(seed, 2_000, 10, 1_000, true);
        assert_passes(&crowded, &Budget { max_steps: 200_000, ..budget.clone() });
        let took = started.elapsed();
        assert!(took < Duration::from_secs(20), "seed {seed}: {took:?}");
    }
}

#[test]
fn a_mutated_model_history_is_caught() {
    // Lose one acknowledged write that a later read saw: every key's history
    // passes before, and the damaged key fails after.
    let mut caught = 0;
    for seed in 0..20 {
        let g = generate(seed, 300, 3, 30, false);
        let Some(victim) = g.history.iter().position(|op| {
            matches!(op.kind, OpKind::Write { .. })
                && matches!(op.result, Outcome::Ok { .. })
                && g.history.iter().any(|r| {
                    r.key == op.key
                        && matches!(&r.result, Outcome::Read { value: Some(v), .. } if Some(Some(v.as_str())) == op.written_value())
                })
        }) else {
            continue;
        };
        let mut damaged = g.history.clone();
        let lost = damaged.remove(victim);
        let kv = check_kv(&damaged, &Budget::default()).expect("well formed");
        let verdict = kv.verdicts.get(&lost.key).expect("key present");
        assert!(verdict.violation().is_some(), "seed {seed}: losing {} went unnoticed", lost.describe());
        // Without revisions the search alone must find it.
        let kv = check_kv(&without_revisions(&damaged), &Budget::default()).expect("well formed");
        let verdict = kv.verdicts.get(&lost.key).expect("key present");
        let Some(v) = verdict.violation() else {
            panic!("seed {seed}: search missed {}: {verdict:?}", lost.describe())
        };
        assert_eq!(v.kind, ViolationKind::Linearizability);
        assert!(v.history.len() <= 3, "seed {seed}: not shrunk: {v}");
        caught += 1;
    }
    assert!(caught >= 15, "only {caught} seeds had a victim");
}

#[test]
fn a_crowded_history_without_revisions_is_decided() {
    // Once exhausted 2M steps: ~14 ops in flight on one key, values only.
    let g = generate(2_074_874_544_947_594_088, 65, 1, 78, false);
    let kv = check_kv(&without_revisions(&g.history), &Budget::default()).expect("well formed");
    assert!(kv.is_ok(), "{:?}", kv.verdicts);
}
