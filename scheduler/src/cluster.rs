//! Every node and every pod placed on one, as the scheduler's cache sees
//! them, with the indexes that keep a decision from scanning every pod:
//! placed pods by namespace and by label, and the (anti-)affinity terms of
//! placed pods grouped by term with their count per topology domain.
//!
//! One `Cluster` is owned by the scheduling loop; informer events and
//! assumptions are applied between decisions, so nothing here locks. Only
//! pods on known nodes are indexed: a pod whose node is unknown (not yet
//! seen, or removed) waits, accounted to that name, until the node
//! appears or the pod is removed, as kube's cache keeps them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::Node;
use skiff_client::runtime::reflector::ObjectKey;

use crate::framework::{AffinityTerm, Namespaces, NodeInfo, PodInfo};
use crate::selector::{Selector, NO_LABELS};
use crate::spread::SpreadQuery;

/// Placed pods by key.
type PodSet = HashMap<ObjectKey, Arc<PodInfo>>;
/// Pods per topology value (the value of a term's topology key on their
/// node). Read for every node of a decision, hence FxHash.
pub(crate) type DomainCounts = HashMap<String, i64, rustc_hash::FxBuildHasher>;

/// The (anti-)affinity terms of placed pods, equal terms merged, each with
/// how many of its pods sit in each domain. A decision walks the distinct
/// terms (a handful per workload), not the pods.
#[derive(Debug, Default)]
pub(crate) struct TermIndex {
    /// Required anti-affinity: the incoming pod may not join a domain listed here if it matches the term.
    pub required_anti: HashMap<AffinityTerm, Arc<DomainCounts>>,
    /// Required affinity: scores as kube's hardPodAffinityWeight.
    pub required_affinity: HashMap<AffinityTerm, Arc<DomainCounts>>,
    /// Preferred terms with their weight, negative for anti-affinity.
    pub preferred: HashMap<(AffinityTerm, i64), Arc<DomainCounts>>,
}

/// Adds `delta` to `value`'s count, dropping counts (and keys) that reach
/// zero. Counts are shared with decisions by `Arc`; between decisions
/// nobody else holds them, so `make_mut` does not copy.
fn count<K: Eq + std::hash::Hash + Clone>(map: &mut HashMap<K, Arc<DomainCounts>>, key: &K, value: &str, delta: i64) {
    if !map.contains_key(key) {
        if delta < 0 {
            return;
        }
        map.insert(key.clone(), Arc::default());
    }
    let Some(domains) = map.get_mut(key) else { return };
    let domains_mut = Arc::make_mut(domains);
    let n = domains_mut.entry(value.to_string()).or_default();
    *n += delta;
    if *n <= 0 {
        domains_mut.remove(value);
        if domains_mut.is_empty() {
            map.remove(key);
        }
    }
}

/// A question decisions ask again and again: how many pods matching
/// `namespaces` and `selector` sit in each domain of `topology_key`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct MatchQuery {
    namespaces: Namespaces,
    selector: Selector,
    topology_key: String,
}

/// The answer to a `MatchQuery`.
#[derive(Debug, Clone, Default)]
pub(crate) struct MatchCounts {
    /// Matching pods per domain (domains without any are absent).
    pub domains: Arc<DomainCounts>,
    /// Matching pods on nodes that have the topology key.
    pub total: i64,
}

/// Queries kept up to date at most; past this the cache starts over, so a
/// stream of one-off selectors cannot make every pod change slow.
const MAX_CACHED_QUERIES: usize = 64;

impl TermIndex {
    fn apply(&mut self, pod: &PodInfo, node_labels: &BTreeMap<String, String>, delta: i64) {
        for t in &pod.required_anti_affinity {
            if let Some(v) = node_labels.get(&t.topology_key) {
                count(&mut self.required_anti, t, v, delta);
            }
        }
        for t in &pod.required_affinity {
            if let Some(v) = node_labels.get(&t.topology_key) {
                count(&mut self.required_affinity, t, v, delta);
            }
        }
        let weighted = pod.preferred_affinity.iter().map(|(w, t)| (t, i64::from(*w)));
        let weighted = weighted.chain(pod.preferred_anti_affinity.iter().map(|(w, t)| (t, -i64::from(*w))));
        for (t, w) in weighted {
            if let Some(v) = node_labels.get(&t.topology_key) {
                // The key clone is only paid for a term's first pod.
                let key = (t.clone(), w);
                count(&mut self.preferred, &key, v, delta);
            }
        }
    }
}

/// Every node, every placed pod, and the indexes over them.
#[derive(Debug, Default)]
pub struct Cluster {
    nodes: Vec<NodeInfo>,
    positions: HashMap<String, usize>,
    /// Node positions by label key, then value, so a decision whose pod
    /// names its nodes (a nodeSelector, the domains its required affinity
    /// wants) filters those instead of every node.
    nodes_by_label: HashMap<String, HashMap<String, BTreeSet<usize>>>,
    /// Every placed pod, on a known node or not.
    pods: PodSet,
    /// Pods placed on a node the cluster does not know, by node name.
    waiting: HashMap<String, PodSet>,
    /// Indexed (on a known node) pods by namespace.
    by_namespace: HashMap<String, PodSet>,
    /// Indexed pods by label key, then value.
    by_label: HashMap<String, HashMap<String, PodSet>>,
    pub(crate) terms: TermIndex,
    namespace_labels: HashMap<String, BTreeMap<String, String>>,
    /// Selectors of Services, ReplicaSets, ReplicationControllers and
    /// StatefulSets, by namespace then owner, for selector spreading.
    spreaders: HashMap<String, BTreeMap<String, Selector>>,
    /// Answers to the match queries of recent decisions (the selectors of
    /// incoming pods' affinity terms), kept current by every pod change
    /// so a decision reads them instead of scanning matching pods. Behind
    /// a mutex only because decisions take `&Cluster`; the loop is the
    /// one user, so it is never contended.
    match_cache: Mutex<HashMap<MatchQuery, Arc<MatchCounts>>>,
    /// Answers to the topology spread questions of recent decisions:
    /// matching pods per domain, every domain with a counted node present.
    /// Kept current by every pod change; dropped when a node comes, goes
    /// or changes its labels or taints (the domains and the nodes counted
    /// may change). Behind a mutex for the same reason as `match_cache`.
    spread_cache: Mutex<HashMap<SpreadQuery, Arc<DomainCounts>>>,
}

impl Cluster {
    /// An empty cluster.
    pub fn new() -> Cluster {
        Cluster::default()
    }

    /// Adds or replaces a node; pods already placed on it stay and are recounted.
    pub fn upsert_node(&mut self, node: Arc<Node>) {
        let name = node.metadata.name.clone().unwrap_or_default();
        match self.positions.get(&name).copied() {
            Some(i) => {
                let labels_changed = self.nodes[i].labels() != node.metadata.labels.as_ref().unwrap_or(&NO_LABELS);
                let taints = node.spec.as_ref().and_then(|s| s.taints.as_deref()).unwrap_or_default();
                if labels_changed || self.nodes[i].taints.as_slice() != taints {
                    self.forget_spread_counts();
                }
                if labels_changed {
                    self.unindex_node(i);
                    self.unlabel_node(i, i);
                }
                self.nodes[i] = self.nodes[i].with_node(node);
                if labels_changed {
                    self.index_node(i);
                    self.label_node(i, i);
                }
            }
            None => {
                self.forget_spread_counts();
                let mut info = NodeInfo::new(node);
                for (_, pod) in self.waiting.remove(&name).unwrap_or_default() {
                    info.add_pod(pod);
                }
                self.positions.insert(name, self.nodes.len());
                self.nodes.push(info);
                self.index_node(self.nodes.len() - 1);
                self.label_node(self.nodes.len() - 1, self.nodes.len() - 1);
            }
        }
    }

    /// Removes a node. Pods accounted to it stay (unindexed) until they are
    /// removed or the node comes back, as kube's cache does.
    pub fn remove_node(&mut self, name: &str) {
        let Some(i) = self.positions.remove(name) else { return };
        self.forget_spread_counts();
        self.unindex_node(i);
        self.unlabel_node(i, i);
        let last = self.nodes.len() - 1;
        if i != last {
            // The last node takes position i.
            self.unlabel_node(last, last);
            self.label_node(last, i);
        }
        let info = self.nodes.swap_remove(i);
        if let Some(moved) = self.nodes.get(i) {
            self.positions.insert(moved.name.clone(), i);
        }
        if !info.pods.is_empty() {
            let waiting = self.waiting.entry(info.name.clone()).or_default();
            for pod in info.pods {
                waiting.insert(pod.key.clone(), pod);
            }
        }
    }

    /// Places a pod (bound, or assumed by the loop) on `pod.node_name()`;
    /// re-adding a key replaces the earlier pod. A pod without a node is ignored.
    pub fn add_pod(&mut self, pod: Arc<PodInfo>) {
        self.remove_pod(&pod.key);
        let Some(node) = pod.node_name().map(str::to_string) else { return };
        self.pods.insert(pod.key.clone(), pod.clone());
        match self.positions.get(&node).copied() {
            Some(i) => {
                self.index_pod(&pod, i);
                self.nodes[i].add_pod(pod);
            }
            None => {
                self.waiting.entry(node).or_default().insert(pod.key.clone(), pod);
            }
        }
    }

    /// Removes a placed pod, returning it.
    pub fn remove_pod(&mut self, key: &ObjectKey) -> Option<Arc<PodInfo>> {
        let pod = self.pods.remove(key)?;
        let node = pod.node_name().unwrap_or_default();
        match self.positions.get(node).copied() {
            Some(i) => {
                self.unindex_pod(&pod, i);
                self.nodes[i].remove_pod(key);
            }
            None => {
                if let Some(w) = self.waiting.get_mut(node) {
                    w.remove(key);
                    if w.is_empty() {
                        self.waiting.remove(node);
                    }
                }
            }
        }
        Some(pod)
    }

    /// A placed pod by key.
    pub fn pod(&self, key: &ObjectKey) -> Option<&Arc<PodInfo>> {
        self.pods.get(key)
    }

    /// Number of placed pods, on known nodes or not.
    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }

    /// A node by name.
    pub fn node(&self, name: &str) -> Option<&NodeInfo> {
        self.positions.get(name).map(|i| &self.nodes[*i])
    }

    /// Every node, in the order decisions walk them.
    pub fn nodes(&self) -> &[NodeInfo] {
        &self.nodes
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Records a namespace's labels, for affinity terms with a namespaceSelector.
    pub fn set_namespace_labels(&mut self, namespace: &str, labels: BTreeMap<String, String>) {
        self.namespace_labels.insert(namespace.to_string(), labels);
        self.match_cache.get_mut().unwrap_or_else(PoisonError::into_inner).clear();
    }

    /// Forgets a namespace's labels.
    pub fn remove_namespace(&mut self, namespace: &str) {
        self.namespace_labels.remove(namespace);
        self.match_cache.get_mut().unwrap_or_else(PoisonError::into_inner).clear();
    }

    /// Sets (Some) or removes (None) the selector of one spreading owner
    /// (`owner` names it uniquely in its namespace, e.g. "Service/web" or
    /// "ReplicaSet/web-7d9f"). Selector spreading counts, for a pod, the
    /// pods matching every selector of its namespace that matches the pod
    /// itself, as kube's DefaultSelector merges Service, RC, RS and
    /// StatefulSet selectors. A selector that selects everything is ignored.
    pub fn set_spreading_selector(&mut self, namespace: &str, owner: &str, selector: Option<Selector>) {
        match selector.filter(|s| !s.requirements().is_empty() && !s.is_nothing()) {
            Some(s) => {
                self.spreaders.entry(namespace.to_string()).or_default().insert(owner.to_string(), s);
            }
            None => {
                if let Some(owners) = self.spreaders.get_mut(namespace) {
                    owners.remove(owner);
                }
            }
        }
    }

    /// The spreading selectors that select `pod`.
    pub(crate) fn spreading_selectors(&self, pod: &PodInfo) -> Vec<&Selector> {
        self.spreaders
            .get(&pod.key.namespace)
            .into_iter()
            .flat_map(|owners| owners.values())
            .filter(|s| s.matches(pod.labels()))
            .collect()
    }

    /// A namespace's labels, if known.
    pub(crate) fn namespace_labels(&self, namespace: &str) -> Option<&BTreeMap<String, String>> {
        self.namespace_labels.get(namespace)
    }

    /// Whether `term` counts `pod` (namespace and labels).
    pub(crate) fn term_matches(&self, term: &AffinityTerm, pod: &PodInfo) -> bool {
        term.matches(pod, |ns| self.namespace_labels(ns))
    }

    /// Calls `f` with every pod on a known node in `namespaces` matching
    /// `selector`, and its node. Uses the label index when the selector has
    /// an `In` requirement and the namespace index when the namespaces are
    /// named; scans every indexed pod otherwise.
    pub(crate) fn for_each_match<'a>(
        &'a self,
        namespaces: &Namespaces,
        selector: &Selector,
        mut f: impl FnMut(&'a PodInfo, &'a NodeInfo),
    ) {
        if selector.is_nothing() {
            return;
        }
        let in_namespace = |pod: &PodInfo| {
            namespaces.names.contains(&pod.key.namespace)
                || namespaces
                    .selector
                    .as_ref()
                    .is_some_and(|s| s.matches(self.namespace_labels(&pod.key.namespace).unwrap_or(&NO_LABELS)))
        };
        let mut visit = |set: &'a PodSet, check_namespace: bool| {
            for pod in set.values() {
                if (!check_namespace || in_namespace(pod)) && selector.matches(pod.labels()) {
                    if let Some(i) = pod.node_name().and_then(|n| self.positions.get(n)) {
                        f(pod, &self.nodes[*i]);
                    }
                }
            }
        };
        if let Some(hint) = selector.index_hint() {
            if let Some(values) = self.by_label.get(&hint.key) {
                for v in &hint.values {
                    if let Some(set) = values.get(v) {
                        visit(set, true);
                    }
                }
            }
        } else if namespaces.selector.is_none() {
            for ns in &namespaces.names {
                if let Some(set) = self.by_namespace.get(ns) {
                    visit(set, false);
                }
            }
        } else {
            for set in self.by_namespace.values() {
                visit(set, true);
            }
        }
    }

    /// Matching pods per domain of `topology_key`, from the cache, or
    /// counted once and cached.
    pub(crate) fn match_counts(
        &self,
        namespaces: &Namespaces,
        selector: &Selector,
        topology_key: &str,
    ) -> Arc<MatchCounts> {
        let query = MatchQuery {
            namespaces: namespaces.clone(),
            selector: selector.clone(),
            topology_key: topology_key.to_string(),
        };
        if let Some(hit) = self.match_cache.lock().unwrap_or_else(PoisonError::into_inner).get(&query) {
            return hit.clone();
        }
        let mut domains = DomainCounts::default();
        let mut total = 0;
        self.for_each_match(namespaces, selector, |_, node| {
            if let Some(v) = node.labels().get(topology_key) {
                *domains.entry(v.clone()).or_default() += 1;
                total += 1;
            }
        });
        let counts = Arc::new(MatchCounts { domains: Arc::new(domains), total });
        let mut cache = self.match_cache.lock().unwrap_or_else(PoisonError::into_inner);
        if cache.len() >= MAX_CACHED_QUERIES {
            cache.clear();
        }
        cache.insert(query, counts.clone());
        counts
    }

    fn update_match_cache(&mut self, pod: &PodInfo, node: usize, delta: i64) {
        let cache = self.match_cache.get_mut().unwrap_or_else(PoisonError::into_inner);
        if cache.is_empty() {
            return;
        }
        let labels = self.nodes[node].node.metadata.labels.as_ref().unwrap_or(&NO_LABELS);
        let namespace_labels = &self.namespace_labels;
        for (query, counts) in cache.iter_mut() {
            let Some(value) = labels.get(&query.topology_key) else { continue };
            let ns = &query.namespaces;
            let in_namespace = ns.names.contains(&pod.key.namespace)
                || ns
                    .selector
                    .as_ref()
                    .is_some_and(|s| s.matches(namespace_labels.get(&pod.key.namespace).unwrap_or(&NO_LABELS)));
            if !in_namespace || !query.selector.matches(pod.labels()) {
                continue;
            }
            let counts = Arc::make_mut(counts);
            counts.total += delta;
            let domains = Arc::make_mut(&mut counts.domains);
            let n = domains.entry(value.clone()).or_default();
            *n += delta;
            if *n <= 0 {
                domains.remove(value);
            }
        }
    }

    /// Matching pods per domain for a topology spread question, from the
    /// cache, or counted once and cached. Every domain of a node the
    /// question counts is present, with 0 when no matching pod is there.
    pub(crate) fn spread_counts(&self, query: &SpreadQuery) -> Arc<DomainCounts> {
        if let Some(hit) = self.spread_cache.lock().unwrap_or_else(PoisonError::into_inner).get(query) {
            return hit.clone();
        }
        let mut domains = DomainCounts::default();
        for node in &self.nodes {
            if let Some(v) = node.labels().get(&query.topology_key) {
                if !domains.contains_key(v) && query.nodes.admits(node) {
                    domains.insert(v.clone(), 0);
                }
            }
        }
        let namespaces = Namespaces { names: [query.namespace.clone()].into(), selector: None };
        self.for_each_match(&namespaces, &query.selector, |other, node| {
            if let Some(n) = query.domain_of(other, node).and_then(|v| domains.get_mut(v)) {
                *n += 1;
            }
        });
        let domains = Arc::new(domains);
        let mut cache = self.spread_cache.lock().unwrap_or_else(PoisonError::into_inner);
        if cache.len() >= MAX_CACHED_QUERIES {
            cache.clear();
        }
        cache.insert(query.clone(), domains.clone());
        domains
    }

    fn forget_spread_counts(&mut self) {
        self.spread_cache.get_mut().unwrap_or_else(PoisonError::into_inner).clear();
    }

    fn update_spread_cache(&mut self, pod: &PodInfo, node: usize, delta: i64) {
        let cache = self.spread_cache.get_mut().unwrap_or_else(PoisonError::into_inner);
        if cache.is_empty() {
            return;
        }
        let node = &self.nodes[node];
        for (query, counts) in cache.iter_mut() {
            if let Some(value) = query.domain_of(pod, node) {
                // Only a counted node's domain is present; this node is one.
                if let Some(n) = Arc::make_mut(counts).get_mut(value) {
                    *n += delta;
                }
            }
        }
    }

    /// Lists node `i`'s labels at `position` in `nodes_by_label`.
    fn label_node(&mut self, i: usize, position: usize) {
        for (k, v) in self.nodes[i].labels() {
            self.nodes_by_label.entry(k.clone()).or_default().entry(v.clone()).or_default().insert(position);
        }
    }

    /// Takes `position` out of `nodes_by_label` for node `i`'s labels.
    fn unlabel_node(&mut self, i: usize, position: usize) {
        for (k, v) in self.nodes[i].labels() {
            let Some(values) = self.nodes_by_label.get_mut(k) else { continue };
            if let Some(set) = values.get_mut(v) {
                set.remove(&position);
                if set.is_empty() {
                    values.remove(v);
                }
            }
            if values.is_empty() {
                self.nodes_by_label.remove(k);
            }
        }
    }

    /// The position of node `name` in `nodes()`.
    pub(crate) fn position(&self, name: &str) -> Option<usize> {
        self.positions.get(name).copied()
    }

    /// Positions (in `nodes()`) of the nodes labelled `key=value`, in order.
    pub(crate) fn nodes_labelled(&self, key: &str, value: &str) -> Option<&BTreeSet<usize>> {
        self.nodes_by_label.get(key).and_then(|values| values.get(value))
    }

    fn index_node(&mut self, i: usize) {
        let pods = self.nodes[i].pods.clone();
        for pod in &pods {
            self.index_pod(pod, i);
        }
    }

    fn unindex_node(&mut self, i: usize) {
        let pods = self.nodes[i].pods.clone();
        for pod in &pods {
            self.unindex_pod(pod, i);
        }
    }

    fn index_pod(&mut self, pod: &Arc<PodInfo>, node: usize) {
        self.by_namespace.entry(pod.key.namespace.clone()).or_default().insert(pod.key.clone(), pod.clone());
        for (k, v) in pod.labels() {
            self.by_label
                .entry(k.clone())
                .or_default()
                .entry(v.clone())
                .or_default()
                .insert(pod.key.clone(), pod.clone());
        }
        if pod.has_affinity_terms() {
            let labels = self.nodes[node].node.metadata.labels.as_ref().unwrap_or(&NO_LABELS);
            self.terms.apply(pod, labels, 1);
        }
        self.update_match_cache(pod, node, 1);
        self.update_spread_cache(pod, node, 1);
    }

    fn unindex_pod(&mut self, pod: &PodInfo, node: usize) {
        if let Some(set) = self.by_namespace.get_mut(&pod.key.namespace) {
            set.remove(&pod.key);
            if set.is_empty() {
                self.by_namespace.remove(&pod.key.namespace);
            }
        }
        for (k, v) in pod.labels() {
            if let Some(values) = self.by_label.get_mut(k) {
                if let Some(set) = values.get_mut(v) {
                    set.remove(&pod.key);
                    if set.is_empty() {
                        values.remove(v);
                    }
                }
                if values.is_empty() {
                    self.by_label.remove(k);
                }
            }
        }
        if pod.has_affinity_terms() {
            let labels = self.nodes[node].node.metadata.labels.as_ref().unwrap_or(&NO_LABELS);
            self.terms.apply(pod, labels, -1);
        }
        self.update_match_cache(pod, node, -1);
        self.update_spread_cache(pod, node, -1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{must_node, must_place, must_pod};
    use serde_json::json;

    fn zoned(name: &str, zone: &str) -> Arc<Node> {
        must_node(name, "4", "8Gi", json!({"metadata": {"labels": {"zone": zone}}}))
    }

    /// `nodes_labelled` for every label of every node, against a walk of `nodes()`.
    fn assert_node_labels_indexed(c: &Cluster) {
        let mut walked: HashMap<(String, String), BTreeSet<usize>> = HashMap::new();
        for (i, n) in c.nodes().iter().enumerate() {
            for (k, v) in n.labels() {
                walked.entry((k.clone(), v.clone())).or_default().insert(i);
            }
        }
        for ((k, v), positions) in &walked {
            assert_eq!(c.nodes_labelled(k, v), Some(positions), "{k}={v}");
        }
        let indexed: usize = c.nodes_by_label.values().map(HashMap::len).sum();
        assert_eq!(indexed, walked.len(), "no label is left indexed for a node that lost it");
    }

    #[test]
    fn the_node_label_index_follows_nodes_added_relabelled_and_removed() {
        let mut c = Cluster::new();
        for i in 0..6 {
            c.upsert_node(zoned(&format!("n{i}"), &format!("z{}", i % 3)));
        }
        assert_node_labels_indexed(&c);
        assert_eq!(c.nodes_labelled("zone", "z1"), Some(&BTreeSet::from([1, 4])));
        c.upsert_node(zoned("n1", "z2"));
        assert_node_labels_indexed(&c);
        // Removing a node moves the last one into its place.
        c.remove_node("n0");
        assert_node_labels_indexed(&c);
        assert_eq!(c.nodes()[0].name, "n5");
        c.remove_node("n5");
        c.remove_node("n4");
        assert_node_labels_indexed(&c);
        assert_eq!(c.nodes_labelled("zone", "z1"), None, "z1 lost its last node");
        c.upsert_node(zoned("n4", "z1"));
        assert_node_labels_indexed(&c);
    }

    fn shy(name: &str, node: &str) -> Arc<PodInfo> {
        let pod = must_pod(
            name,
            "1",
            "",
            json!({"metadata": {"labels": {"app": "shy"}}, "spec": {"affinity": {"podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {"matchLabels": {"app": "shy"}}, "topologyKey": "zone"}]
            }}}}),
        );
        must_place(&pod, node)
    }

    fn matches_of(cluster: &Cluster) -> Vec<(String, String)> {
        let ns = Namespaces { names: ["default".to_string()].into(), selector: None };
        let mut out = Vec::new();
        cluster.for_each_match(
            &ns,
            &Selector::from_labels(&[("app".to_string(), "shy".to_string())].into()),
            |p, n| out.push((p.key.name.clone(), n.name.clone())),
        );
        out.sort();
        out
    }

    #[test]
    fn a_pod_on_an_unknown_node_waits_and_counts_once_the_node_appears() {
        let mut cluster = Cluster::new();
        cluster.add_pod(shy("s0", "a1"));
        assert_eq!(cluster.pod_count(), 1);
        assert!(matches_of(&cluster).is_empty(), "not indexed without its node");
        cluster.upsert_node(zoned("a1", "a"));
        assert_eq!(cluster.node("a1").expect("node").requested.milli_cpu, 1000);
        assert_eq!(matches_of(&cluster), vec![("s0".to_string(), "a1".to_string())]);
        assert_eq!(cluster.terms.required_anti.values().next().and_then(|d| d.get("a")), Some(&1));
    }

    #[test]
    fn removing_a_node_keeps_its_pods_until_they_are_removed() {
        let mut cluster = Cluster::new();
        cluster.upsert_node(zoned("a1", "a"));
        cluster.upsert_node(zoned("b1", "b"));
        cluster.add_pod(shy("s0", "a1"));
        cluster.remove_node("a1");
        assert_eq!(cluster.node_count(), 1);
        assert_eq!(cluster.node("b1").map(|n| n.name.as_str()), Some("b1"), "the moved node is still found by name");
        assert!(cluster.terms.required_anti.is_empty());
        assert!(cluster.pod(&ObjectKey::new("default", "s0")).is_some());
        cluster.upsert_node(zoned("a1", "a"));
        assert_eq!(cluster.node("a1").expect("node").pods.len(), 1, "back with its node");
        assert!(cluster.remove_pod(&ObjectKey::new("default", "s0")).is_some());
        assert!(cluster.node("a1").expect("node").pods.is_empty());
        assert!(cluster.terms.required_anti.is_empty());
        assert_eq!(cluster.remove_pod(&ObjectKey::new("default", "s0")).map(|p| p.key.clone()), None);
    }

    #[test]
    fn re_adding_a_pod_replaces_it_even_on_another_node() {
        let mut cluster = Cluster::new();
        cluster.upsert_node(zoned("a1", "a"));
        cluster.upsert_node(zoned("b1", "b"));
        cluster.add_pod(shy("s0", "a1"));
        cluster.add_pod(shy("s0", "a1"));
        assert_eq!(cluster.node("a1").expect("node").requested.milli_cpu, 1000);
        cluster.add_pod(shy("s0", "b1"));
        assert_eq!(cluster.node("a1").expect("node").requested.milli_cpu, 0);
        assert_eq!(cluster.node("b1").expect("node").requested.milli_cpu, 1000);
        assert_eq!(matches_of(&cluster), vec![("s0".to_string(), "b1".to_string())]);
    }

    #[test]
    fn indexes_after_any_sequence_of_changes_equal_indexes_built_from_scratch() {
        let mut cluster = Cluster::new();
        for (n, z) in [("a1", "a"), ("a2", "a"), ("b1", "b"), ("c1", "c")] {
            cluster.upsert_node(zoned(n, z));
        }
        let ns = Namespaces { names: ["default".to_string()].into(), selector: None };
        let shy_selector = Selector::from_labels(&[("app".to_string(), "shy".to_string())].into());
        // Cached before the changes below, which must keep it current.
        assert_eq!(cluster.match_counts(&ns, &shy_selector, "zone").total, 0);
        for i in 0..12 {
            let node = ["a1", "a2", "b1", "c1"][i % 4];
            cluster.add_pod(shy(&format!("s{i}"), node));
        }
        let early = cluster.match_counts(&ns, &shy_selector, "zone");
        assert_eq!((early.total, early.domains.get("a")), (12, Some(&6)));
        for i in [1, 5, 6] {
            cluster.remove_pod(&ObjectKey::new("default", format!("s{i}")));
        }
        cluster.remove_node("b1");
        // a2 moves to zone c: its pods' domains change.
        cluster.upsert_node(zoned("a2", "c"));
        cluster.add_pod(shy("s20", "b1"));

        let mut fresh = Cluster::new();
        for n in cluster.nodes() {
            fresh.upsert_node(n.node.clone());
        }
        for key in cluster.pods.keys() {
            fresh.add_pod(cluster.pods[key].clone());
        }
        assert_eq!(cluster.terms.required_anti, fresh.terms.required_anti);
        assert_eq!(matches_of(&cluster), matches_of(&fresh));
        let (cached, counted) =
            (cluster.match_counts(&ns, &shy_selector, "zone"), fresh.match_counts(&ns, &shy_selector, "zone"));
        assert_eq!((cached.total, &cached.domains), (counted.total, &counted.domains));
        assert_eq!(
            (early.total, early.domains.get("a")),
            (12, Some(&6)),
            "a decision's snapshot does not change under it"
        );
        let counts: Vec<_> = cluster.terms.required_anti.values().collect();
        assert_eq!(counts.len(), 1);
        // s0,s4,s8 on a1 (a); s9 on a2 (now c); s3,s7,s11 on c1 (c); b1 gone.
        assert_eq!(counts[0].get("a"), Some(&3));
        assert_eq!(counts[0].get("c"), Some(&4));
        assert_eq!(counts[0].get("b"), None);
        for n in cluster.nodes() {
            let fresh_node = fresh.node(&n.name).expect("node");
            assert_eq!(n.requested, fresh_node.requested, "{}", n.name);
        }
    }

    #[test]
    fn kept_spread_counts_equal_a_recount_through_pod_and_node_changes() {
        use crate::spread::SpreadQuery;
        let web = |name: &str, extra: serde_json::Value| {
            must_pod(name, "", "", crate::testkit::merge(json!({"metadata": {"labels": {"app": "web"}}}), extra))
        };
        let tainted = |name: &str, zone: &str| {
            must_node(
                name,
                "4",
                "8Gi",
                json!({"metadata": {"labels": {"zone": zone}}, "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}}),
            )
        };
        let constraint = |taints: &str| {
            json!({"spec": {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app": "web"}}, "nodeTaintsPolicy": taints}]}})
        };
        let honor = web("asker", constraint("Honor"));
        let ignore = web("asker", constraint("Ignore"));
        let queries = [
            SpreadQuery::new(&honor, &honor.spread_constraints[0]),
            SpreadQuery::new(&ignore, &ignore.spread_constraints[0]),
        ];
        let mut cluster = Cluster::new();
        for n in [
            zoned("a1", "a"),
            zoned("a2", "a"),
            zoned("b1", "b"),
            tainted("t1", "c"),
            must_node("x", "4", "8Gi", json!({})),
        ] {
            cluster.upsert_node(n);
        }
        let check = |cluster: &Cluster, step: &str| -> Vec<DomainCounts> {
            queries
                .iter()
                .map(|q| {
                    let kept = cluster.spread_counts(q);
                    cluster.spread_cache.lock().expect("cache").remove(q);
                    let recounted = cluster.spread_counts(q);
                    assert_eq!(kept, recounted, "{step}: {q:?}");
                    (*kept).clone()
                })
                .collect()
        };
        let counts =
            |pairs: &[(&str, i64)]| -> DomainCounts { pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect() };
        assert_eq!(
            check(&cluster, "empty"),
            vec![counts(&[("a", 0), ("b", 0)]), counts(&[("a", 0), ("b", 0), ("c", 0)])]
        );
        type Step<'a> = (&'static str, Box<dyn Fn(&mut Cluster) + 'a>);
        let steps: Vec<Step> = vec![
            ("a pod in a", Box::new(|c| c.add_pod(must_place(&web("w0", json!({})), "a1")))),
            ("a pod on the tainted node", Box::new(|c| c.add_pod(must_place(&web("w1", json!({})), "t1")))),
            ("a pod on the node without a zone", Box::new(|c| c.add_pod(must_place(&web("w2", json!({})), "x")))),
            (
                "a pod of another app",
                Box::new(|c| {
                    c.add_pod(must_place(&must_pod("db", "", "", json!({"metadata": {"labels": {"app": "db"}}})), "b1"))
                }),
            ),
            (
                "a pod of another namespace",
                Box::new(|c| c.add_pod(must_place(&web("w3", json!({"metadata": {"namespace": "other"}})), "b1"))),
            ),
            ("a second pod in a", Box::new(|c| c.add_pod(must_place(&web("w4", json!({})), "a2")))),
            (
                "a pod starts terminating",
                Box::new(|c| {
                    c.add_pod(must_place(
                        &web("w4", json!({"metadata": {"deletionTimestamp": "2026-12-05T00:00:00Z"}})),
                        "a2",
                    ))
                }),
            ),
            ("a pod moves to b", Box::new(|c| c.add_pod(must_place(&web("w0", json!({})), "b1")))),
            ("a pod is removed", Box::new(|c| drop(c.remove_pod(&ObjectKey::new("default", "w1"))))),
            ("a node joins zone d", Box::new(|c| c.upsert_node(zoned("d1", "d")))),
            ("a pod in d", Box::new(|c| c.add_pod(must_place(&web("w5", json!({})), "d1")))),
            ("a node moves from a to c", Box::new(|c| c.upsert_node(zoned("a2", "c")))),
            ("the tainted node is untainted", Box::new(|c| c.upsert_node(zoned("t1", "c")))),
            ("b is tainted", Box::new(|c| c.upsert_node(tainted("b1", "b")))),
            ("a pod on the unknown node e1", Box::new(|c| c.add_pod(must_place(&web("w6", json!({})), "e1")))),
            ("e1 joins zone e with its pod", Box::new(|c| c.upsert_node(zoned("e1", "e")))),
            ("a1 leaves", Box::new(|c| c.remove_node("a1"))),
        ];
        for (step, change) in steps {
            change(&mut cluster);
            check(&cluster, step);
        }
        // b tainted leaves b out of the Honor count; a1 gone empties zone a.
        assert_eq!(
            check(&cluster, "the end"),
            vec![counts(&[("c", 0), ("d", 1), ("e", 1)]), counts(&[("b", 1), ("c", 0), ("d", 1), ("e", 1)]),]
        );
    }
}
