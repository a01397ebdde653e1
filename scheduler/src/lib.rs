//! Skiff's scheduler: decides the node of every pod whose
//! `spec.schedulerName` is this scheduler's, in two phases as the seed
//! describes them. Filters rule nodes out (resources, ports, node
//! selectors and affinity, taints, inter-pod affinity, topology spread);
//! scores rank the nodes left (least requested, balanced allocation,
//! spreading, preferred affinities, taint toleration). A pod that fits
//! nowhere may preempt lower-priority pods.
//!
//! The scheduling loop owns the cache: informer changes and binding
//! outcomes are applied to it between two decisions, so a decision reads
//! the nodes without locks, and a pod assumed onto a node counts there
//! before the watch shows it bound. Binding runs off the loop.
//!
//! # Layout
//! - [`queue`]: the pending pods, by priority, with back-off for pods that
//!   failed and a pool for pods that fit nowhere until the cluster changes.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod queue;
