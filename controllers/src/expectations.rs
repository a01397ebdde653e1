//! What a controller is still waiting to see in its caches, so a slow watch
//! never makes it act twice (Kubernetes' `ControllerExpectations`, with
//! deletions tracked by pod uid as its `UIDTrackingControllerExpectations`).
//!
//! A reconcile that asks for creates or deletes records them here *before*
//! it returns its actions. The wiring lowers them from pod events
//! ([`Expectations::creation_observed`] on an added pod the controller owns,
//! [`Expectations::deletion_observed`] on a deleted pod or one that got a
//! `deletionTimestamp`). Until every recorded write is observed, or
//! [`EXPECTATIONS_TTL`] has passed, [`Expectations::satisfied`] is false and
//! the controller only refreshes status: its cache cannot yet show what it
//! already asked for.
//!
//! When the runner stops before carrying out some actions, the wiring hands
//! them back with [`Expectations::actions_skipped`]; otherwise the key would
//! wait out the TTL for writes that never happened.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::Action;

/// How long a record may wait for its writes to be observed before the
/// controller acts again anyway (Kubernetes' `ExpectationsTimeout`).
pub const EXPECTATIONS_TTL: Duration = Duration::from_secs(5 * 60);

/// One controller's outstanding writes.
#[derive(Clone, Debug, Default, PartialEq)]
struct Record {
    /// Pods asked to be created and not yet seen in the cache.
    adds: i64,
    /// Uids of pods asked to be deleted and not yet seen going.
    deletes: HashSet<String>,
    /// When the record was set, for the TTL.
    set_at: Option<DateTime<Utc>>,
    /// The last failure the wiring reported, for the `ReplicaFailure`
    /// condition; taken by the next reconcile.
    failure: Option<Failure>,
}

/// Why the last attempt to create or delete pods failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// `FailedCreate` or `FailedDelete`.
    pub reason: String,
    pub message: String,
}

/// Outstanding creates and deletes per controller key (`namespace/name`).
/// Shared between the reconciles and the pod event handlers, hence the lock;
/// it is held only for map updates, never across I/O.
#[derive(Debug, Default)]
pub struct Expectations {
    records: Mutex<HashMap<String, Record>>,
}

impl Expectations {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Record>> {
        // A panic while holding this lock cannot leave a record half-written
        // (every update is a single field store), so a poisoned lock is safe
        // to keep using.
        self.records.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether the controller at `key` has seen every write it asked for (or
    /// waited [`EXPECTATIONS_TTL`] for them), so its cache is fit to act on.
    pub fn satisfied(&self, key: &str, now: DateTime<Utc>) -> bool {
        match self.lock().get(key) {
            None => true,
            Some(r) => (r.adds <= 0 && r.deletes.is_empty()) || r.expired(now),
        }
    }

    /// When an unsatisfied record expires, for a requeue; `None` if
    /// satisfied.
    pub fn expires_in(&self, key: &str, now: DateTime<Utc>) -> Option<Duration> {
        let records = self.lock();
        let r = records.get(key)?;
        if r.adds <= 0 && r.deletes.is_empty() {
            return None;
        }
        let deadline = r.set_at? + chrono::Duration::from_std(EXPECTATIONS_TTL).ok()?;
        Some((deadline - now).to_std().unwrap_or(Duration::ZERO))
    }

    /// Records that the controller at `key` is about to create `count` pods.
    /// Replaces what was outstanding, as Kubernetes does: it is only called
    /// when the previous record was satisfied or expired.
    pub fn expect_creations(&self, key: &str, count: usize, now: DateTime<Utc>) {
        let mut records = self.lock();
        let r = records.entry(key.to_string()).or_default();
        r.adds = i64::try_from(count).unwrap_or(i64::MAX);
        r.deletes.clear();
        r.set_at = Some(now);
    }

    /// Records that the controller at `key` is about to delete the pods with
    /// these uids.
    pub fn expect_deletions(&self, key: &str, uids: impl IntoIterator<Item = String>, now: DateTime<Utc>) {
        let mut records = self.lock();
        let r = records.entry(key.to_string()).or_default();
        r.adds = 0;
        r.deletes = uids.into_iter().collect();
        r.set_at = Some(now);
    }

    /// A pod the controller at `key` owns appeared in the cache.
    pub fn creation_observed(&self, key: &str) {
        if let Some(r) = self.lock().get_mut(key) {
            r.adds -= 1;
        }
    }

    /// A pod the controller at `key` owned was deleted, or got its
    /// `deletionTimestamp`. Idempotent per uid: the update that marks a pod
    /// terminating and its later delete count once.
    pub fn deletion_observed(&self, key: &str, pod_uid: &str) {
        if let Some(r) = self.lock().get_mut(key) {
            r.deletes.remove(pod_uid);
        }
    }

    /// The runner stopped at a failure and never carried out `skipped` (the
    /// actions after the failed one, and the failed one itself): they will
    /// not be observed, so stop waiting for them, and remember the failure
    /// for the controller's status.
    pub fn actions_skipped(&self, key: &str, skipped: &[Action], error: &str) {
        let mut records = self.lock();
        let Some(r) = records.get_mut(key) else { return };
        let mut reason = None;
        for action in skipped {
            match action {
                Action::Create(obj) if obj["kind"] == "Pod" => {
                    r.adds -= 1;
                    reason.get_or_insert("FailedCreate");
                }
                Action::Delete { kind, uid: Some(uid), .. } if kind == "Pod" => {
                    r.deletes.remove(uid);
                    reason.get_or_insert("FailedDelete");
                }
                _ => {}
            }
        }
        if let Some(reason) = reason {
            r.failure = Some(Failure { reason: reason.to_string(), message: error.to_string() });
        }
    }

    /// The failure reported since the last reconcile, if any; taking it means
    /// the condition clears once a reconcile's writes go through.
    pub fn take_failure(&self, key: &str) -> Option<Failure> {
        self.lock().get_mut(key).and_then(|r| r.failure.take())
    }

    /// The controller at `key` was deleted: drop its record.
    pub fn forget(&self, key: &str) {
        self.lock().remove(key);
    }
}

impl Record {
    fn expired(&self, now: DateTime<Utc>) -> bool {
        let ttl = chrono::Duration::from_std(EXPECTATIONS_TTL).unwrap_or(chrono::Duration::MAX);
        self.set_at.is_none_or(|at| now - at >= ttl)
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;
    use serde_json::json;

    use super::*;

    fn t0() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap()
    }

    #[test]
    fn a_key_without_a_record_is_satisfied() {
        assert!(Expectations::new().satisfied("ns/web", t0()));
    }

    #[test]
    fn creations_are_satisfied_once_each_is_observed() {
        let e = Expectations::new();
        e.expect_creations("ns/web", 2, t0());
        assert!(!e.satisfied("ns/web", t0()));
        e.creation_observed("ns/web");
        assert!(!e.satisfied("ns/web", t0()));
        e.creation_observed("ns/web");
        assert!(e.satisfied("ns/web", t0()));
        assert!(e.expires_in("ns/web", t0()).is_none());
    }

    #[test]
    fn deletions_count_each_pod_once() {
        let e = Expectations::new();
        e.expect_deletions("ns/web", ["a".to_string(), "b".to_string()], t0());
        e.deletion_observed("ns/web", "a");
        e.deletion_observed("ns/web", "a");
        assert!(!e.satisfied("ns/web", t0()), "the second event for pod a must not stand in for pod b");
        e.deletion_observed("ns/web", "b");
        assert!(e.satisfied("ns/web", t0()));
    }

    #[test]
    fn an_unobserved_record_expires_after_five_minutes() {
        let e = Expectations::new();
        e.expect_creations("ns/web", 1, t0());
        let almost = t0() + chrono::Duration::seconds(299);
        assert!(!e.satisfied("ns/web", almost));
        assert_eq!(e.expires_in("ns/web", almost), Some(Duration::from_secs(1)));
        assert!(e.satisfied("ns/web", t0() + chrono::Duration::seconds(300)));
    }

    #[test]
    fn skipped_actions_stop_the_wait_and_leave_a_failure_for_status() {
        let e = Expectations::new();
        e.expect_creations("ns/web", 3, t0());
        e.creation_observed("ns/web");
        let create = Action::Create(json!({"apiVersion": "v1", "kind": "Pod"}));
        e.actions_skipped("ns/web", &[create.clone(), create], "quota exceeded");
        assert!(e.satisfied("ns/web", t0()));
        let failure = e.take_failure("ns/web").expect("a failure");
        assert_eq!(failure.reason, "FailedCreate");
        assert_eq!(failure.message, "quota exceeded");
        assert!(e.take_failure("ns/web").is_none(), "taken once");
    }

    #[test]
    fn a_forgotten_key_is_satisfied() {
        let e = Expectations::new();
        e.expect_creations("ns/web", 5, t0());
        e.forget("ns/web");
        assert!(e.satisfied("ns/web", t0()));
    }
}
