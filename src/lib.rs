//! The `skiff` package: thin binaries over the workspace's libraries.
//!
//! # Layout
//! - [`controller_manager`]: `skiff controller-manager`'s flags, which
//!   `skiff server` shares.
//! - [`node`]: `skiff node`'s flags.
//! - [`server`]: `skiff server`, a whole master host in one process,
//!   configured by flags or a YAML file.
//! - [`up`]: `skiff up`, a local cluster of master processes on loopback,
//!   with a kubeconfig and a live status line.

pub mod controller_manager;
pub mod node;
pub mod scheduler;
pub mod server;
pub mod up;

/// Parses a duration given as `500ms`, `2s`, `10m` or a bare number of
/// milliseconds.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    if let Ok(ms) = s.parse::<u64>() {
        return Ok(std::time::Duration::from_millis(ms));
    }
    humantime::parse_duration(s).map_err(|e| format!("invalid duration {s:?}: {e}"))
}
