//! Skiff's client and client runtime, modelled on client-go and
//! kube-runtime.
//!
//! # Layout
//! - [`resources`]: the dynamic resource API (get, list, create, update,
//!   patch, delete, watch, history) on `serde_json::Value`s against any
//!   apiserver, failing over between endpoints, with errors as Kubernetes
//!   `Status` reasons.
//! - [`runtime::config`]: [`ClientConfig`], the connection settings every
//!   component takes, and the token bucket that paces writes.
//! - [`runtime::api`]: [`Api<K>`](runtime::api::Api), the typed API over
//!   k8s-openapi types.
//! - [`runtime::watcher`]: list then watch, as a state machine that
//!   relists on 410 and resumes after errors, as a stream of events.
//! - [`runtime::reflector`]: the watcher's events as an indexed cache, one
//!   [`Writer`](runtime::reflector::Writer) and cloneable
//!   [`Store`](runtime::reflector::Store)s.
//! - [`runtime::informer`]: shared informers, one watch and one cache per
//!   resource type per process, with change subscriptions.
//! - [`runtime::queue`]: the bounded, de-duplicating, rate-limited work
//!   queue.
//! - [`runtime::controller`]: the runner that feeds a queue from informers
//!   and hands keys to a reconcile function.
//! - [`runtime::events`]: Events about objects, spam-filtered.
//! - [`runtime::leader`]: leader election on a `coordination.k8s.io/v1`
//!   Lease.
//! - [`runtime::fake`]: an in-memory list/watch source for tests.

#![forbid(unsafe_code)]

pub mod join;
pub mod resources;
#[warn(missing_docs)]
pub mod runtime;

pub use resources::{Client, ClientError};
pub use runtime::config::ClientConfig;
