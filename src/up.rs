//! `skiff up`: a local cluster of master processes on loopback.
//!
//! Member `i` (1-based) listens on client port `base + 10*(i-1)`, peer port
//! that plus one and HTTP port `6443 + 10*(i-1)`, with its data under
//! `DIR/member-i`. A member whose data dir exists rejoins with it, so `skiff
//! up` twice resumes the same cluster. Ctrl-C (or SIGTERM) stops every member
//! with SIGTERM and waits for them.

use std::path::PathBuf;
use std::process::Stdio;

use clap::Args;
use tokio::process::{Child, Command};

#[derive(Args, Debug)]
pub struct UpArgs {
    /// Number of masters (3 or 5 make a fault-tolerant quorum).
    #[arg(long, default_value_t = 3)]
    pub masters: u64,
    /// Where the members' data dirs and logs go.
    #[arg(long, default_value = ".skiff/up")]
    pub dir: PathBuf,
    /// Client port of member 1; the others follow in steps of 10.
    #[arg(long, default_value_t = 2379)]
    pub base_port: u16,
    /// HTTP port of member 1; the others follow in steps of 10.
    #[arg(long, default_value_t = 6443)]
    pub http_base_port: u16,
}

/// The addresses of member `i` of a `skiff up` cluster.
pub fn member_ports(args: &UpArgs, i: u64) -> (String, String, String) {
    let off = 10 * (i as u16 - 1);
    (
        format!("127.0.0.1:{}", args.base_port + off),
        format!("127.0.0.1:{}", args.base_port + off + 1),
        format!("127.0.0.1:{}", args.http_base_port + off),
    )
}

pub async fn run(args: UpArgs) -> Result<(), String> {
    if args.masters == 0 {
        return Err("--masters must be at least 1".into());
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the skiff binary: {e}"))?;
    std::fs::create_dir_all(&args.dir).map_err(|e| format!("{}: {e}", args.dir.display()))?;
    let initial: Vec<String> = (1..=args.masters).map(|i| format!("{i}={}", member_ports(&args, i).1)).collect();
    let initial = initial.join(",");
    let mut children: Vec<Child> = Vec::new();
    for i in 1..=args.masters {
        let (client, peer, http) = member_ports(&args, i);
        let log_path = args.dir.join(format!("member-{i}.log"));
        let log = std::fs::File::create(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
        let err = log.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new(&exe)
            .arg("apiserver")
            .args(["--id", &i.to_string(), "--name", &format!("master-{i}")])
            .arg("--data-dir")
            .arg(args.dir.join(format!("member-{i}")))
            .args(["--client-listen", &client, "--peer-listen", &peer, "--http-listen", &http])
            .args(["--initial-cluster", &initial])
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err))
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start member {i}: {e}"))?;
        println!("master-{i}: client {client}  peer {peer}  http {http}  log {}", log_path.display());
        children.push(child);
    }
    let endpoints: Vec<String> = (1..=args.masters).map(|i| member_ports(&args, i).0).collect();
    println!("\netcdctl --endpoints={} member list", endpoints.join(","));
    println!("skiffctl --server {} status\nCtrl-C stops the cluster.", endpoints.join(","));

    let mut term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).map_err(|e| e.to_string())?;
    let exited = futures::future::select_all(children.iter_mut().map(|c| Box::pin(c.wait())));
    let failure = tokio::select! {
        _ = tokio::signal::ctrl_c() => None,
        _ = term.recv() => None,
        (status, idx, _) = exited => Some(format!("master-{} exited ({:?}); see its log", idx + 1, status)),
    };
    for child in &children {
        if let Some(pid) = child.id() {
            // SIGTERM lets each member stop its listeners and Raft cleanly.
            let _ = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status();
        }
    }
    for child in &mut children {
        let _ = child.wait().await;
    }
    match failure {
        Some(f) => Err(f),
        None => {
            println!("cluster stopped");
            Ok(())
        }
    }
}
