//! Controller managers and schedulers as real processes beside a test
//! cluster, and a stand-in for the node agents: a task that gives pods the status a
//! kubelet would (Running and Ready, or Succeeded), since these tests run
//! no node.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};
use skiff_api::{resources, Kind, Reason};
use skiff_client::resources::EventType;
use skiff_client::resources::{ListParams, WatchParams};
use skiff_client::Client;

use super::{free_port, Cluster, SKIFF};

/// One `skiff controller-manager` or `skiff scheduler` process.
pub struct Component {
    pub identity: String,
    pub http: String,
    pub log: PathBuf,
    child: Option<Child>,
}

/// Leader election fast enough for tests: a dead leader's lease lapses
/// within 4 s.
pub const FAST_ELECTION: &[&str] = &[
    "--leader-elect-lease-duration",
    "4s",
    "--leader-elect-renew-deadline",
    "3s",
    "--leader-elect-retry-period",
    "500ms",
];

pub type ControllerManager = Component;

impl Component {
    /// Starts `skiff controller-manager` against the running members of
    /// `cluster`, logging to `<identity>.log` in the cluster's directory.
    /// On a secured cluster it signs in as Kubernetes' controller manager
    /// (`system:kube-controller-manager`).
    pub fn spawn(cluster: &Cluster, identity: &str, extra: &[&str]) -> Component {
        Component::start("controller-manager", skiff::server::CONTROLLER_MANAGER_USER, cluster, identity, extra)
    }

    /// Starts `skiff scheduler` likewise (`system:kube-scheduler`).
    pub fn scheduler(cluster: &Cluster, identity: &str, extra: &[&str]) -> Component {
        Component::start("scheduler", skiff::server::SCHEDULER_USER, cluster, identity, extra)
    }

    fn start(program: &str, user: &str, cluster: &Cluster, identity: &str, extra: &[&str]) -> Component {
        let http = format!("127.0.0.1:{}", free_port());
        let log = cluster.root.path().join(format!("{identity}.log"));
        let out = std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap();
        let child = Command::new(SKIFF)
            .args([program, "--server", &cluster.endpoints(), "--identity", identity, "--http-listen", &http])
            .args(FAST_ELECTION)
            .args(cluster.component_flags(&format!("{program}-{identity}"), user, &[]))
            .args(extra)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        Component { identity: identity.into(), http, log, child: Some(child) }
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The body of `GET /metrics`, or empty when it does not answer.
    pub fn metrics(&self) -> String {
        let out =
            Command::new("curl").args(["-s", "--max-time", "2", &format!("http://{}/metrics", self.http)]).output();
        out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default()
    }
}

impl Drop for Component {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What the stand-in kubelet makes of a pod.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PodFate {
    /// Running and Ready (a long-running server).
    Ready,
    /// Ran to completion with exit code 0.
    Succeeded,
    /// Left alone.
    Pending,
}

/// Runs until dropped: every pod that `fate` gives a status gets it, once.
pub struct FakeKubelet {
    task: tokio::task::JoinHandle<()>,
}

impl FakeKubelet {
    /// Settles pods through `client` (the cluster's resource client).
    pub fn start(client: Client, fate: impl Fn(&Value) -> PodFate + Send + Sync + 'static) -> FakeKubelet {
        FakeKubelet { task: tokio::spawn(async move { run_kubelet(client, fate).await }) }
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn run_kubelet(client: Client, fate: impl Fn(&Value) -> PodFate) {
    let pods = resources::of(Kind::Pod);
    let mut n = 0u32;
    loop {
        let Ok(list) = client.list(pods, "", &ListParams::default()).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        for pod in &list.items {
            settle(&client, pod, &fate, &mut n).await;
        }
        let params = WatchParams { resource_version: list.resource_version.clone(), ..Default::default() };
        let Ok(mut events) = client.watch(pods, "", &params).await else { continue };
        while let Some(Ok(event)) = events.next().await {
            if matches!(event.kind, EventType::Added | EventType::Modified) {
                settle(&client, &event.object, &fate, &mut n).await;
            }
        }
    }
}

/// Gives `pod` the status its fate calls for, unless it has it already.
async fn settle(client: &Client, pod: &Value, fate: &impl Fn(&Value) -> PodFate, n: &mut u32) {
    if pod["metadata"]["deletionTimestamp"].is_string() {
        // A kubelet ends a deleted pod's containers, then removes the pod.
        let name = pod["metadata"]["name"].as_str().unwrap_or_default();
        let ns = pod["metadata"]["namespace"].as_str().unwrap_or_default();
        let params = skiff_client::resources::DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
        let _ = client.delete(resources::of(Kind::Pod), ns, name, &params).await;
        return;
    }
    let phase = pod["status"]["phase"].as_str().unwrap_or("Pending");
    let wanted = fate(pod);
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let mut updated = pod.clone();
    match wanted {
        PodFate::Ready if phase != "Running" => {
            *n += 1;
            updated["status"] = json!({
                "phase": "Running",
                "podIP": format!("10.244.{}.{}", (*n / 250) % 250, *n % 250 + 2),
                "startTime": now,
                "conditions": [
                    {"type": "Ready", "status": "True", "lastTransitionTime": now},
                    {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                ],
                "containerStatuses": containers(pod, true, None),
            });
        }
        PodFate::Succeeded if phase != "Succeeded" => {
            updated["status"] = json!({
                "phase": "Succeeded",
                "startTime": now,
                "conditions": [{"type": "Ready", "status": "False", "reason": "PodCompleted"}],
                "containerStatuses": containers(pod, false, Some(0)),
            });
        }
        _ => return,
    }
    match client.update_status(resources::of(Kind::Pod), &updated).await {
        Ok(_) => {}
        // A newer version is on its way through the watch; it is settled then.
        Err(e) if e.is(Reason::Conflict) || e.is(Reason::NotFound) => {}
        Err(e) => eprintln!("fake kubelet: {e}"),
    }
}

fn containers(pod: &Value, running: bool, exit_code: Option<i32>) -> Value {
    let names: Vec<&str> = pod["spec"]["containers"]
        .as_array()
        .map(|cs| cs.iter().filter_map(|c| c["name"].as_str()).collect())
        .unwrap_or_default();
    let state = match exit_code {
        Some(code) => json!({"terminated": {"exitCode": code, "reason": "Completed"}}),
        None => json!({"running": {"startedAt": chrono::Utc::now().to_rfc3339()}}),
    };
    names
        .iter()
        .map(|n| json!({"name": n, "ready": running, "restartCount": 0, "image": "", "imageID": "", "state": state}))
        .collect()
}
