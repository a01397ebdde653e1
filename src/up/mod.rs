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
//! seconds. Ctrl-C (or SIGTERM, or SIGHUP) sends SIGTERM to every process
//! and waits for them; a process that exits on its own stops the others the same way.
//!
//! # Layout
//! - this module: the cluster's shape, starting and stopping processes.
//! - [`kubeconfig`]: the kubeconfig written into DIR.
//! - [`status`]: the live status line.

pub mod kubeconfig;
pub mod status;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use clap::Args;
use serde::{Deserialize, Serialize};
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};

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
}

/// One program of a master host, run as its own `skiff` process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MasterComponent {
    /// `skiff apiserver`: Raft member, store and every API.
    Apiserver,
}

/// What runs on every master, in start order.
///
/// Only the apiserver exists today. The controller manager and the
/// scheduler (`skiff controller-manager`, `skiff scheduler`, each pointed
/// at its own master's client address) join this list once those binaries
/// exist; [`master_process`] then gains their command lines.
const MASTER_COMPONENTS: &[MasterComponent] = &[MasterComponent::Apiserver];

/// One program of a worker node. None exists yet: the node agent (`skiff
/// node`, pointed at every master's client address) becomes the first
/// variant once that binary exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NodeComponent {}

/// What runs on each of the [`NODES`] worker nodes: nothing until `skiff
/// node` exists.
const NODE_COMPONENTS: &[NodeComponent] = &[];

/// How many worker nodes `skiff up` runs (`node-1`, `node-2`).
const NODES: u64 = 2;

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

/// A process to start: `skiff` with these arguments.
struct Process {
    /// How messages name it: `master-1`, later `master-1 scheduler`.
    label: String,
    args: Vec<OsString>,
    log: PathBuf,
}

fn master_process(component: MasterComponent, dir: &Path, m: &MasterAddrs, initial_cluster: &str) -> Process {
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
            Process { label: m.name.clone(), args, log: dir.join(format!("member-{}.log", m.id)) }
        }
    }
}

fn node_process(component: NodeComponent, _dir: &Path, _node: u64, _masters: &[MasterAddrs]) -> Process {
    match component {}
}

/// Every process of the cluster, masters first.
fn processes(args: &UpArgs, masters: &[MasterAddrs]) -> Vec<Process> {
    let initial: Vec<String> = masters.iter().map(|m| format!("{}={}", m.id, m.peer)).collect();
    let initial = initial.join(",");
    let mut out = Vec::new();
    for m in masters {
        out.extend(MASTER_COMPONENTS.iter().map(|&c| master_process(c, &args.dir, m, &initial)));
    }
    for node in 1..=NODES {
        out.extend(NODE_COMPONENTS.iter().map(|&c| node_process(c, &args.dir, node, masters)));
    }
    out
}

/// The running processes, in start order.
#[derive(Default)]
struct Running {
    children: Vec<(String, Child)>,
}

impl Running {
    fn start(&mut self, exe: &Path, p: Process) -> Result<(), String> {
        let log = std::fs::File::create(&p.log).map_err(|e| format!("{}: {e}", p.log.display()))?;
        let err = log.try_clone().map_err(|e| format!("{}: {e}", p.log.display()))?;
        let child = Command::new(exe)
            .args(&p.args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err))
            // A group of its own: a terminal's Ctrl-C reaches `skiff up`
            // alone, which then stops every process in its own order.
            .process_group(0)
            // Only a panic in `skiff up` itself leaves this to do.
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", p.label))?;
        self.children.push((p.label, child));
        Ok(())
    }

    /// Waits until one of the processes exits, and says which and how.
    async fn first_exit(&mut self) -> String {
        if self.children.is_empty() {
            return futures::future::pending().await;
        }
        let waits = self.children.iter_mut().map(|(label, c)| {
            Box::pin(async move {
                let status = c.wait().await;
                format!("{label} exited ({}); see its log", describe(status))
            })
        });
        futures::future::select_all(waits).await.0
    }

    /// SIGTERM to every process, then waits for each (killing one that
    /// takes longer than [`STOP_TIMEOUT`]). Returns what went wrong.
    async fn stop(&mut self) -> Vec<String> {
        for (_, child) in &self.children {
            if let Some(pid) = child.id() {
                // SIGTERM lets each process close its listeners and Raft cleanly.
                let _ = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status();
            }
        }
        let mut problems = Vec::new();
        for (label, child) in &mut self.children {
            match tokio::time::timeout(STOP_TIMEOUT, child.wait()).await {
                Ok(Ok(status)) if status.success() => {}
                Ok(status) => {
                    problems.push(format!("{label} exited ({}) while stopping; see its log", describe(status)))
                }
                Err(_) => {
                    let _ = child.kill().await;
                    problems.push(format!("{label} did not stop within {STOP_TIMEOUT:?} of SIGTERM and was killed"));
                }
            }
        }
        problems
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
    check_shape(&args)?;
    let masters: Vec<MasterAddrs> = (1..=args.masters).map(|i| master_addrs(&args, i)).collect();

    // Installed before any process starts, so that an early Ctrl-C stops them too.
    let mut interrupt = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    let mut terminate = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    // A closed terminal: the members, in groups of their own, would not hear it.
    let mut hangup = signal(SignalKind::hangup()).map_err(|e| e.to_string())?;

    let mut running = Running::default();
    for p in processes(&args, &masters) {
        if let Err(e) = running.start(&exe, p) {
            running.stop().await;
            return Err(e);
        }
    }

    let kubeconfig_path = args.dir.join("kubeconfig");
    if let Err(e) = kubeconfig::write(&kubeconfig_path, &masters) {
        running.stop().await;
        return Err(format!("{}: {e}", kubeconfig_path.display()));
    }
    println!("Skiff: {} masters on 127.0.0.1, data in {}\n", args.masters, args.dir.display());
    print_endpoints(&masters, &args.dir);
    let clients: Vec<&str> = masters.iter().map(|m| m.client.as_str()).collect();
    println!("\nkubeconfig: {}", kubeconfig_path.display());
    println!("  kubectl --kubeconfig {} get nodes", kubeconfig_path.display());
    println!("  etcdctl --endpoints={} member list", clients.join(","));
    println!("  skiffctl --server {} status", clients.join(","));
    println!("Ctrl-C stops the cluster.\n");

    let sampler = match status::Sampler::new(&masters) {
        Ok(s) => s,
        Err(e) => {
            running.stop().await;
            return Err(e);
        }
    };
    let mut printer = status::StatusPrinter::default();
    let failure = tokio::select! {
        biased;
        _ = interrupt.recv() => None,
        _ = terminate.recv() => None,
        _ = hangup.recv() => None,
        exited = running.first_exit() => Some(exited),
        _ = printer.run(&sampler, STATUS_EVERY) => None,
    };
    printer.finish();
    match &failure {
        Some(f) => println!("{f}: stopping the cluster"),
        None => println!("stopping the cluster"),
    }
    let problems = running.stop().await;
    let mut errors: Vec<String> = failure.into_iter().chain(problems).collect();
    if errors.is_empty() {
        println!("cluster stopped");
        Ok(())
    } else {
        errors.dedup();
        Err(errors.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(masters: u64, dir: &Path) -> UpArgs {
        UpArgs { masters, dir: dir.to_path_buf(), base_port: 2379, http_base_port: 6443 }
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
    fn every_master_runs_an_apiserver_that_knows_every_founder() {
        let a = args(3, Path::new("/tmp/x"));
        let masters: Vec<_> = (1..=3).map(|i| master_addrs(&a, i)).collect();
        let ps = processes(&a, &masters);
        assert_eq!(ps.len(), 3);
        let second: Vec<String> = ps[1].args.iter().map(|s| s.to_string_lossy().into_owned()).collect();
        assert_eq!(second[0], "apiserver");
        let flag = |name: &str| second.iter().position(|a| a == name).map(|i| second[i + 1].as_str());
        assert_eq!(flag("--id"), Some("2"));
        assert_eq!(flag("--initial-cluster"), Some("1=127.0.0.1:2380,2=127.0.0.1:2390,3=127.0.0.1:2400"));
        assert_eq!(flag("--data-dir"), Some("/tmp/x/member-2"));
        assert_eq!(ps[1].log, Path::new("/tmp/x/member-2.log"));
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
}
