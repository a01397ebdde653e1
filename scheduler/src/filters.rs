//! Filters: each rules a node out for a pod, with kube's reason. Most read
//! only the pod and the node; inter-pod affinity and topology spread read
//! state computed once per decision from the cluster's indexes
//! (`AffinityState`, `SpreadState`), which preemption adjusts for victims.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Taint, Toleration};

use crate::cluster::{Cluster, DomainCounts};
use crate::framework::{NodeInfo, PodInfo};
use crate::queue::{ClusterEvent, Events};
use crate::selector::NodeSelectorTerms;
use crate::spread::SpreadQuery;

/// Why a node cannot take a pod. The Display text is kube's.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// The node is cordoned.
    Unschedulable,
    /// `spec.nodeName` names another node.
    NodeName,
    /// A NoSchedule/NoExecute taint the pod does not tolerate.
    UntoleratedTaint {
        /// The taint's key.
        key: String,
        /// The taint's value ("" when none).
        value: String,
    },
    /// nodeSelector or required node affinity.
    NodeAffinity,
    /// A host port is taken.
    Ports,
    /// Not enough of a resource (its name borrowed for cpu, memory and
    /// ephemeral-storage: a failed decision can name thousands of nodes).
    Insufficient(Cow<'static, str>),
    /// No room for another pod.
    TooManyPods,
    /// A disk the pod needs is attached read-write to another pod here.
    DiskConflict,
    /// Required pod affinity is not met.
    PodAffinity,
    /// The pod's required anti-affinity is violated.
    PodAntiAffinity,
    /// A placed pod's required anti-affinity rejects this pod.
    ExistingPodsAntiAffinity,
    /// The node lacks a spread constraint's topology label.
    SpreadMissingLabel,
    /// Placing the pod here would exceed a spread constraint's maxSkew.
    SpreadSkew,
    /// The node's capacity does not parse.
    MalformedNode,
    /// The pod's requests do not parse.
    MalformedPod,
}

impl Reason {
    /// The cluster events that may remove this reason, as kube's plugins
    /// register them for their queueing hints.
    pub fn helped_by(&self) -> Events {
        use ClusterEvent::*;
        let nodes = Events::NONE.with(NodeAdded).with(NodeChanged);
        match self {
            Reason::Unschedulable
            | Reason::UntoleratedTaint { .. }
            | Reason::NodeAffinity
            | Reason::SpreadMissingLabel
            | Reason::MalformedNode => nodes,
            Reason::NodeName => Events::NONE.with(NodeAdded),
            Reason::Ports | Reason::DiskConflict => Events::NONE.with(NodeAdded).with(PodDeleted),
            Reason::Insufficient(_) | Reason::TooManyPods => nodes.with(PodDeleted),
            Reason::PodAffinity => nodes.with(AssignedPodAdded).with(PodChanged),
            Reason::PodAntiAffinity | Reason::ExistingPodsAntiAffinity => nodes.with(PodDeleted).with(PodChanged),
            Reason::SpreadSkew => Events::ALL,
            // Only an update of the pod itself, which requeues it anyway.
            Reason::MalformedPod => Events::NONE,
        }
    }

    /// Whether evicting pods could remove this reason (kube's Unschedulable
    /// as opposed to UnschedulableAndUnresolvable): preemption only looks at
    /// nodes that failed for such reasons alone.
    pub fn resolvable(&self) -> bool {
        matches!(
            self,
            Reason::Ports
                | Reason::Insufficient(_)
                | Reason::TooManyPods
                | Reason::DiskConflict
                | Reason::PodAntiAffinity
                | Reason::ExistingPodsAntiAffinity
                | Reason::SpreadSkew
        )
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Unschedulable => f.write_str("node(s) were unschedulable"),
            Reason::NodeName => f.write_str("node(s) didn't match the requested node name"),
            Reason::UntoleratedTaint { key, value } => write!(f, "node(s) had untolerated taint {{{key}: {value}}}"),
            Reason::NodeAffinity => f.write_str("node(s) didn't match Pod's node affinity/selector"),
            Reason::Ports => f.write_str("node(s) didn't have free ports for the requested pod ports"),
            Reason::Insufficient(resource) => write!(f, "Insufficient {resource}"),
            Reason::TooManyPods => f.write_str("Too many pods"),
            Reason::DiskConflict => f.write_str("node(s) had no available disk"),
            Reason::PodAffinity => f.write_str("node(s) didn't match pod affinity rules"),
            Reason::PodAntiAffinity => f.write_str("node(s) didn't match pod anti-affinity rules"),
            Reason::ExistingPodsAntiAffinity => f.write_str("node(s) didn't satisfy existing pods anti-affinity rules"),
            Reason::SpreadMissingLabel => {
                f.write_str("node(s) didn't match pod topology spread constraints (missing required label)")
            }
            Reason::SpreadSkew => f.write_str("node(s) didn't match pod topology spread constraints"),
            Reason::MalformedNode => f.write_str("node(s) had malformed capacity"),
            Reason::MalformedPod => f.write_str("pod has malformed resource requests"),
        }
    }
}

/// Whether `toleration` tolerates `taint` (kube's ToleratesTaint).
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    if let Some(effect) = toleration.effect.as_deref().filter(|e| !e.is_empty()) {
        if effect != taint.effect {
            return false;
        }
    }
    let key = toleration.key.as_deref().unwrap_or("");
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" | "" => {
            !key.is_empty() && toleration.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
        _ => false,
    }
}

/// The first NoSchedule/NoExecute taint of `taints` that `tolerations` leave untolerated.
pub fn untolerated_taint<'a>(taints: &'a [Taint], tolerations: &[Toleration]) -> Option<&'a Taint> {
    taints
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .find(|t| !tolerations.iter().any(|tol| tolerates(tol, t)))
}

/// A cordoned node takes only pods tolerating `node.kubernetes.io/unschedulable:NoSchedule`.
pub fn node_unschedulable(pod: &PodInfo, node: &NodeInfo) -> Result<(), Reason> {
    if !node.unschedulable {
        return Ok(());
    }
    let taint =
        Taint { key: "node.kubernetes.io/unschedulable".into(), effect: "NoSchedule".into(), ..Taint::default() };
    if pod.tolerations.iter().any(|t| tolerates(t, &taint)) {
        Ok(())
    } else {
        Err(Reason::Unschedulable)
    }
}

/// The seed's PodFitsHost: a pod naming a node fits only there.
pub fn node_name(pod: &PodInfo, node: &NodeInfo) -> Result<(), Reason> {
    match pod.node_name() {
        Some(name) if name != node.name => Err(Reason::NodeName),
        _ => Ok(()),
    }
}

/// NoSchedule and NoExecute taints must be tolerated.
pub fn taint_toleration(pod: &PodInfo, node: &NodeInfo) -> Result<(), Reason> {
    match untolerated_taint(&node.taints, &pod.tolerations) {
        Some(t) => Err(Reason::UntoleratedTaint { key: t.key.clone(), value: t.value.clone().unwrap_or_default() }),
        None => Ok(()),
    }
}

/// Whether the node matches the pod's nodeSelector and required node affinity.
pub fn matches_node_affinity(pod: &PodInfo, node: &NodeInfo) -> bool {
    node_matches_selectors(&pod.node_selector, pod.required_node_affinity.as_ref(), node)
}

/// Whether `node` has every label of `node_selector` and matches `required` node affinity.
pub(crate) fn node_matches_selectors(
    node_selector: &BTreeMap<String, String>,
    required: Option<&NodeSelectorTerms>,
    node: &NodeInfo,
) -> bool {
    if node_selector.is_empty() && required.is_none() {
        // Most pods: no need to reach into the node's object for its labels
        // (a cache miss per node filtered, 5% of the scheduler's samples).
        return true;
    }
    let labels = node.labels();
    node_selector.iter().all(|(k, v)| labels.get(k) == Some(v))
        && required.is_none_or(|a| a.matches(labels, &node.name))
}

/// The seed's PodSelectorMatches, with required node affinity.
pub fn node_affinity(pod: &PodInfo, node: &NodeInfo) -> Result<(), Reason> {
    if matches_node_affinity(pod, node) {
        Ok(())
    } else {
        Err(Reason::NodeAffinity)
    }
}

/// The seed's PodFitsPorts: no host port (protocol, ip, port) taken twice.
pub fn host_ports(pod: &PodInfo, node: &NodeInfo) -> Result<(), Reason> {
    if pod.host_ports.iter().any(|p| node.used_ports.iter().any(|u| u.conflicts(p))) {
        Err(Reason::Ports)
    } else {
        Ok(())
    }
}

/// The seed's PodFitsResources: every requested resource fits in what is
/// allocatable minus what placed pods request; one reason per resource short.
pub fn resources_fit(pod: &PodInfo, node: &NodeInfo) -> Result<(), Vec<Reason>> {
    let mut reasons = Vec::new();
    if node.pods.len() as i64 + 1 > node.allocatable.pods {
        reasons.push(Reason::TooManyPods);
    }
    let (want, used, have) = (&pod.requests, &node.requested, &node.allocatable);
    let short = |want: i64, used: i64, have: i64| want > 0 && want.saturating_add(used) > have;
    if short(want.milli_cpu, used.milli_cpu, have.milli_cpu) {
        reasons.push(Reason::Insufficient("cpu".into()));
    }
    if short(want.memory, used.memory, have.memory) {
        reasons.push(Reason::Insufficient("memory".into()));
    }
    if short(want.ephemeral_storage, used.ephemeral_storage, have.ephemeral_storage) {
        reasons.push(Reason::Insufficient("ephemeral-storage".into()));
    }
    for (name, amount) in &want.scalar {
        let used = used.scalar.get(name).copied().unwrap_or(0);
        if short(*amount, used, have.scalar.get(name).copied().unwrap_or(0)) {
            reasons.push(Reason::Insufficient(name.clone().into()));
        }
    }
    if reasons.is_empty() {
        Ok(())
    } else {
        Err(reasons)
    }
}

/// The seed's NoDiskConflict: a GCE PD, RBD image or iSCSI target used
/// read-write, or any AWS EBS volume, is attached to one pod per node.
pub fn no_disk_conflict(pod: &PodInfo, node: &NodeInfo) -> Result<(), Reason> {
    if pod.disks.is_empty() {
        return Ok(());
    }
    let conflict = node.pods.iter().any(|p| p.disks.iter().any(|d| pod.disks.iter().any(|mine| mine.conflicts(d))));
    if conflict {
        Err(Reason::DiskConflict)
    } else {
        Ok(())
    }
}

/// Pods per value of one topology key: counts shared with the cluster's
/// indexes and cache, plus this decision's own changes (victims removed by
/// preemption, pods counted by a scan).
#[derive(Debug, Clone, Default)]
pub(crate) struct Domains {
    shared: Vec<Arc<DomainCounts>>,
    delta: DomainCounts,
}

impl Domains {
    /// Pods in domain `value`.
    pub(crate) fn get(&self, value: &str) -> i64 {
        let shared: i64 = self.shared.iter().map(|c| c.get(value).copied().unwrap_or(0)).sum();
        if self.delta.is_empty() {
            shared
        } else {
            shared + self.delta.get(value).copied().unwrap_or(0)
        }
    }

    /// The domains holding at least one pod.
    fn occupied(&self) -> BTreeSet<&str> {
        let values = self.shared.iter().flat_map(|c| c.keys()).chain(self.delta.keys());
        values.map(String::as_str).filter(|v| self.get(v) > 0).collect()
    }
}

/// Domains per topology key.
pub(crate) type PairCounts = HashMap<String, Domains, rustc_hash::FxBuildHasher>;

fn pair_count(counts: &PairCounts, key: &str, value: &str) -> i64 {
    counts.get(key).map_or(0, |d| d.get(value))
}

fn pair_add(counts: &mut PairCounts, key: &str, value: &str, delta: i64) {
    let n = counts.entry(key.to_string()).or_default().delta.entry(value.to_string()).or_default();
    *n += delta;
}

fn pair_share(counts: &mut PairCounts, key: &str, shared: Arc<DomainCounts>) {
    counts.entry(key.to_string()).or_default().shared.push(shared);
}

/// What required inter-pod affinity reads, computed once per decision:
/// where the pods the incoming pod wants (or shuns) are, and where placed
/// pods' anti-affinity shuns it. Read from the cluster's term index and
/// match cache, so its cost does not grow with the matching pods.
#[derive(Debug, Clone, Default)]
pub struct AffinityState {
    /// Pods matching all of the incoming pod's required affinity terms, counted per term's domain.
    affinity: PairCounts,
    /// How many placed pods match all of the incoming pod's required affinity terms.
    affinity_pods: i64,
    /// Pods matching one of the incoming pod's required anti-affinity terms, per domain.
    anti: PairCounts,
    /// Placed pods whose required anti-affinity matches the incoming pod, per domain.
    existing_anti: PairCounts,
}

impl AffinityState {
    /// Reads the cluster's indexes for `pod`.
    pub fn new(pod: &PodInfo, cluster: &Cluster) -> AffinityState {
        let mut state = AffinityState::default();
        for (term, domains) in &cluster.terms.required_anti {
            if cluster.term_matches(term, pod) {
                pair_share(&mut state.existing_anti, &term.topology_key, domains.clone());
            }
        }
        match pod.required_affinity.as_slice() {
            [] => {}
            [term] => {
                let counts = cluster.match_counts(&term.namespaces, &term.selector, &term.topology_key);
                state.affinity_pods = counts.total;
                pair_share(&mut state.affinity, &term.topology_key, counts.domains.clone());
            }
            // Pods must match every term: count them by a scan of the first term's matches.
            [first, ..] => cluster.for_each_match(&first.namespaces, &first.selector, |other, node| {
                state.update_affinity(pod, other, node, cluster, 1);
            }),
        }
        for term in &pod.required_anti_affinity {
            let counts = cluster.match_counts(&term.namespaces, &term.selector, &term.topology_key);
            pair_share(&mut state.anti, &term.topology_key, counts.domains.clone());
        }
        state
    }

    fn update_affinity(&mut self, pod: &PodInfo, other: &PodInfo, node: &NodeInfo, cluster: &Cluster, delta: i64) {
        if !pod.required_affinity.is_empty() && pod.required_affinity.iter().all(|t| cluster.term_matches(t, other)) {
            self.affinity_pods += delta;
            for t in &pod.required_affinity {
                if let Some(v) = node.labels().get(&t.topology_key) {
                    pair_add(&mut self.affinity, &t.topology_key, v, delta);
                }
            }
        }
    }

    /// Where the pod's required affinity lets it go, when that is narrower
    /// than anywhere: the first term's topology key and the domains of it
    /// holding pods that match every term. None when the pod has no
    /// required affinity, or is the first of a group with affinity to
    /// itself (which may go anywhere the keys exist).
    pub(crate) fn wanted_domains<'p>(&self, pod: &'p PodInfo, cluster: &Cluster) -> Option<(&'p str, BTreeSet<&str>)> {
        let first = pod.required_affinity.first()?;
        if first_of_group(pod, self, cluster) {
            return None;
        }
        let domains = self.affinity.get(&first.topology_key).map(Domains::occupied).unwrap_or_default();
        Some((first.topology_key.as_str(), domains))
    }

    /// Counts `other`, placed on `node`, as gone (`delta` -1, a preemption
    /// victim) or back (`delta` 1, reprieved).
    pub fn update(&mut self, pod: &PodInfo, other: &PodInfo, node: &NodeInfo, cluster: &Cluster, delta: i64) {
        self.update_affinity(pod, other, node, cluster, delta);
        let labels = node.labels();
        for t in &pod.required_anti_affinity {
            if let Some(v) = labels.get(&t.topology_key) {
                if cluster.term_matches(t, other) {
                    pair_add(&mut self.anti, &t.topology_key, v, delta);
                }
            }
        }
        for t in &other.required_anti_affinity {
            if let Some(v) = labels.get(&t.topology_key) {
                if cluster.term_matches(t, pod) {
                    pair_add(&mut self.existing_anti, &t.topology_key, v, delta);
                }
            }
        }
    }
}

/// The first pod of a group with affinity to itself may go anywhere its
/// topology keys exist, or it would wait forever.
fn first_of_group(pod: &PodInfo, state: &AffinityState, cluster: &Cluster) -> bool {
    state.affinity_pods <= 0 && pod.required_affinity.iter().all(|t| cluster.term_matches(t, pod))
}

/// Required inter-pod affinity and anti-affinity, both ways.
pub fn inter_pod_affinity(
    pod: &PodInfo,
    node: &NodeInfo,
    state: &AffinityState,
    cluster: &Cluster,
) -> Result<(), Reason> {
    let labels = node.labels();
    let mut pods_exist = true;
    for t in &pod.required_affinity {
        match labels.get(&t.topology_key) {
            Some(v) => pods_exist &= pair_count(&state.affinity, &t.topology_key, v) > 0,
            None => return Err(Reason::PodAffinity),
        }
    }
    if !pods_exist && !first_of_group(pod, state, cluster) {
        return Err(Reason::PodAffinity);
    }
    for t in &pod.required_anti_affinity {
        if labels.get(&t.topology_key).is_some_and(|v| pair_count(&state.anti, &t.topology_key, v) > 0) {
            return Err(Reason::PodAntiAffinity);
        }
    }
    for (key, domains) in &state.existing_anti {
        if labels.get(key).is_some_and(|v| domains.get(v) > 0) {
            return Err(Reason::ExistingPodsAntiAffinity);
        }
    }
    Ok(())
}

/// What hard topology spread reads, computed once per decision: matching
/// pods per domain of every DoNotSchedule constraint, and how many a
/// domain may hold before taking the pod.
#[derive(Debug, Clone, Default)]
pub struct SpreadState {
    /// Per hard constraint, in the pod's order.
    constraints: Vec<HardSpread>,
}

/// One DoNotSchedule constraint of the pod being decided.
#[derive(Debug, Clone)]
struct HardSpread {
    /// What it counts.
    query: SpreadQuery,
    /// Matching pods per domain; every eligible domain is present. Shared
    /// with the cluster's cache until preemption adjusts them.
    counts: Arc<DomainCounts>,
    /// maxSkew.
    max_skew: i64,
    /// minDomains.
    min_domains: i64,
    /// 1 when the pod matches its own selector (it adds to the domain it joins).
    self_match: i64,
    /// The most matching pods a domain may hold and still take the pod:
    /// maxSkew + the least count (0 below minDomains) - self_match.
    limit: i64,
}

impl HardSpread {
    fn set_limit(&mut self) {
        let min = if (self.counts.len() as i64) < self.min_domains {
            0
        } else {
            self.counts.values().copied().min().unwrap_or(0)
        };
        self.limit = self.max_skew + min - self.self_match;
    }
}

impl SpreadState {
    /// Reads matching pods per domain from the cluster's spread counts.
    pub fn new(pod: &PodInfo, cluster: &Cluster) -> SpreadState {
        let constraints = pod
            .spread_constraints
            .iter()
            .filter(|c| c.hard)
            .map(|c| {
                let query = SpreadQuery::new(pod, c);
                let mut hard = HardSpread {
                    counts: cluster.spread_counts(&query),
                    query,
                    max_skew: i64::from(c.max_skew),
                    min_domains: i64::from(c.min_domains),
                    self_match: i64::from(c.selector.matches(pod.labels())),
                    limit: 0,
                };
                hard.set_limit();
                hard
            })
            .collect();
        SpreadState { constraints }
    }

    /// Counts `other`, placed on `node`, as gone (-1) or back (+1).
    pub fn update(&mut self, other: &PodInfo, node: &NodeInfo, delta: i64) {
        for c in &mut self.constraints {
            let Some(value) = c.query.domain_of(other, node) else { continue };
            if let Some(n) = Arc::make_mut(&mut c.counts).get_mut(value) {
                *n += delta;
                c.set_limit();
            }
        }
    }
}

/// DoNotSchedule topology spread constraints: the node must have each
/// topology key, and taking the pod must keep its domain within maxSkew
/// of the least-loaded domain.
pub fn topology_spread(node: &NodeInfo, state: &SpreadState) -> Result<(), Reason> {
    let labels = node.labels();
    for c in &state.constraints {
        let Some(value) = labels.get(&c.query.topology_key) else { return Err(Reason::SpreadMissingLabel) };
        if c.counts.get(value).copied().unwrap_or(0) > c.limit {
            return Err(Reason::SpreadSkew);
        }
    }
    Ok(())
}

/// Per-decision state of the filters that read the whole cluster.
#[derive(Debug, Clone, Default)]
pub struct FilterState {
    /// Inter-pod affinity, when the pod or a placed pod has required terms.
    pub affinity: Option<AffinityState>,
    /// Hard topology spread, when the pod has DoNotSchedule constraints.
    pub spread: Option<SpreadState>,
}

impl FilterState {
    /// Computes what `pod`'s decision needs, skipping what it does not.
    pub fn new(pod: &PodInfo, cluster: &Cluster) -> FilterState {
        let affinity_needed = !pod.required_affinity.is_empty()
            || !pod.required_anti_affinity.is_empty()
            || !cluster.terms.required_anti.is_empty();
        FilterState {
            affinity: affinity_needed.then(|| AffinityState::new(pod, cluster)),
            spread: pod.spread_constraints.iter().any(|c| c.hard).then(|| SpreadState::new(pod, cluster)),
        }
    }

    /// Counts `other`, placed on `node`, as gone (-1) or back (+1).
    pub fn update(&mut self, pod: &PodInfo, other: &PodInfo, node: &NodeInfo, cluster: &Cluster, delta: i64) {
        if let Some(a) = self.affinity.as_mut() {
            a.update(pod, other, node, cluster, delta);
        }
        if let Some(s) = self.spread.as_mut() {
            s.update(other, node, delta);
        }
    }
}

/// Runs every filter in kube's order, stopping at the first that fails
/// (resources fit may give several reasons).
pub fn filter(pod: &PodInfo, node: &NodeInfo, state: &FilterState, cluster: &Cluster) -> Result<(), Vec<Reason>> {
    if node.malformed.is_some() {
        return Err(vec![Reason::MalformedNode]);
    }
    let one = |r: Result<(), Reason>| r.map_err(|r| vec![r]);
    one(node_unschedulable(pod, node))?;
    one(node_name(pod, node))?;
    one(taint_toleration(pod, node))?;
    one(node_affinity(pod, node))?;
    one(host_ports(pod, node))?;
    resources_fit(pod, node)?;
    one(no_disk_conflict(pod, node))?;
    if let Some(s) = &state.spread {
        one(topology_spread(node, s))?;
    }
    if let Some(a) = &state.affinity {
        one(inter_pod_affinity(pod, node, a, cluster))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{must_cluster, must_node, must_node_info, must_pod};
    use serde_json::json;
    use std::sync::Arc;

    fn insufficient(r: &str) -> Reason {
        Reason::Insufficient(r.to_string().into())
    }

    #[test]
    fn resources_fit_counts_requests_of_placed_pods_and_names_each_missing_resource() {
        let node =
            || must_node("n1", "1", "1Gi", json!({"status": {"allocatable": {"pods": "2", "example.com/gpu": "1"}}}));
        let half = must_pod("half", "500m", "512Mi", json!({}));
        let gpu = must_pod(
            "gpu",
            "",
            "",
            json!({"spec": {"containers": [{"name": "c", "resources": {"requests": {"example.com/gpu": "1"}}}]}}),
        );
        type Case = (&'static str, Vec<Arc<PodInfo>>, Arc<PodInfo>, Result<(), Vec<Reason>>);
        let cases: Vec<Case> = vec![
            ("fits an empty node", vec![], must_pod("p", "1", "1Gi", json!({})), Ok(())),
            ("fits what is left", vec![half.clone()], must_pod("p", "500m", "512Mi", json!({})), Ok(())),
            (
                "one millicore too many",
                vec![half.clone()],
                must_pod("p", "501m", "1Mi", json!({})),
                Err(vec![insufficient("cpu")]),
            ),
            (
                "cpu and memory both short",
                vec![half.clone()],
                must_pod("p", "600m", "600Mi", json!({})),
                Err(vec![insufficient("cpu"), insufficient("memory")]),
            ),
            (
                "pod count is a limit",
                vec![half.clone(), gpu.clone()],
                must_pod("p", "", "", json!({})),
                Err(vec![Reason::TooManyPods]),
            ),
            ("a pod requesting nothing fits a full node", vec![half.clone()], must_pod("p", "", "", json!({})), Ok(())),
            ("extended resources count", vec![gpu.clone()], gpu.clone(), Err(vec![insufficient("example.com/gpu")])),
            (
                "init containers count when larger",
                vec![half.clone()],
                must_pod(
                    "p",
                    "100m",
                    "",
                    json!({"spec": {"initContainers": [{"name": "i", "resources": {"requests": {"cpu": "600m"}}}]}}),
                ),
                Err(vec![insufficient("cpu")]),
            ),
            (
                "overhead counts",
                vec![half.clone()],
                must_pod("p", "500m", "", json!({"spec": {"overhead": {"cpu": "1m"}}})),
                Err(vec![insufficient("cpu")]),
            ),
            (
                "ephemeral storage counts",
                vec![],
                must_pod(
                    "p",
                    "",
                    "",
                    json!({"spec": {"containers": [{"name": "c", "resources": {"requests": {"ephemeral-storage": "1Gi"}}}]}}),
                ),
                Err(vec![insufficient("ephemeral-storage")]),
            ),
        ];
        for (name, placed, pod, want) in cases {
            let info = must_node_info(node(), &placed);
            assert_eq!(resources_fit(&pod, &info), want, "{name}");
        }
    }

    #[test]
    fn host_ports_conflict_on_protocol_port_and_overlapping_ip() {
        let with_port = |ip: &str, protocol: &str, port: i32| {
            must_pod(
                "p",
                "",
                "",
                json!({"spec": {"containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": port, "hostIP": ip, "protocol": protocol}]}]}}),
            )
        };
        let cases = [
            ("same port and protocol on every ip", ("", "TCP", 8080), ("", "TCP", 8080), Err(Reason::Ports)),
            ("another port", ("", "TCP", 8080), ("", "TCP", 8081), Ok(())),
            ("another protocol", ("", "TCP", 8080), ("", "UDP", 8080), Ok(())),
            ("distinct ips", ("10.0.0.1", "TCP", 8080), ("10.0.0.2", "TCP", 8080), Ok(())),
            ("a wildcard ip overlaps any", ("10.0.0.1", "TCP", 8080), ("0.0.0.0", "TCP", 8080), Err(Reason::Ports)),
        ];
        for (name, placed, incoming, want) in cases {
            let info =
                must_node_info(must_node("n1", "1", "1Gi", json!({})), &[with_port(placed.0, placed.1, placed.2)]);
            assert_eq!(host_ports(&with_port(incoming.0, incoming.1, incoming.2), &info), want, "{name}");
        }
        let free = must_node_info(must_node("n1", "1", "1Gi", json!({})), &[]);
        assert_eq!(host_ports(&with_port("", "TCP", 80), &free), Ok(()));
    }

    #[test]
    fn node_selector_and_required_node_affinity_must_both_match() {
        let node = must_node_info(
            must_node("n1", "1", "1Gi", json!({"metadata": {"labels": {"disk": "ssd", "zone": "a"}}})),
            &[],
        );
        let required = |term: serde_json::Value| json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": term}}}}});
        let cases = [
            ("no selector", json!({}), Ok(())),
            ("a matching selector", json!({"spec": {"nodeSelector": {"disk": "ssd"}}}), Ok(())),
            (
                "a selector on another value",
                json!({"spec": {"nodeSelector": {"disk": "hdd"}}}),
                Err(Reason::NodeAffinity),
            ),
            (
                "a selector on a missing label",
                json!({"spec": {"nodeSelector": {"gpu": "yes"}}}),
                Err(Reason::NodeAffinity),
            ),
            (
                "affinity In",
                required(json!([{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}])),
                Ok(()),
            ),
            (
                "affinity terms are ORed",
                required(json!([
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
                    {"matchExpressions": [{"key": "disk", "operator": "Exists"}]}
                ])),
                Ok(()),
            ),
            (
                "affinity NotIn",
                required(json!([{"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}])),
                Err(Reason::NodeAffinity),
            ),
            (
                "matchFields on the node name",
                required(json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}])),
                Ok(()),
            ),
            (
                "matchFields on another node",
                required(json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}])),
                Err(Reason::NodeAffinity),
            ),
            ("an empty term matches nothing", required(json!([{}])), Err(Reason::NodeAffinity)),
        ];
        for (name, extra, want) in cases {
            assert_eq!(node_affinity(&must_pod("p", "", "", extra), &node), want, "{name}");
        }
    }

    #[test]
    fn a_pod_naming_a_node_fits_only_that_node() {
        let node = must_node_info(must_node("n1", "1", "1Gi", json!({})), &[]);
        let cases = [(None, Ok(())), (Some("n1"), Ok(())), (Some("n2"), Err(Reason::NodeName))];
        for (name, want) in cases {
            let pod = must_pod("p", "", "", json!({"spec": {"nodeName": name}}));
            assert_eq!(node_name(&pod, &node), want, "{name:?}");
        }
    }

    #[test]
    fn untolerated_no_schedule_and_no_execute_taints_rule_a_node_out() {
        let tainted = |key: &str, value: &str, effect: &str| {
            must_node_info(
                must_node(
                    "n1",
                    "1",
                    "1Gi",
                    json!({"spec": {"taints": [{"key": key, "value": value, "effect": effect}]}}),
                ),
                &[],
            )
        };
        let tolerating = |t: serde_json::Value| must_pod("p", "", "", json!({"spec": {"tolerations": [t]}}));
        let untolerated = |k: &str, v: &str| Err(Reason::UntoleratedTaint { key: k.into(), value: v.into() });
        let cases = [
            (
                "NoSchedule untolerated",
                tainted("gpu", "yes", "NoSchedule"),
                must_pod("p", "", "", json!({})),
                untolerated("gpu", "yes"),
            ),
            (
                "NoExecute untolerated",
                tainted("gpu", "yes", "NoExecute"),
                must_pod("p", "", "", json!({})),
                untolerated("gpu", "yes"),
            ),
            (
                "PreferNoSchedule is only a score",
                tainted("gpu", "yes", "PreferNoSchedule"),
                must_pod("p", "", "", json!({})),
                Ok(()),
            ),
            (
                "Equal with the value",
                tainted("gpu", "yes", "NoSchedule"),
                tolerating(json!({"key": "gpu", "value": "yes"})),
                Ok(()),
            ),
            (
                "Equal with another value",
                tainted("gpu", "yes", "NoSchedule"),
                tolerating(json!({"key": "gpu", "value": "no"})),
                untolerated("gpu", "yes"),
            ),
            (
                "Exists on the key",
                tainted("gpu", "yes", "NoSchedule"),
                tolerating(json!({"key": "gpu", "operator": "Exists"})),
                Ok(()),
            ),
            (
                "Exists without a key tolerates all",
                tainted("gpu", "yes", "NoExecute"),
                tolerating(json!({"operator": "Exists"})),
                Ok(()),
            ),
            (
                "another effect does not tolerate",
                tainted("gpu", "yes", "NoSchedule"),
                tolerating(json!({"key": "gpu", "operator": "Exists", "effect": "NoExecute"})),
                untolerated("gpu", "yes"),
            ),
            (
                "not-ready through its taint",
                tainted("node.kubernetes.io/not-ready", "", "NoExecute"),
                must_pod("p", "", "", json!({})),
                untolerated("node.kubernetes.io/not-ready", ""),
            ),
        ];
        for (name, node, pod, want) in cases {
            assert_eq!(taint_toleration(&pod, &node), want, "{name}");
        }
        assert_eq!(
            Reason::UntoleratedTaint { key: "gpu".into(), value: "yes".into() }.to_string(),
            "node(s) had untolerated taint {gpu: yes}"
        );
    }

    #[test]
    fn a_cordoned_node_takes_only_pods_tolerating_unschedulable() {
        let cordoned = must_node_info(must_node("n1", "1", "1Gi", json!({"spec": {"unschedulable": true}})), &[]);
        let plain = must_pod("p", "", "", json!({}));
        let tolerating = must_pod(
            "p",
            "",
            "",
            json!({"spec": {"tolerations": [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}]}}),
        );
        assert_eq!(node_unschedulable(&plain, &cordoned), Err(Reason::Unschedulable));
        assert_eq!(node_unschedulable(&tolerating, &cordoned), Ok(()));
        let open = must_node_info(must_node("n1", "1", "1Gi", json!({})), &[]);
        assert_eq!(node_unschedulable(&plain, &open), Ok(()));
    }

    #[test]
    fn disks_attached_read_write_conflict_as_the_seed_says() {
        let with_volume = |v: serde_json::Value| must_pod("p", "", "", json!({"spec": {"volumes": [merge_name(v)]}}));
        fn merge_name(v: serde_json::Value) -> serde_json::Value {
            crate::testkit::merge(json!({"name": "v"}), v)
        }
        let gce = |name: &str, ro: bool| with_volume(json!({"gcePersistentDisk": {"pdName": name, "readOnly": ro}}));
        let ebs = |id: &str| with_volume(json!({"awsElasticBlockStore": {"volumeID": id}}));
        let rbd = |mon: &str, image: &str, ro: bool| {
            with_volume(json!({"rbd": {"monitors": [mon], "image": image, "readOnly": ro}}))
        };
        let iscsi = |iqn: &str, ro: bool| {
            with_volume(json!({"iscsi": {"iqn": iqn, "targetPortal": "10.0.0.1:3260", "lun": 0, "readOnly": ro}}))
        };
        let empty_dir = with_volume(json!({"emptyDir": {}}));
        let cases = [
            ("same GCE PD read-write", gce("d", false), gce("d", false), Err(Reason::DiskConflict)),
            ("same GCE PD read-only twice", gce("d", true), gce("d", true), Ok(())),
            ("same GCE PD, one writer", gce("d", true), gce("d", false), Err(Reason::DiskConflict)),
            ("another GCE PD", gce("d", false), gce("e", false), Ok(())),
            ("same EBS volume", ebs("vol-1"), ebs("vol-1"), Err(Reason::DiskConflict)),
            ("another EBS volume", ebs("vol-1"), ebs("vol-2"), Ok(())),
            ("same RBD image", rbd("m1", "img", false), rbd("m1", "img", false), Err(Reason::DiskConflict)),
            ("RBD image on other monitors", rbd("m1", "img", false), rbd("m2", "img", false), Ok(())),
            ("same iSCSI IQN", iscsi("iqn.a", false), iscsi("iqn.a", false), Err(Reason::DiskConflict)),
            ("same iSCSI IQN read-only", iscsi("iqn.a", true), iscsi("iqn.a", true), Ok(())),
            ("emptyDir never conflicts", empty_dir.clone(), empty_dir.clone(), Ok(())),
        ];
        for (name, placed, incoming, want) in cases {
            let node = must_node_info(must_node("n1", "1", "1Gi", json!({})), &[placed]);
            assert_eq!(no_disk_conflict(&incoming, &node), want, "{name}");
        }
    }

    /// Every node's filter outcome for `pod`.
    fn outcomes(pod: &PodInfo, cluster: &Cluster) -> Vec<(String, Result<(), Vec<Reason>>)> {
        let state = FilterState::new(pod, cluster);
        cluster.nodes().iter().map(|n| (n.name.clone(), filter(pod, n, &state, cluster))).collect()
    }

    fn fits(pod: &PodInfo, cluster: &Cluster) -> Vec<String> {
        let mut names: Vec<String> =
            outcomes(pod, cluster).into_iter().filter(|(_, r)| r.is_ok()).map(|(n, _)| n).collect();
        names.sort();
        names
    }

    fn zoned(name: &str, zone: &str) -> Arc<k8s_openapi::api::core::v1::Node> {
        must_node(name, "4", "8Gi", json!({"metadata": {"labels": {"zone": zone}}}))
    }

    fn labelled(name: &str, ns: &str, labels: serde_json::Value, spec: serde_json::Value) -> Arc<PodInfo> {
        must_pod(name, "", "", json!({"metadata": {"namespace": ns, "labels": labels}, "spec": spec}))
    }

    fn pod_affinity(kind: &str, selector: serde_json::Value, key: &str, extra: serde_json::Value) -> serde_json::Value {
        let term = crate::testkit::merge(json!({"labelSelector": selector, "topologyKey": key}), extra);
        json!({"affinity": {kind: {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}})
    }

    #[test]
    fn required_anti_affinity_keeps_a_pod_out_of_domains_with_matching_pods() {
        let nodes = vec![zoned("a1", "a"), zoned("a2", "a"), zoned("b1", "b"), zoned("c1", "c")];
        let web = labelled("web-0", "default", json!({"app": "web"}), json!({}));
        let other_ns = labelled("web-x", "other", json!({"app": "web"}), json!({}));
        let cluster = must_cluster(nodes, vec![(web, "a1"), (other_ns, "b1")]);
        let sel = json!({"matchLabels": {"app": "web"}});
        let cases = [
            ("hostname: only the node with the pod", json!({}), "kubernetes.io/hostname", vec!["a2", "b1", "c1"]),
            ("zone: the whole zone", json!({}), "zone", vec!["b1", "c1"]),
            ("namespaces list another namespace", json!({"namespaces": ["other"]}), "zone", vec!["a1", "a2", "c1"]),
            ("an empty namespaceSelector means all namespaces", json!({"namespaceSelector": {}}), "zone", vec!["c1"]),
        ];
        for (name, extra, key, want) in cases {
            let pod = labelled("p", "default", json!({}), pod_affinity("podAntiAffinity", sel.clone(), key, extra));
            assert_eq!(fits(&pod, &cluster), want, "{name}");
        }
        let pod = labelled("p", "default", json!({}), pod_affinity("podAntiAffinity", sel, "zone", json!({})));
        let state = FilterState::new(&pod, &cluster);
        let a2 = cluster.node("a2").expect("node");
        assert_eq!(filter(&pod, a2, &state, &cluster), Err(vec![Reason::PodAntiAffinity]));
    }

    #[test]
    fn a_placed_pods_anti_affinity_keeps_matching_pods_out_of_its_domain() {
        let nodes = vec![zoned("a1", "a"), zoned("a2", "a"), zoned("b1", "b")];
        let loner = labelled(
            "loner",
            "default",
            json!({}),
            pod_affinity("podAntiAffinity", json!({"matchLabels": {"app": "web"}}), "zone", json!({})),
        );
        let cluster = must_cluster(nodes, vec![(loner, "a1")]);
        let web = labelled("web", "default", json!({"app": "web"}), json!({}));
        assert_eq!(fits(&web, &cluster), vec!["b1"]);
        let state = FilterState::new(&web, &cluster);
        let a2 = cluster.node("a2").expect("node");
        assert_eq!(filter(&web, a2, &state, &cluster), Err(vec![Reason::ExistingPodsAntiAffinity]));
        let db = labelled("db", "default", json!({"app": "db"}), json!({}));
        assert_eq!(fits(&db, &cluster), vec!["a1", "a2", "b1"]);
        let web_elsewhere = labelled("web", "prod", json!({"app": "web"}), json!({}));
        assert_eq!(fits(&web_elsewhere, &cluster), vec!["a1", "a2", "b1"], "the term looks at its own namespace only");
    }

    #[test]
    fn required_affinity_needs_a_matching_pod_in_the_domain_except_for_the_first_of_a_group() {
        let mut nodes = vec![zoned("a1", "a"), zoned("a2", "a"), zoned("b1", "b")];
        nodes.push(must_node("nozone", "4", "8Gi", json!({})));
        let cache = labelled("cache", "default", json!({"app": "cache"}), json!({}));
        let cluster = must_cluster(nodes.clone(), vec![(cache, "a1")]);
        let wants_cache = pod_affinity("podAffinity", json!({"matchLabels": {"app": "cache"}}), "zone", json!({}));
        let pod = labelled("p", "default", json!({}), wants_cache.clone());
        assert_eq!(fits(&pod, &cluster), vec!["a1", "a2"]);
        // No cache anywhere: a pod that is itself a cache may start the group, where the zone label exists.
        let empty = must_cluster(nodes, vec![]);
        let first = labelled("c0", "default", json!({"app": "cache"}), wants_cache.clone());
        assert_eq!(fits(&first, &empty), vec!["a1", "a2", "b1"]);
        let outsider = labelled("p", "default", json!({}), wants_cache);
        assert!(fits(&outsider, &empty).is_empty());
        let state = FilterState::new(&outsider, &empty);
        assert_eq!(filter(&outsider, &empty.nodes()[0], &state, &empty), Err(vec![Reason::PodAffinity]));
    }

    fn spread(max_skew: i32, key: &str, extra: serde_json::Value) -> serde_json::Value {
        let c = crate::testkit::merge(
            json!({"maxSkew": max_skew, "topologyKey": key, "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}),
            extra,
        );
        json!({"topologySpreadConstraints": [c]})
    }

    #[test]
    fn topology_spread_keeps_each_domain_within_max_skew_of_the_least() {
        let nodes = vec![
            zoned("a1", "a"),
            zoned("a2", "a"),
            zoned("b1", "b"),
            zoned("c1", "c"),
            must_node("x", "4", "8Gi", json!({})),
        ];
        let web = |i: usize| labelled(&format!("web-{i}"), "default", json!({"app": "web"}), json!({}));
        // a: 2, b: 1, c: 0.
        let cluster = must_cluster(nodes, vec![(web(0), "a1"), (web(1), "a2"), (web(2), "b1")]);
        let cases = [
            ("maxSkew 1: only the empty zone", spread(1, "zone", json!({})), vec!["c1"]),
            ("maxSkew 2: the zones below two", spread(2, "zone", json!({})), vec!["b1", "c1"]),
            ("maxSkew 3: every zoned node", spread(3, "zone", json!({})), vec!["a1", "a2", "b1", "c1"]),
            (
                "minDomains above the domains makes the minimum 0",
                spread(2, "zone", json!({"minDomains": 5})),
                vec!["b1", "c1"],
            ),
            (
                "nodeAffinityPolicy Honor counts only zone a, so a is the least",
                crate::testkit::merge(spread(1, "zone", json!({})), json!({"nodeSelector": {"zone": "a"}})),
                vec!["a1", "a2"],
            ),
            (
                "nodeAffinityPolicy Ignore counts the empty zone c",
                crate::testkit::merge(
                    spread(2, "zone", json!({"nodeAffinityPolicy": "Ignore"})),
                    json!({"nodeSelector": {"zone": "a"}}),
                ),
                vec![],
            ),
        ];
        for (name, spec, want) in cases {
            let pod = labelled("p", "default", json!({"app": "web"}), spec);
            let want: Vec<String> = want.into_iter().map(String::from).collect();
            assert_eq!(fits(&pod, &cluster), want, "{name}");
        }
        // With Honor, zone a is the only domain: min is a's 2, skew 1 fits.
        let honor = labelled(
            "p",
            "default",
            json!({"app": "web"}),
            crate::testkit::merge(spread(1, "zone", json!({})), json!({"nodeSelector": {"zone": "a"}})),
        );
        let state = FilterState::new(&honor, &cluster);
        assert_eq!(topology_spread(cluster.node("a1").expect("node"), state.spread.as_ref().expect("spread")), Ok(()));
        let pod = labelled("p", "default", json!({"app": "web"}), spread(1, "zone", json!({})));
        let state = FilterState::new(&pod, &cluster);
        let s = state.spread.as_ref().expect("spread");
        assert_eq!(topology_spread(cluster.node("x").expect("node"), s), Err(Reason::SpreadMissingLabel));
        assert_eq!(topology_spread(cluster.node("a1").expect("node"), s), Err(Reason::SpreadSkew));
    }
}
