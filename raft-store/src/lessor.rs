//! The leader's lease clock.
//!
//! Leases themselves (id and granted TTL) are replicated state; when each
//! one expires is not. Like etcd, only the leader keeps expiry times, in
//! memory: a keep-alive renews a lease on the leader, and an expired lease
//! is revoked by the leader proposing `LeaseRevoke` through the log, so
//! every member deletes the attached keys at the same revision. A member
//! that becomes leader starts every lease's clock afresh (etcd extends
//! leases on takeover), so a leader change never expires a lease early.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often the leader looks for expired leases.
pub const EXPIRY_CHECK: Duration = Duration::from_millis(250);
/// The shortest TTL granted, whatever the client asks (etcd's minimum is
/// a few election timeouts too).
pub const MIN_TTL_SECONDS: i64 = 2;

#[derive(Default)]
pub struct Lessor {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The leader term these clocks belong to; another term restarts them.
    term: Option<u64>,
    leases: HashMap<i64, Clock>,
}

#[derive(Clone, Copy, Debug)]
struct Clock {
    ttl_seconds: i64,
    expires: Instant,
}

impl Clock {
    fn fresh(ttl_seconds: i64, now: Instant) -> Clock {
        Clock { ttl_seconds, expires: now + Duration::from_secs(ttl_seconds.max(0) as u64) }
    }
}

impl Lessor {
    /// Reconciles the clocks with the replicated leases as leader of
    /// `term`: a new term restarts every clock; leases granted since the
    /// last call get a fresh clock, revoked ones are dropped.
    pub fn sync(&self, term: u64, leases: &[(i64, i64)], now: Instant) {
        let mut s = self.state.lock().expect("lessor lock poisoned");
        if s.term != Some(term) {
            s.term = Some(term);
            s.leases.clear();
        }
        let known: HashMap<i64, i64> = leases.iter().copied().collect();
        s.leases.retain(|id, _| known.contains_key(id));
        for (id, ttl) in known {
            s.leases.entry(id).or_insert_with(|| Clock::fresh(ttl, now));
        }
    }

    /// Forgets every clock (this member is no longer the leader).
    pub fn clear(&self) {
        let mut s = self.state.lock().expect("lessor lock poisoned");
        s.term = None;
        s.leases.clear();
    }

    /// Restarts lease `id`'s clock; `ttl_if_unknown` is its granted TTL if
    /// the lessor has not seen it yet. Returns the TTL, or `None` if the
    /// lease does not exist.
    pub fn renew(&self, id: i64, ttl_if_unknown: Option<i64>, now: Instant) -> Option<i64> {
        let mut s = self.state.lock().expect("lessor lock poisoned");
        let ttl = s.leases.get(&id).map(|c| c.ttl_seconds).or(ttl_if_unknown)?;
        s.leases.insert(id, Clock::fresh(ttl, now));
        Some(ttl)
    }

    /// Granted TTL and remaining seconds of lease `id`.
    pub fn remaining(&self, id: i64, now: Instant) -> Option<(i64, i64)> {
        let s = self.state.lock().expect("lessor lock poisoned");
        s.leases.get(&id).map(|c| (c.ttl_seconds, c.expires.saturating_duration_since(now).as_secs_f64().ceil() as i64))
    }

    /// Leases whose clock ran out. Each is given a short grace before it is
    /// reported again, so a revoke in flight is not proposed twice at once.
    pub fn expired(&self, now: Instant) -> Vec<i64> {
        let mut s = self.state.lock().expect("lessor lock poisoned");
        let mut out = Vec::new();
        for (id, clock) in s.leases.iter_mut() {
            if clock.expires <= now {
                out.push(*id);
                clock.expires = now + Duration::from_secs(1);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_expires_after_its_ttl_unless_renewed() {
        let l = Lessor::default();
        let t0 = Instant::now();
        l.sync(1, &[(7, 2), (8, 2)], t0);
        assert!(l.expired(t0 + Duration::from_millis(1500)).is_empty());
        assert_eq!(l.renew(7, None, t0 + Duration::from_millis(1500)), Some(2));
        assert_eq!(l.expired(t0 + Duration::from_millis(2100)), vec![8]);
        assert!(l.expired(t0 + Duration::from_millis(2200)).is_empty(), "reported again only after a grace");
        assert_eq!(sorted(l.expired(t0 + Duration::from_millis(3600))), vec![7, 8]);
    }

    fn sorted(mut v: Vec<i64>) -> Vec<i64> {
        v.sort();
        v
    }

    #[test]
    fn a_new_leader_term_restarts_every_clock() {
        let l = Lessor::default();
        let t0 = Instant::now();
        l.sync(1, &[(7, 2)], t0);
        // Taking over at t0+1.9s: the lease gets a full TTL from then.
        l.sync(2, &[(7, 2)], t0 + Duration::from_millis(1900));
        assert!(l.expired(t0 + Duration::from_millis(3000)).is_empty());
        assert_eq!(l.expired(t0 + Duration::from_millis(4000)), vec![7]);
    }

    #[test]
    fn revoked_leases_are_forgotten_and_unknown_ones_cannot_be_renewed() {
        let l = Lessor::default();
        let t0 = Instant::now();
        l.sync(1, &[(7, 2)], t0);
        l.sync(1, &[], t0);
        assert_eq!(l.renew(7, None, t0), None);
        assert_eq!(l.renew(9, Some(5), t0), Some(5), "a lease granted since the last sync is renewable");
        assert_eq!(l.remaining(9, t0 + Duration::from_millis(2500)), Some((5, 3)));
    }
}
