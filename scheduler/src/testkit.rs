//! Builders for the unit tests: nodes and pods from JSON fragments merged
//! over a small base object.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{json, Value};

use crate::cluster::Cluster;
use crate::framework::{NodeInfo, PodInfo};

/// `extra` merged into `base`: objects key by key, anything else replaced.
pub(crate) fn merge(mut base: Value, extra: Value) -> Value {
    match (&mut base, extra) {
        (Value::Object(b), Value::Object(e)) => {
            for (k, v) in e {
                let merged = match b.remove(&k) {
                    Some(old) => merge(old, v),
                    None => v,
                };
                b.insert(k, merged);
            }
            base
        }
        (_, e) => e,
    }
}

/// A node with `cpu`, `memory` and 110 pods allocatable, a hostname label, and `extra` merged in.
pub(crate) fn must_node(name: &str, cpu: &str, memory: &str, extra: Value) -> Arc<Node> {
    let base = json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": "110"}},
    });
    Arc::new(serde_json::from_value(merge(base, extra)).expect("a valid node"))
}

/// A pod in namespace "default" with one container requesting `cpu` and
/// `memory` (omitted when ""), and `extra` merged in.
pub(crate) fn must_pod(name: &str, cpu: &str, memory: &str, extra: Value) -> Arc<PodInfo> {
    let mut requests = serde_json::Map::new();
    if !cpu.is_empty() {
        requests.insert("cpu".into(), json!(cpu));
    }
    if !memory.is_empty() {
        requests.insert("memory".into(), json!(memory));
    }
    let base = json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": requests}}]},
    });
    let pod: Pod = serde_json::from_value(merge(base, extra)).expect("a valid pod");
    Arc::new(PodInfo::new(Arc::new(pod)))
}

/// The same pod placed on `node`.
pub(crate) fn must_place(pod: &PodInfo, node: &str) -> Arc<PodInfo> {
    Arc::new(pod.bound_to(node))
}

/// A node info with `pods` placed on it.
pub(crate) fn must_node_info(node: Arc<Node>, pods: &[Arc<PodInfo>]) -> NodeInfo {
    let mut info = NodeInfo::new(node);
    for p in pods {
        info.add_pod(must_place(p, &info.name.clone()));
    }
    info
}

/// A cluster of `nodes` with `pods` placed as (pod, node name).
pub(crate) fn must_cluster(nodes: Vec<Arc<Node>>, pods: Vec<(Arc<PodInfo>, &str)>) -> Cluster {
    let mut c = Cluster::new();
    for n in nodes {
        c.upsert_node(n);
    }
    for (p, n) in pods {
        c.add_pod(must_place(&p, n));
    }
    c
}
