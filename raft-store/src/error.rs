//! What a store operation can fail with, sorted by what the caller does
//! about it. The gRPC mapping lives in one place, `etcd::status`.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::mvcc::EngineError;
use crate::network::PeerError;
use crate::types::{ApplyError, NodeId};

/// What a store operation failed with. Local failures keep their cause
/// (`#[source]`); a failure that crossed the peer channel arrives as a
/// [`WireError`] and keeps the text its member gave it.
#[derive(Clone, Debug, thiserror::Error)]
pub enum StoreError {
    /// This member is not the leader; retry against `leader` (or later).
    #[error("etcdserver: not leader (leader is {leader:?})")]
    NotLeader { leader: Option<NodeId> },
    /// The cluster has no leader or the leader cannot be reached: retry later.
    #[error("etcdserver: no leader")]
    NoLeader,
    /// The request did not complete in time; it may still be applied.
    #[error("etcdserver: request timed out")]
    Timeout,
    /// The request itself was refused, identically on every member.
    #[error(transparent)]
    Apply(#[from] ApplyError),
    #[error("etcdserver: member not found")]
    MemberNotFound { id: NodeId },
    #[error("{reason}")]
    MemberExists { id: NodeId, reason: String },
    /// The database is over its quota (etcd's NOSPACE alarm).
    #[error("etcdserver: mvcc: database space exceeded")]
    NoSpace,
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    FailedPrecondition(String),
    /// This member is shutting down: retry on another.
    #[error("etcdserver: server stopped")]
    Stopped,
    /// A call to another member failed: retry.
    #[error(transparent)]
    Peer(#[from] PeerError),
    /// Raft could not carry out `operation` (no quorum, shutting down, ...): retry.
    #[error("raft {operation}: {source}")]
    Raft {
        operation: &'static str,
        #[source]
        source: Arc<dyn std::error::Error + Send + Sync>,
    },
    /// The storage engine failed.
    #[error("storage: {0}")]
    Engine(#[source] Arc<EngineError>),
    /// A blocking task (a RocksDB read) died.
    #[error("blocking task failed: {0}")]
    Task(#[source] Arc<tokio::task::JoinError>),
    /// Not available for a reason given in words (another member's, or a
    /// wait that ran out); retry.
    #[error("{0}")]
    Unavailable(String),
    /// A bug: an answer of the wrong kind, a missing result.
    #[error("{0}")]
    Internal(String),
}

impl StoreError {
    /// Whether retrying the same request (with the same id) may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            StoreError::NotLeader { .. }
                | StoreError::NoLeader
                | StoreError::Stopped
                | StoreError::Peer(_)
                | StoreError::Raft { .. }
                | StoreError::Unavailable(_)
        )
    }

    /// A failed Raft operation, keeping openraft's error as the source.
    pub fn raft(operation: &'static str, e: impl std::error::Error + Send + Sync + 'static) -> StoreError {
        StoreError::Raft { operation, source: Arc::new(e) }
    }
}

/// Two errors are equal when they are the same kind with the same text
/// (what a member on the other side of the peer channel could tell apart).
impl PartialEq for StoreError {
    fn eq(&self, other: &Self) -> bool {
        WireError::from(self) == WireError::from(other)
    }
}

impl From<EngineError> for StoreError {
    fn from(e: EngineError) -> Self {
        StoreError::Engine(Arc::new(e))
    }
}

impl From<tokio::task::JoinError> for StoreError {
    fn from(e: tokio::task::JoinError) -> Self {
        StoreError::Task(Arc::new(e))
    }
}

/// A [`StoreError`] as it crosses the peer channel (forwarded writes, read
/// index, admin requests): the kinds a caller acts on stay apart, the
/// causes become their text.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WireError {
    NotLeader { leader: Option<NodeId> },
    NoLeader,
    Timeout,
    Apply(ApplyError),
    MemberNotFound { id: NodeId },
    MemberExists { id: NodeId, reason: String },
    NoSpace,
    InvalidArgument(String),
    FailedPrecondition(String),
    Unavailable(String),
    Internal(String),
}

impl From<&StoreError> for WireError {
    fn from(e: &StoreError) -> Self {
        match e {
            StoreError::NotLeader { leader } => WireError::NotLeader { leader: *leader },
            StoreError::NoLeader => WireError::NoLeader,
            StoreError::Timeout => WireError::Timeout,
            StoreError::Apply(a) => WireError::Apply(a.clone()),
            StoreError::MemberNotFound { id } => WireError::MemberNotFound { id: *id },
            StoreError::MemberExists { id, reason } => WireError::MemberExists { id: *id, reason: reason.clone() },
            StoreError::NoSpace => WireError::NoSpace,
            StoreError::InvalidArgument(m) => WireError::InvalidArgument(m.clone()),
            StoreError::FailedPrecondition(m) => WireError::FailedPrecondition(m.clone()),
            StoreError::Stopped | StoreError::Peer(_) | StoreError::Raft { .. } | StoreError::Unavailable(_) => {
                WireError::Unavailable(e.to_string())
            }
            StoreError::Engine(_) | StoreError::Task(_) | StoreError::Internal(_) => WireError::Internal(e.to_string()),
        }
    }
}

impl From<WireError> for StoreError {
    fn from(e: WireError) -> Self {
        match e {
            WireError::NotLeader { leader } => StoreError::NotLeader { leader },
            WireError::NoLeader => StoreError::NoLeader,
            WireError::Timeout => StoreError::Timeout,
            WireError::Apply(a) => StoreError::Apply(a),
            WireError::MemberNotFound { id } => StoreError::MemberNotFound { id },
            WireError::MemberExists { id, reason } => StoreError::MemberExists { id, reason },
            WireError::NoSpace => StoreError::NoSpace,
            WireError::InvalidArgument(m) => StoreError::InvalidArgument(m),
            WireError::FailedPrecondition(m) => StoreError::FailedPrecondition(m),
            WireError::Unavailable(m) => StoreError::Unavailable(m),
            WireError::Internal(m) => StoreError::Internal(m),
        }
    }
}

/// A result as it goes over the peer channel.
pub(crate) fn to_wire<T: Clone>(r: &Result<T, StoreError>) -> Result<T, WireError> {
    r.clone().map_err(|e| WireError::from(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_cause_crosses_the_peer_channel_as_its_text_and_kind() {
        let local = StoreError::from(EngineError::Corrupt { cf: "kv", reason: "bad length".into() });
        assert!(std::error::Error::source(&local).is_some(), "the cause is kept locally");
        let remote = StoreError::from(WireError::from(&local));
        assert!(matches!(remote, StoreError::Internal(ref m) if m.contains("corrupt record in kv: bad length")));
        let stopped = StoreError::from(WireError::from(&StoreError::Stopped));
        assert!(stopped.is_retryable(), "a stopping member's refusal stays retryable on the other side");
        let leader = StoreError::from(WireError::from(&StoreError::NotLeader { leader: Some(3) }));
        assert!(matches!(leader, StoreError::NotLeader { leader: Some(3) }));
    }
}
