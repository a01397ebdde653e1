//! `make bench`: for each system in turn, launch a fresh 3-member cluster,
//! run every scenario against it (failover last, since it kills members),
//! tear it down; then print one table with both systems and their ratios.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::client::Target;
use crate::cluster::{Cluster, ClusterSpec, System};
use crate::failover::{self, FailoverConfig};
use crate::load::{self, LoadConfig, Op};
use crate::report::{Better, Report};
use crate::watch::{self, WatchConfig};

#[derive(Clone, Debug)]
pub struct SuiteConfig {
    pub systems: Vec<System>,
    pub skiff: PathBuf,
    pub etcd: PathBuf,
    /// Parent of the clusters' temporary directories (default: the system temp dir).
    pub dir: Option<PathBuf>,
    pub etcd_heartbeat_ms: u64,
    pub etcd_election_timeout_ms: u64,
    /// Extra flags for every member of each system.
    pub skiff_args: Vec<String>,
    pub etcd_args: Vec<String>,
    /// Concurrency levels of the put scenario.
    pub put_clients: Vec<usize>,
    pub put_duration: Duration,
    pub put_target: Target,
    pub key_space: u64,
    pub value_size: usize,
    pub range_clients: usize,
    pub range_duration: Duration,
    pub range_target: Target,
    /// Upper bound on requests per load scenario, whatever the duration.
    pub max_ops: u64,
    /// Watch scenarios, in order; the first is the one the target is about.
    pub watches: Vec<WatchConfig>,
    pub failover: FailoverConfig,
    /// Keep data directories and logs after a successful run.
    pub keep: bool,
}

pub async fn run(config: &SuiteConfig, report: &mut Report) -> Result<()> {
    report.settings = settings(config);
    for &system in &config.systems {
        let parent = config.dir.clone().unwrap_or_else(std::env::temp_dir);
        std::fs::create_dir_all(&parent)?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("skiff-bench-{}-", system.name().to_lowercase()))
            .tempdir_in(&parent)
            .with_context(|| format!("creating a directory under {}", parent.display()))?;
        let spec = ClusterSpec {
            system,
            binary: match system {
                System::Skiff => config.skiff.clone(),
                System::Etcd => config.etcd.clone(),
            },
            members: 3,
            dir: dir.path().to_path_buf(),
            etcd_heartbeat_ms: config.etcd_heartbeat_ms,
            etcd_election_timeout_ms: config.etcd_election_timeout_ms,
            extra_args: match system {
                System::Skiff => config.skiff_args.clone(),
                System::Etcd => config.etcd_args.clone(),
            },
        };
        eprintln!("== {}: starting 3 members in {}", system.name(), dir.path().display());
        let outcome = match Cluster::launch(spec).await {
            Ok(mut cluster) => scenarios(&mut cluster, config, report).await,
            Err(e) => Err(e.context("launching the cluster")),
        };
        if let Err(e) = outcome {
            // Keep the logs of a failed run.
            let kept = dir.keep();
            return Err(e.context(format!("{} failed; logs kept in {}", system.name(), kept.display())));
        }
        if config.keep {
            eprintln!("   logs and data kept in {}", dir.keep().display());
        }
    }
    Ok(())
}

async fn scenarios(cluster: &mut Cluster, config: &SuiteConfig, report: &mut Report) -> Result<()> {
    let system = cluster.system();
    let endpoints = cluster.endpoints();
    for &clients in &config.put_clients {
        let scenario = format!("put, {clients} client{}", if clients == 1 { "" } else { "s" });
        let load = LoadConfig {
            clients,
            conns: 0,
            duration: config.put_duration,
            max_ops: config.max_ops,
            target: config.put_target,
            value_size: config.value_size,
        };
        let result = load::run(&endpoints, &load, Op::Put { key_space: config.key_space }).await?;
        eprintln!("  {scenario}: {}", result.summary());
        report.record(system, &scenario, "throughput ops/s", Better::Higher, result.throughput());
        report.record(system, &scenario, "p50 ms", Better::Lower, result.latency.quantile_ms(0.50));
        report.record(system, &scenario, "p99 ms", Better::Lower, result.latency.quantile_ms(0.99));
        report.detail(system, format!("{scenario}: {}", result.summary()));
    }
    for serializable in [false, true] {
        let scenario = format!(
            "range 1 key, {}, {} clients",
            if serializable { "serializable" } else { "linearizable" },
            config.range_clients
        );
        let load = LoadConfig {
            clients: config.range_clients,
            conns: 0,
            duration: config.range_duration,
            max_ops: config.max_ops,
            target: config.range_target,
            value_size: config.value_size,
        };
        let result = load::run(&endpoints, &load, Op::Range { serializable }).await?;
        eprintln!("  {scenario}: {}", result.summary());
        report.record(system, &scenario, "throughput ops/s", Better::Higher, result.throughput());
        report.record(system, &scenario, "p99 ms", Better::Lower, result.latency.quantile_ms(0.99));
        report.detail(system, format!("{scenario}: {}", result.summary()));
    }
    for w in &config.watches {
        let scenario = if w.keys == 1 {
            format!("watch fan-out, {} watchers on 1 key, {} writes/s", w.watchers, w.rate)
        } else {
            format!("watch, {} watchers on {} keys, {} writes/s", w.watchers, w.keys, w.rate)
        };
        let result = watch::run(&endpoints, w).await?;
        eprintln!("  {scenario}: {}", result.summary());
        report.record(system, &scenario, "p50 ms", Better::Lower, result.latency.quantile_ms(0.50));
        report.record(system, &scenario, "p99 ms", Better::Lower, result.latency.quantile_ms(0.99));
        let delivered = result.events as f64 / (result.expected_events.max(1)) as f64 * 100.0;
        report.record(system, &scenario, "delivered %", Better::Higher, delivered);
        report.detail(system, format!("{scenario}: {}", result.summary()));
    }
    {
        let result = failover::run(cluster, &config.failover).await?;
        eprintln!("  failover: {}", result.summary());
        report.record(system, "failover", "median ms", Better::Lower, result.median().as_secs_f64() * 1000.0);
        report.record(system, "failover", "max ms", Better::Lower, result.max().as_secs_f64() * 1000.0);
        report.detail(system, format!("failover: {}", result.summary()));
    }
    Ok(())
}

fn settings(config: &SuiteConfig) -> Vec<String> {
    let d = |d: Duration| humantime::format_duration(d).to_string();
    let mut settings = vec![
        format!(
            "3 members per system on 127.0.0.1, one system at a time, data under {} (same disk, fsync on)",
            config.dir.as_deref().unwrap_or(&std::env::temp_dir()).display()
        ),
        format!(
            "etcd: `--heartbeat-interval {} --election-timeout {}` (Skiff at its defaults: heartbeat 100ms, \
             election timeout 300ms-600ms; etcd needs heartbeat <= election/5), other flags default",
            config.etcd_heartbeat_ms, config.etcd_election_timeout_ms
        ),
        format!("extra flags: Skiff {:?}, etcd {:?}", config.skiff_args, config.etcd_args),
        format!(
            "put: {} each, to {:?}, {}-byte values over {} keys, connections = min(clients, 16)",
            d(config.put_duration),
            config.put_target,
            config.value_size,
            config.key_space
        ),
        format!(
            "range: one {}-byte key, {} each, {} clients over 16 connections, to {:?} members",
            config.value_size,
            d(config.range_duration),
            config.range_clients,
            config.range_target
        ),
        format!(
            "failover: {} SIGKILLs of the leader; a put to a survivor starts every {} (timeout {}); \
             time = kill to the first successful one; killed member restarted and caught up before the next kill",
            config.failover.kills,
            d(config.failover.probe_interval),
            d(config.failover.probe_timeout)
        ),
        format!("every load scenario is capped at {} requests as well as by its duration", config.max_ops),
    ];
    for w in &config.watches {
        settings.push(format!(
            "watch: {} watch streams (one watcher each) on {} key(s), over {} connections spread on all members; \
             a writer paces {} puts/s to the {:?} for {} (at most {} in flight); value = send time, \
             latency = receive time - send time",
            w.watchers,
            w.keys,
            w.watchers.div_ceil(100),
            w.rate,
            w.writer_target,
            d(w.duration),
            crate::watch::MAX_INFLIGHT_WRITES,
        ));
    }
    settings
}
