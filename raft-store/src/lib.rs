//! Skiff's replicated store: etcd's MVCC data model on RocksDB, replicated
//! with openraft, served through etcd-compatible gRPC services.
//!
//! # Layout
//! In data-flow order, from a client's request to disk and back:
//! - [`etcd`]: the etcd v3 gRPC services (KV, Watch, Cluster, Maintenance,
//!   Auth) and Skiff's `Control` service, translating wire types.
//! - [`auth`]: etcd's users, roles and key-range permissions (replicated in
//!   the state machine) and this member's auth tokens.
//! - [`store`]: one member, the façade every other crate uses: write
//!   batching and forwarding, linearizable reads, history and change feeds,
//!   membership administration, leases, bootstrap, upkeep; one submodule
//!   per concern.
//! - [`changes`]: a key's history and the change feeds (live revisions with
//!   catch-up from RocksDB) that watchers follow.
//! - [`join`]: the client side of joining a running cluster.
//! - [`network`] and [`peer`]: the peer channel (Raft RPCs, forwarding).
//! - `log_store`: the Raft log on its own RocksDB instance.
//! - `state_machine`: applies entries to the MVCC engine, snapshots.
//! - `mvcc` (with `latest`, its cache of newest records): the MVCC engine
//!   (revisions, history, compaction, reads).
//! - `lessor`: the leader's lease expiry clocks.
//! - `hub`: fan-out of applied revisions to change feeds.
//! - [`metrics`]: Prometheus counters and histograms of the above.
//! - [`types`] and [`error`]: what travels through the log, and failures.
//!
//! Only `etcd`, `auth`, `store`, `changes`, `join`, the peer channel, `metrics`,
//! `types` and `error` are public: the engine, the log and the state
//! machine are reached through [`Store`]. Their tests against a model and
//! openraft's storage suite live in the crate (`tests`).

// tonic's `Status` and openraft's `StorageError` are the frameworks' own
// error types; boxing them at every call would only add noise.
#![allow(clippy::result_large_err)]

pub mod auth;
pub mod changes;
pub mod error;
pub mod etcd;
pub(crate) mod hub;
pub mod join;
pub(crate) mod latest;
pub(crate) mod lessor;
pub(crate) mod log_store;
pub mod metrics;
pub(crate) mod mvcc;
pub mod network;
pub mod peer;
pub(crate) mod state_machine;
pub mod store;
pub mod types;

#[cfg(test)]
mod tests;

pub use changes::{Changes, ChangesError, ChangesSince, Event, EventKind, History, HistoryEntry, RevisionEvents};
pub use error::StoreError;
pub use store::{Store, StoreConfig};
