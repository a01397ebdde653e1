//! The scheduler's view of the cluster: every node and every pod placed on
//! one, with the pods this scheduler has decided but not yet seen bound.
//!
//! A decision counts its pod on the chosen node at once ([`Cache::assume`]),
//! so the next decision, made before the binding is committed and long
//! before the watch shows it, does not overcommit that node. The watch
//! showing the pod bound confirms the assumption; a failed binding forgets
//! it. Only the scheduling loop touches the cache, so it needs no lock.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use skiff_client::runtime::reflector::ObjectKey;

use crate::cluster::Cluster;
use crate::framework::PodInfo;
use crate::selector::Selector;

/// The loop's cluster view; see the module docs.
#[derive(Default)]
pub struct Cache {
    cluster: Cluster,
    /// Pods counted on a node by decision, not yet by the watch: their node.
    assumed: HashMap<ObjectKey, String>,
    /// Pending pods that preempted on a node, counted there so that no
    /// other pod takes the room their victims leave.
    nominated: HashMap<ObjectKey, Nomination>,
}

/// Where a pending pod preempted: the node it holds room on, and the
/// victims it evicted there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nomination {
    /// The node (`status.nominatedNodeName`).
    pub node: String,
    /// The pods evicted for it.
    pub victims: Vec<ObjectKey>,
    /// When they were.
    pub at: Instant,
}

/// How long a victim the watch does not show terminating yet is still
/// waited for: its deletion may not have come back through the watch, or
/// may have failed (then the pod preempts again).
pub(crate) const UNSEEN_EVICTION_WAIT: Duration = Duration::from_secs(5);

impl Cache {
    /// An empty cache.
    pub fn new() -> Cache {
        Cache { cluster: Cluster::new(), assumed: HashMap::new(), nominated: HashMap::new() }
    }

    /// What decisions read.
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// A node added or changed.
    pub fn upsert_node(&mut self, node: Arc<Node>) {
        self.cluster.upsert_node(node);
    }

    /// A node deleted; its pods stay counted until they go.
    pub fn remove_node(&mut self, name: &str) {
        self.cluster.remove_node(name);
    }

    /// A pod as the watch shows it. One bound to a node and still running
    /// counts there (confirming an assumption); one finished, or not bound,
    /// counts nowhere, except a pod assumed onto a node that the watch has
    /// not shown bound yet, which stays where it was assumed.
    pub fn observe_pod(&mut self, pod: Arc<Pod>) {
        let key = ObjectKey::of(pod.as_ref());
        let bound = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some_and(|n| !n.is_empty());
        if bound && !is_terminal(&pod) {
            self.assumed.remove(&key);
            self.nominated.remove(&key);
            self.cluster.add_pod(Arc::new(PodInfo::new(pod)));
        } else if !bound && (self.assumed.contains_key(&key) || self.nominated.contains_key(&key)) {
            // The binding is still on its way, or the room is held.
        } else {
            self.assumed.remove(&key);
            self.nominated.remove(&key);
            self.cluster.remove_pod(&key);
        }
    }

    /// A pod the watch shows deleted.
    pub fn remove_pod(&mut self, key: &ObjectKey) {
        self.assumed.remove(key);
        self.nominated.remove(key);
        self.cluster.remove_pod(key);
    }

    /// Counts `pod` on `node` ahead of its binding.
    pub fn assume(&mut self, pod: &PodInfo, node: &str) -> Arc<PodInfo> {
        let info = Arc::new(pod.bound_to(node));
        self.assumed.insert(info.key.clone(), node.to_string());
        self.cluster.add_pod(info.clone());
        info
    }

    /// Holds `pod`'s room on `node`, where it has just preempted, until it
    /// is tried again ([`release_nomination`](Cache::release_nomination)),
    /// bound or deleted. Kubernetes counts a nominated pod only against
    /// pods of lower or equal priority; here it counts against every pod,
    /// and preemption never picks it as a victim.
    pub fn nominate(&mut self, pod: &PodInfo, nomination: Nomination) {
        self.cluster.add_pod(Arc::new(pod.bound_to(&nomination.node)));
        self.nominated.insert(pod.key.clone(), nomination);
    }

    /// Gives up `key`'s held room, before the pod is tried again; where it
    /// was held.
    pub fn release_nomination(&mut self, key: &ObjectKey) -> Option<Nomination> {
        let nomination = self.nominated.remove(key)?;
        self.cluster.remove_pod(key);
        Some(nomination)
    }

    /// Gives up the room `pod` (`key`) held since preempting, before it is
    /// tried again, and returns the pod as that decision must see it
    /// (nominated to the node it held room on, which is tried first) and
    /// where it held room. Its `status.nominatedNodeName` is written off
    /// the loop after the evictions, and the watch may not have brought it
    /// back yet.
    pub fn release_for_retry(&mut self, key: &ObjectKey, pod: Arc<Pod>) -> (Arc<Pod>, Option<Nomination>) {
        let held = self.release_nomination(key);
        let pod = match &held {
            Some(n) if pod.status.as_ref().and_then(|s| s.nominated_node_name.as_ref()).is_none() => {
                let mut nominated = (*pod).clone();
                nominated.status.get_or_insert_with(Default::default).nominated_node_name = Some(n.node.clone());
                Arc::new(nominated)
            }
            _ => pod,
        };
        (pod, held)
    }

    /// Whether a victim of `nomination` is still in the cluster, and
    /// terminating or evicted only just now. Until they have all left, the
    /// pod waits for them (holding their room) instead of preempting again:
    /// the watch may not even show them terminating yet, and preempting
    /// again would evict more pods than it needs.
    pub fn victims_remain(&self, nomination: &Nomination) -> bool {
        let recent = nomination.at.elapsed() < UNSEEN_EVICTION_WAIT;
        nomination.victims.iter().filter_map(|v| self.cluster.pod(v)).any(|v| v.terminating || recent)
    }

    /// Whether `key` holds room on a node without being bound there.
    pub fn is_nominated(&self, key: &ObjectKey) -> bool {
        self.nominated.contains_key(key)
    }

    /// Undoes [`assume`](Cache::assume) after a failed binding; a pod the
    /// watch has since shown bound stays.
    pub fn forget(&mut self, key: &ObjectKey) {
        if self.assumed.remove(key).is_some() {
            self.cluster.remove_pod(key);
        }
    }

    /// A namespace's labels, for affinity terms with a namespaceSelector.
    pub fn set_namespace_labels(&mut self, namespace: &str, labels: std::collections::BTreeMap<String, String>) {
        self.cluster.set_namespace_labels(namespace, labels);
    }

    /// A namespace deleted.
    pub fn remove_namespace(&mut self, namespace: &str) {
        self.cluster.remove_namespace(namespace);
    }

    /// The selector of a Service, ReplicaSet or ReplicationController whose
    /// pods are spread (`None`: it is gone).
    pub fn set_spreading_selector(&mut self, namespace: &str, owner: &str, selector: Option<Selector>) {
        self.cluster.set_spreading_selector(namespace, owner, selector);
    }

    /// Whether `key` is counted by decision, its binding not yet seen.
    pub fn is_assumed(&self, key: &ObjectKey) -> bool {
        self.assumed.contains_key(key)
    }

    /// Pods assumed and not yet seen bound.
    pub fn assumed_len(&self) -> usize {
        self.assumed.len()
    }

    /// Starts over from the informers' stores (after a missed change),
    /// keeping the assumptions whose pods are still unbound and alive.
    pub fn rebuild(&mut self, nodes: &[Arc<Node>], pods: &[Arc<Pod>]) {
        let assumed = std::mem::take(&mut self.assumed);
        // Held room is given up: its pods are tried again after a resync.
        self.nominated.clear();
        let mut kept: Vec<(Arc<PodInfo>, String)> = Vec::new();
        for (key, node) in &assumed {
            if let Some(info) = self.cluster.node(node).and_then(|n| n.pods.iter().find(|p| &p.key == key)) {
                kept.push((info.clone(), node.clone()));
            }
        }
        self.cluster = Cluster::new();
        for node in nodes {
            self.cluster.upsert_node(node.clone());
        }
        let live: HashMap<ObjectKey, &Arc<Pod>> = pods.iter().map(|p| (ObjectKey::of(p.as_ref()), p)).collect();
        for pod in pods {
            self.observe_pod(pod.clone());
        }
        for (info, node) in kept {
            let still_pending = live.get(&info.key).is_some_and(|p| {
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_none_or(str::is_empty)
                    && p.metadata.deletion_timestamp.is_none()
            });
            if still_pending {
                self.assumed.insert(info.key.clone(), node);
                self.cluster.add_pod(info);
            }
        }
    }
}

/// A pod that has finished no longer holds its node's resources.
pub fn is_terminal(pod: &Pod) -> bool {
    matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded") | Some("Failed"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn node(name: &str, cpu: &str) -> Arc<Node> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name},
                "status": {"allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"},
                           "capacity": {"cpu": cpu, "memory": "8Gi", "pods": "110"}}
            }))
            .expect("a node"),
        )
    }

    fn pod(name: &str, node: Option<&str>, cpu: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i",
                "resources": {"requests": {"cpu": cpu}}}]}
        }))
        .expect("a pod")
    }

    fn nominated(node: &str) -> Nomination {
        Nomination { node: node.into(), victims: Vec::new(), at: Instant::now() }
    }

    fn requested_cpu(cache: &Cache, node: &str) -> i64 {
        cache.cluster().node(node).expect("node known").requested.milli_cpu
    }

    #[test]
    fn an_assumed_pod_counts_on_its_node_until_forgotten() {
        let mut cache = Cache::new();
        cache.upsert_node(node("n1", "4"));
        let p = pod("a", None, "1");
        cache.assume(&PodInfo::new(Arc::new(p.clone())), "n1");
        assert_eq!(requested_cpu(&cache, "n1"), 1000);
        assert!(cache.is_assumed(&ObjectKey::new("default", "a")));
        cache.forget(&ObjectKey::new("default", "a"));
        assert_eq!(requested_cpu(&cache, "n1"), 0);
        assert_eq!(cache.assumed_len(), 0);
    }

    #[test]
    fn the_watch_showing_the_pod_unbound_keeps_the_assumption_and_bound_confirms_it() {
        let mut cache = Cache::new();
        cache.upsert_node(node("n1", "4"));
        let p = pod("a", None, "1");
        cache.assume(&PodInfo::new(Arc::new(p.clone())), "n1");
        // An update from before the binding (e.g. a label change) arrives.
        cache.observe_pod(Arc::new(p.clone()));
        assert_eq!(requested_cpu(&cache, "n1"), 1000, "still counted while the binding is on its way");
        cache.observe_pod(Arc::new(pod("a", Some("n1"), "1")));
        assert!(!cache.is_assumed(&ObjectKey::new("default", "a")));
        assert_eq!(requested_cpu(&cache, "n1"), 1000, "counted once");
        cache.forget(&ObjectKey::new("default", "a"));
        assert_eq!(requested_cpu(&cache, "n1"), 1000, "a confirmed pod is not forgotten");
    }

    #[test]
    fn a_finished_or_deleted_pod_frees_its_node() {
        let mut cache = Cache::new();
        cache.upsert_node(node("n1", "4"));
        cache.observe_pod(Arc::new(pod("a", Some("n1"), "1")));
        cache.observe_pod(Arc::new(pod("b", Some("n1"), "2")));
        assert_eq!(requested_cpu(&cache, "n1"), 3000);
        let mut done = pod("a", Some("n1"), "1");
        done.status = Some(serde_json::from_value(json!({"phase": "Succeeded"})).expect("a status"));
        cache.observe_pod(Arc::new(done));
        assert_eq!(requested_cpu(&cache, "n1"), 2000);
        cache.remove_pod(&ObjectKey::new("default", "b"));
        assert_eq!(requested_cpu(&cache, "n1"), 0);
    }

    #[test]
    fn a_nominated_pod_holds_its_room_through_its_own_updates_until_released() {
        let mut cache = Cache::new();
        cache.upsert_node(node("n1", "4"));
        let p = pod("a", None, "3");
        let key = ObjectKey::new("default", "a");
        cache.nominate(&PodInfo::new(Arc::new(p.clone())), nominated("n1"));
        assert_eq!(requested_cpu(&cache, "n1"), 3000);
        assert!(cache.is_nominated(&key) && !cache.is_assumed(&key), "held, not assumed: it is still queued");
        // Its nominatedNodeName being written comes back through the watch.
        cache.observe_pod(Arc::new(p.clone()));
        assert_eq!(requested_cpu(&cache, "n1"), 3000);
        cache.release_nomination(&key);
        assert_eq!(requested_cpu(&cache, "n1"), 0);
        cache.nominate(&PodInfo::new(Arc::new(p)), nominated("n1"));
        cache.observe_pod(Arc::new(pod("a", Some("n1"), "3")));
        assert!(!cache.is_nominated(&key), "bound: the room is its own now");
        assert_eq!(requested_cpu(&cache, "n1"), 3000);
    }

    #[test]
    fn a_pod_tried_again_waits_for_its_victims_while_holding_their_room() {
        let mut cache = Cache::new();
        cache.upsert_node(node("n1", "1"));
        let victim = ObjectKey::new("default", "low");
        cache.observe_pod(Arc::new(pod("low", Some("n1"), "1")));
        let key = ObjectKey::new("default", "high");
        let high = pod("high", None, "1");
        // It preempted `low` on n1; the watch has shown neither the
        // eviction nor its nominatedNodeName yet.
        cache.nominate(
            &PodInfo::new(Arc::new(high.clone())),
            Nomination { node: "n1".into(), victims: vec![victim.clone()], at: Instant::now() },
        );
        assert_eq!(requested_cpu(&cache, "n1"), 2000, "the victim, and the room held after it");

        let (seen, held) = cache.release_for_retry(&key, Arc::new(high.clone()));
        let held = held.expect("it held room");
        assert_eq!(held.node, "n1");
        assert_eq!(seen.status.as_ref().and_then(|s| s.nominated_node_name.as_deref()), Some("n1"));
        assert!(cache.victims_remain(&held), "low is still there: wait, do not preempt again");
        cache.nominate(&PodInfo::new(seen), held);

        cache.remove_pod(&victim);
        assert_eq!(requested_cpu(&cache, "n1"), 1000, "the victim left; its room is held");
        let (_, held) = cache.release_for_retry(&key, Arc::new(high));
        assert!(!cache.victims_remain(&held.expect("still held")), "free to be placed, or to preempt anew");
        assert_eq!(requested_cpu(&cache, "n1"), 0);

        // A victim the watch never shows terminating (its deletion failed)
        // is waited for only briefly; a terminating one until it is gone.
        let mut stuck = pod("stuck", Some("n1"), "1");
        cache.observe_pod(Arc::new(stuck.clone()));
        let long_ago = Instant::now().checked_sub(UNSEEN_EVICTION_WAIT * 2).expect("a past instant");
        let stale = Nomination { node: "n1".into(), victims: vec![ObjectKey::new("default", "stuck")], at: long_ago };
        assert!(!cache.victims_remain(&stale));
        assert!(cache.victims_remain(&Nomination { at: Instant::now(), ..stale.clone() }));
        stuck.metadata.deletion_timestamp =
            Some(serde_json::from_value(json!("2026-12-07T00:00:00Z")).expect("a time"));
        cache.observe_pod(Arc::new(stuck));
        assert!(cache.victims_remain(&stale));
    }

    #[test]
    fn a_rebuild_keeps_assumptions_of_pods_still_waiting_for_their_binding() {
        let mut cache = Cache::new();
        cache.upsert_node(node("n1", "4"));
        let waiting = pod("a", None, "1");
        let gone = pod("b", None, "1");
        cache.assume(&PodInfo::new(Arc::new(waiting.clone())), "n1");
        cache.assume(&PodInfo::new(Arc::new(gone)), "n1");
        let bound = Arc::new(pod("c", Some("n1"), "2"));
        cache.rebuild(&[node("n1", "4")], &[Arc::new(waiting), bound]);
        assert_eq!(requested_cpu(&cache, "n1"), 3000, "a (assumed) and c (bound); b is gone");
        assert_eq!(cache.assumed_len(), 1);
    }
}
