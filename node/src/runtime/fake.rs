//! An in-memory [`Runtime`] for tests with paused time: sandboxes and
//! containers are records, IPs come from a counter, images from a set, and
//! timestamps from `tokio::time`, so a paused clock drives them.
//!
//! Tests steer it: make a container exit (`exit_container`), make one exit
//! as soon as it starts (`exit_on_start`), make the next call of a method
//! fail (`fail_next`), give `exec_sync` results per command, make a
//! container ignore SIGTERM so a stop takes the whole timeout, and read the
//! calls made, in order (`calls`), to check e.g. that preStop ran before
//! the stop.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::{
    ContainerSpec, ContainerState, ContainerStats, ContainerStatus, ExecResult, ImageInfo, LabelFilter, Runtime,
    RuntimeError, RuntimeVersion, SandboxSpec, SandboxState, SandboxStatus, LABEL_POD_NAME,
};

/// One call the fake runtime received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The trait method, e.g. "stop_container".
    pub method: &'static str,
    /// What it was about: the container's name for container calls, the
    /// pod's name for sandbox calls, the image for image calls.
    pub target: String,
    /// Extra detail: the exec'd command, the stop timeout in seconds.
    pub detail: String,
    /// When, on tokio's clock.
    pub at: Instant,
}

/// How a container ends when the fake stops or kills it.
#[derive(Debug, Clone)]
struct Exit {
    code: i32,
    reason: String,
}

#[derive(Debug)]
struct FakeSandbox {
    status: SandboxStatus,
}

#[derive(Debug)]
struct FakeContainer {
    status: ContainerStatus,
}

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    next_ip: u32,
    fixed_ip: Option<String>,
    sandboxes: BTreeMap<String, FakeSandbox>,
    containers: BTreeMap<String, FakeContainer>,
    images: BTreeMap<String, ImageInfo>,
    pullable: BTreeSet<String>,
    failures: HashMap<&'static str, VecDeque<RuntimeError>>,
    exec_results: HashMap<Vec<String>, ExecResult>,
    exec_delays: HashMap<Vec<String>, Duration>,
    exit_on_start: HashMap<String, Exit>,
    ignore_sigterm: BTreeSet<String>,
    calls: Vec<Call>,
}

/// The in-memory runtime. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct FakeRuntime {
    state: Mutex<State>,
    /// Wall-clock nanoseconds at `start`, so timestamps look real while
    /// moving with tokio's (possibly paused) clock.
    base_nanos: i64,
    start: Instant,
}

impl Default for FakeRuntime {
    fn default() -> Self {
        FakeRuntime::new()
    }
}

impl FakeRuntime {
    /// An empty runtime holding no images.
    pub fn new() -> FakeRuntime {
        let base_nanos = chrono::Utc::now().timestamp_nanos_opt().unwrap_or(0);
        FakeRuntime { state: Mutex::new(State::default()), base_nanos, start: Instant::now() }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic in another test thread poisons nothing we cannot read.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Nanoseconds since the epoch on the fake's clock.
    pub fn now_nanos(&self) -> i64 {
        self.base_nanos + Instant::now().duration_since(self.start).as_nanos() as i64
    }

    /// Makes `image` present locally.
    pub fn add_image(&self, image: &str) {
        let mut state = self.lock();
        let info = image_info(image);
        state.images.insert(image.to_string(), info);
    }

    /// Lets `pull_image(image)` succeed (a registry that has it).
    pub fn allow_pull(&self, image: &str) {
        self.lock().pullable.insert(image.to_string());
    }

    /// Forgets `image` locally (it stays pullable if it was).
    pub fn remove_image(&self, image: &str) {
        self.lock().images.remove(image);
    }

    /// Gives every sandbox made from now on this IP (e.g. 127.0.0.1 so
    /// tcp and http probes reach a listener in the test).
    pub fn set_pod_ip(&self, ip: &str) {
        self.lock().fixed_ip = Some(ip.to_string());
    }

    /// Makes the next call of `method` (the trait method's name) fail
    /// with `error`; several calls queue several failures.
    pub fn fail_next(&self, method: &'static str, error: RuntimeError) {
        self.lock().failures.entry(method).or_default().push_back(error);
    }

    /// What `exec_sync` returns for `cmd` in any container (default: exit
    /// code 0, no output).
    pub fn set_exec_result(&self, cmd: &[&str], result: ExecResult) {
        let cmd = cmd.iter().map(|s| s.to_string()).collect();
        self.lock().exec_results.insert(cmd, result);
    }

    /// `exec_sync` of `cmd` takes `delay` (past its timeout it fails with
    /// `DeadlineExceeded`).
    pub fn set_exec_delay(&self, cmd: &[&str], delay: Duration) {
        let cmd = cmd.iter().map(|s| s.to_string()).collect();
        self.lock().exec_delays.insert(cmd, delay);
    }

    /// Containers named `container` exit with `code` and `reason` as soon
    /// as they start (`None`: they run until stopped).
    pub fn exit_on_start(&self, container: &str, exit: Option<(i32, &str)>) {
        let mut state = self.lock();
        match exit {
            Some((code, reason)) => {
                state.exit_on_start.insert(container.to_string(), Exit { code, reason: reason.to_string() });
            }
            None => {
                state.exit_on_start.remove(container);
            }
        }
    }

    /// Containers named `container` ignore SIGTERM: a stop waits its whole
    /// timeout, then kills them (exit code 137).
    pub fn ignore_sigterm(&self, container: &str) {
        self.lock().ignore_sigterm.insert(container.to_string());
    }

    /// Makes the running container `container` of pod `pod` exit with
    /// `code` and `reason` (e.g. "OOMKilled"); false if none runs.
    pub fn exit_container(&self, pod: &str, container: &str, code: i32, reason: &str) -> bool {
        let now = self.now_nanos();
        let mut state = self.lock();
        let found = state.containers.values_mut().find(|c| {
            c.status.state == ContainerState::Running
                && c.status.name == container
                && c.status.labels.get(LABEL_POD_NAME).map(String::as_str) == Some(pod)
        });
        match found {
            Some(c) => {
                finish(&mut c.status, now, &Exit { code, reason: reason.to_string() });
                true
            }
            None => false,
        }
    }

    /// Makes the sandbox of pod `pod` die (NotReady) with its containers.
    pub fn kill_sandbox(&self, pod: &str) -> bool {
        let now = self.now_nanos();
        let mut state = self.lock();
        let ids: Vec<String> = state
            .sandboxes
            .values()
            .filter(|s| s.status.labels.get(LABEL_POD_NAME).map(String::as_str) == Some(pod))
            .filter(|s| s.status.state == SandboxState::Ready)
            .map(|s| s.status.id.clone())
            .collect();
        for id in &ids {
            stop_sandbox_locked(&mut state, id, now);
        }
        !ids.is_empty()
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.lock().calls.clone()
    }

    /// The calls so far as "method target" strings, for short assertions.
    pub fn call_names(&self) -> Vec<String> {
        self.lock().calls.iter().map(|c| format!("{} {}", c.method, c.target)).collect()
    }

    /// Every container, in id order.
    pub fn containers(&self) -> Vec<ContainerStatus> {
        self.lock().containers.values().map(|c| c.status.clone()).collect()
    }

    /// Every sandbox, in id order.
    pub fn sandboxes(&self) -> Vec<SandboxStatus> {
        self.lock().sandboxes.values().map(|s| s.status.clone()).collect()
    }

    /// Records a call and returns the failure queued for it, if any.
    fn enter(&self, method: &'static str, target: &str, detail: String) -> Result<(), RuntimeError> {
        let mut state = self.lock();
        state.calls.push(Call { method, target: target.to_string(), detail, at: Instant::now() });
        match state.failures.get_mut(method).and_then(VecDeque::pop_front) {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    fn container_name(&self, id: &str) -> String {
        self.lock().containers.get(id).map(|c| c.status.name.clone()).unwrap_or_else(|| id.to_string())
    }

    fn sandbox_name(&self, id: &str) -> String {
        self.lock()
            .sandboxes
            .get(id)
            .and_then(|s| s.status.labels.get(LABEL_POD_NAME).cloned())
            .unwrap_or_else(|| id.to_string())
    }
}

fn image_info(image: &str) -> ImageInfo {
    let digest: u64 = image.bytes().fold(1469598103934665603u64, |h, b| (h ^ b as u64).wrapping_mul(1099511628211));
    // Every fake image names no user: it runs as root.
    ImageInfo {
        id: format!("sha256:{digest:016x}"),
        repo_tags: vec![image.to_string()],
        size: 1 << 20,
        uid: None,
        username: String::new(),
    }
}

fn finish(status: &mut ContainerStatus, now: i64, exit: &Exit) {
    status.state = ContainerState::Exited;
    status.finished_at = now;
    status.exit_code = exit.code;
    status.reason = exit.reason.clone();
}

fn stop_sandbox_locked(state: &mut State, id: &str, now: i64) {
    if let Some(sandbox) = state.sandboxes.get_mut(id) {
        sandbox.status.state = SandboxState::NotReady;
    }
    for c in state.containers.values_mut() {
        if c.status.sandbox_id == id && c.status.state == ContainerState::Running {
            finish(&mut c.status, now, &Exit { code: 137, reason: "Error".to_string() });
        }
    }
}

#[async_trait]
impl Runtime for FakeRuntime {
    async fn version(&self) -> Result<RuntimeVersion, RuntimeError> {
        self.enter("version", "", String::new())?;
        Ok(RuntimeVersion {
            runtime_name: "fake".to_string(),
            runtime_version: "0.1.0".to_string(),
            runtime_api_version: "v1".to_string(),
        })
    }

    async fn run_sandbox(&self, spec: &SandboxSpec) -> Result<String, RuntimeError> {
        self.enter("run_sandbox", &spec.name, format!("attempt={}", spec.attempt))?;
        let now = self.now_nanos();
        let mut state = self.lock();
        state.next_id += 1;
        let id = format!("sb{:04}", state.next_id);
        let ip = if spec.host_network {
            None
        } else if let Some(ip) = &state.fixed_ip {
            Some(ip.clone())
        } else {
            state.next_ip += 1;
            Some(format!("10.88.{}.{}", state.next_ip / 250, state.next_ip % 250 + 2))
        };
        let status = SandboxStatus {
            id: id.clone(),
            state: SandboxState::Ready,
            ip,
            created_at: now,
            attempt: spec.attempt,
            labels: spec.labels.clone(),
        };
        state.sandboxes.insert(id.clone(), FakeSandbox { status });
        Ok(id)
    }

    async fn stop_sandbox(&self, id: &str) -> Result<(), RuntimeError> {
        let name = self.sandbox_name(id);
        self.enter("stop_sandbox", &name, id.to_string())?;
        let now = self.now_nanos();
        stop_sandbox_locked(&mut self.lock(), id, now);
        Ok(())
    }

    async fn remove_sandbox(&self, id: &str) -> Result<(), RuntimeError> {
        let name = self.sandbox_name(id);
        self.enter("remove_sandbox", &name, id.to_string())?;
        let now = self.now_nanos();
        let mut state = self.lock();
        stop_sandbox_locked(&mut state, id, now);
        state.sandboxes.remove(id);
        state.containers.retain(|_, c| c.status.sandbox_id != id);
        Ok(())
    }

    async fn sandbox_status(&self, id: &str) -> Result<SandboxStatus, RuntimeError> {
        self.enter("sandbox_status", id, String::new())?;
        self.lock()
            .sandboxes
            .get(id)
            .map(|s| s.status.clone())
            .ok_or_else(|| RuntimeError::NotFound(format!("sandbox {id}")))
    }

    async fn list_sandboxes(&self, filter: &LabelFilter) -> Result<Vec<SandboxStatus>, RuntimeError> {
        self.enter("list_sandboxes", "", String::new())?;
        Ok(self
            .lock()
            .sandboxes
            .values()
            .filter(|s| filter.matches(&s.status.labels))
            .map(|s| s.status.clone())
            .collect())
    }

    async fn create_container(
        &self,
        sandbox_id: &str,
        spec: &ContainerSpec,
        sandbox: &SandboxSpec,
    ) -> Result<String, RuntimeError> {
        let mut detail = format!("attempt={}", spec.attempt);
        if let Some(target) = &spec.pid_target {
            detail.push_str(&format!(" pid_target={target}"));
        }
        self.enter("create_container", &spec.name, detail)?;
        let now = self.now_nanos();
        let mut state = self.lock();
        match state.sandboxes.get(sandbox_id) {
            Some(s) if s.status.state == SandboxState::Ready => {}
            _ => return Err(RuntimeError::NotFound(format!("sandbox {sandbox_id} is not ready"))),
        }
        let image_ref = match state.images.get(&spec.image) {
            Some(info) => info.id.clone(),
            None => return Err(RuntimeError::NotFound(format!("image {}", spec.image))),
        };
        state.next_id += 1;
        let id = format!("c{:04}", state.next_id);
        let status = ContainerStatus {
            id: id.clone(),
            sandbox_id: sandbox_id.to_string(),
            name: spec.name.clone(),
            attempt: spec.attempt,
            state: ContainerState::Created,
            created_at: now,
            started_at: 0,
            finished_at: 0,
            exit_code: 0,
            reason: String::new(),
            message: String::new(),
            image: spec.image.clone(),
            image_ref,
            labels: spec.labels.clone(),
            annotations: spec.annotations.clone(),
            log_path: format!("{}/{}", sandbox.log_directory, spec.log_path),
        };
        state.containers.insert(id.clone(), FakeContainer { status });
        Ok(id)
    }

    async fn start_container(&self, id: &str) -> Result<(), RuntimeError> {
        let name = self.container_name(id);
        self.enter("start_container", &name, id.to_string())?;
        let now = self.now_nanos();
        let mut state = self.lock();
        let exit = state.exit_on_start.get(&name).cloned();
        let c = state.containers.get_mut(id).ok_or_else(|| RuntimeError::NotFound(format!("container {id}")))?;
        if c.status.state != ContainerState::Created {
            return Err(RuntimeError::Failed(format!("container {id} is not in created state")));
        }
        c.status.state = ContainerState::Running;
        c.status.started_at = now;
        if let Some(exit) = exit {
            finish(&mut c.status, now, &exit);
        }
        Ok(())
    }

    async fn stop_container(&self, id: &str, timeout: Duration) -> Result<(), RuntimeError> {
        let name = self.container_name(id);
        self.enter("stop_container", &name, format!("timeout={}", timeout.as_secs()))?;
        let (running, stubborn) = {
            let state = self.lock();
            match state.containers.get(id) {
                Some(c) => (c.status.state == ContainerState::Running, state.ignore_sigterm.contains(&name)),
                None => return Ok(()),
            }
        };
        if !running {
            return Ok(());
        }
        let exit = if stubborn {
            tokio::time::sleep(timeout).await;
            Exit { code: 137, reason: "Error".to_string() }
        } else {
            Exit { code: 143, reason: "Error".to_string() }
        };
        let now = self.now_nanos();
        if let Some(c) = self.lock().containers.get_mut(id) {
            if c.status.state == ContainerState::Running {
                finish(&mut c.status, now, &exit);
            }
        }
        Ok(())
    }

    async fn remove_container(&self, id: &str) -> Result<(), RuntimeError> {
        let name = self.container_name(id);
        self.enter("remove_container", &name, id.to_string())?;
        self.lock().containers.remove(id);
        Ok(())
    }

    async fn container_status(&self, id: &str) -> Result<ContainerStatus, RuntimeError> {
        self.enter("container_status", id, String::new())?;
        self.lock()
            .containers
            .get(id)
            .map(|c| c.status.clone())
            .ok_or_else(|| RuntimeError::NotFound(format!("container {id}")))
    }

    async fn list_containers(&self, filter: &LabelFilter) -> Result<Vec<ContainerStatus>, RuntimeError> {
        self.enter("list_containers", "", String::new())?;
        Ok(self
            .lock()
            .containers
            .values()
            .filter(|c| filter.matches(&c.status.labels))
            .map(|c| c.status.clone())
            .collect())
    }

    async fn exec_sync(&self, id: &str, cmd: &[String], timeout: Duration) -> Result<ExecResult, RuntimeError> {
        let name = self.container_name(id);
        self.enter("exec_sync", &name, cmd.join(" "))?;
        let delay = self.lock().exec_delays.get(cmd).copied();
        if let Some(delay) = delay {
            tokio::time::sleep(delay.min(timeout)).await;
            if delay > timeout {
                return Err(RuntimeError::DeadlineExceeded(format!("exec {cmd:?}")));
            }
        }
        let state = self.lock();
        match state.containers.get(id) {
            Some(c) if c.status.state == ContainerState::Running => {}
            _ => return Err(RuntimeError::Failed(format!("container {id} is not running"))),
        }
        Ok(state.exec_results.get(cmd).cloned().unwrap_or_default())
    }

    async fn list_container_stats(&self, filter: &LabelFilter) -> Result<Vec<ContainerStats>, RuntimeError> {
        self.enter("list_container_stats", "", String::new())?;
        let now = self.now_nanos();
        Ok(self
            .lock()
            .containers
            .values()
            .filter(|c| c.status.state == ContainerState::Running && filter.matches(&c.status.labels))
            .map(|c| ContainerStats {
                id: c.status.id.clone(),
                labels: c.status.labels.clone(),
                timestamp: now,
                cpu_usage_core_nanoseconds: (now - c.status.started_at).max(0) as u64 / 100,
                memory_working_set_bytes: 4 << 20,
            })
            .collect())
    }

    async fn image_status(&self, image: &str) -> Result<Option<ImageInfo>, RuntimeError> {
        self.enter("image_status", image, String::new())?;
        Ok(self.lock().images.get(image).cloned())
    }

    async fn pull_image(&self, image: &str) -> Result<String, RuntimeError> {
        self.enter("pull_image", image, String::new())?;
        let mut state = self.lock();
        if !state.pullable.contains(image) && !state.images.contains_key(image) {
            return Err(RuntimeError::ImagePull(format!("{image}: not found")));
        }
        let info = image_info(image);
        let id = info.id.clone();
        state.images.insert(image.to_string(), info);
        Ok(id)
    }

    async fn list_images(&self) -> Result<Vec<ImageInfo>, RuntimeError> {
        self.enter("list_images", "", String::new())?;
        Ok(self.lock().images.values().cloned().collect())
    }
}
