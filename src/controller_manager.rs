//! `skiff controller-manager`'s flags, Kubernetes' names where Kubernetes
//! has them; `skiff server` takes the same ones (without `--server`, since
//! there the controller manager talks to its own apiserver).

use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;
use skiff_client::runtime::leader::LeaderElectionConfig;
use skiff_controllers::config::{parse_controllers, ControllerManagerConfig, LeaderElection};

use crate::parse_duration;

/// Flags of the controller manager that `skiff server` shares.
#[derive(Args, Clone, Debug)]
pub struct ControllerFlags {
    /// Controllers to run: `*` for all, `name` to add one, `-name` to leave
    /// one out (e.g. `*,-podgc`).
    #[arg(long, default_value = "*")]
    pub controllers: String,
    /// Run only while holding the `kube-system/kube-controller-manager` Lease.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// How long a lease lasts without renewal before another instance may take it.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub leader_elect_lease_duration: Duration,
    /// How long the leader keeps trying to renew before it stops acting.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub leader_elect_renew_deadline: Duration,
    /// How often candidates try to acquire and the leader to renew.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub leader_elect_retry_period: Duration,
    /// Workers of each controller not given a number of its own below.
    #[arg(long, default_value_t = 16)]
    pub concurrent_syncs: usize,
    /// Deployments reconciled at once.
    #[arg(long)]
    pub concurrent_deployment_syncs: Option<usize>,
    /// ReplicaSets reconciled at once.
    #[arg(long)]
    pub concurrent_replicaset_syncs: Option<usize>,
    /// ReplicationControllers reconciled at once.
    #[arg(long)]
    pub concurrent_rc_syncs: Option<usize>,
    /// Jobs reconciled at once.
    #[arg(long)]
    pub concurrent_job_syncs: Option<usize>,
    /// DaemonSets reconciled at once.
    #[arg(long)]
    pub concurrent_daemonset_syncs: Option<usize>,
    /// Namespaces emptied at once.
    #[arg(long)]
    pub concurrent_namespace_syncs: Option<usize>,
    /// Garbage collector workers.
    #[arg(long)]
    pub concurrent_gc_syncs: Option<usize>,
    /// Services whose Endpoints are reconciled at once.
    #[arg(long)]
    pub concurrent_endpoint_syncs: Option<usize>,
    /// Services whose EndpointSlices are reconciled at once.
    #[arg(long)]
    pub concurrent_service_endpoint_syncs: Option<usize>,
    /// Writes per second to the apiserver; 0 leaves them unthrottled.
    #[arg(long, default_value_t = 0.0)]
    pub kube_api_qps: f64,
    /// Writes allowed in a burst above --kube-api-qps.
    #[arg(long, default_value_t = 0)]
    pub kube_api_burst: u32,
    /// Range of pod addresses, split into one --node-cidr-mask-size block per node.
    #[arg(long, default_value = "10.244.0.0/16")]
    pub cluster_cidr: String,
    #[arg(long, default_value_t = 24)]
    pub node_cidr_mask_size: u8,
    /// How long a node's Lease may go unrenewed before the node is marked unknown.
    #[arg(long, default_value = "40s", value_parser = parse_duration)]
    pub node_monitor_grace_period: Duration,
    /// How long pods without their own toleration stay on a not-ready or
    /// unreachable node (seconds).
    #[arg(long, default_value_t = 300)]
    pub default_not_ready_toleration_seconds: u64,
    /// Terminated pods kept before the oldest are deleted.
    #[arg(long, default_value_t = 12500)]
    pub terminated_pod_gc_threshold: usize,
    /// The CA published to every namespace as the `kube-root-ca.crt`
    /// ConfigMap, for pods to trust the apiserver (default: the
    /// --certificate-authority the apiservers are checked against).
    #[arg(long, value_name = "FILE")]
    pub root_ca_file: Option<std::path::PathBuf>,
}

/// `skiff controller-manager`.
#[derive(Args, Clone, Debug)]
pub struct ControllerManagerArgs {
    /// Apiservers' client addresses, comma-separated (any of them will do).
    #[arg(long, value_delimiter = ',', required = true)]
    pub server: Vec<String>,
    #[command(flatten)]
    pub tls: skiff_client::runtime::config::ClientTlsArgs,
    /// This instance's name in the Lease (default: hostname and pid).
    #[arg(long)]
    pub identity: Option<String>,
    /// HTTP listener for /metrics and /healthz.
    #[arg(long)]
    pub http_listen: Option<SocketAddr>,
    #[command(flatten)]
    pub flags: ControllerFlags,
}

/// A name unique to this process on this host.
pub fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_else(|_| "localhost".into());
    format!("{}_{}", host.trim(), std::process::id())
}

impl ControllerFlags {
    /// The `--leader-elect*` timings for another component of the same
    /// process (the scheduler), or `None` with `--leader-elect=false`;
    /// the lease's names are the component's own.
    pub fn leader_election(&self, identity: &str) -> Option<LeaderElectionConfig> {
        self.leader_elect.then(|| {
            let mut timings = LeaderElectionConfig::new("", "", identity);
            timings.lease_duration = self.leader_elect_lease_duration;
            timings.renew_deadline = self.leader_elect_renew_deadline;
            timings.retry_period = self.leader_elect_retry_period;
            timings
        })
    }

    pub fn into_config(self, servers: Vec<String>, identity: String) -> Result<ControllerManagerConfig, String> {
        let mut config = ControllerManagerConfig::new(servers, identity);
        config.controllers = parse_controllers(&self.controllers).map_err(|e| e.to_string())?;
        if self.leader_elect_renew_deadline >= self.leader_elect_lease_duration {
            return Err("--leader-elect-renew-deadline must be shorter than --leader-elect-lease-duration".into());
        }
        if self.leader_elect_retry_period >= self.leader_elect_renew_deadline {
            return Err("--leader-elect-retry-period must be shorter than --leader-elect-renew-deadline".into());
        }
        config.leader_election = LeaderElection {
            enabled: self.leader_elect,
            lease_duration: self.leader_elect_lease_duration,
            renew_deadline: self.leader_elect_renew_deadline,
            retry_period: self.leader_elect_retry_period,
            ..LeaderElection::default()
        };
        if self.concurrent_syncs == 0 {
            return Err("--concurrent-syncs must be at least 1".into());
        }
        config.concurrent_syncs = self.concurrent_syncs;
        let own = [
            ("deployment", "deployment", self.concurrent_deployment_syncs),
            ("replicaset", "replicaset", self.concurrent_replicaset_syncs),
            ("replicationcontroller", "rc", self.concurrent_rc_syncs),
            ("job", "job", self.concurrent_job_syncs),
            ("daemonset", "daemonset", self.concurrent_daemonset_syncs),
            ("namespace", "namespace", self.concurrent_namespace_syncs),
            ("garbagecollector", "gc", self.concurrent_gc_syncs),
            ("endpoint", "endpoint", self.concurrent_endpoint_syncs),
            ("endpointslice", "service-endpoint", self.concurrent_service_endpoint_syncs),
        ];
        for (controller, flag, workers) in own {
            match workers {
                Some(0) => return Err(format!("--concurrent-{flag}-syncs must be at least 1")),
                Some(n) => {
                    config.concurrent_syncs_of.insert(controller, n);
                }
                None => {}
            }
        }
        if self.kube_api_qps.is_nan() || self.kube_api_qps < 0.0 {
            return Err("--kube-api-qps must be 0 (unlimited) or positive".into());
        }
        config.kube_api_qps = self.kube_api_qps;
        config.kube_api_burst = self.kube_api_burst;
        config.cluster_cidr = self.cluster_cidr;
        config.node_cidr_mask_size = self.node_cidr_mask_size;
        config.node_monitor_grace_period = self.node_monitor_grace_period;
        config.default_toleration_seconds = self.default_not_ready_toleration_seconds;
        config.terminated_pod_gc_threshold = self.terminated_pod_gc_threshold;
        config.root_ca_file = self.root_ca_file;
        Ok(config)
    }
}

impl ControllerManagerArgs {
    pub fn into_config(self) -> Result<ControllerManagerConfig, String> {
        let identity = self.identity.unwrap_or_else(default_identity);
        let mut config = self.flags.into_config(self.server, identity)?;
        config.http = self.http_listen;
        config.tls = self.tls.files();
        config.token = self.tls.token();
        Ok(config)
    }
}
