//! `skiff up`: a local cluster on loopback, in the foreground.
//!
//! Master `i` (1-based) listens for clients on `--base-port + 10*(i-1)`, for
//! peers on the next port and for HTTP (kubectl) on `--http-base-port +
//! 10*(i-1)`, keeps its data in `DIR/member-i` and logs to
//! `DIR/member-i.log`. Each master host runs the processes of
//! [`MASTER_COMPONENTS`], each worker node those of [`NODE_COMPONENTS`], all
//! as `skiff` subcommands. A member whose data dir exists rejoins with it, so
//! `skiff up` twice on one DIR resumes the same cluster (`DIR/up.json`
//! records its shape, and a different `--masters` or `--base-port` is
//! refused). `DIR/kubeconfig` points kubectl at it.
//!
//! While it runs, a status line ([`status`]) is refreshed every two
//! seconds. A process that exits on its own (a master killed with `kill -9`
//! to watch a failover) is started again after a back-off of one second,
//! doubling up to 30 ([`supervisor`]), its log appended to; the others keep
//! serving, and the status line counts the restarts. Only Ctrl-C (or
//! SIGTERM, or SIGHUP) stops the cluster: SIGTERM to every process, then a
//! wait for each.
//!
//! A `skiff up` killed with SIGKILL cannot stop its processes: they end
//! with it through `PR_SET_PDEATHSIG` ([`parent`]). DIR is locked by
//! `skiff up` and its processes ([`lock`]), so a second `skiff up` on it
//! names the processes still running instead of failing on their ports.
//!
//! # Layout
//! - this module: the cluster's shape, and the loop that starts, restarts
//!   and stops its processes.
//! - [`supervisor`]: when to restart a process, as a state machine.
//! - [`parent`]: ending each process with `skiff up`.
//! - [`lock`]: one `skiff up` per DIR.
//! - [`kubeconfig`]: the kubeconfig written into DIR.
//! - [`status`]: the live status line.

pub mod kubeconfig;
pub mod lock;
pub mod parent;
pub mod status;
pub mod supervisor;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use clap::Args;
use rustix::process::{kill_process, Pid, Signal};
use serde::{Deserialize, Serialize};
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};
use tokio::time::Instant;

use lock::{DirLock, Holder};
use supervisor::{Action, Event, State, Supervisor};

pub use parent::end_with_parent;

#[derive(Args, Debug, Clone)]
pub struct UpArgs {
    /// Number of masters (3 or 5 make a fault-tolerant quorum).
    #[arg(long, default_value_t = 3)]
    pub masters: u64,
    /// Where the members' data dirs, logs and the kubeconfig go.
    #[arg(long, default_value = ".skiff/up")]
    pub dir: PathBuf,
    /// Client port of master 1; the others follow in steps of 10, each
    /// with its peer port one above.
    #[arg(long, default_value_t = 2379)]
    pub base_port: u16,
    /// HTTP (kubectl) port of master 1; the others follow in steps of 10.
    #[arg(long, default_value_t = 6443)]
    pub http_base_port: u16,
    /// Worker nodes (`node-1`...), each a `skiff node` with its own
    /// containerd; 0 runs masters only.
    #[arg(long, default_value_t = 2)]
    pub nodes: u64,
    /// Port of node 1's agent API (logs, exec); the others follow by one.
    #[arg(long, default_value_t = 10250)]
    pub node_base_port: u16,
}

/// One program of a master host, run as its own `skiff` process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MasterComponent {
    /// `skiff apiserver`: Raft member, store and every API.
    Apiserver,
    /// `skiff controller-manager`, pointed at every master (its own first);
    /// one of them is active at a time, through its Lease.
    ControllerManager,
    /// `skiff scheduler`, likewise.
    Scheduler,
}

/// What runs on every master, in start order.
const MASTER_COMPONENTS: &[MasterComponent] =
    &[MasterComponent::Apiserver, MasterComponent::ControllerManager, MasterComponent::Scheduler];

/// One program of a worker node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NodeComponent {
    /// `skiff node`, pointed at every master's client address, with its
    /// private containerd under the node's data dir.
    Agent,
}

/// What runs on each worker node.
const NODE_COMPONENTS: &[NodeComponent] = &[NodeComponent::Agent];

/// How often the status line is refreshed.
const STATUS_EVERY: Duration = Duration::from_secs(2);

/// How long a process may take to stop after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// The addresses of one master.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MasterAddrs {
    pub id: u64,
    /// `master-ID`: its member name and its kubeconfig context's suffix.
    pub name: String,
    /// Client gRPC: the etcd API and the resource API (etcdctl, skiffctl).
    pub client: String,
    /// Raft and forwarding between masters.
    pub peer: String,
    /// The Kubernetes REST API (kubectl), /healthz, /metrics.
    pub http: String,
}

/// The addresses of master `i` (1-based) of a `skiff up` cluster.
pub fn master_addrs(args: &UpArgs, i: u64) -> MasterAddrs {
    let off = 10 * (i as u16 - 1);
    MasterAddrs {
        id: i,
        name: format!("master-{i}"),
        client: format!("127.0.0.1:{}", args.base_port + off),
        peer: format!("127.0.0.1:{}", args.base_port + off + 1),
        http: format!("127.0.0.1:{}", args.http_base_port + off),
    }
}

/// The shape of the cluster in a DIR, recorded at its first start: the
/// peer addresses are in its Raft membership, so they must not change.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
struct Shape {
    masters: u64,
    base_port: u16,
}

const SHAPE_FILE: &str = "up.json";

/// Refuses a DIR holding a cluster of another shape, and records the shape
/// of a new one.
fn check_shape(args: &UpArgs) -> Result<(), String> {
    let path = args.dir.join(SHAPE_FILE);
    let want = Shape { masters: args.masters, base_port: args.base_port };
    match std::fs::read(&path) {
        Ok(bytes) => {
            let have: Shape = serde_json::from_slice(&bytes)
                .map_err(|e| format!("{}: not a skiff up record: {e}", path.display()))?;
            if have != want {
                return Err(format!(
                    "{} holds a cluster of {} masters on base port {}: run with --masters {} --base-port {}, \
                     or delete the directory to start afresh",
                    args.dir.display(),
                    have.masters,
                    have.base_port,
                    have.masters,
                    have.base_port
                ));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let bytes = serde_json::to_vec_pretty(&want).map_err(|e| e.to_string())?;
            std::fs::write(&path, bytes).map_err(|e| format!("{}: {e}", path.display()))
        }
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// The cluster's PKI under DIR, laid out as kubeadm's.
const PKI_DIR: &str = "pki";
/// The group of the nodes' certificates (Kubernetes' name).
const NODES_GROUP: &str = "system:nodes";

fn node_name(node: u64) -> String {
    format!("node-{node}")
}

/// The flags a component reaches the client ports with: the cluster CA,
/// and the certificate `DIR/pki/STEM.crt`.
fn client_tls_flags(dir: &Path, stem: &str) -> Vec<OsString> {
    let pki = dir.join(PKI_DIR);
    vec![
        "--certificate-authority".into(),
        pki.join("ca.crt").into(),
        "--client-certificate".into(),
        pki.join(format!("{stem}.crt")).into(),
        "--client-key".into(),
        pki.join(format!("{stem}.key")).into(),
    ]
}

/// Makes the cluster's authority in DIR/pki once (later runs keep it, so a
/// kubeconfig copied elsewhere stays trusted), the service account signing
/// key once, and at each start the certificates: the masters' serving one
/// (HTTPS and client ports), each master's peer certificate, the
/// controller manager's and scheduler's, each node's (`system:node:NAME`
/// in `system:nodes`), and the admin's, which it returns for the
/// kubeconfig.
fn pki(dir: &Path, masters: &[MasterAddrs], nodes: u64) -> Result<skiff_pki::Issued, String> {
    use skiff_pki::{Authority, Profile, DEFAULT_VALIDITY};
    let pki = dir.join(PKI_DIR);
    let fail = |e: skiff_pki::PkiError| format!("the cluster's certificates in {}: {e}", pki.display());
    let ca = Authority::load_or_create(&pki, "skiff-ca").map_err(fail)?;
    let names = vec!["127.0.0.1".to_string(), "localhost".to_string()];
    let issue = |profile: Profile, stem: &str| {
        ca.issue(&profile, DEFAULT_VALIDITY).and_then(|c| c.write(&pki, stem)).map_err(fail)
    };
    issue(Profile::Server { names: names.clone() }, "apiserver")?;
    for m in masters {
        issue(Profile::Peer { user: m.name.clone(), names: names.clone() }, &format!("peer-{}", m.id))?;
    }
    let client = |user: &str, groups: &[&str]| Profile::Client {
        user: user.to_string(),
        groups: groups.iter().map(|g| g.to_string()).collect(),
    };
    issue(client(crate::server::CONTROLLER_MANAGER_USER, &[]), "controller-manager")?;
    issue(client(crate::server::SCHEDULER_USER, &[]), "scheduler")?;
    for node in 1..=nodes {
        let name = node_name(node);
        issue(client(&format!("system:node:{name}"), &[NODES_GROUP]), &name)?;
    }
    let admin =
        Profile::Client { user: skiff_pki::ADMIN_USER.to_string(), groups: vec![skiff_pki::MASTERS_GROUP.to_string()] };
    let admin = ca.issue(&admin, DEFAULT_VALIDITY).map_err(fail)?;
    admin.write(&pki, "admin").map_err(fail)?;
    skiff_pki::load_or_create_signing_key(&pki).map_err(fail)?;
    Ok(admin)
}

/// A process to start: `skiff` with these arguments.
struct Process {
    /// How messages name it: `master-1`, later `master-1 scheduler`.
    label: String,
    args: Vec<OsString>,
    log: PathBuf,
}

fn master_process(
    component: MasterComponent,
    dir: &Path,
    m: &MasterAddrs,
    initial_cluster: &str,
    masters: &[MasterAddrs],
) -> Process {
    match component {
        MasterComponent::Apiserver => {
            let mut args: Vec<OsString> = vec!["apiserver".into()];
            let flags = [
                ("--id", m.id.to_string()),
                ("--name", m.name.clone()),
                ("--client-listen", m.client.clone()),
                ("--peer-listen", m.peer.clone()),
                ("--http-listen", m.http.clone()),
                ("--initial-cluster", initial_cluster.to_string()),
            ];
            for (flag, value) in flags {
                args.push(flag.into());
                args.push(value.into());
            }
            args.push("--data-dir".into());
            args.push(dir.join(format!("member-{}", m.id)).into());
            let pki = dir.join(PKI_DIR);
            let tls = skiff_pki::member_tls_flags(&pki, &format!("peer-{}", m.id));
            let signing = [
                ("--service-account-signing-key-file", pki.join("sa.key")),
                // Nodes added later join with `skiffctl token create`'s tokens.
                ("--cluster-signing-cert-file", pki.join("ca.crt")),
                ("--cluster-signing-key-file", pki.join("ca.key")),
            ];
            for (flag, path) in tls.into_iter().chain(signing) {
                args.push(flag.into());
                args.push(path.into());
            }
            Process { label: m.name.clone(), args, log: dir.join(format!("member-{}.log", m.id)) }
        }
        MasterComponent::ControllerManager | MasterComponent::Scheduler => {
            let program = match component {
                MasterComponent::Scheduler => "scheduler",
                _ => "controller-manager",
            };
            // Its own master first: it fails over to the others in order.
            let servers: Vec<&str> = std::iter::once(m.client.as_str())
                .chain(masters.iter().filter(|o| o.id != m.id).map(|o| o.client.as_str()))
                .collect();
            let args = [program, "--server", &servers.join(","), "--identity", &m.name];
            let mut args: Vec<OsString> = args.iter().map(OsString::from).collect();
            args.extend(client_tls_flags(dir, program));
            Process { label: format!("{} {program}", m.name), args, log: dir.join(format!("{program}-{}.log", m.id)) }
        }
    }
}

fn node_process(component: NodeComponent, args: &UpArgs, node: u64, masters: &[MasterAddrs]) -> Process {
    match component {
        NodeComponent::Agent => {
            let name = node_name(node);
            let servers: Vec<&str> = masters.iter().map(|m| m.client.as_str()).collect();
            let listen = format!("127.0.0.1:{}", args.node_base_port + node as u16 - 1);
            let mut argv: Vec<OsString> =
                ["node", "--server", &servers.join(","), "--name", &name, "--listen", &listen]
                    .iter()
                    .map(OsString::from)
                    .collect();
            argv.push("--data-dir".into());
            argv.push(args.dir.join(&name).into());
            argv.extend(client_tls_flags(&args.dir, &name));
            // A local cluster leaves nothing running behind it.
            argv.push("--remove-pods-on-exit".into());
            Process { label: name.clone(), args: argv, log: args.dir.join(format!("{name}.log")) }
        }
    }
}

/// Every process of the cluster, masters first.
fn processes(args: &UpArgs, masters: &[MasterAddrs]) -> Vec<Process> {
    let initial: Vec<String> = masters.iter().map(|m| format!("{}={}", m.id, m.peer)).collect();
    let initial = initial.join(",");
    let mut out = Vec::new();
    for m in masters {
        out.extend(MASTER_COMPONENTS.iter().map(|&c| master_process(c, &args.dir, m, &initial, masters)));
    }
    for node in 1..=args.nodes {
        out.extend(NODE_COMPONENTS.iter().map(|&c| node_process(c, args, node, masters)));
    }
    out
}

/// Refuses to fork anywhere but on the main thread.
///
/// A child's `PR_SET_PDEATHSIG` ([`parent`]) fires when the thread that
/// forked it exits, not the process. The main thread lives exactly as long
/// as `skiff up`, whereas a tokio worker can be retired (by
/// `block_in_place`) and a blocking-pool thread ends after ten idle
/// seconds. `run` is driven by `block_on` on the binary's main thread and
/// starts every process from its own future, never from a spawned task;
/// this check keeps it so.
fn on_main_thread() -> Result<(), String> {
    if rustix::thread::gettid() == rustix::process::getpid() {
        Ok(())
    } else {
        Err("skiff up must start its processes from the main thread (see `on_main_thread`)".into())
    }
}

/// Starts `p`, its output going to its log: a new log at the first start,
/// the same one appended to at a restart.
fn start(exe: &Path, p: &Process, append: bool) -> Result<Child, String> {
    on_main_thread()?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .open(&p.log)
        .map_err(|e| format!("{}: {e}", p.log.display()))?;
    let err = log.try_clone().map_err(|e| format!("{}: {e}", p.log.display()))?;
    Command::new(exe)
        .args(&p.args)
        .env(parent::PARENT_PID_ENV, std::process::id().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(err))
        // A group of its own: a terminal's Ctrl-C reaches `skiff up`
        // alone, which then stops every process in its own order.
        .process_group(0)
        // Only a panic in `skiff up` itself leaves this to do.
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", p.label))
}

/// Appends a line of `skiff up`'s own to a process's log, between what
/// its runs wrote.
fn append_to_log(p: &Process, line: &str) {
    use std::io::Write;
    let file = std::fs::OpenOptions::new().append(true).open(&p.log);
    // The same line goes to `skiff up`'s output; a log that cannot be
    // written is not worth stopping for.
    let _ = file.and_then(|mut f| writeln!(f, "skiff up: {line}"));
}

/// One process under supervision: what to run, its state machine, and
/// the child while one runs.
struct Supervised {
    process: Process,
    supervisor: Supervisor,
    child: Option<Child>,
}

/// What woke the loop up for one process.
#[derive(Debug)]
enum Wake {
    /// Its child exited, with this status.
    Exited(std::io::Result<ExitStatus>),
    /// Its back-off is over.
    BackoffOver,
}

impl Supervised {
    /// Resolves at the next event of this process: its exit while it
    /// runs, the end of its back-off. Cancel-safe (waiting for a child and
    /// sleeping can be dropped and begun again).
    async fn next_wake(&mut self) -> Wake {
        match (self.supervisor.state(), &mut self.child) {
            (State::Running { .. }, Some(child)) => Wake::Exited(child.wait().await),
            (State::Backoff { until }, _) => {
                tokio::time::sleep_until(until).await;
                Wake::BackoffOver
            }
            _ => futures::future::pending().await,
        }
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }
}

/// Every process of the cluster under supervision, in start order.
struct Cluster {
    exe: PathBuf,
    processes: Vec<Supervised>,
    lock: DirLock,
}

impl Cluster {
    /// Starts every process, in order; on an error stops those started.
    async fn start(exe: PathBuf, processes: Vec<Process>, lock: DirLock) -> Result<Cluster, String> {
        let mut cluster = Cluster { exe, processes: Vec::new(), lock };
        for process in processes {
            let mut s = Supervised { process, supervisor: Supervisor::new(), child: None };
            match start(&cluster.exe, &s.process, false) {
                Ok(child) => {
                    s.child = Some(child);
                    s.supervisor.step(Event::Started, Instant::now());
                    cluster.processes.push(s);
                }
                Err(e) => {
                    cluster.stop().await;
                    return Err(e);
                }
            }
        }
        cluster.record_pids();
        Ok(cluster)
    }

    /// Which process woke up, and why.
    async fn next_wake(&mut self) -> (usize, Wake) {
        if self.processes.is_empty() {
            return futures::future::pending().await;
        }
        let wakes = self.processes.iter_mut().map(|s| Box::pin(s.next_wake()));
        let (wake, i, _) = futures::future::select_all(wakes).await;
        (i, wake)
    }

    /// Feeds a wake-up to its supervisor and does what it says; returns
    /// a line for the user, if any.
    fn on_wake(&mut self, i: usize, wake: Wake) -> Option<String> {
        let now = Instant::now();
        let s = &mut self.processes[i];
        let label = s.process.label.clone();
        match wake {
            Wake::Exited(status) => {
                s.child = None;
                s.supervisor.step(Event::Exited, now);
                let State::Backoff { until } = s.supervisor.state() else { return None };
                let line = format!(
                    "{label} exited ({}); restarting it in {}",
                    describe(status),
                    humantime::format_duration(until - now)
                );
                append_to_log(&s.process, &line);
                Some(format!("{line}; see its log"))
            }
            Wake::BackoffOver => {
                if s.supervisor.step(Event::BackoffOver, now) != Action::Start {
                    return None;
                }
                let line = match start(&self.exe, &s.process, true) {
                    Ok(child) => {
                        s.child = Some(child);
                        s.supervisor.step(Event::Started, Instant::now());
                        format!("{label} restarted (restart {})", s.supervisor.restarts())
                    }
                    Err(e) => {
                        s.supervisor.step(Event::StartFailed, Instant::now());
                        format!("{e}; trying again later")
                    }
                };
                self.record_pids();
                Some(line)
            }
        }
    }

    /// Restarts of every process so far.
    fn restarts(&self) -> u32 {
        self.processes.iter().map(|s| s.supervisor.restarts()).sum()
    }

    /// Lists the running processes in the lock file, for a second `skiff
    /// up` on this DIR to name.
    fn record_pids(&self) {
        let mut holders = vec![Holder { label: "skiff up".into(), pid: std::process::id() }];
        holders.extend(
            self.processes.iter().filter_map(|s| s.pid().map(|pid| Holder { label: s.process.label.clone(), pid })),
        );
        // Only the message of a refused second `skiff up` depends on it.
        let _ = self.lock.record(&holders);
    }

    /// SIGTERM to every running process, then waits for each (killing one
    /// that takes longer than [`STOP_TIMEOUT`]). Returns what went wrong.
    async fn stop(&mut self) -> Vec<String> {
        let now = Instant::now();
        for s in &mut self.processes {
            if s.supervisor.step(Event::Stop, now) == Action::Terminate {
                if let Some(pid) = s.pid().and_then(|p| Pid::from_raw(p as i32)) {
                    // SIGTERM lets each process close its listeners and Raft cleanly.
                    let _ = kill_process(pid, Signal::TERM);
                }
            }
        }
        let waits = self.processes.iter_mut().filter_map(|s| {
            let label = &s.process.label;
            let supervisor = &mut s.supervisor;
            let child = s.child.as_mut()?;
            Some(async move {
                let problem = match tokio::time::timeout(STOP_TIMEOUT, child.wait()).await {
                    Ok(Ok(status)) if status.success() => None,
                    Ok(status) => Some(format!("{label} exited ({}) while stopping; see its log", describe(status))),
                    Err(_) => {
                        let _ = child.kill().await;
                        Some(format!("{label} did not stop within {STOP_TIMEOUT:?} of SIGTERM and was killed"))
                    }
                };
                supervisor.step(Event::Exited, Instant::now());
                problem
            })
        });
        futures::future::join_all(waits).await.into_iter().flatten().collect()
    }
}

fn describe(status: std::io::Result<ExitStatus>) -> String {
    match status {
        Ok(s) => s.to_string(),
        Err(e) => format!("cannot wait for it: {e}"),
    }
}

fn print_endpoints(masters: &[MasterAddrs], dir: &Path) {
    println!("{:<10} {:<22} {:<22} {:<22} LOG", "", "CLIENT (gRPC)", "HTTP (kubectl)", "PEER");
    for m in masters {
        let log = dir.join(format!("member-{}.log", m.id));
        println!("{:<10} {:<22} {:<22} {:<22} {}", m.name, m.client, m.http, m.peer, log.display());
    }
}

/// Runs the cluster until Ctrl-C, SIGTERM or SIGHUP, restarting any
/// process that exits on its own.
///
/// Must be driven on the main thread (the binary's `block_on`): every
/// process is started from this future, and children die with the thread
/// that started them (see [`on_main_thread`]).
pub async fn run(args: UpArgs) -> Result<(), String> {
    if args.masters == 0 {
        return Err("--masters must be at least 1".into());
    }
    let last_port = u32::from(args.base_port.max(args.http_base_port)) + 10 * (args.masters as u32 - 1) + 1;
    if last_port > u32::from(u16::MAX) {
        return Err(format!("{} masters do not fit above the base ports", args.masters));
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the skiff binary: {e}"))?;
    std::fs::create_dir_all(&args.dir).map_err(|e| format!("{}: {e}", args.dir.display()))?;
    // Absolute, so that the printed commands work from any directory.
    let dir = args.dir.canonicalize().map_err(|e| format!("{}: {e}", args.dir.display()))?;
    let args = UpArgs { dir, ..args };
    // Before anything in DIR is touched: another `skiff up` may run on it.
    let lock = DirLock::take(&args.dir).await?;
    check_shape(&args)?;
    let masters: Vec<MasterAddrs> = (1..=args.masters).map(|i| master_addrs(&args, i)).collect();

    // Installed before any process starts, so that an early Ctrl-C stops them too.
    let mut interrupt = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    let mut terminate = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    // A closed terminal: the members, in groups of their own, would not hear it.
    let mut hangup = signal(SignalKind::hangup()).map_err(|e| e.to_string())?;

    let admin = pki(&args.dir, &masters, args.nodes)?;
    let ca_pem = std::fs::read_to_string(args.dir.join(PKI_DIR).join("ca.crt")).map_err(|e| e.to_string())?;
    let mut cluster = Cluster::start(exe, processes(&args, &masters), lock).await?;

    let kubeconfig_path = args.dir.join("kubeconfig");
    if let Err(e) = kubeconfig::write(&kubeconfig_path, &masters, &ca_pem, &admin) {
        cluster.stop().await;
        return Err(format!("{}: {e}", kubeconfig_path.display()));
    }
    println!("Skiff: {} masters on 127.0.0.1, data in {}\n", args.masters, args.dir.display());
    print_endpoints(&masters, &args.dir);
    let clients: Vec<&str> = masters.iter().map(|m| m.client.as_str()).collect();
    println!("\nkubeconfig: {}", kubeconfig_path.display());
    println!("  kubectl --kubeconfig {} get nodes", kubeconfig_path.display());
    println!("  etcdctl --endpoints={} member list", clients.join(","));
    println!("  skiffctl --server {} status", clients.join(","));
    println!("Ctrl-C stops the cluster; a process that exits is restarted.\n");

    let sampler = match status::Sampler::new(&masters, &args.dir.join(PKI_DIR)) {
        Ok(s) => s,
        Err(e) => {
            cluster.stop().await;
            return Err(e);
        }
    };
    let printer = Mutex::new(status::StatusPrinter::default());
    let restarts = AtomicU32::new(0);
    // Polled by the loop below, never spawned: it shares the printer
    // with the lines about exits and restarts.
    let status_line = status::show_every(&sampler, &printer, &restarts, STATUS_EVERY);
    tokio::pin!(status_line);
    loop {
        tokio::select! {
            biased;
            _ = interrupt.recv() => break,
            _ = terminate.recv() => break,
            _ = hangup.recv() => break,
            (i, wake) = cluster.next_wake() => {
                if let Some(line) = cluster.on_wake(i, wake) {
                    status::lock(&printer).note(&line);
                }
                restarts.store(cluster.restarts(), Ordering::Relaxed);
            }
            _ = &mut status_line => {}
        }
    }
    status::lock(&printer).finish();
    println!("stopping the cluster");
    let mut problems = cluster.stop().await;
    if problems.is_empty() {
        println!("cluster stopped");
        Ok(())
    } else {
        problems.dedup();
        Err(problems.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::supervisor::{FIRST_DELAY, MAX_DELAY};
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    fn args(masters: u64, dir: &Path) -> UpArgs {
        UpArgs {
            masters,
            dir: dir.to_path_buf(),
            base_port: 2379,
            http_base_port: 6443,
            nodes: 2,
            node_base_port: 10250,
        }
    }

    #[test]
    fn masters_are_ten_ports_apart() {
        let a = args(5, Path::new("/tmp/x"));
        let m5 = master_addrs(&a, 5);
        assert_eq!(
            (m5.client.as_str(), m5.peer.as_str(), m5.http.as_str()),
            ("127.0.0.1:2419", "127.0.0.1:2420", "127.0.0.1:6483")
        );
        assert_eq!(m5.name, "master-5");
    }

    #[test]
    fn every_master_runs_an_apiserver_that_knows_every_founder_a_controller_manager_and_a_scheduler() {
        let a = args(3, Path::new("/tmp/x"));
        let masters: Vec<_> = (1..=3).map(|i| master_addrs(&a, i)).collect();
        let ps = processes(&a, &masters);
        assert_eq!(ps.len(), 11, "an apiserver, a controller manager and a scheduler per master, and 2 node agents");
        let words = |p: &Process| -> Vec<String> { p.args.iter().map(|s| s.to_string_lossy().into_owned()).collect() };
        let flag = |args: &[String], name: &str| args.iter().position(|a| a == name).map(|i| args[i + 1].clone());
        let apiserver = words(&ps[3]);
        assert_eq!(apiserver[0], "apiserver");
        assert_eq!(flag(&apiserver, "--id").as_deref(), Some("2"));
        assert_eq!(
            flag(&apiserver, "--initial-cluster").as_deref(),
            Some("1=127.0.0.1:2380,2=127.0.0.1:2390,3=127.0.0.1:2400")
        );
        assert_eq!(flag(&apiserver, "--data-dir").as_deref(), Some("/tmp/x/member-2"));
        assert_eq!(ps[3].log, Path::new("/tmp/x/member-2.log"));
        let manager = words(&ps[4]);
        assert_eq!(manager[0], "controller-manager");
        assert_eq!(flag(&manager, "--server").as_deref(), Some("127.0.0.1:2389,127.0.0.1:2379,127.0.0.1:2399"));
        assert_eq!(flag(&manager, "--identity").as_deref(), Some("master-2"));
        assert_eq!(ps[4].log, Path::new("/tmp/x/controller-manager-2.log"));
        let scheduler = words(&ps[5]);
        assert_eq!(scheduler[0], "scheduler");
        assert_eq!(flag(&scheduler, "--server"), flag(&manager, "--server"));
        assert_eq!(flag(&scheduler, "--identity").as_deref(), Some("master-2"));
        assert_eq!(ps[5].log, Path::new("/tmp/x/scheduler-2.log"));
        let node = words(&ps[10]);
        assert_eq!(node[0], "node");
        assert_eq!(flag(&node, "--name").as_deref(), Some("node-2"));
        assert_eq!(flag(&node, "--server").as_deref(), Some("127.0.0.1:2379,127.0.0.1:2389,127.0.0.1:2399"));
        assert_eq!(flag(&node, "--listen").as_deref(), Some("127.0.0.1:10251"));
        assert_eq!(flag(&node, "--data-dir").as_deref(), Some("/tmp/x/node-2"));
        assert!(node.iter().any(|a| a == "--remove-pods-on-exit"));
        let masters_only = processes(&UpArgs { nodes: 0, ..a.clone() }, &masters);
        assert_eq!(masters_only.len(), 9);
    }

    #[test]
    fn a_dir_keeps_the_shape_it_was_created_with() {
        let dir = tempfile::tempdir().unwrap();
        check_shape(&args(3, dir.path())).unwrap();
        check_shape(&args(3, dir.path())).unwrap();
        let err = check_shape(&args(5, dir.path())).unwrap_err();
        assert!(err.contains("3 masters on base port 2379"), "{err}");
        let moved = UpArgs { base_port: 3000, ..args(3, dir.path()) };
        assert!(check_shape(&moved).is_err());
    }

    /// A cluster of one process that has been started, without starting
    /// it: `exe` does not exist.
    async fn one_started_process(dir: &Path) -> Cluster {
        let process = Process { label: "master-1".into(), args: vec![], log: dir.join("member-1.log") };
        let mut supervisor = Supervisor::new();
        supervisor.step(Event::Started, Instant::now());
        let lock = DirLock::take(dir).await.unwrap();
        Cluster {
            exe: dir.join("no-such-skiff"),
            processes: vec![Supervised { process, supervisor, child: None }],
            lock,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_process_that_exits_is_started_again_after_its_back_off_and_retried_if_that_fails() {
        let dir = tempfile::tempdir().unwrap();
        let mut cluster = one_started_process(dir.path()).await;
        std::fs::write(dir.path().join("member-1.log"), "first run\n").unwrap();

        let line = cluster.on_wake(0, Wake::Exited(Ok(ExitStatus::from_raw(9))));
        let line = line.expect("an exit is reported");
        assert!(line.starts_with("master-1 exited (signal: 9"), "{line}");
        assert!(line.contains("restarting it in 1s"), "{line}");
        let log = std::fs::read_to_string(dir.path().join("member-1.log")).unwrap();
        assert!(log.starts_with("first run\nskiff up: master-1 exited"), "appended to the log: {log}");

        let exited = Instant::now();
        let not_yet = tokio::time::timeout(FIRST_DELAY - Duration::from_millis(1), cluster.next_wake()).await;
        assert!(not_yet.is_err(), "woke before the back-off was over: {not_yet:?}");
        let (i, wake) = cluster.next_wake().await;
        assert!(matches!(wake, Wake::BackoffOver), "{wake:?}");
        assert_eq!(Instant::now() - exited, FIRST_DELAY);

        // The start fails (a test thread is not the main thread, and there
        // is no such binary), so it is tried again later.
        let line = cluster.on_wake(i, wake).expect("a failed start is reported");
        assert!(line.contains("trying again later"), "{line}");
        assert_eq!(cluster.processes[0].supervisor.state(), State::Backoff { until: Instant::now() + 2 * FIRST_DELAY });
        assert_eq!(cluster.restarts(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stopped_cluster_has_nothing_left_to_wake_for() {
        let dir = tempfile::tempdir().unwrap();
        let mut cluster = one_started_process(dir.path()).await;
        cluster.on_wake(0, Wake::Exited(Ok(ExitStatus::from_raw(9))));
        assert!(cluster.stop().await.is_empty(), "a process in back-off has nothing to stop");
        assert_eq!(cluster.processes[0].supervisor.state(), State::Stopped);
        let woke = tokio::time::timeout(MAX_DELAY, cluster.next_wake()).await;
        assert!(woke.is_err(), "a stopped process must not be started again: {woke:?}");
    }
}
