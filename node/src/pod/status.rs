//! A pod's status, computed from what the runtime reports, as the kubelet
//! computes it: each container's state (waiting / running / terminated)
//! and last state, restart count, ready and started; the phase from those;
//! the conditions (PodReadyToStartContainers, Initialized,
//! ContainersReady, Ready) with transition times kept while unchanged;
//! pod and host IPs, start time and QoS class.

use std::collections::{HashMap, HashSet};

use chrono::{TimeZone, Utc};
use k8s_openapi::api::core::v1::{
    Container, ContainerState as KubeState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus as KubeStatus, HostIP, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::spec::qos_class;
use crate::runtime::{ContainerState, ContainerStatus, SandboxState, SandboxStatus};

/// What the runtime holds for one pod: every sandbox and container
/// labelled with its uid.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// Its sandboxes, any state.
    pub sandboxes: Vec<SandboxStatus>,
    /// Its containers, any sandbox, any state.
    pub containers: Vec<ContainerStatus>,
}

impl Observed {
    /// The newest sandbox.
    pub fn sandbox(&self) -> Option<&SandboxStatus> {
        self.sandboxes.iter().max_by_key(|s| (s.attempt, s.created_at))
    }

    /// The containers named `name`, newest first.
    fn named(&self, name: &str) -> Vec<&ContainerStatus> {
        let mut all: Vec<_> = self.containers.iter().filter(|c| c.name == name).collect();
        all.sort_by_key(|c| std::cmp::Reverse((c.attempt, c.created_at)));
        all
    }

    /// The newest container named `name`, in any sandbox.
    pub fn latest(&self, name: &str) -> Option<&ContainerStatus> {
        self.named(name).first().copied()
    }

    /// The one before the newest.
    pub fn previous(&self, name: &str) -> Option<&ContainerStatus> {
        self.named(name).get(1).copied()
    }

    /// The newest container named `name` in sandbox `sandbox_id`.
    pub fn latest_in(&self, name: &str, sandbox_id: &str) -> Option<&ContainerStatus> {
        self.named(name).into_iter().find(|c| c.sandbox_id == sandbox_id)
    }
}

/// What the worker knows beyond the runtime.
#[derive(Debug, Default)]
pub struct WorkerView<'a> {
    /// Why a container waits, by name: (reason, message).
    pub waiting: Option<&'a HashMap<String, (String, String)>>,
    /// Ids of containers whose readiness passed.
    pub ready: Option<&'a HashSet<String>>,
    /// Ids of running containers whose startup passed (or that have none).
    pub started: Option<&'a HashSet<String>>,
    /// Whether the init containers are done in the current sandbox.
    pub initialized: bool,
    /// The host's IP.
    pub host_ip: &'a str,
    /// When the agent first took the pod.
    pub start_time: Option<Time>,
}

fn time(nanos: i64) -> Option<Time> {
    (nanos > 0).then(|| Time(Utc.timestamp_nanos(nanos)))
}

/// The `containerd://<id>` form of a container id.
pub fn container_id_uri(id: &str) -> String {
    format!("containerd://{id}")
}

fn terminated(c: &ContainerStatus) -> KubeState {
    let reason = if !c.reason.is_empty() {
        c.reason.clone()
    } else if c.exit_code == 0 {
        "Completed".to_string()
    } else {
        "Error".to_string()
    };
    KubeState {
        terminated: Some(ContainerStateTerminated {
            exit_code: c.exit_code,
            reason: Some(reason),
            message: Some(c.message.clone()).filter(|m| !m.is_empty()),
            started_at: time(c.started_at),
            finished_at: time(c.finished_at),
            container_id: Some(container_id_uri(&c.id)),
            signal: None,
        }),
        ..KubeState::default()
    }
}

fn waiting(reason: &str, message: &str) -> KubeState {
    KubeState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.to_string()),
            message: Some(message.to_string()).filter(|m| !m.is_empty()),
        }),
        ..KubeState::default()
    }
}

fn container_status(c: &Container, observed: &Observed, view: &WorkerView<'_>, default_wait: &str) -> KubeStatus {
    let latest = observed.latest(&c.name);
    let previous = observed.previous(&c.name);
    let wait = view.waiting.and_then(|w| w.get(&c.name));
    let mut status =
        KubeStatus { name: c.name.clone(), image: c.image.clone().unwrap_or_default(), ..KubeStatus::default() };
    match latest {
        None => {
            let (reason, message) = wait.cloned().unwrap_or_else(|| (default_wait.to_string(), String::new()));
            status.state = Some(waiting(&reason, &message));
            status.started = Some(false);
        }
        Some(latest) => {
            status.image_id = latest.image_ref.clone();
            status.container_id = Some(container_id_uri(&latest.id));
            status.restart_count = latest.attempt as i32;
            status.last_state = previous.map(terminated);
            match latest.state {
                ContainerState::Running => {
                    status.state = Some(KubeState {
                        running: Some(ContainerStateRunning { started_at: time(latest.started_at) }),
                        ..KubeState::default()
                    });
                    status.ready = view.ready.is_some_and(|r| r.contains(&latest.id));
                    status.started = Some(view.started.is_some_and(|s| s.contains(&latest.id)));
                }
                ContainerState::Exited => {
                    match wait {
                        // It will restart: waiting, with this run as last state.
                        Some((reason, message)) => {
                            status.state = Some(waiting(reason, message));
                            status.last_state = Some(terminated(latest));
                        }
                        None => status.state = Some(terminated(latest)),
                    }
                    status.started = Some(false);
                }
                ContainerState::Created | ContainerState::Unknown => {
                    let (reason, message) =
                        wait.cloned().unwrap_or_else(|| ("ContainerCreating".to_string(), String::new()));
                    status.state = Some(waiting(&reason, &message));
                    status.started = Some(false);
                }
            }
        }
    }
    status
}

fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

fn has_last_failure(s: &KubeStatus) -> bool {
    s.last_state.as_ref().and_then(|l| l.terminated.as_ref()).is_some_and(|t| t.exit_code != 0)
}

/// The pod's phase from its container statuses (the kubelet's `getPhase`).
pub fn phase(pod: &Pod, init: &[KubeStatus], main: &[KubeStatus]) -> &'static str {
    let spec = pod.spec.clone().unwrap_or_default();
    let policy = spec.restart_policy.as_deref().unwrap_or("Always");
    let inits = spec.init_containers.unwrap_or_default();
    let mut pending_init = 0;
    let mut failed_init = 0;
    for (c, s) in inits.iter().zip(init) {
        let state = s.state.clone().unwrap_or_default();
        if is_sidecar(c) {
            if state.running.is_some() && s.started == Some(true) {
                continue;
            }
            pending_init += 1;
            continue;
        }
        match (&state.terminated, &state.waiting) {
            (Some(t), _) if t.exit_code == 0 => {}
            (Some(_), _) => failed_init += 1,
            (None, Some(_)) if has_last_failure(s) => failed_init += 1,
            _ => pending_init += 1,
        }
    }
    let (mut running, mut waiting, mut stopped, mut succeeded, mut unknown) = (0, 0, 0, 0, 0);
    for s in main {
        let state = s.state.clone().unwrap_or_default();
        if state.running.is_some() {
            running += 1;
        } else if let Some(t) = &state.terminated {
            stopped += 1;
            if t.exit_code == 0 {
                succeeded += 1;
            }
        } else if state.waiting.is_some() {
            if s.last_state.as_ref().and_then(|l| l.terminated.as_ref()).is_some() {
                stopped += 1;
            } else {
                waiting += 1;
            }
        } else {
            unknown += 1;
        }
    }
    if failed_init > 0 && policy == "Never" {
        return "Failed";
    }
    let initialized = pending_init == 0 && failed_init == 0;
    if !initialized && running == 0 && stopped == 0 {
        return "Pending";
    }
    if waiting > 0 {
        return "Pending";
    }
    if running > 0 && unknown == 0 {
        return "Running";
    }
    if running == 0 && stopped > 0 && unknown == 0 {
        if policy == "Always" {
            return "Running";
        }
        if stopped == succeeded {
            return "Succeeded";
        }
        if policy == "Never" {
            return "Failed";
        }
        return "Running";
    }
    "Pending"
}

fn condition(
    type_: &str,
    ok: bool,
    reason: Option<&str>,
    message: Option<String>,
    previous: Option<&PodStatus>,
) -> PodCondition {
    let status = if ok { "True" } else { "False" }.to_string();
    let kept = previous
        .and_then(|p| p.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == type_))
        .filter(|c| c.status == status)
        .and_then(|c| c.last_transition_time.clone());
    PodCondition {
        type_: type_.to_string(),
        status,
        reason: if ok { None } else { reason.map(str::to_string) },
        message: if ok { None } else { message },
        last_transition_time: kept.or_else(|| Some(Time(Utc::now()))),
        last_probe_time: None,
    }
}

/// The pod's status. `previous` is the last status written, whose
/// condition transition times are kept while the condition holds, and
/// whose other conditions (PodScheduled, readiness gates) are kept as is.
pub fn pod_status(pod: &Pod, observed: &Observed, view: &WorkerView<'_>, previous: Option<&PodStatus>) -> PodStatus {
    let spec = pod.spec.clone().unwrap_or_default();
    let inits = spec.init_containers.clone().unwrap_or_default();
    let initialized = view.initialized;
    let init: Vec<KubeStatus> = inits.iter().map(|c| container_status(c, observed, view, "PodInitializing")).collect();
    let main_wait = if initialized { "ContainerCreating" } else { "PodInitializing" };
    let main: Vec<KubeStatus> =
        spec.containers.iter().map(|c| container_status(c, observed, view, main_wait)).collect();
    let phase = phase(pod, &init, &main);
    let ephemeral: Vec<KubeStatus> = super::spec::ephemeral_containers(pod)
        .iter()
        .map(|c| container_status(c, observed, view, "ContainerCreating"))
        .collect();

    let sandbox = observed.sandbox().filter(|s| s.state == SandboxState::Ready);
    let host_network = spec.host_network.unwrap_or(false);
    let pod_ip = if host_network {
        Some(view.host_ip.to_string())
    } else {
        // A finished pod keeps reporting the IP it had.
        observed.sandbox().and_then(|s| s.ip.clone())
    };

    let completed = phase == "Succeeded" || phase == "Failed";
    let unready: Vec<&str> = main
        .iter()
        .chain(init.iter().zip(&inits).filter(|(_, c)| is_sidecar(c)).map(|(s, _)| s))
        .filter(|s| !s.ready)
        .map(|s| s.name.as_str())
        .collect();
    let incomplete: Vec<&str> = init
        .iter()
        .zip(&inits)
        .filter(|(s, c)| {
            let state = s.state.clone().unwrap_or_default();
            if is_sidecar(c) {
                s.started != Some(true)
            } else {
                state.terminated.is_none_or(|t| t.exit_code != 0)
            }
        })
        .map(|(s, _)| s.name.as_str())
        .collect();
    let ready_reason = if completed { "PodCompleted" } else { "ContainersNotReady" };
    let unready_message = Some(format!("containers with unready status: [{}]", unready.join(" ")));
    let mut conditions = vec![
        condition("PodReadyToStartContainers", sandbox.is_some(), None, None, previous),
        condition(
            "Initialized",
            initialized,
            Some(if completed { "PodCompleted" } else { "ContainersNotInitialized" }),
            Some(format!("containers with incomplete status: [{}]", incomplete.join(" "))),
            previous,
        ),
        condition(
            "ContainersReady",
            unready.is_empty() && !completed,
            Some(ready_reason),
            unready_message.clone(),
            previous,
        ),
        condition("Ready", unready.is_empty() && !completed, Some(ready_reason), unready_message, previous),
    ];
    let ours: HashSet<&str> = conditions.iter().map(|c| c.type_.as_str()).collect::<HashSet<_>>();
    let ours: HashSet<String> = ours.into_iter().map(str::to_string).collect();
    let kept: Vec<PodCondition> = previous
        .or(pod.status.as_ref())
        .and_then(|p| p.conditions.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|c| !ours.contains(&c.type_))
        .collect();
    conditions.splice(0..0, kept);

    PodStatus {
        phase: Some(phase.to_string()),
        conditions: Some(conditions),
        host_ip: Some(view.host_ip.to_string()),
        host_ips: Some(vec![HostIP { ip: view.host_ip.to_string() }]),
        pod_ip: pod_ip.clone(),
        pod_ips: pod_ip.map(|ip| vec![PodIP { ip }]),
        start_time: view.start_time.clone(),
        qos_class: Some(qos_class(pod).to_string()),
        init_container_statuses: if inits.is_empty() { None } else { Some(init) },
        container_statuses: Some(main),
        ephemeral_container_statuses: if ephemeral.is_empty() { None } else { Some(ephemeral) },
        ..PodStatus::default()
    }
}
