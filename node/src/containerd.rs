//! A private containerd per node, as k3s's agent runs one: Skiff writes
//! its config (containerd 1.6's `version = 2`), starts it, waits until its
//! CRI plugin answers, restarts it with back-off when it dies, and stops
//! it (SIGTERM, then SIGKILL) with the agent.
//!
//! Everything of one instance lives under its data dir: root, state, the
//! gRPC and ttrpc sockets, the `opt` plugin's directory, runc's state, the
//! pods' network namespaces, its log. Shim sockets go to containerd's fixed
//! `/run/containerd/s/`, named by a hash that includes this instance's
//! socket address, so they never collide. The CRI streaming server listens
//! on 127.0.0.1 on a free port. So several nodes' containerds share one
//! host without sharing anything.
//!
//! Containers outlive containerd by design (their shims keep them), so a
//! restarted containerd finds them again; [`teardown`] removes a node's
//! sandboxes when they must not outlive it (tests).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use skiff_shutdown::Shutdown;
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::runtime::cri::CriRuntime;
use crate::runtime::{LabelFilter, Runtime, RuntimeError, LABEL_NODE};

/// The longest path a unix socket may have (sun_path is 108 bytes).
const MAX_SOCKET_PATH: usize = 107;
/// How long containerd is given to end after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// How long one runtime call may take while tearing a node down.
const TEARDOWN_CALL: Duration = Duration::from_secs(10);
/// The first restart delay after containerd dies.
const FIRST_RESTART_DELAY: Duration = Duration::from_secs(1);
/// The longest restart delay.
const MAX_RESTART_DELAY: Duration = Duration::from_secs(30);
/// Running this long resets the restart delay.
const STABLE_AFTER: Duration = Duration::from_secs(60);

/// How to run one node's containerd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerdConfig {
    /// Everything of this instance goes under it.
    pub data_dir: PathBuf,
    /// The containerd binary (`containerd` on PATH by default).
    pub binary: PathBuf,
    /// The CRI plugin's sandbox image (Skiff's own pause image).
    pub sandbox_image: String,
    /// Where the CNI plugins are.
    pub cni_bin_dir: PathBuf,
    /// Where the node's CNI conflist is written.
    pub cni_conf_dir: PathBuf,
    /// The CRI streaming server's port on 127.0.0.1 (0: a free one, picked
    /// when the config is written).
    pub stream_port: u16,
    /// containerd's log level.
    pub log_level: String,
    /// How long to wait for the CRI plugin's first answer.
    pub start_timeout: Duration,
}

/// Why containerd could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ContainerdError {
    /// A directory or the config could not be written.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The io error.
        source: std::io::Error,
    },
    /// A socket path would be longer than unix sockets allow.
    #[error("containerd socket path {0} is too long for a unix socket (at most 107 bytes); use a shorter data dir")]
    SocketPathTooLong(PathBuf),
    /// containerd did not answer CRI `Version` in time, or exited.
    #[error("containerd at unix://{socket} did not become ready: {why} (log: {log})")]
    NotReady {
        /// Its socket.
        socket: String,
        /// What went wrong.
        why: String,
        /// Its log file.
        log: String,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ContainerdError {
    let what = what.into();
    move |source| ContainerdError::Io { what, source }
}

impl ContainerdConfig {
    /// A config with everything under `data_dir`, the CNI conf dir
    /// `<data_dir>/cni/net.d`, Debian's CNI plugins, Skiff's pause image.
    pub fn new(data_dir: &Path) -> ContainerdConfig {
        ContainerdConfig {
            data_dir: data_dir.to_path_buf(),
            binary: PathBuf::from("containerd"),
            sandbox_image: crate::images::PAUSE_IMAGE.to_string(),
            cni_bin_dir: PathBuf::from(crate::cni::DEFAULT_CNI_BIN_DIR),
            cni_conf_dir: data_dir.join("cni").join("net.d"),
            stream_port: 0,
            log_level: "info".to_string(),
            start_timeout: Duration::from_secs(20),
        }
    }

    /// The gRPC socket (CRI and containerd's own API).
    pub fn socket(&self) -> PathBuf {
        self.data_dir.join("containerd.sock")
    }

    /// The CRI endpoint, `unix://<socket>`.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket().display())
    }

    /// The generated config file.
    pub fn config_path(&self) -> PathBuf {
        self.data_dir.join("config.toml")
    }

    /// containerd's stdout and stderr.
    pub fn log_path(&self) -> PathBuf {
        self.data_dir.join("containerd.log")
    }

    /// The config file's text, with the streaming server on `stream_port`.
    pub fn render(&self, stream_port: u16) -> String {
        let dir = |sub: &str| toml_string(&self.data_dir.join(sub));
        let cri = "plugins.\"io.containerd.grpc.v1.cri\"";
        format!(
            r#"# Written by skiff-node: a private containerd for one node. Do not edit.
version = 2
root = {root}
state = {state}
# The built-in plugins only; none loaded from a shared directory.
plugin_dir = ""
# Snapshotters this node never uses (overlayfs is its one) and tracing.
# (The legacy io.containerd.runtime.v1.linux stays: the tasks service, and
# so the CRI plugin, refuses to load without it.)
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = {socket}

[ttrpc]
  address = {ttrpc}

[debug]
  address = ""
  level = {level}

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = {opt}

[{cri}]
  sandbox_image = {sandbox_image}
  stream_server_address = "127.0.0.1"
  stream_server_port = "{stream_port}"
  enable_selinux = false
  disable_apparmor = true
  # No OOM score below containerd's own: lowering it needs
  # CAP_SYS_RESOURCE, which containers in containers (and some VMs) lack,
  # and runc fails outright without it.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  Root = {runc_root}

[{cri}.cni]
  bin_dir = {cni_bin}
  conf_dir = {cni_conf}
  max_conf_num = 1

[{cri}.registry]
  config_path = ""
"#,
            root = dir("root"),
            state = dir("state"),
            socket = toml_string(&self.socket()),
            ttrpc = toml_string(&self.data_dir.join("containerd.sock.ttrpc")),
            level = toml_str(&self.log_level),
            opt = dir("opt"),
            sandbox_image = toml_str(&self.sandbox_image),
            runc_root = dir("runc"),
            cni_bin = toml_string(&self.cni_bin_dir),
            cni_conf = toml_string(&self.cni_conf_dir),
        )
    }

    /// Creates the directories and writes the config; returns the
    /// streaming port written.
    pub fn write(&self) -> Result<u16, ContainerdError> {
        for socket in [self.socket(), self.data_dir.join("containerd.sock.ttrpc")] {
            if socket.as_os_str().len() > MAX_SOCKET_PATH {
                return Err(ContainerdError::SocketPathTooLong(socket));
            }
        }
        for dir in
            [self.data_dir.clone(), self.data_dir.join("root"), self.data_dir.join("state"), self.cni_conf_dir.clone()]
        {
            std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
        }
        let port = match self.stream_port {
            0 => free_port()?,
            port => port,
        };
        let path = self.config_path();
        std::fs::write(&path, self.render(port)).map_err(io(format!("writing {}", path.display())))?;
        Ok(port)
    }
}

/// A TOML basic string.
fn toml_str(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_else(|_| "\"\"".to_string())
}

fn toml_string(path: &Path) -> String {
    toml_str(&path.to_string_lossy())
}

/// A port on 127.0.0.1 nothing listens on now (containerd 1.6 builds its
/// streaming URLs from the configured port, so 0 would not do).
fn free_port() -> Result<u16, ContainerdError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(io("finding a free port"))?;
    let port = listener.local_addr().map_err(io("finding a free port"))?.port();
    Ok(port)
}

/// The delay before the next restart: doubling from
/// [`FIRST_RESTART_DELAY`] to [`MAX_RESTART_DELAY`], back to the first
/// after [`STABLE_AFTER`] of running.
pub fn next_restart_delay(previous: Option<Duration>, ran_for: Duration) -> Duration {
    match previous {
        Some(delay) if ran_for < STABLE_AFTER => (delay * 2).min(MAX_RESTART_DELAY),
        _ => FIRST_RESTART_DELAY,
    }
}

/// A running private containerd, supervised until [`Containerd::stop`]
/// (or the shutdown it was started with) ends it.
#[derive(Debug)]
pub struct Containerd {
    config: ContainerdConfig,
    shutdown: Shutdown,
    /// The running process's id, 0 while none runs.
    pid: Arc<AtomicU32>,
}

impl Containerd {
    /// Writes the config, starts containerd and waits until its CRI plugin
    /// answers `Version`; then supervises it on a child of `shutdown`.
    pub async fn start(config: ContainerdConfig, shutdown: &Shutdown) -> Result<Containerd, ContainerdError> {
        // An agent killed with SIGKILL leaves its containerd behind; a new
        // one on the same data dir cannot start beside it.
        for pid in stale_instances(&config.config_path()) {
            tracing::warn!(pid, "stopping a containerd left running on this data dir");
            stop_pid(pid).await;
        }
        config.write()?;
        // A socket left by a killed instance would make containerd fail.
        for stale in [config.socket(), config.data_dir.join("containerd.sock.ttrpc")] {
            let _ = std::fs::remove_file(stale);
        }
        let mut child = spawn(&config)?;
        if let Err(mut why) = wait_ready(&config, &mut child).await {
            terminate(&mut child).await;
            if let Some(line) = last_error_line(&config.log_path()) {
                why = format!("{why}; its last error: {line}");
            }
            return Err(ContainerdError::NotReady {
                socket: config.socket().display().to_string(),
                why,
                log: config.log_path().display().to_string(),
            });
        }
        tracing::info!(socket = %config.socket().display(), "containerd is ready");
        let shutdown = shutdown.child();
        let pid = Arc::new(AtomicU32::new(child.id().unwrap_or(0)));
        shutdown.spawn(supervise(config.clone(), child, shutdown.clone(), pid.clone()));
        Ok(Containerd { config, shutdown, pid })
    }

    /// The CRI endpoint, `unix://<socket>`.
    pub fn endpoint(&self) -> String {
        self.config.endpoint()
    }

    /// The gRPC socket (for `ctr --address`).
    pub fn socket(&self) -> PathBuf {
        self.config.socket()
    }

    /// The config it runs with.
    pub fn config(&self) -> &ContainerdConfig {
        &self.config
    }

    /// The running containerd's process id, `None` while it is down.
    pub fn pid(&self) -> Option<u32> {
        Some(self.pid.load(Ordering::Relaxed)).filter(|pid| *pid != 0)
    }

    /// Stops containerd (SIGTERM, SIGKILL after 10 s) and waits for it.
    /// Containers keep running in their shims.
    pub async fn stop(&self) {
        self.shutdown.stop().await
    }
}

fn spawn(config: &ContainerdConfig) -> Result<Child, ContainerdError> {
    let log_path = config.log_path();
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(io(format!("opening {}", log_path.display())))?;
    let stderr = log.try_clone().map_err(io(format!("opening {}", log_path.display())))?;
    Command::new(&config.binary)
        .arg("--config")
        .arg(config.config_path())
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .map_err(io(format!("starting {}", config.binary.display())))
}

/// Waits until CRI `Version` answers, containerd exits, or the start
/// timeout passes.
async fn wait_ready(config: &ContainerdConfig, child: &mut Child) -> Result<(), String> {
    let endpoint = config.endpoint();
    let deadline = Instant::now() + config.start_timeout;
    let mut last = String::from("no answer yet");
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("containerd exited ({status})"));
        }
        if Instant::now() >= deadline {
            return Err(format!("no CRI answer within {:?}; last error: {last}", config.start_timeout));
        }
        if config.socket().exists() {
            match CriRuntime::connect(&endpoint).await {
                Ok(_) => return Ok(()),
                Err(e) => last = e.to_string(),
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The last error containerd logged, for a start failure's message.
fn last_error_line(log: &Path) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    let line = text
        .lines()
        .rev()
        .find(|l| l.contains("level=error") || l.contains("level=fatal") || l.contains("failed to load plugin"))?;
    Some(line.chars().take(400).collect())
}

/// SIGTERM, then SIGKILL after [`STOP_GRACE`].
/// Processes running containerd with `config` (found through /proc).
fn stale_instances(config: &Path) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let wanted = config.as_os_str().as_encoded_bytes();
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { return false };
            is_instance_of(&cmdline, wanted)
        })
        .collect()
}

/// Whether a NUL-separated command line runs containerd with `--config <config>`.
fn is_instance_of(cmdline: &[u8], config: &[u8]) -> bool {
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    let is_containerd = args.first().is_some_and(|a| a.ends_with(b"containerd"));
    is_containerd && args.windows(2).any(|w| w[0] == b"--config" && w[1] == config)
}

/// SIGTERM, then SIGKILL after the grace, to a process that is not our child.
async fn stop_pid(pid: i32) {
    let Some(p) = rustix::process::Pid::from_raw(pid) else { return };
    let _ = rustix::process::kill_process(p, rustix::process::Signal::TERM);
    let deadline = tokio::time::Instant::now() + STOP_GRACE;
    while tokio::time::Instant::now() < deadline {
        if !Path::new(&format!("/proc/{pid}")).exists() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
}

async fn terminate(child: &mut Child) {
    if let Some(pid) = child.id().and_then(|id| rustix::process::Pid::from_raw(id as i32)) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        if tokio::time::timeout(STOP_GRACE, child.wait()).await.is_ok() {
            return;
        }
        tracing::warn!("containerd did not stop on SIGTERM; killing it");
    }
    let _ = child.kill().await;
}

/// Where the supervisor of one containerd is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SupervisorState {
    /// containerd runs, started at `since`; `last_delay` is the delay
    /// before this start (`None`: the first start).
    Running {
        /// When it was started.
        since: Instant,
        /// The delay before this start.
        last_delay: Option<Duration>,
    },
    /// containerd is down and is started again at `until`.
    Waiting {
        /// When to start it.
        until: Instant,
        /// How long this wait is.
        delay: Duration,
    },
    /// The supervisor has stopped containerd for good.
    Stopped,
}

/// What happened to the supervised containerd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SupervisorEvent {
    /// It exited (or could not be waited for).
    Exited,
    /// It was started again.
    Started,
    /// Starting it again failed.
    StartFailed,
    /// The shutdown began (and containerd was stopped).
    Shutdown,
}

/// The supervisor's next state after `event` at `now`.
pub fn step(state: SupervisorState, event: SupervisorEvent, now: Instant) -> SupervisorState {
    use SupervisorEvent as E;
    use SupervisorState as S;
    match (state, event) {
        (_, E::Shutdown) | (S::Stopped, _) => S::Stopped,
        (S::Running { since, last_delay }, E::Exited) => {
            let delay = next_restart_delay(last_delay, now.saturating_duration_since(since));
            S::Waiting { until: now + delay, delay }
        }
        (S::Waiting { delay, .. }, E::Started) => S::Running { since: now, last_delay: Some(delay) },
        (S::Waiting { delay, .. }, E::StartFailed) => {
            let delay = next_restart_delay(Some(delay), Duration::ZERO);
            S::Waiting { until: now + delay, delay }
        }
        (state, _) => state,
    }
}

/// Runs the supervisor's states: waits on containerd while it runs,
/// restarts it when its wait is over, until the shutdown.
async fn supervise(config: ContainerdConfig, child: Child, shutdown: Shutdown, pid: Arc<AtomicU32>) {
    let mut child = Some(child);
    let mut state = SupervisorState::Running { since: Instant::now(), last_delay: None };
    loop {
        let event = match (state, child.as_mut()) {
            (SupervisorState::Stopped, _) => return,
            (SupervisorState::Running { .. }, Some(running)) => tokio::select! {
                _ = shutdown.cancelled() => {
                    terminate(running).await;
                    tracing::info!("containerd stopped");
                    SupervisorEvent::Shutdown
                }
                status = running.wait() => {
                    match status {
                        Ok(status) => tracing::warn!(%status, log = %config.log_path().display(), "containerd exited"),
                        Err(e) => tracing::warn!(error = %e, "waiting for containerd failed"),
                    }
                    SupervisorEvent::Exited
                }
            },
            (SupervisorState::Running { .. }, None) => SupervisorEvent::Exited,
            (SupervisorState::Waiting { until, delay }, _) => {
                tracing::info!(restart_in = ?delay, "restarting containerd");
                tokio::select! {
                    _ = shutdown.cancelled() => SupervisorEvent::Shutdown,
                    _ = tokio::time::sleep_until(until) => match spawn(&config) {
                        Ok(next) => {
                            child = Some(next);
                            SupervisorEvent::Started
                        }
                        Err(e) => {
                            tracing::error!(error = %e, "restarting containerd failed");
                            SupervisorEvent::StartFailed
                        }
                    },
                }
            }
        };
        if matches!(event, SupervisorEvent::Exited | SupervisorEvent::Shutdown) {
            child = None;
        }
        pid.store(child.as_ref().and_then(Child::id).unwrap_or(0), Ordering::Relaxed);
        state = step(state, event, Instant::now());
    }
}

/// Stops and removes every sandbox (and so every container) labelled as
/// `node`'s; returns how many were removed. Tests call it so no container
/// outlives them.
pub async fn teardown(runtime: &dyn Runtime, node: &str) -> Result<usize, RuntimeError> {
    let filter = LabelFilter([(LABEL_NODE.to_string(), node.to_string())].into_iter().collect());
    // Every call is bounded and a failure does not stop the rest: this runs
    // on the way out, where a stuck runtime must not keep the node alive.
    let bounded = |what: String| move |_| RuntimeError::DeadlineExceeded(what);
    let containers = tokio::time::timeout(TEARDOWN_CALL, runtime.list_containers(&filter))
        .await
        .map_err(bounded("listing containers".into()))??;
    // Containers first, quickly: a sandbox stop also kills them, but with
    // the runtime's default grace.
    for container in containers {
        let id = container.id.clone();
        let stopped = tokio::time::timeout(TEARDOWN_CALL, runtime.stop_container(&id, Duration::ZERO)).await;
        let removed = tokio::time::timeout(TEARDOWN_CALL, runtime.remove_container(&id)).await;
        if !matches!((&stopped, &removed), (Ok(Ok(())), Ok(Ok(())))) {
            tracing::warn!(container = %id, ?stopped, ?removed, "removing a container on teardown");
        }
    }
    let sandboxes = tokio::time::timeout(TEARDOWN_CALL, runtime.list_sandboxes(&filter))
        .await
        .map_err(bounded("listing sandboxes".into()))??;
    for sandbox in &sandboxes {
        let stopped = tokio::time::timeout(TEARDOWN_CALL, runtime.stop_sandbox(&sandbox.id)).await;
        let removed = tokio::time::timeout(TEARDOWN_CALL, runtime.remove_sandbox(&sandbox.id)).await;
        if !matches!((&stopped, &removed), (Ok(Ok(())), Ok(Ok(())))) {
            tracing::warn!(sandbox = %sandbox.id, ?stopped, ?removed, "removing a sandbox on teardown");
        }
    }
    Ok(sandboxes.len())
}

/// Kills what the shims of the containerd listening on `socket` still run,
/// and the shims: the last resort after a teardown the runtime did not
/// finish, so that nothing of the node outlives it. Returns the processes
/// killed.
pub fn kill_shims(socket: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir("/proc") else { return 0 };
    let address = socket.as_os_str().as_encoded_bytes();
    let shims: Vec<i32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { return false };
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            args.first().is_some_and(|a| a.ends_with(b"containerd-shim-runc-v2"))
                && args.windows(2).any(|w| w[0] == b"-address" && w[1] == address)
        })
        .collect();
    let mut killed = 0;
    for shim in shims {
        let children = std::fs::read_to_string(format!("/proc/{shim}/task/{shim}/children")).unwrap_or_default();
        for pid in children.split_whitespace().filter_map(|p| p.parse::<i32>().ok()).chain([shim]) {
            if let Some(p) = rustix::process::Pid::from_raw(pid) {
                if rustix::process::kill_process(p, rustix::process::Signal::KILL).is_ok() {
                    killed += 1;
                }
            }
        }
    }
    killed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_instance_is_recognised_by_its_config_path_only() {
        let config = b"/data/n1/containerd/config.toml";
        assert!(is_instance_of(b"containerd\0--config\0/data/n1/containerd/config.toml\0", config));
        assert!(is_instance_of(b"/usr/bin/containerd\0--config\0/data/n1/containerd/config.toml", config));
        assert!(!is_instance_of(b"containerd\0--config\0/data/n2/containerd/config.toml\0", config));
        assert!(!is_instance_of(b"vim\0--config\0/data/n1/containerd/config.toml\0", config));
        assert!(!is_instance_of(b"containerd-shim-runc-v2\0--config\0/data/n1/containerd/config.toml", config));
    }

    #[test]
    fn the_config_keeps_every_path_of_the_instance_under_its_data_dir() {
        let mut config = ContainerdConfig::new(Path::new("/data/n1"));
        config.cni_bin_dir = PathBuf::from("/usr/lib/cni");
        let text = config.render(41234);
        for line in [
            "version = 2",
            r#"root = "/data/n1/root""#,
            r#"state = "/data/n1/state""#,
            r#"address = "/data/n1/containerd.sock""#,
            r#"address = "/data/n1/containerd.sock.ttrpc""#,
            r#"path = "/data/n1/opt""#,
            r#"sandbox_image = "skiff.local/pause:1""#,
            r#"stream_server_address = "127.0.0.1""#,
            r#"stream_server_port = "41234""#,
            r#"snapshotter = "overlayfs""#,
            "SystemdCgroup = false",
            r#"Root = "/data/n1/runc""#,
            r#"bin_dir = "/usr/lib/cni""#,
            r#"conf_dir = "/data/n1/cni/net.d""#,
            "netns_mounts_under_state_dir = true",
        ] {
            assert!(text.lines().any(|l| l.trim() == line), "missing {line:?} in:\n{text}");
        }
        assert_eq!(config.endpoint(), "unix:///data/n1/containerd.sock");
    }

    #[test]
    fn writing_the_config_picks_a_stream_port_and_refuses_long_socket_paths() {
        let dir = tempfile::tempdir().unwrap();
        let config = ContainerdConfig::new(dir.path());
        let port = config.write().unwrap();
        assert_ne!(port, 0);
        let text = std::fs::read_to_string(config.config_path()).unwrap();
        assert!(text.contains(&format!("stream_server_port = \"{port}\"")));

        let long = dir.path().join("x".repeat(120));
        assert!(matches!(ContainerdConfig::new(&long).write(), Err(ContainerdError::SocketPathTooLong(_))));
    }

    #[test]
    fn restarts_back_off_and_reset_after_a_stable_run() {
        let first = next_restart_delay(None, Duration::ZERO);
        assert_eq!(first, FIRST_RESTART_DELAY);
        let second = next_restart_delay(Some(first), Duration::from_secs(1));
        assert_eq!(second, FIRST_RESTART_DELAY * 2);
        assert_eq!(next_restart_delay(Some(MAX_RESTART_DELAY), Duration::ZERO), MAX_RESTART_DELAY);
        assert_eq!(next_restart_delay(Some(second), STABLE_AFTER), FIRST_RESTART_DELAY);
    }

    #[tokio::test(start_paused = true)]
    async fn the_supervisor_waits_longer_after_each_quick_death_and_stops_on_shutdown() {
        let start = Instant::now();
        let mut state = SupervisorState::Running { since: start, last_delay: None };
        state = step(state, SupervisorEvent::Exited, start + Duration::from_secs(1));
        assert_eq!(
            state,
            SupervisorState::Waiting { until: start + Duration::from_secs(2), delay: FIRST_RESTART_DELAY }
        );
        state = step(state, SupervisorEvent::StartFailed, start + Duration::from_secs(2));
        assert_eq!(
            state,
            SupervisorState::Waiting { until: start + Duration::from_secs(4), delay: FIRST_RESTART_DELAY * 2 }
        );
        state = step(state, SupervisorEvent::Started, start + Duration::from_secs(4));
        assert_eq!(
            state,
            SupervisorState::Running {
                since: start + Duration::from_secs(4),
                last_delay: Some(FIRST_RESTART_DELAY * 2)
            }
        );
        // Died quickly again: four seconds; after a long run: one again.
        let quick = step(state, SupervisorEvent::Exited, start + Duration::from_secs(5));
        assert!(matches!(quick, SupervisorState::Waiting { delay, .. } if delay == FIRST_RESTART_DELAY * 4));
        let late = step(state, SupervisorEvent::Exited, start + STABLE_AFTER * 2);
        assert!(matches!(late, SupervisorState::Waiting { delay, .. } if delay == FIRST_RESTART_DELAY));
        assert_eq!(step(quick, SupervisorEvent::Shutdown, start), SupervisorState::Stopped);
        assert_eq!(step(SupervisorState::Stopped, SupervisorEvent::Started, start), SupervisorState::Stopped);
    }

    #[tokio::test]
    async fn a_containerd_that_exits_at_once_fails_to_start_with_its_socket_named() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = ContainerdConfig::new(dir.path());
        config.binary = PathBuf::from("false");
        let error = Containerd::start(config.clone(), &Shutdown::new()).await.unwrap_err().to_string();
        assert!(error.contains(&config.socket().display().to_string()), "{error}");
        assert!(error.contains("exited"), "{error}");
        assert!(!error.contains('\n'), "{error}");
    }
}
