//! The controller manager's configuration, as `skiff controller-manager`
//! takes it on its command line (Kubernetes' flag names where Kubernetes
//! has one).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

/// Every controller this manager runs, by the name `--controllers` uses
/// (Kubernetes' names).
pub const CONTROLLERS: &[&str] = &[
    "cronjob",
    "daemonset",
    "deployment",
    "disruption",
    "endpoint",
    "endpointslice",
    "garbagecollector",
    "job",
    "namespace",
    "nodeipam",
    "nodelifecycle",
    "podgc",
    "replicaset",
    "replicationcontroller",
    "resourcequota",
    "root-ca-cert-publisher",
    "serviceaccount",
    "servicelb",
];

/// Controllers `*` does not turn on (none yet; Kubernetes keeps a few
/// such, e.g. `bootstrapsigner`).
const OFF_BY_DEFAULT: &[&str] = &[];

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    #[error("--controllers: {0:?} is not a known controller (known: {known})", known = CONTROLLERS.join(", "))]
    UnknownController(String),
}

/// Parses `--controllers` as Kubernetes does: a comma-separated list where
/// `*` turns on every controller on by default, `name` turns one on and
/// `-name` turns one off; later entries do not override an explicit `-name`.
pub fn parse_controllers(spec: &str) -> Result<BTreeSet<&'static str>, ConfigError> {
    let mut star = false;
    let mut on = BTreeSet::new();
    let mut off = BTreeSet::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if item == "*" {
            star = true;
            continue;
        }
        let (disable, name) = match item.strip_prefix('-') {
            Some(n) => (true, n),
            None => (false, item),
        };
        let known = CONTROLLERS
            .iter()
            .find(|c| **c == name)
            .copied()
            .ok_or_else(|| ConfigError::UnknownController(name.to_string()))?;
        if disable {
            off.insert(known);
        } else {
            on.insert(known);
        }
    }
    let mut chosen: BTreeSet<&'static str> = on;
    if star {
        chosen.extend(CONTROLLERS.iter().filter(|c| !OFF_BY_DEFAULT.contains(c)));
    }
    Ok(chosen.difference(&off).copied().collect())
}

/// Leader election timings, as Kubernetes names and defaults them.
#[derive(Clone, Debug)]
pub struct LeaderElection {
    pub enabled: bool,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
    /// The Lease the instances compete for (`kube-system/kube-controller-manager`).
    pub namespace: String,
    pub name: String,
}

impl Default for LeaderElection {
    fn default() -> Self {
        LeaderElection {
            enabled: true,
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            namespace: "kube-system".into(),
            name: "kube-controller-manager".into(),
        }
    }
}

/// Everything `run` needs.
#[derive(Clone, Debug)]
pub struct ControllerManagerConfig {
    /// Apiservers' client gRPC addresses; any of them will do.
    pub servers: Vec<String>,
    /// TLS to the apiservers and the client certificate to present; `None`: plaintext.
    pub tls: Option<skiff_pki::ClientFiles>,
    /// A bearer token to send instead of a client certificate.
    pub token: Option<skiff_client::runtime::config::TokenSource>,
    /// This instance's name in the Lease (`holderIdentity`).
    pub identity: String,
    pub controllers: BTreeSet<&'static str>,
    pub leader_election: LeaderElection,
    /// `/metrics` and `/healthz`; `None` serves neither.
    pub http: Option<SocketAddr>,
    /// Workers of every controller without a number of its own.
    pub concurrent_syncs: usize,
    /// Workers of one controller, by its `--controllers` name
    /// (Kubernetes' `--concurrent-deployment-syncs` and the like).
    pub concurrent_syncs_of: BTreeMap<&'static str, usize>,
    /// Client-side write limit; 0 = unlimited. The default is far above
    /// what the benchmark targets need, unlike Kubernetes' 20.
    pub kube_api_qps: f64,
    pub kube_api_burst: u32,
    /// `--cluster-cidr` and `--node-cidr-mask-size` for node IPAM.
    pub cluster_cidr: String,
    pub node_cidr_mask_size: u8,
    /// `--node-monitor-grace-period`.
    pub node_monitor_grace_period: Duration,
    /// Toleration of pods without one for `not-ready`/`unreachable`.
    pub default_toleration_seconds: u64,
    /// `--terminated-pod-gc-threshold`.
    pub terminated_pod_gc_threshold: usize,
    /// `--root-ca-file`: the CA published as `kube-root-ca.crt`; `None`:
    /// the CA the apiservers' certificates are checked against, if any.
    pub root_ca_file: Option<std::path::PathBuf>,
}

impl ControllerManagerConfig {
    /// How many keys `controller` reconciles at once.
    pub fn workers(&self, controller: &str) -> usize {
        self.concurrent_syncs_of.get(controller).copied().unwrap_or(self.concurrent_syncs).max(1)
    }

    pub fn new(servers: Vec<String>, identity: impl Into<String>) -> ControllerManagerConfig {
        ControllerManagerConfig {
            servers,
            tls: None,
            token: None,
            identity: identity.into(),
            controllers: parse_controllers("*").expect("* is valid"),
            leader_election: LeaderElection::default(),
            http: None,
            concurrent_syncs: 16,
            concurrent_syncs_of: BTreeMap::new(),
            kube_api_qps: 0.0,
            kube_api_burst: 0,
            cluster_cidr: "10.244.0.0/16".into(),
            node_cidr_mask_size: 24,
            node_monitor_grace_period: Duration::from_secs(40),
            default_toleration_seconds: 300,
            terminated_pod_gc_threshold: 12500,
            root_ca_file: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_controller_without_its_own_worker_count_gets_the_common_one() {
        let mut config = ControllerManagerConfig::new(vec![], "me");
        config.concurrent_syncs = 8;
        config.concurrent_syncs_of.insert("garbagecollector", 20);
        assert_eq!(config.workers("garbagecollector"), 20);
        assert_eq!(config.workers("deployment"), 8);
    }

    #[test]
    fn star_turns_every_controller_on_and_minus_turns_one_off() {
        let all = parse_controllers("*").unwrap();
        assert_eq!(all.len(), CONTROLLERS.len());
        let some = parse_controllers("*,-podgc,-nodeipam").unwrap();
        assert!(!some.contains("podgc") && !some.contains("nodeipam"));
        assert!(some.contains("deployment"));
    }

    #[test]
    fn a_list_without_star_runs_only_what_it_names() {
        let some = parse_controllers("deployment, replicaset").unwrap();
        assert_eq!(some.into_iter().collect::<Vec<_>>(), vec!["deployment", "replicaset"]);
        assert!(parse_controllers("").unwrap().is_empty());
    }

    #[test]
    fn an_explicit_minus_wins_over_a_later_name() {
        let some = parse_controllers("-job,*,job").unwrap();
        assert!(!some.contains("job"));
    }

    #[test]
    fn an_unknown_controller_is_refused_with_its_name() {
        let err = parse_controllers("*,-deploymnet").unwrap_err();
        assert_eq!(err, ConfigError::UnknownController("deploymnet".into()));
        assert!(err.to_string().contains("deployment"), "lists the known names: {err}");
    }
}
