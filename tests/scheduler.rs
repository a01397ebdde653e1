//! The scheduler as real processes: three masters, two `skiff scheduler`s
//! (one active through its Lease), Nodes as plain objects (no node agent
//! runs here), pods through the real kubectl and the gRPC client.

mod support;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};
use skiff_api::{resources, Kind};
use skiff_client::resources::{EventType, ListParams, WatchParams};
use skiff_client::Client;
use support::controllers::*;
use support::kubectl::*;
use support::*;

/// A cluster with two schedulers.
struct Setup {
    /// Held for its processes and data, which go with it.
    _cluster: Cluster,
    schedulers: Vec<Component>,
    api: Api,
    client: Client,
}

impl Setup {
    async fn new() -> Setup {
        let cluster = Cluster::spawn(3).await;
        let api = cluster.api(1);
        let schedulers = (1..=2).map(|i| Component::scheduler(&cluster, &format!("sched-{i}"), &[])).collect();
        let client = cluster.client();
        Setup { _cluster: cluster, schedulers, api, client }
    }

    fn kubectl(&self, args: &[&str]) -> String {
        ok(kubectl(&self.api, args))
    }

    fn apply(&self, manifest: &str) -> String {
        ok(kubectl_stdin(&self.api, &["apply", "-f", "-"], manifest))
    }

    /// A Ready node with `cpu` cores, 16Gi and 110 pods, `labels` and `taints`.
    async fn node(&self, name: &str, cpu: &str, labels: Value, taints: Value) {
        let info = resources::of(Kind::Node);
        let mut labels = labels;
        labels["kubernetes.io/hostname"] = json!(name);
        let node = json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels}, "spec": {"taints": taints}});
        let created = self.client.create(info, "", &node).await.unwrap();
        let mut ready = created.clone();
        let resources = json!({"cpu": cpu, "memory": "16Gi", "pods": "110"});
        ready["status"] = json!({"capacity": resources, "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True"}]});
        self.client.update_status(info, &ready).await.unwrap();
    }

    /// The node `ns/name` is bound to, if any.
    async fn node_of(&self, ns: &str, name: &str) -> Option<String> {
        let pod = self.client.get(resources::of(Kind::Pod), ns, name).await.ok()?;
        pod["spec"]["nodeName"].as_str().map(str::to_string)
    }

    /// Waits until every pod named is bound; their nodes.
    async fn must_bind(&self, ns: &str, names: &[&str]) -> Vec<String> {
        let mut nodes = Vec::new();
        for name in names {
            let what = format!("pod {ns}/{name} is bound");
            nodes.push(self.must_eventually(&what, Duration::from_secs(30), || self.node_of(ns, name)).await);
        }
        nodes
    }

    /// Decisions that found no node, over both schedulers.
    fn unschedulable_attempts(&self) -> u64 {
        let line = "scheduler_schedule_attempts_total{result=\"unschedulable\"} ";
        let count = |metrics: String| metrics.lines().find_map(|l| l.strip_prefix(line)?.trim().parse::<u64>().ok());
        self.schedulers.iter().filter_map(|s| count(s.metrics())).sum()
    }

    /// [`Setup::unschedulable_attempts`] once it stays put for 2 s.
    async fn settled_unschedulable_attempts(&self) -> Option<u64> {
        let before = self.unschedulable_attempts();
        tokio::time::sleep(Duration::from_secs(2)).await;
        (before > 0 && self.unschedulable_attempts() == before).then_some(before)
    }

    /// The identity holding the scheduler's Lease.
    fn active(&self) -> String {
        let out = kubectl(
            &self.api,
            &["get", "lease", "-n", "kube-system", "kube-scheduler", "-o", "jsonpath={.spec.holderIdentity}"],
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Polls `check` until it returns something, failing the test with the
    /// schedulers' logs after `within`.
    async fn must_eventually<T, F, Fut>(&self, what: &str, within: Duration, mut check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let deadline = Instant::now() + within;
        loop {
            if let Some(v) = check().await {
                return v;
            }
            if Instant::now() > deadline {
                let logs: Vec<String> =
                    self.schedulers.iter().map(|s| format!("--- {} ---\n{}", s.identity, tail(&s.log(), 60))).collect();
                panic!("{what}: not within {within:?}\n{}", logs.join("\n"));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A pod manifest: `spec` merged over one container asking for `cpu`.
fn pod(ns: &str, name: &str, labels: Value, cpu: &str, spec: Value) -> String {
    let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"terminationGracePeriodSeconds": 0, "containers": [{"name": "c", "image": "busybox",
            "resources": {"requests": {"cpu": cpu}}}]}});
    if let (Some(base), Some(extra)) = (pod["spec"].as_object_mut(), spec.as_object()) {
        for (k, v) in extra {
            base.insert(k.clone(), v.clone());
        }
    }
    pod.to_string()
}

fn tolerate_gpu() -> Value {
    json!([{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_land_only_where_selectors_affinity_taints_ports_and_spreading_allow() {
    let s = Setup::new().await;
    s.node("n1", "2", json!({"zone": "a", "disk": "ssd"}), json!([])).await;
    s.node("n2", "2", json!({"zone": "b"}), json!([{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]))
        .await;
    s.node("n3", "4", json!({"zone": "c"}), json!([])).await;
    s.kubectl(&["create", "namespace", "place"]);

    // nodeSelector; required node affinity with a toleration; resources.
    s.apply(&pod("place", "ssd", json!({}), "100m", json!({"nodeSelector": {"disk": "ssd"}})));
    let affinity = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}]}}});
    s.apply(&pod("place", "zone-b", json!({}), "100m", json!({"affinity": affinity, "tolerations": tolerate_gpu()})));
    s.apply(&pod("place", "big", json!({}), "3", json!({})));
    assert_eq!(s.must_bind("place", &["ssd", "zone-b", "big"]).await, ["n1", "n2", "n3"]);

    // Required anti-affinity among three, tolerating n2's taint: one per node.
    let anti = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"}]}});
    for i in 0..3 {
        let spec = json!({"affinity": anti, "tolerations": tolerate_gpu()});
        s.apply(&pod("place", &format!("db-{i}"), json!({"app": "db"}), "10m", spec));
    }
    let mut db = s.must_bind("place", &["db-0", "db-1", "db-2"]).await;
    db.sort();
    assert_eq!(db, ["n1", "n2", "n3"], "one db per node");
    // A fourth has nowhere to go.
    let spec = json!({"affinity": anti, "tolerations": tolerate_gpu()});
    s.apply(&pod("place", "db-3", json!({"app": "db"}), "10m", spec));

    // Spreading over zones, maxSkew 1: six pods, two per zone.
    let spread = json!([{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app": "spread"}}}]);
    let names: Vec<String> = (0..6).map(|i| format!("spread-{i}")).collect();
    for name in &names {
        let spec = json!({"topologySpreadConstraints": spread, "tolerations": tolerate_gpu()});
        s.apply(&pod("place", name, json!({"app": "spread"}), "10m", spec));
    }
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for node in s.must_bind("place", &names).await {
        *per_node.entry(node).or_default() += 1;
    }
    assert_eq!(per_node.values().copied().collect::<Vec<_>>(), [2, 2, 2], "{per_node:?}");

    // Host ports: n2 is tainted, so two of three pods asking for port 9000 fit.
    for i in 0..3 {
        let spec = json!({"containers": [{"name": "c", "image": "busybox",
            "ports": [{"containerPort": 80, "hostPort": 9000}]}]});
        s.apply(&pod("place", &format!("port-{i}"), json!({}), "10m", spec));
    }
    s.must_eventually("two port pods are bound", Duration::from_secs(30), || async {
        let mut bound = Vec::new();
        for i in 0..3 {
            if let Some(n) = s.node_of("place", &format!("port-{i}")).await {
                bound.push(n);
            }
        }
        bound.sort();
        (bound == ["n1", "n3"]).then_some(())
    })
    .await;
    let describe = |name: &str| s.kubectl(&["describe", "pod", "-n", "place", name]);
    s.must_eventually("the fourth db and the third port pod say why they wait", Duration::from_secs(30), || async {
        let db = describe("db-3");
        let ports: Vec<String> = (0..3).map(|i| describe(&format!("port-{i}"))).collect();
        let port = ports.iter().find(|d| d.contains("FailedScheduling"))?;
        (db.contains("didn't match pod anti-affinity rules")
            && port.contains("node(s) didn't have free ports for the requested pod ports")
            && port.contains("untolerated taint"))
        .then_some(())
    })
    .await;
    assert_eq!(s.node_of("place", "db-3").await, None, "a pod that fits nowhere stays Pending");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_fits_nowhere_says_why_and_binds_when_a_fitting_node_joins() {
    let s = Setup::new().await;
    for n in ["small-1", "small-2", "small-3"] {
        s.node(n, "2", json!({}), json!([])).await;
    }
    s.kubectl(&["create", "namespace", "wait"]);
    s.apply(&pod("wait", "huge", json!({}), "8", json!({})));
    let describe = s
        .must_eventually("FailedScheduling is recorded", Duration::from_secs(30), || async {
            let d = s.kubectl(&["describe", "pod", "-n", "wait", "huge"]);
            d.contains("FailedScheduling").then_some(d)
        })
        .await;
    assert!(describe.contains("0/3 nodes are available: 3 Insufficient cpu."), "{describe}");
    let condition = s.kubectl(&[
        "get",
        "pod",
        "-n",
        "wait",
        "huge",
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"PodScheduled\")].reason}",
    ]);
    assert_eq!(condition, "Unschedulable");
    assert_eq!(s.node_of("wait", "huge").await, None);

    // What cannot give it room does not send it round again (kube's
    // queueing hints): a pod bound elsewhere, its status reported as a
    // kubelet would, a node's heartbeat.
    let tried =
        s.must_eventually("attempts settle", Duration::from_secs(10), || s.settled_unschedulable_attempts()).await;
    s.apply(&pod("wait", "small", json!({}), "1", json!({})));
    let [small_node] = s.must_bind("wait", &["small"]).await.try_into().unwrap();
    let pods = resources::of(Kind::Pod);
    let mut running = s.client.get(pods, "wait", "small").await.unwrap();
    running["status"]["phase"] = json!("Running");
    running["status"]["podIP"] = json!("10.244.0.9");
    s.client.update_status(pods, &running).await.unwrap();
    let nodes = resources::of(Kind::Node);
    let mut beat = s.client.get(nodes, "", &small_node).await.unwrap();
    beat["status"]["conditions"][0]["lastHeartbeatTime"] = json!("2026-12-07T10:00:10Z");
    s.client.update_status(nodes, &beat).await.unwrap();
    // Longer than its back-off, had any of them moved it.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(s.unschedulable_attempts(), tried, "tried again for a change that cannot help it");
    // A node relabelled may help: tried again, it says the same, and its
    // Event counts twice instead of being listed twice.
    s.kubectl(&["label", "node", &small_node, "tier=a"]);
    let describe = s
        .must_eventually("FailedScheduling counted twice", Duration::from_secs(30), || async {
            let d = s.kubectl(&["describe", "pod", "-n", "wait", "huge"]);
            d.contains("(x2 over").then_some(d)
        })
        .await;
    assert_eq!(describe.matches("FailedScheduling").count(), 1, "{describe}");
    assert_eq!(s.unschedulable_attempts(), tried + 1);

    s.node("large", "16", json!({}), json!([])).await;
    assert_eq!(s.must_bind("wait", &["huge"]).await, ["large"]);
    let events = s.kubectl(&["get", "events", "-n", "wait", "--field-selector", "reason=Scheduled"]);
    assert!(events.contains("Successfully assigned wait/huge to large"), "{events}");
    let holder = s.active();
    assert!(holder == "sched-1" || holder == "sched-2", "one scheduler holds the lease: {holder:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_high_priority_pod_preempts_a_lower_priority_one() {
    let s = Setup::new().await;
    // The victims' grace period is 0 (see `pod`), so no kubelet is needed
    // to finish their deletion.
    s.node("only", "2", json!({}), json!([])).await;
    s.kubectl(&["create", "priorityclass", "low", "--value", "100"]);
    s.kubectl(&["create", "priorityclass", "high", "--value", "1000"]);
    s.kubectl(&["create", "namespace", "prio"]);
    for name in ["low-1", "low-2"] {
        s.apply(&pod("prio", name, json!({}), "900m", json!({"priorityClassName": "low"})));
    }
    s.must_bind("prio", &["low-1", "low-2"]).await;
    s.apply(&pod("prio", "urgent", json!({}), "1", json!({"priorityClassName": "high"})));
    assert_eq!(s.must_bind("prio", &["urgent"]).await, ["only"]);
    let left: Vec<bool> =
        [s.node_of("prio", "low-1").await, s.node_of("prio", "low-2").await].iter().map(Option::is_some).collect();
    assert_eq!(left.iter().filter(|l| **l).count(), 1, "exactly one low-priority pod was evicted: {left:?}");
    // The victim is told after its deletion, as kube does: the Event may
    // land just after the preemptor is bound.
    s.must_eventually("the victim's Preempted event", Duration::from_secs(30), || async {
        let events = s.kubectl(&["get", "events", "-n", "prio", "--field-selector", "reason=Preempted"]);
        events.contains("Preempted by pod prio/urgent on node only").then_some(())
    })
    .await;
}

/// Every pod's binding and every node's requested cpu, over one watch.
#[derive(Default)]
struct Ledger {
    node_of: HashMap<String, String>,
    /// Pods seen bound to a second node (never allowed).
    rebound: Vec<String>,
    requested: HashMap<String, i64>,
    most_requested: HashMap<String, i64>,
}

impl Ledger {
    fn observe(&mut self, kind: EventType, pod: &Value) {
        let name = pod["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let Some(node) = pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) else { return };
        if kind == EventType::Deleted {
            return;
        }
        match self.node_of.get(&name) {
            Some(before) if before != node => self.rebound.push(name),
            Some(_) => {}
            None => {
                self.node_of.insert(name, node.to_string());
                let milli = pod["spec"]["containers"][0]["resources"]["requests"]["cpu"]
                    .as_str()
                    .and_then(|c| c.trim_end_matches('m').parse::<i64>().ok())
                    .unwrap_or(0);
                let sum = self.requested.entry(node.to_string()).or_default();
                *sum += milli;
                let most = self.most_requested.entry(node.to_string()).or_default();
                *most = (*most).max(*sum);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_active_scheduler_with_1000_pods_pending_binds_each_once_within_allocatable() {
    let mut s = Setup::new().await;
    // 20 nodes of 5 cores: room for exactly 1,000 pods of 100m.
    for i in 0..20 {
        s.node(&format!("node-{i:02}"), "5", json!({}), json!([])).await;
    }
    s.kubectl(&["create", "namespace", "burst"]);
    let info = resources::of(Kind::Pod);
    let list = s.client.list(info, "burst", &ListParams::default()).await.unwrap();
    let params = WatchParams { resource_version: list.resource_version, ..Default::default() };
    let mut events = s.client.watch(info, "burst", &params).await.unwrap();
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let seen = ledger.clone();
    let watching = tokio::spawn(async move {
        while let Some(Ok(e)) = events.next().await {
            seen.lock().unwrap().observe(e.kind, &e.object);
        }
    });

    let holder = s
        .must_eventually("a scheduler holds the lease", Duration::from_secs(30), || async {
            let h = s.active();
            (!h.is_empty()).then_some(h)
        })
        .await;
    let client = s.client.clone();
    let creates = futures::stream::iter(0..1000).map(|i| {
        let client = client.clone();
        async move {
            let body: Value = serde_json::from_str(&pod("burst", &format!("p-{i:04}"), json!({}), "100m", json!({})))
                .expect("a pod manifest");
            client.create(info, "burst", &body).await.map(|_| ())
        }
    });
    let creating = creates.buffer_unordered(32).collect::<Vec<_>>();
    // Killed at its first bindings, while the pods are still being
    // created: waiting for the creates first let a fast build bind all
    // 1,000 before the kill.
    let active = s.schedulers.iter().position(|c| c.identity == holder).unwrap();
    let killing = async {
        let deadline = Instant::now() + Duration::from_secs(30);
        while ledger.lock().unwrap().node_of.is_empty() {
            assert!(Instant::now() < deadline, "no pod bound within 30 s");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        s.schedulers[active].kill();
        ledger.lock().unwrap().node_of.len()
    };
    let (created, bound_at_kill) = tokio::join!(creating, killing);
    assert!(created.iter().all(Result::is_ok), "every pod is created");
    s.must_eventually("all 1,000 pods are bound", Duration::from_secs(90), || async {
        (ledger.lock().unwrap().node_of.len() == 1000).then_some(())
    })
    .await;
    // The standby takes over once the killed holder's lease runs out.
    s.must_eventually("the standby took the lease over", Duration::from_secs(30), || async {
        let now = s.active();
        (!now.is_empty() && now != holder).then_some(())
    })
    .await;
    assert!(bound_at_kill < 1000, "the kill came while pods were pending ({bound_at_kill} bound)");
    watching.abort();
    let ledger = ledger.lock().unwrap();
    assert!(ledger.rebound.is_empty(), "pods bound twice: {:?}", ledger.rebound);
    for (node, most) in &ledger.most_requested {
        assert!(*most <= 5000, "{node} was given {most}m of 5000m");
    }
    assert_eq!(ledger.requested.values().sum::<i64>(), 100_000);
}
