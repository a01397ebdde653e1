//! One pod's worker: a task that loops observe → plan → execute → probe
//! → report, every `sync_period` and whenever the pod changes.
//!
//! Its life is an explicit [`State`] moved by [`step`]: `Syncing` while
//! the pod is wanted, `Terminating` with a grace period once it is deleted
//! or removed (the grace only ever shortens), `Terminated` once the
//! runtime holds nothing of it. What to do in one sync is decided by
//! [`plan`](super::plan::plan), a pure function of the pod, what the runtime shows and the
//! worker's memory (back-offs, probe results), as the kubelet's
//! `computePodActions`; the executor then does the I/O.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use skiff_client::runtime::reflector::ObjectKey;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::backoff::Backoff;
use super::plan::{is_terminal, plan, started, Memory, Plan, Start};
use super::probe::{self, ProbeKind, ProbeState};
use super::security;
use super::spec::{self, pod_identity, ContainerInputs};
use super::status::{pod_status, Observed, WorkerView};
use super::volumes::{self, Volumes};
use super::{Pending, Shared, WorkerOutput};
use crate::runtime::{
    ContainerSpec, ContainerState, ContainerStatus, ImageInfo, LabelFilter, RuntimeError, SandboxState, LABEL_POD_UID,
};

/// The kubelet's floor for the grace left after a preStop hook.
const MINIMUM_GRACE: Duration = Duration::from_secs(2);
/// How often a running pod's volumes are written again (the kubelet's
/// periodic pod sync is once a minute).
const VOLUME_REFRESH: Duration = Duration::from_secs(60);
/// A pod's grace period when its spec gives none.
const DEFAULT_GRACE_SECONDS: i64 = 30;

/// Where a pod's worker is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// The pod is wanted: keep it running as its spec says.
    Syncing,
    /// The pod is being torn down, with this much grace.
    Terminating {
        /// The grace period for its containers.
        grace: Duration,
    },
    /// Nothing of it is left; the worker ends.
    Terminated,
}

/// What moves a worker's state.
#[derive(Debug, Clone, Copy)]
pub enum Input<'a> {
    /// A version of the pod from a source.
    Desired(&'a Pod),
    /// The pod is gone from every source.
    Removed(&'a Pod),
    /// Teardown finished.
    TornDown,
}

/// The spec's grace period.
pub fn spec_grace(pod: &Pod) -> Duration {
    let seconds = pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds).unwrap_or(DEFAULT_GRACE_SECONDS);
    Duration::from_secs(seconds.max(0) as u64)
}

/// The grace of a deletion: the deletion's own, else the spec's.
fn deletion_grace(pod: &Pod) -> Duration {
    match pod.metadata.deletion_grace_period_seconds {
        Some(seconds) => Duration::from_secs(seconds.max(0) as u64),
        None => spec_grace(pod),
    }
}

/// The next state. Grace only shortens: a second deletion with a smaller
/// grace (e.g. a force delete) takes over, a larger one does not.
pub fn step(state: State, input: Input<'_>) -> State {
    match (state, input) {
        (State::Terminated, _) | (_, Input::TornDown) => State::Terminated,
        (State::Syncing, Input::Desired(pod)) if pod.metadata.deletion_timestamp.is_none() => State::Syncing,
        (State::Syncing, Input::Desired(pod)) | (State::Syncing, Input::Removed(pod)) => {
            State::Terminating { grace: deletion_grace(pod) }
        }
        (State::Terminating { grace }, Input::Desired(pod)) if pod.metadata.deletion_timestamp.is_none() => {
            State::Terminating { grace }
        }
        (State::Terminating { grace }, Input::Desired(pod)) | (State::Terminating { grace }, Input::Removed(pod)) => {
            State::Terminating { grace: grace.min(deletion_grace(pod)) }
        }
    }
}

/// One pod's worker.
pub(crate) struct Worker {
    shared: Arc<Shared>,
    key: ObjectKey,
    uid: String,
    pod: Arc<Pod>,
    state: State,
    slot: Arc<Mutex<Pending>>,
    wake: mpsc::Receiver<()>,
    backoff: Backoff,
    image_backoff: Backoff,
    /// Images whose back-off has been reported since their last pull.
    image_backoff_reported: HashSet<String>,
    probes: HashMap<(String, ProbeKind), ProbeState>,
    waiting: HashMap<String, (String, String)>,
    exit_seen: HashMap<String, Instant>,
    running_seen: HashMap<String, Instant>,
    start_failed: HashMap<String, Instant>,
    /// Exited containers whose BackOff event was sent.
    backoff_reported: HashSet<String>,
    /// FailedMount messages sent, so each is sent once.
    mount_errors_reported: HashSet<String>,
    last_status: Option<PodStatus>,
    start_time: Option<Time>,
    finished_stopped: bool,
    /// Earliest back-off end, to wake for it.
    next_backoff: Option<Instant>,
    /// Something changed in the last sync that the next should see soon.
    resync_now: bool,
    /// When the volumes were last written.
    volumes_made: Option<Instant>,
    /// The node refused the pod (its status says why): nothing more is
    /// done for it but its teardown.
    rejected: bool,
    /// A sandbox failed to be made: no new one before this, as the
    /// kubelet's pod worker waits out its back-off period after an error.
    sandbox_retry_at: Option<Instant>,
    /// When the worker took the pod on, while the pod has yet to run for
    /// the first time: its start is timed from then.
    starting_since: Option<Instant>,
}

fn lock_pending(m: &Mutex<Pending>) -> std::sync::MutexGuard<'_, Pending> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Worker {
    pub(crate) fn new(
        shared: Arc<Shared>,
        pod: Arc<Pod>,
        slot: Arc<Mutex<Pending>>,
        wake: mpsc::Receiver<()>,
    ) -> Worker {
        let (ns, name, uid) = pod_identity(&pod);
        let key = ObjectKey::new(ns, name);
        let uid = uid.to_string();
        let config = shared.config.clone();
        let start_time = pod.status.as_ref().and_then(|s| s.start_time.clone());
        // A pod already past Pending (an agent restarted under it) has
        // started before: its start is not this worker's to time.
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        let starting_since = matches!(phase, None | Some("Pending")).then(Instant::now);
        Worker {
            shared,
            key,
            uid,
            pod,
            state: State::Syncing,
            slot,
            wake,
            backoff: Backoff::new(config.backoff_initial, config.backoff_max),
            image_backoff: Backoff::new(config.backoff_initial, config.backoff_max),
            image_backoff_reported: HashSet::new(),
            probes: HashMap::new(),
            waiting: HashMap::new(),
            exit_seen: HashMap::new(),
            running_seen: HashMap::new(),
            start_failed: HashMap::new(),
            backoff_reported: HashSet::new(),
            mount_errors_reported: HashSet::new(),
            last_status: None,
            start_time,
            finished_stopped: false,
            next_backoff: None,
            resync_now: false,
            volumes_made: None,
            rejected: false,
            sandbox_retry_at: None,
            starting_since,
        }
    }

    /// The worker's loop; ends when the pod is torn down or at shutdown
    /// (leaving its containers for the next agent to adopt).
    pub(crate) async fn run(mut self) {
        let shutdown = self.shared.shutdown.clone();
        let mut torn_down = false;
        loop {
            self.take_pending();
            match self.state {
                State::Syncing => self.sync().await,
                State::Terminating { grace } => match self.terminate_unless_shortened(grace).await {
                    // A deletion with a shorter grace came: start again with it.
                    None => continue,
                    Some(Ok(())) => {
                        self.state = step(self.state, Input::TornDown);
                        self.send(WorkerOutput::Terminated { key: self.key.clone(), uid: self.uid.clone() }).await;
                        torn_down = true;
                        break;
                    }
                    Some(Err(e)) => {
                        tracing::warn!(pod = %self.key.name, error = %e, "tearing the pod down failed; will retry")
                    }
                },
                State::Terminated => break,
            }
            let deadline = self.next_wakeup();
            tokio::select! {
                _ = shutdown.cancelled() => break,
                woken = self.wake.recv() => if woken.is_none() {
                    tokio::time::sleep_until(deadline).await;
                },
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
        if torn_down {
            self.shared.resources.forget(&self.pod);
        }
        self.shared.finish(&self.uid, &self.key, torn_down);
    }

    /// Tears the pod down with `grace`, unless a version of the pod with
    /// a shorter deletion grace (a force delete) arrives meanwhile: then
    /// `None`, and the loop starts over with the shorter grace.
    async fn terminate_unless_shortened(&mut self, grace: Duration) -> Option<Result<(), RuntimeError>> {
        let slot = self.slot.clone();
        let (_, placeholder) = mpsc::channel(1);
        let mut wake = std::mem::replace(&mut self.wake, placeholder);
        let shortened = async {
            loop {
                if wake.recv().await.is_none() {
                    std::future::pending::<()>().await;
                }
                let newer =
                    lock_pending(&slot).pod.as_ref().map(|p| step(State::Terminating { grace }, Input::Desired(p)));
                if matches!(newer, Some(State::Terminating { grace: shorter }) if shorter < grace) {
                    return;
                }
            }
        };
        let outcome = tokio::select! {
            result = self.terminate(grace) => Some(result),
            () = shortened => None,
        };
        self.wake = wake;
        outcome
    }

    fn take_pending(&mut self) {
        let pending = std::mem::take(&mut *lock_pending(&self.slot));
        if let Some(pod) = pending.pod {
            self.pod = pod;
            self.state = step(self.state, Input::Desired(&self.pod));
        }
        if pending.removed {
            self.state = step(self.state, Input::Removed(&self.pod));
        }
    }

    fn next_wakeup(&mut self) -> Instant {
        let now = Instant::now();
        if std::mem::take(&mut self.resync_now) {
            return now;
        }
        let mut next = now + self.shared.config.sync_period;
        for p in self.probes.values() {
            if p.next_at > now && p.next_at < next {
                next = p.next_at;
            }
        }
        if let Some(b) = self.next_backoff.filter(|b| *b > now && *b < next) {
            next = b;
        }
        next
    }

    async fn send(&self, output: WorkerOutput) {
        // A closed channel means the agent is going away; at shutdown a
        // full one must not hold the worker.
        tokio::select! {
            _ = self.shared.out.send(output) => {}
            _ = self.shared.shutdown.cancelled() => {}
        }
    }

    async fn event(&self, type_: &str, reason: &str, message: String) {
        self.send(WorkerOutput::Event {
            key: self.key.clone(),
            uid: self.uid.clone(),
            type_: type_.to_string(),
            reason: reason.to_string(),
            message,
        })
        .await;
    }

    async fn observe(&self) -> Result<Observed, RuntimeError> {
        let filter = LabelFilter(BTreeMap::from([(LABEL_POD_UID.to_string(), self.uid.clone())]));
        let sandboxes = self.shared.runtime.list_sandboxes(&filter).await?;
        let containers = self.shared.runtime.list_containers(&filter).await?;
        Ok(Observed { sandboxes, containers })
    }

    fn note(&mut self, observed: &Observed, now: Instant) {
        for c in &observed.containers {
            match c.state {
                ContainerState::Exited => {
                    self.exit_seen.entry(c.id.clone()).or_insert(now);
                }
                ContainerState::Running => {
                    self.running_seen.entry(c.id.clone()).or_insert(now);
                }
                _ => {}
            }
        }
        let live: HashSet<&String> = observed.containers.iter().map(|c| &c.id).collect();
        self.exit_seen.retain(|id, _| live.contains(id));
        self.running_seen.retain(|id, _| live.contains(id));
        if self.start_time.is_none() {
            self.start_time = Some(match observed.sandboxes.iter().map(|s| s.created_at).filter(|t| *t > 0).min() {
                Some(nanos) => Time(chrono::TimeZone::timestamp_nanos(&chrono::Utc, nanos)),
                None => Time(chrono::Utc::now()),
            });
        }
        let ids = observed
            .containers
            .iter()
            .map(|c| c.name.clone())
            .collect::<HashSet<_>>()
            .into_iter()
            .filter_map(|name| observed.latest(&name).map(|c| (name, c.id.clone())))
            .collect();
        let ip = self.pod_ip(observed);
        self.shared.set_ids(&self.key, ids, ip);
    }

    fn containers(&self) -> Vec<Container> {
        let spec = self.pod.spec.clone().unwrap_or_default();
        let ephemeral = spec::ephemeral_containers(&self.pod);
        spec.init_containers.unwrap_or_default().into_iter().chain(spec.containers).chain(ephemeral).collect()
    }

    fn container(&self, name: &str) -> Option<Container> {
        self.containers().into_iter().find(|c| c.name == name)
    }

    fn pod_ip(&self, observed: &Observed) -> String {
        let host_network = self.pod.spec.as_ref().and_then(|s| s.host_network).unwrap_or(false);
        if host_network {
            return self.shared.config.host_ip.clone();
        }
        observed.sandbox().and_then(|s| s.ip.clone()).unwrap_or_default()
    }

    async fn sync(&mut self) {
        if self.rejected {
            return;
        }
        if !is_terminal(&self.pod) {
            let allowed = &self.shared.config.allowed_unsafe_sysctls;
            if let Some(why) = security::forbidden_sysctl(&self.pod, allowed) {
                return self.reject("SysctlForbidden", &why).await;
            }
        }
        let now = Instant::now();
        let observed = match self.observe().await {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(pod = %self.key.name, error = %e, "listing the pod's containers failed");
                return;
            }
        };
        self.note(&observed, now);
        let plan = plan(
            &self.pod,
            &observed,
            &Memory {
                backoff: &self.backoff,
                exit_seen: &self.exit_seen,
                start_failed: &self.start_failed,
                probes: &self.probes,
                now,
            },
        );
        let acted = self.execute(&plan, &observed).await;
        let observed = if acted {
            match self.observe().await {
                Ok(o) => o,
                Err(_) => observed,
            }
        } else {
            observed
        };
        self.note(&observed, Instant::now());
        if self.run_probes(&observed).await {
            self.resync_now = true;
        }
        self.gc(&observed).await;
        let initialized =
            plan.initialized || plan.create_sandbox.is_none() && plan.start.iter().any(|s| self.is_main(&s.name));
        self.publish(&observed, initialized).await;
    }

    /// Refuses the pod as the kubelet's admission does: the pod fails with
    /// `reason` and nothing of it is made.
    async fn reject(&mut self, reason: &str, why: &str) {
        let message = format!("Pod was rejected: {why}");
        self.event("Warning", reason, message.clone()).await;
        let status = PodStatus {
            phase: Some("Failed".to_string()),
            reason: Some(reason.to_string()),
            message: Some(message),
            ..PodStatus::default()
        };
        self.last_status = Some(status.clone());
        self.send(WorkerOutput::Status { key: self.key.clone(), uid: self.uid.clone(), status }).await;
        self.rejected = true;
    }

    fn is_main(&self, name: &str) -> bool {
        self.pod.spec.as_ref().is_some_and(|s| s.containers.iter().any(|c| c.name == name))
    }

    fn is_init(&self, name: &str) -> bool {
        let inits = self.pod.spec.as_ref().and_then(|s| s.init_containers.as_ref());
        inits.is_some_and(|inits| inits.iter().any(|c| c.name == name))
    }

    /// Does what `plan` says; returns whether anything changed.
    async fn execute(&mut self, plan: &Plan, observed: &Observed) -> bool {
        let mut acted = false;
        let grace = spec_grace(&self.pod);
        for kill in &plan.kill {
            let Some(status) = observed.containers.iter().find(|c| c.id == kill.id) else { continue };
            self.kill_container(status, kill.grace.unwrap_or(grace), kill.message.clone()).await;
            acted = true;
        }
        self.next_backoff = plan.back_off.iter().map(|b| b.3).min();
        for (name, id, delay, _) in &plan.back_off {
            if id.is_empty() {
                // A failed create or start waits with its own reason
                // (CreateContainerError, RunContainerError).
                continue;
            }
            let (_, pod_name, uid) = pod_identity(&self.pod);
            let ns = &self.key.namespace;
            self.waiting.insert(
                name.clone(),
                (
                    "CrashLoopBackOff".to_string(),
                    format!(
                        "back-off {}s restarting failed container={name} pod={pod_name}_{ns}({uid})",
                        delay.as_secs()
                    ),
                ),
            );
            if self.backoff_reported.insert(id.clone()) {
                self.event(
                    "Warning",
                    "BackOff",
                    format!("Back-off restarting failed container {name} in pod {pod_name}_{ns}({uid})"),
                )
                .await;
            }
        }
        if let Some(attempt) = plan.create_sandbox {
            if let Some(at) = self.sandbox_retry_at.filter(|at| *at > Instant::now()) {
                self.next_backoff = Some(self.next_backoff.map_or(at, |b| b.min(at)));
                return acted;
            }
            self.create_sandbox(observed, attempt).await;
            return true;
        }
        if !plan.start.is_empty() {
            if observed.sandbox().is_none() {
                return acted;
            }
            let pod_ip = self.pod_ip(observed);
            let volumes = self.make_volumes(&pod_ip).await;
            for start in &plan.start {
                acted = true;
                // Init containers run in order; an ephemeral container
                // that waits (for its --target) holds up nothing.
                let ok = self.start_container(start, observed, &pod_ip, &volumes).await;
                if !ok && self.is_init(&start.name) {
                    break;
                }
            }
        } else if self.volumes_made.is_some_and(|at| at.elapsed() >= VOLUME_REFRESH)
            && observed.sandbox().is_some_and(|s| s.state == SandboxState::Ready)
        {
            // Running containers see edited ConfigMaps and Secrets, and
            // fresh tokens, through their volumes' directories.
            let pod_ip = self.pod_ip(observed);
            self.make_volumes(&pod_ip).await;
        }
        if plan.finished && !self.finished_stopped {
            self.finished_stopped = true;
            if let Some(sandbox) = observed.sandbox().filter(|s| s.state == SandboxState::Ready) {
                if let Err(e) = self.shared.runtime.stop_sandbox(&sandbox.id).await {
                    tracing::warn!(pod = %self.key.name, error = %e, "stopping the finished pod's sandbox failed");
                    self.finished_stopped = false;
                }
                acted = true;
            }
        }
        acted
    }

    /// Fetches what the pod references, then writes its volumes; a volume
    /// that cannot be made is reported once as FailedMount.
    async fn make_volumes(&mut self, pod_ip: &str) -> Volumes {
        self.shared.resources.prepare(&self.pod).await;
        let (volumes, errors) =
            volumes::materialize(&self.shared.config, &self.pod, self.shared.resources.as_ref(), pod_ip);
        for e in &errors {
            if self.mount_errors_reported.insert(e.to_string()) {
                self.event("Warning", "FailedMount", e.to_string()).await;
            }
        }
        self.volumes_made = Some(Instant::now());
        volumes
    }

    async fn create_sandbox(&mut self, observed: &Observed, attempt: u32) {
        let runtime = self.shared.runtime.clone();
        for old in observed.sandboxes.iter().filter(|s| s.state == SandboxState::Ready) {
            let _ = runtime.stop_sandbox(&old.id).await;
        }
        if attempt > 0 {
            self.event(
                "Normal",
                "SandboxChanged",
                "Pod sandbox changed, it will be killed and re-created.".to_string(),
            )
            .await;
        }
        let spec = spec::sandbox_spec(&self.shared.config, &self.pod, attempt);
        if let Err(e) = std::fs::create_dir_all(&spec.log_directory) {
            tracing::warn!(pod = %self.key.name, error = %e, "creating the pod's log directory failed");
        }
        match runtime.run_sandbox(&spec).await {
            Ok(_) => {
                self.sandbox_retry_at = None;
                self.resync_now = true;
            }
            Err(e) => {
                self.sandbox_retry_at = Some(Instant::now() + self.shared.config.backoff_initial);
                self.event("Warning", "FailedCreatePodSandBox", format!("Failed to create pod sandbox: {e}")).await;
            }
        }
    }

    /// Pulls the image as the container's policy says; `Err` is the
    /// waiting reason and message. `Ok` carries the image's status when it
    /// was already present (the start needs its user), `None` after a pull.
    async fn ensure_image(&mut self, c: &Container) -> Result<Option<ImageInfo>, (String, String)> {
        let image = c.image.clone().unwrap_or_default();
        let runtime = self.shared.runtime.clone();
        let policy = c.image_pull_policy.clone().unwrap_or_else(|| {
            let tag = image.rsplit('/').next().and_then(|last| last.split_once(':')).map(|(_, t)| t);
            if image.contains('@') || tag.is_some_and(|t| t != "latest") { "IfNotPresent" } else { "Always" }
                .to_string()
        });
        let status = runtime.image_status(&image).await.ok().flatten();
        let present = status.is_some();
        match policy.as_str() {
            "Never" if present => return Ok(status),
            "Never" => {
                let message = format!("Container image \"{image}\" is not present with pull policy of Never");
                self.event("Warning", "ErrImageNeverPull", message.clone()).await;
                return Err(("ErrImageNeverPull".to_string(), message));
            }
            "IfNotPresent" if present => {
                self.event("Normal", "Pulled", format!("Container image \"{image}\" already present on machine")).await;
                return Ok(status);
            }
            _ => {}
        }
        let now = Instant::now();
        if let Some(until) = self.image_backoff.blocked_since_update(&image, now) {
            let message = format!("Back-off pulling image \"{image}\"");
            if self.image_backoff_reported.insert(image.clone()) {
                self.event("Normal", "BackOff", message.clone()).await;
            }
            self.next_backoff = Some(self.next_backoff.map_or(until, |b| b.min(until)));
            return Err(("ImagePullBackOff".to_string(), message));
        }
        self.image_backoff_reported.remove(&image);
        self.event("Normal", "Pulling", format!("Pulling image \"{image}\"")).await;
        match runtime.pull_image(&image).await {
            Ok(_) => {
                self.image_backoff.reset(&image);
                let took = Instant::now().duration_since(now);
                self.event("Normal", "Pulled", format!("Successfully pulled image \"{image}\" in {took:?}")).await;
                Ok(None)
            }
            Err(e) => {
                self.image_backoff.next(&image, now);
                self.event("Warning", "Failed", format!("Failed to pull image \"{image}\": {e}")).await;
                self.event("Warning", "Failed", "Error: ErrImagePull".to_string()).await;
                Err(("ErrImagePull".to_string(), e.to_string()))
            }
        }
    }

    /// Creates and starts one container (and runs its postStart hook);
    /// returns whether it runs.
    async fn start_container(&mut self, start: &Start, observed: &Observed, pod_ip: &str, volumes: &Volumes) -> bool {
        let Some(c) = self.container(&start.name) else { return false };
        let Some(sandbox_id) = observed.sandbox().map(|s| s.id.as_str()) else { return false };
        // A debug container joins its target's processes: it waits (and is
        // tried again on the next sync) until the target runs.
        let pid_target = match spec::pid_target(&self.pod, &c.name) {
            None => None,
            Some(target) => {
                let running = observed.latest_in(target, sandbox_id).filter(|t| t.state == ContainerState::Running);
                let Some(running) = running else {
                    let message = format!("target container \"{target}\" is not running");
                    self.waiting.insert(c.name.clone(), ("ContainerCreating".to_string(), message));
                    return false;
                };
                Some(running.id.clone())
            }
        };
        let runtime = self.shared.runtime.clone();
        let mounts = match volumes::mounts(&c, volumes) {
            Ok(m) => m,
            Err(spec::ConfigError::VolumeUnavailable(volume)) => {
                let message = format!("unmounted volume: {volume}");
                self.waiting.insert(c.name.clone(), ("ContainerCreating".to_string(), message));
                return false;
            }
            Err(e) => return self.config_error(&c.name, e).await,
        };
        let known_image = match self.ensure_image(&c).await {
            Ok(known) => known,
            Err(waiting) => {
                self.waiting.insert(c.name.clone(), waiting);
                return false;
            }
        };
        let inputs = ContainerInputs {
            config: &self.shared.config,
            resources: self.shared.resources.as_ref(),
            pod_ip,
            mounts,
            attempt: start.attempt,
        };
        let mut container_spec = match spec::container_spec(&self.pod, &c, inputs) {
            Ok(s) => ContainerSpec { pid_target, ..s },
            Err(e) => return self.config_error(&c.name, e).await,
        };
        // The image's user: known from the pull policy's check, else
        // asked for once the pull is done.
        let image = match known_image {
            Some(image) => Ok(Some(image)),
            None => runtime.image_status(&container_spec.image).await,
        };
        let image = match image {
            Ok(Some(image)) => image,
            failed => {
                let reason = failed.err().map_or_else(|| "the image is gone".to_string(), |e| e.to_string());
                let e = spec::ConfigError::ImageUser { image: container_spec.image.clone(), reason };
                return self.config_error(&c.name, e).await;
            }
        };
        if let Err(e) = security::verify_run_as_non_root(&self.pod, &c, &image) {
            return self.config_error(&c.name, e).await;
        }
        security::with_image_user(&mut container_spec.security, &image);
        let now = Instant::now();
        if let Some(since) = start.restart_since {
            self.backoff.next(&c.name, since);
        }
        let sandbox_spec = spec::sandbox_spec(&self.shared.config, &self.pod, 0);
        let log_dir = std::path::Path::new(&sandbox_spec.log_directory).join(&c.name);
        if let Err(e) = std::fs::create_dir_all(&log_dir) {
            tracing::warn!(pod = %self.key.name, error = %e, "creating the container's log directory failed");
        }
        let id = match runtime.create_container(sandbox_id, &container_spec, &sandbox_spec).await {
            Ok(id) => id,
            Err(e) => {
                self.event("Warning", "Failed", format!("Error: {e}")).await;
                self.waiting.insert(c.name.clone(), ("CreateContainerError".to_string(), e.to_string()));
                self.start_failed(&c.name, now);
                return false;
            }
        };
        self.event("Normal", "Created", format!("Created container {}", c.name)).await;
        if let Err(e) = runtime.start_container(&id).await {
            self.event("Warning", "Failed", format!("Error: {e}")).await;
            self.waiting.insert(c.name.clone(), ("RunContainerError".to_string(), e.to_string()));
            let _ = runtime.remove_container(&id).await;
            self.start_failed(&c.name, now);
            return false;
        }
        self.event("Normal", "Started", format!("Started container {}", c.name)).await;
        self.waiting.remove(&c.name);
        self.start_failed.remove(&c.name);
        self.running_seen.insert(id.clone(), Instant::now());
        if let Some(hook) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) {
            let outcome = match probe::hook_handler(hook, &c, pod_ip) {
                Ok(handler) => {
                    probe::run(runtime.as_ref(), &id, &handler, spec_grace(&self.pod).max(MINIMUM_GRACE)).await
                }
                Err(e) => Err(e),
            };
            if let Err(message) = outcome {
                self.event("Warning", "FailedPostStartHook", format!("PostStartHook failed: {message}")).await;
                if let Ok(status) = runtime.container_status(&id).await {
                    self.kill_container(&status, spec_grace(&self.pod), format!("FailedPostStartHook: {message}"))
                        .await;
                }
                return false;
            }
        }
        true
    }

    fn start_failed(&mut self, name: &str, now: Instant) {
        self.backoff.next(name, now);
        self.start_failed.insert(name.to_string(), now);
    }

    async fn config_error(&mut self, name: &str, e: spec::ConfigError) -> bool {
        self.event("Warning", "Failed", format!("Error: {e}")).await;
        self.waiting.insert(name.to_string(), ("CreateContainerConfigError".to_string(), e.to_string()));
        false
    }

    /// preStop, then SIGTERM with the grace left (at least 2 s), then
    /// SIGKILL from the runtime when it runs out.
    async fn kill_container(&self, status: &ContainerStatus, grace: Duration, message: String) {
        self.event("Normal", "Killing", message).await;
        let runtime = self.shared.runtime.clone();
        let begun = Instant::now();
        if status.state == ContainerState::Running {
            let hook = self.container(&status.name).and_then(|c| {
                let hook = c.lifecycle.as_ref().and_then(|l| l.pre_stop.clone())?;
                Some((c, hook))
            });
            if let Some((c, hook)) = hook {
                let pod_ip = self.observe_ip().await;
                let outcome = match probe::hook_handler(&hook, &c, &pod_ip) {
                    Ok(handler) => probe::run(runtime.as_ref(), &status.id, &handler, grace).await,
                    Err(e) => Err(e),
                };
                if let Err(e) = outcome {
                    self.event("Warning", "FailedPreStopHook", format!("PreStopHook failed: {e}")).await;
                }
            }
        }
        let remaining = grace.saturating_sub(Instant::now().duration_since(begun)).max(MINIMUM_GRACE);
        if let Err(e) = runtime.stop_container(&status.id, remaining).await {
            tracing::warn!(pod = %self.key.name, container = %status.name, error = %e, "stopping the container failed");
        }
    }

    async fn observe_ip(&self) -> String {
        match self.observe().await {
            Ok(o) => self.pod_ip(&o),
            Err(_) => String::new(),
        }
    }

    /// Runs the probes that are due, all at once; returns whether a result
    /// changed.
    async fn run_probes(&mut self, observed: &Observed) -> bool {
        let Some(sandbox) = observed.sandbox().filter(|s| s.state == SandboxState::Ready) else {
            self.probes.clear();
            return false;
        };
        let pod_ip = self.pod_ip(observed);
        let now = Instant::now();
        let mut due = Vec::new();
        for c in self.containers() {
            let running = observed.latest_in(&c.name, &sandbox.id).filter(|l| l.state == ContainerState::Running);
            let Some(running) = running else {
                self.probes.retain(|(name, _), _| *name != c.name);
                continue;
            };
            let began = self.running_seen.get(&running.id).copied().unwrap_or(now);
            let startup_passed = started(&c, &self.probes, &running.id);
            for (kind, probe) in [
                (ProbeKind::Startup, &c.startup_probe),
                (ProbeKind::Liveness, &c.liveness_probe),
                (ProbeKind::Readiness, &c.readiness_probe),
            ] {
                let Some(probe) = probe else { continue };
                let key = (c.name.clone(), kind);
                let state =
                    self.probes.entry(key.clone()).or_insert_with(|| ProbeState::new(kind, probe, &running.id, began));
                if state.container_id != running.id {
                    *state = ProbeState::new(kind, probe, &running.id, began);
                }
                // Startup runs until it passes; the others wait for it.
                let gated = match kind {
                    ProbeKind::Startup => startup_passed,
                    _ => !startup_passed,
                };
                if gated || !state.due(now) {
                    continue;
                }
                let handler = probe::probe_handler(probe, &c, &pod_ip);
                due.push((key, running.id.clone(), handler, state.timeout));
            }
        }
        if due.is_empty() {
            return false;
        }
        let runtime = self.shared.runtime.clone();
        let results = futures::future::join_all(due.iter().map(|(_, id, handler, timeout)| {
            let runtime = runtime.clone();
            async move {
                match handler {
                    Ok(h) => probe::run(runtime.as_ref(), id, h, *timeout).await,
                    Err(e) => Err(e.clone()),
                }
            }
        }))
        .await;
        let now = Instant::now();
        let mut changed = false;
        for ((key, _, _, _), result) in due.into_iter().zip(results) {
            if let Err(message) = &result {
                self.event("Warning", "Unhealthy", format!("{} probe failed: {message}", key.1.name())).await;
            }
            if let Some(state) = self.probes.get_mut(&key) {
                changed |= state.record(result.is_ok(), now);
            }
        }
        changed
    }

    /// Removes exited containers older than each name's newest two (the
    /// newest is the status, the one before it the last state), and
    /// dead sandboxes none of those live in.
    async fn gc(&self, observed: &Observed) {
        let runtime = self.shared.runtime.clone();
        let mut keep: HashSet<&str> = HashSet::new();
        let names: HashSet<&str> = observed.containers.iter().map(|c| c.name.as_str()).collect();
        for name in names {
            keep.extend(observed.latest(name).map(|c| c.id.as_str()));
            keep.extend(observed.previous(name).map(|c| c.id.as_str()));
        }
        for c in &observed.containers {
            if !keep.contains(c.id.as_str()) && c.state == ContainerState::Exited {
                let _ = runtime.remove_container(&c.id).await;
            }
        }
        let current = observed.sandbox().map(|s| s.id.clone());
        for s in &observed.sandboxes {
            let used = observed.containers.iter().any(|c| c.sandbox_id == s.id && keep.contains(c.id.as_str()));
            if Some(&s.id) != current.as_ref() && s.state == SandboxState::NotReady && !used {
                let _ = runtime.remove_sandbox(&s.id).await;
            }
        }
    }

    fn view_sets(&self, observed: &Observed) -> (HashSet<String>, HashSet<String>) {
        let mut ready = HashSet::new();
        let mut started_ids = HashSet::new();
        for c in self.containers() {
            let Some(latest) = observed.latest(&c.name).filter(|l| l.state == ContainerState::Running) else {
                continue;
            };
            let is_started = started(&c, &self.probes, &latest.id);
            if is_started {
                started_ids.insert(latest.id.clone());
            }
            let readiness_passed = match &c.readiness_probe {
                None => true,
                Some(_) => self
                    .probes
                    .get(&(c.name.clone(), ProbeKind::Readiness))
                    .is_some_and(|p| p.container_id == latest.id && p.passed()),
            };
            if is_started && readiness_passed {
                ready.insert(latest.id.clone());
            }
        }
        (ready, started_ids)
    }

    async fn publish(&mut self, observed: &Observed, initialized: bool) {
        let (ready, started_ids) = self.view_sets(observed);
        let view = WorkerView {
            waiting: Some(&self.waiting),
            ready: Some(&ready),
            started: Some(&started_ids),
            initialized,
            host_ip: &self.shared.config.host_ip,
            start_time: self.start_time.clone(),
        };
        let status = pod_status(&self.pod, observed, &view, self.last_status.as_ref());
        let regressed = is_terminal(&self.pod) && !matches!(status.phase.as_deref(), Some("Succeeded" | "Failed"));
        if regressed {
            return;
        }
        if status.phase.as_deref() == Some("Running") {
            if let Some(since) = self.starting_since.take() {
                crate::metrics::metrics().pod_start_seconds.observe(since.elapsed().as_secs_f64());
            }
        }
        if self.last_status.as_ref() != Some(&status) {
            self.last_status = Some(status.clone());
            self.send(WorkerOutput::Status { key: self.key.clone(), uid: self.uid.clone(), status }).await;
        }
    }

    /// Stops every container (main ones together, then init and sidecar
    /// containers in reverse order) with what is left of `grace`, then the
    /// sandbox; reports the final status; removes everything.
    async fn terminate(&mut self, grace: Duration) -> Result<(), RuntimeError> {
        let begun = Instant::now();
        let observed = self.observe().await?;
        self.note(&observed, begun);
        let runtime = self.shared.runtime.clone();
        let running = |name: &str| {
            observed.containers.iter().find(|c| c.name == name && c.state == ContainerState::Running).cloned()
        };
        let spec = self.pod.spec.clone().unwrap_or_default();
        let main: Vec<ContainerStatus> = spec.containers.iter().filter_map(|c| running(&c.name)).collect();
        let this = &*self;
        futures::future::join_all(
            main.iter().map(|c| this.kill_container(c, grace, format!("Stopping container {}", c.name))),
        )
        .await;
        for c in spec.init_containers.iter().flatten().rev() {
            if let Some(status) = running(&c.name) {
                let left = grace.saturating_sub(Instant::now().duration_since(begun));
                self.kill_container(&status, left, format!("Stopping container {}", c.name)).await;
            }
        }
        for s in &observed.sandboxes {
            runtime.stop_sandbox(&s.id).await?;
        }
        let last = self.observe().await?;
        self.probes.clear();
        self.waiting.clear();
        let initialized = self
            .last_status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Initialized" && c.status == "True"));
        self.publish(&last, initialized).await;
        for c in &last.containers {
            runtime.remove_container(&c.id).await?;
        }
        for s in &last.sandboxes {
            runtime.remove_sandbox(&s.id).await?;
        }
        if let Err(e) = volumes::cleanup(&self.shared.config, &self.pod) {
            tracing::warn!(pod = %self.key.name, error = %e, "removing the pod's directory failed");
        }
        let log_dir = spec::pod_log_directory(&self.shared.config, &self.pod);
        if let Err(e) = std::fs::remove_dir_all(&log_dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(pod = %self.key.name, error = %e, "removing the pod's logs failed");
            }
        }
        Ok(())
    }
}
