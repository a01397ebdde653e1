//! Skiff's node agent: joins a worker to the cluster and runs the pods
//! bound to it in real containers, as the seed's kubelet does, through the
//! Container Runtime Interface (containerd, runc and CNI underneath).
//!
//! # Layout
//! - [`runtime`]: the `Runtime` trait, CRI-shaped, in Skiff's own types;
//!   `runtime::fake` is an in-memory runtime for tests with paused time;
//!   `runtime::cri` is the real one, a CRI v1 client over a unix socket.
//! - [`containerd`]: runs and supervises a private containerd per node (its
//!   own config, root, state and sockets under the node's data dir).
//! - [`images`]: OCI image archives written in Rust (busybox-based images
//!   and the pause image) and the import of `*.tar` archives into
//!   containerd, so pods run without a registry.
//! - [`cni`]: the node's CNI config (bridge, host-local, portmap) and the
//!   host routes and links around it.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cni;
pub mod containerd;
pub mod images;
pub mod runtime;
