//! Throwaway timing of one decision at benchmark scale (5,000 nodes,
//! 50,000 placed pods). Prints figures, asserts only that decisions
//! succeed. Run with
//! `cargo test --release -p skiff-scheduler --test decision_timing -- --ignored --nocapture`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{json, Value};
use skiff_scheduler::{preempt, schedule, Cluster, PodInfo, Profile};

const NODES: usize = 5_000;
const PODS: usize = 50_000;
const ZONES: usize = 10;

fn node(i: usize) -> Arc<Node> {
    let name = format!("node-{i:05}");
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {
                "kubernetes.io/hostname": name,
                "topology.kubernetes.io/zone": format!("zone-{}", i % ZONES),
                "node.kubernetes.io/instance-type": "hollow",
            }},
            "status": {"allocatable": {"cpu": "32", "memory": "128Gi", "pods": "110"}},
        }))
        .expect("node"),
    )
}

fn pod(name: &str, labels: Value, spec: Value, node: Option<&str>) -> PodInfo {
    let mut base = json!({
        "metadata": {"name": name, "namespace": "bench", "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "pause", "resources": {"requests": {"cpu": "100m", "memory": "100Mi"}}}]},
    });
    if let (Some(obj), Some(extra)) = (base["spec"].as_object_mut(), spec.as_object()) {
        for (k, v) in extra {
            obj.insert(k.clone(), v.clone());
        }
    }
    if let Some(n) = node {
        base["spec"]["nodeName"] = json!(n);
    }
    let pod: Pod = serde_json::from_value(base).expect("pod");
    PodInfo::new(Arc::new(pod))
}

fn anti_spec() -> Value {
    json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"color": "green"}}, "topologyKey": "kubernetes.io/hostname"}
    ]}}})
}

/// Schedules `count` pods built by `make`, assuming each onto its node as the loop would.
fn run(cluster: &mut Cluster, count: usize, make: impl Fn(usize) -> PodInfo) -> (Duration, Duration, usize) {
    let profile = Profile::default();
    let mut start = 0;
    let mut decide = Duration::ZERO;
    let mut account = Duration::ZERO;
    let mut evaluated = 0;
    for i in 0..count {
        let p = make(i);
        let t = Instant::now();
        let placement = schedule(&p, cluster, &profile, &mut start).expect("a node fits");
        decide += t.elapsed();
        evaluated += placement.evaluated;
        let t = Instant::now();
        cluster.add_pod(Arc::new(p.bound_to(&placement.node)));
        account += t.elapsed();
    }
    (decide / count as u32, account / count as u32, evaluated / count)
}

#[test]
#[ignore]
fn decision_time_at_5000_nodes_and_50000_pods() {
    let t = Instant::now();
    let mut cluster = Cluster::new();
    for i in 0..NODES {
        cluster.upsert_node(node(i));
    }
    let nodes_time = t.elapsed();
    let t = Instant::now();
    // 49,000 basic pods in 100 ReplicaSet-like groups, 1,000 green pods with hostname anti-affinity.
    for i in 0..PODS - 1_000 {
        let n = format!("node-{:05}", i % NODES);
        cluster.add_pod(Arc::new(pod(
            &format!("base-{i}"),
            json!({"app": format!("group-{}", i % 100)}),
            json!({}),
            Some(&n),
        )));
    }
    for i in 0..1_000 {
        let n = format!("node-{:05}", (i * 5) % NODES);
        cluster.add_pod(Arc::new(pod(&format!("green-{i}"), json!({"color": "green"}), anti_spec(), Some(&n))));
    }
    let pods_time = t.elapsed();
    let rss = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmRSS")).map(str::to_string))
        .unwrap_or_default();
    println!("memory after setup (whole test process): {rss}");
    println!(
        "setup: {NODES} nodes in {nodes_time:?}, {PODS} pods in {pods_time:?} ({:?}/pod incl. PodInfo::new)",
        pods_time / PODS as u32
    );

    let t = Instant::now();
    for i in 0..1_000 {
        std::hint::black_box(pod(&format!("x-{i}"), json!({"app": "x"}), json!({}), None));
    }
    println!("PodInfo::new (basic pod, from JSON): {:?}", t.elapsed() / 1_000);

    let (decide, account, evaluated) =
        run(&mut cluster, 2_000, |i| pod(&format!("basic-{i}"), json!({"app": "bench"}), json!({}), None));
    println!("basic: {decide:?}/decision, {account:?}/assume, {evaluated} nodes evaluated per decision");

    let (decide, account, evaluated) =
        run(&mut cluster, 1_000, |i| pod(&format!("green-new-{i}"), json!({"color": "green"}), anti_spec(), None));
    println!("required anti-affinity (hostname, 1,000 placed + growing): {decide:?}/decision, {account:?}/assume, {evaluated} evaluated");

    // Where an anti-affinity decision spends its time.
    let p = pod("green-probe", json!({"color": "green"}), anti_spec(), None);
    let t = Instant::now();
    let state = skiff_scheduler::filters::FilterState::new(&p, &cluster);
    let prefilter = t.elapsed();
    let t = Instant::now();
    let mut passed = Vec::new();
    for n in cluster.nodes().iter().take(718) {
        if skiff_scheduler::filters::filter(&p, n, &state, &cluster).is_ok() {
            passed.push(n);
        }
    }
    let filtering = t.elapsed();
    let t = Instant::now();
    let scores = skiff_scheduler::algorithm::score(&p, &passed, &cluster, &Profile::default().weights);
    println!(
        "anti-affinity breakdown: state {prefilter:?}, filter 718 nodes {filtering:?}, score {} nodes {:?}",
        scores.len(),
        t.elapsed()
    );

    let affinity = json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "group-7"}}, "topologyKey": "topology.kubernetes.io/zone"}
    ]}}});
    let (decide, _, evaluated) =
        run(&mut cluster, 500, |i| pod(&format!("aff-{i}"), json!({"app": "aff"}), affinity.clone(), None));
    println!("required pod affinity (zone, to 490 pods): {decide:?}/decision, {evaluated} evaluated");

    let spread = json!({"topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "spread"}}},
        {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": {"app": "spread"}}}
    ]});
    let (decide, _, evaluated) =
        run(&mut cluster, 500, |i| pod(&format!("spread-{i}"), json!({"app": "spread"}), spread.clone(), None));
    println!("topology spread (zone hard + hostname soft): {decide:?}/decision, {evaluated} evaluated");

    let preferred = json!({"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 50, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "pref"}}, "topologyKey": "kubernetes.io/hostname"}}
    ]}}});
    let (decide, _, evaluated) =
        run(&mut cluster, 500, |i| pod(&format!("pref-{i}"), json!({"app": "pref"}), preferred.clone(), None));
    println!("preferred anti-affinity (hostname): {decide:?}/decision, {evaluated} evaluated");

    // Preemption: a pod bigger than any node's free cpu, with every node full of low-priority pods.
    let profile = Profile::default();
    let big = pod(
        "big",
        json!({}),
        json!({"priority": 1000, "containers": [{"name": "c", "resources": {"requests": {"cpu": "31500m"}}}]}),
        None,
    );
    let t = Instant::now();
    let fit = schedule(&big, &cluster, &profile, &mut 0).expect_err("fits nowhere");
    let filter_all = t.elapsed();
    let t = Instant::now();
    let preemption = preempt(&big, &cluster, &profile, &fit, &[]).expect("a node frees up");
    println!(
        "preemption: failed decision over all nodes {filter_all:?}, preempt {:?} ({} victims on {})",
        t.elapsed(),
        preemption.victims.len(),
        preemption.node
    );
}
