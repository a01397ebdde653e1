//! The types that travel through the Raft log and come back out of `apply`.
//!
//! A Raft entry carries one [`Batch`]: the leader's commit timestamp and every
//! proposal its batcher drained at that moment. Each write transaction in the
//! batch becomes its own MVCC revision; blank and membership entries never
//! bump the revision.

use std::fmt;
use std::io::Cursor;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// A member's Raft id. Ids are small integers chosen by the operator.
pub type NodeId = u64;

/// A member as openraft knows it: the address of its peer (Raft) listener.
pub type Node = openraft::BasicNode;

openraft::declare_raft_types!(
    /// Skiff's Raft type configuration.
    pub TypeConfig:
        D = Batch,
        R = BatchResponse,
        NodeId = NodeId,
        Node = Node,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = tokio::fs::File,
        AsyncRuntime = openraft::TokioRuntime,
        Responder = openraft::impls::OneshotResponder<TypeConfig>,
);

/// Keeps `Cursor` in scope for the storage test suite's in-memory helpers.
#[doc(hidden)]
pub type MemorySnapshot = Cursor<Vec<u8>>;

pub type Raft = openraft::Raft<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type StoredMembership = openraft::StoredMembership<NodeId, Node>;
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, Node>;
pub type StorageError = openraft::StorageError<NodeId>;
pub type Entry = openraft::Entry<TypeConfig>;

/// Wall-clock milliseconds since the epoch (0 if the clock is before it).
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Identifies one client write across forwarding and retries, so that a
/// write retried after a failover is applied at most once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RequestId(pub u128);

impl RequestId {
    /// A fresh id: the proposing member's clock (ms since the epoch) in the
    /// high 64 bits and 64 random bits below. Ids therefore sort by age, so
    /// the state machine forgets old ones with one range deletion; two ids
    /// collide only if made in the same millisecond with the same 64 bits.
    pub fn fresh() -> Self {
        RequestId::at(now_ms(), rand::random())
    }

    /// The id made at `created_ms` with low bits `nonce`.
    pub fn at(created_ms: u64, nonce: u64) -> Self {
        RequestId((u128::from(created_ms) << 64) | u128::from(nonce))
    }

    /// When (ms since the epoch, on the proposing member's clock) the id was made.
    pub fn created_ms(self) -> u64 {
        (self.0 >> 64) as u64
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// The payload of one Raft entry.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Batch {
    /// Wall-clock milliseconds on the leader when it proposed the batch: the
    /// commit time recorded for every revision the batch creates.
    pub timestamp_ms: u64,
    /// Shared, not owned: openraft reads every entry back from the log to
    /// apply and to replicate it, and the log's in-memory tail hands out
    /// entries by reference count (`log_store.rs`). Encoded as a plain
    /// sequence, as the `Vec` it once was.
    pub proposals: Arc<[Proposal]>,
}

impl fmt::Display for Batch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Batch({} proposals @{})", self.proposals.len(), self.timestamp_ms)
    }
}

/// One client write with its id.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Proposal {
    pub id: RequestId,
    pub command: Command,
}

/// A replicated command.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Command {
    /// An etcd transaction; `Put` and `DeleteRange` travel as one-op txns.
    Txn(Txn),
    /// Compact history below `revision`.
    Compact { revision: i64 },
    /// A member announces its name and client URLs.
    PublishMember(MemberInfo),
    /// Create lease `id` (chosen by the member that took the request).
    LeaseGrant { id: i64, ttl_seconds: i64 },
    /// Delete lease `id` and every key attached to it, in one revision.
    /// Proposed by a client, or by the leader when the lease expires.
    LeaseRevoke { id: i64 },
    /// Raise (`raise: true`) or clear an alarm for the whole cluster.
    Alarm { alarm: Alarm, raise: bool },
    /// A change to the auth store (users, roles, the enabled switch).
    /// Passwords travel as bcrypt hashes only.
    Auth(crate::auth::AuthCommand),
}

impl Command {
    /// Whether the command can grow the database: refused while a NOSPACE
    /// alarm is raised. Deletes, revokes and compactions are what frees
    /// space, so they pass (etcd's capped applier draws the same line).
    pub fn adds_data(&self) -> bool {
        fn txn_puts(t: &Txn) -> bool {
            t.success.iter().chain(&t.failure).any(|op| match op {
                Op::Put(_) => true,
                Op::Txn(t) => txn_puts(t),
                _ => false,
            })
        }
        match self {
            Command::Txn(t) => txn_puts(t),
            Command::LeaseGrant { .. } => true,
            Command::Compact { .. }
            | Command::PublishMember(_)
            | Command::LeaseRevoke { .. }
            | Command::Alarm { .. }
            | Command::Auth(_) => false,
        }
    }
}

/// The alarms Skiff raises. etcd also has CORRUPT; Skiff never raises it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum AlarmKind {
    /// A member's database is over `--quota-backend-bytes`.
    NoSpace,
}

/// A raised alarm: replicated, so every member lists and enforces the same
/// set, as etcd's alarm store does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Alarm {
    /// The member whose condition raised it.
    pub member: NodeId,
    pub kind: AlarmKind,
}

/// What a member announces about itself through the log.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberInfo {
    pub id: NodeId,
    pub name: String,
    pub peer_urls: Vec<String>,
    pub client_urls: Vec<String>,
    /// Random per data directory: a wiped member comes back with a new one,
    /// which is how the cluster recognises and refuses it.
    pub incarnation: u64,
}

/// etcd's `TxnRequest`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Txn {
    pub compare: Vec<Compare>,
    pub success: Vec<Op>,
    pub failure: Vec<Op>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Compare {
    pub result: CompareResult,
    pub target: CompareTarget,
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    /// Empty: compare `key` alone; otherwise every key in `[key, range_end)`.
    #[serde(with = "serde_bytes")]
    pub range_end: Vec<u8>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CompareResult {
    Equal,
    Greater,
    Less,
    NotEqual,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum CompareTarget {
    Version(i64),
    CreateRevision(i64),
    ModRevision(i64),
    Value(#[serde(with = "serde_bytes")] Vec<u8>),
    Lease(i64),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Op {
    Range(RangeRequest),
    Put(PutRequest),
    DeleteRange(DeleteRequest),
    Txn(Txn),
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum SortOrder {
    #[default]
    None,
    Ascend,
    Descend,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum SortTarget {
    #[default]
    Key,
    Version,
    Create,
    Mod,
    Value,
}

/// etcd's `RangeRequest`, minus `serializable` (a property of how the read
/// is served, not of the read).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RangeRequest {
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    #[serde(with = "serde_bytes")]
    pub range_end: Vec<u8>,
    pub limit: i64,
    pub revision: i64,
    pub sort_order: SortOrder,
    pub sort_target: SortTarget,
    pub keys_only: bool,
    pub count_only: bool,
    pub min_mod_revision: i64,
    pub max_mod_revision: i64,
    pub min_create_revision: i64,
    pub max_create_revision: i64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PutRequest {
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
    pub lease: i64,
    pub prev_kv: bool,
    pub ignore_value: bool,
    pub ignore_lease: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DeleteRequest {
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    #[serde(with = "serde_bytes")]
    pub range_end: Vec<u8>,
    pub prev_kv: bool,
}

/// etcd's `mvccpb.KeyValue`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyValue {
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    pub create_revision: i64,
    pub mod_revision: i64,
    pub version: i64,
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
    pub lease: i64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RangeResult {
    pub kvs: Vec<KeyValue>,
    pub more: bool,
    pub count: i64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum OpResult {
    Range(RangeResult),
    Put { prev_kv: Option<KeyValue> },
    DeleteRange { deleted: i64, prev_kvs: Vec<KeyValue> },
    Txn(TxnResult),
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TxnResult {
    pub succeeded: bool,
    pub responses: Vec<OpResult>,
}

/// The outcome of one proposal.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Output {
    /// `revision` is the store revision after the transaction.
    Txn {
        result: TxnResult,
        revision: i64,
    },
    Compacted {
        revision: i64,
    },
    Published,
    LeaseGranted {
        id: i64,
        ttl_seconds: i64,
    },
    /// `revision`: the store revision after the attached keys were deleted.
    LeaseRevoked {
        revision: i64,
    },
    /// The alarms the command raised or cleared (empty: nothing changed).
    Alarm {
        changed: Vec<Alarm>,
    },
    /// The auth store's revision after the command.
    Auth {
        revision: u64,
    },
}

impl Output {
    /// The store revision the command left, for the outputs that have one.
    pub fn revision(&self) -> Option<i64> {
        match self {
            Output::Txn { revision, .. } | Output::Compacted { revision } | Output::LeaseRevoked { revision } => {
                Some(*revision)
            }
            _ => None,
        }
    }
}

/// A deterministic, replicated failure of one proposal: every member
/// computes the same one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ApplyError {
    #[error("etcdserver: mvcc: required revision has been compacted")]
    Compacted { compacted: i64 },
    #[error("etcdserver: mvcc: required revision is a future revision")]
    FutureRevision { current: i64 },
    #[error("etcdserver: key not found")]
    KeyNotFound,
    #[error("etcdserver: duplicate key given in txn request")]
    DuplicateKey,
    #[error("etcdserver: requested lease not found")]
    LeaseNotFound { id: i64 },
    #[error("etcdserver: lease already exists")]
    LeaseExists { id: i64 },
    /// A NOSPACE alarm is raised: writes that add data are refused.
    #[error("etcdserver: mvcc: database space exceeded")]
    NoSpace,
    /// The auth store refused the change.
    #[error(transparent)]
    Auth(#[from] crate::auth::AuthError),
}

pub type ProposalResult = Result<Output, ApplyError>;

/// The response of one Raft entry: one result per proposal, in order.
/// Blank and membership entries answer with an empty list.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BatchResponse {
    pub results: Vec<ProposalResult>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Logs and snapshots written while `proposals` was a `Vec` read back
    /// the same, and new entries encode as they did.
    #[test]
    fn a_batch_encodes_its_proposals_as_the_vec_it_once_was() {
        #[derive(Serialize, Deserialize)]
        struct VecBatch {
            timestamp_ms: u64,
            proposals: Vec<Proposal>,
        }
        let proposals: Vec<Proposal> = (0..3u64)
            .map(|n| Proposal {
                id: RequestId::at(n, n),
                command: Command::Txn(Txn {
                    success: vec![Op::Put(PutRequest {
                        key: format!("k{n}").into_bytes(),
                        value: vec![n as u8; 10],
                        ..Default::default()
                    })],
                    ..Default::default()
                }),
            })
            .collect();
        let shared = Batch { timestamp_ms: 7, proposals: proposals.clone().into() };
        let owned = VecBatch { timestamp_ms: 7, proposals };
        assert_eq!(bincode::serialize(&shared).unwrap(), bincode::serialize(&owned).unwrap());
        let back: Batch = bincode::deserialize(&bincode::serialize(&owned).unwrap()).unwrap();
        assert_eq!(back, shared);
    }
}
