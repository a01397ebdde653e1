//! One sync's decisions, as the kubelet's `computePodActions`: a pure
//! function of the pod, what the runtime shows and the worker's memory
//! (crash back-offs, when exits were seen, probe results) that says which
//! sandbox to make, which containers to kill and which to start, and which
//! wait out a back-off. No I/O, so it is tested without a runtime.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};
use tokio::time::Instant;

use super::backoff::Backoff;
use super::probe::{ProbeKind, ProbeState};
use super::spec;
use super::status::Observed;
use crate::runtime::{ContainerState, ContainerStatus, SandboxState};

/// A container to start now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Start {
    /// Its name in the spec.
    pub name: String,
    /// Its attempt (restart count).
    pub attempt: u32,
    /// When its last run ended, if this is a restart (counts a back-off).
    pub restart_since: Option<Instant>,
}

/// A container to kill now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kill {
    /// The runtime's id.
    pub id: String,
    /// Its name in the spec.
    pub name: String,
    /// The `Killing` event's message.
    pub message: String,
    /// Its grace, if not the pod's.
    pub grace: Option<Duration>,
}

/// What one sync does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Make a new sandbox with this attempt (after killing `kill`).
    pub create_sandbox: Option<u32>,
    /// Containers to kill.
    pub kill: Vec<Kill>,
    /// Containers to start, in order.
    pub start: Vec<Start>,
    /// Containers waiting out a crash back-off: name, the exited
    /// container's id, the delay, and until when.
    pub back_off: Vec<(String, String, Duration, Instant)>,
    /// Whether the init containers are done in the current sandbox.
    pub initialized: bool,
    /// The pod is done for good (restartPolicy says nothing runs again).
    pub finished: bool,
}

/// The worker's memory that [`plan`] reads.
pub struct Memory<'a> {
    /// Crash back-off per container name.
    pub backoff: &'a Backoff,
    /// When the worker first saw each exited container (by id) exited.
    pub exit_seen: &'a HashMap<String, Instant>,
    /// When the last failed create/start of each container name was.
    pub start_failed: &'a HashMap<String, Instant>,
    /// Probe states by container name and kind.
    pub probes: &'a HashMap<(String, ProbeKind), ProbeState>,
    /// Now.
    pub now: Instant,
}

fn restart_policy(pod: &Pod) -> &str {
    pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()).unwrap_or("Always")
}

/// Whether the pod's recorded phase is Succeeded or Failed.
pub fn is_terminal(pod: &Pod) -> bool {
    matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

/// Whether an init container is a sidecar (`restartPolicy: Always`).
pub fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

fn probe_failed(memory: &Memory<'_>, name: &str, kind: ProbeKind, id: &str) -> bool {
    memory.probes.get(&(name.to_string(), kind)).is_some_and(|p| p.container_id == id && p.failed())
}

/// Whether a running container counts as started: no startup probe, or
/// it passed.
pub fn started(c: &Container, memory_probes: &HashMap<(String, ProbeKind), ProbeState>, id: &str) -> bool {
    c.startup_probe.is_none()
        || memory_probes.get(&(c.name.clone(), ProbeKind::Startup)).is_some_and(|p| p.container_id == id && p.passed())
}

/// One sync's actions for `pod` given what the runtime shows.
pub fn plan(pod: &Pod, observed: &Observed, memory: &Memory<'_>) -> Plan {
    let spec = pod.spec.clone().unwrap_or_default();
    let policy = restart_policy(pod);
    let inits = spec.init_containers.clone().unwrap_or_default();
    let mut plan = Plan::default();
    // A pod the apiserver already records as done never runs again, even
    // if the runtime lost its containers (the phase must not go back).
    if is_terminal(pod) {
        plan.finished = true;
        plan.initialized = true;
        return plan;
    }

    let all_succeeded = |observed: &Observed| {
        spec.containers
            .iter()
            .all(|c| observed.latest(&c.name).is_some_and(|l| l.state == ContainerState::Exited && l.exit_code == 0))
    };
    let Some(sandbox) = observed.sandbox().filter(|s| s.state == SandboxState::Ready) else {
        // A pod that ran under restartPolicy Never does not get a new
        // sandbox, nor one under OnFailure whose containers all succeeded.
        let ran = !observed.containers.is_empty();
        if (policy == "Never" && ran) || (policy == "OnFailure" && ran && all_succeeded(observed)) {
            plan.finished = true;
            plan.initialized = true;
            return plan;
        }
        plan.create_sandbox = Some(observed.sandbox().map_or(0, |s| s.attempt + 1));
        plan.kill = observed
            .containers
            .iter()
            .filter(|c| c.state == ContainerState::Running)
            .map(|c| Kill {
                id: c.id.clone(),
                name: c.name.clone(),
                message: format!("Stopping container {}", c.name),
                grace: None,
            })
            .collect();
        return plan;
    };
    let sid = sandbox.id.as_str();
    let next_attempt = |name: &str| observed.latest(name).map_or(0, |c| c.attempt + 1);
    // A container to (re)start unless its back-off holds it.
    let start_or_back_off = |plan: &mut Plan, name: &str, exited: Option<&ContainerStatus>| {
        let since = match exited {
            Some(c) => memory.exit_seen.get(&c.id).copied().unwrap_or(memory.now),
            None => match memory.start_failed.get(name) {
                Some(at) => *at,
                None => {
                    plan.start.push(Start { name: name.to_string(), attempt: next_attempt(name), restart_since: None });
                    return;
                }
            },
        };
        match memory.backoff.blocked_until(name, since, memory.now) {
            Some(until) => {
                let delay = memory.backoff.delay(name, memory.now).unwrap_or_default();
                let id = exited.map(|c| c.id.clone()).unwrap_or_default();
                plan.back_off.push((name.to_string(), id, delay, until));
            }
            None => plan.start.push(Start {
                name: name.to_string(),
                attempt: next_attempt(name),
                restart_since: Some(since),
            }),
        }
    };
    let probe_kill = |plan: &mut Plan, c: &Container, running: &ContainerStatus| -> bool {
        for (kind, probe) in [(ProbeKind::Startup, &c.startup_probe), (ProbeKind::Liveness, &c.liveness_probe)] {
            if probe_failed(memory, &c.name, kind, &running.id) {
                let grace = probe
                    .as_ref()
                    .and_then(|p| p.termination_grace_period_seconds)
                    .map(|s| Duration::from_secs(s.max(0) as u64));
                plan.kill.push(Kill {
                    id: running.id.clone(),
                    name: c.name.clone(),
                    message: format!(
                        "Container {} failed {} probe, will be restarted",
                        c.name,
                        kind.name().to_lowercase()
                    ),
                    grace,
                });
                return true;
            }
        }
        false
    };

    // Init containers, one by one; sidecars are started in order and
    // waited for until started, not until done.
    for c in &inits {
        match observed.latest_in(&c.name, sid) {
            None => {
                start_or_back_off(&mut plan, &c.name, None);
                return plan;
            }
            Some(latest) => match latest.state {
                ContainerState::Running if is_sidecar(c) => {
                    if probe_kill(&mut plan, c, latest) || !started(c, memory.probes, &latest.id) {
                        return plan;
                    }
                }
                ContainerState::Running | ContainerState::Created | ContainerState::Unknown => return plan,
                ContainerState::Exited if is_sidecar(c) => {
                    start_or_back_off(&mut plan, &c.name, Some(latest));
                    return plan;
                }
                ContainerState::Exited if latest.exit_code == 0 => {}
                ContainerState::Exited => {
                    if policy == "Never" {
                        plan.finished = true;
                    } else {
                        start_or_back_off(&mut plan, &c.name, Some(latest));
                    }
                    return plan;
                }
            },
        }
    }
    plan.initialized = true;

    // Ephemeral containers (`kubectl debug`) run once each, and never
    // again, whatever the pod's policy, nor in a new sandbox.
    let ephemeral = spec::ephemeral_containers(pod);
    for c in &ephemeral {
        if observed.latest(&c.name).is_none() {
            start_or_back_off(&mut plan, &c.name, None);
        }
    }

    let mut done = 0;
    for c in &spec.containers {
        match observed.latest_in(&c.name, sid) {
            None => start_or_back_off(&mut plan, &c.name, None),
            Some(latest) => match latest.state {
                ContainerState::Running => {
                    let hash = latest.annotations.get(spec::ANNOTATION_HASH);
                    if hash.is_some_and(|h| *h != spec::container_hash(c)) {
                        // The kubelet restarts a container whose spec
                        // changed (e.g. its image) whatever the policy.
                        plan.kill.push(Kill {
                            id: latest.id.clone(),
                            name: c.name.clone(),
                            message: format!("Container {} definition changed, will be restarted", c.name),
                            grace: None,
                        });
                        plan.start.push(Start {
                            name: c.name.clone(),
                            attempt: latest.attempt + 1,
                            restart_since: None,
                        });
                    } else {
                        probe_kill(&mut plan, c, latest);
                    }
                }
                ContainerState::Exited => {
                    let restart = match policy {
                        "Never" => false,
                        "OnFailure" => latest.exit_code != 0,
                        _ => true,
                    };
                    if restart {
                        start_or_back_off(&mut plan, &c.name, Some(latest));
                    } else {
                        done += 1;
                    }
                }
                ContainerState::Created | ContainerState::Unknown => {}
            },
        }
    }
    if done == spec.containers.len() && !spec.containers.is_empty() {
        // Every main container is done for good: the sidecars stop too.
        plan.finished = true;
        for c in inits.iter().filter(|c| is_sidecar(c)) {
            if let Some(running) = observed.latest_in(&c.name, sid).filter(|l| l.state == ContainerState::Running) {
                plan.kill.push(Kill {
                    id: running.id.clone(),
                    name: c.name.clone(),
                    message: format!("Stopping container {}", c.name),
                    grace: None,
                });
            }
        }
        plan.back_off.clear();
        plan.start.retain(|s| !inits.iter().chain(&ephemeral).any(|c| c.name == s.name));
    }
    plan
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::runtime::SandboxStatus;

    fn must_pod(spec: serde_json::Value) -> Pod {
        match serde_json::from_value(serde_json::json!({"metadata": {"name": "p", "uid": "u"}, "spec": spec})) {
            Ok(p) => p,
            Err(e) => panic!("{e}"),
        }
    }

    fn container(id: &str, name: &str, state: ContainerState, exit_code: i32) -> ContainerStatus {
        ContainerStatus {
            id: id.into(),
            sandbox_id: "sb".into(),
            name: name.into(),
            attempt: 0,
            state,
            created_at: 1,
            started_at: 1,
            finished_at: 0,
            exit_code,
            reason: String::new(),
            message: String::new(),
            image: String::new(),
            image_ref: String::new(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            log_path: String::new(),
        }
    }

    fn sandbox(state: SandboxState) -> SandboxStatus {
        SandboxStatus { id: "sb".into(), state, ip: None, created_at: 1, attempt: 2, labels: BTreeMap::new() }
    }

    #[tokio::test(start_paused = true)]
    async fn an_ephemeral_container_starts_once_after_init_and_is_never_restarted() {
        let backoff = Backoff::new(Duration::from_secs(10), Duration::from_secs(300));
        let (exit_seen, start_failed, probes) = (HashMap::new(), HashMap::new(), HashMap::new());
        let memory = Memory {
            backoff: &backoff,
            exit_seen: &exit_seen,
            start_failed: &start_failed,
            probes: &probes,
            now: Instant::now(),
        };
        let pod = must_pod(serde_json::json!({
            "initContainers": [{"name": "init"}],
            "containers": [{"name": "web"}],
            "ephemeralContainers": [{"name": "debugger", "image": "busybox", "targetContainerName": "web"}],
        }));
        let starts =
            |observed: &Observed| plan(&pod, observed, &memory).start.into_iter().map(|s| s.name).collect::<Vec<_>>();
        let ready = || vec![sandbox(SandboxState::Ready)];
        // Not before the init containers are done.
        let initializing =
            Observed { sandboxes: ready(), containers: vec![container("i", "init", ContainerState::Running, 0)] };
        assert_eq!(starts(&initializing), Vec::<String>::new());
        let initialized = Observed {
            sandboxes: ready(),
            containers: vec![
                container("i", "init", ContainerState::Exited, 0),
                container("w", "web", ContainerState::Running, 0),
            ],
        };
        assert_eq!(starts(&initialized), ["debugger"]);
        // Once it ran, it is not started again, even under restartPolicy Always.
        let mut debugged = initialized;
        debugged.containers.push(container("d", "debugger", ContainerState::Exited, 1));
        assert_eq!(starts(&debugged), Vec::<String>::new());
    }

    #[tokio::test(start_paused = true)]
    async fn the_plan_follows_sandbox_init_liveness_and_restart_policy_without_io() {
        let backoff = Backoff::new(Duration::from_secs(10), Duration::from_secs(300));
        let (exit_seen, start_failed) = (HashMap::new(), HashMap::new());
        let mut probes = HashMap::new();
        macro_rules! memory {
            ($probes:expr) => {
                Memory {
                    backoff: &backoff,
                    exit_seen: &exit_seen,
                    start_failed: &start_failed,
                    probes: $probes,
                    now: Instant::now(),
                }
            };
        }
        let pod = must_pod(serde_json::json!({
            "initContainers": [{"name": "init"}],
            "containers": [{"name": "web", "livenessProbe": {"exec": {"command": ["x"]}, "failureThreshold": 1}}],
        }));

        // A dead sandbox: a new one with the next attempt.
        let dead = Observed { sandboxes: vec![sandbox(SandboxState::NotReady)], containers: vec![] };
        assert_eq!(plan(&pod, &dead, &memory!(&probes)).create_sandbox, Some(3));

        // Init not run yet: only it starts.
        let fresh = Observed { sandboxes: vec![sandbox(SandboxState::Ready)], containers: vec![] };
        let p = plan(&pod, &fresh, &memory!(&probes));
        assert_eq!(p.start.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), vec!["init"]);
        assert!(!p.initialized);

        // Init done, web running with a failed liveness probe: kill it.
        let running = Observed {
            sandboxes: vec![sandbox(SandboxState::Ready)],
            containers: vec![
                container("i", "init", ContainerState::Exited, 0),
                container("w", "web", ContainerState::Running, 0),
            ],
        };
        let probe = match serde_json::from_value(serde_json::json!({"failureThreshold": 1})) {
            Ok(p) => p,
            Err(e) => panic!("{e}"),
        };
        let mut liveness = ProbeState::new(ProbeKind::Liveness, &probe, "w", Instant::now());
        liveness.record(false, Instant::now());
        probes.insert(("web".to_string(), ProbeKind::Liveness), liveness);
        let p = plan(&pod, &running, &memory!(&probes));
        assert!(p.initialized);
        assert_eq!(p.kill.iter().map(|k| k.id.as_str()).collect::<Vec<_>>(), vec!["w"]);

        // Under Never, an exited web is final: the pod is finished.
        let never = must_pod(serde_json::json!({"restartPolicy": "Never", "containers": [{"name": "web"}]}));
        let exited = Observed {
            sandboxes: vec![sandbox(SandboxState::Ready)],
            containers: vec![container("w", "web", ContainerState::Exited, 1)],
        };
        let p = plan(&never, &exited, &memory!(&probes));
        assert!(p.finished && p.start.is_empty());
    }
}
