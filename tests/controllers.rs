//! The controller manager as real processes: three masters, two
//! `skiff controller-manager`s (one active through its Lease), driven with
//! the real kubectl. A stand-in kubelet gives pods their status, since no
//! node agent runs here.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};
use skiff_api::{resources, Kind};
use skiff_client::resources::EventType;
use skiff_client::resources::{ListParams, WatchParams};
use skiff_client::Client;
use support::controllers::*;
use support::kubectl::*;
use support::*;

/// A cluster with two controller managers and a stand-in kubelet.
struct Setup {
    cluster: Cluster,
    managers: Vec<ControllerManager>,
    api: Api,
    _kubelet: FakeKubelet,
}

impl Setup {
    async fn new(fate: impl Fn(&Value) -> PodFate + Send + Sync + 'static, extra: &[&str]) -> Setup {
        let cluster = Cluster::spawn(3).await;
        let api = cluster.api(1);
        let managers = (1..=2).map(|i| ControllerManager::spawn(&cluster, &format!("cm-{i}"), extra)).collect();
        let kubelet = FakeKubelet::start(cluster.client(), fate);
        let setup = Setup { cluster, managers, api, _kubelet: kubelet };
        setup
            .must_eventually("namespace default exists", Duration::from_secs(30), || {
                let o = kubectl(&setup.api, &["get", "ns", "default", "-o", "name"]);
                o.status.success().then_some(())
            })
            .await;
        setup
    }

    fn kubectl(&self, args: &[&str]) -> String {
        ok(kubectl(&self.api, args))
    }

    fn apply(&self, manifest: &str) -> String {
        ok(kubectl_stdin(&self.api, &["apply", "-f", "-"], manifest))
    }

    fn client(&self) -> Client {
        self.cluster.client()
    }

    /// The identity holding the controller manager's Lease.
    fn active_manager(&self) -> String {
        let out = kubectl(
            &self.api,
            &["get", "lease", "-n", "kube-system", "kube-controller-manager", "-o", "jsonpath={.spec.holderIdentity}"],
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Polls `check` until it returns something, failing the test with the
    /// controller managers' logs after `within`.
    async fn must_eventually<T>(&self, what: &str, within: Duration, mut check: impl FnMut() -> Option<T>) -> T {
        let deadline = Instant::now() + within;
        loop {
            if let Some(v) = check() {
                return v;
            }
            if Instant::now() > deadline {
                let logs: Vec<String> =
                    self.managers.iter().map(|m| format!("--- {} ---\n{}", m.identity, tail(&m.log(), 60))).collect();
                panic!("{what}: not within {within:?}\n{}", logs.join("\n"));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    fn count(&self, args: &[&str]) -> usize {
        let mut all = args.to_vec();
        all.extend(["-o", "name"]);
        let out = kubectl(&self.api, &all);
        String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.is_empty()).count()
    }
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn deployment(ns: &str, replicas: u32, image: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: web, namespace: {ns}}}\nspec:\n  replicas: {replicas}\n  \
         selector: {{matchLabels: {{app: web}}}}\n  strategy:\n    type: RollingUpdate\n    rollingUpdate: {{maxSurge: 1, \
         maxUnavailable: 1}}\n  template:\n    metadata: {{labels: {{app: web}}}}\n    spec:\n      containers:\n      - \
         name: web\n        image: {image}\n        ports: [{{name: http, containerPort: 80}}]\n"
    )
}

/// Pods seen through one watch over a whole run: the most that existed at
/// once, and the fewest Ready once the first rollout was done.
#[derive(Default)]
struct PodCensus {
    pods: BTreeMap<String, bool>,
    most: usize,
    fewest_ready: Option<usize>,
    counting_ready: bool,
}

impl PodCensus {
    fn observe(&mut self, kind: EventType, pod: &Value) {
        let name = pod["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let ready = pod["status"]["conditions"]
            .as_array()
            .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"));
        match kind {
            EventType::Deleted => {
                self.pods.remove(&name);
            }
            _ if pod["metadata"]["deletionTimestamp"].is_string() => {
                self.pods.remove(&name);
            }
            _ => {
                self.pods.insert(name, ready);
            }
        }
        self.most = self.most.max(self.pods.len());
        if self.counting_ready {
            let ready = self.pods.values().filter(|r| **r).count();
            self.fewest_ready = Some(self.fewest_ready.map_or(ready, |f| f.min(ready)));
        }
    }
}

/// Watches the pods of `ns` into a census until the returned handle is aborted.
async fn census(client: Client, ns: &str) -> (Arc<Mutex<PodCensus>>, tokio::task::JoinHandle<()>) {
    let census = Arc::new(Mutex::new(PodCensus::default()));
    let pods = resources::of(Kind::Pod);
    let list = client.list(pods, ns, &ListParams::default()).await.unwrap();
    for p in &list.items {
        census.lock().unwrap().observe(EventType::Added, p);
    }
    let params = WatchParams { resource_version: list.resource_version, ..Default::default() };
    let mut events = client.watch(pods, ns, &params).await.unwrap();
    let seen = census.clone();
    let task = tokio::spawn(async move {
        while let Some(Ok(e)) = events.next().await {
            seen.lock().unwrap().observe(e.kind, &e.object);
        }
    });
    (census, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_rolls_out_scales_undoes_and_cascades_through_a_controller_manager_failover() {
    let mut s = Setup::new(|_| PodFate::Ready, &[]).await;
    let ns = "shop";
    s.kubectl(&["create", "namespace", ns]);
    let (census, watching) = census(s.client(), ns).await;

    assert_eq!(s.apply(&deployment(ns, 4, "nginx:1.26")), "deployment.apps/web created\n");
    s.kubectl(&["rollout", "status", "deployment/web", "-n", ns, "--timeout=60s"]);
    assert_eq!(s.count(&["get", "rs", "-n", ns]), 1);
    assert_eq!(s.count(&["get", "pods", "-n", ns, "-l", "app=web"]), 4);
    let holder = s.active_manager();
    assert!(holder == "cm-1" || holder == "cm-2", "one manager holds the lease: {holder:?}");
    let lease = s.kubectl(&["get", "lease", "-n", "kube-system"]);
    assert!(lease.contains("kube-controller-manager") && lease.contains(&holder), "{lease}");
    // The ReplicaSet is recorded as the controller manager's in managedFields.
    let path = "jsonpath={.items[0].metadata.managedFields[*].manager}";
    let managers = s.kubectl(&["get", "rs", "-n", ns, "--show-managed-fields", "-o", path]);
    assert!(managers.split_whitespace().any(|m| m == "skiff-controller-manager"), "{managers}");

    // Scale, through the scale subresource as kubectl does it.
    s.kubectl(&["scale", "deployment/web", "-n", ns, "--replicas=6"]);
    s.kubectl(&["rollout", "status", "deployment/web", "-n", ns, "--timeout=60s"]);
    assert_eq!(s.count(&["get", "pods", "-n", ns, "-l", "app=web"]), 6);

    // A rolling update, with the active manager killed in the middle of it.
    census.lock().unwrap().counting_ready = true;
    census.lock().unwrap().most = 0;
    s.kubectl(&["set", "image", "deployment/web", "-n", ns, "web=nginx:1.27"]);
    let active = s.managers.iter().position(|m| m.identity == holder).unwrap();
    s.managers[active].kill();
    s.must_eventually("the other manager takes the lease over", Duration::from_secs(30), || {
        let now = s.active_manager();
        (!now.is_empty() && now != holder).then_some(())
    })
    .await;
    s.kubectl(&["rollout", "status", "deployment/web", "-n", ns, "--timeout=90s"]);
    {
        let c = census.lock().unwrap();
        assert!(c.most <= 6 + 1, "never more than replicas + maxSurge pods: saw {}", c.most);
        let fewest = c.fewest_ready.unwrap();
        assert!(fewest >= 6 - 1, "never fewer than replicas - maxUnavailable ready: saw {fewest}");
    }
    let images = s.kubectl(&["get", "pods", "-n", ns, "-o", "jsonpath={.items[*].spec.containers[0].image}"]);
    assert!(images.split_whitespace().all(|i| i == "nginx:1.27") && !images.is_empty(), "{images}");
    let history = s.kubectl(&["rollout", "history", "deployment/web", "-n", ns]);
    assert!(history.contains('1') && history.contains('2'), "two revisions: {history}");

    // Undo, restart, pause and resume.
    s.kubectl(&["rollout", "undo", "deployment/web", "-n", ns]);
    s.kubectl(&["rollout", "status", "deployment/web", "-n", ns, "--timeout=60s"]);
    let image =
        s.kubectl(&["get", "deploy", "web", "-n", ns, "-o", "jsonpath={.spec.template.spec.containers[0].image}"]);
    assert_eq!(image, "nginx:1.26");
    let rs = s.kubectl(&[
        "get",
        "rs",
        "-n",
        ns,
        "-o",
        "jsonpath={.items[*].metadata.annotations.deployment\\.kubernetes\\.io/revision}",
    ]);
    let revisions: BTreeSet<&str> = rs.split_whitespace().collect();
    let detail = format!(
        "{}\n--- deployment template ---\n{}",
        s.kubectl(&[
            "get",
            "rs",
            "-n",
            ns,
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.spec.template}{\"\\n\"}{end}"
        ]),
        s.kubectl(&["get", "deploy", "web", "-n", ns, "-o", "jsonpath={.spec.template}"])
    );
    assert_eq!(revisions, BTreeSet::from(["2", "3"]), "the old ReplicaSet came back as revision 3:\n{detail}");
    s.kubectl(&["rollout", "pause", "deployment/web", "-n", ns]);
    s.kubectl(&["set", "image", "deployment/web", "-n", ns, "web=nginx:1.28"]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(s.count(&["get", "rs", "-n", ns]), 2, "a paused deployment starts no rollout");
    s.kubectl(&["rollout", "resume", "deployment/web", "-n", ns]);
    s.kubectl(&["rollout", "status", "deployment/web", "-n", ns, "--timeout=60s"]);
    s.kubectl(&["rollout", "restart", "deployment/web", "-n", ns]);
    s.kubectl(&["rollout", "status", "deployment/web", "-n", ns, "--timeout=60s"]);
    watching.abort();

    // Deleting the deployment deletes what it owns.
    s.kubectl(&["delete", "deployment", "web", "-n", ns]);
    s.must_eventually("the ReplicaSets and pods are collected", Duration::from_secs(30), || {
        (s.count(&["get", "rs,pods", "-n", ns]) == 0).then_some(())
    })
    .await;

    // Deleting the namespace empties it, then it goes.
    s.kubectl(&["create", "configmap", "left", "-n", ns, "--from-literal=a=b"]);
    s.apply(&deployment(ns, 2, "nginx:1.26"));
    s.kubectl(&["delete", "namespace", ns, "--wait=false"]);
    s.must_eventually("the namespace is gone", Duration::from_secs(60), || {
        let o = kubectl(&s.api, &["get", "namespace", ns]);
        (!o.status.success()).then_some(())
    })
    .await;
    let err = fails(kubectl(&s.api, &["get", "configmap", "left", "-n", ns]));
    assert!(err.contains("NotFound"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_carries_on_when_the_apiserver_leader_is_killed() {
    let mut s = Setup::new(|_| PodFate::Ready, &[]).await;
    let ns = "default";
    s.apply(&deployment(ns, 3, "nginx:1.26"));
    s.kubectl(&["rollout", "status", "deployment/web", "-n", ns, "--timeout=60s"]);
    s.kubectl(&["set", "image", "deployment/web", "-n", ns, "web=nginx:1.27"]);
    let leader = s.cluster.must_leader().await;
    s.cluster.kill(leader);
    s.cluster.must_leader().await;
    s.api = s.cluster.api(s.cluster.running().next().unwrap().id);
    s.kubectl(&["rollout", "status", "deployment/web", "-n", ns, "--timeout=90s"]);
    let images = s.kubectl(&["get", "pods", "-n", ns, "-o", "jsonpath={.items[*].spec.containers[0].image}"]);
    assert!(images.split_whitespace().all(|i| i == "nginx:1.27") && !images.is_empty(), "{images}");
}

fn job(name: &str, completions: u32, parallelism: u32) -> String {
    format!(
        "apiVersion: batch/v1\nkind: Job\nmetadata: {{name: {name}}}\nspec:\n  completions: {completions}\n  parallelism: \
         {parallelism}\n  template:\n    spec:\n      restartPolicy: Never\n      containers: [{{name: work, image: busybox}}]\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_run_to_completion_and_cronjobs_fire() {
    let s = Setup::new(
        |pod| match pod["metadata"]["labels"]["job-name"].is_string() {
            true => PodFate::Succeeded,
            false => PodFate::Ready,
        },
        &[],
    )
    .await;
    s.apply(&job("batch", 5, 2));
    let cron = "apiVersion: batch/v1\nkind: CronJob\nmetadata: {name: tick}\nspec:\n  schedule: '* * * * *'\n  \
                jobTemplate:\n    spec:\n      template:\n        spec:\n          restartPolicy: Never\n          \
                containers: [{name: work, image: busybox}]\n";
    s.apply(cron);
    s.kubectl(&["wait", "--for=condition=complete", "job/batch", "--timeout=60s"]);
    let succeeded = s.kubectl(&["get", "job", "batch", "-o", "jsonpath={.status.succeeded}"]);
    assert_eq!(succeeded, "5");
    assert_eq!(s.count(&["get", "pods", "-l", "job-name=batch"]), 5, "exactly completions pods, none extra");

    // The cron job fires at the next minute and its job completes.
    s.must_eventually("the cron job's job completes", Duration::from_secs(80), || {
        let o = s.kubectl(&["get", "cronjob", "tick", "-o", "jsonpath={.status.lastSuccessfulTime}"]);
        (!o.is_empty()).then_some(())
    })
    .await;
    let jobs = s.kubectl(&["get", "jobs", "-o", "jsonpath={.items[*].metadata.ownerReferences[0].name}"]);
    assert!(jobs.contains("tick"), "{jobs}");

    // Bad input is refused with the field.
    let bad = cron.replace("'* * * * *'", "'61 * * * *'");
    let err = fails(kubectl_stdin(&s.api, &["apply", "-f", "-"], &bad));
    assert!(err.contains("spec.schedule"), "{err}");
}

/// The root CA publisher follows its file: a rotated CA (here one that
/// gained a second certificate, as during a CA rotation) reaches every
/// namespace's `kube-root-ca.crt` without restarting the controller manager.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_root_ca_follows_its_file_when_the_ca_rotates() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.crt");
    std::fs::write(&ca, "first\n").unwrap();
    let s = Setup::new(|_| PodFate::Ready, &["--root-ca-file", ca.to_str().unwrap()]).await;
    s.kubectl(&["create", "namespace", "later"]);
    let published = |ns: &str| {
        let o = kubectl(&s.api, &["get", "configmap", "kube-root-ca.crt", "-n", ns, "-o", "jsonpath={.data.ca\\.crt}"]);
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let everywhere = |want: &str| ["default", "kube-system", "later"].iter().all(|ns| published(ns) == want);
    s.must_eventually("the CA in every namespace", Duration::from_secs(30), || everywhere("first\n").then_some(()))
        .await;
    // Rotated as files are, through a rename.
    let next = dir.path().join("ca.crt.next");
    std::fs::write(&next, "first\nsecond\n").unwrap();
    std::fs::rename(&next, &ca).unwrap();
    s.must_eventually("the rotated CA in every namespace", Duration::from_secs(40), || {
        everywhere("first\nsecond\n").then_some(())
    })
    .await;
    let logs: String = s.managers.iter().map(|m| m.log()).collect();
    assert!(logs.contains("the root CA changed"), "{logs}");
}

fn node(name: &str) -> String {
    format!("apiVersion: v1\nkind: Node\nmetadata: {{name: {name}, labels: {{kubernetes.io/hostname: {name}}}}}\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemonsets_follow_nodes_and_endpoints_follow_readiness() {
    let s = Setup::new(
        |pod| match pod["metadata"]["labels"]["ready"].as_str() {
            Some("no") => PodFate::Pending,
            _ => PodFate::Ready,
        },
        &[],
    )
    .await;
    for n in ["n1", "n2"] {
        s.apply(&node(n));
    }
    let ds = "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: agent}\nspec:\n  selector: {matchLabels: {app: \
              agent}}\n  template:\n    metadata: {labels: {app: agent}}\n    spec:\n      containers: [{name: a, image: \
              busybox}]\n";
    s.apply(ds);
    let pods_on_nodes = || {
        let o = s.kubectl(&[
            "get",
            "pods",
            "-l",
            "app=agent",
            "-o",
            "jsonpath={.items[*].spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchFields[0].values[0]}",
        ]);
        o.split_whitespace().map(str::to_string).collect::<BTreeSet<String>>()
    };
    s.must_eventually("a pod per node", Duration::from_secs(30), || {
        (pods_on_nodes() == BTreeSet::from(["n1".into(), "n2".into()])).then_some(())
    })
    .await;
    s.apply(&node("n3"));
    s.must_eventually("a pod for the node that joined", Duration::from_secs(30), || {
        (pods_on_nodes().len() == 3).then_some(())
    })
    .await;
    s.kubectl(&["delete", "node", "n1"]);
    s.must_eventually("the pod of the node that left goes", Duration::from_secs(60), || {
        (pods_on_nodes() == BTreeSet::from(["n2".into(), "n3".into()])).then_some(())
    })
    .await;

    // Endpoints: two ready pods and one that never gets ready.
    let svc = "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  selector: {app: web}\n  ports: [{name: \
               http, port: 80, targetPort: http}]\n";
    s.apply(svc);
    for (name, ready) in [("web-a", "yes"), ("web-b", "yes"), ("web-c", "no")] {
        s.apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, labels: {{app: web, ready: \"{ready}\"}}}}\nspec:\n  \
             containers: [{{name: web, image: nginx, ports: [{{name: http, containerPort: 8080}}]}}]\n"
        ));
    }
    // web-c gets an IP but is not Ready.
    let client = s.client();
    let pods = resources::of(Kind::Pod);
    let mut c = client.get(pods, "default", "web-c").await.unwrap();
    c["status"] = json!({"phase": "Running", "podIP": "10.244.9.9",
        "conditions": [{"type": "Ready", "status": "False"}]});
    client.update_status(pods, &c).await.unwrap();
    let endpoints = s
        .must_eventually("endpoints list the ready pods", Duration::from_secs(30), || {
            let o = s.kubectl(&["get", "endpoints", "web", "-o", "json"]);
            let ep: Value = serde_json::from_str(&o).ok()?;
            let subset = &ep["subsets"][0];
            (subset["addresses"].as_array().map(Vec::len) == Some(2)
                && subset["notReadyAddresses"].as_array().map(Vec::len) == Some(1))
            .then_some(ep)
        })
        .await;
    assert_eq!(endpoints["subsets"][0]["ports"][0]["port"], 8080, "targetPort resolved by name");
    let slices = s.kubectl(&["get", "endpointslices", "-l", "kubernetes.io/service-name=web", "-o", "json"]);
    let slices: Value = serde_json::from_str(&slices).unwrap();
    let endpoints: Vec<&Value> =
        slices["items"].as_array().unwrap().iter().flat_map(|s| s["endpoints"].as_array().unwrap()).collect();
    assert_eq!(endpoints.len(), 3);
    assert_eq!(endpoints.iter().filter(|e| e["conditions"]["ready"] == true).count(), 2);
    s.kubectl(&["delete", "pod", "web-a"]);
    s.must_eventually("a deleted pod leaves the endpoints", Duration::from_secs(30), || {
        let o = s.kubectl(&["get", "endpoints", "web", "-o", "jsonpath={.subsets[0].addresses[*].ip}"]);
        (o.split_whitespace().count() == 1).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_lease_stops_goes_not_ready_is_tainted_and_loses_its_pods() {
    let s = Setup::new(
        |_| PodFate::Ready,
        &["--node-monitor-grace-period", "3s", "--default-not-ready-toleration-seconds", "2"],
    )
    .await;
    // Two nodes: with every node of a zone down, the controller suspects
    // itself and taints nothing (as Kubernetes does).
    s.apply(&node("n1"));
    s.apply(&node("n2"));
    // `kube-node-lease` is one of the namespaces every cluster starts with.
    let client = s.client();
    let leases = resources::of(Kind::Lease);
    for n in ["n1", "n2"] {
        let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": n, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": n, "leaseDurationSeconds": 40}});
        client.create(leases, "kube-node-lease", &lease).await.unwrap();
    }
    let renew = |node: &'static str| {
        let client = client.clone();
        tokio::spawn(async move {
            loop {
                if let Ok(mut l) = client.get(leases, "kube-node-lease", node).await {
                    l["spec"]["renewTime"] =
                        json!(chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true));
                    let _ = client.update(leases, &l).await;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    // Both kubelets posted Ready once.
    let nodes = resources::of(Kind::Node);
    for n in ["n1", "n2"] {
        let mut node = client.get(nodes, "", n).await.unwrap();
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        node["status"] = json!({"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
            "lastHeartbeatTime": now, "lastTransitionTime": now}]});
        client.update_status(nodes, &node).await.unwrap();
    }
    let renewing = renew("n1");
    let _healthy = renew("n2");
    s.apply(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: bound}\nspec:\n  nodeName: n1\n  containers: [{name: a, image: \
         busybox}]\n",
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let taints = s.kubectl(&["get", "node", "n1", "-o", "jsonpath={.spec.taints[*].key}"]);
    assert!(!taints.contains("unreachable"), "a renewing node is not tainted: {taints}");

    renewing.abort();
    s.must_eventually("the node is marked unknown and tainted", Duration::from_secs(30), || {
        let ready =
            s.kubectl(&["get", "node", "n1", "-o", "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}"]);
        let taints = s.kubectl(&["get", "node", "n1", "-o", "jsonpath={.spec.taints[*].key}"]);
        (ready == "Unknown" && taints.contains("node.kubernetes.io/unreachable")).then_some(())
    })
    .await;
    s.must_eventually("the pod is evicted", Duration::from_secs(30), || (s.count(&["get", "pods"]) == 0).then_some(()))
        .await;
}

/// POSTs an Eviction of `pod` in `default` with kubectl's raw client.
fn evict(s: &Setup, pod: &str) -> std::process::Output {
    let eviction =
        format!("{{\"apiVersion\": \"policy/v1\", \"kind\": \"Eviction\", \"metadata\": {{\"name\": \"{pod}\"}}}}");
    let path = format!("/api/v1/namespaces/default/pods/{pod}/eviction");
    kubectl_stdin(&s.api, &["create", "--raw", &path, "-f", "-"], &eviction)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disruption_budget_holds_evictions_and_a_drain_to_what_it_allows() {
    use std::sync::atomic::{AtomicBool, Ordering};
    // While `hold` is set, new pods stay Pending, so a replacement cannot
    // restore the budget behind the test's back.
    let hold = Arc::new(AtomicBool::new(false));
    let held = hold.clone();
    let s = Setup::new(move |_| if held.load(Ordering::SeqCst) { PodFate::Pending } else { PodFate::Ready }, &[]).await;
    s.apply(&node("n1"));
    // Every pod on n1, replacements too, so the drain has pods to evict.
    let web = deployment("default", 3, "nginx").replace("      containers:", "      nodeName: n1\n      containers:");
    s.apply(&web);
    s.kubectl(&["rollout", "status", "deployment/web", "--timeout=60s"]);
    let (census, watching) = census(s.client(), "default").await;

    assert_eq!(
        s.kubectl(&["create", "pdb", "web", "--selector=app=web", "--min-available=2"]),
        "poddisruptionbudget.policy/web created\n"
    );
    let allowed = || s.kubectl(&["get", "pdb", "web", "-o", "jsonpath={.status.disruptionsAllowed}"]);
    s.must_eventually("the controller allows one disruption", Duration::from_secs(30), || {
        (allowed() == "1").then_some(())
    })
    .await;
    let table = s.kubectl(&["get", "pdb"]);
    assert!(table.starts_with("NAME   MIN AVAILABLE   MAX UNAVAILABLE   ALLOWED DISRUPTIONS   AGE"), "{table}");
    assert!(table.contains("web    2               N/A               1"), "{table}");
    let status: Value = serde_json::from_str(&s.kubectl(&["get", "pdb", "web", "-o", "json"])).unwrap();
    let status = &status["status"];
    assert_eq!(
        (&status["currentHealthy"], &status["desiredHealthy"], &status["expectedPods"]),
        (&json!(3), &json!(2), &json!(3))
    );
    assert_eq!(status["conditions"][0]["reason"], "SufficientPods");
    census.lock().unwrap().counting_ready = true;

    // One eviction is allowed; the next is refused while the first pod's
    // replacement is not Ready (the budget was charged at once).
    hold.store(true, Ordering::SeqCst);
    let pods = s.kubectl(&["get", "pods", "-l", "app=web", "-o", "jsonpath={.items[*].metadata.name}"]);
    let pods: Vec<&str> = pods.split_whitespace().collect();
    assert_eq!(pods.len(), 3);
    ok(evict(&s, pods[0]));
    let refused = evict(&s, pods[1]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success()
            && stderr.contains("(TooManyRequests)")
            && stderr.contains("Cannot evict pod as it would violate the pod's disruption budget."),
        "{stderr}\n{}",
        String::from_utf8_lossy(&refused.stdout)
    );
    // A bad eviction is a clear error and evicts nothing.
    let wrong = format!("/api/v1/namespaces/default/pods/{}/eviction", pods[1]);
    let body = "{\"apiVersion\": \"policy/v1\", \"kind\": \"Eviction\", \"metadata\": {\"name\": \"other\"}}";
    let mismatch = kubectl_stdin(&s.api, &["create", "--raw", &wrong, "-f", "-"], body);
    assert!(String::from_utf8_lossy(&mismatch.stderr).contains("name in URL does not match name in Eviction object"));
    let stale = format!(
        "{{\"apiVersion\": \"policy/v1\", \"kind\": \"Eviction\", \"metadata\": {{\"name\": \"{}\"}}, \
         \"deleteOptions\": {{\"preconditions\": {{\"uid\": \"not-this-pod\"}}}}}}",
        pods[1]
    );
    let conflict = kubectl_stdin(&s.api, &["create", "--raw", &wrong, "-f", "-"], &stale);
    assert!(String::from_utf8_lossy(&conflict.stderr).contains("(Conflict)"), "{conflict:?}");
    let missing = evict(&s, "no-such-pod");
    assert!(String::from_utf8_lossy(&missing.stderr).contains("(NotFound)"));

    // kubectl drain evicts through the subresource and waits out the budget.
    hold.store(false, Ordering::SeqCst);
    // A change brings the held replacement before the stand-in kubelet again.
    s.kubectl(&["annotate", "pods", "-l", "app=web", "released=yes"]);
    s.must_eventually("the replacement is counted", Duration::from_secs(30), || (allowed() == "1").then_some(())).await;
    let listed = s.kubectl(&["get", "pods", "-l", "app=web", "-o", "jsonpath={.items[*].metadata.name}"]);
    let drain = kubectl(&s.api, &["drain", "n1", "--timeout=90s"]);
    let (out, err) = (String::from_utf8_lossy(&drain.stdout), String::from_utf8_lossy(&drain.stderr));
    assert!(drain.status.success(), "drain failed:\n{out}\n{err}");
    assert!(out.contains("node/n1 drained"), "{out}");
    assert!(err.contains("Cannot evict pod as it would violate the pod's disruption budget"), "{err}");
    let left = s.kubectl(&["get", "pods", "-l", "app=web", "-o", "jsonpath={.items[*].metadata.name}"]);
    for pod in listed.split_whitespace() {
        assert!(!left.split_whitespace().any(|p| p == pod), "{pod} was drained: {left}");
    }
    watching.abort();
    let fewest = census.lock().unwrap().fewest_ready;
    assert!(fewest.is_some_and(|f| f >= 2), "the budget kept 2 pods Ready throughout: {fewest:?}");
}

/// The definition of an operator's kind whose objects control pods: a
/// Flock, with a `scale` subresource on `spec.replicas`.
const FLOCKS: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: flocks.example.com}
spec:
  group: example.com
  scope: Namespaced
  names: {plural: flocks, singular: flock, kind: Flock}
  versions:
  - name: v1
    served: true
    storage: true
    subresources:
      scale: {specReplicasPath: .spec.replicas, statusReplicasPath: .status.replicas}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, properties: {replicas: {type: integer}}}
          status: {type: object, properties: {replicas: {type: integer}}}
"#;

/// Pods an operator made for its custom resource, as kube-rs and
/// controller-runtime operators do: the controllers meet the Flock only as
/// the pods' controller reference. The disruption controller counts the
/// Flock's scale for the budget, the garbage collector keeps the pods
/// while the Flock lives and deletes them once it is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_a_custom_resource_controls_count_its_scale_and_go_with_it() {
    let s = Setup::new(|_| PodFate::Ready, &[]).await;
    s.apply(&node("n1"));
    s.apply(FLOCKS);
    s.kubectl(&["wait", "--for=condition=Established", "crd/flocks.example.com", "--timeout=30s"]);
    s.apply(
        "apiVersion: example.com/v1\nkind: Flock\nmetadata: {name: birds, namespace: default}\nspec: {replicas: 4}\n",
    );
    let uid = s.kubectl(&["get", "flock", "birds", "-o", "jsonpath={.metadata.uid}"]);
    // Two of the Flock's four pods exist (its operator is slow).
    for i in 0..2 {
        s.apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: bird-{i}\n  namespace: default\n  labels: {{app: birds}}\n  \
             ownerReferences:\n  - {{apiVersion: example.com/v1, kind: Flock, name: birds, uid: {uid}, controller: \
             true, blockOwnerDeletion: true}}\nspec:\n  nodeName: n1\n  containers:\n  - {{name: bird, image: \
             nginx}}\n"
        ));
    }
    s.kubectl(&["create", "pdb", "birds", "--selector=app=birds", "--max-unavailable=1"]);
    let status = || -> Value {
        serde_json::from_str::<Value>(&s.kubectl(&["get", "pdb", "birds", "-o", "json"])).unwrap()["status"].clone()
    };
    let counts = |st: &Value| {
        ["expectedPods", "desiredHealthy", "currentHealthy", "disruptionsAllowed"].map(|k| st[k].as_i64().unwrap_or(-1))
    };
    // Of the Flock's 4, one may be unavailable: 3 must be healthy, and only
    // 2 are, so none may go.
    s.must_eventually("the budget counts the Flock's scale", Duration::from_secs(30), || {
        (counts(&status()) == [4, 3, 2, 0]).then_some(())
    })
    .await;
    // Scaled down through its scale subresource, the Flock wants 2, so one
    // of the 2 may go: the budget sees the new scale without a pod changing.
    s.kubectl(&["scale", "flock", "birds", "--replicas=2"]);
    s.must_eventually("the budget follows the Flock's scale", Duration::from_secs(45), || {
        (counts(&status()) == [2, 1, 2, 1]).then_some(())
    })
    .await;
    ok(evict(&s, "bird-0"));
    // All along, the garbage collector left the live Flock's pods alone.
    assert_eq!(s.kubectl(&["get", "pod", "bird-1", "-o", "jsonpath={.metadata.name}"]), "bird-1");

    // A Flock deleted takes its pods with it.
    s.kubectl(&["delete", "flock", "birds"]);
    s.must_eventually("the Flock's pods are collected", Duration::from_secs(60), || {
        (s.count(&["get", "pods", "-l", "app=birds"]) == 0).then_some(())
    })
    .await;
}

/// A Flock owned by `owner` (`kind` `name` `uid` in `apiVersion`), blocking its foreground deletion.
fn owned_flock(name: &str, api_version: &str, kind: &str, owner: &str, uid: &str) -> String {
    format!(
        "apiVersion: example.com/v1\nkind: Flock\nmetadata:\n  name: {name}\n  namespace: default\n  ownerReferences:\n  \
         - {{apiVersion: {api_version}, kind: {kind}, name: {owner}, uid: {uid}, blockOwnerDeletion: true}}\nspec: \
         {{replicas: 1}}\n"
    )
}

/// Custom objects as dependents, as Kubernetes' garbage collector treats
/// every kind: a Flock whose ConfigMap owner is deleted is collected; a
/// Flock deleted in the foreground waits for its Flock and the ConfigMap
/// under that to go first; a Flock deleted with `--cascade=orphan` leaves
/// its dependent Flock without the reference; a namespace deleted waits
/// for the finalizer of a Flock in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_objects_are_collected_deleted_in_the_foreground_and_orphaned() {
    let s = Setup::new(|_| PodFate::Ready, &[]).await;
    s.apply(FLOCKS);
    s.kubectl(&["wait", "--for=condition=Established", "crd/flocks.example.com", "--timeout=30s"]);
    let uid = |kind: &str, name: &str| s.kubectl(&["get", kind, name, "-o", "jsonpath={.metadata.uid}"]);
    let exists = |kind: &str, name: &str| kubectl(&s.api, &["get", kind, name]).status.success();

    // A built-in owner, a custom dependent.
    s.kubectl(&["create", "configmap", "keeper"]);
    s.apply(&owned_flock("kept", "v1", "ConfigMap", "keeper", &uid("configmap", "keeper")));
    s.kubectl(&["delete", "configmap", "keeper"]);
    s.must_eventually("the Flock whose owner went is collected", Duration::from_secs(30), || {
        (!exists("flock", "kept")).then_some(())
    })
    .await;

    // Foreground: parent <- child (a Flock) <- leaf (a ConfigMap).
    s.apply(
        "apiVersion: example.com/v1\nkind: Flock\nmetadata: {name: parent, namespace: default}\nspec: {replicas: 1}\n",
    );
    s.apply(&owned_flock("child", "example.com/v1", "Flock", "parent", &uid("flock", "parent")));
    let child = uid("flock", "child");
    s.apply(&format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: leaf\n  namespace: default\n  ownerReferences:\n  - \
         {{apiVersion: example.com/v1, kind: Flock, name: child, uid: {child}, blockOwnerDeletion: true}}\n"
    ));
    s.kubectl(&["delete", "flock", "parent", "--cascade=foreground", "--wait=false"]);
    s.must_eventually("the parent waits for what it owns, then goes", Duration::from_secs(60), || {
        let left: Vec<bool> = [("flock", "parent"), ("flock", "child"), ("configmap", "leaf")]
            .iter()
            .map(|(k, n)| exists(k, n))
            .collect();
        // The parent never goes before its child, nor the child before its leaf.
        let (parent, child, leaf) = (left[0], left[1], left[2]);
        assert!((parent || !child) && (child || !leaf), "left out of order: {left:?}");
        (left == [false, false, false]).then_some(())
    })
    .await;

    // Orphan: the dependent stays, without the reference.
    s.apply(
        "apiVersion: example.com/v1\nkind: Flock\nmetadata: {name: elder, namespace: default}\nspec: {replicas: 1}\n",
    );
    s.apply(&owned_flock("heir", "example.com/v1", "Flock", "elder", &uid("flock", "elder")));
    s.kubectl(&["delete", "flock", "elder", "--cascade=orphan"]);
    s.must_eventually("the orphaned Flock loses its reference", Duration::from_secs(30), || {
        let refs = s.kubectl(&["get", "flock", "heir", "-o", "jsonpath={.metadata.ownerReferences}"]);
        (refs.is_empty() && !exists("flock", "elder")).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(exists("flock", "heir"), "an orphan is not collected");

    // A namespace deleted waits for its custom objects' finalizers.
    s.kubectl(&["create", "namespace", "herd"]);
    s.apply(
        "apiVersion: example.com/v1\nkind: Flock\nmetadata: {name: held, namespace: herd, finalizers:          [example.com/keep]}\nspec: {replicas: 1}\n",
    );
    s.kubectl(&["delete", "namespace", "herd", "--wait=false"]);
    let flock_deleting =
        || s.kubectl(&["get", "flock", "held", "-n", "herd", "-o", "jsonpath={.metadata.deletionTimestamp}"]);
    s.must_eventually("the namespace's Flock is deleted", Duration::from_secs(30), || {
        (!flock_deleting().is_empty()).then_some(())
    })
    .await;
    let conditions = s.kubectl(&["get", "namespace", "herd", "-o", "jsonpath={.status.conditions}"]);
    s.must_eventually("the namespace says what holds it", Duration::from_secs(30), || {
        let c = s.kubectl(&["get", "namespace", "herd", "-o", "jsonpath={.status.conditions}"]);
        c.contains("example.com/keep in 1 resource instances").then_some(())
    })
    .await;
    assert!(exists("namespace", "herd"), "held by the Flock's finalizer: {conditions}");
    s.kubectl(&["patch", "flock", "held", "-n", "herd", "--type=merge", "-p", r#"{"metadata":{"finalizers":null}}"#]);
    s.must_eventually("the namespace goes once its Flock has", Duration::from_secs(60), || {
        (!exists("namespace", "herd")).then_some(())
    })
    .await;
}
