//! The client runtime controllers, the scheduler and the node agent are
//! built on, in data-flow order (see the crate's "# Layout").

pub mod api;
pub mod config;
pub mod controller;
pub mod fake;
pub mod informer;
pub mod queue;
pub mod reflector;
pub mod watcher;
