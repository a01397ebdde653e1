//! `make bench`: launch a fresh 3-member cluster of each system, then run
//! every scenario against one system after the other (failover last, since it
//! kills members). Alternating scenario by scenario, rather than system by
//! system, spreads load from elsewhere on the machine over both alike; the
//! cluster that is not being measured only exchanges heartbeats meanwhile.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::client::Target;
use crate::cluster::{Cluster, ClusterSpec, EtcdTiming, SkiffTiming, System};
use crate::cpu::{CpuUsed, Sampler};
use crate::failover::{self, FailoverConfig};
use crate::load::{self, LoadConfig, LoadResult, Op};
use crate::report::{Better, Report};
use crate::watch::{self, WatchConfig};

#[derive(Clone, Debug)]
pub struct SuiteConfig {
    pub systems: Vec<System>,
    pub skiff: PathBuf,
    pub etcd: PathBuf,
    /// Parent of the clusters' temporary directories (default: the system temp dir).
    pub dir: Option<PathBuf>,
    pub etcd_timing: EtcdTiming,
    /// Skiff's timing, for the report (None when it could not be read).
    pub skiff_timing: Option<SkiffTiming>,
    /// Extra flags for every member of each system.
    pub skiff_args: Vec<String>,
    pub etcd_args: Vec<String>,
    /// Concurrency levels of the put scenario.
    pub put_clients: Vec<usize>,
    pub put_duration: Duration,
    /// Rounds of the put scenarios (see [`PutTotals`]).
    pub put_rounds: usize,
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

/// One measurement, run against each system in turn.
#[derive(Clone, Debug)]
enum Scenario {
    Put {
        clients: usize,
        round: usize,
    },
    Range {
        serializable: bool,
    },
    Watch(WatchConfig),
    /// Last: it kills and restarts members.
    Failover,
}

impl Scenario {
    fn name(&self, config: &SuiteConfig) -> String {
        match self {
            Scenario::Put { clients: 1, .. } => "put, 1 client".into(),
            Scenario::Put { clients, .. } => format!("put, {clients} clients"),
            Scenario::Range { serializable } => format!(
                "range 1 key, {}, {} clients",
                if *serializable { "serializable" } else { "linearizable" },
                config.range_clients
            ),
            Scenario::Watch(w) if w.keys == 1 => {
                format!("watch fan-out, {} watchers on 1 key, {} writes/s", w.watchers, w.rate)
            }
            Scenario::Watch(w) => format!("watch, {} watchers on {} keys, {} writes/s", w.watchers, w.keys, w.rate),
            Scenario::Failover => "failover".into(),
        }
    }
}

/// A launched cluster and the directory that holds its data and logs.
struct Running {
    cluster: Cluster,
    dir: tempfile::TempDir,
}

pub async fn run(config: &SuiteConfig, report: &mut Report) -> Result<()> {
    report.settings = settings(config);
    let mut running = Vec::new();
    for &system in &config.systems {
        match launch(system, config).await {
            Ok(r) => running.push(r),
            Err(e) => return Err(keep_logs(running, e)),
        }
    }
    let rounds = config.put_rounds.max(1);
    let mut scenarios: Vec<Scenario> = (1..=rounds)
        .flat_map(|round| config.put_clients.iter().map(move |&clients| Scenario::Put { clients, round }))
        .collect();
    scenarios.push(Scenario::Range { serializable: false });
    scenarios.push(Scenario::Range { serializable: true });
    scenarios.extend(config.watches.iter().cloned().map(Scenario::Watch));
    scenarios.push(Scenario::Failover);
    let mut puts = HashMap::new();
    for scenario in &scenarios {
        let name = scenario.name(config);
        for r in &mut running {
            let system = r.cluster.system();
            eprintln!("  {name} ({})", system.name());
            if let Err(e) = measure(&mut r.cluster, scenario, &name, config, &mut puts, report).await {
                let e = e.context(format!("{name} against {}", system.name()));
                return Err(keep_logs(running, e));
            }
        }
    }
    for r in running {
        drop(r.cluster);
        if config.keep {
            eprintln!("logs and data kept in {}", r.dir.keep().display());
        }
    }
    Ok(())
}

/// Stops every cluster and keeps its directory, for a run that failed.
fn keep_logs(running: Vec<Running>, error: anyhow::Error) -> anyhow::Error {
    let mut kept = Vec::new();
    for r in running {
        drop(r.cluster);
        kept.push(r.dir.keep().display().to_string());
    }
    error.context(format!("logs kept in {kept:?}"))
}

async fn launch(system: System, config: &SuiteConfig) -> Result<Running> {
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
        etcd_timing: config.etcd_timing,
        extra_args: match system {
            System::Skiff => config.skiff_args.clone(),
            System::Etcd => config.etcd_args.clone(),
        },
        skiff_subcommand: "apiserver",
    };
    eprintln!("== {}: starting 3 members in {}", system.name(), dir.path().display());
    match Cluster::launch(spec).await {
        Ok(cluster) => Ok(Running { cluster, dir }),
        Err(e) => {
            let kept = dir.keep();
            Err(e.context(format!("launching {} (logs kept in {})", system.name(), kept.display())))
        }
    }
}

fn put_summary(result: &LoadResult, used: &CpuUsed) -> String {
    let per_op = |seconds: f64| seconds * 1e6 / result.ops.max(1) as f64;
    let mut members: Vec<f64> = used.members.iter().map(|&s| per_op(s)).collect();
    members.sort_by(|a, b| b.total_cmp(a));
    let members: Vec<String> = members.iter().map(|us| format!("{us:.1}")).collect();
    format!(
        "{}; CPU per write: members {} us (busiest first, the leader), harness {:.1} us; {:.2} of {} cores busy",
        result.summary(),
        members.join(" / "),
        per_op(used.harness),
        (used.members.iter().sum::<f64>() + used.harness) / used.wall,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    )
}

/// A put scenario's figures summed over its rounds so far. The rounds run
/// every concurrency level against each system in turn, so a drift in the
/// machine's speed (10-30% within minutes on a shared VM) weighs on both
/// systems alike instead of on whichever ran during a slow spell; the
/// report gives throughput, latency and CPU over all rounds together.
struct PutTotals {
    result: LoadResult,
    used: CpuUsed,
}

async fn measure(
    cluster: &mut Cluster,
    scenario: &Scenario,
    name: &str,
    config: &SuiteConfig,
    puts: &mut HashMap<(System, usize), PutTotals>,
    report: &mut Report,
) -> Result<()> {
    let system = cluster.system();
    let endpoints = cluster.endpoints();
    let summary = match scenario {
        Scenario::Put { clients, round } => {
            let load = LoadConfig {
                clients: *clients,
                conns: 0,
                duration: config.put_duration,
                max_ops: config.max_ops,
                target: config.put_target,
                value_size: config.value_size,
            };
            let pids =
                cluster.pids().into_iter().map(|p| p.context("a member is not running")).collect::<Result<_>>()?;
            let sampler = Sampler::start(pids)?;
            let result = load::run(&endpoints, &load, Op::Put { key_space: config.key_space }).await?;
            let used = sampler.finish()?;
            let summary = put_summary(&result, &used);
            let totals = match puts.remove(&(system, *clients)) {
                None => PutTotals { result, used },
                Some(mut t) => {
                    t.result.absorb(&result);
                    t.used.absorb(&used);
                    t
                }
            };
            let rounds = config.put_rounds.max(1);
            if *round == rounds {
                let (result, used) = (&totals.result, &totals.used);
                report.record(system, name, "throughput ops/s", Better::Higher, result.throughput());
                report.record(system, name, "p50 ms", Better::Lower, result.latency.quantile_ms(0.50));
                report.record(system, name, "p99 ms", Better::Lower, result.latency.quantile_ms(0.99));
                let per_op = used.members.iter().sum::<f64>() * 1e6 / result.ops.max(1) as f64;
                report.record(system, name, "members' CPU us/write", Better::Lower, per_op);
            } else {
                puts.insert((system, *clients), totals);
            }
            if rounds == 1 {
                summary
            } else {
                format!("round {round} of {rounds}: {summary}")
            }
        }
        Scenario::Range { serializable } => {
            let load = LoadConfig {
                clients: config.range_clients,
                conns: 0,
                duration: config.range_duration,
                max_ops: config.max_ops,
                target: config.range_target,
                value_size: config.value_size,
            };
            let result = load::run(&endpoints, &load, Op::Range { serializable: *serializable }).await?;
            report.record(system, name, "throughput ops/s", Better::Higher, result.throughput());
            report.record(system, name, "p50 ms", Better::Lower, result.latency.quantile_ms(0.50));
            report.record(system, name, "p99 ms", Better::Lower, result.latency.quantile_ms(0.99));
            result.summary()
        }
        Scenario::Watch(w) => {
            let result = watch::run(&endpoints, w).await?;
            report.record(system, name, "p50 ms", Better::Lower, result.latency.quantile_ms(0.50));
            report.record(system, name, "p99 ms", Better::Lower, result.latency.quantile_ms(0.99));
            let delivered = result.events as f64 / result.expected_events.max(1) as f64 * 100.0;
            report.record(system, name, "delivered %", Better::Higher, delivered);
            result.summary()
        }
        Scenario::Failover => {
            let result = failover::run(cluster, &config.failover).await?;
            report.record(system, name, "median ms", Better::Lower, result.median().as_secs_f64() * 1000.0);
            report.record(system, name, "max ms", Better::Lower, result.max().as_secs_f64() * 1000.0);
            result.summary()
        }
    };
    eprintln!("    {summary}");
    report.detail(system, format!("{name}: {summary}"));
    Ok(())
}

fn settings(config: &SuiteConfig) -> Vec<String> {
    let d = |d: Duration| humantime::format_duration(d).to_string();
    let mut settings = vec![
        format!(
            "3 members per system on 127.0.0.1, both clusters up, scenarios alternating Skiff then etcd; \
             data under {} (same disk, fsync on)",
            config.dir.as_deref().unwrap_or(&std::env::temp_dir()).display()
        ),
        format!(
            "Raft timing: Skiff {}; etcd `--heartbeat-interval {} --election-timeout {}` (etcd draws the \
             election timeout from [t, 2t) and needs heartbeat <= t/5); other flags at their defaults",
            config
                .skiff_timing
                .map(|t| format!(
                    "heartbeat {}, election timeout {}-{}",
                    d(t.heartbeat),
                    d(t.election_timeout_min),
                    d(t.election_timeout_max)
                ))
                .unwrap_or_else(|| "at its defaults".into()),
            config.etcd_timing.heartbeat_ms,
            config.etcd_timing.election_timeout_ms
        ),
        format!("extra flags: Skiff {:?}, etcd {:?}", config.skiff_args, config.etcd_args),
        format!(
            "put: {} each, {} round(s) (each round runs every concurrency level against each system in \
             turn; the figures are over all rounds together), to {}, {}-byte values over {} keys, \
             connections = min(clients, 16)",
            d(config.put_duration),
            config.put_rounds.max(1),
            config.put_target.describe(),
            config.value_size,
            config.key_space
        ),
        format!(
            "range: one {}-byte key, {} each, {} clients over 16 connections, to {}",
            config.value_size,
            d(config.range_duration),
            config.range_clients,
            config.range_target.describe()
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
             a writer paces {} puts/s to {} for {} (at most {} in flight); value = send time, \
             latency = receive time - send time",
            w.watchers,
            w.keys,
            w.watchers.div_ceil(100),
            w.rate,
            w.writer_target.describe(),
            d(w.duration),
            crate::watch::MAX_INFLIGHT_WRITES,
        ));
    }
    settings
}
