//! `skiff-bench node`: the node agent's pod startup latency and footprint,
//! for issue 23, with real containers: a fresh Skiff (`skiff apiserver`
//! members on loopback), one `skiff scheduler` process (unless pods are
//! bound by `spec.nodeName` at creation) and `nodes` real `skiff node`
//! agents, each with its private containerd, runc and CNI bridge on pod
//! CIDR 10.244.(cidr_base + i).0/24. Needs root, as `skiff node` does.
//!
//! One watch of the benchmark's namespace records, per pod, when it was
//! first seen bound (`spec.nodeName`), Running (`status.phase`), Ready (the
//! Ready condition True) and deleted. A pod's startup latency runs from
//! its create being sent to its Running seen by that watch, as
//! Kubernetes' density test measures it. The pod is busybox `sleep 3600`
//! from the built-in image (no registry), with a 1 s termination grace
//! period so that deleting it does not wait the default 30 s (`sleep` as
//! PID 1 ignores SIGTERM).
//!
//! Steps, in order:
//! 1. **Idle**: with the nodes Ready and no pods, each agent's CPU over
//!    `idle_window` and its RSS.
//! 2. **Single pod**, `single_runs` times one after the other: create, wait
//!    for Running, delete, wait until it is gone.
//! 3. **Burst**: `pods` pods created by `create_clients` concurrent creates;
//!    CPU of every process of each node over the burst, RSS sampled every
//!    [`RSS_EVERY`] for the peak.
//! 4. **Steady**: after `settle`, CPU over `steady_window` and RSS with
//!    every burst pod running.
//! 5. **Clean up**: delete the burst pods and wait until they are gone,
//!    SIGTERM each agent (started with `--remove-pods-on-exit`: it removes
//!    its pods, bridge and containerd) and check that none of its
//!    containerd, shims, network namespaces or bridge remain; what does is
//!    removed and reported.
//!
//! A node's processes: the agent (`skiff node`), its containerd (the one
//! whose `--config` lies under the node's data dir), the shims
//! (`containerd-shim-runc-v2 ... -address <that containerd's socket>`) and
//! the containers' processes (the shims' children: each pod's pause and
//! `sleep`). RSS is `VmRSS` summed per group: shared pages (the one shim
//! binary, busybox) count once per process.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use serde_json::{json, Value};
use skiff_api::status::Reason;
use skiff_api::watch::EventType;
use skiff_api::Kind;
use skiff_client::resources::{DeleteParams, ListParams, WatchParams};
use skiff_client::{Client, ClientError};

use crate::cluster::{tail, Cluster, ClusterSpec, EtcdTiming, System};
use crate::cpu::clock_ticks_per_second;
use crate::hollow::{ensure_namespace, info, timed};
use crate::latency::Latency;
use crate::promtext::{self, Histogram};

/// Lines between these markers in bench/README.md are replaced by each run
/// of `skiff-bench node --readme`.
pub const BEGIN: &str = "<!-- skiff-bench node results: begin (written by `make bench-node`) -->";
pub const END: &str = "<!-- skiff-bench node results: end -->";

/// The benchmark's pods live here.
const NAMESPACE: &str = "bench-node";
/// Skiff's built-in busybox image: no registry involved.
pub const IMAGE: &str = "skiff.local/busybox:1";
/// How often waits poll the watch's records.
const POLL: Duration = Duration::from_millis(10);
/// How often RSS is sampled during the burst, for its peak.
pub const RSS_EVERY: Duration = Duration::from_millis(250);
/// How long an agent has to exit after SIGTERM before it is SIGKILLed.
const STOP_TIMEOUT: Duration = Duration::from_secs(90);
/// Deletes in flight at most when the burst's pods are cleaned up.
const DELETE_INFLIGHT: usize = 32;

#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// The `skiff` executable.
    pub skiff: PathBuf,
    /// The cluster's and the nodes' data and logs go here.
    pub dir: PathBuf,
    /// `skiff apiserver` members.
    pub members: usize,
    /// Extra flags for every member.
    pub skiff_args: Vec<String>,
    /// `skiff node` agents.
    pub nodes: usize,
    /// Node i's pod CIDR is 10.244.(cidr_base + i).0/24.
    pub cidr_base: u8,
    /// Pods of the burst.
    pub pods: usize,
    /// Single pods, one after the other.
    pub single_runs: usize,
    /// Concurrent creates of the burst.
    pub create_clients: usize,
    /// Set `spec.nodeName` at creation (round robin) instead of running `skiff scheduler`.
    pub bind_directly: bool,
    /// A pod (single) or the burst's last pod not Running within this long fails the run.
    pub start_timeout: Duration,
    pub idle_window: Duration,
    /// Pause between the burst's last pod Running and the steady window.
    pub settle: Duration,
    pub steady_window: Duration,
    /// Extra flags for every `skiff node`.
    pub node_args: Vec<String>,
    /// Extra flags for `skiff scheduler`.
    pub scheduler_args: Vec<String>,
}

/// The pod `name`: busybox `sleep 3600`, bound to `node` when given.
pub fn pod(name: &str, node: Option<&str>) -> Value {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "bench-node"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "sleep", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
                            "command": ["sleep", "3600"]}],
        },
    });
    if let Some(node) = node {
        pod["spec"]["nodeName"] = json!(node);
    }
    pod
}

pub fn node_name(i: usize) -> String {
    format!("bench-node-{i}")
}

/// What the watch saw of one pod, and when its create and delete were sent.
#[derive(Clone, Debug, Default)]
pub struct PodTimes {
    pub sent: Option<Instant>,
    pub bound: Option<Instant>,
    pub running: Option<Instant>,
    pub ready: Option<Instant>,
    pub delete_sent: Option<Instant>,
    pub gone: Option<Instant>,
    pub node: String,
}

impl PodTimes {
    /// Records what `pod` shows for the first time, seen at `at`.
    pub fn observe(&mut self, pod: &Value, at: Instant) {
        if let Some(node) = pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) {
            self.bound.get_or_insert(at);
            self.node = node.to_string();
        }
        if pod["status"]["phase"] == "Running" {
            self.running.get_or_insert(at);
        }
        let ready = pod["status"]["conditions"]
            .as_array()
            .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"));
        if ready {
            self.ready.get_or_insert(at);
        }
    }

    fn since_sent(&self, at: Option<Instant>) -> Option<Duration> {
        Some(at?.saturating_duration_since(self.sent?))
    }
}

/// Every pod of the namespace as the watch saw it, by name.
type Seen = Arc<Mutex<HashMap<String, PodTimes>>>;

fn with_pod<T>(seen: &Seen, name: &str, f: impl FnOnce(&mut PodTimes) -> T) -> Option<T> {
    seen.lock().ok().map(|mut s| f(s.entry(name.to_string()).or_default()))
}

/// Lists, then watches the namespace from the list's revision, recording
/// into `seen`; lists again after a failed or compacted watch.
async fn watch_pods(client: Client, seen: Seen, watching: Arc<tokio::sync::Notify>, stop: Arc<AtomicBool>) {
    let mut from: Option<String> = None;
    while !stop.load(Ordering::Relaxed) {
        let rv = match from.take() {
            Some(rv) => rv,
            None => match timed(client.list_all(info(Kind::Pod), NAMESPACE, &ListParams::default())).await {
                Ok(list) => {
                    let at = Instant::now();
                    for pod in &list.items {
                        if let Some(name) = pod["metadata"]["name"].as_str() {
                            with_pod(&seen, name, |t| t.observe(pod, at));
                        }
                    }
                    list.resource_version
                }
                Err(e) => {
                    eprintln!("skiff-bench: node pod list: {e:#}; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            },
        };
        let params = WatchParams { resource_version: rv.clone(), ..Default::default() };
        let mut stream = match client.watch(info(Kind::Pod), NAMESPACE, &params).await {
            Ok(s) => Box::pin(s),
            Err(e) => {
                eprintln!("skiff-bench: node pod watch: {e}; listing again");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        watching.notify_one();
        let mut last = rv;
        let mut relist = false;
        while let Some(event) = stream.next().await {
            let at = Instant::now();
            let event = match event {
                Ok(event) => event,
                Err(e) => {
                    if !stop.load(Ordering::Relaxed) {
                        eprintln!("skiff-bench: node pod watch ended: {e}");
                    }
                    break;
                }
            };
            if event.kind == EventType::Error {
                relist = true;
                break;
            }
            if let Some(rv) = event.resource_version() {
                last = rv.to_string();
            }
            let Some(name) = event.object["metadata"]["name"].as_str() else { continue };
            match event.kind {
                EventType::Added | EventType::Modified => {
                    with_pod(&seen, name, |t| t.observe(&event.object, at));
                }
                EventType::Deleted => {
                    with_pod(&seen, name, |t| {
                        t.gone.get_or_insert(at);
                    });
                }
                _ => {}
            }
        }
        from = (!relist).then_some(last);
    }
}

/// One `skiff node` or `skiff scheduler` process. Dropping it stops it:
/// SIGTERM and a wait for an agent, SIGKILL for the scheduler.
struct Process {
    name: String,
    child: Option<Child>,
    log: PathBuf,
    /// SIGTERM on drop (the agent removes its pods on exit).
    graceful: bool,
}

impl Process {
    fn spawn(mut cmd: Command, name: &str, log: PathBuf, graceful: bool) -> Result<Process> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("opening {}", log.display()))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        Ok(Process { name: name.to_string(), child: Some(child), log, graceful })
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Why the process is gone, with its log tail; `None` while it runs.
    fn exited(&mut self) -> Option<String> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        self.child = None;
        Some(format!("{} exited ({status}); its log ({}) ends:\n{}", self.name, self.log.display(), tail(&self.log)))
    }

    /// Sends SIGTERM.
    fn terminate(&self) {
        if let Some(child) = &self.child {
            let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        }
    }

    /// SIGTERM, then waits up to `within` for the exit (SIGKILL after):
    /// how long it took, and whether it exited by itself.
    fn stop(&mut self, within: Duration) -> Option<(Duration, bool)> {
        let started = Instant::now();
        self.terminate();
        self.wait_exit(started, within)
    }

    /// Waits until `within` after `started` for the exit, then SIGKILLs.
    fn wait_exit(&mut self, started: Instant, within: Duration) -> Option<(Duration, bool)> {
        let mut child = self.child.take()?;
        while started.elapsed() < within {
            if let Ok(Some(_)) = child.try_wait() {
                return Some((started.elapsed(), true));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        Some((started.elapsed(), false))
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.graceful {
            self.stop(STOP_TIMEOUT);
        } else if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A process in `/proc`: its id, parent and arguments.
#[derive(Clone, Debug)]
pub struct ProcEntry {
    pub pid: u32,
    pub ppid: u32,
    pub args: Vec<String>,
}

/// Every process readable in `/proc` now.
pub fn processes() -> Vec<ProcEntry> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let Some(ppid) = parent_of(&stat) else { continue };
        let args = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|raw| {
                raw.split(|b| *b == 0)
                    .filter(|a| !a.is_empty())
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect()
            })
            .unwrap_or_default();
        out.push(ProcEntry { pid, ppid, args });
    }
    out
}

/// Field 4 of `/proc/PID/stat`, after the command name (which may hold spaces).
pub fn parent_of(stat: &str) -> Option<u32> {
    stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
}

/// One node's processes, found by its data dir.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeProcs {
    pub agent: Option<u32>,
    pub containerd: Vec<u32>,
    pub shims: Vec<u32>,
    /// The shims' children: each pod's pause and container processes.
    pub containers: Vec<u32>,
}

impl NodeProcs {
    /// The processes of the node whose data dir is `data_dir` among `procs`.
    pub fn find(procs: &[ProcEntry], agent: Option<u32>, data_dir: &Path) -> NodeProcs {
        let config = data_dir.join("containerd").join("config.toml");
        let socket = data_dir.join("containerd").join("containerd.sock");
        let (config, socket) = (config.to_string_lossy(), socket.to_string_lossy());
        let has = |p: &ProcEntry, flag: &str, value: &str| p.args.windows(2).any(|w| w[0] == flag && w[1] == value);
        let is_binary = |p: &ProcEntry, name: &str| {
            p.args.first().is_some_and(|a| Path::new(a).file_name().is_some_and(|f| f == name))
        };
        let containerd: Vec<u32> =
            procs.iter().filter(|p| is_binary(p, "containerd") && has(p, "--config", &config)).map(|p| p.pid).collect();
        let shims: Vec<u32> = procs
            .iter()
            .filter(|p| p.args.first().is_some_and(|a| a.contains("containerd-shim")) && has(p, "-address", &socket))
            .map(|p| p.pid)
            .collect();
        let shim_set: HashSet<u32> = shims.iter().copied().collect();
        let containers = procs.iter().filter(|p| shim_set.contains(&p.ppid)).map(|p| p.pid).collect();
        NodeProcs { agent, containerd, shims, containers }
    }

    /// Every pid but the agent's: what must be gone after the agent's exit.
    pub fn runtime_pids(&self) -> Vec<u32> {
        self.containerd.iter().chain(&self.shims).chain(&self.containers).copied().collect()
    }
}

/// The memory of a group of processes: `VmRSS` summed, which counts pages
/// shared between them once per process, and PSS summed (`Pss` of
/// `/proc/PID/smaps_rollup`: each shared page split among its sharers),
/// which adds up.
#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    pub processes: usize,
    pub rss_mib: f64,
    pub pss_mib: f64,
}

fn usage(pids: &[u32]) -> Usage {
    let mut u = Usage::default();
    for pid in pids {
        if let Ok(bytes) = crate::objects::rss_bytes(*pid) {
            u.processes += 1;
            u.rss_mib += bytes as f64 / 1024.0 / 1024.0;
            u.pss_mib += pss_kib(*pid).unwrap_or(0) as f64 / 1024.0;
        }
    }
    u
}

/// `Pss` of process `pid`, in KiB.
fn pss_kib(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    pss_of(&text)
}

/// The `Pss:` line of an smaps_rollup, in KiB.
pub fn pss_of(smaps_rollup: &str) -> Option<u64> {
    smaps_rollup.lines().find_map(|l| l.strip_prefix("Pss:")).and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// A node's footprint at one instant.
#[derive(Clone, Copy, Debug, Default)]
pub struct Footprint {
    pub agent: Usage,
    pub containerd: Usage,
    pub shims: Usage,
    pub containers: Usage,
}

impl Footprint {
    fn of(procs: &NodeProcs) -> Footprint {
        Footprint {
            agent: usage(&procs.agent.into_iter().collect::<Vec<_>>()),
            containerd: usage(&procs.containerd),
            shims: usage(&procs.shims),
            containers: usage(&procs.containers),
        }
    }

    fn max(&mut self, other: &Footprint) {
        let m = |a: &mut Usage, b: &Usage| {
            if b.rss_mib > a.rss_mib {
                *a = *b;
            }
        };
        m(&mut self.agent, &other.agent);
        m(&mut self.containerd, &other.containerd);
        m(&mut self.shims, &other.shims);
        m(&mut self.containers, &other.containers);
    }
}

/// CPU seconds per group of a node's processes over a window.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuShare {
    pub agent: f64,
    pub containerd: f64,
    pub shims: f64,
    pub containers: f64,
    pub wall: f64,
}

impl CpuShare {
    /// Percent of one core.
    pub fn percent(cpu_seconds: f64, wall: f64) -> f64 {
        if wall > 0.0 {
            100.0 * cpu_seconds / wall
        } else {
            0.0
        }
    }
}

/// utime + stime + cutime + cstime of the process whose `stat` file is at
/// `path`, in clock ticks: with the children it waited for, so the
/// short-lived helpers count (runc under a shim, CNI plugins and `shim
/// start` under containerd, `ip`, `iptables` and `ctr` under the agent).
pub fn cpu_ticks_with_children(path: &str) -> Result<u64> {
    let stat = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    ticks_of(&stat).with_context(|| format!("no CPU times in {path}"))
}

/// Fields 14 to 17 of a `/proc/PID/stat` line, summed.
pub fn ticks_of(stat: &str) -> Option<u64> {
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Fields count from 1 with the pid; `rest` starts at field 3.
    (14..=17).map(|n| fields.get(n - 3)?.parse::<i64>().ok().map(|v| v.max(0) as u64)).sum()
}

/// How busy the whole machine was over a window, from `/proc/stat`.
pub struct MachineCpu {
    busy: u64,
    total: u64,
}

impl MachineCpu {
    pub fn now() -> MachineCpu {
        let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        Self::parse(text.lines().next().unwrap_or_default())
    }

    /// The `cpu` line: user nice system idle iowait irq softirq steal ...
    pub fn parse(line: &str) -> MachineCpu {
        let v: Vec<u64> = line.split_whitespace().skip(1).take(8).filter_map(|f| f.parse().ok()).collect();
        let get = |i: usize| v.get(i).copied().unwrap_or(0);
        let idle = get(3) + get(4);
        let busy = get(0) + get(1) + get(2) + get(5) + get(6) + get(7);
        MachineCpu { busy, total: busy + idle }
    }

    /// Percent of all cores busy since `self`.
    pub fn busy_since(&self, later: &MachineCpu) -> f64 {
        let total = later.total.saturating_sub(self.total);
        if total == 0 {
            return 0.0;
        }
        100.0 * later.busy.saturating_sub(self.busy) as f64 / total as f64
    }
}

/// CPU ticks of every process of every node at the start of a window;
/// processes that appear during it count from zero, so the burst's new
/// shims and containers are counted whole.
struct CpuWindow {
    ticks: HashMap<u32, u64>,
    since: Instant,
    machine: MachineCpu,
}

impl CpuWindow {
    fn start(nodes: &[NodeProcs]) -> CpuWindow {
        let mut ticks = HashMap::new();
        for n in nodes {
            for pid in n.agent.iter().chain(n.runtime_pids().iter()) {
                if let Ok(t) = cpu_ticks_with_children(&format!("/proc/{pid}/stat")) {
                    ticks.insert(*pid, t);
                }
            }
        }
        CpuWindow { ticks, since: Instant::now(), machine: MachineCpu::now() }
    }

    /// The whole machine's busy percent (of all cores) since `start`.
    fn machine_busy(&self) -> f64 {
        self.machine.busy_since(&MachineCpu::now())
    }

    /// Each node's CPU since `start`, over the processes `nodes` lists now.
    fn finish(&self, nodes: &[NodeProcs]) -> Vec<CpuShare> {
        let tick = 1.0 / clock_ticks_per_second() as f64;
        let wall = self.since.elapsed().as_secs_f64();
        let used = |pids: &[u32]| -> f64 {
            pids.iter()
                .filter_map(|pid| {
                    let now = cpu_ticks_with_children(&format!("/proc/{pid}/stat")).ok()?;
                    Some(now.saturating_sub(self.ticks.get(pid).copied().unwrap_or(0)) as f64 * tick)
                })
                .sum()
        };
        nodes
            .iter()
            .map(|n| CpuShare {
                agent: used(&n.agent.into_iter().collect::<Vec<_>>()),
                containerd: used(&n.containerd),
                shims: used(&n.shims),
                containers: used(&n.containers),
                wall,
            })
            .collect()
    }
}

/// A started `skiff node` and where it keeps things.
struct NodeAgent {
    name: String,
    data_dir: PathBuf,
    pod_cidr: String,
    /// Its HTTP API (`/metrics`).
    listen: String,
    process: Process,
}

impl NodeAgent {
    fn start(config: &NodeConfig, endpoints: &[String], i: usize) -> Result<NodeAgent> {
        let name = node_name(i);
        let data_dir = config.dir.join(&name);
        let pod_cidr = format!("10.244.{}.0/24", config.cidr_base as usize + i);
        let listen = format!("127.0.0.1:{}", std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port());
        let mut cmd = Command::new(&config.skiff);
        cmd.args(["node", "--server", &endpoints.join(","), "--name", &name])
            .arg("--data-dir")
            .arg(&data_dir)
            .args(["--node-ip", "127.0.0.1", "--listen", &listen, "--pod-cidr", &pod_cidr])
            .arg("--remove-pods-on-exit")
            .args(&config.node_args);
        let process = Process::spawn(cmd, &format!("skiff node {name}"), config.dir.join(format!("{name}.log")), true)?;
        Ok(NodeAgent { name, data_dir, pod_cidr, listen, process })
    }

    fn procs(&self, all: &[ProcEntry]) -> NodeProcs {
        NodeProcs::find(all, self.process.pid(), &self.data_dir)
    }

    /// The bridge named in the CNI conflist the agent wrote under its data dir.
    fn bridge(&self) -> Option<String> {
        let mut pending = vec![self.data_dir.clone()];
        while let Some(dir) = pending.pop() {
            for entry in std::fs::read_dir(&dir).ok()?.flatten() {
                let path = entry.path();
                if path.is_dir() && !path.is_symlink() {
                    // containerd's root holds image layers: no conflist there.
                    if path.file_name().is_some_and(|f| f == "root") {
                        continue;
                    }
                    pending.push(path);
                } else if path.extension().is_some_and(|e| e == "conflist") {
                    let text = std::fs::read_to_string(&path).ok()?;
                    let conf: Value = serde_json::from_str(&text).ok()?;
                    let plugins = conf["plugins"].as_array()?;
                    return plugins.iter().find_map(|p| p["bridge"].as_str().map(str::to_string));
                }
            }
        }
        None
    }
}

/// Mount points under `dir` (the pods' network namespaces are bind mounts
/// under containerd's state dir).
fn mounts_under(dir: &Path) -> Vec<String> {
    let prefix = dir.to_string_lossy().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .filter(|m| m.starts_with(&prefix))
        .map(str::to_string)
        .collect()
}

/// Latency figures of a group of pods.
#[derive(Clone, Default)]
pub struct Startup {
    pub label: String,
    pub pods: usize,
    pub running: usize,
    pub bound: Latency,
    pub to_running: Latency,
    pub to_ready: Latency,
    /// Pods Running per second, from the first create sent to the last Running seen.
    pub rate: Option<f64>,
}

/// The startup figures of `names` from what the watch recorded.
pub fn startup(label: &str, names: &[String], seen: &HashMap<String, PodTimes>) -> Startup {
    let mut s = Startup { label: label.into(), pods: names.len(), ..Default::default() };
    let mut first: Option<Instant> = None;
    let mut last: Option<Instant> = None;
    for name in names {
        let Some(t) = seen.get(name) else { continue };
        if let Some(sent) = t.sent {
            first = Some(first.map_or(sent, |f| f.min(sent)));
        }
        if let Some(d) = t.since_sent(t.bound) {
            s.bound.record(d);
        }
        if let Some(d) = t.since_sent(t.ready) {
            s.to_ready.record(d);
        }
        if let (Some(d), Some(at)) = (t.since_sent(t.running), t.running) {
            s.to_running.record(d);
            s.running += 1;
            last = Some(last.map_or(at, |l| l.max(at)));
        }
    }
    s.rate = match (first, last) {
        (Some(f), Some(l)) if l > f && s.running > 1 => Some(s.running as f64 / (l - f).as_secs_f64()),
        _ => None,
    };
    s
}

/// A burst's course, in seconds from its first create sent.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Timeline {
    pub last_create: f64,
    /// When the first, the 25th, 50th and 75th percent, and the last pod were seen Running.
    pub running: [f64; 5],
}

/// The course of the burst `names`.
pub fn timeline(names: &[String], seen: &HashMap<String, PodTimes>) -> Timeline {
    let times: Vec<&PodTimes> = names.iter().filter_map(|n| seen.get(n)).collect();
    let Some(first) = times.iter().filter_map(|t| t.sent).min() else { return Timeline::default() };
    let secs = |at: Instant| at.saturating_duration_since(first).as_secs_f64();
    let last_create = times.iter().filter_map(|t| t.sent).map(secs).fold(0.0, f64::max);
    let mut running: Vec<f64> = times.iter().filter_map(|t| t.running).map(secs).collect();
    running.sort_by(f64::total_cmp);
    let at = |q: f64| match running.len() {
        0 => 0.0,
        n => running[((n - 1) as f64 * q).round() as usize],
    };
    Timeline { last_create, running: [at(0.0), at(0.25), at(0.5), at(0.75), at(1.0)] }
}

/// One node's resource figures.
#[derive(Clone, Default)]
pub struct NodeRow {
    pub name: String,
    pub pod_cidr: String,
    /// Burst pods bound to it.
    pub pods: usize,
    /// Its burst pods' create→Running.
    pub to_running: Latency,
    pub idle: Footprint,
    pub idle_cpu: CpuShare,
    pub burst_peak: Footprint,
    pub burst_cpu: CpuShare,
    pub steady: Footprint,
    pub steady_cpu: CpuShare,
    /// SIGTERM to exit, and whether it exited by itself.
    pub stop: Option<(Duration, bool)>,
}

#[derive(Default)]
pub struct NodeReport {
    pub single: Startup,
    pub burst: Startup,
    pub nodes: Vec<NodeRow>,
    /// Delete sent to gone seen, per single pod.
    pub single_delete: Latency,
    /// Each single pod's create→Running and its node, in order.
    pub single_each: Vec<String>,
    /// When the burst's creates were sent and its pods seen Running.
    pub burst_timeline: Timeline,
    /// The whole machine's busy percent of all its cores: idle, burst, steady windows.
    pub machine_busy: [f64; 3],
    /// Deleting the burst's pods: all deletes sent to the last one gone.
    pub burst_delete: Option<Duration>,
    /// [`PHASES`] as the agents timed them for the single pods and the burst.
    pub single_phases: Vec<Histogram>,
    pub burst_phases: Vec<Histogram>,
    /// Each agent's CRI calls per second by operation in the steady window.
    pub steady_calls: Vec<Vec<(String, f64)>>,
    pub settings: Vec<String>,
    pub notes: Vec<String>,
}

/// Waits until `done` holds for what the watch saw, or fails after `within`
/// (or when an agent or the scheduler exits).
async fn wait_for(
    seen: &Seen,
    what: &str,
    within: Duration,
    processes: &mut [&mut Process],
    mut done: impl FnMut(&HashMap<String, PodTimes>) -> bool,
) -> Result<()> {
    let deadline = Instant::now() + within;
    loop {
        if seen.lock().map(|s| done(&s)).unwrap_or(false) {
            return Ok(());
        }
        for p in processes.iter_mut() {
            if let Some(why) = p.exited() {
                bail!("waiting for {what}: {why}");
            }
        }
        if Instant::now() > deadline {
            bail!("{what}: not within {within:?}");
        }
        tokio::time::sleep(POLL).await;
    }
}

async fn create(client: &Client, seen: &Seen, name: &str, node: Option<&str>) -> Result<()> {
    with_pod(seen, name, |t| t.sent = Some(Instant::now()));
    match timed(client.create(info(Kind::Pod), NAMESPACE, &pod(name, node))).await {
        Ok(_) => Ok(()),
        Err(e) if e.downcast_ref::<ClientError>().is_some_and(|e| e.is(Reason::AlreadyExists)) => Ok(()),
        Err(e) => Err(e.context(format!("creating pod {name}"))),
    }
}

/// Deletes pod `name` with its own grace period (1 s).
async fn delete(client: &Client, seen: &Seen, name: &str) -> Result<()> {
    with_pod(seen, name, |t| t.delete_sent = Some(Instant::now()));
    match timed(client.delete(info(Kind::Pod), NAMESPACE, name, &DeleteParams::default())).await {
        Ok(_) => Ok(()),
        Err(e) if e.downcast_ref::<ClientError>().is_some_and(|e| e.is(Reason::NotFound)) => Ok(()),
        Err(e) => Err(e.context(format!("deleting pod {name}"))),
    }
}

/// The agents' processes now, in node order.
/// Each agent's `/metrics` (`None` where the scrape failed).
async fn scrape_agents(agents: &[NodeAgent]) -> Vec<Option<String>> {
    let scrapes = agents.iter().map(|a| crate::controllers::http_get(&a.listen, "/metrics"));
    futures::future::join_all(scrapes).await.into_iter().map(Result::ok).collect()
}

/// The phases of a pod's start the agents time, as (label, histogram, operation).
const PHASES: [(&str, &str, Option<&str>); 4] = [
    ("agent: pod taken on → Running", "kubelet_pod_start_duration_seconds", None),
    ("RunPodSandbox (pause container, CNI)", "kubelet_runtime_operations_duration_seconds", Some("run_podsandbox")),
    ("CreateContainer", "kubelet_runtime_operations_duration_seconds", Some("create_container")),
    ("StartContainer", "kubelet_runtime_operations_duration_seconds", Some("start_container")),
];

/// Each agent's CRI calls per second by operation between two scrapes
/// `window` apart, busiest first.
pub fn runtime_calls(before: &[Option<String>], after: &[Option<String>], window: Duration) -> Vec<Vec<(String, f64)>> {
    let read = |text: &Option<String>| {
        promtext::counters(text.as_deref().unwrap_or(""), "kubelet_runtime_operations_total", "operation_type")
    };
    before
        .iter()
        .zip(after)
        .map(|(b, a)| {
            let earlier = read(b);
            let mut rates: Vec<(String, f64)> = read(a)
                .into_iter()
                .map(|(op, n)| {
                    let was = earlier.iter().find(|(o, _)| *o == op).map_or(0.0, |(_, v)| *v);
                    (op, (n - was) / window.as_secs_f64())
                })
                .filter(|(_, rate)| *rate > 0.0)
                .collect();
            rates.sort_by(|x, y| y.1.total_cmp(&x.1));
            rates
        })
        .collect()
}

/// Each of [`PHASES`] observed by every agent between the scrapes
/// `before` and `after` (one of each per agent, in order).
pub fn phases(before: &[Option<String>], after: &[Option<String>]) -> Vec<Histogram> {
    PHASES
        .iter()
        .map(|(_, name, operation)| {
            let select: Vec<(&str, &str)> = operation.iter().map(|op| ("operation_type", *op)).collect();
            let mut all = Histogram::default();
            for (b, a) in before.iter().zip(after) {
                let read = |text: &Option<String>| text.as_deref().and_then(|t| promtext::histogram(t, name, &select));
                if let Some(a) = read(a) {
                    all.merge(&a.since(read(b).as_ref()));
                }
            }
            all
        })
        .collect()
}

fn node_procs(agents: &[NodeAgent]) -> Vec<NodeProcs> {
    let all = processes();
    agents.iter().map(|a| a.procs(&all)).collect()
}

/// Launches everything, runs the steps, stops it all, and checks nothing is left.
pub async fn run(config: &NodeConfig) -> Result<NodeReport> {
    if config.nodes == 0 || config.create_clients == 0 || config.members == 0 {
        bail!("--nodes, --create-clients and --members must be positive");
    }
    if config.cidr_base as usize + config.nodes > 256 {
        bail!("--cidr-base {} leaves no /24 inside 10.244.0.0/16 for {} nodes", config.cidr_base, config.nodes);
    }
    if !is_root() {
        bail!("`skiff node` runs containers and needs root; run this as root");
    }
    let spec = ClusterSpec {
        system: System::Skiff,
        binary: config.skiff.clone(),
        members: config.members,
        dir: config.dir.clone(),
        etcd_timing: EtcdTiming { heartbeat_ms: 40, election_timeout_ms: 200 },
        extra_args: config.skiff_args.clone(),
        skiff_subcommand: "apiserver",
    };
    eprintln!("== Skiff: starting {} members (`skiff apiserver`) in {}", config.members, config.dir.display());
    let mut cluster = Cluster::launch(spec).await?;
    let leader = cluster.must_leader().await?;
    let mut endpoints = cluster.endpoints();
    endpoints.rotate_left(leader);
    let client = Client::new(&endpoints)?;
    ensure_namespace(&client, NAMESPACE).await?;
    let mut report = NodeReport::default();
    report.settings.push(format!(
        "{} Skiff member(s) on 127.0.0.1 (`skiff apiserver`{}), data under {} (fsync on)",
        config.members,
        if config.skiff_args.is_empty() { String::new() } else { format!(" {}", config.skiff_args.join(" ")) },
        config.dir.display()
    ));

    let mut scheduler = if config.bind_directly {
        report.settings.push("no scheduler: every pod is created with `spec.nodeName` set, round robin".into());
        None
    } else {
        let http = format!("127.0.0.1:{}", std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port());
        let mut cmd = Command::new(&config.skiff);
        cmd.args(["scheduler", "--server", &endpoints.join(","), "--http-listen", &http])
            .args(["--leader-elect", "false", "--identity", "bench-scheduler"])
            .args(&config.scheduler_args);
        report.settings.push(format!(
            "one `skiff scheduler --leader-elect false{}` binds the pods",
            if config.scheduler_args.is_empty() {
                String::new()
            } else {
                format!(" {}", config.scheduler_args.join(" "))
            }
        ));
        Some(Process::spawn(cmd, "skiff scheduler", config.dir.join("scheduler.log"), false)?)
    };

    // Declared after the cluster, so dropped before it: the agents stop
    // (removing their pods) while the apiservers still run.
    let mut agents = Vec::new();
    for i in 0..config.nodes {
        let agent = NodeAgent::start(config, &endpoints, i)?;
        eprintln!("  started {} (pod CIDR {}), data in {}", agent.name, agent.pod_cidr, agent.data_dir.display());
        agents.push(agent);
    }
    let started = Instant::now();
    for agent in &mut agents {
        wait_node_ready(&client, agent, Duration::from_secs(180)).await?;
    }
    let ready_after = started.elapsed();
    eprintln!("  {} nodes Ready after {:.1} s", config.nodes, ready_after.as_secs_f64());
    report.settings.push(format!(
        "{} `skiff node` agents `bench-node-I` (`--node-ip 127.0.0.1 --pod-cidr 10.244.{}+I.0/24 \
         --remove-pods-on-exit{}`), each with its private containerd; all Ready {:.1} s after their start",
        config.nodes,
        config.cidr_base,
        if config.node_args.is_empty() { String::new() } else { format!(" {}", config.node_args.join(" ")) },
        ready_after.as_secs_f64()
    ));
    report.nodes = agents
        .iter()
        .map(|a| NodeRow { name: a.name.clone(), pod_cidr: a.pod_cidr.clone(), ..Default::default() })
        .collect();
    let bridges: Vec<Option<String>> = agents.iter().map(NodeAgent::bridge).collect();

    let seen: Seen = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let watching = Arc::new(tokio::sync::Notify::new());
    let watch = tokio::spawn(watch_pods(client.clone(), seen.clone(), watching.clone(), stop.clone()));
    tokio::time::timeout(Duration::from_secs(60), watching.notified())
        .await
        .context("the pod watch did not start within 60 s")?;

    let outcome = steps(config, &client, &seen, &mut agents, &mut scheduler, &mut report).await;
    stop.store(true, Ordering::Relaxed);
    watch.abort();
    drop(scheduler);

    // SIGTERM every agent at once: each removes its pods and stops its containerd.
    eprintln!("  stopping the agents (SIGTERM)");
    let before = node_procs(&agents);
    let stopping = Instant::now();
    for agent in &agents {
        agent.process.terminate();
    }
    for (agent, row) in agents.iter_mut().zip(report.nodes.iter_mut()) {
        row.stop = agent.process.wait_exit(stopping, STOP_TIMEOUT);
    }
    let leftovers = clean_up_leftovers(&agents, &before, &bridges);
    if leftovers.is_empty() {
        report.notes.push(format!(
            "after the agents' exit no containerd, shim, container process, network namespace mount or bridge of \
             theirs remained (checked: processes under each node's data dir and their children, mounts under \
             it, bridges {})",
            bridges.iter().flatten().cloned().collect::<Vec<_>>().join(", ")
        ));
    } else {
        report.notes.push(format!(
            "LEFT BEHIND after the agents' exit (then removed by the harness): {}",
            leftovers.join("; ")
        ));
    }
    drop(agents);
    drop(cluster);
    outcome.map(|()| report)
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false)
}

async fn wait_node_ready(client: &Client, agent: &mut NodeAgent, within: Duration) -> Result<()> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(why) = agent.process.exited() {
            bail!("{why}");
        }
        if let Ok(node) = timed(client.get(info(Kind::Node), "", &agent.name)).await {
            let ready = node["status"]["conditions"]
                .as_array()
                .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"));
            if ready {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            bail!(
                "node {} not Ready within {within:?}; its log ({}) ends:\n{}",
                agent.name,
                agent.process.log.display(),
                tail(&agent.process.log)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Idle, single pods, burst, steady state, and the burst's deletion.
async fn steps(
    config: &NodeConfig,
    client: &Client,
    seen: &Seen,
    agents: &mut [NodeAgent],
    scheduler: &mut Option<Process>,
    report: &mut NodeReport,
) -> Result<()> {
    let node_names: Vec<String> = agents.iter().map(|a| a.name.clone()).collect();
    let target = |i: usize| config.bind_directly.then(|| node_names[i % node_names.len()].clone());

    // 1. Idle.
    eprintln!("  idle: {:?} with no pods", config.idle_window);
    let procs = node_procs(agents);
    let window = CpuWindow::start(&procs);
    tokio::time::sleep(config.idle_window).await;
    report.machine_busy[0] = window.machine_busy();
    let procs = node_procs(agents);
    for ((row, cpu), p) in report.nodes.iter_mut().zip(window.finish(&procs)).zip(&procs) {
        row.idle_cpu = cpu;
        row.idle = Footprint::of(p);
    }

    // 2. Single pods, one after the other.
    eprintln!("  single pod: {} runs", config.single_runs);
    let scraped_before_single = scrape_agents(agents).await;
    let mut single = Vec::new();
    for i in 0..config.single_runs {
        let name = format!("single-{i}");
        create(client, seen, &name, target(i).as_deref()).await?;
        let mut watched = watched_processes(agents, scheduler);
        let n = name.clone();
        wait_for(seen, &format!("pod {name} Running"), config.start_timeout, &mut watched, |s| {
            s.get(&n).is_some_and(|t| t.running.is_some())
        })
        .await?;
        delete(client, seen, &name).await?;
        wait_for(seen, &format!("pod {name} gone"), config.start_timeout, &mut watched, |s| {
            s.get(&n).is_some_and(|t| t.gone.is_some())
        })
        .await?;
        if let Ok(s) = seen.lock() {
            if let Some(t) = s.get(&name) {
                if let (Some(a), Some(b)) = (t.delete_sent, t.gone) {
                    report.single_delete.record(b.saturating_duration_since(a));
                }
                let each = format!(
                    "{:.0} ms ({})",
                    t.since_sent(t.running).unwrap_or_default().as_secs_f64() * 1000.0,
                    t.node
                );
                eprintln!("     {name}: Running after {each}");
                report.single_each.push(each);
            }
        }
        single.push(name);
    }
    if let Ok(s) = seen.lock() {
        report.single = startup(&format!("1 pod, {} times one after the other", config.single_runs), &single, &s);
        // Pods one after the other, each deleted before the next: no rate.
        report.single.rate = None;
    }

    // 3. Burst.
    let scraped_before_burst = scrape_agents(agents).await;
    report.single_phases = phases(&scraped_before_single, &scraped_before_burst);
    eprintln!("  burst: {} pods, {} concurrent creates", config.pods, config.create_clients);
    let names: Vec<String> = (0..config.pods).map(|i| format!("burst-{i}")).collect();
    let procs = node_procs(agents);
    let window = CpuWindow::start(&procs);
    let sampling = Arc::new(AtomicBool::new(true));
    let peaks = {
        let data_dirs: Vec<(Option<u32>, PathBuf)> =
            agents.iter().map(|a| (a.process.pid(), a.data_dir.clone())).collect();
        let sampling = sampling.clone();
        tokio::task::spawn_blocking(move || {
            let mut peaks = vec![Footprint::default(); data_dirs.len()];
            while sampling.load(Ordering::Relaxed) {
                let all = processes();
                for ((pid, dir), peak) in data_dirs.iter().zip(peaks.iter_mut()) {
                    peak.max(&Footprint::of(&NodeProcs::find(&all, *pid, dir)));
                }
                std::thread::sleep(RSS_EVERY);
            }
            peaks
        })
    };
    let next = AtomicUsize::new(0);
    let creates = (0..config.create_clients.min(config.pods.max(1))).map(|_| async {
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= config.pods {
                return Ok::<(), anyhow::Error>(());
            }
            create(client, seen, &names[i], target(i).as_deref()).await?;
        }
    });
    let created = futures::future::join_all(creates).await;
    created.into_iter().collect::<Result<Vec<()>>>()?;
    let mut watched = watched_processes(agents, scheduler);
    let waited =
        wait_for(seen, &format!("{} burst pods Running", config.pods), config.start_timeout, &mut watched, |s| {
            names.iter().all(|n| s.get(n).is_some_and(|t| t.running.is_some()))
        })
        .await;
    drop(watched);
    report.burst_phases = phases(&scraped_before_burst, &scrape_agents(agents).await);
    report.machine_busy[1] = window.machine_busy();
    let procs = node_procs(agents);
    let burst_cpu = window.finish(&procs);
    sampling.store(false, Ordering::Relaxed);
    let peaks = peaks.await.context("the RSS sampler")?;
    if let Ok(s) = seen.lock() {
        report.burst = startup(&format!("{} pods at once on {} nodes", config.pods, config.nodes), &names, &s);
        for row in report.nodes.iter_mut() {
            for t in names.iter().filter_map(|n| s.get(n)).filter(|t| t.node == row.name) {
                row.pods += 1;
                if let Some(d) = t.since_sent(t.running) {
                    row.to_running.record(d);
                }
            }
        }
        report.burst_timeline = timeline(&names, &s);
    }
    for ((row, cpu), peak) in report.nodes.iter_mut().zip(burst_cpu).zip(peaks) {
        row.burst_cpu = cpu;
        row.burst_peak = peak;
    }
    if let Err(e) = waited {
        report.notes.push(format!("the burst did not finish: {e:#}"));
        return Err(e);
    }
    eprintln!("     {}", report.burst.summary());

    // 4. Steady state.
    eprintln!("  steady: {:?} to settle, then {:?} measured", config.settle, config.steady_window);
    tokio::time::sleep(config.settle).await;
    let procs = node_procs(agents);
    let window = CpuWindow::start(&procs);
    let scraped_before_steady = scrape_agents(agents).await;
    tokio::time::sleep(config.steady_window).await;
    let scraped_after_steady = scrape_agents(agents).await;
    report.steady_calls = runtime_calls(&scraped_before_steady, &scraped_after_steady, config.steady_window);
    report.machine_busy[2] = window.machine_busy();
    let procs = node_procs(agents);
    for ((row, cpu), p) in report.nodes.iter_mut().zip(window.finish(&procs)).zip(&procs) {
        row.steady_cpu = cpu;
        row.steady = Footprint::of(p);
    }

    // 5. Delete the burst's pods.
    eprintln!("  deleting the burst's {} pods", config.pods);
    let deleting = Instant::now();
    let results = futures::stream::iter(names.iter())
        .map(|name| delete(client, seen, name))
        .buffer_unordered(DELETE_INFLIGHT)
        .collect::<Vec<Result<()>>>()
        .await;
    results.into_iter().collect::<Result<Vec<()>>>()?;
    let mut watched = watched_processes(agents, scheduler);
    wait_for(seen, "the burst's pods gone", config.start_timeout, &mut watched, |s| {
        names.iter().all(|n| s.get(n).is_some_and(|t| t.gone.is_some()))
    })
    .await?;
    report.burst_delete = Some(deleting.elapsed());
    Ok(())
}

fn watched_processes<'a>(agents: &'a mut [NodeAgent], scheduler: &'a mut Option<Process>) -> Vec<&'a mut Process> {
    agents.iter_mut().map(|a| &mut a.process).chain(scheduler.as_mut()).collect()
}

/// After the agents' exit: SIGKILLs what is left of their runtimes,
/// unmounts what is left under their data dirs, deletes their bridges;
/// says what there was.
fn clean_up_leftovers(agents: &[NodeAgent], before: &[NodeProcs], bridges: &[Option<String>]) -> Vec<String> {
    let mut found = Vec::new();
    let all = processes();
    let alive: HashSet<u32> = all.iter().map(|p| p.pid).collect();
    for ((agent, was), bridge) in agents.iter().zip(before).zip(bridges) {
        let now = NodeProcs::find(&all, None, &agent.data_dir);
        // Also the container processes seen before the stop, reparented since.
        let mut pids: Vec<u32> = now.runtime_pids();
        let reparented: Vec<u32> =
            was.runtime_pids().into_iter().filter(|p| alive.contains(p) && !pids.contains(p)).collect();
        pids.extend(reparented);
        if !pids.is_empty() {
            found.push(format!("{}: processes {pids:?}", agent.name));
            for pid in &pids {
                let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            }
        }
        let mounts = mounts_under(&agent.data_dir);
        if !mounts.is_empty() {
            found.push(format!("{}: mounts {}", agent.name, mounts.join(", ")));
            for m in mounts.iter().rev() {
                let _ = Command::new("umount").args(["-l", m]).status();
            }
        }
        if let Some(bridge) = bridge {
            if Path::new("/sys/class/net").join(bridge).exists() {
                found.push(format!("{}: bridge {bridge}", agent.name));
                let _ = Command::new("ip").args(["link", "delete", bridge, "type", "bridge"]).status();
            }
        }
    }
    found
}

fn ms(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0} ms")
    } else {
        format!("{v:.1} ms")
    }
}

impl Startup {
    pub fn summary(&self) -> String {
        format!(
            "{}: {}/{} Running, create→Running p50 {}, p99 {}, max {}{}",
            self.label,
            self.running,
            self.pods,
            ms(self.to_running.quantile_ms(0.5)),
            ms(self.to_running.quantile_ms(0.99)),
            ms(self.to_running.max_ms()),
            self.rate.map(|r| format!(", {r:.1} pods/s")).unwrap_or_default()
        )
    }
}

fn mib(u: &Usage) -> String {
    format!("{:.0} MiB", u.rss_mib)
}

fn rss_pss(u: &Usage) -> String {
    format!("{:.0} / {:.0} MiB", u.rss_mib, u.pss_mib)
}

fn pct(cpu: f64, wall: f64) -> String {
    format!("{:.1}%", CpuShare::percent(cpu, wall))
}

impl NodeReport {
    pub fn table(&self) -> String {
        let mut out = String::new();
        out.push_str(
            "| pods | Running | p50 create→Running | p99 | max | p50 create→bound | p50 create→Ready | pods/s |\n\
             | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
        );
        for s in [&self.single, &self.burst] {
            let _ = writeln!(
                out,
                "| {} | {}/{} | {} | {} | {} | {} | {} | {} |",
                s.label,
                s.running,
                s.pods,
                ms(s.to_running.quantile_ms(0.5)),
                ms(s.to_running.quantile_ms(0.99)),
                ms(s.to_running.max_ms()),
                ms(s.bound.quantile_ms(0.5)),
                ms(s.to_ready.quantile_ms(0.5)),
                s.rate.map(|r| format!("{r:.1}")).unwrap_or_else(|| "-".into()),
            );
        }
        out.push_str(&self.split_table());
        out.push_str(
            "\n| node | burst pods | agent RSS idle / burst peak / steady | agent CPU idle / burst / steady | \
             containerd steady RSS / PSS | shims steady: n, RSS / PSS | containers steady: n, RSS / PSS | \
             runtime CPU burst / steady |\n\
             | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
        );
        for r in &self.nodes {
            let runtime = |c: &CpuShare| c.containerd + c.shims + c.containers;
            let _ = writeln!(
                out,
                "| {} | {} | {} / {} / {} | {} / {} / {} | {} | {}, {} | {}, {} | {} / {} |",
                r.name,
                r.pods,
                mib(&r.idle.agent),
                mib(&r.burst_peak.agent),
                mib(&r.steady.agent),
                pct(r.idle_cpu.agent, r.idle_cpu.wall),
                pct(r.burst_cpu.agent, r.burst_cpu.wall),
                pct(r.steady_cpu.agent, r.steady_cpu.wall),
                rss_pss(&r.steady.containerd),
                r.steady.shims.processes,
                rss_pss(&r.steady.shims),
                r.steady.containers.processes,
                rss_pss(&r.steady.containers),
                pct(runtime(&r.burst_cpu), r.burst_cpu.wall),
                pct(runtime(&r.steady_cpu), r.steady_cpu.wall),
            );
        }
        out
    }

    /// Where the start time went: scheduling as the watch saw it, and the
    /// phases the agents time. Those come from histograms with buckets
    /// 1.5x apart: the mean is exact, p50 is interpolated within its bucket
    /// (as Prometheus' `histogram_quantile`), and for p99 the bucket that
    /// holds it is given.
    pub fn split_table(&self) -> String {
        let mut out =
            String::from("\n| phase | 1 pod: n, mean, p50, p99 | burst: n, mean, p50, p99 |\n| --- | ---: | ---: |\n");
        let watched = |s: &Startup| {
            format!("{}, -, {}, {}", s.bound.count(), ms(s.bound.quantile_ms(0.5)), ms(s.bound.quantile_ms(0.99)))
        };
        let _ = writeln!(
            out,
            "| create→bound (scheduling; the watch) | {} | {} |",
            watched(&self.single),
            watched(&self.burst)
        );
        let timed = |h: Option<&Histogram>| match h.filter(|h| h.count > 0.0) {
            None => "0, -, -, -".to_string(),
            Some(h) => format!(
                "{:.0}, {}, {}, {}",
                h.count,
                ms(h.mean().unwrap_or(0.0) * 1000.0),
                ms(h.quantile(0.5).unwrap_or(0.0) * 1000.0),
                match h.bucket_of(0.99) {
                    Some((lower, upper)) if upper.is_finite() => {
                        format!("{}-{}", ms(lower * 1000.0), ms(upper * 1000.0))
                    }
                    Some((lower, _)) => format!("> {}", ms(lower * 1000.0)),
                    None => "-".to_string(),
                }
            ),
        };
        for (i, (label, _, _)) in PHASES.iter().enumerate() {
            let _ = writeln!(
                out,
                "| {label} | {} | {} |",
                timed(self.single_phases.get(i)),
                timed(self.burst_phases.get(i))
            );
        }
        out
    }

    pub fn details(&self) -> Vec<String> {
        let mut out = Vec::new();
        out.push(format!(
            "single pods: create→Running max {}, create→bound p50 {} (max {}); delete→gone (1 s grace) p50 {}, max {}",
            ms(self.single.to_running.max_ms()),
            ms(self.single.bound.quantile_ms(0.5)),
            ms(self.single.bound.max_ms()),
            ms(self.single_delete.quantile_ms(0.5)),
            ms(self.single_delete.max_ms()),
        ));
        out.push(format!("single pods one by one, create→Running (node): {}", self.single_each.join(", ")));
        let t = &self.burst_timeline;
        out.push(format!(
            "burst course (s after the first create): last create sent {:.1}; pods seen Running: first {:.1}, 25% \
             {:.1}, half {:.1}, 75% {:.1}, last {:.1}",
            t.last_create, t.running[0], t.running[1], t.running[2], t.running[3], t.running[4]
        ));
        out.push(format!(
            "burst: create→bound p99 {} (max {}), create→Ready p99 {} (max {}); deleting all {} pods took {}",
            ms(self.burst.bound.quantile_ms(0.99)),
            ms(self.burst.bound.max_ms()),
            ms(self.burst.to_ready.quantile_ms(0.99)),
            ms(self.burst.to_ready.max_ms()),
            self.burst.pods,
            self.burst_delete.map(|d| format!("{:.1} s", d.as_secs_f64())).unwrap_or_else(|| "-".into()),
        ));
        let [idle, burst, steady] = self.machine_busy;
        out.push(format!(
            "the whole machine (`/proc/stat`, all {} cores, other work included) was busy {idle:.0}% in the idle \
             window, {burst:.0}% in the burst, {steady:.0}% in the steady window",
            std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)
        ));
        for (r, calls) in self.nodes.iter().zip(&self.steady_calls) {
            let each: Vec<String> = calls.iter().map(|(op, rate)| format!("{op} {rate:.1}")).collect();
            out.push(format!(
                "{}: CRI calls/s in the steady window: {:.1} ({})",
                r.name,
                calls.iter().map(|(_, rate)| rate).sum::<f64>(),
                if each.is_empty() { "none".to_string() } else { each.join(", ") }
            ));
        }
        for r in &self.nodes {
            out.push(format!(
                "{} ({}): {} burst pods, create→Running p50 {}, max {}; burst window {:.1} s: agent {:.2} CPU s, containerd {:.2}, shims {:.2}, containers {:.2}, \
                 peak RSS containerd {} and {} shims {}; steady window {:.0} s: agent {:.2} CPU s, containerd {:.2}, \
                 shims {:.2}, containers {:.2}; idle: containerd RSS {}, CPU {}; stopped {}",
                r.name,
                r.pod_cidr,
                r.pods,
                ms(r.to_running.quantile_ms(0.5)),
                ms(r.to_running.max_ms()),
                r.burst_cpu.wall,
                r.burst_cpu.agent,
                r.burst_cpu.containerd,
                r.burst_cpu.shims,
                r.burst_cpu.containers,
                mib(&r.burst_peak.containerd),
                r.burst_peak.shims.processes,
                mib(&r.burst_peak.shims),
                r.steady_cpu.wall,
                r.steady_cpu.agent,
                r.steady_cpu.containerd,
                r.steady_cpu.shims,
                r.steady_cpu.containers,
                mib(&r.idle.containerd),
                pct(r.idle_cpu.containerd, r.idle_cpu.wall),
                match r.stop {
                    Some((d, true)) => format!("{:.1} s after SIGTERM", d.as_secs_f64()),
                    Some((d, false)) => format!("only by SIGKILL after {:.0} s", d.as_secs_f64()),
                    None => "-".into(),
                }
            ));
        }
        out
    }

    pub fn markdown(&self, date: &str, command: &str, machine: &[(String, String)]) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "Last run: {date}, with `{command}`.\n");
        out.push_str(&self.table());
        out.push_str("\nDetails:\n\n");
        for d in self.details() {
            let _ = writeln!(out, "- {d}");
        }
        for n in &self.notes {
            let _ = writeln!(out, "- {n}");
        }
        out.push_str("\nSettings:\n\n");
        for s in &self.settings {
            let _ = writeln!(out, "- {s}");
        }
        out.push_str("\nMachine:\n\n");
        for (name, value) in machine {
            let _ = writeln!(out, "- {name}: {value}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(pid: u32, ppid: u32, args: &[&str]) -> ProcEntry {
        ProcEntry { pid, ppid, args: args.iter().map(|s| s.to_string()).collect() }
    }

    #[test]
    fn a_nodes_processes_are_found_by_its_data_dir() {
        let dir = Path::new("/tmp/b/bench-node-0");
        let procs = vec![
            entry(10, 1, &["/work/wt/bin/skiff", "node", "--data-dir", "/tmp/b/bench-node-0"]),
            entry(11, 10, &["containerd", "--config", "/tmp/b/bench-node-0/containerd/config.toml"]),
            entry(12, 1, &["containerd", "--config", "/tmp/b/bench-node-1/containerd/config.toml"]),
            entry(
                13,
                1,
                &[
                    "/usr/bin/containerd-shim-runc-v2",
                    "-namespace",
                    "k8s.io",
                    "-id",
                    "abc",
                    "-address",
                    "/tmp/b/bench-node-0/containerd/containerd.sock",
                ],
            ),
            entry(
                14,
                1,
                &[
                    "/usr/bin/containerd-shim-runc-v2",
                    "-namespace",
                    "k8s.io",
                    "-id",
                    "def",
                    "-address",
                    "/tmp/b/bench-node-1/containerd/containerd.sock",
                ],
            ),
            entry(15, 13, &["/pause"]),
            entry(16, 13, &["sleep", "3600"]),
            entry(17, 14, &["sleep", "3600"]),
        ];
        let found = NodeProcs::find(&procs, Some(10), dir);
        assert_eq!(
            found,
            NodeProcs { agent: Some(10), containerd: vec![11], shims: vec![13], containers: vec![15, 16] }
        );
        assert_eq!(found.runtime_pids(), vec![11, 13, 15, 16]);
    }

    #[test]
    fn the_parent_comes_after_a_command_name_with_spaces() {
        assert_eq!(parent_of("42 (a b) S 7 42 42 0 -1"), Some(7));
        assert_eq!(parent_of("garbage"), None);
    }

    #[test]
    fn a_pod_is_recorded_bound_running_and_ready_the_first_time_each_is_seen() {
        let t0 = Instant::now();
        let mut times = PodTimes { sent: Some(t0), ..Default::default() };
        let mut p = pod("burst-1", None);
        times.observe(&p, t0 + Duration::from_millis(5));
        assert!(times.bound.is_none() && times.running.is_none());
        p["spec"]["nodeName"] = json!("bench-node-1");
        times.observe(&p, t0 + Duration::from_millis(20));
        p["status"] = json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]});
        times.observe(&p, t0 + Duration::from_millis(300));
        p["status"]["conditions"][0]["status"] = json!("True");
        times.observe(&p, t0 + Duration::from_millis(350));
        times.observe(&p, t0 + Duration::from_millis(900));
        assert_eq!(times.node, "bench-node-1");
        assert_eq!(times.since_sent(times.bound), Some(Duration::from_millis(20)));
        assert_eq!(times.since_sent(times.running), Some(Duration::from_millis(300)));
        assert_eq!(times.since_sent(times.ready), Some(Duration::from_millis(350)));
    }

    #[test]
    fn startup_figures_run_from_each_create_to_its_running_and_skip_pods_never_running() {
        let t0 = Instant::now();
        let at = |ms| Some(t0 + Duration::from_millis(ms));
        let mut seen = HashMap::new();
        seen.insert("p-0".to_string(), PodTimes { sent: at(0), bound: at(10), running: at(500), ..Default::default() });
        seen.insert(
            "p-1".to_string(),
            PodTimes { sent: at(100), bound: at(120), running: at(1100), ..Default::default() },
        );
        seen.insert("p-2".to_string(), PodTimes { sent: at(200), bound: at(210), ..Default::default() });
        let names: Vec<String> = (0..3).map(|i| format!("p-{i}")).collect();
        let s = startup("x", &names, &seen);
        assert_eq!((s.pods, s.running), (3, 2));
        assert!((s.to_running.quantile_ms(0.5) - 500.0).abs() < 1.0, "{}", s.to_running.quantile_ms(0.5));
        assert!((s.to_running.max_ms() - 1000.0).abs() < 1.0);
        // Two pods Running between the first create (0) and the last Running (1100 ms).
        assert!((s.rate.unwrap() - 2.0 / 1.1).abs() < 1e-6, "{:?}", s.rate);
    }

    #[test]
    fn the_timeline_gives_when_the_bursts_pods_came_up() {
        let t0 = Instant::now();
        let at = |ms| Some(t0 + Duration::from_millis(ms));
        let seen: HashMap<String, PodTimes> = (0..5u64)
            .map(|i| {
                (format!("b-{i}"), PodTimes { sent: at(i * 100), running: at(1000 + i * 1000), ..Default::default() })
            })
            .collect();
        let names: Vec<String> = (0..5).map(|i| format!("b-{i}")).collect();
        let t = timeline(&names, &seen);
        assert!((t.last_create - 0.4).abs() < 1e-9);
        assert_eq!(t.running, [1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(timeline(&[], &seen), Timeline::default());
    }

    #[test]
    fn cpu_ticks_count_the_children_waited_for() {
        // pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime cstime
        let stat = "42 (containerd-shim x) S 1 42 42 0 -1 4194560 10 0 0 0 170 30 25 5 20 0 9 0\n";
        assert_eq!(ticks_of(stat), Some(230));
        assert_eq!(ticks_of("42 (x) S 1"), None);
    }

    #[test]
    fn the_machines_busy_share_leaves_out_idle_and_iowait() {
        let before = MachineCpu::parse("cpu  100 0 50 800 50 0 0 0 0 0");
        let after = MachineCpu::parse("cpu  160 0 70 900 70 5 5 0 0 0");
        // busy +90 of +210 jiffies.
        assert!((before.busy_since(&after) - 100.0 * 90.0 / 210.0).abs() < 1e-9);
        assert_eq!(before.busy_since(&before), 0.0);
    }

    #[test]
    fn pss_is_read_from_smaps_rollup() {
        let text = "55614ce5e000-7ffc22df9000 ---p 00000000 00:00 0   [rollup]\nRss:  1808 kB\nPss:  313 kB\nPss_Dirty: 116 kB\n";
        assert_eq!(pss_of(text), Some(313));
        assert_eq!(pss_of("Rss: 1 kB\n"), None);
    }

    #[test]
    fn the_pod_is_busybox_sleep_with_a_short_grace_period() {
        let p = pod("single-0", Some("bench-node-0"));
        assert_eq!(p["spec"]["containers"][0]["image"], IMAGE);
        assert_eq!(p["spec"]["containers"][0]["command"], json!(["sleep", "3600"]));
        assert_eq!(p["spec"]["terminationGracePeriodSeconds"], 1);
        assert_eq!(p["spec"]["nodeName"], "bench-node-0");
        assert!(pod("single-0", None)["spec"]["nodeName"].is_null());
    }
}
