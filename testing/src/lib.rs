//! Test support any Skiff crate's tests can use (a dev-dependency only).
//!
//! # Layout
//! - [`port`]: [`free_port`], a loopback port for a member to listen on,
//!   for in-process members and real `skiff` processes alike.
//! - [`cluster`]: [`InProcessCluster`], n apiserver members in the test's
//!   own process, with [`must_leader`](InProcessCluster::must_leader),
//!   `kill`, `restart`, and `partition`/`heal` through the peer transport's
//!   filter (raft-store's `PeerFilter`), so partitions need no root and no
//!   network namespaces.
//! - [`wait`]: [`must_eventually`], the one bounded poll for conditions
//!   that become true in their own time.
//!
//! Tests of real `skiff` processes (SIGKILL, network namespaces, the
//! real etcdctl and kubectl) live in the workspace's `tests/` and take
//! their ports from here too.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cluster;
pub mod port;
pub mod wait;

pub use cluster::InProcessCluster;
pub use port::free_port;
pub use wait::must_eventually;
