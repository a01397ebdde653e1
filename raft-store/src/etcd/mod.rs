//! The client-facing gRPC services: etcd's v3 API (KV, Watch, Cluster,
//! Maintenance), so that `etcdctl` and etcd client libraries work against
//! Skiff unchanged, and Skiff's own `Control` service.
//!
//! A request flows through [`convert`] (validation with etcd's rules and
//! wire types to [`crate::types`]), then to the [`Store`](crate::Store)
//! (write through Raft, or linearizable/serializable read), and back
//! through [`convert`] into a response carrying etcd's [`header`]. Every
//! failure becomes a `tonic::Status` in exactly one place, [`status`].

pub mod cluster;
pub mod control;
pub mod convert;
pub mod kv;
pub mod lease;
pub mod maintenance;
pub mod status;
pub mod watch;

use skiff_proto::etcdserverpb;

/// etcd's response header (cluster, member, revision, term) for `h`.
pub fn header(h: crate::store::Header) -> etcdserverpb::ResponseHeader {
    etcdserverpb::ResponseHeader {
        cluster_id: h.cluster_id,
        member_id: h.member_id,
        revision: h.revision,
        raft_term: h.raft_term,
    }
}
