//! Expectations: the creates and deletes a controller has asked for and not
//! yet seen in its cache, per owner key, as Kubernetes'
//! `ControllerExpectations`.
//!
//! A reconcile that creates pods returns before the informer has seen
//! them; the next reconcile of the same key, from a cache that does not
//! hold them yet, would create them again. So the wiring records what a
//! reconcile asked for (`expect_creations`, `expect_deletions`) before
//! carrying it out, marks each one seen as the pod events arrive
//! (`creation_observed`, `deletion_observed`), and the logic creates or
//! deletes only while the key is `satisfied`. A write that fails is
//! marked seen too (it will never arrive). Expectations older than
//! [`EXPECTATIONS_TTL`] count as satisfied, so a lost event delays a
//! controller by minutes instead of stopping it.
//!
//! Keys are whatever the controller uses for its work queue
//! (`namespace/name`); the struct is generic over them.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;

use chrono::{DateTime, TimeDelta, Utc};

/// How long expectations are trusted before a controller acts anyway
/// (Kubernetes' `ExpectationsTimeout`).
pub const EXPECTATIONS_TTL: TimeDelta = TimeDelta::minutes(5);

/// The outstanding creates and deletes of one key.
#[derive(Clone, Debug, Default)]
struct Pending {
    /// Creations asked for and not yet seen.
    creations: usize,
    /// Uids of the objects whose deletion was asked for and not yet seen.
    deletions: HashSet<String>,
    /// When these were set; past the TTL they no longer hold a key back.
    set_at: Option<DateTime<Utc>>,
}

/// Outstanding creates and deletes per key. Not synchronized: the wiring
/// keeps it behind the one lock or task that also feeds it events.
#[derive(Debug)]
pub struct Expectations<K> {
    pending: HashMap<K, Pending>,
}

impl<K> Default for Expectations<K> {
    fn default() -> Self {
        Expectations { pending: HashMap::new() }
    }
}

impl<K: Eq + Hash + Clone> Expectations<K> {
    /// No expectations for any key.
    pub fn new() -> Self {
        Self::default()
    }

    /// `n` creations will follow for `key` (added to any still pending).
    pub fn expect_creations(&mut self, key: &K, n: usize, now: DateTime<Utc>) {
        if n == 0 {
            return;
        }
        let p = self.pending.entry(key.clone()).or_default();
        p.creations += n;
        p.set_at = Some(now);
    }

    /// One creation for `key` was seen in the cache (or failed).
    pub fn creation_observed(&mut self, key: &K) {
        if let Some(p) = self.pending.get_mut(key) {
            p.creations = p.creations.saturating_sub(1);
            self.drop_if_done(key);
        }
    }

    /// The objects with these uids will be deleted for `key`.
    pub fn expect_deletions<I, S>(&mut self, key: &K, uids: I, now: DateTime<Utc>)
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let uids: Vec<String> = uids.into_iter().map(Into::into).collect();
        if uids.is_empty() {
            return;
        }
        let p = self.pending.entry(key.clone()).or_default();
        p.deletions.extend(uids);
        p.set_at = Some(now);
    }

    /// The object with `uid` was seen deleted (or marked for deletion, or
    /// its delete failed). Unknown uids are ignored.
    pub fn deletion_observed(&mut self, key: &K, uid: &str) {
        if let Some(p) = self.pending.get_mut(key) {
            p.deletions.remove(uid);
            self.drop_if_done(key);
        }
    }

    /// Whether the logic may create and delete for `key`: nothing is
    /// outstanding, or what is has waited longer than the TTL.
    pub fn satisfied(&self, key: &K, now: DateTime<Utc>) -> bool {
        match self.pending.get(key) {
            None => true,
            Some(p) if p.creations == 0 && p.deletions.is_empty() => true,
            Some(p) => p.set_at.is_none_or(|at| now - at > EXPECTATIONS_TTL),
        }
    }

    /// Forgets `key` (its owner was deleted).
    pub fn forget(&mut self, key: &K) {
        self.pending.remove(key);
    }

    fn drop_if_done(&mut self, key: &K) {
        if self.pending.get(key).is_some_and(|p| p.creations == 0 && p.deletions.is_empty()) {
            self.pending.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    fn t0() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap()
    }

    #[test]
    fn a_key_without_expectations_is_satisfied() {
        let e: Expectations<String> = Expectations::new();
        assert!(e.satisfied(&"ns/a".to_string(), t0()));
    }

    #[test]
    fn creations_hold_the_key_until_each_is_observed() {
        let mut e = Expectations::new();
        let key = "ns/job".to_string();
        e.expect_creations(&key, 2, t0());
        assert!(!e.satisfied(&key, t0()));
        e.creation_observed(&key);
        assert!(!e.satisfied(&key, t0()));
        e.creation_observed(&key);
        assert!(e.satisfied(&key, t0()));
        // Extra observations (pods created by someone else) do no harm.
        e.creation_observed(&key);
        assert!(e.satisfied(&key, t0()));
    }

    #[test]
    fn deletions_are_observed_by_uid_and_others_are_ignored() {
        let mut e = Expectations::new();
        let key = "ns/ds".to_string();
        e.expect_deletions(&key, ["u1", "u2"], t0());
        e.deletion_observed(&key, "u1");
        e.deletion_observed(&key, "unrelated");
        assert!(!e.satisfied(&key, t0()));
        e.deletion_observed(&key, "u2");
        assert!(e.satisfied(&key, t0()));
    }

    #[test]
    fn expectations_expire_after_five_minutes() {
        let mut e = Expectations::new();
        let key = "ns/job".to_string();
        e.expect_creations(&key, 1, t0());
        assert!(!e.satisfied(&key, t0() + TimeDelta::minutes(5)));
        assert!(e.satisfied(&key, t0() + TimeDelta::minutes(5) + TimeDelta::seconds(1)));
    }

    #[test]
    fn forgetting_a_key_satisfies_it_and_leaves_others() {
        let mut e = Expectations::new();
        let (a, b) = ("ns/a".to_string(), "ns/b".to_string());
        e.expect_creations(&a, 1, t0());
        e.expect_creations(&b, 1, t0());
        e.forget(&a);
        assert!(e.satisfied(&a, t0()));
        assert!(!e.satisfied(&b, t0()));
    }
}
