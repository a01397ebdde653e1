//! `skiff scheduler`'s flags, Kubernetes' names where Kubernetes has them;
//! `skiff server` takes the same ones (without `--server`, since there the
//! scheduler talks to its own apiserver).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use skiff_client::runtime::leader::LeaderElectionConfig;
use skiff_scheduler::config::{ProfileFile, SchedulerConfig, LEASE_NAME, LEASE_NAMESPACE};

use crate::parse_duration;

/// Flags of the scheduler that `skiff server` shares.
#[derive(Args, Clone, Debug)]
pub struct SchedulerFlags {
    /// Share of the feasible nodes to find before scoring (1-100); 0 picks
    /// it from the cluster's size as kube-scheduler does.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub percentage_of_nodes_to_score: u32,
    /// Scheduler settings file (schedulerName, percentageOfNodesToScore,
    /// weights per score); flags given on the command line win.
    #[arg(long = "scheduler-config", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Bindings in flight at once.
    #[arg(long, default_value_t = 256)]
    pub parallel_binds: usize,
}

/// `skiff scheduler`.
#[derive(Args, Clone, Debug)]
pub struct SchedulerArgs {
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
    /// Schedule only while holding the `kube-system/kube-scheduler` Lease.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// How long a lease lasts without renewal before another instance may take it.
    #[arg(long = "leader-elect-lease-duration", default_value = "15s", value_parser = parse_duration)]
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before it stops scheduling.
    #[arg(long = "leader-elect-renew-deadline", default_value = "10s", value_parser = parse_duration)]
    pub renew_deadline: Duration,
    /// How often candidates try to acquire and the leader to renew.
    #[arg(long = "leader-elect-retry-period", default_value = "2s", value_parser = parse_duration)]
    pub retry_period: Duration,
    /// Writes per second to the apiserver; 0 leaves them unthrottled.
    #[arg(long, default_value_t = 0.0)]
    pub kube_api_qps: f64,
    /// Writes allowed in a burst above --kube-api-qps.
    #[arg(long, default_value_t = 0)]
    pub kube_api_burst: u32,
    #[command(flatten)]
    pub flags: SchedulerFlags,
}

impl SchedulerFlags {
    /// The configuration for `servers`; `election`: the Lease's timings
    /// (its names are filled in here), `None` to schedule without one.
    pub fn into_config(
        self,
        servers: Vec<String>,
        identity: String,
        election: Option<LeaderElectionConfig>,
    ) -> Result<SchedulerConfig, String> {
        let mut config = SchedulerConfig::new(servers, &identity);
        if let Some(path) = &self.config {
            let file = ProfileFile::load(path).map_err(|e| e.to_string())?;
            file.apply(&mut config.profile).map_err(|e| format!("scheduler config {}: {e}", path.display()))?;
        }
        if self.percentage_of_nodes_to_score != 0 {
            config.profile.percentage_of_nodes_to_score = self.percentage_of_nodes_to_score;
        }
        config.leader_election = election.map(|timings| LeaderElectionConfig {
            namespace: LEASE_NAMESPACE.into(),
            name: LEASE_NAME.into(),
            identity: identity.clone(),
            ..timings
        });
        if self.parallel_binds == 0 {
            return Err("--parallel-binds must be at least 1".into());
        }
        config.parallel_binds = self.parallel_binds;
        Ok(config)
    }
}

impl SchedulerArgs {
    pub fn into_config(self) -> Result<SchedulerConfig, String> {
        let identity = self.identity.unwrap_or_else(crate::controller_manager::default_identity);
        if self.renew_deadline >= self.lease_duration {
            return Err("--leader-elect-renew-deadline must be shorter than --leader-elect-lease-duration".into());
        }
        if self.retry_period >= self.renew_deadline {
            return Err("--leader-elect-retry-period must be shorter than --leader-elect-renew-deadline".into());
        }
        let election = self.leader_elect.then(|| {
            let mut timings = LeaderElectionConfig::new(LEASE_NAMESPACE, LEASE_NAME, &identity);
            timings.lease_duration = self.lease_duration;
            timings.renew_deadline = self.renew_deadline;
            timings.retry_period = self.retry_period;
            timings
        });
        let mut config = self.flags.into_config(self.server, identity, election)?;
        config.http = self.http_listen;
        config.tls = self.tls.files();
        config.token = self.tls.token();
        if self.kube_api_qps.is_nan() || self.kube_api_qps < 0.0 {
            return Err("--kube-api-qps must be 0 (unlimited) or positive".into());
        }
        config.kube_api_qps = self.kube_api_qps;
        config.kube_api_burst = self.kube_api_burst;
        Ok(config)
    }
}
