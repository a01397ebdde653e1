//! Linearizability of the KV register, per key.
//!
//! The search is Wing & Gong's, with Lowe's improvements as in porcupine: the
//! history becomes a list of call and return events sorted by time; the search
//! repeatedly tries to linearize a call that is still pending, lifting it (and
//! its return) out of the list, and backtracks when it meets a return whose
//! call could not be placed. Visited `(set of linearized ops, model state)`
//! pairs are memoized (the set as a 128-bit Zobrist hash), and a step and time [`Budget`] bounds the work.
//!
//! Revisions are evidence in the search too: the model's state is the
//! register's value plus the largest revision linearized so far, and an op
//! with a known revision may not go below it (a put or CAS, which creates its
//! revision, must go above it). A correct store's revisions follow its
//! linearization, so this prunes only orders that cannot have happened, and
//! it keeps the search near-linear on histories whose ops carry revisions
//! (reads must record the response header revision): an op with a known
//! revision is only tried when no pending op has a smaller one.
//!
//! A read-only op (a read or a failed compare) that can go next is
//! linearized without trying alternatives: it changes nothing, so if any
//! linearization exists, one exists with it placed there. Without revisions
//! (values only) the search stays exponential in the number of ops in
//! flight on one key; expect [`Verdict::Unknown`] beyond ~15.
//!
//! Indeterminate mutations return "at infinity": they may be linearized at
//! any point after their invocation or never. Unless a read saw the value
//! one wrote (values written by one op only), with its `mod_revision`: then
//! it took effect, at that revision, before the read returned, and is
//! checked as a completed mutation. Without this, each timed-out write that
//! someone read was placed by search alone, which after a chaos run's
//! leader kills (thousands of them per key) ran out of budget. Failed mutations and reads
//! without an answer carry no information and are dropped. A CAS whose
//! compare failed is a read that saw anything but `expected`.
//!
//! Search runs twice when it helps: first without the indeterminate
//! mutations whose value nobody observed (if that history is linearizable, so
//! is the full one), then, only if that fails, on everything.
//!
//! A violation is shrunk to a small history that fails by itself, using only
//! steps that preserve failure: cutting a suffix at a point where every kept
//! op has completed, dropping reads, and dropping a mutation whose value no
//! remaining op observes (when no failed compare remains).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::CheckerError;
use crate::history::{show, validate_history, Op, OpKind, Outcome};
use crate::revisions::check_revisions;
use crate::verdict::{Unknown, Verdict, Violation, ViolationKind};

/// How much work the checker may do before answering [`Verdict::Unknown`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budget {
    /// Search steps per key (per search pass).
    pub max_steps: u64,
    /// Wall-clock time for a whole [`check_kv`] (or [`check_key`]) call.
    pub max_time: Duration,
    /// How many re-checks shrinking a violation may run.
    pub shrink_checks: u32,
    /// Search steps per shrinking re-check.
    pub shrink_steps: u64,
}

impl Default for Budget {
    fn default() -> Self {
        Budget { max_steps: 2_000_000, max_time: Duration::from_secs(120), shrink_checks: 300, shrink_steps: 100_000 }
    }
}

/// The verdicts of a whole KV history, per key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvCheck {
    /// One verdict per key.
    pub verdicts: BTreeMap<String, Verdict>,
}

impl KvCheck {
    /// Whether every key was shown correct.
    pub fn is_ok(&self) -> bool {
        self.verdicts.values().all(Verdict::is_ok)
    }

    /// The violations found, by key.
    pub fn violations(&self) -> Vec<Violation> {
        self.verdicts.values().filter_map(Verdict::violation).cloned().collect()
    }

    /// The keys that could not be decided within the budget.
    pub fn unknown(&self) -> Vec<Unknown> {
        self.verdicts
            .iter()
            .filter_map(|(key, v)| match v {
                Verdict::Unknown { reason } => Some(Unknown { key: key.clone(), reason: reason.clone() }),
                _ => None,
            })
            .collect()
    }
}

/// Checks a whole history: each key's ops for revision evidence, then for
/// linearizability. Errors only on malformed records.
pub fn check_kv(history: &[Op], budget: &Budget) -> Result<KvCheck, CheckerError> {
    validate_history(history)?;
    let deadline = Instant::now() + budget.max_time;
    let mut keys: BTreeMap<&str, Vec<Op>> = BTreeMap::new();
    for op in history {
        keys.entry(op.key.as_str()).or_default().push(op.clone());
    }
    let verdicts =
        keys.into_iter().map(|(key, ops)| (key.to_string(), check_ops(key, ops, budget, deadline))).collect();
    Ok(KvCheck { verdicts })
}

/// Checks one key's ops (ops on other keys are ignored).
pub fn check_key(key: &str, ops: &[Op], budget: &Budget) -> Result<Verdict, CheckerError> {
    validate_history(ops)?;
    let ops = ops.iter().filter(|op| op.key == key).cloned().collect();
    Ok(check_ops(key, ops, budget, Instant::now() + budget.max_time))
}

fn check_ops(key: &str, ops: Vec<Op>, budget: &Budget, deadline: Instant) -> Verdict {
    if let Some(v) = check_revisions(key, &ops).into_iter().next() {
        return Verdict::Violation(v);
    }
    match linearizable(&ops, budget.max_steps, deadline) {
        Search::Ok => Verdict::Ok,
        Search::Unknown(reason) => Verdict::Unknown { reason },
        Search::Violation(_) => {
            let minimal = shrink(ops, budget, deadline);
            let explanation = match linearizable(&minimal, budget.max_steps, deadline) {
                Search::Violation(failure) => failure.explain(key, &minimal),
                _ => format!("the {} operations on {key:?} admit no linearization", minimal.len()),
            };
            Verdict::Violation(Violation::new(ViolationKind::Linearizability, key, explanation).with_history(minimal))
        }
    }
}

/// What an op does to the register; values are interned (`0` is "absent").
#[derive(Clone, Copy, Debug)]
enum Step {
    Read(u32),
    Write(u32),
    Cas(u32, u32),
    CasFailed(u32),
}

/// The register as the search tracks it: its value, and the largest revision
/// any op linearized so far carried.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct State {
    value: u32,
    revision: u64,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    step: Step,
    /// The op's revision (`0`: unknown).
    revision: u64,
    /// Whether the op creates its revision (a put or CAS that took effect):
    /// it must then exceed every revision linearized before it.
    strict: bool,
    call: u64,
    /// `u64::MAX` for indeterminate ops.
    ret: u64,
    optional: bool,
    /// Index of the op in the checked slice.
    op: usize,
}

impl Entry {
    /// The state after this op, if it can take effect in `s`. Revisions must
    /// follow the linearization: reads and deletes (which may reuse the
    /// current revision) never go below the last one, writes go above it.
    fn apply(&self, s: State) -> Option<State> {
        let value = match self.step {
            Step::Read(v) => (s.value == v).then_some(v)?,
            Step::Write(v) => v,
            Step::Cas(expected, new) => (s.value == expected).then_some(new)?,
            Step::CasFailed(expected) => (s.value != expected).then_some(s.value)?,
        };
        let r = self.revision;
        if r == 0 {
            return Some(State { value, revision: s.revision });
        }
        let ordered = if self.strict { r > s.revision } else { r >= s.revision };
        ordered.then_some(State { value, revision: r })
    }
}

#[derive(Default)]
struct Interner {
    ids: HashMap<String, u32>,
    names: Vec<String>,
}

impl Interner {
    fn id(&mut self, value: Option<&str>) -> u32 {
        let Some(value) = value else { return 0 };
        if let Some(&id) = self.ids.get(value) {
            return id;
        }
        self.names.push(value.to_string());
        let id = u32::try_from(self.names.len()).unwrap_or(u32::MAX);
        self.ids.insert(value.to_string(), id);
        id
    }

    fn name(&self, id: u32) -> Option<String> {
        let index = usize::try_from(id).ok()?.checked_sub(1)?;
        self.names.get(index).cloned()
    }
}

/// What reads tell about the write of a value that only one op writes: the
/// value's `mod_revision` and the earliest completion of a read that saw it.
struct Sighting {
    mod_revision: u64,
    first_seen: u64,
}

/// Sightings of every value written by exactly one op of `ops`, seen by a
/// completed read that recorded its `mod_revision`, all such reads agreeing.
fn sightings(ops: &[Op]) -> HashMap<&str, Sighting> {
    let mut writers: HashMap<&str, usize> = HashMap::new();
    for op in ops {
        if let Some(Some(v)) = op.written_value() {
            *writers.entry(v).or_default() += 1;
        }
    }
    let mut seen: HashMap<&str, Option<Sighting>> = HashMap::new();
    for op in ops {
        let (Outcome::Read { value: Some(v), mod_revision: m @ 1.., .. }, Some(done)) = (&op.result, op.complete_ns)
        else {
            continue;
        };
        if writers.get(v.as_str()) != Some(&1) {
            continue;
        }
        let entry = seen.entry(v.as_str()).or_insert(Some(Sighting { mod_revision: *m, first_seen: done }));
        match entry {
            Some(s) if s.mod_revision == *m => s.first_seen = s.first_seen.min(done),
            // Reads disagree on when it was written: no evidence from them.
            _ => *entry = None,
        }
    }
    seen.into_iter().filter_map(|(v, s)| Some((v, s?))).collect()
}

/// The search's entries for `ops`, the value ids the ops observe, and the interner.
///
/// An indeterminate mutation whose value (written by it alone) a read saw
/// did take effect, at that value's `mod_revision`, before that read
/// returned: it becomes a mutation with that revision and return time. A
/// history whose writes all time out is then checked as fast as one whose
/// writes all succeed, instead of leaving the search to place each one.
fn prepare(ops: &[Op]) -> (Vec<Entry>, HashSet<u32>, Interner) {
    let mut interner = Interner::default();
    let mut entries = Vec::new();
    let mut observed = HashSet::new();
    let sightings = sightings(ops);
    for (i, op) in ops.iter().enumerate() {
        let sighting = match (&op.result, op.written_value()) {
            (Outcome::Indeterminate, Some(Some(v))) => sightings.get(v),
            _ => None,
        };
        let optional = op.is_indeterminate() && sighting.is_none();
        let step = match (&op.kind, &op.result) {
            (_, Outcome::Failed) => continue,
            (OpKind::Read, Outcome::Read { value, .. }) => {
                let v = interner.id(value.as_deref());
                observed.insert(v);
                Step::Read(v)
            }
            (OpKind::Read, _) => continue,
            (OpKind::Write { value }, _) => Step::Write(interner.id(Some(value))),
            (OpKind::Delete, _) => Step::Write(0),
            (OpKind::Cas { expected, .. }, Outcome::CasFailed) => Step::CasFailed(interner.id(expected.as_deref())),
            (OpKind::Cas { expected, new }, _) => {
                let e = interner.id(expected.as_deref());
                observed.insert(e);
                Step::Cas(e, interner.id(Some(new)))
            }
        };
        let ret = match sighting {
            // A read that returned before the write was invoked leaves no
            // order for the two: the search reports it.
            Some(s) => s.first_seen.max(op.invoke_ns),
            None if optional => u64::MAX,
            None => op.complete_ns.unwrap_or(u64::MAX),
        };
        let revision = sighting.map_or(op.revision().unwrap_or(0), |s| s.mod_revision);
        let strict = matches!(op.kind, OpKind::Write { .. } | OpKind::Cas { .. });
        entries.push(Entry { step, revision, strict, call: op.invoke_ns, ret, optional, op: i });
    }
    (entries, observed, interner)
}

/// Why a history has no linearization: the longest valid prefix found.
#[derive(Clone, Debug)]
struct Failure {
    /// Ops (indices into the checked slice) of the deepest partial linearization.
    deepest: Vec<usize>,
    /// The state after it (the value interned; resolved by [`linearizable`]).
    state: State,
    /// The value after it.
    value: Option<String>,
    /// The op whose return forced backtracking from there.
    stuck: Option<usize>,
}

impl Failure {
    fn explain(&self, key: &str, ops: &[Op]) -> String {
        let mut s = format!(
            "the {} operations on {key:?} admit no linearization: the longest order consistent with real time and \
             register semantics places {} of them",
            ops.len(),
            self.deepest.len()
        );
        if let Some(last) = self.deepest.last().and_then(|&i| ops.get(i)) {
            s.push_str(&format!(" (ending with {})", last.describe()));
        }
        s.push_str(&format!(", leaving the value {}", show(self.value.as_deref())));
        if self.state.revision > 0 {
            s.push_str(&format!(" at revision {}", self.state.revision));
        }
        if let Some(stuck) = self.stuck.and_then(|i| ops.get(i)) {
            s.push_str(&format!("; then {} cannot take effect before it returned", stuck.describe()));
        }
        s
    }
}

enum Search {
    Ok,
    Violation(Failure),
    Unknown(String),
}

/// The two-pass search described in the module docs.
fn linearizable(ops: &[Op], max_steps: u64, deadline: Instant) -> Search {
    let (entries, observed, interner) = prepare(ops);
    let pruned: Vec<Entry> = entries
        .iter()
        .filter(|e| {
            !e.optional
                || match e.step {
                    Step::Write(v) | Step::Cas(_, v) => observed.contains(&v),
                    Step::Read(_) | Step::CasFailed(_) => true,
                }
        })
        .copied()
        .collect();
    if pruned.len() < entries.len() {
        if let Search::Ok = search(&pruned, max_steps, deadline) {
            return Search::Ok;
        }
    }
    match search(&entries, max_steps, deadline) {
        Search::Violation(mut failure) => {
            failure.value = interner.name(failure.state.value);
            Search::Violation(failure)
        }
        other => other,
    }
}

const NIL: usize = usize::MAX;

/// One linearized op on the search stack.
struct Frame {
    /// Its call node.
    node: usize,
    /// The state before it.
    state: State,
    /// Linearized by the read-only reduction: its node has no alternatives.
    forced: bool,
}

/// The search's state: the event list, the current partial linearization and the memo.
struct Searcher<'a> {
    entries: &'a [Entry],
    /// Events sorted by time: (time, is_return, entry).
    events: Vec<(u64, bool, usize)>,
    next: Vec<usize>,
    prev: Vec<usize>,
    /// A call node's return node.
    partner: Vec<usize>,
    head: usize,
    pending: PendingRevisions,
    /// Zobrist keys, one per entry.
    keys: Vec<u128>,
    linearized: u128,
    cache: HashSet<(u128, State)>,
    stack: Vec<Frame>,
    state: State,
    failure: Failure,
}

impl<'a> Searcher<'a> {
    fn new(entries: &'a [Entry]) -> Self {
        let n = entries.len();
        // Nodes 0..2n are events sorted by time (calls before returns at equal times); 2n is the head.
        let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(2 * n);
        for (i, e) in entries.iter().enumerate() {
            events.push((e.call, false, i));
            events.push((e.ret, true, i));
        }
        events.sort_unstable();
        let head = 2 * n;
        let mut next = vec![NIL; 2 * n + 1];
        let mut prev = vec![NIL; 2 * n + 1];
        let mut partner = vec![NIL; 2 * n];
        let mut call_node = vec![NIL; n];
        let mut last = head;
        for (node, &(_, is_return, entry)) in events.iter().enumerate() {
            next[last] = node;
            prev[node] = last;
            last = node;
            if is_return {
                partner[call_node[entry]] = node;
            } else {
                call_node[entry] = node;
            }
        }
        let mut pending = PendingRevisions::default();
        for e in entries {
            pending.add(e);
        }
        // The set of linearized ops, as a Zobrist hash: XOR of a random 128-bit
        // key per op. Distinct sets collide with probability ~2^-128 per pair.
        let keys = (0..n as u64).map(|i| u128::from(mix(2 * i)) << 64 | u128::from(mix(2 * i + 1))).collect();
        let state = State::default();
        Searcher {
            entries,
            events,
            next,
            prev,
            partner,
            head,
            pending,
            keys,
            linearized: 0,
            cache: HashSet::new(),
            stack: Vec::new(),
            state,
            failure: Failure { deepest: Vec::new(), state, value: None, stuck: None },
        }
    }

    /// The state after the op of call `node`, if it can go next.
    fn can_go(&mut self, node: usize) -> Option<State> {
        let entry = &self.entries[self.events[node].2];
        self.pending.remove(entry);
        let after = entry.apply(self.state).filter(|_| self.pending.allows(entry));
        self.pending.add(entry);
        after
    }

    /// Linearizes the op of call `node`, unless that state was visited before.
    fn push(&mut self, node: usize, after: State, forced: bool) -> bool {
        let e = self.events[node].2;
        if !self.cache.insert((self.linearized ^ self.keys[e], after)) {
            return false;
        }
        self.linearized ^= self.keys[e];
        self.pending.remove(&self.entries[e]);
        self.stack.push(Frame { node, state: self.state, forced });
        self.state = after;
        // Lift the call and its return out of the list.
        for x in [node, self.partner[node]] {
            self.next[self.prev[x]] = self.next[x];
            if self.next[x] != NIL {
                self.prev[self.next[x]] = self.prev[x];
            }
        }
        if self.stack.len() > self.failure.deepest.len() {
            self.failure.deepest = self.stack.iter().map(|f| self.entries[self.events[f.node].2].op).collect();
            self.failure.stuck = None;
            self.failure.state = self.state;
        }
        true
    }

    /// Undoes linearizations up to the last one that has alternatives, and
    /// returns the node to try next (`None`: no linearization exists).
    fn backtrack(&mut self) -> Option<usize> {
        loop {
            let frame = self.stack.pop()?;
            let e = self.events[frame.node].2;
            self.state = frame.state;
            self.linearized ^= self.keys[e];
            self.pending.add(&self.entries[e]);
            // Unlift: the return first, then the call.
            for x in [self.partner[frame.node], frame.node] {
                self.next[self.prev[x]] = x;
                if self.next[x] != NIL {
                    self.prev[self.next[x]] = x;
                }
            }
            if !frame.forced {
                return Some(self.next[frame.node]);
            }
        }
    }

    /// A read-only op (a read, or a failed compare) that can go now, with the state after it.
    fn read_only_candidate(&mut self, steps: &mut u64) -> Option<(usize, State)> {
        let mut node = self.next[self.head];
        while node != NIL && !self.events[node].1 {
            *steps += 1;
            let entry = &self.entries[self.events[node].2];
            if matches!(entry.step, Step::Read(_) | Step::CasFailed(_)) {
                if let Some(after) = self.can_go(node) {
                    return Some((node, after));
                }
            }
            node = self.next[node];
        }
        None
    }

    fn run(mut self, max_steps: u64, deadline: Instant) -> Search {
        let mut cur = self.next[self.head];
        let mut fresh = true;
        let mut steps = 0u64;
        while cur != NIL {
            steps += 1;
            if steps > max_steps {
                let depth = self.stack.len();
                return Search::Unknown(format!("step budget of {max_steps} exhausted after {depth} ops"));
            }
            if steps.is_multiple_of(1024) && Instant::now() > deadline {
                return Search::Unknown("time budget exhausted".to_string());
            }
            if fresh {
                fresh = false;
                // Reduction: a read-only op that can go now may as well go
                // now (it changes nothing and no pending op must precede
                // it), so it is linearized without trying alternatives.
                if let Some((node, after)) = self.read_only_candidate(&mut steps) {
                    if self.push(node, after, true) {
                        cur = self.next[self.head];
                        fresh = true;
                    } else {
                        // Visited before, and it failed then.
                        match self.backtrack() {
                            Some(n) => cur = n,
                            None => return Search::Violation(self.failure),
                        }
                    }
                    continue;
                }
            }
            let (_, is_return, e) = self.events[cur];
            if !is_return {
                if let Some(after) = self.can_go(cur) {
                    if self.push(cur, after, false) {
                        cur = self.next[self.head];
                        fresh = true;
                        continue;
                    }
                }
                cur = self.next[cur];
            } else {
                let entry = &self.entries[e];
                if entry.optional {
                    // Only indeterminate ops remain: they need never take effect.
                    return Search::Ok;
                }
                if self.stack.len() == self.failure.deepest.len() && self.failure.stuck.is_none() {
                    self.failure.stuck = Some(entry.op);
                }
                match self.backtrack() {
                    Some(n) => cur = n,
                    None => return Search::Violation(self.failure),
                }
            }
        }
        Search::Ok
    }
}

/// The porcupine-style search over `entries`.
fn search(entries: &[Entry], max_steps: u64, deadline: Instant) -> Search {
    Searcher::new(entries).run(max_steps, deadline)
}

/// splitmix64's output function: a fixed pseudo-random key per index.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The revisions of the ops not linearized yet. An op with a known revision
/// may only be linearized if no pending op must precede it: the model forces
/// known revisions into order, so a pending smaller one could never be placed
/// afterwards. Checking it up front keeps the search from exploring orders
/// that are doomed.
#[derive(Default)]
struct PendingRevisions {
    strict: BTreeMap<u64, u32>,
    loose: BTreeMap<u64, u32>,
}

impl PendingRevisions {
    fn side(&mut self, e: &Entry) -> &mut BTreeMap<u64, u32> {
        if e.strict {
            &mut self.strict
        } else {
            &mut self.loose
        }
    }

    fn add(&mut self, e: &Entry) {
        if e.revision > 0 {
            *self.side(e).entry(e.revision).or_default() += 1;
        }
    }

    fn remove(&mut self, e: &Entry) {
        if e.revision == 0 {
            return;
        }
        let side = self.side(e);
        if let Some(count) = side.get_mut(&e.revision) {
            *count -= 1;
            if *count == 0 {
                side.remove(&e.revision);
            }
        }
    }

    /// Whether `e` (already removed) may go before every pending op.
    fn allows(&self, e: &Entry) -> bool {
        let r = e.revision;
        r == 0 || (self.strict.keys().next().is_none_or(|&m| m > r) && self.loose.keys().next().is_none_or(|&m| m >= r))
    }
}

/// Shrinks a failing history to a smaller one that still fails (see module docs).
fn shrink(ops: Vec<Op>, budget: &Budget, deadline: Instant) -> Vec<Op> {
    let mut checks = budget.shrink_checks;
    let mut fails = |candidate: &[Op]| {
        if checks == 0 || Instant::now() > deadline {
            return false;
        }
        checks -= 1;
        matches!(linearizable(candidate, budget.shrink_steps, deadline), Search::Violation(_))
    };
    // Ops that the search ignores go first.
    let mut ops: Vec<Op> = ops
        .into_iter()
        .filter(|op| match (&op.kind, &op.result) {
            (_, Outcome::Failed) => false,
            (OpKind::Read, result) => matches!(result, Outcome::Read { .. }),
            _ => true,
        })
        .collect();
    ops.sort_by_key(|op| op.invoke_ns);

    // Cut a suffix: a prefix is a valid cut when every kept op that completes
    // does so before the first dropped op is invoked. Failing is monotone in
    // the cut, so binary search the shortest failing one.
    let mut cuts = Vec::new();
    let mut max_complete = 0u64;
    for (i, op) in ops.iter().enumerate() {
        if i > 0 && max_complete < op.invoke_ns {
            cuts.push(i);
        }
        if !op.is_indeterminate() {
            max_complete = max_complete.max(op.complete_ns.unwrap_or(0));
        }
    }
    let (mut lo, mut hi) = (0, cuts.len());
    while lo < hi {
        let mid = (lo + hi) / 2;
        let cut = cuts[mid];
        if fails(&ops[..cut]) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    if let Some(&cut) = cuts.get(lo) {
        ops.truncate(cut);
    }

    // Drop single ops while the rest still fails: observations first, then
    // mutations nobody observes.
    loop {
        let before = ops.len();
        for pass_mutations in [false, true] {
            let mut i = ops.len();
            while i > 0 {
                i -= 1;
                let op = &ops[i];
                let removable = if op.is_mutation() && !matches!(op.result, Outcome::CasFailed) {
                    pass_mutations && unobserved(op, &ops)
                } else {
                    !pass_mutations
                };
                if !removable {
                    continue;
                }
                let mut candidate = ops.clone();
                candidate.remove(i);
                if fails(&candidate) {
                    ops = candidate;
                }
            }
        }
        if ops.len() == before {
            break;
        }
    }
    ops
}

/// Whether removing mutation `op` keeps a failing history failing: nothing
/// else observes the value it writes, and no failed compare remains.
fn unobserved(op: &Op, ops: &[Op]) -> bool {
    let Some(written) = op.written_value() else { return false };
    !ops.iter().any(|other| {
        !std::ptr::eq(other, op)
            && match (&other.kind, &other.result) {
                (_, Outcome::CasFailed) => true,
                (OpKind::Read, Outcome::Read { value, .. }) => value.as_deref() == written,
                (OpKind::Cas { expected, .. }, _) => expected.as_deref() == written,
                _ => false,
            }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(client: u64, kind: OpKind, invoke_ns: u64, complete_ns: Option<u64>, result: Outcome) -> Op {
        Op { client, key: "k".to_string(), kind, invoke_ns, complete_ns, result }
    }

    fn write(v: &str, t: (u64, u64)) -> Op {
        op(1, OpKind::Write { value: v.to_string() }, t.0, Some(t.1), Outcome::Ok { revision: 0 })
    }

    fn read(v: Option<&str>, t: (u64, u64)) -> Op {
        op(
            2,
            OpKind::Read,
            t.0,
            Some(t.1),
            Outcome::Read { value: v.map(str::to_string), revision: 0, mod_revision: 0 },
        )
    }

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    #[test]
    fn a_sequential_history_is_linearizable() {
        let ops = vec![write("a", (0, 1)), read(Some("a"), (2, 3)), write("b", (4, 5)), read(Some("b"), (6, 7))];
        assert!(matches!(linearizable(&ops, 1000, far()), Search::Ok));
    }

    #[test]
    fn shrinking_keeps_the_contradiction() {
        let mut ops = vec![write("a", (0, 1)), write("b", (2, 3)), read(Some("a"), (4, 5))];
        for i in 0..20 {
            ops.push(read(Some("a"), (10 + 2 * i, 11 + 2 * i)));
        }
        assert!(matches!(linearizable(&ops, 10_000, far()), Search::Violation(_)));
        let minimal = shrink(ops, &Budget::default(), far());
        assert_eq!(minimal.len(), 3, "{minimal:#?}");
    }

    fn timed_out_write(v: &str, invoke: u64) -> Op {
        op(3, OpKind::Write { value: v.to_string() }, invoke, None, Outcome::Indeterminate)
    }

    fn read_at(v: &str, t: (u64, u64), revision: u64, mod_revision: u64) -> Op {
        op(2, OpKind::Read, t.0, Some(t.1), Outcome::Read { value: Some(v.to_string()), revision, mod_revision })
    }

    /// 40 writes that all time out, then reads that see each of them in
    /// turn, last sent first: with the values' mod_revisions each write has
    /// its place, without them the search must try orders.
    #[test]
    fn reads_place_timed_out_writes_by_mod_revision() {
        let writes = (0..40).map(|i| timed_out_write(&format!("v{i}"), 0));
        let reads = |mod_revisions: bool| {
            (0..40u64).map(move |i| {
                let m = if mod_revisions { i + 1 } else { 0 };
                read_at(&format!("v{}", 39 - i), (100 + 2 * i, 101 + 2 * i), i + 1, m)
            })
        };
        let with: Vec<Op> = writes.clone().chain(reads(true)).collect();
        assert!(matches!(linearizable(&with, 20_000, far()), Search::Ok));
        let without: Vec<Op> = writes.chain(reads(false)).collect();
        assert!(matches!(linearizable(&without, 1_000_000, far()), Search::Unknown(_)));
    }

    #[test]
    fn a_read_of_a_timed_out_write_is_checked_against_its_mod_revision() {
        // The read saw "b" written at revision 2, after "a" at revision 3.
        let ops = vec![timed_out_write("b", 0), write("a", (1, 2)), read_at("b", (10, 11), 3, 2)];
        let ops: Vec<Op> = ops
            .into_iter()
            .map(|mut o| {
                if o.kind == (OpKind::Write { value: "a".into() }) {
                    o.result = Outcome::Ok { revision: 3 };
                }
                o
            })
            .collect();
        assert!(matches!(linearizable(&ops, 1_000, far()), Search::Violation(_)));
        // A read that saw the value before the write was sent.
        let ops = vec![read_at("c", (0, 1), 1, 1), timed_out_write("c", 5)];
        assert!(matches!(linearizable(&ops, 1_000, far()), Search::Violation(_)));
    }

    #[test]
    fn the_step_budget_yields_unknown() {
        let ops: Vec<Op> =
            (0..40).map(|i| write(&format!("v{i}"), (0, 100))).chain([read(Some("x"), (200, 201))]).collect();
        assert!(matches!(linearizable(&ops, 50, far()), Search::Unknown(_)));
    }
}
