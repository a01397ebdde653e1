//! The DaemonSet controller's logic: from a DaemonSet, the nodes, the pods
//! it owns and the time, the pods to create or delete and the status to
//! record, as Kubernetes' `pkg/controller/daemon` documents it.
//!
//! One [`reconcile`] call:
//!
//! 1. For each node, whether a daemon pod should run there and whether one
//!    already there may stay ([`node_fit`]): `nodeSelector`, the required
//!    node affinity (`matchExpressions` on labels, `matchFields` on
//!    `metadata.name`), and the node's `NoSchedule`/`NoExecute` taints
//!    against the pod's tolerations, which include the ones Kubernetes
//!    adds to every daemon pod ([`DAEMON_TOLERATIONS`]). An untolerated
//!    `NoSchedule` taint keeps new pods off but leaves a running one;
//!    `NoExecute` removes it.
//! 2. A node that should run a pod and has none gets one; a node that
//!    should not keeps none; failed pods are deleted (and replaced next
//!    time); of several pods on a node the oldest stays. Pods for nodes
//!    that left the cluster are deleted.
//! 3. The update strategy: `RollingUpdate` (the default) replaces pods
//!    whose `controller-revision-hash` label is not the template's, at most
//!    `maxUnavailable` (1) nodes at a time, or with `maxSurge` a new pod
//!    starts beside the old one, which goes once the new one is available.
//!    `OnDelete` replaces a pod only after someone deletes it.
//! 4. The status counts, per node, as Kubernetes does, with
//!    `observedGeneration`, so `kubectl rollout status ds` can end.
//!
//! Pods are not bound to their node here. As in Kubernetes since 1.12, a
//! daemon pod carries a required node affinity to exactly its node
//! (`matchFields: metadata.name In [node]`) and the scheduler binds it, so
//! daemon pods go through the same admission, preemption and resource
//! accounting as every other pod. A pod not yet scheduled counts for the
//! node its affinity names.
//!
//! Creates and deletes happen only while the wiring's
//! [`Expectations`](crate::expectations::Expectations) for the DaemonSet
//! are satisfied.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetStatus};
use k8s_openapi::api::core::v1::{
    Affinity, Node, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod, PodSpec,
    PodTemplateSpec, Taint, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{json, Value};

use crate::action::Action;

/// The label holding the hash of the template a pod was made from.
pub const REVISION_HASH_LABEL: &str = "controller-revision-hash";
/// The (deprecated, still set by Kubernetes) label with the DaemonSet's
/// generation when the pod was made.
pub const TEMPLATE_GENERATION_LABEL: &str = "pod-template-generation";

/// The tolerations Kubernetes adds to every daemon pod (key, effect): a
/// daemon keeps running through node trouble and runs on cordoned nodes.
pub const DAEMON_TOLERATIONS: [(&str, &str); 6] = [
    ("node.kubernetes.io/not-ready", "NoExecute"),
    ("node.kubernetes.io/unreachable", "NoExecute"),
    ("node.kubernetes.io/disk-pressure", "NoSchedule"),
    ("node.kubernetes.io/memory-pressure", "NoSchedule"),
    ("node.kubernetes.io/pid-pressure", "NoSchedule"),
    ("node.kubernetes.io/unschedulable", "NoSchedule"),
];

/// Added as well for pods on the host network, which need no pod network.
const HOST_NETWORK_TOLERATION: (&str, &str) = ("node.kubernetes.io/network-unavailable", "NoSchedule");

/// What one reconcile of a DaemonSet asks for.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DaemonSetPlan {
    /// The writes, in order.
    pub actions: Vec<Action>,
    /// How many pod creations `actions` holds (`Expectations::expect_creations`).
    pub expected_creations: usize,
    /// The uids of the pods `actions` deletes (`Expectations::expect_deletions`).
    pub expected_deletions: Vec<String>,
    /// Reconcile again after this long: when a ready pod has been ready for
    /// `minReadySeconds` and counts as available.
    pub requeue_after: Option<Duration>,
}

/// Whether a daemon pod belongs on a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeFit {
    /// A new pod may be placed there.
    pub should_run: bool,
    /// A pod already there may stay.
    pub should_continue_running: bool,
}

/// Reconciles one DaemonSet. `nodes` are all nodes; `pods` are the pods of
/// the DaemonSet's namespace the wiring indexes under it (its controller
/// owner reference); others are ignored.
pub fn reconcile(
    ds: &DaemonSet,
    nodes: &[Node],
    pods: &[Pod],
    expectations_satisfied: bool,
    now: DateTime<Utc>,
) -> DaemonSetPlan {
    let mut plan = DaemonSetPlan::default();
    let (Some(uid), Some(name)) = (ds.metadata.uid.as_deref(), ds.metadata.name.as_deref()) else {
        return plan;
    };
    if ds.metadata.deletion_timestamp.is_some() {
        return plan;
    }
    let Some(spec) = ds.spec.as_ref() else {
        return plan;
    };
    let namespace = ds.metadata.namespace.clone().unwrap_or_default();
    let old_status = ds.status.clone();
    let hash = template_hash(&spec.template, old_status.as_ref().and_then(|s| s.collision_count));
    let pod_spec = daemon_pod_spec(spec.template.spec.clone().unwrap_or_default());
    let min_ready = TimeDelta::seconds(spec.min_ready_seconds.unwrap_or(0).into());
    let generation = ds.metadata.generation.unwrap_or(0);

    // Pods by the node they are for.
    let mut by_node: BTreeMap<String, Vec<&Pod>> = BTreeMap::new();
    let mut homeless = Vec::new();
    for pod in pods.iter().filter(|p| controller_uid(p) == Some(uid)) {
        match target_node(pod) {
            Some(node) => by_node.entry(node.to_string()).or_default().push(pod),
            None => homeless.push(pod),
        }
    }
    let mut sorted_nodes: Vec<&Node> = nodes.iter().filter(|n| n.metadata.name.is_some()).collect();
    sorted_nodes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));

    let strategy = spec.update_strategy.clone().unwrap_or_default();
    let rolling = strategy.type_.as_deref().unwrap_or("RollingUpdate") == "RollingUpdate";
    let rolling_params = strategy.rolling_update.unwrap_or_default();
    let node_count = i32::try_from(nodes.len()).unwrap_or(i32::MAX);
    let surge_allowed = rolling && scaled(rolling_params.max_surge.as_ref(), node_count, 0) > 0;

    let mut creations: Vec<String> = Vec::new();
    let mut deletions: Vec<&Pod> = Vec::new();
    let mut fits: BTreeMap<&str, NodeFit> = BTreeMap::new();
    let mut status = DaemonSetStatus {
        collision_count: old_status.as_ref().and_then(|s| s.collision_count),
        conditions: old_status.as_ref().and_then(|s| s.conditions.clone()),
        observed_generation: ds.metadata.generation,
        ..DaemonSetStatus::default()
    };
    let mut number_available = 0;
    let mut updated = 0;
    let mut next_available: Option<DateTime<Utc>> = None;

    // 2. One pod per eligible node; status counts from the same view.
    for node in &sorted_nodes {
        let node_name = node.metadata.name.as_deref().unwrap_or("");
        let fit = node_fit(&pod_spec, node);
        fits.insert(node_name, fit);
        let here = by_node.get(node_name).cloned().unwrap_or_default();
        let live: Vec<&Pod> = here.iter().copied().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();

        if fit.should_run {
            status.desired_number_scheduled += 1;
            if let Some(pod) = oldest(&here) {
                status.current_number_scheduled += 1;
                if is_ready(pod) {
                    status.number_ready += 1;
                }
                match available_at(pod, min_ready) {
                    Some(at) if at <= now => number_available += 1,
                    Some(at) => next_available = Some(next_available.map_or(at, |n| n.min(at))),
                    None => {}
                }
                if pod_hash(pod) == Some(hash.as_str()) {
                    updated += 1;
                }
            }
        } else if !here.is_empty() {
            status.number_misscheduled += 1;
        }

        if fit.should_run && here.is_empty() {
            creations.push(node_name.to_string());
        } else if fit.should_continue_running {
            let (dead, mut running): (Vec<&Pod>, Vec<&Pod>) =
                live.iter().copied().partition(|p| matches!(phase(p), "Failed" | "Succeeded"));
            deletions.extend(dead);
            if running.len() > 1 {
                running.sort_by_key(|p| creation(p));
                // Keep the oldest; while surging, the oldest new one too.
                let keep_new = surge_allowed
                    .then(|| running.iter().find(|p| pod_hash(p) == Some(hash.as_str())).copied())
                    .flatten();
                let keep_old = running[0];
                deletions.extend(
                    running
                        .iter()
                        .copied()
                        .filter(|p| !std::ptr::eq(*p, keep_old) && keep_new.is_none_or(|k| !std::ptr::eq(*p, k))),
                );
            }
        } else {
            deletions.extend(live.iter().copied());
        }
    }
    // Pods for nodes that are gone, or for no node at all.
    for (node_name, here) in &by_node {
        if !fits.contains_key(node_name.as_str()) {
            deletions.extend(here.iter().copied().filter(|p| p.metadata.deletion_timestamp.is_none()));
        }
    }
    deletions.extend(homeless.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()));

    // 3. Rolling update, on the pods step 2 keeps.
    if rolling && expectations_satisfied {
        let deleting: HashSet<&str> = deletions.iter().filter_map(|p| p.metadata.uid.as_deref()).collect();
        let max_unavailable = scaled(rolling_params.max_unavailable.as_ref(), status.desired_number_scheduled, 1);
        let max_surge = scaled(rolling_params.max_surge.as_ref(), status.desired_number_scheduled, 0);
        let max_unavailable = if max_unavailable == 0 && max_surge == 0 { 1 } else { max_unavailable };
        let mut unavailable = 0;
        let mut candidates = Vec::new();
        let mut surging = 0;
        let mut surge_candidates = Vec::new();
        for (node_name, fit) in &fits {
            if !fit.should_run {
                continue;
            }
            let here: Vec<&Pod> = by_node
                .get(*node_name)
                .into_iter()
                .flatten()
                .copied()
                .filter(|p| {
                    p.metadata.deletion_timestamp.is_none()
                        && !deleting.contains(p.metadata.uid.as_deref().unwrap_or(""))
                })
                .collect();
            let new = here.iter().copied().find(|p| pod_hash(p) == Some(hash.as_str()));
            let old = here.iter().copied().find(|p| pod_hash(p) != Some(hash.as_str()));
            let available = |p: &Pod| available_at(p, min_ready).is_some_and(|at| at <= now);
            match (old, new) {
                (None, None) => unavailable += 1,
                (None, Some(new)) => unavailable += usize::from(!available(new)),
                (Some(old), Some(new)) => {
                    surging += 1;
                    if available(new) {
                        deletions.push(old);
                    }
                }
                (Some(old), None) if !available(old) => deletions.push(old),
                (Some(old), None) if max_surge > 0 => surge_candidates.push((*node_name, old)),
                (Some(old), None) => candidates.push(old),
            }
        }
        if max_surge > 0 {
            let room = max_surge.saturating_sub(surging);
            creations.extend(surge_candidates.iter().take(room).map(|(n, _)| n.to_string()));
        } else {
            deletions.extend(candidates.into_iter().take(max_unavailable.saturating_sub(unavailable)));
        }
    }

    status.number_available = Some(number_available);
    status.number_unavailable = Some((status.desired_number_scheduled - number_available).max(0));
    status.updated_number_scheduled = Some(updated);
    plan.requeue_after = next_available.map(|at| (at - now).to_std().unwrap_or(Duration::ZERO));

    if expectations_satisfied {
        let mut seen = HashSet::new();
        for pod in deletions {
            let Some(pod_uid) = pod.metadata.uid.clone() else { continue };
            if !seen.insert(pod_uid.clone()) {
                continue;
            }
            plan.actions.push(Action::delete_of(pod, None));
            plan.expected_deletions.push(pod_uid);
        }
        plan.expected_creations = creations.len();
        for node_name in &creations {
            let pod = new_pod(ds, name, uid, &namespace, &pod_spec, &hash, generation, node_name);
            plan.actions.push(Action::Create(pod));
        }
    }
    if old_status.as_ref() != Some(&status) {
        let mut updated = ds.clone();
        updated.status = Some(status);
        if let Ok(v) = serde_json::to_value(&updated) {
            plan.actions.push(Action::UpdateStatus(v));
        }
    }
    plan
}

/// Whether a daemon pod with `spec` (tolerations included) belongs on `node`.
pub fn node_fit(spec: &PodSpec, node: &Node) -> NodeFit {
    let no = NodeFit { should_run: false, should_continue_running: false };
    let node_name = node.metadata.name.as_deref().unwrap_or("");
    let empty = BTreeMap::new();
    let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
    if spec.node_name.as_deref().is_some_and(|n| n != node_name) {
        return no;
    }
    if let Some(selector) = &spec.node_selector {
        if selector.iter().any(|(k, v)| labels.get(k) != Some(v)) {
            return no;
        }
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref());
    if let Some(required) = required {
        if !required.node_selector_terms.iter().any(|t| term_matches(t, node_name, labels)) {
            return no;
        }
    }
    let tolerations = spec.tolerations.as_deref().unwrap_or(&[]);
    let mut fit = NodeFit { should_run: true, should_continue_running: true };
    for taint in node.spec.iter().flat_map(|s| s.taints.iter().flatten()) {
        if tolerations.iter().any(|t| tolerates(t, taint)) {
            continue;
        }
        match taint.effect.as_str() {
            "NoExecute" => return no,
            "NoSchedule" => fit.should_run = false,
            _ => {}
        }
    }
    fit
}

/// A node selector term: every expression and field requirement holds (an
/// empty term matches no node, as in Kubernetes).
fn term_matches(term: &NodeSelectorTerm, node_name: &str, labels: &BTreeMap<String, String>) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or(&[]);
    let fields = term.match_fields.as_deref().unwrap_or(&[]);
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    exprs.iter().all(|r| requirement_matches(r, labels.get(&r.key).map(String::as_str)))
        && fields.iter().all(|r| r.key == "metadata.name" && requirement_matches(r, Some(node_name)))
}

fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or(&[]);
    let number = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => matches!((value.and_then(number), values.first().and_then(|x| number(x))), (Some(a), Some(b)) if a > b),
        "Lt" => matches!((value.and_then(number), values.first().and_then(|x| number(x))), (Some(a), Some(b)) if a < b),
        _ => false,
    }
}

/// Kubernetes' `Toleration.ToleratesTaint`.
fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    if t.effect.as_deref().is_some_and(|e| !e.is_empty() && e != taint.effect) {
        return false;
    }
    if t.key.as_deref().is_some_and(|k| !k.is_empty() && k != taint.key) {
        return false;
    }
    match t.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" | "" => t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
        _ => false,
    }
}

/// The template's pod spec with the daemon tolerations added.
fn daemon_pod_spec(mut spec: PodSpec) -> PodSpec {
    let mut wanted: Vec<(&str, &str)> = DAEMON_TOLERATIONS.to_vec();
    if spec.host_network == Some(true) {
        wanted.push(HOST_NETWORK_TOLERATION);
    }
    let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
    for (key, effect) in wanted {
        let present = tolerations.iter().any(|t| t.key.as_deref() == Some(key) && t.effect.as_deref() == Some(effect));
        if !present {
            tolerations.push(Toleration {
                key: Some(key.into()),
                operator: Some("Exists".into()),
                effect: Some(effect.into()),
                ..Toleration::default()
            });
        }
    }
    spec
}

/// A daemon pod for `node`: the template, the revision hash, and a required
/// node affinity to exactly that node, for the scheduler to bind.
#[allow(clippy::too_many_arguments)]
fn new_pod(
    ds: &DaemonSet,
    name: &str,
    uid: &str,
    namespace: &str,
    spec: &PodSpec,
    hash: &str,
    generation: i64,
    node: &str,
) -> Value {
    let template_meta = ds.spec.as_ref().and_then(|s| s.template.metadata.clone()).unwrap_or_default();
    let mut labels = template_meta.labels.unwrap_or_default();
    labels.insert(REVISION_HASH_LABEL.into(), hash.into());
    labels.insert(TEMPLATE_GENERATION_LABEL.into(), generation.to_string());
    let mut spec = spec.clone();
    let affinity = spec.affinity.get_or_insert_with(Affinity::default);
    let node_affinity = affinity.node_affinity.get_or_insert_with(NodeAffinity::default);
    // The controller already checked the template's own terms against the
    // node; the pod keeps only the one that names it.
    node_affinity.required_during_scheduling_ignored_during_execution = Some(NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_fields: Some(vec![NodeSelectorRequirement {
                key: "metadata.name".into(),
                operator: "In".into(),
                values: Some(vec![node.into()]),
            }]),
            match_expressions: None,
        }],
    });
    let pod = Pod {
        metadata: ObjectMeta {
            generate_name: Some(format!("{name}-")),
            namespace: Some(namespace.into()),
            labels: Some(labels),
            annotations: template_meta.annotations,
            owner_references: Some(vec![OwnerReference {
                api_version: "apps/v1".into(),
                kind: "DaemonSet".into(),
                name: name.into(),
                uid: uid.into(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    };
    serde_json::to_value(pod).unwrap_or(Value::Null)
}

/// The node a pod is for: where it is bound, else the node its required
/// affinity names (a daemon pod not yet scheduled).
pub fn target_node(pod: &Pod) -> Option<&str> {
    let spec = pod.spec.as_ref()?;
    if let Some(n) = spec.node_name.as_deref() {
        return Some(n);
    }
    let terms = &spec
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms;
    terms.iter().flat_map(|t| t.match_fields.iter().flatten()).find_map(|r| {
        let values = r.values.as_deref()?;
        (r.key == "metadata.name" && r.operator == "In" && values.len() == 1).then(|| values[0].as_str())
    })
}

/// A stable hash of the template (and the collision count, which changes
/// it when two templates collide), in Kubernetes' safe alphabet: the same
/// template always gives the same label, on every controller replica.
pub fn template_hash(template: &PodTemplateSpec, collision_count: Option<i32>) -> String {
    let mut text = String::new();
    canonical_json(&serde_json::to_value(template).unwrap_or(Value::Null), &mut text);
    if let Some(c) = collision_count {
        text.push_str(&c.to_string());
    }
    // FNV-1a, 32 bits.
    let mut h: u32 = 0x811c_9dc5;
    for b in text.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    const SAFE: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    h.to_string().bytes().map(|b| char::from(SAFE[usize::from(b) % SAFE.len()])).collect()
}

/// JSON with object keys sorted, whatever map the build of serde_json uses.
fn canonical_json(v: &Value, out: &mut String) {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&json!(k).to_string());
                out.push(':');
                canonical_json(&m[k], out);
            }
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical_json(x, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// `maxUnavailable`/`maxSurge` as a count of `total` nodes (percentages
/// round up, as Kubernetes does); `default` when unset or malformed.
fn scaled(value: Option<&IntOrString>, total: i32, default: i32) -> usize {
    let n = match value {
        None => default,
        Some(IntOrString::Int(n)) => *n,
        Some(IntOrString::String(s)) => match s.strip_suffix('%').and_then(|p| p.parse::<i64>().ok()) {
            Some(p) => i32::try_from((p * i64::from(total) + 99).div_euclid(100)).unwrap_or(default),
            None => default,
        },
    };
    usize::try_from(n).unwrap_or(0)
}

fn controller_uid(pod: &Pod) -> Option<&str> {
    pod.metadata.owner_references.iter().flatten().find(|r| r.controller == Some(true)).map(|r| r.uid.as_str())
}

fn pod_hash(pod: &Pod) -> Option<&str> {
    pod.metadata.labels.as_ref()?.get(REVISION_HASH_LABEL).map(String::as_str)
}

fn phase(pod: &Pod) -> &str {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending")
}

fn creation(pod: &Pod) -> Option<DateTime<Utc>> {
    pod.metadata.creation_timestamp.as_ref().map(|t| t.0)
}

fn oldest<'a>(pods: &[&'a Pod]) -> Option<&'a Pod> {
    pods.iter().copied().min_by_key(|p| creation(p))
}

fn is_ready(pod: &Pod) -> bool {
    ready_since(pod).is_some()
}

/// When the pod became ready, if it is.
fn ready_since(pod: &Pod) -> Option<DateTime<Utc>> {
    let c = pod.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "Ready" && c.status == "True")?;
    Some(c.last_transition_time.as_ref().map_or(DateTime::<Utc>::MIN_UTC, |t| t.0))
}

/// When a ready pod counts as available: `minReadySeconds` after it
/// became ready. `None` if it is not ready.
fn available_at(pod: &Pod, min_ready: TimeDelta) -> Option<DateTime<Utc>> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    ready_since(pod).map(|t| t.checked_add_signed(min_ready).unwrap_or(t))
}

#[cfg(test)]
mod tests;
