//! The apiserver's configuration.

use std::time::Duration;

use skiff_raft_store::StoreConfig;

#[derive(Clone, Debug)]
pub struct ApiserverConfig {
    pub store: StoreConfig,
    pub peer_listen: String,
    pub client_listen: String,
    pub http_listen: String,
    /// How often watchers that asked for progress notifications get one.
    pub watch_progress_interval: Duration,
    /// How often resource watchers that allow bookmarks get one.
    pub watch_bookmark_interval: Duration,
}
