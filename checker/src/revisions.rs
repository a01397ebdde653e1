//! Revision evidence for one key: cheap checks that use the global revision
//! Skiff (like etcd) assigns to every write. They run before the
//! linearizability search and catch stale reads and lost writes in O(n log n),
//! with the two or three ops involved as the evidence.
//!
//! With `M` the largest revision among the key's ops that completed before an
//! op `X` was invoked:
//! - a write or successful CAS `X` must have a revision `> M`;
//! - a read or delete `X` must have a revision `>= M` (a delete that removed
//!   nothing creates no revision and reports the current one);
//! - no two writes/CASes on the key share a revision (deletes may share one
//!   with each other, never with a put);
//! - a read at revision `R` returns the value of the latest acknowledged
//!   mutation with revision `<= R`, unless an indeterminate (or unrevisioned)
//!   mutation of that very value could have landed in between;
//! - a read that reports the revision its value was written at (etcd's
//!   `mod_revision`) agrees with the revision the write was acknowledged at.
//!
//! Revision `0` means "not recorded"; such ops are skipped here.

use std::collections::HashMap;

use crate::history::{show, Op, OpKind, Outcome};
use crate::verdict::{Violation, ViolationKind};

/// At most this many violations are reported per key (the first is the evidence that counts).
const MAX_REPORTED: usize = 16;

/// Checks the revision evidence of `key`'s ops (ops on other keys are ignored).
/// Returns the violations found, most useful first (at most 16).
pub fn check_revisions(key: &str, ops: &[Op]) -> Vec<Violation> {
    let ops: Vec<&Op> = ops.iter().filter(|op| op.key == key).collect();
    let mut out = Vec::new();
    duplicate_revisions(key, &ops, &mut out);
    real_time_order(key, &ops, &mut out);
    read_values(key, &ops, &mut out);
    written_at(key, &ops, &mut out);
    out.truncate(MAX_REPORTED);
    out
}

/// Reads that say when their value was written (`mod_revision`) against the
/// revisions its writes were acknowledged at: one of them must match.
fn written_at(key: &str, ops: &[&Op], out: &mut Vec<Violation>) {
    let mut acked: HashMap<&str, Vec<(u64, &Op)>> = HashMap::new();
    // Values also written by an op without a known revision: no evidence.
    let mut unknown = std::collections::HashSet::new();
    for op in ops {
        match (acked_mutation(op), op.written_value()) {
            (Some((revision, Some(v))), _) => acked.entry(v).or_default().push((revision, *op)),
            (None, Some(Some(v))) => {
                unknown.insert(v);
            }
            _ => {}
        }
    }
    for read in ops {
        let Outcome::Read { value: Some(v), mod_revision: m @ 1.., .. } = &read.result else { continue };
        let Some(writes) = acked.get(v.as_str()) else { continue };
        if unknown.contains(v.as_str()) || writes.iter().any(|(r, _)| r == m) {
            continue;
        }
        let (r, write) = writes[0];
        let explanation = format!(
            "a read returned {} as written at revision {m}, but its write was acknowledged at revision {r}",
            show(Some(v))
        );
        out.push(
            Violation::new(ViolationKind::RevisionOrder, key, explanation)
                .with_revision(*m)
                .with_history(vec![(*read).clone(), write.clone()]),
        );
    }
}

/// A mutation that took effect with a recorded revision.
fn acked_mutation(op: &Op) -> Option<(u64, Option<&str>)> {
    match op.result {
        Outcome::Ok { revision } if revision > 0 => op.written_value().map(|v| (revision, v)),
        _ => None,
    }
}

/// Whether `op` creates a revision for sure when it succeeds (put or CAS).
fn creates_revision(op: &Op) -> bool {
    matches!(op.kind, OpKind::Write { .. } | OpKind::Cas { .. })
}

fn duplicate_revisions(key: &str, ops: &[&Op], out: &mut Vec<Violation>) {
    let mut by_revision: HashMap<u64, &Op> = HashMap::new();
    for op in ops {
        let Some((revision, _)) = acked_mutation(op) else { continue };
        match by_revision.get(&revision) {
            Some(other) if creates_revision(op) || creates_revision(other) => {
                let v = Violation::new(
                    ViolationKind::RevisionOrder,
                    key,
                    format!("two acknowledged mutations of {key:?} both claim revision {revision}"),
                )
                .with_revision(revision)
                .with_history(vec![(*other).clone(), (*op).clone()]);
                out.push(v);
            }
            Some(_) => {}
            None => {
                by_revision.insert(revision, op);
            }
        }
    }
}

fn real_time_order(key: &str, ops: &[&Op], out: &mut Vec<Violation>) {
    // Ops with a revision and a completion time.
    let mut dated: Vec<(&Op, u64, u64)> =
        ops.iter().filter_map(|op| Some((*op, op.revision()?, op.complete_ns?))).collect();
    let mut by_complete = dated.clone();
    dated.sort_by_key(|(op, _, _)| op.invoke_ns);
    by_complete.sort_by_key(|(_, _, complete)| *complete);
    let mut next = 0;
    let mut max: Option<(&Op, u64)> = None;
    for (op, revision, _) in &dated {
        while let Some((prev, prev_rev, complete)) = by_complete.get(next) {
            if *complete >= op.invoke_ns {
                break;
            }
            if max.is_none_or(|(_, m)| *prev_rev > m) {
                max = Some((prev, *prev_rev));
            }
            next += 1;
        }
        let Some((prev, m)) = max else { continue };
        let is_write = creates_revision(op) && matches!(op.result, Outcome::Ok { .. });
        let broken = if is_write { *revision <= m } else { *revision < m };
        if !broken {
            continue;
        }
        let kind =
            if matches!(op.kind, OpKind::Read) { ViolationKind::StaleRead } else { ViolationKind::RevisionOrder };
        let v = Violation::new(
            kind,
            key,
            format!(
                "an op invoked after another completed at revision {m} reports revision {revision}{}: {} precedes {}",
                if is_write { " (a later write needs a larger revision)" } else { "" },
                prev.describe(),
                op.describe()
            ),
        )
        .with_revision(*revision)
        .with_history(vec![prev.clone(), (*op).clone()]);
        out.push(v);
    }
}

fn read_values(key: &str, ops: &[&Op], out: &mut Vec<Violation>) {
    let mut acked: Vec<(u64, Option<&str>, &Op)> =
        ops.iter().filter_map(|op| acked_mutation(op).map(|(r, v)| (r, v, *op))).collect();
    acked.sort_by_key(|(r, _, _)| *r);
    // Mutations whose revision is unknown: they may have landed anywhere after invocation.
    let possible: Vec<(&Op, Option<&str>)> = ops
        .iter()
        .filter(|op| match op.result {
            Outcome::Indeterminate => true,
            Outcome::Ok { revision } => revision == 0,
            _ => false,
        })
        .filter_map(|op| op.written_value().map(|v| (*op, v)))
        .collect();
    for read in ops {
        let Outcome::Read { value, revision, .. } = &read.result else { continue };
        if *revision == 0 {
            continue;
        }
        let seen = value.as_deref();
        let latest = acked.partition_point(|(r, _, _)| r <= revision);
        let (expected, writer) = match latest.checked_sub(1).and_then(|i| acked.get(i)) {
            Some((_, v, op)) => (*v, Some(*op)),
            None => (None, None),
        };
        if seen == expected {
            continue;
        }
        let complete = read.complete_ns.unwrap_or(u64::MAX);
        if possible.iter().any(|(op, v)| *v == seen && op.invoke_ns <= complete) {
            continue;
        }
        let source = acked.iter().rev().find(|(_, v, _)| *v == seen);
        let mut history = vec![(*read).clone()];
        history.extend(writer.cloned());
        let explanation = match source {
            Some((r, _, op)) if r > revision => {
                history.push((*op).clone());
                format!(
                    "a read at revision {revision} returned {}, which was written only at revision {r}",
                    show(seen)
                )
            }
            Some((r, _, op)) => {
                history.push((*op).clone());
                format!(
                    "a read at revision {revision} returned {} (written at revision {r}), but the latest write at or \
                     below {revision} left {}",
                    show(seen),
                    show(expected)
                )
            }
            None if seen.is_none() => format!(
                "a read at revision {revision} found the key absent, but the latest write at or below {revision} left {}",
                show(expected)
            ),
            None => format!("a read at revision {revision} returned {}, which no write produced", show(seen)),
        };
        out.push(
            Violation::new(ViolationKind::StaleRead, key, explanation).with_revision(*revision).with_history(history),
        );
    }
}
