//! Pod worker tests with paused time and the fake runtime.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Pod, PodStatus, Secret, ServiceAccountTokenProjection};
use k8s_openapi::ByteString;
use serde_json::{json, Value};
use skiff_shutdown::Shutdown;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::worker::{step, Input, State};
use super::*;
use crate::runtime::fake::FakeRuntime;
use crate::runtime::{ContainerState, ExecResult, Runtime, SandboxState, LABEL_CONTAINER_NAME, LABEL_POD_NAME};

fn must_pod(name: &str, spec: Value) -> Pod {
    let value = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"), "labels": {"app": "web"}},
        "spec": spec,
    });
    match serde_json::from_value(value) {
        Ok(pod) => pod,
        Err(e) => panic!("bad pod {name}: {e}"),
    }
}

fn must_deleted(mut pod: Pod, grace: i64) -> Pod {
    pod.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(chrono::Utc::now()));
    pod.metadata.deletion_grace_period_seconds = Some(grace);
    pod
}

#[derive(Default)]
struct Resources {
    config_maps: BTreeMap<String, ConfigMap>,
    secrets: BTreeMap<String, Secret>,
    services: Vec<(String, String)>,
    /// Whether TokenRequests are refused.
    no_tokens: bool,
}

impl PodResources for Resources {
    fn config_map(&self, _: &str, name: &str) -> Option<ConfigMap> {
        self.config_maps.get(name).cloned()
    }
    fn secret(&self, _: &str, name: &str) -> Option<Secret> {
        self.secrets.get(name).cloned()
    }
    fn service_env(&self, _: &str) -> Vec<(String, String)> {
        self.services.clone()
    }
    fn service_account_token(&self, pod: &Pod, source: &ServiceAccountTokenProjection) -> Option<String> {
        if self.no_tokens {
            return None;
        }
        let audience = source.audience.as_deref().unwrap_or("api");
        Some(format!("jwt-of-{}-for-{audience}", pod.metadata.name.as_deref().unwrap_or_default()))
    }
}

fn resources() -> Resources {
    let mut r = Resources::default();
    r.config_maps.insert(
        "settings".into(),
        ConfigMap {
            data: Some(BTreeMap::from([("mode".into(), "fast".into()), ("level".into(), "3".into())])),
            ..ConfigMap::default()
        },
    );
    r.secrets.insert(
        "creds".into(),
        Secret {
            data: Some(BTreeMap::from([("password".into(), ByteString(b"hunter2".to_vec()))])),
            ..Secret::default()
        },
    );
    r.services = vec![("WEB_SERVICE_HOST".into(), "10.0.0.10".into()), ("WEB_SERVICE_PORT".into(), "80".into())];
    r
}

struct Harness {
    fake: Arc<FakeRuntime>,
    workers: PodWorkers,
    rx: mpsc::Receiver<WorkerOutput>,
    outputs: Vec<(Instant, WorkerOutput)>,
    shutdown: Shutdown,
    _dir: tempfile::TempDir,
}

fn must_tempdir() -> tempfile::TempDir {
    match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => panic!("tempdir: {e}"),
    }
}

impl Harness {
    fn new() -> Harness {
        Harness::with_runtime(Arc::new(FakeRuntime::new()), 64)
    }

    fn with_runtime(fake: Arc<FakeRuntime>, capacity: usize) -> Harness {
        let dir = must_tempdir();
        let config = WorkerConfig {
            node_name: "node-1".into(),
            pod_log_dir: dir.path().join("logs"),
            pods_dir: dir.path().join("pods"),
            host_ip: "192.168.1.5".into(),
            cluster_dns: vec!["10.96.0.10".into()],
            ..WorkerConfig::default()
        };
        let (tx, rx) = mpsc::channel(capacity);
        let shutdown = Shutdown::new();
        let runtime: Arc<dyn Runtime> = fake.clone();
        let workers = PodWorkers::new(runtime, config, Arc::new(resources()), tx, shutdown.clone());
        Harness { fake, workers, rx, outputs: Vec::new(), shutdown, _dir: dir }
    }

    /// Lets the workers run for `d` of (paused) time, collecting outputs.
    async fn run_for(&mut self, d: Duration) {
        let deadline = Instant::now() + d;
        loop {
            tokio::select! {
                Some(o) = self.rx.recv() => self.outputs.push((Instant::now(), o)),
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
    }

    fn status(&self, name: &str) -> PodStatus {
        self.outputs
            .iter()
            .rev()
            .find_map(|(_, o)| match o {
                WorkerOutput::Status { key, status, .. } if key.name == name => Some(status.clone()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no status for {name}"))
    }

    fn events(&self) -> Vec<(String, String)> {
        self.outputs
            .iter()
            .filter_map(|(_, o)| match o {
                WorkerOutput::Event { reason, message, .. } => Some((reason.clone(), message.clone())),
                _ => None,
            })
            .collect()
    }

    fn has_event(&self, reason: &str, contains: &str) -> bool {
        self.events().iter().any(|(r, m)| r == reason && m.contains(contains))
    }

    fn starts(&self, container: &str) -> Vec<Instant> {
        self.fake
            .calls()
            .into_iter()
            .filter(|c| c.method == "start_container" && c.target == container)
            .map(|c| c.at)
            .collect()
    }
}

fn condition(status: &PodStatus, type_: &str) -> String {
    status.conditions.iter().flatten().find(|c| c.type_ == type_).map(|c| c.status.clone()).unwrap_or_default()
}

fn main_status(status: &PodStatus, name: &str) -> k8s_openapi::api::core::v1::ContainerStatus {
    status
        .container_statuses
        .iter()
        .flatten()
        .chain(status.init_container_statuses.iter().flatten())
        .find(|c| c.name == name)
        .cloned()
        .unwrap_or_else(|| panic!("no container status {name}"))
}

fn waiting_reason(status: &PodStatus, name: &str) -> Option<String> {
    main_status(status, name).state.and_then(|s| s.waiting).and_then(|w| w.reason)
}

fn container(name: &str) -> Value {
    json!({"name": name, "image": "app:1"})
}

#[tokio::test(start_paused = true)]
async fn init_containers_run_one_by_one_to_success_before_the_main_containers() {
    let mut h = Harness::new();
    h.fake.add_image("app:1");
    h.fake.exit_on_start("init-a", Some((0, "Completed")));
    h.fake.exit_on_start("init-b", Some((0, "Completed")));
    let pod = must_pod(
        "p",
        json!({"initContainers": [container("init-a"), container("init-b")], "containers": [container("web")]}),
    );
    h.workers.update(Arc::new(pod));
    h.run_for(Duration::from_secs(5)).await;

    let order: Vec<String> = h.fake.call_names().into_iter().filter(|c| c.starts_with("start_container")).collect();
    assert_eq!(order, vec!["start_container init-a", "start_container init-b", "start_container web"]);
    let status = h.status("p");
    assert_eq!(status.phase.as_deref(), Some("Running"));
    assert_eq!(condition(&status, "Initialized"), "True");
    assert_eq!(condition(&status, "Ready"), "True");
    assert_eq!(condition(&status, "PodReadyToStartContainers"), "True");
    let init = main_status(&status, "init-a");
    let terminated = init.state.and_then(|s| s.terminated).map(|t| (t.exit_code, t.reason));
    assert_eq!(terminated, Some((0, Some("Completed".into()))));
    assert_eq!(status.qos_class.as_deref(), Some("BestEffort"));
    assert!(status.pod_ip.as_ref().is_some_and(|ip| ip.starts_with("10.88.")));
    assert_eq!(status.host_ip.as_deref(), Some("192.168.1.5"));
    assert!(status.start_time.is_some());
    assert!(main_status(&status, "web").container_id.is_some_and(|id| id.starts_with("containerd://")));
    assert!(h.workers.container_id("ns", "p", "web").is_some());
}

#[tokio::test(start_paused = true)]
async fn a_failing_init_container_fails_the_pod_under_never_and_is_retried_under_on_failure() {
    let mut h = Harness::new();
    h.fake.add_image("app:1");
    h.fake.exit_on_start("init", Some((1, "Error")));
    let never = must_pod(
        "never",
        json!({"restartPolicy": "Never", "initContainers": [container("init")], "containers": [container("web")]}),
    );
    let retry = must_pod(
        "retry",
        json!({"restartPolicy": "OnFailure", "initContainers": [container("init")], "containers": [container("web")]}),
    );
    h.workers.update(Arc::new(never));
    h.workers.update(Arc::new(retry));
    h.run_for(Duration::from_secs(30)).await;

    assert_eq!(h.status("never").phase.as_deref(), Some("Failed"));
    assert_eq!(h.status("retry").phase.as_deref(), Some("Pending"));
    assert_eq!(waiting_reason(&h.status("retry"), "init").as_deref(), Some("CrashLoopBackOff"));
    assert_eq!(condition(&h.status("retry"), "Initialized"), "False");
    let web_created = h.fake.call_names().iter().any(|c| c == "create_container web");
    assert!(!web_created, "no main container may start before the init containers succeed");
    // Two pods' init containers: "never" once, "retry" at 0, ~0 and ~10 s.
    assert!(h.starts("init").len() >= 3, "{:?}", h.starts("init"));
}

#[tokio::test(start_paused = true)]
async fn restart_policies_decide_which_exits_restart_and_the_phase() {
    let mut h = Harness::new();
    h.fake.add_image("app:1");
    h.fake.exit_on_start("ok", Some((0, "Completed")));
    h.fake.exit_on_start("bad", Some((2, "Error")));
    for (name, policy, c) in [
        ("never-bad", "Never", "bad"),
        ("onfailure-ok", "OnFailure", "ok"),
        ("onfailure-bad", "OnFailure", "bad"),
        ("always-ok", "Always", "ok"),
    ] {
        h.workers.update(Arc::new(must_pod(name, json!({"restartPolicy": policy, "containers": [container(c)]}))));
    }
    h.run_for(Duration::from_secs(40)).await;

    let never = h.status("never-bad");
    assert_eq!(never.phase.as_deref(), Some("Failed"));
    let t = main_status(&never, "bad").state.and_then(|s| s.terminated);
    assert_eq!(t.map(|t| (t.exit_code, t.reason)), Some((2, Some("Error".into()))));
    assert_eq!(h.status("onfailure-ok").phase.as_deref(), Some("Succeeded"));
    assert_eq!(condition(&h.status("onfailure-ok"), "Ready"), "False");
    let bad = h.status("onfailure-bad");
    assert_eq!(bad.phase.as_deref(), Some("Running"));
    assert!(main_status(&bad, "bad").restart_count >= 2);
    let always = h.status("always-ok");
    assert_eq!(always.phase.as_deref(), Some("Running"));
    assert!(main_status(&always, "ok").restart_count >= 2);
    // The finished pods' sandboxes are stopped, their containers kept.
    let never_sandbox =
        h.fake.sandboxes().into_iter().find(|s| s.labels.get(LABEL_POD_NAME).map(String::as_str) == Some("never-bad"));
    assert_eq!(never_sandbox.map(|s| s.state), Some(SandboxState::NotReady));
}

#[tokio::test(start_paused = true)]
async fn crash_loop_back_off_doubles_from_10_seconds_to_5_minutes_and_resets_after_10_minutes_running() {
    let mut h = Harness::new();
    h.fake.add_image("app:1");
    h.fake.exit_on_start("crash", Some((1, "Error")));
    h.workers.update(Arc::new(must_pod("p", json!({"containers": [container("crash")]}))));
    h.run_for(Duration::from_secs(1300)).await;

    let starts = h.starts("crash");
    let gaps: Vec<u64> = starts.windows(2).map(|w| w[1].duration_since(w[0]).as_secs()).collect();
    // First restart at once, then 10, 20, 40, 80, 160, 300, 300... (each
    // within the 1 s it takes to notice the exit).
    let expected = [0u64, 10, 20, 40, 80, 160, 300, 300];
    assert!(gaps.len() >= expected.len(), "{gaps:?}");
    for (gap, want) in gaps.iter().zip(expected) {
        assert!(*gap >= want && *gap <= want + 1, "gaps {gaps:?}");
    }
    assert!(h.has_event("BackOff", "Back-off restarting failed container crash"));
    let waiting = main_status(&h.status("p"), "crash").state.and_then(|s| s.waiting);
    assert_eq!(waiting.as_ref().and_then(|w| w.reason.as_deref()), Some("CrashLoopBackOff"));
    assert!(waiting.and_then(|w| w.message).is_some_and(|m| m.contains("back-off 5m") || m.contains("back-off 300s")));

    // It now runs for 11 minutes, then crashes: restarted at once.
    h.fake.exit_on_start("crash", None);
    h.run_for(Duration::from_secs(301)).await;
    h.run_for(Duration::from_secs(660)).await;
    let before = h.starts("crash").len();
    assert!(h.fake.exit_container("p", "crash", 1, "Error"));
    h.run_for(Duration::from_secs(3)).await;
    assert_eq!(h.starts("crash").len(), before + 1, "restarted without back-off after running 10 minutes");
}

fn exec_probe(cmd: &str, extra: Value) -> Value {
    let mut probe = json!({"exec": {"command": [cmd]}, "periodSeconds": 1, "failureThreshold": 2});
    if let (Some(p), Some(e)) = (probe.as_object_mut(), extra.as_object()) {
        p.extend(e.clone());
    }
    probe
}

fn failing() -> ExecResult {
    ExecResult { stdout: b"not ok".to_vec(), stderr: vec![], exit_code: 1 }
}

#[tokio::test(start_paused = true)]
async fn a_readiness_probe_turns_the_pod_ready_false_and_back_true() {
    let mut h = Harness::new();
    h.fake.add_image("app:1");
    let web = json!({"name": "web", "image": "app:1", "readinessProbe": exec_probe("ready", json!({"initialDelaySeconds": 3}))});
    h.workers.update(Arc::new(must_pod("p", json!({"containers": [web]}))));
    h.run_for(Duration::from_secs(2)).await;
    assert_eq!(condition(&h.status("p"), "Ready"), "False", "not ready before the initial delay");
    h.run_for(Duration::from_secs(3)).await;
    assert_eq!(condition(&h.status("p"), "Ready"), "True");
    assert_eq!(condition(&h.status("p"), "ContainersReady"), "True");

    h.fake.set_exec_result(&["ready"], failing());
    h.run_for(Duration::from_secs(3)).await;
    let status = h.status("p");
    assert_eq!(condition(&status, "Ready"), "False");
    assert!(!main_status(&status, "web").ready);
    assert_eq!(status.phase.as_deref(), Some("Running"));
    assert!(h.has_event("Unhealthy", "Readiness probe failed: command [\"ready\"] exited with 1: not ok"));

    h.fake.set_exec_result(&["ready"], ExecResult::default());
    h.run_for(Duration::from_secs(2)).await;
    assert_eq!(condition(&h.status("p"), "Ready"), "True");
    assert_eq!(h.starts("web").len(), 1, "readiness never restarts a container");
}

#[tokio::test(start_paused = true)]
async fn a_liveness_failure_kills_and_restarts_the_container_with_restart_count_and_last_state() {
    let mut h = Harness::new();
    h.fake.add_image("app:1");
    let web = json!({"name": "web", "image": "app:1", "livenessProbe": exec_probe("alive", json!({"terminationGracePeriodSeconds": 5}))});
    h.workers.update(Arc::new(must_pod("p", json!({"containers": [web]}))));
    h.run_for(Duration::from_secs(3)).await;
    h.fake.set_exec_result(&["alive"], failing());
    h.run_for(Duration::from_secs(3)).await;
    h.fake.set_exec_result(&["alive"], ExecResult::default());
    h.run_for(Duration::from_secs(3)).await;

    assert!(h.has_event("Unhealthy", "Liveness probe failed"));
    assert!(h.has_event("Killing", "Container web failed liveness probe, will be restarted"));
    let stop = h.fake.calls().into_iter().find(|c| c.method == "stop_container");
    assert_eq!(stop.map(|c| c.detail), Some("timeout=5".into()), "the probe's own grace period");
    let status = main_status(&h.status("p"), "web");
    assert_eq!(status.restart_count, 1);
    assert!(status.state.and_then(|s| s.running).is_some());
    let last = status.last_state.and_then(|s| s.terminated).map(|t| t.exit_code);
    assert_eq!(last, Some(143));
}

#[tokio::test(start_paused = true)]
async fn a_startup_probe_holds_liveness_and_readiness_until_it_passes() {
    let mut h = Harness::new();
    h.fake.add_image("app:1");
    h.fake.set_exec_result(&["started"], failing());
    h.fake.set_exec_result(&["alive"], failing());
    let web = json!({
        "name": "web", "image": "app:1",
        "startupProbe": exec_probe("started", json!({"failureThreshold": 30})),
        "livenessProbe": exec_probe("alive", json!({})),
    });
    h.workers.update(Arc::new(must_pod("p", json!({"containers": [web]}))));
    h.run_for(Duration::from_secs(10)).await;
    let execs =
        |h: &Harness, cmd: &str| h.fake.calls().iter().filter(|c| c.method == "exec_sync" && c.detail == cmd).count();
    assert!(execs(&h, "started") >= 8);
    assert_eq!(execs(&h, "alive"), 0, "liveness waits for startup");
    assert_eq!(main_status(&h.status("p"), "web").started, Some(false));
    assert_eq!(h.starts("web").len(), 1);

    h.fake.set_exec_result(&["started"], ExecResult::default());
    h.fake.set_exec_result(&["alive"], ExecResult::default());
    h.run_for(Duration::from_secs(5)).await;
    assert!(execs(&h, "alive") >= 2);
    assert_eq!(main_status(&h.status("p"), "web").started, Some(true));
    assert_eq!(condition(&h.status("p"), "Ready"), "True");
}

#[tokio::test(start_paused = true)]
async fn a_startup_probe_that_never_passes_restarts_the_container() {
    let mut h = Harness::new();
    h.fake.add_image("app:1");
    h.fake.set_exec_result(&["started"], failing());
    let web =
        json!({"name": "web", "image": "app:1", "startupProbe": exec_probe("started", json!({"failureThreshold": 3}))});
    h.workers.update(Arc::new(must_pod("p", json!({"containers": [web]}))));
    h.run_for(Duration::from_secs(8)).await;
    assert!(h.has_event("Killing", "failed startup probe"));
    assert!(h.starts("web").len() >= 2);
}

#[tokio::test(start_paused = true)]
async fn graceful_deletion_runs_pre_stop_then_stops_with_the_remaining_grace_and_kills_after_it() {
    let mut h = Harness::new();
    h.fake.add_image("app:1");
    h.fake.ignore_sigterm("web");
    let web = json!({"name": "web", "image": "app:1", "lifecycle": {"preStop": {"exec": {"command": ["drain"]}}}});
    let pod = must_pod("p", json!({"terminationGracePeriodSeconds": 60, "containers": [web]}));
    h.workers.update(Arc::new(pod.clone()));
    h.run_for(Duration::from_secs(3)).await;
    let deleted_at = Instant::now();
    h.workers.update(Arc::new(must_deleted(pod, 20)));
    h.run_for(Duration::from_secs(30)).await;

    let names = h.fake.call_names();
    let pre_stop = names.iter().position(|c| c == "exec_sync web");
    let stop = names.iter().position(|c| c == "stop_container web");
    let remove = names.iter().position(|c| c == "remove_sandbox p");
    assert!(pre_stop.is_some() && pre_stop < stop && stop < remove, "{names:?}");
    let stop_call = h.fake.calls().into_iter().find(|c| c.method == "stop_container");
    assert_eq!(stop_call.map(|c| c.detail), Some("timeout=20".into()), "the deletion's grace, not the spec's");
    let terminated_at =
        h.outputs.iter().find_map(|(at, o)| matches!(o, WorkerOutput::Terminated { .. }).then_some(*at));
    let took = terminated_at.map(|t| t.duration_since(deleted_at).as_secs());
    assert!(took.is_some_and(|s| (20..=21).contains(&s)), "SIGKILL after the grace: {took:?}");
    let last = main_status(&h.status("p"), "web").state.and_then(|s| s.terminated).map(|t| t.exit_code);
    assert_eq!(last, Some(137));
    assert!(h.fake.containers().is_empty() && h.fake.sandboxes().is_empty());
    assert!(h.has_event("Killing", "Stopping container web"));
    assert!(h.workers.is_empty());
}

#[tokio::test(start_paused = true)]
async fn remove_terminates_at_once_and_a_sidecar_stops_after_the_main_containers() {
    let mut h = Harness::new();
    h.fake.add_image("app:1");
    let sidecar = json!({"name": "proxy", "image": "app:1", "restartPolicy": "Always"});
    let pod = must_pod("p", json!({"initContainers": [sidecar], "containers": [container("web")]}));
    h.workers.update(Arc::new(pod));
    h.run_for(Duration::from_secs(3)).await;
    assert_eq!(h.status("p").phase.as_deref(), Some("Running"));
    h.workers.remove("uid-p");
    h.run_for(Duration::from_secs(5)).await;
    let names: Vec<String> = h.fake.call_names().into_iter().filter(|c| c.starts_with("stop_container")).collect();
    assert_eq!(names, vec!["stop_container web", "stop_container proxy"]);
    assert!(h.outputs.iter().any(|(_, o)| matches!(o, WorkerOutput::Terminated { uid, .. } if uid == "uid-p")));
}

#[tokio::test(start_paused = true)]
async fn a_sidecar_starts_before_the_next_init_container_and_keeps_running() {
    let mut h = Harness::new();
    h.fake.add_image("app:1");
    h.fake.exit_on_start("setup", Some((0, "Completed")));
    h.fake.exit_on_start("job", Some((0, "Completed")));
    h.fake.set_exec_result(&["proxy-up"], failing());
    let sidecar = json!({"name": "proxy", "image": "app:1", "restartPolicy": "Always", "startupProbe": exec_probe("proxy-up", json!({"failureThreshold": 100}))});
    let pod = must_pod(
        "p",
        json!({"restartPolicy": "OnFailure", "initContainers": [sidecar, container("setup")], "containers": [container("job")]}),
    );
    h.workers.update(Arc::new(pod));
    h.run_for(Duration::from_secs(5)).await;
    assert!(h.starts("setup").is_empty(), "setup waits for the sidecar to be started");
    h.fake.set_exec_result(&["proxy-up"], ExecResult::default());
    h.run_for(Duration::from_secs(5)).await;
    let order: Vec<String> = h.fake.call_names().into_iter().filter(|c| c.starts_with("start_container")).collect();
    assert_eq!(order, vec!["start_container proxy", "start_container setup", "start_container job"]);
    // The job finished: the sidecar is stopped and the pod Succeeded.
    assert_eq!(h.status("p").phase.as_deref(), Some("Succeeded"));
    assert!(h.fake.call_names().contains(&"stop_container proxy".to_string()));
}

#[tokio::test(start_paused = true)]
async fn image_pull_policies_and_the_pull_back_off() {
    let mut h = Harness::new();
    h.fake.add_image("present:1");
    let pod = |name: &str, image: &str, policy: &str| {
        must_pod(name, json!({"containers": [{"name": "c", "image": image, "imagePullPolicy": policy}]}))
    };
    h.workers.update(Arc::new(pod("never", "absent:1", "Never")));
    h.workers.update(Arc::new(pod("ifnotpresent", "present:1", "IfNotPresent")));
    h.workers.update(Arc::new(pod("missing", "missing:1", "IfNotPresent")));
    h.run_for(Duration::from_secs(2)).await;

    assert_eq!(waiting_reason(&h.status("never"), "c").as_deref(), Some("ErrImageNeverPull"));
    assert!(h.has_event("ErrImageNeverPull", "Container image \"absent:1\" is not present with pull policy of Never"));
    assert_eq!(h.status("ifnotpresent").phase.as_deref(), Some("Running"));
    assert!(!h.fake.call_names().contains(&"pull_image present:1".to_string()));
    assert!(h.has_event("Pulled", "Container image \"present:1\" already present on machine"));
    assert!(h.has_event("Failed", "Error: ErrImagePull"));

    h.run_for(Duration::from_secs(40)).await;
    assert_eq!(waiting_reason(&h.status("missing"), "c").as_deref(), Some("ImagePullBackOff"));
    let pulls: Vec<Instant> = h
        .fake
        .calls()
        .into_iter()
        .filter(|c| c.method == "pull_image" && c.target == "missing:1")
        .map(|c| c.at)
        .collect();
    let gaps: Vec<u64> = pulls.windows(2).map(|w| w[1].duration_since(w[0]).as_secs()).collect();
    assert_eq!(gaps, vec![10, 20], "pulls back off 10 s then 20 s");
    assert!(h.has_event("BackOff", "Back-off pulling image \"missing:1\""));

    h.fake.allow_pull("missing:1");
    h.run_for(Duration::from_secs(60)).await;
    assert_eq!(h.status("missing").phase.as_deref(), Some("Running"));

    // Always pulls on every start, even when present.
    h.workers.update(Arc::new(pod("always", "present:1", "Always")));
    h.run_for(Duration::from_secs(2)).await;
    assert!(h.fake.call_names().contains(&"pull_image present:1".to_string()));
}

#[tokio::test(start_paused = true)]
async fn a_restarted_agent_adopts_running_containers_and_removes_orphans() {
    let fake = Arc::new(FakeRuntime::new());
    fake.add_image("app:1");
    let kept = must_pod("kept", json!({"containers": [container("web")]}));
    let gone = must_pod("gone", json!({"containers": [container("web")]}));
    let mut first = Harness::with_runtime(fake.clone(), 64);
    first.workers.update(Arc::new(kept.clone()));
    first.workers.update(Arc::new(gone));
    first.run_for(Duration::from_secs(3)).await;
    let id_before = first.workers.container_id("ns", "kept", "web");
    first.shutdown.cancel();
    first.shutdown.wait().await;
    assert_eq!(fake.containers().len(), 2, "shutdown leaves containers running");

    let mut second = Harness::with_runtime(fake.clone(), 64);
    let adopted = second.workers.adopt().await;
    assert_eq!(adopted, Ok(vec!["uid-gone".to_string(), "uid-kept".to_string()]));
    let creates_before = fake.calls().iter().filter(|c| c.method == "create_container").count();
    let removed = second.workers.sync_all(vec![Arc::new(kept)]).await;
    assert_eq!(removed, Ok(vec!["uid-gone".to_string()]));
    second.run_for(Duration::from_secs(3)).await;

    let creates_after = fake.calls().iter().filter(|c| c.method == "create_container").count();
    assert_eq!(creates_before, creates_after, "nothing recreated");
    assert_eq!(second.workers.container_id("ns", "kept", "web"), id_before);
    let left: Vec<String> = fake.containers().iter().filter_map(|c| c.labels.get(LABEL_POD_NAME).cloned()).collect();
    assert_eq!(left, vec!["kept".to_string()]);
    assert_eq!(fake.sandboxes().len(), 1);
    let status = second.status("kept");
    assert_eq!(status.phase.as_deref(), Some("Running"));
    assert_eq!(main_status(&status, "web").restart_count, 0);
    assert_eq!(
        fake.containers().iter().map(|c| (c.state, c.labels.get(LABEL_CONTAINER_NAME).cloned())).collect::<Vec<_>>(),
        vec![(ContainerState::Running, Some("web".to_string()))]
    );
}

#[tokio::test(start_paused = true)]
async fn a_dead_sandbox_is_recreated_with_the_next_attempt() {
    let mut h = Harness::new();
    h.fake.add_image("app:1");
    h.workers.update(Arc::new(must_pod("p", json!({"containers": [container("web")]}))));
    h.run_for(Duration::from_secs(3)).await;
    assert!(h.fake.kill_sandbox("p"));
    h.run_for(Duration::from_secs(4)).await;
    let attempts: Vec<String> =
        h.fake.calls().into_iter().filter(|c| c.method == "run_sandbox").map(|c| c.detail).collect();
    assert_eq!(attempts, vec!["attempt=0", "attempt=1"]);
    assert!(h.has_event("SandboxChanged", "Pod sandbox changed"));
    let status = h.status("p");
    assert_eq!(status.phase.as_deref(), Some("Running"));
    assert_eq!(main_status(&status, "web").restart_count, 1);
}

#[tokio::test(start_paused = true)]
async fn a_missing_config_map_is_a_create_container_config_error_and_other_pods_run() {
    let mut h = Harness::new();
    h.fake.add_image("app:1");
    let bad = json!({"name": "web", "image": "app:1", "env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "nope", "key": "k"}}}]});
    h.workers.update(Arc::new(must_pod("bad", json!({"containers": [bad]}))));
    let vol = json!({"volumes": [{"name": "cfg", "configMap": {"name": "absent"}}], "containers": [{"name": "web", "image": "app:1", "volumeMounts": [{"name": "cfg", "mountPath": "/cfg"}]}]});
    h.workers.update(Arc::new(must_pod("badvol", vol)));
    h.workers.update(Arc::new(must_pod("good", json!({"containers": [container("web")]}))));
    h.run_for(Duration::from_secs(3)).await;

    let status = h.status("bad");
    assert_eq!(waiting_reason(&status, "web").as_deref(), Some("CreateContainerConfigError"));
    let message = main_status(&status, "web").state.and_then(|s| s.waiting).and_then(|w| w.message);
    assert_eq!(message.as_deref(), Some("configmap \"nope\" not found"));
    assert_eq!(status.phase.as_deref(), Some("Pending"));
    assert!(h.has_event("FailedMount", "MountVolume.SetUp failed for volume \"cfg\" : configmap \"absent\" not found"));
    assert_eq!(waiting_reason(&h.status("badvol"), "web").as_deref(), Some("ContainerCreating"));
    assert_eq!(h.status("good").phase.as_deref(), Some("Running"));
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_updates_keeps_only_the_newest_and_a_full_output_channel_only_slows_workers() {
    // An output channel of one that nobody reads for a while.
    let mut h = Harness::with_runtime(Arc::new(FakeRuntime::new()), 1);
    h.fake.add_image("app:1");
    let pod = must_pod("p", json!({"containers": [container("web")]}));
    for i in 0..1000 {
        let mut version = pod.clone();
        version.metadata.resource_version = Some(i.to_string());
        h.workers.update(Arc::new(version));
    }
    h.workers.update(Arc::new(must_deleted(pod.clone(), 0)));
    for i in 0..50 {
        h.workers.update(Arc::new(must_pod(&format!("other-{i}"), json!({"containers": [container("web")]}))));
    }
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(h.rx.len(), 1, "the output channel is bounded");
    h.run_for(Duration::from_secs(30)).await;

    // The deleted version won: p was never left running, and it ended.
    let terminated =
        h.outputs.iter().filter(|(_, o)| matches!(o, WorkerOutput::Terminated { uid, .. } if uid == "uid-p")).count();
    assert_eq!(terminated, 1);
    let running_p = h.fake.containers().iter().any(|c| c.labels.get(LABEL_POD_NAME).map(String::as_str) == Some("p"));
    assert!(!running_p);
    assert_eq!(h.workers.len(), 50);
    // A late update for the torn-down pod does not start it again.
    h.workers.update(Arc::new(pod));
    h.run_for(Duration::from_secs(3)).await;
    assert_eq!(h.workers.len(), 50);
}

#[test]
fn grace_only_shortens_once_terminating() {
    let pod = must_pod("p", json!({"terminationGracePeriodSeconds": 45, "containers": [container("web")]}));
    let state = step(State::Syncing, Input::Desired(&pod));
    assert_eq!(state, State::Syncing);
    let state = step(state, Input::Desired(&must_deleted(pod.clone(), 30)));
    assert_eq!(state, State::Terminating { grace: Duration::from_secs(30) });
    let state = step(state, Input::Desired(&must_deleted(pod.clone(), 60)));
    assert_eq!(state, State::Terminating { grace: Duration::from_secs(30) });
    let state = step(state, Input::Desired(&must_deleted(pod.clone(), 0)));
    assert_eq!(state, State::Terminating { grace: Duration::ZERO });
    assert_eq!(step(state, Input::TornDown), State::Terminated);
    assert_eq!(step(State::Syncing, Input::Removed(&pod)), State::Terminating { grace: Duration::from_secs(45) });
}

#[test]
fn env_resolves_literals_downward_api_config_maps_secrets_services_and_var_expansion() {
    let pod = must_pod(
        "p",
        json!({
            "nodeName": "node-1",
            "serviceAccountName": "robot",
            "containers": [{
                "name": "web", "image": "app:1",
                "command": ["run", "--mode=$(MODE)", "$$(MODE)", "$(UNKNOWN)"],
                "args": ["--pass=$(PASSWORD)"],
                "resources": {"limits": {"cpu": "500m", "memory": "128Mi"}, "requests": {"cpu": "250m"}},
                "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "CFG_"}],
                "env": [
                    {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "mode"}}},
                    {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
                    {"name": "GREETING", "value": "hi $(POD_NAME) at $(WEB_SERVICE_HOST)"},
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "LATE", "value": "$(POD_NAME)"},
                    {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                    {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                    {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
                    {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
                    {"name": "CPU_M", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1m"}}},
                    {"name": "MEM_MI", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
                    {"name": "REQ_CPU", "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu"}}},
                    {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "absent", "key": "k", "optional": true}}},
                ],
            }],
        }),
    );
    let config = WorkerConfig { node_name: "node-1".into(), host_ip: "192.168.1.5".into(), ..WorkerConfig::default() };
    let resources = resources();
    let c = pod.spec.as_ref().map(|s| s.containers[0].clone()).unwrap_or_default();
    let inputs = spec::ContainerInputs {
        config: &config,
        resources: &resources,
        pod_ip: "10.88.0.7",
        mounts: vec![],
        attempt: 2,
    };
    let spec = match spec::container_spec(&pod, &c, inputs) {
        Ok(s) => s,
        Err(e) => panic!("{e}"),
    };
    let env: BTreeMap<String, String> = spec.envs.iter().cloned().collect();
    let get = |k: &str| env.get(k).cloned().unwrap_or_else(|| format!("<missing {k}>"));
    assert_eq!(get("CFG_mode"), "fast");
    assert_eq!(get("CFG_level"), "3");
    assert_eq!(get("MODE"), "fast");
    assert_eq!(get("PASSWORD"), "hunter2");
    assert_eq!(get("GREETING"), "hi $(POD_NAME) at 10.0.0.10", "only variables defined before expand");
    assert_eq!(get("LATE"), "p");
    assert_eq!(get("APP"), "web");
    assert_eq!(get("NODE"), "node-1");
    assert_eq!(get("SA"), "robot");
    assert_eq!(get("IP"), "10.88.0.7");
    assert_eq!(get("HOST"), "192.168.1.5");
    assert_eq!(get("CPU_M"), "500");
    assert_eq!(get("MEM_MI"), "128");
    assert_eq!(get("REQ_CPU"), "1", "rounded up to whole cores");
    assert_eq!(get("WEB_SERVICE_PORT"), "80");
    assert!(!env.contains_key("OPT"));
    assert_eq!(spec.command, vec!["run", "--mode=fast", "$(MODE)", "$(UNKNOWN)"]);
    assert_eq!(spec.args, vec!["--pass=hunter2"]);
    assert_eq!(spec.log_path, "web/2.log");
    assert_eq!(spec.resources.cpu_quota, 50_000);
    assert_eq!(spec.resources.cpu_period, 100_000);
    assert_eq!(spec.resources.cpu_shares, 256);
    assert_eq!(spec.resources.memory_limit_in_bytes, 128 << 20);
    assert_eq!(spec.labels.get(crate::runtime::LABEL_NODE).map(String::as_str), Some("node-1"));
    assert_eq!(spec.labels.get(LABEL_CONTAINER_NAME).map(String::as_str), Some("web"));
}

#[test]
fn the_sandbox_spec_has_labels_log_directory_dns_and_host_ports() {
    let pod = must_pod(
        "p",
        json!({
            "hostname": "web-0",
            "dnsConfig": {"nameservers": ["1.1.1.1"], "searches": ["corp"], "options": [{"name": "ndots", "value": "2"}]},
            "containers": [{"name": "web", "image": "app:1", "ports": [{"containerPort": 80, "hostPort": 8080}, {"containerPort": 81}],
                "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}],
        }),
    );
    let config = WorkerConfig {
        node_name: "node-1".into(),
        pod_log_dir: "/var/log/pods".into(),
        cluster_dns: vec!["10.96.0.10".into()],
        ..WorkerConfig::default()
    };
    let s = spec::sandbox_spec(&config, &pod, 3);
    assert_eq!(s.attempt, 3);
    assert_eq!(s.hostname, "web-0");
    assert_eq!(s.log_directory, "/var/log/pods/ns_p_uid-p");
    assert_eq!(s.labels.get("app").map(String::as_str), Some("web"));
    assert_eq!(s.labels.get(crate::runtime::LABEL_POD_UID).map(String::as_str), Some("uid-p"));
    assert_eq!(s.dns.servers, vec!["10.96.0.10", "1.1.1.1"]);
    assert_eq!(s.dns.searches, vec!["ns.svc.cluster.local", "svc.cluster.local", "cluster.local", "corp"]);
    assert_eq!(s.dns.options, vec!["ndots:2"]);
    assert_eq!(s.port_mappings.len(), 1);
    assert_eq!((s.port_mappings[0].container_port, s.port_mappings[0].host_port), (80, 8080));
    assert_eq!(s.cgroup_parent, "/kubepods/poduid-p", "Guaranteed pods sit right under the root");
    let on_host =
        must_pod("h", json!({"hostNetwork": true, "hostname": "x", "hostPID": true, "containers": [container("web")]}));
    let h = spec::sandbox_spec(&config, &on_host, 0);
    assert_eq!(
        (h.hostname.as_str(), h.host_network, h.host_pid, h.host_ipc),
        ("", true, true, false),
        "the host's name"
    );

    let host = WorkerConfig { host_dns: parse_resolv_conf("nameserver 9.9.9.9\nsearch home\n"), ..config.clone() };
    let default_policy = must_pod("d", json!({"dnsPolicy": "Default", "containers": [container("web")]}));
    assert_eq!(spec::dns_config(&host, &default_policy).servers, vec!["9.9.9.9"]);
    let none = must_pod(
        "n",
        json!({"dnsPolicy": "None", "dnsConfig": {"nameservers": ["8.8.8.8"]}, "containers": [container("web")]}),
    );
    let dns = spec::dns_config(&host, &none);
    assert_eq!((dns.servers, dns.searches), (vec!["8.8.8.8".to_string()], vec![]));
}

#[test]
fn volumes_are_materialized_under_the_pod_directory_and_mounted_by_volume_mounts() {
    let dir = must_tempdir();
    let host_dir = dir.path().join("host");
    let config = WorkerConfig { pods_dir: dir.path().join("pods"), ..WorkerConfig::default() };
    let pod = must_pod(
        "p",
        json!({
            "volumes": [
                {"name": "scratch", "emptyDir": {}},
                {"name": "ram", "emptyDir": {"medium": "Memory"}},
                {"name": "host", "hostPath": {"path": host_dir.to_string_lossy(), "type": "DirectoryOrCreate"}},
                {"name": "cfg", "configMap": {"name": "settings", "items": [{"key": "mode", "path": "conf/mode.txt"}]}},
                {"name": "sec", "secret": {"secretName": "creds", "defaultMode": 0o400}},
                {"name": "info", "downwardAPI": {"items": [
                    {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                    {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]}},
                {"name": "all", "projected": {"sources": [
                    {"configMap": {"name": "settings"}},
                    {"secret": {"name": "creds"}},
                    {"downwardAPI": {"items": [{"path": "ns", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
                    {"serviceAccountToken": {"path": "token"}}]}},
                {"name": "broken", "secret": {"secretName": "absent"}},
            ],
            "containers": [{"name": "web", "image": "app:1", "volumeMounts": [
                {"name": "scratch", "mountPath": "/scratch", "subPath": "cache"},
                {"name": "cfg", "mountPath": "/etc/app"},
                {"name": "host", "mountPath": "/host", "readOnly": true},
                {"name": "scratch", "mountPath": "/rw"},
            ]}, {"name": "other", "image": "app:1", "volumeMounts": [{"name": "broken", "mountPath": "/x"}]}],
        }),
    );
    let (volumes, errors) = volumes::materialize(&config, &pod, &resources(), "10.88.0.7");
    let errors: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
    assert_eq!(errors, vec!["MountVolume.SetUp failed for volume \"broken\" : secret \"absent\" not found"]);
    let root = dir.path().join("pods/uid-p/volumes");
    let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap_or_else(|e| format!("<{p}: {e}>"));
    assert_eq!(read("kubernetes.io~configmap/cfg/conf/mode.txt"), "fast");
    assert_eq!(read("kubernetes.io~secret/sec/password"), "hunter2");
    use std::os::unix::fs::PermissionsExt;
    let mode =
        std::fs::metadata(root.join("kubernetes.io~secret/sec/password")).map(|m| m.permissions().mode() & 0o777);
    assert_eq!(mode.ok(), Some(0o400));
    assert_eq!(read("kubernetes.io~downward-api/info/labels"), "app=\"web\"\n");
    assert_eq!(read("kubernetes.io~downward-api/info/name"), "p");
    assert_eq!(read("kubernetes.io~projected/all/mode"), "fast");
    assert_eq!(read("kubernetes.io~projected/all/password"), "hunter2");
    assert_eq!(read("kubernetes.io~projected/all/ns"), "ns");
    assert_eq!(read("kubernetes.io~projected/all/token"), "jwt-of-p-for-api");
    // Without a token the volume is not made, and says why.
    let refused = Resources { no_tokens: true, ..resources() };
    let (_, errors) = volumes::materialize(&config, &pod, &refused, "10.88.0.7");
    let errors: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
    assert!(
        errors.iter().any(|e| e.contains("volume \"all\" : failed to fetch token: serviceaccount \"default\"")),
        "{errors:?}"
    );
    assert!(root.join("kubernetes.io~empty-dir/ram").is_dir());
    assert!(host_dir.is_dir());

    let spec = pod.spec.clone().unwrap_or_default();
    let mounts = match volumes::mounts(&spec.containers[0], &volumes) {
        Ok(m) => m,
        Err(e) => panic!("{e}"),
    };
    let summary: Vec<(String, bool)> = mounts.iter().map(|m| (m.container_path.clone(), m.readonly)).collect();
    assert_eq!(
        summary,
        vec![("/scratch".into(), false), ("/etc/app".into(), true), ("/host".into(), true), ("/rw".into(), false)]
    );
    assert!(mounts[0].host_path.ends_with("kubernetes.io~empty-dir/scratch/cache"));
    assert!(root.join("kubernetes.io~empty-dir/scratch/cache").is_dir(), "a missing subPath is created");
    assert_eq!(
        volumes::mounts(&spec.containers[1], &volumes).map(|_| ()),
        Err(spec::ConfigError::VolumeUnavailable("broken".into()))
    );
    assert!(volumes::cleanup(&config, &pod).is_ok());
    assert!(!dir.path().join("pods/uid-p").exists());
}

#[test]
fn status_phase_and_conditions_for_representative_cases() {
    use crate::runtime::{ContainerStatus as RtStatus, SandboxStatus};
    use status::{pod_status, Observed, WorkerView};
    let pod = must_pod("p", json!({"restartPolicy": "Never", "containers": [container("a"), container("b")]}));
    let view = WorkerView { host_ip: "192.168.1.5", initialized: true, ..WorkerView::default() };
    // No sandbox yet: Pending, containers ContainerCreating.
    let pending = pod_status(&pod, &Observed::default(), &view, None);
    assert_eq!(pending.phase.as_deref(), Some("Pending"));
    assert_eq!(waiting_reason(&pending, "a").as_deref(), Some("ContainerCreating"));
    assert_eq!(condition(&pending, "PodReadyToStartContainers"), "False");
    assert_eq!(pending.pod_ip, None);

    let sandbox = SandboxStatus {
        id: "sb".into(),
        state: SandboxState::Ready,
        ip: Some("10.88.0.2".into()),
        created_at: 1,
        attempt: 0,
        labels: BTreeMap::new(),
    };
    let rt = |id: &str, name: &str, state: ContainerState, code: i32| RtStatus {
        id: id.into(),
        sandbox_id: "sb".into(),
        name: name.into(),
        attempt: 0,
        state,
        created_at: 1,
        started_at: 2,
        finished_at: if state == ContainerState::Exited { 3 } else { 0 },
        exit_code: code,
        reason: String::new(),
        message: String::new(),
        image: "app:1".into(),
        image_ref: "sha256:abc".into(),
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        log_path: String::new(),
    };
    let observed = Observed {
        sandboxes: vec![sandbox.clone()],
        containers: vec![rt("1", "a", ContainerState::Running, 0), rt("2", "b", ContainerState::Exited, 0)],
    };
    let ready = std::collections::HashSet::from(["1".to_string()]);
    let view_ready = WorkerView {
        ready: Some(&ready),
        started: Some(&ready),
        ..WorkerView { host_ip: "192.168.1.5", initialized: true, ..WorkerView::default() }
    };
    let running = pod_status(&pod, &observed, &view_ready, Some(&pending));
    assert_eq!(running.phase.as_deref(), Some("Running"));
    assert_eq!(condition(&running, "ContainersReady"), "False", "b is not running");
    let ready_condition = running.conditions.iter().flatten().find(|c| c.type_ == "Ready").cloned().unwrap_or_default();
    assert_eq!(ready_condition.message.as_deref(), Some("containers with unready status: [b]"));
    assert_eq!(running.pod_ips.as_ref().map(|ips| ips[0].ip.clone()), Some("10.88.0.2".into()));
    assert_eq!(
        main_status(&running, "b").state.and_then(|s| s.terminated).and_then(|t| t.reason),
        Some("Completed".into())
    );

    let done = Observed {
        sandboxes: vec![sandbox.clone()],
        containers: vec![rt("1", "a", ContainerState::Exited, 0), rt("2", "b", ContainerState::Exited, 0)],
    };
    assert_eq!(pod_status(&pod, &done, &view, None).phase.as_deref(), Some("Succeeded"));
    let failed = Observed {
        sandboxes: vec![sandbox],
        containers: vec![rt("1", "a", ContainerState::Exited, 0), rt("2", "b", ContainerState::Exited, 1)],
    };
    let failed = pod_status(&pod, &failed, &view, None);
    assert_eq!(failed.phase.as_deref(), Some("Failed"));
    assert_eq!(condition(&failed, "Ready"), "False");
    // A transition time is kept while the condition holds.
    let again = pod_status(&pod, &Observed::default(), &view, Some(&pending));
    assert_eq!(again, pending);
}

#[tokio::test(start_paused = true)]
async fn failed_runtime_calls_are_reported_and_retried() {
    let mut h = Harness::new();
    h.fake.add_image("app:1");
    h.fake.fail_next("run_sandbox", crate::runtime::RuntimeError::Unavailable("socket gone".into()));
    h.workers.update(Arc::new(must_pod("p", json!({"containers": [container("web")]}))));
    let sandboxes = |h: &Harness| h.fake.call_names().iter().filter(|c| c.starts_with("run_sandbox")).count();
    h.run_for(Duration::from_secs(8)).await;
    assert!(h.has_event(
        "FailedCreatePodSandBox",
        "Failed to create pod sandbox: container runtime unavailable: socket gone"
    ));
    // Tried again after the pod worker's 10 s back-off, not every sync.
    assert_eq!(sandboxes(&h), 1, "{:?}", h.fake.call_names());
    h.run_for(Duration::from_secs(4)).await;
    assert_eq!(sandboxes(&h), 2);
    assert_eq!(h.status("p").phase.as_deref(), Some("Running"));

    h.fake.fail_next("create_container", crate::runtime::RuntimeError::Failed("no such binary".into()));
    h.workers.update(Arc::new(must_pod("q", json!({"containers": [container("web")]}))));
    h.run_for(Duration::from_secs(2)).await;
    assert!(h.has_event("Failed", "Error: no such binary"));
    assert_eq!(waiting_reason(&h.status("q"), "web").as_deref(), Some("CreateContainerError"));
    h.run_for(Duration::from_secs(10)).await;
    assert_eq!(h.status("q").phase.as_deref(), Some("Running"), "retried after the back-off");
}

#[tokio::test(start_paused = true)]
async fn an_oom_killed_container_shows_its_reason_in_last_state() {
    let mut h = Harness::new();
    h.fake.add_image("app:1");
    h.workers.update(Arc::new(must_pod("p", json!({"containers": [container("web")]}))));
    h.run_for(Duration::from_secs(2)).await;
    assert!(h.fake.exit_container("p", "web", 137, "OOMKilled"));
    h.run_for(Duration::from_secs(2)).await;
    let web = main_status(&h.status("p"), "web");
    assert_eq!(web.restart_count, 1);
    let last = web.last_state.and_then(|s| s.terminated).map(|t| (t.exit_code, t.reason));
    assert_eq!(last, Some((137, Some("OOMKilled".into()))));
}

#[tokio::test(start_paused = true)]
async fn a_failing_post_start_hook_kills_the_container_and_a_sleep_pre_stop_delays_the_stop() {
    let mut h = Harness::new();
    h.fake.add_image("app:1");
    h.fake.set_exec_result(&["hook"], failing());
    let hooked = json!({"name": "web", "image": "app:1", "lifecycle": {"postStart": {"exec": {"command": ["hook"]}}}});
    h.workers.update(Arc::new(must_pod("p", json!({"containers": [hooked]}))));
    h.run_for(Duration::from_secs(3)).await;
    assert!(h.has_event("FailedPostStartHook", "PostStartHook failed: command [\"hook\"] exited with 1"));
    assert!(h.has_event("Killing", "FailedPostStartHook"));
    assert!(h.starts("web").len() >= 2, "restarted per restartPolicy Always");

    let sleepy = json!({"name": "db", "image": "app:1", "lifecycle": {"preStop": {"sleep": {"seconds": 5}}}});
    let pod = must_pod("q", json!({"terminationGracePeriodSeconds": 12, "containers": [sleepy]}));
    h.workers.update(Arc::new(pod.clone()));
    h.run_for(Duration::from_secs(2)).await;
    let deleted_at = Instant::now();
    h.workers.update(Arc::new(must_deleted(pod, 12)));
    h.run_for(Duration::from_secs(10)).await;
    let stop = h.fake.calls().into_iter().find(|c| c.method == "stop_container" && c.target == "db");
    let stop = stop.map(|c| (c.at.duration_since(deleted_at).as_secs(), c.detail));
    assert_eq!(stop, Some((5, "timeout=7".to_string())), "stopped after the 5 s sleep with the 7 s left");
}

#[tokio::test(start_paused = true)]
async fn adoption_ignores_what_another_node_made() {
    let fake = Arc::new(FakeRuntime::new());
    let other = crate::runtime::SandboxSpec {
        name: "theirs".into(),
        labels: BTreeMap::from([
            (crate::runtime::LABEL_NODE.to_string(), "node-2".to_string()),
            (crate::runtime::LABEL_POD_UID.to_string(), "uid-theirs".to_string()),
        ]),
        ..crate::runtime::SandboxSpec::default()
    };
    assert!(fake.run_sandbox(&other).await.is_ok());
    let h = Harness::with_runtime(fake.clone(), 8);
    assert_eq!(h.workers.adopt().await, Ok(vec![]));
    assert_eq!(h.workers.forget_unknown().await, Ok(vec![]));
    assert_eq!(fake.sandboxes().len(), 1, "another agent's sandbox is left alone");
}

#[tokio::test(start_paused = true)]
async fn a_probe_slower_than_its_timeout_fails() {
    let mut h = Harness::new();
    h.fake.add_image("app:1");
    h.fake.set_exec_delay(&["slow"], Duration::from_secs(3));
    let web =
        json!({"name": "web", "image": "app:1", "readinessProbe": exec_probe("slow", json!({"timeoutSeconds": 2}))});
    let fast =
        json!({"name": "web", "image": "app:1", "readinessProbe": exec_probe("slow", json!({"timeoutSeconds": 4}))});
    h.workers.update(Arc::new(must_pod("p", json!({"containers": [web]}))));
    h.workers.update(Arc::new(must_pod("q", json!({"containers": [fast]}))));
    h.run_for(Duration::from_secs(12)).await;
    assert_eq!(condition(&h.status("p"), "Ready"), "False");
    assert!(h.has_event("Unhealthy", "Readiness probe failed"));
    assert_eq!(condition(&h.status("q"), "Ready"), "True", "within its 4 s timeout");
}

#[tokio::test(start_paused = true)]
async fn a_changed_image_restarts_the_container_with_it() {
    let mut h = Harness::new();
    h.fake.add_image("app:1");
    h.fake.add_image("app:2");
    let pod = must_pod("p", json!({"restartPolicy": "Never", "containers": [container("web")]}));
    h.workers.update(Arc::new(pod.clone()));
    h.run_for(Duration::from_secs(3)).await;
    let mut changed = pod;
    if let Some(spec) = changed.spec.as_mut() {
        spec.containers[0].image = Some("app:2".into());
    }
    h.workers.update(Arc::new(changed));
    h.run_for(Duration::from_secs(3)).await;
    assert!(h.has_event("Killing", "Container web definition changed, will be restarted"));
    let web = main_status(&h.status("p"), "web");
    assert_eq!((web.image.as_str(), web.restart_count), ("app:2", 1));
    assert!(web.state.and_then(|s| s.running).is_some());
    assert_eq!(h.starts("web").len(), 2, "once, not again on the next syncs");
}

#[tokio::test(start_paused = true)]
async fn a_pod_recorded_as_succeeded_is_never_run_again() {
    let mut h = Harness::new();
    h.fake.add_image("app:1");
    let mut pod = must_pod("done", json!({"restartPolicy": "OnFailure", "containers": [container("web")]}));
    pod.status = Some(PodStatus { phase: Some("Succeeded".into()), ..PodStatus::default() });
    h.workers.update(Arc::new(pod));
    h.run_for(Duration::from_secs(5)).await;
    assert!(h.fake.sandboxes().is_empty());
    let statuses = h.outputs.iter().filter(|(_, o)| matches!(o, WorkerOutput::Status { .. })).count();
    assert_eq!(statuses, 0, "no status that would take the phase back");
}

#[tokio::test(start_paused = true)]
async fn a_force_delete_during_a_graceful_one_cuts_the_grace_short() {
    let mut h = Harness::new();
    h.fake.add_image("app:1");
    h.fake.ignore_sigterm("web");
    let pod = must_pod("p", json!({"containers": [container("web")]}));
    h.workers.update(Arc::new(pod.clone()));
    h.run_for(Duration::from_secs(2)).await;
    let deleted_at = Instant::now();
    h.workers.update(Arc::new(must_deleted(pod.clone(), 60)));
    h.run_for(Duration::from_secs(5)).await;
    h.workers.update(Arc::new(must_deleted(pod, 0)));
    h.run_for(Duration::from_secs(10)).await;
    let terminated_at =
        h.outputs.iter().find_map(|(at, o)| matches!(o, WorkerOutput::Terminated { .. }).then_some(*at));
    let took = terminated_at.map(|t| t.duration_since(deleted_at).as_secs());
    assert!(took.is_some_and(|s| (5..=8).contains(&s)), "took {took:?}, not the 60 s grace");
    let timeouts: Vec<String> =
        h.fake.calls().into_iter().filter(|c| c.method == "stop_container").map(|c| c.detail).collect();
    assert_eq!(timeouts, vec!["timeout=60", "timeout=2"], "the second stop has the 2 s floor");
    assert!(h.fake.containers().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_debug_container_waits_for_its_target_without_holding_up_the_targets_restart() {
    let mut h = Harness::new();
    h.fake.add_image("app:1");
    h.fake.exit_on_start("web", Some((1, "Error")));
    let debugger = json!({"name": "debugger", "image": "app:1", "targetContainerName": "web"});
    let pod = must_pod("p", json!({"containers": [container("web")], "ephemeralContainers": [debugger]}));
    h.workers.update(Arc::new(pod));
    h.run_for(Duration::from_secs(30)).await;

    let starts = |h: &Harness, name: &str| {
        let call = format!("start_container {name}");
        h.fake.call_names().into_iter().filter(|c| *c == call).count()
    };
    assert!(starts(&h, "web") >= 2, "the crashing target is restarted: {:?}", h.fake.call_names());
    assert_eq!(starts(&h, "debugger"), 0, "the debugger waits while its target is down");
    let status = h.status("p");
    let waiting = status.ephemeral_container_statuses.iter().flatten().find(|c| c.name == "debugger");
    let waiting = waiting.and_then(|c| c.state.clone()).and_then(|s| s.waiting).and_then(|w| w.message);
    assert_eq!(waiting.as_deref(), Some("target container \"web\" is not running"));

    h.fake.exit_on_start("web", None);
    h.run_for(Duration::from_secs(60)).await;
    assert_eq!(starts(&h, "debugger"), 1, "the debugger starts once its target runs");
    let created = h.fake.calls().into_iter().find(|c| c.method == "create_container" && c.target == "debugger");
    let target = h.fake.containers().into_iter().find(|c| c.name == "web" && c.state == ContainerState::Running);
    let target = target.map(|t| t.id).unwrap_or_default();
    assert_eq!(created.map(|c| c.detail), Some(format!("attempt=0 pid_target={target}")));
}

#[tokio::test(start_paused = true)]
async fn a_pod_with_an_unsafe_sysctl_is_rejected_and_a_safe_one_reaches_the_sandbox() {
    let mut h = Harness::new();
    h.fake.add_image("app:1");
    let sysctl = |name: &str| json!({"securityContext": {"sysctls": [{"name": name, "value": "1"}]}, "containers": [container("web")]});
    h.workers.update(Arc::new(must_pod("unsafe", sysctl("kernel.msgmax"))));
    h.workers.update(Arc::new(must_pod("safe", sysctl("net.ipv4.tcp_syncookies"))));
    h.run_for(Duration::from_secs(5)).await;

    let rejected = h.status("unsafe");
    assert_eq!(rejected.phase.as_deref(), Some("Failed"));
    assert_eq!(rejected.reason.as_deref(), Some("SysctlForbidden"));
    let message = "Pod was rejected: forbidden sysctl: \"kernel.msgmax\" not allowlisted";
    assert_eq!(rejected.message.as_deref(), Some(message));
    assert!(h.has_event("SysctlForbidden", message));
    let sandboxes = h.fake.call_names().iter().filter(|c| c.starts_with("run_sandbox")).count();
    assert_eq!(sandboxes, 1, "only the safe pod gets a sandbox: {:?}", h.fake.call_names());
    assert_eq!(h.status("safe").phase.as_deref(), Some("Running"));
}
