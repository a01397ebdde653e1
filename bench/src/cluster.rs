//! Launching a 3-member Skiff or etcd cluster on loopback as real processes,
//! SIGKILLing and restarting members, and finding the leader.
//!
//! Both systems run with their default durability: etcd fsyncs its WAL before
//! acknowledging, Skiff fsyncs its Raft log on every append. Election timing
//! is made equal (see [`EtcdTiming::like`]): Skiff runs at its own defaults,
//! read from `skiff apiserver -h`, and etcd gets the same election timeout.

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

/// Skiff's Raft timing, as its flags' defaults (or explicit flags) set it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SkiffTiming {
    pub heartbeat: Duration,
    pub election_timeout_min: Duration,
    pub election_timeout_max: Duration,
}

impl SkiffTiming {
    /// Reads the timing flags from `extra_args` (`--flag=VALUE` or `--flag VALUE`)
    /// and the rest from the defaults `skiff apiserver -h` prints.
    pub fn of(binary: &Path, extra_args: &[String]) -> Result<SkiffTiming> {
        let output = Command::new(binary)
            .args(["apiserver", "-h"])
            .output()
            .with_context(|| format!("running {} apiserver -h", binary.display()))?;
        let help = String::from_utf8_lossy(&output.stdout);
        let value = |flag: &str| -> Result<Duration> {
            let text = flag_value(extra_args, flag)
                .or_else(|| help_default(&help, flag))
                .with_context(|| format!("no value or default for {flag} in `skiff apiserver -h`"))?;
            humantime::parse_duration(&text).with_context(|| format!("{flag} {text}"))
        };
        Ok(SkiffTiming {
            heartbeat: value("--heartbeat-interval")?,
            election_timeout_min: value("--election-timeout-min")?,
            election_timeout_max: value("--election-timeout-max")?,
        })
    }
}

/// The value given to `flag` in `args`, if any.
fn flag_value(args: &[String], flag: &str) -> Option<String> {
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        if let Some(value) = arg.strip_prefix(flag).and_then(|rest| rest.strip_prefix('=')) {
            return Some(value.to_string());
        }
        if arg == flag {
            return iter.next().cloned();
        }
    }
    None
}

/// The `[default: X]` clap prints for `flag`, on its line or the next.
fn help_default(help: &str, flag: &str) -> Option<String> {
    let lines: Vec<&str> = help.lines().collect();
    let at = lines.iter().position(|l| l.trim_start().starts_with(&format!("{flag} ")))?;
    lines[at..(at + 2).min(lines.len())].iter().find_map(|line| {
        let start = line.find("[default: ")? + "[default: ".len();
        let end = line[start..].find(']')? + start;
        Some(line[start..end].to_string())
    })
}

/// etcd's timing flags, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EtcdTiming {
    pub heartbeat_ms: u64,
    pub election_timeout_ms: u64,
}

impl EtcdTiming {
    /// etcd timing comparable to Skiff's: both draw the election timeout from
    /// [min, 2 min), so etcd's `--election-timeout` is Skiff's minimum. The
    /// heartbeat is Skiff's, but at most a fifth of that, which etcd demands.
    pub fn like(skiff: &SkiffTiming) -> EtcdTiming {
        let election_timeout_ms = skiff.election_timeout_min.as_millis() as u64;
        let heartbeat_ms = (skiff.heartbeat.as_millis() as u64).min(election_timeout_ms / 5).max(1);
        EtcdTiming { heartbeat_ms, election_timeout_ms }
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
    /// etcd's `--heartbeat-interval` and `--election-timeout`.
    pub etcd_timing: EtcdTiming,
    /// Extra flags for every member.
    pub extra_args: Vec<String>,
    /// The `skiff` subcommand a member runs: `apiserver` (Raft, store and
    /// APIs only) or `server` (with the controller manager and scheduler,
    /// unless flags in `extra_args` leave them out). Unused for etcd.
    pub skiff_subcommand: &'static str,
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

    /// Every member's process id, in member order (`None`: not running).
    pub fn pids(&self) -> Vec<Option<u32>> {
        self.members.iter().map(|m| m.child.as_ref().map(Child::id)).collect()
    }

    /// Every member's data directory, in member order.
    pub fn data_dirs(&self) -> Vec<PathBuf> {
        self.members.iter().map(|m| m.data_dir.clone()).collect()
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
                cmd.arg(self.spec.skiff_subcommand)
                    .args(["--id", &member.id.to_string()])
                    .arg("--data-dir")
                    .arg(&member.data_dir)
                    .args(["--peer-listen", &member.peer, "--client-listen", &member.client])
                    .args(["--http-listen", &member.http])
                    .args(["--initial-cluster", &peers("")]);
            }
            System::Etcd => {
                let scheme = if crate::tls::get().is_some() { "https://" } else { "http://" };
                let client_url = format!("{scheme}{}", member.client);
                let peer_url = format!("{scheme}{}", member.peer);
                cmd.args(["--name", &format!("m{}", member.id)])
                    .arg("--data-dir")
                    .arg(&member.data_dir)
                    .args(["--listen-client-urls", &client_url, "--advertise-client-urls", &client_url])
                    .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
                    .args(["--initial-cluster", &peers(scheme)])
                    .args(["--initial-cluster-state", "new", "--initial-cluster-token", "skiff-bench"])
                    .args(["--heartbeat-interval", &self.spec.etcd_timing.heartbeat_ms.to_string()])
                    .args(["--election-timeout", &self.spec.etcd_timing.election_timeout_ms.to_string()])
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
pub fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    const HELP: &str = "\
      --heartbeat-interval <HEARTBEAT_INTERVAL>
          Raft heartbeat interval (e.g. 100ms) [default: 100ms]
      --election-timeout-min <ELECTION_TIMEOUT_MIN>
          Lower bound of the randomized election timeout [default: 200ms]
      --election-timeout-max <ELECTION_TIMEOUT_MAX>  Upper bound [default: 400ms]
";

    #[test]
    fn defaults_come_from_help_and_flags_override_them() {
        assert_eq!(help_default(HELP, "--heartbeat-interval").as_deref(), Some("100ms"));
        assert_eq!(help_default(HELP, "--election-timeout-min").as_deref(), Some("200ms"));
        assert_eq!(help_default(HELP, "--election-timeout-max").as_deref(), Some("400ms"));
        assert_eq!(help_default(HELP, "--snapshot-count"), None);
        let args: Vec<String> =
            ["--election-timeout-min=150ms", "--heartbeat-interval", "50ms"].map(String::from).into();
        assert_eq!(flag_value(&args, "--election-timeout-min").as_deref(), Some("150ms"));
        assert_eq!(flag_value(&args, "--heartbeat-interval").as_deref(), Some("50ms"));
        assert_eq!(flag_value(&args, "--election-timeout-max"), None);
    }

    #[test]
    fn etcd_gets_the_same_election_timeout_and_a_heartbeat_it_accepts() {
        let skiff = |hb, min| SkiffTiming {
            heartbeat: Duration::from_millis(hb),
            election_timeout_min: Duration::from_millis(min),
            election_timeout_max: Duration::from_millis(2 * min),
        };
        assert_eq!(EtcdTiming::like(&skiff(100, 200)), EtcdTiming { heartbeat_ms: 40, election_timeout_ms: 200 });
        assert_eq!(EtcdTiming::like(&skiff(100, 1000)), EtcdTiming { heartbeat_ms: 100, election_timeout_ms: 1000 });
    }
}
