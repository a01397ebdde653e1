//! The client-facing gRPC services: etcd's v3 API (KV, Watch, Lease,
//! Cluster, Maintenance, Auth, and Lock and Election, which run etcd's
//! concurrency recipes on KV inside the server, see [`session`]), so that `etcdctl` and etcd client libraries work against
//! Skiff unchanged, and Skiff's own `Control` service.
//!
//! A request flows through [`convert`] (validation with etcd's rules and
//! wire types to [`crate::types`]), then to the [`Store`](crate::Store)
//! (write through Raft, or linearizable/serializable read), and back
//! through [`convert`] into a response carrying etcd's [`header`]. Every
//! failure becomes a `tonic::Status` in exactly one place, [`status`].

pub mod auth;
pub mod cluster;
pub mod control;
pub mod convert;
pub mod election;
pub mod kv;
pub mod lease;
pub mod lock;
pub mod maintenance;
pub mod session;
pub mod status;
pub mod watch;

use std::pin::Pin;

use futures::Stream;
use skiff_proto::etcdserverpb;
use tokio::sync::mpsc;
use tonic::Status;

/// A server stream of `T`.
pub type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// The responses queued on `rx`, until the member begins to stop: the
/// stream then ends with etcd's `Unavailable` "server stopped", which etcd
/// clients answer by reconnecting to another member.
pub fn until_stopping<T: Send + 'static>(
    store: &crate::Store,
    rx: mpsc::Receiver<Result<T, Status>>,
) -> ResponseStream<T> {
    let stopping = store.stopping();
    Box::pin(futures::stream::unfold(Some((rx, stopping)), |state| async move {
        let (mut rx, mut stopping) = state?;
        let item = tokio::select! {
            item = rx.recv() => item,
            _ = stopping.wait_for(|s| *s) => return Some((Err(Status::unavailable("etcdserver: server stopped")), None)),
        };
        item.map(|item| (item, Some((rx, stopping))))
    }))
}

/// etcd's response header (cluster, member, revision, term) for `h`.
pub fn header(h: crate::store::Header) -> etcdserverpb::ResponseHeader {
    etcdserverpb::ResponseHeader {
        cluster_id: h.cluster_id,
        member_id: h.member_id,
        revision: h.revision,
        raft_term: h.raft_term,
    }
}
