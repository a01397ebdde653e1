//! Key-range permissions, merged per user: what a user may read and write.
//!
//! A role grants READ, WRITE or READWRITE on one key (`range_end` empty), on
//! `[key, range_end)`, or on every key from `key` on (`range_end` `"\0"`).
//! A user holds the union of its roles' grants; [`RangeSet`] keeps that
//! union as sorted, disjoint, non-adjacent intervals, so a request's range
//! is allowed exactly when one interval covers it whole (etcd's
//! `range_perm_cache.go` answers the same question with an interval tree).

use std::cmp::Ordering;

/// The end of an interval: a key (exclusive) or past every key.
#[derive(Clone, Debug, PartialEq, Eq)]
enum End {
    Key(Vec<u8>),
    Unbounded,
}

impl PartialOrd for End {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for End {
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            (End::Key(a), End::Key(b)) => a.cmp(b),
            (End::Key(_), End::Unbounded) => Ordering::Less,
            (End::Unbounded, End::Key(_)) => Ordering::Greater,
            (End::Unbounded, End::Unbounded) => Ordering::Equal,
        }
    }
}

/// `[begin, end)` in etcd's encoding of a key or range, as an interval.
/// An empty `range_end` is the single key; `"\0"` is "to the end". The
/// empty key sorts before every real key, so it begins at `"\0"` (etcd
/// keys are never empty).
fn interval(key: &[u8], range_end: &[u8]) -> (Vec<u8>, End) {
    let begin = if key.is_empty() { vec![0] } else { key.to_vec() };
    let end = match range_end {
        [] => {
            let mut next = key.to_vec();
            next.push(0);
            End::Key(next)
        }
        [0] => End::Unbounded,
        end => End::Key(end.to_vec()),
    };
    (begin, end)
}

/// A union of key intervals, merged.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeSet {
    /// Sorted by begin; disjoint and not touching.
    intervals: Vec<(Vec<u8>, End)>,
}

impl RangeSet {
    /// Adds the key or range `(key, range_end)` in etcd's encoding.
    pub fn add(&mut self, key: &[u8], range_end: &[u8]) {
        let (begin, end) = interval(key, range_end);
        if End::Key(begin.clone()) >= end {
            return; // an empty range grants nothing
        }
        self.intervals.push((begin, end));
        self.intervals.sort_by(|a, b| a.0.cmp(&b.0));
        let mut merged: Vec<(Vec<u8>, End)> = Vec::with_capacity(self.intervals.len());
        for (begin, end) in self.intervals.drain(..) {
            match merged.last_mut() {
                Some((_, last_end)) if End::Key(begin.clone()) <= *last_end => {
                    if end > *last_end {
                        *last_end = end;
                    }
                }
                _ => merged.push((begin, end)),
            }
        }
        self.intervals = merged;
    }

    /// Whether the key or range `(key, range_end)` lies wholly inside one interval.
    pub fn covers(&self, key: &[u8], range_end: &[u8]) -> bool {
        let (begin, end) = interval(key, range_end);
        // The last interval beginning at or before `begin` is the only candidate.
        let at = self.intervals.partition_point(|(b, _)| *b <= begin);
        at > 0 && self.intervals[at - 1].1 >= end
    }

    /// The number of merged intervals.
    pub fn len(&self) -> usize {
        self.intervals.len()
    }

    /// Whether nothing is granted.
    pub fn is_empty(&self) -> bool {
        self.intervals.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(grants: &[(&str, &str)]) -> RangeSet {
        let mut s = RangeSet::default();
        for (k, e) in grants {
            s.add(k.as_bytes(), e.as_bytes());
        }
        s
    }

    #[test]
    fn a_single_key_grant_covers_that_key_only() {
        let s = set(&[("a", "")]);
        assert!(s.covers(b"a", b""));
        assert!(!s.covers(b"ab", b""));
        assert!(!s.covers(b"a", b"b"));
        assert!(s.covers(b"a", b"a\0"));
    }

    #[test]
    fn a_prefix_grant_covers_keys_and_ranges_under_it_but_not_beyond() {
        // etcdctl's --prefix /alice/ is the range [/alice/, /alice0).
        let s = set(&[("/alice/", "/alice0")]);
        assert!(s.covers(b"/alice/x", b""));
        assert!(s.covers(b"/alice/", b"/alice0"));
        assert!(s.covers(b"/alice/a", b"/alice/b"));
        assert!(!s.covers(b"/bob/x", b""));
        assert!(!s.covers(b"/alice/", b"/alice1"));
        assert!(!s.covers(b"/alice/", b"\0"));
    }

    #[test]
    fn adjacent_and_overlapping_grants_merge_into_one_interval() {
        let s = set(&[("a", "c"), ("c", "e"), ("b", "d"), ("x", "")]);
        assert_eq!(s.len(), 2);
        assert!(s.covers(b"a", b"e"));
        assert!(!s.covers(b"a", b"f"));
        assert!(s.covers(b"x", b""));
    }

    #[test]
    fn a_range_spanning_a_gap_between_grants_is_not_covered() {
        let s = set(&[("a", "c"), ("d", "f")]);
        assert!(s.covers(b"a", b"c"));
        assert!(!s.covers(b"b", b"e"));
        assert!(!s.covers(b"c", b""));
    }

    #[test]
    fn an_open_ended_grant_covers_everything_after_its_key() {
        let s = set(&[("m", "\0")]);
        assert!(s.covers(b"z", b"\0"));
        assert!(s.covers(b"m", b""));
        assert!(!s.covers(b"a", b""));
        let all = set(&[("", "\0")]);
        assert!(all.covers(b"\0", b"\0"));
        assert!(all.covers(b"", b"\0"));
    }

    #[test]
    fn an_empty_or_inverted_grant_grants_nothing() {
        let s = set(&[("b", "a")]);
        assert!(s.is_empty());
        assert!(!s.covers(b"a", b""));
    }
}
