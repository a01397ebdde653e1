//! Skiff's protobuf types and gRPC service stubs.
//!
//! Everything here is generated at build time (see `build.rs`) from the
//! `.proto` files under `proto/proto/`, compiled with the pure-Rust `protox`
//! compiler and `tonic-build`. This crate performs no I/O of its own; it only
//! exposes message types, tonic clients and tonic server traits.
//!
//! # Layout
//!
//! - [`mvccpb`]: etcd's `mvccpb` package (`KeyValue`, `Event`), wire-compatible
//!   with etcd's `api/mvccpb/kv.proto`.
//! - [`authpb`]: etcd's `authpb` package (`User`, `Role`, `Permission`).
//! - [`etcdserverpb`]: the subset of etcd's `etcdserverpb` package Skiff
//!   serves: the `KV`, `Watch`, `Lease`, `Cluster`, `Maintenance` and `Auth`
//!   services (no `Downgrade`) with all of their request/response messages,
//!   wire-compatible with etcd's `api/etcdserverpb/rpc.proto`.
//! - [`v3lockpb`], [`v3electionpb`]: etcd's Lock and Election services,
//!   wire-compatible with etcd's `v3lock.proto` and `v3election.proto`.
//! - [`peer`]: Skiff's internal `skiff.peer.Peer` service used between
//!   apiserver replicas for Raft RPCs and request forwarding. Each RPC carries
//!   an opaque [`peer::Payload`] whose bytes are bincode-encoded openraft /
//!   Skiff types.
//! - [`control`] (defined as `skiff::control`): Skiff's own client-facing
//!   `skiff.control.Control` service (`History`, `Join`).
//! - [`resource`]: the `skiff.resource.Resources` service: Kubernetes objects
//!   (as JSON) with get, list, watch, writes, history.
//! - [`bootstrap`]: `skiff.bootstrap.Bootstrap`, how a node joins with a
//!   join token: the cluster's CA, then a certificate for the node.
//! - [`cri`]: the subset of Kubernetes' CRI v1 (`runtime.v1`) the node
//!   agent uses, `RuntimeService` and `ImageService` clients, with CRI's
//!   names and field numbers (kubernetes/cri-api's `api.proto`).

/// etcd `mvccpb` package: key-value and watch-event messages.
#[allow(missing_docs, clippy::all, clippy::pedantic, rustdoc::all)]
pub mod mvccpb {
    tonic::include_proto!("mvccpb");
}

/// etcd `authpb` package: users, roles and key permissions.
#[allow(missing_docs, clippy::all, clippy::pedantic, rustdoc::all)]
pub mod authpb {
    tonic::include_proto!("authpb");
}

/// etcd `etcdserverpb` package: KV, Watch, Lease, Cluster, Maintenance and
/// Auth services and their messages.
#[allow(missing_docs, clippy::all, clippy::pedantic, rustdoc::all)]
pub mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
}

/// etcd `v3lockpb` package: the Lock service (locks held with a lease).
#[allow(missing_docs, clippy::all, clippy::pedantic, rustdoc::all)]
pub mod v3lockpb {
    tonic::include_proto!("v3lockpb");
}

/// etcd `v3electionpb` package: the Election service (leadership held with
/// a lease).
#[allow(missing_docs, clippy::all, clippy::pedantic, rustdoc::all)]
pub mod v3electionpb {
    tonic::include_proto!("v3electionpb");
}

/// Skiff `skiff.peer` package: inter-replica Raft and forwarding service.
#[allow(missing_docs, clippy::all, clippy::pedantic, rustdoc::all)]
pub mod peer {
    tonic::include_proto!("skiff.peer");
}

/// Namespace mirroring the `skiff.*` protobuf packages that refer to other
/// packages. Generated code for `skiff.control` names etcd types as
/// `super::super::etcdserverpb::…`, so it must sit two modules below the crate
/// root; use it through the [`control`] re-export.
pub mod skiff {
    /// Skiff `skiff.control` package: Skiff's own client-facing calls.
    #[allow(missing_docs, clippy::all, clippy::pedantic, rustdoc::all)]
    pub mod control {
        tonic::include_proto!("skiff.control");
    }
}

/// Skiff `skiff.resource` package: Kubernetes objects over gRPC.
#[allow(missing_docs, clippy::all, clippy::pedantic, rustdoc::all)]
pub mod resource {
    tonic::include_proto!("skiff.resource");
}

/// Skiff `skiff.bootstrap` package: joining with a join token.
#[allow(missing_docs, clippy::all, clippy::pedantic, rustdoc::all)]
pub mod bootstrap {
    tonic::include_proto!("skiff.bootstrap");
}

/// Kubernetes' CRI v1 package `runtime.v1`: the `RuntimeService` and
/// `ImageService` calls the node agent makes to containerd.
#[allow(missing_docs, clippy::all, clippy::pedantic, rustdoc::all)]
pub mod cri {
    tonic::include_proto!("runtime.v1");
}

pub use skiff::control;
