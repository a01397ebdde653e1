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
//! - [`expectations`]: creates and deletes asked for and not yet seen in the
//!   cache, per owner, so a lagging cache never doubles a write.
//! - [`job`]: Jobs: pods up to parallelism and completions, backoff and
//!   deadline failures, Indexed completion, suspend, TTL after finishing.
//! - [`cronjob`]: CronJobs: Jobs at the times of a cron schedule in a time
//!   zone, concurrency policy, missed starts, history limits.
//! - [`daemonset`]: DaemonSets: one pod per eligible node, placed by node
//!   affinity, rolling or on-delete updates.
//! - [`resourcequota`]: ResourceQuotas: `status.used` summed from the
//!   namespace's objects.

#![forbid(unsafe_code)]

pub mod action;
pub mod cronjob;
pub mod daemonset;
pub mod expectations;
pub mod job;
pub mod resourcequota;

pub use action::Action;
