//! What the agent asks of a container runtime, shaped as CRI v1's
//! `RuntimeService` and `ImageService` are, in Skiff's own types: the CRI
//! client (`cri`) converts to and from the wire messages, and the fake
//! runtime (`fake`) keeps everything in memory for tests.
//!
//! Every sandbox and container the agent creates carries labels naming the
//! pod (namespace, name, uid), the container and this node, so a restarted
//! agent finds what it owns by listing with a label filter, and several
//! agents can share one containerd.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;

pub mod cri;
pub mod oom;

/// Label on every sandbox and container: the pod's name.
pub const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";
/// Label on every sandbox and container: the pod's namespace.
pub const LABEL_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
/// Label on every sandbox and container: the pod's uid.
pub const LABEL_POD_UID: &str = "io.kubernetes.pod.uid";
/// Label on every container: the container's name in the pod spec.
pub const LABEL_CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// Label on every sandbox and container: the node agent that made it.
pub const LABEL_NODE: &str = "io.skiff.node";

/// Why a runtime call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuntimeError {
    /// The sandbox, container or image does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// The runtime cannot be reached (socket missing, connection refused).
    #[error("container runtime unavailable: {0}")]
    Unavailable(String),
    /// The image could not be pulled (no such image, registry unreachable).
    #[error("image pull failed: {0}")]
    ImagePull(String),
    /// The call did not finish in time.
    #[error("deadline exceeded: {0}")]
    DeadlineExceeded(String),
    /// Anything else the runtime reported, with its message.
    #[error("{0}")]
    Failed(String),
}

/// The runtime's name and version (CRI `Version`), for the Node's nodeInfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeVersion {
    /// e.g. "containerd".
    pub runtime_name: String,
    /// e.g. "1.6.20".
    pub runtime_version: String,
    /// The CRI version it speaks, e.g. "v1".
    pub runtime_api_version: String,
}

/// A port the sandbox publishes on the host (the pod's `hostPort`s).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortMapping {
    /// "TCP", "UDP" or "SCTP".
    pub protocol: String,
    /// The port in the pod.
    pub container_port: u16,
    /// The port on the host.
    pub host_port: u16,
    /// The host address to bind, empty for all.
    pub host_ip: String,
}

/// DNS settings written into the sandbox's resolv.conf.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DnsConfig {
    /// Name servers.
    pub servers: Vec<String>,
    /// Search domains.
    pub searches: Vec<String>,
    /// Options such as "ndots:5".
    pub options: Vec<String>,
}

/// What a pod sandbox is made from (CRI `PodSandboxConfig`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxSpec {
    /// The pod's name.
    pub name: String,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's uid.
    pub uid: String,
    /// How many sandboxes this pod had before this one.
    pub attempt: u32,
    /// The pod's hostname.
    pub hostname: String,
    /// Where the pod's container logs go, e.g.
    /// `<pod-log-dir>/<namespace>_<name>_<uid>`.
    pub log_directory: String,
    /// resolv.conf contents.
    pub dns: DnsConfig,
    /// hostPorts.
    pub port_mappings: Vec<PortMapping>,
    /// Labels (the pod's, plus the `LABEL_*` ones).
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    pub annotations: BTreeMap<String, String>,
    /// The cgroup the sandbox's containers go under.
    pub cgroup_parent: String,
    /// Share the host's network namespace (`spec.hostNetwork`).
    pub host_network: bool,
    /// One PID namespace for the whole pod (`spec.shareProcessNamespace`).
    pub share_process_namespace: bool,
    /// Share the host's PID namespace (`spec.hostPID`).
    pub host_pid: bool,
    /// Share the host's IPC namespace (`spec.hostIPC`).
    pub host_ipc: bool,
    /// Some container of the pod is privileged: the runtime refuses a
    /// privileged container in a sandbox not made for one.
    pub privileged: bool,
    /// Namespaced kernel parameters (`securityContext.sysctls`), by dotted name.
    pub sysctls: BTreeMap<String, String>,
}

/// Which seccomp filter a container runs under.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Seccomp {
    /// None (the kubelet's default without `--seccomp-default`).
    #[default]
    Unconfined,
    /// The runtime's default filter.
    RuntimeDefault,
    /// A profile file on the node, by absolute path.
    Localhost(String),
}

/// A container's Linux security settings, the pod's and the container's
/// `securityContext` merged (CRI `LinuxContainerSecurityContext`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecuritySpec {
    /// All capabilities, every device, no seccomp filter.
    pub privileged: bool,
    /// The uid of its processes.
    pub run_as_user: Option<i64>,
    /// The image's user, by name, when neither the pod nor the image
    /// gives a uid (resolved in the image's `/etc/passwd` by the runtime).
    pub run_as_username: String,
    /// The gid of its processes.
    pub run_as_group: Option<i64>,
    /// More groups for its first process (the pod's `supplementalGroups`
    /// and `fsGroup`).
    pub supplemental_groups: Vec<i64>,
    /// Mount its root filesystem read-only.
    pub readonly_rootfs: bool,
    /// Set `no_new_privs` (`allowPrivilegeEscalation: false`).
    pub no_new_privs: bool,
    /// Capabilities added to the runtime's default set, as the pod names
    /// them (`NET_ADMIN`).
    pub add_capabilities: Vec<String>,
    /// Capabilities dropped (`ALL` for every one).
    pub drop_capabilities: Vec<String>,
    /// Its seccomp filter.
    pub seccomp: Seccomp,
}

/// A bind mount into a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Path in the container.
    pub container_path: String,
    /// Path on the host.
    pub host_path: String,
    /// Mounted read-only.
    pub readonly: bool,
}

/// CPU and memory limits, as cgroups take them (CRI `LinuxContainerResources`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerResources {
    /// CFS period in microseconds (0: the runtime's default).
    pub cpu_period: i64,
    /// CFS quota in microseconds per period (0: unlimited).
    pub cpu_quota: i64,
    /// Relative CPU weight from the request (0: the runtime's default).
    pub cpu_shares: i64,
    /// Memory limit in bytes (0: unlimited).
    pub memory_limit_in_bytes: i64,
}

/// What a container is made from (CRI `ContainerConfig`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerSpec {
    /// The container's name in the pod spec.
    pub name: String,
    /// How many times this container was created before in this sandbox.
    pub attempt: u32,
    /// The image reference, as the pod names it.
    pub image: String,
    /// Entrypoint (the pod's `command`), empty for the image's.
    pub command: Vec<String>,
    /// Arguments (the pod's `args`), empty for the image's.
    pub args: Vec<String>,
    /// Working directory, empty for the image's.
    pub working_dir: String,
    /// Environment, in order.
    pub envs: Vec<(String, String)>,
    /// Bind mounts.
    pub mounts: Vec<Mount>,
    /// Labels (the `LABEL_*` ones).
    pub labels: BTreeMap<String, String>,
    /// Annotations (restart count, termination message path...).
    pub annotations: BTreeMap<String, String>,
    /// Log file, relative to the sandbox's `log_directory`, e.g. `web/0.log`.
    pub log_path: String,
    /// Limits.
    pub resources: ContainerResources,
    /// Keep stdin open.
    pub stdin: bool,
    /// Allocate a terminal.
    pub tty: bool,
    /// Join this running container's PID namespace: an ephemeral
    /// container's `targetContainerName` (`kubectl debug --target`).
    pub pid_target: Option<String>,
    /// Users, groups, capabilities, seccomp, read-only root.
    pub security: SecuritySpec,
}

/// Whether a sandbox is up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxState {
    /// Its network and pause process run.
    Ready,
    /// Stopped, or failed.
    NotReady,
}

/// A sandbox as the runtime reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxStatus {
    /// The runtime's id for it.
    pub id: String,
    /// Ready or not.
    pub state: SandboxState,
    /// The pod's IP, when it has its own network namespace.
    pub ip: Option<String>,
    /// Nanoseconds since the epoch.
    pub created_at: i64,
    /// The attempt it was created with.
    pub attempt: u32,
    /// Its labels (the `LABEL_*` ones name the pod).
    pub labels: BTreeMap<String, String>,
}

/// Where a container is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerState {
    /// Created, not started.
    Created,
    /// Its process runs.
    Running,
    /// Its process ended (see `exit_code` and `reason`).
    Exited,
    /// The runtime does not know.
    Unknown,
}

/// A container as the runtime reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerStatus {
    /// The runtime's id for it.
    pub id: String,
    /// The sandbox it runs in.
    pub sandbox_id: String,
    /// The container's name in the pod spec.
    pub name: String,
    /// Its attempt number.
    pub attempt: u32,
    /// Where it is in its life.
    pub state: ContainerState,
    /// Nanoseconds since the epoch (0: not yet).
    pub created_at: i64,
    /// Nanoseconds since the epoch (0: not yet).
    pub started_at: i64,
    /// Nanoseconds since the epoch (0: not yet).
    pub finished_at: i64,
    /// The process's exit code, once exited.
    pub exit_code: i32,
    /// Why it exited, e.g. "Completed", "Error", "OOMKilled".
    pub reason: String,
    /// A message from the runtime, if any.
    pub message: String,
    /// The image as the pod named it.
    pub image: String,
    /// The image's digest reference, e.g. `sha256:...`.
    pub image_ref: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its annotations.
    pub annotations: BTreeMap<String, String>,
    /// Its log file's absolute path.
    pub log_path: String,
}

/// An exec with streamed stdio, as [`Runtime::exec_piped`] makes it.
pub struct PipedExec {
    /// The process to spawn: its stdio is the command's.
    pub process: tokio::process::Command,
    /// What sends `SIGHUP` to the command in the container, for when its
    /// terminal's client hangs up: killing the process above does not
    /// reach the command, which the runtime runs on its own.
    pub hang_up: Option<tokio::process::Command>,
}

/// What `ExecSync` returns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecResult {
    /// Standard output.
    pub stdout: Vec<u8>,
    /// Standard error.
    pub stderr: Vec<u8>,
    /// The command's exit code.
    pub exit_code: i32,
}

/// An image the runtime holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageInfo {
    /// Its id (`sha256:...`).
    pub id: String,
    /// The tags it is known by.
    pub repo_tags: Vec<String>,
    /// Its size in bytes.
    pub size: u64,
    /// The uid its config's `User` names, if numeric (none if it names no
    /// user: root).
    pub uid: Option<i64>,
    /// The user name its config's `User` names, if not numeric.
    pub username: String,
}

/// A container's resource figures (CRI `ContainerStats`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerStats {
    /// The container's id.
    pub id: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// When these figures were read, nanoseconds since the epoch.
    pub timestamp: i64,
    /// Cumulative CPU time in nanoseconds.
    pub cpu_usage_core_nanoseconds: u64,
    /// Memory working set in bytes.
    pub memory_working_set_bytes: u64,
}

/// Which sandboxes or containers to list: all whose labels include these.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelFilter(pub BTreeMap<String, String>);

impl LabelFilter {
    /// Whether `labels` include every pair of the filter.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.matches_by(|k| labels.get(k))
    }

    /// [`matches`](Self::matches) for labels behind any lookup (CRI's
    /// messages carry theirs in a `HashMap`).
    pub fn matches_by<'a>(&self, get: impl Fn(&str) -> Option<&'a String>) -> bool {
        self.0.iter().all(|(k, v)| get(k) == Some(v))
    }
}

/// A container runtime: CRI's `RuntimeService` and `ImageService`, the
/// calls the agent makes. Implementations are cheap to share (`Arc<dyn
/// Runtime>`) and safe to call concurrently.
#[async_trait]
pub trait Runtime: Send + Sync + 'static {
    /// The runtime's name and version.
    async fn version(&self) -> Result<RuntimeVersion, RuntimeError>;

    /// Creates and starts a sandbox (network namespace, pause process);
    /// returns its id.
    async fn run_sandbox(&self, spec: &SandboxSpec) -> Result<String, RuntimeError>;
    /// Stops a sandbox and every container in it; stopping a stopped or
    /// missing sandbox succeeds.
    async fn stop_sandbox(&self, id: &str) -> Result<(), RuntimeError>;
    /// Removes a stopped sandbox and its containers; removing a missing
    /// one succeeds.
    async fn remove_sandbox(&self, id: &str) -> Result<(), RuntimeError>;
    /// One sandbox's status.
    async fn sandbox_status(&self, id: &str) -> Result<SandboxStatus, RuntimeError>;
    /// Every sandbox whose labels match.
    async fn list_sandboxes(&self, filter: &LabelFilter) -> Result<Vec<SandboxStatus>, RuntimeError>;

    /// Creates a container in a sandbox; returns its id.
    async fn create_container(
        &self,
        sandbox_id: &str,
        spec: &ContainerSpec,
        sandbox: &SandboxSpec,
    ) -> Result<String, RuntimeError>;
    /// Starts a created container.
    async fn start_container(&self, id: &str) -> Result<(), RuntimeError>;
    /// Sends SIGTERM, then SIGKILL after `timeout`; stopping an exited or
    /// missing container succeeds.
    async fn stop_container(&self, id: &str, timeout: Duration) -> Result<(), RuntimeError>;
    /// Removes a container; removing a missing one succeeds.
    async fn remove_container(&self, id: &str) -> Result<(), RuntimeError>;
    /// One container's status.
    async fn container_status(&self, id: &str) -> Result<ContainerStatus, RuntimeError>;
    /// Every container whose labels match.
    async fn list_containers(&self, filter: &LabelFilter) -> Result<Vec<ContainerStatus>, RuntimeError>;
    /// Runs a command in a running container and waits for it, at most
    /// `timeout`.
    async fn exec_sync(&self, id: &str, cmd: &[String], timeout: Duration) -> Result<ExecResult, RuntimeError>;
    /// A process that, once spawned, runs `cmd` in a running container
    /// with the process's own stdio as the command's: exec with stdin,
    /// which CRI's `ExecSync` cannot take. With `tty` the command gets a
    /// terminal in the container, and the process expects a terminal of
    /// its own as stdio (see [`crate::pty`]), whose size it passes on.
    fn exec_piped(&self, _id: &str, _cmd: &[String], _tty: bool) -> Result<PipedExec, RuntimeError> {
        Err(RuntimeError::Unavailable("this runtime cannot run a command with stdin".to_string()))
    }
    /// Where to join a running container's own stdio (CRI `Attach`): a
    /// WebSocket URL on the runtime's streaming server, which speaks
    /// `v4.channel.k8s.io` (stdin 0, stdout 1, stderr 2 unless `tty`,
    /// Status 3, resize 4).
    async fn attach_url(&self, _id: &str, _stdin: bool, _tty: bool) -> Result<String, RuntimeError> {
        Err(RuntimeError::Unavailable("this runtime cannot attach to a container".to_string()))
    }
    /// Resource figures of every container whose labels match.
    async fn list_container_stats(&self, filter: &LabelFilter) -> Result<Vec<ContainerStats>, RuntimeError>;

    /// The image if the runtime holds it.
    async fn image_status(&self, image: &str) -> Result<Option<ImageInfo>, RuntimeError>;
    /// Pulls an image; returns its reference (`sha256:...`).
    async fn pull_image(&self, image: &str) -> Result<String, RuntimeError>;
    /// Every image the runtime holds.
    async fn list_images(&self) -> Result<Vec<ImageInfo>, RuntimeError>;
}

pub mod fake;
