//! Launching a 3-member Skiff or etcd cluster on loopback as real processes,
//! SIGKILLing and restarting members, and finding the leader.
//!
//! Both systems run with their default durability: etcd fsyncs its WAL before
//! acknowledging, Skiff fsyncs its Raft log on every append. Election timing
//! is made equal: etcd gets Skiff's default election timeout (300 ms,
//! randomized up to 2x by both) unless told otherwise, with a 50 ms heartbeat
//! because etcd refuses one above a fifth of the election timeout (Skiff's
//! heartbeat is 100 ms).

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::client;

/// The system under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, clap::ValueEnum)]
pub enum System {
    Skiff,
    Etcd,
}

impl System {
    pub fn name(self) -> &'static str {
        match self {
            System::Skiff => "Skiff",
            System::Etcd => "etcd",
        }
    }
}

/// How to launch a cluster of one system.
#[derive(Clone, Debug)]
pub struct ClusterSpec {
    pub system: System,
    /// The `skiff` or `etcd` executable.
    pub binary: PathBuf,
    pub members: usize,
    /// Data directories and logs go here.
    pub dir: PathBuf,
    /// etcd's `--heartbeat-interval`, in ms.
    pub etcd_heartbeat_ms: u64,
    /// etcd's `--election-timeout`, in ms.
    pub etcd_election_timeout_ms: u64,
    /// Extra flags for every member.
    pub extra_args: Vec<String>,
}

struct Member {
    /// 1-based; Skiff's Raft id, etcd's `--name mID`.
    id: usize,
    client: String,
    peer: String,
    /// Skiff's HTTP listener (health, metrics); unused for etcd.
    http: String,
    data_dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

/// A running cluster. Dropping it SIGKILLs every member it still runs.
pub struct Cluster {
    spec: ClusterSpec,
    members: Vec<Member>,
}

/// A free loopback port, picked by the OS.
fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl Cluster {
    /// Starts every member and waits until they agree on a leader.
    pub async fn launch(spec: ClusterSpec) -> Result<Cluster> {
        std::fs::create_dir_all(&spec.dir).with_context(|| format!("creating {}", spec.dir.display()))?;
        let mut members = Vec::new();
        for id in 1..=spec.members {
            members.push(Member {
                id,
                client: format!("127.0.0.1:{}", free_port()?),
                peer: format!("127.0.0.1:{}", free_port()?),
                http: format!("127.0.0.1:{}", free_port()?),
                data_dir: spec.dir.join(format!("member-{id}")),
                log: spec.dir.join(format!("member-{id}.log")),
                child: None,
            });
        }
        let mut cluster = Cluster { spec, members };
        for i in 0..cluster.members.len() {
            cluster.start(i)?;
        }
        cluster.must_leader().await?;
        client::must_catch_up(&cluster.endpoints(), Duration::from_secs(60)).await?;
        Ok(cluster)
    }

    pub fn system(&self) -> System {
        self.spec.system
    }

    /// Every member's client address, in member order.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client.clone()).collect()
    }

    /// The client addresses of the members this harness is running.
    pub fn running_endpoints(&self) -> Vec<String> {
        self.members.iter().filter(|m| m.child.is_some()).map(|m| m.client.clone()).collect()
    }

    fn command(&self, member: &Member) -> Command {
        let peers = |scheme: &str| {
            self.members
                .iter()
                .map(|m| match self.spec.system {
                    System::Skiff => format!("{}={scheme}{}", m.id, m.peer),
                    System::Etcd => format!("m{}={scheme}{}", m.id, m.peer),
                })
                .collect::<Vec<_>>()
                .join(",")
        };
        let mut cmd = Command::new(&self.spec.binary);
        match self.spec.system {
            System::Skiff => {
                cmd.arg("apiserver")
                    .args(["--id", &member.id.to_string()])
                    .arg("--data-dir")
                    .arg(&member.data_dir)
                    .args(["--peer-listen", &member.peer, "--client-listen", &member.client])
                    .args(["--http-listen", &member.http])
                    .args(["--initial-cluster", &peers("")]);
            }
            System::Etcd => {
                let client_url = format!("http://{}", member.client);
                let peer_url = format!("http://{}", member.peer);
                cmd.args(["--name", &format!("m{}", member.id)])
                    .arg("--data-dir")
                    .arg(&member.data_dir)
                    .args(["--listen-client-urls", &client_url, "--advertise-client-urls", &client_url])
                    .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
                    .args(["--initial-cluster", &peers("http://")])
                    .args(["--initial-cluster-state", "new", "--initial-cluster-token", "skiff-bench"])
                    .args(["--heartbeat-interval", &self.spec.etcd_heartbeat_ms.to_string()])
                    .args(["--election-timeout", &self.spec.etcd_election_timeout_ms.to_string()])
                    .args(["--logger", "zap", "--log-level", "warn"]);
            }
        }
        cmd.args(&self.spec.extra_args);
        cmd
    }

    /// Starts (or restarts on its existing data) member `index` (0-based).
    pub fn start(&mut self, index: usize) -> Result<()> {
        let member = &self.members[index];
        if member.child.is_some() {
            bail!("member {} is already running", member.id);
        }
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&member.log)
            .with_context(|| format!("opening {}", member.log.display()))?;
        let child = self
            .command(member)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", self.spec.binary.display()))?;
        self.members[index].child = Some(child);
        Ok(())
    }

    /// SIGKILLs member `index` and reaps it.
    pub fn kill(&mut self, index: usize) -> Result<()> {
        if let Some(mut child) = self.members[index].child.take() {
            child.kill().context("SIGKILL")?;
            child.wait().context("reaping a killed member")?;
        }
        Ok(())
    }

    /// The index of the leader every running member agrees on (all members must run).
    pub async fn must_leader(&mut self) -> Result<usize> {
        self.must_be_running()?;
        client::agreed_leader(&self.endpoints(), Duration::from_secs(30)).await
    }

    /// Fails with the member's log tail when a member exited by itself.
    fn must_be_running(&mut self) -> Result<()> {
        for member in &mut self.members {
            if let Some(child) = member.child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    member.child = None;
                    bail!("member {} exited ({status}); log tail:\n{}", member.id, tail(&member.log));
                }
            }
        }
        Ok(())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for member in &mut self.members {
            if let Some(mut child) = member.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// The last lines of a log file, for error messages.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
