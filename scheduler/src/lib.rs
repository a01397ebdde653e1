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
//! - `resources`: the quantity grammar; a pod's effective requests and a node's allocatable.
//! - `selector`: label selectors and node selector terms, parsed once.
//! - `framework`: `PodInfo` and `NodeInfo`, everything a decision reads, computed once.
//! - `cluster`: every node and placed pod, with the label and affinity-term indexes.
//! - `spread`: what topology spread counts, as questions the cluster answers from kept counts.
//! - `filters`: one function per filter, with kube's reasons; per-decision affinity and spread state.
//! - `scores`: one function per score, normalized 0..=100 as kube normalizes.
//! - `algorithm`: one decision (filter a sample, score, pick), `FitError`, weights and profile.
//! - `preemption`: which lower-priority pods to evict, on which node, when nothing fits.
//! - [`queue`]: the pending pods, by priority, with back-off for pods that
//!   failed and a pool for pods that fit nowhere until the cluster changes
//!   in a way that may help them (queueing hints).
//! - [`run`]: `run(config, shutdown)`: leader election, informers, and the
//!   scheduling loop that owns the cache; binding off the loop.
//! - [`config`]: what `skiff scheduler` takes; the profile file.
//! - [`cache`]: the cluster as the loop sees it, with assumed pods.
//! - [`metrics`]: attempts, latencies, pending pods; `/metrics`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod algorithm;
pub mod cache;
pub mod cluster;
pub mod config;
pub mod filters;
pub mod framework;
pub mod metrics;
pub mod preemption;
pub mod queue;
pub mod resources;
pub mod run;
pub mod scores;
pub mod selector;
pub mod spread;
#[cfg(test)]
mod testkit;

pub use algorithm::{schedule, FitError, Placement, Profile, Weights};
pub use cluster::Cluster;
pub use config::SchedulerConfig;
pub use framework::{NodeInfo, PodInfo};
pub use preemption::{failure_message, preempt, Preemption};
pub use resources::{parse_quantity, QuantityError, Resources};
pub use run::{run, RunError};
