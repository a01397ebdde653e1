//! Watch guarantees on the KV API, as etcd's robustness tests (`validate`)
//! check them, over the store's writes and each watcher's event log.
//!
//! - **valid**: every event matches a real write: an acknowledged write with
//!   the same key, revision and value, or a write that may have happened
//!   (indeterminate, or a delete that may have removed nothing) with the same
//!   key and value; watchers that see an unacknowledged write agree on it.
//!   Events outside the watched range are invalid too.
//! - **ordered**: revisions never go backwards (so they increase strictly per
//!   key), no event predates the watch's start revision, and progress
//!   notifications never go below a delivered event.
//! - **unique**: no `(key, revision)` is delivered twice to one watcher,
//!   across resumes.
//! - **atomic**: when one event of a revision is delivered, every write of
//!   that revision in the range is, with no progress notification or resume
//!   between them.
//! - **reliable**: every write in the range with a revision in the watcher's
//!   window (its start revision, or first observation, up to the last
//!   revision it observed) is delivered. "Every write" is the acknowledged
//!   ones plus the valid events any watcher saw.
//! - **resumable**: after `Resumed { start_revision: s }` the next events are
//!   `>= s`, and `s` skips no write after the last observed revision.
//! - **bookmarkable**: after `Progress { revision: b }` no event `<= b` arrives.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::error::CheckerError;
use crate::history::{show, Op, OpKind, Outcome};
use crate::verdict::{Violation, ViolationKind};

/// The keys a watcher watches.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum KeyRange {
    /// Exactly one key.
    Key { key: String },
    /// Every key with this prefix (`""`: all keys).
    Prefix { prefix: String },
    /// `start <= key < end`.
    Range { start: String, end: String },
}

impl KeyRange {
    /// Whether `key` is in the range.
    pub fn contains(&self, key: &str) -> bool {
        match self {
            KeyRange::Key { key: k } => k == key,
            KeyRange::Prefix { prefix } => key.starts_with(prefix.as_str()),
            KeyRange::Range { start, end } => start.as_str() <= key && key < end.as_str(),
        }
    }
}

/// A write the store made (or may have made); `value: None` is a delete.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreWrite {
    pub key: String,
    pub value: Option<String>,
    /// The revision it created, if known.
    pub revision: Option<u64>,
    /// `true`: acknowledged and certainly created `revision` (so watchers must
    /// deliver it). `false`: it may have happened (an indeterminate write, or a
    /// delete that may have removed nothing); events may match it, none must.
    pub acknowledged: bool,
}

/// One event a watcher received; `value: None` is a delete.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchEvent {
    pub key: String,
    pub value: Option<String>,
    pub revision: u64,
}

/// One entry of a watcher's log, in arrival order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WatchEntry {
    /// An event.
    Event(WatchEvent),
    /// A progress notification (bookmark): everything `<= revision` was delivered.
    Progress { revision: u64 },
    /// The watch was re-established (after a disconnect) asking for events `>= start_revision`.
    Resumed { start_revision: u64 },
}

/// What one watcher saw.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchLog {
    /// Identifies the watcher in violations.
    pub watcher: u64,
    /// The watched keys.
    pub range: KeyRange,
    /// The first revision asked for (`0`: "from now", i.e. from the first observation).
    pub start_revision: u64,
    /// Events, progress notifications and resumes in arrival order.
    pub entries: Vec<WatchEntry>,
}

/// The store writes a KV history implies, for [`check_watches`].
///
/// Acknowledged puts and CASes with a recorded revision are acknowledged
/// writes. An acknowledged delete is one only if the key certainly existed
/// (the latest acknowledged mutation before it is a put and no
/// indeterminate delete touched the key); otherwise it may have removed
/// nothing, created no revision, and is merely possible. Indeterminate
/// mutations (and successes without a revision) are possible writes of
/// unknown revision. Failed ops write nothing.
pub fn store_writes(history: &[Op]) -> Vec<StoreWrite> {
    let mut acked: HashMap<&str, BTreeMap<u64, bool>> = HashMap::new();
    let mut shaky_deletes: HashSet<&str> = HashSet::new();
    for op in history {
        match (&op.kind, &op.result) {
            (OpKind::Read, _) => {}
            (kind, Outcome::Ok { revision }) if *revision > 0 => {
                let is_put = !matches!(kind, OpKind::Delete);
                acked.entry(op.key.as_str()).or_default().insert(*revision, is_put);
            }
            (OpKind::Delete, Outcome::Ok { .. } | Outcome::Indeterminate) => {
                shaky_deletes.insert(op.key.as_str());
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    for op in history {
        let Some(value) = op.written_value() else { continue };
        let value = value.map(str::to_string);
        let key = op.key.clone();
        match op.result {
            Outcome::Ok { revision } if revision > 0 => {
                let acknowledged = match op.kind {
                    OpKind::Delete => {
                        !shaky_deletes.contains(op.key.as_str())
                            && acked
                                .get(op.key.as_str())
                                .and_then(|m| m.range(..revision).next_back())
                                .is_some_and(|(_, is_put)| *is_put)
                    }
                    _ => true,
                };
                out.push(StoreWrite { key, value, revision: Some(revision), acknowledged });
            }
            Outcome::Ok { .. } | Outcome::Indeterminate => {
                out.push(StoreWrite { key, value, revision: None, acknowledged: false });
            }
            _ => {}
        }
    }
    out
}

/// Checks every watcher's log against the store's writes (see module docs).
/// Errors only on malformed writes (acknowledged without a revision).
pub fn check_watches(writes: &[StoreWrite], watchers: &[WatchLog]) -> Result<Vec<Violation>, CheckerError> {
    let mut acked: HashMap<(&str, u64), Option<&str>> = HashMap::new();
    let mut possible_at: HashMap<(&str, u64), HashSet<Option<&str>>> = HashMap::new();
    let mut possible: HashMap<&str, HashSet<Option<&str>>> = HashMap::new();
    // Writes that must be delivered: revision -> key -> value.
    let mut required: BTreeMap<u64, BTreeMap<&str, Option<&str>>> = BTreeMap::new();
    for (index, w) in writes.iter().enumerate() {
        let value = w.value.as_deref();
        match (w.acknowledged, w.revision) {
            (true, Some(r)) => {
                acked.insert((w.key.as_str(), r), value);
                required.entry(r).or_default().insert(w.key.as_str(), value);
            }
            (true, None) => {
                return Err(CheckerError::MalformedWrite {
                    index,
                    key: w.key.clone(),
                    reason: "acknowledged without a revision".to_string(),
                })
            }
            (false, Some(r)) => {
                possible_at.entry((w.key.as_str(), r)).or_default().insert(value);
            }
            (false, None) => {
                possible.entry(w.key.as_str()).or_default().insert(value);
            }
        }
    }

    let mut violations = Vec::new();
    // Validity, and the unacknowledged writes watchers proved real.
    let mut seen_real: HashMap<(&str, u64), (Option<&str>, u64)> = HashMap::new();
    for log in watchers {
        for entry in &log.entries {
            let WatchEntry::Event(e) = entry else { continue };
            let (key, value, r) = (e.key.as_str(), e.value.as_deref(), e.revision);
            let invalid = |why: String| {
                Violation::new(ViolationKind::WatchValid, key, why).with_watcher(log.watcher).with_revision(r)
            };
            if !log.range.contains(key) {
                violations.push(invalid(format!("event for {key:?} at revision {r} is outside the watched range")));
                continue;
            }
            if let Some(&written) = acked.get(&(key, r)) {
                if written != value {
                    violations.push(invalid(format!(
                        "event at revision {r} carries {} but the write at {r} was {}",
                        show(value),
                        show(written)
                    )));
                }
                continue;
            }
            let may_be = possible_at.get(&(key, r)).is_some_and(|s| s.contains(&value))
                || possible.get(key).is_some_and(|s| s.contains(&value));
            if !may_be {
                violations.push(invalid(format!("event {} at revision {r} matches no write to {key:?}", show(value))));
                continue;
            }
            match seen_real.get(&(key, r)) {
                Some(&(other, by)) if other != value => violations.push(invalid(format!(
                    "event at revision {r} carries {} but watcher {by} saw {} there",
                    show(value),
                    show(other)
                ))),
                Some(_) => {}
                None => {
                    seen_real.insert((key, r), (value, log.watcher));
                    required.entry(r).or_default().insert(key, value);
                }
            }
        }
    }

    for log in watchers {
        check_log(log, &required, &mut violations);
    }
    Ok(violations)
}

/// Order, uniqueness, atomicity, reliability, resumes and bookmarks of one watcher.
fn check_log(log: &WatchLog, required: &BTreeMap<u64, BTreeMap<&str, Option<&str>>>, out: &mut Vec<Violation>) {
    let w = log.watcher;
    let start = log.start_revision;
    let mut delivered: HashSet<(&str, u64)> = HashSet::new();
    let mut delivered_revisions: HashSet<u64> = HashSet::new();
    let mut reported: HashSet<(&str, u64)> = HashSet::new();
    let mut last_event: Option<u64> = None;
    let mut last_progress: Option<u64> = None;
    let mut floor: Option<u64> = None;
    // A progress notification or resume came after the last event.
    let mut boundary = false;
    let mut lower: Option<u64> = (start > 0).then_some(start);
    for entry in &log.entries {
        match entry {
            WatchEntry::Event(e) => {
                let (key, r) = (e.key.as_str(), e.revision);
                if !log.range.contains(key) {
                    continue;
                }
                let v = |kind, why: String| Violation::new(kind, key, why).with_watcher(w).with_revision(r);
                if !delivered.insert((key, r)) {
                    out.push(v(
                        ViolationKind::WatchUnique,
                        format!("event for {key:?} at revision {r} delivered again"),
                    ));
                    continue;
                }
                lower.get_or_insert(r);
                if let Some(s) = floor.filter(|s| r < *s) {
                    out.push(v(
                        ViolationKind::WatchResumable,
                        format!("after resuming at revision {s} the watcher got revision {r}"),
                    ));
                } else if start > 0 && r < start {
                    out.push(v(
                        ViolationKind::WatchOrdered,
                        format!("revision {r} predates the start revision {start}"),
                    ));
                } else if let Some(l) = last_event.filter(|l| r < *l) {
                    out.push(v(ViolationKind::WatchOrdered, format!("revision {r} arrived after revision {l}")));
                } else if let Some(b) = last_progress.filter(|b| r <= *b) {
                    out.push(v(
                        ViolationKind::WatchBookmarkable,
                        format!("revision {r} arrived after a progress notification for revision {b}"),
                    ));
                } else if boundary && last_event == Some(r) {
                    out.push(v(
                        ViolationKind::WatchAtomic,
                        format!("revision {r} was split by a progress notification or resume"),
                    ));
                }
                delivered_revisions.insert(r);
                last_event = last_event.max(Some(r));
                if floor.is_some_and(|s| r >= s) {
                    floor = None;
                }
                boundary = false;
            }
            WatchEntry::Progress { revision: b } => {
                if let Some(l) = last_event.filter(|l| b < l) {
                    out.push(
                        Violation::new(
                            ViolationKind::WatchOrdered,
                            "",
                            format!("progress notification for revision {b} after an event at revision {l}"),
                        )
                        .with_watcher(w)
                        .with_revision(*b),
                    );
                }
                lower.get_or_insert(b.saturating_add(1));
                last_progress = last_progress.max(Some(*b));
                boundary = true;
            }
            WatchEntry::Resumed { start_revision: s } => {
                let seen = last_event.max(last_progress).or(start.checked_sub(1));
                if let Some(seen) = seen.filter(|seen| seen.saturating_add(1) < *s) {
                    for (r, keys) in required.range(seen + 1..*s) {
                        for (key, value) in keys.iter().filter(|(k, _)| log.range.contains(k)) {
                            if delivered.contains(&(*key, *r)) || !reported.insert((*key, *r)) {
                                continue;
                            }
                            out.push(
                                Violation::new(
                                    ViolationKind::WatchResumable,
                                    key,
                                    format!(
                                        "resumed at revision {s} after observing up to {seen}, skipping {} at {r}",
                                        show(*value)
                                    ),
                                )
                                .with_watcher(w)
                                .with_revision(*r),
                            );
                        }
                    }
                }
                floor = Some(*s);
                boundary = true;
            }
        }
    }
    let (Some(lower), Some(upper)) = (lower, last_event.max(last_progress)) else { return };
    if lower > upper {
        return;
    }
    for (r, keys) in required.range(lower..=upper) {
        for (key, value) in keys.iter().filter(|(k, _)| log.range.contains(k)) {
            if delivered.contains(&(*key, *r)) || reported.contains(&(*key, *r)) {
                continue;
            }
            let (kind, why) = if delivered_revisions.contains(r) {
                (
                    ViolationKind::WatchAtomic,
                    format!("revision {r} was delivered without its write of {}", show(*value)),
                )
            } else {
                (
                    ViolationKind::WatchReliable,
                    format!(
                        "the write of {} at revision {r} was never delivered (watched {lower}..={upper})",
                        show(*value)
                    ),
                )
            };
            out.push(Violation::new(kind, key, why).with_watcher(w).with_revision(*r));
        }
    }
}
