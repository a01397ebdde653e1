//! `skiff node` agents as real processes beside a test cluster, each with
//! its own private containerd under its data dir and its own pod CIDR.
//!
//! Dropping a `NodeAgent` stops it with SIGTERM: it was started with
//! `--remove-pods-on-exit`, so its containers, sandboxes and bridge go
//! with it, and its containerd stops. `kill` is SIGKILL (nothing cleaned,
//! as a crash leaves it); `restart` after a kill adopts what still runs.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{free_port, Cluster, SKIFF};

/// One `skiff node` process.
pub struct NodeAgent {
    pub name: String,
    pub listen: String,
    pub data_dir: PathBuf,
    pub log: PathBuf,
    pub pod_cidr: String,
    servers: String,
    extra: Vec<String>,
    child: Option<Child>,
}

impl NodeAgent {
    /// Starts `skiff node` named `name` against the running members of
    /// `cluster`, with `pod_cidr` (inside 10.244.0.0/16, unique among the
    /// tests running at once), its data under `dir`. On a secured cluster
    /// it signs in as `system:node:<name>` in `system:nodes`, so the Node
    /// authorizer and NodeRestriction hold it to its own node and pods.
    pub fn start(dir: &Path, cluster: &Cluster, name: &str, pod_cidr: &str, extra: &[&str]) -> NodeAgent {
        let user = format!("system:node:{name}");
        let mut flags = cluster.component_flags(name, &user, &["system:nodes"]);
        flags.extend(extra.iter().map(|s| s.to_string()));
        let mut agent = NodeAgent {
            name: name.to_string(),
            listen: format!("127.0.0.1:{}", free_port()),
            data_dir: dir.join(name),
            log: dir.join(format!("{name}.log")),
            pod_cidr: pod_cidr.to_string(),
            servers: cluster.endpoints(),
            extra: flags,
            child: None,
        };
        agent.spawn();
        agent
    }

    fn spawn(&mut self) {
        let out = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).unwrap();
        let child = Command::new(SKIFF)
            .args(["node", "--server", &self.servers, "--name", &self.name])
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(["--node-ip", "127.0.0.1", "--listen", &self.listen, "--pod-cidr", &self.pod_cidr])
            .args(["--node-status-update-frequency", "2s", "--node-lease-renew-interval", "2s"])
            .args(["--housekeeping-interval", "1s"])
            .arg("--remove-pods-on-exit")
            .args(&self.extra)
            .env("RUST_LOG", "info,skiff_node=debug")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    /// SIGKILL: the agent dies, its containerd and containers keep running.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the agent again on the same data dir.
    pub fn restart(&mut self) {
        self.kill();
        // The killed agent's containerd still runs: the new agent stops it
        // and starts its own, which finds the running containers.
        self.spawn();
    }

    /// SIGTERM and wait (at most 60 s) for the clean exit.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Kills the containerd whose config lives under `data_dir`, as a last
/// resort after a test (the agent stops its own on a clean exit).
fn kill_containerd_of(data_dir: &Path) {
    let config = data_dir.join("containerd").join("config.toml");
    let _ = Command::new("pkill").args(["-f", &format!("containerd --config {}", config.display())]).status();
    std::thread::sleep(Duration::from_millis(300));
}

impl Drop for NodeAgent {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.stop();
        } else {
            // Killed and not restarted: clean up with a short-lived agent.
            self.spawn();
            std::thread::sleep(Duration::from_secs(3));
            self.stop();
        }
        kill_containerd_of(&self.data_dir);
    }
}
