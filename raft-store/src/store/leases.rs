//! Leases: grants and revokes go through the log; the clocks that expire
//! them run on the leader only (see [`crate::lessor`]), which proposes a
//! revoke for each lease that ran out.

use std::time::Instant;

use super::admin::{AdminRequest, AdminResponse};
use super::{Inner, Store};
use crate::error::StoreError;
use crate::lessor::{EXPIRY_CHECK, MIN_TTL_SECONDS};
use crate::mvcc::Reader;
use crate::types::{Command, Output};

impl Store {
    /// etcd's LeaseGrant: `id` 0 lets this member choose one.
    pub async fn lease_grant(&self, id: i64, ttl_seconds: i64) -> Result<(i64, i64), StoreError> {
        if id < 0 {
            return Err(StoreError::InvalidArgument("etcdserver: lease ID must be positive".into()));
        }
        let id = if id == 0 { rand::random::<i64>() & i64::MAX } else { id };
        let ttl_seconds = ttl_seconds.max(MIN_TTL_SECONDS);
        match self.write(Command::LeaseGrant { id, ttl_seconds }).await? {
            Output::LeaseGranted { id, ttl_seconds } => Ok((id, ttl_seconds)),
            other => Err(StoreError::Internal(format!("unexpected result of a lease grant: {other:?}"))),
        }
    }

    /// etcd's LeaseRevoke. Returns the revision after the attached keys went.
    pub async fn lease_revoke(&self, id: i64) -> Result<i64, StoreError> {
        match self.write(Command::LeaseRevoke { id }).await? {
            Output::LeaseRevoked { revision } => Ok(revision),
            other => Err(StoreError::Internal(format!("unexpected result of a lease revoke: {other:?}"))),
        }
    }

    /// Restarts lease `id`'s clock on the leader; returns its TTL.
    pub async fn lease_keep_alive(&self, id: i64) -> Result<i64, StoreError> {
        match self.admin(AdminRequest::LeaseKeepAlive { id }).await? {
            AdminResponse::Lease { ttl_seconds, .. } => Ok(ttl_seconds),
            other => Err(StoreError::Internal(format!("unexpected keep-alive answer: {other:?}"))),
        }
    }

    /// Granted TTL and remaining seconds of lease `id`, from the leader's clock.
    pub async fn lease_time_to_live(&self, id: i64) -> Result<(i64, i64), StoreError> {
        match self.admin(AdminRequest::LeaseTimeToLive { id }).await? {
            AdminResponse::Lease { ttl_seconds, remaining_seconds } => Ok((ttl_seconds, remaining_seconds)),
            other => Err(StoreError::Internal(format!("unexpected time-to-live answer: {other:?}"))),
        }
    }

    /// Every lease (id, granted TTL), from this member's applied state.
    pub fn leases(&self) -> Result<Vec<(i64, i64)>, StoreError> {
        let db = self.inner.sm.db();
        let leases = Reader::snapshot(&db).leases().map_err(StoreError::from);
        leases
    }

    /// The keys attached to lease `id`, from this member's applied state.
    pub fn lease_keys(&self, id: i64) -> Result<Vec<Vec<u8>>, StoreError> {
        let db = self.inner.sm.db();
        let keys = Reader::snapshot(&db).lease_keys(id).map_err(StoreError::from);
        keys
    }

    /// On the leader: renew (or just read) lease `id`'s clock.
    pub(super) fn lease_clock(&self, id: i64, renew: bool) -> Result<AdminResponse, StoreError> {
        if self.leader() != Some(self.id()) {
            return Err(StoreError::NotLeader { leader: self.leader() });
        }
        let db = self.inner.sm.db();
        let granted = Reader::snapshot(&db).lease(id).map_err(StoreError::from)?;
        let Some(granted) = granted else {
            return Err(StoreError::Apply(crate::types::ApplyError::LeaseNotFound { id }));
        };
        let now = Instant::now();
        if renew {
            self.inner.lessor.renew(id, Some(granted), now);
        }
        let (ttl_seconds, remaining_seconds) = self.inner.lessor.remaining(id, now).unwrap_or((granted, granted));
        Ok(AdminResponse::Lease { ttl_seconds, remaining_seconds })
    }
}

/// While this member leads, keeps the lease clocks in step with the
/// replicated leases and proposes a revoke for each lease that expired.
pub(super) async fn run_lease_expiry(inner: std::sync::Weak<Inner>) {
    let mut tick = tokio::time::interval(EXPIRY_CHECK);
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        let store = Store { inner };
        let metrics = store.inner.raft.metrics().borrow().clone();
        if metrics.current_leader != Some(store.id()) {
            store.inner.lessor.clear();
            continue;
        }
        let Ok(leases) = store.leases() else { continue };
        let now = Instant::now();
        store.inner.lessor.sync(metrics.current_term, &leases, now);
        for id in store.inner.lessor.expired(now) {
            let task = store.clone();
            store.spawn(async move {
                let store = task;
                match store.write(Command::LeaseRevoke { id }).await {
                    Ok(_) => tracing::debug!(lease = id, "lease expired and was revoked"),
                    Err(StoreError::Apply(_)) => {}
                    Err(e) => tracing::warn!(lease = id, error = %e, "revoking an expired lease failed; will retry"),
                }
            });
        }
    }
}
