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
//! # Wiring the workload controllers
//! - ReplicaSet / ReplicationController: key `namespace/name`; call
//!   `replicaset::reconcile(&rs, &pods_in_namespace, &expectations, now)`.
//!   Pod events lower the shared [`Expectations`]: an added pod whose
//!   controller ([`ownership::owner_key`]) is the set → `creation_observed`;
//!   a deleted pod, or one that just got a `deletionTimestamp` →
//!   `deletion_observed(key, uid)`; then enqueue the owner (orphans: every
//!   set whose selector matches). A runner failure hands the actions not
//!   carried out to `actions_skipped`; a deleted set → `forget`.
//! - Deployment: `deployment::reconcile(&d, &sets_in_namespace,
//!   &pods_in_namespace, now)`; ReplicaSet events enqueue the owning
//!   Deployment (`owner_key(.., "Deployment")`), pod deletions too (Recreate
//!   waits for old pods to go). No expectations: every ReplicaSet write is
//!   a compare-and-swap `Update` or a deterministic-name `Create`.
//!
//! # Layout
//! - [`manager`]: `run(config, shutdown)`: leader election, shared
//!   informers, and each controller's wiring to its logic.
//! - [`config`]: what `skiff controller-manager` takes; `--controllers`.
//! - [`action`]: the writes a reconcile asks for, shared by every controller.
//! - [`metrics`]: queue depth, reconciles, retries, leadership; `/metrics`
//!   and `/healthz`.
//! - [`execute`]: carries actions out against the API; Events through a
//!   spam-filtering [`execute::Recorder`].
//! - [`ownership`]: controller references; adoption and release.
//! - [`pod_state`]: active, ready and available pods; which to delete first.
//! - [`expectations`]: the creates and deletes a controller still waits to
//!   see, so a lagging cache never makes it act twice.
//! - [`replicaset`]: the ReplicaSet controller, and the core it shares with
//!   [`replication`], the ReplicationController controller.
//! - [`deployment`]: the Deployment controller: ReplicaSets per template,
//!   rolling and recreate rollouts, history.
//! - [`namespace`]: empties a terminating namespace, then finalizes it.
//! - [`serviceaccount`]: a `default` ServiceAccount in every namespace.
//! - [`root_ca`]: the cluster CA as `kube-root-ca.crt` in every namespace.
//! - [`garbage_collector`]: the owner graph; deletes dependents of gone
//!   owners, foreground deletion, orphaning.
//! - [`endpoints`]: a selector Service's Endpoints from its pods.
//! - [`endpointslice`]: a selector Service's EndpointSlices from its pods.
//! - [`servicelb`]: a LoadBalancer Service's `status.loadBalancer` from the
//!   Ready nodes' addresses, where every node's proxy takes its traffic.
//! - [`podgc`]: deletes terminated pods over a threshold and orphaned pods.
//! - [`node_ipam`]: a pod CIDR per node from the cluster CIDR.
//! - [`node_lifecycle`]: node health from Leases, NoExecute taints, taint
//!   based eviction at a rate limit.
//! - [`job`]: Jobs: pods up to parallelism and completions, backoff and
//!   deadline failures, Indexed completion, suspend, TTL after finishing.
//! - [`cronjob`]: CronJobs: Jobs at the times of a cron schedule in a time
//!   zone, concurrency policy, missed starts, history limits.
//! - [`daemonset`]: DaemonSets: one pod per eligible node, placed by node
//!   affinity, rolling or on-delete updates.
//! - [`resourcequota`]: ResourceQuotas: `status.used` summed from the
//!   namespace's objects.
//! - [`disruption`]: PodDisruptionBudgets: healthy, desired and expected
//!   pods, and how many more may be evicted.

#![forbid(unsafe_code)]

pub mod action;
pub mod config;
pub mod cronjob;
pub mod daemonset;
pub mod deployment;
pub mod disruption;
pub mod endpoints;
pub mod endpointslice;
pub mod execute;
pub mod expectations;
pub mod garbage_collector;
pub mod job;
pub mod manager;
pub mod metrics;
pub mod namespace;
pub mod node_ipam;
pub mod node_lifecycle;
pub mod ownership;
pub mod pod_state;
pub mod podgc;
pub mod replicaset;
pub mod replication;
pub mod resourcequota;
pub mod root_ca;
pub mod serviceaccount;
pub mod servicelb;

pub use action::{Action, Reconciled};
pub use expectations::Expectations;
pub use manager::{run, RunError};
