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
//! - [`run`]: `run(config, shutdown)`: leader election, informers, and the
//!   scheduling loop that owns the cache; binding off the loop.
//! - [`config`]: what `skiff scheduler` takes; the profile file.
//! - [`cache`]: the cluster as the loop sees it, with assumed pods.
//! - [`metrics`]: attempts, latencies, pending pods; `/metrics`.

pub mod cache;
pub mod config;
pub mod metrics;
pub mod run;

pub use config::SchedulerConfig;
pub use run::{run, RunError};
