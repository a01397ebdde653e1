//! Skiff's node agent: joins a worker to the cluster and runs the pods
//! bound to it in real containers, as the seed's kubelet does, through the
//! Container Runtime Interface (containerd, runc and CNI underneath).
//!
//! # Layout
//! - [`runtime`]: the `Runtime` trait, CRI-shaped, in Skiff's own types;
//!   `runtime::fake` is an in-memory runtime for tests with paused time.
//! - [`pod`]: the pod workers: one task per pod syncing its spec to the
//!   runtime (sandbox, images, init/sidecar/main containers, probes,
//!   hooks, restarts, termination) and reporting status and events.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod pod;
pub mod runtime;
