//! What `run` needs: where the apiservers are, the lease, the profile
//! (filters' and scores' settings) and the queue's timings.
//!
//! Weights and the sampling of nodes can also come from a file in the
//! spirit of KubeSchedulerConfiguration ([`ProfileFile`]), so one
//! scheduler binary serves clusters of very different sizes.

use std::net::SocketAddr;
use std::path::Path;

use serde::Deserialize;
use skiff_client::runtime::leader::LeaderElectionConfig;

use crate::algorithm::{Profile, Weights};
use crate::queue::QueueConfig;

/// The Lease every scheduler instance competes for, as Kubernetes names it.
pub const LEASE_NAMESPACE: &str = "kube-system";
pub const LEASE_NAME: &str = "kube-scheduler";

#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Apiservers' client addresses; any of them will do.
    pub servers: Vec<String>,
    /// `/metrics` and `/healthz`; none when `None`.
    pub http: Option<SocketAddr>,
    /// Act only while holding the Lease; `None` acts at once (one instance).
    pub leader_election: Option<LeaderElectionConfig>,
    pub profile: Profile,
    pub queue: QueueConfig,
    /// Bindings in flight at once; the loop waits for a slot beyond it.
    pub parallel_binds: usize,
    /// Writes per second to the apiserver; 0 leaves them unthrottled.
    pub kube_api_qps: f64,
    pub kube_api_burst: u32,
}

impl SchedulerConfig {
    /// One instance among others for `servers`, named `identity` in the
    /// Lease, with Kubernetes' defaults.
    pub fn new(servers: Vec<String>, identity: &str) -> SchedulerConfig {
        SchedulerConfig {
            servers,
            http: None,
            leader_election: Some(LeaderElectionConfig::new(LEASE_NAMESPACE, LEASE_NAME, identity)),
            profile: Profile::default(),
            queue: QueueConfig::default(),
            parallel_binds: 256,
            kube_api_qps: 0.0,
            kube_api_burst: 0,
        }
    }
}

/// Why a profile file was refused.
#[derive(Debug, thiserror::Error)]
pub enum ProfileFileError {
    #[error("scheduler config {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("scheduler config {path}: {reason}")]
    Parse { path: String, reason: String },
}

/// The file `--config` names (YAML or JSON), a subset of
/// KubeSchedulerConfiguration's fields under its own names:
///
/// ```yaml
/// schedulerName: default-scheduler
/// percentageOfNodesToScore: 20
/// weights: {NodeResourcesFit: 1, BalancedAllocation: 1, TaintToleration: 3}
/// ```
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProfileFile {
    pub scheduler_name: Option<String>,
    pub percentage_of_nodes_to_score: Option<u32>,
    #[serde(default)]
    pub weights: std::collections::BTreeMap<String, i64>,
}

impl ProfileFile {
    pub fn load(path: &Path) -> Result<ProfileFile, ProfileFileError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ProfileFileError::Read { path: shown.clone(), source })?;
        ProfileFile::parse(&text).map_err(|reason| ProfileFileError::Parse { path: shown, reason })
    }

    pub fn parse(text: &str) -> Result<ProfileFile, String> {
        serde_yaml::from_str(text).map_err(|e| e.to_string())
    }

    /// `profile` with this file's settings over it.
    pub fn apply(&self, profile: &mut Profile) -> Result<(), String> {
        if let Some(name) = &self.scheduler_name {
            profile.scheduler_name = name.clone();
        }
        if let Some(p) = self.percentage_of_nodes_to_score {
            if p > 100 {
                return Err(format!("percentageOfNodesToScore {p} is over 100"));
            }
            profile.percentage_of_nodes_to_score = p;
        }
        for (name, &weight) in &self.weights {
            if !(0..=100).contains(&weight) {
                return Err(format!("weight of {name} must be between 0 and 100, not {weight}"));
            }
            set_weight(&mut profile.weights, name, weight)?;
        }
        Ok(())
    }
}
