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
/// The Lease's namespace.
pub const LEASE_NAMESPACE: &str = "kube-system";
/// The Lease's name.
pub const LEASE_NAME: &str = "kube-scheduler";

/// Everything `run` needs.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Apiservers' client addresses; any of them will do.
    pub servers: Vec<String>,
    /// TLS to the apiservers and the client certificate to present; `None`: plaintext.
    pub tls: Option<skiff_pki::ClientFiles>,
    /// A bearer token to send instead of a client certificate.
    pub token: Option<skiff_client::runtime::config::TokenSource>,
    /// `/metrics` and `/healthz`; none when `None`.
    pub http: Option<SocketAddr>,
    /// Act only while holding the Lease; `None` acts at once (one instance).
    pub leader_election: Option<LeaderElectionConfig>,
    /// Which pods are this scheduler's, and how nodes are filtered and scored.
    pub profile: Profile,
    /// Back-off and bounds of the scheduling queue.
    pub queue: QueueConfig,
    /// Bindings in flight at once; the loop waits for a slot beyond it.
    pub parallel_binds: usize,
    /// Writes per second to the apiserver; 0 leaves them unthrottled.
    pub kube_api_qps: f64,
    /// Writes allowed in a burst above `kube_api_qps`.
    pub kube_api_burst: u32,
}

impl SchedulerConfig {
    /// One instance among others for `servers`, named `identity` in the
    /// Lease, with Kubernetes' defaults.
    pub fn new(servers: Vec<String>, identity: &str) -> SchedulerConfig {
        SchedulerConfig {
            servers,
            tls: None,
            token: None,
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
    /// The file could not be read.
    #[error("scheduler config {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a valid configuration.
    #[error("scheduler config {path}: {reason}")]
    Parse {
        /// The file.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
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
    /// The `spec.schedulerName` this scheduler serves.
    pub scheduler_name: Option<String>,
    /// Share of the nodes to find feasible before scoring; 0 adapts to the size.
    pub percentage_of_nodes_to_score: Option<u32>,
    /// Weight per score, by KubeSchedulerConfiguration's plugin names.
    #[serde(default)]
    pub weights: std::collections::BTreeMap<String, i64>,
}

impl ProfileFile {
    /// Reads and parses the file at `path`.
    pub fn load(path: &Path) -> Result<ProfileFile, ProfileFileError> {
        let shown = path.display().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|source| ProfileFileError::Read { path: shown.clone(), source })?;
        ProfileFile::parse(&text).map_err(|reason| ProfileFileError::Parse { path: shown, reason })
    }

    /// Parses a file's text.
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

/// Sets the weight of the score KubeSchedulerConfiguration names `plugin`.
fn set_weight(weights: &mut Weights, plugin: &str, weight: i64) -> Result<(), String> {
    let slot = match plugin {
        "TaintToleration" => &mut weights.taint_toleration,
        "NodeAffinity" => &mut weights.node_affinity,
        "InterPodAffinity" => &mut weights.inter_pod_affinity,
        "PodTopologySpread" => &mut weights.pod_topology_spread,
        "NodeResourcesFit" | "NodeResourcesLeastAllocated" => &mut weights.least_allocated,
        "NodeResourcesBalancedAllocation" | "BalancedAllocation" => &mut weights.balanced_allocation,
        "SelectorSpread" => &mut weights.selector_spread,
        other => {
            return Err(format!(
                "no score named {other:?} (TaintToleration, NodeAffinity, InterPodAffinity, PodTopologySpread, \
                 NodeResourcesFit, NodeResourcesBalancedAllocation, SelectorSpread)"
            ))
        }
    };
    *slot = weight;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profile_file_sets_the_name_the_sampling_and_weights() {
        let file = ProfileFile::parse(
            "schedulerName: batch\npercentageOfNodesToScore: 20\nweights: {TaintToleration: 5, SelectorSpread: 0}\n",
        )
        .unwrap();
        let mut profile = Profile::default();
        file.apply(&mut profile).unwrap();
        assert_eq!(profile.scheduler_name, "batch");
        assert_eq!(profile.percentage_of_nodes_to_score, 20);
        assert_eq!(profile.weights.taint_toleration, 5);
        assert_eq!(profile.weights.selector_spread, 0);
        assert_eq!(profile.weights.node_affinity, Weights::default().node_affinity);
    }

    #[test]
    fn a_profile_file_with_an_unknown_score_or_field_is_refused() {
        let file = ProfileFile::parse("weights: {Magic: 1}\n").unwrap();
        let err = file.apply(&mut Profile::default()).unwrap_err();
        assert!(err.contains("no score named \"Magic\""), "{err}");
        let err = ProfileFile::parse("percentageOfNodes: 5\n").unwrap_err();
        assert!(err.contains("unknown field"), "{err}");
        let err = ProfileFile::parse("percentageOfNodesToScore: 120\n").unwrap().apply(&mut Profile::default());
        assert!(err.unwrap_err().contains("over 100"));
    }
}
