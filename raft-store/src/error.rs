//! What a store operation can fail with, sorted by what the caller does
//! about it. The gRPC mapping lives in one place, `etcd::status`.

use serde::{Deserialize, Serialize};

use crate::types::{ApplyError, NodeId};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
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
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Internal(String),
}

impl StoreError {
    /// Whether retrying the same request (with the same id) may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::NotLeader { .. } | StoreError::NoLeader | StoreError::Unavailable(_))
    }
}
