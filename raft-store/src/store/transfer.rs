//! Leadership transfer (etcd's MoveLeader) on openraft 0.9, which has no
//! transfer command of its own.
//!
//! A follower refuses to vote while its leader lease (the time since it
//! last heard from the leader, up to `election_timeout_max`) lasts, so the
//! leader cannot simply tell the target to campaign. Instead it goes quiet:
//! 1. it holds new writes and linearizable reads (each would reach the
//!    followers and renew their leases), and membership changes;
//! 2. it waits until the target has every entry of its log (so the target's
//!    log is at least as new as any voter's and it can win); a target far
//!    behind is first caught up with requests flowing;
//! 3. it stops its heartbeats and waits out the followers' leases;
//! 4. it asks the target to campaign, before any other follower's own
//!    election timeout (lease + at least `election_timeout_min`) fires;
//! 5. it waits until the target leads, or the request's deadline passes.
//!
//! Heartbeats and held requests resume when the transfer ends, whichever
//! way: held writes then meet the new leader and are forwarded there.

use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::{AdminResponse, Store};
use crate::error::{StoreError, WireError};
use crate::network::PeerMethod;
use crate::store::AdminRequest;
use crate::types::NodeId;

/// How far behind the leader's log the target may be before requests are
/// held for the rest (entries replicate within a round trip).
const NEARLY_CAUGHT_UP: u64 = 64;

/// Why a leadership transfer failed; messages are etcd's.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum TransferError {
    /// Only the leader transfers leadership.
    #[error("etcdserver: not leader")]
    NotLeader,
    /// The target is not a member, or is a learner.
    #[error("etcdserver: bad leader transferee")]
    BadTransferee { target: NodeId },
    /// The target did not lead before the deadline.
    #[error("etcdserver: request timed out, leader transfer took too long")]
    TimedOut { target: NodeId },
    /// The target could not be asked to campaign.
    #[error("{0}")]
    Store(#[source] StoreError),
}

/// How the leader holds writes and reads during a transfer: the batcher and
/// the read barrier wait while it says `true`.
#[derive(Clone)]
pub(super) struct Hold(watch::Receiver<bool>);

impl Hold {
    pub(super) fn new() -> (watch::Sender<bool>, Hold) {
        let (tx, rx) = watch::channel(false);
        (tx, Hold(rx))
    }

    /// Waits until no transfer holds requests.
    pub(super) async fn released(&mut self) {
        // The sender lives in the store; if it is gone the store stopped and
        // nothing is held.
        let _ = self.0.wait_for(|held| !*held).await;
    }
}

/// Ends a transfer however it ends: heartbeats resume, held requests go.
struct Quiet<'a> {
    store: &'a Store,
}

impl Drop for Quiet<'_> {
    fn drop(&mut self) {
        self.store.inner.raft.runtime_config().heartbeat(true);
        self.store.inner.hold.send_replace(false);
    }
}

impl Store {
    /// Makes `target` the leader, as etcd's MoveLeader: called on the
    /// leader, answers once `target` leads or fails at `deadline`.
    pub async fn move_leader(&self, target: NodeId, deadline: Instant) -> Result<(), TransferError> {
        if self.leader() != Some(self.id()) {
            return Err(TransferError::NotLeader);
        }
        let membership = self.inner.raft.metrics().borrow().membership_config.clone();
        if !membership.membership().voter_ids().any(|v| v == target) {
            return Err(TransferError::BadTransferee { target });
        }
        if target == self.id() {
            return Ok(());
        }
        let addr = self.leader_addr(target).ok_or(TransferError::BadTransferee { target })?;
        let _serial = self.inner.admin.lock().await;
        // Catch the target up under load first, so that requests are held
        // only for the last few entries.
        self.wait_replicated(target, NEARLY_CAUGHT_UP, deadline).await?;
        let quiet = Quiet { store: self };
        self.inner.hold.send_replace(true);
        let held_at_most = Instant::now() + self.inner.config.election_timeout_max * 2;
        self.wait_replicated(target, 0, deadline.min(held_at_most)).await?;
        self.inner.raft.runtime_config().heartbeat(false);
        // Every follower's lease runs from its last message, sent before
        // now; the target campaigns a little after the longest lease ends,
        // ahead of the followers' own timeouts.
        let lease = self.inner.config.election_timeout_max + self.inner.config.heartbeat / 2;
        tokio::time::sleep(lease.min(deadline.saturating_duration_since(Instant::now()))).await;
        if Instant::now() >= deadline {
            return Err(TransferError::TimedOut { target });
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let asked: Result<Result<AdminResponse, WireError>, _> =
            self.inner.peers.call(&addr, target, PeerMethod::Admin, &AdminRequest::Campaign, left).await;
        match asked {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(TransferError::Store(e.into())),
            Err(e) => return Err(TransferError::Store(StoreError::Peer(e))),
        }
        let mut metrics = self.inner.raft.metrics();
        let leads = async { metrics.wait_for(|m| m.current_leader == Some(target)).await.map(|_| ()) };
        let led = tokio::time::timeout(deadline.saturating_duration_since(Instant::now()), leads).await;
        drop(quiet);
        match led {
            Ok(Ok(_)) => Ok(()),
            _ => Err(TransferError::TimedOut { target }),
        }
    }

    /// Starts an election on this member (the target of a transfer).
    pub(super) async fn campaign(&self) -> Result<AdminResponse, StoreError> {
        tracing::info!(id = self.id(), "campaigning: leadership is being transferred here");
        self.inner.raft.trigger().elect().await.map_err(|e| StoreError::Unavailable(e.to_string()))?;
        Ok(AdminResponse::Done)
    }

    /// Waits until `target` lacks at most `behind` entries of this
    /// member's log.
    async fn wait_replicated(&self, target: NodeId, behind: u64, deadline: Instant) -> Result<(), TransferError> {
        let mut metrics = self.inner.raft.metrics();
        let left = deadline.saturating_duration_since(Instant::now());
        let caught_up = async {
            metrics
                .wait_for(|m| {
                    let last = m.last_log_index;
                    let matched =
                        m.replication.as_ref().and_then(|r| r.get(&target).cloned().flatten()).map(|l| l.index);
                    matches!((last, matched), (Some(last), Some(matched)) if matched + behind >= last)
                })
                .await
                .map(|_| ())
        };
        match tokio::time::timeout(left, caught_up).await {
            Ok(Ok(_)) => Ok(()),
            _ => Err(TransferError::TimedOut { target }),
        }
    }
}

/// The time an etcd client allows a request, from its `grpc-timeout`
/// header (`<digits><unit>`, unit one of `H M S m u n`).
pub fn grpc_timeout(value: &str) -> Option<Duration> {
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse_in_every_unit() {
        assert_eq!(grpc_timeout("4999m"), Some(Duration::from_millis(4999)));
        assert_eq!(grpc_timeout("5S"), Some(Duration::from_secs(5)));
        assert_eq!(grpc_timeout("2M"), Some(Duration::from_secs(120)));
        assert_eq!(grpc_timeout("100u"), Some(Duration::from_micros(100)));
        assert_eq!(grpc_timeout("5x"), None);
        assert_eq!(grpc_timeout(""), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hold_keeps_requests_waiting_until_it_is_released() {
        let (tx, mut hold) = Hold::new();
        tx.send_replace(true);
        let waiting = tokio::spawn(async move { hold.released().await });
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!waiting.is_finished(), "released while held");
        tx.send_replace(false);
        tokio::time::timeout(Duration::from_secs(1), waiting).await.expect("released").expect("task");
    }
}
