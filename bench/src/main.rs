//! `skiff-bench`: drives Skiff and etcd through the same etcd v3 client.
//!
//! # Layout
//! - `client`: connections (the `etcd-client` crate), member status, leader, catch-up.
//! - `cluster`: launching, killing and restarting 3-member Skiff or etcd clusters.
//! - `latency`: latency histograms.
//! - `load`: closed-loop put and range load.
//! - `watch`: watch delivery latency under a paced writer.
//! - `failover`: leader SIGKILL to first successful write.
//! - `objects`: Skiff's resource API: pod creates, LISTs, memory, pod watch fan-out.
//! - `controllers`: the controller manager: Deployment, rollout, Job, namespace deletion, failover.
//! - `hollow`: hollow nodes (Node objects, Lease renewals, pods marked Running), as kwok does.
//! - `scheduler`: the scheduler's throughput on hollow nodes, in the manner of `scheduler_perf`.
//! - `node`: the node agent with real containers: pod startup latency, the agents' CPU and RSS.
//! - `proxy`: the service proxy's syncs at scale, the cluster DNS, endpoint ready to traffic (in a netns).
//! - `suite`: every scenario against both systems (`make bench`).
//! - `report`: the comparison table and bench/README.md.

#![forbid(unsafe_code)]

mod client;
mod cluster;
mod controllers;
mod cpu;
mod failover;
mod hollow;
mod latency;
mod load;
mod node;
mod objects;
mod promtext;
mod proxy;
mod report;
mod scheduler;
mod suite;
mod tls;
mod watch;

/// The harness's allocator is `skiff`'s: in `skiff-bench scheduler` it
/// shares the 2 cores with the processes it measures, and glibc's malloc
/// and free took about a fifth of its CPU there (perf, 2026-12-07).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};

use client::Target;
use cluster::{Cluster, ClusterSpec, EtcdTiming, SkiffTiming, System};

#[derive(Parser)]
#[command(name = "skiff-bench", about = "Benchmarks Skiff and etcd through the etcd v3 API")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Put throughput and latency against running members.
    Put {
        #[command(flatten)]
        load: LoadArgs,
        /// Puts go to a random one of this many keys.
        #[arg(long, default_value_t = 100_000)]
        key_space: u64,
    },
    /// Single-key range throughput and latency against running members.
    Range {
        #[command(flatten)]
        load: LoadArgs,
        /// Serializable (member-local) reads instead of linearizable ones.
        #[arg(long)]
        serializable: bool,
    },
    /// Watch delivery latency against running members.
    Watch {
        #[arg(long, value_delimiter = ',', required = true)]
        endpoints: Vec<String>,
        #[command(flatten)]
        watch: WatchArgs,
    },
    /// Leader SIGKILL to first successful write, on a cluster this command launches.
    Failover {
        #[arg(long, value_enum)]
        system: System,
        /// The `skiff` or `etcd` executable.
        #[arg(long)]
        binary: PathBuf,
        #[command(flatten)]
        cluster: ClusterArgs,
        #[command(flatten)]
        failover: FailoverArgs,
    },
    /// Every scenario against a fresh 3-member Skiff and etcd, with a comparison table.
    Suite(Box<SuiteArgs>),
    /// Skiff's resource API on a fresh 3-member cluster: pod creates, LISTs, memory, watch fan-out.
    Objects(Box<ObjectsArgs>),
    /// The controller manager on a fresh 3-member cluster: Deployment, rollout, Job, namespace deletion, failover.
    Controllers(Box<ControllersArgs>),
    /// The scheduler on hollow nodes: basic pods, anti-affinity, affinity, spreading, preemption.
    Scheduler(Box<SchedulerArgs>),
    /// Node agents with real containers: pod startup latency, the agents' CPU and RSS (needs root).
    Node(Box<NodeArgs>),
    /// The service proxy and cluster DNS in a network namespace of their own: syncs, queries, ready → traffic (needs root).
    Proxy(Box<ProxyArgs>),
}

#[derive(Args)]
struct LoadArgs {
    /// Client addresses (HOST:PORT), comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    endpoints: Vec<String>,
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Connections shared by the clients (0: min(clients, 16)).
    #[arg(long, default_value_t = 0)]
    conns: usize,
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Stop after this many requests even if the duration has not passed.
    #[arg(long, default_value_t = 1_000_000)]
    max_ops: u64,
    #[arg(long, value_enum, default_value = "leader")]
    target: Target,
    #[arg(long, default_value_t = 256)]
    value_size: usize,
}

impl LoadArgs {
    fn config(&self) -> load::LoadConfig {
        load::LoadConfig {
            clients: self.clients,
            conns: self.conns,
            duration: self.duration,
            max_ops: self.max_ops,
            target: self.target,
            value_size: self.value_size,
        }
    }
}

#[derive(Args, Clone)]
struct WatchArgs {
    #[arg(long, default_value_t = 1000)]
    watchers: usize,
    /// Watcher i watches key i % keys (keys = watchers: one watcher per key).
    #[arg(long, default_value_t = 1000)]
    watch_keys: usize,
    /// Writes per second during the watch scenario.
    #[arg(long, default_value_t = 1000)]
    watch_rate: u64,
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    watch_duration: Duration,
}

impl WatchArgs {
    fn config(&self) -> watch::WatchConfig {
        watch::WatchConfig {
            watchers: self.watchers,
            keys: self.watch_keys,
            rate: self.watch_rate,
            duration: self.watch_duration,
            conns: 0,
            writer_target: Target::Leader,
        }
    }
}

#[derive(Args, Clone)]
struct ClusterArgs {
    /// Parent directory for data and logs (default: the system temp dir).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// etcd's --heartbeat-interval in ms (default: Skiff's heartbeat, at most a fifth of the election timeout).
    #[arg(long)]
    etcd_heartbeat_ms: Option<u64>,
    /// etcd's --election-timeout in ms (default: Skiff's --election-timeout-min; etcd's own is 1000).
    #[arg(long)]
    etcd_election_timeout_ms: Option<u64>,
    /// Keep the clusters' data directories and logs after a successful run.
    #[arg(long)]
    keep: bool,
    /// An extra flag for every Skiff member (repeatable), e.g. `--skiff-arg=--election-timeout-min=150ms`.
    #[arg(long = "skiff-arg", allow_hyphen_values = true)]
    skiff_args: Vec<String>,
    /// An extra flag for every etcd member (repeatable).
    #[arg(long = "etcd-arg", allow_hyphen_values = true)]
    etcd_args: Vec<String>,
}

impl ClusterArgs {
    /// etcd's timing: the flags given, else comparable to Skiff's (read from
    /// the `skiff` binary when there is one), else 200ms/40ms.
    fn etcd_timing(&self, skiff: Option<&Path>) -> (EtcdTiming, Option<SkiffTiming>) {
        let skiff_timing = skiff.and_then(|binary| match SkiffTiming::of(binary, &self.skiff_args) {
            Ok(timing) => Some(timing),
            Err(e) => {
                eprintln!("skiff-bench: cannot read Skiff's timing ({e:#}); etcd gets 200ms/40ms");
                None
            }
        });
        let like = skiff_timing
            .map(|t| EtcdTiming::like(&t))
            .unwrap_or(EtcdTiming { heartbeat_ms: 40, election_timeout_ms: 200 });
        let timing = EtcdTiming {
            heartbeat_ms: self.etcd_heartbeat_ms.unwrap_or(like.heartbeat_ms),
            election_timeout_ms: self.etcd_election_timeout_ms.unwrap_or(like.election_timeout_ms),
        };
        (timing, skiff_timing)
    }

    fn extra_args(&self, system: System) -> Vec<String> {
        match system {
            System::Skiff => self.skiff_args.clone(),
            System::Etcd => self.etcd_args.clone(),
        }
    }
}

#[derive(Args, Clone)]
struct FailoverArgs {
    /// Leader kills.
    #[arg(long, default_value_t = 10)]
    kills: usize,
    /// A new probe write starts this often after the kill.
    #[arg(long, default_value = "10ms", value_parser = humantime::parse_duration)]
    probe_interval: Duration,
}

impl FailoverArgs {
    fn config(&self) -> failover::FailoverConfig {
        failover::FailoverConfig { kills: self.kills, probe_interval: self.probe_interval, ..Default::default() }
    }
}

#[derive(Args)]
struct SuiteArgs {
    /// The `skiff` executable.
    #[arg(long)]
    skiff: PathBuf,
    /// The `etcd` executable (Debian's etcd-server).
    #[arg(long, default_value = "/usr/bin/etcd")]
    etcd: PathBuf,
    /// Systems to run, in order.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "skiff,etcd")]
    systems: Vec<System>,
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Concurrency levels of the put scenario.
    #[arg(long, value_delimiter = ',', default_value = "1,16,256")]
    put_clients: Vec<usize>,
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    put_duration: Duration,
    /// Rounds of the put scenarios: each round runs every concurrency level
    /// against each system in turn, and the figures are over all rounds.
    #[arg(long, default_value_t = 3)]
    put_rounds: usize,
    #[arg(long, value_enum, default_value = "leader")]
    put_target: Target,
    #[arg(long, default_value_t = 100_000)]
    key_space: u64,
    #[arg(long, default_value_t = 256)]
    value_size: usize,
    #[arg(long, default_value_t = 64)]
    range_clients: usize,
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    range_duration: Duration,
    #[arg(long, value_enum, default_value = "all")]
    range_target: Target,
    /// Upper bound on requests per load scenario.
    #[arg(long, default_value_t = 1_000_000)]
    max_ops: u64,
    #[command(flatten)]
    watch: WatchArgs,
    /// Writes per second of the fan-out watch scenario (every watcher on one key); 0 skips it.
    #[arg(long, default_value_t = 100)]
    fanout_rate: u64,
    #[command(flatten)]
    failover: FailoverArgs,
    /// TLS on every port of both systems, as each is run for real: client
    /// certificates checked on the client ports (the harness presents an
    /// administrator's), mutual TLS between peers; one CA for both.
    #[arg(long)]
    tls: bool,
    /// Write the results section of this README (bench/README.md).
    #[arg(long)]
    readme: Option<PathBuf>,
    /// How the run is described in the README (default: this command line).
    #[arg(long)]
    command_line: Option<String>,
}

#[derive(Args)]
struct ObjectsArgs {
    /// The `skiff` executable.
    #[arg(long)]
    skiff: PathBuf,
    /// Parent directory for data and logs (default: the system temp dir).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Keep the cluster's data directories and logs after a successful run.
    #[arg(long)]
    keep: bool,
    /// An extra flag for every Skiff member (repeatable).
    #[arg(long = "skiff-arg", allow_hyphen_values = true)]
    skiff_args: Vec<String>,
    /// Pods created, then LISTed, and measured for memory and disk.
    #[arg(long, default_value_t = 50_000)]
    pods: usize,
    /// Concurrent creators, one connection each, all to the leader.
    #[arg(long, default_value_t = 64)]
    create_clients: usize,
    /// LISTs of each kind (linearizable, resourceVersion "0").
    #[arg(long, default_value_t = 10)]
    lists: usize,
    /// Pod watchers (field selector spec.nodeName), spread over the nodes.
    #[arg(long, default_value_t = 10_000)]
    watchers: usize,
    /// Node names, one watched pod each.
    #[arg(long, default_value_t = 1_000)]
    nodes: usize,
    /// Connections the watches share, spread over the members.
    #[arg(long, default_value_t = 30)]
    watch_clients: usize,
    /// Pod patches per second during the watch scenario.
    #[arg(long, default_value_t = 500)]
    update_rate: u64,
    /// Length of the watch scenario's write phase.
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Patches in flight at most.
    #[arg(long, default_value_t = 64)]
    max_inflight: usize,
    /// TLS on every port with authentication and RBAC, as `skiff up` runs:
    /// the harness signs in as a user bound to cluster-admin.
    #[arg(long)]
    tls: bool,
    /// Write the objects results section of this README (bench/README.md).
    #[arg(long)]
    readme: Option<PathBuf>,
    /// How the run is described in the README (default: this command line).
    #[arg(long)]
    command_line: Option<String>,
}

#[derive(Args)]
struct ControllersArgs {
    /// The `skiff` executable.
    #[arg(long)]
    skiff: PathBuf,
    /// Parent directory for data and logs (default: the system temp dir).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Keep the cluster's data directories and logs after a successful run.
    #[arg(long)]
    keep: bool,
    /// Replicas of the Deployment created and then rolled.
    #[arg(long, default_value_t = 1000)]
    replicas: usize,
    /// Completions of the Job.
    #[arg(long, default_value_t = 10_000)]
    completions: usize,
    /// Parallelism of the Job.
    #[arg(long, default_value_t = 500)]
    parallelism: usize,
    /// ConfigMaps in the namespace that is deleted.
    #[arg(long, default_value_t = 10_000)]
    objects: usize,
    /// The controller managers' --leader-elect-lease-duration.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    lease_duration: Duration,
    /// A step not finished within this long is reported as not finished.
    #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
    step_timeout: Duration,
    /// An extra flag for both controller managers (repeatable).
    #[arg(long = "manager-arg", allow_hyphen_values = true)]
    manager_args: Vec<String>,
    /// Write the controllers results section of this README (bench/README.md).
    #[arg(long)]
    readme: Option<PathBuf>,
    /// How the run is described in the README (default: this command line).
    #[arg(long)]
    command_line: Option<String>,
}

#[derive(Args)]
struct SchedulerArgs {
    /// The `skiff` executable (with the `scheduler` subcommand).
    #[arg(long)]
    skiff: PathBuf,
    /// Parent directory for data and logs (default: the system temp dir).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Keep the cluster's data directories and logs after a successful run.
    #[arg(long)]
    keep: bool,
    /// What the masters run: `apiserver` (no scheduler, no controller manager) or
    /// `server` (with `--disable-scheduler --controllers '*,-nodelifecycle'`).
    #[arg(long, value_enum, default_value = "apiserver")]
    masters: scheduler::Masters,
    /// An extra flag for every master (repeatable).
    #[arg(long = "skiff-arg", allow_hyphen_values = true)]
    skiff_args: Vec<String>,
    /// Hollow nodes.
    #[arg(long, default_value_t = 5000)]
    nodes: usize,
    /// Zones the nodes are spread over (`topology.kubernetes.io/zone`).
    #[arg(long, default_value_t = 10)]
    zones: usize,
    /// How often each hollow node renews its Lease (0s: never).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    lease_interval: Duration,
    /// Pod status writes (Running) and deletions the hollow nodes have in flight at most.
    #[arg(long, default_value_t = 64)]
    status_writers: usize,
    /// The hollow nodes write no pod status (bound pods stay Pending): the
    /// kubelets' share of the apiservers' load, left out.
    #[arg(long)]
    no_mark_running: bool,
    /// Workloads to run, in order.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "basic,anti-affinity,affinity,spread,preemption")]
    workloads: Vec<scheduler::WorkloadKind>,
    /// Measured basic pods; the other workloads' default sizes follow from it.
    #[arg(long, default_value_t = 10_000)]
    pods: usize,
    /// Basic warm-up pods (default: --pods / 2).
    #[arg(long)]
    warmup_pods: Option<usize>,
    /// Measured anti-affinity pods, after as many initial ones (default: min(--pods / 10, nodes / 5)).
    #[arg(long)]
    anti_affinity_pods: Option<usize>,
    /// Measured pod-affinity pods (default: --pods / 2).
    #[arg(long)]
    affinity_pods: Option<usize>,
    /// Measured topology-spread pods (default: --pods / 2).
    #[arg(long)]
    spread_pods: Option<usize>,
    /// Measured high-priority pods, each preempting a low one (default: --pods / 10).
    #[arg(long)]
    preemption_pods: Option<usize>,
    /// Pods that fit no node (a nodeSelector no node has), created in each
    /// workload's namespace before its measured pods and left pending
    /// while those are scheduled: what the pods a scheduler cannot place
    /// cost it.
    #[arg(long, default_value_t = 0)]
    pending_pods: usize,
    /// Basic pods of the final fill step, left in place for the scheduler's memory.
    #[arg(long, default_value_t = 50_000)]
    fill_to: usize,
    /// Skip the fill step.
    #[arg(long)]
    skip_fill: bool,
    /// Concurrent pod creates.
    #[arg(long, default_value_t = 64)]
    create_clients: usize,
    /// Spread the creates' connections over every master (the leader's
    /// first) instead of sending them all to the leader.
    #[arg(long)]
    creates_to_every_member: bool,
    /// Fail when no pod of a workload is bound within this long.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    bind_timeout: Duration,
    /// Stop waiting for a workload's pods after this long without a new binding.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    stall_timeout: Duration,
    /// How long the Lease renewals alone are measured before the workloads.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    idle_window: Duration,
    /// Bind pods from the harness (round robin, no constraints) instead of
    /// running `skiff scheduler`: tests the harness, and measures the
    /// apiservers' ceiling for create + bind + status.
    #[arg(long)]
    stand_in: bool,
    /// Run the scheduler with leader election.
    #[arg(long)]
    scheduler_leader_elect: bool,
    /// The scheduler's --percentage-of-nodes-to-score (default: its own).
    #[arg(long)]
    percentage_of_nodes_to_score: Option<u32>,
    /// An extra flag for `skiff scheduler` (repeatable).
    #[arg(long = "scheduler-arg", allow_hyphen_values = true)]
    scheduler_args: Vec<String>,
    /// Write the scheduler results section of this README (bench/README.md).
    #[arg(long)]
    readme: Option<PathBuf>,
    /// How the run is described in the README (default: this command line).
    #[arg(long)]
    command_line: Option<String>,
}

#[derive(Args)]
struct NodeArgs {
    /// The `skiff` executable (with the `node` and `scheduler` subcommands).
    #[arg(long)]
    skiff: PathBuf,
    /// Parent directory for data and logs (default: the system temp dir; the
    /// containerd sockets under it must fit in 107 bytes).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Keep the cluster's and the nodes' data directories and logs after a successful run.
    #[arg(long)]
    keep: bool,
    /// `skiff apiserver` members.
    #[arg(long, default_value_t = 3)]
    members: usize,
    /// An extra flag for every member (repeatable).
    #[arg(long = "skiff-arg", allow_hyphen_values = true)]
    skiff_args: Vec<String>,
    /// `skiff node` agents, each with its own containerd.
    #[arg(long, default_value_t = 2)]
    nodes: usize,
    /// Node I gets pod CIDR 10.244.(BASE+I).0/24 (231, 232: ranges no test uses).
    #[arg(long, default_value_t = 231)]
    cidr_base: u8,
    /// Pods of the burst.
    #[arg(long, default_value_t = 100)]
    pods: usize,
    /// Single pods created one after the other (each deleted before the next).
    #[arg(long, default_value_t = 10)]
    single_runs: usize,
    /// Concurrent creates of the burst.
    #[arg(long, default_value_t = 16)]
    create_clients: usize,
    /// Create pods with `spec.nodeName` set (round robin) instead of running `skiff scheduler`.
    #[arg(long)]
    bind_directly: bool,
    /// Fail when a single pod, or the whole burst, is not Running within this long.
    #[arg(long, default_value = "180s", value_parser = humantime::parse_duration)]
    start_timeout: Duration,
    /// CPU and RSS of the agents with no pods, over this long.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    idle_window: Duration,
    /// Pause after the burst's last pod is Running, before the steady window.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    settle: Duration,
    /// CPU and RSS with every burst pod running, over this long.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    steady_window: Duration,
    /// An extra flag for every `skiff node` (repeatable).
    #[arg(long = "node-arg", allow_hyphen_values = true)]
    node_args: Vec<String>,
    /// An extra flag for `skiff scheduler` (repeatable).
    #[arg(long = "scheduler-arg", allow_hyphen_values = true)]
    scheduler_args: Vec<String>,
    /// Write the node results section of this README (bench/README.md).
    #[arg(long)]
    readme: Option<PathBuf>,
    /// How the run is described in the README (default: this command line).
    #[arg(long)]
    command_line: Option<String>,
}

#[derive(Args)]
struct ProxyArgs {
    /// The `skiff` executable (with the `apiserver` and `proxy` subcommands).
    #[arg(long)]
    skiff: PathBuf,
    /// Parent directory for data and logs (default: the system temp dir).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Keep the member's data directory and the logs after a successful run.
    #[arg(long)]
    keep: bool,
    /// An extra flag for the member (repeatable).
    #[arg(long = "skiff-arg", allow_hyphen_values = true)]
    skiff_args: Vec<String>,
    /// Services of the sync and DNS steps.
    #[arg(long, default_value_t = 1000)]
    services: usize,
    /// Ready endpoints per Service.
    #[arg(long, default_value_t = 10)]
    endpoints: usize,
    /// Full syncs, each after the syncer forgets what it wrote.
    #[arg(long, default_value_t = 5)]
    full_runs: usize,
    /// Incremental syncs, each removing one endpoint or putting it back.
    #[arg(long, default_value_t = 50)]
    incremental_runs: usize,
    /// Concurrent DNS clients, one UDP query in flight each.
    #[arg(long, default_value_t = 16)]
    dns_clients: usize,
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    dns_duration: Duration,
    /// Endpoint ready → traffic runs.
    #[arg(long, default_value_t = 20)]
    ready_runs: usize,
    /// Fail when a Service's port is not refused, or its ready endpoint takes no connection, within this long.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    ready_timeout: Duration,
    /// The proxy modes to measure, each in the sync and ready → traffic steps.
    #[arg(long, value_delimiter = ',', default_value = "iptables,nftables", value_parser = ["iptables", "nftables"])]
    modes: Vec<String>,
    /// Write the proxy results section of this README (bench/README.md).
    #[arg(long)]
    readme: Option<PathBuf>,
    /// How the run is described in the README (default: this command line).
    #[arg(long)]
    command_line: Option<String>,
    /// Set by the run itself: it runs again inside this network namespace,
    /// which it has made for the purpose.
    #[arg(long, hide = true)]
    inside: Option<String>,
}

async fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Put { load, key_space } => {
            let result = load::run(&load.endpoints, &load.config(), load::Op::Put { key_space }).await?;
            println!("put, {} clients: {}", load.clients, result.summary());
        }
        Command::Range { load, serializable } => {
            let result = load::run(&load.endpoints, &load.config(), load::Op::Range { serializable }).await?;
            println!("range, {} clients: {}", load.clients, result.summary());
        }
        Command::Watch { endpoints, watch } => {
            let result = watch::run(&endpoints, &watch.config()).await?;
            println!("watch, {} watchers: {}", watch.watchers, result.summary());
        }
        Command::Failover { system, binary, cluster, failover } => {
            let skiff = (system == System::Skiff).then_some(binary.as_path());
            let (etcd_timing, _) = cluster.etcd_timing(skiff);
            let parent = cluster.dir.clone().unwrap_or_else(std::env::temp_dir);
            let dir = tempfile::Builder::new().prefix("skiff-bench-failover-").tempdir_in(&parent)?;
            let spec = ClusterSpec {
                system,
                binary,
                members: 3,
                dir: dir.path().to_path_buf(),
                etcd_timing,
                extra_args: cluster.extra_args(system),
                skiff_subcommand: "apiserver",
            };
            let mut running = Cluster::launch(spec).await?;
            let result = failover::run(&mut running, &failover.config()).await?;
            println!("failover ({}): {}", system.name(), result.summary());
            if cluster.keep {
                drop(running);
                eprintln!("logs and data kept in {}", dir.keep().display());
            }
        }
        Command::Suite(args) => {
            let (etcd_timing, skiff_timing) = args.cluster.etcd_timing(Some(&args.skiff));
            let (mut skiff_args, mut etcd_args) = (args.cluster.skiff_args.clone(), args.cluster.etcd_args.clone());
            // One PKI for the whole run, outliving both systems' clusters.
            let _pki = if args.tls {
                let parent = args.cluster.dir.clone().unwrap_or_else(std::env::temp_dir);
                std::fs::create_dir_all(&parent)?;
                let pki = tempfile::Builder::new().prefix("skiff-bench-pki-").tempdir_in(&parent)?;
                skiff_args.extend(tls::set(pki.path())?);
                etcd_args.extend(tls::etcd_flags());
                Some(pki)
            } else {
                None
            };
            let config = suite::SuiteConfig {
                systems: args.systems.clone(),
                skiff: args.skiff.clone(),
                etcd: args.etcd.clone(),
                dir: args.cluster.dir.clone(),
                etcd_timing,
                skiff_timing,
                skiff_args,
                etcd_args,
                put_clients: args.put_clients.clone(),
                put_duration: args.put_duration,
                put_rounds: args.put_rounds,
                put_target: args.put_target,
                key_space: args.key_space,
                value_size: args.value_size,
                range_clients: args.range_clients,
                range_duration: args.range_duration,
                range_target: args.range_target,
                max_ops: args.max_ops,
                keep: args.cluster.keep,
                watches: {
                    let mut watches = vec![args.watch.config()];
                    if args.fanout_rate > 0 {
                        watches.push(watch::WatchConfig { keys: 1, rate: args.fanout_rate, ..args.watch.config() });
                    }
                    watches
                },
                failover: args.failover.config(),
            };
            let mut report = report::Report {
                machine: report::machine_facts(),
                command: args
                    .command_line
                    .as_deref()
                    .map(|c| c.trim().to_string())
                    .unwrap_or_else(|| std::env::args().collect::<Vec<_>>().join(" ")),
                date: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
                ..Default::default()
            };
            report.machine.push(("Skiff".into(), format!("{} (commit {})", version(&args.skiff), commit())));
            report.machine.push(("etcd".into(), version(&args.etcd)));
            report.machine.push((
                "transport".into(),
                if args.tls {
                    "TLS on every port of both systems (`--tls`): client certificates checked, mutual TLS between peers"
                } else {
                    "plaintext (without `--tls`)"
                }
                .into(),
            ));
            suite::run(&config, &mut report).await?;
            report.machine.push(("load average after the run".into(), report::load_average()));
            println!("\n{}", report.table());
            println!("{}", report.targets());
            if let Some(readme) = &args.readme {
                report::write_readme(readme, &report.markdown())?;
                eprintln!("results written to {}", readme.display());
            }
        }
        Command::Objects(args) => run_objects(&args).await?,
        Command::Controllers(args) => run_controllers(&args).await?,
        Command::Scheduler(args) => run_scheduler(&args).await?,
        Command::Node(args) => run_node(&args).await?,
        Command::Proxy(args) => run_proxy(&args).await?,
    }
    Ok(())
}

async fn run_objects(args: &ObjectsArgs) -> Result<()> {
    let mut run =
        RunSetup::new("skiff-bench-objects-", &args.skiff, args.command_line.as_deref(), args.dir.as_deref())?;
    let config = objects::ObjectsConfig {
        skiff: args.skiff.clone(),
        dir: run.path.clone(),
        skiff_args: args.skiff_args.clone(),
        pods: args.pods,
        create_clients: args.create_clients,
        lists: args.lists,
        nodes: args.nodes,
        watchers: args.watchers,
        watch_clients: args.watch_clients,
        update_rate: args.update_rate,
        duration: args.duration,
        max_inflight: args.max_inflight,
        tls: args.tls,
    };
    let result = run.conclude(objects::run(&config).await, args.keep)?;
    println!("\n{}", result.table());
    println!("{}", result.targets());
    if let Some(readme) = &args.readme {
        let section = result.markdown(&run.date, &run.command, &run.machine);
        report::write_section(readme, objects::BEGIN, objects::END, "Latest results: Skiff's resource API", &section)?;
        eprintln!("results written to {}", readme.display());
    }
    Ok(())
}

async fn run_controllers(args: &ControllersArgs) -> Result<()> {
    let mut run =
        RunSetup::new("skiff-bench-controllers-", &args.skiff, args.command_line.as_deref(), args.dir.as_deref())?;
    let config = controllers::ControllersConfig {
        skiff: args.skiff.clone(),
        dir: run.path.clone(),
        replicas: args.replicas,
        completions: args.completions,
        parallelism: args.parallelism,
        objects: args.objects,
        lease_duration: args.lease_duration,
        step_timeout: args.step_timeout,
        manager_args: args.manager_args.clone(),
    };
    let result = run.conclude(controllers::run(&config).await, args.keep)?;
    println!("\n{}", result.table(&config));
    if let Some(readme) = &args.readme {
        let section = result.markdown(&config, &run.date, &run.command, &run.machine);
        report::write_section(
            readme,
            controllers::BEGIN,
            controllers::END,
            "Latest results: the controller manager",
            &section,
        )?;
        eprintln!("results written to {}", readme.display());
    }
    Ok(())
}

async fn run_scheduler(args: &SchedulerArgs) -> Result<()> {
    let mut run =
        RunSetup::new("skiff-bench-scheduler-", &args.skiff, args.command_line.as_deref(), args.dir.as_deref())?;
    let config = scheduler::SchedulerConfig {
        skiff: args.skiff.clone(),
        dir: run.path.clone(),
        masters: args.masters,
        skiff_args: args.skiff_args.clone(),
        hollow: hollow::HollowConfig {
            nodes: args.nodes,
            zones: args.zones,
            lease_interval: args.lease_interval,
            status_writers: args.status_writers,
            mark_running: !args.no_mark_running,
        },
        workloads: args.workloads.clone(),
        pods: args.pods,
        warmup_pods: args.warmup_pods,
        anti_affinity_pods: args.anti_affinity_pods,
        affinity_pods: args.affinity_pods,
        spread_pods: args.spread_pods,
        preemption_pods: args.preemption_pods,
        pending_pods: args.pending_pods,
        fill_to: if args.skip_fill { 0 } else { args.fill_to },
        create_clients: args.create_clients,
        creates_to_every_member: args.creates_to_every_member,
        bind_timeout: args.bind_timeout,
        stall_timeout: args.stall_timeout,
        idle_window: args.idle_window,
        stand_in: args.stand_in,
        scheduler_leader_elect: args.scheduler_leader_elect,
        percentage_of_nodes_to_score: args.percentage_of_nodes_to_score,
        scheduler_args: args.scheduler_args.clone(),
    };
    let result = run.conclude(scheduler::run(&config).await, args.keep)?;
    println!("\n{}", result.table());
    if let Some(readme) = &args.readme {
        let section = result.markdown(&run.date, &run.command, &run.machine);
        report::write_section(readme, scheduler::BEGIN, scheduler::END, "Latest results: the scheduler", &section)?;
        eprintln!("results written to {}", readme.display());
    }
    Ok(())
}

async fn run_node(args: &NodeArgs) -> Result<()> {
    let mut run = RunSetup::new("skiff-bench-node-", &args.skiff, args.command_line.as_deref(), args.dir.as_deref())?;
    run.machine.push(("containerd".into(), version(Path::new("containerd"))));
    run.machine.push(("runc".into(), version(Path::new("runc"))));
    let config = node::NodeConfig {
        skiff: args.skiff.clone(),
        dir: run.path.clone(),
        members: args.members,
        skiff_args: args.skiff_args.clone(),
        nodes: args.nodes,
        cidr_base: args.cidr_base,
        pods: args.pods,
        single_runs: args.single_runs,
        create_clients: args.create_clients,
        bind_directly: args.bind_directly,
        start_timeout: args.start_timeout,
        idle_window: args.idle_window,
        settle: args.settle,
        steady_window: args.steady_window,
        node_args: args.node_args.clone(),
        scheduler_args: args.scheduler_args.clone(),
    };
    let result = run.conclude(node::run(&config).await, args.keep)?;
    println!("\n{}", result.table());
    for line in result.details().iter().chain(&result.notes) {
        println!("- {line}");
    }
    if let Some(readme) = &args.readme {
        let section = result.markdown(&run.date, &run.command, &run.machine);
        report::write_section(readme, node::BEGIN, node::END, "Latest results: the node agent", &section)?;
        eprintln!("results written to {}", readme.display());
    }
    Ok(())
}

async fn run_proxy(args: &ProxyArgs) -> Result<()> {
    let Some(netns) = &args.inside else {
        // Again, inside a network namespace of its own, described as this command.
        let mut again: Vec<String> = std::env::args().skip(1).collect();
        if args.command_line.is_none() {
            again.extend(["--command-line".into(), std::env::args().collect::<Vec<_>>().join(" ")]);
        }
        return proxy::in_namespace(&again).await;
    };
    let mut run = RunSetup::new("skiff-bench-proxy-", &args.skiff, args.command_line.as_deref(), args.dir.as_deref())?;
    run.machine.push(("iptables".into(), version(Path::new("iptables"))));
    run.machine.push(("nft".into(), version(Path::new("nft"))));
    let config = proxy::ProxyConfig {
        skiff: args.skiff.clone(),
        dir: run.path.clone(),
        netns: netns.clone(),
        skiff_args: args.skiff_args.clone(),
        services: args.services,
        endpoints: args.endpoints,
        full_runs: args.full_runs,
        incremental_runs: args.incremental_runs,
        dns_clients: args.dns_clients,
        dns_duration: args.dns_duration,
        ready_runs: args.ready_runs,
        ready_timeout: args.ready_timeout,
        modes: args
            .modes
            .iter()
            .map(
                |m| if m == "nftables" { skiff_node::proxy::Mode::Nftables } else { skiff_node::proxy::Mode::Iptables },
            )
            .collect(),
    };
    let result = run.conclude(proxy::run(&config).await, args.keep)?;
    println!("\n{}", result.table());
    for line in result.details() {
        println!("- {line}");
    }
    if let Some(readme) = &args.readme {
        let section = result.markdown(&run.date, &run.command, &run.machine);
        report::write_section(readme, proxy::BEGIN, proxy::END, "Latest results: the service proxy", &section)?;
        eprintln!("results written to {}", readme.display());
    }
    Ok(())
}

/// What every measured run starts with: the machine's facts, the command
/// line and date for the README, and a fresh directory for logs and data
/// (removed after a good run unless kept).
struct RunSetup {
    machine: Vec<(String, String)>,
    command: String,
    date: String,
    path: PathBuf,
    dir: Option<tempfile::TempDir>,
}

impl RunSetup {
    fn new(name: &str, skiff: &Path, command_line: Option<&str>, parent: Option<&Path>) -> Result<RunSetup> {
        let mut machine = report::machine_facts();
        machine.push(("Skiff".into(), format!("{} (commit {})", version(skiff), commit())));
        let command = command_line
            .map(|c| c.trim().to_string())
            .unwrap_or_else(|| std::env::args().collect::<Vec<_>>().join(" "));
        let date = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
        let parent = parent.map(Path::to_path_buf).unwrap_or_else(std::env::temp_dir);
        std::fs::create_dir_all(&parent).with_context(|| format!("creating {}", parent.display()))?;
        let dir = tempfile::Builder::new()
            .prefix(name)
            .tempdir_in(&parent)
            .with_context(|| format!("creating a directory under {}", parent.display()))?;
        Ok(RunSetup { machine, command, date, path: dir.path().to_path_buf(), dir: Some(dir) })
    }

    /// The run's result. The directory is kept when the run failed or
    /// `keep` asks; after a good run the load average is noted.
    fn conclude<R>(&mut self, outcome: Result<R>, keep: bool) -> Result<R> {
        match outcome {
            Err(e) => Err(e.context(format!("logs kept in {}", self.keep().display()))),
            Ok(result) => {
                if keep {
                    eprintln!("logs and data kept in {}", self.keep().display());
                }
                self.machine.push(("load average after the run".into(), report::load_average()));
                Ok(result)
            }
        }
    }

    fn keep(&mut self) -> PathBuf {
        match self.dir.take() {
            Some(dir) => dir.keep(),
            None => self.path.clone(),
        }
    }
}

/// The commit of the working tree the harness runs in (`make bench` runs at
/// the root of the clone), with `-dirty` when it has uncommitted changes.
fn commit() -> String {
    std::process::Command::new("git")
        .args(["describe", "--always", "--dirty"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// The first line of `BINARY --version`.
fn version(binary: &Path) -> String {
    std::process::Command::new(binary)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(str::to_string))
        .unwrap_or_else(|| "unknown".into())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result =
        tokio::runtime::Runtime::new().context("starting the tokio runtime").and_then(|rt| rt.block_on(run(cli)));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("skiff-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}
