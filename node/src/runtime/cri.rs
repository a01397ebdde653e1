//! The real runtime: a CRI v1 client (containerd's CRI plugin, or any CRI
//! runtime) over a unix socket, converting Skiff's types to and from the
//! `runtime.v1` messages.
//!
//! Every call has a deadline (the runtime answering nothing must not hang
//! a pod worker); tonic status codes become [`RuntimeError`]s, and a failed
//! `PullImage` is always [`RuntimeError::ImagePull`] unless the runtime
//! itself was unreachable.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::{self, StreamExt, TryStreamExt};
use hyper_util::rt::TokioIo;
use skiff_proto::cri;
use skiff_proto::cri::image_service_client::ImageServiceClient;
use skiff_proto::cri::runtime_service_client::RuntimeServiceClient;
use tonic::transport::{Channel, Endpoint, Uri};
use tonic::{Code, Status};

use super::{
    ContainerSpec, ContainerState, ContainerStats, ContainerStatus, ExecResult, ImageInfo, LabelFilter, PipedExec,
    Runtime, RuntimeError, RuntimeVersion, SandboxSpec, SandboxState, SandboxStatus, Seccomp, SecuritySpec,
};

/// How long an ordinary call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// How long connecting (and the first `Version`) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a pull may take.
const PULL_TIMEOUT: Duration = Duration::from_secs(600);
/// Status calls made at once when listing.
const LIST_CONCURRENCY: usize = 16;
/// How long one listing of every sandbox (or container) answers the
/// listings that follow, unless this client changed something meanwhile.
const LISTING_TTL: Duration = Duration::from_millis(500);

/// A CRI runtime reached over a unix socket. Cheap to clone; clones share
/// one HTTP/2 connection and one [`StatusCache`].
#[derive(Debug, Clone)]
pub struct CriRuntime {
    endpoint: String,
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
    statuses: Arc<Mutex<StatusCache>>,
    listings: Arc<Listings>,
}

/// The last listing of every sandbox and of every container, which a
/// filtered listing within [`LISTING_TTL`] filters instead of asking the
/// runtime: each pod worker lists its own pod every second, and one
/// listing for the node serves them all. A listing is kept only if no
/// change this client made (run, create, start, stop, remove) ended while
/// it was under way, and is dropped by the next such change: a worker that
/// acted lists again and sees what it did. A change made behind the
/// client's back (a container exiting) shows within the TTL.
#[derive(Debug, Default)]
struct Listings {
    /// Changes this client has made; a listing records the count it began at.
    changes: std::sync::atomic::AtomicU64,
    sandboxes: Slot<cri::PodSandbox>,
    containers: Slot<cri::Container>,
}

/// One kind's listing kept, and the right to list it: the workers that
/// find the listing stale together wait for one of them to list, rather
/// than each asking the runtime.
#[derive(Debug)]
struct Slot<T> {
    kept: Mutex<Option<Listing<T>>>,
    listing: tokio::sync::Mutex<()>,
}

impl<T> Default for Slot<T> {
    fn default() -> Self {
        Slot { kept: Mutex::new(None), listing: tokio::sync::Mutex::new(()) }
    }
}

#[derive(Debug)]
struct Listing<T> {
    began: std::time::Instant,
    changes: u64,
    items: Arc<Vec<T>>,
}

impl Listings {
    fn changes(&self) -> u64 {
        self.changes.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Notes a change this client made, once the runtime has answered.
    fn changed(&self) {
        self.changes.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// The items of `listing` if it is still good.
    fn fresh<T>(&self, listing: &Mutex<Option<Listing<T>>>) -> Option<Arc<Vec<T>>> {
        let listing = listing.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        listing
            .as_ref()
            .filter(|l| l.changes == self.changes() && l.began.elapsed() < LISTING_TTL)
            .map(|l| l.items.clone())
    }

    /// The items of `slot`'s listing if still good, else those `list`
    /// gets from the runtime (one listing at a time: a caller that waited
    /// takes the listing that ended meanwhile if it is good), kept unless
    /// a change ended while it listed (or a listing begun later is kept
    /// already). `true` with items this call listed.
    async fn get_or_list<T, F>(
        &self,
        slot: &Slot<T>,
        list: impl FnOnce() -> F,
    ) -> Result<(Arc<Vec<T>>, bool), RuntimeError>
    where
        F: Future<Output = Result<Vec<T>, RuntimeError>>,
    {
        if let Some(items) = self.fresh(&slot.kept) {
            return Ok((items, false));
        }
        let _listing = slot.listing.lock().await;
        if let Some(items) = self.fresh(&slot.kept) {
            return Ok((items, false));
        }
        let (began, changes) = (std::time::Instant::now(), self.changes());
        let items = Arc::new(list().await?);
        let mut kept = slot.kept.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if self.changes() == changes && kept.as_ref().is_none_or(|k| k.began < began) {
            *kept = Some(Listing { began, changes, items: items.clone() });
        }
        Ok((items, true))
    }
}

/// The statuses listings have read, by id, with the state the listing
/// showed. A status changes only with its state (an id is never reused, a
/// sandbox's IP and a container's start are fixed once it runs, an exited
/// container's end for good), so a listing reads a status again only when
/// it shows another state; an entry goes when a listing of the node no
/// longer shows its id. Each pod worker lists its pod every second:
/// without this, every listing would make a status call per sandbox and
/// container, and containerd's sandbox status asks the shim.
#[derive(Debug, Default)]
struct StatusCache {
    sandboxes: HashMap<String, (i32, SandboxStatus)>,
    containers: HashMap<String, (i32, ContainerStatus)>,
}

fn lock(cache: &Mutex<StatusCache>) -> std::sync::MutexGuard<'_, StatusCache> {
    cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The socket path of an endpoint given as `unix:///path` or a plain path.
pub fn socket_path(endpoint: &str) -> Result<PathBuf, RuntimeError> {
    let path = match endpoint.strip_prefix("unix://") {
        Some(path) => path,
        None if endpoint.contains("://") => {
            return Err(RuntimeError::Unavailable(format!(
                "container runtime endpoint {endpoint}: only unix sockets are supported"
            )))
        }
        None => endpoint,
    };
    if path.is_empty() {
        return Err(RuntimeError::Unavailable("container runtime endpoint is empty".to_string()));
    }
    Ok(PathBuf::from(path))
}

impl CriRuntime {
    /// Connects to the runtime at `endpoint` (`unix:///path` or a plain
    /// path) and checks that it answers CRI `Version`; the error names the
    /// endpoint in one line.
    pub async fn connect(endpoint: &str) -> Result<CriRuntime, RuntimeError> {
        let path = socket_path(endpoint)?;
        super::oom::watch();
        let unreachable = |why: String| RuntimeError::Unavailable(format!("container runtime at {endpoint}: {why}"));
        let channel = tokio::time::timeout(CONNECT_TIMEOUT, connect_channel(path))
            .await
            .map_err(|_| unreachable("timed out connecting".to_string()))?
            .map_err(|e| unreachable(error_chain(&e)))?;
        let runtime = CriRuntime {
            endpoint: endpoint.to_string(),
            runtime: RuntimeServiceClient::new(channel.clone()).max_decoding_message_size(64 << 20),
            images: ImageServiceClient::new(channel).max_decoding_message_size(64 << 20),
            statuses: Arc::default(),
            listings: Arc::default(),
        };
        match tokio::time::timeout(CONNECT_TIMEOUT, runtime.version()).await {
            Ok(Ok(_)) => Ok(runtime),
            Ok(Err(RuntimeError::Failed(why))) => Err(unreachable(format!("does not speak CRI v1: {why}"))),
            Ok(Err(e)) => Err(unreachable(e.to_string())),
            Err(_) => Err(unreachable(format!("no answer to CRI Version in {CONNECT_TIMEOUT:?}"))),
        }
    }

    /// The endpoint this client was connected to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Removes an image (CRI `RemoveImage`); removing a missing one
    /// succeeds.
    pub async fn remove_image(&self, image: &str) -> Result<(), RuntimeError> {
        let request = cri::RemoveImageRequest { image: Some(image_spec(image)) };
        let mut client = self.images.clone();
        ignore_not_found(call("remove_image", CALL_TIMEOUT, client.remove_image(request)).await.map(|_| ()))
    }
}

/// A channel over the unix socket at `path`: tonic needs a URI, which the
/// connector ignores.
async fn connect_channel(path: PathBuf) -> Result<Channel, tonic::transport::Error> {
    Endpoint::from_static("http://cri.invalid")
        .connect_timeout(CONNECT_TIMEOUT)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { tokio::net::UnixStream::connect(path).await.map(TokioIo::new) }
        }))
        .await
}

/// An error and its causes, on one line (tonic's transport errors hide
/// the io error that says "No such file or directory").
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Runs one call with a client-side deadline (the runtime also gets it as
/// `grpc-timeout`), timing it as the kubelet does, under its `operation`
/// name (`run_podsandbox`, `create_container`, ...).
async fn call<T>(
    operation: &'static str,
    timeout: Duration,
    request: impl Future<Output = Result<tonic::Response<T>, Status>>,
) -> Result<T, RuntimeError> {
    let began = std::time::Instant::now();
    let result = match tokio::time::timeout(timeout, request).await {
        Ok(Ok(response)) => Ok(response.into_inner()),
        Ok(Err(status)) => Err(status_to_error(&status)),
        Err(_) => Err(RuntimeError::DeadlineExceeded(format!("no answer from the container runtime in {timeout:?}"))),
    };
    let metrics = crate::metrics::metrics();
    metrics.runtime_operations.with_label_values(&[operation]).inc();
    metrics.runtime_operation_seconds.with_label_values(&[operation]).observe(began.elapsed().as_secs_f64());
    // A status or removal of something already gone is an answer, not a failure.
    if result.as_ref().is_err_and(|e| !matches!(e, RuntimeError::NotFound(_))) {
        metrics.runtime_operation_errors.with_label_values(&[operation]).inc();
    }
    result
}

/// A tonic status as a runtime error.
pub(crate) fn status_to_error(status: &Status) -> RuntimeError {
    let message = status.message().to_string();
    match status.code() {
        Code::NotFound => RuntimeError::NotFound(message),
        Code::Unavailable => RuntimeError::Unavailable(message),
        Code::DeadlineExceeded => RuntimeError::DeadlineExceeded(message),
        Code::Unknown if message.is_empty() => RuntimeError::Failed(format!("{status}")),
        _ => RuntimeError::Failed(message),
    }
}

/// A failed pull: the runtime being unreachable (or slow) stays what it
/// is, anything else is the image's fault.
pub(crate) fn pull_error(error: RuntimeError) -> RuntimeError {
    match error {
        RuntimeError::Unavailable(_) | RuntimeError::DeadlineExceeded(_) => error,
        RuntimeError::NotFound(message) | RuntimeError::Failed(message) | RuntimeError::ImagePull(message) => {
            RuntimeError::ImagePull(message)
        }
    }
}

/// Stop and remove calls succeed on what is already gone.
fn ignore_not_found(result: Result<(), RuntimeError>) -> Result<(), RuntimeError> {
    match result {
        Err(RuntimeError::NotFound(_)) => Ok(()),
        other => other,
    }
}

fn image_spec(image: &str) -> cri::ImageSpec {
    cri::ImageSpec { image: image.to_string(), user_specified_image: image.to_string(), ..Default::default() }
}

fn to_map(labels: &BTreeMap<String, String>) -> std::collections::HashMap<String, String> {
    labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

fn from_map(labels: std::collections::HashMap<String, String>) -> BTreeMap<String, String> {
    labels.into_iter().collect()
}

fn protocol(name: &str) -> cri::Protocol {
    match name.to_ascii_uppercase().as_str() {
        "UDP" => cri::Protocol::Udp,
        "SCTP" => cri::Protocol::Sctp,
        _ => cri::Protocol::Tcp,
    }
}

/// The namespaces a pod's sandbox and containers share: the pod's own
/// network and IPC (or the host's), and a PID namespace per container
/// unless the pod shares the host's (`hostPID`) or one of its own
/// (`shareProcessNamespace`), or the container joins another's
/// (`pid_target`, a container's runtime id).
fn namespace_options(sandbox: &SandboxSpec, pid_target: Option<&str>) -> cri::NamespaceOption {
    let host_or_pod = |host: bool| if host { cri::NamespaceMode::Node } else { cri::NamespaceMode::Pod };
    let pid = match pid_target {
        Some(_) => cri::NamespaceMode::Target,
        None if sandbox.host_pid => cri::NamespaceMode::Node,
        None if sandbox.share_process_namespace => cri::NamespaceMode::Pod,
        None => cri::NamespaceMode::Container,
    };
    cri::NamespaceOption {
        network: host_or_pod(sandbox.host_network) as i32,
        pid: pid as i32,
        ipc: host_or_pod(sandbox.host_ipc) as i32,
        target_id: pid_target.unwrap_or_default().to_string(),
    }
}

/// CRI's `PodSandboxConfig` for a sandbox spec.
pub(crate) fn sandbox_config(spec: &SandboxSpec) -> cri::PodSandboxConfig {
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: spec.name.clone(),
            uid: spec.uid.clone(),
            namespace: spec.namespace.clone(),
            attempt: spec.attempt,
        }),
        hostname: spec.hostname.clone(),
        log_directory: spec.log_directory.clone(),
        dns_config: Some(cri::DnsConfig {
            servers: spec.dns.servers.clone(),
            searches: spec.dns.searches.clone(),
            options: spec.dns.options.clone(),
        }),
        port_mappings: spec
            .port_mappings
            .iter()
            .map(|p| cri::PortMapping {
                protocol: protocol(&p.protocol) as i32,
                container_port: i32::from(p.container_port),
                host_port: i32::from(p.host_port),
                host_ip: p.host_ip.clone(),
            })
            .collect(),
        labels: to_map(&spec.labels),
        annotations: to_map(&spec.annotations),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: spec.cgroup_parent.clone(),
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(namespace_options(spec, None)),
                privileged: spec.privileged,
            }),
            sysctls: to_map(&spec.sysctls),
        }),
    }
}

/// CRI's `ContainerConfig` for a container spec in a sandbox.
pub(crate) fn container_config(spec: &ContainerSpec, sandbox: &SandboxSpec) -> cri::ContainerConfig {
    cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata { name: spec.name.clone(), attempt: spec.attempt }),
        image: Some(image_spec(&spec.image)),
        command: spec.command.clone(),
        args: spec.args.clone(),
        working_dir: spec.working_dir.clone(),
        envs: spec
            .envs
            .iter()
            .map(|(key, value)| cri::KeyValue { key: key.clone(), value: value.clone().into_bytes() })
            .collect(),
        mounts: spec
            .mounts
            .iter()
            .map(|m| cri::Mount {
                container_path: m.container_path.clone(),
                host_path: m.host_path.clone(),
                readonly: m.readonly,
            })
            .collect(),
        labels: to_map(&spec.labels),
        annotations: to_map(&spec.annotations),
        log_path: spec.log_path.clone(),
        stdin: spec.stdin,
        stdin_once: false,
        tty: spec.tty,
        linux: Some(cri::LinuxContainerConfig {
            resources: Some(cri::LinuxContainerResources {
                cpu_period: spec.resources.cpu_period,
                cpu_quota: spec.resources.cpu_quota,
                cpu_shares: spec.resources.cpu_shares,
                memory_limit_in_bytes: spec.resources.memory_limit_in_bytes,
                oom_score_adj: 0,
            }),
            security_context: Some(security_context(
                &spec.security,
                namespace_options(sandbox, spec.pid_target.as_deref()),
            )),
        }),
    }
}

/// CRI's security context of a container, as the kubelet fills it.
fn security_context(security: &SecuritySpec, namespaces: cri::NamespaceOption) -> cri::LinuxContainerSecurityContext {
    let (profile, path) = match &security.seccomp {
        Seccomp::Unconfined => ((cri::security_profile::ProfileType::Unconfined, String::new()), "unconfined".into()),
        Seccomp::RuntimeDefault => {
            ((cri::security_profile::ProfileType::RuntimeDefault, String::new()), "runtime/default".into())
        }
        Seccomp::Localhost(file) => {
            ((cri::security_profile::ProfileType::Localhost, file.clone()), format!("localhost/{file}"))
        }
    };
    let id = |v: Option<i64>| v.map(|value| cri::Int64Value { value });
    cri::LinuxContainerSecurityContext {
        capabilities: Some(cri::Capability {
            add_capabilities: security.add_capabilities.clone(),
            drop_capabilities: security.drop_capabilities.clone(),
        }),
        privileged: security.privileged,
        namespace_options: Some(namespaces),
        run_as_user: id(security.run_as_user),
        run_as_username: security.run_as_username.clone(),
        run_as_group: id(security.run_as_group),
        readonly_rootfs: security.readonly_rootfs,
        supplemental_groups: security.supplemental_groups.clone(),
        seccomp_profile_path: path,
        no_new_privs: security.no_new_privs,
        seccomp: Some(cri::SecurityProfile { profile_type: profile.0 as i32, localhost_ref: profile.1 }),
    }
}

fn sandbox_state(state: i32) -> SandboxState {
    if state == cri::PodSandboxState::SandboxReady as i32 {
        SandboxState::Ready
    } else {
        SandboxState::NotReady
    }
}

/// A sandbox status from CRI's.
pub(crate) fn sandbox_status(status: cri::PodSandboxStatus) -> SandboxStatus {
    let ip = status.network.map(|n| n.ip).filter(|ip| !ip.is_empty());
    SandboxStatus {
        id: status.id,
        state: sandbox_state(status.state),
        ip,
        created_at: status.created_at,
        attempt: status.metadata.map(|m| m.attempt).unwrap_or(0),
        labels: from_map(status.labels),
    }
}

fn container_state(state: i32) -> ContainerState {
    match cri::ContainerState::try_from(state) {
        Ok(cri::ContainerState::ContainerCreated) => ContainerState::Created,
        Ok(cri::ContainerState::ContainerRunning) => ContainerState::Running,
        Ok(cri::ContainerState::ContainerExited) => ContainerState::Exited,
        _ => ContainerState::Unknown,
    }
}

/// A container status from CRI's; the sandbox id comes from the listing
/// (CRI's `ContainerStatus` does not carry it).
pub(crate) fn container_status(status: cri::ContainerStatus, sandbox_id: String) -> ContainerStatus {
    let (name, attempt) = status.metadata.map(|m| (m.name, m.attempt)).unwrap_or_default();
    ContainerStatus {
        id: status.id,
        sandbox_id,
        name,
        attempt,
        state: container_state(status.state),
        created_at: status.created_at,
        started_at: status.started_at,
        finished_at: status.finished_at,
        exit_code: status.exit_code,
        reason: status.reason,
        message: status.message,
        image: status.image.map(|i| i.image).unwrap_or_default(),
        image_ref: status.image_ref,
        labels: from_map(status.labels),
        annotations: from_map(status.annotations),
        log_path: status.log_path,
    }
}

fn image_info(image: cri::Image) -> ImageInfo {
    ImageInfo {
        id: image.id,
        repo_tags: image.repo_tags,
        size: image.size,
        uid: image.uid.map(|u| u.value),
        username: image.username,
    }
}

fn value(v: Option<cri::UInt64Value>) -> u64 {
    v.map(|v| v.value).unwrap_or(0)
}

fn container_stats(stats: cri::ContainerStats) -> ContainerStats {
    let (id, labels) = stats.attributes.map(|a| (a.id, from_map(a.labels))).unwrap_or_default();
    let cpu = stats.cpu.unwrap_or_default();
    let memory = stats.memory.unwrap_or_default();
    ContainerStats {
        id,
        labels,
        timestamp: cpu.timestamp.max(memory.timestamp),
        cpu_usage_core_nanoseconds: value(cpu.usage_core_nano_seconds),
        memory_working_set_bytes: value(memory.working_set_bytes),
    }
}

/// A timeout as CRI takes it: whole seconds, at least one (0 would mean
/// "no timeout" to some runtimes, or "kill now" to others).
fn whole_seconds(timeout: Duration) -> i64 {
    i64::try_from(timeout.as_secs().max(1)).unwrap_or(i64::MAX)
}

/// Creates a pod's log directory before the runtime writes into it, as the
/// kubelet does (the runtime is on this host: the endpoint is a unix
/// socket).
async fn create_log_directory(dir: &str) -> Result<(), RuntimeError> {
    if dir.is_empty() {
        return Ok(());
    }
    tokio::fs::create_dir_all(Path::new(dir))
        .await
        .map_err(|e| RuntimeError::Failed(format!("creating the pod log directory {dir}: {e}")))
}

#[async_trait]
impl Runtime for CriRuntime {
    async fn version(&self) -> Result<RuntimeVersion, RuntimeError> {
        let mut client = self.runtime.clone();
        let answer =
            call("version", CALL_TIMEOUT, client.version(cri::VersionRequest { version: "v1".to_string() })).await?;
        Ok(RuntimeVersion {
            runtime_name: answer.runtime_name,
            runtime_version: answer.runtime_version,
            runtime_api_version: answer.runtime_api_version,
        })
    }

    async fn run_sandbox(&self, spec: &SandboxSpec) -> Result<String, RuntimeError> {
        create_log_directory(&spec.log_directory).await?;
        let request = cri::RunPodSandboxRequest { config: Some(sandbox_config(spec)), runtime_handler: String::new() };
        let mut client = self.runtime.clone();
        let ran = call("run_podsandbox", CALL_TIMEOUT, client.run_pod_sandbox(request)).await;
        self.listings.changed();
        Ok(ran?.pod_sandbox_id)
    }

    async fn stop_sandbox(&self, id: &str) -> Result<(), RuntimeError> {
        let request = cri::StopPodSandboxRequest { pod_sandbox_id: id.to_string() };
        let mut client = self.runtime.clone();
        let stopped = call("stop_podsandbox", CALL_TIMEOUT, client.stop_pod_sandbox(request)).await;
        self.listings.changed();
        ignore_not_found(stopped.map(|_| ()))
    }

    async fn remove_sandbox(&self, id: &str) -> Result<(), RuntimeError> {
        let request = cri::RemovePodSandboxRequest { pod_sandbox_id: id.to_string() };
        let mut client = self.runtime.clone();
        let removed = ignore_not_found(
            call("remove_podsandbox", CALL_TIMEOUT, client.remove_pod_sandbox(request)).await.map(|_| ()),
        );
        self.listings.changed();
        removed
    }

    async fn sandbox_status(&self, id: &str) -> Result<SandboxStatus, RuntimeError> {
        let request = cri::PodSandboxStatusRequest { pod_sandbox_id: id.to_string(), verbose: false };
        let mut client = self.runtime.clone();
        let answer = call("podsandbox_status", CALL_TIMEOUT, client.pod_sandbox_status(request)).await?;
        answer
            .status
            .map(sandbox_status)
            .ok_or_else(|| RuntimeError::Failed(format!("the runtime returned no status for sandbox {id}")))
    }

    async fn list_sandboxes(&self, filter: &LabelFilter) -> Result<Vec<SandboxStatus>, RuntimeError> {
        let all = self.all_sandboxes().await?;
        let items: Vec<cri::PodSandbox> =
            all.iter().filter(|item| filter.matches_by(|k| item.labels.get(k))).cloned().collect();
        // The listing has no IPs; each status has. A sandbox removed in
        // between is left out.
        let statuses: Vec<Option<SandboxStatus>> = stream::iter(items)
            .map(|item| async move {
                let cached =
                    lock(&self.statuses).sandboxes.get(&item.id).filter(|(state, _)| *state == item.state).cloned();
                if let Some((_, status)) = cached {
                    return Ok(Some(status));
                }
                match self.sandbox_status(&item.id).await {
                    Ok(status) => {
                        lock(&self.statuses).sandboxes.insert(item.id.clone(), (item.state, status.clone()));
                        Ok(Some(status))
                    }
                    Err(RuntimeError::NotFound(_)) => Ok(None),
                    Err(e) => Err(e),
                }
            })
            .buffered(LIST_CONCURRENCY)
            .try_collect()
            .await?;
        Ok(statuses.into_iter().flatten().collect())
    }

    async fn create_container(
        &self,
        sandbox_id: &str,
        spec: &ContainerSpec,
        sandbox: &SandboxSpec,
    ) -> Result<String, RuntimeError> {
        let request = cri::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.to_string(),
            config: Some(container_config(spec, sandbox)),
            sandbox_config: Some(sandbox_config(sandbox)),
        };
        let mut client = self.runtime.clone();
        let created = call("create_container", CALL_TIMEOUT, client.create_container(request)).await;
        self.listings.changed();
        Ok(created?.container_id)
    }

    async fn start_container(&self, id: &str) -> Result<(), RuntimeError> {
        let request = cri::StartContainerRequest { container_id: id.to_string() };
        let mut client = self.runtime.clone();
        let started = call("start_container", CALL_TIMEOUT, client.start_container(request)).await;
        self.listings.changed();
        started.map(|_| ())
    }

    async fn stop_container(&self, id: &str, timeout: Duration) -> Result<(), RuntimeError> {
        let request = cri::StopContainerRequest { container_id: id.to_string(), timeout: timeout.as_secs() as i64 };
        let mut client = self.runtime.clone();
        let stopped = call("stop_container", timeout + CALL_TIMEOUT, client.stop_container(request)).await;
        self.listings.changed();
        ignore_not_found(stopped.map(|_| ()))
    }

    async fn remove_container(&self, id: &str) -> Result<(), RuntimeError> {
        let request = cri::RemoveContainerRequest { container_id: id.to_string() };
        let mut client = self.runtime.clone();
        let removed = ignore_not_found(
            call("remove_container", CALL_TIMEOUT, client.remove_container(request)).await.map(|_| ()),
        );
        self.listings.changed();
        removed
    }

    async fn container_status(&self, id: &str) -> Result<ContainerStatus, RuntimeError> {
        // CRI's status lacks the sandbox id; the listing filtered by id
        // has it.
        let list = cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter { id: id.to_string(), ..Default::default() }),
        };
        let mut client = self.runtime.clone();
        let sandbox_id = call("list_containers", CALL_TIMEOUT, client.list_containers(list))
            .await?
            .containers
            .into_iter()
            .find(|c| c.id == id)
            .map(|c| c.pod_sandbox_id)
            .ok_or_else(|| RuntimeError::NotFound(format!("container {id}")))?;
        self.status_in(id, sandbox_id).await
    }

    async fn list_containers(&self, filter: &LabelFilter) -> Result<Vec<ContainerStatus>, RuntimeError> {
        let all = self.all_containers().await?;
        let containers: Vec<cri::Container> =
            all.iter().filter(|c| filter.matches_by(|k| c.labels.get(k))).cloned().collect();
        // The listing has no exit codes, reasons or times; each status has.
        let statuses: Vec<Option<ContainerStatus>> = stream::iter(containers)
            .map(|c| async move {
                let cached = lock(&self.statuses).containers.get(&c.id).filter(|(state, _)| *state == c.state).cloned();
                if let Some((_, status)) = cached {
                    return Ok(Some(with_oom_kill(status)));
                }
                match self.status_in(&c.id, c.pod_sandbox_id).await {
                    Ok(status) => {
                        lock(&self.statuses).containers.insert(c.id.clone(), (c.state, status.clone()));
                        Ok(Some(status))
                    }
                    Err(RuntimeError::NotFound(_)) => Ok(None),
                    Err(e) => Err(e),
                }
            })
            .buffered(LIST_CONCURRENCY)
            .try_collect()
            .await?;
        Ok(statuses.into_iter().flatten().collect())
    }

    async fn exec_sync(&self, id: &str, cmd: &[String], timeout: Duration) -> Result<ExecResult, RuntimeError> {
        let request =
            cri::ExecSyncRequest { container_id: id.to_string(), cmd: cmd.to_vec(), timeout: whole_seconds(timeout) };
        let mut client = self.runtime.clone();
        let answer = call("exec_sync", timeout + Duration::from_secs(5), client.exec_sync(request)).await?;
        Ok(ExecResult { stdout: answer.stdout, stderr: answer.stderr, exit_code: answer.exit_code })
    }

    /// `ctr tasks exec` on the runtime's socket: CRI containers are
    /// containerd tasks in its `k8s.io` namespace, and ctr wires its own
    /// stdin, stdout and stderr to the command's (closing the command's
    /// stdin when its own ends) and exits with the command's code. With
    /// `--tty` the command gets a terminal from the shim, ctr copies it to
    /// and from its own terminal, and resizes it on `SIGWINCH`.
    fn exec_piped(&self, id: &str, cmd: &[String], tty: bool) -> Result<PipedExec, RuntimeError> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let socket = socket_path(&self.endpoint)?;
        let exec_id =
            format!("skiff-exec-{}-{}", std::process::id(), NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        let ctr = |subcommand: &str| {
            let mut command = tokio::process::Command::new("ctr");
            command.arg("--address").arg(&socket).args([
                "--namespace",
                crate::images::K8S_NAMESPACE,
                "tasks",
                subcommand,
                "--exec-id",
                &exec_id,
            ]);
            command
        };
        let mut process = ctr("exec");
        if tty {
            process.arg("--tty");
        }
        process.arg(id).args(cmd);
        let mut hang_up = ctr("kill");
        hang_up.args(["--signal", "SIGHUP", id]);
        Ok(PipedExec { process, hang_up: Some(hang_up) })
    }

    async fn attach_url(&self, id: &str, stdin: bool, tty: bool) -> Result<String, RuntimeError> {
        // A terminal carries stderr on stdout; asking for both is refused.
        let request = cri::AttachRequest { container_id: id.to_string(), stdin, tty, stdout: true, stderr: !tty };
        let mut client = self.runtime.clone();
        Ok(call("attach", CALL_TIMEOUT, client.attach(request)).await?.url)
    }

    async fn list_container_stats(&self, filter: &LabelFilter) -> Result<Vec<ContainerStats>, RuntimeError> {
        let request = cri::ListContainerStatsRequest {
            filter: Some(cri::ContainerStatsFilter { label_selector: to_map(&filter.0), ..Default::default() }),
        };
        let mut client = self.runtime.clone();
        let answer = call("list_container_stats", CALL_TIMEOUT, client.list_container_stats(request)).await?;
        Ok(answer.stats.into_iter().map(container_stats).collect())
    }

    async fn image_status(&self, image: &str) -> Result<Option<ImageInfo>, RuntimeError> {
        let request = cri::ImageStatusRequest { image: Some(image_spec(image)), verbose: false };
        let mut client = self.images.clone();
        match call("image_status", CALL_TIMEOUT, client.image_status(request)).await {
            Ok(answer) => Ok(answer.image.map(image_info)),
            Err(RuntimeError::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn pull_image(&self, image: &str) -> Result<String, RuntimeError> {
        let request = cri::PullImageRequest { image: Some(image_spec(image)), auth: None, sandbox_config: None };
        let mut client = self.images.clone();
        let answer = call("pull_image", PULL_TIMEOUT, client.pull_image(request)).await.map_err(pull_error)?;
        Ok(answer.image_ref)
    }

    async fn list_images(&self) -> Result<Vec<ImageInfo>, RuntimeError> {
        let mut client = self.images.clone();
        let answer =
            call("list_images", CALL_TIMEOUT, client.list_images(cri::ListImagesRequest { filter: None })).await?;
        Ok(answer.images.into_iter().map(image_info).collect())
    }
}

impl CriRuntime {
    /// Every sandbox, from the runtime or a listing still good. A new
    /// listing of the node drops the statuses of sandboxes gone from it.
    async fn all_sandboxes(&self) -> Result<Arc<Vec<cri::PodSandbox>>, RuntimeError> {
        let mut client = self.runtime.clone();
        let (items, listed) = self
            .listings
            .get_or_list(&self.listings.sandboxes, || async move {
                let request = cri::ListPodSandboxRequest { filter: None };
                Ok(call("list_podsandbox", CALL_TIMEOUT, client.list_pod_sandbox(request)).await?.items)
            })
            .await?;
        if listed {
            let ids: HashSet<&str> = items.iter().map(|s| s.id.as_str()).collect();
            lock(&self.statuses).sandboxes.retain(|id, _| ids.contains(id.as_str()));
        }
        Ok(items)
    }

    /// Every container, from the runtime or a listing still good. A new
    /// listing of the node drops the statuses of containers gone from it.
    async fn all_containers(&self) -> Result<Arc<Vec<cri::Container>>, RuntimeError> {
        let mut client = self.runtime.clone();
        let (items, listed) = self
            .listings
            .get_or_list(&self.listings.containers, || async move {
                let request = cri::ListContainersRequest { filter: None };
                Ok(call("list_containers", CALL_TIMEOUT, client.list_containers(request)).await?.containers)
            })
            .await?;
        if listed {
            let ids: HashSet<&str> = items.iter().map(|c| c.id.as_str()).collect();
            lock(&self.statuses).containers.retain(|id, _| ids.contains(id.as_str()));
        }
        Ok(items)
    }

    /// One container's status, its sandbox known.
    async fn status_in(&self, id: &str, sandbox_id: String) -> Result<ContainerStatus, RuntimeError> {
        let request = cri::ContainerStatusRequest { container_id: id.to_string(), verbose: false };
        let mut client = self.runtime.clone();
        let answer = call("container_status", CALL_TIMEOUT, client.container_status(request)).await?;
        let status = answer
            .status
            .map(|status| container_status(status, sandbox_id))
            .ok_or_else(|| RuntimeError::Failed(format!("the runtime returned no status for container {id}")))?;
        Ok(with_oom_kill(status))
    }
}

/// `status`, OOMKilled if it exited by SIGKILL and the kernel's log says
/// the OOM killer sent it: containerd may miss an OOM kill (see `oom`).
/// Looked at whenever the status is, cached or not: the kernel's log is
/// read in a thread of its own and may record the kill after the exit.
fn with_oom_kill(mut status: ContainerStatus) -> ContainerStatus {
    if status.state == ContainerState::Exited
        && status.exit_code == 137
        && status.reason != "OOMKilled"
        && super::oom::killed(&status.id)
    {
        // (Read again at every sync while the container exists: debug only.)
        tracing::debug!(container = %status.id, runtime_reason = %status.reason, "OOM kill found in the kernel's log");
        status.reason = "OOMKilled".to_string();
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{ContainerResources, DnsConfig, PortMapping};

    /// A listing that counts its calls to the runtime.
    async fn list_counted(listings: &Listings, slot: &Slot<u32>, calls: &mut u32) -> Vec<u32> {
        let (items, _) = listings
            .get_or_list(slot, || {
                *calls += 1;
                let n = *calls;
                async move { Ok(vec![n]) }
            })
            .await
            .unwrap();
        items.to_vec()
    }

    #[tokio::test]
    async fn one_listing_answers_until_a_change_or_its_age_ends_it() {
        let listings = Listings::default();
        let slot = Slot::default();
        let mut calls = 0;
        assert_eq!(list_counted(&listings, &slot, &mut calls).await, [1]);
        assert_eq!(list_counted(&listings, &slot, &mut calls).await, [1], "answered by the listing kept");
        // A change this client made: the next listing asks the runtime.
        listings.changed();
        assert_eq!(list_counted(&listings, &slot, &mut calls).await, [2]);
        assert_eq!(list_counted(&listings, &slot, &mut calls).await, [2]);
        // Past the TTL the runtime is asked again.
        slot.kept.lock().unwrap().as_mut().unwrap().began -= LISTING_TTL;
        assert_eq!(list_counted(&listings, &slot, &mut calls).await, [3]);
    }

    #[tokio::test]
    async fn a_listing_a_change_overtook_or_an_older_one_is_not_kept() {
        let listings = Listings::default();
        let slot: Slot<u32> = Slot::default();
        // A change ends while the runtime lists: what it listed may miss it.
        let (items, listed) = listings
            .get_or_list(&slot, || {
                listings.changed();
                async { Ok(vec![1]) }
            })
            .await
            .unwrap();
        assert_eq!((items.to_vec(), listed), (vec![1], true));
        assert!(slot.kept.lock().unwrap().is_none());
        // A listing that began before the one kept, and ends after it,
        // does not replace it.
        let (items, _) = listings
            .get_or_list(&slot, || {
                let began = std::time::Instant::now();
                let changes = listings.changes();
                *slot.kept.lock().unwrap() = Some(Listing { began, changes, items: Arc::new(vec![9]) });
                async { Ok(vec![8]) }
            })
            .await
            .unwrap();
        assert_eq!(items.to_vec(), [8], "the caller gets what it listed");
        assert_eq!(slot.kept.lock().unwrap().as_ref().unwrap().items.to_vec(), [9], "the newer listing stays");
    }

    #[tokio::test]
    async fn workers_that_find_the_listing_stale_together_share_one_listing() {
        let listings = Arc::new(Listings::default());
        let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let (release, released) = tokio::sync::watch::channel(false);
        let lister = |listings: Arc<Listings>, calls: Arc<std::sync::atomic::AtomicU32>| {
            let mut released = released.clone();
            async move {
                let (items, listed) = listings
                    .get_or_list(&listings.containers, || async move {
                        let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                        // The runtime answers only once every caller waits.
                        let _ = released.wait_for(|r| *r).await;
                        Ok(vec![cri::Container { id: n.to_string(), ..Default::default() }])
                    })
                    .await
                    .unwrap();
                (items[0].id.clone(), listed)
            }
        };
        let callers: Vec<_> = (0..8).map(|_| tokio::spawn(lister(listings.clone(), calls.clone()))).collect();
        // Each caller runs until it waits: one on the runtime, the rest on it.
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
        release.send(true).unwrap();
        let mut answers = Vec::new();
        for caller in callers {
            answers.push(caller.await.unwrap());
        }
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1, "one listing for eight callers");
        assert!(answers.iter().all(|(id, _)| id == "1"), "{answers:?}");
        assert_eq!(answers.iter().filter(|(_, listed)| *listed).count(), 1, "only the lister prunes statuses");
        // A caller that changed something lists again, once, after the wait.
        listings.changed();
        let again = lister(listings.clone(), calls.clone()).await;
        assert_eq!((again.0.as_str(), calls.load(std::sync::atomic::Ordering::SeqCst)), ("2", 2));
    }

    #[test]
    fn endpoints_are_unix_urls_or_plain_paths() {
        assert_eq!(socket_path("unix:///run/c.sock").unwrap(), PathBuf::from("/run/c.sock"));
        assert_eq!(socket_path("/run/c.sock").unwrap(), PathBuf::from("/run/c.sock"));
        assert!(matches!(socket_path("tcp://1.2.3.4:5"), Err(RuntimeError::Unavailable(_))));
        assert!(matches!(socket_path("unix://"), Err(RuntimeError::Unavailable(_))));
    }

    #[test]
    fn status_codes_become_runtime_errors() {
        assert_eq!(
            status_to_error(&Status::not_found("no such container")),
            RuntimeError::NotFound("no such container".into())
        );
        assert_eq!(status_to_error(&Status::unavailable("down")), RuntimeError::Unavailable("down".into()));
        assert_eq!(status_to_error(&Status::deadline_exceeded("slow")), RuntimeError::DeadlineExceeded("slow".into()));
        assert_eq!(status_to_error(&Status::internal("boom")), RuntimeError::Failed("boom".into()));
    }

    #[test]
    fn a_failed_pull_is_an_image_pull_error_unless_the_runtime_is_unreachable() {
        assert_eq!(pull_error(RuntimeError::NotFound("x".into())), RuntimeError::ImagePull("x".into()));
        assert_eq!(pull_error(RuntimeError::Failed("401".into())), RuntimeError::ImagePull("401".into()));
        assert_eq!(pull_error(RuntimeError::Unavailable("down".into())), RuntimeError::Unavailable("down".into()));
    }

    #[tokio::test]
    async fn connecting_to_a_missing_socket_names_it_in_one_line() {
        let error = CriRuntime::connect("unix:///nonexistent/skiff-test.sock").await.unwrap_err();
        let text = error.to_string();
        assert!(matches!(error, RuntimeError::Unavailable(_)), "{text}");
        assert!(text.contains("unix:///nonexistent/skiff-test.sock"), "{text}");
        assert!(!text.contains('\n'), "{text}");
    }

    fn sandbox() -> SandboxSpec {
        SandboxSpec {
            name: "web".into(),
            namespace: "default".into(),
            uid: "u1".into(),
            attempt: 2,
            hostname: "web".into(),
            log_directory: "/logs/default_web_u1".into(),
            dns: DnsConfig { servers: vec!["10.96.0.10".into()], searches: vec!["svc".into()], options: vec![] },
            port_mappings: vec![PortMapping {
                protocol: "udp".into(),
                container_port: 53,
                host_port: 5353,
                host_ip: String::new(),
            }],
            labels: BTreeMap::from([("a".to_string(), "b".to_string())]),
            annotations: BTreeMap::new(),
            cgroup_parent: "/skiff/podu1".into(),
            ..SandboxSpec::default()
        }
    }

    #[test]
    fn a_sandbox_spec_becomes_a_pod_sandbox_config() {
        let config = sandbox_config(&sandbox());
        let metadata = config.metadata.unwrap();
        assert_eq!((metadata.name.as_str(), metadata.namespace.as_str(), metadata.attempt), ("web", "default", 2));
        assert_eq!(config.port_mappings[0].protocol, cri::Protocol::Udp as i32);
        assert_eq!(config.port_mappings[0].host_port, 5353);
        assert_eq!(config.dns_config.unwrap().servers, vec!["10.96.0.10"]);
        let linux = config.linux.unwrap();
        assert_eq!(linux.cgroup_parent, "/skiff/podu1");
        let namespaces = linux.security_context.unwrap().namespace_options.unwrap();
        assert_eq!(namespaces.network, cri::NamespaceMode::Pod as i32);

        let host = sandbox_config(&SandboxSpec { host_network: true, ..sandbox() });
        let namespaces = host.linux.unwrap().security_context.unwrap().namespace_options.unwrap();
        assert_eq!(namespaces.network, cri::NamespaceMode::Node as i32);
    }

    #[test]
    fn a_container_spec_carries_its_limits_env_and_log_path() {
        let spec = ContainerSpec {
            name: "app".into(),
            image: "skiff.local/busybox:1".into(),
            command: vec!["sh".into()],
            envs: vec![("A".into(), "1".into())],
            log_path: "app/0.log".into(),
            resources: ContainerResources {
                cpu_period: 100_000,
                cpu_quota: 50_000,
                cpu_shares: 512,
                memory_limit_in_bytes: 16 << 20,
            },
            ..Default::default()
        };
        let config = container_config(&spec, &sandbox());
        assert_eq!(config.image.unwrap().image, "skiff.local/busybox:1");
        assert_eq!(config.envs[0].value, b"1");
        assert_eq!(config.log_path, "app/0.log");
        let resources = config.linux.unwrap().resources.unwrap();
        assert_eq!(
            (resources.cpu_quota, resources.cpu_shares, resources.memory_limit_in_bytes),
            (50_000, 512, 16 << 20)
        );
    }

    #[test]
    fn a_containers_pid_namespace_is_its_own_the_pods_or_its_targets() {
        let pid = |spec: &ContainerSpec, sandbox: &SandboxSpec| {
            let config = container_config(spec, sandbox);
            let options = config.linux.unwrap().security_context.unwrap().namespace_options.unwrap();
            (options.pid, options.target_id)
        };
        let own = ContainerSpec::default();
        assert_eq!(pid(&own, &sandbox()), (cri::NamespaceMode::Container as i32, String::new()));
        let shared = SandboxSpec { share_process_namespace: true, ..sandbox() };
        assert_eq!(pid(&own, &shared), (cri::NamespaceMode::Pod as i32, String::new()));
        let sandbox_pid =
            |s: &SandboxSpec| sandbox_config(s).linux.unwrap().security_context.unwrap().namespace_options.unwrap().pid;
        assert_eq!(sandbox_pid(&shared), cri::NamespaceMode::Pod as i32, "the sandbox holds the pod's namespace");
        assert_eq!(sandbox_pid(&sandbox()), cri::NamespaceMode::Container as i32);
        let debugger = ContainerSpec { pid_target: Some("c-web".into()), ..Default::default() };
        for sandbox in [sandbox(), shared] {
            assert_eq!(pid(&debugger, &sandbox), (cri::NamespaceMode::Target as i32, "c-web".to_string()));
        }
    }

    #[test]
    fn host_namespaces_and_privilege_reach_the_sandbox_and_its_containers() {
        let host = SandboxSpec { host_pid: true, host_ipc: true, privileged: true, ..sandbox() };
        let context = sandbox_config(&host).linux.unwrap().security_context.unwrap();
        assert!(context.privileged);
        let namespaces = context.namespace_options.unwrap();
        assert_eq!(
            (namespaces.pid, namespaces.ipc),
            (cri::NamespaceMode::Node as i32, cri::NamespaceMode::Node as i32)
        );
        let container = container_config(&ContainerSpec::default(), &host);
        let namespaces = container.linux.unwrap().security_context.unwrap().namespace_options.unwrap();
        assert_eq!(
            (namespaces.pid, namespaces.ipc),
            (cri::NamespaceMode::Node as i32, cri::NamespaceMode::Node as i32)
        );
        let plain = sandbox_config(&sandbox()).linux.unwrap().security_context.unwrap();
        assert!(!plain.privileged);
        assert_eq!(plain.namespace_options.unwrap().ipc, cri::NamespaceMode::Pod as i32);
    }

    #[test]
    fn a_containers_security_spec_becomes_cris_security_context() {
        let spec = ContainerSpec {
            security: SecuritySpec {
                run_as_user: Some(1000),
                run_as_group: Some(3000),
                supplemental_groups: vec![2000],
                readonly_rootfs: true,
                no_new_privs: true,
                add_capabilities: vec!["NET_ADMIN".into()],
                drop_capabilities: vec!["ALL".into()],
                seccomp: Seccomp::RuntimeDefault,
                ..SecuritySpec::default()
            },
            ..Default::default()
        };
        let context = container_config(&spec, &sandbox()).linux.unwrap().security_context.unwrap();
        assert_eq!(context.run_as_user.map(|u| u.value), Some(1000));
        assert_eq!(context.run_as_group.map(|g| g.value), Some(3000));
        assert_eq!(context.supplemental_groups, vec![2000]);
        assert!(context.readonly_rootfs && context.no_new_privs && !context.privileged);
        let capabilities = context.capabilities.unwrap();
        assert_eq!(
            (capabilities.add_capabilities, capabilities.drop_capabilities),
            (vec!["NET_ADMIN".to_string()], vec!["ALL".to_string()])
        );
        let seccomp = context.seccomp.unwrap();
        assert_eq!(seccomp.profile_type, cri::security_profile::ProfileType::RuntimeDefault as i32);
        assert_eq!(context.seccomp_profile_path, "runtime/default");

        let unset = container_config(&ContainerSpec::default(), &sandbox()).linux.unwrap().security_context.unwrap();
        assert_eq!(unset.run_as_user, None, "no uid: the image's user");
        assert_eq!(unset.seccomp.unwrap().profile_type, cri::security_profile::ProfileType::Unconfined as i32);
        assert_eq!(unset.seccomp_profile_path, "unconfined");
        let local = ContainerSpec {
            security: SecuritySpec {
                seccomp: Seccomp::Localhost("/d/seccomp/a.json".into()),
                ..SecuritySpec::default()
            },
            ..Default::default()
        };
        let context = container_config(&local, &sandbox()).linux.unwrap().security_context.unwrap();
        assert_eq!(context.seccomp.unwrap().localhost_ref, "/d/seccomp/a.json");
        assert_eq!(context.seccomp_profile_path, "localhost//d/seccomp/a.json");
    }

    #[test]
    fn a_container_status_keeps_the_runtimes_reason() {
        let status = cri::ContainerStatus {
            id: "c1".into(),
            metadata: Some(cri::ContainerMetadata { name: "app".into(), attempt: 1 }),
            state: cri::ContainerState::ContainerExited as i32,
            exit_code: 137,
            reason: "OOMKilled".into(),
            ..Default::default()
        };
        let status = container_status(status, "s1".into());
        assert_eq!(status.state, ContainerState::Exited);
        assert_eq!((status.reason.as_str(), status.exit_code, status.sandbox_id.as_str()), ("OOMKilled", 137, "s1"));
    }
}
