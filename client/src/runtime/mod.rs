//! The client runtime controllers, the scheduler and the node agent are
//! built on, in data-flow order: connection settings, the typed API, the
//! watcher, the reflector cache, shared informers, the work queue, the
//! controller runner, and leader election (see the crate's "# Layout").

pub mod api;
pub mod config;
pub mod controller;
pub mod events;
pub mod fake;
pub mod informer;
pub mod leader;
pub mod queue;
pub mod reflector;
pub mod watcher;
