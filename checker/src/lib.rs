//! History checkers for Skiff's chaos suite. The chaos test records what its
//! clients did and saw; these pure functions decide whether that history is
//! one a correct Skiff could have produced.
//!
//! # Layout
//! - [`history`]: the recorded operations ([`Op`], [`OpKind`], [`Outcome`]), serde JSON.
//! - [`revisions`]: cheap revision evidence per key (real-time order of revisions, stale reads).
//! - [`linearizability`]: per-key linearizability of the KV register, with a budget and shrinking.
//! - [`watch`]: etcd-style watch guarantees (ordered, unique, atomic, reliable, resumable,
//!   bookmarkable, valid) over watchers' event logs.
//! - [`resource`]: the simpler watch check for the Kubernetes resource API.
//! - [`verdict`]: [`Verdict`], [`Violation`] and what kind of guarantee each breaks.
//! - [`report`]: the run's [`Report`]: operations, faults, failover times, violations.
//! - [`error`]: [`CheckerError`], for input that cannot be checked.

#![forbid(unsafe_code)]

pub mod error;
pub mod history;
pub mod linearizability;
pub mod report;
pub mod resource;
pub mod revisions;
pub mod verdict;
pub mod watch;

pub use error::CheckerError;
pub use history::{validate_history, Op, OpKind, Outcome};
pub use linearizability::{check_key, check_kv, Budget, KvCheck};
pub use report::{Failover, Fault, OperationStats, Report};
pub use resource::{check_resource_watch, ObjectWrite, ResourceEvent, ResourceEventType};
pub use revisions::check_revisions;
pub use verdict::{Unknown, Verdict, Violation, ViolationKind};
pub use watch::{check_watches, store_writes, KeyRange, StoreWrite, WatchEntry, WatchEvent, WatchLog};
