//! Skiff's controller manager: every controller that keeps a resource at
//! its desired state, leader-elected, talking to any apiserver over gRPC.
//!
//! Each controller is split in two. Its logic is a pure function from what
//! the caches hold (the object, what it owns, the time) to the [`Action`]s
//! that would bring the cluster to the desired state; unit tests drive it
//! with plain values and paused time. Its wiring (informers, work queue,
//! the runner from `skiff_client::runtime`) feeds that function from the
//! caches and carries the actions out against the API.
//!
//! # Layout
//! - [`action`]: the writes a reconcile asks for, shared by every controller.
//! - [`namespace`]: empties a terminating namespace, then finalizes it.
//! - [`serviceaccount`]: a `default` ServiceAccount in every namespace.
//! - [`garbage_collector`]: the owner graph; deletes dependents of gone
//!   owners, foreground deletion, orphaning.
//! - [`endpoints`]: a selector Service's Endpoints from its pods.
//! - [`endpointslice`]: a selector Service's EndpointSlices from its pods.
//! - [`podgc`]: deletes terminated pods over a threshold and orphaned pods.
//! - [`node_ipam`]: a pod CIDR per node from the cluster CIDR.
//! - [`node_lifecycle`]: node health from Leases, NoExecute taints, taint
//!   based eviction at a rate limit.

#![forbid(unsafe_code)]

pub mod action;
pub mod endpoints;
pub mod endpointslice;
pub mod garbage_collector;
pub mod namespace;
pub mod node_ipam;
pub mod node_lifecycle;
pub mod podgc;
pub mod serviceaccount;

pub use action::Action;
